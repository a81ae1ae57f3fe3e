"""Specialized CPU kernels (installed as `sparta_explore.kernels`).

`SparseLinear` runs y = act(x W^T + b) through C generated for W's kept pattern (block or
unstructured), compiled with the system gcc, cached by content hash, checked against the
masked dense op, and falling back to it with a warning if anything fails.

Example:
    >>> from sparta_explore.kernels import SparseLinear
    >>> layer = SparseLinear(linear.weight, linear.bias, tesa.kept, block_rows=32)  # doctest: +SKIP
"""

from sparta_explore.kernels.build import (
    KernelBuildError,
    build,
    compiler_available,
    cpu_flags,
    set_target_isa,
    target_isa,
    vector_width,
)
from sparta_explore.kernels.compiled_op import CompiledOp, KernelGradError, KernelInputError
from sparta_explore.kernels.int8_linear import Int8SparseLinear
from sparta_explore.kernels.shrink import ShrunkLinear
from sparta_explore.kernels.sparse_linear import KernelFallbackWarning, KernelLinear, SparseLinear

__all__ = ["CompiledOp", "Int8SparseLinear", "KernelBuildError", "KernelFallbackWarning", "KernelGradError",
           "KernelInputError", "KernelLinear", "ShrunkLinear", "SparseLinear", "build", "compiler_available",
           "cpu_flags", "set_target_isa", "target_isa", "vector_width"]
