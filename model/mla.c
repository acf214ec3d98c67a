// SPDX-License-Identifier: MIT
// glm_moe_dsa attention: MLA with the DSA indexer (see mla.h; the math is MODEL.md section 4,
// checked against transformers' modular_glm_moe_dsa.py / modular_deepseek_v32.py).
//
// Per layer, with h = input_layernorm(x) [n, H]:
//   c_q = RMSNorm(q_a_proj h; q_a_layernorm, eps 1e-6)                       [n, q_lora]
//   q   = q_b_proj c_q -> per head [q_nope | q_pe]; RoPE on q_pe            [n, nh, nope + rope]
//   [c | kpe] = kv_a_proj_with_mqa h; c = RMSNorm(c; kv_a_layernorm, 1e-6); RoPE on kpe
//   cache <- [c | kpe]                                                        (latent cache)
//   indexer ("full" layers): qI = wq_b c_q [n, nI, dI], kI = LayerNorm(wk h; k_norm, 1e-6) [n, dI],
//     RoPE on the first qk_rope dims of each; cache <- kI; wI = weights_proj h [n, nI];
//     I(t, s) = sum_h wI[t,h] / sqrt(nI) * relu(qI[t,h] . kI[s] / sqrt(dI)); keep the top
//     index_topk positions s <= t ("shared" layers reuse the previous full layer's selection)
//   attention over the kept positions in the absorbed form: score = (W_uk^T q_nope) . c + q_pe . kpe,
//     scale 1/sqrt(nope + rope); out_h = W_uv (sum p c)                       [n, nh * v_dim]
//   x += o_proj out
// RoPE: GLM-5 rotates interleaved pairs (2i, 2i+1) in the attention and in the indexer alike
// (transformers applies apply_rotary_pos_emb_interleave in both; DeepSeek-V3.2's indexer uses
// half-split, GLM's does not). transformers' helper also permutes the rotated dims (evens, then
// odds) for q and k alike, which leaves every dot product equal to rotating the pairs in place,
// as done here. A config with rope_interleave / indexer_rope_interleave false (read by the
// serving engines, none of GLM-5's) selects half-split for that part. Prefill and decode both use the absorbed form: one code path, and the cache holds
// only the latent; the score differs from the expanded form only by f32 summation order.
#include "model/mla.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"

struct lks__mla_layer {
  lks_tensor q_a, q_a_norm, q_b;    // [q_lora, H], [q_lora], [nh_local * (nope + rope), q_lora]
  lks_tensor kv_a, kv_a_norm, kv_b; // [R + rope, H], [R], [nh_local * (nope + v), R]
  lks_tensor o;                     // [H, nh_local * v] (this rank's columns)
  bool full;                        // runs its own indexer
  lks_tensor iq, ik, ik_w, ik_b, iw;  // [nI * dI, q_lora], [dI, H], [dI], [dI], [nI, H]
};

struct lks__mla {
  lks_backend *be;
  lks_config c;
  int h0, nh;
  lks__mla_layer *layers;  // [n_layers + n_mtp]
  int cap;                 // rows the buffers hold
  lks_buf *cq;   // [n, q_lora]
  lks_buf *ckv;  // [n, R + rope]
  lks_buf *q;    // [n, nh * (nope + rope)]
  lks_buf *att;  // [n, nh * v]
  lks_buf *iq;   // [n, nI * dI]
  lks_buf *ik;   // [n, dI]
  lks_buf *iw;   // [n, nI]
  int32_t *pos_h;         // [n * nh] each row's position once per head (RoPE of q_pe)
  int32_t *sel, *n_sel;   // [n, index_topk], [n]: the last full layer's selection
  int sel_rows;           // rows of the batch the selection belongs to (-1: none)
};

lks__mla *lks__mla_new(lks_backend *be, const lks_config *c, int h0, int n_heads) {
  const lks_backend_ops *o = be->ops;
  if (!o->layernorm || !o->cache_store || !o->dsa_select || !o->mla_attention) {
    lks_set_error(LKS_EUNSUPPORTED,
                  "the %s backend lacks the ops glm_moe_dsa needs (layernorm, cache_store, "
                  "dsa_select, mla_attention); run GLM-5 on the cpu backend",
                  o->name);
    return NULL;
  }
  lks__mla *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->be = be;
  a->c = *c;
  a->h0 = h0;
  a->nh = n_heads;
  a->sel_rows = -1;
  a->layers = calloc((size_t)(c->n_layers + c->n_mtp), sizeof *a->layers);
  if (!a->layers) {
    free(a);
    lks_set_error(LKS_ENOMEM, "out of memory");
    return NULL;
  }
  return a;
}

static void free_bufs(lks__mla *a) {
  lks_buf **b[] = {&a->cq, &a->ckv, &a->q, &a->att, &a->iq, &a->ik, &a->iw};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    if (*b[i]) a->be->ops->buf_free(a->be, *b[i]);
    *b[i] = NULL;
  }
  a->cap = 0;
}

void lks__mla_free(lks__mla *a) {
  if (!a) return;
  free_bufs(a);
  free(a->layers);
  free(a->pos_h);
  free(a->sel);
  free(a->n_sel);
  free(a);
}

const lks__mla_layer *lks__mla_bind(lks__mla *a, lks_model *m, int l) {
  const lks_config *c = &a->c;
  const lks_mla_config *k = &c->mla;
  bool mtp = l >= c->n_layers;
  lks__mla_layer *L = &a->layers[l];
  int H = c->hidden, qh = k->qk_nope + k->qk_rope, kvh = k->qk_nope + k->v_head;
  int nh = c->n_heads, h0 = a->h0, n = a->nh;
  char s[256];
#define NAME(fmt) (snprintf(s, sizeof s, "model.layers.%d.self_attn." fmt, l), s)
  L->q_a = lks__model_bind(m, mtp, NAME("q_a_proj.weight"), k->q_lora, H, true);
  L->q_a_norm = lks__model_bind(m, mtp, NAME("q_a_layernorm.weight"), 0, k->q_lora, true);
  L->q_b = lks__model_bind_rows(m, mtp, NAME("q_b_proj.weight"), (int64_t)nh * qh, k->q_lora,
                                (int64_t)h0 * qh, (int64_t)n * qh);
  L->kv_a = lks__model_bind(m, mtp, NAME("kv_a_proj_with_mqa.weight"), k->kv_lora + k->qk_rope, H,
                            true);
  L->kv_a_norm = lks__model_bind(m, mtp, NAME("kv_a_layernorm.weight"), 0, k->kv_lora, true);
  L->kv_b = lks__model_bind_rows(m, mtp, NAME("kv_b_proj.weight"), (int64_t)nh * kvh, k->kv_lora,
                                 (int64_t)h0 * kvh, (int64_t)n * kvh);
  L->o = lks__model_bind_cols(m, mtp, NAME("o_proj.weight"), H, (int64_t)nh * k->v_head,
                              (int64_t)h0 * k->v_head, (int64_t)n * k->v_head);
  L->full = k->index_full[l];
  if (L->full) {
    int nI = k->index_heads, dI = k->index_dim;
    L->iq = lks__model_bind(m, mtp, NAME("indexer.wq_b.weight"), (int64_t)nI * dI, k->q_lora, true);
    L->ik = lks__model_bind(m, mtp, NAME("indexer.wk.weight"), dI, H, true);
    L->ik_w = lks__model_bind(m, mtp, NAME("indexer.k_norm.weight"), 0, dI, true);
    L->ik_b = lks__model_bind(m, mtp, NAME("indexer.k_norm.bias"), 0, dI, true);
    L->iw = lks__model_bind(m, mtp, NAME("indexer.weights_proj.weight"), nI, H, true);
  }
#undef NAME
  return L;
}

static int reserve(lks__mla *a, int n) {
  if (n <= a->cap) return 0;
  free_bufs(a);
  const lks_mla_config *k = &a->c.mla;
  size_t f = sizeof(float), N = (size_t)n;
  struct {
    lks_buf **b;
    size_t floats;
  } want[] = {
      {&a->cq, (size_t)k->q_lora},
      {&a->ckv, (size_t)(k->kv_lora + k->qk_rope)},
      {&a->q, (size_t)a->nh * (k->qk_nope + k->qk_rope)},
      {&a->att, (size_t)a->nh * k->v_head},
      {&a->iq, (size_t)k->index_heads * k->index_dim},
      {&a->ik, (size_t)k->index_dim},
      {&a->iw, (size_t)k->index_heads},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    *want[i].b = a->be->ops->buf_alloc(a->be, N * want[i].floats * f);
    if (!*want[i].b) {
      free_bufs(a);
      return lks_set_error(LKS_ENOMEM, "cannot allocate MLA activations for %d rows", n);
    }
  }
  int32_t *ph = realloc(a->pos_h, N * (size_t)a->nh * sizeof *ph);
  if (ph) a->pos_h = ph;
  int32_t *sel = realloc(a->sel, N * (size_t)k->index_topk * sizeof *sel);
  if (sel) a->sel = sel;
  int32_t *ns = realloc(a->n_sel, N * sizeof *ns);
  if (ns) a->n_sel = ns;
  if (!ph || !sel || !ns) return lks_set_error(LKS_ENOMEM, "cannot allocate MLA indices for %d rows", n);
  a->cap = n;
  return 0;
}

static lks_tensor act(lks_buf *b, int n, int cols) { return lks_tensor_2d(b, 0, LKS_F32, n, cols); }

int lks__mla_forward(lks__mla *a, int l, lks_tensor x, lks_tensor h, const lks_kv_cache *kv,
                     int kl, const lks_attn_rows *rows, int n) {
  const lks_config *c = &a->c;
  const lks_mla_config *k = &c->mla;
  const lks__mla_layer *L = &a->layers[l];
  lks_backend *be = a->be;
  const lks_backend_ops *o = be->ops;
  LKS_TRY(reserve(a, n));
  int R = k->kv_lora, dr = k->qk_rope, dn = k->qk_nope, qh = dn + dr, nh = a->nh;
  const lks_kv_layer *lat = lks_kv_layer_at(kv, 2 * kl), *ikeys = lks_kv_layer_at(kv, 2 * kl + 1);
  const float eps = 1e-6f;  // q_a_layernorm, kv_a_layernorm and the indexer's k_norm
  lks_tensor none = {0};
  const int32_t *pos = rows->pos;

  // Query: c_q = RMSNorm(q_a h); q = q_b c_q; RoPE on each head's last qk_rope dims. The
  // products of h in one call: q_a, the latent's kv_a and, in a full layer, the indexer's ik and
  // iw (used below).
  int nI = k->index_heads, dI = k->index_dim;
  lks_tensor cq = act(a->cq, n, k->q_lora), q = act(a->q, n, nh * qh);
  lks_tensor ckv = act(a->ckv, n, R + dr), ik = {0}, iw = {0};
  lks_matmul_part proj[LKS_MATMULS_MAX] = {{cq, L->q_a, none}, {ckv, L->kv_a, none}};
  int n_proj = 2;
  if (L->full) {
    ik = act(a->ik, n, dI), iw = act(a->iw, n, nI);
    proj[n_proj++] = (lks_matmul_part){ik, L->ik, none};
    proj[n_proj++] = (lks_matmul_part){iw, L->iw, none};
  }
  LKS_TRY(lks_backend_matmuls(be, h, proj, n_proj));
  LKS_TRY(o->rmsnorm(be, cq, cq, L->q_a_norm, eps));
  LKS_TRY(o->matmul(be, q, cq, L->q_b, none, false));
  for (int i = 0; i < n; i++)
    for (int j = 0; j < nh; j++) a->pos_h[i * nh + j] = pos[i];
  lks_tensor q_pe = lks_tensor_cols(lks_tensor_reshape(q, (int64_t)n * nh, qh), dn, dr);
  lks_rope_layout rl = k->rope_half_split ? LKS_ROPE_HALF_SPLIT : LKS_ROPE_INTERLEAVED;
  lks_rope_layout il = k->index_rope_half_split ? LKS_ROPE_HALF_SPLIT : LKS_ROPE_INTERLEAVED;
  LKS_TRY(o->rope(be, q_pe, dr, dr, c->rope_theta, rl, a->pos_h));

  // Latent: [c | kpe] = kv_a h; c = RMSNorm(c); RoPE on kpe; cached.
  lks_tensor cpart = lks_tensor_cols(ckv, 0, R), kpe = lks_tensor_cols(ckv, R, dr);
  LKS_TRY(o->rmsnorm(be, cpart, cpart, L->kv_a_norm, eps));
  LKS_TRY(o->rope(be, kpe, dr, dr, c->rope_theta, rl, pos));
  LKS_TRY(o->cache_store(be, lat, ckv, rows));

  // The indexer, or the previous full layer's selection.
  int topk = k->index_topk;
  if (L->full) {  // ik = ik_proj h and iw = weights_proj h above
    lks_tensor iq = act(a->iq, n, nI * dI);
    LKS_TRY(o->matmul(be, iq, cq, L->iq, none, false));
    LKS_TRY(o->rope(be, iq, dI, dr, c->rope_theta, il, pos));
    LKS_TRY(o->layernorm(be, ik, ik, L->ik_w, L->ik_b, eps));
    LKS_TRY(o->rope(be, ik, dI, dr, c->rope_theta, il, pos));
    LKS_TRY(o->cache_store(be, ikeys, ik, rows));
    LKS_TRY(o->dsa_select(be, iq, iw, ikeys, rows, nI, 1.0f / sqrtf((float)dI),
                          1.0f / sqrtf((float)nI), topk, a->sel, a->n_sel));
    a->sel_rows = n;
  } else if (a->sel_rows != n) {
    return lks_set_error(LKS_EINVAL, "layer %d shares the indexer of a previous layer, which did not run on this batch", l);
  }

  // Attention over the selected positions, then this rank's columns of o_proj.
  lks_mla_dims d = {nh, dn, dr, k->v_head, R, 1.0f / sqrtf((float)qh)};
  lks_tensor att = act(a->att, n, nh * k->v_head);
  LKS_TRY(o->mla_attention(be, att, q, L->kv_b, lat, rows, &d, a->sel, a->n_sel, topk));
  return o->matmul(be, x, att, L->o, none, true);
}

static int64_t tn(lks_tensor t) { return t.buf ? t.rows * t.cols : 0; }

void lks__mla_cost(const lks__mla_layer *L, int64_t *bytes, int64_t *params, int64_t *by_fmt,
                   int64_t *params_by_fmt) {
  if (!L) return;
  lks_tensor all[] = {L->q_a, L->q_a_norm, L->q_b, L->kv_a, L->kv_a_norm, L->kv_b,
                      L->o,   L->iq,       L->ik,  L->ik_w, L->ik_b,      L->iw};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    *bytes += lks_weight_bytes(all[i]);  // codes and scales of a quantized weight
    *params += tn(all[i]);
    if (by_fmt && all[i].buf) by_fmt[lks_tensor_wfmt(all[i])] += lks_weight_bytes(all[i]);
    if (params_by_fmt && all[i].buf) params_by_fmt[lks_tensor_wfmt(all[i])] += tn(all[i]);
  }
}

lks_kv_cache *lks__mla_kv_new(lks_backend *be, const lks_config *c, bool mtp, int block_size,
                              int n_blocks, int max_seqs, int max_seq_len) {
  int n = mtp ? c->n_mtp : c->n_layers, first = mtp ? c->n_layers : 0;
  int *w = malloc((size_t)(2 * (n ? n : 1)) * sizeof *w);
  if (!w) return NULL;
  for (int l = 0; l < n; l++) {
    w[2 * l] = c->mla.kv_lora + c->mla.qk_rope;
    w[2 * l + 1] = c->mla.index_full[first + l] ? c->mla.index_dim : 0;
  }
  lks_kv_cache *kv = lks_kv_new_widths(be, 2 * n, w, block_size, n_blocks, max_seqs, max_seq_len);
  free(w);
  return kv;
}

int64_t lks__mla_kv_floats_per_pos(const lks_config *c) {
  int64_t f = 0;
  for (int l = 0; l < c->n_layers; l++)
    f += c->mla.kv_lora + c->mla.qk_rope + (c->mla.index_full[l] ? c->mla.index_dim : 0);
  return f;
}
