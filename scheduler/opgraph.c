/* SPDX-License-Identifier: Apache-2.0 */
/* opgraph.c - building an op graph through the API and finishing it: every
 * name resolved, the graph validated, and the dependency edges derived once
 * for the scheduler (Note [Op graph rules]).
 *
 * The one idea: everything a later stage relies on is checked at finish, with
 * an error that names the op or buffer, so the estimator, the checker and the
 * scheduler work on a graph that is known to be well formed and whose program
 * order is a valid schedule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

/* Note [Op graph rules]: the format's rules (DESIGN.md "Op graph") as edges
 * "u before v", with one consequence the format implies made explicit:
 *   - reads and mutations: v comes after the op that makes each name it reads
 *     or mutates usable. A name is made usable by the op that writes it or
 *     mutates into it (a collective: by its wait); a view nothing writes is
 *     usable when the name it views is; an input's storage is usable from the
 *     start.
 *   - a wait comes after its collective.
 *   - a mutation old -> new comes after every op that reads old, or a view of
 *     old, earlier in program order (a collective: after its wait): once the
 *     storage holds the new value the old one is gone, so such readers must
 *     have finished (the format names the collectives' case; compute readers
 *     follow the same reasoning). Reading old after its mutation in program
 *     order is an error.
 *   - order_after pairs; groups are kept contiguous by the scheduler (not as
 *     edges).
 * Every edge points forward in a valid program order; finish checks the
 * program order with the independent checker (check.c), so a cycle or a
 * misplaced op is reported with the names involved. */

/* ---- name tables ---- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

gca_status_t gca__names_put(gca__names_t *t, char *key, size_t val, size_t *existing) {
  *existing = GCA__NONE;
  if (2 * (t->n + 1) > t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 64;
    char **keys = calloc(ncap, sizeof(*keys));
    size_t *vals = calloc(ncap, sizeof(*vals));
    if (!keys || !vals) {
      free(keys);
      free(vals);
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph: no host memory for a name table");
    }
    for (size_t i = 0; i < t->cap; i++)
      if (t->keys[i]) {
        size_t j = hash_str(t->keys[i]) & (ncap - 1);
        while (keys[j])
          j = (j + 1) & (ncap - 1);
        keys[j] = t->keys[i];
        vals[j] = t->vals[i];
      }
    free(t->keys);
    free(t->vals);
    t->keys = keys;
    t->vals = vals;
    t->cap = ncap;
  }
  size_t j = hash_str(key) & (t->cap - 1);
  while (t->keys[j]) {
    if (strcmp(t->keys[j], key) == 0) {
      *existing = t->vals[j];
      return GCA_OK;
    }
    j = (j + 1) & (t->cap - 1);
  }
  t->keys[j] = key;
  t->vals[j] = val;
  t->n++;
  return GCA_OK;
}

size_t gca__names_get(const gca__names_t *t, const char *key) {
  if (!t->cap || !key)
    return GCA__NONE;
  size_t j = hash_str(key) & (t->cap - 1);
  while (t->keys[j]) {
    if (strcmp(t->keys[j], key) == 0)
      return t->vals[j];
    j = (j + 1) & (t->cap - 1);
  }
  return GCA__NONE;
}

void gca__names_free(gca__names_t *t) {
  free(t->keys); /* the keys belong to the buffers and ops */
  free(t->vals);
  memset(t, 0, sizeof(*t));
}

/* ---- building ---- */

static gca_status_t check_open(const char *fn, const gca_opgraph_t *g) {
  if (!g)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: graph is NULL", fn);
  if (g->finished)
    return gca__error(GCA_ERR_INVALID_STATE, "%s: the graph is finished", fn);
  return GCA_OK;
}

static gca_status_t check_name(const char *fn, const char *what, const char *name) {
  if (!name || !*name)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s has no name", fn, what);
  return GCA_OK;
}

static bool grow(void **v, size_t *cap, size_t n, size_t esz) {
  if (n < *cap)
    return true;
  size_t ncap = *cap ? *cap * 2 : 16;
  void *nv = realloc(*v, ncap * esz);
  if (!nv)
    return false;
  memset((char *)nv + *cap * esz, 0, (ncap - *cap) * esz);
  *v = nv;
  *cap = ncap;
  return true;
}

static char *dup_or_null(const char *s, bool *failed) {
  if (!s)
    return NULL;
  char *d = strdup(s);
  if (!d)
    *failed = true;
  return d;
}

GCA_API gca_status_t gca_opgraph_create(gca_opgraph_t **graph) {
  if (!graph)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "opgraph_create: graph is NULL");
  *graph = calloc(1, sizeof(**graph));
  if (!*graph)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_create: no host memory");
  return GCA_OK;
}

static void free_strv(char **v, size_t n) {
  for (size_t i = 0; i < n && v; i++)
    free(v[i]);
  free(v);
}

GCA_API void gca_opgraph_destroy(gca_opgraph_t *g) {
  if (!g)
    return;
  for (size_t i = 0; i < g->nbufs; i++) {
    free(g->bufs[i].name);
    free(g->bufs[i].alias_of);
  }
  free(g->bufs);
  for (size_t i = 0; i < g->nops; i++) {
    gca__sop_t *o = &g->ops[i];
    free(o->name);
    free(o->collective);
    free(o->comm);
    free(o->waits);
    free_strv(o->reads_s, o->nreads);
    free_strv(o->writes_s, o->nwrites);
    free_strv(o->mold_s, o->nmut);
    free_strv(o->mnew_s, o->nmut);
    free(o->reads);
    free(o->writes);
    free(o->mold);
    free(o->mnew);
    free(o->preds);
  }
  free(g->ops);
  free_strv(g->comms, g->ncomms);
  for (size_t i = 0; i < g->ngroups; i++) {
    free_strv(g->groups_s[i], g->group_len[i]);
    if (g->groups)
      free(g->groups[i]);
  }
  free(g->groups_s);
  free(g->groups);
  free(g->group_len);
  free_strv(g->after_later, g->nafter);
  free_strv(g->after_earlier, g->nafter);
  free(g->after_l);
  free(g->after_e);
  gca__names_free(&g->buf_names);
  gca__names_free(&g->op_names);
  free(g);
}

GCA_API gca_status_t gca_opgraph_add_comm(gca_opgraph_t *g, const char *comm) {
  GCA_CHECK(check_open("opgraph_add_comm", g));
  GCA_CHECK(check_name("opgraph_add_comm", "a communicator", comm));
  for (size_t i = 0; i < g->ncomms; i++)
    if (strcmp(g->comms[i], comm) == 0)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "opgraph_add_comm: communicator '%s' is declared twice", comm);
  if (!grow((void **)&g->comms, &g->capcomms, g->ncomms, sizeof(char *)) ||
      !(g->comms[g->ncomms] = strdup(comm)))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_add_comm: no host memory");
  g->ncomms++;
  return GCA_OK;
}

static gca_status_t add_buf(const char *fn, gca_opgraph_t *g, const char *name, int64_t bytes,
                            gca_buffer_kind_t kind, const char *alias_of) {
  GCA_CHECK(check_open(fn, g));
  GCA_CHECK(check_name(fn, "a buffer", name));
  if (bytes < 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: buffer '%s' has a negative size (%lld)", fn,
                      name, (long long)bytes);
  if (kind != GCA_BUFFER_TEMP && kind != GCA_BUFFER_INPUT && kind != GCA_BUFFER_OUTPUT)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: buffer '%s' has an unknown kind %d", fn, name,
                      (int)kind);
  if (!grow((void **)&g->bufs, &g->capbufs, g->nbufs, sizeof(gca__sbuf_t)))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  gca__sbuf_t *b = &g->bufs[g->nbufs];
  bool failed = false;
  b->name = dup_or_null(name, &failed);
  b->alias_of = dup_or_null(alias_of, &failed);
  size_t existing;
  gca_status_t st = failed ? gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn)
                           : gca__names_put(&g->buf_names, b->name, g->nbufs, &existing);
  if (st == GCA_OK && existing != GCA__NONE)
    st = gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: buffer '%s' is declared twice", fn, name);
  if (st != GCA_OK) {
    free(b->name);
    free(b->alias_of);
    memset(b, 0, sizeof(*b));
    return st;
  }
  b->bytes = bytes;
  b->kind = kind;
  b->parent = b->storage = b->maker = GCA__NONE;
  g->nbufs++;
  return GCA_OK;
}

GCA_API gca_status_t gca_opgraph_add_buffer(gca_opgraph_t *g, const char *name, int64_t bytes,
                                            gca_buffer_kind_t kind) {
  return add_buf("opgraph_add_buffer", g, name, bytes, kind, NULL);
}

GCA_API gca_status_t gca_opgraph_add_view(gca_opgraph_t *g, const char *name,
                                          const char *alias_of) {
  GCA_CHECK(check_name("opgraph_add_view", "the viewed buffer", alias_of));
  return add_buf("opgraph_add_view", g, name, 0, GCA_BUFFER_TEMP, alias_of);
}

static char **dup_strv(const char *const *v, size_t n, bool *failed) {
  if (n == 0)
    return NULL;
  char **d = calloc(n, sizeof(*d));
  if (!d) {
    *failed = true;
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    d[i] = dup_or_null(v[i], failed);
  return d;
}

static void op_free_strings(gca__sop_t *o) {
  free(o->name);
  free(o->collective);
  free(o->comm);
  free(o->waits);
  free_strv(o->reads_s, o->nreads);
  free_strv(o->writes_s, o->nwrites);
  free_strv(o->mold_s, o->nmut);
  free_strv(o->mnew_s, o->nmut);
  memset(o, 0, sizeof(*o));
}

GCA_API gca_status_t gca_opgraph_add_op(gca_opgraph_t *g, const gca_op_desc_t *d) {
  static const char fn[] = "opgraph_add_op";
  GCA_CHECK(check_open(fn, g));
  if (!d || d->size < sizeof(gca_op_desc_t))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: desc is NULL or its size is not set", fn);
  GCA_CHECK(check_name(fn, "an op", d->name));
  const char *name = d->name;
  if (d->kind != GCA_OP_COMPUTE && d->kind != GCA_OP_COLLECTIVE && d->kind != GCA_OP_WAIT)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: op '%s' has an unknown kind %d", fn, name,
                      (int)d->kind);
  if (!(d->us >= 0) || !isfinite(d->us))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: op '%s' has a bad duration (%g us)", fn, name,
                      d->us);
  if ((d->nreads && !d->reads) || (d->nwrites && !d->writes) ||
      (d->nmutates && (!d->mutates_old || !d->mutates_new)))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: op '%s': a name array is NULL", fn, name);
  if (d->kind == GCA_OP_COLLECTIVE && (!d->comm || !*d->comm))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: collective '%s' has no communicator", fn,
                      name);
  if (d->kind == GCA_OP_WAIT) {
    if (!d->waits || !*d->waits)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: wait '%s' names no collective", fn, name);
    if (d->nreads || d->nwrites || d->nmutates || d->us > 0)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "%s: wait '%s' may not read, write, mutate or take time", fn, name);
  }
  if (d->kind == GCA_OP_COLLECTIVE && d->nmutates)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: collective '%s' may not mutate", fn, name);
  if (!grow((void **)&g->ops, &g->capops, g->nops, sizeof(gca__sop_t)))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  gca__sop_t *o = &g->ops[g->nops];
  bool failed = false;
  o->name = dup_or_null(name, &failed);
  o->kind = d->kind;
  o->us = d->us;
  o->collective = dup_or_null(d->kind == GCA_OP_COLLECTIVE ? d->collective : NULL, &failed);
  o->comm = dup_or_null(d->kind == GCA_OP_COLLECTIVE ? d->comm : NULL, &failed);
  o->waits = dup_or_null(d->kind == GCA_OP_WAIT ? d->waits : NULL, &failed);
  o->reads_s = dup_strv(d->reads, d->nreads, &failed);
  o->nreads = d->nreads;
  o->writes_s = dup_strv(d->writes, d->nwrites, &failed);
  o->nwrites = d->nwrites;
  o->mold_s = dup_strv(d->mutates_old, d->nmutates, &failed);
  o->mnew_s = dup_strv(d->mutates_new, d->nmutates, &failed);
  o->nmut = d->nmutates;
  size_t existing;
  gca_status_t st = failed ? gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn)
                           : gca__names_put(&g->op_names, o->name, g->nops, &existing);
  if (st == GCA_OK && existing != GCA__NONE)
    st = gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: op '%s' is declared twice", fn, name);
  if (st != GCA_OK) {
    op_free_strings(o);
    return st;
  }
  o->group = o->wait = o->coll = o->comm_idx = GCA__NONE;
  g->nops++;
  return GCA_OK;
}

GCA_API gca_status_t gca_opgraph_add_group(gca_opgraph_t *g, const char *const *names, size_t n) {
  static const char fn[] = "opgraph_add_group";
  GCA_CHECK(check_open(fn, g));
  if (!names || n == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: a group needs at least one op", fn);
  for (size_t i = 0; i < n; i++)
    GCA_CHECK(check_name(fn, "a group member", names[i]));
  if (!grow((void **)&g->groups_s, &g->capgroups, g->ngroups, sizeof(char **)))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  size_t cap = g->capgroups;
  size_t *lens = realloc(g->group_len, cap * sizeof(*lens));
  if (!lens)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  g->group_len = lens;
  bool failed = false;
  char **v = dup_strv(names, n, &failed);
  if (failed) {
    free_strv(v, n);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  }
  g->groups_s[g->ngroups] = v;
  g->group_len[g->ngroups] = n;
  g->ngroups++;
  return GCA_OK;
}

GCA_API gca_status_t gca_opgraph_add_order_after(gca_opgraph_t *g, const char *later,
                                                 const char *earlier) {
  static const char fn[] = "opgraph_add_order_after";
  GCA_CHECK(check_open(fn, g));
  GCA_CHECK(check_name(fn, "the later op", later));
  GCA_CHECK(check_name(fn, "the earlier op", earlier));
  size_t cap = g->capafter;
  if (!grow((void **)&g->after_later, &cap, g->nafter, sizeof(char *)))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  if (!grow((void **)&g->after_earlier, &g->capafter, g->nafter, sizeof(char *)))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  bool failed = false;
  g->after_later[g->nafter] = dup_or_null(later, &failed);
  g->after_earlier[g->nafter] = dup_or_null(earlier, &failed);
  if (failed) {
    free(g->after_later[g->nafter]);
    free(g->after_earlier[g->nafter]);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  }
  g->nafter++;
  return GCA_OK;
}

/* ---- finishing ---- */

static gca_status_t resolve_names(gca_opgraph_t *g, const char *opname, const char *field,
                                  char **names, size_t n, size_t **out) {
  if (n == 0)
    return GCA_OK;
  *out = malloc(n * sizeof(**out));
  if (!*out)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "op '%s': no host memory for its %s", opname, field);
  for (size_t i = 0; i < n; i++) {
    (*out)[i] = gca__names_get(&g->buf_names, names[i]);
    if ((*out)[i] == GCA__NONE)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "op '%s' %s unknown buffer '%s'", opname, field,
                        names[i]);
  }
  return GCA_OK;
}

static gca_status_t resolve_aliases(gca_opgraph_t *g) {
  for (size_t i = 0; i < g->nbufs; i++) {
    gca__sbuf_t *b = &g->bufs[i];
    if (!b->alias_of)
      continue;
    b->parent = gca__names_get(&g->buf_names, b->alias_of);
    if (b->parent == GCA__NONE)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "buffer '%s' is a view of unknown buffer '%s'",
                        b->name, b->alias_of);
  }
  for (size_t i = 0; i < g->nbufs; i++) {
    size_t r = i, steps = 0;
    while (g->bufs[r].parent != GCA__NONE && steps <= g->nbufs) {
      r = g->bufs[r].parent;
      steps++;
    }
    if (steps > g->nbufs)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "buffer '%s': its views form a cycle (through '%s')", g->bufs[i].name,
                        g->bufs[r].name);
    g->bufs[i].storage = r;
  }
  return GCA_OK;
}

static gca_status_t set_maker(gca_opgraph_t *g, size_t b, size_t op, const char *how) {
  gca__sbuf_t *sb = &g->bufs[b];
  if (sb->maker != GCA__NONE)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "buffer '%s' is made by both '%s' and '%s' (%s)",
                      sb->name, g->ops[sb->maker].name, g->ops[op].name, how);
  bool mutation = strcmp(how, "mutates into") == 0;
  /* an input is never written afresh, but may be updated in place (a
   * parameter by its optimizer step): a new version of its storage */
  if (g->bufs[sb->storage].kind == GCA_BUFFER_INPUT && !mutation)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "op '%s' %s '%s', which is (a view of) input '%s': inputs are never written "
                      "(only mutated in place)",
                      g->ops[op].name, how, sb->name, g->bufs[sb->storage].name);
  sb->maker = op;
  sb->version = mutation;
  return GCA_OK;
}

size_t gca__opgraph_usable_at(const gca_opgraph_t *g, size_t b, bool *made) {
  for (size_t steps = 0; steps <= g->nbufs; steps++) {
    const gca__sbuf_t *sb = &g->bufs[b];
    if (sb->maker != GCA__NONE) {
      *made = true;
      return gca__use_point(g, sb->maker);
    }
    if (sb->parent == GCA__NONE) {
      *made = sb->kind == GCA_BUFFER_INPUT;
      return GCA__NONE;
    }
    b = sb->parent;
  }
  *made = false;
  return GCA__NONE;
}

static gca_status_t add_pred(gca__sop_t *o, size_t pred) {
  for (size_t i = 0; i < o->npreds; i++)
    if (o->preds[i] == pred)
      return GCA_OK;
  if (!grow((void **)&o->preds, &o->cappreds, o->npreds, sizeof(size_t)))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "op '%s': no host memory for its dependencies",
                      o->name);
  o->preds[o->npreds++] = pred;
  return GCA_OK;
}

/* Note [Versions of a storage]: a mutation makes a new version of a storage
 * under a new name; a name belongs to the version of the first name along its
 * alias chain (itself included) that a mutation makes, else to the storage's
 * first version. Readers of the old version must finish before a mutation. */
static size_t version_of(const gca_opgraph_t *g, size_t b) {
  for (size_t steps = 0; steps <= g->nbufs; steps++) {
    const gca__sbuf_t *sb = &g->bufs[b];
    if (sb->parent == GCA__NONE || sb->version)
      return b;
    b = sb->parent;
  }
  return b;
}

static gca_status_t resolve_ops(gca_opgraph_t *g) {
  for (size_t i = 0; i < g->nops; i++) {
    gca__sop_t *o = &g->ops[i];
    GCA_CHECK(resolve_names(g, o->name, "reads", o->reads_s, o->nreads, &o->reads));
    GCA_CHECK(resolve_names(g, o->name, "writes", o->writes_s, o->nwrites, &o->writes));
    GCA_CHECK(resolve_names(g, o->name, "mutates", o->mold_s, o->nmut, &o->mold));
    GCA_CHECK(resolve_names(g, o->name, "mutates into", o->mnew_s, o->nmut, &o->mnew));
    if (o->kind == GCA_OP_COLLECTIVE) {
      for (size_t c = 0; c < g->ncomms && o->comm_idx == GCA__NONE; c++)
        if (strcmp(g->comms[c], o->comm) == 0)
          o->comm_idx = c;
      if (o->comm_idx == GCA__NONE)
        return gca__error(GCA_ERR_INVALID_ARGUMENT,
                          "collective '%s' uses unknown communicator '%s'", o->name, o->comm);
    }
    for (size_t k = 0; k < o->nmut; k++)
      if (g->bufs[o->mnew[k]].storage != g->bufs[o->mold[k]].storage || o->mnew[k] == o->mold[k])
        return gca__error(GCA_ERR_INVALID_ARGUMENT,
                          "op '%s' mutates '%s' into '%s', which is not another name of its "
                          "storage (declare it as a view of '%s')",
                          o->name, o->mold_s[k], o->mnew_s[k], o->mold_s[k]);
  }
  for (size_t i = 0; i < g->nops; i++) {
    gca__sop_t *o = &g->ops[i];
    if (o->kind != GCA_OP_WAIT)
      continue;
    size_t c = gca__names_get(&g->op_names, o->waits);
    if (c == GCA__NONE)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "wait '%s' waits for unknown op '%s'", o->name,
                        o->waits);
    if (g->ops[c].kind != GCA_OP_COLLECTIVE)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "wait '%s' waits for '%s', which is not a collective", o->name, o->waits);
    if (g->ops[c].wait != GCA__NONE)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "collective '%s' has two waits, '%s' and '%s'",
                        o->waits, g->ops[g->ops[c].wait].name, o->name);
    g->ops[c].wait = i;
    o->coll = c;
  }
  for (size_t i = 0; i < g->nops; i++)
    if (g->ops[i].kind == GCA_OP_COLLECTIVE && g->ops[i].wait == GCA__NONE)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "collective '%s' has no wait", g->ops[i].name);
  for (size_t i = 0; i < g->nops; i++) {
    gca__sop_t *o = &g->ops[i];
    for (size_t k = 0; k < o->nwrites; k++)
      GCA_CHECK(set_maker(g, o->writes[k], i, "writes"));
    for (size_t k = 0; k < o->nmut; k++)
      GCA_CHECK(set_maker(g, o->mnew[k], i, "mutates into"));
  }
  return GCA_OK;
}

static gca_status_t resolve_groups(gca_opgraph_t *g) {
  if (g->ngroups) {
    g->groups = calloc(g->ngroups, sizeof(*g->groups));
    if (!g->groups)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for %zu groups", g->ngroups);
  }
  for (size_t k = 0; k < g->ngroups; k++) {
    g->groups[k] = malloc(g->group_len[k] * sizeof(size_t));
    if (!g->groups[k])
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for group %zu", k);
    for (size_t j = 0; j < g->group_len[k]; j++) {
      size_t op = gca__names_get(&g->op_names, g->groups_s[k][j]);
      if (op == GCA__NONE)
        return gca__error(GCA_ERR_INVALID_ARGUMENT, "group %zu names unknown op '%s'", k,
                          g->groups_s[k][j]);
      if (g->ops[op].group != GCA__NONE)
        return gca__error(GCA_ERR_INVALID_ARGUMENT, "op '%s' is in two groups (%zu and %zu)",
                          g->ops[op].name, g->ops[op].group, k);
      g->ops[op].group = k;
      g->groups[k][j] = op;
    }
  }
  if (g->nafter) {
    g->after_l = malloc(g->nafter * sizeof(size_t));
    g->after_e = malloc(g->nafter * sizeof(size_t));
    if (!g->after_l || !g->after_e)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for %zu order_after pairs",
                        g->nafter);
  }
  for (size_t k = 0; k < g->nafter; k++) {
    g->after_l[k] = gca__names_get(&g->op_names, g->after_later[k]);
    g->after_e[k] = gca__names_get(&g->op_names, g->after_earlier[k]);
    if (g->after_l[k] == GCA__NONE || g->after_e[k] == GCA__NONE)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "order_after ['%s', '%s'] names unknown op '%s'",
                        g->after_later[k], g->after_earlier[k],
                        g->after_l[k] == GCA__NONE ? g->after_later[k] : g->after_earlier[k]);
    if (g->after_l[k] == g->after_e[k])
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "order_after ['%s', '%s'] orders an op after itself", g->after_later[k],
                        g->after_earlier[k]);
  }
  return GCA_OK;
}

/* Note [Op graph rules]: the edges. */
static gca_status_t derive_edges(gca_opgraph_t *g) {
  /* readers[b]: ops reading b, in program order (CSR) */
  size_t *start = calloc(g->nbufs + 1, sizeof(size_t)), *fill = NULL, *readers = NULL;
  size_t total = 0;
  gca_status_t st = GCA_OK;
  if (!start)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for the readers of each buffer");
  for (size_t i = 0; i < g->nops; i++)
    for (size_t k = 0; k < g->ops[i].nreads; k++, total++)
      start[g->ops[i].reads[k] + 1]++;
  for (size_t b = 0; b < g->nbufs; b++)
    start[b + 1] += start[b];
  fill = malloc((g->nbufs + 1) * sizeof(size_t));
  readers = malloc((total + 1) * sizeof(size_t));
  if (!fill || !readers) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for the readers of each buffer");
    goto out;
  }
  memcpy(fill, start, (g->nbufs + 1) * sizeof(size_t));
  for (size_t i = 0; i < g->nops; i++)
    for (size_t k = 0; k < g->ops[i].nreads; k++)
      readers[fill[g->ops[i].reads[k]]++] = i;

  for (size_t i = 0; i < g->nops && st == GCA_OK; i++) {
    gca__sop_t *o = &g->ops[i];
    for (size_t k = 0; k < o->nreads + o->nmut && st == GCA_OK; k++) {
      size_t b = k < o->nreads ? o->reads[k] : o->mold[k - o->nreads];
      bool made;
      size_t at = gca__opgraph_usable_at(g, b, &made);
      if (!made)
        st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "op '%s' %s '%s', which nothing writes (and which is not an input)",
                        o->name, k < o->nreads ? "reads" : "mutates", g->bufs[b].name);
      else if (at != GCA__NONE && at != i)
        st = add_pred(o, at);
    }
    if (st == GCA_OK && o->kind == GCA_OP_WAIT)
      st = add_pred(o, o->coll);
    for (size_t k = 0; k < o->nmut && st == GCA_OK; k++) {
      size_t old = version_of(g, o->mold[k]);
      /* readers of old's version (Note [Versions of a storage]) */
      for (size_t b = 0; b < g->nbufs && st == GCA_OK; b++) {
        if (version_of(g, b) != old)
          continue;
        for (size_t r = start[b]; r < start[b + 1] && st == GCA_OK; r++) {
          size_t u = readers[r];
          if (u == i)
            continue;
          if (u > i)
            st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                            "op '%s' reads '%s' after op '%s' mutated it into '%s'", g->ops[u].name,
                            g->bufs[b].name, o->name, o->mnew_s[k]);
          else
            st = add_pred(o, gca__use_point(g, u));
        }
      }
    }
  }
  for (size_t k = 0; k < g->nafter && st == GCA_OK; k++)
    st = add_pred(&g->ops[g->after_l[k]], g->after_e[k]);
out:
  free(start);
  free(fill);
  free(readers);
  return st;
}

/* Forgets what a finish derived (resolved names, makers, waits, groups,
 * edges): a finish that failed, for host memory or for a name the caller adds
 * afterwards, leaves the graph as it was added, to be finished again or
 * destroyed. */
static void unresolve(gca_opgraph_t *g) {
  for (size_t i = 0; i < g->nbufs; i++) {
    gca__sbuf_t *b = &g->bufs[i];
    b->parent = b->storage = b->maker = GCA__NONE;
    b->version = false;
  }
  for (size_t i = 0; i < g->nops; i++) {
    gca__sop_t *o = &g->ops[i];
    free(o->reads);
    free(o->writes);
    free(o->mold);
    free(o->mnew);
    free(o->preds);
    o->reads = o->writes = o->mold = o->mnew = o->preds = NULL;
    o->npreds = o->cappreds = 0;
    o->group = o->wait = o->coll = o->comm_idx = GCA__NONE;
  }
  for (size_t k = 0; g->groups && k < g->ngroups; k++)
    free(g->groups[k]);
  free(g->groups);
  free(g->after_l);
  free(g->after_e);
  g->groups = NULL;
  g->after_l = g->after_e = NULL;
}

GCA_API gca_status_t gca_opgraph_finish(gca_opgraph_t *g) {
  GCA_CHECK(check_open("opgraph_finish", g));
  gca_status_t st = resolve_aliases(g);
  if (st == GCA_OK)
    st = resolve_ops(g);
  if (st == GCA_OK)
    st = resolve_groups(g);
  if (st == GCA_OK)
    st = derive_edges(g);
  if (st != GCA_OK) {
    unresolve(g);
    return gca__error_prefix(st, "opgraph_finish");
  }
  g->finished = true;
  size_t *order = malloc((g->nops + 1) * sizeof(size_t));
  if (!order) {
    g->finished = false;
    unresolve(g);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "opgraph_finish: no host memory for the program order");
  }
  for (size_t i = 0; i < g->nops; i++)
    order[i] = i;
  st = gca_opgraph_check_order(g, order, g->nops);
  free(order);
  if (st != GCA_OK) {
    g->finished = false;
    unresolve(g);
    if (st == GCA_ERR_OUT_OF_MEMORY) /* the check could not run */
      return gca__error_prefix(st, "opgraph_finish");
    return gca__error_prefix(st, "opgraph_finish: the program order is not a valid schedule");
  }
  return GCA_OK;
}

/* ---- queries ---- */

gca_status_t gca__check_graph_arg(const char *fn, const gca_opgraph_t *g, const size_t *order,
                                  size_t n) {
  if (!g)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: graph is NULL", fn);
  if (!g->finished)
    return gca__error(GCA_ERR_INVALID_STATE, "%s: the graph is not finished", fn);
  if (n != g->nops)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %zu entries for a graph of %zu ops", fn, n,
                      g->nops);
  if (!order && n)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: order is NULL", fn);
  return GCA_OK;
}

GCA_API size_t gca_opgraph_op_count(const gca_opgraph_t *g) {
  return g ? g->nops : 0;
}

GCA_API const char *gca_opgraph_op_name(const gca_opgraph_t *g, size_t op) {
  return g && op < g->nops ? g->ops[op].name : NULL;
}

GCA_API gca_op_kind_t gca_opgraph_op_kind(const gca_opgraph_t *g, size_t op) {
  return g && op < g->nops ? g->ops[op].kind : GCA_OP_COMPUTE;
}

GCA_API gca_status_t gca_opgraph_op_index(const gca_opgraph_t *g, const char *name, size_t *op) {
  if (!g || !name || !op)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "opgraph_op_index: NULL argument");
  *op = gca__names_get(&g->op_names, name);
  if (*op == GCA__NONE)
    return gca__error(GCA_ERR_NOT_FOUND, "opgraph_op_index: no op named '%s'", name);
  return GCA_OK;
}

GCA_API size_t gca_opgraph_buffer_count(const gca_opgraph_t *g) {
  return g ? g->nbufs : 0;
}

GCA_API gca_status_t gca_opgraph_buffer_index(const gca_opgraph_t *g, const char *name,
                                              size_t *buffer) {
  if (!g || !name || !buffer)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "opgraph_buffer_index: NULL argument");
  *buffer = gca__names_get(&g->buf_names, name);
  if (*buffer == GCA__NONE)
    return gca__error(GCA_ERR_NOT_FOUND, "opgraph_buffer_index: no buffer named '%s'", name);
  return GCA_OK;
}

GCA_API gca_status_t gca_opgraph_program_order(const gca_opgraph_t *g, size_t *order) {
  if (!g || !order)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "opgraph_program_order: NULL argument");
  for (size_t i = 0; i < g->nops; i++)
    order[i] = i;
  return GCA_OK;
}
