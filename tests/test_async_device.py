"""The scheduler on an asynchronous device (:mod:`dmae_fast.bench.async_device`): counts reach the host only
after the batches queued before them, rows run ahead of a decision on its way (and past a look in its own
batch, in a spare slot), a decision reads exactly the counts at its look, rows drawn for an image past the look
where it stopped are counted as unused; the idle figures of the emulated device and of the engine loop;
``dmae-bench stall``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import LazyDevice

from dmae_fast.batching.engine_loop import EngineLoop
from dmae_fast.batching.job import Job, phase_ids
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody, StreamingCertifier
from dmae_fast.bench.async_device import AsyncBody, EmulatedDevice
from dmae_fast.bench.command_stall import main as stall_main
from dmae_fast.bench.stall import VoteEngine, vote_image
from dmae_fast.stats.plan import SamplingPlan

SIGMA, SEED, SHAPE, BATCH = 0.5, 21, (3, 8, 8), 16
PLAN = SamplingPlan.sequential(6, (10, 20, 30, 40))  # looks after 16, 26, 36 rows; 46 in all


class RowSpy(PlainBody):
    """The plain body, counting the rows it runs per image index."""

    def allocate(self, num_slots, phase_ids):
        self.rows: dict[int, int] = {}
        return super().allocate(num_slots, phase_ids)

    def run(self, slot, index, position, sample):
        for image, rows in zip(*np.unique(index.numpy(), return_counts=True)):
            self.rows[int(image)] = self.rows.get(int(image), 0) + int(rows)
        super().run(slot, index, position, sample)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def items():
    generator = torch.Generator().manual_seed(5)
    return [(3 + i, torch.rand(SHAPE, generator=generator), 0) for i in range(5)]


def _stop_when_sure(index: int, counts: np.ndarray, stage: int) -> bool:
    """Stop once the top class has half the estimation votes so far (decisions that depend on the counts)."""
    return counts[1].max() >= 0.5 * counts[1].sum()


def _recorded(log: dict) -> Callable[[int, np.ndarray, int], bool]:
    def decide(index: int, counts: np.ndarray, stage: int) -> bool:
        assert (index, stage) not in log, "decided twice"
        log[index, stage] = counts.copy()
        return _stop_when_sure(index, counts, stage)

    return decide


def _run(engine, items, body) -> tuple[dict, dict, StreamingCertifier]:
    """Each look's counts as the decision got them, each image's final counts, and the certifier."""
    log: dict = {}
    certifier = StreamingCertifier(Smoothing(engine, SIGMA, SEED, BATCH), PLAN, body)
    finals = {c.index: c.counts for c in certifier.run(items, _recorded(log))}
    return log, finals, certifier


@pytest.mark.parametrize("kind", ["lazy", "emulated"])
def test_decisions_read_exactly_the_counts_at_their_look_while_rows_run_ahead(engine, items, kind):
    """Against the synchronous plain body (on a CPU no row runs ahead of a decision): the same decisions, each
    given the same counts at the same look, the same final counts; the rows drawn are those used plus those
    drawn past the look where an image stopped (the loop's ``unused``); on the lazy device rows did run ahead."""
    expected_log, expected, _ = _run(engine, items, PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)))
    device = LazyDevice() if kind == "lazy" else EmulatedDevice(0.005)
    spy = RowSpy(Smoothing(engine, SIGMA, SEED, BATCH))
    try:
        log, finals, certifier = _run(engine, items, AsyncBody(spy, device))
    finally:
        if kind == "emulated":
            device.close()
    assert log.keys() == expected_log.keys() and all(np.array_equal(log[k], expected_log[k]) for k in log)
    assert finals.keys() == expected.keys() and all(np.array_equal(finals[i], expected[i]) for i in finals)
    assert len({stage for _, stage in log}) > 1 and any(counts.sum() < PLAN.total for counts in finals.values())
    stats = certifier.stats()
    used = {i: int(finals[i].sum()) for i in finals}
    assert stats.drawn == sum(spy.rows.values()) == sum(used.values()) + stats.unused
    assert stats.unused == sum(spy.rows[i] - used[i] for i in finals)
    if kind == "lazy":
        assert stats.unused > 0


@pytest.mark.parametrize("ending", ["stopped", "cancelled"])
def test_an_image_ended_with_the_next_looks_counts_on_their_way_ignores_them(engine, items, ending):
    """A lone image on the lazy device draws its next stage while its first decision is on its way, up to the
    next look, whose counts are then copied too. Ended at the first look, it ends with that look's counts (or,
    cancelled, is never returned), the rows past it are unused, the later copy is ignored, and its slot is free."""
    stop_first = ending == "stopped"
    job = Job(items[0][1], PLAN, lambda index, counts, stage: stop_first, index=items[0][0])
    body = AsyncBody(PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)), LazyDevice())
    loop = EngineLoop(body, engine.device, BATCH, 2)
    loop.add(job)
    assert loop.step() == [] and job.row == 16  # the first look
    assert loop.step() == [] and job.row == 26 and job.past_next_look  # the next stage, drawn ahead
    if not stop_first:
        loop.cancel([job])
    finished = []
    while loop.busy:
        finished += loop.step()
    stats = loop.stats()
    assert (stats.on_device, stats.drawn, stats.unused) == (0, 26, 10)
    if stop_first:
        [(ended, counts)] = finished
        alone = Job(items[0][1], SamplingPlan((PLAN.phases[0], PLAN.phases[1]), (6, 10)), index=items[0][0])
        sync = EngineLoop(PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)), engine.device, BATCH, 2)
        sync.add(alone)
        [(_, first_look)] = sync.step()
        assert ended is job and np.array_equal(counts, first_look)
    else:
        assert finished == []


def test_rows_past_a_look_in_the_batch_of_the_look_count_apart_until_its_counts_are_copied(engine, items):
    """Batches of 20 rows, a lone image whose first look is at row 16: the batch of the look also takes 4 rows of
    the next stage (counted in a spare slot, then added to the image's own); the decision at the look still gets
    exactly its 16 rows' counts, and every look's and the final counts are the synchronous body's."""
    log: dict = {}
    job = Job(items[0][1], PLAN, _recorded(log), index=items[0][0])
    loop = EngineLoop(AsyncBody(PlainBody(Smoothing(engine, SIGMA, SEED, 20)), LazyDevice()), engine.device, 20, 2)
    loop.add(job)
    assert loop.step() == [] and job.row == 20 and job.spare is None and loop.stats().drawn == 20
    finished = []
    while loop.busy:
        finished += loop.step()
    expected_log: dict = {}
    certifier = StreamingCertifier(Smoothing(engine, SIGMA, SEED, 20), PLAN)
    [expected] = certifier.run(items[:1], _recorded(expected_log))
    assert log.keys() == expected_log.keys() and all(np.array_equal(log[k], expected_log[k]) for k in log)
    assert int(log[items[0][0], 0].sum()) == 16
    [(ended, counts)] = finished
    assert ended is job and np.array_equal(counts, expected.counts)


@pytest.mark.parametrize("stop_at", [0, 1])
def test_a_look_reached_in_a_spare_slot_gets_its_own_copy_after_the_rows_join(engine, items, stop_at):
    """Batches of 32: the first batch ends the lone image's first look (row 16) and, in the spare slot, its
    second (row 26). Both decisions get the synchronous body's counts; stopped at the first, the image ends with
    the first look's counts and the second copy is ignored."""
    def decide_with(log):
        def decide(index, counts, stage):
            log[index, stage] = counts.copy()
            return stage == stop_at
        return decide

    log: dict = {}
    job = Job(items[0][1], PLAN, decide_with(log), index=items[0][0])
    loop = EngineLoop(AsyncBody(PlainBody(Smoothing(engine, SIGMA, SEED, 32)), LazyDevice()), engine.device, 32, 2)
    loop.add(job)
    assert loop.step() == [] and job.row == 26 and job.past_next_look
    finished = []
    while loop.busy:
        finished += loop.step()
    expected_log: dict = {}
    certifier = StreamingCertifier(Smoothing(engine, SIGMA, SEED, 32), PLAN)
    [expected] = certifier.run(items[:1], decide_with(expected_log))
    assert log.keys() == expected_log.keys() == {(items[0][0], stage) for stage in range(stop_at + 1)}
    assert all(np.array_equal(log[k], expected_log[k]) for k in log)
    [(ended, counts)] = finished
    assert ended is job and np.array_equal(counts, expected.counts) and loop.stats().on_device == 0


class GatedBody(PlainBody):
    """The plain body, each batch held until the test opens the gate."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.gate = threading.Event()

    def run(self, *rows) -> None:
        self.gate.wait(timeout=600)
        super().run(*rows)


def test_the_emulated_device_fills_a_copy_only_after_the_batches_queued_before_it(engine, items):
    """``run`` returns at once; a copy of the counts queued after it stays unfilled (and its marker not done)
    until the batch has run, and a batch queued after the copy does not change it."""
    inner = GatedBody(Smoothing(engine, SIGMA, SEED, BATCH))
    device = EmulatedDevice(0.0)
    try:
        body = AsyncBody(inner, device)
        counts = body.allocate(2, phase_ids(engine.device))
        body.load(0, items[0][1])
        rows = torch.arange(BATCH)
        zeros = torch.zeros_like(rows)
        body.run(zeros, zeros + 7, zeros + 2, rows)
        host, marker = device.to_host(counts, [0])
        body.run(zeros, zeros + 7, zeros + 2, rows + BATCH)
        assert not marker.query() and (host == -1).all()
        inner.gate.set()
        marker.synchronize()
        assert marker.query() and int(host[0, 2].sum()) == BATCH
        device.drain()
        assert int(counts[0, 2].sum()) == 2 * BATCH and int(host[0, 2].sum()) == BATCH
    finally:
        inner.gate.set()
        device.close()


def test_a_decision_awaited_with_the_device_idle_is_a_stall_in_both_accounts(engine, items):
    """The server's loop (no rows ahead of a decision) on the emulated device: between the looks the host waits
    for the counts with nothing queued, so the loop states waiting and stalled time and the device idle time
    before batches issued after a wait; every batch ran on the device."""
    device = EmulatedDevice(0.005)
    try:
        loop = EngineLoop(AsyncBody(PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)), device), engine.device, BATCH, 2)
        loop.add(Job(items[0][1], PLAN, lambda index, counts, stage: False, index=items[0][0]))
        finished = []
        while loop.busy:
            finished += loop.step(0.0)
        device.drain()
        stats, times = loop.stats(), device.times()
    finally:
        device.close()
    assert len(finished) == 1 and stats.drawn == PLAN.total and stats.unused == 0
    assert stats.waited_s > 0 and stats.stalled_s > 0
    assert times.batches == stats.batches and times.idle_s >= times.idle_waited_s > 0


def test_the_vote_engine_votes_for_its_label_as_often_as_the_population_says():
    """Through the plain body and the noise contract: 20,000 noisy copies of the image of pA 0.9."""
    engine = VoteEngine()
    body = PlainBody(Smoothing(engine, 0.25, SEED, 20_000))
    counts = body.allocate(1, phase_ids(engine.device))
    body.load(0, vote_image(0.9, 0.25))
    rows = torch.arange(20_000)
    zeros = torch.zeros_like(rows)
    body.run(zeros, zeros, zeros + 1, rows)
    assert abs(int(counts[0, 1, 0]) / 20_000 - 0.9) < 0.01


def test_dmae_bench_stall_writes_its_table_and_refuses_a_bad_option_in_one_line(tmp_path: Path, capsys):
    out = tmp_path / "stall"
    argv = ["--images", "3", "--caps", "200", "--n0", "20", "--batch", "64", "--batch-ms", "1",
            "--fixed-seconds", "60", "--out", str(out)]
    assert stall_main(argv) == 0
    [table] = out.glob("*-stall.md")
    assert "| 3 | 200 |" in table.read_text()
    assert stall_main(["--batch-ms", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "dmae-bench stall: error: --batch-ms must be > 0" in err and "Traceback" not in err
