"""The two published certification loops, re-implemented for comparison (no code copied).

Both sample one image at a time: every forward pass holds noisy copies of a single image.

* Cohen et al. (2019): fp32, batch 400, noise ``torch.randn_like(batch) * sigma`` on the
  device, predictions copied to the host and counted with ``numpy.bincount`` per batch.
* DMAE (Wu et al., 2023): fp16 autocast, batch 1000, the same noise, counts kept on the
  device and read once per call.

Their noise is not the project's reproducible contract (it is ``torch.randn``): these loops
exist to time, not to certify.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from dmae_fast.engines.torch_engine import PRECISIONS
from dmae_fast.model.classifier import SmoothingClassifier


@dataclass(frozen=True)
class ReferenceLoop:
    name: str
    precision: str
    batch_size: int
    host_counts: bool  # Cohen: bincount on the host per batch; DMAE: counts on the device

    def counts(self, model: SmoothingClassifier, image: torch.Tensor, num: int, sigma: float) -> np.ndarray:
        """Class counts of ``num`` noisy copies of ``image`` [C, H, W] (on the model's device)."""
        classes = model.spec.num_classes
        dtype = PRECISIONS[self.precision]
        autocast = nullcontext() if dtype is None else torch.autocast(image.device.type, dtype=dtype)
        host = np.zeros(classes, dtype=np.int64)
        device = torch.zeros(classes, dtype=torch.int64, device=image.device)
        remaining = num
        with torch.no_grad(), autocast:
            while remaining > 0:
                size = min(self.batch_size, remaining)
                remaining -= size
                batch = image.repeat(size, 1, 1, 1)
                predictions = model(batch + torch.randn_like(batch) * sigma).argmax(1)
                if self.host_counts:
                    host += np.bincount(predictions.cpu().numpy(), minlength=classes)
                else:
                    device += torch.bincount(predictions, minlength=classes)
        return host if self.host_counts else device.cpu().numpy()


COHEN = ReferenceLoop("reference: Cohen et al.", "fp32", 400, host_counts=True)
DMAE = ReferenceLoop("reference: DMAE", "fp16", 1000, host_counts=False)
REFERENCE_LOOPS = (COHEN, DMAE)
