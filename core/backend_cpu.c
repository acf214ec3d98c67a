// SPDX-License-Identifier: MIT
// The CPU backend: the reference implementation of every op of backend.h, multithreaded over a
// thread pool and vectorised through cpu_kernels. Matrix products split the weight's output rows
// over the threads, so each thread streams its own part of the weights once per call whatever
// the number of activation rows; with several rows, each weight row is widened to f32 once into
// the thread's scratch and reused for all rows.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/cpu_mla.h"
#include "core/cpu_quant.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threadpool.h"

struct lks_buf {
  void *data;
  size_t bytes;
  bool owned;
};

typedef struct {
  float *p;
  size_t n;  // floats
} scratch;

typedef struct cpu_backend {
  lks_backend base;
  lks_pool *pool;
  int n_threads;
  const lks__cpu_kernels *k;
  const lks__quant_kernels *qk;  // quantized weights (cpu_quant.c)
  scratch *thread_scratch;  // [n_threads], for widened weight rows and attention scores
  scratch work[3];          // owner-thread buffers for the expert op
} cpu_backend;

static int grow(scratch *s, size_t n) {
  if (s->n >= n) return 0;
  float *p = realloc(s->p, n * sizeof *p);
  if (!p) return lks_set_error(LKS_ENOMEM, "cpu backend: cannot allocate %zu floats", n);
  s->p = p;
  s->n = n;
  return 0;
}

static int grow_thread_scratch(cpu_backend *c, size_t n) {
  for (int t = 0; t < c->n_threads; t++) LKS_TRY(grow(&c->thread_scratch[t], n));
  return 0;
}

static void *ptr(lks_tensor t) { return (char *)t.buf->data + t.offset; }
static float *row_f32(lks_tensor t, int64_t r) { return (float *)ptr(t) + r * t.ld; }

// ---- memory ----

static lks_buf *cpu_buf_alloc(lks_backend *be, size_t bytes) {
  (void)be;
  lks_buf *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->data = calloc(1, bytes ? bytes : 1);
  if (!b->data) {
    free(b);
    lks_set_error(LKS_ENOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    return NULL;
  }
  b->bytes = bytes;
  b->owned = true;
  return b;
}

static lks_buf *cpu_buf_wrap_host(lks_backend *be, const void *host, size_t bytes) {
  (void)be;
  lks_buf *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->data = (void *)host;  // read-only by contract: no op writes to a wrapped buffer
  b->bytes = bytes;
  return b;
}

static lks_buf *cpu_buf_wrap_host_2d(lks_backend *be, const void *host, int64_t rows,
                                     size_t row_bytes, size_t stride_bytes, size_t *ld_bytes) {
  *ld_bytes = stride_bytes;
  size_t span = rows > 0 ? (size_t)(rows - 1) * stride_bytes + row_bytes : 0;
  return cpu_buf_wrap_host(be, host, span);
}

static void *cpu_buf_ptr(lks_backend *be, lks_buf *b) {
  (void)be;
  return b->data;
}

static int cpu_zero(lks_backend *be, lks_tensor t) {
  (void)be;
  for (int64_t r = 0; r < t.rows; r++) memset(row_f32(t, r), 0, (size_t)t.cols * sizeof(float));
  return 0;
}

static void cpu_buf_free(lks_backend *be, lks_buf *b) {
  (void)be;
  if (!b) return;
  if (b->owned) free(b->data);
  free(b);
}

static int cpu_to_host(lks_backend *be, void *dst, const lks_buf *src, size_t off, size_t n) {
  (void)be;
  if (off > src->bytes || n > src->bytes - off)
    return lks_set_error(LKS_ERANGE, "to_host: range [%zu, +%zu) outside a %zu-byte buffer", off,
                         n, src->bytes);
  memcpy(dst, (const char *)src->data + off, n);
  return 0;
}

static int cpu_from_host(lks_backend *be, lks_buf *dst, size_t off, const void *src, size_t n) {
  (void)be;
  if (!dst->owned || off > dst->bytes || n > dst->bytes - off)
    return lks_set_error(LKS_ERANGE, "from_host: range [%zu, +%zu) outside a writable buffer",
                         off, n);
  memcpy((char *)dst->data + off, src, n);
  return 0;
}

// ---- element-wise ops ----

static void load_row_f32(lks_tensor t, int64_t r, float *dst) {
  const char *p = (const char *)ptr(t) + (size_t)(r * t.ld) * lks_dtype_size(t.dtype);
  switch (t.dtype) {
    case LKS_F32:
      memcpy(dst, p, (size_t)t.cols * 4);
      break;
    case LKS_BF16:
      for (int64_t i = 0; i < t.cols; i++) dst[i] = lks_bf16_to_f32(((const uint16_t *)p)[i]);
      break;
    case LKS_F16:
      for (int64_t i = 0; i < t.cols; i++) dst[i] = lks_f16_to_f32(((const uint16_t *)p)[i]);
      break;
    default:
      memset(dst, 0, (size_t)t.cols * 4);
  }
}

static int cpu_embed(lks_backend *be, lks_tensor out, lks_tensor table, const int32_t *ids) {
  (void)be;
  for (int64_t i = 0; i < out.rows; i++) {
    if (ids[i] < 0 || ids[i] >= table.rows)
      return lks_set_error(LKS_ERANGE, "token id %d outside the vocabulary [0, %lld)", ids[i],
                           (long long)table.rows);
    load_row_f32(table, ids[i], row_f32(out, i));
  }
  return 0;
}

static int cpu_rmsnorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, float eps) {
  cpu_backend *c = (cpu_backend *)be;
  LKS_TRY(grow(&c->work[0], (size_t)w.cols));
  float *wf = c->work[0].p;
  load_row_f32(w, 0, wf);
  for (int64_t r = 0; r < x.rows; r++) {
    const float *xr = row_f32(x, r);
    float *o = row_f32(out, r);
    double ss = 0;
    for (int64_t i = 0; i < x.cols; i++) ss += (double)xr[i] * xr[i];
    float inv = (float)(1.0 / sqrt(ss / (double)x.cols + eps));
    for (int64_t i = 0; i < x.cols; i++) o[i] = wf[i] * (xr[i] * inv);
  }
  return 0;
}

static int cpu_rope(lks_backend *be, lks_tensor x, int head_dim, int rot, float theta,
                    lks_rope_layout layout, const int32_t *pos) {
  (void)be;
  int heads = (int)(x.cols / head_dim);
  int half = rot / 2;
  for (int64_t r = 0; r < x.rows; r++) {
    float *xr = row_f32(x, r);
    for (int j = 0; j < half; j++) {
      double freq = pow((double)theta, -2.0 * j / rot);
      double ang = (double)pos[r] * freq;
      float cs = (float)cos(ang), sn = (float)sin(ang);
      for (int h = 0; h < heads; h++) {
        float *v = xr + h * head_dim;
        int a = layout == LKS_ROPE_HALF_SPLIT ? j : 2 * j;
        int b = layout == LKS_ROPE_HALF_SPLIT ? j + half : 2 * j + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs - x1 * sn;
        v[b] = x1 * cs + x0 * sn;
      }
    }
  }
  return 0;
}

static int cpu_gather_rows(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows) {
  (void)be;
  for (int64_t i = 0; i < out.rows; i++)
    memcpy(row_f32(out, i), row_f32(x, rows[i]), (size_t)x.cols * sizeof(float));
  return 0;
}

static int cpu_argmax(lks_backend *be, lks_tensor x, int32_t *idx, float *val) {
  (void)be;
  for (int64_t r = 0; r < x.rows; r++) {
    const float *xr = row_f32(x, r);
    int64_t best = 0;
    for (int64_t i = 1; i < x.cols; i++)
      if (xr[i] > xr[best]) best = i;
    idx[r] = (int32_t)best;
    if (val) val[r] = xr[best];
  }
  return 0;
}

// ---- matrix products ----

// One parallel product job: up to two weights sharing the same input rows (gate and up of an
// expert run as one job, so a decode step pays one dispatch for both).
typedef struct {
  cpu_backend *c;
  const float *x;  // [n, K], row stride ldx
  int64_t ldx, n, K;
  int n_mats;
  struct {
    lks_tensor w;
    const float *bias;  // [M] or NULL
    float *out;         // [n, M], row stride ldo
    int64_t ldo;
  } m[2];
  bool accumulate;
  int64_t rows_per_task;
  int tasks_per_mat;
} mm_job;

static void mm_task(void *ctx, int task, int thread) {
  mm_job *j = ctx;
  int mi = task / j->tasks_per_mat;
  int64_t r0 = (int64_t)(task % j->tasks_per_mat) * j->rows_per_task;
  lks_tensor w = j->m[mi].w;
  int64_t r1 = r0 + j->rows_per_task < w.rows ? r0 + j->rows_per_task : w.rows;
  if (w.qs != LKS_Q_NONE) {
    lks__qweight q = {w.qs, (const uint8_t *)ptr(w), w.ld,
                      (const char *)w.sbuf->data + w.soff, w.sld, w.qglobal, w.rows, w.cols};
    lks__quant_matmul_rows(j->c->qk, &q, r0, r1, j->x, j->ldx, j->n, j->m[mi].bias,
                           j->m[mi].out, j->m[mi].ldo, j->accumulate);
    return;
  }
  size_t es = lks_dtype_size(w.dtype);
  const char *wbase = (const char *)ptr(w);
  float *wide = j->c->thread_scratch[thread].p;
  for (int64_t r = r0; r < r1; r++) {
    const void *wr = wbase + (size_t)(r * w.ld) * es;
    float b = j->m[mi].bias ? j->m[mi].bias[r] : 0.0f;
    // Few rows, BF16 or F32: dot straight from the weights (the row stays in L1 across the
    // rows). Otherwise widen the row once and reuse it.
    bool direct = w.dtype == LKS_F32 || (w.dtype == LKS_BF16 && j->n <= 32);
    const float *wf = wr;
    if (!direct) {
      if (w.dtype == LKS_BF16)
        for (int64_t i = 0; i < j->K; i++) wide[i] = lks_bf16_to_f32(((const uint16_t *)wr)[i]);
      else
        for (int64_t i = 0; i < j->K; i++) wide[i] = lks_f16_to_f32(((const uint16_t *)wr)[i]);
      wf = wide;
    }
    for (int64_t t = 0; t < j->n; t++) {
      const float *xt = j->x + t * j->ldx;
      float d = (direct && w.dtype == LKS_BF16) ? j->c->k->dot_bf16(wr, xt, j->K)
                                                 : j->c->k->dot_f32(wf, xt, j->K);
      float *o = j->m[mi].out + t * j->m[mi].ldo + r;
      *o = j->accumulate ? *o + d + b : d + b;
    }
  }
}

static int mm_run(mm_job *j) {
  cpu_backend *c = j->c;
  LKS_TRY(grow_thread_scratch(c, (size_t)j->K));
  int64_t M = j->m[0].w.rows;
  // About 8 tasks per thread balance uneven progress; at least 16 rows keep tasks worth a claim.
  int64_t per = M / ((int64_t)c->n_threads * 8);
  j->rows_per_task = per < 16 ? 16 : per;
  j->tasks_per_mat = (int)((M + j->rows_per_task - 1) / j->rows_per_task);
  lks_pool_run(c->pool, j->tasks_per_mat * j->n_mats, mm_task, j);
  return 0;
}

static int cpu_matmul(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w,
                      lks_tensor bias, bool accumulate) {
  cpu_backend *c = (cpu_backend *)be;
  LKS_TRY(lks_matmul_check(out, x, w));
  float *bf = NULL;
  if (bias.buf) {
    LKS_TRY(grow(&c->work[2], (size_t)bias.cols));
    bf = c->work[2].p;
    load_row_f32(bias, 0, bf);
  }
  mm_job j = {.c = c, .x = ptr(x), .ldx = x.ld, .n = x.rows, .K = x.cols, .n_mats = 1,
              .accumulate = accumulate};
  j.m[0].w = w;
  j.m[0].bias = bf;
  j.m[0].out = ptr(out);
  j.m[0].ldo = out.ld;
  return mm_run(&j);
}

// ---- attention ----

typedef struct {
  cpu_backend *c;
  lks_tensor out, q;
  const lks_kv_layer *kv;
  const lks_attn_rows *rows;
  int n_heads;
  float scale;
} attn_job;

static void attn_task(void *ctx, int task, int thread) {
  attn_job *j = ctx;
  const lks_kv_layer *kv = j->kv;
  int row = task / j->n_heads, h = task % j->n_heads;
  int hd = kv->head_dim, kvh = h / (j->n_heads / kv->n_kv_heads);
  int64_t kv_ld = (int64_t)kv->n_kv_heads * hd;
  const float *q = row_f32(j->q, row) + h * hd;
  float *o = row_f32(j->out, row) + h * hd;
  const float *K = kv->k->data, *V = kv->v->data;
  const int32_t *bt = j->rows->block_table + (size_t)j->rows->seq[row] * j->rows->max_blocks;
  int n_pos = j->rows->pos[row] + 1;
  float *s = j->c->thread_scratch[thread].p;
  float mx = -INFINITY;
  for (int p = 0; p < n_pos; p++) {
    int64_t slot = (int64_t)bt[p / kv->block_size] * kv->block_size + p % kv->block_size;
    s[p] = j->c->k->dot_f32(K + slot * kv_ld + kvh * hd, q, hd) * j->scale;
    if (s[p] > mx) mx = s[p];
  }
  float sum = 0;
  for (int p = 0; p < n_pos; p++) {
    s[p] = expf(s[p] - mx);
    sum += s[p];
  }
  for (int d = 0; d < hd; d++) o[d] = 0;
  for (int p = 0; p < n_pos; p++) {
    int64_t slot = (int64_t)bt[p / kv->block_size] * kv->block_size + p % kv->block_size;
    const float *v = V + slot * kv_ld + kvh * hd;
    float w = s[p] / sum;
    for (int d = 0; d < hd; d++) o[d] += w * v[d];
  }
}

static int cpu_kv_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor k, lks_tensor v,
                        const lks_attn_rows *rows) {
  (void)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
  for (int i = 0; i < rows->n; i++) {
    memcpy((float *)kv->k->data + (size_t)rows->slot[i] * w, row_f32(k, i), w * sizeof(float));
    memcpy((float *)kv->v->data + (size_t)rows->slot[i] * w, row_f32(v, i), w * sizeof(float));
  }
  return 0;
}

static int cpu_attention(lks_backend *be, lks_tensor out, lks_tensor q, const lks_kv_layer *kv,
                         const lks_attn_rows *rows, int n_heads, float scale) {
  cpu_backend *c = (cpu_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  int max_pos = 0;
  for (int i = 0; i < rows->n; i++)
    if (rows->pos[i] > max_pos) max_pos = rows->pos[i];
  LKS_TRY(grow_thread_scratch(c, (size_t)max_pos + 1));
  attn_job j = {c, out, q, kv, rows, n_heads, scale};
  lks_pool_run(c->pool, rows->n * n_heads, attn_task, &j);
  return 0;
}

// ---- MoE ----

static int cpu_route(lks_backend *be, lks_tensor logits, lks_tensor bias,
                     const lks_route_params *p, int32_t *ids, float *weights) {
  cpu_backend *c = (cpu_backend *)be;
  int E = p->n_experts;
  LKS_TRY(grow(&c->work[0], (size_t)E * 3));
  float *s = c->work[0].p, *sel = s + E, *bf = s + 2 * E;
  load_row_f32(bias, 0, bf);
  int per_group = E / p->n_group;
  for (int64_t r = 0; r < logits.rows; r++) {
    const float *l = row_f32(logits, r);
    for (int e = 0; e < E; e++) {
      s[e] = 1.0f / (1.0f + expf(-l[e]));
      sel[e] = s[e] + bf[e];
    }
    if (p->n_group > 1) {
      // Group score: the sum of the group's two best selection scores; keep topk_group groups.
      float gscore[256];
      bool keep[256] = {false};
      for (int g = 0; g < p->n_group; g++) {
        float a = -INFINITY, b = -INFINITY;
        for (int e = g * per_group; e < (g + 1) * per_group; e++) {
          if (sel[e] > a) {
            b = a;
            a = sel[e];
          } else if (sel[e] > b) {
            b = sel[e];
          }
        }
        gscore[g] = per_group > 1 ? a + b : a;
      }
      for (int k = 0; k < p->topk_group; k++) {
        int best = -1;
        for (int g = 0; g < p->n_group; g++)
          if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        keep[best] = true;
      }
      for (int e = 0; e < E; e++)
        if (!keep[e / per_group]) sel[e] = -INFINITY;
    }
    int32_t *id = ids + r * p->top_k;
    float *w = weights + r * p->top_k;
    float sum = 0;
    for (int k = 0; k < p->top_k; k++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int q = 0; q < k; q++) taken |= id[q] == e;
        if (!taken && (best < 0 || sel[e] > sel[best])) best = e;
      }
      id[k] = best;
      w[k] = s[best];
      sum += w[k];
    }
    for (int k = 0; k < p->top_k; k++) {
      if (p->norm_topk_prob) w[k] /= sum + 1e-20f;
      w[k] *= p->scaling;
    }
  }
  return 0;
}

static int cpu_expert(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows,
                      const float *weights, int n, lks_tensor gate, lks_tensor up,
                      lks_tensor down) {
  cpu_backend *c = (cpu_backend *)be;
  int64_t H = x.cols, I = gate.rows;
  LKS_TRY(lks_weight_check(gate, H));
  LKS_TRY(lks_weight_check(up, H));
  LKS_TRY(lks_weight_check(down, I));
  if (up.rows != I || down.rows != out.cols)
    return lks_set_error(LKS_ESHAPE, "expert: gate/up/down shapes disagree");
  // Gather the rows (decode: one row, a copy of H floats).
  const float *xin = ptr(x);
  int64_t ldx = x.ld;
  if (rows) {
    LKS_TRY(grow(&c->work[0], (size_t)n * H));
    for (int i = 0; i < n; i++) memcpy(c->work[0].p + i * H, row_f32(x, rows[i]), H * 4);
    xin = c->work[0].p;
    ldx = H;
  }
  LKS_TRY(grow(&c->work[1], (size_t)n * (2 * I + out.cols)));
  float *g = c->work[1].p, *u = g + n * I, *d = u + n * I;
  mm_job j = {.c = c, .x = xin, .ldx = ldx, .n = n, .K = H, .n_mats = 2};
  j.m[0].w = gate;
  j.m[0].out = g;
  j.m[0].ldo = I;
  j.m[1].w = up;
  j.m[1].out = u;
  j.m[1].ldo = I;
  LKS_TRY(mm_run(&j));
  for (int64_t i = 0; i < n * I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  mm_job jd = {.c = c, .x = g, .ldx = I, .n = n, .K = I, .n_mats = 1};
  jd.m[0].w = down;
  jd.m[0].out = d;
  jd.m[0].ldo = out.cols;
  LKS_TRY(mm_run(&jd));
  for (int i = 0; i < n; i++) {
    float *o = row_f32(out, rows ? rows[i] : i);
    float w = weights ? weights[i] : 1.0f;
    const float *di = d + (int64_t)i * out.cols;
    for (int64_t k = 0; k < out.cols; k++) o[k] += w * di[k];
  }
  return 0;
}

// ---- lifetime ----

static void cpu_free(lks_backend *be) {
  cpu_backend *c = (cpu_backend *)be;
  lks_pool_free(c->pool);
  for (int t = 0; c->thread_scratch && t < c->n_threads; t++) free(c->thread_scratch[t].p);
  free(c->thread_scratch);
  for (int i = 0; i < 3; i++) free(c->work[i].p);
  free(c);
}

static const lks_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .buf_alloc = cpu_buf_alloc,
    .buf_wrap_host = cpu_buf_wrap_host,
    .buf_wrap_host_2d = cpu_buf_wrap_host_2d,
    .buf_ptr = cpu_buf_ptr,
    .buf_free = cpu_buf_free,
    .zero = cpu_zero,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .route = cpu_route,
    .expert = cpu_expert,
    .gather_rows = cpu_gather_rows,
    .argmax = cpu_argmax,
    .layernorm = lks__cpu_layernorm,
    .cache_store = lks__cpu_cache_store,
    .dsa_select = lks__cpu_dsa_select,
    .mla_attention = lks__cpu_mla_attention,
};

lks_pool *lks__cpu_pool(lks_backend *be) { return ((cpu_backend *)be)->pool; }
const lks__cpu_kernels *lks__cpu_kernels_of(lks_backend *be) { return ((cpu_backend *)be)->k; }

lks_backend *lks__backend_cpu_new(int threads) {
  if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (threads <= 0) threads = 1;
  cpu_backend *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->base.ops = &cpu_ops;
  c->n_threads = threads;
  c->k = lks__cpu_kernels_best();
  c->qk = lks__quant_kernels_best();
  c->thread_scratch = calloc((size_t)threads, sizeof *c->thread_scratch);
  c->pool = lks_pool_new(threads);
  if (!c->thread_scratch || !c->pool) {
    lks_set_error(LKS_ENOMEM, "cpu backend: cannot start %d threads", threads);
    cpu_free(&c->base);
    return NULL;
  }
  LKS_LOG(LKS_LOG_INFO, "cpu backend: %d threads, %s kernels", threads, c->k->name);
  return &c->base;
}
