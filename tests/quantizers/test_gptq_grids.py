"""Per-group grids are a TeSA fact: GPTQ's table says so, the plan and the compile's reference keep GPTQ's values."""

import copy

import pytest
import torch

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.errors import TeSABitsError
from sparta_explore.fake_quant import fake_quantize_rows
from sparta_explore.pruners import SparseGPTConfig, prune
from sparta_explore.quantizers import GPTQConfig, quantize
from sparta_explore.tesa import NumberFormat

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

Q_PROJ = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("group_size, group", [(32, 32), (48, 48), (None, 64)])
def test_the_table_carries_each_weights_grid_size_and_format(tiny_llama, calib_ids, group_size, group, tmp_path):
    model = tiny_llama()
    table = quantize(model, GPTQConfig(bits=4, group_size=group_size, samples=8), "gptq", evaluator=calib_ids)
    tesa = table[f"{Q_PROJ}.weight"]
    assert (tesa.group, tesa.kept_bits(), tesa.formats()) == (group, [4], {NumberFormat.UINT})
    assert table["model.embed_tokens.weight"].group == 0  # not quantized: no grid
    loaded = se.TeSATable.load(table.save(tmp_path / "table.npz"))
    assert loaded[f"{Q_PROJ}.weight"].group == group and loaded.equals(table)


def test_a_group_weight_is_its_own_reference_and_the_original_weights_are_refused(tiny_llama, calib_ids):
    dense = tiny_llama()
    model = copy.deepcopy(dense)
    table = quantize(model, GPTQConfig(bits=3, group_size=32, samples=8), "gptq", evaluator=calib_ids)
    masked = se.masked_copy(model, table)
    assert all(torch.equal(a, b) for a, b in zip(masked.parameters(), model.parameters()))
    with pytest.raises(TeSABitsError, match=r"'model\.layers\.0\.self_attn\.q_proj\.weight': the table puts it on "
                                            r"3-bit grids of 32 values.*pass the model the compressor updated"):
        se.masked_copy(dense, table)


def test_compiled_pruned_and_quantized_model_computes_what_the_compressors_produced(tiny_llama, calib_ids, device,
                                                                                     cache_dir, monkeypatch):
    monkeypatch.setattr("sparta_explore.compile.choose._timed",
                        lambda op, fns, x, runs: {n: 2.0 if n == "dense" else 1.0 for n in fns})
    model = tiny_llama()
    pruned = prune(model, SparseGPTConfig(0.5, samples=8), pruner="sparsegpt", evaluator=calib_ids)
    table = pruned.merge(quantize(model, GPTQConfig(bits=4, group_size=32, samples=8), "gptq", evaluator=calib_ids))
    compressed = copy.deepcopy(model)
    weight = model.get_submodule(Q_PROJ).weight.detach().clone()
    assert not torch.equal(fake_quantize_rows(weight, 4), weight)  # a per-row grid would change GPTQ's values
    inputs = {"input_ids": calib_ids[:2]}
    config = CompileConfig(inplace=True, tune=False, runs=2, device=device, cache_dir=cache_dir, guard=False)
    se.compile(model, se.run_propagation(se.capture(model, inputs), table), inputs, config=config)
    report = model.sparta_compiled
    assert Q_PROJ in report.swapped and report.checks["passed"].all()
    assert "4-bit weights on grids of 32 run as their fp32 values" in report.summary()
    with torch.no_grad():
        torch.testing.assert_close(model(calib_ids[2:6]).logits, compressed(calib_ids[2:6]).logits,
                                   atol=1e-4, rtol=1e-4)
