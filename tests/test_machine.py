"""The measuring machine: recorded in every row, and what keeps fronts and profiles apart."""

import pandas as pd
import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.report.pareto import front_hypervolume, guided_front
from sparta_explore.explore.report.plots import result_groups
from sparta_explore.kernels.build import set_target_isa
from sparta_explore.machine import Machine, this_machine


def test_the_key_changes_with_cpu_flags_and_threads():
    a = Machine("EPYC", ("avx2", "fma"), 2)
    assert a.key == Machine("EPYC", ("avx2", "fma"), 2).key
    assert len({a.key, Machine("EPYC", ("avx2", "fma", "avx512f"), 2).key, Machine("EPYC", ("avx2", "fma"), 1).key,
                Machine("Xeon", ("avx2", "fma"), 2).key}) == 4


def test_a_lowered_isa_is_another_machine():
    native = this_machine(threads=2)
    set_target_isa("avx2")
    try:
        lowered = this_machine(threads=2)
    finally:
        set_target_isa("native")
    assert not any(f.startswith("avx512") for f in lowered.flags)
    assert (lowered.key == native.key) == (native.flags == lowered.flags)


ROWS = pd.DataFrame({"latency_ms": [1.0, 2.0, 1.5], "effective_flops": [5, 3, 4], "accuracy": [0.9, 0.95, 0.92],
                     "dense_latency_ms": [3.0, 3.0, 3.0], "machine": ["m1", "m1", "m2"], "workload": ["w"] * 3,
                     "batch": [8] * 3})


def test_fronts_refuse_two_machines_unless_asked():
    with pytest.raises(ConfigError, match="measured on 2 machines"):
        guided_front(ROWS, "latency")
    assert front_hypervolume(ROWS, "latency", mix_machines=True) > 0
    assert len(guided_front(ROWS[ROWS["machine"] == "m1"], "latency")) == 2


def test_plots_and_reports_group_rows_by_machine():
    groups = dict(result_groups(ROWS))
    assert sorted(groups) == ["-w-b8-m1", "-w-b8-m2"] and len(groups["-w-b8-m2"]) == 1
