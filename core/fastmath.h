// SPDX-License-Identifier: MIT
// exp(x) in float, written to vectorise: for the CPU backend's softmax and SwiGLU passes
// (core/cpu_math.c) and for sampling's weights (model/sample.c). Relative error below 5.4e-7
// where e^x is a normal float (measured 1.0e-7; check_backend_cpu). Include it in code compiled
// without contracting a multiply and an add into an FMA (as both users are), so that every
// vector width gives the same bits.
#ifndef LKS_FASTMATH_H
#define LKS_FASTMATH_H

#include <stdint.h>
#include <string.h>

// Passes over rows that call it are written to vectorise, and their results must not depend on
// whether the compiler fuses a multiply and an add: gcc takes both per function (the attributes),
// clang takes the contraction rule for the rest of the including file (and vectorises at -O2
// anyway). x86-64 gets clones for wider vectors, chosen at load time; elsewhere (arm64: NEON is the
// baseline) one version. Clang emits a clone's dispatch only where its own file calls it: keep the
// cloned functions static. gcc's partial redundancy elimination (PRE) is off in them: it saw that
// the clamp below gives a constant, exp(-104) = 0, and made the rest of lks_exp_f32 a branch for
// the other values, which only AVX-512's masks vectorise: until 2026-12-06 the AVX2 and SSE2 clones
// of the passes here, and arm64's one version (gcc 12's -fopt-info-vec), ran the exponentials one
// element at a time. On an AVX2-only host (Zen 3), build/sample_bench at V = 151,552: T = 1 1.71 ->
// 0.43 ms a token, T = 0.6 top-p 0.95 2.33 -> 1.16; air-1g BF16 prefill of 2000 tokens (attention's
// softmax), one thread, two alternated rounds, 76-86 -> 93-95 tokens/s. Without PRE nothing is
// computed differently (it moves computations, never reassociates them): the same bits.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define LKS_VECTORIZE
#define LKS_VECTORIZE_NO_CONTRACT
#else
#define LKS_VECTORIZE __attribute__((optimize("tree-vectorize", "no-tree-pre")))
#define LKS_VECTORIZE_NO_CONTRACT \
  __attribute__((optimize("tree-vectorize", "fp-contract=off", "no-tree-pre")))
#endif
// Not under ThreadSanitizer: the clones' ifunc resolvers run, instrumented, before its runtime
// starts, and the process crashed loading (clang 14, -fsanitize=thread).
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LKS_NO_CLONES 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define LKS_NO_CLONES 1
#endif
#if defined(__x86_64__) && !defined(LKS_NO_CLONES)
#define LKS_WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LKS_WIDE_CLONES
#endif

// exp(x): x = n ln2 + r with n = round(x / ln2) (ln2 in two parts, so r is exact to an ulp)
// and |r| <= ln2 / 2; e^r by its Taylor polynomial to degree 7 (truncation below 5.2e-9 there);
// then 2^n as two powers of two, 2^(n >> 1) (exact on p) and 2^(n - (n >> 1)), so that each is a
// normal float and only the last product rounds: to a subnormal, 0 or +inf where e^x is one.
// x is clamped to [-104, 89] first (e^x rounds to 0 below, to +inf above). Branch-free, so that
// loops over it vectorise.
static inline float lks_exp_f32(float x) {
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

#endif
