"""The trusted reference: the captured graph masked with the table, weights on their grids, inputs of int8 sites
rounded by `InputGrid` modules (on random values, against the arithmetic written out); and the time its call
spends rounding, which the guard takes out to get a dense call."""

import time

import torch
import torch.nn.functional as F
from torch import nn

import sparta_explore as se
from sparta_explore.compile.table_reference import InputGrid, table_reference
from sparta_explore.compile.verify import ModelOutputs
from sparta_explore.fake_quant import fake_quantize_rows


class ConvThenLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 5 * 5, 7)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_int8_sites_read_their_input_rounded_and_the_weights_sit_on_their_grids():
    torch.manual_seed(0)
    model, x = ConvThenLinear().eval(), torch.randn(3, 3, 5, 5)
    g = se.capture(model, (x,))
    conv_in, fc_in = g.inputs[0], next(n.name for n in g.nodes() if n.op == "call_method" and n.target == "flatten")
    kept = torch.rand(7, 100) > 0.5
    table = {"conv.weight": se.TeSA.dense((4, 3, 3, 3), bits=4), "fc.weight": se.TeSA.from_mask(kept, bits=8),
             conv_in: se.TeSA.dense((1, 3, 5, 5), bits=8), fc_in: se.TeSA.dense((1, 100), bits=6)}
    ref, unread = table_reference(g, table)
    assert not unread and sum(isinstance(m, InputGrid) for m in ref.modules()) == 2
    w_conv = fake_quantize_rows(model.conv.weight.detach().reshape(4, -1), 4).reshape(4, 3, 3, 3)
    x_q = fake_quantize_rows(x.reshape(3, -1), 8).reshape(x.shape)  # one grid per image
    h = torch.relu(F.conv2d(x_q, w_conv, model.conv.bias, padding=1)).flatten(1)
    want = F.linear(fake_quantize_rows(h, 6), fake_quantize_rows(model.fc.weight.detach() * kept, 8), model.fc.bias)
    with torch.no_grad():
        assert torch.allclose(g.run(ref), want, atol=1e-5)
        assert torch.equal(model.fc.weight, g.module.fc.weight)  # the user's model and the captured graph untouched


def test_without_int8_inputs_the_reference_has_no_input_grids():
    model = ConvThenLinear().eval()
    g = se.capture(model, (torch.randn(2, 3, 5, 5),))
    ref, _ = table_reference(g, {"fc.weight": se.TeSA.dense((7, 100), bits=8)})
    assert not any(isinstance(m, InputGrid) for m in ref.modules())


class SlowGrid(InputGrid):
    def forward(self, x):
        time.sleep(0.05)
        return super().forward(x)


def test_dense_seconds_take_the_rounding_out_of_a_reference_call():
    model = ConvThenLinear().eval()
    g = se.capture(model, (torch.randn(2, 3, 5, 5),))
    ref, _ = table_reference(g, {"conv.weight": se.TeSA.dense((4, 3, 3, 3), bits=8),
                                 g.inputs[0]: se.TeSA.dense((1, 3, 5, 5), bits=8)})
    name = next(n for n, m in ref.named_modules() if isinstance(m, InputGrid))
    grid = ref.get_submodule(name)
    slow = SlowGrid(grid.bits, grid.per_image)
    parent, child = name.rsplit(".", 1)
    setattr(ref.get_submodule(parent), child, slow)
    outputs = ModelOutputs(g)
    outputs.of(ref)
    assert outputs.seconds(ref) >= 0.05 and outputs.dense_seconds(ref) < outputs.seconds(ref) - 0.04
    plain = se.masked_copy(model, {})
    outputs.of(plain)
    assert outputs.dense_seconds(plain) == outputs.seconds(plain)
    assert outputs.dense_seconds(nn.Identity()) is None


def test_a_reference_like_another_takes_the_tensors_both_tables_mark_alike_and_computes_its_own_table():
    torch.manual_seed(1)
    model, x = ConvThenLinear().eval(), torch.randn(3, 3, 5, 5)
    g = se.capture(model, (x,))
    kept = torch.rand(7, 100) > 0.5
    further = kept & (torch.rand(7, 100) > 0.3)
    conv = se.TeSA.from_mask(torch.rand(4, 3, 3, 3) > 0.4, bits=8)
    table = {"conv.weight": conv, "fc.weight": se.TeSA.from_mask(further, bits=8),
             g.inputs[0]: se.TeSA.dense((1, 3, 5, 5), bits=8)}
    given = {"conv.weight": se.TeSA(conv.bits.clone()), "fc.weight": se.TeSA.from_mask(kept, bits=8),
             g.inputs[0]: se.TeSA.dense((1, 3, 5, 5), bits=8)}
    other, _ = table_reference(g, table, share=True)
    before = {n: t.clone() for n, t in other.state_dict().items()}
    ref, _ = table_reference(g, given, share=True, like=(other, table))
    alone, _ = table_reference(g, given)
    assert ref.get_parameter("conv.weight") is other.get_parameter("conv.weight")  # marked alike: taken
    assert ref.get_parameter("fc.weight") is not other.get_parameter("fc.weight")
    assert all(torch.equal(before[n], t) for n, t in other.state_dict().items())  # nothing edited in place
    with torch.no_grad():
        assert torch.equal(g.run(ref), g.run(alone))
        assert not torch.equal(g.run(ref), g.run(other))
