// SPDX-License-Identifier: MIT
// Elementwise passes of the CPU backend (see cpu_math.h).
#include "core/cpu_math.h"

#include <math.h>

#include "core/fastmath.h"

float lks__exp_f32(float x) { return lks_exp_f32(x); }

LKS_VECTORIZE_NO_CONTRACT LKS_WIDE_CLONES static void
softmax_pass(float *s, int64_t n, float scale) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    s[i] *= scale;
    mx = s[i] > mx ? s[i] : mx;
  }
  float part[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) {
      s[i + j] = lks_exp_f32(s[i + j] - mx);
      part[j] += s[i + j];
    }
  for (int j = 0; i < n; i++, j++) {
    s[i] = lks_exp_f32(s[i] - mx);
    part[j] += s[i];
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; j++) part[j] += part[j + w];
  float sum = part[0];
  for (int64_t k = 0; k < n; k++) s[k] /= sum;
}

LKS_VECTORIZE_NO_CONTRACT LKS_WIDE_CLONES static void
silu_pass(const float *gate, const float *up, float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i] + 0.0f, u = up[i] + 0.0f;
    out[i] = g / (1.0f + lks_exp_f32(-g)) * u;
  }
}

// The clones are static and called from here (fastmath.h).
void lks__softmax_scaled(float *s, int64_t n, float scale) { softmax_pass(s, n, scale); }

void lks__silu_mul(const float *gate, const float *up, float *out, int64_t n) {
  silu_pass(gate, up, out, n);
}
