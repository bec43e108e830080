/* SPDX-License-Identifier: Apache-2.0 */
/* test_ipc.c - sharing blocks between processes (gca/ipc.h) on the sim
 * backend: a real second process (this binary exec'd again with --child, so
 * it shares nothing with the parent but the socket) maps a block of a
 * VMM-backed classic segment (ipc_handles:True) or of an expandable segment,
 * both sides see each other's writes, and each side's handles go when it lets
 * go while the memory lives on in the other. Also: VMM-backed classic
 * segments as segments, the refusal to export cuMemAlloc memory, malformed
 * messages (GCA_ERR_PARSE with no descriptor leaked), injected faults during
 * export and import, and closing twice or a foreign pointer. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "alloc_fixture.h"

#define SEED_A 0x5eed0001u
#define SEED_B 0xb0b00002u

static void put_byte(int fd, char c) {
  assert_int_equal(write(fd, &c, 1), 1);
}

static char get_byte(int fd) {
  char c = 0;
  ssize_t r;
  do {
    r = read(fd, &c, 1);
  } while (r < 0 && errno == EINTR);
  return r == 1 ? c : 0;
}

/* ---- the child process ---- */

#define CHILD_FAIL(...)                           \
  do {                                            \
    fprintf(stderr, "child: " __VA_ARGS__);       \
    fprintf(stderr, " (%s)\n", gca_last_error()); \
    return 2;                                     \
  } while (0)

/* Importer: maps what arrives, checks A, writes B, says 'R'; on 'X' (the
 * exporter let go) checks B is still there, closes, checks its releases. */
static int child_import(int sock) {
  gca_ipc_handle_t *h = NULL;
  void *p = NULL;
  size_t size = 0, n = 0;
  if (gca_ipc_recv(sock, &h) != GCA_OK)
    CHILD_FAIL("recv failed");
  if (gca_ipc_handle_info(h, NULL, &size, &n, NULL) != GCA_OK)
    CHILD_FAIL("handle_info failed");
  if (gca_ipc_open(h, 0, &p) != GCA_OK)
    CHILD_FAIL("open failed");
  gca_ipc_handle_free(h);
  if (stamp_mismatch(p, size, SEED_A) >= 0)
    CHILD_FAIL("the exporter's pattern differs at word %ld", stamp_mismatch(p, size, SEED_A));
  stamp_fill(p, size, SEED_B);
  put_byte(sock, 'R');
  if (get_byte(sock) != 'X')
    CHILD_FAIL("no 'X' from the exporter");
  if (stamp_mismatch(p, size, SEED_B) >= 0)
    CHILD_FAIL("the memory changed after the exporter let go");
  int64_t before = gca_sim_call_count("mem_release");
  if (gca_ipc_close(p) != GCA_OK)
    CHILD_FAIL("close failed");
  if (gca_sim_call_count("mem_release") - before != (int64_t)n)
    CHILD_FAIL("close released %" PRId64 " handles, expected %zu",
               gca_sim_call_count("mem_release") - before, n);
  if (gca_ipc_close(p) != GCA_ERR_INVALID_POINTER)
    CHILD_FAIL("a second close was accepted");
  put_byte(sock, 'D');
  return 0;
}

/* Exporter: allocates `size` bytes (after `first` bytes) under `conf`, writes
 * A, sends the block; on 'R' checks B, frees everything, empties the cache,
 * checks its memory and handles are gone and says 'F'. */
static int child_export(int sock, const char *conf, size_t first, size_t size) {
  void *keep = NULL, *p = NULL;
  gca_ipc_handle_t *h = NULL;
  if (gca_set_config(conf) != GCA_OK)
    CHILD_FAIL("set_config '%s' failed", conf);
  if ((first && gca_malloc(&keep, first, NULL) != GCA_OK) || gca_malloc(&p, size, NULL) != GCA_OK)
    CHILD_FAIL("malloc failed");
  stamp_fill(p, size, SEED_A);
  if (gca_ipc_export(p, &h) != GCA_OK)
    CHILD_FAIL("export failed");
  if (gca_ipc_send(sock, h) != GCA_OK)
    CHILD_FAIL("send failed");
  gca_ipc_handle_free(h);
  if (get_byte(sock) != 'R')
    CHILD_FAIL("no 'R' from the importer");
  if (stamp_mismatch(p, size, SEED_B) >= 0)
    CHILD_FAIL("the importer's reply differs at word %ld", stamp_mismatch(p, size, SEED_B));
  if (gca_free(p) != GCA_OK || gca_free(keep) != GCA_OK || gca_empty_cache() != GCA_OK)
    CHILD_FAIL("free failed");
  if (gca_sim_used_bytes(0) != 0)
    CHILD_FAIL("%" PRIu64 " bytes still used after the cache was emptied", gca_sim_used_bytes(0));
  if (gca_sim_call_count("mem_release") != gca_sim_call_count("mem_create"))
    CHILD_FAIL("handles left: %" PRId64 " created, %" PRId64 " released",
               gca_sim_call_count("mem_create"), gca_sim_call_count("mem_release"));
  put_byte(sock, 'F');
  return 0;
}

static int child_main(int argc, char **argv) {
  if (argc < 4)
    return 3;
  (void)test_backend();
  int sock = atoi(argv[3]);
  if (strcmp(argv[2], "import") == 0)
    return child_import(sock);
  if (strcmp(argv[2], "export") == 0 && argc == 7)
    return child_export(sock, argv[4], strtoull(argv[5], NULL, 0), strtoull(argv[6], NULL, 0));
  return 3;
}

/* Starts this binary as a child of the given role on one end of a new
 * socketpair; returns the parent's end. */
static int spawn(pid_t *pid, const char *role, const char *conf, size_t first, size_t size) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  *pid = fork();
  assert_true(*pid >= 0);
  if (*pid == 0) {
    char fdbuf[16], firstbuf[32], sizebuf[32];
    fcntl(sv[1], F_SETFD, 0);
    snprintf(fdbuf, sizeof(fdbuf), "%d", sv[1]);
    snprintf(firstbuf, sizeof(firstbuf), "%zu", first);
    snprintf(sizebuf, sizeof(sizebuf), "%zu", size);
    char *argv[] = {"test_ipc",   "--child", (char *)role, fdbuf,
                    (char *)conf, firstbuf,  sizebuf,      NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(sv[1]);
  return sv[0];
}

static void reap(pid_t pid) {
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- fixtures ---- */

static int ipc_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("ipc_handles:True"));
  return 0;
}

static int exp_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("expandable_segments:True"));
  return 0;
}

/* ---- two processes ---- */

/* The parent exports a `size`-byte block (after `first` bytes) to a child. */
static void export_to_child(size_t first, size_t size, size_t want_handles) {
  void *keep = first ? alloc_on(first, NULL) : NULL;
  void *p = alloc_on(size, NULL);
  stamp_fill(p, size, SEED_A);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  size_t bsize = 0, n = 0;
  int dev = -1;
  assert_ok(gca_ipc_handle_info(h, &dev, &bsize, &n, NULL));
  assert_int_equal(dev, 0);
  assert_int_equal(bsize, block_size_of(p));
  assert_int_equal(n, want_handles);

  pid_t pid;
  int sock = spawn(&pid, "import", "", 0, 0);
  assert_ok(gca_ipc_send(sock, h));
  gca_ipc_handle_free(h);
  assert_int_equal(get_byte(sock), 'R');
  assert_int_equal(stamp_mismatch(p, size, SEED_B), -1);

  /* the exporter lets go first: its handles are released, its device memory
   * is accounted free, and the child still has the memory */
  free_ok(p);
  if (keep)
    free_ok(keep);
  int64_t created = gca_sim_call_count("mem_create");
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_int_equal(gca_sim_call_count("mem_release"), created);
  put_byte(sock, 'X');
  assert_int_equal(get_byte(sock), 'D');
  close(sock);
  reap(pid);
}

static void classic_vmm_block_is_shared_with_a_child_process(void **state) {
  (void)state;
  export_to_child(0, 3 * MiB, 1);
}

static void expandable_block_over_two_mappings_is_shared_with_a_child_process(void **state) {
  (void)state;
  /* 3 MiB maps two 2 MiB granules; 30 MiB more takes the 1 MiB left and 15
   * granules more: one handle each (Note [Expandable segments]) */
  export_to_child(3 * MiB, 30 * MiB, 16);
}

/* The parent imports from a child that exits after letting go. */
static void import_from_child(const char *conf, size_t first, size_t size, size_t want_handles) {
  int fds_before = test_fd_count();
  pid_t pid;
  int sock = spawn(&pid, "export", conf, first, size);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_recv(sock, &h));
  size_t n = 0, bsize = 0;
  uint8_t id[16], zero[16] = {0};
  assert_ok(gca_ipc_handle_info(h, NULL, &bsize, &n, id));
  assert_int_equal(n, want_handles);
  assert_true(memcmp(id, zero, sizeof(id)) != 0);
  void *p = NULL;
  assert_ok(gca_ipc_open(h, 0, &p));
  gca_ipc_handle_free(h);
  assert_int_equal(stamp_mismatch(p, bsize, SEED_A), -1);
  assert_int_equal(gca_sim_used_bytes(0), 0); /* imported memory is the exporter's */
  stamp_fill(p, bsize, SEED_B);
  put_byte(sock, 'R');
  assert_int_equal(get_byte(sock), 'F');
  close(sock);
  reap(pid);
  /* the exporter freed everything and exited; the memory lives here */
  assert_int_equal(stamp_mismatch(p, bsize, SEED_B), -1);
  int64_t released = gca_sim_call_count("mem_release");
  assert_ok(gca_ipc_close(p));
  assert_int_equal(gca_sim_call_count("mem_release") - released, (int64_t)n);
  assert_int_equal(gca_sim_call_count("mem_address_reserve"),
                   gca_sim_call_count("mem_address_free"));
  assert_int_equal(test_fd_count(), fds_before);
  assert_status(gca_ipc_close(p), GCA_ERR_INVALID_POINTER, "already closed");
}

static void classic_vmm_block_is_imported_from_a_child_that_exits(void **state) {
  (void)state;
  import_from_child("ipc_handles:True", 0, 5 * MiB, 1);
}

static void expandable_block_is_imported_from_a_child_that_exits(void **state) {
  (void)state;
  import_from_child("expandable_segments:True", 3 * MiB, 30 * MiB, 16); /* granule handles */
}

/* ---- VMM-backed classic segments ---- */

static void ipc_handles_key_is_parsed_validated_and_formatted(void **state) {
  (void)state;
  char buf[1024];
  assert_ok(gca_get_config(buf, sizeof(buf)));
  assert_non_null(strstr(buf, "ipc_handles:True"));
  assert_status(gca_set_config("ipc_handles:maybe"), GCA_ERR_CONFIG, "'maybe'");
  gca_alloc_config_t c;
  gca__config_defaults(&c);
  assert_false(c.ipc_handles);
  assert_ok(gca__config_format(&c, buf, sizeof(buf)));
  assert_non_null(strstr(buf, "ipc_handles:False")); /* restores the default when parsed */
  assert_ok(gca__config_parse("ipc_handles:True", &c));
  assert_true(c.ipc_handles);
  assert_ok(gca__config_format(&c, buf, sizeof(buf)));
  gca_alloc_config_t back;
  gca__config_defaults(&back);
  assert_ok(gca__config_parse(buf, &back));
  assert_true(back.ipc_handles);
  assert_status(gca__config_parse("ipc_handle:True", &c), GCA_ERR_CONFIG, "ipc_handles");
}

static void ipc_handles_segments_behave_as_classic_segments(void **state) {
  (void)state;
  void *a = alloc_on(3 * MiB, NULL);
  void *b = alloc_on(4 * MiB, NULL); /* same 20 MiB segment: no growth, no driver call */
  assert_int_equal(gca_sim_call_count("mem_alloc"), 0);
  assert_int_equal(gca_sim_call_count("mem_create"), 1);
  assert_int_equal(gca_sim_call_count("mem_map"), 1);
  gca_stats_t s = stats();
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 20 * MiB);
  assert_int_equal(layout().nsegs, 1);
  void *c = alloc_on(100 * KiB, NULL); /* small pool: its own 2 MiB segment */
  assert_int_equal(gca_sim_call_count("mem_create"), 2);
  assert_int_equal(gca_sim_used_bytes(0), 22 * MiB);
  free_ok(a);
  free_ok(b);
  free_ok(c);
  assert_ok(gca_empty_cache());
  s = stats();
  assert_int_equal(s.num_device_free, 2);
  assert_int_equal(gca_sim_call_count("mem_release"), 2);
  assert_int_equal(gca_sim_call_count("mem_unmap"), 2);
  assert_int_equal(gca_sim_call_count("mem_address_free"), 2);
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void ipc_handles_segment_faults_leave_nothing_behind(void **state) {
  (void)state;
  static const char *const fail_ops[] = {"mem_create", "mem_address_reserve", "mem_map",
                                         "mem_set_access"};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(fail_ops); i++) {
    const char *op = fail_ops[i];
    char spec[64];
    snprintf(spec, sizeof(spec), "%s:always", op);
    gca_sim_counters_reset();
    assert_ok(gca_sim_fault_set(spec));
    void *p = NULL;
    gca_clear_last_error();
    gca_status_t st = gca_malloc(&p, 3 * MiB, NULL);
    gca_sim_fault_clear();
    assert_int_not_equal(st, GCA_OK);
    assert_null(p);
    if (st != GCA_ERR_OUT_OF_MEMORY) /* an OOM detail describes the request instead */
      assert_non_null(strstr(gca_last_error(), op));
    check();
    /* what succeeded was undone: created - failed == released, and so on */
    int64_t created = strcmp(op, "mem_create") == 0 ? 0 : gca_sim_call_count("mem_create");
    int64_t reserved =
        strcmp(op, "mem_address_reserve") == 0 ? 0 : gca_sim_call_count("mem_address_reserve");
    int64_t mapped = strcmp(op, "mem_map") == 0 ? 0 : gca_sim_call_count("mem_map");
    assert_int_equal(gca_sim_call_count("mem_release"), created);
    assert_int_equal(gca_sim_call_count("mem_address_free"), reserved);
    assert_int_equal(gca_sim_call_count("mem_unmap"), mapped);
    assert_int_equal(gca_sim_used_bytes(0), 0);
    assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
    assert_int_equal(layout().nsegs, 0);
  }
  void *p = alloc_on(3 * MiB, NULL);
  free_ok(p);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void teardown_releases_vmm_segments(void **state) {
  (void)state;
  (void)alloc_on(3 * MiB, NULL); /* left live: the reset must release it */
  gca__allocator_reset();
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_int_equal(gca_sim_call_count("mem_release"), 1);
  assert_int_equal(gca_sim_call_count("mem_address_free"), 1);
}

/* ---- refusals ---- */

static void export_of_mem_alloc_segment_is_not_supported(void **state) {
  (void)state;
  void *p = alloc_on(3 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_status(gca_ipc_export(p, &h), GCA_ERR_NOT_SUPPORTED, "ipc_handles:True");
  assert_status(gca_ipc_export(p, &h), GCA_ERR_NOT_SUPPORTED, "expandable_segments:True");
  assert_null(h);
  assert_int_equal(gca_sim_call_count("mem_export_fd"), 0);
  free_ok(p);
}

static void export_of_a_pointer_that_is_no_block_start_fails(void **state) {
  (void)state;
  char *p = alloc_on(3 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_status(gca_ipc_export(p + 512, &h), GCA_ERR_INVALID_POINTER, "ipc_export");
  free_ok(p);
  assert_status(gca_ipc_export(p, &h), GCA_ERR_INVALID_POINTER, "not the start of a live");
  int local = 0;
  assert_status(gca_ipc_export(&local, &h), GCA_ERR_INVALID_POINTER, "ipc_export");
  assert_status(gca_ipc_export(NULL, &h), GCA_ERR_INVALID_ARGUMENT, "ipc_export");
  assert_null(h);
}

static void closing_twice_or_a_foreign_pointer_is_invalid(void **state) {
  (void)state;
  void *p = alloc_on(3 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  void *q = NULL;
  assert_ok(gca_ipc_open(h, 0, &q));
  assert_true(q != p); /* a mapping of its own */
  assert_status(gca_ipc_close(p), GCA_ERR_INVALID_POINTER, "not an open IPC mapping");
  assert_status(gca_ipc_close((char *)q + 4096), GCA_ERR_INVALID_POINTER, "ipc_close");
  assert_status(gca_ipc_close(NULL), GCA_ERR_INVALID_POINTER, "ipc_close");
  int64_t released = gca_sim_call_count("mem_release");
  assert_ok(gca_ipc_close(q));
  assert_int_equal(gca_sim_call_count("mem_release") - released, 1);
  assert_status(gca_ipc_close(q), GCA_ERR_INVALID_POINTER, "already closed");
  gca_ipc_handle_free(h);
  free_ok(p);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

/* ---- malformed messages ---- */

/* Reads exactly len bytes and any descriptors that come with them. */
static void raw_recv(int sock, uint8_t *buf, size_t len, int *fds, int *nfds) {
  size_t done = 0;
  *nfds = 0;
  while (done < len) {
    union {
      char b[CMSG_SPACE(sizeof(int) * 8)];
      struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf + done, .iov_len = len - done};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl)};
    ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    assert_true(r > 0);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      memcpy(fds + *nfds, CMSG_DATA(c), sizeof(int) * (size_t)k);
      *nfds += k;
    }
    done += (size_t)r;
  }
}

static void raw_send(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds) {
  union {
    char b[CMSG_SPACE(sizeof(int) * 8)];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof(ctl));
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
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

/* A valid one-handle message, as gca_ipc_send writes it, with its fd. */
typedef struct wire {
  uint8_t pre[16];
  uint8_t body[64];
  int fd;
} wire_t;

static wire_t valid_wire(void *p) {
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  assert_ok(gca_ipc_send(sv[0], h));
  gca_ipc_handle_free(h);
  wire_t w;
  int fds[8], n = 0;
  raw_recv(sv[1], w.pre, sizeof(w.pre), fds, &n);
  assert_int_equal(n, 0);
  raw_recv(sv[1], w.body, sizeof(w.body), fds, &n);
  assert_int_equal(n, 1);
  w.fd = fds[0];
  close(sv[0]);
  close(sv[1]);
  uint32_t magic;
  memcpy(&magic, w.pre, 4);
  assert_int_equal(magic, GCA_IPC_MAGIC);
  return w;
}

static void set_u32(uint8_t *p, uint32_t v) {
  memcpy(p, &v, 4);
}
static void set_u64(uint8_t *p, uint64_t v) {
  memcpy(p, &v, 8);
}

/* Sends pre + body[0..body_len) with nfds copies of w's fd attached to the
 * body (or to the preamble), closes the writing end and expects recv to
 * refuse with GCA_ERR_PARSE mentioning `needle`, leaking no descriptor. */
static void expect_refused(const wire_t *w, const uint8_t *pre, const uint8_t *body,
                           size_t body_len, int nfds, bool fds_on_preamble, const char *needle) {
  int before = test_fd_count();
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  int fds[8];
  for (int i = 0; i < nfds; i++)
    fds[i] = w->fd;
  raw_send(sv[0], pre, 16, fds, fds_on_preamble ? nfds : 0);
  if (body_len > 0)
    raw_send(sv[0], body, body_len, fds, fds_on_preamble ? 0 : nfds);
  shutdown(sv[0], SHUT_WR);
  gca_ipc_handle_t *h = NULL;
  assert_status(gca_ipc_recv(sv[1], &h), GCA_ERR_PARSE, needle);
  assert_null(h);
  close(sv[0]);
  close(sv[1]);
  assert_int_equal(test_fd_count(), before);
}

static void malformed_messages_are_parse_errors_and_leak_no_fd(void **state) {
  (void)state;
  void *p = alloc_on(3 * MiB, NULL);
  wire_t w = valid_wire(p);
  int before = test_fd_count();
  uint8_t pre[16], body[64];

  /* the untouched message is accepted (the fixture is sound) */
  {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    raw_send(sv[0], w.pre, 16, NULL, 0);
    raw_send(sv[0], w.body, 64, &w.fd, 1);
    gca_ipc_handle_t *h = NULL;
    assert_ok(gca_ipc_recv(sv[1], &h));
    gca_ipc_handle_free(h);
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(test_fd_count(), before);
  }
  /* truncated: half the body, then the writer closes */
  expect_refused(&w, w.pre, w.body, 20, 1, false, "truncated");
  expect_refused(&w, w.pre, w.body, 0, 0, false, "truncated");
  /* wrong magic, wrong version */
  memcpy(pre, w.pre, 16);
  set_u32(pre, 0x12345678u);
  expect_refused(&w, pre, w.body, 64, 1, false, "magic");
  memcpy(pre, w.pre, 16);
  pre[4] = 9;
  expect_refused(&w, pre, w.body, 64, 1, false, "version");
  /* fd count mismatch: none, two, or with the preamble */
  expect_refused(&w, w.pre, w.body, 64, 0, false, "descriptors announced");
  expect_refused(&w, w.pre, w.body, 64, 2, false, "descriptors announced");
  expect_refused(&w, w.pre, w.body, 64, 1, true, "preamble");
  /* an absurd count, a length that does not match it, a body that disagrees */
  memcpy(pre, w.pre, 16);
  set_u32(pre + 12, 1000000);
  expect_refused(&w, pre, w.body, 64, 1, false, "descriptors");
  memcpy(pre, w.pre, 16);
  set_u32(pre + 8, 65);
  expect_refused(&w, pre, w.body, 64, 1, false, "body");
  memcpy(body, w.body, 64);
  set_u32(body + 20, 2);
  expect_refused(&w, w.pre, body, 64, 1, false, "handles");
  /* absurd sizes and layouts */
  memcpy(body, w.body, 64);
  set_u64(body + 24, (uint64_t)1 << 60); /* block size */
  expect_refused(&w, w.pre, body, 64, 1, false, "absurd");
  memcpy(body, w.body, 64);
  set_u64(body + 24, 0);
  expect_refused(&w, w.pre, body, 64, 1, false, "absurd");
  memcpy(body, w.body, 64);
  set_u64(body + 32 + 16, 40 * MiB); /* map_size beyond the handle */
  expect_refused(&w, w.pre, body, 64, 1, false, "do not fit");
  memcpy(body, w.body, 64);
  uint64_t whole;
  memcpy(&whole, body + 32 + 16, 8);
  set_u64(body + 32, whole + 2 * MiB); /* part of a handle: cuMemMap maps one whole */
  expect_refused(&w, w.pre, body, 64, 1, false, "only a whole handle");
  memcpy(body, w.body, 64);
  set_u64(body + 32 + 8, UINT64_MAX - MiB); /* handle_offset wraps */
  expect_refused(&w, w.pre, body, 64, 1, false, "only offset 0");
  memcpy(body, w.body, 64);
  set_u64(body + 32 + 8, 2 * MiB); /* a granule-aligned offset: cuMemMap takes none */
  expect_refused(&w, w.pre, body, 64, 1, false, "mapped from offset 2097152");
  memcpy(body, w.body, 64);
  set_u64(body + 32 + 24, 4 * MiB); /* mapping starts after the block's start */
  expect_refused(&w, w.pre, body, 64, 1, false, "cover");
  memcpy(body, w.body, 64);
  set_u32(body + 16, (uint32_t)-5); /* device */
  expect_refused(&w, w.pre, body, 64, 1, false, "device");

  close(w.fd);
  free_ok(p);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void send_to_a_closed_peer_is_an_io_error(void **state) {
  (void)state;
  void *p = alloc_on(3 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  close(sv[1]);
  assert_status(gca_ipc_send(sv[0], h), GCA_ERR_IO, "ipc_send");
  close(sv[0]);
  gca_ipc_handle_free(h);
  free_ok(p);
}

/* ---- faults ---- */

static void export_fault_closes_the_fds_already_exported(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  void *p = alloc_on(30 * MiB, NULL); /* two mappings */
  int before = test_fd_count();
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_sim_fault_set("mem_export_fd:nth=2"));
  assert_status(gca_ipc_export(p, &h), GCA_ERR_DRIVER, "mem_export_fd");
  assert_null(h);
  assert_int_equal(test_fd_count(), before);
  check();
  assert_ok(gca_ipc_export(p, &h)); /* the block is intact and exportable */
  gca_ipc_handle_free(h);
  assert_int_equal(test_fd_count(), before);
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void import_faults_leave_nothing_behind(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  void *p = alloc_on(30 * MiB, NULL); /* two mappings: faults land between them */
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  int before = test_fd_count();
  static const struct {
    const char *spec, *op;
    gca_status_t st;
  } faults[] = {
      {"mem_import_fd:nth=1", "mem_import_fd", GCA_ERR_DRIVER},
      {"mem_import_fd:nth=2", "mem_import_fd", GCA_ERR_DRIVER},
      {"mem_address_reserve:nth=1", "mem_address_reserve", GCA_ERR_OUT_OF_MEMORY},
      {"mem_map:nth=1", "mem_map", GCA_ERR_DRIVER},
      {"mem_map:nth=2", "mem_map", GCA_ERR_DRIVER},
      {"mem_set_access:nth=1", "mem_set_access", GCA_ERR_DRIVER},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(faults); i++) {
    gca_sim_counters_reset();
    assert_ok(gca_sim_fault_set(faults[i].spec));
    void *q = NULL;
    assert_status(gca_ipc_open(h, 0, &q), faults[i].st, faults[i].op);
    assert_non_null(strstr(gca_last_error(), "ipc_open"));
    assert_null(q);
    gca_sim_fault_clear();
    /* every handle imported was released, every range reserved freed */
    int64_t imported =
        gca_sim_call_count("mem_import_fd") - (strcmp(faults[i].op, "mem_import_fd") == 0);
    int64_t reserved = gca_sim_call_count("mem_address_reserve") -
                       (strcmp(faults[i].op, "mem_address_reserve") == 0);
    int64_t mapped = gca_sim_call_count("mem_map") - (strcmp(faults[i].op, "mem_map") == 0);
    assert_int_equal(gca_sim_call_count("mem_release"), imported);
    assert_int_equal(gca_sim_call_count("mem_address_free"), reserved);
    assert_int_equal(gca_sim_call_count("mem_unmap"), mapped > 0 ? 1 : 0);
    assert_int_equal(test_fd_count(), before);
  }
  /* and a later open works */
  void *q = NULL;
  assert_ok(gca_ipc_open(h, 0, &q));
  assert_ok(gca_ipc_close(q));
  gca_ipc_handle_free(h);
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0); /* no import kept the memory referenced */
}

static void close_fault_keeps_the_mapping_open_for_a_retry(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  char *p = alloc_on(30 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  char *q = NULL;
  assert_ok(gca_ipc_open(h, 0, (void **)&q));
  gca_ipc_handle_free(h);
  int64_t released = gca_sim_call_count("mem_release"),
          freed = gca_sim_call_count("mem_address_free");
  assert_ok(gca_sim_fault_set("mem_unmap:nth=1"));
  assert_status(gca_ipc_close(q), GCA_ERR_DRIVER, "ipc_close");
  gca_sim_fault_clear();
  assert_int_equal(gca_sim_call_count("mem_release"), released);
  assert_int_equal(gca_sim_call_count("mem_address_free"), freed);
  stamp_fill(p, 30 * MiB, SEED_B);
  assert_int_equal(stamp_mismatch(q, 30 * MiB, SEED_B), -1); /* still mapped */
  assert_ok(gca_ipc_close(q));
  assert_int_equal(gca_sim_call_count("mem_release") - released, 16); /* one per granule */
  assert_int_equal(gca_sim_call_count("mem_address_free") - freed, 1);
  assert_status(gca_ipc_close(q), GCA_ERR_INVALID_POINTER, "already closed");
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

/* Note [Half-closed imports]: when the unmap worked but a handle or the range
 * did not go back, the close fails saying so and a second close releases
 * what is left; nothing leaks and the pointer is then closed. */
static void release_fault_in_close_is_retried_by_the_next_close(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  char *p = alloc_on(30 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  char *q = NULL;
  assert_ok(gca_ipc_open(h, 0, (void **)&q));
  gca_ipc_handle_free(h);
  int64_t released = gca_sim_call_count("mem_release"),
          freed = gca_sim_call_count("mem_address_free"),
          unmapped = gca_sim_call_count("mem_unmap");
  assert_ok(gca_sim_fault_set("mem_release:nth=1,mem_address_free:nth=1"));
  assert_status(gca_ipc_close(q), GCA_ERR_DRIVER, "call gca_ipc_close again");
  gca_sim_fault_clear();
  assert_ok(gca_ipc_close(q));
  /* unmapped once; each handle and the range released exactly once in the end */
  assert_int_equal(gca_sim_call_count("mem_unmap") - unmapped, 1);
  assert_int_equal(gca_sim_call_count("mem_release") - released, 16 + 1); /* 16 granules */
  assert_int_equal(gca_sim_call_count("mem_address_free") - freed, 1 + 1);
  assert_status(gca_ipc_close(q), GCA_ERR_INVALID_POINTER, "already closed");
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void open_in_the_same_process_aliases_the_block(void **state) {
  (void)state;
  void *keep = alloc_on(3 * MiB, NULL);
  char *p = alloc_on(30 * MiB, NULL);
  gca_ipc_handle_t *h = NULL;
  assert_ok(gca_ipc_export(p, &h));
  char *q = NULL;
  assert_ok(gca_ipc_open(h, 0, (void **)&q));
  gca_ipc_handle_free(h);
  stamp_fill(p, 30 * MiB, SEED_A);
  assert_int_equal(stamp_mismatch(q, 30 * MiB, SEED_A), -1);
  q[30 * MiB - 1] = 0x7f;
  assert_int_equal(p[30 * MiB - 1], 0x7f);
  assert_ok(gca_ipc_close(q));
  free_ok(p);
  free_ok(keep);
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "--child") == 0)
    return child_main(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(classic_vmm_block_is_shared_with_a_child_process, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(
          expandable_block_over_two_mappings_is_shared_with_a_child_process, exp_setup,
          alloc_teardown),
      cmocka_unit_test_setup_teardown(classic_vmm_block_is_imported_from_a_child_that_exits,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(expandable_block_is_imported_from_a_child_that_exits,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(ipc_handles_key_is_parsed_validated_and_formatted, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(ipc_handles_segments_behave_as_classic_segments, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(ipc_handles_segment_faults_leave_nothing_behind, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(teardown_releases_vmm_segments, ipc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(export_of_mem_alloc_segment_is_not_supported, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(export_of_a_pointer_that_is_no_block_start_fails, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(closing_twice_or_a_foreign_pointer_is_invalid, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(malformed_messages_are_parse_errors_and_leak_no_fd, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(send_to_a_closed_peer_is_an_io_error, ipc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(export_fault_closes_the_fds_already_exported, exp_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(import_faults_leave_nothing_behind, exp_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(close_fault_keeps_the_mapping_open_for_a_retry, exp_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(release_fault_in_close_is_retried_by_the_next_close,
                                      exp_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(open_in_the_same_process_aliases_the_block, exp_setup,
                                      alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
