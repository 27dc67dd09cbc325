"""``dmae-export --check-agreement`` (issue 59): an engine's certified disagreement with the fp32 PyTorch model on a
dataset's noisy images, recorded in its sidecar; refused in one line where it cannot apply."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import one_line_error, run_command

from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import StreamingCertifier
from dmae_fast.data import demo_digits
from dmae_fast.demo_files import DEMO_CHECKPOINT
from dmae_fast.engines.aoti_engine import aoti_torch_problem
from dmae_fast.engines.opening import EngineOptions, open_engine
from dmae_fast.engines.paired import PairedEngine
from dmae_fast.engines.sidecar import read_sidecar, sidecar_path
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.export.command import main as export_main
from dmae_fast.export.config import ExportConfig
from dmae_fast.export.pipeline import export_engines
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.stats.incremental import disagreement_upper_bounds
from dmae_fast.stats.plan import Phase, SamplingPlan

pytestmark = pytest.mark.usefixtures("two_torch_threads")


def test_the_sidecar_records_the_engines_certified_disagreement_on_the_data(tmp_path):
    config = ExportConfig("demo", str(tmp_path), ("onnx",), "fp16", seed=3, device="cpu", check_agreement="demo",
                          agreement_images=6, agreement_samples=150, sigma=0.5)
    lines: list[str] = []
    [engine_file] = export_engines(config, report=lines.append)
    agreement = read_sidecar(engine_file).agreement
    assert agreement is not None and "disagreement with PyTorch on noisy demo images at sigma 0.5" in lines[0]
    assert (agreement.data, agreement.images, agreement.samples_per_image, agreement.samples) == ("demo", 6, 150, 900)
    assert (agreement.sigma, agreement.seed, agreement.alpha) == (0.5, 3, 0.001)
    assert agreement.zeta_upper == float(disagreement_upper_bounds(agreement.disagreements, 900, 0.001))
    assert json.loads(sidecar_path(engine_file).read_text())["agreement"]["zeta_upper"] == agreement.zeta_upper
    # the same count again, from the recorded seed: the first 6 demo test digits, 150 estimation draws each
    model = load_classifier(DEMO_CHECKPOINT)
    paired = PairedEngine(TorchEngine(model, torch.device("cpu")), open_engine(engine_file, EngineOptions("cpu")))
    test = demo_digits("test")
    images = [(i, test.images[i], int(test.labels[i])) for i in range(6)]
    recount = 0
    for done in StreamingCertifier(Smoothing(paired, 0.5, 3, 256), SamplingPlan((Phase.ESTIMATION,), (150,))).run(
            images):
        table = done.counts[0].reshape(10, 10)
        recount += int(table.sum() - np.trace(table))
    assert recount == agreement.disagreements


@pytest.mark.parametrize(("args", "mentions"), [
    (["--input", "tokens", "--check-agreement", "demo"], ["--check-agreement needs an image engine"]),
    (["--sigma", "0.5"], ["--sigma is the noise of --check-agreement"]),
    (["--check-agreement", "demo", "--agreement-images", "0"], ["--agreement-images must be in [1,"]),
    (["--check-agreement", "demo", "--agreement-samples", "0"], ["--agreement-samples must be in [1,"]),
    (["--check-agreement", "demo", "--sigma", "-1"], ["--sigma: sigma must be"]),
    (["--check-agreement", ""], ["--check-agreement is empty"]),
])
def test_an_agreement_check_that_cannot_apply_is_one_line_and_writes_nothing(tmp_path, capsys, args, mentions):
    out = tmp_path / "engines"
    result = run_command(export_main, capsys, "--ckpt", "demo", "--out", out, *args)
    one_line_error(result, "dmae-export", *mentions)
    assert not out.exists()


def test_a_bad_agreement_dataset_is_refused_before_any_export(tmp_path, capsys):
    out = tmp_path / "engines"
    fmt = "onnx" if aoti_torch_problem() else "torch"  # (torch 2.11 refuses --format torch before the dataset)
    result = run_command(export_main, capsys, "--ckpt", "demo", "--out", out, "--format", fmt,
                         "--check-agreement", tmp_path / "missing")
    one_line_error(result, "dmae-export", "missing")
    assert not out.exists() or not any(out.iterdir())  # no engine compiled, nothing written


def test_an_onnx_agreement_check_without_onnx_runtime_is_refused_before_any_export(tmp_path, monkeypatch):
    import importlib.util

    from dmae_fast.base.errors import UserError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else
                        find_spec(name, *a))
    config = ExportConfig("demo", str(tmp_path), ("onnx",), check_agreement="demo", device="cpu")
    with pytest.raises(UserError, match="--check-agreement runs the ONNX engine, and ONNX Runtime is not installed"):
        export_engines(config, report=lambda line: None)
    assert not any(tmp_path.iterdir())
