/* SPDX-License-Identifier: Apache-2.0 */
/* stress.c - gca-stress: threads x streams hammering the caching allocator
 * with random allocations and frees, every live block stamped with its own
 * pattern and checked before it is freed.
 *
 * The one idea: live blocks sit in a table of slots shared by all threads.
 * Each operation picks a random slot; an empty slot gets a new block (stamped
 * on its stream), a full one is taken, checked and freed, so blocks are freed
 * by whichever thread comes next, often not the one that allocated them. A
 * free may first hand the block to another stream (an event join, a slow
 * kernel, the stamp written again there, gca_record_stream): if the allocator
 * reused the block before that stream finished, the late write lands in the
 * next owner's block and that owner's check fails. A corruption, a failed
 * gca_allocator_check, an unexpected error or memory left allocated at the
 * end makes the run fail, printing the seed to reproduce it.
 *
 * With one thread a seed fixes the whole sequence of operations (sizes,
 * streams, slots, cross-stream frees), so the sequence's digest and counts are
 * the same from run to run. So are all the allocator's statistics when no free
 * goes through another stream (--cross-stream-frees 0): otherwise when such a
 * block becomes reusable depends on how far the other stream has run.
 */
#include <getopt.h>
#include <stdarg.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gca.h"
#include "stress_parts.h"
#include "stress_sizes.h"
#include "stress_stamp.h"

#define EXIT_FAILED           1
#define EXIT_USAGE            2
#define CROSS_STREAM_SLEEP_NS 20000u
#define INJECT_GARBAGE        0xdeadbeefu
/* --all: each part every N operations of a thread */
#define ALL_CHURN_EVERY   40
#define ALL_CAPTURE_EVERY 25
#define ALL_IPC_EVERY     15
#define ALL_SUSPEND_EVERY 30
#define ALL_MISC_EVERY    20
#define ALL_TREE_EVERY    35

typedef struct options {
  int threads;
  int streams;
  double seconds; /* > 0: run for this long (ops == 0) */
  uint64_t ops;   /* > 0: this many operations over all threads */
  uint64_t seed;
  const char *sizes_text;
  const char *config;
  uint64_t empty_cache_every; /* per thread; 0 = never */
  uint64_t check_every;       /* per thread; 0 = only at the end */
  double cross_stream_frees;  /* probability that a free goes through another stream */
  const char *faults;
  uint64_t device_memory; /* 0 = the backend's */
  size_t live;            /* slots */
  bool json;
  bool inject_overwrite_after_free;
  /* workload parts, each every N operations of a thread (0 = off; --all turns
   * on those not given) */
  uint64_t churn_every;
  uint64_t capture_every;
  uint64_t ipc_every;
  uint64_t suspend_every;
  uint64_t misc_every;
  uint64_t tree_every;
} options_t;

/* A live block. Owned by exactly one party at a time: the slot table, or the
 * thread that took it out of its slot. */
typedef struct block {
  gca_devptr_t ptr;
  uint64_t size;
  uint64_t id;
  int stream;
  int owner; /* index of the allocating thread */
  bool stamped;
  stress_stamp_t stamp;
} block_t;

typedef struct counters {
  uint64_t ops;
  uint64_t allocs;
  uint64_t alloc_oom;
  uint64_t alloc_injected; /* other failures while faults are injected */
  uint64_t frees;
  uint64_t frees_other_thread;
  uint64_t cross_stream;
  uint64_t free_failed; /* injected: block kept and freed at the end */
  /* injected: the other stream waited for instead */
  uint64_t record_stream_failed;
  uint64_t empty_cache;
  uint64_t empty_cache_failed;
  uint64_t checks;
  uint64_t verified;
  uint64_t unverified;  /* stamp or read-back hit an injected fault */
  uint64_t tool_faults; /* the tool's own device ops hit an injected fault */
  uint64_t bytes_requested;
  uint64_t injected_bugs;
} counters_t;

typedef struct shared shared_t;

typedef struct worker {
  shared_t *sh;
  int index;
  pthread_t thread;
  stress_rng_t rng;
  gca_event_t event;
  uint64_t target_ops;
  counters_t c;
  _Atomic uint64_t progress;
  uint64_t digest;
  block_t **kept; /* blocks whose free failed under injected faults */
  size_t nkept, capkept;
  gca_devptr_t dangling; /* --inject-bug: the last freed pointer */
  uint32_t scratch[STRESS_STAMP_MAX_WORDS];
  stress_part_counters_t pc;
  stress_part_ctx_t parts;
} worker_t;

struct shared {
  options_t opt;
  stress_sizes_t sizes;
  gca_stream_t *streams;
  /* streams[i] is used under stream_locks[i] read-locked and replaced under it
   * write-locked (stream churn). Several are taken in index order. */
  pthread_rwlock_t *stream_locks;
  _Atomic(block_t *) *slots;
  _Atomic uint64_t next_id;
  atomic_bool stop;
  _Atomic int finished;
  pthread_mutex_t fail_lock;
  bool failed; /* under fail_lock */
  char fail_msg[2048];
  worker_t *workers;
};

static void fail(shared_t *sh, const char *fmt, ...) TOOL_PRINTF(2, 3);

/* Records the run's first failure and stops every thread. */
static void fail(shared_t *sh, const char *fmt, ...) {
  pthread_mutex_lock(&sh->fail_lock);
  if (!sh->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->fail_msg, sizeof(sh->fail_msg), fmt, ap);
    va_end(ap);
    sh->failed = true;
  }
  pthread_mutex_unlock(&sh->fail_lock);
  atomic_store(&sh->stop, true);
}

static bool faults_on(const shared_t *sh) {
  return sh->opt.faults != NULL;
}

static void digest_add(worker_t *w, uint64_t a, uint64_t b) {
  w->digest = gca__stress_mix(w->digest ^ a, b);
}

/* A device op of the tool itself failed: tolerated (and counted) only while
 * faults are injected. Returns false when the run must stop. */
static bool tool_op_failed(worker_t *w, const char *what, gca_status_t st) {
  if (faults_on(w->sh)) {
    w->c.tool_faults++;
    return true;
  }
  fail(w->sh, "%s failed: %s: %s", what, gca_status_name(st), gca_last_error());
  return false;
}

static void keep_block(worker_t *w, block_t *b) {
  if (w->nkept == w->capkept) {
    size_t ncap = w->capkept ? w->capkept * 2 : 16;
    block_t **grown = realloc(w->kept, ncap * sizeof(*grown));
    if (!grown) {
      fail(w->sh, "out of host memory keeping %zu blocks", ncap);
      free(b);
      return;
    }
    w->kept = grown;
    w->capkept = ncap;
  }
  w->kept[w->nkept++] = b;
}

/* Read-locks streams a and b (b < 0: none; b == a: once) in index order. */
static void lock_streams(shared_t *sh, int a, int b) {
  int lo = b >= 0 && b < a ? b : a, hi = b >= 0 && b < a ? a : b;
  pthread_rwlock_rdlock(&sh->stream_locks[lo]);
  if (hi >= 0 && hi != lo)
    pthread_rwlock_rdlock(&sh->stream_locks[hi]);
}

static void unlock_streams(shared_t *sh, int a, int b) {
  if (b >= 0 && b != a)
    pthread_rwlock_unlock(&sh->stream_locks[b]);
  pthread_rwlock_unlock(&sh->stream_locks[a]);
}

/* Reads the block's stamp back and compares; a mismatch fails the run. */
static bool verify_block(worker_t *w, const block_t *b) {
  shared_t *sh = w->sh;
  if (!b->stamped) {
    w->c.unverified++;
    return true;
  }
  gca_status_t st = gca__stress_stamp_read(b->ptr, &b->stamp, w->scratch, sh->streams[b->stream]);
  if (st != GCA_OK) {
    w->c.unverified++;
    return tool_op_failed(w, "reading a block's stamp back", st);
  }
  stress_mismatch_t mm;
  if (!gca__stress_stamp_check(&b->stamp, w->scratch, &mm)) {
    fail(sh,
         "CORRUPTION in block #%" PRIu64 " at 0x%" PRIx64 " (size %" PRIu64
         ", stream %d, allocated by thread %d): offset %" PRIu64 " (address 0x%" PRIx64
         ") expected 0x%08x found 0x%08x",
         b->id, b->ptr, b->size, b->stream, b->owner, mm.offset, b->ptr + mm.offset, mm.expected,
         mm.found);
    return false;
  }
  w->c.verified++;
  return true;
}

/* Hands the block to stream s2 before its free: s2 waits for the block's
 * stream, sleeps, then writes the block's stamp again; record_stream makes the
 * allocator wait for all of that before reusing the block. */
static bool cross_stream_use(worker_t *w, block_t *b, int s2) {
  shared_t *sh = w->sh;
  gca_stream_t from = sh->streams[b->stream], to = sh->streams[s2];
  gca_status_t st;
  if ((st = gca_event_record(w->event, from)) != GCA_OK ||
      (st = gca_stream_wait_event(to, w->event)) != GCA_OK ||
      (st = gca_kernel_sleep(CROSS_STREAM_SLEEP_NS, to)) != GCA_OK ||
      (b->stamped && (st = gca__stress_stamp_write(b->ptr, &b->stamp, 0, 1, to)) != GCA_OK))
    return tool_op_failed(w, "cross-stream use", st);
  if ((st = gca_record_stream((void *)(uintptr_t)b->ptr, to)) != GCA_OK) {
    if (!faults_on(sh)) {
      fail(sh, "gca_record_stream(0x%" PRIx64 ", stream %d) failed: %s: %s", b->ptr, s2,
           gca_status_name(st), gca_last_error());
      return false;
    }
    /* The allocator does not know about the write queued on `to`: freed now,
     * the block could go to a new owner before that write lands, which would
     * then read as a corruption of the new owner's block. Wait for the write;
     * when that fails too, keep the block (freed at the end, after all work). */
    w->c.record_stream_failed++;
    if ((st = gca_stream_synchronize(to)) != GCA_OK) {
      w->c.tool_faults++;
      return false;
    }
    return true;
  }
  w->c.cross_stream++;
  return true;
}

/* Checks and frees a block taken out of its slot (cross-stream when drawn). */
static void release_block(worker_t *w, block_t *b, bool allow_cross) {
  shared_t *sh = w->sh;
  bool cross = gca__stress_rng_unit(&w->rng) < sh->opt.cross_stream_frees;
  int s2 = (int)gca__stress_rng_below(&w->rng, (uint64_t)(sh->opt.streams - 1));
  if (s2 >= b->stream)
    s2++;
  digest_add(w, 2, b->size ^ ((uint64_t)cross << 63));
  bool use_cross = allow_cross && cross && sh->opt.streams > 1;
  lock_streams(sh, b->stream, use_cross ? s2 : -1);
  if (!verify_block(w, b) || (use_cross && !cross_stream_use(w, b, s2))) {
    unlock_streams(sh, b->stream, use_cross ? s2 : -1);
    keep_block(w, b);
    return;
  }
  gca_status_t st = gca_free((void *)(uintptr_t)b->ptr);
  unlock_streams(sh, b->stream, use_cross ? s2 : -1);
  if (st != GCA_OK) {
    keep_block(w, b);
    if (faults_on(sh)) {
      w->c.free_failed++;
      return;
    }
    fail(sh, "gca_free(0x%" PRIx64 ") of block #%" PRIu64 " (size %" PRIu64 ") failed: %s: %s",
         b->ptr, b->id, b->size, gca_status_name(st), gca_last_error());
    return;
  }
  w->c.frees++;
  if (b->owner != w->index)
    w->c.frees_other_thread++;
  if (sh->opt.inject_overwrite_after_free)
    w->dangling = b->ptr;
  free(b);
}

/* --inject-bug overwrite-after-free: once a new block covers the last freed
 * pointer with a stamped word, write garbage there through the stale pointer,
 * after the new owner's stamp in stream order. */
static void inject_overwrite_after_free(worker_t *w, const block_t *b) {
  if (!w->dangling || !b->stamped || w->dangling < b->ptr || w->dangling >= b->ptr + b->size ||
      !gca__stress_stamp_covers(&b->stamp, w->dangling - b->ptr))
    return;
  gca_status_t st = gca_kernel_fill_u32((void *)(uintptr_t)(w->dangling & ~(gca_devptr_t)3),
                                        INJECT_GARBAGE, 0, 1, w->sh->streams[b->stream]);
  if (st == GCA_OK)
    w->c.injected_bugs++;
  w->dangling = 0;
}

static void alloc_block(worker_t *w, size_t slot) {
  shared_t *sh = w->sh;
  uint64_t size = gca__stress_sizes_sample(&sh->sizes, &w->rng);
  int s = (int)gca__stress_rng_below(&w->rng, (uint64_t)sh->opt.streams);
  digest_add(w, 1, size ^ ((uint64_t)s << 48) ^ ((uint64_t)slot << 32));
  void *p = NULL;
  lock_streams(sh, s, -1);
  gca_status_t st = gca_malloc(&p, size, sh->streams[s]);
  if (st != GCA_OK) {
    unlock_streams(sh, s, -1);
    if (st == GCA_ERR_OUT_OF_MEMORY)
      w->c.alloc_oom++;
    else if (faults_on(sh))
      w->c.alloc_injected++;
    else
      fail(sh, "gca_malloc(%" PRIu64 " bytes, stream %d) failed: %s: %s", size, s,
           gca_status_name(st), gca_last_error());
    return;
  }
  block_t *b = malloc(sizeof(*b));
  if (!b) {
    gca_free(p);
    unlock_streams(sh, s, -1);
    fail(sh, "out of host memory for a block record");
    return;
  }
  *b = (block_t){.ptr = (gca_devptr_t)(uintptr_t)p,
                 .size = size,
                 .id = atomic_fetch_add(&sh->next_id, 1),
                 .stream = s,
                 .owner = w->index};
  gca__stress_stamp_layout(size, gca__stress_mix(sh->opt.seed, b->id), &b->stamp);
  st = gca__stress_stamp_write(b->ptr, &b->stamp, 0, b->stamp.nregions, sh->streams[s]);
  b->stamped = st == GCA_OK;
  if (st != GCA_OK && !tool_op_failed(w, "stamping a new block", st)) {
    free(b);
    gca_free(p);
    unlock_streams(sh, s, -1);
    return;
  }
  w->c.allocs++;
  w->c.bytes_requested += size;
  if (sh->opt.inject_overwrite_after_free)
    inject_overwrite_after_free(w, b);
  unlock_streams(sh, s, -1);
  block_t *old = atomic_exchange(&sh->slots[slot], b);
  if (old)
    release_block(w, old, false);
}

/* Replaces stream i by a new one. Half the time the old stream is
 * synchronized first; else it is destroyed with its work still queued and the
 * new stream waits for that work through an event. Either way blocks
 * allocated on it, cached on it or recorded on it stay as they are: the
 * allocator must cope with their stream's end. An injected fault keeps the
 * old stream. */
static void churn_stream(worker_t *w) {
  shared_t *sh = w->sh;
  int i = (int)gca__stress_rng_below(&w->rng, (uint64_t)sh->opt.streams);
  bool live = gca__stress_rng_below(&w->rng, 2) == 0;
  gca_stream_t fresh = NULL;
  gca_status_t st;
  const char *what = "gca_stream_create";
  pthread_rwlock_wrlock(&sh->stream_locks[i]);
  gca_stream_t old = sh->streams[i];
  if ((st = gca_stream_create(&fresh, GCA_STREAM_NON_BLOCKING)) != GCA_OK)
    goto failed;
  if (live) {
    what = "chaining a new stream to the one it replaces";
    if ((st = gca_event_record(w->event, old)) != GCA_OK ||
        (st = gca_stream_wait_event(fresh, w->event)) != GCA_OK)
      goto failed;
  } else {
    what = "gca_stream_synchronize before a stream's destruction";
    if ((st = gca_stream_synchronize(old)) != GCA_OK)
      goto failed;
  }
  what = "gca_stream_destroy";
  if ((st = gca_stream_destroy(old)) != GCA_OK)
    goto failed;
  sh->streams[i] = fresh;
  w->pc.churns++;
  w->pc.churns_live += live;
  pthread_rwlock_unlock(&sh->stream_locks[i]);
  return;
failed:
  if (fresh)
    gca_stream_destroy(fresh);
  pthread_rwlock_unlock(&sh->stream_locks[i]);
  if (tool_op_failed(w, what, st))
    w->pc.churn_aborted++;
}

/* Takes a random live block out of its slot, checks it through an IPC import
 * and puts it back. */
static void ipc_episode(worker_t *w) {
  shared_t *sh = w->sh;
  size_t slot = (size_t)gca__stress_rng_below(&w->rng, sh->opt.live);
  block_t *b = atomic_exchange(&sh->slots[slot], NULL);
  if (!b)
    return;
  bool ok = true;
  if (b->stamped) {
    lock_streams(sh, b->stream, -1);
    ok = gca__stress_part_ipc(&w->parts, b->ptr, &b->stamp, sh->streams[b->stream]);
    unlock_streams(sh, b->stream, -1);
  }
  block_t *old = atomic_exchange(&sh->slots[slot], b);
  if (old)
    release_block(w, old, false);
  if (!ok)
    fail(sh, "%s", w->parts.fail);
}

static bool due(const worker_t *w, uint64_t every) {
  return every && w->c.ops % every == 0;
}

static void periodic(worker_t *w) {
  shared_t *sh = w->sh;
  const options_t *o = &sh->opt;
  if (due(w, o->churn_every)) {
    gca__stress_device_sync_begin(); /* Note [Captures and device synchronization] */
    churn_stream(w);
    gca__stress_device_sync_end();
  }
  if (due(w, o->ipc_every))
    ipc_episode(w);
  if ((due(w, o->capture_every) && !gca__stress_part_capture(&w->parts)) ||
      (due(w, o->suspend_every) && !gca__stress_part_suspend(&w->parts)) ||
      (due(w, o->misc_every) &&
       (!gca__stress_part_misc(&w->parts) || !gca__stress_part_host(&w->parts))) ||
      (due(w, o->tree_every) && !gca__stress_part_tree(&w->parts)))
    fail(sh, "%s", w->parts.fail);
  if (sh->opt.empty_cache_every && w->c.ops % sh->opt.empty_cache_every == 0) {
    gca_status_t st = gca_empty_cache();
    w->c.empty_cache++;
    if (st != GCA_OK) {
      if (faults_on(sh))
        w->c.empty_cache_failed++;
      else
        fail(sh, "gca_empty_cache failed: %s: %s", gca_status_name(st), gca_last_error());
    }
  }
  if (sh->opt.check_every && w->c.ops % sh->opt.check_every == 0) {
    w->c.checks++;
    if (gca_allocator_check() != GCA_OK)
      fail(sh, "gca_allocator_check after %" PRIu64 " operations of thread %d: %s", w->c.ops,
           w->index, gca_last_error());
  }
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  shared_t *sh = w->sh;
  while (!atomic_load_explicit(&sh->stop, memory_order_relaxed) &&
         (w->target_ops == 0 || w->c.ops < w->target_ops)) {
    w->c.ops++;
    atomic_store_explicit(&w->progress, w->c.ops, memory_order_relaxed);
    periodic(w);
    size_t slot = (size_t)gca__stress_rng_below(&w->rng, sh->opt.live);
    block_t *b = atomic_exchange(&sh->slots[slot], NULL);
    if (b)
      release_block(w, b, true);
    else
      alloc_block(w, slot);
  }
  atomic_fetch_add(&sh->finished, 1);
  return NULL;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: gca-stress [--threads N] [--streams M] [--seconds S | --ops N] [--seed X]\n"
          "                  [--sizes uniform:MIN:MAX|loguniform:MIN:MAX|trace:FILE.csv]\n"
          "                  [--config STR] [--empty-cache-every N] [--check-every N]\n"
          "                  [--cross-stream-frees P] [--faults SPEC] [--device-memory SIZE]\n"
          "                  [--live N] [--json] [--inject-bug overwrite-after-free]\n"
          "                  [--all] [--stream-churn N] [--capture-every N] [--ipc-every N]\n"
          "                  [--suspend-every N] [--misc-every N] [--tree-every N]\n"
          "\n"
          "Threads x streams allocate and free random sizes through gca; every live block\n"
          "carries a per-block pattern checked before its free. Exit 0: no corruption and\n"
          "the allocator consistent; 1: a failure (the seed is printed); 2: bad usage.\n"
          "\n"
          "  --threads N            worker threads (default 4)\n"
          "  --streams M            streams shared by the threads (default 4)\n"
          "  --seconds S            run for S seconds (default 3)\n"
          "  --ops N                run N operations over all threads instead\n"
          "  --seed X               random seed (default: from the clock; printed)\n"
          "  --sizes DIST           request sizes (default loguniform:256:16MiB)\n"
          "  --config STR           allocator settings, GCA_ALLOC_CONF syntax\n"
          "  --empty-cache-every N  gca_empty_cache every N operations of a thread\n"
          "  --check-every N        gca_allocator_check every N operations of a thread\n"
          "                         (default 1000; always at the end)\n"
          "  --cross-stream-frees P probability that a free first hands the block to another\n"
          "                         stream with gca_record_stream (default 0.1)\n"
          "  --faults SPEC          sim fault injection (GCA_SIM_FAULTS syntax), armed before\n"
          "                         the device is initialized; failed operations are\n"
          "                         counted, not errors\n"
          "  --device-memory SIZE   device capacity (sim) or memory limit (cuda)\n"
          "  --live N               live-block slots shared by the threads (default 256)\n"
          "  --json                 print the report as JSON on stdout\n"
          "  --inject-bug overwrite-after-free\n"
          "                         self-test of the checker: write through a stale pointer\n"
          "                         after its block was reused; the run must fail\n"
          "  --stream-churn N       every N operations a thread destroys a stream and\n"
          "                         creates its replacement, blocks still on the old one\n"
          "  --capture-every N      capture allocations and kernels into a private pool,\n"
          "                         replay and check them (checkpoint and restore too)\n"
          "  --ipc-every N          export a live block, import it, check it through the import\n"
          "  --suspend-every N      suspend and resume a private pool holding stamped blocks\n"
          "                         (needs expandable_segments:True, else counted as refused)\n"
          "  --misc-every N         a round of the rest of the device API (events, memsets,\n"
          "                         host functions, queries, copy batches, the f32 compute\n"
          "                         kernels)\n"
          "  --tree-every N         run a function drawing from the graph-safe RNG through a\n"
          "                         graph tree (warm-up, record, replay, exec update) and\n"
          "                         check each output against the same draws made eagerly\n"
          "  --all                  every part above, at default periods where not given;\n"
          "                         --json then lists the device ops the run reached\n");
}

static bool parse_u64(const char *text, uint64_t *out) {
  char *end;
  if (!text[0] || text[0] == '-')
    return false;
  unsigned long long v = strtoull(text, &end, 0);
  if (*end)
    return false;
  *out = v;
  return true;
}

static int parse_options(int argc, char **argv, options_t *o) {
  enum {
    O_SECONDS = 256,
    O_OPS,
    O_SEED,
    O_SIZES,
    O_CONFIG,
    O_EMPTY,
    O_CHECK,
    O_CROSS,
    O_FAULTS,
    O_DEVMEM,
    O_LIVE,
    O_JSON,
    O_INJECT,
    O_ALL,
    O_CHURN,
    O_CAPTURE,
    O_IPC,
    O_SUSPEND,
    O_MISC,
    O_TREE
  };
  static const struct option longopts[] = {
      {"threads", required_argument, NULL, 't'},
      {"streams", required_argument, NULL, 's'},
      {"seconds", required_argument, NULL, O_SECONDS},
      {"ops", required_argument, NULL, O_OPS},
      {"seed", required_argument, NULL, O_SEED},
      {"sizes", required_argument, NULL, O_SIZES},
      {"config", required_argument, NULL, O_CONFIG},
      {"empty-cache-every", required_argument, NULL, O_EMPTY},
      {"check-every", required_argument, NULL, O_CHECK},
      {"cross-stream-frees", required_argument, NULL, O_CROSS},
      {"faults", required_argument, NULL, O_FAULTS},
      {"device-memory", required_argument, NULL, O_DEVMEM},
      {"live", required_argument, NULL, O_LIVE},
      {"json", no_argument, NULL, O_JSON},
      {"inject-bug", required_argument, NULL, O_INJECT},
      {"all", no_argument, NULL, O_ALL},
      {"stream-churn", required_argument, NULL, O_CHURN},
      {"capture-every", required_argument, NULL, O_CAPTURE},
      {"ipc-every", required_argument, NULL, O_IPC},
      {"suspend-every", required_argument, NULL, O_SUSPEND},
      {"misc-every", required_argument, NULL, O_MISC},
      {"tree-every", required_argument, NULL, O_TREE},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  *o = (options_t){.threads = 4,
                   .streams = 4,
                   .seconds = 3.0,
                   .sizes_text = "loguniform:256:16MiB",
                   .check_every = 1000,
                   .cross_stream_frees = 0.1,
                   .live = 256};
  bool seeded = false, have_seconds = false, all = false;
  unsigned given = 0; /* bit (c - O_CHURN): a part's period was given */
  int c;
  uint64_t v;
  char *end;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "t:s:h", longopts, NULL)) != -1) {
    const char *a = optarg;
    switch (c) {
    case 't':
    case 's':
      if (!parse_u64(a, &v) || v < 1 || v > 1024) {
        fprintf(stderr, "gca-stress: --%s '%s': expected a count in 1..1024\n",
                c == 't' ? "threads" : "streams", a);
        return EXIT_USAGE;
      }
      *(c == 't' ? &o->threads : &o->streams) = (int)v;
      break;
    case O_SECONDS:
      o->seconds = strtod(a, &end);
      if (*end || end == a || !(o->seconds > 0)) {
        fprintf(stderr, "gca-stress: --seconds '%s': expected a positive number\n", a);
        return EXIT_USAGE;
      }
      have_seconds = true;
      break;
    case O_OPS:
    case O_EMPTY:
    case O_CHECK:
    case O_LIVE:
      if (!parse_u64(a, &v) || ((c == O_OPS || c == O_LIVE) && v == 0)) {
        fprintf(stderr, "gca-stress: '%s' is not a valid count for --%s\n", a,
                c == O_OPS     ? "ops"
                : c == O_EMPTY ? "empty-cache-every"
                : c == O_CHECK ? "check-every"
                               : "live");
        return EXIT_USAGE;
      }
      if (c == O_OPS)
        o->ops = v;
      else if (c == O_EMPTY)
        o->empty_cache_every = v;
      else if (c == O_CHECK)
        o->check_every = v;
      else
        o->live = (size_t)v;
      break;
    case O_SEED:
      if (!parse_u64(a, &o->seed)) {
        fprintf(stderr, "gca-stress: --seed '%s': expected an unsigned integer\n", a);
        return EXIT_USAGE;
      }
      seeded = true;
      break;
    case O_SIZES:
      o->sizes_text = a;
      break;
    case O_CONFIG:
      o->config = a;
      break;
    case O_CROSS:
      o->cross_stream_frees = strtod(a, &end);
      if (*end || end == a || o->cross_stream_frees < 0 || o->cross_stream_frees > 1) {
        fprintf(stderr, "gca-stress: --cross-stream-frees '%s': expected a probability in [0, 1]\n",
                a);
        return EXIT_USAGE;
      }
      break;
    case O_FAULTS:
      o->faults = a;
      break;
    case O_DEVMEM:
      if (tool_parse_size(a, &o->device_memory) != GCA_OK) {
        fprintf(stderr, "gca-stress: --device-memory: %s\n", tool_last_error());
        return EXIT_USAGE;
      }
      if (o->device_memory == 0) {
        fprintf(stderr, "gca-stress: --device-memory '%s': expected a size above 0\n", a);
        return EXIT_USAGE;
      }
      break;
    case O_JSON:
      o->json = true;
      break;
    case O_ALL:
      all = true;
      break;
    case O_CHURN:
    case O_CAPTURE:
    case O_IPC:
    case O_SUSPEND:
    case O_MISC:
    case O_TREE: {
      uint64_t *dst = c == O_CHURN     ? &o->churn_every
                      : c == O_CAPTURE ? &o->capture_every
                      : c == O_IPC     ? &o->ipc_every
                      : c == O_SUSPEND ? &o->suspend_every
                      : c == O_MISC    ? &o->misc_every
                                       : &o->tree_every;
      if (!parse_u64(a, dst)) {
        fprintf(stderr, "gca-stress: '%s' is not a valid count for %s\n", a, argv[optind - 1]);
        return EXIT_USAGE;
      }
      given |= 1u << (c - O_CHURN);
      break;
    }
    case O_INJECT:
      if (strcmp(a, "overwrite-after-free") != 0) {
        fprintf(stderr, "gca-stress: --inject-bug '%s': the only bug is overwrite-after-free\n", a);
        return EXIT_USAGE;
      }
      o->inject_overwrite_after_free = true;
      break;
    case 'h':
      usage(stdout);
      exit(0);
    default:
      fprintf(stderr, "gca-stress: unknown or incomplete option '%s'\n", argv[optind - 1]);
      usage(stderr);
      return EXIT_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gca-stress: unexpected argument '%s'\n", argv[optind]);
    return EXIT_USAGE;
  }
  if (o->ops && have_seconds) {
    fprintf(stderr, "gca-stress: --seconds and --ops exclude each other\n");
    return EXIT_USAGE;
  }
  if (o->ops)
    o->seconds = 0;
  if (all) {
    static const uint64_t defaults[] = {ALL_CHURN_EVERY,   ALL_CAPTURE_EVERY, ALL_IPC_EVERY,
                                        ALL_SUSPEND_EVERY, ALL_MISC_EVERY,    ALL_TREE_EVERY};
    uint64_t *periods[] = {&o->churn_every,   &o->capture_every, &o->ipc_every,
                           &o->suspend_every, &o->misc_every,    &o->tree_every};
    for (size_t i = 0; i < TOOL_ARRAY_SIZE(periods); i++)
      if (!(given & (1u << i)))
        *periods[i] = defaults[i];
  }
  if (!seeded)
    o->seed = gca__stress_mix(tool_now_ns(), (uint64_t)getpid());
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t total_progress(shared_t *sh) {
  uint64_t n = 0;
  for (int i = 0; i < sh->opt.threads; i++)
    n += atomic_load_explicit(&sh->workers[i].progress, memory_order_relaxed);
  return n;
}

/* Waits for the workers, stopping them at the deadline; a progress line on
 * stderr when it is a terminal. */
static void supervise(shared_t *sh, double start) {
  bool tty = isatty(STDERR_FILENO);
  double last = start;
  while (atomic_load(&sh->finished) < sh->opt.threads) {
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    double t = now_s();
    if (sh->opt.seconds > 0 && t - start >= sh->opt.seconds)
      atomic_store(&sh->stop, true);
    if (tty && t - last >= 0.5) {
      fprintf(stderr, "\rgca-stress: %.1f s, %" PRIu64 " ops", t - start, total_progress(sh));
      last = t;
    }
  }
  if (tty)
    fprintf(stderr, "\r\033[K");
}

/* Checks and frees everything still live; the allocator must then hold no
 * allocation and, after gca_empty_cache, reserve nothing. */
static void drain(shared_t *sh, worker_t *w0, gca_stats_t *before_empty, gca_stats_t *after) {
  for (size_t i = 0; i < sh->opt.live && !sh->failed; i++) {
    block_t *b = atomic_exchange(&sh->slots[i], NULL);
    if (b)
      release_block(w0, b, false);
  }
  for (int t = 0; t < sh->opt.threads; t++) {
    worker_t *w = &sh->workers[t];
    while (w->nkept > 0 && !sh->failed) {
      block_t *b = w->kept[--w->nkept];
      release_block(w0, b, false);
    }
  }
  for (int t = 0; t < sh->opt.threads && !sh->failed; t++) {
    worker_t *w = &sh->workers[t];
    if (!gca__stress_parts_finish(&w->parts))
      fail(sh, "%s", w->parts.fail);
  }
  if (sh->failed)
    return;
  gca_status_t st = gca_device_synchronize();
  if (st != GCA_OK)
    fail(sh, "ctx_synchronize failed: %s: %s", gca_status_name(st), gca_last_error());
  else if (gca_allocator_check() != GCA_OK)
    fail(sh, "gca_allocator_check at the end: %s", gca_last_error());
  else if ((st = gca_get_stats(0, before_empty)) != GCA_OK || (st = gca_empty_cache()) != GCA_OK ||
           (st = gca_get_stats(0, after)) != GCA_OK)
    fail(sh, "final statistics: %s: %s", gca_status_name(st), gca_last_error());
  else if (after->allocated_bytes[GCA_STAT_ALL].current != 0 ||
           after->allocation[GCA_STAT_ALL].current != 0 ||
           after->reserved_bytes[GCA_STAT_ALL].current != 0)
    fail(sh,
         "leak: after freeing every block and gca_empty_cache the allocator still holds %" PRId64
         " allocations, %" PRId64 " allocated bytes, %" PRId64 " reserved bytes",
         after->allocation[GCA_STAT_ALL].current, after->allocated_bytes[GCA_STAT_ALL].current,
         after->reserved_bytes[GCA_STAT_ALL].current);
}

static void add_counters(counters_t *sum, const counters_t *c) {
  const uint64_t *src = (const uint64_t *)c;
  uint64_t *dst = (uint64_t *)sum;
  for (size_t i = 0; i < sizeof(*c) / sizeof(uint64_t); i++)
    dst[i] += src[i];
}

static const char *const part_counter_names[] = {
    "churns",
    "churns_live",
    "churn_aborted",
    "captures",
    "capture_aborted",
    "replays_checked",
    "restores_checked",
    "ipc_checked",
    "ipc_not_supported",
    "ipc_fabric_checked",
    "ipc_fabric_not_supported",
    "ipc_aborted",
    "ipc_close_dropped",
    "suspends_checked",
    "suspend_refused",
    "suspend_aborted",
    "misc_rounds",
    "misc_aborted",
    "tree_rounds",
    "tree_steps_checked",
    "tree_updates",
    "tree_aborted",
    "deferred_frees",
    "host_rounds",
    "host_aborted",
    "host_not_supported",
};
_Static_assert(sizeof(part_counter_names) / sizeof(part_counter_names[0]) ==
                   sizeof(stress_part_counters_t) / sizeof(uint64_t),
               "a name per part counter");

/* The parts' counters and, per device op of the sim, its calls over the run
 * (failed ones included): "ops_reached" counts the ops called at least once. */
static void report_parts_json(const stress_part_counters_t *pc) {
  const uint64_t *v = (const uint64_t *)pc;
  printf(",\n \"parts\": {");
  for (size_t i = 0; i < TOOL_ARRAY_SIZE(part_counter_names); i++)
    printf("%s\"%s\": %" PRIu64, i ? ", " : "", part_counter_names[i], v[i]);
  int total = gca_sim_op_count(), reached = 0;
  printf("},\n \"op_calls\": {");
  for (int i = 0; i < total; i++) {
    int64_t n = gca_sim_call_count(gca_sim_op_name(i));
    reached += n > 0;
    printf("%s\"%s\": %" PRId64, i ? ", " : "", gca_sim_op_name(i), n);
  }
  printf("},\n \"ops_unreached\": [");
  for (int i = 0, k = 0; i < total; i++)
    if (gca_sim_call_count(gca_sim_op_name(i)) <= 0)
      printf("%s\"%s\"", k++ ? ", " : "", gca_sim_op_name(i));
  printf("], \"ops_reached\": %d, \"ops_total\": %d", reached, total);
}

static void report(shared_t *sh, const counters_t *c, const stress_part_counters_t *pc,
                   uint64_t digest, double elapsed, const gca_stats_t *st,
                   const gca_stats_t *after) {
  const options_t *o = &sh->opt;
  const gca_stat_t *ab = &st->allocated_bytes[GCA_STAT_ALL];
  const gca_stat_t *rb = &st->reserved_bytes[GCA_STAT_ALL];
  if (o->json) {
    printf("{\"ok\": %s, \"seed\": %" PRIu64 ", \"backend\": \"%s\", \"threads\": %d, "
           "\"streams\": %d, \"seconds\": %.3f, \"digest\": \"0x%016" PRIx64 "\",\n",
           sh->failed ? "false" : "true", o->seed, gca_device_backend_name(), o->threads,
           o->streams, elapsed, digest);
    printf(" \"ops\": %" PRIu64 ", \"allocs\": %" PRIu64 ", \"alloc_failures_oom\": %" PRIu64
           ", \"alloc_failures_injected\": %" PRIu64 ", \"frees\": %" PRIu64
           ", \"frees_by_other_thread\": %" PRIu64 ", \"cross_stream_frees\": %" PRIu64
           ", \"free_failures_injected\": %" PRIu64
           ", \"record_stream_failures_injected\": %" PRIu64 ",\n",
           c->ops, c->allocs, c->alloc_oom, c->alloc_injected, c->frees, c->frees_other_thread,
           c->cross_stream, c->free_failed, c->record_stream_failed);
    printf(" \"empty_cache\": %" PRIu64 ", \"empty_cache_failures\": %" PRIu64
           ", \"checks\": %" PRIu64 ", \"verified_blocks\": %" PRIu64
           ", \"unverified_blocks\": %" PRIu64 ", \"tool_op_faults\": %" PRIu64
           ", \"bytes_requested\": %" PRIu64 ", \"injected_bugs\": %" PRIu64 ",\n",
           c->empty_cache, c->empty_cache_failed, c->checks, c->verified, c->unverified,
           c->tool_faults, c->bytes_requested, c->injected_bugs);
    printf(" \"allocator\": {\"allocations\": %" PRId64 ", \"allocated_bytes_total\": %" PRId64
           ", \"allocated_bytes_peak\": %" PRId64 ", \"reserved_bytes_peak\": %" PRId64
           ", \"reserved_bytes_end\": %" PRId64 ", \"num_device_alloc\": %" PRId64
           ", \"num_device_free\": %" PRId64 ", \"num_alloc_retries\": %" PRId64
           ", \"num_ooms\": %" PRId64 "}",
           st->allocation[GCA_STAT_ALL].allocated, ab->allocated, ab->peak, rb->peak,
           after->reserved_bytes[GCA_STAT_ALL].current, after->num_device_alloc,
           after->num_device_free, after->num_alloc_retries, after->num_ooms);
    report_parts_json(pc);
    if (sh->failed) {
      printf(",\n \"error\": \"");
      for (const unsigned char *p = (const unsigned char *)sh->fail_msg; *p; p++) {
        if (*p == '"' || *p == '\\')
          printf("\\%c", *p);
        else if (*p < 0x20)
          printf("\\u%04x", *p);
        else
          putchar(*p);
      }
      printf("\"");
    }
    printf("}\n");
    return;
  }
  char b1[32], b2[32], b3[32];
  printf("gca-stress: %" PRIu64
         " ops in %.2f s on %s (%d threads x %d streams), digest 0x%016" PRIx64 "\n",
         c->ops, elapsed, gca_device_backend_name(), o->threads, o->streams, digest);
  printf("  allocs %" PRIu64 " (%s requested), failed: %" PRIu64 " out of memory, %" PRIu64
         " injected\n",
         c->allocs, tool_format_size(c->bytes_requested, b1, sizeof(b1)), c->alloc_oom,
         c->alloc_injected);
  printf("  frees %" PRIu64 " (%" PRIu64 " by another thread, %" PRIu64
         " through another stream, %" PRIu64 " failed by injection)\n",
         c->frees, c->frees_other_thread, c->cross_stream, c->free_failed);
  printf("  empty_cache %" PRIu64 " (%" PRIu64 " failed), allocator checks %" PRIu64
         ", blocks verified %" PRIu64 " (%" PRIu64 " not verifiable), tool op faults %" PRIu64 "\n",
         c->empty_cache, c->empty_cache_failed, c->checks + (sh->failed ? 0 : 1), c->verified,
         c->unverified, c->tool_faults);
  printf("  allocator%s: %" PRId64 " allocations, allocated peak %s, reserved peak %s, "
         "device allocs %" PRId64 " / frees %" PRId64 ", retries %" PRId64 ", ooms %" PRId64
         ", reserved %s %s\n",
         sh->failed ? " (at the failure)" : "", st->allocation[GCA_STAT_ALL].allocated,
         tool_format_size((uint64_t)ab->peak, b2, sizeof(b2)),
         tool_format_size((uint64_t)rb->peak, b3, sizeof(b3)), after->num_device_alloc,
         after->num_device_free, after->num_alloc_retries, after->num_ooms,
         sh->failed ? "now" : "at the end",
         tool_format_size((uint64_t)after->reserved_bytes[GCA_STAT_ALL].current, b1, sizeof(b1)));
  if (pc->churns + pc->captures + pc->ipc_checked + pc->suspends_checked + pc->misc_rounds +
          pc->suspend_refused + pc->ipc_not_supported + pc->tree_rounds >
      0)
    printf("  streams churned %" PRIu64 " (%" PRIu64 " with work queued), captures %" PRIu64
           " (replays checked %" PRIu64 ", restores %" PRIu64 "), ipc checks %" PRIu64 " (%" PRIu64
           " not exportable), suspends %" PRIu64 " (%" PRIu64 " refused), misc rounds %" PRIu64
           ", graph trees %" PRIu64 " (%" PRIu64 " steps checked, %" PRIu64 " updates)\n",
           pc->churns, pc->churns_live, pc->captures, pc->replays_checked, pc->restores_checked,
           pc->ipc_checked, pc->ipc_not_supported, pc->suspends_checked, pc->suspend_refused,
           pc->misc_rounds, pc->tree_rounds, pc->tree_steps_checked, pc->tree_updates);
  if (!sh->failed)
    printf("gca-stress: ok\n");
}

/* Creates a stream or an event, retrying while faults are injected. */
static gca_status_t create_retrying(const shared_t *sh, gca_stream_t *stream, gca_event_t *event) {
  gca_status_t st = GCA_OK;
  for (int i = 0; i < (faults_on(sh) ? 3 : 1); i++) {
    st = stream ? gca_stream_create(stream, GCA_STREAM_NON_BLOCKING)
                : gca_event_create(event, GCA_EVENT_DISABLE_TIMING);
    if (st == GCA_OK)
      break;
  }
  return st;
}

/* Note [Faults from the start]: --faults is armed before the device layer is
 * initialized, so that a sweep over every op and every nth call reaches the
 * calls made while setting up (init, the first stream, ...). A failed setup
 * step is retried while faults are injected; the device's init is not
 * (its first result is final): it ends the run with exit 1 and the detail. */
static int setup(shared_t *sh) {
  gca_status_t st;
  if (sh->opt.faults && (st = gca_sim_fault_set(sh->opt.faults)) != GCA_OK) {
    fprintf(stderr, "gca-stress: --faults: %s\n", gca_last_error());
    return EXIT_USAGE;
  }
  if ((st = gca_device_init()) != GCA_OK) {
    fprintf(stderr, "gca-stress: device init failed: %s: %s\n", gca_status_name(st),
            gca_last_error());
    return EXIT_FAILED;
  }
  bool sim = strcmp(gca_device_backend_name(), "sim") == 0;
  if (sh->opt.device_memory) {
    st = sim ? gca_sim_set_capacity(0, sh->opt.device_memory)
             : gca_set_memory_limit(0, sh->opt.device_memory);
    if (st != GCA_OK) {
      fprintf(stderr, "gca-stress: --device-memory: %s\n", gca_last_error());
      return EXIT_USAGE;
    }
  }
  if (sh->opt.config && (st = gca_set_config(sh->opt.config)) != GCA_OK) {
    fprintf(stderr, "gca-stress: --config: %s\n", gca_last_error());
    return EXIT_USAGE;
  }
  if ((st = gca__stress_sizes_parse(sh->opt.sizes_text, &sh->sizes)) != GCA_OK) {
    fprintf(stderr, "gca-stress: --%s\n", tool_last_error());
    return EXIT_USAGE;
  }
  sh->streams = calloc((size_t)sh->opt.streams, sizeof(*sh->streams));
  sh->stream_locks = calloc((size_t)sh->opt.streams, sizeof(*sh->stream_locks));
  sh->slots = calloc(sh->opt.live, sizeof(*sh->slots));
  sh->workers = calloc((size_t)sh->opt.threads, sizeof(*sh->workers));
  if (!sh->streams || !sh->stream_locks || !sh->slots || !sh->workers) {
    fprintf(stderr, "gca-stress: out of host memory\n");
    return EXIT_FAILED;
  }
  for (int i = 0; i < sh->opt.streams; i++) {
    pthread_rwlock_init(&sh->stream_locks[i], NULL);
    if ((st = create_retrying(sh, &sh->streams[i], NULL)) != GCA_OK) {
      fprintf(stderr, "gca-stress: stream_create: %s\n", gca_last_error());
      return EXIT_FAILED;
    }
  }
  for (int i = 0; i < sh->opt.threads; i++) {
    worker_t *w = &sh->workers[i];
    w->sh = sh;
    w->index = i;
    w->rng.state = gca__stress_mix(sh->opt.seed, 1000 + (uint64_t)i);
    w->digest = 0;
    if (sh->opt.ops)
      w->target_ops = sh->opt.ops / (uint64_t)sh->opt.threads +
                      ((uint64_t)i < sh->opt.ops % (uint64_t)sh->opt.threads ? 1 : 0);
    w->parts = (stress_part_ctx_t){.key = gca__stress_mix(sh->opt.seed, 2000 + (uint64_t)i),
                                   .faults = faults_on(sh),
                                   .rng = &w->rng,
                                   .c = &w->pc,
                                   .scratch = w->scratch};
    if ((st = create_retrying(sh, &w->parts.stream, NULL)) != GCA_OK) {
      fprintf(stderr, "gca-stress: stream_create: %s\n", gca_last_error());
      return EXIT_FAILED;
    }
    if ((st = create_retrying(sh, NULL, &w->event)) != GCA_OK) {
      fprintf(stderr, "gca-stress: event_create: %s\n", gca_last_error());
      return EXIT_FAILED;
    }
  }
  return 0;
}

/* Releases the host side: block records still held (after a failure their
 * device memory is left to the process's exit), events, streams. */
static void teardown(shared_t *sh) {
  for (size_t i = 0; sh->slots && i < sh->opt.live; i++)
    free(atomic_exchange(&sh->slots[i], NULL));
  if (sh->workers) {
    for (int i = 0; i < sh->opt.threads; i++) {
      worker_t *w = &sh->workers[i];
      if (w->event)
        gca_event_destroy(w->event);
      if (w->parts.stream)
        gca_stream_destroy(w->parts.stream);
      for (size_t j = 0; j < w->nkept; j++)
        free(w->kept[j]);
      free(w->kept);
      free(w->parts.deferred);
      free(w->parts.unclosed);
    }
  }
  if (sh->streams) {
    for (int i = 0; i < sh->opt.streams; i++)
      if (sh->streams[i])
        gca_stream_destroy(sh->streams[i]);
  }
  if (sh->stream_locks) {
    for (int i = 0; i < sh->opt.streams; i++)
      pthread_rwlock_destroy(&sh->stream_locks[i]);
    free(sh->stream_locks);
  }
  free(sh->workers);
  free(sh->slots);
  free(sh->streams);
  gca__stress_sizes_free(&sh->sizes);
  pthread_mutex_destroy(&sh->fail_lock);
}

int main(int argc, char **argv) {
  static shared_t sh;
  int rc = parse_options(argc, argv, &sh.opt);
  if (rc != 0)
    return rc;
  pthread_mutex_init(&sh.fail_lock, NULL);
  FILE *info = sh.opt.json ? stderr : stdout;
  fprintf(info, "gca-stress: seed %" PRIu64 "\n", sh.opt.seed);
  fflush(info);
  if ((rc = setup(&sh)) != 0) {
    teardown(&sh);
    return rc;
  }
  double start = now_s();
  int started = 0;
  for (; started < sh.opt.threads; started++) {
    if (pthread_create(&sh.workers[started].thread, NULL, worker_main, &sh.workers[started]) != 0) {
      fail(&sh, "cannot start thread %d", started);
      atomic_fetch_add(&sh.finished, sh.opt.threads - started);
      break;
    }
  }
  supervise(&sh, start);
  for (int i = 0; i < started; i++)
    pthread_join(sh.workers[i].thread, NULL);
  double elapsed = now_s() - start;
  if (sh.opt.faults) {
    gca_sim_fault_clear();
    sh.opt.faults = NULL;
  }

  counters_t sum = {0};
  stress_part_counters_t psum = {0};
  uint64_t digest = 0;
  for (int i = 0; i < sh.opt.threads; i++) {
    add_counters(&sum, &sh.workers[i].c);
    for (size_t k = 0; k < sizeof(psum) / sizeof(uint64_t); k++)
      ((uint64_t *)&psum)[k] += ((const uint64_t *)&sh.workers[i].pc)[k];
    digest ^= sh.workers[i].digest;
  }
  gca_stats_t before = {0}, after = {0};
  if (!sh.failed) {
    static worker_t fin;
    fin.sh = &sh;
    fin.index = -1;
    drain(&sh, &fin, &before, &after);
    sum.verified += fin.c.verified;
    sum.unverified += fin.c.unverified;
    sum.frees += fin.c.frees;
    for (size_t j = 0; j < fin.nkept; j++)
      free(fin.kept[j]);
    free(fin.kept);
  }
  if (sh.failed && gca_get_stats(0, &before) == GCA_OK)
    after = before;
  report(&sh, &sum, &psum, digest, elapsed, &before, &after);
  if (sh.failed) {
    fprintf(stderr, "gca-stress: FAILED (seed %" PRIu64 "): %s\n", sh.opt.seed, sh.fail_msg);
    fprintf(stderr,
            "gca-stress: reproduce with --seed %" PRIu64 " (one thread: --threads 1 --ops N)\n",
            sh.opt.seed);
  }
  fflush(stdout);
  teardown(&sh);
  return sh.failed ? EXIT_FAILED : 0;
}
