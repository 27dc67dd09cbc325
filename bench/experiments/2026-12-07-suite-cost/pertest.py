"""pytest plugin: each test's wall time and the Dynamo graphs it compiled in the test process.

Usage: ``PYTHONPATH=bench/experiments/2026-12-07-suite-cost python -m pytest -q -p pertest tests/test_cpu_fast.py``,
once with ``TORCHINDUCTOR_CACHE_DIR`` an empty folder (a cold compile cache) and once again (warm). Writes
``/tmp/pertest-<worker>.json``: ``[test id, seconds, graphs]``; graphs is Dynamo's ``unique_graphs`` counter after
the test less before it (negative where the test resets Dynamo).
"""

from __future__ import annotations

import json
import os
import sys
import time

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
