"""Quantizers that emit bit widths as TeSAs: NNI 3.0's (QAT, PTQ, LSQ, DoReFa, BNN) and uniform.

Example:
    >>> from sparta_explore.quantizers import quantize, NNIQuantConfig
    >>> q = quantize(model, NNIQuantConfig(), "qat", evaluator=data, example_inputs=x)  # doctest: +SKIP
    >>> table = prune_table.merge(q)                                                 # doctest: +SKIP
"""

from sparta_explore.quantizers.nni_quantizers import NNIQuantConfig
from sparta_explore.quantizers.registry import (
                                                QuantBits,
                                                bits_to_table,
                                                get_quantizer,
                                                parse_quant_dtype,
                                                quantize,
                                                quantizer_names,
                                                register_quantizer,
)
from sparta_explore.quantizers.uniform import UniformQuantConfig, uniform_bits

__all__ = ["NNIQuantConfig", "QuantBits", "UniformQuantConfig", "bits_to_table", "get_quantizer", "parse_quant_dtype",
           "quantize", "quantizer_names", "register_quantizer", "uniform_bits"]
