// SPDX-License-Identifier: MIT
// glm_moe_dsa's attention block (GLM-5; MODEL.md section 4): multi-head latent attention (MLA)
// with the DeepSeek Sparse Attention (DSA) lightning indexer. Internal to model/: model.c owns
// the model, the residual stream, the MoE FFN and the MTP step, and calls in here for the
// attention of every glm_moe_dsa layer.
//
// Cache layout (lks__mla_kv_new): model layer l (l = 0 for the MTP cache) uses cache layers
// 2l, the latent c (kv_lora_rank, after kv_a_layernorm) + the roped key kpe (qk_rope_head_dim)
// per position, and 2l + 1, the indexer's key (index_head_dim; absent on "shared" layers). One
// block table covers both, so a rollback of a sequence rolls the indexer keys back with the KV.
//
// Sharding: query heads split across ranks (q_b_proj and kv_b_proj by rows of this rank's heads,
// o_proj by columns); the latent projections q_a_proj / kv_a_proj_with_mqa, their norms and the
// whole indexer are replicated. Splitting the latents would need an all-gather before their
// RMSNorm (a third collective per layer) to save 4% of a layer's attention weights; the indexer's
// top-k must be the same on every rank, which a replicated indexer gives without a collective
// (every rank scores the same inputs with the same code). So every rank caches the whole latent.
#ifndef LKS_MLA_H
#define LKS_MLA_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "model/config.h"
#include "model/kv_cache.h"

typedef struct lks_model lks_model;
typedef struct lks__mla lks__mla;
typedef struct lks__mla_layer lks__mla_layer;

// Binds a model tensor as model.c's loader does (checked against config, mapped to the backend,
// counted); rows 0 means a 1-D tensor of cols. The _rows / _cols forms bind a shard.
lks_tensor lks__model_bind(lks_model *m, bool mtp, const char *name, int64_t rows, int64_t cols,
                           bool required);
lks_tensor lks__model_bind_rows(lks_model *m, bool mtp, const char *name, int64_t rows,
                                int64_t cols, int64_t r0, int64_t nr);
lks_tensor lks__model_bind_cols(lks_model *m, bool mtp, const char *name, int64_t rows,
                                int64_t cols, int64_t c0, int64_t nc);

// The attention state for query heads [h0, h0 + n_heads) of a model with n_layers + n_mtp layers.
// NULL with lks_last_error() when the backend lacks the ops glm_moe_dsa needs.
lks__mla *lks__mla_new(lks_backend *be, const lks_config *c, int h0, int n_heads);
void lks__mla_free(lks__mla *a);
// Binds layer l's attention tensors; the returned layer (owned by a) is NULL after a problem
// (reported through the model).
const lks__mla_layer *lks__mla_bind(lks__mla *a, lks_model *m, int l);
// x += o_proj(attention(h)) for layer l (its partial sum at world > 1), h = input_layernorm(x)
// [n, H]; the cache layers of model layer kl (see above) of kv.
int lks__mla_forward(lks__mla *a, int l, lks_tensor x, lks_tensor h, const lks_kv_cache *kv,
                     int kl, const lks_attn_rows *rows, int n);
// Weight bytes (codes and scales when quantized) and parameters of a layer's attention (all of it
// read per token), adding to by_fmt[lks_tensor_wfmt] the bytes of each format when not NULL.
void lks__mla_cost(const lks__mla_layer *L, int64_t *bytes, int64_t *params, int64_t *by_fmt,
                   int64_t *params_by_fmt);
// Cache for the target layers or the MTP layer; f32 values per position in *per_pos.
lks_kv_cache *lks__mla_kv_new(lks_backend *be, const lks_config *c, bool mtp, int block_size,
                              int n_blocks, int max_seqs, int max_seq_len);
int64_t lks__mla_kv_floats_per_pos(const lks_config *c);

#endif
