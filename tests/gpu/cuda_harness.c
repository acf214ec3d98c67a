// SPDX-License-Identifier: MIT
// The harness of test_cuda_ops (cuda_harness.h): the two backends, random inputs built alike on
// both, and the comparisons.
#include "cuda_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

lks_backend *CPU, *GPU;
int failures, cases;
uint64_t rng_state;

uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}
float frand(void) {
  return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
int irand(int n) { return (int)(rnd() % (uint64_t)n); }

// Host arrays that wrapped buffers point into (the CPU backend wraps without a copy).
static void *keep[4096];
static int n_keep;
void *hold(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p || n_keep == 4096) exit(1);
  return keep[n_keep++] = p;
}

void free_held(void) {
  for (int i = 0; i < n_keep; i++) free(keep[i]);
  n_keep = 0;
}

void check(const char *what, double err, double bound) {
  cases++;
  bool ok = err <= bound;  // NaN fails
  if (!ok) failures++;
  printf("%-72s rel err %.3e (bound %.0e)  %s\n", what, err, bound, ok ? "ok" : "FAIL");
}

// f32 [rows, cols] with row stride ld on both backends; filled with random values or NaN.
tp act(int64_t rows, int64_t cols, int64_t ld, bool poison) {
  size_t n = (size_t)(rows > 0 ? rows : 1) * (size_t)ld;
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = poison ? NAN : frand();
  tp t;
  lks_buf *bc = CPU->ops->buf_alloc(CPU, n * 4), *bg = GPU->ops->buf_alloc(GPU, n * 4);
  if (!bc || !bg) TRY(-1);
  TRY(CPU->ops->from_host(CPU, bc, 0, h, n * 4));
  TRY(GPU->ops->from_host(GPU, bg, 0, h, n * 4));
  free(h);
  t.c = (lks_tensor){.buf = bc, .dtype = LKS_F32, .rows = rows, .cols = cols, .ld = ld};
  t.g = (lks_tensor){.buf = bg, .dtype = LKS_F32, .rows = rows, .cols = cols, .ld = ld};
  return t;
}

void act_free(tp t) {
  CPU->ops->buf_free(CPU, t.c.buf);
  GPU->ops->buf_free(GPU, t.g.buf);
}

uint16_t to16(float f, lks_dtype dt) {
  if (dt == LKS_BF16) return lks_f32_to_bf16(f);
  // f32 -> IEEE half, round to nearest (values here are small and normal or zero).
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int e = (int)((u >> 23) & 0xff) - 127 + 15;
  uint32_t m = u & 0x7fffffu;
  if (e <= 0) return (uint16_t)sign;
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  if ((m & 0x1fffu) > 0x1000u || ((m & 0x1fffu) == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}

// A weight [rows, cols] of dtype dt, wrapped like the loader does: the whole tensor, or columns
// [c0, c0 + cols) of a wider one (shard = true: buf_wrap_host_2d).
tp weight(lks_dtype dt, int64_t rows, int64_t cols, bool shard, float scale) {
  int64_t full = shard ? cols + 13 : cols, c0 = shard ? 5 : 0;
  size_t es = lks_dtype_size(dt);
  char *h = hold((size_t)rows * full * es);
  for (int64_t i = 0; i < rows * full; i++) {
    float v = frand() * scale;
    if (dt == LKS_F32)
      memcpy(h + i * 4, &v, 4);
    else {
      uint16_t b = to16(v, dt);
      memcpy(h + i * 2, &b, 2);
    }
  }
  tp t;
  const char *first = h + (size_t)c0 * es;
  lks_buf *bc, *bg;
  size_t ldc = (size_t)full * es, ldg = ldc;
  if (!shard) {
    bc = CPU->ops->buf_wrap_host(CPU, first, (size_t)rows * full * es);
    bg = GPU->ops->buf_wrap_host(GPU, first, (size_t)rows * full * es);
  } else {
    bc = CPU->ops->buf_wrap_host_2d(CPU, first, rows, (size_t)cols * es, (size_t)full * es, &ldc);
    bg = GPU->ops->buf_wrap_host_2d(GPU, first, rows, (size_t)cols * es, (size_t)full * es, &ldg);
    if (ldg != (size_t)cols * es) {
      printf("buf_wrap_host_2d: ld %zu bytes, expected the packed %zu  FAIL\n", ldg, (size_t)cols * es);
      failures++;
    }
  }
  if (!bc || !bg) TRY(-1);
  t.c = (lks_tensor){.buf = bc, .dtype = dt, .rows = rows, .cols = cols, .ld = (int64_t)(ldc / es)};
  t.g = (lks_tensor){.buf = bg, .dtype = dt, .rows = rows, .cols = cols, .ld = (int64_t)(ldg / es)};
  return t;
}

tp none(void) {
  tp t;
  memset(&t, 0, sizeof t);
  return t;
}

// max|gpu - cpu| / max|cpu| over the view.
double cmp(tp t) {
  size_t n = (size_t)t.c.rows * t.c.cols;
  float *a = malloc((n ? n : 1) * 4), *b = malloc((n ? n : 1) * 4);
  TRY(lks_tensor_to_host_f32(CPU, a, t.c));
  TRY(lks_tensor_to_host_f32(GPU, b, t.g));
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)b[i] - a[i]);
    if (!(d <= md)) md = d;
    if (!(fabs(a[i]) <= mr)) mr = fabs(a[i]);
  }
  free(a);
  free(b);
  return mr > 0 ? md / mr : md;
}

const char *dn(lks_dtype dt) { return lks_dtype_name(dt); }

// 1 when rows [0, n) of the two GPU f32 tensors are bitwise equal (NaN payloads included).
int same_bits(lks_tensor a, lks_tensor b, int64_t n, int64_t *bad_row) {
  size_t cnt = (size_t)n * a.cols;
  float *ha = malloc((cnt ? cnt : 1) * 4), *hb = malloc((cnt ? cnt : 1) * 4);
  TRY(lks_tensor_to_host_f32(GPU, ha, lks_tensor_rows(a, 0, n)));
  TRY(lks_tensor_to_host_f32(GPU, hb, lks_tensor_rows(b, 0, n)));
  int ok = 1;
  for (int64_t r = 0; r < n && ok; r++)
    if (memcmp(ha + r * a.cols, hb + r * a.cols, (size_t)a.cols * 4) != 0) {
      ok = 0;
      *bad_row = r;
    }
  free(ha);
  free(hb);
  return ok;
}
