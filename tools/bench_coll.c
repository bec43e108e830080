/* SPDX-License-Identifier: Apache-2.0 */
/* bench_coll.c - gca-bench-coll: a synthetic FSDP step (64 parameters of
 * mixed sizes; an all-gather of each shard, then a reduce-scatter of each
 * gradient) on 4 sim ranks, unbucketed and bucketed at caps of 25 MB, 500 MB
 * and 2000 MB: collectives issued per step and rank, their modelled
 * communication time (latency + ring bytes / bandwidth, the sim's cost
 * model, one latency per bucket) and registrations made per step after the
 * first.
 *
 * The one idea: the same step runs for real through the bucketer on sim
 * ranks (three steps, the registrations counted before and after), and the
 * time is the cost model's, so the figures are exact and repeatable. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "util.h"

#define RANKS  4
#define PARAMS 64

typedef struct cfg_result {
  size_t cap;
  size_t collectives;
  double modelled_us;
  double registrations_per_step;
  uint64_t registrations_at_finalize; /* rank 0: one per comm-pool segment */
  size_t pool_reserved, pool_live;    /* rank 0's comm pools: segments, bucket buffers */
} cfg_result_t;

static size_t param_elems(int p) { /* 1 Ki .. 1 Mi floats, mixed */
  static const size_t sizes[] = {1024, 262144, 4096, 65536, 1048576, 16384, 131072, 2048};
  return sizes[p % 8] + (size_t)(p * 256);
}

/* The sim's cost of one collective moving `bytes` per rank's input. */
static double cost_us(gca_coll_kind_t kind, double bytes, double lat_us, double gbps) {
  double n = RANKS, moved = kind == GCA_COLL_ALL_GATHER ? bytes * (n - 1) : bytes * (n - 1) / n;
  return lat_us + moved / gbps / 1000.0;
}

static gca_status_t run_cfg(gca_comm_t **comms, gca_stream_t *s, void *(*bufs)[2 * PARAMS],
                            size_t cap, cfg_result_t *out) {
  gca_bucketer_t *b[RANKS] = {NULL};
  gca_status_t st = GCA_OK;
  memset(out, 0, sizeof(*out));
  out->cap = cap;
  gca_comm_stats_t s0 = {.size = sizeof(s0)};
  st = gca_comm_stats(comms[0], &s0);
  for (int r = 0; r < RANKS && st == GCA_OK; r++) {
    gca_bucketer_options_t o = GCA_BUCKETER_OPTIONS_INIT;
    o.cap_bytes = cap;
    st = gca_bucketer_create(&o, &b[r]);
    for (int p = 0; p < PARAMS && st == GCA_OK; p++) /* forward: gather each layer */
      st = gca_bucketer_add(b[r], comms[r], GCA_COLL_ALL_GATHER, bufs[r][2 * p], bufs[r][2 * p + 1],
                            param_elems(p) / RANKS, GCA_DTYPE_F32, GCA_REDUCE_SUM, NULL, 0, NULL);
    for (int p = PARAMS - 1; p >= 0 && st == GCA_OK; p--) /* backward: scatter the grads */
      st = gca_bucketer_add(b[r], comms[r], GCA_COLL_REDUCE_SCATTER, bufs[r][2 * p + 1],
                            bufs[r][2 * p], param_elems(p) / RANKS, GCA_DTYPE_F32, GCA_REDUCE_SUM,
                            NULL, 0, NULL);
    if (st == GCA_OK)
      st = gca_bucketer_finalize(b[r], s[r]);
  }
  gca_comm_stats_t s1 = {.size = sizeof(s1)}, s3 = {.size = sizeof(s3)};
  for (int step = 0; step < 3 && st == GCA_OK; step++) {
    for (int r = 0; r < RANKS && st == GCA_OK; r++)
      st = gca_bucketer_run(b[r], s[r]);
    for (int r = 0; r < RANKS && st == GCA_OK; r++)
      st = gca_stream_synchronize(s[r]);
    if (st == GCA_OK && step == 0)
      st = gca_comm_stats(comms[0], &s1);
  }
  if (st == GCA_OK)
    st = gca_comm_stats(comms[0], &s3);
  if (st == GCA_OK)
    st = gca_comm_async_error(comms[0]);
  if (st == GCA_OK) {
    size_t nb = 0;
    st = gca_bucketer_bucket_count(b[0], &nb);
    out->collectives = nb;
    out->registrations_per_step = (double)(s3.registrations_total - s1.registrations_total) / 2;
    out->registrations_at_finalize = s1.registrations_total - s0.registrations_total;
    if (st == GCA_OK)
      st = gca_bucketer_memory(b[0], &out->pool_reserved, &out->pool_live);
    /* the model, bucket by bucket, from the layout */
    size_t last = (size_t)-1;
    for (size_t i = 0; i < 2 * PARAMS && st == GCA_OK; i++) {
      size_t bk, off;
      void *buf;
      st = gca_bucketer_layout(b[0], i, &bk, &buf, &off);
      int p = i < PARAMS ? (int)i : (int)(2 * PARAMS - 1 - i);
      double bytes = (double)(param_elems(p) / RANKS) * 4 * (i < PARAMS ? 1 : RANKS);
      gca_coll_kind_t kind = i < PARAMS ? GCA_COLL_ALL_GATHER : GCA_COLL_REDUCE_SCATTER;
      out->modelled_us += cost_us(kind, bytes, bk == last ? 0 : 20.0, 100.0);
      last = bk;
    }
  }
  for (int r = 0; r < RANKS; r++)
    gca_bucketer_destroy(b[r]);
  return st;
}

int main(int argc, char **argv) {
  bool json = argc > 1 && strcmp(argv[1], "--json") == 0;
  if (argc > 1 && !json) {
    fprintf(strcmp(argv[1], "--help") == 0 ? stdout : stderr, "usage: gca-bench-coll [--json]\n");
    return strcmp(argv[1], "--help") == 0 ? 0 : 2;
  }
  if (!getenv("GCA_SIM_DEVICES"))
    setenv("GCA_SIM_DEVICES", "4", 1);
  int devs[RANKS] = {0, 1, 2, 3};
  gca_comm_t *comms[RANKS];
  gca_stream_t s[RANKS];
  static void *bufs[RANKS][2 * PARAMS];
  gca_comm_options_t co = GCA_COMM_OPTIONS_INIT;
  co.latency_us = 20;
  co.bandwidth_gbps = 100;
  gca_status_t st = gca_comm_create_all(RANKS, devs, &co, comms);
  for (int r = 0; r < RANKS && st == GCA_OK; r++) {
    st = gca_set_device(r);
    if (st == GCA_OK)
      st = gca_stream_create(&s[r], GCA_STREAM_NON_BLOCKING);
    for (int p = 0; p < PARAMS && st == GCA_OK; p++) {
      size_t e = param_elems(p) / RANKS * RANKS;
      st = gca_malloc_device(r, &bufs[r][2 * p], e / RANKS * 4, s[r]);
      if (st == GCA_OK)
        st = gca_malloc_device(r, &bufs[r][2 * p + 1], e * 4, s[r]);
      if (st == GCA_OK)
        st = gca_memset_d32_async(bufs[r][2 * p], 0x3f800000u, e / RANKS, s[r]);
    }
  }
  static const size_t caps[] = {1, (size_t)25 << 20, (size_t)500 << 20, (size_t)2000 << 20};
  cfg_result_t res[4];
  for (int k = 0; k < 4 && st == GCA_OK; k++)
    st = run_cfg(comms, s, bufs, caps[k], &res[k]);
  if (st != GCA_OK) {
    fprintf(stderr, "gca-bench-coll: %s\n", gca_last_error());
    return 1;
  }
  if (json) {
    printf("{\"ranks\": %d, \"parameters\": %d, \"configs\": [", RANKS, PARAMS);
    for (int k = 0; k < 4; k++)
      printf("%s{\"cap_bytes\": %zu, \"bucketed\": %s, \"collectives_per_step\": %zu, "
             "\"modelled_comm_us\": %.1f, \"registrations_per_step\": %.1f, "
             "\"registrations_at_finalize\": %llu, \"comm_pool_reserved_bytes\": %zu, "
             "\"comm_pool_live_bytes\": %zu, \"comm_pool_reserved_over_live\": %.4f}",
             k ? ", " : "", k ? caps[k] : 0, k ? "true" : "false", res[k].collectives,
             res[k].modelled_us, res[k].registrations_per_step,
             (unsigned long long)res[k].registrations_at_finalize, res[k].pool_reserved,
             res[k].pool_live,
             res[k].pool_live ? (double)res[k].pool_reserved / (double)res[k].pool_live : 0.0);
    printf("]}\n");
  } else {
    printf("gca-bench-coll: %d parameters, %d sim ranks, 20 us + bytes / 100 GB/s per collective\n",
           PARAMS, RANKS);
    printf("  %-12s %14s %18s %22s %14s %24s\n", "cap", "collectives", "modelled comm ms",
           "registrations/step", "at finalize", "comm pool reserved/live");
    for (int k = 0; k < 4; k++) {
      char b[32];
      char r[32], l[32], ratio[96] = "-";
      if (res[k].pool_live)
        snprintf(ratio, sizeof(ratio), "%s / %s = %.3f",
                 tool_format_size(res[k].pool_reserved, r, sizeof(r)),
                 tool_format_size(res[k].pool_live, l, sizeof(l)),
                 (double)res[k].pool_reserved / (double)res[k].pool_live);
      printf("  %-12s %14zu %18.3f %22.1f %14llu %24s\n",
             k ? tool_format_size(caps[k], b, sizeof(b)) : "unbucketed", res[k].collectives,
             res[k].modelled_us / 1e3, res[k].registrations_per_step,
             (unsigned long long)res[k].registrations_at_finalize, ratio);
    }
  }
  for (int r = 0; r < RANKS; r++) {
    gca_stream_synchronize(s[r]);
    for (int i = 0; i < 2 * PARAMS; i++)
      gca_free(bufs[r][i]);
    gca_stream_destroy(s[r]);
    gca_comm_destroy(comms[r]);
  }
  return 0;
}
