"""Images on a known grid, which ``--sound`` needs: pixel values X / L with X an integer in [0, L]
(L = 255 for 8-bit images, 16 for the demo's digits)."""

from __future__ import annotations

import numpy as np
import torch

from dmae_fast.errors import UserError

TOLERANCE = 1e-3  # |c * L - round(c * L)| allowed, in grid steps (float32 rounding is ~1e-5 of a step)


def check_on_grid(images: torch.Tensor, grid: int, what: str, first: int = 0) -> None:
    """Refuse, in one line, a batch of images [N, C, H, W] (image numbers ``first`` ...) of ``what``
    (for example ``"the demo set"``) with a pixel off the 1/``grid`` grid of [0, 1]."""
    scaled = images.to(torch.float64) * grid
    levels = torch.round(scaled)
    on_grid = ((scaled - levels).abs() <= TOLERANCE) & (levels >= 0) & (levels <= grid)
    if bool(on_grid.all()):
        return
    flat = int((~on_grid).flatten().nonzero()[0])
    number, *pixel = (int(i) for i in np.unravel_index(flat, tuple(images.shape)))
    value = float(images.flatten()[flat])
    needs = "8-bit inputs" if grid == 255 else f"inputs of {grid + 1} levels"
    raise UserError(f"image {first + number} of {what} is not on the 1/{grid} grid of [0, 1] (pixel {tuple(pixel)} = "
                    f"{value:.6g}): --sound needs {needs}; pass --quantize to round them onto the grid (the "
                    "certificate is then for the rounded image)")


def quantize(images: torch.Tensor, grid: int) -> torch.Tensor:
    """``images`` rounded to the nearest point of the 1/``grid`` grid, clamped to [0, 1] (float32)."""
    return torch.round(images.to(torch.float32) * grid).clamp(0, grid) / grid
