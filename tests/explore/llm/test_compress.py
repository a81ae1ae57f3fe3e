"""One calibration pass per point: each linear's compression checked against the project's own compressors
(Wanda's pruner, GPTQ's quantizer) run on the same model, and on random weights."""

import copy

import pytest
import torch

import sparta_explore as se
from sparta_explore.explore.llm.compress import compress_linear, compress_llm
from sparta_explore.explore.llm.space import Choice, LLMPoint
from sparta_explore.kernels.packed_weights import recover_grid
from sparta_explore.pruners import WandaConfig, prune
from sparta_explore.quantizers import GPTQConfig, quantize
from sparta_explore.zoo.llm.workloads import tiny_llama

pytest.importorskip("transformers")


def _calib(n=4, seq=32):
    return torch.randint(0, 256, (n, seq), generator=torch.Generator().manual_seed(1))


def _on_grid(w, bits, group):
    """Every `group` columns of a row on one grid of 2^bits levels (what the decode step packs)."""
    return bits == 32 or recover_grid(w.detach(), bits, group) is not None


def test_wanda_masks_are_the_wanda_pruners():
    model, calib = tiny_llama(), _calib()
    names = tuple(f"model.layers.{i}.mlp.{p}" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj"))
    want = copy.deepcopy(model)
    se.apply_table(want, prune(want, WandaConfig(0.5, op_names=names, samples=None), pruner="wanda",
                               evaluator=calib))
    compress_llm(model, LLMPoint.from_dict({"sparsity@mlp.0": 0.5}, layers=2, bands=1), calib)
    for name in names:
        got, ref = model.get_submodule(name).weight, want.get_submodule(name).weight
        assert float(((got == 0) == (ref == 0)).float().mean()) > 0.999, name  # ties aside, the same mask
        kept = got != 0
        assert torch.equal(got[kept], ref[kept])  # Wanda updates nothing it keeps
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, want.model.layers[0].self_attn.q_proj.weight)


def test_gptq_groups_are_the_gptq_quantizers():
    model, calib = tiny_llama(), _calib()
    names = tuple(f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    want = copy.deepcopy(model)
    quantize(want, GPTQConfig(4, group_size=32, act_order=True, op_names=names, samples=None), "gptq",
             evaluator=calib)
    compress_llm(model, LLMPoint.from_dict({"bits@attn.0": 4, "group@attn.0": 32}, layers=2, bands=1), calib)
    for name in names:
        got, ref = model.get_submodule(name).weight, want.get_submodule(name).weight
        assert _on_grid(got, 4, 32), name
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compressor", ["wanda", "sparsegpt"])
def test_pruned_and_quantized_weights_keep_zeros_on_their_grids(compressor):
    model, calib = tiny_llama(), _calib()  # the zoo's: a tied head
    point = LLMPoint.from_dict({"sparsity@mlp.0": 0.5, "bits@mlp.0": 4, "group@mlp.0": 64, "bits@attn.0": 8,
                                "group@attn.0": 32, "head_bits": 4, "compressor": compressor}, layers=2, bands=1)
    results = compress_llm(model, point, calib)
    assert len(results) == 14
    for name, choice in point.assignment(2).items():
        w = model.get_submodule(name).weight
        assert _on_grid(w, choice.bits, choice.group), name
        if choice.sparsity:  # the mask's share (a kept weight may also round to 0)
            assert 1 - float(results[name].keep.float().mean()) == pytest.approx(0.5, abs=0.02), name
            assert bool((w[~results[name].keep] == 0).all())
    assert _on_grid(model.lm_head.weight, 4, 32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


def test_one_linear_on_random_values_with_ragged_groups_and_zero_rows():
    torch.manual_seed(0)
    w, x = torch.randn(6, 96), torch.randn(200, 96)
    w[2] = 0.0  # an all-zero row
    h = 2 * x.T @ x / len(x)
    for choice in (Choice(0.5, 32), Choice(0.5, 4, 64), Choice(0.0, 3, 64), Choice(0.3, 8, 32)):
        for compressor in ("wanda", "sparsegpt"):
            r = compress_linear(choice, compressor, w, h)
            assert torch.equal(r.weight[2], torch.zeros(96))
            assert torch.equal(r.weight[~r.keep], torch.zeros_like(r.weight[~r.keep]))
            if choice.bits < 32:
                assert _on_grid(r.weight, choice.bits, choice.group)  # 96 = 64 + a ragged 32
            # Wanda prunes its share of each row; SparseGPT's rows share the budget (the zero row counts)
            rows = [0, 1, 3, 4, 5] if compressor == "wanda" else list(range(6))
            pruned = 1 - float(r.keep[rows].float().mean())
            assert pruned == pytest.approx(choice.sparsity, abs=0.02)
    wanda = compress_linear(Choice(0.5, 32), "wanda", w, h)
    scores = w.abs() * h.diagonal().sqrt()
    for row in (0, 1, 3):
        kept = scores[row][wanda.keep[row]]
        assert float(kept.min()) >= float(scores[row][~wanda.keep[row]].max())
        assert torch.equal(wanda.weight[row][wanda.keep[row]], w[row][wanda.keep[row]])


def test_a_point_and_its_canonical_form_compress_alike():
    # parameters the canonical form drops (groups without bits, the compressor without pruning) change nothing
    calib = _calib()
    points = [{"bits@attn.0": 32, "group@attn.0": 32, "bits@mlp.0": 4, "group@mlp.0": 64, "compressor": "sparsegpt"},
              {"sparsity@mlp.0": 0.5, "bits@attn.0": 32, "group@attn.0": 32, "compressor": "sparsegpt"}]
    for params in points:
        point = LLMPoint.from_dict(params, layers=2, bands=1)
        assert point.canonical() != point
        got, want = tiny_llama(), tiny_llama()
        compress_llm(got, point, calib)
        compress_llm(want, point.canonical(), calib)
        for (name, a), b in zip(got.state_dict().items(), want.state_dict().values()):
            assert torch.equal(a, b), name
