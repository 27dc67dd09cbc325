"""Make the faster noise-once tiling of the fused front end the default, for the rest of one device call.

Reads the micro-benchmark's JSON (``fused_frontend_bench.py``) and reorders ``TILES`` in
``kernels/fused_frontend.py`` (the first is what the bodies launch) so that the end-to-end timings
of the same call run the tiling that measured faster ("wide" or "split"). Run on the device
machine's copy of the tree only; the committed default follows the measurement.

    python bench/experiments/2026-11-27-gpu/pick_tiles.py RESULTS.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT = 'TILES = ("wide", "split", "per-element")'


def main(results: Path) -> int:
    source = Path(__file__).resolve().parents[3] / "kernels" / "fused_frontend.py"
    ms = {row["variant"]: row["ms"] for row in json.loads(results.read_text())["results"]}
    best = min(("wide", "split"), key=lambda name: ms.get(name, float("inf")))
    text = source.read_text()
    if DEFAULT not in text:
        print(f"{source}: TILES is not the expected line; left alone")
        return 1
    order = (best, "split" if best == "wide" else "wide", "per-element")
    source.write_text(text.replace(DEFAULT, f"TILES = {order!r}"))
    print(f"fused front end tiles for the timings: {best} (ms: {ms})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
