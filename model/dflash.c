// SPDX-License-Identifier: MIT
// The DFlash block drafter (see dflash.h for the architecture). Built from the backend's ops
// like the target: the non-causal block is the backend's causal attention with every block row
// given the block's last position as its attention horizon (RoPE still at each row's own
// position), so each row sees the whole context and the whole block.
#include "model/dflash.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "model/model.h"
#include "model/safetensors.h"

typedef struct {
  lks_tensor ln1, ln2, wq, wk, wv, wo, q_norm, k_norm, gate, up, down;
} dlayer;

struct lks_dflash {
  lks_backend *be;
  lks_model *target;
  lks_safetensors *st;
  int H, n_layers, n_heads, n_kv, head_dim, inter, block, mask_id, vocab;
  // This rank's shard: query heads [h0, h0 + nh), KV heads [kv0, kv0 + nkv), FFN rows
  // [i0, i0 + ni) (everything at world 1).
  int rank, world, h0, nh, kv0, nkv, i0, ni;
  int n_cap, cap[LKS_DFLASH_MAX_CAPTURE];
  float eps, theta;
  lks_tensor fc, hidden_norm, norm;
  dlayer *L;
  lks_buf **bufs;
  int n_bufs, cap_bufs;
  int64_t weight_bytes;
  // Activations, grown to the largest call: rows of context or block.
  int cap_rows;
  lks_buf *c, *x, *h, *q, *k, *v, *att, *sel;
  int32_t *slots, *apos, *ids, *outr;
};

static int get_int(json_t *o, const char *key, const char *what, int *out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
    return lks_set_error(LKS_ECONFIG, "%s: '%s' must be a non-negative integer", what, key);
  *out = (int)json_integer_value(v);
  return 0;
}

static int get_num(json_t *o, const char *key, const char *what, float *out, float def) {
  json_t *v = json_object_get(o, key);
  if (!v) {
    *out = def;
    return 0;
  }
  if (!json_is_number(v)) return lks_set_error(LKS_ECONFIG, "%s: '%s' must be a number", what, key);
  *out = (float)json_number_value(v);
  return 0;
}

static int parse_config(lks_dflash *d, const char *dir) {
  char path[4096], what[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  snprintf(what, sizeof what, "%s", path);
  json_error_t jerr;
  json_t *root = json_load_file(path, 0, &jerr);
  if (!root) return lks_set_error(LKS_ECONFIG, "%s: %s (line %d)", path, jerr.text, jerr.line);
  int rc = 0;
  json_t *dc = json_object_get(root, "dflash_config");
  json_t *ids = dc ? json_object_get(dc, "target_layer_ids") : NULL;
  json_t *bias = json_object_get(root, "attention_bias");
  if (!json_is_object(dc)) {
    rc = lks_set_error(LKS_ECONFIG, "%s: no 'dflash_config' object: not a DFlash drafter", what);
    goto out;
  }
  if ((rc = get_int(root, "hidden_size", what, &d->H)) < 0 ||
      (rc = get_int(root, "num_hidden_layers", what, &d->n_layers)) < 0 ||
      (rc = get_int(root, "num_attention_heads", what, &d->n_heads)) < 0 ||
      (rc = get_int(root, "num_key_value_heads", what, &d->n_kv)) < 0 ||
      (rc = get_int(root, "head_dim", what, &d->head_dim)) < 0 ||
      (rc = get_int(root, "intermediate_size", what, &d->inter)) < 0 ||
      (rc = get_int(root, "vocab_size", what, &d->vocab)) < 0 ||
      (rc = get_num(root, "rms_norm_eps", what, &d->eps, 1e-6f)) < 0 ||
      (rc = get_num(root, "rope_theta", what, &d->theta, 10000.0f)) < 0 ||
      (rc = get_int(dc, "block_size", "dflash_config", &d->block)) < 0 ||
      (rc = get_int(dc, "mask_token_id", "dflash_config", &d->mask_id)) < 0)
    goto out;
  if (bias && !json_is_false(bias)) {
    rc = lks_set_error(LKS_EUNSUPPORTED, "%s: attention_bias true is not supported", what);
    goto out;
  }
  if (!json_is_array(ids) || json_array_size(ids) == 0 ||
      json_array_size(ids) > LKS_DFLASH_MAX_CAPTURE) {
    rc = lks_set_error(LKS_ECONFIG, "%s: dflash_config.target_layer_ids must list 1 to %d layers",
                       what, LKS_DFLASH_MAX_CAPTURE);
    goto out;
  }
  d->n_cap = (int)json_array_size(ids);
  for (int i = 0; i < d->n_cap; i++) {
    json_t *v = json_array_get(ids, (size_t)i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX) {
      rc = lks_set_error(LKS_ECONFIG, "%s: target_layer_ids[%d] is not a layer index", what, i);
      goto out;
    }
    d->cap[i] = (int)json_integer_value(v);
  }
out:
  json_decref(root);
  return rc;
}

static int validate(const lks_dflash *d, const lks_config *t, const char *dir) {
  if (d->H != t->hidden)
    return lks_set_error(LKS_ECONFIG, "%s: hidden_size %d, the target's is %d", dir, d->H, t->hidden);
  if (d->vocab != t->vocab)
    return lks_set_error(LKS_ECONFIG, "%s: vocab_size %d, the target's is %d", dir, d->vocab, t->vocab);
  if (d->n_layers < 1 || d->n_heads < 1 || d->n_kv < 1 || d->n_heads % d->n_kv || d->head_dim < 2 ||
      d->head_dim % 2 || d->inter < 1)
    return lks_set_error(LKS_ECONFIG, "%s: layers %d, heads %d / %d, head_dim %d, intermediate %d "
                         "do not make a drafter", dir, d->n_layers, d->n_heads, d->n_kv, d->head_dim,
                         d->inter);
  if (d->block < 2 || d->block - 1 > LKS_DFLASH_MAX_DRAFTS)
    return lks_set_error(LKS_ECONFIG, "%s: block_size %d outside 2..%d", dir, d->block,
                         LKS_DFLASH_MAX_DRAFTS + 1);
  if (d->mask_id >= t->vocab)
    return lks_set_error(LKS_ECONFIG, "%s: mask_token_id %d outside the vocabulary", dir, d->mask_id);
  for (int i = 0; i < d->n_cap; i++)
    if (d->cap[i] >= t->n_layers)
      return lks_set_error(LKS_ECONFIG, "%s: target_layer_ids[%d] = %d, the target has %d layers",
                           dir, i, d->cap[i], t->n_layers);
  // Split like the target: query heads and FFN rows evenly; KV heads with them, or each rank's
  // query heads inside one KV head's group (that head then on every rank that needs it).
  int W = d->world, per_rank = d->n_heads / W, group = d->n_heads / d->n_kv;
  if (d->n_heads % W || d->inter % W || (d->n_kv % W && group % per_rank))
    return lks_set_error(LKS_ECONFIG, "%s: the drafter cannot be split %d ways: "
                         "num_attention_heads %d, num_key_value_heads %d and intermediate_size %d "
                         "must split evenly (or a rank's query heads share one KV head)", dir, W,
                         d->n_heads, d->n_kv, d->inter);
  return 0;
}

static void plan_shard(lks_dflash *d) {
  int W = d->world, r = d->rank;
  d->nh = d->n_heads / W;
  d->h0 = r * d->nh;
  if (d->n_kv % W == 0) {
    d->nkv = d->n_kv / W;
    d->kv0 = r * d->nkv;
  } else {
    d->nkv = 1;
    d->kv0 = d->h0 / (d->n_heads / d->n_kv);
  }
  d->ni = d->inter / W;
  d->i0 = r * d->ni;
}

static bool keep_buf(lks_dflash *d, lks_buf *b) {
  if (d->n_bufs == d->cap_bufs) {
    int cap = d->cap_bufs ? 2 * d->cap_bufs : 64;
    lks_buf **nb = realloc(d->bufs, (size_t)cap * sizeof *nb);
    if (!nb) return false;
    d->bufs = nb;
    d->cap_bufs = cap;
  }
  d->bufs[d->n_bufs++] = b;
  return true;
}

// Binds rows [r0, r0 + nr) and columns [c0, c0 + nc) of tensor `name` of shape [rows, cols]
// (rows 0: 1-D of cols, all of it), mapped from the file; a column slice keeps the file's row
// stride on the CPU backend.
static int bind_part(lks_dflash *d, const char *name, int64_t rows, int64_t cols, int64_t r0,
                     int64_t nr, int64_t c0, int64_t nc, lks_tensor *out) {
  const lks_st_tensor *st = lks_safetensors_find(d->st, name);
  if (!st) return lks_set_error(LKS_ECONFIG, "DFlash drafter: missing tensor '%s'", name);
  bool ok = rows ? st->n_dims == 2 && st->shape[0] == rows && st->shape[1] == cols
                 : st->n_dims == 1 && st->shape[0] == cols;
  if (!ok)
    return lks_set_error(LKS_ESHAPE, "DFlash drafter: tensor '%s' is not [%lld, %lld]", name,
                         (long long)rows, (long long)cols);
  if (st->dtype != LKS_F32 && st->dtype != LKS_BF16 && st->dtype != LKS_F16)
    return lks_set_error(LKS_ECONFIG, "DFlash drafter: tensor '%s' has dtype %s", name,
                         lks_dtype_name(st->dtype));
  if (!rows) {  // a vector: all of it
    r0 = c0 = 0;
    nr = 1;
    nc = cols;
  }
  size_t es = lks_dtype_size(st->dtype), stride = (size_t)cols * es, ld_bytes = stride;
  const uint8_t *first = st->data + (size_t)r0 * stride + (size_t)c0 * es;
  lks_buf *b = nc == cols ? d->be->ops->buf_wrap_host(d->be, first, (size_t)nr * stride)
                          : d->be->ops->buf_wrap_host_2d(d->be, first, nr, (size_t)nc * es, stride,
                                                         &ld_bytes);
  if (!b || !keep_buf(d, b)) {
    if (b) d->be->ops->buf_free(d->be, b);
    return lks_set_error(LKS_ENOMEM, "DFlash drafter: cannot map '%s'", name);
  }
  *out = lks_tensor_2d(b, 0, st->dtype, nr, nc);
  out->ld = (int64_t)(ld_bytes / es);
  d->weight_bytes += nr * nc * (int64_t)es;
  return 0;
}

// All of tensor `name`.
static int bind(lks_dflash *d, const char *name, int64_t rows, int64_t cols, lks_tensor *out) {
  return bind_part(d, name, rows, cols, 0, rows, 0, cols, out);
}

lks_dflash *lks_dflash_load(const char *dir, lks_model *target) {
  lks_dflash *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->be = lks_model_backend(target);
  d->target = target;
  lks_model_shard_rank(target, &d->rank, &d->world);
  if (parse_config(d, dir) < 0 || validate(d, lks_model_config(target), dir) < 0) goto fail;
  plan_shard(d);
  d->st = lks_safetensors_open(dir);
  if (!d->st) goto fail;
  d->L = calloc((size_t)d->n_layers, sizeof *d->L);
  if (!d->L) goto fail;
  int64_t H = d->H, hd = d->head_dim, qd = d->n_heads * hd, kvd = d->n_kv * hd;
  if (bind(d, "fc.weight", H, H * d->n_cap, &d->fc) < 0 ||
      bind(d, "hidden_norm.weight", 0, H, &d->hidden_norm) < 0 ||
      bind(d, "norm.weight", 0, H, &d->norm) < 0)
    goto fail;
  for (int l = 0; l < d->n_layers; l++) {
    dlayer *L = &d->L[l];
    char n[160];
    // This rank's query heads (rows of q_proj, columns of o_proj), KV heads, FFN rows.
#define B(field, name, r, c, r0, nr, c0, nc)                            \
  snprintf(n, sizeof n, "layers.%d.%s", l, name);                       \
  if (bind_part(d, n, r, c, r0, nr, c0, nc, &L->field) < 0) goto fail;
    B(ln1, "input_layernorm.weight", 0, H, 0, 0, 0, 0)
    B(ln2, "post_attention_layernorm.weight", 0, H, 0, 0, 0, 0)
    B(wq, "self_attn.q_proj.weight", qd, H, d->h0 * hd, d->nh * hd, 0, H)
    B(wk, "self_attn.k_proj.weight", kvd, H, d->kv0 * hd, d->nkv * hd, 0, H)
    B(wv, "self_attn.v_proj.weight", kvd, H, d->kv0 * hd, d->nkv * hd, 0, H)
    B(wo, "self_attn.o_proj.weight", H, qd, 0, H, d->h0 * hd, d->nh * hd)
    B(q_norm, "self_attn.q_norm.weight", 0, hd, 0, 0, 0, 0)
    B(k_norm, "self_attn.k_norm.weight", 0, hd, 0, 0, 0, 0)
    B(gate, "mlp.gate_proj.weight", d->inter, H, d->i0, d->ni, 0, H)
    B(up, "mlp.up_proj.weight", d->inter, H, d->i0, d->ni, 0, H)
    B(down, "mlp.down_proj.weight", H, d->inter, 0, H, d->i0, d->ni)
#undef B
  }
  LKS_LOG(LKS_LOG_INFO, "DFlash drafter %s: %d layers, block %d, mask token %d, %d captured target "
          "layers; this rank (%d of %d): query heads %d-%d, KV heads %d-%d, FFN rows %d-%d, "
          "%.2f MB of weights", dir, d->n_layers, d->block, d->mask_id, d->n_cap, d->rank,
          d->world, d->h0, d->h0 + d->nh - 1, d->kv0, d->kv0 + d->nkv - 1, d->i0,
          d->i0 + d->ni - 1, d->weight_bytes / 1e6);
  return d;
fail:
  {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lks_last_error());
    lks_dflash_free(d);
    lks_set_error(LKS_ECONFIG, "%s", msg);
  }
  return NULL;
}

static void free_acts(lks_dflash *d) {
  lks_buf *bs[] = {d->c, d->x, d->h, d->q, d->k, d->v, d->att, d->sel};
  for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) d->be->ops->buf_free(d->be, bs[i]);
  d->c = d->x = d->h = d->q = d->k = d->v = d->att = d->sel = NULL;
  d->cap_rows = 0;
}

void lks_dflash_free(lks_dflash *d) {
  if (!d) return;
  free_acts(d);
  for (int i = 0; i < d->n_bufs; i++) d->be->ops->buf_free(d->be, d->bufs[i]);
  free(d->bufs);
  free(d->L);
  free(d->slots);
  free(d->apos);
  free(d->ids);
  free(d->outr);
  lks_safetensors_close(d->st);
  free(d);
}

int lks_dflash_block_size(const lks_dflash *d) { return d->block; }
int lks_dflash_mask_token(const lks_dflash *d) { return d->mask_id; }
int lks_dflash_capture_layers(const lks_dflash *d, const int **layers) {
  *layers = d->cap;
  return d->n_cap;
}
int lks_dflash_feature_cols(const lks_dflash *d) { return d->n_cap * d->H; }
int64_t lks_dflash_weight_bytes(const lks_dflash *d) { return d->weight_bytes; }

lks_kv_cache *lks_dflash_kv_new(const lks_dflash *d, int block_size, int n_blocks, int max_seqs,
                                int max_seq_len) {
  return lks_kv_new(d->be, d->n_layers, d->nkv, d->head_dim, LKS_F32, block_size, n_blocks,
                    max_seqs, max_seq_len);
}

static int reserve(lks_dflash *d, int n) {
  if (n <= d->cap_rows) return 0;
  free_acts(d);
  size_t N = (size_t)n, f = sizeof(float), H = (size_t)d->H;
  size_t qd = (size_t)d->nh * d->head_dim, kvd = (size_t)d->nkv * d->head_dim;
  struct {
    lks_buf **b;
    size_t bytes;
  } want[] = {{&d->c, N * H * f},   {&d->x, N * H * f},   {&d->h, N * H * f},
              {&d->q, N * qd * f},  {&d->k, N * kvd * f}, {&d->v, N * kvd * f},
              {&d->att, N * qd * f}, {&d->sel, N * H * f}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    *want[i].b = d->be->ops->buf_alloc(d->be, want[i].bytes);
    if (!*want[i].b) {
      free_acts(d);
      return lks_set_error(LKS_ENOMEM, "DFlash drafter: activations for %d rows", n);
    }
  }
  int32_t **hs[] = {&d->slots, &d->apos, &d->ids, &d->outr};
  for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
    int32_t *p = realloc(*hs[i], N * sizeof *p);
    if (!p) return lks_set_error(LKS_ENOMEM, "DFlash drafter: out of memory");
    *hs[i] = p;
  }
  d->cap_rows = n;
  return 0;
}

static lks_tensor act(lks_buf *b, int n, int cols) { return lks_tensor_2d(b, 0, LKS_F32, n, cols); }

// k = k_norm(Wk src) with RoPE at pos, v = Wv src, for layer l; into d->k, d->v.
static int keys(lks_dflash *d, const dlayer *L, lks_tensor src, int n, const int32_t *pos) {
  lks_backend *be = d->be;
  int kvd = d->nkv * d->head_dim;
  lks_tensor k = act(d->k, n, kvd), v = act(d->v, n, kvd), none = {0};
  LKS_TRY(be->ops->matmul(be, k, src, L->wk, none, false));
  LKS_TRY(be->ops->matmul(be, v, src, L->wv, none, false));
  lks_tensor kh = lks_tensor_reshape(k, (int64_t)n * d->nkv, d->head_dim);
  LKS_TRY(be->ops->rmsnorm(be, kh, kh, L->k_norm, d->eps));
  return be->ops->rope(be, k, d->head_dim, d->head_dim, d->theta, LKS_ROPE_HALF_SPLIT, pos);
}

int lks_dflash_context(lks_dflash *d, lks_kv_cache *kv, int n, const int32_t *seq,
                       const int32_t *pos, lks_tensor feats) {
  if (n <= 0) return 0;
  if (feats.rows != n || feats.cols != (int64_t)d->n_cap * d->H)
    return lks_set_error(LKS_ESHAPE, "DFlash context: features [%lld, %lld] for %d rows",
                         (long long)feats.rows, (long long)feats.cols, n);
  LKS_TRY(reserve(d, n));
  lks_backend *be = d->be;
  lks_attn_rows rows = {.n = n, .seq = seq, .pos = pos};
  LKS_TRY(lks_kv_rows(kv, &rows, d->slots));
  lks_tensor c = act(d->c, n, d->H), none = {0};
  LKS_TRY(be->ops->matmul(be, c, feats, d->fc, none, false));
  LKS_TRY(be->ops->rmsnorm(be, c, c, d->hidden_norm, d->eps));
  for (int l = 0; l < d->n_layers; l++) {
    LKS_TRY(keys(d, &d->L[l], c, n, pos));
    LKS_TRY(be->ops->kv_store(be, lks_kv_layer_at(kv, l), act(d->k, n, d->nkv * d->head_dim),
                              act(d->v, n, d->nkv * d->head_dim), &rows));
  }
  return 0;
}

int lks_dflash_block(lks_dflash *d, lks_kv_cache *kv, int ns, const int32_t *seq,
                     const int32_t *start, const int32_t *first, lks_tensor *logits) {
  int B = d->block, n = ns * B;
  LKS_TRY(reserve(d, n));
  lks_backend *be = d->be;
  int32_t *bseq = malloc((size_t)n * 2 * sizeof *bseq);
  if (!bseq) return lks_set_error(LKS_ENOMEM, "DFlash block: out of memory");
  int32_t *bpos = bseq + n;
  for (int i = 0; i < ns; i++)
    for (int j = 0; j < B; j++) {
      int r = i * B + j;
      bseq[r] = seq[i];
      bpos[r] = start[i] + j;
      d->apos[r] = start[i] + B - 1;  // every block row sees the whole block
      d->ids[r] = j ? d->mask_id : first[i];
    }
  int rc = 0;
  lks_attn_rows rows = {.n = n, .seq = bseq, .pos = bpos};
  if ((rc = lks_kv_rows(kv, &rows, d->slots)) < 0) goto out;
  lks_attn_rows arows = rows;
  arows.pos = d->apos;
  int qd = d->nh * d->head_dim, kvd = d->nkv * d->head_dim;
  lks_tensor x = act(d->x, n, d->H), h = act(d->h, n, d->H), none = {0};
  if ((rc = lks_model_embed(d->target, x, d->ids)) < 0) goto out;
  for (int l = 0; l < d->n_layers && rc == 0; l++) {
    const dlayer *L = &d->L[l];
    lks_tensor q = act(d->q, n, qd), att = act(d->att, n, qd);
    lks_tensor qh = lks_tensor_reshape(q, (int64_t)n * d->nh, d->head_dim);
    if ((rc = be->ops->rmsnorm(be, h, x, L->ln1, d->eps)) < 0 ||
        (rc = be->ops->matmul(be, q, h, L->wq, none, false)) < 0 ||
        (rc = be->ops->rmsnorm(be, qh, qh, L->q_norm, d->eps)) < 0 ||
        (rc = be->ops->rope(be, q, d->head_dim, d->head_dim, d->theta, LKS_ROPE_HALF_SPLIT, bpos)) < 0 ||
        (rc = keys(d, L, h, n, bpos)) < 0 ||
        (rc = be->ops->kv_store(be, lks_kv_layer_at(kv, l), act(d->k, n, kvd), act(d->v, n, kvd),
                                &rows)) < 0 ||
        (rc = be->ops->attention(be, att, q, lks_kv_layer_at(kv, l), &arows, d->nh,
                                 1.0f / sqrtf((float)d->head_dim))) < 0 ||
        (rc = lks_model_partial_start(d->target, x)) < 0 ||
        (rc = be->ops->matmul(be, x, att, L->wo, none, true)) < 0 ||
        (rc = lks_model_allreduce(d->target, x, "dflash attention", l)) < 0 ||
        (rc = be->ops->rmsnorm(be, h, x, L->ln2, d->eps)) < 0 ||
        (rc = lks_model_partial_start(d->target, x)) < 0 ||
        (rc = be->ops->expert(be, x, h, NULL, NULL, n, L->gate, L->up, L->down)) < 0 ||
        (rc = lks_model_allreduce(d->target, x, "dflash ffn", l)) < 0)
      goto out;
  }
  // Rows 1 .. B - 1 of each block through norm and the target's lm_head.
  int no = ns * (B - 1);
  for (int i = 0; i < ns; i++)
    for (int j = 1; j < B; j++) d->outr[i * (B - 1) + j - 1] = i * B + j;
  lks_tensor sel = act(d->sel, no, d->H);
  if ((rc = be->ops->gather_rows(be, sel, x, d->outr)) < 0 ||
      (rc = be->ops->rmsnorm(be, sel, sel, d->norm, d->eps)) < 0)
    goto out;
  rc = lks_model_lm_head(d->target, sel, logits);
out:
  free(bseq);
  return rc;
}
