/* SPDX-License-Identifier: Apache-2.0 */
/* tree.c - the graph tree's state machine: warm up eagerly inside the pool,
 * record a child of the node that ran before (keyed by function and shape),
 * replay it while its invariants hold, and when one breaks update the executable
 * graph in place, re-record, or fall back to eager runs (include/gca/graphs.h).
 *
 * The one idea: the pool's layout after each recording is a checkpoint, and
 * every allocation the tree makes in the pool starts from the parent's
 * checkpoint with the path's dead outputs freed (Note [Pool bookkeeping]), so
 * a recording only ever reuses memory that is dead on its path, and sibling
 * branches share the memory below their common parent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <pthread.h>

#include "graphs_internal.h"

/* ---- live trees (Note [Sim handles] in spirit: a dead handle is refused) ---- */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static gca_graph_tree_t *live_trees;

gca_status_t gca__graph_tree_check(const char *op, const gca_graph_tree_t *tree) {
  if (!tree)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: tree is NULL", op);
  pthread_mutex_lock(&live_mu);
  const gca_graph_tree_t *t = live_trees;
  while (t && t != tree)
    t = t->next_live;
  pthread_mutex_unlock(&live_mu);
  if (!t)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: tree %p is not a live graph tree", op,
                      (const void *)tree);
  return GCA_OK;
}

/* ---- small helpers ---- */

static size_t page_size(void) {
  static size_t ps;
  if (!ps)
    ps = (size_t)sysconf(_SC_PAGESIZE);
  return ps;
}

static bool out_is_live(const gca_graph_tree_t *t, gca__out_ref_t r) {
  return r.node->out_gen == t->gen && r.node->out_live[r.index];
}

static void report(gca_graph_tree_t *t, gca_graph_fn_t *fn, gca_graph_action_t action,
                   gca_graph_rule_t rule, long arg, const void *old_addr, const void *new_addr,
                   bool limit, gca_status_t status, const char *detail) {
  if (!t->opts.on_decision)
    return;
  gca_graph_decision_t d = {.function = fn->name,
                            .action = action,
                            .rule = rule,
                            .arg = arg,
                            .old_address = old_addr,
                            .new_address = new_addr,
                            .limit_reached = limit,
                            .status = status,
                            .detail = detail ? detail : ""};
  t->opts.on_decision(&d, t->opts.decision_ctx);
}

/* Room in the live-output table for n more, made before the work that
 * produces them is issued: once a body ran or a recording was launched,
 * nothing may fail (the work would be done and reported as not done). */
static gca_status_t outs_reserve(gca_graph_tree_t *t, size_t n) {
  if (t->nouts + n <= t->capouts)
    return GCA_OK;
  size_t cap = t->capouts ? 2 * t->capouts : 16;
  while (cap < t->nouts + n)
    cap *= 2;
  gca__live_out_t *v = GCA_FAILPOINT("graph_outputs") ? NULL : realloc(t->outs, cap * sizeof(*v));
  if (!v)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_tree_run: no host memory to track %zu outputs",
                      cap);
  t->outs = v;
  t->capouts = cap;
  return GCA_OK;
}

/* After outs_reserve. */
static void outs_push(gca_graph_tree_t *t, gca__live_out_t o) {
  GCA_ASSERT_DEBUG(t->nouts < t->capouts);
  t->outs[t->nouts++] = o;
}

/* Bytes to ask the allocator for an output of `bytes`, and the address handed
 * out inside the block (page-aligned, whole pages, with poison_stale). */
static size_t out_request(const gca_graph_tree_t *t, size_t bytes) {
  if (!t->opts.poison_stale)
    return bytes;
  size_t ps = page_size();
  return (bytes + ps - 1) / ps * ps + ps;
}

static void *out_address(const gca_graph_tree_t *t, void *block) {
  if (!t->opts.poison_stale)
    return block;
  size_t ps = page_size();
  return (void *)(((uintptr_t)block + ps - 1) / ps * ps);
}

static size_t out_region(const gca_graph_tree_t *t, size_t bytes) {
  if (!t->opts.poison_stale)
    return bytes;
  size_t ps = page_size();
  return (bytes + ps - 1) / ps * ps;
}

/* ---- poisoning stale outputs (debug, sim) ---- */

static void poison(gca_graph_tree_t *t, void *ptr, size_t bytes) {
  if (t->npoisoned == t->cappoisoned) {
    size_t cap = t->cappoisoned ? 2 * t->cappoisoned : 16;
    void *n = realloc(t->poisoned, cap * sizeof(*t->poisoned));
    if (!n) {
      GCA_LOG_WARN("graphs: poison_stale: out of host memory, %p stays accessible", ptr);
      return;
    }
    t->poisoned = n;
    t->cappoisoned = cap;
  }
  if (mprotect(ptr, bytes, PROT_NONE) != 0) {
    GCA_LOG_WARN("graphs: poison_stale: mprotect(%p, %zu) failed", ptr, bytes);
    return;
  }
  t->poisoned[t->npoisoned].ptr = ptr;
  t->poisoned[t->npoisoned].bytes = bytes;
  t->npoisoned++;
}

/* Every poisoned region becomes accessible again (before the pool is used). */
static void unpoison_all(gca_graph_tree_t *t) {
  for (size_t i = 0; i < t->npoisoned; i++)
    if (mprotect(t->poisoned[i].ptr, t->poisoned[i].bytes, PROT_READ | PROT_WRITE) != 0)
      GCA_LOG_WARN("graphs: poison_stale: cannot unprotect %p", t->poisoned[i].ptr);
  t->npoisoned = 0;
}

/* ---- nodes ---- */

static void node_clear(gca_graph_tree_t *t, gca__gnode_t *n);
static void node_drop_children(gca_graph_tree_t *t, gca__gnode_t *n);

/* Frees a node's per-input and per-output arrays and the node (not its recording). */
static void node_free_shell(gca__gnode_t *n) {
  free(n->in_mode);
  free(n->in_addr);
  free(n->staging);
  free(n->out_ptr);
  free(n->out_block);
  free(n->out_live);
  free(n);
}

static void node_free_subtree(gca_graph_tree_t *t, gca__gnode_t *n) {
  node_drop_children(t, n);
  if (n != &t->root) {
    node_clear(t, n);
    node_free_shell(n);
  }
}

/* Drops the node's recording (exec, checkpoint, references); keeps the node. */
static void node_clear(gca_graph_tree_t *t, gca__gnode_t *n) {
  if (n->exec) {
    GCA_CHECK_IGNORE(t->ops->graph_exec_destroy(n->exec));
    n->exec = NULL;
    t->stats.nodes--;
  }
  t->stats.graph_nodes -= n->graph_nodes;
  n->graph_nodes = 0;
  gca_pool_state_free(n->ckpt);
  n->ckpt = NULL;
  free(n->dead);
  free(n->live_at_ckpt);
  free(n->rng);
  n->dead = n->live_at_ckpt = NULL;
  n->rng = NULL;
  n->ndead = n->nlive = n->nrng = 0;
  n->recorded = false;
}

/* Frees the node's children (their recordings assumed the node's old layout). */
static void node_drop_children(gca_graph_tree_t *t, gca__gnode_t *n) {
  gca__gnode_t *c = n->children;
  while (c) {
    gca__gnode_t *next = c->next;
    node_free_subtree(t, c);
    c = next;
  }
  n->children = NULL;
}

static gca__gnode_t *node_child(gca_graph_tree_t *t, gca__gnode_t *parent, gca_graph_fn_t *fn,
                                gca__shape_t *shape, gca_status_t *st) {
  for (gca__gnode_t *c = parent->children; c; c = c->next)
    if (c->fn == fn && c->shape == shape)
      return c;
  gca__gnode_t *n = GCA_FAILPOINT("graph_node") ? NULL : calloc(1, sizeof(*n));
  if (n) {
    n->in_mode = calloc(fn->ninputs + 1, sizeof(*n->in_mode));
    n->in_addr = calloc(fn->ninputs + 1, sizeof(void *));
    n->staging = calloc(fn->ninputs + 1, sizeof(void *));
    n->out_ptr = calloc(fn->noutputs + 1, sizeof(void *));
    n->out_block = calloc(fn->noutputs + 1, sizeof(void *));
    n->out_live = calloc(fn->noutputs + 1, sizeof(bool));
  }
  if (!n || !n->in_mode || !n->in_addr || !n->staging || !n->out_ptr || !n->out_block ||
      !n->out_live) {
    if (n)
      node_free_shell(n);
    *st = gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_tree_run: no host memory for a node of %s",
                     fn->name);
    return NULL;
  }
  n->parent = parent == &t->root ? NULL : parent;
  n->fn = fn;
  n->shape = shape;
  n->next = parent->children;
  parent->children = n;
  return n;
}

/* ---- the pool's bookkeeping (Note [Pool bookkeeping]) ---- */

/* Makes the pool's layout the one after `parent`'s recording (the empty pool
 * for the root) minus the path's outputs that are dead now. */
static gca_status_t sync_pool(gca_graph_tree_t *t, gca__gnode_t *parent) {
  unpoison_all(t);
  const gca_pool_state_t *state = parent == &t->root ? t->root_ckpt : parent->ckpt;
  GCA_CHECK(gca_pool_restore(t->pool, state, NULL));
  if (parent == &t->root)
    return GCA_OK;
  for (size_t i = 0; i < parent->nlive; i++) {
    gca__out_ref_t r = parent->live_at_ckpt[i];
    if (!out_is_live(t, r))
      GCA_CHECK(gca_free(r.node->out_block[r.index]));
  }
  return GCA_OK;
}

/* ---- eager runs ---- */

static void free_blocks(void **blocks, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (blocks[i])
      GCA_CHECK_IGNORE(gca_free(blocks[i]));
}

/* Runs the body eagerly at `shape` on the tree's stream; in the pool for a warm-up. */
static gca_status_t run_eager(gca_graph_tree_t *t, gca_graph_fn_t *fn, const gca__shape_t *shape,
                              void *const *inputs, void **outputs, bool in_pool) {
  gca_status_t st = GCA_OK;
  size_t no = fn->noutputs;
  void **blocks = calloc(no + 1, sizeof(void *));
  void **ptrs = calloc(no + 1, sizeof(void *));
  if (!blocks || !ptrs) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_tree_run: no host memory for %zu outputs", no);
    goto out;
  }
  GCA_CHECK_GOTO(outs_reserve(t, no), st, out);
  if (in_pool)
    GCA_CHECK_GOTO(gca_pool_use_begin(t->pool), st, out);
  for (size_t i = 0; i < no && st == GCA_OK; i++) {
    st = gca_malloc_device(t->device, &blocks[i], out_request(t, shape->out[i]), t->stream);
    ptrs[i] = blocks[i] ? out_address(t, blocks[i]) : NULL;
  }
  if (st == GCA_OK) {
    st = fn->body(t->stream, inputs, ptrs, fn->ctx);
    if (st != GCA_OK)
      st = gca__error_prefix(st, "graph_tree_run: %s (eager)", fn->name);
  }
  if (in_pool) {
    gca_status_t st2 = gca_pool_use_end(t->pool);
    if (st == GCA_OK)
      st = st2;
  }
  if (st != GCA_OK) {
    free_blocks(blocks, no);
    goto out;
  }
  for (size_t i = 0; i < no; i++) {
    gca__live_out_t o = {.ptr = ptrs[i],
                         .block = blocks[i],
                         .bytes = out_region(t, shape->out[i]),
                         .kind = in_pool ? OUT_POOL_EAGER : OUT_EAGER};
    outs_push(t, o);
    outputs[i] = ptrs[i];
  }
out:
  free(blocks);
  free(ptrs);
  return st;
}

/* An eager run outside the pool as a fallback; the position stays. */
static gca_status_t fallback(gca_graph_tree_t *t, gca_graph_fn_t *fn, const gca__shape_t *shape,
                             void *const *inputs, void **outputs) {
  t->stats.eager_fallbacks++;
  return run_eager(t, fn, shape, inputs, outputs, false);
}

/* ---- recording ---- */

/* A capture of fn's body below `parent` into the pool: graph, and the node's
 * tentative layout in the out-parameters. */
typedef struct capture {
  gca_graph_t graph;
  size_t graph_nodes; /* operations captured (kernels, copies, memsets, ...) */
  in_mode_t *in_mode;
  void **in_addr, **staging, **out_ptr, **out_block;
  gca__rng_use_t *rng;
  size_t nrng;
} capture_t;

static void capture_free(gca_graph_tree_t *t, capture_t *c) {
  if (c->graph)
    GCA_CHECK_IGNORE(t->ops->graph_destroy(c->graph));
  free(c->in_mode);
  free(c->in_addr);
  free(c->staging);
  free(c->out_ptr);
  free(c->out_block);
  free(c->rng);
  memset(c, 0, sizeof(*c));
}

/* Whether ptr is a live output of a recording on the path ending at `parent`. */
static bool ancestor_output(const gca_graph_tree_t *t, const gca__gnode_t *parent,
                            const void *ptr) {
  for (const gca__gnode_t *a = parent == &t->root ? NULL : parent; a; a = a->parent)
    for (size_t j = 0; j < a->fn->noutputs; j++)
      if (a->out_ptr[j] == ptr && a->out_gen == t->gen && a->out_live[j])
        return true;
  return false;
}

/* Leaves a capture left open by a failure. */
static void abandon_capture(gca_graph_tree_t *t) {
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  if (t->ops->stream_capture_info(t->stream, &cs, NULL) == GCA_OK &&
      cs != GCA_CAPTURE_STATUS_NONE) {
    gca_graph_t g = NULL;
    gca_status_t st = t->ops->stream_end_capture(t->stream, &g);
    if (st == GCA_OK && g)
      GCA_CHECK_IGNORE(t->ops->graph_destroy(g));
  }
}

/* Captures fn's body at `shape` on the tree's stream after syncing the pool to
 * parent. On failure *rule says which step failed and the pool is synced again. */
static gca_status_t capture_body(gca_graph_tree_t *t, gca__gnode_t *parent, gca_graph_fn_t *fn,
                                 const gca__shape_t *shape, void *const *inputs, capture_t *c,
                                 gca_graph_rule_t *rule) {
  gca_status_t st;
  size_t ni = fn->ninputs, no = fn->noutputs;
  memset(c, 0, sizeof(*c));
  *rule = GCA_GRAPH_RULE_RESTORE_FAILED;
  GCA_CHECK(sync_pool(t, parent));
  *rule = GCA_GRAPH_RULE_CAPTURE_FAILED;
  c->in_mode = calloc(ni + 1, sizeof(*c->in_mode));
  c->in_addr = calloc(ni + 1, sizeof(void *));
  c->staging = calloc(ni + 1, sizeof(void *));
  c->out_ptr = calloc(no + 1, sizeof(void *));
  c->out_block = calloc(no + 1, sizeof(void *));
  void **eff = GCA_FAILPOINT("graph_capture") ? NULL : calloc(ni + 1, sizeof(void *));
  if (!c->in_mode || !c->in_addr || !c->staging || !c->out_ptr || !c->out_block || !eff) {
    free(eff);
    capture_free(t, c);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_tree_run: no host memory to record %s",
                      fn->name);
  }
  for (size_t i = 0; i < ni; i++) {
    if (ancestor_output(t, parent, inputs[i]))
      c->in_mode[i] = IN_ANCESTOR;
    else
      c->in_mode[i] = fn->inputs[i].kind == GCA_GRAPH_INPUT_COPIED ? IN_STAGED : IN_FIXED;
    c->in_addr[i] = c->in_mode[i] == IN_STAGED ? NULL : inputs[i];
  }

  bool pool_routed = false;
  t->ncap_rng = 0;
  GCA_CHECK_GOTO(t->ops->stream_begin_capture(t->stream, (gca_capture_mode_t)t->opts.capture_mode),
                 st, fail);
  GCA_CHECK_GOTO(gca_pool_begin_capture(t->pool, t->stream), st, fail);
  pool_routed = true;
  t->capturing = true;
  for (size_t i = 0; i < ni; i++) {
    if (c->in_mode[i] == IN_STAGED)
      GCA_CHECK_GOTO(
          gca_malloc_device(t->device, &c->staging[i], shape->in[i] ? shape->in[i] : 1, t->stream),
          st, fail);
    eff[i] = c->in_mode[i] == IN_STAGED ? c->staging[i] : inputs[i];
  }
  for (size_t i = 0; i < no; i++) {
    GCA_CHECK_GOTO(
        gca_malloc_device(t->device, &c->out_block[i], out_request(t, shape->out[i]), t->stream),
        st, fail);
    c->out_ptr[i] = out_address(t, c->out_block[i]);
  }
  st = fn->body(t->stream, eff, c->out_ptr, fn->ctx);
  if (st != GCA_OK) {
    st = gca__error_prefix(st, "graph_tree_run: capturing %s", fn->name);
    goto fail;
  }
  t->capturing = false;
  st = t->ops->stream_end_capture(t->stream, &c->graph);
  GCA_CHECK_IGNORE(gca_pool_end_capture(t->pool, t->stream));
  pool_routed = false;
  if (st != GCA_OK) {
    c->graph = NULL;
    goto fail;
  }
  st = t->ops->graph_node_count(c->graph, &c->graph_nodes);
  if (st != GCA_OK) {
    st = gca__error_prefix(st, "graph_tree_run: counting the nodes captured for %s", fn->name);
    goto fail;
  }
  if (t->ncap_rng) {
    c->rng = malloc(t->ncap_rng * sizeof(*c->rng));
    if (!c->rng) {
      st = gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_tree_run: no host memory to record %s",
                      fn->name);
      goto fail;
    }
    memcpy(c->rng, t->cap_rng, t->ncap_rng * sizeof(*c->rng));
    c->nrng = t->ncap_rng;
  }
  t->ncap_rng = 0;
  free(eff);
  return GCA_OK;

fail:
  t->capturing = false;
  t->ncap_rng = 0;
  abandon_capture(t);
  if (pool_routed)
    GCA_CHECK_IGNORE(gca_pool_end_capture(t->pool, t->stream));
  free(eff);
  capture_free(t, c);
  /* Whatever the failed capture allocated in the pool goes with the resync. */
  GCA_CHECK_IGNORE(sync_pool(t, parent));
  return st;
}

/* Fills the node's record of liveness around its recording: ancestor outputs
 * dead now (the recording may reuse them) and those live in its checkpoint. */
static gca_status_t node_liveness(gca_graph_tree_t *t, gca__gnode_t *n) {
  size_t total = n->fn->noutputs;
  for (gca__gnode_t *a = n->parent; a; a = a->parent)
    total += a->fn->noutputs;
  gca__out_ref_t *dead =
      GCA_FAILPOINT("graph_liveness") ? NULL : malloc((total + 1) * sizeof(*dead));
  gca__out_ref_t *live = malloc((total + 1) * sizeof(*live));
  if (!dead || !live) {
    free(dead);
    free(live);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_tree_run: no host memory to record %s",
                      n->fn->name);
  }
  size_t nd = 0, nl = 0;
  for (gca__gnode_t *a = n->parent; a; a = a->parent)
    for (size_t j = 0; j < a->fn->noutputs; j++) {
      gca__out_ref_t r = {a, j};
      if (out_is_live(t, r))
        live[nl++] = r;
      else
        dead[nd++] = r;
    }
  for (size_t j = 0; j < n->fn->noutputs; j++)
    live[nl++] = (gca__out_ref_t){n, j};
  free(n->dead);
  free(n->live_at_ckpt);
  n->dead = dead;
  n->ndead = nd;
  n->live_at_ckpt = live;
  n->nlive = nl;
  return GCA_OK;
}

/* Moves a successful capture's layout into the node (exec and ckpt are set by
 * the caller). Returns whether the output addresses changed. */
static bool node_take(gca__gnode_t *n, capture_t *c) {
  size_t ni = n->fn->ninputs, no = n->fn->noutputs;
  bool moved = false;
  for (size_t i = 0; i < no; i++)
    moved |= n->out_ptr[i] != c->out_ptr[i] || n->out_block[i] != c->out_block[i];
  memcpy(n->in_mode, c->in_mode, ni * sizeof(*n->in_mode));
  memcpy(n->in_addr, c->in_addr, ni * sizeof(void *));
  memcpy(n->staging, c->staging, ni * sizeof(void *));
  memcpy(n->out_ptr, c->out_ptr, no * sizeof(void *));
  memcpy(n->out_block, c->out_block, no * sizeof(void *));
  free(n->rng);
  n->rng = c->rng;
  n->nrng = c->nrng;
  c->rng = NULL;
  return moved;
}

/* ---- replay ---- */

static gca_status_t launch(gca_graph_tree_t *t, gca__gnode_t *n, void *const *inputs,
                           void **outputs) {
  gca_graph_fn_t *fn = n->fn;
  for (size_t i = 0; i < fn->ninputs; i++)
    if (n->in_mode[i] == IN_STAGED && n->shape->in[i])
      GCA_CHECK(t->ops->memcpy_async((gca_devptr_t)(uintptr_t)n->staging[i],
                                     (gca_devptr_t)(uintptr_t)inputs[i], n->shape->in[i],
                                     t->stream));
  GCA_CHECK(outs_reserve(t, fn->noutputs));
  if (n->nrng)
    GCA_CHECK(gca__graph_rng_prologue(t, n));
  gca_status_t st = t->ops->graph_launch(n->exec, t->stream);
  if (st != GCA_OK) {
    gca__graph_rng_unadvance(n);
    return st;
  }
  for (size_t i = 0; i < fn->noutputs; i++) {
    gca__live_out_t o = {.ptr = n->out_ptr[i],
                         .block = n->out_block[i],
                         .bytes = out_region(t, n->shape->out[i]),
                         .kind = OUT_RECORDED,
                         .ref = {n, i}};
    outs_push(t, o);
  }
  n->out_gen = t->gen;
  for (size_t i = 0; i < fn->noutputs; i++) {
    n->out_live[i] = true;
    outputs[i] = n->out_ptr[i];
  }
  t->pos = n;
  fn->last = n->shape;
  t->stats.replays++;
  return GCA_OK;
}

/* The first invariant of n's recording that the inputs break, or NONE. */
static gca_graph_rule_t check_invariants(const gca_graph_tree_t *t, const gca__gnode_t *n,
                                         void *const *inputs, long *arg, const void **old_addr,
                                         const void **new_addr) {
  for (size_t i = 0; i < n->fn->ninputs; i++) {
    if (n->in_mode[i] != IN_STAGED && inputs[i] != n->in_addr[i]) {
      *arg = (long)i;
      *old_addr = n->in_addr[i];
      *new_addr = inputs[i];
      return n->in_mode[i] == IN_FIXED ? GCA_GRAPH_RULE_STATIC_INPUT_MOVED
                                       : GCA_GRAPH_RULE_ANCESTOR_OUTPUT_MOVED;
    }
  }
  for (size_t i = 0; i < n->ndead; i++) {
    if (out_is_live(t, n->dead[i])) {
      *arg = -1;
      *old_addr = *new_addr = n->dead[i].node->out_ptr[n->dead[i].index];
      return GCA_GRAPH_RULE_OUTPUT_STILL_LIVE;
    }
  }
  return GCA_GRAPH_RULE_NONE;
}

static const char *rule_name(gca_graph_rule_t r) {
  static const char *const names[] = {"none",
                                      "static input moved",
                                      "ancestor output moved",
                                      "output still live",
                                      "update rejected",
                                      "capture failed",
                                      "instantiate failed",
                                      "launch failed",
                                      "restore failed",
                                      "eager forever",
                                      "shape changed"};
  return (size_t)r < GCA_ARRAY_SIZE(names) ? names[r] : "?";
}

/* A failure while recording, updating or launching: report it and run
 * eagerly, or fail the run when the tree was told to. */
static gca_status_t fail_to_eager(gca_graph_tree_t *t, gca_graph_fn_t *fn,
                                  const gca__shape_t *shape, gca_graph_rule_t rule,
                                  gca_status_t why, void *const *inputs, void **outputs) {
  if (t->opts.on_failure == GCA_GRAPH_ON_FAILURE_ERROR) {
    t->stats.failures++;
    return gca__error_prefix(why, "graph_tree_run: %s: %s", fn->name, rule_name(rule));
  }
  char detail[320];
  snprintf(detail, sizeof(detail), "%s: %s (%s): %s", fn->name, rule_name(rule),
           gca_status_name(why), gca_last_error());
  GCA_LOG_INFO("graphs: %s; running eagerly", detail);
  report(t, fn, GCA_GRAPH_EAGER, rule, -1, NULL, NULL, false, why, detail);
  return fallback(t, fn, shape, inputs, outputs);
}

/* ---- shapes ---- */

/* The shape of fn with these sizes: an interned one, else a new one (unknown).
 * NULL with *st set when there is no host memory for it. */
static gca__shape_t *shape_intern(gca_graph_fn_t *fn, const size_t *in, const size_t *out,
                                  gca_status_t *st) {
  size_t ni = fn->ninputs, no = fn->noutputs;
  for (gca__shape_t *s = fn->shapes; s; s = s->next)
    if ((!ni || memcmp(s->in, in, ni * sizeof(size_t)) == 0) &&
        (!no || memcmp(s->out, out, no * sizeof(size_t)) == 0))
      return s;
  gca__shape_t *s =
      GCA_FAILPOINT("graph_shape") ? NULL : calloc(1, sizeof(*s) + (ni + no + 1) * sizeof(size_t));
  if (!s) {
    *st = gca__error(GCA_ERR_OUT_OF_MEMORY,
                     "graph_tree_run_shape: no host memory for a shape of %s", fn->name);
    return NULL;
  }
  s->in = (size_t *)(s + 1);
  s->out = s->in + ni;
  if (ni)
    memcpy(s->in, in, ni * sizeof(size_t));
  if (no)
    memcpy(s->out, out, no * sizeof(size_t));
  if (fn->shapes) { /* the registered shape stays first */
    s->next = fn->shapes->next;
    fn->shapes->next = s;
  } else {
    fn->shapes = s;
  }
  return s;
}

/* fn was warmed up or recorded at `shape`. */
static void shape_known(gca_graph_tree_t *t, gca__shape_t *shape) {
  if (!shape->known)
    t->stats.shapes++;
  shape->known = true;
}

/* Describes fn's change from the shape it last ran at to `shape` in detail;
 * returns the first input whose bytes differ, or -1 when only outputs do. */
static long shape_change(const gca_graph_fn_t *fn, const gca__shape_t *shape, char *detail,
                         size_t len) {
  const gca__shape_t *old = fn->last ? fn->last : fn->shapes;
  for (size_t i = 0; i < fn->ninputs; i++)
    if (old->in[i] != shape->in[i]) {
      snprintf(detail, len, "%s: shape changed: input %zu %zu -> %zu bytes", fn->name, i,
               old->in[i], shape->in[i]);
      return (long)i;
    }
  for (size_t i = 0; i < fn->noutputs; i++)
    if (old->out[i] != shape->out[i]) {
      snprintf(detail, len, "%s: shape changed: output %zu %zu -> %zu bytes", fn->name, i,
               old->out[i], shape->out[i]);
      return -1;
    }
  snprintf(detail, len, "%s: shape changed", fn->name); /* not reached: shapes are interned */
  return -1;
}

/* ---- the state machine ---- */

/* Records (or re-records) node n below t->pos and runs it. For an invariant
 * break (rule != NONE) an update is tried first when only addresses moved; a
 * shape change (n's shape is new to its function) is a re-record that does
 * not count toward rerecord_limit. */
static gca_status_t record(gca_graph_tree_t *t, gca__gnode_t *n, void *const *inputs,
                           void **outputs, gca_graph_rule_t broken, long arg, const void *old_addr,
                           const void *new_addr) {
  gca_graph_fn_t *fn = n->fn;
  gca__gnode_t *parent = t->pos;
  capture_t c;
  gca_graph_rule_t frule;
  char detail[320];
  bool new_shape = broken == GCA_GRAPH_RULE_SHAPE_CHANGED;
  if (new_shape)
    arg = shape_change(fn, n->shape, detail, sizeof(detail));
  else
    snprintf(detail, sizeof(detail), "%s: %s", fn->name, rule_name(broken));
  gca_status_t st = capture_body(t, parent, fn, n->shape, inputs, &c, &frule);
  if (st != GCA_OK)
    return fail_to_eager(t, fn, n->shape, frule, st, inputs, outputs);

  gca_graph_action_t action = n->recorded || new_shape ? GCA_GRAPH_RERECORD : GCA_GRAPH_RECORD;
  bool addresses_only =
      broken == GCA_GRAPH_RULE_STATIC_INPUT_MOVED || broken == GCA_GRAPH_RULE_ANCESTOR_OUTPUT_MOVED;
  if (n->recorded && addresses_only) {
    gca_graph_update_info_t info;
    st = t->ops->graph_exec_update(n->exec, c.graph, &info);
    if (st == GCA_OK) {
      action = GCA_GRAPH_UPDATE;
    } else {
      snprintf(detail, sizeof(detail), "%s: %s; exec update refused (%s): %s", fn->name,
               rule_name(broken), gca_status_name(st), gca_last_error());
    }
  }
  if (action == GCA_GRAPH_RERECORD && !new_shape && fn->rerecords >= t->opts.rerecord_limit) {
    fn->eager_forever = true;
    capture_free(t, &c);
    GCA_CHECK_IGNORE(sync_pool(t, parent));
    snprintf(detail, sizeof(detail), "%s: %s after %u re-records (limit); eager from now on",
             fn->name, rule_name(broken), fn->rerecords);
    report(t, fn, GCA_GRAPH_EAGER, broken, arg, old_addr, new_addr, true, GCA_OK, detail);
    return fallback(t, fn, n->shape, inputs, outputs);
  }

  gca_graph_exec_t exec = NULL;
  if (action != GCA_GRAPH_UPDATE) {
    st = t->ops->graph_instantiate(c.graph, &exec);
    /* Note [Uploading recordings]: the executable graph is uploaded on the
     * tree's stream right away (cuGraphUpload), so the device-side setup is
     * done once here, ordered with the tree's work, and not on the first
     * replay. A failed upload is a failed instantiation: the recording is
     * dropped and the function runs eagerly. */
    if (st == GCA_OK && (st = t->ops->graph_upload(exec, t->stream)) != GCA_OK) {
      st = gca__error_prefix(st, "graph_tree_run: uploading the recording of %s", fn->name);
      GCA_CHECK_IGNORE(t->ops->graph_exec_destroy(exec));
      exec = NULL;
    }
    if (st != GCA_OK) {
      capture_free(t, &c);
      GCA_CHECK_IGNORE(sync_pool(t, parent));
      return fail_to_eager(t, fn, n->shape, GCA_GRAPH_RULE_INSTANTIATE_FAILED, st, inputs, outputs);
    }
    t->stats.instantiations++;
  }
  gca_pool_state_t *ckpt = NULL;
  st = gca_pool_checkpoint(t->pool, &ckpt);
  if (st != GCA_OK) {
    if (exec)
      GCA_CHECK_IGNORE(t->ops->graph_exec_destroy(exec));
    capture_free(t, &c);
    GCA_CHECK_IGNORE(sync_pool(t, parent));
    return fail_to_eager(t, fn, n->shape, GCA_GRAPH_RULE_CAPTURE_FAILED, st, inputs, outputs);
  }

  /* Commit: the node now describes this capture. */
  t->stats.graph_nodes = t->stats.graph_nodes - n->graph_nodes + c.graph_nodes;
  n->graph_nodes = c.graph_nodes;
  bool moved = node_take(n, &c);
  capture_free(t, &c);
  if (action != GCA_GRAPH_UPDATE) {
    if (n->exec) {
      GCA_CHECK_IGNORE(t->ops->graph_exec_destroy(n->exec));
      t->stats.nodes--;
    }
    n->exec = exec;
    t->stats.nodes++;
  }
  gca_pool_state_free(n->ckpt);
  n->ckpt = ckpt;
  n->recorded = true;
  if (action != GCA_GRAPH_UPDATE || moved)
    node_drop_children(t, n);
  st = node_liveness(t, n);
  if (st != GCA_OK) {
    node_clear(t, n);
    return fail_to_eager(t, fn, n->shape, GCA_GRAPH_RULE_CAPTURE_FAILED, st, inputs, outputs);
  }
  switch (action) {
  case GCA_GRAPH_RECORD:
    t->stats.records++;
    break;
  case GCA_GRAPH_UPDATE:
    t->stats.updates++;
    break;
  default:
    t->stats.rerecords++;
    if (new_shape)
      t->stats.shape_rerecords++;
    else
      fn->rerecords++;
    break;
  }
  shape_known(t, n->shape);
  report(t, fn, action, broken, arg, old_addr, new_addr, false, GCA_OK,
         action == GCA_GRAPH_RECORD ? fn->name : detail);

  st = launch(t, n, inputs, outputs);
  if (st != GCA_OK)
    return fail_to_eager(t, fn, n->shape, GCA_GRAPH_RULE_LAUNCH_FAILED, st, inputs, outputs);
  return GCA_OK;
}

/* ---- public API ---- */

GCA_API gca_status_t gca_graph_tree_create(int device, const gca_graph_tree_options_t *opts,
                                           gca_graph_tree_t **out) {
  gca_status_t st;
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_tree_create: tree is NULL");
  *out = NULL;
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  if (opts) {
    if (opts->size < sizeof(size_t) || opts->size > sizeof(o))
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "graph_tree_create: options size %zu (this library knows %zu)", opts->size,
                        sizeof(o));
    memcpy(&o, opts, opts->size);
    o.size = sizeof(o);
  }
  if ((unsigned)o.capture_mode > GCA_GRAPH_CAPTURE_RELAXED)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_tree_create: capture mode %d",
                      (int)o.capture_mode);
  if ((unsigned)o.on_failure > GCA_GRAPH_ON_FAILURE_ERROR)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_tree_create: on_failure %d",
                      (int)o.on_failure);
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return st;
  int count = 0;
  GCA_CHECK(ops->device_count(&count));
  if (device < 0 || device >= count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_tree_create: device %d (%d present)", device,
                      count);
  if (o.poison_stale && strcmp(ops->name, "sim") != 0)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "graph_tree_create: poison_stale needs the sim backend (this is %s)",
                      ops->name);
  gca_graph_tree_t *t = calloc(1, sizeof(*t));
  if (!t)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_tree_create: no host memory");
  t->device = device;
  t->opts = o;
  t->ops = ops;
  t->pos = &t->root;
  t->stats.size = sizeof(t->stats);
  GCA_CHECK_GOTO(ops->stream_create(device, GCA_STREAM_NON_BLOCKING, 0, &t->stream), st,
                 fail_stream);
  if (o.pool) {
    size_t reserved = 0, allocated = 0;
    GCA_CHECK_GOTO(gca_pool_memory(o.pool, &reserved, &allocated), st, fail_pool);
    if (allocated != 0) {
      st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "the pool given holds %zu allocated bytes; a tree needs it empty", allocated);
      goto fail_pool;
    }
    GCA_CHECK_GOTO(gca_pool_retain(o.pool), st, fail_pool);
    t->pool = o.pool;
  } else {
    GCA_CHECK_GOTO(gca_pool_create(device, NULL, &t->pool), st, fail_pool);
  }
  GCA_CHECK_GOTO(gca_pool_checkpoint(t->pool, &t->root_ckpt), st, fail_ckpt);
  pthread_mutex_lock(&live_mu);
  t->next_live = live_trees;
  live_trees = t;
  pthread_mutex_unlock(&live_mu);
  *out = t;
  return GCA_OK;

fail_ckpt:
  GCA_CHECK_IGNORE(gca_pool_release(t->pool));
fail_pool:
  GCA_CHECK_IGNORE(gca__stream_destroy_retired(ops, t->stream));
fail_stream:
  free(t);
  return gca__error_prefix(st, "graph_tree_create");
}

GCA_API gca_status_t gca_graph_tree_destroy(gca_graph_tree_t *t) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_destroy", t));
  gca_status_t st = t->ops->stream_synchronize(t->stream);
  if (st != GCA_OK)
    return gca__error_prefix(st, "graph_tree_destroy");
  pthread_mutex_lock(&live_mu);
  for (gca_graph_tree_t **p = &live_trees; *p; p = &(*p)->next_live)
    if (*p == t) {
      *p = t->next_live;
      break;
    }
  pthread_mutex_unlock(&live_mu);
  unpoison_all(t);
  for (size_t i = 0; i < t->nouts; i++)
    if (t->outs[i].kind == OUT_EAGER && !t->outs[i].released)
      GCA_CHECK_IGNORE(gca_free(t->outs[i].block));
  node_free_subtree(t, &t->root);
  /* The empty layout frees every block of the pool, recorded or warm-up. */
  GCA_CHECK_IGNORE(gca_pool_restore(t->pool, t->root_ckpt, NULL));
  gca_pool_state_free(t->root_ckpt);
  gca__graph_rng_free_all(t);
  GCA_CHECK_IGNORE(gca_pool_release(t->pool));
  GCA_CHECK_IGNORE(gca__stream_destroy_retired(t->ops, t->stream));
  for (gca_graph_fn_t *f = t->fns; f;) {
    gca_graph_fn_t *next = f->next;
    for (gca__shape_t *sh = f->shapes; sh;) {
      gca__shape_t *sn = sh->next;
      free(sh);
      sh = sn;
    }
    free(f->name);
    free(f->inputs);
    free(f);
    f = next;
  }
  free(t->outs);
  free(t->poisoned);
  free(t->cap_rng);
  free(t);
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_tree_stream(gca_graph_tree_t *t, gca_stream_t *stream) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_stream", t));
  if (!stream)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_tree_stream: stream is NULL");
  *stream = t->stream;
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_tree_synchronize(gca_graph_tree_t *t) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_synchronize", t));
  return t->ops->stream_synchronize(t->stream);
}

GCA_API gca_status_t gca_graph_tree_pool(gca_graph_tree_t *t, gca_pool_t **pool) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_pool", t));
  if (!pool)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_tree_pool: pool is NULL");
  *pool = t->pool;
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_fn_register(gca_graph_tree_t *t, const gca_graph_fn_desc_t *desc,
                                           gca_graph_fn_t **out) {
  GCA_CHECK(gca__graph_tree_check("graph_fn_register", t));
  if (!desc || !out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_fn_register: %s is NULL",
                      desc ? "fn" : "desc");
  *out = NULL;
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  if (desc->size < sizeof(size_t) || desc->size > sizeof(d))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "graph_fn_register: desc size %zu (this library knows %zu)", desc->size,
                      sizeof(d));
  memcpy(&d, desc, desc->size);
  const char *name = d.name ? d.name : "fn";
  if (!d.body)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_fn_register: %s has a NULL body", name);
  if ((d.ninputs && !d.inputs) || (d.noutputs && !d.output_bytes))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "graph_fn_register: %s declares %zu inputs and %zu outputs but the %s "
                      "array is NULL",
                      name, d.ninputs, d.noutputs, d.ninputs && !d.inputs ? "inputs" : "outputs");
  for (size_t i = 0; i < d.ninputs; i++)
    if ((unsigned)d.inputs[i].kind > GCA_GRAPH_INPUT_MUTATED)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_fn_register: %s input %zu: kind %d", name,
                        i, (int)d.inputs[i].kind);
  for (size_t i = 0; i < d.noutputs; i++)
    if (d.output_bytes[i] == 0)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_fn_register: %s output %zu has 0 bytes",
                        name, i);
  gca_graph_fn_t *f = calloc(1, sizeof(*f));
  size_t *in_bytes = malloc((d.ninputs + 1) * sizeof(size_t));
  gca_status_t st = GCA_OK;
  if (f) {
    f->name = strdup(name);
    f->inputs = malloc((d.ninputs + 1) * sizeof(*f->inputs));
    f->ninputs = d.ninputs;
    f->noutputs = d.noutputs;
  }
  if (f && f->name && f->inputs && in_bytes) {
    for (size_t i = 0; i < d.ninputs; i++)
      in_bytes[i] = d.inputs[i].bytes;
    shape_intern(f, in_bytes, d.output_bytes, &st);
  }
  free(in_bytes);
  if (!f || !f->name || !f->inputs || !f->shapes) {
    if (f) {
      free(f->name);
      free(f->inputs);
    }
    free(f);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_fn_register: no host memory for %s", name);
  }
  if (d.ninputs)
    memcpy(f->inputs, d.inputs, d.ninputs * sizeof(*f->inputs));
  f->tree = t;
  f->body = d.body;
  f->ctx = d.ctx;
  f->next = t->fns;
  t->fns = f;
  *out = f;
  return GCA_OK;
}

/* The checks common to gca_graph_tree_run and gca_graph_tree_run_shape (`op`). */
static gca_status_t run_check(const char *op, gca_graph_tree_t *t, const gca_graph_fn_t *fn,
                              void *const *inputs, size_t ninputs, void **outputs,
                              size_t noutputs) {
  GCA_CHECK(gca__graph_tree_check(op, t));
  if (!fn)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: fn is NULL", op);
  if (fn->tree != t)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: function %s belongs to tree %p, not %p", op,
                      fn->name, (void *)fn->tree, (void *)t);
  if (ninputs != fn->ninputs || noutputs != fn->noutputs)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: %s takes %zu inputs and %zu outputs, called with %zu and %zu", op,
                      fn->name, fn->ninputs, fn->noutputs, ninputs, noutputs);
  if ((ninputs && !inputs) || (noutputs && !outputs))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s: %s array is NULL", op, fn->name,
                      ninputs && !inputs ? "inputs" : "outputs");
  if (t->capturing)
    return gca__error(GCA_ERR_INVALID_STATE, "%s: %s called from a body", op, fn->name);
  return GCA_OK;
}

/* A NULL input is refused unless the run reads none of it: its bytes in
 * `shape`, or in in_bytes when shape is NULL. */
static gca_status_t inputs_check(const char *op, const gca_graph_fn_t *fn,
                                 const gca__shape_t *shape, const size_t *in_bytes,
                                 void *const *inputs) {
  for (size_t i = 0; i < fn->ninputs; i++)
    if (!inputs[i] && (shape ? shape->in[i] : in_bytes[i]))
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s input %zu is NULL", op, fn->name, i);
  return GCA_OK;
}

/* Runs fn at `shape` (one of fn->shapes): the state machine of graphs.h. */
static gca_status_t run_at(gca_graph_tree_t *t, gca_graph_fn_t *fn, gca__shape_t *shape,
                           void *const *inputs, void **outputs) {
  unpoison_all(t);
  if (t->mode == MODE_EAGER_POOL) {
    gca_status_t st = run_eager(t, fn, shape, inputs, outputs, true);
    if (st == GCA_OK)
      t->stats.warmups++;
    return st;
  }
  if (fn->eager_forever) {
    report(t, fn, GCA_GRAPH_EAGER, GCA_GRAPH_RULE_EAGER_FOREVER, -1, NULL, NULL, true, GCA_OK,
           fn->name);
    return fallback(t, fn, shape, inputs, outputs);
  }
  gca_status_t st = GCA_OK;
  gca__gnode_t *n = node_child(t, t->pos, fn, shape, &st);
  if (!n)
    return st;
  if (!n->recorded) {
    /* a new shape of a function that ran in the pool: its own recording, at once */
    if (!shape->known && fn->last)
      return record(t, n, inputs, outputs, GCA_GRAPH_RULE_SHAPE_CHANGED, -1, NULL, NULL);
    if (n->warmups < t->opts.warmup_runs) {
      st = sync_pool(t, t->pos);
      if (st != GCA_OK)
        return fail_to_eager(t, fn, shape, GCA_GRAPH_RULE_RESTORE_FAILED, st, inputs, outputs);
      st = run_eager(t, fn, shape, inputs, outputs, true);
      if (st != GCA_OK)
        return st; /* no warm-up took place: the next run tries again */
      t->mode = MODE_EAGER_POOL;
      n->warmups++;
      t->stats.warmups++;
      shape_known(t, shape);
      fn->last = shape;
      report(t, fn, GCA_GRAPH_WARMUP, GCA_GRAPH_RULE_NONE, -1, NULL, NULL, false, GCA_OK, fn->name);
      return GCA_OK;
    }
    return record(t, n, inputs, outputs, GCA_GRAPH_RULE_NONE, -1, NULL, NULL);
  }
  long arg = -1;
  const void *old_addr = NULL, *new_addr = NULL;
  gca_graph_rule_t rule = check_invariants(t, n, inputs, &arg, &old_addr, &new_addr);
  if (GCA_LIKELY(rule == GCA_GRAPH_RULE_NONE)) {
    st = launch(t, n, inputs, outputs);
    if (st != GCA_OK)
      return fail_to_eager(t, fn, shape, GCA_GRAPH_RULE_LAUNCH_FAILED, st, inputs, outputs);
    return GCA_OK;
  }
  return record(t, n, inputs, outputs, rule, arg, old_addr, new_addr);
}

GCA_API gca_status_t gca_graph_tree_run(gca_graph_tree_t *t, gca_graph_fn_t *fn,
                                        void *const *inputs, size_t ninputs, void **outputs,
                                        size_t noutputs) {
  static const char op[] = "graph_tree_run";
  GCA_CHECK(run_check(op, t, fn, inputs, ninputs, outputs, noutputs));
  GCA_CHECK(inputs_check(op, fn, fn->shapes, NULL, inputs));
  return run_at(t, fn, fn->shapes, inputs, outputs);
}

GCA_API gca_status_t gca_graph_tree_run_shape(gca_graph_tree_t *t, gca_graph_fn_t *fn,
                                              const size_t *input_bytes, const size_t *output_bytes,
                                              void *const *inputs, size_t ninputs, void **outputs,
                                              size_t noutputs) {
  static const char op[] = "graph_tree_run_shape";
  GCA_CHECK(run_check(op, t, fn, inputs, ninputs, outputs, noutputs));
  if ((ninputs && !input_bytes) || (noutputs && !output_bytes))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: %s: %s is NULL (the bytes of each of its %zu %s)", op, fn->name,
                      ninputs && !input_bytes ? "input_bytes" : "output_bytes",
                      ninputs && !input_bytes ? ninputs : noutputs,
                      ninputs && !input_bytes ? "inputs" : "outputs");
  for (size_t i = 0; i < noutputs; i++)
    if (output_bytes[i] == 0)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s output %zu has 0 bytes", op, fn->name, i);
  GCA_CHECK(inputs_check(op, fn, NULL, input_bytes, inputs));
  gca_status_t st = GCA_OK;
  gca__shape_t *shape = shape_intern(fn, input_bytes, output_bytes, &st);
  if (!shape)
    return st;
  return run_at(t, fn, shape, inputs, outputs);
}

GCA_API gca_status_t gca_graph_tree_release(gca_graph_tree_t *t, void *output) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_release", t));
  for (size_t i = 0; i < t->nouts; i++) {
    gca__live_out_t *o = &t->outs[i];
    if (o->ptr != output || o->released)
      continue;
    o->released = true;
    if (o->kind == OUT_RECORDED)
      o->ref.node->out_live[o->ref.index] = false;
    else
      GCA_CHECK(gca_free(o->block));
    return GCA_OK;
  }
  return gca__error(GCA_ERR_INVALID_POINTER,
                    "graph_tree_release: %p is not a live output of tree %p (released, stale or "
                    "never an output)",
                    output, (void *)t);
}

GCA_API gca_status_t gca_graph_tree_step(gca_graph_tree_t *t) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_step", t));
  if (t->opts.poison_stale)
    GCA_CHECK(t->ops->stream_synchronize(t->stream));
  for (size_t i = 0; i < t->nouts; i++) {
    gca__live_out_t *o = &t->outs[i];
    if (!o->released && o->kind != OUT_RECORDED)
      GCA_CHECK_IGNORE(gca_free(o->block));
    if (t->opts.poison_stale && o->kind != OUT_EAGER)
      poison(t, o->ptr, o->bytes);
  }
  t->nouts = 0;
  t->gen++;
  t->stats.generation = t->gen;
  t->pos = &t->root;
  t->mode = MODE_TREE;
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_tree_output_valid(gca_graph_tree_t *t, const void *ptr,
                                                 bool *valid) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_output_valid", t));
  if (!valid)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_tree_output_valid: valid is NULL");
  *valid = false;
  for (size_t i = 0; i < t->nouts; i++)
    if (t->outs[i].ptr == ptr && !t->outs[i].released)
      *valid = true;
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_tree_stats(gca_graph_tree_t *t, gca_graph_stats_t *out) {
  GCA_CHECK(gca__graph_tree_check("graph_tree_stats", t));
  if (!out || out->size < sizeof(size_t))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "graph_tree_stats: out is NULL or its size is not set");
  gca_graph_stats_t s = t->stats;
  GCA_CHECK(gca_pool_memory(t->pool, &s.pool_reserved, &s.pool_allocated));
  size_t n = out->size < sizeof(s) ? out->size : sizeof(s);
  memcpy(out, &s, n);
  out->size = n;
  return GCA_OK;
}
