/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_thread_cache.c - the thread caches (Note [Thread caches],
 * tcache.c): statistics stay exact while threads cache their frees without
 * the device lock.
 *
 * Scripted runs: worker threads, each with its own stream, carry out one
 * command at a time (allocate, free, free a block another thread allocated,
 * record a block on another stream, exit) handed to them through a gate by
 * the test's thread, which waits for each to finish; no sleeps. After every
 * command the test reads every statistic with gca_get_stats and compares it
 * with an eager model it keeps itself: the usage statistics (current, peak,
 * allocated and freed of allocation, allocated_bytes, active, active_bytes,
 * requested_bytes, per pool and for all), segments and reserved bytes, and
 * inactive_split and its bytes (current and peak) from the layout of the
 * live blocks, with reset_peak_stats, empty_cache and exiting threads among
 * the commands. Then free-running threads: at each barrier the currents are
 * exact and the walker passes. And the cases: a thread that exits with
 * cached blocks, empty_cache with cached blocks, out of memory while another
 * thread's cache holds a segment. GCA_TEST_SEED repeats a run; the seed is
 * printed. */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_fixture.h"
#include "tc_workers.h"

/* ---- the eager model ---- */

typedef struct mstat {
  int64_t cur, peak, alloc, freed;
} mstat_t;

/* Usage statistics by [type]: allocation, allocated_bytes, active, active_bytes, requested. */
enum { U_ALLOCATION, U_BYTES, U_ACTIVE, U_ACTIVE_BYTES, U_REQUESTED, U_N };

#define MAX_BLOCKS 512
#define MAX_SEGS   64

typedef struct mblock {
  uintptr_t addr;
  size_t size, req;
  int type; /* GCA_STAT_SMALL or GCA_STAT_LARGE */
  gca_stream_t stream;
  bool pending; /* freed, waiting for its recorded stream */
} mblock_t;

typedef struct mseg {
  uintptr_t base;
  size_t size;
  int type;
  gca_stream_t stream;
} mseg_t;

typedef struct model {
  mstat_t u[U_N][GCA_STAT_TYPES];
  mstat_t seg[GCA_STAT_TYPES], res[GCA_STAT_TYPES];
  mstat_t split[GCA_STAT_TYPES], split_bytes[GCA_STAT_TYPES];
  mblock_t b[MAX_BLOCKS];
  int nb;
  mseg_t s[MAX_SEGS];
  int ns;
} model_t;

static size_t round_up(size_t n) {
  return n < 512 ? 512 : (n + 511) & ~(size_t)511;
}

static void mstat_add(mstat_t *a, int t, int64_t n) {
  mstat_t *x = &a[t], *all = &a[GCA_STAT_ALL];
  x->cur += n;
  all->cur += n;
  if (n > 0) {
    x->alloc += n;
    all->alloc += n;
  } else {
    x->freed -= n;
    all->freed -= n;
  }
}

static void mstat_peaks(mstat_t *a) {
  for (int t = 0; t < GCA_STAT_TYPES; t++)
    if (a[t].cur > a[t].peak)
      a[t].peak = a[t].cur;
}

/* inactive_split from the layout: every free gap of a segment holding a
 * live or pending block is one inactive split block. */
static void layout_split(model_t *m) {
  int64_t n[GCA_STAT_TYPES] = {0}, bytes[GCA_STAT_TYPES] = {0};
  for (int i = 0; i < m->ns; i++) {
    const mseg_t *s = &m->s[i];
    uintptr_t at = s->base;
    size_t used = 0;
    int gaps = 0, inside = 0;
    for (;;) { /* blocks of the segment in address order */
      const mblock_t *next = NULL;
      for (int k = 0; k < m->nb; k++) {
        const mblock_t *b = &m->b[k];
        if (b->addr >= at && b->addr < s->base + s->size && (next == NULL || b->addr < next->addr))
          next = b;
      }
      if (next == NULL)
        break;
      gaps += next->addr > at;
      used += next->size;
      at = next->addr + next->size;
      inside++;
    }
    if (inside == 0)
      continue;
    gaps += at < s->base + s->size;
    n[s->type] += gaps;
    bytes[s->type] += (int64_t)(s->size - used);
  }
  for (int t = GCA_STAT_SMALL; t <= GCA_STAT_LARGE; t++) {
    m->split[t].cur = n[t];
    m->split_bytes[t].cur = bytes[t];
  }
  m->split[GCA_STAT_ALL].cur = n[1] + n[2];
  m->split_bytes[GCA_STAT_ALL].cur = bytes[1] + bytes[2];
  mstat_peaks(m->split);
  mstat_peaks(m->split_bytes);
}

static void model_peaks(model_t *m) {
  for (int k = 0; k < U_N; k++)
    mstat_peaks(m->u[k]);
  mstat_peaks(m->seg);
  mstat_peaks(m->res);
  layout_split(m);
}

static int type_of(size_t rounded) {
  return rounded <= MiB ? GCA_STAT_SMALL : GCA_STAT_LARGE;
}

/* Segment size for the sizes these scripts use (PyTorch's rules). */
static size_t seg_size(size_t rounded) {
  return rounded <= MiB ? 2 * MiB : 20 * MiB;
}

static void model_alloc(model_t *m, void *p, size_t req, gca_stream_t stream) {
  uintptr_t a = (uintptr_t)p;
  size_t r = round_up(req);
  int t = type_of(r);
  bool known = false;
  for (int i = 0; i < m->ns && !known; i++)
    known = a >= m->s[i].base && a < m->s[i].base + m->s[i].size;
  if (!known) { /* a new segment, its first block at its start */
    assert_true(m->ns < MAX_SEGS);
    m->s[m->ns++] = (mseg_t){a, seg_size(r), t, stream};
    mstat_add(m->seg, t, 1);
    mstat_add(m->res, t, (int64_t)seg_size(r));
  }
  assert_true(m->nb < MAX_BLOCKS);
  m->b[m->nb++] = (mblock_t){a, r, req, t, stream, false};
  mstat_add(m->u[U_ALLOCATION], t, 1);
  mstat_add(m->u[U_BYTES], t, (int64_t)r);
  mstat_add(m->u[U_ACTIVE], t, 1);
  mstat_add(m->u[U_ACTIVE_BYTES], t, (int64_t)r);
  mstat_add(m->u[U_REQUESTED], t, (int64_t)req);
  model_peaks(m);
}

static int model_find(const model_t *m, void *p) {
  for (int k = 0; k < m->nb; k++)
    if (m->b[k].addr == (uintptr_t)p)
      return k;
  fail_msg("model: no block at %p", p);
  return -1;
}

/* The free of p: completes at once, or stays pending (a recorded stream). */
static void model_free(model_t *m, void *p, bool pending) {
  int k = model_find(m, p);
  mblock_t *b = &m->b[k];
  mstat_add(m->u[U_ALLOCATION], b->type, -1);
  mstat_add(m->u[U_BYTES], b->type, -(int64_t)b->size);
  if (pending) {
    b->pending = true;
  } else {
    mstat_add(m->u[U_ACTIVE], b->type, -1);
    mstat_add(m->u[U_ACTIVE_BYTES], b->type, -(int64_t)b->size);
    mstat_add(m->u[U_REQUESTED], b->type, -(int64_t)b->req);
    m->b[k] = m->b[--m->nb];
  }
  model_peaks(m);
}

/* Pending frees complete (their stream was synchronized; the next malloc or
 * free of the device processes them). */
static void model_complete_pending(model_t *m) {
  for (int k = 0; k < m->nb;) {
    mblock_t *b = &m->b[k];
    if (!b->pending) {
      k++;
      continue;
    }
    mstat_add(m->u[U_ACTIVE], b->type, -1);
    mstat_add(m->u[U_ACTIVE_BYTES], b->type, -(int64_t)b->size);
    mstat_add(m->u[U_REQUESTED], b->type, -(int64_t)b->req);
    m->b[k] = m->b[--m->nb];
  }
  model_peaks(m);
}

/* empty_cache (stream NULL: every segment), or the destroy of `stream`
 * (its segments, Note [Destroyed streams]): a segment without a live or
 * pending block goes back. */
static void model_release(model_t *m, gca_stream_t stream) {
  for (int i = 0; i < m->ns;) {
    mseg_t *s = &m->s[i];
    bool used = stream != NULL && s->stream != stream;
    for (int k = 0; k < m->nb && !used; k++)
      used = m->b[k].addr >= s->base && m->b[k].addr < s->base + s->size;
    if (used) {
      i++;
      continue;
    }
    mstat_add(m->seg, s->type, -1);
    mstat_add(m->res, s->type, -(int64_t)s->size);
    m->s[i] = m->s[--m->ns];
  }
  model_peaks(m);
}

static void model_empty_cache(model_t *m) {
  model_release(m, NULL);
}

static void model_reset_peaks(model_t *m) {
  for (int t = 0; t < GCA_STAT_TYPES; t++) {
    for (int k = 0; k < U_N; k++)
      m->u[k][t].peak = m->u[k][t].cur;
    m->seg[t].peak = m->seg[t].cur;
    m->res[t].peak = m->res[t].cur;
    m->split[t].peak = m->split[t].cur;
    m->split_bytes[t].peak = m->split_bytes[t].cur;
  }
}

static void expect_stat(const char *when, const char *name, int t, const gca_stat_t *got,
                        const mstat_t *want, bool accumulated) {
  if (got->current != want->cur || got->peak != want->peak ||
      (accumulated && (got->allocated != want->alloc || got->freed != want->freed)) ||
      got->allocated - got->freed != got->current)
    fail_msg("%s: %s[%d] is %" PRId64 "/%" PRId64 "/%" PRId64 "/%" PRId64
             " (current/peak/allocated/freed), the model says %" PRId64 "/%" PRId64 "/%" PRId64
             "/%" PRId64 "%s",
             when, name, t, got->current, got->peak, got->allocated, got->freed, want->cur,
             want->peak, want->alloc, want->freed, accumulated ? "" : " (current and peak)");
}

/* Every statistic against the model; inactive_split's allocated and freed
 * depend on how each change is split into steps, so for it the model checks
 * current and peak, and the reading that allocated - freed == current. */
static void expect_model(const model_t *m, const char *when) {
  gca_stats_t s = stats();
  const gca_stat_t *u[U_N] = {s.allocation, s.allocated_bytes, s.active, s.active_bytes,
                              s.requested_bytes};
  static const char *names[U_N] = {"allocation", "allocated_bytes", "active", "active_bytes",
                                   "requested_bytes"};
  for (int t = 0; t < GCA_STAT_TYPES; t++) {
    for (int k = 0; k < U_N; k++)
      expect_stat(when, names[k], t, &u[k][t], &m->u[k][t], true);
    expect_stat(when, "segment", t, &s.segment[t], &m->seg[t], true);
    expect_stat(when, "reserved_bytes", t, &s.reserved_bytes[t], &m->res[t], true);
    expect_stat(when, "inactive_split", t, &s.inactive_split[t], &m->split[t], false);
    expect_stat(when, "inactive_split_bytes", t, &s.inactive_split_bytes[t], &m->split_bytes[t],
                false);
  }
  assert_int_equal(s.oversize_allocations.current, 0);
  assert_int_equal(s.num_ooms, 0);
  check();
}

/* ---- scripted runs ---- */

static unsigned test_seed(void) {
  static unsigned seed;
  if (seed == 0) {
    const char *env = getenv("GCA_TEST_SEED");
    seed = env != NULL ? (unsigned)strtoul(env, NULL, 0) : (unsigned)time(NULL);
    if (seed == 0)
      seed = 1;
    print_message("thread cache scripts: GCA_TEST_SEED=%u\n", seed);
  }
  return seed;
}

static unsigned rnd(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 8;
}

#define NW   3  /* workers */
#define LIVE 10 /* slots per worker */

typedef struct slot {
  void *p;
  int owner; /* the worker that frees it */
} slot_t;

/* Random scripts over three workers: small sizes that repeat (cache hits),
 * 4 MiB blocks of the large pool (20 MiB segments hold five exactly, so
 * every block is split off at its rounded size), frees by the allocating
 * worker or another one, a block recorded on another stream now and then
 * (its free waits; the stream is synchronized before the next command),
 * reset_peak_stats, empty_cache, and a worker that exits and is replaced.
 * The model is checked after every command. */
static void scripted_runs_match_the_model(void **state) {
  (void)state;
  static const size_t sizes[] = {512, 700, 4096, 4096, 12288, 65536, 4 * MiB};
  unsigned seed = test_seed();
  enum { STEPS = 700 };
  gca_stream_t other;
  assert_ok(gca_stream_create(&other, GCA_STREAM_NON_BLOCKING));
  for (unsigned run = 0; run < 3; run++) {
    unsigned r = seed + run;
    gca__allocator_reset();
    assert_ok(gca_set_config("recycle_bins:False")); /* as tc_setup */
    model_t *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    worker_t w[NW];
    slot_t slots[NW][LIVE];
    memset(slots, 0, sizeof(slots));
    int large_live[NW] = {0};
    for (int i = 0; i < NW; i++)
      worker_start(&w[i]);
    size_t max_cached = 0;
    for (int step = 0; step < STEPS; step++) {
      char when[96];
      unsigned x = rnd(&r);
      int k = (int)(x % NW), s = (int)((x >> 4) % LIVE);
      snprintf(when, sizeof(when), "seed %u, step %d", seed + run, step);
      if (x % 97 == 0) {
        assert_ok(gca_reset_peak_stats(0));
        model_reset_peaks(m);
      } else if (x % 89 == 0) {
        assert_ok(gca_empty_cache());
        model_empty_cache(m);
      } else if (x % 151 == 0) { /* worker k exits, its blocks handed to the next */
        int to = (k + 1) % NW;
        for (int i = 0; i < LIVE; i++)
          if (slots[k][i].p != NULL && slots[k][i].owner == k)
            slots[k][i].owner = to;
        worker_exit(&w[k]);
        gca_stream_t keep = w[k].stream;
        assert_int_equal(pthread_create(&w[k].th, NULL, worker_main, &w[k]), 0);
        w[k].stream = keep;
      } else if (slots[k][s].p == NULL) {
        size_t size = sizes[(x >> 8) % GCA_ARRAY_SIZE(sizes)];
        if (size > MiB && large_live[k] >= 3)
          size = 4096;
        void *p = w_alloc(&w[k], size, w[k].stream);
        model_alloc(m, p, size, w[k].stream);
        large_live[k] += size > MiB;
        /* one in four is freed by another worker */
        slots[k][s] = (slot_t){p, (x >> 12) % 4 == 0 ? (k + 1) % NW : k};
      } else {
        slot_t sl = slots[k][s];
        bool record = (x >> 16) % 16 == 0;
        int idx = model_find(m, sl.p);
        bool large = m->b[idx].type == GCA_STAT_LARGE;
        if (record) {
          w[sl.owner].ptr = sl.p;
          w[sl.owner].on = other;
          assert_ok(run_cmd(&w[sl.owner], CMD_RECORD));
        }
        w_free(&w[sl.owner], sl.p);
        model_free(m, sl.p, record);
        if (record) {
          /* the event is done; the next malloc or free completes the free */
          assert_ok(gca_stream_synchronize(other));
          expect_model(m, when);
          void *q = w_alloc(&w[k], 512, w[k].stream);
          model_complete_pending(m);
          model_alloc(m, q, 512, w[k].stream);
          w_free(&w[k], q);
          model_free(m, q, false);
        }
        large_live[k] -= large;
        slots[k][s].p = NULL;
      }
      expect_model(m, when);
      size_t c = tcaches_cached();
      max_cached = c > max_cached ? c : max_cached;
    }
    assert_true(max_cached > 0); /* the scripts do exercise the thread caches */
    for (int k = 0; k < NW; k++)
      for (int s = 0; s < LIVE; s++)
        if (slots[k][s].p != NULL) {
          w_free(&w[slots[k][s].owner], slots[k][s].p);
          model_free(m, slots[k][s].p, false);
          expect_model(m, "freeing what is left");
        }
    for (int i = 0; i < NW; i++) {
      worker_exit(&w[i]);
      assert_ok(gca_stream_destroy(w[i].stream));
      model_release(m, w[i].stream);
    }
    expect_model(m, "after the workers exit");
    assert_ok(gca_empty_cache());
    model_empty_cache(m);
    expect_model(m, "emptied");
    assert_int_equal(m->seg[GCA_STAT_ALL].cur, 0);
    free(m);
  }
  assert_ok(gca_stream_destroy(other));
}

/* The free-running part: workers allocate and free on their own streams
 * (and free each other's blocks) at once, stopping at barriers; there every
 * current is the sum of what the workers hold, the peaks are at least that
 * and at most what the workers could hold at once, and the walker (headroom
 * included) passes. */
#define FR_THREADS 4
#define FR_ROUNDS  6
#define FR_OPS     3000
#define FR_LIVE    8

typedef struct fr {
  int id;
  unsigned seed;
  gca_stream_t stream;
  void *live[FR_LIVE];
  size_t size[FR_LIVE];
  void *handoff[FR_LIVE]; /* blocks the next worker frees */
  size_t hsize[FR_LIVE];
  int failures;
} fr_t;

static fr_t fr[FR_THREADS];
static pthread_barrier_t fr_bar;

static void *fr_main(void *arg) {
  fr_t *f = arg;
  static const size_t sizes[] = {512, 4096, 4096, 16384, 65536};
  unsigned r = f->seed;
  for (int round = 0; round < FR_ROUNDS; round++) {
    fr_t *prev = &fr[(f->id + FR_THREADS - 1) % FR_THREADS];
    for (int i = 0; i < FR_LIVE; i++) { /* the blocks the previous worker handed over */
      if (prev->handoff[i] != NULL && gca_free(prev->handoff[i]) != GCA_OK)
        f->failures++;
      prev->handoff[i] = NULL;
    }
    pthread_barrier_wait(&fr_bar);
    for (int op = 0; op < FR_OPS; op++) {
      unsigned x = rnd(&r), s = x % FR_LIVE;
      if (f->live[s] == NULL) {
        size_t size = sizes[(x >> 4) % GCA_ARRAY_SIZE(sizes)];
        if (gca_malloc(&f->live[s], size, f->stream) != GCA_OK)
          f->failures++;
        f->size[s] = size;
      } else if ((x >> 10) % 8 == 0 && f->handoff[s] == NULL) {
        f->handoff[s] = f->live[s]; /* freed by the next worker after the barrier */
        f->hsize[s] = f->size[s];
        f->live[s] = NULL;
      } else {
        if (gca_free(f->live[s]) != GCA_OK)
          f->failures++;
        f->live[s] = NULL;
      }
    }
    pthread_barrier_wait(&fr_bar); /* the test's thread reads the statistics */
    pthread_barrier_wait(&fr_bar);
  }
  for (int i = 0; i < FR_LIVE; i++)
    if (f->live[i] != NULL && gca_free(f->live[i]) != GCA_OK)
      f->failures++;
  return NULL;
}

static void free_running_threads_keep_currents_exact(void **state) {
  (void)state;
  unsigned seed = test_seed();
  pthread_t th[FR_THREADS];
  pthread_barrier_init(&fr_bar, NULL, FR_THREADS + 1);
  memset(fr, 0, sizeof(fr));
  for (int i = 0; i < FR_THREADS; i++) {
    fr[i].id = i;
    fr[i].seed = seed * 31 + (unsigned)i;
    assert_ok(gca_stream_create(&fr[i].stream, GCA_STREAM_NON_BLOCKING));
    assert_int_equal(pthread_create(&th[i], NULL, fr_main, &fr[i]), 0);
  }
  for (int round = 0; round < FR_ROUNDS; round++) {
    pthread_barrier_wait(&fr_bar); /* start */
    pthread_barrier_wait(&fr_bar); /* quiet */
    int64_t blocks = 0, bytes = 0, requested = 0;
    for (int i = 0; i < FR_THREADS; i++)
      for (int s = 0; s < FR_LIVE; s++) {
        for (int h = 0; h < 2; h++) {
          if ((h ? fr[i].handoff[s] : fr[i].live[s]) == NULL)
            continue;
          size_t sz = h ? fr[i].hsize[s] : fr[i].size[s];
          blocks++;
          bytes += (int64_t)round_up(sz);
          requested += (int64_t)sz;
        }
      }
    gca_stats_t s = stats();
    assert_int_equal(s.allocation[GCA_STAT_ALL].current, blocks);
    assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, bytes);
    assert_int_equal(s.active_bytes[GCA_STAT_SMALL].current, bytes);
    assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, requested);
    assert_true(s.allocation[GCA_STAT_ALL].peak >= blocks);
    assert_true(s.allocation[GCA_STAT_ALL].peak <= 2 * FR_THREADS * FR_LIVE);
    assert_true(s.allocated_bytes[GCA_STAT_ALL].peak <= 2 * FR_THREADS * FR_LIVE * 65536);
    for (int k = 0; k < GCA_STAT_TYPES; k++)
      assert_int_equal(s.allocation[k].allocated - s.allocation[k].freed, s.allocation[k].current);
    check();
    if (round == FR_ROUNDS / 2) {
      assert_ok(gca_reset_peak_stats(0));
      s = stats();
      assert_int_equal(s.allocation[GCA_STAT_ALL].peak, blocks);
      assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].peak, bytes);
    }
    pthread_barrier_wait(&fr_bar); /* go on */
  }
  for (int i = 0; i < FR_THREADS; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(fr[i].failures, 0);
  }
  for (int i = 0; i < FR_THREADS; i++) /* the last round's handoffs */
    for (int s = 0; s < FR_LIVE; s++)
      if (fr[i].handoff[s] != NULL)
        free_ok(fr[i].handoff[s]);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  for (int i = 0; i < FR_THREADS; i++)
    assert_ok(gca_stream_destroy(fr[i].stream));
  pthread_barrier_destroy(&fr_bar);
}

/* A thread that exits with blocks in its cache gives them back: the
 * statistics do not move, the blocks are in the free tree again, and the
 * segments go back with empty_cache. Its live blocks stay live for the
 * thread that frees them. */
static void an_exiting_thread_gives_its_cache_back(void **state) {
  (void)state;
  model_t *m = calloc(1, sizeof(*m));
  worker_t a, b;
  worker_start(&a);
  worker_start(&b);
  void *x = w_alloc(&a, 4096, a.stream), *y = w_alloc(&b, 4096, b.stream);
  model_alloc(m, x, 4096, a.stream);
  model_alloc(m, y, 4096, b.stream);
  w_free(&a, x);
  model_free(m, x, false);
  w_free(&b, y);
  model_free(m, y, false);
  void *keep = w_alloc(&a, 8192, a.stream), *c[3];
  model_alloc(m, keep, 8192, a.stream);
  for (int i = 0; i < 3; i++) {
    c[i] = w_alloc(&a, 65536, a.stream);
    model_alloc(m, c[i], 65536, a.stream);
  }
  for (int i = 0; i < 3; i += 2) { /* not neighbours: both may be cached */
    w_free(&a, c[i]);
    model_free(m, c[i], false);
  }
  void *h = w_alloc(&a, 65536, a.stream); /* handed out by a's cache */
  model_alloc(m, h, 65536, a.stream);
  assert_true(h == c[0] || h == c[2]);
  expect_model(m, "before the exit");
  assert_true(tcaches_cached() > 0);
  worker_exit(&a);
  expect_model(m, "after the exit");
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_int_equal(d->ntcs, 1); /* b's */
  w_free(&b, c[1]);
  model_free(m, c[1], false);
  w_free(&b, keep);
  model_free(m, keep, false);
  w_free(&b, h); /* a live block of the dead thread's cache */
  model_free(m, h, false);
  expect_model(m, "its blocks freed by another thread");
  assert_ok(gca_empty_cache());
  model_empty_cache(m);
  expect_model(m, "emptied");
  assert_int_equal(stats().segment[GCA_STAT_ALL].current, 0);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
  free(m);
}

/* empty_cache while blocks wait in two threads' caches returns every segment
 * that holds nothing live, and a reset of peaks while they are cached sets
 * every peak to the exact current. */
static void empty_cache_takes_the_thread_caches_blocks(void **state) {
  (void)state;
  model_t *m = calloc(1, sizeof(*m));
  worker_t a, b;
  worker_start(&a);
  worker_start(&b);
  void *pa[4], *pb[4];
  for (int i = 0; i < 4; i++) {
    pa[i] = w_alloc(&a, 100000, a.stream);
    model_alloc(m, pa[i], 100000, a.stream);
    pb[i] = w_alloc(&b, 3000, b.stream);
    model_alloc(m, pb[i], 3000, b.stream);
  }
  for (int i = 0; i < 4; i += 2) {
    w_free(&a, pa[i]);
    model_free(m, pa[i], false);
    w_free(&b, pb[i]);
    model_free(m, pb[i], false);
  }
  /* the same sizes again: taken back from the caches */
  pa[0] = w_alloc(&a, 100000, a.stream);
  model_alloc(m, pa[0], 100000, a.stream);
  w_free(&a, pa[0]);
  model_free(m, pa[0], false);
  assert_true(tcaches_cached() >= 2);
  assert_ok(gca_reset_peak_stats(0));
  model_reset_peaks(m);
  expect_model(m, "peaks reset with blocks cached");
  for (int i = 1; i < 4; i += 2) {
    w_free(&a, pa[i]);
    model_free(m, pa[i], false);
    w_free(&b, pb[i]);
    model_free(m, pb[i], false);
  }
  expect_model(m, "all freed");
  assert_ok(gca_empty_cache());
  model_empty_cache(m);
  expect_model(m, "emptied");
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(tcaches_cached(), 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
  workers_done(&a, &b);
  free(m);
}

/* A device with room for two small segments: one is held by a block waiting
 * in worker a's cache, the other by worker b's blocks. b's next segment runs
 * out of memory, the remedies take a's cached block back and release its
 * segment, and the request succeeds; a real out-of-memory then reports the
 * exact allocated bytes, a's cache included. */
static void out_of_memory_takes_another_threads_cache(void **state) {
  (void)state;
  worker_t a, b;
  engaged_workers(&a, &b);
  assert_ok(gca_empty_cache());
  assert_ok(gca_sim_set_capacity(0, 4 * MiB));
  void *x = w_alloc(&a, MiB, a.stream);
  w_free(&a, x); /* cached in a's cache: its segment stays */
  assert_int_equal(tcaches_cached(), 1);
  void *y1 = w_alloc(&b, MiB, b.stream), *y2 = w_alloc(&b, MiB, b.stream);
  assert_int_equal(stats().segment[GCA_STAT_ALL].current, 2);
  void *y3 = w_alloc(&b, MiB, b.stream); /* a third segment: only after a's is released */
  gca_stats_t s = stats();
  assert_int_equal(s.num_ooms, 0);
  assert_int_equal(s.segment[GCA_STAT_ALL].current, 2);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 3 * MiB);
  assert_int_equal(tcaches_cached(), 0);
  void *z = w_alloc(&a, 512, b.stream); /* in y3's segment; handed out through a's cache */
  w_free(&a, z);
  assert_int_equal(tcaches_cached(), 1);
  assert_ptr_equal(w_alloc(&a, 512, b.stream), z);
  assert_int_equal(tcaches_cached(), 0);
  b.size = 2 * MiB;
  b.on = b.stream;
  assert_int_equal(run_cmd(&b, CMD_ALLOC), GCA_ERR_OUT_OF_MEMORY);
  s = stats();
  assert_int_equal(s.num_ooms, 1);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 3 * MiB + 512);
  w_free(&a, z);
  w_free(&b, y1);
  w_free(&b, y2);
  w_free(&b, y3);
  assert_ok(gca_sim_set_capacity(0, 16 * GiB));
  workers_done(&a, &b);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
}

/* thread_cache:False keeps every free on the locked paths: no thread cache
 * holds a block. */
static void thread_cache_false_turns_them_off(void **state) {
  (void)state;
  assert_ok(gca_set_config("thread_cache:False"));
  worker_t a, b;
  worker_start(&a);
  worker_start(&b);
  for (int i = 0; i < 50; i++) {
    w_free(&a, w_alloc(&a, 4096, a.stream));
    w_free(&b, w_alloc(&b, 4096, b.stream));
    assert_int_equal(tcaches_cached(), 0);
  }
  char buf[1024];
  assert_ok(gca_get_config(buf, sizeof(buf)));
  assert_non_null(strstr(buf, "thread_cache:False"));
  assert_ok(gca_set_config("thread_cache:True"));
  w_free(&a, w_alloc(&a, 4096, a.stream));
  assert_int_equal(tcaches_cached(), 1);
  assert_ok(gca_get_config(buf, sizeof(buf)));
  assert_non_null(strstr(buf, "thread_cache:True"));
  workers_done(&a, &b);
}

/* Waits until a thread sleeps on tc's lock (it counts itself first). */
static void await_sleeper(gca__tcache_t *tc) {
  while (atomic_load(&tc->sleepers) == 0)
    sched_yield();
}

typedef struct reader {
  gca_stats_t st;
  gca_status_t rc;
} reader_t;

static void *read_stats(void *arg) {
  reader_t *r = arg;
  r->rc = gca_get_stats(0, &r->st);
  return NULL;
}

/* Note [Thread cache lock]: a fold that finds a cache's lock held (its owner
 * inside a fast path) sleeps on it, and gets through when the owner lets go
 * with the fast paths' plain unlock, which wakes nobody; an owner whose
 * cache a visitor holds sleeps too, and the visitor's unlock wakes it. The
 * statistics read are exact. */
static void waiters_sleep_on_a_held_cache_lock(void **state) {
  (void)state;
  worker_t a, b;
  engaged_workers(&a, &b);
  w_free(&a, w_alloc(&a, 4096, a.stream)); /* into a's cache */
  void *x = w_alloc(&a, 4096, a.stream);
  gca__tcache_t *tc = tcache_of(x);
  assert_non_null(tc);
  gca__tc_lock(tc); /* as a's fast path holds it */
  reader_t r = {0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, read_stats, &r), 0);
  await_sleeper(tc);
  gca__tc_exit(tc, GCA__TC_LOCKED); /* the fast paths' unlock */
  pthread_join(th, NULL);
  assert_ok(r.rc);
  assert_int_equal(r.st.allocation[GCA_STAT_ALL].current, 1);
  assert_int_equal(r.st.allocated_bytes[GCA_STAT_ALL].current, 4096);
  assert_int_equal(r.st.requested_bytes[GCA_STAT_ALL].current, 4096);

  gca__tc_lock(tc); /* as a fold holds it */
  a.ptr = x;
  cmd_post(&a, CMD_FREE); /* the fast put: it waits for the lock */
  await_sleeper(tc);
  gca__tc_unlock_wake(tc);
  assert_ok(cmd_wait(&a));
  assert_int_equal(tcaches_cached(), 2);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(atomic_load(&tc->sleepers), 0);
  workers_done(&a, &b);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, tc_setup, alloc_teardown)
  const struct CMUnitTest tests[] = {
      T(scripted_runs_match_the_model),
      T(free_running_threads_keep_currents_exact),
      T(an_exiting_thread_gives_its_cache_back),
      T(empty_cache_takes_the_thread_caches_blocks),
      T(out_of_memory_takes_another_threads_cache),
      T(thread_cache_false_turns_them_off),
      T(waiters_sleep_on_a_held_cache_lock),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
