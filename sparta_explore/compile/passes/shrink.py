"""The `shrink` pass: channels, rows and heads pruned across their whole dependency group are cut out physically.

After propagation, a channel every element of which is pruned in a tensor's TeSA may be
zeroed without changing the output. This pass walks the graph once, in order, tracking per
value which channels it physically holds along one axis (`Present`): a linear or groups-1
conv keeps only its kept output rows and reads only the channels its input holds (its
weight shrinks both ways, its TeSA is sliced, and what is still sparse inside goes to the
kernels as before); depthwise convs, BatchNorm, per-element ops and pooling carry their
input's channels; residual adds meet two channel sets in their union (`AlignedAdd`);
reshapes, permutes and attention matmuls carry whole heads. An op with no rule, or whose
rule cannot hold the channels (a LayerNorm over them, a non-zero constant in a cut
channel), gets its input back at full width (`ExpandChannels`, zeros in the cut channels):
shrinking stops there, never the result. Rows that only reshapes read before such an
expansion (Q and K cut to different features, met again at full width by attention) are
not cut at all: the walk runs again without cutting them (the kernels skip pruned rows on
their own). Each op family's rule is in `shrink_rules.py` (axis moves and attention in
`shrink_layout_rules.py`); what the walk tracks is in `shrink_walk.py`.

Example:
    >>> shrink(graph, table, PassOptions()).summary()   # doctest: +SKIP
    'ops shrunk 40, channels removed 1632, expansions 1'
"""

from __future__ import annotations

from sparta_explore.compile.passes import shrink_layout_rules  # noqa: F401  (registers its rules)
from sparta_explore.compile.passes.base import PassOptions, PassResult, Table, register_pass
from sparta_explore.compile.passes.graph_edit import editable, finished
from sparta_explore.compile.passes.shrink_rules import rule_for
from sparta_explore.compile.passes.shrink_walk import ShrinkWalk
from sparta_explore.graph import Graph

MAX_WALKS = 4


@register_pass("shrink", cuts_channels=True)
def shrink(graph: Graph, table: Table, options: PassOptions) -> PassResult:
    """Cut out the channels, rows and heads the table prunes everywhere they flow (see the module docstring).

    Example:
        >>> smaller = shrink(graph, table, PassOptions()).graph   # doctest: +SKIP
    """
    keep_rows: frozenset[str] = frozenset()
    made: dict = {}
    for _ in range(MAX_WALKS):  # walk again, not cutting the rows a walk found only expanded again
        gm = editable(graph)
        walk = ShrinkWalk(graph, gm, table, keep_rows, made)
        for node in list(gm.graph.nodes):  # ops the walk inserts are not in this list: they need no rule
            if node.op == "output":
                walk.opaque(node)
            elif node.op in ("call_module", "call_function", "call_method"):
                rule = rule_for(gm, node)
                if rule is None:
                    walk.opaque(node)
                else:
                    rule(walk, node)
        if walk.wasted <= keep_rows:
            break
        keep_rows = keep_rows | frozenset(walk.wasted)
    if not walk.counts["ops shrunk"]:
        return PassResult(graph, table, {k: 0 for k in walk.counts})
    new = finished(graph, gm)
    return PassResult(new, walk.table_out(new), walk.counts)
