// SPDX-License-Identifier: MIT
// The GLM-4.x MoE model (MODEL.md sections 2-3): weights bound to a backend, the forward of a
// batch of new tokens over a paged KV cache (prefill and decode are the same call), and the MTP
// draft step with its own KV cache. All tensors live in backend buffers; the model code only
// passes views and small host control arrays (token ids, positions, routing) to backend ops.
//
// Outputs are views into buffers the model owns, valid until the next call of the same function.
// A model is used from one thread at a time.
#ifndef LKS_MODEL_H
#define LKS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/comm.h"
#include "model/config.h"
#include "model/kv_cache.h"

typedef struct lks_model lks_model;
typedef struct lks_dflash lks_dflash;

// One forward: n rows, row i is token tokens[i] of sequence seq[i] at position pos[i]. The
// sequences must already hold those positions in the KV cache (lks_kv_seq_resize). Logits are
// computed for the n_out rows listed in out_rows.
typedef struct lks_batch {
  int n;
  const int32_t *tokens;    // [n]
  const int32_t *pos;       // [n]
  const int32_t *seq;       // [n]
  int n_out;
  const int32_t *out_rows;  // [n_out]
} lks_batch;

// Problems found while checking a checkpoint against its config, one call per problem.
typedef void (*lks_problem_fn)(void *ctx, const char *problem);

// Loads DIR (config.json + safetensors) onto `be`, checking every tensor's presence, dtype and
// shape against config.json. With a `problem` callback every problem is reported (lockstep
// inspect); the load fails if there is any. NULL on failure, with lks_last_error().
lks_model *lks_model_load(const char *dir, lks_backend *be, lks_problem_fn problem, void *ctx);

// How the routed experts are shared out between ranks (--experts-split):
//   LKS_EXPERTS_BLOCKS: each rank holds a contiguous block of whole experts, and a token's top-k
//     fall unevenly on the ranks (8 of 32 on two ranks: 1.9 experts apart on average), so the
//     lighter rank waits at the layer's all-reduce;
//   LKS_EXPERTS_ROWS: every rank holds its rows of every expert's intermediate dimension (gate
//     and up by rows, down by columns, as the dense FFN): each rank does 1/world of every
//     token's experts, in twice the products of half the size (at world 2). Refused naming the
//     tensor where the rows do not fall on the experts' FP8 blocks or NVFP4 groups, and on a
//     backend that routes on its device (cuda);
//   LKS_EXPERTS_AUTO (the default): rows where they can be had (a backend without device
//     routing, moe_intermediate_size divisible by the world, and the share of it a multiple of
//     128 for FP8 blocks or of 16 for NVFP4), else blocks.
typedef enum { LKS_EXPERTS_BLOCKS, LKS_EXPERTS_ROWS, LKS_EXPERTS_AUTO } lks_experts_split;

// "blocks", "rows" or "auto"; LKS_ECONFIG naming the flag otherwise.
int lks_model_experts_split_parse(const char *name, lks_experts_split *s);

// Loads this rank's shard (DESIGN.md section 5) for comm->rank of comm->world: its attention
// heads and KV heads, its rows / columns of the dense FFN and shared expert, its share of the
// routed experts (`split`), its vocabulary rows of lm_head; the rest replicated. Only those bytes
// are mapped into backend buffers. Shapes that cannot be split comm->world ways are refused with
// a message naming the field. The model keeps `comm` (not owned) for its collectives: every
// forward is then a collective call that every rank must make in the same order.
lks_model *lks_model_load_shard(const char *dir, lks_backend *be, lks_comm *comm,
                                lks_experts_split split, lks_problem_fn problem, void *ctx);

// Whether this shard holds its rows of every routed expert (LKS_EXPERTS_ROWS at world > 1), not
// a block of whole experts.
bool lks_model_experts_by_rows(const lks_model *m);

// Checks that cfg can be split `world` ways; 0 or LKS_ECONFIG naming the field.
int lks_model_check_split(const lks_config *cfg, int world);
void lks_model_free(lks_model *m);
const lks_config *lks_model_config(const lks_model *m);
bool lks_model_has_mtp(const lks_model *m);
lks_backend *lks_model_backend(const lks_model *m);

// The element type of the KV caches made after it (LKS_F32, the default, or LKS_BF16: half the
// memory and the bytes attention reads, each K and V value rounded to nearest even). Refuses
// others; glm_moe_dsa's latent cache stays F32 (logged).
int lks_model_set_kv_dtype(lks_model *m, lks_dtype t);
// The type --kv-dtype names ("f32" or "bf16"), or LKS_ECONFIG naming the option.
int lks_model_kv_dtype_parse(const char *name, lks_dtype *t);
// A KV cache shaped for the target layers (or the MTP layer).
lks_kv_cache *lks_model_kv_new(const lks_model *m, bool mtp, int block_size, int n_blocks,
                               int max_seqs, int max_seq_len);

// Target forward. *logits: [n_out, V_local] f32, this rank's vocabulary rows (all of them at
// world 1; see lks_model_argmax / lks_model_logits_host). *hidden: [n, H], the final-normed
// hidden state of every row (what fed lm_head; the MTP input), the same on every rank. Either
// output pointer may be NULL. A collective at world > 1.
int lks_model_forward(lks_model *m, lks_kv_cache *kv, const lks_batch *b, lks_tensor *logits,
                      lks_tensor *hidden);

// One MTP draft step for b->n rows (MODEL.md section 3): row i combines token b->tokens[i] with
// hidden row i of `h_in` ([n, H]: the target's final-normed hidden, or the carry of a previous
// step) and runs the MTP layer at b->pos[i] in mtp_kv. *logits: [n_out, V_local], the rows
// b->out_rows (this rank's vocabulary shard, as for lks_model_forward).
// *carry: [n_out, H], shared_head.norm(z) of the same rows, the hidden for a chained step (may
// alias h_in). Rows that are not outputs (all of them when neither is asked for) only leave
// their K and V in mtp_kv, without the rest of the layer (glm4_moe; glm_moe_dsa runs it whole).
int lks_model_mtp(lks_model *m, lks_kv_cache *mtp_kv, const lks_batch *b, lks_tensor h_in,
                  lks_tensor *logits, lks_tensor *carry);

// Greedy tokens of each row of `logits` (from lks_model_forward / lks_model_mtp): the global
// arg-max over the vocabulary shards (ties: the lowest id), into host idx[logits.rows].
// A collective at world > 1.
int lks_model_argmax(lks_model *m, lks_tensor logits, int32_t *idx);
// All V logits of each row, on every rank, into host dst [logits.rows, V]. A collective.
int lks_model_logits_host(lks_model *m, lks_tensor logits, float *dst);

// ---- for a DFlash drafter (model/dflash.h) ----

// Attaches a DFlash drafter: the model owns it from then on (freed with the model) and every
// target forward from then on keeps the outputs of the layers it reads (lks_model_captured).
// The drafter must have been loaded for this model.
int lks_model_attach_dflash(lks_model *m, lks_dflash *d);
// The attached drafter, or NULL.
lks_dflash *lks_model_dflash(const lks_model *m);
// The captured features of the last lks_model_forward: [n rows, n_capture * H], row i the
// residual stream after each captured layer, concatenated in the drafter's order. A view into a
// buffer the model owns, valid until the next forward.
lks_tensor lks_model_captured(const lks_model *m);
// This rank and the world size the model is split over (0 and 1 without a communicator).
void lks_model_shard_rank(const lks_model *m, int *rank, int *world);
// Before a sharded block adds its partial result into the residual x: at world > 1 only rank 0
// keeps x, the others start from zero, so that lks_model_allreduce adds x exactly once.
int lks_model_partial_start(lks_model *m, lks_tensor x);
// x (f32) = the sum of every rank's x, in place (a no-op at world 1). A collective; what and
// layer name it in a timeout's message.
int lks_model_allreduce(lks_model *m, lks_tensor x, const char *what, int layer);
// out [n, H] = the embeddings of ids (replicated on every rank).
int lks_model_embed(lks_model *m, lks_tensor out, const int32_t *ids);
// *logits [x.rows, V_local] = lm_head x (this rank's vocabulary rows, as lks_model_forward's),
// in a buffer the model owns, valid until the next call of this or lks_model_mtp.
int lks_model_lm_head(lks_model *m, lks_tensor x, lks_tensor *logits);

// Bytes of weights this rank holds (its share; the whole model at world 1).
int64_t lks_model_loaded_bytes(const lks_model *m);

// Weight formats and groups of weights, for the accounting below.
enum { LKS_WFMT_F32, LKS_WFMT_F16, LKS_WFMT_BF16, LKS_WFMT_FP8_CHANNEL, LKS_WFMT_FP8_BLOCK,
       LKS_WFMT_NVFP4, LKS_N_WFMT };
enum { LKS_WG_ATTN, LKS_WG_DENSE, LKS_WG_ROUTER, LKS_WG_EXPERTS, LKS_WG_SHARED, LKS_WG_LM_HEAD,
       LKS_WG_MTP, LKS_N_WG };
extern const char *const lks_wfmt_names[LKS_N_WFMT];
extern const char *const lks_wgroup_names[LKS_N_WG];
// The LKS_WFMT_* of a bound weight.
int lks_tensor_wfmt(lks_tensor t);

// Per-token accounting of a model (for inspect and bench).
typedef struct lks_model_stats {
  int64_t params_total;       // every tensor, MTP included
  int64_t params_mtp;         // the MTP layer's own tensors
  int64_t params_active;      // per target token: all but the unselected routed experts
  int64_t bytes_per_token;    // weight bytes one decode step reads (target, one row of embed)
  int64_t bytes_mtp_step;     // weight bytes one MTP draft step reads
  int64_t kv_bytes_per_pos;   // KV cache bytes per position over all target layers (its dtype)
  int64_t weight_bytes;       // bytes of all weights
  int64_t bytes_per_token_fmt[LKS_N_WFMT];  // bytes_per_token by weight format
  int64_t params_per_token_fmt[LKS_N_WFMT];  // the weights those bytes hold (one embedding row)
  unsigned group_fmts[LKS_N_WG];            // per group of weights: bit f set if format f is used
  char quant[64];                           // the checkpoint's declared quantization, or "none"
} lks_model_stats;
void lks_model_stats_get(const lks_model *m, lks_model_stats *s);

#endif
