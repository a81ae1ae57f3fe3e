"""`sparta-explore cache`: info, clear and trim on a temporary cache folder."""

import os

import pytest

from sparta_explore.cache_limits import MAX_MB_ENV
from sparta_explore.cli import main

OLD = 1_000_000_000.0  # mtimes set explicitly: the order of use is known without sleeping


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache with 4 kernel entries of 600 bytes (k-0 used longest ago), a tuning, a device and a zoo file."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPARTA_EXPLORE_CACHE", str(root))
    monkeypatch.delenv(MAX_MB_ENV, raising=False)
    for i in range(4):
        for suffix in (".c", ".so", ".json"):
            path = root / "kernels" / f"k-{i}{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 200)
            os.utime(path, (OLD + i, OLD + i))
    for sub, name, size in (("tuning", "t.json", 100), ("device", "d.json", 50), ("zoo", "m.pt", 3000)):
        (root / sub).mkdir()
        (root / sub / name).write_bytes(b"x" * size)
    return root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["cache", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def line(out: str, start: str) -> str:
    (found,) = [ln for ln in out.splitlines() if ln.strip().startswith(start)]
    return found


def test_info_lists_each_sub_folder_the_total_and_the_cap(cache, capsys):
    for argv in ((), ("info",)):
        status, out, _ = run(capsys, *argv)
        assert status == 0 and f"cache folder: {cache}" in out
        assert "2.3 KB" in line(out, "kernels") and "12 files, 4 entries" in line(out, "kernels")
        assert "100 B" in line(out, "tuning") and "50 B" in line(out, "device") and "2.9 KB" in line(out, "zoo")
        assert "5.4 KB" in line(out, "total")  # 2400 + 100 + 50 + 3000 bytes
        assert "2.0 GB (the default)" in line(out, "kernel cap")


def test_info_shows_the_cap_setting_and_refuses_a_bad_one(cache, capsys, monkeypatch):
    monkeypatch.setenv(MAX_MB_ENV, "500")
    assert f"500.0 MB (${MAX_MB_ENV})" in line(run(capsys)[1], "kernel cap")
    monkeypatch.setenv(MAX_MB_ENV, "off")
    assert "none" in line(run(capsys)[1], "kernel cap")
    monkeypatch.setenv(MAX_MB_ENV, "2G")
    status, out, err = run(capsys)
    assert status == 2 and not out and len(err.splitlines()) == 1 and f"{MAX_MB_ENV} must be" in err


def test_clear_removes_kernels_only_by_default(cache, capsys):
    status, out, _ = run(capsys, "clear")
    assert status == 0
    assert f"{cache / 'kernels'}: removed 4 kernel entries (12 files), 2.3 KB freed" in out
    assert "freed 2.3 KB in all" in out
    assert not list((cache / "kernels").iterdir())
    assert (cache / "tuning" / "t.json").exists() and (cache / "device" / "d.json").exists()
    assert (cache / "zoo" / "m.pt").exists()


def test_clear_what_names_the_sub_folders(cache, capsys):
    status, out, _ = run(capsys, "clear", "--what", "tuning,device")
    assert status == 0 and "removed 1 file, 100 B freed" in out and "removed 1 file, 50 B freed" in out
    assert not (cache / "tuning" / "t.json").exists() and not (cache / "device" / "d.json").exists()
    assert (cache / "zoo" / "m.pt").exists() and len(list((cache / "kernels").iterdir())) == 12
    status, out, _ = run(capsys, "clear", "--what", "all")
    assert status == 0 and "2.9 KB freed" in out and not (cache / "zoo" / "m.pt").exists()


def test_clear_refuses_an_unknown_sub_folder_in_one_line(cache, capsys):
    status, out, err = run(capsys, "clear", "--what", "kernels,../etc")
    assert status == 2 and not out and len(err.splitlines()) == 1 and "unknown cache sub-folder(s) ../etc" in err
    assert len(list((cache / "kernels").iterdir())) == 12  # nothing was deleted before the error


def test_trim_evicts_the_least_recently_used_kernels(cache, capsys):
    status, out, _ = run(capsys, "trim", "--max-mb", "0.001")  # 1048 bytes: 2400 down to 943, so 3 entries go
    assert status == 0 and "removed 3 least-recently-used entries" in out and "1.8 KB freed" in out
    assert sorted(p.name for p in (cache / "kernels").iterdir()) == ["k-3.c", "k-3.json", "k-3.so"]
    status, out, _ = run(capsys, "trim", "--max-mb", "0.001")
    assert status == 0 and "nothing removed" in out


def test_trim_under_no_cap_does_nothing(cache, capsys, monkeypatch):
    monkeypatch.setenv(MAX_MB_ENV, "0")
    status, out, _ = run(capsys, "trim")
    assert status == 0 and "no cap" in out and len(list((cache / "kernels").iterdir())) == 12


def test_cache_dir_option_wins_over_the_environment(cache, capsys, tmp_path):
    other = tmp_path / "other"
    status, out, _ = run(capsys, "--cache-dir", str(other))
    assert status == 0 and f"cache folder: {other} (does not exist yet)" in out and not other.exists()
    status, out, _ = run(capsys, "clear", "--cache-dir", str(other))
    assert status == 0 and "removed 0 kernel entries" in out
    assert len(list((cache / "kernels").iterdir())) == 12


def test_options_of_another_action_are_refused(cache, capsys):
    status, _, err = run(capsys, "info", "--what", "kernels")
    assert status == 2 and "--what" in err
    status, _, err = run(capsys, "clear", "--max-mb", "5")
    assert status == 2 and "--max-mb" in err
    assert len(list((cache / "kernels").iterdir())) == 12
    assert main(["cache", "trim", "--max-mb", "0"]) == 2  # argparse: must be > 0


def test_the_command_is_registered(capsys):
    assert main(["cache", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(action in out for action in ("info", "clear", "trim", "--max-mb", "--what"))
