// SPDX-License-Identifier: MIT
// The CPU backend: the reference implementation of every op of backend.h, multithreaded over a
// thread pool and vectorised through cpu_kernels. Matrix products split the weight's output rows
// over the threads, so each thread streams its own part of the weights once per call whatever
// the number of activation rows, through register-blocked kernels that reuse each loaded weight
// chunk for several rows. A MoE layer's experts run as two parallel phases in all.
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/cpu_math.h"
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
  scratch work[3];          // owner-thread buffers: the expert op's (0, 1), split x (2)
  lks_host_weights host;    // how buf_wrap_host takes host memory (lks_backend_cpu_host_weights)
  bool check_exp0;          // LKS_CHECK_EXP0=1: each quantized product checks its flags
  struct {  // the rotation of the last position cpu_rope computed (rope_angles)
    float theta;
    int rot;
    int32_t pos;  // -1: none
    scratch buf;  // cos of the rot / 2 pairs, then their sin
  } rope;
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

// A copy of `rows` runs of row_bytes, stride_bytes apart, packed (LKS_HOST_COPY, column slices).
static lks_buf *copy_rows(const void *host, int64_t rows, size_t row_bytes, size_t stride_bytes) {
  lks_buf *b = calloc(1, sizeof *b);
  size_t bytes = (size_t)rows * row_bytes;
  void *p = b ? malloc(bytes ? bytes : 1) : NULL;
  if (!p) {
    free(b);
    lks_set_error(LKS_ENOMEM, "cpu backend: cannot allocate %zu bytes for a copy of weights",
                  bytes);
    return NULL;
  }
  for (int64_t r = 0; r < rows; r++)
    memcpy((char *)p + (size_t)r * row_bytes, (const char *)host + (size_t)r * stride_bytes,
           row_bytes);
  b->data = p;
  b->bytes = bytes;
  b->owned = true;
  return b;
}

static lks_buf *cpu_buf_wrap_host(lks_backend *be, const void *host, size_t bytes) {
  if (((cpu_backend *)be)->host == LKS_HOST_COPY) return copy_rows(host, 1, bytes, bytes);
  lks_buf *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->data = (void *)host;  // read-only by contract: no op writes to a wrapped buffer
  b->bytes = bytes;
  return b;
}

// A column slice (stride_bytes over row_bytes) is packed unless the weights are only inspected:
// read in place, each row's slice shares its cache lines and the hardware's streams with the
// columns of the other ranks, which the decode then fetches for nothing (air-1g at world 2,
// --experts-split rows, whose experts' down products are half of each row: rank 0's compute a
// decode step 13.4-14.6 ms mapped against 12.2-12.6 copied, 2026-12-07).
static lks_buf *cpu_buf_wrap_host_2d(lks_backend *be, const void *host, int64_t rows,
                                     size_t row_bytes, size_t stride_bytes, size_t *ld_bytes) {
  lks_host_weights how = ((cpu_backend *)be)->host;
  if (how == LKS_HOST_COPY || (how == LKS_HOST_PACK_SLICES && stride_bytes != row_bytes)) {
    *ld_bytes = row_bytes;
    return copy_rows(host, rows, row_bytes, stride_bytes);
  }
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

// Columns [c0, c1) of row r of t as f32.
static void load_f32(lks_tensor t, int64_t r, int64_t c0, int64_t c1, float *dst) {
  const size_t es = lks_dtype_size(t.dtype);
  const char *p = (const char *)ptr(t) + (size_t)(r * t.ld + c0) * es;
  const int64_t n = c1 - c0;
  switch (t.dtype) {
    case LKS_F32:
      memcpy(dst, p, (size_t)n * 4);
      break;
    case LKS_BF16:
      for (int64_t i = 0; i < n; i++) dst[i] = lks_bf16_to_f32(((const uint16_t *)p)[i]);
      break;
    case LKS_F16:
      for (int64_t i = 0; i < n; i++) dst[i] = lks_f16_to_f32(((const uint16_t *)p)[i]);
      break;
    default:
      memset(dst, 0, (size_t)n * 4);
  }
}

static void load_row_f32(lks_tensor t, int64_t r, float *dst) { load_f32(t, r, 0, t.cols, dst); }

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

// The sum of squares in double, in 8 running sums (column i in sum i % 8) added pairwise at the
// end: one sum had each add wait on the last (perf: cpu_rmsnorm 0.27 % of air-1g NVFP4 decode
// at 2 threads, 25 rows of 1024 a token, about 1.2 us a row; 0.24 % after, with the weight's
// conversion).
static int cpu_rmsnorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, float eps) {
  cpu_backend *c = (cpu_backend *)be;
  LKS_TRY(grow(&c->work[0], (size_t)w.cols));
  float *wf = c->work[0].p;
  load_row_f32(w, 0, wf);
  for (int64_t r = 0; r < x.rows; r++) {
    const float *xr = row_f32(x, r);
    float *o = row_f32(out, r);
    double ss[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= x.cols; i += 8)
      for (int k = 0; k < 8; k++) ss[k] += (double)xr[i + k] * xr[i + k];
    for (int k = 0; i < x.cols; i++, k++) ss[k] += (double)xr[i] * xr[i];
    double sum = ((ss[0] + ss[4]) + (ss[2] + ss[6])) + ((ss[1] + ss[5]) + (ss[3] + ss[7]));
    float inv = (float)(1.0 / sqrt(sum / (double)x.cols + eps));
    for (i = 0; i < x.cols; i++) o[i] = wf[i] * (xr[i] * inv);
  }
  return 0;
}

// The rotation of position p, pair j by p * theta^(-2j / rot) radians: cos and sin of the
// rot / 2 pairs, cached for the next call of the same position (all but the first of a decoded
// token's 2 x layers calls, each of which computed its rot / 2 powers, cosines and sines).
static int rope_angles(cpu_backend *c, float theta, int rot, int32_t p) {
  if (c->rope.pos == p && c->rope.theta == theta && c->rope.rot == rot) return 0;
  LKS_TRY(grow(&c->rope.buf, (size_t)rot));
  for (int j = 0; j < rot / 2; j++) {
    double ang = (double)p * pow((double)theta, -2.0 * j / rot);
    c->rope.buf.p[j] = (float)cos(ang);
    c->rope.buf.p[rot / 2 + j] = (float)sin(ang);
  }
  c->rope.theta = theta, c->rope.rot = rot, c->rope.pos = p;
  return 0;
}

static int cpu_rope(lks_backend *be, lks_tensor x, int head_dim, int rot, float theta,
                    lks_rope_layout layout, const int32_t *pos) {
  cpu_backend *c = (cpu_backend *)be;
  int heads = (int)(x.cols / head_dim);
  int half = rot / 2;
  for (int64_t r = 0; r < x.rows; r++) {
    float *xr = row_f32(x, r);
    LKS_TRY(rope_angles(c, theta, rot, pos[r]));
    for (int j = 0; j < half; j++) {
      float cs = c->rope.buf.p[j], sn = c->rope.buf.p[half + j];
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

// Weight rows widened from F16 at a time: F16 has no kernel of its own; widening is exact, so
// the products are those of the F32 kernel.
enum { F16_ROWS = 8 };

// Floats of scratch a product over rows of K needs besides its tile: the widened F16 rows, or
// (BF16 weights) the kernel level's own, the amx level's prepared activations.
static size_t aux_floats(const cpu_backend *c, int64_t K) {
  size_t kf = c->k->mm_scratch ? (c->k->mm_scratch(K) + sizeof(float) - 1) / sizeof(float) : 0;
  size_t f16 = (size_t)(F16_ROWS * K);
  return f16 > kf ? f16 : kf;
}

// tile[t * ldt + (r - r0)] = dot(w row r, x row t) for r in [r0, r1), t < n: the kernels for
// F32 and BF16, F16 through a widened copy. `wide` holds aux_floats(c, K) floats. Each element is
// summed in the kernel level's one order, whatever r0, r1 and n (batch invariance).
// xs (NULL: none): decode's x already split for w's format (lks__quant_split), which a
// quantized w's product reads in place of splitting x itself.
// next (NULL: not known): the weight whose rows [nr0, nr1) the thread reads next, a hint that
// decode uses to fetch them ahead (quantized: lks__qweight.next; BF16 and F32 where the level
// streams rows one at a time: lks__mv_fn's after).
// LKS_CHECK_EXP0=1 (the tests of quantized models set it): the exponent-0 flags a product's
// rows carry (model.c computes them as it loads and slices a weight, lks_tensor_rows moves
// them with a view) are those of the rows' bytes, else the process stops saying which. A wrong
// flag would send a chunk of zero or subnormal codes down the kernels' common path, a few
// weights each off by about 2^-7 of the block's scale: too little for a model's logits to show.
static void check_exp0(lks_tensor w, int64_t r0, int64_t r1) {
  const int64_t nc = lks_e4m3_chunks(w.cols);
  const uint8_t *fl = (const uint8_t *)w.sbuf->data + w.foff;
  uint8_t want[512];
  for (int64_t r = r0; r < r1 && nc <= (int64_t)sizeof want; r++) {
    lks_qweight_exp0_chunks(w.qs == LKS_Q_NVFP4, (const uint8_t *)ptr(w) + r * w.ld, w.ld,
                            (const uint8_t *)w.sbuf->data + w.soff + r * w.sld, w.sld, 1, w.cols,
                            want);
    if (memcmp(want, fl + r * nc, (size_t)nc) != 0) {
      LKS_LOG(LKS_LOG_ERROR, "LKS_CHECK_EXP0: a %lld x %lld weight's row %lld has wrong flags",
              (long long)w.rows, (long long)w.cols, (long long)r);
      abort();
    }
  }
}

static void mm_tile(const cpu_backend *c, lks_tensor w, int64_t r0, int64_t r1, const float *x,
                    const float *xs, int64_t ldx, int64_t n, float *tile, int64_t ldt,
                    float *wide, const lks_tensor *next, int64_t nr0, int64_t nr1) {
  const lks__cpu_kernels *k = c->k;
  if (w.qs != LKS_Q_NONE) {  // quantized: dequantized in registers (cpu_quant.c), tile[t][r - r0]
    if (c->check_exp0 && w.foff) check_exp0(w, r0, r1);
    lks__qweight q = {.qs = w.qs, .codes = (const uint8_t *)ptr(w), .ld = w.ld,
                      .scales = (const char *)w.sbuf->data + w.soff, .sld = w.sld,
                      .global = w.qglobal, .rows = w.rows, .cols = w.cols,
                      .exp0 = w.foff ? (const uint8_t *)w.sbuf->data + w.foff : NULL};
    if (next && next->qs == w.qs && next->ld == w.ld && nr0 < nr1) {
      q.next = (const uint8_t *)ptr(*next) + nr0 * next->ld;
      q.next_rows = nr1 - nr0;
    }
    if (xs) lks__quant_mv(c->qk, &q, r0, r1, xs, tile - r0);
    else lks__quant_matmul_rows(c->qk, &q, r0, r1, x, ldx, n, tile - r0, ldt);
    return;
  }
  int64_t K = w.cols;
  const char *wb = (const char *)ptr(w) + (size_t)(r0 * w.ld) * lks_dtype_size(w.dtype);
  lks__mv_fn mv = w.dtype == LKS_BF16 ? k->mv_bf16 : w.dtype == LKS_F32 ? k->mv_f32 : NULL;
  if (n == 1 && mv) {  // decode: the fetch ahead goes on into the rows read next
    bool same = next && next->qs == LKS_Q_NONE && next->dtype == w.dtype && next->ld == w.ld;
    const char *after = same && nr0 < nr1 ? (const char *)ptr(*next) +
                                                (size_t)(nr0 * next->ld) * lks_dtype_size(w.dtype)
                                          : NULL;
    mv(wb, w.ld, r1 - r0, x, K, tile, after, after ? nr1 - nr0 : 0);
  } else if (w.dtype == LKS_BF16) {
    k->mm_bf16(wb, w.ld, r1 - r0, x, ldx, n, K, tile, ldt, wide);
  } else if (w.dtype == LKS_F32) {
    k->mm_f32(wb, w.ld, r1 - r0, x, ldx, n, K, tile, ldt, NULL);
  } else {
    for (int64_t r = r0; r < r1; r += F16_ROWS) {
      int64_t m = r1 - r < F16_ROWS ? r1 - r : F16_ROWS;
      for (int64_t i = 0; i < m; i++) {
        const uint16_t *src = (const uint16_t *)ptr(w) + (size_t)((r + i) * w.ld);
        for (int64_t c = 0; c < K; c++) wide[i * K + c] = lks_f16_to_f32(src[c]);
      }
      k->mm_f32(wide, K, m, x, ldx, n, K, tile + (r - r0), ldt, NULL);
    }
  }
}

// p rounded up to a multiple of 64 bytes: each of a split row's vectors in one cache line (the
// products' loads of x that crossed a line ran 35-50 % slower: cpu_quant.c, split_alloc).
static float *align64(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

// Floats of decode's activation row split for w (lks__quant_split), rounded up to 64 bytes, or
// 0 where nothing is split (not one row, not quantized, or a level without the format's grid;
// each task's product then splits x itself). A job splits x once for all its tasks of w's
// format: air-1g NVFP4 decode at 2 threads split its rows about 1,400 times a token when each
// task split it, 1.3 % of its time.
static int64_t split_len(const cpu_backend *c, lks_tensor w, int64_t n, int64_t K) {
  int64_t sl = n == 1 && w.qs != LKS_Q_NONE ? lks__quant_split_len(c->qk, w.qs, K) : 0;
  return sl > 0 ? (sl + 15) / 16 * 16 : 0;
}

// Output rows of the weight per task: about 8 tasks per thread balance uneven progress; at
// least 16 rows keep a task worth a claim; a multiple of 8, the kernels' block.
static int64_t rows_per_task(const cpu_backend *c, int64_t rows) {
  int64_t per = rows / ((int64_t)c->n_threads * 8);
  per = per < 16 ? 16 : (per + 7) / 8 * 8;
  return per;
}

// Scratch per thread for a task of `rows` weight rows over n activation rows of K: the tile,
// and aux_floats.
static int grow_mm_scratch(cpu_backend *c, int64_t rows, int64_t n, int64_t K) {
  return grow_thread_scratch(c, (size_t)(rows * n) + aux_floats(c, K));
}

// One product of a job: tasks [task0, task0 + its tasks) of `per` weight rows each.
typedef struct {
  lks_tensor w;
  lks_tensor bias;  // [1, M] (buf NULL: none), converted to f32 by each task for its rows
  float *out;       // [n, M], row stride ldo
  int64_t ldo;
  const float *xs;  // x split for w (lks__quant_split), or NULL
  int task0;
} mm_part;

// Products of one x in one job (cpu_matmul: one; cpu_matmuls: q, k and v, ...), every task
// `per` rows of one part's weight.
typedef struct {
  cpu_backend *c;
  const float *x;  // [n, K], row stride ldx
  int64_t ldx, n;
  bool accumulate;
  int64_t per;  // weight rows per task
  int n_parts;
  mm_part part[LKS_MATMULS_MAX + 1];  // part[n_parts].task0: the job's tasks
} mm_job;

// The part of task `task` and the rows [*r0, *r1) of its weight.
static const mm_part *mm_rows(const mm_job *j, int task, int64_t *r0, int64_t *r1) {
  int p = 0;
  while (task >= j->part[p + 1].task0) p++;
  const mm_part *mp = &j->part[p];
  *r0 = (int64_t)(task - mp->task0) * j->per;
  *r1 = *r0 + j->per < mp->w.rows ? *r0 + j->per : mp->w.rows;
  return mp;
}

static void mm_task(void *ctx, int task, int thread) {
  mm_job *j = ctx;
  int64_t r0, r1, n0 = 0, n1 = 0;
  const mm_part *mp = mm_rows(j, task, &r0, &r1), *np = NULL;
  int64_t m = r1 - r0;
  float *tile = j->c->thread_scratch[thread].p, *wide = tile + j->per * j->n;
  // The thread's next task, unless another thread takes it: thread t's share of a job's tasks
  // is t, t + n_threads, ... (threadpool.c).
  int next = task + j->c->n_threads;
  if (next < j->part[j->n_parts].task0) np = mm_rows(j, next, &n0, &n1);
  mm_tile(j->c, mp->w, r0, r1, j->x, mp->xs, j->ldx, j->n, tile, m, wide, np ? &np->w : NULL, n0,
          n1);
  float b[256];
  for (int64_t a = 0; a < m; a += 256) {  // the bias in runs of 256 rows
    const int64_t e = m - a < 256 ? m - a : 256;
    if (mp->bias.buf) load_f32(mp->bias, 0, r0 + a, r0 + a + e, b);
    else memset(b, 0, sizeof b);
    for (int64_t t = 0; t < j->n; t++) {
      float *o = mp->out + t * mp->ldo + r0 + a;
      const float *d = tile + t * m + a;
      for (int64_t r = 0; r < e; r++) o[r] = j->accumulate ? o[r] + d[r] + b[r] : d[r] + b[r];
    }
  }
}

// The job of parts[0 .. n) on x: tasks of one size over all the parts' rows (rows_per_task of
// their sum), x split once for each format (into work[2]; parts of one format share it).
static int mm_run(cpu_backend *c, lks_tensor x, const lks_matmul_part *parts, int n,
                  bool accumulate) {
  mm_job j = {.c = c, .x = ptr(x), .ldx = x.ld, .n = x.rows, .accumulate = accumulate,
              .n_parts = n};
  int64_t total = 0, sl = 0;
  for (int p = 0; p < n; p++) {
    const lks_matmul_part *q = &parts[p];
    LKS_TRY(lks_matmul_check(q->out, x, q->w));
    if (q->bias.buf && q->bias.cols < q->w.rows)
      return lks_set_error(LKS_ESHAPE, "matmul: bias of %lld for %lld rows",
                           (long long)q->bias.cols, (long long)q->w.rows);
    total += q->w.rows;
    sl += split_len(c, q->w, x.rows, x.cols);
  }
  j.per = rows_per_task(c, total);
  LKS_TRY(grow_mm_scratch(c, j.per, j.n, x.cols));
  float *sp = NULL;
  if (sl > 0) {
    LKS_TRY(grow(&c->work[2], (size_t)sl + 16));
    sp = align64(c->work[2].p);
  }
  int tasks = 0;
  for (int p = 0; p < n; p++) {
    mm_part *mp = &j.part[p];
    *mp = (mm_part){.w = parts[p].w, .bias = parts[p].bias, .out = ptr(parts[p].out),
                    .ldo = parts[p].out.ld, .task0 = tasks};
    tasks += (int)((mp->w.rows + j.per - 1) / j.per);
    int64_t l = split_len(c, mp->w, j.n, x.cols);
    for (int e = 0; e < p && l; e++)
      if (j.part[e].xs && j.part[e].w.qs == mp->w.qs) mp->xs = j.part[e].xs;
    if (l && !mp->xs) {
      lks__quant_split(c->qk, mp->w.qs, j.x, x.cols, sp);
      mp->xs = sp;
      sp += l;
    }
  }
  j.part[n].task0 = tasks;
  lks_pool_run(c->pool, tasks, mm_task, &j);
  return 0;
}

static int cpu_matmul(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, lks_tensor bias,
                      bool accumulate) {
  lks_matmul_part one = {out, w, bias};
  return mm_run((cpu_backend *)be, x, &one, 1, accumulate);
}

static int cpu_matmuls(lks_backend *be, lks_tensor x, const lks_matmul_part *parts, int n) {
  if (n < 1 || n > LKS_MATMULS_MAX)
    return lks_set_error(LKS_EINVAL, "matmuls: %d products (1 to %d)", n, LKS_MATMULS_MAX);
  return mm_run((cpu_backend *)be, x, parts, n, false);
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

// The line at p fetched into L2, a hint the compiler keeps: GCC 12 deleted fetch_head_block's
// loop written with __builtin_prefetch (no prefetch was left in the object; nothing in the loop
// is an effect it must keep).
static inline void fetch_l2(const char *p) {
#if defined(__x86_64__)
  __asm__ volatile("prefetcht2 %0" : : "m"(*p));
#elif defined(__aarch64__)
  __asm__ volatile("prfm pldl2keep, %0" : : "Q"(*p));
#else
  __builtin_prefetch(p, 0, 1);
#endif
}

// The first row of block b (of the sequence's block table bt) for one KV head: rows kv_ld elements
// of es bytes apart, the head's hd elements at kvh * hd.
static const char *head_block(const char *pool, const int32_t *bt, int b, int bs, int64_t kv_ld,
                              int kvh, int hd, size_t es) {
  return pool + ((int64_t)bt[b] * bs * kv_ld + (int64_t)kvh * hd) * (int64_t)es;
}

// Block b's rows of one KV head (head_block), the last block's first n_pos % bs only, fetched
// into L2.
// Decode's attention reads the cache from memory (a step's weights pass through the caches
// between one layer's attention and the next token's), and without the fetch its loads waited:
// its arithmetic and its reads took about as long each, one after the other (a model of the
// loops, one thread, 12 layers x 4 KV heads x 2100 positions, hd = 64, F32: 4.8-5.9 ms from
// memory, 2.7 ms from cache, 2.5 ms a plain read of the same bytes). attn_task fetches the block
// KV_FETCH_BLOCKS ahead of the one it reads, K's while it scores and V's while it sums: air-1g
// decode at 2000-2200 positions, steps alternately with and without it in one process (the
// median step of each), F32 cache: BF16 weights x0.93-0.94 (1 thread) and x0.90-0.93 (2), FP8
// x0.93 and x0.90; BF16 cache x0.97 and x0.95; 8-408 positions x0.99 and x0.98. 2, 6 or 8
// blocks ahead did the same as 4; PREFETCHT0 (into L1) was slower than none in the model.
#define KV_FETCH_BLOCKS 4
static void fetch_head_block(const char *pool, const int32_t *bt, int b, int bs, int n_pos,
                             int64_t kv_ld, int kvh, int hd, size_t es) {
  int n = n_pos - b * bs < bs ? n_pos - b * bs : bs;
  const char *r = head_block(pool, bt, b, bs, kv_ld, kvh, hd, es);
  for (int i = 0; i < n; i++, r += kv_ld * (int64_t)es)
    for (int64_t o = 0; o < hd * (int64_t)es; o += 64) fetch_l2(r + o);
}

// One task: one row and one KV head, for all query heads of its group (GQA reads each KV
// head once). Scores come block by block of the cache from the blocked kernel (each score the
// level's one dot order, so a row's result does not depend on its batch); softmax and the
// weighted sum of V follow per query head.
static void attn_task(void *ctx, int task, int thread) {
  attn_job *j = ctx;
  const lks_kv_layer *kv = j->kv;
  int group = j->n_heads / kv->n_kv_heads;
  int row = task / kv->n_kv_heads, kvh = task % kv->n_kv_heads;
  int hd = kv->head_dim, bs = kv->block_size;
  int64_t kv_ld = (int64_t)kv->n_kv_heads * hd;
  const float *q = row_f32(j->q, row) + (int64_t)kvh * group * hd;
  float *o = row_f32(j->out, row) + (int64_t)kvh * group * hd;
  bool bf16 = kv->dtype == LKS_BF16;
  const char *K = kv->k->data, *V = kv->v->data;
  size_t es = bf16 ? 2 : 4;
  const int32_t *bt = j->rows->block_table + (size_t)j->rows->seq[row] * j->rows->max_blocks;
  int n_pos = j->rows->pos[row] + 1, n_blocks = (n_pos + bs - 1) / bs;
  float *s = j->c->thread_scratch[thread].p;  // [group, n_pos]
  lks__mm_fn scores_bf16 = j->c->k->mm_bf16_kv ? j->c->k->mm_bf16_kv : j->c->k->mm_bf16;
  for (int p0 = 0; p0 < n_pos; p0 += bs) {
    int np = n_pos - p0 < bs ? n_pos - p0 : bs;
    const char *kb = head_block(K, bt, p0 / bs, bs, kv_ld, kvh, hd, es);
    if (p0 / bs + KV_FETCH_BLOCKS < n_blocks)
      fetch_head_block(K, bt, p0 / bs + KV_FETCH_BLOCKS, bs, n_pos, kv_ld, kvh, hd, es);
    if (bf16) scores_bf16(kb, kv_ld, np, q, hd, group, hd, s + p0, n_pos, NULL);
    else j->c->k->mm_f32(kb, kv_ld, np, q, hd, group, hd, s + p0, n_pos, NULL);
  }
  for (int g = 0; g < group; g++) lks__softmax_scaled(s + (int64_t)g * n_pos, n_pos, j->scale);
  // The group's outputs (adjacent heads of hd), block by block of V: each V row read once.
  for (int64_t d = 0; d < (int64_t)group * hd; d++) o[d] = 0;
  for (int p0 = 0; p0 < n_pos; p0 += bs) {
    int np = n_pos - p0 < bs ? n_pos - p0 : bs;
    const char *vb = head_block(V, bt, p0 / bs, bs, kv_ld, kvh, hd, es);
    if (p0 / bs + KV_FETCH_BLOCKS < n_blocks)
      fetch_head_block(V, bt, p0 / bs + KV_FETCH_BLOCKS, bs, n_pos, kv_ld, kvh, hd, es);
    if (bf16) j->c->k->pv_bf16(s + p0, n_pos, group, (const uint16_t *)vb, kv_ld, np, hd, o);
    else j->c->k->pv(s + p0, n_pos, group, (const float *)vb, kv_ld, np, hd, o);
  }
}

static int cpu_kv_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor k, lks_tensor v,
                        const lks_attn_rows *rows) {
  (void)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
  for (int i = 0; i < rows->n; i++) {
    if (kv->dtype == LKS_BF16) {  // rounded to nearest even
      uint16_t *kd = (uint16_t *)kv->k->data + (size_t)rows->slot[i] * w;
      uint16_t *vd = (uint16_t *)kv->v->data + (size_t)rows->slot[i] * w;
      const float *ks = row_f32(k, i), *vs = row_f32(v, i);
      for (size_t c = 0; c < w; c++) {
        kd[c] = lks_f32_to_bf16(ks[c]);
        vd[c] = lks_f32_to_bf16(vs[c]);
      }
      continue;
    }
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
  LKS_TRY(grow_thread_scratch(c, (size_t)(max_pos + 1) * (size_t)(n_heads / kv->n_kv_heads)));
  attn_job j = {c, out, q, kv, rows, n_heads, scale};
  lks_pool_run(c->pool, rows->n * kv->n_kv_heads, attn_task, &j);
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

// Several SwiGLU experts in two parallel phases (backend.h, experts). Phase 1: tasks are
// (expert, block of intermediate rows): gate and up of the block for the expert's rows, then
// silu(g) * u into act. Phase 2: tasks are (expert, block of output columns): down of the block
// for the expert's rows into the expert's own d; the task that finishes a block of columns last,
// over all the experts, adds each expert's d of the block in order into out with the row's
// weight (until 2026-12-07 a third phase, a job of its own: a job's start and end cost more than
// its sums). Each row's arithmetic is that of one expert call after another, so the result is
// bitwise that of the expert op called per expert, in order, and does not depend on the batch
// nor on which thread sums a block. A task streams one block of one expert's weight, long
// contiguous rows, rather than a short block of every expert's (air-1g decode, 2 threads, the
// down phase before this: 23 GB/s FP8, 30 BF16).
typedef struct {
  cpu_backend *c;
  lks_tensor out;
  const lks_expert_call *calls;
  int n_calls;
  const float **xin;   // [n_calls]: the expert's input rows, contiguous ([n, H])
  const float **xs;    // [n_calls]: xin split for gate and up (lks__quant_split), or NULL
  int64_t *ldx;        // [n_calls]
  float **act;         // [n_calls]: [n, I]
  float **d;           // [n_calls]: [n, H], down's output
  int *task0;          // [n_calls + 1]: first phase-1 task of each expert
  int *task2;          // [n_calls + 1]: first phase-2 task of each expert
  int64_t per1, per2;  // rows per task of phase 1 (of I) and phase 2 (of H)
  atomic_int *left;    // [blocks of per2 columns]: phase 2's tasks of the block not yet done
  int64_t max_n, H;
} experts_job;

// The expert of task `task` in a phase whose experts start at first[] (first[n_calls]: the end).
static int task_expert(const int *first, int task) {
  int e = 0;
  while (task >= first[e + 1]) e++;
  return e;
}

// What the task n_threads after `task` reads first, in phase 1 (first: task0; gate's rows) or
// phase 2 (task2; down's rows), per rows a task: the thread's next task unless another thread
// takes it (the thread's share of a job is every n_threads-th task). NULL when there is none.
static const lks_tensor *next_rows(const experts_job *j, const int *first, int task, int64_t per,
                                   int64_t *n0, int64_t *n1) {
  int nt = task + j->c->n_threads;
  if (nt >= first[j->n_calls]) return NULL;
  int e = task_expert(first, nt);
  const lks_tensor *w = first == j->task0 ? &j->calls[e].gate : &j->calls[e].down;
  *n0 = (int64_t)(nt - first[e]) * per;
  *n1 = *n0 + per < w->rows ? *n0 + per : w->rows;
  return w;
}

static void experts_up_task(void *ctx, int task, int thread) {
  experts_job *j = ctx;
  int e = task_expert(j->task0, task);
  const lks_expert_call *ec = &j->calls[e];
  int64_t I = ec->gate.rows, n = ec->n;
  int64_t r0 = (int64_t)(task - j->task0[e]) * j->per1;
  int64_t r1 = r0 + j->per1 < I ? r0 + j->per1 : I, m = r1 - r0;
  float *g = j->c->thread_scratch[thread].p, *u = g + j->per1 * j->max_n;
  float *wide = u + j->per1 * j->max_n;
  // What the thread reads next: up's rows after gate's, then the next task's gate rows.
  mm_tile(j->c, ec->gate, r0, r1, j->xin[e], j->xs[e], j->ldx[e], n, g, m, wide, &ec->up, r0,
          r1);
  int64_t n0 = 0, n1 = 0;
  const lks_tensor *next = next_rows(j, j->task0, task, j->per1, &n0, &n1);
  mm_tile(j->c, ec->up, r0, r1, j->xin[e], j->xs[e], j->ldx[e], n, u, m, wide, next, n0, n1);
  for (int64_t t = 0; t < n; t++)  // as a matmul without bias: -0 counts as +0 (cpu_math.h)
    lks__silu_mul(g + t * m, u + t * m, j->act[e] + t * I + r0, m);
}

// Columns [c0, c1) of out: each expert's d added in order with its rows' weights.
static void experts_sum(const experts_job *j, int64_t c0, int64_t c1) {
  for (int e = 0; e < j->n_calls; e++) {
    const lks_expert_call *ec = &j->calls[e];
    for (int64_t t = 0; t < ec->n; t++) {
      float *o = row_f32(j->out, ec->rows ? ec->rows[t] : t);
      float w = ec->weights ? ec->weights[t] : 1.0f;
      const float *dt = j->d[e] + t * j->H;
      for (int64_t k = c0; k < c1; k++) o[k] += w * (dt[k] + 0.0f);
    }
  }
}

static void experts_down_task(void *ctx, int task, int thread) {
  experts_job *j = ctx;
  int e = task_expert(j->task2, task);
  const lks_expert_call *ec = &j->calls[e];
  int64_t c0 = (int64_t)(task - j->task2[e]) * j->per2;
  int64_t c1 = c0 + j->per2 < j->H ? c0 + j->per2 : j->H;
  float *wide = j->c->thread_scratch[thread].p;
  int64_t n0 = 0, n1 = 0;
  const lks_tensor *next = next_rows(j, j->task2, task, j->per2, &n0, &n1);
  mm_tile(j->c, ec->down, c0, c1, j->act[e], NULL, ec->gate.rows, ec->n, j->d[e] + c0, j->H,
          wide, next, n0, n1);
  // The block's last task sums it: acquire and release, so that it reads every expert's d.
  if (atomic_fetch_sub_explicit(&j->left[c0 / j->per2], 1, memory_order_acq_rel) == 1)
    experts_sum(j, c0, c1);
}

// Decode (one row an expert): each expert's input row (xin[e]) split once for its gate and up
// products (lks__quant_split) where the two have one format, into xs[e] (NULL: not split, each
// task splits it); one split serves the experts that read the same row of x in the same format.
static int64_t expert_split_len(const cpu_backend *c, const lks_expert_call *ec, int64_t max_n,
                                int64_t H) {
  bool one = max_n == 1 && ec->n == 1 && ec->gate.qs == ec->up.qs;
  return one ? split_len(c, ec->gate, 1, H) : 0;
}

static int split_inputs(cpu_backend *c, const lks_expert_call *calls, int n_calls, int64_t max_n,
                        int64_t H, const float *const *xin, const float **xs) {
  size_t total = 0;
  for (int e = 0; e < n_calls; e++) {
    xs[e] = NULL;
    total += (size_t)expert_split_len(c, &calls[e], max_n, H);
  }
  if (total == 0) return 0;
  LKS_TRY(grow(&c->work[2], total + 16));  // each split a multiple of 64 bytes (split_len)
  float *p = align64(c->work[2].p);
  for (int e = 0, prev = -1; e < n_calls; e++) {
    const lks_expert_call *ec = &calls[e], *pc = prev >= 0 ? &calls[prev] : NULL;
    int64_t sl = expert_split_len(c, ec, max_n, H);
    if (sl == 0) continue;
    if (pc && pc->gate.qs == ec->gate.qs &&
        (pc->rows ? pc->rows[0] : 0) == (ec->rows ? ec->rows[0] : 0)) {
      xs[e] = xs[prev];
    } else {
      lks__quant_split(c->qk, ec->gate.qs, xin[e], H, p);
      xs[e] = p;
      p += sl;
    }
    prev = e;
  }
  return 0;
}

static int cpu_experts(lks_backend *be, lks_tensor out, lks_tensor x, const lks_expert_call *calls,
                       int n_calls) {
  cpu_backend *c = (cpu_backend *)be;
  int64_t H = x.cols;
  if (n_calls <= 0) return 0;
  if (out.cols != H) return lks_set_error(LKS_ESHAPE, "experts: out and x widths differ");
  // Host arrays and the gathered inputs, activations and down outputs, in work[0] and work[1].
  size_t n_x = 0, n_act = 0, n_d = 0;
  int64_t max_n = 0, max_i = 0, max_k = H;
  for (int e = 0; e < n_calls; e++) {
    const lks_expert_call *ec = &calls[e];
    int64_t I = ec->gate.rows;
    LKS_TRY(lks_weight_check(ec->gate, H));
    LKS_TRY(lks_weight_check(ec->up, H));
    LKS_TRY(lks_weight_check(ec->down, I));
    if (ec->up.rows != I || ec->down.rows != H)
      return lks_set_error(LKS_ESHAPE, "expert: gate/up/down shapes disagree");
    if (ec->n < 0) return lks_set_error(LKS_ESHAPE, "expert: %d rows", ec->n);
    for (int t = 0; ec->rows && t < ec->n; t++)
      if (ec->rows[t] < 0 || ec->rows[t] >= out.rows || ec->rows[t] >= x.rows)
        return lks_set_error(LKS_ERANGE, "expert: row %d outside [0, %lld)", ec->rows[t],
                             (long long)x.rows);
    if (!ec->rows && (ec->n > x.rows || ec->n > out.rows))
      return lks_set_error(LKS_ESHAPE, "expert: %d rows of %lld", ec->n, (long long)x.rows);
    if (ec->rows) n_x += (size_t)(ec->n * H);
    n_act += (size_t)(ec->n * I);
    n_d += (size_t)(ec->n * H);
    if (ec->n > max_n) max_n = ec->n;
    if (I > max_i) max_i = I;
    if (I > max_k) max_k = I;
  }
  if (max_n == 0) return 0;
  // xin, ldx, act, d, xs: 8 bytes an expert; task0, task2: 4 bytes an expert and one more;
  // left: 4 bytes a block of columns (at most H).
  size_t meta_bytes = (size_t)n_calls * 48 + 8 + (size_t)H * sizeof(atomic_int);
  LKS_TRY(grow(&c->work[0], n_x + n_act + n_d));
  LKS_TRY(grow(&c->work[1], meta_bytes / sizeof(float)));
  char *mp = (char *)c->work[1].p;
  experts_job j = {.c = c, .out = out, .calls = calls, .n_calls = n_calls, .max_n = max_n, .H = H};
  j.xin = (const float **)mp;
  j.ldx = (int64_t *)(mp + (size_t)n_calls * 8);
  j.act = (float **)(mp + (size_t)n_calls * 16);
  j.d = (float **)(mp + (size_t)n_calls * 24);
  j.xs = (const float **)(mp + (size_t)n_calls * 32);
  j.task0 = (int *)(mp + (size_t)n_calls * 40);
  j.task2 = j.task0 + n_calls + 1;
  float *xp = c->work[0].p, *ap = xp + n_x, *dp = ap + n_act;
  for (int e = 0; e < n_calls; e++) {
    const lks_expert_call *ec = &calls[e];
    if (ec->rows && expert_split_len(c, ec, max_n, H) > 0) {  // split_inputs reads it in place
      j.xin[e] = row_f32(x, ec->rows[0]);
      j.ldx[e] = x.ld;
    } else if (ec->rows) {  // gather (decode: one row, a copy of H floats)
      for (int t = 0; t < ec->n; t++)
        memcpy(xp + t * H, row_f32(x, ec->rows[t]), (size_t)H * sizeof(float));
      j.xin[e] = xp;
      j.ldx[e] = H;
      xp += ec->n * H;
    } else {
      j.xin[e] = ptr(x);
      j.ldx[e] = x.ld;
    }
    j.act[e] = ap;
    ap += ec->n * ec->gate.rows;
    j.d[e] = dp;
    dp += ec->n * H;
  }
  LKS_TRY(split_inputs(c, calls, n_calls, max_n, H, j.xin, j.xs));
  // Phase 1: blocks of intermediate rows, enough of them over all experts to balance.
  int64_t total_i = 0;
  for (int e = 0; e < n_calls; e++) total_i += calls[e].n ? calls[e].gate.rows : 0;
  j.per1 = rows_per_task(c, total_i);
  if (j.per1 > max_i) j.per1 = (max_i + 7) / 8 * 8;
  j.task0[0] = 0;
  for (int e = 0; e < n_calls; e++)
    j.task0[e + 1] =
        j.task0[e] + (calls[e].n ? (int)((calls[e].gate.rows + j.per1 - 1) / j.per1) : 0);
  // Phase 2: blocks of output columns (down's rows), the same way.
  int64_t total_h = 0;
  for (int e = 0; e < n_calls; e++) total_h += calls[e].n ? H : 0;
  j.per2 = rows_per_task(c, total_h);
  if (j.per2 > H) j.per2 = (H + 7) / 8 * 8;
  j.task2[0] = 0;
  for (int e = 0; e < n_calls; e++)
    j.task2[e + 1] = j.task2[e] + (calls[e].n ? (int)((H + j.per2 - 1) / j.per2) : 0);
  int n_active = 0, n_blocks = (int)((H + j.per2 - 1) / j.per2);
  for (int e = 0; e < n_calls; e++) n_active += calls[e].n > 0;
  j.left = (atomic_int *)(j.task2 + n_calls + 1);
  for (int b = 0; b < n_blocks; b++) atomic_init(&j.left[b], n_active);
  LKS_TRY(grow_thread_scratch(c, (size_t)(2 * j.per1 * max_n) + aux_floats(c, max_k)));
  lks_pool_run(c->pool, j.task0[n_calls], experts_up_task, &j);
  lks_pool_run(c->pool, j.task2[n_calls], experts_down_task, &j);
  return 0;
}

static int cpu_expert(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows,
                      const float *weights, int n, lks_tensor gate, lks_tensor up,
                      lks_tensor down) {
  lks_expert_call one = {gate, up, down, rows, weights, n};
  return cpu_experts(be, out, x, &one, 1);
}

// ---- host work between forwards ----

static int cpu_host_threads(lks_backend *be) { return ((cpu_backend *)be)->n_threads; }

static void cpu_host_run(lks_backend *be, int n_tasks, void (*fn)(void *ctx, int task, int thread),
                         void *ctx) {
  lks_pool_run(((cpu_backend *)be)->pool, n_tasks, fn, ctx);
}

// ---- lifetime ----

static void cpu_free(lks_backend *be) {
  cpu_backend *c = (cpu_backend *)be;
  lks_pool_free(c->pool);
  for (int t = 0; c->thread_scratch && t < c->n_threads; t++) free(c->thread_scratch[t].p);
  free(c->thread_scratch);
  for (int i = 0; i < 3; i++) free(c->work[i].p);
  free(c->rope.buf.p);
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
    .matmuls = cpu_matmuls,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .route = cpu_route,
    .expert = cpu_expert,
    .experts = cpu_experts,
    .host_threads = cpu_host_threads,
    .host_run = cpu_host_run,
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
  const char *ce = getenv("LKS_CHECK_EXP0");
  c->check_exp0 = ce && strcmp(ce, "1") == 0;
  c->rope.pos = -1;
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

void lks_backend_cpu_host_weights(lks_backend *be, lks_host_weights how) {
  if (be && be->ops == &cpu_ops) ((cpu_backend *)be)->host = how;
}
