// SPDX-License-Identifier: MIT
// The compute backend interface (DESIGN.md section 9). A backend owns device memory (lks_buf,
// opaque: the model code never dereferences it) and runs the ops of the GLM forward on views of
// that memory (lks_tensor). Small control data — token ids, positions, KV slots, block tables,
// expert routing — travels as host arrays in the op arguments; a device backend copies it in.
// Results the host needs (routing, arg-max, logits for sampling) come back through explicit
// copies (to_host) or host output arrays named as such.
//
// Implementations: `cpu` (always built; the reference the others are tested against) and
// `cuda` (cuda/backend_cuda.c, in builds with CUDA). All ops are called from one thread (the thread that created the backend); the CPU
// backend parallelises internally over its thread pool. Every op returns 0 or a negative LKS_E*.
#ifndef LKS_BACKEND_H
#define LKS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct lks_buf lks_buf;
typedef struct lks_backend lks_backend;

// How a weight's elements are stored (model/quant.h reads them from checkpoints). Dequantized,
// element (r, c) is:
//   LKS_Q_NONE       the F32 / BF16 / F16 value itself
//   LKS_Q_FP8_ROW    e4m3(code) * scale[r]                      (scales F32 [rows])
//   LKS_Q_FP8_BLOCK  e4m3(code) * scale[r / 128][c / 128]       (F32 [ceil(rows/128), sld])
//   LKS_Q_NVFP4      e2m1(code) * e4m3(scale[r][c / 16]) * qglobal   (E4M3 bytes [rows, sld])
// Row views of FP8_BLOCK weights start on a multiple of 128 rows.
typedef enum { LKS_Q_NONE, LKS_Q_FP8_ROW, LKS_Q_FP8_BLOCK, LKS_Q_NVFP4, LKS_N_QSCHEMES } lks_qscheme;
enum { LKS_Q_FP8_BLOCK_SIZE = 128, LKS_Q_NVFP4_GROUP = 16 };
// "bf16"/"f32"/"f16" for plain weights (by dtype), else "fp8-channel", "fp8-block", "nvfp4".
const char *lks_qscheme_name(lks_qscheme q, lks_dtype dt);

// A 2-D row-major view into a buffer: element (r, c) is at byte
// offset + (r * ld + c) * dtype_size. 1-D tensors have rows = 1. `ld` >= cols lets a view select
// columns (a half of a concatenation, a column shard of a weight). Quantized weights
// (qs != LKS_Q_NONE) have F8_E4M3 or F4_E2M1X2 codes in `buf` (for the latter, `ld` counts
// bytes) and their scales in `sbuf` from byte `soff`, `sld` entries a scale row. They may also
// carry, in `sbuf` from byte `foff` (0: none), the flags of lks_e4m3_exp0_chunks
// (lks_e4m3_chunks(cols) a row), which the CPU kernels read.
typedef struct lks_tensor {
  lks_buf *buf;
  size_t offset;  // bytes
  lks_dtype dtype;
  int64_t rows, cols, ld;
  lks_qscheme qs;
  lks_buf *sbuf;
  size_t soff;
  int64_t sld;
  float qglobal;  // NVFP4: the per-tensor multiplier
  size_t foff;
} lks_tensor;

static inline lks_tensor lks_tensor_2d(lks_buf *buf, size_t offset, lks_dtype dt, int64_t rows,
                                       int64_t cols) {
  lks_tensor t = {buf, offset, dt, rows, cols, cols, LKS_Q_NONE, NULL, 0, 0, 0.0f, 0};
  return t;
}

// Bytes a weight occupies: its elements, plus its scales when quantized.
int64_t lks_weight_bytes(lks_tensor t);

// Rows [r0, r0 + n) of t.
lks_tensor lks_tensor_rows(lks_tensor t, int64_t r0, int64_t n);
// Columns [c0, c0 + n) of t (a strided view).
lks_tensor lks_tensor_cols(lks_tensor t, int64_t c0, int64_t n);
// The same contiguous memory seen as [rows, cols] (rows * cols must match; t must be contiguous).
lks_tensor lks_tensor_reshape(lks_tensor t, int64_t rows, int64_t cols);

// One layer's paged KV cache: K and V pools of [n_blocks * block_size, n_kv_heads * head_dim]
// elements of dtype (F32, or BF16: each value rounded to nearest even as it is stored).
typedef struct lks_kv_layer {
  lks_buf *k, *v;
  int n_blocks, block_size, n_kv_heads, head_dim;
  lks_dtype dtype;
} lks_kv_layer;

// Where each row of a forward batch sits: its sequence (an index into block_table), position and
// KV slot (block * block_size + offset). Host arrays.
typedef struct lks_attn_rows {
  int n;
  const int32_t *seq;          // [n]
  const int32_t *pos;          // [n]
  const int32_t *slot;         // [n]
  const int32_t *block_table;  // [n_seqs, max_blocks]
  int max_blocks;
} lks_attn_rows;

typedef enum { LKS_ROPE_HALF_SPLIT, LKS_ROPE_INTERLEAVED } lks_rope_layout;

typedef struct lks_route_params {
  int n_experts, top_k, n_group, topk_group;
  bool norm_topk_prob;
  float scaling;
} lks_route_params;

// The sizes of glm_moe_dsa's multi-head latent attention for one rank (mla_attention).
typedef struct lks_mla_dims {
  int n_heads;   // this rank's query heads
  int nope, rope, v_dim;  // qk_nope_head_dim, qk_rope_head_dim, v_head_dim
  int latent;    // kv_lora_rank; a cache row is [latent | rope key]
  float scale;   // softmax scale, 1/sqrt(nope + rope)
} lks_mla_dims;

// One product of the matmuls op: out = x W^T + bias (bias.buf NULL: none).
typedef struct lks_matmul_part {
  lks_tensor out, w, bias;
} lks_matmul_part;
enum { LKS_MATMULS_MAX = 4 };  // products a matmuls call takes at most

// One expert of a MoE layer for the experts op: its weights and the rows it runs on.
typedef struct lks_expert_call {
  lks_tensor gate, up, down;  // [I, H], [I, H], [H, I]
  const int32_t *rows;        // [n] rows of x (and out), each at most once; NULL: rows 0..n-1
  const float *weights;       // [n]; NULL: 1
  int n;
} lks_expert_call;
// The routed experts of one MoE layer, for the moe op: expert e's weights are gate[e * stride],
// up[e * stride], down[e * stride] (stride in lks_tensor units: arrays of structs of tensors);
// only the experts [e0, e0 + n) are bound (this rank's block).
typedef struct lks_moe_experts {
  const lks_tensor *gate, *up, *down;
  size_t stride;
  int e0, n;
} lks_moe_experts;

typedef struct lks_backend_ops {
  const char *name;
  void (*free)(lks_backend *be);

  // Memory. buf_wrap_host makes a read-only buffer of host memory that outlives the buffer (the
  // mmapped weights): the CPU backend wraps it without a copy, a device backend uploads it.
  lks_buf *(*buf_alloc)(lks_backend *be, size_t bytes);
  lks_buf *(*buf_wrap_host)(lks_backend *be, const void *host, size_t bytes);
  // The same for a strided slice of host memory: `rows` runs of row_bytes, stride_bytes apart
  // (a column shard of a weight). Sets *ld_bytes to the row stride of the result: the CPU backend
  // wraps in place (stride_bytes), a device backend packs the rows (row_bytes).
  lks_buf *(*buf_wrap_host_2d)(lks_backend *be, const void *host, int64_t rows, size_t row_bytes,
                               size_t stride_bytes, size_t *ld_bytes);
  // The raw address of a buffer, for the collectives only (host memory on the CPU backend,
  // device memory on a GPU backend); model code never dereferences it.
  void *(*buf_ptr)(lks_backend *be, lks_buf *b);
  void (*buf_free)(lks_backend *be, lks_buf *b);
  int (*to_host)(lks_backend *be, void *dst, const lks_buf *src, size_t offset, size_t bytes);
  int (*from_host)(lks_backend *be, lks_buf *dst, size_t offset, const void *src, size_t bytes);

  // Sets every element of t (f32) to zero.
  int (*zero)(lks_backend *be, lks_tensor t);
  // out[i] = table[ids[i]] as f32; out [n, H], table [V, H].
  int (*embed)(lks_backend *be, lks_tensor out, lks_tensor table, const int32_t *ids);
  // out = w * x / sqrt(mean(x^2) + eps) per row; out may be x.
  int (*rmsnorm)(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, float eps);
  // out (+)= x W^T + bias; x [n, K] f32, w [M, K] (F32/BF16/F16 or quantized, see lks_qscheme;
  // a backend without a quantized scheme refuses it with LKS_EUNSUPPORTED), bias [M] or buf NULL.
  // Row i of out depends only on row i of x: never on how many rows the batch has.
  int (*matmul)(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, lks_tensor bias,
                bool accumulate);
  // Optional (NULL: matmul once per part, in order; lks_backend_matmuls applies it): the
  // products of parts[0 .. n) on one x (1 <= n <= LKS_MATMULS_MAX, none accumulating), each
  // with the bits its matmul call gives; a backend runs them together (the CPU as one parallel
  // job: GQA's q, k and v, MLA's projections of h).
  int (*matmuls)(lks_backend *be, lks_tensor x, const lks_matmul_part *parts, int n);
  // Rotates the first rot_dims of every head_dim-sized head of x [n, heads * head_dim] in place.
  int (*rope)(lks_backend *be, lks_tensor x, int head_dim, int rot_dims, float theta,
              lks_rope_layout layout, const int32_t *pos);
  // Writes k, v [n, n_kv_heads * head_dim] into the cache at rows->slot.
  int (*kv_store)(lks_backend *be, const lks_kv_layer *kv, lks_tensor k, lks_tensor v,
                  const lks_attn_rows *rows);
  // Causal attention of q [n, n_heads * head_dim] over the cached positions 0..pos of each row's
  // sequence; query head h reads KV head h / (n_heads / n_kv_heads). out like q.
  int (*attention)(lks_backend *be, lks_tensor out, lks_tensor q, const lks_kv_layer *kv,
                   const lks_attn_rows *rows, int n_heads, float scale);
  // GLM router: logits [n, E] f32 -> top-k expert ids and weights per row (host arrays [n, k]),
  // sigmoid scores, selection by score + bias (bias [E] f32), grouped top-k, normalisation,
  // scaling (MODEL.md section 2).
  int (*route)(lks_backend *be, lks_tensor logits, lks_tensor bias, const lks_route_params *p,
               int32_t *ids, float *weights);
  // SwiGLU expert on selected rows: for i < n_rows,
  // out[rows[i]] += weights[i] * down(silu(gate x[rows[i]]) * up x[rows[i]]).
  // rows NULL means rows 0..n_rows-1; weights NULL means 1.
  int (*expert)(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows,
                const float *weights, int n_rows, lks_tensor gate, lks_tensor up,
                lks_tensor down);
  // Optional (NULL: expert once per call, in order; lks_backend_experts applies it): the
  // experts of calls[0 .. n_calls) on the same x and out, with the result of those expert calls
  // in that order, bitwise; a backend runs them together (the CPU in three parallel phases).
  int (*experts)(lks_backend *be, lks_tensor out, lks_tensor x, const lks_expert_call *calls,
                 int n_calls);
  // Optional (NULL: the caller routes with `route` and runs `expert` per selected expert): the
  // routed experts of an MoE layer in one call, routing kept on the device. With ids, weights
  // [n, top_k] as `route` computes them from logits [n, E] and bias:
  //   out[r] += sum over j = 0 .. top_k - 1, in that order, of weights[r, j] * expert_{ids[r, j]}(x[r])
  // over the experts in [ex->e0, ex->e0 + ex->n) only. A row's result does not depend on the other
  // rows of the batch. ids, weights: host arrays [n, top_k] that receive the routing (a
  // synchronisation; for tests), or NULL. LKS_EUNSUPPORTED when the experts' weights do not fit
  // the backend's scheme (then the caller uses the default).
  int (*moe)(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor logits, lks_tensor bias,
             const lks_route_params *p, const lks_moe_experts *ex, int32_t *ids, float *weights);
  // Optional (NULL: every step runs as it is called): brackets one model step whose sequence of
  // ops, shapes and buffers is fully determined by `key` (the caller's promise; only the contents
  // of the host control arrays may differ between steps of one key), so that a device backend
  // may record the step once and replay it. step_end receives the step's result and returns 0
  // when the step is done, 1 when the caller must run the step again without the brackets (the
  // recording could not be made or used; nothing of the step has run), or a negative error.
  int (*step_begin)(lks_backend *be, uint64_t key);
  int (*step_end)(lks_backend *be, int rc);
  // out[i] = x[rows[i]].
  int (*gather_rows)(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows);
  // Per row of x [n, V]: index of the maximum (ties: lowest index), into host idx[n], and the
  // maximum into host val[n] (val may be NULL).
  int (*argmax)(lks_backend *be, lks_tensor x, int32_t *idx, float *val);

  // ---- glm_moe_dsa: MLA with the DSA indexer (MODEL.md section 4). Optional: a backend that
  // leaves them NULL cannot run glm_moe_dsa, and the model refuses to load on it, naming it. ----
  // LayerNorm per row: out = (x - mean) / sqrt(var + eps) * w + b (w, b [cols]); out may be x.
  int (*layernorm)(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, lks_tensor b,
                   float eps);
  // Writes row i of x [n, kv->head_dim] into the K pool of a k-only cache layer at rows->slot[i].
  int (*cache_store)(lks_backend *be, const lks_kv_layer *kv, lks_tensor x,
                     const lks_attn_rows *rows);
  // The DSA lightning indexer: for row t (at rows->pos[t] of its sequence) and each cached key
  // s <= pos[t] of `keys` (a k-only layer of index_head_dim), the score
  // I(t, s) = sum_h (w[t, h] * w_scale) * relu(q[t, h] . k_s * q_scale), q [n, n_heads * head_dim],
  // w [n, n_heads]. Writes the selected positions into host sel[t * topk ..] in ascending order,
  // and their number into host n_sel[t]: every position 0..pos[t] when there are at most topk,
  // else the topk of highest score (ties: the lower position).
  int (*dsa_select)(lks_backend *be, lks_tensor q, lks_tensor w, const lks_kv_layer *keys,
                    const lks_attn_rows *rows, int n_heads, float q_scale, float w_scale,
                    int topk, int32_t *sel, int32_t *n_sel);
  // MLA attention in the absorbed form over a latent cache layer (rows [latent | rope key]):
  // per row and head h, with q = [q_nope | q_pe] (RoPE applied), W_uk / W_uv head h's nope and
  // value rows of wkv_b [n_heads * (nope + v_dim), latent]:
  //   score_s = (W_uk^T q_nope) . c_s + q_pe . kpe_s, times scale; p = softmax over the keys;
  //   out_h = W_uv (sum_s p_s c_s).
  // Keys: the positions sel[t * sel_stride ..] (n_sel[t] of them), or with sel NULL every
  // position 0..pos[t]. q [n, n_heads * (nope + rope)], out [n, n_heads * v_dim].
  int (*mla_attention)(lks_backend *be, lks_tensor out, lks_tensor q, lks_tensor wkv_b,
                       const lks_kv_layer *kv, const lks_attn_rows *rows, const lks_mla_dims *d,
                       const int32_t *sel, const int32_t *n_sel, int sel_stride);

  // Host work between forwards (the scheduler's token picks) on the backend's host threads:
  // fn(ctx, task, thread) for every task < n_tasks, thread < host_threads(be); returns when all
  // are done. Called from the thread that runs the forwards, never during one. Optional: NULL
  // (a device backend) runs the tasks on the caller, thread 0 (lks_backend_host_run).
  int (*host_threads)(lks_backend *be);
  void (*host_run)(lks_backend *be, int n_tasks, void (*fn)(void *ctx, int task, int thread),
                   void *ctx);
} lks_backend_ops;

struct lks_backend {
  const lks_backend_ops *ops;
};

// Creates a backend by name ("cpu", or "cuda" in builds with CUDA). threads: CPU worker threads
// (0: one per core). NULL on failure with lks_last_error() saying why.
lks_backend *lks_backend_new(const char *name, int threads);
// The same on a chosen GPU for device backends: device >= 0, or -1 for the local rank modulo
// the visible GPUs (lks_backend_new's choice). The CPU backend ignores it.
lks_backend *lks_backend_new_on(const char *name, int threads, int device);
void lks_backend_free(lks_backend *be);

// How the CPU backend's buf_wrap_host and buf_wrap_host_2d take host memory (the weights, from
// the mapped checkpoint files). Set before loading a model; no effect on device backends, which
// always copy.
//   LKS_HOST_IN_PLACE: read in place, column slices with the file's row stride (`inspect`, which
//     computes nothing and must not read the files);
//   LKS_HOST_PACK_SLICES (the default): whole rows read in place, column slices (a rank's
//     columns of a row-major weight) copied packed;
//   LKS_HOST_COPY: everything copied into memory of the process's own and packed (--mmap false).
typedef enum { LKS_HOST_PACK_SLICES, LKS_HOST_IN_PLACE, LKS_HOST_COPY } lks_host_weights;
void lks_backend_cpu_host_weights(lks_backend *be, lks_host_weights how);

// Runs step(ctx) between the backend's step_begin(key) and step_end, again without them when
// step_end asks for it; just step(ctx) when the backend has no such ops or key is 0.
int lks_backend_step(lks_backend *be, uint64_t key, int (*step)(void *ctx), void *ctx);

// Shape and type checks every backend's matmul and expert make: a weight of K columns in F32,
// BF16 or F16, or quantized (F8_E4M3 / F4_E2M1X2 codes with their scheme); out [x.rows, w.rows].
// 0, or LKS_ESHAPE / LKS_EUNSUPPORTED naming the mismatch.
int lks_weight_check(lks_tensor w, int64_t K);
int lks_matmul_check(lks_tensor out, lks_tensor x, lks_tensor w);

// Checks that every row's slot and position lie inside the cache (for every backend's
// kv_store and attention): 0 or LKS_ERANGE naming the row.
int lks_attn_rows_check(const lks_kv_layer *kv, const lks_attn_rows *rows);

// The experts op, or its default: ops->expert once per call, in order.
int lks_backend_experts(lks_backend *be, lks_tensor out, lks_tensor x,
                        const lks_expert_call *calls, int n_calls);

// The matmuls op, or its default: ops->matmul once per part, in order.
int lks_backend_matmuls(lks_backend *be, lks_tensor x, const lks_matmul_part *parts, int n);

// The host threads lks_backend_host_run spreads tasks over (1 without host_run), and the run.
int lks_backend_host_threads(lks_backend *be);
void lks_backend_host_run(lks_backend *be, int n_tasks, void (*fn)(void *ctx, int task, int thread),
                          void *ctx);

// Reads a whole tensor view to host memory as f32 (any dtype), row by row.
int lks_tensor_to_host_f32(lks_backend *be, float *dst, lks_tensor t);

#endif
