"""Compile in place: the user's own model gets the kernels and comes back itself (generate, config, hooks intact)."""

import copy

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.compile.inplace import SKIPPED
from sparta_explore.errors import ConfigError, PackageError
from sparta_explore.kernels.compiled_op import CompiledOp
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig


def _kernels_win(op, fns, x, runs):  # the choice is not under test here: the kernel candidate wins
    return {name: 2.0 if name == "dense" else 1.0 for name in fns}


@pytest.fixture
def config(device, cache_dir, monkeypatch):
    monkeypatch.setattr("sparta_explore.compile.choose._timed", _kernels_win)
    return CompileConfig(inplace=True, tune=False, runs=2, device=device, cache_dir=cache_dir, guard=False)


def _mlp_and_table():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval()
    kept = {i: torch.rand(model[i].weight.shape, generator=torch.Generator().manual_seed(i)) < 0.15 for i in (0, 2)}
    return model, se.TeSATable({f"{i}.weight": se.TeSA.from_mask(k) for i, k in kept.items()})


def test_a_plain_model_gets_its_kernels_in_place_and_keeps_its_hooks(config):
    model, table = _mlp_and_table()
    masked = se.masked_copy(model, table)
    seen = []
    model[2].register_forward_hook(lambda *a: seen.append("inner"))
    model.register_forward_hook(lambda *a: seen.append("outer"))
    x = torch.randn(40, 64)
    out = se.compile(model, table, (x,), config=config)
    assert out is model and isinstance(model[0], CompiledOp) and isinstance(model[2], CompiledOp)
    assert model.sparta_compiled.swapped == ("0", "2")
    with torch.no_grad():
        seen.clear()
        torch.testing.assert_close(model(x), masked(x), atol=1e-5, rtol=1e-4)
    assert seen == ["outer"]  # the model's own hook still fires; the replaced module's hook went with it
    text = model.sparta_compiled.summary()
    assert SKIPPED in text and "shrink" in text and model.sparta_compiled.checks["passed"].all()
    with pytest.raises(ConfigError, match="already holds compiled kernels"):
        se.compile(model, table, (x,), config=config)


def test_the_guard_puts_the_models_own_modules_back_when_kernels_are_slower(config, monkeypatch):
    model, table = _mlp_and_table()
    monkeypatch.setattr("sparta_explore.compile.inplace.alternating_ms", lambda graph, modules, runs: [1.0, 2.0])
    se.compile(model, table, (torch.randn(8, 64),), config=config.with_options(guard=True))
    assert isinstance(model[0], nn.Linear) and model.sparta_compiled.swapped == ()
    assert model.sparta_compiled.guard["runs"] == "model as given, masked"
    weight = model[0].weight.detach()
    assert torch.equal(weight, weight * table["0.weight"].kept)  # the model's own weights, masked in place


def test_a_plain_model_compiled_in_place_saves_and_loads_into_a_fresh_instance(config, tmp_path, cache_dir):
    model, table = _mlp_and_table()
    fresh = copy.deepcopy(model)
    x = torch.randn(16, 64)
    se.compile(model, table, (x,), config=config)
    path = se.save(model, tmp_path / "mlp.sparta")
    with pytest.raises(PackageError, match="pass a fresh instance"):
        se.load(path, cache_dir=cache_dir)
    loaded = se.load(path, model=fresh, cache_dir=cache_dir)
    assert loaded is fresh and isinstance(fresh[0], CompiledOp)
    assert loaded.sparta_compiled.record.loaded["bit_identical"]
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    with pytest.raises(PackageError, match="already holds compiled kernels"):
        se.load(path, model=model, cache_dir=cache_dir)
    with pytest.raises(PackageError, match="holds a torch.nn.modules.container.Sequential"):
        se.load(path, model=nn.Linear(2, 2), cache_dir=cache_dir)


def _prune_decoder(model, inputs, op_types=("Linear",)):
    graph = se.capture(model, inputs)
    names = tuple(n for n, m in model.named_modules() if type(m).__name__ in op_types and "lm_head" not in n)
    table = prune(model, BlockPruneConfig(0.75, (16, 16), op_names=names, op_types=op_types), pruner="block",
                  graph=graph)
    return graph, table


def _generative_models():
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=64))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                                                n_positions=64, bos_token_id=0, eos_token_id=0))
    return {"llama": (llama, ("Linear",)), "gpt2": (gpt2, ("Conv1D",))}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_causal_lm_compiled_in_place_generates_the_masked_models_tokens(name, config, tmp_path, cache_dir):
    torch.manual_seed(0)
    model, op_types = _generative_models()[name]
    model.eval()
    assert model.config.use_cache  # the default: generate keeps its KV cache
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    graph, table = _prune_decoder(model, {"input_ids": ids}, op_types)
    assert any("KV cache off" in n for n in graph.notes) and model.config.use_cache
    masked = se.masked_copy(model, table)
    se.compile(model, se.run_propagation(graph, table), {"input_ids": ids}, config=config)
    assert len(model.sparta_compiled.swapped) >= 8 and model.sparta_compiled.checks["passed"].all()
    assert "KV cache off" in model.sparta_compiled.summary()
    prompt = ids[:1, :6]
    with torch.no_grad():
        want = masked.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
        got = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert got.tolist() == want.tolist()
    loaded = se.load(se.save(model, tmp_path / f"{name}.sparta"), cache_dir=cache_dir)  # rebuilt from its config
    assert type(loaded) is type(model) and loaded is not model and loaded.config.use_cache
    with torch.no_grad():
        assert loaded.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0).tolist() == want.tolist()
