"""``--sound``'s compiled noise on a CPU: the guide lookup against the old halving search (issue 37).

Times :class:`~dmae_fast.noise.compiled.NoiseSource`'s compiled noisy images (the plain body's noise) for the
default Gaussian, for ``--sound`` with the old lookup (``old_count_at_most``, the branchless binary search
of the thresholds that the guide replaced, kept here as a one-off copy) and for ``--sound`` as it is now
(:func:`~dmae_fast.noise.sound.guide_lookup`), at 8x8, 32x32 and 224x224 images of 3 channels, ``rows``
rows a call (the bodies' batch). Rounds are interleaved (a shared machine); the table gives medians in
M values/s and the ratios, which are what to compare. The host allocator keeps freed blocks, as the
bodies set it. Writes the JSON record to ``--out``.

    python bench/experiments/2026-11-27-sound/lookup_speed.py --out /tmp/lookup-speed.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.noise import compiled as fast_noise
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.noise.contract import philox4x32
from dmae_fast.noise.sound import signed_uniform

SIGMA, SEED, GRID = 0.25, 0, 255
SHAPES = {"8x8": (3, 8, 8), "32x32": (3, 32, 32), "224x224": (3, 224, 224)}
CPU = "cpu"  # the device (a string: no call at import time)


def old_count_at_most(thresholds: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The old lookup: #{k : thresholds[k] <= v} by a fixed number of halving steps (a copy, for comparison)."""
    size = int(thresholds.shape[0])
    count = torch.zeros_like(values)
    for step in reversed(range(size.bit_length())):
        candidate = count + (1 << step)
        taken = (candidate <= size) & (thresholds[(candidate - 1).clamp(max=size - 1)] <= values)
        count = torch.where(taken, candidate, count)
    return count


def old_sound_images(clean: torch.Tensor, slot: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor],
                     key: torch.Tensor, image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor, *,
                     grid: int, fused: bool = True) -> torch.Tensor:
    """The old compiled sound images: the interleaved uniforms of every element, then the halving search (the
    torch-op reference, ``fused=False``, is today's)."""
    if not fused:
        return fast_noise.sound_images(clean, slot, table, key, image, phase, sample, grid=grid, fused=False)
    thresholds, _ = table
    shape, numel = clean.shape[1:], math.prod(clean.shape[1:])
    column = lambda v: v.reshape(-1, 1)  # noqa: E731
    blocks = torch.arange((2 * numel + 3) // 4, dtype=torch.int64)[None, :]
    w0, w1, w2, w3 = philox4x32((blocks, column(sample), column(image), column(phase)), (key[0], key[1]))
    uniforms = torch.stack(torch.broadcast_tensors(signed_uniform(w0, w1), signed_uniform(w2, w3)), dim=-1)
    noise = old_count_at_most(thresholds, uniforms.flatten(1)[:, :numel]) - thresholds.shape[0] // 2
    total = torch.round(clean[slot] * grid).to(torch.int64) + noise.view(-1, *shape)
    return total.to(torch.float32) / torch.as_tensor(grid, dtype=torch.float32)


def sources() -> dict[str, NoiseSource]:
    """The three compiled noises, by name."""
    with mock.patch.object(fast_noise, "sound_images", old_sound_images):
        old = NoiseSource(torch.device(CPU), grid=GRID)
    return {"default": NoiseSource(torch.device(CPU)), "sound (old lookup)": old,
            "sound (guide)": NoiseSource(torch.device(CPU), grid=GRID)}


def measure(shape: tuple[int, ...], rows: int, rounds: int) -> dict[str, list[float]]:
    """Seconds a call of each source, per round (after a first call that compiles and checks)."""
    clean = torch.randint(0, GRID + 1, (4, *shape), generator=torch.Generator().manual_seed(0)) / GRID
    slot, image = torch.arange(rows) % 4, torch.arange(rows) % 7
    phase, sample = torch.ones(rows, dtype=torch.int64), torch.arange(rows)

    def call_of(source: NoiseSource) -> Callable[[], torch.Tensor]:
        return lambda: source(clean, slot, SIGMA, SEED, image, phase, sample)

    calls = {name: call_of(source) for name, source in sources().items()}
    outputs = {name: call() for name, call in calls.items()}
    assert torch.equal(outputs["sound (old lookup)"], outputs["sound (guide)"]), "the lookups disagree"
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", type=int, default=1000, help="rows a call (the bodies' batch on a CPU)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True, help="the JSON record's path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    allocator = keep_freed_memory()  # as the bodies do
    results = []
    for name in args.shapes:
        shape = SHAPES[name]
        seconds = measure(shape, args.rows, args.rounds)
        values = args.rows * math.prod(shape)
        rate = {method: values / statistics.median(times) / 1e6 for method, times in seconds.items()}
        results.append({"shape": name, "rows": args.rows, "m_values_per_s": rate, "seconds": seconds,
                        "old_over_default": rate["sound (old lookup)"] / rate["default"],
                        "guide_over_default": rate["sound (guide)"] / rate["default"],
                        "guide_over_old": rate["sound (guide)"] / rate["sound (old lookup)"]})
    record = {"device": f"cpu, {args.threads} threads", "torch": torch.__version__, "sigma": SIGMA, "grid": GRID,
              "host_allocator": allocator, "rounds": args.rounds, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    lines = ["| image | rows | default M/s | sound old M/s | sound guide M/s | old / default | guide / default "
             "| guide / old |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        rate = r["m_values_per_s"]
        lines.append(f"| {r['shape']} | {r['rows']} | {rate['default']:.1f} | {rate['sound (old lookup)']:.1f} | "
                     f"{rate['sound (guide)']:.1f} | {r['old_over_default']:.2f}x | {r['guide_over_default']:.2f}x | "
                     f"{r['guide_over_old']:.2f}x |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
