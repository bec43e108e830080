/* SPDX-License-Identifier: Apache-2.0 */
/* opgraph_json.c - loads the gca-opgraph/1 JSON format (DESIGN.md "Op graph")
 * into a finished graph through the building API.
 *
 * The one idea: the loader checks the document's shape (every field known,
 * of the right type) and leaves the graph's meaning to opgraph.c, so a JSON
 * graph and an API-built one are validated by the same code; every error
 * names the field and the op or buffer it belongs to. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_reader.h"
#include "sched_internal.h"

static gca_status_t bad(const gca_jv_t *v, const char *fmt, ...) GCA_PRINTF(2, 3);

static gca_status_t bad(const gca_jv_t *v, const char *fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return gca__error(GCA_ERR_INVALID_ARGUMENT, "opgraph: offset %zu: %s", v ? v->offset : 0, msg);
}

static bool known(const char *key, const char *const *keys) {
  for (; *keys; keys++)
    if (strcmp(key, *keys) == 0)
      return true;
  return false;
}

static gca_status_t only_keys(const gca_jv_t *obj, const char *what, const char *name,
                              const char *const *keys) {
  for (size_t i = 0; i < obj->n; i++)
    if (!known(obj->keys[i], keys))
      return bad(&obj->items[i], "%s '%s': unknown field '%s'", what, name, obj->keys[i]);
  return GCA_OK;
}

/* A string field, or NULL when absent (required: an error). */
static gca_status_t str_field(const gca_jv_t *obj, const char *key, const char *what,
                              const char *name, bool required, const char **out) {
  const gca_jv_t *v = gca__json_get(obj, key);
  *out = NULL;
  if (!v) {
    if (required)
      return bad(obj, "%s '%s': no '%s'", what, name, key);
    return GCA_OK;
  }
  if (v->kind != GCA_JV_STRING || strlen(v->str) != v->len)
    return bad(v, "%s '%s': '%s' must be a string", what, name, key);
  *out = v->str;
  return GCA_OK;
}

/* An array of strings as a (borrowed) vector. */
static gca_status_t names_field(const gca_jv_t *obj, const char *key, const char *what,
                                const char *name, const char ***out, size_t *n) {
  const gca_jv_t *v = gca__json_get(obj, key);
  *out = NULL;
  *n = 0;
  if (!v)
    return GCA_OK;
  if (v->kind != GCA_JV_ARRAY)
    return bad(v, "%s '%s': '%s' must be an array of names", what, name, key);
  if (v->n == 0)
    return GCA_OK;
  const char **names = malloc(v->n * sizeof(*names));
  if (!names)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph: no host memory");
  for (size_t i = 0; i < v->n; i++) {
    if (v->items[i].kind != GCA_JV_STRING) {
      free(names);
      return bad(&v->items[i], "%s '%s': '%s'[%zu] must be a name", what, name, key, i);
    }
    names[i] = v->items[i].str;
  }
  *out = names;
  *n = v->n;
  return GCA_OK;
}

static gca_status_t load_buffer(gca_opgraph_t *g, const gca_jv_t *b, size_t index) {
  static const char *const keys[] = {"name", "bytes", "kind", "alias_of", NULL};
  char idx[32];
  snprintf(idx, sizeof(idx), "#%zu", index);
  if (b->kind != GCA_JV_OBJECT)
    return bad(b, "buffer %s must be an object", idx);
  const char *name, *kind, *alias;
  GCA_CHECK(str_field(b, "name", "buffer", idx, true, &name));
  GCA_CHECK(only_keys(b, "buffer", name, keys));
  GCA_CHECK(str_field(b, "kind", "buffer", name, false, &kind));
  GCA_CHECK(str_field(b, "alias_of", "buffer", name, false, &alias));
  const gca_jv_t *bytes = gca__json_get(b, "bytes");
  if (alias) {
    if (bytes || kind)
      return bad(b, "buffer '%s': a view (alias_of) has no bytes or kind of its own", name);
    return gca_opgraph_add_view(g, name, alias);
  }
  if (!bytes)
    return bad(b, "buffer '%s': needs 'bytes' (or 'alias_of' for a view)", name);
  if (bytes->kind != GCA_JV_NUMBER || !bytes->is_int)
    return bad(bytes, "buffer '%s': 'bytes' must be an integer", name);
  gca_buffer_kind_t k = GCA_BUFFER_TEMP;
  if (kind && strcmp(kind, "input") == 0)
    k = GCA_BUFFER_INPUT;
  else if (kind && strcmp(kind, "output") == 0)
    k = GCA_BUFFER_OUTPUT;
  else if (kind && strcmp(kind, "temp") != 0)
    return bad(b, "buffer '%s': kind '%s' is not input, output or temp", name, kind);
  return gca_opgraph_add_buffer(g, name, bytes->i, k);
}

static gca_status_t load_op(gca_opgraph_t *g, const gca_jv_t *o, size_t index) {
  static const char *const keys[] = {"name",  "kind",   "us",      "collective", "comm",
                                     "reads", "writes", "mutates", "waits",      NULL};
  char idx[32];
  snprintf(idx, sizeof(idx), "#%zu", index);
  if (o->kind != GCA_JV_OBJECT)
    return bad(o, "op %s must be an object", idx);
  const char *name, *kind;
  GCA_CHECK(str_field(o, "name", "op", idx, true, &name));
  GCA_CHECK(only_keys(o, "op", name, keys));
  GCA_CHECK(str_field(o, "kind", "op", name, true, &kind));
  gca_op_desc_t d = GCA_OP_DESC_INIT;
  d.name = name;
  if (strcmp(kind, "compute") == 0)
    d.kind = GCA_OP_COMPUTE;
  else if (strcmp(kind, "collective") == 0)
    d.kind = GCA_OP_COLLECTIVE;
  else if (strcmp(kind, "wait") == 0)
    d.kind = GCA_OP_WAIT;
  else
    return bad(o, "op '%s': kind '%s' is not compute, collective or wait", name, kind);
  const gca_jv_t *us = gca__json_get(o, "us");
  if (us) {
    if (us->kind != GCA_JV_NUMBER)
      return bad(us, "op '%s': 'us' must be a number", name);
    d.us = us->num;
  } else if (d.kind != GCA_OP_WAIT) {
    return bad(o, "op '%s': no 'us' (its duration)", name);
  }
  GCA_CHECK(str_field(o, "collective", "op", name, d.kind == GCA_OP_COLLECTIVE, &d.collective));
  GCA_CHECK(str_field(o, "comm", "op", name, d.kind == GCA_OP_COLLECTIVE, &d.comm));
  GCA_CHECK(str_field(o, "waits", "op", name, d.kind == GCA_OP_WAIT, &d.waits));
  if (d.kind != GCA_OP_COLLECTIVE && (d.collective || d.comm))
    return bad(o, "op '%s': only a collective has 'collective' and 'comm'", name);
  if (d.kind != GCA_OP_WAIT && d.waits)
    return bad(o, "op '%s': only a wait has 'waits'", name);
  const char **reads = NULL, **writes = NULL, **mold = NULL, **mnew = NULL;
  gca_status_t st = names_field(o, "reads", "op", name, &reads, &d.nreads);
  if (st == GCA_OK)
    st = names_field(o, "writes", "op", name, &writes, &d.nwrites);
  const gca_jv_t *mut = gca__json_get(o, "mutates");
  if (st == GCA_OK && mut) {
    if (mut->kind != GCA_JV_OBJECT) {
      st = bad(mut, "op '%s': 'mutates' must map old names to new names", name);
    } else if (mut->n) {
      mold = malloc(mut->n * sizeof(*mold));
      mnew = malloc(mut->n * sizeof(*mnew));
      if (!mold || !mnew)
        st = gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph: no host memory");
      for (size_t i = 0; i < mut->n && st == GCA_OK; i++) {
        if (mut->items[i].kind != GCA_JV_STRING)
          st = bad(&mut->items[i], "op '%s': mutates['%s'] must be a name", name, mut->keys[i]);
        else {
          mold[i] = mut->keys[i];
          mnew[i] = mut->items[i].str;
        }
      }
      d.nmutates = mut->n;
    }
  }
  if (st == GCA_OK) {
    d.reads = reads;
    d.writes = writes;
    d.mutates_old = mold;
    d.mutates_new = mnew;
    st = gca_opgraph_add_op(g, &d);
  }
  free(reads);
  free(writes);
  free(mold);
  free(mnew);
  return st;
}

static gca_status_t load_pairs(gca_opgraph_t *g, const gca_jv_t *v, bool groups) {
  const char *what = groups ? "groups" : "order_after";
  if (v->kind != GCA_JV_ARRAY)
    return bad(v, "'%s' must be an array of arrays of op names", what);
  for (size_t i = 0; i < v->n; i++) {
    const gca_jv_t *e = &v->items[i];
    if (e->kind != GCA_JV_ARRAY || (!groups && e->n != 2) || e->n == 0)
      return bad(e, "%s[%zu] must be %s", what, i,
                 groups ? "a non-empty array of op names" : "[later, earlier]");
    const char **names = malloc(e->n * sizeof(*names));
    if (!names)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph: no host memory");
    gca_status_t st = GCA_OK;
    for (size_t k = 0; k < e->n && st == GCA_OK; k++) {
      if (e->items[k].kind != GCA_JV_STRING)
        st = bad(&e->items[k], "%s[%zu][%zu] must be an op name", what, i, k);
      else
        names[k] = e->items[k].str;
    }
    if (st == GCA_OK)
      st = groups ? gca_opgraph_add_group(g, names, e->n)
                  : gca_opgraph_add_order_after(g, names[0], names[1]);
    free(names);
    GCA_CHECK(st);
  }
  return GCA_OK;
}

static gca_status_t load(gca_opgraph_t *g, const gca_jv_t *root) {
  static const char *const keys[] = {"format", "comms",       "buffers", "ops",
                                     "groups", "order_after", NULL};
  if (root->kind != GCA_JV_OBJECT)
    return bad(root, "the document must be an object");
  for (size_t i = 0; i < root->n; i++)
    if (!known(root->keys[i], keys))
      return bad(&root->items[i], "unknown top-level field '%s'", root->keys[i]);
  const gca_jv_t *fmt = gca__json_get(root, "format");
  if (!fmt || fmt->kind != GCA_JV_STRING || strcmp(fmt->str, "gca-opgraph/1") != 0)
    return bad(fmt ? fmt : root, "'format' must be \"gca-opgraph/1\"");
  const gca_jv_t *comms = gca__json_get(root, "comms");
  if (comms) {
    if (comms->kind != GCA_JV_ARRAY)
      return bad(comms, "'comms' must be an array of names");
    for (size_t i = 0; i < comms->n; i++) {
      if (comms->items[i].kind != GCA_JV_STRING)
        return bad(&comms->items[i], "comms[%zu] must be a name", i);
      GCA_CHECK(gca_opgraph_add_comm(g, comms->items[i].str));
    }
  }
  const gca_jv_t *bufs = gca__json_get(root, "buffers"), *ops = gca__json_get(root, "ops");
  if (!bufs || bufs->kind != GCA_JV_ARRAY)
    return bad(bufs ? bufs : root, "'buffers' must be an array");
  if (!ops || ops->kind != GCA_JV_ARRAY)
    return bad(ops ? ops : root, "'ops' must be an array");
  for (size_t i = 0; i < bufs->n; i++)
    GCA_CHECK(load_buffer(g, &bufs->items[i], i));
  for (size_t i = 0; i < ops->n; i++)
    GCA_CHECK(load_op(g, &ops->items[i], i));
  const gca_jv_t *groups = gca__json_get(root, "groups"),
                 *after = gca__json_get(root, "order_after");
  if (groups)
    GCA_CHECK(load_pairs(g, groups, true));
  if (after)
    GCA_CHECK(load_pairs(g, after, false));
  return gca_opgraph_finish(g);
}

GCA_API gca_status_t gca_opgraph_load_json(const char *text, size_t len, gca_opgraph_t **graph) {
  if (!graph || (!text && len))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "opgraph_load_json: text or graph is NULL");
  *graph = NULL;
  gca_jv_t *root = NULL;
  gca_status_t st = gca__json_parse(text, len, &root);
  if (st != GCA_OK)
    return gca__error_prefix(st, "opgraph_load_json");
  gca_opgraph_t *g = NULL;
  st = gca_opgraph_create(&g);
  if (st == GCA_OK)
    st = load(g, root);
  gca__json_free(root);
  if (st != GCA_OK) {
    gca_opgraph_destroy(g);
    return gca__error_prefix(st, "opgraph_load_json");
  }
  *graph = g;
  return GCA_OK;
}
