/* SPDX-License-Identifier: Apache-2.0 */
/* stress_stamp.c - writing, reading back and checking gca-stress's per-block
 * pattern with device operations only (fill kernels and copies on the block's
 * stream), so the same checker runs on the sim and on a real GPU.
 */
#include "stress_stamp.h"

#include "stress_sizes.h"

void gca__stress_stamp_layout(uint64_t size, uint64_t key, stress_stamp_t *out) {
  uint64_t nwords = size / 4;
  out->base = (uint32_t)gca__stress_mix(key, 1);
  out->step = (uint32_t)gca__stress_mix(key, 2) | 1u;
  out->nregions = 0;
  if (nwords == 0)
    return;
  uint64_t head = nwords < STRESS_STAMP_HEAD_WORDS ? nwords : STRESS_STAMP_HEAD_WORDS;
  out->regions[out->nregions++] = (stress_region_t){0, (uint32_t)head};
  if (nwords > head) {
    uint64_t tail =
        nwords - head < STRESS_STAMP_TAIL_WORDS ? nwords - head : STRESS_STAMP_TAIL_WORDS;
    out->regions[out->nregions++] = (stress_region_t){nwords - tail, (uint32_t)tail};
  }
  uint64_t inner = STRESS_STAMP_HEAD_WORDS + STRESS_STAMP_TAIL_WORDS + STRESS_STAMP_SAMPLE_WORDS;
  if (nwords <= inner)
    return;
  uint64_t span = nwords - inner + 1;
  for (int i = 0; i < STRESS_STAMP_SAMPLES; i++) {
    uint64_t w = STRESS_STAMP_HEAD_WORDS + gca__stress_mix(key, 3 + (uint64_t)i) % span;
    out->regions[out->nregions++] = (stress_region_t){w, STRESS_STAMP_SAMPLE_WORDS};
  }
}

uint32_t gca__stress_stamp_expected(const stress_stamp_t *stamp, uint64_t word) {
  return stamp->base + (uint32_t)word * stamp->step;
}

bool gca__stress_stamp_covers(const stress_stamp_t *stamp, uint64_t offset) {
  uint64_t w = offset / 4;
  for (int i = 0; i < stamp->nregions; i++)
    if (w >= stamp->regions[i].word && w < stamp->regions[i].word + stamp->regions[i].count)
      return true;
  return false;
}

static void *dptr(gca_devptr_t p) {
  return (void *)(uintptr_t)p;
}

gca_status_t gca__stress_stamp_write(gca_devptr_t ptr, const stress_stamp_t *stamp, int first,
                                     int last, gca_stream_t stream) {
  for (int i = first; i < last && i < stamp->nregions; i++) {
    const stress_region_t *r = &stamp->regions[i];
    TOOL_CHECK(gca_kernel_fill_u32(dptr(ptr + r->word * 4),
                                   gca__stress_stamp_expected(stamp, r->word), stamp->step,
                                   r->count, stream));
  }
  return GCA_OK;
}

/* Waits for the stream even through injected synchronize failures, so that no
 * queued copy writes into the host buffer after the caller moved on. */
static void drain_stream(gca_stream_t stream) {
  for (int i = 0; i < 64 && gca_stream_synchronize(stream) != GCA_OK; i++)
    ;
}

gca_status_t gca__stress_stamp_read(gca_devptr_t ptr, const stress_stamp_t *stamp, uint32_t *host,
                                    gca_stream_t stream) {
  size_t at = 0;
  for (int i = 0; i < stamp->nregions; i++) {
    const stress_region_t *r = &stamp->regions[i];
    gca_status_t st =
        gca_memcpy_async(host + at, dptr(ptr + r->word * 4), (size_t)r->count * 4, stream);
    if (st != GCA_OK) {
      /* copies already queued still write into host[]: let them land first */
      if (i > 0)
        drain_stream(stream);
      return st;
    }
    at += r->count;
  }
  gca_status_t st = stamp->nregions > 0 ? gca_stream_synchronize(stream) : GCA_OK;
  if (st != GCA_OK)
    drain_stream(stream);
  return st;
}

bool gca__stress_stamp_check(const stress_stamp_t *stamp, const uint32_t *host,
                             stress_mismatch_t *mm) {
  bool ok = true;
  size_t at = 0;
  for (int i = 0; i < stamp->nregions; i++) {
    const stress_region_t *r = &stamp->regions[i];
    for (uint32_t j = 0; j < r->count; j++, at++) {
      uint32_t want = gca__stress_stamp_expected(stamp, r->word + j);
      uint64_t off = (r->word + j) * 4;
      if (host[at] != want && (ok || off < mm->offset)) {
        *mm = (stress_mismatch_t){off, want, host[at]};
        ok = false;
      }
    }
  }
  return ok;
}
