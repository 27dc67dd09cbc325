"""Console-script entry points: SIGINT/SIGTERM are handled before the slow imports (torch)
begin, so Ctrl-C at any moment ends a command with one line, never a traceback."""

from __future__ import annotations

import importlib
import sys

from dmae_fast.errors import Interrupted, interrupt_on_signals


def _start(prog: str, module: str) -> int:
    interrupt_on_signals()
    try:
        main = importlib.import_module(module).main
    except Interrupted as stop:
        print(f"{prog}: interrupted by {stop.name} while starting; nothing was written", file=sys.stderr)
        return stop.exit_status
    return main()


def certify() -> int:
    return _start("dmae-certify", "dmae_fast.cli.certify")


def train() -> int:
    return _start("dmae-train", "dmae_fast.cli.train")


def export() -> int:
    return _start("dmae-export", "dmae_fast.cli.export")


def bench() -> int:
    return _start("dmae-bench", "dmae_fast.cli.bench")


def serve() -> int:
    return _start("dmae-serve", "dmae_fast.cli.serve")
