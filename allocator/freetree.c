/* SPDX-License-Identifier: Apache-2.0 */
/* freetree.c - a pool's free structure: per-stream size-class bins with
 * occupancy bitmaps, each bin a small treap of free blocks keyed (stream,
 * size, address), and one overflow treap for streams without bins.
 *
 * Note [Free bins]: the key order is PyTorch's BlockComparatorSize, so the
 * best fit for a request is the lower bound of (stream, size, 0): the
 * smallest free block of that stream that is large enough, lowest address
 * first among equals. One treap over every free block (what this was) finds
 * it in O(log n) steps, each a likely cache miss once a pool holds many free
 * blocks. Instead each of a pool's first GCA__FB_STREAMS streams gets a set
 * of GCA__FB_CLASSES size classes: sizes below 32 KiB (64 units of 512 bytes)
 * a class each, above that 16 classes per power of two. A class holds its
 * blocks in a treap of their own (few blocks, a shallow tree), and a bitmap
 * with a summary word says which classes hold any. The best fit is then the
 * lower bound within the request's own class, else the smallest block of the
 * next non-empty class, found with two bit scans: the same block the single
 * treap would return, so placement is unchanged. Below and prev walk the
 * same order downwards. Blocks keep a parent link, so taking one out (an
 * allocation of the block found, a merge with a free neighbour) starts at
 * the block instead of descending to it. Nothing here allocates on a hot path: a stream's set
 * is made the first time a block of it is freed (a set left empty is reused
 * by the next new stream); a stream that finds no set (more streams than
 * sets, or no host memory) keeps its blocks in the overflow treap, as all
 * blocks were kept before. A stream never has blocks in both: it gets a set
 * only while it has none in the overflow treap.
 */
#include <stdlib.h>

#include "alloc_core.h"

#define FB_WORDS (GCA__FB_CLASSES / 64)

typedef struct gca__fbin_set {
  uintptr_t stream;
  size_t n;         /* blocks in its classes */
  uint64_t summary; /* bit w: words[w] != 0 */
  uint64_t words[FB_WORDS];
  gca__block_t *root[GCA__FB_CLASSES];
  gca__block_t *min[GCA__FB_CLASSES]; /* each class's smallest key (Note [Class minima]) */
} fbin_set_t;

struct gca__fbins {
  fbin_set_t *set[GCA__FB_STREAMS];
};

/* ---- treaps (one per class, and the overflow one) ---- */

static inline uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  x ^= x >> 33;
  return x;
}

/* How much of the key a treap's blocks share, a constant at each call (Note
 * [Class minima]): nothing (the overflow treap), the stream (a set's class
 * of a size range), or the stream and the size (a set's class of one size),
 * which then is not compared. */
enum { KEY_ALL, KEY_SIZE_ADDR, KEY_ADDR };

/* Whether a's key is below (stream, size, addr). */
static inline __attribute__((always_inline)) bool
key_less_in(const gca__block_t *a, uintptr_t stream, size_t size, gca_devptr_t addr, int shared) {
  if (shared == KEY_ALL && (uintptr_t)a->stream != stream) /* else not read at all */
    return (uintptr_t)a->stream < stream;
  if (shared != KEY_ADDR && a->size != size)
    return a->size < size;
  return a->addr < addr;
}

static inline bool key_less(const gca__block_t *a, uintptr_t stream, size_t size,
                            gca_devptr_t addr) {
  return key_less_in(a, stream, size, addr, KEY_ALL);
}

static inline __attribute__((always_inline)) bool block_less_in(const gca__block_t *a,
                                                                const gca__block_t *b, int shared) {
  return key_less_in(a, (uintptr_t)b->stream, b->size, b->addr, shared);
}

static inline bool block_less(const gca__block_t *a, const gca__block_t *b) {
  return block_less_in(a, b, KEY_ALL);
}

static inline __attribute__((always_inline)) void t_insert_in(gca__block_t **root, gca__block_t *b,
                                                              int shared) {
  b->prio = (uint32_t)mix(b->addr ^ 0x9e3779b97f4a7c15ull);
  gca__block_t **link = root, *owner = NULL;
  while (*link != NULL && (*link)->prio >= b->prio) {
    owner = *link;
    link = block_less_in(b, *link, shared) ? &(*link)->left : &(*link)->right;
  }
  /* split the subtree at *link around b's key */
  gca__block_t *t = *link;
  gca__block_t **l = &b->left, **r = &b->right, *lo = b, *ro = b;
  while (t != NULL) {
    if (block_less_in(t, b, shared)) {
      *l = t;
      t->parent = lo;
      lo = t;
      l = &t->right;
      t = t->right;
    } else {
      *r = t;
      t->parent = ro;
      ro = t;
      r = &t->left;
      t = t->left;
    }
  }
  *l = NULL;
  *r = NULL;
  *link = b;
  b->parent = owner;
  b->in_tree = true;
}

static void t_insert(gca__block_t **root, gca__block_t *b) {
  t_insert_in(root, b, KEY_ALL);
}

/* Takes b out, *link being the link that points at it. */
static void t_erase_at(gca__block_t **link, gca__block_t *b) {
  /* merge b's subtrees (every key of a is below every key of c) */
  gca__block_t *a = b->left, *c = b->right, *owner = b->parent;
  while (a != NULL && c != NULL) {
    if (a->prio > c->prio) {
      *link = a;
      a->parent = owner;
      owner = a;
      link = &a->right;
      a = a->right;
    } else {
      *link = c;
      c->parent = owner;
      owner = c;
      link = &c->left;
      c = c->left;
    }
  }
  *link = a != NULL ? a : c;
  if (*link != NULL)
    (*link)->parent = owner;
  b->left = b->right = b->parent = NULL;
  b->in_tree = false;
}

/* The link that points at b: its parent's, or the root's. No descent. */
static gca__block_t **t_find(gca__block_t **root, const gca__block_t *b) {
  gca__block_t *p = b->parent;
  return p == NULL ? root : p->left == b ? &p->left : &p->right;
}

/* b's in-order neighbour below (dir 0) or above (dir 1), through the
 * parent links. */
static const gca__block_t *t_neighbour(const gca__block_t *b, int dir) {
  const gca__block_t *c = dir ? b->right : b->left;
  if (c != NULL) {
    while ((dir ? c->left : c->right) != NULL)
      c = dir ? c->left : c->right;
    return c;
  }
  const gca__block_t *p = b->parent;
  while (p != NULL && (dir ? p->right : p->left) == b) {
    b = p;
    p = p->parent;
  }
  return p;
}

/* Whether nb may take old's place: its key still lies between old's in-order
 * neighbours (nb's key moves away from old's on one side only). */
static inline __attribute__((always_inline)) bool t_fits_in(const gca__block_t *old,
                                                            const gca__block_t *nb, int shared) {
  bool below = block_less_in(nb, old, shared);
  const gca__block_t *n = t_neighbour(old, below ? 0 : 1);
  return n == NULL || (below ? block_less_in(n, nb, shared) : block_less_in(nb, n, shared));
}

static bool t_fits(const gca__block_t *old, const gca__block_t *nb) {
  return t_fits_in(old, nb, KEY_ALL);
}

/* Puts nb in old's place, which t_fits allows. */
static void t_replace(gca__block_t **root, gca__block_t *old, gca__block_t *nb) {
  gca__block_t **link = t_find(root, old);
  *link = nb;
  nb->left = old->left;
  nb->right = old->right;
  nb->parent = old->parent;
  if (nb->left != NULL)
    nb->left->parent = nb;
  if (nb->right != NULL)
    nb->right->parent = nb;
  nb->prio = old->prio;
  nb->in_tree = true;
  old->left = old->right = old->parent = NULL;
  old->in_tree = false;
}

/* Replaces old by nb in place when nb's key still lies between old's
 * in-order neighbours (no rebalancing), else erases old and inserts nb. */
static void t_swap(gca__block_t **root, gca__block_t *old, gca__block_t *nb) {
  if (t_fits(old, nb)) {
    t_replace(root, old, nb);
  } else {
    t_erase_at(t_find(root, old), old);
    t_insert(root, nb);
  }
}

/* Smallest key >= (stream, size, addr). */
static inline __attribute__((always_inline)) gca__block_t *
t_lower_in(gca__block_t *t, uintptr_t stream, size_t size, gca_devptr_t addr, int shared) {
  gca__block_t *best = NULL;
  while (t != NULL) {
    if (key_less_in(t, stream, size, addr, shared)) {
      t = t->right;
    } else {
      best = t;
      t = t->left;
    }
  }
  return best;
}

static gca__block_t *t_lower(gca__block_t *t, uintptr_t stream, size_t size, gca_devptr_t addr) {
  return t_lower_in(t, stream, size, addr, KEY_ALL);
}

/* Largest key < (stream, size, addr). */
static gca__block_t *t_below(gca__block_t *t, uintptr_t stream, size_t size, gca_devptr_t addr) {
  gca__block_t *best = NULL;
  while (t != NULL) {
    if (key_less(t, stream, size, addr)) {
      best = t;
      t = t->right;
    } else {
      t = t->left;
    }
  }
  return best;
}

static gca__block_t *t_min(gca__block_t *t) {
  while (t != NULL && t->left != NULL)
    t = t->left;
  return t;
}

static gca__block_t *t_max(gca__block_t *t) {
  while (t != NULL && t->right != NULL)
    t = t->right;
  return t;
}

static bool t_contains(const gca__block_t *t, const gca__block_t *b) {
  while (t != NULL) {
    if (t == b)
      return true;
    t = block_less(b, t) ? t->left : t->right;
  }
  return false;
}

/* Order, heap property and the class of every node (cls < 0: any); the node
 * count or -1. Recursion depth is the treap's height. */
static long t_validate(const gca__block_t *t, const gca__block_t *lo, const gca__block_t *hi,
                       int cls) {
  if (t == NULL)
    return 0;
  if (!t->in_tree || (lo && !block_less(lo, t)) || (hi && !block_less(t, hi)))
    return -1;
  if ((t->left && t->left->prio > t->prio) || (t->right && t->right->prio > t->prio))
    return -1;
  if (cls >= 0 && gca__fb_class(t->size) != cls)
    return -1;
  if ((t->left && t->left->parent != t) || (t->right && t->right->parent != t))
    return -1;
  long l = t_validate(t->left, lo, t, cls);
  long r = l < 0 ? -1 : t_validate(t->right, t, hi, cls);
  return r < 0 ? -1 : l + r + 1;
}

/* ---- classes and their bitmap ---- */

int gca__fb_class(size_t size) {
  size_t u = size >> 9; /* 512-byte units */
  if (u < 64)
    return (int)u;
  int e = 63 - __builtin_clzll((unsigned long long)u); /* >= 6 */
  int c = 64 + (e - 6) * 16 + (int)((u >> (e - 4)) & 15);
  return c < GCA__FB_CLASSES ? c : GCA__FB_CLASSES - 1;
}

static void bit_set(fbin_set_t *s, int c) {
  s->words[c >> 6] |= 1ull << (c & 63);
  s->summary |= 1ull << (c >> 6);
}

static void bit_clear(fbin_set_t *s, int c) {
  s->words[c >> 6] &= ~(1ull << (c & 63));
  if (s->words[c >> 6] == 0)
    s->summary &= ~(1ull << (c >> 6));
}

/* The first non-empty class >= c, or -1. */
static int next_class(const fbin_set_t *s, int c) {
  if (c >= GCA__FB_CLASSES)
    return -1;
  int w = c >> 6;
  uint64_t bits = s->words[w] & (~0ull << (c & 63));
  if (bits)
    return (w << 6) + __builtin_ctzll(bits);
  uint64_t more = w + 1 < 64 ? s->summary & (~0ull << (w + 1)) : 0;
  if (!more)
    return -1;
  w = __builtin_ctzll(more);
  return (w << 6) + __builtin_ctzll(s->words[w]);
}

/* The last non-empty class < c, or -1. */
static int prev_class(const fbin_set_t *s, int c) {
  if (c <= 0)
    return -1;
  c--;
  int w = c >> 6;
  uint64_t bits = s->words[w] & (~0ull >> (63 - (c & 63)));
  if (bits)
    return (w << 6) + 63 - __builtin_clzll(bits);
  uint64_t less = s->summary & ((1ull << w) - 1);
  if (!less)
    return -1;
  w = 63 - __builtin_clzll(less);
  return (w << 6) + 63 - __builtin_clzll(s->words[w]);
}

/* ---- a set's classes, with their minima ---- */

/* Note [Class minima]: each class of a set keeps its smallest block beside
 * its root. The best fit in a class of one size (below 32 KiB) is that
 * block, and in a class of a size range it is that block whenever it is
 * large enough; the smallest block of the next non-empty class is always
 * it. So the request's lower bound reads one pointer instead of descending
 * the treap's left spine, a dozen levels at 10^5 blocks. An insert compares
 * with the minimum; an erase of the minimum moves it to its in-order
 * successor through the parent links, which for a leftmost block is its
 * right subtree's leftmost or its parent. Every block of a set has the
 * set's stream, so its class treaps compare size and address only, and a
 * class of one size the address alone (at 10^5 blocks an insert descends
 * some twenty levels, and this is most of each level's work). The walker
 * checks each minimum against the treap's. */

/* Whether class c holds blocks of one size (gca__fb_class). */
static inline bool cls_one_size(int c) {
  return c < 64;
}

static void cls_insert(fbin_set_t *s, int c, gca__block_t *b) {
  if (cls_one_size(c))
    t_insert_in(&s->root[c], b, KEY_ADDR);
  else
    t_insert_in(&s->root[c], b, KEY_SIZE_ADDR);
  if (s->min[c] == NULL || block_less_in(b, s->min[c], KEY_SIZE_ADDR))
    s->min[c] = b;
  bit_set(s, c);
}

static inline __attribute__((always_inline)) void cls_erase(fbin_set_t *s, int c, gca__block_t *b) {
  if (s->min[c] == b)
    s->min[c] = (gca__block_t *)t_neighbour(b, 1);
  t_erase_at(t_find(&s->root[c], b), b);
  if (s->root[c] == NULL)
    bit_clear(s, c);
}

/* ---- sets ---- */

static fbin_set_t *set_of(const gca__pool_t *p, uintptr_t stream) {
  if (p->bins == NULL)
    return NULL;
  for (int i = 0; i < GCA__FB_STREAMS; i++) {
    fbin_set_t *s = p->bins->set[i];
    if (s != NULL && s->stream == stream)
      return s;
  }
  return NULL;
}

/* The set a new free block of `stream` goes to: its own, else a set made or
 * an empty one taken over, unless the stream still has overflow blocks; NULL
 * for the overflow treap. */
static fbin_set_t *set_for_insert(gca__pool_t *p, uintptr_t stream) {
  fbin_set_t *s = set_of(p, stream);
  if (s != NULL)
    return s;
  if (p->bins == NULL && (p->bins = calloc(1, sizeof(*p->bins))) == NULL)
    return NULL;
  gca__block_t *o = t_lower(p->root, stream, 0, 0);
  if (o != NULL && (uintptr_t)o->stream == stream)
    return NULL;
  for (int i = 0; i < GCA__FB_STREAMS; i++) {
    fbin_set_t **slot = &p->bins->set[i];
    if (*slot == NULL && (*slot = calloc(1, sizeof(**slot))) == NULL)
      return NULL;
    if ((*slot)->n == 0) {
      (*slot)->stream = stream;
      return *slot;
    }
  }
  return NULL;
}

/* ---- the pool's free structure ---- */

void gca__tree_insert(gca__pool_t *p, gca__block_t *b) {
  GCA_ASSERT_DEBUG(!b->in_tree && b->uses == NULL); /* Note [Record lines] */
  p->gen++;
  fbin_set_t *s = set_for_insert(p, (uintptr_t)b->stream);
  if (s != NULL) {
    cls_insert(s, gca__fb_class(b->size), b);
    s->n++;
  } else {
    t_insert(&p->root, b);
  }
  p->nfree++;
}

void gca__tree_erase_of(gca__pool_t *p, gca__block_t *b, gca_stream_t stream) {
  GCA_ASSERT_DEBUG(b->in_tree && b->stream == stream);
  p->gen++;
  fbin_set_t *s = set_of(p, (uintptr_t)stream);
  if (s != NULL) {
    cls_erase(s, gca__fb_class(b->size), b);
    s->n--;
  } else {
    t_erase_at(t_find(&p->root, b), b);
  }
  p->nfree--;
}

void gca__tree_erase(gca__pool_t *p, gca__block_t *b) {
  gca__tree_erase_of(p, b, b->stream);
}

void gca__tree_swap(gca__pool_t *p, gca__block_t *old, gca__block_t *nb) {
  /* old is nb's neighbour or nb's split-off part: one segment, one stream
   * (whose old need not read, Note [Record lines]) */
  GCA_ASSERT_DEBUG(old->in_tree && !nb->in_tree && old->stream == nb->stream);
  GCA_ASSERT_DEBUG(nb->uses == NULL);
  p->gen++;
  fbin_set_t *s = set_of(p, (uintptr_t)nb->stream);
  if (s == NULL) {
    t_swap(&p->root, old, nb);
    return;
  }
  int c = gca__fb_class(old->size), nc = gca__fb_class(nb->size);
  if (c == nc && t_fits_in(old, nb, KEY_SIZE_ADDR)) {
    t_replace(&s->root[c], old, nb);
    if (s->min[c] == old)
      s->min[c] = nb;
    return;
  }
  cls_erase(s, c, old);
  cls_insert(s, nc, nb);
}

/* Smallest block of `stream` with key >= (stream, size, addr). */
static gca__block_t *lower_key(const gca__pool_t *p, gca_stream_t stream, size_t size,
                               gca_devptr_t addr) {
  fbin_set_t *s = set_of(p, (uintptr_t)stream);
  if (s == NULL) {
    gca__block_t *b = t_lower(p->root, (uintptr_t)stream, size, addr);
    return b != NULL && b->stream == stream ? b : NULL;
  }
  int c = gca__fb_class(size);
  gca__block_t *m = s->min[c];
  if (m != NULL && !key_less_in(m, (uintptr_t)stream, size, addr, KEY_SIZE_ADDR))
    return m; /* Note [Class minima] */
  gca__block_t *b = t_lower_in(s->root[c], (uintptr_t)stream, size, addr, KEY_SIZE_ADDR);
  if (b != NULL)
    return b;
  c = next_class(s, c + 1);
  return c < 0 ? NULL : s->min[c];
}

gca__block_t *gca__tree_lower_bound(const gca__pool_t *p, gca_stream_t stream, size_t size) {
  return lower_key(p, stream, size, 0);
}

gca__block_t *gca__tree_next(const gca__pool_t *p, const gca__block_t *b) {
  return lower_key(p, b->stream, b->size, b->addr + 1);
}

/* Largest block of `stream` with key < (stream, size, addr). */
static gca__block_t *below_key(const gca__pool_t *p, gca_stream_t stream, size_t size,
                               gca_devptr_t addr) {
  fbin_set_t *s = set_of(p, (uintptr_t)stream);
  if (s == NULL) {
    gca__block_t *b = t_below(p->root, (uintptr_t)stream, size, addr);
    return b != NULL && b->stream == stream ? b : NULL;
  }
  int c = gca__fb_class(size);
  gca__block_t *b = t_below(s->root[c], (uintptr_t)stream, size, addr);
  if (b != NULL)
    return b;
  c = prev_class(s, c);
  return c < 0 ? NULL : t_max(s->root[c]);
}

gca__block_t *gca__tree_below(const gca__pool_t *p, gca_stream_t stream, size_t size) {
  return below_key(p, stream, size, 0);
}

gca__block_t *gca__tree_prev(const gca__pool_t *p, const gca__block_t *b) {
  return below_key(p, b->stream, b->size, b->addr);
}

bool gca__tree_contains(const gca__pool_t *p, const gca__block_t *b) {
  fbin_set_t *s = set_of(p, (uintptr_t)b->stream);
  return s != NULL ? t_contains(s->root[gca__fb_class(b->size)], b) : t_contains(p->root, b);
}

long gca__tree_validate(const gca__pool_t *p) {
  if (p->root != NULL && p->root->parent != NULL)
    return -1;
  long total = t_validate(p->root, NULL, NULL, -1);
  for (int i = 0; total >= 0 && p->bins != NULL && i < GCA__FB_STREAMS; i++) {
    const fbin_set_t *s = p->bins->set[i];
    if (s == NULL)
      continue;
    for (int k = 0; k < i; k++) /* one set per stream */
      if (p->bins->set[k] != NULL && p->bins->set[k]->stream == s->stream && s->n > 0)
        return -1;
    gca__block_t *o = t_lower(p->root, s->stream, 0, 0);
    if (s->n > 0 && o != NULL && (uintptr_t)o->stream == s->stream)
      return -1; /* a stream's blocks in both places */
    long n = 0;
    for (int c = 0; c < GCA__FB_CLASSES; c++) {
      bool bit = (s->words[c >> 6] >> (c & 63)) & 1;
      if (bit != (s->root[c] != NULL))
        return -1;
      if (s->root[c] != NULL && s->root[c]->parent != NULL)
        return -1;
      if (s->min[c] != t_min(s->root[c]))
        return -1; /* Note [Class minima] */
      long k = t_validate(s->root[c], NULL, NULL, c);
      if (k < 0 || (s->root[c] != NULL && (uintptr_t)s->root[c]->stream != s->stream))
        return -1;
      n += k;
    }
    for (int w = 0; w < FB_WORDS; w++)
      if (((s->summary >> w) & 1) != (s->words[w] != 0))
        return -1;
    if ((size_t)n != s->n)
      return -1;
    total += n;
  }
  return total;
}

void gca__tree_fini(gca__pool_t *p) {
  if (p->bins == NULL)
    return;
  for (int i = 0; i < GCA__FB_STREAMS; i++)
    free(p->bins->set[i]);
  free(p->bins);
  p->bins = NULL;
}
