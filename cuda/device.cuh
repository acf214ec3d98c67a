// SPDX-License-Identifier: MIT
// Device helpers shared by the CUDA backend's kernel files (kernels.cu, mla.cu): loading weight
// elements of any dtype as f32, and warp- and block-wide reductions. The block reductions combine
// the threads' partial values in a fixed tree (lanes by shuffles, then warps by index), so their
// result depends only on the inputs and the block size, never on scheduling.
#ifndef LKS_CUDA_DEVICE_CUH
#define LKS_CUDA_DEVICE_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/dtype.h"

namespace {

__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ float f16f(uint16_t h) {
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}

// Element i of a row of dtype dt, as f32.
__device__ __forceinline__ float load(const void *p, int dt, int64_t i) {
  if (dt == LKS_F32) return ((const float *)p)[i];
  if (dt == LKS_BF16) return bf16f(((const uint16_t *)p)[i]);
  return f16f(((const uint16_t *)p)[i]);
}

__device__ __forceinline__ size_t esize(int dt) { return dt == LKS_F32 ? 4 : 2; }

__device__ __forceinline__ const void *row_of(const void *p, int dt, int64_t r, int64_t ld) {
  return (const char *)p + (size_t)(r * ld) * esize(dt);
}

// Round to nearest even, like lks_f32_to_bf16.
__device__ __forceinline__ uint16_t to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions; every thread gets the result. red: 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float *red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.0f;
  return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v, float *red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : -INFINITY;
  return warp_max(t);
}

}  // namespace

#endif
