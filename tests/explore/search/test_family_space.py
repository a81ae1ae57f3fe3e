"""The family search space: built from any workload's layers, every point a trial can run."""

import random

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.search.family_space import FamilySpaceConfig, family_search_space
from sparta_explore.explore.trial.params import TrialParams


@pytest.mark.parametrize("workload,layers", [("digits-mlp", ["layers.0", "layers.1"]),
                                             ("digits-cnn", ["conv1", "conv2", "fc1"])])
def test_one_sparsity_key_per_prunable_layer_and_the_head_left_out(workload, layers):
    space = family_search_space(FamilySpaceConfig(workload=workload))
    assert sorted(k for k in space if k.startswith("sparsity@")) == [f"sparsity@{name}" for name in layers]
    assert space["pattern"]["_value"] == ["unstructured", "channel", "1x32", "32x32", "2:4"]
    assert space["precision"]["_value"] == ["fp32", "w8a8", "w4a8"]


def test_every_point_is_a_trial_that_validates():
    space = Space.from_nni(family_search_space(FamilySpaceConfig(workload="digits-mlp")))
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        p = TrialParams.from_dict({"workload": "digits-mlp", **space.sample(rng)})
        seen.add((p.pruner, p.bits, p.act_bits))
    # all five families and three precisions show up as distinct (pruner, bits, act_bits) settings
    assert {pruner for pruner, _, _ in seen} == {"level", "l1norm", "block", "nm"}
    assert {(bits, act) for _, bits, act in seen} == {(32, None), (8, None), (4, 8)}


def test_a_users_workload_file_gets_its_own_keys(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text(
        "from torch import nn\n"
        "from sparta_explore.workload import Workload\n"
        "model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))\n"
        "workload = Workload('mine', model, (), metric=lambda m: 0.0)\n")
    space = family_search_space(FamilySpaceConfig(workload=f"{source}:workload"))
    assert sorted(k for k in space if k.startswith("sparsity@")) == ["sparsity@0", "sparsity@2"]


@pytest.mark.parametrize("kwargs,match", [({"patterns": ()}, "patterns needs distinct values"),
                                          ({"precisions": ("fp32", "w2a2")}, "unknown precision 'w2a2'"),
                                          ({"sparsities": (0.5, 1.0)}, "sparsity must be in"),
                                          ({"workload": "no-such-model"}, "no-such-model")])
def test_bad_space_configs_name_the_key(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        FamilySpaceConfig(**kwargs)


def test_the_experiments_family_space_file_is_the_generated_one():
    # regenerate with:
    # sparta-explore space --families --out experiments/search_space_families.json
    from pathlib import Path

    from sparta_explore.explore.search.block_space import format_search_space

    path = Path(__file__).resolve().parents[3] / "experiments" / "search_space_families.json"
    assert path.read_text() == format_search_space(family_search_space(FamilySpaceConfig()))
