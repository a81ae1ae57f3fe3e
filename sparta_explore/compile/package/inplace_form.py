"""The package of a model compiled in place: its kernels by module path, its other weights, how to rebuild it.

The user's own model class holds code a package never carries, so the package keeps:

* ``identity``: the model's class name, and for a Hugging Face model its config (JSON), from
  which `load` builds a fresh instance when no `model` is given;
* ``kernels``: one module record per path that holds a kernel (`modules.py`);
* ``state``: every other weight and buffer of the model's `state_dict`, by name;
* the example (run with the KV cache off, as compile checked it), report and tables.

Loading puts the weights into the fresh model (nothing may be missing but the kernels'
paths, nothing left over), the kernels at their paths, runs the example against the saved
outputs, and hands back the model itself: `generate`, `config` and hooks work as before.

Example:
    >>> save_inplace(model, Path("llama.sparta"))                       # doctest: +SKIP
    >>> model = load("llama.sparta")  # a Hugging Face model: rebuilt from its config   # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from sparta_explore.compile.inplace import ATTRIBUTE, InPlaceCompile
from sparta_explore.compile.package.archive import write_package
from sparta_explore.compile.package.kernels import LibraryCollector
from sparta_explore.compile.package.modules import decode_module, encode_module
from sparta_explore.compile.package.names import qualified_name, resolve_class
from sparta_explore.compile.package.parts import (
    INPUT_TABLE,
    TABLE,
    example_call,
    example_record,
    frame_from,
    manifest,
    package_parts,
    read_table,
    report_record,
)
from sparta_explore.compile.package.reading import OpenedPackage, checked_example, load_notes
from sparta_explore.compile.package.tensors import TensorStore
from sparta_explore.compile.package.values import Encoder
from sparta_explore.compile.record import CompileRecord
from sparta_explore.errors import PackageError
from sparta_explore.kernels.compiled_op import CompiledOp
from sparta_explore.module_tree import put_module
from sparta_explore.tracing.kv_cache import kv_cache_off


def model_identity(model: nn.Module) -> dict[str, Any]:
    """The model's class name and, for a Hugging Face model, its config: what `fresh_model` rebuilds it from.

    Example:
        >>> model_identity(nn.Linear(2, 2))
        {'class': 'torch.nn.modules.linear.Linear'}
    """
    cls = type(model)
    identity: dict[str, Any] = {"class": qualified_name(cls)}
    config = getattr(model, "config", None)
    if cls.__module__.startswith("transformers.") and hasattr(config, "to_json_string"):
        identity["config_class"] = qualified_name(type(config))
        identity["config"] = json.loads(config.to_json_string(use_diff=False))
    return identity


def _under(name: str, paths: Collection[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in paths)


def _run_without_cache(model: nn.Module):
    def run(*args: Any, **kwargs: Any) -> Any:
        with kv_cache_off(model):  # what compile checked: a generative model's logits, no cache object
            return model(*args, **kwargs)
    return run


def save_inplace(model: nn.Module, path: Path, *, metadata: Mapping[str, Any] | None = None,
                 allow: Collection[str] = ()) -> Path:
    """Write a model compiled in place (`model.sparta_compiled`) to the package `path` (see the module docstring).

    Example:
        >>> save_inplace(model, Path("m.sparta"))   # doctest: +SKIP
    """
    info: InPlaceCompile = getattr(model, ATTRIBUTE)
    if info.record.example is None:
        raise PackageError(f"{type(model).__name__} keeps no example inputs of its in-place compile")
    started = time.perf_counter()
    store, libraries = TensorStore(), LibraryCollector()
    enc = Encoder(store, libraries.add, allow)
    kernels = {path_: encode_module(enc, model.get_submodule(path_), path_) for path_ in info.swapped}
    state = {name: store.add(t) for name, t in model.state_dict().items() if not _under(name, info.swapped)}
    example, example_arrays = example_record(_run_without_cache(model), info.record.example)
    arrays, meta = store.arrays()
    data = {"kind": "inplace", "identity": model_identity(model), "training": model.training, "kernels": kernels,
            "state": state, "tensors": meta, "libraries": libraries.records,
            "example": {**example, "tolerance": info.record.tolerance}, "notes": [],
            "report": report_record(info.report, info.passes, info.checks, info.guard, info.seconds, enc, model)}
    parts = package_parts(data, arrays, example_arrays, libraries.sources, info.record)
    return write_package(path, parts, manifest("inplace", started, len(libraries.records), [], metadata))


def fresh_model(identity: Mapping[str, Any], allow: Collection[str], package: Path) -> nn.Module:
    """A new instance of the saved Hugging Face model class from its saved config (random weights, soon replaced)."""
    if "config" not in identity:
        raise PackageError(f"{package}: holds a {identity.get('class')} compiled in place; its code is not in the "
                           "package: pass a fresh instance, se.load(path, model=YourModel(...))")
    config_cls = resolve_class(str(identity.get("config_class")), f"{package} config", object, allow)
    model_cls = resolve_class(str(identity.get("class")), f"{package} model", nn.Module, allow)
    try:
        return model_cls(config_cls.from_dict(dict(identity["config"])))
    except (TypeError, ValueError, KeyError) as e:
        raise PackageError(f"{package}: {identity.get('class')} cannot be built from its saved config ({e})") from None


def _fill(model: nn.Module, opened: OpenedPackage, kernels: Mapping[str, nn.Module]) -> None:
    path, data = opened.reader.path, opened.data
    state = {name: opened.decoder.tensors.get(key) for name, key in (data.get("state") or {}).items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise PackageError(f"{path}: its weights do not fit the given {type(model).__name__} "
                           f"({str(e).splitlines()[1:2] or e})") from None
    missing = [n for n in missing if not _under(n, kernels)]
    if missing or unexpected:
        what = f"lacks {missing[0]!r}" if missing else f"holds {unexpected[0]!r}, which the model has not"
        raise PackageError(f"{path}: the package {what}: the given model is another architecture")
    for target, module in kernels.items():
        try:
            model.get_submodule(target)
        except AttributeError:
            raise PackageError(f"{path}: the given {type(model).__name__} has no module {target!r}") from None
        put_module(model, target, module)


def load_inplace(opened: OpenedPackage, model: nn.Module | None, started: float) -> nn.Module:
    """The model of an in-place package: `model` (or a fresh Hugging Face one) with its weights and kernels.

    Example:
        >>> model = load_inplace(open_package(reader, None, ()), None, time.perf_counter())   # doctest: +SKIP
    """
    data, dec, path = opened.data, opened.decoder, opened.reader.path
    identity = data.get("identity") or {}
    if model is None:
        model = fresh_model(identity, dec.allow, path)
    elif qualified_name(type(model)) != identity.get("class"):
        raise PackageError(f"{path}: holds a {identity.get('class')}, the given model is a "
                           f"{qualified_name(type(model))}")
    if getattr(model, ATTRIBUTE, None) is not None or any(isinstance(m, CompiledOp) for m in model.modules()):
        raise PackageError(f"{path}: the given model already holds compiled kernels: pass a fresh instance")
    kernels = {target: decode_module(dec, record, target, opened.libraries.finish)
               for target, record in (data.get("kernels") or {}).items()}
    opened.libraries.close()
    _fill(model, opened, kernels)
    model.train(bool(data.get("training", False)))
    opened.libraries.warn(path)
    check = checked_example(opened, _run_without_cache(model), model)
    report = data.get("report") or {}
    loaded = load_notes(opened, check, time.perf_counter() - started)
    example = data.get("example") or {}
    record = CompileRecord(table=read_table(opened.reader, TABLE), input_table=read_table(opened.reader, INPUT_TABLE),
                           example=example_call(example, opened.reader), tolerance=check["tolerance"],
                           report=frame_from(report.get("plan"), "plan", dec), notes=(("loaded", loaded["note"]),),
                           loaded=loaded)
    info = InPlaceCompile(None, frame_from(report.get("checks"), "checks", dec),
                          frame_from(report.get("passes"), "passes", dec), dec.decode(report.get("guard"), "guard"),
                          float(report.get("seconds") or 0.0), tuple(kernels), record)
    object.__setattr__(model, ATTRIBUTE, info)
    return model
