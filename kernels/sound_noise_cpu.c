/* The sound noise of --sound on a CPU, bit for bit with dmae_fast.noise.sound (the reference).

   The contract (dmae_fast/noise/sound.py): element e of the flat [C, H, W] image takes the
   Philox4x32-10 words of counter (e / 2, sample, image, phase) under the seed's key, (w0, w1) for
   even e and (w2, w3) for odd e, as U = w_hi * 2^32 + w_lo; with the 2K ascending thresholds
   S_k (int64, the table's T_k - 2^63) the noise is Z = -K + #{k : S_k <= U - 2^63}, and the
   classifier's input is float32(X + Z) / float32(L), then ((that - mean) / std) where the input
   is normalized patch rows.

   Integers up to X + Z, so the integers cannot differ from the reference's. The lookup: `first`
   holds, for each of the 2^16 values of U's top 16 bits, the number of thresholds below the
   bucket's lowest V (computed in Python, exactly); the thresholds at or above it are counted by a
   forward scan, which is exact for any table and almost always stops at its first comparison
   (the middle thresholds are hundreds of buckets apart; only the far tails crowd). The float steps
   are each one correctly rounded IEEE operation in the reference's order (built with
   -ffp-contract=off, no -ffast-math).

   Work: three passes per block of pairs: Philox (vectorized across pairs), the lookups (scalar), then
   the sums, divisions and stores (vectorized). One call runs on its caller's thread; the caller
   (ctypes, which releases the GIL) shares a batch's rows among threads. */

#include <stdint.h>

#define BLOCK 256

/* Philox4x32-10 of `size` counters at once, in place: the words are lanes of four arrays and each round one
   loop over them, which the compiler vectorizes (32x32 -> 64-bit products of 4 or 8 lanes an instruction). */
static void philox(uint32_t c[4][BLOCK], int64_t size, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    for (int64_t i = 0; i < size; ++i) {
      const uint64_t p0 = (uint64_t)0xD2511F53u * c[0][i];
      const uint64_t p1 = (uint64_t)0xCD9E8D57u * c[2][i];
      const uint32_t c0 = (uint32_t)(p1 >> 32) ^ c[1][i] ^ k0;
      const uint32_t c2 = (uint32_t)(p0 >> 32) ^ c[3][i] ^ k1;
      c[1][i] = (uint32_t)p1;
      c[3][i] = (uint32_t)p0;
      c[0][i] = c0;
      c[2][i] = c2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

/* out[r, p] for rows r < rows and positions p < numel. Positions come in pairs (2j, 2j + 1) that take
   the words (w0, w1) and (w2, w3) of Philox counter (counter[j], sample, image, phase); counter is
   NULL for the plain image order (counter[j] = j). X holds the clean integers of each slot [slots,
   numel]; mean and std (per position) are NULL where the input is not normalized. */
void sound_noise_rows(float *out, const int32_t *X, int64_t numel, const int64_t *slot, const int64_t *image,
                      const int64_t *phase, const int64_t *sample, int64_t rows, const int64_t *counter,
                      uint32_t key0, uint32_t key1, const int64_t *thresholds, int64_t K, const int32_t *first,
                      int32_t levels, const float *mean, const float *std) {
  const int64_t pairs = (numel + 1) / 2, count = 2 * K;
  const float grid = (float)levels;
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t words[4][BLOCK];
    int32_t noise[2 * BLOCK];
    const int32_t *x = X + slot[r] * numel;
    float *y = out + r * numel;
    for (int64_t start = 0; start < pairs; start += BLOCK) {
      const int64_t size = pairs - start < BLOCK ? pairs - start : BLOCK;
      for (int64_t i = 0; i < size; ++i) {
        words[0][i] = (uint32_t)(counter ? counter[start + i] : start + i);
        words[1][i] = (uint32_t)sample[r];
        words[2][i] = (uint32_t)image[r];
        words[3][i] = (uint32_t)phase[r];
      }
      philox(words, size, key0, key1);
      for (int lane = 0; lane < 2; ++lane) {  /* scalar: on the CPUs tried, faster than vector gathers */
        const uint32_t *high = words[2 * lane], *low = words[2 * lane + 1];
        for (int64_t i = 0; i < size; ++i) {
          const int64_t v = (int64_t)(((uint64_t)high[i] << 32 | low[i]) ^ ((uint64_t)1 << 63));
          int32_t z = first[high[i] >> 16];
          while (z < count && thresholds[z] <= v) ++z;
          noise[2 * i + lane] = z - (int32_t)K;
        }
      }
      const int64_t base = 2 * start, end = numel - base < 2 * size ? numel - base : 2 * size;
      const int32_t *xs = x + base;
      float *ys = y + base;
      if (mean) {
        for (int64_t p = 0; p < end; ++p) ys[p] = ((float)(xs[p] + noise[p]) / grid - mean[base + p]) / std[base + p];
      } else {
        for (int64_t p = 0; p < end; ++p) ys[p] = (float)(xs[p] + noise[p]) / grid;
      }
    }
  }
}
