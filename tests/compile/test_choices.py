"""CompileConfig.choices: a trial's recorded kernels are built again without timing the other candidates."""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.errors import ConfigError


def test_given_choices_are_built_alone_and_an_unknown_one_falls_back_to_timing(device, cache_dir):
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32)).eval()
    table = se.TeSATable({f"{i}.weight": se.TeSA.from_mask(torch.rand(model[i].weight.shape) < 0.1) for i in (0, 2)})
    x = torch.randn(32, 64)
    cm = se.compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, runs=2, guard=False,
                    choices="_0:dense;_2:no-such-kernel")
    first, second = cm.plan.ops["_0"], cm.plan.ops["_2"]
    assert first.chosen == "dense" and set(first.measured_ms) == {"dense"} and "choice given: dense" in first.notes
    assert "not a candidate here" in " ".join(second.notes) and len(second.measured_ms) == len(second.candidates)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), se.masked_copy(model, table)(x), atol=1e-5, rtol=1e-4)


def test_choices_are_pairs_a_mapping_or_a_rows_text():
    want = (("fc1", "sparse"), ("fc2", "int8"))
    assert CompileConfig(choices="fc1:sparse;fc2:int8").choices == want
    assert CompileConfig(choices={"fc1": "sparse", "fc2": "int8"}).choices == want
    assert CompileConfig(choices=[("fc1", "sparse"), ("fc2", "int8")]).choices == want
    with pytest.raises(ConfigError, match="CompileConfig.choices"):
        CompileConfig(choices=[1, 2, 3])
