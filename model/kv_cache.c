// SPDX-License-Identifier: MIT
// Paged KV cache (see kv_cache.h).
#include "model/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct lks_kv_cache {
  lks_backend *be;
  int n_layers, block_size, n_blocks, max_seqs, max_blocks;
  lks_kv_layer *layers;
  int32_t *block_table;  // [max_seqs, max_blocks]
  int *seq_len;          // [max_seqs], -1 when the slot is free
  int *seq_blocks;       // [max_seqs] blocks held
  int32_t *free_list;    // stack of free block ids
  int n_free;
  int32_t *ref;          // [n_blocks] holders of each block: sequences, and the prefix cache
  int (*evict)(void *ctx, int need);  // frees blocks held only by a cache (may be NULL)
  void *evict_ctx;
  size_t bytes;
};

// width NULL: K and V pools of n_kv_heads * head_dim; else K pools of width[l] alone.
static lks_kv_cache *kv_new(lks_backend *be, int n_layers, int n_kv_heads, int head_dim,
                            const int *width, lks_dtype dtype, int block_size, int n_blocks,
                            int max_seqs, int max_seq_len) {
  bool odd = dtype == LKS_BF16 && (n_kv_heads * head_dim) % 2;
  if ((dtype != LKS_F32 && dtype != LKS_BF16) || odd) {
    lks_set_error(LKS_EUNSUPPORTED, "KV cache: %s elements of %d a row are not supported (F32, or "
                  "BF16 with an even row)", lks_dtype_name(dtype), n_kv_heads * head_dim);
    return NULL;
  }
  lks_kv_cache *kv = calloc(1, sizeof *kv);
  if (!kv) return NULL;
  kv->be = be;
  kv->n_layers = n_layers;
  kv->block_size = block_size;
  kv->n_blocks = n_blocks;
  kv->max_seqs = max_seqs;
  kv->max_blocks = (max_seq_len + block_size - 1) / block_size;
  kv->layers = calloc((size_t)n_layers, sizeof *kv->layers);
  kv->block_table = calloc((size_t)max_seqs * (size_t)kv->max_blocks, sizeof(int32_t));
  kv->seq_len = malloc((size_t)max_seqs * sizeof(int));
  kv->seq_blocks = calloc((size_t)max_seqs, sizeof(int));
  kv->free_list = malloc((size_t)n_blocks * sizeof(int32_t));
  kv->ref = calloc((size_t)n_blocks, sizeof(int32_t));
  if (!kv->layers || !kv->block_table || !kv->seq_len || !kv->seq_blocks || !kv->free_list ||
      !kv->ref)
    goto fail;
  for (int s = 0; s < max_seqs; s++) kv->seq_len[s] = -1;
  for (int b = 0; b < n_blocks; b++) kv->free_list[b] = n_blocks - 1 - b;  // block 0 on top
  kv->n_free = n_blocks;
  for (int l = 0; l < n_layers; l++) {
    lks_kv_layer *L = &kv->layers[l];
    int heads = width ? 1 : n_kv_heads, hd = width ? width[l] : head_dim;
    *L = (lks_kv_layer){.n_blocks = n_blocks, .block_size = block_size,
                        .n_kv_heads = heads, .head_dim = hd, .dtype = dtype};
    size_t pool = (size_t)n_blocks * block_size * heads * hd * lks_dtype_size(dtype);
    if (pool == 0) continue;
    L->k = be->ops->buf_alloc(be, pool);
    L->v = width ? NULL : be->ops->buf_alloc(be, pool);
    if (!L->k || (!width && !L->v)) {
      lks_set_error(LKS_ENOMEM, "KV cache: cannot allocate %zu bytes for layer %d", 2 * pool, l);
      goto fail;
    }
    kv->bytes += (width ? 1 : 2) * pool;
  }
  return kv;
fail:
  lks_kv_free(kv);
  return NULL;
}

lks_kv_cache *lks_kv_new(lks_backend *be, int n_layers, int n_kv_heads, int head_dim,
                         lks_dtype dtype, int block_size, int n_blocks, int max_seqs,
                         int max_seq_len) {
  return kv_new(be, n_layers, n_kv_heads, head_dim, NULL, dtype, block_size, n_blocks, max_seqs,
                max_seq_len);
}

lks_kv_cache *lks_kv_new_widths(lks_backend *be, int n_layers, const int *width, int block_size,
                                int n_blocks, int max_seqs, int max_seq_len) {
  return kv_new(be, n_layers, 0, 0, width, LKS_F32, block_size, n_blocks, max_seqs, max_seq_len);
}

void lks_kv_free(lks_kv_cache *kv) {
  if (!kv) return;
  for (int l = 0; kv->layers && l < kv->n_layers; l++) {
    if (kv->layers[l].k) kv->be->ops->buf_free(kv->be, kv->layers[l].k);
    if (kv->layers[l].v) kv->be->ops->buf_free(kv->be, kv->layers[l].v);
  }
  free(kv->layers);
  free(kv->block_table);
  free(kv->seq_len);
  free(kv->seq_blocks);
  free(kv->free_list);
  free(kv->ref);
  free(kv);
}

int lks_kv_seq_alloc(lks_kv_cache *kv) {
  for (int s = 0; s < kv->max_seqs; s++)
    if (kv->seq_len[s] < 0) {
      kv->seq_len[s] = 0;
      kv->seq_blocks[s] = 0;
      return s;
    }
  return lks_set_error(LKS_EFULL, "KV cache: all %d sequence slots are in use", kv->max_seqs);
}

int lks_kv_seq_claim(lks_kv_cache *kv, int seq) {
  if (seq < 0 || seq >= kv->max_seqs)
    return lks_set_error(LKS_ERANGE, "KV cache: slot %d outside [0, %d)", seq, kv->max_seqs);
  if (kv->seq_len[seq] >= 0) return lks_set_error(LKS_EINVAL, "KV cache: slot %d is in use", seq);
  kv->seq_len[seq] = 0;
  kv->seq_blocks[seq] = 0;
  return seq;
}

int lks_kv_max_seqs(const lks_kv_cache *kv) { return kv->max_seqs; }

void lks_kv_seq_free(lks_kv_cache *kv, int seq) {
  if (seq < 0 || seq >= kv->max_seqs || kv->seq_len[seq] < 0) return;
  lks_kv_seq_resize(kv, seq, 0);
  kv->seq_len[seq] = -1;
}

int lks_kv_seq_len(const lks_kv_cache *kv, int seq) { return kv->seq_len[seq]; }

int lks_kv_seq_resize(lks_kv_cache *kv, int seq, int len) {
  if (seq < 0 || seq >= kv->max_seqs || kv->seq_len[seq] < 0)
    return lks_set_error(LKS_EINVAL, "KV cache: sequence %d is not allocated", seq);
  if (len < 0) return lks_set_error(LKS_EINVAL, "KV cache: negative length %d", len);
  // Checked before rounding up to blocks, which would overflow for len near INT_MAX.
  if (len > kv->max_blocks * kv->block_size)
    return lks_set_error(LKS_EFULL, "KV cache: %d positions exceed the longest sequence (%d)", len,
                         kv->max_blocks * kv->block_size);
  int need = (len + kv->block_size - 1) / kv->block_size;
  int32_t *bt = kv->block_table + (size_t)seq * kv->max_blocks;
  int more = need - kv->seq_blocks[seq];
  // Blocks that only a cache holds are given back first (the same on every rank).
  if (more > kv->n_free && kv->evict) kv->evict(kv->evict_ctx, more - kv->n_free);
  if (more > kv->n_free)
    return lks_set_error(LKS_EFULL, "KV cache: %d more blocks needed, %d free", more, kv->n_free);
  while (kv->seq_blocks[seq] < need) {
    int32_t b = kv->free_list[--kv->n_free];
    kv->ref[b] = 1;
    bt[kv->seq_blocks[seq]++] = b;
  }
  while (kv->seq_blocks[seq] > need) lks_kv_block_unref(kv, bt[--kv->seq_blocks[seq]]);
  kv->seq_len[seq] = len;
  return 0;
}

void lks_kv_block_ref(lks_kv_cache *kv, int32_t b) { kv->ref[b]++; }

void lks_kv_block_unref(lks_kv_cache *kv, int32_t b) {
  if (--kv->ref[b] == 0) kv->free_list[kv->n_free++] = b;
}

int lks_kv_block_refs(const lks_kv_cache *kv, int32_t b) { return kv->ref[b]; }

int32_t lks_kv_seq_block(const lks_kv_cache *kv, int seq, int i) {
  return kv->block_table[(size_t)seq * kv->max_blocks + i];
}

int lks_kv_seq_attach(lks_kv_cache *kv, int seq, const int32_t *blocks, int n, int len) {
  if (seq < 0 || seq >= kv->max_seqs || kv->seq_len[seq] != 0 || kv->seq_blocks[seq] != 0)
    return lks_set_error(LKS_EINVAL, "KV cache: attach to sequence %d, which is not new", seq);
  if (n > kv->max_blocks || len > n * kv->block_size || len < (n - 1) * kv->block_size)
    return lks_set_error(LKS_ERANGE, "KV cache: %d blocks for %d positions", n, len);
  int32_t *bt = kv->block_table + (size_t)seq * kv->max_blocks;
  for (int i = 0; i < n; i++) {
    bt[i] = blocks[i];
    kv->ref[blocks[i]]++;
  }
  kv->seq_blocks[seq] = n;
  kv->seq_len[seq] = len;
  return 0;
}

int lks_kv_block_copy(lks_kv_cache *kv, int32_t dst, int32_t src) {
  int B = kv->block_size;
  int32_t *idx = malloc((size_t)B * sizeof *idx);
  if (!idx) return lks_set_error(LKS_ENOMEM, "out of memory");
  for (int i = 0; i < B; i++) idx[i] = src * B + i;
  int rc = 0;
  for (int l = 0; l < kv->n_layers && rc == 0; l++) {
    lks_kv_layer *L = &kv->layers[l];
    // Rows copied as the bits they are: a BF16 row (even, kv_new) seen as F32 of half the width.
    int64_t rows = (int64_t)L->n_blocks * B, w = (int64_t)L->n_kv_heads * L->head_dim;
    if (L->dtype == LKS_BF16) w /= 2;
    lks_tensor k = lks_tensor_2d(L->k, 0, LKS_F32, rows, w), v = lks_tensor_2d(L->v, 0, LKS_F32, rows, w);
    // A k-only layer (lks_kv_new_widths) has no V pool, and one of width 0 no pool at all.
    if (L->k) rc = kv->be->ops->gather_rows(kv->be, lks_tensor_rows(k, (int64_t)dst * B, B), k, idx);
    if (rc == 0 && L->v)
      rc = kv->be->ops->gather_rows(kv->be, lks_tensor_rows(v, (int64_t)dst * B, B), v, idx);
  }
  free(idx);
  return rc;
}

int32_t lks_kv_block_take(lks_kv_cache *kv) {
  if (kv->n_free == 0 && kv->evict) kv->evict(kv->evict_ctx, 1);
  if (kv->n_free == 0) return lks_set_error(LKS_EFULL, "KV cache: no free block");
  int32_t b = kv->free_list[--kv->n_free];
  kv->ref[b] = 1;
  return b;
}

void lks_kv_seq_replace_block(lks_kv_cache *kv, int seq, int i, int32_t b) {
  int32_t *slot = &kv->block_table[(size_t)seq * kv->max_blocks + i];
  lks_kv_block_unref(kv, *slot);
  *slot = b;
}

void lks_kv_set_evict(lks_kv_cache *kv, int (*evict)(void *ctx, int need), void *ctx) {
  kv->evict = evict;
  kv->evict_ctx = ctx;
}

int lks_kv_block_size(const lks_kv_cache *kv) { return kv->block_size; }
int lks_kv_n_layers(const lks_kv_cache *kv) { return kv->n_layers; }
int lks_kv_n_blocks(const lks_kv_cache *kv) { return kv->n_blocks; }

int lks_kv_rows(const lks_kv_cache *kv, lks_attn_rows *rows, int32_t *slot_out) {
  for (int i = 0; i < rows->n; i++) {
    int s = rows->seq[i], p = rows->pos[i];
    if (s < 0 || s >= kv->max_seqs || kv->seq_len[s] < 0 || p < 0 || p >= kv->seq_len[s])
      return lks_set_error(LKS_ERANGE, "KV cache: row %d (sequence %d, position %d) is not reserved",
                           i, s, p);
    slot_out[i] = kv->block_table[(size_t)s * kv->max_blocks + p / kv->block_size] *
                      kv->block_size + p % kv->block_size;
  }
  rows->slot = slot_out;
  rows->block_table = kv->block_table;
  rows->max_blocks = kv->max_blocks;
  return 0;
}

const lks_kv_layer *lks_kv_layer_at(const lks_kv_cache *kv, int layer) {
  return &kv->layers[layer];
}
int lks_kv_free_blocks(const lks_kv_cache *kv) { return kv->n_free; }
size_t lks_kv_bytes(const lks_kv_cache *kv) { return kv->bytes; }
