/* SPDX-License-Identifier: Apache-2.0 */
/* bucket.c - the bucketer: collectives merged into buckets whose flat
 * buffers keep their address and offsets on every rank and every run
 * (Note [Bucket layout]).
 *
 * Note [Bucket layout]: a bucket holds adjacent collectives of one key
 * (communicator, kind, op, dtype); E is the sum of their counts (per-rank
 * elements). Its one buffer is used in place: an all-reduce bucket has E
 * elements, the collective i at offset o_i; an all-gather or reduce-scatter
 * bucket has nranks blocks of E elements (rank r's block at r*E), collective
 * i at o_i in every block. A run copies the inputs into the buffer, runs one
 * collective on it (all-gather: its rank's block is its input; reduce-scatter:
 * its rank's block is its output) and copies the outputs out. Each direction's
 * copies are one kernel (gca_kernel_copy_batch) whose table of {dst, src,
 * bytes} entries is written to device memory at finalize: the layout is
 * fixed, so the table serves every run and every replay of a captured one. Every rank
 * plans from the same sequence, so the layout is the same everywhere; the
 * buffers are allocated once, at finalize, from a comm pool per
 * communicator (Note [Comm pools]), so they lie in registered memory.
 *
 * The one idea: the plan is decided once from the sequence alone, and a run
 * only moves bytes along it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"

typedef struct bcoll {
  gca_comm_t *comm;
  gca_coll_kind_t kind;
  const void *send;
  void *recv;
  size_t count;
  gca_dtype_t dtype;
  gca_reduce_op_t op;
  size_t *deps, ndeps;
  size_t bucket, offset;
} bcoll_t;

typedef struct bucket {
  size_t first, n; /* collectives [first, first + n) */
  size_t elems;    /* E: per-rank elements */
  void *buf;
  void *copy_in, *copy_out; /* tables of gca_copy_entry_t in device memory */
  size_t n_in, n_out;
} bucket_t;

typedef struct bpool {
  gca_comm_t *comm;
  gca_pool_t *pool;
} bpool_t;

struct gca_bucketer {
  gca_bucketer_options_t opts;
  bcoll_t *c;
  size_t n, cap;
  bucket_t *b;
  size_t nb;
  bpool_t *pools; /* one comm pool per communicator with a merged bucket */
  size_t npools;
  bool finalized;
};

/* The comm pool of comm, made on first use. */
static gca_status_t pool_of(gca_bucketer_t *b, gca_comm_t *comm, gca_pool_t **out) {
  for (size_t i = 0; i < b->npools; i++)
    if (b->pools[i].comm == comm) {
      *out = b->pools[i].pool;
      return GCA_OK;
    }
  bpool_t *np = realloc(b->pools, (b->npools + 1) * sizeof(*np));
  if (!np)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory");
  b->pools = np;
  GCA_CHECK(gca_comm_pool_create(comm, NULL, out));
  b->pools[b->npools++] = (bpool_t){comm, *out};
  return GCA_OK;
}

/* Frees the buffers, then releases the pools (their memory goes back). */
static void give_back(gca_bucketer_t *b) {
  for (size_t k = 0; k < b->nb; k++) {
    void *mem[3] = {b->b[k].buf, b->b[k].copy_in, b->b[k].copy_out};
    for (int i = 0; i < 3; i++)
      if (mem[i])
        GCA_CHECK_IGNORE(gca_free(mem[i]));
  }
  for (size_t i = 0; i < b->npools; i++)
    GCA_CHECK_IGNORE(gca_pool_release(b->pools[i].pool));
  free(b->pools);
  b->pools = NULL;
  b->npools = 0;
}

GCA_API gca_status_t gca_bucketer_create(const gca_bucketer_options_t *opts, gca_bucketer_t **out) {
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_create: out is NULL");
  gca_bucketer_options_t o = GCA_BUCKETER_OPTIONS_INIT;
  if (opts) {
    if (opts->size < sizeof(o))
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_create: options' size is not set");
    o = *opts;
  }
  if (o.cap_bytes == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_create: a cap of 0 bytes");
  *out = calloc(1, sizeof(**out));
  if (!*out)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "bucketer_create: no host memory");
  (*out)->opts = o;
  return GCA_OK;
}

GCA_API gca_status_t gca_bucketer_add(gca_bucketer_t *b, gca_comm_t *comm, gca_coll_kind_t kind,
                                      const void *send, void *recv, size_t count, gca_dtype_t dtype,
                                      gca_reduce_op_t op, const size_t *deps, size_t ndeps,
                                      size_t *index) {
  static const char fn[] = "bucketer_add";
  if (!b || !comm)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: bucketer or comm is NULL", fn);
  if (b->finalized)
    return gca__error(GCA_ERR_INVALID_STATE, "%s: the bucketer is finalized", fn);
  if (kind != GCA_COLL_ALL_GATHER && kind != GCA_COLL_REDUCE_SCATTER && kind != GCA_COLL_ALL_REDUCE)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown kind %d", fn, (int)kind);
  if (gca_dtype_size(dtype) == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dtype);
  if (count == 0 || !send || !recv)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: collective %zu has no elements or buffers", fn,
                      b->n);
  if (ndeps && !deps)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: deps is NULL", fn);
  for (size_t i = 0; i < ndeps; i++)
    if (deps[i] >= b->n)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "%s: collective %zu depends on %zu, which is not an earlier one", fn, b->n,
                        deps[i]);
  int nranks = 0;
  GCA_CHECK(gca_comm_count(comm, &nranks));
  if (b->n == b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 16;
    bcoll_t *g = realloc(b->c, nc * sizeof(*g));
    if (!g)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
    b->c = g;
    b->cap = nc;
  }
  bcoll_t *c = &b->c[b->n];
  *c = (bcoll_t){.comm = comm,
                 .kind = kind,
                 .send = send,
                 .recv = recv,
                 .count = count,
                 .dtype = dtype,
                 .op = kind == GCA_COLL_ALL_GATHER ? GCA_REDUCE_SUM : op};
  if (ndeps) {
    c->deps = malloc(ndeps * sizeof(size_t));
    if (!c->deps)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
    memcpy(c->deps, deps, ndeps * sizeof(size_t));
    c->ndeps = ndeps;
  }
  if (index)
    *index = b->n;
  b->n++;
  return GCA_OK;
}

static size_t in_bytes(const bcoll_t *c) {
  return c->count * gca_dtype_size(c->dtype) *
         (c->kind == GCA_COLL_REDUCE_SCATTER ? (size_t)c->comm->nranks : 1);
}

static bool same_key(const bcoll_t *a, const bcoll_t *b) {
  return a->comm == b->comm && a->kind == b->kind && a->dtype == b->dtype && a->op == b->op;
}

/* Note [Bucket layout]: the copies into (in) or out of a merged bucket's
 * buffer, as entries of a copy batch; returns their number (e may be NULL
 * to count). */
static size_t plan_copies(const gca_bucketer_t *b, const bucket_t *bk, bool in,
                          gca_copy_entry_t *e) {
  const bcoll_t *c0 = &b->c[bk->first];
  size_t es = gca_dtype_size(c0->dtype), E = bk->elems, k = 0;
  int n = c0->comm->nranks, rank = c0->comm->rank;
  uint64_t buf = (uint64_t)(uintptr_t)bk->buf;
#define ENTRY(dst_, src_, bytes_)                                              \
  do {                                                                         \
    if (e)                                                                     \
      e[k] = (gca_copy_entry_t){(uint64_t)(dst_), (uint64_t)(src_), (bytes_)}; \
    k++;                                                                       \
  } while (0)
  for (size_t i = bk->first; i < bk->first + bk->n; i++) {
    const bcoll_t *c = &b->c[i];
    size_t cb = c->count * es;
    uint64_t send = (uint64_t)(uintptr_t)c->send, recv = (uint64_t)(uintptr_t)c->recv;
    bool per_rank = in ? c->kind == GCA_COLL_REDUCE_SCATTER : c->kind == GCA_COLL_ALL_GATHER;
    if (per_rank) { /* a block per rank: rank r's at r * E in the buffer */
      for (int r = 0; r < n; r++) {
        uint64_t at = buf + ((uint64_t)r * E + c->offset) * es,
                 user = (in ? send : recv) + (uint64_t)r * cb;
        if (in)
          ENTRY(at, user, cb);
        else
          ENTRY(user, at, cb);
      }
      continue;
    }
    /* all-reduce: offset o; all-gather in, reduce-scatter out: this rank's block */
    uint64_t at =
        buf + (c->kind == GCA_COLL_ALL_REDUCE ? c->offset : (uint64_t)rank * E + c->offset) * es;
    if (in)
      ENTRY(at, send, cb);
    else
      ENTRY(recv, at, cb);
  }
#undef ENTRY
  return k;
}

/* Writes a bucket's copy table for one direction into device memory from
 * the comm pool (the caller routes allocations to it). */
static gca_status_t make_table(const gca_bucketer_t *b, const bucket_t *bk, bool in,
                               gca_stream_t stream, void **table, size_t *n) {
  *n = plan_copies(b, bk, in, NULL);
  gca_copy_entry_t *e = calloc(*n, sizeof(*e));
  if (!e)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for a copy table");
  plan_copies(b, bk, in, e);
  gca_status_t st = gca_malloc_device(b->c[bk->first].comm->device, table, *n * sizeof(*e), stream);
  if (st == GCA_OK)
    st = gca_memcpy(*table, e, *n * sizeof(*e));
  free(e);
  return st;
}

GCA_API gca_status_t gca_bucketer_finalize(gca_bucketer_t *b, gca_stream_t stream) {
  static const char fn[] = "bucketer_finalize";
  if (!b)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: bucketer is NULL", fn);
  if (b->finalized)
    return gca__error(GCA_ERR_INVALID_STATE, "%s: finalized already", fn);
  b->b = calloc(b->n + 1, sizeof(*b->b));
  if (!b->b)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  size_t bytes = 0;
  for (size_t i = 0; i < b->n; i++) {
    bcoll_t *c = &b->c[i];
    bucket_t *cur = b->nb ? &b->b[b->nb - 1] : NULL;
    bool fresh = !cur || !same_key(&b->c[cur->first], c) || bytes + in_bytes(c) > b->opts.cap_bytes;
    for (size_t d = 0; d < c->ndeps && !fresh; d++)
      fresh = c->deps[d] >= cur->first; /* depends on one in this bucket */
    if (fresh) {
      cur = &b->b[b->nb++];
      cur->first = i;
      bytes = 0;
    }
    c->bucket = (size_t)(cur - b->b);
    c->offset = cur->elems;
    cur->elems += c->count;
    cur->n++;
    bytes += in_bytes(c);
  }
  gca_status_t st = GCA_OK;
  for (size_t k = 0; k < b->nb && st == GCA_OK; k++) {
    bucket_t *bk = &b->b[k];
    if (bk->n == 1)
      continue; /* unmerged: runs on the caller's buffers */
    const bcoll_t *c = &b->c[bk->first];
    size_t es = gca_dtype_size(c->dtype);
    size_t elems = c->kind == GCA_COLL_ALL_REDUCE ? bk->elems : bk->elems * (size_t)c->comm->nranks;
    gca_pool_t *pool = NULL;
    st = pool_of(b, c->comm, &pool);
    if (st == GCA_OK)
      st = gca_pool_use_begin(pool);
    if (st == GCA_OK) {
      st = gca_malloc_device(c->comm->device, &bk->buf, elems * es, stream);
      if (st == GCA_OK)
        st = make_table(b, bk, true, stream, &bk->copy_in, &bk->n_in);
      if (st == GCA_OK)
        st = make_table(b, bk, false, stream, &bk->copy_out, &bk->n_out);
      gca_status_t est = gca_pool_use_end(pool);
      if (st == GCA_OK)
        st = est;
    }
  }
  if (st != GCA_OK) {
    char detail[384];
    snprintf(detail, sizeof(detail), "%s", gca_last_error());
    give_back(b);
    free(b->b);
    b->b = NULL;
    b->nb = 0;
    return gca__error(st, "%s: %s", fn, detail);
  }
  b->finalized = true;
  return GCA_OK;
}

/* Note [Bucket layout]: one bucket's copies and collective. */
static gca_status_t run_bucket(const gca_bucketer_t *b, const bucket_t *bk, gca_stream_t s) {
  const bcoll_t *c0 = &b->c[bk->first];
  gca_comm_t *comm = c0->comm;
  size_t es = gca_dtype_size(c0->dtype), E = bk->elems;
  int rank = comm->rank;
  char *buf = bk->buf;
  if (bk->n == 1) {
    switch (c0->kind) {
    case GCA_COLL_ALL_GATHER:
      return gca_all_gather(c0->send, c0->recv, c0->count, c0->dtype, comm, s);
    case GCA_COLL_REDUCE_SCATTER:
      return gca_reduce_scatter(c0->send, c0->recv, c0->count, c0->dtype, c0->op, comm, s);
    default:
      return gca_all_reduce(c0->send, c0->recv, c0->count, c0->dtype, c0->op, comm, s);
    }
  }
  GCA_CHECK(gca_kernel_copy_batch(bk->copy_in, bk->n_in, s));
  switch (c0->kind) {
  case GCA_COLL_ALL_GATHER:
    GCA_CHECK(gca_all_gather(buf + (size_t)rank * E * es, buf, E, c0->dtype, comm, s));
    break;
  case GCA_COLL_REDUCE_SCATTER:
    GCA_CHECK(gca_reduce_scatter(buf, buf + (size_t)rank * E * es, E, c0->dtype, c0->op, comm, s));
    break;
  default:
    GCA_CHECK(gca_all_reduce(buf, buf, E, c0->dtype, c0->op, comm, s));
    break;
  }
  return gca_kernel_copy_batch(bk->copy_out, bk->n_out, s);
}

GCA_API gca_status_t gca_bucketer_run(gca_bucketer_t *b, gca_stream_t stream) {
  if (!b)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_run: bucketer is NULL");
  if (!b->finalized)
    return gca__error(GCA_ERR_INVALID_STATE, "bucketer_run: not finalized");
  for (size_t k = 0; k < b->nb; k++) {
    gca_status_t st = run_bucket(b, &b->b[k], stream);
    if (st != GCA_OK)
      return gca__error_prefix(st, "bucketer_run: bucket %zu", k);
  }
  return GCA_OK;
}

GCA_API gca_status_t gca_bucketer_bucket_count(const gca_bucketer_t *b, size_t *buckets) {
  if (!b || !buckets)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_bucket_count: NULL argument");
  if (!b->finalized)
    return gca__error(GCA_ERR_INVALID_STATE, "bucketer_bucket_count: not finalized");
  *buckets = b->nb;
  return GCA_OK;
}

GCA_API gca_status_t gca_bucketer_layout(const gca_bucketer_t *b, size_t index, size_t *bucket,
                                         void **buffer, size_t *offset) {
  if (!b || !bucket || !buffer || !offset)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_layout: NULL argument");
  if (!b->finalized)
    return gca__error(GCA_ERR_INVALID_STATE, "bucketer_layout: not finalized");
  if (index >= b->n)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_layout: collective %zu of %zu", index,
                      b->n);
  *bucket = b->c[index].bucket;
  *buffer = b->b[*bucket].buf;
  *offset = b->c[index].offset;
  return GCA_OK;
}

GCA_API gca_status_t gca_bucketer_memory(const gca_bucketer_t *b, size_t *reserved, size_t *live) {
  if (!b || !reserved || !live)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_memory: NULL argument");
  if (!b->finalized)
    return gca__error(GCA_ERR_INVALID_STATE, "bucketer_memory: the bucketer is not finalized");
  *reserved = *live = 0;
  for (size_t i = 0; i < b->npools; i++) {
    size_t r = 0, a = 0;
    GCA_CHECK(gca_pool_memory(b->pools[i].pool, &r, &a));
    *reserved += r;
    *live += a;
  }
  return GCA_OK;
}

GCA_API void gca_bucketer_destroy(gca_bucketer_t *b) {
  if (!b)
    return;
  give_back(b);
  for (size_t i = 0; i < b->n; i++)
    free(b->c[i].deps);
  free(b->c);
  free(b->b);
  free(b);
}

/* ---- the cross-rank check ---- */

#define FIELDS 6 /* kind, dtype, op, count, bucket, offset */

static const char *const field_names[FIELDS] = {"kind",  "dtype",  "reduce op",
                                                "count", "bucket", "offset"};

/* Gathers `words` int64 values from every rank of comm into all[n * words]
 * through device memory on the communicator's device. */
static gca_status_t gather_words(gca_comm_t *comm, const int64_t *mine, size_t words, int64_t *all,
                                 gca_stream_t s) {
  size_t n = (size_t)comm->nranks, bytes = words * 8;
  void *send = NULL, *recv = NULL;
  gca_status_t st = gca_malloc_device(comm->device, &send, bytes ? bytes : 8, s);
  if (st == GCA_OK)
    st = gca_malloc_device(comm->device, &recv, (bytes ? bytes : 8) * n, s);
  if (st == GCA_OK)
    st = gca_memcpy_async(send, mine, bytes, s);
  if (st == GCA_OK)
    st = gca_all_gather(send, recv, words, GCA_DTYPE_I64, comm, s);
  if (st == GCA_OK)
    st = gca_memcpy_async(all, recv, bytes * n, s);
  if (st == GCA_OK)
    st = gca_stream_synchronize(s);
  if (st == GCA_OK)
    st = gca_comm_async_error(comm);
  if (send)
    GCA_CHECK_IGNORE(gca_free(send));
  if (recv)
    GCA_CHECK_IGNORE(gca_free(recv));
  return st;
}

static gca_status_t check_comm(const gca_bucketer_t *b, gca_comm_t *comm, gca_stream_t s) {
  static const char fn[] = "bucketer_check";
  size_t n = (size_t)comm->nranks, mine = 0;
  for (size_t i = 0; i < b->n; i++)
    mine += b->c[i].comm == comm;
  int64_t count = (int64_t)mine, *counts = malloc(n * sizeof(int64_t));
  if (!counts)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  gca_status_t st = gather_words(comm, &count, 1, counts, s);
  for (size_t r = 0; r < n && st == GCA_OK; r++)
    if (counts[r] != count)
      st = gca__error(GCA_ERR_INVALID_STATE,
                      "%s: rank %zu has %lld collectives on the communicator, rank %d has %lld", fn,
                      r, (long long)counts[r], comm->rank, (long long)count);
  free(counts);
  if (st != GCA_OK || mine == 0)
    return st;
  int64_t *rec = malloc(mine * FIELDS * sizeof(int64_t));
  int64_t *all = malloc(n * mine * FIELDS * sizeof(int64_t));
  if (!rec || !all) {
    free(rec);
    free(all);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  }
  size_t k = 0;
  size_t *index = malloc(mine * sizeof(size_t));
  for (size_t i = 0; i < b->n && index; i++) {
    const bcoll_t *c = &b->c[i];
    if (c->comm != comm)
      continue;
    int64_t *f = rec + k * FIELDS;
    f[0] = c->kind;
    f[1] = c->dtype;
    f[2] = c->op;
    f[3] = (int64_t)c->count;
    f[4] = (int64_t)c->bucket;
    f[5] = (int64_t)c->offset;
    index[k++] = i;
  }
  st = index ? gather_words(comm, rec, mine * FIELDS, all, s)
             : gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  for (size_t r = 0; r < n && st == GCA_OK; r++)
    for (size_t j = 0; j < mine * FIELDS && st == GCA_OK; j++) {
      int64_t there = all[r * mine * FIELDS + j], here = rec[j];
      if (there != here)
        st = gca__error(GCA_ERR_INVALID_STATE,
                        "%s: rank %zu differs at collective #%zu (%s): %lld there, %lld on rank %d",
                        fn, r, index[j / FIELDS], field_names[j % FIELDS], (long long)there,
                        (long long)here, comm->rank);
    }
  free(index);
  free(rec);
  free(all);
  return st;
}

GCA_API gca_status_t gca_bucketer_check(gca_bucketer_t *b, gca_stream_t stream) {
  if (!b)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bucketer_check: bucketer is NULL");
  if (!b->finalized)
    return gca__error(GCA_ERR_INVALID_STATE, "bucketer_check: not finalized");
  for (size_t i = 0; i < b->n; i++) {
    bool first = true; /* each communicator once, in order of first use */
    for (size_t j = 0; j < i && first; j++)
      first = b->c[j].comm != b->c[i].comm;
    if (first)
      GCA_CHECK(check_comm(b, b->c[i].comm, stream));
  }
  return GCA_OK;
}
