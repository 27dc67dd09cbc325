"""Patch-major inputs of the CPU fast path: layout, noise, graph and counts."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import stacked_counts, tiny_vit

from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.cpu.exported import onnx_bytes
from dmae_fast.batching.cpu.runtimes import OrtChunks
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody, SamplingPlan
from dmae_fast.engines.graphs import PatchGraph
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.noise.compiled import COMPILED, REFERENCE, NoiseSource
from dmae_fast.noise.contract import gaussian_noise
from dmae_fast.noise.patch_layout import PatchLayout
from dmae_fast.stats.plan import Phase

CPU = torch.device("cpu")
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


def _model(patch=4, size=16, input_size=None, seed=0) -> SmoothingClassifier:
    return tiny_vit(patch=patch, size=size, input_size=input_size, seed=seed, mean=MEAN, std=STD)


def test_the_layout_is_the_patch_embedding_input_and_the_philox_groups():
    model = _model(patch=8, size=24)
    layout = PatchLayout.of(model)
    assert layout == PatchLayout(3, 24, 8, MEAN, STD) and layout.row_shape == (9, 192)
    images = torch.rand((5, 3, 24, 24))
    with torch.inference_mode():
        want = model.patch_embed(model.preprocess(images))
        got = F.linear(layout.inputs(images), layout.arrange_weight(model.patch_embed.proj.weight),
                       model.patch_embed.proj.bias)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # each group of four values is one Philox counter: flat pixel indices 4k .. 4k+3, k = counters
    flat = layout.arrange(torch.arange(3 * 24 * 24).view(3, 24, 24)).view(9, -1, 4)
    assert torch.equal(flat[..., 0] // 4, layout.counters[0])
    assert torch.equal(flat, flat[..., :1] + torch.arange(4))


@pytest.mark.parametrize("model,why", [
    (_model(patch=2, size=8), "a patch side that is not a multiple of 4"),
    (_model(patch=4, size=16, input_size=8), "a resize before the encoder"),
])
def test_front_ends_that_are_not_a_plain_patch_product_keep_images(model, why):
    assert PatchLayout.of(model) is None, why


@pytest.mark.parametrize("compiled", [True, False])
def test_patch_noise_is_the_contract_noise_arranged_and_normalized(compiled, capsys):
    """The same Gaussians as the image noise, element for element, only stored as patch rows."""
    layout = PatchLayout.of(_model())
    source = NoiseSource(CPU, compiled=compiled, serial=True, layout=layout)
    images = torch.rand((4, 3, 16, 16), generator=torch.Generator().manual_seed(2))
    index = torch.arange(37)
    slot, image, phase, sample = index % 4, index % 5 + 9, torch.full_like(index, int(Phase.ESTIMATION)), index * 3
    with torch.inference_mode():
        got = source(layout.arrange(images), slot, 0.25, 2**40 + 7, image, phase, sample)
    noisy = images[slot] + 0.25 * gaussian_noise(2**40 + 7, image, phase, sample, (3, 16, 16))
    torch.testing.assert_close(got, layout.inputs(noisy), rtol=0, atol=1e-5)
    assert source.implementation == (COMPILED if compiled else REFERENCE) and capsys.readouterr().err == ""


@pytest.mark.parametrize("pooled_tail", [False, True])
def test_the_patch_graph_is_the_classifier(pooled_tail):
    model = _model()
    layout = PatchLayout.of(model)
    noisy = torch.rand((16, 3, 16, 16)) + 0.25 * torch.randn((16, 3, 16, 16))
    with torch.inference_mode():
        want = model(noisy)
        got = PatchGraph(model, layout, pooled_tail).eval()(layout.inputs(noisy))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    exported = OrtChunks(onnx_bytes(model, layout), "test", layout)
    torch.testing.assert_close(exported.logits(layout.inputs(noisy)), want, rtol=0, atol=1e-4)


def _top2_margins(model, items, n0, n, seed):
    """The plain model's smallest gap between its two largest logits over every sample of the run."""
    smallest = float("inf")
    for index, image, _ in items:
        for phase, count in ((Phase.SELECTION, n0), (Phase.ESTIMATION, n)):
            sample = torch.arange(count)
            noise = gaussian_noise(seed, torch.full_like(sample, index), int(phase), sample, tuple(image.shape))
            with torch.inference_mode():
                top = model(image + 0.25 * noise).topk(2).values
            smallest = min(smallest, float((top[:, 0] - top[:, 1]).min()))
    return smallest


@pytest.mark.parametrize("runtime", [pytest.param("openvino", marks=pytest.mark.skipif(
    not HAS_OPENVINO, reason="openvino not installed")), "onnxruntime"])
def test_patch_input_counts_equal_the_plain_body(runtime):
    model = _model(seed=2)
    images = torch.rand((3, 3, 16, 16), generator=torch.Generator().manual_seed(5))
    items = [(i, images[i], 0) for i in range(3)]
    n0, n, seed = 30, 300, 11
    # the two graphs' logits differ by ~2e-7 (float rounding): no vote can flip with these margins
    assert _top2_margins(model, items, n0, n, seed) > 2e-5
    engine, plan = TorchEngine(model, CPU, "fp32"), SamplingPlan.certify(n0, n)
    smoothing = Smoothing(engine, 0.25, seed, 128)
    body = batch_body(smoothing, BodyOptions(fast=True, workers=2, cpu_runtime=runtime))
    assert body.classifier.layout == PatchLayout.of(model) and "patch rows" in body.description
    got = stacked_counts(smoothing, items, plan, body)
    want = stacked_counts(smoothing, items, plan, PlainBody(smoothing))
    assert (want[:, 1].max(1) < n).any()  # some votes are split: the comparison means something
    assert np.array_equal(got, want)
    images_body = batch_body(smoothing, BodyOptions(fast=True, workers=2, cpu_runtime=runtime, patch_input=False))
    assert images_body.classifier.layout is None and "patch rows" not in images_body.description
