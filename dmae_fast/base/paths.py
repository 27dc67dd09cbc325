"""The user's paths, checked before anything opens them: one line naming the path and what is wrong with it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line


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


def dataset_path(spec: str) -> Path:
    """The dataset path ``spec`` (``~`` expanded), which must exist and be readable; UserError otherwise."""
    if str(spec) == "":
        raise UserError("the dataset path is empty")
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # ~user that does not exist
        raise UserError(f"cannot expand '~' in the dataset path {spec}: no such user") from None
    ensure_readable(path)
    return path


def check_readable_file(path: Path, what: str) -> None:
    """UserError unless ``path`` is a regular file this process can read; ``what`` names it ("checkpoint")."""
    if not path.exists():
        raise UserError(f"{what} {path} does not exist")
    if not path.is_file():
        raise UserError(f"{what} {path} is not a file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{what} {path} is not readable (permission denied)")
