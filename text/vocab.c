// SPDX-License-Identifier: MIT
// Tokenizer lookup tables (see vocab.h): open addressing with linear probing, power-of-two
// sizes at most half full.
#include "text/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static inline uint64_t hash_bytes(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    s += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, s, n);
  h = (h ^ w) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

int lks__vocab_arena_add(lks_tokenizer *t, size_t *cap, const char *d, size_t n, uint32_t *off) {
  if (t->arena_n + n > UINT32_MAX) return lks_set_error(LKS_EFORMAT, "%s: vocabulary too large", t->what);
  if (t->arena_n + n > *cap) {
    size_t c = *cap ? *cap : 1 << 16;
    while (c < t->arena_n + n) c *= 2;
    char *a = realloc(t->arena, c);
    if (!a) return lks_set_error(LKS_ENOMEM, "out of memory");
    t->arena = a;
    *cap = c;
  }
  if (n) memcpy(t->arena + t->arena_n, d, n);
  *off = (uint32_t)t->arena_n;
  t->arena_n += n;
  return 0;
}

int32_t lks__vocab_get(const lks_tokenizer *t, const char *s, size_t n) {
  if (!t->vocab.slot) return -1;
  uint64_t h = hash_bytes(s, n);
  for (uint32_t i = (uint32_t)h & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
    int32_t id = t->vocab.slot[i];
    if (id < 0) return -1;
    if (t->len[id] == n && memcmp(t->arena + t->off[id], s, n) == 0) return id;
  }
}

int lks__vocab_build(lks_tokenizer *t, int n_entries) {
  uint32_t cap = 16;
  while (cap < (uint32_t)n_entries * 2u) cap *= 2;
  t->vocab.slot = malloc((size_t)cap * sizeof *t->vocab.slot);
  if (!t->vocab.slot) return lks_set_error(LKS_ENOMEM, "out of memory");
  memset(t->vocab.slot, 0xFF, (size_t)cap * sizeof *t->vocab.slot);
  t->vocab.mask = cap - 1;
  for (int id = 0; id < t->n_ids; id++) {
    if (!(t->flags[id] & LKS__F_BYTELEVEL)) continue;
    const char *s = t->arena + t->off[id];
    uint64_t h = hash_bytes(s, t->len[id]);
    uint32_t i = (uint32_t)h & t->vocab.mask;
    for (;; i = (i + 1) & t->vocab.mask) {
      int32_t o = t->vocab.slot[i];
      if (o < 0) break;
      if (t->len[o] == t->len[id] && memcmp(t->arena + t->off[o], s, t->len[id]) == 0) break;
    }
    if (t->vocab.slot[i] >= 0)
      return lks_set_error(LKS_EFORMAT, "%s: model.vocab: ids %d and %d are the same token", t->what,
                           t->vocab.slot[i], id);
    t->vocab.slot[i] = id;
  }
  return 0;
}

void lks__vocab_merge_put(lks_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (uint32_t i = lks__vocab_merge_hash(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
    lks__merge_slot *m = &t->merges[i];
    if (m->key == key || m->key == UINT64_MAX) {
      // A repeated pair takes its last rank, as in both the Rust and the JS implementations.
      m->key = key;
      m->rank = rank;
      m->id = id;
      return;
    }
  }
}

int lks__vocab_trie_add(lks__trie *tr, const char *s, size_t n, int32_t token) {
  if (n == 0) return 0;
  int32_t parent = -1;  // -1: the root, whose children are tr->root[byte]
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)s[i];
    int32_t c = parent < 0 ? tr->root[b] : tr->n[parent].child;
    while (c >= 0 && tr->n[c].byte != b) c = tr->n[c].sibling;
    if (c < 0) {
      if (tr->count == tr->cap) {
        int cap = tr->cap ? tr->cap * 2 : 256;
        lks__trie_node *p = realloc(tr->n, (size_t)cap * sizeof *p);
        if (!p) return lks_set_error(LKS_ENOMEM, "out of memory");
        tr->n = p;
        tr->cap = cap;
      }
      c = tr->count++;
      int32_t *link = parent < 0 ? &tr->root[b] : &tr->n[parent].child;
      tr->n[c] = (lks__trie_node){.child = -1, .sibling = *link, .token = -1, .byte = b};
      *link = c;
    }
    parent = c;
  }
  if (tr->n[parent].token < 0) tr->n[parent].token = token;  // the first of equal contents wins
  return 0;
}

// The longest added token starting at s[0..n): its index, *mlen its length; -1 when none.
int32_t lks__vocab_trie_match(const lks__trie *tr, const char *s, size_t n, size_t *mlen) {
  int32_t best = -1;
  int32_t c = tr->root[(unsigned char)s[0]];
  size_t i = 0;
  while (c >= 0) {
    if (tr->n[c].token >= 0) {
      best = tr->n[c].token;
      *mlen = i + 1;
    }
    if (++i >= n) break;
    unsigned char b = (unsigned char)s[i];
    c = tr->n[c].child;
    while (c >= 0 && tr->n[c].byte != b) c = tr->n[c].sibling;
  }
  return best;
}

void lks__vocab_trie_init(lks__trie *tr) {
  memset(tr, 0, sizeof *tr);
  for (int i = 0; i < 256; i++) tr->root[i] = -1;
}
