"""Channel dependencies a pruner must decide, because propagation soundly cannot.

When a conv's output channel c is pruned (all its weights and its bias), the BatchNorm
after it still outputs the constant beta_c - mean_c * gamma_c / std_c for that channel,
so nothing downstream is zero and propagation (rightly) prunes nothing more. Pruning the
BatchNorm's channel too drops that constant: a change to the model, as NNI's speedup
makes it, to be recovered by fine-tuning. After it, the channel is zero and propagation
prunes the next layer's matching input channels.
"""

from __future__ import annotations

import torch
from torch import nn

from sparta_explore.graph import Graph
from sparta_explore.tesa import TeSA
from sparta_explore.tesa_table import TeSATable

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_PRODUCERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def _dead_channels(graph: Graph, table: TeSATable, producer: str) -> torch.Tensor | None:
    weight = table.get(f"{producer}.weight")
    if weight is None:
        return None
    dead = weight.pruned.reshape(weight.shape[0], -1).all(dim=1)
    bias = table.get(f"{producer}.bias")
    if bias is not None:
        dead &= bias.pruned
    elif f"{producer}.bias" in graph.tensors:
        return None
    return dead


def prune_dependent_norms(graph: Graph, table: TeSATable) -> TeSATable:
    """Also prune the BatchNorm channels that follow fully pruned conv/linear output channels.

    Example:
        >>> table = prune_dependent_norms(graph, prune(model, cfg, "l1norm", graph=graph))  # doctest: +SKIP
    """
    out = TeSATable(dict(table), shapes=table.shapes)
    for node in graph.nodes():
        if node.op != "call_module" or not isinstance(graph.module.get_submodule(node.target), _NORMS):
            continue
        src = node.args[0]
        if not (hasattr(src, "op") and src.op == "call_module"
                and isinstance(graph.module.get_submodule(src.target), _PRODUCERS)):
            continue
        dead = _dead_channels(graph, out, src.target)
        if dead is None or not dead.any():
            continue
        for local in ("weight", "bias"):
            name = f"{node.target}.{local}"
            if name in graph.tensors:
                current = out.get(name, TeSA.dense(graph.tensors[name].shape))
                out[name] = current.prune(dead)
    return out
