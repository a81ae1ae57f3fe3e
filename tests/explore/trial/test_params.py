"""TrialParams: validation naming the key, NNI-style values, JSON round trip, stable keys."""

import json

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.params import TrialParams, format_block, parse_block


def test_defaults_are_the_embedded_default():
    p = TrialParams()
    assert (p.workload, p.pruner, p.block, p.bits, p.objective) == ("digits-ffn", "block", (32, 32), 32, "latency")


def test_json_round_trip_is_exact():
    p = TrialParams(workload="digits-mlp", sparsity=0.9, block=(1, 32), bits=4, calibrate=True, batch=128,
                    scope="global", objective="flops-mnas", target=0.3)
    again = TrialParams.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p and again.key == p.key and again.canonical_json() == p.canonical_json()


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="unknown trial parameter 'spasity'"):
        TrialParams.from_dict({"spasity": 0.5})
    with pytest.raises(ConfigError, match="'a', 'b'"):
        TrialParams.from_dict({"a": 1, "b": 2})


def test_nni_values_are_coerced():
    # NNI's quniform hands back 8.0; choice over [0, 1] gives ints for booleans
    p = TrialParams.from_dict({"bits": 8.0, "batch": 128.0, "calibrate": 1, "finetune_epochs": 2.0,
                               "block": [1, 32]})
    assert (p.bits, p.batch, p.calibrate, p.finetune_epochs, p.block) == (8, 128, True, 2, (1, 32))
    assert isinstance(p.bits, int) and isinstance(p.batch, int)


@pytest.mark.parametrize("values, match", [
    ({"sparsity": 1.0}, "sparsity must be in"),
    ({"sparsity": "high"}, "sparsity must be a number"),
    ({"bits": 8.5}, "bits must be an integer"),
    ({"bits": 16}, "bits must be 32"),
    ({"bits": 1}, "bits must be 32"),
    ({"scope": "model"}, "scope must be one of"),
    ({"block": "3y"}, "block must look like"),
    ({"block": [0, 32]}, "block sizes must be >= 1"),
    ({"block": [1, 2, 3]}, "block must be two sizes"),
    ({"batch": 0}, "batch must be >= 1"),
    ({"finetune_epochs": -1}, "finetune_epochs"),
    ({"calibrate": "yes"}, "calibrate must be true or false"),
    ({"calibrate_threshold": 1.5}, "calibrate_threshold"),
    ({"objective": "energy"}, "unknown objective 'energy'; choose one of latency, flops"),
    ({"target": 0}, "target must be a positive fraction"),
    ({"model": "alexnet"}, "unknown workload .alexnet.; built-in: digits-cnn"),
    ({"workload": "nope.py:"}, "must look like"),
    ({"workload": "bert-base"}, "unknown workload .bert-base."),
    ({"workload": "digits-mlp", "model": "digits-cnn"}, "both workload"),
    ({"pruner": ""}, "pruner must be a non-empty string"),
])
def test_bad_values_name_the_key(values, match):
    with pytest.raises(ConfigError, match=match):
        TrialParams.from_dict(values)


def test_key_depends_on_every_field_and_only_on_values():
    base = TrialParams()
    assert TrialParams.from_dict({"block": "32x32", "bits": 32.0}).key == base.key
    changed = {base.replace(**{k: v}).key for k, v in [("sparsity", 0.6), ("bits", 8), ("seed", 1),
                                                          ("block", None), ("objective", "flops"), ("batch", 64)]}
    assert base.key not in changed and len(changed) == 6


def test_canonical_json_sorts_keys():
    keys = list(json.loads(TrialParams().canonical_json()))
    assert keys == sorted(keys)


def test_block_helpers():
    assert parse_block("64X32") == (64, 32) and parse_block((1, 1)) == (1, 1) and parse_block(None) is None
    assert format_block((32, 64)) == "32x64" and format_block(None) == ""


def test_from_dict_rejects_non_mappings():
    with pytest.raises(ConfigError, match="must be a dict"):
        TrialParams.from_dict([("sparsity", 0.5)])


def test_explore_import_is_lean():
    # the NNI trial entry imports this package first; NNI, matplotlib and the kernels load only when used
    import subprocess
    import sys

    code = "import sparta_explore.explore, sys; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(out.split())
    assert not {m for m in loaded if m.split(".")[0] in ("nni", "matplotlib", "sklearn")}
    assert not {"sparta_explore.pruners", "sparta_explore.kernels", "sparta_explore.compile.pipeline"} & loaded


def test_per_layer_sparsities_fold_flat_keys_and_round_trip():
    p = TrialParams.from_dict({"sparsity": 0.5, "sparsity@layers.1": 0.9, "sparsity@layers.0": 0.6})
    assert p.layer_sparsity == (("layers.0", 0.6), ("layers.1", 0.9))
    assert p.sparsity_of("layers.1") == 0.9 and p.sparsity_of("layers.2") == 0.5
    assert TrialParams.from_dict(p.to_dict()) == p and TrialParams.from_dict(json.loads(p.canonical_json())) == p
    assert p.key != TrialParams(sparsity=0.5).key
    with pytest.raises(ConfigError, match="sparsity@layers.0"):
        TrialParams.from_dict({"sparsity@layers.0": 1.2})
