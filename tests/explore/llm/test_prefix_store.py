"""Calibration prefixes on disk: a cache in another process (here: another cache on the same folder) resumes
from files to exactly the full walk's weights; the folder keeps to its size; bad files are misses."""

import os
import time

import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.prefix import CalibrationCache, PrefixEntry
from sparta_explore.explore.llm.prefix_store import PrefixStore
from sparta_explore.oneshot import OBSResult
from sparta_explore.oneshot.grid import GroupGrid

from .test_prefix import FIRST, LAYERS, SAME_FIRST_BAND, _compressed, _same_weights, workload  # noqa: F401


def test_a_cache_on_another_process_resumes_from_the_files_bit_for_bit(workload, tmp_path):  # noqa: F811
    writer = CalibrationCache(store=PrefixStore(tmp_path))
    first, first_results = _compressed(workload, FIRST, writer)
    assert len(PrefixStore(tmp_path).files()) == 2  # one file a band
    full, full_results = _compressed(workload, SAME_FIRST_BAND)
    reader = CalibrationCache(store=PrefixStore(tmp_path))  # nothing in memory: what a new NNI trial has
    resumed, results = _compressed(workload, SAME_FIRST_BAND, reader)
    assert reader.stats()["entries_read"] == 1 and reader.stats()["blocks_reused"] == LAYERS // 2
    assert _same_weights(resumed, full)
    for name, r in results.items():
        want = full_results[name]
        assert torch.equal(r.weight, want.weight) and torch.equal(r.keep, want.keep) and r.loss == want.loss
        assert (r.grid is None) == (want.grid is None)
        if r.grid is not None:
            assert torch.equal(r.grid.scale, want.grid.scale) and r.grid.bits == want.grid.bits
    again = CalibrationCache(store=PrefixStore(tmp_path))
    same, _ = _compressed(workload, FIRST, again)
    assert again.stats()["blocks_reused"] == LAYERS and _same_weights(same, first)


def _entry(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, n, generator=g)
    grid = GroupGrid(torch.rand(4, 1, generator=g), torch.zeros(4, 1), bits=4, group_size=n, sym=False)
    return PrefixEntry((torch.randn(2, n, generator=g),), {"w": w}, {"w": OBSResult(w, w != 0, grid, 0.5)})


def test_the_folder_keeps_to_its_bytes_and_drops_the_least_recently_used(tmp_path):
    size = PrefixStore(tmp_path).save("a" * 40, _entry(64)).stat().st_size
    store = PrefixStore(tmp_path, max_bytes=int(2.5 * size))
    now = time.time()
    os.utime(tmp_path / f"{'a' * 40}.safetensors", (now - 30, now - 30))
    store.save("b" * 40, _entry(64, 1))
    os.utime(tmp_path / f"{'b' * 40}.safetensors", (now - 20, now - 20))
    assert store.load("a" * 40) is not None  # read: now the most recently used
    store.save("c" * 40, _entry(64, 2))
    assert store.load("b" * 40) is None and store.load("a" * 40) is not None and store.load("c" * 40) is not None
    assert store.save("d" * 40, _entry(4096)) is None  # larger than the folder may hold: not written
    loaded = store.load("c" * 40)
    want = _entry(64, 2)
    assert torch.equal(loaded.hidden[0], want.hidden[0]) and torch.equal(loaded.weights["w"], want.weights["w"])
    assert loaded.results["w"].grid.group_size == 64 and loaded.results["w"].loss == 0.5


def test_bad_files_and_keys(tmp_path):
    store = PrefixStore(tmp_path)
    (tmp_path / f"{'e' * 40}.safetensors").write_bytes(b"not a safetensors file")
    assert store.load("e" * 40) is None  # a miss: the trial walks those blocks itself
    with pytest.raises(ConfigError, match="a key is a hex digest"):
        store.load("../escape")
    with pytest.raises(ConfigError, match="max_bytes must be >= 0"):
        PrefixStore(tmp_path, max_bytes=-1)
