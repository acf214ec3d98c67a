// SPDX-License-Identifier: MIT
// Speculative decoding on rank 0 (DESIGN.md section 7): proposers behind one interface, lossless
// verification, the draft-count ladder, the adaptive policy (K per sequence), and acceptance
// statistics. What runs on every rank (the target's verify, the MTP drafter's forwards, KV rollback) is the engine's, announced
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
  // True when a plain step's hidden row is kept on every rank for a later batched catch-up
  // (SlotTokens.defer_mtp: the MTP drafter's lazy catch-up); dflash appends its features itself.
  bool defers_plain;
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
  // After a plain decode step at `pos` that produced `next`. catchup, before a step in which the
  // n sequences draft nothing: brings the drafter up to date where it must (mtp: the sequences
  // whose backlog is full; NULL when there is nothing to catch up).
  int (*after_decode)(lks_proposer *p, lks_spec_seq *s, int pos, int32_t next);
  int (*catchup)(lks_proposer *p, lks_spec_seq **s, int n);
} lks_proposer_ops;

struct lks_proposer {
  const lks_proposer_ops *ops;
  lks_submitter sub;
  // mtp: a sequence that drafts nothing keeps the target's hidden states of its plain steps on
  // every rank (up to LKS_MTP_BACKLOG of them) instead of running the drafter at each one; the
  // drafter catches up over them in one batched forward when the sequence drafts again, or when
  // `backlog` positions wait (1: catch up after every plain step).
  int backlog;
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

// ---- the ladder ----

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

// ---- the adaptive policy (policy.c): K per sequence ----

// One batch width's step costs in seconds, as measured (0: not yet): a plain step, one chained
// draft step of the drafter, and one extra verify row in a step whose deepest verify has K
// drafts (row[K]; row[0] unused); the draft and the rows as their ratios to the plain step when
// they were measured, times the plain step's cost now. A step of w sequences drafting k_i,
// K = max k_i, R = sum k_i, costs plain + K * draft + R * row[K] (plain alone when K = 0).
typedef struct lks_policy_costs {
  double plain, draft;
  double row[LKS_MAX_DRAFTS + 1];
} lks_policy_costs;

// A sequence's running acceptance per draft position (each given the ones before it accepted),
// exponentially weighted; it starts from the pooled acceptance of every sequence so far, which
// counts as up to ten observations once the pool has that many.
typedef struct lks_policy_seq {
  float acc[LKS_MAX_DRAFTS];
  int n_obs[LKS_MAX_DRAFTS];  // observations per position (the first ones weigh more)
  int n_prior[LKS_MAX_DRAFTS];  // observations the starting value counts as (1 to 10)
  int depth;  // positions [0, depth) observed; deeper ones take the acceptance of depth - 1
  uint64_t rounds;
  int waiting;  // plain steps since it last drafted (the positions its drafter has to catch up)
} lks_policy_seq;

typedef struct lks_policy lks_policy;

// E[tokens] of one step that drafts k: 1 + sum_{j<=k} prod_{i<=j} acc[i-1].
double lks_policy_expected(const float *acc, int k);
// The modelled time of a step with deepest draft count K and R draft rows in all.
double lks_policy_step_cost(const lks_policy_costs *c, int K, int R);
// The draft counts k[0..n) (k[i] <= kcap[i], <= k_max) maximising the expected tokens of the n
// sequences per unit of modelled time; returns that rate (tokens/s). Pure: the same inputs give
// the same k. scratch: n ints. Every cost up to k_max must be measured (> 0 plain).
double lks_policy_choose(const lks_policy_costs *c, int n, const float (*acc)[LKS_MAX_DRAFTS],
                         const int *kcap, int k_max, int *k, int *scratch);

// The measured state: costs per batch width up to max_width (wider batches share the last), the
// pooled acceptance. NULL with an error when out of memory. Rank 0's scheduler thread only.
lks_policy *lks_policy_new(int max_width, int k_max);
void lks_policy_free(lks_policy *p);
// A new sequence's acceptance (p may be NULL: the prior alone).
void lks_policy_seq_init(const lks_policy *p, lks_policy_seq *s);
// K for each of the n sequences of a step (kcap[i]: the most sequence i may draft: the levers,
// the ladder and the room left before --max-seq-len); returns the deepest. At a width not yet
// measured, plain steps and then one-draft steps come first; until the pool has seen a few
// drafts, the choice is optimistic about their acceptance; the neighbours of the choice are
// probed now and then; otherwise the argmax of lks_policy_choose (a deeper K not yet measured
// costing, per row, what the one below it does), or plain decoding when that argmax beats it
// by less than 3%. scratch: n ints.
int lks_policy_pick(lks_policy *p, lks_policy_seq *const *s, const int *kcap, int n, int *k,
                    int *scratch);
// A verify of k drafts of sequence s accepted `accepted` of them (p may be NULL).
void lks_policy_observe(lks_policy *p, lks_policy_seq *s, int k, int accepted);
// A decode step of w sequences (no prefill rows) with deepest draft count K and R draft rows
// took t_step seconds, t_propose of them in the drafter (catch-up included).
void lks_policy_record(lks_policy *p, int w, int K, int R, double t_propose, double t_step);
// Whether every cost at width w up to k_max drafts has the samples the policy trusts (then it
// explores none of them).
bool lks_policy_measured(const lks_policy *p, int w, int k_max);
// The costs the policy holds for width w (for tests and reports).
const lks_policy_costs *lks_policy_costs_at(const lks_policy *p, int w);

// ---- statistics ----

typedef struct lks_spec_stats {
  int k_max;
  uint64_t proposed[LKS_MAX_DRAFTS], accepted[LKS_MAX_DRAFTS];
  uint64_t rounds, plain_steps, target_forwards, emitted;
  double t_spec, t_plain;       // seconds in speculative steps / plain steps
  uint64_t tok_spec, tok_plain;  // tokens they produced
  uint64_t spec_steps;           // steps that speculated
  double t_propose;              // seconds of those in proposing (the drafter)
  uint64_t k_rows[LKS_MAX_DRAFTS + 1];  // decode rows by their draft count (0: plain)
} lks_spec_stats;

void lks_spec_stats_print(const lks_spec_stats *st, const char *proposer);

#endif
