"""Re-run a server's answer offline from its receipt: the library's streaming certifier, same counts.

An answer's ``receipt`` names the seed, the plan (phases, sizes, looks), alpha and sigma, and
each result its image index (the noise key) and the SHA-256 of the tensor that was smoothed.
The noise is a pure function of (seed, index, phase, sample), so the offline
:class:`~dmae_fast.certification.stream.StreamingCertifier` over ``[(index, image, label)]`` with
the same classifier gives the same class counts, whatever the batch size (``dmae-serve replay``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dmae_fast.certification.bodies import BodyOptions, batch_body
from dmae_fast.certification.procedure import CERTIFY, PREDICT, Procedure, ProcedureSpec
from dmae_fast.certification.sequential import BONFERRONI_NAME
from dmae_fast.certification.stream import SamplingPlan, StreamingCertifier
from dmae_fast.engines.base import Engine
from dmae_fast.errors import UserError
from dmae_fast.noise import Phase
from dmae_fast.serve.service import input_sha256


def plan_of(receipt: dict) -> SamplingPlan:
    """The sampling plan a receipt records."""
    try:
        return SamplingPlan(tuple(Phase[name] for name in receipt["phases"]), tuple(int(s) for s in receipt["sizes"]),
                            tuple(int(look) for look in receipt["looks"]))
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"not a dmae-serve receipt (phases, sizes, looks): {error}") from None


def procedure_of(receipt: dict) -> Procedure:
    """The procedure a receipt records (the server's: sequential CERTIFY with the library's defaults
    for its test); its plan and name must be the ones the receipt names."""
    plan = plan_of(receipt)
    try:
        name = str(receipt["procedure"])
        kind = PREDICT if name == PREDICT else CERTIFY
        n0 = None if kind == PREDICT else int(receipt["n0"])
        test = "bonferroni" if name.startswith(BONFERRONI_NAME) else "exact"
        spec = ProcedureSpec(kind, int(receipt["n"]), float(receipt["alpha"]), float(receipt["sigma"]), n0,
                             sequential=bool(plan.looks), test=test)
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"not a dmae-serve receipt (procedure, n0, n, alpha, sigma): {error}") from None
    procedure = Procedure(spec)
    if procedure.plan != plan or procedure.name != name:
        raise UserError(f"the receipt's procedure {name} with plan {plan} is not one this version runs "
                        f"({procedure.name}, {procedure.plan})")
    return procedure


def replay_counts(receipt: dict, index: int, image: torch.Tensor, engine: Engine, batch: int = 1000,
                  noise: str = "compiled", fast: bool = False) -> np.ndarray:
    """The class counts [phases, classes] of image ``index`` under the receipt's seed and procedure, offline."""
    procedure, seed = procedure_of(receipt), int(receipt["seed"])
    sigma = procedure.spec.sigma
    body = batch_body(engine, sigma, seed, batch, BodyOptions(fast=fast, noise=noise))
    streamer = StreamingCertifier(engine, procedure.plan, sigma, seed, batch, body)
    (done,) = streamer.run([(index, image, 0)], procedure.decide)
    return done.counts


@dataclass(frozen=True)
class Replayed:
    index: int
    same_input: bool  # the image's SHA-256 equals the answer's input_sha256
    same_counts: bool
    served: np.ndarray
    offline: np.ndarray


def replay_answer(answer: dict, images: list[torch.Tensor], engine: Engine, batch: int = 1000,
                  noise: str = "compiled", fast: bool = False) -> list[Replayed]:
    """Re-run every result of a server answer (``images`` in the order of its results)."""
    receipt, results = answer.get("receipt"), answer.get("results")
    if not isinstance(receipt, dict) or not isinstance(results, list):
        raise UserError("not a dmae-serve answer: it needs 'receipt' and 'results'")
    if len(images) != len(results):
        raise UserError(f"the answer has {len(results)} results but {len(images)} images were given")
    phases = [name.lower() for name in receipt["phases"]]
    out = []
    for result, image in zip(results, images):
        served = np.array([result["counts"][phase] for phase in phases], dtype=np.int64)
        offline = replay_counts(receipt, int(result["index"]), image, engine, batch, noise, fast)
        out.append(Replayed(int(result["index"]), input_sha256(image) == result.get("input_sha256"),
                            bool(np.array_equal(served, offline)), served, offline))
    return out
