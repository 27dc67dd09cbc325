"""What every command-line entry point shares: one-line errors for bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from dmae_fast.errors import UserError


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors become :class:`UserError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def run_reporting_errors(prog: str, body: Callable[[], int]) -> int:
    """Run ``body``; a :class:`UserError` becomes ``prog: error: ...`` on stderr and exit 2."""
    try:
        return body()
    except UserError as error:
        message = " ".join(str(error).split())
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; rows already written are kept", file=sys.stderr)
        return 130
