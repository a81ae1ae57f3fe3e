"""Workload: what exploration needs to know about a user's model, data and metric, in one value.

A workload holds the dense model (or a function building it), example inputs (any
number of tensors, positional or keyword: ``input_ids`` + ``attention_mask``), a metric
(`evaluate(model) -> float`, named; higher is better unless `higher_is_better` is False,
as for a perplexity), and optionally how to train it
under masks (`train_batches` + `loss`), the data calibration steers by, and which modules
may be pruned. The embedded digits models are built-in workloads of the same type
(`sparta_explore.zoo.workloads`); users load theirs by reference: a registered name,
``package.module:attr`` or ``path/to/file.py:attr`` (a `Workload`, or a function with no
required arguments returning one).

Built-in workloads come from sources: modules that `register_workload` when imported.
This module names them (`register_workload_source`) and imports them on the first lookup
by name, so it never imports the zoo (the zoo imports it): ``load_workload("digits-mlp")``
works in a fresh process all the same.

Example:
    >>> w = Workload("tiny", nn.Linear(4, 2), (torch.randn(3, 4),), metric=lambda m: 1.0)
    >>> w.evaluate(w.dense_model()), w.prunable_modules()
    (1.0, ())
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.prunable import is_linear, is_prunable
from sparta_explore.registry import Registry
from sparta_explore.tracing.inputs import as_call

Metric = Callable[[nn.Module], float]


def default_head(model: nn.Module) -> str | None:
    """The output head left dense by default: the last Linear / Conv1D module (pruning its rows deletes outputs).

    Example:
        >>> default_head(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
        '2'
    """
    names = [n for n, m in model.named_modules() if n and is_linear(m)]
    return names[-1] if names else None


@dataclass(frozen=True, eq=False)
class Workload:
    """A model, its inputs and its metric; see the module docstring. Only the first four fields are required.

    * `model`: the dense model, or a function building it (called once, on first use).
    * `inputs`: example inputs for capture (a tensor, a tuple, or a dict of keyword inputs).
    * `metric`: `evaluate(model) -> float`, on data the workload holds out; `metric_name` names
      it in rows and reports. `higher_is_better` says which way it improves: True for an accuracy
      (the default), False for a loss or a perplexity.
    * `latency_inputs`: `batch -> inputs` for timing; None times `inputs` as they are.
    * `default_batch`: the batch a trial times when it asks for none.
    * `train_batches` (one epoch of batches, a fresh iterable per call) and `loss(model, batch)`:
      what mask-respecting fine-tuning and NNI's training-aware compressors train with.
    * `validation_metric`: what calibration steers by (data the reported metric does not see);
      None: calibration is not offered. `calibration_inputs`: model inputs for calibration.
    * `prunable`: module FQNs that may be pruned; None = every Linear / Conv2d / Conv1D but `head`.
    * `head`: the output module left dense ("auto": the last Linear / Conv1D; None: none).
    * `capture`: options for `capture` (method, leaf_modules, concrete_args).
    * `compile_inplace`: a trial compiles the model in place (kernels in its own modules,
      `CompileConfig(inplace=True)`) instead of as a graph captured at the timing shape: for
      models whose metric runs other shapes than the timing inputs (a language model's
      perplexity windows, `generate`).
    * `architecture`: for a `model` builder that trains, a cheap function building the same
      modules untrained: the names in `prunable` are checked on it before `model` runs, so a
      typo costs no training.
    """

    name: str
    model: nn.Module | Callable[[], nn.Module] = field(repr=False)
    inputs: Any = field(repr=False)
    metric: Metric = field(repr=False)
    metric_name: str = "metric"
    higher_is_better: bool = True
    latency_inputs: Callable[[int], Any] | None = field(default=None, repr=False)
    default_batch: int | None = None
    train_batches: Callable[[], Iterable[Any]] | None = field(default=None, repr=False)
    loss: Callable[[nn.Module, Any], torch.Tensor] | None = field(default=None, repr=False)
    validation_metric: Metric | None = field(default=None, repr=False)
    calibration_inputs: Any = field(default=None, repr=False)
    prunable: tuple[str, ...] | None = None
    head: str | None = "auto"
    capture: Mapping[str, Any] = field(default_factory=dict)
    compile_inplace: bool = False
    description: str = ""
    architecture: Callable[[], nn.Module] | None = field(default=None, repr=False)
    _built: list = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a workload needs a non-empty name, got {self.name!r}")
        if not (isinstance(self.model, nn.Module) or callable(self.model)):
            raise ConfigError(f"workload {self.name!r}: model must be an nn.Module or a function building one")
        if self.architecture is not None and not callable(self.architecture):
            raise ConfigError(f"workload {self.name!r}: architecture must be a function building the model untrained")
        if not callable(self.metric):
            raise ConfigError(f"workload {self.name!r}: metric must be a function model -> float")
        if not isinstance(self.higher_is_better, bool):
            raise ConfigError(f"workload {self.name!r}: higher_is_better must be True or False, "
                              f"got {self.higher_is_better!r}")
        if not isinstance(self.compile_inplace, bool):
            raise ConfigError(f"workload {self.name!r}: compile_inplace must be True or False, "
                              f"got {self.compile_inplace!r}")
        if (self.train_batches is None) != (self.loss is None):
            raise ConfigError(f"workload {self.name!r}: train_batches and loss go together (training needs both)")
        if self.prunable is not None:
            object.__setattr__(self, "prunable", tuple(self.prunable))
        bad = sorted(set(self.capture) - {"method", "leaf_modules", "concrete_args", "kwargs"})
        if bad:
            raise ConfigError(f"workload {self.name!r}: unknown capture options {bad}")

    # ---- the model ---------------------------------------------------------------------
    def dense_model(self) -> nn.Module:
        """The dense model (built once, then shared: copy it before changing its weights).

        The names in `prunable` are checked first (on `architecture` before a builder runs,
        else on the model as soon as it is built): a `ConfigError` names the missing ones.

        Example:
            >>> w.dense_model()  # doctest: +SKIP
        """
        if not self._built:
            if self.prunable is not None and self.architecture is not None and not isinstance(self.model, nn.Module):
                self._check_prunable(self.architecture())
            model = self.model if isinstance(self.model, nn.Module) else self.model()
            if not isinstance(model, nn.Module):
                raise ConfigError(f"workload {self.name!r}: its model builder returned {type(model).__name__}, "
                                  "not an nn.Module")
            self._check_prunable(model)
            self._built.append(model.eval())
        return self._built[0]

    def fresh_model(self) -> nn.Module:
        """A deep copy of the dense model, free to prune, quantize and fine-tune."""
        return copy.deepcopy(self.dense_model())

    def prunable_modules(self, model: nn.Module | None = None) -> tuple[str, ...]:
        """The modules a pruner may touch: `prunable`, or every Linear / Conv2d / Conv1D except the head.

        Example:
            >>> Workload("w", nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), (), lambda m: 0.0).prunable_modules()
            ('0',)
        """
        model = model if model is not None else self.dense_model()
        if self.prunable is not None:
            self._check_prunable(model)
            return self.prunable
        head = self.head_module(model)
        return tuple(n for n, m in model.named_modules() if n and n != head and is_prunable(m)
                     and isinstance(getattr(m, "weight", None), torch.Tensor))

    def _check_prunable(self, model: nn.Module) -> None:
        if self.prunable is None:
            return
        named = dict(model.named_modules())
        missing = [n for n in self.prunable if n not in named]
        if missing:
            raise ConfigError(f"workload {self.name!r}: prunable names {missing} are not modules of the model")

    def head_module(self, model: nn.Module | None = None) -> str | None:
        """The output module left dense (resolving "auto")."""
        if self.head != "auto":
            return self.head
        return default_head(model if model is not None else self.dense_model())

    # ---- data ------------------------------------------------------------------------------
    def timing_inputs(self, batch: int | None) -> Any:
        """What a latency measurement feeds the model at `batch` (or the example inputs)."""
        if batch is None or self.latency_inputs is None:
            return self.inputs
        return self.latency_inputs(batch)

    @property
    def can_train(self) -> bool:
        """Whether the workload says how to train (fine-tuning, NNI's training-aware compressors)."""
        return self.train_batches is not None

    # ---- the metric --------------------------------------------------------------------------
    def evaluate(self, model: nn.Module, *, validation: bool = False) -> float:
        """The metric (or the validation metric) of `model` in eval mode; a non-number is a `ConfigError`.

        Example:
            >>> Workload("w", nn.Identity(), (), metric=lambda m: "good").evaluate(nn.Identity())
            Traceback (most recent call last):
            ...
            sparta_explore.errors.ConfigError: workload 'w': metric returned 'good' (str), not a finite number
        """
        fn = self.validation_metric if validation else self.metric
        if fn is None:
            raise ConfigError(f"workload {self.name!r} has no validation_metric (calibration needs one)")
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                value = fn(model)
        finally:
            model.train(was)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            name = "validation_metric" if validation else "metric"
            raise ConfigError(f"workload {self.name!r}: {name} returned {value!r} ({type(value).__name__}), "
                              "not a finite number")
        return float(value)

    def train(self, model: nn.Module, epochs: int, *, lr: float = 1e-3, seed: int = 0,
              after_step: Callable[[nn.Module], None] | None = None) -> None:
        """Fine-tune `model` in place for `epochs` passes over `train_batches` (Adam, `loss`).

        `after_step(model)` runs after every optimizer step (re-applying masks, so pruned
        weights stay zero).

        Example:
            >>> w.train(model, 1, after_step=lambda m: apply_table(m, table))  # doctest: +SKIP
        """
        if not self.can_train:
            raise ConfigError(f"workload {self.name!r} has no train_batches / loss: it cannot be fine-tuned")
        torch.manual_seed(seed)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=lr)
        model.train()
        for _ in range(epochs):
            for batch in self.train_batches():
                loss = self.loss(model, batch)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if after_step is not None:
                    after_step(model)
        model.eval()


def call_model(model: nn.Module, inputs: Any) -> Any:
    """`model` called on `inputs` (a tensor, a tuple of positional inputs, or a dict of keyword inputs).

    Example:
        >>> call_model(nn.Identity(), {"input": torch.ones(1)})
        tensor([1.])
    """
    args, kwargs = as_call(inputs)
    return model(*args, **kwargs)


# ---- built-in workloads and loading by reference ---------------------------------------------
_BUILTIN: Registry[Callable[..., Workload]] = Registry("workload")
_LOADED: dict[tuple[str, str | None], Workload] = {}
# Modules that register built-in workloads when imported, by name: importing them here would
# make this module depend on the zoo, which depends on it. The zoo registers the digits models.
_SOURCES: list[str] = ["sparta_explore.zoo"]


def register_workload_source(module: str) -> None:
    """Name a module that registers built-in workloads when imported; it is imported on the first lookup by name.

    Example:
        >>> register_workload_source("sparta_explore.zoo")  # already a source: nothing changes
    """
    if module not in _SOURCES:
        _SOURCES.append(module)


def register_workload(name: str) -> Callable[[Callable[..., Workload]], Callable[..., Workload]]:
    """Register a built-in workload factory `(cache_dir=None) -> Workload` under `name`."""
    def add(factory: Callable[..., Workload]) -> Callable[..., Workload]:
        _BUILTIN.add(name, factory)
        return factory
    return add


def builtin_workloads() -> list[str]:
    """Names of the built-in workloads (the embedded digits models, and any other source's).

    Example:
        >>> "digits-ffn" in builtin_workloads()
        True
    """
    for module in list(_SOURCES):
        importlib.import_module(module)  # registers its workloads the first time; a dict lookup after
    return _BUILTIN.names()


def is_reference(ref: str) -> bool:
    """Whether `ref` names a workload by import path or file (``module:attr``, ``file.py:attr``).

    Example:
        >>> is_reference("experiments/workloads/bert.py:workload"), is_reference("digits-ffn")
        (True, False)
    """
    return ":" in ref


def check_reference(ref: str) -> str:
    """`ref` if it can name a workload (a built-in name or ``...:attr``), else a `ConfigError`; imports nothing.

    Example:
        >>> check_reference("digits-mlp")
        'digits-mlp'
    """
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"workload must be a built-in name or 'module:attr' / 'file.py:attr', got {ref!r}")
    if is_reference(ref):
        target, _, attr = ref.rpartition(":")
        if not target or not attr.isidentifier():
            raise ConfigError(f"workload reference {ref!r} must look like 'package.module:attr' or 'path/file.py:attr'")
        return ref
    if ref not in builtin_workloads() and not any(ref.lower() == n.lower() for n in builtin_workloads()):
        raise ConfigError(f"unknown workload {ref!r}; built-in: {', '.join(builtin_workloads())}; or give "
                          "'package.module:attr' / 'path/file.py:attr'")
    return ref


def _import_target(target: str) -> Any:
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"workload file {target!r} does not exist")
        name = f"sparta_workload_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        if str(path.parent) not in sys.path:  # as for a script: modules beside the file import
            sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise ConfigError(f"workload file {target!r} does not import: {type(e).__name__}: {e}") from None
        return module
    try:
        return importlib.import_module(target)
    except Exception as e:
        raise ConfigError(f"workload module {target!r} does not import: {type(e).__name__}: {e}") from None


def load_workload(ref: str | Workload, *, cache_dir: str | None = None) -> Workload:
    """The workload `ref` names (a `Workload` is returned as is); loaded once per process.

    Example:
        >>> load_workload("digits-mlp").name
        'digits-mlp'
    """
    if isinstance(ref, Workload):
        return ref
    ref = check_reference(ref)
    key = (ref, None if cache_dir is None else str(cache_dir))
    if key in _LOADED:
        return _LOADED[key]
    if not is_reference(ref):  # check_reference imported the sources
        workload = _BUILTIN.get(ref)(cache_dir=cache_dir)
    else:
        target, _, attr = ref.rpartition(":")
        module = _import_target(target)
        if not hasattr(module, attr):
            raise ConfigError(f"workload reference {ref!r}: {target!r} has no attribute {attr!r}")
        value = getattr(module, attr)
        if callable(value) and not isinstance(value, Workload):
            try:
                value = value()
            except Exception as e:
                raise ConfigError(f"workload reference {ref!r}: calling {attr}() failed: {type(e).__name__}: "
                                  f"{e}") from None
        if not isinstance(value, Workload):
            raise ConfigError(f"workload reference {ref!r} is a {type(value).__name__}, not a Workload")
        workload = value
    _LOADED[key] = workload
    return workload
