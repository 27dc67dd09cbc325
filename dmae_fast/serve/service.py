"""The smoothed classifier as a service object: the engine, the scheduler, and one request's answer.

No HTTP here (that is :mod:`.app`): a notebook can start a :class:`Service` and ``await
service.answer(parsed_request)`` as the server does.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import platform
import secrets
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from dmae_fast import __version__
from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import file_sha256
from dmae_fast.batching.bodies import resolve_body
from dmae_fast.batching.classifier import open_classifier, smoothing_sigma
from dmae_fast.batching.scheduler import Job
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.noise.sound_options import Sound
from dmae_fast.run.host import device_name
from dmae_fast.serve.config import ServeConfig
from dmae_fast.serve.device_thread import DeviceThread, default_slots
from dmae_fast.serve.metrics import Metrics
from dmae_fast.serve.payloads import ParsedRequest
from dmae_fast.stats.decisions import ABSTAIN
from dmae_fast.stats.procedure import Procedure
from dmae_fast.stats.rounded_gaussian import guarantee, sound_table

MAX_TOKEN_BYTES = 4096


class RequestTimeout(Exception):
    """The request was not answered within the server's per-request timeout (504)."""


def read_token(path: str) -> str:
    """The bearer token in ``path``: one line of printable ASCII without spaces (UserError otherwise)."""
    try:
        raw = Path(path).read_bytes()[: MAX_TOKEN_BYTES + 1]
    except OSError as error:
        raise UserError(f"cannot read --token-file {path}: {error.strerror or error}") from None
    token = raw.decode("ascii", errors="replace").strip()
    if not token or len(raw) > MAX_TOKEN_BYTES or not all(33 <= ord(c) < 127 for c in token):
        raise UserError(f"--token-file {path} must hold one token of printable ASCII without spaces "
                        f"(at most {MAX_TOKEN_BYTES} bytes)")
    return token


def input_sha256(image: torch.Tensor) -> str:
    """The SHA-256 of the float32 [C, H, W] tensor that was smoothed (C order)."""
    return hashlib.sha256(image.to(torch.float32).contiguous().numpy().tobytes()).hexdigest()


def sound_guarantee(procedure: Procedure, grid: int, elements: int) -> dict:
    """What each image of a ``--sound`` answer may fail with: the rounded Gaussian's total variation over the
    plan's total samples (the most an image can draw, a sequential answer's cap included) and alpha plus it."""
    stated = guarantee(sound_table(procedure.spec.sigma, grid), procedure.plan.total, elements, procedure.spec.alpha)
    return {"tv_per_image": stated["tv_per_image"], "failure_probability": stated["failure_probability"]}


def sound_receipt(procedure: Procedure, sound: Sound, elements: int) -> dict:
    """The fields a ``--sound`` receipt adds: the grid, ``--quantize`` (and what it certifies), the guarantee."""
    rounded = {"certified_image": f"rounded onto the 1/{sound.grid} grid: each certificate and its input_sha256 "
                                  "are for the rounded image"} if sound.quantize else {}
    return {"sound_grid": sound.grid, "sound_quantize": sound.quantize, **rounded,
            **sound_guarantee(procedure, sound.grid, elements)}


class Service:
    """One classifier served (see the module doc); ``start`` runs the warm-up batch, ``stop`` drains."""

    def __init__(self, config: ServeConfig) -> None:
        config.validate()
        self.token = read_token(config.token_file) if config.token_file else None
        self.engine = open_classifier(config.engine_path, config.body, config.device, config.precision,
                                      config.input_size, config.normalize)
        self.model_sha256 = file_sha256(config.engine_path) if Path(config.engine_path).is_file() else None
        # resolved once, here: sigma (the classifier's where none is given), precision, and the seed, drawn only
        # now that the classifier is opened and hashed (one made knowing the seed could forge answers)
        self.config = config = replace(
            config, sigma=smoothing_sigma(config.sigma, self.engine), precision=self.engine.precision,
            seed=config.seed if config.seed is not None else secrets.randbits(64))
        self.shape = tuple(self.engine.spec.input_shape)
        self.smoothing = Smoothing(self.engine, config.sigma, config.seed, config.batch, config.sound)
        self.resolved = resolve_body(self.smoothing, config.body)
        self.body = self.resolved.body
        slots = config.slots or default_slots(config.batch, math.prod(self.shape))
        self.device_thread = DeviceThread(
            self.body, self.engine.device, self.shape, config.batch, config.max_wait_ms / 1000, slots,
            config.max_queue, config.first_index, on_batch=lambda rows, seconds: self.metrics.on_batch(rows, seconds))
        self.metrics = Metrics(self.device_thread.stats, config.batch)
        self.draining = False

    def start(self) -> None:
        self.device_thread.start()

    def stop(self) -> None:
        """Refuse new work, finish what was admitted (within the request timeout), stop the device thread."""
        self.draining = True
        self.device_thread.close(self.config.limits.timeout_s)

    @property
    def model_info(self) -> dict:
        spec, config = self.engine.spec, self.config
        return {
            "engine": self.body.description,
            "body": self.resolved.record(),
            "model": Path(config.engine_path).name,
            "model_sha256": self.model_sha256,
            "precision": self.engine.precision,
            "device": device_name(self.engine.device),
            "sigma": config.sigma,
            "sound": None if config.sound is None else config.sound.record(),
            "input_shape": list(self.shape),
            "num_classes": spec.num_classes,
            "class_names": list(spec.class_names) if spec.class_names else None,
            "seed": config.seed,
            "image_indices": "random" if config.first_index is None else f"consecutive from {config.first_index}",
            "batch": config.batch,
            "max_wait_ms": config.max_wait_ms,
            "defaults": asdict(config.defaults),
            "limits": {**asdict(config.limits), "max_queue": config.max_queue},
            "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()},
        }

    async def answer(self, request: ParsedRequest) -> dict:
        """Run one request through the scheduler; its JSON answer (raises QueueFull, Closed, RequestTimeout...)."""
        procedure = Procedure(request.spec)
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in request.images]
        jobs = [Job(image, procedure.plan, procedure.decide) for image in request.images]
        self.device_thread.submit(jobs, [functools.partial(loop.call_soon_threadsafe, _settle, f) for f in futures])
        gathered = asyncio.gather(*futures)
        gathered.add_done_callback(_retrieved)  # cancelled in wait_for, it holds a CancelledError nobody reads
        try:
            counts = await asyncio.wait_for(gathered, self.config.limits.timeout_s)
        except asyncio.TimeoutError:
            self.device_thread.cancel(jobs)
            raise RequestTimeout(f"not answered within the server's timeout of {self.config.limits.timeout_s:g} s; "
                                 "its samples were dropped") from None
        except BaseException:
            self.device_thread.cancel(jobs)
            raise
        names, sound = self.engine.spec.class_names, self.config.sound
        stated = {} if sound is None else sound_guarantee(procedure, sound.grid, math.prod(self.shape))
        rounded = [None] * len(jobs) if request.rounded is None else request.rounded  # --quantize: what it changed
        results = [{"index": job.index, "input_sha256": input_sha256(job.image), **json_result(procedure, c, names),
                    **stated, **({} if changed is None else {"rounded": changed})}
                   for job, c, changed in zip(jobs, counts, rounded)]
        self.metrics.images.labels(procedure.kind).inc(len(results))
        receipt = {"seed": self.config.seed, "engine": self.body.description, "model_sha256": self.model_sha256,
                   "precision": self.engine.precision, "dmae_fast": __version__,
                   **({} if sound is None else sound_receipt(procedure, sound, math.prod(self.shape))),
                   **procedure.receipt(), "indices": [job.index for job in jobs]}
        return {"procedure": procedure.name, "results": results, "receipt": receipt}


def json_result(procedure: Procedure, counts: np.ndarray, class_names: tuple[str, ...] | None) -> dict:
    """One image's JSON answer: its counts per phase and its procedure's result, rendered."""
    out = {"counts": {phase.name.lower(): row.tolist() for phase, row in zip(procedure.plan.phases, counts)},
           **procedure.fields(procedure.result(counts))}
    out["abstain"] = out["prediction"] == ABSTAIN
    out["class_name"] = None if out["abstain"] or class_names is None else class_names[out["prediction"]]
    return out


def _retrieved(future: asyncio.Future) -> None:
    """Mark ``future``'s exception as seen (asyncio logs one nobody retrieved when the future is freed)."""
    if not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future, result: object) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(np.asarray(result))
