"""The one-row (small-M) decode kernels: every packed layout against its de-quantized weight, M = 1 .. 11."""

import shutil
import subprocess

import pytest
import torch

from sparta_explore.fake_quant import fake_quantize_rows, fake_quantize_runs
from sparta_explore.kernels.build import cpu_flags, set_target_isa, target_isa
from sparta_explore.kernels.c_templates import c_text
from sparta_explore.kernels.decode_step import MAX_BATCH, gemv, why_no_kernels
from sparta_explore.kernels.packed_weights import converts_halves, pack_weight
from sparta_explore.oneshot.grid import QuantSpec, round_to_grids

from .gguf_weights import gguf_like

pytestmark = pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((got - want).abs().max() <= 1e-5 * max(float(want.abs().max()), 1.0))


@pytest.mark.parametrize("bits, group, n, k, fmt", [(32, None, 13, 75, "f32"), (32, None, 40, 576, "f32"),
                                                    (4, 32, 37, 576, "u4"), (4, 128, 37, 576, "u4"),
                                                    (3, 64, 9, 192, "u4"), (4, None, 6, 576, "u4"),
                                                    (4, None, 7, 384, "u4"), (4, 32, 11, 96, "u8"),
                                                    (8, 32, 21, 160, "u8"), (8, None, 5, 64, "u8")])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 11])
def test_each_layout_multiplies_like_its_dequantized_weight(bits, group, n, k, fmt, rows):
    gen = torch.Generator().manual_seed(n * k + rows)
    w = torch.randn(n, k, generator=gen)
    w = w if bits == 32 else round_to_grids(w, QuantSpec(bits, group))
    w[1] = 0.0  # a row with no weights
    if k >= 64:
        w[2, 32:64] = 0.0  # a group of zeros
    packed = pack_weight(w, bits=32) if bits == 32 else pack_weight(w)
    assert packed.fmt == fmt
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    assert _close(gemv(packed, x, bias), x @ packed.dequantize().T + bias)
    assert _close(gemv(packed, x, threads=1), x @ w.T)
    if k % 32 == 0:  # int8 activations: the input rounded per 32 columns, integer dot products
        assert _close(gemv(packed, x, bias, act_bits=8), fake_quantize_runs(x) @ w.T + bias)
        # one grid a row at fewer bits: what the int8 sparse kernels do to their input
        assert _close(gemv(packed, x, act_bits=6, run=k), fake_quantize_rows(x, 6) @ w.T)


@pytest.mark.skipif(not converts_halves(), reason="float16 grids need F16C")
@pytest.mark.parametrize("group, symmetric, fmt", [(32, False, "u4"), (64, False, "u4"), (128, False, "u4"),
                                                   (32, True, "u8"), (128, True, "u8"), (64, True, "u8")])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_float16_grids_multiply_like_their_weight(group, symmetric, fmt, rows):
    w = gguf_like(19, 576, group, symmetric, seed=group + rows)
    w[4] = 0.0  # a row with no weights
    packed = pack_weight(w)
    assert packed.fmt == fmt and packed.half_grids
    gen = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, 576, generator=gen), torch.randn(19, generator=gen)
    assert _close(gemv(packed, x, bias), x @ w.T + bias)
    assert _close(gemv(packed, x, bias, act_bits=8), fake_quantize_runs(x) @ w.T + bias)
    assert _close(gemv(packed, x, act_bits=6, run=576), fake_quantize_rows(x, 6) @ w.T)
    as_float = pack_weight(w, half=False)  # the same products from float32 grids
    assert _close(gemv(packed, x, act_bits=8), gemv(as_float, x, act_bits=8))


def test_int8_runs_hold_outliers_and_all_zero_runs():
    packed = pack_weight(round_to_grids(torch.randn(16, 128), QuantSpec(4, 32)))
    x = torch.zeros(2, 128)
    x[0, 5], x[0, 70:80], x[1, 33] = 1e4, 0.25, -3.0  # one run dominated by an outlier, others empty
    assert _close(gemv(packed, x, act_bits=8), fake_quantize_runs(x) @ packed.dequantize().T)
    with pytest.raises(ValueError, match="act_bits is 32, or 2..8"):
        gemv(pack_weight(torch.randn(4, 40)), torch.zeros(1, 40), act_bits=8)


def test_zero_inputs_give_the_bias_and_bad_shapes_are_refused():
    packed = pack_weight(round_to_grids(torch.randn(8, 64), QuantSpec(4, 32)))
    bias = torch.arange(8.0)
    assert torch.equal(gemv(packed, torch.zeros(MAX_BATCH, 64), bias), bias.expand(MAX_BATCH, 8))
    with pytest.raises(ValueError, match=r"expected an \(M, 64\) input"):
        gemv(packed, torch.zeros(2, 63))


@pytest.mark.parametrize("flags", [("-mavx512f", "-mavx512vl", "-mavx512vnni"), ("-mavxvnni",)],
                         ids=["avx512_vnni", "avx_vnni"])
def test_on_vnni_cpus_every_integer_product_is_a_vpdpbusd(tmp_path, flags):
    # built with -march=native, the kernels pick VNNI from the compiler's macros: checked here as generated code (a
    # CPU with VNNI runs the numerical tests above on that path; vpmaddubsw and vpdpbusd agree exactly on our ranges)
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    source = tmp_path / "decode.c"
    source.write_text(c_text("decode_rows.c") + c_text("decode_prefill.c") + c_text("decode_step.c")
                      + c_text("decode_prompt.c"))
    asm = {}
    for extra in ((), flags):
        done = subprocess.run([gcc, "-O1", "-mavx2", "-mfma", *extra, "-fopenmp", "-S", str(source), "-o", "-"],
                              capture_output=True, text=True)
        if done.returncode != 0 and extra:
            pytest.skip(f"this gcc cannot target {' '.join(flags)}: {done.stderr.strip()[:200]}")
        assert done.returncode == 0, done.stderr
        asm[extra] = done.stdout
    assert "vpmaddubsw" in asm[()] and "vpdpbusd" not in asm[()]
    assert "vpdpbusd" in asm[flags] and "vpmaddubsw" not in asm[flags]


def _pruned(n: int, k: int, kept: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * (torch.rand(n, k, generator=gen) < kept)


@pytest.mark.parametrize("n, k, kept", [(37, 576, 0.5), (13, 200, 0.3), (9, 64, 0.7), (19, 1536, 0.1)])
@pytest.mark.parametrize("rows", [1, 3, 5, 8])
def test_bitmask_rows_multiply_like_their_pruned_weight(n, k, kept, rows):
    w = _pruned(n, k, kept, seed=n + rows)
    w[1] = 0.0  # a row with no weights
    w[2, :64] = 0.0  # eight empty mask bytes
    packed = pack_weight(w)
    assert packed.fmt == "s32"
    gen = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    assert _close(gemv(packed, x, bias), x @ w.T + bias)
    if k % 32 == 0:  # int8 activations meet the kept values as floats: the rounded inputs times the weight
        assert _close(gemv(packed, x, act_bits=8), fake_quantize_runs(x) @ w.T)


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the table path is checked against vexpandps on AVX-512")
def test_the_avx2_expansion_table_computes_what_vexpandps_does():
    w = _pruned(21, 256, 0.4, seed=3)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(3))
    packed = pack_weight(w)
    native = gemv(packed, x)
    before = target_isa()
    set_target_isa("avx2")  # built without AVX-512: each mask byte's lanes come from the permute table
    try:
        table = gemv(packed, x)
    finally:
        set_target_isa(before)
    assert _close(table, native) and _close(table, x @ w.T)
