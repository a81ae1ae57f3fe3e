"""Uniform quantizer and the mapping of activation targets to graph tensors."""

import pytest
import torch
from torch import nn

from sparta_explore import NumberFormat, capture
from sparta_explore.errors import ConfigError
from sparta_explore.quantizers import UniformQuantConfig, quantize
from sparta_explore.zoo import build_model, example_inputs


def test_inputs_and_outputs_map_to_the_right_nodes():
    model = build_model("digits-cnn")
    graph = capture(model, example_inputs("digits-cnn", batch=2))
    cfg = UniformQuantConfig(weight_bits=4, activation_bits=8, targets=("weight", "_input_", "_output_"),
                             op_names=("fc1",))
    table = quantize(model, cfg, "uniform", graph=graph)
    assert table["fc1.weight"].kept_bits() == [4] and table["fc1.weight"].formats() == {NumberFormat.INT}
    assert table["flatten"].kept_bits() == [8] and table["flatten"].shape == (1, 512)  # fc1's input
    assert table["fc1"].kept_bits() == [8] and table["fc1"].formats() == {NumberFormat.UINT}
    assert table["conv1.weight"].kept_bits() == [32]


def test_reused_module_quantizes_every_call():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(self.fc(x))

    table = quantize(Twice(), UniformQuantConfig(targets=("_output_",)), "uniform", example_inputs=torch.randn(2, 4))
    assert table["fc"].kept_bits() == [8] and table["fc_1"].kept_bits() == [8]


@pytest.mark.parametrize("bad", [{"weight_bits": 33}, {"activation_fmt": "posit"}, {"targets": ("scale",)}])
def test_bad_uniform_configs(bad):
    with pytest.raises(Exception) as info:
        UniformQuantConfig(**bad)
    assert isinstance(info.value, (ConfigError, ValueError))
