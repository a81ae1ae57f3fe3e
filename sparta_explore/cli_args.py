"""Argument types and the parser of the command line: bad arguments fail before any work, in one line.

Every numeric option has a type that checks its range, so `--runs 0` or `--port 99999`
is refused by argparse itself, before a model is loaded or NNI is started. The parser
prints one line (``sparta-explore sweep: error: argument --runs: must be >= 1, got 0``)
and exits with status 2, without the usage block.

Example:
    >>> positive_int("3"), port("8080")
    (3, 8080)
    >>> fraction("1.5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a number in [0, 1), got '1.5'
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

INT_BITS = (2, 3, 4, 5, 6, 7, 8)
FLOAT_BITS = 32


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (and exit status 2), naming the argument."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        self.exit(2)


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An int >= 1 (runs, trials, epochs of a budget, batch sizes)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0 (fine-tuning epochs, seeds)."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0 (minutes, targets)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value:g}")
    return value


def fraction(text: str) -> float:
    """A sparsity: a float in [0, 1)."""
    try:
        value = _number(text, float)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port number in 1..65535."""
    value = _number(text, int)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got {value}")
    return value


def bits(text: str) -> int:
    """32 (fp32) or an integer width the int8 kernels run (2..8)."""
    value = _number(text, int)
    if value != FLOAT_BITS and value not in INT_BITS:
        raise argparse.ArgumentTypeError(f"must be 32 (fp32) or 2..8 (integer kernels), got {value}")
    return value


def block(text: str) -> tuple[int, int]:
    """A block shape like 32x32 (rows x columns, both >= 1)."""
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 32x32, got {text!r}") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"block sides must be >= 1, got {text!r}")
    return rows, cols


def grid_block(text: str) -> str | None:
    """A block shape for a sweep axis, or None for 'default' / 'none' (the pruner's own granularity)."""
    if text.lower() in ("default", "none"):
        return None
    rows, cols = block(text)
    return f"{rows}x{cols}"
