// SPDX-License-Identifier: MIT
// The CPU backend's inner kernels: dot products of weight rows (F32 or BF16) with f32 activation
// rows, one at a time (dot_*) or a block of weight rows against a block of activation rows
// (mm_*: register-blocked, for batches and prefill). Each exists as a portable scalar version
// and, on x86-64, AVX2 and AVX-512 versions compiled with target attributes, on arm64 a NEON
// version, chosen at run time from the CPU's features (LKS_SIMD=scalar|avx2|avx512|amx|neon
// forces one, for tests and comparisons; LKS_SIMD=neon_bf16, NEON with BFMMLA for BF16 weights,
// is only ever taken when asked for, as is LKS_SIMD=amx: AVX-512 with the BF16 products on AMX
// tiles, f32 activations kept exact (cpu_amx.c; README "AMX" has its measurements). Internal
// to core/.
//
// Batch invariance: within a level every kernel computes each dot product in one fixed order that
// depends only on K (for the vector levels: one accumulator vector, chunks of the vector width in
// order, the last chunk zero-padded, then a fixed horizontal sum; NEON's vector is 8 lanes held in
// two registers, AVX2's 16 lanes in two). So mm_* gives, element for element, the bits of dot_*,
// whatever the block shapes, and BF16 equals F32 on the widened weights; a row's result never
// depends on the other rows of its batch. The amx level's mm_bf16 sums in its own order
// (cpu_amx.c), also fixed by K alone (so its BF16 differs from its F32 by rounding): its dot_bf16
// is mm_bf16 of one row and one column.
#ifndef LKS_CPU_KERNELS_H
#define LKS_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef float (*lks__dot_bf16_fn)(const uint16_t *w, const float *x, int64_t n);
typedef float (*lks__dot_f32_fn)(const float *w, const float *x, int64_t n);
// out[t * ldo + r] = dot(w row r, x row t) for r < m, t < n; rows of w are ldw elements apart,
// rows of x ldx floats apart. Reads exactly m rows of K weights and n rows of K floats.
// w is uint16_t (mm_bf16) or float (mm_f32). scratch: mm_scratch(K) bytes the kernel may use
// (only where the level has mm_scratch; NULL is fine elsewhere).
typedef void (*lks__mm_fn)(const void *w, int64_t ldw, int64_t m, const float *x, int64_t ldx,
                           int64_t n, int64_t K, float *out, int64_t ldo, void *scratch);
// Decode's product, where the level reads weight rows one at a time (one activation row): as mm
// with n = 1 (the same arithmetic, bit for bit), each row's fetch ahead going on past the m rows
// into `after`, after_rows rows of the same stride that the caller reads next (NULL: none known).
typedef void (*lks__mv_fn)(const void *w, int64_t ldw, int64_t m, const float *x, int64_t K,
                           float *out, const void *after, int64_t after_rows);

// Attention's weighted sum of values: o[g * hd + d] += sum over p < np of w[g * ldw + p] *
// v[p * ldv + d], for g < G and d < hd. Each element adds its np products one after another,
// in order of p (one multiply-add each, fused where the level has FMA), so the result depends
// only on the row's own weights and values; each value row is read once for all G query heads
// of its group.
typedef void (*lks__pv_fn)(const float *w, int64_t ldw, int G, const float *v, int64_t ldv,
                           int np, int hd, float *o);
// The same with BF16 values (a BF16 KV cache), widened to f32 exactly as they are loaded.
typedef void (*lks__pv_bf16_fn)(const float *w, int64_t ldw, int G, const uint16_t *v,
                                int64_t ldv, int np, int hd, float *o);

typedef struct lks__cpu_kernels {
  const char *name;  // "scalar", "avx2", "avx512", "amx", "neon", "neon_bf16"
  lks__dot_bf16_fn dot_bf16;
  lks__dot_f32_fn dot_f32;
  lks__mm_fn mm_bf16;
  lks__mm_fn mm_f32;
  lks__mv_fn mv_bf16, mv_f32;  // NULL where the level reads blocks of rows (mm with n = 1)
  // Bytes of scratch mm_bf16 needs for rows of K; NULL: none.
  size_t (*mm_scratch)(int64_t K);
  // Attention's scores against a BF16 KV cache, when not mm_bf16 (NULL): one cache block (a few
  // rows) a call, where the amx level would lay out the same query rows for the tiles again for
  // every block; no scratch.
  lks__mm_fn mm_bf16_kv;
  lks__pv_fn pv;
  lks__pv_bf16_fn pv_bf16;
  // 1 when dot_bf16 / mm_bf16 round the activations to BF16 (neon_bf16, never chosen by itself:
  // its error is far above the others', cpu_kernels.c says why).
  int bf16_activations;
} lks__cpu_kernels;

// The kernels of one SIMD level, or NULL when this CPU or build lacks it.
const lks__cpu_kernels *lks__cpu_kernels_get(const char *name);
// The best level this CPU supports, unless LKS_SIMD names another (logged once).
const lks__cpu_kernels *lks__cpu_kernels_best(void);

// cpu_amx.c (x86-64): whether this CPU and OS run AMX-BF16 tiles (asks the OS for the tile state
// once); the product (an lks__mm_fn) with its scratch of lks__amx_scratch_bytes(K) bytes.
bool lks__amx_available(void);
size_t lks__amx_scratch_bytes(int64_t K);
void lks__mm_bf16_amx(const void *w, int64_t ldw, int64_t m, const float *x, int64_t ldx,
                      int64_t n, int64_t K, float *out, int64_t ldo, void *scratch);

#endif
