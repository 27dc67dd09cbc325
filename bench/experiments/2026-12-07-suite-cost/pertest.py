"""Each test's wall time and the Dynamo graphs it compiled in the test process, on a cold and a warm compile cache.

    export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=bench/experiments/2026-12-07-suite-cost
    python -m pytest -q -p pertest tests/test_cpu_fast.py && mv /tmp/pertest-main.json /tmp/cold.json   # cold
    python -m pytest -q -p pertest tests/test_cpu_fast.py && mv /tmp/pertest-main.json /tmp/warm.json   # warm
    python bench/experiments/2026-12-07-suite-cost/pertest.py /tmp/cold.json /tmp/warm.json

As a pytest plugin (``-p pertest``) it writes ``/tmp/pertest-<worker>.json``: ``[test id, seconds, graphs]``;
graphs is Dynamo's ``unique_graphs`` counter after the test less before it (negative where the test resets
Dynamo). Run as a script, it puts a cold and a warm log side by side, the costliest tests first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pytest

_rows: list[tuple[str, float, int]] = []


def _graphs() -> int:
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo import utils

    return utils.counters["stats"].get("unique_graphs", 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    graphs, start = _graphs(), time.perf_counter()
    yield
    _rows.append((item.nodeid, round(time.perf_counter() - start, 2), _graphs() - graphs))


def pytest_sessionfinish(session: pytest.Session) -> None:
    with open(f"/tmp/pertest-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json", "w") as file:
        json.dump(_rows, file)


def compare(cold: Path, warm: Path, least: float = 0.5) -> None:
    """Tests of at least ``least`` seconds cold: cold s, warm s, graphs (cold run)."""
    cold_rows = {test: (seconds, graphs) for test, seconds, graphs in json.loads(cold.read_text())}
    warm_rows = {test: seconds for test, seconds, _ in json.loads(warm.read_text())}
    print("cold_s\twarm_s\tgraphs\ttest")
    for test, (seconds, graphs) in sorted(cold_rows.items(), key=lambda item: -item[1][0]):
        if seconds >= least:
            print(f"{seconds}\t{warm_rows.get(test, '')}\t{graphs}\t{test.split('::', 1)[-1]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cold", type=Path)
    parser.add_argument("warm", type=Path)
    arguments = parser.parse_args()
    compare(arguments.cold, arguments.warm)
