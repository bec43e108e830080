/* SPDX-License-Identifier: Apache-2.0 */
/* schedule.c - the overlap scheduler and its baselines (program order,
 * collectives as early as possible, prefetch of the next collective).
 *
 * The one idea (Note [Overlap by keys]): every schedule is a topological
 * order of the graph's groups and ops, emitted by always taking the ready
 * node with the smallest key (ties: program order). Validity comes from the
 * edges, determinism from the keys; a policy only chooses keys. Compute ops
 * keep their program positions as keys; waits sink to just before the first
 * op that needs them; the overlap policy gives each collective the latest
 * issue point at which, in the program's compute timeline and behind the
 * collectives its communicator runs before it, it still ends before it is
 * needed ("just in time", so gathered buffers are not held longer than the
 * hiding needs); then, while the order's peak exceeds the budget, the
 * collective hoisted furthest past the peak step (the one needed latest) is
 * moved to just after it, or a sunk wait whose frees the peak needs goes back
 * to its program position. If nothing fits, the program order is returned. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

typedef struct node {
  size_t *members; /* ops in order (a group's given order; else one op) */
  size_t nmem;
  bool owned;  /* members allocated here (else a group's array, borrowed) */
  size_t prog; /* program index of the first member */
  size_t coll; /* the collective among the members, or GCA__NONE */
  size_t wait; /* a lone wait op, or GCA__NONE */
  double key;
  double base;           /* the key before any memory repair */
  size_t first_consumer; /* waits: smallest program index of a node depending on it */
  double need;           /* collectives: when the compute timeline needs the result */
  bool needed;           /* collectives: some op of the step reads their result */
  double end;            /* collectives: when they end in the last simulation */
  size_t *succ;
  size_t nsucc, capsucc;
  size_t indeg;
} node_t;

typedef struct plan {
  const gca_opgraph_t *g;
  node_t *nodes;
  size_t nnodes;
  size_t *node_of; /* op -> node */
  size_t *pos;     /* op -> position in the current order */
  size_t *heap, nheap;
  size_t *indeg;
} plan_t;

static bool add_succ(node_t *u, size_t v) {
  if (u->nsucc == u->capsucc) {
    size_t ncap = u->capsucc ? u->capsucc * 2 : 4;
    size_t *s = realloc(u->succ, ncap * sizeof(*s));
    if (!s)
      return false;
    u->succ = s;
    u->capsucc = ncap;
  }
  u->succ[u->nsucc++] = v;
  return true;
}

static void plan_free(plan_t *p) {
  for (size_t i = 0; i < p->nnodes && p->nodes; i++) {
    free(p->nodes[i].succ);
    if (p->nodes[i].owned)
      free(p->nodes[i].members);
  }
  free(p->nodes);
  free(p->node_of);
  free(p->pos);
  free(p->heap);
  free(p->indeg);
}

static gca_status_t plan_build(plan_t *p, const gca_opgraph_t *g, bool keep_comm_order) {
  size_t n = g->nops;
  memset(p, 0, sizeof(*p));
  p->g = g;
  p->nodes = calloc(n + 1, sizeof(node_t));
  p->node_of = malloc((n + 1) * sizeof(size_t));
  p->pos = malloc((n + 1) * sizeof(size_t));
  p->heap = malloc((n + 1) * sizeof(size_t));
  p->indeg = malloc((n + 1) * sizeof(size_t));
  if (!p->nodes || !p->node_of || !p->pos || !p->heap || !p->indeg)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_schedule: no host memory");
  for (size_t i = 0; i < n; i++)
    p->node_of[i] = GCA__NONE;
  for (size_t i = 0; i < n; i++) {
    if (p->node_of[i] != GCA__NONE)
      continue;
    node_t *nd = &p->nodes[p->nnodes];
    size_t grp = g->ops[i].group;
    if (grp != GCA__NONE) {
      nd->members = g->groups[grp]; /* borrowed */
      nd->nmem = g->group_len[grp];
    } else {
      nd->members = malloc(sizeof(size_t));
      if (!nd->members)
        return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_schedule: no host memory");
      nd->members[0] = i;
      nd->nmem = 1;
      nd->owned = true;
    }
    nd->prog = nd->members[0];
    nd->coll = nd->wait = GCA__NONE;
    nd->first_consumer = GCA__NONE;
    for (size_t k = 0; k < nd->nmem; k++) {
      size_t op = nd->members[k];
      p->node_of[op] = p->nnodes;
      if (g->ops[op].kind == GCA_OP_COLLECTIVE && nd->coll == GCA__NONE)
        nd->coll = op;
    }
    if (nd->nmem == 1 && g->ops[i].kind == GCA_OP_WAIT)
      nd->wait = i;
    nd->key = nd->base = (double)nd->prog;
    p->nnodes++;
  }
  for (size_t v = 0; v < n; v++)
    for (size_t k = 0; k < g->ops[v].npreds; k++) {
      size_t a = p->node_of[g->ops[v].preds[k]], b = p->node_of[v];
      if (a != b && !add_succ(&p->nodes[a], b))
        return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_schedule: no host memory");
    }
  if (keep_comm_order) /* chain each communicator's collectives in program order */
    for (size_t c = 0; c < g->ncomms; c++) {
      size_t prev = GCA__NONE;
      for (size_t i = 0; i < p->nnodes; i++) {
        if (p->nodes[i].coll == GCA__NONE || g->ops[p->nodes[i].coll].comm_idx != c)
          continue;
        if (prev != GCA__NONE && !add_succ(&p->nodes[prev], i))
          return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_schedule: no host memory");
        prev = i;
      }
    }
  for (size_t i = 0; i < p->nnodes; i++)
    for (size_t k = 0; k < p->nodes[i].nsucc; k++) {
      node_t *s = &p->nodes[p->nodes[i].succ[k]];
      if (p->nodes[i].wait != GCA__NONE &&
          (p->nodes[i].first_consumer == GCA__NONE || s->prog < p->nodes[i].first_consumer))
        p->nodes[i].first_consumer = s->prog;
    }
  return GCA_OK;
}

/* ---- the emission (Note [Overlap by keys]) ---- */

static bool before(const plan_t *p, size_t a, size_t b) {
  const node_t *x = &p->nodes[a], *y = &p->nodes[b];
  return x->key < y->key || (x->key == y->key && x->prog < y->prog);
}

static void heap_push(plan_t *p, size_t v) {
  size_t i = p->nheap++;
  p->heap[i] = v;
  while (i > 0 && before(p, p->heap[i], p->heap[(i - 1) / 2])) {
    size_t t = p->heap[i];
    p->heap[i] = p->heap[(i - 1) / 2];
    p->heap[(i - 1) / 2] = t;
    i = (i - 1) / 2;
  }
}

static size_t heap_pop(plan_t *p) {
  size_t top = p->heap[0];
  p->heap[0] = p->heap[--p->nheap];
  for (size_t i = 0;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < p->nheap && before(p, p->heap[l], p->heap[m]))
      m = l;
    if (r < p->nheap && before(p, p->heap[r], p->heap[m]))
      m = r;
    if (m == i)
      break;
    size_t t = p->heap[i];
    p->heap[i] = p->heap[m];
    p->heap[m] = t;
    i = m;
  }
  return top;
}

static gca_status_t emit(plan_t *p, size_t *order) {
  for (size_t i = 0; i < p->nnodes; i++)
    p->indeg[i] = 0;
  for (size_t i = 0; i < p->nnodes; i++)
    for (size_t k = 0; k < p->nodes[i].nsucc; k++)
      p->indeg[p->nodes[i].succ[k]]++;
  p->nheap = 0;
  for (size_t i = 0; i < p->nnodes; i++)
    if (p->indeg[i] == 0)
      heap_push(p, i);
  size_t out = 0;
  while (p->nheap) {
    size_t v = heap_pop(p);
    const node_t *nd = &p->nodes[v];
    for (size_t k = 0; k < nd->nmem; k++) {
      p->pos[nd->members[k]] = out;
      order[out++] = nd->members[k];
    }
    for (size_t k = 0; k < nd->nsucc; k++)
      if (--p->indeg[nd->succ[k]] == 0)
        heap_push(p, nd->succ[k]);
  }
  if (out != p->g->nops)
    return gca__error(GCA_ERR_INTERNAL, "opgraph_schedule: %zu of %zu ops emitted (a cycle)", out,
                      p->g->nops);
  return GCA_OK;
}

/* ---- keys ---- */

static void sink_waits(plan_t *p) {
  for (size_t i = 0; i < p->nnodes; i++) {
    node_t *nd = &p->nodes[i];
    if (nd->wait != GCA__NONE && nd->first_consumer != GCA__NONE)
      nd->key = nd->base = (double)nd->first_consumer - 0.25;
  }
}

static int cmp_need(const void *a, const void *b, void *ctx) {
  const plan_t *p = ctx;
  const node_t *x = &p->nodes[*(const size_t *)a], *y = &p->nodes[*(const size_t *)b];
  if (x->need != y->need)
    return x->need < y->need ? -1 : 1;
  return x->prog < y->prog ? -1 : x->prog > y->prog;
}

/* Issue before the last program op whose compute start is at or before `start`. */
static void set_issue(plan_t *p, node_t *nd, const double *t, size_t n, double start) {
  size_t lo = 0, hi = n;
  if (start < 0) {
    hi = 0;
  } else {
    while (lo < hi) {
      size_t mid = lo + (hi - lo + 1) / 2;
      if (t[mid] <= start)
        lo = mid;
      else
        hi = mid - 1;
    }
  }
  (void)p;
  double key = (double)lo - 0.5;
  nd->key = nd->base = key < (double)nd->prog ? key : (double)nd->prog;
}

static int cmp_key(const void *a, const void *b, void *ctx) {
  const plan_t *p = ctx;
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return before(p, x, y) ? -1 : before(p, y, x) ? 1 : 0;
}

/* Runs each communicator's stream over the collectives in key order, each
 * starting once the compute stream reaches its issue point (program
 * timeline t) and its communicator is free; records the ends. With `fix`,
 * moves a needed collective that ends late earlier by its lateness; returns
 * whether any moved. cs: room for p->nnodes indices (the caller's, so that
 * the order never depends on whether a scratch allocation succeeded). */
static bool simulate(plan_t *p, const double *t, size_t n, bool fix, size_t *cs) {
  const gca_opgraph_t *g = p->g;
  bool moved = false;
  for (size_t c = 0; c < g->ncomms; c++) {
    size_t m = 0;
    for (size_t i = 0; i < p->nnodes; i++)
      if (p->nodes[i].coll != GCA__NONE && g->ops[p->nodes[i].coll].comm_idx == c)
        cs[m++] = i;
    qsort_r(cs, m, sizeof(size_t), cmp_key, p);
    double free_at = 0;
    for (size_t k = 0; k < m; k++) {
      node_t *nd = &p->nodes[cs[k]];
      double kf = nd->key < 0 ? 0 : ceil(nd->key);
      size_t j = kf > (double)n ? n : (size_t)kf;
      double issue = t[j];
      double start = issue > free_at ? issue : free_at;
      nd->end = start + g->ops[nd->coll].us;
      free_at = nd->end;
      if (fix && nd->needed && nd->end > nd->need + 1e-9 && nd->key > -0.5) {
        double old = nd->key;
        set_issue(p, nd, t, n, issue - (nd->end - nd->need));
        moved |= nd->key < old;
      }
    }
  }
  return moved;
}

/* Note [Overlap by keys]: the just-in-time issue points. */
static gca_status_t jit_keys(plan_t *p, bool keep_comm_order, gca_schedule_policy_t policy) {
  const gca_opgraph_t *g = p->g;
  size_t n = g->nops;
  double *t = malloc((n + 1) * sizeof(double)); /* t[j]: compute done before program op j */
  size_t *cs = malloc((p->nnodes + 1) * sizeof(size_t));
  if (!t || !cs) {
    free(t);
    free(cs);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_schedule: no host memory");
  }
  t[0] = 0;
  for (size_t j = 0; j < n; j++)
    t[j + 1] = t[j] + (g->ops[j].kind == GCA_OP_COMPUTE ? g->ops[j].us : 0);
  for (size_t i = 0; i < p->nnodes; i++) {
    node_t *nd = &p->nodes[i];
    if (nd->coll == GCA__NONE)
      continue;
    node_t *w = &p->nodes[p->node_of[g->ops[nd->coll].wait]];
    nd->needed = w->first_consumer != GCA__NONE;
    nd->need = nd->needed ? t[w->first_consumer] : t[n];
  }
  for (size_t c = 0; c < g->ncomms; c++) {
    size_t m = 0;
    for (size_t i = 0; i < p->nnodes; i++)
      if (p->nodes[i].coll != GCA__NONE && g->ops[p->nodes[i].coll].comm_idx == c)
        cs[m++] = i;
    if (policy == GCA_SCHEDULE_EARLIEST) {
      for (size_t k = 0; k < m; k++)
        p->nodes[cs[k]].key = p->nodes[cs[k]].base = -1.0;
      continue;
    }
    if (policy == GCA_SCHEDULE_PREFETCH_NEXT) {
      /* each collective issued where its predecessor (program order) is awaited */
      for (size_t k = 1; k < m; k++) {
        node_t *nd = &p->nodes[cs[k]];
        const node_t *prevw = &p->nodes[p->node_of[g->ops[p->nodes[cs[k - 1]].coll].wait]];
        double key = prevw->key + 0.01;
        nd->key = nd->base = key < (double)nd->prog ? key : (double)nd->prog;
      }
      continue;
    }
    if (!keep_comm_order)
      qsort_r(cs, m, sizeof(size_t), cmp_need, p);
    double latest = INFINITY;
    for (size_t k = m; k-- > 0;) {
      node_t *nd = &p->nodes[cs[k]];
      if (!nd->needed)
        continue; /* issued where the program issues it (below) */
      double fin = nd->need < latest ? nd->need : latest;
      double start = fin - g->ops[nd->coll].us;
      latest = start;
      set_issue(p, nd, t, n, start);
    }
  }
  /* Collectives whose results nothing in the step reads (a reduce-scatter of
   * gradients) are issued where the program issues them; the issue points of
   * the others are corrected for the time those take on the communicator
   * (a few rounds of a forward simulation of each communicator's stream);
   * then every wait nothing needs goes where its collective should be done. */
  if (policy == GCA_SCHEDULE_OVERLAP)
    for (int round = 0; round < 4; round++)
      if (!simulate(p, t, n, true, cs))
        break;
  simulate(p, t, n, false, cs);
  for (size_t i = 0; i < p->nnodes; i++) {
    node_t *nd = &p->nodes[i];
    if (nd->coll == GCA__NONE || nd->needed)
      continue;
    node_t *w = &p->nodes[p->node_of[g->ops[nd->coll].wait]];
    size_t j = 0;
    while (j < n && t[j] < nd->end) /* the first program op starting after the end */
      j++;
    double key = (double)j - 0.25;
    w->key = w->base = key > (double)w->prog ? key : (double)w->prog;
  }
  free(t);
  free(cs);
  return GCA_OK;
}

/* Note [Overlap by keys]: one repair at the peak step; false when none applies. */
static bool repair(plan_t *p, const size_t *order, size_t peak_step) {
  const gca_opgraph_t *g = p->g;
  size_t peak_prog = order[peak_step];
  size_t best = GCA__NONE;
  for (size_t i = 0; i < p->nnodes; i++) {
    node_t *nd = &p->nodes[i];
    if (nd->coll == GCA__NONE || nd->key >= (double)nd->prog)
      continue;
    if (p->pos[nd->members[0]] > peak_step || nd->prog <= peak_prog)
      continue; /* not hoisted past the peak */
    if (best == GCA__NONE || nd->need > p->nodes[best].need ||
        (nd->need == p->nodes[best].need && nd->prog < p->nodes[best].prog))
      best = i;
  }
  if (best != GCA__NONE) {
    node_t *nd = &p->nodes[best];
    double key = (double)peak_prog + 0.5;
    nd->key = key < (double)nd->prog ? key : (double)nd->prog;
    return true;
  }
  for (size_t i = 0; i < p->nnodes; i++) {
    node_t *nd = &p->nodes[i];
    if (nd->wait == GCA__NONE || nd->key <= (double)nd->prog)
      continue;
    if (p->pos[nd->wait] > peak_step && nd->prog <= peak_prog) {
      nd->key = (double)nd->prog;
      return true;
    }
  }
  (void)g;
  return false;
}

static gca_status_t figures_of(const plan_t *p, const size_t *order, gca_schedule_figures_t *f,
                               int64_t *live) {
  return gca__opgraph_estimate_valid(p->g, order, p->g->nops, f, live);
}

/* Note [Overlap by keys]: when the repairs cannot bring the peak within the
 * budget, start again from the program's keys and take the just-in-time key
 * of one collective (with its wait's) at a time, in program order, keeping
 * each change that leaves the peak within the budget and exposes less. */
static gca_status_t greedy(plan_t *p, size_t *order, const size_t *prog, int64_t budget,
                           gca_schedule_figures_t *f) {
  size_t n = p->g->nops;
  double *jit = malloc((p->nnodes + 1) * sizeof(double));
  if (!jit)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_schedule: no host memory");
  for (size_t i = 0; i < p->nnodes; i++) {
    jit[i] = p->nodes[i].base;
    p->nodes[i].key = (double)p->nodes[i].prog;
  }
  memcpy(order, prog, n * sizeof(size_t));
  gca_status_t st = figures_of(p, order, f, NULL);
  for (size_t i = 0; i < p->nnodes && st == GCA_OK; i++) {
    node_t *nd = &p->nodes[i];
    if (nd->coll == GCA__NONE || jit[i] == nd->key)
      continue;
    node_t *w = &p->nodes[p->node_of[p->g->ops[nd->coll].wait]];
    double ck = nd->key, wk = w->key;
    nd->key = jit[i];
    w->key = jit[w - p->nodes];
    gca_schedule_figures_t trial;
    st = emit(p, order);
    if (st == GCA_OK)
      st = figures_of(p, order, &trial, NULL);
    if (st != GCA_OK)
      break;
    if (trial.peak_bytes <= budget && trial.exposed_comm_us < f->exposed_comm_us) {
      *f = trial;
    } else {
      nd->key = ck;
      w->key = wk;
    }
  }
  if (st == GCA_OK)
    st = emit(p, order);
  if (st == GCA_OK)
    st = figures_of(p, order, f, NULL);
  free(jit);
  return st;
}

GCA_API gca_status_t gca_opgraph_schedule(const gca_opgraph_t *g,
                                          const gca_schedule_options_t *opts, size_t *order,
                                          size_t n, gca_schedule_figures_t *figures) {
  static const char fn[] = "opgraph_schedule";
  GCA_CHECK(gca__check_graph_arg(fn, g, order, n));
  gca_schedule_options_t o = GCA_SCHEDULE_OPTIONS_INIT;
  if (opts) {
    if (opts->size < sizeof(o))
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: options' size is not set", fn);
    o = *opts;
  }
  if (o.policy > GCA_SCHEDULE_PREFETCH_NEXT)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown policy %d", fn, (int)o.policy);
  if (o.budget_bytes < 0 || !(o.budget_ratio >= 0) || !isfinite(o.budget_ratio))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: bad budget (%lld bytes, ratio %g)", fn,
                      (long long)o.budget_bytes, o.budget_ratio);
  if (figures && figures->size < sizeof(gca_schedule_figures_t))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: figures' size is not set", fn);

  plan_t p = {0};
  gca_schedule_figures_t prog_f, f;
  int64_t *live = malloc((n + 1) * sizeof(int64_t));
  size_t *prog = malloc((n + 1) * sizeof(size_t));
  gca_status_t st = live && prog ? plan_build(&p, g, o.keep_comm_order)
                                 : gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  if (st != GCA_OK)
    goto out;
  for (size_t i = 0; i < n; i++)
    prog[i] = i;
  GCA_CHECK_GOTO(figures_of(&p, prog, &prog_f, NULL), st, out);
  int64_t budget = o.budget_bytes > 0
                       ? o.budget_bytes
                       : (int64_t)((double)prog_f.peak_bytes * (1.0 + o.budget_ratio));
  if (o.policy == GCA_SCHEDULE_PROGRAM) {
    memcpy(order, prog, n * sizeof(size_t));
    f = prog_f;
    goto done;
  }
  sink_waits(&p);
  GCA_CHECK_GOTO(jit_keys(&p, o.keep_comm_order, o.policy), st, out);
  GCA_CHECK_GOTO(emit(&p, order), st, out);
  GCA_CHECK_GOTO(figures_of(&p, order, &f, live), st, out);
  if (o.policy == GCA_SCHEDULE_OVERLAP) {
    size_t limit = 4 * p.nnodes + 16;
    for (size_t it = 0; f.peak_bytes > budget && it < limit; it++) {
      if (!repair(&p, order, f.peak_step))
        break;
      GCA_CHECK_GOTO(emit(&p, order), st, out);
      GCA_CHECK_GOTO(figures_of(&p, order, &f, live), st, out);
    }
    if (f.peak_bytes > budget)
      GCA_CHECK_GOTO(greedy(&p, order, prog, budget, &f), st, out);
    /* nothing better within the budget: the program order */
    if ((f.peak_bytes > budget && prog_f.peak_bytes <= f.peak_bytes) ||
        f.exposed_comm_us > prog_f.exposed_comm_us) {
      memcpy(order, prog, n * sizeof(size_t));
      f = prog_f;
    }
  }
done:
  st = gca_opgraph_check_order(g, order, n);
  if (st == GCA_ERR_OUT_OF_MEMORY) /* the check could not run: the order is not known bad */
    st = gca__error_prefix(st, "%s", fn);
  else if (st != GCA_OK)
    st = gca__error_prefix(GCA_ERR_INTERNAL, "%s: produced an invalid order", fn);
  if (st == GCA_OK && figures)
    *figures = f;
out:
  plan_free(&p);
  free(live);
  free(prog);
  return st;
}
