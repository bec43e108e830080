/* SPDX-License-Identifier: Apache-2.0 */
/* sim_handles.c - the registry behind the sim's handles (Note [Sim handles],
 * sim_stream.h): streams, events, graphs and executable graphs are handed out
 * as (kind, generation, slot) numbers, so a stale or foreign handle is an
 * error, not a dangling pointer; and the reference counts that keep an object
 * alive while work or a lookup still holds it.
 */
#include <pthread.h>
#include <stdlib.h>

#include "sim_stream.h"

#define HANDLE_KIND_SHIFT 56
#define HANDLE_GEN_SHIFT  24
#define HANDLE_SLOT_MASK  ((1u << HANDLE_GEN_SHIFT) - 1)

/* objs[i] != NULL iff slot i is live; gens[i] changes each time slot i is reused. */
static struct {
  pthread_mutex_t mu;
  gca__sim_obj_t **objs;
  uint32_t *gens;
  uint32_t *free_slots;
  uint32_t len, cap, nfree;
} reg = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool reg_grow(void) {
  uint32_t cap = reg.cap ? reg.cap * 2 : 64;
  if (cap > HANDLE_SLOT_MASK)
    return false;
  gca__sim_obj_t **objs = realloc(reg.objs, cap * sizeof(*objs));
  if (!objs)
    return false;
  reg.objs = objs;
  uint32_t *gens = realloc(reg.gens, cap * sizeof(*gens));
  if (!gens)
    return false;
  reg.gens = gens;
  uint32_t *fs = realloc(reg.free_slots, cap * sizeof(*fs));
  if (!fs)
    return false;
  reg.free_slots = fs;
  reg.cap = cap;
  return true;
}

static atomic_bool recycle; /* Note [Sim handles] */

void gca__sim_set_recycle_handles(bool on) {
  atomic_store_explicit(&recycle, on, memory_order_relaxed);
}

uint64_t gca__sim_handle_add(gca__sim_obj_t *obj) {
  uint64_t h = 0;
  pthread_mutex_lock(&reg.mu);
  uint32_t slot;
  if (reg.nfree > 0) {
    slot = reg.free_slots[--reg.nfree];
    if (!atomic_load_explicit(&recycle, memory_order_relaxed))
      reg.gens[slot]++;
  } else {
    if (reg.len == reg.cap && !reg_grow())
      goto out;
    slot = reg.len++;
    reg.gens[slot] = 1;
  }
  reg.objs[slot] = obj;
  h = ((uint64_t)obj->kind << HANDLE_KIND_SHIFT) | ((uint64_t)reg.gens[slot] << HANDLE_GEN_SHIFT) |
      slot;
out:
  pthread_mutex_unlock(&reg.mu);
  return h;
}

static gca__sim_obj_t *reg_find(gca__sim_kind_t kind, uint64_t h, uint32_t *slot_out) {
  uint32_t slot = (uint32_t)(h & HANDLE_SLOT_MASK);
  uint32_t gen = (uint32_t)(h >> HANDLE_GEN_SHIFT);
  if ((h >> HANDLE_KIND_SHIFT) != (uint64_t)kind || slot >= reg.len)
    return NULL;
  gca__sim_obj_t *obj = reg.objs[slot];
  if (!obj || reg.gens[slot] != gen || obj->kind != kind)
    return NULL;
  *slot_out = slot;
  return obj;
}

gca__sim_obj_t *gca__sim_handle_get(gca__sim_kind_t kind, uint64_t h) {
  uint32_t slot;
  pthread_mutex_lock(&reg.mu);
  gca__sim_obj_t *obj = reg_find(kind, h, &slot);
  if (obj)
    atomic_fetch_add(&obj->refs, 1);
  pthread_mutex_unlock(&reg.mu);
  return obj;
}

/* Whether h is a handle of `kind` that was live once and is no longer. */
bool gca__sim_handle_was_live(gca__sim_kind_t kind, uint64_t h) {
  uint32_t slot = (uint32_t)(h & HANDLE_SLOT_MASK);
  uint32_t gen = (uint32_t)(h >> HANDLE_GEN_SHIFT); /* bits 24..55 */
  pthread_mutex_lock(&reg.mu);
  bool was = (h >> HANDLE_KIND_SHIFT) == (uint64_t)kind && slot < reg.len && gen >= 1 &&
             (gen < reg.gens[slot] || reg.objs[slot] == NULL);
  pthread_mutex_unlock(&reg.mu);
  return was;
}

bool gca__sim_handle_remove(gca__sim_kind_t kind, uint64_t h) {
  uint32_t slot;
  pthread_mutex_lock(&reg.mu);
  gca__sim_obj_t *obj = reg_find(kind, h, &slot);
  if (obj) {
    reg.objs[slot] = NULL;
    reg.free_slots[reg.nfree++] = slot;
  }
  pthread_mutex_unlock(&reg.mu);
  return obj != NULL;
}

void gca__sim_obj_ref(gca__sim_obj_t *obj) {
  atomic_fetch_add(&obj->refs, 1);
}

void gca__sim_obj_unref(gca__sim_obj_t *obj) {
  if (obj && atomic_fetch_sub(&obj->refs, 1) == 1)
    obj->free_fn(obj);
}
