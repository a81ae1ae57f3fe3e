"""The prompt's many-row products on the decode step's packed weights, against the rounded input times the weight."""

import pytest
import torch

from sparta_explore.fake_quant import fake_quantize_runs
from sparta_explore.kernels.build import native_cpu_flags, set_target_isa, target_isa
from sparta_explore.kernels.decode_step import mat_of, prefill_products, why_no_kernels
from sparta_explore.kernels.packed_weights import converts_halves, pack_weight
from sparta_explore.oneshot.grid import QuantSpec, round_to_grids

from .gguf_weights import gguf_like

pytestmark = pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))
VNNI = bool({"avx512_vnni", "avx_vnni"} & native_cpu_flags())


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((got - want).abs().max() <= 1e-5 * max(float(want.abs().max()), 1.0))


def _weight(bits: int, group: int | None, n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    w = w if bits == 32 else round_to_grids(w, QuantSpec(bits, group))
    w[1] = 0.0  # a row with no weights
    w[2, 32:64] = 0.0  # a group of zeros
    return w


def _product(w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, tiles: bool = True) -> torch.Tensor:
    mat, _keep = mat_of(pack_weight(w), bias, tiles=tiles)
    return prefill_products([mat], x)[0]


@pytest.mark.parametrize("bits, group, n, k, fmt", [(8, 32, 37, 576, "u8"), (8, None, 13, 192, "u8"),
                                                    (4, 32, 21, 576, "u4"), (4, 128, 37, 576, "u4"),
                                                    (4, 64, 9, 192, "u4"), (3, None, 11, 128, "u4"),
                                                    (32, None, 13, 96, "f32")])
@pytest.mark.parametrize("rows", [1, 3, 7, 8, 9, 64, 65, 130])
def test_each_layout_times_many_rows_is_the_rounded_input_times_the_weight(bits, group, n, k, fmt, rows):
    w = _weight(bits, group, n, k, seed=n * k + rows)
    assert pack_weight(w).fmt == fmt
    gen = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    x[rows // 2] = 0.0  # an all-zero input row
    want = fake_quantize_runs(x) @ w.T + bias
    assert _close(_product(w, x, bias), want)
    assert _close(_product(w, x, None, tiles=False), want - bias)  # the same codes in rows


@pytest.mark.skipif(not converts_halves(), reason="float16 grids need F16C")
@pytest.mark.parametrize("group, symmetric", [(32, True), (128, True), (32, False), (64, False)])
def test_float16_grids_give_the_same_products(group, symmetric):
    w = gguf_like(27, 576, group, symmetric, seed=group)
    packed = pack_weight(w)
    assert packed.half_grids
    x = torch.randn(70, 576, generator=torch.Generator().manual_seed(group))
    mat, _keep = mat_of(packed, tiles=True)
    assert _close(prefill_products([mat], x)[0], fake_quantize_runs(x) @ w.T)


def test_several_weights_share_one_rounding_and_outliers_stay_in_their_runs():
    ws = [_weight(4, 32, 48, 128, 1), _weight(8, 32, 16, 128, 2), _weight(32, None, 5, 128, 3)]
    x = torch.randn(19, 128, generator=torch.Generator().manual_seed(4))
    x[0, 5], x[3, 70:80], x[4] = 1e4, 0.25, 0.0  # a run dominated by an outlier, a row of zeros
    kept = [mat_of(pack_weight(w), tiles=True) for w in ws]
    outs = prefill_products([mat for mat, _keep in kept], x, threads=2)
    for w, out in zip(ws, outs):
        assert out.shape == (19, w.shape[0]) and _close(out, fake_quantize_runs(x) @ w.T)
    assert prefill_products([kept[0][0]], x[:0])[0].shape == (0, 48)


@pytest.mark.skipif(not VNNI, reason="the AVX2 path is checked against the VNNI one on a CPU with VNNI")
@pytest.mark.parametrize("bits, group", [(8, 32), (4, 32), (4, None)])
def test_the_avx2_path_computes_what_the_vnni_path_does(bits, group):
    w = _weight(bits, group, 40, 256, 5)
    x = torch.randn(33, 256, generator=torch.Generator().manual_seed(5))
    vnni = _product(w, x, None)
    before = target_isa()
    set_target_isa("avx2")  # built without AVX-512 and AVX-VNNI: vpmaddubsw (X4 in int16 sums, X8 the decode kernels)
    try:
        plain = _product(w, x, None)
    finally:
        set_target_isa(before)
    assert _close(plain, vnni) and _close(plain, fake_quantize_runs(x) @ w.T)


def test_bad_inputs_are_refused():
    mat, _keep = mat_of(pack_weight(_weight(8, 32, 8, 64, 6)), tiles=True)
    with pytest.raises(ValueError, match="no weights"):
        prefill_products([], torch.zeros(2, 64))
    with pytest.raises(ValueError, match=r"expected an \(M, k\) input"):
        prefill_products([mat], torch.zeros(2, 96))
