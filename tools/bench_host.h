/* SPDX-License-Identifier: Apache-2.0 */
/* bench_host.h - gca-bench's host section (bench_host.c). */
#ifndef GCA_TOOLS_BENCH_HOST_H
#define GCA_TOOLS_BENCH_HOST_H

#include <stdbool.h>

#include <jansson.h>

#include "gca.h"

/* Measures the pinned host allocator next to glibc and plain jemalloc; prints
 * a table, or with `json` sets *out to an object for the report's "host" key. */
gca_status_t gca__bench_host(double seconds, bool json, json_t **out);

#endif
