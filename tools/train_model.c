/* SPDX-License-Identifier: Apache-2.0 */
/* train_model.c - the op graph of gca-train's step and the kernels of its
 * compute ops (train_model.h). */
#include "train_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Propagates a failed gca call with its detail in the tool's buffer. */
#define CK(call) TOOL_CHECK_GCA(call)

#define NAME 48
typedef char name_t[NAME];

typedef struct builder {
  train_model_t *m;
  const train_shape_t *s;
  gca_opgraph_t *g;
  train_kernel_t *k; /* grows with the ops */
  size_t nk, capk;
} builder_t;

static gca_status_t buf(builder_t *b, const char *name, int64_t bytes, gca_buffer_kind_t kind) {
  CK(gca_opgraph_add_buffer(b->g, name, bytes, kind));
  return GCA_OK;
}

static size_t idx(builder_t *b, const char *name) {
  size_t i = (size_t)-1;
  if (gca_opgraph_buffer_index(b->g, name, &i) != GCA_OK)
    i = (size_t)-1;
  return i;
}

/* Adds the kernel entry of the next op. */
static gca_status_t kernel(builder_t *b, const train_kernel_t *k) {
  if (b->nk == b->capk) {
    size_t cap = b->capk ? 2 * b->capk : 64;
    train_kernel_t *grown = realloc(b->k, cap * sizeof(*grown));
    if (!grown)
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "train: no host memory for the kernel table");
    b->k = grown;
    b->capk = cap;
  }
  b->k[b->nk++] = *k;
  return GCA_OK;
}

/* A compute op: reads r[0..nr), writes w (or NULL), mutates old into new (or
 * NULL); k says what it runs (buffers given by name in ka/kb/kc). */
static gca_status_t op(builder_t *b, const char *name, double us, const char *const *r, size_t nr,
                       const char *w, const char *mold, const char *mnew, train_kernel_t k,
                       const char *ka, const char *kb, const char *kc) {
  gca_op_desc_t d = GCA_OP_DESC_INIT;
  d.name = name;
  d.kind = GCA_OP_COMPUTE;
  d.us = us;
  d.reads = r;
  d.nreads = nr;
  d.writes = w ? &w : NULL;
  d.nwrites = w ? 1 : 0;
  if (mold) {
    CK(gca_opgraph_add_view(b->g, mnew, mold));
    d.mutates_old = &mold;
    d.mutates_new = &mnew;
    d.nmutates = 1;
  }
  CK(gca_opgraph_add_op(b->g, &d));
  k.a = ka ? idx(b, ka) : (size_t)-1;
  k.b = kb ? idx(b, kb) : (size_t)-1;
  k.c = idx(b, kc);
  b->m->compute_us += us;
  return kernel(b, &k);
}

static double ring_us(const train_shape_t *s, double bytes) {
  return s->lat_us + bytes * (double)(s->ranks - 1) / (double)s->ranks / s->bw_bytes_per_us;
}

/* A collective and its wait. */
static gca_status_t collective(builder_t *b, const char *name, const char *kind, const char *in,
                               const char *out, double bytes) {
  gca_op_desc_t d = GCA_OP_DESC_INIT;
  d.name = name;
  d.kind = GCA_OP_COLLECTIVE;
  d.collective = kind;
  d.comm = "dp";
  d.us = ring_us(b->s, bytes);
  d.reads = &in;
  d.nreads = 1;
  d.writes = &out;
  d.nwrites = 1;
  CK(gca_opgraph_add_op(b->g, &d));
  TOOL_CHECK(kernel(b, &(train_kernel_t){.kind = TK_NONE}));
  name_t w;
  snprintf(w, sizeof(w), "%s_wait", name);
  gca_op_desc_t wd = GCA_OP_DESC_INIT;
  wd.name = w;
  wd.kind = GCA_OP_WAIT;
  wd.waits = name;
  CK(gca_opgraph_add_op(b->g, &wd));
  return kernel(b, &(train_kernel_t){.kind = TK_NONE});
}

static double gemm_us(const train_shape_t *s, uint32_t m, uint32_t n, uint32_t k) {
  return 2.0 * m * n * k / s->flops_per_us;
}

static double bytes_us(const train_shape_t *s, double bytes) {
  return bytes / s->bytes_per_us;
}

static train_kernel_t gemm(uint32_t m, uint32_t n, uint32_t k, uint32_t flags, size_t a_off,
                           size_t b_off, size_t c_off) {
  return (train_kernel_t){.kind = TK_GEMM,
                          .m = m,
                          .n = n,
                          .k = k,
                          .flags = flags,
                          .a_off = a_off,
                          .b_off = b_off,
                          .c_off = c_off};
}

static train_kernel_t ew(gca_ew_op_t o, float s, uint32_t u, size_t count) {
  return (train_kernel_t){.kind = TK_EW, .ew = o, .s = s, .u = u, .count = count};
}

/* The copy-in of layer l's shard grouped with its all-gather into `full`. */
static gca_status_t gather(builder_t *b, const char *tag, int l) {
  name_t ci, ag, shard, in, full;
  snprintf(ci, NAME, "%s%d_copy_in", tag, l);
  snprintf(ag, NAME, "ag_%s%d", tag, l);
  snprintf(shard, NAME, "w%d_shard", l);
  snprintf(in, NAME, "%s%d_in", tag, l);
  snprintf(full, NAME, "%s%d", tag, l);
  size_t bytes = b->m->shard_elems * 4;
  const char *r[] = {shard};
  train_kernel_t k = {.kind = TK_COPY, .count = bytes};
  TOOL_CHECK(
      op(b, ci, bytes_us(b->s, 2.0 * (double)bytes), r, 1, in, NULL, NULL, k, shard, NULL, in));
  TOOL_CHECK(collective(b, ag, "all_gather", in, full, (double)b->m->flat_elems * 4));
  const char *grp[] = {ci, ag};
  CK(gca_opgraph_add_group(b->g, grp, 2));
  return GCA_OK;
}

static gca_status_t buffers(builder_t *b) {
  const train_shape_t *s = b->s;
  int64_t bh = (int64_t)s->batch * s->hidden * 4, bf = (int64_t)s->batch * s->ffn * 4;
  int64_t shard = (int64_t)b->m->shard_elems * 4, flat = (int64_t)b->m->flat_elems * 4;
  CK(gca_opgraph_add_comm(b->g, "dp"));
  TOOL_CHECK(buf(b, "x0", bh, GCA_BUFFER_INPUT));
  TOOL_CHECK(buf(b, "target", bh, GCA_BUFFER_INPUT));
  TOOL_CHECK(buf(b, "loss", 4, GCA_BUFFER_OUTPUT));
  TOOL_CHECK(buf(b, "diff", bh, GCA_BUFFER_TEMP));
  for (int l = 0; l < s->layers; l++) {
    struct {
      const char *fmt;
      int64_t bytes;
      gca_buffer_kind_t kind;
    } t[] = {
        {"w%d_shard", shard, GCA_BUFFER_INPUT}, {"fw%d_in", shard, GCA_BUFFER_TEMP},
        {"fw%d", flat, GCA_BUFFER_TEMP},        {"h%d", bf, GCA_BUFFER_TEMP},
        {"a%d", bf, GCA_BUFFER_TEMP},           {"r%d", bf, GCA_BUFFER_TEMP},
        {"y%d", bh, GCA_BUFFER_TEMP},           {"bw%d_in", shard, GCA_BUFFER_TEMP},
        {"bw%d", flat, GCA_BUFFER_TEMP},        {"dd%d", bf, GCA_BUFFER_TEMP},
        {"gw%d", flat, GCA_BUFFER_TEMP},        {"gs%d", shard, GCA_BUFFER_TEMP},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
      name_t n;
      snprintf(n, NAME, t[i].fmt, l);
      TOOL_CHECK(buf(b, n, t[i].bytes, t[i].kind));
    }
  }
  return GCA_OK;
}

static gca_status_t forward(builder_t *b, int l) {
  const train_shape_t *s = b->s;
  uint32_t B = s->batch, H = s->hidden, F = s->ffn;
  size_t bf = (size_t)B * F, bh = (size_t)B * H;
  name_t x, fw, h, a, r, d, y, xn, n;
  snprintf(x, NAME, "x%d", l);
  snprintf(fw, NAME, "fw%d", l);
  snprintf(h, NAME, "h%d", l);
  snprintf(a, NAME, "a%d", l);
  snprintf(r, NAME, "r%d", l);
  snprintf(d, NAME, "d%d", l);
  snprintf(y, NAME, "y%d", l);
  snprintf(xn, NAME, "x%d", l + 1);
  TOOL_CHECK(gather(b, "fw", l));
  float keep = 1.0f - s->dropout;
  uint32_t thr = (uint32_t)((double)s->dropout * 4294967296.0);
  const char *r1[] = {x, fw};
  snprintf(n, NAME, "fc1_%d", l);
  TOOL_CHECK(
      op(b, n, gemm_us(s, B, F, H), r1, 2, h, NULL, NULL, gemm(B, F, H, 0, 0, 0, 0), x, fw, h));
  const char *r2[] = {h};
  snprintf(n, NAME, "relu%d", l);
  TOOL_CHECK(op(b, n, bytes_us(s, 8.0 * (double)bf), r2, 1, a, NULL, NULL,
                ew(GCA_EW_RELU, 0, 0, bf), h, NULL, a));
  snprintf(n, NAME, "rng%d", l);
  TOOL_CHECK(op(b, n, bytes_us(s, 4.0 * (double)bf), NULL, 0, r, NULL, NULL,
                (train_kernel_t){.kind = TK_RNG, .count = bf}, NULL, NULL, r));
  const char *r3[] = {r};
  snprintf(n, NAME, "dropout%d", l);
  TOOL_CHECK(op(b, n, bytes_us(s, 12.0 * (double)bf), r3, 1, NULL, a, d,
                ew(GCA_EW_DROPOUT, 1.0f / keep, thr, bf), d, r, d));
  const char *r4[] = {d, fw};
  snprintf(n, NAME, "fc2_%d", l);
  TOOL_CHECK(op(b, n, gemm_us(s, B, H, F), r4, 2, y, NULL, NULL,
                gemm(B, H, F, 0, 0, (size_t)H * F, 0), d, fw, y));
  const char *r5[] = {x};
  snprintf(n, NAME, "residual%d", l);
  return op(b, n, bytes_us(s, 12.0 * (double)bh), r5, 1, NULL, y, xn, ew(GCA_EW_ADD, 0, 0, bh), xn,
            x, xn);
}

static gca_status_t backward(builder_t *b, int l) {
  const train_shape_t *s = b->s;
  uint32_t B = s->batch, H = s->hidden, F = s->ffn;
  size_t bf = (size_t)B * F, hf = (size_t)H * F;
  name_t g, gn, bw, dd, da, dh, d, r, h, x, gw, gwf, gs, w, wu, n;
  snprintf(gn, NAME, "g%d", l + 1);
  snprintf(g, NAME, "g%d", l);
  snprintf(bw, NAME, "bw%d", l);
  snprintf(dd, NAME, "dd%d", l);
  snprintf(da, NAME, "da%d", l);
  snprintf(dh, NAME, "dh%d", l);
  snprintf(d, NAME, "d%d", l);
  snprintf(r, NAME, "r%d", l);
  snprintf(h, NAME, "h%d", l);
  snprintf(x, NAME, "x%d", l);
  snprintf(gw, NAME, "gw%d", l);
  snprintf(gwf, NAME, "gw%d_full", l);
  snprintf(gs, NAME, "gs%d", l);
  snprintf(w, NAME, "w%d_shard", l);
  snprintf(wu, NAME, "w%d_shard_new", l);
  TOOL_CHECK(gather(b, "bw", l));
  const char *r1[] = {gn, bw};
  snprintf(n, NAME, "grad_d%d", l);
  TOOL_CHECK(op(b, n, gemm_us(s, B, F, H), r1, 2, dd, NULL, NULL,
                gemm(B, F, H, GCA_GEMM_TRANS_B, 0, hf, 0), gn, bw, dd));
  const char *r2[] = {d, gn};
  snprintf(n, NAME, "grad_w2_%d", l);
  TOOL_CHECK(op(b, n, gemm_us(s, F, H, B), r2, 2, gw, NULL, NULL,
                gemm(F, H, B, GCA_GEMM_TRANS_A, 0, 0, hf), d, gn, gw));
  float keep = 1.0f - s->dropout;
  uint32_t thr = (uint32_t)((double)s->dropout * 4294967296.0);
  const char *r3[] = {r};
  snprintf(n, NAME, "dropout_bw%d", l);
  TOOL_CHECK(op(b, n, bytes_us(s, 12.0 * (double)bf), r3, 1, NULL, dd, da,
                ew(GCA_EW_DROPOUT, 1.0f / keep, thr, bf), da, r, da));
  const char *r4[] = {h};
  snprintf(n, NAME, "relu_bw%d", l);
  TOOL_CHECK(op(b, n, bytes_us(s, 12.0 * (double)bf), r4, 1, NULL, da, dh,
                ew(GCA_EW_RELU_GRAD, 0, 0, bf), dh, h, dh));
  const char *r5[] = {x, dh};
  snprintf(n, NAME, "grad_w1_%d", l);
  TOOL_CHECK(op(b, n, gemm_us(s, H, F, B), r5, 2, NULL, gw, gwf,
                gemm(H, F, B, GCA_GEMM_TRANS_A, 0, 0, 0), x, dh, gwf));
  if (l > 0) {
    const char *r6[] = {dh, bw};
    snprintf(n, NAME, "grad_x%d", l);
    TOOL_CHECK(op(b, n, gemm_us(s, B, H, F), r6, 2, NULL, gn, g,
                  gemm(B, H, F, GCA_GEMM_TRANS_B | GCA_GEMM_ACCUMULATE, 0, 0, 0), dh, bw, g));
  }
  snprintf(n, NAME, "rs%d", l);
  TOOL_CHECK(collective(b, n, "reduce_scatter", gwf, gs, (double)b->m->flat_elems * 4));
  const char *r7[] = {gs};
  snprintf(n, NAME, "sgd%d", l);
  return op(b, n, bytes_us(s, 12.0 * (double)b->m->shard_elems), r7, 1, NULL, w, wu,
            ew(GCA_EW_AXPY, -s->lr / (float)s->ranks, 0, b->m->shard_elems), wu, gs, wu);
}

static gca_status_t check_shape(const train_shape_t *s) {
  if (s->layers < 1 || s->layers > 64)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "train: layers %d is not in 1..64", s->layers);
  if (s->ranks < 1 || s->ranks > 8)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "train: ranks %d is not in 1..8", s->ranks);
  if (s->batch < 1 || s->batch > 4096 || s->hidden < 1 || s->hidden > 4096 || s->ffn < 1 ||
      s->ffn > 16384)
    return tool_error(GCA_ERR_INVALID_ARGUMENT,
                      "train: batch %u, hidden %u and ffn %u must be in 1..4096, 1..4096, 1..16384",
                      s->batch, s->hidden, s->ffn);
  if ((2ull * s->hidden * s->ffn) % (uint64_t)s->ranks != 0)
    return tool_error(GCA_ERR_INVALID_ARGUMENT,
                      "train: the flat parameter (2 x hidden %u x ffn %u) does not split "
                      "evenly over %d ranks",
                      s->hidden, s->ffn, s->ranks);
  if (!(s->dropout >= 0 && s->dropout < 1))
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "train: dropout %g is not in [0, 1)",
                      (double)s->dropout);
  if (!(s->lr >= 0) || !(s->flops_per_us > 0) || !(s->bytes_per_us > 0) || !(s->lat_us >= 0) ||
      !(s->bw_bytes_per_us > 0))
    return tool_error(GCA_ERR_INVALID_ARGUMENT,
                      "train: lr, rates, latency and bandwidth must be positive (lr, latency may "
                      "be 0)");
  return GCA_OK;
}

gca_status_t train_model_build(const train_shape_t *s, train_model_t *m) {
  memset(m, 0, sizeof(*m));
  TOOL_CHECK(check_shape(s));
  m->shape = *s;
  m->flat_elems = 2 * (size_t)s->hidden * s->ffn;
  m->shard_elems = m->flat_elems / (size_t)s->ranks;
  builder_t b = {.m = m, .s = s};
  gca_status_t st = gca_opgraph_create(&b.g);
  if (st != GCA_OK)
    return tool_error_gca(st, "train: gca_opgraph_create");
  m->g = b.g;
  if (st == GCA_OK)
    st = buffers(&b);
  for (int l = 0; l < s->layers && st == GCA_OK; l++)
    st = forward(&b, l);
  name_t xl, gl;
  snprintf(xl, NAME, "x%d", s->layers);
  snprintf(gl, NAME, "g%d", s->layers);
  size_t bh = (size_t)s->batch * s->hidden;
  const char *r1[] = {xl, "target"}, *r2[] = {"diff"};
  if (st == GCA_OK)
    st = op(&b, "loss_diff", bytes_us(s, 12.0 * (double)bh), r1, 2, "diff", NULL, NULL,
            ew(GCA_EW_SUB, 0, 0, bh), xl, "target", "diff");
  if (st == GCA_OK) {
    train_kernel_t k = {.kind = TK_DOT, .s = 0.5f / (float)bh, .count = bh};
    st = op(&b, "loss", bytes_us(s, 4.0 * (double)bh), r2, 1, "loss", NULL, NULL, k, "diff", "diff",
            "loss");
  }
  if (st == GCA_OK)
    st = op(&b, "loss_grad", bytes_us(s, 8.0 * (double)bh), NULL, 0, NULL, "diff", gl,
            ew(GCA_EW_SCALE, 1.0f / (float)bh, 0, bh), gl, NULL, gl);
  for (int l = s->layers - 1; l >= 0 && st == GCA_OK; l--)
    st = backward(&b, l);
  if (st == GCA_OK && (st = gca_opgraph_finish(b.g)) != GCA_OK)
    tool_error_gca(st, "train: the step's op graph");
  m->kernels = b.k;
  m->nops = b.nk;
  if (st != GCA_OK) {
    train_model_free(m);
    return st;
  }
  m->shard_buf = malloc((size_t)s->layers * sizeof(size_t));
  if (!m->shard_buf) {
    train_model_free(m);
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "train: no host memory");
  }
  for (int l = 0; l < s->layers; l++) {
    name_t w;
    snprintf(w, NAME, "w%d_shard", l);
    m->shard_buf[l] = idx(&b, w);
  }
  m->x0_buf = idx(&b, "x0");
  m->target_buf = idx(&b, "target");
  m->loss_buf = idx(&b, "loss");
  return GCA_OK;
}

void train_model_free(train_model_t *m) {
  gca_opgraph_destroy(m->g);
  free(m->kernels);
  free(m->shard_buf);
  memset(m, 0, sizeof(*m));
}

gca_status_t train_compute(void *ctx, size_t opi, void *const *bufs, gca_stream_t stream) {
  const train_exec_t *x = ctx;
  const train_kernel_t *k = &x->m->kernels[opi];
  char *a = k->a != (size_t)-1 ? bufs[k->a] : NULL;
  char *b = k->b != (size_t)-1 ? bufs[k->b] : NULL;
  char *c = bufs[k->c];
  switch (k->kind) {
  case TK_COPY:
    return gca_memcpy_async(c, a, k->count, stream);
  case TK_GEMM:
    return gca_kernel_gemm_f32(c + 4 * k->c_off, a + 4 * k->a_off, b + 4 * k->b_off, k->m, k->n,
                               k->k, k->flags, stream);
  case TK_EW:
    return gca_kernel_ew_f32(k->ew, c, a, b, k->s, k->u, k->count, stream);
  case TK_DOT:
    return gca_kernel_dot_f32(c, a, b, k->count, k->s, stream);
  case TK_RNG:
    return gca_graph_rng_uniform_u32(x->rng, c, k->count, stream);
  case TK_NONE:
    break;
  }
  return tool_error(GCA_ERR_INTERNAL, "train: op %zu has no kernel", opi);
}
