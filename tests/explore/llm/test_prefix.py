"""Calibration shared by prefix: a trial that starts from kept bands compresses exactly what a full walk does."""

import copy

import pytest
import torch

from sparta_explore.explore.llm.compress import band_ends, compress_llm
from sparta_explore.explore.llm.prefix import CalibrationCache, PrefixEntry, prefix_key
from sparta_explore.explore.llm.space import Choice, LLMPoint
from sparta_explore.oneshot import calibrate_sequentially
from sparta_explore.zoo.llm.workloads import smollm2_tiny_workload

pytest.importorskip("transformers")
LAYERS = 4


@pytest.fixture(scope="module")
def workload():
    return smollm2_tiny_workload(layers=LAYERS)


def _compressed(workload, params, cache=None):
    model = copy.deepcopy(workload.dense_model())
    point = LLMPoint.from_dict(params, layers=LAYERS, bands=2)
    results = compress_llm(model, point, workload.calibration_inputs[0], cache=cache)
    return model, results


def _same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


FIRST = {"bits@mlp.0": 4, "group@mlp.0": 32, "sparsity@attn.0": 0.5, "compressor": "sparsegpt",
         "sparsity@attn.1": 0.5, "bits@mlp.1": 8}
SAME_FIRST_BAND = {**FIRST, "sparsity@attn.1": 0.0, "bits@attn.1": 4, "group@attn.1": 64}
SAME_COMPRESSION = {**FIRST, "act_bits": 32, "head_bits": 8}


@pytest.fixture(scope="module")
def full_walks(workload):
    return {name: _compressed(workload, params) for name, params in
            (("first", FIRST), ("same_first_band", SAME_FIRST_BAND), ("same_compression", SAME_COMPRESSION))}


def test_trials_resumed_from_kept_bands_equal_full_walks(workload, full_walks):
    cache = CalibrationCache()
    first, _ = _compressed(workload, FIRST, cache)
    assert _same_weights(first, full_walks["first"][0])
    assert cache.stats()["blocks_reused"] == 0 and cache.stats()["blocks_walked"] == LAYERS
    walked = LAYERS
    for name, later, reused in (("same_first_band", SAME_FIRST_BAND, LAYERS // 2),
                                ("same_compression", SAME_COMPRESSION, LAYERS)):
        before = cache.stats()["blocks_reused"]
        resumed, results = _compressed(workload, later, cache)
        full, full_results = full_walks[name]
        assert _same_weights(resumed, full), name  # bit for bit: the same arithmetic on the same inputs
        assert sorted(results) == sorted(full_results)
        assert all(torch.equal(results[n].keep, full_results[n].keep) for n in results)
        assert cache.stats()["blocks_reused"] - before == reused, name
        walked += LAYERS - reused
        assert cache.stats()["blocks_walked"] == walked


def test_kept_weights_are_not_the_models_so_changing_a_model_leaves_the_cache_as_it_was(workload, full_walks):
    cache = CalibrationCache()
    model, _ = _compressed(workload, FIRST, cache)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.zero_()
    again, _ = _compressed(workload, FIRST, cache)
    assert _same_weights(again, full_walks["first"][0])


def test_the_key_names_what_changes_the_weights_and_nothing_else():
    fp = {"model": "m", "calibration": "c", "options": (True, False, None)}
    name = "model.layers.0.mlp.up_proj"
    later = "model.layers.2.mlp.up_proj"
    base = prefix_key({name: Choice(0.5, 4, 32)}, "wanda", 1, **fp)
    assert base != prefix_key({name: Choice(0.5, 4, 32)}, "sparsegpt", 1, **fp)  # sparsity: the compressor counts
    assert base != prefix_key({name: Choice(0.5, 4, 64)}, "wanda", 1, **fp)
    assert prefix_key({name: Choice(0.0, 32, 32)}, "wanda", 1, **fp) == \
        prefix_key({name: Choice(0.0, 32, 128)}, "sparsegpt", 1, **fp)  # no bits, no sparsity: neither counts
    assert base == prefix_key({name: Choice(0.5, 4, 32), later: Choice(0.7, 3, 32)}, "wanda", 1, **fp)  # past end
    assert base != prefix_key({name: Choice(0.5, 4, 32)}, "wanda", 1, **{**fp, "calibration": "d"})
    assert band_ends(4, 2) == [2, 4] and band_ends(5, 5) == [1, 2, 3, 4, 5]


def test_the_cache_drops_the_least_recently_used_past_its_bytes():
    def entry(n):
        return PrefixEntry((torch.zeros(n),), {}, {})

    cache = CalibrationCache(max_bytes=4 * 100)
    cache.put("a", entry(40))
    cache.put("b", entry(40))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", entry(40))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    cache.put("big", entry(200))  # larger than the whole cache: not kept, nothing dropped for it
    assert cache.get("big") is None and cache.stats()["entries"] == 2
    assert cache.stats()["bytes"] == 2 * 40 * 4


def test_a_resumed_walk_needs_the_hidden_states_of_its_first_block(workload):
    model = workload.dense_model()
    with pytest.raises(ValueError, match="start_hidden"):
        calibrate_sequentially(model, [], {}, lambda n, m: None, lambda i, o, s: None, start=1)
