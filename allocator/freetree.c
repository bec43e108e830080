/* SPDX-License-Identifier: Apache-2.0 */
/* freetree.c - a pool's free structure: an intrusive treap of free blocks
 * keyed (stream, size, address).
 *
 * The key order is PyTorch's BlockComparatorSize, so the best fit for a
 * request is the lower bound of (stream, size, 0): the smallest free block of
 * that stream that is large enough, lowest address first among equals. The
 * heap priorities come from hashing the block's address, which keeps the tree
 * balanced in expectation without any rebalancing state. Every operation is
 * iterative and touches O(log n) nodes; nothing allocates.
 */
#include "alloc_core.h"

static inline uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  x ^= x >> 33;
  return x;
}

/* Whether a's key is below (stream, size, addr). */
static inline bool key_less(const gca__block_t *a, uintptr_t stream, size_t size,
                            gca_devptr_t addr) {
  uintptr_t as = (uintptr_t)a->stream;
  if (as != stream)
    return as < stream;
  if (a->size != size)
    return a->size < size;
  return a->addr < addr;
}

static inline bool block_less(const gca__block_t *a, const gca__block_t *b) {
  return key_less(a, (uintptr_t)b->stream, b->size, b->addr);
}

void gca__tree_insert(gca__pool_t *p, gca__block_t *b) {
  GCA_ASSERT_DEBUG(!b->in_tree);
  b->prio = mix(b->addr ^ 0x9e3779b97f4a7c15ull);
  gca__block_t **link = &p->root;
  while (*link != NULL && (*link)->prio >= b->prio)
    link = block_less(b, *link) ? &(*link)->left : &(*link)->right;
  /* split the subtree at *link around b's key */
  gca__block_t *t = *link;
  gca__block_t **l = &b->left, **r = &b->right;
  while (t != NULL) {
    if (block_less(t, b)) {
      *l = t;
      l = &t->right;
      t = t->right;
    } else {
      *r = t;
      r = &t->left;
      t = t->left;
    }
  }
  *l = NULL;
  *r = NULL;
  *link = b;
  b->in_tree = true;
  p->nfree++;
}

/* Takes b out of the tree, *link being the link that points at it. */
static void erase_at(gca__pool_t *p, gca__block_t **link, gca__block_t *b) {
  /* merge b's subtrees (every key of a is below every key of c) */
  gca__block_t *a = b->left, *c = b->right;
  while (a != NULL && c != NULL) {
    if (a->prio > c->prio) {
      *link = a;
      link = &a->right;
      a = a->right;
    } else {
      *link = c;
      link = &c->left;
      c = c->left;
    }
  }
  *link = a != NULL ? a : c;
  b->left = b->right = NULL;
  b->in_tree = false;
  p->nfree--;
}

void gca__tree_erase(gca__pool_t *p, gca__block_t *b) {
  GCA_ASSERT_DEBUG(b->in_tree);
  gca__block_t **link = &p->root;
  while (*link != b) {
    GCA_ASSERT(*link != NULL);
    link = block_less(b, *link) ? &(*link)->left : &(*link)->right;
  }
  erase_at(p, link, b);
}

void gca__tree_swap(gca__pool_t *p, gca__block_t *old, gca__block_t *nb) {
  GCA_ASSERT_DEBUG(old->in_tree && !nb->in_tree);
  gca__block_t **link = &p->root;
  const gca__block_t *lo = NULL, *hi = NULL; /* nearest ancestors bounding old's key */
  while (*link != old) {
    GCA_ASSERT(*link != NULL);
    if (block_less(old, *link)) {
      hi = *link;
      link = &(*link)->left;
    } else {
      lo = *link;
      link = &(*link)->right;
    }
  }
  /* nb's key moves away from old's on one side only: check that neighbour */
  bool fits;
  if (block_less(nb, old)) {
    const gca__block_t *pred = lo;
    if (old->left != NULL)
      for (pred = old->left; pred->right != NULL; pred = pred->right)
        ;
    fits = pred == NULL || block_less(pred, nb);
  } else {
    const gca__block_t *succ = hi;
    if (old->right != NULL)
      for (succ = old->right; succ->left != NULL; succ = succ->left)
        ;
    fits = succ == NULL || block_less(nb, succ);
  }
  if (!fits) {
    erase_at(p, link, old);
    gca__tree_insert(p, nb);
    return;
  }
  *link = nb;
  nb->left = old->left;
  nb->right = old->right;
  nb->prio = old->prio;
  nb->in_tree = true;
  old->left = old->right = NULL;
  old->in_tree = false;
}

gca__block_t *gca__tree_lower_bound(const gca__pool_t *p, gca_stream_t stream, size_t size) {
  gca__block_t *best = NULL;
  for (gca__block_t *t = p->root; t != NULL;) {
    if (key_less(t, (uintptr_t)stream, size, 0)) {
      t = t->right;
    } else {
      best = t;
      t = t->left;
    }
  }
  return best;
}

static gca__block_t *below_key(const gca__pool_t *p, uintptr_t stream, size_t size,
                               gca_devptr_t addr) {
  gca__block_t *best = NULL;
  for (gca__block_t *t = p->root; t != NULL;) {
    if (key_less(t, stream, size, addr)) {
      best = t;
      t = t->right;
    } else {
      t = t->left;
    }
  }
  return best;
}

gca__block_t *gca__tree_below(const gca__pool_t *p, gca_stream_t stream, size_t size) {
  return below_key(p, (uintptr_t)stream, size, 0);
}

gca__block_t *gca__tree_prev(const gca__pool_t *p, const gca__block_t *b) {
  return below_key(p, (uintptr_t)b->stream, b->size, b->addr);
}

bool gca__tree_contains(const gca__pool_t *p, const gca__block_t *b) {
  for (gca__block_t *t = p->root; t != NULL;) {
    if (t == b)
      return true;
    t = block_less(b, t) ? t->left : t->right;
  }
  return false;
}

/* Recursion depth is the tree height, O(log n) in expectation. */
static long validate(const gca__block_t *t, const gca__block_t *lo, const gca__block_t *hi) {
  if (t == NULL)
    return 0;
  if (!t->in_tree || (lo && !block_less(lo, t)) || (hi && !block_less(t, hi)))
    return -1;
  if ((t->left && t->left->prio > t->prio) || (t->right && t->right->prio > t->prio))
    return -1;
  long l = validate(t->left, lo, t);
  long r = l < 0 ? -1 : validate(t->right, t, hi);
  return r < 0 ? -1 : l + r + 1;
}

long gca__tree_validate(const gca__pool_t *p) {
  return validate(p->root, NULL, NULL);
}
