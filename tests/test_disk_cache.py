"""The disk cache (dmae_fast.base.disk_cache) and the model cache's keys (dmae_fast.batching.cpu.cache_keys)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from dmae_fast.base import disk_cache
from dmae_fast.base.disk_cache import DiskCache, drop_entries
from dmae_fast.base.files import cache_folder
from dmae_fast.batching.cpu import cache_keys as model_cache
from dmae_fast.batching.cpu.cache_keys import cache_key, files_sha256


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path / "cache"))
    notices = []
    opened = DiskCache.open(notices.append)
    opened.notices = notices
    return opened


def test_the_folder_follows_xdg_then_home_and_can_be_moved_or_disabled(monkeypatch, tmp_path):
    monkeypatch.delenv("DMAE_FAST_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "dmae-fast"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "dmae-fast"
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path / "moved"))
    assert cache_folder() == tmp_path / "moved"
    monkeypatch.setenv("DMAE_FAST_CACHE", "off")
    assert cache_folder() is None
    assert DiskCache.open(pytest.fail).folder is None


def test_an_entry_reads_back_what_was_written_and_leaves_no_temporary_file(cache):
    assert cache.read("k") is None
    cache.write("k", b"payload\nwith a newline")
    cache.write("k", b"payload, overwritten")
    assert cache.read("k") == b"payload, overwritten"
    assert [path.name for path in cache.folder.iterdir()] == ["k.entry"]
    assert cache.notices == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "no digest"])
def test_a_damaged_entry_is_a_miss(cache, damage):
    cache.write("k", b"x" * 1000)
    path = cache.folder / "k.entry"
    data = path.read_bytes()
    damaged = {"flip": data[:-10] + bytes([data[-10] ^ 1]) + data[-9:], "truncate": data[:-1], "empty": b"",
               "no digest": data.partition(b"\n")[2]}[damage]
    path.write_bytes(damaged)
    assert cache.read("k") is None
    cache.write("k", b"rebuilt")
    assert cache.read("k") == b"rebuilt"


def test_a_key_changes_with_any_part_and_with_the_library_versions(monkeypatch):
    key = cache_key(weights="a", spec={"x": 1})
    assert key == cache_key(spec={"x": 1}, weights="a") and len(key) == 64
    assert key != cache_key(weights="b", spec={"x": 1})
    assert key != cache_key(weights="a", spec={"x": 2})
    versions = dict(model_cache.library_versions(), openvino="0.0.1")
    monkeypatch.setattr(model_cache, "library_versions", lambda: versions)
    assert key != cache_key(weights="a", spec={"x": 1})


def test_an_unwritable_folder_is_one_notice_and_no_cache(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path / "a-file" / "cache"))
    notices = []
    cache = DiskCache.open(notices.append)
    assert cache.folder is None and len(notices) == 1 and "running uncached" in notices[0]
    cache.write("k", b"dropped")
    assert cache.read("k") is None and cache.subfolder("openvino") is None and len(notices) == 1


def test_a_failed_write_turns_the_cache_off_with_one_notice(cache, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_cache.tempfile, "mkstemp", full)
    cache.write("k", b"x")
    cache.write("k", b"x")
    assert cache.folder is None and len(cache.notices) == 1 and "No space left on device" in cache.notices[0]


def test_files_are_hashed_by_name(tmp_path):
    assert files_sha256(tmp_path / "absent") == {}
    (tmp_path / "a.blob").write_bytes(b"abc")
    (tmp_path / "folder").mkdir()
    assert files_sha256(tmp_path) == {"a.blob": hashlib.sha256(b"abc").hexdigest()}


def test_a_fifo_at_an_entrys_path_is_a_miss_that_gets_replaced(cache):
    """Reading it used to wait for a writer forever (``--fast`` hung at start-up)."""
    path = cache.folder / "k.entry"
    os.mkfifo(path)
    got = []
    reader = threading.Thread(target=lambda: got.append(cache.read("k")), daemon=True)
    reader.start()
    reader.join(timeout=300)  # a hang guard: the read takes microseconds
    if reader.is_alive():  # the old code: let the blocked open through before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO entry blocked")
    assert got == [None] and cache.reads == []
    cache.write("k", b"rebuilt")
    assert path.is_file() and cache.read("k") == b"rebuilt"


def test_what_is_read_is_bounded_and_only_from_regular_files(cache, monkeypatch, tmp_path):
    cache.write("big", b"x" * 100)
    monkeypatch.setattr(disk_cache, "MAX_ENTRY_BYTES", 100)  # the digest line makes the entry larger
    assert cache.read("big") is None
    (cache.folder / "zero.entry").symlink_to("/dev/zero")
    (cache.folder / "folder.entry").mkdir()
    assert cache.read("zero") is None and cache.read("folder") is None and cache.reads == []


def test_the_entries_read_are_listed_and_can_be_dropped(cache):
    cache.write("a", b"payload")
    assert cache.read("a") == b"payload" and cache.read("b") is None
    assert cache.reads == [cache.folder / "a.entry"]
    drop_entries(cache.reads + [cache.folder / "never-written.entry"])
    assert cache.read("a") is None


def test_the_code_part_of_a_key_covers_every_module_of_the_package(tmp_path):
    """A change anywhere in the package (the model's modules included, not only the engines') changes the key."""
    import dmae_fast

    assert disk_cache.package_sha256() == disk_cache.package_sha256(Path(dmae_fast.__file__).parent)
    for tree, depth in (("a", 12), ("b", 24)):  # two trees that differ only in a model module
        for folder, name, text in (("engines", "cache.py", "x = 1\n"), ("model", "dmae.py", f"depth = {depth}\n")):
            (tmp_path / tree / folder).mkdir(parents=True, exist_ok=True)
            (tmp_path / tree / folder / name).write_text(text)
    assert disk_cache.package_sha256(tmp_path / "a") != disk_cache.package_sha256(tmp_path / "b")
