"""Part files: the rows of a multi-process run, one file per process (``<out>.parts/rank00003-<random>.tsv``:
a fresh name per process, so none appends to a torn file), merged by rank 0 into ``--out`` sorted by ``idx``.

A merge is crash-safe: ``--out`` is replaced by a complete file before the parts go, so a crash in between
leaves identical rows in both places, which merging again accepts; two *different* rows for one image are refused."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import write_regular_file
from dmae_fast.results.format import COLUMNS, Kind, read_row_lines

REPLACES_OUT = "REPLACES_OUT"  # marker: these parts belong to an --overwrite run, not to --out's rows; holds its seed


def parts_dir(out: str | os.PathLike[str]) -> Path:
    """``results.tsv`` -> ``results.tsv.parts/``."""
    return Path(f"{os.fspath(out)}.parts")


def has_parts(out: str | os.PathLike[str]) -> bool:
    return parts_dir(out).is_dir()


def replaces_out(out: str | os.PathLike[str]) -> bool:
    """Whether the parts were written by an ``--overwrite`` run (so --out's rows are not theirs)."""
    return (parts_dir(out) / REPLACES_OUT).exists()


def start_parts(out: str | os.PathLike[str], replacing: bool, seed: int) -> None:
    """Create the parts folder (kept if there), marking it with the run's noise ``seed`` when the run replaces
    ``--out`` (whose record is written only at the end: a restart reads the seed of its rows here)."""
    folder = parts_dir(out)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file; the parts of a multi-process run are written there: remove it")
    folder.mkdir(exist_ok=True)
    if replacing:
        (folder / REPLACES_OUT).write_text(f"{seed}\n")


def replacing_seed(out: str | os.PathLike[str]) -> int:
    """The noise seed of the parts of an ``--overwrite`` run (:func:`start_parts`)."""
    marker = parts_dir(out) / REPLACES_OUT
    text = marker.read_text().strip() if marker.is_file() else ""
    if not (text.isascii() and text.isdigit() and int(text) < 2**64):
        raise UserError(f"{marker} names no noise seed, so its rows cannot be continued; run again with --overwrite")
    return int(text)


def part_path(out: str | os.PathLike[str], rank: int) -> Path:
    """A new part file for ``rank`` (never an existing one)."""
    return parts_dir(out) / f"rank{rank:05d}-{secrets.token_hex(4)}.tsv"


def clear_parts(out: str | os.PathLike[str]) -> None:
    shutil.rmtree(parts_dir(out), ignore_errors=True)


def merge_parts(out: str | os.PathLike[str], kind: Kind, into: str | os.PathLike[str],
                extra: tuple[str, ...] = ()) -> int:
    """Write ``into`` (``out``, or ``out.partial`` for an --overwrite run) = its own rows + the rows of every part of
    ``out``, sorted by idx, replacing it only by a complete file; then remove the parts. Returns the number of rows."""
    into = os.fspath(into)
    folder = parts_dir(out)
    parts = sorted(folder.glob("rank*.tsv")) if folder.is_dir() else []
    sources = ([Path(into)] if os.path.exists(into) else []) + parts
    rows: dict[int, tuple[str, Path]] = {}
    for source in sources:
        for line in read_row_lines(source, kind, extra):
            idx = _row_index(line, source)
            seen = rows.get(idx)
            if seen is not None and seen[0] != line:
                raise UserError(f"image idx {idx} has two different rows, in {seen[1]} and {source}: the files were "
                                "edited or come from two runs (remove one row, or start over with --overwrite)")
            rows[idx] = (line, source)
    text = "".join(line + "\n" for line in ["\t".join(COLUMNS[kind] + extra), *(rows[idx][0] for idx in sorted(rows))])
    write_regular_file(into, text.encode("utf-8"), overwrite=True, what="results file")
    _sync_directory(os.path.dirname(os.path.abspath(into)))
    clear_parts(out)
    return len(rows)


def _row_index(line: str, source: Path) -> int:
    first = line.split("\t", 1)[0]
    if not (first.isascii() and first.isdigit()):
        raise UserError(f"{source}: a row starts with {first!r}, not an image idx")
    return int(first)


def _sync_directory(path: str) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
