"""The llama.cpp peer's client (benchmarks/llm_peer.py) against a stub worker speaking its protocol, and the real
worker's pure parts (NLL, error replies) without llama.cpp: no peer venv needed, a second or two in all."""

import importlib.util
import io
import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import llm_llamacpp_worker as worker_mod  # noqa: E402
from llm_peer import QUANT_TYPES, LlamaCppPeer  # noqa: E402

# A stand-in for llm_llamacpp_worker.py: the same reply prefix, a ready line, stray output on stdout and stderr.
STUB = textwrap.dedent("""
    import json, sys, time
    print("llama.cpp banner: build 1234 (not a reply)", flush=True)
    print("noise on stderr", file=sys.stderr, flush=True)
    print("PEER " + json.dumps({"ready": True, "llama_cpp": "stub"}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "noisy":
            print("llama_model_loader: loaded meta data with 33 key-value pairs", flush=True)
            print("PEERLESS and PEER-like lines are not replies", flush=True)
            print("", flush=True)
        if op == "crash":
            raise RuntimeError("GGML_ASSERT(n_tokens <= n_batch) failed")
        if op == "sleep":
            time.sleep(30)
        if op == "fail":
            reply = {"op": op, "error": "FileNotFoundError: GGUF not found: /nope.gguf", "trace": "..."}
        else:
            reply = {"op": op, "request": request}
        print("PEER " + json.dumps(reply), flush=True)
""")


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    path = tmp_path / "stub_worker.py"
    path.write_text(STUB)
    return path


@pytest.fixture
def peer(stub: Path, tmp_path: Path):
    with LlamaCppPeer(Path(sys.executable), cache=tmp_path / "cache", threads=2, worker=stub) as p:
        yield p


def test_round_trip_sends_each_request_as_named(peer):
    assert peer.quantize(Path("/m/src.gguf"), "Q8_0")["request"] == {"op": "quantize", "source": "/m/src.gguf",
                                                                      "type": "Q8_0"}
    assert peer.info == {"ready": True, "llama_cpp": "stub"}
    got = peer.perplexity("q8", [np.array([1, 2, 3]), [4, 5]])["request"]
    assert got == {"op": "perplexity", "id": "q8", "windows": [[1, 2, 3], [4, 5]]}  # numpy ids become JSON ints
    assert peer.decode("q8", [7, 8], n=4, repeats=2)["request"] == {"op": "decode", "id": "q8", "prompt": [7, 8],
                                                                     "n": 4, "repeats": 2}
    assert peer.prefill("q8", [1], logits="last")["request"]["logits"] == "last"
    assert peer.drop("q8")["request"] == {"op": "drop", "id": "q8"}


def test_stray_output_is_skipped(peer):
    for _ in range(3):
        assert peer.ask({"op": "noisy", "k": 1})["request"] == {"op": "noisy", "k": 1}
    assert peer.proc is not None and peer.proc.poll() is None  # one worker served them all


def test_error_reply_is_returned_and_the_worker_goes_on(peer):
    assert peer.ask({"op": "fail"})["error"] == "FileNotFoundError: GGUF not found: /nope.gguf"
    assert peer.ask({"op": "echo"})["request"] == {"op": "echo"}
    assert peer.unavailable is None


def test_missing_venv_says_so_in_one_line(tmp_path):
    python = tmp_path / "no-venv" / "bin" / "python"
    peer = LlamaCppPeer(python, cache=tmp_path, threads=2)
    assert not peer.start() and peer.proc is None
    assert str(python) in peer.unavailable and "make bench-llm-peer-venv" in peer.unavailable
    assert "\n" not in peer.unavailable
    assert peer.perplexity("q8", [[1, 2]]) == {"error": peer.unavailable}


def test_worker_that_cannot_import_names_the_error(tmp_path):
    bad = tmp_path / "bad_worker.py"
    bad.write_text("print('starting')\nimport llama_cpp_not_installed_here\n")
    with LlamaCppPeer(Path(sys.executable), cache=tmp_path, threads=2, worker=bad) as peer:
        reply = peer.ask({"op": "load"})
        assert reply["error"] == ("llama.cpp worker did not start: ModuleNotFoundError: "
                                  "No module named 'llama_cpp_not_installed_here'")
        assert peer.unavailable == reply["error"]
        assert peer.ask({"op": "load"}) == reply  # no second start


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama_cpp is importable here")
def test_real_worker_without_llama_cpp_is_unavailable(tmp_path):
    with LlamaCppPeer(Path(sys.executable), cache=tmp_path, threads=2) as peer:
        assert not peer.start()
        assert peer.unavailable.endswith("ModuleNotFoundError: No module named 'llama_cpp'")


def test_crash_and_timeout_stop_the_worker_and_the_next_request_restarts_it(peer):
    assert "RuntimeError: GGML_ASSERT(n_tokens <= n_batch) failed" in peer.ask({"op": "crash"})["error"]
    assert peer.proc is None and peer.unavailable is None  # it answered before: a crash, not "cannot run"
    assert peer.ask({"op": "sleep"}, timeout_s=0.3) == {"error": "the llama.cpp worker took over 0.3 s on 'sleep'"}
    assert peer.proc is None
    assert peer.ask({"op": "echo"})["request"] == {"op": "echo"}


def test_window_nll_is_the_log_softmax_nll_of_the_next_token():
    rng = np.random.default_rng(0)
    n, vocab = 150, 11  # more rows than the worker turns to float64 at once
    logits = (rng.standard_normal((n, vocab)) * 4).astype(np.float32)
    ids = rng.integers(0, vocab, n)
    total, count = worker_mod.window_nll(logits, ids)
    x = logits.astype(np.float64)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    assert count == n - 1
    assert total == pytest.approx(-sum(logp[i, ids[i + 1]] for i in range(n - 1)), rel=1e-12)
    assert worker_mod.window_nll(np.zeros((3, 4), np.float32), np.array([0, 1, 2]))[0] == pytest.approx(
        2 * math.log(4))


def _serve(requests: list[dict], tmp_path: Path) -> list[dict]:
    out = io.StringIO()
    lines = [json.dumps(r) for r in requests] + ["", "{not json"]
    worker_mod.serve(worker_mod.Worker(lib=None, cache=tmp_path, threads=2), lines, out)
    replies = out.getvalue().splitlines()
    assert all(line.startswith(worker_mod.REPLY) for line in replies)
    return [json.loads(line[len(worker_mod.REPLY):]) for line in replies]


def test_real_worker_replies_one_line_naming_the_fault(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    replies = _serve([{"op": "quantize", "source": str(gguf), "type": "Q5_X"},
                      {"op": "quantize", "source": str(tmp_path / "gone.gguf"), "type": "Q8_0"},
                      {"op": "load", "id": "q8", "path": str(tmp_path / "gone.gguf"), "n_ctx": 64},
                      {"op": "perplexity", "id": "q8", "windows": [[1, 2]]},
                      {"op": "train"}], tmp_path)
    errors = [r["error"] for r in replies]
    assert errors[0] == f"ValueError: unknown llama.cpp type 'Q5_X'; one of {', '.join(QUANT_TYPES)}"
    assert errors[1] == errors[2] == f"FileNotFoundError: GGUF not found: {tmp_path / 'gone.gguf'}"
    assert errors[3] == "KeyError: no model 'q8' loaded (loaded: none)"
    assert errors[4].startswith("ValueError: unknown op 'train'")
    assert errors[5].startswith("JSONDecodeError:")
    assert [r["op"] for r in replies] == ["quantize", "quantize", "load", "perplexity", "train", None]
    assert worker_mod.QUANT_TYPES == QUANT_TYPES
