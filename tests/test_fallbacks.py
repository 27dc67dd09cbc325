"""Fail safe, with proof: each stage of a fast body is made to fail, and the run goes on.

Every test injects one fault (Triton compile, torch.compile, CUDA-graph capture, a CPU runtime's
session, a parity mismatch, a body that disagrees, a batch that fails mid-run, the compiled noise)
and asserts three things: the run completes, its counts (so its rows) are identical to the plain
body's, and the fallback was said in one line (printed and kept in ``body.fallbacks``, which the run
record stores). Engine files that fail to load (AOTInductor) are the classifier itself: they stop
the run with one line instead, and so does the plain body failing mid-run (the record says
``failed``; ``--resume`` continues).
"""

import itertools
import os
import signal
import types

import torch

if not torch.cuda.is_available():  # the fused kernel runs in Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import random_images, rows_without, stacked_counts, stream_counts, tiny_engine_of

from dmae_fast.base.errors import Interrupted, UserError  # noqa: E402
from dmae_fast.batching.bodies import BodyOptions, batch_body  # noqa: E402
from dmae_fast.batching.cpu import runtimes as cpu_runtimes  # noqa: E402
from dmae_fast.batching.fast_body import FastBody  # noqa: E402
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody, SamplingPlan  # noqa: E402
from dmae_fast.cli.certify import main  # noqa: E402
from dmae_fast.engines.aoti_engine import TRY_ANY, AOTIEngine  # noqa: E402
from dmae_fast.engines.torch_engine import TorchEngine

CPU = torch.device("cpu")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="fused on the CPU needs the interpreter (CI)")


@pytest.fixture(scope="module")
def engine():
    return tiny_engine_of(sigma=0.5)


def _counts(engine, body):
    plan = SamplingPlan.certify(n0=10, n=60)
    return stacked_counts(Smoothing(engine, 0.5, 11, 48), random_images(4, step=3), plan, body)


def _runs_like_the_plain_body(engine, options, capsys, expected):
    """The body chosen for ``options`` counts as the plain body, and its fallbacks match ``expected``."""
    plain = _counts(engine, PlainBody(Smoothing(engine, 0.5, 11, 48)))
    body = batch_body(Smoothing(engine, 0.5, 11, 48), options)
    np.testing.assert_array_equal(_counts(engine, body), plain)
    err = capsys.readouterr().err
    assert len(body.fallbacks) == len(expected)
    for notice, words in zip(body.fallbacks, expected):
        assert all(word in notice for word in words), notice
        assert f"dmae-fast: {notice}\n" in err  # said, in one line
    return body


@cpu_only
def test_a_triton_kernel_that_fails_to_compile_falls_back_to_the_unfused_front_end(engine, monkeypatch, capsys):
    from dmae_fast.kernels import fused_frontend

    def broken(*args, **kwargs):
        raise RuntimeError("triton: PassManager::run failed")

    monkeypatch.setattr(fused_frontend, "fused_tokens", broken)
    body = _runs_like_the_plain_body(engine, BodyOptions(fused=True), capsys,
                                     [("the fast body (fused) failed", "PassManager::run failed",
                                       "continuing on the fast body (eager)")])
    assert isinstance(body, FastBody) and not body.options.fused


def test_a_torch_compile_failure_falls_back_to_the_eager_body(engine, monkeypatch, capsys):
    def failing_compile(function, **kwargs):
        def compiled(*args):
            raise RuntimeError("BackendCompilerFailed: inductor raised")
        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    body = _runs_like_the_plain_body(engine, BodyOptions(compile=True, noise="reference"), capsys,
                                     [("the fast body (compiled) failed", "BackendCompilerFailed",
                                       "continuing on the fast body (eager)")])
    assert not body.options.compile


def test_a_cuda_graph_that_fails_to_capture_falls_back_to_no_graphs(engine, monkeypatch, capsys):
    monkeypatch.setattr(FastBody, "_available", lambda self, options: options)  # keep the graphs on the CPU
    monkeypatch.setattr(FastBody, "_capture", lambda self: (_ for _ in ()).throw(
        RuntimeError("CUDA error: operation not permitted when stream is capturing")))
    body = _runs_like_the_plain_body(engine, BodyOptions(cuda_graphs=True), capsys,
                                     [("the fast body (cuda-graphs) failed", "stream is capturing",
                                       "continuing on the fast body (eager)")])
    assert not body.options.cuda_graphs


def test_a_body_that_disagrees_with_the_plain_body_is_not_used(engine, monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: function)  # the compiled body: eager here
    monkeypatch.setattr(FastBody, "_classify_images",
                        lambda self, images: torch.zeros(len(images), dtype=torch.long))
    body = _runs_like_the_plain_body(engine, BodyOptions(compile=True, noise="reference"), capsys, [
        ("the fast body (compiled) disagreed with the plain body on", "continuing on the fast body (eager)"),
        ("the fast body (eager) disagreed with the plain body on", "continuing on the plain body")])
    assert isinstance(body, PlainBody)


@pytest.fixture(scope="module")
def demo_model():
    from dmae_fast.demo import DEMO_CHECKPOINT
    from dmae_fast.model.checkpoints import load_classifier

    return load_classifier(DEMO_CHECKPOINT).eval()


def _fail(message):
    def raising(self, *args, **kwargs):
        raise RuntimeError(message)
    return raising


def test_cpu_runtime_sessions_that_fail_fall_back_to_pytorch(demo_model, monkeypatch, capsys):
    monkeypatch.setenv("DMAE_FAST_CACHE", "off")  # an entry another test cached would add its own notice (rebuilt)
    monkeypatch.setattr(cpu_runtimes.OpenVinoChunks, "__init__", _fail("[GENERAL_ERROR] could not compile model"))
    monkeypatch.setattr(cpu_runtimes.OrtChunks, "__init__", _fail("ONNXRuntimeError: INVALID_GRAPH"))
    engine = TorchEngine(demo_model, CPU, "fp32")
    plain = _counts_demo(engine, PlainBody(Smoothing(engine, 0.25, 11, 48)))
    body = batch_body(Smoothing(engine, 0.25, 11, 48), BodyOptions(fast=True, workers=1))
    np.testing.assert_array_equal(_counts_demo(engine, body), plain)
    [notice] = body.fallbacks
    assert notice.startswith("the CPU fast body failed (RuntimeError: ") and "on PyTorch" in notice
    assert notice in capsys.readouterr().err
    assert body.classifier.description.startswith("torch eager fp32")


def _counts_demo(engine, body):
    from dmae_fast.data import demo_digits

    digits = demo_digits("test")
    images = [(i, digits[i][0], digits[i][1]) for i in (0, 7)]
    return stacked_counts(Smoothing(engine, 0.25, 11, 48), images, SamplingPlan.certify(20, 100), body)


def test_an_exported_graph_that_fails_its_parity_check_is_not_used(demo_model, monkeypatch, capsys, tmp_path):
    """Through the command: rows identical to the plain run's, the fallback in stderr and the record."""
    monkeypatch.setenv("DMAE_FAST_CACHE", "off")  # the check runs, not a verdict cached by another test
    for kind in (cpu_runtimes.OrtChunks, cpu_runtimes.OpenVinoChunks):
        monkeypatch.setattr(kind, "logits", lambda self, chunk: torch.zeros(len(chunk), 10))
    common = ["--data", "demo", "--seed", "0",
              "--max", "2", "--n0", "20", "--n", "100", "--quiet", "--workers", "0", "--device",
              "cpu"]
    assert main([*common, "--out", str(tmp_path / "plain.tsv")]) == 0
    capsys.readouterr()
    assert main([*common, "--fast", "--out", str(tmp_path / "fast.tsv")]) == 0
    err = capsys.readouterr().err
    assert "differs from PyTorch" in err and "continuing on the CPU fast body on PyTorch" in err

    assert rows_without(tmp_path / "fast.tsv") == rows_without(tmp_path / "plain.tsv")
    record = json.loads((tmp_path / "fast.tsv.json").read_text())
    assert len(record["body_fallbacks"]) == 1 and "differs from PyTorch" in record["body_fallbacks"][0]


def test_an_aoti_package_that_fails_to_load_stops_the_run_in_one_line(engine, monkeypatch, tmp_path):
    """An engine file is the classifier: no other body may stand in for it."""
    def load(path, **kwargs):
        raise RuntimeError("Error in dlopen: undefined symbol")

    monkeypatch.setattr(torch._inductor, "aoti_load_package", load)
    monkeypatch.setenv(TRY_ANY, "1")  # on a torch whose loader is refused (2.11) too: this one cannot crash
    meta = types.SimpleNamespace(device="cpu", spec=engine.spec, precision="fp32", input="image",
                                 input_shape=engine.spec.input_shape, kind="aoti")
    with pytest.raises(UserError, match=r"^cannot load AOTInductor package .*model.pt2: Error in dlopen"):
        AOTIEngine(tmp_path / "model.pt2", meta, "cpu")


def test_dmae_certify_runs_the_fast_body_by_default_and_says_why(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("DMAE_FAST_BODY")
    out = tmp_path / "default.tsv"
    assert main(["--data", "demo", "--seed", "0", "--max", "1", "--n0", "20", "--n", "100", "--quiet", "--workers", "0",
                 "--device", "cpu", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "worker(s) x 1 thread" in err and "(fast body: the default (--body plain runs" in err
    record = json.loads(out.with_name("default.tsv.json").read_text())
    assert record["config"]["fast"] and record["body"]["name"] == "fast"
    assert record["body"]["reason"].startswith("the default")
    assert record["body_fallbacks"] == []


# --------------------------------------------------------------------------- failures mid-run (issue 39)


def _fail_on_call(monkeypatch, body_class, call, error, after_counting=False):
    """``body_class.run`` raises ``error`` on its ``call``-th call (a body's trial batch is a call too),
    with ``after_counting`` once that batch has been counted."""
    calls = itertools.count(1)
    run = body_class.run

    def failing(body, *rows):
        if next(calls) != call:
            return run(body, *rows)
        if after_counting:
            run(body, *rows)
        raise error

    monkeypatch.setattr(body_class, "run", failing)


@pytest.mark.parametrize("sequential", [False, True])
def test_a_body_that_fails_mid_run_gives_way_to_the_next_with_the_same_counts(engine, monkeypatch, capsys,
                                                                           sequential):
    """The batch that fails was counted before it raised: the images on the device start again on
    the next body, so nothing of the failed body's counts is kept."""
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: function)  # the compiled body: eager here
    looks = (20, 40, 60)
    plan = SamplingPlan.sequential(10, looks) if sequential else SamplingPlan.certify(n0=10, n=60)
    stop_at = {3 * i: i % 3 for i in range(6)}

    def decide(index, counts, look):
        return look >= stop_at[index]

    def counts(body):
        return stream_counts(Smoothing(engine, 0.5, 11, 48), random_images(6, step=3), plan, body,
                             decide if sequential else None)

    plain = counts(PlainBody(Smoothing(engine, 0.5, 11, 48)))
    _fail_on_call(monkeypatch, FastBody, 4, RuntimeError("std::bad_alloc"), after_counting=True)
    body = batch_body(Smoothing(engine, 0.5, 11, 48), BodyOptions(compile=True, noise="reference"))
    assert body.options.compile and body.fallbacks == []
    got = counts(body)
    assert got.keys() == plain.keys() and all(np.array_equal(got[i], plain[i]) for i in plain)
    notice = ("the fast body (compiled) failed mid-run (RuntimeError: std::bad_alloc); continuing on the fast body "
              "(eager)")
    assert body.fallbacks == [notice] and capsys.readouterr().err.count("dmae-fast: ") == 1
    assert not body.chain.body.options.compile  # what the run record describes


@pytest.mark.parametrize("error", [KeyboardInterrupt(), Interrupted(signal.SIGTERM), UserError("bad image 3")])
def test_interrupts_and_user_errors_in_a_batch_are_not_fallen_back_from(engine, monkeypatch, error):
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: function)
    _fail_on_call(monkeypatch, FastBody, 2, error)  # the first batch after the trial
    body = batch_body(Smoothing(engine, 0.5, 11, 48), BodyOptions(compile=True, noise="reference"))
    with pytest.raises(type(error)):
        _counts(engine, body)
    assert body.fallbacks == [] and body.chain.body is body


DEMO_RUN = ["--data", "demo", "--seed", "0",
            "--max", "3", "--n0", "20", "--n", "100", "--batch", "50", "--quiet", "--workers", "0",
            "--device", "cpu"]


def _fail_in_a_runtime_mid_run(monkeypatch, batch, message):
    """The CPU runtimes raise ``message`` on the last chunk of the ``batch``-th batch that a CPU fast
    body runs (its trial batch is the first): the batch's other chunks were classified."""
    from dmae_fast.batching.cpu.body import CpuFastBody, even_parts

    batches = itertools.count(1)
    state = {"batch": 0}  # the parity check's logits come first
    run = CpuFastBody.run

    def counting(body, *rows):
        state.update(batch=next(batches), chunks=itertools.count(1),
                     last=even_parts(len(rows[0]), body.chunk, body.workers))
        return run(body, *rows)

    monkeypatch.setattr(CpuFastBody, "run", counting)
    for kind in (cpu_runtimes.OrtChunks, cpu_runtimes.OpenVinoChunks):
        def failing(self, chunk, logits=kind.logits):
            if state["batch"] == batch and next(state["chunks"]) == state["last"]:
                raise RuntimeError(message)
            return logits(self, chunk)

        monkeypatch.setattr(kind, "logits", failing)


def test_a_runtime_that_fails_mid_run_falls_back_and_the_run_completes(monkeypatch, capsys, tmp_path):
    """Through the command: an OpenVINO/ONNX Runtime error in the run's fourth batch (the first image
    written, the second partly counted) continues on PyTorch; rows identical to the plain body's."""
    monkeypatch.setenv("DMAE_FAST_CACHE", "off")
    assert main([*DEMO_RUN, "--body", "plain", "--out", str(tmp_path / "plain.tsv")]) == 0
    capsys.readouterr()
    error = "Exception from src/inference/src/cpp/infer_request.cpp:223: std::bad_alloc"
    _fail_in_a_runtime_mid_run(monkeypatch, 5, error)
    assert main([*DEMO_RUN, "--fast", "--out", str(tmp_path / "fast.tsv")]) == 0
    notice = (f"the CPU fast body failed mid-run (RuntimeError: {error}); continuing on the CPU fast body on "
              "PyTorch")
    assert f"dmae-fast: {notice}\n" in capsys.readouterr().err
    assert rows_without(tmp_path / "fast.tsv") == rows_without(tmp_path / "plain.tsv")
    record = json.loads((tmp_path / "fast.tsv.json").read_text())
    assert record["status"] == "complete" and record["body_fallbacks"] == [notice]
    assert record["engine"].startswith("torch eager fp32")  # the body the run ended on


def test_a_plain_body_that_fails_mid_run_is_one_line_a_failed_record_and_resume_completes(monkeypatch, capsys,
                                                                                         tmp_path):
    run = [*DEMO_RUN, "--body", "plain"]
    assert main([*run, "--out", str(tmp_path / "whole.tsv")]) == 0
    capsys.readouterr()
    out = tmp_path / "failed.tsv"
    with monkeypatch.context() as patch:
        _fail_on_call(patch, PlainBody, 4, RuntimeError("std::bad_alloc"))  # after the first image's row
        assert main([*run, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error" in line]
    assert line == ("dmae-certify: error: the plain body failed mid-run (RuntimeError: std::bad_alloc); no simpler "
                    "body to continue on")
    record = json.loads((tmp_path / "failed.tsv.json").read_text())
    assert record["status"] == "failed" and "std::bad_alloc" in record["error"] and record["images"] == 1
    assert main([*run, "--resume", "--out", str(out)]) == 0
    assert rows_without(out) == rows_without(tmp_path / "whole.tsv")
    assert json.loads((tmp_path / "failed.tsv.json").read_text())["status"] == "complete"


def test_the_compiled_noise_fallback_is_in_the_run_record(monkeypatch, capsys, tmp_path):
    from dmae_fast.noise.compiled import NoiseSource

    def no_compiler(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(NoiseSource, "_run_compiled", no_compiler)
    out = tmp_path / "r.tsv"
    assert main([*DEMO_RUN, "--max", "1", "--body", "plain", "--out", str(out)]) == 0
    [notice] = json.loads(out.with_name("r.tsv.json").read_text())["body_fallbacks"]
    assert notice.startswith("compiled noise unavailable (compiling it failed (RuntimeError: InvalidCxxCompiler")
    assert f"dmae-fast: {notice}\n" in capsys.readouterr().err
