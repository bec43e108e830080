/* SPDX-License-Identifier: Apache-2.0 */
/* host_je.c - jemalloc, loaded at run time for the pinned host allocator.
 *
 * Note [Loading jemalloc]: libgca is LD_PRELOADed into unmodified programs
 * and dlopen()ed by Python (PyTorch's pluggable allocator), so it must not
 * change the program's malloc. Debian's libjemalloc.so.2 exports unprefixed
 * malloc/free: linked into libgca it could take over the program's malloc
 * (or at least join its symbol search list). So the build uses jemalloc's
 * header only (extent_hooks_t, MALLOCX_* through pkg-config), and the first
 * gca_host_* call does dlopen("libjemalloc.so.2", RTLD_LOCAL | RTLD_NOW) and
 * dlsym()s the non-standard API (mallocx, dallocx, sdallocx, nallocx,
 * sallocx, mallctl); RTLD_LOCAL keeps its malloc out of the global scope.
 * GCA_JEMALLOC_LIBRARY names another build.
 *
 * The catch: Debian's jemalloc keeps its thread state in initial-exec TLS
 * (2.6 KiB, DF_STATIC_TLS), and glibc lets a library dlopen()ed after start
 * take only 512 bytes of the static TLS surplus by default ("cannot allocate
 * memory in static TLS block"). It loads when it is already in the process
 * (the preload shim and gca-train's programs list it as a dependency: loaded
 * at start, after libc in the search order, so malloc stays glibc's; a
 * program that loads a CUDA driver first can leave no surplus at all, as
 * gca-train's did on an H200), when glibc is given more room
 * (GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384), or when
 * GCA_JEMALLOC_LIBRARY names a jemalloc built with --disable-initial-exec-tls.
 * Otherwise gca_host_* fail with GCA_ERR_NOT_SUPPORTED quoting dlerror() and
 * these three ways out; nothing else in gca needs jemalloc.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "host_internal.h"

#define DEFAULT_LIBRARY "libjemalloc.so.2"

static struct {
  pthread_once_t once;
  gca__je_t je;
  bool ok;
  char why[768];
} state = {.once = PTHREAD_ONCE_INIT};

static void load(void) {
  const char *name = gca__getenv("GCA_JEMALLOC_LIBRARY");
  if (!name || !*name)
    name = DEFAULT_LIBRARY;
  void *h = dlopen(name, RTLD_LOCAL | RTLD_NOW);
  if (!h) {
    const char *e = dlerror();
    snprintf(state.why, sizeof(state.why),
             "jemalloc could not be loaded (%s): %s. The pinned host allocator needs "
             "libjemalloc.so.2 (Debian: apt-get install libjemalloc2); when the error is about "
             "static TLS, run under the gca preload shim, raise "
             "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384, or set GCA_JEMALLOC_LIBRARY "
             "to a jemalloc built with --disable-initial-exec-tls (Note [Loading jemalloc])",
             name, e ? e : "unknown error");
    return;
  }
  static const struct {
    const char *name;
    size_t off;
  } syms[] = {
      {"mallocx", offsetof(gca__je_t, mallocx)},   {"dallocx", offsetof(gca__je_t, dallocx)},
      {"sdallocx", offsetof(gca__je_t, sdallocx)}, {"nallocx", offsetof(gca__je_t, nallocx)},
      {"sallocx", offsetof(gca__je_t, sallocx)},   {"mallctl", offsetof(gca__je_t, mallctl)},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(syms); i++) {
    void *f = dlsym(h, syms[i].name);
    if (!f) {
      snprintf(state.why, sizeof(state.why),
               "%s has no %s: not a jemalloc 5 with its unprefixed non-standard API", name,
               syms[i].name);
      dlclose(h);
      return;
    }
    memcpy((char *)&state.je + syms[i].off, &f, sizeof(f));
  }
  unsigned narenas = 0;
  size_t len = sizeof(narenas);
  if (state.je.mallctl("arenas.narenas", &narenas, &len, NULL, 0) != 0) {
    snprintf(state.why, sizeof(state.why), "%s: mallctl(\"arenas.narenas\") failed", name);
    return;
  }
  state.ok = true;
}

const gca__je_t *gca__je_get(const char *fn) {
  pthread_once(&state.once, load);
  if (GCA_UNLIKELY(!state.ok)) {
    gca__error(GCA_ERR_NOT_SUPPORTED, "%s: %s", fn, state.why);
    return NULL;
  }
  return &state.je;
}
