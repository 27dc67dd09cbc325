"""Datasets for certification and training.

Every dataset yields ``(image, label)``: ``image`` is a float32 tensor ``[C, H, W]`` in
pixel space with values in ``[0, 1]`` -- no normalization, which belongs to the
classifier, after the noise -- and ``label`` is an ``int``.  Every dataset object also
carries ``num_classes``, ``class_names`` (``None`` when unknown) and ``image_shape``
(``(C, H, W)``).  Problems with the user's data raise :class:`~dmae_fast.base.errors.UserError`
with a one-line message naming the path.

* :mod:`.sources`: :func:`open_dataset` and its sources: the built-in demo set (scikit-learn's
  8x8 digits), ImageNet-style class folders and image lists;
* :mod:`.cifar`: CIFAR-10 python batches;
* :mod:`.datasets`: the dataset classes, :func:`subset_indices` and :func:`check_finite`;
* :mod:`.decode`: image files to tensors (the server's request images too), the evaluation transform;
* :mod:`.labels`: label files; :mod:`.checks`: the path and split checks the sources share.
"""

from dmae_fast.data.cifar import CIFAR_SUBDIR, CIFAR_TRAIN_BATCHES, cifar10
from dmae_fast.data.datasets import TensorImageDataset, check_finite, subset_indices
from dmae_fast.data.decode import decoded_image_tensor
from dmae_fast.data.sources import demo_digits, image_folder, image_list, open_dataset
from dmae_fast.demo_files import DEMO

__all__ = ["CIFAR_SUBDIR", "CIFAR_TRAIN_BATCHES", "DEMO", "TensorImageDataset", "check_finite", "cifar10",
           "decoded_image_tensor", "demo_digits", "image_folder", "image_list", "open_dataset", "subset_indices"]
