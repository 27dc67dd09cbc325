"""pytest plugin: the wall and CPU time of every in-process certification run and export, by test.

Usage (from the repository root)::

    EXPORT_MOD=dmae_fast.export PYTHONPATH=bench/experiments/2026-12-07-suite-cost \
        python -m pytest -q -n 2 --dist loadfile -p runcost

Each worker writes ``/tmp/runcost-<worker>.json``: ``[test id, "certify" | "export", wall s, CPU s]`` per call.
A run is counted at ``Run.certify``, which both ``certify_dataset`` and ``dmae-certify`` call; an export at
``dmae_fast.export.export_engines``. CPU is this process's only (a compiler's child processes are not in it).
"""

from __future__ import annotations

import importlib
import json
import os
import time

import pytest

_current: dict[str, str | None] = {"test": None}
_calls: list[tuple[str | None, str, float, float]] = []


def _timed(owner: object, name: str, kind: str) -> None:
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            _calls.append((_current["test"], kind, time.perf_counter() - wall, time.process_time() - cpu))

    setattr(owner, name, timed)


def pytest_configure(config: pytest.Config) -> None:  # before collection: the test modules import the wrappers
    from dmae_fast.run import driver

    _timed(driver.Run, "certify", "certify")
    _timed(importlib.import_module(os.environ.get("EXPORT_MOD", "dmae_fast.export")), "export_engines", "export")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _current["test"] = item.nodeid  # a module fixture's runs count under the first test that needs it


def pytest_unconfigure(config: pytest.Config) -> None:
    with open(f"/tmp/runcost-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json", "w") as file:
        json.dump(_calls, file)
