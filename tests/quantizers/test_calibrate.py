"""calibrate: greedy bit lowering under an accuracy budget, with pruning kept and every step logged."""

import copy

import pytest
import torch
from torch import nn

from sparta_explore.errors import ConfigError, TeSANameError
from sparta_explore.graph import capture
from sparta_explore.quantizers import CalibrationConfig, FakeQuantOp, calibrate, calibrate_bits, fake_quant_model
from sparta_explore.tesa import TeSA

FAST = {"steps": 3, "progress": False}


pytestmark = pytest.mark.usefixtures("one_thread")


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def _ops(model):
    return [m for m in model.modules() if isinstance(m, FakeQuantOp)]


X = torch.randn(64, 12, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kwargs,key", [({"bits": (16, 12)}, "bits"), ({"bits": (8, 8)}, "bits"),
                                        ({"bits": ()}, "bits"), ({"threshold": -0.01}, "threshold"),
                                        ({"threshold": float("nan")}, "threshold"), ({"steps": -1}, "steps"),
                                        ({"min_clip": 0.0}, "min_clip"), ({"exclude": "0.weight"}, "exclude")])
def test_bad_config_is_one_error_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"CalibrationConfig.{key}"):
        CalibrationConfig(**kwargs)


def test_bad_names_and_inputs_are_named():
    model = _mlp()
    with pytest.raises(TeSANameError, match="'2.wieght'.*did you mean '2.weight'"):
        calibrate(model, None, X, lambda m: 1.0, CalibrationConfig(exclude=("2.wieght",), **FAST))
    with pytest.raises(TeSANameError, match="'fc9.weight'"):
        calibrate(model, {"fc9.weight": TeSA.dense((2, 2))}, X, lambda m: 1.0, CalibrationConfig(**FAST))
    with pytest.raises(ConfigError, match="calib_data"):
        calibrate(model, None, "images", lambda m: 1.0)
    with pytest.raises(ConfigError, match="eval_fn"):
        calibrate(model, None, X, 0.9)


def test_a_rung_that_costs_too_much_is_restored_and_logged():
    def eval_fn(m):  # any op below 8 bits "breaks" the model
        return 1.0 if all(o.weight_bits >= 8 and o.act_bits >= 8 for o in _ops(m)) else 0.5

    r = calibrate(_mlp(), None, X, eval_fn, CalibrationConfig(**FAST))
    assert r.assignment() == {"0.weight": 8, "input_1": 8, "2.weight": 8, "_1": 8, "4.weight": 8, "_3": 8}
    rejected = [s for s in r.log if not s.accepted and s.bits != s.from_bits]
    assert [(s.tensor, s.from_bits, s.bits) for s in rejected] == [
        ("0.weight", 8, 4), ("input_1", 8, 4), ("2.weight", 8, 4), ("_1", 8, 4), ("4.weight", 8, 4), ("_3", 8, 4)]
    assert all(s.drop == 0.5 for s in rejected)
    assert all((o.weight_bits, o.act_bits) == (8, 8) for o in _ops(r.model))  # restored after each rejection
    assert r.accuracy_before == r.accuracy_after == 1.0


def test_greedy_topological_lowering_spends_exactly_the_budget():
    def eval_fn(m):  # every tensor at 4 bits costs 0.004 accuracy
        return 1.0 - 0.004 * sum((o.weight_bits == 4) + (o.act_bits == 4) for o in _ops(m))

    r = calibrate(_mlp(), None, X, eval_fn, CalibrationConfig(threshold=0.01, **FAST))
    # visited in topological order: the first two tensors take 4 bits, the third would drop 0.012 > 0.01
    assert list(r.assignment().items()) == [("0.weight", 4), ("input_1", 4), ("2.weight", 8), ("_1", 8),
                                            ("4.weight", 8), ("_3", 8)]
    assert r.accuracy_before - r.accuracy_after == pytest.approx(0.008)
    assert all(s.drop <= 0.01 for s in r.log if s.accepted)


def test_pruned_stays_pruned_and_quantizer_bits_are_the_start():
    model = _mlp()
    mask = torch.rand(16, 12, generator=torch.Generator().manual_seed(3)) > 0.5
    bias_mask = torch.arange(16) % 2 == 0
    table = {"0.weight": TeSA.from_mask(mask, bits=8, fmt="int"), "0.bias": TeSA.from_mask(bias_mask)}
    r = calibrate(model, table, X, lambda m: 1.0, CalibrationConfig(tune_weights=True, round_steps=10, **FAST))
    out = r.table["0.weight"]
    assert torch.equal(out.pruned, ~mask) and out.kept_bits() == [4]
    assert torch.equal(r.table["0.bias"].pruned, ~bias_mask)
    assert [(s.from_bits, s.bits) for s in r.log if s.tensor == "0.weight"] == [(8, 4)]  # 8 came from the table
    assert bool((r.weights["0.weight"][~mask] == 0).all()) and bool((r.weights["0.bias"][~bias_mask] == 0).all())
    assert torch.equal(model[0].weight, _mlp()[0].weight)  # calibrate leaves the model alone


def test_activations_are_lowered_only_where_an_int8_kernel_reads_them():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 8)
            self.c = nn.Linear(8, 2)

        def forward(self, x):
            h = torch.flatten(torch.relu(self.conv(x)), 1)
            return self.c(self.a(h) + self.b(h))

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(32, 1, 4, 4)
    r = calibrate(net, None, x, lambda m: 1.0, CalibrationConfig(exclude=("c.weight",), **FAST))
    notes = {s.tensor: s.note for s in r.log if s.bits == s.from_bits}
    assert notes["x"].startswith("not lowered: conv inputs run in fp32")
    assert notes["c.weight"] == "excluded"
    assert notes["add"].startswith("not lowered: every linear reading it keeps fp32 weights")
    assert r.assignment()["flatten"] == 4 and r.assignment()["add"] == 32
    a, b, c = (r.model.get_submodule(n) for n in ("a", "b", "c"))
    assert a.act_bits == b.act_bits == 4 and a.runs_int8 and b.runs_int8  # one activation, both readers
    assert not c.runs_int8 and c.weight_bits == 32


def test_table_and_written_weights_reproduce_the_calibrated_model():
    model = _mlp()
    x_val = torch.randn(200, 12, generator=torch.Generator().manual_seed(5))
    labels = model(x_val).argmax(1)
    eval_fn = lambda m: float((m(x_val).argmax(1) == labels).float().mean())  # noqa: E731
    result = calibrate(copy.deepcopy(model), None, X, eval_fn, CalibrationConfig(bits=(8, 4, 3), progress=False))
    table = calibrate_bits(model, None, X, eval_fn, bits=(8, 4, 3), progress=False)
    assert table.equals(result.table)
    # compiling (model, table) means: the kernels' numerics on the weights now stored in `model`
    rebuilt, _ = fake_quant_model(capture(model, X), table, model)
    with torch.no_grad():
        assert torch.allclose(rebuilt(x_val), result.model(x_val), atol=1e-6)
    assert eval_fn(rebuilt) == result.accuracy_after

    untouched = _mlp()
    state = copy.deepcopy(untouched.state_dict())
    calibrate_bits(untouched, None, X, eval_fn, update_weights=False, progress=False)
    assert all(torch.equal(v, untouched.state_dict()[k]) for k, v in state.items())


def test_starting_over_budget_warns_and_log_and_progress_are_reported(capsys):
    model = _mlp()
    table = {"0.weight": TeSA.dense((16, 12), bits=2)}
    with pytest.warns(UserWarning, match="already drop accuracy"):
        r = calibrate(model, table, X, lambda m: 0.5 if any(o.weight_bits == 2 for o in _ops(m)) else 1.0,
                      CalibrationConfig(steps=3, progress=True))
    assert "calibrate" in capsys.readouterr().err  # the tqdm bar over ops
    assert r.accuracy_start == 0.5 and not any(s.accepted and s.bits <= 8 for s in r.log)
    frame = r.log_frame()
    assert list(frame.columns[:5]) == ["tensor", "op", "kind", "from_bits", "bits"]
    assert len(frame) == len(r.log) and r.seconds > 0


def test_a_workload_metric_to_minimize_steers_calibration_the_right_way():
    from sparta_explore.quantizers import calibrate_workload
    from sparta_explore.workload import Workload

    model = _mlp()
    target = model(X).detach()

    def loss(m):  # mean squared distance from the fp32 model's outputs, + 1 so it stays a positive cost
        with torch.no_grad():
            return 1.0 + float(((m(X) - target) ** 2).mean())

    def workload(threshold_loss):
        return Workload("regression", model, (X,), metric=threshold_loss, metric_name="loss",
                        higher_is_better=False, validation_metric=threshold_loss, calibration_inputs=(X,))

    # any lowering raises the loss: under a near-zero threshold none is kept (read as "higher is better",
    # every rise would look like a gain and all of them would be kept)
    strict = calibrate_workload(copy.deepcopy(model), None, workload(loss),
                                CalibrationConfig(bits=(8, 4), threshold=1e-9, **FAST))
    assert set(strict.assignment().values()) == {32}
    loose = calibrate_workload(copy.deepcopy(model), None, workload(loss),
                               CalibrationConfig(bits=(8, 4), threshold=0.5, **FAST))
    assert min(loose.assignment().values()) < 32
