"""The streaming certifier: full batches, device-side counts, identical to the reference loop."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import random_images, stream, stream_counts

from dmae_fast.base.errors import UserError
from dmae_fast.batching.smooth import Smooth
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody, SamplingPlan, StreamingCertifier
from dmae_fast.engines.base import Engine
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.noise.compiled import COMPILED, REFERENCE, NoiseSource
from dmae_fast.noise.contract import gaussian_noise
from dmae_fast.noise.sound_options import Sound
from dmae_fast.stats.plan import Phase

SHAPE = (3, 8, 8)


class SpyEngine(Engine):
    """Wraps an engine and records every batch it is given."""

    def __init__(self, engine):
        self.engine, self.spec, self.device = engine, engine.spec, engine.device
        self.precision, self.description = engine.precision, "spy"
        self.batches = []

    def classify(self, images):
        self.batches.append(images.clone())
        return self.engine.classify(images)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def images():
    return random_images(7, size=8, step=3, first=1)


def _counts(engine, images, plan, batch, sigma=0.5, seed=123):
    out = stream(Smoothing(engine, sigma, seed, batch), images, plan)
    assert [o.index for o in out] == [i for i, _, _ in images]
    assert [o.label for o in out] == [label for _, _, label in images]
    return np.stack([o.counts for o in out])


def test_identical_counts_for_batch_sizes_7_64_1000(engine, images):
    plan = SamplingPlan.certify(n0=100, n=250)
    reference = _counts(engine, images, plan, 7)
    assert reference[:, 0].sum(1).tolist() == [100] * 7 and reference[:, 1].sum(1).tolist() == [250] * 7
    assert (reference > 0).sum() > 20  # a random model spreads votes: the comparison means something
    for batch in (64, 1000):
        assert np.array_equal(_counts(engine, images, plan, batch), reference)


def test_counts_equal_the_one_image_at_a_time_reference(engine, images):
    plan = SamplingPlan.certify(n0=30, n=90)
    streamed = _counts(engine, images, plan, 64, seed=9)
    smooth = Smooth(engine, sigma=0.5, seed=9, batch_size=25)
    for row, (index, image, _) in zip(streamed, images):
        assert np.array_equal(row[0], smooth.sample_counts(image, index, Phase.SELECTION, 30))
        assert np.array_equal(row[1], smooth.sample_counts(image, index, Phase.ESTIMATION, 90))


def test_batches_are_full_and_mix_images(engine, images):
    spy = SpyEngine(engine)
    plan = SamplingPlan.certify(n0=10, n=23)  # 33 samples per image, batch 50
    _counts(spy, images, plan, 50)
    sizes = [len(b) for b in spy.batches]
    assert sizes == [50] * (len(sizes) - 1) + [7 * 33 - 50 * (len(sizes) - 1)]


@pytest.mark.parametrize("compiled", [False, True], ids=["reference noise", "compiled noise"])
def test_noise_is_added_in_pixel_space_to_the_clean_image(engine, images, compiled):
    """What the classifier receives is x + sigma * eta(seed, image, phase, sample): exactly with
    the torch-op reference, to float32 rounding with the compiled kernel (the default)."""
    spy = SpyEngine(engine)
    plan = SamplingPlan.certify(n0=3, n=4)
    body = PlainBody(Smoothing(spy, 0.25, 77, 5), NoiseSource(engine.device, compiled=compiled))
    stream(Smoothing(spy, 0.25, 77, 5), images[:2], plan, body)
    assert body.noise.implementation == (COMPILED if compiled else REFERENCE)
    received = torch.cat(spy.batches)
    expected = []
    for index, image, _ in images[:2]:
        for phase, count in zip(plan.phases, plan.sizes):
            eta = gaussian_noise(77, torch.full((count,), index), int(phase), torch.arange(count), SHAPE)
            expected.append(image + 0.25 * eta)
    if compiled:
        torch.testing.assert_close(received, torch.cat(expected), rtol=0, atol=2e-6)
    else:
        assert torch.equal(received, torch.cat(expected))


def test_many_small_images_per_batch_reuse_slots_correctly(engine, images):
    plan = SamplingPlan.certify(n0=1, n=2)
    many = images * 5
    many = [(i, image, label) for i, (_, image, label) in enumerate(many)]
    reference = _counts(engine, many, plan, 1)
    assert np.array_equal(_counts(engine, many, plan, 16), reference)


def test_predict_plan(engine, images):
    plan = SamplingPlan.predict(n=40)
    counts = _counts(engine, images, plan, 16)
    smooth = Smooth(engine, sigma=0.5, seed=123, batch_size=40)
    assert np.array_equal(counts[2, 0], smooth.sample_counts(images[2][1], images[2][0], Phase.PREDICTION, 40))


def test_bad_images_are_refused(engine):
    plan = SamplingPlan.certify(2, 2)
    bad = torch.rand(SHAPE)
    bad[1, 2, 3] = float("nan")
    with pytest.raises(UserError, match="image 4 contains NaN"):
        stream(Smoothing(engine, 0.5, 0, 8), [(4, bad, 0)], plan)
    with pytest.raises(UserError, match="shape"):
        stream(Smoothing(engine, 0.5, 0, 8), [(0, torch.rand(3, 16, 16), 0)], plan)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
def test_cuda_noise_and_counts_agree_with_cpu(engine, images):
    from dmae_fast.noise.contract import uint32_stream

    cuda = torch.device("cuda")
    coords = (torch.tensor([0, 7, 2**31]), 1, torch.tensor([0, 5, 2**32 - 1]))
    on_gpu = uint32_stream(5, coords[0].to(cuda), coords[1], coords[2].to(cuda), 3 * 224 * 224)
    assert torch.equal(on_gpu.cpu(), uint32_stream(5, *coords, 3 * 224 * 224))
    torch.testing.assert_close(gaussian_noise(5, coords[0].to(cuda), 1, coords[2].to(cuda), SHAPE).cpu(),
                               gaussian_noise(5, *coords, SHAPE), rtol=1e-5, atol=1e-5)
    plan = SamplingPlan.certify(n0=50, n=500)
    cuda_engine = TorchEngine(SmoothingClassifier(engine.spec).eval(), cuda)
    cuda_engine.model.load_state_dict(engine.model.state_dict())
    on_cpu = _counts(engine, images, plan, 256)
    on_cuda = _counts(cuda_engine, images, plan, 256)
    assert on_cuda.sum() == on_cpu.sum()
    assert np.abs(on_cuda - on_cpu).sum() / 2 <= 0.01 * on_cpu.sum()  # only rounding may flip votes


def test_sequential_plan_stops_early_with_prefix_counts_and_full_batches(engine, images):
    """Images stop at different looks; their counts are the prefix of the fixed-n samples."""
    looks = (20, 50, 120)
    plan = SamplingPlan.sequential(n0=10, estimation_looks=looks)
    many = [(100 + i, image, label) for i, (_, image, label) in enumerate(images * 4)]
    stop_at = {index: (index * 7) % 3 for index, _, _ in many}  # the look each image stops at
    calls = []

    def decide(index, counts, look):
        assert counts[0].sum() == 10 and counts[1].sum() == looks[look]
        calls.append((index, look))
        return look >= stop_at[index]

    results = {}
    for batch in (7, 64):
        spy, exhausted_at = SpyEngine(engine), []

        def source():
            yield from many
            exhausted_at.append(len(spy.batches))  # index of the batch being built

        calls.clear()
        results[batch] = stream_counts(Smoothing(spy, 0.5, 5, batch), source(), plan, decide=decide)
        sizes = [len(b) for b in spy.batches]
        assert all(size == batch for size in sizes[: exhausted_at[0]])  # full until the tail
        assert sum(sizes) == sum(10 + looks[stop_at[i]] for i, _, _ in many)
        assert sorted(calls) == sorted((i, k) for i, at in stop_at.items() for k in range(min(at + 1, 2)))
    assert results[7].keys() == results[64].keys() == set(stop_at)
    smooth = Smooth(engine, sigma=0.5, seed=5, batch_size=33)
    for index, image, _ in many[:9]:
        n = looks[stop_at[index]]
        assert np.array_equal(results[7][index][1], smooth.sample_counts(image, index, Phase.ESTIMATION, n))
        assert np.array_equal(results[7][index][0], smooth.sample_counts(image, index, Phase.SELECTION, 10))
    assert all(np.array_equal(results[64][i], results[7][i]) for i in results[7])


def test_sequential_plan_needs_a_decision_rule(engine, images):
    with pytest.raises(ValueError, match="decide"):
        stream(Smoothing(engine, 0.5, 0, 8), images, SamplingPlan.sequential(5, (5, 10)))


def test_a_body_built_for_another_smoothing_is_refused(engine):
    """The streamer checks images against its smoothing (grid, shape) and the body draws the noise of its own: a
    body built for another sigma, seed, batch size or grid would count other samples than the streamer claims."""
    smoothing = Smoothing(engine, 0.5, 0, 8)
    StreamingCertifier(smoothing, SamplingPlan.certify(2, 4), PlainBody(Smoothing(engine, 0.5, 0, 8)))  # equal: fine
    for other in (replace(smoothing, sigma=0.25), replace(smoothing, seed=1), replace(smoothing, sound=Sound(16))):
        with pytest.raises(ValueError, match="another smoothing"):
            StreamingCertifier(smoothing, SamplingPlan.certify(2, 4), PlainBody(other))


def test_images_with_their_own_plans_count_as_if_run_alone_and_come_in_input_order(engine, images):
    """Per-image plans (incremental CERTIFY's): an image without a plan draws nothing and comes, with no counts,
    after the images before it; one with its own plan counts exactly what a run of that plan alone counts."""
    smoothing, usual, own = Smoothing(engine, 0.5, 9, 64), SamplingPlan.certify(10, 90), SamplingPlan.predict(150)
    indices = [index for index, _, _ in images]
    plans = {indices[1]: None, indices[2]: own, indices[4]: None}
    out = list(StreamingCertifier(smoothing, usual, plans=plans).run(images))
    assert [done.index for done in out] == indices
    alone = {plan: stream_counts(smoothing, images, plan) for plan in (usual, own)}
    for done in out:
        plan = plans.get(done.index, usual)
        if plan is None:
            assert done.counts.shape == (0, engine.spec.num_classes)
        else:
            assert np.array_equal(done.counts, alone[plan][done.index])


def _kept(engine, images, plan, batch, keep, seed=31, sigma=0.5):
    smoothing = Smoothing(engine, sigma, seed, batch)
    body = PlainBody(smoothing, NoiseSource(engine.device, compiled=False))
    return {done.index: done for done in StreamingCertifier(smoothing, plan, body, keep=keep).run(images)}


def test_kept_classes_are_those_of_the_first_estimation_samples_for_any_batch(engine, images):
    """A run that keeps classes yields each image's class of x + sigma * eta(seed, image, ESTIMATION, s) for its
    first samples s (never a selection row's), in sample order, and the same counts as a run that keeps none."""
    plan = SamplingPlan.certify(n0=5, n=40)
    expected = {}
    for index, image, _ in images:
        eta = gaussian_noise(31, torch.full((25,), index), int(Phase.ESTIMATION), torch.arange(25), SHAPE)
        expected[index] = engine.classify(image + 0.5 * eta).numpy()
    assert len(np.unique(np.concatenate(list(expected.values())))) > 2  # classes spread: the comparison means something
    for batch in (7, 64):
        kept = _kept(engine, images, plan, batch, keep=25)
        for index, done in kept.items():
            assert np.array_equal(done.kept, expected[index])
            assert np.array_equal(done.counts, _counts(engine, [i for i in images if i[0] == index], plan, batch,
                                                       seed=31)[0])


def test_kept_classes_stop_at_the_estimation_samples_drawn_and_need_a_body_that_keeps(engine, images):
    assert [len(done.kept) for done in _kept(engine, images[:2], SamplingPlan.certify(3, 10), 8, keep=50).values()] \
        == [10, 10]
    assert [len(done.kept) for done in _kept(engine, images[:2], SamplingPlan.predict(10), 8, keep=5).values()] \
        == [0, 0]

    class NoKeeping(PlainBody):
        keep_classes = None

    smoothing = Smoothing(engine, 0.5, 1, 8)
    with pytest.raises(ValueError, match="does not keep"):
        list(StreamingCertifier(smoothing, SamplingPlan.certify(3, 10), NoKeeping(smoothing), keep=5).run(images))
    with pytest.raises(ValueError, match="without looks"):
        StreamingCertifier(smoothing, SamplingPlan.sequential(3, (10, 20)), keep=5)


def test_keep_class_writes_only_the_first_estimation_samples():
    from dmae_fast.batching.job import keep_class, zero_kept

    kept = zero_kept(2, 3, torch.device("cpu"))
    phases = torch.tensor([int(Phase.SELECTION), int(Phase.ESTIMATION), int(Phase.PREDICTION), int(Phase.ESTIMATION),
                           int(Phase.ESTIMATION)])
    slots, samples = torch.tensor([0, 1, 1, 1, 0]), torch.tensor([0, 2, 1, 3, 1])
    keep_class(kept, slots, phases, samples, torch.tensor([4, 5, 6, 7, 8]))
    assert kept[:, :3].tolist() == [[0, 9, 0], [0, 0, 6]]  # class + 1; 0: not written


@pytest.mark.parametrize("kind", ["CPU fast", "fast"])
def test_the_fast_bodies_keep_the_classes_they_count(engine, images, kind):
    """Each fast body keeps the class of each first estimation sample that it counts (all of them here: their
    histogram is the estimation counts), the plain body's classes up to the classifier's rounding."""
    from dmae_fast.batching.cpu.body import CpuFastBody
    from dmae_fast.batching.cpu.runtimes import TorchChunks
    from dmae_fast.batching.fast_body import FastBody, FastPath

    plan, smoothing = SamplingPlan.certify(n0=7, n=60), Smoothing(engine, 0.5, 31, 32)
    noise = NoiseSource(engine.device, compiled=False)
    body = CpuFastBody(TorchChunks(engine.model, "fp32"), smoothing, 2, 8, noise) if kind == "CPU fast" else \
        FastBody(smoothing, FastPath(), noise=noise)
    kept = {done.index: done for done in StreamingCertifier(smoothing, plan, body, keep=60).run(images)}
    plain = _kept(engine, images, plan, 32, keep=60)
    for index, done in kept.items():
        assert np.array_equal(np.bincount(done.kept, minlength=done.counts.shape[1]), done.counts[1])
        assert np.mean(done.kept == plain[index].kept) >= 0.95
