"""Whether two tables give references that compute the same outputs on the example inputs, without building them.

A compile checks its model against the table's reference and against the input table's
(where propagation started). When propagation pruned no weight further, the two references
are one model: it is neither copied nor run twice (BERT-base: a second each). Propagation does
prune elements the model never reads, though: BERT's `position_ids` buffer holds 512
positions and the graph reads `position_ids[:, :128]`. A tensor whose differences lie only
outside the constant slices the graph reads (sizes as the example recorded them) does not
change an output on the example inputs.

Example:
    >>> same_references(graph, result.table, result.input_table)   # doctest: +SKIP
    True
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx

from sparta_explore.compile.table_reference import weight_grid
from sparta_explore.graph import Graph
from sparta_explore.plan.sites import input_bits, weight_sites
from sparta_explore.tesa import TeSA

_UNKNOWN = object()


def _index(arg: Any, constants: Mapping[str, Any]) -> Any:
    """A getitem index with graph nodes replaced by the values the example recorded, or `_UNKNOWN`."""
    if isinstance(arg, fx.Node):
        value = constants.get(arg.name, _UNKNOWN)
        return value if isinstance(value, int) else _UNKNOWN
    if isinstance(arg, slice):
        parts = [_index(p, constants) for p in (arg.start, arg.stop, arg.step)]
        return _UNKNOWN if _UNKNOWN in parts else slice(*parts)
    if isinstance(arg, tuple):
        parts = [_index(p, constants) for p in arg]
        return _UNKNOWN if any(p is _UNKNOWN for p in parts) else tuple(parts)
    return arg if arg is None or arg is Ellipsis or isinstance(arg, int) else _UNKNOWN


def read_elements(gm: fx.GraphModule, target: str, shape: torch.Size, constants: Mapping[str, Any]
                  ) -> torch.Tensor | None:
    """The elements of tensor `target` that `gm` reads on the example inputs (bool, `shape`), or None unless every
    read is a constant slice of a `get_attr` (sizes resolved from `constants`, `Graph.constants`).

    Example:
        >>> read_elements(gm, "embeddings.position_ids", (1, 512), graph.constants).sum()   # doctest: +SKIP
        tensor(128)
    """
    read = torch.zeros(shape, dtype=torch.bool)
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target == target]
    if not attrs:  # read by its module (a call_module), not as a value of the graph
        return None
    for node in attrs:
        for user in node.users:
            if user.op != "call_function" or user.target is not operator.getitem or len(user.args) != 2:
                return None
            index = _index(user.args[1], constants)
            if index is _UNKNOWN:
                return None
            try:
                read[index] = True
            except (IndexError, TypeError):
                return None
    return read


def same_references(graph: Graph, a: Mapping[str, TeSA], b: Mapping[str, TeSA]) -> bool:
    """Whether `table_reference(graph, a)` and `table_reference(graph, b)` compute the same outputs on the example
    inputs, read from the tables alone (no copy of the model is made): every parameter and buffer pruned alike
    (or differing only where the example never reads it, `read_elements`), every weight on the same grid and
    every weight site's input at the same bits.

    Example:
        >>> same_references(graph, result.table, result.input_table)   # doctest: +SKIP
        True
    """
    module = graph.module
    tensors = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))
    sites = {graph.canonical(site.weight) for site in weight_sites(graph)}
    for name in (set(a) | set(b)) & tensors.keys():
        shape = tuple(tensors[name].shape)
        ta, tb = a.get(name) or TeSA.dense(shape), b.get(name) or TeSA.dense(shape)
        if ta == tb:
            continue
        if graph.canonical(name) in sites and weight_grid(ta) != weight_grid(tb):
            return False
        differ = ta.pruned ^ tb.pruned
        if not bool(differ.any()):
            continue  # other bits on kept elements: the reference keeps them in float (or on the same grid)
        read = read_elements(module, name, tensors[name].shape, graph.constants)
        if read is None or bool((read & differ).any()):
            return False
    return all(input_bits(graph, a, site) == input_bits(graph, b, site) for site in weight_sites(graph))
