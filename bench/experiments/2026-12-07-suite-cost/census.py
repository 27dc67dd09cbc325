"""Which Python processes the test suite starts, and the CPU each uses.

    python census.py install          # every later Python process of this environment logs itself at exit
    python -m pytest -q -n 2 --dist loadfile
    python census.py summarize        # CPU seconds per test file, and the costliest processes
    python census.py uninstall

A ``.pth`` file in site-packages imports a small module that, at exit, appends one JSON line to LOG
(default /tmp/suite-census.jsonl): the test that started the process (``PYTEST_CURRENT_TEST``, which the
pytest workers pass on to their children), argv, wall seconds since start-up and CPU seconds. A process
killed by a signal writes nothing, nor do non-Python programs (compilers).
"""

from __future__ import annotations

import argparse
import collections
import json
import site
from pathlib import Path

NAME = "zz_suite_census"
LOG = "/tmp/suite-census.jsonl"
MODULE = '''import atexit, json, os, resource, sys, time
_start = time.time()
def _log():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ.get("SUITE_CENSUS_LOG", %r), "a") as log:
        log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": sys.argv[:4],
                              "wall": time.time() - _start, "cpu": usage.ru_utime + usage.ru_stime}) + "\\n")
atexit.register(_log)
''' % LOG


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["install", "uninstall", "summarize"])
    parser.add_argument("--log", default=LOG)
    args = parser.parse_args()
    packages = Path(site.getsitepackages()[0])
    if args.action == "install":
        (packages / f"{NAME}.py").write_text(MODULE)
        (packages / f"{NAME}.pth").write_text(f"import {NAME}\n")
    elif args.action == "uninstall":
        for suffix in (".py", ".pth"):
            (packages / f"{NAME}{suffix}").unlink(missing_ok=True)
    else:
        summarize(Path(args.log))


def summarize(log: Path) -> None:
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    cpu: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for row in rows:
        key = row["test"].split("::")[0] or "(no test: pytest itself and its workers)"
        cpu[key] += row["cpu"]
        count[key] += 1
    print(f"{len(rows)} processes, {sum(cpu.values()):.0f} CPU s")
    for key, seconds in cpu.most_common():
        print(f"{seconds:8.1f} CPU s {count[key]:4d} processes  {key}")


if __name__ == "__main__":
    main()
