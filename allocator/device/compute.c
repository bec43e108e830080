/* SPDX-License-Identifier: Apache-2.0 */
/* compute.c - what the f32 compute kernels (gemm, elementwise, dot) accept,
 * checked in one place for both backends: flag bits and op codes, sizes whose
 * bytes must fit size_t, pointers (NULL or misaligned where the kernel reads
 * or writes), and the overlaps each kernel forbids.
 *
 * The one idea: a kernel's arguments reduce to the bytes it touches through
 * each pointer (gca__compute_span_t). Every check is on those spans, the
 * cuda backend launches only when the destination's span is not empty, and
 * the sim checks the same spans for faults when the work runs. The order of
 * the arithmetic itself is Note [Compute order] (device.h).
 */
#include <stdint.h>

#include "device.h"

#define GEMM_FLAGS (GCA_GEMM_TRANS_A | GCA_GEMM_TRANS_B | GCA_GEMM_ACCUMULATE)

/* rows x cols floats in bytes, or false when that overflows size_t. */
static bool matrix_bytes(uint32_t rows, uint32_t cols, size_t *bytes) {
  uint64_t elems = (uint64_t)rows * cols;
  if (elems > SIZE_MAX / 4)
    return false;
  *bytes = (size_t)elems * 4;
  return true;
}

/* A pointer the kernel touches `bytes` through: non-NULL, 4-byte aligned, and
 * not running past the end of the address space. */
static gca_status_t check_ptr(const char *op, const char *what, gca_devptr_t p, size_t bytes) {
  if (bytes == 0)
    return GCA_OK;
  if (!p)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s is NULL (%zu bytes are touched)", op, what,
                      bytes);
  if (p & 3u)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: %s 0x%llx must be a 4-byte aligned device pointer", op, what,
                      (unsigned long long)p);
  if (p + bytes < p)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: %s [0x%llx, +%zu) runs past the end of the address space", op, what,
                      (unsigned long long)p, bytes);
  return GCA_OK;
}

static bool overlap(gca_devptr_t x, size_t xn, gca_devptr_t y, size_t yn) {
  return xn > 0 && yn > 0 && x < y + yn && y < x + xn;
}

static gca_status_t overlap_error(const char *op, const char *what, gca_devptr_t x, size_t xn,
                                  const char *other, gca_devptr_t y, size_t yn, const char *rule) {
  return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s [0x%llx, +%zu) overlaps %s [0x%llx, +%zu)%s",
                    op, what, (unsigned long long)x, xn, other, (unsigned long long)y, yn, rule);
}

/* ---- spans ---- */

gca__compute_span_t gca__gemm_f32_span(uint32_t m, uint32_t n, uint32_t k, uint32_t flags) {
  gca__compute_span_t s = {0, 0, 0};
  if (m == 0 || n == 0 || (k == 0 && (flags & GCA_GEMM_ACCUMULATE)))
    return s;
  s.dst = (size_t)m * n * 4;
  s.a = (size_t)m * k * 4;
  s.b = (size_t)k * n * 4;
  return s;
}

bool gca__ew_reads_b(gca_ew_op_t op) {
  return op != GCA_EW_SCALE && op != GCA_EW_RELU;
}

gca__compute_span_t gca__ew_f32_span(gca_ew_op_t op, size_t count) {
  gca__compute_span_t s = {count * 4, count * 4, gca__ew_reads_b(op) ? count * 4 : 0};
  return s;
}

gca__compute_span_t gca__dot_f32_span(size_t count) {
  gca__compute_span_t s = {4, count * 4, count * 4};
  return s;
}

/* ---- checks ---- */

gca_status_t gca__check_gemm_f32(gca_devptr_t c, gca_devptr_t a, gca_devptr_t b, uint32_t m,
                                 uint32_t n, uint32_t k, uint32_t flags,
                                 gca__compute_span_t *span) {
  static const char op[] = "kernel_gemm_f32";
  if (flags & ~(uint32_t)GEMM_FLAGS)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: flags 0x%x has bits outside GCA_GEMM_TRANS_A | GCA_GEMM_TRANS_B | "
                      "GCA_GEMM_ACCUMULATE",
                      op, flags);
  size_t bytes;
  if (!matrix_bytes(m, n, &bytes) || !matrix_bytes(m, k, &bytes) || !matrix_bytes(k, n, &bytes))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: m %u, n %u, k %u: a matrix's bytes do not fit size_t", op, m, n, k);
  gca__compute_span_t s = gca__gemm_f32_span(m, n, k, flags);
  GCA_CHECK(check_ptr(op, "C", c, s.dst));
  GCA_CHECK(check_ptr(op, "A", a, s.a));
  GCA_CHECK(check_ptr(op, "B", b, s.b));
  if (overlap(c, s.dst, a, s.a))
    return overlap_error(op, "C", c, s.dst, "A", a, s.a, "");
  if (overlap(c, s.dst, b, s.b))
    return overlap_error(op, "C", c, s.dst, "B", b, s.b, "");
  *span = s;
  return GCA_OK;
}

gca_status_t gca__check_ew_f32(gca_ew_op_t op_, gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b,
                               size_t count, gca__compute_span_t *span) {
  static const char op[] = "kernel_ew_f32";
  if ((unsigned)op_ > (unsigned)GCA_EW_DROPOUT)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: op %d is not a gca_ew_op_t (GCA_EW_ADD .. GCA_EW_DROPOUT)", op,
                      (int)op_);
  if (count > SIZE_MAX / 4)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: count %zu: its bytes do not fit size_t", op,
                      count);
  gca__compute_span_t s = gca__ew_f32_span(op_, count);
  GCA_CHECK(check_ptr(op, "dst", dst, s.dst));
  GCA_CHECK(check_ptr(op, "a", a, s.a));
  GCA_CHECK(check_ptr(op, "b", b, s.b));
  static const char rule[] = " other than by being equal";
  if (dst != a && overlap(dst, s.dst, a, s.a))
    return overlap_error(op, "dst", dst, s.dst, "a", a, s.a, rule);
  if (dst != b && overlap(dst, s.dst, b, s.b))
    return overlap_error(op, "dst", dst, s.dst, "b", b, s.b, rule);
  *span = s;
  return GCA_OK;
}

gca_status_t gca__check_dot_f32(gca_devptr_t dst, gca_devptr_t a, gca_devptr_t b, size_t count,
                                gca__compute_span_t *span) {
  static const char op[] = "kernel_dot_f32";
  if (count > SIZE_MAX / 4)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: count %zu: its bytes do not fit size_t", op,
                      count);
  gca__compute_span_t s = gca__dot_f32_span(count);
  GCA_CHECK(check_ptr(op, "dst", dst, s.dst));
  GCA_CHECK(check_ptr(op, "a", a, s.a));
  GCA_CHECK(check_ptr(op, "b", b, s.b));
  *span = s;
  return GCA_OK;
}
