"""Content hashes of model files: written when the project makes a file, checked when it opens one.

Engines carry the SHA-256 of the engine file in their sidecar (``sha256``); the project's weight files carry the
SHA-256 of their tensors (:func:`tensors_sha256`) inside the file under :data:`CONTENT_KEY`. A file without a hash
still opens; one whose hash disagrees is refused: a damaged model would silently certify another classifier."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from dmae_fast.base.errors import UserError

if TYPE_CHECKING:
    import torch

CONTENT_KEY = "content_sha256"


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(functools.partial(handle.read, 1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tensors_sha256(state: dict[str, torch.Tensor]) -> str:
    """The SHA-256 of a state dict: each tensor's name, dtype, shape and bytes, in name order."""
    import torch  # here, so that engine sidecars are read without torch

    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def check_tensors(path: Path, state: dict[str, torch.Tensor], expected: str | None) -> None:
    """Refuse ``path`` when its stored tensor hash (if any) does not match its tensors."""
    if expected is not None and (not is_sha256(expected) or tensors_sha256(state) != expected):
        raise UserError(f"{path}: its weights do not match the content hash stored in it (the file was damaged "
                        "or altered after it was written); restore or re-create it")


def check_file(path: Path, expected: str | None, where: str) -> None:
    """Refuse ``path`` when its SHA-256 differs from ``expected`` (recorded in ``where``)."""
    if expected is not None and file_sha256(path) != expected:
        raise UserError(f"{path}: its SHA-256 differs from the one recorded in {where} (the file was damaged or "
                        "replaced after export); export it again")
