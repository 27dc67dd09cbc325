"""What ``--sound``'s noise would cost if the low word were drawn only where it matters (issue 37: a
proposal, timed and checked).

Today's contract draws a 64-bit uniform V = (W - 2**31) * 2**32 + W2 from two Philox words per element
and counts the thresholds S_k <= V; on a CPU its compiled noise runs at about 0.45x the default Gaussian
noise's, which draws one word per element. The proposal keeps V and its lookup, and so the exact
distribution, and changes only which words make V: the high word W is word e % 4 of counter
(e // 4, sample, image, phase), the default noise's own word, and the low word W2 is the same word of
counter (e // 4 + 2**31, ...), a separate stream. One table of 2**16 int64 rows, indexed by W's top 16
bits, settles almost every element from W alone: a row holds the count below its bucket and the high
word of the one threshold inside it, if any, so Z = z + (W > t). Only where W equals that high word, or
the bucket holds two or more thresholds (far in the tails), is W2 drawn and V looked up in full.

This script builds the table, times the compiled common path plus the eager refinement of the flagged
elements beside the default noise and today's ``--sound`` noise (both through
:class:`~dmae_fast.noise.compiled.NoiseSource`), each returning the noisy inputs, and checks the result
against the full lookup of V for every element (``torch.searchsorted``) on ``--check-rows`` rows. Medians
of interleaved rounds, in M values/s; beside them the ceiling of any lookup, the high words drawn and
added with none.

    python bench/experiments/2026-11-27-sound/high_bits_speed.py --out /tmp/high-bits.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.noise.contract import key_words, philox4x32
from dmae_fast.noise.sound import interleave
from dmae_fast.stats.rounded_gaussian import SoundTable, sound_table

SIGMA, SEED, GRID = 0.25, 0, 255
SHAPES = {"8x8": (3, 8, 8), "32x32": (3, 32, 32), "224x224": (3, 224, 224)}
LOW_STREAM = 2**31  # added to the first counter word for the low words' stream
NEVER, REFINE = 2**32, 2**32 + 1  # a row's t when no threshold is inside its bucket; when two or more are
THRESHOLD_BITS = 34  # a row is (z << 34) | t


def high_bits_table(table: SoundTable) -> np.ndarray:
    """[2**16] int64 rows: (z << 34) | t for each value h of W's top 16 bits.

    Bucket h holds V in [lo, lo + 2**48 - 1], lo = (h * 2**16 - 2**31) * 2**32; z = #{k : S_k <= lo} - K.
    With one threshold S inside, t is its high word ((S >> 32) + 2**31): V >= S when W > t, and when
    W == t it depends on W2. With none, t = NEVER; with more, t = REFINE.
    """
    thresholds = table.thresholds
    h = np.arange(2**16, dtype=np.int64)
    lo = ((h << 16) - 2**31) << 32
    below = np.searchsorted(thresholds, lo, side="right")
    inside = np.searchsorted(thresholds, lo + (2**48 - 1), side="right") - below
    high_word = (thresholds[np.minimum(below, len(thresholds) - 1)] >> 32) + 2**31
    t = np.where(inside == 0, NEVER, np.where(inside == 1, high_word, REFINE))
    return ((below - table.K) << THRESHOLD_BITS) | t


def _blocks(numel: int) -> torch.Tensor:
    return torch.arange((numel + 3) // 4, dtype=torch.int64)[None, :]


def common_path(clean: torch.Tensor, slot: torch.Tensor, rows: torch.Tensor, key: torch.Tensor,
                image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(X + Z) / L [B, *shape] from the high words alone, and where the low word must refine Z [B, numel]."""
    shape, numel = clean.shape[1:], math.prod(clean.shape[1:])
    column = lambda v: v.reshape(-1, 1)  # noqa: E731
    words = philox4x32((_blocks(numel), column(sample), column(image), column(phase)), (key[0], key[1]))
    noise, refine = [], []
    for w in words:
        row = rows[w >> 16]
        z, t = row >> THRESHOLD_BITS, row & (2**THRESHOLD_BITS - 1)
        noise.append((z + (w > t).to(torch.int64)).to(torch.int32))
        refine.append((w == t) | (t == REFINE))
    total = torch.round(clean[slot] * GRID).to(torch.int64) + interleave(*noise)[:, :numel].view(-1, *shape)
    return total.to(torch.float32) / torch.tensor(GRID, dtype=torch.float32), interleave(*refine)[:, :numel]


def _word(key: torch.Tensor, block: torch.Tensor, sample: torch.Tensor, image: torch.Tensor,
          phase: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    words = torch.stack(philox4x32((block, sample, image, phase), (key[0], key[1])), dim=-1)
    return words.gather(-1, word[:, None])[:, 0]


def words_only(clean: torch.Tensor, slot: torch.Tensor, key: torch.Tensor, image: torch.Tensor, phase: torch.Tensor,
               sample: torch.Tensor) -> torch.Tensor:
    """The ceiling: (X + (W >> 24)) / L, the high words drawn and added with no lookup at all."""
    shape, numel = clean.shape[1:], math.prod(clean.shape[1:])
    column = lambda v: v.reshape(-1, 1)  # noqa: E731
    words = philox4x32((_blocks(numel), column(sample), column(image), column(phase)), (key[0], key[1]))
    noise = interleave(*[(w >> 24).to(torch.int32) for w in words])[:, :numel]
    total = torch.round(clean[slot] * GRID).to(torch.int64) + noise.view(-1, *shape)
    return total.to(torch.float32) / torch.tensor(GRID, dtype=torch.float32)


def full_noise(thresholds: torch.Tensor, K: int, key: torch.Tensor, image: torch.Tensor, phase: torch.Tensor,
               sample: torch.Tensor, element: torch.Tensor) -> torch.Tensor:
    """Z of each (image, phase, sample, element) from V = (W - 2**31) * 2**32 + W2, looked up in full."""
    block, word = element // 4, element % 4
    high = _word(key, block, sample, image, phase, word)
    low = _word(key, block + LOW_STREAM, sample, image, phase, word)
    return torch.searchsorted(thresholds, (high - 2**31) * 2**32 + low, right=True) - K


def sound_images(compiled, clean, slot, rows, thresholds, K, key, image, phase, sample):
    """The proposal end to end: the compiled common path, then the flagged elements refined in place."""
    noisy, refine = compiled(clean, slot, rows, key, image, phase, sample)
    r, e = refine.nonzero(as_tuple=True)
    if r.numel():
        z = full_noise(thresholds, K, key, image[r], phase[r], sample[r], e)
        x = torch.round(clean.flatten(1)[slot[r], e] * GRID).to(torch.int64)
        noisy.view(noisy.shape[0], -1)[r, e] = (x + z).to(torch.float32) / torch.tensor(GRID, dtype=torch.float32)
    return noisy, int(r.numel())


def check(compiled, clean, slot, rows, thresholds, K, key, image, phase, sample) -> int:
    """The proposal's noisy inputs equal the full lookup's for every element; returns the flagged count."""
    noisy, flagged = sound_images(compiled, clean, slot, rows, thresholds, K, key, image, phase, sample)
    numel = math.prod(clean.shape[1:])
    b = len(slot)
    element = torch.arange(numel).repeat(b)
    each = lambda v: v.repeat_interleave(numel)  # noqa: E731
    z = full_noise(thresholds, K, key, each(image), each(phase), each(sample), element).view(b, numel)
    expected = (torch.round(clean[slot].flatten(1) * GRID).to(torch.int64) + z).to(torch.float32) / GRID
    assert torch.equal(noisy.view(b, -1), expected), "the proposal's noise differs from the full lookup"
    return flagged


def measure(shape: tuple[int, ...], rows: int, rounds: int, check_rows: int) -> tuple[dict[str, list[float]], dict]:
    """Seconds a call of each noise, per round (after a first call that compiles), and the check's figures."""
    clean = torch.randint(0, GRID + 1, (4, *shape), generator=torch.Generator().manual_seed(0)) / GRID
    slot, image = torch.arange(rows) % 4, torch.arange(rows) % 7
    phase, sample = torch.ones(rows, dtype=torch.int64), torch.arange(rows)
    table = sound_table(SIGMA, GRID)
    guide = torch.tensor(high_bits_table(table))
    thresholds, key = torch.tensor(table.thresholds), torch.tensor(key_words(SEED))
    compiled, ceiling = torch.compile(common_path, dynamic=False), torch.compile(words_only, dynamic=False)
    part = slice(0, check_rows)
    flagged = check(torch.compile(common_path, dynamic=False), clean, slot[part], guide, thresholds, table.K, key,
                    image[part], phase[part], sample[part])
    figures = {"checked_values": check_rows * math.prod(shape), "flagged_in_check": flagged,
               "rows_with_one_threshold": int(((guide & (2**THRESHOLD_BITS - 1)) < NEVER).sum()),
               "rows_with_more": int(((guide & (2**THRESHOLD_BITS - 1)) == REFINE).sum())}
    print(f"{shape}: checked {figures['checked_values']:,} values ({flagged} refined); table rows with one "
          f"threshold {figures['rows_with_one_threshold']}, with more {figures['rows_with_more']} of 65,536")
    default, sound = NoiseSource(torch.device("cpu")), NoiseSource(torch.device("cpu"), grid=GRID)
    calls = {
        "default": lambda: default(clean, slot, SIGMA, SEED, image, phase, sample),
        "philox only (no lookup)": lambda: ceiling(clean, slot, key, image, phase, sample),
        "sound (today)": lambda: sound(clean, slot, SIGMA, SEED, image, phase, sample),
        "sound (high bits)": lambda: sound_images(compiled, clean, slot, guide, thresholds, table.K, key, image,
                                                  phase, sample),
    }
    for call in calls.values():
        call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return seconds, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", type=int, default=1000, help="rows a call (the bodies' batch on a CPU)")
    parser.add_argument("--check-rows", type=int, default=8, help="rows checked against the full lookup")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True, help="the JSON record's path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    allocator = keep_freed_memory()  # as the bodies do
    results = []
    for name in args.shapes:
        seconds, figures = measure(SHAPES[name], args.rows, args.rounds, args.check_rows)
        values = args.rows * math.prod(SHAPES[name])
        rate = {method: values / statistics.median(times) / 1e6 for method, times in seconds.items()}
        results.append({"shape": name, "rows": args.rows, "m_values_per_s": rate, "seconds": seconds, **figures})
    record = {"device": f"cpu, {args.threads} threads", "torch": torch.__version__, "sigma": SIGMA, "grid": GRID,
              "host_allocator": allocator, "rounds": args.rounds, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    lines = ["| image | default M/s | Philox only M/s | sound today M/s | high bits M/s | today / default | "
             "high bits / default |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        rate = r["m_values_per_s"]
        default, today, high = rate["default"], rate["sound (today)"], rate["sound (high bits)"]
        ceiling = rate["philox only (no lookup)"]
        lines.append(f"| {r['shape']} | {default:.1f} | {ceiling:.1f} | {today:.1f} | {high:.1f} | "
                     f"{today / default:.2f}x | {high / default:.2f}x |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
