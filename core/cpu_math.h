// SPDX-License-Identifier: MIT
// The CPU backend's elementwise passes over rows: the attention softmax and MoE's
// silu(gate) * up, with an exponential written to vectorise (glibc's expf is one call per
// element: 4.6 % of a 512-token prefill of air-1g, 2 threads, before these). Each pass is
// compiled once per vector width the CPU may have (AVX-512, AVX2, the baseline; one version on
// arm64) without contracting a multiply and an add into an FMA, so every version gives the same
// bits, and a row's result depends on its own values and length alone (batch invariance).
// Internal to core/.
#ifndef LKS_CPU_MATH_H
#define LKS_CPU_MATH_H

#include <stdint.h>

// s[0, n) = softmax(scale * s) in place; n >= 1. The sum of the exponentials is taken in 16
// interleaved partial sums, then a fixed tree.
void lks__softmax_scaled(float *s, int64_t n, float scale);

// out[i] = g / (1 + exp(-g)) * u, g = gate[i] + 0 and u = up[i] + 0 (a negative zero made
// positive, as a matrix product without bias gives it), i < n.
void lks__silu_mul(const float *gate, const float *up, float *out, int64_t n);

// exp(x) as the passes above compute it (for tests): relative error below 5.4e-7 where e^x is a
// normal float; subnormal, 0 and +inf as e^x rounds (0 for -inf, +inf for +inf).
float lks__exp_f32(float x);

#endif
