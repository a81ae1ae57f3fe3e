"""The reference a user can trust: their model masked with a TeSA table, quantized where the table asks.

Built from the table alone (not from any plan): every parameter element the table prunes
is zeroed, the weight of every weight site whose kept elements are at 2..8 bits is put on
its symmetric per-output-row grid (`fake_quant.fake_quantize_rows`; 1 bit on the 2-bit
grid, as the planner runs it), and a linear whose input is also at <= 8 bits quantizes
its input rows, a conv its input images (what the int8 kernels compute; `compile`
tolerates rounding flips, 2e-2). That rounding is an `InputGrid` module called before the
op, which stays the model's own: the reference's call is the dense model's work plus the
rounding, so its call less the `InputGrid` calls' time stands in for a dense call (the
guard's, `verify.ModelOutputs.dense_seconds`).

Parameters the forward never reads are skipped and listed, not an error.

Example:
    >>> ref, unread = table_reference(graph, table)   # doctest: +SKIP
    >>> torch.allclose(compiled(x), graph.run(ref), atol=1e-3)  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from sparta_explore.compact import equal, zero_where_
from sparta_explore.errors import TeSANameError
from sparta_explore.fake_quant import INT_BITS, fake_quantize_rows
from sparta_explore.graph import Graph
from sparta_explore.kernels.compiled_op import quantized_images, quantized_input
from sparta_explore.masking import apply_table
from sparta_explore.module_tree import set_module
from sparta_explore.plan.bit_rounding import MIN_GRID_BITS
from sparta_explore.plan.execution_plan import FP32 as FP32_BITS
from sparta_explore.plan.sites import WeightSite, input_bits, weight_sites
from sparta_explore.tesa import TeSA
from sparta_explore.tracing.copying import deep_copy, tree_copy


def split_unread(graph: Graph, module: fx.GraphModule, table: Mapping[str, TeSA]
                 ) -> tuple[dict[str, TeSA], list[str]]:
    """(the entries naming parameters/buffers of `module` or activations, the parameter names it never reads).

    A dotted name that is neither in `module` nor a parameter of the captured model is an error.

    Example:
        >>> usable, unread = split_unread(graph, graph.module, table)   # doctest: +SKIP
    """
    present = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    present |= {n for n, _ in module.named_buffers(remove_duplicate=False)}
    usable, unread = {}, []
    for name, tesa in table.items():
        if "." not in name or name in present:
            usable[name] = tesa
        elif name in graph.tensors or graph.canonical(name) in present:
            unread.append(name)  # e.g. BERT's pooler when the forward does not use it
        else:
            raise TeSANameError(f"TeSA {name!r} names no parameter or buffer of the captured model")
    return usable, unread


def weight_grid(tesa: TeSA) -> int | None:
    """The integer grid a weight with this TeSA is put on in the reference (its widest kept bits, at least
    `MIN_GRID_BITS`), or None: kept as it is (float, or already on its compressor's per-group grids).

    Example:
        >>> weight_grid(TeSA.dense((2, 2), bits=8)), weight_grid(TeSA.dense((2, 2)))
        (8, None)
        >>> weight_grid(TeSA.dense((2, 128), bits=4, fmt="uint").with_group(64)) is None
        True
    """
    if tesa.group:  # the values are the compressor's, on its grids; the plan runs them as they are
        return None
    kept = tesa.kept_bits()
    top = max(kept) if kept else 32
    top = max(top, MIN_GRID_BITS)
    return top if top in INT_BITS else None


def has_grids(table: Mapping[str, TeSA]) -> bool:
    """Whether any tensor of `table` is kept on an integer grid (else `table_reference` is the same with or
    without `grids`).

    Example:
        >>> has_grids({"w": TeSA.dense((2, 2))})
        False
    """
    return any(weight_grid(t) is not None for t in table.values())


GRIDS = "sparta_grids"  # where a reference's InputGrid modules are registered


class InputGrid(nn.Module):
    """Puts its input on the symmetric `bits` grid an int8 kernel reads: each row (a linear's input), or each
    image (a conv's: `per_image`).

    Example:
        >>> InputGrid(2, per_image=False)(torch.tensor([[1.0, 0.3]])).tolist()
        [[1.0, 0.0]]
    """

    def __init__(self, bits: int, per_image: bool) -> None:
        super().__init__()
        self.bits, self.per_image = int(bits), bool(per_image)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_images(x, self.bits) if self.per_image else quantized_input(x, self.bits)


def _round_input(gm: fx.GraphModule, site: WeightSite, grid: InputGrid) -> None:
    """Make `site`'s node read its input through `grid` (registered under `GRIDS`)."""
    node = next(n for n in gm.graph.nodes if n.name == site.node)
    if not hasattr(gm, GRIDS):
        gm.add_module(GRIDS, nn.Module())
    set_module(gm, f"{GRIDS}.{site.node}", grid)
    with gm.graph.inserting_before(node):
        rounded = gm.graph.call_module(f"{GRIDS}.{site.node}", (node.args[site.input_index],))
    node.update_arg(site.input_index, rounded)


def _masked_tree_copy(gm: fx.GraphModule, usable: Mapping[str, TeSA],
                      like: tuple[nn.Module, Mapping[str, TeSA]] | None) -> tuple[fx.GraphModule, set[int]]:
    """A tree copy of `gm` whose tensors `usable` names are new, masked (or, where `like`'s table marks one alike,
    `like`'s reference's own: the ids returned), and every other tensor is `gm`'s own."""
    tensors = dict(gm.named_parameters(remove_duplicate=False)) | dict(gm.named_buffers(remove_duplicate=False))
    theirs = {} if like is None else \
        dict(like[0].named_parameters(remove_duplicate=False)) | dict(like[0].named_buffers(remove_duplicate=False))
    named = Counter(id(tensors[n]) for n in usable if n in tensors)
    fresh: dict[int, torch.Tensor] = {}
    borrowed: set[int] = set()  # ids of `like`'s tensors taken: never edited here
    with torch.no_grad():
        for name, tesa in usable.items():
            t = tensors.get(name)
            if t is None:  # an activation's entry
                continue
            tesa.check_fits(t.shape, name)
            other = like[1].get(name) if like is not None else None
            if named[id(t)] == 1 and name in theirs and other is not None and equal(other._key, tesa._key):
                fresh[id(t)] = theirs[name]  # masked and on its grid alike there (BERT-base 32x32: 49 of 72)
                borrowed.add(id(theirs[name]))
                continue
            kept = tesa.kept.to(t.device)
            if id(t) in fresh:  # a tied tensor named twice: both masks hold
                zero_where_(fresh[id(t)], kept, where=False)
            else:
                data = zero_where_(t.detach().clone(), kept, where=False)
                fresh[id(t)] = nn.Parameter(data, t.requires_grad) if isinstance(t, nn.Parameter) else data
    return tree_copy(gm, replaced=fresh), borrowed


def table_reference(graph: Graph, table: Mapping[str, TeSA], *, grids: bool = True, share: bool = False,
                    like: tuple[nn.Module, Mapping[str, TeSA]] | None = None) -> tuple[fx.GraphModule, list[str]]:
    """A copy of the captured module with `table`'s pruning (and weight grids) applied; and the unread names.

    `share`: the tensors the table leaves alone stay the captured model's own (BERT-base: a third of a second
    less than copying them all); for a reference that is only read while nothing edits the model, and handed
    out only through `tracing.copying.owning`. `like` (with `share` and `grids`): (a reference this function
    built from another table with `share` and `grids`, that table): a tensor both tables mark alike is that
    reference's own, not masked again (the input table's reference beside the table's).

    Example:
        >>> ref, unread = table_reference(graph, table)   # doctest: +SKIP
    """
    usable, unread = split_unread(graph, graph.module, table)
    if share:
        module, borrowed = _masked_tree_copy(graph.module, usable, like if grids else None)
    else:
        module, borrowed = apply_table(deep_copy(graph.module), usable), set()
    by_canonical = {graph.canonical(n): t for n, t in usable.items()} if grids else {}
    int8_sites = []
    with torch.no_grad():
        for site in weight_sites(graph):
            tesa = by_canonical.get(site.weight)
            grid = None if tesa is None else weight_grid(tesa)
            if grid is None:
                continue
            weight = module.get_parameter(site.weight)
            if id(weight) not in borrowed:  # a borrowed weight is on this grid already
                quantized = fake_quantize_rows(site.weight_2d(weight.detach().float()), grid)
                restored = quantized.t() if site.layout == "in_out" else quantized
                weight.copy_(restored.reshape(weight.shape).to(weight.dtype))
            act = input_bits(graph, table, site)
            if act in INT_BITS:
                int8_sites.append((site, act))
    for site, act in int8_sites:  # both at <= 8 bits: the input is quantized too (the int8 semantics)
        per_image = isinstance(site.as_module(module), nn.Conv2d)
        _round_input(module, site, InputGrid(act, per_image))
    if int8_sites:
        module.graph.lint()
        module.recompile()
    return module, unread


def unwrap_table(table: Any) -> tuple[Mapping[str, TeSA], Mapping[str, TeSA] | None]:
    """(the table compile uses, the table propagation started from or None) from a table or a `PropagationResult`.

    Example:
        >>> unwrap_table({"w": tesa})[1] is None  # doctest: +SKIP
        True
    """
    from sparta_explore.propagation.report import PropagationResult

    if isinstance(table, PropagationResult):
        return table.table, table.input_table
    return table, None


def warn_if_dense(table: Mapping[str, TeSA]) -> None:
    """One `CompileWarning` when no TeSA prunes or quantizes anything: compile then has nothing to speed up.

    Example:
        >>> warn_if_dense({})  # doctest: +SKIP
    """
    from sparta_explore.compile.choose import CompileWarning

    if any(set(tesa.bit_histogram()) - {FP32_BITS} for tesa in table.values()):
        return
    warnings.warn(f"nothing in the table is pruned or quantized (all {len(table)} TeSAs dense fp32), so no op gets "
                  "a kernel: the compiled model is the model as given (at most rewritten by the graph passes, e.g. "
                  "BatchNorm folded, which keep its results)", CompileWarning, stacklevel=3)
