"""digits-ffn, the exploration default: BERT-base FFN weight shapes, trained on the digits."""

import pytest
import torch
from torch import nn

from sparta_explore.zoo import build_model, evaluate, example_inputs, get_spec, pretrained


def test_digits_ffn_has_bert_ffn_shapes():
    model = build_model("digits-ffn")
    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear)]
    assert shapes == [(768, 64), (3072, 768), (768, 3072), (10, 768)]
    spec = get_spec("digits-ffn")
    assert spec.task == "digits" and spec.default_batch == 256
    (x,) = example_inputs("digits-ffn")
    assert model(x).shape == (256, 10)


@pytest.mark.slow
def test_digits_ffn_trains_to_95_percent(tmp_path, digits):
    model, acc = pretrained("digits-ffn", cache_dir=tmp_path, data=digits)  # ~40 s on two cores
    assert acc >= 0.95
    assert evaluate(model, digits.test_x, digits.test_y) == acc
    assert torch.isfinite(next(model.parameters())).all()
