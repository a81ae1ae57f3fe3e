"""Workloads: the user's model, data and metric, loaded by reference and explored end to end; bad ones named."""

import dataclasses
import textwrap

import pytest
import torch
from torch import nn

from sparta_explore.cli import main
from sparta_explore.errors import ConfigError
from sparta_explore.explore.sweep import sweep
from sparta_explore.workload import Workload, builtin_workloads, load_workload

USER_WORKLOAD = '''
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore.workload import Workload

g = torch.Generator().manual_seed(0)
X = torch.randn(256, 32, generator=g)
Y = (X[:, :4].sum(dim=1) > 0).long()  # a task a small MLP learns


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.out = nn.Linear(64, 2)

    def forward(self, x):
        return self.out(self.body(x))


def build():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        F.cross_entropy(model(X[:192]), Y[:192]).backward()
        opt.step()
    return model.eval()


def accuracy(model, x, y):
    return float((model(x).argmax(1) == y).float().mean())


workload = Workload(
    name="user-mlp", model=build, inputs=(X[:8],),
    metric=lambda m: accuracy(m, X[192:], Y[192:]), metric_name="accuracy",
    latency_inputs=lambda batch: (X[:batch],), default_batch=64,
    train_batches=lambda: [(X[i:i + 32], Y[i:i + 32]) for i in range(0, 192, 32)],
    loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
    validation_metric=lambda m: accuracy(m, X[128:192], Y[128:192]))


def broken_metric():
    return Workload("broken", build, (X[:8],), metric=lambda m: "high")
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_workload.py"
    path.write_text(textwrap.dedent(USER_WORKLOAD))
    return path


def test_a_user_workload_is_swept_end_to_end(user_file, tmp_path, cache_dir, device):
    ref = f"{user_file}:workload"
    grid = {"workload": ref, "pattern": [{"pruner": "block", "block": "1x32"}, {"pruner": "l1norm", "block": None}],
            "sparsity": [0.5], "bits": [32, 8], "batch": 64}
    df = sweep(grid, tmp_path / "sweep", progress=False,
               trial_kwargs={"cache_dir": cache_dir, "runs": 3, "compile_kwargs": {"device": device, "tune": False}})
    assert len(df) == 4 and set(df["workload"]) == {ref} and set(df["metric_name"]) == {"accuracy"}
    assert (df["dense_accuracy"] > 0.8).all() and (df["accuracy"] > 0.5).all()
    assert (df["latency_ms"] > 0).all() and (df["max_error"] <= 2e-2).all()
    assert (df["flops_ratio"] < 1).all()  # the body was pruned; the head "out" stayed dense
    blocked = df[df["pruner"] == "block"].iloc[0]
    assert 0.3 < blocked["sparsity_pruned"] < 0.5


def test_the_cli_sweeps_a_user_workload_and_checks_it_first(user_file, tmp_path, cache_dir, capsys):
    out = tmp_path / "cli"
    argv = ["sweep", "--workload", f"{user_file}:workload", "--sparsity", "0.5", "--block", "1x32", "--bits", "32",
            "--finetune-epochs", "0", "--runs", "3", "--quick-profile", "--cache-dir", str(cache_dir),
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert "user_mlp" not in capsys.readouterr().err
    assert (out / "results.csv").exists() and (out / "report.md").exists()
    assert main([*argv[:2], f"{user_file}:nothing", *argv[3:]]) == 2
    assert "has no attribute 'nothing'" in capsys.readouterr().err


@pytest.mark.parametrize("ref, match", [
    ("missing/file.py:workload", "workload file 'missing/file.py' does not exist"),
    ("{user}:nope", "has no attribute 'nope'"),
    ("{user}:broken_metric", None),
    ("{bad}:workload", "does not import: ZeroDivisionError"),
    ("no_such_module_xyz:workload", "workload module 'no_such_module_xyz' does not import"),
    ("{user}:X", "is a Tensor, not a Workload"),
    ("alexnet", "unknown workload 'alexnet'"),
    ("file.py:", "must look like"),
])
def test_bad_workload_references_are_one_clear_error(user_file, tmp_path, ref, match):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1 / 0\n")
    ref = ref.format(user=user_file, bad=bad)
    if match is None:  # it loads; its metric is what is wrong, and says so when used
        workload = load_workload(ref)
        with pytest.raises(ConfigError, match="metric returned 'high' \\(str\\), not a finite number"):
            workload.evaluate(workload.dense_model())
        return
    with pytest.raises(ConfigError, match=match):
        load_workload(ref)


def test_builtin_digits_workloads_and_defaults():
    assert {"digits-ffn", "digits-cnn", "digits-mlp"} <= set(builtin_workloads())
    w = load_workload("digits-mlp")
    assert w.metric_name == "accuracy" and w.default_batch == 64 and w.can_train
    assert w.prunable_modules() == ("layers.0", "layers.1")  # the head stays dense
    plain = Workload("plain", nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), (torch.randn(2, 4),), lambda m: 1.0)
    assert plain.prunable_modules() == ("0",) and not plain.can_train
    with pytest.raises(ConfigError, match="cannot be fine-tuned"):
        plain.train(plain.fresh_model(), 1)
    with pytest.raises(ConfigError, match="prunable names \\['nope'\\]"):
        Workload("p", nn.Linear(2, 2), (), lambda m: 1.0, prunable=("nope",)).prunable_modules()
    with pytest.raises(ConfigError, match="train_batches and loss go together"):
        Workload("p", nn.Linear(2, 2), (), lambda m: 1.0, loss=lambda m, b: 0)


def test_wrong_prunable_names_are_found_before_the_model_is_built():
    built = []

    def architecture():
        return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))

    def build():  # stands for a builder that trains
        built.append(1)
        return architecture()

    w = Workload("p", build, (), lambda m: 1.0, prunable=("0", "nope"), architecture=architecture)
    with pytest.raises(ConfigError, match="prunable names \\['nope'\\]"):
        w.dense_model()
    assert not built  # checked on the architecture: the builder never ran
    plain = Workload("p", build, (), lambda m: 1.0, prunable=("nope",))
    with pytest.raises(ConfigError, match="prunable names \\['nope'\\]"):
        plain.dense_model()  # no architecture: checked as soon as the model is built, before any other work


def test_a_digits_workload_with_a_wrong_prunable_name_fails_before_training(monkeypatch, tmp_path):
    # regression: the typo used to cost the digits model's training (38 s) before the ConfigError
    import sparta_explore.zoo.training as training
    from sparta_explore.zoo import digits_workload

    def no_training(*args, **kwargs):
        raise AssertionError("the model was trained before its prunable names were checked")

    monkeypatch.setattr(training, "pretrained", no_training)
    w = dataclasses.replace(digits_workload("digits-mlp", cache_dir=tmp_path), prunable=("layers.0", "layer.1"))
    with pytest.raises(ConfigError, match="prunable names \\['layer.1'\\]"):
        w.dense_model()
