/* SPDX-License-Identifier: Apache-2.0 */
/* sim.h - internals of the sim backend, a software GPU on the host.
 *
 * Module map:
 *   sim.c        devices, capacity, the op table, fault injection, call counters,
 *                and the public gca_sim_* control API
 *   sim_mem.c    classic and VMM memory (memfd physical handles, PROT_NONE
 *                reservations, MAP_FIXED mappings at 2 MiB granularity, small
 *                classic allocations sub-allocated in shared chunks), IPC fds,
 *                per-device access rights and peer access
 *   sim_stream.c streams (a worker thread each, in order), events, the
 *                virtual clock
 *   sim_work.c   units of stream work (host funcs, copies, memsets, the
 *                ready-made kernels): their checks, their run, the ops
 *   sim_compute.c the f32 compute kernels' arithmetic (gemm, elementwise,
 *                dot) in the order of Note [Compute order]
 *   sim_host.c   pinned host memory (host_alloc, host_register): a table of
 *                the ranges the sim treats as page-locked
 *   sim_capture.c stream capture (modes, illegal-operation rules,
 *                invalidation, cross-stream joins through events)
 *   sim_graph.c  graphs (instantiate, upload, launch, exec-update, destroy)
 *                and their concurrent replay
 *
 * Device memory is host memory: a device pointer is a host virtual address,
 * so kernels (host functions run by the stream workers) read and write it
 * directly, and touching an unmapped device address faults as on a GPU.
 *
 * Every op begins with GCA_SIM_ENTER(op), which counts the call and applies
 * injected faults; an injected failure returns the op's natural error
 * (GCA_ERR_OUT_OF_MEMORY for memory-creating ops, GCA_ERR_DRIVER otherwise)
 * with a detail "<op>: injected fault (sim, call N)".
 */
#ifndef GCA_SIM_H
#define GCA_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"

#define GCA_SIM_MAX_DEVICES 16
#define GCA_SIM_GRANULARITY (2u << 20)

/* ---- sim.c ---- */

/* Counts a call of `op` and decides whether an injected fault applies; `bytes`
 * is the size a memory-creating op is about to create (0 otherwise). Returns
 * GCA_OK, or the failure (detail set) the op must return at once. */
gca_status_t gca__sim_enter(gca_dev_op_t op, uint64_t bytes);
#define GCA_SIM_ENTER(op, bytes) GCA_CHECK(gca__sim_enter(GCA_OP_##op, (bytes)))
/* True on a thread while it runs a host function (Note [Host functions],
 * device.h): every op then fails with GCA_ERR_NOT_PERMITTED. */
extern _Thread_local bool gca__sim_in_host_fn;

/* Number of sim devices (GCA_SIM_DEVICES, default 1) once initialized. */
int gca__sim_device_count(void);
/* GCA_ERR_INVALID_ARGUMENT naming `op` unless 0 <= dev < count. */
gca_status_t gca__sim_check_device(const char *op, int dev);
/* Reserves/returns physical capacity on a device (mem_create, mem_alloc).
 * GCA_ERR_OUT_OF_MEMORY naming `op`, requested and free bytes when full. */
gca_status_t gca__sim_capacity_take(const char *op, int dev, uint64_t bytes);
void gca__sim_capacity_give(int dev, uint64_t bytes);
/* Capacity of a valid device in bytes (GCA_SIM_DEVICE_MEMORY or gca_sim_set_capacity). */
uint64_t gca__sim_capacity(int dev);
/* Note [Sim virtual time] (sim_stream.c): GCA_SIM_CLOCK=virtual. Inside a
 * host function, the stream's virtual clock (ns) and a later time to move it
 * to; elsewhere _now is the host's clock and _advance_to does nothing. */
void gca__sim_clock_set_virtual(bool on);
bool gca__sim_clock_virtual(void);
uint64_t gca__sim_clock_now(void);
void gca__sim_clock_advance_to(uint64_t vt);
/* Makes *clock the calling thread's virtual clock (NULL: none); returns the
 * previous one (a graph replay's nodes each run on their own clock). */
uint64_t *gca__sim_clock_swap(uint64_t *clock);
/* Whether GCA_SIM_FABRIC=1 made the devices claim fabric handles. */
bool gca__sim_fabric_supported(void);
/* Note [Sim handles] (sim_stream.h): whether a new object gets the handle of
 * the last one destroyed; GCA_SIM_RECYCLE_HANDLES at init, tests may switch it. */
void gca__sim_set_recycle_handles(bool on);

/* ---- sim_mem.c ---- */

/* Installs the memory ops (mem_*) into the table. */
void gca__sim_mem_ops(gca_device_ops_t *ops);
/* Tests: fn(arg) is called by mem_free just before it waits for dev's queued
 * work (Note [Sim mem_free synchronizes]); NULL removes it. */
void gca__sim_mem_free_wait_hook(void (*fn)(void *arg), void *arg);
/* Device whose memory contains [ptr, ptr+len) if it is mapped device memory, else -1. */
int gca__sim_mem_device_of(gca_devptr_t ptr, size_t len);
/* Whether any byte of [ptr, ptr+len) lies in a device address reservation
 * (classic allocations included), mapped or not: such bytes are never host memory. */
bool gca__sim_mem_in_device_space(gca_devptr_t ptr, size_t len);
/* Note [Sim access rights]: GCA_OK when device `dev` may touch every mapped
 * byte of [ptr, ptr+len) (bytes outside device memory are not its concern),
 * else GCA_ERR_ILLEGAL_ADDRESS naming op, the device, the address and the
 * range. `copy`: the access is a copy's, which needs no peer access to classic
 * memory. One lookup; takes the memory lock. */
gca_status_t gca__sim_mem_check_access(const char *op, int dev, gca_devptr_t ptr, size_t len,
                                       bool copy);

/* ---- sim_stream.c ---- */

/* Installs stream, event, host-func, copy/memset and kernel ops. */
void gca__sim_stream_ops(gca_device_ops_t *ops);
/* Waits until every stream of `dev` (its legacy stream included) has run the
 * work queued on it when called: ctx_synchronize without its checks. */
void gca__sim_device_drain(int dev);

/* ---- sim_host.c ---- */

/* Installs host_alloc, host_free, host_register, host_unregister. */
void gca__sim_host_ops(gca_device_ops_t *ops);
/* Whether all of [p, p+len) lies in one pinned range (len 0: true). */
bool gca__sim_host_is_pinned(gca_devptr_t p, size_t len);
/* Bytes pinned now (host_alloc'd and registered). */
size_t gca__sim_host_pinned_bytes(void);

/* ---- sim_graph.c, sim_capture.c ---- */

/* Installs capture and graph ops. */
void gca__sim_graph_ops(gca_device_ops_t *ops);
/* Note [Capture-unsafe calls]: the driver forbids "potentially unsafe" calls
 * (cuMemAlloc, synchronous copies, synchronizing or querying work that is
 * being captured, ...) depending on the capture mode of the ongoing sequences
 * and the calling thread's exchange mode. Returns GCA_OK when `op` may run
 * now, else GCA_ERR_CAPTURE_UNSUPPORTED with the detail set (and invalidates
 * the offending capture where the driver would). */
gca_status_t gca__sim_capture_check_unsafe(const char *op);

#endif
