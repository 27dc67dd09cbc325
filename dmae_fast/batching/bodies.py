"""Which batch body runs a certification: :func:`resolve_body` maps :class:`BodyOptions` and the device
to a body, and says why (:class:`ResolvedBody`).

* plain (default): :class:`~dmae_fast.batching.stream.PlainBody`, any engine;
* ``--fast`` on a CPU: :class:`~dmae_fast.batching.cpu.body.CpuFastBody`;
* ``--fast`` on CUDA, or any ``--fast-parts``: :class:`~dmae_fast.batching.fast_body.FastBody`.

A stage timer (``--profile``) times whichever body runs; it chooses none.

A fast body is used only after it has agreed with the plain body on a trial batch, else the next simpler one runs
(:mod:`dmae_fast.batching.fallback`). Every body gives the same counts up to the classifier's rounding."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.base.messages import print_notice
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.batching.cpu.body import CpuFastBody, chunk_rows, chunk_sizes, cpu_workers
from dmae_fast.batching.cpu.runtimes import cpu_classifier
from dmae_fast.batching.fallback import BodyChain, Candidate
from dmae_fast.batching.fast_body import FastBody, FastPath
from dmae_fast.batching.scheduler import BatchBody
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stage_timer import StageTimer
from dmae_fast.batching.stream import PlainBody
from dmae_fast.noise.compiled import NoiseSource


@dataclass(frozen=True)
class ResolvedBody:
    """A body built for ``options``, and why; ``name`` and ``reason`` follow the body in use (one that failed mid-run
    is replaced by the next simpler one: :meth:`BodyChain.replace`)."""

    body: BatchBody
    options: BodyOptions

    @property
    def current(self) -> BatchBody:
        chain = getattr(self.body, "chain", None)
        return self.body if chain is None else chain.body

    @property
    def name(self) -> str:
        """"plain" (the reference body) or "fast" (any other)."""
        return "plain" if isinstance(self.current, PlainBody) else "fast"

    @property
    def reason(self) -> str:
        """Why this body: the options' reason, and why it is not the body they asked for where it is not (the
        notices of the bodies passed over, each also printed when it happened)."""
        options = self.options
        why = options.reason or ("fast=True" if options.fast else options.parts or "the default")
        if self.name == options.body:
            return why
        if self.name == "fast":
            return f"{why}; a token engine runs only behind the fast body's front end"
        notices = getattr(self.current, "fallbacks", None) or []
        return f"{why}; every fast body failed" + "".join(f"; {notice}" for notice in notices)

    def __str__(self) -> str:
        return f"{self.name} body: {self.reason}"

    def record(self) -> dict:
        """The body in use and why, for run records and /v1/model (beside its description, "engine")."""
        return {"name": self.name, "reason": self.reason}


def resolve_body(smoothing: Smoothing, options: BodyOptions, timer: StageTimer | None = None) -> ResolvedBody:
    """The batch body for ``smoothing`` and ``options`` (see the module doc), and why. ``body.fallbacks`` lists
    the notices of the bodies passed over (also printed); ``body.chain`` gives the next body if this one
    fails mid-run. A ``timer`` (a per-stage profile) times the stages of whichever body runs."""
    engine = smoothing.engine
    if engine.device.type == "cpu":
        keep_freed_memory()
    chain = BodyChain(engine)
    noise = functools.partial(NoiseSource, engine.device, options.noise == "compiled", grid=smoothing.grid,
                              notice=chain.notice)
    path = _fast_path(options, engine.device.type)
    if options.fast and engine.device.type == "cpu" and engine.input == "image":
        candidates = _cpu_candidates(smoothing, options, timer, noise)
    elif path is not None or engine.input == "tokens":
        candidates = _fast_candidates(smoothing, path or FastPath(), timer, noise)
    else:
        candidates = []
    # the trial's reference: the torch-op noise
    reference_noise = functools.partial(NoiseSource, engine.device, False, grid=smoothing.grid, notice=chain.notice)
    reference = _plain(smoothing, None, reference_noise) if candidates else None
    body = chain.choose(candidates, functools.partial(_plain, smoothing, timer, noise), reference)
    if timer is not None:
        timer.reset()  # the trial batches are not part of the profile
    return ResolvedBody(body, options)


def batch_body(smoothing: Smoothing, options: BodyOptions, timer: StageTimer | None = None) -> BatchBody:
    """:func:`resolve_body`'s body alone."""
    return resolve_body(smoothing, options, timer).body


def _fast_path(options: BodyOptions, device_type: str) -> FastPath | None:
    """The GPU-style fast body's parts, or None when it is not the body to use."""
    if options.fast and device_type == "cuda":
        return FastPath(fused=True, compile=True, cuda_graphs=True)
    if options.named_parts:
        return FastPath(fused=options.fused, compile=options.compile, cuda_graphs=options.cuda_graphs)
    return None


def _plain(smoothing: Smoothing, timer: StageTimer | None, noise: Callable[..., NoiseSource]) -> BatchBody:
    """The plain body; for a token engine, which no plain body runs, the eager unfused fast body."""
    if smoothing.engine.input == "tokens":
        return FastBody(smoothing, FastPath(), timer, noise())
    return PlainBody(smoothing, noise(), timer)


def _fast_candidates(smoothing: Smoothing, path: FastPath, timer: StageTimer | None,
                     noise: Callable[..., NoiseSource]) -> list[Candidate]:
    """``path``, then the same without CUDA graphs, without compiling, unfused (those that differ)."""
    chain = [path]
    for part in ("cuda_graphs", "compile", "fused"):
        if getattr(chain[-1], part):
            chain.append(replace(chain[-1], **{part: False}))

    def build(option: FastPath) -> FastBody:
        return FastBody(smoothing, option, timer, noise())

    return [Candidate(f"the fast body ({option.describe()})", functools.partial(build, option)) for option in chain]


def _cpu_candidates(smoothing: Smoothing, options: BodyOptions, timer: StageTimer | None,
                    noise: Callable[..., NoiseSource]) -> list[Candidate]:
    """The CPU fast body on the runtime asked for (auto: the fastest installed), then on PyTorch (fp32 checkpoints)."""
    if options.named_parts:
        print_notice(f"--fast-parts {','.join(options.named_parts)} ignored: --fast on a CPU runs its own body "
                     "(one worker per core, an exported graph per worker); drop --fast to use them")
    engine = smoothing.engine
    workers = options.workers or cpu_workers()
    chunk = options.chunk or chunk_rows(engine.spec)

    def build(runtime: str, cache_reads: list[Path]) -> CpuFastBody:
        classifier = cpu_classifier(engine, engine.precision, smoothing.sigma, print_notice, workers, runtime,
                                    chunk_sizes(smoothing.batch_size, chunk, workers), options.patch_input,
                                    cache_reads)
        # made by each worker for its own chunks, as the classifier takes them
        return CpuFastBody(classifier, smoothing, workers, chunk, noise(serial=True, layout=classifier.layout), timer)

    reads: list[Path] = []
    candidates = [Candidate("the CPU fast body", functools.partial(build, options.cpu_runtime, reads), reads)]
    if engine.model is not None and engine.precision == "fp32" and options.cpu_runtime != "torch":
        candidates.append(Candidate("the CPU fast body on PyTorch", functools.partial(build, "torch", [])))
    return candidates
