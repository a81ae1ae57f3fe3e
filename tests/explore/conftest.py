"""A synthetic trial for the sweep, Pareto, plot and report tests: plausible rows, no compiling.

Latency follows what the kernels do: 32x32 blocks pay off with sparsity, unstructured (1x1)
sparsity barely does, int8 halves the time; FLOPs only see the sparsity. So FLOPs-guided
and latency-guided fronts differ, as on real hardware.
"""

import pytest

from sparta_explore.explore.trial.params import TrialParams
from sparta_explore.explore.trial.result import METRIC_FIELDS, TrialResult

DENSE_MS, DENSE_FLOPS = 10.0, 1e9


def synthetic_result(params: TrialParams) -> TrialResult:
    s = params.sparsity
    block_gain = {(32, 32): 1.0, (1, 32): 0.7, (1, 1): 0.15}.get(params.block, 0.5)
    latency = DENSE_MS * (1.0 - block_gain * s) * (0.55 if params.bits == 8 else 1.0)
    accuracy = 0.98 - 0.2 * s ** 3 * (1.0 + block_gain) - (0.01 if params.bits == 8 else 0.0)
    metrics = dict.fromkeys(METRIC_FIELDS, 0.0)
    metrics.update(accuracy=accuracy, finetuned_accuracy=accuracy, masked_accuracy=accuracy - 0.05,
                   dense_accuracy=0.98, latency_ms=latency, latency_p10_ms=0.95 * latency,
                   latency_p90_ms=1.05 * latency, dense_latency_ms=DENSE_MS, dense_flops=DENSE_FLOPS,
                   effective_flops=DENSE_FLOPS * (1.0 - s), sparsity_pruned=s, sparsity_propagated=s,
                   mean_bits=float(params.bits), runs=5, threads=2, wall_s=0.01)
    return TrialResult(params, **metrics)


GRID = {"workload": "digits-mlp", "sparsity": [0.3, 0.6, 0.9], "block": ["32x32", "1x32", "1x1"], "bits": [32, 8]}


@pytest.fixture
def fake_trial():
    """A trial function returning synthetic results, recording the params it was called with."""
    calls = []

    def trial(params):
        calls.append(params)
        return synthetic_result(params)
    trial.calls = calls
    return trial
