"""What ``--sound``'s noise would cost with one Philox word per element (issue 37: a proposal, timed).

Today's contract draws a 64-bit uniform V from two Philox words per element, so ``--sound`` calls Philox
twice as often as the default Gaussian noise (one word per element), and its compiled noise runs at about
0.45x the default's on a CPU. A contract that draws one 32-bit word W per element would look the
integer Z up at both ends of W's interval [V_lo, V_lo + 2**32 - 1] of 64-bit values (V_lo = (W - 2**31)
<< 32): where the two agree, no threshold falls inside and Z is exact from W alone; where they differ (a
threshold inside: probability at most 2K / 2**32 per element), a second, separately keyed word would
refine it. This script times the common path of that design, compiled as the bodies compile their noise
(Philox for one word per element, two guide lookups, the ambiguous elements counted), beside the default
noise and today's ``--sound`` noise (both through :class:`~dmae_fast.noise.compiled.NoiseSource`), at 8x8,
32x32 and 224x224 images of 3 channels, ``rows`` rows a call (each returning the noisy inputs: for
``--sound`` the grid points (X + Z) / L), in interleaved rounds; it checks the compiled one-word noise
against its torch ops and prints medians in M values/s. Where the two ends agree, Z is the count of
thresholds at most V for every V of the interval (the count is monotone in V). A timing of the design, not
an implementation of it: the refinement word is not drawn.

    python bench/experiments/2026-11-27-sound/one_word_speed.py --out /tmp/one-word.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.noise.contract import key_words, philox4x32
from dmae_fast.noise.sound import guide_lookup, guide_table
from dmae_fast.stats.rounded_gaussian import sound_table

SIGMA, SEED, GRID = 0.25, 0, 255
SHAPES = {"8x8": (3, 8, 8), "32x32": (3, 32, 32), "224x224": (3, 224, 224)}
LOW_SPAN = 2**32 - 1  # the low word's range: V_lo + LOW_SPAN is the interval's top


def one_word_images(clean: torch.Tensor, slot: torch.Tensor, guide: torch.Tensor, key: torch.Tensor,
                    image: torch.Tensor, phase: torch.Tensor,
                    sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(X + Z) / L [B, *shape] with Z from one Philox word per element (counter e // 4, word e % 4, as the
    default noise), and how many elements a second word would have to refine."""
    shape, numel = clean.shape[1:], math.prod(clean.shape[1:])
    column = lambda v: v.reshape(-1, 1)  # noqa: E731
    blocks = torch.arange((numel + 3) // 4, dtype=torch.int64)[None, :]
    words = philox4x32((blocks, column(sample), column(image), column(phase)), (key[0], key[1]))
    low_ends = [(w - 2**31) * 2**32 for w in words]
    low = [guide_lookup(guide, v).to(torch.int32) for v in low_ends]
    high = [guide_lookup(guide, v + LOW_SPAN).to(torch.int32) for v in low_ends]
    ambiguous = sum((a != b).sum() for a, b in zip(low, high))
    noise = torch.stack(torch.broadcast_tensors(*low), dim=-1).flatten(1)[:, :numel]
    total = torch.round(clean[slot] * GRID).to(torch.int64) + noise.view(-1, *shape)
    return total.to(torch.float32) / torch.tensor(GRID, dtype=torch.float32), ambiguous


def measure(shape: tuple[int, ...], rows: int, rounds: int) -> dict[str, list[float]]:
    """Seconds a call of each noise, per round (after a first call that compiles)."""
    clean = torch.randint(0, GRID + 1, (4, *shape), generator=torch.Generator().manual_seed(0)) / GRID
    slot, image = torch.arange(rows) % 4, torch.arange(rows) % 7
    phase, sample = torch.ones(rows, dtype=torch.int64), torch.arange(rows)
    guide = torch.tensor(guide_table(sound_table(SIGMA, GRID)))
    key = torch.tensor(key_words(SEED))
    compiled = torch.compile(one_word_images, dynamic=False)
    default, sound = NoiseSource(torch.device("cpu")), NoiseSource(torch.device("cpu"), grid=GRID)
    calls = {
        "default": lambda: default(clean, slot, SIGMA, SEED, image, phase, sample),
        "sound (two words)": lambda: sound(clean, slot, SIGMA, SEED, image, phase, sample),
        "sound (one word)": lambda: compiled(clean, slot, guide, key, image, phase, sample),
    }
    noisy, ambiguous = calls["sound (one word)"]()
    reference, _ = one_word_images(clean, slot, guide, key, image, phase, sample)
    assert torch.equal(noisy, reference), "the compiled one-word noise differs from its torch ops"
    print(f"{shape}: {int(ambiguous)} of {noisy.numel():,} elements would need a second word")
    for call in calls.values():
        call()
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
        seconds = measure(SHAPES[name], args.rows, args.rounds)
        values = args.rows * math.prod(SHAPES[name])
        rate = {method: values / statistics.median(times) / 1e6 for method, times in seconds.items()}
        results.append({"shape": name, "rows": args.rows, "m_values_per_s": rate, "seconds": seconds})
    record = {"device": f"cpu, {args.threads} threads", "torch": torch.__version__, "sigma": SIGMA, "grid": GRID,
              "host_allocator": allocator, "rounds": args.rounds, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    lines = ["| image | default M/s | sound, two words M/s | sound, one word M/s | two / default | one / default |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        rate = r["m_values_per_s"]
        default, two, one = rate["default"], rate["sound (two words)"], rate["sound (one word)"]
        lines.append(f"| {r['shape']} | {default:.1f} | {two:.1f} | {one:.1f} | {two / default:.2f}x | "
                     f"{one / default:.2f}x |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
