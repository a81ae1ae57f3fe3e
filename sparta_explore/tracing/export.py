"""Capture through `torch.export`: the path for models fx cannot trace (Hugging Face, torch.nn attention).

`export_graph_module` exports the model (in eval mode, with every input dimension dynamic
where export allows it, so the compiled model runs other batch and sequence sizes), then
makes the exported module look like a traced one:

1. the shape guards and metadata asserts export inserted are removed (shapes are checked
   by the compiled ops themselves);
2. ATen calls become the torch-level calls of `aten_table` (`aten.linear` -> `F.linear`);
3. each leaf module's run of nodes is re-lifted into one `call_module` (`relift`).

The module keeps export's calling convention (the model's own arguments and output
structure), and is never put in train/eval mode (exported modules refuse `.eval()`).

Example:
    >>> gm = export_graph_module(bert, (), {"input_ids": ids, "attention_mask": mask})  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from sparta_explore.tracing.aten_table import SIDE_CHECKS, rewrite
from sparta_explore.tracing.relift import relift_modules


def _dynamic_shapes(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Every dimension of every tensor input marked AUTO (export keeps dynamic what it can), by argument name."""
    def spec(x: Any) -> Any:
        return {i: torch.export.Dim.AUTO for i in range(x.dim())} if isinstance(x, torch.Tensor) else None
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    return {name: pytree.tree_map(spec, value) for name, value in bound.arguments.items()}


def export_program(model: nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    """`torch.export.export` of `model` in eval mode, dynamic shapes first, static if that fails.

    Example:
        >>> ep = export_program(model, (x,), {})  # doctest: +SKIP
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                return torch.export.export(model, args, kwargs,
                                           dynamic_shapes=_dynamic_shapes(model, args, kwargs), strict=False)
            except Exception:  # some models constrain a dimension export cannot relax: export them static
                return torch.export.export(model, args, kwargs, strict=False)
    finally:
        model.train(was_training)


def normalize(gm: fx.GraphModule, root: nn.Module | None) -> fx.GraphModule:
    """Remove export's guards, rewrite ATen calls to torch calls and re-lift leaf modules (in place).

    Example:
        >>> gm = normalize(ep.module(), model)  # doctest: +SKIP
    """
    graph = gm.graph
    for node in list(graph.nodes):
        is_check = (node.op == "call_module" and node.target == "_guards_fn") or \
            (node.op == "call_function" and node.target in SIDE_CHECKS)
        if is_check and not node.users:
            graph.erase_node(node)
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            found = rewrite(node.target, tuple(node.args), dict(node.kwargs))
            if found is None:
                continue
            target, args, kwargs = found
            node.op = "call_method" if isinstance(target, str) else "call_function"
            node.target, node.args, node.kwargs = target, args, kwargs
    if hasattr(gm, "_guards_fn"):
        gm.delete_submodule("_guards_fn")
    graph.lint()
    gm.recompile()
    if root is not None:
        relift_modules(gm, root)
    return gm


def export_graph_module(model: nn.Module | torch.export.ExportedProgram, args: tuple = (), kwargs: dict | None = None,
                        ) -> fx.GraphModule:
    """An fx.GraphModule of `model` through torch.export, normalized (see the module docstring).

    `model` may also be an `ExportedProgram` the user made (then no module is re-lifted,
    unless its original module is unknown: exported programs do not keep it).

    Example:
        >>> gm = export_graph_module(model, (x,))  # doctest: +SKIP
    """
    if isinstance(model, torch.export.ExportedProgram):
        return normalize(model.module(), None)
    program = export_program(model, tuple(args), dict(kwargs or {}))
    return normalize(program.module(), model)
