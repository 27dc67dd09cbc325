"""What every image of a procedure is sampled with: its :class:`SamplingPlan` (of :class:`Phase`
draws) and the :data:`Decide` callback consulted at the plan's looks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Phase(IntEnum):
    """Which independent draw a sample belongs to (the fourth counter word of the noise contract)."""

    SELECTION = 0  # CERTIFY's n0 samples that guess the top class
    ESTIMATION = 1  # CERTIFY's n fresh samples that bound its probability
    PREDICTION = 2  # PREDICT's n samples


# Incremental CERTIFY's paired samples draw the prediction phase's noise, which no CERTIFY draws: a paired engine tells
# them from the selection and estimation rows of the images it certifies from scratch (docs/certify.md).
PAIRED = Phase.PREDICTION


Decide = Callable[[int, np.ndarray, int], bool]
"""(image index, counts [phases, classes] at look k, k) -> True to stop sampling the image."""


@dataclass(frozen=True)
class SamplingPlan:
    """The noisy samples every image gets: ``sizes[i]`` samples of ``phases[i]``. ``looks``: row offsets inside the
    plan (0 < look < total) after which a :data:`Decide` callback may stop the image early (sequential mode)."""

    phases: tuple[Phase, ...]
    sizes: tuple[int, ...]
    looks: tuple[int, ...] = ()

    @classmethod
    def certify(cls, n0: int, n: int) -> SamplingPlan:
        return cls((Phase.SELECTION, Phase.ESTIMATION), (n0, n))

    @classmethod
    def sequential(cls, n0: int, estimation_looks: tuple[int, ...]) -> SamplingPlan:
        """n0 selection samples, then estimation samples up to the last look."""
        looks = tuple(n0 + look for look in estimation_looks[:-1])
        return cls((Phase.SELECTION, Phase.ESTIMATION), (n0, estimation_looks[-1]), looks)

    @classmethod
    def predict(cls, n: int) -> SamplingPlan:
        return cls((Phase.PREDICTION,), (n,))

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def stage_ends(self) -> tuple[int, ...]:
        return self.looks + (self.total,)
