"""Datasets for certification and training.

Every dataset yields ``(image, label)``: ``image`` is a float32 tensor ``[C, H, W]`` in pixel space with values
in ``[0, 1]`` (no normalization: that belongs to the classifier, after the noise) and ``label`` an ``int``. Every
dataset also carries ``num_classes``, ``class_names`` (``None`` when unknown) and ``image_shape``. Problems with
the user's data raise :class:`~dmae_fast.base.errors.UserError` with a one-line message naming the path.
:func:`open_dataset` (:mod:`.sources`) picks the source for a name or path."""

from dmae_fast.data.cifar import CIFAR_SUBDIR, CIFAR_TRAIN_BATCHES, cifar10
from dmae_fast.data.datasets import TensorImageDataset, check_finite, subset_indices
from dmae_fast.data.decode import decoded_image_tensor
from dmae_fast.data.sources import demo_digits, image_folder, image_list, open_dataset
from dmae_fast.demo_files import DEMO

__all__ = ["CIFAR_SUBDIR", "CIFAR_TRAIN_BATCHES", "DEMO", "TensorImageDataset", "check_finite", "cifar10",
           "decoded_image_tensor", "demo_digits", "image_folder", "image_list", "open_dataset", "subset_indices"]
