// SPDX-License-Identifier: MIT
// Dot-product kernels of the CPU backend (see cpu_kernels.h). Decode is bound by memory
// bandwidth, so the BF16 kernels widen weights to f32 in registers (a shift) and use f32 FMAs:
// the arithmetic is exactly that of the F32 path, with half the bytes read. Within a level the
// BF16 and F32 kernels sum in the same order, element for element, because the backend computes
// a BF16 row either directly or widened to f32 depending on the batch; any difference would make
// a row's result depend on the other rows of its batch.
#include "core/cpu_kernels.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/log.h"

// Eight independent accumulators: the compiler can vectorise this on any target, and the
// summation order is fixed (lane j sums elements j, j+8, ...), so results do not depend on flags.
static float dot_bf16_scalar(const uint16_t *w, const float *x, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += lks_bf16_to_f32(w[i + j]) * x[i + j];
  for (; i < n; i++) acc[0] += lks_bf16_to_f32(w[i]) * x[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static float dot_f32_scalar(const float *w, const float *x, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += w[i + j] * x[i + j];
  for (; i < n; i++) acc[0] += w[i] * x[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static const lks__cpu_kernels k_scalar = {"scalar", dot_bf16_scalar, dot_f32_scalar};

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static float dot_bf16_avx2(const uint16_t *w, const float *x,
                                                                int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
    __m256i w1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i + 8)));
    a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), _mm256_loadu_ps(x + i),
                         a0);
    a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)),
                         _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum256(_mm256_add_ps(a0, a1));
  for (; i < n; i++) s += lks_bf16_to_f32(w[i]) * x[i];
  return s;
}

__attribute__((target("avx2,fma"))) static float dot_f32_avx2(const float *w, const float *x,
                                                               int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum256(_mm256_add_ps(a0, a1));
  for (; i < n; i++) s += w[i] * x[i];
  return s;
}

__attribute__((target("avx512f"))) static float dot_bf16_avx512(const uint16_t *w,
                                                                 const float *x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i w0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + i)));
    __m512i w1 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + i + 16)));
    a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), _mm512_loadu_ps(x + i),
                         a0);
    a1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)),
                         _mm512_loadu_ps(x + i + 16), a1);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  for (; i < n; i++) s += lks_bf16_to_f32(w[i]) * x[i];
  return s;
}

__attribute__((target("avx512f"))) static float dot_f32_avx512(const float *w, const float *x,
                                                                int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  for (; i < n; i++) s += w[i] * x[i];
  return s;
}

static const lks__cpu_kernels k_avx2 = {"avx2", dot_bf16_avx2, dot_f32_avx2};
static const lks__cpu_kernels k_avx512 = {"avx512", dot_bf16_avx512, dot_f32_avx512};
#endif

const lks__cpu_kernels *lks__cpu_kernels_get(const char *name) {
  if (strcmp(name, "scalar") == 0) return &k_scalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma"))
    return &k_avx2;
  if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f")) return &k_avx512;
#endif
  return NULL;
}

const lks__cpu_kernels *lks__cpu_kernels_best(void) {
  const char *forced = getenv("LKS_SIMD");
  if (forced && *forced) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(forced);
    if (k) return k;
    LKS_LOG(LKS_LOG_WARN, "LKS_SIMD=%s is not available on this CPU or build; choosing the best",
            forced);
  }
  static const char *order[] = {"avx512", "avx2", "scalar"};
  for (int i = 0; i < 3; i++) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(order[i]);
    if (k) return k;
  }
  return &k_scalar;
}
