"""The sound noise kernel (Triton; interpreter on CPU) bit for bit against the torch reference (issue 37)."""

import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():  # before triton is imported anywhere in this process
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from test_kernels import HOPPER_COMPILER  # noqa: E402

from dmae_fast.noise import sound as reference  # noqa: E402
from dmae_fast.noise.contract import key_words, philox4x32  # noqa: E402
from dmae_fast.stats.rounded_gaussian import sound_table  # noqa: E402

sound_noise = pytest.importorskip("dmae_fast.kernels.sound_noise")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU = torch.device("cpu")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _rows(count: int, slots: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(slot, image, phase, sample) of ``count`` rows: image indices above 2**31, samples up to 2**32 - 1."""
    generator = torch.Generator().manual_seed(seed)
    slot = torch.randint(0, slots, (count,), generator=generator)
    image = slot * 1000 + 2**31 + 5
    phase = torch.randint(0, 3, (count,), generator=generator)
    sample = torch.randint(0, 2**32, (count,), generator=generator)
    sample[0] = 2**32 - 1
    return slot, image, phase, sample


def _on_grid(count: int, shape: tuple[int, ...], grid: int, seed: int) -> torch.Tensor:
    """Clean float32 images X / grid, X uniform in [0, grid]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, grid + 1, (count, *shape), generator=generator).float() / grid


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.float32 and torch.equal(a.cpu().view(torch.int32), b.cpu().view(torch.int32))


def _check_against_the_reference(sigma: float, grid: int, seed: int, shape: tuple[int, ...], count: int) -> None:
    table = sound_table(sigma, grid)
    thresholds, key = torch.tensor(table.thresholds), key_words(seed)
    clean = _on_grid(3, shape, grid, seed=count)
    slot, image, phase, sample = _rows(count, 3, seed=len(shape) + count)
    numel = clean[0].numel()
    expected = reference.rounded_gaussian_rows(key, thresholds, table.K, image, phase, sample, numel)
    assert expected.min() < 0 < expected.max()  # a real draw, both signs
    on = [t.to(DEVICE) for t in (clean, thresholds, slot, image, phase, sample)]
    clean_d, thresholds_d, slot_d, image_d, phase_d, sample_d = on
    noise = sound_noise.rounded_gaussian_rows(key, thresholds_d, table.K, image_d, phase_d, sample_d, numel)
    assert noise.dtype == torch.int64 and torch.equal(noise.cpu(), expected)
    inputs = sound_noise.sound_rows(clean_d, slot_d, grid, thresholds_d, table.K, key, image_d, phase_d, sample_d)
    assert inputs.shape == (count, *shape)
    assert _same_bits(inputs, reference.sound_rows(clean, slot, grid, thresholds, table.K, key, image, phase, sample))


# Seeds 0 and one whose high key word matters; 105 and 3 * 33 * 31 elements: odd, and past one program of
# the interpreter (1024 elements) or several of the GPU (512), ending in a partial one.
@pytest.mark.parametrize("sigma,grid,seed,shape", [
    (0.25, 255, 0, (3, 7, 5)),
    (0.25, 255, 2**40 + 12345, (3, 33, 31)),
    (1.0, 255, 2**40 + 12345, (3, 7, 5)),
    (1.0, 255, 2**63 + 7, (1, 8, 8)),
    (0.25, 16, 2**40 + 12345, (1, 8, 8)),
    (0.25, 16, 3, (1, 9, 7)),
])
def test_kernel_draws_the_references_integers_and_inputs_bit_for_bit(sigma, grid, seed, shape):
    _check_against_the_reference(sigma, grid, seed, shape, count=5)


def _uniform_words(seed: int, image: int, phase: int, sample: int, numel: int) -> list[int]:
    """U of each element, written out from the contract in Python integers (the test's own reading)."""
    pair = torch.arange((numel + 1) // 2)
    counter = (pair, *(torch.tensor(v) for v in (sample, image, phase)))
    w0, w1, w2, w3 = (w.tolist() for w in torch.broadcast_tensors(*philox4x32(counter, seed)))
    return [(w0[e // 2] if e % 2 == 0 else w2[e // 2]) * 2**32 + (w1[e // 2] if e % 2 == 0 else w3[e // 2])
            for e in range(numel)]


def test_a_uniform_on_a_threshold_takes_the_value_above_it():
    """Z = k iff T_{k-1} <= U < T_k, on a hand-made table: some elements' U are thresholds exactly (Z goes
    up), others one below a threshold (Z stays), duplicated thresholds, T = 0 and T = 2**64 - 1 present."""
    seed, image, phase, sample, numel = 2**40 + 12345, 2**31 + 9, 1, 2**32 - 1, 41
    uniforms = _uniform_words(seed, image, phase, sample, numel)
    assert min(uniforms) < 2**63 <= max(uniforms)  # both halves of the signed int64 range
    hit, missed = uniforms[:12], uniforms[12:20]  # even and odd elements among each
    ends = sorted([0, 0, 0, 2**64 - 1, *hit, *hit[:2], *(u + 1 for u in missed)])
    K = len(ends) // 2
    assert len(ends) == 2 * K
    expected = torch.tensor([[-K + sum(t <= u for t in ends) for u in uniforms]])
    for u, z in zip(hit, expected[0, :12].tolist()):  # U == T_k for the largest such k: Z = k + 1
        assert ends[K + z - 1] == u and (K + z == 2 * K or ends[K + z] > u)
    for u, z in zip(missed, expected[0, 12:20].tolist()):
        assert ends[K + z] == u + 1  # U = T_k - 1: Z = k
    thresholds = torch.tensor([t - 2**63 for t in ends], dtype=torch.int64)
    rows = [torch.tensor([v]) for v in (image, phase, sample)]
    key = key_words(seed)
    assert torch.equal(reference.rounded_gaussian_rows(key, thresholds, K, *rows, numel), expected)
    drawn = sound_noise.rounded_gaussian_rows(key, thresholds.to(DEVICE), K, *(r.to(DEVICE) for r in rows), numel)
    assert torch.equal(drawn.cpu(), expected)


def test_half_levels_round_to_even_as_the_reference():
    """X = round(c * L) breaks ties to even, as torch.round: c = (k + 1/2) / 16 is a tie exactly in float32."""
    table = sound_table(0.25, 16)
    thresholds, key = torch.tensor(table.thresholds), key_words(5)
    clean = ((torch.arange(16) + 0.5) / 16).reshape(1, 1, 4, 4)
    slot, image, phase, sample = _rows(3, 1, seed=0)
    expected = reference.sound_rows(clean, slot, 16, thresholds, table.K, key, image, phase, sample)
    on = [t.to(DEVICE) for t in (clean, slot, thresholds, image, phase, sample)]
    assert _same_bits(sound_noise.sound_rows(*on[:2], 16, on[2], table.K, key, *on[3:]), expected)


def test_thresholds_of_the_wrong_length_are_refused():
    table = sound_table(0.25, 16)
    rows = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="2K"):
        sound_noise.rounded_gaussian_rows((0, 0), torch.tensor(table.thresholds[1:], device=DEVICE), table.K,
                                          rows, rows, rows, 4)


@pytest.mark.gpu
@gpu
def test_cuda_kernel_matches_the_reference_at_full_size_and_on_the_boundaries():
    """On the GPU (the compiled kernel): ImageNet-sized rows (3 x 224 x 224) at both 8-bit noise levels,
    and the hand-made threshold and rounding cases above (run here too, for the GPU session's ``-m gpu``)."""
    for sigma in (0.25, 1.0):
        _check_against_the_reference(sigma, 255, 2**40 + 12345, (3, 224, 224), count=64)
    test_a_uniform_on_a_threshold_takes_the_value_above_it()
    test_half_levels_round_to_even_as_the_reference()


# Compiles the kernel for Hopper (sm_90) with Triton's bundled ptxas, as the launcher sets it up, and reads
# the PTX: the float steps are single IEEE operations (no fma contraction, a correctly rounded division).
HOPPER_COMPILE = HOPPER_COMPILER + r"""
import re
from dmae_fast.kernels import sound_noise as sn

assert not sn.INTERPRETED
kernel = sn._sound_kernel
rows, numel = torch.arange(2), 3 * 224 * 224
for noise_only, key, K in ((False, (1, 1), 1), (True, (2**32 - 1, 5), 2446)):  # key words and K equal to 1
    out = torch.empty(2, numel, dtype=torch.int64 if noise_only else torch.float32)
    _, args, options = sn.sound_launch(out, torch.zeros(2, numel), rows, 255, torch.zeros(2 * K, dtype=torch.int64),
                                       K, key, rows, rows, rows, numel, noise_only)
    ptx = compile_for_hopper(kernel, args, options).asm["ptx"]
    floats = set(re.findall(r"\b(fma|mul|add|sub|div)(\.[a-z]+)*\.f32", ptx))
    assert all(op != "fma" and mode == ".rn" for op, mode in floats), floats
    assert noise_only or ("div", ".rn") in floats
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the kernel is compiled and run by the tests above")
def test_kernel_compiles_for_hopper_with_ieee_float_steps(tmp_path):
    triton = pytest.importorskip("triton")
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("this triton has no bundled ptxas (no CUDA backend)")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-3000:]
