// SPDX-License-Identifier: MIT
// Continuous batching, the one decoding loop (see scheduler.h).
//
// A step runs in named phases, each a function below: admit (free finished slots, take queued
// requests, fix the levers for this step), announce (FREE_SLOT, ALLOC_SLOT, SET_LEVERS), propose
// (drafts for the running sequences, or the drafter's catch-up), forward (one command of prefill
// chunks, decode rows and verify rows), accept (pick tokens, accept drafts, COMMIT what is kept)
// and emit (hand the tokens to the requests). The arrays a step needs are sized from
// --max-slots when the scheduler is made; nothing large lives on the stack. The request side
// (submit, read, cancel, and the emission of tokens with the stop-string hold-back) is request.c;
// the structs both halves share are in scheduler_impl.h.
#include "coordinator/scheduler.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim, mallopt
#endif

#include "coordinator/scheduler_impl.h"
#include "coordinator/submit.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

void lks__sched_deadline_in(struct timespec *ts, double s) {
  clock_gettime(CLOCK_REALTIME, ts);
  double t = (double)ts->tv_sec + ts->tv_nsec * 1e-9 + s;
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

static void hist_init(lks_hist *h, const double *le) {
  memset(h, 0, sizeof *h);
  memcpy(h->le, le, sizeof h->le);
}
void lks__sched_hist_add(lks_hist *h, double v) {
  int i = 0;
  while (i < LKS_HIST_BUCKETS && v > h->le[i]) i++;
  h->count[i]++;
  h->sum += v;
  h->n++;
}

void lks_sched_opts_from(const lks_settings *s, lks_sched_opts *o) {
  memset(o, 0, sizeof *o);
  o->max_queue = (int)lks_settings_int(s, "max-queue");
  o->chunk = (int)lks_settings_int(s, "prefill-chunk");
  o->max_len = (int)lks_settings_int(s, "max-seq-len");
  o->drain_grace = lks_settings_float(s, "drain-grace");
  snprintf(o->spec, sizeof o->spec, "%s", lks_settings_str(s, "spec"));
  o->n_drafts = (int)lks_settings_int(s, "num-drafts");
  snprintf(o->ladder, sizeof o->ladder, "%s", lks_settings_str(s, "ladder"));
  o->gate = lks_settings_bool(s, "spec-gate");
}

static int submit_for_proposer(void *ctx, Lockstep__Command *cmd, const int32_t **tokens) {
  lks_engine_out out = {0};
  LKS_TRY(lks_world_submit(ctx, cmd, &out));
  *tokens = out.tokens;
  return 0;
}

static int mem_new(lks__sched_mem *m, int n, int vocab, int n_pick) {
  size_t N = (size_t)n, R = (size_t)(LKS_MAX_DRAFTS + 1);
  m->to_free = calloc(N, sizeof *m->to_free);
  m->to_alloc = calloc(N, sizeof *m->to_alloc);
  m->dseq = calloc(N, sizeof *m->dseq);
  m->dreq = calloc(N, sizeof *m->dreq);
  m->drafts = calloc(N * LKS_MAX_DRAFTS, sizeof *m->drafts);
  m->n_d = calloc(N, sizeof *m->n_d);
  m->kcap = calloc(N, sizeof *m->kcap);
  m->kscratch = calloc(N, sizeof *m->kscratch);
  m->pseq = calloc(N, sizeof *m->pseq);
  m->st = calloc(N, sizeof *m->st);
  m->seqs = calloc(N, sizeof *m->seqs);
  m->rows = calloc(N, sizeof *m->rows);
  m->tok = calloc(N * R, sizeof *m->tok);
  m->c_slot = calloc(N, sizeof *m->c_slot);
  m->c_keep = calloc(N, sizeof *m->c_keep);
  m->sub = calloc(N, sizeof *m->sub);
  m->idx = calloc(N, sizeof *m->idx);
  m->ntmp = calloc(N, sizeof *m->ntmp);
  m->dtmp = calloc(N * LKS_MAX_DRAFTS, sizeof *m->dtmp);
  m->n_pick = n_pick;
  m->row = calloc((size_t)n_pick * (size_t)vocab, sizeof *m->row);
  m->counts = calloc((size_t)n_pick * (size_t)vocab, sizeof *m->counts);
  m->pk = calloc(N, sizeof *m->pk);
  bool ok = m->to_free && m->to_alloc && m->dseq && m->dreq && m->drafts && m->n_d && m->kcap &&
            m->kscratch && m->pseq && m->st &&
            m->seqs && m->rows && m->tok && m->c_slot && m->c_keep &&
            m->sub && m->idx && m->ntmp && m->dtmp && m->row && m->counts && m->pk;
  return ok ? 0 : lks_set_error(LKS_ENOMEM, "scheduler: out of memory for %d slots", n);
}

static void mem_free(lks__sched_mem *m) {
  free(m->to_free);
  free(m->to_alloc);
  free(m->dseq);
  free(m->dreq);
  free(m->drafts);
  free(m->n_d);
  free(m->kcap);
  free(m->kscratch);
  free(m->pseq);
  free(m->st);
  free(m->seqs);
  free(m->rows);
  free(m->tok);
  free(m->c_slot);
  free(m->c_keep);
  free(m->sub);
  free(m->idx);
  free(m->ntmp);
  free(m->dtmp);
  free(m->row);
  free(m->counts);
  free(m->pk);
}

static void slot_release(lks_sched *s, int i);

// JSON mode's token trie over the model's vocabulary, with its end-of-sequence ids (built once:
// about 0.1 s at 151k tokens, 1 ms at 4k).
static int json_new(lks_sched *s) {
  const lks_config *c = lks_model_config(s->w->model);
  double t0 = lks_clock();
  s->json = lks_json_vocab_new(s->tok, s->vocab, c->eos, c->n_eos);
  if (!s->json) return LKS_ENOMEM;
  s->json_cache = lks_json_cache_new(s->json, 64);
  if (!s->json_cache) return LKS_ENOMEM;
  s->json_mask = calloc((size_t)lks_json_mask_words(s->json), sizeof *s->json_mask);
  s->json_row = malloc((size_t)s->vocab * sizeof *s->json_row);
  if (!s->json_mask || !s->json_row) return lks_set_error(LKS_ENOMEM, "scheduler: out of memory");
  LKS_LOG(LKS_LOG_DEBUG, "json mode: token trie over %d ids in %.1f ms", s->vocab,
          (lks_clock() - t0) * 1e3);
  if (!lks_json_vocab_closable(s->json))
    LKS_LOG(LKS_LOG_WARN, "json mode: the vocabulary lacks single-byte tokens a completion may "
            "need; a JSON response cut by max_tokens may not close");
  return 0;
}

bool lks_sched_json_ready(const lks_sched *s) { return s->json != NULL; }

lks_sched *lks_sched_new(lks_world *w, const lks_tokenizer *tok, const lks_sched_opts *o) {
  lks_sched *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->w = w;
  s->tok = tok;
  s->o = *o;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->n_slots = (int)lks_settings_int(w->settings, "max-slots");
  s->kv_blocks = lks_engine_n_blocks(w->engine);
  s->vocab = lks_model_config(w->model)->vocab;
  s->slot = calloc((size_t)s->n_slots, sizeof *s->slot);
  if (!s->slot) {
    lks_set_error(LKS_ENOMEM, "scheduler: out of memory");
    goto fail;
  }
  // Picks spread over the backend's host threads (a device backend: 1).
  int n_pick = lks_backend_host_threads(w->be);
  n_pick = n_pick < 1 ? 1 : n_pick;
#ifdef __GLIBC__
  // Picks allocate on those threads too, and glibc gives each allocating thread an arena whose
  // freed memory stays resident: serve_fuzz_w2_mtp's memory check failed 1 time in 2 with one
  // seed (51.6 -> 57.2 MB) and passed 3 in 3 with a single arena (MALLOC_ARENA_MAX=1).
  if (n_pick > 1) mallopt(M_ARENA_MAX, 1);
#endif
  if (mem_new(&s->m, s->n_slots, s->vocab, n_pick) < 0) goto fail;
  static const double lat[LKS_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                               0.1,   0.25,   0.5,   1,    2.5,   10};
  hist_init(&s->st.ttft, lat);
  hist_init(&s->st.itl, lat);
  hist_init(&s->st.step, lat);
  s->st.slots = s->n_slots;
  for (int r = 0; r < LKS_RANKS_SHOWN; r++) s->st.rank_up[r] = true;
  if (o->n_drafts < 0 || o->n_drafts > LKS_MAX_DRAFTS) {
    lks_set_error(LKS_EINVAL, "--num-drafts %d: expected 0..%d", o->n_drafts, LKS_MAX_DRAFTS);
    goto fail;
  }
  s->now.n_drafts = o->n_drafts;
  snprintf(s->now.ladder, sizeof s->now.ladder, "%s", o->ladder);
  if (lks_ladder_parse(s->now.ladder, &s->now.parsed) < 0) goto fail;
  if (strcmp(o->spec, "off") != 0 && o->spec[0]) {
    lks_submitter sub = {submit_for_proposer, w};
    s->proposer = lks_proposer_new(o->spec, w->model, sub);
    if (!s->proposer) goto fail;
    if (o->mtp_backlog > 0) s->proposer->backlog = o->mtp_backlog;
    s->now.speculation = true;
  }
  s->wanted = s->now;
  s->calib_k = -1;
  if (s->proposer && o->gate && !(s->policy = lks_policy_new(s->n_slots, LKS_MAX_DRAFTS))) goto fail;
  if (tok && json_new(s) < 0) goto fail;
  s->st.spec.k_max = s->proposer ? o->n_drafts : 0;
  return s;
fail:
  lks_sched_free(s);
  return NULL;
}

void lks_sched_free(lks_sched *s) {
  if (!s) return;
  // Requests still held (a failed world, or a caller that stops early) are let go here.
  for (int i = 0; s->slot && i < s->n_slots; i++)
    if (s->slot[i]) slot_release(s, i);
  while (s->q_head) {
    lks_req *r = s->q_head;
    s->q_head = r->next;
    lks__req_unref(r);
  }
  lks_proposer_free(s->proposer);
  lks_policy_free(s->policy);
  lks_json_cache_free(s->json_cache);
  lks_json_vocab_free(s->json);
  free(s->json_mask);
  free(s->json_row);
  mem_free(&s->m);
  free(s->slot);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}


// Takes slot i's request: the slot is free again at the next FREE_SLOT.
static void slot_release(lks_sched *s, int i) {
  lks_req *r = s->slot[i];
  s->slot[i] = NULL;
  s->kv_reserved -= r->reserve;
  s->st.requests_done++;
  if (r->seq.state) s->proposer->ops->free_state(s->proposer, r->seq.state);
  r->seq.state = NULL;
  lks__req_unref(r);
}

// The KV blocks a request may need at most: its prompt, its tokens and a last verify's drafts,
// within --max-seq-len.
static int kv_need(const lks_sched *s, const lks_req *r) {
  int64_t pos = (int64_t)r->p.n_prompt + r->p.max_tokens + LKS_MAX_DRAFTS + 1;
  if (pos > s->o.max_len) pos = s->o.max_len;
  int B = lks_engine_block_size(s->w->engine);
  return (int)((pos + B - 1) / B);
}

// A queued request takes slot i (under s->mu).
static void slot_take(lks_sched *s, lks_req *r, int i) {
  r->slot = i;
  s->slot[i] = r;
  r->reserve = kv_need(s, r);
  s->kv_reserved += r->reserve;
  // Every position the sequence may hold, and the drafts of a last verify.
  int64_t cap = (int64_t)r->p.n_prompt + r->p.max_tokens;
  if (cap > s->o.max_len) cap = s->o.max_len;
  r->cap_hist = (int)cap + LKS_MAX_DRAFTS + 2;
  r->hist = malloc((size_t)r->cap_hist * sizeof *r->hist);
  if (r->hist) memcpy(r->hist, r->p.prompt, (size_t)r->p.n_prompt * sizeof *r->hist);
  r->n_hist = r->p.n_prompt;
  r->seq = (lks_spec_seq){i, r->hist, r->n_hist, NULL};
  if (s->proposer) r->seq.state = s->proposer->ops->alloc_state(s->proposer, i);
  lks_policy_seq_init(s->policy, &r->pol);
  s->st.prompt_tokens += (uint64_t)r->p.n_prompt;
}

// The queue and slot gauges of /metrics (under s->mu).
static void slot_gauges(lks_sched *s) {
  s->st.queue_depth = s->q_len;
  int used = 0;
  for (int i = 0; i < s->n_slots; i++) used += s->slot[i] != NULL;
  s->st.slots_in_use = used;
}

// Admit: finished slots out, queued requests in, this step's levers fixed. Returns whether the
// levers changed (they go out with this step).
static bool admit(lks_sched *s, int *n_free, int *n_alloc) {
  lks__sched_mem *m = &s->m;
  *n_free = *n_alloc = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_slots; i++) {
    lks_req *r = s->slot[i];
    if (!r) continue;
    pthread_mutex_lock(&r->mu);
    bool over = r->done || r->cancelled;
    if (r->cancelled && !r->done) s->st.requests_cancelled++;
    pthread_mutex_unlock(&r->mu);
    if (over) {
      m->to_free[(*n_free)++] = (uint32_t)i;
      slot_release(s, i);
    }
  }
  for (int i = 0; i < s->n_slots && s->q_head; i++) {
    if (s->slot[i]) continue;
    lks_req *r = s->q_head;
    pthread_mutex_lock(&r->mu);
    bool gone = r->cancelled;
    pthread_mutex_unlock(&r->mu);
    // In order: the head waits until the KV pool can hold everything it may need (blocks that
    // only the prefix cache holds are given back on demand, so they count as free).
    if (!gone && s->kv_reserved + kv_need(s, r) > s->kv_blocks) break;
    s->q_head = r->next;
    if (!s->q_head) s->q_tail = NULL;
    s->q_len--;
    r->next = NULL;
    if (gone) {  // its client left while it waited
      s->st.requests_cancelled++;
      lks__req_unref(r);
      i--;
      continue;
    }
    slot_take(s, r, i);
    m->to_alloc[(*n_alloc)++] = (uint32_t)i;
  }
  // With the counters of the requests it finished and cancelled: /metrics never shows one
  // request both finished and in a slot or the queue (it did until the step's end).
  slot_gauges(s);
  bool changed = s->levers_pending;
  s->levers_pending = false;
  s->clear_now = s->clear_pending;
  s->clear_pending = false;
  if (changed) s->now = s->wanted;
  pthread_mutex_unlock(&s->mu);
  return changed;
}

// The new sequences whose prompts start with cached blocks start from them (ATTACH_PREFIX),
// decided from rank 0's own cache after the step's FREE_SLOT put the finished sequences in it;
// at least the prompt's last token is left to prefill, for the first token's logits.
static int attach(lks_sched *s, int n_alloc) {
  lks__sched_mem *m = &s->m;
  int n = 0, B = lks_engine_block_size(s->w->engine);
  bool drafter = s->proposer && s->proposer->ops->needs_hidden;
  for (int j = 0; j < n_alloc; j++) {
    lks_req *r = s->slot[m->to_alloc[j]];
    int nb = lks_engine_prefix_match(s->w->engine, r->p.prompt, r->p.n_prompt - 1, drafter);
    if (nb == 0) continue;
    Lockstep__SlotTokens *st = &m->st[n];
    lockstep__slot_tokens__init(st);
    st->slot = (uint32_t)r->slot;
    st->tokens = r->p.prompt;
    st->n_tokens = (size_t)nb * B;
    m->seqs[n++] = st;
    r->n_fed = r->n_cached = nb * B;
  }
  if (n == 0) return 0;
  Lockstep__Forward f = LOCKSTEP__FORWARD__INIT;
  f.seqs = m->seqs;
  f.n_seqs = (size_t)n;
  f.mtp = drafter;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_ATTACH_PREFIX;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
  cmd.forward = &f;
  LKS_TRY(lks_world_submit(s->w, &cmd, NULL));
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) s->st.cached_tokens += m->st[i].n_tokens;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

// Drops what the prefix cache keeps, on every rank.
static int clear_cache(lks_sched *s) {
  Lockstep__Command clear = LOCKSTEP__COMMAND__INIT;
  clear.type = LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE;
  return lks_world_submit(s->w, &clear, NULL);
}

// Announce: the slot changes, cached prefixes and the levers, on every rank, before this step's
// forward.
static int announce(lks_sched *s, int n_free, int n_alloc, bool levers) {
  LKS_TRY(lks_world_slots(s->w, LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT, s->m.to_free, n_free));
  if (s->clear_now) {
    LKS_TRY(clear_cache(s));
    s->clear_now = false;
  }
  LKS_TRY(lks_world_slots(s->w, LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT, s->m.to_alloc, n_alloc));
  LKS_TRY(attach(s, n_alloc));
  if (!levers) return 0;
  Lockstep__Levers lv = LOCKSTEP__LEVERS__INIT;
  lv.speculation = s->now.speculation;
  lv.n_drafts = (uint32_t)s->now.n_drafts;
  lv.ladder = s->now.ladder;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_LEVERS;
  cmd.levers = &lv;
  return lks_world_submit(s->w, &cmd, NULL);
}

// Propose: drafts for every sequence past its prefill, as many as the policy picks for it (or,
// without the policy, the ladder's count for the batch width), within the levers and the room
// left (the verify rows L..L+k must fit in --max-seq-len); sequences that draft nothing keep
// their drafter's backlog (lazy catch-up), caught up by the proposer only when it is full.
// Drafting sequences are proposed together at the deepest count and each verifies its own first
// k; one whose room is less than the deepest count steps plain. Returns the number of decode
// sequences (m->dreq); m->n_d[i] is each one's draft count and
// m->drafts + i * LKS_MAX_DRAFTS its drafts; *K_out the deepest count, *R_out their sum;
// *caught_up whether a drafting sequence had plain steps to catch up (its cost is not a step's).
static int propose(lks_sched *s, int *K_out, int *R_out, bool *caught_up) {
  lks__sched_mem *m = &s->m;
  lks_proposer *pr = s->proposer;
  int n_dec = 0;
  for (int i = 0; i < s->n_slots; i++) {
    lks_req *r = s->slot[i];
    if (r && r->n_fed >= r->p.n_prompt && r->n_generated > 0) {
      r->seq.history = r->hist;
      r->seq.n_history = r->n_hist;
      m->n_d[n_dec] = 0;
      m->dseq[n_dec] = &r->seq;
      m->pseq[n_dec] = &r->pol;
      m->dreq[n_dec++] = r;
    }
  }
  *K_out = *R_out = 0;
  *caught_up = false;
  if (!pr || n_dec == 0) return n_dec;
  int k_lim = s->now.speculation ? lks_ladder_k(&s->now.parsed, n_dec, s->now.n_drafts) : 0;
  for (int i = 0; i < n_dec; i++) {
    int room = s->o.max_len - 1 - m->dreq[i]->n_fed;
    if (pr->block > 0 && room < pr->block - 1) room = 0;  // dflash: the whole block must fit
    m->kcap[i] = room < 0 ? 0 : room < k_lim ? room : k_lim;
  }
  int K = 0;
  if (s->calib_k >= 0) {
    for (int i = 0; i < n_dec; i++) {
      m->n_d[i] = s->calib_k < m->kcap[i] ? s->calib_k : m->kcap[i];
      K = m->n_d[i] > K ? m->n_d[i] : K;
    }
  } else if (s->o.force_k) {
    for (int i = 0; i < n_dec; i++) {
      int k = s->o.force_k(s->o.test_ctx, m->dreq[i]->slot, m->dreq[i]->n_generated);
      m->n_d[i] = k < 0 ? 0 : k < m->kcap[i] ? k : m->kcap[i];
      K = m->n_d[i] > K ? m->n_d[i] : K;
    }
  } else if (s->policy && k_lim > 0) {
    K = lks_policy_pick(s->policy, m->pseq, m->kcap, n_dec, m->n_d, m->kscratch);
  } else {
    for (int i = 0; i < n_dec; i++) {
      m->n_d[i] = m->kcap[i];
      K = m->n_d[i] > K ? m->n_d[i] : K;
    }
  }
  int n_draft = 0, n_rest = 0;
  for (int i = 0; i < n_dec; i++) {
    // The batch proposes at K: a sequence with room for fewer drafts (the end of its context)
    // would pass --max-seq-len in the drafter, so it steps plain this time.
    if (m->kcap[i] < K) m->n_d[i] = 0;
    if (m->n_d[i] > 0) m->idx[n_draft++] = i;
    *caught_up |= m->n_d[i] > 0 && m->pseq[i]->waiting > 0;
    m->pseq[i]->waiting = m->n_d[i] > 0 ? 0 : m->pseq[i]->waiting + 1;
  }
  if (n_draft > 0) {
    for (int j = 0; j < n_draft; j++) m->sub[j] = m->dseq[m->idx[j]];
    LKS_TRY(pr->ops->propose_batch(pr, m->sub, n_draft, K, m->dtmp, m->ntmp));
    for (int j = 0; j < n_draft; j++) {
      int i = m->idx[j], nd = m->ntmp[j] < m->n_d[i] ? m->ntmp[j] : m->n_d[i];
      m->n_d[i] = nd;
      *R_out += nd;
      memcpy(m->drafts + (size_t)i * LKS_MAX_DRAFTS, m->dtmp + (size_t)j * K, (size_t)nd * sizeof *m->dtmp);
    }
  }
  *K_out = K;
  if (!pr->ops->catchup) return n_dec;
  for (int i = 0; i < n_dec; i++)
    if (m->n_d[i] == 0) m->sub[n_rest++] = m->dseq[i];
  if (n_rest) LKS_TRY(pr->ops->catchup(pr, m->sub, n_rest));
  return n_dec;
}

// Forward: one command over the batch: prefill chunks within the token budget, then for every
// decode sequence its decode row or its verify rows [last token, drafts...]. Returns the number
// of sequences in it (0: nothing to run); *any_prefill, *logits say what kind it was.
static int forward(lks_sched *s, int n_dec, lks_engine_out *out, bool *any_prefill, bool *logits) {
  lks__sched_mem *m = &s->m;
  int n = 0, budget = s->o.chunk, di = 0;
  bool any_verify = false;
  *any_prefill = *logits = false;
  for (int i = 0; i < s->n_slots; i++) {
    lks_req *r = s->slot[i];
    if (!r) continue;
    Lockstep__SlotTokens *st = &m->st[n];
    lks__sched_row *rp = &m->rows[n];
    lockstep__slot_tokens__init(st);
    st->slot = (uint32_t)i;
    st->start_pos = (uint32_t)r->n_fed;
    rp->r = r;
    rp->nd = rp->n_out = 0;
    if (r->n_fed < r->p.n_prompt) {
      if (budget <= 0) continue;
      int left = r->p.n_prompt - r->n_fed, take = left < budget ? left : budget;
      budget -= take;
      st->tokens = r->p.prompt + r->n_fed;
      st->n_tokens = (size_t)take;
      st->want_last = take == left;
      rp->emits = st->want_last;
      *any_prefill = true;
    } else {
      // m->dreq lists the decode sequences in slot order, as this loop visits them.
      bool mine = di < n_dec && m->dreq[di] == r;
      int nd = mine ? m->n_d[di] : 0;
      int32_t *row = m->tok + (size_t)i * (LKS_MAX_DRAFTS + 1);
      row[0] = r->last;
      if (nd) memcpy(row + 1, m->drafts + (size_t)di * LKS_MAX_DRAFTS, (size_t)nd * sizeof *row);
      if (mine) di++;
      st->tokens = row;
      st->n_tokens = (size_t)nd + 1;
      st->want_all = nd > 0;
      st->want_last = nd == 0;
      // A plain row keeps its hidden state for the drafter's next catch-up.
      st->defer_mtp = nd == 0 && s->proposer && s->proposer->ops->defers_plain;
      rp->nd = nd;
      rp->emits = true;
      any_verify |= nd > 0;
    }
    // JSON mode and the logit processors change the row before it picks, greedy requests too.
    *logits |= rp->emits && (r->p.sampling.temperature > 0 || r->p.json_object ||
                             lks_logits_needed(&r->p.lp));
    m->seqs[n++] = st;
  }
  if (n == 0) return 0;
  Lockstep__Forward f = LOCKSTEP__FORWARD__INIT;
  f.seqs = m->seqs;
  f.n_seqs = (size_t)n;
  f.output = *logits ? LOCKSTEP__OUTPUT_MODE__OUT_LOGITS : LOCKSTEP__OUTPUT_MODE__OUT_GREEDY;
  f.mtp = s->proposer && s->proposer->ops->needs_hidden;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = any_verify     ? LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY
             : *any_prefill ? LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL
                            : LOCKSTEP__CMD_TYPE__EP_CMD_DECODE;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
  cmd.forward = &f;
  LKS_TRY(lks_world_submit(s->w, &cmd, out));
  s->st.spec.target_forwards++;
  return n;
}

// JSON mode: row with every token the grammar does not allow after state g at -inf (a copy).
// The budget is the tokens the request may still generate, this one included: a token is allowed
// only when what it leaves open can be closed by max_tokens (lks_json_mask), so the output is a
// whole JSON object even when the request ends by its length. A row of the same state always
// gets the same mask, so speculation (which masks each verify row with the state after the
// drafts before it) picks what plain decoding picks.
static const float *grammar_mask(lks_sched *s, const lks_req *r, const lks_json_state *g,
                                 int index, const float *row) {
  // A verify row past max_tokens (drafts are not cut to it) is never emitted: no budget there.
  int budget = r->p.max_tokens - index;
  int n = lks_json_cache_mask(s->json_cache, g, budget > 0 ? budget : -1, s->json_mask);
  const uint64_t *m = s->json_mask;
  if (n == 0) {
    // Only when the vocabulary lacks a closing byte (lks_json_vocab_closable warned): end it.
    const lks_config *c = lks_model_config(s->w->model);
    LKS_LOG(LKS_LOG_WARN, "json mode: no token can continue the document; ending the request");
    memset(s->json_mask, 0, (size_t)lks_json_mask_words(s->json) * sizeof *s->json_mask);
    if (c->n_eos) s->json_mask[c->eos[0] >> 6] |= 1ull << (c->eos[0] & 63);
  }
  for (int t = 0; t < s->vocab; t++) s->json_row[t] = (m[t >> 6] >> (t & 63) & 1) ? row[t] : -INFINITY;
  return s->json_row;
}

// The token of output row o, the request's `index`-th generated token: the arg-max, or a sample
// under the request's settings, of the row after the request's logit processors (logits.h),
// which count the tokens generated before it: the request's, then the verify's drafts
// extra[0, n_extra). A sample draws from a generator seeded by (seed, index) alone, so a
// request's tokens depend neither on its batch nor on speculation. g: the JSON grammar's state
// before this token (JSON mode), else NULL; its mask applies after the processors.
static int pick(lks_sched *s, int th, lks_req *r, const lks_engine_out *out, bool logits, int o,
                int index, const lks_json_state *g, const int32_t *extra, int n_extra,
                int32_t *tok) {
  if (!logits) {
    *tok = out->tokens[o];
    return 0;
  }
  const float *row = out->logits + (size_t)o * s->vocab;
  if (lks_logits_processed(&r->p.lp)) {
    float *mine = s->m.row + (size_t)th * (size_t)s->vocab;
    memcpy(mine, row, (size_t)s->vocab * sizeof *row);
    lks_logits_apply(&r->p.lp, r->hist, r->p.n_prompt, r->hist ? r->n_hist : 0, extra, n_extra,
                     mine, s->vocab, s->m.counts + (size_t)th * (size_t)s->vocab);
    row = mine;
  }
  if (g) row = grammar_mask(s, r, g, index, row);  // JSON mode
  lks_rng rng;
  uint64_t z = r->p.seed + 0x9e3779b97f4a7c15ull * (uint64_t)(index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  lks_rng_seed(&rng, z ^ (z >> 31));
  int t = lks_sample(row, s->vocab, &r->p.sampling, &rng);
  if (t < 0) return t;
  *tok = t;
  return 0;
}

// A verify of nd drafts d at output rows o..o+nd: how many are accepted, and the bonus token
// after them. Each row's token is picked as a plain step would pick it (the arg-max, or a sample
// with the same per-index generator), and drafts are accepted while they equal those tokens.
// For sampling this is the lossless rule for drafts that are the drafter's arg-max (q one-hot
// at d): with a shared uniform u, the inverse-CDF sample equals d with probability p(d) =
// min(1, p(d)/q(d)), and otherwise it is distributed as the residual norm(max(0, p - q)), the
// distribution p without d. So the output equals decoding without speculation, token for token.
// Rows are picked until the first draft that differs from its row's token (nothing after it is
// kept). In JSON mode row j is masked with the grammar after drafts d[0..j-1], the state plain
// decoding would have there; a draft the grammar rejects differs from the (allowed) token of its
// row, so it ends acceptance, and it never touches r->js.
static int verify(lks_sched *s, int th, lks_req *r, const int32_t *d, int nd,
                  const lks_engine_out *out, bool logits, int o, int32_t *bonus) {
  int32_t target[LKS_MAX_DRAFTS + 1];
  lks_json_state g = r->js;
  const lks_json_state *gp = r->p.json_object ? &g : NULL;
  for (int j = 0; j <= nd; j++) {
    LKS_TRY(pick(s, th, r, out, logits, o + j, r->n_generated + j, gp, d, j, &target[j]));
    if (j == nd || target[j] != d[j]) break;
    if (gp && !lks_json_advance(s->json, &g, d[j])) break;  // (the row's token: never refused)
  }
  return lks_spec_accept_greedy(d, nd, target, bonus);
}

// JSON mode: the request's grammar past the tokens this step picked for it.
static void grammar_advance(lks_sched *s, lks_req *r, const int32_t *t, int n) {
  if (!r->p.json_object) return;
  for (int i = 0; i < n; i++)
    if (!lks_json_advance(s->json, &r->js, t[i]))
      LKS_LOG(LKS_LOG_WARN, "json mode: token %d was picked outside the grammar", (int)t[i]);
}

// The picks of emitting row i, whose output rows start at o, with host thread th's scratch:
// into m->pk[i], and its logprob reports into the row. Touches nothing shared but the request's
// JSON grammar cache (JSON mode), so rows without it may be picked on several threads at once.
static void pick_row(lks_sched *s, int th, int i, int o, const lks_engine_out *out, bool logits) {
  lks__sched_row *rp = &s->m.rows[i];
  lks__sched_pick *pk = &s->m.pk[i];
  lks_req *r = rp->r;
  pk->rc = 0;
  if (rp->nd == 0) {
    pk->rc = pick(s, th, r, out, logits, o, r->n_generated, r->p.json_object ? &r->js : NULL,
                  NULL, 0, &pk->tok);
    if (pk->rc == 0 && r->p.lp.logprobs)
      lks_logprobs_row(out->logits + (size_t)o * s->vocab, s->vocab, pk->tok,
                       r->p.lp.top_logprobs, &rp->lp[0]);
    return;
  }
  const int32_t *d = s->m.st[i].tokens + 1;
  pk->bonus = -1;
  int a = verify(s, th, r, d, rp->nd, out, logits, o, &pk->bonus);
  if (a < 0) {
    pk->rc = a;
    return;
  }
  pk->a = a;
  // The reports of the emitted tokens, each from its own verify row (the raw logits).
  for (int j = 0; j <= a && r->p.lp.logprobs; j++)
    lks_logprobs_row(out->logits + (size_t)(o + j) * s->vocab, s->vocab, j < a ? d[j] : pk->bonus,
                     r->p.lp.top_logprobs, &rp->lp[j]);
}

typedef struct {
  lks_sched *s;
  const lks_engine_out *out;
  bool logits;
  const int *row, *orow;  // [tasks] the emitting rows and where their output rows start
} pick_job;

static void pick_task(void *ctx, int task, int thread) {
  pick_job *j = ctx;
  pick_row(j->s, thread, j->row[task], j->orow[task], j->out, j->logits);
}

// Accept: every output row's token(s); verified sequences keep L + a + 1 positions (COMMIT rolls
// the rejected rows back on every rank), and the proposer hears what happened. First the picks
// of every emitting row, spread over the backend's host threads when several rows need their
// logits (sampling, processors, logprobs: about 0.1-1 ms a row at a vocabulary of 151,552) and
// none is in JSON mode; each row's picks depend on its own logits and request alone, so the
// tokens do not depend on the spreading. Then, in row order, what they change.
static int accept(lks_sched *s, int n, const lks_engine_out *out, bool logits) {
  lks__sched_mem *m = &s->m;
  lks_proposer *pr = s->proposer;
  int o = 0, n_commit = 0, n_emit = 0;
  bool json = false;
  for (int i = 0; i < n; i++) {
    lks__sched_row *rp = &m->rows[i];
    if (!rp->emits) continue;
    m->idx[n_emit] = i;
    m->ntmp[n_emit++] = o;
    o += rp->nd == 0 ? 1 : (int)m->st[i].n_tokens;
    json |= rp->r->p.json_object;
  }
  if (logits && n_emit > 1 && m->n_pick > 1 && !json) {
    pick_job pj = {s, out, logits, m->idx, m->ntmp};
    lks_backend_host_run(s->w->be, n_emit, pick_task, &pj);
  } else {
    for (int e = 0; e < n_emit; e++) pick_row(s, 0, m->idx[e], m->ntmp[e], out, logits);
  }
  for (int e = 0; e < n_emit; e++)
    if (m->pk[m->idx[e]].rc < 0)
      return lks_set_error(m->pk[m->idx[e]].rc, "picking the tokens of slot %d failed",
                           m->rows[m->idx[e]].r->slot);
  for (int i = 0; i < n; i++) {
    lks__sched_row *rp = &m->rows[i];
    lks_req *r = rp->r;
    int L = r->n_fed, nrows = (int)m->st[i].n_tokens;
    if (!rp->emits) {  // a prefill chunk that does not end the prompt
      r->n_fed += nrows;
      continue;
    }
    if (rp->nd == 0) {
      int32_t tok = m->pk[i].tok;
      bool first = r->n_generated == 0;
      r->n_fed += nrows;
      r->last = tok;
      if (pr && first) LKS_TRY(pr->ops->prefill(pr, &r->seq, r->p.n_prompt, tok));
      else if (pr) LKS_TRY(pr->ops->after_decode(pr, &r->seq, L, tok));
      rp->out[0] = tok;
      rp->n_out = 1;
      grammar_advance(s, r, rp->out, 1);
      continue;
    }
    const int32_t *d = m->st[i].tokens + 1;
    if (s->o.on_drafts) s->o.on_drafts(s->o.test_ctx, r->slot, r->n_generated, d, rp->nd);
    int32_t bonus = m->pk[i].bonus;
    int a = m->pk[i].a;
    pthread_mutex_lock(&s->mu);
    for (int j = 0; j < rp->nd; j++) {
      s->st.spec.proposed[j]++;
      if (j < a) s->st.spec.accepted[j]++;
    }
    s->st.spec.rounds++;
    pthread_mutex_unlock(&s->mu);
    if (s->calib_k < 0) lks_policy_observe(s->policy, &r->pol, rp->nd, a);
    m->c_slot[n_commit] = (uint32_t)r->slot;
    m->c_keep[n_commit++] = (uint32_t)(L + a + 1);
    LKS_TRY(pr->ops->after_verify(pr, &r->seq, L, d, a, bonus));
    r->n_fed = L + a + 1;
    r->last = bonus;
    memcpy(rp->out, d, (size_t)a * sizeof *d);
    rp->out[a] = bonus;
    rp->n_out = a + 1;
    grammar_advance(s, r, rp->out, rp->n_out);
  }
  return lks_world_commit(s->w, m->c_slot, m->c_keep, n_commit);
}

// Emit: the tokens to their requests, in order, until a request finishes. Returns how many tokens
// the decode and verify rows produced.
static int emit(lks_sched *s, int n, bool *speculated) {
  int produced = 0;
  *speculated = false;
  for (int i = 0; i < n; i++) {
    lks__sched_row *rp = &s->m.rows[i];
    bool decode = rp->emits && rp->r->n_generated > 0;
    *speculated |= rp->nd > 0;
    for (int j = 0; j < rp->n_out; j++) {
      produced += decode;
      if (lks__req_emit(s, rp->r, rp->out[j], rp->r->p.lp.logprobs ? &rp->lp[j] : NULL)) break;
    }
  }
  return produced;
}

// Which ranks are alive: rank 0 is (it is running this), a worker while its connection is up.
static void ranks_up(lks_sched *s) {
  for (int r = 0; r < LKS_RANKS_SHOWN && r < s->w->world; r++)
    s->st.rank_up[r] = !s->w->ctl || lks_ctl_peer_up(s->w->ctl, r);
}

// The gauges of /metrics (under s->mu).
static void gauges(lks_sched *s) {
  slot_gauges(s);
  int tfree, dfree;
  lks_engine_free_blocks(s->w->engine, &tfree, &dfree);
  s->st.kv_blocks_free = tfree;
  s->st.kv_blocks = s->kv_blocks;
  ranks_up(s);
  lks_engine_prefix_stats(s->w->engine, &s->st.prefix);
}

// The step's figures: metrics, the policy's costs and the speculation rates (plain or
// speculative steps without prefill rows, which would blur them). K, R: the deepest draft count
// and the draft rows of the step.
static void account(lks_sched *s, int n_dec, bool prefill, bool speculated, int produced,
                    double dt, double t_propose, double t_pick, int n_seqs, int K, int R,
                    bool caught_up) {
  pthread_mutex_lock(&s->mu);
  lks__sched_hist_add(&s->st.step, dt);
  s->st.t_pick += t_pick;
  s->st.seq_steps += (uint64_t)n_seqs;
  s->st.steps++;
  gauges(s);
  if (!prefill && n_dec > 0) {
    lks_spec_stats *sp = &s->st.spec;
    if (speculated) {
      sp->t_spec += dt;
      sp->t_propose += t_propose;
      sp->spec_steps++;
      sp->tok_spec += (uint64_t)produced;
    } else {
      sp->plain_steps++;
      sp->t_plain += dt;
      sp->tok_plain += (uint64_t)produced;
    }
    for (int i = 0; i < n_dec; i++) sp->k_rows[s->m.n_d[i]]++;
  }
  pthread_mutex_unlock(&s->mu);
  if (!prefill && n_dec > 0 && s->policy && !caught_up)
    lks_policy_record(s->policy, n_dec, K, R, t_propose, dt);
}

int lks_sched_step(lks_sched *s) {
  int n_free, n_alloc, K, R;
  bool caught_up;
  bool levers = admit(s, &n_free, &n_alloc);
  LKS_TRY(announce(s, n_free, n_alloc, levers));
  double t0 = lks_clock();
  int n_dec = propose(s, &K, &R, &caught_up);
  if (n_dec < 0) return n_dec;
  double t_propose = lks_clock() - t0;
  lks_engine_out out;
  bool prefill, logits, speculated;
  int n = forward(s, n_dec, &out, &prefill, &logits);
  if (n < 0) return n;
  if (n == 0) {
    pthread_mutex_lock(&s->mu);
    gauges(s);
    pthread_mutex_unlock(&s->mu);
    return n_free + n_alloc > 0 || levers;
  }
  double t1 = lks_clock();
  LKS_TRY(accept(s, n, &out, logits));
  double t_pick = lks_clock() - t1;
  int produced = emit(s, n, &speculated);
  account(s, n_dec, prefill, speculated, produced, lks_clock() - t0, t_propose, t_pick, n, K, R,
          caught_up);
  return 1;
}

int lks_sched_run(lks_sched *s) {
  for (;;) {
    int rc = lks_sched_step(s);
    // While idle no command reveals a dead worker; the control plane's own check does.
    if (rc == 0 && s->w->ctl) rc = lks_ctl_poll(s->w->ctl);
    if (rc < 0) {
      char why[512];
      snprintf(why, sizeof why, "%s", lks_last_error());
      LKS_LOG(LKS_LOG_ERROR, "scheduler: the world failed: %s", why);
      pthread_mutex_lock(&s->mu);
      s->failed = true;
      ranks_up(s);
      for (int i = 0; i < s->n_slots; i++)
        if (s->slot[i]) lks__req_fail(s->slot[i], why);
      for (lks_req *r = s->q_head; r; r = r->next) lks__req_fail(r, why);
      pthread_mutex_unlock(&s->mu);
      return lks_set_error(rc, "%s", why);
    }
    pthread_mutex_lock(&s->mu);
    bool busy = s->q_head != NULL;
    for (int i = 0; i < s->n_slots && !busy; i++) busy = s->slot[i] != NULL;
    s->was_busy |= busy;
    if (s->stopping && (!s->draining || !busy)) {
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
    if (s->stopping && lks_clock() - s->stop_at > s->o.drain_grace) {
      // The grace period is over: what still runs ends with an error, then the loop ends.
      LKS_LOG(LKS_LOG_WARN, "drain: %.0f s grace over; ending the requests still running", s->o.drain_grace);
      for (int i = 0; i < s->n_slots; i++)
        if (s->slot[i]) lks__req_fail(s->slot[i], "the server shut down before this request finished");
      for (lks_req *r = s->q_head; r; r = r->next) lks__req_fail(r, "the server shut down before this request started");
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
    if (rc == 0 && !busy && !s->levers_pending && !s->clear_pending) {
      if (s->was_busy) {
        // Idle after requests: the memory their threads freed goes back to the system. glibc
        // keeps it in one arena per thread otherwise, so that resident memory ratchets up with
        // each burst of concurrent requests: the fuzz test's server went 45 -> 65 MB in 2 runs
        // of 3 without this, 46 -> 45 MB in 3 of 3 with it (freed memory, then, not a leak).
        s->was_busy = false;
        pthread_mutex_unlock(&s->mu);
#ifdef __GLIBC__
        malloc_trim(0);
#endif
        pthread_mutex_lock(&s->mu);
      }
      struct timespec dl;
      lks__sched_deadline_in(&dl, 0.05);
      pthread_cond_timedwait(&s->cv, &s->mu, &dl);
    }
    pthread_mutex_unlock(&s->mu);
  }
}

void lks_sched_stop(lks_sched *s, bool drain) {
  pthread_mutex_lock(&s->mu);
  if (!s->stopping) s->stop_at = lks_clock();
  s->stopping = true;
  s->draining = drain;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

bool lks_sched_healthy(const lks_sched *s) { return !s->failed; }
bool lks_sched_draining(const lks_sched *s) { return s->stopping; }

int lks_sched_set_levers(lks_sched *s, bool speculation, int n_drafts, const char *ladder) {
  lks__sched_levers l = {0};
  l.speculation = speculation;
  l.n_drafts = n_drafts;
  if (n_drafts < 0 || n_drafts > LKS_MAX_DRAFTS)
    return lks_set_error(LKS_EINVAL, "num_drafts %d: expected 0..%d", n_drafts, LKS_MAX_DRAFTS);
  if (ladder && strlen(ladder) >= sizeof l.ladder)
    return lks_set_error(LKS_EINVAL, "ladder: longer than %zu characters", sizeof l.ladder - 1);
  snprintf(l.ladder, sizeof l.ladder, "%s", ladder ? ladder : "");
  LKS_TRY(lks_ladder_parse(l.ladder, &l.parsed));
  pthread_mutex_lock(&s->mu);
  s->wanted = l;
  s->levers_pending = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

void lks_sched_stats_get(lks_sched *s, lks_sched_stats *out) {
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  // The levers asked for: in force from the next step on.
  out->speculation = s->wanted.speculation;
  out->n_drafts = s->wanted.n_drafts;
  snprintf(out->ladder, sizeof out->ladder, "%s", s->wanted.ladder);
  pthread_mutex_unlock(&s->mu);
}

void lks_sched_clear_cache(lks_sched *s) {
  pthread_mutex_lock(&s->mu);
  s->clear_pending = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int lks_sched_run_one(lks_sched *s, lks_req_params *p) {
  int err;
  lks_req *r = lks_sched_submit(s, p, &err);
  if (!r) return lks_set_error(err, "the scheduler refused the request");
  int rc = 0;
  while (rc >= 0 && !lks_req_finished(r)) rc = lks_sched_step(s);
  // One more step frees its slot on every rank.
  if (rc >= 0) rc = lks_sched_step(s);
  if (rc < 0 && r->slot >= 0 && s->slot[r->slot] == r) {
    // A command refused on rank 0 before it was sent leaves the world consistent: give the slot
    // back so that the caller can go on (after a world failure this fails too, harmlessly).
    char why[512];
    snprintf(why, sizeof why, "%s", lks_last_error());
    uint32_t slot = (uint32_t)r->slot;
    slot_release(s, r->slot);
    lks_world_slots(s->w, LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT, &slot, 1);
    lks_set_error(rc, "%s", why);
  }
  lks_req_release(r);
  return rc < 0 ? rc : 0;
}

// The draft count of calibration step `step`: a warm-up plain step, then CAL_ROUNDS rounds of
// [plain, plain, k_max, 1, 2, ..., k_max]. Every cost is sampled in every round, so that a
// stretch of a shared machine running slow moves them all alike (each cost is a median of its
// samples). The k_max after the plain steps catches the drafter up and is not a step's cost (the
// scheduler does not record it). -1 after the last round.
enum { CAL_ROUNDS = 4 };
static int calibration_k(int step, int k_max) {
  if (step == 0) return 0;
  int per = 3 + k_max, round = (step - 1) / per, at = (step - 1) % per;
  if (round >= CAL_ROUNDS) return -1;
  return at < 2 ? 0 : at == 2 ? k_max : at - 2;
}

int lks_sched_calibrate(lks_sched *s, double *seconds) {
  *seconds = 0;
  int k_max = s->now.n_drafts, vocab = s->vocab;
  bool idle = s->q_head == NULL;
  for (int i = 0; i < s->n_slots && idle; i++) idle = s->slot[i] == NULL;
  if (!s->policy || !s->now.speculation || k_max < 1 || !idle) return 0;
  // One sequence of CAL_PROMPT fixed ids, greedy, long enough for every step (at most K + 1
  // tokens each: a round's two plain steps, its catch-up at k_max and K = 1..k_max), within
  // --max-seq-len.
  enum { CAL_PROMPT = 8 };
  int need = 1 + CAL_ROUNDS * (2 + (k_max + 1) + k_max * (k_max + 3) / 2);
  int room = s->o.max_len - CAL_PROMPT - LKS_MAX_DRAFTS - 2;
  if (room < 8) return 0;
  lks_req_params p = {0};
  if (!(p.prompt = malloc(CAL_PROMPT * sizeof *p.prompt)))
    return lks_set_error(LKS_ENOMEM, "calibration: out of memory");
  for (int j = 0; j < CAL_PROMPT; j++) p.prompt[j] = (int32_t)((j * 7919 + 13) % vocab);
  p.n_prompt = CAL_PROMPT;
  p.max_tokens = need < room ? need : room;
  p.ignore_eos = true;
  p.sampling = (lks_sampling){0, 0, 1};
  pthread_mutex_lock(&s->mu);
  lks_sched_stats saved = s->st;
  pthread_mutex_unlock(&s->mu);
  double t0 = lks_clock();
  int err, rc = 0;
  lks_req *r = lks_sched_submit(s, &p, &err);
  if (!r) {
    LKS_LOG(LKS_LOG_WARN, "speculation: no calibration (the scheduler refused its sequence)");
    return 0;
  }
  // The prefill first (it decodes nothing), then the schedule, as long as the sequence lasts;
  // a KV pool too small for it never admits it, and the steps run out.
  int step = 0, idle_steps = 0;
  while (rc >= 0 && !lks_req_finished(r) && idle_steps < 8) {
    bool decoding = r->n_fed >= CAL_PROMPT;
    if ((s->calib_k = decoding ? calibration_k(step, k_max) : 0) < 0) break;
    rc = lks_sched_step(s);
    step += decoding;
    idle_steps = rc == 0 ? idle_steps + 1 : 0;
  }
  s->calib_k = -1;
  lks_req_cancel(r);
  // One more step frees its slot on every rank; then the prefix cache lets its blocks go.
  if (rc >= 0) rc = lks_sched_step(s);
  if (rc >= 0) rc = clear_cache(s);
  lks_req_release(r);
  pthread_mutex_lock(&s->mu);
  s->st = saved;  // the requests and tokens served start from zero
  gauges(s);
  pthread_mutex_unlock(&s->mu);
  *seconds = lks_clock() - t0;
  if (rc < 0) return rc;
  const lks_policy_costs *c = lks_policy_costs_at(s->policy, 1);
  char rows[256];
  int n = 0;
  for (int K = 1; K <= k_max && n < (int)sizeof rows - 32; K++)
    n += snprintf(rows + n, sizeof rows - (size_t)n, "%s%d: %.2f", K > 1 ? ", " : "", K,
                  c->row[K] * 1e3);
  LKS_LOG(LKS_LOG_INFO,
          "speculation: step costs measured in %.2f s: plain step %.2f ms, draft %.2f ms, verify "
          "row at K = %s ms%s",
          *seconds, c->plain * 1e3, c->draft * 1e3, rows,
          lks_sched_costs_measured(s) ? "" : " (incomplete: the rest is measured while serving)");
  return 0;
}

bool lks_sched_costs_measured(const lks_sched *s) {
  return s->policy && lks_policy_measured(s->policy, 1, s->now.n_drafts);
}
