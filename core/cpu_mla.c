// SPDX-License-Identifier: MIT
// The CPU backend's ops for glm_moe_dsa (see cpu_mla.h and backend.h): LayerNorm, the store of a
// k-only cache layer, the DSA indexer's top-k selection and MLA attention in the absorbed form.
// Activations and caches are f32; weights F32, BF16 or F16, and kv_b also quantized (FP8, NVFP4:
// its rows dequantized to f32 once per head, cpu_quant.c). Sums run in f32 (the indexer's and
// attention's dot products through the backend's dot kernels), softmax in f32 with the maximum
// subtracted. The top-k is exact (a full sort of each row's scores), ties to the lower position.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_math.h"
#include "core/cpu_mla.h"
#include "core/cpu_quant.h"
#include "core/error.h"

static void *tptr(lks_backend *be, lks_tensor t) {
  return (char *)be->ops->buf_ptr(be, t.buf) + t.offset;
}
static float *frow(lks_backend *be, lks_tensor t, int64_t r) {
  return (float *)tptr(be, t) + r * t.ld;
}

// Row r of a weight (F32, BF16, F16, or quantized) widened to f32.
static void wrow(lks_backend *be, lks_tensor w, int64_t r, float *dst) {
  if (w.qs != LKS_Q_NONE) {
    lks__qweight q = {.qs = w.qs, .codes = tptr(be, w), .ld = w.ld,
                      .scales = (const char *)be->ops->buf_ptr(be, w.sbuf) + w.soff, .sld = w.sld,
                      .global = w.qglobal, .rows = w.rows, .cols = w.cols};
    lks__quant_row_f32(&q, r, dst);
    return;
  }
  const char *p = (const char *)tptr(be, w) + (size_t)(r * w.ld) * lks_dtype_size(w.dtype);
  switch (w.dtype) {
    case LKS_F32:
      memcpy(dst, p, (size_t)w.cols * sizeof(float));
      break;
    case LKS_BF16:
      for (int64_t i = 0; i < w.cols; i++) dst[i] = lks_bf16_to_f32(((const uint16_t *)p)[i]);
      break;
    case LKS_F16:
      for (int64_t i = 0; i < w.cols; i++) dst[i] = lks_f16_to_f32(((const uint16_t *)p)[i]);
      break;
    default:
      memset(dst, 0, (size_t)w.cols * sizeof(float));
  }
}

static int64_t slot_of(const lks_kv_layer *kv, const lks_attn_rows *rows, int row, int p) {
  const int32_t *bt = rows->block_table + (size_t)rows->seq[row] * rows->max_blocks;
  return (int64_t)bt[p / kv->block_size] * kv->block_size + p % kv->block_size;
}

int lks__cpu_layernorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, lks_tensor b,
                       float eps) {
  int64_t n = x.cols;
  float *wf = malloc((size_t)n * 2 * sizeof *wf);
  if (!wf) return lks_set_error(LKS_ENOMEM, "layernorm: out of memory");
  float *bf = wf + n;
  wrow(be, w, 0, wf);
  wrow(be, b, 0, bf);
  for (int64_t r = 0; r < x.rows; r++) {
    const float *xr = frow(be, x, r);
    float *o = frow(be, out, r);
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) mean += xr[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    float inv = (float)(1.0 / sqrt(var / (double)n + eps)), mu = (float)mean;
    for (int64_t i = 0; i < n; i++) o[i] = (xr[i] - mu) * inv * wf[i] + bf[i];
  }
  free(wf);
  return 0;
}

int lks__cpu_cache_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor x,
                         const lks_attn_rows *rows) {
  LKS_TRY(lks_attn_rows_check(kv, rows));
  if (!kv->k || x.cols != kv->head_dim)
    return lks_set_error(LKS_ESHAPE, "cache_store: %lld columns into a cache of width %d",
                         (long long)x.cols, kv->k ? kv->head_dim : 0);
  float *pool = be->ops->buf_ptr(be, kv->k);
  for (int i = 0; i < rows->n; i++)
    memcpy(pool + (size_t)rows->slot[i] * kv->head_dim, frow(be, x, i),
           (size_t)kv->head_dim * sizeof(float));
  return 0;
}

// ---- the DSA indexer ----

typedef struct {
  float score;
  int32_t pos;
} scored;

static int by_score(const void *a, const void *b) {
  const scored *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}
static int by_pos(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

typedef struct {
  lks_backend *be;
  const lks__cpu_kernels *k;
  lks_tensor q, w;
  const lks_kv_layer *keys;
  const lks_attn_rows *rows;
  int n_heads, topk;
  float q_scale, w_scale;
  int32_t *sel, *n_sel;
  scored *work;  // [threads, max_pos + 1]
  int work_stride;
  int failed;
} dsa_job;

static void dsa_task(void *ctx, int t, int thread) {
  dsa_job *j = ctx;
  int p = j->rows->pos[t], n_keys = p + 1, D = j->keys->head_dim;
  int32_t *out = j->sel + (size_t)t * j->topk;
  if (n_keys <= j->topk) {  // everything is selected; no scores needed
    for (int s = 0; s < n_keys; s++) out[s] = s;
    j->n_sel[t] = n_keys;
    return;
  }
  const float *q = frow(j->be, j->q, t), *w = frow(j->be, j->w, t);
  const float *K = j->be->ops->buf_ptr(j->be, j->keys->k);
  scored *sc = j->work + (size_t)thread * j->work_stride;
  for (int s = 0; s < n_keys; s++) {
    const float *k = K + slot_of(j->keys, j->rows, t, s) * D;
    float acc = 0;
    for (int h = 0; h < j->n_heads; h++) {
      float d = j->k->dot_f32(q + (size_t)h * D, k, D) * j->q_scale;
      if (d > 0) acc += (w[h] * j->w_scale) * d;
    }
    sc[s].score = acc;
    sc[s].pos = s;
  }
  qsort(sc, (size_t)n_keys, sizeof *sc, by_score);
  for (int i = 0; i < j->topk; i++) out[i] = sc[i].pos;
  qsort(out, (size_t)j->topk, sizeof *out, by_pos);
  j->n_sel[t] = j->topk;
}

int lks__cpu_dsa_select(lks_backend *be, lks_tensor q, lks_tensor w, const lks_kv_layer *keys,
                        const lks_attn_rows *rows, int n_heads, float q_scale, float w_scale,
                        int topk, int32_t *sel, int32_t *n_sel) {
  LKS_TRY(lks_attn_rows_check(keys, rows));
  if (!keys->k || q.cols != (int64_t)n_heads * keys->head_dim || w.cols != n_heads || topk < 1)
    return lks_set_error(LKS_ESHAPE, "dsa_select: q has %lld columns, %d heads of %d, w %lld, top-%d",
                         (long long)q.cols, n_heads, keys->head_dim, (long long)w.cols, topk);
  int max_pos = 0;
  for (int i = 0; i < rows->n; i++)
    if (rows->pos[i] > max_pos) max_pos = rows->pos[i];
  lks_pool *pool = lks__cpu_pool(be);
  int threads = lks_pool_size(pool);
  scored *work = malloc((size_t)threads * (size_t)(max_pos + 1) * sizeof *work);
  if (!work) return lks_set_error(LKS_ENOMEM, "dsa_select: out of memory for %d keys", max_pos + 1);
  dsa_job j = {be, lks__cpu_kernels_of(be), q, w, keys, rows, n_heads, topk, q_scale, w_scale,
               sel, n_sel, work, max_pos + 1, 0};
  lks_pool_run(pool, rows->n, dsa_task, &j);
  free(work);
  return 0;
}

// ---- MLA attention, absorbed ----

typedef struct {
  lks_backend *be;
  const lks__cpu_kernels *k;
  lks_tensor out, q, wkv_b;
  const lks_kv_layer *kv;
  const lks_attn_rows *rows;
  const lks_mla_dims *d;
  const int32_t *sel, *n_sel;
  int sel_stride, max_keys;
  float *work;  // per thread: W_uk^T and W_uv of one head, q_lat, o_lat, scores
  size_t work_stride;
} mla_job;

// One head for every row: its absorbed weights are widened once, then reused by all rows.
static void mla_task(void *ctx, int h, int thread) {
  mla_job *j = ctx;
  const lks_mla_dims *d = j->d;
  int R = d->latent, dn = d->nope, dr = d->rope, dv = d->v_dim, W = R + dr;
  float *uk = j->work + (size_t)thread * j->work_stride;  // [dn, R]
  float *uv = uk + (size_t)dn * R;                        // [dv, R]
  float *ql = uv + (size_t)dv * R, *ol = ql + R, *s = ol + R;
  int64_t r0 = (int64_t)h * (dn + dv);
  for (int i = 0; i < dn; i++) wrow(j->be, j->wkv_b, r0 + i, uk + (size_t)i * R);
  for (int i = 0; i < dv; i++) wrow(j->be, j->wkv_b, r0 + dn + i, uv + (size_t)i * R);
  const float *C = j->be->ops->buf_ptr(j->be, j->kv->k);
  for (int t = 0; t < j->rows->n; t++) {
    const float *q = frow(j->be, j->q, t) + (size_t)h * (dn + dr);
    float *o = frow(j->be, j->out, t) + (size_t)h * dv;
    // q_lat = W_uk^T q_nope: the query in the latent space.
    for (int c = 0; c < R; c++) ql[c] = 0;
    for (int i = 0; i < dn; i++) {
      float qi = q[i];
      const float *u = uk + (size_t)i * R;
      for (int c = 0; c < R; c++) ql[c] += qi * u[c];
    }
    const int32_t *keys = j->sel ? j->sel + (size_t)t * j->sel_stride : NULL;
    int n_keys = j->sel ? j->n_sel[t] : j->rows->pos[t] + 1;
    for (int i = 0; i < n_keys; i++) {
      int p = keys ? keys[i] : i;
      const float *row = C + slot_of(j->kv, j->rows, t, p) * W;
      s[i] = j->k->dot_f32(row, ql, R) + j->k->dot_f32(row + R, q + dn, dr);
    }
    lks__softmax_scaled(s, n_keys, d->scale);
    for (int c = 0; c < R; c++) ol[c] = 0;
    for (int i = 0; i < n_keys; i++) {
      int p = keys ? keys[i] : i;
      const float *row = C + slot_of(j->kv, j->rows, t, p) * W;
      float pw = s[i];
      for (int c = 0; c < R; c++) ol[c] += pw * row[c];
    }
    for (int v = 0; v < dv; v++) o[v] = j->k->dot_f32(uv + (size_t)v * R, ol, R);
  }
}

int lks__cpu_mla_attention(lks_backend *be, lks_tensor out, lks_tensor q, lks_tensor wkv_b,
                           const lks_kv_layer *kv, const lks_attn_rows *rows,
                           const lks_mla_dims *d, const int32_t *sel, const int32_t *n_sel,
                           int sel_stride) {
  LKS_TRY(lks_attn_rows_check(kv, rows));
  int R = d->latent, dn = d->nope, dr = d->rope, dv = d->v_dim, nh = d->n_heads;
  if (!kv->k || kv->head_dim != R + dr || q.cols != (int64_t)nh * (dn + dr) ||
      out.cols != (int64_t)nh * dv || wkv_b.rows != (int64_t)nh * (dn + dv) || wkv_b.cols != R)
    return lks_set_error(LKS_ESHAPE,
                         "mla_attention: q %lld / out %lld columns, kv_b [%lld, %lld], cache width %d "
                         "for %d heads (nope %d, rope %d, v %d, latent %d)",
                         (long long)q.cols, (long long)out.cols, (long long)wkv_b.rows,
                         (long long)wkv_b.cols, kv->head_dim, nh, dn, dr, dv, R);
  LKS_TRY(lks_weight_check(wkv_b, R));
  int max_keys = 1;
  for (int i = 0; i < rows->n; i++) {
    int nk = sel ? n_sel[i] : rows->pos[i] + 1;
    if (nk > max_keys) max_keys = nk;
    if (sel && n_sel[i] > sel_stride)
      return lks_set_error(LKS_ERANGE, "mla_attention: row %d selects %d keys of %d", i, n_sel[i],
                           sel_stride);
    for (int k = 0; sel && k < n_sel[i]; k++)
      if (sel[(size_t)i * sel_stride + k] < 0 || sel[(size_t)i * sel_stride + k] > rows->pos[i])
        return lks_set_error(LKS_ERANGE, "mla_attention: row %d selects position %d past %d", i,
                             sel[(size_t)i * sel_stride + k], rows->pos[i]);
  }
  lks_pool *pool = lks__cpu_pool(be);
  int threads = lks_pool_size(pool);
  size_t stride = (size_t)(dn + dv) * R + 2 * (size_t)R + (size_t)max_keys;
  float *work = malloc((size_t)threads * stride * sizeof *work);
  if (!work) return lks_set_error(LKS_ENOMEM, "mla_attention: out of memory");
  mla_job j = {be, lks__cpu_kernels_of(be), out, q, wkv_b, kv, rows, d, sel, n_sel, sel_stride,
               max_keys, work, stride};
  lks_pool_run(pool, nh, mla_task, &j);
  free(work);
  return 0;
}
