"""Checking the rows of a results file before ``--resume`` continues it or ``dmae-certify analyze`` summarizes it:
they must be rows this very run would have written: its images, each once, made with its settings, each
consistent with its own counts (radius and pA_lower recomputed from nA, n, alpha and sigma; the PREDICT decision
from its p-value). ``analyze`` checks with the rules of the run record, or without one :meth:`RowRules.unknown`."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.model.config import MAX_SIGMA, sigma_problem
from dmae_fast.results.format import COLUMNS, P_LOWER_DECIMALS, RADIUS_DECIMALS, REQUIRED_COLUMNS, ResultsTable
from dmae_fast.results.writer import floor_decimals
from dmae_fast.stats.bounds import lower_confidence_bound, radius, top_two_pvalue
from dmae_fast.stats.decisions import ABSTAIN, bound_certificate
from dmae_fast.stats.rules import RowRules

# Recomputed values may differ from the written ones by the writer's rounding down and another SciPy's last digits.
RADIUS_SLACK = 2 * 10.0**-RADIUS_DECIMALS
BOUND_SLACK = 2 * 10.0**-P_LOWER_DECIMALS
# The largest double below 1: the largest alpha a run accepts, and the largest pA_lower with a finite radius.
BELOW_ONE = math.nextafter(1.0, 0.0)
# The columns a row needs to be checked against its counts: ours after the reference files' (which have none).
COUNT_COLUMNS = {kind: COLUMNS[kind][len(required):] for kind, required in REQUIRED_COLUMNS.items()}


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
    for row, problem in row_problems(table, rules, indices, labels):
        raise UserError(f"{where}: the row of image idx {table.idx[row]} {problem}: the file was edited or "
                        "comes from another run (remove the row, or start over with --overwrite)")


def row_problems(table: ResultsTable, rules: RowRules, indices: Collection[int] | None = None,
                 labels: dict[int, int] | None = None) -> Iterator[tuple[int, str]]:
    """(row, what is wrong with it) for each row of ``table`` that a run of ``rules`` would not have
    written, in file order; ``indices`` are the run's images and ``labels`` the data set's (None: unknown)."""
    wanted = None if indices is None else set(indices)
    for row in range(len(table)):
        problem = _row_problem(table, row, wanted, labels, rules)
        if problem:
            yield row, problem


def _row_problem(table: ResultsTable, row: int, wanted: set[int] | None, labels: dict[int, int] | None,
                 rules: RowRules) -> str | None:
    extra = {name: values[row] for name, values in table.extra.items()}
    idx, label, predict = int(table.idx[row]), int(table.label[row]), int(table.predict[row])
    needed = COUNT_COLUMNS[rules.kind]
    checks = [
        (wanted is None or idx in wanted, "is not one of this run's images (--skip/--max or another data set)"),
        (labels is None or labels.get(idx) == label,
         f"has label {label}, the data set says {labels and labels.get(idx)}"),
        (int(table.correct[row]) == int(predict == label), "has a 'correct' that contradicts predict and label"),
        (all(k in extra for k in needed), f"lacks the columns {', '.join(needed)}"),
    ]
    for ok, problem in checks:
        if not ok:
            return problem
    sigma = float(extra["sigma"])
    if rules.sigma is None:
        if sigma_problem(sigma) is not None:
            return f"has sigma {sigma}, outside (0, {MAX_SIGMA:g}]"
    elif not math.isclose(sigma, rules.sigma, rel_tol=1e-12):
        return f"was made with sigma {sigma}, this run uses {rules.sigma}"
    n = int(extra["n"])
    if n < 0 or (n == 0 and (predict != ABSTAIN or rules.kind == "predict")):  # see below for n = 0
        return f"has n = {n} samples"
    if rules.sizes is not None and n not in rules.sizes:
        return f"has n = {n}, this run uses {' or '.join(map(str, rules.sizes))}"
    if rules.kind == "predict":
        return _predict_problem(predict, n, int(extra["count1"]), int(extra["count2"]), float(extra["pvalue"]), rules)
    if rules.procedure is not None and ((rules.n0 is not None and int(extra["n0"]) != rules.n0)
                                        or str(extra["procedure"]) != rules.procedure):
        return (f"was made with n0 {extra['n0']} and procedure {extra['procedure']}, "
                f"not {rules.n0} and {rules.procedure}")
    if n == 0:  # an abstention that drew no sample (incremental CERTIFY's, the reference abstained): no claim
        return None
    problem = _certify_problem(idx, predict, float(table.radius[row]), n, int(extra["nA"]),
                               float(extra["pA_lower"]), sigma, rules)
    if problem is None and rules.grid_radius is not None and "grid_radius" in extra:
        grid = rules.grid_radius(int(extra["nA"]), n)
        if not grid - RADIUS_SLACK <= float(extra["grid_radius"]) <= grid + 1e-12:
            return f"has grid_radius {extra['grid_radius']}, its counts give {floor_decimals(grid, RADIUS_DECIMALS)}"
    return problem


def _certify_problem(idx: int, predict: int, written_radius: float, n: int, n_a: int, written_bound: float,
                     sigma: float, rules: RowRules) -> str | None:
    if not 0 <= n_a <= n:
        return f"has nA = {n_a} outside [0, n = {n}]"
    if rules.level is None:
        return _problem_at_any_alpha(predict, written_radius, n, n_a, written_bound, sigma)
    # Clopper-Pearson at the rules' level, or a grid-radius procedure's own certificate
    expected = (bound_certificate(0, 0, n_a, n, rules.level, rules.sigma) if rules.certificate is None
                else rules.certificate(idx, n_a, n))
    bound, abstains, exact = expected.p_a_lower, expected.prediction == ABSTAIN, expected.radius
    if not bound - BOUND_SLACK <= written_bound <= bound + 1e-12:
        return f"has pA_lower {written_bound}, its counts give {floor_decimals(bound, P_LOWER_DECIMALS)}"
    if (predict == ABSTAIN) != abstains:
        return "abstains where its counts certify" if predict == ABSTAIN else "certifies where its counts abstain"
    if not exact - RADIUS_SLACK <= written_radius <= exact + 1e-12:
        return f"has radius {written_radius}, its counts give {floor_decimals(exact, RADIUS_DECIMALS)}"  # as written
    return None


def _problem_at_any_alpha(predict: int, written_radius: float, n: int, n_a: int, written_bound: float,
                          sigma: float) -> str | None:
    """What a certify row proves whatever its run's alpha and procedure. Every procedure's pA_lower is
    at most the Clopper-Pearson bound at the largest alpha below 1 (a bound at alpha or alpha / K, or
    a grid level Phi(r / sigma) that its test rejects at alpha); it abstains exactly when pA_lower < 1/2;
    its radius is at most sigma * Phi^-1(pA_lower) of the bound before it was rounded down."""
    ceiling = lower_confidence_bound(n_a, n, BELOW_ONE)
    if not 0 <= written_bound <= ceiling + BOUND_SLACK:
        return f"has pA_lower {written_bound}, above {ceiling:.10f}, the most its counts give at any alpha"
    if (predict == ABSTAIN) != (written_bound < 0.5):
        return "abstains with pA_lower >= 0.5" if predict == ABSTAIN else "certifies with pA_lower < 0.5"
    most = 0.0 if predict == ABSTAIN else radius(min(written_bound + BOUND_SLACK, BELOW_ONE), sigma)
    if written_radius > most + RADIUS_SLACK:
        return f"has radius {written_radius}, above {most:.6f}, the most its pA_lower proves"
    return None


def _predict_problem(predict: int, n: int, count1: int, count2: int, written: float, rules: RowRules) -> str | None:
    if not (0 <= count2 <= count1 and count1 + count2 <= n):
        return f"has counts {count1}, {count2} that do not fit n = {n}"
    pvalue = top_two_pvalue(count1, count2)
    if not pvalue * (1 - 1e-9) <= written <= pvalue * (1 + 2e-5) + 1e-300:
        return f"has p-value {written}, its counts give {pvalue:.6g}"
    if rules.level is not None and (predict == ABSTAIN) != (pvalue > rules.level):
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
