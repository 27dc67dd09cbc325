"""CIFAR-10 from its python batches, unpickled with numpy arrays as the only globals allowed."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line
from dmae_fast.base.paths import ensure_readable
from dmae_fast.data.checks import check_split
from dmae_fast.data.datasets import TensorImageDataset
from dmae_fast.data.labels import MAX_LABEL

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray

CIFAR_SUBDIR = "cifar-10-batches-py"
CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_BATCH = "test_batch"
CIFAR_META = "batches.meta"
CIFAR_IMAGE_SHAPE = (3, 32, 32)


def cifar10(root: str | os.PathLike, split: str = "test") -> TensorImageDataset:
    """CIFAR-10 from its python batches in ``root`` (or ``root/cifar-10-batches-py``): ``data_batch_1`` .. ``_5`` for
    ``split="train"``, ``test_batch`` for ``"test"``; label names from ``batches.meta`` when present."""
    check_split(split)
    ensure_readable(Path(root))
    directory = cifar_dir(Path(root))
    if directory is None:
        raise UserError(f"no CIFAR-10 python batches ({CIFAR_TEST_BATCH}, data_batch_1..5) in {root}")
    names = CIFAR_TRAIN_BATCHES if split == "train" else (CIFAR_TEST_BATCH,)
    batches = [_read_cifar_batch(directory / name) for name in names]
    data = np.concatenate([data for data, _ in batches])
    labels = [label for _, batch_labels in batches for label in batch_labels]
    meta = directory / CIFAR_META
    class_names = _read_cifar_label_names(meta) if meta.is_file() else None
    if class_names is not None and max(labels, default=-1) >= len(class_names):
        raise UserError(f"{directory}: label {max(labels)} but {meta} names only {len(class_names)} classes")
    images = torch.from_numpy(data.reshape(-1, *CIFAR_IMAGE_SHAPE).astype(np.float32) / 255.0)
    return TensorImageDataset(images, torch.tensor(labels, dtype=torch.int64), class_names)


def cifar_dir(root: Path) -> Path | None:
    """The directory holding CIFAR-10 python batches: ``root`` or its standard subfolder."""
    for directory in (root, root / CIFAR_SUBDIR):
        if any((directory / name).is_file() for name in (CIFAR_TEST_BATCH, *CIFAR_TRAIN_BATCHES)):
            return directory
    return None


def _latin1_encode(text: str, encoding: str) -> bytes:
    """The only use of ``_codecs.encode`` in a pickle: Python 3 bytes under protocol 2."""
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"unexpected encoding {encoding!r}")
    return text.encode("latin1")


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **{(module, name): getattr(_multiarray, name)
       for module in ("numpy.core.multiarray", "numpy._core.multiarray") for name in ("_reconstruct", "scalar")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the numpy globals needed to rebuild arrays."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file, encoding="bytes")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise UserError(f"CIFAR-10 loader refuses to unpickle {module}.{name} (in {self.path})") from None


def _load_pickle(path: Path) -> Any:
    """Unpickle ``path`` safely; any malformed content becomes a UserError."""
    ensure_readable(path)
    try:
        with open(path, "rb") as file:
            return _NumpyOnlyUnpickler(file, path).load()
    except UserError:
        raise
    except Exception as exc:  # a corrupt pickle can fail in many ways
        raise UserError(f"not a valid CIFAR-10 python batch: {path} ({one_line(exc)})") from None


def _field(record: Any, key: str, path: Path) -> Any:
    """``record[key]`` for a CIFAR dict pickled by Python 2 (bytes keys) or 3 (str keys)."""
    if isinstance(record, dict):
        for candidate in (key.encode(), key):
            if candidate in record:
                return record[candidate]
    raise UserError(f"not a valid CIFAR-10 python batch: {path} has no {key!r} entry")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, list[int]]:
    """``(uint8 [N, 3072] data, labels)`` of one batch file."""
    if not path.is_file():
        raise UserError(f"missing CIFAR-10 batch file: {path}")
    record = _load_pickle(path)
    data, labels = _field(record, "data", path), _field(record, "labels", path)
    pixels = int(np.prod(CIFAR_IMAGE_SHAPE))
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == pixels):
        raise UserError(f"not a valid CIFAR-10 python batch: {path}: 'data' must be a uint8 N x {pixels} array")
    if isinstance(labels, np.ndarray):
        labels = labels.tolist()
    if not (isinstance(labels, list) and len(labels) == len(data) and all(map(_is_label, labels))):
        raise UserError(f"not a valid CIFAR-10 python batch: {path}: 'labels' must be {len(data)} integers "
                        f"in [0, {MAX_LABEL}]")
    return data, [int(label) for label in labels]


def _is_label(value: Any) -> bool:
    """Whether ``value`` is an integer in [0, MAX_LABEL] (Python or numpy, not bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value <= MAX_LABEL


def _read_cifar_label_names(path: Path) -> list[str]:
    """Class names from ``batches.meta``."""
    names = _field(_load_pickle(path), "label_names", path)
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise UserError(f"invalid CIFAR-10 metadata {path}: 'label_names' must be a list of strings")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]
