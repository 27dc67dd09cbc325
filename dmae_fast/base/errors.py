"""The exceptions that end a command without a traceback, and what SIGINT/SIGTERM do.

Command-line entry points print a :class:`UserError` as one line with exit status 2, and :class:`Interrupted`
(SIGINT or SIGTERM) as one line saying what was kept, exit status 128 + the signal number; :class:`AlreadyReported`
(another rank prints the line) ends silently; everything else is a bug and keeps its traceback. While a command is
still starting (:func:`starting`), a signal ends it at once instead."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any


class UserError(Exception):
    """Bad input: a missing file, a wrong format, an out-of-range option, ..."""


def raise_first(checks: Iterable[tuple[bool, str]], error: type[Exception] = UserError, prefix: str = "") -> None:
    """Raise ``error(prefix + message)`` for the first ``(ok, message)`` of ``checks`` that is not ok."""
    for ok, message in checks:
        if not ok:
            raise error(prefix + message)


class AlreadyReported(Exception):
    """A failure another process of the same job reports (or has reported) in one line: this
    process ends with ``exit_status`` and prints nothing, so a job prints one line, not one per rank."""

    def __init__(self, exit_status: int) -> None:
        super().__init__(exit_status)
        self.exit_status = exit_status


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that no ``except Exception``
    swallows it; ``kept``, filled in on the way out, tells the user what is on disk and how to continue."""

    def __init__(self, signum: int, kept: str = "") -> None:
        super().__init__(signum, kept)
        self.signum, self.kept = signum, kept

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


# The last signal since interrupt_on_signals(): the exception the handler raises can be swallowed where it
# lands (torch.compile's guards take one for a failed guard: bench/results/2026-11-25-signal-loss/).
_received: int | None = None
# torch's DataLoader handler of SIGCHLD, set aside from the first signal until forget_signal(): the signal may
# also have killed the DataLoader workers, and that handler would raise their deaths as a second error.
_child_handler: Callable[[int, FrameType | None], Any] | int | None = None


def _raise_interrupted(signum: int, frame: object) -> None:
    global _received, _child_handler
    _received = signum
    if _child_handler is None:
        _child_handler = signal.signal(signal.SIGCHLD, _ignore)  # not SIG_DFL: a SIGCHLD may be pending
    raise Interrupted(signum)


def _ignore(signum: int, frame: object) -> None:
    """A Python handler that does nothing."""


def interrupt_on_signals() -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is threading.main_thread():
        forget_signal()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _raise_interrupted)


def forget_signal() -> None:
    """A command has reported the signal: later work in this process starts afresh."""
    global _received, _child_handler
    _received = None
    if _child_handler is not None:
        signal.signal(signal.SIGCHLD, _child_handler)
        _child_handler = None


def raise_if_interrupted() -> None:
    """Raise :class:`Interrupted` if a signal's exception was swallowed on its way; long loops call this each step."""
    if _received is not None:
        raise Interrupted(_received)


def exit_on_signals(prog: str | None) -> dict[int, Any]:
    """Make SIGINT and SIGTERM end the process at once with ``prog: interrupted by SIGTERM while starting;
    nothing was written``, exit status 128 + N (silently for ``prog`` None); returns the handlers replaced. For
    a command that has written nothing yet (:func:`starting`) or whose ``main`` has returned; main thread only.

    Not by raising :class:`Interrupted`: an extension's initialisation can swallow it inside an import, leaving
    a module half-imported, and after ``main`` Python's exit handlers print it with a traceback."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def end(signum: int, frame: object) -> None:
        if prog is not None:
            name = signal.Signals(signum).name
            os.write(2, f"{prog}: interrupted by {name} while starting; nothing was written\n".encode())
        os._exit(128 + signum)

    return {signum: signal.signal(signum, end) for signum in (signal.SIGINT, signal.SIGTERM)}


@contextlib.contextmanager
def starting(prog: str | None) -> Iterator[None]:
    """:func:`exit_on_signals` for the block (a command's imports and checks before it writes anything), then undone."""
    previous = exit_on_signals(prog)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
