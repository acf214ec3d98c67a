// SPDX-License-Identifier: MIT
// Elementwise passes of the CPU backend (see cpu_math.h).
#include "core/cpu_math.h"

#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define VECTORIZE
#else
#define VECTORIZE __attribute__((optimize("tree-vectorize", "fp-contract=off")))
#endif
#if defined(__x86_64__)
#define WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDE_CLONES
#endif

// exp(x): x = n ln2 + r with n = round(x / ln2) (ln2 in two parts, so r is exact to an ulp)
// and |r| <= ln2 / 2; e^r by its Taylor polynomial to degree 7 (truncation below 5.2e-9 there);
// then 2^n as two powers of two, 2^(n >> 1) (exact on p) and 2^(n - (n >> 1)), so that each is a
// normal float and only the last product rounds: to a subnormal, 0 or +inf where e^x is one.
// x is clamped to [-104, 89] first (e^x rounds to 0 below, to +inf above). Branch-free, so the
// loops below vectorise.
static inline float exp_f(float x) {
  const float log2e = 1.44269504f, ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f;
  float xc = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x;
  float n = (xc * log2e + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = (xc - n * ln2_hi) - n * ln2_lo;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t n1 = (int32_t)n >> 1, b1 = (n1 + 127) << 23, b2 = ((int32_t)n - n1 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, 4);
  memcpy(&s2, &b2, 4);
  return (p * s1) * s2;
}

float lks__exp_f32(float x) { return exp_f(x); }

VECTORIZE WIDE_CLONES void lks__softmax_scaled(float *s, int64_t n, float scale) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    s[i] *= scale;
    mx = s[i] > mx ? s[i] : mx;
  }
  float part[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) {
      s[i + j] = exp_f(s[i + j] - mx);
      part[j] += s[i + j];
    }
  for (int j = 0; i < n; i++, j++) {
    s[i] = exp_f(s[i] - mx);
    part[j] += s[i];
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; j++) part[j] += part[j + w];
  float inv = part[0];
  for (int64_t k = 0; k < n; k++) s[k] /= inv;
}

VECTORIZE WIDE_CLONES void lks__silu_mul(const float *gate, const float *up, float *out,
                                         int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i] + 0.0f, u = up[i] + 0.0f;
    out[i] = g / (1.0f + exp_f(-g)) * u;
  }
}
