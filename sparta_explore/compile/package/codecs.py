"""Codecs for sparta-explore's own values that are not plain data: a fused epilogue's activation.

An `Act` holds two functions (in place and out of place), so it is written by its name and
rebuilt from the table in `compile.epilogue` (`act_named`).

Example:
    >>> from sparta_explore.compile.epilogue import RELU
    >>> Encoder(TensorStore()).encode(RELU, "step")
    {'$act': 'relu'}
"""

from __future__ import annotations

from typing import Any

from sparta_explore.compile.epilogue import Act, act_named
from sparta_explore.compile.package.tensors import TensorStore  # noqa: F401  (used by the docstring example)
from sparta_explore.compile.package.values import Decoder, Encoder, register_codec  # noqa: F401  (Encoder: docstring)
from sparta_explore.errors import PackageError


def _decode_act(dec: Decoder, data: Any, where: str) -> Act:
    try:
        return act_named(str(data))
    except ValueError as e:
        raise PackageError(f"{where}: {e}") from None


register_codec("act", Act, lambda enc, act, where: act.name, _decode_act)


