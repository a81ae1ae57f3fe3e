"""K panels: every group's k cut at panel bounds with weight offsets intact; int8 kernels exact across panels."""

import numpy as np
import pytest
import torch

from sparta_explore.kernels import Int8SparseLinear, panels
from sparta_explore.kernels import int8_linear as int8_linear_module
from sparta_explore.kernels.build import cpu_flags
from sparta_explore.kernels.groups import align_segments, plan_groups, unit_segments
from sparta_explore.kernels.int8_codegen import panel_k_for
from sparta_explore.kernels.panels import ONE_WORD, by_length, cache_bytes, cut_panels, fp32_budget, panel_rows
from sparta_explore.kernels.vnni_codegen import DOT_MODES

from .grids import pairwise
from .test_sparse_linear import block_mask, check

needs_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="int8 kernels need AVX2")


def quad_groups(kept: np.ndarray, block_rows: int):
    return unit_segments(align_segments(plan_groups(kept, block_rows, 4), 4), 4)


@pytest.mark.parametrize("block", [(1, 1), (4, 8), (32, 32)])
@pytest.mark.parametrize("rows", [4, 12, 64, 1000])
def test_pieces_cover_each_group_once_inside_panels_with_their_weight_offsets(block, rows):
    kept = block_mask(40, 90, block, 0.3).numpy()
    groups = quad_groups(kept, block[0])
    panels = cut_panels(groups, 90, rows, [0], word=4)
    covered: dict[int, list[int]] = {}
    for e, g in enumerate(panels.e_group):
        k = [kk for p in range(panels.e_piece0[e], panels.e_piece1[e])
             for kk in range(panels.p_k0[p], panels.p_k0[p] + panels.p_len[p])]
        assert len({kk // rows for kk in k}) == 1  # one panel per entry
        done = sum(len(v) for v in covered.get(int(g), []))
        assert panels.e_woff[e] == groups.w_off[g] + done // 4 * groups.rows[g]  # offsets count quads
        covered.setdefault(int(g), []).append(k)
    for g in range(len(groups.row0)):
        want = [kk for s in range(groups.seg_ptr[g], groups.seg_ptr[g + 1])
                for kk in range(groups.seg_k0[s], groups.seg_k0[s] + groups.seg_len[s])]
        got = sorted(kk for part in covered.get(g, []) for kk in part)
        assert got == want
        flags = panels.e_flags[panels.e_group == g]
        assert flags[0] & 1 and flags[-1] & 2 and not (flags[1:] & 1).any() and not (flags[:-1] & 2).any()


def test_only_entries_of_single_words_are_flagged_one_word():
    kept = np.zeros((3, 64), dtype=bool)
    kept[0, [0, 9, 40]] = True            # scattered: one quad per piece
    kept[1, 0:16] = True                  # one run of four quads
    kept[2, [1, 20]] = True
    kept[2, 32:48] = True                 # mixed
    groups = align_segments(plan_groups(kept, 1, 1), 4)
    panels = cut_panels(groups, 64, 64, [0], word=4)
    assert ((panels.e_flags & ONE_WORD) != 0).tolist() == [True, False, False]


def test_panel_rows_must_hold_whole_words():
    with pytest.raises(ValueError, match="multiple of the packed word"):
        cut_panels(quad_groups(np.ones((4, 16), dtype=bool), 1), 16, 6, [0], word=4)


def test_only_scattered_patterns_outgrowing_l1_take_panels():
    scattered = quad_groups(block_mask(64, 4096, (1, 1), 0.1).numpy(), 1)
    blocks = quad_groups(block_mask(64, 4096, (32, 32), 0.1).numpy(), 32)
    assert panel_k_for("vnni", DOT_MODES["avx512_vnni"], scattered, 4096) > 0
    assert panel_k_for("vnni", DOT_MODES["avx512_vnni"], scattered, 64) == 0  # X's tile fits L1 whole
    assert panel_k_for("vnni", DOT_MODES["avx512_vnni"], blocks, 4096) == 0


def _variant_id(value) -> str:
    return f"{value['dot']}-w{value.get('weight_bits', 8)}" if isinstance(value, dict) else str(value)


VARIANTS = [dict(dot=None), dict(dot=None, weight_bits=4)] + [dict(dot=m, emulate_dot=True) for m in sorted(DOT_MODES)]


@needs_avx2
@pytest.mark.parametrize("variant, block, act", pairwise(VARIANTS, [(1, 1), (1, 32), (16, 16)], ["none", "gelu"],
                                                         ids=_variant_id))
def test_int8_kernels_are_exact_over_many_panels(tmp_path, monkeypatch, variant, block, act):
    # 8 k per panel: every group spills and reloads its int32 sums several times, on every variant
    monkeypatch.setattr(int8_linear_module, "panel_k_for", lambda *args: 8)
    n, k = 37, 70
    layer = Int8SparseLinear(torch.randn(n, k), torch.randn(n), block_mask(n, k, block, 0.3), block_rows=block[0],
                             activation=act, cache_dir=tmp_path, **variant)
    assert layer.fallback_reason is None
    for m in (1, 50, 300):
        check(layer, m, k)


def _cache_index(root, name, level, kind, size):
    index = root / name
    index.mkdir()
    for field, value in (("level", level), ("type", kind), ("size", size)):
        (index / field).write_text(f"{value}\n")


def test_cache_sizes_are_read_from_sysfs_level_one_data_and_level_two(tmp_path):
    _cache_index(tmp_path, "index0", 1, "Instruction", "64K")
    _cache_index(tmp_path, "index1", 1, "Data", "48K")
    _cache_index(tmp_path, "index2", 2, "Unified", "1M")
    assert cache_bytes(1, tmp_path) == 48 * 1024
    assert cache_bytes(2, tmp_path) == 1024 * 1024
    assert panel_rows(192, budget=cache_bytes(1, tmp_path)) == 256


@pytest.mark.parametrize("l1_kib, budget_kib", [(32, 48), (48, 48), (64, 64)])
def test_fp32_panels_hold_at_least_the_floor_and_int8_panels_l1(monkeypatch, l1_kib, budget_kib):
    monkeypatch.setattr(panels, "cache_bytes", lambda level: l1_kib * 1024)
    assert panels.l1_budget() == l1_kib * 1024
    assert fp32_budget() == budget_kib * 1024
    # a 4x3x3 tile's 48 floats per k: 256 k rows on a 32 KiB L1 where the whole L1 gave 170
    assert panel_rows(4 * 48, budget=fp32_budget()) == budget_kib * 1024 // 192


def test_l1_size_without_sysfs_is_a_positive_default(tmp_path):
    _cache_index(tmp_path, "index0", 1, "Data", "not a size")  # unreadable: the next source is asked
    assert cache_bytes(1, tmp_path) >= 16 * 1024
    assert cache_bytes(1, tmp_path / "missing") >= 16 * 1024
    assert cache_bytes(2, tmp_path / "missing") >= 128 * 1024


def _entry_words(p, words):
    """(group, k, packed word) of every word each entry reads."""
    out = set()
    for e in range(len(p.e_group)):
        at = p.e_woff[e]
        for piece in range(p.e_piece0[e], p.e_piece1[e]):
            for k in range(p.p_k0[piece], p.p_k0[piece] + p.p_len[piece]):
                out.add((int(p.e_group[e]), int(k), int(words[at])))
                at += 1
    return out


def test_entries_by_length_read_the_same_words_each_chunk_ordered_by_length():
    kept = np.random.default_rng(0).random((50, 300)) < 0.1
    kept[7] = False  # a row with nothing: no entry
    kept[9, 64] = True  # a piece on a panel's first k
    groups = unit_segments(plan_groups(kept, 1), 1, np.inf)
    chunk_g0 = [0, 10, 30]
    panels = cut_panels(groups, 300, 64, chunk_g0)
    packed = np.arange(int(kept.sum())) + 1000  # one id per packed word
    ordered, index = by_length(panels, chunk_g0, groups.rows)
    assert _entry_words(ordered, packed[index]) == _entry_words(panels, packed)
    assert sorted(index.tolist()) == list(range(packed.size))
    for lo, hi, new_lo, new_hi in zip(panels.e_ptr[:-1], panels.e_ptr[1:], ordered.e_ptr[:-1], ordered.e_ptr[1:]):
        assert sorted(panels.e_group[lo:hi]) == sorted(ordered.e_group[new_lo:new_hi])  # same entries per chunk
        lengths = ordered.e_piece1[new_lo:new_hi] - ordered.e_piece0[new_lo:new_hi]
        assert np.all(np.diff(lengths) >= 0)
        flags = dict(zip(panels.e_group[lo:hi], panels.e_flags[lo:hi]))
        assert all(flags[g] == f for g, f in zip(ordered.e_group[new_lo:new_hi], ordered.e_flags[new_lo:new_hi]))
