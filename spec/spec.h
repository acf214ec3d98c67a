// SPDX-License-Identifier: MIT
// Speculative decoding on rank 0 (DESIGN.md section 7): proposers behind one interface, lossless
// verification, the draft-count ladder, the gate, and acceptance statistics. What runs on every
// rank (the target's verify, the MTP drafter's forwards, KV rollback) is the engine's, announced
// with commands (EP_CMD_MTP_PROPOSE, EP_CMD_VERIFY, EP_CMD_COMMIT); this module decides what to
// announce. The decoding loop that uses it is the scheduler's (coordinator/scheduler.c), the one
// loop behind serve, generate and bench.
#ifndef LKS_SPEC_H
#define LKS_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "model/sample.h"
#include "proto/command.h"

// ---- how a proposer reaches every rank ----

// A collective command, run on every rank: the coordinator's submission, handed to the proposer
// (spec/ sits below the coordinator and never calls it directly). *tokens points at the greedy
// ids the command produced, valid until the next submit.
typedef struct lks_submitter {
  int (*submit)(void *ctx, Lockstep__Command *cmd, const int32_t **tokens);
  void *ctx;
} lks_submitter;

// ---- proposers ----

typedef struct lks_proposer lks_proposer;

// Per-sequence proposer state, kept by the proposer.
typedef struct lks_spec_seq {
  int slot;
  const int32_t *history;  // every token of the sequence so far (prompt + emitted)
  int n_history;
  void *state;
} lks_spec_seq;

typedef struct lks_proposer_ops {
  const char *name;
  // True when proposing is a collective forward (the sharded MTP layer).
  bool needs_comm;
  // True when the target's forwards must keep hidden states for the proposer (Forward.mtp).
  bool needs_hidden;
  void *(*alloc_state)(lks_proposer *p, int slot);
  void (*free_state)(lks_proposer *p, void *state);
  // After the prompt's prefill: `first` is the token it produced, at position n_prompt.
  int (*prefill)(lks_proposer *p, lks_spec_seq *s, int n_prompt, int32_t first);
  // Up to k drafts for each of n sequences into drafts[i * k ...]; n_out[i] how many.
  int (*propose_batch)(lks_proposer *p, lks_spec_seq **s, int n, int k, int32_t *drafts,
                       int *n_out);
  // After a verify at position `pos` (the last verified token's) that accepted `accepted` of the
  // drafts and produced `bonus`.
  int (*after_verify)(lks_proposer *p, lks_spec_seq *s, int pos, const int32_t *drafts,
                      int accepted, int32_t bonus);
  // After a plain decode step at `pos` that produced `next`; catchup brings the drafter's cache
  // up to date before the next plain step (NULL when there is nothing to catch up).
  int (*after_decode)(lks_proposer *p, lks_spec_seq *s, int pos, int32_t next);
  int (*catchup)(lks_proposer *p, lks_spec_seq **s, int n);
} lks_proposer_ops;

struct lks_proposer {
  const lks_proposer_ops *ops;
  lks_submitter sub;
  int block;  // dflash: the drafter's block size (drafts per propose: at most block - 1)
};

// "mtp", "ngram" or "dflash" (the model's attached DFlash drafter); NULL with an error for anything else (or "mtp" on a model without one).
// Collective proposers run their commands through `sub`.
lks_proposer *lks_proposer_new(const char *name, const lks_model *m, lks_submitter sub);
void lks_proposer_free(lks_proposer *p);

// ---- verification ----

// Greedy: the number of leading drafts equal to the target's arg-max of the row before them.
// target[0..k] are the arg-max ids of the k+1 verify rows; *bonus = target[accepted].
int lks_spec_accept_greedy(const int32_t *drafts, int k, const int32_t *target, int32_t *bonus);

// The lossless rule for one draft d drawn from q: accept with probability min(1, p(d)/q(d));
// otherwise draw from norm(max(0, p - q)). Returns 1 when accepted (*tok = d), 0 when rejected
// (*tok = the resampled token), or a negative error.
int lks_spec_accept_sample(const float *p, const float *q, int V, int32_t d, lks_rng *rng,
                           int32_t *tok);

// ---- the ladder and the gate ----

enum { LKS_LADDER_MAX = 16, LKS_LADDER_TEXT = 256 };
typedef struct lks_ladder {
  int n;
  int width[LKS_LADDER_MAX], k[LKS_LADDER_MAX];
} lks_ladder;

// "4:3,8:3,16:1,32:1": batches of up to 4 sequences draft 3, up to 8 draft 3, ... wider ones 0.
// An empty string is an empty ladder (no limit).
int lks_ladder_parse(const char *text, lks_ladder *l);
// Drafts for a batch of `width` sequences, at most k_max.
int lks_ladder_k(const lks_ladder *l, int width, int k_max);

// The gate: measured tokens/s of speculative steps and of plain steps (exponential averages);
// speculation stops for a while when plain steps are faster, then is probed again. Neither
// choice changes the output.
typedef struct lks_gate {
  bool on;
  double rate_spec, rate_plain;
  int plain_left, since_probe;
} lks_gate;
void lks_gate_init(lks_gate *g, bool on);
// Whether the next step may speculate.
bool lks_gate_allows(const lks_gate *g);
// A step that speculated (or not) produced `tokens` in `seconds`.
void lks_gate_record(lks_gate *g, bool speculated, double tokens, double seconds);

// ---- statistics ----

typedef struct lks_spec_stats {
  int k_max;
  uint64_t proposed[LKS_MAX_DRAFTS], accepted[LKS_MAX_DRAFTS];
  uint64_t rounds, plain_steps, target_forwards, emitted;
  double t_spec, t_plain;       // seconds in speculative steps / plain steps
  uint64_t tok_spec, tok_plain;  // tokens they produced
  uint64_t spec_steps;           // steps that speculated
  double t_propose;              // seconds of those in proposing (the drafter)
} lks_spec_stats;

void lks_spec_stats_print(const lks_spec_stats *st, const char *proposer);

#endif
