"""The dataset classes, and the selection and checks of their images that certification makes."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from dmae_fast.base.errors import UserError
from dmae_fast.data.decode import common_size, eval_transform, read_image, to_tensor


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


class ImageListDataset(Dataset):
    """Images named by ``(path, label)`` pairs, decoded lazily with PIL. With ``image_size`` they are
    resized and center-cropped (the evaluation transform); without it they must all have the same size."""

    def __init__(self, samples: Sequence[tuple[str | os.PathLike, int]], image_size: int | None,
                 class_names: list[str] | None = None) -> None:
        self.samples = samples
        self.image_size = image_size
        self.transform = to_tensor if image_size is None else eval_transform(image_size)
        self.class_names = class_names
        labels = [label for _, label in samples]
        self.num_classes = len(class_names) if class_names is not None else max(labels, default=-1) + 1
        if image_size is None:
            width, height = common_size([path for path, _ in samples])
            self.image_shape = (3, height, width)
        else:
            self.image_shape = (3, image_size, image_size)

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
