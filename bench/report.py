"""Benchmark results: one JSON file, a Markdown table and a samples/s vs batch-size plot."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from dmae_fast.bench.e2e import CertifyTiming
from dmae_fast.bench.engines import ExportRecord
from dmae_fast.bench.throughput import Row

RESULT_SUFFIXES = (".json", ".md", ".png")


def result_stem(out: Path, device: torch.device, suffix: str, engine_dir: Path | None = None) -> str:
    """``<date>-<device>[suffix]``, numbered ``-2``, ``-3``, ... so that no earlier file is
    overwritten or reused: a stem is taken if any of its .json, .md, .png (in ``out``) or
    its ``-engines`` folder (in ``engine_dir``) exists."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    stem = f"{datetime.now():%Y-%m-%d}-{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}{suffix}"

    def taken(candidate: str) -> bool:
        files = [out / f"{candidate}{ext}" for ext in RESULT_SUFFIXES]
        return any(map(os.path.lexists, files + ([engine_dir / f"{candidate}-engines"] if engine_dir else [])))

    candidate, k = stem, 2
    while taken(candidate):
        candidate, k = f"{stem}-{k}", k + 1
    return candidate


def _fmt(value: float | None, pattern: str) -> str:
    return "" if value is None else format(value, pattern)


def throughput_table(rows: list[Row]) -> str:
    lines = ["| model | variant | precision | batch | samples/s | MFU | memory (GiB) | vs Cohen | vs DMAE | status |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r.model} | {r.variant} | {r.precision} | {r.batch} | {_fmt(r.samples_per_s, ',.0f')} | "
                     f"{_fmt(r.mfu, '.1%')} | {_fmt(r.memory_gib, '.1f')} | {_fmt(r.vs_cohen, '.1f')} | "
                     f"{_fmt(r.vs_dmae, '.1f')} | {r.status} |")
    return "\n".join(lines)


def certify_table(timings: list[CertifyTiming]) -> str:
    lines = ["| model | method | precision | batch | n0 | n | images timed | s/image | 1,000 images (min) "
             "| samples/s |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in timings:
        lines.append(f"| {t.model} | {t.method} | {t.precision} | {t.batch} | {t.n0} | {t.n} | {t.images} | "
                     f"{t.per_image_s:.3f} | {t.extrapolated_1000_s / 60:,.1f} | {t.samples_per_s:,.0f} |")
    return "\n".join(lines)


def engines_table(exports: list[ExportRecord]) -> str:
    lines = [("| model | engine | file | precision | export (s) | parity inputs | max abs logit diff "
              "| top-1 agreement | parity device | status |"),
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for e in exports:
        p = e.parity or {}
        lines.append(f"| {e.model} | {e.engine} | {e.file} | {e.precision} | {_fmt(e.export_s, '.1f')} | "
                     f"{p.get('samples', '')} | {_fmt(p.get('max_abs_logit_diff'), '.3g')} | "
                     f"{_fmt(p.get('top1_agreement'), '.2%')} | {p.get('device', '')} | {e.status} |")
    return "\n".join(lines)


def markdown(meta: dict[str, Any], rows: list[Row], timings: list[CertifyTiming],
             exports: list[ExportRecord] = ()) -> str:
    peaks = ", ".join(f"{k} {v / 1e12:,.1f} TFLOP/s" for k, v in meta["matmul_peak_flops"].items())
    parts = [f"# dmae-bench {meta['created']} on {meta['device']}", "",
             f"Measured matmul peak: {peaks}. MFU = samples/s x FLOPs per forward / the {meta['mfu_peak']} peak.",
             f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}.", ""]
    if meta.get("notes"):
        parts += [f"- {note}" for note in meta["notes"]] + [""]
    if rows:
        parts += ["## Throughput (noise + forward + counting)", "", throughput_table(rows), ""]
    if exports:
        parts += ["## Exported engines (verified against torch fp32 eager on noisy inputs)", "",
                  engines_table(exports), ""]
    if timings:
        parts += ["## CERTIFY end to end, extrapolated to 1,000 images", "", certify_table(timings), ""]
    return "\n".join(parts)


def plot(rows: list[Row], path: Path) -> None:
    """samples/s vs batch size, one panel per model, one line per (variant, precision)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r.model for r in rows if r.samples_per_s})
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(6 * max(1, len(models)), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        series: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            if r.model == model and r.samples_per_s:
                series.setdefault(f"{r.variant} {r.precision}", []).append((r.batch, r.samples_per_s))
        for label, points in sorted(series.items()):
            points.sort()
            ax.plot(*zip(*points), marker="o", label=label)
        ax.set(title=model, xlabel="batch size", ylabel="noisy samples/s", xscale="log", yscale="log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(out: Path, stem: str, meta: dict[str, Any], rows: list[Row], timings: list[CertifyTiming],
          exports: list[ExportRecord] = ()) -> list[Path]:
    """<stem>.json, <stem>.md and (with throughput rows) <stem>.png under ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    record = {**meta, "throughput": [dataclasses.asdict(r) for r in rows],
              "engines": [dataclasses.asdict(e) for e in exports],
              "certify": [dataclasses.asdict(t) for t in timings]}
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(record, indent=2) + "\n")
    paths[1].write_text(markdown(meta, rows, timings, exports))
    if any(r.samples_per_s for r in rows):
        paths.append(out / f"{stem}.png")
        plot(rows, paths[-1])
    return paths
