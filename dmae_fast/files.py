"""Reading a user's file safely: a regular file only, and never more than a stated limit."""

from __future__ import annotations

import os
import stat

from dmae_fast.errors import UserError


def read_regular_file(path: str | os.PathLike[str], limit: int, what: str = "results file") -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes (UserError otherwise).

    A device (``/dev/zero``), pipe or socket is refused before it is read, and opened without
    blocking should one replace the file in between, so reading never hangs nor runs without bound.
    """
    not_regular = f"{path} is not a regular file (a device, pipe or socket?); a {what} must be one"
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{path} is a directory, not a {what}")
        if not stat.S_ISREG(mode):
            raise UserError(not_regular)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    too_large = f"{path} is larger than {limit / 2**20:g} MiB, the most a {what} may be"
    with open(fd, "rb") as f:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UserError(not_regular)
        if status.st_size > limit:
            raise UserError(too_large)
        try:
            data = f.read(limit + 1)  # the file may have grown since
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise UserError(too_large)
    return data
