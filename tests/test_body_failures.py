"""A body that fails in any call the engine loop makes mid-run falls back as a failed batch does (issue 56).

Loading a new image, loading an image into a spare slot, running a batch, copying counts to the host, clearing
them, folding a spare slot's counts in, and a batch's failure on an asynchronous device that surfaces when the
host waits for counts: each is made to fail once (``std::bad_alloc``) in a small certification, fixed-n and
sequential. The run moves to the next body in one line and its counts are an uninterrupted run's; with no body
left (the plain body) the command says so in one line, exit 2, and ``--resume`` completes the rows. In the engine
loop (the server's view) a failed load ends the image being loaded with those on the device; what the image
source raises is no body failure.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import LazyDevice, random_images, rows_without, stream_counts

from dmae_fast.batching import fallback
from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.device_queue import StreamQueue
from dmae_fast.batching.engine_loop import BatchFailed, EngineLoop
from dmae_fast.batching.fallback import BodyChain, Candidate
from dmae_fast.batching.fast_body import FastBody
from dmae_fast.batching.job import Job
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody
from dmae_fast.bench.async_device import AsyncBody
from dmae_fast.cli.certify import main
from dmae_fast.stats.plan import SamplingPlan

SIGMA, SEED, BATCH = 0.5, 11, 16
ITEMS = random_images(5, size=8, step=3)
BAD_ALLOC = "RuntimeError: std::bad_alloc"


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


def _decide(index, counts, look):
    """Images stop at different looks (0, 1, 2, ...)."""
    return look >= (index // 3) % 3


def _plan(sequential: bool) -> SamplingPlan:
    return SamplingPlan.sequential(6, (10, 20, 30, 40)) if sequential else SamplingPlan.certify(n0=10, n=40)


def _counts(engine, body, sequential: bool, items=ITEMS) -> dict[int, np.ndarray]:
    return stream_counts(Smoothing(engine, SIGMA, SEED, BATCH), items, _plan(sequential), body,
                         _decide if sequential else None)


def _fail_once(monkeypatch, owner: type, name: str, fails: Callable[..., bool]) -> dict:
    """``owner.name`` raises std::bad_alloc once: at the first call from now on whose arguments ``fails``;
    the dict returned says whether it did."""
    method, state = getattr(owner, name), {"failed": False}

    def failing(self, *arguments):
        if not state["failed"] and fails(*arguments):
            state["failed"] = True
            raise RuntimeError("std::bad_alloc")
        return method(self, *arguments)

    monkeypatch.setattr(owner, name, failing)
    return state


def _nth(call: int) -> Callable[..., bool]:
    calls = itertools.count(1)
    return lambda *arguments: next(calls) == call


def _assert_fell_back(got, expected, body, capsys, failed: str, next_body: str) -> None:
    assert got.keys() == expected.keys() and all(np.array_equal(got[i], expected[i]) for i in expected)
    notice = f"{failed} failed mid-run ({BAD_ALLOC}); continuing on {next_body}"
    assert body.fallbacks == [notice]
    err = capsys.readouterr().err
    assert f"dmae-fast: {notice}\n" in err and err.count("dmae-fast: ") == 1


# the calls of a synchronous body (the fast body, compiled, giving way to the eager one), at their third call
SYNCHRONOUS = {"load": (FastBody, "load"), "run": (FastBody, "run"), "copy": (StreamQueue, "to_host"),
               "clear": (StreamQueue, "clear")}


@pytest.mark.parametrize("sequential", [False, True], ids=["fixed-n", "sequential"])
@pytest.mark.parametrize("call", SYNCHRONOUS)
def test_a_body_call_that_fails_mid_run_gives_way_to_the_next_body_with_the_same_counts(engine, monkeypatch, capsys,
                                                                                     call, sequential):
    expected = _counts(engine, PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)), sequential)
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: function)  # the compiled body: eager here
    body = batch_body(Smoothing(engine, SIGMA, SEED, BATCH), BodyOptions(compile=True, noise="reference"))
    assert body.options.compile and body.fallbacks == []
    capsys.readouterr()
    injected = _fail_once(monkeypatch, *SYNCHRONOUS[call], _nth(3))
    got = _counts(engine, body, sequential)
    assert injected["failed"]
    _assert_fell_back(got, expected, body, capsys, "the fast body (compiled)", "the fast body (eager)")


def _asynchronous_body(engine, monkeypatch):
    """The plain body on a lazy device, in a chain that continues on the plain body (no trial batches: the lazy
    device counts nothing before it is waited for)."""
    monkeypatch.setattr(fallback, "trial_classes", lambda body, engine, rows: torch.zeros(rows))

    def build():
        return AsyncBody(PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)), LazyDevice())

    plain = lambda: PlainBody(Smoothing(engine, SIGMA, SEED, BATCH))  # noqa: E731
    return BodyChain(engine).choose([Candidate("the asynchronous body", build)], plain, None)


def _spare_load() -> Callable[..., bool]:
    """True for the load of an image loaded before (its rows past a look, into a spare slot)."""
    loaded: set[int] = set()

    def again(slot, image):
        seen = id(image) in loaded
        loaded.add(id(image))
        return seen

    return again


# the calls only an asynchronous device makes (three images: one crosses a look into a spare slot), and a batch
# failing on the device (seen when the host waits)
ASYNCHRONOUS = {"spare load": (AsyncBody, "load", _spare_load), "fold": (LazyDevice, "fold", lambda: _nth(1)),
                "on the device": (PlainBody, "run", lambda: _nth(4))}


@pytest.mark.parametrize("call", ASYNCHRONOUS)
def test_a_failure_on_an_asynchronous_device_gives_way_to_the_next_body_with_the_same_counts(engine, monkeypatch,
                                                                                          capsys, call):
    expected = _counts(engine, PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)), True, ITEMS[:3])
    body = _asynchronous_body(engine, monkeypatch)
    owner, name, fails = ASYNCHRONOUS[call]
    injected = _fail_once(monkeypatch, owner, name, fails())
    got = _counts(engine, body, True, ITEMS[:3])
    assert injected["failed"]
    _assert_fell_back(got, expected, body, capsys, "the asynchronous body", "the plain body")


DEMO_RUN = ["--data", "demo", "--seed", "0", "--max", "6", "--n0", "20", "--n", "100", "--batch", "50", "--quiet",
            "--workers", "0", "--device", "cpu", "--body", "plain", "--sequential"]


def test_the_plain_body_failing_to_load_an_image_is_one_line_a_failed_record_and_resume_completes(monkeypatch,
                                                                                                capsys, tmp_path):
    """The issue's case: the plain body's fifth load fails under --sequential."""
    assert main([*DEMO_RUN, "--out", str(tmp_path / "whole.tsv")]) == 0
    capsys.readouterr()
    out = tmp_path / "failed.tsv"
    with monkeypatch.context() as patch:
        injected = _fail_once(patch, PlainBody, "load", _nth(5))
        assert main([*DEMO_RUN, "--out", str(out)]) == 2
        assert injected["failed"]
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error" in line]
    assert line == (f"dmae-certify: error: the plain body failed mid-run ({BAD_ALLOC}); no simpler body to "
                    "continue on")
    record = json.loads((tmp_path / "failed.tsv.json").read_text())
    assert record["status"] == "failed" and "std::bad_alloc" in record["error"] and 0 < record["images"] < 6
    assert main([*DEMO_RUN, "--resume", "--out", str(out)]) == 0
    assert rows_without(out) == rows_without(tmp_path / "whole.tsv")


def test_a_failed_load_ends_the_images_on_the_device_and_that_one_and_the_loop_goes_on(engine, monkeypatch):
    """The server's view: two slots, the third image's load fails. The image on the device and the one being
    loaded end with the failure, the queued ones keep their place and get the streamer's counts."""
    plan = SamplingPlan.certify(n0=10, n=20)
    loop = EngineLoop(PlainBody(Smoothing(engine, SIGMA, SEED, BATCH)), engine.device, BATCH, 2)
    jobs = [Job(image, plan, index=index) for index, image, _ in ITEMS]
    for job in jobs:
        loop.add(job)
    _fail_once(monkeypatch, PlainBody, "load", _nth(3))
    finished = {}
    while loop.busy:
        finished.update(loop.step(0.0))
    failed = [job.index for job in jobs if isinstance(finished[job], BatchFailed)]
    assert len(failed) == 2 and str(finished[jobs[2]]) == BAD_ALLOC
    unfailed = [item for item in ITEMS if item[0] not in failed]
    expected = stream_counts(Smoothing(engine, SIGMA, SEED, BATCH), unfailed, plan)
    assert all(np.array_equal(finished[job], expected[job.index]) for job in jobs if job.index not in failed)
    assert loop.stats().on_device == 0 and loop.stats().queued == 0


def test_what_the_image_source_raises_is_raised_as_it_is_not_fallen_back_from(engine, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: function)
    body = batch_body(Smoothing(engine, SIGMA, SEED, BATCH), BodyOptions(compile=True, noise="reference"))

    def images():
        yield from ITEMS[:2]
        raise OSError("the data disappeared")

    with pytest.raises(OSError, match="the data disappeared"):
        stream_counts(Smoothing(engine, SIGMA, SEED, BATCH), images(), _plan(False), body)
    assert body.fallbacks == [] and body.chain.body is body
