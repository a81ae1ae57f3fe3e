"""Quantizers that emit bit widths as TeSAs: NNI 3.0's (QAT, PTQ, LSQ, DoReFa, BNN), uniform, and GPTQ.

Example:
    >>> from sparta_explore.quantizers import quantize, NNIQuantConfig
    >>> q = quantize(model, NNIQuantConfig(), "qat", evaluator=workload, example_inputs=x)  # doctest: +SKIP
    >>> table = prune_table.merge(q)                                                     # doctest: +SKIP
"""

from sparta_explore.quantizers.calibrate import CalibrationResult, calibrate, calibrate_bits
from sparta_explore.quantizers.calibrate_config import CalibrationConfig, CalibrationStep
from sparta_explore.quantizers.calibrate_split import (
    CalibrationData,
    accuracy_on,
    calibrate_on_split,
    calibrate_workload,
    calibration_data,
    flip_rate,
    held_out_margin,
)
from sparta_explore.quantizers.fake_quant_model import FakeQuantOp, fake_quant_model
from sparta_explore.quantizers.gptq import GPTQConfig, GPTQResult, gptq_bits, gptq_quantize, gptq_quantize_layer
from sparta_explore.quantizers.nni_quantizers import NNIQuantConfig
from sparta_explore.quantizers.registry import (
    QuantBits,
    QuantRequest,
    bits_to_table,
    get_quantizer,
    parse_quant_dtype,
    quantize,
    quantizer_names,
    register_quantizer,
)
from sparta_explore.quantizers.uniform import UniformQuantConfig, uniform_bits

__all__ = ["CalibrationConfig", "CalibrationData", "CalibrationResult", "CalibrationStep", "FakeQuantOp",
           "GPTQConfig", "GPTQResult", "NNIQuantConfig", "QuantBits", "QuantRequest", "UniformQuantConfig",
           "accuracy_on", "bits_to_table", "calibrate", "calibrate_bits", "calibrate_on_split", "calibrate_workload",
           "calibration_data", "fake_quant_model", "flip_rate", "get_quantizer", "gptq_bits", "gptq_quantize",
           "gptq_quantize_layer", "held_out_margin", "parse_quant_dtype", "quantize", "quantizer_names",
           "register_quantizer", "uniform_bits"]
