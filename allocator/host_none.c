/* SPDX-License-Identifier: Apache-2.0 */
/* host_none.c - gca/host.h in a build without jemalloc's header
 * (-Djemalloc=disabled, or jemalloc not found): every call says so. */
#include <stddef.h>
#include <string.h>

#include "common.h"
#include "gca/host.h"
#include "host_internal.h"
#include "introspect.h"

static gca_status_t none(const char *fn) {
  return gca__error(GCA_ERR_NOT_SUPPORTED,
                    "%s: gca was built without jemalloc (the pinned host allocator needs "
                    "jemalloc's header at build time: apt-get install libjemalloc-dev)",
                    fn);
}

GCA_API gca_status_t gca_host_alloc(void **ptr, size_t size) {
  if (ptr)
    *ptr = NULL;
  return none("gca_host_alloc");
}
GCA_API gca_status_t gca_host_free(void *ptr) {
  return ptr ? none("gca_host_free") : GCA_OK;
}
GCA_API gca_status_t gca_host_record_stream(void *ptr, gca_stream_t stream) {
  return none("gca_host_record_stream");
}
GCA_API gca_status_t gca_host_empty_cache(void) {
  return none("gca_host_empty_cache");
}
GCA_API gca_status_t gca_host_get_stats(gca_host_stats_t *stats) {
  if (stats)
    memset(stats, 0, sizeof(*stats));
  return none("gca_host_get_stats");
}
GCA_API void gca_host_reset_peak_stats(void) {}
void gca__host_snapshot_write(gca_json_writer_t *w) {
  gca__json_array_begin(w);
  gca__json_array_end(w);
}

GCA_API gca_status_t gca_host_snapshot_json(char **json) {
  if (json)
    *json = NULL;
  return none("gca_host_snapshot_json");
}

bool gca__host_owns(const void *ptr) {
  (void)ptr;
  return false;
}
