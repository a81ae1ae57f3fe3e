"""Plain values as JSON: what a module's attributes and a graph's arguments hold, written and read without pickle.

JSON's own types pass as they are; everything else is an object with one `$tag` key, one
codec per tag in `CODECS` (tuples, dicts with any keys, sets, non-finite floats, slices,
dtypes, devices, memory formats, sizes, paths, tensors and parameters by key in the tensor
store, numpy arrays, graph nodes by name, functions and classes by qualified name, frozen
dataclasses field by field, kernel libraries by key). Other modules add codecs for their own
types (`register_codec`; `codecs.py`: activations of fused epilogues). A registered type wins
over the fallbacks (classes, dataclasses, functions). A value no codec takes is a
`PackageError` naming where it sits.

Example:
    >>> enc = Encoder(TensorStore()); data = enc.encode((1.5, float("inf"), torch.float32), "x")
    >>> data
    {'$tuple': [1.5, {'$float': 'inf'}, {'$dtype': 'float32'}]}
    >>> Decoder(TensorTable({}, {}, "m")).decode(data, "x")
    (1.5, inf, torch.float32)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from sparta_explore.compile.package.names import qualified_name, resolve, resolve_class
from sparta_explore.compile.package.tensors import TensorStore, TensorTable
from sparta_explore.errors import PackageError


@dataclass(frozen=True)
class Codec:
    """How one kind of value is written (`encode(encoder, value, where)`) and read (`decode(decoder, data, where)`)."""

    kind: type | tuple[type, ...]
    encode: Callable[[Encoder, Any, str], Any]
    decode: Callable[[Decoder, Any, str], Any]


CODECS: dict[str, Codec] = {}
FALLBACKS = ("class", "dataclass", "callable")  # tried after every other codec: a registered type wins over them


def register_codec(tag: str, kind: type | tuple[type, ...], encode: Callable[[Encoder, Any, str], Any],
                   decode: Callable[[Decoder, Any, str], Any]) -> None:
    """Teach the package a value type: `{"$<tag>": encode(...)}` on write, `decode(...)` on read.

    Example:
        >>> register_codec("complex", complex, lambda e, v, w: [v.real, v.imag], lambda d, v, w: complex(*v))
    """
    CODECS[tag] = Codec(kind, encode, decode)


class Encoder:
    """Writes values to JSON, tensors into `store`; `library` names a kernel library (see `package.kernels`)."""

    def __init__(self, store: TensorStore, library: Callable[[Any, str], str] | None = None,
                 allow: Collection[str] = ()) -> None:
        self.store, self.library, self.allow = store, library, tuple(allow)

    def encode(self, value: Any, where: str) -> Any:
        """`value` as JSON data; `where` says what holds it (errors name it).

        Example:
            >>> Encoder(TensorStore()).encode({"a": [1, None]}, "x")
            {'$dict': {'a': [1, None]}}
        """
        if value is None or isinstance(value, (bool, int, str)) and type(value) in (bool, int, str):
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"$float": str(value)}
        if isinstance(value, list):  # fx's immutable_list too: a graph rebuilds its own
            return [self.encode(v, where) for v in value]
        for tag in (*(t for t in CODECS if t not in FALLBACKS), *FALLBACKS):
            codec = CODECS[tag]
            if isinstance(value, codec.kind):
                return {f"${tag}": codec.encode(self, value, where)}
        raise PackageError(f"{where}: a {type(value).__module__}.{type(value).__qualname__} value cannot be saved "
                           f"({value!r:.80})")


class Decoder:
    """Reads values written by `Encoder`; tensors from `tensors`, graph nodes from `nodes`, kernel libraries from
    `library`; classes and functions only under the trusted roots and `allow`."""

    def __init__(self, tensors: TensorTable, *, allow: Collection[str] = (), nodes: Mapping[str, fx.Node] | None = None,
                 library: Callable[[str, str], Any] | None = None) -> None:
        self.tensors, self.allow, self.nodes, self.library = tensors, tuple(allow), nodes, library

    def with_nodes(self, nodes: Mapping[str, fx.Node]) -> Decoder:
        """The same decoder reading node references from `nodes` (one graph's)."""
        return Decoder(self.tensors, allow=self.allow, nodes=nodes, library=self.library)

    def decode(self, data: Any, where: str) -> Any:
        """The value `data` encodes.

        Example:
            >>> Decoder(TensorTable({}, {}, "m")).decode({"$slice": [None, 2, None]}, "x")
            slice(None, 2, None)
        """
        if data is None or type(data) in (bool, int, float, str):
            return data
        if type(data) is list:
            return [self.decode(v, where) for v in data]
        if type(data) is dict and len(data) == 1:
            (tag, payload), = data.items()
            codec = CODECS.get(tag[1:]) if tag.startswith("$") else None
            if codec is not None:
                return codec.decode(self, payload, where)
        raise PackageError(f"{where}: unreadable value {data!r:.80}")


def _checked(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise PackageError(f"{where}: malformed {what}")


def _encode_dataclass(enc: Encoder, value: Any, where: str) -> dict:
    cls = type(value)
    if not cls.__dataclass_params__.frozen:
        raise PackageError(f"{where}: {qualified_name(cls)} is a mutable dataclass (only frozen values are saved)")
    return {"class": code_name(enc, cls, where),
            "fields": {f.name: enc.encode(getattr(value, f.name), where) for f in dataclasses.fields(value)
                       if f.init}}


def _decode_dataclass(dec: Decoder, data: Any, where: str) -> Any:
    _checked(isinstance(data, dict) and isinstance(data.get("fields"), dict), where, "dataclass")
    cls = resolve_class(data["class"], where, object, dec.allow)
    if not dataclasses.is_dataclass(cls):
        raise PackageError(f"{where}: {data['class']!r} is not a dataclass")
    try:
        return cls(**{k: dec.decode(v, where) for k, v in data["fields"].items()})
    except (TypeError, ValueError) as e:
        raise PackageError(f"{where}: {data['class']} rejects its stored fields ({e})") from None


class _DataclassMeta(type):
    def __instancecheck__(cls, value: Any) -> bool:
        return dataclasses.is_dataclass(value) and not isinstance(value, type)


class DataclassValue(metaclass=_DataclassMeta):
    """`isinstance(x, DataclassValue)`: x is a dataclass instance."""


class _CallableMeta(type):
    def __instancecheck__(cls, value: Any) -> bool:
        return callable(value) and not isinstance(value, (type, torch.nn.Module))


class FunctionValue(metaclass=_CallableMeta):
    """`isinstance(x, FunctionValue)`: x is a function, builtin or op overload (saved by name)."""


def _decode_tensor(dec: Decoder, data: Any, where: str) -> torch.Tensor:
    _checked(isinstance(data, str), where, "tensor reference")
    return dec.tensors.get(data)


def _encode_param(enc: Encoder, p: torch.nn.Parameter, where: str) -> dict:
    return {"key": enc.store.add(p.data), "grad": bool(p.requires_grad)}


def _decode_param(dec: Decoder, data: Any, where: str) -> torch.nn.Parameter:
    _checked(isinstance(data, dict) and isinstance(data.get("key"), str), where, "parameter")
    return dec.tensors.parameter(data["key"], bool(data.get("grad", False)))


def _encode_ndarray(enc: Encoder, a: np.ndarray, where: str) -> str:
    if a.dtype == object:
        raise PackageError(f"{where}: a numpy object array cannot be saved")
    return enc.store.add(torch.from_numpy(np.ascontiguousarray(a)))


def _decode_float(dec: Decoder, data: Any, where: str) -> float:
    try:
        return float(data)
    except (TypeError, ValueError):
        raise PackageError(f"{where}: malformed float {data!r:.40}") from None


def _decode_int(dec: Decoder, data: Any, where: str) -> int:
    _checked(type(data) is int, where, "integer")
    return data


def code_name(enc: Encoder, value: Any, where: str) -> str:
    """The qualified name of a function or class, checked to lead back to it (a lambda or local class has none)."""
    name = qualified_name(value)
    try:
        found = resolve(name, where, enc.allow)
    except PackageError as e:
        raise PackageError(f"{e} (while saving; a lambda or a local function cannot be saved)") from None
    if found is not value and getattr(found, "__name__", None) != getattr(value, "__name__", object()):
        raise PackageError(f"{where}: {name!r} does not lead back to {value!r:.60} (a lambda or a local function "
                           "cannot be saved)")
    return name


def _encode_dict(enc: Encoder, d: dict, where: str) -> Any:
    if all(type(k) is str for k in d):
        return {k: enc.encode(v, where) for k, v in d.items()}
    return [[enc.encode(k, where), enc.encode(v, where)] for k, v in d.items()]


def _decode_dict(dec: Decoder, data: Any, where: str) -> dict:
    if isinstance(data, dict):
        return {k: dec.decode(v, where) for k, v in data.items()}
    _checked(isinstance(data, list) and all(isinstance(p, list) and len(p) == 2 for p in data), where, "dict")
    return {_hashable(dec.decode(k, where)): dec.decode(v, where) for k, v in data}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _decode_dtype(dec: Decoder, data: Any, where: str) -> torch.dtype:
    dtype = getattr(torch, str(data), None)
    _checked(isinstance(dtype, torch.dtype), where, f"dtype {data!r}")
    return dtype


def _decode_memory_format(dec: Decoder, data: Any, where: str) -> torch.memory_format:
    fmt = getattr(torch, str(data), None)
    _checked(isinstance(fmt, torch.memory_format), where, f"memory format {data!r}")
    return fmt


def _decode_layout(dec: Decoder, data: Any, where: str) -> torch.layout:
    layout = getattr(torch, str(data), None)
    _checked(isinstance(layout, torch.layout), where, f"layout {data!r}")
    return layout


def _decode_node(dec: Decoder, data: Any, where: str) -> fx.Node:
    if dec.nodes is None or data not in dec.nodes:
        raise PackageError(f"{where}: refers to graph node {data!r}, which is not defined before it")
    return dec.nodes[data]


def _decode_library(dec: Decoder, data: Any, where: str) -> Any:
    if dec.library is None:
        raise PackageError(f"{where}: a kernel library reference outside a model")
    return dec.library(data, where)


def _encode_library(enc: Encoder, value: Any, where: str) -> str:
    if enc.library is None:
        raise PackageError(f"{where}: a kernel library outside a model")
    return enc.library(value, where)


def _torch_name(value: Any) -> str:
    return str(value).replace("torch.", "")


def _install() -> None:
    from sparta_explore.kernels.build import BuiltLibrary

    # Order matters: the first codec whose kind matches a value encodes it (Parameter before Tensor, bool and
    # int before float are JSON already; Size before tuple; dataclasses and functions last).
    table: list[tuple[str, Any, Callable, Callable]] = [
        ("float", (float, np.floating), lambda e, v, w: str(float(v)), _decode_float),
        ("int", (int, np.integer), lambda e, v, w: int(v), _decode_int),
        ("param", torch.nn.Parameter, _encode_param, _decode_param),
        ("tensor", torch.Tensor, lambda e, v, w: e.store.add(v), _decode_tensor),
        ("ndarray", np.ndarray, _encode_ndarray, lambda d, v, w: _decode_tensor(d, v, w).numpy()),
        ("size", torch.Size, lambda e, v, w: list(v), lambda d, v, w: torch.Size(v)),
        ("tuple", tuple, lambda e, v, w: [e.encode(x, w) for x in v], lambda d, v, w: tuple(d.decode(v, w))),
        ("dict", dict, _encode_dict, _decode_dict),
        ("set", set, lambda e, v, w: [e.encode(x, w) for x in v], lambda d, v, w: set(d.decode(v, w))),
        ("frozenset", frozenset, lambda e, v, w: sorted((e.encode(x, w) for x in v), key=repr),
         lambda d, v, w: frozenset(_hashable(x) for x in d.decode(v, w))),
        ("slice", slice, lambda e, v, w: [e.encode(x, w) for x in (v.start, v.stop, v.step)],
         lambda d, v, w: slice(*d.decode(v, w))),
        ("ellipsis", type(Ellipsis), lambda e, v, w: True, lambda d, v, w: Ellipsis),
        ("dtype", torch.dtype, lambda e, v, w: _torch_name(v), _decode_dtype),
        ("device", torch.device, lambda e, v, w: str(v), lambda d, v, w: torch.device(str(v))),
        ("memory_format", torch.memory_format, lambda e, v, w: _torch_name(v), _decode_memory_format),
        ("layout", torch.layout, lambda e, v, w: _torch_name(v), _decode_layout),
        ("path", PurePath, lambda e, v, w: str(v), lambda d, v, w: Path(str(v))),
        ("node", fx.Node, lambda e, v, w: v.name, _decode_node),
        ("library", BuiltLibrary, _encode_library, _decode_library),
        ("class", type, code_name, lambda d, v, w: resolve(str(v), w, d.allow)),
        ("dataclass", DataclassValue, _encode_dataclass, _decode_dataclass),
        ("callable", FunctionValue, code_name, lambda d, v, w: resolve(str(v), w, d.allow)),
    ]
    for tag, kind, encode, decode in table:
        register_codec(tag, kind, encode, decode)


_install()
