/* SPDX-License-Identifier: Apache-2.0 */
/* test_ipc_fabric.c - sharing blocks through fabric handles (gca_ipc_export_ex
 * with GCA_IPC_FABRIC) on the sim backend.
 *
 * The sim reports no fabric support, as a GPU outside a multi-node NVLink
 * fabric does, so on the plain sim table the tests pin the refusals: export
 * and open are GCA_ERR_NOT_SUPPORTED with a message, the driver is never
 * asked, nothing leaks. For the paths that need a fabric-capable driver the
 * tests wrap the sim table (the device layer's seam): the wrapper reports
 * fabric support and, after passing each call through the sim's own fabric op
 * (so counters and injected faults behave as for any op), names a physical
 * handle with 64 bytes that point into a table of exported fds. The round trip
 * through a socketpair then maps the same memory as the exporter's, and every
 * malformed fabric message is GCA_ERR_PARSE with no descriptor leaked. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "alloc_fixture.h"

#define SEED 0xfab0c0deu

/* ---- a fabric-capable sim ---- */

#define MAX_SLOTS 16

/* slots[0..nslots): the fds behind the fabric handles handed out, owned here
 * until the fixture's teardown closes them. */
static struct {
  const gca_device_ops_t *sim;
  gca_device_ops_t ops;
  int slots[MAX_SLOTS];
  uint32_t nslots;
} fab;

static const char FAB_MAGIC[8] = "SIMFAB1";

static gca_status_t fab_device_attr(int dev, gca_dev_attr_t attr, int *value) {
  GCA_CHECK(fab.sim->device_attr(dev, attr, value));
  if (attr == GCA_ATTR_FABRIC_SUPPORTED)
    *value = 1;
  return GCA_OK;
}

/* The bytes: magic, u32 slot, u32 zero, u64 the exporter's handle, zeros. */
static gca_status_t fab_export(gca_memhandle_t handle, uint8_t out[GCA_FABRIC_HANDLE_LEN]) {
  gca_status_t st = fab.sim->mem_export_fabric(handle, out);
  if (st != GCA_ERR_NOT_SUPPORTED)
    return st;
  int fd = -1;
  GCA_CHECK(fab.sim->mem_export_fd(handle, &fd));
  if (fab.nslots == MAX_SLOTS) {
    close(fd);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "mem_export_fabric: the test's table is full");
  }
  memset(out, 0, GCA_FABRIC_HANDLE_LEN);
  memcpy(out, FAB_MAGIC, sizeof(FAB_MAGIC));
  memcpy(out + 8, &fab.nslots, sizeof(fab.nslots));
  memcpy(out + 16, &handle, sizeof(handle));
  fab.slots[fab.nslots++] = fd;
  return GCA_OK;
}

static gca_status_t fab_import(int dev, const uint8_t in[GCA_FABRIC_HANDLE_LEN],
                               gca_memhandle_t *out) {
  gca_status_t st = fab.sim->mem_import_fabric(dev, in, out);
  if (st != GCA_ERR_NOT_SUPPORTED)
    return st;
  uint32_t slot;
  memcpy(&slot, in + 8, sizeof(slot));
  if (memcmp(in, FAB_MAGIC, sizeof(FAB_MAGIC)) != 0 || slot >= fab.nslots)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_import_fabric: unknown fabric handle");
  return fab.sim->mem_import_fd(dev, fab.slots[slot], out);
}

/* ---- fixtures ---- */

static int sim_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("ipc_handles:True"));
  return 0;
}

static int fab_setup_with(void **state, const char *conf) {
  alloc_setup(state);
  fab.sim = ops;
  fab.ops = *ops;
  fab.ops.device_attr = fab_device_attr;
  fab.ops.mem_export_fabric = fab_export;
  fab.ops.mem_import_fabric = fab_import;
  fab.nslots = 0;
  gca__device_override(&fab.ops);
  ops = &fab.ops;
  assert_ok(gca_set_config(conf));
  return 0;
}

static int fab_setup(void **state) {
  return fab_setup_with(state, "ipc_handles:True");
}

static int fab_exp_setup(void **state) {
  return fab_setup_with(state, "expandable_segments:True");
}

static int fab_teardown(void **state) {
  alloc_teardown(state);
  for (uint32_t i = 0; i < fab.nslots; i++)
    close(fab.slots[i]);
  fab.nslots = 0;
  gca__device_override(fab.sim);
  ops = fab.sim;
  return 0;
}

/* ---- the plain sim: no fabric support ---- */

static void sim_fabric_ops_refuse_naming_the_op(void **state) {
  (void)state;
  int v = -1;
  assert_ok(ops->device_attr(0, GCA_ATTR_FABRIC_SUPPORTED, &v));
  assert_int_equal(v, 0);
  gca_memhandle_t h = 0, out = 7;
  assert_ok(ops->mem_create(0, 2 * MiB, &h));
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN] = {0};
  assert_status(ops->mem_export_fabric(h, bytes), GCA_ERR_NOT_SUPPORTED, "mem_export_fabric: ");
  assert_status(ops->mem_import_fabric(0, bytes, &out), GCA_ERR_NOT_SUPPORTED,
                "mem_import_fabric: sim device 0 has no fabric handles");
  assert_int_equal(out, 7);
  assert_int_equal(gca_sim_call_count("mem_export_fabric"), 1);
  assert_int_equal(gca_sim_call_count("mem_import_fabric"), 1);
  assert_ok(ops->mem_release(h));
}

static void fabric_op_faults_reach_the_caller_by_name(void **state) {
  (void)state;
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN] = {0};
  gca_memhandle_t h = 0;
  assert_ok(ops->mem_create(0, 2 * MiB, &h));
  assert_ok(gca_sim_fault_set("mem_export_fabric:nth=1"));
  assert_status(ops->mem_export_fabric(h, bytes), GCA_ERR_DRIVER,
                "mem_export_fabric: injected fault (sim, call ");
  assert_ok(gca_sim_fault_set("mem_import_fabric:nth=2"));
  assert_status(ops->mem_import_fabric(0, bytes, &h), GCA_ERR_NOT_SUPPORTED, "mem_import_fabric");
  assert_status(ops->mem_import_fabric(0, bytes, &h), GCA_ERR_DRIVER,
                "mem_import_fabric: injected fault (sim, call ");
  gca_sim_fault_clear();
  assert_status(ops->mem_export_fabric(h, bytes), GCA_ERR_NOT_SUPPORTED, "mem_export_fabric");
  assert_ok(ops->mem_release(h));
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void fabric_export_on_sim_is_not_supported_and_leaks_nothing(void **state) {
  (void)state;
  void *p = alloc_on(3 * MiB, NULL);
  int before = test_fd_count();
  gca_ipc_handle_t *h = NULL;
  assert_status(gca_ipc_export_ex(p, GCA_IPC_FABRIC, &h), GCA_ERR_NOT_SUPPORTED,
                "ipc_export: device 0 does not support fabric handles");
  assert_non_null(strstr(gca_last_error(), "GCA_IPC_FABRIC"));
  assert_null(h);
  assert_int_equal(gca_sim_call_count("mem_export_fabric"), 0);
  assert_int_equal(gca_sim_call_count("mem_export_fd"), 0);
  assert_int_equal(test_fd_count(), before);
  /* the block is untouched and still exports as fds */
  assert_ok(gca_ipc_export_ex(p, 0, &h));
  unsigned flags = 99;
  assert_ok(gca_ipc_handle_flags(h, &flags));
  assert_int_equal(flags, 0);
  gca_ipc_handle_free(h);
  assert_int_equal(test_fd_count(), before);
  free_ok(p);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void unknown_export_flags_are_invalid(void **state) {
  (void)state;
  void *p = alloc_on(3 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_status(gca_ipc_export_ex(p, 0x6, &h), GCA_ERR_INVALID_ARGUMENT,
                "ipc_export: unknown flags 0x6");
  assert_status(gca_ipc_export_ex(NULL, GCA_IPC_FABRIC, &h), GCA_ERR_INVALID_ARGUMENT,
                "ipc_export: ptr is NULL");
  assert_null(h);
  assert_status(gca_ipc_handle_flags(NULL, &(unsigned){0}), GCA_ERR_INVALID_ARGUMENT,
                "ipc_handle_flags");
  free_ok(p);
}

/* ---- the wire ---- */

#define PRE_LEN   16u
#define HEAD_LEN  32u
#define FENTRY    96u
#define MAX_FWIRE (HEAD_LEN + 2 * FENTRY)

static void set_u16(uint8_t *p, uint16_t v) {
  memcpy(p, &v, 2);
}
static void set_u32(uint8_t *p, uint32_t v) {
  memcpy(p, &v, 4);
}
static void set_u64(uint8_t *p, uint64_t v) {
  memcpy(p, &v, 8);
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void read_all(int sock, uint8_t *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t r = read(sock, buf + done, len - done);
    if (r < 0 && errno == EINTR)
      continue;
    assert_true(r > 0);
    done += (size_t)r;
  }
}

/* Sends buf[0..len) with `nfds` copies of `fd` attached. */
static void raw_send(int sock, const uint8_t *buf, size_t len, int fd, int nfds) {
  union {
    char b[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof(ctl));
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    int fds[4] = {fd, fd, fd, fd};
    msg.msg_control = ctl.b;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  assert_int_equal(sendmsg(sock, &msg, MSG_NOSIGNAL), (ssize_t)len);
}

/* A valid one-handle fabric message, written by hand as ipc.h describes it. */
typedef struct fwire {
  uint8_t pre[PRE_LEN];
  uint8_t body[MAX_FWIRE];
  size_t body_len;
} fwire_t;

static fwire_t valid_fwire(void) {
  fwire_t w;
  memset(&w, 0, sizeof(w));
  set_u32(w.pre, GCA_IPC_MAGIC);
  set_u16(w.pre + 4, GCA_IPC_VERSION);
  set_u16(w.pre + 6, GCA_IPC_KIND_FABRIC);
  w.body_len = HEAD_LEN + FENTRY;
  set_u32(w.pre + 8, (uint32_t)w.body_len);
  set_u32(w.pre + 12, 0);
  memset(w.body, 0xab, 16);
  set_u32(w.body + 16, 0);
  set_u32(w.body + 20, 1);
  set_u64(w.body + 24, 3 * MiB);
  uint8_t *e = w.body + HEAD_LEN;
  set_u64(e, 4 * MiB);
  set_u64(e + 8, 0);
  set_u64(e + 16, 4 * MiB);
  set_u64(e + 24, 0);
  memcpy(e + 32, FAB_MAGIC, sizeof(FAB_MAGIC));
  return w;
}

/* Writes pre + body[0..body_len) (with nfds fds on the body) and closes the
 * writing end; returns what gca_ipc_recv made of it. */
static gca_status_t recv_wire(const uint8_t *pre, const uint8_t *body, size_t body_len, int nfds,
                              gca_ipc_handle_t **h) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  raw_send(sv[0], pre, PRE_LEN, -1, 0);
  if (body_len > 0)
    raw_send(sv[0], body, body_len, sv[0], nfds);
  shutdown(sv[0], SHUT_WR);
  gca_clear_last_error();
  gca_status_t st = gca_ipc_recv(sv[1], h);
  close(sv[0]);
  close(sv[1]);
  return st;
}

static void expect_refused(const fwire_t *w, size_t body_len, int nfds, const char *needle) {
  int before = test_fd_count();
  gca_ipc_handle_t *h = NULL;
  gca_status_t st = recv_wire(w->pre, w->body, body_len, nfds, &h);
  if (st != GCA_ERR_PARSE)
    fail_msg("recv -> %s (wanted GCA_ERR_PARSE): %s", gca_status_name(st), gca_last_error());
  if (strstr(gca_last_error(), needle) == NULL)
    fail_msg("detail '%s' does not mention '%s'", gca_last_error(), needle);
  assert_null(h);
  assert_int_equal(test_fd_count(), before);
}

static void hand_written_fabric_message_is_received(void **state) {
  (void)state;
  fwire_t w = valid_fwire();
  gca_ipc_handle_t *h = NULL;
  assert_ok(recv_wire(w.pre, w.body, w.body_len, 0, &h));
  unsigned flags = 0;
  size_t size = 0, n = 0;
  uint8_t id[16];
  assert_ok(gca_ipc_handle_flags(h, &flags));
  assert_int_equal(flags, GCA_IPC_FABRIC);
  assert_ok(gca_ipc_handle_info(h, NULL, &size, &n, id));
  assert_int_equal(size, 3 * MiB);
  assert_int_equal(n, 1);
  assert_int_equal(id[15], 0xab);
  gca_ipc_handle_free(h);
}

static void malformed_fabric_messages_are_parse_errors_and_leak_no_fd(void **state) {
  (void)state;
  fwire_t w = valid_fwire();
  expect_refused(&w, w.body_len, 1, "descriptors announced");
  set_u16(w.pre + 6, 2);
  expect_refused(&w, w.body_len, 0, "handle kind 2");
  w = valid_fwire();
  set_u32(w.pre + 12, 1);
  expect_refused(&w, w.body_len, 1, "fabric message with 1 descriptors");
  w = valid_fwire();
  set_u32(w.pre + 8, HEAD_LEN + FENTRY + 8);
  expect_refused(&w, w.body_len + 8, 0, "fabric message");
  set_u32(w.pre + 8, HEAD_LEN);
  expect_refused(&w, HEAD_LEN, 0, "fabric message");
  set_u32(w.pre + 8, 8);
  expect_refused(&w, 8, 0, "fabric message");
  set_u32(w.pre + 8, HEAD_LEN + (GCA_IPC_MAX_HANDLES + 1) * FENTRY);
  expect_refused(&w, 0, 0, "fabric message");
  w = valid_fwire();
  set_u32(w.body + 20, 2);
  expect_refused(&w, w.body_len, 0, "the body lists 2 handles, the preamble 1");
  w = valid_fwire();
  set_u64(w.body + HEAD_LEN + 16, 0);
  expect_refused(&w, w.body_len, 0, "do not fit");
  w = valid_fwire();
  set_u64(w.body + HEAD_LEN + 16, 2 * MiB); /* part of the handle: cuMemMap maps one whole */
  expect_refused(&w, w.body_len, 0, "only a whole handle");
  set_u64(w.body + HEAD_LEN, 2 * MiB);
  expect_refused(&w, w.body_len, 0, "do not cover");
  w = valid_fwire();
  expect_refused(&w, w.body_len - 1, 0, "truncated");
}

static void fabric_open_on_sim_is_not_supported_and_touches_nothing(void **state) {
  (void)state;
  fwire_t w = valid_fwire();
  gca_ipc_handle_t *h = NULL;
  assert_ok(recv_wire(w.pre, w.body, w.body_len, 0, &h));
  gca_sim_counters_reset();
  void *q = NULL;
  assert_status(gca_ipc_open(h, 0, &q), GCA_ERR_NOT_SUPPORTED,
                "ipc_open: device 0 does not support fabric handles");
  assert_null(q);
  assert_int_equal(gca_sim_call_count("mem_import_fabric"), 0);
  assert_int_equal(gca_sim_call_count("mem_address_reserve"), 0);
  gca_ipc_handle_free(h);
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

/* ---- a fabric-capable device ---- */

static void fabric_handles_round_trip_through_a_socketpair(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  void *p = alloc_on(2 * MiB, NULL); /* over two (granule) mappings of the expandable segment:
                                      the last 1 MiB of keep's second and the next */
  stamp_fill(p, 2 * MiB, SEED);
  int before = test_fd_count();
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export_ex(p, GCA_IPC_FABRIC, &h));
  assert_int_equal(gca_sim_call_count("mem_export_fabric"), 2);
  unsigned flags = 0;
  size_t size = 0, n = 0;
  uint8_t id[16], id2[16];
  assert_ok(gca_ipc_handle_flags(h, &flags));
  assert_int_equal(flags, GCA_IPC_FABRIC);
  assert_ok(gca_ipc_handle_info(h, NULL, &size, &n, id));
  assert_int_equal(size, block_size_of(p));
  assert_int_equal(n, 2);

  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  /* first as raw bytes: kind 1, no descriptors, the 64 bytes after each entry */
  assert_ok(gca_ipc_send(sv[0], h));
  uint8_t pre[PRE_LEN], body[MAX_FWIRE];
  read_all(sv[1], pre, sizeof(pre));
  assert_int_equal(pre[6], GCA_IPC_KIND_FABRIC);
  assert_int_equal(get_u32(pre + 8), HEAD_LEN + 2 * FENTRY);
  assert_int_equal(get_u32(pre + 12), 0);
  read_all(sv[1], body, HEAD_LEN + 2 * FENTRY);
  assert_int_equal(get_u32(body + 20), 2);
  for (int i = 0; i < 2; i++) {
    const uint8_t *fh = body + HEAD_LEN + FENTRY * (size_t)i + 32;
    assert_memory_equal(fh, FAB_MAGIC, sizeof(FAB_MAGIC));
    assert_int_equal(get_u32(fh + 8), (uint32_t)i);
  }
  assert_int_equal(
      get_u64(body + HEAD_LEN + 16) + get_u64(body + HEAD_LEN + FENTRY + 16) >= 2 * MiB, 1);
  /* then through gca_ipc_recv */
  assert_ok(gca_ipc_send(sv[0], h));
  gca_ipc_handle_free(h);
  gca_ipc_handle_t *r = NULL;
  assert_ok(gca_ipc_recv(sv[1], &r));
  close(sv[0]);
  close(sv[1]);
  assert_int_equal(test_fd_count(), before + 2); /* the two slots the wrapper keeps */
  assert_ok(gca_ipc_handle_flags(r, &flags));
  assert_int_equal(flags, GCA_IPC_FABRIC);
  assert_ok(gca_ipc_handle_info(r, NULL, &size, &n, id2));
  assert_memory_equal(id, id2, sizeof(id));

  void *q = NULL;
  assert_ok(gca_ipc_open(r, 0, &q));
  gca_ipc_handle_free(r);
  assert_int_equal(gca_sim_call_count("mem_import_fabric"), 2);
  assert_int_equal(gca_sim_call_count("mem_import_fd"), 2);
  assert_true(q != p);
  assert_int_equal(stamp_mismatch(q, 2 * MiB, SEED), -1);
  stamp_fill(q, 2 * MiB, SEED ^ 1u);
  assert_int_equal(stamp_mismatch(p, 2 * MiB, SEED ^ 1u), -1);
  assert_ok(gca_ipc_close(q));
  assert_status(gca_ipc_close(q), GCA_ERR_INVALID_POINTER, "ipc_close");
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void fabric_export_fault_reaches_the_caller_and_leaks_nothing(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  void *p = alloc_on(30 * MiB, NULL);
  int before = test_fd_count();
  for (int nth = 1; nth <= 2; nth++) {
    char spec[64];
    snprintf(spec, sizeof(spec), "mem_export_fabric:nth=%d", nth);
    assert_ok(gca_sim_fault_set(spec));
    gca_ipc_handle_t *h = NULL;
    assert_status(gca_ipc_export_ex(p, GCA_IPC_FABRIC, &h), GCA_ERR_DRIVER,
                  "mem_export_fabric: injected fault");
    assert_non_null(strstr(gca_last_error(), "ipc_export"));
    assert_null(h);
    gca_sim_fault_clear();
    assert_int_equal(test_fd_count(), before + (nth - 1)); /* only the wrapper's slots */
  }
  check();
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void fabric_import_faults_leave_nothing_behind(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  void *p = alloc_on(30 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export_ex(p, GCA_IPC_FABRIC, &h));
  int before = test_fd_count();
  for (int nth = 1; nth <= 2; nth++) {
    char spec[64];
    snprintf(spec, sizeof(spec), "mem_import_fabric:nth=%d", nth);
    gca_sim_counters_reset();
    assert_ok(gca_sim_fault_set(spec));
    void *q = NULL;
    assert_status(gca_ipc_open(h, 0, &q), GCA_ERR_DRIVER, "mem_import_fabric: injected fault");
    assert_non_null(strstr(gca_last_error(), "ipc_open"));
    assert_null(q);
    gca_sim_fault_clear();
    assert_int_equal(gca_sim_call_count("mem_release"), nth - 1);
    assert_int_equal(gca_sim_call_count("mem_address_reserve"), 0);
    assert_int_equal(test_fd_count(), before);
  }
  void *q = NULL;
  assert_ok(gca_ipc_open(h, 0, &q));
  assert_ok(gca_ipc_close(q));
  gca_ipc_handle_free(h);
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void fabric_handle_of_another_kind_of_device_is_refused_at_open(void **state) {
  (void)state;
  void *p = alloc_on(3 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export_ex(p, GCA_IPC_FABRIC, &h));
  /* the importer's device lacks fabric support: refused before the driver */
  gca__device_override(fab.sim);
  gca_sim_counters_reset();
  void *q = NULL;
  assert_status(gca_ipc_open(h, 0, &q), GCA_ERR_NOT_SUPPORTED,
                "ipc_open: device 0 does not support fabric handles");
  assert_int_equal(gca_sim_call_count("mem_import_fabric"), 0);
  gca__device_override(&fab.ops);
  assert_null(q);
  gca_ipc_handle_free(h);
  free_ok(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(sim_fabric_ops_refuse_naming_the_op, sim_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(fabric_op_faults_reach_the_caller_by_name, sim_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(fabric_export_on_sim_is_not_supported_and_leaks_nothing,
                                      sim_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(unknown_export_flags_are_invalid, sim_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(hand_written_fabric_message_is_received, sim_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(malformed_fabric_messages_are_parse_errors_and_leak_no_fd,
                                      sim_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(fabric_open_on_sim_is_not_supported_and_touches_nothing,
                                      sim_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(fabric_handles_round_trip_through_a_socketpair, fab_exp_setup,
                                      fab_teardown),
      cmocka_unit_test_setup_teardown(fabric_export_fault_reaches_the_caller_and_leaks_nothing,
                                      fab_exp_setup, fab_teardown),
      cmocka_unit_test_setup_teardown(fabric_import_faults_leave_nothing_behind, fab_exp_setup,
                                      fab_teardown),
      cmocka_unit_test_setup_teardown(fabric_handle_of_another_kind_of_device_is_refused_at_open,
                                      fab_setup, fab_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
