"""Datasets for certification (and later training).

Every dataset yields ``(image, label)``: ``image`` is a float32 tensor ``[C, H, W]`` in
pixel space with values in ``[0, 1]`` -- no normalization, which belongs to the
classifier, after the noise -- and ``label`` is an ``int``.  Every dataset object also
carries ``num_classes``, ``class_names`` (``None`` when unknown) and ``image_shape``
(``(C, H, W)``).

Sources: the built-in demo set (scikit-learn's 8x8 digits), CIFAR-10 python batches,
ImageNet-style class folders and image lists.  Problems with the user's data raise
:class:`~dmae_fast.errors.UserError` with a one-line message naming the path.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets, transforms

from dmae_fast.errors import UserError

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray

DEMO = "demo"
DEMO_TEST_SIZE = 500
SPLITS = ("train", "test")
LIST_SUFFIXES = (".txt", ".tsv", ".csv")
CIFAR_SUBDIR = "cifar-10-batches-py"
CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_BATCH = "test_batch"
CIFAR_META = "batches.meta"
CIFAR_IMAGE_SHAPE = (3, 32, 32)
# ImageNet evaluation: resize the short side to image_size / 0.875, then center-crop.
CROP_FRACTION = 0.875


# --------------------------------------------------------------------------- datasets


class TensorImageDataset(Dataset):
    """Images held in memory as one float32 tensor ``[N, C, H, W]`` with values in [0, 1]."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        class_names: list[str] | None = None,
    ) -> None:
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(
                f"images must be [N, C, H, W] with one label each, got {tuple(images.shape)} "
                f"and {len(labels)} labels"
            )
        self.images = images
        self.labels = labels
        self.class_names = class_names
        self.num_classes = _num_classes(labels.tolist(), class_names)
        self.image_shape: tuple[int, int, int] = tuple(images.shape[1:])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


class ImageFolderDataset(datasets.ImageFolder):
    """ImageNet layout (one subfolder of images per class) with the evaluation transform."""

    def __init__(self, root: str | os.PathLike, image_size: int) -> None:
        _ensure_readable(Path(root))
        try:
            super().__init__(root, transform=_eval_transform(image_size), loader=_load_rgb)
        except FileNotFoundError as exc:  # no class folder, or one without image files
            raise UserError(f"image folder {root}: {_one_line(exc)}") from None
        self.class_names: list[str] | None = list(self.classes)
        self.num_classes = len(self.classes)
        self.image_shape = (3, image_size, image_size)


class ImageListDataset(Dataset):
    """Images named by ``(path, label)`` pairs, decoded lazily with PIL."""

    def __init__(
        self,
        samples: list[tuple[Path, int]],
        transform: Callable[[Image.Image | torch.Tensor], torch.Tensor],
        image_shape: tuple[int, int, int],
    ) -> None:
        self.samples = samples
        self.transform = transform
        self.class_names: list[str] | None = None
        self.num_classes = _num_classes([label for _, label in samples], None)
        self.image_shape = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return self.transform(_load_rgb(path)), label


# --------------------------------------------------------------------------- sources


def demo_digits(split: str) -> TensorImageDataset:
    """The built-in demo set: scikit-learn's 8x8 digits as ``[3, 8, 8]`` images.

    The 1,797 images are split deterministically: the first 500 (``DEMO_TEST_SIZE``) of
    ``np.random.default_rng(0).permutation(1797)`` are the test set, the rest (1,297)
    the training set.
    """
    from sklearn.datasets import load_digits

    _check_split(split)
    digits = load_digits()
    perm = np.random.default_rng(0).permutation(len(digits.target))
    indices = perm[:DEMO_TEST_SIZE] if split == "test" else perm[DEMO_TEST_SIZE:]
    images = torch.from_numpy((digits.images[indices] / 16.0).astype(np.float32))
    labels = torch.from_numpy(digits.target[indices].astype(np.int64))
    return TensorImageDataset(
        images.unsqueeze(1).repeat(1, 3, 1, 1), labels, [str(d) for d in range(10)]
    )


def cifar10(root: str | os.PathLike, split: str = "test") -> TensorImageDataset:
    """CIFAR-10 from its python batches in ``root`` (or ``root/cifar-10-batches-py``).

    ``split="train"`` reads ``data_batch_1`` .. ``data_batch_5``, ``split="test"`` reads
    ``test_batch``; label names come from ``batches.meta`` when present.  The pickles
    are read with :class:`_NumpyOnlyUnpickler`, which refuses anything but numpy arrays.
    """
    _check_split(split)
    _ensure_readable(Path(root))
    directory = _cifar_dir(Path(root))
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


def image_folder(root: str | os.PathLike, image_size: int) -> ImageFolderDataset:
    """ImageNet layout: class subfolders of images, resized and center-cropped to ``image_size``."""
    return ImageFolderDataset(root, image_size)


def image_list(
    path: str | os.PathLike, image_size: int | None, labels: str | os.PathLike | None = None
) -> ImageListDataset:
    """Images named by a list file, or a flat directory of images plus a labels file.

    ``path`` is either a ``.txt``/``.tsv``/``.csv`` file of ``image label`` lines (image
    paths relative to the list file's directory), or a directory of images, in which case
    ``labels`` names a file of ``filename label`` lines relative to that directory.
    Blank lines and lines starting with ``#`` are ignored; fields are separated by
    whitespace or a comma.  With ``image_size`` the images are resized and center-cropped
    as in :func:`image_folder`; without it they must all have the same size.
    """
    path = Path(path)
    _ensure_readable(path)
    if path.is_dir():
        if labels is None:
            raise UserError(f"a directory of images needs a labels file of 'filename label' lines: {path}")
        _ensure_readable(Path(labels))
        samples = _read_label_file(Path(labels), path)
    else:
        if labels is not None:
            raise UserError(f"a labels file only applies to a directory of images, not to the list file {path}")
        if path.suffix.lower() not in LIST_SUFFIXES:
            raise UserError(f"unsupported dataset file {path}: expected an image list ({', '.join(LIST_SUFFIXES)})")
        samples = _read_label_file(path, path.parent)
    if not samples:
        raise UserError(f"dataset is empty: no images listed in {labels if path.is_dir() else path}")
    if image_size is not None:
        return ImageListDataset(samples, _eval_transform(image_size), (3, image_size, image_size))
    width, height = _common_size([image for image, _ in samples])
    return ImageListDataset(samples, _to_tensor, (3, height, width))


def open_dataset(
    spec: str,
    *,
    split: str = "test",
    image_size: int | None = None,
    labels: str | None = None,
) -> Dataset:
    """Open the dataset named by ``spec``.

    * ``"demo"``: :func:`demo_digits` (``split``);
    * a directory with CIFAR-10 python batches: :func:`cifar10` (``split``);
    * a directory together with ``labels``: :func:`image_list`;
    * a directory of class subfolders: :func:`image_folder` (``image_size`` required);
    * a file: :func:`image_list`.
    """
    if spec == DEMO:
        return demo_digits(split)
    path = Path(spec).expanduser()
    _ensure_readable(path)
    dataset = _open_path(path, split, image_size, labels)
    if len(dataset) == 0:
        raise UserError(f"dataset is empty: {spec}")
    return dataset


# --------------------------------------------------------------------------- selection


def subset_indices(length: int, skip: int, max_images: int | None) -> list[int]:
    """Every ``skip``-th index of ``range(length)`` from 0, truncated to ``max_images``."""
    if skip < 1:
        raise UserError(f"skip must be at least 1, got {skip}")
    if max_images is not None and max_images < 1:
        raise UserError(f"max_images must be at least 1, got {max_images}")
    return list(range(0, length, skip))[:max_images]


def check_finite(image: torch.Tensor, index: int) -> None:
    """Refuse an image with NaN or infinite pixels."""
    if not bool(torch.isfinite(image).all()):
        raise UserError(f"image {index} contains NaN or infinite pixel values")


# --------------------------------------------------------------------------- helpers


def _open_path(path: Path, split: str, image_size: int | None, labels: str | None) -> Dataset:
    """Dispatch an existing, readable path to the matching dataset source."""
    if not path.is_dir():
        return image_list(path, image_size, labels)
    if labels is not None:
        return image_list(path, image_size, labels)
    if _cifar_dir(path) is not None:
        return cifar10(path, split)
    if _has_subdirectories(path):
        if image_size is None:
            raise UserError(f"an image size is required for the class-folder dataset {path}")
        return image_folder(path, image_size)
    raise UserError(
        f"no recognised dataset layout in {path}: expected CIFAR-10 python batches "
        f"({CIFAR_TEST_BATCH}, data_batch_1..5), class subfolders of images (ImageNet layout), "
        f"or a flat directory of images together with a labels file"
    )


def _ensure_readable(path: Path) -> None:
    """Raise UserError unless ``path`` exists and can be read (and listed, for a directory)."""
    if not path.exists():
        raise UserError(f"path does not exist: {path}")
    mode = os.R_OK | os.X_OK if path.is_dir() else os.R_OK
    if not os.access(path, mode):
        raise UserError(f"path is not readable: {path}")


def _has_subdirectories(path: Path) -> bool:
    """Whether ``path`` holds at least one non-hidden subdirectory."""
    try:
        with os.scandir(path) as entries:
            return any(entry.is_dir() and not entry.name.startswith(".") for entry in entries)
    except OSError as exc:
        raise UserError(f"cannot list directory {path}: {_one_line(exc)}") from None


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")


def _num_classes(labels: list[int], class_names: list[str] | None) -> int:
    """Number of label names when known, otherwise the largest label + 1."""
    if class_names is not None:
        return len(class_names)
    return max(labels, default=-1) + 1


def _one_line(exc: BaseException) -> str:
    """An exception's message on a single line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _eval_transform(image_size: int) -> Callable[[Image.Image | torch.Tensor], torch.Tensor]:
    """Resize the short side to ``round(image_size / 0.875)``, center-crop, to tensor."""
    if image_size < 1:
        raise UserError(f"image size must be at least 1, got {image_size}")
    return transforms.Compose(
        [
            transforms.Resize(
                round(image_size / CROP_FRACTION), interpolation=transforms.InterpolationMode.BILINEAR
            ),
            transforms.CenterCrop(image_size),
            _to_tensor,
        ]
    )


def _load_rgb(path: str | os.PathLike) -> Image.Image | torch.Tensor:
    """Decode an image file to RGB in [0, 1], naming the file if that cannot be done exactly.

    8-bit images (grey, palette, CMYK, RGBA: alpha dropped) come back as PIL RGB images.
    16-bit grey images (PIL modes ``I;16*``/``I``) and float images (``F``, e.g. float TIFF)
    come back at full precision as float32 tensors [3, H, W]: 16-bit values / 65535, float
    values as they are (they must be finite and in [0, 1]). PIL decodes 16-bit colour PNGs to
    8 bits, so those are refused rather than silently quantized.
    """
    try:
        with Image.open(path) as image:
            rawmodes = [str(tile[3]) for tile in getattr(image, "tile", ())]
            if image.mode in ("RGB", "RGBA") and any(";16" in mode for mode in rawmodes):
                raise UserError(f"image file {path} is a 16-bit colour image, which PIL reads as 8 bits only; "
                                "convert it to 8 bits or to a float TIFF per channel first")
            if image.mode in _HIGH_DEPTH_GREY:
                return _grey_tensor(np.asarray(image, dtype=np.float64) / 65535.0, path, "16-bit")
            if image.mode == "F":
                return _grey_tensor(np.asarray(image, dtype=np.float64), path, "float")
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise UserError(f"cannot decode image file {path}: {_one_line(exc)}") from None


_HIGH_DEPTH_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _grey_tensor(values: np.ndarray, path: str | os.PathLike, kind: str) -> torch.Tensor:
    """A grey image [H, W] in [0, 1] as float32 RGB [3, H, W]; UserError for NaN/inf or values outside [0, 1]."""
    if not np.isfinite(values).all():
        raise UserError(f"image file {path} contains NaN or infinite pixel values")
    low, high = float(values.min()), float(values.max())
    if low < 0 or high > 1:
        raise UserError(f"{kind} image file {path} has pixel values in [{low:g}, {high:g}], outside [0, 1]")
    return torch.from_numpy(values.astype(np.float32)).expand(3, -1, -1).contiguous()


def _to_tensor(image: Image.Image | torch.Tensor) -> torch.Tensor:
    """PIL images to float32 [C, H, W] in [0, 1]; tensors (high-depth images) pass through."""
    return image if isinstance(image, torch.Tensor) else transforms.functional.to_tensor(image)


def _common_size(paths: list[Path]) -> tuple[int, int]:
    """The (width, height) shared by all images; UserError naming the first that differs."""
    first = _image_size(paths[0])
    for path in paths[1:]:
        size = _image_size(path)
        if size != first:
            raise UserError(
                f"image {path} is {size[0]}x{size[1]} but {paths[0]} is {first[0]}x{first[1]}; "
                "give an image size to resize and crop all images"
            )
    return first


def _image_size(path: Path) -> tuple[int, int]:
    """An image's (width, height) from its header."""
    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise UserError(f"cannot decode image file {path}: {_one_line(exc)}") from None


def _read_label_file(list_path: Path, base_dir: Path) -> list[tuple[Path, int]]:
    """``(image path, label)`` pairs from a file of ``image label`` lines."""
    try:
        lines = list_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read label file {list_path}: {_one_line(exc)}") from None
    samples = []
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            samples.append(_parse_label_line(line, base_dir, f"{list_path}:{number}"))
    return samples


def _parse_label_line(line: str, base_dir: Path, where: str) -> tuple[Path, int]:
    """Split one ``image label`` line; the image path may contain spaces."""
    fields = line.rsplit(",", 1) if "," in line else line.rsplit(None, 1)
    if len(fields) != 2 or not fields[0].strip():
        raise UserError(f"{where}: expected 'image label', got {line!r}")
    name, label_text = fields[0].strip(), fields[1].strip()
    if re.fullmatch(r"[0-9]+", label_text) is None:  # ASCII digits only: int() also takes '٣'
        raise UserError(f"{where}: label must be a non-negative integer, got {label_text!r}")
    image = base_dir / name
    if not image.is_file():
        raise UserError(f"{where}: image file not found: {image}")
    return image, int(label_text)


# --------------------------------------------------------------------------- CIFAR-10


def _cifar_dir(root: Path) -> Path | None:
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
    **{
        (module, name): getattr(_multiarray, name)
        for module in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name in ("_reconstruct", "scalar")
    },
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
    _ensure_readable(path)
    try:
        with open(path, "rb") as file:
            return _NumpyOnlyUnpickler(file, path).load()
    except UserError:
        raise
    except Exception as exc:  # a corrupt pickle can fail in many ways
        raise UserError(f"not a valid CIFAR-10 python batch: {path} ({_one_line(exc)})") from None


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
        raise UserError(
            f"not a valid CIFAR-10 python batch: {path}: 'labels' must be {len(data)} non-negative integers"
        )
    return data, [int(label) for label in labels]


def _is_label(value: Any) -> bool:
    """Whether ``value`` is a non-negative integer (Python or numpy, not bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


def _read_cifar_label_names(path: Path) -> list[str]:
    """Class names from ``batches.meta``."""
    names = _field(_load_pickle(path), "label_names", path)
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise UserError(f"invalid CIFAR-10 metadata {path}: 'label_names' must be a list of strings")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]
