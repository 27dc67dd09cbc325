"""Entries on disk in the package's cache folder (:func:`~dmae_fast.base.files.cache_folder`): what a start would
otherwise rebuild (the ``--fast`` body's graphs and verdicts, the sequential test's tables).

An entry, named by a key (:func:`digest_key`), holds the hex SHA-256 of its payload, a newline, then the payload,
and is renamed into place whole; one that cannot be read or does not match its digest is a miss, rebuilt. Without
a folder (``DMAE_FAST_CACHE=off``, or one that cannot be written) every read misses and writes are dropped."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import CACHE_ENVIRONMENT, cache_folder, read_regular_file

# The largest entry read: an ONNX graph is at most 2 GiB (protobuf's limit), plus the digest line.
MAX_ENTRY_BYTES = (2 << 30) + 65


def digest_key(**parts: object) -> str:
    """The hex SHA-256 of ``parts`` (JSON values, in any order)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@functools.cache
def installed_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """The installed version of each distribution in ``names`` (None: absent)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.cache
def package_sha256(root: Path = Path(__file__).parents[1]) -> str:
    """The SHA-256 of the Python sources under ``root`` (default the whole package), names and contents."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def drop_entries(paths: list[Path]) -> None:
    """Delete the entries ``paths`` (what was built from them failed); one already gone is fine."""
    for path in paths:
        with contextlib.suppress(OSError):  # else the next write replaces it, or turns the cache off
            path.unlink()


class DiskCache:
    """The cache folder, or None (every read misses, writes are dropped). ``reads`` collects the path of every
    entry read (a hit); ``notice`` (optional) hears, once, why the cache was turned off."""

    def __init__(self, folder: Path | None, notice: Callable[[str], object] | None = None,
                 reads: list[Path] | None = None) -> None:
        self.folder, self._notice = folder, notice
        self.reads = [] if reads is None else reads

    @classmethod
    def open(cls, notice: Callable[[str], object] | None = None, reads: list[Path] | None = None) -> DiskCache:
        """The configured cache, created if missing; no cache (and one ``notice``) if it cannot be written."""
        try:
            folder = cache_folder()
        except RuntimeError:  # no home directory
            folder = None
        cache = cls(folder, notice, reads)
        if cache.folder is not None:
            try:
                cache.folder.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryFile(dir=cache.folder):
                    pass
            except OSError as error:
                cache._give_up(error)
        return cache

    def _give_up(self, error: OSError) -> None:
        if self._notice is not None:
            self._notice(f"the cache {self.folder} cannot be written ({error.strerror or error}); running "
                         f"uncached (set {CACHE_ENVIRONMENT} to another folder, or to off)")
        self.folder = None

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}.entry"

    def read(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (absent, unreadable, too large, or not matching its digest)."""
        if self.folder is None:
            return None
        path = self._path(key)
        try:
            data = read_regular_file(path, MAX_ENTRY_BYTES, "cache entry")
        except UserError:  # a FIFO would block the read forever; read_regular_file refuses it
            return None
        digest, _, payload = data.partition(b"\n")
        if digest.decode("ascii", "replace") != hashlib.sha256(payload).hexdigest():
            return None
        self.reads.append(path)
        return payload

    def write(self, key: str, payload: bytes) -> None:
        """Store ``payload`` under ``key``, atomically; a failure (disk full) turns the cache off, with a notice."""
        if self.folder is None:
            return
        try:
            handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            try:
                with os.fdopen(handle, "wb") as file:
                    file.write(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
                os.replace(temporary, self._path(key))
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError as error:
            self._give_up(error)

    def subfolder(self, *names: str) -> Path | None:
        """A folder inside the cache for another library's own cache files, or None without a cache."""
        return None if self.folder is None else self.folder.joinpath(*names)
