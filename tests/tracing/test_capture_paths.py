"""Capture what users have: plain modules (fx), GraphModules as they are, torch.export programs, Hugging Face."""

import pytest
import torch
import torch.fx as fx
from torch import nn

import sparta_explore as se
from sparta_explore.errors import CaptureError
from sparta_explore.plan.sites import IN_OUT, weight_sites

transformers = pytest.importorskip("transformers")


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    intermediate_size=128, vocab_size=500)).eval()


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)).eval()
    model.config.use_cache = False
    return model


def _bert_inputs(batch=2, seq=16):
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq // 2:] = 0
    return {"input_ids": torch.randint(0, 500, (batch, seq), generator=g), "attention_mask": mask}


def test_hugging_face_bert_is_exported_with_its_linears_visible():
    model, inputs = _tiny_bert(), _bert_inputs()
    graph = se.capture(model, inputs)
    assert graph.method == "export" and graph.inputs == ["input_ids", "attention_mask"]
    linears = [n.target for n in graph.nodes() if n.op == "call_module"
               and isinstance(graph.module.get_submodule(n.target), nn.Linear)]
    assert "bert.encoder.layer.0.attention.self.query" in linears and len(linears) == 2 * 6 + 2
    with torch.no_grad():
        assert torch.equal(graph.run().logits, model(**inputs).logits)
        other = _bert_inputs(batch=3, seq=24)  # exported with dynamic batch and sequence
        assert torch.allclose(graph.module(**other).logits, model(**other).logits, atol=1e-6)
    assert graph.tensors["bert.encoder.layer.0.intermediate.dense.weight"].shape == (128, 64)


def test_gpt2_conv1d_is_a_transposed_linear_site():
    model = _tiny_gpt2()
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    graph = se.capture(model, ids)
    sites = {s.weight: s for s in weight_sites(graph)}
    c_fc = sites["transformer.h.0.mlp.c_fc.weight"]
    assert c_fc.layout == IN_OUT and c_fc.kind == "linear"
    assert c_fc.weight_2d(model.transformer.h[0].mlp.c_fc.weight).shape == (256, 64)
    with torch.no_grad():
        assert torch.equal(graph.run().logits, model(ids).logits)


def test_torch_nn_attention_is_exported_by_auto_and_kept_whole_by_fx():
    model = nn.Sequential(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)).eval()
    x = torch.randn(2, 6, 32)
    auto, fx_graph = se.capture(model, x), se.capture(model, x, method="fx")
    assert auto.method == "export" and fx_graph.method == "fx"
    assert {s.weight for s in weight_sites(auto)} == {"0.self_attn.in_proj_weight", "0.self_attn.out_proj.weight",
                                                      "0.linear1.weight", "0.linear2.weight"}
    assert [n.op for n in fx_graph.nodes()] == ["call_module"]  # one opaque leaf under fx
    with torch.no_grad():
        assert torch.allclose(auto.run(), model(x), atol=1e-6)


def test_an_existing_graph_module_is_used_as_it_is():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    gm = fx.symbolic_trace(model)
    graph = se.capture(gm, torch.randn(2, 4))
    assert graph.module is gm and graph.method == "graph_module"
    assert graph.tensors["0.weight"].shape == (3, 4)


def test_an_exported_program_is_taken_and_normalized():
    model = nn.Sequential(nn.Linear(4, 3), nn.GELU())
    x = torch.randn(2, 4)
    program = torch.export.export(model, (x,))
    graph = se.capture(program, x)
    targets = {n.target for n in graph.nodes()}
    assert torch.nn.functional.linear in targets and torch.nn.functional.gelu in targets
    assert [s.weight for s in weight_sites(graph)] == ["0.weight"]
    with torch.no_grad():
        assert torch.allclose(graph.run(), model(x))


def test_exported_modules_are_never_put_in_eval_mode():
    model, inputs = _tiny_bert(), _bert_inputs()
    model.train()
    graph = se.capture(model, inputs)
    assert model.training  # the user's mode is restored
    result = se.run_propagation(graph, se.TeSATable())  # the self-check runs the exported module
    assert result.check.passed


def test_keyword_inputs_and_defaults_bind_to_placeholders():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, scale: float = 2.0):
            return self.fc(x) * scale

    graph = se.capture(Masked(), {"x": torch.randn(3, 4)})
    assert graph.method == "fx" and len(graph.example_inputs) == 2 and graph.example_inputs[1] == 2.0
    with pytest.raises(CaptureError, match=r"forward\(x, scale\) does not accept the example inputs"):
        se.capture(Masked(), {"y": torch.randn(3, 4)})


def test_untraceable_models_get_one_error_with_both_reasons():
    class DataDependent(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # fx cannot trace it, and export cannot either without torch.cond
                return x * 2
            return x

    with pytest.raises(CaptureError) as info:
        se.capture(DataDependent(), torch.randn(3))
    message = str(info.value)
    assert "cannot trace" in message and "torch.export" in message and "Fix:" in message
    with pytest.raises(CaptureError, match="method must be one of"):
        se.capture(DataDependent(), torch.randn(3), method="jit")
