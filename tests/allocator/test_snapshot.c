/* SPDX-License-Identifier: Apache-2.0 */
/* test_snapshot.c - gca_snapshot_json() after a scripted sequence on the sim
 * backend: the JSON parses, its segment and block sums equal gca_get_stats(),
 * device_traces hold the actions in order with resolved frames, and the
 * settings in force are reported. */
#include <stdatomic.h>

#include "alloc_fixture.h"
#include "gca.h"
#include "support.h"
#include "json_read.h"

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  return 0;
}

static atomic_int gate;

static int teardown(void **state) {
  (void)state;
  atomic_store(&gate, 1); /* a failed test must not leave the stream held */
  gca_record_history(false, 0, false);
  assert_nothing_leaked();
  gca__allocator_reset();
  return 0;
}

static json_t *snapshot(void) {
  char *text = NULL;
  size_t len = 0;
  assert_ok(gca_snapshot_json(&text, &len));
  assert_non_null(text);
  assert_int_equal(len, strlen(text));
  json_t *v = jload(text, len);
  gca_string_free(text);
  return v;
}

static uint64_t u64_of(const json_t *obj, const char *key) {
  uint64_t x = 0;
  if (!ju64(json_object_get(obj, key), &x))
    fail_msg("'%s' is missing or not an unsigned integer", key);
  return x;
}

static const char *str_of(const json_t *obj, const char *key) {
  const char *s = json_string_value(json_object_get(obj, key));
  if (!s)
    fail_msg("'%s' is missing or not a string", key);
  return s;
}

static void hold_stream(void *arg) {
  (void)arg;
  while (atomic_load(&gate) == 0)
    ;
}

typedef struct sums {
  uint64_t reserved, allocated, active, requested, blocks_total;
} sums_t;

static sums_t check_segments(const json_t *segs) {
  sums_t s = {0};
  for (size_t i = 0; i < jcount(segs); i++) {
    const json_t *seg = json_array_get(segs, i);
    uint64_t total = u64_of(seg, "total_size");
    uint64_t seg_alloc = 0, seg_active = 0, seg_req = 0, seg_sum = 0;
    uint64_t next = u64_of(seg, "address");
    const json_t *blocks = json_object_get(seg, "blocks");
    assert_true(jcount(blocks) > 0);
    for (size_t k = 0; k < jcount(blocks); k++) {
      const json_t *b = json_array_get(blocks, k);
      uint64_t size = u64_of(b, "size");
      const char *state = str_of(b, "state");
      assert_int_equal(u64_of(b, "address"), next); /* blocks tile the segment in order */
      next += size;
      seg_sum += size;
      if (strcmp(state, "active_allocated") == 0) {
        seg_alloc += size;
        seg_active += size;
        seg_req += u64_of(b, "requested_size");
      } else if (strcmp(state, "active_pending_free") == 0) {
        seg_active += size;
        seg_req += u64_of(b, "requested_size"); /* still requested until the free completes */
      } else {
        assert_string_equal(state, "inactive");
      }
      assert_true(json_is_array(json_object_get(b, "frames")));
    }
    assert_int_equal(seg_sum, total);
    assert_int_equal(u64_of(seg, "allocated_size"), seg_alloc);
    assert_int_equal(u64_of(seg, "active_size"), seg_active);
    assert_int_equal(u64_of(seg, "requested_size"), seg_req);
    const char *type = str_of(seg, "segment_type");
    assert_true(strcmp(type, "large") == 0 || strcmp(type, "small") == 0);
    if (strcmp(type, "small") == 0)
      assert_int_equal(total, 2 * MiB);
    assert_int_equal(jcount(json_object_get(seg, "segment_pool_id")), 2);
    bool expandable;
    assert_true(jbool(json_object_get(seg, "is_expandable"), &expandable));
    assert_int_equal(u64_of(seg, "device"), 0);
    (void)u64_of(seg, "stream");
    s.reserved += total;
    s.allocated += seg_alloc;
    s.active += seg_active;
    s.requested += seg_req;
    s.blocks_total += seg_sum;
  }
  return s;
}

static void snapshot_sums_match_stats_and_traces_keep_order(void **state) {
  (void)state;
  assert_ok(gca_record_history(true, 1000, true));
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, 0));

  void *a, *b, *c, *d;
  assert_ok(gca_malloc(&a, 1000, NULL));
  assert_ok(gca_malloc(&b, 5 * MiB, NULL));
  assert_ok(gca_malloc(&c, 512, NULL));
  assert_ok(gca_malloc(&d, 3 * MiB, NULL));
  assert_ok(gca_free(b));
  /* d stays active but pending: freed while s2 still has queued work. */
  atomic_store(&gate, 0);
  assert_ok(gca_launch_host_func(s2, hold_stream, NULL));
  assert_ok(gca_record_stream(d, s2));
  assert_ok(gca_free(d));

  gca_stats_t st;
  assert_ok(gca_get_stats(0, &st));
  json_t *v = snapshot();
  const json_t *segs = json_object_get(v, "segments");
  assert_non_null(segs);
  assert_true(jcount(segs) >= 2);
  sums_t s = check_segments(segs);
  assert_int_equal(s.reserved, st.reserved_bytes[GCA_STAT_ALL].current);
  assert_int_equal(s.allocated, st.allocated_bytes[GCA_STAT_ALL].current);
  assert_int_equal(s.active, st.active_bytes[GCA_STAT_ALL].current);
  assert_int_equal(s.requested, st.requested_bytes[GCA_STAT_ALL].current);
  assert_true(s.active > s.allocated); /* d is pending */

  /* device_traces[0]: the user-visible actions in the order they happened. */
  const json_t *traces = json_object_get(v, "device_traces");
  assert_true(jcount(traces) >= 1);
  const json_t *t0 = json_array_get(traces, 0);
  const struct {
    const char *action;
    void *ptr;
  } want[] = {{"alloc", a}, {"alloc", b},          {"alloc", c},
              {"alloc", d}, {"free_requested", b}, {"free_requested", d}};
  size_t w = 0;
  bool saw_segment_alloc = false;
  uint64_t last_time = 0;
  for (size_t i = 0; i < jcount(t0); i++) {
    const json_t *e = json_array_get(t0, i);
    const char *action = str_of(e, "action");
    uint64_t time = u64_of(e, "time_us");
    assert_true(time >= last_time);
    last_time = time;
    if (strcmp(action, "segment_alloc") == 0 && w == 0)
      saw_segment_alloc = true;
    const json_t *frames = json_object_get(e, "frames");
    assert_true(jcount(frames) > 0);
    for (size_t f = 0; f < jcount(frames); f++) {
      const json_t *fr = json_array_get(frames, f);
      assert_non_null(str_of(fr, "filename"));
      assert_non_null(str_of(fr, "name"));
      assert_int_equal(u64_of(fr, "line"), 0);
    }
    if (strcmp(action, "alloc") != 0 && strcmp(action, "free_requested") != 0)
      continue;
    assert_true(w < GCA_ARRAY_SIZE(want));
    assert_string_equal(action, want[w].action);
    assert_int_equal(u64_of(e, "addr"), (uint64_t)(uintptr_t)want[w].ptr);
    (void)u64_of(e, "size");
    (void)u64_of(e, "stream");
    w++;
  }
  assert_int_equal(w, GCA_ARRAY_SIZE(want));
  assert_true(saw_segment_alloc);

  const json_t *set = json_object_get(v, "allocator_settings");
  assert_non_null(strstr(str_of(set, "PYTORCH_CUDA_ALLOC_CONF"), "backend:native"));
  int64_t mss;
  assert_true(ji64(json_object_get(set, "max_split_size"), &mss));
  assert_int_equal(mss, -1);
  assert_int_equal(jcount(json_object_get(set, "roundup_power2_divisions")), 16);
  json_decref(v);

  atomic_store(&gate, 1);
  assert_ok(gca_stream_synchronize(s2));
  assert_ok(gca_free(a));
  assert_ok(gca_free(c));
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(s2));

  /* With everything released, the snapshot has no segments left. */
  v = snapshot();
  assert_int_equal(jcount(json_object_get(v, "segments")), 0);
  json_decref(v);
}

static void settings_in_force_are_reported(void **state) {
  (void)state;
  assert_ok(gca_set_config("max_split_size_mb:64,garbage_collection_threshold:0.5,"
                           "roundup_power2_divisions:[256:1,>:4]"));
  json_t *v = snapshot();
  const json_t *set = json_object_get(v, "allocator_settings");
  assert_int_equal(u64_of(set, "max_split_size"), 64 * MiB);
  double gc;
  assert_true(jdouble(json_object_get(set, "garbage_collection_threshold"), &gc));
  assert_true(gc == 0.5);
  const json_t *r = json_object_get(set, "roundup_power2_divisions");
  assert_int_equal(u64_of(r, "1"), 1);
  assert_int_equal(u64_of(r, "256"), 4);
  assert_int_equal(u64_of(r, "32768"), 4);
  assert_non_null(strstr(str_of(set, "PYTORCH_CUDA_ALLOC_CONF"), "max_split_size_mb:64"));
  json_decref(v);
}

static void history_off_gives_empty_traces(void **state) {
  (void)state;
  void *p;
  assert_ok(gca_malloc(&p, 4096, NULL));
  json_t *v = snapshot();
  const json_t *traces = json_object_get(v, "device_traces");
  for (size_t i = 0; i < jcount(traces); i++)
    assert_int_equal(jcount(json_array_get(traces, i)), 0);
  assert_int_equal(jcount(json_object_get(v, "segments")), 1);
  json_decref(v);
  assert_ok(gca_free(p));
}

static void out_of_memory_is_traced_and_leaves_the_snapshot_intact(void **state) {
  (void)state;
  assert_ok(gca_record_history(true, 100, false));
  void *p, *q = NULL;
  assert_ok(gca_malloc(&p, 4 * MiB, NULL));
  json_t *before = snapshot();
  assert_ok(gca_sim_set_capacity(0, 64 * MiB));
  assert_status(gca_malloc(&q, 128 * MiB, NULL), GCA_ERR_OUT_OF_MEMORY, "out of memory");
  assert_null(q);
  assert_ok(gca_sim_set_capacity(0, 16ull << 30));
  json_t *after = snapshot();
  /* The failed request left the segments exactly as they were. */
  const json_t *sb = json_object_get(before, "segments");
  const json_t *sa = json_object_get(after, "segments");
  assert_int_equal(jcount(sa), jcount(sb));
  for (size_t i = 0; i < jcount(sa); i++) {
    assert_int_equal(u64_of(json_array_get(sa, i), "address"),
                     u64_of(json_array_get(sb, i), "address"));
    assert_int_equal(u64_of(json_array_get(sa, i), "allocated_size"),
                     u64_of(json_array_get(sb, i), "allocated_size"));
  }
  const json_t *t0 = json_array_get(json_object_get(after, "device_traces"), 0);
  bool saw_oom = false;
  for (size_t i = 0; i < jcount(t0); i++) {
    const json_t *e = json_array_get(t0, i);
    if (strcmp(str_of(e, "action"), "oom") == 0) {
      saw_oom = true;
      assert_int_equal(u64_of(e, "device_free"), u64_of(e, "addr"));
    }
  }
  assert_true(saw_oom);
  json_decref(before);
  json_decref(after);
  assert_ok(gca_free(p));
}

static void bad_arguments_are_rejected(void **state) {
  (void)state;
  assert_status(gca_snapshot_json(NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "snapshot_json");
  assert_status(gca_record_history(true, 0, false), GCA_ERR_INVALID_ARGUMENT, "max_entries");
  gca_string_free(NULL);
  /* Without a length pointer the snapshot is still produced. */
  char *text = NULL;
  assert_ok(gca_snapshot_json(&text, NULL));
  assert_non_null(text);
  gca_string_free(text);
}

/* The pickle form is the JSON snapshot's data: the same bytes whichever way
 * it is made, a protocol-4 pickle, and bad input is refused. */
static void the_pickle_is_the_json_snapshot_as_a_pickle(void **state) {
  (void)state;
  void *p = NULL;
  assert_ok(gca_malloc(&p, 4096, NULL));
  char *json = NULL, *a = NULL, *b = NULL;
  size_t jlen = 0, alen = 0, blen = 0;
  assert_ok(gca_snapshot_json(&json, &jlen));
  assert_ok(gca_snapshot_pickle(&a, &alen));
  assert_ok(gca_snapshot_json_to_pickle(json, jlen, &b, &blen));
  assert_true(alen > 16);
  assert_int_equal(alen, blen);
  assert_memory_equal(a, b, alen);
  assert_int_equal((unsigned char)a[0], 0x80);
  assert_int_equal(a[1], 4);
  assert_int_equal(a[alen - 1], '.');
  gca_string_free(json);
  gca_string_free(a);
  gca_string_free(b);
  char *out = NULL;
  size_t olen = 0;
  assert_status(gca_snapshot_json_to_pickle("{\"segments\": [", 14, &out, &olen), GCA_ERR_PARSE,
                "offset 14");
  assert_status(gca_snapshot_json_to_pickle("[1]", 3, &out, &olen), GCA_ERR_PARSE,
                "not a snapshot");
  assert_status(gca_snapshot_pickle(NULL, &olen), GCA_ERR_INVALID_ARGUMENT, "NULL");
  assert_null(out);
  assert_ok(gca_free(p));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(snapshot_sums_match_stats_and_traces_keep_order, teardown),
      cmocka_unit_test_teardown(settings_in_force_are_reported, teardown),
      cmocka_unit_test_teardown(history_off_gives_empty_traces, teardown),
      cmocka_unit_test_teardown(the_pickle_is_the_json_snapshot_as_a_pickle, teardown),
      cmocka_unit_test_teardown(out_of_memory_is_traced_and_leaves_the_snapshot_intact, teardown),
      cmocka_unit_test_teardown(bad_arguments_are_rejected, teardown),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
