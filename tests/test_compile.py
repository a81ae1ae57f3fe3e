"""compile(): kernels chosen by measured time, verified against the masked (fake-quantized) model."""

import warnings

import pytest
import torch
from plan.test_planner import Net
from torch import nn

import sparta_explore as se
from sparta_explore.compile import CompileWarning, compile
from sparta_explore.compile.lowering import LowerContext, lower
from sparta_explore.fake_quant import quantized_conv2d, quantized_linear
from sparta_explore.kernels import KernelBuildError
from sparta_explore.zoo import build_model, example_inputs


def block_table(model, graph, sparsity, block):
    from sparta_explore.pruners import prune
    from sparta_explore.pruners.block import BlockPruneConfig

    return prune(model, BlockPruneConfig(sparsity=sparsity, block=block), pruner="block", graph=graph)


@pytest.mark.parametrize("block", [(32, 32), (1, 32), (1, 1)])
def test_compiled_mlp_matches_the_masked_model(device, cache_dir, block):
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    table = se.propagate(g, block_table(model, g, 0.8, block))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False)
    want = se.masked_copy(model, table)(x)
    assert torch.allclose(cm(x), want, atol=1e-4, rtol=1e-4)
    assert cm(torch.randn(5, 64)).shape == (5, 10)  # other batch sizes run too
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "compile must not touch the model"
    report = cm.report
    assert set(report.op) == set(cm.plan.ops)
    for op in cm.plan.ops.values():
        assert op.chosen in op.measured_ms and "dense" in op.measured_ms
        assert op.measured_ms[op.chosen] == min(op.measured_ms.values())
    assert cm.max_error < 1e-3


def test_the_compiled_model_holds_no_tensor_of_the_users_model(device, cache_dir):
    # the working copy shares the trusted reference's masked tensors, never the captured model's own
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    table = se.propagate(g, block_table(model, g, 0.8, (1, 1)))
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, guard=False)
    want = cm(x)
    users = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), *g.module.parameters())}
    compiled = {t.untyped_storage().data_ptr() for t in (*cm.parameters(), *cm.buffers())}
    assert compiled and not users & compiled
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the user trains on: the compiled model does not move
    assert torch.equal(cm(x), want)


@pytest.mark.parametrize("further", [False, True], ids=["table", "pruned further"])
def test_a_reference_handed_out_holds_no_tensor_of_the_users_model(device, cache_dir, monkeypatch, further):
    # the references share the tensors the table leaves alone with the user's model while compile reads them
    from sparta_explore.compile import pipeline

    torch.manual_seed(0)
    model, x = Net(), torch.randn(33, 64)
    g = se.capture(model, (x,))
    fc2 = torch.rand(64, 96) < 0.5
    if further:
        fc2[:, :40] = False  # columns nobody reads: propagation prunes fc1's rows, the input table is what counts
    table = {"fc1.weight": se.TeSA.from_mask(torch.rand(96, 64) < 0.5), "fc2.weight": se.TeSA.from_mask(fc2)}
    real = pipeline.verified_module

    def check_failed(graph, gm, execution, compiled, references, *args, **kwargs):
        _, rows = real(graph, gm, execution, compiled, references, *args, **kwargs)
        return references[0][1], rows

    monkeypatch.setattr(pipeline, "verified_module", check_failed)
    cm = compile(g, se.run_propagation(g, table), device=device, cache_dir=cache_dir, tune=False, runs=1)
    want = se.masked_copy(model, table)(x)
    assert torch.allclose(cm(x), want, atol=1e-5)
    users = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), *g.module.parameters())}
    handed = {t.untyped_storage().data_ptr() for t in (*cm.parameters(), *cm.buffers())}
    assert handed and not users & handed
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert torch.allclose(cm(x), want, atol=1e-5)



def test_int8_weights_and_inputs_run_on_the_fake_quantized_grid(device, cache_dir):
    if 8 not in device.bits:
        pytest.skip("no int8 kernels on this machine")
    model = nn.Sequential(nn.Linear(64, 48))
    x = torch.randn(20, 64)
    g = se.capture(model, (x,))
    table = se.TeSATable({"0.weight": se.TeSA.dense((48, 64), bits=4), g.inputs[0]: se.TeSA.dense((1, 64), bits=8)})
    w, b = model[0].weight.detach(), model[0].bias.detach()
    want = quantized_linear(x, w, b, weight_bits=4, act_bits=8)
    # whichever candidate measures faster (the choice moves with the machine's load), and each one forced,
    # computes what the table describes: 4-bit weights on row grids, inputs on 8-bit token grids
    for choices in ((), "_0:dense", "_0:sparse"):
        cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, choices=choices)
        assert torch.allclose(cm(x), want, atol=1e-3), cm.plan.ops["_0"].chosen
    op = cm.plan.ops["_0"]
    assert {p.kernel for c in op.candidates for p in c.parts} >= {"dense", "int8"}
    assert cm.fp32_error > 0  # 4-bit weights really are quantized


def test_int8_convs_run_the_int8_implicit_gemm_on_images_quantized_whole(device, cache_dir):
    if 8 not in device.bits or not device.blocks:
        pytest.skip("no int8 kernels on this machine")
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1)).eval()
    x = torch.randn(2, 8, 10, 10)
    g = se.capture(model, (x,))
    kept0 = block_table(model, g, 0.9, (1, 1))["0.weight"].kept
    relu_out = next(n.name for n in g.nodes() if n.name not in ("_0", "_2") and n.op == "call_module")
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(kept0, bits=8),
                          "2.weight": se.TeSA.dense((16, 16, 3, 3), bits=8),
                          g.inputs[0]: se.TeSA.dense((1, 8, 10, 10), bits=8),
                          relu_out: se.TeSA.dense((1, 16, 10, 10), bits=8)})
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, choose="measured")
    strided = cm.plan.ops["_2"]  # no int8 kernel for stride 2: the fp32 kernel on the weights' grid instead
    assert [p.kernel for c in strided.candidates for p in c.parts if p.kernel not in ("dense", "shrink")] == ["sparse"]
    op = cm.plan.ops["_0"]
    int8 = [c.name for c in op.candidates if c.parts[0].kernel == "int8"]
    assert op.act_bits == 8 and int8 and int8[0] in op.measured_ms  # built, checked and timed
    assert op.candidate("dense").parts[0].act_bits == 8  # every candidate computes the same quantized conv
    assert cm.checks["passed"].all() and cm.max_error < 2e-2
    with torch.no_grad():
        want = quantized_conv2d(x, model[0].weight * kept0, model[0].bias, padding=(1, 1))
        got = lower(op.candidate(int8[0]), LowerContext(model[0], "none", op.m, cache_dir, False,
                                                        in_shape=tuple(x.shape)))(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_a_block_pattern_covered_by_short_blocks_is_built_by_its_rows(device, cache_dir):
    """A planner may cover 32x32 blocks with 1x32 ones (its costs say so); the kernel plans the 32 shared rows."""
    if 32 not in device.bits or not device.blocks:
        pytest.skip("no fp32 kernels on this machine")
    from sparta_explore.plan.execution_plan import Candidate, SubOp

    torch.manual_seed(0)
    layer = nn.Linear(96, 80)
    kept = (torch.rand(3, 3) < 0.5).repeat_interleave(32, 0).repeat_interleave(32, 1)[:80, :96]
    sub = SubOp("sparse", (1, 32), 32, 32, int(kept.sum()) // 32, kept)
    built = lower(Candidate("sparse", (sub,), 1.0), LowerContext(layer, "gelu", 64, cache_dir, False))
    assert built.block_rows == 32
    x = torch.randn(70, 96)
    with torch.no_grad():
        want = nn.functional.gelu(nn.functional.linear(x, layer.weight * kept, layer.bias))
        torch.testing.assert_close(built(x), want, rtol=1e-5, atol=1e-5 * (1 + float(want.abs().max())))


def test_digits_cnn_compiles_convs_and_linears(device, cache_dir):
    model, x = build_model("digits-cnn"), example_inputs("digits-cnn", batch=16)
    g = se.capture(model, x)
    from sparta_explore.pruners import prune
    from sparta_explore.pruners.nni_pruners import NNIPruneConfig

    table = se.propagate(g, prune(model, NNIPruneConfig(sparsity=0.5), pruner="l1norm", graph=g))
    cm = compile(model, table, x, device=device, cache_dir=cache_dir, tune=False)
    assert {op.kind for op in cm.plan.ops.values()} >= {"linear"}
    model.eval()
    ref = se.masked_copy(model, table).eval()
    assert torch.allclose(cm(*x), ref(*x), atol=1e-4)


def test_bert_tiny_with_block_pruning(device, cache_dir):
    model, x = build_model("bert-tiny").eval(), example_inputs("bert-tiny")
    g = se.capture(model, x)
    table = se.propagate(g, block_table(model, g, 0.5, (16, 16)))
    # no guard: it may keep the user's eager model for a model this small, and the graph is under test
    cm = compile(model, table, x, device=device, cache_dir=cache_dir, tune=False, guard=False)
    assert torch.allclose(cm(*x), se.masked_copy(model, table)(*x), atol=1e-4)
    fused = [op for op in cm.plan.ops.values() if op.activation == "gelu"]
    assert fused, "the FFN's GELU fuses into fc1"
    assert "gelu" not in cm.module.code  # the activation node is gone from the compiled graph


def test_a_kernel_that_fails_to_build_falls_back_with_a_warning(device, cache_dir, monkeypatch):
    import sparta_explore.kernels.sparse_linear as sl

    def broken(*a, **k):
        raise KernelBuildError("gcc exploded")

    monkeypatch.setattr(sl, "build", broken)
    model, x = Net(), torch.randn(9, 64)
    g = se.capture(model, (x,))
    table = block_table(model, g, 0.9, (1, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False)
    assert any(issubclass(w.category, CompileWarning) and "gcc exploded" in str(w.message) for w in caught)
    assert all(op.candidate(op.chosen).parts[0].kernel in ("dense", "shrink") for op in cm.plan.ops.values())
    assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-4)


def test_predicted_choice_builds_few_candidates(device, cache_dir):
    model, x = Net(), torch.randn(9, 64)
    g = se.capture(model, (x,))
    table = block_table(model, g, 0.9, (32, 32))
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, choose="predicted", tune=False)
    for op in cm.plan.ops.values():
        assert len(op.measured_ms) == 1 and op.chosen == op.best_predicted().name
    with pytest.raises(ValueError, match="choose"):
        compile(model, table, (x,), device=device, choose="fastest")


def test_kernel_families_can_be_restricted(device, cache_dir):
    model, x = Net(), torch.randn(9, 64)
    g = se.capture(model, (x,))
    table = block_table(model, g, 0.9, (1, 1))
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, kernels={"shrink"}, tune=False)
    for op in cm.plan.ops.values():
        assert {p.kernel for c in op.candidates for p in c.parts} <= {"dense", "shrink"}


def test_compiled_models_deepcopy(device, cache_dir):
    import copy

    model, x = Net(), torch.randn(9, 64)
    g = se.capture(model, (x,))
    cm = compile(model, block_table(model, g, 0.9, (1, 32)), (x,), device=device, cache_dir=cache_dir, tune=False)
    twin = copy.deepcopy(cm)
    assert torch.equal(twin(x), cm(x)) and twin.report.equals(cm.report)


def test_one_bit_weights_compile_on_the_two_bit_grid(device, cache_dir):
    # BNN records its +-1 weights as 1 bit; no kernel runs 1 bit, so the plan rounds up to the
    # 2-bit grid (which holds +-scale exactly) and dense stays a candidate
    model, x = Net(), torch.randn(16, 64)
    with torch.no_grad():
        model.fc1.weight.copy_(torch.sign(model.fc1.weight) * 0.05)
    table = se.TeSATable({"fc1.weight": se.TeSA.dense(tuple(model.fc1.weight.shape), bits=1)})
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False)
    op = next(o for o in cm.plan.ops.values() if o.target == "fc1")
    assert "dense" in op.measured_ms and op.chosen is not None
    assert any("2-bit grid" in n for n in op.notes)
    assert torch.allclose(cm(x), model(x), atol=1e-4)  # binarized weights are exact on the 2-bit grid


def test_an_op_no_candidate_can_build_keeps_its_own_module(device, cache_dir, monkeypatch):
    model, x = Net(), torch.randn(16, 64)
    table = se.TeSATable({"fc1.weight": se.TeSA.from_mask(torch.rand(96, 64) > 0.5)})

    def broken(candidate, ctx):
        raise RuntimeError("no kernel today")

    monkeypatch.setattr("sparta_explore.compile.choose.lower", broken)
    with pytest.warns(CompileWarning, match="no candidate could run"):
        cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False)
    op = next(iter(cm.plan.ops.values()))
    assert op.chosen == "original" and cm.report["choice"].tolist() == ["original"]
    assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-5)


def test_pruned_convs_get_sparse_candidates_run_as_implicit_gemm(device, cache_dir):
    if not device.blocks:
        pytest.skip("no compiler: no sparse kernels on this machine")
    model = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU(), nn.Conv2d(32, 8, 3, padding=1, groups=2),
                          nn.Conv2d(8, 8, 3, padding=1)).eval()
    x = torch.randn(2, 16, 12, 12)
    g = se.capture(model, (x,))
    table = block_table(model, g, 0.9, (1, 1))
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, choose="measured")
    conv = cm.plan.ops["_0"]
    assert "sparse" in {c.name for c in conv.candidates} and "sparse" in conv.measured_ms
    grouped = cm.plan.ops["_2"]
    assert {c.name for c in grouped.candidates} == {"dense"}  # a grouped conv stays whole
    kxk = cm.plan.ops["_3"]
    assert "sparse" in {c.name for c in kxk.candidates} and "sparse" in kxk.measured_ms
    want = se.masked_copy(model, table)(x)
    torch.testing.assert_close(cm(x), want, atol=1e-4, rtol=1e-4)
    for name in ("_0", "_3"):  # whatever was chosen, the sparse candidate built runs the kernel on the input's size
        built = lower(cm.plan.ops[name].candidate("sparse"),
                      LowerContext(model[int(name[1:])], "none", 2 * 144, cache_dir, False, in_shape=(2, 16, 12, 12)
                                   if name == "_0" else (2, 8, 12, 12)))
        assert built.implicit and built.linear.fallback_reason is None
    assert conv.measured_ms[conv.chosen] == min(conv.measured_ms.values())
