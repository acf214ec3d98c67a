// SPDX-License-Identifier: MIT
// The scheduler (DESIGN.md section 8): continuous batching of requests over a fixed number of
// sequence slots. It runs on rank 0's main thread, the only thread that submits commands to the
// world; HTTP connection threads hand it requests and read their output through lks_req, which
// is shared (reference-counted) between the two sides. Each step mixes prefill chunks of new
// sequences (up to a token budget) with one decode row of every running sequence, in one forward
// command that every rank runs.
//
// A bounded queue stands in front of the slots: submitting to a full queue fails with LKS_EFULL
// (HTTP 429), to a draining or failed scheduler with LKS_EBACKEND (HTTP 503). A request whose
// client is gone is cancelled and its slot freed at the next step.
#ifndef LKS_SCHEDULER_H
#define LKS_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "coordinator/world.h"
#include "model/sample.h"
#include "text/tokenizer.h"

typedef struct lks_sched lks_sched;
typedef struct lks_req lks_req;

typedef struct lks_req_params {
  int32_t *prompt;  // ownership passes to the request on submit
  int n_prompt;
  int max_tokens;
  lks_sampling sampling;
  uint64_t seed;
  char **stop;      // stop strings (owned by the request after submit), n_stop of them
  int n_stop;
  bool ignore_eos;
} lks_req_params;

// What the HTTP side reads: the text produced since its last read, and where the request is.
typedef struct lks_req_news {
  char *text;  // malloc'd, NUL-terminated (the caller frees); NULL when nothing new
  size_t len;
  int n_prompt, n_generated;
  bool done;
  const char *finish_reason;  // "stop" or "length" once done
  bool failed;                // the world failed: the request did not complete
  char error[512];
} lks_req_news;

typedef struct lks_sched_opts {
  int max_queue;     // requests waiting for a slot
  int chunk;         // prefill tokens per step, over all sequences
  int max_len;       // positions a sequence may hold
  double drain_grace;  // seconds a drain waits for running requests
} lks_sched_opts;

lks_sched *lks_sched_new(lks_world *w, const lks_tokenizer *tok, const lks_sched_opts *o);
void lks_sched_free(lks_sched *s);

// Any thread. On success the caller holds one reference (lks_req_release).
lks_req *lks_sched_submit(lks_sched *s, lks_req_params *p, int *err);
// Waits up to timeout_s for news (new text, completion or failure), then reports it.
void lks_req_read(lks_req *r, double timeout_s, lks_req_news *n);
// A copy of the generated token ids so far (*ids malloc'd; the caller frees); returns how many.
int lks_req_tokens(lks_req *r, int32_t **ids);
// The client is gone: stop generating (the slot is freed at the next step).
void lks_req_cancel(lks_req *r);
void lks_req_release(lks_req *r);

// The scheduler loop (rank 0's main thread): runs until lks_sched_stop, or until the world
// fails (returns the error; every request in flight is marked failed).
int lks_sched_run(lks_sched *s);
// Any thread. drain: refuse new requests, finish the running ones, then return from run.
void lks_sched_stop(lks_sched *s, bool drain);
bool lks_sched_healthy(const lks_sched *s);
bool lks_sched_draining(const lks_sched *s);
// Levers for the next step, applied on every rank with EP_CMD_SET_LEVERS.
void lks_sched_set_levers(lks_sched *s, bool speculation, int n_drafts, const char *ladder);

// Counters for /metrics (a consistent snapshot).
enum { LKS_HIST_BUCKETS = 12 };
typedef struct lks_hist {
  double le[LKS_HIST_BUCKETS];  // upper bounds, seconds
  uint64_t count[LKS_HIST_BUCKETS + 1];  // per bucket, then +Inf
  double sum;
  uint64_t n;
} lks_hist;
typedef struct lks_sched_stats {
  uint64_t prompt_tokens, generated_tokens, requests_done, requests_cancelled, steps;
  int queue_depth, slots_in_use, slots, kv_blocks_free;
  lks_hist ttft, itl, step;
  bool speculation;
  int n_drafts;
  char ladder[64];
  uint64_t verify_rounds, proposed[16], accepted[16];  // per draft position
} lks_sched_stats;
void lks_sched_stats_get(lks_sched *s, lks_sched_stats *out);

#endif
