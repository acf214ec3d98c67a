// SPDX-License-Identifier: MIT
// Logit processing and reporting for one output row of one request, on the scheduler's thread:
// the processors a request asks for (logit_bias, repetition_penalty, frequency_penalty,
// presence_penalty), applied to a copy of the row before it is sampled, and the log-probabilities
// it reports (log_softmax of the raw row, before any processor, temperature, top-k or top-p: the
// model's own distribution, as vLLM reports by default).
//
// Everything is sparse in the vocabulary: a processor touches only the tokens with a bias or that
// occur in the sequence, so its cost is O(tokens of the sequence + biases) per row, not O(V).
// The counts a row is penalised with are those of the tokens before it: the sequence's generated
// tokens, then the drafts a verify row comes after (which equal the accepted tokens whenever the
// row's result is used), so speculation picks exactly what plain decoding picks. A row's result
// depends on nothing but its own logits and its own request. Not thread-safe per scratch buffer;
// the scheduler owns one.
#ifndef LKS_COORDINATOR_LOGITS_H
#define LKS_COORDINATOR_LOGITS_H

#include <stdbool.h>
#include <stdint.h>

enum { LKS_MAX_TOP_LOGPROBS = 20, LKS_MAX_LOGIT_BIAS = 1024 };

typedef struct lks_logit_params {
  float presence, frequency;  // OpenAI: l[t] -= presence * (c[t] > 0) + frequency * c[t], c over the generated tokens
  float repetition;           // Hugging Face, over prompt + generated: l > 0 ? l / r : l * r; 0 or 1: off
  int n_bias;
  int32_t *bias_ids;  // [n_bias] distinct ids < vocab (owned by the request after submit)
  float *bias;        // [n_bias] added to the logit
  bool logprobs;      // report each generated token's log-probability ...
  int top_logprobs;   // ... and its top_logprobs (0..20) most likely alternatives
} lks_logit_params;

// One generated token's report: its log-probability and the `n_top` most likely tokens (best
// first, ties to the lower id) with theirs.
typedef struct lks_tok_logprob {
  float lp;
  int n_top;
  int32_t top_id[LKS_MAX_TOP_LOGPROBS];
  float top_lp[LKS_MAX_TOP_LOGPROBS];
} lks_tok_logprob;

// Whether any processor changes the logits.
bool lks_logits_processed(const lks_logit_params *p);
// Whether a row of this request needs the forward's logits (a processor, or logprobs).
bool lks_logits_needed(const lks_logit_params *p);

// Applies the processors to row[V] in place: logit_bias, then repetition_penalty, then the
// frequency and presence penalties (vLLM's order). The sequence's tokens are hist[0, n_hist)
// (the first n_prompt the prompt, the rest generated) followed by extra[0, n_extra) (generated
// too: a verify row's earlier drafts). scratch: [V] zeros, left zeros.
void lks_logits_apply(const lks_logit_params *p, const int32_t *hist, int n_prompt, int n_hist,
                      const int32_t *extra, int n_extra, float *row, int V, int32_t *scratch);

// The report of token tok under raw row[V], with k (<= LKS_MAX_TOP_LOGPROBS) alternatives.
void lks_logprobs_row(const float *row, int V, int32_t tok, int k, lks_tok_logprob *out);

#endif
