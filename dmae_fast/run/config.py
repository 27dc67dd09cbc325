"""The configuration of a ``dmae-certify`` run: a typed dataclass and its validation, light enough
(no torch) for the command to check its options before loading anything."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dmae_fast.batching.body_options import BodyOptions, Sound, data_grid
from dmae_fast.batching.choices import SHARD_CHOICES
from dmae_fast.errors import UserError
from dmae_fast.model.config import sigma_problem
from dmae_fast.stats.settings import FUTILITY_MODES, SEQUENTIAL_TESTS

if TYPE_CHECKING:
    from dmae_fast.stats.procedure import Procedure, ProcedureSpec

MAX_BATCH = 2**20  # noisy samples per forward pass; far beyond any device's memory at 224x224
SETTING_OF_SPEC = {"test": "sequential_test"}  # a ProcedureSpec field -> the setting that gives it, where they differ


@dataclass(frozen=True)
class CertifyConfig:
    """One certification run (the command line, resolved)."""

    engine: str
    data: str
    out: str
    sigma: float | None  # None: the sigma the checkpoint records
    n0: int = 100
    n: int = 10_000
    alpha: float = 0.001
    batch: int = 1000
    skip: int = 1
    max_images: int | None = None
    seed: int = 0
    predict: bool = False
    sequential: bool = False
    looks: tuple[int, ...] | None = None
    futility: str | None = None  # None: the sequential test's own default (exact: upper; bonferroni: deterministic)
    sequential_test: str = "exact"
    procedure_name: str | None = None  # a registered procedure's key; None: the one predict / sequential name
    split: str = "test"
    labels: str | None = None
    image_size: int | None = None
    input_size: int | None = None
    normalize: str | None = None
    device: str = "auto"
    precision: str = "auto"
    workers: int | None = None
    overwrite: bool = False
    resume: bool = False
    radii: tuple[float, ...] | None = None  # summary radii; radii of interest with --sequential
    progress: bool = True
    # the batch body (BodyOptions; the record's "body" names the one that ran): the fastest for the device,
    # else the fast path's parts named (fused: Triton noise + patch embedding; compile; cuda_graphs), else plain
    fast: bool = False
    body_reason: str | None = None  # why this body was asked for (e.g. "--fused"), for the start line and record
    fused: bool = False
    compile: bool = False
    cuda_graphs: bool = False
    noise: str = "compiled"  # or "reference": the torch-op noise
    cpu_runtime: str = "auto"  # --fast on a CPU: the classifier's runtime (cpu_batches.CPU_RUNTIMES)
    profile: str | None = None  # directory for a torch profiler trace + per-stage table
    # under torchrun: "images" (ranks claim images) or "samples" (ranks split each image's samples)
    shard: str = "images"
    sound: bool = False  # inputs on the data's grid, the exact rounded Gaussian on it (docs/sound.md)
    quantize: bool = False  # --sound: round inputs that are on no grid onto it instead of refusing them

    @property
    def body_options(self) -> BodyOptions:
        return BodyOptions(fast=self.fast, fused=self.fused, compile=self.compile, cuda_graphs=self.cuda_graphs,
                           profile=self.profile is not None, noise=self.noise, cpu_runtime=self.cpu_runtime,
                           reason=self.body_reason or "",
                           sound=Sound(data_grid(self.data), self.quantize) if self.sound else None)

    def recorded(self) -> dict:
        """The settings as the run record writes them (``procedure_name`` only when one is named)."""
        settings = dataclasses.asdict(self)
        if self.procedure_name is None:
            del settings["procedure_name"]
        return settings

    def procedure_spec(self) -> ProcedureSpec:
        """What this run asks for (``sigma`` as resolved so far)."""
        from dmae_fast.stats.procedure import CERTIFY, PREDICT, ProcedureSpec
        from dmae_fast.stats.settings import PAPER_RADII

        if self.predict:
            return ProcedureSpec(PREDICT, self.n, self.alpha, self.sigma, name=self.procedure_name, sound=self.sound)
        return ProcedureSpec(CERTIFY, self.n, self.alpha, self.sigma, self.n0, self.sequential,
                             self.radii or PAPER_RADII, self.looks, self.futility, self.sequential_test,
                             self.procedure_name, self.sound)

    def procedure(self) -> Procedure:
        """The procedure this run asks for (``sigma`` resolved)."""
        from dmae_fast.stats.procedure import Procedure

        return Procedure(self.procedure_spec())

    def procedure_settings(self) -> tuple[str, ...]:
        """The settings of this run that its procedure's results depend on beyond n, n0, alpha and sigma."""
        from dmae_fast.stats.procedure import registered

        return tuple(SETTING_OF_SPEC.get(field, field) for field in registered(self.procedure_spec().key).reads)

    def validate(self) -> None:
        checks = [
            (self.sigma is None or sigma_problem(self.sigma) is None, f"--{sigma_problem(self.sigma)}"),
            (self.image_size is None or self.image_size >= 1, f"--image-size must be >= 1, got {self.image_size}"),
            (self.input_size is None or self.input_size >= 1, f"--input-size must be >= 1, got {self.input_size}"),
            (0 < self.alpha < 1, f"--alpha must be in (0, 1), got {self.alpha}"),
            (self.n0 >= 1, f"--n0 must be >= 1, got {self.n0}"),
            (1 <= self.n < 2**32, f"--n must be in [1, 2**32), got {self.n}"),
            (1 <= self.batch <= MAX_BATCH, f"--batch must be in [1, {MAX_BATCH:,}], got {self.batch}"),
            (self.skip >= 1, f"--skip must be >= 1, got {self.skip}"),
            (self.max_images is None or self.max_images >= 1, f"--max must be >= 1, got {self.max_images}"),
            (0 <= self.seed < 2**64, f"--seed must be in [0, 2**64), got {self.seed}"),
            (self.workers is None or self.workers >= 0, f"--workers must be >= 0, got {self.workers}"),
            (not (self.overwrite and self.resume), "--overwrite and --resume exclude each other"),
            (all(math.isfinite(r) and r >= 0 for r in self.radii or ()), "--radii must be finite and >= 0"),
            (not (self.sequential and self.predict), "--sequential applies to CERTIFY, not --predict"),
            (self.sequential_test in SEQUENTIAL_TESTS,
             f"--sequential-test must be one of {', '.join(SEQUENTIAL_TESTS)}, got {self.sequential_test!r}"),
            (self.sequential or (self.looks is None and self.futility is None and self.sequential_test == "exact"),
             "--looks, --futility and --sequential-test apply to --sequential; add --sequential"),
            (self.futility is None or self.futility in FUTILITY_MODES,
             f"--futility must be one of {', '.join(FUTILITY_MODES)}, got {self.futility!r}"),
            (self.shard in SHARD_CHOICES, f"--shard must be one of {', '.join(SHARD_CHOICES)}, got {self.shard!r}"),
            (self.sound or not self.quantize, "--quantize applies to --sound; add --sound"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        self.body_options.validate()
        if self.procedure_name is not None:  # a procedure registered by its module (no command option names one)
            from dmae_fast.stats.procedure import registered

            named = registered(self.procedure_name)
            if self.sequential or named.kind != self.procedure_spec().kind:
                raise UserError(f"procedure_name {named.key} is a {named.kind.upper()} procedure: it needs "
                                f"predict={named.kind != 'certify'} and sequential=False")
