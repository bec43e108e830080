/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_faults.c - the sim's fault injection and call counters: every op in
 * the table can be made to fail by name (through gca_sim_fault_set and through
 * GCA_SIM_FAULTS at start-up), the failure reaches the caller with the op's
 * name, the nth/every/after_bytes/always rules mean what Note [Sim fault
 * rules] says, a bad spec changes nothing, and the counters are exact.
 *
 * Each op has a trivially valid call below (ops the table has no function for
 * are skipped). A call records the first failure it meets and, where the
 * failing op would leave something behind, repeats it (an nth=1 rule is spent
 * by then) so that nothing leaks.
 */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"

#define MIB (1ull << 20)

static const gca_device_ops_t *ops;
static gca_status_t first_st;
static char first_detail[1024];

#define TRY(call)                                                           \
  do {                                                                      \
    gca_status_t s_ = (call);                                               \
    if (s_ != GCA_OK && first_st == GCA_OK) {                               \
      first_st = s_;                                                        \
      snprintf(first_detail, sizeof(first_detail), "%s", gca_last_error()); \
    }                                                                       \
  } while (0)
static int setup(void **state) {
  (void)state;
  ops = test_backend();
  return 0;
}

static int reset(void **state) {
  (void)state;
  gca_sim_fault_clear();
  gca_sim_counters_reset();
  return 0;
}

/* ---- a trivially valid call per op ---- */

static void noop(void *arg) {
  (void)arg;
}

static gca_status_t begin(void) {
  first_st = GCA_OK;
  first_detail[0] = '\0';
  return GCA_OK;
}

/* Runs `call`, recording a failure; a failed call runs once more (an nth=1
 * fault is spent by then) so that what it was to undo is undone. */
#define TRY_OR_REPEAT(call)    \
  do {                         \
    gca_status_t s1_ = (call); \
    TRY(s1_);                  \
    if (s1_ != GCA_OK)         \
      (void)(call);            \
  } while (0)

static gca_status_t call_init(void) {
  begin();
  TRY(ops->init());
  return first_st;
}
static gca_status_t call_device_count(void) {
  int n;
  begin();
  TRY(ops->device_count(&n));
  return first_st;
}
static gca_status_t call_device_attr(void) {
  int v;
  begin();
  TRY(ops->device_attr(0, GCA_ATTR_VMM_SUPPORTED, &v));
  return first_st;
}
static gca_status_t call_device_name(void) {
  char name[64];
  begin();
  TRY(ops->device_name(0, name, sizeof(name)));
  return first_st;
}
static gca_status_t call_device_can_access_peer(void) {
  int can;
  begin();
  TRY(ops->device_can_access_peer(0, 0, &can));
  return first_st;
}
static gca_status_t call_mem_get_info(void) {
  size_t f, t;
  begin();
  TRY(ops->mem_get_info(0, &f, &t));
  return first_st;
}
static gca_status_t call_mem_alloc(void) {
  gca_devptr_t p = 0;
  begin();
  TRY(ops->mem_alloc(0, 1, &p));
  if (first_st == GCA_OK)
    ops->mem_free(0, p);
  return first_st;
}
static gca_status_t call_mem_free(void) {
  gca_devptr_t p = 0;
  begin();
  TRY(ops->mem_alloc(0, 1, &p));
  TRY_OR_REPEAT(ops->mem_free(0, p));
  return first_st;
}
static gca_status_t call_mem_granularity(void) {
  size_t g;
  begin();
  TRY(ops->mem_granularity(0, false, &g));
  return first_st;
}
static gca_status_t call_mem_address_reserve(void) {
  gca_devptr_t p = 0;
  begin();
  TRY(ops->mem_address_reserve(0, 2 * MIB, 0, &p));
  if (first_st == GCA_OK)
    ops->mem_address_free(0, p, 2 * MIB);
  return first_st;
}
static gca_status_t call_mem_address_free(void) {
  gca_devptr_t p = 0;
  begin();
  TRY(ops->mem_address_reserve(0, 2 * MIB, 0, &p));
  TRY_OR_REPEAT(ops->mem_address_free(0, p, 2 * MIB));
  return first_st;
}
static gca_status_t call_mem_create(void) {
  gca_memhandle_t h;
  begin();
  TRY(ops->mem_create(0, 2 * MIB, &h));
  if (first_st == GCA_OK)
    ops->mem_release(h);
  return first_st;
}
static gca_status_t call_mem_release(void) {
  gca_memhandle_t h = 0;
  begin();
  TRY(ops->mem_create(0, 2 * MIB, &h));
  TRY_OR_REPEAT(ops->mem_release(h));
  return first_st;
}

/* reserve + create (+ map) for the mapping ops; undone by vmm_down. */
static void vmm_up(gca_devptr_t *p, gca_memhandle_t *h, bool map) {
  TRY(ops->mem_address_reserve(0, 2 * MIB, 0, p));
  TRY(ops->mem_create(0, 2 * MIB, h));
  if (map)
    TRY(ops->mem_map(*p, 2 * MIB, 0, *h));
}
static void vmm_down(gca_devptr_t p, gca_memhandle_t h, bool unmap) {
  if (unmap)
    ops->mem_unmap(p, 2 * MIB);
  ops->mem_release(h);
  ops->mem_address_free(0, p, 2 * MIB);
}
static gca_status_t call_mem_map(void) {
  gca_devptr_t p = 0;
  gca_memhandle_t h = 0;
  begin();
  vmm_up(&p, &h, false);
  TRY(ops->mem_map(p, 2 * MIB, 0, h));
  vmm_down(p, h, first_st == GCA_OK);
  return first_st;
}
static gca_status_t call_mem_unmap(void) {
  gca_devptr_t p = 0;
  gca_memhandle_t h = 0;
  begin();
  vmm_up(&p, &h, true);
  TRY_OR_REPEAT(ops->mem_unmap(p, 2 * MIB));
  vmm_down(p, h, false);
  return first_st;
}
static gca_status_t call_mem_set_access(void) {
  gca_devptr_t p = 0;
  gca_memhandle_t h = 0;
  int dev = 0;
  begin();
  vmm_up(&p, &h, true);
  TRY(ops->mem_set_access(p, 2 * MIB, &dev, 1));
  vmm_down(p, h, true);
  return first_st;
}
static gca_status_t call_mem_export_fd(void) {
  gca_memhandle_t h = 0;
  int fd = -1;
  begin();
  TRY(ops->mem_create(0, 2 * MIB, &h));
  TRY(ops->mem_export_fd(h, &fd));
  if (fd >= 0)
    close(fd);
  ops->mem_release(h);
  return first_st;
}
static gca_status_t call_mem_import_fd(void) {
  gca_memhandle_t h = 0, h2 = 0;
  int fd = -1;
  begin();
  TRY(ops->mem_create(0, 2 * MIB, &h));
  TRY(ops->mem_export_fd(h, &fd));
  gca_status_t st = ops->mem_import_fd(0, fd, &h2);
  TRY(st);
  if (st == GCA_OK)
    ops->mem_release(h2);
  close(fd);
  ops->mem_release(h);
  return first_st;
}
static gca_status_t call_ctx_synchronize(void) {
  begin();
  TRY(ops->ctx_synchronize(0));
  return first_st;
}
static gca_status_t call_stream_create(void) {
  gca_stream_t s = NULL;
  begin();
  TRY(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  if (first_st == GCA_OK)
    ops->stream_destroy(s);
  return first_st;
}
static gca_status_t call_stream_destroy(void) {
  gca_stream_t s = NULL;
  begin();
  TRY(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  TRY_OR_REPEAT(ops->stream_destroy(s));
  return first_st;
}
static gca_status_t call_stream_synchronize(void) {
  begin();
  TRY(ops->stream_synchronize(NULL));
  return first_st;
}
static gca_status_t call_stream_query(void) {
  begin();
  TRY(ops->stream_synchronize(NULL));
  TRY(ops->stream_query(NULL));
  return first_st;
}

/* A stream and an event for the event ops; undone by ev_down. */
static void ev_up(gca_stream_t *s, gca_event_t *e) {
  TRY(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, s));
  TRY(ops->event_create(0, GCA_EVENT_DEFAULT, e));
}
static void ev_down(gca_stream_t s, gca_event_t e) {
  ops->stream_synchronize(s);
  ops->event_destroy(e);
  ops->stream_destroy(s);
}
static gca_status_t call_stream_wait_event(void) {
  gca_stream_t s = NULL;
  gca_event_t e = NULL;
  begin();
  ev_up(&s, &e);
  TRY(ops->event_record(e, s));
  TRY(ops->stream_wait_event(NULL, e));
  ops->stream_synchronize(NULL);
  ev_down(s, e);
  return first_st;
}
static gca_status_t call_event_create(void) {
  gca_event_t e = NULL;
  begin();
  TRY(ops->event_create(0, GCA_EVENT_DEFAULT, &e));
  if (first_st == GCA_OK)
    ops->event_destroy(e);
  return first_st;
}
static gca_status_t call_event_destroy(void) {
  gca_event_t e = NULL;
  begin();
  TRY(ops->event_create(0, GCA_EVENT_DEFAULT, &e));
  TRY_OR_REPEAT(ops->event_destroy(e));
  return first_st;
}
static gca_status_t call_event_record(void) {
  gca_stream_t s = NULL;
  gca_event_t e = NULL;
  begin();
  ev_up(&s, &e);
  TRY(ops->event_record(e, s));
  ev_down(s, e);
  return first_st;
}
static gca_status_t call_event_query(void) {
  gca_stream_t s = NULL;
  gca_event_t e = NULL;
  begin();
  ev_up(&s, &e);
  TRY(ops->event_record(e, s));
  TRY(ops->stream_synchronize(s));
  TRY(ops->event_query(e));
  ev_down(s, e);
  return first_st;
}
static gca_status_t call_event_synchronize(void) {
  gca_stream_t s = NULL;
  gca_event_t e = NULL;
  begin();
  ev_up(&s, &e);
  TRY(ops->event_record(e, s));
  TRY(ops->event_synchronize(e));
  ev_down(s, e);
  return first_st;
}
static gca_status_t call_event_elapsed(void) {
  gca_stream_t s = NULL;
  gca_event_t a = NULL, b = NULL;
  float ms;
  begin();
  ev_up(&s, &a);
  TRY(ops->event_create(0, GCA_EVENT_DEFAULT, &b));
  TRY(ops->event_record(a, s));
  TRY(ops->event_record(b, s));
  TRY(ops->stream_synchronize(s));
  TRY(ops->event_elapsed(a, b, &ms));
  ops->event_destroy(b);
  ev_down(s, a);
  return first_st;
}
static gca_status_t call_launch_host_func(void) {
  begin();
  TRY(ops->launch_host_func(NULL, noop, NULL));
  ops->stream_synchronize(NULL);
  return first_st;
}

/* A 2 MiB classic buffer for the copy/kernel ops; undone by buf_down. */
static gca_devptr_t buf_up(void) {
  gca_devptr_t p = 0;
  TRY(ops->mem_alloc(0, 2 * MIB, &p));
  return p;
}
static void buf_down(gca_devptr_t p) {
  ops->stream_synchronize(NULL);
  ops->mem_free(0, p);
}
#define BUF_CALL(name, expr)              \
  static gca_status_t call_##name(void) { \
    begin();                              \
    gca_devptr_t p = buf_up();            \
    if (first_st == GCA_OK)               \
      TRY(expr);                          \
    buf_down(p);                          \
    return first_st;                      \
  }
BUF_CALL(memcpy_async, ops->memcpy_async(p, p + 4096, 256, NULL))
BUF_CALL(memset_d8_async, ops->memset_d8_async(p, 7, 256, NULL))
BUF_CALL(memset_d32_async, ops->memset_d32_async(p, 7, 64, NULL))
BUF_CALL(kernel_fill_u32, ops->kernel_fill_u32(p, 1, 1, 64, NULL))
BUF_CALL(kernel_add_u32, ops->kernel_add_u32(p, p + 256, p + 512, 64, NULL))
BUF_CALL(kernel_philox_u32, ops->kernel_philox_u32(p, 64, p + 256, p + 512, 4, NULL))
BUF_CALL(kernel_copy_batch, ops->kernel_copy_batch(p, 0, NULL))
BUF_CALL(kernel_gemm_f32, ops->kernel_gemm_f32(p, p + 256, p + 512, 4, 4, 4, 0, NULL))
BUF_CALL(kernel_ew_f32, ops->kernel_ew_f32(GCA_EW_ADD, p, p + 256, p + 512, 1, 0, 64, NULL))
BUF_CALL(kernel_dot_f32, ops->kernel_dot_f32(p, p + 256, p + 512, 64, 1, NULL))

static gca_status_t call_kernel_sleep(void) {
  begin();
  TRY(ops->kernel_sleep(1000, NULL));
  ops->stream_synchronize(NULL);
  return first_st;
}

/* A captured one-node graph on a fresh stream; the stream is destroyed here. */
static gca_graph_t captured(gca_devptr_t p) {
  gca_stream_t s = NULL;
  gca_graph_t g = NULL;
  TRY(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  TRY(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  TRY(ops->kernel_fill_u32(p, 3, 0, 64, s));
  TRY(ops->stream_end_capture(s, &g));
  ops->stream_destroy(s);
  return g;
}
static gca_status_t call_stream_begin_capture(void) {
  gca_stream_t s = NULL;
  gca_graph_t g = NULL;
  begin();
  TRY(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  gca_status_t st = ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED);
  TRY(st);
  if (st == GCA_OK && ops->stream_end_capture(s, &g) == GCA_OK && g)
    ops->graph_destroy(g);
  ops->stream_destroy(s);
  return first_st;
}
static gca_status_t call_stream_end_capture(void) {
  gca_stream_t s = NULL;
  gca_graph_t g = NULL;
  begin();
  TRY(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  TRY(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  TRY_OR_REPEAT(ops->stream_end_capture(s, &g));
  if (g)
    ops->graph_destroy(g);
  ops->stream_destroy(s);
  return first_st;
}
static gca_status_t call_stream_capture_info(void) {
  gca_capture_status_t cs;
  begin();
  TRY(ops->stream_capture_info(NULL, &cs, NULL));
  return first_st;
}
static gca_status_t call_thread_exchange_capture_mode(void) {
  gca_capture_mode_t m = GCA_CAPTURE_MODE_RELAXED;
  begin();
  gca_status_t st = ops->thread_exchange_capture_mode(&m);
  TRY(st);
  if (st == GCA_OK)
    ops->thread_exchange_capture_mode(&m);
  return first_st;
}

/* What the graph ops act on; undone by graph_down. */
typedef struct graph_fix {
  gca_devptr_t p;
  gca_graph_t g;
  gca_graph_exec_t x;
} graph_fix_t;
static graph_fix_t graph_up(bool instantiate) {
  graph_fix_t f = {0};
  f.p = buf_up();
  if (first_st == GCA_OK)
    f.g = captured(f.p);
  if (first_st == GCA_OK && instantiate)
    TRY(ops->graph_instantiate(f.g, &f.x));
  return f;
}
static void graph_down(graph_fix_t f) {
  ops->stream_synchronize(NULL);
  if (f.x)
    ops->graph_exec_destroy(f.x);
  if (f.g)
    ops->graph_destroy(f.g);
  buf_down(f.p);
}
static gca_status_t call_graph_node_count(void) {
  size_t n;
  begin();
  graph_fix_t f = graph_up(false);
  if (first_st == GCA_OK)
    TRY(ops->graph_node_count(f.g, &n));
  graph_down(f);
  return first_st;
}
static gca_status_t call_graph_instantiate(void) {
  begin();
  graph_fix_t f = graph_up(true);
  graph_down(f);
  return first_st;
}
static gca_status_t call_graph_upload(void) {
  begin();
  graph_fix_t f = graph_up(true);
  if (first_st == GCA_OK)
    TRY(ops->graph_upload(f.x, NULL));
  graph_down(f);
  return first_st;
}
static gca_status_t call_graph_launch(void) {
  begin();
  graph_fix_t f = graph_up(true);
  if (first_st == GCA_OK)
    TRY(ops->graph_launch(f.x, NULL));
  graph_down(f);
  return first_st;
}
static gca_status_t call_graph_exec_update(void) {
  gca_graph_update_info_t info;
  begin();
  graph_fix_t f = graph_up(true);
  if (first_st == GCA_OK)
    TRY(ops->graph_exec_update(f.x, f.g, &info));
  graph_down(f);
  return first_st;
}
static gca_status_t call_graph_destroy(void) {
  begin();
  graph_fix_t f = graph_up(false);
  if (first_st == GCA_OK) {
    TRY_OR_REPEAT(ops->graph_destroy(f.g));
    f.g = NULL;
  }
  graph_down(f);
  return first_st;
}
static gca_status_t call_graph_exec_destroy(void) {
  begin();
  graph_fix_t f = graph_up(true);
  if (first_st == GCA_OK) {
    TRY_OR_REPEAT(ops->graph_exec_destroy(f.x));
    f.x = NULL;
  }
  graph_down(f);
  return first_st;
}
static gca_status_t call_mem_export_fabric(void) {
  gca_memhandle_t h = 0;
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  begin();
  TRY(ops->mem_create(0, 2 * MIB, &h));
  TRY(ops->mem_export_fabric(h, bytes));
  ops->mem_release(h);
  return first_st;
}
static gca_status_t call_mem_import_fabric(void) {
  gca_memhandle_t h = 0;
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN] = {0};
  begin();
  TRY(ops->mem_import_fabric(0, bytes, &h));
  return first_st;
}

static gca_status_t call_ctx_set_device(void) {
  begin();
  TRY(ops->ctx_set_device(0));
  return first_st;
}
static gca_status_t call_ctx_get_device(void) {
  int dev = -1;
  begin();
  TRY(ops->ctx_get_device(&dev));
  return first_st;
}

static gca_status_t call_stream_get_device(void) {
  gca_stream_t s = NULL;
  int dev = -1;
  begin();
  TRY(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  TRY(ops->stream_get_device(s, &dev));
  TRY(ops->stream_get_device(NULL, &dev));
  if (s != NULL)
    (void)ops->stream_destroy(s);
  return first_st;
}

/* One sim device here: the unfaulted call is refused (no peer), after counting. */
static gca_status_t call_ctx_enable_peer_access(void) {
  begin();
  TRY(ops->ctx_enable_peer_access(0, 1));
  return first_st;
}

static gca_status_t call_host_alloc(void) {
  void *p = NULL;
  begin();
  TRY(ops->host_alloc(4096, &p));
  if (first_st == GCA_OK)
    ops->host_free(p);
  return first_st;
}
static gca_status_t call_host_free(void) {
  void *p = NULL;
  begin();
  TRY(ops->host_alloc(4096, &p));
  TRY_OR_REPEAT(ops->host_free(p));
  return first_st;
}
static gca_status_t call_host_register(void) {
  static char buf[8192] __attribute__((aligned(4096)));
  begin();
  TRY(ops->host_register(buf, sizeof(buf)));
  if (first_st == GCA_OK)
    ops->host_unregister(buf);
  return first_st;
}
static gca_status_t call_host_unregister(void) {
  static char buf[8192] __attribute__((aligned(4096)));
  begin();
  TRY(ops->host_register(buf, sizeof(buf)));
  TRY_OR_REPEAT(ops->host_unregister(buf));
  return first_st;
}

typedef struct op_call {
  gca_status_t (*call)(void);
  bool present; /* the table has a function for the op */
  bool core;    /* a memory/device op of the sim core: must also succeed unfaulted */
} op_call_t;

static op_call_t calls_of[GCA_OP_COUNT];

static void fill_calls(void) {
#define FILL(name) calls_of[GCA_OP_##name] = (op_call_t){call_##name, ops->name != NULL, false};
  GCA_DEVICE_OP_MAP(FILL)
#undef FILL
  for (int i = GCA_OP_init; i <= GCA_OP_mem_import_fd; i++)
    calls_of[i].core = true;
}

static gca_status_t natural_error(int op) {
  return (op == GCA_OP_mem_alloc || op == GCA_OP_mem_create || op == GCA_OP_mem_address_reserve ||
          op == GCA_OP_host_alloc || op == GCA_OP_host_register)
             ? GCA_ERR_OUT_OF_MEMORY
             : GCA_ERR_DRIVER;
}

static void expect_injected(int op, gca_status_t st, const char *how) {
  const char *name = gca_sim_op_name(op);
  char want[96];
  snprintf(want, sizeof(want), "%s: injected fault (sim, call ", name);
  if (st != natural_error(op))
    fail_msg("%s with %s: got %s (%s), wanted %s", name, how, gca_status_name(st), first_detail,
             gca_status_name(natural_error(op)));
  if (strstr(first_detail, want) != first_detail)
    fail_msg("%s with %s: detail '%s' does not start with '%s'", name, how, first_detail, want);
}

static void every_op_fails_by_name_and_recovers(void **state) {
  (void)state;
  fill_calls();
  assert_int_equal(gca_sim_op_count(), GCA_OP_COUNT);
  int tested = 0;
  for (int i = 0; i < gca_sim_op_count(); i++) {
    const char *name = gca_sim_op_name(i);
    if (!calls_of[i].present) {
      assert_false(calls_of[i].core);
      continue;
    }
    for (int how = 0; how < 2; how++) {
      char spec[96];
      /* As gca_sim_fault_set is called, then as GCA_SIM_FAULTS is written: several rules. */
      if (how == 0)
        snprintf(spec, sizeof(spec), "%s:nth=1", name);
      else
        snprintf(spec, sizeof(spec), " kernel_sleep:nth=1000000 , %s:nth=1 ", name);
      assert_ok(gca_sim_fault_set(spec));
      int64_t before = gca_sim_call_count(name);
      gca_status_t st = calls_of[i].call();
      expect_injected(i, st, spec);
      assert_true(gca_sim_call_count(name) > before);
      gca_sim_fault_clear();
      st = calls_of[i].call();
      if (calls_of[i].core && st != GCA_OK)
        fail_msg("%s unfaulted: %s (%s)", name, gca_status_name(st), first_detail);
      if (st != GCA_OK && strstr(first_detail, "injected") != NULL)
        fail_msg("%s: fault still fires after clear: %s", name, first_detail);
      if (gca_sim_used_bytes(0) != 0)
        fail_msg("%s: %llu bytes left in use", name, (unsigned long long)gca_sim_used_bytes(0));
    }
    tested++;
  }
  assert_true(tested >= GCA_OP_mem_import_fd + 1);
  printf("fault injection exercised on %d of %d ops\n", tested, GCA_OP_COUNT);
}

static void nth_fails_once_at_the_nth_call_from_now(void **state) {
  (void)state;
  size_t g;
  for (int i = 0; i < 2; i++)
    assert_ok(ops->mem_granularity(0, false, &g));
  assert_ok(gca_sim_fault_set("mem_granularity:nth=3"));
  assert_ok(ops->mem_granularity(0, false, &g));
  assert_ok(ops->mem_granularity(0, false, &g));
  assert_status(ops->mem_granularity(0, false, &g), GCA_ERR_DRIVER,
                "mem_granularity: injected fault (sim, call 5)");
  for (int i = 0; i < 5; i++)
    assert_ok(ops->mem_granularity(0, false, &g));
}

static void every_k_fails_each_kth_call(void **state) {
  (void)state;
  int v;
  assert_ok(gca_sim_fault_set("device_attr:every=3"));
  for (int i = 1; i <= 9; i++) {
    gca_status_t st = ops->device_attr(0, GCA_ATTR_CC_MAJOR, &v);
    assert_int_equal(st, i % 3 == 0 ? GCA_ERR_DRIVER : GCA_OK);
  }
  assert_int_equal(gca_sim_call_count("device_attr"), 9);
}

static void after_bytes_fails_creations_past_the_budget(void **state) {
  (void)state;
  gca_memhandle_t h[4];
  assert_ok(gca_sim_fault_set("mem_create:after_bytes=6MiB,mem_map:after_bytes=1"));
  for (int i = 0; i < 3; i++)
    assert_ok(ops->mem_create(0, 2 * MIB, &h[i]));
  assert_status(ops->mem_create(0, 2 * MIB, &h[3]), GCA_ERR_OUT_OF_MEMORY,
                "mem_create: injected fault");
  assert_int_equal(gca_sim_used_bytes(0), 6 * MIB);
  /* Counted from the rule's start, not what is in use: releasing does not refill it. */
  assert_ok(ops->mem_release(h[0]));
  assert_status(ops->mem_create(0, 2 * MIB, &h[0]), GCA_ERR_OUT_OF_MEMORY,
                "mem_create: injected fault");
  /* An op that creates nothing never trips it. */
  gca_devptr_t base;
  assert_ok(ops->mem_address_reserve(0, 2 * MIB, 0, &base));
  assert_ok(ops->mem_map(base, 2 * MIB, 0, h[1]));
  assert_ok(ops->mem_unmap(base, 2 * MIB));
  assert_ok(ops->mem_address_free(0, base, 2 * MIB));
  assert_ok(ops->mem_release(h[1]));
  assert_ok(ops->mem_release(h[2]));

  /* mem_alloc counts the rounded size (256 B units up to 1 MiB, granules above);
   * a call that fits after one that did not still passes. */
  gca_devptr_t p[2];
  assert_ok(gca_sim_fault_set("mem_alloc:after_bytes=4MiB"));
  assert_ok(ops->mem_alloc(0, 1, &p[0]));
  assert_status(ops->mem_alloc(0, 2 * MIB + 1, &p[1]), GCA_ERR_OUT_OF_MEMORY,
                "mem_alloc: injected fault");
  assert_ok(ops->mem_alloc(0, 100, &p[1]));
  gca_devptr_t q;
  assert_status(ops->mem_alloc(0, 4 * MIB - 511, &q), GCA_ERR_OUT_OF_MEMORY,
                "mem_alloc: injected fault");
  assert_ok(ops->mem_free(0, p[0]));
  assert_ok(ops->mem_free(0, p[1]));
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void always_fails_until_cleared(void **state) {
  (void)state;
  size_t f, t;
  assert_ok(gca_sim_fault_set("mem_get_info:always"));
  for (int i = 0; i < 5; i++)
    assert_status(ops->mem_get_info(0, &f, &t), GCA_ERR_DRIVER, "mem_get_info: injected fault");
  gca_sim_fault_clear();
  assert_ok(ops->mem_get_info(0, &f, &t));
}

static void setting_a_rule_replaces_only_that_ops_rule(void **state) {
  (void)state;
  size_t g;
  int v;
  assert_ok(gca_sim_fault_set("mem_granularity:always, device_count:always"));
  assert_ok(gca_sim_fault_set("device_count:nth=2"));
  assert_status(ops->mem_granularity(0, false, &g), GCA_ERR_DRIVER, "mem_granularity");
  assert_ok(ops->device_count(&v));
  assert_status(ops->device_count(&v), GCA_ERR_DRIVER, "device_count: injected");
  assert_ok(ops->device_count(&v));
  assert_ok(gca_sim_fault_set("")); /* empty: nothing changes */
  assert_status(ops->mem_granularity(0, false, &g), GCA_ERR_DRIVER, "mem_granularity");
}

static void bad_specs_are_rejected_quoted_and_change_nothing(void **state) {
  (void)state;
  static const struct {
    const char *spec, *quote;
  } bad[] = {
      {"device_attr:always,bogus_op:nth=1", "bogus_op:nth=1"},
      {"device_attr:sometimes", "device_attr:sometimes"},
      {"device_attr:nth=0", "device_attr:nth=0"},
      {"device_attr:every=x", "device_attr:every=x"},
      {"device_attr:nth=", "device_attr:nth="},
      {"device_attr", "device_attr"},
      {"mem_create:after_bytes=lots", "mem_create:after_bytes=lots"},
      {":always", ":always"},
  };
  int v;
  assert_ok(gca_sim_fault_set("device_count:nth=2"));
  for (size_t i = 0; i < GCA_ARRAY_SIZE(bad); i++)
    assert_status(gca_sim_fault_set(bad[i].spec), GCA_ERR_CONFIG, bad[i].quote);
  assert_status(gca_sim_fault_set(NULL), GCA_ERR_INVALID_ARGUMENT, "gca_sim_fault_set");
  /* device_attr:always from the first spec was not applied ... */
  assert_ok(ops->device_attr(0, GCA_ATTR_CC_MAJOR, &v));
  /* ... and the earlier device_count rule still counts from where it was. */
  assert_ok(ops->device_count(&v));
  assert_status(ops->device_count(&v), GCA_ERR_DRIVER, "device_count: injected");
  assert_ok(ops->device_count(&v));
}

static void counters_are_exact_and_reset(void **state) {
  (void)state;
  for (int i = 0; i < gca_sim_op_count(); i++)
    assert_int_equal(gca_sim_call_count(gca_sim_op_name(i)), 0);
  int n;
  size_t g;
  for (int i = 0; i < 3; i++)
    assert_ok(ops->device_count(&n));
  assert_ok(gca_sim_fault_set("mem_granularity:nth=2"));
  assert_ok(ops->mem_granularity(0, false, &g));
  assert_int_equal(ops->mem_granularity(0, false, &g), GCA_ERR_DRIVER);
  assert_int_equal(ops->mem_granularity(0, false, NULL), GCA_ERR_INVALID_ARGUMENT);
  assert_int_equal(gca_sim_call_count("device_count"), 3);
  assert_int_equal(gca_sim_call_count("mem_granularity"), 3); /* failed calls count */
  assert_int_equal(gca_sim_call_count("mem_map"), 0);
  assert_int_equal(gca_sim_call_count("no_such_op"), -1);
  assert_int_equal(gca_sim_call_count(NULL), -1);
  assert_null(gca_sim_op_name(-1));
  assert_null(gca_sim_op_name(GCA_OP_COUNT));
  assert_string_equal(gca_sim_op_name(GCA_OP_mem_map), "mem_map");
  gca_sim_counters_reset();
  assert_int_equal(gca_sim_call_count("device_count"), 0);
  assert_int_equal(gca_sim_call_count("mem_granularity"), 0);
}

/* ---- GCA_SIM_FAULTS at start-up, in a child process with its own environment ---- */

/* gca_sim_set_latency: the op waits, is counted, then acts; 0 turns it off. */
static void latency_delays_an_op_until_turned_off(void **state) {
  (void)state;
  assert_status(gca_sim_set_latency("no_such_op", 1), GCA_ERR_CONFIG, "no_such_op");
  assert_status(gca_sim_set_latency(NULL, 1), GCA_ERR_CONFIG, "gca_sim_set_latency");
  const uint64_t lat = 30ull * 1000 * 1000;
  assert_ok(gca_sim_set_latency("mem_alloc", lat));
  gca_devptr_t p = 0;
  uint64_t t0 = gca__now_ns();
  assert_ok(ops->mem_alloc(0, 2 << 20, &p));
  uint64_t slow = gca__now_ns() - t0;
  assert_ok(gca_sim_set_latency("mem_alloc", 0));
  assert_true(slow >= lat); /* a lower bound only: the machine may be slower, never faster */
  assert_ok(ops->mem_free(0, p));
}

typedef struct held_call {
  gca_devptr_t p;
  gca_status_t st;
  atomic_int done;
} held_call_t;

static void *held_alloc(void *arg) {
  held_call_t *h = arg;
  h->st = ops->mem_alloc(0, 2 << 20, &h->p);
  atomic_store(&h->done, 1);
  return NULL;
}

/* gca_sim_hold: a held op's call is counted on arrival and waits, having done
 * nothing, until the hold ends; then it acts. */
static void hold_keeps_a_call_inside_the_driver_until_released(void **state) {
  (void)state;
  assert_status(gca_sim_hold("no_such_op", true), GCA_ERR_CONFIG, "no_such_op");
  assert_status(gca_sim_hold(NULL, true), GCA_ERR_CONFIG, "gca_sim_hold");
  uint64_t used = gca_sim_used_bytes(0);
  int64_t calls = gca_sim_call_count("mem_alloc");
  held_call_t h = {0};
  atomic_init(&h.done, 0);
  assert_ok(gca_sim_hold("mem_alloc", true));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, held_alloc, &h), 0);
  while (gca_sim_call_count("mem_alloc") == calls)
    sched_yield();
  assert_int_equal(gca_sim_used_bytes(0), used); /* arrived, and nothing done */
  assert_int_equal(atomic_load(&h.done), 0);
  assert_ok(gca_sim_hold("mem_alloc", false));
  pthread_join(t, NULL);
  assert_ok(h.st);
  assert_int_equal(gca_sim_used_bytes(0), used + (2 << 20));
  assert_ok(ops->mem_free(0, h.p));
}

static void child_main(void) {
  const gca_device_ops_t *o = gca__sim_ops();
  gca_status_t st = o->init();
  printf("init %s\n", gca_status_name(st));
  if (st != GCA_OK)
    return;
  for (int i = 0; i < 3; i++) {
    gca_memhandle_t h;
    st = o->mem_create(0, 2 * MIB, &h);
    printf("create %s%s%s\n", gca_status_name(st), st ? " " : "", st ? gca_last_error() : "");
    if (st == GCA_OK)
      o->mem_release(h);
  }
  int v;
  st = o->device_attr(0, GCA_ATTR_CC_MAJOR, &v);
  printf("attr %s\n", gca_status_name(st));
}

static void env_spec_arms_rules_at_start(void **state) {
  (void)state;
  char self[PATH_MAX], cmd[PATH_MAX + 128], out[1024];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  assert_true(n > 0);
  self[n] = '\0';
  snprintf(cmd, sizeof(cmd), "GCA_SIM_FAULTS='mem_create:nth=2, device_attr:always' '%s' --child",
           self);
  fflush(NULL);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t len = fread(out, 1, sizeof(out) - 1, f);
  out[len] = '\0';
  assert_int_equal(pclose(f), 0);
  assert_string_equal(out, "init GCA_OK\n"
                           "create GCA_OK\n"
                           "create GCA_ERR_OUT_OF_MEMORY mem_create: injected fault (sim, call 2)\n"
                           "create GCA_OK\n"
                           "attr GCA_ERR_DRIVER\n");
}

typedef struct pt_job {
  gca_devptr_t d;
  gca_status_t first, second; /* the call without host memory, the calls after */
  char detail[512];
  uint32_t word;
} pt_job_t;

/* On a fresh thread: a memset on its per-thread stream while its creation
 * finds no host memory, then again, then the word read back. No assertion
 * here: the test checks what it recorded. */
static void *per_thread_job(void *arg) {
  pt_job_t *job = arg;
  if ((job->first = gca__failpoint_arm("sim_stream_new", 1)) != GCA_OK)
    return NULL;
  job->first = ops->memset_d32_async(job->d, 0xabcdu, 1, GCA_STREAM_PER_THREAD);
  snprintf(job->detail, sizeof(job->detail), "%s", gca_last_error());
  gca__failpoint_clear();
  job->second = ops->memset_d32_async(job->d, 0xabcdu, 1, GCA_STREAM_PER_THREAD);
  if (job->second == GCA_OK)
    job->second = ops->stream_synchronize(GCA_STREAM_PER_THREAD);
  if (job->second == GCA_OK)
    job->second =
        ops->memcpy_async((gca_devptr_t)(uintptr_t)&job->word, job->d, 4, GCA_STREAM_PER_THREAD);
  if (job->second == GCA_OK)
    job->second = ops->stream_synchronize(GCA_STREAM_PER_THREAD);
  return NULL;
}

/* ---- host memory running out (Note [Host fail points]) ---- */

/* A thread's per-thread stream is made on its first use; without host memory
 * for it the call fails with a clear status, queues nothing, and the next use
 * makes the stream. */
static void per_thread_stream_creation_without_host_memory_fails_cleanly(void **state) {
  (void)state;
  gca_devptr_t d = 0;
  assert_ok(ops->mem_alloc(0, 4096, &d));
  pthread_t th;
  pt_job_t job = {.d = d, .first = GCA_OK, .second = GCA_ERR_INTERNAL};
  /* a fresh thread, so that its per-thread stream does not exist yet */
  assert_int_equal(pthread_create(&th, NULL, per_thread_job, &job), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(job.first, GCA_ERR_OUT_OF_MEMORY);
  if (!strstr(job.detail, "no host memory for a stream"))
    fail_msg("detail '%s' does not say what ran out", job.detail);
  assert_ok(job.second);
  assert_int_equal(job.word, 0xabcdu);
  assert_ok(ops->mem_free(0, d));
}

/* An async copy from pageable memory reads the source at the call into a
 * staging buffer; without host memory for it the call fails, queues nothing,
 * and the stream goes on. */
static void pageable_copy_without_host_memory_for_staging_fails_cleanly(void **state) {
  (void)state;
  gca_devptr_t d = 0;
  gca_stream_t s = NULL;
  uint32_t src[256], back[256];
  for (uint32_t i = 0; i < 256; i++)
    src[i] = 0x900d0000u + i;
  assert_ok(ops->mem_alloc(0, sizeof(src), &d));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->memset_d32_async(d, 0, 256, s));
  assert_ok(gca__failpoint_arm("sim_copy_staging", 1));
  assert_status(ops->memcpy_async(d, (gca_devptr_t)(uintptr_t)src, sizeof(src), s),
                GCA_ERR_OUT_OF_MEMORY, "no host memory to stage 1024 bytes of pageable source");
  gca__failpoint_clear();
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)back, d, sizeof(back), s));
  assert_ok(ops->stream_synchronize(s));
  for (uint32_t i = 0; i < 256; i++)
    assert_int_equal(back[i], 0); /* the failed copy wrote nothing */
  assert_ok(ops->memcpy_async(d, (gca_devptr_t)(uintptr_t)src, sizeof(src), s));
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)back, d, sizeof(back), s));
  assert_ok(ops->stream_synchronize(s));
  assert_memory_equal(back, src, sizeof(src));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, d));
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--child") == 0) {
    child_main();
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(every_op_fails_by_name_and_recovers, reset, reset),
      cmocka_unit_test_setup_teardown(per_thread_stream_creation_without_host_memory_fails_cleanly,
                                      reset, reset),
      cmocka_unit_test_setup_teardown(pageable_copy_without_host_memory_for_staging_fails_cleanly,
                                      reset, reset),
      cmocka_unit_test_setup_teardown(nth_fails_once_at_the_nth_call_from_now, reset, reset),
      cmocka_unit_test_setup_teardown(every_k_fails_each_kth_call, reset, reset),
      cmocka_unit_test_setup_teardown(after_bytes_fails_creations_past_the_budget, reset, reset),
      cmocka_unit_test_setup_teardown(always_fails_until_cleared, reset, reset),
      cmocka_unit_test_setup_teardown(setting_a_rule_replaces_only_that_ops_rule, reset, reset),
      cmocka_unit_test_setup_teardown(bad_specs_are_rejected_quoted_and_change_nothing, reset,
                                      reset),
      cmocka_unit_test_setup_teardown(counters_are_exact_and_reset, reset, reset),
      cmocka_unit_test_setup_teardown(latency_delays_an_op_until_turned_off, reset, reset),
      cmocka_unit_test_setup_teardown(hold_keeps_a_call_inside_the_driver_until_released, reset,
                                      reset),
      cmocka_unit_test_setup_teardown(env_spec_arms_rules_at_start, reset, reset),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
