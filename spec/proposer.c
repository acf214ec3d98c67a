// SPDX-License-Identifier: MIT
// The proposers (see spec.h):
// - mtp: the checkpoint's MTP layer, sharded like the target, so every propose is a collective
//   forward on every rank, announced with EP_CMD_MTP_PROPOSE. Its state on rank 0 is the list of
//   tokens whose pairs with kept target hidden states the drafter still lacks (the accepted
//   drafts and the bonus of the last verify, then the token of every plain step since: the
//   backlog), and the position of the first. Every rank keeps the same hidden rows (one per
//   pending token: the engine appends a plain step's row when its forward says defer_mtp), so
//   the backlog is paired in one batched MTP forward at the next propose, or by catchup when it
//   is full. Batched or one at a time, the drafter's KV rows are the same (the kernels are
//   batch-invariant).
// - dflash: a DFlash block drafter (model/dflash.h), sharded like the target, so every propose
//   is a collective command (EP_CMD_DFLASH_PROPOSE) run on every rank; one block forward drafts up
//   to block_size - 1 tokens. Its state on rank 0 is the block's first token (the last verified
//   one) and its position; the engines keep the context (the target features of committed
//   positions), appending a verify's accepted rows at the next propose, so rejected rows never
//   reach it (the rollback).
// - ngram: prompt lookup on rank 0 alone: the longest recent suffix (3, 2, then 1 tokens) found
//   earlier in the sequence proposes the tokens that followed it.
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dflash.h"
#include "spec/spec.h"

// ---- mtp ----

typedef struct {
  int slot;
  int32_t pending[LKS_MTP_BACKLOG];
  int n_pending, start;
} mtp_state;

static void *mtp_alloc(lks_proposer *p, int slot) {
  (void)p;
  mtp_state *s = calloc(1, sizeof *s);
  if (s) s->slot = slot;
  return s;
}
static void mtp_free(lks_proposer *p, void *st) {
  (void)p;
  free(st);
}

static int mtp_prefill(lks_proposer *p, lks_spec_seq *s, int n_prompt, int32_t first) {
  (void)p;
  mtp_state *m = s->state;
  m->pending[0] = first;
  m->n_pending = 1;
  m->start = n_prompt - 1;  // the prompt's last hidden state pairs with the first token
  return 0;
}

// One MTP_PROPOSE for n sequences; k = 0 only catches up.
static int mtp_submit(lks_proposer *p, lks_spec_seq **s, int n, int k, int32_t *drafts) {
  Lockstep__SlotTokens *st = calloc((size_t)n, sizeof *st);
  Lockstep__SlotTokens **ptrs = calloc((size_t)n, sizeof *ptrs);
  if (!st || !ptrs) {
    free(st);
    free(ptrs);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    mtp_state *m = s[i]->state;
    lockstep__slot_tokens__init(&st[i]);
    st[i].slot = (uint32_t)m->slot;
    st[i].start_pos = (uint32_t)m->start;
    st[i].tokens = m->pending;
    st[i].n_tokens = (size_t)m->n_pending;
    ptrs[i] = &st[i];
  }
  Lockstep__MtpPropose mp = LOCKSTEP__MTP_PROPOSE__INIT;
  mp.seqs = ptrs;
  mp.n_seqs = (size_t)n;
  mp.n_drafts = (uint32_t)k;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_MTP_PROPOSE;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_PROPOSE;
  cmd.propose = &mp;
  const int32_t *out = NULL;
  int rc = p->sub.submit(p->sub.ctx, &cmd, &out);
  if (rc == 0 && k > 0) memcpy(drafts, out, (size_t)n * k * sizeof *drafts);
  if (rc == 0)
    for (int i = 0; i < n; i++) ((mtp_state *)s[i]->state)->n_pending = 0;
  free(st);
  free(ptrs);
  return rc;
}

static int mtp_propose(lks_proposer *p, lks_spec_seq **s, int n, int k, int32_t *drafts,
                       int *n_out) {
  for (int i = 0; i < n; i++) {
    if (((mtp_state *)s[i]->state)->n_pending == 0)
      return lks_set_error(LKS_EINVAL, "mtp: slot %d has nothing to draft from", s[i]->slot);
    n_out[i] = k;
  }
  return mtp_submit(p, s, n, k, drafts);
}

static int mtp_after_verify(lks_proposer *p, lks_spec_seq *s, int pos, const int32_t *drafts,
                            int accepted, int32_t bonus) {
  (void)p;
  mtp_state *m = s->state;
  memcpy(m->pending, drafts, (size_t)accepted * sizeof *drafts);
  m->pending[accepted] = bonus;
  m->n_pending = accepted + 1;
  m->start = pos;  // the verify's first row (the last verified token) is the first kept hidden
  return 0;
}

// The plain step's row at pos was kept (defer_mtp): its token joins the backlog.
static int mtp_after_decode(lks_proposer *p, lks_spec_seq *s, int pos, int32_t next) {
  (void)p;
  mtp_state *m = s->state;
  if (m->n_pending == 0) m->start = pos;
  if (m->start + m->n_pending != pos || m->n_pending == LKS_MTP_BACKLOG)
    return lks_set_error(LKS_EINVAL, "mtp: slot %d: a plain step at %d after %d waiting at %d",
                         m->slot, pos, m->n_pending, m->start);
  m->pending[m->n_pending++] = next;
  return 0;
}

// Whether the sequence's next plain step may keep one more row: else catch up first.
static bool mtp_full(const lks_proposer *p, const mtp_state *m) {
  int limit = p->backlog < 1 ? 1 : p->backlog > LKS_MTP_BACKLOG ? LKS_MTP_BACKLOG : p->backlog;
  return m->n_pending >= limit;
}

static int mtp_catchup(lks_proposer *p, lks_spec_seq **s, int n) {
  lks_spec_seq *batch[64];
  int k = 0;
  for (int i = 0; i < n; i++)
    if (mtp_full(p, s[i]->state)) {
      if (k == 64) {
        LKS_TRY(mtp_submit(p, batch, k, 0, NULL));
        k = 0;
      }
      batch[k++] = s[i];
    }
  return k ? mtp_submit(p, batch, k, 0, NULL) : 0;
}

static const lks_proposer_ops mtp_ops = {
    .name = "mtp",
    .needs_comm = true,
    .needs_hidden = true,
    .defers_plain = true,
    .alloc_state = mtp_alloc,
    .free_state = mtp_free,
    .prefill = mtp_prefill,
    .propose_batch = mtp_propose,
    .after_verify = mtp_after_verify,
    .after_decode = mtp_after_decode,
    .catchup = mtp_catchup,
};

// ---- dflash ----

typedef struct {
  int slot;
  int32_t next;   // the block's first token: the last verified token
  int pos;        // its position
  bool pending;   // kept verify rows the engines' context still lacks
} df_state;

static void *df_alloc(lks_proposer *p, int slot) {
  (void)p;
  df_state *s = calloc(1, sizeof *s);
  if (s) s->slot = slot;
  return s;
}
static void df_free(lks_proposer *p, void *st) {
  (void)p;
  free(st);
}

static int df_prefill(lks_proposer *p, lks_spec_seq *s, int n_prompt, int32_t first) {
  (void)p;
  df_state *d = s->state;
  d->next = first;
  d->pos = n_prompt;
  d->pending = false;  // the prefill appended the prompt's rows
  return 0;
}

// One DFLASH_PROPOSE for n sequences; k = 0 only catches up.
static int df_submit(lks_proposer *p, lks_spec_seq **s, int n, int k, int32_t *drafts) {
  Lockstep__SlotTokens *st = calloc((size_t)n, sizeof *st);
  Lockstep__SlotTokens **ptrs = calloc((size_t)n, sizeof *ptrs);
  if (!st || !ptrs) {
    free(st);
    free(ptrs);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    df_state *d = s[i]->state;
    lockstep__slot_tokens__init(&st[i]);
    st[i].slot = (uint32_t)d->slot;
    st[i].start_pos = (uint32_t)d->pos;
    st[i].tokens = &d->next;
    st[i].n_tokens = 1;
    ptrs[i] = &st[i];
  }
  Lockstep__MtpPropose mp = LOCKSTEP__MTP_PROPOSE__INIT;
  mp.seqs = ptrs;
  mp.n_seqs = (size_t)n;
  mp.n_drafts = (uint32_t)k;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_DFLASH_PROPOSE;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_PROPOSE;
  cmd.propose = &mp;
  const int32_t *out = NULL;
  int rc = p->sub.submit(p->sub.ctx, &cmd, &out);
  if (rc == 0 && k > 0) memcpy(drafts, out, (size_t)n * k * sizeof *drafts);
  if (rc == 0)
    for (int i = 0; i < n; i++) ((df_state *)s[i]->state)->pending = false;
  free(st);
  free(ptrs);
  return rc;
}

static int df_propose(lks_proposer *p, lks_spec_seq **s, int n, int k, int32_t *drafts,
                      int *n_out) {
  int kb = k < p->block - 1 ? k : p->block - 1;
  int32_t *tmp = malloc((size_t)n * (kb > 0 ? kb : 1) * sizeof *tmp);
  if (!tmp) return lks_set_error(LKS_ENOMEM, "out of memory");
  int rc = df_submit(p, s, n, kb, tmp);
  for (int i = 0; rc == 0 && i < n; i++) {
    memcpy(drafts + (size_t)i * k, tmp + (size_t)i * kb, (size_t)kb * sizeof *tmp);
    n_out[i] = kb;
  }
  free(tmp);
  return rc;
}

static int df_after_verify(lks_proposer *p, lks_spec_seq *s, int pos, const int32_t *drafts,
                           int accepted, int32_t bonus) {
  (void)p, (void)drafts;
  df_state *d = s->state;
  d->next = bonus;
  d->pos = pos + accepted + 1;
  d->pending = true;
  return 0;
}

static int df_after_decode(lks_proposer *p, lks_spec_seq *s, int pos, int32_t next) {
  (void)p;
  df_state *d = s->state;
  d->next = next;
  d->pos = pos + 1;  // the decode row's features were appended by its forward
  return 0;
}

static int df_catchup(lks_proposer *p, lks_spec_seq **s, int n) {
  lks_spec_seq *batch[64];
  int k = 0;
  for (int i = 0; i < n; i++)
    if (((df_state *)s[i]->state)->pending) {
      if (k == 64) {
        LKS_TRY(df_submit(p, batch, k, 0, NULL));
        k = 0;
      }
      batch[k++] = s[i];
    }
  return k ? df_submit(p, batch, k, 0, NULL) : 0;
}

static const lks_proposer_ops dflash_ops = {
    .name = "dflash",
    .needs_comm = true,
    .needs_hidden = true,
    .alloc_state = df_alloc,
    .free_state = df_free,
    .prefill = df_prefill,
    .propose_batch = df_propose,
    .after_verify = df_after_verify,
    .after_decode = df_after_decode,
    .catchup = df_catchup,
};

// ---- ngram ----

static void *ng_alloc(lks_proposer *p, int slot) {
  (void)p, (void)slot;
  return calloc(1, 1);
}
static void ng_free(lks_proposer *p, void *st) {
  (void)p;
  free(st);
}
static int ng_prefill(lks_proposer *p, lks_spec_seq *s, int n, int32_t first) {
  (void)p, (void)s, (void)n, (void)first;
  return 0;
}

static int ng_propose(lks_proposer *p, lks_spec_seq **s, int n, int k, int32_t *drafts,
                      int *n_out) {
  (void)p;
  for (int i = 0; i < n; i++) {
    const int32_t *h = s[i]->history;
    int len = s[i]->n_history;
    n_out[i] = 0;
    for (int g = 3; g >= 1 && n_out[i] == 0; g--) {
      if (len <= g) continue;
      // The most recent earlier occurrence of the last g tokens.
      for (int at = len - g - 1; at >= 0; at--) {
        if (memcmp(h + at, h + len - g, (size_t)g * sizeof *h) != 0) continue;
        int avail = len - (at + g);
        int take = avail < k ? avail : k;
        memcpy(drafts + i * k, h + at + g, (size_t)take * sizeof *h);
        n_out[i] = take;
        break;
      }
    }
  }
  return 0;
}

static int ng_after_verify(lks_proposer *p, lks_spec_seq *s, int pos, const int32_t *d, int a,
                           int32_t bonus) {
  (void)p, (void)s, (void)pos, (void)d, (void)a, (void)bonus;
  return 0;
}
static int ng_after_decode(lks_proposer *p, lks_spec_seq *s, int pos, int32_t next) {
  (void)p, (void)s, (void)pos, (void)next;
  return 0;
}

static const lks_proposer_ops ngram_ops = {
    .name = "ngram",
    .needs_comm = false,
    .needs_hidden = false,
    .alloc_state = ng_alloc,
    .free_state = ng_free,
    .prefill = ng_prefill,
    .propose_batch = ng_propose,
    .after_verify = ng_after_verify,
    .after_decode = ng_after_decode,
    .catchup = NULL,
};

lks_proposer *lks_proposer_new(const char *name, const lks_model *m, lks_submitter sub) {
  const lks_proposer_ops *ops = NULL;
  if (!strcmp(name, "mtp")) ops = &mtp_ops;
  if (!strcmp(name, "ngram")) ops = &ngram_ops;
  if (!strcmp(name, "dflash")) ops = &dflash_ops;
  if (!ops) {
    lks_set_error(LKS_EINVAL, "--spec '%s': expected off, mtp, ngram or dflash", name);
    return NULL;
  }
  if (ops == &mtp_ops && lks_model_dflash(m)) {
    // Forwards that keep hidden states feed the attached DFlash drafter, not the MTP layer.
    lks_set_error(LKS_EUNSUPPORTED, "--spec mtp: this world runs a DFlash drafter (started with --spec dflash)");
    return NULL;
  }
  if (ops == &dflash_ops && !lks_model_dflash(m)) {
    lks_set_error(LKS_EUNSUPPORTED, "--spec dflash: no DFlash drafter is loaded (--draft-model)");
    return NULL;
  }
  if (ops == &mtp_ops && !lks_model_has_mtp(m)) {
    lks_set_error(LKS_EUNSUPPORTED, "--spec mtp: the model has no MTP layer (num_nextn_predict_layers 0)");
    return NULL;
  }
  lks_proposer *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->ops = ops;
  p->sub = sub;
  p->backlog = LKS_MTP_BACKLOG;
  p->block = ops == &dflash_ops ? lks_dflash_block_size(lks_model_dflash(m)) : 0;
  return p;
}

void lks_proposer_free(lks_proposer *p) { free(p); }
