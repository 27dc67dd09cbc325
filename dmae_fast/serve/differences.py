"""What a replay finds different from an answer, in words: one line each, JSON values as the answer writes them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

import numpy as np

from dmae_fast.batching.stream import SamplingPlan


def text(value: object, limit: int | None = 60) -> str:
    """A JSON value as an answer writes it (cut to ``limit`` characters)."""
    written = json.dumps(value)
    return written if limit is None or len(written) <= limit else written[: limit - 3] + "..."


def describe(plan: SamplingPlan) -> str:
    """A plan in words: "20 selection and 1,000 estimation samples, looks after 120, 220, ... in all"."""
    words = " and ".join(f"{size:,} {phase.name.lower()}" for phase, size in zip(plan.phases, plan.sizes)) + " samples"
    if plan.looks:
        looks = [f"{look:,}" for look in plan.looks]
        shown = looks if len(looks) <= 6 else [*looks[:3], "...", looks[-1]]
        words += f", looks after {', '.join(shown)} samples in all"
    return words


def fit_problem(plan: SamplingPlan, counts: np.ndarray, num_classes: int) -> str | None:
    """Why served counts cannot be the plan's (None when they can: a stopping point of it)."""
    if counts.shape[1] != num_classes:
        return f"counts served for {counts.shape[1]} classes; the classifier has {num_classes}"
    sums, left, filled = counts.sum(1).tolist(), int(counts.sum()), []
    for size in plan.sizes:
        filled.append(min(size, left))
        left -= filled[-1]
    if sum(sums) in plan.stage_ends and sums == filled:
        return None
    served = " and ".join(f"{total:,} {phase.name.lower()}" for phase, total in zip(plan.phases, sums))
    return f"counts served hold {served} samples, where the receipt's plan ({describe(plan)}) does not stop"


def counts_difference(plan: SamplingPlan, served: np.ndarray, offline: np.ndarray) -> str:
    parts = [f"{phase.name.lower()} class {c} served {served[p, c]:,}, recomputed {offline[p, c]:,}"
             for p, phase in enumerate(plan.phases) for c in np.flatnonzero(served[p] != offline[p])]
    return "DIFFERENT counts: " + "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")


def field_differences(name: str, stated: dict, expected: dict) -> list[str]:
    """Each decision field the result states that is not the one recomputed (missing and extra ones too; the
    counts are compared with the offline ones)."""
    extra = sorted(set(stated) - set(expected) - {"index", "input_sha256"})
    keys = [key for key in expected if key != "counts"] + extra
    return _differences(keys, stated, expected, "", lambda key: f"states '{key}', which a {name} answer does not have")


def receipt_differences(keys: Iterable[str], stated: dict, expected: dict, name: str) -> list[str]:
    """Each of the receipt's ``keys`` that ``stated`` does not have as ``expected`` does."""
    return _differences(keys, stated, expected, "receipt ",
                        lambda key: f"the receipt states '{key}', which a {name} receipt does not have")


def _differences(keys: Iterable[str], stated: dict, expected: dict, prefix: str,
                 extra: Callable[[str], str]) -> list[str]:
    """Each of ``keys`` that ``stated`` is missing or has other than ``expected``, or has where ``expected`` has
    not (in words ``extra(key)``)."""
    out = []
    for key in keys:
        if key in expected and key not in stated:
            out.append(f"{prefix}{key} missing, recomputed {text(expected[key])}")
        elif key in expected and text(stated[key], None) != text(expected[key], None):
            out.append(f"{prefix}{key} served {text(stated[key])}, recomputed {text(expected[key])}")
        elif key in stated and key not in expected:
            out.append(extra(key))
    return out
