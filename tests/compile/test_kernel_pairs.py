"""compile's kernel pairs: chained sparse linears fused tile by tile where faster, retiled where their tile searches
parted, timed once per class and the verdict remembered for later compiles."""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import compile
from sparta_explore.fake_quant import quantized_linear
from sparta_explore.kernels.permute_int8 import has_permute

PAIR_KINDS = {"int8": ("FusedInt8Pair", 8), "sparse": ("FusedFp32Pair", 32), "permute": ("FusedPermutePair", 8)}


def _pair_masks(model, kind):
    """Scattered masks (fp32; int8 on the permute kernel), or runs of 4 k (full quads: the quad int8 kernels)."""
    masks = {}
    for i, name in ((0, "0.weight"), (2, "2.weight")):
        n, k = model[i].weight.shape
        if kind == "int8":
            masks[name] = (torch.rand(n, -(-k // 4)) > 0.8).repeat_interleave(4, dim=1)[:, :k]
        else:
            masks[name] = torch.rand(n, k) > 0.8
    return masks


@pytest.mark.parametrize("kind", sorted(PAIR_KINDS))
@pytest.mark.parametrize("faster", ["fused", "apart"])
def test_chained_linears_fuse_where_the_pair_is_faster(device, cache_dir, monkeypatch, faster, kind):
    """int8 pairs as their timing says; fp32 pairs always, untimed (their work is the two ops' minus a trip)."""
    pair, bits = PAIR_KINDS[kind]
    if bits not in device.bits or not device.blocks:
        pytest.skip(f"no {bits}-bit kernels on this machine")
    if kind == "permute" and not has_permute():
        pytest.skip("the permute kernel needs AVX-512 VBMI and VNNI")
    monkeypatch.setattr("sparta_explore.kernels.fused_ffn.FusedPair.whole_tiles", 0)  # 100 rows: fused
    model = nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 48)).eval()
    x = torch.randn(100, 64)
    g = se.capture(model, (x,))
    kept = _pair_masks(model, kind)
    table = se.TeSATable({name: se.TeSA.from_mask(k, bits=bits) for name, k in kept.items()})
    if bits == 8:
        table = se.TeSATable({**table, g.inputs[0]: se.TeSA.dense((1, 64), bits=8),
                              "_1": se.TeSA.dense((1, 192), bits=8)})

    def timed(fns, x, rounds, settle=False):  # the decision is the pass's; what the clock says is the test's
        assert kind == "int8", "fp32 and permute pairs are fused without timing"
        return {name: (1.0 if name == faster else 2.0) for name in fns}

    monkeypatch.setattr("sparta_explore.compile.kernel_pairs.fastest_ms", timed)
    # the kernels are chosen (a small fp32 layer can measure faster dense): the pairing is under test
    monkeypatch.setattr("sparta_explore.compile.choose._timed",
                        lambda op, fns, x, runs: {name: 2.0 if name == "dense" else 1.0 for name in fns})
    family = "int8" if bits == 8 else "sparse"
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, kernels={family}, guard=False)
    first, second = cm.plan.ops["_0"], cm.plan.ops["_2"]
    assert first.activation == "gelu"
    fused = [type(m).__name__ for m in cm.module.modules()].count(pair)
    if faster == "fused" or kind != "int8":
        assert fused == 1 and "fused with '_2'" in " ".join(first.notes) and "inside '_0'" in " ".join(second.notes)
        assert [n.op for n in cm.module.graph.nodes].count("call_module") == 1
    else:
        assert fused == 0 and "kept apart" in " ".join(first.notes)
    assert cm.checks["passed"].all()
    if kind != "int8":
        assert "not timed" in " ".join(first.notes)
    with torch.no_grad():
        w1, w2 = model[0].weight * kept["0.weight"], model[2].weight * kept["2.weight"]
        linear = quantized_linear if bits == 8 else nn.functional.linear
        want = linear(nn.functional.gelu(linear(x, w1, model[0].bias)), w2, model[2].bias)
        # int8 tolerance: a tie in fc2's input grid may round either way after fc1's last bit
        atol = (2e-2 if bits == 8 else 1e-5) * (1 + float(want.abs().max()))
        torch.testing.assert_close(cm(x), want, rtol=0, atol=atol)


def _other_tiles(device, monkeypatch, faster: str, records, timings: list | None = None) -> dict:
    """fc1 (GELU) and fc2 tiled apart, as if each op's tile search chose its own (unless told a tiling); the pair
    timing says `faster` (each call appended to `timings`); pair verdicts are remembered in the folder `records`.
    Returns the tiles by activation."""
    if 32 not in device.bits or not device.blocks:
        pytest.skip("no fp32 kernels on this machine")
    from sparta_explore.kernels.bsr_codegen import TileConfig

    monkeypatch.setattr("sparta_explore.kernels.fused_ffn.FusedPair.whole_tiles", 0)
    tiles = {"gelu": TileConfig(rows=4, vectors=2, single_vectors=2), "none": TileConfig(rows=4, vectors=3,
                                                                                         single_vectors=3)}
    monkeypatch.setattr("sparta_explore.compile.lowering._tile", lambda mask, rows, activation, ctx: {
        "tile": ctx.tile or tiles[activation], "tile_searched": True})
    monkeypatch.setattr("sparta_explore.compile.pair_tiles._path", lambda cache_dir, key: records / f"{key}.json")
    monkeypatch.setattr("sparta_explore.compile.choose._timed",
                        lambda op, fns, x, runs: {name: 2.0 if name == "dense" else 1.0 for name in fns})

    def timed(fns, x, rounds, settle=False):
        if timings is not None:
            timings.append(sorted(fns))
        return {name: 1.0 if name == faster else 2.0 for name in fns}

    monkeypatch.setattr("sparta_explore.compile.kernel_pairs.fastest_ms", timed)
    return tiles


@pytest.mark.parametrize("faster", ["fused", "apart"])
def test_fp32_pairs_of_other_tiles_are_retiled_and_timed(device, cache_dir, monkeypatch, faster, tmp_path):
    tiles = _other_tiles(device, monkeypatch, faster, tmp_path)
    model = nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 48)).eval()
    x = torch.randn(100, 64)
    kept = _pair_masks(model, "sparse")
    table = se.TeSATable({name: se.TeSA.from_mask(k) for name, k in kept.items()})
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, kernels={"sparse"}, guard=False)
    notes = " ".join(cm.plan.ops["_0"].notes)
    pairs = [m for m in cm.module.modules() if type(m).__name__ == "FusedFp32Pair"]
    if faster == "fused":
        assert len(pairs) == 1 and pairs[0].second.tile == tiles["gelu"]
        first_rows, second_rows = (tiles[a].tile_vectors * pairs[0].first._vec for a in ("gelu", "none"))
        assert f"retiled to the first's {first_rows}-row tile (was {second_rows})" in notes
    else:
        assert not pairs and "kept apart" in notes
    with torch.no_grad():
        want = nn.functional.linear(model[1](nn.functional.linear(x, model[0].weight * kept["0.weight"],
                                                                  model[0].bias)),
                                    model[2].weight * kept["2.weight"], model[2].bias)
        torch.testing.assert_close(cm(x), want, rtol=1e-5, atol=1e-5 * (1 + float(want.abs().max())))


@pytest.mark.parametrize("faster", ["fused", "apart"])
def test_timed_pairs_of_one_class_share_one_timing(device, cache_dir, monkeypatch, faster, tmp_path):
    timings = []
    _other_tiles(device, monkeypatch, faster, tmp_path, timings)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 64),
                          nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 64)).eval()  # two FFN blocks pruned alike
    x = torch.randn(100, 64)
    kept = {f"{i}.weight": torch.rand(model[i].weight.shape) > 0.8 for i in (0, 2, 3, 5)}
    table = se.TeSATable({name: se.TeSA.from_mask(k) for name, k in kept.items()})
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, kernels={"sparse"}, guard=False)
    # the first block's pair only; kept apart, fc2 -> the next fc1 is a pair too, of its own class
    assert len(timings) == (1 if faster == "fused" else 2)
    pairs = [m for m in cm.module.modules() if type(m).__name__ == "FusedFp32Pair"]
    assert len(pairs) == (2 if faster == "fused" else 0)
    assert "as timed for '_0'" in " ".join(cm.plan.ops["_3"].notes)
    with torch.no_grad():
        want = x
        for i in (0, 2, 3, 5):
            want = nn.functional.linear(want, model[i].weight * kept[f"{i}.weight"], model[i].bias)
            want = nn.functional.gelu(want) if i in (0, 3) else want
        torch.testing.assert_close(cm(x), want, rtol=1e-5, atol=1e-5 * (1 + float(want.abs().max())))



@pytest.mark.parametrize("faster", ["fused", "apart"])
def test_a_later_compile_builds_the_second_op_as_the_remembered_pair_timing_says(
        device, cache_dir, monkeypatch, faster, tmp_path):
    timings = []
    tiles = _other_tiles(device, monkeypatch, faster, tmp_path, timings)
    model = nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 48)).eval()
    x = torch.randn(100, 64)
    kept = _pair_masks(model, "sparse")
    table = se.TeSATable({name: se.TeSA.from_mask(k) for name, k in kept.items()})
    compile(model, table, (x,), device=device, cache_dir=cache_dir, kernels={"sparse"}, guard=False)
    assert len(timings) == 1 and len(list(tmp_path.iterdir())) == 1  # timed once, and remembered
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, kernels={"sparse"}, guard=False)
    assert len(timings) == 1  # the earlier compile's verdict holds: no pair timed again
    first, second = (" ".join(cm.plan.ops[op].notes) for op in ("_0", "_2"))
    pairs = [m for m in cm.module.modules() if type(m).__name__ == "FusedFp32Pair"]
    if faster == "fused":  # built in fc1's tiling from the start: fused without a rebuild or a timing
        assert "built in '_0''s tiling" in second and len(pairs) == 1 and pairs[0].second.tile == tiles["gelu"]
        assert "not timed" in first
    else:
        assert "built in" not in second and not pairs and "earlier compile" in first
    with torch.no_grad():
        want = nn.functional.linear(model[1](nn.functional.linear(x, model[0].weight * kept["0.weight"],
                                                                  model[0].bias)),
                                    model[2].weight * kept["2.weight"], model[2].bias)
        torch.testing.assert_close(cm(x), want, rtol=1e-5, atol=1e-5 * (1 + float(want.abs().max())))


def test_int8_pairs_at_too_few_tiles_are_not_tried(device, cache_dir, monkeypatch):
    if 8 not in device.bits or not device.blocks:
        pytest.skip("no int8 kernels on this machine")
    model = nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 48)).eval()
    x = torch.randn(20, 64)  # one tile of M: the pair would run its two ops apart
    g = se.capture(model, (x,))
    kept = _pair_masks(model, "int8")
    table = se.TeSATable({"0.weight": se.TeSA.from_mask(kept["0.weight"], bits=8),
                          "2.weight": se.TeSA.from_mask(kept["2.weight"], bits=8),
                          g.inputs[0]: se.TeSA.dense((1, 64), bits=8), "_1": se.TeSA.dense((1, 192), bits=8)})

    def timed(fns, x, rounds, settle=False):
        raise AssertionError("nothing to time: the pair would run apart")

    monkeypatch.setattr("sparta_explore.compile.kernel_pairs.fastest_ms", timed)
    monkeypatch.setattr("sparta_explore.compile.choose._timed",
                        lambda op, fns, x, runs: {name: 2.0 if name == "dense" else 1.0 for name in fns})
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, kernels={"int8"}, guard=False)
    assert "too few tiles" in " ".join(cm.plan.ops["_0"].notes)
    assert not any(type(m).__name__ == "FusedInt8Pair" for m in cm.module.modules())
