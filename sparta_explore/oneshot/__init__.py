"""Shared machinery of one-shot, calibration-based compressors (Wanda, SparseGPT, GPTQ, OWL).

Stage-neutral: pruners/ and quantizers/ import it; it imports neither of them, nor
exploration, the zoo or the compiler.

* `calibration_samples`: a calibration set (token ids, input dicts, a workload) as single forward calls;
* `find_blocks`, `select_linears`, `capture_block_inputs`: the repeated blocks, their linears, the first
  block's inputs (the Catcher trick);
* `calibrate_sequentially`: block by block, each calibrated on the compressed blocks' outputs;
  `obs_sequentially`: that with input Hessians and one OBS sweep per layer (SparseGPT's, GPTQ's);
* `InputHessian`, `InputChannelNorms`: what the hooks accumulate;
* `obs_compress`, `QuantSpec`, `GroupGrid`: the OBS sweep SparseGPT and GPTQ share, and its grids.

Example:
    >>> import torch
    >>> from sparta_explore.oneshot import calibration_samples
    >>> len(calibration_samples(torch.zeros(4, 8, dtype=torch.long)))
    4
"""

from sparta_explore.oneshot.blocks import (
    BlockInput,
    block_output,
    capture_block_inputs,
    find_blocks,
    is_linear,
    linears_in_blocks,
    select_linears,
    set_weight_matrix,
    weight_matrix,
)
from sparta_explore.oneshot.calibration import CalibrationSample, calibration_samples
from sparta_explore.oneshot.grid import GroupGrid, QuantSpec, fit_grid, quantize_to_grid, round_to_grids
from sparta_explore.oneshot.obs import OBSResult, inverse_hessian_factor, obs_compress
from sparta_explore.oneshot.sequential import calibrate_sequentially, layers_by_block, obs_sequentially
from sparta_explore.oneshot.statistics import InputChannelNorms, InputHessian, hessian_dtype

__all__ = ["BlockInput", "CalibrationSample", "GroupGrid", "InputChannelNorms", "InputHessian", "OBSResult",
           "QuantSpec", "block_output", "calibrate_sequentially", "calibration_samples", "capture_block_inputs",
           "find_blocks", "fit_grid", "hessian_dtype", "inverse_hessian_factor", "is_linear", "layers_by_block",
           "linears_in_blocks", "obs_compress", "obs_sequentially", "quantize_to_grid", "round_to_grids",
           "select_linears", "set_weight_matrix", "weight_matrix"]
