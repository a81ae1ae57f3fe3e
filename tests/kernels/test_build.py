"""The build cache: content-keyed, atomic under concurrent builders, validated on load, clear without gcc."""

import multiprocessing as mp
import shutil
import subprocess
from pathlib import Path

import pytest

from sparta_explore.kernels.build import (
    KernelBuildError,
    build,
    compiler_available,
    compiler_version,
    cpu_flags,
    library_problem,
    load_library,
    vector_width,
)

SOURCE = "int twice(int a) { return 2 * a; }"


def _build_in_child(cache_dir, queue):
    queue.put(build(SOURCE, "twice", cache_dir=cache_dir).lib.twice(21))


def test_build_and_cache_hit(tmp_path):
    first = build(SOURCE, "twice", cache_dir=tmp_path)
    assert first.lib.twice(4) == 8 and not first.cached
    again = build(SOURCE, "twice", cache_dir=tmp_path)
    assert again.cached and again.path == first.path
    other = build(SOURCE + "\n", "twice", cache_dir=tmp_path)
    assert other.key != first.key  # any change to the source is a new entry


def test_concurrent_builders_of_one_kernel(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(str(tmp_path), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sorted(queue.get(timeout=5) for _ in procs) == [42, 42, 42]
    assert len(list((tmp_path / "kernels").glob("twice-*.so"))) == 1
    assert not [p for p in (tmp_path / "kernels").iterdir() if p.is_dir()]  # no leftover temp folders


def test_compile_error_is_reported(tmp_path):
    with pytest.raises(KernelBuildError, match="gcc failed building broken"):
        build("int broken( {", "broken", cache_dir=tmp_path)


def test_isa_detection_is_consistent():
    assert vector_width() == (16 if "avx512f" in cpu_flags() else 8)


def _child_build(cache_dir, source, name, queue, isa):
    from sparta_explore.kernels.build import set_target_isa

    set_target_isa(isa)  # the parent's ceiling (a spawned process starts native)
    built = build(source, name, cache_dir=cache_dir)
    queue.put(str(built.path))


def _built_elsewhere(tmp_path, source, name):
    # built in a child process, so this process never dlopens the file the test then damages
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    from sparta_explore.kernels.build import target_isa

    proc = ctx.Process(target=_child_build, args=(str(tmp_path), source, name, queue, target_isa()))
    proc.start()
    proc.join(60)
    return Path(queue.get(timeout=5))


@pytest.mark.parametrize("damage", [
    lambda p: p.write_bytes(p.read_bytes()[:2000]),             # truncated: dlopen would SIGBUS
    lambda p: p.write_bytes(b""),                               # empty
    lambda p: p.write_bytes(b"\x7fELF" + bytes(range(256)) * 8),  # garbage with an ELF magic
    lambda p: p.with_suffix(".json").unlink(),                  # no build record
    lambda p: p.with_suffix(".json").write_text("{"),           # torn build record
])
def test_a_damaged_cache_entry_is_rebuilt_not_loaded(tmp_path, damage):
    source = f"int seven(void) {{ return 7; }} /* {id(damage)} */"
    path = _built_elsewhere(tmp_path, source, "seven")
    assert library_problem(path) is None
    damage(path)
    assert library_problem(path) is not None
    with pytest.warns(RuntimeWarning, match="is corrupt .*rebuilding"):
        again = build(source, "seven", cache_dir=tmp_path)
    assert not again.cached and again.lib.seven() == 7
    assert library_problem(path) is None  # repaired for every later process


def test_load_library_refuses_a_mismatching_file(tmp_path):
    path = _built_elsewhere(tmp_path, "int eight(void) { return 8; }", "eight")
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(KernelBuildError, match="unusable: size"):
        load_library(path)


def test_the_source_that_ran_is_kept_beside_the_library(tmp_path):
    built = build("int nine(void) { return 9; }", "nine", cache_dir=tmp_path)
    assert built.source_path.read_text() == "int nine(void) { return 9; }"
    assert built.source_path.with_suffix(".so") == built.path


def test_without_gcc_building_is_a_clear_error(no_compiler, tmp_path):
    assert compiler_version() is None and not compiler_available()
    with pytest.raises(KernelBuildError, match="no C compiler"):
        build("int ten(void) { return 10; }", "ten", cache_dir=tmp_path)


def test_without_gcc_compile_runs_on_pytorch_with_one_warning(no_compiler, tmp_path):
    import warnings

    import torch
    from torch import nn

    import sparta_explore as se
    from sparta_explore.kernels.build import CompilerMissingWarning

    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    kept = torch.rand(16, 32, generator=torch.Generator().manual_seed(0)) > 0.7
    kept[:4] = False
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(kept)})
    x = torch.randn(8, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = se.compile(model, table, (x,), cache_dir=tmp_path)
    assert [type(w.message) for w in caught] == [CompilerMissingWarning]
    assert set(cm.report["choice"]) <= {"dense", "shrink"}
    ref = se.masked_copy(model, table)
    assert torch.allclose(cm(x), ref(x), atol=1e-5)
    device = se.device.DeviceProfile.load_or_measure(quick=True, cache_dir=tmp_path)
    assert device.blocks == () and device.bits == (32,)


@pytest.fixture
def avx2_ceiling():
    from sparta_explore.kernels.build import set_target_isa, target_isa

    before = target_isa()  # `pytest --isa avx2` sets one for the whole session
    set_target_isa("avx2")
    try:
        yield
    finally:
        set_target_isa(before)


VECTOR_LOOP = "void scale(float *x, int n) { for (int i = 0; i < n; ++i) x[i] *= 3.0f; }"


@pytest.mark.skipif(not compiler_available() or "avx2" not in cpu_flags(), reason="needs gcc and an AVX2 CPU")
def test_an_avx2_ceiling_hides_wider_flags_and_builds_apart(tmp_path, avx2_ceiling):
    import ctypes

    import torch

    from sparta_explore.kernels import Int8SparseLinear, SparseLinear
    from sparta_explore.kernels.build import native_cpu_flags, target_isa

    assert target_isa() == "avx2" and vector_width() == 8
    assert not any(f.startswith(("avx512", "avx_vnni")) for f in cpu_flags()) and "avx2" in cpu_flags()
    built = build(VECTOR_LOOP, "scale", cache_dir=tmp_path)
    assert not built.cached
    x = (ctypes.c_float * 37)(*range(37))
    built.lib.scale(x, 37)
    assert list(x) == [3.0 * i for i in range(37)]
    if "avx512f" in native_cpu_flags() and shutil.which("objdump"):  # -march=native emits no 512-bit code
        listing = subprocess.run(["objdump", "-d", str(built.path)], capture_output=True, text=True).stdout
        assert "ymm" in listing and "zmm" not in listing
    w, kept = torch.randn(24, 40), torch.rand(24, 40) < 0.3
    fp32 = SparseLinear(w, None, kept, cache_dir=tmp_path)
    int8 = Int8SparseLinear(w, None, kept, cache_dir=tmp_path)
    assert fp32.fallback_reason is None and int8.fallback_reason is None
    assert int8.dot_path.startswith("avx2")
    xs = torch.randn(50, 40)
    assert torch.allclose(fp32(xs), fp32.reference(xs), atol=1e-4)
    assert torch.allclose(int8(xs), int8.reference(xs), atol=1e-3)


def test_unknown_target_isa_is_refused():
    from sparta_explore.kernels.build import set_target_isa, target_isa

    before = target_isa()
    with pytest.raises(ValueError, match="unknown target ISA 'sse'"):
        set_target_isa("sse")
    assert target_isa() == before
