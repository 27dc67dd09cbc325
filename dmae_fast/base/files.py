"""A user's files, safely: reading a regular file only, never more than a stated limit; writing one
all at once, never over anything but a regular file."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from dmae_fast.base.errors import UserError

CACHE_ENVIRONMENT = "DMAE_FAST_CACHE"  # the package's cache folder ("off": none)


def cache_folder() -> Path | None:
    """The package's cache folder (compiled models, the C kernel): ``$DMAE_FAST_CACHE``, else
    ``$XDG_CACHE_HOME/dmae-fast``, else ``~/.cache/dmae-fast``; None when ``DMAE_FAST_CACHE=off``."""
    value = os.environ.get(CACHE_ENVIRONMENT, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dmae-fast"


def read_regular_file(path: str | os.PathLike[str], limit: int, what: str = "results file") -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes (UserError otherwise).

    A device (``/dev/zero``), pipe or socket is refused before it is read, and opened without
    blocking should one replace the file in between, so reading never hangs nor runs without bound."""
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


def write_regular_file(path: str | os.PathLike[str], data: bytes, overwrite: bool = False, what: str = "file") -> None:
    """Write ``data`` to ``path`` all at once (UserError, in one line, when it cannot be).

    The bytes go to a new hidden file beside ``path``, synced, and only then take ``path``'s name; on any failure
    ``path`` is as it was. An existing ``path`` is refused unless ``overwrite``, and then must be a regular file
    (a symbolic link to one has its target replaced)."""
    target = os.path.realpath(path) if os.path.islink(path) else os.fspath(path)
    _check_replaceable(path, target, overwrite, what)
    directory, name = os.path.split(target)
    fd, temporary = _create_hidden(directory or ".", name, path)
    try:
        try:
            with open(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            _check_replaceable(path, target, overwrite, what)  # nothing else may have taken the name since
            if overwrite:
                os.replace(temporary, target)
            else:
                _link_new(temporary, target, path)
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def _check_replaceable(path: str | os.PathLike[str], target: str, overwrite: bool, what: str) -> None:
    """Refuse an existing ``path`` that may not be replaced (not a regular file, or any file without ``overwrite``)."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        if target != os.fspath(path):
            raise UserError(f"{path} is a symbolic link to {target}, which does not exist; "
                            f"remove the link or name the {what} to write") from None
        return
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path} is a directory, not a {what}")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path} is not a regular file (a device, pipe or socket?); it is never replaced by a {what}")
    if not overwrite:
        raise UserError(f"{path} exists; pass --overwrite to replace it")


def _create_hidden(directory: str, name: str, path: str | os.PathLike[str]) -> tuple[int, str]:
    """A new empty file ``.NAME.RANDOM.tmp`` in ``directory`` (mode 0666 less the umask, as ``open``'s),
    open for writing: its descriptor and its path."""
    while True:
        temporary = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temporary
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror}") from None


def _link_new(temporary: str, target: str, path: str | os.PathLike[str]) -> None:
    """Give ``temporary`` the name ``target``, which must still be free (a hard link never replaces a file;
    where the file system has none, a rename after one more look)."""
    try:
        os.link(temporary, target)
    except FileExistsError:
        raise UserError(f"{path} exists; pass --overwrite to replace it") from None
    except OSError:
        if os.path.lexists(target):
            raise UserError(f"{path} exists; pass --overwrite to replace it") from None
        os.replace(temporary, target)
