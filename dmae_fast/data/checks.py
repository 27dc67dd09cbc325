"""Checks on the user's paths and options shared by the data sources, each failing with a
one-line :class:`~dmae_fast.base.errors.UserError`."""

from __future__ import annotations

import os
import stat

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line

SPLITS = ("train", "test")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")


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
