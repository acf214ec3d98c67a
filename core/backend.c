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
  return t;
}

lks_tensor lks_tensor_cols(lks_tensor t, int64_t c0, int64_t n) {
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
  if (w.dtype != LKS_F32 && w.dtype != LKS_BF16 && w.dtype != LKS_F16)
    return lks_set_error(LKS_EUNSUPPORTED, "matmul: weights of type %s", lks_dtype_name(w.dtype));
  return 0;
}

int lks_matmul_check(lks_tensor out, lks_tensor x, lks_tensor w) {
  LKS_TRY(lks_weight_check(w, x.cols));
  if (out.rows != x.rows || out.cols != w.rows)
    return lks_set_error(LKS_ESHAPE, "matmul: output [%lld, %lld], expected [%lld, %lld]",
                         (long long)out.rows, (long long)out.cols, (long long)x.rows,
                         (long long)w.rows);
  return 0;
}

int lks_backend_step(lks_backend *be, uint64_t key, int (*step)(void *ctx), void *ctx) {
  if (!key || !be->ops->step_begin || !be->ops->step_end) return step(ctx);
  int rc = be->ops->step_begin(be, key);
  if (rc < 0) return rc;
  rc = be->ops->step_end(be, step(ctx));
  return rc == 1 ? step(ctx) : rc;
}
