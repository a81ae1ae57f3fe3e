"""The LLM search space: flat NNI keys to per-linear choices and back, and one clear error per bad key."""

import random

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.llm.space import Choice, LLMPoint, group_of, search_space
from sparta_explore.explore.search.dimensions import Space


def test_groups_split_kinds_and_depth_bands():
    assert group_of("model.layers.0.self_attn.v_proj", 30, 3) == "attn.0"
    assert group_of("model.layers.9.mlp.gate_proj", 30, 3) == "mlp.0"
    assert group_of("model.layers.10.mlp.gate_proj", 30, 3) == "mlp.1"
    assert group_of("model.layers.29.self_attn.o_proj", 30, 3) == "attn.2"
    with pytest.raises(ConfigError, match="lm_head"):
        group_of("lm_head", 30, 3)


def test_a_point_assigns_each_linear_its_groups_choice():
    p = LLMPoint.from_dict({"sparsity@mlp.1": 0.5, "bits@mlp.1": 4, "group@mlp.1": 32, "bits@attn.0": 8},
                           layers=4, bands=2)
    a = p.assignment(4)
    assert len(a) == 4 * 7
    assert a["model.layers.3.mlp.down_proj"] == Choice(0.5, 4, 32)
    assert a["model.layers.2.mlp.up_proj"] == Choice(0.5, 4, 32)
    assert a["model.layers.1.mlp.up_proj"] == Choice()  # band 0 of the MLPs: not named, dense
    assert a["model.layers.1.self_attn.q_proj"] == Choice(0.0, 8, 128)
    assert a["model.layers.2.self_attn.q_proj"] == Choice()


def test_points_round_trip_and_key_by_what_they_change():
    p = LLMPoint.from_dict({"sparsity@attn.0": 0.3, "compressor": "sparsegpt", "act_bits": 32}, layers=2, bands=1)
    assert LLMPoint.from_dict(p.to_dict(), layers=2, bands=1) == p
    q = LLMPoint.from_dict({**p.to_dict(), "act_bits": 8}, layers=2, bands=1)
    assert q.key() != p.key() and q.compress_key() == p.compress_key()


def _random_point(rng, bands=2):
    params = {"compressor": rng.choice(["wanda", "sparsegpt"]), "head_bits": rng.choice([32, 8]),
              "act_bits": rng.choice([32, 8])}
    for g in ("attn.0", "attn.1", "mlp.0", "mlp.1")[:2 * bands]:
        params.update({f"sparsity@{g}": rng.choice([0.0, 0.0, 0.5]), f"bits@{g}": rng.choice([32, 32, 4]),
                       f"group@{g}": rng.choice([32, 64, 128])})
    return LLMPoint.from_dict(params, layers=4, bands=bands)


def test_canonical_points_keep_what_changes_the_model_and_drop_the_rest():
    rng = random.Random(0)
    for _ in range(200):
        p = _random_point(rng)
        c = p.canonical()
        assert c.canonical() == c and c.key() == p.key() and c.asked_key() == p.key()
        for name, choice in p.assignment(4).items():
            got = c.assignment(4)[name]
            assert (got.sparsity, got.bits) == (choice.sparsity, choice.bits)
            assert got.group == (choice.group if choice.bits < 32 else Choice().group)
        pruned = any(ch.sparsity > 0 for ch in p.groups.values())
        assert c.compressor == (p.compressor if pruned else "wanda")
        assert (c.head_bits, c.act_bits) == (p.head_bits, p.act_bits)
        assert LLMPoint.from_key(p.asked_key()) == p and LLMPoint.from_key(p.key()) == c
    as_given = LLMPoint.from_dict({"group@mlp.0": 32, "compressor": "sparsegpt"}, layers=2, bands=1)
    assert as_given.key() == LLMPoint.from_dict({}, layers=2, bands=1).key() != as_given.asked_key()
    four_bit = {"bits@mlp.0": 4, "group@mlp.0": 32}
    assert LLMPoint.from_dict(four_bit, layers=2, bands=1).key() != \
        LLMPoint.from_dict({**four_bit, "group@mlp.0": 64}, layers=2, bands=1).key()  # groups of bits count
    with pytest.raises(ConfigError, match="is not a point key"):
        LLMPoint.from_key('{"act_bits": 8}')


@pytest.mark.parametrize("params, match", [
    ({"sparsity@attn.7": 0.5}, "unknown key 'sparsity@attn.7'"),
    ({"bitz@mlp.0": 4}, "unknown key 'bitz@mlp.0'"),
    ({"heads": 1}, "unknown key 'heads'"),
    ({"bits@mlp.0": 5}, r"bits@mlp.0 must be one of \[32, 8, 4, 3\], got 5"),
    ({"compressor": "magnitude"}, "compressor must be one of"),
    ({"act_bits": True}, "act_bits must be one of"),
])
def test_bad_parameters_name_the_key(params, match):
    with pytest.raises(ConfigError, match=match):
        LLMPoint.from_dict(params, layers=6, bands=2)


def test_bands_must_fit_the_layers():
    with pytest.raises(ConfigError, match="bands must be in 1 .. 2"):
        LLMPoint.from_dict({}, layers=2, bands=3)


def test_the_nni_space_holds_every_point_it_names():
    space = search_space(2, sparsities=(0.0, 0.5), bits=(32, 4), groups=(32, 128))
    assert len(space) == 3 + 4 * 3
    parsed = Space.from_nni(space)
    rng = random.Random(0)
    for _ in range(20):
        params = parsed.sample(rng)
        p = LLMPoint.from_dict(params, layers=4, bands=2)
        assert parsed.contains(p.to_dict()) and p.to_dict() == params
    with pytest.raises(ConfigError, match="sparsity must be one of"):
        search_space(1, sparsities=(0.9,))
