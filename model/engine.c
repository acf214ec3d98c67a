// SPDX-License-Identifier: MIT
// Per-rank command execution (see engine.h).
#include "model/engine.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

struct lks_engine {
  lks_model *m;
  lks_kv_cache *kv;
  int max_slots, max_len;
  // Host scratch for one forward.
  int32_t *tok, *pos, *seq, *out_rows, *out_tok;
  float *out_logits;
  int cap_rows, cap_out;
};

lks_engine *lks_engine_new(lks_model *m, int max_slots, int max_seq_len, int block) {
  lks_engine *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->m = m;
  e->max_slots = max_slots;
  e->max_len = max_seq_len;
  int blocks = max_slots * ((max_seq_len + block - 1) / block);
  e->kv = lks_model_kv_new(m, false, block, blocks, max_slots, max_seq_len);
  if (!e->kv) {
    free(e);
    return NULL;
  }
  return e;
}

void lks_engine_free(lks_engine *e) {
  if (!e) return;
  lks_kv_free(e->kv);
  free(e->tok);
  free(e->pos);
  free(e->seq);
  free(e->out_rows);
  free(e->out_tok);
  free(e->out_logits);
  free(e);
}

lks_model *lks_engine_model(const lks_engine *e) { return e->m; }
int lks_engine_slot_len(const lks_engine *e, int slot) {
  return slot >= 0 && slot < e->max_slots ? lks_kv_seq_len(e->kv, slot) : -1;
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
  }
  if (f->output != LOCKSTEP__OUTPUT_MODE__OUT_NONE && f->output != LOCKSTEP__OUTPUT_MODE__OUT_GREEDY &&
      f->output != LOCKSTEP__OUTPUT_MODE__OUT_LOGITS)
    return lks_set_error(LKS_EINVAL, "unknown output mode %d", f->output);
  return 0;
}

int lks_engine_check(const lks_engine *e, const Lockstep__Command *cmd) {
  switch (cmd->type) {
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
      return check_forward(e, cmd->forward);
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
  lks_tensor logits;
  LKS_TRY(lks_model_forward(e->m, e->kv, &b, n_out ? &logits : NULL, NULL));
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

int lks_engine_exec(lks_engine *e, const Lockstep__Command *cmd, lks_engine_out *out) {
  lks_engine_out none;
  if (!out) out = &none;
  memset(out, 0, sizeof *out);
  LKS_TRY(lks_engine_check(e, cmd));
  switch (cmd->type) {
    case LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT:
      for (size_t i = 0; i < cmd->slots->n_slots; i++)
        LKS_TRY(lks_kv_seq_claim(e->kv, (int)cmd->slots->slots[i]));
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT:
      for (size_t i = 0; i < cmd->slots->n_slots; i++) lks_kv_seq_free(e->kv, (int)cmd->slots->slots[i]);
      return 0;
    case LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL:
    case LOCKSTEP__CMD_TYPE__EP_CMD_DECODE:
    case LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY:
      return exec_forward(e, cmd->forward, out);
    case LOCKSTEP__CMD_TYPE__EP_CMD_COMMIT:
      for (size_t i = 0; i < cmd->commit->n_slots; i++)
        LKS_TRY(lks_kv_seq_resize(e->kv, (int)cmd->commit->slots[i], (int)cmd->commit->keep_len[i]));
      return 0;
    default:
      return 0;
  }
}
