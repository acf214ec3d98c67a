// SPDX-License-Identifier: MIT
// Internals of the CUDA backend and the NCCL collectives (cuda/): the error macros, the device
// choice, and the launchers of the kernels in kernels.cu. Every launcher enqueues on `st` and
// returns cudaGetLastError(); pointers are device memory, leading dimensions are in elements,
// dtypes are lks_dtype values. Nothing here synchronises.
#ifndef LKS_CUDA_IMPL_H
#define LKS_CUDA_IMPL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Turns a failed CUDA runtime call into LKS_EBACKEND with CUDA's own message.
#define LKS_CUDA_TRY(expr)                                                                \
  do {                                                                                    \
    cudaError_t lks__ce = (expr);                                                         \
    if (lks__ce != cudaSuccess)                                                           \
      return lks_set_error(LKS_EBACKEND, "cuda: %s: %s (%s:%d)", #expr,                   \
                           cudaGetErrorString(lks__ce), __FILE__, __LINE__);              \
  } while (0)

// The GPU a process uses: `requested` when >= 0 (checked against the visible devices), else its
// local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID; 0 when none) modulo
// the visible devices. Negative LKS_EBACKEND when there is no usable device.
int lks__cuda_pick_device(int requested);

// The activation rows one warp of the matrix kernel serves at once. Every product, whatever its
// number of rows, runs the same kernel with the same arithmetic per output element (kernels.cu
// says which), so a row's result does not depend on its batch.
enum { LKS__CU_GEMV_ROWS = 8 };

cudaError_t lks__cu_embed(cudaStream_t st, float *out, int64_t ldo, const void *table, int dt,
                          int64_t ldt, const int32_t *ids, int64_t n, int64_t H);
cudaError_t lks__cu_rmsnorm(cudaStream_t st, float *out, int64_t ldo, const float *x, int64_t ldx,
                            const void *w, int wdt, int64_t n, int64_t H, float eps);
// out[t, m] (+)= sum_k x[t, k] w[m, k] + bias[m], any n; bias may be NULL. Exact f32 products of
// the widened weights, accumulated in f32.
cudaError_t lks__cu_gemv(cudaStream_t st, float *out, int64_t ldo, const float *x, int64_t ldx,
                         const void *w, int wdt, int64_t ldw, const void *bias, int bdt,
                         int64_t n, int64_t M, int64_t K, int accumulate);
// Quantized weights (cuda/quant.cu): out[t, m] (+)= sum_k x[t, k] deq(w)[m, k] + bias[m] for
// any n; qs, scales, sld and global as in lks_tensor (core/backend.h), ld in bytes.
cudaError_t lks__cu_qgemv(cudaStream_t st, float *out, int64_t ldo, const float *x, int64_t ldx,
                          int64_t n, const void *codes, int64_t ld, int qs, const void *scales,
                          int64_t sld, float global, const void *bias, int bdt, int64_t M,
                          int64_t K, int accumulate);
// The expert's products (gate and up of one dtype): g[t], u[t] = gate x[rows[t]], up x[rows[t]]
// (rows NULL: t), both [n, I] with row stride ldo; and, on h = silu(g) * u (lks__cu_swiglu),
// out[rows[t]] = fma(scale[t], down h[t], out[rows[t]]) (scale NULL: 1), in row order within
// each group of LKS__CU_GEMV_ROWS rows (the caller keeps repeated rows to one group).
cudaError_t lks__cu_gemv_gate_up(cudaStream_t st, float *g, float *u, int64_t ldo,
                                 const float *x, int64_t ldx, const int32_t *rows,
                                 const void *gate, int64_t ld_gate, const void *up,
                                 int64_t ld_up, int wdt, int64_t n, int64_t I, int64_t K);
cudaError_t lks__cu_gemv_down_add(cudaStream_t st, float *out, int64_t ldo, const int32_t *rows,
                                  const float *scale, const float *h, int64_t ldh,
                                  const void *down, int wdt, int64_t ld_down, int64_t n,
                                  int64_t M, int64_t K);
// The matrix kernel over a group table (the moe op): entry g = {expert, first, count, 0} of
// groups[0 .. n_groups) makes pairs first .. first + count - 1 use the weights wt[expert] (gate,
// or down) and wt2[expert] (up; wt2 NULL: none), each [M, K] with row stride ldw: out[orows[p]]
// = w x[xrows[p]] (and out2 likewise), row stride ldo. Entries with count 0 do nothing. The
// arithmetic per element is lks__cu_gemv's. tab_aligned: every table entry is 16-byte aligned.
// n_rows: the batch's activation rows (it only picks the launch shape).
cudaError_t lks__cu_gemv_grouped(cudaStream_t st, float *out, float *out2, int64_t ldo,
                                 const float *x, int64_t ldx, const int32_t *xrows,
                                 const int32_t *orows, const int4 *groups, int64_t n_groups,
                                 const void *const *wt, const void *const *wt2, int64_t ldw,
                                 int wdt, int tab_aligned, int64_t n_rows, int64_t M, int64_t K);
// Routing of n rows (lks__cu_route's results in ids, w [n, top_k]) and the dispatch plan of the
// local experts [e0, e0 + nl) (cuda/moe.cu says what it holds), in one single-block launch.
// scratch: lks__cu_route_plan_scratch(E) bytes; groups: n_groups entries; prow, pidx: n * top_k.
size_t lks__cu_route_plan_scratch(int E);
cudaError_t lks__cu_route_plan(cudaStream_t st, const float *logits, int64_t ld, const float *bias,
                               int n, int E, int top_k, int n_group, int topk_group, int norm,
                               float scaling, float *scratch, int32_t *ids, float *w, int e0,
                               int nl, int4 *groups, int n_groups, int32_t *prow, int32_t *pidx);
// out[r] = fma(w[r, j], d[r * top_k + j], out[r]) for j in order over the local pairs.
cudaError_t lks__cu_moe_combine(cudaStream_t st, float *out, int64_t ldo, const float *d,
                                int64_t ldd, const int32_t *ids, const float *w, int n, int top_k,
                                int e0, int nl, int64_t cols);
// The stream of the one live cuda backend of this process (NULL when there is none or several):
// the NCCL comm orders its collectives after the backend's work with an event on it.
cudaStream_t lks__cuda_work_stream(void);

// dst[r, c] = src[r, c] converted (src F32/BF16/F16; dst F32 or BF16).
cudaError_t lks__cu_convert(cudaStream_t st, void *dst, int ddt, int64_t ldd, const void *src,
                            int sdt, int64_t lds, int64_t rows, int64_t cols);
cudaError_t lks__cu_add_bias(cudaStream_t st, float *out, int64_t ldo, const void *bias, int bdt,
                             int64_t n, int64_t M);
cudaError_t lks__cu_rope(cudaStream_t st, float *x, int64_t ldx, int64_t n, int heads,
                         int head_dim, int rot, float theta, int interleaved, const int32_t *pos);
cudaError_t lks__cu_kv_store(cudaStream_t st, float *K, float *V, int64_t width, const float *k,
                             int64_t ldk, const float *v, int64_t ldv, const int32_t *slot,
                             int64_t n);
cudaError_t lks__cu_attention(cudaStream_t st, float *out, int64_t ldo, const float *q,
                              int64_t ldq, const float *K, const float *V, int n_kv_heads,
                              int head_dim, int n_heads, int block_size, const int32_t *seq,
                              const int32_t *pos, const int32_t *block_table, int max_blocks,
                              int n, float scale);
// scratch: [n, 2 E] floats; bias [E] f32 or NULL; ids, w: [n, top_k].
cudaError_t lks__cu_route(cudaStream_t st, const float *logits, int64_t ld, const float *bias,
                          int n, int E, int top_k, int n_group, int topk_group, int norm,
                          float scaling, float *scratch, int32_t *ids, float *w);
// g = silu(g) * u over `count` contiguous elements.
cudaError_t lks__cu_swiglu(cudaStream_t st, float *g, const float *u, int64_t count);
// out[rows[i]] = fma(w[i], d[i], out[rows[i]]) for i in order (rows NULL: i; w NULL: 1).
cudaError_t lks__cu_scatter_add(cudaStream_t st, float *out, int64_t ldo, const float *d,
                                int64_t ldd, const int32_t *rows, const float *w, int n,
                                int64_t cols);
cudaError_t lks__cu_gather_rows(cudaStream_t st, float *out, int64_t ldo, const float *x,
                                int64_t ldx, const int32_t *rows, int64_t n, int64_t cols);
// Per row: the index of the maximum (ties: the lowest index) and the maximum.
cudaError_t lks__cu_argmax(cudaStream_t st, const float *x, int64_t ldx, int64_t n, int64_t V,
                           int32_t *idx, float *val);


// ---- glm_moe_dsa (mla.cu; the semantics of backend.h's ops of the same names) ----
// Per row: out = (x - mean) / sqrt(var + eps) * w + b; w, b [H] of dtypes wdt, bdt.
cudaError_t lks__cu_layernorm(cudaStream_t st, float *out, int64_t ldo, const float *x,
                              int64_t ldx, const void *w, int wdt, const void *b, int bdt,
                              int64_t n, int64_t H, float eps);
// pool[slot[r] * width ..] = x[r, 0..width) for r < n.
cudaError_t lks__cu_cache_store(cudaStream_t st, float *pool, int64_t width, const float *x,
                                int64_t ldx, const int32_t *slot, int64_t n);
// The indexer's selection for n rows: sel [n, topk] (ascending positions), n_sel [n]. K: the
// key pool [slots, D]; scores: scratch of n * max_keys floats, max_keys >= every pos[r] + 1.
cudaError_t lks__cu_dsa_select(cudaStream_t st, const float *q, int64_t ldq, const float *w,
                               int64_t ldw, const float *K, int D, int n_heads, float q_scale,
                               float w_scale, int topk, int bs, const int32_t *seq,
                               const int32_t *pos, const int32_t *bt, int max_blocks, int n,
                               int max_keys, float *scores, int32_t *sel, int32_t *n_sel);
// Absorbed MLA attention over the latent pool C [slots, latent + rope]; wkv_b [n_heads *
// (nope + v_dim), latent] of dtype wdt, row stride ldw; sel NULL: every position 0..pos[r].
cudaError_t lks__cu_mla_attention(cudaStream_t st, float *out, int64_t ldo, const float *q,
                                  int64_t ldq, const void *wkv_b, int wdt, int64_t ldw,
                                  const float *C, int latent, int nope, int rope, int v_dim,
                                  int n_heads, float scale, int block_size, const int32_t *seq,
                                  const int32_t *pos, const int32_t *block_table, int max_blocks,
                                  const int32_t *sel, const int32_t *n_sel, int sel_stride,
                                  int n);

#ifdef __cplusplus
}
#endif

#endif
