"""Subprocesses that stop each time a chosen function has finished until the test lets them go.

A run to be signalled mid-run needs no long run: with :func:`holding`'s environment a process waits after every
call of the function (a results row written, a training checkpoint saved) until :func:`let_go`, so a signal
sent once the first call is done always lands mid-run, however loaded the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

ROW_WRITTEN = "dmae_fast.results.writer:ResultsWriter.write"
CHECKPOINT_SAVED = "dmae_fast.train.checkpointing:save_training_state"

HOLD_AFTER_EACH_CALL = """
import importlib.machinery, os, sys, time


# Each call of HOLD_AFTER ("module:function" or "module:Class.method") is followed by a wait until the file
# HOLD_UNTIL exists.
class HoldAfterEachCall:
    def find_spec(self, name, path=None, target=None):
        module_name, _, attribute = os.environ.get("HOLD_AFTER", "").partition(":")
        if name != module_name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            *outer, last = attribute.split(".")
            owner = module
            for part in outer:
                owner = getattr(owner, part)
            call = getattr(owner, last)

            def call_and_hold(*args, **kwargs):
                result = call(*args, **kwargs)
                while not os.path.exists(os.environ["HOLD_UNTIL"]):
                    time.sleep(0.05)
                return result

            setattr(owner, last, call_and_hold)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, HoldAfterEachCall())
"""


def with_site(folder: Path, code: str) -> dict[str, str]:
    """The environment of processes that run ``code`` (their ``sitecustomize``) before anything else."""
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(code)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def holding(folder: Path, after: str = ROW_WRITTEN) -> dict[str, str]:
    """The environment of processes that stop after each call of ``after`` until :func:`let_go` (``folder``)."""
    return {**with_site(folder, HOLD_AFTER_EACH_CALL), "HOLD_AFTER": after, "HOLD_UNTIL": str(folder / "go")}


def let_go(folder: Path) -> None:
    """Processes started with ``holding(folder)`` run on (and hold no more)."""
    (folder / "go").touch()
