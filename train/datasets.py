"""Training data: the demo digits, CIFAR-10 batches or an ImageFolder, with seeded augmentation.

Each training sample's augmentation is seeded from (run seed, dataset index, epoch)
(:func:`~dmae_fast.train.randomness.sample_seed`), so it does not depend on the DataLoader
worker, the process or the restart that loads it. Samples are ``(image, label, index)``:
``image`` float32 [C, H, W] in [0, 1] (no normalization: it belongs to the model, after
the noise), ``index`` the sample's position in the training split (it keys the noise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets, transforms
from torchvision.transforms import InterpolationMode

from dmae_fast.base.errors import UserError
from dmae_fast.data import CIFAR_SUBDIR, CIFAR_TRAIN_BATCHES, DEMO, cifar10, demo_digits
from dmae_fast.model.config import NORMALIZATIONS
from dmae_fast.train.config import DataConfig
from dmae_fast.train.inputs import training_data_dir
from dmae_fast.train.randomness import sample_seed

Transform = Callable[[Any], torch.Tensor]


class SeededAugment(Dataset):
    """``base[indices[i]]`` augmented with a per-(sample, epoch) seed; yields (image, label, i)."""

    def __init__(self, base: Dataset, indices: list[int], transform: Transform, seed: int) -> None:
        self.base, self.indices, self.transform, self.seed = base, indices, transform, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Called before each epoch's DataLoader iterator is created (workers copy it)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        image, label = self.base[self.indices[i]]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.seed, i, self.epoch))
            return self.transform(image), int(label), i


@dataclass
class TrainingData:
    """The training split (augmented), the held-out split (plain) and what the model needs."""

    train: SeededAugment
    holdout: SeededAugment | None
    num_classes: int
    class_names: tuple[str, ...] | None
    input_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def open_training_data(config: DataConfig, seed: int) -> TrainingData:
    """Open ``config.dataset``'s training images; one-line UserError for a bad path."""
    base, native_size, pil = _open_source(config.dataset, config.input_size)
    size = config.input_size or native_size
    indices = list(range(len(base)))
    if config.limit is not None:
        if config.limit > len(indices):
            raise UserError(f"data.limit={config.limit}: {config.dataset} has only {len(indices)} training images")
        indices = indices[: config.limit]
    held: list[int] = []
    if config.holdout > 0:
        order = np.random.default_rng(seed).permutation(len(indices))
        count = max(1, round(config.holdout * len(indices)))
        held = sorted(indices[i] for i in order[:count])
        indices = sorted(indices[i] for i in order[count:])
    if len(indices) < 1:
        raise UserError(f"dataset {config.dataset}: no training images left after the held-out split")
    names = getattr(base, "class_names", None) or getattr(base, "classes", None)
    mean, std = _normalization(config, base)
    train_tf, eval_tf = _train_transform(config, size, pil, native_size), _eval_transform(size, pil, native_size)
    return TrainingData(
        train=SeededAugment(base, indices, train_tf, seed),
        holdout=SeededAugment(base, held, eval_tf, seed) if held else None,
        num_classes=int(getattr(base, "num_classes", 0) or len(names)),
        class_names=tuple(names) if names else None,
        input_size=size,
        mean=mean,
        std=std,
    )


def _open_source(spec: str, input_size: int | None) -> tuple[Dataset, int, bool]:
    """(dataset yielding (image, label), native image size, whether images are PIL)."""
    if spec == DEMO:
        return demo_digits("train"), 8, False
    path = training_data_dir(spec)
    if (path / CIFAR_TRAIN_BATCHES[0]).exists() or (path / CIFAR_SUBDIR).is_dir():
        return cifar10(path, "train"), 32, False
    try:
        folder = datasets.ImageFolder(str(path), loader=_load_rgb)
    except (FileNotFoundError, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"training data {spec}: not a CIFAR-10 directory nor an image folder ({first})") from None
    if len(folder) == 0:
        raise UserError(f"training data {spec} is empty")
    return folder, input_size or 224, True


def _normalization(config: DataConfig, base: Dataset) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Fixed statistics, or (``dataset``) those of the whole training split, so that
    pre-training and fine-tuning on the same data normalize alike whatever the holdout."""
    if config.normalization != "dataset":
        return NORMALIZATIONS[config.normalization]
    images = getattr(base, "images", None)
    if images is None:
        raise UserError("data.normalization=dataset needs an in-memory dataset (demo or CIFAR-10)")

    def rounded(t: torch.Tensor) -> tuple[float, ...]:
        return tuple(round(v, 4) for v in t.tolist())

    mean, std = rounded(images.mean(dim=(0, 2, 3))), rounded(images.std(dim=(0, 2, 3)))
    if min(std) <= 0:
        raise UserError(f"data.normalization=dataset: the training images of {config.dataset} do not vary "
                        f"(per-channel std {std}); choose imagenet or cifar10")
    return mean, std


def _train_transform(config: DataConfig, size: int, pil: bool, native_size: int) -> Transform:
    """RandomResizedCrop (bicubic; without it a resize to ``size``) + flip (+ RandAugment)
    -> float tensor in [0, 1]."""
    steps: list[Any] = []
    if config.randaug:
        from timm.data.auto_augment import rand_augment_transform

        if not pil:
            steps.append(transforms.ToPILImage())
        pil = True
    if config.crop_scale is not None:
        steps.append(transforms.RandomResizedCrop(size, scale=config.crop_scale,
                                                  interpolation=InterpolationMode.BICUBIC))
    elif pil:
        steps += [transforms.Resize(size, interpolation=InterpolationMode.BICUBIC), transforms.CenterCrop(size)]
    elif size != native_size:  # square tensors (demo, CIFAR-10)
        steps.append(transforms.Resize(size, interpolation=InterpolationMode.BICUBIC))
    if config.hflip:
        steps.append(transforms.RandomHorizontalFlip())
    if config.randaug:
        try:
            steps.append(rand_augment_transform(config.randaug, {"translate_const": int(size * 0.45)}))
        except Exception as error:  # noqa: BLE001 (timm asserts, or fails to parse a number)
            raise UserError(f"data.randaug {config.randaug!r} is not a timm RandAugment spec such as "
                            f"rand-m9-mstd0.5-inc1 ({str(error) or type(error).__name__})") from None
    if pil:
        steps.append(transforms.ToTensor())
    steps.append(_clamp_unit)
    return transforms.Compose(steps)


def _eval_transform(size: int, pil: bool, native_size: int) -> Transform:
    if not pil:
        if size == native_size:
            return _clamp_unit
        return transforms.Compose([transforms.Resize(size, interpolation=InterpolationMode.BICUBIC), _clamp_unit])
    return transforms.Compose([
        transforms.Resize(int(size / 0.875), interpolation=InterpolationMode.BICUBIC),
        transforms.CenterCrop(size), transforms.ToTensor(),
    ])


class UnreadableImage(UserError):
    """A training image that cannot be decoded. A DataLoader worker re-raises it in the main
    process with the worker's traceback as its message: only the last line is kept."""

    def __init__(self, message: str) -> None:
        if "Original Traceback" in message:  # "...\ndmae_fast.train.datasets.UnreadableImage: <message>"
            message = message.strip().splitlines()[-1].split(": ", 1)[-1]
        super().__init__(message)


def _load_rgb(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except Exception as error:  # noqa: BLE001 (PIL raises many types for broken files)
        raise UnreadableImage(f"training image {path} cannot be read: {str(error) or type(error).__name__}") from None


def _clamp_unit(image: torch.Tensor) -> torch.Tensor:
    """Bicubic resampling overshoots slightly; images stay in [0, 1]."""
    return image.clamp(0.0, 1.0)
