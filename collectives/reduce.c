/* SPDX-License-Identifier: Apache-2.0 */
/* reduce.c - element types and reductions of the collectives: f16 and bf16
 * conversions (round to nearest even), and one reduction loop per dtype.
 *
 * The one idea: a reduction reads the ranks' inputs in rank order and
 * accumulates in a fixed wider type (float for f16, bf16 and f32; double for
 * f64; the integer itself, modulo 2^n), so every rank computes bit-identical
 * results and a test can compute them the same way. */
#include <math.h>
#include <string.h>

#include "coll_internal.h"

float gca__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400u));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t gca__f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) /* inf or nan */
    return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) /* rounds to >= 65520: inf */
    return (uint16_t)(sign | 0x7c00u);
  if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
    if (absx < 0x33000000u)
      return (uint16_t)sign;
    uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14 + (113 - e) */
    uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1)))
      half++;
    return (uint16_t)(sign | half);
  }
  uint32_t r = absx - 0x38000000u; /* rebias 127 -> 15 */
  uint32_t half = r >> 13, rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
    half++;
  return (uint16_t)(sign | half);
}

float gca__bf16_to_f32(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t gca__f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

GCA_API size_t gca_dtype_size(gca_dtype_t dtype) {
  switch (dtype) {
  case GCA_DTYPE_F32:
  case GCA_DTYPE_I32:
    return 4;
  case GCA_DTYPE_F16:
  case GCA_DTYPE_BF16:
    return 2;
  case GCA_DTYPE_F64:
  case GCA_DTYPE_I64:
    return 8;
  case GCA_DTYPE_U8:
    return 1;
  }
  return 0;
}

/* One step of a floating reduction in type T (avg sums; the division comes last). */
#define FLOAT_OP(name, T)                       \
  static T name(gca_reduce_op_t op, T a, T b) { \
    switch (op) {                               \
    case GCA_REDUCE_PROD:                       \
      return a * b;                             \
    case GCA_REDUCE_MAX:                        \
      return b > a ? b : a;                     \
    case GCA_REDUCE_MIN:                        \
      return b < a ? b : a;                     \
    default:                                    \
      return a + b;                             \
    }                                           \
  }
FLOAT_OP(fop, float)
FLOAT_OP(dop, double)

#define INT_REDUCE(T, UT)                                                 \
  for (size_t i = 0; i < count; i++) {                                    \
    T acc;                                                                \
    memcpy(&acc, (const char *)in[0] + (off + i) * sizeof(T), sizeof(T)); \
    for (int r = 1; r < n; r++) {                                         \
      T v;                                                                \
      memcpy(&v, (const char *)in[r] + (off + i) * sizeof(T), sizeof(T)); \
      switch (op) {                                                       \
      case GCA_REDUCE_PROD:                                               \
        acc = (T)((UT)acc * (UT)v);                                       \
        break;                                                            \
      case GCA_REDUCE_MAX:                                                \
        acc = v > acc ? v : acc;                                          \
        break;                                                            \
      case GCA_REDUCE_MIN:                                                \
        acc = v < acc ? v : acc;                                          \
        break;                                                            \
      default:                                                            \
        acc = (T)((UT)acc + (UT)v);                                       \
        break;                                                            \
      }                                                                   \
    }                                                                     \
    memcpy((char *)out + i * sizeof(T), &acc, sizeof(T));                 \
  }

void gca__reduce(gca_dtype_t dtype, gca_reduce_op_t op, int n, const void *const *in, size_t off,
                 void *out, size_t count) {
  switch (dtype) {
  case GCA_DTYPE_F32:
  case GCA_DTYPE_F16:
  case GCA_DTYPE_BF16:
    for (size_t i = 0; i < count; i++) {
      float acc = 0;
      for (int r = 0; r < n; r++) {
        const char *p = (const char *)in[r];
        float v;
        if (dtype == GCA_DTYPE_F32) {
          memcpy(&v, p + (off + i) * 4, 4);
        } else {
          uint16_t h;
          memcpy(&h, p + (off + i) * 2, 2);
          v = dtype == GCA_DTYPE_F16 ? gca__f16_to_f32(h) : gca__bf16_to_f32(h);
        }
        acc = r == 0 ? v : fop(op, acc, v);
      }
      if (op == GCA_REDUCE_AVG)
        acc /= (float)n;
      if (dtype == GCA_DTYPE_F32) {
        memcpy((char *)out + i * 4, &acc, 4);
      } else {
        uint16_t h = dtype == GCA_DTYPE_F16 ? gca__f32_to_f16(acc) : gca__f32_to_bf16(acc);
        memcpy((char *)out + i * 2, &h, 2);
      }
    }
    break;
  case GCA_DTYPE_F64:
    for (size_t i = 0; i < count; i++) {
      double acc = 0;
      for (int r = 0; r < n; r++) {
        double v;
        memcpy(&v, (const char *)in[r] + (off + i) * 8, 8);
        acc = r == 0 ? v : dop(op, acc, v);
      }
      if (op == GCA_REDUCE_AVG)
        acc /= (double)n;
      memcpy((char *)out + i * 8, &acc, 8);
    }
    break;
  case GCA_DTYPE_I32:
    INT_REDUCE(int32_t, uint32_t)
    break;
  case GCA_DTYPE_I64:
    INT_REDUCE(int64_t, uint64_t)
    break;
  case GCA_DTYPE_U8:
    INT_REDUCE(uint8_t, uint8_t)
    break;
  }
}
