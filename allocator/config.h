/* SPDX-License-Identifier: Apache-2.0 */
/* config.h - the allocator's settings and their parser.
 *
 * Syntax and keys are PyTorch's (PYTORCH_CUDA_ALLOC_CONF): a comma-separated
 * list of key:value; roundup_power2_divisions also takes the list form
 * [256:1,512:2,1024:4,>:8] (keys are sizes in MiB, powers of two, ascending;
 * '>' covers everything above the last key). gca reads GCA_ALLOC_CONF first
 * and falls back to PYTORCH_CUDA_ALLOC_CONF. Unknown keys and bad values are
 * GCA_ERR_CONFIG with the offending text quoted; a failed parse leaves the
 * output untouched.
 *
 * gca adds two keys of its own. free_cache (default True) keeps the last
 * plain free of each (stream, pool) uncoalesced for the next request of its
 * size, served only where PyTorch's best fit would serve it (Note [Free
 * cache], fcache.c): placement is PyTorch's either way; False skips the cache.
 * ipc_handles:True makes classic (non-expandable)
 * segments VMM-backed (one mem_create handle of the segment's size, mapped
 * once) instead of mem_alloc'd, so that their blocks can be exported to other
 * processes with gca_ipc_export (gca/ipc.h); they behave as classic segments
 * otherwise. Expandable segments are always exportable. Both keys are always
 * formatted, so that a formatted string restores them when parsed on top of
 * other settings. thread_cache (default True) lets each thread, once a
 * second one uses a device, cache its frees without the device lock (Note
 * [Thread caches], tcache.c). recycle_bins (default True) lets the free
 * cache keep plain frees of small blocks by stream and size for the next
 * requests of their size, leaving PyTorch's placement for those blocks (Note
 * [Recycle bins], recycle.c); free_cache:False turns them off with the rest
 * of the free cache, so that placement is PyTorch's. It is formatted only
 * when False.
 */
#ifndef GCA_ALLOC_CONFIG_H
#define GCA_ALLOC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* roundup_power2_divisions has one entry per power-of-two interval starting at
 * 1 MiB: index i covers sizes in [2^(20+i-1), 2^(20+i)) ... as in PyTorch's
 * kRoundUpPowerOfTwoIntervals = 16 (index 0: <= 1 MiB, index 15: >= 16 GiB). */
#define GCA_ROUNDUP_INTERVALS 16

typedef struct gca_alloc_config {
  uint64_t max_split_size;             /* bytes; UINT64_MAX = unlimited (default) */
  uint64_t max_non_split_rounding;     /* bytes; default 20 MiB (kLargeBuffer) */
  double garbage_collection_threshold; /* 0 = off; else in (0, 1) */
  uint32_t roundup_power2_divisions[GCA_ROUNDUP_INTERVALS]; /* 0 = no extra rounding */
  bool expandable_segments;
  bool release_lock_on_device_alloc;    /* key: release_lock_on_cudamalloc */
  bool pinned_use_host_register;        /* key: pinned_use_cuda_host_register */
  uint32_t pinned_num_register_threads; /* power of two, 1..128; default 1 */
  bool pinned_use_background_threads;
  double per_process_memory_fraction; /* 0 = unset; else in (0, 1] */
  bool graph_capture_record_stream_reuse;
  bool ipc_handles; /* gca's own key: VMM-backed classic segments */
  bool free_cache;  /* gca's own key: Note [Free cache] (default true) */
  /* gca's own key: Note [Expandable segments] handle moves (default true) */
  bool expandable_moves;
  /* gca's own key: Note [Thread caches] (default true) */
  bool thread_cache;
  /* gca's own key: Note [Recycle bins] (default true) */
  bool recycle_bins;
  char backend[16]; /* "native" (default) or "cudaMallocAsync" (rejected
                       with a message: gca is the allocator) */
} gca_alloc_config_t;

/* ---- config.c ---- */

/* The defaults (PyTorch's). */
void gca__config_defaults(gca_alloc_config_t *cfg);
/* Parses `text` on top of *cfg (keys not named keep their values). */
gca_status_t gca__config_parse(const char *text, gca_alloc_config_t *cfg);
/* The keys the parser knows, PyTorch's then gca's, in parse order. */
#define GCA__CONFIG_NKEYS 17
extern const char *const gca__config_keys[GCA__CONFIG_NKEYS];
/* Whether two settings are the same, field by field (padding is not a setting). */
bool gca__config_equal(const gca_alloc_config_t *a, const gca_alloc_config_t *b);
/* Defaults + GCA_ALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF). */
gca_status_t gca__config_from_env(gca_alloc_config_t *cfg);
/* Writes cfg back as a configuration string that parses to the same cfg. */
gca_status_t gca__config_format(const gca_alloc_config_t *cfg, char *buf, size_t len);
/* Divisions that apply to a request of `size` bytes (0 = none). */
uint32_t gca__config_roundup_divisions(const gca_alloc_config_t *cfg, size_t size);

#endif
