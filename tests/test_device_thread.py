"""The server's continuous-batching thread, without HTTP: per-image plans share batches and give
the offline streaming certifier's counts; the clock, cancellation, the queue bound and the index range."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
import torch
from helpers import stream_counts

from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.scheduler import Job
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import SamplingPlan
from dmae_fast.engines.base import Engine
from dmae_fast.serve.device_thread import Closed, DeviceThread, IndicesExhausted, QueueFull
from dmae_fast.stats.procedure import sequential_certifier

SIGMA, SEED = 0.5, 99
SHAPE = (3, 8, 8)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def images():
    generator = torch.Generator().manual_seed(3)
    return [torch.rand(SHAPE, generator=generator) for _ in range(9)]


def _device_thread(engine, batch=64, max_wait_s=0.0, max_queue=64, first_index=500, slots=None, on_batch=None):
    body = batch_body(Smoothing(engine, SIGMA, SEED, batch), BodyOptions(noise="reference"))
    thread = DeviceThread(body, engine.device, SHAPE, batch, max_wait_s, slots or batch + 2, max_queue, first_index,
                          on_batch)
    thread.start()
    return thread


class Collector:
    """``done`` callbacks that record results and signal when all have arrived."""

    def __init__(self, expected: int) -> None:
        self.results: dict[int, object] = {}
        self.expected = expected
        self.event = threading.Event()

    def done_for(self, key: int):
        def done(result):
            self.results[key] = result
            if len(self.results) == self.expected:
                self.event.set()
        return done


def _offline(engine, plan, items, decide=None, batch=7):
    body = batch_body(Smoothing(engine, SIGMA, SEED, batch), BodyOptions(noise="reference"))
    return stream_counts(Smoothing(engine, SIGMA, SEED, batch), items, plan, body, decide)


def test_mixed_plans_share_batches_and_match_the_offline_streamer(engine, images):
    sequential = sequential_certifier(30, 400, 0.001, SIGMA)
    plans = [(SamplingPlan.predict(150), None), (SamplingPlan.certify(30, 120), None),
             (SamplingPlan.sequential(30, sequential.looks), sequential.decide)]
    rows = []
    thread = _device_thread(engine, batch=64, on_batch=lambda r, s: rows.append(r))
    collector = Collector(len(images))
    jobs = [Job(image, *plans[i % 3]) for i, image in enumerate(images)]
    answers = [collector.done_for(i) for i in range(len(images))]
    thread.submit(jobs[:4], answers[:4])
    thread.submit(jobs[4:], answers[4:])
    assert collector.event.wait(900)
    thread.close(10)
    assert [job.index for job in jobs] == list(range(500, 509))  # consecutive, in admission order
    for k, (plan, decide) in enumerate(plans):
        mine = [i for i in range(len(images)) if i % 3 == k]
        offline = _offline(engine, plan, [(jobs[i].index, images[i], 0) for i in mine], decide)
        for i in mine:
            assert np.array_equal(collector.results[i], offline[jobs[i].index]), (i, plan)
    per_image = [int(np.sum(c)) for c in collector.results.values()]
    assert sum(rows) == sum(per_image)
    # images share batches: fewer batches than one image per batch would take, most of them full (partial ones
    # only where every image left waits at a sequential look, or at the end)
    assert len(rows) < sum(math.ceil(r / 64) for r in per_image) and rows.count(64) >= 0.7 * len(rows)


def test_a_partial_batch_waits_for_max_wait_then_runs(engine, images):
    thread = _device_thread(engine, batch=1000, max_wait_s=0.3)
    collector = Collector(1)
    start = time.monotonic()
    thread.submit([Job(images[0], SamplingPlan.predict(50))], [collector.done_for(0)])
    assert collector.event.wait(600)
    assert time.monotonic() - start >= 0.28  # nothing else came: the 50 rows ran after the wait
    thread.close(10)


def test_cancelled_images_free_their_slot_and_are_not_answered(engine, images):
    thread = _device_thread(engine, batch=32, slots=2)
    collector = Collector(2)
    long = Job(images[0], SamplingPlan.predict(2_000_000))
    thread.submit([long], [collector.done_for(0)])
    time.sleep(0.2)
    thread.cancel([long])
    quick = [Job(images[i], SamplingPlan.predict(40)) for i in (1, 2)]
    thread.submit(quick, [collector.done_for(i) for i in (1, 2)])
    assert collector.event.wait(600)
    assert set(collector.results) == {1, 2}
    assert thread.stats().admitted == 0 and thread.stats().on_device == 0
    thread.close(10)


def test_images_admitted_before_close_are_answered_and_later_ones_refused(engine, images):
    """SIGTERM's drain (``close``): what was admitted is finished with its full counts; a request that arrives
    after the drain began is refused with Closed (the server's 503 "the server is shutting down")."""
    thread = _device_thread(engine, batch=32)
    collector = Collector(2)
    thread.submit([Job(images[i], SamplingPlan.predict(3000)) for i in (0, 1)], [collector.done_for(i) for i in (0, 1)])
    closer = threading.Thread(target=thread.close, args=(600,))
    closer.start()
    deadline = time.monotonic() + 600  # a hang guard: close() refuses new images at once
    while True:
        try:
            thread.submit([Job(images[2], SamplingPlan.predict(10))], [lambda result: None])
        except Closed as refused:
            assert str(refused) == "the server is shutting down"
            break
        assert time.monotonic() < deadline
    closer.join(600)
    assert collector.event.is_set() and sorted(collector.results) == [0, 1]
    assert all(int(np.sum(counts)) == 3000 for counts in collector.results.values()), collector.results


def test_queue_bound_and_index_range(engine, images):
    thread = _device_thread(engine, max_queue=3, first_index=2**32 - 4)
    plan = SamplingPlan.predict(10)
    collector = Collector(3)
    with pytest.raises(QueueFull):
        thread.submit([Job(images[i], plan) for i in range(4)], [collector.done_for(i) for i in range(4)])
    thread.submit([Job(images[i], plan) for i in range(3)], [collector.done_for(i) for i in range(3)])
    assert collector.event.wait(600)
    with pytest.raises(IndicesExhausted):  # 2**32 - 1 is left: two images do not fit
        thread.submit([Job(images[i], plan) for i in range(2)], [lambda r: None] * 2)
    thread.close(10)


def test_default_indices_are_drawn_at_random_on_admission(engine, images):
    """Without a first index, a client cannot know its image's index (so its noise) before admission:
    indices are not consecutive, differ between servers with the same settings, and the counts still
    equal the offline streamer's for the index the image was given."""
    plan = SamplingPlan.predict(40)
    given = []
    for _ in range(2):
        thread = _device_thread(engine, first_index=None)
        collector = Collector(len(images))
        jobs = [Job(image, plan) for image in images]
        for i, job in enumerate(jobs):
            thread.submit([job], [collector.done_for(i)])
        assert collector.event.wait(600)
        assert thread.stats().next_index is None
        thread.close(10)
        indices = [job.index for job in jobs]
        assert all(0 <= i < 2**32 for i in indices)
        # neighbours within 1 of each other by chance: 8 pairs x 3 / 2**32, about 6e-9
        assert all(abs(b - a) > 1 for a, b in zip(indices, indices[1:])), indices
        offline = _offline(engine, plan, [(job.index, image, 0) for job, image in zip(jobs, images)])
        assert all(np.array_equal(collector.results[i], offline[job.index]) for i, job in enumerate(jobs))
        given.append(indices)
    assert given[0] != given[1]


def test_non_finite_logits_fail_that_image_only(engine, images):
    class NaNForBrightImages(Engine):
        def __init__(self, inner):
            self.inner, self.spec, self.device = inner, inner.spec, inner.device
            self.precision, self.description, self.input = inner.precision, "nan", "image"

        def classify(self, x):
            classes = self.inner.classify(x)
            return torch.where(x.flatten(1).mean(1) > 0.8, self.spec.num_classes, classes)

    bad = NaNForBrightImages(engine)
    body = batch_body(Smoothing(bad, SIGMA, SEED, 32), BodyOptions(noise="reference"))
    thread = DeviceThread(body, engine.device, SHAPE, 32, 0.0, 8, 8, 0)
    thread.start()
    collector = Collector(2)
    thread.submit([Job(torch.ones(SHAPE), SamplingPlan.predict(20))], [collector.done_for(0)])
    thread.submit([Job(images[0], SamplingPlan.predict(20))], [collector.done_for(1)])
    assert collector.event.wait(600)
    thread.close(10)
    assert isinstance(collector.results[0], Exception)
    assert not isinstance(collector.results[1], Exception) and int(np.sum(collector.results[1])) == 20


def test_a_failed_batch_fails_its_images_and_the_server_keeps_serving(engine, images):
    body = batch_body(Smoothing(engine, SIGMA, SEED, 32), BodyOptions(noise="reference"))
    run, batches = body.run, []

    def failing(*rows):
        batches.append(len(rows[0]))
        run(*rows)
        if len(batches) == 2:  # the first batch after the warm-up
            raise RuntimeError("device lost")

    body.run = failing
    thread = DeviceThread(body, engine.device, SHAPE, 32, 0.0, 8, 8, 0)
    thread.start()
    first, then = Collector(1), Collector(2)
    thread.submit([Job(images[0], SamplingPlan.predict(50))], [first.done_for(0)])
    assert first.event.wait(600)
    thread.submit([Job(images[i], SamplingPlan.predict(50)) for i in (1, 2)], [then.done_for(i) for i in (1, 2)])
    assert then.event.wait(600)
    assert thread.alive and thread.stats().admitted == 0
    thread.close(10)
    failure = first.results[0]
    assert type(failure) is RuntimeError and str(failure) == "the classifier failed: RuntimeError: device lost"
    offline = _offline(engine, SamplingPlan.predict(50), [(1, images[1], 0), (2, images[2], 0)])
    assert all(np.array_equal(then.results[i], offline[i]) for i in (1, 2))
