// SPDX-License-Identifier: MIT
// One sequence with speculation, end to end (see spec.h), and the acceptance statistics.
//
// State between steps: positions 0..L-1 are in the target's KV cache, T is the last emitted
// token (position L, not yet fed). A speculative round: propose k drafts, verify [T, d1..dk] at
// L..L+k in one forward, accept a drafts and a bonus token, commit L + a + 1 positions (the
// rejected rows roll back on every rank). A plain step: decode T at L. The gate measures the
// tokens/s of both and speculates only while that is faster (probing the other side now and
// then); neither choice changes the output.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "spec/spec.h"

typedef struct {
  const lks_spec_opts *o;
  int32_t *hist;
  int n_hist, n_gen, emitted;
  bool stop;
  const lks_config *cfg;
} run;

static int emit(run *r, int32_t tok) {
  if (r->stop || r->emitted >= r->n_gen) return 0;
  bool eos = false;
  for (int i = 0; i < r->cfg->n_eos; i++) eos |= tok == r->cfg->eos[i];
  eos = eos && !r->o->ignore_eos;
  r->hist[r->n_hist++] = tok;
  r->emitted++;
  if (r->o->emit) LKS_TRY(r->o->emit(r->o->emit_ctx, tok, eos, &r->stop));
  if (eos || r->emitted >= r->n_gen) r->stop = true;
  return 0;
}

// The token a row's logits give under the sampling settings.
static int pick(const lks_spec_opts *o, const float *logits, int V, int32_t *tok) {
  int t = lks_sample(logits, V, &o->sampling, o->rng);
  if (t < 0) return t;
  *tok = t;
  return 0;
}

int lks_spec_generate(lks_world *w, const int32_t *prompt, int n_prompt, int n_gen,
                      const lks_spec_opts *o, lks_spec_stats *st) {
  const lks_config *cfg = lks_model_config(w->model);
  int V = cfg->vocab, rc = 0;
  bool sampling = o->sampling.temperature > 0;
  lks_proposer *pr = o->proposer;
  bool hidden = pr && pr->ops->needs_hidden;
  int k_max = pr ? o->k_max : 0;
  memset(st, 0, sizeof *st);
  st->k_max = k_max;
  run r = {o, calloc((size_t)(n_prompt + n_gen + LKS_MAX_DRAFTS + 2), sizeof(int32_t)), 0, n_gen,
           0, false, cfg};
  float *p_rows = sampling ? malloc((size_t)(LKS_MAX_DRAFTS + 1) * V * sizeof(float)) : NULL;
  float *q = sampling ? calloc((size_t)V, sizeof(float)) : NULL;
  lks_spec_seq seq = {0, r.hist, 0, NULL};
  lks_spec_seq *seqs[1] = {&seq};
  if (!r.hist || (sampling && (!p_rows || !q))) {
    rc = lks_set_error(LKS_ENOMEM, "out of memory");
    goto done;
  }
  memcpy(r.hist, prompt, (size_t)n_prompt * sizeof *prompt);
  r.n_hist = n_prompt;
  if (n_gen <= 0) goto done;
  const uint32_t slot0 = 0;
  LKS_TRY(lks_world_slots(w, LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT, &slot0, 1));
  if (pr && !(seq.state = pr->ops->alloc_state(pr, 0))) {
    rc = lks_set_error(LKS_ENOMEM, "out of memory");
    goto free_slot;
  }
  lks_engine_out out;
  int32_t T;
  if ((rc = lks_world_forward1(w, LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL, 0, prompt, n_prompt, 0,
                               false, hidden, sampling, &out)) < 0)
    goto free_slot;
  st->target_forwards++;
  if (sampling ? (rc = pick(o, out.logits, V, &T)) < 0 : (T = out.tokens[0], 0)) goto free_slot;
  if ((rc = emit(&r, T)) < 0) goto free_slot;
  int L = n_prompt;
  if (pr && (rc = pr->ops->prefill(pr, &seq, n_prompt, T)) < 0) goto free_slot;
  // The gate: measured tokens/s of speculative rounds and of plain steps (exponential averages).
  double rate_spec = 0, rate_plain = 0;
  int plain_left = pr && o->gate ? 2 : 0;  // measure plain decoding first
  int since_probe = 0;
  while (!r.stop) {
    int k = pr ? lks_ladder_k(&o->ladder, 1, k_max) : 0;
    if (k > 0 && plain_left > 0) k = 0;
    int32_t drafts[LKS_MAX_DRAFTS];
    int n_d = 0;
    double t0 = lks_clock();
    seq.n_history = r.n_hist;
    if (k > 0 && (rc = pr->ops->propose_batch(pr, seqs, 1, k, drafts, &n_d)) < 0) goto free_slot;
    if (n_d == 0) {
      // A plain step. The drafter first catches up on what the last step left it.
      if (pr && pr->ops->catchup && (rc = pr->ops->catchup(pr, seqs, 1)) < 0) goto free_slot;
      if ((rc = lks_world_forward1(w, LOCKSTEP__CMD_TYPE__EP_CMD_DECODE, 0, &T, 1, L, false,
                                   hidden, sampling, &out)) < 0)
        goto free_slot;
      st->target_forwards++;
      int32_t next;
      if (sampling ? (rc = pick(o, out.logits, V, &next)) < 0 : (next = out.tokens[0], 0)) goto free_slot;
      if (pr && (rc = pr->ops->after_decode(pr, &seq, L, next)) < 0) goto free_slot;
      L += 1;
      T = next;
      if ((rc = emit(&r, T)) < 0) goto free_slot;
      double dt = lks_clock() - t0;
      st->plain_steps++;
      st->t_plain += dt;
      st->tok_plain++;
      rate_plain = rate_plain ? 0.8 * rate_plain + 0.2 / dt : 1 / dt;
      if (plain_left > 0) plain_left--;
      continue;
    }
    // A speculative round.
    int32_t rows[LKS_MAX_DRAFTS + 1];
    rows[0] = T;
    memcpy(rows + 1, drafts, (size_t)n_d * sizeof *drafts);
    if ((rc = lks_world_forward1(w, LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY, 0, rows, n_d + 1, L, true,
                                 hidden, sampling, &out)) < 0)
      goto free_slot;
    st->target_forwards++;
    int a;
    int32_t bonus;
    if (!sampling) {
      a = lks_spec_accept_greedy(drafts, n_d, out.tokens, &bonus);
    } else {
      // Drafts are the drafter's arg-max: q is one-hot at the draft.
      for (int i = 0; i <= n_d; i++)
        if ((rc = lks_sampling_probs(out.logits + (size_t)i * V, V, &o->sampling, p_rows + (size_t)i * V)) < 0)
          goto free_slot;
      a = 0;
      bonus = -1;
      for (; a < n_d; a++) {
        q[drafts[a]] = 1.0f;
        int32_t tok;
        int acc = lks_spec_accept_sample(p_rows + (size_t)a * V, q, V, drafts[a], o->rng, &tok);
        q[drafts[a]] = 0.0f;
        if (acc < 0) {
          rc = acc;
          goto free_slot;
        }
        if (!acc) {
          bonus = tok;
          break;
        }
      }
      if (bonus < 0) {  // every draft accepted: the bonus comes from the last row
        int t = lks_sample(out.logits + (size_t)n_d * V, V, &o->sampling, o->rng);
        if (t < 0) {
          rc = t;
          goto free_slot;
        }
        bonus = t;
      }
    }
    for (int i = 0; i < n_d; i++) {
      st->proposed[i]++;
      if (i < a) st->accepted[i]++;
    }
    const uint32_t slot0 = 0, keep = (uint32_t)(L + a + 1);
    if ((rc = lks_world_commit(w, &slot0, &keep, 1)) < 0) goto free_slot;
    if ((rc = pr->ops->after_verify(pr, &seq, L, drafts, a, bonus)) < 0) goto free_slot;
    for (int i = 0; i < a; i++)
      if ((rc = emit(&r, drafts[i])) < 0) goto free_slot;
    if ((rc = emit(&r, bonus)) < 0) goto free_slot;
    L += a + 1;
    T = bonus;
    double dt = lks_clock() - t0;
    st->rounds++;
    st->t_spec += dt;
    st->tok_spec += (uint64_t)(a + 1);
    rate_spec = rate_spec ? 0.8 * rate_spec + 0.2 * (a + 1) / dt : (a + 1) / dt;
    // The gate: while plain steps are faster, decode plainly for a while, then look again.
    if (o->gate && rate_plain > 0 && ++since_probe >= 4 && rate_spec < rate_plain) {
      plain_left = 16;
      since_probe = 0;
    }
  }
free_slot:
  if (seq.state) pr->ops->free_state(pr, seq.state);
  {
    const uint32_t slot0 = 0;
    int rc2 = lks_world_slots(w, LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT, &slot0, 1);
    if (rc == 0) rc = rc2;
  }
done:
  st->emitted = (uint64_t)r.emitted;
  free(r.hist);
  free(p_rows);
  free(q);
  return rc;
}

void lks_spec_stats_print(const lks_spec_stats *st, const char *proposer) {
  uint64_t prop = 0, acc = 0;
  for (int i = 0; i < st->k_max; i++) {
    prop += st->proposed[i];
    acc += st->accepted[i];
  }
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
  (void)prop;
  (void)acc;
}
