"""llama.cpp side of the LLM benchmarks (`benchmarks/llm_peer.py` drives it): runs only inside the peer venv
(.venv-llm-peer, `make bench-llm-peer-venv`), never the project's: llama-cpp-python is never a project dependency.

A server on stdin/stdout, one JSON object a line, so that the caller keeps one llama.cpp process (and its loaded
models) for a whole run and can take turns with it. On start it replies `{"ready": true, ...}` (versions, the
llama.cpp build's CPU features); then one reply per request, each `{"op": ..., ...}`:

* `{"op": "quantize", "source": gguf, "type": "Q4_K_M"}`: re-quantize `source` to a llama.cpp type (F16, Q8_0,
  Q6_K, Q4_K_M, Q4_0, Q3_K_M, Q2_K) with `llama_model_quantize` (`allow_requantize`: the shipped SmolLM2 is
  already Q4_1) into the cache folder, unless it is there already. Reply: `path`, `bytes`, `seconds`, `cached`.
* `{"op": "load", "id", "path", "n_ctx"}`: `Llama(path, n_ctx, n_threads=T, n_threads_batch=T, n_batch=512,
  logits_all=True)`. Reply: `n_vocab`, `n_ctx`, `ftype` (llama.cpp's name of the file's type), `seconds`.
* `{"op": "tokenize", "id", "text", "add_bos"}`: the model's own token ids, `{"ids": [...]}`.
* `{"op": "perplexity", "id", "windows": [[ids]]}`: each window from a fresh state, the logits of positions
  0..n-2 scoring tokens 1..n-1 (log-softmax in float64). Reply: `ppl` (exp of the mean NLL over every scored
  token of every window), `nll`, `tokens`, `window_nll` (each window's mean), `seconds`.
* `{"op": "prefill", "id", "ids", "repeats", "logits": "all" | "last"}`: seconds of `eval(ids)` from a fresh
  state, after one warm-up. "all" (default) keeps the logits of every position, as the model is loaded for
  perplexity; "last" asks llama.cpp for the last position's only, as its own prefill does (the output layer then
  runs on one row, not all). Reply: `median_s`, `times`.
* `{"op": "decode", "id", "prompt", "n", "repeats"}`: greedy generation of `n` tokens after `prompt` (evaluated
  first, not timed): each step is `eval([token])` and an argmax of its logits. Reply: `tok_s` (n over the median
  decode time), `median_s`, `times`, `tokens` (the ids generated, to compare with ours).
* `{"op": "drop", "id"}`: free the model.

Replies go to a private copy of stdout and start with `PEER `; the process's own stdout (fd 1) points at stderr,
so whatever llama.cpp or Python prints can never break a reply line. A request that fails replies
`{"op", "error": "XxxError: ...", "trace"}` (one line naming the thing at fault) and the server goes on.

    .venv-llm-peer/bin/python benchmarks/llm_llamacpp_worker.py --cache DIR --threads 2 < requests
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

REPLY = "PEER "  # llm_peer.REPLY: the client reads only lines that start with this
QUANT_TYPES = ("F16", "Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
N_BATCH = 512
NLL_ROWS = 64  # rows of logits turned to float64 at once (a 49152-token vocabulary: 25 MB)


@dataclass
class Worker:
    """What the requests share: the llama_cpp module, the loaded models by id, the cache folder, the threads."""

    lib: Any
    cache: Path
    threads: int
    models: dict[str, Any] = field(default_factory=dict)

    def model(self, model_id: str) -> Any:
        if model_id not in self.models:
            raise KeyError(f"no model '{model_id}' loaded (loaded: {sorted(self.models) or 'none'})")
        return self.models[model_id]


Handler = Callable[[Worker, dict[str, Any]], dict[str, Any]]
HANDLERS: dict[str, Handler] = {}


def handles(op: str) -> Callable[[Handler], Handler]:
    """Register `fn` as the handler of requests `{"op": op}`."""

    def register(fn: Handler) -> Handler:
        HANDLERS[op] = fn
        return fn

    return register


def existing_gguf(path: str) -> Path:
    gguf = Path(path)
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF not found: {gguf}")
    return gguf


def window_nll(logits: np.ndarray, ids: np.ndarray) -> tuple[float, int]:
    """Summed NLL of ids[1:] under the logits of positions 0..n-2 (log-softmax in float64), and its token count.

    Example:
        >>> window_nll(np.zeros((3, 4), np.float32), np.array([0, 1, 2]))  # uniform over 4: log 4 per token
        (2.772588722239781, 2)
    """
    n = len(ids)
    total = 0.0
    for start in range(0, n - 1, NLL_ROWS):
        stop = min(start + NLL_ROWS, n - 1)
        rows = logits[start:stop].astype(np.float64)
        peak = rows.max(axis=1)
        lse = peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))
        total += float((lse - rows[np.arange(stop - start), ids[start + 1:stop + 1]]).sum())
    return total, n - 1


def fresh_eval(llm: Any, ids: list[int]) -> None:
    """Evaluate `ids` from an empty state: `reset` sets the position to 0, and `eval` drops the KV cache from it."""
    llm.reset()
    llm.eval(ids)


def check_fits(llm: Any, n: int, what: str) -> None:
    if n > llm.n_ctx():
        raise ValueError(f"{what} needs {n} positions, the model was loaded with n_ctx={llm.n_ctx()}")
    if n < 1:
        raise ValueError(f"{what} is empty")


@handles("quantize")
def quantize(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    """Re-quantize a GGUF into the cache (kept there: a later run reuses it)."""
    qtype = request["type"]
    if qtype not in QUANT_TYPES:
        raise ValueError(f"unknown llama.cpp type '{qtype}'; one of {', '.join(QUANT_TYPES)}")
    source = existing_gguf(request["source"])
    out = worker.cache / f"{source.stem}.{qtype}.gguf"
    start, cached = time.perf_counter(), out.is_file()
    if not cached:
        worker.cache.mkdir(parents=True, exist_ok=True)
        params = worker.lib.llama_model_quantize_default_params()
        params.ftype = getattr(worker.lib, f"LLAMA_FTYPE_MOSTLY_{qtype}")
        params.nthread = worker.threads
        params.allow_requantize = True
        partial = out.with_suffix(".part")
        rc = worker.lib.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
        if rc != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"llama_model_quantize({source.name} -> {qtype}) returned {rc}")
        partial.rename(out)
    return {"path": str(out), "type": qtype, "bytes": out.stat().st_size, "cached": cached,
            "seconds": time.perf_counter() - start}


@handles("load")
def load(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    path = existing_gguf(request["path"])
    start = time.perf_counter()
    llm = worker.lib.Llama(model_path=str(path), n_ctx=int(request["n_ctx"]), n_threads=worker.threads,
                           n_threads_batch=worker.threads, n_batch=N_BATCH, logits_all=True, verbose=False)
    worker.models[request["id"]] = llm
    ftype = worker.lib.llama_ftype_name(worker.lib.llama_model_ftype(llm.model))
    return {"id": request["id"], "n_vocab": llm.n_vocab(), "n_ctx": llm.n_ctx(),
            "ftype": ftype.decode() if ftype else "?", "seconds": time.perf_counter() - start}


@handles("tokenize")
def tokenize(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    llm = worker.model(request["id"])
    return {"ids": llm.tokenize(request["text"].encode(), add_bos=bool(request.get("add_bos", False)))}


@handles("perplexity")
def perplexity(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    llm = worker.model(request["id"])
    start, total, count, per_window = time.perf_counter(), 0.0, 0, []
    for window in request["windows"]:
        check_fits(llm, len(window), "a perplexity window")
        if len(window) < 2:
            raise ValueError("a perplexity window needs at least 2 tokens")
        fresh_eval(llm, window)
        nll, n = window_nll(llm.scores[:len(window)], np.asarray(window))
        total, count = total + nll, count + n
        per_window.append(nll / n)
    return {"ppl": math.exp(total / count), "nll": total / count, "tokens": count, "window_nll": per_window,
            "seconds": time.perf_counter() - start}


@handles("prefill")
def prefill(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    llm, ids = worker.model(request["id"]), list(request["ids"])
    check_fits(llm, len(ids), "the prompt")
    logits = request.get("logits", "all")
    if logits not in ("all", "last"):
        raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
    keep = llm._logits_all  # llama-cpp-python's switch for the batch's logits flags; no public one per call
    llm._logits_all = logits == "all"
    try:
        times = []
        for _ in range(1 + int(request.get("repeats", 5))):
            start = time.perf_counter()
            fresh_eval(llm, ids)
            times.append(time.perf_counter() - start)
    finally:
        llm._logits_all = keep
    return {"median_s": statistics.median(times[1:]), "times": times[1:], "tokens": len(ids)}


@handles("decode")
def decode(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    llm, prompt, n = worker.model(request["id"]), list(request["prompt"]), int(request["n"])
    check_fits(llm, len(prompt) + n, "the prompt and its generation")
    times, tokens = [], []
    for _ in range(1 + int(request.get("repeats", 3))):
        fresh_eval(llm, prompt)
        token, tokens = int(np.argmax(llm.scores[llm.n_tokens - 1])), []
        start = time.perf_counter()
        for _ in range(n):
            tokens.append(token)
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        times.append(time.perf_counter() - start)
    median = statistics.median(times[1:])
    return {"tok_s": n / median, "median_s": median, "times": times[1:], "tokens": tokens}


@handles("drop")
def drop(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    llm = worker.models.pop(request["id"], None)
    if llm is not None:
        llm.close()
    return {"id": request["id"], "dropped": llm is not None}


def answer(worker: Worker, request: dict[str, Any]) -> dict[str, Any]:
    """One request's reply; an exception becomes `{"error": "XxxError: first line", "trace"}`."""
    op = request.get("op")
    try:
        if op not in HANDLERS:
            raise ValueError(f"unknown op {op!r}; one of {', '.join(HANDLERS)}")
        reply = HANDLERS[op](worker, request)
    except Exception as exc:  # one request failing (a missing file, a bad type) must not stop the server
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        reply = {"error": f"{type(exc).__name__}: {text}".splitlines()[0], "trace": traceback.format_exc(limit=3)}
    return {"op": op, **reply}


def serve(worker: Worker, lines: Iterable[str], out: TextIO) -> None:
    """Answer each JSON line of `lines` with one `PEER {...}` line on `out`."""
    for line in lines:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            reply = {"op": None, "error": f"JSONDecodeError: {exc} in {line.strip()[:80]!r}"}
        else:
            reply = answer(worker, request)
        out.write(REPLY + json.dumps(reply) + "\n")
        out.flush()


def private_stdout() -> TextIO:
    """A copy of fd 1 for the replies; fd 1 itself (and sys.stdout) then writes to stderr, where llama.cpp's and
    Python's stray prints land without ever splitting a reply line."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(2, 1)
    return replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="folder for the re-quantized GGUF files")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = private_stdout()
    import llama_cpp  # here, not at the top: the tests import this module's functions without llama.cpp

    worker = Worker(lib=llama_cpp, cache=args.cache, threads=args.threads)
    info = llama_cpp.llama_print_system_info()
    out.write(REPLY + json.dumps({"ready": True, "llama_cpp": llama_cpp.__version__, "threads": args.threads,
                                  "system_info": info.decode() if info else "", "numpy": np.__version__}) + "\n")
    out.flush()
    serve(worker, sys.stdin, out)


if __name__ == "__main__":
    main()
