"""ActivationCache: each op's calibration data from partial inference; op calls grow linearly with depth."""

import pytest
import torch
import torch.nn.functional as F

from sparta_explore.errors import TeSANameError
from sparta_explore.graph import capture
from sparta_explore.quantizers import CalibrationConfig, calibrate
from sparta_explore.quantizers.activation_cache import ActivationCache
from sparta_explore.quantizers.calibrate_tune import CLIP_GRID
from sparta_explore.quantizers.fake_quant_model import fake_quant_model, reference_model
from sparta_explore.tesa import TeSA
from sparta_explore.zoo import DigitsMLP

pytestmark = pytest.mark.usefixtures("one_thread")


def _mlp_graph(depth, x):
    model = DigitsMLP(hidden=(24,) * (depth - 1)).eval()
    return model, capture(model, x)


def test_targets_are_fp32_outputs_and_inputs_come_from_the_quantized_model():
    x = torch.rand(16, 1, 8, 8)
    model, graph = _mlp_graph(3, x)
    table = {"layers.0.weight": TeSA.dense((24, 64), bits=2)}  # only the first layer is quantized
    reference = reference_model(graph, model, {})
    current, ops = fake_quant_model(graph, table, model)
    cache = ActivationCache(reference, current, (x,))

    first = cache.at("layers_0")
    assert torch.equal(first.input, x.flatten(1)) and torch.equal(first.reference_input, x.flatten(1))
    assert torch.allclose(first.target, model.layers[0](x.flatten(1)), atol=1e-6)

    second = cache.at("layers_1")
    h_fp32 = torch.relu(model.layers[0](x.flatten(1)))
    with torch.no_grad():
        h_quant = torch.relu(ops["layers_0"](x.flatten(1)))
    assert torch.allclose(second.reference_input, h_fp32, atol=1e-6)
    assert torch.allclose(second.input, h_quant, atol=1e-6)  # upstream quantization is what the op sees
    assert not torch.allclose(second.input, second.reference_input, atol=1e-3)
    assert torch.allclose(second.target, model.layers[1](h_fp32), atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(cache.finish(), current(x), atol=1e-6)


def test_each_node_runs_once_and_ops_must_come_in_order():
    x = torch.rand(4, 1, 8, 8)
    model, graph = _mlp_graph(4, x)
    gm = reference_model(graph, model, {})
    cache = ActivationCache(gm, gm, (x,))
    for name in ("layers_0", "layers_1", "layers_2", "head"):
        cache.at(name)
    cache.finish()
    op_nodes = sum(1 for _ in graph.nodes())
    assert cache.node_runs == {"reference": op_nodes, "current": op_nodes}
    with pytest.raises(ValueError, match="topological order"):
        cache.at("layers_1")
    with pytest.raises(TeSANameError, match="nope"):
        cache.at("nope")


def test_operator_forward_calls_grow_linearly_with_depth(monkeypatch):
    calls = {"n": 0}
    real_linear = F.linear

    def counting_linear(*args, **kwargs):
        calls["n"] += 1
        return real_linear(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", counting_linear)
    x = torch.rand(32, 1, 8, 8)
    counts = {}
    config = CalibrationConfig(steps=3, progress=False)
    for depth in (2, 4, 8):
        model, graph = _mlp_graph(depth, x)
        calls["n"] = 0
        # eval_fn never runs the model, so every counted call is calibration's own: cache, MSEs, tuning
        result = calibrate(model, None, x, lambda m: 1.0, config, graph=graph)
        assert all(b == 4 for b in result.assignment().values())  # every op did the same work
        counts[depth] = calls["n"]
    per_op = counts[4] - counts[2]
    assert per_op > 0
    assert counts[8] - counts[4] == 2 * per_op  # constant cost per added pair of ops: linear, not quadratic
    # and the constant is small: per op, 6 trials (3 rungs for the weight, 3 for the input) of at most
    # MSE before + clip grid + Adam steps + MSE after, plus one reference and one current run in the cache
    assert per_op / 2 <= 6 * (1 + CLIP_GRID + config.steps + 2) + 2
