"""Fail safe, with proof: each stage of a fast body is made to fail, and the run goes on.

Every test injects one fault (Triton compile, torch.compile, CUDA-graph capture, a CPU runtime's
session, a parity mismatch, a body that disagrees) and asserts three things: the run completes,
its counts (so its rows) are identical to the plain body's, and the fallback was said in one line
(printed and kept in ``body.fallbacks``, which the run record stores). Engine files that fail to
load (AOTInductor) are the classifier itself: they stop the run with one line instead.
"""

import os
import types

import torch

if not torch.cuda.is_available():  # the fused kernel runs in Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dmae_fast.certification.bodies import BodyOptions, batch_body  # noqa: E402
from dmae_fast.certification.fast_stream import FastBatches  # noqa: E402
from dmae_fast.certification.stream import (  # noqa: E402
    ImageBatches,
    SamplingPlan,
    StreamingCertifier,
)
from dmae_fast.cli.certify import main  # noqa: E402
from dmae_fast.engines import (
    TorchEngine,  # noqa: E402
    cpu_runtimes,  # noqa: E402
)
from dmae_fast.engines.aoti_engine import AOTIEngine  # noqa: E402
from dmae_fast.errors import UserError  # noqa: E402
from dmae_fast.model import ClassifierSpec, EncoderConfig, SmoothingClassifier  # noqa: E402

CPU = torch.device("cpu")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="fused on the CPU needs the interpreter (CI)")


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    spec = ClassifierSpec(EncoderConfig(32, 2, 2, patch_size=4, img_size=16), num_classes=10, input_size=16,
                          sigma=0.5)
    return TorchEngine(SmoothingClassifier(spec).eval(), CPU, "fp32")


def _counts(engine, body):
    generator = torch.Generator().manual_seed(1)
    images = [(3 * i, torch.rand((3, 16, 16), generator=generator), i % 10) for i in range(4)]
    out = StreamingCertifier(engine, SamplingPlan.certify(n0=10, n=60), 0.5, 11, 48, body).run(images)
    return np.stack([o.counts for o in out])


def _runs_like_the_plain_body(engine, options, capsys, expected):
    """The body chosen for ``options`` counts as the plain body, and its fallbacks match ``expected``."""
    plain = _counts(engine, ImageBatches(engine, 0.5, 11, 48))
    body = batch_body(engine, 0.5, 11, 48, options)
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
    assert isinstance(body, FastBatches) and not body.options.fused


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
    monkeypatch.setattr(FastBatches, "_available", lambda self, options: options)  # keep the graphs on the CPU
    monkeypatch.setattr(FastBatches, "_capture", lambda self: (_ for _ in ()).throw(
        RuntimeError("CUDA error: operation not permitted when stream is capturing")))
    body = _runs_like_the_plain_body(engine, BodyOptions(cuda_graphs=True), capsys,
                                     [("the fast body (cuda-graphs) failed", "stream is capturing",
                                       "continuing on the fast body (eager)")])
    assert not body.options.cuda_graphs


def test_a_body_that_disagrees_with_the_plain_body_is_not_used(engine, monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: function)  # the compiled body: eager here
    monkeypatch.setattr(FastBatches, "_classify_images", lambda self, images: torch.zeros(len(images), dtype=torch.long))
    body = _runs_like_the_plain_body(engine, BodyOptions(compile=True, noise="reference"), capsys, [
        ("the fast body (compiled) disagreed with the plain body on", "continuing on the fast body (eager)"),
        ("the fast body (eager) disagreed with the plain body on", "continuing on the plain body")])
    assert isinstance(body, ImageBatches)


@pytest.fixture(scope="module")
def demo_model():
    from dmae_fast.checkpoints import load_classifier
    from dmae_fast.demo import DEMO_CHECKPOINT

    return load_classifier(DEMO_CHECKPOINT).eval()


def _fail(message):
    def raising(self, *args, **kwargs):
        raise RuntimeError(message)
    return raising


def test_cpu_runtime_sessions_that_fail_fall_back_to_pytorch(demo_model, monkeypatch, capsys):
    monkeypatch.setattr(cpu_runtimes.OpenVinoChunks, "__init__", _fail("[GENERAL_ERROR] could not compile model"))
    monkeypatch.setattr(cpu_runtimes.OrtChunks, "__init__", _fail("ONNXRuntimeError: INVALID_GRAPH"))
    engine = TorchEngine(demo_model, CPU, "fp32")
    plain = _counts_demo(engine, ImageBatches(engine, 0.25, 11, 48))
    body = batch_body(engine, 0.25, 11, 48, BodyOptions(fast=True, workers=1))
    np.testing.assert_array_equal(_counts_demo(engine, body), plain)
    [notice] = body.fallbacks
    assert notice.startswith("the CPU fast body failed (RuntimeError: ") and "on PyTorch" in notice
    assert notice in capsys.readouterr().err
    assert body.classifier.description.startswith("torch eager fp32")


def _counts_demo(engine, body):
    from dmae_fast.data import demo_digits

    digits = demo_digits("test")
    images = [(i, digits[i][0], digits[i][1]) for i in (0, 7)]
    out = StreamingCertifier(engine, SamplingPlan.certify(20, 100), 0.25, 11, 48, body).run(images)
    return np.stack([o.counts for o in out])


def test_an_exported_graph_that_fails_its_parity_check_is_not_used(demo_model, monkeypatch, capsys, tmp_path):
    """Through the command: rows identical to the plain run's, the fallback in stderr and the record."""
    monkeypatch.setenv("DMAE_FAST_CACHE", "off")  # the check runs, not a verdict cached by another test
    for kind in (cpu_runtimes.OrtChunks, cpu_runtimes.OpenVinoChunks):
        monkeypatch.setattr(kind, "logits", lambda self, chunk: torch.zeros(len(chunk), 10))
    common = ["--data", "demo", "--max", "2", "--n0", "20", "--n", "100", "--quiet", "--workers", "0", "--device",
              "cpu"]
    assert main([*common, "--out", str(tmp_path / "plain.tsv")]) == 0
    capsys.readouterr()
    assert main([*common, "--fast", "--out", str(tmp_path / "fast.tsv")]) == 0
    err = capsys.readouterr().err
    assert "differs from PyTorch" in err and "continuing on the CPU fast body on PyTorch" in err

    def rows(name):
        return [line.split("\t")[:5] + line.split("\t")[6:] for line in (tmp_path / name).read_text().splitlines()]

    assert rows("fast.tsv") == rows("plain.tsv")  # all but the time column
    record = json.loads((tmp_path / "fast.tsv.json").read_text())
    assert len(record["body_fallbacks"]) == 1 and "differs from PyTorch" in record["body_fallbacks"][0]


def test_an_aoti_package_that_fails_to_load_stops_the_run_in_one_line(engine, monkeypatch, tmp_path):
    """An engine file is the classifier: no other body may stand in for it."""
    def load(path, **kwargs):
        raise RuntimeError("Error in dlopen: undefined symbol")

    monkeypatch.setattr(torch._inductor, "aoti_load_package", load)
    meta = types.SimpleNamespace(device="cpu", spec=engine.spec, precision="fp32", input="image",
                                 input_shape=engine.spec.input_shape, kind="aoti")
    with pytest.raises(UserError, match=r"^cannot load AOTInductor package .*model.pt2: Error in dlopen"):
        AOTIEngine(tmp_path / "model.pt2", meta, "cpu")


def test_the_body_choice_and_its_reason():
    from dmae_fast.certification.choices import chosen_body

    assert chosen_body(None, False, False, {}) == ("fast", "the default (--body plain runs the plain reference body)")
    assert chosen_body("plain", False, False, {}) == ("plain", "--body plain")
    assert chosen_body(None, True, False, {"DMAE_FAST_BODY": "plain"}) == ("fast", "--fast")
    assert chosen_body(None, False, False, {"DMAE_FAST_BODY": "plain"}) == ("plain", "DMAE_FAST_BODY=plain")
    assert chosen_body(None, False, True, {})[0] == "plain"  # --fused & co. pick their own body
    with pytest.raises(UserError, match="--fast and --body plain contradict"):
        chosen_body("plain", True, False, {})
    with pytest.raises(UserError, match="DMAE_FAST_BODY='quick': choose fast or plain"):
        chosen_body(None, False, False, {"DMAE_FAST_BODY": "quick"})


def test_dmae_certify_runs_the_fast_body_by_default_and_says_why(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("DMAE_FAST_BODY")
    out = tmp_path / "default.tsv"
    assert main(["--data", "demo", "--max", "1", "--n0", "20", "--n", "100", "--quiet", "--workers", "0",
                 "--device", "cpu", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "worker(s) x 1 thread" in err and "(fast body: the default (--body plain runs" in err
    record = json.loads(out.with_name("default.tsv.json").read_text())
    assert record["config"]["fast"] and record["config"]["body_reason"].startswith("fast body: the default")
    assert record["body_fallbacks"] == []
