"""The engine loop over the slot scheduler: the one surface of its drivers (the streamer, the server),
the scheduler's state private to it, sample sharding as the scheduler's row split."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import stream_counts

from dmae_fast.batching.engine_loop import BatchFailed, EngineLoop
from dmae_fast.batching.job import Job, RowSplit
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody, StreamingCertifier
from dmae_fast.stats.plan import SamplingPlan

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dmae_fast"
SCHEDULER = PACKAGE / "batching" / "scheduler.py"
DRIVER = PACKAGE / "batching" / "engine_loop.py"
SIGMA, SEED, SHAPE = 0.5, 21, (3, 8, 8)


def _slot_scheduler_state() -> set[str]:
    """The attributes SlotScheduler.__init__ sets besides its arguments."""
    tree = ast.parse(SCHEDULER.read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "SlotScheduler")
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    arguments = {arg.arg for arg in init.args.args}
    return {node.attr for node in ast.walk(init) if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self"} - arguments


def test_the_slot_schedulers_state_is_private_to_it_and_the_engine_loop():
    state = _slot_scheduler_state()
    assert {"_ready", "_waiting", "_free", "_finished", "_counts"} <= state
    assert all(name.startswith("_") for name in state), sorted(state)
    touched = []
    for path in PACKAGE.rglob("*.py"):
        if path in (SCHEDULER, DRIVER):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            # a module's own attribute of the same name (self._counts of a body) is its own business
            if isinstance(node, ast.Attribute) and node.attr in state and not (
                    isinstance(node.value, ast.Name) and node.value.id == "self"):
                touched.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not touched, touched


def test_a_job_holds_no_server_fields():
    assert not {"since", "cancelled", "queued", "done"} & set(Job.__slots__)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def images():
    generator = torch.Generator().manual_seed(5)
    return [torch.rand(SHAPE, generator=generator) for _ in range(4)]


def _streamed(engine, plan, items):
    return stream_counts(Smoothing(engine, SIGMA, SEED, 16), items, plan)


class FailingBody(PlainBody):
    """The plain body, raising in its ``fail_at``-th batch (counted after the rows were counted)."""

    def __init__(self, engine, fail_at):
        super().__init__(Smoothing(engine, SIGMA, SEED, 16))
        self.batches, self.fail_at = 0, fail_at

    def run(self, *rows):
        super().run(*rows)
        self.batches += 1
        if self.batches == self.fail_at:
            raise RuntimeError("device lost")


def _drain(loop, max_wait_s=0.0):
    finished = {}
    while loop.busy:
        finished.update(loop.step(max_wait_s))
    return finished


def test_a_failed_batch_ends_the_images_on_the_device_and_the_loop_goes_on(engine, images):
    """Two slots: the queued images are kept, start after the failure and get the streamer's counts."""
    plan = SamplingPlan.predict(24)
    loop = EngineLoop(FailingBody(engine, fail_at=2), engine.device, 16, 2)
    jobs = [Job(image, plan, index=10 + i) for i, image in enumerate(images)]
    for job in jobs:
        loop.add(job)
    finished = _drain(loop)
    assert [type(finished[job]) for job in jobs[:2]] == [BatchFailed, BatchFailed]
    assert str(finished[jobs[0]]) == "RuntimeError: device lost"
    expected = _streamed(engine, plan, [(job.index, job.image, 0) for job in jobs[2:]])
    assert all(np.array_equal(finished[job], expected[job.index]) for job in jobs[2:])
    assert loop.stats().on_device == 0


def _places(loop: EngineLoop) -> tuple[int, int]:
    stats = loop.stats()
    return stats.queued, stats.on_device


def test_cancelled_jobs_are_never_returned_and_fail_all_ends_the_rest(engine, images):
    plan = SamplingPlan.certify(8, 40)
    loop = EngineLoop(PlainBody(Smoothing(engine, SIGMA, SEED, 16)), engine.device, 16, 2)
    jobs = [Job(image, plan, index=i) for i, image in enumerate(images)]
    for job in jobs:
        loop.add(job)
    assert loop.step(0.0) == [] and _places(loop) == (3, 1)  # job 0 has rows left
    loop.cancel([jobs[0], jobs[2]])
    assert _places(loop) == (2, 0)
    assert loop.step(0.0) == [] and _places(loop) == (1, 1)  # job 1 on the device
    error = RuntimeError("stopping")
    ended = loop.fail_all(error)
    assert sorted(job.index for job, _ in ended) == [1, 3] and all(result is error for _, result in ended)
    assert not loop.busy and _places(loop) == (0, 0)
    assert loop.stats().batches == 2 and loop.stats().drawn == 32 and loop.stats().unused == 0


class RowSpy(PlainBody):
    """The plain body, recording the (image index, phase, sample) of every row it counts."""

    def allocate(self, num_slots, phase_ids):
        self.rows = []
        return super().allocate(num_slots, phase_ids)

    def run(self, slot, index, position, sample):
        self.rows += zip(index.tolist(), self._phase_ids[position].tolist(), sample.tolist())
        super().run(slot, index, position, sample)


def _split_between_two(engine, plan, items, decide=None, keep=0):
    """Two "processes" (threads) sharing every batch by a RowSplit, their counts summed at each stage end
    as an all-reduce sums them: each one's yielded counts, the rows it counted and the classes it kept (``keep``)."""
    barrier, parts = threading.Barrier(2), [None, None]

    def summed(rank, local):
        parts[rank] = local.clone()
        barrier.wait()
        total = parts[0] + parts[1]
        barrier.wait()
        return total

    results = [None, None]

    def run(rank):
        body = RowSpy(Smoothing(engine, SIGMA, SEED, 16))
        split = RowSplit(rank, 2, lambda local: summed(rank, local))
        done = list(StreamingCertifier(Smoothing(engine, SIGMA, SEED, 16), plan, body, split, keep=keep).run(
            items, decide))
        results[rank] = {d.index: d.counts for d in done}, body.rows, {d.index: d.kept for d in done}

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return results


@pytest.mark.parametrize("plan", [SamplingPlan.certify(10, 50), SamplingPlan.sequential(10, (20, 40, 60))],
                         ids=["fixed", "sequential"])
def test_a_row_split_shares_each_batch_and_gives_every_process_the_streamers_counts(engine, images, plan):
    """Sample sharding is a row-split policy of the one scheduler: every process runs the same schedule,
    counts a disjoint share of each batch (of 2 x 16 rows), together every row once, and all yield the
    counts of one process counting everything, with the same decisions at the looks."""
    items = [(7 + i, image, 0) for i, image in enumerate(images)]
    decide = (lambda index, counts, stage: counts[-1].max() > 12) if plan.looks else None  # noqa: E731
    (counts0, rows0, _), (counts1, rows1, _) = _split_between_two(engine, plan, items, decide)
    alone = stream_counts(Smoothing(engine, SIGMA, SEED, 32), items, plan, decide=decide)
    assert counts0.keys() == counts1.keys() == alone.keys() == {7, 8, 9, 10}
    assert all(np.array_equal(counts0[i], alone[i]) and np.array_equal(counts1[i], alone[i]) for i in alone)
    assert rows0 and rows1 and not set(rows0) & set(rows1) and len(rows0) + len(rows1) == len(set(rows0 + rows1))
    assert sum(int(alone[i].sum()) for i in alone) == len(rows0) + len(rows1)
    assert abs(len(rows0) - len(rows1)) <= 4  # even shares of every batch (a batch's shares differ by at most 1)


def test_a_row_split_gives_every_process_the_classes_one_process_keeps(engine, images):
    """--keep-votes, or a run on a reference's votes, under --shard samples: each kept class is written by the process
    that counted its row, and the sum gives every process the classes one process keeps."""
    items = [(7 + i, image, 0) for i, image in enumerate(images)]
    plan = SamplingPlan.certify(10, 50)
    (_, _, kept0), (_, _, kept1) = _split_between_two(engine, plan, items, keep=30)
    alone = {done.index: done.kept for done in StreamingCertifier(Smoothing(engine, SIGMA, SEED, 32), plan,
                                                                  keep=30).run(items)}
    assert kept0.keys() == kept1.keys() == alone.keys() and all(len(kept) == 30 for kept in alone.values())
    assert all(np.array_equal(kept0[i], alone[i]) and np.array_equal(kept1[i], alone[i]) for i in alone)
