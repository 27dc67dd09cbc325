"""The classifier a body smooths, opened the same way by dmae-certify, dmae-serve and ``dmae-serve replay``
(:func:`open_classifier`), and the one rule for the sigma it is smoothed at (:func:`smoothing_sigma`)."""

from __future__ import annotations

from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.engines.base import Engine
from dmae_fast.engines.opening import EngineOptions, open_engine
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX, read_sidecar
from dmae_fast.model.config import parse_normalization, sigma_problem


def _engine_input(path: str, options: BodyOptions) -> str:
    """"tokens" for a token engine file when the fast body is asked for (its front end feeds it),
    else "image" (a token engine is then refused in one line)."""
    file = Path(path)
    if options.body == "fast" and file.suffix in KIND_BY_SUFFIX and file.is_file():
        return read_sidecar(file).input
    return "image"


def open_classifier(path: str, options: BodyOptions, device: str = "auto", precision: str = "auto",
                    input_size: int | None = None, normalize: str | None = None) -> Engine:
    """Open the classifier ``path`` (a checkpoint or engine file) for the body ``options`` ask for."""
    mean, std = parse_normalization(normalize)
    return open_engine(path, EngineOptions(device, precision, input_size, mean, std, _engine_input(path, options)))


def smoothing_sigma(given: float | None, engine: Engine) -> float:
    """``given``, else the sigma the classifier records, checked like ``--sigma``."""
    if given is None and engine.spec.sigma is None:
        raise UserError("--sigma is required: the checkpoint does not record the sigma it was trained for")
    sigma = float(given if given is not None else engine.spec.sigma)
    problem = sigma_problem(sigma)
    if problem is not None:
        raise UserError(f"--{problem}")
    return sigma
