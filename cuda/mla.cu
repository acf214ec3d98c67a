// SPDX-License-Identifier: MIT
// The CUDA kernels of glm_moe_dsa's ops (backend.h: layernorm, cache_store, dsa_select,
// mla_attention) and their launchers (cuda_impl.h). They follow the CPU reference
// (core/cpu_mla.c) op for op: f32 activations, caches and accumulation (LayerNorm's mean and
// variance in double, as there), weights widened exactly to f32, the indexer's top-k exact with
// ties to the lower position.
//
// Batch invariance: every result row is computed by threads that serve that row alone, and each
// sum runs in an order fixed by the sizes of the op (head dims, the number of keys of the row,
// the block size): a lane's strided partial sum, then the fixed trees of device.cuh. Nothing
// depends on how many rows are in the batch or where they sit, so speculative verify and plain
// decode select the same keys and produce the same bits.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/dtype.h"
#include "cuda/cuda_impl.h"
#include "cuda/device.cuh"

namespace {

enum { LN_THREADS = 256, STORE_THREADS = 128, SCORE_WARPS = 8, SELECT_THREADS = 256,
       MLA_THREADS = 128, MLA_CHUNK = 128 };

// The cache slot of position p of a row's sequence.
__device__ __forceinline__ int64_t slot_at(const int32_t *bt, int max_blocks, int bs, int seq,
                                           int p) {
  return (int64_t)bt[(int64_t)seq * max_blocks + p / bs] * bs + p % bs;
}

// ---- LayerNorm: one block per row ----

__device__ double block_sum_d(double v, double *red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = lane < nw ? red[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

__global__ void layernorm_k(float *out, int64_t ldo, const float *x, int64_t ldx, const void *w,
                            int wdt, const void *b, int bdt, int64_t H, float eps) {
  __shared__ double red[32];
  const float *xr = x + blockIdx.x * ldx;
  float *o = out + blockIdx.x * ldo;
  double s = 0;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) s += xr[i];
  double mean = block_sum_d(s, red) / (double)H;
  double v = 0;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    v += ((double)xr[i] - mean) * ((double)xr[i] - mean);
  v = block_sum_d(v, red);
  float inv = (float)(1.0 / sqrt(v / (double)H + eps)), mu = (float)mean;
  // Every read of x is behind the last reduction's barriers: out may be x.
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    o[i] = (xr[i] - mu) * inv * load(w, wdt, i) + load(b, bdt, i);
}

// ---- cache_store: row r of x into the pool at slot[r] ----

__global__ void cache_store_k(float *pool, int64_t width, const float *x, int64_t ldx,
                              const int32_t *slot) {
  int64_t r = blockIdx.x, s = slot[r];
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) pool[s * width + i] = x[r * ldx + i];
}

// ---- the DSA indexer ----

// Scores of one row group: a warp per (row, key), the row's queries and weights in shared memory.
// score = sum over heads h in order of (w[h] * w_scale) * relu(q_h . k * q_scale), each dot a
// lane's strided sum then the warp's fixed tree. Rows whose keys all fit the top-k need none.
__global__ void dsa_scores_k(float *scores, int64_t lds, const float *q, int64_t ldq,
                             const float *w, int64_t ldw, const float *K, int D, int n_heads,
                             float q_scale, float w_scale, int topk, int bs, const int32_t *seq,
                             const int32_t *pos, const int32_t *bt, int max_blocks) {
  extern __shared__ float sm[];
  float *qs = sm, *ws = qs + (size_t)n_heads * D;
  int row = blockIdx.y, n_keys = pos[row] + 1;
  if (n_keys <= topk) return;
  for (int i = threadIdx.x; i < n_heads * D; i += blockDim.x) qs[i] = q[row * ldq + i];
  for (int h = threadIdx.x; h < n_heads; h += blockDim.x) ws[h] = w[row * ldw + h] * w_scale;
  __syncthreads();
  int lane = threadIdx.x & 31, s = blockIdx.x * SCORE_WARPS + (threadIdx.x >> 5);
  if (s >= n_keys) return;  // whole warps: no barrier follows
  const float *k = K + slot_at(bt, max_blocks, bs, seq[row], s) * D;
  float acc = 0.0f;
  for (int h = 0; h < n_heads; h++) {
    float d = 0.0f;
    for (int i = lane; i < D; i += 32) d += qs[h * D + i] * k[i];
    d = warp_sum(d) * q_scale;
    if (d > 0) acc += ws[h] * d;
  }
  if (lane == 0) scores[row * lds + s] = acc;
}

// Order-preserving map of a float to an unsigned key (larger float, larger key; -0 as +0).
__device__ __forceinline__ uint32_t okey(float f) {
  if (f == 0.0f) f = 0.0f;
  uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum over the block (thread order) of v; *total gets the sum. buf: blockDim
// ints of shared memory. Integer sums: exact.
__device__ int block_scan(int v, int *buf, int *total) {
  int t = threadIdx.x, n = blockDim.x;
  __syncthreads();  // buf may still be read by the previous call
  buf[t] = v;
  __syncthreads();
  for (int off = 1; off < n; off <<= 1) {
    int a = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += a;
    __syncthreads();
  }
  *total = buf[n - 1];
  return buf[t] - v;
}

// The selection of one row, one block: T = the topk-th largest score, by a bitwise search of its
// key from the top bit (each step counts the keys above the current prefix, exactly); then, in
// position order, every key above T and the first (lowest) positions equal to T until topk are
// taken: the CPU's sort by (score desc, position asc), cut at topk, sorted by position.
__global__ void dsa_select_k(const float *scores, int64_t lds, int topk, const int32_t *pos,
                             int32_t *sel, int32_t *n_sel) {
  __shared__ int buf[SELECT_THREADS];
  __shared__ int count;
  int row = blockIdx.x, n_keys = pos[row] + 1, t = threadIdx.x;
  int32_t *out = sel + (int64_t)row * topk;
  if (n_keys <= topk) {
    for (int s = t; s < n_keys; s += blockDim.x) out[s] = s;
    if (t == 0) n_sel[row] = n_keys;
    return;
  }
  const float *sc = scores + row * lds;
  uint32_t prefix = 0, mask = 0;
  int remaining = topk;  // how many still to take from the keys matching prefix under mask
  for (int bit = 31; bit >= 0; bit--) {
    uint32_t b = 1u << bit;
    int c = 0;
    for (int s = t; s < n_keys; s += blockDim.x) {
      uint32_t k = okey(sc[s]);
      c += (k & mask) == prefix && (k & b);
    }
    if (t == 0) count = 0;
    __syncthreads();
    atomicAdd(&count, c);
    __syncthreads();
    c = count;
    __syncthreads();  // count is reset next round
    if (c >= remaining)
      prefix |= b;
    else
      remaining -= c;
    mask |= b;
  }
  // prefix is T; `remaining` keys equal to T are taken, lowest positions first.
  int eq_seen = 0, n_out = 0;
  for (int c0 = 0; c0 < n_keys; c0 += blockDim.x) {
    int s = c0 + t;
    uint32_t k = s < n_keys ? okey(sc[s]) : 0;
    int eq = s < n_keys && k == prefix, gt = s < n_keys && k > prefix, eq_total, take_total;
    int eq_before = block_scan(eq, buf, &eq_total);
    int take = gt || (eq && eq_seen + eq_before < remaining);
    int at = block_scan(take, buf, &take_total);
    if (take) out[n_out + at] = s;
    eq_seen += eq_total;
    n_out += take_total;
  }
  if (t == 0) n_sel[row] = n_out;
}

// ---- MLA attention, absorbed: one block per (row, head) ----

// q_full = [W_uk^T q_nope | q_pe] (latent + rope), a thread per latent column summing the nope
// dims in order. Keys in chunks of MLA_CHUNK: scores a warp per key (q_full . cache row, times
// scale), an online softmax across chunks (running maximum and sum, fixed chunk boundaries), the
// latent output a thread per column summing the chunk's keys in order; finally
// out = W_uv (o_lat / sum), a warp per value dim.
__global__ void mla_attention_k(float *out, int64_t ldo, const float *q, int64_t ldq,
                                const void *wkv, int wdt, int64_t ldw, const float *C, int R,
                                int dn, int dr, int dv, int n_heads, float scale, int bs,
                                const int32_t *seq, const int32_t *pos, const int32_t *bt,
                                int max_blocks, const int32_t *sel, const int32_t *n_sel,
                                int sel_stride) {
  extern __shared__ float sm[];
  int W = R + dr;
  float *qf = sm, *acc = qf + W, *s = acc + R, *red = s + MLA_CHUNK;
  int off = W + R + MLA_CHUNK + 32;
  int64_t *slots = (int64_t *)(sm + off + (off & 1));  // 8-byte aligned
  int row = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const float *qr = q + row * ldq + (int64_t)h * (dn + dr);
  int64_t r0 = (int64_t)h * (dn + dv);  // head h's rows of kv_b: dn of W_uk, then dv of W_uv
  for (int c = tid; c < R; c += blockDim.x) {
    float a = 0.0f;
    for (int i = 0; i < dn; i++) a += qr[i] * load(row_of(wkv, wdt, r0 + i, ldw), wdt, c);
    qf[c] = a;
    acc[c] = 0.0f;
  }
  for (int i = tid; i < dr; i += blockDim.x) qf[R + i] = qr[dn + i];
  const int32_t *keys = sel ? sel + (int64_t)row * sel_stride : nullptr;
  int n_keys = sel ? n_sel[row] : pos[row] + 1;
  float m = -INFINITY, l = 0.0f;
  __syncthreads();
  for (int c0 = 0; c0 < n_keys; c0 += MLA_CHUNK) {
    int cn = min(MLA_CHUNK, n_keys - c0);
    for (int i = tid; i < cn; i += blockDim.x) {
      int p = keys ? keys[c0 + i] : c0 + i;
      slots[i] = slot_at(bt, max_blocks, bs, seq[row], p);
    }
    __syncthreads();
    for (int i = warp; i < cn; i += nw) {
      const float *kr = C + slots[i] * W;
      float d = 0.0f;
      for (int j = lane; j < W; j += 32) d += kr[j] * qf[j];
      d = warp_sum(d);
      if (lane == 0) s[i] = d * scale;
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int i = tid; i < cn; i += blockDim.x) cm = fmaxf(cm, s[i]);
    cm = block_max(cm, red);
    float mn = fmaxf(m, cm);
    float alpha = m == -INFINITY ? 0.0f : expf(m - mn);
    float ls = 0.0f;
    for (int i = tid; i < cn; i += blockDim.x) {
      float e = expf(s[i] - mn);
      s[i] = e;
      ls += e;
    }
    ls = block_sum(ls, red);  // its barriers also publish s[]
    l = l * alpha + ls;
    m = mn;
    for (int c = tid; c < R; c += blockDim.x) {
      float a = acc[c] * alpha;
      for (int i = 0; i < cn; i++) a += s[i] * C[slots[i] * W + c];
      acc[c] = a;
    }
    __syncthreads();  // s[] and slots[] are rewritten by the next chunk
  }
  for (int c = tid; c < R; c += blockDim.x) acc[c] = acc[c] / l;
  __syncthreads();
  float *o = out + row * ldo + (int64_t)h * dv;
  for (int v = warp; v < dv; v += nw) {
    const void *u = row_of(wkv, wdt, r0 + dn + v, ldw);
    float d = 0.0f;
    for (int c = lane; c < R; c += 32) d += load(u, wdt, c) * acc[c];
    d = warp_sum(d);
    if (lane == 0) o[v] = d;
  }
}

cudaError_t smem_for(const void *kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

}  // namespace

extern "C" {

cudaError_t lks__cu_layernorm(cudaStream_t st, float *out, int64_t ldo, const float *x,
                              int64_t ldx, const void *w, int wdt, const void *b, int bdt,
                              int64_t n, int64_t H, float eps) {
  if (n > 0) layernorm_k<<<(unsigned)n, LN_THREADS, 0, st>>>(out, ldo, x, ldx, w, wdt, b, bdt, H, eps);
  return cudaGetLastError();
}

cudaError_t lks__cu_cache_store(cudaStream_t st, float *pool, int64_t width, const float *x,
                                int64_t ldx, const int32_t *slot, int64_t n) {
  if (n > 0) cache_store_k<<<(unsigned)n, STORE_THREADS, 0, st>>>(pool, width, x, ldx, slot);
  return cudaGetLastError();
}

cudaError_t lks__cu_dsa_select(cudaStream_t st, const float *q, int64_t ldq, const float *w,
                               int64_t ldw, const float *K, int D, int n_heads, float q_scale,
                               float w_scale, int topk, int bs, const int32_t *seq,
                               const int32_t *pos, const int32_t *bt, int max_blocks, int n,
                               int max_keys, float *scores, int32_t *sel, int32_t *n_sel) {
  if (n <= 0) return cudaGetLastError();
  size_t smem = ((size_t)n_heads * D + (size_t)n_heads) * sizeof(float);
  cudaError_t e = smem_for((const void *)dsa_scores_k, smem);
  if (e != cudaSuccess) return e;
  dim3 grid((unsigned)((max_keys + SCORE_WARPS - 1) / SCORE_WARPS), (unsigned)n);
  dsa_scores_k<<<grid, SCORE_WARPS * 32, smem, st>>>(scores, max_keys, q, ldq, w, ldw, K, D,
                                                     n_heads, q_scale, w_scale, topk, bs, seq,
                                                     pos, bt, max_blocks);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  dsa_select_k<<<(unsigned)n, SELECT_THREADS, 0, st>>>(scores, max_keys, topk, pos, sel, n_sel);
  return cudaGetLastError();
}

cudaError_t lks__cu_mla_attention(cudaStream_t st, float *out, int64_t ldo, const float *q,
                                  int64_t ldq, const void *wkv_b, int wdt, int64_t ldw,
                                  const float *C, int latent, int nope, int rope, int v_dim,
                                  int n_heads, float scale, int block_size, const int32_t *seq,
                                  const int32_t *pos, const int32_t *block_table, int max_blocks,
                                  const int32_t *sel, const int32_t *n_sel, int sel_stride,
                                  int n) {
  if (n <= 0 || n_heads <= 0) return cudaGetLastError();
  int floats = (latent + rope) + latent + MLA_CHUNK + 32;
  floats += floats & 1;  // the slots that follow are 8-byte aligned
  size_t smem = (size_t)floats * sizeof(float) + MLA_CHUNK * sizeof(int64_t);
  cudaError_t e = smem_for((const void *)mla_attention_k, smem);
  if (e != cudaSuccess) return e;
  mla_attention_k<<<(unsigned)(n * n_heads), MLA_THREADS, smem, st>>>(
      out, ldo, q, ldq, wkv_b, wdt, ldw, C, latent, nope, rope, v_dim, n_heads, scale, block_size,
      seq, pos, block_table, max_blocks, sel, n_sel, sel_stride);
  return cudaGetLastError();
}

}  // extern "C"
