/* gca/ipc.h - sharing an allocation with another process: export a block as
 * file descriptors, pass them over a Unix socket, map them in the peer.
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
 * Wire format (gca_ipc_send / gca_ipc_recv), host byte order, on a
 * SOCK_STREAM or SOCK_SEQPACKET Unix socket:
 *   preamble, 16 bytes, sent alone and without descriptors:
 *     u32 magic (GCA_IPC_MAGIC)  u16 version (GCA_IPC_VERSION)  u16 zero
 *     u32 body_len               u32 nfds
 *   body, body_len == 32 + 32 * nfds bytes, in ceil(nfds / GCA_IPC_FDS_PER_MSG)
 *   pieces, piece k carrying descriptors [k * GCA_IPC_FDS_PER_MSG, ...) as
 *   SCM_RIGHTS, in entry order:
 *     u8 id[16]  i32 device  u32 nentries (== nfds)  u64 block_size
 *     nentries x { u64 handle_size  u64 handle_offset  u64 map_size  i64 rel }
 *   Entry k maps bytes [handle_offset, handle_offset + map_size) of handle k
 *   at (block start + rel); entries are contiguous in rel order and together
 *   cover [0, block_size).
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

/* An exported (or received) block: its device, size, a random 128-bit id, and
 * one owned file descriptor per physical handle backing it. */
typedef struct gca_ipc_handle gca_ipc_handle_t;

/* Exports the live block that starts at `ptr` (a gca allocation). The handle
 * owns its descriptors, and through them a reference to the memory, until
 * gca_ipc_handle_free. GCA_ERR_INVALID_POINTER when ptr is not the start of a
 * live block; GCA_ERR_NOT_SUPPORTED when its segment came from cuMemAlloc
 * (the message says to set ipc_handles:True or expandable_segments:True) or
 * the device has no POSIX fd handles. */
GCA_API gca_status_t gca_ipc_export(void *ptr, gca_ipc_handle_t **out);
/* Closes the descriptors the handle owns and frees it; NULL is ignored. */
GCA_API void gca_ipc_handle_free(gca_ipc_handle_t *h);
/* What a handle describes; any output may be NULL. id receives 16 bytes. */
GCA_API gca_status_t gca_ipc_handle_info(const gca_ipc_handle_t *h, int *device, size_t *block_size,
                                         size_t *nhandles, uint8_t id[16]);

/* Sends a handle over a connected Unix socket (the descriptors are
 * duplicated into the peer; h keeps its own). GCA_ERR_IO when the socket
 * fails. SIGPIPE is not raised. */
GCA_API gca_status_t gca_ipc_send(int socket_fd, const gca_ipc_handle_t *h);
/* Receives one handle sent by gca_ipc_send; blocks until it is complete. Every
 * field is validated: a truncated, foreign, inconsistent or absurd message is
 * GCA_ERR_PARSE (GCA_ERR_IO when the socket fails), every descriptor received
 * is closed then, and the socket is no longer in step (close it). */
GCA_API gca_status_t gca_ipc_recv(int socket_fd, gca_ipc_handle_t **out);

/* Maps a (received) handle's memory into this process for `device`: imports
 * every descriptor, reserves one range, maps each handle at its place and
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
