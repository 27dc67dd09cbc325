"""The dataset classes, and the selection and checks of their images that certification makes."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import Dataset
from torchvision import datasets

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line
from dmae_fast.data.checks import ensure_readable
from dmae_fast.data.decode import check_image_size, eval_transform, load_rgb, read_image, to_tensor


class TensorImageDataset(Dataset):
    """Images held in memory as one float32 tensor ``[N, C, H, W]`` with values in [0, 1]."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, class_names: list[str] | None = None) -> None:
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(f"images must be [N, C, H, W] with one label each, got {tuple(images.shape)} "
                             f"and {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.class_names = class_names
        self.num_classes = len(class_names) if class_names is not None else max(labels.tolist(), default=-1) + 1
        self.image_shape: tuple[int, int, int] = tuple(images.shape[1:])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


class ImageFolderDataset(datasets.ImageFolder):
    """ImageNet layout (one subfolder of images per class) with the evaluation transform."""

    def __init__(self, root: str | os.PathLike, image_size: int | None) -> None:
        if image_size is None:
            raise UserError(f"an image size is required for the class-folder dataset {root}")
        image_size = check_image_size(image_size)
        if not ensure_readable(Path(root)):
            raise UserError(f"an image folder must be a directory of class subfolders, not the file {root}")
        _check_no_directory_twice(Path(root))
        try:
            super().__init__(root, transform=eval_transform(image_size), loader=load_rgb)
        except OSError as exc:  # no class folder, or one without image files
            raise UserError(f"image folder {root}: {one_line(exc)}") from None
        self.class_names: list[str] | None = list(self.classes)
        self.num_classes = len(self.classes)
        self.image_size = image_size
        self.image_shape = (3, image_size, image_size)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return read_image(path, self.transform, self.image_size, self.image_shape), label


class ImageListDataset(Dataset):
    """Images named by ``(path, label)`` pairs, decoded lazily with PIL. With ``image_size`` they are
    resized and center-cropped (the evaluation transform); without it they must all be ``image_shape``."""

    def __init__(self, samples: list[tuple[Path, int]], image_size: int | None,
                 image_shape: tuple[int, int, int]) -> None:
        self.samples = samples
        self.image_size = image_size
        self.transform = to_tensor if image_size is None else eval_transform(image_size)
        self.class_names: list[str] | None = None
        self.num_classes = max((label for _, label in samples), default=-1) + 1
        self.image_shape = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return read_image(path, self.transform, self.image_size, self.image_shape), label


def subset_indices(length: int, skip: int, max_images: int | None) -> list[int]:
    """Every ``skip``-th index of ``range(length)`` from 0, truncated to ``max_images``."""
    if skip < 1:
        raise UserError(f"skip must be at least 1, got {skip}")
    if max_images is not None and max_images < 1:
        raise UserError(f"max_images must be at least 1, got {max_images}")
    return list(range(0, length, skip))[:max_images]


def check_finite(image: torch.Tensor, index: int) -> None:
    if not bool(torch.isfinite(image).all()):
        raise UserError(f"image {index} contains NaN or infinite pixel values")


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
