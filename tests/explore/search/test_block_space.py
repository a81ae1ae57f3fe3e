"""NNI search spaces: parsing, sampling, membership; the embedded default's space and its JSON file."""

import itertools
import json
import random
from pathlib import Path

import pytest
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.explore.search.block_space import (
    SEARCH_SPACE_FILE,
    BlockSpaceConfig,
    block_search_space,
    format_search_space,
)
from sparta_explore.explore.search.dimensions import Space, dimension
from sparta_explore.explore.search.layers import PrunableLayer, prunable_layers
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.zoo import build_model

ROOT = Path(__file__).resolve().parents[3]

MIXED = {
    "bits": {"_type": "choice", "_value": [32, 8, 4]},
    "n": {"_type": "randint", "_value": [2, 6]},
    "x": {"_type": "uniform", "_value": [0.5, 0.9]},
    "q": {"_type": "quniform", "_value": [0.0, 1.0, 0.25]},
    "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
    "ql": {"_type": "qloguniform", "_value": [1, 1000, 10]},
}


def test_samples_stay_in_every_kind_of_dimension():
    space = Space.from_nni(MIXED)
    rng = random.Random(0)
    for _ in range(200):
        p = space.sample(rng)
        assert space.contains(p), p
        assert p["q"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert isinstance(p["n"], int) and 2 <= p["n"] < 6


def test_membership_is_exact_about_keys_and_values():
    space = Space.from_nni(MIXED)
    good = {"bits": 8, "n": 5, "x": 0.6, "q": 0.5, "lr": 1e-3, "ql": 20}
    assert space.contains(good)
    assert space.contains({**good, "bits": 8.0})            # NNI's JSON may turn ints into floats
    assert not space.contains({**good, "bits": 16})
    assert not space.contains({**good, "n": 6})             # randint's upper bound is exclusive
    assert not space.contains({**good, "x": 0.95})
    assert not space.contains({k: v for k, v in good.items() if k != "lr"})
    assert not space.contains({**good, "extra": 1})


def test_canonical_keys_identify_points_across_json_round_trips():
    space = Space.from_nni({"b": {"_type": "choice", "_value": [[32, 32], [1, 32]]},
                            "s": {"_type": "choice", "_value": [0.5, 1]}})
    a = {"b": [32, 32], "s": 1}
    b = json.loads(json.dumps({"s": 1.0, "b": (32, 32)}))
    assert space.key_of(a) == space.key_of(b)
    assert space.key_of(a) != space.key_of({"b": [1, 32], "s": 1})
    assert space.size == 4


@pytest.mark.parametrize("entry, message", [
    ({"_type": "normal", "_value": [0, 1]}, "not supported"),
    ({"_type": "choice", "_value": [{"_name": "a"}]}, "nested"),
    ({"_type": "choice", "_value": []}, "at least one"),
    ({"_type": "uniform", "_value": [1, 0]}, "bad bounds"),
    ({"_type": "loguniform", "_value": [0, 1]}, "bad bounds"),
    ({"_value": [1]}, "needs '_type'"),
])
def test_bad_spaces_name_the_key(entry, message):
    with pytest.raises(ConfigError, match=message):
        Space.from_nni({"k": entry})


def test_categorical_index_and_unit_mapping():
    d = dimension("s", "choice", (0.5, 0.7, 0.9))
    assert d.index(0.7) == 1 and d.values == (0.5, 0.7, 0.9)
    with pytest.raises(ConfigError, match="no value"):
        d.index(0.8)
    lr = dimension("lr", "loguniform", (1e-4, 1e-2))
    assert lr.from_unit(lr.to_unit(3e-3)) == pytest.approx(3e-3)
    assert lr.from_unit(2.0) == pytest.approx(1e-2)  # clipped to the bounds


def test_prunable_layers_leave_out_the_classifier_head():
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.Linear(8 * 36, 16), nn.Linear(16, 10))
    assert prunable_layers(model) == [PrunableLayer("0", 8, 9), PrunableLayer("2", 16, 288)]


def test_default_space_has_only_blocks_that_tile_every_layer():
    layers = prunable_layers(build_model("digits-ffn"))
    assert [(la.rows, la.cols) for la in layers] == [(768, 64), (3072, 768), (768, 3072)]
    space = block_search_space(BlockSpaceConfig(blocks=("1x32", "32x32", "48x48", "64x64", "128x128")))
    # 48 does not divide the first layer's 64 inputs, 128 neither
    assert space["block"]["_value"] == ["1x32", "32x32", "64x64"]
    with pytest.raises(ConfigError, match="tiles every prunable layer"):
        block_search_space(BlockSpaceConfig(blocks=("48x48",)))


def test_every_point_of_the_default_space_is_a_valid_trial():
    space = block_search_space(BlockSpaceConfig(bits=(32, 8, 4), scopes=("layer", "global"), per_layer=False))
    assert set(space) == {"sparsity", "block", "bits", "scope"}
    keys = list(space)
    for combo in itertools.product(*(space[k]["_value"] for k in keys)):
        TrialParams.from_dict(dict(zip(keys, combo)))


def test_single_valued_keys_are_left_to_the_trial_and_bad_candidates_fail_early():
    space = block_search_space(BlockSpaceConfig(workload="digits-mlp", bits=(32,), scopes=("layer",), per_layer=False))
    assert set(space) == {"sparsity", "block"}
    with pytest.raises(ConfigError, match="sparsity"):
        BlockSpaceConfig(sparsities=(0.5, 1.0))
    with pytest.raises(ConfigError, match="repeats"):
        BlockSpaceConfig(bits=(8, 8))


def test_the_experiments_search_space_file_is_the_generated_one():
    # regenerate with: sparta-explore space --out experiments/search_space.json
    path = ROOT / SEARCH_SPACE_FILE
    assert path.read_text() == format_search_space(block_search_space())


def test_per_layer_space_has_one_sparsity_per_prunable_layer_and_every_point_runs():
    space = block_search_space(BlockSpaceConfig())
    assert set(space) == {"sparsity@layers.0", "sparsity@layers.1", "sparsity@layers.2", "block", "bits"}
    keys = list(space)
    for combo in itertools.product(*(space[k]["_value"] for k in keys)):
        p = TrialParams.from_dict(dict(zip(keys, combo)))
        assert [name for name, _ in p.layer_sparsity] == ["layers.0", "layers.1", "layers.2"]
    with pytest.raises(ConfigError, match="conflict"):
        BlockSpaceConfig(scopes=("layer", "global"))
