"""The measurements of ``bench/gpu_session.sh`` that must fit a step's budget: each stops by its deadline
and writes its results file after every row, so a step cut short still leaves what it measured.

    python measure.py throughput --model vit-b16 --precisions fp8 bf16 fp16 --deadline 90 --out DIR
    python measure.py certify --model vit-b16 --precision fp8 --images 64 --deadline 75 --out DIR
    python measure.py sequential --model vit-b16 --precision fp8 --images 1000 --fixed DIR/certify.json \
        --deadline 70 --out DIR

throughput: the rows ``dmae-bench throughput --variants fused+compiled+graphs --precisions ...`` measures (the
same ``measure`` and reference loops), one process, without the bench's 60 s compile allowance per row: a row
starts when ``--row-seconds`` are left before the deadline (about 20 s per compiled ViT-B row on an H100/H200,
from the 2026-11-26/27 step times: bench/results/2026-12-02-gpu-session-plan), and every row records its wall
seconds, compilation included. certify: CERTIFY
(n0 + n samples an image, fixed-n) through the streaming certifier and the same body over the bench's population
(``dmae-bench certify``'s: uniform random images of the model's input shape from a generator seeded 0, label 0;
random weights). sequential: what ``--sequential`` runs (the exact group-sequential procedure, n as the cap) over
``--images`` images of the same population, and the fixed-n samples/s of the same body (from ``--fixed``, the
certify step's file, else measured here on ``--fixed-images``). Drawn samples/s: the samples the certifier drew
(in-flight images included) over the timed seconds. Every run also records the engine loop's statistics
(``loop``: batches, rows drawn, rows drawn past the look where an image then stopped, host seconds waiting for
counts, and ``stalled_s``, the device idle the host saw between its queued work and the next batch) and, on
CUDA, ``device_idle_s``: the device's own idle time between batches, from timing events around each batch;
the sequential headline states the idle time and the unused rows. Noise seed 0 everywhere. Writes OUT/<command>.json
and .md. Only the package's public API.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from dmae_fast import SamplingPlan, Smoothing, StreamingCertifier
from dmae_fast.batching.fast_body import FastBody, FastPath
from dmae_fast.bench.peak import matmul_peak
from dmae_fast.bench.reference_loops import COHEN, DMAE
from dmae_fast.bench.report import throughput_table
from dmae_fast.bench.throughput import Row, Variant, add_ratios, build_model, measure
from dmae_fast.engines.opening import resolve_device
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.stats.procedure import CERTIFY, Procedure, ProcedureSpec

SIGMA, SEED, ALPHA = 0.25, 0, 0.001


def _process_age() -> float:
    """Seconds since this process started (Linux's /proc), so that the deadline counts the imports too."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
    return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")


def _left(args) -> float:
    return args.deadline - _process_age()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _meta(args, device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or '?'})"
    return {"device": name, "torch": torch.__version__, "python": platform.python_version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "args": vars(args)}


def _write(out: Path, stem: str, record: dict, markdown: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown + "\n")


def _fast(device: torch.device) -> FastPath:
    """The GPU body the bench times; on a CPU (the smoke run) the eager body (no Triton interpreter)."""
    cuda = device.type == "cuda"
    return FastPath(fused=cuda, compile=cuda, cuda_graphs=cuda)


def throughput(args) -> int:
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    model = build_model(args.model, device)
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16} if cuda else {"fp32": torch.float32}
    peaks = {p: matmul_peak(device, dtype, seconds=args.peak_seconds) for p, dtype in dtypes.items()}
    peak = max(peaks.values())
    precisions = args.precisions if cuda else ["fp32"]
    name = "ours: fused + compiled + CUDA graphs" if cuda else "ours: eager"
    plan = [(Variant(loop.name, loop.precision, reference=loop), loop.batch_size, args.reference_seconds)
            for loop in ((COHEN, DMAE) if args.references else ())]
    plan += [(Variant(name, p, _fast(device)), args.batch, args.row_seconds) for p in precisions]
    rows: list[Row] = []
    for variant, batch, needs in plan:
        if _left(args) < needs:
            rows.append(Row(args.model, variant.name, variant.precision, batch,
                            status=f"skipped: {_left(args):.0f} s left before the deadline, the row needs ~{needs:g}"))
        else:
            print(f"measure: {args.model} {variant.name} {variant.precision} batch {batch}", file=sys.stderr)
            begin = time.perf_counter()
            try:
                row = measure(args.model, model, variant, batch, args.seconds, peak)
            except Exception as error:  # one failing row must not lose the others
                row = Row(args.model, variant.name, variant.precision, batch,
                          status="failed: " + " ".join(f"{type(error).__name__}: {error}".split())[:200])
            row.seconds = time.perf_counter() - begin  # wall, compilation and warm-up included
            rows.append(row)
        add_ratios(rows)
        ours = [r for r in rows if r.variant == name]
        best = [f"{r.precision} {r.samples_per_s:,.0f}" if r.samples_per_s
                else f"{r.precision} {r.status.split(':')[0]}" for r in ours]
        headline = f"{args.model} batch {args.batch} samples/s: " + " / ".join(best)
        record = {**_meta(args, device), "matmul_peak_flops": peaks, "headline": headline,
                  "rows": [dataclasses.asdict(r) for r in rows]}
        table = throughput_table(rows)
        seconds = "\n".join(f"- {r.variant} {r.precision}: {r.seconds:.1f} s wall" for r in rows if r.seconds)
        _write(Path(args.out), "throughput", record, f"# {headline}\n\n{table}\n\nRow wall times (compilation "
               f"included):\n\n{seconds}")
    return 0 if all(r.status == "ok" for r in rows) else 1


def _population(shape: tuple[int, ...], count: int):
    """dmae-bench certify's images: uniform random, generator seeded 0, label 0 (made as consumed)."""
    generator = torch.Generator().manual_seed(0)
    for index in range(count):
        yield index, torch.rand(shape, generator=generator), 0


class TimedBatches:
    """A body whose batches are bracketed by CUDA timing events: the device's idle time between batches."""

    def __init__(self, body) -> None:
        self.body, self.description = body, body.description
        self._marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def allocate(self, num_slots, phase_ids):
        return self.body.allocate(num_slots, phase_ids)

    def load(self, slot, image):
        self.body.load(slot, image)

    def run(self, *rows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.body.run(*rows)
        end.record()
        self._marks.append((start, end))

    def finish(self):
        self.body.finish()

    def idle_s(self) -> float:
        torch.cuda.synchronize()
        gaps = (before[1].elapsed_time(after[0]) for before, after in zip(self._marks, self._marks[1:]))
        return sum(max(0.0, gap) for gap in gaps) / 1e3  # milliseconds


def _run(args, engine: TorchEngine, body, plan: SamplingPlan, images: int, decide=None) -> dict:
    """One timed run over ``images`` images (after a one-image warm-up of the same plan: compiling and
    capturing happen there), stopping at the deadline; the drawn samples include in-flight images."""
    device, smoothing = engine.device, Smoothing(engine, SIGMA, SEED, args.batch)
    warm = StreamingCertifier(smoothing, plan, body)
    list(warm.run(_population(engine.spec.input_shape, 1), decide))
    _sync(device)
    timed = TimedBatches(body) if device.type == "cuda" else None
    certifier = StreamingCertifier(smoothing, plan, timed or body)
    start, finished, stopped = time.perf_counter(), 0, False
    for _ in certifier.run(_population(engine.spec.input_shape, images), decide):
        finished += 1
        if _left(args) < 0:
            stopped = True
            break
    _sync(device)
    seconds = time.perf_counter() - start
    loop = dataclasses.asdict(certifier.stats())
    return {"images": images, "finished": finished, "stopped_at_deadline": stopped, "seconds": seconds,
            "drawn": certifier.samples, "drawn_per_s": certifier.samples / seconds,
            "drawn_per_image": certifier.samples / max(finished, 1), "s_per_image": seconds / max(finished, 1),
            "minutes_per_1000_images": seconds / max(finished, 1) * 1000 / 60, "loop": loop,
            "batch_fill": loop["drawn"] / max(loop["batches"] * args.batch, 1),
            "device_idle_s": timed.idle_s() if timed is not None else None}


def _engine(args):
    device = resolve_device(args.device)
    precision = args.precision if device.type == "cuda" else "fp32"
    engine = TorchEngine(build_model(args.model, device), device, precision)
    return engine, FastBody(Smoothing(engine, SIGMA, SEED, args.batch), _fast(device)), precision


def certify(args) -> int:
    engine, body, precision = _engine(args)
    result = _run(args, engine, body, SamplingPlan.certify(args.n0, args.n), args.images)
    headline = (f"{args.model} {precision} fixed-n n0 {args.n0} n {args.n}: {result['finished']}/{args.images} images, "
                f"{result['drawn_per_s']:,.0f} samples/s, {result['minutes_per_1000_images']:.1f} min per 1,000 images")
    record = {**_meta(args, engine.device), "body": body.options.describe(), "precision": precision,
              "headline": headline, "fixed_n": result}
    _write(Path(args.out), "certify", record, f"# {headline}\n\n```\n{json.dumps(result, indent=1)}\n```")
    return 0 if result["finished"] == args.images else 1


def _idle(result: dict) -> str:
    """The device's idle time (timing events; on a CPU: the stall the host saw) in seconds and of the run."""
    idle = result["device_idle_s"]
    idle, what = (result["loop"]["stalled_s"], " (host-seen stall)") if idle is None else (idle, "")
    return f"{idle:.2f} s = {idle / result['seconds']:.1%} of the run{what}"


def sequential(args) -> int:
    engine, body, precision = _engine(args)
    fixed, source = None, None
    if args.fixed and Path(args.fixed).is_file():
        earlier = json.loads(Path(args.fixed).read_text())
        if earlier.get("fixed_n", {}).get("finished") and earlier.get("precision") == precision:
            fixed, source = earlier["fixed_n"], f"{args.fixed} (the certify step, same body)"
    if fixed is None:
        fixed = _run(args, engine, body, SamplingPlan.certify(args.n0, args.n), args.fixed_images)
        source = f"measured here on {args.fixed_images} images"
    procedure = Procedure(ProcedureSpec(CERTIFY, args.n, ALPHA, SIGMA, args.n0, sequential=True))
    result = _run(args, engine, body, procedure.plan, args.images, procedure.decide)
    ratio = result["drawn_per_s"] / fixed["drawn_per_s"]
    loop = result["loop"]
    used = loop["drawn"] - loop["unused"]
    headline = (f"{args.model} {precision} --sequential: {result['finished']}/{args.images} images, "
                f"{result['drawn_per_s']:,.0f} drawn/s vs fixed-n {fixed['drawn_per_s']:,.0f} ({ratio:.2f}x), "
                f"{result['drawn_per_image']:,.0f} samples/image; device idle {_idle(result)}, drawn but unused "
                f"{loop['unused'] / max(used, 1):.2%} of used, batches {result['batch_fill']:.1%} full")
    record = {**_meta(args, engine.device), "body": body.options.describe(), "precision": precision,
              "procedure": procedure.name, "headline": headline, "sequential": result, "fixed_n": fixed,
              "fixed_n_source": source, "drawn_ratio": ratio}
    _write(Path(args.out), "sequential", record, f"# {headline}\n\nfixed-n from {source}\n\n```\n"
           f"{json.dumps({'sequential': result, 'fixed_n': fixed}, indent=1)}\n```")
    return 0 if result["finished"] == args.images else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["throughput", "certify", "sequential"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default="vit-b16")
    parser.add_argument("--deadline", type=float, required=True, help="seconds from start: rows and runs stop by it")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--precisions", nargs="+", default=["fp8", "bf16", "fp16"], help="throughput (CUDA)")
    parser.add_argument("--seconds", type=float, default=2.0, help="throughput: timed seconds per row")
    parser.add_argument("--row-seconds", type=float, default=30.0, help="throughput: a compiled row starts "
                        "only with this many seconds left")
    parser.add_argument("--reference-seconds", type=float, default=10.0)
    parser.add_argument("--no-references", dest="references", action="store_false")
    parser.add_argument("--peak-seconds", type=float, default=1.0)
    parser.add_argument("--precision", default="fp8", help="certify, sequential (CUDA; fp32 on a CPU)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--fixed", help="sequential: the certify step's certify.json (fixed-n on the same body)")
    parser.add_argument("--fixed-images", type=int, default=16)
    args = parser.parse_args(argv)
    return {"throughput": throughput, "certify": certify, "sequential": sequential}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
