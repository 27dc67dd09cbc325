"""The radii sequential CERTIFY tests when none are named: one default for the library and the command.

``dmae-certify --sequential`` and :class:`~.group_sequential.GroupSequentialConfig` /
:class:`~.sequential.SequentialConfig` built without ``radii`` all take :func:`default_radii` (and the exact
test its :func:`default_lower_cap`), so the same settings give the same rows from Python and from the command."""

from __future__ import annotations

import math

from dmae_fast.stats.bounds import max_radius

RADIUS_STEP = 0.25  # the summary table's step (dmae_fast.analysis.DEFAULT_RADII) and the default radii's
LOWER_CAP = 10_000  # the paper's n: with the default radii, the most samples a level below the top one takes


def default_radii(n: int, alpha: float, sigma: float) -> tuple[float, ...]:
    """The summary table's RADIUS_STEP steps up to the largest radius min(n, LOWER_CAP) samples certify (at least
    the first step)."""
    top = max_radius(min(n, LOWER_CAP), alpha, sigma)
    return tuple(RADIUS_STEP * i for i in range(1, max(1, math.floor(top / RADIUS_STEP)) + 1))


def default_lower_cap(n: int, looks: tuple[int, ...] | None) -> int | None:
    """With the default radii and a cap above LOWER_CAP, the exact test's levels below the top one stop at LOWER_CAP
    samples (where it is a look): the summary table's radii at about the paper's n, the top one up to the cap."""
    return LOWER_CAP if n > LOWER_CAP and (looks is None or LOWER_CAP in looks) else None
