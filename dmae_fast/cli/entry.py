"""Console-script entry points. Once a command handles SIGINT/SIGTERM (``run_reporting_errors``) it says itself how
a signal ended it; before that, and after its ``main`` returns, a signal ends it at once (in one line while it starts,
silently while Python shuts down: :func:`dmae_fast.base.errors.exit_on_signals`), never with a traceback."""

from __future__ import annotations

import contextlib
import importlib
import sys
from functools import partial

from dmae_fast.base.errors import Interrupted, exit_on_signals


def start(prog: str | None, module: str) -> int:
    """Run ``module.main()`` as the command ``prog`` (None: a rank whose launcher speaks for it); the exit status."""
    exit_on_signals(prog)
    try:
        status = importlib.import_module(module).main()
        with contextlib.suppress(OSError):  # what it printed, before a signal may end the process at once
            sys.stdout.flush()
        exit_on_signals(None)
    except Interrupted as stop:  # in the instant around the command's own handling: at its end, e.g. the
        status = stop.exit_status  # launcher's SIGTERM to a rank that has just ended by itself on a lost peer
        exit_on_signals(None)
    return status


# The console scripts (pyproject.toml's [project.scripts]).
certify = partial(start, "dmae-certify", "dmae_fast.cli.certify")
train = partial(start, "dmae-train", "dmae_fast.train.command")
export = partial(start, "dmae-export", "dmae_fast.export.command")
bench = partial(start, "dmae-bench", "dmae_fast.bench.command")
sound_table = partial(start, "dmae-sound-table", "dmae_fast.cli.sound_table")
serve = partial(start, "dmae-serve", "dmae_fast.cli.serve")
