"""The CPU fast body (``--fast`` on a CPU), in one folder; building it is :func:`~.runtimes.cpu_classifier` then
:class:`~.body.CpuFastBody` (called by :func:`dmae_fast.batching.bodies.resolve_body`):

* body.py: :class:`~.body.CpuFastBody`, each batch cut into cache-sized chunks classified on one worker thread per
  core, and the chunk sizes;
* runtimes.py: the chunk classifiers (OpenVINO, ONNX Runtime, PyTorch) and which one runs;
* exported.py: the checkpoint exported to ONNX in memory and its parity check against PyTorch, cached;
* cache_keys.py: the keys of those cache entries (the entries: :mod:`dmae_fast.base.disk_cache`).

What it shares stays with its other users: the exported graphs (:mod:`dmae_fast.engines.graphs`) and the logits
comparison (:mod:`dmae_fast.engines.agreement`) with ``dmae-export``, the patch-row layout
(:mod:`dmae_fast.noise.patch_layout`) with the noise kernels."""
