/* SPDX-License-Identifier: Apache-2.0 */
/* nccl.c - the NCCL backend's library: libnccl loaded at run time
 * (GCA_NCCL_LIBRARY, else "libnccl.so.2"), the few types and functions used
 * declared here (the build never needs nccl.h), the version checked, and
 * NCCL's results turned into statuses that carry its own strings.
 *
 * The one idea: every NCCL call goes through nccl_call-style checks that
 * name the gca call, the NCCL function, NCCL's error string and its last
 * error, so a failure on a GPU reads as NCCL would report it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "coll_internal.h"

/* Values of NCCL's enums and its version encoding (nccl.h, 2.x). */
enum { NCCL_SUCCESS = 0 };
enum {
  NCCL_INT8 = 0,
  NCCL_UINT8 = 1,
  NCCL_INT32 = 2,
  NCCL_INT64 = 4,
  NCCL_FLOAT16 = 6,
  NCCL_FLOAT32 = 7,
  NCCL_FLOAT64 = 8,
  NCCL_BFLOAT16 = 9,
};
#define NCCL_VERSION_CODE(x, y, z) ((x)*10000 + (y)*100 + (z))
#define NCCL_MIN_VERSION           NCCL_VERSION_CODE(2, 10, 0) /* ncclAvg */
#define NCCL_REGISTER_VERSION      NCCL_VERSION_CODE(2, 19, 0)

typedef struct nccl_unique_id {
  char internal[GCA_COMM_ID_BYTES];
} nccl_unique_id_t;

static struct {
  pthread_once_t once;
  gca_status_t st;
  char why[384];
  int version;
  int (*GetVersion)(int *);
  int (*GetUniqueId)(nccl_unique_id_t *);
  int (*CommInitRank)(void **, int, nccl_unique_id_t, int);
  int (*CommInitAll)(void **, int, const int *);
  int (*CommDestroy)(void *);
  int (*CommAbort)(void *);
  int (*CommCount)(const void *, int *);
  int (*CommUserRank)(const void *, int *);
  int (*CommGetAsyncError)(void *, int *);
  const char *(*GetErrorString)(int);
  const char *(*GetLastError)(void *); /* 2.13 and later */
  int (*AllGather)(const void *, void *, size_t, int, void *, void *);
  int (*ReduceScatter)(const void *, void *, size_t, int, int, void *, void *);
  int (*AllReduce)(const void *, void *, size_t, int, int, void *, void *);
  int (*GroupStart)(void);
  int (*GroupEnd)(void);
  int (*CommRegister)(const void *, void *, size_t, void **); /* 2.19 and later */
  int (*CommDeregister)(const void *, void *);
} nccl = {.once = PTHREAD_ONCE_INIT};

static void load(void) {
  const char *path = gca__getenv("GCA_NCCL_LIBRARY");
  if (!path || !*path)
    path = "libnccl.so.2";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    nccl.st = GCA_ERR_NOT_SUPPORTED;
    snprintf(nccl.why, sizeof(nccl.why), "cannot load the NCCL library %s: %s", path, dlerror());
    return;
  }
  static const struct {
    const char *name;
    size_t off;
    bool required;
  } syms[] = {
#define SYM(n, req) {"nccl" #n, offsetof(__typeof__(nccl), n), req}
      SYM(GetVersion, true),     SYM(GetUniqueId, true),   SYM(CommInitRank, true),
      SYM(CommInitAll, true),    SYM(CommDestroy, true),   SYM(CommAbort, true),
      SYM(CommCount, true),      SYM(CommUserRank, true),  SYM(CommGetAsyncError, true),
      SYM(GetErrorString, true), SYM(GetLastError, false), SYM(AllGather, true),
      SYM(ReduceScatter, true),  SYM(AllReduce, true),     SYM(GroupStart, true),
      SYM(GroupEnd, true),       SYM(CommRegister, false), SYM(CommDeregister, false),
#undef SYM
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    void *f = dlsym(lib, syms[i].name);
    if (!f && syms[i].required) {
      nccl.st = GCA_ERR_NOT_SUPPORTED;
      snprintf(nccl.why, sizeof(nccl.why), "%s has no %s", path, syms[i].name);
      dlclose(lib);
      return;
    }
    memcpy((char *)&nccl + syms[i].off, &f, sizeof(f));
  }
  int v = 0;
  if (nccl.GetVersion(&v) != NCCL_SUCCESS || v < NCCL_MIN_VERSION) {
    nccl.st = GCA_ERR_NOT_SUPPORTED;
    snprintf(nccl.why, sizeof(nccl.why),
             "NCCL %d.%d.%d (%s) is older than 2.10, the oldest supported", v / 10000,
             v / 100 % 100, v % 100, path);
    dlclose(lib);
    return;
  }
  nccl.version = v;
  GCA_LOG_INFO("collectives: NCCL %d.%d.%d from %s; buffer registration %s; windows off (not "
               "built)",
               v / 10000, v / 100 % 100, v % 100, path,
               v >= NCCL_REGISTER_VERSION && nccl.CommRegister ? "on" : "off (needs 2.19)");
}

gca_status_t gca__nccl_load(void) {
  pthread_once(&nccl.once, load);
  if (nccl.st != GCA_OK)
    return gca__error(nccl.st, "nccl: %s", nccl.why);
  return GCA_OK;
}

/* A failed NCCL call as a status: NCCL's string and its last error. */
static gca_status_t failed(const char *fn, const char *call, int r, void *comm) {
  const char *last = nccl.GetLastError ? nccl.GetLastError(comm) : NULL;
  return gca__error(GCA_ERR_DRIVER, "%s: %s failed: %s (%d)%s%s", fn, call,
                    nccl.GetErrorString ? nccl.GetErrorString(r) : "?", r,
                    last && *last ? ": " : "", last && *last ? last : "");
}

#define NCCL_CHECK(fn, call, comm, expr)       \
  do {                                         \
    int r_ = (expr);                           \
    if (r_ != NCCL_SUCCESS)                    \
      return failed((fn), (call), r_, (comm)); \
  } while (0)

gca_status_t gca__nccl_unique_id(gca_comm_id_t *id) {
  GCA_CHECK(gca__nccl_load());
  nccl_unique_id_t u;
  NCCL_CHECK("comm_get_unique_id", "ncclGetUniqueId", NULL, nccl.GetUniqueId(&u));
  memcpy(id->bytes, u.internal, GCA_COMM_ID_BYTES);
  return GCA_OK;
}

gca_status_t gca__nccl_init_rank(const gca_comm_id_t *id, int nranks, int rank, void **out) {
  nccl_unique_id_t u;
  memcpy(u.internal, id->bytes, GCA_COMM_ID_BYTES);
  NCCL_CHECK("comm_create", "ncclCommInitRank", NULL, nccl.CommInitRank(out, nranks, u, rank));
  return GCA_OK;
}

gca_status_t gca__nccl_init_all(int nranks, const int *devices, void **out) {
  NCCL_CHECK("comm_create_all", "ncclCommInitAll", NULL, nccl.CommInitAll(out, nranks, devices));
  return GCA_OK;
}

gca_status_t gca__nccl_describe(void *comm, int *rank, int *nranks) {
  NCCL_CHECK("comm_wrap_nccl", "ncclCommUserRank", comm, nccl.CommUserRank(comm, rank));
  NCCL_CHECK("comm_wrap_nccl", "ncclCommCount", comm, nccl.CommCount(comm, nranks));
  return GCA_OK;
}

gca_status_t gca__nccl_destroy(void *comm, bool abort) {
  if (abort)
    NCCL_CHECK("comm_abort", "ncclCommAbort", NULL, nccl.CommAbort(comm));
  else
    NCCL_CHECK("comm_destroy", "ncclCommDestroy", NULL, nccl.CommDestroy(comm));
  return GCA_OK;
}

gca_status_t gca__nccl_async_error(void *comm) {
  int err = NCCL_SUCCESS;
  NCCL_CHECK("comm_async_error", "ncclCommGetAsyncError", comm, nccl.CommGetAsyncError(comm, &err));
  if (err != NCCL_SUCCESS)
    return failed("comm_async_error", "a collective", err, comm);
  return GCA_OK;
}

static int dtype_of(gca_dtype_t t) {
  static const int map[] = {[GCA_DTYPE_F32] = NCCL_FLOAT32,   [GCA_DTYPE_F16] = NCCL_FLOAT16,
                            [GCA_DTYPE_BF16] = NCCL_BFLOAT16, [GCA_DTYPE_F64] = NCCL_FLOAT64,
                            [GCA_DTYPE_I32] = NCCL_INT32,     [GCA_DTYPE_I64] = NCCL_INT64,
                            [GCA_DTYPE_U8] = NCCL_UINT8};
  return map[t];
}

/* gca_reduce_op_t has ncclRedOp_t's values (sum, prod, max, min, avg). */
gca_status_t gca__nccl_issue(const char *fn, gca__coll_kind_t kind, const void *send, void *recv,
                             size_t count, gca_dtype_t dtype, gca_reduce_op_t op, void *comm,
                             gca_stream_t stream) {
  switch (kind) {
  case GCA__ALL_GATHER:
    NCCL_CHECK(fn, "ncclAllGather", comm,
               nccl.AllGather(send, recv, count, dtype_of(dtype), comm, stream));
    break;
  case GCA__REDUCE_SCATTER:
    NCCL_CHECK(fn, "ncclReduceScatter", comm,
               nccl.ReduceScatter(send, recv, count, dtype_of(dtype), (int)op, comm, stream));
    break;
  case GCA__ALL_REDUCE:
    NCCL_CHECK(fn, "ncclAllReduce", comm,
               nccl.AllReduce(send, recv, count, dtype_of(dtype), (int)op, comm, stream));
    break;
  }
  return GCA_OK;
}

gca_status_t gca__nccl_group(bool start) {
  if (gca__nccl_load() != GCA_OK) {
    gca_clear_last_error();
    return GCA_OK; /* no NCCL: nothing to bracket */
  }
  if (start)
    NCCL_CHECK("group_start", "ncclGroupStart", NULL, nccl.GroupStart());
  else
    NCCL_CHECK("group_end", "ncclGroupEnd", NULL, nccl.GroupEnd());
  return GCA_OK;
}

gca_status_t gca__nccl_register(void *comm, void *ptr, size_t bytes, void **handle) {
  if (nccl.version < NCCL_REGISTER_VERSION || !nccl.CommRegister || !nccl.CommDeregister)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "comm_register: user buffer registration needs NCCL 2.19 or later (this is "
                      "%d.%d.%d)",
                      nccl.version / 10000, nccl.version / 100 % 100, nccl.version % 100);
  NCCL_CHECK("comm_register", "ncclCommRegister", comm,
             nccl.CommRegister(comm, ptr, bytes, handle));
  return GCA_OK;
}

gca_status_t gca__nccl_deregister(void *comm, void *handle) {
  NCCL_CHECK("comm_deregister", "ncclCommDeregister", comm, nccl.CommDeregister(comm, handle));
  return GCA_OK;
}
