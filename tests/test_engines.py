"""Tests for opening engine files (dmae_fast.engines): sidecars, routing, checks, batching.

Engine files here are ONNX exports of small models (about a second each); the
AOTInductor and certification paths are covered in test_export.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import Run, one_line_error, run_command, tiny_checkpoint

from dmae_fast.base.errors import UserError
from dmae_fast.cli.certify import main as certify_main
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.onnx_engine import ORT_MISSING
from dmae_fast.engines.opening import EngineOptions, open_engine
from dmae_fast.engines.sidecar import BatchRange, read_sidecar, sidecar_path
from dmae_fast.engines.tensorrt_engine import TENSORRT_MISSING
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.export import ExportConfig, export_engines
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.model.classifier import SmoothingClassifier

CERTIFY = ["--data", "demo", "--seed", "0", "--max", "2", "--n0", "10", "--n", "50", "--batch", "32", "--quiet"]


pytestmark = pytest.mark.usefixtures("two_torch_threads")


def export_onnx(tmp: Path, ckpt: str, name: str, **options) -> Path:
    config = ExportConfig(ckpt, str(tmp), ("onnx",), name=name, parity_samples=100, seed=0, **options)
    return export_engines(config, report=lambda line: None)[0]


@pytest.fixture(scope="module")
def demo_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(tmp_path_factory.mktemp("demo"), "demo", "demo", batch=BatchRange(3, 4, 5))


@pytest.fixture
def engine_copy(demo_onnx: Path, tmp_path: Path) -> Path:
    """A private copy (engine + sidecar) a test may damage."""
    target = tmp_path / demo_onnx.name
    shutil.copy(demo_onnx, target)
    shutil.copy(sidecar_path(demo_onnx), sidecar_path(target))
    return target


def certify(capsys, *args) -> Run:
    return run_command(certify_main, capsys, *args)


def one_line(result: Run, *mentions: str) -> str:
    return one_line_error(result, "dmae-certify", *mentions)


# --------------------------------------------------------------------------- batch range


@pytest.mark.parametrize("text, expected", [("1:1000:1024", BatchRange(1, 1000, 1024)), ("8", BatchRange(8, 8, 8)),
                                            ("4:4:4", BatchRange(4, 4, 4))])
def test_batch_range_parses(text, expected):
    assert BatchRange.parse(text) == expected
    assert BatchRange.parse(str(expected)) == expected


@pytest.mark.parametrize("text", ["", "1:2", "1:2:3:4", "x", "2:1:3", "1:4:3", "0:0:0", "-1:1:1", "1.5:2:3"])
def test_bad_batch_range_is_a_user_error(text):
    with pytest.raises(UserError):
        BatchRange.parse(text)


# --------------------------------------------------------------------------- the engine interface


def test_onnx_engine_classifies_like_torch_across_the_batch_range(demo_onnx):
    engine = open_engine(demo_onnx, EngineOptions(device="cpu"))
    reference = TorchEngine(load_classifier(DEMO_CHECKPOINT), torch.device("cpu"))
    assert engine.spec == reference.spec and engine.precision == "fp32" and engine.input_shape == (3, 8, 8)
    assert "onnx fp32 engine demo.onnx via ONNX Runtime" in engine.description
    images = torch.rand(12, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    for rows in (1, 2, 3, 5, 12):  # below min (padded), inside, above max (split)
        classes = engine.classify(images[:rows])
        assert classes.dtype == torch.int64 and classes.shape == (rows,)
        assert torch.equal(classes, reference.classify(images[:rows]))
    assert engine.classify(images[:0]).shape == (0,)


def test_wrong_input_shape_is_a_user_error(demo_onnx):
    engine = open_engine(demo_onnx, EngineOptions(device="cpu"))
    with pytest.raises(UserError, match=r"takes image inputs of shape \[B, 3, 8, 8\], got \[2, 3, 16, 16\]"):
        engine.classify(torch.rand(2, 3, 16, 16))
    with pytest.raises(UserError, match="float32"):
        engine.classify(torch.rand(2, 3, 8, 8, dtype=torch.float64))


def test_torch_engine_for_tokens():
    model = load_classifier(DEMO_CHECKPOINT)
    engine = open_engine(DEMO_CHECKPOINT, EngineOptions(device="cpu", input="tokens"))
    images = torch.rand(6, 3, 8, 8)
    with torch.no_grad():
        tokens = model.tokens(images)
    assert engine.input_shape == (17, 64) == tuple(tokens.shape[1:])
    assert torch.equal(engine.classify(tokens), model(images).argmax(1))


# --------------------------------------------------------------------------- what an engine offers


def test_engines_declare_what_they_offer(demo_onnx, tmp_path):
    """Bodies ask an engine what it offers, never its class: a checkpoint its model (and that model
    cast to the engine's precision), an engine file its path and sidecar, a token engine itself as a
    body behind the front end stored beside it; what is not offered is None."""
    checkpoint = open_engine(DEMO_CHECKPOINT, EngineOptions(device="cpu"))
    assert isinstance(checkpoint.model, SmoothingClassifier) and checkpoint.cast_model() is checkpoint.model  # fp32
    assert checkpoint.path is None and checkpoint.meta is None and checkpoint.token_body() is None
    bf16 = TorchEngine(checkpoint.model, torch.device("cpu"), "bf16").cast_model()
    assert bf16 is not checkpoint.model and bf16.head.weight.dtype == torch.bfloat16
    image = open_engine(demo_onnx)
    assert image.model is None and image.cast_model() is None and image.token_body() is None
    assert image.path == demo_onnx and image.meta is not None and image.meta.kind == "onnx"
    tokens = export_onnx(tmp_path, "demo", "demo-tokens", input="tokens")
    engine = open_engine(tokens, EngineOptions(input="tokens"))
    body = engine.token_body()
    assert engine.model is None and body is not None and body.engine is engine
    assert body.file == tokens and body.kind == "onnx" and body.front_end.spec.encoder.depth == 0
    images = torch.rand(4, 3, 8, 8)
    with torch.no_grad():  # the checkpoint's front end
        assert torch.allclose(body.front_end.tokens(images), checkpoint.model.tokens(images), atol=1e-6)


# --------------------------------------------------------------------------- options that cannot apply


def test_engine_options_that_cannot_apply(demo_onnx):
    with pytest.raises(UserError, match="exported in fp32; --precision fp16 cannot change it"):
        open_engine(demo_onnx, EngineOptions(precision="fp16"))
    with pytest.raises(UserError, match="--input-size and --normalize apply to checkpoints"):
        open_engine(demo_onnx, EngineOptions(input_size=8))
    with pytest.raises(UserError, match="image-input engine; export with --input tokens"):
        open_engine(demo_onnx, EngineOptions(input="tokens"))
    assert open_engine(demo_onnx, EngineOptions(precision="fp32")).precision == "fp32"


def test_certify_refuses_token_engines(capsys, tmp_path):
    tokens = export_onnx(tmp_path, "demo", "tok", input="tokens")
    one_line(certify(capsys, *CERTIFY, "--engine", tokens, "--out", tmp_path / "r.tsv"),
             "tokens-input engine", "needs an image engine")
    assert not (tmp_path / "r.tsv").exists()


# --------------------------------------------------------------------------- engine / data mismatch


def test_engine_data_mismatch_is_one_line(capsys, tmp_path):
    wide = export_onnx(tmp_path, str(tiny_checkpoint(tmp_path / "wide.safetensors", input_size=16)), "wide")
    one_line(certify(capsys, *CERTIFY, "--engine", wide, "--out", tmp_path / "a.tsv"),
             "shape (3, 8, 8)", "expects (3, 16, 16)")
    few = export_onnx(tmp_path, str(tiny_checkpoint(tmp_path / "few.safetensors", classes=5)), "few")
    one_line(certify(capsys, *CERTIFY, "--engine", few, "--out", tmp_path / "b.tsv"), "10 classes", "has 5")
    assert not list(tmp_path.glob("*.tsv"))


# --------------------------------------------------------------------------- sidecars


def _edit(engine: Path, change) -> None:
    path = sidecar_path(engine)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change, mentions", [
    (lambda d: d.update(format="something/2"), ["not a dmae-fast engine sidecar"]),
    (lambda d: d.pop("input_shape"), ["missing field(s) input_shape"]),
    (lambda d: d.update(input_shape=[3, 16, 16]), ["input_shape [3, 16, 16] does not match"]),
    (lambda d: d.update(num_classes=7), ["num_classes 7 differs"]),
    (lambda d: d.update(patch_size=16), ["patch_size 16 differs"]),
    (lambda d: d.update(precision="int8"), ["precision 'int8'"]),
    (lambda d: d.update(batch={"min": 4, "opt": 2, "max": 8}), ["min <= opt <= max"]),
    (lambda d: d.update(batch=[1, 2]), ["malformed field"]),
    (lambda d: d["classifier"].pop("encoder"), ["malformed field"]),
    (lambda d: d.update(file="other.onnx"), ["describes 'other.onnx'"]),
    (lambda d: d.update(kind="aoti"), ["says kind 'aoti'"]),
    (lambda d: d.update(input_name="x"), ["input_name 'x' should be 'images'"]),
    # sigma is validated like --sigma, wherever it comes from (was: 0 ran, others wrote bad rows)
    (lambda d: (d.update(sigma=0.0), d["classifier"].update(sigma=0.0)), ["sigma must be"]),
    (lambda d: (d.update(sigma=-1.0), d["classifier"].update(sigma=-1.0)), ["sigma must be"]),
    (lambda d: (d.update(sigma=1e308), d["classifier"].update(sigma=1e308)), ["sigma must be"]),
    (lambda d: d.update(sigma=float("nan")), ["sigma nan differs"]),
    (lambda d: d["classifier"].update(class_names=["zero", "one"]), ["2 class_names for 10 classes"]),
    (lambda d: d["classifier"]["encoder"].update(num_heads=0), ["num_heads"]),
    (lambda d: d["classifier"]["encoder"].update(patch_size=0), ["patch_size"]),
    (lambda d: d["classifier"].update(std=[0.2, 0.2, float("inf")]), ["normalization"]),
    (lambda d: d.update(classifier=[]), ["malformed field"]),
])
def test_malformed_sidecar_is_one_line(capsys, engine_copy, change, mentions):
    _edit(engine_copy, change)
    one_line(certify(capsys, *CERTIFY, "--engine", engine_copy, "--out", engine_copy.parent / "r.tsv"),
             "sidecar", *mentions)


def test_sidecar_missing_or_not_json(capsys, engine_copy):
    sidecar = sidecar_path(engine_copy)
    sidecar.write_text("{not json")
    one_line(certify(capsys, *CERTIFY, "--engine", engine_copy), "is not valid JSON")
    sidecar.unlink()
    one_line(certify(capsys, *CERTIFY, "--engine", engine_copy), "has no sidecar demo.onnx.json")


def test_missing_engine_file(capsys, tmp_path):
    one_line(certify(capsys, *CERTIFY, "--engine", tmp_path / "none.onnx"), "none.onnx does not exist")


def test_sidecar_of_another_engine_is_detected(tmp_path, demo_onnx):
    """A sidecar copied onto another engine: the facts embedded in the file disagree."""
    other = export_onnx(tmp_path, str(tiny_checkpoint(tmp_path / "t.safetensors", classes=10)), "other",
                        precision="fp16")
    _edit(other, lambda d: d.update(json.loads(sidecar_path(demo_onnx).read_text()), file="other.onnx",
                                    sha256=None))  # no file hash (an older sidecar): the embedded facts decide
    with pytest.raises(UserError, match="its sidecar disagree .*precision fp16 vs fp32"):
        open_engine(other, EngineOptions(device="cpu"))


def test_corrupt_engine_file_is_one_line(capsys, engine_copy):
    engine_copy.write_bytes(b"not an onnx model")
    one_line(certify(capsys, *CERTIFY, "--engine", engine_copy), "SHA-256 differs")
    _edit(engine_copy, lambda d: d.update(sha256=None))  # a sidecar without the hash: the runtime refuses the file
    one_line(certify(capsys, *CERTIFY, "--engine", engine_copy), "ONNX Runtime cannot load")


# --------------------------------------------------------------------------- runtimes that are missing


def test_onnxruntime_missing_is_one_line(capsys, demo_onnx, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    line = one_line(certify(capsys, *CERTIFY, "--engine", demo_onnx))
    assert line == f"dmae-certify: error: {ORT_MISSING}"


def test_tensorrt_missing_is_one_line(capsys, engine_copy, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    for suffix in (".engine", ".plan"):
        plan = engine_copy.with_suffix(suffix)
        shutil.copy(engine_copy, plan)
        sidecar_path(plan).write_text(sidecar_path(engine_copy).read_text())
        _edit(plan, lambda d: d.update(kind="tensorrt", file=plan.name))
        assert read_sidecar(plan).kind == "tensorrt"
        line = one_line(certify(capsys, *CERTIFY, "--engine", plan))
        assert line == f"dmae-certify: error: {TENSORRT_MISSING}"


def test_fp32_convolutions_are_made_ieee_for_cuda_and_torch_export_still_works():
    """cuDNN's default TF32 would make "fp32" on a GPU differ from fp32 on the CPU; the setting must
    leave torch.export working (the per-operator API made it raise on torch 2.11)."""
    from dmae_fast.engines.torch_engine import ieee_fp32_convolutions

    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        ieee_fp32_convolutions()
        assert torch._C._get_cudnn_allow_tf32() is False
        conv = torch.nn.Conv2d(3, 4, 2)
        exported = torch.export.export(conv, (torch.rand(1, 3, 4, 4),))
        x = torch.rand(1, 3, 4, 4)
        torch.testing.assert_close(exported.module()(x), conv(x))
    finally:
        torch.backends.cudnn.allow_tf32 = before
