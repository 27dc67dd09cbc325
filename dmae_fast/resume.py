"""Checking the rows of a results file before a run continues it (``--resume``).

A resumed run keeps the rows already on disk, so they must be rows this very run would
have written: images of this run, each once, made with its settings, and each row
consistent with its own counts (the radius and pA_lower recomputed from nA, n, the
procedure's alpha and sigma; the PREDICT decision from its p-value). A row that fails is
refused with one line: the file was edited, or belongs to another run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dmae_fast.certification.bounds import (
    lower_confidence_bound,
    radius,
    top_two_pvalue,
)
from dmae_fast.errors import UserError
from dmae_fast.results import ABSTAIN, P_LOWER_DECIMALS, RADIUS_DECIMALS, ResultsTable

if TYPE_CHECKING:
    from dmae_fast.certification.core import Certificate

# Recomputed values may differ from the written ones by the writer's rounding down, plus
# the last digits of another SciPy's quantile functions.
RADIUS_SLACK = 2 * 10.0**-RADIUS_DECIMALS
BOUND_SLACK = 2 * 10.0**-P_LOWER_DECIMALS


@dataclass(frozen=True)
class RowRules:
    """What every kept row must satisfy: the run's kind, sample counts, level and sigma."""

    kind: str  # "certify" or "predict"
    n0: int
    sizes: tuple[int, ...]  # allowed n (one for fixed n; every look for sequential runs)
    level: float  # the Clopper-Pearson level of the bound (alpha, or alpha / K) or PREDICT's alpha
    sigma: float
    procedure: str | None  # the `procedure` column (certify only)
    # (nA, n) -> the Certificate the procedure gives (grid-radius procedures); None: Clopper-Pearson at level
    certificate: Callable[[int, int], Certificate] | None = None


def check_kept_rows(table: ResultsTable, indices: Collection[int], labels: dict[int, int] | None,
                    rules: RowRules) -> None:
    """Refuse (UserError) any kept row that this run would not have written."""
    where = f"--resume: {table.path}"
    if table.kind != rules.kind:
        raise UserError(f"{where} is a {table.kind} file, this run writes {rules.kind} rows")
    repeated = table.duplicate_indices()
    if repeated:
        raise UserError(f"{where}: image idx {repeated[0]} appears in more than one row; remove the repeated "
                        "rows or start over with --overwrite")
    wanted = set(indices)
    for row in range(len(table)):
        problem = _row_problem(table, row, wanted, labels, rules)
        if problem:
            raise UserError(f"{where}: the row of image idx {table.idx[row]} {problem}: the file was edited or "
                            "comes from another run (remove the row, or start over with --overwrite)")


def _row_problem(table: ResultsTable, row: int, wanted: set[int], labels: dict[int, int] | None,
                 rules: RowRules) -> str | None:
    extra = {name: values[row] for name, values in table.extra.items()}
    idx, label, predict = int(table.idx[row]), int(table.label[row]), int(table.predict[row])
    checks = [
        (idx in wanted, "is not one of this run's images (--skip/--max or another data set)"),
        (labels is None or labels.get(idx) == label, f"has label {label}, the data set says {labels and labels.get(idx)}"),
        (int(table.correct[row]) == int(predict == label), "has a 'correct' that contradicts predict and label"),
        (all(k in extra for k in _NEEDED[rules.kind]), f"lacks the columns {', '.join(_NEEDED[rules.kind])}"),
    ]
    for ok, problem in checks:
        if not ok:
            return problem
    if not math.isclose(float(extra["sigma"]), rules.sigma, rel_tol=1e-12):
        return f"was made with sigma {extra['sigma']}, this run uses {rules.sigma}"
    n = int(extra["n"])
    if n not in rules.sizes:
        return f"has n = {n}, this run uses {' or '.join(map(str, rules.sizes))}"
    if rules.kind == "predict":
        return _predict_problem(predict, n, int(extra["count1"]), int(extra["count2"]), float(extra["pvalue"]), rules)
    if int(extra["n0"]) != rules.n0 or str(extra["procedure"]) != rules.procedure:
        return f"was made with n0 {extra['n0']} and procedure {extra['procedure']}, not {rules.n0} and {rules.procedure}"
    return _certify_problem(predict, float(table.radius[row]), n, int(extra["nA"]), float(extra["pA_lower"]), rules)


_NEEDED = {"certify": ("n0", "n", "nA", "pA_lower", "sigma", "procedure"),
           "predict": ("n", "count1", "count2", "pvalue", "sigma")}


def _certify_problem(predict: int, written_radius: float, n: int, n_a: int, written_bound: float,
                     rules: RowRules) -> str | None:
    if not 0 <= n_a <= n:
        return f"has nA = {n_a} outside [0, n = {n}]"
    if rules.certificate is None:  # Clopper-Pearson at the rules' level
        bound = lower_confidence_bound(n_a, n, rules.level)
        abstains, exact = bound < 0.5, 0.0 if predict == ABSTAIN else radius(bound, rules.sigma)
    else:  # a grid-radius procedure: its own certificate
        expected = rules.certificate(n_a, n)
        bound, abstains, exact = expected.p_a_lower, expected.prediction == ABSTAIN, expected.radius
    if not bound - BOUND_SLACK <= written_bound <= bound + 1e-12:
        return f"has pA_lower {written_bound}, its counts give {bound:.10f}"
    if (predict == ABSTAIN) != abstains:
        return "abstains where its counts certify" if predict == ABSTAIN else "certifies where its counts abstain"
    if not exact - RADIUS_SLACK <= written_radius <= exact + 1e-12:
        return f"has radius {written_radius}, its counts give {exact:.6f}"
    return None


def _predict_problem(predict: int, n: int, count1: int, count2: int, written: float, rules: RowRules) -> str | None:
    if not (0 <= count2 <= count1 and count1 + count2 <= n):
        return f"has counts {count1}, {count2} that do not fit n = {n}"
    pvalue = top_two_pvalue(count1, count2)
    if not pvalue * (1 - 1e-9) <= written <= pvalue * (1 + 2e-5) + 1e-300:
        return f"has p-value {written}, its counts give {pvalue:.6g}"
    if (predict == ABSTAIN) != (pvalue > rules.level):
        return "abstains where its p-value decides" if predict == ABSTAIN else "predicts where its p-value abstains"
    return None


def dataset_labels(dataset: object, indices: Collection[int]) -> dict[int, int] | None:
    """The labels of ``indices`` when the data set holds them in memory (None otherwise)."""
    for name in ("labels", "targets"):
        values = getattr(dataset, name, None)
        if values is not None:
            values = np.asarray(values)
            return {i: int(values[i]) for i in indices}
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        return {i: int(samples[i][1]) for i in indices}
    return None
