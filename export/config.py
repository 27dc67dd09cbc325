"""What one ``dmae-export`` run produces, as a typed configuration."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from dmae_fast.base.errors import UserError
from dmae_fast.engines.sidecar import BatchRange
from dmae_fast.model.config import sigma_problem

FORMATS = ("onnx", "tensorrt", "torch")  # "all" on the command line means all three
PRECISIONS_BY_FORMAT = {"onnx": ("fp32", "fp16"), "tensorrt": ("fp32", "fp16"), "torch": ("fp32", "fp16", "bf16")}
DEFAULT_BATCH = BatchRange(1, 1000, 1024)  # dmae-certify's default batch is 1000
MAX_BATCH = 2**31 - 1  # TensorRT's dimensions are int32; torch.export's Dim overflows above int64
MAX_PARITY_SAMPLES = 1_000_000  # 1000x the default; the inputs are drawn batch by batch
MAX_AGREEMENT_IMAGES = 1_000_000  # --check-agreement: the images read, and noisy copies of each
MAX_AGREEMENT_SAMPLES = 1_000_000
MAX_INPUT_SIZE = 4096  # the in-graph bicubic resize holds dense [encoder size, input size] matrices
DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_problem(name: str, option: str = "--device") -> str | None:
    """Why ``name`` is not a device name the commands document (torch.device also takes meta,
    mps, xla, cpu:3, ..., which then fail deep inside, or silently do nothing useful)."""
    return None if DEVICE_NAME.fullmatch(name) else f"{option} must be auto, cpu, cuda or cuda:N, got {name!r}"


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
    check_agreement: str | None = None  # a dataset: the engine's certified disagreement with PyTorch on it
    agreement_images: int = 100  # its first images
    agreement_samples: int = 1000  # noisy copies of each
    sigma: float | None = None  # the noise of the agreement check (default: the checkpoint's sigma)

    def validate(self) -> None:
        """One-line error for the first bad field, before anything is loaded or written."""
        for problem in self._problems():
            raise UserError(problem)

    def _problems(self) -> Iterator[str]:
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            yield f"--format must be one of {', '.join(FORMATS)} or all, got {', '.join(unknown) or 'none'}"
        if self.input not in ("image", "tokens"):
            yield f"--input must be image or tokens, got {self.input!r}"
        for fmt in self.formats:
            if self.precision not in PRECISIONS_BY_FORMAT[fmt]:
                allowed = ", ".join(PRECISIONS_BY_FORMAT[fmt])
                yield f"--precision {self.precision} is not available for --format {fmt} ({allowed})"
        if self.batch.max > MAX_BATCH:
            yield f"--batch MAX must be at most {MAX_BATCH} (2**31 - 1), got {self.batch.max}"
        if not 1 <= self.parity_samples <= MAX_PARITY_SAMPLES:
            yield f"--parity-samples must be in [1, {MAX_PARITY_SAMPLES:,}], got {self.parity_samples}"
        if self.seed is not None and not 0 <= self.seed < 2**63:
            yield f"--seed must be in [0, 2**63), got {self.seed}"
        if self.name is not None and (self.name in ("", ".", "..") or "/" in self.name):
            yield f"--name must be a plain file name without an extension, got {self.name!r}"
        if not self.out:
            yield "--out is empty; name a directory for the engine files"
        if self.timing_cache is not None and "tensorrt" not in self.formats:
            yield "--timing-cache is for TensorRT builds; --format does not include tensorrt"
        if self.timing_cache == "":
            yield "--timing-cache is empty; name a file"
        if problem := device_problem(self.device):
            yield problem
        yield from self._agreement_problems()

    def _agreement_problems(self) -> Iterator[str]:
        if self.check_agreement is None:
            if self.sigma is not None:
                yield "--sigma is the noise of --check-agreement; name a dataset there or drop --sigma"
            return
        if self.input != "image":
            yield "--check-agreement needs an image engine (--input image): a token engine runs only behind the fast " \
                  "body's front end"
        if not self.check_agreement:
            yield "--check-agreement is empty; name a dataset (demo, a folder or a file list)"
        if not 1 <= self.agreement_images <= MAX_AGREEMENT_IMAGES:
            yield f"--agreement-images must be in [1, {MAX_AGREEMENT_IMAGES:,}], got {self.agreement_images}"
        if not 1 <= self.agreement_samples <= MAX_AGREEMENT_SAMPLES:
            yield f"--agreement-samples must be in [1, {MAX_AGREEMENT_SAMPLES:,}], got {self.agreement_samples}"
        if self.sigma is not None and (problem := sigma_problem(self.sigma)):
            yield f"--sigma: {problem}"
