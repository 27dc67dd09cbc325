"""``dmae-bench scaling``: one certification run with 1, 2, ... processes, and how well it scales.

Each process count runs ``dmae-certify`` with the same arguments (``--nproc-per-node P`` for
P > 1; one plain process for P = 1), ``rounds`` times interleaved so that other jobs on a
shared machine slow every count alike; the medians are kept. Per run it reads the run record:
the certification's own time and samples/s (start-up excluded) and the wall time of the whole
command (start-up included), and it checks that every run wrote the same rows (all columns but
``time``). Efficiency = samples/s with P processes / (P x samples/s with one).

On CPUs every process gets ``threads`` intra-op threads (default 1), so P processes use P cores.
On a multi-GPU machine the same command measures GPUs (one per process), e.g.

    dmae-bench scaling --procs 1 2 4 8 -- --ckpt model.safetensors --data /imagenet/val --skip 50 --fast
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from dmae_fast import __version__
from dmae_fast.base.errors import UserError
from dmae_fast.bench.config import ScalingConfig
from dmae_fast.bench.report import result_stem


def _certify_device(certify: tuple[str, ...]) -> torch.device:
    """The device the dmae-certify arguments run on (--device, else auto): it names the results."""
    args = list(certify)
    named = next((a.split("=", 1)[1] for a in args if a.startswith("--device=")), None)
    if named is None and "--device" in args[:-1]:
        named = args[args.index("--device") + 1]
    cuda = torch.cuda.is_available() and (named is None or named in ("auto", "cuda") or named.startswith("cuda:"))
    return torch.device(named if cuda and named and named.startswith("cuda:") else "cuda" if cuda else "cpu")


def _run_once(config: ScalingConfig, procs: int, folder: Path, tag: str) -> dict:
    out = folder / f"p{procs}-{tag}.tsv"
    command = [sys.executable, "-m", "dmae_fast.cli.certify", *config.certify, "--quiet", "--out", str(out)]
    if procs > 1:
        command += ["--nproc-per-node", str(procs)]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(config.threads)} if config.threads else {}))
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()[-1:]
        raise UserError(f"dmae-certify with {procs} process(es) failed: {lines[-1] if lines else result.returncode}")
    record = json.loads(Path(f"{out}.json").read_text())
    rows = sorted(line.split("\t")[:5] + line.split("\t")[6:] for line in out.read_text().splitlines()[1:])
    return {"procs": procs, "wall_s": wall, "elapsed_s": record["elapsed_s"], "samples": record["samples"],
            "samples_per_s": record["samples_per_s"], "images": record["images"], "rows": rows,
            "device": record["device_name"]}


def run_scaling(config: ScalingConfig) -> tuple[dict, list[Path]]:
    """Measure every process count ``rounds`` times, interleaved; returns the record and the files written."""
    config.validate()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as folder, \
            tqdm(total=config.rounds * len(config.procs), desc="dmae-bench scaling", unit="run") as bar:
        for round_ in range(config.rounds):
            for procs in config.procs:
                runs.append(_run_once(config, procs, Path(folder), str(round_)))
                bar.update()
    same_rows = all(run["rows"] == runs[0]["rows"] for run in runs)
    table = []
    for procs in config.procs:
        mine = [run for run in runs if run["procs"] == procs]
        table.append({"procs": procs, **{key: statistics.median(run[key] for run in mine)
                                         for key in ("samples_per_s", "elapsed_s", "wall_s")},
                      "rounds": [run["samples_per_s"] for run in mine]})
    base = next((row["samples_per_s"] for row in table if row["procs"] == 1), None)
    for row in table:
        row["speedup"] = row["samples_per_s"] / base if base else None
        row["efficiency"] = row["speedup"] / row["procs"] if base else None
    record = {
        "device": runs[0]["device"],
        "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "config": asdict(config),
        "command": "dmae-certify " + " ".join(config.certify) + " [--nproc-per-node P]",
        "samples_per_run": runs[0]["samples"],
        "identical_rows": same_rows,
        "table": table,
    }
    stem = out / result_stem(out, _certify_device(config.certify), "-scaling")
    paths = [Path(f"{stem}.json"), Path(f"{stem}.md")]
    paths[0].write_text(json.dumps(record, indent=2) + "\n")
    paths[1].write_text(markdown(record))
    return record, paths


def markdown(record: dict) -> str:
    lines = [f"# dmae-certify scaling: {record['device']} per process",
             "", f"`{record['command']}`; {record['samples_per_run']:,} noisy samples per run; "
             f"{record['config']['threads'] or 'default'} thread(s) per process; median of "
             f"{record['config']['rounds']} interleaved rounds. Rows identical across process counts: "
             f"{'yes' if record['identical_rows'] else '**NO**'}.", "",
             "| processes | samples/s | speedup | efficiency | certification (s) | whole command (s) "
             "| rounds (samples/s) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in record["table"]:
        speed = f"{row['speedup']:.2f}x" if row["speedup"] else ""
        efficiency = f"{row['efficiency']:.0%}" if row["efficiency"] else ""
        rounds = ", ".join(f"{value:,.0f}" for value in row["rounds"])
        lines.append(f"| {row['procs']} | {row['samples_per_s']:,.0f} | {speed} | {efficiency} | "
                     f"{row['elapsed_s']:.1f} | {row['wall_s']:.1f} | {rounds} |")
    return "\n".join(lines) + "\n"
