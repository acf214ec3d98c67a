// SPDX-License-Identifier: MIT
// Weight-only quantized products of the cuda backend (lks_qscheme in core/backend.h): FP8 E4M3
// codes with per-row or 128x128-block f32 scales, NVFP4 E2M1 codes (two a byte, low nibble
// first) with an E4M3 scale per 16 columns and a per-tensor multiplier. One warp per output row
// reads the row's codes once per activation row, dequantizing in registers; activations and
// sums are f32. Used for every row count (decode, and batched rows looped inside the warp):
// a row's result depends only on its own activation row. Tested against the CPU backend by
// tests/gpu/test_cuda_ops.c on a GPU machine.
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/backend.h"
#include "cuda/cuda_impl.h"

namespace {

// E4M3 bits placed in an f32 read 2^-120 times the value (normal and subnormal codes alike).
__device__ __forceinline__ float e4m3f(unsigned b) {
  unsigned bits = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
  return __uint_as_float(bits) * 0x1p120f;
}

__device__ __forceinline__ float e2m1f(unsigned c) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = mag[c & 7];
  return (c & 8) ? -v : v;
}

__device__ __forceinline__ float bias_at(const void *b, int bdt, int64_t i) {
  if (!b) return 0.0f;
  if (bdt == LKS_BF16) return __uint_as_float((unsigned)((const uint16_t *)b)[i] << 16);
  return ((const float *)b)[i];
}

__global__ void qgemv_k(float *out, int64_t ldo, const float *x, int64_t ldx, int n,
                        const uint8_t *codes, int64_t ld, int qs, const void *scales, int64_t sld,
                        float global, const void *bias, int bdt, int64_t M, int64_t K, int acc) {
  int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (r >= M) return;
  const uint8_t *w = codes + r * ld;
  for (int t = 0; t < n; t++) {
    const float *xt = x + (int64_t)t * ldx;
    float s = 0.0f;
    if (qs == LKS_Q_NVFP4) {
      const uint8_t *gs = (const uint8_t *)scales + r * sld;
      // Each lane takes two neighbouring columns (one byte) at a time.
      for (int64_t k = 2 * lane; k < K; k += 64) {
        unsigned b = w[k >> 1];
        float g = e4m3f(gs[k >> 4]);
        s += e2m1f(b & 15u) * g * xt[k] + e2m1f(b >> 4) * g * xt[k + 1];
      }
    } else {
      const float *sc = (const float *)scales +
                        (qs == LKS_Q_FP8_ROW ? r : (r / LKS_Q_FP8_BLOCK_SIZE) * sld);
      for (int64_t k = lane; k < K; k += 32)
        s += e4m3f(w[k]) * (qs == LKS_Q_FP8_ROW ? sc[0] : sc[k / LKS_Q_FP8_BLOCK_SIZE]) * xt[k];
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
      if (qs == LKS_Q_NVFP4) s *= global;
      float v = s + bias_at(bias, bdt, r);
      float *o = out + (int64_t)t * ldo + r;
      *o = acc ? *o + v : v;
    }
  }
}

}  // namespace

extern "C" cudaError_t lks__cu_qgemv(cudaStream_t st, float *out, int64_t ldo, const float *x,
                                     int64_t ldx, int64_t n, const void *codes, int64_t ld, int qs,
                                     const void *scales, int64_t sld, float global,
                                     const void *bias, int bdt, int64_t M, int64_t K,
                                     int accumulate) {
  if (n <= 0 || M <= 0) return cudaSuccess;
  const int warps = 8;
  unsigned blocks = (unsigned)((M + warps - 1) / warps);
  qgemv_k<<<blocks, warps * 32, 0, st>>>(out, ldo, x, ldx, (int)n, (const uint8_t *)codes, ld, qs,
                                         scales, sld, global, bias, bdt, M, K, accumulate);
  return cudaGetLastError();
}
