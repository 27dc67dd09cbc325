"""One rank of a multi-process certification run (``torchrun``, or SLURM setting its variables).

    torchrun --nproc-per-node 8 -m dmae_fast.cli.certify --ckpt m.safetensors --data /imagenet/val --skip 50

What each rank does:

1. opens the classifier (on its GPU, ``cuda:LOCAL_RANK``) and the data; a failure on any rank
   stops every rank, and rank 0 prints the one line;
2. rank 0 takes the output (the lock on ``--out``, resume checks, merging the parts an
   interrupted run left) and hands every rank the list of images still to do;
3. ``--shard images`` (default): each rank claims the next image from a shared counter in the
   process group's key-value store whenever its stream has room, so faster ranks take more,
   and writes its rows to its own part file (:mod:`dmae_fast.certification.parts`);
   ``--shard samples``: rank 0 reads each image and every rank counts a share of its samples
   (:mod:`dmae_fast.certification.sample_shards`), rank 0 writing the rows;
4. rank 0 waits for every rank, merges the parts into ``--out`` sorted by ``idx`` and writes
   one run record with each rank's device, images and samples/s.

The noise is keyed by (seed, image, phase, sample), so the merged file is the one a single
process writes (up to the ``time`` column), for any number of ranks, restarts or resumes.
The first rank to fail prints its one line and flags the store; the others stop without a line.
When another rank is gone (a failed collective; the store closed with its launcher) rank 0 says
so, or, under ``dmae-certify --nproc-per-node``, the launcher, which also reports signals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from dmae_fast.certification.config import CertifyConfig
from dmae_fast.certification.fallback import one_line
from dmae_fast.certification.host import device_name
from dmae_fast.certification.opened import OpenedRun, open_run
from dmae_fast.certification.output import (
    check_out_before_loading,
    images_to_do,
    kept_after_interrupt,
    output_mode,
    rows_file,
)
from dmae_fast.certification.parts import merge_parts, part_path, start_parts
from dmae_fast.certification.ranks import Ranks, rank_device
from dmae_fast.certification.record import (
    RowWriter,
    RunRecord,
    RunResult,
    progress_bar,
    show_progress,
)
from dmae_fast.certification.sample_shards import SampleShardedCertifier
from dmae_fast.certification.scheduler import BatchBody
from dmae_fast.errors import AlreadyReported, Interrupted, UserError
from dmae_fast.locking import OutputLock
from dmae_fast.results import Mode, ResultsWriter, Row


def certify_ranks(config: CertifyConfig, on_row: Callable[[Row], None]) -> RunResult:
    """This process's part of the run ``config`` describes (see the module doc)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    try:
        device, device_error = rank_device(config.device, local_rank), None
    except UserError as error:
        device, device_error = "cpu", str(error)
    shared_gpu = device.startswith("cuda:") and config.device == device and \
        int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) > 1
    ranks = Ranks.join(device, shared_gpu)
    try:
        return _certify(config, ranks, device, device_error, on_row)
    except Interrupted as stop:
        failed = ranks.failed() is not None
        if failed or not ranks.primary:  # the failing rank, or rank 0, says what happened
            raise AlreadyReported(2 if failed else stop.exit_status) from None
        raise
    except dist.DistError as error:  # from the store: the launcher that holds it is gone
        raise ranks.lost(error) from None
    finally:
        ranks.close()


def _certify(config: CertifyConfig, ranks: Ranks, device: str, device_error: str | None,
             on_row: Callable[[Row], None]) -> RunResult:
    def open_this_rank() -> OpenedRun:
        if device_error is not None:
            raise UserError(device_error)
        if config.profile:
            raise UserError("--profile profiles one process; run it without torchrun")
        check_out_before_loading(config)
        return open_run(config, device)

    opened = ranks.agree(open_this_rank)
    config = opened.config
    with contextlib.ExitStack() as held:
        def take_output() -> tuple[Mode, list[int]]:
            mode = output_mode(config)
            held.enter_context(OutputLock(config.out, "results file"))
            indices = images_to_do(opened, mode, parts=config.shard == "images")
            if config.shard == "images":
                start_parts(config.out, replacing=mode == "overwrite")
            return mode, indices

        mode, indices = ranks.decide(take_output)
        body = opened.body()
        shards = f", {ranks.world} ranks sharing {config.shard}"
        record = RunRecord(opened, body, mode, {"world_size": ranks.world, "shard": config.shard})
        if ranks.primary:
            opened.announce(len(indices), body, shards)
            record.write({"status": "running"})
        run = _ImageShards if config.shard == "images" else _SampleShards
        job = run(opened, ranks, body, mode, indices, on_row)
        try:
            job.run()
            mine = {"rank": ranks.rank, "device": device_name(opened.engine.device), **job.figures()}
            ranks.finish(mine)
            if not ranks.primary:
                return RunResult(config, mine["images"], mine["samples"], mine["elapsed_s"],
                                 mine["samples_per_s"] or 0.0, ranks.world, primary=False)
            per_rank = ranks.wait_for_all(job.tick)
            job.finalize()
        except Interrupted as stop:
            failure = ranks.failed()
            if ranks.primary:
                record.write({"status": "failed" if failure else "interrupted", "error": failure})
            stop.kept = job.kept_after_interrupt()
            raise
        except (UserError, OSError) as error:  # bad input, or the machine (a full disk): stop every rank
            if isinstance(error, UserError):
                text = str(error)
            else:  # a write or fsync error names no file: the one this rank was writing
                text = f"{error.strerror or error}: {error.filename or job.writing}"
            message = f"rank {ranks.rank}: {text}" if config.shard == "images" else text
            first = ranks.fail(message)  # the first rank to fail says why
            if ranks.primary:
                with contextlib.suppress(OSError):  # on a full disk the record may not be written either
                    record.write({"status": "failed", "error": ranks.failed() or message})
            if not first or (config.shard == "samples" and not ranks.primary):  # samples: rank 0 says it
                raise AlreadyReported(2) from None
            raise UserError(message) from None
        except AlreadyReported:
            if ranks.primary:
                record.write({"status": "failed", "error": ranks.failed()})
            raise
        except Exception as error:  # a bug, or a body that failed under --shard samples: the record says so
            if ranks.primary:
                with contextlib.suppress(OSError):
                    record.write({"status": "failed", "error": one_line(error)})
            raise
        elapsed = job.rows.elapsed
        images, samples = job.totals(per_rank)
        rate = round(samples / elapsed, 1) if elapsed > 0 else None
        record.write({"status": "complete", "images": images, "samples": samples, "elapsed_s": round(elapsed, 3),
                      "samples_per_s": rate, "ranks": per_rank}, final=True)
        return RunResult(config, images, samples, round(elapsed, 3), rate or 0.0, ranks.world)


@dataclasses.dataclass
class _Shards:
    """How the ranks share a run's images (the two kinds below); rank 0 shows the progress bar."""

    opened: OpenedRun
    ranks: Ranks
    body: BatchBody
    mode: Mode
    indices: list[int]  # the images still to do
    on_row: Callable[[Row], None]
    writing: str = ""  # the file this rank writes (named when the disk fails)

    def __post_init__(self) -> None:
        self.bar = progress_bar(self.opened.config, len(self.indices), enabled=self.ranks.primary)


class _ImageShards(_Shards):
    """``--shard images``: ranks claim images from the store and write part files."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rows = RowWriter(self.opened, None, self.on_row, self._after_row)
        self.writing = str(part_path(self.opened.config.out, self.ranks.rank))

    def run(self) -> None:
        ranks = self.ranks
        images = self.opened.images(self.indices, order=ranks.claims(len(self.indices)))
        with ResultsWriter(self.writing, self.opened.kind, "new") as writer, self.bar:
            self.rows.writer = writer
            self.rows.consume(self.opened.streamer(self.body).run(images, self.opened.procedure.decide))

    def _after_row(self, samples: int) -> None:
        self.ranks.add_progress(1, samples)
        self.ranks.check_failed()
        self.tick()

    def figures(self) -> dict:
        return self.rows.figures()

    def tick(self) -> None:
        if self.ranks.primary and not self.bar.disable:
            show_progress(self.bar, *self.ranks.progress(), self.rows.elapsed)

    def finalize(self) -> None:
        config = self.opened.config
        self.writing = rows_file(config, self.mode)
        merge_parts(config.out, self.opened.kind, into=self.writing)
        if self.mode == "overwrite":
            os.replace(rows_file(config, self.mode), config.out)
        self.bar.close()

    def totals(self, per_rank: list[dict]) -> tuple[int, int]:
        return sum(r["images"] for r in per_rank), sum(r["samples"] for r in per_rank)

    def kept_after_interrupt(self) -> str:
        config = self.opened.config
        if self.mode == "overwrite":
            return (f"{config.out} is unchanged; this run's rows are in {Path(config.out).name}.parts/ "
                    "(not resumable: run again with --overwrite)")
        return (f"the rows certified so far are in {Path(config.out).name}.parts/; continue with the same command "
                "and --resume (any number of processes)")


class _SampleShards(_Shards):
    """``--shard samples``: every rank counts a share of each image's samples; rank 0 writes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rows = RowWriter(self.opened, None, self.on_row if self.ranks.primary else (lambda row: None),
                              lambda samples: show_progress(self.bar, self.rows.images, self.rows.samples,
                                                            self.rows.elapsed))
        self.writing = rows_file(self.opened.config, self.mode)  # rank 0's
        engine = self.opened.engine
        self.certifier = SampleShardedCertifier(self.body, self.opened.procedure.plan, self.opened.config.batch,
                                                engine.spec.input_shape, engine.device, self.ranks)

    def run(self) -> None:
        ranks = self.ranks
        images = ranks.share_stream(self.opened.images(self.indices) if ranks.primary else None)
        counts = self.certifier.run(images, self.opened.procedure.decide)
        if not ranks.primary:
            self.rows.consume(counts)
            return
        with ResultsWriter(self.opened.config.out, self.opened.kind, self.mode) as writer, self.bar:
            self.rows.writer = writer
            self.rows.consume(counts)

    def figures(self) -> dict:
        """This rank's share: the samples it counted (its rows hold every rank's)."""
        elapsed = self.rows.elapsed
        rate = round(self.certifier.samples / elapsed, 1) if elapsed > 0 else None
        return {**self.rows.figures(), "samples": self.certifier.samples, "samples_per_s": rate}

    def tick(self) -> None:
        """Nothing to show while waiting: the ranks finish together."""

    def finalize(self) -> None:
        """Rank 0 wrote --out itself."""

    def totals(self, per_rank: list[dict]) -> tuple[int, int]:
        return self.rows.images, self.rows.samples  # every rank counted every image; rank 0 sees the sums

    def kept_after_interrupt(self) -> str:
        return kept_after_interrupt(self.opened.config, self.mode, self.rows.images)
