/* SPDX-License-Identifier: Apache-2.0 */
/* cudart_user.c - an ordinary CUDA runtime program, linked against libcudart,
 * that the preload tests run under LD_PRELOAD=libgca_preload.so. It knows
 * nothing of gca: whatever serves its calls must behave as the runtime does.
 *
 * Modes (argv[1]):
 *   stress [ops] [seed]  thousands of cudaMalloc/cudaMallocAsync/cudaFree/
 *                        cudaFreeAsync calls over two streams; every live block
 *                        is stamped with its own byte (cudaMemset, plus a tag
 *                        written directly on sim) and checked (copied back)
 *                        before it is freed. Prints the calls it made.
 *   foreign              frees pointers the allocator never handed out.
 *   errors               an allocation larger than the device, then the
 *                        injected faults the test sets in GCA_SIM_FAULTS.
 *   ctor                 checks the allocation made by ctor_lib's constructor.
 *   driver               the driver API's allocation entry points, looked up
 *                        by name (the program does not link libcuda).
 *   streams              memory allocated on a stream the program then destroys
 *                        (cudaStreamDestroy, cuStreamDestroy) is released
 *                        later: 600 MiB on each, freed, the streams destroyed,
 *                        then 600 MiB on the legacy stream, which on a 1 GiB
 *                        sim device fits only once those cached segments go.
 *   host                 pinned host memory: cudaHostAlloc / cudaMallocHost /
 *                        cudaFreeHost, cudaHostRegister / Unregister and the
 *                        driver's cuMemHostAlloc / cuMemFreeHost, stamped
 *                        blocks copied to the device and back; then checks
 *                        that malloc is still glibc's (dladdr).
 *   captures             (cuda) a stream holding cached memory is destroyed,
 *                        and a block recorded on another stream is freed,
 *                        while a third stream captures in global mode: the
 *                        capture still ends with a graph (gca's waits and
 *                        queries kept clear of it, Note [Captures under the
 *                        shim], tools/preload/capture.c).
 * Exit status 0 when everything behaved as the runtime documents, 1 otherwise
 * (the first mismatch is printed), 77 when no device is usable.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

int preload_ctor_result(void);

#define CHECK(call)                                                                     \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "cudart_user: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call, \
              cudaGetErrorName(e_), cudaGetErrorString(e_));                            \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define EXPECT(cond, ...)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "cudart_user: %s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                    \
      fprintf(stderr, "\n");                                                           \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* Whether a malloc defined in `lib` is the program's own: glibc's, or a
 * sanitizer runtime's (libasan, libtsan interpose malloc); never jemalloc's. */
static bool malloc_is_the_programs(const char *lib) {
  return !strstr(lib, "jemalloc") &&
         (strstr(lib, "libc.so") || strstr(lib, "libasan") || strstr(lib, "libtsan"));
}

static bool on_sim;
static uint64_t rng_state;
static int n_malloc, n_malloc_async, n_free, n_free_async;

static uint64_t next_rand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

typedef struct live_block {
  uint8_t *ptr; /* NULL when the slot is empty */
  size_t size;
  uint8_t stamp;
  uint64_t tag; /* written at ptr[0..8) directly on sim when size >= 8 */
  bool async;   /* cudaMallocAsync on streams[stream] */
  int stream;
} live_block_t;

#define SLOTS  48
#define WINDOW 4096

static cudaStream_t streams[2];

static size_t pick_size(void) {
  uint64_t r = next_rand() % 100;
  if (r < 60)
    return 1 + next_rand() % 4096;
  if (r < 92)
    return 4096 + next_rand() % (256 << 10);
  return (256 << 10) + next_rand() % (4 << 20);
}

/* Copies [off, off+len) of the block back (on its stream) and checks it. */
static void check_window(const live_block_t *b, size_t off, size_t len, uint8_t *host) {
  if (b->async) {
    CHECK(cudaMemcpyAsync(host, b->ptr + off, len, cudaMemcpyDeviceToHost, streams[b->stream]));
    CHECK(cudaStreamSynchronize(streams[b->stream]));
  } else {
    CHECK(cudaMemcpy(host, b->ptr + off, len, cudaMemcpyDeviceToHost));
  }
  for (size_t i = 0; i < len; i++) {
    size_t at = off + i;
    uint8_t want = b->stamp;
    if (on_sim && b->size >= 8 && at < 8)
      want = (uint8_t)(b->tag >> (8 * at));
    EXPECT(host[i] == want, "block %p (%zu bytes) byte %zu is 0x%02x, stamped 0x%02x",
           (void *)b->ptr, b->size, at, host[i], want);
  }
}

static void check_block(const live_block_t *b, uint8_t *host) {
  size_t len = b->size < WINDOW ? b->size : WINDOW;
  check_window(b, 0, len, host);
  if (b->size > WINDOW) {
    check_window(b, b->size / 2 - WINDOW / 2, WINDOW, host);
    check_window(b, b->size - WINDOW, WINDOW, host);
  }
}

static void allocate(live_block_t *b, uint64_t i) {
  b->size = pick_size();
  b->stamp = (uint8_t)(1 + i % 251);
  b->tag = 0x6763610000000000ull | i;
  b->async = next_rand() % 2;
  b->stream = (int)(next_rand() % 2);
  void *p = NULL;
  if (b->async) {
    CHECK(cudaMallocAsync(&p, b->size, streams[b->stream]));
    n_malloc_async++;
    EXPECT(p != NULL, "cudaMallocAsync(%zu) gave NULL", b->size);
    CHECK(cudaMemsetAsync(p, b->stamp, b->size, streams[b->stream]));
    if (on_sim)
      CHECK(cudaStreamSynchronize(streams[b->stream]));
  } else {
    CHECK(cudaMalloc(&p, b->size));
    n_malloc++;
    EXPECT(p != NULL, "cudaMalloc(%zu) gave NULL", b->size);
    CHECK(cudaMemset(p, b->stamp, b->size));
    if (on_sim)
      CHECK(cudaDeviceSynchronize());
  }
  b->ptr = p;
  if (on_sim && b->size >= 8)
    memcpy(b->ptr, &b->tag, 8); /* sim device memory is host memory */
}

static void release(live_block_t *b, uint8_t *host) {
  check_block(b, host);
  if (b->async) {
    /* Now and then freed on the other stream: ordered after that stream's work. */
    int s = next_rand() % 8 == 0 ? 1 - b->stream : b->stream;
    CHECK(cudaFreeAsync(b->ptr, streams[s]));
    n_free_async++;
  } else {
    CHECK(cudaFree(b->ptr));
    n_free++;
  }
  b->ptr = NULL;
}

static int run_stress(int ops, uint64_t seed) {
  rng_state = seed ? seed : 1;
  printf("cudart_user: stress, %d operations, seed %" PRIu64 "\n", ops, seed);
  CHECK(cudaStreamCreate(&streams[0]));
  CHECK(cudaStreamCreate(&streams[1]));
  static live_block_t slots[SLOTS];
  static uint8_t host[WINDOW];
  size_t free_busy = 0, total = 0;
  for (int i = 0; i < ops; i++) {
    live_block_t *b = &slots[next_rand() % SLOTS];
    if (b->ptr)
      release(b, host);
    else
      allocate(b, (uint64_t)i);
    if (i == ops / 2)
      CHECK(cudaMemGetInfo(&free_busy, &total));
  }
  for (int i = 0; i < SLOTS; i++)
    if (slots[i].ptr)
      release(&slots[i], host);
  CHECK(cudaStreamSynchronize(streams[0]));
  CHECK(cudaStreamSynchronize(streams[1]));
  size_t free_idle = 0, total2 = 0;
  CHECK(cudaMemGetInfo(&free_idle, &total2));
  EXPECT(total > 0 && total2 == total && free_busy <= total && free_idle <= total,
         "cudaMemGetInfo: free %zu / %zu while busy, %zu / %zu when idle", free_busy, total,
         free_idle, total2);
  EXPECT(free_idle >= free_busy, "cached memory counts as free: idle %zu < busy %zu", free_idle,
         free_busy);
  CHECK(cudaStreamDestroy(streams[0]));
  CHECK(cudaStreamDestroy(streams[1]));
  CHECK(cudaGetLastError());
  printf("cudart_user: ok cudaMalloc=%d cudaMallocAsync=%d cudaFree=%d cudaFreeAsync=%d\n",
         n_malloc, n_malloc_async, n_free, n_free_async);
  return 0;
}

static int run_foreign(void) {
  static uint64_t not_device_memory[4];
  void *foreign = &not_device_memory[1];
  printf("cudart_user: foreign pointer %p\n", foreign);
  cudaError_t e = cudaFree(foreign);
  EXPECT(e == cudaErrorInvalidValue, "cudaFree(foreign) gave %s", cudaGetErrorName(e));
  EXPECT(cudaPeekAtLastError() == cudaErrorInvalidValue, "peek keeps the error");
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "get returns the error");
  EXPECT(cudaGetLastError() == cudaSuccess, "get resets the error");
  e = cudaFreeAsync(foreign, NULL);
  EXPECT(e == cudaErrorInvalidValue, "cudaFreeAsync(foreign) gave %s", cudaGetErrorName(e));
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "cudaFreeAsync set the last error");
  EXPECT(strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0,
         "error name");
  EXPECT(strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument") == 0,
         "error string");

  /* The allocator is intact: allocate, stamp, read back, free; then a double free. */
  void *p = NULL;
  uint8_t back[256];
  CHECK(cudaMalloc(&p, 4096));
  CHECK(cudaMemset(p, 0x3c, 4096));
  CHECK(cudaMemcpy(back, p, sizeof(back), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < sizeof(back); i++)
    EXPECT(back[i] == 0x3c, "byte %zu is 0x%02x", i, back[i]);
  CHECK(cudaFree(p));
  e = cudaFree(p);
  EXPECT(e == cudaErrorInvalidValue, "double cudaFree gave %s", cudaGetErrorName(e));
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "double free set the last error");
  CHECK(cudaFree(NULL));
  CHECK(cudaGetLastError());
  printf("cudart_user: foreign ok\n");
  return 0;
}

static int run_errors(void) {
  size_t free_b = 0, total = 0;
  CHECK(cudaMemGetInfo(&free_b, &total));
  void *p = (void *)0x1;
  cudaError_t e = cudaMalloc(&p, total + ((size_t)1 << 30));
  EXPECT(e == cudaErrorMemoryAllocation, "oversized cudaMalloc gave %s", cudaGetErrorName(e));
  EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation, "the OOM is the last error");
  EXPECT(cudaGetLastError() == cudaSuccess, "and is reset");
  e = cudaMalloc(NULL, 16);
  EXPECT(e == cudaErrorInvalidValue, "cudaMalloc(NULL) gave %s", cudaGetErrorName(e));
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "cudaMalloc(NULL) set the last error");

  /* GCA_SIM_FAULTS makes the first stream creation and the first memset fail. */
  cudaStream_t s = NULL;
  e = cudaStreamCreate(&s);
  EXPECT(e != cudaSuccess, "the injected stream_create fault surfaced");
  EXPECT(cudaGetLastError() == e, "the failure is the last error");
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMalloc(&p, 1 << 20));
  e = cudaMemsetAsync(p, 0x11, 1 << 20, s);
  EXPECT(e != cudaSuccess, "the injected memset fault surfaced");
  EXPECT(strlen(cudaGetErrorString(e)) > 0, "it has a description");
  EXPECT(cudaGetLastError() == e, "the memset failure is the last error");
  CHECK(cudaMemsetAsync(p, 0x22, 1 << 20, s));
  uint8_t back[64];
  CHECK(cudaMemcpyAsync(back, (uint8_t *)p + (1 << 19), sizeof(back), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < sizeof(back); i++)
    EXPECT(back[i] == 0x22, "byte %zu is 0x%02x after the retried memset", i, back[i]);
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  printf("cudart_user: errors ok\n");
  return 0;
}

#define DRIVER_FN(name) ((__typeof__(&name))dlsym(RTLD_DEFAULT, #name))

static int run_driver(void) {
  __typeof__(&cuMemAlloc_v2) mem_alloc = DRIVER_FN(cuMemAlloc_v2);
  __typeof__(&cuMemFree_v2) mem_free = DRIVER_FN(cuMemFree_v2);
  __typeof__(&cuMemAllocAsync) alloc_async = DRIVER_FN(cuMemAllocAsync);
  __typeof__(&cuMemFreeAsync) free_async = DRIVER_FN(cuMemFreeAsync);
  EXPECT(mem_alloc && mem_free && alloc_async && free_async, "the driver entry points resolve");
  CUdeviceptr d = 0;
  EXPECT(mem_alloc(&d, 0) == CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 0 bytes is invalid");
  EXPECT(mem_alloc(&d, 3 << 20) == CUDA_SUCCESS && d != 0, "cuMemAlloc_v2 of 3 MiB");
  uint8_t back[64];
  CHECK(cudaMemset((void *)(uintptr_t)d, 0x77, 3 << 20));
  CHECK(cudaMemcpy(back, (void *)(uintptr_t)(d + (3 << 20) - sizeof(back)), sizeof(back),
                   cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < sizeof(back); i++)
    EXPECT(back[i] == 0x77, "byte %zu is 0x%02x", i, back[i]);
  EXPECT(mem_free(d) == CUDA_SUCCESS, "cuMemFree_v2");
  EXPECT(mem_free(d) == CUDA_ERROR_INVALID_VALUE, "a second cuMemFree_v2 is invalid");
  cudaStream_t s = NULL;
  CHECK(cudaStreamCreate(&s));
  EXPECT(alloc_async(&d, 4096, (CUstream)s) == CUDA_SUCCESS && d != 0, "cuMemAllocAsync");
  CHECK(cudaMemsetAsync((void *)(uintptr_t)d, 0x12, 4096, s));
  CHECK(cudaMemcpyAsync(back, (void *)(uintptr_t)d, sizeof(back), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(back[0] == 0x12 && back[63] == 0x12, "stamp read back");
  EXPECT(free_async(d, (CUstream)s) == CUDA_SUCCESS, "cuMemFreeAsync");
  static uint64_t not_device_memory[2];
  EXPECT(free_async((CUdeviceptr)(uintptr_t)not_device_memory, (CUstream)s) ==
             CUDA_ERROR_INVALID_VALUE,
         "cuMemFreeAsync of a foreign pointer is invalid");
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  printf("cudart_user: driver ok\n");
  return 0;
}

static void stamp(uint8_t *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(key * 29u + i * 3u);
}

static bool stamped(const uint8_t *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (uint8_t)(key * 29u + i * 3u))
      return false;
  return true;
}

/* A pinned block of n bytes through the device and back into another one. */
static void round_trip(uint8_t *a, uint8_t *b, size_t n, unsigned key, cudaStream_t s) {
  void *d = NULL;
  stamp(a, n, key);
  memset(b, 0, n);
  CHECK(cudaMallocAsync(&d, n, s));
  CHECK(cudaMemcpyAsync(d, a, n, cudaMemcpyHostToDevice, s));
  CHECK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(stamped(b, n, key), "the %zu-byte stamp %u came back through pinned memory", n, key);
  CHECK(cudaFreeAsync(d, s));
}

static int run_streams(void) {
  const size_t big = (size_t)600 << 20;
  CUresult (*stream_destroy)(CUstream) =
      (CUresult(*)(CUstream))dlsym(RTLD_DEFAULT, "cuStreamDestroy_v2");
  EXPECT(stream_destroy != NULL, "cuStreamDestroy_v2 is defined (the shim's)");
  for (int k = 0; k < 2; k++) {
    cudaStream_t s;
    void *p = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMallocAsync(&p, big, s));
    CHECK(cudaMemsetAsync(p, 1, big, s));
    CHECK(cudaFreeAsync(p, s));
    if (k == 0)
      CHECK(cudaStreamDestroy(s));
    else
      EXPECT(stream_destroy((CUstream)s) == CUDA_SUCCESS, "cuStreamDestroy_v2");
  }
  void *q = NULL;
  uint8_t back[64];
  CHECK(cudaMalloc(&q, big));
  CHECK(cudaMemset(q, 2, big));
  CHECK(cudaMemcpy(back, q, sizeof(back), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < sizeof(back); i++)
    EXPECT(back[i] == 2, "byte %zu is 0x%02x", i, back[i]);
  CHECK(cudaFree(q));
  printf("cudart_user: streams ok\n");
  return 0;
}

static int run_host(void) {
  cudaStream_t s = NULL;
  CHECK(cudaStreamCreate(&s));
  static const size_t sizes[] = {64, 4096, 100000, 3u << 20};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    uint8_t *a = NULL, *b = NULL;
    CHECK(cudaHostAlloc((void **)&a, sizes[i], cudaHostAllocDefault));
    CHECK(cudaMallocHost((void **)&b, sizes[i]));
    round_trip(a, b, sizes[i], (unsigned)i + 1, s);
    CHECK(cudaFreeHost(a));
    CHECK(cudaFreeHost(b));
  }
  uint8_t *reg = aligned_alloc(4096, 1 << 16), *b = NULL;
  EXPECT(reg != NULL, "aligned_alloc");
  CHECK(cudaHostRegister(reg, 1 << 16, cudaHostRegisterDefault));
  EXPECT(cudaHostRegister(reg, 1 << 16, cudaHostRegisterDefault) != cudaSuccess,
         "registering twice fails");
  (void)cudaGetLastError();
  CHECK(cudaMallocHost((void **)&b, 1 << 16));
  round_trip(reg, b, 1 << 16, 9, s);
  CHECK(cudaHostUnregister(reg));
  CHECK(cudaFreeHost(b));
  free(reg);
  __typeof__(&cuMemHostAlloc) host_alloc = DRIVER_FN(cuMemHostAlloc);
  __typeof__(&cuMemFreeHost) free_host = DRIVER_FN(cuMemFreeHost);
  EXPECT(host_alloc && free_host, "the driver's host entry points resolve");
  void *p = NULL;
  EXPECT(host_alloc(&p, 8192, 0) == CUDA_SUCCESS && p, "cuMemHostAlloc");
  EXPECT(free_host(p) == CUDA_SUCCESS, "cuMemFreeHost");
  EXPECT(free_host(p) == CUDA_ERROR_INVALID_VALUE, "a second cuMemFreeHost is invalid");
  static uint64_t not_pinned[4];
  EXPECT(cudaFreeHost(not_pinned) == cudaErrorInvalidValue, "cudaFreeHost of a foreign pointer");
  (void)cudaGetLastError();
  CHECK(cudaStreamDestroy(s));
  /* the program's malloc is still glibc's (or, in a sanitizer build, the
   * sanitizer's, which interposes it), though the shim loaded jemalloc */
  Dl_info info;
  void *(*m)(size_t) = malloc;
  EXPECT(dladdr((void *)m, &info) && info.dli_fname && malloc_is_the_programs(info.dli_fname),
         "malloc comes from %s", info.dli_fname ? info.dli_fname : "?");
  void *q = malloc(24);
  EXPECT(dladdr(dlsym(RTLD_DEFAULT, "malloc"), &info) && info.dli_fname &&
             malloc_is_the_programs(info.dli_fname),
         "the global malloc comes from %s", info.dli_fname ? info.dli_fname : "?");
  free(q);
  EXPECT(dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_NOLOAD) != NULL,
         "jemalloc is loaded (by the shim)");
  printf("cudart_user: host ok\n");
  return 0;
}

static int run_captures(void) {
  if (on_sim) {
    printf("SKIP: captures need the real runtime\n");
    return 77;
  }
  cudaStream_t a, b, c;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  for (int round = 0; round < 4; round++) {
    void *p = NULL, *q = NULL;
    CHECK(cudaMallocAsync(&p, 8 << 20, b)); /* cached on b once freed */
    CHECK(cudaMemsetAsync(p, 1, 8 << 20, b));
    CHECK(cudaFreeAsync(p, b));
    CHECK(cudaMallocAsync(&q, 1 << 20, c));
    CHECK(cudaMemsetAsync(q, 2, 1 << 20, c));
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(q, 3, 4096, a));
    CHECK(cudaFreeAsync(q, c));  /* a free on another stream: pending */
    CHECK(cudaStreamDestroy(b)); /* its cached memory: no wait now */
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(a, &g);
    EXPECT(e == cudaSuccess && g != NULL, "round %d: the capture ends with a graph (%s)", round,
           cudaGetErrorName(e));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CHECK(cudaMallocAsync(&p, 8 << 20, NULL)); /* after it: served, waits allowed again */
    CHECK(cudaFreeAsync(p, NULL));
  }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaStreamDestroy(a));
  CHECK(cudaStreamDestroy(b));
  CHECK(cudaStreamDestroy(c));
  printf("cudart_user: captures ok\n");
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "stress";
  const char *dev = getenv("GCA_DEVICE");
  on_sim = dev && strcmp(dev, "sim") == 0;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("SKIP: no usable CUDA device (%s)\n", cudaGetErrorString(e));
    return 77;
  }
  CHECK(cudaSetDevice(0));
  if (strcmp(mode, "stress") == 0)
    return run_stress(argc > 2 ? atoi(argv[2]) : 6000,
                      argc > 3 ? strtoull(argv[3], NULL, 10) : 12345);
  if (strcmp(mode, "foreign") == 0)
    return run_foreign();
  if (strcmp(mode, "errors") == 0)
    return run_errors();
  if (strcmp(mode, "host") == 0)
    return run_host();
  if (strcmp(mode, "driver") == 0)
    return run_driver();
  if (strcmp(mode, "streams") == 0)
    return run_streams();
  if (strcmp(mode, "captures") == 0)
    return run_captures();
  if (strcmp(mode, "ctor") == 0) {
    EXPECT(preload_ctor_result() == 1, "the constructor's allocation went well (result %d)",
           preload_ctor_result());
    printf("cudart_user: ctor ok\n");
    return 0;
  }
  fprintf(stderr, "cudart_user: unknown mode '%s'\n", mode);
  return 2;
}
