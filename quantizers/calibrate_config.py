"""What distillation calibration tries (`CalibrationConfig`) and what it records (`CalibrationStep`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import pandas as pd

from sparta_explore.errors import ConfigError
from sparta_explore.fake_quant import INT_BITS

# Widths a tensor may be lowered to: what the int8 kernels run exactly (2..8), and 16, which
# the plan runs as fp32 (kept as a rung because NNI and the device profile speak of it).
ALLOWED_BITS: tuple[int, ...] = (16, *sorted(INT_BITS, reverse=True))


@dataclass(frozen=True)
class CalibrationConfig:
    """Settings of `calibrate`: the bit ladder, the accuracy budget, and the per-op tuning.

    * `bits`: widths to try, each tensor stepping down from its current width one rung
      at a time until a rung costs too much accuracy (any order given; tried widest first).
    * `threshold`: largest accepted accuracy drop of the whole model versus the fp32 model,
      as a fraction (0.01 = one percentage point).
    * `tune_scales`: learn a per-row clip ratio in [`min_clip`, 1] for quantized weights
      (the scale becomes ``clip * max|row| / qmax``, stored as clipped weight values).
    * `steps`, `clip_lr`: Adam steps per trial refining the clip (straight-through
      estimator) and their step size.
    * `tune_weights`: also learn each kept weight's rounding direction (AdaRound-style,
      `round_steps` Adam steps at `round_lr`, regularizer weight `round_lambda`) and correct
      the bias; this changes weight values, pruned ones stay zero.
    * `exclude`: tensor names never lowered (e.g. the classifier head's weight).

    Example:
        >>> CalibrationConfig(bits=(4, 8)).ladder
        (8, 4)
        >>> CalibrationConfig(threshold=-0.1)
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: CalibrationConfig.threshold must be a number >= 0, got -0.1
    """

    bits: tuple[int, ...] = (16, 8, 4)
    threshold: float = 0.01
    tune_scales: bool = True
    tune_weights: bool = False
    steps: int = 30
    clip_lr: float = 0.01
    round_steps: int = 200
    round_lr: float = 0.1
    round_lambda: float = 10.0
    min_clip: float = 0.5
    exclude: tuple[str, ...] = ()
    progress: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.bits, (tuple, list)) or not self.bits:
            raise ConfigError(f"CalibrationConfig.bits must be a non-empty tuple of widths, got {self.bits!r}")
        for b in self.bits:
            if not isinstance(b, int) or isinstance(b, bool) or b not in ALLOWED_BITS:
                raise ConfigError(f"CalibrationConfig.bits: {b!r} is not a width the kernels run; "
                                  f"choose from {list(ALLOWED_BITS)}")
        if len(set(self.bits)) != len(self.bits):
            raise ConfigError(f"CalibrationConfig.bits has repeated widths: {self.bits!r}")
        if not isinstance(self.threshold, (int, float)) or not math.isfinite(self.threshold) or self.threshold < 0:
            raise ConfigError(f"CalibrationConfig.threshold must be a number >= 0, got {self.threshold!r}")
        for key in ("steps", "round_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"CalibrationConfig.{key} must be an int >= 0, got {value!r}")
        for key in ("clip_lr", "round_lr", "round_lambda"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"CalibrationConfig.{key} must be > 0, got {getattr(self, key)!r}")
        if not 0 < self.min_clip <= 1:
            raise ConfigError(f"CalibrationConfig.min_clip must be in (0, 1], got {self.min_clip!r}")
        if isinstance(self.exclude, str) or not all(isinstance(n, str) for n in self.exclude):
            raise ConfigError(f"CalibrationConfig.exclude must be a tuple of tensor names, got {self.exclude!r}")
        object.__setattr__(self, "bits", tuple(self.bits))
        object.__setattr__(self, "exclude", tuple(self.exclude))

    @property
    def ladder(self) -> tuple[int, ...]:
        """The widths in the order they are tried (widest first)."""
        return tuple(sorted(self.bits, reverse=True))


@dataclass(frozen=True)
class CalibrationStep:
    """One line of the calibration log: one width tried for one tensor (or why none was).

    `mse_before` / `mse_after` are the op output's MSE against the fp32 model's output,
    after lowering and before / after tuning; `accuracy` and `drop` are the whole model's,
    the drop measured against the fp32 (pruned) model. Rows with `bits == from_bits` record
    a tensor that was not tried; `note` says why.
    """

    tensor: str
    op: str
    kind: str
    from_bits: int
    bits: int
    mse_before: float = math.nan
    mse_after: float = math.nan
    accuracy: float = math.nan
    drop: float = math.nan
    accepted: bool = False
    note: str = ""


def log_frame(log: tuple[CalibrationStep, ...] | list[CalibrationStep]) -> pd.DataFrame:
    """The log as a DataFrame, one row per step, columns as the `CalibrationStep` fields.

    Example:
        >>> log_frame([CalibrationStep("fc.weight", "fc", "weight", 32, 8, accepted=True)])["bits"].tolist()
        [8]
    """
    return pd.DataFrame([asdict(s) for s in log], columns=[f.name for f in fields(CalibrationStep)])
