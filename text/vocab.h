// SPDX-License-Identifier: MIT
// The lookup tables of a tokenizer (see tokenizer_impl.h): the arena of token bytes, the
// bytes -> id map of the byte-level vocabulary, the (left, right) -> merge hash, and the byte
// tries that find added tokens longest-first. Built once while loading; lookups only read, so
// they may run on any number of threads at once.
#ifndef LKS_TEXT_VOCAB_H
#define LKS_TEXT_VOCAB_H

#include "text/tokenizer_impl.h"

// Appends d[0..n) to t->arena (capacity *cap, grown as needed); *off where it starts.
int lks__vocab_arena_add(lks_tokenizer *t, size_t *cap, const char *d, size_t n, uint32_t *off);

// The byte-level vocabulary entry whose bytes are s[0..n): its id, or -1.
int32_t lks__vocab_get(const lks_tokenizer *t, const char *s, size_t n);
// Builds the map over the ids flagged LKS__F_BYTELEVEL (n_entries of them); two ids with the
// same bytes are LKS_EFORMAT.
int lks__vocab_build(lks_tokenizer *t, int n_entries);

static inline uint32_t lks__vocab_merge_hash(uint64_t key, uint32_t mask) {
  return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}
// The merge of ids a and b, or NULL when they do not merge.
static inline const lks__merge_slot *lks__vocab_merge_get(const lks_tokenizer *t, int32_t a,
                                                          int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (uint32_t i = lks__vocab_merge_hash(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
    const lks__merge_slot *m = &t->merges[i];
    if (m->key == key) return m;
    if (m->key == UINT64_MAX) return NULL;
  }
}
// Records that a and b merge into id at `rank` (the table must have a free slot).
void lks__vocab_merge_put(lks_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id);

void lks__vocab_trie_init(lks__trie *tr);
// Adds s[0..n) as added token `token`; the first of equal contents wins.
int lks__vocab_trie_add(lks__trie *tr, const char *s, size_t n, int32_t token);
// The longest added token starting at s[0..n) (n > 0): its index, *mlen its length; -1 when none.
int32_t lks__vocab_trie_match(const lks__trie *tr, const char *s, size_t n, size_t *mlen);

#endif
