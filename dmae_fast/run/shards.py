"""How the processes of a run share its images and write its rows (:mod:`dmae_fast.run.driver` drives them).

``--shard images`` (:class:`ImageShards`, also a world of one): each process claims the next image whenever its
stream has room and writes its rows (a world of one to ``--out``, a rank to its own part file, merged by rank 0 at
the end). ``--shard samples`` (:class:`SampleShards`): rank 0 reads the images, every rank counts its share of each
batch's rows of the same schedule (:class:`~dmae_fast.batching.scheduler.RowSplit`); rank 0 writes the rows."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from dmae_fast.batching.job import BatchBody, RowSplit
from dmae_fast.batching.stream import ImageCounts
from dmae_fast.distributed.ranks import Ranks, World
from dmae_fast.results.format import Mode, read_kept_rows
from dmae_fast.results.parts import clear_parts, merge_parts, part_path
from dmae_fast.results.votes import VotesWriter, votes_path
from dmae_fast.results.writer import ResultsWriter, Row
from dmae_fast.run.opened import OpenedRun
from dmae_fast.run.output import kept_after_interrupt, rows_file
from dmae_fast.run.record import RowWriter, progress_bar, show_progress


@dataclasses.dataclass
class _Shards:
    """This process's share of a run's images; rank 0 shows the progress bar."""

    opened: OpenedRun
    ranks: World
    body: BatchBody
    mode: Mode
    indices: list[int]  # the images still to do
    on_row: Callable[[Row], None]
    writing: str = ""  # the file this process writes (named when the disk fails)
    rows: RowWriter | None = None  # this process's rows, once it writes them

    def __post_init__(self) -> None:
        self.bar = progress_bar(self.opened.config, len(self.indices), enabled=self.ranks.primary)

    @property
    def images(self) -> int:
        """The images this process finished so far."""
        return self.rows.images if self.rows else 0

    def _write(self, counts: Iterator[ImageCounts], path: str, mode: Mode | None, after: Callable[[int], None]) -> None:
        """Turn ``counts`` into rows: into ``path`` opened with ``mode`` (None: no file), and to ``on_row``."""
        columns = self.opened.procedure.columns
        file = ResultsWriter(path, self.opened.kind, mode, columns) if mode is not None else contextlib.nullcontext()
        with file as writer, self._votes(path, mode) as votes, self.bar:  # no file: a rank other than 0, bar off
            self.rows = RowWriter(self.opened, writer, self.on_row, after, votes)
            self.rows.consume(counts)

    def _votes(self, path: str, mode: Mode | None) -> contextlib.AbstractContextManager[VotesWriter | None]:
        """The votes file beside --out (--keep-votes; one process), kept rows' votes kept when appending."""
        samples = self.opened.config.output.keep_votes
        if samples is None or mode is None:
            return contextlib.nullcontext()
        kept = read_kept_rows(path) if mode == "append" else None
        return VotesWriter(votes_path(self.opened.config.output.out), samples, mode,
                           set() if kept is None else set(kept.idx.tolist()))

    def figures(self) -> dict:
        return self.rows.figures()


class ImageShards(_Shards):
    """``--shard images``, and a world of one: claim images, write rows (a part file under torchrun)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.parts = self.ranks.world > 1  # a world of one writes --out directly
        out = self.opened.config.output.out
        self.writing = str(part_path(out, self.ranks.rank)) if self.parts else out

    def run(self) -> None:
        images = self.opened.images(self.indices, order=self.ranks.claims(len(self.indices)))
        counts = self.opened.streamer(self.body).run(images, self.opened.procedure.decide)
        self._write(counts, self.writing, "new" if self.parts else self.mode, self._after_row)

    def _after_row(self, samples: int) -> None:
        self.ranks.add_progress(1, samples)
        self.ranks.check_failed()
        self.tick()

    def tick(self) -> None:
        if self.ranks.primary and not self.bar.disable:
            show_progress(self.bar, *self.ranks.progress(), self.rows.elapsed)

    def finalize(self) -> None:
        """Rank 0: the parts merged into --out (a world of one wrote it; stale parts go with --overwrite)."""
        config = self.opened.config
        if not self.parts:
            if self.mode == "overwrite":
                clear_parts(config.output.out)  # a stale multi-process run's parts: --out is now this run's
            return
        self.writing = rows_file(config, self.mode)
        merge_parts(config.output.out, self.opened.kind, into=self.writing, extra=self.opened.procedure.columns)
        if self.mode == "overwrite":
            os.replace(self.writing, config.output.out)
        self.bar.close()

    def totals(self, per_rank: list[dict]) -> tuple[int, int]:
        return sum(r["images"] for r in per_rank), sum(r["samples"] for r in per_rank)

    def kept_after_interrupt(self) -> str:
        config, out = self.opened.config, self.opened.config.output.out
        if not self.parts:
            return kept_after_interrupt(config, self.mode, self.images)
        if self.mode == "overwrite":
            return (f"{out} is unchanged; this run's rows are in {Path(out).name}.parts/ "
                    "(not resumable: run again with --overwrite)")
        return (f"the rows certified so far are in {Path(out).name}.parts/; continue with the same command "
                "and --resume (any number of processes)")


class SampleShards(_Shards):
    """``--shard samples``: every rank counts a share of each batch of the same schedule; rank 0 writes --out."""

    ranks: Ranks

    def __post_init__(self) -> None:
        super().__post_init__()
        self.writing = rows_file(self.opened.config, self.mode)  # rank 0's
        if not self.ranks.primary:
            self.on_row = lambda row: None  # every rank has each row: rank 0 passes them on
        ranks = self.ranks
        self.certifier = self.opened.streamer(self.body, RowSplit(ranks.rank, ranks.world, ranks.summed))

    def run(self) -> None:
        ranks = self.ranks
        images = ranks.share_stream(self.opened.images(self.indices) if ranks.primary else None)
        counts = self.certifier.run(images, self.opened.procedure.decide)
        self._write(counts, self.opened.config.output.out, self.mode if ranks.primary else None,
                    lambda samples: show_progress(self.bar, self.rows.images, self.rows.samples, self.rows.elapsed))

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
        return kept_after_interrupt(self.opened.config, self.mode, self.images)
