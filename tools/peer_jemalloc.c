/* SPDX-License-Identifier: Apache-2.0 */
/* peer_jemalloc.c - plain jemalloc as a benchmark peer (peer_jemalloc.h). */
#include "peer_jemalloc.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool tool_jemalloc_load(tool_jemalloc_t *je, char **argv) {
  memset(je, 0, sizeof(*je));
  void *h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *err = dlerror();
    if (err && strstr(err, "static TLS") && !getenv("GLIBC_TUNABLES") && argv) {
      setenv("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=65536", 1);
      execv("/proc/self/exe", argv);
    }
    snprintf(je->why, sizeof(je->why), "%s", err ? err : "libjemalloc.so.2 not found");
    return false;
  }
  je->malloc = (void *(*)(size_t))dlsym(h, "malloc");
  je->free = (void (*)(void *))dlsym(h, "free");
  je->mallocx = (void *(*)(size_t, int))dlsym(h, "mallocx");
  je->dallocx = (void (*)(void *, int))dlsym(h, "dallocx");
  if (!je->malloc || !je->free || !je->mallocx || !je->dallocx) {
    snprintf(je->why, sizeof(je->why), "libjemalloc.so.2 lacks malloc/free/mallocx/dallocx");
    je->malloc = NULL;
    return false;
  }
  return true;
}
