"""lowering: builders hold a weight compile has masked already as it is, and compute the masked op either way."""

import pytest
import torch
from torch import nn

from sparta_explore.compile.lowering import LowerContext, lower
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.plan.execution_plan import Candidate, SubOp

needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2")


def _masked_linear(seed: int) -> tuple[nn.Linear, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(70, 37)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(37, 70, generator=g))
    kept = torch.rand(37, 70, generator=g) < 0.15
    kept[5] = False  # a row with nothing kept
    return linear, kept


def _candidate(kernel: str, kept: torch.Tensor, bits: int) -> Candidate:
    sub = SubOp(kernel, (1, 1), bits, bits, int(kept.sum()), kept)
    return Candidate(kernel, (sub,), 1.0)


@needs_avx2
@pytest.mark.parametrize("masked", [True, False])
def test_int8_builder_holds_a_masked_working_weight_as_it_is(masked):
    linear, kept = _masked_linear(0)
    if masked:  # compile's working copy: zero wherever the op's TeSA prunes
        with torch.no_grad():
            linear.weight.mul_(kept)
    ctx = LowerContext(linear, "none", 64, None, False, masked=masked)
    op = lower(_candidate("int8", kept, 8), ctx)
    assert op.fallback_reason is None
    shares = op.weight.untyped_storage().data_ptr() == linear.weight.untyped_storage().data_ptr()
    assert shares == masked  # unmasked: a masked copy, the module's own weight untouched
    assert torch.equal(op.weight, linear.weight.detach() * kept)
    x = torch.randn(50, 70)
    torch.testing.assert_close(op(x), op.reference(x), rtol=1e-5, atol=1e-5)
    if not masked:
        assert bool((linear.weight[~kept] != 0).any())
