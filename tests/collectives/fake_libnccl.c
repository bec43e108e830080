/* SPDX-License-Identifier: Apache-2.0 */
/* fake_libnccl.c - a pretend libnccl for the NCCL backend's tests: the
 * functions gca calls, with NCCL's signatures as declared in nccl.c, keeping
 * counts and the last collective's arguments for the test to read
 * (fake_nccl_*), and failing on request:
 *   FAKE_NCCL_VERSION   the version ncclGetVersion reports (default 22105)
 *   FAKE_NCCL_FAIL      a function name (e.g. ncclAllGather) that returns
 *                       ncclInternalError, with a last error saying so
 *   FAKE_NCCL_ASYNC     set: ncclCommGetAsyncError reports ncclSystemError
 * No GPU memory is touched. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Exported despite the project's -fvisibility=hidden; declared before their
 * definitions, as -Wmissing-prototypes wants. */
#define EXPORT __attribute__((visibility("default")))

typedef struct fake_comm {
  int nranks, rank;
} fake_comm_t;

typedef struct fake_id {
  char internal[128];
} fake_id_t;

EXPORT const char *fake_nccl_last(size_t *count, int *dtype, int *op, const void **send,
                                  void **recv, void **stream);
EXPORT int ncclGetVersion(int *v);
EXPORT int ncclGetUniqueId(fake_id_t *id);
EXPORT int ncclCommInitRank(void **comm, int nranks, fake_id_t id, int rank);
EXPORT int ncclCommInitAll(void **comms, int n, const int *devs);
EXPORT int ncclCommDestroy(void *c);
EXPORT int ncclCommAbort(void *c);
EXPORT int ncclCommCount(const void *c, int *n);
EXPORT int ncclCommUserRank(const void *c, int *r);
EXPORT int ncclCommGetAsyncError(void *c, int *err);
EXPORT const char *ncclGetErrorString(int r);
EXPORT const char *ncclGetLastError(void *c);
EXPORT int ncclAllGather(const void *s, void *r, size_t n, int t, void *c, void *st);
EXPORT int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *c, void *st);
EXPORT int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *c, void *st);
EXPORT int ncclGroupStart(void);
EXPORT int ncclGroupEnd(void);
EXPORT int ncclCommRegister(const void *c, void *buf, size_t size, void **handle);
EXPORT int ncclCommDeregister(const void *c, void *handle);
EXPORT int fake_nccl_calls(const char *what);

static int calls_init, calls_destroy, calls_abort, calls_register, calls_deregister,
    calls_group_start, calls_group_end, calls_coll;
static char last_call[64], last_error[256];
static size_t last_count;
static int last_dtype, last_op;
static const void *last_send;
static void *last_recv, *last_stream;

static int fail(const char *fn) {
  const char *f = getenv("FAKE_NCCL_FAIL");
  if (f && strcmp(f, fn) == 0) {
    strcpy(last_error, "fake: injected failure in ");
    strcat(last_error, fn);
    return 3; /* ncclInternalError */
  }
  return 0;
}

EXPORT int ncclGetVersion(int *v) {
  const char *s = getenv("FAKE_NCCL_VERSION");
  *v = s ? atoi(s) : 22105;
  return 0;
}

EXPORT int ncclGetUniqueId(fake_id_t *id) {
  memset(id, 0, sizeof(*id));
  strcpy(id->internal, "fake-nccl-id");
  return fail("ncclGetUniqueId");
}

EXPORT int ncclCommInitRank(void **comm, int nranks, fake_id_t id, int rank) {
  (void)id;
  if (fail("ncclCommInitRank"))
    return 3;
  fake_comm_t *c = malloc(sizeof(*c));
  c->nranks = nranks;
  c->rank = rank;
  *comm = c;
  calls_init++;
  return 0;
}

EXPORT int ncclCommInitAll(void **comms, int n, const int *devs) {
  (void)devs;
  if (fail("ncclCommInitAll"))
    return 3;
  for (int i = 0; i < n; i++) {
    fake_comm_t *c = malloc(sizeof(*c));
    c->nranks = n;
    c->rank = i;
    comms[i] = c;
    calls_init++;
  }
  return 0;
}

EXPORT int ncclCommDestroy(void *c) {
  calls_destroy++;
  free(c);
  return 0;
}

EXPORT int ncclCommAbort(void *c) {
  calls_abort++;
  free(c);
  return 0;
}

EXPORT int ncclCommCount(const void *c, int *n) {
  *n = ((const fake_comm_t *)c)->nranks;
  return 0;
}

EXPORT int ncclCommUserRank(const void *c, int *r) {
  *r = ((const fake_comm_t *)c)->rank;
  return 0;
}

EXPORT int ncclCommGetAsyncError(void *c, int *err) {
  (void)c;
  *err = getenv("FAKE_NCCL_ASYNC") ? 2 : 0; /* ncclSystemError */
  if (*err)
    strcpy(last_error, "fake: a peer went away");
  return 0;
}

EXPORT const char *ncclGetErrorString(int r) {
  switch (r) {
  case 0:
    return "no error";
  case 2:
    return "unhandled system error";
  case 3:
    return "internal error";
  default:
    return "unknown result code";
  }
}

EXPORT const char *ncclGetLastError(void *c) {
  (void)c;
  return last_error;
}

static int coll(const char *fn, const void *s, void *r, size_t count, int dtype, int op, void *st) {
  if (fail(fn))
    return 3;
  strcpy(last_call, fn);
  last_send = s;
  last_recv = r;
  last_count = count;
  last_dtype = dtype;
  last_op = op;
  last_stream = st;
  calls_coll++;
  return 0;
}

EXPORT int ncclAllGather(const void *s, void *r, size_t n, int t, void *c, void *st) {
  (void)c;
  return coll("ncclAllGather", s, r, n, t, -1, st);
}

EXPORT int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
  (void)c;
  return coll("ncclReduceScatter", s, r, n, t, op, st);
}

EXPORT int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
  (void)c;
  return coll("ncclAllReduce", s, r, n, t, op, st);
}

EXPORT int ncclGroupStart(void) {
  calls_group_start++;
  return 0;
}

EXPORT int ncclGroupEnd(void) {
  calls_group_end++;
  return 0;
}

EXPORT int ncclCommRegister(const void *c, void *buf, size_t size, void **handle) {
  (void)c;
  (void)size;
  if (fail("ncclCommRegister"))
    return 3;
  calls_register++;
  *handle = buf;
  return 0;
}

EXPORT int ncclCommDeregister(const void *c, void *handle) {
  (void)c;
  (void)handle;
  calls_deregister++;
  return 0;
}

/* ---- for the test ---- */

EXPORT int fake_nccl_calls(const char *what) {
  if (strcmp(what, "init") == 0)
    return calls_init;
  if (strcmp(what, "destroy") == 0)
    return calls_destroy;
  if (strcmp(what, "abort") == 0)
    return calls_abort;
  if (strcmp(what, "register") == 0)
    return calls_register;
  if (strcmp(what, "deregister") == 0)
    return calls_deregister;
  if (strcmp(what, "group_start") == 0)
    return calls_group_start;
  if (strcmp(what, "group_end") == 0)
    return calls_group_end;
  return calls_coll;
}

EXPORT const char *fake_nccl_last(size_t *count, int *dtype, int *op, const void **send,
                                  void **recv, void **stream) {
  *count = last_count;
  *dtype = last_dtype;
  *op = last_op;
  *send = last_send;
  *recv = last_recv;
  *stream = last_stream;
  return last_call;
}
