"""What a run's batch body is asked to be: :class:`BodyOptions`, the body options of dmae-certify,
dmae-serve and its replay (no torch here: the commands check them before loading anything)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dmae_fast.base.errors import raise_first
from dmae_fast.batching.choices import CPU_RUNTIMES, FAST_PARTS, NOISE_CHOICES


def how(default: Any = dataclasses.MISSING) -> Any:
    """A setting of how a run computes, not what: it changes neither the noise, the classifier's input nor any
    decision, so a resumed run may differ in it. Every other setting must match (``CertifyConfig.must_match``)."""
    return dataclasses.field(default=default, metadata={"how": True})


def is_how(field: dataclasses.Field) -> bool:
    return bool(field.metadata.get("how"))


@dataclass(frozen=True)
class BodyOptions:
    """How the batches of a run are computed (none of it changes the results beyond rounding). ``fast`` asks for the
    fastest body for the device; the fast path's parts without ``fast`` run the GPU-style fast body with just those."""

    fast: bool = how(False)
    fused: bool = how(False)
    compile: bool = how(False)
    cuda_graphs: bool = how(False)
    noise: str = how("compiled")  # "reference": the torch-op noise (the same values, slow; for checking)
    cpu_runtime: str = how("auto")  # CPU fast path: "openvino", "onnxruntime", "torch" (auto: the first installed)
    workers: int | None = how(None)  # CPU fast path: worker threads (default: one per core)
    chunk: int | None = how(None)  # CPU fast path: rows per chunk (default: fits the L2 cache)
    patch_input: bool = how(True)  # CPU fast path: feed an exported checkpoint patch rows where it allows
    reason: str = how("")  # why these options ("" where a caller named them in code)

    @property
    def named_parts(self) -> tuple[str, ...]:
        """The fast path's parts named, in ``FAST_PARTS``' order (``("fused", "compile")``)."""
        return tuple(part for part, on in zip(FAST_PARTS, (self.fused, self.compile, self.cuda_graphs)) if on)

    @property
    def parts(self) -> str:
        """The option that names the fast path's parts, for messages (``--fast-parts fused,compile``; "": none)."""
        return f"--fast-parts {','.join(self.named_parts)}" if self.named_parts else ""

    @property
    def body(self) -> str:
        """The body asked for: "fast" (``fast``, or a part named) or "plain"."""
        return "fast" if self.fast or self.named_parts else "plain"

    def validate(self) -> None:
        raise_first([
            (self.noise in NOISE_CHOICES, f"--noise must be one of {', '.join(NOISE_CHOICES)}, got {self.noise!r}"),
            (self.cpu_runtime in CPU_RUNTIMES,
             f"--cpu-runtime must be one of {', '.join(CPU_RUNTIMES)}, got {self.cpu_runtime!r}"),
            (self.cpu_runtime == "auto" or self.fast, "--cpu-runtime applies to --fast (on a CPU); add --fast"),
        ])
