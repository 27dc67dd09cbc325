"""Issue 59, evidence 2 by simulation: ``--disagreement-rate`` (each image's paired samples chosen by
``IncrementalCertify`` from its reference row: the fewest of 5, 10, 20 and 50% of n that keep the reference's 0.25
step at the disagreements the rate predicts, each bound at alpha_zeta / 4; from scratch where none does) on the
population and derived engine of ``2026-12-07-incremental/population_savings.py``, with the votes kept for all n
estimation samples. The rate given is the engine's true rate d (what an agreement check measures).

    python bench/experiments/2026-12-07-keep-votes/adaptive_savings.py \
        > bench/results/2026-12-07-keep-votes/adaptive-savings.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from dmae_fast.stats.decisions import ABSTAIN, Certificate
from dmae_fast.stats.incremental import derived_lower_bounds, disagreement_upper_bounds
from dmae_fast.stats.incremental_procedure import IncrementalCertify
from dmae_fast.stats.procedure import CERTIFY, ProcedureSpec


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "2026-12-07-incremental"))  # the fixed rules' set-up
    from population_savings import ALPHA, ALPHA_ZETA, N0, REPS, SEED, radii, settings, summary

    rng = np.random.default_rng(SEED)
    print(f"simulated population x {REPS}; n0 {N0}, alpha {ALPHA}, alpha_zeta {ALPHA_ZETA}; --disagreement-rate d "
          "on votes kept for all n samples; against a from-scratch run of the derived engine")
    for case in settings(rng):
        d, sigma, n, ref_lower = case.d, case.sigma, case.n, case.ref_lower
        ref_radius = radii(ref_lower, sigma)
        certificates = _certificates(ref_lower, ref_radius, N0, n)  # as the reference run's rows give them
        procedure = IncrementalCertify(ProcedureSpec(CERTIFY, n, ALPHA_ZETA, sigma, 0, name="incremental"),
                                       certificates, ALPHA, 2, rate=d)
        plans = procedure.image_plans()
        chosen = np.array([_paired_size(plans.get(i, procedure.plan)) for i in range(len(ref_lower))])
        free = ref_radius < 0
        paired = (chosen > 0) & ~free
        scratch = ~paired & ~free
        disagree = rng.binomial(np.maximum(chosen, 1), d * case.p_chosen)
        zeta = disagreement_upper_bounds(disagree, np.maximum(chosen, 1), ALPHA_ZETA / len(procedure.sizes))
        incremental = radii(derived_lower_bounds(ref_lower, zeta), sigma)
        radius = np.where(free, -1.0, np.where(paired, incremental, radii(case.scratch_lower, sigma)))
        correct = np.where(paired | free, case.ref_true, case.scratch_true)
        acc, acr = summary(correct, radius, sigma)
        passes = (scratch * (n + N0) + paired * chosen).mean() / (n + N0)
        worst = max(abs(a - b) for a, b in zip(acc, case.scratch_acc))
        by_size = {size: int(np.sum(paired & (chosen == size))) for size in procedure.sizes}
        print(f"d {d}, sigma {sigma}, n {n:7,}: passes {passes:.2f} of from scratch; accuracy within "
              f"{worst:.1f} points; ACR {acr / case.scratch_acr:.3f}x; paired {paired.mean():.0%} (by n_p "
              f"{by_size}), from scratch {scratch.mean():.0%}")


def _certificates(p_a_lower: np.ndarray, radius: np.ndarray, n0: int, n: int) -> dict[int, Certificate]:
    """Each image's reference certificate (its class 1, or ABSTAIN where its radius is -1)."""
    return {i: Certificate(1 if radius[i] >= 0 else ABSTAIN, max(float(radius[i]), 0.0), n0, n, 0, float(p_a_lower[i]))
            for i in range(len(p_a_lower))}


def _paired_size(plan) -> int:
    """An image plan's paired samples; 0 where it draws none or certifies from scratch."""
    return plan.sizes[0] if plan is not None and len(plan.sizes) == 1 else 0


if __name__ == "__main__":
    main()
