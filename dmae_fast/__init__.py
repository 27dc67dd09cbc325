"""dmae-fast: certified-robust classification with Denoising Masked Autoencoders.

The public entry points are importable from here (loaded on first use, so that importing one
light submodule does not import torch): :func:`certify_dataset` and :class:`CertifyConfig` (a whole
run), :class:`Smoothing` (what is smoothed: classifier, sigma, seed, batch size, ``--sound``),
:class:`StreamingCertifier` (many images, full batches), :class:`Smooth` (the one-image reference loop) and
:class:`SamplingPlan`.
"""

from dmae_fast.base.lazy import lazy_attributes

__version__ = "0.1.0"
__all__ = ["CertifyConfig", "SamplingPlan", "Smooth", "Smoothing", "StreamingCertifier", "certify_dataset"]
__getattr__ = lazy_attributes("dmae_fast", {
    "certify_dataset": "run.driver", "CertifyConfig": "run.config", "StreamingCertifier": "batching.stream",
    "Smooth": "batching.smooth", "Smoothing": "batching.smoothing", "SamplingPlan": "stats.plan",
})
