"""The fast batch body: same schedule, same counts as the plain streaming certifier."""

import json
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the fused kernel runs in Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import random_images, rows_without, stream_counts, tiny_engine_of

from dmae_fast.base.errors import UserError  # noqa: E402
from dmae_fast.batching.fast_body import FastBody, FastPath  # noqa: E402
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stage_timer import STAGES, StageTimer  # noqa: E402
from dmae_fast.batching.stream import SamplingPlan  # noqa: E402
from dmae_fast.cli.certify import main  # noqa: E402
from dmae_fast.engines.aoti_engine import aoti_torch_problem
from dmae_fast.engines.base import Engine
from dmae_fast.engines.front_end import front_end_path  # noqa: E402
from dmae_fast.engines.opening import EngineOptions, open_engine
from dmae_fast.export import ExportConfig, export_engines  # noqa: E402
from dmae_fast.model.checkpoints import save_classifier  # noqa: E402

CPU = torch.device("cpu")


# On a GPU machine the Triton kernels are compiled for CUDA in this process, so the fused front
# end is refused on the CPU (see the last test of this group); CI runs these with the interpreter.
cpu_fused = pytest.mark.skipif(torch.cuda.is_available(), reason="fused on the CPU needs the interpreter (CI)")

def _engine(input_size=16, device=CPU, precision="fp32"):
    return tiny_engine_of(precision, device, input_size=input_size, sigma=0.5)


def _images(size, count=5):
    return random_images(count, size, step=7, first=2)


def _counts(engine, images, plan, batch, body=None, decide=None):
    return stream_counts(Smoothing(engine, 0.5, 11, batch), images, plan, body, decide)


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=cpu_fused)])
def test_fast_body_gives_identical_counts(fused):
    engine, images = _engine(), _images(16)
    plan = SamplingPlan.certify(n0=12, n=40)  # 52 rows per image, batch 48: images straddle batches
    plain = _counts(engine, images, plan, 48)
    timer = StageTimer(CPU)
    body = FastBody(Smoothing(engine, 0.5, 11, 48), FastPath(fused=fused), timer)
    assert body.options.fused == fused and ("fused" in body.description) == fused
    fast = _counts(engine, images, plan, 48, body)
    assert plain.keys() == fast.keys()
    assert sum((c > 0).sum() for c in plain.values()) > 15  # votes are spread: the comparison means something
    assert all(np.array_equal(plain[i], fast[i]) for i in plain)
    assert timer.batches == -(-5 * 52 // 48)  # the last, short batch was padded, not dropped
    table = timer.table(1.0)
    assert all(stage in table for stage in STAGES) and timer.seconds["body"] > 0


def test_resizing_classifier_falls_back_to_the_unfused_front_end(capsys):
    engine, images = _engine(input_size=8), _images(8, count=3)
    body = FastBody(Smoothing(engine, 0.5, 11, 32), FastPath(fused=True))
    assert "fused front end unavailable" in capsys.readouterr().err
    assert not body.options.fused
    plan = SamplingPlan.predict(n=30)
    plain, fast = _counts(engine, images, plan, 32), _counts(engine, images, plan, 32, body)
    assert all(np.array_equal(plain[i], fast[i]) for i in plain)


@cpu_fused
def test_sequential_plan_with_the_fused_body():
    engine, images = _engine(), _images(16, count=4)
    plan = SamplingPlan.sequential(n0=8, estimation_looks=(16, 40))
    decide = lambda index, counts, look: index % 2 == 0  # noqa: E731  (even images stop at the first look)
    body = FastBody(Smoothing(engine, 0.5, 11, 24), FastPath(fused=True))
    plain, fast = _counts(engine, images, plan, 24, decide=decide), _counts(engine, images, plan, 24, body, decide)
    assert all(np.array_equal(plain[i], fast[i]) for i in plain)
    assert {i: int(c[1].sum()) for i, c in fast.items()} == {i: 16 if i % 2 == 0 else 40 for i, _, _ in images}



def test_fused_on_the_cpu_with_kernels_compiled_for_the_gpu_falls_back_with_a_notice(monkeypatch, capsys):
    """What a GPU machine does with --device cpu --fused: the unfused front end, never a crash."""
    from dmae_fast.kernels import fused_frontend

    monkeypatch.setattr(fused_frontend, "INTERPRETED", False)
    engine, images = _engine(), _images(16, count=2)
    body = FastBody(Smoothing(engine, 0.5, 11, 32), FastPath(fused=True))
    assert not body.options.fused
    assert "compiled for the GPU in this process, not for cpu" in capsys.readouterr().err
    plan = SamplingPlan.predict(n=30)
    plain, fast = _counts(engine, images, plan, 32), _counts(engine, images, plan, 32, body)
    assert all(np.array_equal(plain[i], fast[i]) for i in plain)


def test_non_torch_engines_are_refused():
    class Foreign(Engine):
        spec, device, precision, description = _engine().spec, CPU, "fp32", "onnxruntime on cpu"

    with pytest.raises(UserError, match="needs a PyTorch checkpoint"):
        FastBody(Smoothing(Foreign(), 0.5, 0, 8), FastPath(fused=True))


def _image_folder(tmp_path):
    """Three 16x16 PNGs and their labels file; returns dmae-certify's data arguments."""
    images = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    data = tmp_path / "images"
    data.mkdir()
    from PIL import Image

    for i, image in enumerate(images):
        Image.fromarray((image.permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(data / f"{i}.png")
    (tmp_path / "labels.txt").write_text("".join(f"{i}.png {i}\n" for i in range(3)))
    return ["--data", data, "--seed", "0", "--labels", tmp_path / "labels.txt", "--n0", "10", "--n", "30",
            "--batch", "32", "--quiet", "--device", "cpu", "--workers", "0"]


@cpu_fused
def test_cli_fused_profile_rows_equal_the_plain_run(tmp_path, capsys):
    checkpoint = save_classifier(_engine().model, tmp_path / "model.safetensors")
    common = ["--ckpt", checkpoint] + _image_folder(tmp_path)
    assert main([str(a) for a in common + ["--out", tmp_path / "plain.tsv"]]) == 0
    profile = tmp_path / "profile"
    argv = common + ["--out", tmp_path / "fused.tsv", "--fast-parts", "fused", "--profile", profile]
    assert main([str(a) for a in argv]) == 0
    err = capsys.readouterr().err
    assert "per-stage time" in err and "front end" in err and "counting" in err
    assert (profile / "trace.json").stat().st_size > 0 and (profile / "stages.txt").exists()

    assert rows_without(tmp_path / "plain.tsv") == rows_without(tmp_path / "fused.tsv")
    assert "fused" in (tmp_path / "fused.tsv.json").read_text()


@pytest.fixture(scope="module")
def token_engines(tmp_path_factory):
    """The tiny model's checkpoint and its fp32 token engines: ONNX (~1 s) and .pt2 (~15 s on CPU)."""
    out = tmp_path_factory.mktemp("token-engines")
    checkpoint = save_classifier(_engine().model, out / "tiny.safetensors")
    engines = {}
    for fmt in ("onnx",) if aoti_torch_problem() else ("onnx", "torch"):  # torch 2.11 writes no .pt2
        config = ExportConfig(str(checkpoint), str(out), (fmt,), "fp32", "tokens", parity_samples=64, seed=0,
                              device="cpu")
        [engines[fmt]] = export_engines(config, report=lambda line: None)
    return checkpoint, engines


@pytest.mark.parametrize("fmt", ["onnx", "torch"])
@pytest.mark.parametrize("fused", [pytest.param(True, marks=cpu_fused), False])
def test_token_engine_behind_the_front_end_gives_identical_counts(token_engines, fmt, fused):
    _, engines = token_engines
    if fmt not in engines:
        pytest.skip(str(aoti_torch_problem()))
    engine = open_engine(engines[fmt], EngineOptions(device="cpu", input="tokens"))
    images, plan = _images(16), SamplingPlan.certify(n0=12, n=40)
    body = FastBody(Smoothing(engine, 0.5, 11, 48), FastPath(fused=fused))
    assert body.options.fused == fused and engine.path.name in body.description
    assert body.model.spec.encoder.depth == 0  # the front end read beside the engine, not a checkpoint
    plain = _counts(_engine(), images, plan, 48)
    fast = _counts(engine, images, plan, 48, body)
    assert sum((c > 0).sum() for c in plain.values()) > 15
    assert all(np.array_equal(plain[i], fast[i]) for i in plain)


def test_token_engine_needs_its_front_end_file(token_engines, tmp_path):
    _, engines = token_engines
    copy = tmp_path / engines["onnx"].name
    copy.write_bytes(engines["onnx"].read_bytes())
    (tmp_path / (copy.name + ".json")).write_text(Path(str(engines["onnx"]) + ".json").read_text())
    engine = open_engine(copy, EngineOptions(device="cpu", input="tokens"))
    with pytest.raises(UserError, match="has no front end"):
        FastBody(Smoothing(engine, 0.5, 0, 8), FastPath(fused=True))
    other = engines.get("torch")  # another engine's front end (of the same model); on torch 2.11 a renamed copy's
    if other is None:
        other, copy = copy, copy.rename(tmp_path / f"other-{copy.name}")
        sidecar = json.loads(Path(f"{other}.json").read_text())
        Path(f"{copy}.json").write_text(json.dumps({**sidecar, "file": copy.name}))
        front_end_path(other).write_bytes(front_end_path(engines["onnx"]).read_bytes())
        engine = open_engine(copy, EngineOptions(device="cpu", input="tokens"))
    front_end_path(copy).write_bytes(front_end_path(other).read_bytes())
    with pytest.raises(UserError, match="does not fit"):
        FastBody(Smoothing(engine, 0.5, 0, 8), FastPath(fused=True))


@cpu_fused
def test_cli_fused_token_engine_rows_equal_the_checkpoint_run(token_engines, tmp_path, capsys):
    checkpoint, engines = token_engines
    common = _image_folder(tmp_path)
    assert main([str(a) for a in ["--ckpt", checkpoint, *common, "--out", tmp_path / "plain.tsv"]]) == 0
    argv = ["--engine", engines["onnx"], "--fused", *common, "--out", tmp_path / "tokens.tsv"]
    assert main([str(a) for a in argv]) == 0
    assert rows_without(tmp_path / "plain.tsv") == rows_without(tmp_path / "tokens.tsv")
    assert "fused front end + onnx fp32 engine" in (tmp_path / "tokens.tsv.json").read_text()
    argv = ["--engine", engines["onnx"], *common, "--out", tmp_path / "refused.tsv"]
    assert main([str(a) for a in argv]) == 2  # a token engine needs the fast path's front end
    assert "or --fast-parts fused for a token engine" in capsys.readouterr().err


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("options", [FastPath(cuda_graphs=True), FastPath(fused=True, cuda_graphs=True),
                                     FastPath(fused=True, compile=True, cuda_graphs=True, compile_mode="default")])
def test_cuda_fast_paths_agree_with_the_plain_body(options):
    engine = _engine(device=torch.device("cuda"), precision="fp16")
    images = _images(16, count=6)
    plan = SamplingPlan.certify(n0=50, n=500)
    plain = _counts(engine, images, plan, 256)
    fast = _counts(engine, images, plan, 256, FastBody(Smoothing(engine, 0.5, 11, 256), options))
    total = sum(c.sum() for c in plain.values())
    assert sum(c.sum() for c in fast.values()) == total
    flipped = sum(np.abs(plain[i] - fast[i]).sum() for i in plain) / 2
    assert flipped <= 0.01 * total  # only fp16 rounding may flip votes


@pytest.mark.gpu
@gpu
def test_a_run_with_the_previous_runs_layout_replays_its_captured_graph():
    """A second run on the same body (same slots and phases) keeps the graph and counts from zero;
    a run of another layout captures again. Counts equal a fresh body's each time."""
    engine = _engine(device=torch.device("cuda"))
    body = FastBody(Smoothing(engine, 0.5, 11, 128), FastPath(cuda_graphs=True))
    images, plan = _images(16, count=4), SamplingPlan.certify(n0=50, n=300)
    first = _counts(engine, images, plan, 128, body)
    graph = body._graph
    assert graph is not None
    again = _counts(engine, images, plan, 128, body)
    assert body._graph is graph
    fresh = _counts(engine, images, plan, 128, FastBody(Smoothing(engine, 0.5, 11, 128), FastPath(cuda_graphs=True)))
    assert all(np.array_equal(first[i], again[i]) and np.array_equal(first[i], fresh[i]) for i in first)
    other = SamplingPlan.certify(n0=10, n=40)  # a stage shorter than the batch: more slots
    _counts(engine, images, other, 128, body)
    assert body._graph is not graph


@pytest.mark.gpu
@gpu
def test_fused_front_end_feeds_a_cuda_pt2_token_engine_under_a_cuda_graph(tmp_path):
    """The GPU path of ``ours: fused + .pt2 tokens + CUDA graphs``: AOTInductor under graph capture."""
    checkpoint = save_classifier(_engine().model, tmp_path / "tiny.safetensors")
    config = ExportConfig(str(checkpoint), str(tmp_path), ("torch",), "fp16", "tokens", parity_samples=256, seed=0,
                          device="cuda")
    [path] = export_engines(config, report=lambda line: None)
    engine = open_engine(path, EngineOptions(device="cuda", input="tokens"))
    images, plan = _images(16, count=6), SamplingPlan.certify(n0=50, n=500)
    plain = _counts(_engine(device=torch.device("cuda")), images, plan, 256)
    body = FastBody(Smoothing(engine, 0.5, 11, 256), FastPath(fused=True, cuda_graphs=True))
    assert body.options.cuda_graphs and body.options.fused
    fast = _counts(engine, images, plan, 256, body)
    total = sum(c.sum() for c in plain.values())
    assert sum(c.sum() for c in fast.values()) == total
    assert sum(np.abs(plain[i] - fast[i]).sum() for i in plain) / 2 <= 0.01 * total  # fp16 rounding only


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("options", [FastPath(cuda_graphs=True), FastPath(fused=True, cuda_graphs=True)])
def test_cuda_fast_paths_keep_the_classes_they_count_under_a_graph(options):
    """Kept classes (--keep-votes, incremental runs on votes) under a captured graph: every estimation sample's class,
    their histogram the counts; a run on the same body that keeps none, then one that keeps again, too."""
    from dmae_fast.batching.stream import StreamingCertifier

    engine = _engine(device=torch.device("cuda"))
    smoothing = Smoothing(engine, 0.5, 11, 128)
    body = FastBody(smoothing, options)
    images, plan = _images(16, count=4), SamplingPlan.certify(n0=20, n=300)
    for keep in (300, 0, 300):
        for done in StreamingCertifier(smoothing, plan, body, keep=keep).run(images):
            if keep:
                assert np.array_equal(np.bincount(done.kept, minlength=done.counts.shape[1]), done.counts[1])
            else:
                assert done.kept is None
