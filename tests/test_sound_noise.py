"""--sound's noise (issue 37): the exact rounded Gaussian on the grid, its thresholds, the noisy inputs
and the grid check."""

import bisect
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import ndtr

from dmae_fast.base.errors import UserError
from dmae_fast.kernels import sound_noise_cpu
from dmae_fast.noise.compiled import COMPILED, NoiseSource, sound_patches
from dmae_fast.noise.contract import key_words, uint32_stream
from dmae_fast.noise.grid import check_on_grid, quantize
from dmae_fast.noise.patch_layout import PatchLayout
from dmae_fast.noise.sound import (
    bucket,
    bucket_ends,
    guide_bits,
    guide_lookup,
    guide_table,
    rounded_gaussian_noise,
    rounded_gaussian_rows,
    sound_rows,
)
from dmae_fast.stats import rounded_gaussian
from dmae_fast.stats.rounded_gaussian import BITS, DIGITS, SoundTable, sound_table, tv_per_image

SETTINGS = [(0.25, 255), (0.5, 255), (1.0, 255), (0.25, 16)]


def exact_pmf(sigma: float, grid: int, k: int, digits: int = DIGITS[0]) -> mpmath.mpf:
    """P(Z = k) = Phi((k + 1/2) / s) - Phi((k - 1/2) / s) of the exact rounded Gaussian (mpmath)."""
    ctx = rounded_gaussian._context(digits)
    s, m = ctx.mpf(sigma) * grid, abs(k)  # symmetric: the tails of |k| avoid cancellation
    tail = rounded_gaussian._lower_tail
    return tail(ctx, (m - ctx.mpf(0.5)) / s) - tail(ctx, (m + ctx.mpf(0.5)) / s)


def implemented_pmf(table: SoundTable) -> dict[int, Fraction]:
    """q_k = (T_k - T_{k-1}) / 2**64 for |k| <= K: what the sampler draws, exactly (0 beyond K)."""
    ends = [0, *(int(t) + 2 ** (BITS - 1) for t in table.thresholds), 2**BITS]
    return {k: Fraction(ends[i + 1] - ends[i], 2**BITS) for i, k in enumerate(range(-table.K, table.K + 1))}


def rounded_gaussian_pmf(s: float, k: np.ndarray) -> np.ndarray:
    return ndtr((k + 0.5) / s) - ndtr((k - 0.5) / s)


def g_test_pvalue(values: np.ndarray, pmf: np.ndarray, k: np.ndarray) -> float:
    """The G test of the drawn ``values`` against ``pmf`` on ``k``, bins of expected count < 5 pooled into
    the two tails."""
    expected = pmf / pmf.sum() * len(values)
    keep = expected >= 5
    low, high = k[keep][0], k[keep][-1]
    counts = np.array([(values < low).sum(), *((values == v).sum() for v in k[keep]), (values > high).sum()])
    want = np.array([expected[k < low].sum(), *expected[keep], expected[k > high].sum()])
    return float(stats.power_divergence(counts, want, lambda_="log-likelihood").pvalue)


def test_the_frequencies_follow_the_exact_pmf_and_the_test_has_power():
    """10^6 draws at s = 2 fit the rounded Gaussian (G test, p > 1e-3) and reject, at the same size,
    the discrete Gaussian exp(-k^2 / 2s^2) / Z and the rounded Gaussian of 1.05 s."""
    table = sound_table(0.125, 16)
    s = 0.125 * 16
    rows = torch.arange(1000)
    noise = rounded_gaussian_rows(key_words(2024), torch.tensor(table.thresholds), table.K, rows, 2, rows * 3, 1000)
    values = noise.flatten().numpy()
    k = np.arange(-table.K, table.K + 1)
    assert g_test_pvalue(values, rounded_gaussian_pmf(s, k), k) > 1e-3
    assert g_test_pvalue(values, np.exp(-(k**2) / (2 * s * s)), k) < 1e-3
    assert g_test_pvalue(values, rounded_gaussian_pmf(1.05 * s, k), k) < 1e-3


def python_noise(seed: int, table, image: int, phase: int, sample: int, numel: int) -> list[int]:
    """The contract in Python integers: element e takes words 2e, 2e + 1 of the Philox stream (words
    (w0, w1) or (w2, w3) of counter e // 2), U = w_hi * 2**32 + w_lo, Z = k iff T_{k-1} <= U < T_k."""
    words = uint32_stream(seed, torch.tensor([image]), phase, torch.tensor([sample]), 2 * numel)[0].tolist()
    thresholds = [int(t) + 2**63 for t in table.thresholds]
    return [bisect.bisect_right(thresholds, words[2 * e] * 2**32 + words[2 * e + 1]) - table.K for e in range(numel)]


@pytest.mark.parametrize("seed", [12345, 2**40 + 12345])
def test_the_reference_matches_a_pure_python_sampler(seed):
    table = sound_table(0.5, 255)
    image, phase, sample = torch.tensor([0, 3, 2**31 + 5]), torch.tensor([0, 1, 2]), torch.tensor([0, 7, 99999])
    noise = rounded_gaussian_noise(seed, table, image, phase, sample, (7,))
    assert noise.dtype == torch.int32
    for row, (i, p, n) in enumerate(zip(image.tolist(), phase.tolist(), sample.tolist(), strict=True)):
        assert noise[row].tolist() == python_noise(seed, table, i, p, n, 7)


@pytest.mark.parametrize("sigma,grid", [(s, g) for g in (16, 255) for s in (0.12, 0.25, 0.5, 1.0)] + [(1 / 1024, 16)])
def test_the_guide_lookup_counts_as_searchsorted_on_every_boundary(sigma, grid):
    """The compiled lookup is searchsorted's count for every int64 V: at, below and above each threshold,
    at both ends of each bucket and past them, at the ends of int64, and at random."""
    table = sound_table(sigma, grid)
    guide = guide_table(table)
    bits = guide_bits(len(guide))
    lowest, highest = bucket_ends(bits)
    # the buckets tile int64 in order, and bucket() puts each one's ends in it
    assert lowest[0] == -(2**63) and highest[-1] == 2**63 - 1 and np.array_equal(lowest[1:], highest[:-1] + 1)
    for ends in (lowest, highest):
        assert torch.equal(bucket(torch.tensor(ends), bits), torch.arange(len(ends)))
    thresholds, ends = torch.tensor(table.thresholds), torch.tensor(np.concatenate((lowest, highest)))
    values = torch.cat((thresholds, thresholds - 1, thresholds + 1, ends, ends - 1, ends + 1,  # int64 wraps at its ends
                        torch.randint(-(2**63), 2**63 - 1, (100_000,), dtype=torch.int64)))
    assert torch.equal(guide_lookup(torch.tensor(guide), values),
                       torch.searchsorted(thresholds, values, right=True) - table.K)
    assert guide.shape[1] <= 2  # one threshold to compare at most: the lookup's speed


def test_the_guided_noise_is_the_searchsorted_noise_in_rows_and_patches():
    """rounded_gaussian_rows and sound_patches with the guide (as compiled) draw the reference's integers, on an
    odd number of elements too (the last pair's second value dropped)."""
    table, key = sound_table(0.25, 255), torch.tensor(key_words(11))
    thresholds, guide = torch.tensor(table.thresholds), torch.tensor(guide_table(table))
    image, phase, sample = torch.tensor([3, 4, 5]), torch.tensor([0, 1, 1]), torch.tensor([0, 9, 2**32 - 1])
    for numel in (49, 64):
        assert torch.equal(rounded_gaussian_rows(key, thresholds, table.K, image, phase, sample, numel, guide),
                           rounded_gaussian_rows(key, thresholds, table.K, image, phase, sample, numel))
    layout = PatchLayout(3, 8, 4, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    clean = layout.arrange(torch.randint(0, 256, (2, 3, 8, 8)).float() / 255)
    rows = (torch.tensor([0, 1, 1]), key, image, phase, sample, layout.counters, *layout.normalization)
    assert torch.equal(sound_patches(clean, rows[0], (thresholds, guide), *rows[1:], grid=255),
                       sound_patches(clean, rows[0], (thresholds, guide), *rows[1:], grid=255, fused=False))


@pytest.mark.parametrize("patches", [False, True])
def test_the_compiled_sound_noise_is_the_reference_on_every_row(patches, monkeypatch):
    """Without the C kernel (no C compiler) NoiseSource compiles the guide lookup (images, and the CPU fast
    body's patch rows, serial) without falling back, and every row of a batch, past the four it checks itself,
    equals the torch-op reference."""
    monkeypatch.setattr(sound_noise_cpu, "load", lambda: None)
    layout = PatchLayout(3, 8, 4, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)) if patches else None
    notices: list[str] = []
    compiled = NoiseSource(torch.device("cpu"), serial=patches, layout=layout, notice=notices.append, grid=255)
    reference = NoiseSource(torch.device("cpu"), compiled=False, layout=layout, grid=255)
    clean = torch.randint(0, 256, (3, 3, 8, 8), generator=torch.Generator().manual_seed(5)).float() / 255
    clean = layout.arrange(clean) if layout else clean
    rows = (torch.arange(40) % 3, torch.arange(40) + 7, torch.arange(40) % 2, torch.arange(40) * 1000)
    drawn = compiled(clean, rows[0], 1.0, 2**40 + 3, *rows[1:])
    assert compiled.implementation == COMPILED and not notices
    assert torch.equal(drawn, reference(clean, rows[0], 1.0, 2**40 + 3, *rows[1:]))


def test_a_uniform_equal_to_a_threshold_is_above_it():
    """Z = k iff T_{k-1} <= U < T_k: with the one threshold S_0 = V of element 0, that element draws 0, not -1."""
    image, sample = torch.tensor([5]), torch.tensor([6])
    w = uint32_stream(9, image, 1, sample, 2)[0].tolist()
    own = torch.tensor([w[0] * 2**32 + w[1] - 2**63])
    assert rounded_gaussian_rows(key_words(9), own, 1, image, 1, sample, 1).tolist() == [[0]]


def test_the_seeds_high_word_matters():
    table = sound_table(0.5, 255)
    image, sample = torch.tensor([1]), torch.tensor([2])
    low, high = (rounded_gaussian_noise(seed, table, image, 0, sample, (64,)) for seed in (12345, 2**40 + 12345))
    assert not torch.equal(low, high)


@pytest.mark.parametrize("sigma,grid", SETTINGS)
def test_the_thresholds_are_exact_and_cost_little(sigma, grid):
    table = sound_table(sigma, grid)
    s, K, shifted = sigma * grid, table.K, table.thresholds
    assert shifted.dtype == np.int64 and len(shifted) == 2 * K and not shifted.flags.writeable
    assert np.all(np.diff(shifted) >= 0)
    for digits in rounded_gaussian.DIGITS:
        assert rounded_gaussian._thresholds(sigma, grid, K, digits)[0] == [int(t) + 2**63 for t in shifted]
    np.testing.assert_allclose((shifted.astype(np.float64) + 2.0**63) / 2.0**64,
                               ndtr((np.arange(-K, K) + 0.5) / s), rtol=0, atol=1e-15)
    with mpmath.workdps(50):
        tail = lambda k: 2 * mpmath.ncdf(-(k + mpmath.mpf(0.5)) / (mpmath.mpf(sigma) * grid))  # noqa: E731
        assert tail(K) <= mpmath.mpf(2) ** -70 < tail(K - 1)
        pmf = implemented_pmf(table)
        assert sorted(pmf) == list(range(-K, K + 1)) and sum(pmf.values()) == 1
        assert sum(q.numerator * (2**64 // q.denominator) for q in pmf.values()) == 2**64
        assert min(pmf.values()) >= 0
        for k in [*range(-K, K, max(1, K // 50)), K]:  # each q_k is within two threshold roundings of p_k
            assert abs(mpmath.mpf(pmf[k].numerator) / pmf[k].denominator - exact_pmf(sigma, grid, k)) < 2.0**-63
    assert 0 < table.tv_per_element < 1e-15


@pytest.mark.parametrize("sigma,grid", [(0.25, 16), (0.125, 16)])
def test_the_total_variation_bounds_the_sampler_against_the_exact_pmf(sigma, grid):
    """tv_per_element is 1/2 (sum |q_k - p_k| + P(|Z| > K)), recomputed here from the pmfs, rounded up."""
    table = sound_table(sigma, grid)
    with mpmath.workdps(60):
        drawn = implemented_pmf(table)
        gap = sum(abs(mpmath.mpf(q.numerator) / q.denominator - exact_pmf(sigma, grid, k)) for k, q in drawn.items())
        tv = (gap + 2 * mpmath.ncdf(-(table.K + mpmath.mpf(0.5)) / (mpmath.mpf(sigma) * grid))) / 2
        assert tv <= table.tv_per_element <= tv * (1 + 1e-12)


def test_a_noise_level_far_below_a_grid_step_draws_zero():
    """s = 1/64: T_0 = floor(2**64 (1 - Phi(-32))) is 2**64 - 1, not 2**64 (which int64 cannot hold)."""
    table = sound_table(1 / 1024, 16)
    assert table.K == 1 and table.thresholds.tolist() == [-(2**63), 2**63 - 1]
    noise = rounded_gaussian_noise(3, table, torch.arange(8), 0, torch.arange(8), (100,))
    assert not noise.any()


def test_a_table_is_cached():
    assert sound_table(0.25, 16) is sound_table(0.25, 16)


def test_thresholds_that_differ_at_two_precisions_are_refused(monkeypatch):
    """At 6 digits the 20-digit thresholds come out wrong: the table is refused, never used."""
    monkeypatch.setattr(rounded_gaussian, "DIGITS", (6, 120))
    rounded_gaussian._table.cache_clear()
    with pytest.raises(RuntimeError, match="at 6 digits but"):
        sound_table(0.3, 16)
    rounded_gaussian._table.cache_clear()


@pytest.mark.parametrize("sigma,grid", [(0, 255), (-1, 255), (math.nan, 255), (math.inf, 255), ("0.5", 255),
                                        (True, 255), (1e-12, 255), (0.5, 0), (0.5, 2.5), (0.5, True)])
def test_bad_settings_are_refused_in_one_line(sigma, grid):
    with pytest.raises(UserError) as error:
        sound_table(sigma, grid)
    assert "\n" not in str(error.value)


def test_the_total_variation_per_image_is_rounded_up():
    table = sound_table(1.0, 255)
    for samples in range(10_000, 10_100):  # float products would round about half of these down
        bound = Fraction(table.tv_per_element) * samples * 150_528
        per_image = tv_per_image(table, samples, 150_528)
        assert Fraction(per_image) >= bound > Fraction(math.nextafter(per_image, -math.inf))


def test_the_noisy_input_is_the_exact_sum_over_the_grid():
    """sound_rows is float32(X + Z) / 255 with X = round(255 c), so two rows of different clean images
    whose noise makes the same sum are bit-identical inputs (no floating-point trace of the image)."""
    grid, table, key = 255, sound_table(0.02, 255), torch.tensor(key_words(7))
    thresholds, image, phase, sample = torch.tensor(table.thresholds), torch.tensor([4, 9]), torch.tensor([1, 1]), \
        torch.tensor([0, 5])
    first = torch.randint(70, 186, (1, 3, 4, 4), generator=torch.Generator().manual_seed(0))
    noise = rounded_gaussian_rows(key, thresholds, table.K, image, phase, sample, 48).view(2, 3, 4, 4)
    second = first + noise[0] - noise[1]  # X' + Z' = X + Z
    assert 0 <= int(second.min()) and int(second.max()) <= grid
    clean = torch.cat((first, second)).to(torch.float32) / grid
    noisy = sound_rows(clean, torch.tensor([0, 1]), grid, thresholds, table.K, key, image, phase, sample)
    assert noisy.dtype == torch.float32
    assert torch.equal(noisy, (torch.cat((first, second)) + noise).to(torch.float32) / grid)
    assert not torch.equal(first, second) and torch.equal(noisy[0], noisy[1])


def test_images_on_the_grid_pass_and_others_are_refused_in_one_line():
    generator = torch.Generator().manual_seed(0)
    check_on_grid(torch.randint(0, 256, (4, 3, 8, 8), generator=generator).to(torch.float32) / 255, 255, "a set")
    check_on_grid(torch.randint(0, 17, (4, 1, 8, 8), generator=generator).to(torch.float32) / 16, 16, "the demo")
    images = torch.randint(0, 256, (4, 3, 8, 8), generator=generator).to(torch.float32) / 255
    images[2, 1, 4, 7], images[3, 0, 0, 0] = 0.51234, 0.7
    with pytest.raises(UserError) as error:
        check_on_grid(images, 255, "the demo", first=10)
    message = str(error.value)
    assert "\n" not in message and message.startswith("image 12 of the demo is not on the 1/255 grid")
    assert "(1, 4, 7) = 0.51234" in message and "--quantize" in message
    with pytest.raises(UserError, match="1/16 grid"):
        check_on_grid(torch.full((1, 1, 2, 2), 3 / 255), 16, "a set")
    with pytest.raises(UserError, match=r"= 1\.00392"):
        check_on_grid(torch.full((1, 1, 2, 2), 256 / 255), 255, "a set")
    rounded = quantize(images, 255)
    check_on_grid(rounded, 255, "a set")
    assert float((rounded - images).abs().max()) <= 0.5 / 255


@pytest.mark.parametrize("grid", [16, 255])
def test_only_the_float32_grid_points_pass_not_pixels_a_fraction_of_a_step_off(grid):
    levels = torch.arange(grid + 1, dtype=torch.float64).reshape(1, 1, 1, -1)
    check_on_grid(levels.to(torch.float32) / grid, grid, "a set")  # float32's k / L
    check_on_grid(levels / grid, grid, "a set")  # float64's k / L: the same points, stored more finely
    for steps in (9e-4, 5e-4, 1e-5, -1e-5):  # 1e-5 of a step is above float32's rounding of k / L (< 2**-24 * L)
        with pytest.raises(UserError, match=f"1/{grid} grid"):
            check_on_grid((levels[..., 1:-1] + steps) / grid, grid, "a set")
    shifted = (levels[..., 1:-1] + 9e-4) / grid  # every pixel 0.0009 steps off: once accepted as the rounded image
    with pytest.raises(UserError):
        check_on_grid(shifted.to(torch.float32), grid, "a set")
