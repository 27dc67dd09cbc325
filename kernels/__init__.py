"""Triton kernels and one C kernel (installed as ``dmae_fast.kernels``), each beside a plain-torch reference.

- :mod:`.fused_frontend`: Gaussian noise fused with the patch embedding, reproducing the noise
  contract of :mod:`dmae_fast.noise.contract` bit for bit (reference: :mod:`.frontend_reference`).
- :mod:`.sound_noise`: ``--sound``'s exact rounded-Gaussian noise on the input's grid and the noisy
  grid inputs ``(X + Z) / L``, bit for bit with :mod:`dmae_fast.noise.sound` (its reference).
- :mod:`.sound_noise_cpu`: the same on a CPU in C (``sound_noise_cpu.c``, compiled on first use, called
  through ctypes): images and the CPU fast body's normalized patch rows, bit for bit with the reference.
- :mod:`.gelu_quantize`: GELU and per-row e4m3 quantization of an fp8 body's fc2 input in one
  pass (reference: :func:`dmae_fast.model.fp8.quantize_rows` of GELU).
"""
