"""The build cache: content-keyed, atomic under concurrent builders, clear on gcc errors."""

import multiprocessing as mp

import pytest

from sparta_explore.kernels.build import KernelBuildError, build, cpu_flags, vector_width

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
