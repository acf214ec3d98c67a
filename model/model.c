// SPDX-License-Identifier: MIT
// GLM-4.x MoE forward and MTP step (see model.h; the math is MODEL.md sections 2 and 3).
//
// The residual stream x [n, H] lives in a model-owned buffer; each decoder layer reads
// RMSNorm(x) into h and adds the attention output and the FFN output back into x. The MTP step
// builds its own input u = eh_proj [enorm(embed(t)); hnorm(h)] into x and runs the same decoder
// layer code on the MTP layer's weights and KV cache.
#include "model/model.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "model/dflash.h"
#include "model/mla.h"
#include "model/quant.h"
#include "model/safetensors.h"

typedef struct {
  lks_tensor gate, up, down;
} ffn_w;

typedef struct {
  lks_tensor ln1, ln2;
  lks_tensor wq, wk, wv, bq, bk, bv, wo, q_norm, k_norm;
  const lks__mla_layer *mla;  // glm_moe_dsa: the attention's tensors instead (model/mla.c)
  bool moe;
  ffn_w dense;          // dense layers
  lks_tensor router;    // [E, H]
  lks_tensor e_bias;    // [E]
  ffn_w *experts;       // [E]
  ffn_w shared;         // shared experts, intermediate moe_inter * n_shared: this rank's rows
  ffn_w shared_all;     // world > 1, host routing: all of them too (see moe)
  // MTP layer only
  lks_tensor enorm, hnorm, eh_proj, head_norm;
} layer_w;

// Activation buffers, grown to the largest batch seen.
typedef struct {
  int cap;  // rows
  lks_buf *x, *h, *q, *k, *v, *att, *rl, *hid, *logits, *ucat, *carry, *mlogits;
} acts;

// This rank's part of the model (DESIGN.md section 5). At world 1 it is everything.
typedef struct {
  int rank, world;
  int h0, n_heads;       // query heads [h0, h0 + n_heads)
  int kv0, n_kv;         // KV heads [kv0, kv0 + n_kv)
  int e0, n_experts;     // routed experts [e0, e0 + n_experts)
  int ex0, ex_n;         // each routed expert's intermediate rows [ex0, ex0 + ex_n): fewer
                         // than all with experts by rows (lks_experts_split)
  int inter0, inter;     // dense FFN intermediate rows
  int sh0, shared;       // shared expert intermediate rows
  int v0, vocab;         // lm_head rows [v0, v0 + vocab)
  int vocab_block;       // ceil(V / world): the padded block size of the logits gather
} shard;

struct lks_model {
  lks_config cfg;
  shard sh;
  lks_dtype kv_dtype;  // the GQA KV cache's elements (lks_model_set_kv_dtype); F32 unless set
  lks_comm *comm;   // not owned; NULL at world 1
  lks_backend *be;
  lks__mla *mla;    // glm_moe_dsa's attention (model/mla.c); NULL for glm4_moe
  lks_safetensors *st;
  lks_tensor embed, norm, lm_head;
  layer_w *layers;  // [n_layers + n_mtp]
  lks_buf **bufs;   // every wrapped weight buffer, to free
  int n_bufs, cap_bufs;
  int n_problems;
  char first_problem[512];  // checks that return errors overwrite lks_last_error() afterwards
  lks_quant_config quant;
  unsigned group_fmts[LKS_N_WG];  // bit f: some weight of the group is in format f
  lks_problem_fn problem;
  void *problem_ctx;
  int64_t params_total, params_mtp, weight_bytes;
  float *gather_buf;  // host, for lks_model_logits_host
  size_t gather_cap;
  acts a;
  // Host scratch for routing and expert dispatch.
  int32_t *route_ids, *exp_rows, *exp_count;
  int32_t *sh_rows;            // [2 * cap]: the rows of the whole shared expert, then the split's
  lks_expert_call *exp_calls;  // [n_experts + 2]: this layer's routed experts, then the shared
  float *route_w, *exp_w;
  int route_cap;
  int32_t *slots;
  int32_t *sub;  // [4 * cap]: lks_model_mtp's output rows' sequences, positions, cache slots; 0, 1, ..
  // A DFlash drafter's capture: the outputs of layers cap_layer[0 .. n_cap) of every row.
  lks_dflash *dflash;
  int n_cap, cap_at[LKS_DFLASH_MAX_CAPTURE];
  lks_buf *cap;     // [cap_rows, n_cap * H]
  int cap_rows, cap_n;
  int32_t *ident;   // [cap_rows] 0, 1, 2, ...
};

static void problem(lks_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(lks_model *m, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (m->n_problems++ == 0) snprintf(m->first_problem, sizeof m->first_problem, "%s", msg);
  if (m->problem) m->problem(m->problem_ctx, msg);
}

// Looks up tensor `name` and checks it is [rows, cols] (rows = 0: a 1-D tensor of cols) of a
// float dtype. NULL (after reporting the problem when required) otherwise.
static const lks_st_tensor *lookup(lks_model *m, const char *name, int64_t rows, int64_t cols,
                                   bool required) {
  const lks_st_tensor *st = lks_safetensors_find(m->st, name);
  if (!st) {
    if (required) problem(m, "missing tensor '%s'", name);
    return NULL;
  }
  int want_dims = rows ? 2 : 1;
  bool shape_ok = st->n_dims == want_dims &&
                  (rows ? st->shape[0] == rows && st->shape[1] == cols : st->shape[0] == cols);
  if (!shape_ok) {
    char got[128] = "", *p = got;
    for (int d = 0; d < st->n_dims && p < got + 100; d++)
      p += sprintf(p, "%s%lld", d ? ", " : "", (long long)st->shape[d]);
    if (rows)
      problem(m, "tensor '%s' has shape [%s], config.json implies [%lld, %lld]", name, got,
              (long long)rows, (long long)cols);
    else
      problem(m, "tensor '%s' has shape [%s], config.json implies [%lld]", name, got,
              (long long)cols);
    return NULL;
  }
  if (st->dtype != LKS_F32 && st->dtype != LKS_BF16 && st->dtype != LKS_F16) {
    problem(m, "tensor '%s' has dtype %s; weights must be F32, BF16 or F16", name,
            lks_dtype_name(st->dtype));
    return NULL;
  }
  return st;
}

static bool keep_buf(lks_model *m, lks_buf *b) {
  if (m->n_bufs == m->cap_bufs) {
    int cap = m->cap_bufs ? 2 * m->cap_bufs : 256;
    lks_buf **nb = realloc(m->bufs, (size_t)cap * sizeof *nb);
    if (!nb) return false;
    m->bufs = nb;
    m->cap_bufs = cap;
  }
  m->bufs[m->n_bufs++] = b;
  return true;
}

// Binds rows [r0, r0 + nr) and columns [c0, c0 + nc) of a checked tensor (1-D tensors are one
// row). Only those bytes are mapped into the backend; the CPU backend packs a column slice (its
// row stride becomes its row's bytes) and reads whole rows in place (or copies them, --mmap false).
static lks_tensor wrap(lks_model *m, bool mtp, const lks_st_tensor *st, int64_t r0, int64_t nr,
                       int64_t c0, int64_t nc) {
  lks_tensor t = {0};
  if (!st || m->n_problems) return t;  // still checking; nothing is bound after a problem
  int64_t cols = st->n_dims == 2 ? st->shape[1] : st->shape[0];
  size_t es = lks_dtype_size(st->dtype), stride = (size_t)cols * es;
  const uint8_t *first = st->data + (size_t)r0 * stride + (size_t)c0 * es;
  lks_buf *b;
  size_t ld_bytes = stride;
  if (nc == cols)
    b = m->be->ops->buf_wrap_host(m->be, first, (size_t)nr * stride);
  else
    b = m->be->ops->buf_wrap_host_2d(m->be, first, nr, (size_t)nc * es, stride, &ld_bytes);
  if (!b || !keep_buf(m, b)) {
    if (b) m->be->ops->buf_free(m->be, b);
    problem(m, "tensor '%s': the backend cannot map it", st->name);
    return t;
  }
  m->params_total += nr * nc;
  if (mtp) m->params_mtp += nr * nc;
  m->weight_bytes += nr * nc * (int64_t)es;
  t = lks_tensor_2d(b, 0, st->dtype, nr, nc);
  t.ld = (int64_t)(ld_bytes / es);
  return t;
}

int lks_tensor_wfmt(lks_tensor t) {
  switch (t.qs) {
    case LKS_Q_FP8_ROW: return LKS_WFMT_FP8_CHANNEL;
    case LKS_Q_FP8_BLOCK: return LKS_WFMT_FP8_BLOCK;
    case LKS_Q_NVFP4: return LKS_WFMT_NVFP4;
    default: return t.dtype == LKS_F32 ? LKS_WFMT_F32 : t.dtype == LKS_F16 ? LKS_WFMT_F16 : LKS_WFMT_BF16;
  }
}

const char *const lks_wfmt_names[LKS_N_WFMT] = {"f32", "f16", "bf16", "fp8-channel", "fp8-block",
                                                 "nvfp4"};
const char *const lks_wgroup_names[LKS_N_WG] = {"attention", "dense ffn", "router",
                                                 "routed experts", "shared experts", "lm_head",
                                                 "mtp layer"};

static int group_of(const char *name, bool mtp) {
  if (mtp) return LKS_WG_MTP;
  if (strstr(name, "self_attn.")) return LKS_WG_ATTN;
  if (strstr(name, "shared_experts.")) return LKS_WG_SHARED;
  if (strstr(name, "mlp.experts.")) return LKS_WG_EXPERTS;
  if (strstr(name, "mlp.gate.weight")) return LKS_WG_ROUTER;
  if (strstr(name, "lm_head")) return LKS_WG_LM_HEAD;
  return LKS_WG_DENSE;
}

// Rows [r0, r0 + nr) and columns [c0, c0 + nc) of a quantized weight: the codes mapped like a
// plain weight's (NVFP4: two a byte), the scales of the slice compacted into a buffer of their own.
static lks_tensor wrap_q(lks_model *m, bool mtp, const lks_qtensor *q, int64_t rows, int64_t cols,
                         int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  lks_tensor t = {0};
  if (lks_quant_check_slice(q, rows, cols, r0, nr, c0, nc) < 0) {
    problem(m, "%s", lks_last_error());
    return t;
  }
  if (m->n_problems) return t;
  bool fp4 = q->qs == LKS_Q_NVFP4;
  size_t stride = (size_t)(fp4 ? cols / 2 : cols), row_bytes = (size_t)(fp4 ? nc / 2 : nc);
  const uint8_t *first = q->w->data + (size_t)r0 * stride + (size_t)(fp4 ? c0 / 2 : c0);
  size_t ld_bytes = stride;
  lks_buf *b = nc == cols ? m->be->ops->buf_wrap_host(m->be, first, (size_t)nr * stride)
                          : m->be->ops->buf_wrap_host_2d(m->be, first, nr, row_bytes, stride, &ld_bytes);
  void *sc = NULL;
  size_t sbytes = 0, foff = 0;
  int64_t sld = 0;
  lks_buf *sb = NULL;
  if (b && keep_buf(m, b) && lks_quant_slice_scales(q, rows, cols, r0, nr, c0, nc, &sc, &sbytes, &sld) == 0) {
    // On the CPU, after the scales: which chunks of 128 columns hold exponent-0 codes (FP8) or
    // scales (NVFP4).
    bool cpu = strcmp(m->be->ops->name, "cpu") == 0;
    size_t fbytes = cpu ? (size_t)(nr * lks_e4m3_chunks(nc)) : 0;
    foff = fbytes ? (sbytes + 63) / 64 * 64 : 0;
    void *all = fbytes ? realloc(sc, foff + fbytes) : sc;
    if (all) {
      sc = all;
      uint8_t *fl = (uint8_t *)sc + foff;
      if (fbytes) lks_qweight_exp0_chunks(fp4, first, (int64_t)stride, sc, sld, nr, nc, fl);
      if (fbytes) sbytes = foff + fbytes;
      sb = m->be->ops->buf_alloc(m->be, sbytes);
    }
    if (sb && (!keep_buf(m, sb) || m->be->ops->from_host(m->be, sb, 0, sc, sbytes) < 0)) sb = NULL;
  }
  free(sc);
  if (!sb) {
    problem(m, "tensor '%s': the backend cannot map it or its scales", q->w->name);
    return t;
  }
  t = lks_tensor_2d(b, 0, fp4 ? LKS_F4_E2M1X2 : LKS_F8_E4M3, nr, nc);
  t.ld = (int64_t)ld_bytes;
  t.qs = q->qs;
  t.sbuf = sb;
  t.sld = sld;
  t.qglobal = q->global;
  t.foff = foff;
  m->params_total += nr * nc;
  if (mtp) m->params_mtp += nr * nc;
  m->weight_bytes += lks_weight_bytes(t);
  return t;
}

// A matrix weight, plain or quantized (model/quant.h): rows [r0, r0 + nr), columns [c0, c0 + nc).
static lks_tensor bind_w(lks_model *m, bool mtp, const char *name, int64_t rows, int64_t cols,
                         int64_t r0, int64_t nr, int64_t c0, int64_t nc, bool required) {
  lks_qtensor q;
  lks_tensor t = {0};
  if (lks_quant_find(m->st, &m->quant, name, rows, cols, &q) < 0) {
    problem(m, "%s", lks_last_error());
    return t;
  }
  if (q.qs == LKS_Q_NONE)
    t = wrap(m, mtp, lookup(m, name, rows, cols, required), r0, nr, c0, nc);
  else
    t = wrap_q(m, mtp, &q, rows, cols, r0, nr, c0, nc);
  if (t.buf) m->group_fmts[group_of(name, mtp)] |= 1u << lks_tensor_wfmt(t);
  return t;
}

// A replicated tensor: all of it.
static lks_tensor bind(lks_model *m, bool mtp, const char *name, int64_t rows, int64_t cols,
                       bool required) {
  // The embedding is a table, not a product: it stays F32 / BF16 / F16.
  if (rows && strcmp(name, "model.embed_tokens.weight") != 0)
    return bind_w(m, mtp, name, rows, cols, 0, rows, 0, cols, required);
  const lks_st_tensor *st = lookup(m, name, rows, cols, required);
  return wrap(m, mtp, st, 0, rows ? rows : 1, 0, cols);
}

// A row shard [r0, r0 + nr) of a [rows, cols] tensor, or of the elements of a 1-D one (rows 0).
static lks_tensor bind_rows(lks_model *m, bool mtp, const char *name, int64_t rows, int64_t cols,
                            int64_t r0, int64_t nr) {
  if (rows) return bind_w(m, mtp, name, rows, cols, r0, nr, 0, cols, true);
  const lks_st_tensor *st = lookup(m, name, rows, cols, true);
  return wrap(m, mtp, st, 0, 1, r0, nr);
}

// A column shard [c0, c0 + nc) of a [rows, cols] tensor.
static lks_tensor bind_cols(lks_model *m, bool mtp, const char *name, int64_t rows, int64_t cols,
                            int64_t c0, int64_t nc) {
  return bind_w(m, mtp, name, rows, cols, 0, rows, c0, nc, true);
}

// A SwiGLU FFN whose intermediate rows [i0, i0 + ni) of `inter` are this rank's: gate and up by
// rows, down by columns. ni == inter binds it whole (a routed expert, or world 1).
static void bind_ffn(lks_model *m, bool mtp, const char *prefix, int inter, int i0, int ni,
                     ffn_w *f) {
  char n[256];
  int H = m->cfg.hidden;
  snprintf(n, sizeof n, "%s.gate_proj.weight", prefix);
  f->gate = bind_rows(m, mtp, n, inter, H, i0, ni);
  snprintf(n, sizeof n, "%s.up_proj.weight", prefix);
  f->up = bind_rows(m, mtp, n, inter, H, i0, ni);
  snprintf(n, sizeof n, "%s.down_proj.weight", prefix);
  f->down = bind_cols(m, mtp, n, H, inter, i0, ni);
}

static int bind_layer(lks_model *m, int l) {
  const lks_config *c = &m->cfg;
  const shard *sh = &m->sh;
  bool mtp = l >= c->n_layers;
  layer_w *L = &m->layers[l];
  int H = c->hidden, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
  int q0 = sh->h0 * hd, nq = sh->n_heads * hd, k0 = sh->kv0 * hd, nk = sh->n_kv * hd;
  char n[256];
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
  L->ln1 = bind(m, mtp, NAME("input_layernorm.weight"), 0, H, true);
  L->ln2 = bind(m, mtp, NAME("post_attention_layernorm.weight"), 0, H, true);
  if (m->mla) {
    L->mla = lks__mla_bind(m->mla, m, l);
    goto ffn;
  }
  L->wq = bind_rows(m, mtp, NAME("self_attn.q_proj.weight"), qd, H, q0, nq);
  L->wk = bind_rows(m, mtp, NAME("self_attn.k_proj.weight"), kvd, H, k0, nk);
  L->wv = bind_rows(m, mtp, NAME("self_attn.v_proj.weight"), kvd, H, k0, nk);
  L->wo = bind_cols(m, mtp, NAME("self_attn.o_proj.weight"), H, qd, q0, nq);
  if (c->attn_bias) {
    L->bq = bind_rows(m, mtp, NAME("self_attn.q_proj.bias"), 0, qd, q0, nq);
    L->bk = bind_rows(m, mtp, NAME("self_attn.k_proj.bias"), 0, kvd, k0, nk);
    L->bv = bind_rows(m, mtp, NAME("self_attn.v_proj.bias"), 0, kvd, k0, nk);
  }
  if (c->qk_norm) {
    L->q_norm = bind(m, mtp, NAME("self_attn.q_norm.weight"), 0, hd, true);
    L->k_norm = bind(m, mtp, NAME("self_attn.k_norm.weight"), 0, hd, true);
  }
ffn:
  // The MTP layer is always an MoE layer (GLM's nextn layer follows the last, MoE, layer).
  L->moe = mtp || l >= c->first_dense;
  if (!L->moe) {
    snprintf(n, sizeof n, "model.layers.%d.mlp", l);
    bind_ffn(m, mtp, n, c->inter, sh->inter0, sh->inter, &L->dense);
  } else {
    L->router = bind(m, mtp, NAME("mlp.gate.weight"), c->n_experts, H, true);
    L->e_bias = bind(m, mtp, NAME("mlp.gate.e_score_correction_bias"), 0, c->n_experts, true);
    L->experts = calloc((size_t)c->n_experts, sizeof *L->experts);
    if (!L->experts) return lks_set_error(LKS_ENOMEM, "out of memory");
    for (int e = sh->e0; e < sh->e0 + sh->n_experts; e++) {
      snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d", l, e);
      bind_ffn(m, mtp, n, c->moe_inter, sh->ex0, sh->ex_n, &L->experts[e]);
    }
    if (c->n_shared > 0) {
      snprintf(n, sizeof n, "model.layers.%d.mlp.shared_experts", l);
      bind_ffn(m, mtp, n, c->moe_inter * c->n_shared, sh->sh0, sh->shared, &L->shared);
      // With experts by rows every rank has the same share of a token's experts: the shared
      // expert stays split by rows too (shared_balanced is for experts in blocks).
      if (sh->world > 1 && !m->be->ops->moe && sh->ex_n == c->moe_inter)
        bind_ffn(m, mtp, n, c->moe_inter * c->n_shared, 0, c->moe_inter * c->n_shared,
                 &L->shared_all);
    }
  }
  if (mtp) {
    L->enorm = bind(m, mtp, NAME("enorm.weight"), 0, H, true);
    L->hnorm = bind(m, mtp, NAME("hnorm.weight"), 0, H, true);
    L->eh_proj = bind(m, mtp, NAME("eh_proj.weight"), H, 2 * H, true);
    L->head_norm = bind(m, mtp, NAME("shared_head.norm.weight"), 0, H, true);
  }
#undef NAME
  return 0;
}

lks_tensor lks__model_bind(lks_model *m, bool mtp, const char *name, int64_t rows, int64_t cols,
                           bool required) {
  return bind(m, mtp, name, rows, cols, required);
}
lks_tensor lks__model_bind_rows(lks_model *m, bool mtp, const char *name, int64_t rows,
                                int64_t cols, int64_t r0, int64_t nr) {
  return bind_rows(m, mtp, name, rows, cols, r0, nr);
}
lks_tensor lks__model_bind_cols(lks_model *m, bool mtp, const char *name, int64_t rows,
                                int64_t cols, int64_t c0, int64_t nc) {
  return bind_cols(m, mtp, name, rows, cols, c0, nc);
}

int lks_model_check_split(const lks_config *c, int W) {
  if (W < 1) return lks_set_error(LKS_ECONFIG, "world size %d", W);
  struct {
    const char *field;
    int v;
  } must[] = {{"num_attention_heads", c->n_heads}, {"n_routed_experts", c->n_experts},
              {"intermediate_size", c->inter},
              {"moe_intermediate_size * n_shared_experts", c->moe_inter * c->n_shared}};
  for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
    if (must[i].v % W)
      return lks_set_error(LKS_ECONFIG, "cannot split the model %d ways: %s = %d is not divisible by %d",
                           W, must[i].field, must[i].v, W);
  if (c->vocab <= (W - 1) * ((c->vocab + W - 1) / W))
    return lks_set_error(LKS_ECONFIG, "cannot split the model %d ways: vocab_size = %d is too small",
                         W, c->vocab);
  // KV heads split with the query heads, or each rank's query heads share one KV head.
  int per_rank = c->n_heads / W, group = c->n_heads / c->n_kv_heads;
  if (c->n_kv_heads % W && group % per_rank)
    return lks_set_error(LKS_ECONFIG,
                         "cannot split the model %d ways: num_key_value_heads = %d is not divisible "
                         "by %d and a rank's %d query heads span several KV heads",
                         W, c->n_kv_heads, W, per_rank);
  return 0;
}

static void plan_shard(const lks_config *c, int rank, int W, shard *sh) {
  sh->rank = rank;
  sh->world = W;
  sh->n_heads = c->n_heads / W;
  sh->h0 = rank * sh->n_heads;
  if (c->n_kv_heads % W == 0) {
    sh->n_kv = c->n_kv_heads / W;
    sh->kv0 = rank * sh->n_kv;
  } else {
    sh->n_kv = 1;
    sh->kv0 = sh->h0 / (c->n_heads / c->n_kv_heads);
  }
  sh->n_experts = c->n_experts / W;
  sh->e0 = rank * sh->n_experts;
  sh->ex0 = 0;
  sh->ex_n = c->moe_inter;
  sh->inter = c->inter / W;
  sh->inter0 = rank * sh->inter;
  sh->shared = c->moe_inter * c->n_shared / W;
  sh->sh0 = rank * sh->shared;
  sh->vocab_block = (c->vocab + W - 1) / W;
  sh->v0 = rank * sh->vocab_block < c->vocab ? rank * sh->vocab_block : c->vocab;
  int v1 = sh->v0 + sh->vocab_block < c->vocab ? sh->v0 + sh->vocab_block : c->vocab;
  sh->vocab = v1 - sh->v0;
}

int lks_model_experts_split_parse(const char *name, lks_experts_split *s) {
  if (strcmp(name, "blocks") == 0) *s = LKS_EXPERTS_BLOCKS;
  else if (strcmp(name, "rows") == 0) *s = LKS_EXPERTS_ROWS;
  else if (strcmp(name, "auto") == 0) *s = LKS_EXPERTS_AUTO;
  else return lks_set_error(LKS_ECONFIG, "--experts-split %s: expected blocks, rows or auto", name);
  return 0;
}

// The experts' split of this shard (plan_shard planned blocks). Rows need moe_intermediate_size
// divisible by the world (refused naming the field otherwise); their fit with the experts' FP8
// blocks and NVFP4 groups is checked tensor by tensor as they are bound.
// Auto takes rows where they can be had: at world 2 on air-1g (BF16, one thread a rank, rows'
// column slices packed, six alternated pairs, 2026-12-07) rows decoded 66.0-78.2 tokens/s
// (median 77.4) against blocks' 66.8-73.0 (69.5), rank 0 in collectives 5-8 % of a step (one
// run 14 %) against 11-18 %: the work the routing leaves uneven costs blocks more than the
// smaller products cost rows.
static int plan_experts(lks_model *m, lks_experts_split split) {
  shard *sh = &m->sh;
  int W = sh->world, I = m->cfg.moe_inter;
  if (split == LKS_EXPERTS_AUTO) {
    int quantum = m->quant.scheme == LKS_Q_FP8_BLOCK ? LKS_Q_FP8_BLOCK_SIZE
                  : m->quant.scheme == LKS_Q_NVFP4   ? LKS_Q_NVFP4_GROUP
                                                     : 1;
    bool rows = W > 1 && !m->be->ops->moe && m->cfg.n_experts > 0 && I > 0 && I % W == 0 &&
                (I / W) % quantum == 0;
    split = rows ? LKS_EXPERTS_ROWS : LKS_EXPERTS_BLOCKS;
    if (W > 1)
      LKS_LOG(LKS_LOG_INFO, "--experts-split auto: %s", rows ? "rows" : "blocks");
  }
  if (W == 1 || split != LKS_EXPERTS_ROWS) return 0;
  if (m->be->ops->moe)  // the cuda backend: its routing on the device takes experts in blocks
    return lks_set_error(LKS_ECONFIG, "--experts-split rows: the %s backend runs experts in "
                         "blocks only", m->be->ops->name);
  if (I % W)
    return lks_set_error(LKS_ECONFIG,
                         "--experts-split rows: cannot split the experts %d ways: "
                         "moe_intermediate_size = %d is not divisible by %d", W, I, W);
  sh->e0 = 0;
  sh->n_experts = m->cfg.n_experts;
  sh->ex_n = I / W;
  sh->ex0 = sh->rank * sh->ex_n;
  return 0;
}

bool lks_model_experts_by_rows(const lks_model *m) { return m->sh.ex_n < m->cfg.moe_inter; }

lks_model *lks_model_load(const char *dir, lks_backend *be, lks_problem_fn fn, void *ctx) {
  return lks_model_load_shard(dir, be, NULL, LKS_EXPERTS_BLOCKS, fn, ctx);
}

lks_model *lks_model_load_shard(const char *dir, lks_backend *be, lks_comm *comm,
                                lks_experts_split split, lks_problem_fn fn, void *ctx) {
  lks_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->be = be;
  m->comm = comm && comm->world > 1 ? comm : NULL;
  m->problem = fn;
  m->problem_ctx = ctx;
  int rank = m->comm ? comm->rank : 0, world = m->comm ? comm->world : 1;
  if (lks_config_load(dir, &m->cfg) < 0 || lks_model_check_split(&m->cfg, world) < 0) {
    if (fn) fn(ctx, lks_last_error());
    goto fail;
  }
  plan_shard(&m->cfg, rank, world, &m->sh);
  if (lks_quant_config_load(dir, &m->quant) < 0) {
    if (fn) fn(ctx, lks_last_error());
    goto fail;
  }
  if (m->cfg.arch == LKS_ARCH_GLM_MOE_DSA &&
      !(m->mla = lks__mla_new(be, &m->cfg, m->sh.h0, m->sh.n_heads))) {
    if (fn) fn(ctx, lks_last_error());
    goto fail;
  }
  m->st = lks_safetensors_open(dir);
  if (!m->st) {
    if (fn) fn(ctx, lks_last_error());
    goto fail;
  }
  if (plan_experts(m, split) < 0) {
    if (fn) fn(ctx, lks_last_error());
    goto fail;
  }
  const lks_config *c = &m->cfg;
  m->embed = bind(m, false, "model.embed_tokens.weight", c->vocab, c->hidden, true);
  m->norm = bind(m, false, "model.norm.weight", 0, c->hidden, true);
  m->lm_head = bind_rows(m, false, "lm_head.weight", c->vocab, c->hidden, m->sh.v0, m->sh.vocab);
  int n_layers = c->n_layers + c->n_mtp;
  m->layers = calloc((size_t)n_layers, sizeof *m->layers);
  if (!m->layers) goto fail;
  for (int l = 0; l < n_layers; l++)
    if (bind_layer(m, l) < 0) goto fail;
  if (m->n_problems) {
    lks_set_error(LKS_EFORMAT, "%s: %d problem%s with the weights (first: %s)", dir, m->n_problems,
                  m->n_problems > 1 ? "s" : "", m->first_problem);
    goto fail;
  }
  if (m->comm)
    LKS_LOG(LKS_LOG_INFO,
            "shard %d/%d: heads [%d, %d), kv heads [%d, %d), experts [%d, %d) rows [%d, %d), "
            "vocab [%d, %d); %.1f MB of weights",
            rank, world, m->sh.h0, m->sh.h0 + m->sh.n_heads, m->sh.kv0, m->sh.kv0 + m->sh.n_kv,
            m->sh.e0, m->sh.e0 + m->sh.n_experts, m->sh.ex0, m->sh.ex0 + m->sh.ex_n, m->sh.v0,
            m->sh.v0 + m->sh.vocab, m->weight_bytes / 1e6);
  return m;
fail:
  lks_model_free(m);
  return NULL;
}

int64_t lks_model_loaded_bytes(const lks_model *m) { return m->weight_bytes; }

static void free_acts(lks_model *m) {
  lks_buf **b[] = {&m->a.x,   &m->a.h,      &m->a.q,    &m->a.k,    &m->a.v,
                   &m->a.att, &m->a.rl,     &m->a.hid,  &m->a.logits, &m->a.ucat,
                   &m->a.carry, &m->a.mlogits};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    m->be->ops->buf_free(m->be, *b[i]);
    *b[i] = NULL;
  }
  m->a.cap = 0;
}

void lks_model_free(lks_model *m) {
  if (!m) return;
  lks_dflash_free(m->dflash);
  if (m->cap) m->be->ops->buf_free(m->be, m->cap);
  free(m->ident);
  free_acts(m);
  for (int i = 0; i < m->n_bufs; i++) m->be->ops->buf_free(m->be, m->bufs[i]);
  free(m->bufs);
  for (int l = 0; m->layers && l < m->cfg.n_layers + m->cfg.n_mtp; l++) free(m->layers[l].experts);
  free(m->layers);
  lks_safetensors_close(m->st);
  lks__mla_free(m->mla);
  free(m->route_ids);
  free(m->route_w);
  free(m->exp_rows);
  free(m->sh_rows);
  free(m->exp_w);
  free(m->exp_count);
  free(m->exp_calls);
  free(m->slots);
  free(m->sub);
  free(m->gather_buf);
  free(m);
}

const lks_config *lks_model_config(const lks_model *m) { return &m->cfg; }
bool lks_model_has_mtp(const lks_model *m) { return m->cfg.n_mtp > 0; }
lks_backend *lks_model_backend(const lks_model *m) { return m->be; }
void lks_model_shard_rank(const lks_model *m, int *rank, int *world) {
  *rank = m->sh.rank;
  *world = m->sh.world;
}

int lks_model_kv_dtype_parse(const char *name, lks_dtype *t) {
  if (strcmp(name, "f32") == 0) *t = LKS_F32;
  else if (strcmp(name, "bf16") == 0) *t = LKS_BF16;
  else return lks_set_error(LKS_ECONFIG, "--kv-dtype %s: expected f32 or bf16", name);
  return 0;
}

int lks_model_set_kv_dtype(lks_model *m, lks_dtype t) {
  if (t != LKS_F32 && t != LKS_BF16)
    return lks_set_error(LKS_EINVAL, "KV cache: %s is not a KV cache type (f32 or bf16)",
                         lks_dtype_name(t));
  if (m->mla && t != LKS_F32) {
    LKS_LOG(LKS_LOG_WARN, "KV cache: glm_moe_dsa's latent cache is f32 (--kv-dtype applies to "
                          "GQA caches)");
    return 0;
  }
  m->kv_dtype = t;
  return 0;
}

lks_kv_cache *lks_model_kv_new(const lks_model *m, bool mtp, int block_size, int n_blocks,
                               int max_seqs, int max_seq_len) {
  if (m->mla) return lks__mla_kv_new(m->be, &m->cfg, mtp, block_size, n_blocks, max_seqs, max_seq_len);
  return lks_kv_new(m->be, mtp ? m->cfg.n_mtp : m->cfg.n_layers, m->sh.n_kv, m->cfg.head_dim,
                    m->kv_dtype, block_size, n_blocks, max_seqs, max_seq_len);
}

// Makes the activation buffers hold n rows.
static int reserve(lks_model *m, int n) {
  if (n <= m->a.cap) return 0;
  free_acts(m);
  const lks_config *c = &m->cfg;
  lks_backend *be = m->be;
  size_t f = sizeof(float), H = (size_t)c->hidden, N = (size_t)n;
  size_t qd = (size_t)m->sh.n_heads * c->head_dim, kvd = (size_t)m->sh.n_kv * c->head_dim;
  struct {
    lks_buf **b;
    size_t bytes;
  } want[] = {
      {&m->a.x, N * H * f},       {&m->a.h, N * H * f},       {&m->a.q, N * qd * f},
      {&m->a.k, N * kvd * f},     {&m->a.v, N * kvd * f},     {&m->a.att, N * qd * f},
      {&m->a.rl, N * (size_t)c->n_experts * f},               {&m->a.hid, N * H * f},
      {&m->a.logits, N * (size_t)m->sh.vocab * f},            {&m->a.ucat, N * 2 * H * f},
      {&m->a.carry, N * H * f},   {&m->a.mlogits, N * (size_t)m->sh.vocab * f},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    *want[i].b = be->ops->buf_alloc(be, want[i].bytes);
    if (!*want[i].b) {
      free_acts(m);
      return lks_set_error(LKS_ENOMEM, "cannot allocate activations for %d rows", n);
    }
  }
  size_t k = (size_t)n * (size_t)c->top_k;
  int32_t *ids = realloc(m->route_ids, k * sizeof *ids);
  if (ids) m->route_ids = ids;
  float *w = realloc(m->route_w, k * sizeof *w);
  if (w) m->route_w = w;
  int32_t *rows = realloc(m->exp_rows, k * sizeof *rows);
  if (rows) m->exp_rows = rows;
  float *ew = realloc(m->exp_w, k * sizeof *ew);
  if (ew) m->exp_w = ew;
  int32_t *slots = realloc(m->slots, N * sizeof *slots);
  if (slots) m->slots = slots;
  int32_t *sub = realloc(m->sub, 4 * N * sizeof *sub);
  if (sub) m->sub = sub;
  int32_t *shr = realloc(m->sh_rows, 2 * N * sizeof *shr);
  if (shr) m->sh_rows = shr;
  if (!m->exp_count) m->exp_count = calloc((size_t)c->n_experts + 1, sizeof *m->exp_count);
  if (!m->exp_calls) m->exp_calls = calloc((size_t)c->n_experts + 2, sizeof *m->exp_calls);
  if (!ids || !w || !rows || !ew || !slots || !sub || !shr || !m->exp_count || !m->exp_calls)
    return lks_set_error(LKS_ENOMEM, "cannot allocate routing for %d rows", n);
  m->a.cap = n;
  return 0;
}

static lks_tensor act(lks_buf *b, int n, int cols) {
  return lks_tensor_2d(b, 0, LKS_F32, n, cols);
}

// The shared expert's calls after the n_calls routed ones (world > 1, host routing), row by row:
// the whole shared expert on the one rank that runs the fewest of the row's routed experts
// (none on the others), or, where several ranks run the fewest, each its rows of it (as at
// world 1 split). A MoE layer waits for its slowest rank, and with experts in blocks a token's
// top-k fall unevenly (8 of 32 over two ranks: 1.9 experts apart on average): the shared
// expert on the lighter rank halves that where it can. Each row's arithmetic depends on its own
// routing only, never on the other rows of the batch.
static int shared_balanced(lks_model *m, const layer_w *L, int n, int n_calls) {
  const lks_config *c = &m->cfg;
  int W = m->sh.world, per = m->sh.n_experts, me = m->sh.rank, nf = 0, ns = 0;
  int32_t *full = m->sh_rows, *split = m->sh_rows + n;
  for (int r = 0; r < n; r++) {
    int cnt[64] = {0}, lo = 0, n_lo = 0;
    if (W <= 64) {
      for (int j = 0; j < c->top_k; j++) cnt[m->route_ids[r * c->top_k + j] / per]++;
      for (int k = 1; k < W; k++) lo = cnt[k] < cnt[lo] ? k : lo;
      for (int k = 0; k < W; k++) n_lo += cnt[k] == cnt[lo];
    }
    if (n_lo != 1) split[ns++] = r;  // a tie (or more than 64 ranks): split
    else if (lo == me) full[nf++] = r;
  }
  if (nf)
    m->exp_calls[n_calls++] = (lks_expert_call){L->shared_all.gate, L->shared_all.up,
                                                L->shared_all.down, full, NULL, nf};
  if (ns)
    m->exp_calls[n_calls++] =
        (lks_expert_call){L->shared.gate, L->shared.up, L->shared.down, split, NULL, ns};
  return n_calls;
}

// The routed experts of an MoE layer: route, group the rows by expert, run each expert once on
// its rows (weights applied inside), add into x.
static int moe(lks_model *m, const layer_w *L, lks_tensor x, lks_tensor h, int n) {
  const lks_config *c = &m->cfg;
  lks_backend *be = m->be;
  lks_tensor rl = act(m->a.rl, n, c->n_experts);
  lks_tensor none = {0};
  LKS_TRY(be->ops->matmul(be, rl, h, L->router, none, false));
  lks_route_params p = {c->n_experts, c->top_k, c->n_group, c->topk_group, c->norm_topk_prob,
                        c->routed_scaling};
  int n_calls = 0;  // expert calls for lks_backend_experts
  if (be->ops->moe) {
    // The backend routes and runs the experts itself (the routing stays on its device).
    lks_moe_experts ex = {&L->experts[0].gate, &L->experts[0].up, &L->experts[0].down,
                          sizeof(ffn_w) / sizeof(lks_tensor), m->sh.e0, m->sh.n_experts};
    int rc = be->ops->moe(be, x, h, rl, L->e_bias, &p, &ex, NULL, NULL);
    if (rc != LKS_EUNSUPPORTED) {
      LKS_TRY(rc);
      goto shared;
    }
    static bool told;
    if (!told) LKS_LOG(LKS_LOG_INFO, "moe: %s; routing on the host instead", lks_last_error());
    told = true;
  }
  LKS_TRY(be->ops->route(be, rl, L->e_bias, &p, m->route_ids, m->route_w));
  // Counting sort of (row, weight) pairs by expert: exp_count[e] .. exp_count[e+1].
  int *cnt = m->exp_count;
  memset(cnt, 0, (size_t)(c->n_experts + 1) * sizeof *cnt);
  for (int i = 0; i < n * c->top_k; i++) cnt[m->route_ids[i] + 1]++;
  for (int e = 0; e < c->n_experts; e++) cnt[e + 1] += cnt[e];
  for (int i = 0; i < n * c->top_k; i++) {
    int e = m->route_ids[i];
    int at = cnt[e]++;
    m->exp_rows[at] = i / c->top_k;
    m->exp_w[at] = m->route_w[i];
  }
  // cnt[e] now holds the end of expert e's range; its start is the previous end. Only this
  // rank's block of experts runs here, or with experts by rows its rows of every expert; the
  // others' contributions arrive in the all-reduce. All of them and the shared expert go to the
  // backend at once (one parallel phase each for the gate/up and the down products on the CPU),
  // in the order of one call per expert.
  int e_lo = m->sh.e0, e_hi = m->sh.e0 + m->sh.n_experts;
  for (int e = 0, start = 0; e < c->n_experts; e++) {
    int end = cnt[e];
    if (end > start && e >= e_lo && e < e_hi) {
      const ffn_w *f = &L->experts[e];
      m->exp_calls[n_calls++] = (lks_expert_call){f->gate, f->up, f->down, m->exp_rows + start,
                                                  m->exp_w + start, end - start};
    }
    start = end;
  }
shared:
  // shared_all is bound only where the routing is on the host (route_ids holds this layer's).
  if (c->n_shared > 0 && L->shared_all.gate.buf)
    n_calls = shared_balanced(m, L, n, n_calls);
  else if (c->n_shared > 0)
    m->exp_calls[n_calls++] =
        (lks_expert_call){L->shared.gate, L->shared.up, L->shared.down, NULL, NULL, n};
  return lks_backend_experts(be, x, h, m->exp_calls, n_calls);
}

int lks_model_allreduce(lks_model *m, lks_tensor x, const char *what, int layer) {
  if (!m->comm) return 0;
  lks_comm_where w = {what, layer};
  void *p = (char *)m->be->ops->buf_ptr(m->be, x.buf) + x.offset;
  return m->comm->ops->allreduce_sum(m->comm, p, (size_t)(x.rows * x.cols), LKS_F32, w);
}

int lks_model_partial_start(lks_model *m, lks_tensor x) {
  if (!m->comm || m->sh.rank == 0) return 0;
  return m->be->ops->zero(m->be, x);
}

// GQA attention (glm4_moe) of h = input_layernorm(x): x += Wo attention(h), this rank's heads.
static int gqa_attention(lks_model *m, const layer_w *L, lks_tensor x, lks_tensor h,
                         const lks_kv_layer *kv, const lks_attn_rows *rows, const int32_t *pos,
                         int n) {
  const lks_config *c = &m->cfg;
  lks_backend *be = m->be;
  int nh = m->sh.n_heads, nkv = m->sh.n_kv;
  int qd = nh * c->head_dim, kvd = nkv * c->head_dim;
  lks_tensor q = act(m->a.q, n, qd), k = act(m->a.k, n, kvd), v = act(m->a.v, n, kvd);
  lks_tensor att = act(m->a.att, n, qd);
  const lks_matmul_part qkv[3] = {{q, L->wq, L->bq}, {k, L->wk, L->bk}, {v, L->wv, L->bv}};
  LKS_TRY(lks_backend_matmuls(be, h, qkv, 3));
  if (c->qk_norm) {
    lks_tensor qh = lks_tensor_reshape(q, (int64_t)n * nh, c->head_dim);
    lks_tensor kh = lks_tensor_reshape(k, (int64_t)n * nkv, c->head_dim);
    LKS_TRY(be->ops->rmsnorm(be, qh, qh, L->q_norm, c->eps));
    LKS_TRY(be->ops->rmsnorm(be, kh, kh, L->k_norm, c->eps));
  }
  if (c->rot_dims > 0) {
    LKS_TRY(be->ops->rope(be, q, c->head_dim, c->rot_dims, c->rope_theta, LKS_ROPE_HALF_SPLIT, pos));
    LKS_TRY(be->ops->rope(be, k, c->head_dim, c->rot_dims, c->rope_theta, LKS_ROPE_HALF_SPLIT, pos));
  }
  LKS_TRY(be->ops->kv_store(be, kv, k, v, rows));
  LKS_TRY(be->ops->attention(be, att, q, kv, rows, nh, 1.0f / sqrtf((float)c->head_dim)));
  lks_tensor none = {0};
  LKS_TRY(lks_model_partial_start(m, x));
  return be->ops->matmul(be, x, att, L->wo, none, true);
}

// The K and V rows that GQA attention stores for the n rows of x [n, H], this rank's KV heads,
// without the attention itself: exactly what gqa_attention stores for them (the same ops on the
// same rows; every kernel's row is independent of its batch).
static int gqa_kv_rows(lks_model *m, const layer_w *L, const lks_kv_layer *kv,
                       const lks_attn_rows *rows, const int32_t *pos, int n) {
  const lks_config *c = &m->cfg;
  lks_backend *be = m->be;
  int kvd = m->sh.n_kv * c->head_dim;
  lks_tensor x = act(m->a.x, n, c->hidden), h = act(m->a.h, n, c->hidden);
  lks_tensor k = act(m->a.k, n, kvd), v = act(m->a.v, n, kvd);
  LKS_TRY(be->ops->rmsnorm(be, h, x, L->ln1, c->eps));
  const lks_matmul_part kv2[2] = {{k, L->wk, L->bk}, {v, L->wv, L->bv}};
  LKS_TRY(lks_backend_matmuls(be, h, kv2, 2));
  if (c->qk_norm) {
    lks_tensor kh = lks_tensor_reshape(k, (int64_t)n * m->sh.n_kv, c->head_dim);
    LKS_TRY(be->ops->rmsnorm(be, kh, kh, L->k_norm, c->eps));
  }
  if (c->rot_dims > 0)
    LKS_TRY(be->ops->rope(be, k, c->head_dim, c->rot_dims, c->rope_theta, LKS_ROPE_HALF_SPLIT, pos));
  return be->ops->kv_store(be, kv, k, v, rows);
}

// One decoder layer on the residual stream x [n, H]: this rank's heads and FFN shard, with one
// all-reduce after the attention and one after the FFN. kl: the layer's index in `kv` (the
// target layer, or 0 in the MTP cache).
static int layer_forward(lks_model *m, int l, const layer_w *L, const lks_kv_cache *kv, int kl,
                         const lks_attn_rows *rows, const int32_t *pos, int n) {
  const lks_config *c = &m->cfg;
  lks_backend *be = m->be;
  int H = c->hidden;
  lks_tensor x = act(m->a.x, n, H), h = act(m->a.h, n, H);
  LKS_TRY(be->ops->rmsnorm(be, h, x, L->ln1, c->eps));
  if (m->mla) {
    LKS_TRY(lks_model_partial_start(m, x));
    LKS_TRY(lks__mla_forward(m->mla, l, x, h, kv, kl, rows, n));
  } else {
    LKS_TRY(gqa_attention(m, L, x, h, lks_kv_layer_at(kv, kl), rows, pos, n));
  }
  LKS_TRY(lks_model_allreduce(m, x, "attention", l));
  LKS_TRY(be->ops->rmsnorm(be, h, x, L->ln2, c->eps));
  LKS_TRY(lks_model_partial_start(m, x));
  if (L->moe)
    LKS_TRY(moe(m, L, x, h, n));
  else
    LKS_TRY(be->ops->expert(be, x, h, NULL, NULL, n, L->dense.gate, L->dense.up, L->dense.down));
  return lks_model_allreduce(m, x, L->moe ? "moe" : "ffn", l);
}

static int check_batch(const lks_model *m, const lks_batch *b) {
  if (b->n <= 0 || b->n_out < 0 || b->n_out > b->n)
    return lks_set_error(LKS_EINVAL, "forward: %d rows with %d outputs", b->n, b->n_out);
  for (int i = 0; i < b->n; i++)
    if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab)
      return lks_set_error(LKS_ERANGE, "forward: token id %d outside the vocabulary [0, %d)",
                           b->tokens[i], m->cfg.vocab);
  for (int i = 0; i < b->n_out; i++)
    if (b->out_rows[i] < 0 || b->out_rows[i] >= b->n)
      return lks_set_error(LKS_ERANGE, "forward: output row %d outside the batch", b->out_rows[i]);
  return 0;
}

typedef struct {
  lks_model *m;
  lks_kv_cache *kv;
  const lks_batch *b;
  const lks_attn_rows *rows;
  lks_tensor *logits, *hidden;
} fwd_step;

static int forward_step(void *ctx);

// Small batches without collectives may be recorded and replayed by the backend
// (lks_backend_step): the op sequence of a forward is fixed by the row count, the outputs asked
// for, the sequences addressed, the block-table width and the cache (every buffer is fixed while
// the activations do not grow). 0: run as called.
static uint64_t step_key(const lks_model *m, const lks_kv_cache *kv, const lks_batch *b,
                         const lks_attn_rows *rows, bool logits) {
  if (m->comm || b->n > 64) return 0;
  int n_seqs = 0;
  for (int i = 0; i < b->n; i++)
    if (b->seq[i] + 1 > n_seqs) n_seqs = b->seq[i] + 1;
  uint64_t k = 1469598103934665603ull;
  uint64_t parts[] = {(uint64_t)b->n,        (uint64_t)b->n_out,       (uint64_t)n_seqs,
                      (uint64_t)rows->max_blocks, (uint64_t)(uintptr_t)kv, (uint64_t)m->a.cap,
                      (uint64_t)logits, (uint64_t)(uintptr_t)m->cap};  // the DFlash capture buffer
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) k = (k ^ parts[i]) * 1099511628211ull;
  return k ? k : 1;
}

// Copies x [n, H] into columns [j * H, (j + 1) * H) of the capture buffer.
static int capture(lks_model *m, int j, lks_tensor x, int n) {
  int H = m->cfg.hidden;
  lks_tensor all = lks_tensor_2d(m->cap, 0, LKS_F32, n, (int64_t)m->n_cap * H);
  return m->be->ops->gather_rows(m->be, lks_tensor_cols(all, (int64_t)j * H, H), x, m->ident);
}

static int reserve_capture(lks_model *m, int n) {
  m->cap_n = n;
  if (!m->n_cap || n <= m->cap_rows) return 0;
  if (m->cap) m->be->ops->buf_free(m->be, m->cap);
  m->cap_rows = 0;
  m->cap = m->be->ops->buf_alloc(m->be, (size_t)n * m->n_cap * m->cfg.hidden * sizeof(float));
  int32_t *id = realloc(m->ident, (size_t)n * sizeof *id);
  if (id) m->ident = id;
  if (!m->cap || !id) return lks_set_error(LKS_ENOMEM, "capture for %d rows", n);
  for (int i = 0; i < n; i++) m->ident[i] = i;
  m->cap_rows = n;
  return 0;
}

int lks_model_attach_dflash(lks_model *m, lks_dflash *d) {
  if (m->dflash) return lks_set_error(LKS_EINVAL, "a DFlash drafter is already attached");
  if (m->mla) return lks_set_error(LKS_EUNSUPPORTED, "DFlash drafting of glm_moe_dsa is not supported");
  const int *layers;
  int n = lks_dflash_capture_layers(d, &layers);
  m->dflash = d;
  m->n_cap = n;
  memcpy(m->cap_at, layers, (size_t)n * sizeof *layers);
  return 0;
}

lks_dflash *lks_model_dflash(const lks_model *m) { return m->dflash; }

lks_tensor lks_model_captured(const lks_model *m) {
  return lks_tensor_2d(m->cap, 0, LKS_F32, m->cap_n, (int64_t)m->n_cap * m->cfg.hidden);
}

int lks_model_embed(lks_model *m, lks_tensor out, const int32_t *ids) {
  return m->be->ops->embed(m->be, out, m->embed, ids);
}

int lks_model_lm_head(lks_model *m, lks_tensor x, lks_tensor *logits) {
  LKS_TRY(reserve(m, (int)x.rows));
  lks_tensor out = act(m->a.mlogits, (int)x.rows, m->sh.vocab), none = {0};
  LKS_TRY(m->be->ops->matmul(m->be, out, x, m->lm_head, none, false));
  *logits = out;
  return 0;
}

int lks_model_forward(lks_model *m, lks_kv_cache *kv, const lks_batch *b, lks_tensor *logits,
                      lks_tensor *hidden) {
  LKS_TRY(check_batch(m, b));
  LKS_TRY(reserve(m, b->n));
  LKS_TRY(reserve_capture(m, b->n));
  lks_attn_rows rows = {.n = b->n, .seq = b->seq, .pos = b->pos};
  LKS_TRY(lks_kv_rows(kv, &rows, m->slots));
  fwd_step f = {m, kv, b, &rows, logits, hidden};
  return lks_backend_step(m->be, step_key(m, kv, b, &rows, logits != NULL), forward_step, &f);
}

static int forward_step(void *ctx) {
  fwd_step *f = ctx;
  lks_model *m = f->m;
  lks_kv_cache *kv = f->kv;
  const lks_batch *b = f->b;
  lks_tensor *logits = f->logits, *hidden = f->hidden;
  const lks_attn_rows rows = *f->rows;
  const lks_config *c = &m->cfg;
  lks_backend *be = m->be;
  int n = b->n;
  lks_tensor x = act(m->a.x, n, c->hidden);
  LKS_TRY(be->ops->embed(be, x, m->embed, b->tokens));
  for (int l = 0; l < c->n_layers; l++) {
    LKS_TRY(layer_forward(m, l, &m->layers[l], kv, l, &rows, b->pos, n));
    for (int j = 0; j < m->n_cap; j++)
      if (m->cap_at[j] == l) LKS_TRY(capture(m, j, x, n));
  }
  lks_tensor hid = act(m->a.hid, n, c->hidden);
  LKS_TRY(be->ops->rmsnorm(be, hid, x, m->norm, c->eps));
  if (hidden) *hidden = hid;
  if (logits && b->n_out > 0) {
    lks_tensor sel = act(m->a.h, b->n_out, c->hidden);
    LKS_TRY(be->ops->gather_rows(be, sel, hid, b->out_rows));
    lks_tensor out = act(m->a.logits, b->n_out, m->sh.vocab);
    lks_tensor none = {0};
    LKS_TRY(be->ops->matmul(be, out, sel, m->lm_head, none, false));
    *logits = out;
  }
  return 0;
}

int lks_model_mtp(lks_model *m, lks_kv_cache *mtp_kv, const lks_batch *b, lks_tensor h_in,
                  lks_tensor *logits, lks_tensor *carry) {
  const lks_config *c = &m->cfg;
  lks_backend *be = m->be;
  if (c->n_mtp < 1) return lks_set_error(LKS_EUNSUPPORTED, "this model has no MTP layer");
  LKS_TRY(check_batch(m, b));
  if (h_in.rows != b->n || h_in.cols != c->hidden)
    return lks_set_error(LKS_ESHAPE, "mtp: hidden input has %lld rows, batch %d",
                         (long long)h_in.rows, b->n);
  // h_in may be a view of this model's own carry or hidden buffer, which growing would free.
  if (b->n > m->a.cap && (h_in.buf == m->a.carry || h_in.buf == m->a.hid))
    return lks_set_error(LKS_EINVAL, "mtp: %d rows exceed the %d of the buffer h_in comes from",
                         b->n, m->a.cap);
  LKS_TRY(reserve(m, b->n));
  int n = b->n, H = c->hidden;
  const layer_w *L = &m->layers[c->n_layers];
  lks_attn_rows rows = {.n = n, .seq = b->seq, .pos = b->pos};
  LKS_TRY(lks_kv_rows(mtp_kv, &rows, m->slots));
  // u = eh_proj [enorm(embed(t)); hnorm(h)], the embedding half first.
  lks_tensor ucat = act(m->a.ucat, n, 2 * H);
  lks_tensor e_half = lks_tensor_cols(ucat, 0, H), h_half = lks_tensor_cols(ucat, H, H);
  lks_tensor x = act(m->a.x, n, H);
  LKS_TRY(be->ops->embed(be, x, m->embed, b->tokens));
  LKS_TRY(be->ops->rmsnorm(be, e_half, x, L->enorm, c->eps));
  LKS_TRY(be->ops->rmsnorm(be, h_half, h_in, L->hnorm, c->eps));
  lks_tensor none = {0};
  LKS_TRY(be->ops->matmul(be, x, ucat, L->eh_proj, none, false));
  // Only the output rows need the layer's output; every row's K and V are needed (later rows
  // attend to them). So, unless every row is an output in order: GQA stores the K and V of all
  // rows and runs the whole layer on the output rows alone (their K and V stored again, the same
  // values); MLA (its attention stores and reads in one op) runs the layer on all rows. Then the
  // output rows, compacted, go on.
  int n_out = logits || carry ? b->n_out : 0;
  bool all = n_out == n;
  for (int i = 0; all && i < n; i++) all = b->out_rows[i] == i;
  if (all) {
    LKS_TRY(layer_forward(m, c->n_layers, L, mtp_kv, 0, &rows, b->pos, n));
  } else {
    int32_t *sseq = m->sub, *spos = sseq + n, *sslot = spos + n, *id = sslot + n;
    if (!m->mla) LKS_TRY(gqa_kv_rows(m, L, lks_kv_layer_at(mtp_kv, 0), &rows, b->pos, n));
    else LKS_TRY(layer_forward(m, c->n_layers, L, mtp_kv, 0, &rows, b->pos, n));
    if (n_out == 0) return 0;
    for (int i = 0; i < n_out; i++) {
      int r = b->out_rows[i];
      sseq[i] = b->seq[r], spos[i] = b->pos[r], id[i] = i;
    }
    lks_tensor tmp = act(m->a.ucat, n_out, H);  // ucat is free once eh_proj has read it
    LKS_TRY(be->ops->gather_rows(be, tmp, x, b->out_rows));
    x = act(m->a.x, n_out, H);
    LKS_TRY(be->ops->gather_rows(be, x, tmp, id));
    if (!m->mla) {
      lks_attn_rows sub = {.n = n_out, .seq = sseq, .pos = spos};
      LKS_TRY(lks_kv_rows(mtp_kv, &sub, sslot));
      LKS_TRY(layer_forward(m, c->n_layers, L, mtp_kv, 0, &sub, spos, n_out));
    }
  }
  lks_tensor cy = act(m->a.carry, n_out, H);
  if (n_out > 0) LKS_TRY(be->ops->rmsnorm(be, cy, x, L->head_norm, c->eps));
  if (carry) *carry = cy;
  if (logits && n_out > 0) {
    lks_tensor out = act(m->a.mlogits, n_out, m->sh.vocab);
    LKS_TRY(be->ops->matmul(be, out, cy, m->lm_head, none, false));
    *logits = out;
  }
  return 0;
}

int lks_model_argmax(lks_model *m, lks_tensor logits, int32_t *idx) {
  int n = (int)logits.rows;
  float *val = malloc((size_t)(n > 0 ? n : 1) * sizeof *val);
  if (!val) return lks_set_error(LKS_ENOMEM, "argmax: out of memory");
  int rc = m->be->ops->argmax(m->be, logits, idx, val);
  for (int i = 0; rc == 0 && i < n; i++) idx[i] += m->sh.v0;
  if (rc == 0 && m->comm) {
    lks_comm_where w = {"lm_head argmax", -1};
    rc = m->comm->ops->argmax(m->comm, val, idx, n, w);
  }
  free(val);
  return rc;
}

int lks_model_logits_host(lks_model *m, lks_tensor logits, float *dst) {
  if (!m->comm) return lks_tensor_to_host_f32(m->be, dst, logits);
  // Every rank contributes a padded block of vocab_block columns per row; then compact.
  int n = (int)logits.rows, blk = m->sh.vocab_block, W = m->sh.world, V = m->cfg.vocab;
  size_t mine = (size_t)n * blk, need = mine * (size_t)(W + 1);
  if (need > m->gather_cap) {
    float *g = realloc(m->gather_buf, need * sizeof *g);
    if (!g) return lks_set_error(LKS_ENOMEM, "logits gather: out of memory");
    m->gather_buf = g;
    m->gather_cap = need;
  }
  float *send = m->gather_buf, *recv = m->gather_buf + mine;
  memset(send, 0, mine * sizeof *send);
  for (int r = 0; r < n; r++) {
    lks_tensor row = lks_tensor_rows(logits, r, 1);
    if (m->sh.vocab) LKS_TRY(lks_tensor_to_host_f32(m->be, send + (size_t)r * blk, row));
  }
  lks_comm_where w = {"lm_head gather", -1};
  LKS_TRY(m->comm->ops->allgather(m->comm, send, recv, mine * sizeof *send, w));
  for (int k = 0; k < W; k++) {
    int v0 = k * blk, cnt = v0 + blk <= V ? blk : V - v0;
    for (int r = 0; cnt > 0 && r < n; r++)
      memcpy(dst + (size_t)r * V + v0, recv + ((size_t)k * n + r) * blk, (size_t)cnt * sizeof *dst);
  }
  return 0;
}

static int64_t tbytes(lks_tensor t) { return lks_weight_bytes(t); }
static int64_t tnum(lks_tensor t) { return t.buf ? t.rows * t.cols : 0; }

static void layer_cost(const lks_model *m, const layer_w *L, int64_t *bytes, int64_t *params,
                       int64_t *by_fmt, int64_t *params_by_fmt) {
  lks_tensor fixed[] = {L->ln1, L->ln2, L->wq, L->wk, L->wv, L->bq, L->bk, L->bv, L->wo,
                        L->q_norm, L->k_norm, L->dense.gate, L->dense.up, L->dense.down,
                        L->router, L->e_bias, L->shared.gate, L->shared.up, L->shared.down,
                        L->enorm, L->hnorm, L->eh_proj, L->head_norm};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
    *bytes += tbytes(fixed[i]);
    *params += tnum(fixed[i]);
    if (by_fmt && fixed[i].buf) by_fmt[lks_tensor_wfmt(fixed[i])] += tbytes(fixed[i]);
    if (params_by_fmt && fixed[i].buf) params_by_fmt[lks_tensor_wfmt(fixed[i])] += tnum(fixed[i]);
  }
  lks__mla_cost(L->mla, bytes, params, by_fmt, params_by_fmt);
  if (L->moe && L->experts) {
    // top_k experts per token, of which this rank holds n_experts / E on average (all experts
    // have the same shape).
    const ffn_w *f = &L->experts[m->sh.e0];
    const int64_t k = (int64_t)m->cfg.top_k * m->sh.n_experts, E = m->cfg.n_experts;
    lks_tensor ft[] = {f->gate, f->up, f->down};
    int64_t eb = 0, ep = 0;
    for (int i = 0; i < 3; i++) {
      eb += tbytes(ft[i]);
      ep += tnum(ft[i]);
      if (by_fmt) by_fmt[lks_tensor_wfmt(ft[i])] += tbytes(ft[i]) * k / E;
      if (params_by_fmt) params_by_fmt[lks_tensor_wfmt(ft[i])] += tnum(ft[i]) * k / E;
    }
    *bytes += eb * k / E;
    *params += ep * k / E;
  }
}

void lks_model_stats_get(const lks_model *m, lks_model_stats *s) {
  const lks_config *c = &m->cfg;
  memset(s, 0, sizeof *s);
  s->params_total = m->params_total;
  s->params_mtp = m->params_mtp;
  s->weight_bytes = m->weight_bytes;
  int64_t b = 0, p = 0;
  for (int l = 0; l < c->n_layers; l++)
    layer_cost(m, &m->layers[l], &b, &p, s->bytes_per_token_fmt, s->params_per_token_fmt);
  lks_tensor top[] = {m->norm, m->lm_head};
  for (int i = 0; i < 2; i++)
    if (top[i].buf) {
      s->bytes_per_token_fmt[lks_tensor_wfmt(top[i])] += tbytes(top[i]);
      s->params_per_token_fmt[lks_tensor_wfmt(top[i])] += tnum(top[i]);
    }
  if (m->embed.buf) {  // one row
    s->bytes_per_token_fmt[lks_tensor_wfmt(m->embed)] += m->embed.cols * (int64_t)lks_dtype_size(m->embed.dtype);
    s->params_per_token_fmt[lks_tensor_wfmt(m->embed)] += m->embed.cols;
  }
  memcpy(s->group_fmts, m->group_fmts, sizeof s->group_fmts);
  snprintf(s->quant, sizeof s->quant, "%s", m->quant.scheme ? m->quant.what : "none");
  // One embedding row is read per token; the whole table counts as active parameters.
  s->bytes_per_token = b + tbytes(m->norm) + tbytes(m->lm_head) +
                       (m->embed.buf ? m->embed.cols * (int64_t)lks_dtype_size(m->embed.dtype) : 0);
  s->params_active = p + tnum(m->norm) + tnum(m->lm_head) + tnum(m->embed);
  if (c->n_mtp) {
    int64_t mb = 0, mp = 0;
    layer_cost(m, &m->layers[c->n_layers], &mb, &mp, NULL, NULL);
    s->bytes_mtp_step = mb + tbytes(m->lm_head) + m->embed.cols * (int64_t)lks_dtype_size(m->embed.dtype);
  }
  s->kv_bytes_per_pos =
      (int64_t)c->n_layers * 2 * m->sh.n_kv * c->head_dim * (int64_t)lks_dtype_size(m->kv_dtype);
  if (m->mla) s->kv_bytes_per_pos = lks__mla_kv_floats_per_pos(c) * (int64_t)sizeof(float);
}
