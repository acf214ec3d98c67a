// SPDX-License-Identifier: MIT
// The request side of the scheduler (see scheduler.h): submitting a request to the queue, reading
// its output, cancelling it, arming a waker on it, and the emission of its tokens by the
// scheduler's thread, which turns token ids into text, ends the request at an end-of-sequence
// token, a stop string or its length limit, and holds back text that could still be the start of
// a stop string (never cutting a UTF-8 character). A request is shared between the thread that
// submitted it and the scheduler's, reference-counted; its output is under its own mutex, and
// the one-shot waker is called off that mutex. The step that drives it lives in scheduler.c.
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/scheduler.h"
#include "coordinator/scheduler_impl.h"
#include "core/clock.h"
#include "core/error.h"
#include "text/toolcall.h"

void lks_req_params_clear(lks_req_params *p) {
  free(p->prompt);
  for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
  free(p->stop);
  free(p->lp.bias_ids);
  free(p->lp.bias);
  memset(p, 0, sizeof *p);
}

void lks__req_unref(lks_req *r) {
  pthread_mutex_lock(&r->mu);
  int left = --r->refs;
  pthread_mutex_unlock(&r->mu);
  if (left) return;
  lks_req_params_clear(&r->p);
  free(r->text);
  free(r->ids);
  free(r->lps);
  free(r->hist);
  lks_detok_free(r->detok);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

void lks_req_release(lks_req *r) {
  if (r) lks__req_unref(r);
}

void lks_req_cancel(lks_req *r) {
  pthread_mutex_lock(&r->mu);
  r->cancelled = true;
  pthread_mutex_unlock(&r->mu);
}

// Whether the armed waker's condition holds (under r->mu).
static bool has_news(const lks_req *r, bool until_done) {
  return r->done || r->failed || (!until_done && r->delivered > r->read_off);
}

bool lks_req_arm(lks_req *r, bool until_done, void (*wake)(void *ctx), void *ctx) {
  pthread_mutex_lock(&r->mu);
  bool armed = !has_news(r, until_done);
  if (armed) {
    r->wake = wake;
    r->wake_ctx = ctx;
    r->wake_until_done = until_done;
  }
  pthread_mutex_unlock(&r->mu);
  return armed;
}

bool lks_req_disarm(lks_req *r) {
  pthread_mutex_lock(&r->mu);
  bool was = r->wake != NULL;
  r->wake = NULL;
  pthread_mutex_unlock(&r->mu);
  return was;
}

// Takes the armed waker when its condition holds (under r->mu); the caller calls it after
// unlocking.
static void (*take_waker(lks_req *r, void **ctx))(void *) {
  void (*w)(void *) = r->wake;
  if (!w || !has_news(r, r->wake_until_done)) return NULL;
  *ctx = r->wake_ctx;
  r->wake = NULL;
  return w;
}

uint64_t lks_req_seed(const lks_req *r) { return r->p.seed; }

bool lks_req_finished(lks_req *r) {
  pthread_mutex_lock(&r->mu);
  bool f = r->done || r->failed;
  pthread_mutex_unlock(&r->mu);
  return f;
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
  r->stop_hit = -1;
  lks_json_init(&r->js, true);
  r->t_submit = lks_clock();
  r->detok = s->tok ? lks_detok_new(s->tok, true) : NULL;
  if (r->detok && r->p.keep_markup) lks_detok_keep(r->detok, lks_glm_markup, lks_glm_n_markup);
  pthread_mutex_lock(&s->mu);
  if (r->p.json_object && !s->json) {
    *err = LKS_EINVAL;
  } else if (s->failed || s->stopping) {
    *err = LKS_EBACKEND;
  } else if (s->q_len >= s->o.max_queue) {
    *err = LKS_EFULL;
  } else {
    if (s->q_tail) s->q_tail->next = r;
    else s->q_head = r;
    s->q_tail = r;
    s->q_len++;
    s->st.queue_depth = s->q_len;  // /metrics: queued from now, not from the next step
    pthread_cond_signal(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  if (*err) {
    r->refs = 1;
    lks__req_unref(r);
    return NULL;
  }
  return r;
}

void lks_req_read(lks_req *r, double timeout_s, lks_req_news *n) {
  memset(n, 0, sizeof *n);
  struct timespec dl;
  lks__sched_deadline_in(&dl, timeout_s);
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
  n->n_cached = r->n_cached;
  n->n_generated = r->n_generated;
  // Done only once everything delivered has been read.
  n->done = r->done && r->read_off == r->delivered;
  n->finish_reason = r->finish;
  n->stop_index = r->stop_hit;
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

// The new token's text, and the stop strings and length limit it may hit (under r->mu).
static void req_text(lks_req *r, int32_t tok) {
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
      r->stop_hit = i;
    }
  }
  if (!r->done && r->n_generated >= r->p.max_tokens) {
    if (r->detok && lks_detok_flush(r->detok, &piece, &n) == 0 && n) req_append(r, piece, n);
    r->done = true;
    r->finish = "length";
  }
}

bool lks__req_emit(lks_sched *s, lks_req *r, int32_t tok, const lks_tok_logprob *lp) {
  const lks_config *c = lks_model_config(s->w->model);
  double t = lks_clock();
  pthread_mutex_lock(&s->mu);
  if (r->n_generated == 0)
    lks__sched_hist_add(&s->st.ttft, t - r->t_submit);
  else
    lks__sched_hist_add(&s->st.itl, t - r->t_last);
  s->st.generated_tokens++;
  s->st.spec.emitted++;
  pthread_mutex_unlock(&s->mu);
  r->t_last = t;
  if (r->hist && r->n_hist < r->cap_hist) r->hist[r->n_hist++] = tok;
  pthread_mutex_lock(&r->mu);
  int32_t *ids = realloc(r->ids, (size_t)(r->n_generated + 1) * sizeof *ids);
  if (ids) {
    r->ids = ids;
    ids[r->n_generated] = tok;
  }
  if (r->p.lp.logprobs && r->n_lps == r->n_generated) {  // else one was lost: report no more
    if (r->n_lps == r->cap_lps) {
      int cap = r->cap_lps ? 2 * r->cap_lps : 16;
      lks_tok_logprob *l = realloc(r->lps, (size_t)cap * sizeof *l);
      if (l) {
        r->lps = l;
        r->cap_lps = cap;
      }
    }
    if (r->n_lps < r->cap_lps) {
      if (lp) r->lps[r->n_lps] = *lp;
      else memset(&r->lps[r->n_lps], 0, sizeof *r->lps);
      r->n_lps++;
    }
  }
  r->n_generated++;
  bool eos = false;
  for (int i = 0; i < c->n_eos; i++) eos |= tok == c->eos[i];
  eos = eos && !r->p.ignore_eos;
  if (eos) {
    r->done = true;
    r->finish = "stop";
  } else {
    req_text(r, tok);
  }
  // Text that could still be the start of a stop string is held back until it cannot.
  size_t safe = r->done || r->max_stop == 0 ? r->len
                : r->len > (size_t)r->max_stop - 1 ? r->len - (size_t)(r->max_stop - 1) : 0;
  // ... and never cut inside a UTF-8 character: a piece must stand on its own as text.
  while (safe < r->len && safe > r->delivered && ((unsigned char)r->text[safe] & 0xC0) == 0x80)
    safe--;
  if (safe > r->delivered) r->delivered = safe;
  bool done = r->done || r->cancelled;
  pthread_cond_broadcast(&r->cv);
  void *wctx = NULL;
  void (*wake)(void *) = take_waker(r, &wctx);
  pthread_mutex_unlock(&r->mu);
  if (wake) wake(wctx);
  if (r->p.on_token) r->p.on_token(r->p.on_token_ctx, tok, eos);
  return done;
}

void lks__req_fail(lks_req *r, const char *why) {
  pthread_mutex_lock(&r->mu);
  r->failed = true;
  size_t n = strlen(why) < sizeof r->error - 1 ? strlen(why) : sizeof r->error - 1;
  memcpy(r->error, why, n);
  r->error[n] = '\0';
  pthread_cond_broadcast(&r->cv);
  void *wctx = NULL;
  void (*wake)(void *) = take_waker(r, &wctx);
  pthread_mutex_unlock(&r->mu);
  if (wake) wake(wctx);
}

int lks_req_tokens(lks_req *r, int32_t **ids) {
  pthread_mutex_lock(&r->mu);
  int n = r->ids ? r->n_generated : 0;
  *ids = malloc((size_t)(n ? n : 1) * sizeof **ids);
  if (*ids && n) memcpy(*ids, r->ids, (size_t)n * sizeof **ids);
  pthread_mutex_unlock(&r->mu);
  return *ids ? n : 0;
}

int lks_req_logprobs(lks_req *r, int from, int to, lks_tok_logprob **out) {
  *out = NULL;
  pthread_mutex_lock(&r->mu);
  int have = r->ids ? r->n_lps : 0;
  if (to > have) to = have;
  int n = to > from ? to - from : 0;
  if (n) {
    *out = malloc((size_t)n * sizeof **out);
    if (*out) memcpy(*out, r->lps + from, (size_t)n * sizeof **out);
    else n = 0;
  }
  pthread_mutex_unlock(&r->mu);
  return n;
}
