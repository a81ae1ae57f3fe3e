"""CompileConfig: every option of `compile` in one frozen, checked value.

Example:
    >>> CompileConfig(choose="predicted", tune=False).runs
    5
    >>> CompileConfig(choose="fastest")
    Traceback (most recent call last):
    ...
    sparta_explore.errors.ConfigError: CompileConfig.choose must be 'measured' or 'predicted', got 'fastest'
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sparta_explore.errors import ConfigError

KERNEL_FAMILIES = ("dense", "shrink", "sparse", "int8")


@dataclass(frozen=True)
class CompileConfig:
    """How `compile` chooses and checks kernels.

    * `choose`: "measured" builds and times every candidate (default); "predicted" trusts
      the device profile and builds only its favourite (plus dense if that fails).
    * `tune`: run the tile search for the chosen fp32 sparse kernels.
    * `runs`: timing rounds per candidate (interleaved, fastest kept).
    * `kernels`: kernel families tried (dense is always kept); None = all.
    * `device`: a `DeviceProfile` (None: this machine's, measured once and cached).
    * `cache_dir`: where kernels, tile searches and the profile are cached (None: the default).
    * `verify`: check the compiled model against the model masked with the table it was
      given (and, for a propagation result, the table propagation started from). True: where
      the dense model's call at capture took a quarter second or more, the masked references
      run on the example's last item, compared with that item of the compiled model's
      whole-example output (a failure there is checked again on the whole example;
      `compile/item_call.py`); "whole": always on the whole example; False: no check.
    * `fuse`: with measured choice, time chained sparse kernels (fp32 or int8) fused tile by tile (an FFN's
      fc1 + fc2) and keep the fusion where it is faster (`compile/kernel_pairs.py`).
    * `passes`: the graph and kernel passes to run, by name (None: all, in their order;
      `()`: none). `sparta_explore.compile.passes.pipeline.ORDER` lists them.
    * `guard`: time the whole compiled model against the dense model once; if it is
      slower, run the faster of it and the model masked with the table (`compile/guard.py`).
    * `choices`: (op, candidate) pairs (a trial row's ``kernel_choices``, "op:choice;..." also
      accepted): those ops build and use that candidate without timing the others (dense if it
      cannot run here), so a trial rebuilds with the kernels it was measured with.
    * `inplace`: swap the kernels into the model's own module tree and return the model
      itself (its `generate`, `config` and hooks keep working); graph passes and kernel
      fusions are skipped, and the report says so (`compile/inplace.py`). The model's pruned
      weights are zeroed in place: keep a copy if you need the dense one.
    * `max_seconds`: a cap on compile's time (None: none). Once compile has run this long,
      the ops still to choose take the device profile's favourite (built and checked, not
      timed, no tile search); their notes, `CompiledModel.capped` and a trial row's
      ``compile_capped`` count them. The checks and the guard always run.
    * `few_rows`: give each sparse and int8 linear the one-row kernels for inputs of 1-8 rows (a
      decode token) where they measure faster than its kernel at those rows (`kernels/row_path.py`).
    """

    choose: str = "measured"
    tune: bool = True
    runs: int = 5
    kernels: frozenset[str] | None = None
    device: Any = field(default=None, compare=False)
    cache_dir: str | os.PathLike | None = None
    verify: bool | str = True
    fuse: bool = True
    passes: tuple[str, ...] | None = None
    guard: bool = True
    choices: tuple[tuple[str, str], ...] = ()
    inplace: bool = False
    max_seconds: float | None = None
    few_rows: bool = True

    def __post_init__(self) -> None:
        if self.passes is not None:
            from sparta_explore.compile.passes.pipeline import check_pass_names

            if isinstance(self.passes, str) or not isinstance(self.passes, Collection):
                raise ConfigError(f"CompileConfig.passes must be a sequence of pass names, got {self.passes!r}")
            object.__setattr__(self, "passes", check_pass_names(tuple(self.passes)))
        object.__setattr__(self, "choices", _choice_pairs(self.choices))
        if self.choose not in ("measured", "predicted"):
            raise ConfigError(f"CompileConfig.choose must be 'measured' or 'predicted', got {self.choose!r}")
        if self.max_seconds is not None:
            if isinstance(self.max_seconds, bool) or not isinstance(self.max_seconds, (int, float)) \
                    or not self.max_seconds >= 0:
                raise ConfigError(f"CompileConfig.max_seconds must be a number of seconds >= 0, got "
                                  f"{self.max_seconds!r}")
            object.__setattr__(self, "max_seconds", float(self.max_seconds))
        if self.verify not in (True, False, "whole"):
            raise ConfigError(f"CompileConfig.verify must be True, False or 'whole', got {self.verify!r}")
        if isinstance(self.runs, bool) or not isinstance(self.runs, int) or self.runs < 1:
            raise ConfigError(f"CompileConfig.runs must be an int >= 1, got {self.runs!r}")
        if self.kernels is not None:
            if isinstance(self.kernels, str) or not isinstance(self.kernels, Collection):
                raise ConfigError(f"CompileConfig.kernels must be a set of families, got {self.kernels!r}")
            unknown = sorted(set(self.kernels) - set(KERNEL_FAMILIES))
            if unknown:
                raise ConfigError(f"CompileConfig.kernels: unknown families {unknown}; choose from "
                                  f"{list(KERNEL_FAMILIES)}")
            object.__setattr__(self, "kernels", frozenset(self.kernels) | {"dense"})

    def runs_pass(self, name: str) -> bool:
        """Whether the pass `name` runs under this config.

        Example:
            >>> CompileConfig(passes=("shrink",)).runs_pass("fold_batchnorm")
            False
        """
        return self.passes is None or name in self.passes

    def graph_passes(self) -> tuple[str, ...]:
        """The graph-phase passes this config runs, in run order.

        Example:
            >>> CompileConfig(passes=("shrink", "simplify")).graph_passes()
            ('simplify', 'shrink')
        """
        from sparta_explore.compile.passes.pipeline import graph_pass_names

        return graph_pass_names(self.passes)

    def with_options(self, **options: Any) -> CompileConfig:
        """A copy with `options` replaced; an unknown option is a `ConfigError` naming it.

        Example:
            >>> CompileConfig().with_options(tune=False).tune
            False
        """
        known = {f.name for f in fields(self)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown compile option(s) {unknown}; CompileConfig has {sorted(known)}")
        return replace(self, **options)


def _choice_pairs(choices: Any) -> tuple[tuple[str, str], ...]:
    """`CompileConfig.choices` as (op, candidate) pairs, from pairs, a mapping or "op:choice;op:choice"."""
    if isinstance(choices, str):
        choices = [item.rsplit(":", 1) for item in choices.split(";") if item]
    elif isinstance(choices, Mapping):
        choices = list(choices.items())
    try:
        pairs = tuple((str(op), str(choice)) for op, choice in choices)
    except (TypeError, ValueError):
        raise ConfigError(f"CompileConfig.choices must be (op, candidate) pairs, got {choices!r}") from None
    if any(not op or not choice for op, choice in pairs):
        raise ConfigError(f"CompileConfig.choices has an empty op or candidate name: {pairs!r}")
    return pairs
