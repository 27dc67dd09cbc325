"""Images on a known grid, which ``--sound`` needs: pixel values X / L with X an integer in [0, L]
(L = 255 for 8-bit images, 16 for the demo's digits).

A pixel c is on the grid when it is k / L as float32 stores it: float32(c) == float32(k / L) for k = round(c * L),
so it differs from the certified grid point by float32's own rounding of k / L only (less than 2**-24)."""

from __future__ import annotations

import numpy as np
import torch

from dmae_fast.base.errors import UserError
from dmae_fast.noise.sound_options import BYTE_GRID


def off_grid(images: torch.Tensor, grid: int) -> torch.Tensor:
    """Where ``images`` (any float dtype) hold a pixel that is not a point k / L, k in [0, L], of the 1/``grid``
    grid as float32 stores it (a boolean tensor of their shape)."""
    levels = torch.round(images.to(torch.float64) * grid)
    stored = images.to(torch.float32) == levels.to(torch.float32) / grid  # k / L rounded once, as float32 divides
    return ~(stored & (levels >= 0) & (levels <= grid))


def check_on_grid(images: torch.Tensor, grid: int, what: str, first: int = 0) -> None:
    """Refuse, in one line, a batch of images [N, C, H, W] (image numbers ``first`` ...) of ``what``
    (for example ``"the demo set"``) with a pixel off the 1/``grid`` grid of [0, 1]."""
    outside = off_grid(images, grid)
    if not bool(outside.any()):
        return
    flat = int(outside.flatten().nonzero()[0])
    number, *pixel = (int(i) for i in np.unravel_index(flat, tuple(images.shape)))
    value = float(images.flatten()[flat])
    needs = "8-bit inputs" if grid == BYTE_GRID else f"inputs of {grid + 1} levels"
    raise UserError(f"image {first + number} of {what} is not on the 1/{grid} grid of [0, 1] (pixel {tuple(pixel)} = "
                    f"{value:.9g}): --sound needs {needs}; pass --quantize to round them onto the grid (the "
                    "certificate is then for the rounded image)")


def quantize(images: torch.Tensor, grid: int) -> torch.Tensor:
    """``images`` rounded to the nearest point of the 1/``grid`` grid, clamped to [0, 1] (float32)."""
    return torch.round(images.to(torch.float32) * grid).clamp(0, grid) / grid
