/* SPDX-License-Identifier: Apache-2.0 */
/* test_free_bins.c - a pool's free structure (Note [Free bins]) against a
 * reference model: a sorted array of (stream, size, address) keys. A seeded
 * random sequence of inserts, erases, swaps (a split remainder or a merged
 * block of the same stream taking a block's place) and queries runs on both, over more streams
 * than have bins (so the overflow treap, the hand-over of an emptied set and
 * the rule that a stream never has blocks in both places are exercised) and
 * sizes across every class; every best fit (lower bound), below, prev and
 * next must name the very block the model names, and the structure must
 * validate (each class's cached minimum included, Note [Class minima]).
 * GCA_TEST_SEED sets the seed (printed) and GCA_TEST_OPS the operation count
 * (default 2,000,000). */
#include <stdio.h>
#include <stdlib.h>

#include "alloc_core.h"
#include "support.h"

#define MAXB    4096 /* blocks that exist (free or not) */
#define STREAMS 7    /* more than GCA__FB_STREAMS */

static gca__block_t blocks[MAXB];
static gca__block_t *model[MAXB]; /* the free ones, sorted by key */
static size_t nmodel;

static uint64_t rng;
static uint64_t next(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int cmp_key(uintptr_t s, size_t size, gca_devptr_t addr, const gca__block_t *b) {
  uintptr_t bs = (uintptr_t)b->stream;
  if (s != bs)
    return s < bs ? -1 : 1;
  if (size != b->size)
    return size < b->size ? -1 : 1;
  return addr < b->addr ? -1 : addr > b->addr;
}

/* First model index with key >= (s, size, addr). */
static size_t m_lower(uintptr_t s, size_t size, gca_devptr_t addr) {
  size_t lo = 0, hi = nmodel;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cmp_key(s, size, addr, model[mid]) > 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void m_insert(gca__block_t *b) {
  size_t i = m_lower((uintptr_t)b->stream, b->size, b->addr);
  memmove(&model[i + 1], &model[i], (nmodel - i) * sizeof(model[0]));
  model[i] = b;
  nmodel++;
}

static void m_erase(gca__block_t *b) {
  size_t i = m_lower((uintptr_t)b->stream, b->size, b->addr);
  assert_true(i < nmodel && model[i] == b);
  memmove(&model[i], &model[i + 1], (nmodel - i - 1) * sizeof(model[0]));
  nmodel--;
}

/* The model's answers, NULL when the stream has no such block. */
static gca__block_t *m_lower_bound(gca_stream_t s, size_t size) {
  size_t i = m_lower((uintptr_t)s, size, 0);
  return i < nmodel && model[i]->stream == s ? model[i] : NULL;
}

static gca__block_t *m_below(gca_stream_t s, size_t size, gca_devptr_t addr) {
  size_t i = m_lower((uintptr_t)s, size, addr);
  return i > 0 && model[i - 1]->stream == s ? model[i - 1] : NULL;
}

/* Sizes in 512-byte units across every class: small exact ones, the
 * power-of-two steps, and huge ones. */
static size_t some_size(void) {
  switch (next() % 4) {
  case 0:
    return (1 + next() % 64) * 512;
  case 1:
    return (1 + next() % 4096) * 512;
  case 2:
    return ((size_t)1 << (9 + next() % 30)) + (next() % 3) * 512;
  default:
    return (1 + next() % (1u << 20)) * 512;
  }
}

static gca_stream_t some_stream(void) {
  /* stream 0 (the legacy stream) included; skewed so sets fill and empty */
  uint64_t r = next() % 16;
  return (gca_stream_t)(uintptr_t)(r < 8 ? r % 3 : r % STREAMS);
}

static void free_structure_matches_the_sorted_model(void **state) {
  (void)state;
  const char *seed_text = getenv("GCA_TEST_SEED"), *ops_text = getenv("GCA_TEST_OPS");
  uint64_t seed = seed_text ? strtoull(seed_text, NULL, 0) : 20261125;
  long nops = ops_text ? atol(ops_text) : 2000000;
  printf("seed %llu (GCA_TEST_SEED), %ld operations (GCA_TEST_OPS)\n", (unsigned long long)seed,
         nops);
  rng = seed;
  gca__pool_t pool;
  memset(&pool, 0, sizeof(pool));
  memset(blocks, 0, sizeof(blocks));
  nmodel = 0;
  for (size_t i = 0; i < MAXB; i++)
    blocks[i].addr = 0x100000000ull + (gca_devptr_t)i * 0x10000000ull;
  long checked = 0, overflow_seen = 0;
  for (long op = 0; op < nops; op++) {
    gca__block_t *b = &blocks[next() % MAXB];
    uint64_t what = next() % 100;
    if (what < 35) { /* free a block: insert */
      if (!b->in_tree) {
        b->stream = some_stream();
        b->size = some_size();
        gca__tree_insert(&pool, b);
        m_insert(b);
      }
    } else if (what < 60) { /* allocate it (or merge it away): erase */
      if (b->in_tree) {
        if (what & 1)
          gca__tree_erase(&pool, b);
        else
          gca__tree_erase_of(&pool, b, b->stream);
        m_erase(b);
      }
    } else if (what < 70) { /* a block takes a free block's place (split or merge) */
      gca__block_t *nb = &blocks[next() % MAXB];
      if (b->in_tree && !nb->in_tree) {
        nb->stream = b->stream; /* one segment: one stream */
        nb->size = next() % 2 ? b->size - (b->size > 512 ? 512 : 0) : some_size();
        gca__tree_swap(&pool, b, nb);
        m_erase(b);
        m_insert(nb);
      }
    } else { /* queries */
      gca_stream_t s = some_stream();
      size_t size = some_size();
      gca__block_t *got = gca__tree_lower_bound(&pool, s, size), *want = m_lower_bound(s, size);
      if (got != want)
        fail_msg("op %ld: lower_bound(stream %zu, %zu) is %p (size %zu), the model says %p "
                 "(size %zu); seed %llu",
                 op, (size_t)(uintptr_t)s, size, (void *)got, got ? got->size : 0, (void *)want,
                 want ? want->size : 0, (unsigned long long)seed);
      got = gca__tree_below(&pool, s, size);
      want = m_below(s, size, 0);
      if (got != want)
        fail_msg("op %ld: below(stream %zu, %zu) differs from the model; seed %llu", op,
                 (size_t)(uintptr_t)s, size, (unsigned long long)seed);
      if (b->in_tree) {
        got = gca__tree_prev(&pool, b);
        want = m_below(b->stream, b->size, b->addr);
        if (got != want)
          fail_msg("op %ld: prev of a block differs from the model; seed %llu", op,
                   (unsigned long long)seed);
        assert_true(gca__tree_contains(&pool, b));
        size_t i = m_lower((uintptr_t)b->stream, b->size, b->addr + 1);
        want = i < nmodel && model[i]->stream == b->stream ? model[i] : NULL;
        if (gca__tree_next(&pool, b) != want)
          fail_msg("op %ld: next of a block differs from the model; seed %llu", op,
                   (unsigned long long)seed);
      }
      checked++;
    }
    assert_int_equal(pool.nfree, nmodel);
    if (op % 4096 == 0) {
      assert_int_equal(gca__tree_validate(&pool), (long)nmodel);
      overflow_seen += pool.root != NULL;
    }
  }
  assert_int_equal(gca__tree_validate(&pool), (long)nmodel);
  assert_true(checked > nops / 5);
  assert_true(overflow_seen > 0); /* more streams than sets reached the overflow treap */
  for (size_t i = 0; i < MAXB; i++)
    if (blocks[i].in_tree)
      gca__tree_erase(&pool, &blocks[i]);
  assert_int_equal(pool.nfree, 0);
  assert_int_equal(gca__tree_validate(&pool), 0);
  gca__tree_fini(&pool);
}

/* Classes grow with size, cover every size, and are exact below 32 KiB. */
static void size_classes_are_monotonic(void **state) {
  (void)state;
  int last = -1;
  for (size_t u = 1; u < (1u << 22); u += 1 + u / 97) {
    int c = gca__fb_class(u * 512);
    assert_true(c >= last && c < GCA__FB_CLASSES);
    if (u < 64)
      assert_int_equal(c, (int)u);
    last = c;
  }
  assert_true(gca__fb_class((size_t)1 << 62) < GCA__FB_CLASSES);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(size_classes_are_monotonic),
      cmocka_unit_test(free_structure_matches_the_sorted_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
