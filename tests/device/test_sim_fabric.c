/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_fabric.c - the sim's fabric handles (Note [Sim fabric handles]):
 * off unless GCA_SIM_FABRIC=1 asks for them, as on a GPU outside an NVLink
 * fabric; when on, a handle names the allocation so that an import in the
 * same process shares its memory and an import in another process maps the
 * same pages; forged and stale handles are refused with a message and map
 * nothing.
 *
 * The setting is read once per process, so every case runs in forked children
 * of a parent that never touches the sim (child.h); the cross-process case
 * forks an exporter and an importer that pass the 64 bytes through a pipe. */
#include <fcntl.h>

#include "child.h"

#define GRAN  ((size_t)2 << 20)
#define WORDS 1024

static const char *const fabric_on[] = {"GCA_DEVICE", "sim", "GCA_SIM_FABRIC", "1", NULL};

/* One granule of memory mapped at *va, readable and writable by device 0. */
static gca_status_t map_granule(const gca_device_ops_t *ops, gca_memhandle_t h, gca_devptr_t *va) {
  GCA_CHECK(ops->mem_address_reserve(0, GRAN, 0, va));
  gca_status_t st = ops->mem_map(*va, GRAN, 0, h);
  if (st == GCA_OK) {
    int dev = 0;
    st = ops->mem_set_access(*va, GRAN, &dev, 1);
    if (st != GCA_OK)
      GCA_CHECK_IGNORE(ops->mem_unmap(*va, GRAN));
  }
  if (st != GCA_OK)
    GCA_CHECK_IGNORE(ops->mem_address_free(0, *va, GRAN));
  return st;
}

static void unmap_granule(const gca_device_ops_t *ops, gca_devptr_t va) {
  GCA_CHECK_IGNORE(ops->mem_unmap(va, GRAN));
  GCA_CHECK_IGNORE(ops->mem_address_free(0, va, GRAN));
}

static int child_off_by_default(report_t *r) {
  const gca_device_ops_t *ops = gca__sim_ops();
  EXPECT_OK(r, ops->init());
  int v = -1;
  EXPECT_OK(r, ops->device_attr(0, GCA_ATTR_FABRIC_SUPPORTED, &v));
  if (v != 0)
    return failf(r, "GCA_ATTR_FABRIC_SUPPORTED is %d without GCA_SIM_FABRIC", v);
  gca_memhandle_t h = 0, imp = 0;
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN] = {0};
  EXPECT_OK(r, ops->mem_create(0, GRAN, &h));
  EXPECT(r, ops->mem_export_fabric(h, bytes), GCA_ERR_NOT_SUPPORTED, "GCA_SIM_FABRIC=1");
  EXPECT(r, ops->mem_import_fabric(0, bytes, &imp), GCA_ERR_NOT_SUPPORTED, "GCA_SIM_FABRIC=1");
  EXPECT_OK(r, ops->mem_release(h));
  return CHILD_PASS;
}

static void fabric_handles_are_off_unless_asked(void **state) {
  (void)state;
  const char *env[] = {"GCA_DEVICE", "sim", "GCA_SIM_FABRIC", NULL, NULL};
  run_child(env, child_off_by_default, NULL, 0);
}

static int child_in_process(report_t *r) {
  const gca_device_ops_t *ops = gca__sim_ops();
  EXPECT_OK(r, ops->init());
  int v = 0;
  EXPECT_OK(r, ops->device_attr(0, GCA_ATTR_FABRIC_SUPPORTED, &v));
  if (v != 1)
    return failf(r, "GCA_ATTR_FABRIC_SUPPORTED is %d with GCA_SIM_FABRIC=1", v);
  uint64_t used0 = gca_sim_used_bytes(0);
  gca_memhandle_t h = 0, imp = 0;
  gca_devptr_t a = 0, b = 0;
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  EXPECT_OK(r, ops->mem_create(0, GRAN, &h));
  EXPECT_OK(r, map_granule(ops, h, &a));
  uint32_t *pa = (uint32_t *)(uintptr_t)a;
  for (uint32_t i = 0; i < WORDS; i++)
    pa[i] = 0xfab00000u + i;
  EXPECT_OK(r, ops->mem_export_fabric(h, bytes));
  EXPECT_OK(r, ops->mem_import_fabric(0, bytes, &imp));
  EXPECT_OK(r, map_granule(ops, imp, &b));
  const uint32_t *pb = (const uint32_t *)(uintptr_t)b;
  for (uint32_t i = 0; i < WORDS; i++)
    if (pb[i] != 0xfab00000u + i)
      return failf(r, "word %u through the import is 0x%08x", i, pb[i]);
  pa[7] = 0x1234;
  if (pb[7] != 0x1234)
    return failf(r, "a write through the exporter's mapping is not seen through the import");
  if (gca_sim_used_bytes(0) != used0 + GRAN)
    return failf(r, "the import was charged again: %llu bytes in use, wanted %llu",
                 (unsigned long long)gca_sim_used_bytes(0), (unsigned long long)(used0 + GRAN));
  unmap_granule(ops, b);
  EXPECT_OK(r, ops->mem_release(imp));
  unmap_granule(ops, a);
  EXPECT_OK(r, ops->mem_release(h));
  if (gca_sim_used_bytes(0) != used0)
    return failf(r, "memory still charged after every handle and mapping went");
  /* the allocation is gone: its handle names nothing */
  EXPECT(r, ops->mem_import_fabric(0, bytes, &imp), GCA_ERR_INVALID_ARGUMENT, "no live allocation");
  return CHILD_PASS;
}

static void fabric_handle_round_trip_in_process_shares_memory(void **state) {
  (void)state;
  run_child(fabric_on, child_in_process, NULL, 0);
}

static int child_forgeries(report_t *r) {
  const gca_device_ops_t *ops = gca__sim_ops();
  EXPECT_OK(r, ops->init());
  gca_memhandle_t h = 0, imp = 0;
  uint8_t good[GCA_FABRIC_HANDLE_LEN], bad[GCA_FABRIC_HANDLE_LEN];
  EXPECT_OK(r, ops->mem_create(0, GRAN, &h));
  EXPECT_OK(r, ops->mem_export_fabric(h, good));
  /* not a handle: the tag */
  memcpy(bad, good, sizeof(bad));
  bad[0] ^= 1;
  EXPECT(r, ops->mem_import_fabric(0, bad, &imp), GCA_ERR_INVALID_ARGUMENT,
         "not a sim fabric handle");
  /* not a handle: bytes past the name */
  memcpy(bad, good, sizeof(bad));
  bad[GCA_FABRIC_HANDLE_LEN - 1] = 1;
  EXPECT(r, ops->mem_import_fabric(0, bad, &imp), GCA_ERR_INVALID_ARGUMENT,
         "not a sim fabric handle");
  /* a forged name: this process's fd of an ordinary file of the right size */
  char path[] = "/tmp/gca-fabric-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0)
    return failf(r, "mkstemp failed");
  unlink(path);
  if (ftruncate(fd, (off_t)GRAN) != 0)
    return failf(r, "ftruncate failed");
  memcpy(bad, good, sizeof(bad));
  int32_t fd32 = fd;
  memcpy(bad + 12, &fd32, sizeof(fd32)); /* the name's fd field */
  EXPECT(r, ops->mem_import_fabric(0, bad, &imp), GCA_ERR_INVALID_ARGUMENT,
         "is not exported device memory");
  close(fd);
  /* a stale name: the inode of another allocation */
  memcpy(bad, good, sizeof(bad));
  bad[24] ^= 0x40; /* the name's inode field */
  EXPECT(r, ops->mem_import_fabric(0, bad, &imp), GCA_ERR_INVALID_ARGUMENT, "no live allocation");
  EXPECT(r, ops->mem_import_fabric(0, good, NULL), GCA_ERR_INVALID_ARGUMENT, "out");
  /* a fault at the export: counted, nothing changes */
  EXPECT_OK(r, gca_sim_fault_set("mem_export_fabric:nth=1"));
  EXPECT(r, ops->mem_export_fabric(h, bad), GCA_ERR_DRIVER, "injected fault");
  gca_sim_fault_clear();
  EXPECT_OK(r, ops->mem_release(h));
  if (gca_sim_used_bytes(0) != 0)
    return failf(r, "%llu bytes still in use", (unsigned long long)gca_sim_used_bytes(0));
  return CHILD_PASS;
}

static void forged_and_stale_fabric_handles_are_refused(void **state) {
  (void)state;
  run_child(fabric_on, child_forgeries, NULL, 0);
}

/* ---- across processes ---- */

static int xp_to_importer[2], xp_done[2];

/* Exports a stamped granule, hands the handle to the importer and keeps the
 * allocation until the importer says it is done. */
static int child_exporter(report_t *r) {
  const gca_device_ops_t *ops = gca__sim_ops();
  EXPECT_OK(r, ops->init());
  gca_memhandle_t h = 0;
  gca_devptr_t a = 0;
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  EXPECT_OK(r, ops->mem_create(0, GRAN, &h));
  EXPECT_OK(r, map_granule(ops, h, &a));
  uint32_t *pa = (uint32_t *)(uintptr_t)a;
  for (uint32_t i = 0; i < WORDS; i++)
    pa[i] = 0xc0de0000u + i;
  EXPECT_OK(r, ops->mem_export_fabric(h, bytes));
  if (write(xp_to_importer[1], bytes, sizeof(bytes)) != (ssize_t)sizeof(bytes))
    return failf(r, "cannot send the handle");
  char done = 0;
  if (read(xp_done[0], &done, 1) != 1)
    return failf(r, "the importer did not report");
  int rc = CHILD_PASS;
  if (done != 'w')
    rc = failf(r, "the importer reported '%c'", done);
  else if (pa[3] != 0x77777777u)
    rc = failf(r, "the importer's write is not seen by the exporter (word 3 = 0x%08x)", pa[3]);
  unmap_granule(ops, a);
  EXPECT_OK(r, ops->mem_release(h));
  return rc;
}

static int child_importer(report_t *r) {
  char verdict = 'f';
  int rc = CHILD_PASS;
  const gca_device_ops_t *ops = gca__sim_ops();
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  gca_memhandle_t imp = 0;
  gca_devptr_t b = 0;
  gca_status_t st = ops->init();
  if (st == GCA_OK && read(xp_to_importer[0], bytes, sizeof(bytes)) != (ssize_t)sizeof(bytes))
    st = GCA_ERR_INVALID_ARGUMENT;
  if (st == GCA_OK)
    st = ops->mem_import_fabric(0, bytes, &imp);
  if (st == GCA_OK && (st = map_granule(ops, imp, &b)) == GCA_OK) {
    const uint32_t *pb = (const uint32_t *)(uintptr_t)b;
    for (uint32_t i = 0; i < WORDS && rc == CHILD_PASS; i++)
      if (pb[i] != 0xc0de0000u + i)
        rc = failf(r, "word %u through the import is 0x%08x", i, pb[i]);
    ((uint32_t *)(uintptr_t)b)[3] = 0x77777777u;
    verdict = rc == CHILD_PASS ? 'w' : 'f';
    unmap_granule(ops, b);
  }
  if (imp)
    GCA_CHECK_IGNORE(ops->mem_release(imp));
  if (st != GCA_OK)
    rc = failf(r, "import across processes failed: %s: %s", gca_status_name(st), gca_last_error());
  if (write(xp_done[1], &verdict, 1) != 1)
    rc = failf(r, "cannot report to the exporter");
  if (gca_sim_used_bytes(0) != 0)
    rc = failf(r, "the importer was charged for memory it does not own");
  return rc;
}

/* Runs fn in a child whose verdict comes back through its exit status and a pipe of text. */
static pid_t spawn(child_fn fn, int text_fd) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("GCA_DEVICE", "sim", 1);
    setenv("GCA_SIM_FABRIC", "1", 1);
    report_t r = {{0}};
    int code = fn(&r);
    if (write(text_fd, r.text, strlen(r.text)) < 0)
      code = CHILD_FAIL;
    _exit(code);
  }
  return pid;
}

static void fabric_handle_crosses_processes(void **state) {
  (void)state;
  int text[2];
  assert_int_equal(pipe(xp_to_importer), 0);
  assert_int_equal(pipe(xp_done), 0);
  assert_int_equal(pipe(text), 0);
  pid_t exporter = spawn(child_exporter, text[1]);
  assert_true(exporter > 0);
  pid_t importer = spawn(child_importer, text[1]);
  assert_true(importer > 0);
  close(text[1]);
  int se = 0, si = 0;
  assert_int_equal(waitpid(importer, &si, 0), importer);
  assert_int_equal(waitpid(exporter, &se, 0), exporter);
  char msg[8192] = "";
  ssize_t n = read(text[0], msg, sizeof(msg) - 1);
  msg[n > 0 ? n : 0] = '\0';
  close(text[0]);
  for (int i = 0; i < 2; i++) {
    close(xp_to_importer[i]);
    close(xp_done[i]);
  }
  if (!WIFEXITED(si) || WEXITSTATUS(si) != CHILD_PASS || !WIFEXITED(se) ||
      WEXITSTATUS(se) != CHILD_PASS)
    fail_msg("importer status 0x%x, exporter status 0x%x: %s", si, se, msg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fabric_handles_are_off_unless_asked),
      cmocka_unit_test(fabric_handle_round_trip_in_process_shares_memory),
      cmocka_unit_test(forged_and_stale_fabric_handles_are_refused),
      cmocka_unit_test(fabric_handle_crosses_processes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
