"""A ``--sound`` threshold table as a file, for the C++ library (examples/cpp), which cannot compute it exactly.

The file is a NumPy ``.npy`` holding one 1-D int64 array:

    [TAG, L, K, sigma's float64 bits, tv_per_element's float64 bits, S_-K, ..., S_K-1]

with ``TAG`` the bytes ``dmaesnd1`` read as a little-endian int64, L the grid, K the truncation and
S_k the shifted thresholds of :class:`dmae_fast.stats.rounded_gaussian.SoundTable`. A reader checks the
tag, that the length is 5 + 2K, and that the thresholds ascend and are symmetric (S_k + S_-k-1 is 0 or -1).
"""

from __future__ import annotations

import os

import numpy as np

from dmae_fast.errors import UserError
from dmae_fast.stats.rounded_gaussian import SoundTable

TAG = int.from_bytes(b"dmaesnd1", "little")


def table_array(table: SoundTable) -> np.ndarray:
    """The int64 array a sound-table file holds."""
    floats = np.array([table.sigma, table.tv_per_element], dtype="<f8").view("<i8")
    return np.concatenate([np.array([TAG, table.grid, table.K], dtype="<i8"), floats, table.thresholds.astype("<i8")])


def write_sound_table(table: SoundTable, path: str, overwrite: bool = False) -> None:
    """Write ``table`` to ``path`` (exactly that name); an existing file is refused unless ``overwrite``,
    and then replaced only once the new one is complete."""
    target = f"{path}.partial" if overwrite else path
    try:
        with open(target, "wb" if overwrite else "xb") as file:
            np.save(file, table_array(table))
    except FileExistsError:
        raise UserError(f"{path} exists; pass --overwrite to replace it") from None
    if overwrite:
        os.replace(target, path)
