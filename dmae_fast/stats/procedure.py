"""The procedures: ``Procedure(ProcedureSpec(...))`` is the registered procedure a spec asks for.

Importing this module registers the built-in ones: :mod:`.predict_procedure`, :mod:`.fixed_n_procedure` and
:mod:`.sequential_procedure`. A new procedure is one more module that subclasses :class:`~.procedure_base.Procedure`
and registers it (:func:`~.procedure_base.register`); nothing else names it."""

from __future__ import annotations

from dmae_fast.stats import fixed_n_procedure, predict_procedure, sequential_procedure  # noqa: F401 (registers them)
from dmae_fast.stats.procedure_base import (
    CERTIFY,
    PREDICT,
    PROCEDURES,
    Procedure,
    ProcedureSpec,
    register,
    registered,
)
from dmae_fast.stats.sequential_procedure import sequential_certifier

__all__ = ["CERTIFY", "PREDICT", "PROCEDURES", "Procedure", "ProcedureSpec", "register", "registered",
           "sequential_certifier"]
