"""CPU per test file, counting every process a test started (compilers and killed processes too).

    PYTHONPATH=bench/experiments/2026-12-07-suite-cost python -m pytest -q -n 2 --dist loadfile -p timeline
    python bench/experiments/2026-12-07-suite-cost/timeline.py   # CPU and wall per file, the costliest tests

As a pytest plugin (``-p timeline``), each worker appends one JSON line per finished test to LOG (default
/tmp/suite-timeline.jsonl): the worker, the test, the time, and the worker's CPU seconds so far, its own plus
those of every child it has waited for (and theirs, recursively: a rank's CPU reaches the test through its
launcher). A test's CPU is the difference to the worker's previous line; children reaped later (a module's
server, stopped at teardown) count to the test that reaped them. Run as a script, it summarizes LOG.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

LOG = "/tmp/suite-timeline.jsonl"


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    """The pytest hook: one line per finished test, in the worker that ran it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # the controller also sees each test finish; only the workers' CPU is the tests'
        return
    t = os.times()
    line = {"worker": worker, "test": nodeid, "time": time.time(),
            "cpu": t.user + t.system + t.children_user + t.children_system}
    with open(os.environ.get("SUITE_TIMELINE_LOG", LOG), "a") as log:
        log.write(json.dumps(line) + "\n")


def summarize(log: Path, top: int) -> None:
    by_worker: dict[str, list[dict]] = collections.defaultdict(list)
    for line in log.read_text().splitlines():
        row = json.loads(line)
        by_worker[row["worker"]].append(row)
    cpu: collections.Counter[str] = collections.Counter()
    wall: collections.Counter[str] = collections.Counter()
    tests = []
    for worker, rows in sorted(by_worker.items()):
        rows.sort(key=lambda row: row["time"])
        print(f"{worker}: {len(rows)} tests, last one ended {rows[-1]['time'] - rows[0]['time']:.1f} s after the "
              f"first; {rows[-1]['cpu']:.0f} CPU s in all")
        for before, row in zip(rows, rows[1:]):
            key = row["test"].split("::")[0]
            cpu[key] += row["cpu"] - before["cpu"]
            wall[key] += row["time"] - before["time"]
            tests.append((row["cpu"] - before["cpu"], row["time"] - before["time"], row["test"]))
    print(f"\n{sum(cpu.values()):.0f} CPU s between the workers' first and last tests; by file (CPU s, wall s):")
    for key, seconds in cpu.most_common(top):
        print(f"  {seconds:7.1f} {wall[key]:7.1f}  {key}")
    print(f"\nthe {top} costliest tests (CPU s, wall s):")
    for seconds, elapsed, test in sorted(tests, reverse=True)[:top]:
        print(f"  {seconds:7.1f} {elapsed:7.1f}  {test}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", default=LOG)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    summarize(Path(args.log), args.top)
