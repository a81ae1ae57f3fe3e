"""The LLM benchmark's pure figures (benchmarks/llm_report.py): weight bytes, decode rate, goal lines; no model."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from llm_report import LinearWeights, Speed, decode_goal_lines, decode_tok_s, goal_lines, weights_bytes  # noqa: E402

LAYER = LinearWeights(rows=576, cols=1536, kept=576 * 1536)


def test_weights_bytes_counts_fp32_kept_weights_and_other_params():
    assert weights_bytes([LAYER], other_params=100) == 4 * (576 * 1536 + 100)
    half = LinearWeights(576, 1536, 576 * 768)
    assert weights_bytes([half], 0) == pytest.approx(weights_bytes([LAYER], 0) / 2)


def test_weights_bytes_gptq_adds_a_scale_and_zero_per_group():
    groups = 576 * 1536 // 128
    assert weights_bytes([LAYER], 0, bits=4, group_size=128) == 576 * 1536 / 2 + groups * (2 + 0.5)
    assert weights_bytes([LAYER], 0, bits=8, group_size=None) == 576 * 1536 + 576 * 3  # one group per row
    pruned = weights_bytes([LinearWeights(576, 1536, 576 * 768)], 0, bits=4, group_size=128)
    assert pruned == 576 * 768 / 2 + groups * 2.5  # the grids stay per group of the dense layout


def test_decode_rate_is_the_extra_tokens_over_the_extra_time():
    assert decode_tok_s(3.5, 0.4, 32) == pytest.approx(31 / 3.1)
    assert math.isnan(decode_tok_s(0.4, 0.4, 32))  # no difference measured
    assert math.isnan(decode_tok_s(1.0, 0.5, 1))


def verdicts(lines):
    return [line.split()[0] for line in lines]


def test_goal_lines_pass_miss_and_missing_rows():
    ppl = {"dense": 10.0, "wanda-50%": 20.0, "sparsegpt-50%": 18.0, "wanda-2:4": 40.0, "sparsegpt-2:4": 33.0,
           "gptq-w8g128": 10.05, "gptq-w4g128": 11.0}
    seconds = {"sparsegpt-50%": 100.0, "gptq-w4g128": 301.0, "wanda-50%": 900.0, "sparsegpt-50%+gptq-w4g128": 400.0}
    lines = goal_lines(ppl, seconds, calib_windows=32)
    # sparsegpt 50 <= wanda; 33 > 0.8 x 40; no peer row; 8-bit 0.5% off dense; gptq over 300 s (wanda, and the
    # chained row's sum of two calibrations, not counted)
    assert verdicts(lines) == ["PASS", "MISS", "n/a", "PASS", "MISS"]
    assert "gptq-w4g128 301.0 s" in lines[4]
    ppl.update({"llama.cpp-Q4_K_M": 11.5, "gptq-w8g128": math.nan})
    assert verdicts(goal_lines(ppl, {}, calib_windows=8))[2:5] == ["PASS", "n/a", "n/a"]


def test_goal_lines_check_each_compiled_row_against_its_compressed_one():
    lines = goal_lines({"wanda-50%": 20.0, "wanda-50%:compiled": 20.001, "sparsegpt-50%": 18.0,
                        "sparsegpt-50%:compiled": 18.1}, {}, calib_windows=8)
    assert verdicts(lines)[-2:] == ["PASS", "MISS"]
    assert lines[-1].split()[1] == "sparsegpt-50%"


def test_decode_goals_compare_steps_with_llama_cpp_at_equal_perplexity():
    rows = {"dense": Speed(14.8, 400, 10.0, "torch-eager"), "dense:step-f32": Speed(14.8, 400, 26.0, "step a32"),
            "dense:step": Speed(14.8, 380, 85.0, "step a32"), "gptq:step": Speed(16.1, 390, 120.0, "step a32"),
            "llama.cpp-Q8_0": Speed(14.9, 400, 60.0, "llama.cpp"), "llama.cpp-Q4_K_M": Speed(15.9, 440, 73.0,
                                                                                             "llama.cpp"),
            "llama.cpp-Q2_K": Speed(20.9, 300, 100.0, "llama.cpp")}
    lines = decode_goal_lines(rows)
    assert lines[0].startswith("MISS") and "dense:step 85.0 tok/s >= 1.3 x 73.0" in lines[0]  # gptq is above 15.9
    assert lines[1].startswith("PASS") and "Q8_0" in lines[1]
    assert lines[2].startswith("PASS") and "gptq:step 120.0" in lines[2]
    assert lines[3].startswith("PASS") and "380 ms < 440 ms" in lines[3]
    assert lines[4].startswith("PASS") and "26.0 tok/s >= 2.5 x" in lines[4]
    missing = decode_goal_lines({"dense": rows["dense"]})
    assert all(line.startswith("n/a") for line in missing) and len(missing) == 3
