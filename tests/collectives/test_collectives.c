/* SPDX-License-Identifier: Apache-2.0 */
/* test_collectives.c - sim communicators with ranks as threads' streams:
 * every collective, dtype and reduce op gives the exact expected result on 2,
 * 4 and 8 ranks (in-place forms too) against a reference computed here by
 * other means (the compiler's _Float16, a nearest-candidate bf16 rounding);
 * a collective captured into a graph replays 100 times like eager runs; a
 * rank whose peers never issue its collective, a sequence that differs
 * between ranks and an abort end in errors naming the collective, never in a
 * hang; bad input is a clear status; nothing leaks. */
#include <math.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_ref.h"
#include "support.h"

#define MAXR 8
#define CNT  37 /* elements per rank block: not a multiple of anything */

typedef struct rig {
  int n;
  gca_comm_t *comm[MAXR];
  gca_stream_t s[MAXR];
  void *send[MAXR], *recv[MAXR];
} rig_t;

static void rig_init(rig_t *r, int n, double timeout_s) {
  memset(r, 0, sizeof(*r));
  r->n = n;
  int devs[MAXR] = {0};
  for (int i = 0; i < n; i++)
    devs[i] = i;
  gca_comm_options_t o = GCA_COMM_OPTIONS_INIT;
  o.timeout_s = timeout_s;
  assert_ok(gca_comm_create_all(n, devs, &o, r->comm));
  for (int i = 0; i < n; i++) {
    assert_ok(gca_set_device(i));
    assert_ok(gca_stream_create(&r->s[i], GCA_STREAM_NON_BLOCKING));
    /* room for the largest case: n blocks of CNT 8-byte elements */
    assert_ok(gca_malloc_device(i, &r->send[i], (size_t)n * CNT * 8, r->s[i]));
    assert_ok(gca_malloc_device(i, &r->recv[i], (size_t)n * CNT * 8, r->s[i]));
  }
}

static void rig_sync(rig_t *r) {
  for (int i = 0; i < r->n; i++)
    assert_ok(gca_stream_synchronize(r->s[i]));
}

static void rig_fini(rig_t *r) {
  rig_sync(r);
  for (int i = 0; i < r->n; i++) {
    if (r->comm[i])
      assert_ok(gca_comm_destroy(r->comm[i]));
    assert_ok(gca_free(r->send[i]));
    assert_ok(gca_free(r->recv[i]));
    assert_ok(gca_stream_destroy(r->s[i]));
  }
  assert_ok(gca_set_device(0));
}

/* ---- every collective, dtype and op ---- */

typedef enum { AG, RS, AR } kind_t;

static void run_case(rig_t *r, kind_t k, gca_dtype_t t, gca_reduce_op_t op, bool inplace) {
  int n = r->n;
  size_t es = gca_dtype_size(t), in_n = k == RS ? (size_t)n * CNT : CNT,
         out_n = k == AG ? (size_t)n * CNT : CNT;
  unsigned char *host = malloc((size_t)n * CNT * 8), *want = malloc((size_t)n * CNT * 8);
  assert_true(host && want);
  for (int i = 0; i < n; i++) {
    for (size_t e = 0; e < in_n; e++)
      store(t, host, e, value(t, i, e, op));
    /* the input's place: its own buffer, or inside recv for the in-place forms */
    void *in = r->send[i];
    if (inplace)
      in = k == AG ? (char *)r->recv[i] + (size_t)i * CNT * es : r->recv[i];
    assert_ok(gca_set_device(i));
    assert_ok(gca_memcpy(in, host, in_n * es));
  }
  for (int i = 0; i < n; i++) {
    void *recv = r->recv[i];
    const void *send = r->send[i];
    if (inplace)
      send = k == AG ? (char *)recv + (size_t)i * CNT * es : recv;
    if (k == RS && inplace) { /* recv = send + rank * recvcount */
      send = r->recv[i];
      recv = (char *)r->recv[i] + (size_t)i * CNT * es;
    }
    gca_status_t st = k == AG   ? gca_all_gather(send, recv, CNT, t, r->comm[i], r->s[i])
                      : k == RS ? gca_reduce_scatter(send, recv, CNT, t, op, r->comm[i], r->s[i])
                                : gca_all_reduce(send, recv, CNT, t, op, r->comm[i], r->s[i]);
    assert_ok(st);
  }
  rig_sync(r);
  for (int i = 0; i < n; i++) {
    assert_ok(gca_comm_async_error(r->comm[i]));
    void *out = k == RS && inplace ? (char *)r->recv[i] + (size_t)i * CNT * es : r->recv[i];
    assert_ok(gca_set_device(i));
    assert_ok(gca_memcpy(host, out, out_n * es));
    for (size_t e = 0; e < out_n; e++) {
      if (k == AG)
        store(t, want, e, value(t, (int)(e / CNT), e % CNT, op));
      else
        expect_reduced(t, op, n, k == RS ? (size_t)i * CNT + e : e, want, e);
    }
    if (memcmp(host, want, out_n * es) != 0) {
      size_t e = 0;
      while (memcmp(host + e * es, want + e * es, es) == 0)
        e++;
      fail_msg("%d ranks, %s dtype %d op %d%s: rank %d element %zu differs", n,
               k == AG   ? "all_gather"
               : k == RS ? "reduce_scatter"
                         : "all_reduce",
               (int)t, (int)op, inplace ? " in place" : "", i, e);
    }
  }
  free(host);
  free(want);
}

static void every_collective_dtype_and_op_is_exact(void **state) {
  (void)state;
  static const int sizes[] = {2, 4, 8};
  for (size_t z = 0; z < 3; z++) {
    rig_t r;
    rig_init(&r, sizes[z], 30.0);
    for (int t = GCA_DTYPE_F32; t <= GCA_DTYPE_U8; t++)
      for (int inplace = 0; inplace < 2; inplace++) {
        run_case(&r, AG, (gca_dtype_t)t, GCA_REDUCE_SUM, inplace);
        for (int op = GCA_REDUCE_SUM; op <= GCA_REDUCE_AVG; op++) {
          bool floating = t <= GCA_DTYPE_F64;
          if (op == GCA_REDUCE_AVG && !floating)
            continue;
          run_case(&r, RS, (gca_dtype_t)t, (gca_reduce_op_t)op, inplace);
          run_case(&r, AR, (gca_dtype_t)t, (gca_reduce_op_t)op, inplace);
        }
      }
    gca_comm_stats_t st = {.size = sizeof(st)};
    assert_ok(gca_comm_stats(r.comm[0], &st));
    assert_int_equal(st.collectives, st.completed);
    assert_true(st.collectives > 100);
    rig_fini(&r);
  }
}

/* ---- graphs ---- */

static void a_captured_collective_replays_like_eager_runs(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 4, 30.0);
  gca_graph_exec_t x[MAXR];
  for (int i = 0; i < r.n; i++) {
    gca_graph_t g = NULL;
    assert_ok(gca_set_device(i));
    assert_ok(gca_stream_begin_capture(r.s[i], GCA_CAPTURE_MODE_THREAD_LOCAL));
    assert_ok(gca_all_reduce(r.send[i], r.recv[i], CNT, GCA_DTYPE_I32, GCA_REDUCE_SUM, r.comm[i],
                             r.s[i]));
    assert_ok(gca_stream_end_capture(r.s[i], &g));
    assert_ok(gca_graph_instantiate(&x[i], g));
    assert_ok(gca_graph_destroy(g));
  }
  int32_t in[CNT], out[CNT];
  for (int k = 0; k < 100; k++) {
    for (int i = 0; i < r.n; i++) {
      for (int e = 0; e < CNT; e++)
        in[e] = k * 1000 + i * 10 + e;
      assert_ok(gca_set_device(i));
      assert_ok(gca_memcpy(r.send[i], in, sizeof(in)));
    }
    for (int i = 0; i < r.n; i++)
      assert_ok(gca_graph_launch(x[i], r.s[i]));
    rig_sync(&r);
    for (int i = 0; i < r.n; i++) {
      assert_ok(gca_set_device(i));
      assert_ok(gca_memcpy(out, r.recv[i], sizeof(out)));
      for (int e = 0; e < CNT; e++)
        assert_int_equal(out[e], 4 * (k * 1000 + e) + 10 * (0 + 1 + 2 + 3));
    }
  }
  gca_comm_stats_t st = {.size = sizeof(st)};
  assert_ok(gca_comm_stats(r.comm[2], &st));
  assert_int_equal(st.completed, 100);
  for (int i = 0; i < r.n; i++)
    assert_ok(gca_graph_exec_destroy(x[i]));
  rig_fini(&r);
}

/* ---- failures that only the run sees ---- */

static void a_collective_its_peers_never_issue_times_out_naming_it(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 0.2);
  assert_ok(gca_set_device(0));
  assert_ok(gca_memset_d8(r.recv[0], 0x5a, CNT * 4));
  assert_ok(
      gca_all_reduce(r.send[0], r.recv[0], CNT, GCA_DTYPE_F32, GCA_REDUCE_SUM, r.comm[0], r.s[0]));
  assert_ok(gca_stream_synchronize(r.s[0])); /* returns: the wait timed out */
  assert_status(gca_comm_async_error(r.comm[0]), GCA_ERR_INVALID_STATE,
                "all_reduce #0 on rank 0 of 2: all_reduce #0: timed out after 0.2 s waiting for "
                "rank(s) 1");
  unsigned char host[CNT * 4];
  assert_ok(gca_memcpy(host, r.recv[0], sizeof(host)));
  for (size_t i = 0; i < sizeof(host); i++)
    assert_int_equal(host[i], 0x5a); /* no output written */
  /* the late rank's collective fails at once; later calls are refused */
  assert_ok(
      gca_all_reduce(r.send[1], r.recv[1], CNT, GCA_DTYPE_F32, GCA_REDUCE_SUM, r.comm[1], r.s[1]));
  assert_ok(gca_stream_synchronize(r.s[1]));
  assert_status(gca_comm_async_error(r.comm[1]), GCA_ERR_INVALID_STATE, "timed out");
  assert_status(
      gca_all_reduce(r.send[0], r.recv[0], CNT, GCA_DTYPE_F32, GCA_REDUCE_SUM, r.comm[0], r.s[0]),
      GCA_ERR_INVALID_STATE, "failed earlier");
  rig_fini(&r);
}

static void sequences_that_differ_between_ranks_are_reported_on_every_rank(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 30.0);
  assert_ok(
      gca_all_reduce(r.send[0], r.recv[0], CNT, GCA_DTYPE_I32, GCA_REDUCE_SUM, r.comm[0], r.s[0]));
  assert_ok(
      gca_all_reduce(r.send[1], r.recv[1], CNT, GCA_DTYPE_I32, GCA_REDUCE_SUM, r.comm[1], r.s[1]));
  assert_ok(
      gca_all_reduce(r.send[0], r.recv[0], CNT, GCA_DTYPE_I32, GCA_REDUCE_SUM, r.comm[0], r.s[0]));
  assert_ok(gca_all_gather(r.send[1], r.recv[1], CNT, GCA_DTYPE_I32, r.comm[1], r.s[1]));
  rig_sync(&r);
  for (int i = 0; i < 2; i++)
    assert_status(gca_comm_async_error(r.comm[i]), GCA_ERR_INVALID_STATE,
                  "collective #1 differs between ranks (kind): rank 0 issued all_reduce of 37 "
                  "elements");
  gca_comm_stats_t st = {.size = sizeof(st)};
  assert_ok(gca_comm_stats(r.comm[0], &st));
  assert_int_equal(st.completed, 1);
  rig_fini(&r);
}

static void an_abort_wakes_the_peers_waiting_for_the_rank(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 30.0);
  assert_ok(
      gca_all_reduce(r.send[0], r.recv[0], CNT, GCA_DTYPE_F64, GCA_REDUCE_MAX, r.comm[0], r.s[0]));
  assert_ok(gca_comm_abort(r.comm[1]));
  r.comm[1] = NULL;
  assert_ok(gca_stream_synchronize(r.s[0])); /* woken by the abort, well before 30 s */
  assert_status(gca_comm_async_error(r.comm[0]), GCA_ERR_INVALID_STATE,
                "rank 1 aborted the communicator");
  rig_fini(&r);
}

static void a_fault_in_a_collective_fails_every_rank_naming_it(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 4, 30.0);
  for (int i = 0; i < r.n; i++) {
    assert_ok(gca_set_device(i));
    assert_ok(gca_memset_d8(r.recv[i], 0x5a, CNT * 8));
  }
  assert_ok(gca__failpoint_arm("sim_collective", 1)); /* whichever rank runs first */
  for (int i = 0; i < r.n; i++)
    assert_ok(gca_all_reduce(r.send[i], r.recv[i], CNT, GCA_DTYPE_F64, GCA_REDUCE_SUM, r.comm[i],
                             r.s[i]));
  rig_sync(&r); /* every rank ends at once, woken by the failure: no 30 s wait */
  for (int i = 0; i < r.n; i++) {
    assert_status(gca_comm_async_error(r.comm[i]), GCA_ERR_INVALID_STATE, "all_reduce #0 on rank");
    assert_true(strstr(gca_last_error(), "the transport failed on rank") != NULL);
    assert_true(strstr(gca_last_error(), "(injected fault)") != NULL);
    unsigned char host[CNT * 8];
    assert_ok(gca_set_device(i));
    assert_ok(gca_memcpy(host, r.recv[i], sizeof(host)));
    for (size_t e = 0; e < sizeof(host); e++)
      assert_int_equal(host[e], 0x5a); /* no rank wrote output */
  }
  gca__failpoint_clear();
  rig_fini(&r);
}

/* ---- bad input ---- */

static void bad_input_is_a_clear_status(void **state) {
  (void)state;
  gca_comm_id_t id;
  gca_comm_t *c = NULL;
  assert_ok(gca_comm_get_unique_id(&id));
  assert_status(gca_comm_create(&id, 2, 2, 0, NULL, &c), GCA_ERR_INVALID_ARGUMENT,
                "rank 2 is out of range");
  assert_status(gca_comm_create(&id, 0, 0, 0, NULL, &c), GCA_ERR_INVALID_ARGUMENT, "nranks 0");
  assert_status(gca_comm_create(&id, 1, 0, 99, NULL, &c), GCA_ERR_INVALID_ARGUMENT, "device 99");
  gca_comm_options_t o = GCA_COMM_OPTIONS_INIT;
  o.backend = GCA_COMM_BACKEND_NCCL;
  assert_status(gca_comm_create(&id, 1, 0, 0, &o, &c), GCA_ERR_NOT_SUPPORTED, "NCCL");
  o = (gca_comm_options_t)GCA_COMM_OPTIONS_INIT;
  o.timeout_s = 0.05;
  assert_status(gca_comm_create(&id, 2, 0, 0, &o, &c), GCA_ERR_INVALID_STATE,
                "rank(s) 1 did not join");
  assert_null(c);
  rig_t r;
  rig_init(&r, 2, 30.0);
  assert_status(
      gca_all_reduce(r.send[0], r.recv[0], CNT, (gca_dtype_t)42, GCA_REDUCE_SUM, r.comm[0], r.s[0]),
      GCA_ERR_INVALID_ARGUMENT, "unknown dtype 42");
  assert_status(gca_all_reduce(r.send[0], r.recv[0], CNT, GCA_DTYPE_I32, (gca_reduce_op_t)9,
                               r.comm[0], r.s[0]),
                GCA_ERR_INVALID_ARGUMENT, "unknown reduce op 9");
  assert_status(
      gca_all_reduce(r.send[0], r.recv[0], CNT, GCA_DTYPE_I32, GCA_REDUCE_AVG, r.comm[0], r.s[0]),
      GCA_ERR_INVALID_ARGUMENT, "avg needs a floating dtype");
  size_t huge = (size_t)2 * CNT * 8; /* elements: more than the buffers hold */
  assert_status(gca_all_gather(r.send[0], r.recv[0], huge, GCA_DTYPE_U8, r.comm[0], r.s[0]),
                GCA_ERR_INVALID_ARGUMENT, "recv");
  assert_status(
      gca_all_reduce(r.send[1], r.recv[0], CNT, GCA_DTYPE_I32, GCA_REDUCE_SUM, r.comm[0], r.s[0]),
      GCA_ERR_INVALID_ARGUMENT, "is on device 1, the communicator on 0");
  assert_status(
      gca_all_reduce(NULL, r.recv[0], CNT, GCA_DTYPE_I32, GCA_REDUCE_SUM, r.comm[0], r.s[0]),
      GCA_ERR_INVALID_ARGUMENT, "send is NULL");
  assert_status(gca_group_end(), GCA_ERR_INVALID_STATE, "no group_start");
  assert_ok(gca_group_start());
  assert_ok(gca_group_end());
  gca_comm_t *dead = r.comm[1];
  assert_ok(gca_comm_destroy(dead));
  r.comm[1] = NULL;
  assert_status(
      gca_all_reduce(r.send[1], r.recv[1], CNT, GCA_DTYPE_I32, GCA_REDUCE_SUM, dead, r.s[1]),
      GCA_ERR_INVALID_HANDLE, "not a live communicator");
  assert_status(gca_comm_destroy(dead), GCA_ERR_INVALID_HANDLE, "not a live communicator");
  gca_comm_stats_t st = {.size = sizeof(st)};
  assert_ok(gca_comm_stats(r.comm[0], &st));
  assert_int_equal(st.collectives, 0); /* nothing refused was issued */
  rig_fini(&r);
}

/* ---- registration (sim) ---- */

static void registrations_are_counted_and_checked(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 30.0);
  void *h1 = NULL, *h2 = NULL;
  assert_ok(gca_comm_register(r.comm[0], r.send[0], CNT * 8, &h1));
  assert_ok(gca_comm_register(r.comm[0], r.recv[0], CNT * 8, &h2));
  gca_comm_stats_t st = {.size = sizeof(st)};
  assert_ok(gca_comm_stats(r.comm[0], &st));
  assert_int_equal(st.registrations, 2);
  assert_int_equal(st.registrations_total, 2);
  assert_status(gca_comm_deregister(r.comm[1], h1), GCA_ERR_INVALID_HANDLE,
                "not a registration of this communicator");
  assert_status(gca_comm_register(r.comm[0], r.send[1], 64, &h1), GCA_ERR_INVALID_ARGUMENT,
                "is on device 1, the communicator on 0");
  assert_status(gca_comm_register(r.comm[0], r.send[0], (size_t)1 << 40, &h1),
                GCA_ERR_INVALID_ARGUMENT, "too small");
  assert_ok(gca_comm_deregister(r.comm[0], h1));
  assert_ok(gca_comm_deregister(r.comm[0], h2));
  assert_ok(gca_comm_stats(r.comm[0], &st));
  assert_int_equal(st.registrations, 0);
  assert_int_equal(st.deregistrations_total, 2);
  rig_fini(&r);
}

/* ---- the bucketer ---- */

#define NB 7 /* collectives per rank in the bucketed step */

typedef struct step {
  gca_coll_kind_t kind;
  gca_dtype_t dtype;
  gca_reduce_op_t op;
  size_t count;
  int dep; /* index of an earlier collective it depends on, or -1 */
} step_t;

/* Two all-reduces (merged), two all-gathers (merged), two reduce-scatters
 * that would merge but for the second depending on the first, and an
 * all-reduce of another dtype. */
static const step_t steps[NB] = {
    {GCA_COLL_ALL_REDUCE, GCA_DTYPE_F32, GCA_REDUCE_SUM, 37, -1},
    {GCA_COLL_ALL_REDUCE, GCA_DTYPE_F32, GCA_REDUCE_SUM, 50, -1},
    {GCA_COLL_ALL_GATHER, GCA_DTYPE_I32, GCA_REDUCE_SUM, 20, -1},
    {GCA_COLL_ALL_GATHER, GCA_DTYPE_I32, GCA_REDUCE_SUM, 13, -1},
    {GCA_COLL_REDUCE_SCATTER, GCA_DTYPE_I32, GCA_REDUCE_MAX, 11, -1},
    {GCA_COLL_REDUCE_SCATTER, GCA_DTYPE_I32, GCA_REDUCE_MAX, 9, 4},
    {GCA_COLL_ALL_REDUCE, GCA_DTYPE_F64, GCA_REDUCE_SUM, 5, -1},
};

typedef struct brig {
  rig_t r;
  void *in[MAXR][NB], *out[MAXR][NB], *ref[MAXR][NB];
  size_t in_bytes[NB], out_bytes[NB];
  gca_bucketer_t *b[MAXR];
} brig_t;

static void brig_init(brig_t *br, size_t cap) {
  rig_t *r = &br->r;
  rig_init(r, 4, 30.0);
  for (int k = 0; k < NB; k++) {
    size_t es = gca_dtype_size(steps[k].dtype), c = steps[k].count;
    br->in_bytes[k] = es * c * (steps[k].kind == GCA_COLL_REDUCE_SCATTER ? 4 : 1);
    br->out_bytes[k] = es * c * (steps[k].kind == GCA_COLL_ALL_GATHER ? 4 : 1);
  }
  for (int i = 0; i < r->n; i++) {
    assert_ok(gca_set_device(i));
    gca_bucketer_options_t o = GCA_BUCKETER_OPTIONS_INIT;
    o.cap_bytes = cap;
    assert_ok(gca_bucketer_create(&o, &br->b[i]));
    for (int k = 0; k < NB; k++) {
      assert_ok(gca_malloc_device(i, &br->in[i][k], br->in_bytes[k], r->s[i]));
      assert_ok(gca_malloc_device(i, &br->out[i][k], br->out_bytes[k], r->s[i]));
      assert_ok(gca_malloc_device(i, &br->ref[i][k], br->out_bytes[k], r->s[i]));
      unsigned char *h = malloc(br->in_bytes[k]);
      assert_non_null(h);
      for (size_t e = 0; e < br->in_bytes[k]; e++)
        h[e] = (unsigned char)(e * 7 + (size_t)i * 31 + (size_t)k); /* small ints and doubles */
      if (steps[k].dtype == GCA_DTYPE_F32 || steps[k].dtype == GCA_DTYPE_F64)
        for (size_t e = 0; e < steps[k].count; e++)
          store(steps[k].dtype, h, e, (double)(e % 9) * 0.25 + i);
      assert_ok(gca_memcpy(br->in[i][k], h, br->in_bytes[k]));
      free(h);
      size_t dep = steps[k].dep >= 0 ? (size_t)steps[k].dep : 0, idx = 99;
      assert_ok(gca_bucketer_add(br->b[i], r->comm[i], steps[k].kind, br->in[i][k], br->out[i][k],
                                 steps[k].count, steps[k].dtype, steps[k].op,
                                 steps[k].dep >= 0 ? &dep : NULL, steps[k].dep >= 0, &idx));
      assert_int_equal(idx, (size_t)k);
    }
    assert_ok(gca_bucketer_finalize(br->b[i], r->s[i]));
  }
  /* the unbucketed reference */
  for (int i = 0; i < r->n; i++)
    for (int k = 0; k < NB; k++) {
      const step_t *st = &steps[k];
      gca_status_t s = st->kind == GCA_COLL_ALL_GATHER
                           ? gca_all_gather(br->in[i][k], br->ref[i][k], st->count, st->dtype,
                                            r->comm[i], r->s[i])
                       : st->kind == GCA_COLL_REDUCE_SCATTER
                           ? gca_reduce_scatter(br->in[i][k], br->ref[i][k], st->count, st->dtype,
                                                st->op, r->comm[i], r->s[i])
                           : gca_all_reduce(br->in[i][k], br->ref[i][k], st->count, st->dtype,
                                            st->op, r->comm[i], r->s[i]);
      assert_ok(s);
    }
  rig_sync(r);
}

static void brig_expect_outputs(brig_t *br, const char *what) {
  for (int i = 0; i < br->r.n; i++)
    for (int k = 0; k < NB; k++) {
      unsigned char a[4096], b[4096];
      assert_true(br->out_bytes[k] <= sizeof(a));
      assert_ok(gca_set_device(i));
      assert_ok(gca_memcpy(a, br->out[i][k], br->out_bytes[k]));
      assert_ok(gca_memcpy(b, br->ref[i][k], br->out_bytes[k]));
      if (memcmp(a, b, br->out_bytes[k]) != 0)
        fail_msg("%s: rank %d collective %d: bucketed output differs from unbucketed", what, i, k);
    }
}

static void brig_clear_outputs(brig_t *br) {
  for (int i = 0; i < br->r.n; i++)
    for (int k = 0; k < NB; k++) {
      assert_ok(gca_set_device(i));
      assert_ok(gca_memset_d8(br->out[i][k], 0xee, br->out_bytes[k]));
    }
}

static void brig_fini(brig_t *br) {
  rig_sync(&br->r);
  for (int i = 0; i < br->r.n; i++) {
    gca_bucketer_destroy(br->b[i]);
    /* the comm pool's memory went back, deregistered first */
    gca_comm_stats_t st = {.size = sizeof(st)};
    assert_ok(gca_comm_stats(br->r.comm[i], &st));
    assert_int_equal(st.registrations, 0);
    assert_int_equal(st.deregistrations_total, st.registrations_total);
    for (int k = 0; k < NB; k++) {
      assert_ok(gca_free(br->in[i][k]));
      assert_ok(gca_free(br->out[i][k]));
      assert_ok(gca_free(br->ref[i][k]));
    }
  }
  rig_fini(&br->r);
}

static void bucketed_runs_equal_unbucketed_and_keep_their_layout(void **state) {
  (void)state;
  brig_t *br = calloc(1, sizeof(*br));
  assert_non_null(br);
  brig_init(br, (size_t)2000 << 20);
  size_t nb = 0;
  assert_ok(gca_bucketer_bucket_count(br->b[0], &nb));
  assert_int_equal(nb, 5); /* [AR AR] [AG AG] [RS] [RS: depends] [AR f64] */
  size_t bucket[NB], offset[NB];
  void *buffer[NB];
  for (int k = 0; k < NB; k++)
    assert_ok(gca_bucketer_layout(br->b[0], (size_t)k, &bucket[k], &buffer[k], &offset[k]));
  assert_int_equal(bucket[0], bucket[1]);
  assert_int_equal(offset[1], 37);
  assert_int_equal(bucket[2], bucket[3]);
  assert_int_not_equal(bucket[4], bucket[5]); /* the dependency keeps them apart */
  assert_int_not_equal(bucket[5], bucket[6]); /* another key */
  assert_null(buffer[4]);                     /* a bucket of one runs unmerged */
  gca_comm_stats_t st0 = {.size = sizeof(st0)}, st1 = {.size = sizeof(st1)};
  assert_ok(gca_comm_stats(br->r.comm[0], &st0));
  /* the two merged buckets' buffers share one segment of the comm pool: one
   * registration */
  size_t reserved = 0, live = 0;
  assert_ok(gca_bucketer_memory(br->b[0], &reserved, &live));
  assert_int_equal(reserved, (size_t)2 << 20);
  assert_true(live >= (37 + 50) * 4 + (20 + 13) * 4 * 4 && live < reserved);
  assert_int_equal(st0.registrations_total, 1);
  assert_int_equal(st0.registrations, 1);
  for (int it = 0; it < 100; it++) {
    brig_clear_outputs(br);
    for (int i = 0; i < br->r.n; i++)
      assert_ok(gca_bucketer_run(br->b[i], br->r.s[i]));
    rig_sync(&br->r);
    if (it % 25 == 0 || it == 99)
      brig_expect_outputs(br, "eager");
    for (int k = 0; k < NB; k++) {
      size_t bk, off;
      void *buf;
      assert_ok(gca_bucketer_layout(br->b[0], (size_t)k, &bk, &buf, &off));
      assert_true(bk == bucket[k] && buf == buffer[k] && off == offset[k]);
    }
  }
  assert_ok(gca_comm_stats(br->r.comm[0], &st1));
  assert_int_equal(st1.registrations_total, st0.registrations_total); /* none per iteration */
  brig_fini(br);
  free(br);
}

static void a_bucketed_step_replays_from_a_graph_like_eager(void **state) {
  (void)state;
  brig_t *br = calloc(1, sizeof(*br));
  assert_non_null(br);
  brig_init(br, (size_t)2000 << 20);
  gca_graph_exec_t x[MAXR];
  for (int i = 0; i < br->r.n; i++) {
    gca_graph_t g = NULL;
    assert_ok(gca_set_device(i));
    assert_ok(gca_stream_begin_capture(br->r.s[i], GCA_CAPTURE_MODE_THREAD_LOCAL));
    assert_ok(gca_bucketer_run(br->b[i], br->r.s[i]));
    assert_ok(gca_stream_end_capture(br->r.s[i], &g));
    assert_ok(gca_graph_instantiate(&x[i], g));
    assert_ok(gca_graph_destroy(g));
  }
  for (int it = 0; it < 100; it++) {
    brig_clear_outputs(br);
    for (int i = 0; i < br->r.n; i++)
      assert_ok(gca_graph_launch(x[i], br->r.s[i]));
    rig_sync(&br->r);
    if (it % 25 == 0 || it == 99)
      brig_expect_outputs(br, "replay");
  }
  for (int i = 0; i < br->r.n; i++)
    assert_ok(gca_graph_exec_destroy(x[i]));
  brig_fini(br);
  free(br);
}

static void a_small_cap_splits_buckets(void **state) {
  (void)state;
  brig_t *br = calloc(1, sizeof(*br));
  assert_non_null(br);
  brig_init(br, 40 * 4); /* 37 floats fit, 37 + 50 do not; 20 + 13 i32 do */
  size_t nb = 0, b0, b1, o;
  void *p;
  assert_ok(gca_bucketer_bucket_count(br->b[0], &nb));
  assert_int_equal(nb, 6);
  assert_ok(gca_bucketer_layout(br->b[0], 0, &b0, &p, &o));
  assert_ok(gca_bucketer_layout(br->b[0], 1, &b1, &p, &o));
  assert_int_not_equal(b0, b1);
  for (int i = 0; i < br->r.n; i++)
    assert_ok(gca_bucketer_run(br->b[i], br->r.s[i]));
  rig_sync(&br->r);
  brig_expect_outputs(br, "cap 160 bytes");
  size_t dep = 3;
  p = br->in[0][0];
  assert_status(gca_bucketer_add(br->b[0], br->r.comm[0], GCA_COLL_ALL_REDUCE, p, p, 1,
                                 GCA_DTYPE_F32, GCA_REDUCE_SUM, &dep, 1, NULL),
                GCA_ERR_INVALID_STATE, "finalized");
  gca_bucketer_t *b = NULL;
  assert_ok(gca_bucketer_create(NULL, &b));
  assert_status(gca_bucketer_add(b, br->r.comm[0], GCA_COLL_ALL_REDUCE, p, p, 1, GCA_DTYPE_F32,
                                 GCA_REDUCE_SUM, &dep, 1, NULL),
                GCA_ERR_INVALID_ARGUMENT, "depends on 3, which is not an earlier one");
  assert_status(gca_bucketer_run(b, br->r.s[0]), GCA_ERR_INVALID_STATE, "not finalized");
  gca_bucketer_destroy(b);
  brig_fini(br);
  free(br);
}

/* ---- the bucketer's cross-rank check ---- */

typedef struct check_job {
  gca_bucketer_t *b;
  gca_stream_t s;
  int device;
  gca_status_t st;
  char detail[512];
} check_job_t;

/* One rank's check (no assertion here: the test reads what it recorded). */
static void *check_rank(void *arg) {
  check_job_t *j = arg;
  j->st = gca_set_device(j->device);
  if (j->st == GCA_OK)
    j->st = gca_bucketer_check(j->b, j->s);
  snprintf(j->detail, sizeof(j->detail), "%s", gca_last_error());
  return NULL;
}

/* Every rank checks at once; returns how many failed. */
static int check_all(rig_t *r, gca_bucketer_t **b, check_job_t *jobs) {
  pthread_t th[MAXR];
  for (int i = 0; i < r->n; i++) {
    jobs[i] = (check_job_t){.b = b[i], .s = r->s[i], .device = i};
    assert_int_equal(pthread_create(&th[i], NULL, check_rank, &jobs[i]), 0);
  }
  int failed = 0;
  for (int i = 0; i < r->n; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    failed += jobs[i].st != GCA_OK;
  }
  return failed;
}

static void the_layout_check_names_the_first_difference_between_ranks(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 4, 30.0);
  gca_bucketer_t *b[MAXR];
  check_job_t jobs[MAXR];
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < r.n; i++) {
      assert_ok(gca_bucketer_create(NULL, &b[i]));
      for (int k = 0; k < 3; k++) {
        size_t count = (size_t)(10 * (k + 1)) + (pass == 1 && i == 2 && k == 2);
        assert_ok(gca_bucketer_add(b[i], r.comm[i], GCA_COLL_ALL_REDUCE, r.send[i], r.recv[i],
                                   count, GCA_DTYPE_F32, GCA_REDUCE_SUM, NULL, 0, NULL));
      }
      assert_ok(gca_bucketer_finalize(b[i], r.s[i]));
    }
    int failed = check_all(&r, b, jobs);
    if (pass == 0) {
      assert_int_equal(failed, 0);
    } else {
      assert_int_equal(failed, r.n); /* every rank says so */
      for (int i = 0; i < r.n; i++) {
        assert_int_equal(jobs[i].st, GCA_ERR_INVALID_STATE);
        if (!strstr(jobs[i].detail, "differs at collective #2 (count)") ||
            !strstr(jobs[i].detail, i == 2 ? "31 on rank 2" : "rank 2 differs"))
          fail_msg("rank %d: '%s'", i, jobs[i].detail);
      }
    }
    rig_sync(&r);
    for (int i = 0; i < r.n; i++)
      gca_bucketer_destroy(b[i]);
  }
  rig_fini(&r);
}

/* A bucket whose buffer cannot be allocated fails finalize with the status
 * and gives back the buckets already made (buffers and registrations). */
static void a_failed_finalize_gives_back_what_it_made(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 30.0);
  gca_stats_t before;
  assert_ok(gca_get_stats(0, &before));
  gca_bucketer_t *b = NULL;
  gca_bucketer_options_t o = GCA_BUCKETER_OPTIONS_INIT;
  o.cap_bytes = SIZE_MAX; /* the two huge all-gathers share a bucket */
  assert_ok(gca_bucketer_create(&o, &b));
  size_t huge = (size_t)1 << 32; /* a 64 GiB bucket on 2 ranks: beyond the device */
  for (int k = 0; k < 2; k++)
    assert_ok(gca_bucketer_add(b, r.comm[0], GCA_COLL_ALL_REDUCE, r.send[0], r.recv[0], CNT,
                               GCA_DTYPE_F32, GCA_REDUCE_SUM, NULL, 0, NULL));
  for (int k = 0; k < 2; k++)
    assert_ok(gca_bucketer_add(b, r.comm[0], GCA_COLL_ALL_GATHER, r.send[0], r.recv[0], huge,
                               GCA_DTYPE_F32, GCA_REDUCE_SUM, NULL, 0, NULL));
  assert_status(gca_bucketer_finalize(b, r.s[0]), GCA_ERR_OUT_OF_MEMORY, "bucketer_finalize");
  gca_comm_stats_t cs = {.size = sizeof(cs)};
  assert_ok(gca_comm_stats(r.comm[0], &cs));
  assert_int_equal(cs.registrations, 0);
  assert_int_equal(cs.registrations_total, 1); /* the first bucket's segment, deregistered */
  assert_int_equal(cs.deregistrations_total, 1);
  gca_stats_t after;
  assert_ok(gca_get_stats(0, &after));
  assert_int_equal(after.allocated_bytes[GCA_STAT_ALL].current,
                   before.allocated_bytes[GCA_STAT_ALL].current);
  assert_status(gca_bucketer_run(b, r.s[0]), GCA_ERR_INVALID_STATE, "not finalized");
  gca_bucketer_destroy(b);
  /* create_all failing at a later rank gives back the ranks already joined */
  int devs[2] = {0, 99};
  gca_comm_t *c[2] = {NULL, NULL};
  assert_status(gca_comm_create_all(2, devs, NULL, c), GCA_ERR_INVALID_ARGUMENT, "device 99");
  rig_fini(&r);
}

/* ---- comm pools ---- */

typedef struct seg_count {
  int device;
  uint64_t created, released;
} seg_count_t;

static void count_segments(const gca_trace_event_t *ev, void *ctx) {
  seg_count_t *c = ctx;
  if (ev->device != c->device)
    return;
  if (ev->action == GCA_TRACE_SEGMENT_ALLOC || ev->action == GCA_TRACE_SEGMENT_MAP)
    c->created++;
  if (ev->action == GCA_TRACE_SEGMENT_FREE || ev->action == GCA_TRACE_SEGMENT_UNMAP)
    c->released++;
}

static gca_comm_stats_t comm_stats(gca_comm_t *c) {
  gca_comm_stats_t st = {.size = sizeof(st)};
  assert_ok(gca_comm_stats(c, &st));
  return st;
}

/* Allocations of mixed sizes from a comm pool, 100 times over: one
 * registration per physical allocation the allocator makes (counted by the
 * allocator's own trace events), none once the pool's cache serves the
 * step, one deregistration per physical allocation released. */
static void comm_pool_steps(rig_t *r, const char *config) {
  assert_ok(gca_set_config(config));
  gca_pool_t *pool = NULL;
  assert_ok(gca_comm_pool_create(r->comm[0], NULL, &pool));
  seg_count_t sc = {.device = 0};
  gca_trace_observer_handle_t h = 0;
  assert_ok(gca_trace_observer_add(count_segments, &sc, &h));
  gca_comm_stats_t st0 = comm_stats(r->comm[0]);
  static const size_t sizes[] = {512, 3 << 20, 100 << 10, 25 << 20, 1 << 20, 4096, 12 << 20};
  void *p[7];
  uint64_t after_first = 0;
  assert_ok(gca_set_device(0));
  for (int it = 0; it < 100; it++) {
    assert_ok(gca_pool_use_begin(pool));
    for (int k = 0; k < 7; k++)
      assert_ok(gca_malloc(&p[k], sizes[k], r->s[0]));
    assert_ok(gca_pool_use_end(pool));
    /* every block lies in registered memory: one all-reduce over it works */
    assert_ok(gca_all_reduce(p[1], p[1], 16, GCA_DTYPE_F32, GCA_REDUCE_SUM, r->comm[0], r->s[0]));
    assert_ok(gca_all_reduce(r->send[1], r->recv[1], 16, GCA_DTYPE_F32, GCA_REDUCE_SUM, r->comm[1],
                             r->s[1]));
    rig_sync(r);
    for (int k = 0; k < 7; k++)
      assert_ok(gca_free(p[k]));
    gca_comm_stats_t st = comm_stats(r->comm[0]);
    if (it == 0)
      after_first = st.registrations_total;
    assert_int_equal(st.registrations_total - st0.registrations_total, sc.created);
  }
  gca_comm_stats_t st1 = comm_stats(r->comm[0]);
  assert_true(sc.created >= 3); /* small and large segments (or mappings) */
  assert_int_equal(st1.registrations_total, after_first); /* none after the first step */
  assert_int_equal(st1.registrations, sc.created - sc.released);
  assert_ok(gca_pool_release(pool)); /* the pool dies: its memory goes back */
  gca_comm_stats_t st2 = comm_stats(r->comm[0]);
  assert_int_equal(sc.released, sc.created);
  assert_int_equal(st2.registrations, st0.registrations);
  assert_int_equal(st2.deregistrations_total - st0.deregistrations_total, sc.released);
  assert_ok(gca_trace_observer_remove(h));
  assert_ok(gca_set_config("expandable_segments:False"));
}

static void a_comm_pool_registers_each_physical_allocation_once(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 30.0);
  comm_pool_steps(&r, "expandable_segments:False");
  comm_pool_steps(&r, "expandable_segments:True"); /* each mapping is one registration */
  rig_fini(&r);
}

static void a_failed_registration_fails_the_allocation_cleanly(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 30.0);
  gca_pool_t *pool = NULL;
  assert_ok(gca_comm_pool_create(r.comm[0], NULL, &pool));
  assert_ok(gca_set_device(0));
  size_t used = gca_sim_used_bytes(0);
  gca_comm_stats_t st0 = comm_stats(r.comm[0]);
  assert_ok(gca__failpoint_arm("sim_comm_register", 1));
  void *p = NULL;
  assert_ok(gca_pool_use_begin(pool));
  assert_status(gca_malloc(&p, 5 << 20, r.s[0]), GCA_ERR_DRIVER, "segment observer (created 0x");
  assert_true(strstr(gca_last_error(), "the sim refused to register") != NULL);
  assert_null(p);
  assert_int_equal(gca_sim_used_bytes(0), used); /* the segment went back */
  gca_comm_stats_t st1 = comm_stats(r.comm[0]);
  assert_int_equal(st1.registrations_total, st0.registrations_total);
  assert_ok(gca__allocator_check());
  /* the pool still works */
  assert_ok(gca_malloc(&p, 5 << 20, r.s[0]));
  assert_ok(gca_pool_use_end(pool));
  assert_int_equal(comm_stats(r.comm[0]).registrations, st0.registrations + 1);
  assert_ok(gca_free(p));
  /* a pool cannot be suspended under its registrations */
  assert_status(gca_pool_suspend(pool, 0), GCA_ERR_NOT_SUPPORTED, "segment observer");
  /* bad input */
  gca_pool_options_t po = GCA_POOL_OPTIONS_INIT;
  po.observer_done = free;
  gca_pool_t *other = NULL;
  assert_status(gca_comm_pool_create(r.comm[0], &po, &other), GCA_ERR_INVALID_ARGUMENT,
                "observer is its own");
  assert_status(gca_comm_pool_create(NULL, NULL, &other), GCA_ERR_INVALID_ARGUMENT, "NULL");
  assert_ok(gca_pool_release(pool));
  assert_int_equal(comm_stats(r.comm[0]).registrations, st0.registrations);
  rig_fini(&r);
}

static void a_comm_pool_outlives_its_communicator(void **state) {
  (void)state;
  rig_t r;
  rig_init(&r, 2, 30.0);
  gca_pool_t *pool = NULL;
  assert_ok(gca_comm_pool_create(r.comm[0], NULL, &pool));
  assert_ok(gca_set_device(0));
  void *p = NULL, *q = NULL;
  assert_ok(gca_pool_use_begin(pool));
  assert_ok(gca_malloc(&p, 1 << 20, r.s[0]));
  assert_ok(gca_comm_destroy(r.comm[0]));
  r.comm[0] = NULL;
  /* cached memory still serves; new memory cannot be registered */
  assert_ok(gca_malloc(&q, 4096, r.s[0]));
  assert_ok(gca_free(q));
  assert_status(gca_malloc(&q, 64 << 20, r.s[0]), GCA_ERR_INVALID_HANDLE,
                "communicator was destroyed");
  assert_ok(gca_pool_use_end(pool));
  assert_ok(gca_free(p));
  assert_ok(gca_pool_release(pool)); /* its registration died with the communicator */
  rig_fini(&r);
}

/* ---- teardown ---- */

static int teardown(void **state) {
  (void)state;
  assert_ok(gca_empty_cache());
  for (int d = 0; d < MAXR; d++) {
    gca_stats_t s;
    assert_ok(gca_get_stats(d, &s));
    assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
    assert_int_equal(gca_sim_used_bytes(d), 0);
  }
  assert_ok(gca__allocator_check());
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(every_collective_dtype_and_op_is_exact, teardown),
      cmocka_unit_test_teardown(a_captured_collective_replays_like_eager_runs, teardown),
      cmocka_unit_test_teardown(a_collective_its_peers_never_issue_times_out_naming_it, teardown),
      cmocka_unit_test_teardown(sequences_that_differ_between_ranks_are_reported_on_every_rank,
                                teardown),
      cmocka_unit_test_teardown(an_abort_wakes_the_peers_waiting_for_the_rank, teardown),
      cmocka_unit_test_teardown(a_fault_in_a_collective_fails_every_rank_naming_it, teardown),
      cmocka_unit_test_teardown(bad_input_is_a_clear_status, teardown),
      cmocka_unit_test_teardown(registrations_are_counted_and_checked, teardown),
      cmocka_unit_test_teardown(a_failed_finalize_gives_back_what_it_made, teardown),
      cmocka_unit_test_teardown(a_comm_pool_registers_each_physical_allocation_once, teardown),
      cmocka_unit_test_teardown(a_failed_registration_fails_the_allocation_cleanly, teardown),
      cmocka_unit_test_teardown(a_comm_pool_outlives_its_communicator, teardown),
      cmocka_unit_test_teardown(bucketed_runs_equal_unbucketed_and_keep_their_layout, teardown),
      cmocka_unit_test_teardown(a_bucketed_step_replays_from_a_graph_like_eager, teardown),
      cmocka_unit_test_teardown(a_small_cap_splits_buckets, teardown),
      cmocka_unit_test_teardown(the_layout_check_names_the_first_difference_between_ranks,
                                teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
