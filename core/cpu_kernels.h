// SPDX-License-Identifier: MIT
// The CPU backend's inner kernels: dot products of a weight row (F32 or BF16) with an f32
// activation row. Each exists as a portable scalar version and, on x86-64, AVX2 and AVX-512
// versions compiled with target attributes and chosen at run time from the CPU's features
// (LKS_SIMD=scalar|avx2|avx512 forces one, for tests and comparisons). Internal to core/.
#ifndef LKS_CPU_KERNELS_H
#define LKS_CPU_KERNELS_H

#include <stdint.h>

typedef float (*lks__dot_bf16_fn)(const uint16_t *w, const float *x, int64_t n);
typedef float (*lks__dot_f32_fn)(const float *w, const float *x, int64_t n);

typedef struct lks__cpu_kernels {
  const char *name;  // "scalar", "avx2", "avx512"
  lks__dot_bf16_fn dot_bf16;
  lks__dot_f32_fn dot_f32;
} lks__cpu_kernels;

// The kernels of one SIMD level, or NULL when this CPU or build lacks it.
const lks__cpu_kernels *lks__cpu_kernels_get(const char *name);
// The best level this CPU supports, unless LKS_SIMD names another (logged once).
const lks__cpu_kernels *lks__cpu_kernels_best(void);

#endif
