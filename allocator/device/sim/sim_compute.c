/* SPDX-License-Identifier: Apache-2.0 */
/* sim_compute.c - the f32 compute kernels as the sim runs them: gemm,
 * elementwise and dot as plain loops on the stream's worker (or a replay's).
 *
 * The one idea: each result is computed in exactly the order Note [Compute
 * order] (device.h) states, with every product and sum rounded to f32 on its
 * own (this library builds with -ffp-contract=off), so the sim repeats its
 * results bit for bit and matches the cuda kernels, which keep the same order.
 * Loops may be arranged for the cache (gemm walks a row of C in chunks) as long
 * as each element's own sequence of additions stays the stated one.
 */
#include <string.h>

#include "sim_stream.h"

/* Columns of C one pass of gemm keeps in a local accumulator. */
#define GEMM_CHUNK 64u

static void run_gemm(const gca__sim_work_t *w) {
  float *c = (float *)(uintptr_t)w->dst;
  const float *a = (const float *)(uintptr_t)w->a;
  const float *b = (const float *)(uintptr_t)w->b;
  size_t m = w->m, n = w->n, k = w->k;
  bool ta = w->op & GCA_GEMM_TRANS_A, tb = w->op & GCA_GEMM_TRANS_B;
  bool acc_old = w->op & GCA_GEMM_ACCUMULATE;
  if (m == 0 || n == 0 || (k == 0 && acc_old))
    return;
  float acc[GEMM_CHUNK];
  for (size_t i = 0; i < m; i++) {
    for (size_t j0 = 0; j0 < n; j0 += GEMM_CHUNK) {
      size_t width = n - j0 < GEMM_CHUNK ? n - j0 : GEMM_CHUNK;
      for (size_t jj = 0; jj < width; jj++)
        acc[jj] = 0.0f;
      for (size_t p = 0; p < k; p++) {
        float x = ta ? a[p * m + i] : a[i * k + p];
        if (tb)
          for (size_t jj = 0; jj < width; jj++)
            acc[jj] = acc[jj] + x * b[(j0 + jj) * k + p];
        else
          for (size_t jj = 0; jj < width; jj++)
            acc[jj] = acc[jj] + x * b[p * n + j0 + jj];
      }
      float *row = c + i * n + j0;
      for (size_t jj = 0; jj < width; jj++)
        row[jj] = acc_old ? acc[jj] + row[jj] : acc[jj];
    }
  }
}

static void run_ew(const gca__sim_work_t *w) {
  float *d = (float *)(uintptr_t)w->dst;
  const float *x = (const float *)(uintptr_t)w->a;
  const float *y = (const float *)(uintptr_t)w->b;
  const uint32_t *words = (const uint32_t *)(uintptr_t)w->b;
  float s = w->scale;
  uint32_t u = w->value;
  size_t count = w->count;
  switch ((gca_ew_op_t)w->op) {
  case GCA_EW_ADD:
    for (size_t i = 0; i < count; i++)
      d[i] = x[i] + y[i];
    break;
  case GCA_EW_SUB:
    for (size_t i = 0; i < count; i++)
      d[i] = x[i] - y[i];
    break;
  case GCA_EW_MUL:
    for (size_t i = 0; i < count; i++)
      d[i] = x[i] * y[i];
    break;
  case GCA_EW_AXPY:
    for (size_t i = 0; i < count; i++)
      d[i] = x[i] + s * y[i];
    break;
  case GCA_EW_SCALE:
    for (size_t i = 0; i < count; i++)
      d[i] = s * x[i];
    break;
  case GCA_EW_RELU:
    for (size_t i = 0; i < count; i++)
      d[i] = x[i] > 0.0f ? x[i] : 0.0f;
    break;
  case GCA_EW_RELU_GRAD:
    for (size_t i = 0; i < count; i++)
      d[i] = y[i] > 0.0f ? x[i] : 0.0f;
    break;
  case GCA_EW_DROPOUT:
    for (size_t i = 0; i < count; i++)
      d[i] = words[i] < u ? 0.0f : x[i] * s;
    break;
  }
}

static void run_dot(const gca__sim_work_t *w) {
  const float *a = (const float *)(uintptr_t)w->a;
  const float *b = (const float *)(uintptr_t)w->b;
  float lane[GCA__DOT_LANES];
  memset(lane, 0, sizeof(lane)); /* +0 in every lane */
  for (size_t i = 0; i < w->count; i++)
    lane[i % GCA__DOT_LANES] = lane[i % GCA__DOT_LANES] + a[i] * b[i];
  for (unsigned h = GCA__DOT_LANES / 2; h > 0; h /= 2)
    for (unsigned j = 0; j < h; j++)
      lane[j] = lane[j] + lane[j + h];
  *(float *)(uintptr_t)w->dst = w->scale * lane[0];
}

void gca__sim_compute_run(const gca__sim_work_t *w) {
  switch (w->kind) {
  case GCA__SIM_WORK_GEMM:
    run_gemm(w);
    break;
  case GCA__SIM_WORK_EW:
    run_ew(w);
    break;
  case GCA__SIM_WORK_DOT:
    run_dot(w);
    break;
  default:
    break;
  }
}

gca__compute_span_t gca__sim_compute_span(const gca__sim_work_t *w) {
  switch (w->kind) {
  case GCA__SIM_WORK_GEMM:
    return gca__gemm_f32_span(w->m, w->n, w->k, w->op);
  case GCA__SIM_WORK_EW:
    return gca__ew_f32_span((gca_ew_op_t)w->op, w->count);
  case GCA__SIM_WORK_DOT:
    return gca__dot_f32_span(w->count);
  default:
    return (gca__compute_span_t){0, 0, 0};
  }
}
