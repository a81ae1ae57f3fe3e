"""compile() on models users have: Hugging Face BERT and GPT-2, torch.nn attention; checked against their masks."""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.errors import ConfigError, TeSANameError
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig

transformers = pytest.importorskip("transformers")


def _logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def _pipeline(model, inputs, config, device, cache_dir):
    graph = se.capture(model, inputs)
    table = prune(model, config, pruner="block", graph=graph)
    result = se.run_propagation(graph, table)
    cm = se.compile(graph, result, device=device, cache_dir=cache_dir, tune=False)
    with torch.no_grad():
        got, want = _logits(graph.run(cm)), _logits(graph.run(se.masked_copy(model, table)))
    return graph, table, result, cm, got, want


@pytest.mark.parametrize("on_item", [False, True])
def test_hugging_face_bert_is_captured_pruned_propagated_compiled_and_verified(on_item, device, cache_dir,
                                                                              monkeypatch):
    """`on_item`: checked as a large model is, its masked references on the last item (keyword inputs cut too)."""
    from transformers import BertConfig, BertForSequenceClassification

    from sparta_explore.compile import pipeline

    if on_item:
        monkeypatch.setattr(pipeline, "ITEM_CHECK_SECONDS", 0.0)

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                     intermediate_size=256, vocab_size=500)).eval()
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[1, 20:] = 0
    inputs = {"input_ids": torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(0)),
              "attention_mask": mask}
    config = BlockPruneConfig(0.75, (16, 16), exclude_op_names=("classifier",))
    graph, table, result, cm, got, want = _pipeline(model, inputs, config, device, cache_dir)
    assert result.check.passed and cm.checks["passed"].all(), cm.checks
    assert set(cm.checks["check"]) >= {"ops", "table", "input table"}  # + the guard's pick, when not the kernels
    run = cm.checks[cm.checks["on"] != "not run"]
    assert set(run["on"]) == ({"item 2 of 2"} if on_item else {"whole example"}), cm.checks
    planned = set(cm.report["op"])
    assert {"bert_encoder_layer_0_attention_self_query", "bert_encoder_layer_1_output_dense"} <= planned
    assert (cm.report["choice"] != "dense").any()
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_gpt2_conv1d_layers_are_pruned_in_their_gemm_layout_and_compiled(device, cache_dir):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)).eval()
    model.config.use_cache = False
    ids = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(0))
    config = BlockPruneConfig(0.75, (1, 32), op_types=("Conv1D",))
    graph, table, result, cm, got, want = _pipeline(model, ids, config, device, cache_dir)
    # 1x32 blocks are rows of the (out, in) view: in the stored (in, out) weight they run down columns
    kept = table["transformer.h.0.mlp.c_fc.weight"].kept
    assert kept.shape == (64, 256) and se.TeSA.from_mask(kept.t()).block_density((1, 32)) == pytest.approx(0.25)
    assert cm.checks["passed"].all(), cm.checks
    assert any(op.site.layout == "in_out" for op in cm.plan.ops.values())
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_mha_projections_are_planned_as_functional_linears(device, cache_dir):
    model = nn.Sequential(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)).eval()
    x = torch.randn(2, 32, 64)
    graph = se.capture(model, x)
    kept = torch.rand(192, 64, generator=torch.Generator().manual_seed(0)) > 0.8
    table = se.TeSATable({"0.self_attn.in_proj_weight": se.TeSA.from_mask(kept)})
    cm = se.compile(graph, se.run_propagation(graph, table), device=device, cache_dir=cache_dir, tune=False)
    op = next(o for o in cm.plan.ops.values() if o.weight == "0.self_attn.in_proj_weight")
    assert op.target == "" and op.site.kind == "linear"
    assert cm.checks["passed"].all()
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-5)


def test_compile_takes_the_graph_and_never_traces_again(device, cache_dir, monkeypatch):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    graph = se.capture(model, torch.randn(8, 16))
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(torch.rand(32, 16) > 0.5)})
    monkeypatch.setattr("sparta_explore.compile.pipeline.capture", lambda *a, **k: pytest.fail("compile traced again"))
    cm = se.compile(graph, table, config=CompileConfig(device=device, cache_dir=cache_dir, tune=False))
    assert cm.checks["passed"].all()


def test_parameters_the_forward_never_reads_are_skipped_with_a_note(device, cache_dir):
    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(16, 8)
            self.pooler = nn.Linear(8, 8)  # like BERT's pooler when the head does not use it

        def forward(self, x):
            return self.used(x)

    model = WithUnused().eval()
    table = se.TeSATable({"used.weight": se.TeSA.from_mask(torch.rand(8, 16) > 0.5),
                          "pooler.weight": se.TeSA.from_mask(torch.rand(8, 8) > 0.5)})
    cm = se.compile(model, table, torch.randn(4, 16), device=device, cache_dir=cache_dir, tune=False)
    assert cm.unread == ["pooler.weight"]
    assert any("never reads" in note for op in cm.plan.ops.values() for note in op.notes)
    with pytest.raises(TeSANameError, match="nothere.weight"):
        se.compile(model, {"nothere.weight": se.TeSA.dense((8, 8))}, torch.randn(4, 16), device=device,
                   cache_dir=cache_dir)


def test_compile_returns_its_own_measured_plan(device, cache_dir):
    model = nn.Sequential(nn.Linear(16, 32)).eval()
    graph = se.capture(model, torch.randn(8, 16))
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(torch.rand(32, 16) > 0.5)})
    given = se.plan(graph, table, device)
    cm = se.compile(graph, table, plan=given, device=device, cache_dir=cache_dir, tune=False)
    assert all(op.chosen is None and not op.measured_ms for op in given.ops.values())  # untouched
    assert all(op.chosen is not None and op.measured_ms for op in cm.plan.ops.values())


def test_compile_options_are_one_checked_config():
    with pytest.raises(ConfigError, match="unknown compile option"):
        CompileConfig().with_options(tunee=False)
    with pytest.raises(ConfigError, match="unknown families"):
        CompileConfig(kernels={"dense", "magic"})
    assert CompileConfig(kernels={"shrink"}).kernels == frozenset({"dense", "shrink"})
    with pytest.raises(ConfigError, match="runs"):
        CompileConfig(runs=0)


def test_a_table_check_failure_runs_the_masked_model_instead(device, cache_dir, monkeypatch):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    x = torch.randn(8, 16)
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(torch.rand(32, 16) > 0.5)})
    wrong = se.TeSATable({"0.weight": se.TeSA.from_mask(torch.rand(32, 16) > 0.5)})
    result = se.run_propagation(se.capture(model, x), table)
    result.table = wrong  # an unsound table claiming to come from `table`
    with pytest.warns(se.compile.CompileWarning, match="input table"):
        cm = se.compile(model, result, x, device=device, cache_dir=cache_dir, tune=False)
    assert not cm.checks.set_index("check").loc["input table", "passed"]
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-6)  # the trusted reference runs
