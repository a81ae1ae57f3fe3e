"""Pattern and precision keys: one search choice sets the TrialParams fields that belong together."""

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.trial.families import PATTERNS, PRECISIONS, expand_aliases, pattern_of, precision_of
from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.quantizers import QuantRequest, get_quantizer


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_every_pattern_makes_valid_params_and_names_itself_back(pattern):
    p = TrialParams.from_dict({"workload": "digits-mlp", "pattern": pattern, "sparsity": 0.5})
    assert pattern_of({"pruner": p.pruner, "block": p.block}) == pattern


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_every_precision_makes_valid_params_and_names_itself_back(precision):
    p = TrialParams.from_dict({"precision": precision})
    assert precision_of(p.bits, p.act_bits) == precision


def test_two_four_fixes_every_layer_at_half_and_drops_per_layer_sparsities():
    p = TrialParams.from_dict({"pattern": "2:4", "sparsity@layers.0": 0.9, "sparsity@layers.1": 0.7})
    assert (p.pruner, p.block, p.sparsity, p.layer_sparsity) == ("nm", (1, 4), 0.5, ())


def test_block_pattern_keeps_per_layer_sparsities():
    p = TrialParams.from_dict({"pattern": "32x32", "sparsity@layers.0": 0.9})
    assert p.sparsity_of("layers.0") == 0.9 and p.block == (32, 32) and p.pruner == "block"


def test_a_clash_between_an_alias_and_an_explicit_field_names_both():
    with pytest.raises(ConfigError, match="pattern 'unstructured' sets pruner='level', but pruner='block'"):
        expand_aliases({"pattern": "unstructured", "pruner": "block"})
    with pytest.raises(ConfigError, match="precision 'w4a8' sets bits=4, but bits=8"):
        expand_aliases({"precision": "w4a8", "bits": 8})


def test_unknown_alias_values_are_named_with_the_choices():
    with pytest.raises(ConfigError, match=r"unknown pattern '4:8'; choose from unstructured, channel"):
        TrialParams.from_dict({"pattern": "4:8"})
    with pytest.raises(ConfigError, match="unknown precision 'int4'"):
        TrialParams.from_dict({"precision": "int4"})


def test_act_bits_equal_to_bits_is_one_point_and_old_keys_stay():
    assert TrialParams(bits=8, act_bits=8) == TrialParams(bits=8)
    assert "act_bits" not in TrialParams(bits=8).canonical_json()  # rows stored before the field keep their key
    assert '"act_bits":32' in TrialParams(bits=4, act_bits=32).canonical_json()
    assert TrialParams.from_dict(TrialParams(bits=4, act_bits=8).to_dict()).act_bits == 8


@pytest.mark.parametrize("bits,act_bits", [(32, 8), (8, 16), (8, 1)])
def test_bad_act_bits_are_refused(bits, act_bits):
    with pytest.raises(ConfigError, match="act_bits"):
        TrialParams(bits=bits, act_bits=act_bits)


@pytest.mark.parametrize("quantizer", ["uniform", "ptq"])
def test_weight_only_requests_leave_inputs_alone(quantizer):
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 8))
    (config,) = get_quantizer(quantizer).configs_for(QuantRequest(4, ("0",), act_bits=32), model)
    assert tuple(config.targets) == ("weight",) and config.weight_bits == 4
    (both,) = get_quantizer(quantizer).configs_for(QuantRequest(4, ("0",), act_bits=8), model)
    assert "_input_" in both.targets and both.activation_bits == 8
