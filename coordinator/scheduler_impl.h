// SPDX-License-Identifier: MIT
// The inside of the scheduler, shared by its two halves: scheduler.c (the step and its phases,
// which own struct lks_sched and its working memory) and request.c (the request side: submit,
// read, cancel, arm, and the emission of tokens with the stop-string hold-back, which own
// struct lks_req). Not for use outside coordinator/scheduler.c and coordinator/request.c.
//
// Locking: a request's output fields are under its own mu, the queue, the levers and the
// statistics under the scheduler's mu; fields marked "scheduler thread only" are touched by the
// thread that steps the scheduler and by nobody else. A thread that holds s->mu may take a
// request's mu, never the other way round.
#ifndef LKS_COORDINATOR_SCHEDULER_IMPL_H
#define LKS_COORDINATOR_SCHEDULER_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "coordinator/scheduler.h"
#include "proto/lockstep.pb-c.h"
#include "spec/spec.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"

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
  lks_tok_logprob *lps;  // their reports, [n_lps] (n_generated unless out of memory) when p.lp.logprobs
  int n_lps, cap_lps;
  bool done, failed, cancelled;
  const char *finish;
  int stop_hit;  // the stop string that ended it, or -1
  char error[512];
  // A one-shot waker (lks_req_arm): called once, off r->mu, when news arrives.
  void (*wake)(void *ctx);
  void *wake_ctx;
  bool wake_until_done;
  // Scheduler thread only.
  int slot, n_fed, n_cached;
  int reserve;  // KV blocks held for it while it runs (the most it can need)
  int32_t last;
  int32_t *hist;  // prompt + generated, for the proposer
  int n_hist, cap_hist;
  lks_spec_seq seq;  // the proposer's view of this sequence
  lks_policy_seq pol;  // its running acceptance, for the policy
  lks_json_state js;  // JSON mode: the grammar after the tokens emitted so far
  lks_detok *detok;
  double t_submit, t_last;
  lks_req *next;
};

// The levers one step runs under: fixed at the step's start, sent to every rank with that step.
typedef struct lks__sched_levers {
  bool speculation;
  int n_drafts;
  char ladder[LKS_LADDER_TEXT];
  lks_ladder parsed;
} lks__sched_levers;

// What accept's first phase picks for one emitting row (possibly on another host thread): a
// decode row's token, or a verify's accepted drafts and bonus token; the logprob reports go to
// the row itself (lks__sched_row.lp).
typedef struct lks__sched_pick {
  int32_t tok;    // nd == 0
  int a;          // nd > 0: drafts accepted
  int32_t bonus;  // nd > 0
  int rc;         // 0, or the error that stopped the pick
} lks__sched_pick;

// One sequence's part of a step's forward (scheduler thread).
typedef struct lks__sched_row {
  lks_req *r;
  int nd;      // drafts verified after the last token (0: a decode row or a prefill chunk)
  bool emits;  // the row's output is a token (the last prefill chunk, a decode or verify row)
  // Filled by accept: the tokens to emit (accepted drafts, then the bonus).
  int32_t out[LKS_MAX_DRAFTS + 1];
  int n_out;
  lks_tok_logprob lp[LKS_MAX_DRAFTS + 1];  // their reports, when the request asked for logprobs
} lks__sched_row;

// Working memory of one step, sized from --max-slots.
typedef struct lks__sched_mem {
  uint32_t *to_free, *to_alloc;   // [n_slots]
  lks_spec_seq **dseq;            // [n_slots] sequences past their prefill
  lks_req **dreq;                 // [n_slots]
  int32_t *drafts;                // [n_slots * LKS_MAX_DRAFTS]
  int *n_d;                       // [n_slots] drafts per decode sequence
  int *kcap, *kscratch;           // [n_slots] the most each may draft; the policy's scratch
  lks_policy_seq **pseq;          // [n_slots] the decode sequences' acceptance
  Lockstep__SlotTokens *st;       // [n_slots] the forward's sequences
  Lockstep__SlotTokens **seqs;    // [n_slots]
  lks__sched_row *rows;           // [n_slots]
  int32_t *tok;                   // [n_slots * (LKS_MAX_DRAFTS + 1)] decode and verify rows
  uint32_t *c_slot, *c_keep;      // [n_slots] the commit
  lks_spec_seq **sub;             // [n_slots] the sequences of one propose or catch-up
  int *idx, *ntmp;                // [n_slots]
  int32_t *dtmp;                  // [n_slots * LKS_MAX_DRAFTS] one propose's drafts
  // Per host thread of the picks (n_pick of them): a row's logits after the request's
  // processors, and the processors' token counts (zeros between uses).
  int n_pick;
  float *row;                     // [n_pick * vocab]
  int32_t *counts;                // [n_pick * vocab]
  lks__sched_pick *pk;            // [n_slots] each row's picks, before accept's bookkeeping
} lks__sched_mem;

struct lks_sched {
  lks_world *w;
  const lks_tokenizer *tok;
  lks_sched_opts o;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  lks_req *q_head, *q_tail;
  int q_len;
  lks_req **slot;  // [n_slots]
  int n_slots, vocab;
  int kv_blocks, kv_reserved;  // the pool, and what the running requests may need of it
  bool stopping, draining, failed;
  bool was_busy;  // requests ran since the loop was last idle (then it gives free memory back)
  double stop_at;  // when the drain began
  // Levers: `wanted` is what /admin asked for (under mu), `now` what the last step ran under
  // (scheduler thread only; what stats report, under mu).
  lks__sched_levers wanted, now;
  bool levers_pending;
  bool clear_pending;  // /admin: drop the prefix cache at the next step (under mu)
  bool clear_now;      // ... this step (scheduler thread)
  lks_sched_stats st;
  lks_proposer *proposer;  // NULL when speculation is off
  lks_policy *policy;      // the adaptive K (--spec-gate); NULL: the ladder's K for everyone
  // lks_sched_calibrate (scheduler thread): the K every decoding sequence drafts this step, its
  // acceptance left out of the policy's; -1 outside the calibration.
  int calib_k;
  // JSON mode (scheduler thread): the token trie (NULL without a tokenizer), one row's mask and
  // the masked copy of a logits row.
  lks_json_vocab *json;
  lks_json_cache *json_cache;  // masks by state (most tokens of a string share one)
  uint64_t *json_mask;  // [lks_json_mask_words]
  float *json_row;      // [vocab]
  lks__sched_mem m;
};

// ---- scheduler.c ----

// *ts = now + s seconds, on CLOCK_REALTIME (for pthread_cond_timedwait).
void lks__sched_deadline_in(struct timespec *ts, double s);
// One observation into a histogram (under s->mu).
void lks__sched_hist_add(lks_hist *h, double v);

// ---- request.c ----

// Drops one reference; the last one frees the request.
void lks__req_unref(lks_req *r);
// A generated token for a request (scheduler thread), with its report when the request asked for
// logprobs (else lp may be NULL). Returns true when the request finished.
bool lks__req_emit(lks_sched *s, lks_req *r, int32_t tok, const lks_tok_logprob *lp);
// Ends a request with an error (`why`), waking its reader.
void lks__req_fail(lks_req *r, const char *why);
#endif
