/* SPDX-License-Identifier: Apache-2.0 */
/* sim_mem.h - what the sim's memory (sim_mem.c) shares with its export and
 * import of allocations (sim_share.c): the physical allocation record and its
 * handles, under the memory lock. */
#ifndef GCA_SIM_MEM_H
#define GCA_SIM_MEM_H

#include <fcntl.h>
#include <sys/stat.h>

#include "sim.h"

#define GRAN ((uint64_t)GCA_SIM_GRANULARITY)
/* Note [Sim IPC handles]: physical memory is a memfd with this name, sealed
 * against resizing and further sealing as soon as it is sized. mem_import_fd
 * takes only such a memfd: a file on disk, a pipe, or a memfd someone else
 * made (another name, other seals) is refused. An fd of memory this process
 * holds is recognised by its inode and shares that allocation; from another
 * process the name and seals are what can be checked (a GPU driver validates its handles
 * in the kernel, which a host process cannot imitate), so a forger who copies
 * both deliberately is not caught, but no ordinary file is ever mapped as
 * device memory. */
#define MEMFD_NAME  "gca-sim-device-memory"
#define MEMFD_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* A physical allocation. refs == live handles naming it + mapping pieces over
 * it; when refs reaches 0 the fd is closed and `charged` bytes go back to the
 * device's capacity (charged == size for mem_create/mem_alloc, 0 for an import
 * of memory the sim does not already hold). */
typedef struct phys {
  struct phys *prev, *next; /* all live allocations, for imports */
  int fd;
  int dev;
  uint64_t size;
  uint64_t charged;
  uint64_t refs;
  dev_t st_dev;
  ino_t st_ino;
} phys_t;

/* sim_mem.c: the memory lock, and what needs it held. */
void gca__sim_mem_lock(void);
void gca__sim_mem_unlock(void);
phys_t *gca__sim_memhandle_find(gca_memhandle_t h, size_t *index);
/* A new handle naming p (p->refs + 1). */
gca_status_t gca__sim_memhandle_add(const char *op, phys_t *p, gca_memhandle_t *out);
/* Links p into the list of live allocations. */
void gca__sim_phys_link(phys_t *p);
/* Drops one reference; the last closes the memfd and gives back its charge. */
void gca__sim_phys_unref(phys_t *p);
/* The live allocation with this memfd inode, or NULL. */
phys_t *gca__sim_phys_by_inode(dev_t d, ino_t ino);
/* GCA_ERR_INVALID_ARGUMENT naming `what` when out is NULL (no lock needed). */
gca_status_t gca__sim_check_out(const char *op, const void *out, const char *what);

/* sim_share.c: mem_export_fd, mem_import_fd, mem_export_fabric, mem_import_fabric. */
void gca__sim_share_ops(gca_device_ops_t *ops);

#endif
