// SPDX-License-Identifier: MIT
// The prefix cache (see prefix.h): entries in a chained hash table keyed by the token chain, an
// LRU list of entries for eviction, and h at each target block's last position.
#include "worker/prefix.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct entry {
  uint64_t key, parent;    // chain key through this block, and through the one before (0: none)
  int32_t tblock, dblock;  // the target's block, the drafter's (-1: none)
  bool dfull;              // the drafter block's last row is computed
  bool used;
  int32_t chain;           // next entry in the same hash bucket
  int32_t prev, next;      // LRU list, most recent first
} entry;

struct lks_prefix {
  lks_backend *be;
  lks_kv_cache *kv, *mkv;
  bool pairs;        // a drafter row pairs h_p with token p + 1 (MTP), not tokens <= p (DFlash)
  int B, H, cap;
  entry *e;          // [cap]
  int32_t *tok;      // [cap * B] each entry's tokens (an exact match, not just the key)
  int32_t *bucket;   // [n_buckets] first entry, -1 empty
  uint64_t mask;
  int32_t *spare;    // unused entries
  int n_spare;
  int32_t head, tail;
  lks_buf *hid;      // [kv blocks, H] h at each target block's last position
  lks_prefix_stats st;
};

static uint64_t chain_key(uint64_t parent, const int32_t *tok, int B) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < B; i++) {
    h ^= (uint32_t)tok[i];
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;
  return (h ^ (h >> 33)) | 1;  // never 0, which stands for "no parent"
}

static int evict_hook(void *ctx, int need);

lks_prefix *lks_prefix_new(lks_backend *be, lks_kv_cache *kv, lks_kv_cache *mkv, int hidden) {
  lks_prefix *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->be = be;
  p->kv = kv;
  p->mkv = mkv;
  p->B = lks_kv_block_size(kv);
  p->H = hidden;
  p->pairs = mkv && hidden > 0;
  p->cap = lks_kv_n_blocks(kv);
  uint64_t nb = 1;
  while (nb < (uint64_t)p->cap * 2) nb <<= 1;
  p->mask = nb - 1;
  p->e = calloc((size_t)p->cap, sizeof *p->e);
  p->tok = malloc((size_t)p->cap * (size_t)p->B * sizeof *p->tok);
  p->bucket = malloc(nb * sizeof *p->bucket);
  p->spare = malloc((size_t)p->cap * sizeof *p->spare);
  if (p->pairs) p->hid = be->ops->buf_alloc(be, (size_t)p->cap * (size_t)hidden * sizeof(float));
  if (!p->e || !p->tok || !p->bucket || !p->spare || (p->pairs && !p->hid)) {
    lks_set_error(LKS_ENOMEM, "prefix cache: out of memory for %d entries", p->cap);
    lks_prefix_free(p);
    return NULL;
  }
  for (uint64_t i = 0; i < nb; i++) p->bucket[i] = -1;
  for (int i = 0; i < p->cap; i++) p->spare[p->n_spare++] = p->cap - 1 - i;
  p->head = p->tail = -1;
  lks_kv_set_evict(kv, evict_hook, p);
  if (mkv) lks_kv_set_evict(mkv, evict_hook, p);
  return p;
}

void lks_prefix_free(lks_prefix *p) {
  if (!p) return;
  lks_kv_set_evict(p->kv, NULL, NULL);
  if (p->mkv) lks_kv_set_evict(p->mkv, NULL, NULL);
  if (p->hid) p->be->ops->buf_free(p->be, p->hid);
  free(p->e);
  free(p->tok);
  free(p->bucket);
  free(p->spare);
  free(p);
}

// ---- the LRU list and the hash table ----

static void lru_unlink(lks_prefix *p, int32_t i) {
  entry *e = &p->e[i];
  if (e->prev >= 0) p->e[e->prev].next = e->next;
  else p->head = e->next;
  if (e->next >= 0) p->e[e->next].prev = e->prev;
  else p->tail = e->prev;
  e->prev = e->next = -1;
}

static void lru_front(lks_prefix *p, int32_t i) {
  entry *e = &p->e[i];
  e->prev = -1;
  e->next = p->head;
  if (p->head >= 0) p->e[p->head].prev = i;
  p->head = i;
  if (p->tail < 0) p->tail = i;
}

static void touch(lks_prefix *p, int32_t i) {
  lru_unlink(p, i);
  lru_front(p, i);
}

static int32_t find(const lks_prefix *p, uint64_t key, uint64_t parent, const int32_t *tok) {
  for (int32_t i = p->bucket[key & p->mask]; i >= 0; i = p->e[i].chain) {
    const entry *e = &p->e[i];
    if (e->key == key && e->parent == parent &&
        !memcmp(p->tok + (size_t)i * p->B, tok, (size_t)p->B * sizeof *tok))
      return i;
  }
  return -1;
}

static void drop(lks_prefix *p, int32_t i) {
  entry *e = &p->e[i];
  int32_t *link = &p->bucket[e->key & p->mask];
  while (*link != i) link = &p->e[*link].chain;
  *link = e->chain;
  lru_unlink(p, i);
  lks_kv_block_unref(p->kv, e->tblock);
  if (e->dblock >= 0) lks_kv_block_unref(p->mkv, e->dblock);
  e->used = false;
  p->spare[p->n_spare++] = i;
  p->st.entries--;
}

// True when only the cache holds the entry's blocks.
static bool idle(const lks_prefix *p, const entry *e) {
  return lks_kv_block_refs(p->kv, e->tblock) == 1 &&
         (e->dblock < 0 || lks_kv_block_refs(p->mkv, e->dblock) == 1);
}

static int evict_hook(void *ctx, int need) {
  lks_prefix *p = ctx;
  int freed = 0;
  for (int32_t i = p->tail; i >= 0 && freed < need;) {
    int32_t prev = p->e[i].prev;
    if (idle(p, &p->e[i])) {
      drop(p, i);
      p->st.evicted++;
      freed++;
    }
    i = prev;
  }
  // A sequence that started from a prefix holds the target's blocks of its entries but a copy of
  // the drafter's last one, so that entry's drafter block is held by the cache alone while the
  // entry is in use: give such drafter blocks back too (the entry keeps its target block and is
  // then usable without the drafter's part).
  for (int32_t i = p->tail; p->mkv && i >= 0 && freed < need; i = p->e[i].prev) {
    entry *e = &p->e[i];
    if (e->dblock >= 0 && lks_kv_block_refs(p->mkv, e->dblock) == 1) {
      lks_kv_block_unref(p->mkv, e->dblock);
      e->dblock = -1;
      e->dfull = false;
      freed++;
    }
  }
  return freed;
}

void lks_prefix_clear(lks_prefix *p) { evict_hook(p, p->cap); }

// ---- lookups ----

// Entries of the leading blocks of tok that can serve as a prefix, into idx (may be NULL); with
// the drafter's part where `drafter` is set.
static int walk(const lks_prefix *p, const int32_t *tok, int n, bool drafter, int32_t *idx) {
  uint64_t parent = 0;
  int c = 0;
  drafter = drafter && p->mkv;
  for (int b = 0; (b + 1) * p->B <= n; b++) {
    const int32_t *t = tok + (size_t)b * p->B;
    int32_t i = find(p, chain_key(parent, t, p->B), parent, t);
    if (i < 0) break;
    const entry *e = &p->e[i];
    if (drafter && (e->dblock < 0 || (!p->pairs && !e->dfull))) break;
    if (idx) idx[c] = i;
    c = b + 1;
    // A drafter block without its last row can end a prefix, not go on into the next block.
    if (drafter && !e->dfull) break;
    parent = e->key;
  }
  return c;
}

int lks_prefix_match(const lks_prefix *p, const int32_t *tok, int n, bool drafter) {
  return walk(p, tok, n, drafter, NULL);
}

int lks_prefix_attach(lks_prefix *p, int slot, const int32_t *tok, int n_blocks, bool drafter,
                      lks_tensor hid) {
  if (n_blocks <= 0) return 0;
  int32_t *idx = malloc((size_t)n_blocks * 3 * sizeof *idx);
  if (!idx) return lks_set_error(LKS_ENOMEM, "out of memory");
  int32_t *tb = idx + n_blocks, *db = tb + n_blocks;
  int rc = 0, L = n_blocks * p->B;
  drafter = drafter && p->mkv;
  if (walk(p, tok, L, drafter, idx) < n_blocks) {
    rc = lks_set_error(LKS_EFORMAT, "consistency error: slot %d: %d prefix blocks are not cached here",
                       slot, n_blocks);
    goto done;
  }
  for (int i = 0; i < n_blocks; i++) {
    tb[i] = p->e[idx[i]].tblock;
    db[i] = p->e[idx[i]].dblock;
  }
  if ((rc = lks_kv_seq_attach(p->kv, slot, tb, n_blocks, L)) < 0) goto done;
  if (drafter && !p->pairs) {
    // DFlash: every row of the prefix's drafter blocks is this sequence's too.
    if ((rc = lks_kv_seq_attach(p->mkv, slot, db, n_blocks, L)) < 0) goto done;
  } else if (drafter) {
    // The drafter's last block gets its own copy: its last row will pair h_{L-1} with this
    // sequence's next token.
    if ((rc = lks_kv_seq_attach(p->mkv, slot, db, n_blocks, L - 1)) < 0) goto done;
    int32_t mine = lks_kv_block_take(p->mkv);
    if (mine < 0) {
      rc = mine;
      goto done;
    }
    if ((rc = lks_kv_block_copy(p->mkv, mine, db[n_blocks - 1])) < 0) goto done;
    lks_kv_seq_replace_block(p->mkv, slot, n_blocks - 1, mine);
    int32_t row = 0;
    rc = p->be->ops->gather_rows(p->be, hid, lks_prefix_hidden(p, tb[n_blocks - 1]), &row);
    if (rc < 0) goto done;
  }
  // Children before parents, so that a parent is never evicted before its children.
  for (int i = n_blocks - 1; i >= 0; i--) touch(p, idx[i]);
  p->st.lookups++;
  p->st.hit_tokens += (uint64_t)L;
done:
  free(idx);
  return rc;
}

int lks_prefix_insert(lks_prefix *p, int slot, const int32_t *tok, int len, int dlen) {
  uint64_t parent = 0;
  for (int b = 0; (b + 1) * p->B <= len; b++) {
    const int32_t *t = tok + (size_t)b * p->B;
    uint64_t key = chain_key(parent, t, p->B);
    int32_t i = find(p, key, parent, t);
    if (i < 0) {
      if (p->n_spare == 0) break;
      i = p->spare[--p->n_spare];
      entry *e = &p->e[i];
      *e = (entry){key, parent, lks_kv_seq_block(p->kv, slot, b), -1, false, true, -1, -1, -1};
      memcpy(p->tok + (size_t)i * p->B, t, (size_t)p->B * sizeof *t);
      lks_kv_block_ref(p->kv, e->tblock);
      e->chain = p->bucket[key & p->mask];
      p->bucket[key & p->mask] = i;
      lru_front(p, i);
      p->st.inserted++;
      p->st.entries++;
    }
    // The drafter's rows of this block: with pairs, all but the last make it usable at the end
    // of a prefix, the last one too for a prefix that goes on past this block; without, only
    // all of them. A fuller block replaces a less full one.
    entry *e = &p->e[i];
    bool d_full = dlen >= (b + 1) * p->B, d_some = p->pairs ? dlen >= (b + 1) * p->B - 1 : d_full;
    if (p->mkv && d_some && (e->dblock < 0 || (!e->dfull && d_full))) {
      if (e->dblock >= 0) lks_kv_block_unref(p->mkv, e->dblock);
      e->dblock = lks_kv_seq_block(p->mkv, slot, b);
      lks_kv_block_ref(p->mkv, e->dblock);
      e->dfull = d_full;
    }
    touch(p, i);
    parent = key;
  }
  return 0;
}

lks_tensor lks_prefix_hidden(lks_prefix *p, int32_t block) {
  return lks_tensor_rows(lks_tensor_2d(p->hid, 0, LKS_F32, p->cap, p->H), block, 1);
}

void lks_prefix_stats_get(const lks_prefix *p, lks_prefix_stats *st) { *st = p->st; }
