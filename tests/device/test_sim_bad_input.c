/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_bad_input.c - misuse of the sim's memory ops and settings: each is a
 * status and a message naming what was wrong, never a crash, and leaves the
 * sim as it was (used bytes back to where they were, live mappings still
 * usable, every resource still releasable).
 *
 * Bad environment values are read once per process, so they are tried in a
 * child (this executable re-run with --child and its own environment).
 */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"

#define MIB (1ull << 20)
#define G   (2 * MIB)

static const gca_device_ops_t *ops;
static char addr[64];

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  return 0;
}

static int teardown_clean(void **state) {
  (void)state;
  gca_sim_fault_clear();
  assert_int_equal(gca_sim_used_bytes(0), 0);
  return 0;
}

static const char *hex(gca_devptr_t p) {
  snprintf(addr, sizeof(addr), "0x%llx", (unsigned long long)p);
  return addr;
}

/* A reservation of n granules with a handle of n granules mapped at its base, accessible. */
typedef struct fix {
  gca_devptr_t base;
  gca_memhandle_t h;
  size_t size;
} fix_t;

static fix_t fix_up(size_t granules) {
  fix_t f = {.size = granules * G};
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, f.size, 0, &f.base));
  assert_ok(ops->mem_create(0, f.size, &f.h));
  assert_ok(ops->mem_map(f.base, f.size, 0, f.h));
  assert_ok(ops->mem_set_access(f.base, f.size, &dev, 1));
  return f;
}

static void fix_still_works(fix_t f) {
  volatile uint32_t *first = (volatile uint32_t *)(uintptr_t)f.base;
  volatile uint32_t *last = (volatile uint32_t *)(uintptr_t)(f.base + f.size - 4);
  *first = 0x600d;
  *last = 0x600e;
  assert_int_equal(*first + *last, 0x600d + 0x600e);
}

static void fix_down(fix_t f) {
  assert_ok(ops->mem_unmap(f.base, f.size));
  assert_ok(ops->mem_release(f.h));
  assert_ok(ops->mem_address_free(0, f.base, f.size));
}

static void unaligned_map_is_rejected(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h;
  assert_ok(ops->mem_address_reserve(0, 4 * G, 0, &base));
  assert_ok(ops->mem_create(0, 2 * G, &h));
  assert_status(ops->mem_map(base + 4096, G, 0, h), GCA_ERR_INVALID_ARGUMENT, hex(base + 4096));
  assert_status(ops->mem_map(base, G + 4096, 0, h), GCA_ERR_INVALID_ARGUMENT, "granularity");
  assert_status(ops->mem_map(base, 2 * G, 4096, h), GCA_ERR_NOT_SUPPORTED, "offset 4096");
  assert_status(ops->mem_map(base, 0, 0, h), GCA_ERR_INVALID_ARGUMENT, "mem_map");
  /* Nothing was mapped: the whole range is still free to map. */
  assert_ok(ops->mem_map(base, 2 * G, 0, h));
  assert_ok(ops->mem_unmap(base, 2 * G));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 4 * G));
}

static void map_outside_one_reservation_or_over_a_mapping_is_rejected(void **state) {
  (void)state;
  fix_t f = fix_up(2);
  gca_memhandle_t one, two;
  gca_devptr_t other;
  assert_ok(ops->mem_create(0, G, &one));
  assert_ok(ops->mem_create(0, 2 * G, &two));
  assert_status(ops->mem_map(f.base + G, G, 0, one), GCA_ERR_INVALID_ARGUMENT, "overlaps");
  assert_status(ops->mem_map(f.base + f.size, G, 0, one), GCA_ERR_INVALID_ARGUMENT,
                "not inside one reservation");
  assert_ok(ops->mem_address_reserve(0, G, 0, &other));
  assert_status(ops->mem_map(other, 2 * G, 0, two), GCA_ERR_INVALID_ARGUMENT,
                "not inside one reservation");
  fix_still_works(f);
  assert_ok(ops->mem_address_free(0, other, G));
  assert_ok(ops->mem_release(one));
  assert_ok(ops->mem_release(two));
  fix_down(f);
}

/* Note [Sim whole mappings]: from an offset, short of the handle's end or
 * beyond it is not supported, as on the driver. */
static void map_takes_the_handle_whole_from_its_start(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h;
  assert_ok(ops->mem_address_reserve(0, 4 * G, 0, &base));
  assert_ok(ops->mem_create(0, 2 * G, &h));
  assert_status(ops->mem_map(base, 4 * G, 0, h), GCA_ERR_NOT_SUPPORTED, "mapped whole");
  assert_status(ops->mem_map(base, 2 * G, G, h), GCA_ERR_NOT_SUPPORTED, "from its start");
  assert_status(ops->mem_map(base, G, 2 * G, h), GCA_ERR_NOT_SUPPORTED, "from its start");
  assert_status(ops->mem_map(base, G, 0, h), GCA_ERR_NOT_SUPPORTED, "mapped whole");
  assert_ok(ops->mem_map(base + 2 * G, 2 * G, 0, h));
  assert_ok(ops->mem_unmap(base + 2 * G, 2 * G));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 4 * G));
}

/* Unmapping reserved bytes that are not mapped succeeds (as on the driver);
 * bytes outside every reservation are named. */
static void unmap_needs_a_reservation_not_a_mapping(void **state) {
  (void)state;
  gca_devptr_t base;
  assert_ok(ops->mem_address_reserve(0, 2 * G, 0, &base));
  assert_ok(ops->mem_unmap(base, G));
  assert_ok(ops->mem_unmap(base, 2 * G));
  assert_status(ops->mem_unmap(512 * G, G), GCA_ERR_INVALID_ARGUMENT, hex(512 * G));
  assert_status(ops->mem_unmap(base + G, 2 * G), GCA_ERR_INVALID_ARGUMENT, hex(base + 2 * G));
  assert_status(ops->mem_unmap(base + G, 2 * G), GCA_ERR_INVALID_ARGUMENT, "not reserved");
  assert_status(ops->mem_unmap(base + 12, G), GCA_ERR_INVALID_ARGUMENT, "granularity");
  assert_ok(ops->mem_address_free(0, base, 2 * G));
}

static void partial_unmap_is_rejected_and_the_mapping_survives(void **state) {
  (void)state;
  fix_t f = fix_up(4);
  assert_status(ops->mem_unmap(f.base, G), GCA_ERR_INVALID_ARGUMENT, "part of the mapping");
  assert_status(ops->mem_unmap(f.base + G, 3 * G), GCA_ERR_INVALID_ARGUMENT, "part of the mapping");
  assert_status(ops->mem_unmap(f.base + G, G), GCA_ERR_INVALID_ARGUMENT, "part of the mapping");
  fix_still_works(f);
  fix_down(f);
}

/* An unmap over a gap between mappings unmaps the mappings (each whole) and
 * passes over the gap; not measured on a GPU, it follows from the driver
 * unmapping a range that is not mapped at all without complaint. Access needs
 * every byte mapped. */
static void unmap_over_a_gap_unmaps_the_mappings_in_it(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t a, b;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, 3 * G, 0, &base));
  assert_ok(ops->mem_create(0, G, &a));
  assert_ok(ops->mem_create(0, G, &b));
  assert_ok(ops->mem_map(base, G, 0, a));
  assert_ok(ops->mem_map(base + 2 * G, G, 0, b));
  assert_status(ops->mem_set_access(base, 3 * G, &dev, 1), GCA_ERR_INVALID_ARGUMENT, hex(base + G));
  assert_ok(ops->mem_release(a));
  assert_ok(ops->mem_release(b));
  assert_int_equal(gca_sim_used_bytes(0), 2 * G);
  assert_ok(ops->mem_unmap(base, 3 * G));
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_ok(ops->mem_address_free(0, base, 3 * G));
}

/* Note [Sim whole mappings]: access is granted to whole mappings; a range that
 * covers part of one grants nothing. */
static void access_on_part_of_a_mapping_is_rejected(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, 4 * G, 0, &base));
  assert_ok(ops->mem_create(0, 4 * G, &h));
  assert_ok(ops->mem_map(base, 4 * G, 0, h));
  assert_status(ops->mem_set_access(base + G, 2 * G, &dev, 1), GCA_ERR_INVALID_ARGUMENT,
                "part of the mapping");
  assert_status(ops->mem_set_access(base, 3 * G, &dev, 1), GCA_ERR_INVALID_ARGUMENT,
                "part of the mapping");
  assert_true(test_read_faults((const void *)(uintptr_t)(base + G)));
  assert_int_equal(gca__sim_mem_device_of(base + G, 4), -1); /* mapped, not accessible */
  assert_ok(ops->mem_set_access(base, 4 * G, &dev, 1));
  *(volatile uint32_t *)(uintptr_t)(base + G) = 1;
  assert_int_equal(gca__sim_mem_device_of(base, 4 * G), 0);
  assert_ok(ops->mem_unmap(base, 4 * G));
  assert_int_equal(gca__sim_mem_device_of(base + G, 4), -1);
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 4 * G));
}

static void set_access_needs_mapped_memory_and_real_devices(void **state) {
  (void)state;
  fix_t f = fix_up(1);
  gca_devptr_t r;
  int bad[] = {0, 7}, dev = 0;
  assert_ok(ops->mem_address_reserve(0, G, 0, &r));
  assert_status(ops->mem_set_access(r, G, &dev, 1), GCA_ERR_INVALID_ARGUMENT, hex(r));
  assert_status(ops->mem_set_access(f.base, G, bad, 2), GCA_ERR_INVALID_ARGUMENT, "device 7");
  assert_status(ops->mem_set_access(f.base, G, NULL, 1), GCA_ERR_INVALID_ARGUMENT,
                "mem_set_access");
  assert_status(ops->mem_set_access(f.base, G, &dev, 0), GCA_ERR_INVALID_ARGUMENT,
                "mem_set_access");
  fix_still_works(f);
  assert_ok(ops->mem_address_free(0, r, G));
  fix_down(f);
}

static void double_release_and_unknown_handles_are_invalid_handle(void **state) {
  (void)state;
  gca_memhandle_t h;
  gca_devptr_t base;
  int fd;
  assert_ok(ops->mem_create(0, G, &h));
  assert_ok(ops->mem_release(h));
  assert_status(ops->mem_release(h), GCA_ERR_INVALID_HANDLE, "mem_release");
  assert_status(ops->mem_release(0), GCA_ERR_INVALID_HANDLE, "0x0");
  assert_status(ops->mem_release(0xdeadbeef), GCA_ERR_INVALID_HANDLE, "0xdeadbeef");
  assert_ok(ops->mem_address_reserve(0, G, 0, &base));
  assert_status(ops->mem_map(base, G, 0, h), GCA_ERR_INVALID_HANDLE, "mem_map");
  assert_status(ops->mem_export_fd(h, &fd), GCA_ERR_INVALID_HANDLE, "mem_export_fd");
  assert_ok(ops->mem_address_free(0, base, G));
}

static void null_out_pointers_are_invalid_arguments(void **state) {
  (void)state;
  gca_memhandle_t h;
  assert_status(ops->device_count(NULL), GCA_ERR_INVALID_ARGUMENT, "device_count");
  assert_status(ops->device_attr(0, GCA_ATTR_CC_MAJOR, NULL), GCA_ERR_INVALID_ARGUMENT,
                "device_attr");
  assert_status(ops->device_name(0, NULL, 10), GCA_ERR_INVALID_ARGUMENT, "device_name");
  assert_status(ops->device_can_access_peer(0, 0, NULL), GCA_ERR_INVALID_ARGUMENT,
                "device_can_access_peer");
  size_t s;
  assert_status(ops->mem_get_info(0, NULL, &s), GCA_ERR_INVALID_ARGUMENT, "free_bytes");
  assert_status(ops->mem_get_info(0, &s, NULL), GCA_ERR_INVALID_ARGUMENT, "total_bytes");
  assert_status(ops->mem_granularity(0, true, NULL), GCA_ERR_INVALID_ARGUMENT, "mem_granularity");
  assert_status(ops->mem_alloc(0, 64, NULL), GCA_ERR_INVALID_ARGUMENT, "mem_alloc");
  assert_status(ops->mem_create(0, G, NULL), GCA_ERR_INVALID_ARGUMENT, "mem_create");
  assert_status(ops->mem_address_reserve(0, G, 0, NULL), GCA_ERR_INVALID_ARGUMENT,
                "mem_address_reserve");
  assert_ok(ops->mem_create(0, G, &h));
  assert_status(ops->mem_export_fd(h, NULL), GCA_ERR_INVALID_ARGUMENT, "mem_export_fd");
  int fd;
  assert_ok(ops->mem_export_fd(h, &fd));
  assert_status(ops->mem_import_fd(0, fd, NULL), GCA_ERR_INVALID_ARGUMENT, "mem_import_fd");
  close(fd);
  assert_ok(ops->mem_release(h));
}

static void bad_devices_sizes_and_attributes_are_rejected(void **state) {
  (void)state;
  gca_memhandle_t h;
  gca_devptr_t p;
  int v;
  char name[8];
  assert_status(ops->mem_create(7, G, &h), GCA_ERR_INVALID_ARGUMENT, "device 7");
  assert_status(ops->mem_create(-1, G, &h), GCA_ERR_INVALID_ARGUMENT, "device -1");
  assert_status(ops->mem_create(0, G + 1, &h), GCA_ERR_INVALID_ARGUMENT, "granularity");
  assert_status(ops->mem_create(0, 0, &h), GCA_ERR_INVALID_ARGUMENT, "mem_create");
  assert_status(ops->mem_alloc(0, 0, &p), GCA_ERR_INVALID_ARGUMENT, "mem_alloc");
  assert_status(ops->mem_address_reserve(0, G + 1, 0, &p), GCA_ERR_INVALID_ARGUMENT, "granularity");
  assert_status(ops->mem_address_reserve(0, G + 4096, 0, &p), GCA_ERR_INVALID_ARGUMENT,
                "granularity");
  assert_status(ops->mem_address_reserve(0, G, 3 * G, &p), GCA_ERR_INVALID_ARGUMENT, "alignment");
  assert_status(ops->device_attr(0, (gca_dev_attr_t)999, &v), GCA_ERR_INVALID_ARGUMENT, "999");
  assert_status(ops->device_can_access_peer(0, 5, &v), GCA_ERR_INVALID_ARGUMENT, "device 5");
  assert_ok(ops->device_name(0, name, sizeof(name))); /* truncated, as the driver does */
  assert_int_equal(strlen(name), sizeof(name) - 1);
}

static void size_over_capacity_is_out_of_memory(void **state) {
  (void)state;
  gca_memhandle_t h;
  gca_devptr_t p;
  assert_status(ops->mem_create(0, 17ull << 30, &h), GCA_ERR_OUT_OF_MEMORY, "requested 17.00 GiB");
  assert_status(ops->mem_alloc(0, (17ull << 30) - 5, &p), GCA_ERR_OUT_OF_MEMORY, "mem_alloc");
  assert_status(ops->mem_alloc(0, SIZE_MAX, &p), GCA_ERR_INVALID_ARGUMENT, "mem_alloc");
  assert_ok(ops->mem_create(0, G, &h));
  assert_status(gca_sim_set_capacity(0, 0), GCA_ERR_INVALID_STATE, "in use");
  assert_status(gca_sim_set_capacity(3, G), GCA_ERR_INVALID_ARGUMENT, "device 3");
  assert_ok(ops->mem_release(h));
  assert_int_equal(gca_sim_used_bytes(3), 0);
}

static void address_free_must_match_and_be_unmapped(void **state) {
  (void)state;
  fix_t f = fix_up(2);
  assert_status(ops->mem_address_free(0, f.base, f.size), GCA_ERR_INVALID_ARGUMENT, "still has");
  assert_status(ops->mem_address_free(0, f.base, G), GCA_ERR_INVALID_ARGUMENT, "does not match");
  assert_status(ops->mem_address_free(0, f.base + G, G), GCA_ERR_INVALID_ARGUMENT, hex(f.base + G));
  fix_still_works(f);
  fix_down(f);
  assert_status(ops->mem_address_free(0, f.base, f.size), GCA_ERR_INVALID_ARGUMENT,
                "does not match"); /* already freed */
}

static void mem_free_of_a_foreign_pointer_names_it(void **state) {
  (void)state;
  gca_devptr_t p;
  int local;
  fix_t f = fix_up(1);
  assert_ok(ops->mem_alloc(0, 4096, &p));
  assert_status(ops->mem_free(0, p + 256), GCA_ERR_INVALID_ARGUMENT, hex(p + 256));
  assert_status(ops->mem_free(0, (gca_devptr_t)(uintptr_t)&local), GCA_ERR_INVALID_ARGUMENT,
                "not a pointer returned by mem_alloc");
  assert_status(ops->mem_free(0, f.base), GCA_ERR_INVALID_ARGUMENT, hex(f.base));
  assert_status(ops->mem_unmap(p, G), GCA_ERR_INVALID_ARGUMENT, "mem_free");
  assert_status(ops->mem_address_free(0, p, G), GCA_ERR_INVALID_ARGUMENT, "mem_address_free");
  *(volatile uint32_t *)(uintptr_t)p = 5; /* untouched by the refusals */
  assert_int_equal(gca__sim_mem_device_of(p, 4096), 0);
  assert_ok(ops->mem_free(0, p));
  assert_status(ops->mem_free(0, p), GCA_ERR_INVALID_ARGUMENT, hex(p));
  assert_int_equal(gca__sim_mem_device_of(p, 4), -1);
  fix_still_works(f);
  fix_down(f);
}

static void import_of_a_foreign_fd_is_rejected(void **state) {
  (void)state;
  gca_memhandle_t h;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  assert_status(ops->mem_import_fd(0, fds[0], &h), GCA_ERR_INVALID_ARGUMENT, "not exported");
  close(fds[0]);
  close(fds[1]);
  assert_status(ops->mem_import_fd(0, fds[0], &h), GCA_ERR_INVALID_ARGUMENT, "not open");
  assert_status(ops->mem_import_fd(0, -1, &h), GCA_ERR_INVALID_ARGUMENT, "fd -1");
}

/* Note [Sim IPC handles]: only a memfd the sim made is device memory. */
static void import_of_a_file_or_a_foreign_memfd_is_rejected(void **state) {
  (void)state;
  gca_memhandle_t h = 0;
  char path[] = "/tmp/gca-forged-XXXXXX";
  int file = mkstemp(path);
  assert_true(file >= 0);
  unlink(path);
  assert_int_equal(ftruncate(file, G), 0);
  assert_status(ops->mem_import_fd(0, file, &h), GCA_ERR_INVALID_ARGUMENT, "not a memfd");
  close(file);
  int other = memfd_create("other", MFD_CLOEXEC);
  assert_true(other >= 0);
  assert_int_equal(ftruncate(other, G), 0);
  assert_status(ops->mem_import_fd(0, other, &h), GCA_ERR_INVALID_ARGUMENT, "memfd:other");
  close(other);
  int lookalike = memfd_create("gca-sim-device-memory", MFD_CLOEXEC); /* same name, no seals */
  assert_true(lookalike >= 0);
  assert_int_equal(ftruncate(lookalike, G), 0);
  assert_status(ops->mem_import_fd(0, lookalike, &h), GCA_ERR_INVALID_ARGUMENT, "seals");
  close(lookalike);
  assert_int_equal(h, 0);
  /* What the sim exports still imports. */
  gca_memhandle_t mine, again;
  int fd;
  assert_ok(ops->mem_create(0, G, &mine));
  assert_ok(ops->mem_export_fd(mine, &fd));
  assert_ok(ops->mem_import_fd(0, fd, &again));
  close(fd);
  assert_ok(ops->mem_release(again));
  assert_ok(ops->mem_release(mine));
}

/* ---- bad environment values, in a child ---- */

static void child_main(void) {
  gca_status_t st = gca__sim_ops()->init();
  printf("%s %s", gca_status_name(st), gca_last_error());
}

/* Note [Strict handles]: a destroyed stream handed to the sim; a stale
 * handle that never named a stream is an error either way. */
static void child_destroyed_stream(void) {
  const gca_device_ops_t *o = gca__sim_ops();
  gca_stream_t st;
  if (o->init() != GCA_OK || o->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &st) != GCA_OK)
    return;
  printf("never %s\n", gca_status_name(o->stream_query((gca_stream_t)(uintptr_t)0x1234)));
  fflush(stdout);
  (void)o->stream_destroy(st);
  printf("destroyed %s\n", gca_status_name(o->stream_query(st)));
}

/* Runs this executable as a child with `env` prepended; its output (and
 * with `both`, its stderr) in `out`; the shell's exit status. */
static int run_child_as(const char *env, const char *mode, bool both, char *out, size_t len) {
  char self[PATH_MAX], cmd[PATH_MAX + 256];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  assert_true(n > 0);
  self[n] = '\0';
  snprintf(cmd, sizeof(cmd), "%s '%s' %s%s", env, self, mode, both ? " 2>&1" : "");
  fflush(NULL);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t got = fread(out, 1, len - 1, f);
  out[got] = '\0';
  return pclose(f);
}

static void a_destroyed_stream_aborts_unless_lenient(void **state) {
  (void)state;
  char out[1024];
  int st = run_child_as("", "--destroyed-stream", true, out, sizeof(out));
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGABRT);
  assert_non_null(strstr(out, "never GCA_ERR_INVALID_HANDLE"));
  assert_non_null(strstr(out, "stream_query: stream"));
  assert_non_null(strstr(out, "was destroyed; the driver's behaviour is undefined"));
  assert_null(strstr(out, "destroyed GCA_"));
  st = run_child_as("GCA_SIM_STRICT_HANDLES=0", "--destroyed-stream", true, out, sizeof(out));
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "never GCA_ERR_INVALID_HANDLE"));
  assert_non_null(strstr(out, "destroyed GCA_ERR_INVALID_HANDLE"));
}

/* Runs this executable as a child with `env` prepended; its output in `out`. */
static void run_child(const char *env, char *out, size_t len) {
  assert_int_equal(run_child_as(env, "--child", false, out, len), 0);
}

static void bad_environment_fails_init_quoting_the_text(void **state) {
  (void)state;
  static const struct {
    const char *env, *quote;
  } bad[] = {
      {"GCA_SIM_DEVICES=abc", "GCA_SIM_DEVICES='abc'"},
      {"GCA_SIM_DEVICES=99", "GCA_SIM_DEVICES='99'"},
      {"GCA_SIM_DEVICE_MEMORY=lots", "GCA_SIM_DEVICE_MEMORY='lots'"},
      {"GCA_SIM_DEVICE_MEMORY=0", "GCA_SIM_DEVICE_MEMORY='0'"},
      {"GCA_SIM_FAULTS=nope_op:always", "nope_op:always"},
      {"GCA_SIM_FAULTS=mem_map:sometimes", "mem_map:sometimes"},
      {"GCA_SIM_RECYCLE_HANDLES=yes", "GCA_SIM_RECYCLE_HANDLES='yes' is not 0 or 1"},
  };
  char out[1024];
  for (size_t i = 0; i < GCA_ARRAY_SIZE(bad); i++) {
    run_child(bad[i].env, out, sizeof(out));
    if (strncmp(out, "GCA_ERR_CONFIG init: ", 21) != 0 || strstr(out, bad[i].quote) == NULL)
      fail_msg("%s: child said '%s'", bad[i].env, out);
  }
  run_child("GCA_SIM_DEVICES=3 GCA_SIM_DEVICE_MEMORY=80GiB", out, sizeof(out));
  assert_string_equal(out, "GCA_OK ");
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--child") == 0) {
    child_main();
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--destroyed-stream") == 0) {
    child_destroyed_stream();
    return 0;
  }
#define T(fn) cmocka_unit_test_teardown(fn, teardown_clean)
  const struct CMUnitTest tests[] = {
      T(unaligned_map_is_rejected),
      T(a_destroyed_stream_aborts_unless_lenient),
      T(map_outside_one_reservation_or_over_a_mapping_is_rejected),
      T(map_takes_the_handle_whole_from_its_start),
      T(unmap_needs_a_reservation_not_a_mapping),
      T(partial_unmap_is_rejected_and_the_mapping_survives),
      T(unmap_over_a_gap_unmaps_the_mappings_in_it),
      T(access_on_part_of_a_mapping_is_rejected),
      T(set_access_needs_mapped_memory_and_real_devices),
      T(double_release_and_unknown_handles_are_invalid_handle),
      T(null_out_pointers_are_invalid_arguments),
      T(bad_devices_sizes_and_attributes_are_rejected),
      T(size_over_capacity_is_out_of_memory),
      T(address_free_must_match_and_be_unmapped),
      T(mem_free_of_a_foreign_pointer_names_it),
      T(import_of_a_foreign_fd_is_rejected),
      T(import_of_a_file_or_a_foreign_memfd_is_rejected),
      T(bad_environment_fails_init_quoting_the_text),
  };
#undef T
  return cmocka_run_group_tests(tests, setup, NULL);
}
