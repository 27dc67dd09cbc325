"""The noise contract at memory speed: the reference function compiled into one kernel.

:func:`dmae_fast.noise.gaussian_rows` written as torch ops runs dozens of elementwise
passes over int64 tensors per batch. ``torch.compile`` (Inductor) turns the same function,
together with the gather of the clean images and ``x + sigma * eta``, into one kernel: vectorized
C++ on a CPU, one Triton kernel on a GPU. The Philox words are the same bit for bit; the
Gaussians agree with the reference to float32 rounding (the compiled log/sin/cos may round
differently in the last bit).

With ``serial=True`` (the CPU fast path) the kernel is compiled for one thread and with
Inductor's C++ wrapper, which releases the GIL: several worker threads then each make their own
rows' noise at once, one core each, instead of waiting on one multi-threaded call.

For the CPU fast path's patch-input classifiers, :func:`noisy_patches` writes the same noise
values in a :class:`~dmae_fast.patch_layout.PatchLayout`, normalized.

Where compiling is impossible (no C++ compiler, no Triton) or the compiled kernel does not
reproduce the reference on a check batch, :class:`NoiseSource` says so in one line (to its
``notice``, which the batch bodies also keep in the run record) and runs the reference instead.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch

from dmae_fast.noise import (
    box_muller,
    check_seed,
    gaussian_noise,
    gaussian_rows,
    key_words,
    philox4x32,
)
from dmae_fast.patch_layout import PatchLayout

COMPILED, REFERENCE = "compiled", "torch ops"
# The compiled Gaussians differ from the reference by a few float32 ulps (|eta| < 6).
CHECK_TOLERANCE = 1e-5
# Inductor options of a kernel that runs on its caller's thread alone and frees the GIL meanwhile.
SERIAL_OPTIONS = {"cpp.threads": 1, "cpp_wrapper": True}


def noisy_rows(clean: torch.Tensor, slot: torch.Tensor, sigma: torch.Tensor, key: torch.Tensor,
               image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """``clean[slot] + sigma * eta`` [B, *shape]: the noisy inputs of B rows.

    ``clean`` [S, *shape] holds the clean images by slot; ``key`` [2] the Philox key words and
    ``sigma`` a 0-d tensor, so that a new seed or sigma reuses the compiled kernel.
    """
    shape = clean.shape[1:]
    eta = gaussian_rows((key[0], key[1]), image, phase, sample, math.prod(shape))
    return clean[slot] + sigma * eta.view(-1, *shape)


def noisy_patches(clean: torch.Tensor, slot: torch.Tensor, sigma: torch.Tensor, key: torch.Tensor,
                  image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor, counters: torch.Tensor,
                  mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``(clean[slot] + sigma * eta - mean) / std`` [B, L, C*p*p]: the normalized noisy inputs of
    B rows in a :class:`~dmae_fast.patch_layout.PatchLayout`, whose ``counters`` (and per-value
    ``mean``, ``std``) are passed; ``clean`` [S, L, C*p*p] holds the arranged clean images."""
    column = lambda v: v.view(-1, 1, 1)  # noqa: E731
    words = philox4x32((counters, column(sample), column(image), column(phase)), (key[0], key[1]))
    eta = torch.stack(box_muller(words), dim=-1).view(len(slot), *clean.shape[1:])  # [B, L, C*p*p/4, word]
    return (clean[slot] + sigma * eta - mean) / std


def _reference(clean: torch.Tensor, sigma: float, seed: int, rows: tuple[torch.Tensor, ...],
               layout: PatchLayout | None) -> torch.Tensor:
    """:func:`noisy_rows` (or :func:`noisy_patches` with a layout) with the torch-op reference noise."""
    slot, image, phase, sample = rows
    if layout is None:
        return clean[slot] + sigma * gaussian_noise(seed, image, phase, sample, tuple(clean.shape[1:]))
    eta = layout.arrange(gaussian_noise(seed, image, phase, sample, (layout.channels, layout.size, layout.size)))
    mean, std = layout.normalization
    return (clean[slot] + sigma * eta - mean) / std


def _print_notice(message: str) -> None:
    print(f"dmae-fast: {message}", file=sys.stderr)


@contextmanager
def _quiet_compiler():
    """Inductor logs a CUDA_HOME warning on CPU-only machines; it is not the user's concern."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class NoiseSource:
    """Builds the noisy inputs of a batch of rows, compiled when possible (see the module doc).

    ``implementation`` says which runs: ``"compiled"`` or ``"torch ops"`` (the reference).
    ``serial``: a one-thread kernel that releases the GIL, for calls from several threads at once
    after the first call (which compiles and checks it, and must not be made concurrently).
    Dynamo guards on the calling thread's torch thread count and grad mode, so the first call
    must be made in the state of the later ones (as :class:`ChunkedCpuBatches` does), or each
    thread recompiles an unchecked kernel, concurrently (an error in torch 2.11).
    ``layout``: make a :class:`~dmae_fast.patch_layout.PatchLayout`'s normalized patch rows
    (:func:`noisy_patches`) from clean images stored arranged, instead of noisy images.
    ``notice``: where the one-line fallback notice goes (default: stderr).
    """

    def __init__(self, device: torch.device, compiled: bool = True, serial: bool = False,
                 layout: PatchLayout | None = None, notice: Callable[[str], None] | None = None) -> None:
        self.device, self.layout = device, layout
        self._notice = notice or _print_notice
        self.implementation = COMPILED if compiled else REFERENCE
        options = SERIAL_OPTIONS if serial else None
        function = noisy_rows if layout is None else noisy_patches
        self._compiled = torch.compile(function, dynamic=None, options=options) if compiled else None
        self._layout_tensors = () if layout is None else (layout.counters.to(device),
                                                         *(t.to(device) for t in layout.normalization))
        self._checked = False
        self._key: tuple[int, torch.Tensor] | None = None
        self._sigma: tuple[float, torch.Tensor] | None = None

    def __call__(self, clean: torch.Tensor, slot: torch.Tensor, sigma: float, seed: int, image: torch.Tensor,
                 phase: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        rows = (slot, image, phase, sample)
        if self._compiled is not None:
            try:
                noisy = self._run_compiled(clean, sigma, seed, rows)
            except Exception as error:  # noqa: BLE001 (a missing compiler fails in many ways)
                if self._checked:
                    raise
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
                self._fall_back(f"compiling it failed ({type(error).__name__}: {reason})")
            else:
                if self._checked or self._agrees(noisy, clean, sigma, seed, rows):
                    return noisy
        return _reference(clean, sigma, seed, rows, self.layout)

    def _run_compiled(self, clean: torch.Tensor, sigma: float, seed: int,
                      rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """One compiled program for every batch size and slot count: the row and slot axes are
        marked dynamic (a recompiled kernel would run unchecked, and on several workers at once)."""
        count = len(rows[0])
        # Fresh columns (a lone row twice, since Inductor specializes sizes 0 and 1): a chunk cut
        # from a batch is a view at some storage offset, which Dynamo would guard on and recompile.
        rows = tuple(torch.cat((r, r)) if count == 1 else r.clone() for r in rows)
        for column in rows:
            torch._dynamo.mark_dynamic(column, 0)
        if len(clean) == 1:  # a lone slot twice, likewise
            clean = torch.cat((clean, clean))
        torch._dynamo.mark_dynamic(clean, 0)
        slot, image, phase, sample = rows
        quiet = _quiet_compiler() if not self._checked else nullcontext()  # only the first call compiles
        with quiet:
            noisy = self._compiled(clean, slot, self._sigma_tensor(sigma), self._key_tensor(seed), image, phase, sample,
                                   *self._layout_tensors)
        return noisy[:count]

    def _agrees(self, noisy: torch.Tensor, clean: torch.Tensor, sigma: float, seed: int,
                rows: tuple[torch.Tensor, ...]) -> bool:
        """After the first compiled batch: do its first rows match the reference? If not, fall
        back with a one-line notice (a miscompiled kernel must not certify anything)."""
        self._checked = True
        want = _reference(clean, sigma, seed, tuple(r[:4] for r in rows), self.layout)
        # sigma * (a few ulps of eta), plus the rounding of x + sigma * eta (pixels are at most a few units),
        # over the std where the inputs are normalized
        tolerance = (CHECK_TOLERANCE * sigma + 1e-6) / (1.0 if self.layout is None else min(self.layout.std))
        if torch.allclose(noisy[: len(want)], want, rtol=0, atol=tolerance):
            return True
        self._fall_back("the compiled kernel does not reproduce the reference")
        return False

    def _key_tensor(self, seed: int) -> torch.Tensor:
        if self._key is None or self._key[0] != seed:
            check_seed(seed)
            self._key = seed, torch.tensor(key_words(seed), dtype=torch.int64, device=self.device)
        return self._key[1]

    def _sigma_tensor(self, sigma: float) -> torch.Tensor:
        if self._sigma is None or self._sigma[0] != sigma:
            self._sigma = sigma, torch.tensor(sigma, dtype=torch.float32, device=self.device)
        return self._sigma[1]

    def _fall_back(self, why: str) -> None:
        self._notice(f"compiled noise unavailable ({why}); using the torch-op reference (slower, same noise)")
        self._compiled = None
        self.implementation = REFERENCE
