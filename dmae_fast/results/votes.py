"""Votes files (``dmae-certify --keep-votes N``): beside a fixed-n CERTIFY run's results ``OUT``, in ``OUT.votes``,
each image's votes on its first N estimation samples: whether the classifier chose the row's ``predict`` class on
that noisy input (every vote 0 where the row abstained). An incremental run reads them to count the derived
classifier's disagreements on the same noisy inputs without running the reference again (docs/certify.md).

Format (docs/file-formats.md): the line ``dmae-fast votes 1``, a JSON line ``{"samples": N}``, then one record per
results row, in the same order: the image index (int64, little-endian) and the N votes packed 8 to a byte (vote s is
bit s % 8, least significant first, of byte s // 8; numpy's ``packbits(..., bitorder="little")``). The run record's
``votes`` names the file, N and its SHA-256."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import read_regular_file
from dmae_fast.results.format import PARTIAL_SUFFIX, Mode

MAGIC = b"dmae-fast votes 1\n"
VOTES_SUFFIX = ".votes"
MAX_VOTES_BYTES = 2**34  # 16 GiB: 1.3 million images at N = 100,000


def votes_path(out: str) -> str:
    """The votes file beside the results file ``out``."""
    return out + VOTES_SUFFIX


def _header(samples: int) -> bytes:
    return MAGIC + json.dumps({"samples": samples}).encode() + b"\n"


def _record_size(samples: int) -> int:
    return 8 + (samples + 7) // 8


@dataclass(frozen=True)
class Votes:
    """A votes file read back: N, and each image's N votes (bool); ``sha256``: the file's, where checked."""

    path: str
    samples: int
    by_image: dict[int, np.ndarray]
    sha256: str = ""


def _parse(path: str, data: bytes, drop_torn: bool) -> Votes:
    """The votes in ``data`` (``drop_torn``: ignore an incomplete last record, which a crash leaves)."""
    if not data.startswith(MAGIC):
        raise UserError(f"{path} is not a votes file (it does not start with {MAGIC.decode().strip()!r})")
    line_end = data.find(b"\n", len(MAGIC))
    try:
        samples = json.loads(data[len(MAGIC):line_end])["samples"]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{path}: its second line is not the votes header ({{\"samples\": N}})") from None
    if line_end < 0 or isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise UserError(f"{path}: its header names no number of samples >= 1")
    body = data[line_end + 1:]
    size = _record_size(samples)
    whole, torn = divmod(len(body), size)
    if torn and not drop_torn:
        raise UserError(f"{path} ends in an incomplete record ({torn} of {size} bytes)")
    records = np.frombuffer(body[:whole * size], dtype=np.uint8).reshape(whole, size)
    indices = records[:, :8].copy().view("<i8").ravel()
    votes = np.unpackbits(records[:, 8:], axis=1, count=samples, bitorder="little").astype(bool)
    return Votes(path, samples, dict(zip(indices.tolist(), votes)))


def read_votes(path: str) -> Votes:
    """The votes file ``path``; UserError naming the problem when it is not one."""
    if not Path(path).is_file():
        raise UserError(f"{path}: no such votes file")
    return _parse(path, read_regular_file(path, MAX_VOTES_BYTES), drop_torn=False)


class VotesWriter:
    """Writes a votes file record by record, as :class:`~dmae_fast.results.writer.ResultsWriter` writes rows (the same
    ``mode``s: "overwrite" writes ``path.partial``, renamed over ``path`` when the ``with`` block succeeds). Appending
    (``--resume``) keeps the records of ``kept`` (the images with a row) and refuses a file that lacks one. Each record
    reaches the operating system before its row is written, so every row a crash leaves has its votes."""

    def __init__(self, path: str, samples: int, mode: Mode, kept: set[int] | None = None) -> None:
        self.path, self.samples, self.mode = path, samples, mode
        self._target = path + PARTIAL_SUFFIX if mode == "overwrite" else path
        if mode == "append":
            self._rewrite_kept(kept or set())
        try:
            self._file = open(self._target, "xb" if mode == "new" else "ab" if mode == "append" else "wb")
        except FileExistsError:
            raise UserError(f"{path} exists; pass --overwrite to replace it or --resume to continue it") from None
        except OSError as error:
            raise UserError(f"cannot open {self._target}: {error.strerror}") from None
        if self._file.tell() == 0:
            self._file.write(_header(samples))

    def _rewrite_kept(self, kept: set[int]) -> None:
        """Keep only the records of ``kept`` (a record written before a crash cut its row goes)."""
        votes = kept_votes(self.path, self.samples, kept)
        if votes is None:
            return
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as file:
            file.write(_header(self.samples))
            for index, votes_of in votes.by_image.items():
                if index in kept:
                    file.write(_record(index, votes_of))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)

    def write(self, index: int, votes: np.ndarray) -> None:
        """Append image ``index``'s ``samples`` votes (bool), to the operating system at once."""
        if len(votes) != self.samples:
            raise ValueError(f"image {index}: {len(votes)} votes, the file keeps {self.samples}")
        self._file.write(_record(index, votes))
        self._file.flush()

    def close(self, success: bool = True) -> None:
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self.mode == "overwrite" and success:
            os.replace(self._target, self.path)

    def __enter__(self) -> VotesWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(success=exc_type is None)


def kept_votes(path: str, samples: int, kept: set[int]) -> Votes | None:
    """The votes file ``path`` that a resumed run continues (None: there is none yet), refused unless it holds
    ``samples`` votes for every image of ``kept`` (the rows kept)."""
    if not os.path.exists(path):
        if kept:
            raise UserError(f"--resume: {path} is missing, so the kept rows have no votes; run again with --overwrite")
        return None
    votes = _parse(path, read_regular_file(path, MAX_VOTES_BYTES), drop_torn=True)
    if votes.samples != samples:
        raise UserError(f"--resume: {path} holds {votes.samples} votes per image, this run keeps {samples}")
    missing = sorted(kept - set(votes.by_image))
    if missing:
        raise UserError(f"--resume: {path} has no votes for image idx {missing[0]} ({len(missing)} kept rows have "
                        "none); run again with --overwrite")
    return votes


def _record(index: int, votes: np.ndarray) -> bytes:
    return np.int64(index).astype("<i8").tobytes() + np.packbits(np.asarray(votes, dtype=bool),
                                                                   bitorder="little").tobytes()
