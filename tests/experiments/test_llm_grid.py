"""The LLM grid notebook runs its quick corner on the tiny Llama: four trials, one read from another's calibration."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sparta_explore.kernels.decode_step import why_no_kernels

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(why_no_kernels() is not None, reason=str(why_no_kernels()))
def test_the_quick_grid_runs_and_shares_calibration(tmp_path):
    log = tmp_path / "grid.jsonl"
    command = [sys.executable, str(ROOT / "experiments" / "llm_grid.py"), "--quick", "--log", str(log)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(log.read_text().splitlines()) == 4
    stats = next(line for line in done.stdout.splitlines() if line.startswith("calibration cache: "))
    # the int4 point at float activations is the int8 one's compression: its whole walk is read back
    assert ast.literal_eval(stats.removeprefix("calibration cache: "))["blocks_reused"] == 2
    assert "latency-guided front" in done.stdout and "flops-guided front" in done.stdout
