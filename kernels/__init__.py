"""Triton kernels (installed as ``dmae_fast.kernels``), each beside a plain-torch reference.

Planned first: Gaussian noise generation fused with the patch embedding, reproducing the
noise contract of :mod:`dmae_fast.noise` bit for bit (the fast-path issue).
"""
