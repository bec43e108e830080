/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot.c - gca_record_history() and gca_snapshot_json(): the allocator's
 * state as JSON in the shape of PyTorch's torch.cuda.memory._snapshot().
 *
 * The one idea: a snapshot is a read-only walk (introspect.h) plus a copy of
 * each device's history ring, written straight into the JSON writer; nothing
 * of the allocator is held while the history and the settings are written, and
 * the walk's callback only appends to the writer. Frames are resolved with
 * dladdr(): name = nearest symbol (or "??"), filename = the object, line 0.
 *
 *   {"segments": [{device, address, total_size, allocated_size, active_size,
 *                  requested_size, stream, segment_type, segment_pool_id,
 *                  is_expandable, frames, blocks: [{address, size,
 *                  requested_size, state, frames}]}],
 *    "device_traces": [[{action, addr, size, stream, time_us, frames}], ...],
 *    "allocator_settings": {...}}
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "gca/allocator.h"
#include "history.h"
#include "host_internal.h"
#include "introspect.h"
#include "json.h"
#include "json_reader.h"

GCA_API gca_status_t gca_record_history(bool enabled, size_t max_entries, bool stacks) {
  return gca__history_configure(enabled, max_entries, stacks);
}

GCA_API void gca_string_free(char *s) {
  free(s);
}

static const char *block_state_name(gca_block_state_t s) {
  switch (s) {
  case GCA_BLOCK_ACTIVE_ALLOCATED:
    return "active_allocated";
  case GCA_BLOCK_ACTIVE_PENDING_FREE:
    return "active_pending_free";
  default:
    return "inactive";
  }
}

static void write_segment(const gca_segment_info_t *seg, const gca_block_info_t *blocks,
                          size_t nblocks, void *ctx) {
  gca_json_writer_t *w = ctx;
  gca__json_object_begin(w);
  gca__json_key(w, "device");
  gca__json_int(w, seg->device);
  gca__json_key(w, "address");
  gca__json_uint(w, seg->address);
  gca__json_key(w, "total_size");
  gca__json_uint(w, seg->total_size);
  gca__json_key(w, "allocated_size");
  gca__json_uint(w, seg->allocated_size);
  gca__json_key(w, "active_size");
  gca__json_uint(w, seg->active_size);
  gca__json_key(w, "requested_size");
  gca__json_uint(w, seg->requested_size);
  gca__json_key(w, "stream");
  gca__json_uint(w, (uint64_t)(uintptr_t)seg->stream);
  gca__json_key(w, "segment_type");
  gca__json_string(w, seg->is_large ? "large" : "small");
  gca__json_key(w, "segment_pool_id");
  gca__json_array_begin(w);
  gca__json_uint(w, seg->pool_id[0]);
  gca__json_uint(w, seg->pool_id[1]);
  gca__json_array_end(w);
  gca__json_key(w, "is_expandable");
  gca__json_bool(w, seg->is_expandable);
  gca__json_key(w, "frames");
  gca__json_array_begin(w);
  gca__json_array_end(w);
  gca__json_key(w, "blocks");
  gca__json_array_begin(w);
  for (size_t i = 0; i < nblocks; i++) {
    gca__json_object_begin(w);
    gca__json_key(w, "address");
    gca__json_uint(w, blocks[i].address);
    gca__json_key(w, "size");
    gca__json_uint(w, blocks[i].size);
    gca__json_key(w, "requested_size");
    gca__json_uint(w, blocks[i].requested_size);
    gca__json_key(w, "state");
    gca__json_string(w, block_state_name(blocks[i].state));
    gca__json_key(w, "frames");
    gca__json_array_begin(w);
    gca__json_array_end(w);
    gca__json_object_end(w);
  }
  gca__json_array_end(w);
  gca__json_object_end(w);
}

static void write_frames(gca_json_writer_t *w, const gca_history_entry_t *e) {
  gca__json_array_begin(w);
  for (int i = 0; i < e->nframes; i++) {
    Dl_info info;
    bool found = dladdr(e->frames[i], &info) != 0;
    gca__json_object_begin(w);
    gca__json_key(w, "filename");
    gca__json_string(w, found && info.dli_fname ? info.dli_fname : "??");
    gca__json_key(w, "line");
    gca__json_int(w, 0);
    gca__json_key(w, "name");
    gca__json_string(w, found && info.dli_sname ? info.dli_sname : "??");
    gca__json_object_end(w);
  }
  gca__json_array_end(w);
}

static gca_status_t write_trace(gca_json_writer_t *w, int device) {
  gca_history_entry_t *e;
  size_t n;
  GCA_CHECK(gca__history_copy(device, &e, &n));
  gca__json_array_begin(w);
  for (size_t i = 0; i < n; i++) {
    gca__json_object_begin(w);
    gca__json_key(w, "action");
    gca__json_string(w, gca__history_action_name(e[i].action));
    gca__json_key(w, "addr");
    gca__json_uint(w, e[i].addr);
    gca__json_key(w, "size");
    gca__json_uint(w, e[i].size);
    gca__json_key(w, "stream");
    gca__json_uint(w, (uint64_t)(uintptr_t)e[i].stream);
    gca__json_key(w, "time_us");
    gca__json_uint(w, e[i].time_ns / 1000);
    if (e[i].action == GCA_HA_OOM) {
      gca__json_key(w, "device_free"); /* PyTorch's OOM entries carry it in addr too */
      gca__json_uint(w, e[i].addr);
    }
    gca__json_key(w, "frames");
    write_frames(w, &e[i]);
    gca__json_object_end(w);
  }
  gca__json_array_end(w);
  free(e);
  return GCA_OK;
}

/* PyTorch's allocator_settings keys where it has them, plus gca's own. */
static void write_settings(gca_json_writer_t *w) {
  gca_alloc_config_t cfg;
  char conf[1024];
  gca__allocator_get_config(&cfg);
  if (gca__config_format(&cfg, conf, sizeof(conf)) != GCA_OK)
    conf[0] = '\0';
  gca__json_object_begin(w);
  gca__json_key(w, "PYTORCH_CUDA_ALLOC_CONF");
  gca__json_string(w, conf);
  gca__json_key(w, "max_split_size");
  if (cfg.max_split_size == UINT64_MAX)
    gca__json_int(w, -1);
  else
    gca__json_uint(w, cfg.max_split_size);
  gca__json_key(w, "max_non_split_rounding_size");
  gca__json_uint(w, cfg.max_non_split_rounding);
  gca__json_key(w, "garbage_collection_threshold");
  gca__json_double(w, cfg.garbage_collection_threshold);
  gca__json_key(w, "expandable_segments");
  gca__json_bool(w, cfg.expandable_segments);
  gca__json_key(w, "release_lock_on_cudamalloc");
  gca__json_bool(w, cfg.release_lock_on_device_alloc);
  gca__json_key(w, "pinned_use_cuda_host_register");
  gca__json_bool(w, cfg.pinned_use_host_register);
  gca__json_key(w, "pinned_num_register_threads");
  gca__json_uint(w, cfg.pinned_num_register_threads);
  gca__json_key(w, "pinned_use_background_threads");
  gca__json_bool(w, cfg.pinned_use_background_threads);
  gca__json_key(w, "per_process_memory_fraction");
  gca__json_double(w, cfg.per_process_memory_fraction);
  gca__json_key(w, "graph_capture_record_stream_reuse");
  gca__json_bool(w, cfg.graph_capture_record_stream_reuse);
  gca__json_key(w, "backend");
  gca__json_string(w, cfg.backend[0] ? cfg.backend : "native");
  gca__json_key(w, "roundup_power2_divisions");
  gca__json_object_begin(w);
  for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++) {
    char key[16];
    snprintf(key, sizeof(key), "%u", 1u << i);
    gca__json_key(w, key);
    gca__json_uint(w, cfg.roundup_power2_divisions[i]);
  }
  gca__json_object_end(w);
  gca__json_object_end(w);
}

GCA_API gca_status_t gca_snapshot_json(char **json, size_t *len) {
  if (!json)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "snapshot_json: the output pointer is NULL");
  gca_status_t st;
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  int ndev = gca__allocator_device_count();
  int ntrace = gca__history_device_count();
  if (ntrace < ndev)
    ntrace = ndev;

  gca__json_object_begin(&w);
  gca__json_key(&w, "segments");
  gca__json_array_begin(&w);
  for (int d = 0; d < ndev; d++)
    GCA_CHECK_GOTO(gca__allocator_walk(d, write_segment, &w), st, fail);
  gca__json_array_end(&w);
  gca__json_key(&w, "device_traces");
  gca__json_array_begin(&w);
  for (int d = 0; d < ntrace; d++)
    GCA_CHECK_GOTO(write_trace(&w, d), st, fail);
  gca__json_array_end(&w);
  gca__json_key(&w, "allocator_settings");
  write_settings(&w);
  gca__json_key(&w, "host_blocks"); /* pinned host memory (gca/host.h), not in PyTorch's */
  gca__host_snapshot_write(&w);
  gca__json_object_end(&w);
  st = gca__json_writer_finish(&w, json, len);
  if (st != GCA_OK)
    return gca__error_prefix(st, "snapshot_json");
  return GCA_OK;

fail:
  gca__json_writer_free(&w);
  return gca__error_prefix(st, "snapshot_json");
}

GCA_API gca_status_t gca_snapshot_json_to_pickle(const char *json, size_t len, char **pickle,
                                                 size_t *pickle_len) {
  if (!json || !pickle || !pickle_len)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "snapshot_json_to_pickle: NULL argument");
  gca_jv_t *root = NULL;
  gca_status_t st = gca__json_parse(json, len, &root);
  if (st != GCA_OK)
    return gca__error_prefix(st, "snapshot_json_to_pickle");
  if (root->kind != GCA_JV_OBJECT || !gca__json_get(root, "segments") ||
      !gca__json_get(root, "device_traces"))
    st = gca__error(GCA_ERR_PARSE,
                    "snapshot_json_to_pickle: not a snapshot (an object with 'segments' and "
                    "'device_traces')");
  else
    st = gca__json_to_pickle(root, pickle, pickle_len);
  gca__json_free(root);
  return st;
}

GCA_API gca_status_t gca_snapshot_pickle(char **pickle, size_t *len) {
  if (!pickle || !len)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "snapshot_pickle: the output pointer is NULL");
  char *json = NULL;
  size_t jlen = 0;
  GCA_CHECK(gca_snapshot_json(&json, &jlen));
  gca_status_t st = gca_snapshot_json_to_pickle(json, jlen, pickle, len);
  gca_string_free(json);
  return st;
}
