// SPDX-License-Identifier: MIT
// The prefix cache (DESIGN.md section 6, the lockstep rule): full KV blocks of finished sequences
// stay cached, keyed by the chain of their tokens (block b's key covers tokens [0, (b+1)B)), so
// that a new sequence with the same prefix starts from them instead of prefilling it again. Every
// rank keeps its own index over its own shard of the blocks; since every rank executes the same
// commands in the same order, every rank holds the same index and makes the same decisions, and
// rank 0 reads its own to plan (lks_prefix_match), then announces the reuse in a command that every
// rank checks against its index.
//
// The MTP drafter's cache travels with the target's. The drafter's row at position p pairs the
// target's hidden state h_p with token p + 1, so a cached entry holds the target block, the
// drafter block, and h at the block's last position. A sequence that reuses n blocks (L = nB
// positions) gets the target's blocks, the drafter's first n - 1 blocks (their last rows paired
// with tokens inside the prefix), a private copy of the drafter's block n - 1 without its last
// row (that row pairs h_{L-1} with the next token, which this sequence may not share), and
// h_{L-1}, which the drafter pairs with the first token after the prefix: exactly the row a
// prefill would have computed, and nothing else is recomputed. A DFlash drafter's context row at
// p depends on the tokens up to p only (the captured target layers' outputs there), so its cached
// blocks are shared whole, like the target's, and only blocks with every row computed are kept.
//
// Entries whose blocks no sequence holds are evicted least recently used first when the KV pool
// runs out of free blocks. Called from the engine's thread only.
#ifndef LKS_WORKER_PREFIX_H
#define LKS_WORKER_PREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "model/kv_cache.h"

typedef struct lks_prefix lks_prefix;

typedef struct lks_prefix_stats {
  uint64_t lookups, hit_tokens, inserted, evicted;
  int entries;
} lks_prefix_stats;

// An index over kv's blocks (and mkv's, the drafter's, when not NULL: with hidden > 0 the MTP
// layer's, hidden states of `hidden` floats kept per entry; with hidden 0 a DFlash drafter's).
// Installs itself as the caches' eviction hook.
lks_prefix *lks_prefix_new(lks_backend *be, lks_kv_cache *kv, lks_kv_cache *mkv, int hidden);
void lks_prefix_free(lks_prefix *p);

// How many leading full blocks of tok[0, n) are cached, usable as a prefix; with the drafter's
// part complete where a sequence needs it when `drafter` is set (a sequence that speculates with
// the MTP layer). Does not change the index.
int lks_prefix_match(const lks_prefix *p, const int32_t *tok, int n, bool drafter);
// Sequence `slot` (new: length 0) starts with the first n_blocks cached blocks of tok, which
// must all match; with `drafter`, the drafter's blocks too, and hid receives h at the prefix's
// last position.
int lks_prefix_attach(lks_prefix *p, int slot, const int32_t *tok, int n_blocks, bool drafter,
                      lks_tensor hid);
// Caches the full blocks of a finished sequence: len positions of tokens tok in kv, dlen rows of
// the drafter's in mkv (0: none kept). Blocks already cached under the same key are left to the
// sequence (freed with it).
int lks_prefix_insert(lks_prefix *p, int slot, const int32_t *tok, int len, int dlen);
// The hidden state h at the last position of target block `block`, kept for the drafter: the
// engine writes it after each forward that computed that position.
lks_tensor lks_prefix_hidden(lks_prefix *p, int32_t block);
// Drops every entry no sequence holds.
void lks_prefix_clear(lks_prefix *p);
void lks_prefix_stats_get(const lks_prefix *p, lks_prefix_stats *st);

#endif
