// SPDX-License-Identifier: MIT
// The CPU backend against plain implementations written here, in double precision, from the
// definitions of backend.h and MODEL.md section 2: every op on random inputs with a relative
// error bound (max |got - ref| / max |ref|; a NaN or infinity always fails), the SIMD dot
// kernels of every level this CPU has, bitwise equality of results across thread counts, and
// the thread pool with sums that are exactly known. Equality across batches (each row as
// computed alone, on every SIMD level) is check_batch_invariance.c.
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/cpu_math.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "backend_testutil.h"
#include "testutil.h"

// ---- fixture: the backend most tests use; every buffer and host array a test makes is freed in
// teardown (backend_testutil.h) ----

static lks_backend *be;  // 2 threads: the pool is exercised by every op test

static void setup(void) {
  lks_log_set_level(LKS_LOG_WARN);
  be = lks_backend_new("cpu", 2);
  ck_assert_ptr_nonnull(be);
}

static void teardown(void) {
  tb_free_owned();
  lks_backend_free(be);
  be = NULL;
}

// ---- the error bound ----

// max |got - ref| / max |ref|; infinite when got holds a NaN or an infinity.
static double rel_err(const float *got, const double *ref, size_t n) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    double d = fabs((double)got[i] - ref[i]);
    if (d > md) md = d;
    if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
  }
  return md / (mr > 0 ? mr : 1.0);
}

// Fails (with the message fmt, ...) unless the relative error is within bound.
#define ck_assert_rel(got, ref, n, bound, fmt, ...)                                   \
  do {                                                                                \
    double e_ = rel_err((got), (ref), (size_t)(n));                                   \
    ck_assert_msg(e_ <= (bound), fmt ": relative error %g > %g", __VA_ARGS__, e_,     \
                  (double)(bound));                                                   \
  } while (0)

static const double TOL = 1e-5;

START_TEST(test_rel_err_rejects_nan) {
  float got[3] = {1, 2, 3};
  double ref[3] = {1, 2, 3};
  ck_assert(rel_err(got, ref, 3) == 0);
  got[1] = NAN;
  ck_assert(!(rel_err(got, ref, 3) <= TOL));
  got[1] = INFINITY;
  ck_assert(!(rel_err(got, ref, 3) <= TOL));
  got[1] = 2.001f;
  ck_assert(!(rel_err(got, ref, 3) <= TOL));
}
END_TEST

START_TEST(test_f16_codec) {
  // The test's own converter against known encodings, and the library's decoder against it.
  ck_assert_uint_eq(tb_f32_to_f16(1.0f), 0x3c00);
  ck_assert_uint_eq(tb_f32_to_f16(-2.0f), 0xc000);
  ck_assert_uint_eq(tb_f32_to_f16(0.5f), 0x3800);
  ck_assert_uint_eq(tb_f32_to_f16(65504.0f), 0x7bff);
  ck_assert_uint_eq(tb_f32_to_f16(0x1p-24f), 0x0001);
  ck_assert_uint_eq(tb_f32_to_f16(0x1p-14f), 0x0400);
  ck_assert(tb_f16_val(0x3555) == 0x1.554p-2);
  uint64_t rng = 99;
  for (int i = 0; i < 10000; i++) {
    float f = tu_randf(&rng) * (i % 3 == 0 ? 1e-4f : 8.0f);
    uint16_t h = tb_f32_to_f16(f);
    ck_assert(fabs(tb_f16_val(h) - f) <= fabs((double)f) * 0x1p-11 + 0x1p-25);
    ck_assert((double)lks_f16_to_f32(h) == tb_f16_val(h));
  }
}
END_TEST

START_TEST(test_buffers_and_views) {
  lks_clear_error();
  ck_assert_ptr_null(lks_backend_new("no-such-backend", 1));
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "no-such-backend"));
  lks_backend_free(NULL);
  // Copies stay inside the buffer.
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  lks_tensor t = tb_upload(be, LKS_F32, 1, 4, in);
  ck_assert_int_eq(be->ops->to_host(be, out, t.buf, 4, 12), 0);
  ck_assert_float_eq(out[0], 2);
  ck_assert_float_eq(out[2], 4);
  ck_assert_int_lt(be->ops->to_host(be, out, t.buf, 8, 12), 0);
  ck_assert_int_lt(be->ops->to_host(be, out, t.buf, 17, 0), 0);
  ck_assert_int_lt(be->ops->from_host(be, t.buf, 4, in, 16), 0);
  ck_assert_int_lt(be->ops->from_host(be, t.buf, SIZE_MAX, in, 2), 0);
  // A wrapped host buffer is read in place and never written.
  float host[6] = {5, 6, 7, 8, 9, 10};
  lks_buf *w = be->ops->buf_wrap_host(be, host, sizeof host);
  ck_assert_ptr_nonnull(w);
  host[1] = 60;
  ck_assert_int_eq(be->ops->to_host(be, out, w, 4, 8), 0);
  ck_assert_float_eq(out[0], 60);
  ck_assert_int_lt(be->ops->from_host(be, w, 0, in, 4), 0);
  ck_assert_float_eq(host[0], 5);
  be->ops->buf_free(be, w);
  be->ops->buf_free(be, NULL);
  // A column slice is packed by default (LKS_HOST_PACK_SLICES): columns 1-2 of a 2 x 3 matrix,
  // whose rows' other column another rank reads; in place with LKS_HOST_IN_PLACE.
  size_t ld0 = 0;
  w = be->ops->buf_wrap_host_2d(be, host + 1, 2, 2 * sizeof(float), 3 * sizeof(float), &ld0);
  ck_assert_ptr_nonnull(w);
  ck_assert_uint_eq(ld0, 2 * sizeof(float));
  ck_assert_int_eq(be->ops->to_host(be, out, w, 0, 16), 0);
  ck_assert(out[0] == 60 && out[1] == 7 && out[2] == 9 && out[3] == 10);
  be->ops->buf_free(be, w);
  lks_backend_cpu_host_weights(be, LKS_HOST_IN_PLACE);
  w = be->ops->buf_wrap_host_2d(be, host + 1, 2, 2 * sizeof(float), 3 * sizeof(float), &ld0);
  ck_assert_ptr_eq(be->ops->buf_ptr(be, w), host + 1);
  ck_assert_uint_eq(ld0, 3 * sizeof(float));
  be->ops->buf_free(be, w);
  lks_backend_cpu_host_weights(be, LKS_HOST_PACK_SLICES);
  // With LKS_HOST_COPY (--mmap false) a wrapped buffer is a copy: later writes to the host memory
  // do not show, and a strided slice is packed (its row stride becomes the row's bytes).
  lks_backend_cpu_host_weights(be, LKS_HOST_COPY);
  w = be->ops->buf_wrap_host(be, host, sizeof host);
  ck_assert_ptr_nonnull(w);
  ck_assert_ptr_ne(be->ops->buf_ptr(be, w), host);
  host[1] = 61;
  ck_assert_int_eq(be->ops->to_host(be, out, w, 4, 8), 0);
  ck_assert_float_eq(out[0], 60);
  ck_assert_float_eq(out[1], 7);
  be->ops->buf_free(be, w);
  size_t ld = 0;
  w = be->ops->buf_wrap_host_2d(be, host + 1, 2, 2 * sizeof(float), 3 * sizeof(float), &ld);
  ck_assert_ptr_nonnull(w);
  ck_assert_uint_eq(ld, 2 * sizeof(float));
  ck_assert_int_eq(be->ops->to_host(be, out, w, 0, 16), 0);
  ck_assert(out[0] == 61 && out[1] == 7 && out[2] == 9 && out[3] == 10);
  be->ops->buf_free(be, w);
  lks_backend_cpu_host_weights(be, LKS_HOST_PACK_SLICES);
  // Views: rows, columns and reshapes, read back as f32 from every element type.
  uint64_t rng = 3;
  float *src = tb_randv(&rng, 5 * 7, 1.0f);
  for (int d = 0; d < 3; d++) {
    double *ex = TB_NEW(double, 5 * 7);
    lks_tensor full = tb_upload(be, tb_mm_dtypes[d], 5, 7, tb_encode(tb_mm_dtypes[d], src, 35, ex));
    lks_tensor v = lks_tensor_rows(lks_tensor_cols(full, 2, 4), 1, 3);
    ck_assert_int_eq(v.rows, 3);
    ck_assert_int_eq(v.cols, 4);
    ck_assert_int_eq(v.ld, 7);
    float *got = tb_download(be, v);
    for (int r = 0; r < 3; r++)
      for (int c = 0; c < 4; c++) ck_assert((double)got[r * 4 + c] == ex[(r + 1) * 7 + c + 2]);
    lks_tensor rs = lks_tensor_reshape(lks_tensor_rows(full, 1, 2), 7, 2);
    got = tb_download(be, rs);
    for (int i = 0; i < 14; i++) ck_assert((double)got[i] == ex[7 + i]);
  }
}
END_TEST

// ---- the dot kernels of every SIMD level ----

static const int64_t dot_lens[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 100, 1000, 4099};
enum { N_DOT_LENS = sizeof dot_lens / sizeof dot_lens[0], DOT_TRIALS = 8 };

START_TEST(test_dot_kernels) {
  static const char *levels[] = TU_SIMD_LEVELS;
  int tested = 0;
  uint64_t rng = 1234;
  const int64_t cap = 4099 + 65;
  float *w = TB_NEW(float, cap), *x = TB_NEW(float, cap);
  uint16_t *wb = TB_NEW(uint16_t, cap);
  for (int l = 0; l < TU_N_SIMD_LEVELS; l++) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(levels[l]);
    if (!k) {
      fprintf(stderr, "check_backend_cpu: kernel level %s not available here\n", levels[l]);
      continue;
    }
    tested++;
    ck_assert_str_eq(k->name, levels[l]);
    for (int li = 0; li < N_DOT_LENS; li++) {
      int64_t n = dot_lens[li];
      float got_f32[DOT_TRIALS], got_bf16[DOT_TRIALS];
      double ref_f32[DOT_TRIALS], ref_bf16[DOT_TRIALS], mag_bf16[DOT_TRIALS];
      for (int t = 0; t < DOT_TRIALS; t++) {
        // One element of offset: unaligned loads. NaN after the end: reading past n fails.
        for (int64_t i = 0; i < n + 65; i++) {
          bool in = i >= 1 && i <= n;
          w[i] = in ? tu_randf(&rng) : NAN;
          x[i] = in ? tu_randf(&rng) : NAN;
          wb[i] = lks_f32_to_bf16(in ? tu_randf(&rng) : NAN);
        }
        double sf = 0, sb = 0, mb = 0;
        for (int64_t i = 1; i <= n; i++) {
          sf += (double)w[i] * x[i];
          sb += tb_bf16_val(wb[i]) * x[i];
          mb += fabs(tb_bf16_val(wb[i]) * x[i]);
        }
        ref_f32[t] = sf;
        ref_bf16[t] = sb;
        mag_bf16[t] = mb;
        got_f32[t] = k->dot_f32(w + 1, x + 1, n);
        got_bf16[t] = k->dot_bf16(wb + 1, x + 1, n);
      }
      ck_assert_rel(got_f32, ref_f32, DOT_TRIALS, TOL, "%s dot_f32 n=%lld", k->name,
                    (long long)n);
      if (!k->bf16_activations)
        ck_assert_rel(got_bf16, ref_bf16, DOT_TRIALS, TOL, "%s dot_bf16 n=%lld", k->name,
                      (long long)n);
      else  // each product's activation rounded to BF16: 2^-9 relative, and f32 sums
        for (int t = 0; t < DOT_TRIALS; t++)
          ck_assert_msg(fabs(got_bf16[t] - ref_bf16[t]) <= 0x1p-8 * mag_bf16[t],
                        "%s dot_bf16 n=%lld: %.9g vs %.9g (sum of |products| %g)", k->name,
                        (long long)n, got_bf16[t], ref_bf16[t], mag_bf16[t]);
    }
  }
  ck_assert_int_ge(tested, 1);
  ck_assert_ptr_null(lks__cpu_kernels_get("sse9"));
}
END_TEST

// Attention's weighted sum of values (pv), every level: o + sum_p w[g][p] v[p] against a float64
// sum, within the bound of np + 1 float32 additions in order, (np + 1) 2^-24 sum of |terms|
// (each fused or rounded product adds at most one more 2^-24 of its term: the + 1). Values past
// hd in each row, rows past np and weights past np are NaN, and outputs past G heads are
// sentinels: reading or writing them fails. The SIMD levels (all but scalar) are also checked
// bit for bit against one fmaf per position in order of p, each element's arithmetic whatever
// the level's loop order and blocking (the lks__pv_fn contract, which batch invariance needs).
START_TEST(test_pv_kernels) {
  static const char *levels[] = TU_SIMD_LEVELS;
  static const int shapes[][3] = {{1, 1, 1},  {4, 16, 64}, {12, 16, 128}, {3, 5, 32},
                                  {9, 16, 17}, {5, 7, 8},  {8, 13, 100},  {2, 16, 31}};
  uint64_t rng = 99;
  int tested = 0;
  for (int l = 0; l < TU_N_SIMD_LEVELS; l++) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(levels[l]);
    if (!k) continue;
    tested++;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
      int G = shapes[c][0], np = shapes[c][1], hd = shapes[c][2];
      int64_t ldw = np + 3, ldv = hd + 5;
      float *w = TB_NEW(float, (size_t)(G * ldw)), *v = TB_NEW(float, (size_t)((np + 1) * ldv));
      float *o = TB_NEW(float, (size_t)(G * hd + 16));
      double *ref = TB_NEW(double, (size_t)(G * hd)), *mag = TB_NEW(double, (size_t)(G * hd));
      for (int64_t i = 0; i < G * ldw; i++) w[i] = i % ldw < np ? tu_randf(&rng) : NAN;
      for (int64_t i = 0; i < (np + 1) * ldv; i++)
        v[i] = i / ldv < np && i % ldv < hd ? tu_randf(&rng) : NAN;
      for (int i = 0; i < G * hd + 16; i++) o[i] = i < G * hd ? tu_randf(&rng) : 7.0f;
      float *seq = TB_NEW(float, (size_t)(G * hd));
      for (int g = 0; g < G; g++)
        for (int d = 0; d < hd; d++) {
          float f = o[g * hd + d];
          for (int p = 0; p < np; p++) f = fmaf(w[g * ldw + p], v[p * ldv + d], f);
          seq[g * hd + d] = f;
          double s = o[g * hd + d], m = fabs(s);
          for (int p = 0; p < np; p++) {
            s += (double)w[g * ldw + p] * v[p * ldv + d];
            m += fabs((double)w[g * ldw + p] * v[p * ldv + d]);
          }
          ref[g * hd + d] = s;
          mag[g * hd + d] = m;
        }
      k->pv(w, ldw, G, v, ldv, np, hd, o);
      for (int i = 0; i < G * hd; i++)
        ck_assert_msg(fabs(o[i] - ref[i]) <= (np + 1) * 0x1p-24 * mag[i],
                      "%s pv G=%d np=%d hd=%d [%d]: %.9g vs %.9g", k->name, G, np, hd, i, o[i],
                      ref[i]);
      for (int i = 0; strcmp(k->name, "scalar") != 0 && i < G * hd; i++)
        ck_assert_msg(o[i] == seq[i], "%s pv G=%d np=%d hd=%d [%d]: %.9g, in order %.9g",
                      k->name, G, np, hd, i, o[i], seq[i]);
      for (int i = G * hd; i < G * hd + 16; i++) ck_assert_float_eq(o[i], 7.0f);
    }
  }
  ck_assert_int_ge(tested, 1);
}
END_TEST

// The blocked kernels give, element for element, the bits of the single dot product, for block
// shapes that end mid-block in both directions and for strided rows; and every level's blocked
// products agree with the portable kernels' within TOL (relative to the largest). The shapes
// include the amx level's blocks: 16 and 32 weight rows (a last block overlapping the one
// before), 5 activation rows a tile and 20 a panel, K steps of 32.
START_TEST(test_mm_kernels_match_dot) {
  static const char *levels[] = TU_SIMD_LEVELS;
  static const int64_t ms[] = {1, 3, 4, 8, 13, 16, 17, 31, 32, 33, 50};
  static const int64_t ns[] = {1, 2, 3, 4, 5, 9, 20, 21, 41};
  static const int64_t ks[] = {1, 15, 16, 17, 32, 48, 100};
  enum { NM = 11, NN = 9, NK = 7, MAXM = 50, MAXN = 41, LDO = 64 };
  uint64_t rng = 4321;
  const int64_t ld = 110;
  float *wf = tb_randv(&rng, (size_t)(MAXM * ld), 1.0f);
  float *x = tb_randv(&rng, (size_t)(MAXN * ld), 1.0f);
  uint16_t *wb = tb_encode(LKS_BF16, wf, (size_t)(MAXM * ld), NULL);
  float *out = TB_NEW(float, MAXN * LDO), *out_s = TB_NEW(float, MAXN * LDO);
  float *got = TB_NEW(float, MAXN * MAXM);
  double *ref = TB_NEW(double, MAXN * MAXM);
  const lks__cpu_kernels *kp = lks__cpu_kernels_get("scalar");
  for (int l = 0; l < TU_N_SIMD_LEVELS; l++) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(levels[l]);
    if (!k) continue;
    void *scratch = k->mm_scratch ? TB_NEW(char, k->mm_scratch(ld)) : NULL;
    for (int mi = 0; mi < NM; mi++)
      for (int ni = 0; ni < NN; ni++)
        for (int ki = 0; ki < NK; ki++) {
          int64_t m = ms[mi], n = ns[ni], K = ks[ki];
          for (int bf = 0; bf < 2; bf++) {
            if (bf) {
              k->mm_bf16(wb, ld, m, x, ld, n, K, out, LDO, scratch);
              kp->mm_bf16(wb, ld, m, x, ld, n, K, out_s, LDO, NULL);
            } else {
              k->mm_f32(wf, ld, m, x, ld, n, K, out, LDO, NULL);
              kp->mm_f32(wf, ld, m, x, ld, n, K, out_s, LDO, NULL);
            }
            for (int64_t t = 0; t < n; t++)
              for (int64_t r = 0; r < m; r++) {
                got[t * m + r] = out[t * LDO + r];
                ref[t * m + r] = out_s[t * LDO + r];
              }
            lks__mv_fn mv = bf ? k->mv_bf16 : k->mv_f32;
            for (int a = 0; n == 1 && mv && a < 2; a++) {  // decode's stream: mm's bits exactly
              float mvo[MAXM];
              const void *w = bf ? (const void *)wb : (const void *)wf;
              mv(w, ld, m, x, K, mvo, a ? w : NULL, a ? MAXM : 0);  // after: any rows will do
              ck_assert_msg(memcmp(mvo, out, (size_t)m * sizeof *mvo) == 0,
                            "%s mv_%s m=%lld K=%lld (after %s) differs from mm", k->name,
                            bf ? "bf16" : "f32", (long long)m, (long long)K, a ? "set" : "NULL");
            }
            if (!(bf && k->bf16_activations))  // (its bound: test_dot_kernels)
              ck_assert_rel(got, ref, n * m, TOL, "%s mm_%s m=%lld n=%lld K=%lld against scalar",
                            k->name, bf ? "bf16" : "f32", (long long)m, (long long)n,
                            (long long)K);
            for (int64_t t = 0; t < n; t++)
              for (int64_t r = 0; r < m; r++) {
                float d = bf ? k->dot_bf16(wb + r * ld, x + t * ld, K)
                             : k->dot_f32(wf + r * ld, x + t * ld, K);
                ck_assert_msg(memcmp(&d, &out[t * LDO + r], 4) == 0,
                              "%s mm_%s m=%lld n=%lld K=%lld: (%lld, %lld) %.9g, dot %.9g",
                              k->name, bf ? "bf16" : "f32", (long long)m, (long long)n,
                              (long long)K, (long long)t, (long long)r, out[t * LDO + r], d);
              }
          }
        }
  }
  ck_assert_ptr_nonnull(lks__cpu_kernels_best());
}
END_TEST

// ---- matmul ----

// Activation rows. The CPU backend takes a BF16 weight in one of two ways by the number of rows
// (core/backend_cpu.c, mm_task): up to 32 rows, dot products straight from the BF16 row; more,
// the row widened to f32 once and reused. 32 and 33 sit on either side of that threshold, so
// both paths are compared with the reference (with only 1..7 rows, the widening path was never
// reached).
static const int mm_rows[] = {1, 2, 3, 7, 32, 33};
#define N_MM_ROWS ((int)(sizeof mm_rows / sizeof mm_rows[0]))
static const float SENTINEL = 12345.0f;

// out (+)= x W^T + bias on b, against the reference; strided: every operand a view into a
// wider buffer (the weight a column slice, ld > cols).
static void matmul_case(lks_backend *b, lks_dtype dt, int n, bool has_bias, bool acc,
                        bool strided, uint64_t seed) {
  const int64_t K = 75, M = 40;
  // Padding around the views: NaN in inputs (reading it fails), a sentinel in the output.
  int64_t xpad = strided ? 5 : 0, wpad = strided ? 6 : 0, opad = strided ? 4 : 0;
  int64_t x0 = strided ? 3 : 0, w0 = strided ? 2 : 0, o0 = strided ? 1 : 0;
  int64_t ldx = K + xpad, ldw = K + wpad, ldo = M + opad;
  uint64_t rng = seed;

  float *xh = tb_randv(&rng, (size_t)(n * ldx), 1.0f);
  float *wh = tb_randv(&rng, (size_t)(M * ldw), 1.0f);
  float *bh = tb_randv(&rng, (size_t)M, 1.0f);
  float *oh = tb_randv(&rng, (size_t)(n * ldo), 4.0f);
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < ldx; c++)
      if (c < x0 || c >= x0 + K) xh[r * ldx + c] = NAN;
  for (int64_t r = 0; r < M; r++)
    for (int64_t c = 0; c < ldw; c++)
      if (c < w0 || c >= w0 + K) wh[r * ldw + c] = NAN;
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < ldo; c++)
      if (c < o0 || c >= o0 + M) oh[r * ldo + c] = SENTINEL;

  double *wx = TB_NEW(double, M *ldw), *bx = TB_NEW(double, M);
  void *wbytes = tb_encode(dt, wh, (size_t)(M * ldw), wx);
  void *bbytes = tb_encode(dt, bh, (size_t)M, bx);
  lks_tensor x = lks_tensor_cols(tb_upload(b, LKS_F32, n, ldx, xh), x0, K);
  lks_tensor w = lks_tensor_cols(tb_upload(b, dt, M, ldw, wbytes), w0, K);
  lks_tensor o_full = tb_upload(b, LKS_F32, n, ldo, oh);
  lks_tensor o = lks_tensor_cols(o_full, o0, M);
  lks_tensor bias = {0};
  if (has_bias) bias = tb_upload(b, dt, 1, M, bbytes);
  ck_assert_int_eq(w.ld, ldw);

  ck_assert_int_eq(b->ops->matmul(b, o, x, w, bias, acc), 0);

  double *ref = TB_NEW(double, n *M);
  for (int64_t t = 0; t < n; t++)
    for (int64_t m = 0; m < M; m++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += wx[m * ldw + w0 + k] * xh[t * ldx + x0 + k];
      if (has_bias) s += bx[m];
      if (acc) s += oh[t * ldo + o0 + m];
      ref[t * M + m] = s;
    }
  float *got = tb_download(b, o);
  ck_assert_rel(got, ref, n * M, TOL, "matmul %s n=%d bias=%d acc=%d strided=%d",
                lks_dtype_name(dt), n, has_bias, acc, strided);
  float *full = tb_download(b, o_full);
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < ldo; c++)
      if (c < o0 || c >= o0 + M) ck_assert_float_eq(full[r * ldo + c], SENTINEL);
}

// Case _i: dtype, rows, bias, accumulate and strided views, all 3 * 6 * 2 * 2 * 2 = 144
// combinations.
START_TEST(test_matmul) {
  matmul_case(be, tb_mm_dtypes[_i % 3], mm_rows[(_i / 3) % N_MM_ROWS], (_i / (3 * N_MM_ROWS)) % 2,
              (_i / (6 * N_MM_ROWS)) % 2, (_i / (12 * N_MM_ROWS)) % 2, 1000 + (uint64_t)_i);
}
END_TEST

// The backend on each SIMD level this CPU has (LKS_SIMD), through both BF16 paths.
START_TEST(test_matmul_simd_levels) {
  static const char *levels[] = TU_SIMD_LEVELS;
  for (int l = 0; l < TU_N_SIMD_LEVELS; l++) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(levels[l]);
    if (!k) continue;
    setenv("LKS_SIMD", levels[l], 1);
    lks_backend *b = tb_new_backend(2);
    for (int d = 0; d < 3; d++)
      for (int ni = 0; ni < N_MM_ROWS; ni++)
        if (!(k->bf16_activations && tb_mm_dtypes[d] == LKS_BF16))  // (test_dot_kernels)
          matmul_case(b, tb_mm_dtypes[d], mm_rows[ni], true, true, true, 7);
  }
  unsetenv("LKS_SIMD");
}
END_TEST

START_TEST(test_matmul_shape_errors) {
  lks_tensor x = tb_upload(be, LKS_F32, 2, 8, NULL), w = tb_upload(be, LKS_F32, 4, 9, NULL);
  lks_tensor o = tb_upload(be, LKS_F32, 2, 4, NULL), none = {0};
  ck_assert_int_eq(be->ops->matmul(be, o, x, w, none, false), LKS_ESHAPE);
  lks_tensor w8 = tb_upload(be, LKS_F32, 4, 8, NULL), o5 = tb_upload(be, LKS_F32, 2, 5, NULL);
  ck_assert_int_eq(be->ops->matmul(be, o5, x, w8, none, false), LKS_ESHAPE);
  lks_tensor wi = tb_upload(be, LKS_I32, 4, 8, NULL);
  ck_assert_int_eq(be->ops->matmul(be, o, x, wi, none, false), LKS_EUNSUPPORTED);
}
END_TEST

// ---- rmsnorm, rope, embed, gather_rows, argmax ----

static void rms_ref(const float *x, const double *w, int64_t rows, int64_t cols, float eps,
                    double *out) {
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t i = 0; i < cols; i++) ss += (double)x[r * cols + i] * x[r * cols + i];
    double inv = 1.0 / sqrt(ss / (double)cols + eps);
    for (int64_t i = 0; i < cols; i++) out[r * cols + i] = w[i] * x[r * cols + i] * inv;
  }
}

// Cases: 0 separate output, F32 weight; 1 BF16 weight; 2 in place; 3 per-head (a reshape of
// [n, heads * hd] to [n * heads, hd], in place, as qk-norm does).
START_TEST(test_rmsnorm) {
  const int n = 3, heads = 4, hd = 24;
  const float eps = 1e-5f;
  int64_t rows = _i == 3 ? (int64_t)n * heads : n, cols = _i == 3 ? hd : (int64_t)heads * hd;
  uint64_t rng = 77 + (uint64_t)_i;
  float *xh = tb_randv(&rng, (size_t)(n * heads * hd), 3.0f);
  for (int i = 0; i < hd; i++) xh[i] *= 0.01f;  // one head (or row part) much smaller
  float *wh = tb_randv(&rng, (size_t)cols, 2.0f);
  lks_dtype wdt = _i == 1 ? LKS_BF16 : LKS_F32;
  double *wx = TB_NEW(double, cols);
  void *wb = tb_encode(wdt, wh, (size_t)cols, wx);
  lks_tensor w = tb_upload(be, wdt, 1, cols, wb);
  lks_tensor x = tb_upload(be, LKS_F32, n, (int64_t)heads * hd, xh);
  lks_tensor out = _i == 0 || _i == 1 ? tb_upload(be, LKS_F32, n, (int64_t)heads * hd, NULL) : x;
  if (_i == 3) {
    x = lks_tensor_reshape(x, rows, cols);
    out = x;
  }
  ck_assert_int_eq(be->ops->rmsnorm(be, out, x, w, eps), 0);
  double *ref = TB_NEW(double, rows *cols);
  rms_ref(xh, wx, rows, cols, eps, ref);
  ck_assert_rel(tb_download(be, out), ref, rows * cols, TOL, "rmsnorm case %d", _i);
  if (_i < 2) ck_assert_mem_eq(tb_download(be, x), xh, (size_t)(rows * cols) * sizeof(float));
}
END_TEST

// Cases: layout x (rot_dims < head_dim, rot_dims == head_dim) x theta.
START_TEST(test_rope) {
  lks_rope_layout layout = _i % 2 ? LKS_ROPE_INTERLEAVED : LKS_ROPE_HALF_SPLIT;
  const int heads = 3, hd = 16;
  int rot = (_i / 2) % 2 ? hd : 6;
  double theta = (_i / 4) % 2 ? 1e6 : 10000.0;
  const int n = 5;
  const int32_t pos[] = {0, 1, 7, 1000, 123457};
  uint64_t rng = 555 + (uint64_t)_i;
  float *xh = tb_randv(&rng, (size_t)(n * heads * hd), 2.0f);
  lks_tensor x = tb_upload(be, LKS_F32, n, heads * hd, xh);
  ck_assert_int_eq(be->ops->rope(be, x, hd, rot, (float)theta, layout, pos), 0);
  float *got = tb_download(be, x);
  double *ref = TB_NEW(double, n *heads *hd);
  for (int r = 0; r < n; r++)
    for (int h = 0; h < heads; h++) {
      const float *v = xh + (r * heads + h) * hd;
      double *o = ref + (r * heads + h) * hd;
      for (int d = 0; d < hd; d++) o[d] = v[d];
      for (int j = 0; j < rot / 2; j++) {
        double ang = pos[r] * pow((double)(float)theta, -2.0 * j / rot);
        int a = layout == LKS_ROPE_HALF_SPLIT ? j : 2 * j;
        int b = layout == LKS_ROPE_HALF_SPLIT ? j + rot / 2 : 2 * j + 1;
        o[a] = v[a] * cos(ang) - v[b] * sin(ang);
        o[b] = v[b] * cos(ang) + v[a] * sin(ang);
      }
      for (int d = rot; d < hd; d++)  // dims >= rot_dims pass through untouched
        ck_assert_mem_eq(&got[(r * heads + h) * hd + d], &v[d], sizeof(float));
    }
  // Position 0 is the identity.
  ck_assert_mem_eq(got, xh, (size_t)(heads * hd) * sizeof(float));
  ck_assert_rel(got, ref, n * heads * hd, TOL, "rope layout %d rot %d theta %g", layout, rot,
                theta);
}
END_TEST

START_TEST(test_embed) {
  const int64_t V = 50, H = 24;
  const int32_t ids[] = {3, 0, 49, 3, 17};
  const int n = 5;
  uint64_t rng = 31;
  float *th = tb_randv(&rng, (size_t)(V * H), 1.0f);
  for (int d = 0; d < 3; d++) {
    lks_dtype dt = tb_mm_dtypes[d];
    double *tx = TB_NEW(double, V *H);
    lks_tensor table = tb_upload(be, dt, V, H, tb_encode(dt, th, (size_t)(V * H), tx));
    // The output is a column view of a wider buffer.
    lks_tensor out = lks_tensor_cols(tb_upload(be, LKS_F32, n, H + 3, NULL), 2, H);
    ck_assert_int_eq(be->ops->embed(be, out, table, ids), 0);
    float *got = tb_download(be, out);
    for (int i = 0; i < n; i++)
      for (int64_t c = 0; c < H; c++)
        ck_assert_msg((double)got[i * H + c] == tx[ids[i] * H + c], "%s row %d col %lld",
                      lks_dtype_name(dt), i, (long long)c);
  }
  lks_tensor table = tb_upload(be, LKS_F32, V, H, th);
  lks_tensor out2 = tb_upload(be, LKS_F32, 2, H, NULL);
  const int32_t bad_hi[] = {1, 50}, bad_lo[] = {-1, 0};
  lks_clear_error();
  ck_assert_int_lt(be->ops->embed(be, out2, table, bad_hi), 0);
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "50"));
  ck_assert_int_lt(be->ops->embed(be, out2, table, bad_lo), 0);
  lks_tensor one = tb_upload(be, LKS_F32, 1, H, NULL);
  const int32_t huge[] = {2147483647};
  ck_assert_int_lt(be->ops->embed(be, one, table, huge), 0);
}
END_TEST

START_TEST(test_gather_rows) {
  const int64_t R = 10, H = 12;
  const int32_t rows[] = {9, 0, 3, 3, 7};
  uint64_t rng = 8;
  float *xh = tb_randv(&rng, (size_t)(R * H), 1.0f);
  lks_tensor x = tb_upload(be, LKS_F32, R, H, xh);
  lks_tensor out = tb_upload(be, LKS_F32, 5, H, NULL);
  ck_assert_int_eq(be->ops->gather_rows(be, out, x, rows), 0);
  float *got = tb_download(be, out);
  for (int i = 0; i < 5; i++)
    ck_assert_mem_eq(got + i * H, xh + rows[i] * H, (size_t)H * sizeof(float));
}
END_TEST

START_TEST(test_argmax) {
  enum { C = 9 };
  const float rows[][C] = {
      {0, 1, 2, 5, 1, 0, 2, 5, 1},             // tie: 3 before 7
      {4, 4, 4, 4, 4, 4, 4, 4, 4},             // all equal: 0
      {-3, -2, -9, -1, -1.5f, -7, -1, -8, -5},  // negatives, tie: 3
      {0, 0, 0, 0, 0, 0, 0, 0, 1},             // last
      {7, 0, 0, 0, 0, 0, 0, 0, 7},             // first
  };
  const int32_t want[] = {3, 0, 3, 8, 0};
  const int n = 5;
  lks_tensor x = tb_upload(be, LKS_F32, n, C, rows);
  int32_t idx[5];
  float val[5];
  ck_assert_int_eq(be->ops->argmax(be, x, idx, val), 0);
  for (int r = 0; r < n; r++) {
    ck_assert_int_eq(idx[r], want[r]);
    ck_assert_float_eq(val[r], rows[r][want[r]]);
  }
  ck_assert_int_eq(be->ops->argmax(be, x, idx, NULL), 0);
  for (int r = 0; r < n; r++) ck_assert_int_eq(idx[r], want[r]);
  // Random wide rows against a naive scan.
  const int64_t V = 1001;
  uint64_t rng = 4;
  float *xh = tb_randv(&rng, (size_t)(4 * V), 1.0f);
  lks_tensor xs = tb_upload(be, LKS_F32, 4, V, xh);
  int32_t idx2[4];
  ck_assert_int_eq(be->ops->argmax(be, xs, idx2, NULL), 0);
  for (int r = 0; r < 4; r++) {
    int64_t b = 0;
    for (int64_t i = 0; i < V; i++)
      if (xh[r * V + i] > xh[r * V + b]) b = i;
    ck_assert_int_eq(idx2[r], b);
  }
}
END_TEST

// ---- paged KV cache and attention ----

static void attn_ref(const tb_attn_setup *a, const float *q, int n, const int32_t *seq,
                     const int32_t *pos, double scale, double *out) {
  int hd = a->hd, kvd = a->n_kv * hd, qd = a->n_heads * hd;
  double *s = TB_NEW(double, TB_MAXB *TB_BS);
  for (int r = 0; r < n; r++)
    for (int h = 0; h < a->n_heads; h++) {
      int kvh = h / (a->n_heads / a->n_kv);
      const float *qh = q + r * qd + h * hd;
      double mx = -INFINITY, sum = 0;
      for (int p = 0; p <= pos[r]; p++) {
        const float *k = a->Kh + ((size_t)(seq[r] * TB_MAXB * TB_BS + p) * kvd) + kvh * hd;
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)qh[i] * k[i];
        s[p] = d * scale;
        if (s[p] > mx) mx = s[p];
      }
      for (int p = 0; p <= pos[r]; p++) sum += s[p] = exp(s[p] - mx);
      double *o = out + r * qd + h * hd;
      for (int i = 0; i < hd; i++) o[i] = 0;
      for (int p = 0; p <= pos[r]; p++) {
        const float *v = a->Vh + ((size_t)(seq[r] * TB_MAXB * TB_BS + p) * kvd) + kvh * hd;
        for (int i = 0; i < hd; i++) o[i] += s[p] / sum * v[i];
      }
    }
}

// Rows at various positions of both sequences; later positions are in the cache too, so a
// missing causal mask shows.
enum { ATT_N = 6 };
static const int32_t att_seq[ATT_N] = {0, 1, 0, 1, 0, 1};
static const int32_t att_pos[ATT_N] = {13, 2, 0, 10, 6, 5};

static const int gqa[][2] = {{4, 2}, {2, 2}, {4, 1}, {6, 3}};
enum { N_GQA = sizeof gqa / sizeof gqa[0] };

// Each GQA shape with an F32 and a BF16 cache (_i / N_GQA). A BF16 cache holds each value
// rounded to nearest even, and the reference takes those values: the attention over them is
// then f32 arithmetic on exact inputs, with the F32 case's bound.
START_TEST(test_kv_store_attention) {
  int g = _i % N_GQA;
  tb_attn_setup a = {.n_heads = gqa[g][0], .n_kv = gqa[g][1], .hd = 20,
                     .dtype = _i < N_GQA ? LKS_F32 : LKS_BF16};
  tb_fill_cache(be, &a, 900 + (uint64_t)_i);
  int kvd = a.n_kv * a.hd, qd = a.n_heads * a.hd;
  // The pools hold each (seq, pos) at the slot its block table gives.
  size_t pool = (size_t)TB_NBLK * TB_BS * kvd, es = lks_dtype_size(a.dtype);
  char *kc = TB_NEW(char, pool * es), *vc = TB_NEW(char, pool * es);
  ck_assert_int_eq(be->ops->to_host(be, kc, a.kv.k, 0, pool * es), 0);
  ck_assert_int_eq(be->ops->to_host(be, vc, a.kv.v, 0, pool * es), 0);
  for (int s = 0; s < TB_NSEQ; s++)
    for (int p = 0; p < tb_seq_len[s]; p++) {
      size_t at = (size_t)tb_slot_of(s, p) * kvd, src = (size_t)(s * TB_MAXB * TB_BS + p) * kvd;
      for (int i = 0; i < kvd; i++) {
        float kg, vg;
        if (es == 2) {
          kg = tb_bf16_val(((uint16_t *)kc)[at + i]);
          vg = tb_bf16_val(((uint16_t *)vc)[at + i]);
        } else {
          kg = ((float *)kc)[at + i];
          vg = ((float *)vc)[at + i];
        }
        ck_assert_float_eq(kg, a.Kh[src + i]);
        ck_assert_float_eq(vg, a.Vh[src + i]);
      }
    }

  uint64_t rng = 4242 + (uint64_t)_i;
  float *qh = tb_randv(&rng, (size_t)ATT_N * qd, 3.0f);
  int32_t slot[ATT_N];
  for (int i = 0; i < ATT_N; i++) slot[i] = tb_slot_of(att_seq[i], att_pos[i]);
  lks_attn_rows rows = {ATT_N, att_seq, att_pos, slot, tb_block_table, TB_MAXB};
  lks_tensor q = tb_upload(be, LKS_F32, ATT_N, qd, qh);
  lks_tensor out = lks_tensor_cols(tb_upload(be, LKS_F32, ATT_N, qd + 5, NULL), 3, qd);
  float scale = 1.0f / sqrtf((float)a.hd);
  ck_assert_int_eq(be->ops->attention(be, out, q, &a.kv, &rows, a.n_heads, scale), 0);
  double *ref = TB_NEW(double, ATT_N *qd);
  attn_ref(&a, qh, ATT_N, att_seq, att_pos, scale, ref);
  ck_assert_rel(tb_download(be, out), ref, ATT_N * qd, TOL, "attention heads %d/%d", a.n_heads,
                a.n_kv);
}
END_TEST

START_TEST(test_kv_slot_errors) {
  tb_attn_setup a = {.n_heads = 2, .n_kv = 1, .hd = 8};
  tb_fill_cache(be, &a, 5);
  int kvd = a.n_kv * a.hd;
  lks_tensor k = tb_upload(be, LKS_F32, 1, kvd, NULL), v = tb_upload(be, LKS_F32, 1, kvd, NULL);
  lks_tensor q = tb_upload(be, LKS_F32, 1, 2 * a.hd, NULL),
             o = tb_upload(be, LKS_F32, 1, 2 * a.hd, NULL);
  const int32_t bad_slots[] = {TB_NBLK * TB_BS, -1, 1 << 30};
  for (int i = 0; i < 3; i++) {
    int32_t seq = 0, pos = 1, slot = bad_slots[i];
    lks_attn_rows rows = {1, &seq, &pos, &slot, tb_block_table, TB_MAXB};
    lks_clear_error();
    ck_assert_int_lt(be->ops->kv_store(be, &a.kv, k, v, &rows), 0);
    ck_assert_str_ne(lks_last_error(), "");
    ck_assert_int_lt(be->ops->attention(be, o, q, &a.kv, &rows, 2, 1.0f), 0);
  }
  // A position past the block table.
  int32_t seq = 0, pos = TB_MAXB * TB_BS, slot = 0;
  lks_attn_rows rows = {1, &seq, &pos, &slot, tb_block_table, TB_MAXB};
  ck_assert_int_lt(be->ops->kv_store(be, &a.kv, k, v, &rows), 0);
  ck_assert_int_lt(be->ops->attention(be, o, q, &a.kv, &rows, 2, 1.0f), 0);
  pos = -1;
  ck_assert_int_lt(be->ops->attention(be, o, q, &a.kv, &rows, 2, 1.0f), 0);
  // The failed stores wrote nothing.
  size_t pool = (size_t)TB_NBLK * TB_BS * kvd;
  float *kc = TB_NEW(float, pool);
  ck_assert_int_eq(be->ops->to_host(be, kc, a.kv.k, 0, pool * sizeof(float)), 0);
  for (int s = 0; s < TB_NSEQ; s++)
    for (int p = 0; p < tb_seq_len[s]; p++)
      ck_assert_mem_eq(kc + (size_t)tb_slot_of(s, p) * kvd,
                       a.Kh + (size_t)(s * TB_MAXB * TB_BS + p) * kvd, (size_t)kvd * sizeof(float));
}
END_TEST

// ---- MoE routing ----

// Brute force from MODEL.md section 2, in double.
static void route_ref(const float *logits, const float *bias, const lks_route_params *p,
                      int32_t *ids, double *w) {
  int E = p->n_experts, per = E / p->n_group;
  double s[256], c[256];
  bool keep_g[256], taken[256];
  for (int e = 0; e < E; e++) {
    s[e] = 1.0 / (1.0 + exp(-(double)logits[e]));
    c[e] = s[e] + bias[e];
    taken[e] = false;
  }
  for (int g = 0; g < p->n_group; g++) keep_g[g] = p->n_group == 1;
  if (p->n_group > 1) {
    double gs[256];
    for (int g = 0; g < p->n_group; g++) {
      double best1 = -INFINITY, best2 = -INFINITY;  // two largest, by sorting the group
      for (int e = g * per; e < (g + 1) * per; e++) {
        int rank = 0;
        for (int f = g * per; f < (g + 1) * per; f++)
          if (c[f] > c[e] || (c[f] == c[e] && f < e)) rank++;
        if (rank == 0) best1 = c[e];
        if (rank == 1) best2 = c[e];
      }
      gs[g] = best1 + best2;
    }
    for (int g = 0; g < p->n_group; g++) {  // kept iff fewer than topk_group groups beat it
      int better = 0;
      for (int f = 0; f < p->n_group; f++)
        if (gs[f] > gs[g] || (gs[f] == gs[g] && f < g)) better++;
      keep_g[g] = better < p->topk_group;
    }
  }
  double sum = 0;
  for (int k = 0; k < p->top_k; k++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (keep_g[e / per] && !taken[e] && (best < 0 || c[e] > c[best])) best = e;
    ck_assert_int_ge(best, 0);
    taken[best] = true;
    ids[k] = best;
    w[k] = s[best];
    sum += s[best];
  }
  for (int k = 0; k < p->top_k; k++) {
    if (p->norm_topk_prob) w[k] /= sum + 1e-20;
    w[k] *= p->scaling;
  }
}

// Runs the op on [n, E] logits and compares each row's (id, weight) set with the reference.
static void check_route(const lks_route_params *p, int n, const float *logits, const float *bias,
                        const char *what) {
  int E = p->n_experts, k = p->top_k;
  lks_tensor l = tb_upload(be, LKS_F32, n, E, logits), b = tb_upload(be, LKS_F32, 1, E, bias);
  int32_t *ids = TB_NEW(int32_t, n * k), *rid = TB_NEW(int32_t, k);
  float *w = TB_NEW(float, n *k), *wsorted = TB_NEW(float, k);
  double *rw = TB_NEW(double, k);
  ck_assert_int_eq(be->ops->route(be, l, b, p, ids, w), 0);
  for (int r = 0; r < n; r++) {
    route_ref(logits + r * E, bias, p, rid, rw);
    // Same set of experts (in any order) with the same weights.
    for (int j = 0; j < k; j++) {
      int found = -1;
      for (int i = 0; i < k; i++)
        if (ids[r * k + i] == rid[j]) {
          ck_assert_msg(found < 0, "%s: row %d selects expert %d twice", what, r, rid[j]);
          found = i;
        }
      ck_assert_msg(found >= 0, "%s: row %d misses expert %d (E %d, k %d, groups %d/%d)", what,
                    r, rid[j], E, k, p->topk_group, p->n_group);
      wsorted[j] = w[r * k + found];
    }
    ck_assert_rel(wsorted, rw, k, TOL, "%s: weights of row %d", what, r);
  }
}

static const struct {
  int E, k, ng, tg;
  bool norm;
  float scaling;
} route_cases[] = {
    {16, 4, 1, 1, true, 2.5f},  {16, 4, 1, 1, false, 1.0f}, {16, 4, 4, 2, true, 1.0f},
    {16, 3, 8, 3, false, 2.5f}, {32, 8, 4, 4, true, 1.5f},  {12, 2, 3, 1, true, 1.0f},
    {160, 8, 1, 1, true, 2.5f}, {64, 6, 8, 3, false, 1.0f},
};

START_TEST(test_route_random) {
  lks_route_params p = {route_cases[_i].E, route_cases[_i].k, route_cases[_i].ng,
                        route_cases[_i].tg, route_cases[_i].norm, route_cases[_i].scaling};
  const int n = 9;
  uint64_t rng = 300 + (uint64_t)_i;
  float *logits = tb_randv(&rng, (size_t)(n * p.n_experts), 4.0f);
  float *bias = tb_randv(&rng, (size_t)p.n_experts, 0.3f);
  check_route(&p, n, logits, bias, "random");
}
END_TEST

START_TEST(test_route_rules) {
  enum { E = 8 };
  float zero[E] = {0}, flat[E], bias[E];
  lks_route_params p = {E, 4, 1, 1, true, 1.0f};
  int32_t ids[E];
  float w[E];
  // All scores equal: the lowest ids win.
  for (int e = 0; e < E; e++) flat[e] = 0.5f;
  lks_tensor l = tb_upload(be, LKS_F32, 1, E, flat), bz = tb_upload(be, LKS_F32, 1, E, zero);
  ck_assert_int_eq(be->ops->route(be, l, bz, &p, ids, w), 0);
  bool got[E] = {false};
  for (int k = 0; k < 4; k++) got[ids[k]] = true;
  for (int e = 0; e < 4; e++) ck_assert_msg(got[e], "tie: expert %d not selected", e);
  for (int k = 0; k < 4; k++) ck_assert_float_eq_tol(w[k], 0.25f, 1e-7f);
  check_route(&p, 1, flat, zero, "all equal");

  // The bias selects but does not weight: expert 0 has the best score but a negative bias;
  // experts 1, 2, 6 tie on score + bias (0.5 + 0.25) and 1, 2 win the tie.
  float logits[E] = {3, 0, 0, 0, 0, 0, 0, 0};
  float bsel[E] = {-0.5f, 0.25f, 0.25f, 0, 0, 0, 0.25f, 0};
  p.top_k = 2;
  p.norm_topk_prob = false;
  p.scaling = 2.0f;
  lks_tensor l2 = tb_upload(be, LKS_F32, 1, E, logits), b2 = tb_upload(be, LKS_F32, 1, E, bsel);
  ck_assert_int_eq(be->ops->route(be, l2, b2, &p, ids, w), 0);
  memset(got, 0, sizeof got);
  for (int k = 0; k < 2; k++) {
    got[ids[k]] = true;
    ck_assert_float_eq_tol(w[k], 2.0f * 0.5f, 1e-6f);  // s = sigmoid(0), never s + bias
  }
  ck_assert(got[1] && got[2] && !got[6] && !got[0]);
  check_route(&p, 1, logits, bsel, "bias selects");

  // Groups score by the sum of their two best: group 0 holds the single best expert but group
  // 1's pair is better, so with one group kept expert 0 is not chosen.
  lks_route_params pg = {E, 2, 2, 1, true, 1.0f};
  float lg[E] = {4, -4, -4, -4, 1, 1, -4, -4};
  for (int e = 0; e < E; e++) bias[e] = 0;
  lks_tensor l3 = tb_upload(be, LKS_F32, 1, E, lg);
  ck_assert_int_eq(be->ops->route(be, l3, bz, &pg, ids, w), 0);
  ck_assert_msg((ids[0] == 4 && ids[1] == 5) || (ids[0] == 5 && ids[1] == 4),
                "grouped: got %d %d", ids[0], ids[1]);
  ck_assert_float_eq_tol(w[0], 0.5f, 1e-6f);
  check_route(&pg, 1, lg, bias, "groups by two best");
  // All groups tied: the lower group, then the lower ids.
  lks_route_params pt = {E, 3, 4, 2, false, 1.0f};
  check_route(&pt, 1, flat, zero, "grouped ties");
  lks_tensor l4 = tb_upload(be, LKS_F32, 1, E, flat);
  ck_assert_int_eq(be->ops->route(be, l4, bz, &pt, ids, w), 0);
  memset(got, 0, sizeof got);
  for (int k = 0; k < 3; k++) got[ids[k]] = true;
  ck_assert(got[0] && got[1] && got[2]);
}
END_TEST

// ---- the SwiGLU expert ----

static double silu(double v) { return v / (1.0 + exp(-v)); }

static const int expert_n[] = {1, 2, 5};
static const int32_t expert_rows[3][5] = {{4}, {5, 1}, {4, 1, 3, 0, 5}};

// Case _i: weight dtype (F32, BF16, F16) x rows NULL / given x weights NULL / given x n_rows.
START_TEST(test_expert) {
  lks_dtype dt = tb_mm_dtypes[_i % 3];
  bool use_rows = (_i / 3) % 2, use_w = (_i / 6) % 2;
  int ni = (_i / 12) % 3, n = expert_n[ni];
  const int64_t R = 6, H = 40, I = 24, pad = 3;
  const int32_t *rows = use_rows ? expert_rows[ni] : NULL;
  const float wts[5] = {0.7f, -1.3f, 0.25f, 2.0f, 0.5f};
  uint64_t rng = 600 + (uint64_t)_i;
  float *xh = tb_randv(&rng, (size_t)(R * (H + pad)), 2.0f);
  float *oh = tb_randv(&rng, (size_t)(R * (H + pad)), 1.0f);
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = H; c < H + pad; c++) {
      xh[r * (H + pad) + c] = NAN;
      oh[r * (H + pad) + c] = SENTINEL;
    }
  double *gx = TB_NEW(double, I *H), *ux = TB_NEW(double, I *H), *dx = TB_NEW(double, H *I);
  void *gb = tb_encode(dt, tb_randv(&rng, (size_t)(I * H), 0.5f), (size_t)(I * H), gx);
  void *ub = tb_encode(dt, tb_randv(&rng, (size_t)(I * H), 0.5f), (size_t)(I * H), ux);
  void *db = tb_encode(dt, tb_randv(&rng, (size_t)(H * I), 0.5f), (size_t)(H * I), dx);
  lks_tensor x = lks_tensor_cols(tb_upload(be, LKS_F32, R, H + pad, xh), 0, H);
  lks_tensor o_full = tb_upload(be, LKS_F32, R, H + pad, oh);
  lks_tensor o = lks_tensor_cols(o_full, 0, H);
  ck_assert_int_eq(
      be->ops->expert(be, o, x, rows, use_w ? wts : NULL, n, tb_upload(be, dt, I, H, gb),
                      tb_upload(be, dt, I, H, ub), tb_upload(be, dt, H, I, db)),
      0);
  double *ref = TB_NEW(double, R *H), *a = TB_NEW(double, I);
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < H; c++) ref[r * H + c] = oh[r * (H + pad) + c];
  bool *touched = TB_NEW(bool, R);
  for (int i = 0; i < n; i++) {
    int r = rows ? rows[i] : i;
    touched[r] = true;
    const float *xr = xh + r * (H + pad);
    for (int64_t j = 0; j < I; j++) {
      double g = 0, u = 0;
      for (int64_t k = 0; k < H; k++) {
        g += gx[j * H + k] * xr[k];
        u += ux[j * H + k] * xr[k];
      }
      a[j] = silu(g) * u;
    }
    for (int64_t c = 0; c < H; c++) {
      double d = 0;
      for (int64_t j = 0; j < I; j++) d += dx[c * I + j] * a[j];
      ref[r * H + c] += (use_w ? wts[i] : 1.0) * d;
    }
  }
  float *got = tb_download(be, o);
  ck_assert_rel(got, ref, R * H, TOL, "expert %s rows=%d weights=%d n=%d", lks_dtype_name(dt),
                use_rows, use_w, n);
  for (int64_t r = 0; r < R; r++)
    if (!touched[r])
      ck_assert_mem_eq(got + r * H, oh + r * (H + pad), (size_t)H * sizeof(float));
  float *full = tb_download(be, o_full);
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = H; c < H + pad; c++) ck_assert_float_eq(full[r * (H + pad) + c], SENTINEL);
}
END_TEST

// ---- results do not depend on the number of threads ----

// Each op once on 1 thread, then three times on 3 threads (the first call may find the workers
// asleep and run alone; the later ones find them spinning).
enum { RUNS = 4 };

START_TEST(test_threads_bitwise) {
  lks_backend *b1 = tb_new_backend(1), *b3 = tb_new_backend(3);
  lks_backend *runs[RUNS] = {b1, b3, b3, b3};
  const int64_t M = 300, K = 259;
  static const int ns[] = {1, 2, 5};
  for (int d = 0; d < 3; d++)
    for (int ni = 0; ni < 3; ni++) {
      int n = ns[ni];
      uint64_t rng = 71 + (uint64_t)(d * 3 + ni);
      float *xh = tb_randv(&rng, (size_t)(n * K), 1.0f);
      float *wf = tb_randv(&rng, (size_t)(M * K), 1.0f);
      float *bh = tb_randv(&rng, (size_t)M, 1.0f);
      void *wb = tb_encode(tb_mm_dtypes[d], wf, (size_t)(M * K), NULL);
      float *res[RUNS];
      for (int t = 0; t < RUNS; t++) {
        lks_backend *b = runs[t];
        lks_tensor o = tb_upload(b, LKS_F32, n, M, NULL);
        ck_assert_int_eq(b->ops->matmul(b, o, tb_upload(b, LKS_F32, n, K, xh),
                                        tb_upload(b, tb_mm_dtypes[d], M, K, wb),
                                        tb_upload(b, LKS_F32, 1, M, bh), false),
                         0);
        res[t] = tb_download(b, o);
        ck_assert_msg(memcmp(res[0], res[t], (size_t)(n * M) * sizeof(float)) == 0,
                      "matmul %s n=%d: run %d on 3 threads differs from 1 thread",
                      lks_dtype_name(tb_mm_dtypes[d]), n, t);
      }
    }

  tb_attn_setup a[2] = {{.n_heads = 8, .n_kv = 2, .hd = 64}, {.n_heads = 8, .n_kv = 2, .hd = 64}};
  tb_fill_cache(b1, &a[0], 17);
  tb_fill_cache(b3, &a[1], 17);
  uint64_t rng = 18;
  const int qd = 8 * 64;
  float *qh = tb_randv(&rng, (size_t)ATT_N * qd, 3.0f);
  int32_t slot[ATT_N];
  for (int i = 0; i < ATT_N; i++) slot[i] = tb_slot_of(att_seq[i], att_pos[i]);
  lks_attn_rows rows = {ATT_N, att_seq, att_pos, slot, tb_block_table, TB_MAXB};
  float *att[RUNS];
  for (int t = 0; t < RUNS; t++) {
    lks_backend *b = runs[t];
    lks_tensor o = tb_upload(b, LKS_F32, ATT_N, qd, NULL);
    ck_assert_int_eq(b->ops->attention(b, o, tb_upload(b, LKS_F32, ATT_N, qd, qh), &a[t > 0].kv,
                                       &rows, 8, 0.125f),
                     0);
    att[t] = tb_download(b, o);
    ck_assert_msg(memcmp(att[0], att[t], (size_t)ATT_N * qd * sizeof(float)) == 0,
                  "attention: run %d on 3 threads differs from 1 thread", t);
  }

  // The expert: gate and up in one job, down in another.
  const int64_t H = 96, I = 200, R = 7;
  float *xh = tb_randv(&rng, (size_t)(R * H), 1.0f);
  void *gb = tb_encode(LKS_BF16, tb_randv(&rng, (size_t)(I * H), 0.3f), (size_t)(I * H), NULL);
  void *ub = tb_encode(LKS_BF16, tb_randv(&rng, (size_t)(I * H), 0.3f), (size_t)(I * H), NULL);
  void *db = tb_encode(LKS_BF16, tb_randv(&rng, (size_t)(H * I), 0.3f), (size_t)(H * I), NULL);
  const int32_t erows[] = {6, 2, 3};
  const float wts[] = {0.5f, 1.5f, -1.0f};
  float *ex[RUNS];
  for (int t = 0; t < RUNS; t++) {
    lks_backend *b = runs[t];
    lks_tensor o = tb_upload(b, LKS_F32, R, H, NULL);
    ck_assert_int_eq(
        b->ops->expert(b, o, tb_upload(b, LKS_F32, R, H, xh), erows, wts, 3,
                       tb_upload(b, LKS_BF16, I, H, gb), tb_upload(b, LKS_BF16, I, H, ub),
                       tb_upload(b, LKS_BF16, H, I, db)),
        0);
    ex[t] = tb_download(b, o);
    ck_assert_msg(memcmp(ex[0], ex[t], (size_t)(R * H) * sizeof(float)) == 0,
                  "expert: run %d on 3 threads differs from 1 thread", t);
  }
}
END_TEST

// ---- the thread pool ----

enum { POOL_MAX_TASKS = 1000, POOL_MAX_THREADS = 8 };
typedef struct {
  atomic_llong sum;
  atomic_int hits[POOL_MAX_TASKS];
  atomic_int busy[POOL_MAX_THREADS];  // a scratch slot used by two threads at once shows here
  atomic_int errors;
  int n_threads;
  bool slow;  // tasks on worker threads take a while: the caller must wait for them
} pool_ctx;

static void pool_task(void *ctx, int task, int thread) {
  pool_ctx *c = ctx;
  if (thread < 0 || thread >= c->n_threads || task < 0 || task >= POOL_MAX_TASKS) {
    atomic_fetch_add(&c->errors, 1);
    return;
  }
  if (atomic_exchange(&c->busy[thread], 1) != 0) atomic_fetch_add(&c->errors, 1);
  if (c->slow) {
    // Long enough for sleeping workers to wake and claim tasks; a worker's task outlasts all
    // of the caller's, so a caller that returned before the workers finished would see it.
    usleep(thread == 0 ? 100 : 2000);
  } else if (task % 7 == 0) {  // uneven tasks
    volatile int spin = 0;
    for (int i = 0; i < 2000; i++) spin += i;
    (void)spin;
  }
  // Counted at the end of the task: a run that returns early misses it.
  atomic_fetch_add(&c->sum, task);
  atomic_fetch_add(&c->hits[task], 1);
  atomic_store(&c->busy[thread], 0);
}

START_TEST(test_pool_sums) {
  static const int threads[] = {1, 4, 3};
  int nt = threads[_i];
  lks_pool *p = lks_pool_new(nt);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(lks_pool_size(p), nt);
  pool_ctx *c = TB_NEW(pool_ctx, 1);
  c->n_threads = nt;
  lks_pool_run(p, 0, pool_task, c);  // no tasks: fn never runs
  ck_assert_int_eq(atomic_load(&c->sum), 0);
  for (int round = 0; round < 300; round++) {
    int n = round < 10 ? round + 1 : (round * 379) % POOL_MAX_TASKS + 1;
    c->slow = round % 10 == 5;
    if (c->slow) n = 4 * nt + 1;
    atomic_store(&c->sum, 0);
    for (int t = 0; t < POOL_MAX_TASKS; t++) atomic_store(&c->hits[t], 0);
    lks_pool_run(p, n, pool_task, c);
    ck_assert_int_eq(atomic_load(&c->errors), 0);
    ck_assert_int_eq(atomic_load(&c->sum), (long long)n * (n - 1) / 2);
    for (int t = 0; t < POOL_MAX_TASKS; t++)
      ck_assert_msg(atomic_load(&c->hits[t]) == (t < n), "round %d: task %d ran %d times", round,
                    t, atomic_load(&c->hits[t]));
  }
  lks_pool_free(p);
  lks_pool_free(NULL);
}
END_TEST

// ---- the elementwise passes (cpu_math.h) against libm in double ----

// exp: x = n ln2 + r with r exact to an ulp, e^r by Horner over 8 coefficients (8 roundings of
// at most 2^-24 each, plus r's own) and a Taylor truncation below (ln2 / 2)^8 / 8! = 5.1e-9; the
// scaling by 2^n is exact. So |relative error| <= 9 * 2^-24 + 5.1e-9 = 5.4e-7.
START_TEST(test_exp_pass) {
  double worst = 0;
  for (int i = 0; i <= 2000000; i++) {
    float x = -87.3f + 176.0f * (float)i / 2000000.0f;  // e^x normal: [-87.33, 88.72]
    double want = exp((double)x), got = lks__exp_f32(x);
    double rel = fabs(got - want) / want;
    if (rel > worst) worst = rel;
  }
  ck_assert_msg(worst <= 5.4e-7, "exp: worst relative error %.3g", worst);
  // Subnormal results: within 2^-149 (their spacing) plus the relative bound.
  for (float x = -103.9f; x < -87.34f; x += 0.01f) {
    double want = exp((double)x), got = lks__exp_f32(x);
    ck_assert_msg(fabs(got - want) <= 0x1p-149 + 5.4e-7 * want, "exp(%.9g) = %.9g", x, got);
  }
  ck_assert(lks__exp_f32(-104.0f) == 0.0f && lks__exp_f32(-1000.0f) == 0.0f);
  ck_assert(isinf(lks__exp_f32(88.73f)) && isinf(lks__exp_f32(1000.0f)));
  ck_assert(isinf(lks__exp_f32(INFINITY)) && lks__exp_f32(-INFINITY) == 0.0f);
  ck_assert(lks__exp_f32(0.0f) == 1.0f);
}
END_TEST

// softmax(scale * s): each exponential within 5.4e-7 (above) of e^(v - max) with v rounded once
// (the scaling: |v| < 40 here, so up to 40 * 2^-24 = 2.4e-6 absolute in the exponent); the sum of
// n terms in 16 partial sums and a 4-level tree, at most n / 16 + 4 roundings, each 2^-24; then
// a division. For n <= 1000: 2.4e-6 + 5.4e-7 + 67 * 6e-8 + 6e-8 = 7.0e-6 relative per output.
START_TEST(test_softmax_pass) {
  uint64_t g = 31;
  const int ns[] = {1, 2, 15, 16, 17, 100, 1000};
  for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
    int n = ns[c];
    float s[1000];
    double v[1000], mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) {
      s[i] = 20.0f * tu_randf(&g);
      v[i] = (double)(s[i] * 0.125f);
      if (v[i] > mx) mx = v[i];
    }
    for (int i = 0; i < n; i++) sum += exp(v[i] - mx);
    lks__softmax_scaled(s, n, 0.125f);
    for (int i = 0; i < n; i++) {
      double want = exp(v[i] - mx) / sum;
      ck_assert_msg(fabs(s[i] - want) <= 7.0e-6 * want, "n %d, %d: %.9g, want %.9g", n, i, s[i],
                    want);
    }
  }
}
END_TEST

// silu(g) * u: exp(-g) within 5.4e-7, then an add, a division and a multiply (3 roundings of
// 2^-24); 1 + e^-g carries e^-g's error at most in full: 5.4e-7 + 1.8e-7 = 7.2e-7 relative.
START_TEST(test_silu_pass) {
  uint64_t g = 77;
  enum { N = 4099 };
  static float gate[N], up[N], out[N];
  for (int i = 0; i < N; i++) {
    gate[i] = i < 3 ? (float[]){-0.0f, 0.0f, -100.0f}[i] : 30.0f * tu_randf(&g);
    up[i] = 2.0f * tu_randf(&g);
  }
  lks__silu_mul(gate, up, out, N);
  for (int i = 0; i < N; i++) {
    double gd = gate[i], want = gd / (1.0 + exp(-gd)) * up[i];
    ck_assert_msg(fabs(out[i] - want) <= 7.2e-7 * fabs(want) + 1e-30, "%d: g %.9g u %.9g: %.9g, "
                  "want %.9g", i, gate[i], up[i], out[i], want);
  }
}
END_TEST

static TCase *tcase(const char *name, int timeout) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, timeout);
  return tc;
}

static Suite *backend_suite(void) {
  Suite *s = suite_create("backend_cpu");
  TCase *tc = tcase("helpers", 30);
  tcase_add_test(tc, test_rel_err_rejects_nan);
  tcase_add_test(tc, test_f16_codec);
  tcase_add_test(tc, test_buffers_and_views);
  suite_add_tcase(s, tc);

  tc = tcase("kernels", 60);
  tcase_add_test(tc, test_dot_kernels);
  tcase_add_test(tc, test_mm_kernels_match_dot);
  tcase_add_test(tc, test_pv_kernels);
  suite_add_tcase(s, tc);

  tc = tcase("matmul", 60);
  tcase_add_loop_test(tc, test_matmul, 0, 3 * N_MM_ROWS * 8);
  tcase_add_test(tc, test_matmul_shape_errors);
  tcase_add_test(tc, test_matmul_simd_levels);
  suite_add_tcase(s, tc);

  tc = tcase("elementwise", 30);
  tcase_add_loop_test(tc, test_rmsnorm, 0, 4);
  tcase_add_loop_test(tc, test_rope, 0, 8);
  tcase_add_test(tc, test_embed);
  tcase_add_test(tc, test_gather_rows);
  tcase_add_test(tc, test_argmax);
  tcase_add_test(tc, test_exp_pass);
  tcase_add_test(tc, test_softmax_pass);
  tcase_add_test(tc, test_silu_pass);
  suite_add_tcase(s, tc);

  tc = tcase("attention", 60);
  tcase_add_loop_test(tc, test_kv_store_attention, 0, 2 * N_GQA);
  tcase_add_test(tc, test_kv_slot_errors);
  suite_add_tcase(s, tc);

  tc = tcase("moe", 60);
  tcase_add_loop_test(tc, test_route_random, 0, (int)(sizeof route_cases / sizeof route_cases[0]));
  tcase_add_test(tc, test_route_rules);
  tcase_add_loop_test(tc, test_expert, 0, 36);
  suite_add_tcase(s, tc);

  tc = tcase("threads", 120);
  tcase_add_test(tc, test_threads_bitwise);
  tcase_add_loop_test(tc, test_pool_sums, 0, 3);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(backend_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
