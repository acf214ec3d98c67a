// SPDX-License-Identifier: MIT
// Continuous batching (see scheduler.h).
#include "coordinator/scheduler.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "spec/spec.h"

static void deadline_in(struct timespec *ts, double s) {
  clock_gettime(CLOCK_REALTIME, ts);
  double t = (double)ts->tv_sec + ts->tv_nsec * 1e-9 + s;
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

struct lks_req {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  lks_req_params p;
  int max_stop;  // longest stop string
  // Output, under mu.
  char *text;
  size_t len, cap, delivered, read_off;
  int n_generated;
  int32_t *ids;  // the generated token ids, [n_generated]
  bool done, failed, cancelled;
  const char *finish;
  char error[512];
  // Scheduler thread only.
  int slot, n_fed;
  int32_t last;
  int32_t *hist;  // prompt + generated, for the proposer
  int n_hist;
  lks_spec_seq seq;  // the proposer's view of this sequence
  lks_rng rng;
  lks_detok *detok;
  double t_submit, t_last;
  lks_req *next;
};

struct lks_sched {
  lks_world *w;
  const lks_tokenizer *tok;
  lks_sched_opts o;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  lks_req *q_head, *q_tail;
  int q_len;
  lks_req **slot;  // [n_slots]
  int n_slots;
  bool stopping, draining, failed;
  double stop_at;  // when the drain began
  bool levers_pending, speculation;
  int n_drafts;
  char ladder[64];
  lks_sched_stats st;
  float *logits;  // scratch
  lks_proposer *proposer;  // --spec: NULL when off
  lks_ladder ladder_parsed;
  float *p_rows, *q;       // rejection sampling scratch
};

static void hist_init(lks_hist *h, const double *le) {
  memset(h, 0, sizeof *h);
  memcpy(h->le, le, sizeof h->le);
}
static void hist_add(lks_hist *h, double v) {
  int i = 0;
  while (i < LKS_HIST_BUCKETS && v > h->le[i]) i++;
  h->count[i]++;
  h->sum += v;
  h->n++;
}

lks_sched *lks_sched_new(lks_world *w, const lks_tokenizer *tok, const lks_sched_opts *o) {
  lks_sched *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->w = w;
  s->tok = tok;
  s->o = *o;
  s->n_slots = (int)lks_settings_int(w->settings, "max-slots");
  s->slot = calloc((size_t)s->n_slots, sizeof *s->slot);
  s->logits = malloc((size_t)s->n_slots * (size_t)lks_model_config(w->model)->vocab * sizeof(float));
  if (!s->slot || !s->logits) {
    lks_sched_free(s);
    return NULL;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  static const double lat[LKS_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                               0.1,   0.25,   0.5,   1,    2.5,   10};
  hist_init(&s->st.ttft, lat);
  hist_init(&s->st.itl, lat);
  hist_init(&s->st.step, lat);
  s->st.slots = s->n_slots;
  s->n_drafts = (int)lks_settings_int(w->settings, "num-drafts");
  const char *spec = lks_settings_str(w->settings, "spec");
  snprintf(s->ladder, sizeof s->ladder, "%s", lks_settings_str(w->settings, "ladder"));
  if (lks_ladder_parse(s->ladder, &s->ladder_parsed) < 0) goto fail;
  if (strcmp(spec, "off") != 0) {
    s->proposer = lks_proposer_new(spec, w);
    if (!s->proposer) goto fail;
    s->speculation = true;
  }
  int V = lks_model_config(w->model)->vocab;
  s->p_rows = malloc((size_t)(LKS_MAX_DRAFTS + 1) * V * sizeof(float));
  s->q = calloc((size_t)V, sizeof(float));
  if (!s->p_rows || !s->q) goto fail;
  return s;
fail:
  lks_sched_free(s);
  return NULL;
}

void lks_sched_free(lks_sched *s) {
  if (!s) return;
  lks_proposer_free(s->proposer);
  free(s->p_rows);
  free(s->q);
  free(s->slot);
  free(s->logits);
  free(s);
}

// ---- requests ----

static void req_unref(lks_req *r) {
  pthread_mutex_lock(&r->mu);
  int left = --r->refs;
  pthread_mutex_unlock(&r->mu);
  if (left) return;
  free(r->p.prompt);
  for (int i = 0; i < r->p.n_stop; i++) free(r->p.stop[i]);
  free(r->p.stop);
  free(r->text);
  free(r->ids);
  free(r->hist);
  lks_detok_free(r->detok);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

void lks_req_release(lks_req *r) {
  if (r) req_unref(r);
}

void lks_req_cancel(lks_req *r) {
  pthread_mutex_lock(&r->mu);
  r->cancelled = true;
  pthread_mutex_unlock(&r->mu);
}

lks_req *lks_sched_submit(lks_sched *s, lks_req_params *p, int *err) {
  *err = 0;
  lks_req *r = calloc(1, sizeof *r);
  if (!r) {
    *err = LKS_ENOMEM;
    return NULL;
  }
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->refs = 2;  // the caller's and the scheduler's
  r->p = *p;
  memset(p, 0, sizeof *p);
  for (int i = 0; i < r->p.n_stop; i++) {
    int l = (int)strlen(r->p.stop[i]);
    if (l > r->max_stop) r->max_stop = l;
  }
  r->slot = -1;
  r->t_submit = lks_clock();
  lks_rng_seed(&r->rng, r->p.seed);
  r->detok = s->tok ? lks_detok_new(s->tok, true) : NULL;
  pthread_mutex_lock(&s->mu);
  if (s->failed || s->stopping) {
    *err = LKS_EBACKEND;
  } else if (s->q_len >= s->o.max_queue) {
    *err = LKS_EFULL;
  } else {
    if (s->q_tail) s->q_tail->next = r;
    else s->q_head = r;
    s->q_tail = r;
    s->q_len++;
    pthread_cond_signal(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  if (*err) {
    r->refs = 1;
    req_unref(r);
    return NULL;
  }
  return r;
}

void lks_req_read(lks_req *r, double timeout_s, lks_req_news *n) {
  memset(n, 0, sizeof *n);
  struct timespec dl;
  deadline_in(&dl, timeout_s);
  pthread_mutex_lock(&r->mu);
  while (r->read_off == r->delivered && !r->done && !r->failed) {
    if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) == ETIMEDOUT) break;
  }
  if (r->delivered > r->read_off) {
    n->len = r->delivered - r->read_off;
    n->text = malloc(n->len + 1);
    if (n->text) {
      memcpy(n->text, r->text + r->read_off, n->len);
      n->text[n->len] = '\0';
      r->read_off = r->delivered;
    } else {
      n->len = 0;
    }
  }
  n->n_prompt = r->p.n_prompt;
  n->n_generated = r->n_generated;
  // Done only once everything delivered has been read.
  n->done = r->done && r->read_off == r->delivered;
  n->finish_reason = r->finish;
  n->failed = r->failed;
  snprintf(n->error, sizeof n->error, "%s", r->error);
  pthread_mutex_unlock(&r->mu);
}

static void req_append(lks_req *r, const char *t, size_t n) {
  if (r->len + n + 1 > r->cap) {
    size_t cap = (r->len + n + 1) * 2;
    char *b = realloc(r->text, cap);
    if (!b) return;
    r->text = b;
    r->cap = cap;
  }
  memcpy(r->text + r->len, t, n);
  r->len += n;
  r->text[r->len] = '\0';
}

// A generated token for a request (scheduler thread). Returns true when the request finished.
static bool req_emit(lks_sched *s, lks_req *r, int32_t tok) {
  const lks_config *c = lks_model_config(s->w->model);
  double t = lks_clock();
  pthread_mutex_lock(&s->mu);
  if (r->n_generated == 0)
    hist_add(&s->st.ttft, t - r->t_submit);
  else
    hist_add(&s->st.itl, t - r->t_last);
  s->st.generated_tokens++;
  pthread_mutex_unlock(&s->mu);
  r->t_last = t;
  pthread_mutex_lock(&r->mu);
  int32_t *ids = realloc(r->ids, (size_t)(r->n_generated + 1) * sizeof *ids);
  if (ids) {
    r->ids = ids;
    ids[r->n_generated] = tok;
  }
  r->n_generated++;
  bool eos = false;
  for (int i = 0; i < c->n_eos; i++) eos |= tok == c->eos[i];
  if (eos && !r->p.ignore_eos) {
    r->done = true;
    r->finish = "stop";
  } else {
    const char *piece = NULL;
    size_t n = 0;
    size_t before = r->len;
    if (r->detok && lks_detok_push(r->detok, tok, &piece, &n) == 0 && n) req_append(r, piece, n);
    // Stop strings: search the new text and the tail before it that a stop could straddle.
    for (int i = 0; i < r->p.n_stop && !r->done; i++) {
      size_t from = before > (size_t)r->max_stop ? before - (size_t)r->max_stop : 0;
      char *hit = r->len ? strstr(r->text + from, r->p.stop[i]) : NULL;
      if (hit) {
        r->len = (size_t)(hit - r->text);
        r->text[r->len] = '\0';
        r->done = true;
        r->finish = "stop";
      }
    }
    if (!r->done && r->n_generated >= r->p.max_tokens) {
      if (r->detok && lks_detok_flush(r->detok, &piece, &n) == 0 && n) req_append(r, piece, n);
      r->done = true;
      r->finish = "length";
    }
  }
  // Text that could still be the start of a stop string is held back until it cannot.
  size_t safe = r->done || r->max_stop == 0 ? r->len
                : r->len > (size_t)r->max_stop - 1 ? r->len - (size_t)(r->max_stop - 1) : 0;
  if (safe > r->delivered) r->delivered = safe;
  bool done = r->done || r->cancelled;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return done;
}

static void req_fail(lks_req *r, const char *why) {
  pthread_mutex_lock(&r->mu);
  r->failed = true;
  size_t n = strlen(why) < sizeof r->error - 1 ? strlen(why) : sizeof r->error - 1;
  memcpy(r->error, why, n);
  r->error[n] = '\0';
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

// ---- commands ----

// One step: free finished slots, admit queued requests, run one forward of prefill chunks and
// decode rows, hand out the tokens. Returns 1 when it did work, 0 when idle, or an error.
static int step(lks_sched *s) {
  uint32_t to_free[4096], to_alloc[4096];
  int n_free = 0, n_alloc = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_slots; i++) {
    lks_req *r = s->slot[i];
    if (!r) continue;
    pthread_mutex_lock(&r->mu);
    bool over = r->done || r->cancelled;
    if (r->cancelled && !r->done) s->st.requests_cancelled++;
    pthread_mutex_unlock(&r->mu);
    if (over) {
      to_free[n_free++] = (uint32_t)i;
      s->slot[i] = NULL;
      s->st.requests_done++;
      if (r->seq.state) s->proposer->ops->free_state(s->proposer, r->seq.state);
      r->seq.state = NULL;
      req_unref(r);
    }
  }
  for (int i = 0; i < s->n_slots && s->q_head; i++) {
    if (s->slot[i]) continue;
    lks_req *r = s->q_head;
    s->q_head = r->next;
    if (!s->q_head) s->q_tail = NULL;
    s->q_len--;
    r->next = NULL;
    pthread_mutex_lock(&r->mu);
    bool gone = r->cancelled;
    pthread_mutex_unlock(&r->mu);
    if (gone) {  // its client left while it waited
      s->st.requests_cancelled++;
      req_unref(r);
      i--;
      continue;
    }
    r->slot = i;
    s->slot[i] = r;
    r->hist = malloc((size_t)(r->p.n_prompt + r->p.max_tokens + LKS_MAX_DRAFTS + 2) * sizeof *r->hist);
    if (r->hist) memcpy(r->hist, r->p.prompt, (size_t)r->p.n_prompt * sizeof *r->hist);
    r->n_hist = r->p.n_prompt;
    r->seq = (lks_spec_seq){i, r->hist, r->n_hist, NULL};
    if (s->proposer) r->seq.state = s->proposer->ops->alloc_state(s->proposer, i);
    s->st.prompt_tokens += (uint64_t)r->p.n_prompt;
    to_alloc[n_alloc++] = (uint32_t)i;
  }
  bool levers = s->levers_pending;
  s->levers_pending = false;
  Lockstep__Levers lv = LOCKSTEP__LEVERS__INIT;
  lv.speculation = s->speculation;
  lv.n_drafts = (uint32_t)s->n_drafts;
  lv.ladder = s->ladder;
  pthread_mutex_unlock(&s->mu);

  LKS_TRY(lks_world_slots(s->w, LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT, to_free, n_free));
  LKS_TRY(lks_world_slots(s->w, LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT, to_alloc, n_alloc));
  if (levers) {
    Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
    cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS;
    cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_LEVERS;
    cmd.levers = &lv;
    LKS_TRY(lks_world_submit(s->w, &cmd, NULL));
  }

  // Speculation for this step: drafts for every sequence past its prefill, at the ladder's
  // count for the batch width (0: plain decode rows, after the drafter's catch-up).
  lks_proposer *pr = s->proposer;
  bool hidden = pr && pr->ops->needs_hidden;
  lks_spec_seq *dseq[4096];
  lks_req *dreq[4096];
  int n_dec = 0;
  for (int i = 0; i < s->n_slots; i++) {
    lks_req *r = s->slot[i];
    if (r && r->n_fed >= r->p.n_prompt && r->n_generated > 0) {
      r->seq.history = r->hist;
      r->seq.n_history = r->n_hist;
      dseq[n_dec] = &r->seq;
      dreq[n_dec++] = r;
    }
  }
  pthread_mutex_lock(&s->mu);
  int k = pr && s->speculation && n_dec ? lks_ladder_k(&s->ladder_parsed, n_dec, s->n_drafts) : 0;
  pthread_mutex_unlock(&s->mu);
  static int32_t drafts[4096 * LKS_MAX_DRAFTS];
  int n_d[4096] = {0};
  if (k > 0) {
    LKS_TRY(pr->ops->propose_batch(pr, dseq, n_dec, k, drafts, n_d));
  } else if (pr && pr->ops->catchup && n_dec) {
    LKS_TRY(pr->ops->catchup(pr, dseq, n_dec));
  }

  // The forward: prefill chunks within the budget; per running sequence one decode row, or the
  // verify rows [last token, drafts...].
  Lockstep__SlotTokens st[4096], *seqs[4096];
  lks_req *owner[4096];
  int32_t rows[4096][LKS_MAX_DRAFTS + 1];
  int n_seqs = 0, budget = s->o.chunk, di = 0;
  bool any_prefill = false, any_verify = false, logits = false;
  for (int i = 0; i < s->n_slots; i++) {
    lks_req *r = s->slot[i];
    if (!r) continue;
    lockstep__slot_tokens__init(&st[n_seqs]);
    st[n_seqs].slot = (uint32_t)i;
    st[n_seqs].start_pos = (uint32_t)r->n_fed;
    if (r->n_fed < r->p.n_prompt) {
      if (budget <= 0) continue;
      int left = r->p.n_prompt - r->n_fed, take = left < budget ? left : budget;
      budget -= take;
      st[n_seqs].tokens = r->p.prompt + r->n_fed;
      st[n_seqs].n_tokens = (size_t)take;
      st[n_seqs].want_last = take == left;
      any_prefill = true;
    } else {
      // dreq lists the decode sequences in slot order, as this loop visits them.
      bool mine = di < n_dec && dreq[di] == r;
      int nd = mine ? n_d[di] : 0;
      rows[i][0] = r->last;
      if (nd) memcpy(rows[i] + 1, drafts + (size_t)di * k, (size_t)nd * sizeof(int32_t));
      if (mine) di++;
      st[n_seqs].tokens = rows[i];
      st[n_seqs].n_tokens = (size_t)nd + 1;
      st[n_seqs].want_all = nd > 0;
      st[n_seqs].want_last = nd == 0;
      any_verify |= nd > 0;
    }
    logits |= (st[n_seqs].want_last || st[n_seqs].want_all) && r->p.sampling.temperature > 0;
    owner[n_seqs] = r;
    seqs[n_seqs] = &st[n_seqs];
    n_seqs++;
  }
  pthread_mutex_lock(&s->mu);
  s->st.queue_depth = s->q_len;
  int used = 0;
  for (int i = 0; i < s->n_slots; i++) used += s->slot[i] != NULL;
  s->st.slots_in_use = used;
  int tfree, dfree;
  lks_engine_free_blocks(s->w->engine, &tfree, &dfree);
  s->st.kv_blocks_free = tfree;
  pthread_mutex_unlock(&s->mu);
  if (n_seqs == 0) return n_free + n_alloc > 0;
  Lockstep__Forward f = LOCKSTEP__FORWARD__INIT;
  f.seqs = seqs;
  f.n_seqs = (size_t)n_seqs;
  f.output = logits ? LOCKSTEP__OUTPUT_MODE__OUT_LOGITS : LOCKSTEP__OUTPUT_MODE__OUT_GREEDY;
  f.mtp = hidden;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = any_verify    ? LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY
             : any_prefill ? LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL
                           : LOCKSTEP__CMD_TYPE__EP_CMD_DECODE;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
  cmd.forward = &f;
  lks_engine_out out;
  double t0 = lks_clock();
  LKS_TRY(lks_world_submit(s->w, &cmd, &out));
  int V = lks_model_config(s->w->model)->vocab, o = 0;
  uint32_t c_slot[4096], c_keep[4096];
  int n_commit = 0;
  for (int i = 0; i < n_seqs; i++) {
    lks_req *r = owner[i];
    int L = r->n_fed, nrows = (int)st[i].n_tokens;
    if (!st[i].want_last && !st[i].want_all) {  // a prefill chunk that does not end the prompt
      r->n_fed += nrows;
      continue;
    }
    if (!st[i].want_all) {
      int32_t tok;
      if (!logits) {
        tok = out.tokens[o];
      } else {
        int t = lks_sample(out.logits + (size_t)o * V, V, &r->p.sampling, &r->rng);
        if (t < 0) return t;
        tok = t;
      }
      o++;
      bool first = r->n_generated == 0;
      r->n_fed += nrows;
      r->last = tok;
      if (r->hist) r->hist[r->n_hist++] = tok;
      if (pr && first) LKS_TRY(pr->ops->prefill(pr, &r->seq, r->p.n_prompt, tok));
      else if (pr) LKS_TRY(pr->ops->after_decode(pr, &r->seq, L, tok));
      req_emit(s, r, tok);
      continue;
    }
    // A verify of nd drafts: accept, commit L + a + 1 positions, emit d1..da and the bonus.
    int nd = nrows - 1, a = 0;
    const int32_t *d = st[i].tokens + 1;
    int32_t bonus = -1;
    if (!logits) {
      a = lks_spec_accept_greedy(d, nd, out.tokens + o, &bonus);
    } else {
      for (int j = 0; j <= nd; j++)
        LKS_TRY(lks_sampling_probs(out.logits + (size_t)(o + j) * V, V, &r->p.sampling, s->p_rows + (size_t)j * V));
      for (; a < nd; a++) {
        s->q[d[a]] = 1.0f;  // drafts are the drafter's arg-max: q is one-hot
        int32_t t;
        int acc = lks_spec_accept_sample(s->p_rows + (size_t)a * V, s->q, V, d[a], &r->rng, &t);
        s->q[d[a]] = 0.0f;
        if (acc < 0) return acc;
        if (!acc) {
          bonus = t;
          break;
        }
      }
      if (bonus < 0) {
        int t = lks_sample(out.logits + (size_t)(o + nd) * V, V, &r->p.sampling, &r->rng);
        if (t < 0) return t;
        bonus = t;
      }
    }
    o += nrows;
    pthread_mutex_lock(&s->mu);
    for (int j = 0; j < nd && j < LKS_MAX_DRAFTS; j++) {
      s->st.proposed[j]++;
      if (j < a) s->st.accepted[j]++;
    }
    s->st.verify_rounds++;
    pthread_mutex_unlock(&s->mu);
    c_slot[n_commit] = (uint32_t)r->slot;
    c_keep[n_commit++] = (uint32_t)(L + a + 1);
    LKS_TRY(pr->ops->after_verify(pr, &r->seq, L, d, a, bonus));
    r->n_fed = L + a + 1;
    r->last = bonus;
    bool fin = false;
    for (int j = 0; j < a && !fin; j++) {
      if (r->hist) r->hist[r->n_hist++] = d[j];
      fin = req_emit(s, r, d[j]);
    }
    if (!fin) {
      if (r->hist) r->hist[r->n_hist++] = bonus;
      req_emit(s, r, bonus);
    }
  }
  LKS_TRY(lks_world_commit(s->w, c_slot, c_keep, n_commit));
  pthread_mutex_lock(&s->mu);
  hist_add(&s->st.step, lks_clock() - t0);
  s->st.steps++;
  pthread_mutex_unlock(&s->mu);
  return 1;
}

int lks_sched_run(lks_sched *s) {
  for (;;) {
    int rc = step(s);
    // While idle no command reveals a dead worker; the control plane's own check does.
    if (rc == 0 && s->w->ctl) rc = lks_ctl_poll(s->w->ctl);
    if (rc < 0) {
      char why[512];
      snprintf(why, sizeof why, "%s", lks_last_error());
      LKS_LOG(LKS_LOG_ERROR, "scheduler: the world failed: %s", why);
      pthread_mutex_lock(&s->mu);
      s->failed = true;
      for (int i = 0; i < s->n_slots; i++)
        if (s->slot[i]) req_fail(s->slot[i], why);
      for (lks_req *r = s->q_head; r; r = r->next) req_fail(r, why);
      pthread_mutex_unlock(&s->mu);
      return lks_set_error(rc, "%s", why);
    }
    pthread_mutex_lock(&s->mu);
    bool busy = s->q_head != NULL;
    for (int i = 0; i < s->n_slots && !busy; i++) busy = s->slot[i] != NULL;
    if (s->stopping && (!s->draining || !busy)) {
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
    if (s->stopping && lks_clock() - s->stop_at > s->o.drain_grace) {
      // The grace period is over: what still runs ends with an error, then the loop ends.
      LKS_LOG(LKS_LOG_WARN, "drain: %.0f s grace over; ending the requests still running", s->o.drain_grace);
      for (int i = 0; i < s->n_slots; i++)
        if (s->slot[i]) req_fail(s->slot[i], "the server shut down before this request finished");
      for (lks_req *r = s->q_head; r; r = r->next) req_fail(r, "the server shut down before this request started");
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
    if (rc == 0 && !busy && !s->levers_pending) {
      struct timespec dl;
      deadline_in(&dl, 0.05);
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

void lks_sched_set_levers(lks_sched *s, bool speculation, int n_drafts, const char *ladder) {
  pthread_mutex_lock(&s->mu);
  s->speculation = speculation;
  s->n_drafts = n_drafts;
  snprintf(s->ladder, sizeof s->ladder, "%s", ladder ? ladder : "");
  s->levers_pending = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

void lks_sched_stats_get(lks_sched *s, lks_sched_stats *out) {
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  out->speculation = s->speculation;
  out->n_drafts = s->n_drafts;
  snprintf(out->ladder, sizeof out->ladder, "%s", s->ladder);
  pthread_mutex_unlock(&s->mu);
}

int lks_req_tokens(lks_req *r, int32_t **ids) {
  pthread_mutex_lock(&r->mu);
  int n = r->ids ? r->n_generated : 0;
  *ids = malloc((size_t)(n ? n : 1) * sizeof **ids);
  if (*ids && n) memcpy(*ids, r->ids, (size_t)n * sizeof **ids);
  pthread_mutex_unlock(&r->mu);
  return *ids ? n : 0;
}
