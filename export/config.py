"""What one ``dmae-export`` run produces, as a typed configuration."""

from __future__ import annotations

from dataclasses import dataclass

from dmae_fast.engines.sidecar import BatchRange
from dmae_fast.errors import UserError

FORMATS = ("onnx", "tensorrt", "torch")  # "all" on the command line means all three
PRECISIONS_BY_FORMAT = {"onnx": ("fp32", "fp16"), "tensorrt": ("fp32", "fp16"), "torch": ("fp32", "fp16", "bf16")}
DEFAULT_BATCH = BatchRange(1, 1000, 1024)  # dmae-certify's default batch is 1000


@dataclass(frozen=True)
class ExportConfig:
    """Export one checkpoint to engine files ``<out>/<name>.<ext>`` with sidecars."""

    ckpt: str
    out: str = "."
    formats: tuple[str, ...] = ("onnx",)
    precision: str = "fp32"
    input: str = "image"
    batch: BatchRange = DEFAULT_BATCH
    name: str | None = None  # default: the checkpoint's name + input kind + precision
    device: str = "auto"  # where graphs are compiled and verified (a .pt2 runs only there)
    parity_samples: int = 1000
    seed: int | None = None  # of the parity inputs; random (and recorded) by default
    input_size: int | None = None  # overrides for checkpoints without metadata
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    timing_cache: str | None = None  # TensorRT; default <out>/tensorrt-timing.cache
    overwrite: bool = False
    strict_formats: bool = True  # False ("all"): skip TensorRT when it is not installed

    def validate(self) -> None:
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise UserError(f"--format must be one of {', '.join(FORMATS)} or all, got {', '.join(unknown) or 'none'}")
        if self.input not in ("image", "tokens"):
            raise UserError(f"--input must be image or tokens, got {self.input!r}")
        for fmt in self.formats:
            if self.precision not in PRECISIONS_BY_FORMAT[fmt]:
                allowed = ", ".join(PRECISIONS_BY_FORMAT[fmt])
                raise UserError(f"--precision {self.precision} is not available for --format {fmt} ({allowed})")
        if self.parity_samples < 1:
            raise UserError(f"--parity-samples must be >= 1, got {self.parity_samples}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise UserError(f"--seed must be in [0, 2**63), got {self.seed}")
        if self.name is not None and (not self.name or "/" in self.name):
            raise UserError(f"--name must be a plain file name without an extension, got {self.name!r}")
