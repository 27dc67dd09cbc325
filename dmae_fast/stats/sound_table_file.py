"""A ``--sound`` threshold table as a file, for the C++ library (examples/cpp), which cannot compute it exactly.

The file is a NumPy ``.npy`` holding one 1-D int64 array:

    [TAG, L, K, sigma's float64 bits, tv_per_element's float64 bits, D_0, D_1, D_2, D_3, S_-K, ..., S_K-1]

with ``TAG`` the bytes ``dmaesnd2`` read as a little-endian int64, L the grid, K the truncation, S_k the shifted
thresholds of :class:`dmae_fast.stats.rounded_gaussian.SoundTable` and D_0..D_3 the SHA-256 digest (its 32 bytes
read as four little-endian int64) of the little-endian bytes of every other word, in order (the five header words,
then the thresholds). Files of the first format (tag ``dmaesnd1``, no digest) are refused.

A reader checks the tag, the digest, that sigma * L is within the bound of
:func:`~dmae_fast.stats.rounded_gaussian.table_problem`, the length 9 + 2K, and that the thresholds are those of
the header's sigma and grid: :func:`read_sound_table` recomputes them exactly (the C++ reader: docs/cpp.md)."""

from __future__ import annotations

import hashlib
import io

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import read_regular_file, write_regular_file
from dmae_fast.stats.rounded_gaussian import MAX_K, SoundTable, sound_table, table_problem

TAG = int.from_bytes(b"dmaesnd2", "little")
OLD_TAG = int.from_bytes(b"dmaesnd1", "little")  # the first format, without a digest
HEADER = 9  # tag, L, K, sigma bits, tv bits, four digest words
MAX_BYTES = 4096 + 8 * (HEADER + 2 * MAX_K)  # the largest file: the .npy header and the words


def digest_words(words: np.ndarray) -> np.ndarray:
    """D_0..D_3 of a table's words (the digest's own four words are not read)."""
    hashed = np.concatenate([words[:5], words[HEADER:]]).astype("<i8")
    return np.frombuffer(hashlib.sha256(hashed.tobytes()).digest(), dtype="<i8")


def table_array(table: SoundTable) -> np.ndarray:
    """The int64 array a sound-table file holds."""
    floats = np.array([table.sigma, table.tv_per_element], dtype="<f8").view("<i8")
    words = np.concatenate([np.array([TAG, table.grid, table.K], dtype="<i8"), floats, np.zeros(4, dtype="<i8"),
                            table.thresholds.astype("<i8")])
    words[5:HEADER] = digest_words(words)
    return words


def write_sound_table(table: SoundTable, path: str, overwrite: bool = False) -> None:
    """Write ``table`` to ``path`` (exactly that name) all at once; an existing file is refused unless
    ``overwrite``, and anything but a regular file always (:func:`dmae_fast.base.files.write_regular_file`)."""
    buffer = io.BytesIO()
    np.save(buffer, table_array(table))
    write_regular_file(path, buffer.getvalue(), overwrite, what="sound table")


def read_sound_table(path: str) -> SoundTable:
    """The table a sound-table file holds, checked word for word against the one its header's sigma and
    grid give (UserError naming the file and the problem otherwise)."""
    data = read_regular_file(path, MAX_BYTES, "sound table")
    try:
        words = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OSError):
        raise UserError(f"{path} is not a .npy file (write a sound table with dmae-sound-table)") from None
    return table_of_words(words, path)


def table_of_words(words: np.ndarray, path: str) -> SoundTable:
    """The table of a sound-table file's ``words`` (``path`` names it in errors)."""
    if words.dtype != np.dtype("<i8") or words.ndim != 1 or len(words) < 1 or words[0] not in (TAG, OLD_TAG):
        raise UserError(f"{path}: not a sound-noise table (write one with dmae-sound-table)")
    if words[0] == OLD_TAG:
        raise UserError(f"{path}: a sound table in the first format (dmaesnd1, without a digest); "
                        "write it again with dmae-sound-table")
    if len(words) < HEADER or not np.array_equal(words[5:HEADER], digest_words(words)):
        raise UserError(f"{path}: its SHA-256 digest does not match its contents (a damaged or altered file); "
                        "write it again with dmae-sound-table")
    grid, sigma = int(words[1]), float(words[3:4].view("<f8")[0])
    problem = table_problem(sigma, grid)
    if problem is not None:
        raise UserError(f"{path}: {problem}")
    table = sound_table(sigma, grid)
    if not np.array_equal(words, table_array(table)):
        raise UserError(f"{path}: its K, total variation or thresholds are not those of sigma {sigma!r} on the "
                        f"1/{grid} grid (an altered file); write it again with dmae-sound-table")
    return table
