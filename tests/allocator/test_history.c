/* SPDX-License-Identifier: Apache-2.0 */
/* test_history.c - the history rings (bounds, order, stacks, reconfiguring,
 * off means nothing recorded) and the GCA_TRACE file (RMM's CSV, read back
 * row by row; an unopenable path warns and recording carries on). */
#include <dirent.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc_fixture.h"
#include "gca.h"
#include "support.h"

#define S(x) ((gca_stream_t)(uintptr_t)(x))

static uint64_t fake_now;
static uint64_t fake_clock(void *ctx) {
  (void)ctx;
  return fake_now;
}

static const char *trace_path;
static const char *fake_getenv(const char *name, void *ctx) {
  (void)ctx;
  if (strcmp(name, "GCA_TRACE") == 0)
    return trace_path;
  return getenv(name);
}

static int teardown(void **state) {
  (void)state;
  gca__history_configure(false, 0, false);
  gca__trace_close();
  gca__clock_set_hook(NULL, NULL);
  gca__env_set_hook(NULL, NULL);
  gca__history_set_alloc(NULL);
  return 0;
}

static void off_records_nothing(void **state) {
  (void)state;
  gca__history_event(GCA_HA_ALLOC, 0, 0x1000, 512, NULL);
  gca__history_alloc_failure(0, 1 << 20, NULL);
  gca_history_entry_t *e = (gca_history_entry_t *)0x1;
  size_t n = 99;
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 0);
  assert_null(e);
}

static void ring_keeps_the_newest_entries_in_order(void **state) {
  (void)state;
  gca__clock_set_hook(fake_clock, NULL);
  assert_ok(gca__history_configure(true, 4, false));
  for (int i = 0; i < 10; i++) {
    fake_now = 1000 + (uint64_t)i;
    gca__history_event(i % 2 ? GCA_HA_FREE_REQUESTED : GCA_HA_ALLOC, 1, 0x1000 + (uint64_t)i,
                       100 + (uint64_t)i, S(7));
  }
  gca_history_entry_t *e;
  size_t n;
  assert_ok(gca__history_copy(1, &e, &n));
  assert_int_equal(n, 4);
  for (size_t k = 0; k < n; k++) {
    int i = 6 + (int)k;
    assert_int_equal(e[k].action, i % 2 ? GCA_HA_FREE_REQUESTED : GCA_HA_ALLOC);
    assert_int_equal(e[k].device, 1);
    assert_int_equal(e[k].addr, 0x1000 + (uint64_t)i);
    assert_int_equal(e[k].size, 100 + (uint64_t)i);
    assert_ptr_equal(e[k].stream, S(7));
    assert_int_equal(e[k].time_ns, 1000 + (uint64_t)i);
    assert_int_equal(e[k].nframes, 0);
  }
  free(e);
  /* Other devices are separate rings. */
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 0);
  assert_true(gca__history_device_count() >= 2);
}

static void reconfiguring_keeps_the_newest_and_disabling_clears(void **state) {
  (void)state;
  assert_ok(gca__history_configure(true, 8, false));
  for (uint64_t i = 0; i < 8; i++)
    gca__history_event(GCA_HA_SEGMENT_ALLOC, 0, i, i, NULL);
  gca_history_entry_t *e;
  size_t n;
  assert_ok(gca__history_configure(true, 3, false));
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 3);
  assert_int_equal(e[0].addr, 5);
  assert_int_equal(e[2].addr, 7);
  free(e);
  gca__history_event(GCA_HA_SEGMENT_FREE, 0, 8, 8, NULL);
  assert_ok(gca__history_configure(true, 16, false));
  gca__history_event(GCA_HA_SEGMENT_FREE, 0, 9, 9, NULL);
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 4);
  assert_int_equal(e[0].addr, 6);
  assert_int_equal(e[3].addr, 9);
  assert_int_equal(e[3].action, GCA_HA_SEGMENT_FREE);
  free(e);

  assert_ok(gca__history_configure(false, 0, false));
  gca__history_event(GCA_HA_ALLOC, 0, 10, 10, NULL);
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 0);
  assert_ok(gca__history_configure(true, 2, false));
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 0); /* the old entries did not come back */
}

static void bad_arguments_are_rejected_and_change_nothing(void **state) {
  (void)state;
  assert_ok(gca__history_configure(true, 2, false));
  gca__history_event(GCA_HA_ALLOC, 0, 1, 1, NULL);
  assert_status(gca__history_configure(true, 0, false), GCA_ERR_INVALID_ARGUMENT,
                "record_history: max_entries must be at least 1");
  assert_status(gca__history_configure(true, SIZE_MAX, false), GCA_ERR_INVALID_ARGUMENT,
                "max_entries");
  gca_history_entry_t *e;
  size_t n;
  assert_status(gca__history_copy(-1, &e, &n), GCA_ERR_INVALID_ARGUMENT, "device -1");
  assert_status(gca__history_copy(1000, &e, &n), GCA_ERR_INVALID_ARGUMENT, "device 1000");
  assert_status(gca__history_copy(0, NULL, &n), GCA_ERR_INVALID_ARGUMENT, "history_copy");
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 1);
  free(e);
  /* Events for devices the rings do not cover are dropped, not a crash. */
  gca__history_event(GCA_HA_ALLOC, -1, 1, 1, NULL);
  gca__history_event(GCA_HA_ALLOC, 100000, 1, 1, NULL);
}

/* The addresses in a device's ring, oldest first; returns how many. */
static size_t ring_addrs(int device, uint64_t *addrs, size_t cap) {
  gca_history_entry_t *e;
  size_t n;
  assert_ok(gca__history_copy(device, &e, &n));
  for (size_t i = 0; i < n && i < cap; i++)
    addrs[i] = e[i].addr;
  free(e);
  return n;
}

/* 2^40 entries of ~176 bytes would be 176 TiB: refused up front, quoting the
 * value, with the ring and its capacity as they were. */
static void capacity_beyond_the_maximum_is_rejected_quoting_it(void **state) {
  (void)state;
  assert_ok(gca__history_configure(true, 3, false));
  for (uint64_t i = 1; i <= 3; i++)
    gca__history_event(GCA_HA_ALLOC, 0, i, i, NULL);
  assert_status(gca__history_configure(true, (size_t)1 << 40, false), GCA_ERR_INVALID_ARGUMENT,
                "record_history: max_entries 1099511627776 is more than the 16777216");
  assert_status(gca__history_configure(true, GCA_HISTORY_MAX_ENTRIES + 1, true),
                GCA_ERR_INVALID_ARGUMENT, "max_entries 16777217");
  assert_status(gca__history_configure(true, SIZE_MAX / sizeof(gca_history_entry_t) + 1, false),
                GCA_ERR_INVALID_ARGUMENT, "is more than");
  gca__history_event(GCA_HA_ALLOC, 0, 4, 4, NULL); /* still a ring of 3 */
  uint64_t a[8];
  assert_int_equal(ring_addrs(0, a, 8), 3);
  assert_int_equal(a[0], 2);
  assert_int_equal(a[2], 4);
}

static _Atomic size_t fail_after; /* allocations that succeed before the failures */
static _Atomic size_t asked_bytes;
static void *failing_alloc(size_t bytes) {
  asked_bytes = bytes;
  size_t left = atomic_load(&fail_after);
  if (left == 0)
    return NULL;
  atomic_store(&fail_after, left - 1);
  return malloc(bytes);
}

/* A ring the host cannot hold is GCA_ERR_OUT_OF_MEMORY when it is configured,
 * all or nothing: rings already sized for the request are given back, and the
 * previous capacity, entries and stack setting stay in force. */
static void failed_ring_allocation_is_out_of_memory_and_keeps_the_history(void **state) {
  (void)state;
  assert_ok(gca__history_configure(true, 4, false));
  for (uint64_t i = 1; i <= 3; i++) {
    gca__history_event(GCA_HA_ALLOC, 0, i, i, NULL);
    gca__history_event(GCA_HA_ALLOC, 1, 100 + i, i, NULL);
  }
  gca__history_set_alloc(failing_alloc);
  /* The largest allowed capacity: refused by the host, not by the bound. */
  atomic_store(&fail_after, 0);
  assert_status(gca__history_configure(true, GCA_HISTORY_MAX_ENTRIES, true), GCA_ERR_OUT_OF_MEMORY,
                "record_history: host out of memory for a ring of 16777216 entries");
  assert_int_equal(asked_bytes, GCA_HISTORY_MAX_ENTRIES * sizeof(gca_history_entry_t));
  /* Device 0's ring allocated, device 1's not: device 0 keeps its ring too. */
  atomic_store(&fail_after, 1);
  assert_status(gca__history_configure(true, 1000, true), GCA_ERR_OUT_OF_MEMORY,
                "on device 1; the previous history is kept");
  gca__history_set_alloc(NULL);

  for (uint64_t i = 4; i <= 6; i++)
    gca__history_event(GCA_HA_ALLOC, 0, i, i, NULL);
  uint64_t a[8];
  assert_int_equal(ring_addrs(0, a, 8), 4); /* still 4 entries: 3..6 */
  assert_int_equal(a[0], 3);
  assert_int_equal(a[3], 6);
  assert_int_equal(ring_addrs(1, a, 8), 3);
  assert_int_equal(a[0], 101);
  gca_history_entry_t *e;
  size_t n;
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(e[n - 1].nframes, 0); /* stacks were not switched on */
  free(e);

  /* With memory back, the same request succeeds and keeps the entries. */
  assert_ok(gca__history_configure(true, 1000, false));
  assert_int_equal(ring_addrs(0, a, 8), 4);
  assert_int_equal(a[0], 3);
}

/* Through the public call on a live allocator: refused, nothing recorded is
 * lost, the allocator stays valid and nothing leaks. */
static void record_history_rejects_a_huge_capacity_on_a_live_allocator(void **state) {
  (void)state;
  test_backend();
  assert_ok(gca_record_history(true, 16, false));
  void *p;
  assert_ok(gca_malloc(&p, 4096, NULL));
  assert_status(gca_record_history(true, (size_t)1 << 40, false), GCA_ERR_INVALID_ARGUMENT,
                "max_entries 1099511627776");
  gca__history_set_alloc(failing_alloc);
  atomic_store(&fail_after, 0);
  assert_status(gca_record_history(true, 1 << 20, false), GCA_ERR_OUT_OF_MEMORY,
                "host out of memory for a ring of 1048576 entries");
  gca__history_set_alloc(NULL);
  assert_ok(gca_free(p));
  gca_history_entry_t *e;
  size_t n;
  assert_ok(gca__history_copy(0, &e, &n));
  assert_true(n >= 2);
  assert_true(n <= 16);
  bool saw_alloc = false, saw_free = false;
  for (size_t i = 0; i < n; i++) {
    saw_alloc = saw_alloc || (e[i].action == GCA_HA_ALLOC && e[i].addr == (uintptr_t)p);
    saw_free = saw_free || (e[i].action == GCA_HA_FREE_REQUESTED && e[i].addr == (uintptr_t)p);
  }
  free(e);
  assert_true(saw_alloc);
  assert_true(saw_free);
  assert_ok(gca__allocator_check());
  gca_stats_t st;
  assert_ok(gca_get_stats(0, &st));
  assert_int_equal(st.allocation[GCA_STAT_ALL].current, 0);
  assert_ok(gca_empty_cache());
  assert_nothing_leaked();
  gca__allocator_reset();
}

static void stacks_are_recorded_when_asked(void **state) {
  (void)state;
  assert_ok(gca__history_configure(true, 4, true));
  gca__history_event(GCA_HA_ALLOC, 0, 1, 1, NULL);
  gca_history_entry_t *e;
  size_t n;
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 1);
  assert_true(e[0].nframes > 0 && e[0].nframes <= GCA_HISTORY_MAX_FRAMES);
  for (int i = 0; i < e[0].nframes; i++)
    assert_non_null(e[0].frames[i]);
  free(e);
}

static void action_names_are_pytorchs(void **state) {
  (void)state;
  assert_string_equal(gca__history_action_name(GCA_HA_ALLOC), "alloc");
  assert_string_equal(gca__history_action_name(GCA_HA_FREE_REQUESTED), "free_requested");
  assert_string_equal(gca__history_action_name(GCA_HA_FREE_COMPLETED), "free_completed");
  assert_string_equal(gca__history_action_name(GCA_HA_SEGMENT_ALLOC), "segment_alloc");
  assert_string_equal(gca__history_action_name(GCA_HA_SEGMENT_FREE), "segment_free");
  assert_string_equal(gca__history_action_name(GCA_HA_SEGMENT_MAP), "segment_map");
  assert_string_equal(gca__history_action_name(GCA_HA_SEGMENT_UNMAP), "segment_unmap");
  assert_string_equal(gca__history_action_name(GCA_HA_SNAPSHOT), "snapshot");
  assert_string_equal(gca__history_action_name(GCA_HA_OOM), "oom");
  assert_string_equal(gca__history_action_name(GCA_HA_COUNT), "unknown");
}

typedef struct row {
  int thread;
  char time[32];
  char action[32];
  unsigned long long ptr, size, stream;
} row_t;

/* Reads the CSV back strictly: the header, then rows of exactly six fields. */
static size_t read_trace(const char *path, row_t *rows, size_t max) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[256];
  assert_non_null(fgets(line, sizeof(line), f));
  assert_string_equal(line, "Thread,Time,Action,Pointer,Size,Stream\n");
  size_t n = 0;
  while (fgets(line, sizeof(line), f)) {
    assert_true(n < max);
    row_t *r = &rows[n++];
    int used = 0;
    int got = sscanf(line, "%d,%31[^,],%31[^,],0x%llx,%llu,0x%llx\n%n", &r->thread, r->time,
                     r->action, &r->ptr, &r->size, &r->stream, &used);
    if (got != 6 || (size_t)used != strlen(line))
      fail_msg("malformed trace row: '%s'", line);
  }
  fclose(f);
  return n;
}

static char *temp_path(void) {
  char tmpl[] = "/tmp/gca-trace-XXXXXX";
  int fd = mkstemp(tmpl);
  assert_true(fd >= 0);
  close(fd);
  return strdup(tmpl);
}

static void trace_writes_rmm_csv(void **state) {
  (void)state;
  char *path = temp_path();
  trace_path = path;
  gca__env_set_hook(fake_getenv, NULL);
  gca__clock_set_hook(fake_clock, NULL);
  fake_now = 5000000000ull;
  assert_ok(gca__trace_open_from_env());
  fake_now += 1500; /* 1.5 us: rounds down to 1 */
  gca__history_event(GCA_HA_ALLOC, 0, 0xb08200000ull, 8519680, NULL);
  fake_now += 3723000123000ull; /* 1 h 2 min 3.000123 s later */
  gca__history_event(GCA_HA_FREE_REQUESTED, 0, 0xb08200000ull, 8519680, S(0x7f00aa));
  gca__history_event(GCA_HA_SEGMENT_ALLOC, 0, 0xb08200000ull, 20 << 20, NULL); /* not traced */
  gca__history_event(GCA_HA_FREE_COMPLETED, 0, 0xb08200000ull, 8519680, NULL); /* not traced */
  gca__history_alloc_failure(0, 1ull << 40, S(0x10));
  /* Still open from the first call: a second open changes nothing. */
  assert_ok(gca__trace_open_from_env());
  gca__trace_close();
  gca__history_event(GCA_HA_ALLOC, 0, 0x1, 1, NULL); /* after close: not written */

  row_t rows[8];
  size_t n = read_trace(path, rows, 8);
  assert_int_equal(n, 3);
  assert_string_equal(rows[0].time, "00:00:00.000001");
  assert_string_equal(rows[0].action, "allocate");
  assert_int_equal(rows[0].ptr, 0xb08200000ull);
  assert_int_equal(rows[0].size, 8519680);
  assert_int_equal(rows[0].stream, 0);
  assert_string_equal(rows[1].time, "01:02:03.000124");
  assert_string_equal(rows[1].action, "free");
  assert_int_equal(rows[1].stream, 0x7f00aa);
  assert_string_equal(rows[2].action, "allocate failure");
  assert_int_equal(rows[2].ptr, 0);
  assert_int_equal(rows[2].size, 1ull << 40);
  assert_int_equal(rows[2].stream, 0x10);
  assert_true(rows[0].thread >= 1);
  assert_int_equal(rows[1].thread, rows[0].thread);
  /* The ring was off throughout. */
  gca_history_entry_t *e;
  size_t cnt;
  assert_ok(gca__history_copy(0, &e, &cnt));
  assert_int_equal(cnt, 0);
  unlink(path);
  free(path);
}

typedef struct worker {
  int id;
  int thread_seen;
} worker_t;

static void *trace_worker(void *arg) {
  worker_t *w = arg;
  for (int i = 0; i < 200; i++) {
    gca__history_event(GCA_HA_ALLOC, 0, ((uint64_t)w->id << 32) | (uint64_t)i, 256, NULL);
    gca__history_event(GCA_HA_FREE_REQUESTED, 0, ((uint64_t)w->id << 32) | (uint64_t)i, 256, NULL);
  }
  return NULL;
}

static void trace_rows_stay_whole_under_threads_with_one_id_each(void **state) {
  (void)state;
  char *path = temp_path();
  trace_path = path;
  gca__env_set_hook(fake_getenv, NULL);
  assert_ok(gca__trace_open_from_env());
  assert_ok(gca__history_configure(true, 100000, false));
  enum { T = 4 };
  pthread_t th[T];
  worker_t w[T];
  for (int i = 0; i < T; i++) {
    w[i].id = i + 1;
    assert_int_equal(pthread_create(&th[i], NULL, trace_worker, &w[i]), 0);
  }
  for (int i = 0; i < T; i++)
    pthread_join(th[i], NULL);
  gca__trace_close();
  static row_t rows[T * 400 + 1];
  size_t n = read_trace(path, rows, T * 400 + 1);
  assert_int_equal(n, T * 400);
  /* Each worker's rows carry one thread number, distinct per worker, and
   * appear in the worker's own order. */
  int tid_of[T + 1] = {0};
  int next_i[T + 1] = {0};
  for (size_t k = 0; k < n; k++) {
    int id = (int)(rows[k].ptr >> 32);
    assert_true(id >= 1 && id <= T);
    if (tid_of[id] == 0)
      tid_of[id] = rows[k].thread;
    assert_int_equal(rows[k].thread, tid_of[id]);
    int i = (int)(rows[k].ptr & 0xffffffffu);
    bool is_alloc = strcmp(rows[k].action, "allocate") == 0;
    assert_int_equal(i, next_i[id] / 2);
    assert_int_equal(is_alloc, next_i[id] % 2 == 0);
    next_i[id]++;
  }
  for (int a = 1; a <= T; a++)
    for (int b = a + 1; b <= T; b++)
      assert_int_not_equal(tid_of[a], tid_of[b]);
  gca_history_entry_t *e;
  size_t cnt;
  assert_ok(gca__history_copy(0, &e, &cnt));
  assert_int_equal(cnt, T * 400);
  free(e);
  unlink(path);
  free(path);
}

static void unopenable_trace_path_warns_and_recording_continues(void **state) {
  (void)state;
  trace_path = "/nonexistent-dir/gca/trace.csv";
  gca__env_set_hook(fake_getenv, NULL);
  char *errpath = temp_path();
  fflush(stderr);
  int saved = dup(2);
  FILE *cap = fopen(errpath, "w");
  assert_non_null(cap);
  dup2(fileno(cap), 2);
  gca_log_level_t level = gca_get_log_level();
  gca_set_log_level(GCA_LOG_WARN);
  gca_status_t st = gca__trace_open_from_env();
  gca_set_log_level(level);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(cap);
  assert_ok(st);

  char text[512] = {0};
  FILE *f = fopen(errpath, "r");
  assert_non_null(f);
  size_t got = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[got] = '\0';
  assert_non_null(strstr(text, "/nonexistent-dir/gca/trace.csv"));
  assert_non_null(strstr(text, "No such file or directory"));
  unlink(errpath);
  free(errpath);

  /* Recording goes on without the trace: the ring still works. */
  assert_ok(gca__history_configure(true, 4, false));
  gca__history_event(GCA_HA_ALLOC, 0, 0x40, 64, NULL);
  gca__history_alloc_failure(0, 64, NULL);
  gca_history_entry_t *e;
  size_t n;
  assert_ok(gca__history_copy(0, &e, &n));
  assert_int_equal(n, 1);
  free(e);
}

static void trace_is_flushed_at_exit(void **state) {
  (void)state;
  char *path = temp_path();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    trace_path = path;
    gca__env_set_hook(fake_getenv, NULL);
    if (gca__trace_open_from_env() != GCA_OK)
      _exit(2);
    for (uint64_t i = 0; i < 1000; i++)
      gca__history_event(GCA_HA_ALLOC, 0, 0x1000 + i, 64, NULL);
    exit(0); /* no gca__trace_close: the atexit handler flushes */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  static row_t rows[1001];
  assert_int_equal(read_trace(path, rows, 1001), 1000);
  assert_int_equal(rows[999].ptr, 0x1000 + 999);
  unlink(path);
  free(path);
}

static void unset_trace_variable_opens_nothing(void **state) {
  (void)state;
  int before = test_fd_count();
  trace_path = NULL;
  gca__env_set_hook(fake_getenv, NULL);
  assert_ok(gca__trace_open_from_env());
  assert_int_equal(test_fd_count(), before);
  trace_path = "";
  assert_ok(gca__trace_open_from_env());
  assert_int_equal(test_fd_count(), before);
  gca__history_event(GCA_HA_ALLOC, 0, 0x1, 1, NULL); /* goes nowhere */
  gca__trace_close();                                /* closing nothing is fine */
  assert_int_equal(test_fd_count(), before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(off_records_nothing, teardown),
      cmocka_unit_test_teardown(ring_keeps_the_newest_entries_in_order, teardown),
      cmocka_unit_test_teardown(reconfiguring_keeps_the_newest_and_disabling_clears, teardown),
      cmocka_unit_test_teardown(bad_arguments_are_rejected_and_change_nothing, teardown),
      cmocka_unit_test_teardown(capacity_beyond_the_maximum_is_rejected_quoting_it, teardown),
      cmocka_unit_test_teardown(failed_ring_allocation_is_out_of_memory_and_keeps_the_history,
                                teardown),
      cmocka_unit_test_teardown(record_history_rejects_a_huge_capacity_on_a_live_allocator,
                                teardown),
      cmocka_unit_test_teardown(stacks_are_recorded_when_asked, teardown),
      cmocka_unit_test_teardown(action_names_are_pytorchs, teardown),
      cmocka_unit_test_teardown(trace_writes_rmm_csv, teardown),
      cmocka_unit_test_teardown(trace_rows_stay_whole_under_threads_with_one_id_each, teardown),
      cmocka_unit_test_teardown(unopenable_trace_path_warns_and_recording_continues, teardown),
      cmocka_unit_test_teardown(trace_is_flushed_at_exit, teardown),
      cmocka_unit_test_teardown(unset_trace_variable_opens_nothing, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
