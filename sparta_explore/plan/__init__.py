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
from sparta_explore.plan.planner import FUSABLE, plan
from sparta_explore.plan.sites import WeightSite, register_site, site_of, weight_sites

__all__ = ["CANDIDATES", "FUSABLE", "BitOption", "Candidate", "Cover", "CoverPart", "ExecutionPlan", "OpInfo",
           "OpPlan", "SubOp", "WeightSite", "bit_options", "plan", "register_candidates", "register_site",
           "round_bits", "single_shape_cover", "site_of", "weight_sites", "weighted_block_cover"]

make_callable(__name__, "plan")
