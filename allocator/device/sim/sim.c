/* SPDX-License-Identifier: Apache-2.0 */
/* sim.c - the sim backend's core: its devices and their capacity, the op
 * table, call counters, fault injection, and the public gca_sim_* control API.
 *
 * The one idea: every op passes through gca__sim_enter(), which is both the
 * counter and the fault injector, so any operation can be observed ("the fast
 * path made no device call") and made to fail by name. The entry is cheap when
 * no rule is armed for the op: one relaxed atomic add and one atomic load.
 * State is created lazily on first use (by init, by any op, or by a gca_sim_*
 * call), so the control API works before and without gca_device_init().
 *
 * Note [Sim fault rules]: a spec is a comma-separated list of `op:rule`.
 *   nth=N          the N-th call of op from now fails, once; the rule is then spent
 *   every=K        every K-th call of op from now fails
 *   after_bytes=B  a call of a memory-creating op fails when the bytes created by
 *                  the calls that passed since the rule was set, plus its own,
 *                  would exceed B (failed calls add nothing); ops that create
 *                  nothing never trip it
 *   always         every call fails
 * One rule per op: setting a rule for an op replaces its previous rule and
 * leaves other ops' rules alone. A spec is parsed whole before anything is
 * applied, so a bad spec changes nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"

#define DEFAULT_DEVICE_MEMORY (16ull << 30)
#define SPEC_MAX              1024

typedef enum rule_kind {
  RULE_NONE = 0,
  RULE_NTH,
  RULE_EVERY,
  RULE_AFTER_BYTES,
  RULE_ALWAYS,
} rule_kind_t;

/* A fault rule of one op. `calls` and `bytes` count from the moment the rule was
 * set; armed[op] == (rules[op].kind != RULE_NONE) whenever rules_lock is free. */
typedef struct fault_rule {
  rule_kind_t kind;
  uint64_t n;     /* N of nth, K of every, B of after_bytes */
  uint64_t calls; /* calls seen since set */
  uint64_t bytes; /* bytes created by calls that passed since set */
} fault_rule_t;

/* Per device: 0 <= used <= capacity, except transiently after set_capacity races a take. */
typedef struct sim_device {
  _Atomic uint64_t capacity;
  _Atomic uint64_t used;
} sim_device_t;

static struct {
  pthread_once_t once;
  _Atomic int ready; /* 1 once `once` has run, whatever its result */
  gca_status_t status;
  char detail[512];
  int ndev;
  bool fabric; /* GCA_SIM_FABRIC: devices claim fabric handles (Note [Sim fabric handles]) */
  sim_device_t dev[GCA_SIM_MAX_DEVICES];
} sim = {.once = PTHREAD_ONCE_INIT};

static _Atomic int64_t calls[GCA_OP_COUNT];
static _Atomic int armed[GCA_OP_COUNT];
/* gca_sim_set_latency: nanoseconds each call of an op spends before it acts. */
static _Atomic uint64_t latency_ns[GCA_OP_COUNT];
/* gca_sim_hold: ops whose calls wait, once counted, until the hold ends. */
static atomic_bool held[GCA_OP_COUNT];
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static fault_rule_t rules[GCA_OP_COUNT];
static pthread_mutex_t rules_lock = PTHREAD_MUTEX_INITIALIZER;

static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static gca_device_ops_t table;

/* ---- fault specs ---- */

typedef struct parsed_rule {
  gca_dev_op_t op;
  fault_rule_t rule;
} parsed_rule_t;

static int op_by_name(const char *name, size_t len) {
  for (int i = 0; i < GCA_OP_COUNT; i++) {
    const char *n = gca__device_op_name((gca_dev_op_t)i);
    if (strlen(n) == len && strncmp(n, name, len) == 0)
      return i;
  }
  return -1;
}

static bool parse_count(const char *text, uint64_t *out) {
  if (*text < '0' || *text > '9')
    return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || v == 0)
    return false;
  *out = v;
  return true;
}

static gca_status_t parse_item(const char *who, char *item, parsed_rule_t *out) {
  char *colon = strchr(item, ':');
  if (!colon)
    return gca__error(GCA_ERR_CONFIG, "%s: '%s' is not op:rule (e.g. mem_create:nth=2)", who, item);
  int op = op_by_name(item, (size_t)(colon - item));
  if (op < 0)
    return gca__error(GCA_ERR_CONFIG, "%s: unknown op in '%s' (see gca_sim_op_name)", who, item);
  const char *rule = colon + 1;
  fault_rule_t r = {0};
  if (strcmp(rule, "always") == 0) {
    r.kind = RULE_ALWAYS;
  } else if (strncmp(rule, "nth=", 4) == 0 && parse_count(rule + 4, &r.n)) {
    r.kind = RULE_NTH;
  } else if (strncmp(rule, "every=", 6) == 0 && parse_count(rule + 6, &r.n)) {
    r.kind = RULE_EVERY;
  } else if (strncmp(rule, "after_bytes=", 12) == 0) {
    if (gca__parse_size(rule + 12, &r.n) != GCA_OK)
      return gca__error(GCA_ERR_CONFIG, "%s: bad byte count in '%s'", who, item);
    r.kind = RULE_AFTER_BYTES;
  } else {
    return gca__error(GCA_ERR_CONFIG,
                      "%s: unknown rule in '%s' (expected nth=N, every=K, after_bytes=B or "
                      "always; N, K >= 1)",
                      who, item);
  }
  out->op = (gca_dev_op_t)op;
  out->rule = r;
  return GCA_OK;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  char *e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
    *--e = '\0';
  return s;
}

/* Parses `spec` whole, then applies it; GCA_ERR_CONFIG quoting the bad item, nothing applied. */
static gca_status_t apply_spec(const char *who, const char *spec) {
  if (!spec)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: spec is NULL", who);
  size_t len = strlen(spec);
  if (len >= SPEC_MAX)
    return gca__error(GCA_ERR_CONFIG, "%s: spec longer than %d characters", who, SPEC_MAX - 1);
  char buf[SPEC_MAX];
  memcpy(buf, spec, len + 1);
  parsed_rule_t parsed[GCA_OP_COUNT * 2];
  int count = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *item = trim(tok);
    if (!*item)
      continue;
    if (count == (int)GCA_ARRAY_SIZE(parsed))
      return gca__error(GCA_ERR_CONFIG, "%s: too many rules in '%s'", who, spec);
    GCA_CHECK(parse_item(who, item, &parsed[count]));
    count++;
  }
  pthread_mutex_lock(&rules_lock);
  for (int i = 0; i < count; i++) {
    rules[parsed[i].op] = parsed[i].rule;
    atomic_store(&armed[parsed[i].op], 1);
  }
  pthread_mutex_unlock(&rules_lock);
  return GCA_OK;
}

/* ---- state ---- */

static gca_status_t read_env(void) {
  const char *text = gca__getenv("GCA_SIM_DEVICES");
  int ndev = 1;
  if (text && *text) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < 0 || v > GCA_SIM_MAX_DEVICES)
      return gca__error(GCA_ERR_CONFIG, "init: GCA_SIM_DEVICES='%s' is not a device count (0..%d)",
                        text, GCA_SIM_MAX_DEVICES);
    ndev = (int)v;
  }
  uint64_t mem = DEFAULT_DEVICE_MEMORY;
  text = gca__getenv("GCA_SIM_DEVICE_MEMORY");
  if (text && *text) {
    if (gca__parse_size(text, &mem) != GCA_OK || mem == 0)
      return gca__error(GCA_ERR_CONFIG,
                        "init: GCA_SIM_DEVICE_MEMORY='%s' is not a memory size (e.g. 80GiB)", text);
  }
  bool fabric = false;
  text = gca__getenv("GCA_SIM_FABRIC");
  if (text && *text) {
    if (strcmp(text, "0") != 0 && strcmp(text, "1") != 0)
      return gca__error(GCA_ERR_CONFIG, "init: GCA_SIM_FABRIC='%s' is not 0 or 1", text);
    fabric = text[0] == '1';
  }
  bool virtual_clock = false;
  text = gca__getenv("GCA_SIM_CLOCK");
  if (text && *text) {
    if (strcmp(text, "virtual") != 0 && strcmp(text, "real") != 0)
      return gca__error(GCA_ERR_CONFIG, "init: GCA_SIM_CLOCK='%s' is not 'real' or 'virtual'",
                        text);
    virtual_clock = text[0] == 'v';
  }
  bool recycle = false; /* Note [Sim handles] */
  text = gca__getenv("GCA_SIM_RECYCLE_HANDLES");
  if (text && *text) {
    if (strcmp(text, "0") != 0 && strcmp(text, "1") != 0)
      return gca__error(GCA_ERR_CONFIG, "init: GCA_SIM_RECYCLE_HANDLES='%s' is not 0 or 1", text);
    recycle = text[0] == '1';
  }
  text = gca__getenv("GCA_SIM_FAULTS");
  if (text && *text) {
    char who[SPEC_MAX + 64];
    snprintf(who, sizeof(who), "init: GCA_SIM_FAULTS='%s'", text);
    GCA_CHECK(apply_spec(who, text));
  }
  sim.ndev = ndev;
  sim.fabric = fabric;
  gca__sim_clock_set_virtual(virtual_clock);
  gca__sim_set_recycle_handles(recycle);
  for (int i = 0; i < GCA_SIM_MAX_DEVICES; i++) {
    atomic_store(&sim.dev[i].capacity, mem);
    atomic_store(&sim.dev[i].used, 0);
  }
  return GCA_OK;
}

/* Note [Sim after fork]: a forked child has none of the parent's stream
 * workers, so queued work would never run and a synchronize would hang. The
 * driver's rule applies instead: a child of a process that initialized the
 * device cannot use it. Once the sim's state exists, a fork makes every op in
 * the child fail with GCA_ERR_NO_DEVICE (CUDA_ERROR_NOT_INITIALIZED) saying so;
 * a child of a process that never touched the sim starts its own. */
static _Atomic int forked_child;

static void atfork_child(void) {
  atomic_store_explicit(&forked_child, 1, memory_order_relaxed);
}

static void state_once(void) {
  pthread_atfork(NULL, NULL, atfork_child);
  sim.status = read_env();
  if (sim.status != GCA_OK)
    snprintf(sim.detail, sizeof(sim.detail), "%s", gca_last_error());
  atomic_store_explicit(&sim.ready, 1, memory_order_release);
}

/* Creates the sim's state on first use; the first result for every later call. */
static gca_status_t state_init(void) {
  if (GCA_UNLIKELY(!atomic_load_explicit(&sim.ready, memory_order_acquire)))
    pthread_once(&sim.once, state_once);
  if (GCA_UNLIKELY(sim.status != GCA_OK))
    return gca__error(sim.status, "%s", sim.detail);
  return GCA_OK;
}

bool gca__sim_fabric_supported(void) {
  return state_init() == GCA_OK && sim.fabric;
}

/* ---- entry, counters, faults ---- */

static gca_status_t injected(gca_dev_op_t op, int64_t call) {
  gca_status_t st =
      (op == GCA_OP_mem_alloc || op == GCA_OP_mem_create || op == GCA_OP_mem_address_reserve ||
       op == GCA_OP_host_alloc || op == GCA_OP_host_register)
          ? GCA_ERR_OUT_OF_MEMORY
          : GCA_ERR_DRIVER;
  return gca__error(st, "%s: injected fault (sim, call %lld)", gca__device_op_name(op),
                    (long long)call);
}

/* Applies op's rule to this call under rules_lock; true when the call must fail. */
static bool rule_fires(gca_dev_op_t op, uint64_t bytes) {
  bool fire = false;
  pthread_mutex_lock(&rules_lock);
  fault_rule_t *r = &rules[op];
  r->calls++;
  switch (r->kind) {
  case RULE_NONE:
    break;
  case RULE_NTH:
    if (r->calls == r->n) {
      fire = true;
      r->kind = RULE_NONE;
      atomic_store(&armed[op], 0);
    }
    break;
  case RULE_EVERY:
    fire = r->calls % r->n == 0;
    break;
  case RULE_AFTER_BYTES:
    if (bytes > 0 && (bytes > r->n || r->bytes > r->n - bytes))
      fire = true;
    else
      r->bytes += bytes;
    break;
  case RULE_ALWAYS:
    fire = true;
    break;
  }
  pthread_mutex_unlock(&rules_lock);
  return fire;
}

_Thread_local bool gca__sim_in_host_fn;

gca_status_t gca__sim_enter(gca_dev_op_t op, uint64_t bytes) {
  GCA_CHECK(state_init());
  if (GCA_UNLIKELY(atomic_load_explicit(&forked_child, memory_order_relaxed)))
    return gca__error(GCA_ERR_NO_DEVICE,
                      "%s: the sim was initialized before this process was forked; a forked "
                      "child cannot use it (CUDA_ERROR_NOT_INITIALIZED, as the driver)",
                      gca__device_op_name(op));
  if (GCA_UNLIKELY(gca__sim_in_host_fn))
    return gca__error(GCA_ERR_NOT_PERMITTED,
                      "%s: device calls are not permitted from a host function "
                      "(CUDA_ERROR_NOT_PERMITTED)",
                      gca__device_op_name(op));
  int64_t call = atomic_fetch_add_explicit(&calls[op], 1, memory_order_relaxed) + 1;
  uint64_t lat = atomic_load_explicit(&latency_ns[op], memory_order_relaxed);
  if (GCA_UNLIKELY(lat != 0)) {
    struct timespec ts = {(time_t)(lat / 1000000000u), (long)(lat % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  if (GCA_UNLIKELY(atomic_load_explicit(&held[op], memory_order_acquire))) {
    pthread_mutex_lock(&hold_mu);
    while (atomic_load_explicit(&held[op], memory_order_acquire))
      pthread_cond_wait(&hold_cv, &hold_mu);
    pthread_mutex_unlock(&hold_mu);
  }
  if (GCA_UNLIKELY(atomic_load_explicit(&armed[op], memory_order_relaxed)) && rule_fires(op, bytes))
    return injected(op, call);
  return GCA_OK;
}

/* ---- devices and capacity ---- */

int gca__sim_device_count(void) {
  return state_init() == GCA_OK ? sim.ndev : 0;
}

gca_status_t gca__sim_check_device(const char *op, int dev) {
  GCA_CHECK(state_init());
  if (dev < 0 || dev >= sim.ndev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: device %d does not exist (sim has %d)", op,
                      dev, sim.ndev);
  return GCA_OK;
}

gca_status_t gca__sim_capacity_take(const char *op, int dev, uint64_t bytes) {
  GCA_CHECK(gca__sim_check_device(op, dev));
  sim_device_t *d = &sim.dev[dev];
  uint64_t used = atomic_load(&d->used);
  for (;;) {
    uint64_t cap = atomic_load(&d->capacity);
    if (used > cap || bytes > cap - used) {
      char want[32], avail[32], total[32];
      return gca__error(GCA_ERR_OUT_OF_MEMORY,
                        "%s: sim device %d is out of memory: requested %s, free %s of %s", op, dev,
                        gca__format_size(bytes, want, sizeof(want)),
                        gca__format_size(used > cap ? 0 : cap - used, avail, sizeof(avail)),
                        gca__format_size(cap, total, sizeof(total)));
    }
    if (atomic_compare_exchange_weak(&d->used, &used, used + bytes))
      return GCA_OK;
  }
}

void gca__sim_capacity_give(int dev, uint64_t bytes) {
  GCA_ASSERT(dev >= 0 && dev < sim.ndev);
  uint64_t prev = atomic_fetch_sub(&sim.dev[dev].used, bytes);
  GCA_ASSERT(prev >= bytes);
}

uint64_t gca__sim_capacity(int dev) {
  GCA_ASSERT(dev >= 0 && dev < sim.ndev);
  return atomic_load(&sim.dev[dev].capacity);
}

/* ---- device ops ---- */

static gca_status_t sim_init(void) {
  return gca__sim_enter(GCA_OP_init, 0);
}

static gca_status_t sim_device_count(int *count) {
  GCA_SIM_ENTER(device_count, 0);
  if (!count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = sim.ndev;
  return GCA_OK;
}

static gca_status_t sim_device_attr(int dev, gca_dev_attr_t attr, int *value) {
  GCA_SIM_ENTER(device_attr, 0);
  GCA_CHECK(gca__sim_check_device("device_attr", dev));
  if (!value)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_attr: value is NULL");
  switch (attr) {
  case GCA_ATTR_CC_MAJOR:
    *value = 9;
    return GCA_OK;
  case GCA_ATTR_CC_MINOR:
    *value = 0;
    return GCA_OK;
  case GCA_ATTR_MULTIPROCESSOR_COUNT:
    *value = 132;
    return GCA_OK;
  case GCA_ATTR_VMM_SUPPORTED:
  case GCA_ATTR_POSIX_FD_SUPPORTED:
  case GCA_ATTR_MEMORY_POOLS_SUPPORTED:
  case GCA_ATTR_UNIFIED_ADDRESSING:
    *value = 1;
    return GCA_OK;
  case GCA_ATTR_FABRIC_SUPPORTED:
    *value = sim.fabric;
    return GCA_OK;
  }
  return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_attr: unknown attribute %d", (int)attr);
}

static gca_status_t sim_device_name(int dev, char *name, size_t len) {
  GCA_SIM_ENTER(device_name, 0);
  GCA_CHECK(gca__sim_check_device("device_name", dev));
  if (!name || len == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_name: no buffer (name %p, len %zu)",
                      (void *)name, len);
  snprintf(name, len, "gca sim device %d", dev);
  return GCA_OK;
}

/* As cuDeviceCanAccessPeer: a device is not its own peer (0); distinct sim devices are. */
static gca_status_t sim_device_can_access_peer(int dev, int peer, int *can) {
  GCA_SIM_ENTER(device_can_access_peer, 0);
  GCA_CHECK(gca__sim_check_device("device_can_access_peer", dev));
  GCA_CHECK(gca__sim_check_device("device_can_access_peer", peer));
  if (!can)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "device_can_access_peer: can is NULL");
  *can = dev != peer;
  return GCA_OK;
}

static void fill_table(void) {
  table.name = "sim";
  table.init = sim_init;
  table.device_count = sim_device_count;
  table.device_attr = sim_device_attr;
  table.device_name = sim_device_name;
  table.device_can_access_peer = sim_device_can_access_peer;
  gca__sim_mem_ops(&table);
  gca__sim_stream_ops(&table);
  gca__sim_graph_ops(&table);
  gca__sim_host_ops(&table);
}

const gca_device_ops_t *gca__sim_ops(void) {
  pthread_once(&table_once, fill_table);
  return &table;
}

/* ---- public control API ---- */

GCA_API gca_status_t gca_sim_fault_set(const char *spec) {
  GCA_CHECK(state_init());
  return apply_spec("gca_sim_fault_set", spec);
}

GCA_API void gca_sim_fault_clear(void) {
  pthread_mutex_lock(&rules_lock);
  for (int i = 0; i < GCA_OP_COUNT; i++) {
    rules[i] = (fault_rule_t){0};
    atomic_store(&armed[i], 0);
  }
  pthread_mutex_unlock(&rules_lock);
}

GCA_API int gca_sim_op_count(void) {
  return GCA_OP_COUNT;
}

GCA_API const char *gca_sim_op_name(int op) {
  if (op < 0 || op >= GCA_OP_COUNT)
    return NULL;
  return gca__device_op_name((gca_dev_op_t)op);
}

GCA_API int64_t gca_sim_call_count(const char *op) {
  if (!op)
    return -1;
  int i = op_by_name(op, strlen(op));
  return i < 0 ? -1 : atomic_load_explicit(&calls[i], memory_order_relaxed);
}

GCA_API gca_status_t gca_sim_set_latency(const char *op, uint64_t ns) {
  int i = op ? op_by_name(op, strlen(op)) : -1;
  if (i < 0)
    return gca__error(GCA_ERR_CONFIG, "gca_sim_set_latency: unknown op '%s'", op ? op : "(null)");
  atomic_store(&latency_ns[i], ns);
  return GCA_OK;
}

GCA_API gca_status_t gca_sim_hold(const char *op, bool hold) {
  int i = op ? op_by_name(op, strlen(op)) : -1;
  if (i < 0)
    return gca__error(GCA_ERR_CONFIG, "gca_sim_hold: unknown op '%s'", op ? op : "(null)");
  pthread_mutex_lock(&hold_mu);
  atomic_store_explicit(&held[i], hold, memory_order_release);
  if (!hold)
    pthread_cond_broadcast(&hold_cv);
  pthread_mutex_unlock(&hold_mu);
  return GCA_OK;
}

GCA_API void gca_sim_counters_reset(void) {
  for (int i = 0; i < GCA_OP_COUNT; i++)
    atomic_store(&calls[i], 0);
}

GCA_API gca_status_t gca_sim_set_capacity(int device, uint64_t bytes) {
  GCA_CHECK(gca__sim_check_device("gca_sim_set_capacity", device));
  uint64_t used = atomic_load(&sim.dev[device].used);
  if (used > bytes) {
    char u[32], b[32];
    return gca__error(GCA_ERR_INVALID_STATE,
                      "gca_sim_set_capacity: device %d has %s in use, more than the %s asked",
                      device, gca__format_size(used, u, sizeof(u)),
                      gca__format_size(bytes, b, sizeof(b)));
  }
  atomic_store(&sim.dev[device].capacity, bytes);
  return GCA_OK;
}

GCA_API uint64_t gca_sim_used_bytes(int device) {
  if (state_init() != GCA_OK || device < 0 || device >= sim.ndev)
    return 0;
  return atomic_load(&sim.dev[device].used);
}
