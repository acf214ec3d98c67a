// SPDX-License-Identifier: MIT
// Helpers shared by the CPU backend's unit tests (backend_testutil.h).
#include "backend_testutil.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

// ---- owned until tb_free_owned ----

enum { MAX_OWNED = 4096 };
static lks_backend *extra_be[4];
static struct {
  lks_backend *be;
  lks_buf *b;
} bufs[MAX_OWNED];
static int n_bufs;
static void *mem[MAX_OWNED];
static int n_mem;

void tb_free_owned(void) {
  for (int i = 0; i < n_bufs; i++) bufs[i].be->ops->buf_free(bufs[i].be, bufs[i].b);
  for (int i = 0; i < n_mem; i++) free(mem[i]);
  for (int i = 0; i < 4; i++) lks_backend_free(extra_be[i]);
  n_bufs = n_mem = 0;
  memset(extra_be, 0, sizeof extra_be);
}

lks_backend *tb_new_backend(int threads) {
  lks_backend *b = lks_backend_new("cpu", threads);
  ck_assert_ptr_nonnull(b);
  for (int i = 0; i < 4; i++)
    if (!extra_be[i]) return extra_be[i] = b;
  ck_abort_msg("too many backends");
  return NULL;
}

void *tb_mem(size_t bytes) {
  ck_assert_int_lt(n_mem, MAX_OWNED);
  void *p = calloc(1, bytes ? bytes : 1);
  ck_assert_ptr_nonnull(p);
  return mem[n_mem++] = p;
}

lks_tensor tb_upload(lks_backend *b, lks_dtype dt, int64_t rows, int64_t cols, const void *host) {
  ck_assert_int_lt(n_bufs, MAX_OWNED);
  size_t bytes = (size_t)(rows * cols) * lks_dtype_size(dt);
  lks_buf *buf = b->ops->buf_alloc(b, bytes);
  ck_assert_ptr_nonnull(buf);
  bufs[n_bufs].be = b;
  bufs[n_bufs++].b = buf;
  if (host) ck_assert_int_eq(b->ops->from_host(b, buf, 0, host, bytes), 0);
  return lks_tensor_2d(buf, 0, dt, rows, cols);
}

float *tb_download(lks_backend *b, lks_tensor t) {
  float *h = TB_NEW(float, t.rows *t.cols);
  ck_assert_int_eq(lks_tensor_to_host_f32(b, h, t), 0);
  return h;
}

// ---- numbers: independent decoders, a test-side F16 encoder, random data ----

double tb_bf16_val(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

double tb_f16_val(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return m ? NAN : (h & 0x8000 ? -INFINITY : INFINITY);
  double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

// Rounds to nearest (lrint: ties to even; any rounding would do, since the reference decodes the
// bits this produces).
uint16_t tb_f32_to_f16(float f) {
  if (isnan(f)) return 0x7e00;
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (a < ldexp(1, -14)) return (uint16_t)(sign | (uint16_t)lrint(a * ldexp(1, 24)));
  int e;
  double fr = frexp(a, &e);   // a = fr * 2^e, fr in [0.5, 1)
  long m = lrint(fr * 2048);  // a = m / 1024 * 2^(e - 1)
  if (m == 2048) {
    m = 1024;
    e++;
  }
  return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(m - 1024));
}

void *tb_encode(lks_dtype dt, const float *src, size_t n, double *exact) {
  void *out = tb_mem(n * lks_dtype_size(dt));
  for (size_t i = 0; i < n; i++) {
    double v;
    if (dt == LKS_F32) {
      ((float *)out)[i] = src[i];
      v = src[i];
    } else if (dt == LKS_BF16) {
      uint16_t h = lks_f32_to_bf16(src[i]);
      ((uint16_t *)out)[i] = h;
      v = tb_bf16_val(h);
    } else {
      ck_assert_int_eq(dt, LKS_F16);
      uint16_t h = tb_f32_to_f16(src[i]);
      ((uint16_t *)out)[i] = h;
      v = tb_f16_val(h);
    }
    if (exact) exact[i] = v;
  }
  return out;
}

float *tb_randv(uint64_t *rng, size_t n, float scale) {
  float *v = TB_NEW(float, n);
  for (size_t i = 0; i < n; i++) v[i] = scale * tu_randf(rng);
  return v;
}

const lks_dtype tb_mm_dtypes[3] = {LKS_F32, LKS_BF16, LKS_F16};

// ---- a paged KV cache ----

const int32_t tb_block_table[TB_NSEQ * TB_MAXB] = {5, 2, 7, 0, 3, 8, 1, 4};
const int tb_seq_len[TB_NSEQ] = {14, 11};

int32_t tb_slot_of(int seq, int pos) {
  return tb_block_table[seq * TB_MAXB + pos / TB_BS] * TB_BS + pos % TB_BS;
}

void tb_fill_cache(lks_backend *b, tb_attn_setup *a, uint64_t seed) {
  int kvd = a->n_kv * a->hd;
  size_t pool = (size_t)TB_NBLK * TB_BS * kvd;
  a->kv = (lks_kv_layer){.n_blocks = TB_NBLK, .block_size = TB_BS, .n_kv_heads = a->n_kv,
                         .head_dim = a->hd, .dtype = a->dtype};
  a->kv.k = tb_upload(b, a->dtype, 1, (int64_t)pool, NULL).buf;
  a->kv.v = tb_upload(b, a->dtype, 1, (int64_t)pool, NULL).buf;
  uint64_t rng = seed;
  a->Kh = tb_randv(&rng, (size_t)TB_NSEQ * TB_MAXB * TB_BS * kvd, 1.0f);
  a->Vh = tb_randv(&rng, (size_t)TB_NSEQ * TB_MAXB * TB_BS * kvd, 1.0f);
  int order[TB_NSEQ * TB_MAXB * TB_BS], n = 0;
  for (int s = 0; s < TB_NSEQ; s++)
    for (int p = 0; p < tb_seq_len[s]; p++) order[n++] = s * TB_MAXB * TB_BS + p;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(tu_rand(&rng) % (uint64_t)(i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int i0 = 0; i0 < n; i0 += 3) {
    int m = n - i0 < 3 ? n - i0 : 3;
    int32_t seq[3], pos[3], slot[3];
    float *kb = TB_NEW(float, 3 * kvd), *vb = TB_NEW(float, 3 * kvd);
    for (int i = 0; i < m; i++) {
      seq[i] = order[i0 + i] / (TB_MAXB * TB_BS);
      pos[i] = order[i0 + i] % (TB_MAXB * TB_BS);
      slot[i] = tb_slot_of(seq[i], pos[i]);
      memcpy(kb + i * kvd, a->Kh + (size_t)order[i0 + i] * kvd, (size_t)kvd * sizeof(float));
      memcpy(vb + i * kvd, a->Vh + (size_t)order[i0 + i] * kvd, (size_t)kvd * sizeof(float));
    }
    lks_attn_rows rows = {m, seq, pos, slot, tb_block_table, TB_MAXB};
    ck_assert_int_eq(b->ops->kv_store(b, &a->kv, tb_upload(b, LKS_F32, m, kvd, kb),
                                      tb_upload(b, LKS_F32, m, kvd, vb), &rows),
                     0);
  }
  // What a BF16 cache holds: each value rounded to nearest even (the reference's inputs).
  size_t all = (size_t)TB_NSEQ * TB_MAXB * TB_BS * kvd;
  for (size_t i = 0; a->dtype == LKS_BF16 && i < all; i++) {
    a->Kh[i] = tb_bf16_val(lks_f32_to_bf16(a->Kh[i]));
    a->Vh[i] = tb_bf16_val(lks_f32_to_bf16(a->Vh[i]));
  }
}
