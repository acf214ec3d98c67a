// SPDX-License-Identifier: MIT
// The `cuda` backend (DESIGN.md section 9): the ops of backend.h on one NVIDIA GPU, with the CPU
// backend's semantics (core/backend_cpu.c is the reference every op is tested against, see
// tests/gpu/test_cuda_ops.c). Buffers are cudaMalloc'd; weights are uploaded from the mmapped
// file when wrapped (a column shard packed to its own rows). Every op is enqueued on the
// backend's stream; host control arrays (token ids, positions, KV slots, block tables, expert
// rows and weights) are first copied into device scratch buffers the backend owns and grows,
// and the ops whose results the interface returns in host arrays (route, argmax) and the copies
// (to_host, from_host) synchronise the stream before returning.
//
// Precision: activations, accumulation and the KV cache are f32. Every matrix product, whatever
// its number of activation rows, runs one kernel (kernels.cu, "matrix products") that widens the
// weights exactly and accumulates in f32 in an order fixed by K alone: a row's result does not
// depend on the batch it is computed in, so speculative verify (several rows per sequence) and
// plain decode (one) give the same logits bit for bit. No tensor cores: prefill runs at the f32
// rate, the price of that guarantee.
//
// glm_moe_dsa's ops (LayerNorm, the k-only cache store, the DSA indexer's selection, absorbed MLA
// attention) run the kernels of mla.cu under the same rule: a row's result is its own.
//
// MoE (the moe op, backend_cuda_moe.c): routing, the dispatch plan, all selected experts'
// products and their weighted sum run on the device in five launches (cuda/moe.cu), without a
// host round trip.
//
// Recorded steps (step_begin / step_end, backend_cuda_graph.c; off unless LKS_CUDA_GRAPHS=1): a
// step of a key seen before is captured into a CUDA graph once, then replayed; the ops consult
// the recording state (cuda_backend.gmode) and upload through lks__cuda_graph_up.
//
// All calls come from the thread that created the backend. Errors of CUDA and cuBLAS become
// LKS_EBACKEND with the library's message; nothing exits.
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "cuda/backend_cuda_impl.h"
#include "cuda/cuda_impl.h"

// The one live backend's stream, for the NCCL comm (lks__cuda_work_stream). Backends are made
// and freed on the main thread.
static int live_backends;
static cudaStream_t live_stream;

cudaStream_t lks__cuda_work_stream(void) { return live_backends == 1 ? live_stream : NULL; }

int lks__cuda_pick_device(int requested) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return lks_set_error(LKS_EBACKEND, "no CUDA device: %s",
                         e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
  if (requested >= 0) {
    if (requested >= count)
      return lks_set_error(LKS_ERANGE, "--gpu %d, but %d device(s) are visible", requested,
                           count);
    return requested;
  }
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
  int local = 0;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) {
      local = atoi(v);
      break;
    }
  }
  return (local < 0 ? 0 : local) % count;
}

int lks__cuda_need(cuda_backend *c, int slot, size_t bytes, void **p) {
  dscratch *s = &c->sc[slot];
  if (s->bytes < bytes) {
    if (c->gmode != G_EAGER) return lks__cuda_graph_refuse(c, "growing a scratch buffer");
    lks__cuda_graphs_drop(c);  // they refer to the old buffer
    size_t nb = bytes + bytes / 2;
    void *np = NULL;
    // Work still queued may read the old buffer.
    LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
    if (s->p) LKS_CUDA_TRY(cudaFree(s->p));
    s->p = NULL;
    s->bytes = 0;
    LKS_CUDA_TRY(cudaMalloc(&np, nb));
    s->p = np;
    s->bytes = nb;
  }
  *p = s->p;
  return 0;
}

// Copies a host array into a scratch buffer (in stream order); the host array may be reused as
// soon as this returns.
static int up(cuda_backend *c, int slot, const void *host, size_t bytes, void **dev) {
  LKS_TRY(lks__cuda_need(c, slot, bytes ? bytes : 4, dev));
  if (!bytes) return 0;
  if (c->gmode != G_EAGER) return lks__cuda_graph_up(c, slot, host, bytes, *dev);
  size_t half = RING_BYTES / 2, a = (bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
  if (!c->ring || a > half) {
    // Pageable: the driver stages the copy (after waiting for the stream).
    LKS_CUDA_TRY(cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, c->st));
    return 0;
  }
  if (c->ring_off + a > half) {
    LKS_CUDA_TRY(cudaEventRecord(c->ring_ev[c->ring_part], c->st));
    c->ring_ev_set[c->ring_part] = true;
    c->ring_part ^= 1;
    c->ring_off = 0;
    if (c->ring_ev_set[c->ring_part])
      LKS_CUDA_TRY(cudaEventSynchronize(c->ring_ev[c->ring_part]));
  }
  char *h = c->ring + (size_t)c->ring_part * half + c->ring_off;
  memcpy(h, host, bytes);
  LKS_CUDA_TRY(cudaMemcpyAsync(*dev, h, bytes, cudaMemcpyHostToDevice, c->st));
  c->ring_off += a;
  return 0;
}

static int down(cuda_backend *c, void *host, const void *dev, size_t bytes) {
  if (c->gmode != G_EAGER) return lks__cuda_graph_refuse(c, "a copy to the host");
  if (bytes) LKS_CUDA_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

// ---- memory ----

static lks_buf *new_buf(size_t bytes, bool owned) {
  lks_buf *b = calloc(1, sizeof *b);
  if (!b) {
    lks_set_error(LKS_ENOMEM, "cuda backend: out of host memory");
    return NULL;
  }
  cudaError_t e = cudaMalloc(&b->d, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    lks_set_error(LKS_ENOMEM, "cuda backend: cannot allocate %zu bytes of device memory: %s",
                  bytes, cudaGetErrorString(e));
    free(b);
    return NULL;
  }
  b->bytes = bytes;
  b->owned = owned;
  return b;
}

static void cu_buf_free(lks_backend *be, lks_buf *b) {
  if (!b) return;
  if (be) {
    cuda_backend *c = (cuda_backend *)be;
    if (c->gmode != G_EAGER) (void)lks__cuda_graph_refuse(c, "freeing a buffer");
    lks__cuda_graphs_drop(c);  // a graph may refer to the buffer
    // Queued work may still use the buffer.
    (void)cudaStreamSynchronize(c->st);
  }
  cudaError_t e = cudaFree(b->d);
  if (e != cudaSuccess) LKS_LOG(LKS_LOG_WARN, "cuda backend: cudaFree: %s", cudaGetErrorString(e));
  free(b);
}

static lks_buf *fail_buf(lks_buf *b, const char *what, cudaError_t e) {
  lks_set_error(LKS_EBACKEND, "cuda backend: %s: %s", what, cudaGetErrorString(e));
  cu_buf_free(NULL, b);
  return NULL;
}

static lks_buf *cu_buf_alloc(lks_backend *be, size_t bytes) {
  cuda_backend *c = (cuda_backend *)be;
  lks_buf *b = new_buf(bytes, true);
  if (!b) return NULL;
  // Zeroed, like the CPU backend's calloc.
  cudaError_t e = cudaMemsetAsync(b->d, 0, bytes, c->st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);
  return e == cudaSuccess ? b : fail_buf(b, "cudaMemset", e);
}

// Uploads go through the backend's stream and wait for it: a plain cudaMemcpy from pageable
// memory may return before its DMA is done, and the backend's stream does not wait for the
// legacy default stream.
static lks_buf *cu_buf_wrap_host(lks_backend *be, const void *host, size_t bytes) {
  cuda_backend *c = (cuda_backend *)be;
  lks_buf *b = new_buf(bytes, false);
  if (!b) return NULL;
  cudaError_t e = cudaMemcpyAsync(b->d, host, bytes, cudaMemcpyHostToDevice, c->st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);
  return e == cudaSuccess ? b : fail_buf(b, "weight upload", e);
}

static lks_buf *cu_buf_wrap_host_2d(lks_backend *be, const void *host, int64_t rows,
                                    size_t row_bytes, size_t stride_bytes, size_t *ld_bytes) {
  cuda_backend *c = (cuda_backend *)be;
  *ld_bytes = row_bytes;
  lks_buf *b = new_buf((size_t)(rows > 0 ? rows : 0) * row_bytes, false);
  if (!b) return NULL;
  cudaError_t e = cudaSuccess;
  if (rows > 0 && row_bytes > 0)
    e = cudaMemcpy2DAsync(b->d, row_bytes, host, stride_bytes, row_bytes, (size_t)rows,
                          cudaMemcpyHostToDevice, c->st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);
  return e == cudaSuccess ? b : fail_buf(b, "weight upload (2-D)", e);
}

static void *cu_buf_ptr(lks_backend *be, lks_buf *b) {
  (void)be;
  return b->d;
}

static int cu_to_host(lks_backend *be, void *dst, const lks_buf *src, size_t off, size_t n) {
  cuda_backend *c = (cuda_backend *)be;
  if (off > src->bytes || n > src->bytes - off)
    return lks_set_error(LKS_ERANGE, "to_host: range [%zu, +%zu) outside a %zu-byte buffer", off,
                         n, src->bytes);
  return down(c, dst, (const char *)src->d + off, n);
}

static int cu_from_host(lks_backend *be, lks_buf *dst, size_t off, const void *src, size_t n) {
  cuda_backend *c = (cuda_backend *)be;
  if (c->gmode != G_EAGER) return lks__cuda_graph_refuse(c, "a copy from the host");
  if (!dst->owned || off > dst->bytes || n > dst->bytes - off)
    return lks_set_error(LKS_ERANGE, "from_host: range [%zu, +%zu) outside a writable buffer",
                         off, n);
  if (n) LKS_CUDA_TRY(cudaMemcpyAsync((char *)dst->d + off, src, n, cudaMemcpyHostToDevice, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

// ---- element-wise ops ----

static int cu_zero(lks_backend *be, lks_tensor t) {
  cuda_backend *c = (cuda_backend *)be;
  if (t.rows <= 0 || t.cols <= 0 || REPLAYING(c)) return 0;
  LKS_CUDA_TRY(cudaMemset2DAsync(dp(t), (size_t)t.ld * sizeof(float), 0,
                                 (size_t)t.cols * sizeof(float), (size_t)t.rows, c->st));
  return 0;
}

static int cu_embed(lks_backend *be, lks_tensor out, lks_tensor table, const int32_t *ids) {
  cuda_backend *c = (cuda_backend *)be;
  for (int64_t i = 0; i < out.rows; i++)
    if (ids[i] < 0 || ids[i] >= table.rows)
      return lks_set_error(LKS_ERANGE, "token id %d outside the vocabulary [0, %lld)", ids[i],
                           (long long)table.rows);
  void *d_ids;
  LKS_TRY(up(c, SC_IDX0, ids, (size_t)out.rows * sizeof *ids, &d_ids));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_embed(c->st, (float *)dp(out), out.ld, dp(table), table.dtype, table.ld,
                             d_ids, out.rows, table.cols));
  return 0;
}

static int cu_rmsnorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, float eps) {
  cuda_backend *c = (cuda_backend *)be;
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_rmsnorm(c->st, (float *)dp(out), out.ld, (const float *)dp(x), x.ld,
                               dp(w), w.dtype, x.rows, x.cols, eps));
  return 0;
}

static int cu_rope(lks_backend *be, lks_tensor x, int head_dim, int rot, float theta,
                   lks_rope_layout layout, const int32_t *pos) {
  cuda_backend *c = (cuda_backend *)be;
  void *d_pos;
  LKS_TRY(up(c, SC_IDX0, pos, (size_t)x.rows * sizeof *pos, &d_pos));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_rope(c->st, (float *)dp(x), x.ld, x.rows, (int)(x.cols / head_dim),
                            head_dim, rot, theta, layout == LKS_ROPE_INTERLEAVED, d_pos));
  return 0;
}

static int cu_gather_rows(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows) {
  cuda_backend *c = (cuda_backend *)be;
  for (int64_t i = 0; i < out.rows; i++)
    if (rows[i] < 0 || rows[i] >= x.rows)
      return lks_set_error(LKS_ERANGE, "gather_rows: row %d outside [0, %lld)", rows[i],
                           (long long)x.rows);
  void *d_rows;
  LKS_TRY(up(c, SC_IDX0, rows, (size_t)out.rows * sizeof *rows, &d_rows));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_gather_rows(c->st, (float *)dp(out), out.ld, (const float *)dp(x), x.ld,
                                   d_rows, out.rows, x.cols));
  return 0;
}

static int cu_argmax(lks_backend *be, lks_tensor x, int32_t *idx, float *val) {
  cuda_backend *c = (cuda_backend *)be;
  if (x.rows <= 0) return 0;
  if (c->gmode != G_EAGER) return lks__cuda_graph_refuse(c, "argmax");
  size_t n = (size_t)x.rows;
  void *d;
  LKS_TRY(lks__cuda_need(c, SC_OUT, n * 8, &d));
  int32_t *d_idx = d;
  float *d_val = (float *)((char *)d + n * 4);
  LKS_CUDA_TRY(lks__cu_argmax(c->st, (const float *)dp(x), x.ld, x.rows, x.cols, d_idx, d_val));
  LKS_CUDA_TRY(cudaMemcpyAsync(idx, d_idx, n * 4, cudaMemcpyDeviceToHost, c->st));
  if (val) LKS_CUDA_TRY(cudaMemcpyAsync(val, d_val, n * 4, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

// ---- matrix products ----

// out [n, M] (row stride ldo) (+)= x [n, K] (row stride ldx) w^T + bias, for any n.
static int mm(cuda_backend *c, float *out, int64_t ldo, const float *x, int64_t ldx, int64_t n,
              lks_tensor w, const void *bias, lks_dtype bdt, bool accumulate) {
  int64_t M = w.rows, K = w.cols;
  if (n <= 0 || M <= 0) return 0;
  if (REPLAYING(c)) return 0;
  if (w.qs != LKS_Q_NONE) {  // weight-only quantized: cuda/quant.cu, every row count
    LKS_CUDA_TRY(lks__cu_qgemv(c->st, out, ldo, x, ldx, n, dp(w), w.ld, (int)w.qs,
                               (char *)w.sbuf->d + w.soff, w.sld, w.qglobal, bias, bdt, M, K,
                               accumulate));
    return 0;
  }
  if (n > (int64_t)LKS__CU_GEMV_ROWS * 65535)
    return lks_set_error(LKS_ERANGE, "matmul: %lld rows in one product (at most %d)", (long long)n,
                         LKS__CU_GEMV_ROWS * 65535);
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_gemv(c->st, out, ldo, x, ldx, dp(w), w.dtype, w.ld, bias, bdt, n, M, K,
                            accumulate));
  return 0;
}

static int cu_matmul(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w,
                     lks_tensor bias, bool accumulate) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_matmul_check(out, x, w));
  return mm(c, (float *)dp(out), out.ld, (const float *)dp(x), x.ld, x.rows, w,
            bias.buf ? dp(bias) : NULL, bias.dtype, accumulate);
}

// ---- attention ----

static int cu_kv_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor k, lks_tensor v,
                       const lks_attn_rows *rows) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  if (kv->dtype != LKS_F32)
    return lks_set_error(LKS_EUNSUPPORTED, "cuda: the KV cache is f32 on this backend, not %s",
                         lks_dtype_name(kv->dtype));
  if (rows->n <= 0) return 0;
  void *d_slot;
  LKS_TRY(up(c, SC_IDX0, rows->slot, (size_t)rows->n * sizeof(int32_t), &d_slot));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_kv_store(c->st, kv->k->d, kv->v->d, (int64_t)kv->n_kv_heads * kv->head_dim,
                                (const float *)dp(k), k.ld, (const float *)dp(v), v.ld, d_slot,
                                rows->n));
  return 0;
}

// A bad block id would fault a kernel (and the context with it): every block a row may read,
// those of positions 0..pos, is checked here. *n_seqs: the block table rows the kernel reads.
static int check_blocks(const lks_kv_layer *kv, const lks_attn_rows *rows, const char *op,
                        int *n_seqs) {
  *n_seqs = 0;
  for (int i = 0; i < rows->n; i++) {
    if (rows->seq[i] < 0) return lks_set_error(LKS_ERANGE, "%s: row %d has sequence %d", op, i, rows->seq[i]);
    if (rows->seq[i] + 1 > *n_seqs) *n_seqs = rows->seq[i] + 1;
    const int32_t *bt = rows->block_table + (size_t)rows->seq[i] * rows->max_blocks;
    for (int b = 0; b <= rows->pos[i] / kv->block_size; b++)
      if (bt[b] < 0 || bt[b] >= kv->n_blocks)
        return lks_set_error(LKS_ERANGE, "%s: row %d reads block %d of %d", op, i, bt[b],
                             kv->n_blocks);
  }
  return 0;
}

// Positions, sequences and the block table rows of a batch, on the device.
static int up_rows(cuda_backend *c, const lks_attn_rows *rows, int n_seqs, void **d_pos,
                   void **d_seq, void **d_bt) {
  LKS_TRY(up(c, SC_IDX0, rows->pos, (size_t)rows->n * sizeof(int32_t), d_pos));
  LKS_TRY(up(c, SC_IDX1, rows->seq, (size_t)rows->n * sizeof(int32_t), d_seq));
  return up(c, SC_IDX2, rows->block_table, (size_t)n_seqs * rows->max_blocks * sizeof(int32_t),
            d_bt);
}

static int cu_attention(lks_backend *be, lks_tensor out, lks_tensor q, const lks_kv_layer *kv,
                        const lks_attn_rows *rows, int n_heads, float scale) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  if (kv->dtype != LKS_F32)
    return lks_set_error(LKS_EUNSUPPORTED, "cuda: the KV cache is f32 on this backend, not %s",
                         lks_dtype_name(kv->dtype));
  if (rows->n <= 0) return 0;
  if (n_heads % kv->n_kv_heads != 0)
    return lks_set_error(LKS_ESHAPE, "attention: %d query heads over %d KV heads", n_heads,
                         kv->n_kv_heads);
  int n_seqs;
  LKS_TRY(check_blocks(kv, rows, "attention", &n_seqs));
  void *d_seq, *d_pos, *d_bt;
  LKS_TRY(up_rows(c, rows, n_seqs, &d_pos, &d_seq, &d_bt));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_attention(c->st, (float *)dp(out), out.ld, (const float *)dp(q), q.ld,
                                 kv->k->d, kv->v->d, kv->n_kv_heads, kv->head_dim, n_heads,
                                 kv->block_size, d_seq, d_pos, d_bt, rows->max_blocks, rows->n,
                                 scale));
  return 0;
}

// ---- glm_moe_dsa: LayerNorm, the k-only cache, the DSA indexer, MLA (kernels in mla.cu) ----

static int cu_layernorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, lks_tensor b,
                        float eps) {
  cuda_backend *c = (cuda_backend *)be;
  lks_tensor wb[2] = {w, b};
  for (int i = 0; i < 2; i++)
    if (wb[i].cols != x.cols ||
        (wb[i].dtype != LKS_F32 && wb[i].dtype != LKS_BF16 && wb[i].dtype != LKS_F16))
      return lks_set_error(LKS_ESHAPE, "layernorm: %s of %lld columns (%s) for rows of %lld",
                           i ? "bias" : "weight", (long long)wb[i].cols,
                           lks_dtype_name(wb[i].dtype), (long long)x.cols);
  if (out.rows != x.rows || out.cols != x.cols)
    return lks_set_error(LKS_ESHAPE, "layernorm: out [%lld, %lld] for x [%lld, %lld]",
                         (long long)out.rows, (long long)out.cols, (long long)x.rows,
                         (long long)x.cols);
  LKS_CUDA_TRY(lks__cu_layernorm(c->st, (float *)dp(out), out.ld, (const float *)dp(x), x.ld,
                                 dp(w), w.dtype, dp(b), b.dtype, x.rows, x.cols, eps));
  return 0;
}

static int cu_cache_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor x,
                          const lks_attn_rows *rows) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  if (!kv->k || x.cols != kv->head_dim)
    return lks_set_error(LKS_ESHAPE, "cache_store: %lld columns into a cache of width %d",
                         (long long)x.cols, kv->k ? kv->head_dim : 0);
  if (rows->n <= 0) return 0;
  void *d_slot;
  LKS_TRY(up(c, SC_IDX0, rows->slot, (size_t)rows->n * sizeof(int32_t), &d_slot));
  LKS_CUDA_TRY(lks__cu_cache_store(c->st, kv->k->d, kv->head_dim, (const float *)dp(x), x.ld,
                                   d_slot, rows->n));
  return 0;
}

// The scores of one launch stay under this many bytes: rows go in groups (each row's result is
// its own, so the grouping changes nothing but the memory).
enum { DSA_SCORE_BYTES = 256 << 20 };

static int cu_dsa_select(lks_backend *be, lks_tensor q, lks_tensor w, const lks_kv_layer *keys,
                         const lks_attn_rows *rows, int n_heads, float q_scale, float w_scale,
                         int topk, int32_t *sel, int32_t *n_sel) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(keys, rows));
  if (!keys->k || q.cols != (int64_t)n_heads * keys->head_dim || w.cols != n_heads || topk < 1)
    return lks_set_error(LKS_ESHAPE, "dsa_select: q has %lld columns, %d heads of %d, w %lld, top-%d",
                         (long long)q.cols, n_heads, keys->head_dim, (long long)w.cols, topk);
  int n = rows->n, n_seqs, max_keys = 1;
  if (n <= 0) return 0;
  LKS_TRY(check_blocks(keys, rows, "dsa_select", &n_seqs));
  for (int i = 0; i < n; i++)
    if (rows->pos[i] + 1 > max_keys) max_keys = rows->pos[i] + 1;
  void *d_pos, *d_seq, *d_bt, *d_out, *d_scores;
  LKS_TRY(up_rows(c, rows, n_seqs, &d_pos, &d_seq, &d_bt));
  size_t n_out = (size_t)n * topk;
  LKS_TRY(lks__cuda_need(c, SC_OUT, (n_out + (size_t)n) * sizeof(int32_t), &d_out));
  int32_t *d_sel = d_out, *d_nsel = d_sel + n_out;
  int group = (int)(DSA_SCORE_BYTES / ((size_t)max_keys * sizeof(float)));
  if (group < 1) group = 1;
  if (group > n) group = n;
  if (group > 65535) group = 65535;  // the kernels' grid
  LKS_TRY(lks__cuda_need(c, SC_WORK, (size_t)group * max_keys * sizeof(float), &d_scores));
  for (int r0 = 0; r0 < n; r0 += group) {
    int g = n - r0 < group ? n - r0 : group;
    LKS_CUDA_TRY(lks__cu_dsa_select(c->st, (const float *)dp(q) + r0 * q.ld, q.ld,
                                    (const float *)dp(w) + r0 * w.ld, w.ld, keys->k->d,
                                    keys->head_dim, n_heads, q_scale, w_scale, topk,
                                    keys->block_size, (const int32_t *)d_seq + r0,
                                    (const int32_t *)d_pos + r0, d_bt, rows->max_blocks, g,
                                    max_keys, d_scores, d_sel + (size_t)r0 * topk, d_nsel + r0));
  }
  LKS_CUDA_TRY(cudaMemcpyAsync(sel, d_sel, n_out * sizeof(int32_t), cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaMemcpyAsync(n_sel, d_nsel, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

static int cu_mla_attention(lks_backend *be, lks_tensor out, lks_tensor q, lks_tensor wkv_b,
                            const lks_kv_layer *kv, const lks_attn_rows *rows,
                            const lks_mla_dims *d, const int32_t *sel, const int32_t *n_sel,
                            int sel_stride) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  int R = d->latent, dn = d->nope, dr = d->rope, dv = d->v_dim, nh = d->n_heads;
  if (!kv->k || kv->head_dim != R + dr || q.cols != (int64_t)nh * (dn + dr) ||
      out.cols != (int64_t)nh * dv || wkv_b.rows != (int64_t)nh * (dn + dv) || wkv_b.cols != R)
    return lks_set_error(LKS_ESHAPE,
                         "mla_attention: q %lld / out %lld columns, kv_b [%lld, %lld], cache width %d "
                         "for %d heads (nope %d, rope %d, v %d, latent %d)",
                         (long long)q.cols, (long long)out.cols, (long long)wkv_b.rows,
                         (long long)wkv_b.cols, kv->head_dim, nh, dn, dr, dv, R);
  LKS_TRY(lks_weight_check(wkv_b, R));
  // The kernel (mla.cu) widens kv_b from F32 / BF16 / F16 only; FP8 or NVFP4 codes would be read
  // as halves. The CPU backend dequantizes them (cpu_mla.c).
  if (wkv_b.qs != LKS_Q_NONE)
    return lks_set_error(LKS_EUNSUPPORTED,
                         "mla_attention: kv_b_proj quantized (%s) is not supported on the cuda "
                         "backend yet; run quantized GLM-5 checkpoints on the cpu backend",
                         lks_qscheme_name(wkv_b.qs, wkv_b.dtype));
  int n = rows->n, n_seqs;
  if (n <= 0) return 0;
  if ((int64_t)n * nh > 0x7fffffff)
    return lks_set_error(LKS_ERANGE, "mla_attention: %d rows of %d heads in one call", n, nh);
  for (int i = 0; sel && i < n; i++) {
    if (n_sel[i] < 1 || n_sel[i] > sel_stride)
      return lks_set_error(LKS_ERANGE, "mla_attention: row %d selects %d keys of %d", i, n_sel[i],
                           sel_stride);
    for (int k = 0; k < n_sel[i]; k++)
      if (sel[(size_t)i * sel_stride + k] < 0 || sel[(size_t)i * sel_stride + k] > rows->pos[i])
        return lks_set_error(LKS_ERANGE, "mla_attention: row %d selects position %d past %d", i,
                             sel[(size_t)i * sel_stride + k], rows->pos[i]);
  }
  LKS_TRY(check_blocks(kv, rows, "mla_attention", &n_seqs));
  void *d_pos, *d_seq, *d_bt, *d_sel = NULL, *d_nsel = NULL;
  LKS_TRY(up_rows(c, rows, n_seqs, &d_pos, &d_seq, &d_bt));
  if (sel) {
    LKS_TRY(up(c, SC_SEL, sel, (size_t)n * sel_stride * sizeof(int32_t), &d_sel));
    LKS_TRY(up(c, SC_NSEL, n_sel, (size_t)n * sizeof(int32_t), &d_nsel));
  }
  LKS_CUDA_TRY(lks__cu_mla_attention(c->st, (float *)dp(out), out.ld, (const float *)dp(q), q.ld,
                                     dp(wkv_b), wkv_b.dtype, wkv_b.ld, kv->k->d, R, dn, dr, dv, nh,
                                     d->scale, kv->block_size, d_seq, d_pos, d_bt,
                                     rows->max_blocks, d_sel, d_nsel, sel_stride, n));
  return 0;
}

// ---- MoE: route, expert (the moe op is in backend_cuda_moe.c) ----

static int cu_route(lks_backend *be, lks_tensor logits, lks_tensor bias,
                    const lks_route_params *p, int32_t *ids, float *weights) {
  cuda_backend *c = (cuda_backend *)be;
  int E = p->n_experts, n = (int)logits.rows;
  if (E <= 0 || E > logits.cols || p->top_k <= 0 || p->top_k > E || p->n_group <= 0 ||
      p->n_group > 256 || E % p->n_group != 0 ||
      (p->n_group > 1 && (p->topk_group <= 0 || p->topk_group > p->n_group)))
    return lks_set_error(LKS_EINVAL, "route: %d experts, top %d, %d groups (top %d)", E,
                         p->top_k, p->n_group, p->topk_group);
  if (n <= 0) return 0;
  if (c->gmode != G_EAGER) return lks__cuda_graph_refuse(c, "route");
  void *scratch, *out;
  LKS_TRY(lks__cuda_need(c, SC_ROUTE, ((size_t)n * 2 * E + (size_t)E) * sizeof(float), &scratch));
  float *bias_f32 = NULL;
  if (bias.buf) {
    bias_f32 = (float *)scratch + (size_t)n * 2 * E;
    LKS_CUDA_TRY(lks__cu_convert(c->st, bias_f32, LKS_F32, E, dp(bias), bias.dtype, bias.ld, 1, E));
  }
  size_t nk = (size_t)n * p->top_k;
  LKS_TRY(lks__cuda_need(c, SC_OUT, nk * 8, &out));
  int32_t *d_ids = out;
  float *d_w = (float *)((char *)out + nk * 4);
  LKS_CUDA_TRY(lks__cu_route(c->st, (const float *)dp(logits), logits.ld, bias_f32, n, E,
                             p->top_k, p->n_group, p->topk_group, p->norm_topk_prob, p->scaling,
                             scratch, d_ids, d_w));
  LKS_CUDA_TRY(cudaMemcpyAsync(ids, d_ids, nk * 4, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaMemcpyAsync(weights, d_w, nk * 4, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

static int cu_expert(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows,
                     const float *weights, int n, lks_tensor gate, lks_tensor up_w,
                     lks_tensor down_w) {
  cuda_backend *c = (cuda_backend *)be;
  int64_t H = x.cols, I = gate.rows, O = out.cols;
  LKS_TRY(lks_weight_check(gate, H));
  LKS_TRY(lks_weight_check(up_w, H));
  LKS_TRY(lks_weight_check(down_w, I));
  if (up_w.rows != I || down_w.rows != O)
    return lks_set_error(LKS_ESHAPE, "expert: gate/up/down shapes disagree");
  if (n <= 0) return 0;
  const float *xin = (const float *)dp(x);
  int64_t ldx = x.ld;
  int32_t *d_rows = NULL;
  if (rows) {
    for (int i = 0; i < n; i++)
      if (rows[i] < 0 || rows[i] >= x.rows || rows[i] >= out.rows)
        return lks_set_error(LKS_ERANGE, "expert: row %d outside [0, %lld)", rows[i],
                             (long long)x.rows);
    void *r;
    LKS_TRY(up(c, SC_IDX0, rows, (size_t)n * sizeof *rows, &r));
    d_rows = r;
  }
  float *d_w = NULL;
  if (weights) {
    void *w;
    LKS_TRY(up(c, SC_W, weights, (size_t)n * sizeof *weights, &w));
    d_w = w;
  }
  if (n > LKS__CU_GEMV_ROWS * 65535)
    return lks_set_error(LKS_ERANGE, "expert: %d rows in one call", n);
  // Gate and up in one launch, reading the selected rows in place; SwiGLU once per element; down
  // with the weighted scatter-add in the same launch when the rows fit one group of the kernel
  // (it adds repeated rows in order within a group), else into d and then the ordered
  // scatter-add. Both round exactly alike: a row's result does not depend on n.
  // Quantized weights go through the generic products (cuda/quant.cu), whatever n.
  bool plain = gate.qs == LKS_Q_NONE && up_w.qs == LKS_Q_NONE && down_w.qs == LKS_Q_NONE;
  void *gud, *xg = NULL;
  LKS_TRY(lks__cuda_need(c, SC_GUD, (size_t)n * (2 * I + O) * sizeof(float), &gud));
  if ((gate.dtype != up_w.dtype || !plain) && rows)
    LKS_TRY(lks__cuda_need(c, SC_XG, (size_t)n * H * sizeof(float), &xg));
  if (REPLAYING(c)) return 0;
  float *g = gud, *u = g + (size_t)n * I, *d = u + (size_t)n * I;
  if (gate.dtype == up_w.dtype && plain) {
    LKS_CUDA_TRY(lks__cu_gemv_gate_up(c->st, g, u, I, xin, ldx, d_rows, dp(gate), gate.ld,
                                      dp(up_w), up_w.ld, gate.dtype, n, I, H));
  } else {
    if (rows) {
      LKS_CUDA_TRY(lks__cu_gather_rows(c->st, xg, H, xin, ldx, d_rows, n, H));
      xin = xg;
      ldx = H;
    }
    LKS_TRY(mm(c, g, I, xin, ldx, n, gate, NULL, LKS_F32, false));
    LKS_TRY(mm(c, u, I, xin, ldx, n, up_w, NULL, LKS_F32, false));
  }
  LKS_CUDA_TRY(lks__cu_swiglu(c->st, g, u, (int64_t)n * I));
  if (n <= LKS__CU_GEMV_ROWS && plain) {
    LKS_CUDA_TRY(lks__cu_gemv_down_add(c->st, (float *)dp(out), out.ld, d_rows, d_w, g, I,
                                       dp(down_w), down_w.dtype, down_w.ld, n, O, I));
    return 0;
  }
  LKS_TRY(mm(c, d, O, g, I, n, down_w, NULL, LKS_F32, false));
  LKS_CUDA_TRY(lks__cu_scatter_add(c->st, (float *)dp(out), out.ld, d, O, d_rows, d_w, n, O));
  return 0;
}

// ---- lifetime ----

static void cu_free(lks_backend *be) {
  cuda_backend *c = (cuda_backend *)be;
  if (!c) return;
  if (c->st) cudaStreamSynchronize(c->st);
  lks__cuda_graphs_drop(c);
  for (int i = 0; i < c->n_mt; i++) {
    cudaFree(c->mt[i].dev);
    free(c->mt[i].host);
  }
  free(c->mt);
  if (c->st && c->st == live_stream) live_stream = NULL;
  if (c->st) live_backends--;
  for (int i = 0; i < SC_N; i++)
    if (c->sc[i].p) cudaFree(c->sc[i].p);
  if (c->ring) cudaFreeHost(c->ring);
  for (int i = 0; i < 2; i++)
    if (c->ring_ev[i]) cudaEventDestroy(c->ring_ev[i]);
  if (c->st) cudaStreamDestroy(c->st);
  free(c);
}

static const lks_backend_ops cuda_ops = {
    .name = "cuda",
    .free = cu_free,
    .buf_alloc = cu_buf_alloc,
    .buf_wrap_host = cu_buf_wrap_host,
    .buf_wrap_host_2d = cu_buf_wrap_host_2d,
    .buf_ptr = cu_buf_ptr,
    .buf_free = cu_buf_free,
    .zero = cu_zero,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .matmul = cu_matmul,
    .rope = cu_rope,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .route = cu_route,
    .expert = cu_expert,
    .moe = lks__cuda_moe,
    .step_begin = lks__cuda_step_begin,
    .step_end = lks__cuda_step_end,
    .gather_rows = cu_gather_rows,
    .argmax = cu_argmax,
    .layernorm = cu_layernorm,
    .cache_store = cu_cache_store,
    .dsa_select = cu_dsa_select,
    .mla_attention = cu_mla_attention,
};

static int init(cuda_backend *c, int device) {
  LKS_CUDA_TRY(cudaSetDevice(device));
  LKS_CUDA_TRY(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
  if (live_backends++ == 0) live_stream = c->st;
  const char *gv = getenv("LKS_CUDA_GRAPHS");
  c->graphs = gv && strcmp(gv, "1") == 0;
  for (int i = 0; i < 2; i++)
    LKS_CUDA_TRY(cudaEventCreateWithFlags(&c->ring_ev[i], cudaEventDisableTiming));
  void *ring = NULL;
  if (cudaHostAlloc(&ring, RING_BYTES, cudaHostAllocDefault) == cudaSuccess)
    c->ring = ring;
  else
    (void)cudaGetLastError();  // pageable copies then: slower, still correct
  struct cudaDeviceProp prop;
  LKS_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  LKS_LOG(LKS_LOG_INFO, "cuda backend: device %d, %s (sm_%d%d, %.1f GiB), CUDA graphs %s",
          device, prop.name, prop.major, prop.minor,
          (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024),
          c->graphs ? "on (LKS_CUDA_GRAPHS=1)" : "off");
  return 0;
}

lks_backend *lks__backend_cuda_new(int device) {
  int dev = lks__cuda_pick_device(device);
  if (dev < 0) return NULL;
  cuda_backend *c = calloc(1, sizeof *c);
  if (!c) {
    lks_set_error(LKS_ENOMEM, "cuda backend: out of memory");
    return NULL;
  }
  c->base.ops = &cuda_ops;
  c->device = dev;
  if (init(c, dev) < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lks_last_error());
    cu_free(&c->base);
    lks_set_error(LKS_EBACKEND, "%s", msg);
    return NULL;
  }
  return &c->base;
}
