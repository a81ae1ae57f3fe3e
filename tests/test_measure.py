"""measure(): latency statistics, FLOPs (dense and effective) and memory of a forward."""

import pytest
import torch
from torch import nn

from sparta_explore.kernels import ShrunkLinear, SparseLinear
from sparta_explore.measure import count_flops, measure, weight_bytes


def test_statistics_are_ordered_and_counted():
    m = measure(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)), (torch.randn(16, 64),), runs=9)
    assert m.runs == 9 and m.threads == torch.get_num_threads()
    assert 0 < m.p10_ms <= m.median_ms <= m.p90_ms
    assert m.dense_flops == 2 * 16 * (64 * 128 + 128 * 8) == m.effective_flops
    assert m.weight_bytes == 4 * (64 * 128 + 128 + 128 * 8 + 8)


def test_effective_flops_follow_zeros_and_conv_shapes():
    conv = nn.Conv2d(4, 6, 3, padding=1, groups=2)
    with torch.no_grad():
        conv.weight[:3] = 0  # half the filters pruned
    dense, eff = count_flops(conv, (torch.randn(2, 4, 5, 5),))
    assert dense == 2 * (2 * 6 * 5 * 5) * (2 * 9)
    assert eff == dense // 2


def test_compiled_ops_report_their_density(tmp_path):
    w = torch.randn(32, 64)
    kept = torch.zeros(32, 64, dtype=torch.bool)
    kept[:8] = True  # a quarter of the rows
    x = torch.randn(5, 64)
    for op in (SparseLinear(w, None, kept, cache_dir=tmp_path), ShrunkLinear(w, None, kept)):
        dense, eff = count_flops(op, (x,))
        assert dense == 2 * 5 * 64 * 32 and eff == dense // 4


def test_a_reused_module_counts_every_call():
    lin = nn.Linear(8, 8)

    class Twice(nn.Module):
        def forward(self, x):
            return lin(lin(x))

    model = Twice()
    model.lin = lin
    assert count_flops(model, (torch.randn(3, 8),))[0] == 2 * 2 * 3 * 8 * 8


def test_shared_weights_count_once_in_memory():
    a = nn.Linear(4, 4, bias=False)
    b = nn.Linear(4, 4, bias=False)
    b.weight = a.weight
    assert weight_bytes(nn.Sequential(a, b)) == 64


def test_peak_memory_sees_a_large_temporary():
    class Hungry(nn.Module):
        def forward(self, x):
            return (torch.ones(64, 1024, 1024) + x).sum()  # a fresh 256 MiB temporary per call

    m = measure(Hungry(), (torch.ones(1),), runs=2, warmup=0, count=False)
    assert m.peak_memory_mb is None or m.peak_memory_mb > 100


def test_bad_run_counts_are_refused():
    with pytest.raises(ValueError, match="runs"):
        measure(nn.Linear(2, 2), (torch.randn(1, 2),), runs=0)


def test_torch_dynamic_int8_models_are_counted():
    model = nn.Sequential(nn.Linear(16, 16))
    with torch.no_grad():
        model[0].weight[:8] = 0
    q = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    dense, eff = count_flops(q, (torch.randn(2, 16),))
    assert dense == 2 * 2 * 16 * 16
    assert 0.45 * dense <= eff <= dense // 2  # a few tiny weights also quantize to 0


def test_flops_count_hugging_face_conv1d_whose_weight_is_stored_in_by_out():
    from transformers.pytorch_utils import Conv1D

    layer = Conv1D(6, 4)  # 4 -> 6 features, weight (4, 6)
    with torch.no_grad():
        layer.weight[:, :3] = 0  # half the outputs' weights pruned
    dense, effective = count_flops(layer, (torch.randn(5, 4),))
    assert dense == 2 * 5 * 4 * 6 and effective == dense // 2
