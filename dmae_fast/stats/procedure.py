"""The procedures: ``Procedure(ProcedureSpec(...))`` is the registered procedure a spec asks for.

Importing this module registers the built-in ones: :mod:`.predict_procedure`, :mod:`.fixed_n_procedure`,
:mod:`.sequential_procedure` and :mod:`.incremental_procedure`. A new procedure is one more module that subclasses
:class:`~.procedure_base.Procedure` and registers it (:func:`~.procedure_base.register`); nothing else names it."""

from __future__ import annotations

from dmae_fast.stats import (  # noqa: F401 (registers them)
    fixed_n_procedure,
    incremental_procedure,
    predict_procedure,
    sequential_procedure,
)
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
