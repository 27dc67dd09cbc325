"""The noise: its contract and torch reference (:mod:`.contract`), the compiled noise and its checks
(:mod:`.compiled`), ``--sound``'s rounded Gaussian (:mod:`.sound`) and the patch-row layout the CPU bodies
feed (:mod:`.patch_layout`). Its Triton and C kernels live in ``kernels/`` (``dmae_fast.kernels``), each
beside this reference; the exact thresholds of ``--sound`` in ``dmae_fast.stats.rounded_gaussian`` (no torch).
The contract's functions are importable from here."""

from dmae_fast.base.lazy import lazy_attributes

__getattr__ = lazy_attributes("dmae_fast.noise", {name: "contract" for name in (
    "key_words", "philox4x32", "check_seed", "uint32_stream", "words_to_uniform", "gaussian_rows", "box_muller",
    "gaussian_noise", "ROUNDS")})
