/* SPDX-License-Identifier: Apache-2.0 */
/* ipc.c - sharing blocks between processes: export as file descriptors or
 * fabric handles, the socket protocol that carries them, import and the
 * registry of imports.
 *
 * The one idea: a block is described by the physical handles behind it, each
 * with where its mapping sits relative to the block's first byte, so the
 * importer can rebuild the same layout in an address range of its own with
 * the same driver calls the exporter used (mem_import_fd or mem_import_fabric
 * instead of mem_create). Which kind of handle a block travels as changes
 * only how each handle is exported, carried and imported, never the layout.
 * Everything that arrives from a socket is distrusted: the receiver checks
 * the framing, the counts, every size and the layout before anything reaches
 * the driver, and closes what it received when it refuses.
 *
 * Imports are kept in a registry keyed by the pointer gca_ipc_open returned,
 * so that gca_ipc_close can tell a live import from a foreign or stale
 * pointer. The registry has its own mutex; no allocator lock is taken while
 * it is held.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "alloc_core.h"
#include "gca/ipc.h"
#include "introspect.h"

#define PREAMBLE_LEN 16u
#define BODY_HEAD    32u
#define ENTRY_LEN    32u
#define FABRIC_LEN   GCA_FABRIC_HANDLE_LEN
#define FENTRY_LEN   (ENTRY_LEN + FABRIC_LEN) /* an entry of a fabric message */
#define MAX_BYTES    ((uint64_t)1 << 50) /* larger than any device; beyond it a size is absurd */

_Static_assert(FABRIC_LEN == 64, "ipc.h documents 64-byte fabric handles");

/* One physical handle of an exported block: bytes [handle_offset,
 * handle_offset + map_size) of a handle_size-byte allocation appear at block
 * start + rel (as cuMemMap maps a handle whole, check_layout takes offset 0
 * and map_size == handle_size only). fd is owned by the handle (-1 once closed, and always -1 in a
 * fabric handle, which names the allocation by `fabric` instead). */
typedef struct ipc_entry {
  int fd;
  uint64_t handle_size, handle_offset, map_size;
  int64_t rel;
  uint8_t fabric[FABRIC_LEN];
} ipc_entry_t;

/* Invariant (check_layout): 1 <= n <= GCA_IPC_MAX_HANDLES; e[] contiguous in
 * rel order, e[0].rel <= 0 < e[0].rel + e[0].map_size, and the last entry
 * ends at or after block_size. fabric: every e[i].fd == -1. */
struct gca_ipc_handle {
  uint8_t id[16];
  bool fabric;
  int device;
  uint64_t block_size;
  uint32_t n;
  ipc_entry_t *e;
};

/* A live import: the range [base, base + span) holds n mappings, one per
 * handle, contiguous; user == base - e[0].rel is what gca_ipc_open returned. */
typedef struct ipc_import {
  gca_devptr_t user, base;
  size_t span;
  int device;
  uint32_t n;
  gca_memhandle_t *handles;
  bool unmapped; /* a close unmapped it but could not release everything: handles[0..n)
                    and (span != 0) the range are what is left (Note [Half-closed imports]) */
} ipc_import_t;

static struct {
  pthread_mutex_t lock;
  ipc_import_t *v;
  size_t len, cap;
} reg = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- handles ---- */

static gca_ipc_handle_t *handle_new(uint32_t n, bool fabric) {
  gca_ipc_handle_t *h = calloc(1, sizeof(*h));
  if (h == NULL)
    return NULL;
  h->fabric = fabric;
  h->e = calloc(n, sizeof(*h->e));
  if (h->e == NULL) {
    free(h);
    return NULL;
  }
  h->n = n;
  for (uint32_t i = 0; i < n; i++)
    h->e[i].fd = -1;
  return h;
}

GCA_API void gca_ipc_handle_free(gca_ipc_handle_t *h) {
  if (h == NULL)
    return;
  for (uint32_t i = 0; i < h->n; i++)
    if (h->e[i].fd >= 0)
      close(h->e[i].fd);
  free(h->e);
  free(h);
}

GCA_API gca_status_t gca_ipc_handle_info(const gca_ipc_handle_t *h, int *device, size_t *block_size,
                                         size_t *nhandles, uint8_t id[16]) {
  if (h == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_handle_info: handle is NULL");
  if (device)
    *device = h->device;
  if (block_size)
    *block_size = (size_t)h->block_size;
  if (nhandles)
    *nhandles = h->n;
  if (id)
    memcpy(id, h->id, sizeof(h->id));
  return GCA_OK;
}

GCA_API gca_status_t gca_ipc_handle_flags(const gca_ipc_handle_t *h, unsigned *flags) {
  if (h == NULL || flags == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_handle_flags: %s is NULL",
                      h == NULL ? "handle" : "flags");
  *flags = h->fabric ? GCA_IPC_FABRIC : 0u;
  return GCA_OK;
}

/* GCA_ERR_PARSE naming `op` unless h's sizes are sane and its entries tile a
 * range that covers the block (the struct's invariant). */
static gca_status_t check_layout(const char *op, const gca_ipc_handle_t *h) {
  if (h->n == 0 || h->n > GCA_IPC_MAX_HANDLES)
    return gca__error(GCA_ERR_PARSE, "%s: %" PRIu32 " handles, expected 1 to %u", op, h->n,
                      GCA_IPC_MAX_HANDLES);
  if (h->device < 0 || h->device >= GCA__MAX_DEVICES)
    return gca__error(GCA_ERR_PARSE, "%s: device %d is out of range", op, h->device);
  if (h->block_size == 0 || h->block_size > MAX_BYTES)
    return gca__error(GCA_ERR_PARSE,
                      "%s: block size %" PRIu64 " is absurd (expected 1 to %" PRIu64 ")", op,
                      h->block_size, MAX_BYTES);
  int64_t next = h->e[0].rel;
  for (uint32_t i = 0; i < h->n; i++) {
    const ipc_entry_t *e = &h->e[i];
    if (e->handle_offset != 0) /* cuMemMap maps a handle from its start only */
      return gca__error(GCA_ERR_PARSE,
                        "%s: handle %" PRIu32 " is mapped from offset %" PRIu64
                        " of its memory; only offset 0 can be mapped",
                        op, i, e->handle_offset);
    if (e->handle_size == 0 || e->handle_size > MAX_BYTES || e->map_size == 0 ||
        e->handle_offset > e->handle_size || e->map_size > e->handle_size - e->handle_offset)
      return gca__error(GCA_ERR_PARSE,
                        "%s: handle %" PRIu32 ": %" PRIu64 " bytes at offset %" PRIu64
                        " do not fit a %" PRIu64 "-byte handle",
                        op, i, e->map_size, e->handle_offset, e->handle_size);
    if (e->map_size != e->handle_size) /* nor part of one (Note [Sim whole mappings]) */
      return gca__error(GCA_ERR_PARSE,
                        "%s: handle %" PRIu32 " maps %" PRIu64 " of its %" PRIu64
                        " bytes; only a whole handle can be mapped",
                        op, i, e->map_size, e->handle_size);
    if (e->rel < -(int64_t)MAX_BYTES || e->rel > (int64_t)MAX_BYTES || e->rel != next)
      return gca__error(GCA_ERR_PARSE,
                        "%s: handle %" PRIu32 " sits at %" PRId64
                        " from the block, expected %" PRId64 " (mappings must be contiguous)",
                        op, i, e->rel, next);
    next = e->rel + (int64_t)e->map_size;
  }
  if (h->e[0].rel > 0 || h->e[0].rel + (int64_t)h->e[0].map_size <= 0 ||
      next < (int64_t)h->block_size)
    return gca__error(GCA_ERR_PARSE,
                      "%s: the mappings [%" PRId64 ", %" PRId64 ") do not cover the %" PRIu64
                      "-byte block",
                      op, h->e[0].rel, next, h->block_size);
  return GCA_OK;
}

/* ---- export ---- */

/* Fills h's entries with the mappings of b's segment that meet b, exporting
 * each handle as an fd, or as a fabric handle when `fabric`. The caller holds
 * d->lock; on failure h's fds are closed by gca_ipc_handle_free. */
static gca_status_t export_entries(gca__devalloc_t *d, const gca__block_t *b, bool fabric,
                                   gca_ipc_handle_t **out) {
  const gca__segment_t *seg = b->seg;
  gca_devptr_t lo = b->addr, hi = b->addr + b->size;
  uint32_t n = 0;
  for (size_t i = 0; i < seg->nmaps; i++) {
    gca_devptr_t ms = seg->base + seg->maps[i].offset, me = ms + seg->maps[i].size;
    n += ms < hi && me > lo;
  }
  GCA_ASSERT(n > 0);
  if (n > GCA_IPC_MAX_HANDLES)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "ipc_export: block 0x%" PRIx64 " spans %" PRIu32 " handles, at most %u",
                      b->addr, n, GCA_IPC_MAX_HANDLES);
  gca_ipc_handle_t *h = handle_new(n, fabric);
  if (h == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "ipc_export: no host memory for the handle");
  h->device = d->device;
  h->block_size = b->size;
  uint32_t k = 0;
  for (size_t i = 0; i < seg->nmaps; i++) {
    const gca__mapping_t *m = &seg->maps[i];
    gca_devptr_t ms = seg->base + m->offset;
    if (!(ms < hi && ms + m->size > lo))
      continue;
    gca_status_t st = fabric ? d->ops->mem_export_fabric(m->handle, h->e[k].fabric)
                             : d->ops->mem_export_fd(m->handle, &h->e[k].fd);
    if (st != GCA_OK) {
      h->e[k].fd = -1;
      gca_ipc_handle_free(h);
      return gca__error_prefix(st, "ipc_export: block 0x%" PRIx64, b->addr);
    }
    h->e[k].handle_size = m->size;
    h->e[k].handle_offset = 0;
    h->e[k].map_size = m->size;
    h->e[k].rel = (int64_t)(ms - lo);
    k++;
  }
  *out = h;
  return GCA_OK;
}

/* GCA_ERR_NOT_SUPPORTED naming `op` unless `dev` reports support for the
 * handle kind (fd, or fabric when `fabric`). */
static gca_status_t check_kind(const char *op, const gca_device_ops_t *ops, int dev, bool fabric) {
  int ok = 0;
  gca_status_t st =
      ops->device_attr(dev, fabric ? GCA_ATTR_FABRIC_SUPPORTED : GCA_ATTR_POSIX_FD_SUPPORTED, &ok);
  if (st != GCA_OK)
    return gca__error_prefix(st, "%s: device %d", op, dev);
  if (ok)
    return GCA_OK;
  if (fabric)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "%s: device %d does not support fabric handles (the driver reports "
                      "HANDLE_TYPE_FABRIC_SUPPORTED = 0); share through file descriptors "
                      "instead (no GCA_IPC_FABRIC)",
                      op, dev);
  return gca__error(GCA_ERR_NOT_SUPPORTED,
                    "%s: device %d does not support POSIX file descriptor handles", op, dev);
}

GCA_API gca_status_t gca_ipc_export(void *ptr, gca_ipc_handle_t **out) {
  return gca_ipc_export_ex(ptr, 0, out);
}

GCA_API gca_status_t gca_ipc_export_ex(void *ptr, unsigned flags, gca_ipc_handle_t **out) {
  gca_devptr_t addr = (gca_devptr_t)(uintptr_t)ptr;
  gca__devalloc_t *d;
  gca_ipc_handle_t *h = NULL;
  gca_status_t st;
  bool fabric = (flags & GCA_IPC_FABRIC) != 0;
  if (ptr == NULL || out == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_export: %s is NULL", ptr ? "out" : "ptr");
  if (flags & ~GCA_IPC_FABRIC)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "ipc_export: unknown flags 0x%x (known: GCA_IPC_FABRIC = 0x%x)",
                      flags & ~GCA_IPC_FABRIC, GCA_IPC_FABRIC);
  gca__block_t *b = gca__lock_live(addr, &d);
  if (b == NULL)
    return gca__error(GCA_ERR_INVALID_POINTER,
                      "ipc_export: pointer 0x%" PRIx64 " is not the start of a live gca "
                      "allocation",
                      addr);
  if (!b->seg->expandable && b->seg->maps == NULL) {
    st = gca__error(GCA_ERR_NOT_SUPPORTED,
                    "ipc_export: pointer 0x%" PRIx64 " lies in a segment from mem_alloc "
                    "(cuMemAlloc), which the driver cannot export as a %s; set "
                    "ipc_handles:True or expandable_segments:True in GCA_ALLOC_CONF before the "
                    "memory is allocated",
                    addr, fabric ? "fabric handle" : "file descriptor");
    goto out;
  }
  GCA_CHECK_GOTO(check_kind("ipc_export", d->ops, d->device, fabric), st, out);
  GCA_CHECK_GOTO(export_entries(d, b, fabric, &h), st, out);
  GCA_ASSERT(h != NULL); /* set by export_entries on success */
  if (getrandom(h->id, sizeof(h->id), 0) != (ssize_t)sizeof(h->id)) {
    st = gca__error(GCA_ERR_IO, "ipc_export: getrandom failed: %s", strerror(errno));
    gca_ipc_handle_free(h);
    goto out;
  }
  *out = h;
out:
  gca__dev_let_go(d);
  return st;
}

/* ---- the socket protocol ---- */

static void put_u32(uint8_t *p, uint32_t v) {
  memcpy(p, &v, sizeof(v));
}
static void put_u64(uint8_t *p, uint64_t v) {
  memcpy(p, &v, sizeof(v));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

/* Sends buf[0..len) whole; fds[0..nfds) ride with the first byte. */
static gca_status_t send_all(int sock, const uint8_t *buf, size_t len, const int *fds,
                             uint32_t nfds) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * GCA_IPC_FDS_PER_MSG)];
    struct cmsghdr align;
  } ctl;
  size_t done = 0;
  while (done < len) {
    struct iovec iov = {.iov_base = (void *)(buf + done), .iov_len = len - done};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
      memset(&ctl, 0, sizeof(ctl));
      msg.msg_control = ctl.buf;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t r = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return gca__error(GCA_ERR_IO, "ipc_send: sendmsg on socket %d failed: %s", sock,
                        r < 0 ? strerror(errno) : "nothing sent");
    done += (size_t)r;
    nfds = 0;
  }
  return GCA_OK;
}

GCA_API gca_status_t gca_ipc_send(int socket_fd, const gca_ipc_handle_t *h) {
  if (h == NULL || socket_fd < 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_send: %s",
                      h == NULL ? "handle is NULL" : "socket fd is negative");
  for (uint32_t i = 0; i < h->n && !h->fabric; i++)
    if (h->e[i].fd < 0)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_send: handle %" PRIu32 " has no fd", i);
  size_t entry_len = h->fabric ? FENTRY_LEN : ENTRY_LEN;
  size_t body_len = BODY_HEAD + entry_len * h->n;
  uint8_t pre[PREAMBLE_LEN] = {0};
  put_u32(pre, GCA_IPC_MAGIC);
  uint16_t version = GCA_IPC_VERSION, kind = h->fabric ? GCA_IPC_KIND_FABRIC : GCA_IPC_KIND_FD;
  memcpy(pre + 4, &version, sizeof(version));
  memcpy(pre + 6, &kind, sizeof(kind));
  put_u32(pre + 8, (uint32_t)body_len);
  put_u32(pre + 12, h->fabric ? 0 : h->n);
  uint8_t *body = calloc(1, body_len);
  int *fds = calloc(h->n, sizeof(int));
  gca_status_t st = GCA_OK;
  if (body == NULL || fds == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "ipc_send: no host memory for a %zu-byte message",
                    body_len);
    goto out;
  }
  memcpy(body, h->id, sizeof(h->id));
  put_u32(body + 16, (uint32_t)h->device);
  put_u32(body + 20, h->n);
  put_u64(body + 24, h->block_size);
  for (uint32_t i = 0; i < h->n; i++) {
    uint8_t *p = body + BODY_HEAD + entry_len * i;
    put_u64(p, h->e[i].handle_size);
    put_u64(p + 8, h->e[i].handle_offset);
    put_u64(p + 16, h->e[i].map_size);
    put_u64(p + 24, (uint64_t)h->e[i].rel);
    if (h->fabric)
      memcpy(p + ENTRY_LEN, h->e[i].fabric, FABRIC_LEN);
    fds[i] = h->e[i].fd;
  }
  GCA_CHECK_GOTO(send_all(socket_fd, pre, sizeof(pre), NULL, 0), st, out);
  if (h->fabric) {
    st = send_all(socket_fd, body, body_len, NULL, 0);
    goto out;
  }
  uint32_t groups = (h->n + GCA_IPC_FDS_PER_MSG - 1) / GCA_IPC_FDS_PER_MSG;
  for (uint32_t g = 0; g < groups; g++) {
    size_t from = body_len * g / groups, to = body_len * (g + 1) / groups;
    uint32_t first = g * GCA_IPC_FDS_PER_MSG;
    uint32_t count = h->n - first < GCA_IPC_FDS_PER_MSG ? h->n - first : GCA_IPC_FDS_PER_MSG;
    GCA_CHECK_GOTO(send_all(socket_fd, body + from, to - from, fds + first, count), st, out);
  }
out:
  free(fds);
  free(body);
  return st;
}

/* Received descriptors, closed together when the message is refused. */
typedef struct fdset {
  int *v;
  uint32_t len, cap;
  bool overflow; /* more arrived than announced, or some were cut off */
} fdset_t;

static void fdset_close(fdset_t *s) {
  for (uint32_t i = 0; i < s->len; i++)
    close(s->v[i]);
  s->len = 0;
}

/* Receives exactly len bytes into buf, collecting descriptors into s. */
static gca_status_t recv_all(int sock, uint8_t *buf, size_t len, fdset_t *s) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * GCA_IPC_FDS_PER_MSG)];
    struct cmsghdr align;
  } ctl;
  size_t done = 0;
  while (done < len) {
    struct iovec iov = {.iov_base = buf + done, .iov_len = len - done};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl)};
    ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return gca__error(GCA_ERR_IO, "ipc_recv: recvmsg on socket %d failed: %s", sock,
                        strerror(errno));
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
        if (s->len < s->cap) {
          s->v[s->len++] = fd;
        } else {
          close(fd);
          s->overflow = true;
        }
      }
    }
    if (msg.msg_flags & MSG_CTRUNC)
      s->overflow = true;
    if (r == 0)
      return gca__error(GCA_ERR_PARSE,
                        "ipc_recv: the connection closed after %zu of %zu bytes (truncated "
                        "message)",
                        done, len);
    done += (size_t)r;
  }
  return GCA_OK;
}

GCA_API gca_status_t gca_ipc_recv(int socket_fd, gca_ipc_handle_t **out) {
  if (out == NULL || socket_fd < 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_recv: %s",
                      out == NULL ? "out is NULL" : "socket fd is negative");
  gca_status_t st;
  uint8_t pre[PREAMBLE_LEN];
  uint8_t *body = NULL;
  gca_ipc_handle_t *h = NULL;
  fdset_t fds = {.v = NULL, .cap = 0};
  GCA_CHECK_GOTO(recv_all(socket_fd, pre, sizeof(pre), &fds), st, fail);
  if (fds.overflow) {
    st = gca__error(GCA_ERR_PARSE, "ipc_recv: descriptors arrived with the preamble");
    goto fail;
  }
  uint32_t magic = get_u32(pre), body_len = get_u32(pre + 8), nfds = get_u32(pre + 12);
  uint16_t version, kind;
  memcpy(&version, pre + 4, sizeof(version));
  memcpy(&kind, pre + 6, sizeof(kind));
  if (magic != GCA_IPC_MAGIC) {
    st = gca__error(GCA_ERR_PARSE,
                    "ipc_recv: magic 0x%08" PRIx32 ", expected 0x%08x (not a gca IPC message)",
                    magic, GCA_IPC_MAGIC);
    goto fail;
  }
  if (version != GCA_IPC_VERSION) {
    st = gca__error(GCA_ERR_PARSE, "ipc_recv: protocol version %u, this library speaks %u",
                    (unsigned)version, GCA_IPC_VERSION);
    goto fail;
  }
  if (kind != GCA_IPC_KIND_FD && kind != GCA_IPC_KIND_FABRIC) {
    st = gca__error(GCA_ERR_PARSE, "ipc_recv: handle kind %u, expected %u (fd) or %u (fabric)",
                    (unsigned)kind, GCA_IPC_KIND_FD, GCA_IPC_KIND_FABRIC);
    goto fail;
  }
  bool fabric = kind == GCA_IPC_KIND_FABRIC;
  uint32_t n = nfds;
  if (fabric) {
    n = body_len >= BODY_HEAD ? (body_len - BODY_HEAD) / FENTRY_LEN : 0;
    if (nfds != 0 || n == 0 || n > GCA_IPC_MAX_HANDLES ||
        body_len != BODY_HEAD + (uint64_t)FENTRY_LEN * n) {
      st = gca__error(GCA_ERR_PARSE,
                      "ipc_recv: fabric message with %" PRIu32 " descriptors and a %" PRIu32
                      "-byte body announced; expected none and %u + %u bytes for each of 1 to "
                      "%u handles",
                      nfds, body_len, BODY_HEAD, FENTRY_LEN, GCA_IPC_MAX_HANDLES);
      goto fail;
    }
  } else if (nfds == 0 || nfds > GCA_IPC_MAX_HANDLES ||
             body_len != BODY_HEAD + (uint64_t)ENTRY_LEN * nfds) {
    st = gca__error(GCA_ERR_PARSE,
                    "ipc_recv: %" PRIu32 " descriptors and a %" PRIu32
                    "-byte body announced; expected 1 to %u descriptors and %u + %u bytes each",
                    nfds, body_len, GCA_IPC_MAX_HANDLES, BODY_HEAD, ENTRY_LEN);
    goto fail;
  }
  body = malloc(body_len);
  fds.v = calloc(n, sizeof(int));
  if (body == NULL || fds.v == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "ipc_recv: no host memory for a %" PRIu32 "-byte body",
                    body_len);
    goto fail;
  }
  fds.cap = nfds;
  GCA_CHECK_GOTO(recv_all(socket_fd, body, body_len, &fds), st, fail);
  if (fds.overflow || fds.len != nfds) {
    st = gca__error(GCA_ERR_PARSE,
                    "ipc_recv: %" PRIu32 " descriptors announced, %s%" PRIu32 " received", nfds,
                    fds.overflow ? "more than " : "", fds.len);
    goto fail;
  }
  if (get_u32(body + 20) != n) {
    st = gca__error(GCA_ERR_PARSE,
                    "ipc_recv: the body lists %" PRIu32 " handles, the preamble %" PRIu32,
                    get_u32(body + 20), n);
    goto fail;
  }
  h = handle_new(n, fabric);
  if (h == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "ipc_recv: no host memory for the handle");
    goto fail;
  }
  memcpy(h->id, body, sizeof(h->id));
  h->device = (int32_t)get_u32(body + 16);
  h->block_size = get_u64(body + 24);
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *p = body + BODY_HEAD + (size_t)(fabric ? FENTRY_LEN : ENTRY_LEN) * i;
    h->e[i].handle_size = get_u64(p);
    h->e[i].handle_offset = get_u64(p + 8);
    h->e[i].map_size = get_u64(p + 16);
    h->e[i].rel = (int64_t)get_u64(p + 24);
    if (fabric)
      memcpy(h->e[i].fabric, p + ENTRY_LEN, FABRIC_LEN);
  }
  GCA_CHECK_GOTO(check_layout("ipc_recv", h), st, fail);
  for (uint32_t i = 0; i < nfds; i++)
    h->e[i].fd = fds.v[i];
  free(fds.v);
  free(body);
  *out = h;
  return GCA_OK;

fail:
  gca_ipc_handle_free(h);
  fdset_close(&fds);
  free(fds.v);
  free(body);
  return st;
}

/* ---- import ---- */

/* Undoes an import: unmaps [base, base + mapped), releases handles[0..n),
 * frees the range when reserved. Failures are logged; the first is returned. */
static gca_status_t import_undo(const gca_device_ops_t *ops, int device, gca_devptr_t base,
                                size_t span, size_t mapped, const gca_memhandle_t *handles,
                                uint32_t n) {
  gca_status_t first = GCA_OK, st;
  if (mapped > 0 && (st = ops->mem_unmap(base, mapped)) != GCA_OK)
    first = st;
  for (uint32_t i = 0; i < n; i++)
    if ((st = ops->mem_release(handles[i])) != GCA_OK && first == GCA_OK)
      first = st;
  if (span > 0 && (st = ops->mem_address_free(device, base, span)) != GCA_OK && first == GCA_OK)
    first = st;
  if (first != GCA_OK)
    GCA_LOG_WARN("ipc: undoing the import at 0x%" PRIx64 " failed: %s", base, gca_last_error());
  return first;
}

static gca_status_t registry_add(const ipc_import_t *imp) {
  pthread_mutex_lock(&reg.lock);
  if (reg.len == reg.cap) {
    size_t cap = reg.cap ? reg.cap * 2 : 16;
    ipc_import_t *v = realloc(reg.v, cap * sizeof(*v));
    if (v == NULL) {
      pthread_mutex_unlock(&reg.lock);
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "ipc_open: no host memory for the import registry");
    }
    reg.v = v;
    reg.cap = cap;
  }
  reg.v[reg.len++] = *imp;
  pthread_mutex_unlock(&reg.lock);
  return GCA_OK;
}

/* Removes and returns the import that gca_ipc_open returned as `user`. */
static bool registry_take(gca_devptr_t user, ipc_import_t *out) {
  bool found = false;
  pthread_mutex_lock(&reg.lock);
  for (size_t i = 0; i < reg.len; i++) {
    if (reg.v[i].user != user)
      continue;
    *out = reg.v[i];
    reg.v[i] = reg.v[--reg.len];
    found = true;
    break;
  }
  pthread_mutex_unlock(&reg.lock);
  return found;
}

GCA_API gca_status_t gca_ipc_open(const gca_ipc_handle_t *h, int device, void **ptr) {
  gca_status_t st;
  if (h == NULL || ptr == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_open: %s is NULL", h ? "ptr" : "handle");
  GCA_CHECK(check_layout("ipc_open", h));
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (ops == NULL)
    return gca__error_prefix(st, "ipc_open");
  int count = 0;
  size_t gran = 0;
  GCA_CHECK(ops->device_count(&count));
  if (device < 0 || device >= count)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_open: device %d does not exist (%d devices)",
                      device, count);
  GCA_CHECK(check_kind("ipc_open", ops, device, h->fabric));
  GCA_CHECK(ops->mem_granularity(device, false, &gran));
  for (uint32_t i = 0; i < h->n; i++) {
    if (!h->fabric && h->e[i].fd < 0)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "ipc_open: handle %" PRIu32 " has no fd", i);
    if (gran == 0 || h->e[i].map_size % gran || h->e[i].handle_offset % gran)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "ipc_open: handle %" PRIu32 " maps %" PRIu64 " bytes at offset %" PRIu64
                        ", not multiples of device %d's granularity %zu",
                        i, h->e[i].map_size, h->e[i].handle_offset, device, gran);
  }
  const ipc_entry_t *last = &h->e[h->n - 1];
  size_t span = (size_t)(last->rel + (int64_t)last->map_size - h->e[0].rel);
  ipc_import_t imp = {.device = device, .n = 0, .span = 0};
  size_t mapped = 0;
  imp.handles = calloc(h->n, sizeof(*imp.handles));
  if (imp.handles == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "ipc_open: no host memory for %" PRIu32 " handles",
                      h->n);
  for (; imp.n < h->n; imp.n++)
    GCA_CHECK_GOTO(h->fabric
                       ? ops->mem_import_fabric(device, h->e[imp.n].fabric, &imp.handles[imp.n])
                       : ops->mem_import_fd(device, h->e[imp.n].fd, &imp.handles[imp.n]),
                   st, fail);
  GCA_CHECK_GOTO(ops->mem_address_reserve(device, span, 0, &imp.base), st, fail);
  imp.span = span;
  for (uint32_t i = 0; i < h->n; i++) {
    GCA_CHECK_GOTO(ops->mem_map(imp.base + mapped, (size_t)h->e[i].map_size,
                                (size_t)h->e[i].handle_offset, imp.handles[i]),
                   st, fail);
    mapped += (size_t)h->e[i].map_size;
  }
  GCA_CHECK_GOTO(ops->mem_set_access(imp.base, span, &device, 1), st, fail);
  imp.user = imp.base + (gca_devptr_t)(-h->e[0].rel);
  GCA_CHECK_GOTO(registry_add(&imp), st, fail);
  *ptr = (void *)(uintptr_t)imp.user;
  return GCA_OK;

fail:
  gca__error_prefix(st, "ipc_open: device %d", device);
  GCA_CHECK_IGNORE(import_undo(ops, device, imp.base, imp.span, mapped, imp.handles, imp.n));
  free(imp.handles);
  return st;
}

GCA_API gca_status_t gca_ipc_close(void *ptr) {
  gca_devptr_t user = (gca_devptr_t)(uintptr_t)ptr;
  ipc_import_t imp;
  if (!registry_take(user, &imp))
    return gca__error(GCA_ERR_INVALID_POINTER,
                      "ipc_close: pointer 0x%" PRIx64 " is not an open IPC mapping (not returned "
                      "by gca_ipc_open, or already closed)",
                      user);
  const gca_device_ops_t *ops = gca__device();
  GCA_ASSERT(ops != NULL);
  gca_status_t st;
  if (!imp.unmapped) {
    st = ops->mem_unmap(imp.base, imp.span);
    if (st != GCA_OK) {
      gca_status_t st2 = registry_add(&imp);
      GCA_ASSERT(st2 == GCA_OK); /* the take left room */
      return gca__error_prefix(st, "ipc_close: pointer 0x%" PRIx64, user);
    }
    imp.unmapped = true;
  }
  /* Note [Half-closed imports]: once unmapped the pointer is unusable, but a
   * handle or the range that fails to go back stays registered, so that
   * calling gca_ipc_close again retries what is left instead of leaking it. */
  gca_status_t first = GCA_OK;
  uint32_t left = 0;
  for (uint32_t i = 0; i < imp.n; i++) {
    st = ops->mem_release(imp.handles[i]);
    if (st != GCA_OK) {
      if (first == GCA_OK)
        first = st;
      imp.handles[left++] = imp.handles[i];
    }
  }
  imp.n = left;
  if (imp.span != 0) {
    st = ops->mem_address_free(imp.device, imp.base, imp.span);
    if (st == GCA_OK)
      imp.span = 0;
    else if (first == GCA_OK)
      first = st;
  }
  if (first != GCA_OK) {
    gca_status_t st2 = registry_add(&imp);
    GCA_ASSERT(st2 == GCA_OK); /* the take left room */
    return gca__error_prefix(first,
                             "ipc_close: pointer 0x%" PRIx64 " was unmapped, but %" PRIu32
                             " handle(s)%s could not be released; call gca_ipc_close again",
                             user, imp.n, imp.span != 0 ? " and its address range" : "");
  }
  free(imp.handles);
  return GCA_OK;
}
