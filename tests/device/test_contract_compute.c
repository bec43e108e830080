/* SPDX-License-Identifier: Apache-2.0 */
/* test_contract_compute.c - the f32 compute kernels of the device table
 * (kernel_gemm_f32, kernel_ew_f32, kernel_dot_f32), written once against the
 * ops and run on sim and on cuda: results close to a double-precision
 * reference, equal bit for bit on a second run and to a host f32 computation
 * in the order Note [Compute order] states, every transpose combination and
 * accumulation, odd shapes and empty ones, aliasing where it is allowed, the
 * dropout mask as a function of the words alone, a captured graph of the
 * kernels replaying what eager launches computed, and refusal of bad
 * arguments with a message naming them.
 *
 * The host references round each product and sum through a volatile, so the
 * test's own compiler cannot contract them into fused multiply-adds.
 */
#include <float.h>
#include <math.h>

#include "gca.h"
#include "support.h"

static const gca_device_ops_t *ops;
static gca_stream_t s;

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  assert_ok(ops->stream_destroy(s));
  return 0;
}

/* ---- helpers ---- */

static gca_devptr_t dalloc(size_t bytes) {
  gca_devptr_t p = 0;
  assert_ok(ops->mem_alloc(0, bytes ? bytes : 4, &p));
  return p;
}

static void dfree(gca_devptr_t p) {
  assert_ok(ops->mem_free(0, p));
}

static void put(gca_devptr_t dst, const void *host, size_t bytes) {
  assert_ok(ops->memcpy_async(dst, (gca_devptr_t)(uintptr_t)host, bytes, s));
  assert_ok(ops->stream_synchronize(s));
}

static void get(void *host, gca_devptr_t src, size_t bytes) {
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)host, src, bytes, s));
  assert_ok(ops->stream_synchronize(s));
}

static float *fmalloc(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  assert_non_null(p);
  return p;
}

static uint32_t rng_state;

static uint32_t next_u32(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return rng_state;
}

/* Uniform in [-1, 1) with 24 significant bits. */
static float next_float(void) {
  return (float)(next_u32() >> 8) / 8388608.0f - 1.0f;
}

static void fill_random(float *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    v[i] = next_float();
}

/* One f32 rounding per operation, never fused. */
static float add_f32(float x, float y) {
  volatile float r = x + y;
  return r;
}

static float sub_f32(float x, float y) {
  volatile float r = x - y;
  return r;
}

static float mul_f32(float x, float y) {
  volatile float r = x * y;
  return r;
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

/* Equal bits, or both NaN (a GPU's NaN payloads are its own). */
static bool same(float x, float y) {
  return bits(x) == bits(y) || (isnan(x) && isnan(y));
}

/* ---- gemm ---- */

typedef struct shape {
  uint32_t m, n, k;
} shape_t;

static float op_a(const float *a, const shape_t *sh, bool ta, uint32_t i, uint32_t p) {
  return ta ? a[(size_t)p * sh->m + i] : a[(size_t)i * sh->k + p];
}

static float op_b(const float *b, const shape_t *sh, bool tb, uint32_t p, uint32_t j) {
  return tb ? b[(size_t)j * sh->k + p] : b[(size_t)p * sh->n + j];
}

/* Runs C = op(A) . op(B) (+ C0) twice on the device and checks both runs
 * against each other, the ordered f32 sum and the double reference. */
static void check_gemm(const shape_t *sh, uint32_t flags) {
  size_t na = (size_t)sh->m * sh->k, nb = (size_t)sh->k * sh->n, nc = (size_t)sh->m * sh->n;
  bool ta = flags & GCA_GEMM_TRANS_A, tb = flags & GCA_GEMM_TRANS_B;
  bool acc = flags & GCA_GEMM_ACCUMULATE;
  float *a = fmalloc(na), *b = fmalloc(nb), *c0 = fmalloc(nc);
  float *c1 = fmalloc(nc), *c2 = fmalloc(nc);
  fill_random(a, na);
  fill_random(b, nb);
  fill_random(c0, nc);
  gca_devptr_t da = dalloc(na * 4), db = dalloc(nb * 4), dc = dalloc(nc * 4);
  put(da, a, na * 4);
  put(db, b, nb * 4);
  float *runs[2] = {c1, c2};
  for (int r = 0; r < 2; r++) {
    put(dc, c0, nc * 4);
    assert_ok(ops->kernel_gemm_f32(dc, da, db, sh->m, sh->n, sh->k, flags, s));
    get(runs[r], dc, nc * 4);
  }
  for (uint32_t i = 0; i < sh->m; i++) {
    for (uint32_t j = 0; j < sh->n; j++) {
      size_t at = (size_t)i * sh->n + j;
      float ordered = 0.0f;
      double ref = 0, mag = 0;
      for (uint32_t p = 0; p < sh->k; p++) {
        float x = op_a(a, sh, ta, i, p), y = op_b(b, sh, tb, p, j);
        ordered = add_f32(ordered, mul_f32(x, y));
        ref += (double)x * y;
        mag += fabs((double)x * y);
      }
      if (acc) {
        ordered = add_f32(ordered, c0[at]);
        ref += c0[at];
        mag += fabs(c0[at]);
      }
      double tol = (sh->k + 2) * (double)FLT_EPSILON * mag + FLT_MIN;
      if (bits(c1[at]) != bits(c2[at]))
        fail_msg("%ux%ux%u flags %u: C[%u][%u] is %a on one run, %a on the next", sh->m, sh->n,
                 sh->k, flags, i, j, (double)c1[at], (double)c2[at]);
      if (fabs(c1[at] - ref) > tol)
        fail_msg("%ux%ux%u flags %u: C[%u][%u] = %.9g, the double reference %.9g (tolerance %g)",
                 sh->m, sh->n, sh->k, flags, i, j, (double)c1[at], ref, tol);
      if (bits(c1[at]) != bits(ordered))
        fail_msg("%ux%ux%u flags %u: C[%u][%u] = %a, the products summed in order give %a", sh->m,
                 sh->n, sh->k, flags, i, j, (double)c1[at], (double)ordered);
    }
  }
  dfree(da);
  dfree(db);
  dfree(dc);
  free(a);
  free(b);
  free(c0);
  free(c1);
  free(c2);
}

/* Every transpose combination, with and without accumulation, on shapes
 * from one element to more columns than one pass of the sim's loop takes. */
static void gemm_matches_its_reference_and_repeats_exactly(void **state) {
  (void)state;
  static const shape_t shapes[] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {3, 70, 9}, {64, 1, 128}};
  rng_state = 1;
  for (size_t i = 0; i < GCA_ARRAY_SIZE(shapes); i++)
    for (uint32_t flags = 0; flags < 8; flags++)
      check_gemm(&shapes[i], flags);
}

/* k = 0 writes +0 everywhere (A and B are not read: NULL is fine), or leaves
 * C as it was when accumulating; m or n of 0 touches nothing. */
static void gemm_with_an_empty_dimension_does_what_is_documented(void **state) {
  (void)state;
  enum { M = 5, N = 6 };
  float c0[M * N], c[M * N];
  for (size_t i = 0; i < M * N; i++)
    c0[i] = i % 3 ? (float)i - 10.5f : -0.0f;
  gca_devptr_t dc = dalloc(sizeof(c0)), da = dalloc(4096), db = dalloc(4096);
  put(dc, c0, sizeof(c0));
  assert_ok(ops->kernel_gemm_f32(dc, 0, 0, M, N, 0, GCA_GEMM_ACCUMULATE, s));
  assert_ok(ops->kernel_gemm_f32(dc, da, db, 0, N, 7, 0, s));
  assert_ok(ops->kernel_gemm_f32(dc, da, db, M, 0, 7, GCA_GEMM_TRANS_A, s));
  assert_ok(ops->kernel_gemm_f32(0, 0, 0, 0, 0, 0, 0, s));
  get(c, dc, sizeof(c));
  assert_memory_equal(c, c0, sizeof(c));
  assert_ok(ops->kernel_gemm_f32(dc, 0, 0, M, N, 0, GCA_GEMM_TRANS_B, s));
  get(c, dc, sizeof(c));
  for (size_t i = 0; i < M * N; i++)
    if (bits(c[i]) != 0)
      fail_msg("k = 0: C[%zu] is %a, wanted +0", i, (double)c[i]);
  dfree(dc);
  dfree(da);
  dfree(db);
}

static void gemm_refuses_bad_arguments(void **state) {
  (void)state;
  gca_devptr_t buf = dalloc(4096);
  gca_devptr_t a = buf, b = buf + 1024, c = buf + 2048;
  assert_status(ops->kernel_gemm_f32(c, a, b, 2, 2, 2, 8, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_gemm_f32: flags 0x8 has bits outside GCA_GEMM_TRANS_A");
  assert_status(ops->kernel_gemm_f32(c + 2, a, b, 2, 2, 2, 0, s), GCA_ERR_INVALID_ARGUMENT,
                "must be a 4-byte aligned device pointer");
  assert_status(ops->kernel_gemm_f32(c, a, b + 1, 2, 2, 2, 0, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_gemm_f32: B 0x");
  assert_status(ops->kernel_gemm_f32(c, 0, b, 2, 2, 2, 0, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_gemm_f32: A is NULL (16 bytes are touched)");
  assert_status(ops->kernel_gemm_f32(0, a, b, 2, 2, 2, 0, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_gemm_f32: C is NULL");
  assert_status(ops->kernel_gemm_f32(a + 8, a, b, 2, 2, 2, 0, s), GCA_ERR_INVALID_ARGUMENT,
                "overlaps A");
  assert_status(ops->kernel_gemm_f32(b - 4, a, b, 2, 2, 2, GCA_GEMM_TRANS_B, s),
                GCA_ERR_INVALID_ARGUMENT, "overlaps B");
  assert_status(ops->kernel_gemm_f32(c, a, b, UINT32_MAX, UINT32_MAX, 1, 0, s),
                GCA_ERR_INVALID_ARGUMENT, "a matrix's bytes do not fit size_t");
  assert_ok(ops->stream_synchronize(s));
  dfree(buf);
}

/* ---- elementwise ---- */

#define EW_N 1000

static float ew_expected(gca_ew_op_t op, float x, float y, uint32_t word, float sc, uint32_t u) {
  switch (op) {
  case GCA_EW_ADD:
    return add_f32(x, y);
  case GCA_EW_SUB:
    return sub_f32(x, y);
  case GCA_EW_MUL:
    return mul_f32(x, y);
  case GCA_EW_AXPY:
    return add_f32(x, mul_f32(sc, y));
  case GCA_EW_SCALE:
    return mul_f32(sc, x);
  case GCA_EW_RELU:
    return x > 0.0f ? x : 0.0f;
  case GCA_EW_RELU_GRAD:
    return y > 0.0f ? x : 0.0f;
  case GCA_EW_DROPOUT:
    return word < u ? 0.0f : mul_f32(x, sc);
  }
  return NAN;
}

typedef struct ew_inputs {
  float a[EW_N], b[EW_N];
  uint32_t words[EW_N];
} ew_inputs_t;

static void ew_inputs(ew_inputs_t *in) {
  fill_random(in->a, EW_N);
  fill_random(in->b, EW_N);
  for (size_t i = 0; i < EW_N; i++)
    in->words[i] = next_u32();
  /* values at the edges of each op: NaN, signed zeros, infinities, exact 0 in b */
  in->a[0] = NAN, in->a[1] = -0.0f, in->a[2] = INFINITY, in->a[3] = -INFINITY, in->a[4] = 0.0f;
  in->b[5] = 0.0f, in->b[6] = -0.0f, in->b[7] = NAN, in->b[8] = -1.0f;
}

/* Each op against the same float expression on the host, on a count that is
 * not a multiple of any block size; unary ops given no b. */
static void each_elementwise_op_computes_its_expression(void **state) {
  (void)state;
  static ew_inputs_t in;
  static float got[EW_N];
  rng_state = 2;
  ew_inputs(&in);
  gca_devptr_t da = dalloc(sizeof(in.a)), db = dalloc(sizeof(in.b));
  gca_devptr_t dw = dalloc(sizeof(in.words)), dd = dalloc(sizeof(got));
  put(da, in.a, sizeof(in.a));
  put(db, in.b, sizeof(in.b));
  put(dw, in.words, sizeof(in.words));
  const float sc = 1.25f;
  const uint32_t u = 0x40000000u; /* a quarter dropped */
  for (int op = GCA_EW_ADD; op <= GCA_EW_DROPOUT; op++) {
    gca_devptr_t b = op == GCA_EW_DROPOUT ? dw : op == GCA_EW_SCALE || op == GCA_EW_RELU ? 0 : db;
    assert_ok(ops->memset_d32_async(dd, 0x7fc00001u, EW_N, s));
    assert_ok(ops->kernel_ew_f32((gca_ew_op_t)op, dd, da, b, sc, u, EW_N, s));
    get(got, dd, sizeof(got));
    for (size_t i = 0; i < EW_N; i++) {
      float want = ew_expected((gca_ew_op_t)op, in.a[i], in.b[i], in.words[i], sc, u);
      if (!same(got[i], want))
        fail_msg("op %d: dst[%zu] = %a (a %a, b %a, word 0x%08x), wanted %a", op, i, (double)got[i],
                 (double)in.a[i], (double)in.b[i], in.words[i], (double)want);
    }
  }
  dfree(da);
  dfree(db);
  dfree(dw);
  dfree(dd);
}

/* dst may be a or b: ADD in place over a, SUB in place over b. */
static void elementwise_dst_may_be_an_operand(void **state) {
  (void)state;
  static ew_inputs_t in;
  static float got[EW_N];
  rng_state = 3;
  ew_inputs(&in);
  gca_devptr_t da = dalloc(sizeof(in.a)), db = dalloc(sizeof(in.b));
  put(da, in.a, sizeof(in.a));
  put(db, in.b, sizeof(in.b));
  assert_ok(ops->kernel_ew_f32(GCA_EW_ADD, da, da, db, 0, 0, EW_N, s));
  get(got, da, sizeof(got));
  for (size_t i = 0; i < EW_N; i++)
    if (!same(got[i], add_f32(in.a[i], in.b[i])))
      fail_msg("a += b: a[%zu] = %a", i, (double)got[i]);
  put(da, in.a, sizeof(in.a));
  assert_ok(ops->kernel_ew_f32(GCA_EW_SUB, db, da, db, 0, 0, EW_N, s));
  get(got, db, sizeof(got));
  for (size_t i = 0; i < EW_N; i++)
    if (!same(got[i], sub_f32(in.a[i], in.b[i])))
      fail_msg("b = a - b: b[%zu] = %a", i, (double)got[i]);
  dfree(da);
  dfree(db);
}

/* The mask is a function of the words and the threshold alone: the forward
 * activations and the backward gradient lose the same elements; threshold 0
 * keeps every element (scaled). */
static void dropout_masks_by_the_words_alone(void **state) {
  (void)state;
  static ew_inputs_t in;
  static float fwd[EW_N], bwd[EW_N], all[EW_N];
  rng_state = 4;
  ew_inputs(&in);
  for (size_t i = 0; i < EW_N; i++) /* nothing that is zero before the mask */
    in.a[i] = 1.0f + (float)i, in.b[i] = -2.0f - (float)i;
  gca_devptr_t da = dalloc(sizeof(in.a)), db = dalloc(sizeof(in.b));
  gca_devptr_t dw = dalloc(sizeof(in.words)), dd = dalloc(sizeof(fwd));
  put(da, in.a, sizeof(in.a));
  put(db, in.b, sizeof(in.b));
  put(dw, in.words, sizeof(in.words));
  const uint32_t u = 0x80000000u; /* half dropped */
  assert_ok(ops->kernel_ew_f32(GCA_EW_DROPOUT, dd, da, dw, 2.0f, u, EW_N, s));
  get(fwd, dd, sizeof(fwd));
  assert_ok(ops->kernel_ew_f32(GCA_EW_DROPOUT, db, db, dw, 2.0f, u, EW_N, s)); /* in place */
  get(bwd, db, sizeof(bwd));
  assert_ok(ops->kernel_ew_f32(GCA_EW_DROPOUT, dd, da, dw, 2.0f, 0, EW_N, s));
  get(all, dd, sizeof(all));
  size_t dropped = 0;
  for (size_t i = 0; i < EW_N; i++) {
    bool drop = in.words[i] < u;
    dropped += drop;
    if ((fwd[i] == 0.0f) != drop || (bwd[i] == 0.0f) != drop)
      fail_msg("element %zu (word 0x%08x): forward %g, backward %g", i, in.words[i], (double)fwd[i],
               (double)bwd[i]);
    if (!drop && (fwd[i] != 2.0f * in.a[i] || bwd[i] != 2.0f * in.b[i]))
      fail_msg("element %zu kept: forward %g, backward %g", i, (double)fwd[i], (double)bwd[i]);
    if (all[i] != 2.0f * in.a[i])
      fail_msg("threshold 0: element %zu is %g, wanted %g", i, (double)all[i],
               2.0 * (double)in.a[i]);
  }
  assert_true(dropped > EW_N / 4 && dropped < 3 * EW_N / 4);
  dfree(da);
  dfree(db);
  dfree(dw);
  dfree(dd);
}

static void elementwise_refuses_bad_arguments(void **state) {
  (void)state;
  gca_devptr_t buf = dalloc(4096);
  gca_devptr_t a = buf, b = buf + 1024, d = buf + 2048;
  assert_status(ops->kernel_ew_f32((gca_ew_op_t)8, d, a, b, 1, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_ew_f32: op 8 is not a gca_ew_op_t");
  assert_status(ops->kernel_ew_f32((gca_ew_op_t)-1, d, a, b, 1, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "op -1 is not a gca_ew_op_t");
  assert_status(ops->kernel_ew_f32(GCA_EW_ADD, d, a, 0, 1, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_ew_f32: b is NULL");
  assert_status(ops->kernel_ew_f32(GCA_EW_DROPOUT, d, a, 0, 1, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "b is NULL");
  assert_status(ops->kernel_ew_f32(GCA_EW_MUL, d, a + 1, b, 1, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_ew_f32: a 0x");
  assert_status(ops->kernel_ew_f32(GCA_EW_RELU, 0, a, 0, 1, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_ew_f32: dst is NULL");
  assert_status(ops->kernel_ew_f32(GCA_EW_ADD, a + 4, a, b, 1, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "overlaps a [");
  assert_status(ops->kernel_ew_f32(GCA_EW_RELU_GRAD, b - 8, a, b, 1, 0, 16, s),
                GCA_ERR_INVALID_ARGUMENT, "other than by being equal");
  assert_status(ops->kernel_ew_f32(GCA_EW_SCALE, d, a, 0, 1, 0, SIZE_MAX / 4 + 1, s),
                GCA_ERR_INVALID_ARGUMENT, "its bytes do not fit size_t");
  /* nothing to do: pointers are not needed */
  assert_ok(ops->kernel_ew_f32(GCA_EW_ADD, 0, 0, 0, 1, 0, 0, s));
  /* a unary op ignores b, whatever it holds */
  assert_ok(ops->kernel_ew_f32(GCA_EW_RELU, d, a, 3, 1, 0, 16, s));
  assert_ok(ops->stream_synchronize(s));
  dfree(buf);
}

/* ---- dot ---- */

/* s * the sum in the documented order: 256 strided lanes, a pairwise tree. */
static float dot_ordered(const float *a, const float *b, size_t count, float sc) {
  float lane[GCA__DOT_LANES];
  for (size_t j = 0; j < GCA__DOT_LANES; j++)
    lane[j] = 0.0f;
  for (size_t i = 0; i < count; i++)
    lane[i % GCA__DOT_LANES] = add_f32(lane[i % GCA__DOT_LANES], mul_f32(a[i], b[i]));
  for (size_t h = GCA__DOT_LANES / 2; h > 0; h /= 2)
    for (size_t j = 0; j < h; j++)
      lane[j] = add_f32(lane[j], lane[j + h]);
  return mul_f32(sc, lane[0]);
}

static void dot_repeats_exactly_and_is_close_to_the_reference(void **state) {
  (void)state;
  static const size_t counts[] = {0, 1, 255, 256, 257, 1000, 65537};
  static const float scales[] = {1.0f, 0.5f, -3.0f};
  enum { MAX = 65537 };
  float *a = fmalloc(MAX), *b = fmalloc(MAX);
  rng_state = 5;
  fill_random(a, MAX);
  fill_random(b, MAX);
  gca_devptr_t da = dalloc(MAX * 4), db = dalloc(MAX * 4), dd = dalloc(4);
  put(da, a, MAX * 4);
  put(db, b, MAX * 4);
  for (size_t c = 0; c < GCA_ARRAY_SIZE(counts); c++) {
    for (size_t k = 0; k < GCA_ARRAY_SIZE(scales); k++) {
      size_t n = counts[c];
      float sc = scales[k], got[2];
      for (int r = 0; r < 2; r++) {
        assert_ok(ops->memset_d32_async(dd, 0x7fc00001u, 1, s));
        assert_ok(ops->kernel_dot_f32(dd, da, db, n, sc, s));
        get(&got[r], dd, 4);
      }
      double ref = 0, mag = 0;
      for (size_t i = 0; i < n; i++) {
        ref += (double)a[i] * b[i];
        mag += fabs((double)a[i] * b[i]);
      }
      ref *= sc;
      double tol = fabs(sc) * ((double)n / GCA__DOT_LANES + 10) * FLT_EPSILON * mag + FLT_MIN;
      float ordered = dot_ordered(a, b, n, sc);
      if (bits(got[0]) != bits(got[1]))
        fail_msg("count %zu, s %g: %a on one run, %a on the next", n, (double)sc, (double)got[0],
                 (double)got[1]);
      if (fabs(got[0] - ref) > tol)
        fail_msg("count %zu, s %g: %.9g, the double reference %.9g (tolerance %g)", n, (double)sc,
                 (double)got[0], ref, tol);
      if (bits(got[0]) != bits(ordered))
        fail_msg("count %zu, s %g: %a, the documented order gives %a", n, (double)sc,
                 (double)got[0], (double)ordered);
    }
  }
  /* dst inside a: written after every read */
  assert_ok(ops->kernel_dot_f32(da + 40, da, db, 1000, 1.0f, s));
  float in_place;
  get(&in_place, da + 40, 4);
  assert_true(bits(in_place) == bits(dot_ordered(a, b, 1000, 1.0f)));
  dfree(da);
  dfree(db);
  dfree(dd);
  free(a);
  free(b);
}

static void dot_refuses_bad_arguments(void **state) {
  (void)state;
  gca_devptr_t buf = dalloc(4096);
  assert_status(ops->kernel_dot_f32(0, buf, buf, 4, 1, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_dot_f32: dst is NULL (4 bytes are touched)");
  assert_status(ops->kernel_dot_f32(0, 0, 0, 0, 1, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_dot_f32: dst is NULL");
  assert_status(ops->kernel_dot_f32(buf + 2, buf, buf, 4, 1, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_dot_f32: dst 0x");
  assert_status(ops->kernel_dot_f32(buf, 0, buf, 4, 1, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_dot_f32: a is NULL");
  assert_status(ops->kernel_dot_f32(buf, buf, buf + 6, 4, 1, s), GCA_ERR_INVALID_ARGUMENT,
                "kernel_dot_f32: b 0x");
  assert_status(ops->kernel_dot_f32(buf, buf, buf, SIZE_MAX / 2, 1, s), GCA_ERR_INVALID_ARGUMENT,
                "its bytes do not fit size_t");
  assert_ok(ops->kernel_dot_f32(buf, 0, 0, 0, 1, s)); /* count 0: a and b unused */
  assert_ok(ops->stream_synchronize(s));
  dfree(buf);
}

/* ---- capture ---- */

/* One step of a tiny layer: H = relu(X . W) (in place), Y = dropout(H),
 * dot = Y . Y / 4, W2 = W - 0.1 X^T . Y (the product, then AXPY into it). */
enum { SM = 9, SK = 13, SN = 11 };

typedef struct step_bufs {
  gca_devptr_t x, w, h, y, words, dot, w2;
} step_bufs_t;

static void issue_step(const step_bufs_t *d) {
  assert_ok(ops->kernel_gemm_f32(d->h, d->x, d->w, SM, SN, SK, 0, s));
  assert_ok(ops->kernel_ew_f32(GCA_EW_RELU, d->h, d->h, 0, 0, 0, SM * SN, s));
  assert_ok(
      ops->kernel_ew_f32(GCA_EW_DROPOUT, d->y, d->h, d->words, 1.5f, 0x55555555u, SM * SN, s));
  assert_ok(ops->kernel_dot_f32(d->dot, d->y, d->y, SM * SN, 0.25f, s));
  assert_ok(ops->kernel_gemm_f32(d->w2, d->x, d->y, SK, SN, SM, GCA_GEMM_TRANS_A, s));
  assert_ok(ops->kernel_ew_f32(GCA_EW_AXPY, d->w2, d->w, d->w2, -0.1f, 0, SK * SN, s));
}

typedef struct step_out {
  float h[SM * SN], y[SM * SN], dot, w2[SK * SN];
} step_out_t;

static void read_step(const step_bufs_t *d, step_out_t *o) {
  get(o->h, d->h, sizeof(o->h));
  get(o->y, d->y, sizeof(o->y));
  get(&o->dot, d->dot, 4);
  get(o->w2, d->w2, sizeof(o->w2));
}

static void clear_step(const step_bufs_t *d) {
  assert_ok(ops->memset_d32_async(d->h, 0xffffffffu, SM * SN, s));
  assert_ok(ops->memset_d32_async(d->y, 0xffffffffu, SM * SN, s));
  assert_ok(ops->memset_d32_async(d->dot, 0xffffffffu, 1, s));
  assert_ok(ops->memset_d32_async(d->w2, 0xffffffffu, SK * SN, s));
}

/* A graph captured from the kernels replays what eager launches computed,
 * twice over, and reads its inputs when it runs: new X, new eager results,
 * the same replayed. */
static void a_captured_step_replays_the_eager_results(void **state) {
  (void)state;
  float x[SM * SK], w[SK * SN];
  uint32_t words[SM * SN];
  rng_state = 6;
  fill_random(x, SM * SK);
  fill_random(w, SK * SN);
  for (size_t i = 0; i < SM * SN; i++)
    words[i] = next_u32();
  step_bufs_t d = {dalloc(sizeof(x)),   dalloc(sizeof(w)),     dalloc(SM * SN * 4),
                   dalloc(SM * SN * 4), dalloc(sizeof(words)), dalloc(4),
                   dalloc(SK * SN * 4)};
  put(d.x, x, sizeof(x));
  put(d.w, w, sizeof(w));
  put(d.words, words, sizeof(words));
  static step_out_t eager, eager2, replay;
  clear_step(&d);
  issue_step(&d);
  read_step(&d, &eager);

  gca_graph_t g;
  gca_graph_exec_t ge;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  issue_step(&d);
  assert_ok(ops->stream_end_capture(s, &g));
  assert_ok(ops->graph_instantiate(g, &ge));
  for (int r = 0; r < 2; r++) {
    clear_step(&d);
    assert_ok(ops->graph_launch(ge, s));
    read_step(&d, &replay);
    if (memcmp(&replay, &eager, sizeof(eager)) != 0)
      fail_msg("replay %d differs from the eager step", r);
  }
  for (size_t i = 0; i < SM * SK; i++)
    x[i] = -x[i] * 0.5f;
  put(d.x, x, sizeof(x));
  clear_step(&d);
  issue_step(&d);
  read_step(&d, &eager2);
  assert_true(memcmp(&eager2, &eager, sizeof(eager)) != 0);
  clear_step(&d);
  assert_ok(ops->graph_launch(ge, s));
  read_step(&d, &replay);
  if (memcmp(&replay, &eager2, sizeof(eager2)) != 0)
    fail_msg("a replay after X changed differs from the eager step on the new X");
  assert_ok(ops->graph_exec_destroy(ge));
  assert_ok(ops->graph_destroy(g));
  gca_devptr_t all[] = {d.x, d.w, d.h, d.y, d.words, d.dot, d.w2};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(all); i++)
    dfree(all[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gemm_matches_its_reference_and_repeats_exactly),
      cmocka_unit_test(gemm_with_an_empty_dimension_does_what_is_documented),
      cmocka_unit_test(gemm_refuses_bad_arguments),
      cmocka_unit_test(each_elementwise_op_computes_its_expression),
      cmocka_unit_test(elementwise_dst_may_be_an_operand),
      cmocka_unit_test(dropout_masks_by_the_words_alone),
      cmocka_unit_test(elementwise_refuses_bad_arguments),
      cmocka_unit_test(dot_repeats_exactly_and_is_close_to_the_reference),
      cmocka_unit_test(dot_refuses_bad_arguments),
      cmocka_unit_test(a_captured_step_replays_the_eager_results),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
