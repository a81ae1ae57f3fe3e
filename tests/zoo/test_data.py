"""Data loaders: bundled digits and user .npz files (made here, no downloads)."""

import numpy as np
import pytest
import torch

from sparta_explore.errors import ConfigError
from sparta_explore.zoo import load_digits_split, load_npz_split


def test_digits_split_shapes_ranges_and_stratification():
    d = load_digits_split()
    assert d.train_x.shape == (1347, 1, 8, 8) and d.test_x.shape == (450, 1, 8, 8)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.int64
    assert float(d.train_x.min()) >= 0.0 and float(d.train_x.max()) <= 1.0
    assert d.num_classes == 10 and set(d.test_y.tolist()) == set(range(10))
    assert torch.equal(load_digits_split().test_y, d.test_y)  # deterministic


def test_npz_loader_adds_channel_and_scales(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(40, 6, 5), dtype=np.uint8)
    y = np.repeat(np.arange(4), 10)
    np.savez(tmp_path / "mine.npz", images=x, labels=y)
    d = load_npz_split(tmp_path / "mine.npz", x_key="images", y_key="labels", test_fraction=0.25)
    assert d.input_shape == (1, 6, 5) and d.num_classes == 4 and d.name == "mine"
    assert len(d.train_x) == 30 and len(d.test_x) == 10
    assert float(d.train_x.max()) <= 1.0


def test_npz_loader_errors_name_the_key(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 2, 2)), y=np.zeros(3, dtype=np.int64))
    with pytest.raises(ConfigError, match="'y'"):
        load_npz_split(tmp_path / "a.npz")
    with pytest.raises(ConfigError, match="'labels'"):
        load_npz_split(tmp_path / "a.npz", y_key="labels")
    np.savez(tmp_path / "b.npz", x=np.zeros((4, 2, 2)), y=np.zeros(4))
    with pytest.raises(ConfigError, match="integer labels"):
        load_npz_split(tmp_path / "b.npz")


def test_npz_loader_never_unpickles(tmp_path):
    np.savez(tmp_path / "p.npz", x=np.array([{"a": 1}], dtype=object), y=np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError):
        load_npz_split(tmp_path / "p.npz")
