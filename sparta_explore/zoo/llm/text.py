"""Real English text that ships with Python, cut into fixed token windows for calibration and evaluation.

The text is `pydoc_data.topics.topics` (79 help topics, ~465 KB of English prose and code in
CPython 3.11). Its topics, sorted by key, are split by position: even-indexed topics are
the "calibration" split, odd-indexed the "evaluation" split, so no text is in both. A split
becomes windows exactly so:

    text = "\\n\\n".join(topics[k] for k in sorted(topics)[parity::2])   # parity 0 / 1
    ids = tokenizer.encode(text, add_special_tokens=False)                # one id stream
    windows = ids[: n * seq_len] as (n, seq_len), n = len(ids) // seq_len  # remainder dropped

No special tokens are added and windows do not overlap. The text differs between CPython
versions (`text_source()` names the one in use): windows are deterministic for one version.
With SmolLM2's tokenizer on CPython 3.11.7 the calibration split is 61,785 tokens (120 windows
of 512) and the evaluation split 51,322 (100 windows).

Example:
    >>> text_windows(ByteTokenizer(), "evaluation", seq_len=64, count=2).shape
    torch.Size([2, 64])
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from sparta_explore.errors import ConfigError

SPLITS = {"calibration": 0, "evaluation": 1}  # split -> parity of the sorted topic index


class ByteTokenizer:
    """Text as its UTF-8 bytes (ids 0-255): a tokenizer that needs no package, for small random models in tests.

    Example:
        >>> ByteTokenizer().encode("hé", add_special_tokens=False)
        [104, 195, 169]
    """

    vocab_size = 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Any) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def text_source() -> str:
    """Where the text comes from, with the Python version (the text changes between versions).

    Example:
        >>> text_source().startswith("pydoc_data.topics, CPython ")
        True
    """
    return f"pydoc_data.topics, {platform.python_implementation()} {platform.python_version()}"


def split_text(split: str) -> str:
    """The text of `split` ("calibration" or "evaluation"): its topics, sorted by key, joined by blank lines.

    Example:
        >>> len(split_text("calibration")) > 100_000
        True
    """
    from pydoc_data.topics import topics

    if split not in SPLITS:
        raise ConfigError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    keys = sorted(topics)[SPLITS[split]::2]
    return "\n\n".join(topics[k] for k in keys)


def token_stream(tokenizer: Any, split: str) -> torch.Tensor:
    """The ids of `split`'s text, tokenized in one call without special tokens, as a 1-D LongTensor.

    Example:
        >>> ids = token_stream(ByteTokenizer(), "evaluation")
        >>> ids.dim(), ids.dtype, len(ids) == len(split_text("evaluation").encode("utf-8"))
        (1, torch.int64, True)
    """
    ids = tokenizer.encode(split_text(split), add_special_tokens=False)
    return torch.as_tensor(ids, dtype=torch.long)


def text_windows(tokenizer: Any, split: str, seq_len: int = 512, count: int | None = None, *,
                 start: int = 0) -> torch.Tensor:
    """Windows `start .. start + count` of `split` (all from `start` when `count` is None), as (count, seq_len) ids.

    `tokenizer` is anything with ``encode(text, add_special_tokens=False) -> list[int]`` (a
    Hugging Face tokenizer, `ByteTokenizer`). Asking for windows past the end is a
    `ConfigError` that says how many the split has.

    Example:
        >>> w = text_windows(ByteTokenizer(), "calibration", seq_len=128, count=3, start=1)
        >>> w.shape, w.dtype
        (torch.Size([3, 128]), torch.int64)
    """
    return cut_windows(token_stream(tokenizer, split), seq_len, count, start=start, what=f"the {split} split")


def cut_windows(ids: torch.Tensor, seq_len: int, count: int | None = None, *, start: int = 0,
                what: str = "the id stream") -> torch.Tensor:
    """Windows `start .. start + count` of `seq_len` ids from the 1-D `ids` (no overlap, remainder dropped).

    Example:
        >>> cut_windows(torch.arange(10), 3, start=1).tolist()
        [[3, 4, 5], [6, 7, 8]]
        >>> cut_windows(torch.arange(10), 3, 4)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: the id stream has 3 windows of 3 tokens (10 tokens, ...); asked for 4 ...
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ConfigError(f"seq_len must be an integer >= 2 (a window predicts its tokens after the first), "
                          f"got {seq_len!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ConfigError(f"start must be a non-negative integer, got {start!r}")
    available = len(ids) // seq_len
    count = available - start if count is None else count
    if isinstance(count, bool) or not isinstance(count, int) or count < 1 or start + count > available:
        raise ConfigError(f"{what} has {available} windows of {seq_len} tokens ({len(ids)} tokens, "
                          f"{text_source()}); asked for {count!r} from window {start}")
    return ids[start * seq_len:(start + count) * seq_len].reshape(count, seq_len).clone()
