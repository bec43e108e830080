/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_driver.c - the standalone driver every fuzz target links when it is not
 * built for libFuzzer: options, seed files, a seeded generator, the mutator
 * and the time limit, around the target's LLVMFuzzerTestOneInput.
 *
 * The one idea: a run is a pure function of the seed it prints (and the seed
 * files), so a failure found in the test suite repeats with --seed S. The
 * edits are generic (bits, bytes, runs, truncation); what makes them reach
 * deep into one grammar is the target's own alphabet and words
 * (fuzz_driver.h).
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_driver.h"
#include "util.h"

#define MAX_SEEDS 64

static uint64_t rng_state;

/* xorshift64: quick, and the same sequence on every machine for one seed. */
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

/* Opens k bytes at `at` and fills them from src (NULL: leaves them as they
 * were, which duplicates buf[at, at + k)); false when it would pass cap. */
static bool open_gap(uint8_t *buf, size_t *len, size_t cap, size_t at, const void *src, size_t k) {
  if (*len + k > cap)
    return false;
  memmove(buf + at + k, buf + at, *len - at);
  if (src)
    memcpy(buf + at, src, k);
  *len += k;
  return true;
}

/* Applies one random edit to buf[0, *len). */
static void mutate(const fuzz_target_t *t, uint8_t *buf, size_t *len, size_t cap) {
  size_t n = *len;
  size_t at = rnd() % (n + 1);
  size_t nalpha = t->alphabet ? strlen(t->alphabet) : 0;
  switch (rnd() % 9) {
  case 0: /* flip a bit */
    if (at < n)
      buf[at] ^= (uint8_t)(1u << (rnd() % 8));
    break;
  case 1: /* overwrite with a byte the grammar cares about */
    if (at < n && nalpha)
      buf[at] = (uint8_t)t->alphabet[rnd() % nalpha];
    break;
  case 2: /* insert one */
    if (nalpha)
      open_gap(buf, len, cap, at, &t->alphabet[rnd() % nalpha], 1);
    break;
  case 3: /* insert a word of the grammar */
    if (t->nwords + t->nkeys) {
      size_t k = rnd() % (t->nwords + t->nkeys);
      const char *w = k < t->nwords ? t->words[k] : t->keys[k - t->nwords];
      open_gap(buf, len, cap, at, w, strlen(w));
    }
    break;
  case 4: { /* delete a run */
    size_t most = t->max_run / 4 ? t->max_run / 4 : 1;
    size_t k = at < n ? 1 + rnd() % (n - at < most ? n - at : most) : 0;
    memmove(buf + at, buf + at + k, n - at - k);
    *len -= k;
    break;
  }
  case 5: { /* duplicate a run (repeated items), maybe many times */
    size_t k = at < n ? 1 + rnd() % (n - at < t->max_run ? n - at : t->max_run) : 0;
    unsigned copies = t->max_copies > 1 ? 1 + (unsigned)(rnd() % t->max_copies) : 1;
    for (unsigned c = 0; k && c < copies; c++)
      if (!open_gap(buf, len, cap, at, NULL, k))
        break;
    break;
  }
  case 6: /* a long run of one byte (over-long tokens, fields and lines) */
    if (t->long_run && rnd() % 4 == 0) {
      size_t k = 1 + rnd() % t->max_long_run;
      if (open_gap(buf, len, cap, at, NULL, k))
        memset(buf + at, t->long_run[rnd() % strlen(t->long_run)], k);
    }
    break;
  case 7: /* a random byte */
    if (at < n)
      buf[at] = (uint8_t)rnd();
    break;
  default: /* truncate */
    *len = at;
    break;
  }
}

/* Reads up to half of max_input bytes of `path` into a max_input buffer. */
static int load_file_seed(const char *path, size_t max_input, uint8_t **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  uint8_t *b = malloc(max_input);
  size_t n = b ? fread(b, 1, max_input / 2, f) : 0;
  fclose(f);
  if (!b)
    return -1;
  *out = b;
  *len = n;
  return 0;
}

static void usage(const char *name, FILE *f) {
  fprintf(f, "usage: %s [--iterations N] [--seed S] [--seconds T] [SEED_FILE]...\n", name);
}

int main(int argc, char **argv) {
  const fuzz_target_t *t = &fuzz_target;
  uint64_t iterations = 20000, seed = 1;
  double seconds = 2.0;
  uint8_t *seeds[MAX_SEEDS];
  size_t seed_len[MAX_SEEDS];
  size_t nseeds = 0;
  for (size_t i = 0; i < t->nseeds && nseeds < MAX_SEEDS; i++) {
    seeds[nseeds] = (uint8_t *)(uintptr_t)t->seeds[i];
    seed_len[nseeds++] = strlen(t->seeds[i]);
  }
  size_t nbuiltin = nseeds;
  static const struct option longopts[] = {{"iterations", required_argument, NULL, 'i'},
                                           {"seed", required_argument, NULL, 's'},
                                           {"seconds", required_argument, NULL, 't'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
    if (c == 'i') {
      iterations = strtoull(optarg, NULL, 10);
    } else if (c == 's') {
      seed = strtoull(optarg, NULL, 10);
    } else if (c == 't') {
      seconds = strtod(optarg, NULL);
    } else {
      usage(t->name, c == 'h' ? stdout : stderr);
      return c == 'h' ? 0 : 2;
    }
  }
  int rc = 2;
  uint8_t *buf = NULL;
  for (int i = optind; i < argc; i++) {
    if (nseeds == MAX_SEEDS) {
      fprintf(stderr, "%s: at most %d seeds\n", t->name, MAX_SEEDS);
      goto out;
    }
    if (load_file_seed(argv[i], t->max_input, &seeds[nseeds], &seed_len[nseeds]) != 0) {
      fprintf(stderr, "%s: cannot read seed file %s\n", t->name, argv[i]);
      goto out;
    }
    nseeds++;
  }
  rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
  printf("%s: seed %llu, up to %llu iterations or %.1f s, %zu seeds\n", t->name,
         (unsigned long long)seed, (unsigned long long)iterations, seconds, nseeds);
  fflush(stdout);
  rc = 1;
  buf = malloc(t->max_input);
  if (!buf)
    goto out;
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
      mutate(t, buf, &len, t->max_input);
    LLVMFuzzerTestOneInput(buf, len);
  }
  printf("%s: %llu inputs, no failure\n", t->name, (unsigned long long)done);
  rc = 0;
out:
  free(buf);
  for (size_t i = nbuiltin; i < nseeds; i++)
    free(seeds[i]);
  return rc;
}
