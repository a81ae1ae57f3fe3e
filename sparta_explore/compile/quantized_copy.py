"""The model a table with bits describes, in the user's own module tree: what its kernels compute.

`masked_copy(model, table)` applies a table's pruning only. `quantized_copy` also puts
each weight the table keeps at 2..8 bits on its symmetric per-output-row grid, and makes
each module whose input the table also keeps at <= 8 bits round that input per row (per
image for a convolution) before it runs: the int8 kernels' semantics, decided per weight
site exactly as `table_reference` decides it for compile's checks (`weight_grid`,
`input_bits`). Weights on a compressor's per-group grids (`TeSA.group`, GPTQ) are kept
as given. Because the copy keeps the module tree, it runs at any shape: a language
model's perplexity windows, `generate` with its KV cache.

The input rounding is a forward pre-hook (`RoundInput`) on the module, so parameter names
and `state_dict` stay the model's. A functional weight (no module to hook) with a
quantized input keeps a float input, with a warning.

Example:
    >>> ref = quantized_copy(model, w8a8_table, (x,))                  # doctest: +SKIP
    >>> perplexity(ref, windows) == perplexity(compiled_in_place, windows)  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from sparta_explore.compile.table_reference import split_unread, weight_grid
from sparta_explore.fake_quant import INT_BITS, fake_quantize_rows, fake_quantize_runs
from sparta_explore.graph import Graph, capture
from sparta_explore.kernels.compiled_op import quantized_images, quantized_input
from sparta_explore.masking import masked_copy
from sparta_explore.plan.sites import input_bits, weight_sites
from sparta_explore.tesa import TeSA
from sparta_explore.tracing.kv_cache import kv_cache_off


class RoundInput:
    """A forward pre-hook putting a module's first input on the symmetric `bits` grid an int8 kernel reads:
    each row (a linear's input), each image (a conv's: `per_image`), or each `run` consecutive elements of
    the last dimension (the decode step's int8 activations, `compile/decoder.py`).

    Example:
        >>> lin = nn.Linear(2, 1)
        >>> _ = lin.register_forward_pre_hook(RoundInput(2, per_image=False))
        >>> RoundInput(2, False)(lin, (torch.tensor([[1.0, 0.3]]),))[0].tolist()
        [[1.0, 0.0]]
        >>> RoundInput(2, False, run=2)(lin, (torch.tensor([[1.0, 0.3, 0.02, 0.01]]),))[0].tolist()
        [[1.0, 0.0, 0.019999999552965164, 0.0]]
    """

    def __init__(self, bits: int, per_image: bool, run: int | None = None) -> None:
        self.bits, self.per_image, self.run = int(bits), bool(per_image), run

    def __call__(self, module: nn.Module | None, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        if self.run is not None:
            rounded = fake_quantize_runs(x, self.run, self.bits)
        else:
            rounded = quantized_images(x, self.bits) if self.per_image else quantized_input(x, self.bits)
        return (rounded, *args[1:])

    def __repr__(self) -> str:
        run = f", run={self.run}" if self.run is not None else ""
        return f"RoundInput(bits={self.bits}, per_image={self.per_image}{run})"


def quantized_copy(model: nn.Module, table: Mapping[str, TeSA], example_inputs: Any = None, *,
                   graph: Graph | None = None) -> nn.Module:
    """A deep copy of `model` masked by `table`, its weights and inputs on the table's integer grids.

    `example_inputs` (or a `graph` captured from `model`) locate each weight's op and its
    input; the copy then runs on any inputs. `model` is left untouched.

    Example:
        >>> ref = quantized_copy(nn.Sequential(nn.Linear(4, 2)), {"0.weight": TeSA.dense((2, 4), bits=8)},
        ...                      (torch.randn(3, 4),))
        >>> len(torch.unique(ref[0].weight[0])) <= 255
        True
    """
    if graph is None:
        with kv_cache_off(model):
            graph = capture(model, example_inputs)
    usable, _ = split_unread(graph, graph.module, table)
    out = masked_copy(model, usable)
    named = {graph.canonical(name): name for name in usable}
    with torch.no_grad():
        for site in weight_sites(graph):
            name = named.get(site.weight)
            grid = None if name is None else weight_grid(usable[name])
            if grid is None:
                continue
            weight = out.get_parameter(name)
            quantized = fake_quantize_rows(site.weight_2d(weight.detach().float()), grid)
            weight.copy_((quantized.t() if site.layout == "in_out" else quantized).reshape(weight.shape)
                         .to(weight.dtype))
            act = input_bits(graph, table, site)
            if act not in INT_BITS:
                continue
            target = site.module_target
            if target is None:
                warnings.warn(f"{name!r} is a functional weight: its input stays float in the quantized copy "
                              "(no module to round it)", stacklevel=2)
                continue
            module = out.get_submodule(target)
            module.register_forward_pre_hook(RoundInput(act, per_image=isinstance(module, nn.Conv2d)))
    return out
