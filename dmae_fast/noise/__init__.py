"""The noise: its contract and torch reference (:mod:`.contract`, whose functions are importable from here), the
compiled noise, ``--sound``'s rounded Gaussian and the patch-row layout; the Triton and C kernels are in kernels/."""

from dmae_fast.base.lazy import lazy_attributes

__getattr__ = lazy_attributes("dmae_fast.noise", {name: "contract" for name in (
    "key_words", "philox4x32", "check_seed", "uint32_stream", "words_to_uniform", "gaussian_rows", "box_muller",
    "gaussian_noise", "ROUNDS")})
