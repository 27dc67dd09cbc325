"""What every command-line entry point shares (dmae_fast.cli's and bench's): one-line errors for bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from dmae_fast.base.errors import AlreadyReported, Interrupted, UserError, forget_signal, interrupt_on_signals, starting


def import_torch_while_starting(prog: str) -> None:
    """Import torch (numpy with it) where a signal ends the command at once, in one line: an
    :class:`Interrupted` raised inside torch's import of numpy is swallowed by torch's C extension and
    leaves numpy half-imported (a traceback later). Call it after the options are checked."""
    with starting(prog):
        import torch  # noqa: F401


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors become :class:`UserError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def run_reporting_errors(prog: str, body: Callable[[], int]) -> int:
    """Run ``body`` with one-line endings instead of tracebacks: a :class:`UserError` becomes ``prog: error: ...`` on
    stderr and exit 2, and so does an operating-system error no code path named better (a full disk: the machine,
    not a bug); SIGINT/SIGTERM become one line saying what was kept, exit 130/143."""
    interrupt_on_signals()
    try:
        return body()
    except AlreadyReported as reported:
        return reported.exit_status
    except Interrupted as stop:
        forget_signal()
        print(f"{prog}: interrupted by {stop.name}; {stop.kept or 'what was written so far is left as it is'}",
              file=sys.stderr)
        return stop.exit_status
    except UserError as error:
        message = " ".join(str(error).split())
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except OSError as error:
        where = f": {error.filename}" if error.filename else ""
        message = " ".join(f"{error.strerror or error}{where}".split())
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
