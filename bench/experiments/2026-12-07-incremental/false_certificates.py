"""False-certificate rates of incremental certification (dmae_fast.stats.incremental) by simulation with known
probabilities, against a deliberately wrong bound (the point estimate of the disagreement rate).

Each simulated image: a reference run of n estimation samples at P(f = cA) = p, whose first n_p are paired with a
derived f' (P(f = cA, f' != cA) = z, P(f != cA, f' = cA) = w); a false certificate is a derived bound >= 1/2 above
f''s true P(f' = cA) = p - z + w. Run:

    python bench/experiments/2026-12-07-incremental/false_certificates.py \
        > bench/results/2026-12-07-incremental/false-certificates.txt
"""

from __future__ import annotations

import numpy as np

from dmae_fast.stats.bounds import lower_confidence_bounds
from dmae_fast.stats.incremental import derived_lower_bounds, disagreement_upper_bounds

CASES = [(0.99, 0.01, 0.0), (0.995, 0.005, 0.0), (0.999, 0.001, 0.0), (0.9, 0.02, 0.0), (0.9, 0.02, 0.01),
         (0.7, 0.005, 0.0)]


def false_certificates(p: float, z: float, w: float, n: int, n_p: int, alpha: float, alpha_zeta: float, trials: int,
                       seed: int) -> tuple[int, int]:
    """(false certificates with the sound bound, with the point estimate), over the same simulated images."""
    rng = np.random.default_rng(seed)
    first = rng.multinomial(n_p, [p - z, z, w, 1 - p - w], size=trials)
    n_a = first[:, 0] + first[:, 1] + rng.binomial(n - n_p, p, size=trials)
    p_a_lower = np.where(n_a > 0, lower_confidence_bounds(np.maximum(n_a, 1), n, alpha), 0.0)
    truth = p - z + w
    counts = []
    for zeta in (disagreement_upper_bounds(first[:, 1], n_p, alpha_zeta), first[:, 1] / n_p):
        derived = derived_lower_bounds(p_a_lower, zeta)
        counts.append(int(np.sum((derived >= 0.5) & (derived > truth))))
    return counts[0], counts[1]


def main() -> None:
    alpha = alpha_zeta = 0.001
    n, trials = 10_000, 1_000_000
    print(f"alpha {alpha}, alpha_zeta {alpha_zeta} (allowed: {alpha + alpha_zeta}), n {n:,}, {trials:,} images a row")
    print("p\tz\tw\tn_p\tfalse rate (sound bound)\tfalse rate (point estimate)")
    for p, z, w in CASES:
        for n_p in (200, 1_000, 5_000):
            sound, point = false_certificates(p, z, w, n, n_p, alpha, alpha_zeta, trials, seed=59)
            print(f"{p}\t{z}\t{w}\t{n_p}\t{sound / trials:.6f}\t{point / trials:.6f}")


if __name__ == "__main__":
    main()
