/* SPDX-License-Identifier: Apache-2.0 */
/* peer_jemalloc.h - plain jemalloc as a benchmark peer, loaded beside glibc.
 *
 * Debian's libjemalloc.so.2 exports malloc and free; linking it would replace
 * the benchmark's own malloc (glibc, another peer), so it is loaded with
 * dlopen(RTLD_LOCAL) and called through these pointers. It also uses
 * initial-exec TLS, which a late dlopen can only place in glibc's small
 * static TLS surplus: tool_jemalloc_load, called first thing in main (before
 * any thread), runs the program again with room
 * (GLIBC_TUNABLES=glibc.rtld.optional_static_tls) when that is why it failed.
 */
#ifndef GCA_TOOLS_PEER_JEMALLOC_H
#define GCA_TOOLS_PEER_JEMALLOC_H

#include <stdbool.h>
#include <stddef.h>

typedef struct tool_jemalloc {
  void *(*malloc)(size_t size);
  void (*free)(void *ptr);
  void *(*mallocx)(size_t size, int flags);
  void (*dallocx)(void *ptr, int flags);
  char why[256]; /* why it is missing, when it is */
} tool_jemalloc_t;

/* Loads libjemalloc.so.2 into *je; false (je->why says why) when it is not
 * there. May re-execute the program (argv) to make room for its TLS. */
bool tool_jemalloc_load(tool_jemalloc_t *je, char **argv);

#endif
