"""What a ``dmae-serve`` process is: the classifier and its batch body, the scheduler's settings, the request limits
(no torch here: the command checks its options before loading anything)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dmae_fast.base.errors import raise_first
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.model.config import sigma_problem
from dmae_fast.noise.sound_options import Sound
from dmae_fast.run.config import MAX_BATCH
from dmae_fast.stats.settings import SMALLEST_SEQUENTIAL_ALPHA

PROG = "dmae-serve"
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; anything beyond is answered with a 4xx, never run."""

    max_body_bytes: int = 8 * MiB  # the HTTP body as sent (413 beyond)
    max_image_pixels: int = 16 * MiB  # width x height of an encoded image, checked before decoding (413)
    max_images: int = 64  # images in one request (413)
    max_n: int = 100_000  # PREDICT's n, CERTIFY's n (the cap with "sequential")
    max_n0: int = 10_000
    max_request_samples: int = 2_000_000  # sum over the request's images of n0 + n (413)
    min_alpha: float = 1e-12
    max_alpha: float = 0.5
    timeout_s: float = 60.0  # from admission to the answer (504 after, the request's rows are dropped)

    def validate(self) -> None:
        raise_first([
            (self.max_body_bytes >= 1024, f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}"),
            (self.max_image_pixels >= 1, f"--max-image-pixels must be >= 1, got {self.max_image_pixels}"),
            (self.max_images >= 1, f"--max-images must be >= 1, got {self.max_images}"),
            (1 <= self.max_n < 2**32, f"--max-n must be in [1, 2**32), got {self.max_n}"),
            (1 <= self.max_n0 < 2**32, f"--max-n0 must be in [1, 2**32), got {self.max_n0}"),
            (self.max_request_samples >= 1, f"--max-request-samples must be >= 1, got {self.max_request_samples}"),
            (0 < self.min_alpha <= self.max_alpha < 1,
             f"need 0 < --min-alpha <= --max-alpha < 1, got {self.min_alpha} and {self.max_alpha}"),
            (self.min_alpha >= SMALLEST_SEQUENTIAL_ALPHA,
             f"--min-alpha must be >= {SMALLEST_SEQUENTIAL_ALPHA:g} (the smallest alpha the sequential test can "
             f"calibrate), got {self.min_alpha}"),
            (math.isfinite(self.timeout_s) and self.timeout_s > 0,
             f"--timeout must be a finite number of seconds > 0, got {self.timeout_s}"),
        ])


@dataclass(frozen=True)
class Defaults:
    """Request parameters a request leaves out."""

    n0: int = 100
    n: int = 1_000
    alpha: float = 0.001


@dataclass(frozen=True)
class ServeConfig:
    """One server (the command line, resolved)."""

    engine_path: str  # checkpoint or engine file (``--ckpt/--engine``)
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the start line names it)
    batch: int = 1000  # noisy samples per forward pass
    max_wait_ms: float = 5.0  # a partial batch runs once its oldest row has waited this long
    max_queue: int = 256  # images admitted and not yet answered (429 beyond)
    slots: int | None = None  # images on the device at once (default: from the batch and the image size)
    token_file: str | None = None  # bearer token for /v1/* and /metrics
    seed: int | None = None  # None: a random 64-bit seed, drawn at start (every answer names it)
    first_index: int | None = None  # None: random indices; else consecutive from here (DeviceThread.submit)
    sigma: float | None = None  # None: the sigma the checkpoint records
    device: str = "auto"
    precision: str = "auto"
    input_size: int | None = None
    normalize: str | None = None
    body: BodyOptions = field(default_factory=BodyOptions)  # the batch body, as dmae-certify's
    sound: Sound | None = None  # --sound (and --quantize): the noise on the inputs' grid; None: Gaussian noise
    max_connections: int = 1024  # uvicorn answers 503 beyond
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this long
    read_timeout_s: float = 10.0  # to send a request's line and headers, then its body (408 and closed after)
    access_log: bool = False
    limits: Limits = field(default_factory=Limits)
    defaults: Defaults = field(default_factory=Defaults)

    def validate(self) -> None:
        self.limits.validate()
        raise_first([
            (0 <= self.port <= 65535, f"--port must be in [0, 65535], got {self.port}"),
            (1 <= self.batch <= MAX_BATCH, f"--batch must be in [1, {MAX_BATCH:,}], got {self.batch}"),
            (math.isfinite(self.max_wait_ms) and 0 <= self.max_wait_ms <= 60_000,
             f"--max-wait-ms must be in [0, 60000], got {self.max_wait_ms}"),
            (self.max_queue >= 1, f"--max-queue must be >= 1, got {self.max_queue}"),
            (self.slots is None or self.slots >= 1, f"--slots must be >= 1, got {self.slots}"),
            (self.seed is None or 0 <= self.seed < 2**64, f"--seed must be in [0, 2**64), got {self.seed}"),
            (self.first_index is None or 0 <= self.first_index < 2**32,
             f"--first-index must be in [0, 2**32), got {self.first_index}"),
            (self.sigma is None or sigma_problem(self.sigma) is None, f"--{sigma_problem(self.sigma)}"),
            (self.input_size is None or self.input_size >= 1, f"--input-size must be >= 1, got {self.input_size}"),
            (self.max_connections >= 1, f"--max-connections must be >= 1, got {self.max_connections}"),
            (math.isfinite(self.keep_alive_s) and 0 < self.keep_alive_s <= 3600,
             f"--keep-alive must be in (0, 3600] seconds, got {self.keep_alive_s}"),
            (math.isfinite(self.read_timeout_s) and 0 < self.read_timeout_s <= 3600,
             f"--read-timeout must be in (0, 3600] seconds, got {self.read_timeout_s}"),
            (1 <= self.defaults.n0 <= self.limits.max_n0, f"--n0 must be in [1, --max-n0], got {self.defaults.n0}"),
            (1 <= self.defaults.n <= self.limits.max_n, f"--n must be in [1, --max-n], got {self.defaults.n}"),
            (self.limits.min_alpha <= self.defaults.alpha <= self.limits.max_alpha,
             f"--alpha must be in [--min-alpha, --max-alpha], got {self.defaults.alpha}"),
        ])
        self.body.validate()
        if self.sound is not None:
            self.sound.validate(self.sigma)
