// SPDX-License-Identifier: MIT
// The acceptance statistics (see spec.h).
#include <stdio.h>

#include "core/log.h"
#include "spec/spec.h"

void lks_spec_stats_print(const lks_spec_stats *st, const char *proposer) {

  char line[1024];
  int k = snprintf(line, sizeof line, "spec %s: %llu rounds, %llu plain steps; per position accepted/proposed:",
                   proposer, (unsigned long long)st->rounds, (unsigned long long)st->plain_steps);
  for (int i = 0; i < st->k_max && k < (int)sizeof line - 40; i++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %d:%llu/%llu (%.2f)", i + 1,
                  (unsigned long long)st->accepted[i], (unsigned long long)st->proposed[i],
                  st->proposed[i] ? (double)st->accepted[i] / (double)st->proposed[i] : 0.0);
  LKS_LOG(LKS_LOG_INFO, "%s", line);
  LKS_LOG(LKS_LOG_INFO,
          "spec %s: mean accepted length %.3f tokens per round, %.3f tokens per target forward; "
          "%.1f tokens/s speculating, %.1f tokens/s plain",
          proposer, st->rounds ? (double)st->tok_spec / (double)st->rounds : 0.0,
          st->target_forwards ? (double)st->emitted / (double)st->target_forwards : 0.0,
          st->t_spec > 0 ? st->tok_spec / st->t_spec : 0.0,
          st->t_plain > 0 ? st->tok_plain / st->t_plain : 0.0);
}
