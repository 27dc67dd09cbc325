"""One certification run as a library call: what ``dmae-certify`` does, without the parser.

    from dmae_fast.certification.run import CertifyConfig, certify_dataset
    result = certify_dataset(CertifyConfig(engine="model.safetensors", data="/imagenet/val", out="r.tsv",
                                           sigma=0.5, skip=50), on_row=print)

This module is the single-process driver and the one-call API: the lock, the output mode,
the batch body, the rows as images finish, the run record, profiling. Its parts live by job:
what a run opens (:mod:`.opened`), the output and resume policy (:mod:`.output`), the record,
rows and progress (:mod:`.record`), host facts (:mod:`.host`). The command
(:mod:`dmae_fast.cli.certify`) parses arguments into a :class:`CertifyConfig`, calls
:func:`certify_dataset` and prints the summary. Started by ``torchrun`` with more than one
process, the same call runs one rank of a multi-process run
(:mod:`dmae_fast.certification.distributed_run`, built on the same parts).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from dmae_fast.certification.choices import PROG
from dmae_fast.certification.config import CertifyConfig
from dmae_fast.certification.distributed_run import certify_ranks
from dmae_fast.certification.fallback import one_line
from dmae_fast.certification.fast_stream import StageTimer
from dmae_fast.certification.opened import open_run
from dmae_fast.certification.output import (
    check_out_before_loading,
    images_to_do,
    kept_after_interrupt,
    output_mode,
)
from dmae_fast.certification.parts import clear_parts, has_parts
from dmae_fast.certification.record import (
    RowWriter,
    RunRecord,
    RunResult,
    progress_bar,
    show_progress,
)
from dmae_fast.certification.torchrun_env import world_size
from dmae_fast.errors import Interrupted, UserError
from dmae_fast.locking import OutputLock
from dmae_fast.results import ResultsWriter, Row


def _profiler(config: CertifyConfig, device: torch.device):
    """A torch profiler over the run when --profile asks for one."""
    if not config.profile:
        return contextlib.nullcontext()
    folder = Path(config.profile)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--profile {folder} is a file; name a directory")
    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities)

def _report_profile(config: CertifyConfig, profiler, timer: StageTimer, elapsed: float) -> None:
    trace = Path(config.profile) / "trace.json"
    profiler.export_chrome_trace(str(trace))
    table = timer.table(elapsed)
    (Path(config.profile) / "stages.txt").write_text(table + "\n")
    print(f"{PROG}: per-stage time (each stage synchronized; trace in {trace}):\n{table}", file=sys.stderr)

def certify_dataset(config: CertifyConfig, on_row: Callable[[Row], None] | None = None) -> RunResult:
    """Run one certification as configured: open the classifier and the data, check a resumed
    file, stream the images, write each row (and pass it to ``on_row``) as the image finishes,
    keep the run record ``<out>.json``.

    The results file is locked for the whole run: a second run on the same ``out`` is refused.
    A body that fails mid-run is replaced by the next simpler one (one line; the record's
    ``body_fallbacks``); with none left, or on bad input, :class:`UserError` is raised after
    the record says ``failed`` (``--resume`` continues); SIGINT/SIGTERM (with :func:`interrupt_on_signals`)
    raise :class:`Interrupted` after marking the record, its ``kept`` saying what is on disk.
    Under ``torchrun`` with more than one process this is one rank of a multi-process run
    (:func:`dmae_fast.certification.distributed_run.certify_ranks`); ``on_row`` then sees the
    rows this process certified.
    """
    config.validate()
    on_row = on_row or (lambda row: None)
    if world_size() > 1:
        return certify_ranks(config, on_row)
    check_out_before_loading(config)
    with OutputLock(config.out, "results file"):
        return _certify_locked(config, on_row)

def _certify_locked(config: CertifyConfig, on_row: Callable[[Row], None]) -> RunResult:
    opened = open_run(config)
    config = opened.config
    mode = output_mode(config)
    if mode == "append" and not Path(config.out).exists() and not has_parts(config.out):
        print(f"{PROG}: --resume: {config.out} does not exist yet; starting the run", file=sys.stderr)
    indices = images_to_do(opened, mode, parts=False)
    timer = StageTimer(opened.engine.device) if config.profile else None
    body = opened.body(timer)
    opened.announce(len(indices), body)
    record = RunRecord(opened, body, mode)
    record.write({"status": "running"})
    bar = progress_bar(config, len(indices))
    profiler = _profiler(config, opened.engine.device)
    rows = None
    try:
        with ResultsWriter(config.out, kind=opened.kind, mode=mode) as writer, bar, profiler:
            rows = RowWriter(opened, writer, on_row, lambda samples: show_progress(
                bar, rows.images, rows.samples, rows.elapsed))
            rows.consume(opened.streamer(body).run(opened.images(indices), opened.procedure.decide))
    except Interrupted as stop:
        finished = rows.images if rows else 0
        record.write({"status": "interrupted", "images": finished})
        stop.kept = kept_after_interrupt(config, mode, finished)
        raise
    except Exception as error:  # bad input (one line), the machine, or a bug (a traceback): the record says so
        with contextlib.suppress(OSError):  # a full disk may refuse the record too
            record.write({"status": "failed", "images": rows.images if rows else 0,
                          "error": str(error) if isinstance(error, UserError) else one_line(error)})
        raise
    if mode == "overwrite":
        clear_parts(config.out)  # a stale multi-process run's parts: --out is now this run's
    if timer is not None:
        _report_profile(config, profiler, timer, rows.elapsed)
    figures = rows.figures()
    record.write({"status": "complete", **figures}, final=True)
    return RunResult(config, rows.images, rows.samples, figures["elapsed_s"], figures["samples_per_s"] or math.nan)
