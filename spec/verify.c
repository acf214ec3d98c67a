// SPDX-License-Identifier: MIT
// Verification rules (see spec.h): greedy acceptance and the lossless rejection rule with
// resampling from the residual distribution (Leviathan et al. / Chen et al.).
#include <math.h>

#include "core/error.h"
#include "spec/spec.h"

int lks_spec_accept_greedy(const int32_t *drafts, int k, const int32_t *target, int32_t *bonus) {
  int a = 0;
  while (a < k && drafts[a] == target[a]) a++;
  *bonus = target[a];
  return a;
}

int lks_spec_accept_sample(const float *p, const float *q, int V, int32_t d, lks_rng *rng,
                           int32_t *tok) {
  if (d < 0 || d >= V) return lks_set_error(LKS_ERANGE, "draft %d outside the vocabulary", d);
  double pd = p[d], qd = q[d];
  if (qd <= 0) return lks_set_error(LKS_EINVAL, "draft %d has zero probability under its drafter", d);
  if (lks_rng_uniform(rng) < (pd >= qd ? 1.0 : pd / qd)) {
    *tok = d;
    return 1;
  }
  // Rejected: draw from max(0, p - q), renormalised.
  double total = 0;
  for (int i = 0; i < V; i++) total += p[i] > q[i] ? (double)p[i] - q[i] : 0.0;
  if (!(total > 0)) {  // p <= q everywhere: p == q, so a rejection cannot happen; keep d
    *tok = d;
    return 1;
  }
  double u = lks_rng_uniform(rng) * total, acc = 0;
  int last = -1;
  for (int i = 0; i < V; i++) {
    double r = p[i] > q[i] ? (double)p[i] - q[i] : 0.0;
    if (r <= 0) continue;
    last = i;
    acc += r;
    if (u < acc) {
      *tok = i;
      return 0;
    }
  }
  *tok = last;
  return 0;
}
