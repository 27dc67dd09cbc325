"""fp8 bodies (--precision fp8): the quantized linear layer, the model copy, where they run."""

import numpy as np
import pytest
import torch
from helpers import random_images, stream_counts, tiny_vit
from torch import nn

from dmae_fast.base.errors import UserError
from dmae_fast.batching.fast_body import FastBody, FastPath
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import SamplingPlan
from dmae_fast.cli.certify import main
from dmae_fast.engines.opening import EngineOptions, open_engine
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.checkpoints import save_classifier
from dmae_fast.model.fp8 import E4M3, Fp8Linear, cpu_row_scales_problem, fp8_problem, to_fp8

CPU = torch.device("cpu")


# torch 2.11's CPU torch._scaled_mm takes one scale per operand: the CPU fp8 tests need a newer torch
cpu_fp8 = pytest.mark.skipif(cpu_row_scales_problem() is not None, reason=str(cpu_row_scales_problem()))


def _model(width=32):
    return tiny_vit(width, sigma=0.5)


@cpu_fp8
def test_fp8_linear_is_the_scaled_product_of_its_quantized_operands():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(5, 7, 64).to(torch.bfloat16)
    layer = Fp8Linear(linear)
    assert layer.weight.dtype == E4M3 and layer.weight_scale.shape == (1, 48)
    out = layer(x)
    assert out.shape == (5, 7, 48) and out.dtype == torch.bfloat16
    # the same arithmetic spelled out: per-row input scales, per-channel weight scales
    rows = x.reshape(-1, 64).float()
    scale = rows.abs().amax(1, keepdim=True) / 448
    dequantized = (rows / scale).to(E4M3).float() * scale
    weight = layer.weight.float() * layer.weight_scale.reshape(-1, 1)
    expected = dequantized @ weight.T + linear.bias.detach().to(torch.bfloat16).float()
    torch.testing.assert_close(out.reshape(-1, 48).float(), expected, rtol=2e-2, atol=2e-2)
    # and it is an approximation of the float layer (e4m3 keeps ~2 significant digits)
    exact = linear(x.float()).reshape(-1, 48)
    assert (out.reshape(-1, 48).float() - exact).abs().max() < 0.1 * exact.abs().max()


@cpu_fp8
def test_an_all_zero_row_quantizes_to_zeros_not_nan():
    layer = Fp8Linear(nn.Linear(32, 16, bias=False))
    assert torch.equal(layer(torch.zeros(3, 32, dtype=torch.bfloat16)), torch.zeros(3, 16, dtype=torch.bfloat16))


def test_to_fp8_quantizes_the_blocks_linear_layers_only_and_leaves_the_model_alone():
    model = _model()
    body = to_fp8(model)
    quantized = [name for name, m in body.named_modules() if isinstance(m, Fp8Linear)]
    assert quantized == [f"blocks.{b}.{layer}" for b in range(2) for layer in ("attn.qkv", "attn.proj", "mlp.fc1",
                                                                               "mlp.fc2")]
    assert isinstance(body.head, nn.Linear) and body.head.weight.dtype == torch.bfloat16
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())  # a copy
    assert next(model.parameters()).dtype == torch.float32


@cpu_fp8
def test_to_fp8_moves_an_exact_gelu_into_fc2_without_changing_the_function():
    body = to_fp8(_model())
    for block in body.blocks:
        assert isinstance(block.mlp.act, nn.Identity) and block.mlp.fc2.gelu_input and not block.mlp.fc1.gelu_input
    x = torch.randn(3, 3, 16, 16).to(torch.bfloat16)
    fused = body(x)
    for block in body.blocks:  # the same layers, GELU back as its own module
        block.mlp.act, block.mlp.fc2.gelu_input = nn.GELU(), False
    assert torch.equal(fused, body(x))
    model = _model()
    for block in model.blocks:  # a tanh GELU is not what the fused pass computes: left alone
        block.mlp.act = nn.GELU(approximate="tanh")
    assert not any(block.mlp.fc2.gelu_input or isinstance(block.mlp.act, nn.Identity) for block in to_fp8(model).blocks)


def test_fp8_problem_names_widths_the_kernels_cannot_take():
    assert fp8_problem(_model(32), CPU) == cpu_row_scales_problem()  # None where this torch has the CPU product
    assert "multiples of 16" in fp8_problem(_model(40), CPU) and "[40" in fp8_problem(_model(40), CPU)


def test_open_engine_refuses_fp8_for_a_classifier_it_cannot_run(tmp_path):
    path = save_classifier(_model(40), tmp_path / "odd.safetensors")
    with pytest.raises(UserError, match="--precision fp8: .*multiples of 16"):
        open_engine(path, EngineOptions(device="cpu", precision="fp8"))


def test_the_cpu_probe_says_what_the_fp8_layer_finds():
    """cpu_row_scales_problem asks torch; an fp8 layer then runs, or fails as the probe said (torch 2.11)."""
    layer, x = Fp8Linear(nn.Linear(32, 16)), torch.randn(3, 32, dtype=torch.bfloat16)
    if cpu_row_scales_problem() is None:
        assert layer(x).shape == (3, 16)
    else:
        with pytest.raises(RuntimeError, match="scal"):
            layer(x)


def test_without_the_cpu_product_fp8_on_a_cpu_is_one_line_before_the_run(tmp_path, capsys, monkeypatch):
    import dmae_fast.model.fp8 as fp8

    monkeypatch.setattr(fp8, "cpu_row_scales_problem", lambda: "this torch (0.0) has no CPU fp8 matrix product")
    out = tmp_path / "fp8.tsv"
    status = main(["--data", "demo", "--seed", "0", "--max", "1", "--precision", "fp8", "--device", "cpu",
                   "--quiet", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err == ["dmae-certify: error: --precision fp8: this torch (0.0) has no CPU fp8 matrix "
                                   "product"], err
    assert not out.exists()


def _counts(engine, body=None):
    return stream_counts(Smoothing(engine, 0.5, 11, 48), random_images(4), SamplingPlan.certify(n0=10, n=50), body)


@cpu_fp8
def test_the_fast_fp8_body_counts_as_the_plain_fp8_body():
    engine = TorchEngine(_model(), CPU, "fp8")
    plain = _counts(engine)
    fast = _counts(engine, FastBody(Smoothing(engine, 0.5, 11, 48), FastPath()))
    assert all(np.array_equal(plain[i], fast[i]) for i in plain)  # the same fp8 classifier, the same samples


def test_fp8_bodies_compile_in_the_default_mode_and_say_so(capsys):
    engine = TorchEngine(_model(), CPU, "fp8")
    body = FastBody(Smoothing(engine, 0.5, 11, 48), FastPath(compile=True, compile_mode="max-autotune"))
    assert body.options.compile and body.options.compile_mode == "default"
    assert "fp8: torch.compile mode 'default' instead of 'max-autotune'" in capsys.readouterr().err


@cpu_fp8
def test_dmae_certify_runs_the_demo_in_fp8(tmp_path):
    out = tmp_path / "fp8.tsv"
    assert main(["--data", "demo", "--seed", "0",
                 "--max", "3", "--n0", "20", "--n", "100", "--precision", "fp8", "--device", "cpu",
                 "--quiet", "--workers", "0", "--out", str(out)]) == 0
    rows = out.read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("idx")


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
def test_cuda_fp8_fast_body_agrees_with_fp16():
    """fp8 on the tensor cores, fused + compiled + CUDA graphs, against the plain fp16 body."""
    cuda = torch.device("cuda")
    model = _model().to(cuda)
    fp8 = TorchEngine(model, cuda, "fp8")
    body = FastBody(Smoothing(fp8, 0.5, 11, 48),
                    FastPath(fused=True, compile=True, cuda_graphs=True, compile_mode="default"))
    fast, eager = _counts(fp8, body), _counts(fp8)
    fp16 = _counts(TorchEngine(model, cuda, "fp16"))
    total = sum(c.sum() for c in fp16.values())
    assert sum(c.sum() for c in fast.values()) == total
    assert sum(np.abs(eager[i] - fast[i]).sum() for i in eager) / 2 <= 0.02 * total  # rounding of the fusion
    assert sum(np.abs(fp16[i] - fast[i]).sum() for i in fp16) / 2 <= 0.05 * total  # fp8 vs fp16
