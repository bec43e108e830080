/* SPDX-License-Identifier: Apache-2.0 */
/* test_config.c - the allocator settings parser: every key, both forms of
 * roundup_power2_divisions, every rejection quoted and leaving the settings
 * unchanged, environment precedence, the format round trip and the roundup
 * interval lookup. */
#include "gca.h"
#include "support.h"

#define MiB (1024ull * 1024ull)

static gca_alloc_config_t parsed(const char *text) {
  gca_alloc_config_t c;
  gca__config_defaults(&c);
  assert_ok(gca__config_parse(text, &c));
  return c;
}

static void defaults_are_pytorchs(void **state) {
  (void)state;
  gca_alloc_config_t c;
  gca__config_defaults(&c);
  assert_true(c.max_split_size == UINT64_MAX);
  assert_int_equal(c.max_non_split_rounding, 20 * MiB);
  assert_true(c.garbage_collection_threshold == 0.0);
  for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++)
    assert_int_equal(c.roundup_power2_divisions[i], 0);
  assert_false(c.expandable_segments);
  assert_false(c.release_lock_on_device_alloc);
  assert_false(c.pinned_use_host_register);
  assert_int_equal(c.pinned_num_register_threads, 1);
  assert_false(c.pinned_use_background_threads);
  assert_true(c.per_process_memory_fraction == 0.0);
  assert_false(c.graph_capture_record_stream_reuse);
  assert_string_equal(c.backend, "native");
  /* gca's own keys */
  assert_false(c.ipc_handles);
  assert_true(c.free_cache);
  assert_true(c.expandable_moves); /* gca's: on, Note [Expandable segments] */
  assert_true(c.thread_cache);
  assert_true(c.recycle_bins);
}

static void every_key_is_read(void **state) {
  (void)state;
  gca_alloc_config_t c =
      parsed("max_split_size_mb:256,max_non_split_rounding_mb:64,garbage_collection_threshold:0.8,"
             "roundup_power2_divisions:4,expandable_segments:True,release_lock_on_cudamalloc:True,"
             "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
             "pinned_use_background_threads:True,per_process_memory_fraction:0.5,"
             "graph_capture_record_stream_reuse:True,backend:native");
  assert_int_equal(c.max_split_size, 256 * MiB);
  assert_int_equal(c.max_non_split_rounding, 64 * MiB);
  assert_true(c.garbage_collection_threshold == 0.8);
  for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++)
    assert_int_equal(c.roundup_power2_divisions[i], 4);
  assert_true(c.expandable_segments);
  assert_true(c.release_lock_on_device_alloc);
  assert_true(c.pinned_use_host_register);
  assert_int_equal(c.pinned_num_register_threads, 8);
  assert_true(c.pinned_use_background_threads);
  assert_true(c.per_process_memory_fraction == 0.5);
  assert_true(c.graph_capture_record_stream_reuse);
  assert_string_equal(c.backend, "native");

  /* False turns them back off; per_process_memory_fraction 1 is allowed. */
  c = parsed("expandable_segments:False,per_process_memory_fraction:1,"
             "pinned_num_register_threads:128");
  assert_false(c.expandable_segments);
  assert_true(c.per_process_memory_fraction == 1.0);
  assert_int_equal(c.pinned_num_register_threads, 128);
}

static void parse_applies_on_top_and_keeps_unnamed_keys(void **state) {
  (void)state;
  gca_alloc_config_t c = parsed("max_split_size_mb:100");
  assert_ok(gca__config_parse("expandable_segments:True", &c));
  assert_int_equal(c.max_split_size, 100 * MiB);
  assert_true(c.expandable_segments);
  assert_ok(gca__config_parse("", &c));
  assert_ok(gca__config_parse(NULL, &c));
  assert_int_equal(c.max_split_size, 100 * MiB);
}

static void whitespace_is_dropped_as_pytorch_does(void **state) {
  (void)state;
  gca_alloc_config_t c = parsed("  max_split_size_mb : 1 28 ,\texpandable_segments: True ,"
                                " roundup_power2_divisions : [ 256 : 1 , > : 8 ] , ");
  assert_int_equal(c.max_split_size, 128 * MiB);
  assert_true(c.expandable_segments);
  assert_int_equal(c.roundup_power2_divisions[0], 1);
  assert_int_equal(c.roundup_power2_divisions[15], 8);
}

static void roundup_list_fills_intervals_as_pytorch(void **state) {
  (void)state;
  /* Keys are MiB; key k sets interval log2(k); the first value also covers
   * every interval below it; '>' covers from the last key's interval on (so
   * here 1024:4 is overwritten by >:8, as in PyTorch). */
  gca_alloc_config_t c = parsed("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  const uint32_t want[GCA_ROUNDUP_INTERVALS] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 8, 8, 8, 8, 8, 8};
  assert_memory_equal(c.roundup_power2_divisions, want, sizeof(want));

  /* Without '>' the intervals above the last key stay 0; 0 disables a range. */
  c = parsed("roundup_power2_divisions:[64:8,128:0,256:2]");
  const uint32_t want2[GCA_ROUNDUP_INTERVALS] = {8, 8, 8, 8, 8, 8, 8, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  assert_memory_equal(c.roundup_power2_divisions, want2, sizeof(want2));

  /* Keys beyond the last interval land in it; '>' alone fills everything. */
  c = parsed("roundup_power2_divisions:[1:2,65536:16]");
  assert_int_equal(c.roundup_power2_divisions[0], 2);
  assert_int_equal(c.roundup_power2_divisions[1], 0);
  assert_int_equal(c.roundup_power2_divisions[15], 16);
  c = parsed("roundup_power2_divisions:[>:4]");
  for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++)
    assert_int_equal(c.roundup_power2_divisions[i], 4);

  /* The list replaces earlier divisions entirely. */
  c = parsed("roundup_power2_divisions:4,roundup_power2_divisions:[2:2]");
  assert_int_equal(c.roundup_power2_divisions[0], 2);
  assert_int_equal(c.roundup_power2_divisions[1], 2);
  assert_int_equal(c.roundup_power2_divisions[2], 0);
}

static void roundup_lookup_picks_the_power_of_two_interval(void **state) {
  (void)state;
  gca_alloc_config_t c;
  gca__config_defaults(&c);
  for (uint32_t i = 0; i < GCA_ROUNDUP_INTERVALS; i++)
    c.roundup_power2_divisions[i] = 100 + i;
  static const struct {
    size_t size;
    uint32_t want;
  } cases[] = {
      {0, 100},           {1, 100},
      {512 * 1024, 100},  {MiB - 1, 100},
      {MiB, 100},         {2 * MiB - 1, 100},
      {2 * MiB, 101},     {3 * MiB, 101},
      {256 * MiB, 108},   {512 * MiB - 1, 108},
      {512 * MiB, 109},   {1024 * MiB, 110},
      {16384 * MiB, 114}, {32768 * MiB, 115},
      {1ull << 40, 115},  {SIZE_MAX, 115},
  };
  for (size_t k = 0; k < GCA_ARRAY_SIZE(cases); k++) {
    uint32_t got = gca__config_roundup_divisions(&c, cases[k].size);
    if (got != cases[k].want)
      fail_msg("size %zu: divisions %u, wanted %u", cases[k].size, got, cases[k].want);
  }
}

static void bad_strings_are_quoted_and_change_nothing(void **state) {
  (void)state;
  static const struct {
    const char *text;
    const char *needle;
  } bad[] = {
      {"max_split_size_mb:abc", "max_split_size_mb:abc: 'abc' is not a number"},
      {"max_split_size_mb:-5", "'-5' is not a number"},
      {"max_split_size_mb:1.5", "'1.5' is not a number"},
      {"max_split_size_mb:20", "'20' is too small, must be > 20"},
      {"max_split_size_mb:99999999999999999999999", "out of range"},
      {"max_non_split_rounding_mb:19", "'19' is too small, must be >= 20"},
      {"garbage_collection_threshold:1.0", "'1.0' is out of range, must be in (0, 1)"},
      {"garbage_collection_threshold:0", "'0' is out of range"},
      {"garbage_collection_threshold:x0.5", "'x0.5' is not a number"},
      {"garbage_collection_threshold:nan", "'nan' is not a number"},
      {"per_process_memory_fraction:1.5", "'1.5' is out of range, must be in (0, 1]"},
      {"per_process_memory_fraction:0", "'0' is out of range"},
      {"expandable_segments:true", "expandable_segments:true: 'true' is not True or False"},
      {"expandable_segments:1", "'1' is not True or False"},
      {"release_lock_on_cudamalloc:yes", "'yes' is not True or False"},
      {"pinned_use_cuda_host_register:on", "'on'"},
      {"pinned_use_background_threads:T", "'T'"},
      {"graph_capture_record_stream_reuse:maybe", "'maybe'"},
      {"recycle_bins:on", "recycle_bins:on: 'on' is not True or False"},
      {"pinned_num_register_threads:3", "'3' is not a power of two"},
      {"pinned_num_register_threads:256", "'256' is out of range, must be <= 128"},
      {"pinned_num_register_threads:0", "'0' is not a power of two"},
      {"roundup_power2_divisions:3", "roundup_power2_divisions:3: '3' is not a power of two"},
      {"roundup_power2_divisions:0", "'0' is not a power of two"},
      {"roundup_power2_divisions:[256:3]", "'3' is not a power of two or 0"},
      {"roundup_power2_divisions:[300:2]", "'300' is not a power of two (interval keys"},
      {"roundup_power2_divisions:[0:2]", "'0' is not a power of two"},
      {"roundup_power2_divisions:[abc:2]", "'abc' is not a number of MiB or '>'"},
      {"roundup_power2_divisions:[512:1,256:2]", "'256' does not follow 512"},
      {"roundup_power2_divisions:[256:1,512:2", "missing ']'"},
      {"roundup_power2_divisions:[256:1", "missing ']'"},
      {"roundup_power2_divisions:[256:1;512:2]", "'1;512' is not a number"},
      {"roundup_power2_divisions:[256]", "'256' is not an entry 'MiB:divisions'"},
      {"roundup_power2_divisions:[256:]", "'256' is not an entry"},
      {"roundup_power2_divisions:[256:1 512:2]", "'1512' is not a power of two or 0"},
      {"roundup_power2_divisions:[256:1:2]", "':' where ',' or ']' was expected"},
      {"no_such_key:1", "'no_such_key' is not a configuration key"},
      {"max_split_size_mb", "max_split_size_mb: expected ':'"},
      {"max_split_size_mb:", "expected a value after 'max_split_size_mb:'"},
      {"max_split_size_mb:,expandable_segments:True", "expected a value"},
      {"expandable_segments:True:False", "expandable_segments:True:: ':' where ',' was expected"},
      {",expandable_segments:True", "',' is not a configuration key"},
      {"expandable_segments:True,,max_split_size_mb:30", "',' is not a configuration key"},
      {"backend:cudaMallocAsync", "gca is the allocator; backend:cudaMallocAsync is not supported"},
      {"backend:magic", "'magic' is not an allocator backend"},
  };
  for (size_t k = 0; k < GCA_ARRAY_SIZE(bad); k++) {
    gca_alloc_config_t c, before;
    gca__config_defaults(&c);
    /* A valid key first: a failure later in the text must not apply it. */
    char text[256];
    snprintf(text, sizeof(text), "max_split_size_mb:64,%s", bad[k].text);
    c.garbage_collection_threshold = 0.25;
    before = c;
    gca_clear_last_error();
    gca_status_t st = gca__config_parse(text, &c);
    if (st != GCA_ERR_CONFIG)
      fail_msg("'%s' -> %s (wanted GCA_ERR_CONFIG)", text, gca_status_name(st));
    if (!strstr(gca_last_error(), bad[k].needle))
      fail_msg("'%s': detail '%s' does not mention '%s'", text, gca_last_error(), bad[k].needle);
    if (!gca__config_equal(&c, &before))
      fail_msg("'%s' changed the settings although it was rejected", text);
  }
}

/* `n` comma-separated copies of `item`, the last one replaced by `last`. */
static char *repeated(const char *item, const char *last, size_t n) {
  size_t li = strlen(item), ll = strlen(last);
  char *s = malloc(n * (li + 1) + ll + 1);
  assert_non_null(s);
  char *w = s;
  for (size_t i = 0; i + 1 < n; i++) {
    memcpy(w, item, li);
    w += li;
    *w++ = ',';
  }
  memcpy(w, last, ll + 1);
  return s;
}

/* 256 one-letter items are 511 tokens and 257 are 513: the old fixed array of
 * 512 tokens was written past its end. Any count must lex; the verdict comes
 * from the keys. */
static void many_items_lex_without_bound(void **state) {
  (void)state;
  static const size_t counts[] = {255, 256, 257, 1000, 10000};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(counts); k++) {
    char *text = repeated("a", "b", counts[k]);
    gca_alloc_config_t c, before;
    gca__config_defaults(&c);
    before = c;
    assert_status(gca__config_parse(text, &c), GCA_ERR_CONFIG, "'a' is not a configuration key");
    assert_true(gca__config_equal(&c, &before));
    free(text);

    /* The same count of valid items is accepted; the last one wins. */
    text = repeated("expandable_segments:True", "expandable_segments:False", counts[k]);
    c.expandable_segments = true;
    assert_ok(gca__config_parse(text, &c));
    assert_false(c.expandable_segments);
    free(text);
    text = repeated("max_split_size_mb:64", "max_split_size_mb:128", counts[k]);
    assert_ok(gca__config_parse(text, &c));
    assert_int_equal(c.max_split_size, 128 * MiB);
    free(text);

    /* A bad item at the very end is still found. */
    text = repeated("free_cache:True", "free_cache:maybe", counts[k]);
    before = c;
    assert_status(gca__config_parse(text, &c), GCA_ERR_CONFIG, "'maybe' is not True or False");
    assert_true(gca__config_equal(&c, &before));
    free(text);
  }
  /* The list form with as many entries as the text holds. */
  char *list = malloc(10000 * 8 + 64);
  assert_non_null(list);
  char *w = list + sprintf(list, "roundup_power2_divisions:[1:2");
  for (int i = 0; i < 10000; i++)
    w += sprintf(w, ",>:4");
  strcpy(w, "]");
  gca_alloc_config_t c;
  gca__config_defaults(&c);
  assert_ok(gca__config_parse(list, &c));
  assert_int_equal(c.roundup_power2_divisions[GCA_ROUNDUP_INTERVALS - 1], 4);
  free(list);
}

/* Tokens up to 255 characters are read; a longer one is refused with its
 * position, and the detail keeps the part of the message that matters. */
static void long_values_are_bounded_and_quoted(void **state) {
  (void)state;
  gca_alloc_config_t c, before;
  gca__config_defaults(&c);
  char *text = malloc(200000);
  assert_non_null(text);

  /* 255 characters: 252 zeros then 256 is a value of 256 MiB. */
  int n = sprintf(text, "expandable_segments:True,max_split_size_mb:");
  memset(text + n, '0', 252);
  strcpy(text + n + 252, "256");
  assert_ok(gca__config_parse(text, &c));
  assert_int_equal(c.max_split_size, 256 * MiB);

  /* 256 characters: refused, quoting where the item starts. */
  memset(text + n, '0', 253);
  strcpy(text + n + 253, "256");
  before = c;
  assert_status(gca__config_parse(text, &c), GCA_ERR_CONFIG,
                "item at character 43 ('00000000000000000000000000000000...') is longer than 255");
  assert_true(gca__config_equal(&c, &before));

  /* 100000 characters of value, of key, and of a value inside the list form. */
  n = sprintf(text, "expandable_segments:");
  memset(text + n, 'x', 100000);
  text[n + 100000] = '\0';
  assert_status(gca__config_parse(text, &c), GCA_ERR_CONFIG, "item at character 20 ('xxx");
  assert_true(gca__config_equal(&c, &before));
  memset(text, 'k', 150000);
  strcpy(text + 150000, ":True");
  assert_status(gca__config_parse(text, &c), GCA_ERR_CONFIG, "item at character 0 ('kkk");
  n = sprintf(text, "roundup_power2_divisions:[256:");
  memset(text + n, '1', 100000);
  strcpy(text + n + 100000, "]");
  assert_status(gca__config_parse(text, &c), GCA_ERR_CONFIG, "is longer than 255 characters");
  assert_true(gca__config_equal(&c, &before));

  /* Whitespace is dropped before the length counts, as it is from tokens. */
  n = sprintf(text, "max_split_size_mb:");
  memset(text + n, ' ', 100000);
  strcpy(text + n + 100000, "64");
  assert_ok(gca__config_parse(text, &c));
  assert_int_equal(c.max_split_size, 64 * MiB);
  free(text);
}

typedef struct fake_env {
  const char *gca;
  const char *pytorch;
} fake_env_t;

static const char *fake_getenv(const char *name, void *ctx) {
  fake_env_t *e = ctx;
  if (strcmp(name, "GCA_ALLOC_CONF") == 0)
    return e->gca;
  if (strcmp(name, "PYTORCH_CUDA_ALLOC_CONF") == 0)
    return e->pytorch;
  return NULL;
}

static void env_prefers_gca_alloc_conf_over_pytorchs(void **state) {
  (void)state;
  fake_env_t env = {.gca = "max_split_size_mb:300", .pytorch = "max_split_size_mb:400"};
  gca__env_set_hook(fake_getenv, &env);
  gca_alloc_config_t c;
  memset(&c, 0xab, sizeof(c));
  assert_ok(gca__config_from_env(&c));
  assert_int_equal(c.max_split_size, 300 * MiB);
  assert_false(c.expandable_segments); /* defaults underneath */

  env.gca = NULL;
  assert_ok(gca__config_from_env(&c));
  assert_int_equal(c.max_split_size, 400 * MiB);

  env.gca = "";
  assert_ok(gca__config_from_env(&c));
  assert_int_equal(c.max_split_size, 400 * MiB);

  env.pytorch = NULL;
  assert_ok(gca__config_from_env(&c));
  assert_true(c.max_split_size == UINT64_MAX);

  /* A bad value names the variable it came from and leaves *cfg alone. */
  env.gca = "expandable_segments:True,max_split_size_mb:abc";
  gca_alloc_config_t before = c;
  assert_status(gca__config_from_env(&c), GCA_ERR_CONFIG,
                "GCA_ALLOC_CONF: max_split_size_mb:abc: 'abc' is not a number");
  assert_true(gca__config_equal(&c, &before));
  env.gca = NULL;
  env.pytorch = "backend:cudaMallocAsync";
  assert_status(gca__config_from_env(&c), GCA_ERR_CONFIG, "PYTORCH_CUDA_ALLOC_CONF: backend");
  assert_true(gca__config_equal(&c, &before));
  gca__env_set_hook(NULL, NULL);
}

static void round_trip(const gca_alloc_config_t *c) {
  char buf[1024];
  assert_ok(gca__config_format(c, buf, sizeof(buf)));
  gca_alloc_config_t back;
  gca__config_defaults(&back);
  gca_status_t st = gca__config_parse(buf, &back);
  if (st != GCA_OK)
    fail_msg("'%s' does not parse: %s", buf, gca_last_error());
  if (!gca__config_equal(&back, c))
    fail_msg("'%s' parses to different settings", buf);
}

static void format_round_trips(void **state) {
  (void)state;
  gca_alloc_config_t c;
  gca__config_defaults(&c);
  round_trip(&c);
  char buf[1024];
  assert_ok(gca__config_format(&c, buf, sizeof(buf)));
  assert_string_equal(buf,
                      "max_non_split_rounding_mb:20,expandable_segments:False,"
                      "release_lock_on_cudamalloc:False,pinned_use_cuda_host_register:False,"
                      "pinned_num_register_threads:1,pinned_use_background_threads:False,"
                      "graph_capture_record_stream_reuse:False,ipc_handles:False,"
                      "free_cache:True,expandable_moves:True,thread_cache:True,backend:native");

  c = parsed("max_split_size_mb:256,garbage_collection_threshold:0.8,roundup_power2_divisions:4,"
             "expandable_segments:True,per_process_memory_fraction:0.3,"
             "pinned_num_register_threads:16,release_lock_on_cudamalloc:True,"
             "pinned_use_cuda_host_register:True,pinned_use_background_threads:True,"
             "graph_capture_record_stream_reuse:True,max_non_split_rounding_mb:1024");
  round_trip(&c);
  assert_ok(gca__config_format(&c, buf, sizeof(buf)));
  assert_non_null(strstr(buf, "garbage_collection_threshold:0.8,"));
  assert_non_null(strstr(buf, "roundup_power2_divisions:4,"));

  /* recycle_bins is on by default and formatted only when off */
  c = parsed("recycle_bins:False");
  assert_false(c.recycle_bins);
  round_trip(&c);
  assert_ok(gca__config_format(&c, buf, sizeof(buf)));
  assert_non_null(strstr(buf, ",recycle_bins:False,backend:native"));
  c = parsed("recycle_bins:False,recycle_bins:True");
  assert_true(c.recycle_bins);
  assert_ok(gca__config_format(&c, buf, sizeof(buf)));
  assert_null(strstr(buf, "recycle_bins"));

  c = parsed("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  round_trip(&c);
  c = parsed("roundup_power2_divisions:[64:8,128:0,256:2]");
  round_trip(&c);
  c.garbage_collection_threshold = 1.0 / 3.0;
  round_trip(&c);

  /* Too small a buffer is an error that says how much is needed. */
  assert_status(gca__config_format(&c, buf, 16), GCA_ERR_INVALID_ARGUMENT, "needed");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_are_pytorchs),
      cmocka_unit_test(every_key_is_read),
      cmocka_unit_test(parse_applies_on_top_and_keeps_unnamed_keys),
      cmocka_unit_test(whitespace_is_dropped_as_pytorch_does),
      cmocka_unit_test(roundup_list_fills_intervals_as_pytorch),
      cmocka_unit_test(roundup_lookup_picks_the_power_of_two_interval),
      cmocka_unit_test(bad_strings_are_quoted_and_change_nothing),
      cmocka_unit_test(many_items_lex_without_bound),
      cmocka_unit_test(long_values_are_bounded_and_quoted),
      cmocka_unit_test(env_prefers_gca_alloc_conf_over_pytorchs),
      cmocka_unit_test(format_round_trips),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
