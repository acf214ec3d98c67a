// SPDX-License-Identifier: MIT
// Per-rank command execution (see engine.h).
#include "worker/engine.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "model/dflash.h"

enum { MAX_DRAFTS = LKS_MAX_DRAFTS };

// A slot's drafter state: the target hidden states its MTP cache still lacks (the rows of the
// last verify, or the last prefill chunk's last row, then the rows of the deferred plain steps
// since: the lazy catch-up's backlog), and the drafts of its last propose (checked against the
// verify).
typedef struct {
  lks_buf *hid;           // [LKS_MTP_BACKLOG, H]
  int hid_rows, hid_pos;  // rows kept, position of the first
  int32_t drafts[MAX_DRAFTS];
  int n_drafts, draft_pos;  // position of the verify row that carries the first draft
  int valid;              // drafter rows [0, valid) pair target hidden states with committed tokens
  lks_buf *feat;          // DFlash: [MAX_DRAFTS + 1, feature_cols] the last verify's captured rows
} spec_slot;

struct lks_engine {
  lks_model *m;
  lks_kv_cache *kv;
  lks_kv_cache *mkv;  // the MTP layer's cache (NULL without an MTP layer)
  lks_dflash *df;     // the model's DFlash drafter (NULL without one); then forwards with mtp
                      // set feed it instead of the MTP layer
  lks_kv_cache *dkv;  // its context cache: rows [0, len) are committed positions' features
  lks_buf *dstage;    // [cap_dstage, feature_cols] context rows gathered for one append
  int cap_dstage;
  lks_prefix *prefix; // NULL when the prefix cache is off
  int32_t *hist;      // [max_slots * max_len] each slot's token at each position
  spec_slot *spec;    // [max_slots]
  lks_buf *stage;     // [cap_stage, H] MTP inputs gathered from several slots
  int cap_stage;
  int32_t *m_tok, *m_pos, *m_seq, *m_rows, *m_out, *m_last;
  int cap_m;
  int32_t *drafts;    // [max_slots * MAX_DRAFTS] the last propose's drafts, for the caller
  // The levers (EP_CMD_SET_LEVERS), the same on every rank from the step that set them on.
  bool speculation;
  int max_drafts;
  int max_slots, max_len;
  // Host scratch for one forward.
  int32_t *tok, *pos, *seq, *out_rows, *out_tok;
  float *out_logits;
  int cap_rows, cap_out;
};

// The first `rows` of a slot's kept hidden rows.
static lks_tensor hid_view(const lks_engine *e, int slot, int rows) {
  int H = lks_model_config(e->m)->hidden;
  return lks_tensor_2d(e->spec[slot].hid, 0, LKS_F32, rows, H);
}

lks_engine *lks_engine_new(lks_model *m, int max_slots, int max_seq_len, int block,
                           const lks_engine_opts *o) {
  lks_engine *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->m = m;
  e->speculation = true;
  e->max_drafts = MAX_DRAFTS;
  e->max_slots = max_slots;
  e->max_len = max_seq_len;
  int blocks = o && o->n_blocks > 0 ? o->n_blocks : max_slots * ((max_seq_len + block - 1) / block);
  e->kv = lks_model_kv_new(m, false, block, blocks, max_slots, max_seq_len);
  if (!e->kv) {
    free(e);
    return NULL;
  }
  if (lks_model_has_mtp(m)) {
    lks_backend *be = lks_model_backend(m);
    size_t H = (size_t)lks_model_config(m)->hidden;
    e->mkv = lks_model_kv_new(m, true, block, blocks, max_slots, max_seq_len);
    e->spec = calloc((size_t)max_slots, sizeof *e->spec);
    e->drafts = calloc((size_t)max_slots * MAX_DRAFTS, sizeof *e->drafts);
    if (!e->mkv || !e->spec || !e->drafts) goto fail;
    // Each slot's kept rows at their most, written once now: on the CPU a first write of a
    // page faults it in (up to 50 us a page on this project's 2-core VM host), and a plain step
    // that kept its row on a new page paid that (the default model: 1-2 % of a policy run
    // decoding plainly, while the slot's rows grew on demand).
    for (int i = 0; i < max_slots; i++) {
      e->spec[i].hid = be->ops->buf_alloc(be, (size_t)LKS_MTP_BACKLOG * H * sizeof(float));
      if (!e->spec[i].hid || be->ops->zero(be, hid_view(e, i, LKS_MTP_BACKLOG)) < 0) goto fail;
    }
  }
  e->df = lks_model_dflash(m);
  if (e->df) {
    lks_backend *be = lks_model_backend(m);
    size_t F = (size_t)lks_dflash_feature_cols(e->df);
    e->dkv = lks_dflash_kv_new(e->df, block, blocks, max_slots, max_seq_len);
    if (!e->spec) e->spec = calloc((size_t)max_slots, sizeof *e->spec);
    if (!e->drafts) e->drafts = calloc((size_t)max_slots * MAX_DRAFTS, sizeof *e->drafts);
    if (!e->dkv || !e->spec || !e->drafts) goto fail;
    for (int i = 0; i < max_slots; i++) {
      e->spec[i].feat = be->ops->buf_alloc(be, (MAX_DRAFTS + 1) * F * sizeof(float));
      if (!e->spec[i].feat) goto fail;
    }
  }
  if (o && o->prefix_cache) {
    e->hist = malloc((size_t)max_slots * (size_t)max_seq_len * sizeof *e->hist);
    lks_backend *be = lks_model_backend(m);
    e->prefix = e->df ? lks_prefix_new(be, e->kv, e->dkv, 0)
                      : lks_prefix_new(be, e->kv, e->mkv, lks_model_config(m)->hidden);
    if (!e->hist || !e->prefix) goto fail;
  }
  return e;
fail:
  lks_engine_free(e);
  return NULL;
}

void lks_engine_free(lks_engine *e) {
  if (!e) return;
  lks_backend *be = lks_model_backend(e->m);
  lks_prefix_free(e->prefix);
  free(e->hist);
  for (int i = 0; e->spec && i < e->max_slots; i++) {
    be->ops->buf_free(be, e->spec[i].hid);
    be->ops->buf_free(be, e->spec[i].feat);
  }
  lks_kv_free(e->dkv);
  be->ops->buf_free(be, e->dstage);
  free(e->spec);
  be->ops->buf_free(be, e->stage);
  lks_kv_free(e->mkv);
  free(e->m_tok);
  free(e->m_pos);
  free(e->m_seq);
  free(e->m_rows);
  free(e->m_out);
  free(e->m_last);
  free(e->drafts);
  lks_kv_free(e->kv);
  free(e->tok);
  free(e->pos);
  free(e->seq);
  free(e->out_rows);
  free(e->out_tok);
  free(e->out_logits);
  free(e);
}

// The drafter's cache: the DFlash drafter's context when there is one, else the MTP layer's.
static lks_kv_cache *drafter_kv(const lks_engine *e) { return e->df ? e->dkv : e->mkv; }

lks_model *lks_engine_model(const lks_engine *e) { return e->m; }
void lks_engine_free_blocks(const lks_engine *e, int *target, int *drafter) {
  *target = lks_kv_free_blocks(e->kv);
  *drafter = drafter_kv(e) ? lks_kv_free_blocks(drafter_kv(e)) : 0;
}
int lks_engine_slot_len(const lks_engine *e, int slot) {
  return slot >= 0 && slot < e->max_slots ? lks_kv_seq_len(e->kv, slot) : -1;
}

int lks_engine_prefix_match(const lks_engine *e, const int32_t *tok, int n, bool drafter) {
  return e->prefix ? lks_prefix_match(e->prefix, tok, n, drafter) : 0;
}
int lks_engine_block_size(const lks_engine *e) { return lks_kv_block_size(e->kv); }
int lks_engine_n_blocks(const lks_engine *e) { return lks_kv_n_blocks(e->kv); }
void lks_engine_prefix_stats(const lks_engine *e, lks_prefix_stats *st) {
  memset(st, 0, sizeof *st);
  if (e->prefix) lks_prefix_stats_get(e->prefix, st);
}

int lks_engine_kv_read(const lks_engine *e, int slot, bool drafter, int pos, float *out) {
  const lks_kv_cache *kv = drafter ? drafter_kv(e) : e->kv;
  if (!kv || slot < 0 || slot >= e->max_slots || pos < 0 || pos >= lks_kv_seq_len(kv, slot))
    return lks_set_error(LKS_ERANGE, "kv read: slot %d position %d is not held", slot, pos);
  int B = lks_kv_block_size(kv), at = lks_kv_seq_block(kv, slot, pos / B) * B + pos % B;
  lks_backend *be = lks_model_backend(e->m);
  for (int l = 0;; l++) {
    const lks_kv_layer *L = lks_kv_layer_at(kv, l);
    int64_t w = (int64_t)L->n_kv_heads * L->head_dim, rows = (int64_t)L->n_blocks * B;
    // K, and V where the layer has a V pool (the MLA cache has K pools alone, some empty).
    if (L->k) LKS_TRY(lks_tensor_to_host_f32(be, out, lks_tensor_rows(lks_tensor_2d(L->k, 0, L->dtype, rows, w), at, 1)));
    else memset(out, 0, (size_t)w * sizeof *out);
    if (L->v) LKS_TRY(lks_tensor_to_host_f32(be, out + w, lks_tensor_rows(lks_tensor_2d(L->v, 0, L->dtype, rows, w), at, 1)));
    else memset(out + w, 0, (size_t)w * sizeof *out);
    out += 2 * w;
    if (l + 1 == lks_kv_n_layers(kv)) break;
  }
  return 0;
}

size_t lks_engine_kv_row_floats(const lks_engine *e, bool drafter) {
  const lks_kv_cache *kv = drafter ? drafter_kv(e) : e->kv;
  if (!kv) return 0;
  // Layers differ in width in the MLA cache (latent + rope key, then the indexer's keys or none).
  size_t f = 0;
  for (int l = 0; l < lks_kv_n_layers(kv); l++) {
    const lks_kv_layer *L = lks_kv_layer_at(kv, l);
    f += 2 * (size_t)L->n_kv_heads * (size_t)L->head_dim;
  }
  return f;
}

static int check_slot(const lks_engine *e, uint32_t slot, bool must_be_used) {
  if (slot >= (uint32_t)e->max_slots)
    return lks_set_error(LKS_ERANGE, "slot %u outside [0, %d)", slot, e->max_slots);
  int len = lks_kv_seq_len(e->kv, (int)slot);
  if (must_be_used && len < 0) return lks_set_error(LKS_EINVAL, "slot %u is not allocated", slot);
  if (!must_be_used && len >= 0) return lks_set_error(LKS_EINVAL, "slot %u is already in use", slot);
  return 0;
}

static int check_forward(const lks_engine *e, const Lockstep__Forward *f) {
  if (f->n_seqs == 0) return lks_set_error(LKS_EINVAL, "forward without sequences");
  int vocab = lks_model_config(e->m)->vocab;
  for (size_t i = 0; i < f->n_seqs; i++) {
    const Lockstep__SlotTokens *s = f->seqs[i];
    LKS_TRY(check_slot(e, s->slot, true));
    for (size_t j = 0; j < i; j++)
      if (f->seqs[j]->slot == s->slot)
        return lks_set_error(LKS_EINVAL, "slot %u appears twice in one forward", s->slot);
    if (s->n_tokens == 0) return lks_set_error(LKS_EINVAL, "slot %u: no tokens", s->slot);
    int len = lks_kv_seq_len(e->kv, (int)s->slot);
    // New tokens start at the slot's length, or overwrite rolled-back positions before it.
    if ((int64_t)s->start_pos > len)
      return lks_set_error(LKS_ERANGE, "slot %u: start position %u leaves a gap after %d positions",
                           s->slot, s->start_pos, len);
    if ((int64_t)s->start_pos + (int64_t)s->n_tokens > e->max_len)
      return lks_set_error(LKS_ERANGE, "slot %u: %zu tokens at %u exceed the longest sequence %d",
                           s->slot, s->n_tokens, s->start_pos, e->max_len);
    for (size_t t = 0; t < s->n_tokens; t++)
      if (s->tokens[t] < 0 || s->tokens[t] >= vocab)
        return lks_set_error(LKS_ERANGE, "slot %u: token id %d outside the vocabulary [0, %d)",
                             s->slot, s->tokens[t], vocab);
    if (!s->defer_mtp) continue;
    // A deferred plain step's row joins the slot's kept rows, which must end right before it.
    if (!f->mtp || !e->mkv || s->n_tokens != 1 || s->want_all)
      return lks_set_error(LKS_EINVAL, "slot %u: defer_mtp on a run that is not one plain token "
                           "of a forward for the drafter", s->slot);
    const spec_slot *sp = &e->spec[s->slot];
    if (sp->hid_rows > 0 && (sp->hid_pos + sp->hid_rows != (int)s->start_pos ||
                             sp->hid_rows >= LKS_MTP_BACKLOG))
      return lks_set_error(LKS_EINVAL,
                           "slot %u: a deferred row at %u after %d kept rows at %d (at most %d)",
                           s->slot, s->start_pos, sp->hid_rows, sp->hid_pos, LKS_MTP_BACKLOG);
  }
  if (f->output != LOCKSTEP__OUTPUT_MODE__OUT_NONE && f->output != LOCKSTEP__OUTPUT_MODE__OUT_GREEDY &&
      f->output != LOCKSTEP__OUTPUT_MODE__OUT_LOGITS)
    return lks_set_error(LKS_EINVAL, "unknown output mode %d", f->output);
  return 0;
}

// DFLASH_PROPOSE: per slot one token at start_pos; the context it lacks before start_pos must be
// the kept rows of its last verify (or nothing).
static int check_dflash_propose(const lks_engine *e, const Lockstep__MtpPropose *p) {
  if (!e->df) return lks_set_error(LKS_EUNSUPPORTED, "DFlash propose: no DFlash drafter is loaded");
  int B = lks_dflash_block_size(e->df);
  if (p->n_drafts > (uint32_t)(B - 1) || p->n_drafts > (uint32_t)e->max_drafts ||
      (p->n_drafts > 0 && !e->speculation))
    return lks_set_error(LKS_ERANGE, "DFlash propose: %u drafts, the block and the levers allow %d",
                         p->n_drafts, e->speculation ? (B - 1 < e->max_drafts ? B - 1 : e->max_drafts) : 0);
  if (p->n_seqs == 0) return lks_set_error(LKS_EINVAL, "DFlash propose without sequences");
  int vocab = lks_model_config(e->m)->vocab;
  for (size_t i = 0; i < p->n_seqs; i++) {
    const Lockstep__SlotTokens *s = p->seqs[i];
    LKS_TRY(check_slot(e, s->slot, true));
    for (size_t j = 0; j < i; j++)
      if (p->seqs[j]->slot == s->slot)
        return lks_set_error(LKS_EINVAL, "slot %u appears twice in one propose", s->slot);
    if (s->n_tokens != 1 || s->tokens[0] < 0 || s->tokens[0] >= vocab)
      return lks_set_error(LKS_EINVAL, "DFlash propose: slot %u needs one token in the vocabulary",
                           s->slot);
    const spec_slot *sp = &e->spec[s->slot];
    int have = lks_kv_seq_len(e->dkv, (int)s->slot), need = (int)s->start_pos - have;
    if (need < 0 || (need > 0 && (sp->hid_pos != have || need > sp->hid_rows)))
      return lks_set_error(LKS_EINVAL,
                           "DFlash propose: slot %u drafts at %u, its context holds %d positions and "
                           "%d kept rows at %d",
                           s->slot, s->start_pos, have, sp->hid_rows, sp->hid_pos);
    // A catch-up (no drafts) runs no block: only its context must fit.
    if ((int64_t)s->start_pos + (p->n_drafts > 0 ? B : 0) > e->max_len)
      return lks_set_error(LKS_ERANGE, "DFlash propose: slot %u's %s would pass the longest "
                           "sequence", s->slot, p->n_drafts > 0 ? "block" : "context");
  }
  return 0;
}

static int check_propose(const lks_engine *e, const Lockstep__MtpPropose *p) {
  if (!e->mkv) return lks_set_error(LKS_EUNSUPPORTED, "MTP propose: this model has no MTP layer");
  if (p->n_drafts > (uint32_t)e->max_drafts || (p->n_drafts > 0 && !e->speculation))
    return lks_set_error(LKS_ERANGE, "MTP propose: %u drafts, the levers allow %d", p->n_drafts,
                         e->speculation ? e->max_drafts : 0);
  if (p->n_seqs == 0) return lks_set_error(LKS_EINVAL, "MTP propose without sequences");
  int vocab = lks_model_config(e->m)->vocab;
  for (size_t i = 0; i < p->n_seqs; i++) {
    const Lockstep__SlotTokens *s = p->seqs[i];
    LKS_TRY(check_slot(e, s->slot, true));
    for (size_t j = 0; j < i; j++)
      if (p->seqs[j]->slot == s->slot)
        return lks_set_error(LKS_EINVAL, "slot %u appears twice in one propose", s->slot);
    const spec_slot *sp = &e->spec[s->slot];
    if (s->n_tokens < 1 || (int)s->n_tokens > sp->hid_rows || (int)s->start_pos != sp->hid_pos)
      return lks_set_error(LKS_EINVAL,
                           "MTP propose: slot %u gives %zu tokens at %u, the drafter keeps %d hidden "
                           "rows at %d",
                           s->slot, s->n_tokens, s->start_pos, sp->hid_rows, sp->hid_pos);
    if ((int64_t)s->start_pos + (int64_t)s->n_tokens + p->n_drafts > e->max_len)
      return lks_set_error(LKS_ERANGE, "MTP propose: slot %u would pass the longest sequence", s->slot);
    for (size_t t = 0; t < s->n_tokens; t++)
      if (s->tokens[t] < 0 || s->tokens[t] >= vocab)
        return lks_set_error(LKS_ERANGE, "MTP propose: token id %d outside the vocabulary", s->tokens[t]);
  }
  return 0;
}

// A verify of a slot whose drafts this rank proposed must carry exactly those drafts: a
// difference means the ranks' drafters diverged (DESIGN.md section 7, step 3).
static int check_verify_drafts(const lks_engine *e, const Lockstep__Forward *f) {
  for (size_t i = 0; e->spec && i < f->n_seqs; i++) {
    const Lockstep__SlotTokens *s = f->seqs[i];
    const spec_slot *sp = &e->spec[s->slot];
    if (sp->n_drafts == 0 || (int)s->start_pos != sp->draft_pos - 1) continue;
    int k = (int)s->n_tokens - 1 < sp->n_drafts ? (int)s->n_tokens - 1 : sp->n_drafts;
    for (int j = 0; j < k; j++)
      if (s->tokens[j + 1] != sp->drafts[j])
        return lks_set_error(LKS_EFORMAT,
                             "consistency error: slot %u draft %d is %d in the verify, %d here",
                             s->slot, j + 1, s->tokens[j + 1], sp->drafts[j]);
  }
  return 0;
}

// A prefix for a new slot: whole blocks, every one of them cached here (the same on every rank,
// or the ranks' caches diverged).
static int check_attach(const lks_engine *e, const Lockstep__Forward *f) {
  if (!e->prefix) return lks_set_error(LKS_EUNSUPPORTED, "attach: the prefix cache is off");
  int B = lks_kv_block_size(e->kv), vocab = lks_model_config(e->m)->vocab;
  for (size_t i = 0; i < f->n_seqs; i++) {
    const Lockstep__SlotTokens *s = f->seqs[i];
    LKS_TRY(check_slot(e, s->slot, true));
    if (lks_kv_seq_len(e->kv, (int)s->slot) != 0 || s->start_pos != 0)
      return lks_set_error(LKS_EINVAL, "attach: slot %u is not new", s->slot);
    if (s->n_tokens == 0 || s->n_tokens % (size_t)B || s->n_tokens >= (size_t)e->max_len)
      return lks_set_error(LKS_EINVAL, "attach: slot %u: %zu tokens are not whole blocks of %d",
                           s->slot, s->n_tokens, B);
    for (size_t t = 0; t < s->n_tokens; t++)
      if (s->tokens[t] < 0 || s->tokens[t] >= vocab)
        return lks_set_error(LKS_ERANGE, "attach: token id %d outside the vocabulary", s->tokens[t]);
    int have = lks_prefix_match(e->prefix, s->tokens, (int)s->n_tokens, f->mtp);
    if ((size_t)have * B != s->n_tokens)
      return lks_set_error(LKS_EFORMAT,
                           "consistency error: slot %u: a prefix of %zu tokens, %d cached here",
                           s->slot, s->n_tokens, have * B);
  }
  return 0;
}

static int exec_attach(lks_engine *e, const Lockstep__Forward *f) {
  for (size_t i = 0; i < f->n_seqs; i++) {
    const Lockstep__SlotTokens *s = f->seqs[i];
    int L = (int)s->n_tokens, B = lks_kv_block_size(e->kv);
    bool drafter = f->mtp && drafter_kv(e);
    lks_tensor hid = drafter && !e->df ? hid_view(e, s->slot, 1) : (lks_tensor){0};
    LKS_TRY(lks_prefix_attach(e->prefix, (int)s->slot, s->tokens, L / B, drafter, hid));
    memcpy(e->hist + (size_t)s->slot * e->max_len, s->tokens, (size_t)L * sizeof *s->tokens);
    if (drafter && e->df) {
      // The DFlash context holds every position of the prefix.
      e->spec[s->slot].hid_rows = 0;
      e->spec[s->slot].valid = L;
    } else if (drafter) {
      // The drafter holds rows [0, L - 1); h_{L-1} waits for the first token after the prefix.
      spec_slot *sp = &e->spec[s->slot];
      sp->hid_rows = 1;
      sp->hid_pos = L - 1;
      sp->valid = L - 1;
    }
  }
  return 0;
}

// Before a slot is freed: its full blocks go to the prefix cache.
static int cache_slot(lks_engine *e, int slot) {
  if (!e->prefix) return 0;
  int len = lks_kv_seq_len(e->kv, slot), dlen = 0;
  if (drafter_kv(e)) {
    dlen = lks_kv_seq_len(drafter_kv(e), slot);
    if (dlen > e->spec[slot].valid) dlen = e->spec[slot].valid;
  }
  return lks_prefix_insert(e->prefix, slot, e->hist + (size_t)slot * e->max_len, len, dlen);
}

// After a forward: each row's token in the slot's history, and for the prefix cache's drafter
// part, h at the last position of each block.
static int record_rows(lks_engine *e, int n, lks_tensor hidden) {
  if (!e->prefix) return 0;
  int B = lks_kv_block_size(e->kv);
  lks_backend *be = lks_model_backend(e->m);
  for (int r = 0; r < n; r++) {
    int slot = e->seq[r], pos = e->pos[r];
    e->hist[(size_t)slot * e->max_len + pos] = e->tok[r];
    if (e->mkv && !e->df && pos % B == B - 1) {
      int32_t row = r;
      LKS_TRY(be->ops->gather_rows(be, lks_prefix_hidden(e->prefix, lks_kv_seq_block(e->kv, slot, pos / B)),
                                   hidden, &row));
    }
  }
  return 0;
}

int lks_engine_check(const lks_engine *e, const Lockstep__Command *cmd) {
  switch (cmd->type) {
    case LOCKSTEP__CMD_TYPE__EP_CMD_MTP_PROPOSE:
      if (!cmd->propose) return lks_set_error(LKS_EINVAL, "MTP propose without payload");
      return check_propose(e, cmd->propose);
    case LOCKSTEP__CMD_TYPE__EP_CMD_DFLASH_PROPOSE:
      if (!cmd->propose) return lks_set_error(LKS_EINVAL, "DFlash propose without payload");
      return check_dflash_propose(e, cmd->propose);
    case LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT:
    case LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT: {
      bool alloc = cmd->type == LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT;
      if (!cmd->slots) return lks_set_error(LKS_EINVAL, "slot command without slots");
      for (size_t i = 0; i < cmd->slots->n_slots; i++)
        LKS_TRY(check_slot(e, cmd->slots->slots[i], !alloc));
      return 0;
    }
    case LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL:
    case LOCKSTEP__CMD_TYPE__EP_CMD_DECODE:
    case LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY:
      if (!cmd->forward) return lks_set_error(LKS_EINVAL, "forward command without payload");
      LKS_TRY(check_forward(e, cmd->forward));
      if (cmd->forward->mtp && !e->mkv && !e->df)
        return lks_set_error(LKS_EUNSUPPORTED, "forward for the drafter: this model has no MTP layer");
      if (cmd->type == LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY) return check_verify_drafts(e, cmd->forward);
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_ATTACH_PREFIX:
      if (!cmd->forward) return lks_set_error(LKS_EINVAL, "attach without payload");
      return check_attach(e, cmd->forward);
    case LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE:
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_COMMIT: {
      const Lockstep__Commit *c = cmd->commit;
      if (!c || c->n_slots != c->n_keep_len)
        return lks_set_error(LKS_EINVAL, "commit: slots and lengths differ in number");
      for (size_t i = 0; i < c->n_slots; i++) {
        LKS_TRY(check_slot(e, c->slots[i], true));
        if ((int)c->keep_len[i] > lks_kv_seq_len(e->kv, (int)c->slots[i]))
          return lks_set_error(LKS_ERANGE, "commit: slot %u keeps %u of %d positions", c->slots[i],
                               c->keep_len[i], lks_kv_seq_len(e->kv, (int)c->slots[i]));
      }
      return 0;
    }
    case LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS:
      if (!cmd->levers || cmd->levers->n_drafts > MAX_DRAFTS)
        return lks_set_error(LKS_ERANGE, "levers: draft count %u outside 0..%d",
                             cmd->levers ? cmd->levers->n_drafts : 0, MAX_DRAFTS);
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_HEARTBEAT:
    case LOCKSTEP__CMD_TYPE__EP_CMD_SHUTDOWN:
      return 0;
    default:
      return lks_set_error(LKS_EUNSUPPORTED, "command type %d is not executed by this engine", cmd->type);
  }
}

static int grow_i32(int32_t **p, size_t n) {
  int32_t *q = realloc(*p, (n ? n : 1) * sizeof *q);
  if (!q) return lks_set_error(LKS_ENOMEM, "out of memory");
  *p = q;
  return 0;
}

// Host scratch for an MTP batch of n rows, and the staging buffer of their hidden inputs.
static int reserve_mtp(lks_engine *e, int n) {
  if (n > e->cap_m) {
    LKS_TRY(grow_i32(&e->m_tok, (size_t)n));
    LKS_TRY(grow_i32(&e->m_pos, (size_t)n));
    LKS_TRY(grow_i32(&e->m_seq, (size_t)n));
    LKS_TRY(grow_i32(&e->m_rows, (size_t)n));
    LKS_TRY(grow_i32(&e->m_out, (size_t)n));
    LKS_TRY(grow_i32(&e->m_last, (size_t)n));
    e->cap_m = n;
  }
  if (n > e->cap_stage) {
    lks_backend *be = lks_model_backend(e->m);
    be->ops->buf_free(be, e->stage);
    size_t H = (size_t)lks_model_config(e->m)->hidden;
    e->stage = be->ops->buf_alloc(be, (size_t)n * H * sizeof(float));
    e->cap_stage = e->stage ? n : 0;
    if (!e->stage) return lks_set_error(LKS_ENOMEM, "MTP staging for %d rows", n);
  }
  return 0;
}

static lks_tensor stage_view(const lks_engine *e, int r0, int n) {
  int H = lks_model_config(e->m)->hidden;
  return lks_tensor_rows(lks_tensor_2d(e->stage, 0, LKS_F32, e->cap_stage, H), r0, n);
}

// Copies rows [r0, r0 + n) of src into dst starting at row d0.
static int copy_rows(lks_engine *e, lks_tensor dst, int d0, lks_tensor src, int r0, int n) {
  lks_backend *be = lks_model_backend(e->m);
  if (n <= 0) return 0;
  int32_t one, *idx = n == 1 ? &one : malloc((size_t)n * sizeof *idx);  // one: every plain step
  if (!idx) return lks_set_error(LKS_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) idx[i] = r0 + i;
  int rc = be->ops->gather_rows(be, lks_tensor_rows(dst, d0, n), src, idx);
  if (idx != &one) free(idx);
  return rc;
}

// After a forward with mtp set: keep each slot's hidden rows for its drafter. Verify rows
// (want_all) are all kept: which of them pair with which token is decided after the verdict, by
// the next propose. Any other run of tokens (a prefill chunk, a decode row) feeds the drafter the
// pairs (hidden j, token j + 1) it now has, including the one with the row kept before it (the
// catch-up), and keeps its last row until the next token is known. Decided per sequence, since
// one forward mixes prefill chunks, decodes and verifies.
static int mtp_after_forward(lks_engine *e, const Lockstep__Forward *f, lks_tensor hidden) {
  if (!e->mkv) return lks_set_error(LKS_EUNSUPPORTED, "this model has no MTP layer");
  size_t n_rows = 0;
  for (size_t i = 0; i < f->n_seqs; i++) n_rows += f->seqs[i]->n_tokens;
  LKS_TRY(reserve_mtp(e, (int)n_rows + (int)f->n_seqs));
  int n = 0;
  size_t r0 = 0;
  for (size_t i = 0; i < f->n_seqs; i++) {
    const Lockstep__SlotTokens *s = f->seqs[i];
    spec_slot *sp = &e->spec[s->slot];
    int start = (int)s->start_pos, cnt = (int)s->n_tokens;
    if (s->defer_mtp) {
      // The lazy catch-up: keep the row; the drafter pairs it with the next token later.
      if (sp->hid_rows == 0) sp->hid_pos = start;
      LKS_TRY(copy_rows(e, hid_view(e, s->slot, sp->hid_rows + 1), sp->hid_rows, hidden, (int)r0, 1));
      sp->hid_rows++;
    } else if (!s->want_all) {
      int first = n;
      // The kept row of the previous chunk pairs with this chunk's first token.
      if (sp->hid_rows == 1 && sp->hid_pos == start - 1) {
        LKS_TRY(copy_rows(e, stage_view(e, 0, e->cap_stage), n, hid_view(e, s->slot, 1), 0, 1));
        e->m_tok[n] = s->tokens[0];
        e->m_pos[n] = start - 1;
        e->m_seq[n++] = (int32_t)s->slot;
      }
      LKS_TRY(copy_rows(e, stage_view(e, 0, e->cap_stage), n, hidden, (int)r0, cnt - 1));
      for (int j = 0; j + 1 < cnt; j++) {
        e->m_tok[n] = s->tokens[j + 1];
        e->m_pos[n] = start + j;
        e->m_seq[n++] = (int32_t)s->slot;
      }
      if (n > first) {
        LKS_TRY(lks_kv_seq_resize(e->mkv, (int)s->slot, e->m_pos[n - 1] + 1));
        sp->valid = e->m_pos[n - 1] + 1;
      }
      LKS_TRY(copy_rows(e, hid_view(e, s->slot, 1), 0, hidden, (int)r0 + cnt - 1, 1));
      sp->hid_rows = 1;
      sp->hid_pos = start + cnt - 1;
    } else {
      if (cnt > MAX_DRAFTS + 1)
        return lks_set_error(LKS_ERANGE, "slot %u: %d rows to keep for the drafter (at most %d)",
                             s->slot, cnt, MAX_DRAFTS + 1);
      LKS_TRY(copy_rows(e, hid_view(e, s->slot, cnt), 0, hidden, (int)r0, cnt));
      sp->hid_rows = cnt;
      sp->hid_pos = start;
    }
    r0 += (size_t)cnt;
  }
  if (n == 0) return 0;
  lks_batch b = {n, e->m_tok, e->m_pos, e->m_seq, 0, NULL};
  return lks_model_mtp(e->m, e->mkv, &b, stage_view(e, 0, n), NULL, NULL);
}

// Staging for n DFlash context rows.
static int reserve_dstage(lks_engine *e, int n) {
  if (n <= e->cap_dstage) return 0;
  lks_backend *be = lks_model_backend(e->m);
  be->ops->buf_free(be, e->dstage);
  e->dstage = be->ops->buf_alloc(be, (size_t)n * lks_dflash_feature_cols(e->df) * sizeof(float));
  e->cap_dstage = e->dstage ? n : 0;
  if (!e->dstage) return lks_set_error(LKS_ENOMEM, "DFlash staging for %d rows", n);
  return 0;
}

static lks_tensor feat_view(const lks_engine *e, lks_buf *b, int rows) {
  return lks_tensor_2d(b, 0, LKS_F32, rows, lks_dflash_feature_cols(e->df));
}

// After a forward with mtp set and a DFlash drafter: the captured features of prefill chunks and
// decode rows (committed tokens) become context rows at once; a verify's rows are kept until the
// next DFLASH_PROPOSE says how many were accepted.
static int dflash_after_forward(lks_engine *e, const Lockstep__Forward *f) {
  lks_tensor feats = lks_model_captured(e->m);
  size_t n_rows = 0;
  for (size_t i = 0; i < f->n_seqs; i++) n_rows += f->seqs[i]->n_tokens;
  LKS_TRY(reserve_mtp(e, (int)n_rows));
  int n = 0;
  size_t r0 = 0;
  for (size_t i = 0; i < f->n_seqs; i++) {
    const Lockstep__SlotTokens *s = f->seqs[i];
    spec_slot *sp = &e->spec[s->slot];
    int start = (int)s->start_pos, cnt = (int)s->n_tokens;
    if (!s->want_all) {
      int have = lks_kv_seq_len(e->dkv, (int)s->slot);
      if (have < start)
        return lks_set_error(LKS_EINVAL, "DFlash: slot %u's context holds %d positions, the forward "
                             "starts at %d (a catch-up is missing)", s->slot, have, start);
      LKS_TRY(lks_kv_seq_resize(e->dkv, (int)s->slot, start + cnt));
      for (int j = 0; j < cnt; j++) {
        e->m_rows[n] = (int32_t)(r0 + (size_t)j);
        e->m_pos[n] = start + j;
        e->m_seq[n++] = (int32_t)s->slot;
      }
      sp->hid_rows = 0;
      sp->valid = start + cnt;
    } else {
      if (cnt > MAX_DRAFTS + 1)
        return lks_set_error(LKS_ERANGE, "slot %u: %d rows to keep for the drafter (at most %d)",
                             s->slot, cnt, MAX_DRAFTS + 1);
      LKS_TRY(copy_rows(e, feat_view(e, sp->feat, cnt), 0, feats, (int)r0, cnt));
      sp->hid_rows = cnt;
      sp->hid_pos = start;
    }
    r0 += (size_t)cnt;
  }
  if (n == 0) return 0;
  LKS_TRY(reserve_dstage(e, n));
  lks_backend *be = lks_model_backend(e->m);
  lks_tensor st = feat_view(e, e->dstage, n);
  LKS_TRY(be->ops->gather_rows(be, st, feats, e->m_rows));
  return lks_dflash_context(e->df, e->dkv, n, e->m_seq, e->m_pos, st);
}

// DFLASH_PROPOSE: per slot, the kept verify rows its context lacks become context rows; then one
// block forward for all slots [t_s, mask, ...] at s = start_pos; the drafts are the
// vocabulary-split arg-max of block rows 1 .. n_drafts, agreed by all-reduce. The block's own
// K/V rows are dropped again.
static int exec_dflash_propose(lks_engine *e, const Lockstep__MtpPropose *p, lks_engine_out *out) {
  int ns = (int)p->n_seqs, K = (int)p->n_drafts, B = lks_dflash_block_size(e->df), n = 0;
  LKS_TRY(reserve_mtp(e, ns * (MAX_DRAFTS + 1) > ns * B ? ns * (MAX_DRAFTS + 1) : ns * B));
  for (int i = 0; i < ns; i++) {
    const Lockstep__SlotTokens *s = p->seqs[i];
    int have = lks_kv_seq_len(e->dkv, (int)s->slot), need = (int)s->start_pos - have;
    n += need;
  }
  if (n > 0) {
    LKS_TRY(reserve_dstage(e, n));
    lks_tensor st = feat_view(e, e->dstage, n);
    n = 0;
    for (int i = 0; i < ns; i++) {
      const Lockstep__SlotTokens *s = p->seqs[i];
      spec_slot *sp = &e->spec[s->slot];
      int have = lks_kv_seq_len(e->dkv, (int)s->slot), need = (int)s->start_pos - have;
      if (need <= 0) continue;
      LKS_TRY(copy_rows(e, st, n, feat_view(e, sp->feat, need), 0, need));
      for (int j = 0; j < need; j++) {
        e->m_pos[n] = have + j;
        e->m_seq[n++] = (int32_t)s->slot;
      }
      LKS_TRY(lks_kv_seq_resize(e->dkv, (int)s->slot, (int)s->start_pos));
    }
    LKS_TRY(lks_dflash_context(e->df, e->dkv, n, e->m_seq, e->m_pos, st));
  }
  for (int i = 0; i < ns; i++) {
    spec_slot *sp = &e->spec[p->seqs[i]->slot];
    sp->hid_rows = 0;
    sp->n_drafts = K;
    sp->draft_pos = (int)p->seqs[i]->start_pos + 1;
    sp->valid = (int)p->seqs[i]->start_pos;
  }
  out->n = 0;
  if (K == 0) return 0;
  for (int i = 0; i < ns; i++) {
    const Lockstep__SlotTokens *s = p->seqs[i];
    e->m_seq[i] = (int32_t)s->slot;
    e->m_pos[i] = (int32_t)s->start_pos;
    e->m_tok[i] = s->tokens[0];
    LKS_TRY(lks_kv_seq_resize(e->dkv, (int)s->slot, (int)s->start_pos + B));
  }
  lks_tensor logits;
  int rc = lks_dflash_block(e->df, e->dkv, ns, e->m_seq, e->m_pos, e->m_tok, &logits);
  for (int i = 0; i < ns; i++) {  // the block's rows go, whatever happened
    int r2 = lks_kv_seq_resize(e->dkv, (int)p->seqs[i]->slot, (int)p->seqs[i]->start_pos);
    if (rc == 0) rc = r2;
  }
  LKS_TRY(rc);
  LKS_TRY(lks_model_argmax(e->m, logits, e->m_last));
  for (int i = 0; i < ns; i++) {
    memcpy(e->drafts + i * K, e->m_last + i * (B - 1), (size_t)K * sizeof(int32_t));
    memcpy(e->spec[p->seqs[i]->slot].drafts, e->drafts + i * K, (size_t)K * sizeof(int32_t));
  }
  out->n = ns * K;
  out->tokens = e->drafts;
  return 0;
}

static int exec_forward(lks_engine *e, const Lockstep__Forward *f, lks_engine_out *out) {
  size_t n = 0, n_out = 0;
  for (size_t i = 0; i < f->n_seqs; i++) {
    n += f->seqs[i]->n_tokens;
    n_out += f->seqs[i]->want_all ? f->seqs[i]->n_tokens : f->seqs[i]->want_last ? 1 : 0;
  }
  if ((int)n > e->cap_rows) {
    LKS_TRY(grow_i32(&e->tok, n));
    LKS_TRY(grow_i32(&e->pos, n));
    LKS_TRY(grow_i32(&e->seq, n));
    LKS_TRY(grow_i32(&e->out_rows, n));
    LKS_TRY(grow_i32(&e->out_tok, n));
    e->cap_rows = (int)n;
  }
  size_t r = 0, o = 0;
  for (size_t i = 0; i < f->n_seqs; i++) {
    const Lockstep__SlotTokens *s = f->seqs[i];
    LKS_TRY(lks_kv_seq_resize(e->kv, (int)s->slot, (int)(s->start_pos + s->n_tokens)));
    for (size_t t = 0; t < s->n_tokens; t++, r++) {
      e->tok[r] = s->tokens[t];
      e->pos[r] = (int32_t)(s->start_pos + t);
      e->seq[r] = (int32_t)s->slot;
      if (s->want_all || (s->want_last && t + 1 == s->n_tokens)) e->out_rows[o++] = (int32_t)r;
    }
  }
  lks_batch b = {(int)n, e->tok, e->pos, e->seq, (int)n_out, e->out_rows};
  lks_tensor logits, hidden;
  LKS_TRY(lks_model_forward(e->m, e->kv, &b, n_out ? &logits : NULL, &hidden));
  LKS_TRY(record_rows(e, (int)n, hidden));
  if (f->mtp) LKS_TRY(e->df ? dflash_after_forward(e, f) : mtp_after_forward(e, f, hidden));
  memset(out, 0, sizeof *out);
  out->n = (int)n_out;
  if (n_out == 0 || f->output == LOCKSTEP__OUTPUT_MODE__OUT_NONE) return 0;
  if (f->output == LOCKSTEP__OUTPUT_MODE__OUT_GREEDY) {
    LKS_TRY(lks_model_argmax(e->m, logits, e->out_tok));
    out->tokens = e->out_tok;
    return 0;
  }
  int V = lks_model_config(e->m)->vocab;
  if ((int)n_out > e->cap_out) {
    float *p = realloc(e->out_logits, n_out * (size_t)V * sizeof *p);
    if (!p) return lks_set_error(LKS_ENOMEM, "out of memory for %zu logits rows", n_out);
    e->out_logits = p;
    e->cap_out = (int)n_out;
  }
  LKS_TRY(lks_model_logits_host(e->m, logits, e->out_logits));
  out->logits = e->out_logits;
  return 0;
}

// MTP_PROPOSE: per slot, one MTP row per given token (paired with the kept hidden rows: the
// catch-up of accepted drafts, then the first draft), then n_drafts - 1 chained steps that carry
// shared_head.norm(z) (MODEL.md section 3). All slots run batched; every draft is the
// vocabulary-split arg-max, agreed by all-reduce.
static int exec_propose(lks_engine *e, const Lockstep__MtpPropose *p, lks_engine_out *out) {
  int ns = (int)p->n_seqs, K = (int)p->n_drafts, n = 0;
  for (int i = 0; i < ns; i++) n += (int)p->seqs[i]->n_tokens;
  LKS_TRY(reserve_mtp(e, n > ns ? n : ns));
  n = 0;
  for (int i = 0; i < ns; i++) {
    const Lockstep__SlotTokens *s = p->seqs[i];
    int cnt = (int)s->n_tokens;
    LKS_TRY(copy_rows(e, stage_view(e, 0, e->cap_stage), n, hid_view(e, s->slot, cnt), 0, cnt));
    for (int j = 0; j < cnt; j++) {
      e->m_tok[n] = s->tokens[j];
      e->m_pos[n] = (int32_t)s->start_pos + j;
      e->m_seq[n++] = (int32_t)s->slot;
    }
    e->m_out[i] = n - 1;  // the last row of each slot gives its first draft
    LKS_TRY(lks_kv_seq_resize(e->mkv, (int)s->slot, (int)s->start_pos + cnt));
    e->spec[s->slot].hid_rows = 0;
    e->spec[s->slot].n_drafts = K;
    e->spec[s->slot].draft_pos = (int)s->start_pos + cnt;
    e->spec[s->slot].valid = (int)s->start_pos + cnt;
  }
  // n_drafts 0: the catch-up alone (after plain decode steps), no logits.
  lks_batch b = {n, e->m_tok, e->m_pos, e->m_seq, K ? ns : 0, e->m_out};
  lks_tensor logits, carry;
  LKS_TRY(lks_model_mtp(e->m, e->mkv, &b, stage_view(e, 0, n), &logits, &carry));
  out->n = 0;
  if (K == 0) {
    for (int i = 0; i < ns; i++) e->spec[p->seqs[i]->slot].n_drafts = 0;
    return 0;
  }
  LKS_TRY(lks_model_argmax(e->m, logits, e->m_last));
  for (int k = 1;; k++) {
    for (int i = 0; i < ns; i++) e->drafts[i * K + k - 1] = e->m_last[i];
    if (k == K) break;
    // Chained step k + 1: the draft of step k at the next position, with the carried hidden.
    // carry holds the output rows, sequence i's in row i.
    lks_backend *be = lks_model_backend(e->m);
    lks_tensor h = stage_view(e, 0, ns);
    for (int i = 0; i < ns; i++) e->m_out[i] = i;
    LKS_TRY(be->ops->gather_rows(be, h, carry, e->m_out));
    for (int i = 0; i < ns; i++) {
      const Lockstep__SlotTokens *s = p->seqs[i];
      e->m_tok[i] = e->m_last[i];
      e->m_pos[i] = (int32_t)(s->start_pos + s->n_tokens) + k - 1;
      e->m_seq[i] = (int32_t)s->slot;
      LKS_TRY(lks_kv_seq_resize(e->mkv, (int)s->slot, e->m_pos[i] + 1));
    }
    lks_batch c = {ns, e->m_tok, e->m_pos, e->m_seq, ns, e->m_out};
    LKS_TRY(lks_model_mtp(e->m, e->mkv, &c, h, &logits, &carry));
    LKS_TRY(lks_model_argmax(e->m, logits, e->m_last));
  }
  for (int i = 0; i < ns; i++)
    memcpy(e->spec[p->seqs[i]->slot].drafts, e->drafts + i * K, (size_t)K * sizeof(int32_t));
  out->n = ns * K;
  out->tokens = e->drafts;
  return 0;
}

int lks_engine_exec(lks_engine *e, const Lockstep__Command *cmd, lks_engine_out *out) {
  lks_engine_out none;
  if (!out) out = &none;
  memset(out, 0, sizeof *out);
  LKS_TRY(lks_engine_check(e, cmd));
  switch (cmd->type) {
    case LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT:
      for (size_t i = 0; i < cmd->slots->n_slots; i++) {
        int slot = (int)cmd->slots->slots[i];
        LKS_TRY(lks_kv_seq_claim(e->kv, slot));
        if (e->mkv) LKS_TRY(lks_kv_seq_claim(e->mkv, slot));
        if (e->dkv) LKS_TRY(lks_kv_seq_claim(e->dkv, slot));
        if (e->spec) e->spec[slot].hid_rows = e->spec[slot].n_drafts = e->spec[slot].valid = 0;
      }
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_ATTACH_PREFIX:
      return exec_attach(e, cmd->forward);
    case LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE:
      if (e->prefix) lks_prefix_clear(e->prefix);
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT:
      for (size_t i = 0; i < cmd->slots->n_slots; i++) {
        LKS_TRY(cache_slot(e, (int)cmd->slots->slots[i]));
        lks_kv_seq_free(e->kv, (int)cmd->slots->slots[i]);
        if (e->mkv) lks_kv_seq_free(e->mkv, (int)cmd->slots->slots[i]);
        if (e->dkv) lks_kv_seq_free(e->dkv, (int)cmd->slots->slots[i]);
      }
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL:
    case LOCKSTEP__CMD_TYPE__EP_CMD_DECODE:
    case LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY:
      return exec_forward(e, cmd->forward, out);
    case LOCKSTEP__CMD_TYPE__EP_CMD_MTP_PROPOSE:
      return exec_propose(e, cmd->propose, out);
    case LOCKSTEP__CMD_TYPE__EP_CMD_DFLASH_PROPOSE:
      return exec_dflash_propose(e, cmd->propose, out);
    case LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS:
      e->speculation = cmd->levers->speculation;
      e->max_drafts = (int)cmd->levers->n_drafts;
      LKS_LOG(LKS_LOG_INFO, "levers at step %llu: speculation %s, at most %d drafts, ladder '%s'",
              (unsigned long long)cmd->step_id, e->speculation ? "on" : "off", e->max_drafts,
              cmd->levers->ladder ? cmd->levers->ladder : "");
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_COMMIT:
      for (size_t i = 0; i < cmd->commit->n_slots; i++) {
        int slot = (int)cmd->commit->slots[i], keep = (int)cmd->commit->keep_len[i];
        LKS_TRY(lks_kv_seq_resize(e->kv, slot, keep));
        // The drafter keeps the hidden rows of the kept positions only: a deferred plain step
        // after this verify appends right after them.
        spec_slot *sp = e->spec ? &e->spec[slot] : NULL;
        if (sp && sp->hid_rows > 0 && sp->hid_pos + sp->hid_rows > keep)
          sp->hid_rows = keep > sp->hid_pos ? keep - sp->hid_pos : 0;
      }
      return 0;
    default:
      return 0;
  }
}
