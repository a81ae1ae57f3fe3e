"""Pruners that emit TeSAs: NNI 3.0's pruners through adapters, plus block and N:M pruners.

Example:
    >>> from sparta_explore.pruners import prune, BlockPruneConfig
    >>> table = prune(model, {"sparsity": 0.5}, pruner="l1norm")           # doctest: +SKIP
    >>> table = prune(model, BlockPruneConfig(0.9, (32, 32)), pruner="block")  # doctest: +SKIP
"""

from sparta_explore.pruners.block import BlockPruneConfig, block_magnitude_masks
from sparta_explore.pruners.channels import prune_dependent_norms
from sparta_explore.pruners.nm import NMPruneConfig, nm_mask, nm_masks
from sparta_explore.pruners.nni_evaluator import workload_evaluator
from sparta_explore.pruners.nni_pruners import NNIPruneConfig
from sparta_explore.pruners.registry import (
                                             Masks,
                                             PruneRequest,
                                             from_nni_masks,
                                             get_pruner,
                                             masks_to_table,
                                             prune,
                                             pruner_names,
                                             register_pruner,
)

__all__ = ["BlockPruneConfig", "Masks", "PruneRequest", "NMPruneConfig", "NNIPruneConfig", "block_magnitude_masks",
           "from_nni_masks", "get_pruner", "masks_to_table", "nm_mask", "nm_masks", "prune", "prune_dependent_norms",
           "pruner_names", "register_pruner", "workload_evaluator"]
