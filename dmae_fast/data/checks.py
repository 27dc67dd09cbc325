"""Checks on the user's paths and options shared by the data sources, each failing with a
one-line :class:`~dmae_fast.base.errors.UserError`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line

SPLITS = ("train", "test")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")


def ensure_readable(path: Path) -> bool:
    """Whether ``path`` is a directory; UserError unless it exists and can be read (and listed, for a directory)."""
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"path does not exist: {path}") from None
    except OSError as exc:  # a symlink loop, a name too long, no permission to search a parent
        raise UserError(f"cannot access path {path}: {exc.strerror or one_line(exc)}") from None
    except ValueError as exc:  # a NUL character
        raise UserError(f"invalid path {str(path)!r}: {one_line(exc)}") from None
    if not os.access(path, os.R_OK | os.X_OK if is_dir else os.R_OK):
        raise UserError(f"path is not readable: {path}")
    return is_dir


def file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as an image file (``None`` if it is a regular file). Checked before PIL
    opens it: opening a FIFO would wait for a writer forever."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return exc.strerror or one_line(exc)
    except ValueError as exc:  # a NUL character
        return one_line(exc)
    if stat.S_ISDIR(mode):
        return "it is a directory"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    return None
