// SPDX-License-Identifier: MIT
// The gate and the acceptance statistics (see spec.h).
#include <stdio.h>

#include "core/log.h"
#include "spec/spec.h"

// Plain steps measured first, how many speculative steps between looks at the rates, and how
// many plain steps follow a look that found speculation slower.
enum { GATE_FIRST_PLAIN = 2, GATE_PROBE_EVERY = 4, GATE_PLAIN_FOR = 16 };

void lks_gate_init(lks_gate *g, bool on) {
  *g = (lks_gate){0};
  g->on = on;
  g->plain_left = on ? GATE_FIRST_PLAIN : 0;
}

bool lks_gate_allows(const lks_gate *g) { return !g->on || g->plain_left == 0; }

void lks_gate_record(lks_gate *g, bool speculated, double tokens, double seconds) {
  if (seconds <= 0 || tokens <= 0) return;
  double rate = tokens / seconds;
  if (!speculated) {
    g->rate_plain = g->rate_plain ? 0.8 * g->rate_plain + 0.2 * rate : rate;
    if (g->plain_left > 0) g->plain_left--;
    return;
  }
  g->rate_spec = g->rate_spec ? 0.8 * g->rate_spec + 0.2 * rate : rate;
  // While plain steps are faster, decode plainly for a while, then look again.
  if (g->on && g->rate_plain > 0 && ++g->since_probe >= GATE_PROBE_EVERY &&
      g->rate_spec < g->rate_plain) {
    g->plain_left = GATE_PLAIN_FOR;
    g->since_probe = 0;
  }
}

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
