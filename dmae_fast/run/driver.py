"""One certification run as a library call: what ``dmae-certify`` does, without the parser.

    from dmae_fast.run.driver import CertifyConfig, certify_dataset
    config = CertifyConfig.from_settings(dict(engine="model.safetensors", data="/imagenet/val", out="r.tsv",
                                              sigma=0.5, skip=50))
    result = certify_dataset(config, on_row=print)

One driver, :class:`Run`, for a single process (a world of one) or one rank under ``torchrun`` (see
docs/distributed.md): rank 0 takes the output (lock, resume, merging parts), hands out the images still to do
and writes the run record; the noise is keyed by (seed, image, phase, sample), so ``--out`` is the same for
any number of ranks. Parts by job: :mod:`.ranks`, :mod:`.opened`, :mod:`.output`, :mod:`.record`, :mod:`.shards`."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from dmae_fast.base.errors import AlreadyReported, Interrupted, UserError
from dmae_fast.base.integrity import file_sha256
from dmae_fast.base.locking import OutputLock
from dmae_fast.base.messages import one_line
from dmae_fast.batching.scheduler import BatchBody
from dmae_fast.batching.stage_timer import StageTimer
from dmae_fast.distributed.ranks import join
from dmae_fast.results.format import Mode
from dmae_fast.results.parts import has_parts, start_parts
from dmae_fast.results.votes import votes_path
from dmae_fast.results.writer import Row
from dmae_fast.run.config import PROG, CertifyConfig
from dmae_fast.run.host import device_name
from dmae_fast.run.opened import OpenedRun, open_run
from dmae_fast.run.output import (
    KeptRow,
    check_continued_classifier,
    check_out_before_loading,
    check_recounted,
    images_to_do,
    output_mode,
    run_seed,
)
from dmae_fast.run.record import RunRecord, RunResult, result_row
from dmae_fast.run.shards import ImageShards, SampleShards


def certify_dataset(config: CertifyConfig, on_row: Callable[[Row], None] | None = None) -> RunResult:
    """Run one certification as configured, writing each row (and passing it to ``on_row``) as its image
    finishes, and the run record ``<out>.json``; ``out`` is locked for the run.

    A body that fails mid-run is replaced by the next simpler one (the record's ``body_fallbacks``); with none
    left, or on bad input, :class:`UserError` is raised once the record says ``failed``; SIGINT/SIGTERM (with
    :func:`interrupt_on_signals`) raise :class:`Interrupted`, its ``kept`` saying what is on disk. Under
    ``torchrun`` this is one rank, and ``on_row`` sees the rows this process certified."""
    config.validate()
    return Run(config, on_row).certify()


class Run:
    """One run in this process: its config (validated by the caller), world, opened classifier, data and
    procedure, output and record."""

    def __init__(self, config: CertifyConfig, on_row: Callable[[Row], None] | None = None) -> None:
        self.config, self.on_row = config, on_row or (lambda row: None)

    def certify(self) -> RunResult:
        """Run it (see :func:`certify_dataset`)."""
        self.ranks = join(self.config.classifier.device)
        with self.ranks.running(), contextlib.ExitStack() as self.held:
            opened = self.ranks.agree(self._open)
            mode, indices, seed, model_sha256, recount = self.ranks.from_primary(lambda: self._take_output(opened))
            opened = opened.seeded(seed)
            self.config = opened.config  # sigma, precision and seed resolved
            return self._certify(opened, mode, indices, model_sha256, recount)

    def _open(self) -> OpenedRun:
        """Every process: check ``--out``, rank 0 locks it, open the classifier and the data."""
        ranks, config = self.ranks, self.config
        if ranks.device_error is not None:
            raise UserError(ranks.device_error)
        if config.output.profile and ranks.world > 1:
            raise UserError("--profile profiles one process; run it without torchrun")
        if config.output.keep_votes and ranks.world > 1:  # a library call under torchrun (the command says it first)
            raise UserError("--keep-votes writes its votes file from one process; run it without torchrun")
        check_out_before_loading(config)
        if ranks.primary:
            self.held.enter_context(OutputLock(config.output.out, "results file"))
        return open_run(config, ranks.device)

    def _take_output(self, opened: OpenedRun) -> tuple[Mode, list[int], int, str, list[KeptRow]]:
        """Rank 0: how the run treats ``--out``, the images still to do, the noise seed (drawn only now, once
        the classifier is opened and hashed), the classifier file's SHA-256 and the kept rows to count again."""
        config, out = opened.config, opened.config.output.out
        mode = output_mode(config)
        if mode == "append" and config.output.resume and not Path(out).exists() and not has_parts(out):
            print(f"{PROG}: --resume: {out} does not exist yet; starting the run", file=sys.stderr)
        parts = self.ranks.world > 1 and config.shard == "images"
        model_sha256 = file_sha256(config.classifier.engine_path)
        if opened.reference is not None:
            opened.reference.check_derived(config, model_sha256)
        check_continued_classifier(config, mode, model_sha256, opened.reference)
        seed = run_seed(config, mode, parts)
        indices, recount = images_to_do(opened, mode, parts=parts)
        if parts:
            start_parts(out, replacing=mode == "overwrite", seed=seed)
        return mode, indices, seed, model_sha256, recount

    def _certify(self, opened: OpenedRun, mode: Mode, indices: list[int], model_sha256: str,
                 recount: list[KeptRow]) -> RunResult:
        ranks, config = self.ranks, self.config
        timer = StageTimer(opened.engine.device) if config.output.profile else None
        resolved = opened.body(timer)
        sharing = {"world_size": ranks.world, "shard": config.shard} if ranks.world > 1 else {}
        self.record = RunRecord(opened, resolved, mode, model_sha256, sharing)
        if ranks.primary:
            opened.announce(len(indices), resolved, f", {ranks.world} ranks sharing {config.shard}" if sharing else "")
        if recount:
            ranks.from_primary(lambda: _recount(opened, resolved.body, recount))
        if ranks.primary:
            self.record.write({"status": "running"})
        shards = SampleShards if sharing and config.shard == "samples" else ImageShards
        self.job = job = shards(opened, ranks, resolved.body, mode, indices, self.on_row)
        profiler = _profiler(config, opened.engine.device)
        try:
            with profiler:
                job.run()
            mine = {"rank": ranks.rank, "device": device_name(opened.engine.device), **job.figures()}
            ranks.finish(mine)
            if not ranks.primary:
                return RunResult(config, mine["images"], mine["samples"], mine["elapsed_s"],
                                 _or_nan(mine["samples_per_s"]), ranks.world, primary=False)
            per_rank = ranks.wait_for_all(job.tick)
            job.finalize()
        except Interrupted as stop:
            failure = ranks.failed()
            self._ended("failed" if failure else "interrupted", failure)
            stop.kept = job.kept_after_interrupt()
            raise
        except Exception as error:  # bad input (one line), the machine, or a bug (a traceback): the record says so
            instead = self._failed(error)
            if instead is None:
                raise
            raise instead from None
        elapsed = job.rows.elapsed
        if timer is not None:
            _report_profile(config, profiler, timer, elapsed)
        images, samples = job.totals(per_rank)
        rate = round(samples / elapsed, 1) if elapsed > 0 else None
        self.record.write({"status": "complete", "images": images, "samples": samples, "elapsed_s": round(elapsed, 3),
                           "samples_per_s": rate, **({"ranks": per_rank} if sharing else {}),
                           "results_sha256": file_sha256(config.output.out), **_votes_record(config)}, final=True)
        return RunResult(config, images, samples, round(elapsed, 3), _or_nan(rate), ranks.world)

    def _failed(self, error: Exception) -> Exception | None:
        """Mark the record failed; with other ranks, tell them (the first to fail says why). What ends
        this process instead of ``error`` (None: ``error`` itself)."""
        ranks = self.ranks
        if isinstance(error, AlreadyReported):
            self._ended("failed", ranks.failed())
            return None
        if ranks.world == 1 or not isinstance(error, (UserError, OSError)):
            self._ended("failed", str(error) if isinstance(error, UserError) else one_line(error, typed=True))
            return None
        if isinstance(error, UserError):  # bad input, or the machine (a full disk): stop every rank
            text = str(error)
        else:  # a write or fsync error names no file: the one this rank was writing
            text = f"{error.strerror or error}: {error.filename or self.job.writing}"
        samples = self.config.shard == "samples"
        message = text if samples else f"rank {ranks.rank}: {text}"
        first = ranks.fail(message)
        self._ended("failed", ranks.failed() or message)
        if not first or (samples and not ranks.primary):  # samples: rank 0 says it
            return AlreadyReported(2)
        return UserError(message)

    def _ended(self, status: str, error: str | None) -> None:
        """Rank 0 marks the record: a world of one with its images, the ranks with the first failure."""
        if not self.ranks.primary:
            return
        if self.ranks.world > 1:
            summary = {"status": status, "error": error}
        else:
            summary = {"status": status, "images": self.job.images, **({"error": error} if error else {})}
        with contextlib.suppress(OSError):  # a full disk may refuse the record too
            self.record.write(summary)


def _votes_record(config: CertifyConfig) -> dict:
    """A completed --keep-votes run's ``votes``: its votes file (beside --out), N and the file's SHA-256."""
    samples = config.output.keep_votes
    if samples is None:
        return {}
    path = votes_path(config.output.out)
    return {"votes": {"path": Path(path).name, "samples": samples, "sha256": file_sha256(path)}}


def _or_nan(rate: float | None) -> float:
    """A rate, or NaN where none was measured (0 samples/s is a rate: an incremental run that drew nothing)."""
    return math.nan if rate is None else rate


def _recount(opened: OpenedRun, body: BatchBody, kept: list[KeptRow]) -> None:
    """Count kept rows' images again with this run's seed; refuse to continue rows that are not that seed's."""
    indices = [row.index for row in kept]
    print(f"{PROG}: --resume: counting image(s) {', '.join(map(str, indices))} again to check that the kept rows "
          f"are seed {opened.config.procedure.seed}'s", file=sys.stderr)
    counts = opened.streamer(body).run(opened.images(indices), opened.procedure.decide)
    done = {image.index: image for image in counts}
    for row in kept:
        check_recounted(opened.config, row, result_row(opened.procedure, done[row.index], 0.0))


def _profiler(config: CertifyConfig, device: torch.device):
    """A torch profiler over the run when --profile asks for one."""
    if not config.output.profile:
        return contextlib.nullcontext()
    folder = Path(config.output.profile)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--profile {folder} is a file; name a directory")
    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities)

def _report_profile(config: CertifyConfig, profiler, timer: StageTimer, elapsed: float) -> None:
    trace = Path(config.output.profile) / "trace.json"
    profiler.export_chrome_trace(str(trace))
    table = timer.table(elapsed)
    (Path(config.output.profile) / "stages.txt").write_text(table + "\n")
    print(f"{PROG}: per-stage time (each stage synchronized; trace in {trace}):\n{table}", file=sys.stderr)
