// SPDX-License-Identifier: MIT
// Logit processors and log-probabilities (see logits.h). The penalties count tokens in a dense
// scratch array that only the sequence's own tokens touch (and that they set back to zero), so a
// row costs O(sequence + biases) however large the vocabulary; the log-probabilities take one
// pass over the row (its log-sum-exp, in double) and one scan for the best k.
#include "coordinator/logits.h"

#include <math.h>
#include <stddef.h>

#include "model/sample.h"

bool lks_logits_processed(const lks_logit_params *p) {
  return p->presence != 0 || p->frequency != 0 || p->n_bias > 0 ||
         (p->repetition > 0 && p->repetition != 1);
}

bool lks_logits_needed(const lks_logit_params *p) {
  return lks_logits_processed(p) || p->logprobs;
}

// The i-th token of hist[from, n_hist) followed by extra[0, n_extra).
static inline int32_t seq_at(const int32_t *hist, int from, int n_hist, const int32_t *extra,
                             int i) {
  return i < n_hist - from ? hist[from + i] : extra[i - (n_hist - from)];
}

void lks_logits_apply(const lks_logit_params *p, const int32_t *hist, int n_prompt, int n_hist,
                      const int32_t *extra, int n_extra, float *row, int V, int32_t *scratch) {
  for (int i = 0; i < p->n_bias; i++) row[p->bias_ids[i]] += p->bias[i];
  if (p->repetition > 0 && p->repetition != 1) {
    // Every distinct token of prompt + generated, once.
    float r = p->repetition;
    int n = n_hist + n_extra;
    for (int i = 0; i < n; i++) {
      int32_t t = seq_at(hist, 0, n_hist, extra, i);
      if (t < 0 || t >= V || scratch[t]) continue;
      scratch[t] = 1;
      row[t] = row[t] > 0 ? row[t] / r : row[t] * r;
    }
    for (int i = 0; i < n; i++) {
      int32_t t = seq_at(hist, 0, n_hist, extra, i);
      if (t >= 0 && t < V) scratch[t] = 0;
    }
  }
  if (p->presence != 0 || p->frequency != 0) {
    // The generated tokens only: counts, then each distinct token once (its count back to 0).
    int from = n_prompt < n_hist ? n_prompt : n_hist;
    int n = n_hist - from + n_extra;
    for (int i = 0; i < n; i++) {
      int32_t t = seq_at(hist, from, n_hist, extra, i);
      if (t >= 0 && t < V) scratch[t]++;
    }
    for (int i = 0; i < n; i++) {
      int32_t t = seq_at(hist, from, n_hist, extra, i);
      if (t < 0 || t >= V || !scratch[t]) continue;
      row[t] -= p->frequency * (float)scratch[t];
      row[t] -= p->presence;
      scratch[t] = 0;
    }
  }
}

void lks_logprobs_row(const float *row, int V, int32_t tok, int k, lks_tok_logprob *out) {
  double lse = lks_logsumexp(row, V);
  out->lp = (float)((double)row[tok] - lse);
  if (k > LKS_MAX_TOP_LOGPROBS) k = LKS_MAX_TOP_LOGPROBS;
  if (k > V) k = V;
  // The best k, best first; ids grow during the scan, so an equal logit never displaces an
  // earlier one (ties to the lower id).
  int n = 0;
  float thr = -INFINITY;  // the k-th best so far, once there are k
  for (int i = 0; i < V && k > 0; i++) {
    float l = row[i];
    if (n == k && !(l > thr)) continue;
    int j = n < k ? n++ : k - 1;
    while (j > 0 && row[out->top_id[j - 1]] < l) {
      out->top_id[j] = out->top_id[j - 1];
      j--;
    }
    out->top_id[j] = i;
    if (n == k) thr = row[out->top_id[k - 1]];
  }
  out->n_top = n;
  for (int j = 0; j < n; j++) out->top_lp[j] = (float)((double)row[out->top_id[j]] - lse);
}
