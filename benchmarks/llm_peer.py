"""The llama.cpp peer of the LLM benchmarks: `LlamaCppPeer` runs `llm_llamacpp_worker.py` under the peer venv's
python (.venv-llm-peer, `make bench-llm-peer-venv`) as one long-lived process and asks it for quantized files,
perplexity, prefill and decode times on the very token ids our side uses. Nothing of llama_cpp is imported here:
llama-cpp-python is never a project dependency, so this file runs in the project venv.

Every request returns a dict; one that failed is `{"error": "one line naming the thing at fault"}`. Where the peer
cannot run at all (no venv, llama_cpp not importable, a crash before it said it was ready) `unavailable` holds that
one line, every request returns it at once, and the caller still prints its own rows.

Example:
    >>> peer = LlamaCppPeer(Path(".venv-llm-peer/bin/python"), cache=Path("/tmp/llm-peer"), threads=2)  # doctest: +SKIP
    >>> q8 = peer.quantize(gguf, "Q8_0")  # {"path", "bytes", "seconds", "cached"}  # doctest: +SKIP
    >>> peer.load("q8", q8["path"], n_ctx=512)  # doctest: +SKIP
    >>> peer.perplexity("q8", windows)["ppl"], peer.decode("q8", prompt, n=32)["tok_s"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from peers_client import error_line, read_line  # this script's folder is on sys.path, as for every benchmark

HERE = Path(__file__).resolve().parent
WORKER = HERE / "llm_llamacpp_worker.py"
REPLY = b"PEER "  # the worker's reply lines start with this (llm_llamacpp_worker.REPLY)
READY_TIMEOUT_S = 120.0  # importing llama_cpp and printing the system info
REQUEST_TIMEOUT_S = 900.0  # one request (a quantization, 16 perplexity windows) that takes longer stops the worker
QUANT_TYPES = ("F16", "Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")  # what the worker's `quantize` makes


class LlamaCppPeer:
    """The worker process: `ask` sends one request and returns its reply; the typed methods name the requests.

    The worker starts at the first request and answers `{"ready": true, ...}` first (kept as `info`: its
    llama-cpp-python version and the CPU features llama.cpp was built for). A worker that dies before that sets
    `unavailable`; one that dies later (or runs over `timeout_s` on one request) is stopped, that request returns
    the reason, and the next one starts a fresh worker (its loaded models gone).
    """

    def __init__(self, python: Path, *, cache: Path, threads: int, worker: Path = WORKER,
                 timeout_s: float = REQUEST_TIMEOUT_S, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.python, self.cache, self.threads, self.worker = Path(python), Path(cache), threads, Path(worker)
        self.timeout_s, self.ready_timeout_s = timeout_s, ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self.unavailable: str | None = None if self.python.exists() else (
            f"llama.cpp peer python {self.python} not found (`make bench-llm-peer-venv` creates .venv-llm-peer)")
        fd, log = tempfile.mkstemp(prefix="llm_peer_", suffix=".log")
        os.close(fd)
        self.stderr_path = Path(log)
        self._buffer = b""

    def __enter__(self) -> LlamaCppPeer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start(self) -> bool:
        """Start the worker and wait for its ready line; False (and `unavailable` says why) if it cannot run."""
        if self.unavailable is not None:
            return False
        if self.proc is not None:
            return True
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), PYTHONUNBUFFERED="1")
        with self.stderr_path.open("wb") as log:  # a file, not a pipe: llama.cpp's logging can never block it
            self.proc = subprocess.Popen([str(self.python), str(self.worker), "--cache", str(self.cache),
                                          "--threads", str(self.threads)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=env)
        self._buffer = b""
        reply = self._reply(self.ready_timeout_s, "start")
        if not reply.get("ready"):
            self.unavailable = reply.get("error", f"the worker's first reply was not ready: {reply}")
            return False
        self.info = reply
        return True

    def ask(self, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Send one request (`{"op": ..., ...}`) and return its reply dict (`{"error": ...}` if it failed)."""
        if not self.start():
            return {"error": self.unavailable}
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._stopped(None)
        return self._reply(self.timeout_s if timeout_s is None else timeout_s, str(request.get("op")))

    def quantize(self, source: Path, qtype: str) -> dict[str, Any]:
        """`source` re-quantized to `qtype` (one of QUANT_TYPES) in the cache: `path`, `bytes`, `seconds`."""
        return self.ask({"op": "quantize", "source": str(source), "type": qtype})

    def load(self, model_id: str, path: str | Path, n_ctx: int) -> dict[str, Any]:
        """Load a GGUF as `model_id` (logits of every position kept, `threads` threads): `n_vocab`, `ftype`."""
        return self.ask({"op": "load", "id": model_id, "path": str(path), "n_ctx": n_ctx})

    def tokenize(self, model_id: str, text: str, add_bos: bool = False) -> dict[str, Any]:
        """The model's own token ids of `text`: `ids`."""
        return self.ask({"op": "tokenize", "id": model_id, "text": text, "add_bos": add_bos})

    def perplexity(self, model_id: str, windows: list[list[int]]) -> dict[str, Any]:
        """exp(mean NLL) over every predicted token of `windows`, each from a fresh state: `ppl`, `nll`, `tokens`."""
        return self.ask({"op": "perplexity", "id": model_id, "windows": [list(map(int, w)) for w in windows]})

    def prefill(self, model_id: str, ids: list[int], repeats: int = 5, logits: str = "all") -> dict[str, Any]:
        """Median seconds of evaluating `ids` from a fresh state after a warm-up: `median_s`, `times`.

        logits="all" keeps every position's logits (as loaded); "last" only the last one's, like llama.cpp's own
        prefill, so the output layer runs on one row."""
        return self.ask({"op": "prefill", "id": model_id, "ids": list(map(int, ids)), "repeats": repeats,
                         "logits": logits})

    def decode(self, model_id: str, prompt: list[int], n: int, repeats: int = 3) -> dict[str, Any]:
        """Greedy decode of `n` tokens after `prompt` (not timed), median over `repeats`: `tok_s`, `tokens`."""
        return self.ask({"op": "decode", "id": model_id, "prompt": list(map(int, prompt)), "n": n,
                         "repeats": repeats})

    def drop(self, model_id: str) -> dict[str, Any]:
        return self.ask({"op": "drop", "id": model_id})

    def close(self) -> None:
        """End the worker (closing its stdin ends its loop) and remove its stderr log."""
        if self.proc is not None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        self.stderr_path.unlink(missing_ok=True)

    def _reply(self, timeout_s: float, what: str) -> dict[str, Any]:
        """The next reply line (other stdout lines skipped), or the reason there is none (worker stopped)."""
        deadline = time.monotonic() + timeout_s
        try:
            while (line := self._line(deadline)) is not None:
                if line.startswith(REPLY):
                    return json.loads(line[len(REPLY):])
        except TimeoutError:
            return self._stopped(f"the llama.cpp worker took over {timeout_s:g} s on '{what}'")
        return self._stopped(None)

    def _line(self, deadline: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        line, self._buffer = read_line(self.proc.stdout.fileno(), self._buffer, deadline)
        return line

    def _stopped(self, why: str | None) -> dict[str, Any]:
        """Stop (or reap) the worker; `why` is None where it ended by itself: its stderr names the cause."""
        assert self.proc is not None
        if why is not None:
            self.proc.kill()
        rc = self.proc.wait()
        if why is None:
            why = ("llama.cpp worker crashed: " if self.info else "llama.cpp worker did not start: ") + error_line(
                self.stderr_path.read_text(errors="replace"), rc)
        self.proc = None
        if not self.info:
            self.unavailable = why
        return {"error": why}
