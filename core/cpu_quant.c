// SPDX-License-Identifier: MIT
// Quantized-weight kernels of the CPU backend (see cpu_quant.h).
//
// FP8 (E4M3 "fn"): a code's bits placed in an IEEE half (sign to bit 15, exponent and mantissa
// to bits 13..7) read 2^-8 times the E4M3 value, for normal and subnormal codes alike, and the
// hardware's half-to-float conversion (F16C; FCVTL on arm64) makes it an f32 exactly, without
// the microcode assists that f32 subnormals would cost. The products with x are summed per
// 128-column block (or over the whole row for per-row scales) and each block's partial sum is
// multiplied by its scale times 2^8: sum_b (256 s_b) * (sum_{k in b} 2^-8 e4m3(w_k) x_k). The
// AVX-512 and AVX2 kernels place the bits in a BF16 instead (fp8_pair, below; AVX-512 with the
// exponent raised so that no weight is an f32 subnormal, and the codes of exponent 0 converted
// apart). NaN codes (never written by a quantizer) are not detected here.
// NVFP4: the 16 E2M1 values are a lookup table (a permute on AVX-512; the 8 magnitudes and a
// sign bit on AVX2; TBL of twice the values as bytes on NEON). Each group's values are multiplied
// by its E4M3 scale (exact: 2- and 4-bit mantissas) before the FMA with x; on AVX-512 the scale
// multiplies a lane's sum of 8 products instead (nvfp4_avx512_g, below).
#include "core/cpu_quant.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_kernels.h"
#include "core/dtype.h"
#include "core/log.h"

static float e4m3_lut[256], e4m3_lut_s8[256];  // E4M3 values; times 2^-8
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;
static void lut_init(void) {
  for (int i = 0; i < 256; i++) {
    e4m3_lut[i] = lks_e4m3_to_f32((uint8_t)i);
    e4m3_lut_s8[i] = e4m3_lut[i] * 0x1p-8f;
  }
}

// Row r's scales as the dot kernels take them.
static const void *row_scales(const lks__qweight *w, int64_t r) {
  switch (w->qs) {
    case LKS_Q_FP8_ROW: return (const float *)w->scales + r;
    case LKS_Q_FP8_BLOCK: return (const float *)w->scales + (r / LKS_Q_FP8_BLOCK_SIZE) * w->sld;
    default: return (const uint8_t *)w->scales + r * w->sld;  // NVFP4
  }
}

// The codes of row a of a product whose task ends at row r1: past r1, the rows the caller says
// the thread reads next (w->next), else `own` (a row being read anyway).
static const uint8_t *row_ahead(const lks__qweight *w, int64_t r1, int64_t a, const uint8_t *own) {
  if (a < r1) return w->codes + a * w->ld;
  if (w->next && a - r1 < w->next_rows) return w->next + (a - r1) * w->ld;
  return own;
}

// A kernel call's rows r .. r + nw - 1 of a task ending at r1: their codes, their scales, and
// the rows pf and 2 pf ahead of each (ahead[i], ahead[LKS__QGRID + i]; row_ahead). Where the
// rows 2 pf ahead are still the task's, without row_ahead's tests for each row: decode makes a
// call of 8 rows for every 2.8 K weights of the experts' down rows (K = 352), and the tests cost
// about 1.6 % of air-1g's FP8 and NVFP4 decode step at one thread (steps alternated in one process,
// the median step of each side: x0.977-0.987 FP8, x0.984 NVFP4; at 2 threads x0.99-1.0 FP8,
// x0.984 NVFP4).
static inline __attribute__((always_inline)) void call_rows(const lks__qweight *w, int64_t r,
                                                            int nw, int64_t r1, int64_t pf,
                                                            const uint8_t **codes,
                                                            const void **sc, const uint8_t **fl,
                                                            const uint8_t **ahead) {
  const int64_t ld = w->ld, nc = lks_e4m3_chunks(w->cols);
  for (int i = 0; i < nw; i++) {
    codes[i] = w->codes + (r + i) * ld;
    sc[i] = row_scales(w, r + i);
    fl[i] = w->exp0 ? w->exp0 + (r + i) * nc : NULL;
  }
  if (r + nw + 2 * pf <= r1) {  // all of them in the task: no tests a row
    for (int i = 0; i < nw; i++) {
      ahead[i] = codes[i] + pf * ld;
      ahead[LKS__QGRID + i] = codes[i] + 2 * pf * ld;
    }
    return;
  }
  for (int i = 0; i < nw; i++) {
    ahead[i] = row_ahead(w, r1, r + i + pf, codes[i]);
    ahead[LKS__QGRID + i] = row_ahead(w, r1, r + i + 2 * pf, codes[i]);
  }
}

// The loop of a level's lks__qmv_fn (w, r0, r1, pf and out in scope): the rows LKS__QGRID at a
// time, FULL for a full grid and PART for the last, short one (nw rows), each with the grid's
// codes, ahead, sc (scales), e0 (exponent-0 flags, or NULL) and d (its outputs) in scope.
#define QMV_LOOP(FULL, PART)                                                     \
  for (int64_t r = r0; r < r1; r += LKS__QGRID) {                               \
    const int nw = r1 - r < LKS__QGRID ? (int)(r1 - r) : LKS__QGRID;            \
    const uint8_t *codes[LKS__QGRID], *ahead[LKS__QAHEAD], *fl[LKS__QGRID];     \
    const void *sc[LKS__QGRID];                                                 \
    call_rows(w, r, nw, r1, pf, codes, sc, fl, ahead);                          \
    const uint8_t *const *e0 = w->exp0 ? fl : NULL;                             \
    float *d = out + (r - r0);                                                  \
    if (nw == LKS__QGRID) {                                                     \
      FULL;                                                                     \
    } else {                                                                    \
      PART;                                                                     \
    }                                                                           \
  }

// A buffer the caller frees for n split rows of sl floats, row t at t * *stride floats: each
// row at a multiple of 64 bytes, so that none of the kernels' 64-byte loads of x crosses a cache
// line. Decode's product with x split 16 bytes off a line, one thread, in cache, medians of 41:
// NVFP4 1024 x 1024 24.0 -> 15.0 G weights/s, 2976 x 352 17.7 -> 11.5; FP8 blocks 18.9 -> 11.7
// and 16.9 -> 11.0 (malloc's buffers of this size sit 16 bytes past a page). air-1g prefill of
// 256, 2 threads, four alternated rounds, medians: NVFP4 210.9 -> 224.4 tokens/s, FP8 blocks
// 183.6 -> 242.1.
static float *split_alloc(int64_t n, int64_t sl, int64_t *stride) {
  *stride = (sl + 15) / 16 * 16;
  return aligned_alloc(64, (size_t)(n * *stride) * sizeof(float));
}

// ---- portable ----

// Each row: eight lanes (lane j sums the columns j, j+8, ... of a block), per block, then
// s_b * block sum into the row total; the tail of a block goes to lane 0.
static void fp8_scalar(const uint8_t *w, const float *bs, int64_t blk, const float *const *x,
                       int nx, int64_t K, float *out) {
  for (int t = 0; t < nx; t++) {
    float total = 0;
    const float *xt = x[t];
    for (int64_t k0 = 0, b = 0; k0 < K; k0 += blk, b++) {
      int64_t k1 = k0 + blk < K ? k0 + blk : K, k = k0;
      float acc[8] = {0};
      for (; k + 8 <= k1; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += e4m3_lut[w[k + j]] * xt[k + j];
      for (; k < k1; k++) acc[0] += e4m3_lut[w[k]] * xt[k];
      float p = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
      total += p * bs[b];
    }
    out[t] = total;
  }
}

static void nvfp4_scalar(const uint8_t *w, const uint8_t *gs, const float *const *x, int nx,
                         int64_t K, float *out) {
  for (int t = 0; t < nx; t++) {
    float acc[8] = {0};
    const float *xt = x[t];
    for (int64_t g = 0; g < K / 16; g++) {
      float s = e4m3_lut[gs[g]];
      const uint8_t *p = w + g * 8;
      for (int j = 0; j < 8; j++) {
        acc[(2 * j) & 7] += lks_e2m1_to_f32(p[j] & 15) * s * xt[g * 16 + 2 * j];
        acc[(2 * j + 1) & 7] += lks_e2m1_to_f32(p[j] >> 4) * s * xt[g * 16 + 2 * j + 1];
      }
    }
    out[t] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

static const lks__quant_kernels q_scalar = {.name = "scalar", .fp8 = fp8_scalar,
                                            .nvfp4 = nvfp4_scalar};

// Loops over a kernel's rows (NX activation rows: at most 6, NW weight rows: at most 8) unrolled,
// so that their accumulators stay in registers: without it GCC kept the prefill kernels'
// accumulators (fp8_avx512_n and the like) on the stack, a load and a store around every FMA.
#define LKS_UNROLL _Pragma("GCC unroll 8")

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

// The kernels on x as it is (tests, kernel_bench): x's nx rows split here into a buffer the
// caller frees, xs[t] pointing at row t (NULL without the memory: a few pages, unreachable in
// practice; the portable kernel needs none). The products split each row once for many weight
// rows instead.
static float *split_rows(lks__qsplit_fn split, int64_t sl, const float *const *x, int nx,
                         int64_t K, const float **xs) {
  int64_t ls;
  float *buf = split_alloc(nx, sl, &ls);
  for (int t = 0; buf && t < nx; t++) {
    split(x[t], K, buf + t * ls);
    xs[t] = buf + t * ls;
  }
  return buf;
}

#define FP8_X_SCALE_AVX2 0x1p64f    // AVX2 FP8's x, split (see fp8_avx2_g)
#define FP8_S_SCALE_AVX2 0x1p56f    // its block scales: 2^-120 e4m3 times 2^64 x undone
#define NV_X_SCALE_AVX2 0x1p64f     // AVX2 NVFP4's x, split
#define NV_OUT_SCALE_AVX2 0x1p56f   // its row total: 2^-64 x times 2^-120 s undone
#define FP8_EXP_BIAS 0x3800   // FP8 codes as BF16 words: exponent 112 + e (see fp8_pair)
#define FP8_X_SCALE 0x1p8f     // AVX-512 FP8's x, split (see fp8_avx512_g)
#define FP8_S_SCALE 1.0f       // FP8's block scales: 2^-8 e4m3 times 2^8 x undone
#define NV_X_SCALE 0x1p8f      // AVX-512 NVFP4's x, split
#define NV_OUT_SCALE 1.0f      // a row's NVFP4 total: 2^8 x times 2^-8 s undone
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

static const float e2m1_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// ---- AVX2: 8 columns a vector, the AVX-512 kernels' designs (grids of up to 4 pairs) ----

AVX2 static float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// FP8's split x (lks__qsplit_fn) as the AVX2 and AVX-512 kernels read it: each 32 columns'
// even columns, then its odd ones (a last 16 columns' 8 and 8, each followed by 8 zeros), times
// 2^64 (FP8_X_SCALE_AVX2); then the K % 16 columns past the last 16 as they are.
AVX2 INLINE __m256 fp8_even8(__m256 a, __m256 b, bool odd) {  // a's, then b's, even (odd) lanes
  __m256 t = odd ? _mm256_shuffle_ps(a, b, 0xDD) : _mm256_shuffle_ps(a, b, 0x88);
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8));
}

AVX2 static void fp8_split_avx2(const float *x, int64_t K, float *xs) {
  const int64_t K16 = K / 16 * 16;
  const __m256 s = _mm256_set1_ps(FP8_X_SCALE_AVX2), z = _mm256_setzero_ps();
  for (int64_t c = 0; c < K16; c += 32) {
    bool half = c + 16 == K16;
    __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
    __m256 x2 = half ? z : _mm256_loadu_ps(x + c + 16), x3 = half ? z : _mm256_loadu_ps(x + c + 24);
    _mm256_storeu_ps(xs + c, _mm256_mul_ps(fp8_even8(x0, x1, false), s));
    _mm256_storeu_ps(xs + c + 8, _mm256_mul_ps(fp8_even8(x2, x3, false), s));
    _mm256_storeu_ps(xs + c + 16, _mm256_mul_ps(fp8_even8(x0, x1, true), s));
    _mm256_storeu_ps(xs + c + 24, _mm256_mul_ps(fp8_even8(x2, x3, true), s));
  }
  memcpy(xs + lks__fp8_split_head(K), x + K16, (size_t)(K % 16) * sizeof *x);
}

// FP8 on AVX2: the AVX-512 kernel's arithmetic (fp8_avx512_g, below) at 8 lanes, on x split
// the same way (fp8_split_avx2). 16 codes sign-extended to 16 bits, shifted left by 4 and
// masked are 16 BF16 words worth 2^-120 times their values; a 32-bit lane's lower word shifted
// up and its upper word masked are the f32 weights of 8 even and 8 odd columns: 5 integer
// operations for 16 weights, where converting through half precision took 12 (two
// conversions of 2 uops each). Until 2026-12-06 FP8 decode on AVX2 was no faster than BF16's
// (air-1g, 2 threads, LKS_SIMD=avx2: 75-86 tokens/s against 78-83; now 122-143).
AVX2 INLINE void fp8x16_avx2(const uint8_t *p, __m256 *we, __m256 *wo) {
  __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
  h = _mm256_and_si256(_mm256_slli_epi16(h, 4), _mm256_set1_epi16((short)0x87FF));
  *we = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  *wo = _mm256_castsi256_ps(_mm256_and_si256(h, _mm256_set1_epi32((int)0xFFFF0000)));
}

// One step at column k (32 columns, or 16 for a half step) of RW weight rows by NX split rows:
// each pair's products into its block sum in the order even 0-14, odd 1-15, even 16-30, odd
// 17-31 of the step.
AVX2 INLINE void fp8_avx2_step(const uint8_t *const *w, const float *const *xs, int64_t k,
                               bool half, __m256 *p, const int RW, const int NX) {
  LKS_UNROLL
  for (int i = 0; i < RW; i++) {
    LKS_UNROLL
    for (int h = 0; h < 2; h++) {
      if (h && half) break;
      __m256 we, wo;
      fp8x16_avx2(w[i] + k + 16 * h, &we, &wo);
      LKS_UNROLL
      for (int t = 0; t < NX; t++) {
        __m256 *q = &p[i * NX + t];
        *q = _mm256_fmadd_ps(we, _mm256_loadu_ps(xs[t] + k + 8 * h), *q);
        *q = _mm256_fmadd_ps(wo, _mm256_loadu_ps(xs[t] + k + 16 + 8 * h), *q);
      }
    }
  }
}

// RW weight rows by NX split rows, RW * NX <= 4 (a block sum and a total each: 8 of the 16
// registers): out[i * NX + t], each pair's arithmetic the same whatever RW and NX.
AVX2 INLINE void fp8_avx2_g(const uint8_t *const *w, const uint8_t *const *near,
                            const uint8_t *const *far, const float *const *bs, int64_t blk,
                            const float *const *xs, int64_t K, float *out, const int RW,
                            const int NX) {
  __m256 acc[4], p[4];
  float tail[4] = {0};
  const int64_t K16 = K / 16 * 16, tx = lks__fp8_split_head(K);
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++) acc[j] = _mm256_setzero_ps();
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += blk, b++) {
    int64_t k1 = k0 + blk < K ? k0 + blk : K, k = k0;
    LKS_UNROLL
    for (int j = 0; j < RW * NX; j++) p[j] = _mm256_setzero_ps();
    for (; k + 32 <= k1; k += 32) {
      if (near && !(k & 32)) {
        LKS_UNROLL
        for (int i = 0; i < RW; i++) {
          _mm_prefetch((const char *)near[i] + k, _MM_HINT_T0);
          _mm_prefetch((const char *)far[i] + k, _MM_HINT_T1);
        }
      }
      fp8_avx2_step(w, xs, k, false, p, RW, NX);
    }
    if (k + 16 <= k1) {
      fp8_avx2_step(w, xs, k, true, p, RW, NX);
      k += 16;
    }
    LKS_UNROLL
    for (int i = 0; i < RW; i++) {
      __m256 s = _mm256_set1_ps(bs[i][b] * FP8_S_SCALE_AVX2);
      LKS_UNROLL
      for (int t = 0; t < NX; t++) {
        acc[i * NX + t] = _mm256_fmadd_ps(p[i * NX + t], s, acc[i * NX + t]);
        float ts = 0;
        for (int64_t j = k; j < k1; j++) ts += e4m3_lut[w[i][j]] * xs[t][tx + j - K16];
        tail[i * NX + t] += ts * bs[i][b];
      }
    }
  }
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++) out[j] = hsum8(acc[j]) + tail[j];
}

// A grid of nw * nx <= LKS__QGRID pairs as sub-grids of at most 4 pairs (AVX2's 16 registers):
// nx <= 4 activation rows by 4 / nx weight rows, else 4 by one. G(RW, NX) computes weight rows
// i0 .. and activation rows t0 .. into o[], fetching near[] and far[] ahead.
#define AVX2_SUBGRIDS(G)                                                                 \
  do {                                                                                   \
    const int cx = nx < 4 ? nx : 4, cw = 4 / cx;                                         \
    for (int i0 = 0; i0 < nw; i0 += cw)                                                  \
      for (int t0 = 0; t0 < nx; t0 += cx) {                                              \
        int a = nw - i0 < cw ? nw - i0 : cw, c = nx - t0 < cx ? nx - t0 : cx;            \
        const uint8_t *const *near = ahead ? ahead + i0 : NULL;                          \
        const uint8_t *const *far = ahead ? ahead + LKS__QGRID + i0 : NULL;              \
        float o[4];                                                                      \
        switch (c * 8 + a) {                                                             \
          case 8 + 1: G(1, 1); break;                                                    \
          case 8 + 2: G(2, 1); break;                                                    \
          case 8 + 3: G(3, 1); break;                                                    \
          case 8 + 4: G(4, 1); break;                                                    \
          case 16 + 1: G(1, 2); break;                                                   \
          case 16 + 2: G(2, 2); break;                                                   \
          case 24 + 1: G(1, 3); break;                                                   \
          default: G(1, 4); break;                                                       \
        }                                                                                \
        for (int i = 0; i < a; i++)                                                      \
          for (int t = 0; t < c; t++) out[(i0 + i) * nx + t0 + t] = o[i * c + t];        \
      }                                                                                  \
  } while (0)

#define FP8_G2(RW, NX) fp8_avx2_g(w + i0, near, far, bs + i0, blk, xs + t0, K, o, RW, NX)
AVX2 static void fp8_avx2_grid(const uint8_t *const *w, const uint8_t *const *ahead,
                               const float *const *bs, const uint8_t *const *exp0, int64_t blk,
                               const float *const *xs, int nw, int nx, int64_t K, float *out) {
  (void)exp0;  // exponent-0 codes are converted as the others (no exact path)
  AVX2_SUBGRIDS(FP8_G2);
}
#undef FP8_G2

// x as it is: split here (split_rows).
AVX2 static void fp8_avx2(const uint8_t *w, const float *bs, int64_t blk, const float *const *x,
                          int nx, int64_t K, float *out) {
  const float *xs[LKS__QROWS];
  float *buf = split_rows(fp8_split_avx2, lks__fp8_split_len(K), x, nx, K, xs);
  if (!buf) {
    fp8_scalar(w, bs, blk, x, nx, K, out);
    return;
  }
  const uint8_t *wr[1] = {w};
  const float *br[1] = {bs};
  fp8_avx2_grid(wr, NULL, br, NULL, blk, xs, 1, nx, K, out);
  free(buf);
}

// NVFP4 on AVX2, 64 columns (4 groups, 32 code bytes) a step. The low and the high nibbles
// (even and odd columns), 0..15 in bytes, each index two byte shuffles: the high and the low
// byte of their E2M1 value's BF16; the bytes interleaved into words (unpack low and high), each
// 32-bit lane's two words made two f32 (shift, mask): 19 operations for 64 weights where the
// kernel before took about 80 (a permute of 8 magnitudes, the sign, the scale for each 8). A
// vector from an unpack of the low 8 bytes of each 128-bit half holds group 0 in lanes 0-3 and
// group 2 in lanes 4-7, one of the high 8 bytes groups 1 and 3: each sums its four products
// (qa, qb) before the scales (as on AVX-512, 2^-120 s: E4M3 bits placed in an f32) multiply
// them. x is split once into the order of the 8 vectors (nvfp4_split_avx2), times 2^64; the
// row's total times 2^56. A row's last step (K % 64 columns, whole groups) loads only its codes
// and scales (masked) against zero columns of x. (The split gathers: 8.4 % of air-1g's NVFP4
// decode on AVX2 as a loop of scalar copies.)
AVX2 static void nvfp4_split_avx2(const float *x, int64_t K, float *xs) {
  static const int32_t col[64] = {  // column of xs[c + 8 v + l]: the order above
      0,  4,  8,  12, 32, 36, 40, 44, 2,  6,  10, 14, 34, 38, 42, 46, 1,  5,  9,  13, 33, 37,
      41, 45, 3,  7,  11, 15, 35, 39, 43, 47, 16, 20, 24, 28, 48, 52, 56, 60, 18, 22, 26, 30,
      50, 54, 58, 62, 17, 21, 25, 29, 49, 53, 57, 61, 19, 23, 27, 31, 51, 55, 59, 63};
  const __m256 s = _mm256_set1_ps(NV_X_SCALE_AVX2);
  int64_t c = 0;
  for (; c + 64 <= K; c += 64)
    for (int v = 0; v < 8; v++) {
      __m256i i = _mm256_loadu_si256((const __m256i *)(col + 8 * v));
      _mm256_storeu_ps(xs + c + 8 * v, _mm256_mul_ps(_mm256_i32gather_ps(x + c, i, 4), s));
    }
  for (int j = 0; c < K && j < 64; j++)
    xs[c + j] = c + col[j] < K ? x[c + col[j]] * NV_X_SCALE_AVX2 : 0.0f;
}

// The step at column c of RW weight rows by NX split rows (ng groups of it).
AVX2 INLINE void nv2_step(const uint8_t *const *w, const uint8_t *const *gs,
                          const float *const *xs, int64_t c, bool full, int ng, __m256 *acc,
                          const int RW, const int NX) {
  const __m256i tab_hi = _mm256_setr_epi8(
      0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, -0x80, -0x41, -0x41, -0x41, -0x40, -0x40,
      -0x40, -0x40, 0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, -0x80, -0x41, -0x41, -0x41,
      -0x40, -0x40, -0x40, -0x40);
  const __m256i tab_lo = _mm256_setr_epi8(
      0x00, 0x00, -0x80, -0x40, 0x00, 0x40, -0x80, -0x40, 0x00, 0x00, -0x80, -0x40, 0x00, 0x40,
      -0x80, -0x40, 0x00, 0x00, -0x80, -0x40, 0x00, 0x40, -0x80, -0x40, 0x00, 0x00, -0x80, -0x40,
      0x00, 0x40, -0x80, -0x40);
  // a scale byte (0 and 2: groups 0 and 2; 1 and 3) at bits 24..31 of each half's lanes
  const __m256i pick_a = _mm256_setr_epi32(0x00808080, 0x00808080, 0x00808080, 0x00808080,
                                           0x02808080, 0x02808080, 0x02808080, 0x02808080);
  const __m256i pick_b = _mm256_setr_epi32(0x01808080, 0x01808080, 0x01808080, 0x01808080,
                                           0x03808080, 0x03808080, 0x03808080, 0x03808080);
  const __m256i nib = _mm256_set1_epi8(0x0F), hi16 = _mm256_set1_epi32((int)0xFFFF0000);
  const __m256i smask = _mm256_set1_epi32((int)0x87F00000);
  LKS_UNROLL
  for (int i = 0; i < RW; i++) {
    const uint8_t *p = w[i] + c / 2;
    __m256i v = full ? _mm256_loadu_si256((const __m256i *)p)
                     : _mm256_maskload_epi32((const int *)p, _mm256_cmpgt_epi32(
                                                 _mm256_set1_epi32(2 * ng),
                                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    __m256i n[2] = {_mm256_and_si256(v, nib), _mm256_and_si256(_mm256_srli_epi16(v, 4), nib)};
    __m256 f[8];
    LKS_UNROLL
    for (int b = 0; b < 2; b++) {
      __m256i hb = _mm256_shuffle_epi8(tab_hi, n[b]), lb = _mm256_shuffle_epi8(tab_lo, n[b]);
      __m256i u[2] = {_mm256_unpacklo_epi8(lb, hb), _mm256_unpackhi_epi8(lb, hb)};
      LKS_UNROLL
      for (int h = 0; h < 2; h++) {
        f[4 * h + 2 * b] = _mm256_castsi256_ps(_mm256_slli_epi32(u[h], 16));
        f[4 * h + 2 * b + 1] = _mm256_castsi256_ps(_mm256_and_si256(u[h], hi16));
      }
    }
    uint32_t s4 = 0;
    memcpy(&s4, gs[i] + c / 16, full ? 4 : (size_t)ng);
    __m256i sb4 = _mm256_set1_epi32((int)s4);
    __m256 sa = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(sb4, pick_a), 4), smask));
    __m256 sb = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(sb4, pick_b), 4), smask));
    LKS_UNROLL
    for (int t = 0; t < NX; t++) {
      const float *x = xs[t] + c;
      __m256 qa = _mm256_mul_ps(f[0], _mm256_loadu_ps(x));
      __m256 qb = _mm256_mul_ps(f[4], _mm256_loadu_ps(x + 32));
      LKS_UNROLL
      for (int m = 1; m < 4; m++) {
        qa = _mm256_fmadd_ps(f[m], _mm256_loadu_ps(x + 8 * m), qa);
        qb = _mm256_fmadd_ps(f[4 + m], _mm256_loadu_ps(x + 32 + 8 * m), qb);
      }
      acc[i * NX + t] = _mm256_fmadd_ps(qa, sa, acc[i * NX + t]);
      acc[i * NX + t] = _mm256_fmadd_ps(qb, sb, acc[i * NX + t]);
    }
  }
}

// RW weight rows by NX split rows, RW * NX <= 4: out[i * NX + t], each pair's arithmetic the
// same whatever RW and NX.
AVX2 INLINE void nvfp4_avx2_g(const uint8_t *const *w, const uint8_t *const *near,
                              const uint8_t *const *far, const uint8_t *const *gs,
                              const float *const *xs, int64_t K, float mul, float *out,
                              const int RW, const int NX) {
  __m256 acc[4];
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++) acc[j] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 64 <= K; c += 64) {
    if (near && !(c & 64)) {  // a line of codes each two steps
      LKS_UNROLL
      for (int i = 0; i < RW; i++) {
        _mm_prefetch((const char *)near[i] + c / 2, _MM_HINT_T0);
        _mm_prefetch((const char *)far[i] + c / 2, _MM_HINT_T1);
      }
    }
    nv2_step(w, gs, xs, c, true, 4, acc, RW, NX);
  }
  if (c < K) nv2_step(w, gs, xs, c, false, (int)(K - c) / 16, acc, RW, NX);
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++) out[j] = hsum8(acc[j]) * NV_OUT_SCALE_AVX2 * mul + 0.0f;
}

#define NV_G2(RW, NX) nvfp4_avx2_g(w + i0, near, far, gs + i0, xs + t0, K, 1.0f, o, RW, NX)
AVX2 static void nvfp4_avx2_grid(const uint8_t *const *w, const uint8_t *const *ahead,
                                 const uint8_t *const *gs, const uint8_t *const *exp0,
                                 const float *const *xs, int nw, int nx, int64_t K, float *out) {
  (void)exp0;  // exponent-0 scales are converted as the others (no exact path)
  AVX2_SUBGRIDS(NV_G2);
}
#undef NV_G2

// x as it is: split here (split_rows).
AVX2 static void nvfp4_avx2(const uint8_t *w, const uint8_t *gs, const float *const *x, int nx,
                            int64_t K, float *out) {
  const float *xs[LKS__QROWS];
  float *buf = split_rows(nvfp4_split_avx2, lks__nvfp4_split_len(K), x, nx, K, xs);
  if (!buf) {
    nvfp4_scalar(w, gs, x, nx, K, out);
    return;
  }
  const uint8_t *wr[1] = {w}, *sr[1] = {gs};
  nvfp4_avx2_grid(wr, NULL, sr, NULL, xs, 1, nx, K, out);
  free(buf);
}

// Decode's rows of a task (lks__qmv_fn), as the AVX-512 level's (nvfp4_avx512_mv): a full grid
// of 8 rows as two sub-grids of 4 inlined, their sums stored finished. One thread, in cache,
// best of 41, this level on an Intel Xeon (kernels of 2026-12-07): FP8 blocks 1024 x 1024
// 14.1-14.3 -> 15.2-15.3 G weights/s, 2978 x 352 11.7-11.8 -> 13.9; NVFP4 13.0 -> 13.8-13.9
// and 7.9 -> 8.6-8.9.
AVX2 static void nvfp4_avx2_mv(const lks__qweight *w, int64_t r0, int64_t r1, int64_t pf,
                               const float *xs, float *out) {
  const int64_t K = w->cols;
  QMV_LOOP(
      {
        (void)e0;  // exponent-0 scales are converted as the others (no exact path)
        const uint8_t *const *gs = (const uint8_t *const *)sc;
        LKS_UNROLL
        for (int h = 0; h < LKS__QGRID; h += 4)
          nvfp4_avx2_g(codes + h, ahead + h, ahead + LKS__QGRID + h, gs + h, &xs, K, w->global,
                       d + h, 4, 1);
      },
      {
        nvfp4_avx2_grid(codes, ahead, (const uint8_t *const *)sc, NULL, &xs, nw, 1, K, d);
        for (int i = 0; i < nw; i++) d[i] = d[i] * w->global + 0.0f;
      });
}

AVX2 static void fp8_avx2_mv(const lks__qweight *w, int64_t r0, int64_t r1, int64_t pf,
                             const float *xs, float *out) {
  const int64_t K = w->cols, blk = w->qs == LKS_Q_FP8_ROW ? K : LKS_Q_FP8_BLOCK_SIZE;
  QMV_LOOP(
      {
        (void)e0;  // exponent-0 codes are converted as the others (no exact path)
        const float *const *bs = (const float *const *)sc;
        LKS_UNROLL
        for (int h = 0; h < LKS__QGRID; h += 4)
          fp8_avx2_g(codes + h, ahead + h, ahead + LKS__QGRID + h, bs + h, blk, &xs, K, d + h,
                     4, 1);
      },
      fp8_avx2_grid(codes, ahead, (const float *const *)sc, NULL, blk, &xs, nw, 1, K, d));
}

// ---- AVX-512: 16 columns a vector ----
//
// No f32 subnormal enters an FMA. An Intel core takes a microcode assist for each FMA with a
// subnormal operand (about 48 ns, 77 times an FMA, on this Xeon, 2026-12-07; AMD's Zen cores
// take none): the kernels until then placed FP8 codes (and NVFP4's scales) as 2^-120 times
// their values, so every code of exponent 0, a zero or a subnormal, became an f32 subnormal, and
// a 352 x 1024 FP8 product with random codes (one in 16 of exponent 0) took 0.52 ms in place of
// 0.03. Quantizers write them about once in 10^4 codes (tools/gen_model.py's air-1g: 1.1e-4),
// more where a row's or block's scale is set by a few large weights. Now the placement adds 112
// to the exponent (FP8_EXP_BIAS: one ternary-logic operation in place of the mask), which makes
// every code of exponent 1-15 a normal f32 worth 2^-8 times its value; a code of exponent 0
// then reads (1 + m/8) 2^-15 = t where it is worth m 2^-17, which is 2t -+ 2^-14
// (fp8_fix_avx512: exact, Sterbenz). The loader flags each row's chunks of 128 columns that
// hold such a code (lks_e4m3_exp0_chunks, lks__qweight.exp0); a flagged chunk's steps convert
// the flagged rows' codes with the fix (3 operations a vector, out of line), the
// others as before, and both give the same f32 for a code of exponent 1-15, so a row's
// arithmetic does not depend on which rows share its grid. Without flags (tests, kernel_bench
// by hand) the kernel tests the codes of each chunk (two vector tests a row). NVFP4's scales
// alike: a step's 8 scales, one chunk, from a table where flagged. The AVX2 kernels keep the
// 2^-120 placement, and an Intel core pays the same assists there: with the exponent raised (an
// OR more, no ternary logic on AVX2) and each chunk tested, the AVX2 FP8 kernel took x1.5 the
// time in cache and x1.3 out of it on this host (LKS_SIMD=avx2, kernel_bench, before the flags),
// which an AVX2-only AMD core (no assists; FP8 there is bound by these operations) would lose.

AVX512 INLINE __m512 fp8_fix_avx512(__m512 t) {  // exponent 0: 2t -+ 2^-14 (t >= +0, t <= -0)
  const __m512i t32 = _mm512_castps_si512(t);
  __m512 c = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(  // (a & b) | c: 2^-14, t's sign
      t32, _mm512_set1_epi32((int)0x80000000), _mm512_castps_si512(_mm512_set1_ps(0x1p-14f)),
      0xEA));
  __mmask16 e0 = _mm512_testn_epi32_mask(t32, _mm512_set1_epi32(0x07800000));
  return _mm512_mask_fmsub_ps(t, e0, _mm512_set1_ps(2.0f), c);
}

// _mm512_reduce_add_ps of 8 vectors at once, bit for bit: GCC's reduction adds lanes i and
// i + 8, then i and i + 4, i and i + 2, i and i + 1, and this adds the same pairs (a sum does not
// depend on its operands' order), 15 operations where eight reductions take 56 (checked against
// it on 1.6 M random sums, 2026-12-07). Lane j of the result: v[j]'s sum.
AVX512 INLINE __m256 hsum16x8(const __m512 *v) {
  __m512 u[4], w[2];
  LKS_UNROLL
  for (int j = 0; j < 4; j++)  // lanes i + (i + 8): v[2j]'s in lanes 0..7, v[2j + 1]'s in 8..15
    u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
  LKS_UNROLL
  for (int j = 0; j < 2; j++)  // then + 4: v[4j + k]'s in 128-bit block k
    w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0xDD));
  // + 2: block k holds v[k]'s two sums in lanes 0, 1 and v[4 + k]'s in lanes 2, 3; then + 1.
  __m512 x =
      _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x44), _mm512_shuffle_ps(w[0], w[1], 0xEE));
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));
  const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(pick, x));
}

// Whether any of the E4M3 scale bytes in b has exponent 0 (a zero or a subnormal scale): a byte
// of b & 0x78.. is zero.
static inline bool nv_exp0(uint64_t b) {
  b &= 0x7878787878787878ull;
  return ((b - 0x0101010101010101ull) & ~b & 0x8080808080808080ull) != 0;
}

// x's columns c .. c + 31 (c .. c + 15 and zeros for a half step) split into even and odd.
AVX512 INLINE void even_odd(const float *x, bool half, __m512 *xe, __m512 *xo) {
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 x0 = _mm512_loadu_ps(x), x1 = half ? _mm512_setzero_ps() : _mm512_loadu_ps(x + 16);
  *xe = _mm512_permutex2var_ps(x0, ie, x1);
  *xo = _mm512_permutex2var_ps(x0, io, x1);
}

// A grid kernel's call for nw weight rows by nx activation rows (nw * nx <= 8), G(RW, NX) with
// both constants.
#define GRID_SHAPES(G, nw, nx)                    \
  do {                                            \
    switch (nx) {                                 \
      case 1:                                     \
        switch (nw) {                             \
          case 1: G(1, 1); break;                 \
          case 2: G(2, 1); break;                 \
          case 3: G(3, 1); break;                 \
          case 4: G(4, 1); break;                 \
          case 5: G(5, 1); break;                 \
          case 6: G(6, 1); break;                 \
          case 7: G(7, 1); break;                 \
          default: G(8, 1); break;                \
        }                                         \
        break;                                    \
      case 2:                                     \
        switch (nw) {                             \
          case 1: G(1, 2); break;                 \
          case 2: G(2, 2); break;                 \
          case 3: G(3, 2); break;                 \
          default: G(4, 2); break;                \
        }                                         \
        break;                                    \
      case 3:                                     \
        if ((nw) == 1) G(1, 3);                   \
        else G(2, 3);                             \
        break;                                    \
      case 4:                                     \
        if ((nw) == 1) G(1, 4);                   \
        else G(2, 4);                             \
        break;                                    \
      case 5: G(1, 5); break;                     \
      case 6: G(1, 6); break;                     \
      case 7: G(1, 7); break;                     \
      default: G(1, 8); break;                    \
    }                                             \
  } while (0)

// NVFP4 on AVX-512, 128 columns (8 groups, 64 code bytes: one cache line a row) a step. The
// line loaded as 16 32-bit lanes puts columns 8i .. 8i + 7 in lane i (4 bytes, low nibble
// first), all of group i / 2; the permute reads a lane's low 4 bits, so the lanes shifted right
// by 4m index column 8i + m's E2M1 value in the 16-entry table: 7 shifts and 8 permutes a step,
// no widening of bytes. Where the row goes on past the step, the line is also loaded 1, 2 and 3
// bytes on, whose lanes hold columns 8i + 2, 8i + 4 and 8i + 6 in their low 4 bits: 3 loads
// (free of the vector ports) in place of 3 of the shifts (one thread, in cache, best of 41:
// 1024 x 1024 23.2 -> 24.3 G weights/s, 2978 x 352 17.6-17.9 -> 17.9-18.2). x is split once
// for many weight rows into that order (vector m of a step: columns 8i + m, times 2^8;
// nvfp4_avx512_split). A lane's 8 products are summed before its group's scale multiplies them
// once:
//   acc = (sum_m e2m1(c_m) * (2^8 x_m)) * (2^-8 s) + acc
// where 2^-8 s is the scale's E4M3 bits placed in an f32 (exponent and mantissa at bits 26..20,
// sign at 31, 112 added to the exponent: exact for scales of exponent 1-15; those of exponent 0
// come from a table, above; NaN codes are not detected), and the row's total is the product: 9
// FMAs a row for 128 weights, where scaling each weight before its FMA took 16, and the scales'
// conversion is 4 vector operations a step where each group took two table lookups. The
// products are exact but for f32 roundings of the sums. (Until 2026-12-07: x times 2^64,
// scales 2^-120 s, the total times 2^56.) A row's last step, K % 128 columns (whole groups),
// loads only its codes and scales (masked) against zero columns of x. One thread, decode's
// path (x split, 8 rows a call), 352 x 1024: 15 -> 25 G weights/s in cache, 14.5 -> 17-20 out
// of it (131072 rows), against the kernel that scaled each weight, 32 columns a step, four rows
// a call.

// A step's 8 group scales as 2^-8 s, group i / 2's in lane i (ng < 8: the first ng only): the
// 8 bytes in every 64 bits, each 128 bits' shuffle putting the byte of lane i at its bits 24..31,
// shifted right by 4 with the sign, masked and the exponent raised by 112; from the table where
// the step's chunk is flagged (fl; NULL: where a byte has exponent 0).
AVX512 __attribute__((noinline)) static __m512 nv_scales_exact(uint64_t b8) {  // from the table
  float v[16];
  for (int i = 0; i < 16; i++) v[i] = e4m3_lut_s8[(b8 >> (8 * (i / 2))) & 255];
  return _mm512_loadu_ps(v);
}

AVX512 INLINE __m512 nv_scales(const uint8_t *gs, const uint8_t *fl, bool full, int ng) {
  const __m512i pick = _mm512_set_epi32(
      0x07808080, 0x07808080, 0x06808080, 0x06808080, 0x05808080, 0x05808080, 0x04808080,
      0x04808080, 0x03808080, 0x03808080, 0x02808080, 0x02808080, 0x01808080, 0x01808080,
      0x00808080, 0x00808080);
  uint64_t b8;  // past ng groups: 1.0 (any finite value)
  if (full) memcpy(&b8, gs, 8);
  else
    b8 = (uint64_t)_mm_cvtsi128_si64(_mm_maskz_loadu_epi8((__mmask16)((1u << ng) - 1), gs)) |
         0x3838383838383838ull << (8 * ng);
  __m512i d = _mm512_srai_epi32(_mm512_shuffle_epi8(_mm512_set1_epi64((long long)b8), pick), 4);
  __m512 s = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(  // (a & b) | c
      d, _mm512_set1_epi32((int)0x87F00000), _mm512_set1_epi32(FP8_EXP_BIAS << 16), 0xEA));
  return __builtin_expect(fl ? *fl != 0 : nv_exp0(b8), 0) ? nv_scales_exact(b8) : s;
}

// The step at column c of RW weight rows by NX split activation rows (ng groups of it); more:
// the rows have at least 8 more bytes past the step's 64 (the offset loads stay inside them).
AVX512 INLINE void nv_g_step(const uint8_t *const *w, const uint8_t *const *gs,
                             const uint8_t *const *exp0, const float *const *xs, int64_t c,
                             bool full, bool more, int ng, __m512 lut, __m512 *acc, const int RW,
                             const int NX) {
  LKS_UNROLL
  for (int i = 0; i < RW; i++) {
    const uint8_t *p = w[i] + c / 2;
    __m512i v = full ? _mm512_loadu_si512(p)
                     : _mm512_maskz_loadu_epi32((__mmask16)((1u << (2 * ng)) - 1), p);
    __m512 s = nv_scales(gs[i] + c / 16, exp0 ? exp0[i] + c / 128 : NULL, full, ng), wm[8];
    if (more) {
      LKS_UNROLL
      for (int j = 0; j < 4; j++) {
        __m512i u = j ? _mm512_loadu_si512(p + j) : v;
        wm[2 * j] = _mm512_permutexvar_ps(u, lut);
        wm[2 * j + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(u, 4), lut);
      }
    } else {
      wm[0] = _mm512_permutexvar_ps(v, lut);
      LKS_UNROLL
      for (int m = 1; m < 8; m++) wm[m] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * m), lut);
    }
    LKS_UNROLL
    for (int t = 0; t < NX; t++) {
      const float *x = xs[t] + c;
      __m512 q = _mm512_mul_ps(wm[0], _mm512_loadu_ps(x));
      LKS_UNROLL
      for (int m = 1; m < 8; m++) q = _mm512_fmadd_ps(wm[m], _mm512_loadu_ps(x + 16 * m), q);
      acc[i * NX + t] = _mm512_fmadd_ps(q, s, acc[i * NX + t]);
    }
  }
}

// RW weight rows by NX split activation rows, RW * NX <= 8: out[i * NX + t], every pair's
// arithmetic the same whatever RW and NX (one accumulator, the steps in order). Decode reads
// eight rows' codes at once (as FP8's grids); a step's weights converted once serve its NX rows.
AVX512 INLINE void nvfp4_avx512_g(const uint8_t *const *w, const uint8_t *const *ahead,
                                  const uint8_t *const *gs, const uint8_t *const *exp0,
                                  const float *const *xs, int64_t K, float mul, float *out,
                                  const int RW, const int NX) {
  const __m512 lut = _mm512_loadu_ps(e2m1_lut);
  __m512 acc[8];
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++) acc[j] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 128 <= K; c += 128) {
    if (ahead) {
      LKS_UNROLL
      for (int i = 0; i < RW; i++) {
        _mm_prefetch((const char *)ahead[i] + c / 2, _MM_HINT_T0);
        _mm_prefetch((const char *)ahead[LKS__QGRID + i] + c / 2, _MM_HINT_T1);
      }
    }
    nv_g_step(w, gs, exp0, xs, c, true, c + 128 < K, 8, lut, acc, RW, NX);
  }
  if (c < K) nv_g_step(w, gs, exp0, xs, c, false, false, (int)(K - c) / 16, lut, acc, RW, NX);
  if (RW * NX == 8) {
    __m256 r = _mm256_mul_ps(_mm256_mul_ps(hsum16x8(acc), _mm256_set1_ps(NV_OUT_SCALE)),
                             _mm256_set1_ps(mul));
    _mm256_storeu_ps(out, _mm256_add_ps(r, _mm256_setzero_ps()));
    return;
  }
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++)
    out[j] = _mm512_reduce_add_ps(acc[j]) * NV_OUT_SCALE * mul + 0.0f;
}

#define NV_G(RW, NX) nvfp4_avx512_g(w, ahead, gs, exp0, xs, K, 1.0f, out, RW, NX)
AVX512 static void nvfp4_avx512_grid(const uint8_t *const *w, const uint8_t *const *ahead,
                                     const uint8_t *const *gs, const uint8_t *const *exp0,
                                     const float *const *xs, int nw, int nx, int64_t K,
                                     float *out) {
  GRID_SHAPES(NV_G, nw, nx);
}
#undef NV_G

// The 256-bit halves of a and b, a's low half then b's.
AVX512 INLINE __m512 halves(__m256 a, __m256 b) {
  return _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)), _mm256_castps_pd(b), 1));
}

// x split for nvfp4_avx512_g: each 128 columns, read as 16 rows i of 8 columns m, transposed
// (vector m: x[8i + m]) and times 2^64; the columns past K zero. Two 8 x 8 transposes at once,
// rows i < 8 in the vectors' lower halves and i >= 8 in their upper ones.
AVX512 static void nvfp4_avx512_split(const float *x, int64_t K, float *xs) {
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
  const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 scale = _mm512_set1_ps(NV_X_SCALE);
  for (int64_t c = 0; c < K; c += 128) {
    float part[128];
    const float *s = x + c;
    if (c + 128 > K) {
      memset(part, 0, sizeof part);
      memcpy(part, s, (size_t)(K - c) * sizeof *x);
      s = part;
    }
    __m512 z[8], t[8], u[8];
    LKS_UNROLL
    for (int r = 0; r < 8; r++)
      z[r] = halves(_mm256_loadu_ps(s + 8 * r), _mm256_loadu_ps(s + 64 + 8 * r));
    LKS_UNROLL
    for (int r = 0; r < 8; r += 2) {
      t[r] = _mm512_unpacklo_ps(z[r], z[r + 1]);
      t[r + 1] = _mm512_unpackhi_ps(z[r], z[r + 1]);
    }
    LKS_UNROLL
    for (int r = 0; r < 8; r += 4) {
      u[r] = _mm512_shuffle_ps(t[r], t[r + 2], 0x44);
      u[r + 1] = _mm512_shuffle_ps(t[r], t[r + 2], 0xEE);
      u[r + 2] = _mm512_shuffle_ps(t[r + 1], t[r + 3], 0x44);
      u[r + 3] = _mm512_shuffle_ps(t[r + 1], t[r + 3], 0xEE);
    }
    float *d = xs + c;
    LKS_UNROLL
    for (int m = 0; m < 4; m++) {
      __m512 a = _mm512_permutex2var_ps(u[m], lo, u[m + 4]);
      __m512 b = _mm512_permutex2var_ps(u[m], hi, u[m + 4]);
      _mm512_storeu_ps(d + 16 * m, _mm512_mul_ps(a, scale));
      _mm512_storeu_ps(d + 16 * (m + 4), _mm512_mul_ps(b, scale));
    }
  }
}

AVX512 static void nvfp4_avx512(const uint8_t *w, const uint8_t *gs, const float *const *x, int nx,
                                int64_t K, float *out) {
  const float *xs[LKS__QROWS];
  float *buf = split_rows(nvfp4_avx512_split, lks__nvfp4_split_len(K), x, nx, K, xs);
  if (!buf) {
    nvfp4_scalar(w, gs, x, nx, K, out);
    return;
  }
  const uint8_t *wr[1] = {w}, *sr[1] = {gs};
  nvfp4_avx512_grid(wr, NULL, sr, NULL, xs, 1, nx, K, out);
  free(buf);
}

// FP8 on AVX-512, 32 columns a step: the 32 codes sign-extended to 16 bits and shifted left by
// 4 put sign, exponent and mantissa at a BF16's bits 15, 10..7 and 6..4; with bits 14..11 (the
// sign's copies) set to 0111, each word is a BF16 (and, in a 32-bit lane's upper half, an f32)
// worth 2^-8 times the code's E4M3 value, exponent 0 apart (above). A lane's lower word shifted
// up and its upper word masked are the f32 weights of the step's even and odd columns: 5
// integer operations for 32 weights, against 6 for the conversion through halves, whose two
// conversions take 2 uops each (air-1g's experts, 352 x 1024, in cache, one thread, on AMD: 20
// -> 38 G weights/s with the grids below). x is split once for all weight rows into its even
// and odd columns (fp8_avx512_split) times 2^8, so that the products are the true ones; each
// block's partial sums are multiplied by its scale:
//   sum_b s_b * (sum_{k in b} (2^-8 e4m3(w_k)) * (2^8 x_k))
// exact but for the f32 roundings of the sums. (Until 2026-12-07 the weights were 2^-120 times
// the values and x 2^64 times, the block scales 2^56: the same bits but where those subnormals
// read.) A row's last block may end in a half step (16 columns, the codes' other 16 zero) and a
// tail of K % 16 columns summed one at a time with x as it is (kept after the split columns).

// The weights of a step's even and odd columns (half: 16 codes, the rest zero).
AVX512 INLINE void fp8_pair(const uint8_t *p, bool half, bool exact, __m512 *we, __m512 *wo) {
  __m256i c = half ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p))
                   : _mm256_loadu_si256((const __m256i *)p);
  __m512i h = _mm512_cvtepi8_epi16(c);
  h = _mm512_ternarylogic_epi32(_mm512_slli_epi16(h, 4), _mm512_set1_epi16((short)0x87FF),
                                _mm512_set1_epi16(FP8_EXP_BIAS), 0xEA);  // (a & b) | c
  *we = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  *wo = _mm512_castsi512_ps(_mm512_and_si512(h, _mm512_set1_epi32((int)0xFFFF0000)));
  if (exact) *we = fp8_fix_avx512(*we), *wo = fp8_fix_avx512(*wo);
}

// Whether any of the n codes at p (n <= 128) has exponent 0 (a zero or a subnormal code).
AVX512 INLINE bool fp8_exp0_avx512(const uint8_t *p, int64_t n) {
  const __m512i e = _mm512_set1_epi8(0x78);
  __mmask64 m0 = n >= 64 ? ~0ull : (1ull << n) - 1;
  __mmask64 m1 = n >= 128 ? ~0ull : n > 64 ? (1ull << (n - 64)) - 1 : 0;
  __mmask64 a = _mm512_mask_testn_epi8_mask(m0, _mm512_maskz_loadu_epi8(m0, p), e);
  __mmask64 b = _mm512_mask_testn_epi8_mask(m1, _mm512_maskz_loadu_epi8(m1, p + 64), e);
  return (a | b) != 0;
}

AVX512 static void fp8_avx512_split(const float *x, int64_t K, float *xs) {
  const __m512 s = _mm512_set1_ps(FP8_X_SCALE);
  int64_t G = K / 16, g = 0;
  __m512 xe, xo;
  for (; g < G; g += 2) {
    even_odd(x + g * 16, g + 1 == G, &xe, &xo);
    _mm512_storeu_ps(xs + g * 16, _mm512_mul_ps(xe, s));
    _mm512_storeu_ps(xs + g * 16 + 16, _mm512_mul_ps(xo, s));
  }
  memcpy(xs + lks__fp8_split_head(K), x + G * 16, (size_t)(K % 16) * sizeof *x);
}

// One step at column k of RW weight rows by NX activation rows.
// Rows i with bit i of ex set convert their codes exactly (fp8_fix_avx512); ex = 0: none.
AVX512 INLINE void fp8_g_step(const uint8_t *const *w, const float *const *xs, int64_t k,
                              bool half, unsigned ex, __m512 *p, const int RW, const int NX) {
  LKS_UNROLL
  for (int i = 0; i < RW; i++) {
    __m512 we, wo;
    fp8_pair(w[i] + k, half, ex >> i & 1, &we, &wo);
    LKS_UNROLL
    for (int t = 0; t < NX; t++) {
      __m512 *q = &p[i * NX + t];
      *q = _mm512_fmadd_ps(we, _mm512_loadu_ps(xs[t] + k), *q);
      *q = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xs[t] + k + 16), *q);
    }
  }
}

// Each other step (a line of codes each 64 columns): the rows' lines ahead, into L1 and L2.
AVX512 INLINE void fp8_fetch(const uint8_t *const *ahead, int64_t k, const int RW) {
  if (!ahead || (k & 32)) return;
  LKS_UNROLL
  for (int i = 0; i < RW; i++) {
    _mm_prefetch((const char *)ahead[i] + k, _MM_HINT_T0);
    _mm_prefetch((const char *)ahead[LKS__QGRID + i] + k, _MM_HINT_T1);
  }
}

// The steps of columns [k, k + n) (n a multiple of 16) where the rows of ex hold exponent-0
// codes, those rows' weights exact (fp8_fix_avx512), fetching ahead as the common steps do: out
// of line, one function a grid shape (FP8_EXACT), so that the common steps keep their registers
// and this one its unrolled loops.
#define FP8_EXACT_FN(RW, NX)                                                                   \
  AVX512 __attribute__((noinline)) static void fp8_exact_##RW##_##NX(                          \
      const uint8_t *const *w, const uint8_t *const *ahead, const float *const *xs, int64_t k, \
      int64_t n, unsigned ex, __m512 *q) {                                                     \
    __m512 p[RW * NX];                                                                         \
    LKS_UNROLL                                                                                 \
    for (int j = 0; j < RW * NX; j++) p[j] = q[j];                                             \
    for (int64_t e = k + n; k < e; k += 32) {                                                  \
      fp8_fetch(ahead, k, RW);                                                                 \
      fp8_g_step(w, xs, k, k + 32 > e, ex, p, RW, NX);                                         \
    }                                                                                          \
    LKS_UNROLL                                                                                 \
    for (int j = 0; j < RW * NX; j++) q[j] = p[j];                                             \
  }
FP8_EXACT_FN(1, 1) FP8_EXACT_FN(2, 1) FP8_EXACT_FN(3, 1) FP8_EXACT_FN(4, 1)
FP8_EXACT_FN(5, 1) FP8_EXACT_FN(6, 1) FP8_EXACT_FN(7, 1) FP8_EXACT_FN(8, 1)
FP8_EXACT_FN(1, 2) FP8_EXACT_FN(2, 2) FP8_EXACT_FN(3, 2) FP8_EXACT_FN(4, 2)
FP8_EXACT_FN(1, 3) FP8_EXACT_FN(2, 3) FP8_EXACT_FN(1, 4) FP8_EXACT_FN(2, 4)
FP8_EXACT_FN(1, 5) FP8_EXACT_FN(1, 6) FP8_EXACT_FN(1, 7) FP8_EXACT_FN(1, 8)
#undef FP8_EXACT_FN
#define FP8_EXACT(RW, NX) fp8_exact_##RW##_##NX(w, ahead, xs, k, n, ex, q)

// RW weight rows by NX activation rows (split), RW * NX <= 8: out[i * NX + t]. Every pair's
// arithmetic is the same whatever RW and NX: a block sum in one accumulator, the even then the
// odd columns' products each step (two dependent FMAs), added to the pair's total times the
// block's scale; the tail one column at a time. Eight pairs keep the FMA units busy (with fewer
// they wait on the FMAs' latency) and, one activation row by eight weight rows (decode), eight
// streams of codes are read at once: out of cache, one thread, 13.5-15 -> 17-21 G weights/s
// against four. Each weight step is converted once for its NX rows.
AVX512 INLINE void fp8_avx512_g(const uint8_t *const *w, const uint8_t *const *ahead,
                                const float *const *bs, const uint8_t *const *exp0, int64_t blk,
                                const float *const *xs, int64_t K, float *out, const int RW,
                                const int NX) {
  __m512 acc[8], p[8];
  float tail[8] = {0};
  const int64_t K16 = K / 16 * 16, tx = lks__fp8_split_head(K);
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++) acc[j] = _mm512_setzero_ps();
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += blk, b++) {
    int64_t k1 = k0 + blk < K ? k0 + blk : K, k = k0;
    LKS_UNROLL
    for (int j = 0; j < RW * NX; j++) p[j] = _mm512_setzero_ps();
    while (k + 16 <= k1) {  // chunks of 128 columns
      const int64_t n = (k1 - k < 128 ? k1 - k : 128) / 16 * 16, e = k + n;
      unsigned ex = 0;  // the rows with exponent-0 codes here
      if (exp0) {
        LKS_UNROLL
        for (int i = 0; i < RW; i++) ex |= (unsigned)(exp0[i][k / LKS_E4M3_CHUNK] != 0) << i;
      } else {
        LKS_UNROLL
        for (int i = 0; i < RW; i++) ex |= (unsigned)fp8_exp0_avx512(w[i] + k, n) << i;
      }
      if (__builtin_expect(ex != 0, 0)) {
        __m512 q[8];
        LKS_UNROLL
        for (int j = 0; j < RW * NX; j++) q[j] = p[j];
        GRID_SHAPES(FP8_EXACT, RW, NX);
        LKS_UNROLL
        for (int j = 0; j < RW * NX; j++) p[j] = q[j];
        k = e;
        continue;
      }
      for (; k + 32 <= e; k += 32) {
        fp8_fetch(ahead, k, RW);
        fp8_g_step(w, xs, k, false, 0, p, RW, NX);
      }
      if (k < e) {
        fp8_g_step(w, xs, k, true, 0, p, RW, NX);
        k += 16;
      }
    }
    LKS_UNROLL
    for (int i = 0; i < RW; i++) {
      __m512 s = _mm512_set1_ps(bs[i][b] * FP8_S_SCALE);
      LKS_UNROLL
      for (int t = 0; t < NX; t++) {
        acc[i * NX + t] = _mm512_fmadd_ps(p[i * NX + t], s, acc[i * NX + t]);
        float ts = 0;
        for (int64_t j = k; j < k1; j++) ts += e4m3_lut[w[i][j]] * xs[t][tx + j - K16];
        tail[i * NX + t] += ts * bs[i][b];
      }
    }
  }
  if (RW * NX == 8) {
    _mm256_storeu_ps(out, _mm256_add_ps(hsum16x8(acc), _mm256_loadu_ps(tail)));
    return;
  }
  LKS_UNROLL
  for (int j = 0; j < RW * NX; j++) out[j] = _mm512_reduce_add_ps(acc[j]) + tail[j];
}

#define FP8_G(RW, NX) fp8_avx512_g(w, ahead, bs, exp0, blk, xs, K, out, RW, NX)
AVX512 static void fp8_avx512_grid(const uint8_t *const *w, const uint8_t *const *ahead,
                                   const float *const *bs, const uint8_t *const *exp0,
                                   int64_t blk, const float *const *xs, int nw, int nx, int64_t K,
                                   float *out) {
  GRID_SHAPES(FP8_G, nw, nx);
}
#undef FP8_G

// x as it is: split here (split_rows).
AVX512 static void fp8_avx512(const uint8_t *w, const float *bs, int64_t blk,
                              const float *const *x, int nx, int64_t K, float *out) {
  const float *xs[LKS__QROWS];
  float *buf = split_rows(fp8_avx512_split, lks__fp8_split_len(K), x, nx, K, xs);
  if (!buf) {
    fp8_scalar(w, bs, blk, x, nx, K, out);
    return;
  }
  const uint8_t *wr[1] = {w};
  const float *br[1] = {bs};
  fp8_avx512_grid(wr, NULL, br, NULL, blk, xs, 1, nx, K, out);
  free(buf);
}

// Decode's rows of a task (lks__qmv_fn): the grids' calls of LKS__QGRID rows in one loop, a
// full grid's kernel inlined, its 8 sums reduced together (hsum16x8) and stored finished (NVFP4
// times the tensor's multiplier; + 0.0f: -0 as +0, as every product gives). Called a grid at a time
// from lks__quant_matmul_rows, whose loop then read each sum back from the grid's vector store
// and scaled it, a call of 8 rows cost about 160 cycles beside each 128 columns' 14 (NVFP4, one
// thread, in cache: 34 cycles per 128 weights for rows of 128 columns, 21.7 and 15 G weights/s
// for rows of 1024 and 352). Now, best of 41 runs, one thread, in cache: NVFP4 rows of 128
// 34 -> 24.4 cycles, 1024 x 1024 22.5 -> 25.3 G weights/s, 2978 x 352 (air-1g's down products)
// 15.5 -> 19.1; FP8 blocks 19.1 -> 20.7 and 15.6 -> 17.9. air-1g NVFP4 decode, 2 threads, five
// alternated rounds: median 168.7 -> 183.8 tokens/s. The sums are those of the grids, bit for
// bit (tests/unit/check_quant.c, test_big_batch).
AVX512 static void nvfp4_avx512_mv(const lks__qweight *w, int64_t r0, int64_t r1, int64_t pf,
                                   const float *xs, float *out) {
  const int64_t K = w->cols;
  QMV_LOOP(nvfp4_avx512_g(codes, ahead, (const uint8_t *const *)sc, e0, &xs, K, w->global, d,
                          LKS__QGRID, 1),
           {
             nvfp4_avx512_grid(codes, ahead, (const uint8_t *const *)sc, e0, &xs, nw, 1, K, d);
             for (int i = 0; i < nw; i++) d[i] = d[i] * w->global + 0.0f;
           });
}

AVX512 static void fp8_avx512_mv(const lks__qweight *w, int64_t r0, int64_t r1, int64_t pf,
                                 const float *xs, float *out) {
  const int64_t K = w->cols, blk = w->qs == LKS_Q_FP8_ROW ? K : LKS_Q_FP8_BLOCK_SIZE;
  QMV_LOOP(fp8_avx512_g(codes, ahead, (const float *const *)sc, e0, blk, &xs, K, d, LKS__QGRID, 1),
           fp8_avx512_grid(codes, ahead, (const float *const *)sc, e0, blk, &xs, nw, 1, K, d));
}

static const lks__quant_kernels q_avx2 = {.name = "avx2",
                                          .fp8 = fp8_avx2,
                                          .nvfp4 = nvfp4_avx2,
                                          .group_rows = 4,
                                          .nvfp4_split = nvfp4_split_avx2,
                                          .nvfp4_grid = nvfp4_avx2_grid,
                                          .fp8_split = fp8_split_avx2,
                                          .fp8_grid = fp8_avx2_grid,
                                          .fp8_mv = fp8_avx2_mv,
                                          .nvfp4_mv = nvfp4_avx2_mv};
static const lks__quant_kernels q_avx512 = {.name = "avx512",
                                            .fp8 = fp8_avx512,
                                            .nvfp4 = nvfp4_avx512,
                                            .group_rows = 2,
                                            .nvfp4_split = nvfp4_avx512_split,
                                            .nvfp4_grid = nvfp4_avx512_grid,
                                            .fp8_split = fp8_avx512_split,
                                            .fp8_grid = fp8_avx512_grid,
                                            .fp8_mv = fp8_avx512_mv,
                                            .nvfp4_mv = nvfp4_avx512_mv};
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>

#define INLINE static inline __attribute__((always_inline))

// ---- NEON: 8-lane vectors as two 4-lane registers (the AVX2 kernels until 2026-12-06) ----

typedef struct {
  float32x4_t lo, hi;
} f32x8;

static const f32x8 zero8 = {{0, 0, 0, 0}, {0, 0, 0, 0}};

INLINE f32x8 ld8(const float *p) { return (f32x8){vld1q_f32(p), vld1q_f32(p + 4)}; }
INLINE f32x8 fma8(f32x8 acc, f32x8 a, f32x8 b) {
  return (f32x8){vfmaq_f32(acc.lo, a.lo, b.lo), vfmaq_f32(acc.hi, a.hi, b.hi)};
}
INLINE f32x8 fma8s(f32x8 acc, f32x8 a, float32x4_t s) {
  return (f32x8){vfmaq_f32(acc.lo, a.lo, s), vfmaq_f32(acc.hi, a.hi, s)};
}
INLINE float hsum8_neon(f32x8 a, f32x8 b) {
  return vaddvq_f32(vaddq_f32(vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)));
}

// 8 codes as f32, 2^-8 times their value, as on AVX2: sign-extended to 16 bits, shifted into
// half-precision position, bit 14 cleared, converted (FCVTL: exact, subnormal halves included).
INLINE f32x8 fp8x8_neon(const uint8_t *p) {
  int16x8_t h = vmovl_s8(vreinterpret_s8_u8(vld1_u8(p)));
  uint16x8_t u = vandq_u16(vreinterpretq_u16_s16(vshlq_n_s16(h, 7)), vdupq_n_u16(0xBF80));
  float16x8_t f = vreinterpretq_f16_u16(u);
  return (f32x8){vcvt_f32_f16(vget_low_f16(f)), vcvt_high_f32_f16(f)};
}

// NX rows (1 or 2) of one weight row.
INLINE void fp8_neon_n(const uint8_t *w, const float *bs, int64_t blk, const float *const *x,
                       int64_t K, float *out, const int NX) {
  f32x8 acc[2][2], p[2][2];
  float tail[2] = {0, 0};
  LKS_UNROLL
  for (int t = 0; t < NX; t++) acc[t][0] = acc[t][1] = zero8;
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += blk, b++) {
    int64_t k1 = k0 + blk < K ? k0 + blk : K, k = k0;
    LKS_UNROLL
    for (int t = 0; t < NX; t++) p[t][0] = p[t][1] = zero8;
    for (; k + 16 <= k1; k += 16) {
      f32x8 w0 = fp8x8_neon(w + k), w1 = fp8x8_neon(w + k + 8);
      LKS_UNROLL
      for (int t = 0; t < NX; t++) {
        p[t][0] = fma8(p[t][0], w0, ld8(x[t] + k));
        p[t][1] = fma8(p[t][1], w1, ld8(x[t] + k + 8));
      }
    }
    if (k + 8 <= k1) {
      f32x8 w0 = fp8x8_neon(w + k);
      LKS_UNROLL
      for (int t = 0; t < NX; t++) p[t][0] = fma8(p[t][0], w0, ld8(x[t] + k));
      k += 8;
    }
    float32x4_t s = vdupq_n_f32(bs[b] * 256.0f);
    LKS_UNROLL
    for (int t = 0; t < NX; t++) {
      acc[t][0] = fma8s(acc[t][0], p[t][0], s);
      acc[t][1] = fma8s(acc[t][1], p[t][1], s);
      float ts = 0;
      for (int64_t j = k; j < k1; j++) ts += e4m3_lut[w[j]] * x[t][j];
      tail[t] += ts * bs[b];
    }
  }
  LKS_UNROLL
  for (int t = 0; t < NX; t++) out[t] = hsum8_neon(acc[t][0], acc[t][1]) + tail[t];
}

static void fp8_neon(const uint8_t *w, const float *bs, int64_t blk, const float *const *x, int nx,
                     int64_t K, float *out) {
  int t = 0;
  for (; t + 2 <= nx; t += 2) fp8_neon_n(w, bs, blk, x + t, K, out + t, 2);
  if (t < nx) fp8_neon_n(w, bs, blk, x + t, K, out + t, 1);
}

// The 16 E2M1 values times 2, as signed bytes (a table lookup, TBL), for 16 codes from 8 bytes
// (low nibble first); widened to f32 and multiplied by half the group scale: 2v * (s / 2) is
// v * s exactly (2- and 4-bit mantissas), the values the other kernels multiply by.
static const int8_t e2m1_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

INLINE void fp4x16_neon(const uint8_t *p, int8x16_t lut, float32x4_t hs, f32x8 *a, f32x8 *b) {
  uint8x8_t by = vld1_u8(p);
  uint8x8_t lo = vand_u8(by, vdup_n_u8(15)), hi = vshr_n_u8(by, 4);
  uint8x16_t codes = vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
  int8x16_t v = vqtbl1q_s8(lut, codes);
  int16x8_t v0 = vmovl_s8(vget_low_s8(v)), v1 = vmovl_high_s8(v);
  a->lo = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(v0))), hs);
  a->hi = vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(v0)), hs);
  b->lo = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(v1))), hs);
  b->hi = vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(v1)), hs);
}

INLINE void nvfp4_neon_n(const uint8_t *w, const uint8_t *gs, const float *const *x, int64_t K,
                         float *out, const int NX) {
  int8x16_t lut = vld1q_s8(e2m1_x2);
  f32x8 acc[2][2];
  LKS_UNROLL
  for (int t = 0; t < NX; t++) acc[t][0] = acc[t][1] = zero8;
  for (int64_t g = 0; g < K / 16; g++) {
    f32x8 w0, w1;
    fp4x16_neon(w + g * 8, lut, vdupq_n_f32(e4m3_lut[gs[g]] * 0.5f), &w0, &w1);
    LKS_UNROLL
    for (int t = 0; t < NX; t++) {
      acc[t][0] = fma8(acc[t][0], w0, ld8(x[t] + g * 16));
      acc[t][1] = fma8(acc[t][1], w1, ld8(x[t] + g * 16 + 8));
    }
  }
  LKS_UNROLL
  for (int t = 0; t < NX; t++) out[t] = hsum8_neon(acc[t][0], acc[t][1]);
}

static void nvfp4_neon(const uint8_t *w, const uint8_t *gs, const float *const *x, int nx,
                       int64_t K, float *out) {
  int t = 0;
  for (; t + 2 <= nx; t += 2) nvfp4_neon_n(w, gs, x + t, K, out + t, 2);
  if (t < nx) nvfp4_neon_n(w, gs, x + t, K, out + t, 1);
}

static const lks__quant_kernels q_neon = {.name = "neon", .fp8 = fp8_neon, .nvfp4 = nvfp4_neon};
#endif

const lks__quant_kernels *lks__quant_kernels_get(const char *name) {
  pthread_once(&lut_once, lut_init);
  if (strcmp(name, "scalar") == 0) return &q_scalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows it.
  unsigned a, b, c, d;
  bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
  if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      f16c)
    return &q_avx2;
  // amx (cpu_kernels.c) differs in its BF16 products only: here it is avx512.
  if ((strcmp(name, "avx512") == 0 || (strcmp(name, "amx") == 0 && lks__amx_available())) &&
      __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && f16c)
    return &q_avx512;
#elif defined(__aarch64__)
  // Advanced SIMD with half-precision conversions (FCVTL) is part of every arm64 CPU.
  // neon_bf16 (cpu_kernels.c) differs in its BF16 products only: here it is neon.
  if ((strcmp(name, "neon") == 0 || (strcmp(name, "neon_bf16") == 0 &&
                                     (getauxval(AT_HWCAP2) & HWCAP2_BF16))) &&
      (getauxval(AT_HWCAP) & HWCAP_ASIMD))
    return &q_neon;
#endif
  return NULL;
}

const lks__quant_kernels *lks__quant_kernels_best(void) {
  const char *forced = getenv("LKS_SIMD");
  if (forced && *forced) {
    const lks__quant_kernels *k = lks__quant_kernels_get(forced);
    if (k) return k;
    LKS_LOG(LKS_LOG_WARN, "LKS_SIMD=%s: no such quantized kernels on this CPU; choosing the best",
            forced);
  }
  static const char *order[] = {"avx512", "avx2", "neon", "scalar"};
  for (int i = 0; i < 4; i++) {
    const lks__quant_kernels *k = lks__quant_kernels_get(order[i]);
    if (k) return k;
  }
  return &q_scalar;
}

_Static_assert((int)LKS__QGRID == (int)LKS__QROWS, "one output buffer serves grids and rows");

// Several activation rows (prefill, batches): the one-row kernel on each weight row and up to
// LKS__QROWS activation rows, weight rows in blocks of about 16 KB of codes, each block taken
// against every group of activation rows in turn. Every output is the kernel's arithmetic on
// its own row, so the order of the loops changes no bit; it keeps the block's codes and the
// group's activations in L1 where a row against all n activation rows streamed them from L2
// (air-1g prefill 512, 2 threads, three alternated rounds: FP8 blocks 207-218 -> 292-347
// tokens/s, NVFP4 169-180 -> 197-246).
static void quant_rows_blocked(const lks__quant_kernels *k, const lks__qweight *w, int64_t r0,
                               int64_t r1, const float *x, int64_t ldx, int64_t n,
                               float *out, int64_t ldo) {
  const int64_t K = w->cols;
  const int64_t blk = w->qs == LKS_Q_FP8_ROW ? K : LKS_Q_FP8_BLOCK_SIZE;
  const bool nv = w->qs == LKS_Q_NVFP4;
  const int64_t row_bytes = nv ? K / 2 : K;
  const int64_t rb = row_bytes >= 16384 ? 1 : 16384 / (row_bytes > 0 ? row_bytes : 1);
  // Where the level has grids, activation rows split once, not once per weight row inside the
  // kernel: all n rows for all blocks, up to 8 MB of them, else each group for each block
  // (split for each block, the split cost FP8 prefill 15 %); then LKS__QGRID / nx weight rows a
  // call. Without grids or the memory, the kernels on x.
  // AVX-512: groups of two activation rows against four weight rows a call where rows have 512
  // columns or more; eight by one below (the experts' down products of air-1g, K = 352). AVX2
  // (grids of at most 4 pairs): groups of four, one weight row a grid (one thread, 1024 x K
  // against 64 rows, groups of 8 / 4 / 2: FP8 K = 1024 20 / 24 / 22 G weights x rows a second,
  // K = 352 22 / 23 / 20; NVFP4 K = 1024, groups of 2 / 4: 21 / 24). AVX-512, one thread,
  // 1024 rows by K against 64 activation rows, G weights x rows a second, groups of 8 / 4 / 2:
  // FP8 blocks K = 1024 21 / 26 / 34, K = 4096 22 / 35 / 36, K = 512 26 / 29 / 30, K = 352 30 /
  // 28 / 27; NVFP4 K = 1024 23 / 31 / 34, K = 4096 22 / 35 / 37, K = 352 31 / 26 / 24. A group
  // of eight loads 16 vectors of x for each 32 columns and its 16 FMAs, two rows 4 (and convert
  // each weight step for two rows, not eight). The padding of split rows (against 4 KB
  // strides) and weight blocks of 4-16 KB changed nothing.
  const lks__qsplit_fn splitter = nv ? k->nvfp4_split : k->fp8_split;
  const int64_t sl = nv ? lks__nvfp4_split_len(K) : lks__fp8_split_len(K);
  const bool whole = n * sl <= ((int64_t)8 << 20) / (int64_t)sizeof(float);
  int64_t ls = 0;  // split rows' stride
  float *split = splitter ? split_alloc(whole ? n : LKS__QROWS, sl, &ls) : NULL;
  const bool grid = split != NULL;
  for (int64_t t = 0; grid && whole && t < n; t++) splitter(x + t * ldx, K, split + t * ls);
  const int64_t pf = row_bytes >= 8192 ? 1 : 8192 / (row_bytes > 0 ? row_bytes : 1);
  const int gx = grid && K >= 512 && k->group_rows ? k->group_rows : LKS__QROWS;
  for (int64_t b0 = r0; b0 < r1; b0 += rb) {
    int64_t b1 = b0 + rb < r1 ? b0 + rb : r1;
    for (int64_t t0 = 0; t0 < n; t0 += gx) {
      int nx = n - t0 < gx ? (int)(n - t0) : gx;
      const float *xs[LKS__QROWS];
      for (int i = 0; i < nx; i++) {
        xs[i] = x + (t0 + i) * ldx;
        if (grid && whole) {
          xs[i] = split + (t0 + i) * ls;
        } else if (split) {
          splitter(xs[i], K, split + i * ls);
          xs[i] = split + i * ls;
        }
      }
      const int64_t rw = grid ? LKS__QGRID / nx : 1;
      for (int64_t r = b0; r < b1; r += rw) {
        int nw = b1 - r < rw ? (int)(b1 - r) : (int)rw;
        float d[LKS__QROWS];  // LKS__QGRID pairs or LKS__QROWS rows (the same: asserted)
        if (grid) {
          const uint8_t *codes[LKS__QGRID], *ahead[LKS__QAHEAD], *fl[LKS__QGRID];
          const void *sc[LKS__QGRID];
          call_rows(w, r, nw, r1, pf, codes, sc, fl, ahead);
          const uint8_t *const *e0 = w->exp0 ? fl : NULL;
          if (nv) k->nvfp4_grid(codes, ahead, (const uint8_t *const *)sc, e0, xs, nw, nx, K, d);
          else k->fp8_grid(codes, ahead, (const float *const *)sc, e0, blk, xs, nw, nx, K, d);
        } else if (nv) {
          k->nvfp4(w->codes + r * w->ld, row_scales(w, r), xs, nx, K, d);
        } else {
          k->fp8(w->codes + r * w->ld, row_scales(w, r), blk, xs, nx, K, d);
        }
        for (int j = 0; nv && j < nw * nx; j++) d[j] *= w->global;
        for (int j = 0; j < nw; j++)  // + 0.0f: -0 as +0 (cpu_math.h)
          for (int i = 0; i < nx; i++) out[(t0 + i) * ldo + r + j] = d[j * nx + i] + 0.0f;
      }
    }
  }
  free(split);
}

// Decode's distance ahead, in rows, of the rows fetched as a row is read (and twice as far):
// about 8 KB, and at least `step`, the rows a call reads.
//
// One row's codes streamed at a time had too few loads in flight to keep memory busy: the row
// about 8 KB ahead is fetched as each row starts (air-1g decode on this 2-core host, medians:
// FP8 rows of 1 KB 0 -> 8 rows ahead 135-142 -> 155-162 tokens/s, NVFP4 rows of 512 B 0 -> 16
// rows ahead 124-138 -> 154-177). A hint: past the task's rows, the rows the caller says it
// reads next (lks__qweight.next: the next expert's rows, the thread's likely next task), else
// nothing: each product then starts with its first rows in flight, not cold (air-1g decode, 2
// threads, seven alternated rounds: FP8 blocks median 143.5 -> 157.6 tokens/s, 5 of 7 rounds
// faster; NVFP4 170.2 -> 174.3, within this host's noise). Where the grids fetch it
// themselves (AVX2, AVX-512), a line each 64 bytes they read, the burst of a row's lines at
// once is not issued: 134 M FP8 weights out of cache, one
// thread, six alternated runs of build/kernel_bench 131072 1024: 8.3-10.2 -> 6.4-7.8 ms
// (NVFP4 4.6-6.9 -> 4.7-6.0; air-1g FP8 decode at 2 threads, eight alternated rounds,
// medians 134 -> 141 tokens/s, within this host's noise).
// AVX-512: x split once for the call's rows, then LKS__QGRID weight rows a call (FP8,
// fp8_avx512_g: air-1g FP8 decode, 2 threads, three alternated rounds 121-146 -> 140-172
// tokens/s; 1 thread 77-88 -> 94-124. NVFP4, nvfp4_avx512_g against four rows a call of the
// kernel that scaled each weight: four alternated rounds 125-134 -> 148-180). Before the
// grids, four weight rows a call against one had been +10 % (FP8) and +19 % (NVFP4).
// Levels without grids (portable, NEON): one row at a time.
//
// At least a call's rows ahead: with rows over 2 KB (FP8 at K = 4096, GLM-4.5-Air's hidden
// size) 8 KB is fewer rows than a call reads, and the fetch fell on rows the call was reading
// already. Out of cache, one thread, FP8 blocks, two alternated runs: K = 4096 12.3-14.1 ->
// 20.9-23.1 G weights/s, K = 2736 14.8-15.4 -> 22.5-23.5 (NVFP4 at K = 4096, 2 KB rows, four
// rows ahead already: 23-26).
// And the rows twice as far ahead into L2 only (prefetcht1, ahead[LKS__QGRID + i]): on a
// host whose memory answered slowly (2026-12-06), 131072 NVFP4 rows of 1024 out of cache, one
// thread, 15 -> 22 G weights/s; air-1g decode, three alternated rounds, 2 threads: FP8 blocks
// 83-99 -> 131-163 tokens/s, NVFP4 125-138 -> 142-167; 1 thread, two rounds: FP8 50-53 ->
// 92-99, NVFP4 70-87 -> 81-103. Fetched into L1 instead, they gained nothing (FP8 2 threads
// 96-105 against 154-172).
static int64_t decode_ahead(const lks__qweight *w, int64_t step) {
  const int64_t row_bytes = w->qs == LKS_Q_NVFP4 ? w->cols / 2 : w->cols;
  int64_t pf = row_bytes >= 8192 ? 1 : 8192 / (row_bytes > 0 ? row_bytes : 1);
  return pf < step ? step : pf;
}

int64_t lks__quant_split_len(const lks__quant_kernels *k, lks_qscheme qs, int64_t K) {
  switch (qs) {
    case LKS_Q_NVFP4: return k->nvfp4_mv ? lks__nvfp4_split_len(K) : 0;
    case LKS_Q_FP8_ROW:
    case LKS_Q_FP8_BLOCK: return k->fp8_mv ? lks__fp8_split_len(K) : 0;
    default: return 0;
  }
}

void lks__quant_split(const lks__quant_kernels *k, lks_qscheme qs, const float *x, int64_t K,
                      float *xs) {
  (qs == LKS_Q_NVFP4 ? k->nvfp4_split : k->fp8_split)(x, K, xs);
}

void lks__quant_mv(const lks__quant_kernels *k, const lks__qweight *w, int64_t r0, int64_t r1,
                   const float *xs, float *out) {
  (w->qs == LKS_Q_NVFP4 ? k->nvfp4_mv : k->fp8_mv)(w, r0, r1, decode_ahead(w, LKS__QGRID), xs,
                                                    out + r0);
}

void lks__quant_matmul_rows(const lks__quant_kernels *k, const lks__qweight *w, int64_t r0,
                            int64_t r1, const float *x, int64_t ldx, int64_t n, float *out,
                            int64_t ldo) {
  const int64_t K = w->cols;
  const bool nv = w->qs == LKS_Q_NVFP4;
  if (!nv && w->qs != LKS_Q_FP8_ROW && w->qs != LKS_Q_FP8_BLOCK) {
    for (int64_t t = 0; t < n; t++)  // unreachable: lks_weight_check refused it
      for (int64_t r = r0; r < r1; r++) out[t * ldo + r] = 0;
    return;
  }
  if (n > 1) {
    quant_rows_blocked(k, w, r0, r1, x, ldx, n, out, ldo);
    return;
  }
  // Decode (one activation row) from here on: where the level has the format's grids, x split
  // once for the task's rows (on the stack up to GLM's widths, else on the heap: rows of over
  // 8 KB, the copy small beside them) and lks__quant_mv.
  const int64_t sl = lks__quant_split_len(k, w->qs, K);
  _Alignas(64) float stack_xs[16384 + 32];  // aligned as split_alloc's rows
  float *heap_xs = NULL;
  float *buf = sl <= 0 ? NULL
               : sl <= (int64_t)(sizeof stack_xs / sizeof *stack_xs)
                   ? stack_xs
                   : (heap_xs = aligned_alloc(64, (size_t)(sl + 15) / 16 * 64));
  if (buf) {
    lks__quant_split(k, w->qs, x, K, buf);
    lks__quant_mv(k, w, r0, r1, buf, out);
    free(heap_xs);
    return;
  }
  const int64_t pf = decode_ahead(w, 1), row_bytes = nv ? K / 2 : K;
  // Levels without grids, or without the memory for the split: one row at a time, the rows pf
  // and 2 pf ahead fetched as it starts.
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *own = w->codes + r * w->ld;
    const uint8_t *a1 = row_ahead(w, r1, r + pf, own), *a2 = row_ahead(w, r1, r + 2 * pf, own);
    for (int64_t c = 0; a1 != own && c < row_bytes; c += 64) {
      __builtin_prefetch(a1 + c, 0, 3);
      __builtin_prefetch(a2 + c, 0, 2);
    }
    quant_rows_blocked(k, w, r, r + 1, x, ldx, 1, out, ldo);
  }
}

void lks__quant_row_f32(const lks__qweight *w, int64_t r, float *dst) {
  pthread_once(&lut_once, lut_init);
  const int64_t K = w->cols, B = LKS_Q_FP8_BLOCK_SIZE;
  const uint8_t *codes = w->codes + r * w->ld;
  switch (w->qs) {
    case LKS_Q_FP8_ROW: {
      float s = *(const float *)row_scales(w, r);
      for (int64_t c = 0; c < K; c++) dst[c] = e4m3_lut[codes[c]] * s;
      break;
    }
    case LKS_Q_FP8_BLOCK: {
      const float *s = row_scales(w, r);
      for (int64_t c = 0; c < K; c++) dst[c] = e4m3_lut[codes[c]] * s[c / B];
      break;
    }
    case LKS_Q_NVFP4: {
      const uint8_t *gs = row_scales(w, r);
      for (int64_t c = 0; c < K; c++) {
        uint8_t code = c & 1 ? codes[c / 2] >> 4 : codes[c / 2] & 15;
        dst[c] = lks_e2m1_to_f32(code) * e4m3_lut[gs[c / 16]] * w->global;
      }
      break;
    }
    default:
      memset(dst, 0, (size_t)K * sizeof *dst);  // unreachable: the callers check the scheme
  }
}
