// SPDX-License-Identifier: MIT
// Dot-product kernels of the CPU backend (see cpu_kernels.h). Decode is bound by memory
// bandwidth, so the BF16 kernels widen weights to f32 in registers (a shift) and use f32 FMAs:
// the arithmetic is exactly that of the F32 path, with half the bytes read. One accumulator per
// output (a register on AVX-512, a pair on AVX2 and NEON) keeps the order fixed; decode reads one
// weight row at a time on AVX-512 and AVX2 (below), and the blocked kernels get their
// parallelism from several outputs at once (4 x 4 in batches on AVX-512, 3 x 2 on AVX2, 4 x 2 on
// NEON, and 8 weight rows for one activation row on NEON), reusing each loaded weight chunk for
// several activation rows.
#include "core/cpu_kernels.h"

#include <math.h>
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

static void mm_bf16_scalar(const void *w, int64_t ldw, int64_t m, const float *x, int64_t ldx,
                           int64_t n, int64_t K, float *out, int64_t ldo, void *scratch) {
  (void)scratch;
  for (int64_t r = 0; r < m; r++)
    for (int64_t t = 0; t < n; t++)
      out[t * ldo + r] = dot_bf16_scalar((const uint16_t *)w + r * ldw, x + t * ldx, K);
}

static void mm_f32_scalar(const void *w, int64_t ldw, int64_t m, const float *x, int64_t ldx,
                          int64_t n, int64_t K, float *out, int64_t ldo, void *scratch) {
  (void)scratch;
  for (int64_t r = 0; r < m; r++)
    for (int64_t t = 0; t < n; t++)
      out[t * ldo + r] = dot_f32_scalar((const float *)w + r * ldw, x + t * ldx, K);
}

static void pv_scalar(const float *w, int64_t ldw, int G, const float *v, int64_t ldv, int np,
                      int hd, float *o) {
  for (int p = 0; p < np; p++)
    for (int g = 0; g < G; g++) {
      float wg = w[g * ldw + p];
      const float *vp = v + p * ldv;
      float *og = o + (int64_t)g * hd;
      for (int d = 0; d < hd; d++) og[d] += wg * vp[d];
    }
}

static void pv_bf16_scalar(const float *w, int64_t ldw, int G, const uint16_t *v, int64_t ldv,
                           int np, int hd, float *o) {
  for (int p = 0; p < np; p++)
    for (int g = 0; g < G; g++) {
      float wg = w[g * ldw + p];
      const uint16_t *vp = v + p * ldv;
      float *og = o + (int64_t)g * hd;
      for (int d = 0; d < hd; d++) og[d] += wg * lks_bf16_to_f32(vp[d]);
    }
}

static const lks__cpu_kernels k_scalar = {.name = "scalar",
                                          .dot_bf16 = dot_bf16_scalar,
                                          .dot_f32 = dot_f32_scalar,
                                          .mm_bf16 = mm_bf16_scalar,
                                          .mm_f32 = mm_f32_scalar,
                                          .pv = pv_scalar,
                                          .pv_bf16 = pv_bf16_scalar};

// The weighted sum of values for NG query heads at once, chunk by chunk of the head dimension
// (LANES wide): the chunk's NG accumulators stay in registers over the block's positions, and
// each value chunk is loaded once for all of them. Defined per level with its vector type,
// load (masked: zeros past hd), fused multiply-add and store (masked).
#define DEFINE_PV(name, ATTR, VT, VEC, LANES, LOADV, LOAD, STORE, FMA, SET1)                  \
  INLINE ATTR void name##_blk(const float *w, int64_t ldw, const VT *v, int64_t ldv, int np,    \
                              int hd, float *o, int NG) {                                       \
    for (int d = 0; d < hd; d += LANES) {                                                       \
      int r = hd - d < LANES ? hd - d : LANES;                                                  \
      VEC acc[8];                                                                               \
      _Pragma("GCC unroll 8") for (int i = 0; i < NG; i++) acc[i] = LOAD(o + i * hd + d, r);    \
      for (int p = 0; p < np; p++) {                                                            \
        VEC vv = LOADV(v + p * ldv + d, r);                                                     \
        _Pragma("GCC unroll 8") for (int i = 0; i < NG; i++) acc[i] =                           \
            FMA(SET1(w[i * ldw + p]), vv, acc[i]);                                              \
      }                                                                                         \
      _Pragma("GCC unroll 8") for (int i = 0; i < NG; i++) STORE(o + i * hd + d, acc[i], r);    \
    }                                                                                           \
  }                                                                                             \
  ATTR static void name(const float *w, int64_t ldw, int G, const VT *v, int64_t ldv, int np,   \
                        int hd, float *o) {                                                     \
    int g = 0;                                                                                  \
    for (; g + 8 <= G; g += 8) name##_blk(w + g * ldw, ldw, v, ldv, np, hd, o + g * hd, 8);     \
    for (; g + 4 <= G; g += 4) name##_blk(w + g * ldw, ldw, v, ldv, np, hd, o + g * hd, 4);     \
    for (; g < G; g++) name##_blk(w + g * ldw, ldw, v, ldv, np, hd, o + g * hd, 1);             \
  }

// The blocking of an m x n product: with one activation row, blocks of 8 weight rows (8
// independent accumulators); otherwise blocks of RWB x RXB (RXB <= 4), activation rows outer so
// that their block stays in L1 while the task's weight rows stream from L2.
#define BLK_RX(blk, wp, xp, out, RW, nt, bf16, st)                \
  switch (nt) {                                                   \
    case 4:                                                       \
      blk(wp, ldw, xp, ldx, K, out, ldo, RW, 4, bf16, st, NULL);  \
      break;                                                      \
    case 3:                                                       \
      blk(wp, ldw, xp, ldx, K, out, ldo, RW, 3, bf16, st, NULL);  \
      break;                                                      \
    case 2:                                                       \
      blk(wp, ldw, xp, ldx, K, out, ldo, RW, 2, bf16, st, NULL);  \
      break;                                                      \
    default:                                                      \
      blk(wp, ldw, xp, ldx, K, out, ldo, RW, 1, bf16, st, NULL);  \
  }

// Where a product streams its weights from memory (one activation row; a few that one pass of
// register blocks covers: a verify's 2-4 rows, a small batch; and the first pass, its first RXB
// activation rows, of a product with more), each block fetches ahead the same 64-byte line of
// the next block's rows: STREAM_LINE says whether column k starts a line, STREAM_AHEAD is the
// line of row r (weights of 2 bytes with bf16, else 4). Until 2026-12-06 the first pass of
// more rows than RXB fetched nothing ahead, though it reads the weights from memory as decode
// does (the later passes find them in L2): a MoE prefill's experts have few rows each (air-1g,
// 64 tokens: 16 rows an expert on average). Fetched, air-1g BF16, two alternated rounds: prefill
// 64 230-237 -> 298-301 tokens/s at 1 thread, 383-409 -> 490-500 at 2; prefill 512 285 -> 297
// and 495-510 -> 490-527; batches of 16 150 -> 216-219 and 261-271 -> 358-360 (fetching on every
// pass instead: no better, batches of 4 slower). Until
// 2026-12-05 only one activation row did, and two rows read their weights at half its speed
// (build/kernel_bench 65536 1024, AVX-512, one thread, three alternated runs: BF16 n = 2
// 8.9-9.3 -> 4.7-5.7 ms, n = 1 3.9-5.4 ms; F32 n = 2 13.6-14.2 -> 9.7-12.9 ms): on the deep
// model (F32) a verify of 2 rows cost 1.57 plain steps, 1.44 after, and K = 1's roofline rose
// from x1.13 to x1.23, K = 3's from x1.28 to x1.48 (lockstep bench --spec mtp, world 1). For
// F32 with one row it fetches each line now too (no difference measured).
// With it, the same line two blocks ahead is fetched into L2 only (prefetcht1; PLDL2KEEP on
// arm64): on a host whose memory answered slowly (2026-12-06; without software prefetch the
// quantized kernels streamed at 60 % of their speed with it), air-1g BF16 decode, three
// alternated rounds, 2 threads 59-65 -> 72-85 tokens/s, 1 thread 30-34 -> 55-57 (three blocks
// ahead: 77-89 and 47-55; the quantized kernels' far rows fetched into L1 instead of L2 gained
// nothing). STREAM_FETCH issues both for rows [0, RW) of a block.
// Decode on AVX-512 (DEFINE_MM's FAR, STREAM_FAR) reads one weight row at a time instead, a single
// sequential stream, and fetches into L2 the line FAR bytes past each line it reads (a
// kernel call's last 16 KB fetch the rows after it, as the blocks' fetch did): each row's sum is
// the same arithmetic as in a block (one accumulator, the same order), only the order of the
// loads changes. On this AMD host (Zen 4, 2026-12-06) eight rows a block read memory at 0.73-0.76
// of a plain read's speed where one at a time reads at 0.92-0.93 (one thread, 131072 x 1024 BF16
// out of cache, 15 alternated runs: 17-19 -> 22-25 GB/s; 4 or 2 rows a block unrolled, 20 GB/s;
// no software fetch, 19-25; 8 KB ahead to 32 KB alike, 64 KB slower at one thread); air-1g BF16
// decode, three alternated rounds against ef79377: 1 thread 50-55 -> 60-66 tokens/s, 2 threads
// 77-88 -> 82-99. From cache (rows that fit in L2) one accumulator's FMA latency bounds it,
// 55 -> 40 GB/s, which decode never reads from. A one-row sum in one 8-lane register is bound by
// that latency at 4 bytes a cycle, below memory (air-1g decode, 1 thread, LKS_SIMD=avx2 on that
// host: 65 -> 46 tokens/s): NEON keeps blocks of eight; AVX2 sums in two registers (below).
// The backend's decode calls the stream through lks__mv_fn with the rows its thread reads next
// (the same weight's next task, up's rows after gate's, the next expert's), so a call's last
// 16 KB fetch those instead of whatever follows the rows in memory (often an expert no token
// chose), and the next call starts on lines in flight (stream_ahead). air-1g BF16 decode,
// 2026-12-06, decode steps alternately with and without it in one process (the median step of
// each; the same alternation with both sides equal gave 0.997-0.999): 2 threads x0.954 and
// x0.984 the step time, 1 thread x0.995 twice. (Alternating each product's calls instead, and
// timing the products alone, had said x0.89-0.94 for some: a call's fetches still in flight
// when it returns are not its time. Whole runs, alternated, vary too much here to see either.)
// PREFETCHT2 for the line ahead instead of PREFETCHT1 measured x0.986-0.989 at 1 thread and
// x0.998-1.0 at 2 the same way: not taken.
#define STREAM_FAR 16384
#define STREAM_LINE(k, bf16) ((((k) << ((bf16) ? 1 : 2)) & 63) == 0)
#define STREAM_AHEAD(w, ldw, r, k, bf16) \
  ((const char *)(w) + ((int64_t)(r) * (ldw) + (k)) * ((bf16) ? 2 : 4))
#define STREAM_FETCH(w, ldw, RW, k, bf16)                                                      \
  do {                                                                                         \
    _Pragma("GCC unroll 8") for (int i_ = 0; i_ < (RW); i_++)                                  \
        __builtin_prefetch(STREAM_AHEAD(w, ldw, i_ + (RW), k, bf16), 0, 3);                    \
    _Pragma("GCC unroll 8") for (int i_ = 0; i_ < (RW); i_++)                                  \
        __builtin_prefetch(STREAM_AHEAD(w, ldw, i_ + 2 * (RW), k, bf16), 0, 2);                \
  } while (0)

// Where the one-row stream fetches row r of a call's m rows (rb bytes apart at w) from: far bytes
// past the row. Past the call's rows that is `after` (after_rows more rows rb bytes apart: what
// the caller reads next, lks__mv_fn) when given, else the memory after the rows (a hint: no
// fault there); past after's rows, the row itself (already being read). A row whose fetch starts
// before the call's end and ends past it fetches past the end for the rest of the row (rows of
// 2 KB with far = 16 KB never do; the experts' down rows of 704 bytes, one row a call).
static inline const char *stream_ahead(const void *w, size_t rb, int64_t m, int64_t r, size_t far,
                                       const void *after, int64_t after_rows) {
  size_t off = (size_t)r * rb + far, end = (size_t)m * rb;
  if (!after || off < end) return (const char *)w + off;
  if (off - end < (size_t)after_rows * rb) return (const char *)after + (off - end);
  return (const char *)w + (size_t)r * rb;
}

// The one-row stream over m rows rb bytes apart (one activation row x; out[r]), each row
// fetching from stream_ahead: mm's n = 1 path where the level has FAR, and lks__mv_fn's.
#define STREAM_ROWS(blk, w, ldw, rb, m, x, K, out, bf16, far, after, after_rows)             \
  for (int64_t r_ = 0; r_ < (m); r_++)                                                         \
  blk((const char *)(w) + r_ * (rb), ldw, x, 0, K, (out) + r_, 1, 1, 1, bf16, false,           \
      stream_ahead(w, rb, m, r_, far, after, after_rows))

// FAR (bytes, not 0): decode reads rows one at a time, fetching FAR ahead (above); 0: blocks.
#define DEFINE_MM(level, blk, wtype, bf16, RWB, RXB, FAR)                                        \
  static void mm_##wtype##_##level(const void *w, int64_t ldw, int64_t m, const float *x,        \
                                   int64_t ldx, int64_t n, int64_t K, float *out, int64_t ldo,   \
                                   void *scratch) {                                              \
    (void)scratch;                                                                               \
    size_t es = bf16 ? 2 : 4;                                                                    \
    if (n == 1 && FAR) {                                                                         \
      STREAM_ROWS(blk, w, ldw, ldw * es, m, x, K, out, bf16, FAR, NULL, 0);                      \
      return;                                                                                    \
    }                                                                                            \
    if (n == 1) {                                                                                \
      int64_t r = 0;                                                                             \
      for (; r + 8 <= m; r += 8)                                                                 \
        blk((const char *)w + r * ldw * es, ldw, x, ldx, K, out + r, ldo, 8, 1, bf16, true,      \
            NULL);                                                                               \
      for (; r + 4 <= m; r += 4)                                                                 \
        blk((const char *)w + r * ldw * es, ldw, x, ldx, K, out + r, ldo, 4, 1, bf16, true,      \
            NULL);                                                                               \
      for (; r < m; r++)                                                                         \
        blk((const char *)w + r * ldw * es, ldw, x, ldx, K, out + r, ldo, 1, 1, bf16, true,      \
            NULL);                                                                               \
      return;                                                                                    \
    }                                                                                            \
    for (int64_t t = 0; t < n; t += RXB) {                                                       \
      int nt = n - t < RXB ? (int)(n - t) : RXB;                                                 \
      const float *xt = x + t * ldx;                                                             \
      int64_t r = 0;                                                                             \
      for (; r + RWB <= m; r += RWB) {                                                           \
        const char *wr = (const char *)w + r * ldw * es;                                         \
        BLK_RX(blk, wr, xt, out + t * ldo + r, RWB, nt, bf16, t == 0);                           \
      }                                                                                          \
      for (; r < m; r++) {                                                                       \
        const char *wr = (const char *)w + r * ldw * es;                                         \
        BLK_RX(blk, wr, xt, out + t * ldo + r, 1, nt, bf16, t == 0);                             \
      }                                                                                          \
    }                                                                                            \
  }

#if defined(__x86_64__)
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

// ---- AVX2: 16 lanes, as two 8-lane registers ----
//
// One output's accumulator is a pair of registers, lo (elements k..k+7 of each chunk of 16) and
// hi (k+8..k+15): lane j of the pair sums elements j, j+16, ..., in order, as AVX-512's one
// register does; then hsum256(lo + hi). The last chunk is zero-padded. The two chains of FMAs
// let decode read one weight row at a time (DEFINE_MM's FAR, as AVX-512 does). Until 2026-12-06
// AVX2 kept one register an output (lanes j, j+8, ...): one row's sum was then bound by the FMA's
// latency, so decode read blocks of eight rows, eight streams, fetching the next block's lines
// into L1 (8 rows of 4 KB fill it: K = 2048 BF16, K = 1024 F32). On an AVX2-only host (AMD EPYC,
// Zen 3; a plain read 11-15.6 GB/s at one thread), weights of 256 MB out of cache, medians of
// 3-11 alternated runs: eight-row blocks read at 0.46-0.75 of a plain read (K = 1024), 0.35-0.36
// (K = 4096), 0.47-0.62 (K = 352); one row with two registers and the fetch 16 KB ahead at
// 0.82-1.0, 0.86 and 0.77-0.83 (blocks of 2 or 4 rows, one register each, with that fetch:
// 0.56-0.76; four registers, or 8 to 64 KB ahead: the same). air-1g BF16 decode, three
// alternated rounds: 1 thread 28.4-31.3 -> 30.8-34.0 tokens/s, 2 threads 41.9-46.8 -> 54.9-56.7.
// Batches take blocks of 3 x 2 (12 accumulator registers, 2 activation, 1 weight): as fast as
// the 4 x 2 blocks of one register before (one thread, 1024 x 1024 by 512 rows 42.0 and 39.4
// GFLOP/s, 4096 x 1024 by 64 44.8 and 42.7, 352 x 1024 by 16 28.8 and 28.9), where 2 x 2 measured
// 8-24 % slower and 4 x 2 (16 accumulators: they spill) 5-11 %.

#define AVX2 __attribute__((target("avx2,fma")))

INLINE AVX2 float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Elements [k, k + 8) of a row (BF16 widened by a shift of 16: exact); the tail (r = K - k < 8
// elements, 0 for a last chunk's empty half) zero-padded.
INLINE AVX2 __m256 ld8_f32(const float *p) { return _mm256_loadu_ps(p); }
INLINE AVX2 __m256 ld8_bf16(const uint16_t *p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
INLINE AVX2 __m256 ld8_f32_tail(const float *p, int r) {
  float b[8] = {0};
  memcpy(b, p, (size_t)r * sizeof *b);
  return _mm256_loadu_ps(b);
}
INLINE AVX2 __m256 ld8_bf16_tail(const uint16_t *p, int r) {
  uint16_t b[8] = {0};
  memcpy(b, p, (size_t)r * sizeof *b);
  return ld8_bf16(b);
}
// A block of RW weight rows x RX activation rows; bf16 selects the weight type. ahead (not
// NULL): as each line of the row at w is read, the line at the same offset from ahead is fetched
// into L2 (stream_ahead), not STREAM_FETCH's lines.
INLINE AVX2 void blk_avx2(const void *w, int64_t ldw, const float *x, int64_t ldx, int64_t K,
                          float *out, int64_t ldo, int RW, int RX, int bf16, bool stream,
                          const char *ahead) {
  __m256 acc[2][8][4];  // [half][row][activation row]
  size_t es = bf16 ? 2 : 4;
#pragma GCC unroll 2
  for (int h = 0; h < 2; h++)
#pragma GCC unroll 8
    for (int i = 0; i < RW; i++)
#pragma GCC unroll 4
      for (int j = 0; j < RX; j++) acc[h][i][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if (ahead && STREAM_LINE(k, bf16))  // as in blk_avx512
      __builtin_prefetch(ahead + k * es, 0, 2);
    else if ((RX == 1 || stream) && STREAM_LINE(k, bf16))
      STREAM_FETCH(w, ldw, RW, k, bf16);
    // Both halves' accumulators stay in registers (2 RW RX: 12 at 3 x 2); a half at a time
    // loads its RX activation vectors and one weight vector beside them (15 of 16).
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      __m256 xv[4];
#pragma GCC unroll 4
      for (int j = 0; j < RX; j++) xv[j] = ld8_f32(x + j * ldx + k + 8 * h);
#pragma GCC unroll 8
      for (int i = 0; i < RW; i++) {
        const char *wp = (const char *)w + (i * ldw + k + 8 * h) * es;
        __m256 wv = bf16 ? ld8_bf16((const uint16_t *)wp) : ld8_f32((const float *)wp);
#pragma GCC unroll 4
        for (int j = 0; j < RX; j++) acc[h][i][j] = _mm256_fmadd_ps(wv, xv[j], acc[h][i][j]);
      }
    }
  }
  if (k < K) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      int r = (int)(K - k) - 8 * h;  // elements of this half, zero-padded (none: all zeros)
      r = r < 0 ? 0 : r > 8 ? 8 : r;
      __m256 xv[4];
#pragma GCC unroll 4
      for (int j = 0; j < RX; j++) xv[j] = ld8_f32_tail(x + j * ldx + k + 8 * h, r);
#pragma GCC unroll 8
      for (int i = 0; i < RW; i++) {
        const char *wp = (const char *)w + (i * ldw + k + 8 * h) * es;
        __m256 wv =
            bf16 ? ld8_bf16_tail((const uint16_t *)wp, r) : ld8_f32_tail((const float *)wp, r);
#pragma GCC unroll 4
        for (int j = 0; j < RX; j++) acc[h][i][j] = _mm256_fmadd_ps(wv, xv[j], acc[h][i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < RW; i++)
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++)
      out[j * ldo + i] = hsum256(_mm256_add_ps(acc[0][i][j], acc[1][i][j]));
}

AVX2 DEFINE_MM(avx2, blk_avx2, bf16, 1, 3, 2, STREAM_FAR)
AVX2 DEFINE_MM(avx2, blk_avx2, f32, 0, 3, 2, STREAM_FAR)

AVX2 static float dot_bf16_avx2(const uint16_t *w, const float *x, int64_t n) {
  float o;
  blk_avx2(w, 0, x, 0, n, &o, 0, 1, 1, 1, true, NULL);
  return o;
}
AVX2 static float dot_f32_avx2(const float *w, const float *x, int64_t n) {
  float o;
  blk_avx2(w, 0, x, 0, n, &o, 0, 1, 1, 0, true, NULL);
  return o;
}

// ---- AVX-512: 16 lanes ----

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

INLINE AVX512 __m512 ld16_bf16_bits(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

INLINE AVX512 void blk_avx512(const void *w, int64_t ldw, const float *x, int64_t ldx, int64_t K,
                              float *out, int64_t ldo, int RW, int RX, int bf16, bool stream,
                              const char *ahead) {
  __m512 acc[8][4];
#pragma GCC unroll 8
  for (int i = 0; i < RW; i++)
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 xv[4];
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++) xv[j] = _mm512_loadu_ps(x + j * ldx + k);
    // Decode streams the weights once: the same line of the next block's rows is fetched now
    // (once per 64-byte line), so a block starts on cached lines (at K = 1024 and two threads,
    // 17 -> 27 GB/s in a test of the bare loop). A hint: no fault past the end.
    if (ahead && STREAM_LINE(k, bf16))
      __builtin_prefetch(ahead + k * (bf16 ? 2 : 4), 0, 2);
    else if ((RX == 1 || stream) && STREAM_LINE(k, bf16))
      STREAM_FETCH(w, ldw, RW, k, bf16);
#pragma GCC unroll 8
    for (int i = 0; i < RW; i++) {
      __m512 wv = bf16 ? ld16_bf16_bits(_mm256_loadu_si256(
                             (const __m256i *)((const uint16_t *)w + i * ldw + k)))
                       : _mm512_loadu_ps((const float *)w + i * ldw + k);
#pragma GCC unroll 4
      for (int j = 0; j < RX; j++) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  if (k < K) {  // masked loads: zeros past the end, and nothing read there
    __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
    __m512 xv[4];
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++) xv[j] = _mm512_maskz_loadu_ps(mk, x + j * ldx + k);
#pragma GCC unroll 8
    for (int i = 0; i < RW; i++) {
      __m512 wv =
          bf16 ? ld16_bf16_bits(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)w + i * ldw + k))
               : _mm512_maskz_loadu_ps(mk, (const float *)w + i * ldw + k);
#pragma GCC unroll 4
      for (int j = 0; j < RX; j++) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < RW; i++)
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++) out[j * ldo + i] = _mm512_reduce_add_ps(acc[i][j]);
}

AVX512 DEFINE_MM(avx512, blk_avx512, bf16, 1, 4, 4, STREAM_FAR) AVX512
    DEFINE_MM(avx512, blk_avx512, f32, 0, 4, 4, STREAM_FAR)

// Decode's one-row stream with the caller's next rows (lks__mv_fn): mm's n = 1 path otherwise.
#define DEFINE_MV(level, blk, wtype, bf16, FAR)                                                  \
  static void mv_##wtype##_##level(const void *w, int64_t ldw, int64_t m, const float *x,        \
                                   int64_t K, float *out, const void *after,                     \
                                   int64_t after_rows) {                                         \
    STREAM_ROWS(blk, w, ldw, (size_t)ldw * (bf16 ? 2 : 4), m, x, K, out, bf16, FAR, after,       \
                after_rows);                                                                     \
  }
AVX512 DEFINE_MV(avx512, blk_avx512, bf16, 1, STREAM_FAR)
AVX512 DEFINE_MV(avx512, blk_avx512, f32, 0, STREAM_FAR)
AVX2 DEFINE_MV(avx2, blk_avx2, bf16, 1, STREAM_FAR)
AVX2 DEFINE_MV(avx2, blk_avx2, f32, 0, STREAM_FAR)

        AVX512 static float dot_bf16_avx512(const uint16_t *w, const float *x, int64_t n) {
  float o;
  blk_avx512(w, 0, x, 0, n, &o, 0, 1, 1, 1, true, NULL);
  return o;
}
AVX512 static float dot_f32_avx512(const float *w, const float *x, int64_t n) {
  float o;
  blk_avx512(w, 0, x, 0, n, &o, 0, 1, 1, 0, true, NULL);
  return o;
}

INLINE AVX2 __m256 pv_ld8(const float *p, int r) {
  return r == 8 ? ld8_f32(p) : ld8_f32_tail(p, r);
}
INLINE AVX2 void pv_st8(float *p, __m256 v, int r) {
  if (r == 8) {
    _mm256_storeu_ps(p, v);
  } else {
    float b[8];
    _mm256_storeu_ps(b, v);
    memcpy(p, b, (size_t)r * sizeof *b);
  }
}
INLINE AVX2 __m256 pv_ld8_bf16(const uint16_t *p, int r) {
  return r == 8 ? ld8_bf16(p) : ld8_bf16_tail(p, r);
}
DEFINE_PV(pv_avx2, AVX2, float, __m256, 8, pv_ld8, pv_ld8, pv_st8, _mm256_fmadd_ps, _mm256_set1_ps)
DEFINE_PV(pv_bf16_avx2, AVX2, uint16_t, __m256, 8, pv_ld8_bf16, pv_ld8, pv_st8, _mm256_fmadd_ps,
          _mm256_set1_ps)

INLINE AVX512 __m512 pv_ld16(const float *p, int r) {
  return _mm512_maskz_loadu_ps((__mmask16)((1u << r) - 1), p);
}
INLINE AVX512 void pv_st16(float *p, __m512 v, int r) {
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << r) - 1), v);
}
INLINE AVX512 __m512 pv_ld16_bf16(const uint16_t *p, int r) {
  return ld16_bf16_bits(_mm256_maskz_loadu_epi16((__mmask16)((1u << r) - 1), p));
}
DEFINE_PV(pv_avx512, AVX512, float, __m512, 16, pv_ld16, pv_ld16, pv_st16, _mm512_fmadd_ps,
          _mm512_set1_ps)
DEFINE_PV(pv_bf16_avx512, AVX512, uint16_t, __m512, 16, pv_ld16_bf16, pv_ld16, pv_st16,
          _mm512_fmadd_ps, _mm512_set1_ps)

static const lks__cpu_kernels k_avx2 = {.name = "avx2",
                                        .dot_bf16 = dot_bf16_avx2,
                                        .dot_f32 = dot_f32_avx2,
                                        .mm_bf16 = mm_bf16_avx2,
                                        .mm_f32 = mm_f32_avx2,
                                        .mv_bf16 = mv_bf16_avx2,
                                        .mv_f32 = mv_f32_avx2,
                                        .pv = pv_avx2,
                                        .pv_bf16 = pv_bf16_avx2};
static const lks__cpu_kernels k_avx512 = {.name = "avx512",
                                          .dot_bf16 = dot_bf16_avx512,
                                          .dot_f32 = dot_f32_avx512,
                                          .mm_bf16 = mm_bf16_avx512,
                                          .mm_f32 = mm_f32_avx512,
                                          .mv_bf16 = mv_bf16_avx512,
                                          .mv_f32 = mv_f32_avx512,
                                          .pv = pv_avx512,
                                          .pv_bf16 = pv_bf16_avx512};

// AVX-512 with the BF16 weight products on AMX tiles (cpu_amx.c). Its dot_bf16 is the product of
// one row and one column (the tests' check of mm_bf16; the backend calls mm_bf16 only).
static float dot_bf16_amx(const uint16_t *w, const float *x, int64_t n) {
  void *s = malloc(lks__amx_scratch_bytes(n));
  if (!s) return NAN;
  float o;
  lks__mm_bf16_amx(w, 0, 1, x, 0, 1, n, &o, 1, s);
  free(s);
  return o;
}

static const lks__cpu_kernels k_amx = {.name = "amx",
                                       .dot_bf16 = dot_bf16_amx,
                                       .dot_f32 = dot_f32_avx512,
                                       .mm_bf16 = lks__mm_bf16_amx,
                                       .mm_f32 = mm_f32_avx512,
                                       .mv_f32 = mv_f32_avx512,
                                       .mm_scratch = lks__amx_scratch_bytes,
                                       .mm_bf16_kv = mm_bf16_avx512,
                                       .pv = pv_avx512,
                                       .pv_bf16 = pv_bf16_avx512};
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>

#define INLINE static inline __attribute__((always_inline))

// ---- NEON: 8 lanes, as two 4-lane registers ----
//
// One output's accumulator is a pair of registers, lo (elements k..k+3 of each chunk of 8) and
// hi (k+4..k+7): the eight lanes of the portable kernels, lane j summing elements j, j+8, ...
// The horizontal sum vaddvq_f32(lo + hi) is pairwise (faddp), so it adds the lanes in the
// portable order, ((a0+a4) + (a1+a5)) + ((a2+a6) + (a3+a7)). The last chunk is zero-padded. With
// 32 vector registers, one activation row takes 8 weight rows (16 accumulators) and batches take
// blocks of 4 x 2 (16 accumulators, 4 activation registers, 2 weight registers).

typedef struct {
  float32x4_t lo, hi;
} f32x8;

INLINE f32x8 ld8_f32_neon(const float *p) { return (f32x8){vld1q_f32(p), vld1q_f32(p + 4)}; }
// BF16 widens to f32 by a shift of 16 (vshll): exact.
INLINE f32x8 ld8_bf16_neon(const uint16_t *p) {
  uint16x8_t v = vld1q_u16(p);
  return (f32x8){vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)),
                 vreinterpretq_f32_u32(vshll_high_n_u16(v, 16))};
}
INLINE f32x8 ld8_f32_tail_neon(const float *p, int r) {
  float b[8] = {0};
  memcpy(b, p, (size_t)r * sizeof *b);
  return ld8_f32_neon(b);
}
INLINE f32x8 ld8_bf16_tail_neon(const uint16_t *p, int r) {
  uint16_t b[8] = {0};
  memcpy(b, p, (size_t)r * sizeof *b);
  return ld8_bf16_neon(b);
}
INLINE f32x8 fma8_neon(f32x8 acc, f32x8 a, f32x8 b) {
  return (f32x8){vfmaq_f32(acc.lo, a.lo, b.lo), vfmaq_f32(acc.hi, a.hi, b.hi)};
}

// A block of RW weight rows x RX activation rows; bf16 selects the weight type; ahead as in
// blk_avx2.
INLINE void blk_neon(const void *w, int64_t ldw, const float *x, int64_t ldx, int64_t K,
                     float *out, int64_t ldo, int RW, int RX, int bf16, bool stream,
                     const char *ahead) {
  f32x8 acc[8][4];
#pragma GCC unroll 8
  for (int i = 0; i < RW; i++)
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++) acc[i][j] = (f32x8){vdupq_n_f32(0), vdupq_n_f32(0)};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    f32x8 xv[4];
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++) xv[j] = ld8_f32_neon(x + j * ldx + k);
    if (ahead && STREAM_LINE(k, bf16))  // as in blk_avx512
      __builtin_prefetch(ahead + k * (bf16 ? 2 : 4), 0, 2);
    else if ((RX == 1 || stream) && STREAM_LINE(k, bf16))
      STREAM_FETCH(w, ldw, RW, k, bf16);
#pragma GCC unroll 8
    for (int i = 0; i < RW; i++) {
      f32x8 wv = bf16 ? ld8_bf16_neon((const uint16_t *)w + i * ldw + k)
                      : ld8_f32_neon((const float *)w + i * ldw + k);
#pragma GCC unroll 4
      for (int j = 0; j < RX; j++) acc[i][j] = fma8_neon(acc[i][j], wv, xv[j]);
    }
  }
  if (k < K) {
    int r = (int)(K - k);
    f32x8 xv[4];
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++) xv[j] = ld8_f32_tail_neon(x + j * ldx + k, r);
#pragma GCC unroll 8
    for (int i = 0; i < RW; i++) {
      f32x8 wv = bf16 ? ld8_bf16_tail_neon((const uint16_t *)w + i * ldw + k, r)
                      : ld8_f32_tail_neon((const float *)w + i * ldw + k, r);
#pragma GCC unroll 4
      for (int j = 0; j < RX; j++) acc[i][j] = fma8_neon(acc[i][j], wv, xv[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < RW; i++)
#pragma GCC unroll 4
    for (int j = 0; j < RX; j++)
      out[j * ldo + i] = vaddvq_f32(vaddq_f32(acc[i][j].lo, acc[i][j].hi));
}

DEFINE_MM(neon, blk_neon, bf16, 1, 4, 2, 0)
DEFINE_MM(neon, blk_neon, f32, 0, 4, 2, 0)

static float dot_bf16_neon(const uint16_t *w, const float *x, int64_t n) {
  float o;
  blk_neon(w, 0, x, 0, n, &o, 0, 1, 1, 1, true, NULL);
  return o;
}
static float dot_f32_neon(const float *w, const float *x, int64_t n) {
  float o;
  blk_neon(w, 0, x, 0, n, &o, 0, 1, 1, 0, true, NULL);
  return o;
}

INLINE float32x4_t pv_ld4(const float *p, int r) {
  if (r == 4) return vld1q_f32(p);
  float b[4] = {0};
  memcpy(b, p, (size_t)r * sizeof *b);
  return vld1q_f32(b);
}
INLINE void pv_st4(float *p, float32x4_t v, int r) {
  if (r == 4) {
    vst1q_f32(p, v);
  } else {
    float b[4];
    vst1q_f32(b, v);
    memcpy(p, b, (size_t)r * sizeof *b);
  }
}
INLINE float32x4_t pv_fma4(float32x4_t a, float32x4_t b, float32x4_t acc) {
  return vfmaq_f32(acc, a, b);
}
#define NEON_ATTR
INLINE float32x4_t pv_ld4_bf16(const uint16_t *p, int r) {
  uint16_t b[4] = {0};
  memcpy(b, p, (size_t)r * sizeof *b);
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(b), 16));
}
DEFINE_PV(pv_neon, NEON_ATTR, float, float32x4_t, 4, pv_ld4, pv_ld4, pv_st4, pv_fma4, vdupq_n_f32)
DEFINE_PV(pv_bf16_neon, NEON_ATTR, uint16_t, float32x4_t, 4, pv_ld4_bf16, pv_ld4, pv_st4, pv_fma4,
          vdupq_n_f32)

static const lks__cpu_kernels k_neon = {.name = "neon",
                                        .dot_bf16 = dot_bf16_neon,
                                        .dot_f32 = dot_f32_neon,
                                        .mm_bf16 = mm_bf16_neon,
                                        .mm_f32 = mm_f32_neon,
                                        .pv = pv_neon,
                                        .pv_bf16 = pv_bf16_neon};

// ---- NEON with the BF16 extension (BFMMLA): only when asked for, LKS_SIMD=neon_bf16 ----
// Built by gcc only: its arm_neon.h declares the BF16 intrinsics for a function that targets
// armv8.2-a+bf16, while clang 14 declares them only when the whole file is built for BF16 (and
// its assembler takes BF16 instructions in inline assembly under no directive), and the rest of
// this file must run on any arm64 CPU. A clang build has no neon_bf16 level.
//
// BFMMLA multiplies a 2x4 BF16 block by a 4x2 one into a 2x2 f32 block: two weight rows by two
// activation rows, four columns a step. Both operands must be BF16, so the activations are
// rounded to BF16 (BFCVTN, to nearest) as they are loaded: 8 bits of mantissa instead of 24,
// a relative error of up to 2^-9 per product. The model tests bound each row of logits by 4 times
// its float32 error; this level measured 9,000-13,400 times (bf16_noqk_nobias_3shards, greedy
// output different at 6 of 33 tokens), so it is never chosen by itself; it is
// here for measurements on CPUs with FEAT_BF16 (HWCAP2_BF16), and it keeps the guarantees of the
// others: one accumulator per output element, whose arithmetic does not depend on the rows it
// shares an instruction with (a missing row is a copy of row 0, whose results are dropped), so
// a row's result does not depend on its batch, and mm_bf16 equals dot_bf16 bit for bit. The F32
// products are NEON's.
#if !defined(__clang__)
#define LKS_HAVE_NEON_BF16 1
#define NEON_BF16 __attribute__((target("arch=armv8.2-a+bf16")))

// Columns [k, k + 4) of weight rows w0, w1 and activation rows x0, x1 (r < 4: zero-padded).
INLINE NEON_BF16 float32x4_t mmla4(float32x4_t acc, const uint16_t *w0, const uint16_t *w1,
                                   const float *x0, const float *x1, int r) {
  uint16_t wb[8] = {0};
  float xb[8] = {0};
  if (r == 4) {
    memcpy(wb, w0, 8);
    memcpy(wb + 4, w1, 8);
    memcpy(xb, x0, 16);
    memcpy(xb + 4, x1, 16);
  } else {
    memcpy(wb, w0, (size_t)r * 2);
    memcpy(wb + 4, w1, (size_t)r * 2);
    memcpy(xb, x0, (size_t)r * 4);
    memcpy(xb + 4, x1, (size_t)r * 4);
  }
  bfloat16x8_t a = vreinterpretq_bf16_u16(vld1q_u16(wb));
  bfloat16x8_t b = vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(vld1q_f32(xb)), vld1q_f32(xb + 4));
  return vbfmmlaq_f32(acc, a, b);
}

// The 2x2 block of rows w0, w1 by x0, x1: out = {w0.x0, w0.x1, w1.x0, w1.x1}.
NEON_BF16 static void blk_bf16mm(const uint16_t *w0, const uint16_t *w1, const float *x0,
                                 const float *x1, int64_t K, float out[4]) {
  float32x4_t acc = vdupq_n_f32(0);
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) acc = mmla4(acc, w0 + k, w1 + k, x0 + k, x1 + k, 4);
  if (k < K) acc = mmla4(acc, w0 + k, w1 + k, x0 + k, x1 + k, (int)(K - k));
  vst1q_f32(out, acc);
}

static void mm_bf16_neon_bf16(const void *w, int64_t ldw, int64_t m, const float *x, int64_t ldx,
                              int64_t n, int64_t K, float *out, int64_t ldo, void *scratch) {
  (void)scratch;
  const uint16_t *wb = w;
  for (int64_t r = 0; r < m; r += 2) {
    const uint16_t *w0 = wb + r * ldw, *w1 = r + 1 < m ? w0 + ldw : w0;
    for (int64_t t = 0; t < n; t += 2) {
      const float *x0 = x + t * ldx, *x1 = t + 1 < n ? x0 + ldx : x0;
      float o[4];
      blk_bf16mm(w0, w1, x0, x1, K, o);
      out[t * ldo + r] = o[0];
      if (t + 1 < n) out[(t + 1) * ldo + r] = o[1];
      if (r + 1 < m) out[t * ldo + r + 1] = o[2];
      if (r + 1 < m && t + 1 < n) out[(t + 1) * ldo + r + 1] = o[3];
    }
  }
}

static float dot_bf16_neon_bf16(const uint16_t *w, const float *x, int64_t n) {
  float o[4];
  blk_bf16mm(w, w, x, x, n, o);
  return o[0];
}

static const lks__cpu_kernels k_neon_bf16 = {.name = "neon_bf16",
                                             .dot_bf16 = dot_bf16_neon_bf16,
                                             .dot_f32 = dot_f32_neon,
                                             .mm_bf16 = mm_bf16_neon_bf16,
                                             .mm_f32 = mm_f32_neon,
                                             .pv = pv_neon,
                                             .pv_bf16 = pv_bf16_neon,
                                             .bf16_activations = 1};
#endif  // !__clang__
#endif

const lks__cpu_kernels *lks__cpu_kernels_get(const char *name) {
  if (strcmp(name, "scalar") == 0) return &k_scalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return &k_avx2;
  if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return &k_avx512;
  if (strcmp(name, "amx") == 0 && lks__amx_available()) return &k_amx;
#elif defined(__aarch64__)
  // Advanced SIMD is part of every arm64 Linux CPU; asked of the kernel all the same.
  if (strcmp(name, "neon") == 0 && (getauxval(AT_HWCAP) & HWCAP_ASIMD)) return &k_neon;
#if defined(LKS_HAVE_NEON_BF16)
  if (strcmp(name, "neon_bf16") == 0 && (getauxval(AT_HWCAP) & HWCAP_ASIMD) &&
      (getauxval(AT_HWCAP2) & HWCAP2_BF16))
    return &k_neon_bf16;
#endif
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
  static const char *order[] = {"avx512", "avx2", "neon", "scalar"};
  for (int i = 0; i < 4; i++) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(order[i]);
    if (k) return k;
  }
  return &k_scalar;
}
