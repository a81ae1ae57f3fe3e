"""The plan stage: bit rounding, weighted block cover, sub-operators, candidates with predicted times.

Example:
    >>> from sparta_explore.plan import plan
    >>> print(plan(graph, table, device))  # doctest: +SKIP
"""

from sparta_explore.callable_module import make_callable
from sparta_explore.plan.bit_rounding import BitOption, bit_options, round_bits
from sparta_explore.plan.block_cover import Cover, CoverPart, single_shape_cover, weighted_block_cover
from sparta_explore.plan.candidates import CANDIDATES, OpInfo, register_candidates
from sparta_explore.plan.execution_plan import Candidate, ExecutionPlan, OpPlan, SubOp
from sparta_explore.plan.planner import FUSABLE, OP_KINDS, plan

__all__ = ["CANDIDATES", "FUSABLE", "OP_KINDS", "BitOption", "Candidate", "Cover", "CoverPart", "ExecutionPlan",
           "OpInfo", "OpPlan", "SubOp", "bit_options", "plan", "register_candidates", "round_bits",
           "single_shape_cover", "weighted_block_cover"]

make_callable(__name__, "plan")
