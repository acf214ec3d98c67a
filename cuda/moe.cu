// SPDX-License-Identifier: MIT
// The device side of the cuda backend's `moe` op (backend.h; the host side is cu_moe in
// backend_cuda.c): routing and the dispatch plan in one single-block kernel, and the weighted
// combination of the experts' outputs. The products in between are the matrix kernel of
// kernels.cu in its grouped mode (lks__cu_gemv_grouped).
//
// Batch invariance: a row's routing is computed by one warp from that row alone; a pair (row,
// rank j in the row's top-k) gets its own slot in the products' outputs, whose arithmetic per
// element does not depend on the pairs sharing a launch (kernels.cu); and the combination adds
// the pairs of a row in rank order. So a row's result is the same bits in any batch. The plan
// (pairs sorted by expert) only decides which warps compute which pair, never how.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuda_impl.h"

namespace {

enum { RP_THREADS = 1024, RP_MAX_LOCAL = 1024 };

// The better of two (value, index) candidates: the larger value, ties to the lower index; an
// index < 0 is no candidate. Exact comparisons, so any reduction order gives the serial scan's
// answer (the CPU's: the first index holding the maximum).
__device__ __forceinline__ void pick(float &bv, int &bi, float v, int i) {
  if (i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi))) {
    bv = v;
    bi = i;
  }
}

__device__ __forceinline__ void warp_pick(float &bv, int &bi) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    pick(bv, bi, ov, oi);
  }
}

// Routing of every row (a warp per row, rows strided over the warps), then the plan of the
// experts [e0, e0 + nl): pairs i = r * top_k + j whose expert is local, sorted by expert and, within
// one, by i; cut into groups of at most LKS__CU_GEMV_ROWS pairs of one expert:
//   groups[g] = {local expert, first slot, count, 0}, count 0 for g >= the groups used;
//   prow[slot] = the pair's row, pidx[slot] = the pair.
// scratch: [n_warps, 2 E] floats (scores, selection scores) plus gscore/keep per warp.
__global__ void route_plan_k(const float *logits, int64_t ld, const float *bias, int n, int E,
                             int top_k, int n_group, int topk_group, int norm, float scaling,
                             float *scratch, int32_t *ids, float *wts, int e0, int nl,
                             int4 *groups, int n_groups, int32_t *prow, int32_t *pidx) {
  __shared__ int cnt[RP_MAX_LOCAL], first_slot[RP_MAX_LOCAL], first_group[RP_MAX_LOCAL];
  __shared__ int used_groups;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float *s = scratch + (size_t)warp * (2 * E + 2 * 256), *sel = s + E, *gs = sel + E;
  int *keep = (int *)(gs + 256);
  int per_group = E / n_group;
  for (int r = warp; r < n; r += nw) {
    const float *l = logits + (int64_t)r * ld;
    for (int e = lane; e < E; e += 32) {
      float v = 1.0f / (1.0f + expf(-l[e]));
      s[e] = v;
      sel[e] = v + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    if (n_group > 1) {
      // Group score: the sum of the group's two best selection scores (in the CPU's scan).
      for (int g = lane; g < n_group; g += 32) {
        float a = -INFINITY, b = -INFINITY;
        for (int e = g * per_group; e < (g + 1) * per_group; e++) {
          if (sel[e] > a) {
            b = a;
            a = sel[e];
          } else if (sel[e] > b) {
            b = sel[e];
          }
        }
        gs[g] = per_group > 1 ? a + b : a;
        keep[g] = 0;
      }
      __syncwarp();
      for (int k = 0; k < topk_group; k++) {
        float bv = 0.0f;
        int bi = -1;
        for (int g = lane; g < n_group; g += 32)
          if (!keep[g]) pick(bv, bi, gs[g], g);
        warp_pick(bv, bi);
        __syncwarp();
        if (lane == 0) keep[bi] = 1;
        __syncwarp();
      }
      for (int e = lane; e < E; e += 32)
        if (!keep[e / per_group]) sel[e] = -INFINITY;
      __syncwarp();
    }
    int32_t *id = ids + (int64_t)r * top_k;
    float *w = wts + (int64_t)r * top_k;
    for (int k = 0; k < top_k; k++) {
      float bv = 0.0f;
      int bi = -1;
      for (int e = lane; e < E; e += 32) {
        bool taken = false;
        for (int q = 0; q < k; q++) taken |= id[q] == e;
        if (!taken) pick(bv, bi, sel[e], e);
      }
      warp_pick(bv, bi);
      if (lane == 0) id[k] = bi;
      __syncwarp();
    }
    if (lane == 0) {
      // Weights from the plain scores; the sum in rank order, as on the CPU.
      float sum = 0.0f;
      for (int k = 0; k < top_k; k++) {
        w[k] = s[id[k]];
        sum += w[k];
      }
      for (int k = 0; k < top_k; k++) {
        if (norm) w[k] /= sum + 1e-20f;
        w[k] *= scaling;
      }
    }
    __syncwarp();
  }
  __syncthreads();  // ids of every row visible to the whole block
  // The plan: thread e counts and then places its expert's pairs in increasing pair order.
  int pairs = n * top_k;
  for (int e = threadIdx.x; e < nl; e += blockDim.x) {
    int c = 0;
    for (int i = 0; i < pairs; i++) c += ids[i] == e0 + e;
    cnt[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int slot = 0, g = 0;
    for (int e = 0; e < nl; e++) {
      first_slot[e] = slot;
      first_group[e] = g;
      slot += cnt[e];
      g += (cnt[e] + LKS__CU_GEMV_ROWS - 1) / LKS__CU_GEMV_ROWS;
    }
    used_groups = g;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nl; e += blockDim.x) {
    int slot = first_slot[e], g = first_group[e];
    for (int j = 0; j < cnt[e]; j += LKS__CU_GEMV_ROWS)
      groups[g++] = make_int4(e, slot + j, min(LKS__CU_GEMV_ROWS, cnt[e] - j), 0);
    for (int i = 0; i < pairs; i++)
      if (ids[i] == e0 + e) {
        prow[slot] = i / top_k;
        pidx[slot] = i;
        slot++;
      }
  }
  for (int g = used_groups + threadIdx.x; g < n_groups; g += blockDim.x)
    groups[g] = make_int4(0, 0, 0, 0);
}

// out[r, c] = fma(w[r, j], d[r * top_k + j, c], out[r, c]) for j = 0 .. top_k - 1 in order, over
// the pairs whose expert is local: one thread per element.
__global__ void moe_combine_k(float *out, int64_t ldo, const float *d, int64_t ldd,
                              const int32_t *ids, const float *w, int n, int top_k, int e0, int nl,
                              int64_t cols) {
  int64_t total = (int64_t)n * cols;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / cols, c = e % cols;
    float o = out[r * ldo + c];
    for (int j = 0; j < top_k; j++) {
      int64_t p = r * top_k + j;
      int id = ids[p];
      if (id >= e0 && id < e0 + nl) o = __fmaf_rn(w[p], d[p * ldd + c], o);
    }
    out[r * ldo + c] = o;
  }
}

}  // namespace

extern "C" {

size_t lks__cu_route_plan_scratch(int E) {
  return (size_t)(RP_THREADS / 32) * (2 * (size_t)E + 2 * 256) * sizeof(float);
}

cudaError_t lks__cu_route_plan(cudaStream_t st, const float *logits, int64_t ld, const float *bias,
                               int n, int E, int top_k, int n_group, int topk_group, int norm,
                               float scaling, float *scratch, int32_t *ids, float *w, int e0,
                               int nl, int4 *groups, int n_groups, int32_t *prow, int32_t *pidx) {
  if (nl > RP_MAX_LOCAL || n_group > 256) return cudaErrorInvalidValue;
  if (n > 0)
    route_plan_k<<<1, RP_THREADS, 0, st>>>(logits, ld, bias, n, E, top_k, n_group, topk_group,
                                           norm, scaling, scratch, ids, w, e0, nl, groups,
                                           n_groups, prow, pidx);
  return cudaGetLastError();
}

cudaError_t lks__cu_moe_combine(cudaStream_t st, float *out, int64_t ldo, const float *d,
                                int64_t ldd, const int32_t *ids, const float *w, int n, int top_k,
                                int e0, int nl, int64_t cols) {
  if (n > 0 && cols > 0) {
    int64_t total = (int64_t)n * cols, b = (total + 255) / 256;
    if (b > 65535 * 32) b = 65535 * 32;
    moe_combine_k<<<(unsigned)b, 256, 0, st>>>(out, ldo, d, ldd, ids, w, n, top_k, e0, nl, cols);
  }
  return cudaGetLastError();
}

}  // extern "C"
