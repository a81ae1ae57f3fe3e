"""Re-lift: the nodes one leaf module's call became in an exported graph go back to one call_module node.

`torch.export` inlines every module: an `nn.Linear` is an `aten.linear` call on `get_attr`
weights, a Hugging Face `Conv1D` a view, addmm, view. Each node remembers the modules it
ran inside (`meta["nn_module_stack"]`). Where the innermost one is a module the pipeline
knows whole (Linear, Conv, LayerNorm, Embedding, ...; see `RELIFT_TYPES`), its contiguous
run of nodes is replaced by one `call_module` of the *original* module, so the rules, the
planner, calibration and compile treat an exported model like a traced one. A run that
does not have exactly one tensor input and one output used outside it is left as it is.

Example:
    >>> relift_modules(gm, model)   # doctest: +SKIP
    3
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import fx, nn

# module classes kept whole, and third-party ones by qualified name (importing them would
# make transformers a dependency of capture)
RELIFT_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.LayerNorm, nn.Embedding,
                                             nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm)
RELIFT_NAMES: frozenset[str] = frozenset({"transformers.pytorch_utils.Conv1D"})


def qualified_names(cls: type) -> set[str]:
    """`module.QualName` of a class and its bases (how third-party classes are matched by name).

    Example:
        >>> "torch.nn.modules.linear.Linear" in qualified_names(nn.Linear)
        True
    """
    return {f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__}


def _keeps_whole(module: nn.Module) -> bool:
    return isinstance(module, RELIFT_TYPES) or bool(qualified_names(type(module)) & RELIFT_NAMES)


def _innermost(node: fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, _ = list(stack.values())[-1]
    return path


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def _runs(gm: fx.GraphModule) -> Iterable[tuple[str, list[fx.Node]]]:
    current: str | None = None
    run: list[fx.Node] = []
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "placeholder"):
            continue
        path = _innermost(node) if node.op == "call_function" else None
        if path != current:
            if current is not None and run:
                yield current, run
            current, run = path, []
        if path is not None:
            run.append(node)
    if current is not None and run:
        yield current, run


def _own_param(node: fx.Node, path: str) -> bool:
    return node.op == "get_attr" and isinstance(node.target, str) and node.target.startswith(path + ".")


def relift_modules(gm: fx.GraphModule, root: nn.Module) -> int:
    """Replace each run of nodes of a known leaf module by one call of that module; returns how many.

    `root` is the model that was exported (its submodules are put into `gm` at their paths).

    Example:
        >>> relift_modules(exported_module, model)   # doctest: +SKIP
    """
    named = dict(root.named_modules())
    lifted = 0
    for path, run in list(_runs(gm)):
        module = named.get(path)
        if module is None or not _keeps_whole(module):
            continue
        members = set(run)
        inputs = {a for n in run for a in n.all_input_nodes if a not in members and not _own_param(a, path)}
        tensors = [a for a in inputs if _is_tensor(a)]
        leaving = [n for n in run if any(u not in members for u in n.users)]
        if len(tensors) != 1 or len(leaving) != 1 or leaving[0] is not run[-1]:
            continue
        with gm.graph.inserting_after(run[-1]):
            call = gm.graph.call_module(path, (tensors[0],))
        call.meta = dict(run[-1].meta)
        run[-1].replace_all_uses_with(call)
        for node in reversed(run):
            gm.graph.erase_node(node)
        gm.set_submodule(path, module)
        lifted += 1
    for node in list(gm.graph.nodes):  # parameters now read inside the lifted modules
        if node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return lifted
