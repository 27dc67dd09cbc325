"""dmae-fast: certified-robust classification with Denoising Masked Autoencoders.

The public entry points are importable from here (loaded on first use, so that importing one
light submodule does not import torch): :func:`certify_dataset` and :class:`CertifyConfig` (a whole
run), :class:`StreamingCertifier` (many images, full batches), :class:`Smooth` (the one-image
reference loop) and :class:`SamplingPlan`.
"""

from dmae_fast.base.lazy import keep_former_names, lazy_attributes

__version__ = "0.1.0"
__all__ = ["CertifyConfig", "SamplingPlan", "Smooth", "StreamingCertifier", "certify_dataset"]
__getattr__ = lazy_attributes("dmae_fast", {
    "certify_dataset": "run.driver", "CertifyConfig": "run.config", "StreamingCertifier": "batching.stream",
    "Smooth": "batching.smooth", "SamplingPlan": "stats.plan",
})
keep_former_names({  # modules that moved to their concept's folder: the former names still import them
    **{f"dmae_fast.{name}": f"dmae_fast.base.{name}" for name in
       ("errors", "files", "integrity", "locking", "memory", "lazy", "command")},
    "dmae_fast.fast_noise": "dmae_fast.noise.compiled", "dmae_fast.sound_noise": "dmae_fast.noise.sound",
    "dmae_fast.patch_layout": "dmae_fast.noise.patch_layout", "dmae_fast.checkpoints": "dmae_fast.model.checkpoints",
    "dmae_fast.model_cache": "dmae_fast.engines.model_cache", "dmae_fast.run.results": "dmae_fast.results.format",
    "dmae_fast.run.results_writer": "dmae_fast.results.writer", "dmae_fast.run.resume": "dmae_fast.results.checks",
    "dmae_fast.run.parts": "dmae_fast.results.parts", "dmae_fast.batching.core": "dmae_fast.batching.smooth",
    "dmae_fast.batching.fast_stream": "dmae_fast.batching.fast_body",
    "dmae_fast.serve.scheduler": "dmae_fast.serve.device_thread",
    **{f"dmae_fast.run.{name}": f"dmae_fast.distributed.{name}" for name in ("ranks", "launch", "torchrun_env")},
    "dmae_fast.batching.smoother": "dmae_fast.batching.classifier",
})
