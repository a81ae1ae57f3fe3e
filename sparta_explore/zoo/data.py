"""Data sets with no downloads: scikit-learn's bundled digits, and user .npz files.

Every split is a `DataSplit` of float32 images shaped (N, C, H, W) in [0, 1] and int64
labels, so every embedded model takes the same input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sparta_explore.errors import ConfigError


@dataclass(frozen=True)
class DataSplit:
    """Train and test tensors of one classification data set."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    name: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, without the batch dim."""
        return tuple(self.train_x.shape[1:])


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, name: str) -> DataSplit:
    from sklearn.model_selection import train_test_split  # sklearn is slow to import; only here

    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction}")
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return DataSplit(torch.as_tensor(x_tr, dtype=torch.float32), torch.as_tensor(y_tr, dtype=torch.int64),
                     torch.as_tensor(x_te, dtype=torch.float32), torch.as_tensor(y_te, dtype=torch.int64),
                     int(y.max()) + 1, name)


def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> DataSplit:
    """scikit-learn's 1797 handwritten 8x8 digits, as (N, 1, 8, 8) floats in [0, 1].

    Example:
        >>> d = load_digits_split()
        >>> d.train_x.shape, d.test_x.shape, d.num_classes
        (torch.Size([1347, 1, 8, 8]), torch.Size([450, 1, 8, 8]), 10)
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return _split(images, bunch.target.astype(np.int64), test_fraction, seed, "digits")


def load_npz_split(path: str | os.PathLike, *, x_key: str = "x", y_key: str = "y",
                   test_fraction: float = 0.25, seed: int = 0) -> DataSplit:
    """A user data set from an .npz with images under `x_key` and integer labels under `y_key`.

    Images may be (N, H, W) (a channel dim is added) or (N, C, H, W); integer images are
    scaled by their maximum into [0, 1] (as are float images above 1). The file is read without unpickling.

    Example:
        >>> load_npz_split("mydata.npz").input_shape  # doctest: +SKIP
        (1, 28, 28)
    """
    path = Path(path)
    with np.load(path, allow_pickle=False) as data:
        for key in (x_key, y_key):
            if key not in data:
                raise ConfigError(f"{path} has no array {key!r} (has {sorted(data.files)})")
        x, y = data[x_key], data[y_key]
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise ConfigError(f"{path}: {x_key!r} must be (N, H, W) or (N, C, H, W), got shape {x.shape}")
    if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(f"{path}: {y_key!r} must be {len(x)} integer labels, got {y.dtype} {y.shape}")
    if y.min() < 0:
        raise ConfigError(f"{path}: {y_key!r} has negative labels")
    x = x.astype(np.float32)
    if x.size and x.max() > 1.0:
        x = x / x.max()
    return _split(x, y.astype(np.int64), test_fraction, seed, path.stem)
