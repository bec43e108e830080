/* SPDX-License-Identifier: Apache-2.0 */
/* test_backend_select.c - GCA_DEVICE picks the backend: auto falls back to sim
 * with one line on stderr when cuda is unusable, sim is chosen silently, cuda
 * without a driver fails with the no-device message, anything else is a
 * configuration error quoting the value.
 *
 * Selection happens once per process, so each case runs in a forked child
 * with its own GCA_DEVICE and GCA_CUDA_LIBRARY and its stderr sent to a
 * temporary file; the child reports through another file and its exit code
 * (0 passed, 1 failed, 77 skipped). GCA_CUDA_LIBRARY points at a path that
 * does not exist wherever the case needs "no driver", so the cases hold on
 * machines with a GPU too.
 */
#include "child.h"

#define MISSING_LIBRARY "/nonexistent/gca-test/libcuda.so.1"

/* Runs fn in a child with the given GCA_DEVICE and GCA_CUDA_LIBRARY (NULL:
 * unset) and returns what the child wrote to stderr in `err`; a failing or
 * skipping child fails or skips the calling test. */
static void run_in_child(const char *device, const char *library, child_fn fn, char *err,
                         size_t errlen) {
  const char *env[] = {"GCA_DEVICE", device, "GCA_CUDA_LIBRARY", library, NULL};
  run_child(env, fn, err, errlen);
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* ---- children ---- */

/* init succeeds twice, selects sim, and a sim device is usable. */
static int child_expect_sim(report_t *r) {
  for (int round = 0; round < 2; round++) {
    gca_status_t st = gca_device_init();
    if (st != GCA_OK)
      return failf(r, "gca_device_init (call %d) returned %s: %s", round + 1, gca_status_name(st),
                   gca_last_error());
  }
  const char *name = gca_device_backend_name();
  if (!name || strcmp(name, "sim") != 0)
    return failf(r, "backend is '%s', wanted 'sim'", name ? name : "(null)");
  int n = 0;
  gca_status_t st = gca_device_count(&n);
  if (st != GCA_OK || n < 1)
    return failf(r, "gca_device_count returned %s, %d devices: %s", gca_status_name(st), n,
                 gca_last_error());
  return CHILD_PASS;
}

/* init fails with `want` and a detail containing `needle`, the same way twice,
 * and no backend is selected. */
static int expect_failure(report_t *r, gca_status_t want, const char *needle) {
  char first[1024] = "";
  for (int round = 0; round < 2; round++) {
    gca_clear_last_error();
    gca_status_t st = gca_device_init();
    if (st != want)
      return failf(r, "gca_device_init (call %d) returned %s, wanted %s: %s", round + 1,
                   gca_status_name(st), gca_status_name(want), gca_last_error());
    if (!strstr(gca_last_error(), needle))
      return failf(r, "detail '%s' does not mention '%s'", gca_last_error(), needle);
    if (round == 0)
      snprintf(first, sizeof(first), "%s", gca_last_error());
    else if (strcmp(first, gca_last_error()) != 0)
      return failf(r, "second call's detail '%s' differs from the first '%s'", gca_last_error(),
                   first);
  }
  if (gca_device_backend_name() != NULL)
    return failf(r, "backend '%s' selected after a failed init", gca_device_backend_name());
  int n = -1;
  gca_status_t st = gca_device_count(&n);
  if (st != want)
    return failf(r, "gca_device_count after failed init returned %s, wanted %s",
                 gca_status_name(st), gca_status_name(want));
  return CHILD_PASS;
}

static int child_expect_cuda_missing(report_t *r) {
  gca_status_t st = gca__cuda_ops()->init();
  if (st == GCA_ERR_NOT_SUPPORTED)
    return expect_failure(r, GCA_ERR_NOT_SUPPORTED, "built without cuda.h");
  return expect_failure(r, GCA_ERR_NO_DEVICE, MISSING_LIBRARY);
}

static int child_expect_cuda_default(report_t *r) {
  int n = 0;
  if (gca__cuda_ops()->init() == GCA_OK && gca__cuda_ops()->device_count(&n) == GCA_OK && n > 0) {
    snprintf(r->text, sizeof(r->text), "a CUDA driver with a device is present");
    return CHILD_SKIP;
  }
  if (strstr(gca_last_error(), "built without cuda.h"))
    return expect_failure(r, GCA_ERR_NOT_SUPPORTED, "built without cuda.h");
  return expect_failure(r, GCA_ERR_NO_DEVICE, "libcuda.so.1");
}

static int child_expect_config_error(report_t *r) {
  return expect_failure(r, GCA_ERR_CONFIG, "'bogus'");
}

/* ---- tests ---- */

static void assert_one_fallback_line(const char *err) {
  if (count_lines(err) != 1)
    fail_msg("wanted exactly one line on stderr, got: '%s'", err);
  assert_non_null(strstr(err, "sim"));
}

static void auto_without_driver_falls_back_to_sim_with_one_line(void **state) {
  (void)state;
  char err[4096];
  run_in_child("auto", MISSING_LIBRARY, child_expect_sim, err, sizeof(err));
  assert_one_fallback_line(err);
  if (!strstr(err, MISSING_LIBRARY) && !strstr(err, "built without cuda.h"))
    fail_msg("the fallback line does not say why cuda was unusable: '%s'", err);
}

static void unset_device_means_auto(void **state) {
  (void)state;
  char err[4096];
  run_in_child(NULL, MISSING_LIBRARY, child_expect_sim, err, sizeof(err));
  assert_one_fallback_line(err);
}

static void empty_device_means_auto(void **state) {
  (void)state;
  char err[4096];
  run_in_child("", MISSING_LIBRARY, child_expect_sim, err, sizeof(err));
  assert_one_fallback_line(err);
}

static void sim_is_selected_silently(void **state) {
  (void)state;
  char err[4096];
  run_in_child("sim", NULL, child_expect_sim, err, sizeof(err));
  assert_string_equal(err, "");
}

static void device_names_are_case_insensitive(void **state) {
  (void)state;
  char err[4096];
  run_in_child("SIM", NULL, child_expect_sim, err, sizeof(err));
  assert_string_equal(err, "");
}

static void cuda_without_driver_fails_naming_the_library(void **state) {
  (void)state;
  char err[4096];
  run_in_child("cuda", MISSING_LIBRARY, child_expect_cuda_missing, err, sizeof(err));
  assert_string_equal(err, "");
}

static void cuda_without_driver_names_libcuda_by_default(void **state) {
  (void)state;
  char err[4096];
  run_in_child("cuda", NULL, child_expect_cuda_default, err, sizeof(err));
  assert_string_equal(err, "");
}

static void unknown_device_is_config_error_quoting_it(void **state) {
  (void)state;
  char err[4096];
  run_in_child("bogus", MISSING_LIBRARY, child_expect_config_error, err, sizeof(err));
  assert_string_equal(err, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(auto_without_driver_falls_back_to_sim_with_one_line),
      cmocka_unit_test(unset_device_means_auto),
      cmocka_unit_test(empty_device_means_auto),
      cmocka_unit_test(sim_is_selected_silently),
      cmocka_unit_test(device_names_are_case_insensitive),
      cmocka_unit_test(cuda_without_driver_fails_naming_the_library),
      cmocka_unit_test(cuda_without_driver_names_libcuda_by_default),
      cmocka_unit_test(unknown_device_is_config_error_quoting_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
