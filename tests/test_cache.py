"""Where the cache lives: an explicit cache_dir, else $SPARTA_EXPLORE_CACHE, else $XDG_CACHE_HOME, else ~/.cache."""

from pathlib import Path

import pytest

from sparta_explore.cache import default_cache_dir, resolve_cache_dir


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("SPARTA_EXPLORE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return monkeypatch


def test_home_default(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "sparta-explore"


def test_xdg_cache_home_is_honoured_when_absolute(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path / "home"))
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "sparta-explore"
    clean_env.setenv("XDG_CACHE_HOME", "relative/path")  # the XDG spec: ignore relative values
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "sparta-explore"


def test_sparta_explore_cache_wins_and_reaches_every_stage(clean_env, tmp_path):
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    clean_env.setenv("SPARTA_EXPLORE_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    assert resolve_cache_dir(None, "kernels") == tmp_path / "mine" / "kernels"
    assert resolve_cache_dir(tmp_path / "explicit", "kernels") == tmp_path / "explicit" / "kernels"

    from sparta_explore.kernels.build import build

    built = build("int eleven(void) { return 11; }", "eleven")
    assert Path(built.path).parent == tmp_path / "mine" / "kernels" and built.lib.eleven() == 11
