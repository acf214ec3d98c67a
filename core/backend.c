// SPDX-License-Identifier: MIT
// Backend selection and the view helpers shared by all backends (see backend.h).
#include "core/backend.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

lks_backend *lks__backend_cpu_new(int threads);
#ifdef LKS_HAVE_CUDA
lks_backend *lks__backend_cuda_new(int device);
#endif

lks_tensor lks_tensor_rows(lks_tensor t, int64_t r0, int64_t n) {
  assert(r0 >= 0 && r0 + n <= t.rows);
  t.offset += (size_t)(r0 * t.ld) * lks_dtype_size(t.dtype);
  t.rows = n;
  if (t.foff) t.foff += (size_t)(r0 * lks_e4m3_chunks(t.cols));
  switch (t.qs) {
    case LKS_Q_FP8_ROW:
      t.soff += (size_t)r0 * sizeof(float);
      break;
    case LKS_Q_FP8_BLOCK:
      assert(r0 % LKS_Q_FP8_BLOCK_SIZE == 0);
      t.soff += (size_t)(r0 / LKS_Q_FP8_BLOCK_SIZE * t.sld) * sizeof(float);
      break;
    case LKS_Q_NVFP4:
      t.soff += (size_t)(r0 * t.sld);
      break;
    default:
      break;
  }
  return t;
}

lks_tensor lks_tensor_cols(lks_tensor t, int64_t c0, int64_t n) {
  assert(t.qs == LKS_Q_NONE);  // quantized weights are column-sliced when loaded (model/quant.c)
  assert(c0 >= 0 && c0 + n <= t.cols);
  t.offset += (size_t)c0 * lks_dtype_size(t.dtype);
  t.cols = n;
  return t;
}

lks_tensor lks_tensor_reshape(lks_tensor t, int64_t rows, int64_t cols) {
  assert(t.ld == t.cols && rows * cols == t.rows * t.cols);
  t.rows = rows;
  t.cols = cols;
  t.ld = cols;
  return t;
}

lks_backend *lks_backend_new_on(const char *name, int threads, int device) {
  if (strcmp(name, "cpu") == 0) return lks__backend_cpu_new(threads);
#ifdef LKS_HAVE_CUDA
  if (strcmp(name, "cuda") == 0) return lks__backend_cuda_new(device);
  lks_set_error(LKS_EUNSUPPORTED, "unknown backend '%s' (this build has: cpu, cuda)", name);
#else
  (void)device;
  if (strcmp(name, "cuda") == 0)
    lks_set_error(LKS_EUNSUPPORTED,
                  "backend 'cuda': this build has no CUDA (configure with the CUDA toolkit)");
  else
    lks_set_error(LKS_EUNSUPPORTED, "unknown backend '%s' (this build has: cpu)", name);
#endif
  return NULL;
}

lks_backend *lks_backend_new(const char *name, int threads) {
  return lks_backend_new_on(name, threads, -1);
}

void lks_backend_free(lks_backend *be) {
  if (be) be->ops->free(be);
}

int lks_tensor_to_host_f32(lks_backend *be, float *dst, lks_tensor t) {
  size_t es = lks_dtype_size(t.dtype);
  size_t row_bytes = (size_t)t.cols * es;
  void *tmp = t.dtype == LKS_F32 ? NULL : malloc(row_bytes);
  if (t.dtype != LKS_F32 && !tmp) return lks_set_error(LKS_ENOMEM, "out of memory");
  for (int64_t r = 0; r < t.rows; r++) {
    size_t off = t.offset + (size_t)(r * t.ld) * es;
    void *d = t.dtype == LKS_F32 ? (void *)(dst + r * t.cols) : tmp;
    int rc = be->ops->to_host(be, d, t.buf, off, row_bytes);
    if (rc < 0) {
      free(tmp);
      return rc;
    }
    for (int64_t c = 0; tmp && c < t.cols; c++) {
      const uint16_t *h = tmp;
      dst[r * t.cols + c] = t.dtype == LKS_BF16 ? lks_bf16_to_f32(h[c]) : lks_f16_to_f32(h[c]);
    }
  }
  free(tmp);
  return 0;
}

int lks_attn_rows_check(const lks_kv_layer *kv, const lks_attn_rows *rows) {
  int64_t cap = (int64_t)kv->n_blocks * kv->block_size;
  for (int i = 0; i < rows->n; i++)
    if (rows->slot[i] < 0 || rows->slot[i] >= cap || rows->pos[i] < 0 ||
        rows->pos[i] >= (int64_t)rows->max_blocks * kv->block_size)
      return lks_set_error(LKS_ERANGE, "attention: row %d has slot %d / position %d outside the cache",
                           i, rows->slot[i], rows->pos[i]);
  return 0;
}

int lks_weight_check(lks_tensor w, int64_t K) {
  if (w.cols != K)
    return lks_set_error(LKS_ESHAPE, "matmul: weight has %lld columns, input has %lld",
                         (long long)w.cols, (long long)K);
  bool ok;
  switch (w.qs) {
    case LKS_Q_NONE:
      ok = w.dtype == LKS_F32 || w.dtype == LKS_BF16 || w.dtype == LKS_F16;
      break;
    case LKS_Q_FP8_ROW:
    case LKS_Q_FP8_BLOCK:
      ok = w.dtype == LKS_F8_E4M3 && w.sbuf;
      break;
    case LKS_Q_NVFP4:
      ok = w.dtype == LKS_F4_E2M1X2 && w.sbuf && K % LKS_Q_NVFP4_GROUP == 0;
      break;
    default:
      ok = false;
  }
  if (!ok)
    return lks_set_error(LKS_EUNSUPPORTED, "matmul: weights of type %s, scheme %s, %lld columns",
                         lks_dtype_name(w.dtype), lks_qscheme_name(w.qs, w.dtype), (long long)K);
  return 0;
}

const char *lks_qscheme_name(lks_qscheme q, lks_dtype dt) {
  switch (q) {
    case LKS_Q_NONE:
      return dt == LKS_F32 ? "f32" : dt == LKS_F16 ? "f16" : dt == LKS_BF16 ? "bf16" : "?";
    case LKS_Q_FP8_ROW:
      return "fp8-channel";
    case LKS_Q_FP8_BLOCK:
      return "fp8-block";
    case LKS_Q_NVFP4:
      return "nvfp4";
    default:
      return "?";
  }
}

int64_t lks_weight_bytes(lks_tensor t) {
  if (!t.buf) return 0;
  int64_t B = LKS_Q_FP8_BLOCK_SIZE;
  switch (t.qs) {
    case LKS_Q_FP8_ROW:
      return t.rows * t.cols + t.rows * 4;
    case LKS_Q_FP8_BLOCK:
      return t.rows * t.cols + (t.rows + B - 1) / B * ((t.cols + B - 1) / B) * 4;
    case LKS_Q_NVFP4:
      return t.rows * (t.cols / 2) + t.rows * (t.cols / LKS_Q_NVFP4_GROUP);
    default:
      return t.rows * t.cols * (int64_t)lks_dtype_size(t.dtype);
  }
}

int lks_matmul_check(lks_tensor out, lks_tensor x, lks_tensor w) {
  LKS_TRY(lks_weight_check(w, x.cols));
  if (out.rows != x.rows || out.cols != w.rows)
    return lks_set_error(LKS_ESHAPE, "matmul: output [%lld, %lld], expected [%lld, %lld]",
                         (long long)out.rows, (long long)out.cols, (long long)x.rows,
                         (long long)w.rows);
  return 0;
}

int lks_backend_experts(lks_backend *be, lks_tensor out, lks_tensor x,
                        const lks_expert_call *calls, int n_calls) {
  if (be->ops->experts) return be->ops->experts(be, out, x, calls, n_calls);
  for (int e = 0; e < n_calls; e++) {
    const lks_expert_call *c = &calls[e];
    LKS_TRY(be->ops->expert(be, out, x, c->rows, c->weights, c->n, c->gate, c->up, c->down));
  }
  return 0;
}

int lks_backend_matmuls(lks_backend *be, lks_tensor x, const lks_matmul_part *parts, int n) {
  if (be->ops->matmuls) return be->ops->matmuls(be, x, parts, n);
  for (int i = 0; i < n; i++)
    LKS_TRY(be->ops->matmul(be, parts[i].out, x, parts[i].w, parts[i].bias, false));
  return 0;
}

int lks_backend_host_threads(lks_backend *be) {
  return be->ops->host_run && be->ops->host_threads ? be->ops->host_threads(be) : 1;
}

void lks_backend_host_run(lks_backend *be, int n_tasks, void (*fn)(void *ctx, int task, int thread),
                          void *ctx) {
  if (be->ops->host_run && be->ops->host_threads) {
    be->ops->host_run(be, n_tasks, fn, ctx);
    return;
  }
  for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
}

int lks_backend_step(lks_backend *be, uint64_t key, int (*step)(void *ctx), void *ctx) {
  if (!key || !be->ops->step_begin || !be->ops->step_end) return step(ctx);
  int rc = be->ops->step_begin(be, key);
  if (rc < 0) return rc;
  rc = be->ops->step_end(be, step(ctx));
  return rc == 1 ? step(ctx) : rc;
}
