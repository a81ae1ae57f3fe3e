"""compile() on the rough edges a new user hits: a table that prunes nothing, a Linear called twice, HF models."""

import warnings

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import CompileWarning, compile
from sparta_explore.plan.execution_plan import REPORT_COLUMNS
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig


def test_a_table_that_prunes_nothing_says_so_and_its_report_keeps_its_columns(device, cache_dir):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(4, 8)
    table = se.TeSATable({n: se.TeSA.dense(tuple(p.shape)) for n, p in model.named_parameters()})
    with pytest.warns(CompileWarning, match="nothing in the table is pruned or quantized"):
        cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, runs=1)
    assert list(cm.report.columns) == list(REPORT_COLUMNS) and len(cm.report) == 0
    assert cm.report[["op", "choice", "meas_ms"]].empty  # no KeyError
    assert "no pruned or quantized weighted ops" in cm.summary()
    with torch.no_grad():
        assert torch.allclose(cm(x), model(x))


def test_a_pruned_table_gives_no_nothing_to_compile_warning(device, cache_dir):
    model = nn.Sequential(nn.Linear(8, 16)).eval()
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(torch.arange(128).reshape(16, 8) % 2 == 0)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile(model, table, (torch.randn(4, 8),), device=device, cache_dir=cache_dir, tune=False, runs=1)
    assert not any("nothing in the table" in str(w.message) for w in caught)


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.fc(x)))


def test_a_linear_called_twice_is_reported_as_its_own_module_left_as_is(device, cache_dir):
    torch.manual_seed(0)
    model, x = _Twice().eval(), torch.randn(16, 64)
    graph = se.capture(model, (x,))
    table = prune(model, BlockPruneConfig(0.5, (1, 1), op_names=("fc",)), pruner="block", graph=graph)
    cm = compile(graph, se.run_propagation(graph, table), device=device, cache_dir=cache_dir, tune=False, runs=1)
    rows = cm.report.set_index("op")
    assert set(rows.index) == {"fc", "fc_1"}
    for op, row in rows.iterrows():
        # choice, parts, fusion, times and note tell one story: the op's own module ran, as it is
        assert row["choice"] == "original" and row["parts"] == "the op's own module, masked", op
        assert row["fused"] == "none" and "left as is" in row["notes"], op
        assert row[["meas_ms", "dense_ms"]].isna().all(), op
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-5)


def test_compiling_a_hugging_face_model_prints_no_leafspec_future_warning(device, cache_dir):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                           intermediate_size=64, vocab_size=100)).eval()
    inputs = {"input_ids": torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0)),
              "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    kept = torch.rand(64, 32, generator=torch.Generator().manual_seed(0)) > 0.7
    table = se.TeSATable({"encoder.layer.0.intermediate.dense.weight": se.TeSA.from_mask(kept)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = se.capture(model, inputs, method="export")  # the path whose modules hold pytree specs
        cm = compile(graph, se.run_propagation(graph, table), device=device, cache_dir=cache_dir, tune=False,
                     runs=1)
        reference = se.masked_copy(graph.module, table)
    leaf_spec = [w for w in caught if issubclass(w.category, FutureWarning) and "LeafSpec" in str(w.message)]
    assert not leaf_spec, f"{len(leaf_spec)} LeafSpec FutureWarnings, e.g. {leaf_spec[0].message}"
    with torch.no_grad():
        got, want = graph.run(cm), graph.run(reference)
    assert torch.allclose(got.last_hidden_state, want.last_hidden_state, atol=1e-5)
