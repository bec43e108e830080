/* fuzz_rmm_csv.c - fuzz target for the RMM CSV reader, and a standalone driver
 * that runs the same entry point over mutated seeds without libFuzzer.
 *
 * The one idea: the same input read through the memory reader and through the
 * stdio reader (a different buffering path) must give the same events and the
 * same verdict, and every failure must name a line. Built with
 * -fsanitize=fuzzer it is a libFuzzer target; built with
 * -DGCA_FUZZ_STANDALONE it has a main that mutates built-in seeds (and files
 * named on the command line) for N iterations from a given seed, so the default
 * test suite exercises it under the sanitizers too.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmm_csv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what, uint64_t line) {
  fprintf(stderr, "fuzz_rmm_csv: %s (line %llu): %s\n", what, (unsigned long long)line,
          tool_last_error());
  abort();
}

/* Reads every event; returns the final status and fills events[0, *n) up to cap. */
static gca_status_t read_all(gca_rmm_reader_t *r, gca_rmm_event_t *events, size_t cap, size_t *n) {
  uint64_t last_line = 1;
  *n = 0;
  for (;;) {
    gca_rmm_event_t ev;
    bool eof = false;
    gca_status_t st = gca__rmm_next(r, &ev, &eof);
    if (st != GCA_OK) {
      if (st != GCA_ERR_PARSE && st != GCA_ERR_IO)
        die("unexpected status", gca__rmm_line(r));
      if (!strstr(tool_last_error(), "line "))
        die("error detail names no line", gca__rmm_line(r));
      if (gca__rmm_next(r, &ev, &eof) == GCA_OK)
        die("reader went on after an error", gca__rmm_line(r));
      return st;
    }
    if (eof)
      return GCA_OK;
    if (ev.line <= last_line || ev.line != gca__rmm_line(r))
      die("line numbers out of order", ev.line);
    if (ev.action != GCA_RMM_ALLOCATE && ev.action != GCA_RMM_FREE &&
        ev.action != GCA_RMM_ALLOCATE_FAILURE)
      die("bad action", ev.line);
    last_line = ev.line;
    if (*n < cap)
      events[*n] = ev;
    (*n)++;
  }
}

#define CMP_EVENTS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gca_rmm_event_t a[CMP_EVENTS], b[CMP_EVENTS];
  size_t na = 0, nb = 0;
  gca_rmm_reader_t *r = NULL;
  gca_status_t sa = gca__rmm_open_memory(data, size, "fuzz", &r);
  if (sa == GCA_OK) {
    sa = read_all(r, a, CMP_EVENTS, &na);
    gca__rmm_close(r);
  } else if (!strstr(tool_last_error(), "line 1")) {
    die("open error names no line", 1);
  }
  if (size == 0)
    return 0;
  FILE *f = fmemopen((void *)data, size, "rb");
  if (!f)
    return 0;
  gca_status_t sb = gca__rmm_open_stdio(f, "fuzz", true, &r);
  if (sb == GCA_OK) {
    sb = read_all(r, b, CMP_EVENTS, &nb);
    gca__rmm_close(r);
  } else {
    fclose(f);
  }
  if (sa != sb || na != nb)
    die("memory and stdio readers disagree", 0);
  for (size_t i = 0; i < na && i < CMP_EVENTS; i++) {
    if (a[i].line != b[i].line || a[i].thread != b[i].thread || a[i].time_ns != b[i].time_ns ||
        a[i].pointer != b[i].pointer || a[i].size != b[i].size || a[i].stream != b[i].stream ||
        a[i].action != b[i].action)
      die("memory and stdio readers parsed different events", a[i].line);
  }
  return 0;
}

#ifdef GCA_FUZZ_STANDALONE

#define MAX_INPUT (16u << 10)

static const char *const builtin_seeds[] = {
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "1,00:00:00.000000,allocate,0xb08200000,8519680,0x0\n"
    "1,00:00:00.000000,allocate,0xb08a20000,8519680,0x0\n"
    "1,00:00:00.000000,allocate,0xb09240000,2359296,0x0\n"
    "1,00:00:00.000000,allocate,0xb0cc00000,31457280,0x0\n"
    "1,00:00:00.001520,free,0xb09240000,2359296,0x0\n"
    "1,00:00:00.001600,allocate failure,0x0,99999999999,0x7f00\n"
    "1,00:00:00.248181,free,0xb0ebffe00,4,0x0\n",
    "Thread,Time,Action,Pointer,Size,Stream\r\n"
    "140202898593536,13:56:46:538456,allocate,0x7f8374000000,256,0x5555deadbeef\r\n"
    "140202898593536,13:56:46:538460,free,0x7f8374000000,256,0x5555deadbeef\r\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0xzz,1,0x0\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x10,-4,0x0\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,alloc,0x10,4,0x0\n",
    "Thread,Time,Action,Pointer,Size\n1,00:00:00.0,allocate,0x10,4\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,free,0x10\n\n\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,xx:00:00.0,free,0x10,1,0x0,extra\n",
};

static uint64_t rng_state;

static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static const char interesting[] = ",\n\r-x0f9: .aA\t";

/* Applies one random edit to buf[0, *len). */
static void mutate(uint8_t *buf, size_t *len, size_t cap) {
  size_t n = *len;
  size_t at = n ? rnd() % n : 0;
  switch (rnd() % 8) {
  case 0: /* flip a bit */
    if (n)
      buf[at] ^= (uint8_t)(1u << (rnd() % 8));
    break;
  case 1: /* overwrite with a character the grammar cares about */
    if (n)
      buf[at] = (uint8_t)interesting[rnd() % (sizeof(interesting) - 1)];
    break;
  case 2: /* insert one */
    if (n < cap) {
      memmove(buf + at + 1, buf + at, n - at);
      buf[at] = (uint8_t)interesting[rnd() % (sizeof(interesting) - 1)];
      (*len)++;
    }
    break;
  case 3: { /* delete a run */
    size_t k = n ? 1 + rnd() % (n - at < 16 ? n - at : 16) : 0;
    memmove(buf + at, buf + at + k, n - at - k);
    *len -= k;
    break;
  }
  case 4: { /* duplicate a run */
    size_t k = n ? 1 + rnd() % (n - at < 64 ? n - at : 64) : 0;
    if (n + k <= cap) {
      memmove(buf + at + k, buf + at, n - at);
      *len += k;
    }
    break;
  }
  case 5: /* truncate */
    *len = at;
    break;
  case 6: /* a long run of digits (over-long fields and lines) */
    if (n + 1200 <= cap && rnd() % 4 == 0) {
      size_t k = 1 + rnd() % 1200;
      memmove(buf + at + k, buf + at, n - at);
      memset(buf + at, '7', k);
      *len += k;
    }
    break;
  default: /* a random byte */
    if (n)
      buf[at] = (uint8_t)rnd();
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

static void usage(FILE *f) {
  fprintf(f, "usage: fuzz_rmm_csv [--iterations N] [--seed S] [--seconds T] [SEED_FILE]...\n");
}

int main(int argc, char **argv) {
  uint64_t iterations = 20000, seed = 1;
  double seconds = 2.0;
  uint8_t *seeds[64];
  size_t seed_len[64];
  size_t nseeds = 0;
  for (size_t i = 0; i < TOOL_ARRAY_SIZE(builtin_seeds); i++) {
    seeds[nseeds] = (uint8_t *)(uintptr_t)builtin_seeds[i];
    seed_len[nseeds++] = strlen(builtin_seeds[i]);
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
      usage(c == 'h' ? stdout : stderr);
      return c == 'h' ? 0 : 2;
    }
  }
  for (int i = optind; i < argc; i++) {
    if (nseeds == TOOL_ARRAY_SIZE(seeds)) {
      fprintf(stderr, "fuzz_rmm_csv: at most %zu seeds\n", TOOL_ARRAY_SIZE(seeds));
      return 2;
    }
    if (load_file_seed(argv[i], &seeds[nseeds], &seed_len[nseeds]) != 0) {
      fprintf(stderr, "fuzz_rmm_csv: cannot read seed file %s\n", argv[i]);
      return 2;
    }
    nseeds++;
  }
  rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
  printf("fuzz_rmm_csv: seed %llu, up to %llu iterations or %.1f s, %zu seeds\n",
         (unsigned long long)seed, (unsigned long long)iterations, seconds, nseeds);
  fflush(stdout);
  uint8_t *buf = malloc(MAX_INPUT);
  if (!buf)
    return 1;
  for (size_t i = 0; i < nseeds; i++)
    LLVMFuzzerTestOneInput(seeds[i], seed_len[i]);
  uint64_t start = tool_now_ns(), done = 0;
  for (; done < iterations; done++) {
    if ((done & 255) == 0 && (double)(tool_now_ns() - start) / 1e9 > seconds)
      break;
    size_t s = rnd() % nseeds;
    size_t len = seed_len[s];
    memcpy(buf, seeds[s], len);
    int edits = 1 + (int)(rnd() % 8);
    for (int e = 0; e < edits; e++)
      mutate(buf, &len, MAX_INPUT);
    LLVMFuzzerTestOneInput(buf, len);
  }
  printf("fuzz_rmm_csv: %llu inputs, no failure\n", (unsigned long long)done);
  free(buf);
  for (size_t i = nbuiltin; i < nseeds; i++)
    free(seeds[i]);
  return 0;
}

#endif
