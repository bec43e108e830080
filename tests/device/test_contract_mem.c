/* SPDX-License-Identifier: Apache-2.0 */
/* test_contract_mem.c - the memory contract of the device table, written once
 * against the ops and run on sim and on cuda: VMM reserve/create/map/access/
 * unmap/release round trips, aliasing of mappings of one handle, faults on
 * unmapped or inaccessible addresses, capacity exhaustion, large sparse
 * devices, classic allocations, fd export/import, and per-device access
 * rights (mem_set_access grants, peer access to classic memory; two devices).
 *
 * Where cuda.h is silent or says otherwise, the expected answers are the
 * driver's as measured on an H200 with driver 580 (CUDA 13.0, granularity
 * 2 MiB), and the comment of each such test says so: reservations take whole
 * granules, a handle maps whole and from its start (else NOT_SUPPORTED),
 * access and unmap take whole mappings (Note [Sim whole mappings]).
 *
 * Host access to device memory goes through dev_write/dev_read: a plain load
 * or store on sim (device memory is host memory there), a copy through the
 * table on cuda. Parts that need host access to unmapped addresses or a
 * settable capacity run on sim only.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"

static const gca_device_ops_t *ops;
static bool is_sim;
static size_t gran;

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  is_sim = strcmp(ops->name, "sim") == 0;
  assert_ok(ops->mem_granularity(0, false, &gran));
  return 0;
}

static void dev_write(gca_devptr_t ptr, uint32_t v) {
  if (is_sim) {
    *(volatile uint32_t *)(uintptr_t)ptr = v;
    return;
  }
  assert_ok(ops->memcpy_async(ptr, (gca_devptr_t)(uintptr_t)&v, sizeof(v), NULL));
  assert_ok(ops->stream_synchronize(NULL));
}

static uint32_t dev_read(gca_devptr_t ptr) {
  if (is_sim)
    return *(volatile uint32_t *)(uintptr_t)ptr;
  uint32_t v = 0;
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)&v, ptr, sizeof(v), NULL));
  assert_ok(ops->stream_synchronize(NULL));
  return v;
}

static uint64_t used(void) {
  return is_sim ? gca_sim_used_bytes(0) : 0;
}

static void vmm_round_trip_returns_used_bytes_to_zero(void **state) {
  (void)state;
  uint64_t before = used();
  gca_devptr_t base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, 4 * gran, 0, &base));
  assert_int_equal(base % gran, 0);
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  if (is_sim)
    assert_int_equal(used(), before + 2 * gran);
  assert_ok(ops->mem_map(base + gran, 2 * gran, 0, h));
  assert_ok(ops->mem_set_access(base + gran, 2 * gran, &dev, 1));
  dev_write(base + gran, 0xfeedbeef);
  dev_write(base + 3 * gran - 4, 0x12345678);
  assert_int_equal(dev_read(base + gran), 0xfeedbeef);
  assert_int_equal(dev_read(base + 3 * gran - 4), 0x12345678);
  assert_ok(ops->mem_unmap(base + gran, 2 * gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 4 * gran));
  assert_int_equal(used(), before);
}

static void released_handle_lives_until_its_mapping_is_gone(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  assert_ok(ops->mem_map(base, 2 * gran, 0, h));
  assert_ok(ops->mem_set_access(base, 2 * gran, &dev, 1));
  assert_ok(ops->mem_release(h));
  if (is_sim)
    assert_int_equal(used(), 2 * gran);
  dev_write(base + 64, 77);
  assert_int_equal(dev_read(base + 64), 77);
  assert_ok(ops->mem_unmap(base, 2 * gran));
  assert_int_equal(used(), 0);
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
}

static void mappings_of_one_handle_alias(void **state) {
  (void)state;
  gca_devptr_t a, b;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &a));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 4 * gran, &b));
  assert_int_equal(b % (4 * gran), 0);
  assert_ok(ops->mem_map(a, 2 * gran, 0, h));
  assert_ok(ops->mem_map(b, 2 * gran, 0, h)); /* offset 0: cuMemMap takes no other */
  assert_ok(ops->mem_set_access(a, 2 * gran, &dev, 1));
  assert_ok(ops->mem_set_access(b, 2 * gran, &dev, 1));
  dev_write(a + gran + 8, 0xa11a5);
  assert_int_equal(dev_read(b + gran + 8), 0xa11a5);
  dev_write(b + 16, 0xb0b);
  assert_int_equal(dev_read(a + 16), 0xb0b);
  assert_ok(ops->mem_unmap(a, 2 * gran));
  assert_ok(ops->mem_unmap(b, 2 * gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, a, 2 * gran));
  assert_ok(ops->mem_address_free(0, b, 2 * gran));
  assert_int_equal(used(), 0);
}

/* cuMemMap maps a handle whole and from its start. cuda.h says the offset
 * "must be zero", which would read as CUDA_ERROR_INVALID_VALUE, but the driver
 * answers a nonzero offset with CUDA_ERROR_NOT_SUPPORTED (measured on an H200,
 * driver 580). */
static void map_at_a_nonzero_offset_is_not_supported(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h;
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  assert_status(ops->mem_map(base, gran, gran, h), GCA_ERR_NOT_SUPPORTED, "mem_map");
  assert_ok(ops->mem_map(base, 2 * gran, 0, h)); /* the range is still free to map */
  assert_ok(ops->mem_unmap(base, 2 * gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
  assert_int_equal(used(), 0);
}

/* Mapping less or more than the whole handle, or from an offset that is not
 * a granule multiple, is CUDA_ERROR_NOT_SUPPORTED too (H200, driver 580;
 * cuda.h does not say). */
static void map_of_part_of_a_handle_is_not_supported(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_create(0, 4 * gran, &h));
  assert_ok(ops->mem_address_reserve(0, 4 * gran, 0, &base));
  assert_status(ops->mem_map(base, 2 * gran, 0, h), GCA_ERR_NOT_SUPPORTED, "mem_map");
  assert_status(ops->mem_map(base, gran, gran / 2, h), GCA_ERR_NOT_SUPPORTED, "mem_map");
  gca_memhandle_t one;
  assert_ok(ops->mem_create(0, gran, &one));
  assert_status(ops->mem_map(base, 2 * gran, 0, one), GCA_ERR_NOT_SUPPORTED, "mem_map");
  assert_ok(ops->mem_release(one));
  assert_ok(ops->mem_map(base, 4 * gran, 0, h)); /* nothing was mapped */
  assert_ok(ops->mem_set_access(base, 4 * gran, &dev, 1));
  dev_write(base + 4 * gran - 4, 0x404);
  assert_int_equal(dev_read(base + 4 * gran - 4), 0x404);
  assert_ok(ops->mem_unmap(base, 4 * gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 4 * gran));
  assert_int_equal(used(), 0);
}

/* cuMemAddressReserve takes a size that is a nonzero multiple of the
 * granularity, which cuda.h does not say: a granule and a half, or two host
 * pages, is CUDA_ERROR_INVALID_VALUE. The alignment may be 0 or any power of
 * two, also one below the granularity (H200, driver 580). */
static void reserve_takes_granule_multiples_and_power_of_two_alignments(void **state) {
  (void)state;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  gca_devptr_t b, c, no = 0;
  gca_memhandle_t h;
  int dev = 0;
  assert_status(ops->mem_address_reserve(0, gran + gran / 2, 0, &no), GCA_ERR_INVALID_ARGUMENT,
                "mem_address_reserve");
  assert_status(ops->mem_address_reserve(0, 2 * page, page, &no), GCA_ERR_INVALID_ARGUMENT,
                "mem_address_reserve");
  assert_status(ops->mem_address_reserve(0, 0, 0, &no), GCA_ERR_INVALID_ARGUMENT,
                "mem_address_reserve");
  assert_status(ops->mem_address_reserve(0, gran, 3 * gran, &no), GCA_ERR_INVALID_ARGUMENT,
                "mem_address_reserve");
  assert_int_equal(no, 0);
  assert_ok(ops->mem_address_reserve(0, gran, 8 * gran, &c));
  assert_int_equal(c % (8 * gran), 0);
  assert_ok(ops->mem_address_reserve(0, gran, gran / 2, &b)); /* alignment below a granule */
  assert_int_equal(b % (gran / 2), 0);
  /* The granule reserved with the large alignment maps as usual. */
  assert_ok(ops->mem_create(0, gran, &h));
  assert_ok(ops->mem_map(c, gran, 0, h));
  assert_ok(ops->mem_set_access(c, gran, &dev, 1));
  dev_write(c + gran - 4, 0x0dd);
  assert_int_equal(dev_read(c + gran - 4), 0x0dd);
  assert_ok(ops->mem_unmap(c, gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, b, gran));
  assert_ok(ops->mem_address_free(0, c, gran));
  assert_int_equal(used(), 0);
}

/* cuMemSetAccess and cuMemUnmap may span adjacent mappings of different
 * handles as long as each is covered whole; afterwards the range is a
 * reservation again, and unmapping its unmapped parts succeeds (H200, driver
 * 580; cuda.h does not say). */
/* An unmap may cover unmapped bytes between mappings: two one-granule
 * mappings with a granule between them go in one call (H200, driver 580). */
static void unmap_may_span_a_gap_between_mappings(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h1, h2;
  assert_ok(ops->mem_address_reserve(0, 4 * gran, 0, &base));
  assert_ok(ops->mem_create(0, gran, &h1));
  assert_ok(ops->mem_create(0, gran, &h2));
  assert_ok(ops->mem_map(base, gran, 0, h1));
  assert_ok(ops->mem_map(base + 2 * gran, gran, 0, h2));
  assert_ok(ops->mem_release(h1));
  assert_ok(ops->mem_release(h2));
  assert_ok(ops->mem_unmap(base, 3 * gran));
  assert_int_equal(used(), 0);
  assert_ok(ops->mem_unmap(base, gran)); /* unmapped already */
  assert_ok(ops->mem_address_free(0, base, 4 * gran));
}

static void unmap_may_span_adjacent_mappings_whole(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h1, h2;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, 4 * gran, 0, &base));
  assert_ok(ops->mem_create(0, 2 * gran, &h1));
  assert_ok(ops->mem_create(0, 2 * gran, &h2));
  assert_ok(ops->mem_map(base, 2 * gran, 0, h1));
  assert_ok(ops->mem_map(base + 2 * gran, 2 * gran, 0, h2));
  assert_ok(ops->mem_set_access(base, 4 * gran, &dev, 1));
  dev_write(base, 1);
  dev_write(base + 2 * gran, 2);
  assert_int_equal(dev_read(base) + dev_read(base + 2 * gran), 3);
  assert_ok(ops->mem_release(h1));
  assert_ok(ops->mem_release(h2));
  assert_ok(ops->mem_unmap(base, 4 * gran));
  assert_int_equal(used(), 0);
  assert_ok(ops->mem_unmap(base, 2 * gran)); /* reserved, no longer mapped */
  assert_ok(ops->mem_unmap(base + 2 * gran, 2 * gran));
  /* The range is a reservation again: it can be mapped anew. */
  assert_ok(ops->mem_create(0, 4 * gran, &h1));
  assert_ok(ops->mem_map(base, 4 * gran, 0, h1));
  assert_ok(ops->mem_set_access(base, 4 * gran, &dev, 1));
  dev_write(base + 2 * gran, 5);
  assert_int_equal(dev_read(base + 2 * gran), 5);
  assert_ok(ops->mem_unmap(base, 4 * gran));
  assert_ok(ops->mem_release(h1));
  assert_ok(ops->mem_address_free(0, base, 4 * gran));
  assert_int_equal(used(), 0);
}

/* cuMemSetAccess and cuMemUnmap over part of one mapping are
 * CUDA_ERROR_INVALID_VALUE and leave it as it was; over all of it they
 * succeed, and unmapping it again succeeds as well (H200, driver 580). */
static void access_and_unmap_take_a_mapping_whole(void **state) {
  (void)state;
  gca_devptr_t base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, 4 * gran, 0, &base));
  assert_ok(ops->mem_create(0, 4 * gran, &h));
  assert_ok(ops->mem_map(base, 4 * gran, 0, h));
  assert_status(ops->mem_set_access(base + 2 * gran, 2 * gran, &dev, 1), GCA_ERR_INVALID_ARGUMENT,
                "mem_set_access");
  if (is_sim) /* nothing was granted */
    assert_int_equal(gca__sim_mem_device_of(base + 2 * gran, 4), -1);
  assert_ok(ops->mem_set_access(base, 4 * gran, &dev, 1));
  dev_write(base + 2 * gran, 6);
  assert_status(ops->mem_unmap(base, 2 * gran), GCA_ERR_INVALID_ARGUMENT, "mem_unmap");
  assert_int_equal(dev_read(base + 2 * gran), 6); /* still mapped */
  assert_ok(ops->mem_unmap(base, 4 * gran));
  assert_ok(ops->mem_unmap(base, 4 * gran)); /* a second time: nothing left to unmap */
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 4 * gran));
  assert_int_equal(used(), 0);
}

/* cuMemAddressFree of a reservation already freed is CUDA_ERROR_INVALID_VALUE
 * (H200, driver 580). */
static void address_free_twice_is_invalid(void **state) {
  (void)state;
  gca_devptr_t base;
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
  assert_status(ops->mem_address_free(0, base, 2 * gran), GCA_ERR_INVALID_ARGUMENT,
                "mem_address_free");
}

static void unmapped_and_inaccessible_addresses_fault(void **state) {
  (void)state;
  if (!is_sim)
    skip();
  gca_devptr_t base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  assert_true(test_read_faults((const void *)(uintptr_t)base));
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  assert_ok(ops->mem_map(base, 2 * gran, 0, h));
  assert_true(test_read_faults((const void *)(uintptr_t)(base + 128))); /* mapped, no access yet */
  assert_ok(ops->mem_set_access(base, 2 * gran, &dev, 1));
  assert_false(test_read_faults((const void *)(uintptr_t)(base + 128)));
  assert_ok(ops->mem_unmap(base, 2 * gran));
  assert_true(test_read_faults((const void *)(uintptr_t)(base + 128))); /* a reservation again */
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
  assert_int_equal(used(), 0);
}

static void capacity_exhaustion_is_oom_and_leaves_state_intact(void **state) {
  (void)state;
  size_t free_b, total;
  assert_ok(ops->mem_get_info(0, &free_b, &total));
  assert_true(free_b <= total);
  if (!is_sim) {
    gca_memhandle_t h;
    size_t huge = (total / gran + 1) * gran;
    assert_status(ops->mem_create(0, huge, &h), GCA_ERR_OUT_OF_MEMORY, "mem_create");
    return;
  }
  assert_int_equal(used(), 0);
  assert_ok(gca_sim_set_capacity(0, 8 * gran));
  assert_ok(ops->mem_get_info(0, &free_b, &total));
  assert_int_equal(total, 8 * gran);
  assert_int_equal(free_b, 8 * gran);

  gca_memhandle_t h[3], extra;
  gca_devptr_t base, p;
  int dev = 0;
  for (int i = 0; i < 3; i++)
    assert_ok(ops->mem_create(0, 2 * gran, &h[i]));
  assert_status(ops->mem_create(0, 4 * gran, &extra), GCA_ERR_OUT_OF_MEMORY, "mem_create");
  assert_status(ops->mem_alloc(0, 2 * gran + 1, &p), GCA_ERR_OUT_OF_MEMORY, "mem_alloc");
  assert_int_equal(used(), 6 * gran);
  assert_ok(ops->mem_get_info(0, &free_b, &total));
  assert_int_equal(free_b, 2 * gran);

  /* What was allocated still works. */
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  assert_ok(ops->mem_map(base, 2 * gran, 0, h[1]));
  assert_ok(ops->mem_set_access(base, 2 * gran, &dev, 1));
  dev_write(base, 99);
  assert_int_equal(dev_read(base), 99);

  /* Freeing makes room again. */
  assert_ok(ops->mem_release(h[0]));
  assert_ok(ops->mem_create(0, 4 * gran, &extra));
  assert_int_equal(used(), 8 * gran);
  assert_status(ops->mem_alloc(0, 1, &p), GCA_ERR_OUT_OF_MEMORY, "mem_alloc");
  assert_ok(ops->mem_release(extra));
  assert_ok(ops->mem_alloc(0, 1, &p));
  assert_ok(ops->mem_free(0, p));

  assert_ok(ops->mem_unmap(base, 2 * gran));
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
  assert_ok(ops->mem_release(h[1]));
  assert_ok(ops->mem_release(h[2]));
  assert_int_equal(used(), 0);
  assert_ok(gca_sim_set_capacity(0, 16ull << 30));
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
      resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void large_device_maps_without_touching_pages(void **state) {
  (void)state;
  if (!is_sim)
    skip();
  const uint64_t cap = 80ull << 30, size = 64ull << 30;
  assert_ok(gca_sim_set_capacity(0, cap));
  size_t free_b, total;
  assert_ok(ops->mem_get_info(0, &free_b, &total));
  assert_int_equal(total, cap);
  long rss_before = rss_kib();
  gca_devptr_t base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_address_reserve(0, size, 0, &base));
  assert_ok(ops->mem_create(0, size, &h));
  assert_ok(ops->mem_map(base, size, 0, h));
  assert_ok(ops->mem_set_access(base, size, &dev, 1));
  dev_write(base, 1);
  dev_write(base + size / 2, 2);
  dev_write(base + size - 4, 3);
  assert_int_equal(dev_read(base) + dev_read(base + size / 2) + dev_read(base + size - 4), 6);
  assert_int_equal(gca_sim_used_bytes(0), size);
  long grown = rss_kib() - rss_before;
  assert_true(grown < 256 * 1024); /* a few pages, not 64 GiB */
  assert_ok(ops->mem_unmap(base, size));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, size));
  assert_int_equal(used(), 0);
  assert_ok(gca_sim_set_capacity(0, 16ull << 30));
}

static void classic_alloc_is_aligned_usable_and_freed(void **state) {
  (void)state;
  gca_devptr_t p, q;
  assert_ok(ops->mem_alloc(0, 1000, &p));
  assert_ok(ops->mem_alloc(0, 3 * gran, &q));
  assert_int_equal(p % 256, 0);
  if (is_sim) {
    assert_int_equal(p % gran, 0);
    assert_int_equal(used(), 4 * gran);
  }
  dev_write(p + 996, 0xc1a55);
  dev_write(q + 3 * gran - 4, 0xc1a56);
  assert_int_equal(dev_read(p + 996), 0xc1a55);
  assert_int_equal(dev_read(q + 3 * gran - 4), 0xc1a56);
  assert_ok(ops->mem_free(0, p));
  assert_ok(ops->mem_free(0, q));
  assert_ok(ops->mem_free(0, 0)); /* as cuMemFree(0) */
  assert_int_equal(used(), 0);
}

static void small_classic_allocations_share_chunks_and_are_256_aligned(void **state) {
  (void)state;
  enum { N = 1000, SIZE = 512 };
  static gca_devptr_t p[N];
  size_t free0, total, free1;
  assert_ok(ops->mem_get_info(0, &free0, &total));
  for (int i = 0; i < N; i++) {
    assert_ok(ops->mem_alloc(0, SIZE, &p[i]));
    assert_int_equal(p[i] % 256, 0);
  }
  for (int i = 0; i < N; i++)
    dev_write(p[i], 0x5000u + (uint32_t)i);
  for (int i = 0; i < N; i++) {
    assert_int_equal(dev_read(p[i]), 0x5000u + (uint32_t)i); /* none overlaps another */
  }
  assert_ok(ops->mem_get_info(0, &free1, &total));
  if (is_sim) { /* 500 KB of requests fit one 2 MiB chunk */
    assert_int_equal(used(), gran);
    assert_int_equal(free0 - free1, gran);
    dev_write(p[N - 1] + SIZE + 64, 1); /* past the end, inside the chunk: no fault */
  }
  for (int i = 0; i < N - 1; i++)
    assert_ok(ops->mem_free(0, p[i]));
  if (is_sim)
    assert_int_equal(used(), gran); /* the chunk stays while one allocation lives in it */
  assert_int_equal(dev_read(p[N - 1]), 0x5000u + N - 1);
  assert_ok(ops->mem_free(0, p[N - 1]));
  assert_int_equal(used(), 0); /* the last free gives the chunk back */
  if (is_sim) {
    assert_ok(ops->mem_get_info(0, &free1, &total));
    assert_int_equal(free1, free0);
  }
}

/* A free racing a write held back behind a gate. */
typedef struct free_race {
  test_gate_t gate;
  atomic_bool freed;
  bool freed_when_written;
  gca_devptr_t p;
  gca_status_t st;
} free_race_t;

static void after_write(void *arg) {
  free_race_t *r = arg;
  r->freed_when_written = atomic_load(&r->freed);
}

static void *freer(void *arg) {
  free_race_t *r = arg;
  r->st = ops->mem_free(0, r->p);
  atomic_store(&r->freed, true);
  test_gate_open(&r->gate); /* a mem_free that did not wait must not leave the stream blocked */
  return NULL;
}

/* cuMemFree synchronizes: a write queued (behind a gate) before the free lands
 * before the memory is released. On sim the gate opens only once mem_free is
 * waiting (a hook), so a free that returned early is caught every time. */
static void mem_free_waits_for_work_queued_on_the_device(void **state) {
  (void)state;
  free_race_t r = {.gate = TEST_GATE_INIT};
  gca_stream_t s;
  gca_devptr_t keep; /* keeps a sim chunk mapped, so an early free shows as a late write */
  pthread_t t;
  assert_ok(ops->mem_alloc(0, 4096, &keep));
  assert_ok(ops->mem_alloc(0, 4096, &r.p));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->launch_host_func(s, test_gate_pass, &r.gate));
  assert_ok(ops->memset_d32_async(r.p, 0x5eed, 1024, s));
  assert_ok(ops->launch_host_func(s, after_write, &r));
  if (is_sim)
    gca__sim_mem_free_wait_hook(test_gate_open, &r.gate);
  assert_int_equal(pthread_create(&t, NULL, freer, &r), 0);
  if (!is_sim)
    test_gate_open(&r.gate);
  pthread_join(t, NULL);
  if (is_sim)
    gca__sim_mem_free_wait_hook(NULL, NULL);
  assert_ok(r.st);
  assert_false(r.freed_when_written);
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, keep));
  assert_int_equal(used(), 0);
}

typedef struct queued_write {
  test_gate_t gate;
  atomic_bool written;
} queued_write_t;

static void mark_written(void *arg) {
  atomic_store(&((queued_write_t *)arg)->written, true);
}

/* The VMM calls do not wait for work queued on the device, unlike mem_free
 * (above): an expandable segment's growth, move or release stalls no stream.
 * Seen on an H200 (driver 580): with a kernel running on another stream,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
 * cuMemAddressReserve and cuMemAddressFree each returned within 0.2 ms, the
 * kernel still running, where cuMemFree returned after it. Here a write
 * queued behind a closed gate stays queued through a whole round trip on
 * other memory; a call that waited for it would never return (the
 * harness's timeout). */
static void vmm_calls_do_not_wait_for_work_queued_on_the_device(void **state) {
  (void)state;
  queued_write_t q = {.gate = TEST_GATE_INIT};
  gca_stream_t s;
  gca_devptr_t busy, base;
  gca_memhandle_t h;
  int dev = 0;
  assert_ok(ops->mem_alloc(0, 4096, &busy));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->launch_host_func(s, test_gate_pass, &q.gate));
  assert_ok(ops->memset_d32_async(busy, 0x5eed, 1024, s));
  assert_ok(ops->launch_host_func(s, mark_written, &q));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  assert_ok(ops->mem_create(0, gran, &h));
  assert_ok(ops->mem_map(base, gran, 0, h));
  assert_ok(ops->mem_set_access(base, gran, &dev, 1));
  assert_ok(ops->mem_unmap(base, gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
  assert_false(atomic_load(&q.written));
  test_gate_open(&q.gate);
  assert_ok(ops->stream_synchronize(s));
  assert_true(atomic_load(&q.written));
  assert_int_equal(dev_read(busy), 0x5eed);
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, busy));
  assert_int_equal(used(), 0);
}

/* One handle maps at two addresses as the same memory (cuMemMap maps a
 * handle into any reservation that is not mapped; Note [Lent granules]):
 * a write through one is read through the other, a write queued on a
 * stream through one and then one through the other land in stream order,
 * the handle released while both map it keeps its memory until the last
 * unmap, and unmapping one leaves the other whole. */
static void a_handle_maps_at_two_addresses_as_the_same_memory(void **state) {
  (void)state;
  gca_memhandle_t h;
  gca_devptr_t a, b;
  gca_stream_t s;
  int dev = 0;
  assert_ok(ops->mem_create(0, gran, &h));
  assert_ok(ops->mem_address_reserve(0, gran, 0, &a));
  assert_ok(ops->mem_address_reserve(0, gran, 0, &b));
  assert_ok(ops->mem_map(a, gran, 0, h));
  assert_ok(ops->mem_set_access(a, gran, &dev, 1));
  assert_ok(ops->mem_map(b, gran, 0, h));
  assert_ok(ops->mem_set_access(b, gran, &dev, 1));
  if (is_sim)
    assert_int_equal(used(), gran); /* one handle's memory */
  dev_write(a + 8, 0xa1a5);
  assert_int_equal(dev_read(b + 8), 0xa1a5);
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->memset_d32_async(a, 0x01d, gran / 4, s));
  assert_ok(ops->memset_d32_async(b + 64, 0x2e3, 4, s));
  assert_ok(ops->stream_synchronize(s));
  assert_int_equal(dev_read(b), 0x01d);
  assert_int_equal(dev_read(a + 64), 0x2e3); /* the later write, through the other address */
  assert_int_equal(dev_read(a + 80), 0x01d);
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_unmap(a, gran));
  dev_write(b + 16, 0xb0b);
  assert_int_equal(dev_read(b + 16), 0xb0b);
  if (is_sim)
    assert_int_equal(used(), gran); /* held by the mapping that is left */
  assert_ok(ops->mem_unmap(b, gran));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_address_free(0, a, gran));
  assert_ok(ops->mem_address_free(0, b, gran));
  assert_int_equal(used(), 0);
}

static void exported_fd_imports_as_the_same_memory(void **state) {
  (void)state;
  int attr = 0;
  assert_ok(ops->device_attr(0, GCA_ATTR_POSIX_FD_SUPPORTED, &attr));
  if (!attr)
    skip();
  gca_memhandle_t h, h2;
  gca_devptr_t a, b;
  int fd = -1, dev = 0;
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  assert_ok(ops->mem_export_fd(h, &fd));
  assert_true(fd >= 0);
  assert_ok(ops->mem_import_fd(0, fd, &h2));
  assert_true(h2 != 0);
  assert_int_equal(close(fd), 0);
  if (is_sim)
    assert_int_equal(used(), 2 * gran); /* importing takes no capacity */
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &a));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &b));
  assert_ok(ops->mem_map(a, 2 * gran, 0, h));
  assert_ok(ops->mem_map(b, 2 * gran, 0, h2));
  assert_ok(ops->mem_set_access(a, 2 * gran, &dev, 1));
  assert_ok(ops->mem_set_access(b, 2 * gran, &dev, 1));
  dev_write(a + 40, 0x1bc);
  assert_int_equal(dev_read(b + 40), 0x1bc);
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_unmap(a, 2 * gran));
  dev_write(b + 44, 0x1bd); /* still held by the imported handle's mapping */
  assert_int_equal(dev_read(b + 44), 0x1bd);
  assert_ok(ops->mem_unmap(b, 2 * gran));
  assert_ok(ops->mem_release(h2));
  assert_ok(ops->mem_address_free(0, a, 2 * gran));
  assert_ok(ops->mem_address_free(0, b, 2 * gran));
  assert_int_equal(used(), 0);
}

/* Where fabric handles can be made (GCA_ATTR_FABRIC_SUPPORTED: on cuda the
 * device attribute confirmed by a probe, Note [Fabric handles], so an H200
 * without an IMEX channel answers 0 and this skips; the sim with
 * GCA_SIM_FABRIC=1, as this suite runs it), a handle exported as a fabric handle
 * (cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_FABRIC) imports as the same memory, and the
 * imported handle keeps it after the exporter releases its own, as with fds. */
static void exported_fabric_handle_imports_as_the_same_memory(void **state) {
  (void)state;
  int attr = 0;
  assert_ok(ops->device_attr(0, GCA_ATTR_FABRIC_SUPPORTED, &attr));
  if (!attr)
    skip();
  gca_memhandle_t h, h2;
  gca_devptr_t a, b;
  uint8_t name[GCA_FABRIC_HANDLE_LEN];
  int dev = 0;
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  assert_ok(ops->mem_export_fabric(h, name));
  assert_ok(ops->mem_import_fabric(0, name, &h2));
  assert_true(h2 != 0);
  if (is_sim)
    assert_int_equal(used(), 2 * gran); /* importing takes no capacity */
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &a));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &b));
  assert_ok(ops->mem_map(a, 2 * gran, 0, h));
  assert_ok(ops->mem_map(b, 2 * gran, 0, h2));
  assert_ok(ops->mem_set_access(a, 2 * gran, &dev, 1));
  assert_ok(ops->mem_set_access(b, 2 * gran, &dev, 1));
  dev_write(a + 48, 0xfab);
  assert_int_equal(dev_read(b + 48), 0xfab);
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_unmap(a, 2 * gran));
  dev_write(b + 52, 0xfac); /* still held by the imported handle's mapping */
  assert_int_equal(dev_read(b + 52), 0xfac);
  assert_ok(ops->mem_unmap(b, 2 * gran));
  assert_ok(ops->mem_release(h2));
  assert_ok(ops->mem_address_free(0, a, 2 * gran));
  assert_ok(ops->mem_address_free(0, b, 2 * gran));
  assert_int_equal(used(), 0);
}

#define THREADS 4
#define ROUNDS  40

static void *vmm_worker(void *arg) {
  uint32_t tag = (uint32_t)(uintptr_t)arg;
  int dev = 0;
  for (int i = 0; i < ROUNDS; i++) {
    gca_devptr_t base;
    gca_memhandle_t h;
    if (ops->mem_address_reserve(0, 2 * gran, 0, &base) != GCA_OK)
      return (void *)1;
    if (ops->mem_create(0, gran, &h) != GCA_OK || ops->mem_map(base + gran, gran, 0, h) != GCA_OK ||
        ops->mem_set_access(base + gran, gran, &dev, 1) != GCA_OK)
      return (void *)2;
    dev_write(base + gran + 4 * tag, tag * 1000 + (uint32_t)i);
    if (dev_read(base + gran + 4 * tag) != tag * 1000 + (uint32_t)i)
      return (void *)3;
    if (ops->mem_unmap(base + gran, gran) != GCA_OK || ops->mem_release(h) != GCA_OK ||
        ops->mem_address_free(0, base, 2 * gran) != GCA_OK)
      return (void *)4;
  }
  return NULL;
}

static void concurrent_vmm_traffic_keeps_counts_and_bytes_exact(void **state) {
  (void)state;
  int64_t maps = is_sim ? gca_sim_call_count("mem_map") : 0;
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, vmm_worker, (void *)i), 0);
  for (int i = 0; i < THREADS; i++) {
    void *ret = (void *)1;
    pthread_join(t[i], &ret);
    if (ret != NULL)
      fail_msg("worker %d failed at step %d: %s", i, (int)(uintptr_t)ret, gca_last_error());
  }
  if (is_sim)
    assert_int_equal(gca_sim_call_count("mem_map") - maps, THREADS * ROUNDS);
  assert_int_equal(used(), 0);
}

static void device_reports_vmm_and_granularity(void **state) {
  (void)state;
  int v = 0, n = 0;
  size_t rec = 0;
  char name[64];
  assert_ok(ops->device_count(&n));
  assert_true(n >= 1);
  assert_ok(ops->device_attr(0, GCA_ATTR_VMM_SUPPORTED, &v));
  assert_int_equal(v, 1);
  assert_ok(ops->mem_granularity(0, true, &rec));
  assert_true(gran > 0 && rec >= gran && rec % gran == 0);
  assert_ok(ops->device_name(0, name, sizeof(name)));
  assert_true(strlen(name) > 0);
  assert_ok(ops->device_can_access_peer(0, 0, &v));
  assert_int_equal(v, 0); /* a device is not its own peer */
  if (is_sim) {
    assert_int_equal(gran, 2u << 20);
    assert_int_equal(rec, 2u << 20);
    assert_string_equal(name, "gca sim device 0");
    assert_ok(ops->device_attr(0, GCA_ATTR_CC_MAJOR, &v));
    assert_int_equal(v, 9);
    assert_ok(ops->device_attr(0, GCA_ATTR_MULTIPROCESSOR_COUNT, &v));
    assert_int_equal(v, 132);
  }
}

/* ---- per-device access rights (two devices) ---- */

/* Skips unless there are two devices and device 1 may access device 0's memory. */
static void need_two_peers(void) {
  int n = 0, can = 0;
  assert_ok(ops->device_count(&n));
  if (n >= 2)
    assert_ok(ops->device_can_access_peer(1, 0, &can));
  if (n < 2 || !can) {
    printf("SKIP: needs two devices, the second able to access the first (found %d)\n", n);
    skip();
  }
}

/* The detail an access failure of `op` by `dev` at `at` in [ptr, ptr+len) starts with. */
static const char *denied(char *buf, size_t len, const char *op, int dev, gca_devptr_t at,
                          gca_devptr_t ptr, size_t n) {
  snprintf(buf, len, "%s: device %d cannot access 0x%llx in [0x%llx, 0x%llx)", op, dev,
           (unsigned long long)at, (unsigned long long)ptr, (unsigned long long)(ptr + n));
  return buf;
}

/* A VMM range of two one-granule mappings on device 0, granted to device 0
 * only: device 1's copies and kernels that touch it fail at the call (sim; a
 * GPU faults while running them) and nothing is queued; once mem_set_access
 * grants device 1 they work. A copy is checked over every byte it touches. */
static void vmm_range_is_reachable_only_by_devices_granted_access(void **state) {
  (void)state;
  need_two_peers();
  gca_devptr_t base;
  gca_memhandle_t h[2];
  gca_stream_t s1;
  int dev0 = 0, dev1 = 1;
  char want[160];
  uint32_t host[16] = {0};
  gca_devptr_t hp = (gca_devptr_t)(uintptr_t)host;
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  for (int i = 0; i < 2; i++) {
    assert_ok(ops->mem_create(0, gran, &h[i]));
    assert_ok(ops->mem_map(base + (size_t)i * gran, gran, 0, h[i]));
  }
  assert_ok(ops->mem_set_access(base, 2 * gran, &dev0, 1));
  dev_write(base + gran, 0xacce55);
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  if (is_sim) {
    assert_status(ops->memcpy_async(hp, base + gran, 64, s1), GCA_ERR_ILLEGAL_ADDRESS,
                  denied(want, sizeof(want), "memcpy_async", 1, base + gran, base + gran, 64));
    assert_status(ops->memcpy_async(hp, base + gran, 64, s1), GCA_ERR_ILLEGAL_ADDRESS,
                  "grants access to devices {0}");
    assert_status(ops->kernel_fill_u32(base, 1, 1, 16, s1), GCA_ERR_ILLEGAL_ADDRESS,
                  denied(want, sizeof(want), "kernel_fill_u32", 1, base, base, 64));
    assert_ok(ops->stream_query(s1)); /* nothing was queued */
    /* device 1 granted the first mapping only: a copy across the boundary fails at it */
    assert_ok(ops->mem_set_access(base, gran, &dev1, 1));
    assert_status(ops->memcpy_async(hp, base + gran - 32, 64, s1), GCA_ERR_ILLEGAL_ADDRESS,
                  denied(want, sizeof(want), "memcpy_async", 1, base + gran, base + gran - 32, 64));
  }
  assert_ok(ops->mem_set_access(base, 2 * gran, &dev1, 1));
  assert_ok(ops->memcpy_async(hp, base + gran, 64, s1));
  assert_ok(ops->stream_synchronize(s1));
  assert_int_equal(host[0], 0xacce55);
  assert_ok(ops->kernel_fill_u32(base, 5, 1, 16, s1));
  assert_ok(ops->stream_synchronize(s1));
  assert_int_equal(dev_read(base + 8), 7);
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->mem_unmap(base, 2 * gran));
  assert_ok(ops->mem_release(h[0]));
  assert_ok(ops->mem_release(h[1]));
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
  assert_int_equal(used(), 0);
}

/* Device 1's kernels and memsets cannot touch device 0's mem_alloc memory
 * until device 1 enables peer access to device 0 (cuCtxEnablePeerAccess);
 * copies can (the driver stages them through the host), and the access is one
 * way. Must run before anything enables peer access between devices 0 and 1. */
static void classic_memory_of_another_device_needs_peer_access(void **state) {
  (void)state;
  need_two_peers();
  gca_devptr_t a, b;
  gca_stream_t s0, s1;
  char want[160];
  assert_ok(ops->mem_alloc(0, 4096, &a));
  assert_ok(ops->mem_alloc(1, 4096, &b));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s0));
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  assert_ok(ops->kernel_fill_u32(a, 10, 1, 16, s0));
  assert_ok(ops->stream_synchronize(s0));
  if (is_sim) {
    assert_status(ops->kernel_add_u32(b, a, a, 16, s1), GCA_ERR_ILLEGAL_ADDRESS,
                  denied(want, sizeof(want), "kernel_add_u32", 1, a, a, 64));
    assert_status(ops->kernel_add_u32(b, a, a, 16, s1), GCA_ERR_ILLEGAL_ADDRESS,
                  "device 1 has not enabled peer access to device 0");
    assert_status(ops->memset_d8_async(a, 0, 64, s1), GCA_ERR_ILLEGAL_ADDRESS,
                  denied(want, sizeof(want), "memset_d8_async", 1, a, a, 64));
    assert_ok(ops->stream_query(s1)); /* nothing was queued */
    assert_ok(ops->memcpy_async(b, a, 64, s1));
    assert_ok(ops->stream_synchronize(s1));
    assert_int_equal(dev_read(b + 4), 11);
  }
  assert_ok(ops->ctx_enable_peer_access(1, 0));
  assert_ok(ops->kernel_add_u32(b, a, a, 16, s1));
  assert_ok(ops->stream_synchronize(s1));
  assert_int_equal(dev_read(b + 12), 26);
  if (is_sim) /* one way: device 0 still cannot reach device 1's memory */
    assert_status(ops->kernel_fill_u32(b, 0, 0, 16, s0), GCA_ERR_ILLEGAL_ADDRESS,
                  denied(want, sizeof(want), "kernel_fill_u32", 0, b, b, 64));
  assert_ok(ops->stream_destroy(s0));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(1, b));
  assert_int_equal(used(), 0);
}

static void enabling_peer_access_twice_is_already_enabled(void **state) {
  (void)state;
  need_two_peers();
  gca_status_t st = ops->ctx_enable_peer_access(0, 1);
  assert_true(st == GCA_OK || st == GCA_ERR_INVALID_STATE);
  assert_status(ops->ctx_enable_peer_access(0, 1), GCA_ERR_INVALID_STATE,
                "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED");
  assert_status(ops->ctx_enable_peer_access(1, 1), GCA_ERR_INVALID_ARGUMENT,
                "device 1 cannot be its own peer");
  assert_status(ops->ctx_enable_peer_access(0, 64), GCA_ERR_INVALID_ARGUMENT,
                "ctx_enable_peer_access");
}

/* Grants belong to a mapping: after unmap and map again, no device (not even
 * the memory's own) may touch the range until mem_set_access grants it. */
static void unmap_clears_access_grants(void **state) {
  (void)state;
  need_two_peers();
  if (!is_sim)
    skip(); /* the negative half would fault a GPU */
  gca_devptr_t base;
  gca_memhandle_t h;
  gca_stream_t s0, s1;
  int both[2] = {0, 1}, dev0 = 0;
  uint32_t host[4] = {0};
  gca_devptr_t hp = (gca_devptr_t)(uintptr_t)host;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s0));
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &base));
  assert_ok(ops->mem_create(0, 2 * gran, &h));
  assert_ok(ops->mem_map(base, 2 * gran, 0, h));
  assert_ok(ops->mem_set_access(base, 2 * gran, both, 2));
  assert_ok(ops->memcpy_async(hp, base, 16, s1));
  assert_ok(ops->stream_synchronize(s1));
  assert_ok(ops->mem_unmap(base, 2 * gran));
  assert_ok(ops->mem_map(base, 2 * gran, 0, h));
  /* granted to no device, the range is not usable device memory at all */
  assert_status(ops->memcpy_async(hp, base, 16, s1), GCA_ERR_INVALID_ARGUMENT,
                "neither mapped device memory nor host memory");
  assert_status(ops->memcpy_async(hp, base, 16, s0), GCA_ERR_INVALID_ARGUMENT,
                "neither mapped device memory nor host memory");
  assert_ok(ops->mem_set_access(base, 2 * gran, &dev0, 1));
  assert_ok(ops->memcpy_async(hp, base, 16, s0));
  assert_ok(ops->stream_synchronize(s0));
  assert_status(ops->memset_d32_async(base, 1, 4, s1), GCA_ERR_ILLEGAL_ADDRESS,
                "grants access to devices {0}");
  assert_ok(ops->stream_destroy(s0));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->mem_unmap(base, 2 * gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, base, 2 * gran));
  assert_int_equal(used(), 0);
}

int main(void) {
  test_filter_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(vmm_round_trip_returns_used_bytes_to_zero),
      cmocka_unit_test(released_handle_lives_until_its_mapping_is_gone),
      cmocka_unit_test(mappings_of_one_handle_alias),
      cmocka_unit_test(map_at_a_nonzero_offset_is_not_supported),
      cmocka_unit_test(map_of_part_of_a_handle_is_not_supported),
      cmocka_unit_test(reserve_takes_granule_multiples_and_power_of_two_alignments),
      cmocka_unit_test(unmap_may_span_adjacent_mappings_whole),
      cmocka_unit_test(unmap_may_span_a_gap_between_mappings),
      cmocka_unit_test(access_and_unmap_take_a_mapping_whole),
      cmocka_unit_test(address_free_twice_is_invalid),
      cmocka_unit_test(unmapped_and_inaccessible_addresses_fault),
      cmocka_unit_test(capacity_exhaustion_is_oom_and_leaves_state_intact),
      cmocka_unit_test(large_device_maps_without_touching_pages),
      cmocka_unit_test(classic_alloc_is_aligned_usable_and_freed),
      cmocka_unit_test(small_classic_allocations_share_chunks_and_are_256_aligned),
      cmocka_unit_test(mem_free_waits_for_work_queued_on_the_device),
      cmocka_unit_test(vmm_calls_do_not_wait_for_work_queued_on_the_device),
      cmocka_unit_test(a_handle_maps_at_two_addresses_as_the_same_memory),
      cmocka_unit_test(exported_fd_imports_as_the_same_memory),
      cmocka_unit_test(exported_fabric_handle_imports_as_the_same_memory),
      cmocka_unit_test(concurrent_vmm_traffic_keeps_counts_and_bytes_exact),
      cmocka_unit_test(device_reports_vmm_and_granularity),
      cmocka_unit_test(vmm_range_is_reachable_only_by_devices_granted_access),
      cmocka_unit_test(classic_memory_of_another_device_needs_peer_access),
      cmocka_unit_test(enabling_peer_access_twice_is_already_enabled),
      cmocka_unit_test(unmap_clears_access_grants),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
