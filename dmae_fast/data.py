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
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets, transforms

from dmae_fast.certification.choices import DEMO
from dmae_fast.errors import UserError

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray

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
# Largest label accepted (from label files and CIFAR batches): far above any classifier's class
# count, and small enough that labels and num_classes = max + 1 stay exact in every integer type.
MAX_LABEL = 2**31 - 1


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
        if image_size is None:
            raise UserError(f"an image size is required for the class-folder dataset {root}")
        image_size = _check_image_size(image_size)
        if not _ensure_readable(Path(root)):
            raise UserError(f"an image folder must be a directory of class subfolders, not the file {root}")
        _check_no_directory_twice(Path(root))
        try:
            super().__init__(root, transform=_eval_transform(image_size), loader=_load_rgb)
        except OSError as exc:  # no class folder, or one without image files
            raise UserError(f"image folder {root}: {_one_line(exc)}") from None
        self.class_names: list[str] | None = list(self.classes)
        self.num_classes = len(self.classes)
        self.image_size = image_size
        self.image_shape = (3, image_size, image_size)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return _read_image(path, self.transform, self.image_size, self.image_shape), label


class ImageListDataset(Dataset):
    """Images named by ``(path, label)`` pairs, decoded lazily with PIL.

    With ``image_size`` the images are resized and center-cropped (the evaluation transform);
    without it they are used as they are and must all have the size of ``image_shape``.
    """

    def __init__(
        self,
        samples: list[tuple[Path, int]],
        image_size: int | None,
        image_shape: tuple[int, int, int],
    ) -> None:
        self.samples = samples
        self.image_size = image_size
        self.transform = _to_tensor if image_size is None else _eval_transform(image_size)
        self.class_names: list[str] | None = None
        self.num_classes = _num_classes([label for _, label in samples], None)
        self.image_shape = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return _read_image(path, self.transform, self.image_size, self.image_shape), label


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
    """ImageNet layout: class subfolders of images, resized and center-cropped to ``image_size``.

    Classes and images are found as by :class:`torchvision.datasets.ImageFolder` (symbolic
    links followed); a tree that reaches one directory twice (a symlink loop) is refused.
    """
    return ImageFolderDataset(root, image_size)


def image_list(
    path: str | os.PathLike, image_size: int | None, labels: str | os.PathLike | None = None
) -> ImageListDataset:
    """Images named by a list file, or a flat directory of images plus a labels file.

    ``path`` is either a ``.txt``/``.tsv``/``.csv`` file of ``image label`` lines (image
    paths relative to the list file's directory), or a directory of images, in which case
    ``labels`` names a file of ``filename label`` lines relative to that directory.
    Blank lines and lines starting with ``#`` are ignored; fields are separated by
    whitespace or a comma; labels are ASCII digits (at most ``MAX_LABEL``).  With
    ``image_size`` the images are resized and center-cropped as in :func:`image_folder`;
    without it they must all have the same size.
    """
    if image_size is not None:
        image_size = _check_image_size(image_size)
    if str(path) == "":
        raise UserError("the dataset path is empty")
    path = Path(path)
    if _ensure_readable(path):
        if labels is None:
            raise UserError(f"a directory of images needs a labels file of 'filename label' lines: {path}")
        if str(labels) == "":
            raise UserError("the labels file path is empty")
        if _ensure_readable(Path(labels)):
            raise UserError(f"the labels file {labels} is a directory")
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
        return ImageListDataset(samples, image_size, (3, image_size, image_size))
    width, height = _common_size([image for image, _ in samples])
    return ImageListDataset(samples, None, (3, height, width))


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

    ``image_size`` (used by image files only) must be at least 1 whatever the source.
    """
    if image_size is not None:
        image_size = _check_image_size(image_size)
    if spec == DEMO:
        return demo_digits(split)
    if str(spec) == "":
        raise UserError("the dataset path is empty")
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # ~user that does not exist
        raise UserError(f"cannot expand '~' in the dataset path {spec}: no such user") from None
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


def _ensure_readable(path: Path) -> bool:
    """Raise UserError unless ``path`` exists and can be read (and listed, for a directory).

    Returns whether ``path`` is a directory.
    """
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"path does not exist: {path}") from None
    except OSError as exc:  # a symlink loop, a name too long, no permission to search a parent
        raise UserError(f"cannot access path {path}: {exc.strerror or _one_line(exc)}") from None
    except ValueError as exc:  # a NUL character
        raise UserError(f"invalid path {str(path)!r}: {_one_line(exc)}") from None
    if not os.access(path, os.R_OK | os.X_OK if is_dir else os.R_OK):
        raise UserError(f"path is not readable: {path}")
    return is_dir


def _file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as an image file (``None`` if it is a regular file).

    Checked before PIL opens it: opening a FIFO would wait for a writer forever.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return exc.strerror or _one_line(exc)
    except ValueError as exc:  # a NUL character
        return _one_line(exc)
    if stat.S_ISDIR(mode):
        return "it is a directory"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    return None


def _check_no_directory_twice(root: Path) -> None:
    """Refuse a folder tree that reaches one directory twice through symbolic links.

    ImageFolder follows links, so a link to a parent (a loop) would list the same images
    over and over (until the OS gives up at its symlink-depth limit).
    """
    seen: dict[str, str] = {}
    for directory, _, _ in os.walk(root, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:
            raise UserError(
                f"image folder {root}: {directory} is the directory {seen[real]} again "
                "(a symbolic link loop, or a second link to it); every image must be reached once"
            )
        seen[real] = directory


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


def _check_image_size(image_size: Any) -> int:
    """``image_size`` as an int, or UserError unless it is a whole number >= 1 whose resized
    images stay within PIL's decompression-bomb limit."""
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)):
        raise UserError(f"image size must be a whole number of pixels, got {image_size!r}")
    if image_size < 1:
        raise UserError(f"image size must be at least 1, got {image_size}")
    short = _resized_short_side(int(image_size))
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and short * short > limit:
        raise UserError(
            f"image size {image_size} is too large: images would be resized to at least "
            f"{short}x{short} pixels, above PIL's limit of {limit}"
        )
    return int(image_size)


def _resized_short_side(image_size: int) -> int:
    return round(image_size / CROP_FRACTION)


def _eval_transform(image_size: int) -> Callable[[Image.Image | torch.Tensor], torch.Tensor]:
    """Resize the short side to ``round(image_size / 0.875)``, center-crop, to tensor.

    PIL images (8 bits per channel) are resized by PIL as before; high-depth images arrive as
    float32 tensors and are resized by torchvision's tensor path.
    """
    image_size = _check_image_size(image_size)
    return transforms.Compose(
        [
            transforms.Resize(
                _resized_short_side(image_size), interpolation=transforms.InterpolationMode.BILINEAR
            ),
            transforms.CenterCrop(image_size),
            _to_tensor,
        ]
    )


def _read_image(
    path: str | os.PathLike,
    transform: Callable[[Image.Image | torch.Tensor], torch.Tensor],
    image_size: int | None,
    image_shape: tuple[int, int, int],
) -> torch.Tensor:
    """Decode, transform and check one image of a file dataset; UserError naming the file."""
    image = _load_rgb(path)
    if image_size is not None:
        _check_resizable(image, path, image_size)
    tensor = transform(image)
    if tuple(tensor.shape) != tuple(image_shape):  # without image_size: the file changed since it was opened
        raise UserError(
            f"image file {path} is {tensor.shape[-1]}x{tensor.shape[-2]} but the dataset's images are "
            f"{image_shape[2]}x{image_shape[1]} (was it replaced after the dataset was opened?)"
        )
    return tensor


def _check_resizable(image: Image.Image | torch.Tensor, path: str | os.PathLike, image_size: int) -> None:
    """UserError if resizing the short side to ``round(image_size / 0.875)`` makes more
    pixels than PIL's decompression-bomb limit (a very long, thin image)."""
    width, height = image.size if isinstance(image, Image.Image) else (image.shape[-1], image.shape[-2])
    short_side = _resized_short_side(image_size)
    long_side = int(short_side * max(width, height) / min(width, height))  # as torchvision's Resize
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and short_side * long_side > limit:
        raise UserError(
            f"image file {path} is {width}x{height}: resizing its short side to {short_side} would make "
            f"{short_side * long_side} pixels, above PIL's limit of {limit}; crop it first"
        )


def _load_rgb(path: str | os.PathLike) -> Image.Image | torch.Tensor:
    """Decode an image file to RGB in [0, 1], naming the file if that cannot be done exactly.

    * 8-bit images come back as PIL RGB images: grey, palette, CMYK, LAB, 1-bit and 2/4-bit
      images converted by PIL; the alpha channel of RGBA/LA/PA images is dropped (the colour
      values are kept as stored, not blended with a background), as torchvision's loader does.
    * 16-bit grey images (PIL modes ``I;16*``, and ``I`` read from a 16-bit PNG/TIFF/PGM) come
      back at full precision as float32 tensors [3, H, W], the grey value / 65535 replicated to
      three channels; 12-bit TIFFs / 4095.
    * Float images (PIL mode ``F``: single-channel float TIFF, PFM) come back as float32
      tensors with their values as they are; NaN/inf pixels or values outside [0, 1] are refused.
    * PIL decodes 16-bit colour and grey+alpha images (PNG, TIFF, PPM, SGI) to 8 bits per
      channel only, so those are refused rather than silently quantized; so are 32-bit and
      signed integer images (no defined [0, 1] scale).
    * Only the first frame of an animated or multi-page file is used.
    """
    problem = _file_problem(path)
    if problem is not None:
        raise UserError(f"cannot read image file {path}: {problem}")
    try:
        with Image.open(path) as image:
            tiles = list(getattr(image, "tile", None) or [])  # how PIL will decode: gone after load()
            image.load()
            return _to_rgb(image, tiles, path)
    except UserError:
        raise
    except Exception as exc:  # PIL fails on corrupt files in many ways: OSError, ValueError,
        # SyntaxError, NotImplementedError, DecompressionBombError, MemoryError, ...
        raise UserError(f"cannot decode image file {path}: {_one_line(exc)}") from None


# Raw modes in which PIL reads 16 bits per channel into an 8-bit mode. ("RGB;16" and
# "BGR;16" without a byte order are 5-6-5 packed 16-bit pixels, which 8 bits hold exactly.)
_DEEP_TO_8_BIT = re.compile(r"L;16[BLN]?|(?:LA|RGB|RGBA|RGBX|RGBa|CMYK);16[BLN]")
_UNSIGNED_16 = ("I;16", "I;16B", "I;16L", "I;16N")


def _rawmode(tile: Any) -> str:
    """The raw mode of one PIL tile (``args`` is a raw mode or a tuple starting with one)."""
    args = tile[3]
    if isinstance(args, tuple) and args and isinstance(args[0], str):
        return args[0]
    return args if isinstance(args, str) else ""


def _to_rgb(image: Image.Image, tiles: list[Any], path: str | os.PathLike) -> Image.Image | torch.Tensor:
    """A decoded PIL image as in :func:`_load_rgb`; ``tiles`` is its tile list before loading."""
    rawmodes = [_rawmode(tile) for tile in tiles]
    # PIL's PPM decoder rescales samples above 8 bits to the mode: 65535 for grey (mode I),
    # 255 for colour (quantized).
    ppm_maxval = max((tile[3][-1] for tile in tiles if tile[0] in ("ppm", "ppm_plain")
                      and isinstance(tile[3], tuple) and isinstance(tile[3][-1], int)), default=0)
    if image.mode == "F":
        return _grey_tensor(np.asarray(image, dtype=np.float64), path, "float")
    if image.mode.startswith("I;16"):
        scale = 4095.0 if "I;12" in rawmodes else 65535.0
        return _grey_tensor(np.asarray(image, dtype=np.float64) / scale, path, "16-bit")
    if image.mode == "I":
        if (tiles and all(mode in _UNSIGNED_16 for mode in rawmodes)) or ppm_maxval > 255:
            return _grey_tensor(np.asarray(image, dtype=np.float64) / 65535.0, path, "16-bit")
        kind = ", ".join(sorted(set(rawmodes))) or "unknown"
        raise UserError(
            f"image file {path} has 32-bit or signed integer pixels (PIL raw mode {kind}), which have no "
            "defined [0, 1] scale; save it as 8- or 16-bit unsigned, or as float in [0, 1]"
        )
    deep = [mode for mode in rawmodes if _DEEP_TO_8_BIT.fullmatch(mode)]
    if deep or ppm_maxval > 255:
        depth = f"raw mode {deep[0]}" if deep else f"maximum value {ppm_maxval}"
        raise UserError(
            f"image file {path} has 16 bits per channel ({depth}), which PIL reads as 8 bits only; "
            "convert it to 8 bits per channel (or, if it is grey, to 16-bit grey without alpha) first"
        )
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # the same colours; converting directly warns about the alpha
    return image.convert("RGB")


def decoded_image_tensor(image: Image.Image, tiles: list[Any], where: str | os.PathLike) -> torch.Tensor:
    """A loaded PIL image as float32 [C, H, W] in [0, 1] under the rules image files follow
    (bit depths, modes, grey to RGB; UserError naming ``where`` otherwise); ``tiles`` is its
    tile list before loading. The server decodes request images with it."""
    return _to_tensor(_to_rgb(image, tiles, where))


def _grey_tensor(values: np.ndarray, path: str | os.PathLike, kind: str) -> torch.Tensor:
    """A grey image [H, W] in [0, 1] as float32 RGB [3, H, W]; UserError for NaN/inf or values outside [0, 1]."""
    if not np.isfinite(values).all():
        raise UserError(f"image file {path} contains NaN or infinite pixel values")
    low, high = float(values.min()), float(values.max())
    if low < 0 or high > 1:
        raise UserError(f"{kind} image file {path} has pixel values in [{low:g}, {high:g}], outside [0, 1]")
    return torch.from_numpy(values.astype(np.float32)).expand(3, -1, -1).contiguous()


def _to_tensor(image: Image.Image | torch.Tensor) -> torch.Tensor:
    """PIL images to float32 [C, H, W] in [0, 1]; tensors (high-depth images) pass through,
    clamped to [0, 1] against rounding in the resize."""
    if isinstance(image, torch.Tensor):
        return image.clamp(0, 1)
    return transforms.functional.to_tensor(image)


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
    except Exception as exc:  # as in _load_rgb
        raise UserError(f"cannot decode image file {path}: {_one_line(exc)}") from None


def _read_label_file(list_path: Path, base_dir: Path) -> list[tuple[Path, int]]:
    """``(image path, label)`` pairs from a file of ``image label`` lines."""
    try:
        lines = list_path.read_text(encoding="utf-8-sig").splitlines()  # -sig: a BOM is not part of a name
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
    name, label = fields[0].strip(), _parse_label(fields[1].strip(), where)
    image = base_dir / name
    problem = _file_problem(image)
    if problem is not None:
        raise UserError(f"{where}: image file {str(image)!r}: {problem}")
    return image, label


def _parse_label(text: str, where: str) -> int:
    """A label written in ASCII digits, at most ``MAX_LABEL``.

    ``str.isdigit`` and ``int`` also accept other Unicode digits ('²', '٣'), and ``int`` refuses
    more than 4,300 digits with a ValueError; neither reaches them.
    """
    shown = text if len(text) <= 24 else text[:20] + "..."
    if re.fullmatch(r"[0-9]+", text) is None:
        raise UserError(f"{where}: label must be a non-negative integer in ASCII digits, got {shown!r}")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_LABEL)) or int(digits) > MAX_LABEL:
        raise UserError(f"{where}: label {shown} is larger than {MAX_LABEL}")
    return int(digits)


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
            f"not a valid CIFAR-10 python batch: {path}: 'labels' must be {len(data)} integers "
            f"in [0, {MAX_LABEL}]"
        )
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
