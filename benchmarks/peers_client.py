"""The DeepSparse worker (`peers_deepsparse_worker.py`, in the peer venv) as a long-lived process, and turns
taken with it: `take_turns` times a block of our calls, then a block of DeepSparse's, on one case, a few times over.

On a shared machine the speed moves by up to 1.5x over seconds (Zen 3 VM, 2 cores: a 3072->768 linear ran 35-74 ms
and a dense 1024^2 matmul 16-31 ms within one minute), so one side timed after the other measured the drift as
often as the kernels; blocks of about 0.1 s each, in turns, see the same machine.
"""

from __future__ import annotations

import json
import math
import os
import select
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "peers_deepsparse_worker.py"
REPLY = b"PEER "  # the worker's reply lines start with this (peers_deepsparse_worker.REPLY)
PEER_TIMEOUT_S = 900  # one request (a compile, or a block of calls) that takes longer: the worker is stopped
BLOCK_SECONDS = 0.1  # each side's block of calls in a turn lasts about this long (at least MIN_CALLS calls)
MIN_CALLS = 3
SIGN_LEVEL = 0.05  # a side is faster where a fair coin gives as many of its turns' wins less often than this


def error_line(text: str, rc: int) -> str:
    """The line that names the error (a traceback's last 'XxxError: ...'), else the last line, else the exit."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln.split(":")[0] or "Exception" in ln.split(":")[0]]
    if named:
        return named[-1][:300]
    if rc < 0:
        return f"killed by signal {-rc}" + (f" after: {lines[-1][:200]}" if lines else "")
    return lines[-1][:300] if lines else f"exit code {rc}, no output"


class PeerServer:
    """The worker process: `ask` sends one request and returns its reply (a dict; `{"error": ...}` if it failed).

    A worker that dies (a signal in DeepSparse) is started again at the next request; one that dies
    before answering anything (no venv, an import error, an unsupported CPU) sets `unavailable`, and
    every request after that returns that reason at once.
    """

    def __init__(self, python: Path, tmp: Path, threads: int, isa: str) -> None:
        self.python, self.tmp, self.threads = python, tmp, threads
        self.env = dict(os.environ, NM_DISABLE_ANALYTICS="1", OMP_NUM_THREADS=str(threads))
        if isa != "native":
            self.env["NM_ARCH"] = isa  # DeepSparse's own switch: it loads its build for that instruction set
        self.proc: subprocess.Popen | None = None
        self.unavailable: str | None = None if python.exists() else (
            f"peer python {python} not found (`make bench-peers` creates .venv-peers)")
        self.answered = 0
        self.stderr_path = tmp / "peer_stderr.log"
        self._buffer = b""

    def _start(self) -> None:
        with self.stderr_path.open("wb") as log:  # a file, not a pipe: DeepSparse's logging can never block it
            self.proc = subprocess.Popen([str(self.python), str(WORKER), "--tmp", str(self.tmp), "--num-cores",
                                          str(self.threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, env=self.env)
        self._buffer = b""

    def _died(self, why: str | None = None) -> dict[str, Any]:
        assert self.proc is not None
        if why is not None:
            self.proc.kill()
        rc = self.proc.wait()
        reason = why or error_line(self.stderr_path.read_text(errors="replace"), rc)
        self.proc = None
        if not self.answered:
            self.unavailable = reason
        return {"error": f"worker crashed: {reason}" if why is None else reason}

    def _line(self, deadline: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        line, self._buffer = read_line(self.proc.stdout.fileno(), self._buffer, deadline)
        return line

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.unavailable is not None:
            return {"error": self.unavailable}
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + PEER_TIMEOUT_S
            while (line := self._line(deadline)) is not None:
                if line.startswith(REPLY):
                    self.answered += 1
                    return json.loads(line[len(REPLY):])
        except BrokenPipeError:
            pass
        except TimeoutError:
            return self._died(f"the worker took over {PEER_TIMEOUT_S} s on one request")
        return self._died()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc = None


@dataclass
class Turns:
    """Each side's call times (seconds) over all blocks, and DeepSparse's median over ours per block."""

    ours: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    error: str | None = None

    def ratio_range(self) -> str:
        """The lowest and highest per-block ratio, e.g. '0.93-1.08' (how much the machine moved the ratio)."""
        return f"{min(self.ratios):.2f}-{max(self.ratios):.2f}" if self.ratios else "-"

    def median_ratio(self) -> float:
        """The median of the per-block ratios (nan without any): each compares two blocks timed back to back, so a
        drift of the machine's speed over the run moves it less than the ratio of the two sides' medians."""
        return statistics.median(self.ratios) if self.ratios else math.nan

    def verdict(self) -> str:
        """'ahead' where ours won so many turns (ratio > 1) that a fair coin gives that many heads in fewer than 5%
        of runs (a one-sided sign test: 8 of 9 turns), 'behind' where DeepSparse did, else 'level'; '-' without
        turns. The turns are paired, two blocks back to back, so the machine's drift mostly cancels in each.

        Example:
            >>> Turns(ratios=[1.1] * 8 + [0.9]).verdict(), Turns(ratios=[1.1] * 7 + [0.9] * 2).verdict()
            ('ahead', 'level')
        """
        if not self.ratios:
            return "-"
        n = len(self.ratios)
        if sign_tail(sum(r > 1 for r in self.ratios), n) < SIGN_LEVEL:
            return "ahead"
        if sign_tail(sum(r < 1 for r in self.ratios), n) < SIGN_LEVEL:
            return "behind"
        return "level"


def sign_tail(wins: int, n: int) -> float:
    """P(X >= wins) for X ~ Binomial(n, 1/2): how often a fair coin wins at least `wins` of `n` turns.

    Example:
        >>> round(sign_tail(8, 9), 4), round(sign_tail(7, 9), 4)
        (0.0195, 0.0898)
    """
    return sum(math.comb(n, k) for k in range(max(wins, 0), n + 1)) / 2 ** n


def _calls(seconds_per_call: float) -> int:
    return max(MIN_CALLS, math.ceil(BLOCK_SECONDS / max(seconds_per_call, 1e-6)))


def take_turns(ours: Callable[[], Any], ours_call_s: float, peer: PeerServer, peer_id: str, peer_call_s: float,
               blocks: int, error: str | None = None) -> Turns:
    """`blocks` turns of (a block of `ours()` calls, a block of the peer's calls on `peer_id`), both warmed before.

    If the peer fails (or `error` says it could not be prepared), ours go on alone and `error` says why.
    """
    turns = Turns(error=error)
    n_ours, n_peer = _calls(ours_call_s), _calls(peer_call_s)
    for _ in range(blocks):
        mine = []
        for _ in range(n_ours):
            start = time.perf_counter()
            ours()
            mine.append(time.perf_counter() - start)
        turns.ours += mine
        if turns.error is not None:
            continue
        reply = peer.ask({"time": peer_id, "calls": n_peer})
        if "times" not in reply:
            turns.error = reply.get("error", "no times")
            continue
        turns.peer += reply["times"]
        turns.ratios.append(statistics.median(reply["times"]) / statistics.median(mine))
    return turns


def read_line(fd: int, buffer: bytes, deadline: float) -> tuple[bytes | None, bytes]:
    """(the next line a worker wrote to `fd`, without its newline, or None at end of file; what is left buffered).

    A `TimeoutError` once `deadline` (time.monotonic) passes with no whole line.

    Example:
        >>> r, w = os.pipe(); _ = os.write(w, b"a\\nb")
        >>> read_line(r, b"", time.monotonic() + 5)
        (b'a', b'b')
    """
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, buffer = buffer.split(b"\n", 1)
    return line, buffer
