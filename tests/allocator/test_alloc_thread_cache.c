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
#include "tcache.h"

/* ---- workers: one command at a time, through a gate ---- */

enum { CMD_NONE, CMD_ALLOC, CMD_FREE, CMD_RECORD, CMD_PAIRS, CMD_EXIT };

typedef struct worker {
  pthread_t th;
  gca_stream_t stream;
  int cmd;
  size_t size;
  gca_stream_t on; /* CMD_ALLOC: the stream; CMD_RECORD: the stream recorded */
  void *ptr;
  gca_status_t st;
  bool done;
  long pairs;       /* CMD_PAIRS: how many (size bytes on `on`); 0: until `stop` */
  size_t alt;       /* CMD_PAIRS: if not 0, every other pair is of this size */
  atomic_bool stop; /* CMD_PAIRS with pairs 0: set by the test's thread */
  atomic_long pairs_done;
} worker_t;

/* CMD_PAIRS: allocations of w->size freed at once, the first failure's status. */
static gca_status_t run_pairs(worker_t *w) {
  for (long i = 0; w->pairs == 0 ? !atomic_load(&w->stop) : i < w->pairs; i++) {
    void *p;
    gca_status_t st = gca_malloc(&p, w->alt != 0 && (i & 1) ? w->alt : w->size, w->on);
    if (st == GCA_OK)
      st = gca_free(p);
    if (st != GCA_OK)
      return st;
    atomic_fetch_add(&w->pairs_done, 1);
  }
  return GCA_OK;
}

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (;;) {
    pthread_mutex_lock(&gate_mu);
    while (w->cmd == CMD_NONE)
      pthread_cond_wait(&gate_cv, &gate_mu);
    int cmd = w->cmd;
    pthread_mutex_unlock(&gate_mu);
    gca_status_t st = GCA_OK;
    if (cmd == CMD_ALLOC)
      st = gca_malloc(&w->ptr, w->size, w->on);
    else if (cmd == CMD_FREE)
      st = gca_free(w->ptr);
    else if (cmd == CMD_RECORD)
      st = gca_record_stream(w->ptr, w->on);
    else if (cmd == CMD_PAIRS)
      st = run_pairs(w);
    pthread_mutex_lock(&gate_mu);
    w->st = st;
    w->cmd = CMD_NONE;
    w->done = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    if (cmd == CMD_EXIT)
      return NULL;
  }
}

/* Hands w one command; cmd_wait waits until it is carried out. */
static void cmd_post(worker_t *w, int cmd) {
  pthread_mutex_lock(&gate_mu);
  w->done = false;
  w->cmd = cmd;
  pthread_cond_broadcast(&gate_cv);
  pthread_mutex_unlock(&gate_mu);
}

static gca_status_t cmd_wait(worker_t *w) {
  pthread_mutex_lock(&gate_mu);
  while (!w->done)
    pthread_cond_wait(&gate_cv, &gate_mu);
  gca_status_t st = w->st;
  pthread_mutex_unlock(&gate_mu);
  return st;
}

/* Hands w one command and waits until it is carried out. */
static gca_status_t run_cmd(worker_t *w, int cmd) {
  cmd_post(w, cmd);
  return cmd_wait(w);
}

static void worker_start(worker_t *w) {
  memset(w, 0, sizeof(*w));
  assert_ok(gca_stream_create(&w->stream, GCA_STREAM_NON_BLOCKING));
  assert_int_equal(pthread_create(&w->th, NULL, worker_main, w), 0);
}

static void worker_exit(worker_t *w) {
  assert_ok(run_cmd(w, CMD_EXIT));
  pthread_join(w->th, NULL);
}

static void *w_alloc(worker_t *w, size_t size, gca_stream_t on) {
  w->size = size;
  w->on = on;
  assert_ok(run_cmd(w, CMD_ALLOC));
  assert_non_null(w->ptr);
  return w->ptr;
}

static void w_free(worker_t *w, void *p) {
  w->ptr = p;
  assert_ok(run_cmd(w, CMD_FREE));
}

/* w carries out n pairs of `size` bytes on its stream. */
static void w_pairs(worker_t *w, size_t size, long n) {
  w->size = size;
  w->on = w->stream;
  w->pairs = n;
  assert_ok(run_cmd(w, CMD_PAIRS));
}

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

/* empty_cache: every segment without a live or pending block goes back. */
static void model_empty_cache(model_t *m) {
  for (int i = 0; i < m->ns;) {
    mseg_t *s = &m->s[i];
    bool used = false;
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

static size_t tcaches_cached(void) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  size_t n = 0;
  for (gca__tcache_t *tc = d != NULL ? d->tcs : NULL; tc != NULL; tc = tc->next)
    n += tc->ncached;
  return n;
}

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

/* Two workers engage the thread caches; a worker's free goes into its own
 * cache and its next allocation of that size takes the block back. */
static void engage(worker_t *a, worker_t *b) {
  w_free(a, w_alloc(a, 4096, a->stream));
  w_free(b, w_alloc(b, 4096, b->stream));
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_true(d->tc_on);
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
  worker_exit(&a);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
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
  worker_start(&a);
  worker_start(&b);
  engage(&a, &b);
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
  worker_exit(&a);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
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
  worker_exit(&a);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
}

/* The thread cache whose domain holds p. */
static gca__tcache_t *tcache_of(void *p) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next)
    if (gca__tc_find(tc, (gca_devptr_t)(uintptr_t)p) >= 0)
      return tc;
  return NULL;
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
  worker_start(&a);
  worker_start(&b);
  engage(&a, &b);
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
  worker_exit(&a);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
}

/* Whether tc is one of d's thread caches now. */
static bool linked(const gca__tcache_t *tc) {
  for (gca__tcache_t *x = gca__devalloc_peek(0)->tcs; x != NULL; x = x->next)
    if (x == tc)
      return true;
  return false;
}

/* Note [Thread cache waste]: a worker alternating 4 KiB and 12 KiB carved
 * from one run loses each cached block unused (the next request splits the
 * run beside it); after GCA__TC_WASTE_OFF such losses its next free parks
 * its cache (the other worker's is untouched), and its frees go the way of
 * a thread without one. Once the worker repeats one size, the probe after
 * GCA__TC_PROBE frees gives it its cache back, and the hits keep it. With
 * the other worker gone no cache is left and the statistics are plain. The
 * statistics stay exact throughout. */
static void a_cache_that_wastes_its_blocks_is_parked(void **state) {
  (void)state;
  worker_t a, b;
  worker_start(&a);
  worker_start(&b);
  engage(&a, &b);
  w_free(&a, w_alloc(&a, 4096, a.stream)); /* into a's cache */
  void *x = w_alloc(&a, 4096, a.stream);
  gca__tcache_t *tc = tcache_of(x);
  assert_non_null(tc);
  w_free(&a, x);
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_int_equal(d->ntcs, 2);
  for (int i = 0; i < 4 * GCA__TC_WASTE_OFF; i++)
    w_free(&a, w_alloc(&a, i & 1 ? 12288 : 4096, a.stream));
  assert_false(linked(tc)); /* parked */
  assert_int_equal(d->ntcs, 1);
  assert_int_equal(tcaches_cached(), 1); /* b's */
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  for (int i = 0; i < GCA__TC_PROBE / 2; i++) /* no cache yet: the probe is further */
    w_free(&a, w_alloc(&a, 4096, a.stream));
  assert_int_equal(d->ntcs, 1);
  for (int i = 0; i < 2 * GCA__TC_PROBE; i++)
    w_free(&a, w_alloc(&a, 4096, a.stream));
  assert_int_equal(d->ntcs, 2);
  assert_true(linked(tc)); /* the parked one, taken back */
  assert_int_equal(tc->waste, 0);
  assert_int_equal(tc->ncached, 1);
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 0);
  check();
  for (int i = 0; i < 4 * GCA__TC_WASTE_OFF; i++) /* parked again */
    w_free(&a, w_alloc(&a, i & 1 ? 12288 : 4096, a.stream));
  assert_false(linked(tc));
  /* the pattern goes on: each try loses its first block, and the next waits
   * twice as long (256, 512, ... frees), so 8,192 frees see about five
   * tries, not 32 */
  int64_t parks = stats().num_cache_parks;
  assert_int_equal(parks, 2);
  a.alt = 12288;
  w_pairs(&a, 4096, 32 * GCA__TC_PROBE);
  a.alt = 0;
  parks = stats().num_cache_parks - parks;
  assert_int_equal(parks, 5); /* tries at 256, 512, 1,024, 2,048 and 4,096 frees */
  worker_exit(&b);
  assert_null(d->tcs);
  assert_false(d->tc_count); /* no headroom to count: plain statistics */
  w_free(&a, w_alloc(&a, 12288, a.stream));
  s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].peak, 12288);
  assert_int_equal(s.num_cache_parks, 2 + parks);
  assert_ok(gca_reset_accumulated_stats(0));
  assert_int_equal(stats().num_cache_parks, 0);
  check();
  worker_exit(&a);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
}

/* ---- sections (Note [Thread cache sections]) ---- */

/* The cache holding the block a's next 4 KiB request takes (a's own). */
static gca__tcache_t *cache_of_worker(worker_t *a) {
  w_free(a, w_alloc(a, 4096, a->stream)); /* into a's cache */
  void *x = w_alloc(a, 4096, a->stream);
  gca__tcache_t *tc = tcache_of(x);
  w_free(a, x);
  assert_non_null(tc);
  return tc;
}

/* An owner whose cache nobody visits for GCA__TC_CALM fast paths enters it
 * without the lock from then on (its calm count stops moving); a read of
 * the statistics (a fold, a visitor) puts it back on the lock, and the
 * count starts again. The statistics are exact throughout. In a build
 * without sections (a thread sanitizer's, or no membarrier) no cache ever
 * turns quiet. */
static void a_calm_owner_enters_without_the_lock_until_a_visit(void **state) {
  (void)state;
  worker_t a, b;
  worker_start(&a);
  worker_start(&b);
  engage(&a, &b);
  gca__tcache_t *tc = cache_of_worker(&a);
  int64_t before = stats().allocation[GCA_STAT_ALL].allocated;
  w_pairs(&a, 4096, GCA__TC_CALM + 8);
  if (gca__tc_calm_limit == UINT32_MAX) {
    print_message("no sections in this build or on this kernel: the lock throughout\n");
    assert_int_equal(atomic_load(&tc->quiet), 0);
    assert_int_equal(tc->calm, 2 * (GCA__TC_CALM + 8) + 2); /* two paths a pair */
  } else {
    assert_int_equal(gca__tc_calm_limit, GCA__TC_CALM);
    assert_int_equal(atomic_load(&tc->quiet), 1);
    assert_int_equal(tc->calm, GCA__TC_CALM); /* the paths after it were sections */
    w_pairs(&a, 4096, 100);
    assert_int_equal(tc->calm, GCA__TC_CALM);
    assert_int_equal(atomic_load(&tc->active), 0);
    assert_int_equal(atomic_load(&tc->lock), 0);
  }
  uint32_t calm = tc->calm;
  gca_stats_t s = stats(); /* a visit */
  bool sections = gca__tc_calm_limit != UINT32_MAX;
  assert_int_equal(atomic_load(&tc->quiet), 0);
  assert_int_equal(atomic_load(&tc->blocked), 0);
  assert_int_equal(tc->calm, sections ? 0 : calm); /* without sections a visit changes nothing */
  assert_int_equal(s.num_cache_fences, sections ? 1 : 0);
  int64_t pairs = sections ? GCA__TC_CALM + 8 + 100 : GCA__TC_CALM + 8;
  assert_int_equal(s.allocation[GCA_STAT_ALL].allocated - before, pairs);
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.allocation[GCA_STAT_ALL].peak, 1);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 0);
  w_pairs(&a, 4096, 10);
  assert_int_equal(tc->calm, (sections ? 0 : calm) + 20); /* on the lock again */
  check();
  worker_exit(&a);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
}

typedef struct visit {
  gca_stats_t st;
  gca_status_t rc;
  atomic_bool done;
} visit_t;

static void *visit_main(void *arg) {
  visit_t *v = arg;
  v->rc = gca_get_stats(0, &v->st);
  atomic_store(&v->done, true);
  return NULL;
}

/* A visitor that finds the owner inside a section (here the test's thread
 * holds the section open for it) marks the cache blocked, fences and waits
 * until the section ends; meanwhile the owner's entry misses. After it the
 * cache is on the lock again, and the statistics read are exact. */
static void a_visitor_waits_for_a_quiet_owners_section(void **state) {
  (void)state;
  if (gca__tc_calm_limit == UINT32_MAX) {
    print_message("no sections in this build or on this kernel: nothing to wait for\n");
    skip();
  }
  worker_t a, b;
  worker_start(&a);
  worker_start(&b);
  engage(&a, &b);
  gca__tcache_t *tc = cache_of_worker(&a);
  w_pairs(&a, 4096, GCA__TC_CALM);
  assert_int_equal(atomic_load(&tc->quiet), 1);
  void *x = w_alloc(&a, 4096, a.stream); /* handed out by a section */
  atomic_store(&tc->active, 1);          /* as a's next path would, inside its section */
  visit_t v = {0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, visit_main, &v), 0);
  while (atomic_load(&tc->blocked) == 0) /* the gate: the visitor marked it */
    sched_yield();
  assert_false(atomic_load(&v.done)); /* it cannot pass the open section */
  /* an entry now finds the cache blocked and misses; in doing so it drops
   * `active`, which ends the section held open for the visitor */
  assert_int_equal(gca__tc_enter(tc), GCA__TC_OUT);
  assert_int_equal(atomic_load(&tc->active), 0);
  pthread_join(th, NULL);
  assert_ok(v.rc);
  assert_int_equal(v.st.allocation[GCA_STAT_ALL].current, 1);
  assert_int_equal(v.st.allocated_bytes[GCA_STAT_ALL].current, 4096);
  assert_int_equal(v.st.requested_bytes[GCA_STAT_ALL].current, 4096);
  assert_int_equal(atomic_load(&tc->quiet), 0);
  assert_int_equal(atomic_load(&tc->blocked), 0);
  assert_int_equal(atomic_load(&tc->lock), 0);
  w_free(&a, x); /* back by the lock */
  assert_int_equal(tc->calm, 1);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  check();
  worker_exit(&a);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
}

/* Folds while an owner runs pairs in and out of quiet sections (the calm
 * limit lowered to 16 so that it turns quiet again between folds): every
 * read sees one instant (at most its one block live, bytes and requested
 * bytes agreeing, allocated less freed the current, the peak not passed),
 * and the totals are exact at the end. */
static void folds_against_sections_read_one_instant(void **state) {
  (void)state;
  uint32_t saved = gca__tc_calm_limit;
  if (saved != UINT32_MAX)
    gca__tc_calm_limit = 16;
  worker_t a, b;
  worker_start(&a);
  worker_start(&b);
  engage(&a, &b);
  int64_t before = stats().allocation[GCA_STAT_ALL].allocated;
  a.size = 4096;
  a.on = a.stream;
  a.pairs = 0;
  cmd_post(&a, CMD_PAIRS);
  for (int i = 0; i < 2000; i++) {
    /* the gate: enough pairs since the last fold for the cache to turn quiet */
    for (long last = atomic_load(&a.pairs_done); atomic_load(&a.pairs_done) < last + 9;)
      sched_yield();
    gca_stats_t s = stats();
    int64_t n = s.allocation[GCA_STAT_ALL].current;
    assert_true(n == 0 || n == 1);
    assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 4096 * n);
    assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 4096 * n);
    assert_int_equal(s.active_bytes[GCA_STAT_ALL].current, 4096 * n);
    assert_int_equal(s.allocation[GCA_STAT_ALL].peak, 1);
    for (int k = 0; k < GCA_STAT_TYPES; k++) {
      assert_int_equal(s.allocation[k].allocated - s.allocation[k].freed, s.allocation[k].current);
      assert_int_equal(s.allocated_bytes[k].allocated - s.allocated_bytes[k].freed,
                       s.allocated_bytes[k].current);
    }
  }
  atomic_store(&a.stop, true);
  assert_ok(cmd_wait(&a));
  gca__tc_calm_limit = saved;
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].allocated - before, atomic_load(&a.pairs_done));
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  check();
  worker_exit(&a);
  worker_exit(&b);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
}

/* Note [Biased device lock]: the test's thread, using the device alone,
 * gets its lock biased to it; a worker's first request revokes the bias
 * (counted in num_lock_revocations), and both threads' pairs go on with the
 * statistics exact. Without membarrier nothing is biased or counted. */
static void a_second_thread_revokes_the_device_locks_bias(void **state) {
  (void)state;
  bool biasing = gca__mutex_bias_after != UINT32_MAX;
  for (int i = 0; i <= GCA__MUTEX_BIAS_AFTER; i++) {
    void *p = NULL;
    assert_ok(gca_malloc(&p, 4096, NULL));
    assert_ok(gca_free(p));
  }
  gca__devalloc_t *d = gca__devalloc_peek(0); /* made by the first request */
  assert_int_equal(atomic_load(&d->lock.bias), biasing ? gca__lock_tid : GCA__MUTEX_NO_BIAS);
  worker_t a;
  worker_start(&a);
  w_free(&a, w_alloc(&a, 4096, a.stream));
  assert_true(atomic_load(&d->lock.bias) == GCA__MUTEX_NO_BIAS);
  gca_stats_t s = stats();
  assert_int_equal(s.num_lock_revocations, biasing ? 1 : 0);
  assert_int_equal(s.allocation[GCA_STAT_ALL].allocated, GCA__MUTEX_BIAS_AFTER + 2);
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_ok(gca_reset_accumulated_stats(0));
  assert_int_equal(stats().num_lock_revocations, 0);
  check();
  worker_exit(&a);
  assert_ok(gca_stream_destroy(a.stream));
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, alloc_setup, alloc_teardown)
  const struct CMUnitTest tests[] = {
      T(scripted_runs_match_the_model),
      T(free_running_threads_keep_currents_exact),
      T(an_exiting_thread_gives_its_cache_back),
      T(empty_cache_takes_the_thread_caches_blocks),
      T(out_of_memory_takes_another_threads_cache),
      T(thread_cache_false_turns_them_off),
      T(waiters_sleep_on_a_held_cache_lock),
      T(a_cache_that_wastes_its_blocks_is_parked),
      T(a_calm_owner_enters_without_the_lock_until_a_visit),
      T(a_visitor_waits_for_a_quiet_owners_section),
      T(folds_against_sections_read_one_instant),
      T(a_second_thread_revokes_the_device_locks_bias),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
