// SPDX-License-Identifier: MIT
// The scheduler (DESIGN.md section 8): continuous batching of requests over a fixed number of
// sequence slots, and the one decoding loop of lockstep: `serve` runs it on rank 0's main thread
// (lks_sched_run) while HTTP threads submit; `generate`, `bench` and the speculative tests submit
// their sequences to it and step it themselves (lks_sched_step). Only its thread submits commands
// to the world; lks_req is shared (reference-counted) between the submitting side and it. Each
// step mixes prefill chunks of new sequences (up to a token budget) with one decode row of every
// running sequence, or its verify rows [last token, drafts...] when it speculates, in one forward
// command that every rank runs; drafts, acceptance, the ladder, the policy (K per sequence),
// the levers and the statistics exist here once.
//
// A bounded queue stands in front of the slots: submitting to a full queue fails with LKS_EFULL
// (HTTP 429), to a draining or failed scheduler with LKS_EBACKEND (HTTP 503). A request whose
// client is gone is cancelled and its slot freed at the next step.
#ifndef LKS_SCHEDULER_H
#define LKS_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "coordinator/logits.h"
#include "core/settings.h"
#include "model/sample.h"
#include "spec/spec.h"
#include "text/tokenizer.h"
#include "worker/world.h"

typedef struct lks_sched lks_sched;
typedef struct lks_req lks_req;

typedef struct lks_req_params {
  int32_t *prompt;  // ownership passes to the request on submit
  int n_prompt;
  int max_tokens;
  lks_sampling sampling;
  uint64_t seed;
  lks_logit_params lp;  // processors and logprobs (coordinator/logits.h); zeros: none
  char **stop;      // stop strings (owned by the request after submit), n_stop of them
  int n_stop;
  bool ignore_eos;
  bool keep_markup;  // the text keeps GLM's <think>/<tool_call> markup tokens (for the chat parser)
  // response_format json_object: every token is picked from those the JSON grammar allows
  // (text/json_grammar.h), so the output is one JSON object, closed by max_tokens at the latest.
  // Needs the scheduler's tokenizer (lks_sched_json_ready).
  bool json_object;
  // Optional: called on the scheduler's thread for each generated token, in order (eos: the
  // token ends the sequence). For callers that step the scheduler themselves.
  void (*on_token)(void *ctx, int32_t tok, bool eos);
  void *on_token_ctx;
} lks_req_params;

// Frees what a lks_req_params owns (prompt, stop strings, logit_bias) and zeroes it: for a caller
// whose parameters never reached lks_sched_submit, or that it left behind.
void lks_req_params_clear(lks_req_params *p);

// What the HTTP side reads: the text produced since its last read, and where the request is.
typedef struct lks_req_news {
  char *text;  // malloc'd, NUL-terminated (the caller frees); NULL when nothing new
  size_t len;
  int n_prompt, n_generated;
  int n_cached;  // prompt tokens the prefix cache gave (not prefilled)
  bool done;
  const char *finish_reason;  // "stop" or "length" once done
  int stop_index;             // the stop string that ended it (index into lks_req_params.stop), or -1
  bool failed;                // the world failed: the request did not complete
  char error[512];
} lks_req_news;

typedef struct lks_sched_opts {
  int max_queue;     // requests waiting for a slot
  int chunk;         // prefill tokens per step, over all sequences
  int max_len;       // positions a sequence may hold
  double drain_grace;  // seconds a drain waits for running requests
  // Speculation: the proposer ("off", "mtp", "ngram"), the most drafts per sequence and step,
  // the ladder of drafts by batch width ("" for none), and the adaptive policy (the gate).
  char spec[16];
  int n_drafts;
  char ladder[LKS_LADDER_TEXT];
  bool gate;  // the adaptive policy picks K per sequence (else the ladder's K for all)
  // Tests: K for a sequence at its n_generated-th token, within the levers and the room left,
  // instead of the policy's or the ladder's (NULL: none); the drafts of every verify; the MTP
  // drafter's backlog limit (lks_proposer.backlog; 0: the default, 1: catch up at every plain
  // step).
  int (*force_k)(void *ctx, int slot, int n_generated);
  void (*on_drafts)(void *ctx, int slot, int n_generated, const int32_t *drafts, int nd);
  void *test_ctx;
  int mtp_backlog;
} lks_sched_opts;

// The options from the settings table (--max-queue, --prefill-chunk, --max-seq-len,
// --drain-grace, --spec, --num-drafts, --ladder, --spec-gate).
void lks_sched_opts_from(const lks_settings *s, lks_sched_opts *o);
// NULL with an error when an option is invalid (a ladder that does not parse, a proposer the
// model cannot run).
lks_sched *lks_sched_new(lks_world *w, const lks_tokenizer *tok, const lks_sched_opts *o);
void lks_sched_free(lks_sched *s);

// Whether JSON mode is available (the scheduler has a tokenizer and built its token trie).
bool lks_sched_json_ready(const lks_sched *s);

// Any thread. On success the caller holds one reference (lks_req_release). A json_object request
// to a scheduler without JSON mode fails with LKS_EINVAL.
lks_req *lks_sched_submit(lks_sched *s, lks_req_params *p, int *err);
// Waits up to timeout_s for news (new text, completion or failure), then reports it.
void lks_req_read(lks_req *r, double timeout_s, lks_req_news *n);
// A copy of the generated token ids so far (*ids malloc'd; the caller frees); returns how many.
int lks_req_tokens(lks_req *r, int32_t **ids);
// A copy of the reports of generated tokens [from, to) of a request that asked for logprobs
// (*out malloc'd; the caller frees); returns how many (fewer when fewer are there, 0 without).
int lks_req_logprobs(lks_req *r, int from, int to, lks_tok_logprob **out);
// The seed the request samples with (fixed at submit).
uint64_t lks_req_seed(const lks_req *r);
// Whether the request finished (or failed).
bool lks_req_finished(lks_req *r);
// The client is gone: stop generating (the slot is freed at the next step, or the request leaves
// the queue at the next step).
void lks_req_cancel(lks_req *r);
// For event-driven readers (the HTTP server's suspended connections): arms a one-shot waker
// that the scheduler's thread calls, outside any lock of the request, when news arrives (any
// delivered text, completion or failure; until_done: completion or failure only). Returns false,
// arming nothing, when there is such news already. lks_req_disarm takes the waker back and says
// whether it was still armed: exactly one of the waker call and a true disarm happens per arm.
bool lks_req_arm(lks_req *r, bool until_done, void (*wake)(void *ctx), void *ctx);
bool lks_req_disarm(lks_req *r);
void lks_req_release(lks_req *r);

// The scheduler loop (rank 0's main thread): runs until lks_sched_stop, or until the world
// fails (returns the error; every request in flight is marked failed).
int lks_sched_run(lks_sched *s);
// One step on the caller's thread (the only thread that steps this scheduler): 1 when it did
// work, 0 when there was nothing to do, or the world's error.
int lks_sched_step(lks_sched *s);
// Runs one request to its end on the caller's thread (generate, bench, tests): submits it (the
// parameters pass to the request as with lks_sched_submit), steps until it finished, then once
// more so that its slot is free on every rank. 0, or the error that stopped it.
int lks_sched_run_one(lks_sched *s, lks_req_params *p);
// Speculation with the adaptive policy: measures the step costs it chooses K from (plain steps,
// one draft, verify rows up to --num-drafts, at batch width 1) with one sequence of fixed ids
// run before any request, so that the first requests need not explore them; what it serves
// starts from zero (statistics, prefix cache; the policy keeps its acceptance prior). Nothing
// to do without the policy or with requests already in. *seconds: the time it took. 0, or the
// world's error.
int lks_sched_calibrate(lks_sched *s, double *seconds);
// Whether the policy holds every step cost at batch width 1 up to the levers' draft count (false
// without the policy).
bool lks_sched_costs_measured(const lks_sched *s);
// Any thread. drain: refuse new requests, finish the running ones, then return from run.
void lks_sched_stop(lks_sched *s, bool drain);
bool lks_sched_healthy(const lks_sched *s);
bool lks_sched_draining(const lks_sched *s);
// Levers for the next step boundary, applied on every rank with EP_CMD_SET_LEVERS and used by
// the scheduler from that same step on. Refuses (LKS_EINVAL, nothing changed) a draft count
// outside 0..LKS_MAX_DRAFTS or a ladder that does not parse.
int lks_sched_set_levers(lks_sched *s, bool speculation, int n_drafts, const char *ladder);

// Drops every cached prefix no sequence holds, on every rank, at the next step boundary.
void lks_sched_clear_cache(lks_sched *s);

// Counters for /metrics (a consistent snapshot).
enum { LKS_HIST_BUCKETS = 12, LKS_RANKS_SHOWN = 256 };
typedef struct lks_hist {
  double le[LKS_HIST_BUCKETS];  // upper bounds, seconds
  uint64_t count[LKS_HIST_BUCKETS + 1];  // per bucket, then +Inf
  double sum;
  uint64_t n;
} lks_hist;
typedef struct lks_sched_stats {
  uint64_t prompt_tokens, generated_tokens, requests_done, requests_cancelled, steps;
  uint64_t cached_tokens;  // prompt tokens the prefix cache gave
  int queue_depth, slots_in_use, slots, kv_blocks_free, kv_blocks;
  lks_prefix_stats prefix;  // the prefix cache: lookups, tokens given, entries, evictions
  bool rank_up[LKS_RANKS_SHOWN];  // rank 0, and each worker while its connection is up
  lks_hist ttft, itl, step;
  bool speculation;  // the levers in force
  int n_drafts;
  char ladder[LKS_LADDER_TEXT];
  lks_spec_stats spec;  // speculation: rounds, per-position proposed/accepted, rates
  // Picking tokens from a step's output on the scheduler's thread (logit processors, JSON mask,
  // sampling, logprobs, acceptance): seconds, and sequences stepped (each step's sequences
  // summed), over all steps.
  double t_pick;
  uint64_t seq_steps;
} lks_sched_stats;
void lks_sched_stats_get(lks_sched *s, lks_sched_stats *out);

#endif
