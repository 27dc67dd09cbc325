"""The GELU + per-row e4m3 quantization pass of fp8 bodies (dmae_fast.kernels.gelu_quantize)."""

import pytest
import torch

from dmae_fast.kernels.gelu_quantize import _chunks, _launch, gelu_quantize_rows
from dmae_fast.model.fp8 import E4M3, quantize_rows

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _gelu_rows(rows=37, width=96):
    torch.manual_seed(0)
    h = (torch.randn(rows, width) * 3).to(torch.bfloat16)
    h[-1, :7] = torch.tensor([1e-4, -1e-4, 40.0, -40.0, 0.3, -5.0, 2.5])  # tiny, large, GELU's negative tail
    h[0] = 0  # an all-zero row: scale at its floor, zeros out
    return h


def _assert_same_quantization(h, q, scale, min_same=0.999):
    """(q, scale) is quantize_rows(GELU(h)) in torch operations: the same scales; the same e4m3
    bytes except where the two erf implementations round GELU's far negative tail to different
    bf16 values (then one grid step apart at most); returns the share of identical bytes."""
    expected_q, expected_scale = quantize_rows(torch.nn.functional.gelu(h))
    assert q.dtype == E4M3 and scale.shape == expected_scale.shape
    torch.testing.assert_close(scale, expected_scale, rtol=1e-6, atol=0)
    same = q.view(torch.uint8) == expected_q.view(torch.uint8)
    got, want = q.float()[~same], expected_q.float()[~same]
    assert ((got - want).abs() <= 0.125 * torch.maximum(got.abs(), want.abs()) + 2**-9).all()
    share = same.float().mean().item()
    assert share >= min_same, share
    return share


def test_the_gelu_quantize_kernel_computes_quantize_rows_of_gelu():
    """The Triton pass (in the interpreter here), round-half-to-even onto the e4m3 grid and the
    bf16 rounding of GELU included, against the torch operations CPUs run; widths that chunks tile
    and one with a masked tail (100)."""
    for rows, width in ((37, 96), (5, 3072), (2, 48), (2, 4096), (3, 100)):
        h = _gelu_rows(rows, width)
        _assert_same_quantization(h, *gelu_quantize_rows(h, 448.0, 1e-12))
    q, _ = gelu_quantize_rows(_gelu_rows(37, 96), 448.0, 1e-12)
    assert (q.view(torch.uint8)[0] == 0).all()  # the all-zero row
    with pytest.raises(ValueError, match="bfloat16"):
        gelu_quantize_rows(torch.zeros(2, 16), 448.0, 1e-12)


def test_the_chunks_tile_the_rows_of_vit_widths_without_dead_lanes():
    """No lane of a program computes a dead element at the MLP widths of ViT-Ti to ViT-H (and the
    tests' widths); a row needs few chunks, each at most 1,024 wide there."""
    for width in (48, 96, 768, 1536, 3072, 4096, 5120):
        chunk, chunks = _chunks(width)
        assert chunk * chunks == width and chunks <= 8 and chunk <= 1024 and chunk & (chunk - 1) == 0, width
    assert _chunks(3072) == (1024, 3)
    chunk, chunks = _chunks(100)  # no power-of-two tiling: a masked tail
    assert chunk * (chunks - 1) < 100 <= chunk * chunks


@pytest.mark.gpu
@gpu
def test_cuda_gelu_quantize_kernel_matches_the_reference_and_compiles():
    """On the GPU (libdevice erf in the kernel, CUDA's erff in torch's GELU; hardware e4m3 cast): the
    reference's rows up to the last bit of GELU, eagerly and inside a compiled graph. Measured on an
    H100 (2026-11-27): 99.82% identical bytes, the rest one grid step apart, the scales identical."""
    h = _gelu_rows(1000, 3072).cuda()
    for name, run in (("eager", gelu_quantize_rows), ("compiled", torch.compile(gelu_quantize_rows))):
        share = _assert_same_quantization(h, *run(h, 448.0, 1e-12), min_same=0.995)
        print(f"{name}: {share:.5%} of the e4m3 bytes identical to the reference's")


@pytest.mark.gpu
@gpu
def test_cuda_native_casts_round_as_the_emulated_roundings():
    """The GPU path (hardware bf16 and e4m3 casts) gives the same bytes and scales as the integer
    roundings the interpreter runs, on the same GPU input: random rows, and rows of every finite
    bf16 value in order (each row a few binades: ties, e4m3 subnormals, -0 and GELU's tails)."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    every = every[torch.isfinite(every)]
    rows = [_gelu_rows(999, 3072), every[: every.numel() // 3072 * 3072].reshape(-1, 3072)]
    for width in (3072, 4096, 96, 100):
        h = torch.cat([r.reshape(-1)[: r.numel() // width * width].reshape(-1, width) for r in rows]).cuda()
        native, emulated = gelu_quantize_rows(h, 448.0, 1e-12), _launch(h, 448.0, 1e-12, emulate=True)
        assert torch.equal(native[1], emulated[1]), width
        assert torch.equal(native[0].view(torch.uint8), emulated[0].view(torch.uint8)), width
