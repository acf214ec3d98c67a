// SPDX-License-Identifier: MIT
// The BF16 matrix product on Intel AMX tiles (cpu_kernels.h's "amx" level), with the f32
// activations kept exact: each activation is split into three BF16 pieces, hi + mid + lo, whose sum
// is the f32 value bit for bit (8 significant bits each, 24 in all), and the tiles multiply the
// BF16 weights by all three (each product of two BF16 values is exact in f32).
//
// Shapes: tile A is 16 weight rows x 32 K elements, loaded straight from the row-major weights;
// tile B is 16 columns x 32 K elements in AMX's pair-interleaved ("VNNI") layout, prepared per call
// from the activations: five activation rows a tile, three columns (its pieces) each, the 16th
// column zero. C = A x B is 16 x 16 f32 accumulators; an output is (hi + mid) + lo of its row's
// three columns. Each C element accumulates its own A row and B column over K in one order that
// depends only on K, so a row's result does not depend on its batch, the block it falls in or the
// rows beside it (batch invariance), and mm equals its one-row, one-column case bit for bit. K is
// zero-padded to a multiple of 32 in copies, never read past its end.
//
// The operating system must grant the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, once per
// process); each call loads its tile configuration (tile registers are per thread).
#include "core/cpu_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))
#define INLINE static inline __attribute__((always_inline))

enum {
  GROUP_ROWS = 5,     // activation rows a B tile holds (three pieces each: 15 of 16 columns)
  PANEL_GROUPS = 4,   // B tiles prepared at a time: 20 activation rows
  CHUNK = 32,         // K elements a tile step
  TILE_BYTES = 1024,  // 16 rows x 64 bytes
  PREFETCH_STEPS = 4,
};

// The tile configuration (palette 1): tiles 0-3 the C accumulators, 4-5 A, 6-7 B; all 16 rows of 64
// bytes.
typedef struct __attribute__((packed, aligned(64))) {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

static const tile_config k_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

// CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE; then the kernel's permission for the tile
// data (XFEATURE 18), which also tells that the OS saves it.
static void amx_probe(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  if (!(d & (1u << 22)) || !(d & (1u << 24))) return;
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl"))
    return;
  amx_ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

bool lks__amx_available(void) {
  __builtin_cpu_init();
  pthread_once(&amx_once, amx_probe);
  return amx_ok;
}

size_t lks__amx_scratch_bytes(int64_t K) {
  size_t chunks = (size_t)((K + CHUNK - 1) / CHUNK);
  // the B panel, a padded copy of up to 16 weight rows, two tail tiles, one C tile, alignment
  return PANEL_GROUPS * chunks * TILE_BYTES + 16 * chunks * 64 + 3 * TILE_BYTES + 64;
}

// The 16 x 16 transpose of 32-bit elements: v[i] (column i of B, its 16 K pairs) -> t[p] (K pair p,
// its 16 columns): interleaves of 32 and 64 bits within 128-bit lanes, then lanes.
INLINE AMX void transpose16(const __m512i v[16], __m512i t[16]) {
  __m512i a[16], b[16];
  for (int k = 0; k < 8; k++) {
    a[2 * k] = _mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]);
  }
  for (int k = 0; k < 4; k++) {
    b[4 * k + 0] = _mm512_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 1] = _mm512_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 2] = _mm512_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
    b[4 * k + 3] = _mm512_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
  }
  // b[4k + q], lane l: column 4l + q of rows 4k..4k+3
  for (int q = 0; q < 4; q++) {
    __m512i c0 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0x44);
    __m512i c1 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0xee);
    __m512i c2 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0x44);
    __m512i c3 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0xee);
    t[q] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    t[4 + q] = _mm512_shuffle_i32x4(c0, c2, 0xdd);
    t[8 + q] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    t[12 + q] = _mm512_shuffle_i32x4(c1, c3, 0xdd);
  }
}

// One B tile per 32 K elements for nr <= 5 activation rows: column 3r + j holds piece j of row r, K
// elements 2p and 2p + 1 in row p's 32-bit word (low half the even one). The split truncates: hi =
// x with its low 16 bits cleared, mid the same of x - hi, lo = x - hi - mid (at most 8 significant
// bits left, so exact in BF16); each difference is exact in f32.
AMX static void prep_group(const float *x, int64_t ldx, int nr, int64_t K, uint16_t *B) {
  const __m512i odd =
      _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                       25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
  int64_t chunks = (K + CHUNK - 1) / CHUNK;
  for (int64_t c = 0; c < chunks; c++) {
    int64_t k = c * CHUNK;
    __m512i v[16], t[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_setzero_si512();
    for (int r = 0; r < nr; r++) {
      const float *xr = x + r * ldx + k;
      __m512i lo16, hi16;
      if (K - k >= CHUNK) {
        lo16 = _mm512_castps_si512(_mm512_loadu_ps(xr));
        hi16 = _mm512_castps_si512(_mm512_loadu_ps(xr + 16));
      } else {
        int64_t rest = K - k;
        __mmask16 m0 = rest >= 16 ? 0xffff : (__mmask16)((1u << rest) - 1);
        __mmask16 m1 = rest <= 16 ? 0 : (__mmask16)((1u << (rest - 16)) - 1);
        lo16 = _mm512_castps_si512(_mm512_maskz_loadu_ps(m0, xr));
        hi16 = _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, xr + 16));
      }
      for (int j = 0; j < 3; j++) {
        // piece j: the top halves of all 32 values, pairs in order
        v[3 * r + j] = _mm512_permutex2var_epi16(lo16, odd, hi16);
        if (j == 2) break;
        __m512 l = _mm512_castsi512_ps(lo16), h = _mm512_castsi512_ps(hi16);
        lo16 =
            _mm512_castps_si512(_mm512_sub_ps(l, _mm512_castsi512_ps(_mm512_and_si512(lo16, top))));
        hi16 =
            _mm512_castps_si512(_mm512_sub_ps(h, _mm512_castsi512_ps(_mm512_and_si512(hi16, top))));
      }
    }
    transpose16(v, t);
    for (int p = 0; p < 16; p++) _mm512_store_si512((__m512i *)(B + c * 512 + p * 32), t[p]);
  }
}

// Copies of the last (K mod 32) elements of 16 rows, zero-padded to 32: the last tile step never
// reads past K.
static void tail_copy(const uint16_t *w, int64_t ldw, int64_t k, int64_t K, uint16_t *dst) {
  memset(dst, 0, TILE_BYTES);
  for (int i = 0; i < 16; i++) memcpy(dst + i * CHUNK, w + i * ldw + k, (size_t)(K - k) * 2);
}

// C tiles for RA (1 or 2) blocks of 16 weight rows x RB (1 or 2) B tiles over the K steps: full
// steps from the weights, the tail step from the copies ta[] (NULL: no tail).
INLINE AMX void tiles(const uint16_t *w, int64_t ldw, int RA, const uint16_t *b0,
                      const uint16_t *b1, int RB, int64_t full, const uint16_t *ta0,
                      const uint16_t *ta1) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const uint16_t *w1 = w + 16 * ldw;
  for (int64_t c = 0; c < full; c++) {
    // Where few activation rows share them the weights stream from memory, 16 strided rows a load:
    // each row's line PREFETCH_STEPS steps ahead is asked for now (4: 5.5 against 6.3 ms without,
    // kernel_bench 8192 4096, one row; 2, 8 and 16 no better). A hint: no fault past the end.
    for (int i = 0; i < 16 * RA; i++)
      _mm_prefetch((const char *)(w + i * ldw + (c + PREFETCH_STEPS) * CHUNK), _MM_HINT_T0);
    _tile_loadd(4, w + c * CHUNK, ldw * 2);
    _tile_loadd(6, b0 + c * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (RA > 1) {
      _tile_loadd(5, w1 + c * CHUNK, ldw * 2);
      _tile_dpbf16ps(1, 5, 6);
    }
    if (RB > 1) {
      _tile_loadd(7, b1 + c * 512, 64);
      _tile_dpbf16ps(2, 4, 7);
      if (RA > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  if (ta0) {
    _tile_loadd(4, ta0, 64);
    _tile_loadd(6, b0 + full * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (RA > 1) {
      _tile_loadd(5, ta1, 64);
      _tile_dpbf16ps(1, 5, 6);
    }
    if (RB > 1) {
      _tile_loadd(7, b1 + full * 512, 64);
      _tile_dpbf16ps(2, 4, 7);
      if (RA > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// out[t * ldo + i] for the nr activation rows of a B tile: (hi + mid) + lo.
static void emit(const float c[16][16], int rows, int nr, float *out, int64_t ldo) {
  for (int t = 0; t < nr; t++)
    for (int i = 0; i < rows; i++)
      out[t * ldo + i] = (c[i][3 * t] + c[i][3 * t + 1]) + c[i][3 * t + 2];
}

// Weight rows [r, r + 16 RA) against the B tiles of a panel's groups g .. g + RB - 1 (RA and RB
// 1 or 2: tiles() gets them as constants).
INLINE AMX void block(const uint16_t *w, int64_t ldw, int RA, const uint16_t *B, int64_t bstride,
                      int g, int RB, const int *nr, int64_t full, const uint16_t *ta,
                      float (*cbuf)[16], float *out, int64_t ldo) {
  const uint16_t *b0 = B + g * bstride, *b1 = b0 + bstride;
  const uint16_t *ta0 = ta, *ta1 = ta ? ta + 512 : NULL;
  if (RA == 2 && RB == 2)
    tiles(w, ldw, 2, b0, b1, 2, full, ta0, ta1);
  else if (RA == 2)
    tiles(w, ldw, 2, b0, b1, 1, full, ta0, ta1);
  else if (RB == 2)
    tiles(w, ldw, 1, b0, b1, 2, full, ta0, ta1);
  else
    tiles(w, ldw, 1, b0, b1, 1, full, ta0, ta1);
  float *o = out + (int64_t)g * GROUP_ROWS * ldo;
  _tile_stored(0, cbuf, 64);
  emit((const float(*)[16])cbuf, 16, nr[g], o, ldo);
  if (RA > 1) {
    _tile_stored(1, cbuf, 64);
    emit((const float(*)[16])cbuf, 16, nr[g], o + 16, ldo);
  }
  if (RB > 1) {
    _tile_stored(2, cbuf, 64);
    emit((const float(*)[16])cbuf, 16, nr[g + 1], o + GROUP_ROWS * ldo, ldo);
    if (RA > 1) {
      _tile_stored(3, cbuf, 64);
      emit((const float(*)[16])cbuf, 16, nr[g + 1], o + GROUP_ROWS * ldo + 16, ldo);
    }
  }
}

AMX void lks__mm_bf16_amx(const void *wv, int64_t ldw, int64_t m, const float *x, int64_t ldx,
                          int64_t n, int64_t K, float *out, int64_t ldo, void *scratch) {
  _tile_loadconfig(&k_config);
  const uint16_t *w = wv;
  int64_t chunks = (K + CHUNK - 1) / CHUNK, full = K / CHUNK;
  char *s = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  uint16_t *B = (uint16_t *)s;  // [PANEL_GROUPS][chunks][16][32]
  uint16_t *pad = (uint16_t *)(s + PANEL_GROUPS * chunks * TILE_BYTES);  // [16][chunks * 32]
  uint16_t *ta = pad + 16 * chunks * CHUNK;                              // [2][16][32]
  float(*cbuf)[16] = (float(*)[16])(ta + 2 * 512);
  int64_t bstride = chunks * 512;
  // Fewer than 16 weight rows: a zero-padded copy (every K step from it, no tail).
  if (m < 16) {
    memset(pad, 0, (size_t)16 * chunks * 64);
    for (int64_t i = 0; i < m; i++) memcpy(pad + i * chunks * CHUNK, w + i * ldw, (size_t)K * 2);
  }
  for (int64_t t0 = 0; t0 < n; t0 += PANEL_GROUPS * GROUP_ROWS) {
    int ng = 0, nr[PANEL_GROUPS];
    for (; ng < PANEL_GROUPS && t0 + ng * GROUP_ROWS < n; ng++) {
      int64_t left = n - t0 - ng * GROUP_ROWS;
      nr[ng] = left < GROUP_ROWS ? (int)left : GROUP_ROWS;
      prep_group(x + (t0 + ng * GROUP_ROWS) * ldx, ldx, nr[ng], K, B + ng * bstride);
    }
    float *ot = out + t0 * ldo;
    if (m < 16) {
      for (int g = 0; g < ng; g++) {
        tiles(pad, chunks * CHUNK, 1, B + g * bstride, NULL, 1, chunks, NULL, NULL);
        _tile_stored(0, cbuf, 64);
        emit((const float(*)[16])cbuf, (int)m, nr[g], ot + (int64_t)g * GROUP_ROWS * ldo, ldo);
      }
      continue;
    }
    // Blocks of 32 weight rows, then 16; the last block ends at m, overlapping the one before (its
    // rows come out the same, bit for bit).
    for (int64_t r = 0; r < m;) {
      int RA = m - r >= 32 ? 2 : 1;
      int64_t r0 = m - r >= 16 ? r : m - 16;
      const uint16_t *wr = w + r0 * ldw;
      const uint16_t *tail = NULL;
      if (full < chunks) {
        tail_copy(wr, ldw, full * CHUNK, K, ta);
        if (RA > 1) tail_copy(wr + 16 * ldw, ldw, full * CHUNK, K, ta + 512);
        tail = ta;
      }
      for (int g = 0; g < ng; g += 2)
        block(wr, ldw, RA, B, bstride, g, ng - g >= 2 ? 2 : 1, nr, full, tail, cbuf, ot + r0, ldo);
      r = r0 + 16 * RA;
    }
  }
}
#endif
