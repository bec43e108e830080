/* SPDX-License-Identifier: Apache-2.0 */
/* coll_ref.h - the expected results of collectives, computed by other means
 * than the library's (the compiler's _Float16, a nearest-candidate bf16
 * rounding), for the tests of ranks as threads and as processes. */
#ifndef GCA_TEST_COLL_REF_H
#define GCA_TEST_COLL_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gca/collectives.h"

static inline uint16_t ref_bf16(float f) { /* the nearest of the two candidates; ties to even */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  memcpy(&flo, &lo, 4);
  memcpy(&fhi, &hi, 4);
  double dl = fabs((double)f - (double)flo), dh = fabs((double)fhi - (double)f);
  if (dl < dh || (dl == dh && !((lo >> 16) & 1)))
    return (uint16_t)(lo >> 16);
  return (uint16_t)(hi >> 16);
}

static inline float from_bf16(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* Element i of rank r's input, as a double (exact in every dtype used). */
static inline double value(gca_dtype_t t, int r, size_t i, gca_reduce_op_t op) {
  if (op == GCA_REDUCE_PROD)
    return (double)(1 + (int)((r + i) % 3)); /* small factors: no overflow, exact */
  switch (t) {
  case GCA_DTYPE_U8:
    return (double)((r * 31 + i * 7) % 97);
  case GCA_DTYPE_I32:
  case GCA_DTYPE_I64:
    return (double)((int)((r * 1000003 + i * 7919) % 20011) - 10005);
  default: /* tenths: inexact in binary, so rounding shows */
    return ((double)((r * 13 + i * 5) % 41) - 20.0) / 10.0;
  }
}

static inline void store(gca_dtype_t t, void *buf, size_t i, double v) {
  char *p = (char *)buf + i * gca_dtype_size(t);
  switch (t) {
  case GCA_DTYPE_F32: {
    float f = (float)v;
    memcpy(p, &f, 4);
    break;
  }
  case GCA_DTYPE_F16: {
    _Float16 h = (_Float16)(float)v;
    memcpy(p, &h, 2);
    break;
  }
  case GCA_DTYPE_BF16: {
    uint16_t b = ref_bf16((float)v);
    memcpy(p, &b, 2);
    break;
  }
  case GCA_DTYPE_F64:
    memcpy(p, &v, 8);
    break;
  case GCA_DTYPE_I32: {
    int32_t x = (int32_t)v;
    memcpy(p, &x, 4);
    break;
  }
  case GCA_DTYPE_I64: {
    int64_t x = (int64_t)v;
    memcpy(p, &x, 8);
    break;
  }
  case GCA_DTYPE_U8: {
    uint8_t x = (uint8_t)v;
    memcpy(p, &x, 1);
    break;
  }
  }
}

/* The value as stored in the dtype, read back as float (floating types). */
static inline float as_stored(gca_dtype_t t, double v) {
  switch (t) {
  case GCA_DTYPE_F16:
    return (float)(_Float16)(float)v;
  case GCA_DTYPE_BF16:
    return from_bf16(ref_bf16((float)v));
  default:
    return (float)v;
  }
}

/* The reduction of element i over n ranks (offset into each input). */
static inline void expect_reduced(gca_dtype_t t, gca_reduce_op_t op, int n, size_t i, void *out,
                                  size_t at) {
  if (t == GCA_DTYPE_F32 || t == GCA_DTYPE_F16 || t == GCA_DTYPE_BF16) {
    float acc = 0;
    for (int r = 0; r < n; r++) {
      float v = as_stored(t, value(t, r, i, op));
      acc = r == 0                  ? v
            : op == GCA_REDUCE_PROD ? acc * v
            : op == GCA_REDUCE_MAX  ? fmaxf(acc, v)
            : op == GCA_REDUCE_MIN  ? fminf(acc, v)
                                    : acc + v;
    }
    if (op == GCA_REDUCE_AVG)
      acc /= (float)n;
    store(t, out, at, acc);
  } else if (t == GCA_DTYPE_F64) {
    double acc = 0;
    for (int r = 0; r < n; r++) {
      double v = value(t, r, i, op);
      acc = r == 0                  ? v
            : op == GCA_REDUCE_PROD ? acc * v
            : op == GCA_REDUCE_MAX  ? fmax(acc, v)
            : op == GCA_REDUCE_MIN  ? fmin(acc, v)
                                    : acc + v;
    }
    if (op == GCA_REDUCE_AVG)
      acc /= n;
    store(t, out, at, acc);
  } else {
    long long acc = 0;
    for (int r = 0; r < n; r++) {
      long long v = (long long)value(t, r, i, op);
      acc = r == 0                  ? v
            : op == GCA_REDUCE_PROD ? acc * v
            : op == GCA_REDUCE_MAX  ? (v > acc ? v : acc)
            : op == GCA_REDUCE_MIN  ? (v < acc ? v : acc)
                                    : acc + v;
    }
    if (t == GCA_DTYPE_U8)
      acc &= 0xff; /* modulo 2^8 */
    store(t, out, at, (double)acc);
  }
}

#endif
