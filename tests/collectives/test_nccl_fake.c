/* SPDX-License-Identifier: Apache-2.0 */
/* test_nccl_fake.c - the NCCL backend against a pretend libnccl
 * (fake_libnccl.c) on the cuda device backend over the pretend driver
 * (tests/device/fake_libcuda.c): collectives reach NCCL with NCCL's dtype and
 * op values and the caller's stream, groups bracket NCCL's, registration
 * needs 2.19 and says so, a library too old or missing is refused with the
 * reason, NCCL's failures carry its strings and last error, an ncclComm_t
 * the caller owns is wrapped and left alone. Each case runs in a child
 * (the backends are chosen once per process). */
#include <dlfcn.h>

#include "device/child.h"

typedef struct fake_id {
  char b[128];
} fake_id_t;

typedef int (*calls_fn)(const char *);
typedef const char *(*last_fn)(size_t *, int *, int *, const void **, void **, void **);

static int calls(const char *what) {
  void *lib = dlopen(getenv("GCA_NCCL_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  calls_fn f = lib ? (calls_fn)dlsym(lib, "fake_nccl_calls") : NULL;
  return f ? f(what) : -1;
}

static const char *last(size_t *count, int *dtype, int *op, void **stream) {
  void *lib = dlopen(getenv("GCA_NCCL_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  last_fn f = lib ? (last_fn)dlsym(lib, "fake_nccl_last") : NULL;
  const void *s;
  void *rv;
  return f ? f(count, dtype, op, &s, &rv, stream) : "";
}

static void run(const char *const *extra, child_fn fn) {
  const char *cuda = getenv("GCA_TEST_FAKE_CUDA"), *nccl = getenv("GCA_TEST_FAKE_NCCL");
  if (!cuda || !nccl) {
    printf("SKIP: GCA_TEST_FAKE_CUDA or GCA_TEST_FAKE_NCCL is not set\n");
    skip();
  }
  const char *env[16] = {"GCA_DEVICE", "cuda", "GCA_CUDA_LIBRARY", cuda, "GCA_NCCL_LIBRARY", nccl};
  size_t n = 6;
  for (size_t i = 0; extra && extra[i]; i += 2) {
    env[n++] = extra[i];
    env[n++] = extra[i + 1];
  }
  env[n] = NULL;
  run_child(env, fn, NULL, 0);
}

static int child_collectives_reach_nccl(report_t *r) {
  gca_comm_t *c = NULL;
  int dev = 0;
  EXPECT_OK(r, gca_comm_create_all(1, &dev, NULL, &c));
  gca_comm_backend_t be;
  EXPECT_OK(r, gca_comm_backend_of(c, &be));
  CHECK(r, be == GCA_COMM_BACKEND_NCCL);
  gca_stream_t s = NULL;
  EXPECT_OK(r, gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *a = (void *)(uintptr_t)0x10000, *b = (void *)(uintptr_t)0x20000;
  size_t count;
  int dtype, op;
  void *stream;
  EXPECT_OK(r, gca_all_reduce(a, b, 64, GCA_DTYPE_BF16, GCA_REDUCE_AVG, c, s));
  CHECK(r, strcmp(last(&count, &dtype, &op, &stream), "ncclAllReduce") == 0);
  CHECK(r, count == 64 && dtype == 9 && op == 4 && stream == (void *)s);
  EXPECT_OK(r, gca_group_start());
  EXPECT_OK(r, gca_all_gather(a, b, 7, GCA_DTYPE_U8, c, s));
  CHECK(r, strcmp(last(&count, &dtype, &op, &stream), "ncclAllGather") == 0 && dtype == 1);
  EXPECT_OK(r, gca_reduce_scatter(a, b, 5, GCA_DTYPE_I64, GCA_REDUCE_MAX, c, s));
  CHECK(r, strcmp(last(&count, &dtype, &op, &stream), "ncclReduceScatter") == 0);
  CHECK(r, count == 5 && dtype == 4 && op == 2);
  EXPECT_OK(r, gca_group_end());
  CHECK(r, calls("group_start") == 1 && calls("group_end") == 1);
  void *h = NULL;
  EXPECT_OK(r, gca_comm_register(c, a, 4096, &h));
  EXPECT_OK(r, gca_comm_deregister(c, h));
  CHECK(r, calls("register") == 1 && calls("deregister") == 1);
  gca_comm_stats_t st = {.size = sizeof(st)};
  EXPECT_OK(r, gca_comm_stats(c, &st));
  CHECK(r, st.collectives == 3 && st.registrations == 0 && st.registrations_total == 1);
  EXPECT_OK(r, gca_comm_async_error(c));
  EXPECT_OK(r, gca_comm_destroy(c));
  CHECK(r, calls("destroy") == 1);
  EXPECT_OK(r, gca_stream_destroy(s));
  return CHILD_PASS;
}

static void collectives_reach_nccl_with_its_values(void **state) {
  (void)state;
  run(NULL, child_collectives_reach_nccl);
}

/* A comm pool on the NCCL backend: each segment the allocator creates is
 * registered with ncclCommRegister before a block of it is handed out, once,
 * and deregistered with ncclCommDeregister before the driver frees it. */
static int child_comm_pool(report_t *r) {
  gca_comm_t *c = NULL;
  int dev = 0;
  EXPECT_OK(r, gca_comm_create_all(1, &dev, NULL, &c));
  gca_stream_t s = NULL;
  EXPECT_OK(r, gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = NULL;
  EXPECT_OK(r, gca_comm_pool_create(c, NULL, &pool));
  void *p = NULL, *q = NULL;
  EXPECT_OK(r, gca_pool_use_begin(pool));
  EXPECT_OK(r, gca_malloc(&p, 3 << 20, s));
  CHECK(r, calls("register") == 1);
  for (int i = 0; i < 10; i++) { /* the cached block: no new registration */
    EXPECT_OK(r, gca_free(p));
    EXPECT_OK(r, gca_malloc(&p, 3 << 20, s));
  }
  EXPECT_OK(r, gca_malloc(&q, 30 << 20, s)); /* a second segment */
  EXPECT_OK(r, gca_pool_use_end(pool));
  CHECK(r, calls("register") == 2 && calls("deregister") == 0);
  gca_comm_stats_t st = {.size = sizeof(st)};
  EXPECT_OK(r, gca_comm_stats(c, &st));
  CHECK(r, st.registrations == 2 && st.registrations_total == 2);
  EXPECT_OK(r, gca_free(p));
  EXPECT_OK(r, gca_free(q));
  EXPECT_OK(r, gca_stream_synchronize(s));
  EXPECT_OK(r, gca_pool_release(pool)); /* the pool dies: its segments go back */
  CHECK(r, calls("deregister") == 2);
  EXPECT_OK(r, gca_comm_stats(c, &st));
  CHECK(r, st.registrations == 0 && st.deregistrations_total == 2);
  EXPECT_OK(r, gca_comm_destroy(c));
  EXPECT_OK(r, gca_stream_destroy(s));
  return CHILD_PASS;
}

static void a_comm_pool_registers_its_segments_with_nccl(void **state) {
  (void)state;
  run(NULL, child_comm_pool);
}

static int child_failures(report_t *r) {
  gca_comm_t *c = NULL;
  int dev = 0;
  EXPECT_OK(r, gca_comm_create_all(1, &dev, NULL, &c));
  void *a = (void *)(uintptr_t)0x10000;
  EXPECT(r, gca_all_gather(a, a, 8, GCA_DTYPE_F32, c, GCA_STREAM_LEGACY), GCA_ERR_DRIVER,
         "all_gather: ncclAllGather failed: internal error (3): fake: injected failure in "
         "ncclAllGather");
  EXPECT_OK(r, gca_all_reduce(a, a, 8, GCA_DTYPE_F32, GCA_REDUCE_SUM, c, GCA_STREAM_LEGACY));
  EXPECT(r, gca_comm_async_error(c), GCA_ERR_DRIVER,
         "unhandled system error (2): fake: a peer went away");
  EXPECT_OK(r, gca_comm_abort(c));
  CHECK(r, calls("abort") == 1);
  return CHILD_PASS;
}

static void nccl_failures_carry_its_strings(void **state) {
  (void)state;
  const char *env[] = {"FAKE_NCCL_FAIL", "ncclAllGather", "FAKE_NCCL_ASYNC", "1", NULL};
  run(env, child_failures);
}

static int child_registration_off(report_t *r) {
  gca_comm_t *c = NULL;
  int dev = 0;
  EXPECT_OK(r, gca_comm_create_all(1, &dev, NULL, &c));
  void *h = NULL;
  EXPECT(r, gca_comm_register(c, (void *)(uintptr_t)0x10000, 4096, &h), GCA_ERR_NOT_SUPPORTED,
         "needs NCCL 2.19 or later (this is 2.18.3)");
  CHECK(r, calls("register") == 0);
  EXPECT_OK(r, gca_comm_destroy(c));
  return CHILD_PASS;
}

static void registration_needs_nccl_2_19(void **state) {
  (void)state;
  const char *env[] = {"FAKE_NCCL_VERSION", "21803", NULL};
  run(env, child_registration_off);
}

static int child_too_old(report_t *r) {
  gca_comm_t *c = NULL;
  int dev = 0;
  EXPECT(r, gca_comm_create_all(1, &dev, NULL, &c), GCA_ERR_NOT_SUPPORTED, "NCCL 2.9.3");
  EXPECT(r, gca_comm_create_all(1, &dev, NULL, &c), GCA_ERR_NOT_SUPPORTED, "older than 2.10");
  return CHILD_PASS;
}

static void an_old_nccl_is_refused_with_its_version(void **state) {
  (void)state;
  const char *env[] = {"FAKE_NCCL_VERSION", "20903", NULL};
  run(env, child_too_old);
}

static int child_missing(report_t *r) {
  gca_comm_t *c = NULL;
  gca_comm_id_t id;
  EXPECT(r, gca_comm_get_unique_id(&id), GCA_ERR_NOT_SUPPORTED,
         "cannot load the NCCL library /nonexistent/libnccl.so.2");
  int dev = 0;
  EXPECT(r, gca_comm_create_all(1, &dev, NULL, &c), GCA_ERR_NOT_SUPPORTED, "cannot load");
  return CHILD_PASS;
}

static void a_missing_library_is_refused_naming_it(void **state) {
  (void)state;
  const char *env[] = {"GCA_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", NULL};
  run(env, child_missing);
}

static int child_wrap(report_t *r) {
  void *lib = dlopen(getenv("GCA_NCCL_LIBRARY"), RTLD_NOW | RTLD_LOCAL);
  CHECK(r, lib != NULL);
  int (*init)(void **, int, fake_id_t, int) =
      (int (*)(void **, int, fake_id_t, int))dlsym(lib, "ncclCommInitRank");
  int (*destroy)(void *) = (int (*)(void *))dlsym(lib, "ncclCommDestroy");
  CHECK(r, init && destroy);
  void *nc = NULL;
  fake_id_t id = {{0}};
  CHECK(r, init(&nc, 8, id, 3) == 0);
  gca_comm_t *c = NULL;
  EXPECT_OK(r, gca_comm_wrap_nccl(nc, 0, &c));
  int rank = -1, n = -1;
  EXPECT_OK(r, gca_comm_rank(c, &rank));
  EXPECT_OK(r, gca_comm_count(c, &n));
  CHECK(r, rank == 3 && n == 8);
  EXPECT_OK(r, gca_comm_destroy(c));
  CHECK(r, calls("destroy") == 0); /* the caller's communicator stays */
  CHECK(r, destroy(nc) == 0);
  EXPECT(r, gca_comm_wrap_nccl(NULL, 0, &c), GCA_ERR_INVALID_ARGUMENT, "NULL");
  return CHILD_PASS;
}

static void a_callers_nccl_communicator_is_wrapped_and_left_alone(void **state) {
  (void)state;
  run(NULL, child_wrap);
}

static int child_register_fails(report_t *r) {
  gca_comm_t *c = NULL;
  int dev = 0;
  EXPECT_OK(r, gca_comm_create_all(1, &dev, NULL, &c));
  void *h = NULL;
  EXPECT(r, gca_comm_register(c, (void *)(uintptr_t)0x10000, 4096, &h), GCA_ERR_DRIVER,
         "comm_register: ncclCommRegister failed: internal error (3): fake: injected failure in "
         "ncclCommRegister");
  gca_comm_stats_t st = {.size = sizeof(st)};
  EXPECT_OK(r, gca_comm_stats(c, &st));
  CHECK(r, st.registrations == 0 && st.registrations_total == 0);
  EXPECT_OK(r, gca_comm_destroy(c));
  return CHILD_PASS;
}

static void a_failed_registration_is_nccls_error_and_counts_nothing(void **state) {
  (void)state;
  const char *env[] = {"FAKE_NCCL_FAIL", "ncclCommRegister", NULL};
  run(env, child_register_fails);
}

static int child_init_fails(report_t *r) {
  gca_comm_t *c = NULL;
  int dev = 0;
  EXPECT(r, gca_comm_create_all(1, &dev, NULL, &c), GCA_ERR_DRIVER,
         "ncclCommInitAll failed: internal error (3)");
  CHECK(r, calls("init") == 0);
  return CHILD_PASS;
}

static void a_failed_initialization_is_nccls_error(void **state) {
  (void)state;
  const char *env[] = {"FAKE_NCCL_FAIL", "ncclCommInitAll", NULL};
  run(env, child_init_fails);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(collectives_reach_nccl_with_its_values),
      cmocka_unit_test(a_comm_pool_registers_its_segments_with_nccl),
      cmocka_unit_test(nccl_failures_carry_its_strings),
      cmocka_unit_test(registration_needs_nccl_2_19),
      cmocka_unit_test(an_old_nccl_is_refused_with_its_version),
      cmocka_unit_test(a_missing_library_is_refused_naming_it),
      cmocka_unit_test(a_callers_nccl_communicator_is_wrapped_and_left_alone),
      cmocka_unit_test(a_failed_registration_is_nccls_error_and_counts_nothing),
      cmocka_unit_test(a_failed_initialization_is_nccls_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
