/* SPDX-License-Identifier: Apache-2.0 */
/* philox.h - the Philox4x32-10 counter-based generator (Salmon et al., "Parallel
 * random numbers: as easy as 1, 2, 3", SC'11), one block function shared by
 * the sim's RNG kernel, the graph layer and the tests.
 *
 * The one idea: a random number is a pure function of (key, counter), so a
 * generator is two integers (seed, offset) and a replayed graph draws the same
 * numbers as an eager run as long as it is given the same offset. The constants
 * are the published ones; the known-answer vectors of the Random123
 * distribution (kat_vectors, philox4x32_10) pin them in tests/graphs.
 *
 * The RNG kernel's layout of numbers (Note [Philox stream]): element i of a
 * draw at offset `off` (a multiple of 4) is word (i % 4) of the block for
 * counter c = off / 4 + i / 4, written as the 128-bit counter
 * {lo32(c), hi32(c), 0, 0} under the key {lo32(seed), hi32(seed)}. A draw of n
 * numbers advances the offset by n rounded up to a multiple of 4.
 */
#ifndef GCA_PHILOX_H
#define GCA_PHILOX_H

#include <stddef.h>
#include <stdint.h>

#define GCA_PHILOX_M0 0xD2511F53u
#define GCA_PHILOX_M1 0xCD9E8D57u
#define GCA_PHILOX_W0 0x9E3779B9u
#define GCA_PHILOX_W1 0xBB67AE85u

/* out = Philox4x32-10(ctr, key). */
static inline void gca__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                      uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)GCA_PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)GCA_PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += GCA_PHILOX_W0;
    k1 += GCA_PHILOX_W1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Offset units a draw of n numbers consumes (n rounded up to a multiple of 4). */
static inline uint64_t gca__philox_increment(size_t n) {
  return ((uint64_t)n + 3u) & ~(uint64_t)3u;
}

/* dst[0..n) = the numbers of Note [Philox stream] for (seed, offset). */
static inline void gca__philox_fill(uint32_t *dst, size_t n, uint64_t seed, uint64_t offset) {
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint64_t base = offset / 4u;
  for (size_t g = 0; g * 4u < n; g++) {
    uint64_t c = base + g;
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0}, out[4];
    gca__philox4x32_10(ctr, key, out);
    for (size_t j = 0; j < 4 && g * 4u + j < n; j++)
      dst[g * 4u + j] = out[j];
  }
}

#endif
