"""The exact test's tables kept on disk (:mod:`dmae_fast.base.disk_cache`), so that a design's boundaries and
radius family are computed once per machine rather than once per run (seconds each: the DP).

An entry is keyed by what the table is (``what``), every input of its computation, the NumPy and SciPy versions
and the SHA-256 of the ``stats`` package's sources (any change of the computation makes new keys); it holds the
arrays as an ``.npz`` without pickled objects, behind the cache's own SHA-256 of the payload. A table read back
must also pass its builder's ``check`` (shapes, dtypes, ranges, the nesting the proofs rely on); one that does not,
or cannot be read, is recomputed and written again. With ``DMAE_FAST_CACHE=off`` or an unwritable folder, every
table is computed."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dmae_fast.base.disk_cache import DiskCache, digest_key, installed_versions, package_sha256

FORMAT_VERSION = 1
STATS_SOURCES = Path(__file__).parent

Tables = tuple[np.ndarray, ...]


def table_key(what: str, **inputs: object) -> str:
    """The cache key of table ``what`` computed from ``inputs`` (JSON values) by this package's ``stats`` code."""
    return digest_key(format=FORMAT_VERSION, what=what, libraries=installed_versions(("numpy", "scipy")),
                      code=package_sha256(STATS_SOURCES), inputs=inputs)


def cached_tables(what: str, build: Callable[[], Tables], check: Callable[[Tables], bool],
                  **inputs: object) -> Tables:
    """``build()``'s arrays, read from the disk cache when an entry of these ``inputs`` is there and passes
    ``check``, else built and stored; each returned read-only."""
    cache = DiskCache.open()
    key = table_key(what, **inputs)
    payload = cache.read(key)
    tables = None if payload is None else _loaded(payload)
    if tables is None or not check(tables):
        tables = build()
        cache.write(key, _dumped(tables))
    for table in tables:
        table.setflags(write=False)
    return tables


def _dumped(tables: Tables) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, *tables)
    return buffer.getvalue()


def _loaded(payload: bytes) -> Tables | None:
    """The arrays of an entry, or None where it is not a readable ``.npz`` of plain arrays."""
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
            return tuple(np.array(archive[f"arr_{i}"]) for i in range(len(archive.files)))
    except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile):
        return None
