/* SPDX-License-Identifier: Apache-2.0 */
/* test_ptx_assemble.c - every kernel embedded in the cuda backend (cuda_ptx.h)
 * assembles for a current architecture: the PTX is written to a file and
 * handed to ptxas (-arch=sm_90), which must accept it and define each entry.
 * Without ptxas (no CUDA toolkit: PTXAS unset and none in /usr/local/cuda/bin
 * or PATH) the test is skipped with exit 77. */
#include <sys/stat.h>

#include "support.h"

#include "cuda_ptx.h"

static const char *find_ptxas(void) {
  const char *env = getenv("PTXAS");
  if (env && *env)
    return env;
  static const char *const candidates[] = {"/usr/local/cuda/bin/ptxas", "/opt/cuda/bin/ptxas"};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(candidates); i++)
    if (access(candidates[i], X_OK) == 0)
      return candidates[i];
  char *out = NULL;
  char *const which[] = {"sh", "-c", "command -v ptxas", NULL};
  int rc = test_run_capture(which, &out);
  static char found[512];
  found[0] = '\0';
  if (rc == 0 && out && sscanf(out, "%511s", found) == 1 && access(found, X_OK) == 0) {
    free(out);
    return found;
  }
  free(out);
  return NULL;
}

static const char *ptxas;

static void every_embedded_kernel_assembles_for_sm_90(void **state) {
  (void)state;
  char dir[] = "/tmp/gca-ptx-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char src[600], bin[600];
  snprintf(src, sizeof(src), "%s/kernels.ptx", dir);
  snprintf(bin, sizeof(bin), "%s/kernels.cubin", dir);
  FILE *f = fopen(src, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(gca__cuda_ptx, 1, strlen(gca__cuda_ptx), f), strlen(gca__cuda_ptx));
  assert_int_equal(fclose(f), 0);

  char *out = NULL;
  char *const argv[] = {(char *)ptxas, "-arch=sm_90", src, "-o", bin, NULL};
  int rc = test_run_capture(argv, &out);
  if (rc != 0)
    fail_msg("ptxas exited %d:\n%s", rc, out);
  free(out);
  struct stat st;
  assert_int_equal(stat(bin, &st), 0);
  assert_true(st.st_size > 0);

  /* Each entry the backend looks up is in the module. */
  const char *entries[] = {GCA_PTX_FILL_NAME,   GCA_PTX_ADD_NAME,  GCA_PTX_SLEEP_NAME,
                           GCA_PTX_PHILOX_NAME, GCA_PTX_COPY_NAME, GCA_PTX_GEMM_NAME,
                           GCA_PTX_EW_NAME,     GCA_PTX_DOT_NAME};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(entries); i++) {
    char decl[96];
    snprintf(decl, sizeof(decl), ".visible .entry %s(", entries[i]);
    if (!strstr(gca__cuda_ptx, decl))
      fail_msg("entry %s is not defined in the embedded PTX", entries[i]);
  }
  unlink(src);
  unlink(bin);
  rmdir(dir);
}

int main(void) {
  ptxas = find_ptxas();
  if (!ptxas) {
    printf("SKIP: ptxas not found (set PTXAS or install the CUDA toolkit)\n");
    return 77;
  }
  printf("ptxas: %s\n", ptxas);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_embedded_kernel_assembles_for_sm_90),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
