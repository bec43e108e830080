/* SPDX-License-Identifier: Apache-2.0 */
/* gca/ipc.h - sharing an allocation with another process: export a block as
 * file descriptors (or fabric handles), pass them over a Unix socket, map
 * them in the peer.
 *
 * The one idea: what crosses the process boundary is the physical memory
 * itself, as POSIX file descriptors of the driver's allocation handles
 * (cuMemExportToShareableHandle), never an address. The exporter describes
 * which handles back the block and where they sit relative to its first byte;
 * the importer maps the same handles into an address range of its own, so the
 * two processes see one memory. The driver counts references, and so does the
 * sim: the memory lives until the last process that holds a handle, a mapping
 * or an exported descriptor lets go. Freeing the block in the exporter while
 * the peer still has it open is allowed; the peer keeps the memory, and the
 * exporter's allocator may hand the same addresses out again (backed by
 * other memory once the old segment was released, by the same memory while it
 * is cached: the usual rules of sharing apply).
 *
 * Exportable blocks: every block of an expandable segment
 * (expandable_segments:True), and every block of a classic segment when the
 * allocator was configured with ipc_handles:True before the segment was
 * created (then classic segments are one mem_create handle each instead of a
 * cuMemAlloc allocation, which the driver cannot export). The device must
 * support POSIX file descriptor handles.
 *
 * Fabric handles (gca_ipc_export_ex with GCA_IPC_FABRIC): instead of file
 * descriptors, each physical handle travels as 64 opaque bytes
 * (CU_MEM_HANDLE_TYPE_FABRIC), which stay valid across the nodes of a
 * multi-node NVLink fabric where a descriptor cannot go; the bytes may be
 * carried by any means, gca_ipc_send among them. Both devices must report
 * fabric support, the memory must have been created while the exporter's did
 * (the cuda backend then requests fabric handles for every allocation), and
 * both processes need access to the same IMEX channel, else the driver
 * refuses. Unlike a descriptor, the bytes hold no reference to the memory:
 * the exporter must keep the block until the peer has opened it. The choice
 * is the caller's: there is no automatic fallback from one kind to the other.
 *
 * Wire format (gca_ipc_send / gca_ipc_recv), host byte order, on a
 * SOCK_STREAM or SOCK_SEQPACKET Unix socket:
 *   preamble, 16 bytes, sent alone and without descriptors:
 *     u32 magic (GCA_IPC_MAGIC)  u16 version (GCA_IPC_VERSION)  u16 kind
 *     u32 body_len               u32 nfds
 *   kind 0 (GCA_IPC_KIND_FD), descriptors:
 *   body, body_len == 32 + 32 * nfds bytes, in ceil(nfds / GCA_IPC_FDS_PER_MSG)
 *   pieces, piece k carrying descriptors [k * GCA_IPC_FDS_PER_MSG, ...) as
 *   SCM_RIGHTS, in entry order:
 *     u8 id[16]  i32 device  u32 nentries (== nfds)  u64 block_size
 *     nentries x { u64 handle_size  u64 handle_offset  u64 map_size  i64 rel }
 *   kind 1 (GCA_IPC_KIND_FABRIC), fabric handles: nfds == 0, no descriptors,
 *   body_len == 32 + 96 * nentries bytes in one piece, the same head, and each
 *   entry the same 32 bytes followed by the handle's u8 fabric[64].
 *   Entry k maps bytes [handle_offset, handle_offset + map_size) of handle k
 *   at (block start + rel); entries are contiguous in rel order and together
 *   cover [0, block_size). As cuMemMap maps a handle whole and from its start,
 *   handle_offset is 0 and map_size == handle_size (gca_ipc_recv refuses
 *   anything else).
 */
#ifndef GCA_IPC_H
#define GCA_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GCA_IPC_MAGIC       0x49414347u /* "GCAI" read as a little-endian u32 */
#define GCA_IPC_VERSION     1u
#define GCA_IPC_FDS_PER_MSG 64u   /* descriptors per SCM_RIGHTS message */
#define GCA_IPC_MAX_HANDLES 4096u /* more entries than this is a malformed message */
#define GCA_IPC_KIND_FD     0u    /* preamble kind: handles are SCM_RIGHTS descriptors */
#define GCA_IPC_KIND_FABRIC 1u    /* preamble kind: handles are 64-byte fabric handles */

/* gca_ipc_export_ex flags. */
#define GCA_IPC_FABRIC 0x1u /* export fabric handles instead of file descriptors */

/* An exported (or received) block: its device, size, a random 128-bit id, and
 * per physical handle backing it one owned file descriptor or, for a fabric
 * export, one 64-byte fabric handle. */
typedef struct gca_ipc_handle gca_ipc_handle_t;

/* Exports the live block that starts at `ptr` (a gca allocation). The handle
 * owns its descriptors, and through them a reference to the memory, until
 * gca_ipc_handle_free. GCA_ERR_INVALID_POINTER when ptr is not the start of a
 * live block; GCA_ERR_NOT_SUPPORTED when its segment came from cuMemAlloc
 * (the message says to set ipc_handles:True or expandable_segments:True) or
 * the device has no POSIX fd handles. */
GCA_API gca_status_t gca_ipc_export(void *ptr, gca_ipc_handle_t **out);
/* As gca_ipc_export, with `flags` a combination of GCA_IPC_* (0 is
 * gca_ipc_export). With GCA_IPC_FABRIC the handles are fabric handles:
 * GCA_ERR_NOT_SUPPORTED, saying so, when the device does not report fabric
 * support or its driver refuses to create them (no IMEX channel, found out by
 * creating memory with them); the driver's other refusals are passed on.
 * Unknown flags are GCA_ERR_INVALID_ARGUMENT. */
GCA_API gca_status_t gca_ipc_export_ex(void *ptr, unsigned flags, gca_ipc_handle_t **out);
/* Closes the descriptors the handle owns and frees it; NULL is ignored. */
GCA_API void gca_ipc_handle_free(gca_ipc_handle_t *h);
/* What a handle describes; any output may be NULL. id receives 16 bytes. */
GCA_API gca_status_t gca_ipc_handle_info(const gca_ipc_handle_t *h, int *device, size_t *block_size,
                                         size_t *nhandles, uint8_t id[16]);
/* The GCA_IPC_* flags the handle was exported with (GCA_IPC_FABRIC or 0). */
GCA_API gca_status_t gca_ipc_handle_flags(const gca_ipc_handle_t *h, unsigned *flags);

/* Sends a handle over a connected Unix socket (the descriptors are
 * duplicated into the peer; h keeps its own; fabric handles go as plain
 * bytes). GCA_ERR_IO when the socket fails. SIGPIPE is not raised. */
GCA_API gca_status_t gca_ipc_send(int socket_fd, const gca_ipc_handle_t *h);
/* Receives one handle sent by gca_ipc_send; blocks until it is complete. Every
 * field is validated: a truncated, foreign, inconsistent or absurd message is
 * GCA_ERR_PARSE (GCA_ERR_IO when the socket fails), every descriptor received
 * is closed then, and the socket is no longer in step (close it). */
GCA_API gca_status_t gca_ipc_recv(int socket_fd, gca_ipc_handle_t **out);

/* Maps a (received) handle's memory into this process for `device`: imports
 * every descriptor (or fabric handle), reserves one range, maps each handle at its place and
 * gives `device` read-write access. *ptr is the block's first byte. The
 * handle may be freed afterwards. On failure nothing stays imported, mapped
 * or reserved. */
GCA_API gca_status_t gca_ipc_open(const gca_ipc_handle_t *h, int device, void **ptr);
/* Unmaps what gca_ipc_open mapped, releases its handles and frees the range.
 * Work that uses the memory must be complete. GCA_ERR_INVALID_POINTER for a
 * pointer gca_ipc_open did not return or that was already closed. */
GCA_API gca_status_t gca_ipc_close(void *ptr);

#ifdef __cplusplus
}
#endif
#endif
