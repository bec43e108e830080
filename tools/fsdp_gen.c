/* SPDX-License-Identifier: Apache-2.0 */
/* fsdp_gen.c - builds FSDP step graphs (fsdp_gen.h) through the public API.
 *
 * The one idea: names are formatted per layer and handed to the builder, so
 * a generated graph is validated exactly like a loaded one. */
#include "fsdp_gen.h"

#include <stdio.h>

#define NAME 48

typedef char name_t[NAME];

static gca_status_t compute(gca_opgraph_t *g, const char *name, double us, const char *const *reads,
                            size_t nr, const char *const *writes, size_t nw) {
  gca_op_desc_t d = GCA_OP_DESC_INIT;
  d.name = name;
  d.kind = GCA_OP_COMPUTE;
  d.us = us;
  d.reads = reads;
  d.nreads = nr;
  d.writes = writes;
  d.nwrites = nw;
  return gca_opgraph_add_op(g, &d);
}

static gca_status_t collective(gca_opgraph_t *g, const fsdp_shape_t *s, const char *name,
                               const char *kind, const char *in, const char *out) {
  gca_op_desc_t d = GCA_OP_DESC_INIT;
  d.name = name;
  d.kind = GCA_OP_COLLECTIVE;
  d.collective = kind;
  d.comm = "dp";
  d.us = s->lat_us +
         (double)s->param_bytes * (double)(s->ranks - 1) / (double)s->ranks / s->bw_bytes_per_us;
  d.reads = &in;
  d.nreads = 1;
  d.writes = &out;
  d.nwrites = 1;
  gca_status_t st = gca_opgraph_add_op(g, &d);
  if (st != GCA_OK)
    return st;
  name_t w;
  snprintf(w, sizeof(w), "%s_wait", name);
  gca_op_desc_t wd = GCA_OP_DESC_INIT;
  wd.name = w;
  wd.kind = GCA_OP_WAIT;
  wd.waits = name;
  return gca_opgraph_add_op(g, &wd);
}

/* Copy-in of layer l's shard grouped with its all-gather into `full`. */
static gca_status_t gather(gca_opgraph_t *g, const fsdp_shape_t *s, const char *tag, int l) {
  name_t ci, ag, shard, in, full;
  snprintf(ci, NAME, "%s%d_copy_in", tag, l);
  snprintf(ag, NAME, "ag_%s%d", tag, l);
  snprintf(shard, NAME, "w%d_shard", l);
  snprintf(in, NAME, "%s%d_in", tag, l);
  snprintf(full, NAME, "%s%d", tag, l);
  const char *r[] = {shard}, *w[] = {in};
  gca_status_t st = compute(g, ci, 0.01, r, 1, w, 1);
  if (st == GCA_OK)
    st = collective(g, s, ag, "all_gather", in, full);
  const char *grp[] = {ci, ag};
  if (st == GCA_OK)
    st = gca_opgraph_add_group(g, grp, 2);
  return st;
}

static gca_status_t buffers(gca_opgraph_t *g, const fsdp_shape_t *s) {
  gca_status_t st = gca_opgraph_add_comm(g, "dp");
  int64_t shard = s->param_bytes / s->ranks;
  if (st == GCA_OK)
    st = gca_opgraph_add_buffer(g, "x0", s->x_bytes, GCA_BUFFER_INPUT);
  for (int l = 0; l < s->layers && st == GCA_OK; l++) {
    name_t n[12];
    snprintf(n[0], NAME, "w%d_shard", l);
    snprintf(n[1], NAME, "fw%d_in", l);
    snprintf(n[2], NAME, "fw%d", l);
    snprintf(n[3], NAME, "fw%d_v", l);
    snprintf(n[4], NAME, "act%d", l);
    snprintf(n[5], NAME, "tmp%d", l);
    snprintf(n[6], NAME, "x%d", l + 1);
    snprintf(n[7], NAME, "bw%d_in", l);
    snprintf(n[8], NAME, "bw%d", l);
    snprintf(n[9], NAME, "bw%d_v", l);
    snprintf(n[10], NAME, "dtmp%d", l);
    snprintf(n[11], NAME, "gw%d", l);
    st = gca_opgraph_add_buffer(g, n[0], shard, GCA_BUFFER_INPUT);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[1], shard, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[2], s->param_bytes, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_view(g, n[3], n[2]);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[4], s->act_saved_bytes, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[5], s->act_temp_bytes, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[6], s->x_bytes, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[7], shard, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[8], s->param_bytes, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_view(g, n[9], n[8]);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[10], s->act_temp_bytes, GCA_BUFFER_TEMP);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, n[11], s->param_bytes, GCA_BUFFER_TEMP);
    name_t gs, gx;
    snprintf(gs, NAME, "gs%d", l);
    snprintf(gx, NAME, "g%d", l);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, gs, shard, GCA_BUFFER_OUTPUT);
    if (st == GCA_OK)
      st = gca_opgraph_add_buffer(g, gx, s->x_bytes, l == 0 ? GCA_BUFFER_OUTPUT : GCA_BUFFER_TEMP);
  }
  name_t gl;
  snprintf(gl, NAME, "g%d", s->layers);
  if (st == GCA_OK)
    st = gca_opgraph_add_buffer(g, gl, s->x_bytes, GCA_BUFFER_TEMP);
  return st;
}

gca_status_t fsdp_graph(const fsdp_shape_t *s, gca_opgraph_t **out) {
  gca_opgraph_t *g = NULL;
  *out = NULL;
  if (s->layers < 1 || s->ranks < 1)
    return GCA_ERR_INVALID_ARGUMENT;
  gca_status_t st = gca_opgraph_create(&g);
  if (st == GCA_OK)
    st = buffers(g, s);
  for (int l = 0; l < s->layers && st == GCA_OK; l++) {
    name_t x, fv, act, tmp, xn, a, u, d;
    snprintf(x, NAME, "x%d", l);
    snprintf(fv, NAME, "fw%d_v", l);
    snprintf(act, NAME, "act%d", l);
    snprintf(tmp, NAME, "tmp%d", l);
    snprintf(xn, NAME, "x%d", l + 1);
    snprintf(a, NAME, "attn%d", l);
    snprintf(u, NAME, "mlp_up%d", l);
    snprintf(d, NAME, "mlp_down%d", l);
    st = gather(g, s, "fw", l);
    const char *r1[] = {x, fv}, *w1[] = {act};
    const char *r2[] = {act, fv}, *w2[] = {tmp};
    const char *r3[] = {tmp, fv}, *w3[] = {xn};
    if (st == GCA_OK)
      st = compute(g, a, 0.4 * s->fwd_us, r1, 2, w1, 1);
    if (st == GCA_OK)
      st = compute(g, u, 0.3 * s->fwd_us, r2, 2, w2, 1);
    if (st == GCA_OK)
      st = compute(g, d, 0.3 * s->fwd_us, r3, 2, w3, 1);
  }
  name_t xl, gl;
  snprintf(xl, NAME, "x%d", s->layers);
  snprintf(gl, NAME, "g%d", s->layers);
  const char *lr[] = {xl}, *lw[] = {gl};
  if (st == GCA_OK)
    st = compute(g, "loss", 1.0, lr, 1, lw, 1);
  for (int l = s->layers - 1; l >= 0 && st == GCA_OK; l--) {
    name_t gn, bv, act, x, dt, gx, gw, gs, d1, d2, rs;
    snprintf(gn, NAME, "g%d", l + 1);
    snprintf(bv, NAME, "bw%d_v", l);
    snprintf(act, NAME, "act%d", l);
    snprintf(x, NAME, "x%d", l);
    snprintf(dt, NAME, "dtmp%d", l);
    snprintf(gx, NAME, "g%d", l);
    snprintf(gw, NAME, "gw%d", l);
    snprintf(gs, NAME, "gs%d", l);
    snprintf(d1, NAME, "grad_mlp%d", l);
    snprintf(d2, NAME, "grad_attn%d", l);
    snprintf(rs, NAME, "rs%d", l);
    st = gather(g, s, "bw", l);
    const char *r1[] = {gn, bv, act}, *w1[] = {dt};
    const char *r2[] = {dt, bv, x}, *w2[] = {gx, gw};
    if (st == GCA_OK)
      st = compute(g, d1, 0.8 * s->fwd_us, r1, 3, w1, 1);
    if (st == GCA_OK)
      st = compute(g, d2, 1.2 * s->fwd_us, r2, 3, w2, 2);
    if (st == GCA_OK)
      st = collective(g, s, rs, "reduce_scatter", gw, gs);
  }
  if (st == GCA_OK)
    st = gca_opgraph_finish(g);
  if (st != GCA_OK) {
    gca_opgraph_destroy(g);
    return st;
  }
  *out = g;
  return GCA_OK;
}
