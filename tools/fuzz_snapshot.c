/* fuzz_snapshot.c - fuzz target for gca-snapshot's loader and renderers, and a
 * standalone driver that runs the same entry point over mutated seeds without
 * libFuzzer.
 *
 * The one idea: whatever the bytes, loading either fails with a parse error
 * whose detail starts with "snapshot: ", or gives a model whose totals add up
 * (by state, reserved, the timeline walked forward from its start lands on
 * every event's totals) and that both renderers draw. Built with
 * -fsanitize=fuzzer it is a libFuzzer target; built with -DGCA_FUZZ_STANDALONE
 * it has a main that mutates a built-in seed and the files named on the
 * command line (tests/tools/corpus_snapshot/) for N iterations from a given
 * seed, so the default suite exercises it under the sanitizers too.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    if (gca__snapshot_write_html(&s, "fuzz <&>", 4, f) != GCA_OK)
      die("the HTML renderer failed on a loaded snapshot");
    fclose(f);
    free(text);
  }
  gca__snapshot_free(&s);
  return 0;
}

#ifdef GCA_FUZZ_STANDALONE

#define MAX_INPUT (64u << 10)

static const char builtin_seed[] =
    "{\"segments\": [{\"address\": 4096, \"total_size\": 2097152, \"blocks\": [{\"address\": "
    "4096, \"size\": 2097152, \"state\": \"active_allocated\", \"frames\": [\"f\"]}]}], "
    "\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 4096, \"size\": 2097152}]]}";

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

static uint64_t rng_state;

static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static void insert(uint8_t *buf, size_t *len, size_t cap, size_t at, const char *s, size_t k) {
  if (*len + k > cap)
    return;
  memmove(buf + at + k, buf + at, *len - at);
  memcpy(buf + at, s, k);
  *len += k;
}

/* Applies one random edit to buf[0, *len). */
static void mutate(uint8_t *buf, size_t *len, size_t cap) {
  size_t n = *len;
  size_t at = n ? rnd() % n : 0;
  switch (rnd() % 6) {
  case 0: /* flip a bit */
    if (n)
      buf[at] ^= (uint8_t)(1u << (rnd() % 8));
    break;
  case 1: { /* insert a token */
    const char *t = tokens[rnd() % TOOL_ARRAY_SIZE(tokens)];
    insert(buf, len, cap, at, t, strlen(t));
    break;
  }
  case 2: { /* delete a run */
    size_t k = n ? 1 + rnd() % (n - at < 32 ? n - at : 32) : 0;
    memmove(buf + at, buf + at + k, n - at - k);
    *len -= k;
    break;
  }
  case 3: { /* duplicate a run (repeated members, elements and events) */
    size_t k = n ? 1 + rnd() % (n - at < 256 ? n - at : 256) : 0;
    insert(buf, len, cap, at, (const char *)buf + at, k);
    break;
  }
  case 4: /* a digit, so numbers change and grow */
    if (n)
      buf[at] = (uint8_t)('0' + rnd() % 10);
    break;
  default: /* truncate */
    *len = at;
    break;
  }
}

static int load_file_seed(const char *path, uint8_t **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  uint8_t *b = malloc(MAX_INPUT);
  size_t n = b ? fread(b, 1, MAX_INPUT / 2, f) : 0;
  fclose(f);
  if (!b)
    return -1;
  *out = b;
  *len = n;
  return 0;
}

int main(int argc, char **argv) {
  uint64_t iterations = 20000, seed = 1;
  double seconds = 2.0;
  uint8_t *seeds[64];
  size_t seed_len[64];
  size_t nseeds = 0;
  seeds[nseeds] = (uint8_t *)(uintptr_t)builtin_seed;
  seed_len[nseeds++] = sizeof(builtin_seed) - 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      seed = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = strtod(argv[++i], NULL);
    } else if (argv[i][0] != '-' && nseeds < TOOL_ARRAY_SIZE(seeds)) {
      if (load_file_seed(argv[i], &seeds[nseeds], &seed_len[nseeds]) != 0) {
        fprintf(stderr, "fuzz_snapshot: cannot read seed file %s\n", argv[i]);
        return 2;
      }
      nseeds++;
    } else {
      fprintf(stderr,
              "usage: fuzz_snapshot [--iterations N] [--seed S] [--seconds T] [SEED_FILE]...\n");
      return 2;
    }
  }
  rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
  printf("fuzz_snapshot: seed %llu, up to %llu iterations or %.1f s, %zu seeds\n",
         (unsigned long long)seed, (unsigned long long)iterations, seconds, nseeds);
  fflush(stdout);
  uint8_t *buf = malloc(MAX_INPUT);
  if (!buf)
    return 1;
  for (size_t i = 0; i < nseeds; i++)
    LLVMFuzzerTestOneInput(seeds[i], seed_len[i]);
  uint64_t start = tool_now_ns(), done = 0;
  for (; done < iterations; done++) {
    if ((done & 63) == 0 && (double)(tool_now_ns() - start) / 1e9 > seconds)
      break;
    size_t s = rnd() % nseeds;
    size_t len = seed_len[s];
    memcpy(buf, seeds[s], len);
    int edits = 1 + (int)(rnd() % 8);
    for (int e = 0; e < edits; e++)
      mutate(buf, &len, MAX_INPUT);
    LLVMFuzzerTestOneInput(buf, len);
  }
  printf("fuzz_snapshot: %llu inputs, no failure\n", (unsigned long long)done);
  free(buf);
  for (size_t i = 1; i < nseeds; i++)
    free(seeds[i]);
  return 0;
}

#endif
