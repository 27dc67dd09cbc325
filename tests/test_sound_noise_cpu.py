"""The C kernel of --sound's noise on a CPU (kernels/sound_noise_cpu.c): the reference's inputs bit for bit
(images and normalized patch rows, any thread count), its lookup on hand-made tables whose thresholds sit on
and beside the drawn values and crowd into one bucket, NoiseSource's choice of it, and a missing compiler."""

import threading

import numpy as np
import pytest
import torch

from dmae_fast.fast_noise import C_KERNEL, COMPILED, NoiseSource, sound_patches
from dmae_fast.kernels import sound_noise_cpu
from dmae_fast.noise import key_words, uint32_stream
from dmae_fast.patch_layout import PatchLayout
from dmae_fast.sound_noise import sound_rows
from dmae_fast.stats.rounded_gaussian import SoundTable, sound_table

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(sound_noise_cpu.load() is None, reason="no C compiler")


def _rows(count: int, slots: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Slots, images, phases and samples of ``count`` rows; indices near 2**32 among them."""
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 2**32, (count,), generator=g, dtype=torch.int64)
    sample = torch.randint(0, 2**32, (count,), generator=g, dtype=torch.int64)
    sample[0] = 2**32 - 1
    return torch.arange(count) % slots, image, torch.randint(0, 3, (count,), generator=g), sample


def _clean(shape: tuple[int, ...], grid: int, slots: int = 3) -> torch.Tensor:
    return torch.randint(0, grid + 1, (slots, *shape), generator=torch.Generator().manual_seed(1)).float() / grid


@pytest.mark.parametrize("sigma,grid,seed,shape,threads", [
    (0.25, 255, 0, (3, 8, 8), 1),
    (0.5, 255, 2**40 + 12345, (1, 5, 7), 3),  # an odd number of elements: the last pair's second value dropped
    (1.0, 255, 2**63 + 7, (3, 33, 31), 2),
    (0.25, 16, 5, (1, 9, 7), 4),
])
def test_the_kernel_draws_the_references_inputs_bit_for_bit(sigma, grid, seed, shape, threads):
    table, clean, rows = sound_table(sigma, grid), _clean(shape, grid), _rows(7, 3, seed)
    want = sound_rows(clean, rows[0], grid, torch.tensor(table.thresholds), table.K, torch.tensor(key_words(seed)),
                      *rows[1:])
    got = sound_noise_cpu.sound_rows(clean, rows[0], table, key_words(seed), *rows[1:], threads=threads)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_the_kernel_draws_the_references_patch_rows_bit_for_bit():
    layout = PatchLayout(3, 16, 8, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    table, seed = sound_table(0.5, 255), 2**40 + 3
    clean, rows = layout.arrange(_clean((3, 16, 16), 255)), _rows(9, 3, seed)
    mean, std = layout.normalization
    want = sound_patches(clean, rows[0], (torch.tensor(table.thresholds), None), torch.tensor(key_words(seed)),
                         *rows[1:], layout.counters, mean, std, grid=255, fused=False)
    order = sound_noise_cpu.PatchOrder.of(layout.counters, mean, std)
    got = sound_noise_cpu.sound_rows(clean, rows[0], table, key_words(seed), *rows[1:], order=order, threads=2)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def _signed_uniforms(seed: int, image: int, phase: int, sample: int, numel: int) -> list[int]:
    """V = U - 2**63 of each element, from the Philox words (the contract: (w0, w1) even, (w2, w3) odd)."""
    words = uint32_stream(seed, torch.tensor([image]), phase, torch.tensor([sample]), 2 * numel)[0].tolist()
    return [words[4 * (e // 2) + 2 * (e % 2)] * 2**32 + words[4 * (e // 2) + 2 * (e % 2) + 1] - 2**63
            for e in range(numel)]


def test_the_lookup_counts_exactly_on_hand_made_tables():
    """Thresholds equal to drawn values (Z goes up), one above others (Z stays), duplicated, 200 crowded into
    the one 2**48-wide bucket of a drawn value (the forward scan runs long), and at both ends of int64."""
    seed, image, phase, sample, numel, grid = 2**40 + 12345, 2**31 + 9, 1, 2**32 - 1, 99, 2**20
    values = _signed_uniforms(seed, image, phase, sample, numel)
    crowded = values[30] & ~(2**48 - 1)  # the lowest V of element 30's bucket
    ends = sorted([-(2**63), -(2**63), 2**63 - 1, *values[:12], *values[:2], *(v + 1 for v in values[12:20]),
                   *(crowded + i * 2**40 for i in range(200))])
    ends = ends if len(ends) % 2 == 0 else [-(2**63), *ends]
    K = len(ends) // 2
    table = SoundTable(grid, 1.0, K, np.array(ends, dtype=np.int64), 0.0)
    expected = [sum(t <= v for t in ends) - K for v in values]
    rows = (torch.tensor([0]), torch.tensor([image]), phase, torch.tensor([sample]))
    clean = torch.full((1, 1, 9, 11), 0.5)  # X = L / 2: every Z is on the grid's scale
    got = sound_noise_cpu.sound_rows(clean, rows[0], table, key_words(seed), *rows[1:])
    assert (torch.round(got * grid).to(torch.int64) - grid // 2).flatten().tolist() == expected
    want = sound_rows(clean, rows[0], grid, torch.tensor(table.thresholds), K, torch.tensor(key_words(seed)),
                      *rows[1:])
    assert torch.equal(got, want)


@pytest.mark.parametrize("patches", [False, True])
def test_noise_source_uses_the_kernel_on_a_cpu_and_the_compiled_ops_without_it(patches, monkeypatch):
    """With a compiler NoiseSource draws --sound's inputs with the C kernel; without one it compiles the torch
    ops, silently but named; both equal the reference on every row of a batch."""
    layout = PatchLayout(3, 8, 4, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)) if patches else None
    clean = _clean((3, 8, 8), 255)
    clean = layout.arrange(clean) if layout else clean
    rows = _rows(40, 3)
    reference = NoiseSource(CPU, compiled=False, layout=layout, grid=255)(clean, rows[0], 1.0, 2**40 + 3, *rows[1:])
    notices: list[str] = []
    kernel = NoiseSource(CPU, serial=patches, layout=layout, notice=notices.append, grid=255)
    assert kernel.description == "C kernel sound noise (1/255 grid)"
    assert torch.equal(kernel(clean, rows[0], 1.0, 2**40 + 3, *rows[1:]), reference) and not notices
    monkeypatch.setattr(sound_noise_cpu, "load", lambda: None)
    compiled = NoiseSource(CPU, serial=patches, layout=layout, notice=notices.append, grid=255)
    assert compiled.implementation == COMPILED and kernel.implementation == C_KERNEL
    assert torch.equal(compiled(clean, rows[0], 1.0, 2**40 + 3, *rows[1:]), reference) and not notices


def test_serial_calls_from_several_threads_at_once_draw_their_own_rows():
    """The CPU fast body's workers call the one-thread kernel at once (ctypes frees the GIL)."""
    table, clean = sound_table(0.25, 255), _clean((3, 32, 32), 255)
    batches = [_rows(16, 3, seed) for seed in range(4)]
    want = [sound_noise_cpu.sound_rows(clean, r[0], table, (1, 2), *r[1:], threads=1) for r in batches]
    got: list = [None] * len(batches)

    def work(i: int) -> None:
        got[i] = sound_noise_cpu.sound_rows(clean, batches[i][0], table, (1, 2), *batches[i][1:], threads=1)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_slot_outside_the_clean_images_is_refused():
    table, clean, rows = sound_table(0.25, 255), _clean((1, 4, 4), 255, slots=2), _rows(3, 3)
    with pytest.raises(IndexError, match=r"slot indices must lie in \[0, 2\)"):
        sound_noise_cpu.sound_rows(clean, rows[0], table, (0, 0), *rows[1:])


@pytest.mark.parametrize("compiler", ["/nonexistent/cc", "false"])
def test_no_working_compiler_means_no_kernel_and_nothing_half_written(compiler, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert sound_noise_cpu.load.__wrapped__() is None
    assert not list(tmp_path.rglob("*.so"))


def _draw_in_child(queue) -> None:
    table, clean, rows = sound_table(0.25, 255), _clean((3, 8, 8), 255), _rows(8, 3)
    queue.put(sound_noise_cpu.sound_rows(clean, rows[0], table, (1, 2), *rows[1:], threads=2).numpy())


def test_a_forked_child_draws_with_threads_of_its_own():
    """A pool of threads does not survive fork(): after the parent has used its own, a forked child still draws."""
    import multiprocessing

    table, clean, rows = sound_table(0.25, 255), _clean((3, 8, 8), 255), _rows(8, 3)
    want = sound_noise_cpu.sound_rows(clean, rows[0], table, (1, 2), *rows[1:], threads=2)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_draw_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=600)
    child.join(timeout=600)
    assert child.exitcode == 0 and np.array_equal(got, want.numpy())
