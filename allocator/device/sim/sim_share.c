/* SPDX-License-Identifier: Apache-2.0 */
/* sim_share.c - the sim's export and import of physical allocations: file
 * descriptors (Note [Sim IPC handles]) and fabric handles (Note [Sim fabric
 * handles]).
 *
 * The one idea: nothing from outside is mapped as device memory unless it is
 * the sim's own sealed memfd, found again by its inode, so an import shares
 * the exporter's allocation or is refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_mem.h"

static gca_status_t sim_mem_export_fd(gca_memhandle_t handle, int *fd) {
  GCA_SIM_ENTER(mem_export_fd, 0);
  GCA_CHECK(gca__sim_check_out("mem_export_fd", fd, "fd"));
  gca_status_t st = GCA_OK;
  gca__sim_mem_lock();
  phys_t *p = gca__sim_memhandle_find(handle, NULL);
  if (!p) {
    st = gca__error(GCA_ERR_INVALID_HANDLE, "mem_export_fd: 0x%llx is not a live handle",
                    (unsigned long long)handle);
  } else {
    int d = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0)
      st =
          gca__error(GCA_ERR_DRIVER, "mem_export_fd: cannot duplicate the fd: %s", strerror(errno));
    else
      *fd = d;
  }
  gca__sim_mem_unlock();
  return st;
}

/* Note [Sim IPC handles]: GCA_OK when fd is a memfd named and sealed as the sim's. */
static gca_status_t check_sim_memfd(const char *op, int fd) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: fd %d is not exported device memory (not a memfd: %s)", op, fd,
                      strerror(errno));
  char link[64], target[128];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  target[n > 0 ? n : 0] = '\0';
  static const char want[] = "/memfd:" MEMFD_NAME " (deleted)";
  if (strcmp(target, want) != 0 || seals != MEMFD_SEALS)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: fd %d is not exported device memory ('%s', seals 0x%x; "
                      "the sim exports '%s' sealed 0x%x)",
                      op, fd, target, (unsigned)seals, want, (unsigned)MEMFD_SEALS);
  return GCA_OK;
}

/* Makes a handle on `dev` for the memory behind fd (already checked to be the
 * sim's): the allocation this process holds with that inode, else a new record
 * of it (charged nothing: its owner pays). */
static gca_status_t import_checked(const char *op, int dev, int fd, const struct stat *sb,
                                   gca_memhandle_t *out) {
  gca_status_t st = GCA_OK;
  gca__sim_mem_lock();
  phys_t *p = gca__sim_phys_by_inode(sb->st_dev, sb->st_ino);
  bool fresh = p == NULL;
  if (fresh) {
    p = calloc(1, sizeof(*p));
    if (!p) {
      st = gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", op);
      goto out;
    }
    p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (p->fd < 0) {
      st = gca__error(GCA_ERR_DRIVER, "%s: cannot duplicate fd %d: %s", op, fd, strerror(errno));
      free(p);
      goto out;
    }
    p->dev = dev;
    p->size = (uint64_t)sb->st_size;
    p->st_dev = sb->st_dev;
    p->st_ino = sb->st_ino;
    gca__sim_phys_link(p);
  }
  st = gca__sim_memhandle_add(op, p, out);
  if (st != GCA_OK && fresh) {
    p->refs = 1;
    gca__sim_phys_unref(p);
  }
out:
  gca__sim_mem_unlock();
  return st;
}

/* GCA_OK when fd is open on a regular file whose size is a whole number of
 * granules (*sb filled); the memfd check comes after. */
static gca_status_t stat_exported(const char *op, int fd, struct stat *sb) {
  if (fd < 0 || fstat(fd, sb) != 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: fd %d is not open", op, fd);
  if (!S_ISREG(sb->st_mode) || sb->st_size <= 0 || (uint64_t)sb->st_size % GRAN)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: fd %d is not exported device memory (size %lld)", op, fd,
                      (long long)sb->st_size);
  return GCA_OK;
}

static gca_status_t sim_mem_import_fd(int dev, int fd, gca_memhandle_t *out) {
  GCA_SIM_ENTER(mem_import_fd, 0);
  GCA_CHECK(gca__sim_check_device("mem_import_fd", dev));
  GCA_CHECK(gca__sim_check_out("mem_import_fd", out, "out"));
  struct stat sb;
  GCA_CHECK(stat_exported("mem_import_fd", fd, &sb));
  GCA_CHECK(check_sim_memfd("mem_import_fd", fd));
  return import_checked("mem_import_fd", dev, fd, &sb, out);
}

/* Note [Sim fabric handles]: by default the sim reports
 * GCA_ATTR_FABRIC_SUPPORTED = 0, as a GPU outside a multi-node NVLink fabric
 * does, and both fabric ops refuse (after counting and fault checks). With
 * GCA_SIM_FABRIC=1 it claims support, as a driver on an IMEX-managed system
 * does, and a fabric handle is 64 bytes that name the allocation without
 * carrying a descriptor: the tag FABRIC_MAGIC, the exporting process's pid,
 * the number of the fd the exporter holds for the allocation (its own memfd,
 * open for as long as the allocation lives, as the driver keeps a fabric
 * handle valid while the allocation exists), the memfd's device and inode, its
 * size, and zeros. An import in the exporting process finds the allocation by
 * inode; another process opens /proc/PID/fd/FD (the path the kernel offers to
 * a process of the same user) and accepts it only when it is the sim's sealed
 * memfd with the inode and size the handle names, so a forged or stale handle
 * (the exporter gone, the fd number reused) is refused, never mapped. A GPU
 * that reports fabric support but whose driver refuses to create fabric
 * handles (no IMEX channel) needs no mode of its own: the cuda backend then
 * answers GCA_ATTR_FABRIC_SUPPORTED = 0 and mem_export_fabric NOT_SUPPORTED
 * (Note [Fabric handles]), as the sim does by default. */
#define FABRIC_MAGIC "GCASIMF1"

typedef struct fabric_name {
  char magic[8];
  uint32_t pid;
  int32_t fd;
  uint64_t st_dev, st_ino, size;
} fabric_name_t;
_Static_assert(sizeof(fabric_name_t) <= GCA_FABRIC_HANDLE_LEN, "a fabric name fits a handle");

static gca_status_t sim_mem_export_fabric(gca_memhandle_t handle,
                                          uint8_t out[GCA_FABRIC_HANDLE_LEN]) {
  GCA_SIM_ENTER(mem_export_fabric, 0);
  if (!gca__sim_fabric_supported())
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_export_fabric: handle 0x%llx: the sim device has no fabric handles "
                      "(GCA_ATTR_FABRIC_SUPPORTED is 0; GCA_SIM_FABRIC=1 turns them on)",
                      (unsigned long long)handle);
  GCA_CHECK(gca__sim_check_out("mem_export_fabric", out, "out"));
  gca_status_t st = GCA_OK;
  gca__sim_mem_lock();
  phys_t *p = gca__sim_memhandle_find(handle, NULL);
  if (!p) {
    st = gca__error(GCA_ERR_INVALID_HANDLE, "mem_export_fabric: 0x%llx is not a live handle",
                    (unsigned long long)handle);
  } else {
    fabric_name_t n = {.pid = (uint32_t)getpid(),
                       .fd = p->fd,
                       .st_dev = (uint64_t)p->st_dev,
                       .st_ino = (uint64_t)p->st_ino,
                       .size = p->size};
    memcpy(n.magic, FABRIC_MAGIC, sizeof(n.magic));
    memset(out, 0, GCA_FABRIC_HANDLE_LEN);
    memcpy(out, &n, sizeof(n));
  }
  gca__sim_mem_unlock();
  return st;
}

static gca_status_t sim_mem_import_fabric(int dev, const uint8_t in[GCA_FABRIC_HANDLE_LEN],
                                          gca_memhandle_t *out) {
  GCA_SIM_ENTER(mem_import_fabric, 0);
  static const char op[] = "mem_import_fabric";
  if (!gca__sim_fabric_supported())
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "mem_import_fabric: sim device %d has no fabric handles "
                      "(GCA_ATTR_FABRIC_SUPPORTED is 0; GCA_SIM_FABRIC=1 turns them on)",
                      dev);
  GCA_CHECK(gca__sim_check_device(op, dev));
  GCA_CHECK(gca__sim_check_out(op, out, "out"));
  GCA_CHECK(gca__sim_check_out(op, in, "in"));
  fabric_name_t n;
  memcpy(&n, in, sizeof(n));
  bool zeros = true;
  for (size_t i = sizeof(n); i < GCA_FABRIC_HANDLE_LEN; i++)
    zeros &= in[i] == 0;
  if (memcmp(n.magic, FABRIC_MAGIC, sizeof(n.magic)) != 0 || !zeros || n.fd < 0 || n.pid == 0 ||
      n.size == 0 || n.size % GRAN)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: the 64 bytes are not a sim fabric handle", op);
  int fd = -1;
  if (n.pid == (uint32_t)getpid()) {
    fd = fcntl(n.fd, F_DUPFD_CLOEXEC, 0);
  } else {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/fd/%d", n.pid, n.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
  }
  if (fd < 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: the handle names no live allocation (process %u, fd %d: %s)", op, n.pid,
                      n.fd, strerror(errno));
  struct stat sb;
  gca_status_t st = stat_exported(op, fd, &sb);
  if (st == GCA_OK)
    st = check_sim_memfd(op, fd);
  if (st == GCA_OK && ((uint64_t)sb.st_dev != n.st_dev || (uint64_t)sb.st_ino != n.st_ino ||
                       (uint64_t)sb.st_size != n.size))
    st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                    "%s: the handle names no live allocation (process %u, fd %d now holds "
                    "another one: the exporter released it)",
                    op, n.pid, n.fd);
  if (st == GCA_OK)
    st = import_checked(op, dev, fd, &sb, out);
  close(fd);
  return st;
}

void gca__sim_share_ops(gca_device_ops_t *ops) {
  ops->mem_export_fd = sim_mem_export_fd;
  ops->mem_import_fd = sim_mem_import_fd;
  ops->mem_export_fabric = sim_mem_export_fabric;
  ops->mem_import_fabric = sim_mem_import_fabric;
}
