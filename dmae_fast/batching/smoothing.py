"""What a run smooths: :class:`Smoothing`, the one value every body and the streaming certifier are built from
(made once by a run's opening, :meth:`~dmae_fast.run.opened.OpenedRun.smoothing`, and by the server)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.data import check_finite
from dmae_fast.engines.base import Engine
from dmae_fast.noise.contract import MASK32
from dmae_fast.noise.grid import check_on_grid, quantize
from dmae_fast.noise.sound_options import Sound


@dataclass(frozen=True)
class Smoothing:
    """The smoothed classifier g(x) = argmax_c P(f(x + sigma * eta) = c) as a run evaluates it: the base classifier
    ``engine``, the noise level ``sigma``, the ``seed`` the noise contract draws every sample from, ``sound``
    (``--sound``: inputs on its grid and the rounded Gaussian on it; None: Gaussian noise) and the noisy samples per
    forward pass ``batch_size`` (which changes no count)."""

    engine: Engine
    sigma: float
    seed: int
    batch_size: int = 1000
    sound: Sound | None = None

    @property
    def grid(self) -> int | None:
        """The noise's grid (``--sound``), or None for the Gaussian noise contract."""
        return None if self.sound is None else self.sound.grid

    def checked(self, index: int, image: torch.Tensor) -> torch.Tensor:
        """``image`` if it can be certified as image ``index``: the classifier's shape, an index inside the noise
        contract, finite pixels (checked on the host only: no device synchronisation); with ``sound``, on its grid
        (or rounded onto it where ``sound.quantize``)."""
        shape = self.engine.spec.input_shape
        if tuple(image.shape) != shape:
            raise UserError(f"image {index} has shape {tuple(image.shape)}, the classifier expects {shape}")
        if not 0 <= index <= MASK32:
            raise UserError(f"image index {index} outside the noise contract's range [0, 2**32)")
        if image.device.type == "cpu":
            check_finite(image, index)
        if self.sound is not None and self.sound.quantize:
            return quantize(image, self.sound.grid)
        if self.sound is not None:
            check_on_grid(image[None], self.sound.grid, "the data", first=index)
        return image
