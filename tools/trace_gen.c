/* SPDX-License-Identifier: Apache-2.0 */
/* trace_gen.c - gca-trace-gen: synthetic allocation traces in RMM log CSV
 * (Thread,Time,Action,Pointer,Size,Stream), for gca-replay.
 *
 * The one idea: each shape is a small model of a workload's tensor lifetimes,
 * seeded, so the same command always writes the same trace.
 *   serving   an inference server's KV caches: weights, then sequences that
 *             arrive and finish at random, each holding one cache per group of
 *             layers that grows in 256-token steps (a larger cache allocated,
 *             the old one freed after the copy), and per-step activations.
 *   training  training with variable sequence lengths: weights, gradients and
 *             optimizer state, then steps whose activations scale with a
 *             random sequence length, freed in reverse in the backward pass,
 *             with gradient buffers and temporaries in between.
 * Pointers are fresh addresses (never reused), sizes multiples of 512 bytes.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((uint64_t)1 << 20)
#define KiB ((uint64_t)1 << 10)

typedef struct gen {
  FILE *out;
  uint64_t rng, next_ptr, t_us, live, peak;
} gen_t;

static uint64_t rnd(gen_t *g) {
  g->rng ^= g->rng << 13;
  g->rng ^= g->rng >> 7;
  g->rng ^= g->rng << 17;
  return g->rng;
}

static uint64_t between(gen_t *g, uint64_t lo, uint64_t hi) {
  return lo + rnd(g) % (hi - lo + 1);
}

static void event(gen_t *g, const char *action, uint64_t ptr, uint64_t size) {
  uint64_t t = g->t_us++;
  fprintf(g->out,
          "1,%02" PRIu64 ":%02" PRIu64 ":%02" PRIu64 ".%06" PRIu64 ",%s,0x%" PRIx64 ",%" PRIu64
          ",0x0\n",
          t / 3600000000u, t / 60000000u % 60, t / 1000000u % 60, t % 1000000u, action, ptr, size);
}

typedef struct blk {
  uint64_t ptr, size;
} blk_t;

static blk_t alloc(gen_t *g, uint64_t size) {
  size = (size + 511) / 512 * 512;
  blk_t b = {g->next_ptr, size};
  g->next_ptr += (size + 4095) / 4096 * 4096 + 4096;
  event(g, "allocate", b.ptr, b.size);
  g->live += size;
  if (g->live > g->peak)
    g->peak = g->live;
  return b;
}

static void release(gen_t *g, blk_t *b) {
  if (b->size == 0)
    return;
  event(g, "free", b->ptr, b->size);
  g->live -= b->size;
  b->size = 0;
}

/* ---- serving ---- */

enum { SEQS = 24, GROUPS = 4, STEPS = 6000, WEIGHTS = 120 };

typedef struct seq {
  int active;
  uint64_t len, target, cap;
  blk_t kv[GROUPS];
} seq_t;

static void serving(gen_t *g) {
  blk_t w[WEIGHTS];
  for (int i = 0; i < WEIGHTS; i++) /* ~10 GiB of weights */
    w[i] = alloc(g, between(g, 20, 150) * MiB);
  const uint64_t per_token = 96 * KiB, step_tokens = 256; /* one group's K and V */
  seq_t s[SEQS] = {0};
  for (int step = 0; step < STEPS; step++) {
    for (int i = 0; i < SEQS; i++) {
      seq_t *q = &s[i];
      if (!q->active) {
        if (rnd(g) % 8 != 0) /* arrivals trickle in */
          continue;
        q->active = 1;
        q->len = between(g, 16, 1024); /* the prompt */
        q->target = q->len + between(g, 16, 3072);
        q->cap = 0;
      }
      if (q->len > q->cap) { /* regrow: a larger cache, copy, free the old */
        uint64_t cap = (q->len + step_tokens - 1) / step_tokens * step_tokens;
        for (int k = 0; k < GROUPS; k++) {
          blk_t nb = alloc(g, cap * per_token);
          release(g, &q->kv[k]);
          q->kv[k] = nb;
        }
        q->cap = cap;
      }
      q->len += between(g, 1, 16); /* a few decode steps per scheduler step */
      if (q->len >= q->target) {   /* finished: out of order */
        for (int k = 0; k < GROUPS; k++)
          release(g, &q->kv[k]);
        q->active = 0;
      }
    }
    blk_t act[3]; /* the step's activations and logits */
    for (int k = 0; k < 3; k++)
      act[k] = alloc(g, between(g, 2, 96) * MiB + between(g, 0, 1023) * 512);
    for (int k = 2; k >= 0; k--)
      release(g, &act[k]);
  }
  for (int i = 0; i < SEQS; i++)
    for (int k = 0; k < GROUPS; k++)
      release(g, &s[i].kv[k]);
  for (int i = 0; i < WEIGHTS; i++)
    release(g, &w[i]);
}

/* ---- training with variable sequence lengths ---- */

enum { LAYERS = 24, ITERS = 60, PER_LAYER = 6 };

static void training(gen_t *g) {
  blk_t w[LAYERS][4], opt[LAYERS][8];
  for (int l = 0; l < LAYERS; l++) { /* weights and Adam state: ~7 GiB */
    for (int k = 0; k < 4; k++)
      w[l][k] = alloc(g, between(g, 16, 48) * MiB);
    for (int k = 0; k < 8; k++)
      opt[l][k] = alloc(g, w[l][k / 2].size);
  }
  for (int it = 0; it < ITERS; it++) {
    uint64_t seq = between(g, 128, 2048), batch = 8;
    blk_t act[LAYERS][PER_LAYER], grad[LAYERS][4];
    for (int l = 0; l < LAYERS; l++) { /* forward: activations kept for backward */
      for (int k = 0; k < PER_LAYER; k++)
        act[l][k] = alloc(g, batch * seq * (k % 3 == 2 ? 16 : 4) * KiB + between(g, 0, 7) * 512);
      blk_t tmp = alloc(g, batch * seq * 8 * KiB); /* a temporary of the layer */
      release(g, &tmp);
    }
    blk_t loss = alloc(g, batch * seq * 64 * KiB); /* logits */
    release(g, &loss);
    for (int l = LAYERS - 1; l >= 0; l--) { /* backward: gradients, activations freed */
      for (int k = 0; k < 4; k++)
        grad[l][k] = alloc(g, w[l][k].size);
      blk_t tmp = alloc(g, batch * seq * 12 * KiB);
      for (int k = PER_LAYER - 1; k >= 0; k--)
        release(g, &act[l][k]);
      release(g, &tmp);
    }
    for (int l = 0; l < LAYERS; l++) /* the optimizer step frees the gradients */
      for (int k = 0; k < 4; k++)
        release(g, &grad[l][k]);
  }
  for (int l = 0; l < LAYERS; l++) {
    for (int k = 0; k < 4; k++)
      release(g, &w[l][k]);
    for (int k = 0; k < 8; k++)
      release(g, &opt[l][k]);
  }
}

int main(int argc, char **argv) {
  const char *shape = NULL, *path = NULL;
  uint64_t seed = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
      seed = strtoull(argv[++i], NULL, 0);
    else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
      path = argv[++i];
    else if (strcmp(argv[i], "--help") == 0 || shape != NULL)
      shape = "";
    else
      shape = argv[i];
  }
  if (shape == NULL || (strcmp(shape, "serving") != 0 && strcmp(shape, "training") != 0)) {
    fprintf(stderr, "usage: gca-trace-gen serving|training [--seed N] [--out FILE]\n"
                    "Writes a synthetic allocation trace (RMM log CSV) for gca-replay:\n"
                    "  serving   KV caches that grow in steps, freed out of order\n"
                    "  training  training steps with variable sequence lengths\n");
    return 2;
  }
  gen_t g = {stdout, seed * 0x9e3779b97f4a7c15u | 1, 0x10000000000u, 0, 0, 0};
  if (path != NULL && (g.out = fopen(path, "w")) == NULL) {
    perror(path);
    return 1;
  }
  fprintf(g.out, "Thread,Time,Action,Pointer,Size,Stream\n");
  if (strcmp(shape, "serving") == 0)
    serving(&g);
  else
    training(&g);
  fprintf(stderr, "gca-trace-gen %s: %" PRIu64 " events, peak live %" PRIu64 " bytes\n", shape,
          g.t_us, g.peak);
  if (g.out != stdout && fclose(g.out) != 0) {
    perror(path);
    return 1;
  }
  return 0;
}
