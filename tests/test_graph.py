"""capture: shapes of every tensor, names that match a TeSATable, and clear failures."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparta_explore import CaptureError, TeSATable, capture
from sparta_explore.zoo import build_model, example_inputs, model_names


@pytest.mark.parametrize("name", [n for n in model_names() if n != "bert-base"])
def test_every_zoo_model_captures_with_all_shapes(name):
    model = build_model(name)
    inputs = example_inputs(name, batch=2)
    g = capture(model, inputs)
    params = dict(model.named_parameters())
    for pname, p in params.items():
        assert g.tensors[pname].shape == tuple(p.shape) and g.tensors[pname].kind == "param"
    out = model(*inputs)
    assert g.tensors[g.outputs[0]].shape == tuple(out.shape)
    assert all(g.tensors[n.name].kind == "activation" for n in g.nodes()
               if n.name in g.tensors)
    TeSATable.dense_for(g.shapes())  # every name/shape is valid for a bound table


def test_bert_base_shapes():
    g = capture(build_model("bert-base"), example_inputs("bert-base", batch=1))
    assert g.tensors["layers.0.ffn.fc1.weight"].shape == (3072, 768)
    fc1 = g.module_nodes("layers.0.ffn.fc1")[0]
    assert g.tensors[fc1.name].shape == (1, 128, 3072)
    assert g.params_of(fc1) == {"weight": "layers.0.ffn.fc1.weight", "bias": "layers.0.ffn.fc1.bias"}


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _DataDependent()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x))


def test_untraceable_module_error_names_it_and_suggests_leaf():
    with pytest.raises(CaptureError) as info:
        capture(_Outer(), torch.randn(2, 4))
    msg = str(info.value)
    assert "'block'" in msg and "_DataDependent" in msg and "leaf_modules" in msg
    assert "x.sum() > 0" in msg  # the user's failing line
    assert info.value.__suppress_context__  # no raw fx traceback chained


def test_leaf_modules_fix_the_trace():
    for leaf in (_DataDependent, "block"):
        g = capture(_Outer(), torch.randn(2, 4), leaf_modules=[leaf])
        assert [n.target for n in g.nodes()] == ["block", "head"]


def test_unknown_leaf_name_is_an_error():
    with pytest.raises(CaptureError, match="nope"):
        capture(_Outer(), torch.randn(2, 4), leaf_modules=["nope"])


def test_wrong_example_inputs_name_the_failing_node():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with pytest.raises(CaptureError, match=r"node '_0'.*mat1 and mat2"):
        capture(model, torch.randn(2, 5))
    with pytest.raises(CaptureError, match=r"Sequential.forward\(input\) does not accept the example inputs"):
        capture(model, (torch.randn(2, 4), torch.randn(2, 4)))
    with pytest.raises(CaptureError, match="a tensor, a tuple of inputs or a dict"):
        capture(model, "x")


class _Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))
        self.emb = nn.Linear(4, 4)
        self.tied = nn.Linear(4, 4)
        self.tied.weight = self.emb.weight

    def forward(self, x):
        return F.linear(self.tied(self.emb(x)), self.weight)


def test_get_attr_parameters_map_to_fqn_and_tied_weights_alias():
    g = capture(_Functional(), torch.randn(2, 4))
    attr = [n for n in g.fx_graph.nodes if n.op == "get_attr"]
    assert [g.tensor_name(n) for n in attr] == ["weight"]
    assert g.canonical("tied.weight") == "emb.weight"
    assert "tied.weight" in g.tensors and g.tensors["tied.weight"].shape == (4, 4)


def test_capture_restores_training_mode():
    model = build_model("digits-cnn").train()
    capture(model, example_inputs("digits-cnn", batch=2))
    assert model.training


def test_summary_lists_tensors():
    g = capture(nn.Sequential(nn.Linear(4, 3)), torch.randn(2, 4))
    df = g.summary()
    assert set(df["kind"]) == {"param", "activation"}
    assert df.set_index("name").loc["0.weight", "shape"] == "3x4"


class _ReadsAValue(nn.Module):
    """A forward whose shape depends on a value: fake tensors cannot run it."""

    def forward(self, x):
        n = int((x > 0).sum())
        return x.flatten()[:n] * 2


@pytest.mark.parametrize("name", ["digits-cnn", "bert-tiny"])
def test_rewritten_graphs_record_the_shapes_a_real_run_does(name):
    from sparta_explore.graph import _describe, rewritten

    g = capture(build_model(name).eval(), example_inputs(name))
    describe = dict(source=g.module, flat=g.example_inputs, call_args=g.call_args, call_kwargs=g.call_kwargs,
                    method=g.method)
    fake = _describe(g.module, g.module, fake=True, **describe)
    real = _describe(g.module, g.module, **describe)
    assert fake.tensors == real.tensors and fake.constants == real.constants
    assert fake.tuple_shapes == real.tuple_shapes
    same = rewritten(g, g.module)  # nothing rewritten: every node stands in for itself
    assert same.tensors == real.tensors and same.constants == real.constants


class _Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.reads = _ReadsAValue()


def test_a_forward_fake_tensors_cannot_run_is_described_by_a_real_run():
    from sparta_explore.graph import _fake_run, rewritten

    fx_graph = torch.fx.Graph()
    fx_graph.output(fx_graph.call_module("reads", (fx_graph.placeholder("x"),)))
    gm = torch.fx.GraphModule(_Holder(), fx_graph)
    x = torch.tensor([1.0, -1.0, 2.0, 3.0])
    assert _fake_run(gm, (x,)) is None
    described = rewritten(capture(nn.Identity(), (x,)), gm)
    assert described.tensors["reads"].shape == (3,)  # three positive values: only a real run knows


class _TwoInputs(nn.Module):
    def forward(self, x, y):
        return x.sum() + y.sum()


@pytest.mark.parametrize("x, y, batch", [
    (torch.randn(3, 4), torch.randn(3, 2), 3),
    (torch.randn(1, 4), torch.randn(1, 2), None),  # one item is the example
    (torch.randn(3, 4), torch.randn(2, 2), None),  # no shared batch size
])
def test_first_item_cuts_every_input_to_its_first_item_where_they_share_a_batch(x, y, batch):
    graph = capture(_TwoInputs(), (x, y))
    first = graph.first_item()
    if batch is None:
        assert first is None
    else:
        assert first[0] == batch
        assert torch.equal(first[1][0], x[:1]) and torch.equal(first[1][1], y[:1])
        assert graph.run_first_item(torch.fx.Interpreter(graph.module)) == batch
