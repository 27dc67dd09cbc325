"""The wall and CPU time of every in-process certification run and export in the test suite, by test file.

    EXPORT_MOD=dmae_fast.export PYTHONPATH=bench/experiments/2026-12-07-suite-cost \
        python -m pytest -q -n 2 --dist loadfile -p runcost
    python bench/experiments/2026-12-07-suite-cost/runcost.py   # the calls summed by test file

As a pytest plugin (``-p runcost``), each worker writes ``/tmp/runcost-<worker>.json``: ``[test id, "certify" |
"export", wall s, CPU s]`` per call. A run is counted at ``Run.certify``, which both ``certify_dataset`` and
``dmae-certify`` call; an export at ``dmae_fast.export.export_engines``. CPU is the worker's own (a compiler's child
processes are not in it); a module fixture's calls count under the first test that needs it. Run as a script, it
sums the logs by test file.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import time
from pathlib import Path

import pytest

LOGS = "/tmp/runcost-*.json"
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
    _current["test"] = item.nodeid


def pytest_unconfigure(config: pytest.Config) -> None:
    with open(LOGS.replace("*", os.environ.get("PYTEST_XDIST_WORKER", "main")), "w") as file:
        json.dump(_calls, file)


def summarize() -> None:
    calls = [call for log in sorted(Path("/").glob(LOGS.lstrip("/"))) for call in json.loads(log.read_text())]
    for kind in ("certify", "export"):
        mine = [call for call in calls if call[1] == kind]
        print(f"{kind}: {len(mine)} calls, wall {sum(c[2] for c in mine):.1f} s, CPU {sum(c[3] for c in mine):.1f} s")
        by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for test, _, wall, cpu in mine:
            totals = by_file[(test or "?").split("::")[0]]
            totals[0], totals[1], totals[2] = totals[0] + 1, totals[1] + wall, totals[2] + cpu
        print("  wall_s  cpu_s  calls  file")
        for name, (count, wall, cpu) in sorted(by_file.items(), key=lambda item: -item[1][1]):
            print(f"  {wall:6.1f} {cpu:6.1f} {count:6.0f}  {name}")


if __name__ == "__main__":
    summarize()
