/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_config.c - fuzz target for the allocator's configuration parser
 * (GCA_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF text, gca__config_parse), with
 * its seeds and the words of its grammar for the standalone driver
 * (fuzz_driver.h).
 *
 * The one idea: whatever the text, the parser either accepts it, and then the
 * settings written back by gca__config_format parse to the very same settings,
 * or refuses it with GCA_ERR_CONFIG, a detail, and the settings untouched.
 * Built with -fsanitize=fuzzer it is a libFuzzer target; linked with
 * fuzz_driver.c it runs in the default test suite.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_driver.h"

static void die(const char *what, const char *text) {
  fprintf(stderr, "fuzz_config: %s: '%.200s': %s\n", what, text, gca_last_error());
  abort();
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
    if (!gca__config_equal(&c, base))
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
  if (!gca__config_equal(&back, &c))
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
  base.recycle_bins = false;
  parse_and_check(text, &base);
  free(text);
  return 0;
}

static const char *const builtin_seeds[] = {
    "",
    "expandable_segments:True",
    "max_split_size_mb:256,garbage_collection_threshold:0.8",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "roundup_power2_divisions:4,per_process_memory_fraction:0.5,backend:native",
    "pinned_num_register_threads:8,pinned_use_cuda_host_register:True,free_cache:False",
    "recycle_bins:False,thread_cache:False",
};

/* Pieces the grammar is made of, inserted whole (the keys come from the
 * parser's own list, gca__config_keys). */
static const char *const words[] = {
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

const fuzz_target_t fuzz_target = {
    .name = "fuzz_config",
    .seeds = builtin_seeds,
    .nseeds = GCA_ARRAY_SIZE(builtin_seeds),
    .max_input = 16u << 10,
    .alphabet = ",:[]> .0123456789-+eE\t",
    .words = words,
    .nwords = GCA_ARRAY_SIZE(words),
    .keys = gca__config_keys,
    .nkeys = GCA__CONFIG_NKEYS,
    .max_run = 64,
    .max_copies = 64, /* many items */
    .long_run = "7x", /* over-long tokens */
    .max_long_run = 300,
};
