/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_snapshot.c - fuzz target for gca-snapshot's loader and renderers, with
 * its seed and tokens for the standalone driver (fuzz_driver.h).
 *
 * The one idea: whatever the bytes, loading either fails with a parse error
 * whose detail starts with "snapshot: ", or gives a model whose totals add up
 * (by state, reserved, the timeline walked forward from its start lands on
 * every event's totals) and that both renderers draw. Built with
 * -fsanitize=fuzzer it is a libFuzzer target; linked with fuzz_driver.c it
 * runs over tests/tools/corpus_snapshot/ in the default suite, under the
 * sanitizers too.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_driver.h"
#include "snapshot_model.h"

static void die(const char *what) {
  fprintf(stderr, "fuzz_snapshot: %s (last error: %s)\n", what, tool_last_error());
  abort();
}

static void check_model(const snapshot_t *s) {
  uint64_t by_state[SNAP_STATES] = {0}, count[SNAP_STATES] = {0}, reserved = 0;
  size_t next_block = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    const snap_segment_t *sg = &s->segments[i];
    if (sg->first_block != next_block || sg->nblocks > s->nblocks - next_block)
      die("segments do not partition the blocks");
    next_block += sg->nblocks;
    if (sg->total_size > (uint64_t)INT64_MAX || sg->address > (uint64_t)INT64_MAX)
      die("a segment's size or address is beyond int64");
    reserved += sg->total_size;
  }
  if (next_block != s->nblocks || reserved != s->reserved || reserved > (uint64_t)INT64_MAX)
    die("segments and blocks do not add up");
  for (size_t i = 0; i < s->nblocks; i++) {
    const snap_block_t *b = &s->blocks[i];
    if ((unsigned)b->state >= SNAP_STATES || b->segment >= s->nsegments)
      die("a block has a bad state or segment");
    by_state[b->state] += b->size;
    count[b->state]++;
  }
  for (int k = 0; k < SNAP_STATES; k++)
    if (by_state[k] != s->by_state[k] || count[k] != s->count_by_state[k])
      die("totals by state do not add up");
  for (size_t d = 0; d < s->ntraces; d++) {
    const snap_trace_t *t = &s->traces[d];
    int64_t alloc = t->allocated_before, res = t->reserved_before;
    for (size_t i = 0; i < t->nevents; i++) {
      const snap_event_t *e = &t->events[i];
      int64_t sz = (int64_t)e->size;
      if (e->size > (uint64_t)INT64_MAX)
        die("an event's size is beyond int64");
      int64_t da = e->action == SNAP_EV_ALLOC ? sz : e->action == SNAP_EV_FREE_REQUESTED ? -sz : 0;
      int64_t dr = (e->action == SNAP_EV_SEGMENT_ALLOC || e->action == SNAP_EV_SEGMENT_MAP)    ? sz
                   : (e->action == SNAP_EV_SEGMENT_FREE || e->action == SNAP_EV_SEGMENT_UNMAP) ? -sz
                                                                                               : 0;
      if (__builtin_add_overflow(alloc, da, &alloc) || __builtin_add_overflow(res, dr, &res))
        die("the timeline overflows int64");
      if (alloc != e->allocated_after || res != e->reserved_after)
        die("the timeline does not land on an event's totals");
      if (alloc > t->peak_allocated || res > t->peak_reserved)
        die("a peak is below a point of the timeline");
    }
  }
  size_t idx[8];
  size_t n = gca__snapshot_largest(s, idx, 8);
  for (size_t i = 1; i < n; i++)
    if (s->blocks[idx[i]].size > s->blocks[idx[i - 1]].size)
      die("largest blocks out of order");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  snapshot_t s;
  gca_status_t st = gca__snapshot_load((const char *)data, size, &s);
  if (st != GCA_OK) {
    if (st != GCA_ERR_PARSE && st != GCA_ERR_OUT_OF_MEMORY)
      die("unexpected status");
    if (strncmp(tool_last_error(), "snapshot: ", 10) != 0)
      die("error detail does not start with 'snapshot: '");
    return 0;
  }
  check_model(&s);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (f) {
    gca__snapshot_write_text(&s, 4, f);
    if (gca__snapshot_write_html(&s, (const char *const[]){"fuzz <&>"}, 1, 4, f) != GCA_OK)
      die("the HTML renderer failed on a loaded snapshot");
    fclose(f);
    free(text);
  }
  gca__snapshot_free(&s);
  return 0;
}

static const char *const builtin_seeds[] = {
    "{\"segments\": [{\"address\": 4096, \"total_size\": 2097152, \"blocks\": [{\"address\": "
    "4096, \"size\": 2097152, \"state\": \"active_allocated\", \"frames\": [\"f\"]}]}], "
    "\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 4096, \"size\": 2097152}]]}",
};

/* Tokens that matter to the loader: inserted whole, they reach deeper than
 * random bytes do. */
static const char *const tokens[] = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "-1",
    "0",
    "1e308",
    "0.5",
    "\"0x\"",
    "\"-0x1\"",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "\"0xffffffffffffffff\"",
    "\"0x7fffffffffffffff\"",
    "4611686018427387904",
    "\"size\": ",
    "\"total_size\": ",
    "\"requested_size\": ",
    "\"address\": ",
    "\"addr\": ",
    "\"state\": \"active_allocated\"",
    "\"state\": \"inactive\"",
    "\"action\": \"alloc\"",
    "\"action\": \"free_requested\"",
    "\"action\": \"segment_map\"",
    "\"blocks\": []",
    "\"frames\": [{\"name\": \"<x>\", \"line\": 1}]",
    "\"time_us\": 2",
    "\"device\": 3",
};

const fuzz_target_t fuzz_target = {
    .name = "fuzz_snapshot",
    .seeds = builtin_seeds,
    .nseeds = TOOL_ARRAY_SIZE(builtin_seeds),
    .max_input = 64u << 10,
    .alphabet = "0123456789", /* numbers change and grow */
    .words = tokens,
    .nwords = TOOL_ARRAY_SIZE(tokens),
    .max_run = 256, /* repeated members, elements and events */
    .max_copies = 1,
};
