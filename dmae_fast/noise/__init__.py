"""The noise: its contract and torch reference (:mod:`.contract`), the compiled noise, ``--sound``'s rounded Gaussian
and the patch-row layout; the Triton and C kernels are in kernels/."""
