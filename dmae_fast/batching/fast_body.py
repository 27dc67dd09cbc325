"""The fast batch body (:class:`FastBody`): fused front end, compiled body, CUDA graphs.

* front end: with ``fused``, a Triton kernel turns rows straight into ViT tokens from each image's clean patch
  embedding (computed once, at load), the noise made in-kernel; otherwise the noisy images, as in the plain body.
* body: the transformer -> argmax, eager or ``torch.compile``-d, on weights cast to fp16/bf16 (or under autocast);
  or an exported token engine (``dmae-export --input tokens``) fed float32 tokens.
* CUDA graphs: front end, body and counting are captured once per run and replayed for every batch, each padded
  to the full batch size with rows that point at a padding slot whose counts nobody reads.
Counts stay on the device (one ``index_add_``), so the host never waits for it before issuing the next batch."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import print_notice
from dmae_fast.batching.job import count, keep_class, zero_counts, zero_kept
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stage_timer import StageTimer, count_batch, stage
from dmae_fast.engines.base import Engine, TokenBody, predicted_classes
from dmae_fast.engines.torch_engine import PRECISIONS
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.noise.compiled import NoiseSource, compile_for_any_thread


@dataclass(frozen=True)
class FastPath:
    """How the fast body runs; every combination gives the same counts up to rounding."""

    fused: bool = False  # Triton front end (noise + patch embedding in one kernel)
    compile: bool = False  # torch.compile the body
    # 'default': max-autotune-no-cudagraphs is no faster and autotunes every matrix product at each start
    compile_mode: str = "default"
    cuda_graphs: bool = False  # capture front end + body + counting, replay per batch
    # fp16/bf16 torch bodies: False runs weights cast to the precision (as exported engines: no per-batch
    # casts, half the activation bytes); True keeps fp32 weights under autocast, as the plain body does
    autocast: bool = False

    def describe(self) -> str:
        parts = [name for name, on in (("fused", self.fused), ("compiled", self.compile),
                                       ("cuda-graphs", self.cuda_graphs), ("autocast", self.autocast)) if on]
        return "+".join(parts) or "eager"


def _front_and_body(engine: Engine) -> tuple[SmoothingClassifier, TokenBody | None]:
    """(the classifier whose front end makes the tokens, the token engine that runs the body or None: its own)."""
    if engine.model is not None:
        return engine.model, None
    token_body = engine.token_body()
    if token_body is not None:
        return token_body.front_end, token_body
    raise UserError(f"the fast path (--fast-parts, --profile) needs a PyTorch checkpoint or "
                    f"a token engine (dmae-export --input tokens), not {engine.description}")


class FastBody:
    """A batch body (:class:`~dmae_fast.batching.scheduler.BatchBody`) for PyTorch classifiers and token engines."""

    def __init__(self, smoothing: Smoothing, options: FastPath = FastPath(), timer: StageTimer | None = None,
                 noise: NoiseSource | None = None) -> None:
        engine = smoothing.engine
        self.model, self.token_body = _front_and_body(engine)
        self.noise = noise or NoiseSource(engine.device, grid=smoothing.grid)  # the unfused front end's noise
        self.device, self.spec, self.precision = engine.device, engine.spec, engine.precision
        self.smoothing, self.timer = smoothing, timer
        self.options = self._available(options)
        self.dtype = PRECISIONS[engine.precision] if self.token_body is None else None  # engines take fp32
        # the body's weights: cast once to fp16/bf16 or fp8 (the front end and E stay on the fp32 classifier)
        cast = self.dtype is not None and (engine.precision == "fp8" or not self.options.autocast)
        cast_model = engine.cast_model() if cast else None
        self._body_model = self.model if cast_model is None else cast_model
        self._autocast_dtype = None if cast else self.dtype
        if self.token_body is None:
            self._description = f"torch {self.options.describe()} {engine.precision} on {self.device}"
        else:
            front = "fused" if self.options.fused else "unfused"
            graphs = " + cuda-graphs" if self.options.cuda_graphs else ""
            self._description = f"{front} front end{graphs} + {engine.description}"
        if self.options.fused:
            from dmae_fast.kernels import fused_frontend

            self._fused_tokens = fused_frontend.fused_tokens
            token_dtype = self.dtype or torch.float32
            self._front = self.model.fused_front_end(smoothing.sigma).cast(token_dtype)
            self._tokens = torch.empty((smoothing.batch_size, 1 + self._front.num_patches, self._front.embed_dim),
                                       dtype=token_dtype, device=self.device)
        forward = self._classify_tokens if self.options.fused else self._classify_images
        self._classify = compile_for_any_thread(forward, mode=self.options.compile_mode, dynamic=False) \
            if self.options.compile else forward
        self._graph: torch.cuda.CUDAGraph | None = None

    @property
    def description(self) -> str:
        return self._description if self.options.fused else f"{self._description}, {self.noise.description}"

    def _available(self, options: FastPath) -> FastPath:
        """Drop what this classifier, engine or machine cannot do, saying so in one line each."""
        if options.fused:
            reason = self.spec.fused_unsupported_reason
            if reason is None and self.noise.grid is not None:
                reason = ("--sound: its tokens E(x) + W eta are no function of the grid sum X + Z; the unfused "
                          "front end embeds the noisy grid image itself")
            if reason is None:
                try:
                    from dmae_fast.kernels import fused_frontend
                except ImportError:
                    reason = "triton is not installed"
                else:
                    if self.device.type != "cuda" and not fused_frontend.INTERPRETED:
                        reason = (f"its Triton kernels are compiled for the GPU in this process, not for "
                                  f"{self.device}; TRITON_INTERPRET=1 before the start runs them on the CPU, slowly")
            if reason is not None:
                print_notice(f"fused front end unavailable ({reason}); using the unfused front end")
                options = dataclasses.replace(options, fused=False)
        if options.compile and self.token_body is not None:
            print_notice(f"torch.compile off ({self.token_body.file.name} is compiled already)")
            options = dataclasses.replace(options, compile=False)
        if options.compile and self.precision == "fp8" and options.compile_mode.startswith("max-autotune"):
            print_notice(f"fp8: torch.compile mode 'default' instead of {options.compile_mode!r} (autotuning the "
                         "fp8 matrix products takes minutes)")
            options = dataclasses.replace(options, compile_mode="default")
        if options.cuda_graphs:
            why = None
            if self.device.type != "cuda":
                why = "no CUDA device"
            elif self.timer is not None:
                why = "profiling times each stage"
            elif self.token_body is not None and self.token_body.kind != "aoti":
                why = f"{self.token_body.kind} engines are not captured; .pt2 engines are"
            if why is not None:
                print_notice(f"CUDA graphs off ({why})")
                options = dataclasses.replace(options, cuda_graphs=False)
        return options

    def _autocast(self):
        dtype = self._autocast_dtype
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        """Buffers for a run, plus one padding slot that padded rows point at. A run with the layout of the
        previous one keeps its buffers and its captured graph (counts zeroed): capturing costs a few batches."""
        if self._graph is not None and self._padding_slot == num_slots and torch.equal(self._phase_ids, phase_ids):
            self._counts.zero_()
            return self._counts[:num_slots]
        self._padding_slot = num_slots
        self._phase_ids = phase_ids
        shape = (self._front.num_patches, self._front.embed_dim) if self.options.fused else self.spec.input_shape
        self._slots = torch.zeros((num_slots + 1, *shape), device=self.device)
        self._counts = zero_counts(num_slots + 1, len(phase_ids), self.spec.num_classes, self.device)
        self._rows = torch.zeros((4, self.smoothing.batch_size), dtype=torch.int64, device=self.device)
        self._rows[0] = num_slots
        self._ones = torch.ones(self.smoothing.batch_size, dtype=torch.int64, device=self.device)
        self._kept: torch.Tensor | None = None
        self._graph = None
        return self._counts[:num_slots]

    def keep_classes(self, num_slots: int, samples: int) -> torch.Tensor:
        """Also keep each row's class of the first ``samples`` estimation samples of every image (the padding slot's
        rows are selection rows: never kept); a graph captured without it is captured again."""
        self._kept = zero_kept(num_slots + 1, samples, self.device)
        self._graph = None
        return self._kept[:num_slots]

    @torch.no_grad()
    def load(self, slot: int, image: torch.Tensor) -> None:
        with stage(self.timer, "front end"):
            if self.options.fused:
                self._slots[slot] = self.model.clean_embedding(image.to(self.device, non_blocking=True)[None])[0]
            else:
                self._slots[slot].copy_(image, non_blocking=True)

    def finish(self) -> None:
        """Nothing to undo after a run (``allocate`` drops a captured graph before the next)."""

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        """Pad the rows to the full batch in the static buffer, then run (or replay) the step."""
        rows = len(slot)
        self._rows[:, rows:] = 0
        self._rows[0, rows:] = self._padding_slot
        for target, column in zip(self._rows, (slot, index, position, sample)):
            target[:rows].copy_(column)
        count_batch(self.timer)
        if not self.options.cuda_graphs:
            self._step()
        elif self._graph is None:
            self._capture()
        else:
            self._graph.replay()

    @torch.no_grad()
    def _step(self) -> None:
        slot, index, position, sample = self._rows
        phase = self._phase_ids[position]
        with stage(self.timer, "front end"):
            if self.options.fused:
                inputs = self._fused_tokens(self._front, self._slots, slot, index, phase, sample, self.smoothing.seed,
                                            out=self._tokens)
            else:
                inputs = self.noise(self._slots, slot, self.smoothing.sigma, self.smoothing.seed, index, phase, sample)
        with stage(self.timer, "body"):
            predicted = self._classify(inputs)
        with stage(self.timer, "counting"):
            count(self._counts, slot, position, predicted, self._ones)
            if self._kept is not None:
                keep_class(self._kept, slot, phase, sample, predicted)

    def _classify_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.token_body is not None:
            return self.token_body.engine.classify(tokens)
        with self._autocast():
            return predicted_classes(self._body_model.forward_tokens(tokens))

    def _classify_images(self, images: torch.Tensor) -> torch.Tensor:
        if self.token_body is not None:
            return self.token_body.engine.classify(self.model.tokens(images))
        with self._autocast():
            return predicted_classes(self._body_model(images.to(self.dtype or images.dtype)))

    def _capture(self) -> None:
        """Warm up (compiling, autotuning) on the real rows, then capture the step and replay it; the
        warm-up batches count into a copy that is restored, so the capture adds nothing."""
        saved = self._counts.clone(), None if self._kept is None else self._kept.clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._step()
        self._counts.copy_(saved[0])
        if self._kept is not None:
            self._kept.copy_(saved[1])
        self._graph.replay()
