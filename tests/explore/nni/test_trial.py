"""The NNI trial entry's pieces: in-order parameter handshake (NNI issue 5726), params, the final dict."""

import json
import math
import threading
import time
from collections import deque

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.nni.trial import (
    ORDER_FOLDER,
    TrialContext,
    build_parser,
    compile_kwargs,
    final_result,
    fixed_params,
    json_safe,
    merge_params,
    receive_in_order,
)
from sparta_explore.explore.trial.params import TrialParams


def local_context(root, seq):
    trial_dir = root / "environments" / "local-env" / "trials" / f"trial{seq}"
    return TrialContext(platform="local", trial=f"trial{seq}", sequence=seq, output_dir=trial_dir)


def test_parameters_follow_sequence_numbers_even_when_the_later_trial_asks_first(tmp_path):
    # NNI's local service hands out queued parameters first come, first served (issue 5726):
    # the queue holds the parameters of sequence 0, then those of sequence 1.
    queue = deque([{"for": 0}, {"for": 1}])
    lock = threading.Lock()

    def get_next():
        with lock:
            return queue.popleft()

    got = {}

    def trial(seq, delay):
        time.sleep(delay)
        got[seq], _ = receive_in_order(get_next, local_context(tmp_path, seq), timeout_s=10, poll_s=0.01)

    late_first = threading.Thread(target=trial, args=(1, 0.0))
    early_second = threading.Thread(target=trial, args=(0, 0.3))
    late_first.start()
    early_second.start()
    late_first.join()
    early_second.join()
    assert got == {0: {"for": 0}, 1: {"for": 1}}
    assert sorted(p.name for p in (tmp_path / "environments" / "local-env" / ORDER_FOLDER).iterdir()) == ["0", "1"]


def test_a_predecessor_that_never_asks_costs_the_timeout_only(tmp_path):
    start = time.monotonic()
    params, waited = receive_in_order(lambda: {"a": 1}, local_context(tmp_path, 5), timeout_s=0.3, poll_s=0.01)
    assert params == {"a": 1}
    assert 0.3 <= waited < 2 and time.monotonic() - start < 2


def test_outside_the_local_platform_parameters_are_asked_for_at_once():
    ctx = TrialContext.from_env({"NNI_PLATFORM": "remote", "NNI_TRIAL_SEQ_ID": "4", "NNI_OUTPUT_DIR": "/x/t/y"})
    assert ctx.order_dir is None
    assert TrialContext.from_env({}).order_dir is None
    assert receive_in_order(lambda: {"b": 2}, ctx, timeout_s=100) == ({"b": 2}, 0.0)


def test_command_line_fixes_fields_and_may_not_fight_the_search_space():
    args = build_parser().parse_args(["--objective", "flops", "--target", "0.4", "--finetune-epochs", "0",
                                      "--set", "batch=8", "--set", "pruner=l1norm", "--set", "block=null"])
    fixed = fixed_params(args)
    assert fixed == {"objective": "flops", "target": 0.4, "finetune_epochs": 0, "batch": 8, "pruner": "l1norm",
                     "block": None}
    params = TrialParams.from_dict(merge_params({"sparsity": 0.8, "bits": 8}, fixed))
    assert (params.objective, params.sparsity, params.bits, params.block, params.batch) == ("flops", 0.8, 8, None, 8)
    with pytest.raises(ConfigError, match="sparsity"):
        merge_params({"sparsity": 0.8}, {"sparsity": 0.5})
    with pytest.raises(ConfigError, match="twice"):
        fixed_params(build_parser().parse_args(["--objective", "flops", "--set", "objective=latency"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--set", "no-equals-sign"])


def test_compile_arguments_come_from_the_command_line():
    args = build_parser().parse_args(["--compile", "tune=false", "--compile", 'kernels=["dense", "shrink"]'])
    assert compile_kwargs(args) == {"tune": False, "kernels": ["dense", "shrink"]}


def test_final_result_is_json_with_the_score_as_default_and_both_echoes():
    row = {"accuracy": 0.9, "latency_ms": 3.0, "max_error": math.nan, "speedup": math.inf, "score": 0.85}
    ctx = TrialContext(platform="local", trial="AbCdE", sequence=3)
    params = TrialParams(sparsity=0.9, block=(1, 32)).to_dict()
    final = final_result(row, 0.85, params, {"sparsity": 0.9, "block": "1x32"}, ctx)
    assert final["default"] == final["score"] == 0.85
    assert final["max_error"] is None and final["speedup"] is None
    assert final["params"]["block"] == [1, 32] and final["nni_params"] == {"sparsity": 0.9, "block": "1x32"}
    assert (final["nni_trial"], final["nni_sequence"]) == ("AbCdE", 3)
    json.loads(json.dumps(final, allow_nan=False))  # NNI's manager parses it with JSON.parse


def test_json_safe_unwraps_numpy_and_torch_scalars():
    import numpy as np
    import torch

    out = json_safe({"a": np.float32(0.5), "b": torch.tensor(3), "c": (np.float64("nan"),)})
    assert out == {"a": 0.5, "b": 3, "c": [None]}
    assert type(out["a"]) is float and type(out["b"]) is int
