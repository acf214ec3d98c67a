// SPDX-License-Identifier: MIT
// Sampling (see sample.h).
#include "model/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void lks_rng_seed(lks_rng *r, uint64_t seed) {
  // splitmix64 expands the seed into the four words of state.
  for (int i = 0; i < 4; i++) {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    r->s[i] = z ^ (z >> 31);
  }
}

uint64_t lks_rng_next(lks_rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

double lks_rng_uniform(lks_rng *r) { return (double)(lks_rng_next(r) >> 11) * 0x1.0p-53; }

int lks_argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static const float *sort_keys;
static int by_logit_desc(const void *a, const void *b) {
  int i = *(const int *)a, j = *(const int *)b;
  if (sort_keys[i] != sort_keys[j]) return sort_keys[i] > sort_keys[j] ? -1 : 1;
  return i - j;
}

int lks_sampling_probs(const float *logits, int V, const lks_sampling *p, float *probs) {
  memset(probs, 0, (size_t)V * sizeof *probs);
  if (p->temperature <= 0) {
    probs[lks_argmax(logits, V)] = 1.0f;
    return 0;
  }
  int *idx = malloc((size_t)V * sizeof *idx);
  if (!idx) return lks_set_error(LKS_ENOMEM, "sampling: out of memory");
  for (int i = 0; i < V; i++) idx[i] = i;
  sort_keys = logits;  // single-threaded use: the model runs on one thread
  qsort(idx, (size_t)V, sizeof *idx, by_logit_desc);
  int keep = p->top_k > 0 && p->top_k < V ? p->top_k : V;
  double mx = logits[idx[0]], sum = 0;
  for (int i = 0; i < keep; i++) sum += exp(((double)logits[idx[i]] - mx) / p->temperature);
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
  if (p->top_p < 1.0f) {
    double acc = 0;
    int k = 0;
    while (k < keep) {
      acc += exp(((double)logits[idx[k]] - mx) / p->temperature) / sum;
      k++;
      if (acc >= p->top_p) break;
    }
    keep = k;
    sum = 0;
    for (int i = 0; i < keep; i++) sum += exp(((double)logits[idx[i]] - mx) / p->temperature);
  }
  for (int i = 0; i < keep; i++)
    probs[idx[i]] = (float)(exp(((double)logits[idx[i]] - mx) / p->temperature) / sum);
  free(idx);
  return 0;
}

int lks_sample(const float *logits, int V, const lks_sampling *p, lks_rng *rng) {
  if (p->temperature <= 0) return lks_argmax(logits, V);
  float *probs = malloc((size_t)V * sizeof *probs);
  if (!probs) return lks_set_error(LKS_ENOMEM, "sampling: out of memory");
  int rc = lks_sampling_probs(logits, V, p, probs);
  if (rc < 0) {
    free(probs);
    return rc;
  }
  double u = lks_rng_uniform(rng), acc = 0;
  int tok = -1, last = 0;
  for (int i = 0; i < V; i++) {
    if (probs[i] <= 0) continue;
    last = i;
    acc += probs[i];
    if (u < acc) {
      tok = i;
      break;
    }
  }
  free(probs);
  return tok >= 0 ? tok : last;  // rounding left u above the total: the last kept token
}
