"""The tensors of a package: collected once each while a model is written, rebuilt exactly when it is read.

`TensorStore` gives every distinct tensor one key (a tensor two modules share, like tied
embeddings, is stored once and comes back shared). Mostly-zero float tensors (the masked
weights a pruned model keeps for its references) are stored as a bit mask of their
non-zero *bit patterns* plus those values, so -0.0 and every NaN come back bit for bit.
Channels-last tensors come back channels-last. The arrays go to one safetensors file:
plain data, never a pickle.

Example:
    >>> store = TensorStore(); key = store.add(torch.zeros(3)); arrays, meta = store.arrays()
    >>> TensorTable(arrays, meta, "t").get(key).tolist()
    [0.0, 0.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from sparta_explore.errors import PackageError

SPARSE_MIN_NUMEL = 4096
SPARSE_MAX_DENSITY = 0.5
_INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def _layout(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "strided"  # stored contiguous: same values, other strides


def _nonzero_bits(t: torch.Tensor) -> torch.Tensor | None:
    """Where the tensor's bit pattern is not all zero (so -0.0 counts as a value), for float tensors."""
    view = _INT_VIEW.get(t.dtype)
    return None if view is None else t.contiguous().view(view) != 0


class TensorStore:
    """Collects the tensors of a model being written; `add` gives a tensor's key (the same key for the same tensor)."""

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        self._seen: dict[tuple, str] = {}

    def add(self, t: torch.Tensor) -> str:
        """The key of `t` (stored on first sight).

        Example:
            >>> s = TensorStore(); t = torch.ones(2); s.add(t) == s.add(t)
            True
        """
        if t.device.type != "cpu":
            t = t.cpu()
        if t.is_quantized or t.is_sparse or t.is_nested:
            raise PackageError(f"a {t.layout} / quantized tensor cannot be saved (only dense CPU tensors)")
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype) \
            if t.numel() else None
        if ident is not None and ident in self._seen:
            return self._seen[ident]
        key = f"t{len(self._tensors)}"
        self._tensors[key] = t.detach()
        if ident is not None:
            self._seen[ident] = key
        return key

    def arrays(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
        """(arrays for safetensors, per-key metadata): sparse tensors split, everything contiguous and unshared.

        Example:
            >>> arrays, meta = TensorStore().arrays(); arrays, meta
            ({}, {})
        """
        arrays: dict[str, torch.Tensor] = {}
        meta: dict[str, dict[str, Any]] = {}
        for key, t in self._tensors.items():
            info: dict[str, Any] = {"layout": _layout(t), "shape": list(t.shape), "dtype": str(t.dtype)[6:]}
            flat = t.contiguous()
            nz = _nonzero_bits(flat) if flat.numel() >= SPARSE_MIN_NUMEL else None
            if nz is not None and float(nz.float().mean()) <= SPARSE_MAX_DENSITY:
                bits = np.packbits(nz.reshape(-1).numpy())
                arrays[f"{key}.mask"] = torch.from_numpy(bits)
                arrays[f"{key}.values"] = flat.reshape(-1)[nz.reshape(-1)].clone()
                info["sparse"] = True
            else:
                # a fresh copy: safetensors refuses tensors that share memory, and views of one storage do
                arrays[key] = flat.clone()
            meta[key] = info
        return arrays, meta


class TensorTable:
    """The tensors of a package being read, rebuilt on first use; `file` names the package in errors."""

    def __init__(self, arrays: Mapping[str, torch.Tensor], meta: Mapping[str, Mapping[str, Any]], file: str) -> None:
        self._arrays, self._meta, self._file = arrays, meta, file
        self._built: dict[str, torch.Tensor] = {}
        self._parameters: dict[str, torch.nn.Parameter] = {}

    def get(self, key: str) -> torch.Tensor:
        """The tensor stored under `key` (the same object for every reference to it).

        Example:
            >>> TensorTable({}, {}, "m.sparta").get("t0")
            Traceback (most recent call last):
            ...
            sparta_explore.errors.PackageError: m.sparta: tensor 't0' is referenced but not stored
        """
        if key in self._built:
            return self._built[key]
        info = self._meta.get(key)
        if not isinstance(info, Mapping):
            raise PackageError(f"{self._file}: tensor {key!r} is referenced but not stored")
        try:
            t = self._rebuild(key, info)
        except (KeyError, RuntimeError, ValueError, TypeError) as e:
            raise PackageError(f"{self._file}: tensor {key!r} cannot be rebuilt ({type(e).__name__}: {e})") from None
        self._built[key] = t
        return t

    def parameter(self, key: str, requires_grad: bool) -> torch.nn.Parameter:
        """The parameter over tensor `key`: one object for every reference, so tied weights stay tied.

        Example:
            >>> store = TensorStore(); key = store.add(torch.ones(2)); table = TensorTable(*store.arrays(), "m")
            >>> table.parameter(key, True) is table.parameter(key, True)
            True
        """
        if key not in self._parameters:
            self._parameters[key] = torch.nn.Parameter(self.get(key), requires_grad=requires_grad)
        return self._parameters[key]

    def _rebuild(self, key: str, info: Mapping[str, Any]) -> torch.Tensor:
        shape = tuple(int(s) for s in info["shape"])
        dtype = getattr(torch, str(info["dtype"]))
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {info['dtype']!r}")
        if info.get("sparse"):
            values = self._arrays[f"{key}.values"]
            numel = int(np.prod(shape, dtype=np.int64))
            nz = torch.from_numpy(np.unpackbits(self._arrays[f"{key}.mask"].numpy())[:numel].astype(bool))
            if int(nz.sum()) != values.numel() or values.dtype != dtype:
                raise ValueError("its mask and values disagree")
            flat = torch.zeros(numel, dtype=dtype)
            flat[nz] = values
            t = flat.reshape(shape)
        else:
            t = self._arrays[key]
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"stored as {tuple(t.shape)} {t.dtype}, recorded as {shape} {dtype}")
        if info.get("layout") == "channels_last":
            t = t.contiguous(memory_format=torch.channels_last)
        return t
