/* SPDX-License-Identifier: Apache-2.0 */
/* test_nccl_gpu.c - (suite gpu) a single-rank NCCL communicator on the cuda
 * backend runs each collective on a real device: with one rank, all-gather,
 * reduce-scatter and all-reduce (sum) give back their input. Skips without a
 * GPU or without libnccl. */
#include "support.h"

#define N 4096

int main(void) {
  if (gca_device_init() != GCA_OK || strcmp(gca_device_backend_name(), "cuda") != 0) {
    printf("SKIP: no usable GPU for the cuda backend: %s\n", gca_last_error());
    return 77;
  }
  gca_comm_t *c = NULL;
  int dev = 0;
  gca_status_t st = gca_comm_create_all(1, &dev, NULL, &c);
  if (st == GCA_ERR_NOT_SUPPORTED) {
    printf("SKIP: %s\n", gca_last_error());
    return 77;
  }
  if (st != GCA_OK) {
    fprintf(stderr, "comm_create_all: %s\n", gca_last_error());
    return 1;
  }
  gca_stream_t s = NULL;
  void *a = NULL, *b = NULL;
  float host[N], back[N];
  for (int i = 0; i < N; i++)
    host[i] = (float)i * 0.5f;
  int fails = 0;
  if (gca_stream_create(&s, GCA_STREAM_NON_BLOCKING) != GCA_OK || gca_malloc(&a, sizeof(host), s) ||
      gca_malloc(&b, sizeof(host), s) || gca_memcpy(a, host, sizeof(host))) {
    fprintf(stderr, "setup: %s\n", gca_last_error());
    return 1;
  }
  for (int k = 0; k < 3; k++) {
    gca_memset_d8(b, 0, sizeof(host));
    st = k == 0   ? gca_all_gather(a, b, N, GCA_DTYPE_F32, c, s)
         : k == 1 ? gca_reduce_scatter(a, b, N, GCA_DTYPE_F32, GCA_REDUCE_SUM, c, s)
                  : gca_all_reduce(a, b, N, GCA_DTYPE_F32, GCA_REDUCE_SUM, c, s);
    if (st == GCA_OK)
      st = gca_stream_synchronize(s);
    if (st == GCA_OK)
      st = gca_memcpy(back, b, sizeof(back));
    if (st != GCA_OK || memcmp(back, host, sizeof(host)) != 0) {
      fprintf(stderr, "collective %d: %s: %s\n", k, gca_status_name(st), gca_last_error());
      fails++;
    }
  }
  gca_free(a);
  gca_free(b);
  gca_stream_destroy(s);
  gca_comm_destroy(c);
  printf("nccl on the cuda backend: %d of 3 collectives gave back their input\n", 3 - fails);
  return fails ? 1 : 0;
}
