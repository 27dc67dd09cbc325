"""The dataset sources, and :func:`open_dataset`, which picks one for a name or path."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import datasets

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line
from dmae_fast.base.paths import dataset_path, ensure_readable
from dmae_fast.data.checks import check_split
from dmae_fast.data.cifar import CIFAR_TEST_BATCH, cifar10, cifar_dir
from dmae_fast.data.datasets import ImageListDataset, TensorImageDataset
from dmae_fast.data.decode import check_image_size
from dmae_fast.data.labels import read_label_file
from dmae_fast.demo_files import DEMO, DEMO_HAS_LABELS

DEMO_TEST_SIZE = 500
DEMO_DIGITS = Path(__file__).parents[1] / "assets" / "demo-digits.safetensors"
LIST_SUFFIXES = (".txt", ".tsv", ".csv")


def demo_digits(split: str) -> TensorImageDataset:
    """The built-in demo set: scikit-learn's 8x8 digits as ``[3, 8, 8]`` images in [0, 1].

    Read from ``DEMO_DIGITS`` (the 1,797 digits as stored by scikit-learn, grey levels 0-16;
    ``scripts/make_demo_digits.py`` writes it). The first ``DEMO_TEST_SIZE`` of
    ``np.random.default_rng(0).permutation(1797)`` are the test set, the rest the training set."""
    from safetensors.numpy import load_file

    check_split(split)
    digits = load_file(DEMO_DIGITS)
    perm = np.random.default_rng(0).permutation(len(digits["labels"]))
    indices = perm[:DEMO_TEST_SIZE] if split == "test" else perm[DEMO_TEST_SIZE:]
    images = torch.from_numpy((digits["images"][indices] / 16.0).astype(np.float32))
    labels = torch.from_numpy(digits["labels"][indices].astype(np.int64))
    return TensorImageDataset(images.unsqueeze(1).repeat(1, 3, 1, 1), labels, [str(d) for d in range(10)])


def image_folder(root: str | os.PathLike, image_size: int | None) -> ImageListDataset:
    """ImageNet layout: class subfolders of images, resized and center-cropped to ``image_size`` (required),
    found as by :class:`torchvision.datasets.ImageFolder`; a symlink loop is refused."""
    if image_size is None:
        raise UserError(f"an image size is required for the class-folder dataset {root}")
    image_size = check_image_size(image_size)
    if not ensure_readable(Path(root)):
        raise UserError(f"an image folder must be a directory of class subfolders, not the file {root}")
    _check_no_directory_twice(Path(root))
    try:
        folder = datasets.ImageFolder(root)  # lists the images and their classes; reads no image
    except OSError as exc:  # no class folder, or one without image files
        raise UserError(f"image folder {root}: {one_line(exc)}") from None
    return ImageListDataset(folder.samples, image_size, list(folder.classes))


def _check_no_directory_twice(root: Path) -> None:
    """Refuse a folder tree that reaches one directory twice through symbolic links: ImageFolder follows
    links, so a loop would list the same images over and over (until the OS's symlink-depth limit)."""
    seen: dict[str, str] = {}
    for directory, _, _ in os.walk(root, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:
            raise UserError(f"image folder {root}: {directory} is the directory {seen[real]} again "
                            "(a symbolic link loop, or a second link to it); every image must be reached once")
        seen[real] = directory


def image_list(path: str | os.PathLike, image_size: int | None,
               labels: str | os.PathLike | None = None) -> ImageListDataset:
    """Images named by a list file (``.txt``/``.tsv``/``.csv``, ``image label`` lines, paths relative to it), or a
    directory of images whose ``labels`` file has ``filename label`` lines. With ``image_size`` the images are
    resized and center-cropped as in :func:`image_folder`; without it they must all have the same size."""
    if image_size is not None:
        image_size = check_image_size(image_size)
    if str(path) == "":
        raise UserError("the dataset path is empty")
    path = Path(path)
    if ensure_readable(path):
        if labels is None:
            raise UserError(f"a directory of images needs a labels file of 'filename label' lines: {path}")
        if str(labels) == "":
            raise UserError("the labels file path is empty")
        if ensure_readable(Path(labels)):
            raise UserError(f"the labels file {labels} is a directory")
        samples = read_label_file(Path(labels), path)
    else:
        if labels is not None:
            raise UserError(f"a labels file only applies to a directory of images, not to the list file {path}")
        if path.suffix.lower() not in LIST_SUFFIXES:
            raise UserError(f"unsupported dataset file {path}: expected an image list ({', '.join(LIST_SUFFIXES)})")
        samples = read_label_file(path, path.parent)
    if not samples:
        raise UserError(f"dataset is empty: no images listed in {labels if path.is_dir() else path}")
    return ImageListDataset(samples, image_size)


def open_dataset(spec: str, *, split: str = "test", image_size: int | None = None,
                 labels: str | None = None) -> Dataset:
    """Open the dataset named by ``spec``: ``"demo"`` (:func:`demo_digits`), a directory of CIFAR-10 python batches
    (:func:`cifar10`), a directory with ``labels`` or a file (:func:`image_list`), or a directory of class
    subfolders (:func:`image_folder`). ``image_size`` (for image files) must be at least 1 whatever the source."""
    if image_size is not None:
        image_size = check_image_size(image_size)
    if spec == DEMO:
        if labels is not None:
            raise UserError(DEMO_HAS_LABELS)
        return demo_digits(split)
    dataset = _open_path(dataset_path(spec), split, image_size, labels)
    if len(dataset) == 0:
        raise UserError(f"dataset is empty: {spec}")
    return dataset


def _open_path(path: Path, split: str, image_size: int | None, labels: str | None) -> Dataset:
    """Dispatch an existing, readable path to the matching dataset source."""
    if not path.is_dir() or labels is not None:
        return image_list(path, image_size, labels)
    if cifar_dir(path) is not None:
        return cifar10(path, split)
    if _has_subdirectories(path):
        return image_folder(path, image_size)
    raise UserError(f"no recognised dataset layout in {path}: expected CIFAR-10 python batches "
                    f"({CIFAR_TEST_BATCH}, data_batch_1..5), class subfolders of images (ImageNet layout), "
                    "or a flat directory of images together with a labels file")


def _has_subdirectories(path: Path) -> bool:
    """Whether ``path`` holds at least one non-hidden subdirectory."""
    try:
        with os.scandir(path) as entries:
            return any(entry.is_dir() and not entry.name.startswith(".") for entry in entries)
    except OSError as exc:
        raise UserError(f"cannot list directory {path}: {one_line(exc)}") from None
