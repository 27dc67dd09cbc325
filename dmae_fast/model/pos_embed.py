"""Fixed 2-D sine-cosine position embeddings (as in MAE/DMAE), class-token row first."""

from __future__ import annotations

import torch


def _sincos_1d(dim: int, positions: torch.Tensor) -> torch.Tensor:
    """[len(positions), dim]: sin of positions * frequencies, then cos of the same."""
    frequencies = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
    angles = positions.to(torch.float64)[:, None] * frequencies[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def sincos_2d(dim: int, grid_size: int, class_token: bool = True) -> torch.Tensor:
    """Position embeddings [1, (1 +) grid_size**2, dim] of patches numbered row by row: the first half of each
    vector encodes the column, the second half the row; the class token's row is all zeros."""
    if dim % 4:
        raise ValueError(f"sin-cos position embeddings need a width divisible by 4, got {dim}")
    rows, cols = torch.meshgrid(torch.arange(grid_size), torch.arange(grid_size), indexing="ij")
    table = torch.cat([_sincos_1d(dim // 2, cols.flatten()), _sincos_1d(dim // 2, rows.flatten())], 1)
    if class_token:
        table = torch.cat([torch.zeros(1, dim, dtype=table.dtype), table])
    return table.float()[None]
