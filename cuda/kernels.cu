// SPDX-License-Identifier: MIT
// The kernels of the CUDA backend and their launchers (see cuda_impl.h). They follow the CPU
// reference (core/backend_cpu.c) op for op: f32 activations and accumulation everywhere, weights
// widened exactly from BF16/F16 to f32 before the multiply, ties of arg-max and routing to the
// lowest index. Strided views arrive as (pointer, leading dimension in elements).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/dtype.h"
#include "cuda/cuda_impl.h"
#include "cuda/device.cuh"

namespace {

static unsigned blocks_for(int64_t n, int per) {
  int64_t b = (n + per - 1) / per;
  if (b > 65535 * 32) b = 65535 * 32;
  return (unsigned)(b > 0 ? b : 1);
}

// ---- element-wise ----

__global__ void embed_k(float *out, int64_t ldo, const void *table, int dt, int64_t ldt,
                        const int32_t *ids, int64_t H) {
  int64_t r = blockIdx.x;
  const void *src = row_of(table, dt, ids[r], ldt);
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[r * ldo + i] = load(src, dt, i);
}

__global__ void rmsnorm_k(float *out, int64_t ldo, const float *x, int64_t ldx, const void *w,
                          int wdt, int64_t H, float eps) {
  __shared__ float red[32];
  const float *xr = x + blockIdx.x * ldx;
  float *o = out + blockIdx.x * ldo;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  float inv = (float)(1.0 / sqrt((double)ss / (double)H + eps));
  // Each thread reads and writes only its own elements: out may be x.
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) o[i] = load(w, wdt, i) * (xr[i] * inv);
}

__global__ void convert_k(void *dst, int ddt, int64_t ldd, const void *src, int sdt, int64_t lds,
                          int64_t rows, int64_t cols) {
  int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / cols, c = e % cols;
    float v = load(row_of(src, sdt, r, lds), sdt, c);
    if (ddt == LKS_F32)
      ((float *)dst)[r * ldd + c] = v;
    else
      ((uint16_t *)dst)[r * ldd + c] = to_bf16(v);
  }
}

__global__ void add_bias_k(float *out, int64_t ldo, const void *bias, int bdt, int64_t n,
                           int64_t M) {
  int64_t total = n * M;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x)
    out[(e / M) * ldo + e % M] += load(bias, bdt, e % M);
}

// One thread per (row, rotated pair); the angle in double, as the CPU computes it.
__global__ void rope_k(float *x, int64_t ldx, int64_t n, int heads, int head_dim, int rot,
                       float theta, int interleaved, const int32_t *pos) {
  int half = rot / 2;
  int64_t total = n * half;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / half;
    int j = (int)(e % half);
    double freq = pow((double)theta, -2.0 * j / rot);
    double ang = (double)pos[r] * freq;
    float cs = (float)cos(ang), sn = (float)sin(ang);
    int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
    for (int h = 0; h < heads; h++) {
      float *v = x + r * ldx + (int64_t)h * head_dim;
      float x0 = v[a], x1 = v[b];
      v[a] = x0 * cs - x1 * sn;
      v[b] = x1 * cs + x0 * sn;
    }
  }
}

__global__ void kv_store_k(float *K, float *V, int64_t width, const float *k, int64_t ldk,
                           const float *v, int64_t ldv, const int32_t *slot) {
  int64_t r = blockIdx.x, s = slot[r];
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    K[s * width + i] = k[r * ldk + i];
    V[s * width + i] = v[r * ldv + i];
  }
}

__global__ void swiglu_k(float *g, const float *u, int64_t count) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < count;
       e += (int64_t)gridDim.x * blockDim.x)
    g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
}

// One thread per column walks the rows in order: repeated rows add up as on the CPU. The same
// rounding as the matrix kernel's mode 2, so that the expert's two paths agree bit for bit.
__global__ void scatter_add_k(float *out, int64_t ldo, const float *d, int64_t ldd,
                              const int32_t *rows, const float *w, int n, int64_t cols) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
       c += (int64_t)gridDim.x * blockDim.x)
    for (int i = 0; i < n; i++) {
      int64_t r = rows ? rows[i] : i;
      float wi = w ? w[i] : 1.0f;
      out[r * ldo + c] = __fmaf_rn(wi, d[(int64_t)i * ldd + c], out[r * ldo + c]);
    }
}

__global__ void gather_rows_k(float *out, int64_t ldo, const float *x, int64_t ldx,
                              const int32_t *rows, int64_t cols) {
  int64_t r = blockIdx.x, s = rows[r];
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[r * ldo + i] = x[s * ldx + i];
}

// ---- matrix products ----

// Every matrix product, whatever its number of activation rows, is this kernel, so that a row's
// result never depends on the batch it came in (speculative verify batches the rows plain decode
// computes one by one, and greedy output must not change with it). The arithmetic of one output
// element (t, m) = sum_k x[t, k] w[m, k] is fixed by K alone:
//   K is cut into chunks of 8 (chunk c holds k = 8c .. 8c + 7, the last one maybe shorter);
//   lane l of the warp that owns weight row m takes the chunks c = l, l + 32, l + 64, ... in
//   increasing order: s = 0, then s = fma(w[k], x[t, k], s) over the chunk's k in order, then
//   p_l = p_l + s (p_l starts at 0);
//   the 32 partials are summed by the xor butterfly (offsets 16, 8, 4, 2, 1), which leaves the
//   same value in every lane (float addition is commutative);
//   then + bias (when there is one), and for the output modes below one more rounding each.
// Nothing of this depends on n, on which other rows share the launch, on R (weight rows per
// warp), on where a row sits in its group of LKS__CU_GEMV_ROWS, or on the 16-byte path (which
// loads the same chunks and does the same fmas): the fmas and adds are written as __fmaf_rn and
// __fadd_rn so the compiler cannot contract or reorder them differently in the two paths.
//
// One warp owns R weight rows and the activation rows t0 .. t0 + 7 of its group (blockIdx.y):
// each weight chunk it loads serves up to 8 x R products. Weight rows m < M belong to w (into
// out), rows M <= m < M + M2 to w2 (into out2): gate and up of an expert in one launch. The
// input row t is x[xrows[t]] (x[t] when xrows is NULL); output row t is orows[t] (t when NULL).
// mode: 0 store d (+ b), 1 add d (+ b), 2 out = fma(scale[t], d, out) (scale NULL: 1), the
// expert's weighted scatter-add. One lane writes all rows of one column in row order: repeated
// output rows of one group add up in order (the expert path keeps repeated rows to one group).
//
// Grouped mode (groups non-NULL, the moe op): blockIdx.y is an entry {expert, first, count, 0}
// of the group table; the warp serves rows first .. first + count - 1 (count 0: none) with the
// weights of wt[expert] (and wt2[expert]) instead of w (and w2); the arithmetic is unchanged.
struct GemvArgs {
  const int4 *groups;
  const void *const *wt, *const *wt2;
  float *out, *out2;
  int64_t ldo, ldo2;
  const float *x;
  int64_t ldx;
  const int32_t *xrows, *orows;
  const float *scale;
  const void *w, *w2;
  int64_t ldw, ldw2, M, M2;
  const void *bias;
  int bdt, n;
  int64_t K;
  int mode;
};

enum { GT = LKS__CU_GEMV_ROWS };  // activation rows per warp

template <int DT, bool VEC, int R>
__global__ void gemv_k(GemvArgs a) {
  int lane = threadIdx.x & 31;
  int64_t Mt = a.M + a.M2;
  int64_t m0 = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  if (m0 >= Mt) return;
  int t0, nt;
  const void *w1 = a.w, *w2 = a.w2;
  if (a.groups) {
    int4 g = a.groups[blockIdx.y];
    if (g.z <= 0) return;
    t0 = g.y;
    nt = g.z;
    w1 = a.wt[g.x];
    if (a.wt2) w2 = a.wt2[g.x];
  } else {
    t0 = (int)blockIdx.y * GT;
    nt = min(GT, a.n - t0);
  }
  const char *wr[R];
  float *orow[R];
  int64_t ldo[R];
  bool live[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    int64_t m = m0 + r;
    live[r] = m < Mt;
    if (!live[r]) m = m0;  // computed, never written
    bool second = m >= a.M;
    int64_t mm = second ? m - a.M : m;
    wr[r] = (const char *)row_of(second ? w2 : w1, DT, mm, second ? a.ldw2 : a.ldw);
    orow[r] = (second ? a.out2 : a.out) + mm;
    ldo[r] = second ? a.ldo2 : a.ldo;
  }
  const float *xr[GT];
  float acc[R][GT];
#pragma unroll
  for (int t = 0; t < GT; t++) {
    int tt = t0 + (t < nt ? t : 0);
    int64_t row = a.xrows ? a.xrows[tt] : tt;
    xr[t] = a.x + row * a.ldx;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][t] = 0.0f;
  }
  int64_t chunks = (a.K + 7) / 8;
#pragma unroll 2
  for (int64_t c = lane; c < chunks; c += 32) {
    int64_t k0 = c * 8;
    int kn = a.K - k0 < 8 ? (int)(a.K - k0) : 8;
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; r++) {
      if (VEC) {
        uint4 q = __ldg((const uint4 *)wr[r] + c);
        wf[r][0] = __uint_as_float(q.x << 16);
        wf[r][1] = __uint_as_float(q.x & 0xffff0000u);
        wf[r][2] = __uint_as_float(q.y << 16);
        wf[r][3] = __uint_as_float(q.y & 0xffff0000u);
        wf[r][4] = __uint_as_float(q.z << 16);
        wf[r][5] = __uint_as_float(q.z & 0xffff0000u);
        wf[r][6] = __uint_as_float(q.w << 16);
        wf[r][7] = __uint_as_float(q.w & 0xffff0000u);
      } else {
#pragma unroll
        for (int i = 0; i < 8; i++) wf[r][i] = i < kn ? load(wr[r], DT, k0 + i) : 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < GT; t++) {
      if (t >= nt) break;
      float v[8];
      if (VEC) {
        const float4 *xp = (const float4 *)(xr[t] + k0);
        float4 p = __ldg(xp), q2 = __ldg(xp + 1);
        v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w;
        v[4] = q2.x, v[5] = q2.y, v[6] = q2.z, v[7] = q2.w;
      } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = i < kn ? __ldg(xr[t] + k0 + i) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < R; r++) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
          if (VEC || i < kn) s = __fmaf_rn(wf[r][i], v[i], s);
        acc[r][t] = __fadd_rn(acc[r][t], s);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    bool first = m0 + r < a.M;
    float b = 0.0f;
    if (a.bias && first) b = load(a.bias, a.bdt, m0 + r);
#pragma unroll
    for (int t = 0; t < GT; t++) {
      if (t >= nt) break;
      float d = warp_sum(acc[r][t]);
      if (a.bias && first) d = __fadd_rn(d, b);
      if (lane == r && live[r]) {
        int tt = t0 + t;
        float *o = orow[r] + (a.orows ? (int64_t)a.orows[tt] : (int64_t)tt) * ldo[r];
        if (a.mode == 0)
          *o = d;
        else if (a.mode == 1)
          *o = __fadd_rn(*o, d);
        else
          *o = __fmaf_rn(a.scale ? a.scale[tt] : 1.0f, d, *o);
      }
    }
  }
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <int R>
void launch_gemv_r(cudaStream_t st, const GemvArgs &a, int wdt, bool vec, dim3 grid) {
  const int threads = 8 * 32;
  if (vec)
    gemv_k<LKS_BF16, true, R><<<grid, threads, 0, st>>>(a);
  else if (wdt == LKS_BF16)
    gemv_k<LKS_BF16, false, R><<<grid, threads, 0, st>>>(a);
  else if (wdt == LKS_F16)
    gemv_k<LKS_F16, false, R><<<grid, threads, 0, st>>>(a);
  else
    gemv_k<LKS_F32, false, R><<<grid, threads, 0, st>>>(a);
}

// n_groups: the entries of a.groups (grouped mode, where the caller has checked that every
// table entry is 16-byte aligned when tab_aligned); else ignored.
cudaError_t launch_gemv(cudaStream_t st, const GemvArgs &a, int wdt, int64_t n_groups = 0,
                        bool tab_aligned = false) {
  if (a.n <= 0 || a.M + a.M2 <= 0) return cudaGetLastError();
  int64_t groups = a.groups ? n_groups : ((int64_t)a.n + GT - 1) / GT;
  if (groups <= 0) return cudaGetLastError();
  if (groups > 65535) return cudaErrorInvalidValue;
  bool w_ok = a.groups ? tab_aligned
                       : aligned16(a.w) && (!a.w2 || aligned16(a.w2));
  bool vec = wdt == LKS_BF16 && a.K % 8 == 0 && a.ldw % 8 == 0 && w_ok && a.ldx % 4 == 0 &&
             aligned16(a.x) && (!(a.w2 || a.wt2) || a.ldw2 % 8 == 0);
  // Decode (a few rows) spreads the weights over as many warps as possible; larger batches give
  // each warp 4 weight rows, so that every activation chunk it loads serves 4 x 8 products.
  // Either way the arithmetic of an element is the same (see above). a.n is the batch's rows
  // (in grouped mode: the activation rows the pairs come from).
  int R = (a.groups ? a.n <= GT : groups == 1) ? 1 : 4;
  int64_t rows_per_block = 8 * (int64_t)R;
  dim3 grid((unsigned)((a.M + a.M2 + rows_per_block - 1) / rows_per_block), (unsigned)groups);
  if (R == 1)
    launch_gemv_r<1>(st, a, wdt, vec, grid);
  else
    launch_gemv_r<4>(st, a, wdt, vec, grid);
  return cudaGetLastError();
}

// ---- attention over the paged cache ----

enum { ATT_THREADS = 128, ATT_CHUNK = 256 };

// One block per (row, query head). Scores of ATT_CHUNK positions at a time go to shared memory
// (a warp per position); an online softmax carries the running maximum and sum across chunks,
// so any context length fits. Each thread owns the output dimensions d = tid, tid + 128, ...
__global__ void attention_k(float *out, int64_t ldo, const float *q, int64_t ldq, const float *K,
                            const float *V, int n_kv_heads, int hd, int n_heads, int bs,
                            const int32_t *seq, const int32_t *pos, const int32_t *bt,
                            int max_blocks, float scale) {
  extern __shared__ float sm[];
  float *qs = sm, *acc = qs + hd, *s = acc + hd, *red = s + ATT_CHUNK;
  int *slots = (int *)(red + 32);
  int row = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  int kvh = h / (n_heads / n_kv_heads);
  int64_t kv_ld = (int64_t)n_kv_heads * hd;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  for (int d = tid; d < hd; d += blockDim.x) {
    qs[d] = q[row * ldq + (int64_t)h * hd + d];
    acc[d] = 0.0f;
  }
  const int32_t *table = bt + (int64_t)seq[row] * max_blocks;
  int n_pos = pos[row] + 1;
  float m = -INFINITY, l = 0.0f;
  __syncthreads();
  for (int c0 = 0; c0 < n_pos; c0 += ATT_CHUNK) {
    int cn = min(ATT_CHUNK, n_pos - c0);
    for (int p = tid; p < cn; p += blockDim.x) {
      int pp = c0 + p;
      slots[p] = table[pp / bs] * bs + pp % bs;
    }
    __syncthreads();
    // Unrolled so that the loads of several positions are in flight at once (decode runs one
    // block per head: latency, not bandwidth, bounds it); the arithmetic per position is unchanged.
#pragma unroll 4
    for (int p = warp; p < cn; p += nw) {
      const float *kr = K + (int64_t)slots[p] * kv_ld + (int64_t)kvh * hd;
      float d = 0.0f;
      for (int i = lane; i < hd; i += 32) d += kr[i] * qs[i];
      d = warp_sum(d);
      if (lane == 0) s[p] = d * scale;
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int p = tid; p < cn; p += blockDim.x) cm = fmaxf(cm, s[p]);
    cm = block_max(cm, red);
    float mn = fmaxf(m, cm);
    float alpha = m == -INFINITY ? 0.0f : expf(m - mn);
    float ls = 0.0f;
    for (int p = tid; p < cn; p += blockDim.x) {
      float e = expf(s[p] - mn);
      s[p] = e;
      ls += e;
    }
    ls = block_sum(ls, red);  // its barriers also publish s[]
    l = l * alpha + ls;
    m = mn;
    for (int d = tid; d < hd; d += blockDim.x) {
      float a = acc[d] * alpha;
      const float *vb = V + (int64_t)kvh * hd + d;
#pragma unroll 8
      for (int p = 0; p < cn; p++) a += s[p] * vb[(int64_t)slots[p] * kv_ld];
      acc[d] = a;
    }
    __syncthreads();  // s[] and slots[] are rewritten by the next chunk
  }
  for (int d = tid; d < hd; d += blockDim.x) out[row * ldo + (int64_t)h * hd + d] = acc[d] / l;
}

// ---- router ----

// One thread per row runs the CPU algorithm as written: sigmoid scores, selection scores with
// the correction bias, groups by the sum of their two best, top-k by repeated arg-max with ties
// to the lower id, weights from the plain scores, normalisation, scaling.
__global__ void route_k(const float *logits, int64_t ld, const float *bias, int n, int E,
                        int top_k, int n_group, int topk_group, int norm, float scaling,
                        float *scratch, int32_t *ids, float *weights) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  float *s = scratch + (int64_t)r * 2 * E, *sel = s + E;
  const float *l = logits + (int64_t)r * ld;
  for (int e = 0; e < E; e++) {
    s[e] = 1.0f / (1.0f + expf(-l[e]));
    sel[e] = s[e] + (bias ? bias[e] : 0.0f);
  }
  int per_group = E / n_group;
  if (n_group > 1) {
    float gscore[256];
    bool keep[256];
    for (int g = 0; g < n_group; g++) {
      keep[g] = false;
      float a = -INFINITY, b = -INFINITY;
      for (int e = g * per_group; e < (g + 1) * per_group; e++) {
        if (sel[e] > a) {
          b = a;
          a = sel[e];
        } else if (sel[e] > b) {
          b = sel[e];
        }
      }
      gscore[g] = per_group > 1 ? a + b : a;
    }
    for (int k = 0; k < topk_group; k++) {
      int best = -1;
      for (int g = 0; g < n_group; g++)
        if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      keep[best] = true;
    }
    for (int e = 0; e < E; e++)
      if (!keep[e / per_group]) sel[e] = -INFINITY;
  }
  int32_t *id = ids + (int64_t)r * top_k;
  float *w = weights + (int64_t)r * top_k;
  float sum = 0.0f;
  for (int k = 0; k < top_k; k++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int q = 0; q < k; q++) taken |= id[q] == e;
      if (!taken && (best < 0 || sel[e] > sel[best])) best = e;
    }
    id[k] = best;
    w[k] = s[best];
    sum += w[k];
  }
  for (int k = 0; k < top_k; k++) {
    if (norm) w[k] /= sum + 1e-20f;
    w[k] *= scaling;
  }
}

// ---- arg-max ----

__device__ __forceinline__ void better(float &bv, int &bi, float v, int i) {
  if (i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi))) {
    bv = v;
    bi = i;
  }
}

__global__ void argmax_k(const float *x, int64_t ldx, int64_t V, int32_t *idx, float *val) {
  __shared__ float rv[32];
  __shared__ int ri[32];
  const float *xr = x + blockIdx.x * ldx;
  float bv = -INFINITY;
  int bi = -1;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) better(bv, bi, xr[i], (int)i);
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    better(bv, bi, ov, oi);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    rv[warp] = bv;
    ri[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) better(bv, bi, rv[w], ri[w]);
    idx[blockIdx.x] = bi < 0 ? 0 : bi;
    val[blockIdx.x] = bi < 0 ? xr[0] : bv;
  }
}

}  // namespace

// ---- launchers ----

extern "C" {

cudaError_t lks__cu_embed(cudaStream_t st, float *out, int64_t ldo, const void *table, int dt,
                          int64_t ldt, const int32_t *ids, int64_t n, int64_t H) {
  if (n > 0) embed_k<<<(unsigned)n, 256, 0, st>>>(out, ldo, table, dt, ldt, ids, H);
  return cudaGetLastError();
}

cudaError_t lks__cu_rmsnorm(cudaStream_t st, float *out, int64_t ldo, const float *x, int64_t ldx,
                            const void *w, int wdt, int64_t n, int64_t H, float eps) {
  if (n > 0) rmsnorm_k<<<(unsigned)n, 256, 0, st>>>(out, ldo, x, ldx, w, wdt, H, eps);
  return cudaGetLastError();
}

cudaError_t lks__cu_gemv(cudaStream_t st, float *out, int64_t ldo, const float *x, int64_t ldx,
                         const void *w, int wdt, int64_t ldw, const void *bias, int bdt,
                         int64_t n, int64_t M, int64_t K, int accumulate) {
  GemvArgs a = {};
  a.out = out;
  a.ldo = ldo;
  a.x = x;
  a.ldx = ldx;
  a.w = w;
  a.ldw = ldw;
  a.M = M;
  a.bias = bias;
  a.bdt = bdt;
  a.n = (int)n;
  a.K = K;
  a.mode = accumulate ? 1 : 0;
  return launch_gemv(st, a, wdt);
}

cudaError_t lks__cu_gemv_gate_up(cudaStream_t st, float *g, float *u, int64_t ldo,
                                 const float *x, int64_t ldx, const int32_t *rows,
                                 const void *gate, int64_t ld_gate, const void *up,
                                 int64_t ld_up, int wdt, int64_t n, int64_t I, int64_t K) {
  GemvArgs a = {};
  a.out = g;
  a.out2 = u;
  a.ldo = a.ldo2 = ldo;
  a.x = x;
  a.ldx = ldx;
  a.xrows = rows;
  a.w = gate;
  a.w2 = up;
  a.ldw = ld_gate;
  a.ldw2 = ld_up;
  a.M = a.M2 = I;
  a.n = (int)n;
  a.K = K;
  return launch_gemv(st, a, wdt);
}

cudaError_t lks__cu_gemv_down_add(cudaStream_t st, float *out, int64_t ldo, const int32_t *rows,
                                  const float *scale, const float *h, int64_t ldh,
                                  const void *down, int wdt, int64_t ld_down, int64_t n,
                                  int64_t M, int64_t K) {
  GemvArgs a = {};
  a.out = out;
  a.ldo = ldo;
  a.orows = rows;
  a.scale = scale;
  a.x = h;
  a.ldx = ldh;
  a.w = down;
  a.ldw = ld_down;
  a.M = M;
  a.n = (int)n;
  a.K = K;
  a.mode = 2;
  return launch_gemv(st, a, wdt);
}

cudaError_t lks__cu_gemv_grouped(cudaStream_t st, float *out, float *out2, int64_t ldo,
                                 const float *x, int64_t ldx, const int32_t *xrows,
                                 const int32_t *orows, const int4 *groups, int64_t n_groups,
                                 const void *const *wt, const void *const *wt2, int64_t ldw,
                                 int wdt, int tab_aligned, int64_t n_rows, int64_t M, int64_t K) {
  GemvArgs a = {};
  a.groups = groups;
  a.wt = wt;
  a.wt2 = wt2;
  a.out = out;
  a.out2 = out2;
  a.ldo = a.ldo2 = ldo;
  a.x = x;
  a.ldx = ldx;
  a.xrows = xrows;
  a.orows = orows;
  a.ldw = a.ldw2 = ldw;
  a.M = M;
  a.M2 = wt2 ? M : 0;
  a.n = (int)n_rows;
  a.K = K;
  return launch_gemv(st, a, wdt, n_groups, tab_aligned != 0);
}

cudaError_t lks__cu_convert(cudaStream_t st, void *dst, int ddt, int64_t ldd, const void *src,
                            int sdt, int64_t lds, int64_t rows, int64_t cols) {
  if (rows > 0 && cols > 0)
    convert_k<<<blocks_for(rows * cols, 256), 256, 0, st>>>(dst, ddt, ldd, src, sdt, lds, rows,
                                                             cols);
  return cudaGetLastError();
}

cudaError_t lks__cu_add_bias(cudaStream_t st, float *out, int64_t ldo, const void *bias, int bdt,
                             int64_t n, int64_t M) {
  if (n > 0 && M > 0) add_bias_k<<<blocks_for(n * M, 256), 256, 0, st>>>(out, ldo, bias, bdt, n, M);
  return cudaGetLastError();
}

cudaError_t lks__cu_rope(cudaStream_t st, float *x, int64_t ldx, int64_t n, int heads,
                         int head_dim, int rot, float theta, int interleaved, const int32_t *pos) {
  if (n > 0 && rot >= 2)
    rope_k<<<blocks_for(n * (rot / 2), 128), 128, 0, st>>>(x, ldx, n, heads, head_dim, rot, theta,
                                                           interleaved, pos);
  return cudaGetLastError();
}

cudaError_t lks__cu_kv_store(cudaStream_t st, float *K, float *V, int64_t width, const float *k,
                             int64_t ldk, const float *v, int64_t ldv, const int32_t *slot,
                             int64_t n) {
  if (n > 0) kv_store_k<<<(unsigned)n, 256, 0, st>>>(K, V, width, k, ldk, v, ldv, slot);
  return cudaGetLastError();
}

cudaError_t lks__cu_attention(cudaStream_t st, float *out, int64_t ldo, const float *q,
                              int64_t ldq, const float *K, const float *V, int n_kv_heads,
                              int head_dim, int n_heads, int block_size, const int32_t *seq,
                              const int32_t *pos, const int32_t *block_table, int max_blocks,
                              int n, float scale) {
  if (n <= 0 || n_heads <= 0) return cudaGetLastError();
  size_t smem = (size_t)(2 * head_dim + ATT_CHUNK + 32) * sizeof(float) + ATT_CHUNK * sizeof(int);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(attention_k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return e;
  }
  attention_k<<<(unsigned)(n * n_heads), ATT_THREADS, smem, st>>>(
      out, ldo, q, ldq, K, V, n_kv_heads, head_dim, n_heads, block_size, seq, pos, block_table,
      max_blocks, scale);
  return cudaGetLastError();
}

cudaError_t lks__cu_route(cudaStream_t st, const float *logits, int64_t ld, const float *bias,
                          int n, int E, int top_k, int n_group, int topk_group, int norm,
                          float scaling, float *scratch, int32_t *ids, float *w) {
  if (n > 0)
    route_k<<<(unsigned)((n + 63) / 64), 64, 0, st>>>(logits, ld, bias, n, E, top_k, n_group,
                                                      topk_group, norm, scaling, scratch, ids, w);
  return cudaGetLastError();
}

cudaError_t lks__cu_swiglu(cudaStream_t st, float *g, const float *u, int64_t count) {
  if (count > 0) swiglu_k<<<blocks_for(count, 256), 256, 0, st>>>(g, u, count);
  return cudaGetLastError();
}

cudaError_t lks__cu_scatter_add(cudaStream_t st, float *out, int64_t ldo, const float *d,
                                int64_t ldd, const int32_t *rows, const float *w, int n,
                                int64_t cols) {
  if (n > 0 && cols > 0)
    scatter_add_k<<<blocks_for(cols, 256), 256, 0, st>>>(out, ldo, d, ldd, rows, w, n, cols);
  return cudaGetLastError();
}

cudaError_t lks__cu_gather_rows(cudaStream_t st, float *out, int64_t ldo, const float *x,
                                int64_t ldx, const int32_t *rows, int64_t n, int64_t cols) {
  if (n > 0) gather_rows_k<<<(unsigned)n, 256, 0, st>>>(out, ldo, x, ldx, rows, cols);
  return cudaGetLastError();
}

cudaError_t lks__cu_argmax(cudaStream_t st, const float *x, int64_t ldx, int64_t n, int64_t V,
                           int32_t *idx, float *val) {
  if (n > 0) argmax_k<<<(unsigned)n, 1024, 0, st>>>(x, ldx, V, idx, val);
  return cudaGetLastError();
}

}  // extern "C"
