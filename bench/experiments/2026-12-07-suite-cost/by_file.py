"""Per-file test time of A B B A suite runs (suite_abba.sh's --junitxml files), old against new.

Usage: python by_file.py TIMES_FILE [RUN ...]   (reads TIMES_FILE.<run>-<old|new>.xml, all runs or those named)
Prints, for each test file, the mean seconds of the old and the new runs and their difference, the largest first.
"""

from __future__ import annotations

import collections
import glob
import sys
import xml.etree.ElementTree as ElementTree


def seconds_by_file(path: str) -> dict[str, float]:
    totals: dict[str, float] = collections.Counter()
    for case in ElementTree.parse(path).iter("testcase"):
        totals[(case.get("classname") or "?").split(".")[-1]] += float(case.get("time") or 0)
    return totals


def main(times: str, wanted: list[str]) -> None:
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for path in sorted(glob.glob(f"{times}.*-*.xml")):
        if wanted and path.removeprefix(f"{times}.").split("-")[0] not in wanted:
            continue
        runs[path.rsplit("-", 1)[1].removesuffix(".xml")].append(seconds_by_file(path))
    mean = {tag: {f: sum(r.get(f, 0.0) for r in rs) / len(rs) for f in set().union(*rs)} for tag, rs in runs.items()}
    files = set(mean["old"]) | set(mean["new"])
    rows = sorted(((mean["old"].get(f, 0.0), mean["new"].get(f, 0.0), f) for f in files),
                  key=lambda row: -abs(row[1] - row[0]))
    print(f"{'old s':>8} {'new s':>8} {'new-old':>8}  file   ({len(runs['old'])} old, {len(runs['new'])} new runs)")
    for old, new, name in rows:
        print(f"{old:8.1f} {new:8.1f} {new - old:+8.1f}  {name}")
    print(f"{sum(mean['old'].values()):8.1f} {sum(mean['new'].values()):8.1f} "
          f"{sum(mean['new'].values()) - sum(mean['old'].values()):+8.1f}  all")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
