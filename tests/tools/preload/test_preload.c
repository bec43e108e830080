/* SPDX-License-Identifier: Apache-2.0 */
/* test_preload.c - libgca_preload.so seen from outside: runs cudart_user (an
 * ordinary libcudart program) under LD_PRELOAD on the sim backend, and
 * fake_user on the cuda backend over the fake driver, and reads their exit
 * status, stdout and stderr; and opens the shim to check what it exports.
 *
 * Paths come from the environment meson sets: GCA_PRELOAD_LIB (the shim),
 * CUDART_USER (the program; empty when the CUDA runtime was not found, and
 * the tests that need it are skipped), FAKE_USER and GCA_TEST_FAKE_CUDA (the
 * fake driver).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"

typedef struct run_result {
  int exit_code; /* -1 when killed by a signal */
  char *out;     /* stdout, NUL-terminated */
  char *err;     /* stderr, NUL-terminated */
} run_result_t;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = '\0';
  fclose(f);
  return buf;
}

/* The last run's output, released by the teardown even when an assertion
 * ends the test early. */
static run_result_t last_run;

static void run_free(run_result_t *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

static int release_last_run(void **state) {
  (void)state;
  run_free(&last_run);
  return 0;
}

static const char *program_path(void) {
  const char *p = getenv("CUDART_USER");
  return (p && *p) ? p : NULL;
}

/* Runs prog under the shim on sim with the extra NAME=VALUE settings in `env`
 * (NULL-terminated; GCA_DEVICE among them changes the backend) and the given
 * mode arguments. */
static run_result_t run_at(const char *prog, const char *const *env, const char *const *args) {
  const char *shim = getenv("GCA_PRELOAD_LIB");
  assert_non_null(prog);
  assert_non_null(shim);
  char out_path[] = "/tmp/gca_preload_outXXXXXX";
  char err_path[] = "/tmp/gca_preload_errXXXXXX";
  int out_fd = mkstemp(out_path);
  int err_fd = mkstemp(err_path);
  assert_true(out_fd >= 0 && err_fd >= 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    setenv("LD_PRELOAD", shim, 1);
    setenv("GCA_DEVICE", "sim", 1);
    setenv("GCA_PRINT_STATS", "1", 1);
    setenv("GCA_LOG_LEVEL", "error", 1);
    /* Under ASan the shim precedes the program's sanitizer runtime in lookup order. */
    char asan[512];
    const char *prev = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", prev ? prev : "",
             prev && *prev ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    for (const char *const *e = env; e && *e; e++)
      putenv((char *)*e);
    const char *argv[8] = {prog};
    int argc = 1;
    for (const char *const *a = args; a && *a && argc < 7; a++)
      argv[argc++] = *a;
    execv(prog, (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  close(out_fd);
  close(err_fd);
  run_result_t r = {
      .exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1,
      .out = slurp(out_path),
      .err = slurp(err_path),
  };
  unlink(out_path);
  unlink(err_path);
  run_free(&last_run);
  last_run = r;
  if (r.exit_code != 0)
    print_message("exit %d\n--- stdout\n%s--- stderr\n%s", r.exit_code, r.out, r.err);
  return r;
}

static run_result_t run_program(const char *const *env, const char *const *args) {
  return run_at(program_path(), env, args);
}

/* The integer after "key" (followed by ' ' or '=') in `text`; -1 when absent. */
static int64_t field(const char *text, const char *key) {
  char pat[96];
  for (const char *sep = " ="; *sep; sep++) {
    snprintf(pat, sizeof(pat), "%s%c", key, *sep);
    const char *at = text;
    while ((at = strstr(at, pat)) != NULL) {
      if (at == text || at[-1] == ' ' || at[-1] == ',' || at[-1] == ':')
        return strtoll(at + strlen(pat), NULL, 10);
      at++;
    }
  }
  return -1;
}

/* The line of `text` that starts with `prefix` (copied into buf), or NULL. */
static const char *line_of(const char *text, const char *prefix, char *buf, size_t len) {
  const char *at = strstr(text, prefix);
  if (!at)
    return NULL;
  size_t n = strcspn(at, "\n");
  if (n >= len)
    n = len - 1;
  memcpy(buf, at, n);
  buf[n] = '\0';
  return buf;
}

static bool need_program(void) {
  if (program_path())
    return true;
  print_message("SKIP: the CUDA runtime (libcudart.so) was not found at build time\n");
  return false;
}

static void stress_program_passes_and_its_calls_went_through_gca(void **state) {
  (void)state;
  if (!need_program())
    skip();
  const char *args[] = {"stress", "6000", "777", NULL};
  run_result_t r = run_program(NULL, args);
  assert_int_equal(r.exit_code, 0);
  char prog[256], calls[512], dev[768];
  assert_non_null(line_of(r.out, "cudart_user: ok", prog, sizeof(prog)));
  assert_non_null(line_of(r.err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_non_null(line_of(r.err, "gca-preload: device 0 (sim):", dev, sizeof(dev)));
  int64_t mallocs = field(prog, "cudaMalloc"), asyncs = field(prog, "cudaMallocAsync");
  int64_t frees = field(prog, "cudaFree"), async_frees = field(prog, "cudaFreeAsync");
  assert_true(mallocs > 1000 && asyncs > 1000);
  assert_int_equal(field(calls, "cudaMalloc"), mallocs);
  assert_int_equal(field(calls, "cudaMallocAsync"), asyncs);
  assert_int_equal(field(calls, "cudaFree"), frees);
  assert_int_equal(field(calls, "cudaFreeAsync"), async_frees);
  assert_int_equal(field(calls, "foreign_free"), 0);
  assert_int_equal(field(dev, "allocations"), mallocs + asyncs);
  assert_int_equal(field(dev, "frees"), frees + async_frees);
  assert_int_equal(field(dev, "live"), 0);
  int64_t device_allocs = field(dev, "device allocs");
  assert_true(device_allocs >= 1 && device_allocs < (mallocs + asyncs) / 4);
  assert_int_equal(field(dev, "cached hits"), mallocs + asyncs - device_allocs);
  assert_non_null(strstr(dev, "peak reserved "));
}

static void foreign_free_on_sim_is_invalid_value_and_logged(void **state) {
  (void)state;
  if (!need_program())
    skip();
  const char *args[] = {"foreign", NULL};
  run_result_t r = run_program(NULL, args);
  assert_int_equal(r.exit_code, 0);
  char line[256];
  assert_non_null(line_of(r.out, "cudart_user: foreign pointer ", line, sizeof(line)));
  const char *ptr = line + strlen("cudart_user: foreign pointer ");
  char want[320];
  snprintf(want, sizeof(want), "cudaFree: %s is not a live gca allocation", ptr);
  assert_non_null(strstr(r.err, want));
  snprintf(want, sizeof(want), "cudaFreeAsync: %s is not a live gca allocation", ptr);
  assert_non_null(strstr(r.err, want));
  assert_non_null(strstr(r.out, "cudart_user: foreign ok"));
  char calls[512], dev[768];
  assert_non_null(line_of(r.err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_int_equal(field(calls, "foreign_free"), 3); /* two foreign, one double free */
  assert_non_null(line_of(r.err, "gca-preload: device 0 (sim):", dev, sizeof(dev)));
  assert_int_equal(field(dev, "allocations"), 1);
  assert_int_equal(field(dev, "frees"), 1);
  assert_int_equal(field(dev, "live"), 0);
}

static void oom_and_injected_faults_become_cuda_errors_and_state_stays_intact(void **state) {
  (void)state;
  if (!need_program())
    skip();
  const char *env[] = {"GCA_SIM_DEVICE_MEMORY=1GiB",
                       "GCA_SIM_FAULTS=stream_create:nth=1,memset_d8_async:nth=1", NULL};
  const char *args[] = {"errors", NULL};
  run_result_t r = run_program(env, args);
  assert_int_equal(r.exit_code, 0);
  assert_non_null(strstr(r.out, "cudart_user: errors ok"));
  char calls[512], dev[768];
  assert_non_null(line_of(r.err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_int_equal(field(calls, "failed_alloc"), 1);
  assert_non_null(line_of(r.err, "gca-preload: device 0 (sim):", dev, sizeof(dev)));
  assert_int_equal(field(dev, "ooms"), 1);
  assert_int_equal(field(dev, "allocations"), 1);
  assert_int_equal(field(dev, "live"), 0);
}

static void driver_api_allocations_are_served_by_gca(void **state) {
  (void)state;
  if (!need_program())
    skip();
  const char *args[] = {"driver", NULL};
  run_result_t r = run_program(NULL, args);
  assert_int_equal(r.exit_code, 0);
  assert_non_null(strstr(r.out, "cudart_user: driver ok"));
  char calls[512], dev[768];
  assert_non_null(line_of(r.err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_int_equal(field(calls, "cuMemAlloc"), 2);
  assert_int_equal(field(calls, "cuMemFree"), 2);
  assert_int_equal(field(calls, "cuMemAllocAsync"), 1);
  assert_int_equal(field(calls, "cuMemFreeAsync"), 2);
  assert_int_equal(field(calls, "foreign_free"), 2);
  assert_non_null(line_of(r.err, "gca-preload: device 0 (sim):", dev, sizeof(dev)));
  assert_int_equal(field(dev, "allocations"), 2);
  assert_int_equal(field(dev, "live"), 0);
}

/* Note [Destroyed streams]: a program destroys streams it allocated on, with
 * the runtime's cudaStreamDestroy and the driver's cuStreamDestroy; the
 * cached segments made on them are released later (an allocation that fits
 * a 1 GiB device only without them) and gca names neither stream to the
 * device again: the sim would abort (Note [Strict handles]). */
static void memory_of_destroyed_streams_is_released_without_naming_them(void **state) {
  (void)state;
  if (!need_program())
    skip();
  const char *env[] = {"GCA_ALLOC_CONF=expandable_segments:True", "GCA_SIM_DEVICE_MEMORY=1GiB",
                       NULL};
  const char *args[] = {"streams", NULL};
  run_result_t r = run_program(env, args);
  assert_int_equal(r.exit_code, 0);
  assert_non_null(strstr(r.out, "cudart_user: streams ok"));
  char calls[768], dev[768];
  assert_non_null(line_of(r.err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_int_equal(field(calls, "cudaStreamDestroy"), 1);
  assert_int_equal(field(calls, "cuStreamDestroy"), 1);
  assert_non_null(line_of(r.err, "gca-preload: device 0 (sim):", dev, sizeof(dev)));
  assert_int_equal(field(dev, "live"), 0);
  assert_true(field(dev, "device frees") >= 2);
}

/* cudaHostAlloc, cudaMallocHost, cudaFreeHost, cudaHostRegister/Unregister,
 * cuMemHostAlloc and cuMemFreeHost of a cudart program are served by gca's
 * pinned host allocator (stamps round-trip through the device), without any
 * GLIBC_TUNABLES (the shim loads jemalloc at start), and the program's malloc
 * stays glibc's. */
static void pinned_host_calls_are_served_and_malloc_stays_glibcs(void **state) {
  (void)state;
  if (!need_program())
    skip();
#ifndef GCA_TEST_HAVE_JEMALLOC
  print_message("SKIP: built without jemalloc (-Djemalloc=disabled): no pinned host allocator\n");
  skip();
#endif
  const char *env[] = {"GLIBC_TUNABLES=", NULL};
  const char *args[] = {"host", NULL};
  run_result_t r = run_program(env, args);
  assert_int_equal(r.exit_code, 0);
  assert_non_null(strstr(r.out, "cudart_user: host ok"));
  char calls[768];
  assert_non_null(line_of(r.err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_int_equal(field(calls, "cudaHostAlloc"), 9);
  assert_int_equal(field(calls, "cudaFreeHost"), 10);
  assert_int_equal(field(calls, "cudaHostRegister"), 2);
  assert_int_equal(field(calls, "cuMemHostAlloc"), 1);
  assert_int_equal(field(calls, "cuMemFreeHost"), 2);
  assert_int_equal(field(calls, "foreign_free"), 2);
}

static void allocation_in_another_library_constructor_is_served(void **state) {
  (void)state;
  if (!need_program())
    skip();
  const char *env[] = {"CUDART_USER_CTOR=1", NULL};
  const char *args[] = {"ctor", NULL};
  run_result_t r = run_program(env, args);
  assert_int_equal(r.exit_code, 0);
  char calls[512];
  assert_non_null(line_of(r.err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_int_equal(field(calls, "cudaMalloc"), 1);
  assert_int_equal(field(calls, "cudaFree"), 1);
}

static void trace_records_the_program_allocations(void **state) {
  (void)state;
  if (!need_program())
    skip();
  char trace[] = "/tmp/gca_preload_traceXXXXXX";
  int fd = mkstemp(trace);
  assert_true(fd >= 0);
  close(fd);
  char setting[64];
  snprintf(setting, sizeof(setting), "GCA_TRACE=%s", trace);
  const char *env[] = {setting, NULL};
  const char *args[] = {"stress", "200", "5", NULL};
  run_result_t r = run_program(env, args);
  assert_int_equal(r.exit_code, 0);
  char prog[256];
  assert_non_null(line_of(r.out, "cudart_user: ok", prog, sizeof(prog)));
  int64_t allocs = field(prog, "cudaMalloc") + field(prog, "cudaMallocAsync");
  char *csv = slurp(trace);
  assert_true(strncmp(csv, "Thread,Time,Action,Pointer,Size,Stream", 38) == 0);
  int64_t rows = 0;
  for (const char *at = csv; (at = strstr(at, ",allocate,")) != NULL; at++)
    rows++;
  assert_int_equal(rows, allocs);
  free(csv);
  unlink(trace);
}

/* ---- the cuda backend, on the fake driver ---- */

#ifdef GCA_TEST_HAVE_JEMALLOC
#define FAKE_HOST NULL
#else
#define FAKE_HOST "nohost" /* no pinned host allocator to refuse frees of */
#endif

/* Runs fake_user in `mode` under the shim on cuda over the fake driver. */
static run_result_t run_fake_user(const char *mode) {
  const char *prog = getenv("FAKE_USER"), *fake = getenv("GCA_TEST_FAKE_CUDA");
  if (!prog || !*prog || !fake || !*fake) {
    print_message("SKIP: FAKE_USER or GCA_TEST_FAKE_CUDA is not set\n");
    skip();
  }
  static char library[512];
  snprintf(library, sizeof(library), "GCA_CUDA_LIBRARY=%s", fake);
  const char *env[] = {"GCA_DEVICE=cuda", library, NULL};
  const char *args[] = {mode, FAKE_HOST, NULL};
  return run_at(prog, env, args);
}

/* The end of a fake_user run: gca's statistics balance and its invariants hold. */
static void expect_fake_run_clean(const run_result_t *r, int64_t refused) {
  char calls[768], dev[768], check[256];
  assert_null(strstr(r->err, "no definition after libgca_preload.so"));
  assert_non_null(line_of(r->err, "gca-preload: calls:", calls, sizeof(calls)));
  assert_int_equal(field(calls, "foreign_free"), refused);
  assert_non_null(line_of(r->err, "gca-preload: allocator check:", check, sizeof(check)));
  assert_string_equal(check, "gca-preload: allocator check: ok");
  if (line_of(r->err, "gca-preload: device 0 (cuda):", dev, sizeof(dev))) {
    assert_int_equal(field(dev, "live"), 0);
    assert_int_equal(field(dev, "allocations"), field(dev, "frees"));
  }
  if (line_of(r->err, "gca-preload: pinned host:", dev, sizeof(dev)))
    assert_int_equal(field(dev, "live"), 0);
}

/* libcudart loads libcuda.so.1 RTLD_LOCAL, so RTLD_NEXT finds no driver entry
 * point: cuMemFree_v2, cuMemFreeAsync and cuMemFreeHost of memory gca does not
 * hold reach the fake driver's own (fake_user counts them), found in the
 * library gca's backend loaded (Note [Finding the driver]); the runtime's
 * reach fake_cudart through RTLD_NEXT as before. */
static void cuda_driver_frees_reach_the_driver_loaded_rtld_local(void **state) {
  (void)state;
  run_result_t r = run_fake_user("forward");
  assert_int_equal(r.exit_code, 0);
  assert_non_null(strstr(r.out, "fake_user: forward ok"));
  expect_fake_run_clean(&r, 0);
}

/* Note [Captures under the shim] (tools/preload/capture.c): the program's
 * captures, begun through the driver or the runtime, close the allocator's
 * capture gate, so destroying a stream gca holds memory of during a
 * global-mode capture does not make the allocator wait for it (the fake
 * driver refuses that and invalidates the capture, as the real one does). */
static void cuda_program_captures_keep_the_allocators_waits_away(void **state) {
  (void)state;
  run_result_t r = run_fake_user("captures");
  if (r.exit_code != 0)
    print_message("%s%s", r.out, r.err);
  assert_int_equal(r.exit_code, 0);
  assert_non_null(strstr(r.out, "fake_user: captures ok"));
  assert_non_null(strstr(r.err, "256 captures run already; this one is not counted"));
  expect_fake_run_clean(&r, 0);
}

/* A second free of a gca allocation, device or pinned, or a free of a pointer
 * inside a live one, is invalid value and reaches neither the runtime nor the
 * driver, which would free gca's memory under it (Note [Refused frees]); the
 * logged message names the pointer; gca serves allocations afterwards, with
 * nothing live at exit and its invariants intact. */
static void cuda_frees_inside_gca_memory_are_refused_not_forwarded(void **state) {
  (void)state;
  run_result_t r = run_fake_user("refuse");
  assert_int_equal(r.exit_code, 0);
  assert_non_null(strstr(r.out, "fake_user: refuse ok"));
  char line[256], want[320];
  assert_non_null(line_of(r.out, "fake_user: device pointer ", line, sizeof(line)));
  const char *ptr = line + strlen("fake_user: device pointer ");
  snprintf(want, sizeof(want), "cuMemFree_v2: %s lies inside gca's memory (device 0)", ptr);
  assert_non_null(strstr(r.err, want));
  assert_non_null(strstr(r.err, "already freed (double free?)"));
  assert_non_null(strstr(r.err, "cudaFree: "));
  assert_non_null(strstr(r.err, "cudaFreeAsync: "));
  int64_t refused = 8; /* 2 each of cuMemFree_v2, cuMemFreeAsync, cudaFree, cudaFreeAsync */
  if (line_of(r.out, "fake_user: host pointer ", line, sizeof(line))) {
    ptr = line + strlen("fake_user: host pointer ");
    snprintf(want, sizeof(want), "cuMemFreeHost: %s lies inside gca's memory (pinned host)", ptr);
    assert_non_null(strstr(r.err, want));
    refused += 4; /* 2 each of cuMemFreeHost, cudaFreeHost */
  }
  expect_fake_run_clean(&r, refused);
}

static void shim_exports_cuda_entry_points_only(void **state) {
  (void)state;
  const char *shim = getenv("GCA_PRELOAD_LIB");
  assert_non_null(shim);
  void *h = dlopen(shim, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    fail_msg("dlopen(%s): %s", shim, dlerror());
  static const char *const served[] = {
      "cudaMalloc",
      "cudaFree",
      "cudaMallocAsync",
      "cudaFreeAsync",
      "cudaMallocFromPoolAsync",
      "cudaMemGetInfo",
      "cuMemAlloc_v2",
      "cuMemFree_v2",
      "cuMemAllocAsync",
      "cuMemFreeAsync",
      "cudaStreamCreate",
      "cudaGetLastError",
      "cudaHostAlloc",
      "cudaMallocHost",
      "cudaFreeHost",
      "cudaHostRegister",
      "cudaHostUnregister",
      "cuMemHostAlloc",
      "cuMemFreeHost",
      "cudaStreamBeginCapture",
      "cudaStreamEndCapture",
      "cuStreamBeginCapture_v2",
      "cuStreamEndCapture",
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(served); i++)
    if (dlsym(h, served[i]) == NULL)
      fail_msg("the shim does not export %s", served[i]);
  static const char *const hidden[] = {"gca_malloc",
                                       "gca_free",
                                       "gca__error",
                                       "gca__sim_ops",
                                       "gca_device_init",
                                       "gca__shim_real",
                                       "gca__shim_capture_forget"};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(hidden); i++)
    if (dlsym(h, hidden[i]) != NULL)
      fail_msg("the shim exports gca's %s", hidden[i]);
  dlclose(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(stress_program_passes_and_its_calls_went_through_gca,
                                release_last_run),
      cmocka_unit_test_teardown(foreign_free_on_sim_is_invalid_value_and_logged, release_last_run),
      cmocka_unit_test_teardown(oom_and_injected_faults_become_cuda_errors_and_state_stays_intact,
                                release_last_run),
      cmocka_unit_test_teardown(driver_api_allocations_are_served_by_gca, release_last_run),
      cmocka_unit_test_teardown(memory_of_destroyed_streams_is_released_without_naming_them,
                                release_last_run),
      cmocka_unit_test_teardown(pinned_host_calls_are_served_and_malloc_stays_glibcs,
                                release_last_run),
      cmocka_unit_test_teardown(allocation_in_another_library_constructor_is_served,
                                release_last_run),
      cmocka_unit_test_teardown(trace_records_the_program_allocations, release_last_run),
      cmocka_unit_test_teardown(cuda_driver_frees_reach_the_driver_loaded_rtld_local,
                                release_last_run),
      cmocka_unit_test_teardown(cuda_frees_inside_gca_memory_are_refused_not_forwarded,
                                release_last_run),
      cmocka_unit_test_teardown(cuda_program_captures_keep_the_allocators_waits_away,
                                release_last_run),
      cmocka_unit_test_teardown(shim_exports_cuda_entry_points_only, release_last_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
