"""build() under a tiny cache cap: loads mark entries used, new builds evict the least recently used."""

import os

import pytest

from sparta_explore.cache_limits import MAX_MB_ENV, MB, scan_kernels
from sparta_explore.kernels.build import build, compiler_available, load_library

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler (gcc) on PATH: nothing is built")


def source(fn: str, value: int) -> str:
    return f"int {fn}(void) {{ return {value}; }}"


def test_build_keeps_the_kernel_cache_under_its_cap(tmp_path, monkeypatch):
    monkeypatch.delenv(MAX_MB_ENV, raising=False)  # the default cap: these few entries are far under it
    built = {fn: build(source(fn, i), fn, cache_dir=tmp_path) for i, fn in enumerate(["a", "b", "c"])}
    folder = tmp_path / "kernels"
    for age, fn in enumerate(built):  # a, b, c last used a day ago, in that order
        for path in folder.glob(f"{fn}-*"):
            os.utime(path, (1e9 + age, 1e9 + age))
    assert build(source("a", 0), "a", cache_dir=tmp_path).cached  # a load: a is now the most recently used

    sizes = {e.stem.split("-")[0]: e.size for e in scan_kernels(folder)}
    cap = sum(sizes.values()) * 1.15  # room for three entries, not four
    monkeypatch.setenv(MAX_MB_ENV, f"{cap / MB:.6f}")
    d = build(source("d", 3), "d", cache_dir=tmp_path)

    left = {e.stem.split("-")[0]: e for e in scan_kernels(folder)}
    assert sorted(left) == ["a", "c", "d"]  # b, the least recently used, went; d, just built, stayed
    assert all(len(e.files) == 3 for e in left.values())  # whole entries only
    assert not list(folder.glob("b-*"))
    assert sum(e.size for e in left.values()) <= cap
    assert d.lib.d() == 3 and load_library(built["c"].path).c() == 2
    assert built["b"].lib.b() == 1  # evicted while loaded: the process's mapping of it still works
    again = build(source("b", 1), "b", cache_dir=tmp_path)  # asked for again: simply rebuilt
    assert not again.cached and again.lib.b() == 1
