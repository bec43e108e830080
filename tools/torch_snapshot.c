/* SPDX-License-Identifier: Apache-2.0 */
/* torch_snapshot.c - a PyTorch memory snapshot (the pickle of
 * torch.cuda.memory._snapshot(), as _dump_snapshot writes it) as allocation
 * events of one device, in the RMM row shape gca-replay reads.
 *
 * Note [Replaying a PyTorch snapshot]: the device's trace
 * (device_traces[device]) is a list of {action, addr, size, stream, ...}. An
 * "alloc" is an allocation; the user's free is "free_requested" ("free" in
 * older snapshots), and a "free_completed" is the allocator's own later step,
 * used only when no request preceded it. Segment, snapshot and oom actions
 * are the allocator's, not the program's, and are skipped. Blocks live before
 * the recording began are allocated first, in address order: an address whose
 * first event is a free, and a block active in the snapshot's segments that
 * the trace never touches. PyTorch's own reserved bytes are the sum of the
 * device's segments' total_size. */
#include "torch_snapshot.h"

#include <stdlib.h>
#include <string.h>

typedef struct addr_state {
  uint64_t addr, size;
  bool live;
  bool freed_requested; /* this life's free was requested: its completion is not a free */
} addr_state_t;

typedef struct state {
  const char *name;
  addr_state_t *a;
  size_t n, cap;
  size_t *index; /* open addressing over a[]: slot -> position + 1, 0 empty */
  size_t icap;   /* a power of two, > 2 n */
  gca_rmm_event_t *ev;
  size_t nev, capev;
} state_t;

static size_t slot_of(uint64_t addr, size_t cap) {
  addr ^= addr >> 31;
  addr *= 0x9e3779b97f4a7c15ull;
  return (size_t)(addr >> 17) & (cap - 1);
}

static addr_state_t *find(state_t *s, uint64_t addr) {
  if (!s->icap)
    return NULL;
  for (size_t j = slot_of(addr, s->icap); s->index[j]; j = (j + 1) & (s->icap - 1))
    if (s->a[s->index[j] - 1].addr == addr)
      return &s->a[s->index[j] - 1];
  return NULL;
}

/* A new address record (its address unset: the caller fills it before the
 * next call), indexed. */
static gca_status_t add_addr(state_t *s, uint64_t addr, addr_state_t **out) {
  if (2 * (s->n + 1) > s->icap) {
    size_t nc = s->icap ? s->icap * 2 : 1024;
    size_t *ix = calloc(nc, sizeof(*ix));
    if (!ix)
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "torch snapshot: out of host memory");
    for (size_t i = 0; i < s->n; i++) {
      size_t j = slot_of(s->a[i].addr, nc);
      while (ix[j])
        j = (j + 1) & (nc - 1);
      ix[j] = i + 1;
    }
    free(s->index);
    s->index = ix;
    s->icap = nc;
  }
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 256;
    addr_state_t *g = realloc(s->a, nc * sizeof(*g));
    if (!g)
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "torch snapshot: out of host memory");
    s->a = g;
    s->cap = nc;
  }
  addr_state_t *a = &s->a[s->n++];
  memset(a, 0, sizeof(*a));
  a->addr = addr;
  size_t j = slot_of(addr, s->icap);
  while (s->index[j])
    j = (j + 1) & (s->icap - 1);
  s->index[j] = s->n;
  *out = a;
  return GCA_OK;
}

static gca_status_t grow(void **v, size_t *cap, size_t n, size_t esz) {
  if (n < *cap)
    return GCA_OK;
  size_t nc = *cap ? *cap * 2 : 256;
  void *g = realloc(*v, nc * esz);
  if (!g)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "torch snapshot: out of host memory");
  *v = g;
  *cap = nc;
  return GCA_OK;
}

static gca_status_t emit(state_t *s, gca_rmm_action_t action, uint64_t addr, uint64_t size,
                         uint64_t stream, uint64_t index) {
  TOOL_CHECK(grow((void **)&s->ev, &s->capev, s->nev, sizeof(*s->ev)));
  s->ev[s->nev++] = (gca_rmm_event_t){.line = index,
                                      .thread = 0,
                                      .time_ns = 0,
                                      .pointer = addr,
                                      .size = size,
                                      .stream = stream,
                                      .action = action};
  return GCA_OK;
}

static bool int_of(const py_value_t *v, uint64_t *out) {
  if (!v || v->kind != PY_INT || v->big || v->i < 0)
    return false;
  *out = (uint64_t)v->i;
  return true;
}

static bool str_is(const py_value_t *v, const char *s) {
  return v && v->kind == PY_STR && strcmp(v->s, s) == 0;
}

static int cmp_addr(const void *x, const void *y) {
  const gca_rmm_event_t *a = x, *b = y;
  return a->pointer < b->pointer ? -1 : a->pointer > b->pointer;
}

gca_status_t torch_snapshot_events(const py_value_t *root, const char *name, int device,
                                   torch_events_t *out) {
  memset(out, 0, sizeof(*out));
  if (!root || root->kind != PY_DICT)
    return tool_error(GCA_ERR_PARSE, "%s: not a PyTorch memory snapshot (not a dict)", name);
  const py_value_t *traces = py_dict_get(root, "device_traces");
  const py_value_t *segments = py_dict_get(root, "segments");
  if (!traces || traces->kind != PY_LIST || !segments || segments->kind != PY_LIST)
    return tool_error(GCA_ERR_PARSE,
                      "%s: not a PyTorch memory snapshot (no 'segments' and 'device_traces' "
                      "lists)",
                      name);
  out->ndevices = traces->n;
  if (device < 0 || (size_t)device >= traces->n)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d: the snapshot has %zu device traces",
                      name, device, traces->n);
  state_t s = {.name = name};
  gca_status_t st = GCA_OK;
  /* PyTorch's reserved bytes and the blocks live at the snapshot */
  gca_rmm_event_t *pre = NULL;
  size_t npre = 0, cappre = 0;
  for (size_t i = 0; i < segments->n && st == GCA_OK; i++) {
    const py_value_t *seg = segments->items[i];
    uint64_t dev = 0, total = 0;
    if (!int_of(py_dict_get(seg, "device"), &dev) ||
        !int_of(py_dict_get(seg, "total_size"), &total))
      st = tool_error(GCA_ERR_PARSE, "%s: segments[%zu] has no device or total_size", name, i);
    else if (dev == (uint64_t)device)
      out->torch_reserved += total;
  }
  const py_value_t *trace = traces->items[device];
  if (st == GCA_OK && trace->kind != PY_LIST)
    st = tool_error(GCA_ERR_PARSE, "%s: device_traces[%d] is not a list", name, device);
  for (size_t i = 0; st == GCA_OK && i < trace->n; i++) {
    const py_value_t *e = trace->items[i];
    const py_value_t *action = py_dict_get(e, "action");
    uint64_t addr = 0, size = 0, stream = 0;
    if (!action || action->kind != PY_STR || !int_of(py_dict_get(e, "addr"), &addr) ||
        !int_of(py_dict_get(e, "size"), &size)) {
      st = tool_error(GCA_ERR_PARSE,
                      "%s: device_traces[%d][%zu] lacks a string 'action' or integer 'addr' and "
                      "'size'",
                      name, device, i);
      break;
    }
    (void)int_of(py_dict_get(e, "stream"), &stream);
    bool is_alloc = str_is(action, "alloc");
    bool is_req = str_is(action, "free_requested") || str_is(action, "free");
    bool is_done = str_is(action, "free_completed");
    if (!is_alloc && !is_req && !is_done) {
      out->skipped++; /* segment_*, snapshot, oom: the allocator's own */
      continue;
    }
    addr_state_t *a = find(&s, addr);
    if (is_alloc) {
      if (a && a->live) {
        st = tool_error(GCA_ERR_PARSE,
                        "%s: device_traces[%d][%zu]: alloc of 0x%llx, which is already live", name,
                        device, i, (unsigned long long)addr);
        break;
      }
      if (!a && (st = add_addr(&s, addr, &a)) != GCA_OK)
        break;
      a->live = true;
      a->freed_requested = false;
      a->size = size;
      st = emit(&s, GCA_RMM_ALLOCATE, addr, size, stream, i + 1);
      continue;
    }
    if (is_done && a && !a->live && a->freed_requested) {
      a->freed_requested = false; /* the completion of a requested free */
      continue;
    }
    if (!a) { /* live before the recording began: allocated first */
      st = grow((void **)&pre, &cappre, npre, sizeof(*pre));
      if (st == GCA_OK)
        st = add_addr(&s, addr, &a);
      if (st != GCA_OK)
        break;
      a->size = size;
      a->live = true;
      pre[npre++] = (gca_rmm_event_t){
          .pointer = addr, .size = size, .stream = stream, .action = GCA_RMM_ALLOCATE};
    }
    if (!a->live) {
      st = tool_error(GCA_ERR_PARSE, "%s: device_traces[%d][%zu]: %s of 0x%llx, which is not live",
                      name, device, i, action->s, (unsigned long long)addr);
      break;
    }
    a->live = false;
    a->freed_requested = is_req;
    st = emit(&s, GCA_RMM_FREE, addr, a->size, stream, i + 1);
  }
  /* blocks active at the snapshot that the trace never touched */
  for (size_t i = 0; st == GCA_OK && i < segments->n; i++) {
    const py_value_t *seg = segments->items[i];
    uint64_t dev = 0, stream = 0;
    (void)int_of(py_dict_get(seg, "device"), &dev);
    (void)int_of(py_dict_get(seg, "stream"), &stream);
    const py_value_t *blocks = py_dict_get(seg, "blocks");
    if (dev != (uint64_t)device || !blocks || blocks->kind != PY_LIST)
      continue;
    for (size_t k = 0; st == GCA_OK && k < blocks->n; k++) {
      const py_value_t *b = blocks->items[k];
      uint64_t addr = 0, size = 0;
      if (!str_is(py_dict_get(b, "state"), "active_allocated") ||
          !int_of(py_dict_get(b, "address"), &addr) || !int_of(py_dict_get(b, "size"), &size))
        continue;
      if (find(&s, addr))
        continue;
      addr_state_t *na = NULL;
      st = grow((void **)&pre, &cappre, npre, sizeof(*pre));
      if (st == GCA_OK)
        st = add_addr(&s, addr, &na);
      if (st != GCA_OK)
        break;
      na->size = size;
      na->live = true;
      pre[npre++] = (gca_rmm_event_t){
          .pointer = addr, .size = size, .stream = stream, .action = GCA_RMM_ALLOCATE};
      out->untouched_live++;
    }
  }
  if (st == GCA_OK && npre) {
    qsort(pre, npre, sizeof(*pre), cmp_addr);
    gca_rmm_event_t *all = malloc((npre + s.nev + 1) * sizeof(*all));
    if (!all) {
      st = tool_error(GCA_ERR_OUT_OF_MEMORY, "torch snapshot: out of host memory");
    } else {
      memcpy(all, pre, npre * sizeof(*pre));
      if (s.nev)
        memcpy(all + npre, s.ev, s.nev * sizeof(*s.ev));
      free(s.ev);
      s.ev = all;
      s.nev += npre;
    }
  }
  out->live_before = npre;
  free(pre);
  free(s.a);
  free(s.index);
  if (st != GCA_OK) {
    free(s.ev);
    return st;
  }
  out->events = s.ev;
  out->n = s.nev;
  return GCA_OK;
}
