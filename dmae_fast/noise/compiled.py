"""The noise contract at memory speed: the reference function compiled into one kernel.

``torch.compile`` (Inductor) fuses :func:`dmae_fast.noise.contract.gaussian_rows` with the gather of the clean
images and ``x + sigma * eta`` into one kernel (C++ on a CPU, Triton on a GPU): the same Philox words bit for bit,
the Gaussians to float32 rounding. With a ``grid`` (``--sound``) the inputs are the grid points ``(X + Z) / L`` of
:mod:`dmae_fast.noise.sound`'s exact rounded Gaussian, drawn by the Triton kernel :mod:`dmae_fast.kernels.sound_noise`
on a GPU and the C kernel :mod:`dmae_fast.kernels.sound_noise_cpu` on a CPU: every implementation draws the same
integers.

Where compiling is impossible or a kernel does not reproduce the reference on a check batch, :class:`NoiseSource`
says so in one line (to its ``notice``) and runs the reference (or, for a C kernel, the compiled torch ops) instead."""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

import torch

from dmae_fast.base.messages import one_line, print_notice
from dmae_fast.noise.contract import box_muller, check_seed, gaussian_noise, gaussian_rows, key_words, philox4x32
from dmae_fast.noise.patch_layout import PatchLayout
from dmae_fast.noise.sound import guide_lookup, guide_table, interleave, signed_uniform, sound_rows
from dmae_fast.stats.rounded_gaussian import SoundTable, sound_table

COMPILED, REFERENCE, TRITON_KERNEL, C_KERNEL = "compiled", "torch ops", "Triton kernel", "C kernel"
# The compiled Gaussians differ from the reference by a few float32 ulps (|eta| < 6).
CHECK_TOLERANCE = 1e-5
# Inductor options of a kernel that runs on its caller's thread alone and frees the GIL meanwhile.
SERIAL_OPTIONS = {"cpp.threads": 1, "cpp_wrapper": True}


# torch 2.11 (fixed in 2.12): once the thread that made a process's first Dynamo trace has ended, every later trace
# segfaults, in any thread (bench/results/2026-12-07-torch-2.11).
FIRST_TRACE_FIXED = "2.12"
_main_traced = threading.Event()


def main_thread_traces_first() -> None:
    """On torch < 2.12, have the main thread make the process's first Dynamo trace (a one-line function, the eager
    backend), so that compiling in a worker thread that later ends cannot crash the next compile. Call it before a
    worker thread may compile; it does nothing on a newer torch, off the main thread, or after the first time."""
    if (torch.__version__ >= FIRST_TRACE_FIXED or _main_traced.is_set()
            or threading.current_thread() is not threading.main_thread()):
        return
    with suppress(Exception):  # no Dynamo here (an unsupported Python): nothing will trace
        torch.compile(lambda x: x + 1, backend="eager", dynamic=False)(torch.zeros(1))
    _main_traced.set()


def compile_for_any_thread(function: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``torch.compile(function, **options)``, whose first call may come from a worker thread (made safe on
    torch 2.11 by :func:`main_thread_traces_first`, run here on the main thread)."""
    main_thread_traces_first()
    return torch.compile(function, **options)


def noisy_rows(clean: torch.Tensor, slot: torch.Tensor, sigma: torch.Tensor, key: torch.Tensor,
               image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """``clean[slot] + sigma * eta`` [B, *shape] of the clean images [S, *shape] by slot; ``key`` [2] (the Philox
    key words) and ``sigma`` (0-d) are tensors, so that a new seed or sigma reuses the compiled kernel."""
    shape = clean.shape[1:]
    eta = gaussian_rows((key[0], key[1]), image, phase, sample, math.prod(shape))
    return clean[slot] + sigma * eta.view(-1, *shape)


def noisy_patches(clean: torch.Tensor, slot: torch.Tensor, sigma: torch.Tensor, key: torch.Tensor,
                  image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor, counters: torch.Tensor,
                  mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``(clean[slot] + sigma * eta - mean) / std`` [B, L, C*p*p]: the normalized noisy inputs of
    B rows in a :class:`~dmae_fast.noise.patch_layout.PatchLayout`, whose ``counters`` (and per-value
    ``mean``, ``std``) are passed; ``clean`` [S, L, C*p*p] holds the arranged clean images."""
    column = lambda v: v.view(-1, 1, 1)  # noqa: E731
    words = philox4x32((counters, column(sample), column(image), column(phase)), (key[0], key[1]))
    eta = torch.stack(box_muller(words), dim=-1).view(len(slot), *clean.shape[1:])  # [B, L, C*p*p/4, word]
    return (clean[slot] + sigma * eta - mean) / std


def sound_images(clean: torch.Tensor, slot: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor],
                 key: torch.Tensor, image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor, *, grid: int,
                 fused: bool = True) -> torch.Tensor:
    """``(X + Z) / L`` [B, *shape]: :func:`~dmae_fast.noise.sound.sound_rows` for ``table`` (the 2K thresholds and
    their guide), as :class:`NoiseSource` compiles it (``fused``: the guide's lookup, for a compiler)."""
    thresholds, guide = table
    return sound_rows(clean, slot, grid, thresholds, thresholds.shape[0] // 2, key, image, phase, sample,
                      guide if fused else None)


def sound_patches(clean: torch.Tensor, slot: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor],
                  key: torch.Tensor, image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor,
                  counters: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, *, grid: int,
                  fused: bool = True) -> torch.Tensor:
    """``((X + Z) / L - mean) / std`` [B, L, C*p*p]: the sound inputs of B rows in a patch layout (its ``counters``,
    flat pixel index // 4 of each group of four, passed) of the arranged clean images [S, L, C*p*p]; ``table`` as
    :func:`sound_images` takes it. Pixels 4c, 4c+1 take Philox counter 2c and 4c+2, 4c+3 counter 2c+1 (the
    contract's e // 2), so the integers are :func:`~dmae_fast.noise.sound.rounded_gaussian_rows`'."""
    column = lambda v: v.view(-1, 1, 1)  # noqa: E731
    rest = (column(sample), column(image), column(phase))
    words = philox4x32((2 * counters, *rest), (key[0], key[1])) + \
        philox4x32((2 * counters + 1, *rest), (key[0], key[1]))
    uniforms = [signed_uniform(words[i], words[i + 1]) for i in range(0, 8, 2)]
    thresholds, guide = table
    if fused:  # looked up before interleaving, in int32, as rounded_gaussian_rows does
        noise = interleave(*(guide_lookup(guide, u).to(torch.int32) for u in uniforms))
    else:
        noise = torch.searchsorted(thresholds, interleave(*uniforms), right=True) - len(thresholds) // 2
    total = torch.round(clean[slot] * grid).to(torch.int64) + noise.view(len(slot), *clean.shape[1:])
    return (total.to(torch.float32) / grid - mean) / std


@functools.lru_cache(maxsize=4)
def _thresholds_on(table: SoundTable, device: torch.device) -> torch.Tensor:
    """A table's thresholds on ``device``, copied there once (the Triton kernel's and the compiled ops' input)."""
    return torch.tensor(table.thresholds, device=device)


def _sound_kernel(device: torch.device, layout: tuple[torch.Tensor, ...], serial: bool,
                  notice: Callable[[str], None]) -> tuple[str, Callable[..., torch.Tensor]] | None:
    """The kernel that draws the sound inputs on ``device`` and its name: the Triton kernel on a GPU (images
    only), the C kernel on a CPU (images, or patch rows with a layout's counters, mean and std; one thread if
    ``serial``); None where there is none (no triton, no C compiler): the compiled torch ops then draw them.
    A C kernel that a compiler could not make work is named to ``notice``, in one line."""
    if device.type == "cuda" and not layout:
        try:
            from dmae_fast.kernels.sound_noise import sound_rows as triton_rows
        except ImportError:
            return None

        def on_gpu(clean, slot, table, key, image, phase, sample):
            return triton_rows(clean, slot, table.grid, _thresholds_on(table, device), table.K, key, image, phase,
                               sample)
        return TRITON_KERNEL, on_gpu
    if device.type == "cpu":
        from dmae_fast.kernels import sound_noise_cpu
        if sound_noise_cpu.load() is None:
            why = sound_noise_cpu.load_failure()
            if why is not None:
                notice(f"{C_KERNEL} noise unavailable ({why}); using the compiled torch ops (slower, same noise)")
            return None
        order = sound_noise_cpu.PatchOrder.of(*layout) if layout else None
        return C_KERNEL, functools.partial(sound_noise_cpu.sound_rows, order=order, threads=1 if serial else None)
    return None


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
    """Builds the noisy inputs of a batch of rows, compiled when possible; ``implementation`` says which runs.

    ``serial``: a one-thread kernel that releases the GIL, for calls from several threads at once after the first
    (which compiles and checks it). Dynamo guards on the calling thread's torch thread count and grad mode, so the
    first call must be made in the state of the later ones, or each thread recompiles an unchecked kernel.
    ``layout``: make a :class:`~dmae_fast.noise.patch_layout.PatchLayout`'s normalized patch rows from clean images
    stored arranged. ``notice``: where the one-line fallback notice goes (default: stderr). ``grid``: ``--sound``'s
    inputs on the 1/``grid`` grid (None: the Gaussian noise contract)."""

    def __init__(self, device: torch.device, compiled: bool = True, serial: bool = False,
                 layout: PatchLayout | None = None, notice: Callable[[str], None] | None = None,
                 grid: int | None = None) -> None:
        self.device, self.layout, self.grid = device, layout, grid
        self._notice = notice or print_notice
        if grid is None:
            function = noisy_rows if layout is None else noisy_patches
        else:
            function = functools.partial(sound_images if layout is None else sound_patches, grid=grid)
        self._layout_tensors = () if layout is None else (layout.counters.to(device),
                                                         *(t.to(device) for t in layout.normalization))
        wanted = compiled and grid is not None
        kernel = _sound_kernel(device, self._layout_tensors, serial, self._notice) if wanted else None
        self.implementation, self._kernel = kernel or (COMPILED if compiled else REFERENCE, None)
        options = SERIAL_OPTIONS if serial else None
        self._compiled = compile_for_any_thread(function, dynamic=None, options=options) \
            if compiled and not kernel else None
        self._checked = False
        self._marking = threading.Lock()  # see _run_compiled
        self._key: tuple[int, torch.Tensor] | None = None
        self._by_sigma: tuple[float, Any] | None = None  # sigma and its _parameter

    @property
    def description(self) -> str:
        """What makes the noise, e.g. "compiled noise" or "Triton kernel sound noise (1/255 grid)"."""
        return f"{self.implementation} noise" if self.grid is None else \
            f"{self.implementation} sound noise (1/{self.grid} grid)"

    def __call__(self, clean: torch.Tensor, slot: torch.Tensor, sigma: float, seed: int, image: torch.Tensor,
                 phase: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        rows = (slot, image, phase, sample)
        if self._kernel is not None or self._compiled is not None:
            try:
                noisy = self._run_compiled(clean, sigma, seed, rows) if self._kernel is None else \
                    self._kernel(clean, slot, sound_table(sigma, self.grid), key_words(seed), image, phase, sample)
            except Exception as error:  # noqa: BLE001 (a missing compiler fails in many ways)
                if self._checked:
                    raise
                self._fall_back(f"compiling it failed ({type(error).__name__}: {one_line(error, first=True)})")
            else:
                if self._checked or self._agrees(noisy, clean, sigma, seed, rows):
                    return noisy
        return self._reference(clean, sigma, seed, rows)

    def _reference(self, clean: torch.Tensor, sigma: float, seed: int, rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The torch-op reference of this source's noise (with a grid on the cached table, key and layout tensors)."""
        slot, image, phase, sample = rows
        layout = self.layout
        if self.grid is not None:
            function = sound_images if layout is None else sound_patches
            return function(clean, slot, self._parameter(sigma), self._key_tensor(seed), image, phase, sample,
                            *self._layout_tensors, grid=self.grid, fused=False)
        if layout is None:
            return clean[slot] + sigma * gaussian_noise(seed, image, phase, sample, tuple(clean.shape[1:]))
        eta = layout.arrange(gaussian_noise(seed, image, phase, sample, (layout.channels, layout.size, layout.size)))
        mean, std = layout.normalization
        return (clean[slot] + sigma * eta - mean) / std

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
        # The slots are shared by the threads calling at once and new after each allocate: mark_dynamic sets
        # two attributes one after the other, so two first marks at once would leave a half-marked tensor.
        with self._marking:
            torch._dynamo.mark_dynamic(clean, 0)
        slot, image, phase, sample = rows
        with _quiet_compiler() if not self._checked else nullcontext():  # only the first call compiles
            noisy = self._compiled(clean, slot, self._parameter(sigma), self._key_tensor(seed), image, phase, sample,
                                   *self._layout_tensors)
        return noisy[:count]

    def _agrees(self, noisy: torch.Tensor, clean: torch.Tensor, sigma: float, seed: int,
                rows: tuple[torch.Tensor, ...]) -> bool:
        """After the first compiled batch: do its first rows match the reference? If not, fall
        back with a one-line notice (a miscompiled kernel must not certify anything)."""
        self._checked = True
        want = self._reference(clean, sigma, seed, tuple(r[:4] for r in rows))
        # sigma * (a few ulps of eta), plus the rounding of x + sigma * eta (pixels are at most a few units),
        # over the std where the inputs are normalized; sound inputs: a quarter step of the grid (any other
        # integer is a step off, the float rounding of (X + Z) / L far below it)
        error = CHECK_TOLERANCE * sigma + 1e-6 if self.grid is None else 0.25 / self.grid
        tolerance = error / (1.0 if self.layout is None else min(self.layout.std))
        if torch.allclose(noisy[: len(want)], want, rtol=0, atol=tolerance):
            return True
        self._fall_back("the compiled kernel does not reproduce the reference")
        return False

    def _key_tensor(self, seed: int) -> torch.Tensor:
        if self._key is None or self._key[0] != seed:
            check_seed(seed)
            self._key = seed, torch.tensor(key_words(seed), dtype=torch.int64, device=self.device)
        return self._key[1]

    def _parameter(self, sigma: float) -> Any:
        """What the noise function takes for ``sigma``: sigma as a 0-d tensor, or with a grid the sound
        table's thresholds and their guide (int64, :func:`~dmae_fast.noise.sound.guide_table`) on the device."""
        if self._by_sigma is None or self._by_sigma[0] != sigma:
            if self.grid is None:
                value: Any = torch.tensor(sigma, dtype=torch.float32, device=self.device)
            else:
                table = sound_table(sigma, self.grid)
                value = _thresholds_on(table, self.device), torch.tensor(guide_table(table), device=self.device)
            self._by_sigma = sigma, value
        return self._by_sigma[1]

    def _fall_back(self, why: str) -> None:
        self._notice(f"{self.implementation} noise unavailable ({why}); using the torch-op reference (slower, "
                     "same noise)")
        self._compiled = self._kernel = None
        self.implementation = REFERENCE
