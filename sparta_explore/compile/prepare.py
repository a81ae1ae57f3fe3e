"""What every compile does before it chooses kernels, in place or not: the tables, the references, the plan.

`prepare` unwraps the table (a `PropagationResult` brings the table propagation started
from), decides which kernel families can run here (PyTorch's own only, with one warning,
when there is no compiler), loads the device profile, builds the trusted reference (the
captured graph masked with the table), and masks a copy of the captured graph: the graph
kernels are chosen on. `offered` plans the ops (or copies a given plan) and keeps the
candidates whose families may run.

Example:
    >>> prepared = prepare(graph, result, CompileConfig(), plan=None)        # doctest: +SKIP
    >>> execution = offered(prepared.working, prepared.usable, prepared, None)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from sparta_explore.compile.config import CompileConfig
from sparta_explore.compile.table_reference import (
    has_grids,
    split_unread,
    table_reference,
    unwrap_table,
    warn_if_dense,
)
from sparta_explore.device import DeviceProfile
from sparta_explore.graph import Graph, relabelled
from sparta_explore.kernels.build import compiler_available, warn_compiler_missing
from sparta_explore.masking import apply_table
from sparta_explore.plan import ExecutionPlan
from sparta_explore.plan import plan as make_plan
from sparta_explore.tesa import TeSA
from sparta_explore.tracing.copying import deep_copy, tensor_ids, tree_copy


@dataclass(frozen=True)
class Prepared:
    """The start of a compile: `table` (what compile uses) and `input_table` (where propagation started, or
    None), `usable` (its entries the captured graph holds), `unread` (parameters the forward never reads),
    `trusted` (the captured graph masked with `table`; the tensors it leaves alone are the user's: handed out
    only through `tracing.copying.owning`), `kernels` (the families that may run here, None: all),
    `device` (the profile plans are predicted with) and `working` (a masked copy of the captured graph)."""

    table: Mapping[str, TeSA]
    input_table: Mapping[str, TeSA] | None
    usable: Mapping[str, TeSA]
    unread: list[str]
    trusted: nn.Module
    kernels: frozenset[str] | None
    device: Any
    working: Graph


def prepare(graph: Graph, table: Any, config: CompileConfig, plan: ExecutionPlan | None) -> Prepared:
    """Everything a compile reads before its passes and kernel choice (see the module docstring).

    Example:
        >>> prepare(graph, table, CompileConfig(), None).working.method  # doctest: +SKIP
        'fx'
    """
    table, input_table = unwrap_table(table)
    kernels = config.kernels
    if not compiler_available():  # one warning, then PyTorch's own kernels only
        warn_compiler_missing()
        kernels = frozenset({"dense", "shrink"})
    device = config.device or DeviceProfile.load_or_measure(cache_dir=config.cache_dir)
    # it shares the tensors the table leaves alone with the user's model: only read here, copied if handed out
    trusted, unread = table_reference(graph, table, share=True)
    usable, _ = split_unread(graph, graph.module, table)
    if plan is None:  # after the names are checked: a table naming nothing of the model is an error, no warning
        warn_if_dense(table)
    # without grids the reference is the masked copy the kernels are chosen on: share its masked tensors (no pass
    # or kernel edits one in place) and copy the user's (the compiled model owns its tensors); with grids it holds
    # weights on their grids, and the working copy keeps floats
    gm = apply_table(deep_copy(graph.module), usable) if has_grids(table) else \
        tree_copy(trusted, cloned=tensor_ids(graph.module, graph.root))
    # masking changes values, not shapes: the working graph keeps the captured one's description (no model run)
    return Prepared(table, input_table, usable, unread, trusted, kernels, device, relabelled(graph, gm))


def offered(working: Graph, table: Mapping[str, TeSA], prepared: Prepared, plan: ExecutionPlan | None
            ) -> ExecutionPlan:
    """The plan of `working`'s ops under `table` (a copy of `plan` when given), with only the candidates whose kernel
    families may run here (dense always).

    Example:
        >>> offered(prepared.working, prepared.usable, prepared, None).ops.keys()  # doctest: +SKIP
    """
    execution = copy.deepcopy(plan) if plan is not None else make_plan(working, table, prepared.device)
    if prepared.kernels is not None:
        for op in execution.ops.values():
            op.candidates = [c for c in op.candidates
                             if c.name == "dense" or all(p.kernel in prepared.kernels for p in c.parts)]
    return execution
