"""``dmae-bench stall``: fixed-n against ``--sequential`` on an emulated asynchronous device.

A CPU runs a batch before the host packs the next, which hides what a GPU shows: the host cannot decide at a
look before the batch that ended it has run, and meanwhile the device may have nothing to run. Here every
batch takes ``batch_ms`` on :mod:`~dmae_fast.bench.async_device`'s device, whatever its rows, while the host
packs the next one, as with a GPU running CUDA graphs; counts reach the host only when the device gets to
them. The classifier votes as the images of :func:`~dmae_fast.bench.sequential_savings.population` (the
simulated ImageNet-shaped population: fixed-n's certified accuracies of DMAE ViT-B): image i's noisy pixel
above 1/2 votes class 0 (its label) with probability pA_i, through the plain body and the noise contract, so
that images stop where that population's images stop. Drawn samples/s counts every row handed to the device
(rows of images in flight and rows drawn past a look for an image that then stopped included); the device's
idle time and the part of it while the host waited for counts (a decision) come from the emulated device,
the rest from the engine loop's statistics (:class:`~dmae_fast.batching.scheduler.LoopStats`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.special import ndtri

from dmae_fast import __version__
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody, StreamingCertifier
from dmae_fast.bench.async_device import AsyncBody, EmulatedDevice
from dmae_fast.bench.config import StallConfig
from dmae_fast.bench.report import result_stem
from dmae_fast.bench.sequential_savings import population
from dmae_fast.engines.base import Engine
from dmae_fast.model.config import ClassifierSpec, EncoderConfig
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.stats.procedure import CERTIFY, Procedure, ProcedureSpec

KINDS = ("fixed-n", "sequential")
Z_LIMIT = 8.0  # |z| of the clean pixel, in sigmas: pA 0 or 1 stays finite (and never flips in float32)


class VoteEngine(Engine):
    """A base classifier of one-pixel images: class 0 where the noisy pixel is above 1/2, else 1, so that the
    image 1/2 + sigma z gets class 0 with probability Phi(z) (:func:`vote_image`)."""

    input = "image"
    precision = "fp32"
    description = "the population's vote (class 0 when the pixel is above 1/2)"

    def __init__(self) -> None:
        encoder = EncoderConfig(8, 1, 1, patch_size=1, img_size=1, in_chans=1)  # unused: the spec's shape
        self.spec = ClassifierSpec(encoder, num_classes=2, input_size=1, mean=(0.5,), std=(1.0,))
        self.device = torch.device("cpu")
        self.input_shape = self.spec.input_shape

    def classify(self, inputs: torch.Tensor) -> torch.Tensor:
        return (inputs.flatten(1)[:, 0] <= 0.5).long()


def vote_image(p_a: float, sigma: float) -> torch.Tensor:
    """The image whose noisy votes go to class 0 with probability ``p_a`` under noise ``sigma``."""
    z = float(np.clip(ndtri(p_a), -Z_LIMIT, Z_LIMIT))
    return torch.full((1, 1, 1), 0.5 + sigma * z)


def population_images(sigma: float, count: int) -> Iterator[tuple[int, torch.Tensor, int]]:
    """``count`` images spread evenly over the population (all of it at 1,000), indices 0, 1, ..., label 0."""
    p_a = population(sigma, "spread")
    for index in range(count):
        yield index, vote_image(float(p_a[(index * len(p_a) + len(p_a) // 2) // count]), sigma), 0


@dataclass(frozen=True)
class StallRun:
    """One timed run on the emulated device."""

    kind: str
    images: int
    cap: int
    finished: int
    seconds: float
    batches: int
    drawn: int
    unused: int
    drawn_per_s: float
    fill: float  # drawn / (batches x batch)
    idle_s: float  # the device, between batches
    idle_waited_s: float  # of which while the host waited for counts
    host_waited_s: float  # the engine loop's: host blocked on counts on their way
    host_stalled_s: float  # the engine loop's: device idle as the host saw it
    overran: int  # batches whose real work took longer than the emulated time
    results: str  # digest of every image's (index, result) in index order, "" if some did not finish


def _procedure(config: StallConfig, kind: str, cap: int) -> Procedure:
    return Procedure(ProcedureSpec(CERTIFY, cap, config.alpha, config.sigma, config.n0, sequential=kind == KINDS[1]))


def measure(config: StallConfig, body: PlainBody, kind: str, images: int, cap: int) -> StallRun:
    """One run of ``kind`` over ``images`` images with n (or cap) ``cap`` of ``body``'s batches on a new emulated
    device; fixed-n stops after ``fixed_seconds``."""
    procedure = _procedure(config, kind, cap)
    device = EmulatedDevice(config.batch_ms / 1000)
    certifier = StreamingCertifier(body.smoothing, procedure.plan, AsyncBody(body, device))
    results = []
    start = time.perf_counter()
    stream = certifier.run(population_images(config.sigma, images), procedure.decide)
    try:
        for counts in stream:
            results.append((counts.index, asdict(procedure.result(counts.counts))))
            if kind == KINDS[0] and time.perf_counter() - start > config.fixed_seconds:
                break
    finally:
        stream.close()  # the device drains
        device.close()
    seconds = time.perf_counter() - start
    stats, times = certifier.stats(), device.times()
    digest = hashlib.sha256(repr(sorted(results, key=lambda result: result[0])).encode()).hexdigest()[:16]
    return StallRun(kind, images, cap, len(results), seconds, stats.batches, stats.drawn, stats.unused,
                    stats.drawn / seconds, stats.drawn / max(stats.batches * config.batch, 1), times.idle_s,
                    times.idle_waited_s, stats.waited_s, stats.stalled_s, times.overran,
                    digest if len(results) == images else "")


def warmed_body(config: StallConfig) -> PlainBody:
    """The plain body of :class:`VoteEngine` with the one-thread compiled noise (the device's work takes no host
    cores), after one image on an emulated device of no delay: the noise compiles and is checked on the worker
    thread, in the state of the measured runs."""
    smoothing = Smoothing(VoteEngine(), config.sigma, config.seed, config.batch)
    body = PlainBody(smoothing, NoiseSource(smoothing.engine.device, serial=True))
    plan = _procedure(config, KINDS[0], 10).plan
    device = EmulatedDevice(0.0)
    try:
        list(StreamingCertifier(smoothing, plan, AsyncBody(body, device)).run(population_images(config.sigma, 1)))
    finally:
        device.close()
    return body


def run_stall(config: StallConfig) -> tuple[dict, list[Path]]:
    """Every (images, cap) with fixed-n and --sequential, ``rounds`` times interleaved; the record and its files."""
    config.validate()
    body = warmed_body(config)
    runs = [measure(config, body, kind, images, cap)
            for _ in range(config.rounds) for images in config.images for cap in config.caps for kind in KINDS]
    record = {"config": asdict(config), "device": f"emulated ({config.batch_ms:g} ms a batch) on "
              f"{platform.processor() or platform.machine()} cpu, {torch.get_num_threads()} torch threads",
              "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()},
              "table": table(runs), "runs": [asdict(run) for run in runs]}
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / result_stem(out, torch.device("cpu"), "-stall")
    paths = [Path(f"{stem}.json"), Path(f"{stem}.md")]
    paths[0].write_text(json.dumps(record, indent=2) + "\n")
    paths[1].write_text(markdown(record))
    return record, paths


def table(runs: list[StallRun]) -> list[dict]:
    """Per (images, cap): the medians over rounds of fixed-n's and --sequential's figures, and their ratio."""
    rows = []
    for images, cap in dict.fromkeys((run.images, run.cap) for run in runs):
        row: dict[str, object] = {"images": images, "cap": cap}
        for kind in KINDS:
            mine = [run for run in runs if (run.kind, run.images, run.cap) == (kind, images, cap)]
            numbers = {f.name: statistics.median(getattr(run, f.name) for run in mine)
                       for f in dataclasses.fields(StallRun) if f.type in ("int", "float") and f.name not in
                       ("images", "cap")}
            row[kind] = {**numbers, "results": sorted({run.results for run in mine}),
                         "drawn_per_s_rounds": [run.drawn_per_s for run in mine]}
        row["ratio"] = row[KINDS[1]]["drawn_per_s"] / row[KINDS[0]]["drawn_per_s"]
        rows.append(row)
    return rows


def markdown(record: dict) -> str:
    config = record["config"]
    lines = [f"# Fixed-n and --sequential on an emulated asynchronous device: {record['device']}", "",
             f"Batch {config['batch']:,} rows, {config['batch_ms']:g} ms each whatever its rows; n0 {config['n0']}, "
             f"sigma {config['sigma']}, alpha {config['alpha']}, seed {config['seed']}; --sequential: the exact "
             f"group-sequential test; fixed-n timed for at most {config['fixed_seconds']:g} s; medians of "
             f"{config['rounds']} interleaved round(s). Unused: rows drawn past the look where an image then "
             "stopped, as a share of the rows used. Idle: the device between batches, as a share of the run; "
             "waiting: the part of it while the host waited for counts (decisions).", "",
             "| images | cap | fixed-n drawn/s | --sequential drawn/s | ratio | samples per image | unused | "
             "batch fill | device idle | of which waiting for decisions | host saw stalled (s) | wall (s) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in record["table"]:
        fixed, seq = row[KINDS[0]], row[KINDS[1]]
        used = seq["drawn"] - seq["unused"]
        lines.append(f"| {row['images']:,} | {row['cap']:,} | {fixed['drawn_per_s']:,.0f} | {seq['drawn_per_s']:,.0f} "
                     f"| {row['ratio']:.3f}x | {used / max(seq['finished'], 1):,.0f} | "
                     f"{seq['unused'] / max(used, 1):.2%} | {seq['fill']:.1%} | {seq['idle_s'] / seq['seconds']:.1%} "
                     f"| {seq['idle_waited_s'] / seq['seconds']:.1%} | {seq['host_stalled_s']:.2f} | "
                     f"{seq['seconds']:.1f} |")
    return "\n".join(lines) + "\n"
