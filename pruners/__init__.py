"""Pruners that emit TeSAs: NNI 3.0's pruners through adapters, block and N:M pruners, and one-shot
calibration-based pruners for pretrained LLMs (Wanda, SparseGPT, with OWL layer sparsities).

Example:
    >>> from sparta_explore.pruners import prune, BlockPruneConfig
    >>> table = prune(model, {"sparsity": 0.5}, pruner="l1norm")           # doctest: +SKIP
    >>> table = prune(model, BlockPruneConfig(0.9, (32, 32)), pruner="block")  # doctest: +SKIP
    >>> table = prune(llama, WandaConfig(0.5), pruner="wanda", evaluator=calib_ids)  # doctest: +SKIP
"""

from sparta_explore.pruners.block import BlockPruneConfig, block_magnitude_masks
from sparta_explore.pruners.channels import prune_dependent_norms
from sparta_explore.pruners.nm import NMPruneConfig, nm_mask, nm_masks
from sparta_explore.pruners.nni_evaluator import workload_evaluator
from sparta_explore.pruners.nni_pruners import NNIPruneConfig
from sparta_explore.pruners.oneshot_config import OneShotPruneConfig
from sparta_explore.pruners.owl import owl_sparsities
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
from sparta_explore.pruners.sparsegpt import SparseGPTConfig, sparsegpt_masks, sparsegpt_prune
from sparta_explore.pruners.wanda import WandaConfig, wanda_keep, wanda_masks

__all__ = ["BlockPruneConfig", "Masks", "PruneRequest", "NMPruneConfig", "NNIPruneConfig", "OneShotPruneConfig",
           "SparseGPTConfig", "WandaConfig", "block_magnitude_masks", "from_nni_masks", "get_pruner", "masks_to_table",
           "nm_mask", "nm_masks", "owl_sparsities", "prune", "prune_dependent_norms", "pruner_names",
           "register_pruner", "sparsegpt_masks", "sparsegpt_prune", "wanda_keep", "wanda_masks",
           "workload_evaluator"]
