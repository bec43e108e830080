/* SPDX-License-Identifier: Apache-2.0 */
/* sim_mem.c - the sim's device memory: physical allocations, address
 * reservations and the mappings between them, classic allocations, IPC fds.
 *
 * The one idea: device memory is host memory arranged the way the driver's
 * virtual memory management arranges it. A physical allocation (mem_create) is
 * a sparse memfd, so untouched pages cost nothing; a reservation is a
 * PROT_NONE, MAP_NORESERVE anonymous range; mem_map puts the memfd over part of
 * a reservation with MAP_FIXED|MAP_SHARED and no access, mem_set_access makes
 * it readable and writable, mem_unmap puts PROT_NONE anonymous pages back. So
 * two mappings of one handle alias, and touching an unmapped or inaccessible
 * device address faults as it would on a GPU. Classic allocations (mem_alloc)
 * are built from the same primitives, mapped read-write at once; small ones
 * share 2 MiB chunks (Note [Sim classic allocations]), and mem_free waits for
 * the device's queued work first (Note [Sim mem_free synchronizes]).
 *
 * The bookkeeping is three sorted arrays under one mutex: handles by id,
 * reservations by base, and mappings by base, each searched by binary search.
 * A mapping is always one whole allocation and stays as mapped until unmapped
 * (Note [Sim whole mappings]). Handles are ids, never pointers, so a stale or
 * foreign handle is a status, not a crash.
 *
 * Note [Sim access rights]: as on the driver, access is per device, not per
 * process. A mapping records the devices granted access to it (a bitmask set
 * by mem_set_access, which only adds devices, and gone with the mapping at
 * mem_unmap, so a re-mapping starts with none). A classic allocation is
 * accessible by its own device and by every device that enabled peer access to
 * its owner (ctx_enable_peer_access, cuCtxEnablePeerAccess), which is why a
 * classic mapping's rights are computed from the peer table when asked rather
 * than stored. The host range is readable and writable as soon as any device
 * has access (a sim device's work is host code), so the rights are enforced
 * where work is submitted: gca__sim_mem_check_access, called for every range
 * a copy, memset or kernel touches, fails with GCA_ERR_ILLEGAL_ADDRESS at the
 * call and nothing is queued. A GPU would fault while running the work and
 * leave its context unusable (CUDA_ERROR_ILLEGAL_ADDRESS is sticky); the sim
 * reports earlier and stays usable, which is what tests need. Copies are the
 * exception for classic memory: the driver stages a copy between two
 * devices' cuMemAlloc memory through the host when peer access is off, so a
 * copy needs no peer access for it; VMM memory it must be granted.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "lock.h"
#include "sim_mem.h"

#define HANDLE_TAG 0x51a0000000000000ull

/* Element types of the sorted arrays; each begins with its sort key. */
typedef struct handle_ent {
  uint64_t id;
  phys_t *phys;
} handle_ent_t;

/* A reservation [base, base+size). mapped == bytes of the mappings inside it.
 * classic: made by mem_alloc; the VMM ops do not touch it. */
typedef struct resv {
  uint64_t base;
  uint64_t size;
  uint64_t mapped;
  int dev;
  bool classic;
} resv_t;

/* A mapping [base, base+size) of all of phys (size == phys->size). Mappings are
 * disjoint and lie inside one reservation each. */
typedef struct mapping {
  uint64_t base;
  uint64_t size;
  phys_t *phys;
  uint64_t access; /* bit d: device d may touch it (Note [Sim access rights]) */
  bool classic;    /* made by mem_alloc: access is its device's plus peers' */
} mapping_t;

typedef struct vec {
  char *data;
  size_t len, cap, esz;
} vec_t;

static struct {
  pthread_mutex_t lock;
  vec_t handles; /* handle_ent_t by id */
  vec_t resvs;   /* resv_t by base */
  vec_t maps;    /* mapping_t by base */
  phys_t *all;
  uint64_t next_handle;
  /* bit p of peers[d]: d enabled access to p's memory (Note [Sim access rights]) */
  uint64_t peers[GCA_SIM_MAX_DEVICES];
} mem = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .handles = {.esz = sizeof(handle_ent_t)},
    .resvs = {.esz = sizeof(resv_t)},
    .maps = {.esz = sizeof(mapping_t)},
    .next_handle = 1,
};

/* ---- sorted arrays ---- */

static void *vec_at(const vec_t *v, size_t i) {
  return v->data + i * v->esz;
}

static uint64_t vec_key(const vec_t *v, size_t i) {
  uint64_t k;
  memcpy(&k, vec_at(v, i), sizeof(k));
  return k;
}

/* Index of the first element whose key is >= key (v->len when none). */
static size_t vec_lower(const vec_t *v, uint64_t key) {
  size_t lo = 0, hi = v->len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (vec_key(v, mid) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Index of the element whose [key, key+size) contains addr, or -1; the element's
 * second field must be its size (resv_t, mapping_t). */
static long vec_containing(const vec_t *v, uint64_t addr) {
  size_t i = vec_lower(v, addr + 1);
  if (i == 0)
    return -1;
  uint64_t kv[2];
  memcpy(kv, vec_at(v, i - 1), sizeof(kv));
  return addr - kv[0] < kv[1] ? (long)(i - 1) : -1;
}

static bool vec_insert(vec_t *v, size_t i, const void *elem) {
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 16;
    char *d = realloc(v->data, cap * v->esz);
    if (!d)
      return false;
    v->data = d;
    v->cap = cap;
  }
  memmove(vec_at(v, i + 1), vec_at(v, i), (v->len - i) * v->esz);
  memcpy(vec_at(v, i), elem, v->esz);
  v->len++;
  return true;
}

static void vec_remove(vec_t *v, size_t i, size_t n) {
  memmove(vec_at(v, i), vec_at(v, i + n), (v->len - i - n) * v->esz);
  v->len -= n;
}

/* ---- physical allocations and handles (mem.lock held) ---- */

phys_t *gca__sim_memhandle_find(gca_memhandle_t h, size_t *index) {
  size_t i = vec_lower(&mem.handles, h);
  if (i == mem.handles.len || vec_key(&mem.handles, i) != h)
    return NULL;
  if (index)
    *index = i;
  return ((handle_ent_t *)vec_at(&mem.handles, i))->phys;
}

/* Appends a new handle naming p (ids only grow, so appending keeps the order). */
gca_status_t gca__sim_memhandle_add(const char *op, phys_t *p, gca_memhandle_t *out) {
  handle_ent_t e = {.id = HANDLE_TAG | mem.next_handle, .phys = p};
  if (!vec_insert(&mem.handles, mem.handles.len, &e))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for the handle table", op);
  mem.next_handle++;
  p->refs++;
  *out = e.id;
  return GCA_OK;
}

void gca__sim_phys_link(phys_t *p) {
  p->prev = NULL;
  p->next = mem.all;
  if (mem.all)
    mem.all->prev = p;
  mem.all = p;
}

void gca__sim_phys_unref(phys_t *p) {
  GCA_ASSERT(p->refs > 0);
  if (--p->refs > 0)
    return;
  if (p->prev)
    p->prev->next = p->next;
  else
    mem.all = p->next;
  if (p->next)
    p->next->prev = p->prev;
  close(p->fd);
  if (p->charged)
    gca__sim_capacity_give(p->dev, p->charged);
  free(p);
}

/* A new allocation of `size` bytes on dev: capacity taken, sparse memfd, refs 0, linked. */
static gca_status_t phys_create(const char *op, int dev, uint64_t size, phys_t **out) {
  gca_status_t st;
  GCA_CHECK(gca__sim_capacity_take(op, dev, size));
  phys_t *p = calloc(1, sizeof(*p));
  if (!p) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for the allocation record", op);
    goto fail_give;
  }
  p->fd = memfd_create(MEMFD_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (p->fd < 0) {
    st = gca__error(GCA_ERR_DRIVER, "%s: memfd_create failed: %s", op, strerror(errno));
    goto fail_free;
  }
  if (ftruncate(p->fd, (off_t)size) != 0) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: cannot size the memfd to %llu bytes: %s", op,
                    (unsigned long long)size, strerror(errno));
    goto fail_close;
  }
  if (fcntl(p->fd, F_ADD_SEALS, MEMFD_SEALS) != 0) {
    st = gca__error(GCA_ERR_DRIVER, "%s: cannot seal the memfd: %s", op, strerror(errno));
    goto fail_close;
  }
  struct stat sb;
  if (fstat(p->fd, &sb) != 0) {
    st = gca__error(GCA_ERR_DRIVER, "%s: fstat of the memfd failed: %s", op, strerror(errno));
    goto fail_close;
  }
  p->dev = dev;
  p->size = size;
  p->charged = size;
  p->st_dev = sb.st_dev;
  p->st_ino = sb.st_ino;
  pthread_mutex_lock(&mem.lock);
  gca__sim_phys_link(p);
  pthread_mutex_unlock(&mem.lock);
  *out = p;
  return GCA_OK;

fail_close:
  close(p->fd);
fail_free:
  free(p);
fail_give:
  gca__sim_capacity_give(dev, size);
  return st;
}

void gca__sim_mem_lock(void) {
  pthread_mutex_lock(&mem.lock);
}

void gca__sim_mem_unlock(void) {
  pthread_mutex_unlock(&mem.lock);
}

phys_t *gca__sim_phys_by_inode(dev_t d, ino_t ino) {
  phys_t *p = mem.all;
  while (p && !(p->st_dev == d && p->st_ino == ino))
    p = p->next;
  return p;
}

/* ---- reservations ---- */

/* Note [Sim address space]: device addresses come from one arena of host
 * address space reserved at first use (PROT_NONE, MAP_NORESERVE), as a GPU's
 * unified virtual address space is separate from the host's heap. Ranges are
 * handed out first-fit in address order and returned on free, so the same
 * sequence of reservations yields the same addresses on every run: a seeded
 * workload replays exactly, whatever host threads map around it. When the
 * arena is full (or could not be made), plain mmap() ranges are used. */
#define VA_ARENA_MAX ((uint64_t)1 << 40)
#define VA_ARENA_MIN ((uint64_t)64 << 30)

typedef struct va_range {
  uint64_t base;
  uint64_t size;
} va_range_t;

static struct {
  pthread_mutex_t lock;
  uint64_t base, size; /* the arena; size 0 before first use or when none */
  bool tried;
  vec_t free; /* va_range_t by base, disjoint and coalesced */
} va = {.lock = PTHREAD_MUTEX_INITIALIZER, .free = {.esz = sizeof(va_range_t)}};

static void va_arena_init_locked(void) {
  va.tried = true;
  for (uint64_t size = VA_ARENA_MAX; size >= VA_ARENA_MIN; size /= 2) {
    void *raw =
        mmap(NULL, size + GRAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
      continue;
    uint64_t start = (uint64_t)(uintptr_t)raw;
    uint64_t base = (start + GRAN - 1) & ~(GRAN - 1);
    if (base > start)
      munmap(raw, (size_t)(base - start));
    if (start + GRAN > base)
      munmap((void *)(uintptr_t)(base + size), (size_t)(start + GRAN - base));
    va_range_t all = {.base = base, .size = size};
    if (!vec_insert(&va.free, 0, &all)) {
      munmap((void *)(uintptr_t)base, size);
      return;
    }
    va.base = base;
    va.size = size;
    return;
  }
}

/* First fit of `size` bytes aligned to `align` in the arena; false when none. */
static bool va_take_locked(uint64_t size, uint64_t align, uint64_t *out) {
  for (size_t i = 0; i < va.free.len; i++) {
    va_range_t *r = vec_at(&va.free, i);
    uint64_t start = (r->base + align - 1) & ~(align - 1);
    if (start < r->base || start - r->base > r->size || r->size - (start - r->base) < size)
      continue;
    uint64_t end = start + size, rend = r->base + r->size;
    va_range_t tail = {.base = end, .size = rend - end};
    if (start > r->base) {
      r->size = start - r->base;
      if (tail.size && !vec_insert(&va.free, i + 1, &tail)) {
        r->size = rend - r->base;
        return false;
      }
    } else if (tail.size) {
      *r = tail;
    } else {
      vec_remove(&va.free, i, 1);
    }
    *out = start;
    return true;
  }
  return false;
}

/* Reserves a PROT_NONE, MAP_NORESERVE range of `size` bytes aligned to `align`
 * (Note [Sim address space]). */
static gca_status_t reserve_range(const char *op, uint64_t size, uint64_t align, uint64_t *out) {
  if (size > UINT64_MAX - align)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: %llu bytes cannot be reserved", op,
                      (unsigned long long)size);
  pthread_mutex_lock(&va.lock);
  if (!va.tried)
    va_arena_init_locked();
  bool got = va.size && va_take_locked(size, align, out);
  pthread_mutex_unlock(&va.lock);
  if (got)
    return GCA_OK;
  size_t span = (size_t)(size + align);
  void *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: cannot reserve %llu bytes of address space: %s",
                      op, (unsigned long long)size, strerror(errno));
  uint64_t start = (uint64_t)(uintptr_t)raw;
  uint64_t base = (start + align - 1) & ~(align - 1);
  if (base > start)
    munmap(raw, (size_t)(base - start));
  uint64_t tail = start + span - (base + size);
  if (tail)
    munmap((void *)(uintptr_t)(base + size), (size_t)tail);
  *out = base;
  return GCA_OK;
}

/* Gives back a range from reserve_range: its pages are dropped and, inside the
 * arena, the range becomes free for later reservations. */
static void unreserve_range(uint64_t base, uint64_t size) {
  pthread_mutex_lock(&va.lock);
  if (!va.size || base < va.base || base - va.base >= va.size) {
    pthread_mutex_unlock(&va.lock);
    munmap((void *)(uintptr_t)base, (size_t)size);
    return;
  }
  mmap((void *)(uintptr_t)base, (size_t)size, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  size_t i = vec_lower(&va.free, base);
  va_range_t *next = i < va.free.len ? vec_at(&va.free, i) : NULL;
  va_range_t *prev = i > 0 ? vec_at(&va.free, i - 1) : NULL;
  bool join_prev = prev && prev->base + prev->size == base;
  bool join_next = next && base + size == next->base;
  if (join_prev && join_next) {
    prev->size += size + next->size;
    vec_remove(&va.free, i, 1);
  } else if (join_prev) {
    prev->size += size;
  } else if (join_next) {
    next->base = base;
    next->size += size;
  } else {
    va_range_t r = {.base = base, .size = size};
    if (!vec_insert(&va.free, i, &r))
      GCA_LOG_WARN("sim: no host memory to track a freed address range; 0x%llx + %llu stays "
                   "reserved",
                   (unsigned long long)base, (unsigned long long)size);
  }
  pthread_mutex_unlock(&va.lock);
}

/* Turns [ptr, ptr+size) back into reservation pages: PROT_NONE, no backing. */
static gca_status_t reset_range(const char *op, uint64_t ptr, uint64_t size) {
  void *p = mmap((void *)(uintptr_t)ptr, (size_t)size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED)
    return gca__error(GCA_ERR_DRIVER, "%s: cannot restore the reservation at 0x%llx: %s", op,
                      (unsigned long long)ptr, strerror(errno));
  return GCA_OK;
}

static resv_t *resv_of(uint64_t addr) {
  long i = vec_containing(&mem.resvs, addr);
  return i < 0 ? NULL : vec_at(&mem.resvs, (size_t)i);
}

/* ---- mappings (mem.lock held) ---- */

/* Note [Sim whole mappings]: the sim answers as the driver does, measured on an
 * H200 with driver 580 where cuda.h is silent or says otherwise. mem_map maps a
 * handle whole and from its start: a nonzero offset (granule-aligned or not),
 * or fewer or more bytes than the handle has, is CUDA_ERROR_NOT_SUPPORTED (cuda.h says the offset
 * "must be zero", which would read as CUDA_ERROR_INVALID_VALUE). So a mapping is one whole
 * allocation and stays so until unmapped. mem_set_access and mem_unmap act on whole mappings: a
 * range may span several adjacent mappings, but one that covers only part of a mapping is
 * CUDA_ERROR_INVALID_VALUE. mem_unmap also takes reserved bytes that are not mapped (unmapping a
 * range that is already unmapped succeeds); mem_set_access needs every byte mapped. */

static mapping_t *map_at(size_t i) {
  return vec_at(&mem.maps, i);
}

/* The mappings [*first, *past) that meet [ptr, end). Returns the first byte of
 * [ptr, end) that none of them covers, or end when they cover it all. */
static uint64_t maps_meeting(uint64_t ptr, uint64_t end, size_t *first, size_t *past) {
  size_t i = vec_lower(&mem.maps, ptr);
  if (i > 0 && map_at(i - 1)->base + map_at(i - 1)->size > ptr)
    i--;
  uint64_t cur = ptr, gap = end;
  size_t j = i;
  for (; j < mem.maps.len && map_at(j)->base < end; j++) {
    if (gap == end && map_at(j)->base > cur)
      gap = cur;
    cur = map_at(j)->base + map_at(j)->size;
  }
  if (gap == end && cur < end)
    gap = cur;
  *first = i;
  *past = j;
  return gap;
}

/* GCA_OK when every byte of [ptr, end) lies in reservations made by
 * mem_address_reserve; else GCA_ERR_INVALID_ARGUMENT naming the first that does not. */
static gca_status_t reserved(const char *op, uint64_t ptr, uint64_t end) {
  for (uint64_t cur = ptr; cur < end;) {
    const resv_t *r = resv_of(cur);
    if (!r)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: 0x%llx in [0x%llx, 0x%llx) is not reserved",
                        op, (unsigned long long)cur, (unsigned long long)ptr,
                        (unsigned long long)end);
    if (r->classic)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "%s: 0x%llx belongs to a mem_alloc allocation (freed by mem_free), not to "
                        "a reservation",
                        op, (unsigned long long)cur);
    cur = r->base + r->size;
  }
  return GCA_OK;
}

/* The mappings [*first, *past) in [ptr, end), each lying in it whole, and with
 * `gapless` covering all of it (Note [Sim whole mappings]); else
 * GCA_ERR_INVALID_ARGUMENT naming the mapping cut or the first byte unmapped. */
static gca_status_t whole_mappings(const char *op, uint64_t ptr, uint64_t end, bool gapless,
                                   size_t *first, size_t *past) {
  uint64_t gap = maps_meeting(ptr, end, first, past);
  for (size_t k = *first; k < *past; k++) {
    const mapping_t *mp = map_at(k);
    if (mp->base < ptr || mp->base + mp->size > end)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "%s: [0x%llx, 0x%llx) covers only part of the mapping [0x%llx, 0x%llx); "
                        "it takes whole mappings (CUDA_ERROR_INVALID_VALUE)",
                        op, (unsigned long long)ptr, (unsigned long long)end,
                        (unsigned long long)mp->base, (unsigned long long)(mp->base + mp->size));
  }
  if (gapless && gap < end)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: 0x%llx in [0x%llx, 0x%llx) is not mapped", op,
                      (unsigned long long)gap, (unsigned long long)ptr, (unsigned long long)end);
  return GCA_OK;
}

/* ---- argument checks ---- */

static gca_status_t check_range(const char *op, uint64_t ptr, uint64_t size) {
  if (size == 0 || ptr % GRAN || size % GRAN || ptr + size < ptr)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: range 0x%llx + %llu is empty or not aligned to the 2 MiB granularity",
                      op, (unsigned long long)ptr, (unsigned long long)size);
  return GCA_OK;
}

gca_status_t gca__sim_check_out(const char *op, const void *out, const char *what) {
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, what);
  return GCA_OK;
}

/* ---- ops ---- */

static gca_status_t sim_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes) {
  GCA_SIM_ENTER(mem_get_info, 0);
  GCA_CHECK(gca__sim_check_device("mem_get_info", dev));
  GCA_CHECK(gca__sim_check_out("mem_get_info", free_bytes, "free_bytes"));
  GCA_CHECK(gca__sim_check_out("mem_get_info", total_bytes, "total_bytes"));
  uint64_t cap = gca__sim_capacity(dev), used = gca_sim_used_bytes(dev);
  *free_bytes = used > cap ? 0 : (size_t)(cap - used);
  *total_bytes = (size_t)cap;
  return GCA_OK;
}

static gca_status_t sim_mem_granularity(int dev, bool recommended, size_t *granularity) {
  GCA_SIM_ENTER(mem_granularity, 0);
  GCA_CHECK(gca__sim_check_device("mem_granularity", dev));
  GCA_CHECK(gca__sim_check_out("mem_granularity", granularity, "granularity"));
  *granularity = (size_t)GRAN;
  return GCA_OK;
}

static gca_status_t sim_mem_create(int dev, size_t size, gca_memhandle_t *out) {
  GCA_SIM_ENTER(mem_create, size);
  GCA_CHECK(gca__sim_check_device("mem_create", dev));
  GCA_CHECK(gca__sim_check_out("mem_create", out, "out"));
  if (size == 0 || size % GRAN)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "mem_create: size %zu is not a positive multiple of the granularity (%llu)",
                      size, (unsigned long long)GRAN);
  phys_t *p;
  GCA_CHECK(phys_create("mem_create", dev, size, &p));
  pthread_mutex_lock(&mem.lock);
  gca_status_t st = gca__sim_memhandle_add("mem_create", p, out);
  if (st != GCA_OK) {
    p->refs = 1;
    gca__sim_phys_unref(p);
  }
  pthread_mutex_unlock(&mem.lock);
  return st;
}

static gca_status_t sim_mem_release(gca_memhandle_t handle) {
  GCA_SIM_ENTER(mem_release, 0);
  pthread_mutex_lock(&mem.lock);
  size_t i;
  phys_t *p = gca__sim_memhandle_find(handle, &i);
  if (!p) {
    pthread_mutex_unlock(&mem.lock);
    return gca__error(GCA_ERR_INVALID_HANDLE,
                      "mem_release: 0x%llx is not a live handle (never created or already "
                      "released)",
                      (unsigned long long)handle);
  }
  vec_remove(&mem.handles, i, 1);
  gca__sim_phys_unref(p);
  pthread_mutex_unlock(&mem.lock);
  return GCA_OK;
}

static gca_status_t sim_mem_address_reserve(int dev, size_t size, size_t alignment,
                                            gca_devptr_t *out) {
  GCA_SIM_ENTER(mem_address_reserve, 0);
  GCA_CHECK(gca__sim_check_device("mem_address_reserve", dev));
  GCA_CHECK(gca__sim_check_out("mem_address_reserve", out, "out"));
  /* As cuMemAddressReserve on an H200 with driver 580: the size a nonzero
   * multiple of the granularity (cuda.h does not say so; a granule and a half,
   * or two 4 KiB pages, is CUDA_ERROR_INVALID_VALUE), the alignment 0 (the
   * default) or any power of two, also one below the granularity. The range
   * always starts on a granule, as the driver's do, since only granule-aligned
   * ranges can be mapped. */
  if (size == 0 || size % GRAN)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "mem_address_reserve: size %zu is not a positive multiple of the "
                      "granularity (%llu) (CUDA_ERROR_INVALID_VALUE)",
                      size, (unsigned long long)GRAN);
  if (alignment & (alignment - 1))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "mem_address_reserve: alignment %zu is not 0 or a power of two "
                      "(CUDA_ERROR_INVALID_VALUE)",
                      alignment);
  uint64_t align = alignment > GRAN ? alignment : GRAN;
  uint64_t base;
  GCA_CHECK(reserve_range("mem_address_reserve", size, align, &base));
  resv_t r = {.base = base, .size = size, .dev = dev};
  pthread_mutex_lock(&mem.lock);
  bool ok = vec_insert(&mem.resvs, vec_lower(&mem.resvs, base), &r);
  pthread_mutex_unlock(&mem.lock);
  if (!ok) {
    unreserve_range(base, size);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "mem_address_reserve: no host memory for the reservation table");
  }
  *out = base;
  return GCA_OK;
}

static gca_status_t sim_mem_address_free(int dev, gca_devptr_t ptr, size_t size) {
  GCA_SIM_ENTER(mem_address_free, 0);
  GCA_CHECK(gca__sim_check_device("mem_address_free", dev));
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&mem.lock);
  size_t i = vec_lower(&mem.resvs, ptr);
  resv_t *r = i < mem.resvs.len ? vec_at(&mem.resvs, i) : NULL;
  if (!r || r->base != ptr || r->classic || r->size != size) {
    st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                    "mem_address_free: 0x%llx + %zu does not match a reservation (base and size "
                    "must be as reserved)",
                    (unsigned long long)ptr, size);
  } else if (r->mapped) {
    st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                    "mem_address_free: reservation 0x%llx still has %llu bytes mapped; unmap "
                    "them first",
                    (unsigned long long)ptr, (unsigned long long)r->mapped);
  } else {
    unreserve_range(ptr, size);
    vec_remove(&mem.resvs, i, 1);
  }
  pthread_mutex_unlock(&mem.lock);
  return st;
}

/* Note [Sim whole mappings] for what is NOT_SUPPORTED rather than invalid. */
static gca_status_t sim_mem_map(gca_devptr_t ptr, size_t size, size_t offset,
                                gca_memhandle_t handle) {
  GCA_SIM_ENTER(mem_map, 0);
  GCA_CHECK(check_range("mem_map", ptr, size));
  if (offset != 0)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_map: offset %zu into handle 0x%llx; a handle is mapped from its start "
                      "only (CUDA_ERROR_NOT_SUPPORTED)",
                      offset, (unsigned long long)handle);
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&mem.lock);
  phys_t *p = gca__sim_memhandle_find(handle, NULL);
  if (!p) {
    st = gca__error(GCA_ERR_INVALID_HANDLE, "mem_map: 0x%llx is not a live handle",
                    (unsigned long long)handle);
    goto out;
  }
  if (size != p->size) {
    st = gca__error(GCA_ERR_NOT_SUPPORTED,
                    "mem_map: %zu bytes of a handle of %llu; a handle is mapped whole "
                    "(CUDA_ERROR_NOT_SUPPORTED)",
                    size, (unsigned long long)p->size);
    goto out;
  }
  resv_t *r = resv_of(ptr);
  if (!r || r->classic || ptr + size > r->base + r->size) {
    st = gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_map: 0x%llx + %zu is not inside one reservation",
                    (unsigned long long)ptr, size);
    goto out;
  }
  size_t j = vec_lower(&mem.maps, ptr);
  mapping_t *prev = j > 0 ? map_at(j - 1) : NULL;
  mapping_t *next = j < mem.maps.len ? map_at(j) : NULL;
  if ((prev && prev->base + prev->size > ptr) || (next && next->base < ptr + size)) {
    mapping_t *o = (prev && prev->base + prev->size > ptr) ? prev : next;
    st =
        gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_map: 0x%llx + %zu overlaps the mapping at 0x%llx",
                   (unsigned long long)ptr, size, (unsigned long long)o->base);
    goto out;
  }
  mapping_t nm = {.base = ptr, .size = size, .phys = p};
  if (!vec_insert(&mem.maps, j, &nm)) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "mem_map: no host memory for the mapping table");
    goto out;
  }
  void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, 0);
  if (m == MAP_FAILED) {
    st = gca__error(GCA_ERR_DRIVER, "mem_map: mmap at 0x%llx failed: %s", (unsigned long long)ptr,
                    strerror(errno));
    vec_remove(&mem.maps, j, 1);
    reset_range("mem_map", ptr, size);
    goto out;
  }
  p->refs++;
  r->mapped += size;
out:
  pthread_mutex_unlock(&mem.lock);
  return st;
}

/* Unmaps the whole mappings in a reserved range; bytes not mapped are passed
 * over (Note [Sim whole mappings]). */
static gca_status_t sim_mem_unmap(gca_devptr_t ptr, size_t size) {
  GCA_SIM_ENTER(mem_unmap, 0);
  GCA_CHECK(check_range("mem_unmap", ptr, size));
  gca_status_t st = GCA_OK;
  uint64_t end = ptr + size;
  size_t i = 0, j = 0;
  pthread_mutex_lock(&mem.lock);
  GCA_CHECK_GOTO(reserved("mem_unmap", ptr, end), st, out);
  GCA_CHECK_GOTO(whole_mappings("mem_unmap", ptr, end, false, &i, &j), st, out);
  if (i == j)
    goto out;
  GCA_CHECK_GOTO(reset_range("mem_unmap", ptr, size), st, out);
  for (size_t k = i; k < j; k++) {
    mapping_t *mp = map_at(k);
    resv_t *r = resv_of(mp->base);
    GCA_ASSERT(r != NULL && r->mapped >= mp->size);
    r->mapped -= mp->size;
    gca__sim_phys_unref(mp->phys);
  }
  vec_remove(&mem.maps, i, j - i);
out:
  pthread_mutex_unlock(&mem.lock);
  return st;
}

/* Grants devs access to the whole mappings that cover [ptr, ptr+size) (Note
 * [Sim whole mappings]). */
static gca_status_t sim_mem_set_access(gca_devptr_t ptr, size_t size, const int *devs, int ndevs) {
  GCA_SIM_ENTER(mem_set_access, 0);
  GCA_CHECK(check_range("mem_set_access", ptr, size));
  if (!devs || ndevs <= 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_set_access: no devices given (%d)", ndevs);
  for (int k = 0; k < ndevs; k++)
    GCA_CHECK(gca__sim_check_device("mem_set_access", devs[k]));
  gca_status_t st = GCA_OK;
  uint64_t end = ptr + size;
  size_t i = 0, j = 0;
  pthread_mutex_lock(&mem.lock);
  GCA_CHECK_GOTO(reserved("mem_set_access", ptr, end), st, out);
  GCA_CHECK_GOTO(whole_mappings("mem_set_access", ptr, end, true, &i, &j), st, out);
  if (mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) != 0) {
    st = gca__error(GCA_ERR_DRIVER, "mem_set_access: mprotect of 0x%llx + %zu failed: %s",
                    (unsigned long long)ptr, size, strerror(errno));
    goto out;
  }
  uint64_t grant = 0;
  for (int k = 0; k < ndevs; k++)
    grant |= (uint64_t)1 << devs[k];
  for (size_t k = i; k < j; k++)
    map_at(k)->access |= grant;
out:
  pthread_mutex_unlock(&mem.lock);
  return st;
}

/* ---- classic allocations ---- */

/* Note [Sim classic allocations]: as the driver does for cuMemAlloc, requests
 * up to SUB_MAX bytes share 2 MiB chunks, each carved in SUB_UNIT-byte units
 * (so pointers are 256-byte aligned and a 512-byte allocation does not take
 * 2 MiB of capacity); larger requests get their own granule-rounded range. A
 * chunk is one classic reservation mapped read-write whole, so touching past
 * an allocation's end inside its chunk does not fault, as on a GPU, and the
 * chunk goes back (capacity and address space) when its last allocation is
 * freed. Every live allocation has an entry in mem.classics, so only a pointer
 * mem_alloc returned can be freed. */
#define SUB_UNIT  256u
#define SUB_MAX   ((uint64_t)1 << 20)
#define SUB_UNITS (GCA_SIM_GRANULARITY / SUB_UNIT)

typedef struct chunk {
  struct chunk *next; /* the device's chunks */
  uint64_t base;
  uint32_t live;                 /* allocations in it */
  uint64_t used[SUB_UNITS / 64]; /* bit per unit */
} chunk_t;

/* A live mem_alloc allocation [base, base+size); chunk NULL when it has its own range. */
typedef struct classic {
  uint64_t base;
  uint64_t size;
  chunk_t *chunk;
  int dev;
} classic_t;

static struct {
  vec_t all;                            /* classic_t by base (under mem.lock) */
  chunk_t *chunks[GCA_SIM_MAX_DEVICES]; /* under mem.lock */
  void (*free_wait_hook)(void *);
  void *free_wait_arg;
} cls = {.all = {.esz = sizeof(classic_t)}};

void gca__sim_mem_free_wait_hook(void (*fn)(void *arg), void *arg) {
  cls.free_wait_hook = fn;
  cls.free_wait_arg = arg;
}

static bool unit_used(const chunk_t *c, uint32_t u) {
  return (c->used[u / 64] >> (u % 64)) & 1u;
}

static void units_set(chunk_t *c, uint32_t first, uint32_t n, bool on) {
  for (uint32_t u = first; u < first + n; u++) {
    if (on)
      c->used[u / 64] |= (uint64_t)1 << (u % 64);
    else
      c->used[u / 64] &= ~((uint64_t)1 << (u % 64));
  }
}

/* First run of n free units in c, or UINT32_MAX. */
static uint32_t units_find(const chunk_t *c, uint32_t n) {
  uint32_t run = 0;
  for (uint32_t u = 0; u < SUB_UNITS; u++) {
    run = unit_used(c, u) ? 0 : run + 1;
    if (run == n)
      return u + 1 - n;
  }
  return UINT32_MAX;
}

/* A classic range of `size` bytes on dev (capacity taken, memfd, reservation
 * mapped read-write, recorded as a classic reservation and one mapping). */
static gca_status_t classic_range_make(int dev, uint64_t size, uint64_t *out) {
  gca_status_t st;
  phys_t *p;
  uint64_t base;
  GCA_CHECK(phys_create("mem_alloc", dev, size, &p));
  GCA_CHECK_GOTO(reserve_range("mem_alloc", size, GRAN, &base), st, fail_phys);
  void *m =
      mmap((void *)(uintptr_t)base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, 0);
  if (m == MAP_FAILED) {
    st = gca__error(GCA_ERR_DRIVER, "mem_alloc: mmap at 0x%llx failed: %s",
                    (unsigned long long)base, strerror(errno));
    goto fail_resv;
  }
  resv_t r = {.base = base, .size = size, .mapped = size, .dev = dev, .classic = true};
  pthread_mutex_lock(&mem.lock);
  mapping_t mp = {
      .base = base, .size = size, .phys = p, .access = (uint64_t)1 << dev, .classic = true};
  size_t ri = vec_lower(&mem.resvs, base);
  if (!vec_insert(&mem.resvs, ri, &r)) {
    pthread_mutex_unlock(&mem.lock);
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "mem_alloc: no host memory for the reservation table");
    goto fail_resv;
  }
  if (!vec_insert(&mem.maps, vec_lower(&mem.maps, base), &mp)) {
    vec_remove(&mem.resvs, ri, 1);
    pthread_mutex_unlock(&mem.lock);
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "mem_alloc: no host memory for the mapping table");
    goto fail_resv;
  }
  p->refs = 1;
  pthread_mutex_unlock(&mem.lock);
  *out = base;
  return GCA_OK;

fail_resv:
  unreserve_range(base, size);
fail_phys:
  pthread_mutex_lock(&mem.lock);
  p->refs = 1;
  gca__sim_phys_unref(p);
  pthread_mutex_unlock(&mem.lock);
  return st;
}

/* Gives back a range from classic_range_make (mem.lock held). */
static void classic_range_drop(uint64_t base) {
  size_t ri = vec_lower(&mem.resvs, base);
  size_t pi = vec_lower(&mem.maps, base);
  GCA_ASSERT(ri < mem.resvs.len && pi < mem.maps.len && map_at(pi)->base == base);
  resv_t *r = vec_at(&mem.resvs, ri);
  GCA_ASSERT(r->base == base && r->classic);
  phys_t *p = map_at(pi)->phys;
  unreserve_range(base, r->size);
  vec_remove(&mem.maps, pi, 1);
  vec_remove(&mem.resvs, ri, 1);
  gca__sim_phys_unref(p);
}

/* Records a live allocation (mem.lock held). */
static gca_status_t classic_add(const classic_t *c) {
  if (!vec_insert(&cls.all, vec_lower(&cls.all, c->base), c))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "mem_alloc: no host memory for the allocation table");
  return GCA_OK;
}

/* Carves n units from a chunk of dev with room (mem.lock held); false when none has. */
static gca_status_t sub_take(int dev, uint64_t size, chunk_t *only, bool *got, uint64_t *out) {
  uint32_t n = (uint32_t)((size + SUB_UNIT - 1) / SUB_UNIT);
  *got = false;
  for (chunk_t *c = only ? only : cls.chunks[dev]; c; c = only ? NULL : c->next) {
    uint32_t u = units_find(c, n);
    if (u == UINT32_MAX)
      continue;
    classic_t e = {.base = c->base + (uint64_t)u * SUB_UNIT, .size = size, .chunk = c, .dev = dev};
    GCA_CHECK(classic_add(&e));
    units_set(c, u, n, true);
    c->live++;
    *got = true;
    *out = e.base;
    return GCA_OK;
  }
  return GCA_OK;
}

static gca_status_t sim_mem_alloc(int dev, size_t size, gca_devptr_t *out) {
  bool small = size <= SUB_MAX;
  uint64_t unit = small ? SUB_UNIT : GRAN;
  uint64_t rounded = ((uint64_t)size + unit - 1) / unit * unit;
  GCA_SIM_ENTER(mem_alloc, rounded);
  GCA_CHECK(gca__sim_capture_check_unsafe("mem_alloc"));
  GCA_CHECK(gca__sim_check_device("mem_alloc", dev));
  GCA_CHECK(gca__sim_check_out("mem_alloc", out, "out"));
  if (size == 0 || rounded < size)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "mem_alloc: size %zu is not allocatable", size);
  gca_status_t st = GCA_OK;
  bool got = false;
  uint64_t base;
  if (small) {
    pthread_mutex_lock(&mem.lock);
    st = sub_take(dev, size, NULL, &got, out);
    pthread_mutex_unlock(&mem.lock);
    if (st != GCA_OK || got)
      return st;
    chunk_t *c = calloc(1, sizeof(*c));
    if (!c)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "mem_alloc: no host memory for a chunk record");
    st = classic_range_make(dev, GRAN, &base);
    if (st != GCA_OK) {
      free(c);
      return st;
    }
    c->base = base;
    pthread_mutex_lock(&mem.lock);
    st = sub_take(dev, size, c, &got, out);
    GCA_ASSERT(st != GCA_OK || got);
    if (st == GCA_OK) {
      c->next = cls.chunks[dev];
      cls.chunks[dev] = c;
    } else {
      classic_range_drop(base);
      free(c);
    }
    pthread_mutex_unlock(&mem.lock);
    return st;
  }
  GCA_CHECK(classic_range_make(dev, rounded, &base));
  classic_t e = {.base = base, .size = rounded, .dev = dev};
  pthread_mutex_lock(&mem.lock);
  st = classic_add(&e);
  if (st != GCA_OK)
    classic_range_drop(base);
  pthread_mutex_unlock(&mem.lock);
  if (st == GCA_OK)
    *out = base;
  return st;
}

/* The live allocation based at ptr on dev (mem.lock held); the error names why not. */
static gca_status_t classic_find(int dev, uint64_t ptr, size_t *index) {
  size_t i = vec_lower(&cls.all, ptr);
  classic_t *e = i < cls.all.len ? vec_at(&cls.all, i) : NULL;
  if (!e || e->base != ptr)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "mem_free: 0x%llx is not a pointer returned by mem_alloc (or it was freed "
                      "already)",
                      (unsigned long long)ptr);
  if (e->dev != dev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "mem_free: 0x%llx was allocated on device %d, not device %d",
                      (unsigned long long)ptr, e->dev, dev);
  *index = i;
  return GCA_OK;
}

/* Note [Sim mem_free synchronizes]: cuMemFree implicitly synchronizes before
 * it frees (the driver's "API synchronization behavior"), so work queued on
 * the device before the call never writes memory that was handed out again.
 * mem_free waits for every stream of the allocation's device to run what was
 * queued on it, then releases. */
static gca_status_t sim_mem_free(int dev, gca_devptr_t ptr) {
  GCA_SIM_ENTER(mem_free, 0);
  gca__assert_no_lock("mem_free");
  GCA_CHECK(gca__sim_capture_check_unsafe("mem_free"));
  GCA_CHECK(gca__sim_check_device("mem_free", dev));
  if (ptr == 0)
    return GCA_OK;
  size_t i;
  pthread_mutex_lock(&mem.lock);
  gca_status_t st = classic_find(dev, ptr, &i);
  pthread_mutex_unlock(&mem.lock);
  GCA_CHECK(st);
  if (cls.free_wait_hook)
    cls.free_wait_hook(cls.free_wait_arg);
  gca__sim_device_drain(dev);
  pthread_mutex_lock(&mem.lock);
  GCA_CHECK_GOTO(classic_find(dev, ptr, &i), st, out);
  classic_t e = *(classic_t *)vec_at(&cls.all, i);
  vec_remove(&cls.all, i, 1);
  if (!e.chunk) {
    classic_range_drop(e.base);
    goto out;
  }
  chunk_t *c = e.chunk;
  units_set(c, (uint32_t)((e.base - c->base) / SUB_UNIT),
            (uint32_t)((e.size + SUB_UNIT - 1) / SUB_UNIT), false);
  if (--c->live > 0)
    goto out;
  chunk_t **pp = &cls.chunks[dev];
  while (*pp != c)
    pp = &(*pp)->next;
  *pp = c->next;
  classic_range_drop(c->base);
  free(c);
out:
  pthread_mutex_unlock(&mem.lock);
  return st;
}

int gca__sim_mem_device_of(gca_devptr_t ptr, size_t len) {
  int dev = -1;
  uint64_t end = ptr + (len ? len : 1);
  if (end < ptr)
    return -1;
  pthread_mutex_lock(&mem.lock);
  size_t i, j;
  if (maps_meeting(ptr, end, &i, &j) == end) {
    dev = map_at(i)->phys->dev;
    for (size_t k = i; k < j; k++)
      if (!map_at(k)->access)
        dev = -1;
  }
  pthread_mutex_unlock(&mem.lock);
  return dev;
}

bool gca__sim_mem_in_device_space(gca_devptr_t ptr, size_t len) {
  uint64_t end = ptr + (len ? len : 1);
  if (end < ptr)
    end = UINT64_MAX;
  pthread_mutex_lock(&mem.lock);
  bool in = resv_of(ptr) != NULL;
  if (!in) {
    size_t i = vec_lower(&mem.resvs, ptr);
    in = i < mem.resvs.len && vec_key(&mem.resvs, i) < end;
  }
  pthread_mutex_unlock(&mem.lock);
  return in;
}

/* ---- access rights (Note [Sim access rights]) ---- */

_Static_assert(GCA_SIM_MAX_DEVICES <= 64, "access rights are a 64-bit mask of devices");

/* Whether `dev` may touch mapping mp (mem.lock held); a copy needs no peer access
 * for classic memory. */
static bool map_allows(const mapping_t *mp, int dev, bool copy) {
  if (!mp->classic)
    return (mp->access >> dev) & 1u;
  int owner = mp->phys->dev;
  return copy || owner == dev || ((mem.peers[dev] >> owner) & 1u);
}

/* Writes "{0, 2}" (the devices in mask) into buf. */
static const char *devs_str(uint64_t mask, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "{");
  for (int d = 0; d < 64 && n < len; d++)
    if ((mask >> d) & 1u)
      n += (size_t)snprintf(buf + n, len - n, "%s%d", n > 1 ? ", " : "", d);
  if (n < len)
    snprintf(buf + n, len - n, "}");
  return buf;
}

gca_status_t gca__sim_mem_check_access(const char *op, int dev, gca_devptr_t ptr, size_t len,
                                       bool copy) {
  if (len == 0)
    return GCA_OK;
  uint64_t end = ptr + len < ptr ? UINT64_MAX : ptr + len;
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&mem.lock);
  size_t i, j;
  maps_meeting(ptr, end, &i, &j);
  for (size_t k = i; k < j; k++) {
    const mapping_t *mp = map_at(k);
    if (map_allows(mp, dev, copy))
      continue;
    uint64_t at = mp->base > ptr ? mp->base : ptr;
    char granted[96];
    if (mp->classic)
      st = gca__error(GCA_ERR_ILLEGAL_ADDRESS,
                      "%s: device %d cannot access 0x%llx in [0x%llx, 0x%llx): it is device %d's "
                      "mem_alloc memory and device %d has not enabled peer access to device %d "
                      "(ctx_enable_peer_access) (CUDA_ERROR_ILLEGAL_ADDRESS)",
                      op, dev, (unsigned long long)at, (unsigned long long)ptr,
                      (unsigned long long)end, mp->phys->dev, dev, mp->phys->dev);
    else
      st = gca__error(GCA_ERR_ILLEGAL_ADDRESS,
                      "%s: device %d cannot access 0x%llx in [0x%llx, 0x%llx): the mapping of "
                      "device %d's memory at 0x%llx grants access to devices %s "
                      "(mem_set_access) (CUDA_ERROR_ILLEGAL_ADDRESS)",
                      op, dev, (unsigned long long)at, (unsigned long long)ptr,
                      (unsigned long long)end, mp->phys->dev, (unsigned long long)mp->base,
                      devs_str(mp->access, granted, sizeof(granted)));
    break;
  }
  pthread_mutex_unlock(&mem.lock);
  return st;
}

/* The sim's devices can all reach each other (device_can_access_peer answers
 * yes for any two), so only "self" and "already enabled" are refused. */
static gca_status_t sim_ctx_enable_peer_access(int dev, int peer) {
  GCA_SIM_ENTER(ctx_enable_peer_access, 0);
  GCA_CHECK(gca__sim_check_device("ctx_enable_peer_access", dev));
  GCA_CHECK(gca__sim_check_device("ctx_enable_peer_access", peer));
  if (dev == peer)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "ctx_enable_peer_access: device %d cannot be its own peer "
                      "(CUDA_ERROR_INVALID_CONTEXT)",
                      dev);
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&mem.lock);
  if ((mem.peers[dev] >> peer) & 1u)
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "ctx_enable_peer_access: device %d already has peer access to device %d "
                    "(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)",
                    dev, peer);
  else
    mem.peers[dev] |= (uint64_t)1 << peer;
  pthread_mutex_unlock(&mem.lock);
  return st;
}

void gca__sim_mem_ops(gca_device_ops_t *ops) {
  ops->ctx_enable_peer_access = sim_ctx_enable_peer_access;
  ops->mem_get_info = sim_mem_get_info;
  ops->mem_alloc = sim_mem_alloc;
  ops->mem_free = sim_mem_free;
  ops->mem_granularity = sim_mem_granularity;
  ops->mem_address_reserve = sim_mem_address_reserve;
  ops->mem_address_free = sim_mem_address_free;
  ops->mem_create = sim_mem_create;
  ops->mem_release = sim_mem_release;
  ops->mem_map = sim_mem_map;
  ops->mem_unmap = sim_mem_unmap;
  ops->mem_set_access = sim_mem_set_access;
  gca__sim_share_ops(ops);
}
