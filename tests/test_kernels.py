"""The fused front end (Triton; interpreter on CPU) against its plain-torch reference."""

import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():  # before triton is imported anywhere in this process
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from helpers import tiny_vit  # noqa: E402

from dmae_fast.kernels.frontend_reference import FrontEnd, reference_tokens  # noqa: E402
from dmae_fast.noise.contract import gaussian_noise, uint32_stream  # noqa: E402

fused_frontend = pytest.importorskip("dmae_fast.kernels.fused_frontend")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SEED = 2**63 + 2**40 + 12345  # both key words non-zero, the high bit set


@pytest.fixture(scope="module")
def model():
    # width 48 (not a power of two), 3x3 patches of 4x4 pixels: K = 48, L = 9 (tiles are masked)
    return tiny_vit(48, size=12, classes=7, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3)).to(DEVICE)


def _rows(count, slots):
    generator = torch.Generator().manual_seed(3)
    slot = torch.randint(0, slots, (count,), generator=generator)
    image = slot * 1000 + 2**31 + 5  # image indices above 2**31
    phase = torch.randint(0, 3, (count,), generator=generator)
    sample = torch.randint(0, 2**32, (count,), generator=generator)
    return [t.to(DEVICE) for t in (slot, image, phase, sample)]


def test_noise_words_bit_for_bit_and_gaussians_to_rounding():
    _, image, phase, sample = _rows(6, 3)
    numel = 3 * 12 * 12 + 2  # not a multiple of 4
    words, noise = fused_frontend.contract_noise(SEED, image, phase, sample, numel)
    expected = uint32_stream(SEED, image, phase, sample, numel)[:, :numel]
    assert torch.equal(words, expected)
    torch.testing.assert_close(noise, gaussian_noise(SEED, image, phase, sample, (numel,)), rtol=0, atol=1e-6)


def test_reference_tokens_equal_the_classifier_on_noisy_images(model):
    """The linearity identity: E + W'eta + pos == tokens(x + sigma eta)."""
    x = torch.rand(3, 3, 12, 12, device=DEVICE)
    slot, image, phase, sample = _rows(10, 3)
    front = model.fused_front_end(sigma=0.5)
    ours = reference_tokens(front, model.clean_embedding(x), slot, image, phase, sample, SEED)
    with torch.no_grad():
        direct = model.tokens(x[slot] + 0.5 * gaussian_noise(SEED, image, phase, sample, (3, 12, 12)))
    torch.testing.assert_close(ours, direct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2), (torch.bfloat16, 1e-1)])
def test_fused_tokens_match_the_reference(model, dtype, tol):
    x = torch.rand(3, 3, 12, 12, device=DEVICE)
    slot, image, phase, sample = _rows(37, 3)  # 37 * 9 (row, patch) pairs: a partial tile
    front = model.fused_front_end(sigma=0.25)
    embeddings = model.clean_embedding(x)
    fused = fused_frontend.fused_tokens(front.cast(dtype), embeddings, slot, image, phase, sample, SEED, dtype)
    assert fused.dtype == dtype and fused.shape == (37, 10, 48)
    reference = reference_tokens(front, embeddings, slot, image, phase, sample, SEED)
    torch.testing.assert_close(fused.float(), reference, rtol=tol, atol=tol)
    with torch.no_grad():
        logits = model.forward_tokens(fused.float())
        expected = model(x[slot] + 0.25 * gaussian_noise(SEED, image, phase, sample, (3, 12, 12)))
    if dtype == torch.float32:
        assert torch.equal(logits.argmax(1), expected.argmax(1))
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quad_noise_gives_the_per_element_tokens_bit_for_bit(model, dtype):
    """One Philox call per counter and one radius per pair: the same numbers as per element."""
    x = torch.rand(3, 3, 12, 12, device=DEVICE)
    slot, image, phase, sample = _rows(37, 3)
    front = model.fused_front_end(sigma=0.25).cast(dtype)
    embeddings = model.clean_embedding(x)
    tokens = {}
    for tiles in ("split", "per-element"):  # the same blocks, with and without quads
        launch = fused_frontend.tokens_launch(front, embeddings, slot, image, phase, sample, SEED, dtype, tiles=tiles)
        assert launch[2]["QUADS"] == (tiles == "split")
        tokens[tiles] = fused_frontend.fused_tokens(front, embeddings, slot, image, phase, sample, SEED, dtype,
                                                    tiles=tiles)
    assert torch.equal(tokens["split"], tokens["per-element"])


def test_patches_not_a_multiple_of_4_wide_keep_the_per_element_noise():
    small = tiny_vit(16, 1, patch=2, size=6, classes=3).to(DEVICE)
    x = torch.rand(2, 3, 6, 6, device=DEVICE)
    slot, image, phase, sample = _rows(5, 2)
    front, embeddings = small.fused_front_end(sigma=0.5), small.clean_embedding(x)
    launch = fused_frontend.tokens_launch(front, embeddings, slot, image, phase, sample, SEED, torch.float32)
    assert not launch[2]["QUADS"]
    fused = fused_frontend.fused_tokens(front, embeddings, slot, image, phase, sample, SEED)
    torch.testing.assert_close(fused, reference_tokens(front, embeddings, slot, image, phase, sample, SEED),
                               rtol=1e-5, atol=1e-5)


def test_unknown_tiles_are_refused(model):
    slot, image, phase, sample = _rows(2, 1)
    front = model.fused_front_end(sigma=0.25)
    with pytest.raises(ValueError, match="unknown tiles huge; known: split, wide, per-element"):
        fused_frontend.tokens_launch(front, torch.zeros(1, 9, 48), slot, image, phase, sample, SEED, torch.float32,
                                     tiles="huge")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tiles", ["wide", "split", "per-element"])
def test_every_gpu_tiling_matches_the_reference_for_a_vit_b_front_end(tiles):
    """D = 768, 16x16 patches at 224 in fp16: "wide" spans D in one 1024-channel tile."""
    torch.manual_seed(0)
    weight = torch.randn(768, 768, device=DEVICE) * 0.02
    pos = torch.randn(196, 768, device=DEVICE) * 0.02
    front = FrontEnd(weight, torch.zeros(768, device=DEVICE), pos, 16, (3, 224, 224))
    embeddings = torch.randn(3, 196, 768, device=DEVICE)
    slot, image, phase, sample = _rows(40, 3)
    fused = fused_frontend.fused_tokens(front.cast(torch.float16), embeddings, slot, image, phase, sample, SEED,
                                        torch.float16, tiles=tiles)
    reference = reference_tokens(front, embeddings, slot, image, phase, sample, SEED)
    torch.testing.assert_close(fused.float(), reference, rtol=2e-2, atol=2e-2)


def test_resizing_classifiers_are_not_fused():
    model = tiny_vit(depth=1, input_size=8)
    assert "resizes" in model.spec.fused_unsupported_reason
    with pytest.raises(ValueError, match="resizes"):
        model.fused_front_end(0.25)


# Compiles both kernels as the GPU path launches them (tokens_launch / noise_launch), for Hopper
# (sm_90), with Triton's bundled ptxas: catches what the interpreter accepts and the compiler
# refuses (non-constexpr globals, libdevice names, tl.dot operand types) without a GPU.
# HOPPER_COMPILER: compile_for_hopper(kernel, args, options), for this file's and test_sound_kernel.py's scripts.
HOPPER_COMPILER = r"""
import sys
import torch
import triton
from triton.backends.compiler import GPUTarget

POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int64: "*i64"}


def arg_type(value):  # Triton's type of an argument (tensors by dtype; ints by range)
    if isinstance(value, torch.Tensor):
        return POINTER[value.dtype]
    return "i32" if -2**31 <= value < 2**31 else ("u64" if value >= 2**63 else "i64")


def compile_for_hopper(kernel, args, options):
    signature = {name: arg_type(value) for name, value in zip(kernel.arg_names, args)}
    constexprs = {name: value for name, value in options.items() if name in kernel.arg_names}
    # as Triton launches: an int equal to 1 becomes a constant unless the kernel says otherwise
    constexprs.update({param.name: 1 for param, value in zip(kernel.params, args)
                       if not isinstance(value, torch.Tensor) and value == 1 and not param.do_not_specialize})
    signature.update({name: "constexpr" for name in constexprs})
    launch = {name: value for name, value in options.items() if name not in kernel.arg_names}
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=launch)
    assert len(compiled.asm["cubin"]) > 0
    return compiled
"""
HOPPER_COMPILE = HOPPER_COMPILER + r"""
from dmae_fast.kernels import fused_frontend as ff
from dmae_fast.kernels.frontend_reference import FrontEnd

assert not ff.INTERPRETED, "the kernels must be compiled, not interpreted"
rows = torch.arange(3)
HOPPER_SHARED = 227 * 1024  # bytes of shared memory one H100/H200 block may use
SEEDS = (0, 1, 2**32, 2**63 + 2**40 + 12345)  # key words 0, 1 (a constant unless told) and above 2**31
for seed in SEEDS:
    compile_for_hopper(ff._noise_kernel, *ff.noise_launch(seed, rows, rows, rows, 3 * 224 * 224)[1:])
# ViT-B/16 at 224 in each precision; the shipped demo (8x8 grey digits, 2x2 patches) in fp32
for (channels, size, patch, width), dtypes in (((3, 224, 16, 768), (torch.float16, torch.bfloat16, torch.float32)),
                                               ((1, 8, 2, 64), (torch.float32,))):
    length, k = (size // patch) ** 2, channels * patch * patch
    front = FrontEnd(torch.zeros(k, width), torch.zeros(width), torch.zeros(length, width), patch,
                     (channels, size, size))
    embeddings = torch.zeros(2, length, width)  # float32, as FastBody keeps them
    for dtype in dtypes:  # every launch configuration; the key words' specializations (scalars) once, on ViT-B fp16
        seeds = SEEDS if (width, dtype) == (768, torch.float16) else SEEDS[-1:]
        for seed, tiles in [(seed, ff.TILES[0]) for seed in seeds] + [(SEEDS[-1], tiles) for tiles in ff.TILES[1:]]:
            grid, args, options = ff.tokens_launch(front.cast(dtype), embeddings, rows % 2, rows, rows, rows,
                                                   seed, dtype, tiles=tiles)
            compiled = compile_for_hopper(ff._fused_tokens_kernel, args, options)
            assert compiled.metadata.shared <= HOPPER_SHARED, (width, dtype, tiles, compiled.metadata.shared)
        print(width, dtype, "shared", compiled.metadata.shared, file=sys.stderr)
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the kernels are compiled and run by the tests above")
def test_kernels_compile_for_hopper_without_a_gpu(tmp_path):
    triton = pytest.importorskip("triton")
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("this triton has no bundled ptxas (no CUDA backend)")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-3000:]
