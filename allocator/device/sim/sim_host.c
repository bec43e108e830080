/* SPDX-License-Identifier: Apache-2.0 */
/* sim_host.c - the sim's pinned host memory: host_alloc / host_free
 * (cuMemHostAlloc / cuMemFreeHost) and host_register / host_unregister
 * (cuMemHostRegister / cuMemHostUnregister).
 *
 * The one idea: the sim cannot page-lock anything, so "pinned" is a fact it
 * records: a sorted table of pinned ranges, each either memory host_alloc
 * mapped or existing host memory host_register named. Copies ask
 * gca__sim_host_is_pinned() to decide between the driver's pinned and
 * pageable behaviour (Note [Sim copies], sim_stream.c); everything else about
 * the memory is ordinary host memory.
 *
 * The driver's rules kept: host_free takes exactly what host_alloc returned
 * (CUDA_ERROR_INVALID_VALUE otherwise), host_register refuses a range that
 * overlaps pinned memory (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) or is not
 * host memory (device memory, unmapped pages: CUDA_ERROR_INVALID_VALUE), and
 * host_unregister takes the base of a registered range
 * (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED). Both creating ops count their bytes
 * for after_bytes fault rules.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim.h"
#include "sim_stream.h"

typedef struct pinned_range {
  uintptr_t base;
  size_t size;
  bool allocated; /* host_alloc (mapped here) rather than host_register */
} pinned_range_t;

/* Sorted by base, disjoint: ranges[i].base + ranges[i].size <= ranges[i+1].base. */
static struct {
  pthread_mutex_t mu;
  pinned_range_t *v;
  size_t n, cap;
  size_t bytes; /* sum of sizes */
} pinned = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Index of the first range whose end is above p (n when none). Under mu. */
static size_t lower(uintptr_t p) {
  size_t lo = 0, hi = pinned.n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (pinned.v[mid].base + pinned.v[mid].size <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static bool overlaps(uintptr_t p, size_t len) {
  size_t i = lower(p);
  return i < pinned.n && pinned.v[i].base < p + len;
}

/* Inserts [p, p+len) (which overlaps nothing). Under mu. */
static bool insert(uintptr_t p, size_t len, bool allocated) {
  if (pinned.n == pinned.cap) {
    size_t cap = pinned.cap ? pinned.cap * 2 : 64;
    pinned_range_t *v =
        GCA_FAILPOINT("sim_host_table") ? NULL : realloc(pinned.v, cap * sizeof(*v));
    if (!v)
      return false;
    pinned.v = v;
    pinned.cap = cap;
  }
  size_t i = lower(p);
  memmove(&pinned.v[i + 1], &pinned.v[i], (pinned.n - i) * sizeof(*pinned.v));
  pinned.v[i] = (pinned_range_t){.base = p, .size = len, .allocated = allocated};
  pinned.n++;
  pinned.bytes += len;
  return true;
}

/* Removes the range based at p whose kind is `allocated`; its size in *len. */
static bool take(uintptr_t p, bool allocated, size_t *len) {
  size_t i = lower(p);
  if (i == pinned.n || pinned.v[i].base != p || pinned.v[i].allocated != allocated)
    return false;
  *len = pinned.v[i].size;
  pinned.bytes -= *len;
  memmove(&pinned.v[i], &pinned.v[i + 1], (pinned.n - i - 1) * sizeof(*pinned.v));
  pinned.n--;
  return true;
}

bool gca__sim_host_is_pinned(gca_devptr_t p, size_t len) {
  if (len == 0)
    return true;
  pthread_mutex_lock(&pinned.mu);
  size_t i = lower((uintptr_t)p);
  bool in = i < pinned.n && pinned.v[i].base <= (uintptr_t)p &&
            (uintptr_t)p + len <= pinned.v[i].base + pinned.v[i].size;
  pthread_mutex_unlock(&pinned.mu);
  return in;
}

size_t gca__sim_host_pinned_bytes(void) {
  pthread_mutex_lock(&pinned.mu);
  size_t b = pinned.bytes;
  pthread_mutex_unlock(&pinned.mu);
  return b;
}

static size_t page_round(size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (size + page - 1) & ~(page - 1);
}

/* Page-locked memory is physical memory: nothing beyond the host's RAM can be pinned. */
static bool beyond_ram(size_t size) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 && size / (size_t)page > (size_t)pages;
}

static gca_status_t sim_host_alloc(size_t size, void **out) {
  GCA_SIM_ENTER(host_alloc, size);
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "host_alloc: out is NULL");
  if (size == 0 || beyond_ram(size))
    return gca__error(size == 0 ? GCA_ERR_INVALID_ARGUMENT : GCA_ERR_OUT_OF_MEMORY,
                      "host_alloc: cannot pin %zu bytes%s", size,
                      size == 0 ? " (CUDA_ERROR_INVALID_VALUE)" : " (CUDA_ERROR_OUT_OF_MEMORY)");
  size_t len = page_round(size);
  void *p =
      mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "host_alloc: no host memory for %zu bytes", size);
  pthread_mutex_lock(&pinned.mu);
  bool ok = insert((uintptr_t)p, len, true);
  pthread_mutex_unlock(&pinned.mu);
  if (!ok) {
    munmap(p, len);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "host_alloc: no host memory to record %zu pinned bytes", size);
  }
  *out = p;
  return GCA_OK;
}

static gca_status_t sim_host_free(void *ptr) {
  GCA_SIM_ENTER(host_free, 0);
  size_t len = 0;
  pthread_mutex_lock(&pinned.mu);
  bool ok = ptr && take((uintptr_t)ptr, true, &len);
  pthread_mutex_unlock(&pinned.mu);
  if (!ok)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "host_free: %p is not memory host_alloc returned (CUDA_ERROR_INVALID_VALUE)",
                      ptr);
  munmap(ptr, len);
  return GCA_OK;
}

static gca_status_t sim_host_register(void *ptr, size_t size) {
  GCA_SIM_ENTER(host_register, size);
  uintptr_t p = (uintptr_t)ptr;
  if (!ptr || size == 0 || p + size < p)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "host_register: [%p, +%zu) is not a host range (CUDA_ERROR_INVALID_VALUE)",
                      ptr, size);
  if (beyond_ram(size))
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "host_register: cannot pin %zu bytes, more than the host's memory "
                      "(CUDA_ERROR_OUT_OF_MEMORY)",
                      size);
  if (!gca__sim_is_host_mem((gca_devptr_t)p, size))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "host_register: [%p, +%zu) is not mapped host memory "
                      "(CUDA_ERROR_INVALID_VALUE)",
                      ptr, size);
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&pinned.mu);
  if (overlaps(p, size))
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "host_register: [%p, +%zu) overlaps pinned memory "
                    "(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)",
                    ptr, size);
  else if (!insert(p, size, false))
    st = gca__error(GCA_ERR_OUT_OF_MEMORY,
                    "host_register: no host memory to record %zu pinned bytes", size);
  pthread_mutex_unlock(&pinned.mu);
  return st;
}

static gca_status_t sim_host_unregister(void *ptr) {
  GCA_SIM_ENTER(host_unregister, 0);
  size_t len = 0;
  pthread_mutex_lock(&pinned.mu);
  bool ok = ptr && take((uintptr_t)ptr, false, &len);
  pthread_mutex_unlock(&pinned.mu);
  if (!ok)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "host_unregister: %p is not the base of a registered range "
                      "(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)",
                      ptr);
  return GCA_OK;
}

void gca__sim_host_ops(gca_device_ops_t *ops) {
  ops->host_alloc = sim_host_alloc;
  ops->host_free = sim_host_free;
  ops->host_register = sim_host_register;
  ops->host_unregister = sim_host_unregister;
}
