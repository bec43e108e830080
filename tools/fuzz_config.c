/* fuzz_config.c - fuzz target for the allocator's configuration parser
 * (GCA_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF text, gca__config_parse), and a
 * standalone driver that runs the same entry point over seeds and mutations
 * without libFuzzer.
 *
 * The one idea: whatever the text, the parser either accepts it, and then the
 * settings written back by gca__config_format parse to the very same settings,
 * or refuses it with GCA_ERR_CONFIG, a detail, and the settings untouched.
 * Built with -fsanitize=fuzzer it is a libFuzzer target; built with
 * -DGCA_FUZZ_STANDALONE it has a main that runs the seed files named on the
 * command line, then mutates them (and built-in seeds) for N iterations from a
 * printed, settable seed, so the default test suite runs it too.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what, const char *text) {
  fprintf(stderr, "fuzz_config: %s: '%.200s': %s\n", what, text, gca_last_error());
  abort();
}

/* Field by field: padding is not part of the settings. */
static bool same(const gca_alloc_config_t *a, const gca_alloc_config_t *b) {
  return a->max_split_size == b->max_split_size &&
         a->max_non_split_rounding == b->max_non_split_rounding &&
         a->garbage_collection_threshold == b->garbage_collection_threshold &&
         memcmp(a->roundup_power2_divisions, b->roundup_power2_divisions,
                sizeof(a->roundup_power2_divisions)) == 0 &&
         a->expandable_segments == b->expandable_segments &&
         a->release_lock_on_device_alloc == b->release_lock_on_device_alloc &&
         a->pinned_use_host_register == b->pinned_use_host_register &&
         a->pinned_num_register_threads == b->pinned_num_register_threads &&
         a->pinned_use_background_threads == b->pinned_use_background_threads &&
         a->per_process_memory_fraction == b->per_process_memory_fraction &&
         a->graph_capture_record_stream_reuse == b->graph_capture_record_stream_reuse &&
         a->ipc_handles == b->ipc_handles && a->free_cache == b->free_cache &&
         strcmp(a->backend, b->backend) == 0;
}

/* The ranges the parser promises for what it accepts. */
static void check_ranges(const gca_alloc_config_t *c, const char *text) {
  if (c->max_split_size != UINT64_MAX && c->max_split_size <= (20ull << 20))
    die("accepted max_split_size at or below 20 MiB", text);
  if (c->max_non_split_rounding < (20ull << 20))
    die("accepted max_non_split_rounding below 20 MiB", text);
  if (c->garbage_collection_threshold < 0.0 || c->garbage_collection_threshold >= 1.0)
    die("accepted garbage_collection_threshold out of [0, 1)", text);
  if (c->per_process_memory_fraction < 0.0 || c->per_process_memory_fraction > 1.0)
    die("accepted per_process_memory_fraction out of [0, 1]", text);
  uint32_t t = c->pinned_num_register_threads;
  if (t == 0 || t > 128 || (t & (t - 1)) != 0)
    die("accepted pinned_num_register_threads that is not a power of two <= 128", text);
  for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++) {
    uint32_t d = c->roundup_power2_divisions[i];
    if ((d & (d - 1)) != 0)
      die("accepted roundup_power2_divisions that is not a power of two", text);
  }
  if (strcmp(c->backend, "native") != 0)
    die("accepted a backend other than native", text);
}

/* Parses text on top of *base and checks the outcome. */
static void parse_and_check(const char *text, const gca_alloc_config_t *base) {
  gca_alloc_config_t c = *base;
  gca_clear_last_error();
  gca_status_t st = gca__config_parse(text, &c);
  if (st != GCA_OK) {
    if (st != GCA_ERR_CONFIG && st != GCA_ERR_OUT_OF_MEMORY)
      die("unexpected status", text);
    if (gca_last_error()[0] == '\0')
      die("refusal without a detail", text);
    if (!same(&c, base))
      die("a refused text changed the settings", text);
    return;
  }
  check_ranges(&c, text);
  char buf[2048];
  if (gca__config_format(&c, buf, sizeof(buf)) != GCA_OK)
    die("accepted settings do not format", text);
  gca_alloc_config_t back;
  gca__config_defaults(&back);
  if (gca__config_parse(buf, &back) != GCA_OK)
    die("the formatted settings do not parse", buf);
  if (!same(&back, &c))
    die("the formatted settings parse to other settings", text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0'; /* an embedded NUL ends the text, as it does in the environment */
  gca_alloc_config_t base;
  gca__config_defaults(&base);
  parse_and_check(text, &base);
  /* On top of settings that differ from the defaults everywhere. */
  base.max_split_size = 512ull << 20;
  base.garbage_collection_threshold = 0.5;
  base.roundup_power2_divisions[3] = 8;
  base.expandable_segments = true;
  base.pinned_num_register_threads = 4;
  base.per_process_memory_fraction = 0.75;
  base.free_cache = false;
  parse_and_check(text, &base);
  free(text);
  return 0;
}

#ifdef GCA_FUZZ_STANDALONE

#define MAX_INPUT (16u << 10)

static const char *const builtin_seeds[] = {
    "",
    "expandable_segments:True",
    "max_split_size_mb:256,garbage_collection_threshold:0.8",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "roundup_power2_divisions:4,per_process_memory_fraction:0.5,backend:native",
    "pinned_num_register_threads:8,pinned_use_cuda_host_register:True,free_cache:False",
};

/* Pieces the grammar is made of, inserted whole. */
static const char *const words[] = {
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "per_process_memory_fraction",
    "graph_capture_record_stream_reuse",
    "backend",
    "ipc_handles",
    "free_cache",
    "True",
    "False",
    "native",
    "cudaMallocAsync",
    ">",
    "1e-300",
    "18446744073709551616",
    "0.99999999999999999",
    "nan",
    "inf",
};

static const char interesting[] = ",:[]> .0123456789-+eE\t";

static uint64_t rng_state;

static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static void insert(uint8_t *buf, size_t *len, size_t cap, size_t at, const void *src, size_t k) {
  if (*len + k > cap)
    return;
  memmove(buf + at + k, buf + at, *len - at);
  memcpy(buf + at, src, k);
  *len += k;
}

/* Applies one random edit to buf[0, *len). */
static void mutate(uint8_t *buf, size_t *len, size_t cap) {
  size_t n = *len;
  size_t at = n ? rnd() % (n + 1) : 0;
  switch (rnd() % 8) {
  case 0: /* flip a bit */
    if (at < n)
      buf[at] ^= (uint8_t)(1u << (rnd() % 8));
    break;
  case 1: /* overwrite with a character the grammar cares about */
    if (at < n)
      buf[at] = (uint8_t)interesting[rnd() % (sizeof(interesting) - 1)];
    break;
  case 2: { /* insert one */
    uint8_t c = (uint8_t)interesting[rnd() % (sizeof(interesting) - 1)];
    insert(buf, len, cap, at, &c, 1);
    break;
  }
  case 3: { /* insert a word of the grammar */
    const char *w = words[rnd() % GCA_ARRAY_SIZE(words)];
    insert(buf, len, cap, at, w, strlen(w));
    break;
  }
  case 4: { /* delete a run */
    size_t k = at < n ? 1 + rnd() % (n - at < 16 ? n - at : 16) : 0;
    memmove(buf + at, buf + at + k, n - at - k);
    *len -= k;
    break;
  }
  case 5: { /* duplicate a run, often: many items */
    uint8_t run[64];
    size_t k = at < n ? 1 + rnd() % (n - at < 64 ? n - at : 64) : 0;
    memcpy(run, buf + at, k);
    for (int r = (int)(rnd() % 64); r >= 0 && *len + k <= cap; r--)
      insert(buf, len, cap, at, run, k);
    break;
  }
  case 6: /* a long run of one character (over-long tokens) */
    if (rnd() % 4 == 0) {
      uint8_t run[300];
      memset(run, rnd() % 2 ? '7' : 'x', sizeof(run));
      insert(buf, len, cap, at, run, 1 + rnd() % sizeof(run));
    }
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
  for (size_t i = 0; i < GCA_ARRAY_SIZE(builtin_seeds); i++) {
    seeds[nseeds] = (uint8_t *)(uintptr_t)builtin_seeds[i];
    seed_len[nseeds++] = strlen(builtin_seeds[i]);
  }
  size_t nbuiltin = nseeds;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      seed = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = strtod(argv[++i], NULL);
    } else if (argv[i][0] != '-' && nseeds < GCA_ARRAY_SIZE(seeds)) {
      if (load_file_seed(argv[i], &seeds[nseeds], &seed_len[nseeds]) != 0) {
        fprintf(stderr, "fuzz_config: cannot read seed file %s\n", argv[i]);
        return 2;
      }
      nseeds++;
    } else {
      fprintf(stderr,
              "usage: fuzz_config [--iterations N] [--seed S] [--seconds T] [SEED_FILE]...\n");
      return 2;
    }
  }
  rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
  printf("fuzz_config: seed %llu, up to %llu iterations or %.1f s, %zu seeds\n",
         (unsigned long long)seed, (unsigned long long)iterations, seconds, nseeds);
  fflush(stdout);
  uint8_t *buf = malloc(MAX_INPUT);
  if (!buf)
    return 1;
  for (size_t i = 0; i < nseeds; i++)
    LLVMFuzzerTestOneInput(seeds[i], seed_len[i]);
  uint64_t start = gca__now_ns(), done = 0;
  for (; done < iterations; done++) {
    if ((done & 255) == 0 && (double)(gca__now_ns() - start) / 1e9 > seconds)
      break;
    size_t s = rnd() % nseeds;
    size_t len = seed_len[s];
    memcpy(buf, seeds[s], len);
    int edits = 1 + (int)(rnd() % 8);
    for (int e = 0; e < edits; e++)
      mutate(buf, &len, MAX_INPUT);
    LLVMFuzzerTestOneInput(buf, len);
  }
  printf("fuzz_config: %llu inputs, no failure\n", (unsigned long long)done);
  free(buf);
  for (size_t i = nbuiltin; i < nseeds; i++)
    free(seeds[i]);
  return 0;
}

#endif
