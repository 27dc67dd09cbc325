"""Load an existing ``.pt2`` once in this (fresh) process and run one batch (a one-off; public API).

    python -X faulthandler load_once.py PACKAGE [--how loader|engine] [--device-index N]

``loader``: ``torch._inductor.aoti_load_package`` with the arguments dmae_fast's AOTIEngine
passes on a CPU (run_single_threaded False, device_index -1); ``engine``: through
``dmae_fast.engines.open_engine`` (sidecar, checksum, parity path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--how", choices=["loader", "engine"], default="loader")
    parser.add_argument("--device-index", type=int, default=-1)
    args = parser.parse_args()
    print(f"load_once: torch {torch.__version__}, {args.how}", flush=True)
    if args.how == "engine":
        from dmae_fast.engines.opening import open_engine

        engine = open_engine(args.package)
        print(f"load_once: opened {engine}", flush=True)
        return 0
    package = torch._inductor.aoti_load_package(args.package, run_single_threaded=False,
                                                device_index=args.device_index)
    shape = [int(s) for s in __import__("json").loads(Path(args.package + ".json").read_text())["input_shape"]]
    logits = package(torch.rand(4, *shape))
    print(f"load_once: ran, logits {tuple(logits.shape)}, finite {bool(torch.isfinite(logits).all())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
