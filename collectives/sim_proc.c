/* SPDX-License-Identifier: Apache-2.0 */
/* sim_proc.c - sim ranks as separate processes: how they find each other and
 * the shared memory they meet in.
 *
 * Note [Sim ranks as processes]: rank 0 listens on an abstract Unix socket
 * named by the id ("gca-comm-" and the id's first 16 bytes in hex; nothing
 * on disk to clean up), the other ranks connect (retrying until rank 0
 * listens or the timeout passes) and say their rank and the group's size.
 * Rank 0 checks them (a rank twice, a size that differs, a rank out of range
 * are refused with the reason sent back), and once every rank is there it
 * sends each one a memfd over the socket (SCM_RIGHTS); so every rank returns
 * from create only when all have joined, as NCCL's init does, and a rank that
 * never comes makes rank 0 tell the others which ranks are missing. Rank 0
 * maps the memory itself before it answers, so a failure there reaches every
 * rank with its reason; a rank that leaves before its answer fails rank 0,
 * refuses the ranks not yet answered and breaks the meeting for those that
 * were, so each learns it at its first collective instead of timing out. The
 * memfd holds the meeting place (gca__meet_t with a process-shared, robust
 * mutex: a process that dies holding it breaks the meeting instead of hanging
 * its peers), each rank's descriptor, and one staging area of chunk bytes per
 * rank. Collectives then run as for threads (sim_run.c), in rounds that move
 * at most a chunk per rank, with the same two barriers per round: the memory
 * a group needs does not grow with the collectives' size, as NCCL's own
 * buffers do not. Nothing else crosses processes: each process has its own
 * sim devices, and a rank's host function reads its input and writes its
 * output in its own process. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "coll_internal.h"

#define SHM_MAGIC   0x67636173686d3031ull
#define HELLO_MAGIC 0x67636831u

/* The head of the shared memory; descriptors and areas follow. */
typedef struct shm_head {
  uint64_t magic;
  int32_t nranks;
  uint32_t pad;
  uint64_t chunk, desc_off, areas_off, bytes;
  gca__meet_t m;
} shm_head_t;

typedef struct hello {
  uint32_t magic;
  int32_t nranks, rank;
  uint32_t pad;
  uint64_t chunk;
} hello_t;

typedef struct reply {
  int32_t status; /* gca_status_t: GCA_OK comes with the memfd */
  uint32_t pad;
  uint64_t bytes;
  char why[384];
} reply_t;

static size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

static socklen_t address_of(const gca_comm_id_t *id, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  int at = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "gca-comm-");
  for (int i = 0; i < 16; i++)
    at += snprintf(sa->sun_path + 1 + at, sizeof(sa->sun_path) - 1 - (size_t)at, "%02x",
                   id->bytes[i]);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)at);
}

/* Milliseconds left until dl (0 once past). */
static int ms_left(const struct timespec *dl) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  double ms = (double)(dl->tv_sec - now.tv_sec) * 1e3 + (double)(dl->tv_nsec - now.tv_nsec) / 1e6;
  return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms + 1;
}

/* Reads exactly len bytes before dl; false on end, error or timeout. */
static bool read_full(int fd, void *buf, size_t len, const struct timespec *dl) {
  size_t got = 0;
  while (got < len) {
    struct pollfd p = {fd, POLLIN, 0};
    int rc = poll(&p, 1, ms_left(dl));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc <= 0)
      return false;
    ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    got += (size_t)n;
  }
  return true;
}

/* Sends a reply, with fd attached when fd >= 0. */
static bool send_reply(int sock, const reply_t *r, int fd) {
  struct iovec iov = {(void *)r, sizeof(*r)};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    memset(&ctl, 0, sizeof(ctl));
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  ssize_t n;
  do
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)sizeof(*r);
}

/* The detail just set, less the "comm_create: " every message here opens
 * with (for a reason sent to the other ranks). */
static const char *detail_for_peers(void) {
  static const char prefix[] = "comm_create: ";
  const char *d = gca_last_error();
  return strncmp(d, prefix, sizeof(prefix) - 1) == 0 ? d + sizeof(prefix) - 1 : d;
}

/* Maps the shared memory of fd, bytes long, after checking that it is a
 * group's (a memfd shorter than announced would fault on first touch). */
static gca_status_t map_shared(int fd, size_t bytes, gca__proc_t **out) {
  struct stat sb = {0};
  if (fstat(fd, &sb) != 0 || bytes < sizeof(shm_head_t) || (uint64_t)sb.st_size < bytes)
    return gca__error(GCA_ERR_INVALID_STATE,
                      "comm_create: the shared memory is not a group's (%zu bytes announced, "
                      "%lld in it)",
                      bytes, (long long)sb.st_size);
  /* the fail point stands for a process out of address space */
  void *map = GCA_FAILPOINT("sim_comm_map")
                  ? (errno = ENOMEM, MAP_FAILED)
                  : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: mapping %zu bytes of shared memory: %s",
                      bytes, strerror(errno));
  shm_head_t *h = map;
  if (h->magic != SHM_MAGIC || h->bytes != bytes) {
    munmap(map, bytes);
    return gca__error(GCA_ERR_INVALID_STATE,
                      "comm_create: the shared memory is not a group's (it does not start with "
                      "a group's header)");
  }
  gca__proc_t *p = GCA_FAILPOINT("sim_comm_proc") ? NULL : calloc(1, sizeof(*p));
  if (!p) {
    munmap(map, bytes);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "comm_create: no host memory for a view of the shared memory");
  }
  *p = (gca__proc_t){.map = map,
                     .map_bytes = bytes,
                     .m = &h->m,
                     .desc = (gca__coll_desc_t *)((char *)map + h->desc_off),
                     .areas = (unsigned char *)map + h->areas_off,
                     .chunk = h->chunk};
  *out = p;
  return GCA_OK;
}

/* Rank 0: the shared memory, made and laid out. */
static gca_status_t make_shared(int nranks, size_t chunk, int *fd_out, size_t *bytes_out) {
  size_t desc_off = align_up(sizeof(shm_head_t), 64);
  size_t areas_off = align_up(desc_off + (size_t)nranks * sizeof(gca__coll_desc_t), 4096);
  size_t bytes = areas_off + (size_t)nranks * chunk;
  /* the fail point stands for a process out of memory or file descriptors */
  int fd = GCA_FAILPOINT("sim_comm_shared") ? (errno = ENOMEM, -1)
                                            : memfd_create("gca-comm", MFD_CLOEXEC);
  if (fd < 0)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: memfd_create: %s", strerror(errno));
  if (ftruncate(fd, (off_t)bytes) != 0) {
    int e = errno;
    close(fd);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: sizing %zu bytes of shared memory: %s",
                      bytes, strerror(e));
  }
  shm_head_t *h = GCA_FAILPOINT("sim_comm_map")
                      ? (errno = ENOMEM, MAP_FAILED)
                      : mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (h == MAP_FAILED) {
    int e = errno;
    close(fd);
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "comm_create: mapping the header of the shared memory: %s", strerror(e));
  }
  h->magic = SHM_MAGIC;
  h->nranks = nranks;
  h->chunk = chunk;
  h->desc_off = desc_off;
  h->areas_off = areas_off;
  h->bytes = bytes;
  gca__meet_init(&h->m, true);
  munmap(h, sizeof(*h));
  *fd_out = fd;
  *bytes_out = bytes;
  return GCA_OK;
}

/* Rank 0: waits for the others on the listening socket. */
static gca_status_t host_group(int ls, int nranks, const gca_comm_options_t *o, gca__proc_t **out) {
  struct timespec dl;
  gca__deadline_after(o->timeout_s, &dl);
  int *peer = GCA_FAILPOINT("sim_comm_peers") ? NULL : malloc((size_t)nranks * sizeof(int));
  if (!peer)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "comm_create: no host memory for rank 0's table of %d ranks", nranks);
  for (int r = 0; r < nranks; r++)
    peer[r] = -1;
  int joined = 1, fd = -1;
  size_t bytes = 0;
  gca_status_t st = make_shared(nranks, o->sim_chunk_bytes, &fd, &bytes);
  while (st == GCA_OK && joined < nranks) {
    struct pollfd p = {ls, POLLIN, 0};
    int rc = poll(&p, 1, ms_left(&dl));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0)
      break;
    int s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0)
      continue;
    hello_t h;
    reply_t no = {.status = GCA_ERR_INVALID_ARGUMENT};
    if (!read_full(s, &h, sizeof(h), &dl) || h.magic != HELLO_MAGIC)
      snprintf(no.why, sizeof(no.why), "rank 0 got no greeting it understands");
    else if (h.nranks != nranks)
      snprintf(no.why, sizeof(no.why), "nranks %d, but rank 0 made a communicator of %d ranks",
               h.nranks, nranks);
    else if (h.rank <= 0 || h.rank >= nranks || peer[h.rank] >= 0)
      snprintf(no.why, sizeof(no.why), "rank %d of this id has joined already", h.rank);
    else if (h.chunk != o->sim_chunk_bytes)
      snprintf(no.why, sizeof(no.why), "sim_chunk_bytes %llu, but rank 0 has %zu",
               (unsigned long long)h.chunk, o->sim_chunk_bytes);
    if (no.why[0]) {
      send_reply(s, &no, -1);
      close(s);
      continue;
    }
    peer[h.rank] = s;
    joined++;
  }
  reply_t yes = {.status = GCA_OK, .bytes = bytes};
  if (st == GCA_OK && joined < nranks) {
    char who[128] = "";
    size_t at = 0;
    for (int r = 1; r < nranks && at + 16 < sizeof(who); r++)
      if (peer[r] < 0)
        at += (size_t)snprintf(who + at, sizeof(who) - at, "%s%d", at ? ", " : "", r);
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "comm_create: rank 0 of %d: rank(s) %s did not join within %.3g s", nranks, who,
                    o->timeout_s);
    yes.status = st;
    snprintf(yes.why, sizeof(yes.why), "rank(s) %s did not join within %.3g s", who, o->timeout_s);
  } else if (st == GCA_OK) {
    st = yes.status = map_shared(fd, bytes, out);
    if (st != GCA_OK)
      snprintf(yes.why, sizeof(yes.why), "%s", detail_for_peers());
  }
  for (int r = 1; r < nranks; r++)
    if (peer[r] >= 0) {
      if (!send_reply(peer[r], &yes, yes.status == GCA_OK ? fd : -1) && yes.status == GCA_OK) {
        st = yes.status = gca__error(GCA_ERR_INVALID_STATE,
                                     "comm_create: rank %d left before the group formed", r);
        snprintf(yes.why, sizeof(yes.why), "rank %d left before the group formed", r);
        gca__meet_lock((*out)->m);
        gca__meet_break((*out)->m, yes.why);
        gca__meet_unlock((*out)->m);
        gca__proc_leave(*out);
        *out = NULL;
      }
      close(peer[r]);
    }
  if (fd >= 0)
    close(fd);
  free(peer);
  return st;
}

/* Rank > 0: connects to rank 0 (until it listens or the deadline). */
static gca_status_t join_group(const gca_comm_id_t *id, int nranks, int rank,
                               const gca_comm_options_t *o, gca__proc_t **out) {
  struct timespec dl;
  gca__deadline_after(o->timeout_s, &dl);
  struct sockaddr_un sa;
  socklen_t len = address_of(id, &sa);
  int s = -1;
  for (;;) {
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
      return gca__error(GCA_ERR_INVALID_STATE, "comm_create: rank %d of %d: socket: %s", rank,
                        nranks, strerror(errno));
    if (connect(s, (struct sockaddr *)&sa, len) == 0)
      break;
    int e = errno;
    close(s);
    if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN) || ms_left(&dl) == 0)
      return gca__error(GCA_ERR_INVALID_STATE,
                        "comm_create: rank %d of %d: rank 0 is not listening (%s) after %.3g s",
                        rank, nranks, strerror(e), o->timeout_s);
    struct timespec pause = {0, 2000000}; /* rank 0 not there yet: ask again shortly */
    nanosleep(&pause, NULL);
  }
  hello_t h = {HELLO_MAGIC, nranks, rank, 0, o->sim_chunk_bytes};
  reply_t r;
  int fd = -1, e = 0, rc = -1;
  bool sent = send(s, &h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h);
  if (!sent)
    e = errno;
  struct iovec iov = {&r, sizeof(r)};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct msghdr msg = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
  struct pollfd p = {s, POLLIN, 0};
  ssize_t n = -1;
  if (sent) {
    do
      rc = poll(&p, 1, ms_left(&dl));
    while (rc < 0 && errno == EINTR);
    if (rc > 0) {
      do
        n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
      while (n < 0 && errno == EINTR);
    }
    e = n < 0 ? errno : 0;
  }
  close(s);
  for (struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm; cm = CMSG_NXTHDR(&msg, cm))
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
      memcpy(&fd, CMSG_DATA(cm), sizeof(int));
  gca_status_t st = GCA_OK;
  if (sent && rc == 0)
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "comm_create: rank %d of %d: no answer from rank 0 within %.3g s", rank, nranks,
                    o->timeout_s);
  else if (n > 0 && n < (ssize_t)sizeof(r))
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "comm_create: rank %d of %d: rank 0's answer was cut short (%zd of %zu bytes)",
                    rank, nranks, n, sizeof(r));
  else if (n != (ssize_t)sizeof(r))
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "comm_create: rank %d of %d: rank 0 closed the connection without answering "
                    "(%s)",
                    rank, nranks, e ? strerror(e) : "end of stream");
  else if (r.status != GCA_OK)
    st = gca__error((gca_status_t)r.status, "comm_create: rank %d of %d: rank 0 refused: %.384s",
                    rank, nranks, r.why);
  else if (fd < 0)
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "comm_create: rank %d of %d: rank 0 sent no shared memory", rank, nranks);
  else
    st = map_shared(fd, r.bytes, out);
  if (fd >= 0)
    close(fd);
  return st;
}

gca_status_t gca__proc_join(const gca_comm_id_t *id, int nranks, int rank,
                            const gca_comm_options_t *o, gca__proc_t **out) {
  *out = NULL;
  if (rank != 0)
    return join_group(id, nranks, rank, o, out);
  struct sockaddr_un sa;
  socklen_t len = address_of(id, &sa);
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0)
    return gca__error(GCA_ERR_INVALID_STATE, "comm_create: rank 0 of %d: socket: %s", nranks,
                      strerror(errno));
  /* the fail points stand for the kernel out of memory for the socket */
  if ((GCA_FAILPOINT("sim_comm_bind") ? (errno = ENOMEM, -1)
                                      : bind(ls, (struct sockaddr *)&sa, len)) != 0) {
    int e = errno;
    close(ls);
    return gca__error(e == EADDRINUSE ? GCA_ERR_INVALID_ARGUMENT : GCA_ERR_INVALID_STATE,
                      "comm_create: rank 0 of this id %s (binding its socket: %s)",
                      e == EADDRINUSE ? "has joined already" : "cannot listen", strerror(e));
  }
  gca_status_t st =
      (GCA_FAILPOINT("sim_comm_listen") ? (errno = ENOBUFS, -1)
                                        : listen(ls, nranks < 128 ? nranks : 128)) == 0
          ? host_group(ls, nranks, o, out)
          : gca__error(GCA_ERR_INVALID_STATE, "comm_create: rank 0 of %d: listen: %s", nranks,
                       strerror(errno));
  close(ls);
  return st;
}

void gca__proc_leave(gca__proc_t *p) {
  munmap(p->map, p->map_bytes);
  free(p);
}
