// SPDX-License-Identifier: MIT
// The paged KV cache: per layer, K and V pools of fixed-size blocks in backend memory, and per
// sequence slot a block table on the host. Blocks are handed out from a LIFO free list, so the
// same sequence of calls gives the same blocks on every rank (the lockstep rule of DESIGN.md
// section 2). Rolling back a sequence (rejected speculative rows) only moves its length; blocks
// past the new length are released. Blocks are reference counted: sequences that share a cached
// prefix hold the same blocks, and a prefix cache (worker/prefix.c) holds the blocks it keeps;
// a block returns to the free list when its last holder lets go. When a sequence needs blocks
// and none is free, the eviction hook frees blocks that only a cache holds.
#ifndef LKS_KV_CACHE_H
#define LKS_KV_CACHE_H

#include "core/backend.h"

typedef struct lks_kv_cache lks_kv_cache;

// n_blocks blocks of block_size positions, for at most max_seqs sequences of at most
// max_seq_len positions each, K and V of dtype (LKS_F32 or LKS_BF16). NULL on failure.
lks_kv_cache *lks_kv_new(lks_backend *be, int n_layers, int n_kv_heads, int head_dim,
                         lks_dtype dtype, int block_size, int n_blocks, int max_seqs,
                         int max_seq_len);
// The same with one pool per layer of width[l] f32 values per position and no V pool (k only;
// n_kv_heads 1, head_dim width[l]); a width of 0 gives that layer no pool. The MLA cache of
// glm_moe_dsa: every layer's latent + rope key, and its indexer's keys, under one block table,
// so that resizing a sequence (a rollback) moves them together.
lks_kv_cache *lks_kv_new_widths(lks_backend *be, int n_layers, const int *width, int block_size,
                                int n_blocks, int max_seqs, int max_seq_len);
void lks_kv_free(lks_kv_cache *kv);

// A free sequence slot (>= 0), or LKS_EFULL.
int lks_kv_seq_alloc(lks_kv_cache *kv);
// Allocates the given free slot (the coordinator chooses slot ids; every rank claims the same).
int lks_kv_seq_claim(lks_kv_cache *kv, int seq);
void lks_kv_seq_free(lks_kv_cache *kv, int seq);
int lks_kv_max_seqs(const lks_kv_cache *kv);
// Positions a sequence holds.
int lks_kv_seq_len(const lks_kv_cache *kv, int seq);
// Makes room for positions [0, len) of seq (allocating blocks), and sets its length to len.
int lks_kv_seq_resize(lks_kv_cache *kv, int seq, int len);

// Fills rows->slot for rows (seq, pos) whose positions are already reserved, and the rest of
// rows (block table). slot_out must hold rows->n entries.
int lks_kv_rows(const lks_kv_cache *kv, lks_attn_rows *rows, int32_t *slot_out);
const lks_kv_layer *lks_kv_layer_at(const lks_kv_cache *kv, int layer);
int lks_kv_free_blocks(const lks_kv_cache *kv);
int lks_kv_block_size(const lks_kv_cache *kv);
int lks_kv_n_layers(const lks_kv_cache *kv);
int lks_kv_n_blocks(const lks_kv_cache *kv);

// ---- shared blocks (the prefix cache) ----
// Holders of block b: take one (ref), let one go (unref: the block is free when none is left),
// count them.
void lks_kv_block_ref(lks_kv_cache *kv, int32_t b);
void lks_kv_block_unref(lks_kv_cache *kv, int32_t b);
int lks_kv_block_refs(const lks_kv_cache *kv, int32_t b);
// Block i of a sequence's table.
int32_t lks_kv_seq_block(const lks_kv_cache *kv, int seq, int i);
// A new sequence (length 0, no blocks) starts with the given n blocks, holding each, at length
// len (within the last of them).
int lks_kv_seq_attach(lks_kv_cache *kv, int seq, const int32_t *blocks, int n, int len);
// A free block, held once (evicting if needed), or LKS_EFULL.
int32_t lks_kv_block_take(lks_kv_cache *kv);
// Copies block src's K and V (every layer) into block dst.
int lks_kv_block_copy(lks_kv_cache *kv, int32_t dst, int32_t src);
// Puts block b (already held for the sequence) at index i of its table, letting go of the old one.
void lks_kv_seq_replace_block(lks_kv_cache *kv, int seq, int i, int32_t b);
// The eviction hook: asked to free at least `need` blocks; returns how many it freed.
void lks_kv_set_evict(lks_kv_cache *kv, int (*evict)(void *ctx, int need), void *ctx);
size_t lks_kv_bytes(const lks_kv_cache *kv);

#endif
