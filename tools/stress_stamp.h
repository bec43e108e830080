/* SPDX-License-Identifier: Apache-2.0 */
/* stress_stamp.h - the per-block pattern gca-stress writes into every live
 * block and checks before freeing it.
 *
 * Word i of a block (a 32-bit word at byte offset 4 i) holds base + i * step,
 * where base and step derive from the block's key. Because the value depends
 * only on the absolute word index, any set of regions can be written and read
 * independently, overlapping or not, and a region can be re-written later (from
 * another stream) without changing what the checker expects. Only the head, the
 * tail and a few sampled words in between are stamped: enough to catch a block
 * handed out twice, a write after free or a stale stream's late write, at a
 * cost that does not grow with the block's size. Bytes past the last whole
 * word are not stamped.
 */
#ifndef GCA_TOOLS_STRESS_STAMP_H
#define GCA_TOOLS_STRESS_STAMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca.h"

#define STRESS_STAMP_HEAD_WORDS   64
#define STRESS_STAMP_TAIL_WORDS   64
#define STRESS_STAMP_SAMPLES      4
#define STRESS_STAMP_SAMPLE_WORDS 4
#define STRESS_STAMP_MAX_REGIONS  (2 + STRESS_STAMP_SAMPLES)
/* Host words needed to read back every region of any block. */
#define STRESS_STAMP_MAX_WORDS                         \
  (STRESS_STAMP_HEAD_WORDS + STRESS_STAMP_TAIL_WORDS + \
   STRESS_STAMP_SAMPLES * STRESS_STAMP_SAMPLE_WORDS)

typedef struct stress_region {
  uint64_t word;  /* first word index */
  uint32_t count; /* words, >= 1 */
} stress_region_t;

/* Invariant: regions lie inside [0, size / 4); region 0 is the head when
 * nregions > 0; sum of counts <= STRESS_STAMP_MAX_WORDS; step is odd. */
typedef struct stress_stamp {
  uint32_t base;
  uint32_t step;
  int nregions;
  stress_region_t regions[STRESS_STAMP_MAX_REGIONS];
} stress_stamp_t;

/* Where a check found the first wrong word. */
typedef struct stress_mismatch {
  uint64_t offset; /* byte offset in the block */
  uint32_t expected;
  uint32_t found;
} stress_mismatch_t;

/* ---- stress_stamp.c ---- */

/* The stamp of a block of `size` bytes whose pattern is keyed by `key`. */
void gca__stress_stamp_layout(uint64_t size, uint64_t key, stress_stamp_t *out);
/* The value word `word` must hold. */
uint32_t gca__stress_stamp_expected(const stress_stamp_t *stamp, uint64_t word);
/* Whether byte offset `offset` lies in a stamped word. */
bool gca__stress_stamp_covers(const stress_stamp_t *stamp, uint64_t offset);
/* Enqueues kernels writing regions [first, last) of the stamp at `ptr` on `stream`. */
gca_status_t gca__stress_stamp_write(gca_devptr_t ptr, const stress_stamp_t *stamp, int first,
                                     int last, gca_stream_t stream);
/* Copies every region into host[] (regions back to back) on `stream` and waits
 * for it; on failure no queued copy is left to write into host[] later (as far
 * as the stream can still be synchronized). */
gca_status_t gca__stress_stamp_read(gca_devptr_t ptr, const stress_stamp_t *stamp, uint32_t *host,
                                    gca_stream_t stream);
/* Compares host[] as filled by gca__stress_stamp_read; false with *mm set at
 * the lowest wrong offset. */
bool gca__stress_stamp_check(const stress_stamp_t *stamp, const uint32_t *host,
                             stress_mismatch_t *mm);

#endif
