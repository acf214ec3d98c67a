// SPDX-License-Identifier: MIT
// The DFlash block drafter (block-diffusion drafting, arXiv 2602.06036; the checkpoint format of
// z-lab/dflash's DFlashDraftModel): a small dense transformer that drafts block_size - 1 tokens in
// one forward, conditioned on hidden states captured from some of the target's layers.
//
// Architecture, as implemented (z-lab/dflash where public loaders differ):
//   - context row p (one per committed position): f_p = [x_p after target layer L1 ; after L2 ;
//     ...] for dflash_config.target_layer_ids (the residual stream, HF hidden_states[L + 1]),
//     c_p = hidden_norm(fc f_p). Every drafter layer l keeps K_l = k_norm(Wk_l c_p) (RoPE at p)
//     and V_l = Wv_l c_p in its cache: no input_layernorm on c, the same c for every layer.
//   - a block at position s: tokens [t_s (the last verified token), mask, ..., mask] at s ..
//     s + B - 1, embedded with the target's embed_tokens. Per layer (Qwen3-style, dense SwiGLU):
//     h = input_layernorm(x); q, k, v from h (q_norm, k_norm before RoPE, full half-split RoPE);
//     the block attends to every context row (< s) and to all B block rows (not causal within the
//     block); x += Wo attn; x += mlp(post_attention_layernorm(x)).
//   - drafts: arg-max of the target's lm_head(norm(x)) at block rows 1 .. B - 1.
//   - the block's own K/V rows are dropped after the forward; after a verify the accepted rows'
//     features become context rows.
//
// The drafter is split like the target (DESIGN.md section 5): each rank holds its query heads
// (rows of q_proj, columns of o_proj), their KV heads (rows of k_proj and v_proj, and only those
// in its context cache) and its rows of the FFN (gate and up by rows, down by columns), with one
// all-reduce after each layer's attention and one after its FFN; fc and the norms are replicated.
// The lm_head product is the target's, vocabulary-split, so the arg-max is a collective too. A
// forward of the drafter is therefore a collective call at world > 1.
//
// A drafter is used from one thread at a time, by the engine of its target model.
#ifndef LKS_DFLASH_H
#define LKS_DFLASH_H

#include <stdint.h>

#include "core/backend.h"
#include "model/kv_cache.h"

typedef struct lks_model lks_model;
typedef struct lks_dflash lks_dflash;

enum { LKS_DFLASH_MAX_CAPTURE = 8, LKS_DFLASH_MAX_DRAFTS = 16 };  // the latter: LKS_MAX_DRAFTS

// Loads this rank's shard of the drafter in DIR (config.json with dflash_config,
// model.safetensors) for `target` (split as the target is), checking every tensor, that its sizes
// fit the target (hidden size, vocabulary, layer ids) and that it splits the target's world size
// ways. The weights are mapped, not copied. NULL on failure with lks_last_error().
lks_dflash *lks_dflash_load(const char *dir, lks_model *target);
void lks_dflash_free(lks_dflash *d);

int lks_dflash_block_size(const lks_dflash *d);
int lks_dflash_mask_token(const lks_dflash *d);
// The target layers whose outputs the drafter reads, in the order of its fc's columns.
int lks_dflash_capture_layers(const lks_dflash *d, const int **layers);
// Floats of one context row's features: n_capture * hidden.
int lks_dflash_feature_cols(const lks_dflash *d);
// Weight bytes and parameters (for logs and bench).
int64_t lks_dflash_weight_bytes(const lks_dflash *d);

// The drafter's cache (context rows only) for max_seqs sequences.
lks_kv_cache *lks_dflash_kv_new(const lks_dflash *d, int block_size, int n_blocks, int max_seqs,
                                int max_seq_len);

// Appends n context rows: row i of feats [n, feature_cols] is position pos[i] of sequence seq[i],
// which the cache must already hold (lks_kv_seq_resize).
int lks_dflash_context(lks_dflash *d, lks_kv_cache *kv, int n, const int32_t *seq,
                       const int32_t *pos, lks_tensor feats);

// One block forward for ns sequences: sequence seq[i]'s block starts at start[i] (its context is
// positions < start[i]) with token first[i]. The cache must hold start[i] + block_size positions
// of each (the block's rows are written there; the caller drops them afterwards). *logits:
// [ns * (block_size - 1), V_local], row i * (B - 1) + j the logits of draft j + 1 of sequence i
// (this rank's vocabulary rows; lks_model_argmax gives the tokens).
int lks_dflash_block(lks_dflash *d, lks_kv_cache *kv, int ns, const int32_t *seq,
                     const int32_t *start, const int32_t *first, lks_tensor *logits);

#endif
