"""A classifier opened for smoothing (:func:`open_smoother`): what dmae-certify, dmae-serve and
``dmae-serve replay`` open the same way: the engine, the sigma and the batch body."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.batching.bodies import ResolvedBody, resolve_body
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.batching.stage_timer import StageTimer
from dmae_fast.engines import Engine, EngineOptions, open_engine
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX, read_sidecar
from dmae_fast.model.config import parse_normalization, sigma_problem


@dataclass(frozen=True)
class Smoother:
    """An engine, the sigma it smooths at and the body options it runs with."""

    engine: Engine
    sigma: float
    options: BodyOptions

    def body(self, seed: int, batch: int, timer: StageTimer | None = None) -> ResolvedBody:
        """The batch body for ``seed`` and ``batch``, and why (:func:`resolve_body`)."""
        return resolve_body(self.engine, self.sigma, seed, batch, self.options, timer)


def _engine_input(path: str, options: BodyOptions) -> str:
    """"tokens" for a token engine file when the fast body is asked for (its front end feeds it),
    else "image" (a token engine is then refused in one line)."""
    file = Path(path)
    if options.body == "fast" and file.suffix in KIND_BY_SUFFIX and file.is_file():
        return read_sidecar(file).input
    return "image"


def open_smoother(path: str, sigma: float | None, options: BodyOptions, device: str = "auto",
                  precision: str = "auto", input_size: int | None = None, normalize: str | None = None) -> Smoother:
    """Open the classifier ``path`` (a checkpoint or engine file) to smooth at ``sigma`` (None: the
    sigma the checkpoint records) with the body ``options`` ask for."""
    mean, std = parse_normalization(normalize)
    engine = open_engine(path, EngineOptions(device, precision, input_size, mean, std, _engine_input(path, options)))
    if sigma is None and engine.spec.sigma is None:
        raise UserError("--sigma is required: the checkpoint does not record the sigma it was trained for")
    sigma = sigma if sigma is not None else engine.spec.sigma
    problem = sigma_problem(sigma)  # the sigma a checkpoint or sidecar recorded is checked like --sigma
    if problem is not None:
        raise UserError(f"--{problem}")
    return Smoother(engine, float(sigma), options)
