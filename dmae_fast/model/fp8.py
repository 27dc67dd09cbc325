"""fp8 bodies (``--precision fp8``, opt-in): the encoder blocks' linear layers in float8 (docs/performance.md).

Each becomes an :class:`Fp8Linear` (e4m3 weight with per-output-channel scales, inputs quantized per row,
``torch._scaled_mm`` with a bfloat16 output); an exact-GELU MLP's GELU moves into its fc2's quantization
(:mod:`dmae_fast.kernels.gelu_quantize` on CUDA). Everything else runs in bfloat16. The certificate is for
this fp8 classifier, whose agreement with fp16 is measured and recorded, never assumed."""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
ACTIVATIONS = torch.bfloat16  # what the rest of an fp8 body computes in
TINY = 1e-12  # floor of a scale: an all-zero row quantizes to zeros, not NaN


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``x`` [M, K] -> (e4m3 rows, float32 scales [M, 1]) with x ~= rows * scales: each row times its scale's
    reciprocal (one IEEE division per row, as the GELU kernel does it), rounded half to even onto the e4m3 grid."""
    x = x.float()
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=TINY) / E4M3_MAX
    return (x * scale.reciprocal()).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def gelu_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` of GELU(x) (``x`` bf16 [M, K]; GELU rounded to bf16 as nn.GELU
    returns it): one Triton pass on CUDA (:mod:`dmae_fast.kernels.gelu_quantize`)."""
    if x.is_cuda:
        from dmae_fast.kernels.gelu_quantize import gelu_quantize_rows as kernel

        return kernel(x.contiguous(), float(E4M3_MAX), TINY)
    return quantize_rows(F.gelu(x))


class Fp8Linear(nn.Module):
    """``nn.Linear`` with an e4m3 weight (per-output-channel scales) and per-row e4m3 inputs;
    with ``gelu_input`` it computes ``linear(GELU(x))`` (the GELU fused with the quantization)."""

    def __init__(self, linear: nn.Linear, gelu_input: bool = False) -> None:
        super().__init__()
        self.gelu_input = gelu_input
        weight, scale = quantize_rows(linear.weight.detach())  # [out, in], [out, 1]
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous())  # [1, out]
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(ACTIVATIONS))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quantize = gelu_quantize_rows if self.gelu_input else quantize_rows
        rows, scale = quantize(x.reshape(-1, self.in_features))
        out = torch._scaled_mm(rows, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, bias=self.bias,
                               out_dtype=ACTIVATIONS)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        gelu = ", GELU of the input fused" if self.gelu_input else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 per-channel x per-row{gelu}"


@functools.cache
def cpu_row_scales_problem() -> str | None:
    """Why this torch's CPU ``torch._scaled_mm`` cannot take per-row scales (as :class:`Fp8Linear` needs), or None.
    Asked of torch itself, once: torch 2.11's CPU kernel takes only one scale per operand."""
    rows = torch.zeros(16, 16, dtype=E4M3)
    try:
        torch._scaled_mm(rows, rows.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=ACTIVATIONS)
    except (RuntimeError, NotImplementedError):
        return (f"this torch ({torch.__version__}) has no CPU fp8 matrix product with per-row scales "
                "(torch 2.11's takes one scale per operand); run fp8 on an Ada or Hopper GPU, or use a newer torch")
    return None


def fp8_problem(model: nn.Module, device: torch.device) -> str | None:
    """Why ``model`` cannot run in fp8 on ``device``, or None."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return f"fp8 matrix products need an Ada or Hopper GPU (compute capability 8.9+); {name} has not"
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return "fp8 applies to ViT classifiers (no encoder blocks found)"
    odd = sorted({n for m in blocks.modules() if isinstance(m, nn.Linear)
                  for n in (m.in_features, m.out_features) if n % 16})
    if odd:  # the fp8 tensor-core kernels take widths in multiples of 16
        return f"fp8 needs linear layer widths that are multiples of 16; this classifier has {odd}"
    return cpu_row_scales_problem() if device.type == "cpu" else None


def _exact_gelu_mlp(mlp: nn.Module) -> bool:
    """Whether ``mlp`` computes fc2(GELU(fc1(x))) with the exact GELU and nothing between (timm's Mlp)."""
    between = [getattr(mlp, name, None) for name in ("act", "drop1", "norm")]
    return (isinstance(getattr(mlp, "fc2", None), nn.Linear) and isinstance(between[0], nn.GELU)
            and between[0].approximate == "none" and all(isinstance(m, (nn.Identity, nn.Dropout)) for m in between[1:]))


def to_fp8(model: nn.Module) -> nn.Module:
    """A bfloat16 copy of ``model`` whose blocks' linear layers are :class:`Fp8Linear` (exact-GELU fc2s take GELU)."""
    body = copy.deepcopy(model).to(ACTIVATIONS).eval()
    for block in body.blocks:
        fused = {id(block.mlp.fc2)} if _exact_gelu_mlp(getattr(block, "mlp", None)) else set()
        for name, module in list(block.named_modules()):
            if isinstance(module, nn.Linear):
                parent, _, attr = name.rpartition(".")
                setattr(block.get_submodule(parent), attr, Fp8Linear(module, gelu_input=id(module) in fused))
        if fused:
            block.mlp.act = nn.Identity()
    if any(b.is_cuda for b in body.buffers()):  # load the Triton pass now, not while torch.compile traces
        import dmae_fast.kernels.gelu_quantize  # noqa: F401
    return body
