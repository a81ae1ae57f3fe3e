"""Every compiled op: inputs C cannot read are refused first, dtypes come back as given, gradients never vanish."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from sparta_explore.kernels import Int8SparseLinear, KernelGradError, KernelInputError, ShrunkLinear, SparseLinear
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.kernels.dense import DenseConv2d, DenseLinear, ShrunkConv2d, SummedParts

needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2; this CPU has none")
IN, OUT = 48, 20


@pytest.fixture(scope="module")
def weights():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(OUT, IN, generator=g), torch.randn(OUT, generator=g)
    kept = torch.rand(OUT, IN, generator=g) > 0.6
    kept[3] = False  # a pruned row, so shrink has something to cut
    return w, b, kept


def _linear_ops(weights, tmp):
    w, b, kept = weights
    ops = {"sparse": SparseLinear(w, b, kept, block_rows=1, cache_dir=tmp, activation="relu"),
           "dense": DenseLinear(w * kept, b, activation="gelu"),
           "shrink": ShrunkLinear(w, b, kept),
           "summed": SummedParts([DenseLinear(w * kept, None), DenseLinear(w * ~kept, None)], b)}
    if "avx2" in cpu_flags():
        ops["int8"] = Int8SparseLinear(w, b, kept, block_rows=1, cache_dir=tmp)
    return ops


@pytest.fixture(scope="module")
def linear_ops(weights, tmp_path_factory):
    return _linear_ops(weights, tmp_path_factory.mktemp("kernels"))


OPS = ["sparse", "dense", "shrink", "summed", pytest.param("int8", marks=needs_avx2)]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("bad, problem", [
    (lambda: torch.zeros(4, IN, device="meta"), "on meta"),
    (lambda: torch.zeros(8, 32, 1024), f"expected {IN} features"),
    (lambda: torch.zeros(4, IN, dtype=torch.int32), "floating-point"),
    (lambda: torch.zeros(4, IN, dtype=torch.complex64), "floating-point"),
    (lambda: torch.tensor(1.0), f"expected {IN} features"),
    (lambda: "not a tensor", "expected a torch.Tensor"),
])
def test_unreadable_inputs_are_refused_before_the_kernel(linear_ops, name, bad, problem):
    # a meta tensor used to reach the C code and kill the process (SIGSEGV)
    with pytest.raises(KernelInputError, match=problem) as info:
        linear_ops[name](bad())
    assert type(linear_ops[name]).__name__ in str(info.value)


def test_errors_name_the_graph_op_once_compiled(linear_ops):
    op = copy.deepcopy(linear_ops["sparse"])
    op.label = "encoder.0.fc1"
    with pytest.raises(KernelInputError, match="op 'encoder.0.fc1' \\(SparseLinear\\): expected 48 features"):
        op(torch.zeros(2, 7))


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_float_dtypes_come_back_in_their_dtype(linear_ops, name, dtype):
    op = linear_ops[name]
    x = torch.randn(5, IN)
    want = op(x)
    got = op(x.to(dtype))
    assert got.dtype == dtype and got.shape == want.shape
    tol = {torch.float64: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    assert torch.allclose(got.float(), want, atol=tol * (1 + float(want.abs().max())), rtol=0)


@pytest.mark.parametrize("name", ["sparse", "dense", "shrink", "summed"])
def test_fp32_ops_give_the_reference_gradient(linear_ops, weights, name):
    op = linear_ops[name]
    x = torch.randn(6, IN, requires_grad=True)
    y = op(x)
    assert y.grad_fn is not None
    (y * torch.arange(OUT)).sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    (op.reference(x_ref) * torch.arange(OUT)).sum().backward()
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-5)
    with torch.no_grad():
        assert op(x).grad_fn is None  # inference keeps the kernel path


@needs_avx2
def test_int8_op_refuses_gradients_instead_of_dropping_them(linear_ops):
    x = torch.randn(6, IN, requires_grad=True)
    with pytest.raises(KernelGradError, match="no gradient"):
        linear_ops["int8"](x)
    with pytest.raises(KernelGradError):
        SummedParts([linear_ops["int8"]], None)(x)  # a sum containing an integer part refuses as well
    with torch.no_grad():
        assert linear_ops["int8"](x).shape == (6, OUT)


def test_a_dense_layer_after_a_kernel_gets_its_gradients(linear_ops):
    head = nn.Linear(OUT, 3)
    x = torch.randn(4, IN, requires_grad=True)
    head(linear_ops["sparse"](x)).sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0
    assert head.weight.grad is not None


@pytest.mark.parametrize("name", OPS)
def test_repr_survives_deepcopy_and_pickle(linear_ops, name):
    op = linear_ops[name]
    x = torch.randn(3, IN)
    for twin in (copy.deepcopy(op), pickle.loads(pickle.dumps(op))):
        assert repr(twin) == repr(op)  # used to raise AttributeError: no attribute 'built'
        assert torch.equal(twin(x), op(x))


def test_convs_check_rank_channels_and_dtype():
    conv = nn.Conv2d(4, 6, 3, padding=1)
    kept = torch.ones(6, 4, 3, 3, dtype=torch.bool)
    kept[1] = False
    for op in (ShrunkConv2d(conv, conv.weight * kept, kept), DenseConv2d(conv, conv.weight, kept)):
        with pytest.raises(KernelInputError, match="expected a 4-D input"):
            op(torch.zeros(4, 8, 8))
        with pytest.raises(KernelInputError, match="expected 4 features in dimension 1"):
            op(torch.zeros(1, 3, 8, 8))
        x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
        got = op(x)
        assert got.dtype == torch.float64
        assert torch.allclose(got, F.conv2d(x, _masked(op), conv.bias.detach().double(), padding=1), atol=1e-5)


def _masked(op):
    w = torch.zeros(op.out_channels, op.in_channels, *op.kernel_size, dtype=torch.float64)
    w[op.rows.reshape(-1, 1), op.cols.reshape(1, -1)] = op.weight_small.double()
    return w


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
       last=st.sampled_from([IN, IN - 1, 0, 1]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool, torch.uint8]),
       device=st.sampled_from(["cpu", "meta"]),
       contiguous=st.booleans())
def test_fuzzed_inputs_run_right_or_fail_clearly(linear_ops, shape, last, dtype, device, contiguous):
    x = torch.zeros(*shape, last, dtype=dtype, device=device) if device == "meta" else \
        (torch.randn(*shape, last) * 3).to(dtype)
    if not contiguous and x.dim() >= 2 and device == "cpu":
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    op = linear_ops["sparse"]
    readable = device == "cpu" and dtype.is_floating_point and last == IN
    if not readable:
        with pytest.raises(KernelInputError):
            op(x)
        return
    with torch.no_grad():
        got, want = op(x), op.reference(x)
    assert got.dtype == x.dtype and got.shape == (*shape, OUT)
    scale = 1 + (float(want.float().abs().max()) if want.numel() else 0.0)
    assert torch.allclose(got.float(), want.float(), atol=1e-2 * scale)


def test_a_tensor_without_data_runs_the_reference():
    """Shape propagation (fake or meta tensors) must never hand a kernel memory it cannot read."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = ShrunkLinear(torch.randn(6, 8), torch.randn(6), torch.ones(6, 8, dtype=torch.bool))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        y = layer(mode.from_tensor(torch.randn(3, 8)))
    assert tuple(y.shape) == (3, 6)
