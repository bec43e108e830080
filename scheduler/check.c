/* SPDX-License-Identifier: Apache-2.0 */
/* check.c - checks an order of a graph's ops against every rule of the
 * format (DESIGN.md "Op graph", Note [Op graph rules]).
 *
 * The one idea: this is a second reading of the format, written apart from
 * the edges opgraph.c derives for the scheduler — it recomputes which op makes
 * each name usable and checks each rule against positions — so a scheduler
 * bug in the edges cannot hide behind the same bug in its checker. */
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

typedef struct ck {
  const gca_opgraph_t *g;
  size_t *pos;   /* pos[op]: its position in the order */
  size_t *maker; /* maker[b]: the op writing b or mutating into it */
  bool *vers;    /* vers[b]: a mutation makes b */
} ck_t;

/* The op whose position makes b usable, GCA__NONE for the start. */
static size_t usable(const ck_t *c, size_t b) {
  const gca_opgraph_t *g = c->g;
  while (c->maker[b] == GCA__NONE && g->bufs[b].parent != GCA__NONE)
    b = g->bufs[b].parent; /* resolve_aliases proved the chain finite */
  size_t m = c->maker[b];
  if (m == GCA__NONE)
    return GCA__NONE;
  return g->ops[m].kind == GCA_OP_COLLECTIVE ? g->ops[m].wait : m;
}

/* The version of the storage a name belongs to: the first name along its
 * alias chain that a mutation made (vers[]), else the storage's first name. */
static size_t version(const gca_opgraph_t *g, const bool *vers, size_t b) {
  while (!vers[b] && g->bufs[b].parent != GCA__NONE)
    b = g->bufs[b].parent;
  return b;
}

static gca_status_t check_reads(const ck_t *c, size_t v) {
  const gca_opgraph_t *g = c->g;
  const gca__sop_t *o = &g->ops[v];
  for (size_t k = 0; k < o->nreads + o->nmut; k++) {
    size_t b = k < o->nreads ? o->reads[k] : o->mold[k - o->nreads];
    size_t u = usable(c, b);
    if (u != GCA__NONE && u != v && c->pos[u] > c->pos[v])
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "op '%s' (step %zu) %s '%s' before '%s' (step %zu) makes it usable",
                        o->name, c->pos[v], k < o->nreads ? "reads" : "mutates", g->bufs[b].name,
                        g->ops[u].name, c->pos[u]);
  }
  return GCA_OK;
}

static gca_status_t check_mutations(const ck_t *c, size_t v) {
  const gca_opgraph_t *g = c->g;
  const gca__sop_t *o = &g->ops[v];
  for (size_t k = 0; k < o->nmut; k++)
    for (size_t u = 0; u < v; u++) { /* readers earlier in program order */
      const gca__sop_t *r = &g->ops[u];
      for (size_t j = 0; j < r->nreads; j++) {
        if (version(g, c->vers, r->reads[j]) != version(g, c->vers, o->mold[k]))
          continue;
        size_t at = r->kind == GCA_OP_COLLECTIVE ? r->wait : u;
        if (c->pos[at] > c->pos[v])
          return gca__error(GCA_ERR_INVALID_ARGUMENT,
                            "op '%s' (step %zu) mutates '%s' while '%s' (step %zu) still reads it",
                            o->name, c->pos[v], g->bufs[o->mold[k]].name, g->ops[at].name,
                            c->pos[at]);
      }
    }
  return GCA_OK;
}

GCA_API gca_status_t gca_opgraph_check_order(const gca_opgraph_t *g, const size_t *order,
                                             size_t n) {
  GCA_CHECK(gca__check_graph_arg("opgraph_check_order", g, order, n));
  ck_t c = {.g = g};
  c.pos = malloc((n + 1) * sizeof(size_t));
  c.maker = malloc((g->nbufs + 1) * sizeof(size_t));
  c.vers = calloc(g->nbufs + 1, sizeof(bool));
  gca_status_t st = GCA_OK;
  if (!c.pos || !c.maker || !c.vers) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_check_order: no host memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    c.pos[i] = GCA__NONE;
  for (size_t i = 0; i < n && st == GCA_OK; i++) {
    if (order[i] >= n)
      st = gca__error(GCA_ERR_INVALID_ARGUMENT, "step %zu is op %zu; the graph has %zu ops", i,
                      order[i], n);
    else if (c.pos[order[i]] != GCA__NONE)
      st = gca__error(GCA_ERR_INVALID_ARGUMENT, "op '%s' appears twice (steps %zu and %zu)",
                      g->ops[order[i]].name, c.pos[order[i]], i);
    else
      c.pos[order[i]] = i;
  }
  if (st != GCA_OK)
    goto out;
  for (size_t b = 0; b < g->nbufs; b++)
    c.maker[b] = GCA__NONE;
  for (size_t i = 0; i < n; i++) {
    const gca__sop_t *o = &g->ops[i];
    for (size_t k = 0; k < o->nwrites; k++)
      c.maker[o->writes[k]] = i;
    for (size_t k = 0; k < o->nmut; k++) {
      c.maker[o->mnew[k]] = i;
      c.vers[o->mnew[k]] = true;
    }
  }
  for (size_t v = 0; v < n && st == GCA_OK; v++) {
    const gca__sop_t *o = &g->ops[v];
    if (o->kind == GCA_OP_WAIT && c.pos[o->coll] > c.pos[v])
      st = gca__error(GCA_ERR_INVALID_ARGUMENT, "wait '%s' (step %zu) comes before '%s' (step %zu)",
                      o->name, c.pos[v], g->ops[o->coll].name, c.pos[o->coll]);
    if (st == GCA_OK)
      st = check_reads(&c, v);
    if (st == GCA_OK)
      st = check_mutations(&c, v);
  }
  for (size_t k = 0; k < g->ngroups && st == GCA_OK; k++)
    for (size_t j = 0; j + 1 < g->group_len[k] && st == GCA_OK; j++)
      if (c.pos[g->groups[k][j + 1]] != c.pos[g->groups[k][j]] + 1)
        st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "group %zu is not contiguous in its order: '%s' (step %zu) is not right "
                        "after '%s' (step %zu)",
                        k, g->ops[g->groups[k][j + 1]].name, c.pos[g->groups[k][j + 1]],
                        g->ops[g->groups[k][j]].name, c.pos[g->groups[k][j]]);
  for (size_t k = 0; k < g->nafter && st == GCA_OK; k++)
    if (c.pos[g->after_e[k]] > c.pos[g->after_l[k]])
      st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "op '%s' (step %zu) must come after '%s' (step %zu) (order_after)",
                      g->ops[g->after_l[k]].name, c.pos[g->after_l[k]], g->ops[g->after_e[k]].name,
                      c.pos[g->after_e[k]]);
out:
  free(c.pos);
  free(c.maker);
  free(c.vers);
  return st;
}
