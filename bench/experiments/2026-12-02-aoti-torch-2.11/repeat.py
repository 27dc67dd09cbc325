"""Run one command N times, each in a fresh child process, and count how each try ended.

A one-off for the torch 2.11 ``.pt2`` crash (bench/results/2026-12-02-aoti-torch-2.11/):
each try runs ``python -X faulthandler ...`` (the command's own interpreter is whatever is
named), so a segmentation fault is a row (exit -11 and the fault handler's stack), not the
end of the run. ``{i}`` in the command is replaced by the try's number (a fresh output
folder per try).

    python repeat.py --tries 20 --log DIR/export-image.tsv -- VENV/bin/python -X faulthandler VENV/bin/dmae-export ...
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--log", required=True, help="TSV of try, exit, seconds, last line; crash tails beside it")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = [a for a in args.command if a != "--"]
    log = Path(args.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with log.open("w") as table:
        table.write("try\texit\tseconds\tlast line\n")
        for i in range(args.tries):
            start = time.perf_counter()
            try:
                done = subprocess.run([a.replace("{i}", str(i)) for a in command], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
                code, output = done.returncode, done.stdout
            except subprocess.TimeoutExpired as error:
                code, output = "timeout", (error.stdout or b"").decode() if isinstance(error.stdout, bytes) else ""
            seconds = time.perf_counter() - start
            lines = [line for line in output.strip().splitlines() if "Warning" not in line and line.strip()]
            if isinstance(code, int) and code < 0:
                code = f"signal {signal.Signals(-code).name}"
            if code != 0:
                (log.parent / f"{log.stem}.try{i}.log").write_text(output)
            counts[str(code)] = counts.get(str(code), 0) + 1
            table.write(f"{i}\t{code}\t{seconds:.1f}\t{(lines[-1] if lines else '')[:200]}\n")
            table.flush()
            print(f"try {i}: exit {code} ({seconds:.1f} s)", flush=True)
        table.write(f"# {args.tries} tries: " + ", ".join(f"exit {k}: {v}" for k, v in sorted(counts.items())) + "\n")
    print(f"{args.tries} tries: {counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
