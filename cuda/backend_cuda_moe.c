// SPDX-License-Identifier: MIT
// The cuda backend's moe op: routing, the dispatch plan, all selected experts' products and
// their weighted sum run on the device in five launches (cuda/moe.cu), without a host round
// trip. The experts' weight pointers reach the kernels through a device table per MoE layer
// (moe_table), made on first use. Every expert of a call has one dtype and shape; quantized
// experts go through the expert op instead.
//
// All calls come from the thread that created the backend.
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cuda/backend_cuda_impl.h"
#include "cuda/cuda_impl.h"

// The device table of the experts' weight pointers for ex (see moe_table), made on first use
// and checked against the tensors on every call (a layer's experts never move, but a freed
// model's array may be reused by another).
static int moe_table_get(cuda_backend *c, const lks_moe_experts *ex, moe_table **out) {
  moe_table *t = NULL;
  for (int i = 0; i < c->n_mt && !t; i++)
    if (c->mt[i].key == ex->gate && c->mt[i].e0 == ex->e0 && c->mt[i].n == ex->n) t = &c->mt[i];
  size_t nb = (size_t)3 * ex->n * sizeof(void *);
  const void **want = malloc(nb ? nb : 1);
  if (!want) return lks_set_error(LKS_ENOMEM, "moe: out of host memory");
  bool aligned = true;
  for (int e = 0; e < ex->n; e++) {
    const lks_tensor *w[3] = {ex->gate + (size_t)(ex->e0 + e) * ex->stride,
                              ex->up + (size_t)(ex->e0 + e) * ex->stride,
                              ex->down + (size_t)(ex->e0 + e) * ex->stride};
    for (int k = 0; k < 3; k++) {
      want[(size_t)k * ex->n + e] = dp(*w[k]);
      aligned &= ((uintptr_t)dp(*w[k]) & 15) == 0;
    }
  }
  if (t && memcmp(t->host, want, nb) == 0) {
    free(want);
    *out = t;
    return 0;
  }
  if (c->gmode != G_EAGER) {
    free(want);
    return lks__cuda_graph_refuse(c, "a new expert table");
  }
  if (!t) {
    if (c->n_mt == c->cap_mt) {
      int cap = c->cap_mt ? 2 * c->cap_mt : 64;
      moe_table *nt = realloc(c->mt, (size_t)cap * sizeof *nt);
      if (!nt) {
        free(want);
        return lks_set_error(LKS_ENOMEM, "moe: out of host memory");
      }
      c->mt = nt;
      c->cap_mt = cap;
    }
    t = &c->mt[c->n_mt++];
    memset(t, 0, sizeof *t);
    t->key = ex->gate;
    t->e0 = ex->e0;
    t->n = ex->n;
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, nb ? nb : 1);
    if (e != cudaSuccess) {
      c->n_mt--;
      free(want);
      return lks_set_error(LKS_ENOMEM, "moe: expert table: %s", cudaGetErrorString(e));
    }
    t->dev = d;
  } else {
    lks__cuda_graphs_drop(c);  // (it synchronises) queued work and graphs read the old table
    free(t->host);
  }
  t->host = want;
  t->aligned = aligned;
  LKS_CUDA_TRY(cudaMemcpyAsync(t->dev, want, nb, cudaMemcpyHostToDevice, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));  // want is pageable
  *out = t;
  return 0;
}

static size_t al256(size_t b) { return (b + 255) / 256 * 256; }

int lks__cuda_moe(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor logits,
                 lks_tensor bias, const lks_route_params *p, const lks_moe_experts *ex,
                 int32_t *ids_host, float *w_host) {
  cuda_backend *c = (cuda_backend *)be;
  int E = p->n_experts, n = (int)logits.rows, k = p->top_k;
  if (E <= 0 || E > logits.cols || k <= 0 || k > E || p->n_group <= 0 || p->n_group > 256 ||
      E % p->n_group != 0 || (p->n_group > 1 && (p->topk_group <= 0 || p->topk_group > p->n_group)))
    return lks_set_error(LKS_EINVAL, "moe: %d experts, top %d, %d groups (top %d)", E, k,
                         p->n_group, p->topk_group);
  if (ex->e0 < 0 || ex->n < 0 || ex->e0 + ex->n > E)
    return lks_set_error(LKS_EINVAL, "moe: experts [%d, %d) of %d", ex->e0, ex->e0 + ex->n, E);
  if (x.rows != n || out.rows != n)
    return lks_set_error(LKS_ESHAPE, "moe: %lld logits rows, %lld input rows, %lld output rows",
                         (long long)n, (long long)x.rows, (long long)out.rows);
  if (ex->n > 1024)
    return lks_set_error(LKS_EUNSUPPORTED, "moe: %d experts on one device (at most 1024)", ex->n);
  int64_t H = x.cols, O = out.cols, I = 0, ld_gu = 0, ld_d = 0;
  lks_dtype dt = LKS_F32;
  // Every expert the same dtype and shape, gate and up with one row stride: one table serves all.
  for (int e = ex->e0; e < ex->e0 + ex->n; e++) {
    const lks_tensor *g = ex->gate + (size_t)e * ex->stride, *u = ex->up + (size_t)e * ex->stride,
                     *d = ex->down + (size_t)e * ex->stride;
    if (!g->buf || !u->buf || !d->buf)
      return lks_set_error(LKS_EINVAL, "moe: expert %d has no weights", e);
    if (g->qs != LKS_Q_NONE || u->qs != LKS_Q_NONE || d->qs != LKS_Q_NONE)
      return lks_set_error(LKS_EUNSUPPORTED, "moe: quantized experts run through the expert op");
    LKS_TRY(lks_weight_check(*g, H));
    LKS_TRY(lks_weight_check(*u, H));
    if (e == ex->e0) {
      I = g->rows;
      dt = g->dtype;
      ld_gu = g->ld;
      ld_d = d->ld;
    }
    LKS_TRY(lks_weight_check(*d, I));
    if (u->rows != I || d->rows != O)
      return lks_set_error(LKS_ESHAPE, "moe: expert %d: gate/up/down shapes disagree", e);
    if (g->rows != I || g->dtype != dt || u->dtype != dt || d->dtype != dt || g->ld != ld_gu ||
        u->ld != ld_gu || d->ld != ld_d)
      return lks_set_error(LKS_EUNSUPPORTED,
                           "moe: the experts' weights differ in dtype, shape or row stride");
  }
  if (n <= 0) return 0;
  size_t nk = (size_t)n * k;
  int64_t bound = (int64_t)(nk + LKS__CU_GEMV_ROWS - 1) / LKS__CU_GEMV_ROWS + ex->n;
  if (bound > (int64_t)nk) bound = (int64_t)nk;
  if (bound > 65535)
    return lks_set_error(LKS_ERANGE, "moe: %d rows in one call (the plan needs %lld groups)", n,
                         (long long)bound);
  moe_table *t = NULL;
  if (ex->n > 0) LKS_TRY(moe_table_get(c, ex, &t));
  // Scratch: groups, ids, weights, pair rows and indices, f32 bias, route scratch, g, u, d.
  size_t o_groups = 0, o_ids = al256((size_t)bound * 16), o_w = o_ids + al256(nk * 4),
         o_prow = o_w + al256(nk * 4), o_pidx = o_prow + al256(nk * 4),
         o_bias = o_pidx + al256(nk * 4), o_rs = o_bias + al256((size_t)E * 4),
         o_g = o_rs + al256(lks__cu_route_plan_scratch(E)), o_u = o_g + al256(nk * I * 4),
         o_d = o_u + al256(nk * I * 4), total = o_d + al256(nk * O * 4);
  void *sc;
  LKS_TRY(lks__cuda_need(c, SC_MOE, total, &sc));
  char *b = sc;
  int4 *groups = (int4 *)(b + o_groups);
  int32_t *ids = (int32_t *)(b + o_ids), *prow = (int32_t *)(b + o_prow),
          *pidx = (int32_t *)(b + o_pidx);
  float *w = (float *)(b + o_w), *g = (float *)(b + o_g), *u = (float *)(b + o_u),
        *d = (float *)(b + o_d);
  if ((ids_host || w_host) && c->gmode != G_EAGER)
    return lks__cuda_graph_refuse(c, "moe routing to the host");
  if (REPLAYING(c)) return 0;
  const float *bias_f32 = NULL;
  if (bias.buf) {
    if (bias.dtype == LKS_F32) {
      bias_f32 = (const float *)dp(bias);
    } else {
      LKS_CUDA_TRY(lks__cu_convert(c->st, b + o_bias, LKS_F32, E, dp(bias), bias.dtype, bias.ld,
                                   1, E));
      bias_f32 = (const float *)(b + o_bias);
    }
  }
  LKS_CUDA_TRY(lks__cu_route_plan(c->st, (const float *)dp(logits), logits.ld, bias_f32, n, E, k,
                                  p->n_group, p->topk_group, p->norm_topk_prob, p->scaling,
                                  (float *)(b + o_rs), ids, w, ex->e0, ex->n, groups, (int)bound,
                                  prow, pidx));
  if (t) {
    const void *const *tab = (const void *const *)t->dev;
    // Gate and up of every local pair, SwiGLU, down into the pair's row of d, then each row's
    // pairs added in rank order.
    LKS_CUDA_TRY(lks__cu_gemv_grouped(c->st, g, u, I, (const float *)dp(x), x.ld, prow, pidx,
                                      groups, bound, tab, tab + ex->n, ld_gu, dt, t->aligned, n,
                                      I, H));
    LKS_CUDA_TRY(lks__cu_swiglu(c->st, g, u, (int64_t)nk * I));
    LKS_CUDA_TRY(lks__cu_gemv_grouped(c->st, d, NULL, O, g, I, pidx, pidx, groups, bound,
                                      tab + 2 * (size_t)ex->n, NULL, ld_d, dt, t->aligned, n, O,
                                      I));
    LKS_CUDA_TRY(lks__cu_moe_combine(c->st, (float *)dp(out), out.ld, d, O, ids, w, n, k, ex->e0,
                                     ex->n, O));
  }
  if (ids_host) LKS_CUDA_TRY(cudaMemcpyAsync(ids_host, ids, nk * 4, cudaMemcpyDeviceToHost, c->st));
  if (w_host) LKS_CUDA_TRY(cudaMemcpyAsync(w_host, w, nk * 4, cudaMemcpyDeviceToHost, c->st));
  if (ids_host || w_host) LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}
