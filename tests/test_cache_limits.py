"""The kernel cache's size cap: least-recently-used whole entries go, the new one stays, races are harmless."""

import os
import warnings
from pathlib import Path

import pytest

from sparta_explore import cache_limits
from sparta_explore.cache_limits import (
    MAX_MB_ENV,
    MB,
    CacheSettingWarning,
    evict_lru,
    mark_used,
    note_new_entry,
    parse_max_mb,
    remove_entry,
    scan_kernels,
)
from sparta_explore.errors import ConfigError

NOW = 1_700_000_000.0  # a fixed "now": recency comes from explicit mtimes, never from sleeping


def make_entry(folder: Path, stem: str, used: float, size: int = 100) -> list[Path]:
    """An entry's three files (`size` bytes in all), every mtime set to `used`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, n in ((".c", size // 4), (".so", size // 2), (".json", size - size // 4 - size // 2)):
        path = folder / f"{stem}{suffix}"
        path.write_bytes(b"x" * n)
        os.utime(path, (used, used))
        paths.append(path)
    return paths


def stems(folder: Path) -> set[str]:
    return {e.stem for e in scan_kernels(folder)}


def assert_whole(folder: Path) -> None:
    for entry in scan_kernels(folder):
        assert len(entry.files) == 3, f"torn entry {entry.stem}: {entry.files}"


@pytest.mark.parametrize("text, expected", [(None, 2048 * MB), ("", 2048 * MB), ("  ", 2048 * MB), ("512", 512 * MB),
                                            ("0.5", MB // 2), ("0", None), ("0.0", None), ("off", None),
                                            ("None", None)])
def test_cap_setting_values(text, expected):
    assert parse_max_mb(text) == expected


@pytest.mark.parametrize("text", ["2G", "-1", "nan", "inf", "lots"])
def test_bad_cap_setting_is_one_error_naming_the_variable(text):
    with pytest.raises(ConfigError, match=rf"{MAX_MB_ENV} must be a size in MB .*got '{text}'"):
        parse_max_mb(text)


def test_evicts_least_recently_used_whole_entries_down_to_90_percent(tmp_path):
    for stem in ["e-4", "e-1", "e-3", "e-0", "e-2"]:  # written out of order: the mtimes set the order
        make_entry(tmp_path, stem, used=NOW - 1000 + int(stem[-1]) * 10)
    result = evict_lru(tmp_path, 350, now=NOW)  # 500 bytes over 350: down to 315, so two go
    assert result.removed == ("e-0", "e-1")
    assert result.scanned_bytes == 500 and result.freed_bytes == 200 and result.remaining_bytes == 300
    assert stems(tmp_path) == {"e-2", "e-3", "e-4"}
    assert not list(tmp_path.glob("e-0.*")) and not list(tmp_path.glob("e-1.*"))
    assert_whole(tmp_path)


def test_under_the_cap_nothing_goes(tmp_path):
    make_entry(tmp_path, "a-1", used=NOW - 1e6)
    assert evict_lru(tmp_path, 100, now=NOW).removed == ()
    assert stems(tmp_path) == {"a-1"}


def test_recency_is_the_record_mtime_mark_used_sets(tmp_path):
    make_entry(tmp_path, "old-1", used=NOW - 500)
    make_entry(tmp_path, "older-1", used=NOW - 900)
    mark_used(tmp_path / "older-1.so")  # loaded just now: it is the newest
    assert evict_lru(tmp_path, 150, recent_s=0).removed == ("old-1",)
    mark_used(tmp_path / "gone-1.so")  # a missing record (or a read-only cache) is no error


def test_the_entry_named_keep_is_never_removed(tmp_path):
    for i in range(4):
        make_entry(tmp_path, f"k-{i}", used=NOW - 1000 + i)
    result = evict_lru(tmp_path, 1, keep=("k-0",), now=NOW)  # the oldest, and the cap holds nothing
    assert stems(tmp_path) == {"k-0"} and "k-0" not in result.removed


def test_recently_used_entries_go_only_while_still_over_the_cap(tmp_path):
    make_entry(tmp_path, "old-1", used=NOW - 3600)
    make_entry(tmp_path, "new-1", used=NOW - 30)
    make_entry(tmp_path, "new-2", used=NOW - 10)
    # 300 over 250: the old one goes (200), which is under the cap, if not under 90% of it: the recent stay
    assert evict_lru(tmp_path, 250, now=NOW).removed == ("old-1",)
    # 200 over 150 with nothing old left: the older of the recent goes, down to the cap only
    assert evict_lru(tmp_path, 150, now=NOW).removed == ("new-1",)
    assert stems(tmp_path) == {"new-2"}


def test_builds_in_progress_and_other_files_are_not_entries(tmp_path):
    make_entry(tmp_path, "k-1", used=NOW - 1000)
    (tmp_path / "tmpabc").mkdir()  # build() compiles in a temporary folder
    (tmp_path / "tmpabc" / "k.so").write_bytes(b"x" * 1000)
    (tmp_path / ".k-2.json.x.tmp").write_bytes(b"x" * 1000)  # an atomic write under way
    (tmp_path / "notes.txt").write_bytes(b"x" * 1000)
    assert stems(tmp_path) == {"k-1"}
    evict_lru(tmp_path, 1, now=NOW)
    assert (tmp_path / "tmpabc" / "k.so").exists() and (tmp_path / ".k-2.json.x.tmp").exists()


def test_a_file_vanishing_mid_scan_is_skipped(tmp_path, monkeypatch):
    make_entry(tmp_path, "a-1", used=NOW - 100)
    make_entry(tmp_path, "b-1", used=NOW - 200)
    real_scandir = os.scandir

    class Racing:  # lists the folder, then another process deletes a file before it is stat'ed
        def __init__(self, folder):
            with real_scandir(folder) as it:
                self.items = list(it)
            (Path(folder) / "b-1.so").unlink()

        def __iter__(self):
            return iter(self.items)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cache_limits.os, "scandir", Racing)
    entries = {e.stem: e for e in scan_kernels(tmp_path)}
    assert entries["a-1"].size == 100 and entries["b-1"].size == 50  # its .c and .json remain


def test_two_evictors_at_once_do_not_crash(tmp_path, monkeypatch):
    for i in range(4):
        make_entry(tmp_path, f"k-{i}", used=NOW - 1000 + i)
    real_scan = cache_limits.scan_kernels

    def scan_then_race(folder):  # another process evicts the two oldest between our scan and our deletes
        entries = real_scan(folder)
        for e in sorted(entries, key=lambda e: e.last_used)[:2]:
            remove_entry(e)
        return entries

    monkeypatch.setattr(cache_limits, "scan_kernels", scan_then_race)
    result = evict_lru(tmp_path, 150, now=NOW)  # 400 over 150: down to 135, so three go, one of them here
    assert result.removed == ("k-2",) and result.freed_bytes == 100 and result.remaining_bytes == 100
    assert stems(tmp_path) == {"k-3"}  # the other evictor's deletions count: k-3 is not evicted on top
    (last,) = real_scan(tmp_path)
    assert remove_entry(last) == 100 and remove_entry(last) == 0  # the second time, every file is gone already


def test_an_entry_used_between_scan_and_delete_is_spared(tmp_path, monkeypatch):
    make_entry(tmp_path, "a-1", used=NOW - 1000)
    make_entry(tmp_path, "b-1", used=NOW - 900)
    real_scan = cache_limits.scan_kernels

    def scan_then_load(folder):  # a loader marks the oldest entry used right after our scan
        entries = real_scan(folder)
        mark_used(folder / "a-1.so")
        return entries

    monkeypatch.setattr(cache_limits, "scan_kernels", scan_then_load)
    assert evict_lru(tmp_path, 150, recent_s=0).removed == ("b-1",)


def test_new_builds_scan_rarely_while_far_under_the_cap(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_MB_ENV, "1")
    calls = []
    real_evict = cache_limits.evict_lru
    monkeypatch.setattr(cache_limits, "evict_lru", lambda *a, **k: calls.append(a) or real_evict(*a, **k))
    n = cache_limits.RESCAN_EVERY * 2 + 1
    for i in range(n):
        make_entry(tmp_path, f"k-{i}", used=NOW)
        note_new_entry(tmp_path / f"k-{i}.so")
    assert len(calls) == 3  # the first build, then once per RESCAN_EVERY builds
    make_entry(tmp_path, "big-1", used=NOW, size=MB)  # the estimate crosses the cap: scan (and evict) now
    result = note_new_entry(tmp_path / "big-1.so")
    assert len(calls) == 4 and result is not None and "big-1" not in result.removed
    assert (tmp_path / "big-1.so").exists()


def test_no_cap_means_no_scan(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_MB_ENV, "off")
    make_entry(tmp_path, "k-1", used=NOW, size=10 * MB)
    assert note_new_entry(tmp_path / "k-1.so") is None and stems(tmp_path) == {"k-1"}


def test_a_bad_setting_warns_once_during_builds_and_the_default_cap_applies(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_MB_ENV, "two gigs")
    cache_limits._warn_bad_setting.cache_clear()
    make_entry(tmp_path, "k-1", used=NOW)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        note_new_entry(tmp_path / "k-1.so")
        note_new_entry(tmp_path / "k-1.so")
    said = [str(w.message) for w in caught if issubclass(w.category, CacheSettingWarning)]
    assert len(said) == 1 and MAX_MB_ENV in said[0] and "'two gigs'" in said[0] and "2048 MB" in said[0]
