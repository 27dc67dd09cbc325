"""CPU speed without changing results: compiled noise (the contract, fused), the chunked CPU body,
``dmae-certify --fast`` on a CPU, and ``dmae-bench cpu``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from helpers import rows_without, stacked_counts, tiny_vit

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.cpu import exported as cpu_graphs
from dmae_fast.batching.cpu import runtimes as cpu_runtimes
from dmae_fast.batching.cpu.body import (
    CpuFastBody,
    chunk_rows,
    chunk_sizes,
    even_parts,
)
from dmae_fast.batching.cpu.exported import onnx_bytes
from dmae_fast.batching.cpu.runtimes import (
    OpenVinoChunks,
    OrtChunks,
    TorchChunks,
    cpu_classifier,
)
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody, SamplingPlan
from dmae_fast.cli.certify import main as certify_main
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.model.config import ClassifierSpec, EncoderConfig
from dmae_fast.noise.compiled import COMPILED, REFERENCE, NoiseSource
from dmae_fast.noise.contract import MASK32, gaussian_noise, key_words, philox4x32

CPU = torch.device("cpu")
SEEDS = (0, 2**40 + 12345, 2**64 - 1)
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None  # in .[dev]; optional otherwise
needs_openvino = pytest.mark.skipif(not HAS_OPENVINO, reason="openvino not installed")


def _rows(indices, images=5):
    index = torch.as_tensor(indices)
    return index % images, index % 7 + 3, torch.ones_like(index), index * 31


# --------------------------------------------------------------------------- compiled noise


@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_philox_words_are_the_contract_bit_for_bit(seed):
    """The compiled program computes the same uint32 words as the torch-op reference."""
    generator = torch.Generator().manual_seed(seed % 1000)
    counter = tuple(torch.randint(0, 2**32, (257,), generator=generator, dtype=torch.int64) for _ in range(4))
    counter = tuple(torch.cat((c, torch.tensor([0, MASK32]))) for c in counter)  # the extremes too
    key = torch.tensor(key_words(seed))
    compiled = torch.compile(philox4x32, dynamic=False)((*counter,), (key[0], key[1]))
    eager = philox4x32(counter, seed)
    for got, want in zip(compiled, eager):
        assert torch.equal(got, want)


@pytest.mark.parametrize("shape", [(3, 8, 8), (1, 3, 3), (3, 5, 7), (2, 11)])
@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_noise_equals_the_reference_to_float32_rounding(shape, seed):
    source = NoiseSource(CPU)
    clean = torch.rand((5, *shape), generator=torch.Generator().manual_seed(3))
    slot, image, phase, sample = _rows(range(40))
    got = source(clean, slot, 0.5, seed, image, phase, sample)
    want = clean[slot] + 0.5 * gaussian_noise(seed, image, phase, sample, shape)
    assert source.implementation == COMPILED
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)  # |eta| < 6: a few float32 ulps


@pytest.mark.parametrize("sigma", [1e-3, 0.12, 1.0, 50.0])
def test_the_first_batch_check_accepts_the_compiled_kernel_at_any_sigma(sigma, capsys):
    """The check against the reference allows for float32 rounding at small and large sigma."""
    source = NoiseSource(CPU)
    clean = 4 * torch.rand((5, 3, 6, 6), generator=torch.Generator().manual_seed(4))  # pixels up to 4
    source(clean, *_rows(range(64))[:1], sigma, 9, *_rows(range(64))[1:])
    assert source.implementation == COMPILED and capsys.readouterr().err == ""


def test_compiled_noise_does_not_depend_on_the_packing_of_rows():
    """A row's noise is bit for bit the same whatever batch it is computed in (the contract's
    reproducibility across batch sizes), single rows included."""
    source, shape = NoiseSource(CPU), (3, 5, 7)
    clean = torch.zeros((5, *shape))
    whole = source(clean, *_rows(range(37))[:1], 1.0, 7, *_rows(range(37))[1:])
    for size in (1, 2, 5, 16, 17):
        parts = [source(clean, *_rows(range(s, min(37, s + size)))[:1], 1.0, 7, *_rows(range(s, min(37, s + size)))[1:])
                 for s in range(0, 37, size)]
        assert torch.equal(torch.cat(parts), whole), size


def test_rows_cut_from_a_batch_at_any_offset_reuse_the_compiled_kernel():
    """Chunks are views at storage offsets 0, 1, 2, ...: Dynamo must not recompile (an unchecked
    kernel) for them, whichever offset the first call had."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    source, clean = NoiseSource(CPU), torch.rand((5, 1, 8, 8))
    slot, image, phase, sample = _rows(range(40))
    for start, stop in ((5, 21), (0, 16), (1, 9), (20, 40), (3, 4)):
        got = source(clean, slot[start:stop], 0.5, 7, image[start:stop], phase[start:stop], sample[start:stop])
        want = clean[slot[start:stop]] + 0.5 * gaussian_noise(7, image[start:stop], phase[start:stop],
                                                              sample[start:stop], (1, 8, 8))
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    assert source.implementation == COMPILED and counters["stats"]["unique_graphs"] == 1


def test_one_kernel_serves_every_slot_count_a_lone_slot_included():
    """The clean images' slot axis is dynamic: a recompiled kernel would run unchecked."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    source = NoiseSource(CPU)
    for slots in (3, 1, 7):
        clean = torch.rand((slots, 3, 4, 4))
        rows = _rows(range(10), images=slots)
        want = clean[rows[0]] + 0.5 * gaussian_noise(9, *rows[1:], (3, 4, 4))
        assert torch.allclose(source(clean, rows[0], 0.5, 9, *rows[1:]), want, rtol=0, atol=1e-5)
    assert source.implementation == COMPILED
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["recompiles"])


def test_failing_compiler_falls_back_to_the_reference_with_one_notice(capsys):
    source = NoiseSource(CPU)

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nsecond line")

    source._compiled = broken
    clean, rows = torch.rand((5, 3, 4, 4)), _rows(range(9))
    first = source(clean, rows[0], 0.25, 11, *rows[1:])
    second = source(clean, rows[0], 0.25, 11, *rows[1:])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compiled noise unavailable" in err[0] and "no C++ compiler found" in err[0]
    assert source.implementation == REFERENCE
    want = clean[rows[0]] + 0.25 * gaussian_noise(11, rows[1], rows[2], rows[3], (3, 4, 4))
    assert torch.equal(first, want) and torch.equal(second, want)


def test_a_miscompiled_kernel_is_never_used(capsys):
    """A compiled kernel that does not reproduce the reference on its first batch is dropped."""
    source = NoiseSource(CPU)
    source._compiled = lambda clean, slot, sigma, key, image, phase, sample: clean[slot] + 1.0  # wrong noise
    clean, rows = torch.rand((5, 3, 4, 4)), _rows(range(9))
    got = source(clean, rows[0], 0.25, 11, *rows[1:])
    assert "does not reproduce the reference" in capsys.readouterr().err
    assert source.implementation == REFERENCE
    assert torch.equal(got, clean[rows[0]] + 0.25 * gaussian_noise(11, rows[1], rows[2], rows[3], (3, 4, 4)))


def test_serial_noise_from_several_threads_at_once_is_the_contract():
    """The CPU fast path's kernel (one thread, GIL released) run by four threads at once on
    chunks gives bit for bit what one call on all rows gives, and the reference to rounding."""
    source, shape = NoiseSource(CPU, serial=True), (3, 6, 6)
    clean = torch.rand((5, *shape), generator=torch.Generator().manual_seed(8))
    slot, image, phase, sample = _rows(range(203))
    whole = source(clean, slot, 0.5, 13, image, phase, sample)
    assert source.implementation == COMPILED
    chunks = list(zip(*(column.tensor_split(24) for column in (slot, image, phase, sample))))
    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(lambda rows: source(clean, rows[0], 0.5, 13, *rows[1:]), chunks * 3))
    assert all(torch.equal(torch.cat(parts[i:i + 24]), whole) for i in (0, 24, 48))
    torch.testing.assert_close(whole, clean[slot] + 0.5 * gaussian_noise(13, image, phase, sample, shape),
                               rtol=0, atol=2e-6)


def test_on_an_old_torch_the_main_thread_traces_first_once(monkeypatch):
    """torch 2.11 segfaults in any trace made after the thread of the process's first trace has ended. Told the
    torch is affected, a compiled NoiseSource made on the main thread first traces there (the eager backend), once;
    made in a worker thread, it leaves the order alone (only the main thread outlives every compile)."""
    from dmae_fast.noise import compiled

    made: list[str] = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: made.append(k.get("backend", "inductor")) or real(*a, **k))
    monkeypatch.setattr(compiled, "FIRST_TRACE_FIXED", "99.0")  # this torch, as if it were 2.11
    monkeypatch.setattr(compiled, "_main_traced", threading.Event())
    worker = threading.Thread(target=lambda: NoiseSource(CPU))
    worker.start()
    worker.join()
    assert made == ["inductor"]
    NoiseSource(CPU)
    NoiseSource(CPU, serial=True)
    assert made == ["inductor", "eager", "inductor", "inductor"]
    NoiseSource(CPU, compiled=False)  # nothing compiled, nothing traced
    assert made == ["inductor", "eager", "inductor", "inductor"]


def test_a_first_trace_that_cannot_be_made_is_left_out(monkeypatch):
    """Where Dynamo cannot trace at all (a Python it does not support), the main thread's first trace is skipped."""
    from dmae_fast.noise import compiled

    real = torch.compile

    def no_dynamo(*args, **kwargs):
        if kwargs.get("backend") == "eager":
            raise RuntimeError("Dynamo is not supported on this Python")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", no_dynamo)
    monkeypatch.setattr(compiled, "FIRST_TRACE_FIXED", "99.0")
    monkeypatch.setattr(compiled, "_main_traced", threading.Event())
    assert NoiseSource(CPU).implementation == COMPILED and compiled._main_traced.is_set()


AFTER_A_WORKER_COMPILED = """
import sys, threading
import torch
from dmae_fast.noise.compiled import NoiseSource

source = NoiseSource(torch.device("cpu"))  # on the main thread, as a run or a server builds it
rows = torch.arange(4)
compile_in = lambda: source(torch.rand(2, 3, 4, 4), rows % 2, 0.25, 7, rows, rows, rows)
worker = threading.Thread(target=compile_in)
worker.start()
worker.join()  # the thread of the first compile (the noise's) has ended
assert source.implementation == "compiled"
other = threading.Thread(target=lambda: torch.compile(lambda x: x * 2, dynamic=False)(torch.ones(3)))
other.start()
other.join()
print(torch.compile(lambda x: x - 1, dynamic=False)(torch.ones(2)).tolist())
"""


@pytest.mark.skipif(torch.__version__ >= "2.12", reason="torch >= 2.12 does not crash here")
def test_compiling_after_the_first_compiles_thread_ended_does_not_crash():
    """torch 2.11 (the GPU machines'): a compile after the first compile's thread ended was a segmentation fault."""
    done = subprocess.run([sys.executable, "-c", AFTER_A_WORKER_COMPILED], capture_output=True, text=True,
                          timeout=600)
    assert (done.returncode, done.stdout) == (0, "[0.0, 0.0]\n"), done.stderr[-2000:]


def test_threads_marking_new_shared_slots_at_once_take_turns(monkeypatch):
    """A body's slots are a new tensor after each allocate, first noised by several threads at once: Dynamo's
    mark_dynamic, which sets two attributes one after the other, must never run on two threads together (on a
    loaded CI machine it broke the slots mid-run). The marker here is slow, so overlapping calls would show."""
    source, shape = NoiseSource(CPU, serial=True), (3, 6, 6)
    slot, image, phase, sample = _rows(range(40))
    first = source(torch.rand((5, *shape)), slot, 0.5, 13, image, phase, sample)  # compiles and checks
    assert source.implementation == COMPILED and len(first) == 40
    clean = torch.rand((5, *shape), generator=torch.Generator().manual_seed(3))  # the run's slots, after the trial's
    inside, most, lock, mark = [0], [0], threading.Lock(), torch._dynamo.mark_dynamic

    def slow_mark(tensor, index, **options):
        if tensor is not clean:  # a call's own fresh row columns
            return mark(tensor, index, **options)
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        mark(tensor, index, **options)
        with lock:
            inside[0] -= 1
    monkeypatch.setattr(torch._dynamo, "mark_dynamic", slow_mark)
    chunks = list(zip(*(column.tensor_split(4) for column in (slot, image, phase, sample))))
    start = threading.Barrier(4)

    def noise(rows):
        start.wait()
        return source(clean, rows[0], 0.5, 13, *rows[1:])
    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(noise, chunks))
    assert most[0] == 1
    torch.testing.assert_close(torch.cat(parts), clean[slot] + 0.5 * gaussian_noise(13, image, phase, sample, shape),
                               rtol=0, atol=2e-6)


def test_reference_noise_is_available_on_request():
    assert NoiseSource(CPU, compiled=False).implementation == REFERENCE


# --------------------------------------------------------------------------- the chunked CPU body


@pytest.fixture(scope="module")
def demo():
    model = load_classifier(DEMO_CHECKPOINT).eval()
    digits = demo_digits("test")
    return model, [(i, digits[i][0], digits[i][1]) for i in (0, 7, 21, 40)]


def _counts(engine, body, items, n0=40, n=460, batch=300):
    return stacked_counts(Smoothing(engine, 0.25, 5, batch), items, SamplingPlan.certify(n0, n), body)


def _plain(engine, batch=300):
    return PlainBody(Smoothing(engine, 0.25, 5, batch))


@pytest.fixture(scope="module")
def plain_counts(demo):
    """What every CPU body must count: the plain body's counts of the demo digits at ``_counts``' defaults,
    and of the first two at n0 10, n 90 (one body: its noise is compiled once)."""
    model, items = demo
    engine = TorchEngine(model, CPU, "fp32")
    plain = _plain(engine)
    return _counts(engine, plain, items), _counts(engine, plain, items[:2], n0=10, n=90)


@pytest.mark.parametrize("runtime", [pytest.param("openvino", marks=needs_openvino), "onnxruntime", "torch"])
def test_cpu_body_counts_equal_the_plain_body(demo, plain_counts, runtime):
    model, items = demo
    engine = TorchEngine(model, CPU, "fp32")
    classifier = cpu_classifier(engine, "fp32", 0.25, print, 2, runtime, chunk_sizes(300, 16, 2))
    first_word = {"openvino": "OpenVINO", "onnxruntime": "ONNX", "torch": "torch"}[runtime]
    assert classifier.description.split()[0] == first_word
    body = CpuFastBody(classifier, Smoothing(engine, 0.25, 5, 300), workers=2, chunk=16,
                       noise=NoiseSource(CPU, serial=True))
    reference, _ = plain_counts
    assert (reference[:, 1].max(1) < 460).any()  # some votes are split: the comparison means something
    assert np.array_equal(_counts(engine, body, items), reference)


@needs_openvino
def test_openvino_compiles_the_full_batch_sizes_and_one_model_for_the_rest(demo):
    """Chunks of a full batch run on models compiled for their size; other sizes on one model
    for any size; all give the PyTorch logits, from any worker thread."""
    model, _ = demo
    assert chunk_sizes(100, 16, 2) == {12, 13} and chunk_sizes(1000, 128, 2) == {125}
    chunks = OpenVinoChunks(onnx_bytes(model), "test", workers=2, static_rows=chunk_sizes(100, 16, 2))
    assert set(chunks._compiled) == {12, 13}
    noisy = torch.rand((16, 3, 8, 8)) + 0.25 * torch.randn((16, 3, 8, 8))
    with torch.inference_mode():
        want = model(noisy)
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda rows: chunks.logits(noisy[:rows]), [13, 12, 7, 13, 7, 1, 16]))
    for logits in got:
        assert torch.allclose(logits, want[:len(logits)], atol=1e-4)
    assert set(chunks._compiled) == {12, 13, None}


def test_the_pooled_tail_graph_is_the_classifier(demo):
    """The exported graph applies the last fc2 after the pool: the same logits to float rounding;
    a class-token classifier keeps timm's forward (the rewrite does not apply to it)."""
    from dmae_fast.engines.graphs import ImageGraph, pooled_tail_applies

    model, _ = demo
    noisy = torch.rand((32, 3, 8, 8)) + 0.25 * torch.randn((32, 3, 8, 8))
    with torch.inference_mode():
        assert pooled_tail_applies(model)
        assert torch.allclose(ImageGraph(model, pooled_tail=True).eval()(noisy), model(noisy), atol=1e-5)
        token = tiny_vit(patch=2, size=8, pool="token")
        assert not pooled_tail_applies(token)
        with pytest.raises(ValueError, match="pooled_tail"):
            ImageGraph(token, pooled_tail=True)
        assert torch.allclose(OrtChunks(onnx_bytes(token), "t").logits(noisy), token(noisy), atol=1e-5)


def test_cpu_body_restores_the_thread_setting(demo):
    model, items = demo
    engine = TorchEngine(model, CPU, "fp32")
    before = torch.get_num_threads()
    body = CpuFastBody(TorchChunks(model, "fp32"), Smoothing(engine, 0.25, 5, 100), 2, 8,
                       NoiseSource(CPU, compiled=False))
    _counts(engine, body, items[:1], n0=10, n=90, batch=100)
    assert torch.get_num_threads() == before


class _ConcurrencyProbe(TorchChunks):
    """A PyTorch chunk classifier that records how many calls were in flight during each call."""

    def __init__(self, model):
        super().__init__(model, "fp32")
        self._lock, self._active, self.overlaps = threading.Lock(), 0, []

    def classify(self, noisy):
        with self._lock:
            self._active += 1
            self.overlaps.append(self._active)
        time.sleep(0.05)  # long enough for a concurrent call to arrive
        try:
            return super().classify(noisy)
        finally:
            with self._lock:
                self._active -= 1


def test_a_runtimes_first_call_is_made_alone(demo, plain_counts):
    """A runtime's first inference sets up its binding, which is not thread-safe (two first calls
    at once deadlocked OpenVINO): the body makes it alone, then runs its workers concurrently."""
    model, items = demo
    engine = TorchEngine(model, CPU, "fp32")
    probe = _ConcurrencyProbe(model)
    body = CpuFastBody(probe, Smoothing(engine, 0.25, 5, 300), workers=2, chunk=16, noise=NoiseSource(CPU, serial=True))
    assert np.array_equal(_counts(engine, body, items[:2], n0=10, n=90), plain_counts[1])  # 200 rows: chunks of 16
    assert probe.overlaps[0] == 1 and probe.overlaps[1] == 1  # the first call, and the next began after it
    assert max(probe.overlaps) == 2  # the rest run concurrently


@pytest.mark.parametrize("serial", [True, False])
def test_the_noise_kernel_is_compiled_once_for_every_worker_and_chunk(demo, plain_counts, serial):
    """Workers run with one torch thread and get chunks at every storage offset: neither may make
    Dynamo recompile the checked kernel (concurrently, unchecked; an error in torch 2.11)."""
    from torch._dynamo.utils import counters

    model, items = demo
    engine = TorchEngine(model, CPU, "fp32")
    reference, second_reference = plain_counts
    torch._dynamo.reset()
    counters.clear()
    body = CpuFastBody(TorchChunks(model, "fp32"), Smoothing(engine, 0.25, 5, 300), workers=2, chunk=16,
                       noise=NoiseSource(CPU, serial=serial))
    slots = []
    allocate = body.allocate
    body.allocate = lambda num_slots, phase_ids: slots.append(num_slots) or allocate(num_slots, phase_ids)
    assert np.array_equal(_counts(engine, body, items), reference)
    # a second run on the same body (as after its trial batch) has another slot count
    assert np.array_equal(_counts(engine, body, items[:2], n0=10, n=90), second_reference)
    assert len(set(slots)) == 2, slots
    assert body.noise.implementation == COMPILED
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["recompiles"])


@needs_openvino
def test_fast_on_cpu_picks_openvino_then_onnxruntime_then_pytorch(demo, monkeypatch, capsys):
    model, _ = demo
    engine = TorchEngine(model, CPU, "fp32")
    body = batch_body(Smoothing(engine, 0.25, 0, 100), BodyOptions(fast=True))
    assert isinstance(body, CpuFastBody) and isinstance(body.classifier, OpenVinoChunks)
    assert capsys.readouterr().err == ""
    monkeypatch.setitem(__import__("sys").modules, "openvino", None)  # import fails
    body = batch_body(Smoothing(engine, 0.25, 0, 100), BodyOptions(fast=True))
    assert isinstance(body.classifier, OrtChunks)
    assert "OpenVINO is not installed (pip install openvino); the CPU fast path runs ONNX Runtime" \
        in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)
    body = batch_body(Smoothing(engine, 0.25, 0, 100), BodyOptions(fast=True))
    assert isinstance(body.classifier, TorchChunks)
    assert "runs PyTorch" in capsys.readouterr().err
    assert isinstance(batch_body(Smoothing(engine, 0.25, 0, 100), BodyOptions()), PlainBody)


@pytest.mark.parametrize("precision,runtime,modules,message", [
    ("fp32", "openvino", ("openvino",), "--cpu-runtime openvino: OpenVINO is not installed (pip install openvino)"),
    ("bf16", "onnxruntime", (), "--cpu-runtime onnxruntime does not run --precision bf16; choose from auto, torch"),
])
def test_a_cpu_runtime_that_cannot_run_is_one_clear_error(demo, monkeypatch, precision, runtime, modules, message):
    model, _ = demo
    for module in modules:
        monkeypatch.setitem(__import__("sys").modules, module, None)
    with pytest.raises(cpu_runtimes.UserError) as error:
        batch_body(Smoothing(TorchEngine(model, CPU, precision), 0.25, 0, 100),
                   BodyOptions(fast=True, cpu_runtime=runtime))
    assert str(error.value) == message


@pytest.mark.parametrize("runtime,name", [("onnxruntime", "ONNX Runtime"),
                                          pytest.param("openvino", "OpenVINO", marks=needs_openvino)])
def test_a_runtime_that_disagrees_with_pytorch_fails_its_parity_check(demo, monkeypatch, runtime, name):
    model, _ = demo
    kind = OrtChunks if runtime == "onnxruntime" else OpenVinoChunks
    monkeypatch.setattr(kind, "logits", lambda self, chunk: torch.zeros(len(chunk), 10))
    with pytest.raises(cpu_graphs.ParityMismatch, match=f"{name} differs from PyTorch"):
        cpu_classifier(TorchEngine(model, CPU, "fp32"), "fp32", 0.25, print, 1, runtime)


def test_cli_cpu_runtime_needs_fast(tmp_path, capsys):
    out = tmp_path / "unused.tsv"
    assert certify_main(["--data", "demo", "--seed", "0", "--max", "1", "--cpu-runtime", "onnxruntime", "--quiet",
                         "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == "dmae-certify: error: --cpu-runtime applies to --fast (on a CPU); add --fast"
    assert not out.exists()


@pytest.mark.parametrize("encoder,rows", [
    (EncoderConfig(64, 4, 4, patch_size=2, img_size=8), 128),  # the demo: 17 tokens x 256 floats (capped)
    (EncoderConfig(64, 4, 4, patch_size=4, img_size=32), 32),  # 65 tokens
    (EncoderConfig(64, 4, 4, patch_size=16, img_size=224), 16),  # 197 tokens
    (EncoderConfig(768, 12, 12, patch_size=16, img_size=224), 1),  # ViT-B: 2.4 MB per image
])
def test_chunks_stay_within_four_l2_caches(encoder, rows):
    spec = ClassifierSpec(encoder, num_classes=10, input_size=encoder.img_size)
    assert chunk_rows(spec, l2_bytes=1 << 20) == rows


@pytest.mark.parametrize("rows,chunk,workers,parts", [
    (1000, 128, 2, 8),  # 8 chunks of 125 rows, 4 per worker
    (100, 16, 2, 8),  # 7 chunks of up to 16 would leave one worker a chunk behind: 8 of 12-13
    (1000, 128, 3, 9),
    (5, 16, 4, 4),
    (3, 16, 4, 3),  # never an empty chunk
    (1, 1, 1, 1),
])
def test_a_batch_is_cut_into_as_many_chunks_per_worker(rows, chunk, workers, parts):
    assert even_parts(rows, chunk, workers) == parts
    sizes = [len(c) for c in torch.arange(rows).tensor_split(parts)]
    assert max(sizes) <= chunk and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


# --------------------------------------------------------------------------- the command line


def test_cli_fast_on_cpu_writes_the_plain_rows_and_records_threads(tmp_path):
    common = ["--data", "demo", "--seed", "0",
              "--max", "3", "--skip", "7", "--n0", "30", "--n", "400", "--batch", "256",
              "--device", "cpu", "--quiet"]
    assert certify_main([*common, "--out", str(tmp_path / "plain.tsv")]) == 0
    assert certify_main([*common, "--fast", "--out", str(tmp_path / "fast.tsv")]) == 0
    assert rows_without(tmp_path / "fast.tsv") == rows_without(tmp_path / "plain.tsv")
    record = json.loads((tmp_path / "fast.tsv.json").read_text())
    assert "worker(s) x 1 thread" in record["engine"] and "compiled noise" in record["engine"]
    assert record["threads"]["body_workers"] >= 1 and record["threads"]["dataloader_workers"] == 0
    assert record["config"]["fast"] is True
    assert record["host_allocator"] == keep_freed_memory()


def test_cli_reference_noise_gives_the_same_certificates(tmp_path):
    common = ["--data", "demo", "--seed", "0",
              "--max", "2", "--n0", "20", "--n", "200", "--batch", "128", "--device", "cpu",
              "--quiet"]
    assert certify_main([*common, "--out", str(tmp_path / "a.tsv")]) == 0
    assert certify_main([*common, "--noise", "reference", "--out", str(tmp_path / "b.tsv")]) == 0
    assert rows_without(tmp_path / "a.tsv") == rows_without(tmp_path / "b.tsv")
    assert "torch ops noise" in json.loads((tmp_path / "b.tsv.json").read_text())["engine"]


def test_bench_cpu_quick_writes_both_tables(tmp_path):
    from dmae_fast.bench.command_cpu import main as bench_cpu

    assert bench_cpu(["--quick", "--models", "demo", "--threads", "1", "--rounds", "1", "--out", str(tmp_path)]) == 0
    record = json.loads(next(tmp_path.glob("*-cpu.json")).read_text())
    methods = {row["method"]: row for row in record["methods"]}
    assert {"reference: Cohen et al. (fp32, batch 400)", "ours: --fast (fp32)"} <= set(methods)
    assert all(row["counts_equal_plain"] is not False for row in methods.values())
    assert methods["reference: Cohen et al. (fp32, batch 400)"]["vs_cohen"] == pytest.approx(1.0)
    assert {tuple(row["shape"]) for row in record["noise"]} == {(3, 8, 8), (3, 32, 32), (3, 224, 224)}
    assert all(rates["compiled eta"] > 0 for rates in (row["gaussians_per_s"] for row in record["noise"]))
    assert "| threads | model | method |" in next(tmp_path.glob("*-cpu.md")).read_text()
    assert record["host_allocator"] == keep_freed_memory()  # the bench applies and records it
    # MFU: samples/s x 7.0 MFLOP (the demo ViT) over the matmul peak measured at 1 thread
    peak = record["matmul_peak_flops"]["1"]
    fast = methods["ours: --fast (fp32)"]
    assert peak > 0 and fast["mfu"] == pytest.approx(fast["samples_per_s"] * 7.006464e6 / peak, rel=1e-3)


def test_cli_fast_on_cpu_runs_an_onnx_engine_file_like_the_plain_path(tmp_path):
    from dmae_fast.export.config import ExportConfig
    from dmae_fast.export.pipeline import export_engines

    (engine,) = export_engines(ExportConfig("demo", str(tmp_path), ("onnx",), name="demo", parity_samples=100,
                                            seed=0), report=lambda line: None)
    common = ["--engine", str(engine), "--data", "demo", "--seed", "0",
              "--max", "2", "--skip", "11", "--n0", "20", "--n", "300",
              "--batch", "128", "--device", "cpu", "--quiet"]
    assert certify_main([*common, "--out", str(tmp_path / "plain.tsv")]) == 0
    assert certify_main([*common, "--fast", "--out", str(tmp_path / "fast.tsv")]) == 0
    assert rows_without(tmp_path / "fast.tsv") == rows_without(tmp_path / "plain.tsv")
    runtime = "OpenVINO" if HAS_OPENVINO else "ONNX Runtime"
    assert runtime in json.loads((tmp_path / "fast.tsv.json").read_text())["engine"]


@needs_openvino
def test_a_signal_after_an_openvino_body_is_freed_reaches_its_handler():
    """OpenVINO's CPU plugin gives the thread that loads it an alternate signal stack that is
    unmapped when the plugin unloads. The body keeps one Core for the process's life, so a Ctrl-C
    after the body is gone runs its handler instead of crashing the process (SIGSEGV)."""
    script = textwrap.dedent("""
        import gc, signal, torch
        from dmae_fast.batching.bodies import BodyOptions, batch_body
        from dmae_fast.batching.smoothing import Smoothing
        from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
        from dmae_fast.engines.torch_engine import TorchEngine
        from dmae_fast.model.classifier import SmoothingClassifier
        from dmae_fast.model.config import ClassifierSpec, EncoderConfig
        spec = ClassifierSpec(EncoderConfig(32, 2, 2, patch_size=4, img_size=16), num_classes=10, input_size=16)
        engine = TorchEngine(SmoothingClassifier(spec).eval(), torch.device("cpu"), "fp32")
        for patch_input in (True, False):  # two bodies, one after the other, as a test module or a server may
            options = BodyOptions(fast=True, workers=2, cpu_runtime="openvino", patch_input=patch_input,
                                  noise="reference")  # no noise kernel to compile: seconds
            smoothing = Smoothing(engine, 0.25, 0, 128)
            body = batch_body(smoothing, options)
            assert body.description.startswith("OpenVINO"), body.description
            plan = SamplingPlan.certify(30, 300)
            list(StreamingCertifier(smoothing, plan, body).run([(0, torch.rand(3, 16, 16), 0)]))
        del body
        gc.collect()
        caught = []
        signal.signal(signal.SIGINT, lambda *_: caught.append(1))
        signal.raise_signal(signal.SIGINT)
        print("handled", len(caught))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and "handled 1" in result.stdout, (result.returncode, result.stderr[-300:])


def test_gpu_options_beside_fast_on_a_cpu_are_named_as_ignored(capsys, tmp_path):
    from dmae_fast.cli.certify import main

    argv = ["--data", "demo", "--seed", "0",
            "--max", "1", "--n0", "10", "--n", "30", "--quiet", "--device", "cpu", "--fast",
            "--fast-parts", "fused,cuda-graphs", "--out", str(tmp_path / "r.tsv")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--fast-parts fused,cuda-graphs ignored: --fast on a CPU runs its own body" in err  # was: silently ignored


# --------------------------------------------------------------------------- the model cache (issue 28)


@pytest.fixture(autouse=True)
def _model_cache_in_tmp_path(tmp_path, monkeypatch):
    """Every test here starts with an empty model cache of its own, never the user's."""
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path / "model-cache"))


CACHED_RUNTIMES = [pytest.param("openvino", marks=needs_openvino), "onnxruntime"]


def _build(model, runtime, notices=None):
    engine = TorchEngine(model, CPU, "fp32")
    notice = print if notices is None else notices.append
    return cpu_classifier(engine, "fp32", 0.25, notice, 2, runtime, chunk_sizes(100, 16, 2))


def _assert_is_the_classifier(classifier, model):
    """The classifier's logits are the PyTorch model's, within the parity tolerance."""
    noisy = torch.rand((24, 3, 8, 8)) + 0.25 * torch.randn((24, 3, 8, 8))
    with torch.inference_mode():
        want = model.eval()(noisy)
    inputs = noisy if classifier.layout is None else classifier.layout.inputs(noisy)
    assert float((classifier.logits(inputs) - want).abs().max()) <= cpu_graphs.PARITY_TOLERANCE


def _count_calls(monkeypatch, *names):
    """The names of the cpu_graphs functions ``names`` as they are called from now on."""
    calls = []
    for name in names:
        original = getattr(cpu_graphs, name)
        monkeypatch.setattr(cpu_graphs, name,
                            lambda *args, name=name, original=original: calls.append(name) or original(*args))
    return calls


def _refuse(monkeypatch, *names):
    for name in names:
        monkeypatch.setattr(cpu_graphs, name, lambda *args, name=name: pytest.fail(f"{name} called on a warm start"))


@pytest.mark.parametrize("runtime", CACHED_RUNTIMES)
def test_a_second_build_for_the_same_checkpoint_skips_the_export_and_the_check(demo, monkeypatch, tmp_path, runtime):
    model, _ = demo
    _assert_is_the_classifier(_build(model, runtime), model)
    if runtime == "openvino":
        assert len(list((tmp_path / "model-cache" / "openvino").glob("*/*.blob"))) == 3  # 12, 13 rows, any
    _refuse(monkeypatch, "onnx_bytes", "checked")
    _assert_is_the_classifier(_build(model, runtime), model)


@pytest.mark.parametrize("runtime", CACHED_RUNTIMES)
def test_changing_one_weight_misses_the_cache(demo, monkeypatch, runtime):
    import copy

    model, _ = demo
    _build(model, runtime)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.head.weight[0, 0] += 0.5
    calls = _count_calls(monkeypatch, "onnx_bytes", "checked")
    _assert_is_the_classifier(_build(changed, runtime), changed)
    assert calls == ["onnx_bytes", "checked"]


def _flip_bytes(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    data[-1] ^= 0xFF
    path.chmod(0o600)
    path.write_bytes(bytes(data))


# A graph exported again is the same bytes, so the verdict recorded for those bytes still holds.
@pytest.mark.parametrize("runtime,corrupted,rebuilt", [
    ("onnxruntime", "graph", ["onnx_bytes"]),
    ("onnxruntime", "verdict", ["checked"]),
    pytest.param("openvino", "graph", ["onnx_bytes"], marks=needs_openvino),
    pytest.param("openvino", "compiled", ["checked"], marks=needs_openvino),
])
def test_a_corrupted_cache_entry_is_rebuilt_not_trusted(demo, monkeypatch, tmp_path, runtime, corrupted, rebuilt):
    model, _ = demo
    _build(model, runtime)
    folder = tmp_path / "model-cache"
    entries = sorted(folder.glob("*.entry"), key=lambda path: path.stat().st_size)  # the verdict, then the graph
    target = {"verdict": entries[0], "graph": entries[-1]}.get(corrupted)
    _flip_bytes(target or min(folder.glob("openvino/*/*.blob")))
    calls = _count_calls(monkeypatch, "onnx_bytes", "checked")
    classifier = _build(model, runtime)
    assert sorted(calls) == sorted(rebuilt)
    _assert_is_the_classifier(classifier, model)
    # rebuilt and overwritten: the next start trusts it again
    _refuse(monkeypatch, "onnx_bytes", "checked")
    _assert_is_the_classifier(_build(model, runtime), model)


def test_a_disabled_cache_writes_nothing(demo, monkeypatch, tmp_path):
    model, _ = demo
    monkeypatch.setenv("DMAE_FAST_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    notices = []
    _build(model, "onnxruntime", notices)
    calls = _count_calls(monkeypatch, "onnx_bytes", "checked")
    _assert_is_the_classifier(_build(model, "onnxruntime", notices), model)
    assert calls == ["onnx_bytes", "checked"] and notices == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("runtime", CACHED_RUNTIMES)
def test_an_unwritable_cache_folder_runs_uncached_with_one_notice(demo, monkeypatch, tmp_path, runtime):
    model, _ = demo
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("DMAE_FAST_CACHE", str(tmp_path / "a-file" / "cache"))
    notices = []
    _assert_is_the_classifier(_build(model, runtime, notices), model)
    assert len(notices) == 1 and notices[0].startswith(f"the cache {tmp_path / 'a-file' / 'cache'} cannot be "
                                                       "written") and notices[0].endswith("running uncached "
                                                                                          "(set DMAE_FAST_CACHE to "
                                                                                          "another folder, or to off)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]


def test_an_edited_cache_entry_with_its_digest_recomputed_is_named_dropped_and_rebuilt(monkeypatch, tmp_path,
                                                                                     capsys):
    """Through the command: a graph entry whose weights were edited (digest recomputed) fails its
    parity check; the run names the entry, rebuilds it and runs the fast body on it, not PyTorch."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    monkeypatch.delenv("DMAE_FAST_BODY")
    common = ["--data", "demo", "--seed", "0", "--max", "1", "--n0", "20", "--n", "100", "--device", "cpu", "--quiet"]

    def run(name):
        assert certify_main([*common, "--out", str(tmp_path / name)]) == 0
        record = json.loads((tmp_path / f"{name}.json").read_text())
        assert not record["engine"].startswith("torch")  # the exported graph runs
        return record, capsys.readouterr().err

    run("first.tsv")
    entry = max((tmp_path / "model-cache").glob("*.entry"), key=lambda path: path.stat().st_size)  # the graph
    original = entry.read_bytes()
    graph = onnx.load_from_string(original.partition(b"\n")[2])
    weights = max(graph.graph.initializer, key=lambda tensor: numpy_helper.to_array(tensor).size)
    weights.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weights), weights.name))
    edited = graph.SerializeToString()
    entry.write_bytes(hashlib.sha256(edited).hexdigest().encode() + b"\n" + edited)

    record, err = run("edited.tsv")
    [notice] = record["body_fallbacks"]
    assert notice.startswith(f"the CPU fast body, built from the model cache entry {entry}, failed (ParityMismatch: ")
    assert notice.endswith("; dropped the entry, building it again from scratch") and f"dmae-fast: {notice}\n" in err
    assert entry.read_bytes() == original  # rebuilt
    assert rows_without(tmp_path / "edited.tsv") == rows_without(tmp_path / "first.tsv")
    assert run("again.tsv")[0]["body_fallbacks"] == []
