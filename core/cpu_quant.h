// SPDX-License-Identifier: MIT
// The CPU backend's kernels for quantized weights (lks_qscheme in backend.h): products of FP8
// (E4M3, per-row or 128x128-block scales) and NVFP4 (E2M1 codes, an E4M3 scale per 16 columns, a
// per-tensor multiplier) weight rows with f32 activation rows. The codes are read as they are
// stored and dequantized in registers inside the dot; activations stay f32. As for cpu_kernels.h,
// each exists as a portable version and, on x86-64, AVX2 and AVX-512 versions, on arm64 a NEON
// version, chosen at run time (LKS_SIMD forces one). Internal to core/.
//
// Batch invariance: a kernel takes up to LKS__QROWS activation rows and dequantizes each weight
// chunk once for all of them, but every row's arithmetic (which products, which accumulator, the
// order of the reductions) is the same whatever the number of rows, so a row's result never
// depends on the batch it was computed in.
#ifndef LKS_CPU_QUANT_H
#define LKS_CPU_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"

// Eight: the AVX-512 FP8 kernel's 8 block sums and 8 running totals fill 16 of the 32
// registers, and each weight chunk converted once serves eight rows (four -> six: air-1g prefill
// 512, 2 threads, three alternated rounds: FP8 blocks 272-328 -> 318-343 tokens/s, NVFP4
// 296-300 -> 312-363; six -> eight with FP8's one block sum a row, whose two dependent FMAs a
// step left the FMA units waiting with six).
enum { LKS__QROWS = 8 };

// out[t] = sum_k deq(w[k]) * x[t][k], t < nx <= LKS__QROWS, K columns.
// fp8: deq = e4m3(w[k]) * bscale[k / blk] (blk: 128 for blocks, K for one scale per row).
// nvfp4: deq = e2m1(code k) * e4m3(gscale[k / 16]); the per-tensor multiplier is the caller's.
typedef void (*lks__qdot_fp8_fn)(const uint8_t *w, const float *bscale, int64_t blk,
                                 const float *const *x, int nx, int64_t K, float *out);
typedef void (*lks__qdot_nvfp4_fn)(const uint8_t *w, const uint8_t *gscale, const float *const *x,
                                   int nx, int64_t K, float *out);

// Activation rows prepared once for many weight rows: split(x, K, xs) writes x's columns in the
// order the kernel reads them, and the grids below take such rows in place of x, out[t] bit
// for bit what the kernel on x gives. Every product of the level, decode included:
// FP8: fp8_split, lks__fp8_split_len(K) floats; NVFP4: nvfp4_split, lks__nvfp4_split_len(K).
typedef void (*lks__qsplit_fn)(const float *x, int64_t K, float *xs);

// nw weight rows by nx split activation rows at once (nw * nx <= LKS__QGRID):
// out[i * nx + t] = sum_k deq(w[i][k]) * x[t][k], every pair's arithmetic that of nw = nx = 1.
// Decode's products have one activation row: several weight rows at once keep more independent
// sums and more loads in flight.
// ahead (NULL: none): codes that later calls read, LKS__QAHEAD pointers: as row i is read, a
// line per 64 bytes of its codes, ahead[i] is fetched into L1 and ahead[LKS__QGRID + i], read
// later still, into L2 only.
enum { LKS__QGRID = 8, LKS__QAHEAD = 2 * LKS__QGRID };
// exp0 (NULL: none known): row i's lks_e4m3_exp0_chunks flags (FP8's codes, NVFP4's scales) at
// exp0[i], which the kernels that convert exponent 0 apart (AVX-512) read instead of testing
// the bytes.
typedef void (*lks__qdot_fp8_grid_fn)(const uint8_t *const *w, const uint8_t *const *ahead,
                                      const float *const *bscale, const uint8_t *const *exp0,
                                      int64_t blk, const float *const *xs, int nw, int nx,
                                      int64_t K, float *out);
typedef void (*lks__qdot_nvfp4_grid_fn)(const uint8_t *const *w, const uint8_t *const *ahead,
                                        const uint8_t *const *gscale,
                                        const uint8_t *const *exp0, const float *const *xs,
                                        int nw, int nx, int64_t K, float *out);

// A quantized weight as raw host pointers (the CPU backend's view of an lks_tensor).
typedef struct lks__qweight {
  lks_qscheme qs;
  const uint8_t *codes;  // row r at codes + r * ld (bytes)
  int64_t ld;
  const void *scales;    // see lks_qscheme; scale row stride sld entries
  int64_t sld;
  const uint8_t *exp0;   // lks_e4m3_exp0_chunks's flags of the rows (NULL: none)
  float global;
  int64_t rows, cols;
  // Codes the same thread reads right after rows [r0, r1) of a product, next_rows rows at stride
  // ld (NULL: none known): decode fetches them ahead as it reads the last rows, so that the next
  // product's first loads do not wait on memory.
  const uint8_t *next;
  int64_t next_rows;
} lks__qweight;

// Decode's product over a task's rows [r0, r1) of w against one activation row, split (xs):
// out[r - r0] = the grid's sum for row r (NVFP4: times w->global), the rows read LKS__QGRID at
// a time, each fetching the rows pf and 2 pf ahead into L1 and L2 (past r1: w->next).
typedef void (*lks__qmv_fn)(const lks__qweight *w, int64_t r0, int64_t r1, int64_t pf,
                            const float *xs, float *out);

typedef struct lks__quant_kernels {
  const char *name;  // "scalar", "avx2", "avx512", "neon"
  lks__qdot_fp8_fn fp8;
  lks__qdot_nvfp4_fn nvfp4;
  int group_rows;  // with grids, products of several rows take this many activation rows at a
                   // time where rows have 512 columns or more (0: LKS__QROWS); see cpu_quant.c
  lks__qsplit_fn fp8_split;      // may be NULL (then fp8_grid is NULL too)
  lks__qdot_fp8_grid_fn fp8_grid;
  lks__qsplit_fn nvfp4_split;    // may be NULL (then nvfp4_grid is NULL too)
  lks__qdot_nvfp4_grid_fn nvfp4_grid;
  lks__qmv_fn fp8_mv, nvfp4_mv;  // set exactly where the grid of the format is
} lks__quant_kernels;

// Floats of one split row of K columns. FP8: 32 per 32 columns of the first K / 16 * 16 (a last
// 16 padded), then the K % 16 others as they are. NVFP4 (K a multiple of 16): 128 per 128,
// the last padded.
static inline int64_t lks__fp8_split_head(int64_t K) { return (K / 16 + 1) / 2 * 32; }
static inline int64_t lks__fp8_split_len(int64_t K) { return lks__fp8_split_head(K) + K % 16; }
static inline int64_t lks__nvfp4_split_len(int64_t K) { return (K + 127) / 128 * 128; }

const lks__quant_kernels *lks__quant_kernels_get(const char *name);
const lks__quant_kernels *lks__quant_kernels_best(void);

// Output rows [r0, r1) of out = x W^T for n activation rows (x row stride ldx, out row stride
// ldo). Called from the thread pool, one range per task. Decode (n = 1) on a level with grids
// runs the level's lks__qmv_fn on x split once.
void lks__quant_matmul_rows(const lks__quant_kernels *k, const lks__qweight *w, int64_t r0,
                            int64_t r1, const float *x, int64_t ldx, int64_t n, float *out,
                            int64_t ldo);

// Decode's product in two parts, so that a job of many tasks splits its activation row once:
// lks__quant_split_len(k, qs, K) floats (0: the level has no grid for the format, and decode goes
// through lks__quant_matmul_rows), lks__quant_split writes x split into them, and lks__quant_mv
// writes out[r] for r in [r0, r1), bit for bit what lks__quant_matmul_rows gives for one row.
// xs is best 64-byte aligned: the kernels' loads of it that crossed a cache line made decode's
// products 35-50 % slower (cpu_quant.c, split_alloc).
int64_t lks__quant_split_len(const lks__quant_kernels *k, lks_qscheme qs, int64_t K);
void lks__quant_split(const lks__quant_kernels *k, lks_qscheme qs, const float *x, int64_t K,
                      float *xs);
void lks__quant_mv(const lks__quant_kernels *k, const lks__qweight *w, int64_t r0, int64_t r1,
                   const float *xs, float *out);

// Row r of w dequantized to f32: dst[c] = the value the dot kernels multiply by x[c], each one
// rounding of e4m3(code) * scale (FP8) or e2m1(code) * e4m3(scale) * global (NVFP4) away from
// it. For ops that read a weight as a matrix rather than through a product (MLA's absorbed kv_b).
void lks__quant_row_f32(const lks__qweight *w, int64_t r, float *dst);

#endif
