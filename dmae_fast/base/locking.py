"""One writer per output: an exclusive lock on a results file or a run directory.

``with OutputLock(target):`` holds ``flock`` on a lock file beside (or inside) the target while the command writes
it; a second command on the same output is refused at once, naming the holder's pid. The lock dies with the
process, so a crash (even SIGKILL) never leaves an output locked."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from dmae_fast.base.errors import UserError


class OutputLock:
    """An exclusive, non-blocking lock on ``target`` for this process (a context manager)."""

    def __init__(self, target: str | os.PathLike[str], what: str = "output") -> None:
        self.target, self.what = Path(target), what
        # results.tsv -> results.tsv.lock; a directory run/ -> run/.lock
        self.path = self.target / ".lock" if self.target.is_dir() else self.target.with_name(self.target.name + ".lock")
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise UserError(f"{self.what} {self.target} is being written by another process (pid {holder}); "
                                "wait for it to finish or choose another output") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:  # the previous holder removed it between our open and lock
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)  # releases the lock
        self._fd = None
