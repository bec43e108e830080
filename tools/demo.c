/* SPDX-License-Identifier: Apache-2.0 */
/* demo.c - gca-demo: a short tour of gca on the default backend (cuda when a
 * GPU and driver are present, else the sim backend), printing what happened:
 * the device, a cached allocation that costs no driver call, stream-ordered
 * reuse across streams, statistics, and a captured graph replayed on data.
 *
 * Exit status 0 when every step behaved as described, 1 otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <getopt.h>

#include "gca.h"
#include "util.h"

static int failures;

#define STEP_OK(call)                                                               \
  do {                                                                              \
    gca_status_t st_ = (call);                                                      \
    if (st_ != GCA_OK) {                                                            \
      fprintf(stderr, "gca-demo: %s failed: %s: %s\n", #call, gca_status_name(st_), \
              gca_last_error());                                                    \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

static void expect(int cond, const char *what) {
  printf("  [%s] %s\n", cond ? "ok" : "FAILED", what);
  if (!cond)
    failures++;
}

static int64_t device_calls(const gca_stats_t *s) {
  return s->num_device_alloc + s->num_device_free;
}

static void usage(FILE *f) {
  fprintf(f, "usage: gca-demo [--help]\n"
             "A short tour of gca on the default backend (GCA_DEVICE=cuda|sim|auto).\n");
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
    if (c == 'h') {
      usage(stdout);
      return 0;
    }
    usage(stderr);
    return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "gca-demo: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  char buf[64];
  setvbuf(stdout, NULL, _IOLBF, 0);
  STEP_OK(gca_device_init());
  int ndev = 0;
  STEP_OK(gca_device_count(&ndev));
  char name[128] = "";
  STEP_OK(gca_device_name(0, name, sizeof(name)));
  size_t free_b = 0, total_b = 0;
  STEP_OK(gca_mem_get_info(&free_b, &total_b));
  printf("gca %s on the %s backend: %d device(s); device 0 is \"%s\" with %s\n",
         gca_version_string(), gca_device_backend_name(), ndev, name,
         tool_format_size(total_b, buf, sizeof(buf)));

  gca_stream_t s1, s2;
  STEP_OK(gca_stream_create(&s1, GCA_STREAM_NON_BLOCKING));
  STEP_OK(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));

  printf(
      "\n1. A first allocation reaches the driver; after a free, the same size is served from the "
      "cache.\n");
  gca_stats_t st;
  void *a = NULL;
  STEP_OK(gca_malloc(&a, 3 << 20, s1));
  STEP_OK(gca_get_stats(0, &st));
  int64_t calls_before = device_calls(&st);
  expect(st.num_device_alloc >= 1, "the first 3 MiB allocation made a device allocation");
  STEP_OK(gca_free(a));
  void *b = NULL;
  STEP_OK(gca_malloc(&b, 3 << 20, s1));
  STEP_OK(gca_get_stats(0, &st));
  expect(b == a, "the freed block was handed out again on the same stream");
  expect(device_calls(&st) == calls_before, "the cached allocation made no device call");

  printf("\n2. A block used on a second stream is not reused until that stream's work is done.\n");
  STEP_OK(gca_kernel_sleep(50 * 1000 * 1000, s2)); /* 50 ms of slow work on s2 */
  STEP_OK(gca_kernel_fill_u32(b, 0xC0FFEE, 0, (3 << 20) / 4, s2));
  STEP_OK(gca_record_stream(b, s2));
  STEP_OK(gca_free(b));
  void *c = NULL;
  STEP_OK(gca_malloc(&c, 3 << 20, s1));
  expect(c != b, "while s2 still writes, a new request got a different block");
  STEP_OK(gca_stream_synchronize(s2));
  STEP_OK(gca_free(c));
  void *d = NULL;
  STEP_OK(gca_malloc(&d, 3 << 20, s1));
  expect(d == b || d == c, "once s2 finished, the cached blocks are reusable");
  STEP_OK(gca_free(d));

  printf("\n3. A graph captured on a stream records work and replays it on the data.\n");
  uint32_t *x = NULL, *y = NULL, *z = NULL;
  const size_t n = 1024;
  STEP_OK(gca_malloc((void **)&x, n * 4, s1));
  STEP_OK(gca_malloc((void **)&y, n * 4, s1));
  STEP_OK(gca_malloc((void **)&z, n * 4, s1));
  STEP_OK(gca_kernel_fill_u32(x, 1, 1, n, s1));
  STEP_OK(gca_kernel_fill_u32(y, 100, 0, n, s1));
  STEP_OK(gca_stream_synchronize(s1));
  gca_graph_t graph;
  gca_graph_exec_t exec;
  STEP_OK(gca_stream_begin_capture(s1, GCA_CAPTURE_MODE_THREAD_LOCAL));
  STEP_OK(gca_kernel_add_u32(z, x, y, n, s1));
  STEP_OK(gca_stream_end_capture(s1, &graph));
  STEP_OK(gca_graph_instantiate(&exec, graph));
  uint32_t host[4];
  STEP_OK(gca_memset_d32_async(z, 0, n, s1));
  STEP_OK(gca_graph_launch(exec, s1));
  STEP_OK(gca_memcpy_async(host, z, sizeof(host), s1));
  STEP_OK(gca_stream_synchronize(s1));
  expect(host[0] == 101 && host[3] == 104, "replay computed z = x + y (101, 102, 103, 104, ...)");
  STEP_OK(gca_graph_exec_destroy(exec));
  STEP_OK(gca_graph_destroy(graph));
  STEP_OK(gca_free(x));
  STEP_OK(gca_free(y));
  STEP_OK(gca_free(z));

  printf("\n4. Statistics (PyTorch's names):\n");
  STEP_OK(gca_get_stats(0, &st));
  printf("  allocation: current %" PRId64 ", peak %" PRId64 ", allocated %" PRId64 "\n",
         st.allocation[GCA_STAT_ALL].current, st.allocation[GCA_STAT_ALL].peak,
         st.allocation[GCA_STAT_ALL].allocated);
  printf("  reserved_bytes: current %s, peak %s\n",
         tool_format_size((uint64_t)st.reserved_bytes[GCA_STAT_ALL].current, buf, sizeof(buf)),
         tool_format_size((uint64_t)st.reserved_bytes[GCA_STAT_ALL].peak, buf + 32, 32));
  printf("  num_device_alloc %" PRId64 ", num_device_free %" PRId64 ", num_ooms %" PRId64 "\n",
         st.num_device_alloc, st.num_device_free, st.num_ooms);
  expect(st.allocation[GCA_STAT_ALL].current == 0, "everything allocated was freed");
  STEP_OK(gca_empty_cache());
  STEP_OK(gca_get_stats(0, &st));
  expect(st.reserved_bytes[GCA_STAT_ALL].current == 0, "empty_cache returned every segment");

  STEP_OK(gca_stream_destroy(s1));
  STEP_OK(gca_stream_destroy(s2));
  printf("\n%s\n",
         failures ? "gca-demo: some steps did not behave as expected" : "gca-demo: all steps ok");
  return failures ? 1 : 0;
}
