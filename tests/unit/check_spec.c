// SPDX-License-Identifier: MIT
// Speculative verification rules and the ladder.
// - The lossless rejection rule: drafts drawn from a synthetic drafter q, verified against a
//   synthetic target p; the emitted tokens over 200,000 draws must follow p (chi-square, 5 degrees
//   of freedom, p-value > 0.001). The same test applied to the rule without the residual
//   resampling (resampling from p instead) must fail: the test has the power to see it.
// - Greedy acceptance counts leading matches and takes the bonus from the first mismatch.
// - The ladder parses WIDTH:DRAFTS pairs and refuses malformed ones.
// - The adaptive policy's K per sequence is the argmax of expected tokens per modelled step time
//   (against a brute force over every assignment), and its measured state explores each K
//   before it trusts the costs.
// - Simulated against the roofline (drafts accepted at random, noisy step times with slow
//   stretches): at least 0.9 of the best fixed K's rate and 0.97 of plain decoding's.
#include <check.h>
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "spec/spec.h"

enum { V = 6, DRAWS = 200000 };
static const float P[V] = {0.30f, 0.25f, 0.20f, 0.10f, 0.10f, 0.05f};
static const float Q[V] = {0.05f, 0.10f, 0.40f, 0.30f, 0.10f, 0.05f};

static int draw(const float *dist, lks_rng *rng) {
  double u = lks_rng_uniform(rng), acc = 0;
  for (int i = 0; i < V; i++) {
    acc += dist[i];
    if (u < acc) return i;
  }
  return V - 1;
}

// The chi-square statistic of `draws` tokens emitted by the rule against P.
static double chi2(bool with_residual, uint64_t seed) {
  lks_rng rng;
  lks_rng_seed(&rng, seed);
  long count[V] = {0};
  for (int n = 0; n < DRAWS; n++) {
    int d = draw(Q, &rng);
    int32_t tok;
    int acc = lks_spec_accept_sample(P, Q, V, d, &rng, &tok);
    ck_assert_int_ge(acc, 0);
    if (!acc && !with_residual) tok = draw(P, &rng);  // the broken rule: ignore the residual
    count[tok]++;
  }
  double x = 0;
  for (int i = 0; i < V; i++) {
    double e = (double)DRAWS * P[i];
    x += (count[i] - e) * (count[i] - e) / e;
  }
  return x;
}

START_TEST(rejection_sampling_is_lossless) {
  // 20.52 is the 0.999 quantile of chi-square with 5 degrees of freedom.
  for (uint64_t seed = 1; seed <= 3; seed++) {
    double x = chi2(true, seed);
    ck_assert_msg(x < 20.52, "seed %llu: chi-square %.2f against the target (p < 0.001)",
                  (unsigned long long)seed, x);
  }
  double broken = chi2(false, 1);
  ck_assert_msg(broken > 100, "without the residual the statistic is only %.2f", broken);
}
END_TEST

START_TEST(rejection_edge_cases) {
  lks_rng rng;
  lks_rng_seed(&rng, 5);
  int32_t tok;
  // p == q: always accepted.
  for (int i = 0; i < 100; i++) ck_assert_int_eq(lks_spec_accept_sample(P, P, V, 2, &rng, &tok), 1);
  // A draft the target gives zero probability: always rejected, never emitted.
  float p0[V] = {0.5f, 0.5f, 0, 0, 0, 0};
  for (int i = 0; i < 100; i++) {
    ck_assert_int_eq(lks_spec_accept_sample(p0, Q, V, 3, &rng, &tok), 0);
    ck_assert(tok == 0 || tok == 1);
  }
  ck_assert_int_lt(lks_spec_accept_sample(P, Q, V, 9, &rng, &tok), 0);
  float qz[V] = {1, 0, 0, 0, 0, 0};
  ck_assert_int_lt(lks_spec_accept_sample(P, qz, V, 2, &rng, &tok), 0);  // q(d) = 0: a bug upstream
}
END_TEST

START_TEST(greedy_acceptance) {
  int32_t drafts[4] = {5, 6, 7, 8}, bonus;
  int32_t all[5] = {5, 6, 7, 8, 9}, two[5] = {5, 6, 1, 8, 9}, none[5] = {4, 6, 7, 8, 9};
  ck_assert_int_eq(lks_spec_accept_greedy(drafts, 4, all, &bonus), 4);
  ck_assert_int_eq(bonus, 9);
  ck_assert_int_eq(lks_spec_accept_greedy(drafts, 4, two, &bonus), 2);
  ck_assert_int_eq(bonus, 1);
  ck_assert_int_eq(lks_spec_accept_greedy(drafts, 4, none, &bonus), 0);
  ck_assert_int_eq(bonus, 4);
}
END_TEST

START_TEST(ladder) {
  lks_ladder l;
  ck_assert_int_eq(lks_ladder_parse("4:3,8:3,16:1,32:1", &l), 0);
  ck_assert_int_eq(l.n, 4);
  ck_assert_int_eq(lks_ladder_k(&l, 1, 4), 3);
  ck_assert_int_eq(lks_ladder_k(&l, 1, 2), 2);  // --num-drafts caps the ladder
  ck_assert_int_eq(lks_ladder_k(&l, 8, 4), 3);
  ck_assert_int_eq(lks_ladder_k(&l, 9, 4), 1);
  ck_assert_int_eq(lks_ladder_k(&l, 33, 4), 0);  // wider than the ladder: no speculation
  ck_assert_int_eq(lks_ladder_parse("", &l), 0);
  ck_assert_int_eq(lks_ladder_k(&l, 100, 4), 4);
  const char *bad[] = {"4", "4:", ":3", "4:3,2:1", "4:3;8:1", "4:99", "0:1", "4:3,"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lks_clear_error();
    ck_assert_msg(lks_ladder_parse(bad[i], &l) < 0, "'%s' accepted", bad[i]);
    ck_assert_ptr_nonnull(strstr(lks_last_error(), "--ladder"));
  }
}
END_TEST


// The policy's K against a brute force over every assignment of draft counts, with the step
// cost and expected tokens written out here from their definitions (not the policy's helpers):
// T = plain + K * draft + R * row[K] (K the deepest count, R their sum; plain alone when K = 0),
// E_i(k) = 1 + sum_{j<=k} prod_{l<=j} a_il; the policy's rate must equal the best rate and its
// assignment must reach it.
static double brute_rate(const lks_policy_costs *c, int n, const float (*acc)[LKS_MAX_DRAFTS],
                         const int *k) {
  int K = 0, R = 0;
  double e = 0;
  for (int i = 0; i < n; i++) {
    if (k[i] > K) K = k[i];
    R += k[i];
    double run = 1;
    e += 1;
    for (int j = 0; j < k[i]; j++) {
      run *= acc[i][j];
      e += run;
    }
  }
  double t = c->plain;
  if (K > 0) t += K * c->draft + R * c->row[K];
  return e / t;
}

START_TEST(policy_is_the_argmax) {
  lks_rng rng;
  lks_rng_seed(&rng, 42);
  int agree = 0, nonzero = 0;
  for (int trial = 0; trial < 3000; trial++) {
    int n = 1 + (int)(lks_rng_next(&rng) % 4), k_max = 1 + (int)(lks_rng_next(&rng) % 4);
    lks_policy_costs c = {0};
    c.plain = 0.5 + lks_rng_uniform(&rng);
    c.draft = c.plain * 0.4 * lks_rng_uniform(&rng);
    for (int K = 1; K <= k_max; K++) c.row[K] = c.plain * 0.8 * lks_rng_uniform(&rng);
    float acc[4][LKS_MAX_DRAFTS];
    int kcap[4], k[4], scratch[4];
    for (int i = 0; i < n; i++) {
      // Some sequences draft well, some badly; some have less room.
      double base = lks_rng_uniform(&rng);
      for (int j = 0; j < LKS_MAX_DRAFTS; j++)
        acc[i][j] = (float)(base * (0.7 + 0.3 * lks_rng_uniform(&rng)));
      kcap[i] = (int)(lks_rng_next(&rng) % (uint64_t)(k_max + 1));
    }
    double got = lks_policy_choose(&c, n, (const float(*)[LKS_MAX_DRAFTS])acc, kcap, k_max, k, scratch);
    // Brute force: every k_i in 0..kcap_i.
    int t[4] = {0}, total = 1;
    for (int i = 0; i < n; i++) total *= kcap[i] + 1;
    double best = 0;
    for (int idx = 0; idx < total; idx++) {
      int rest = idx;
      for (int i = 0; i < n; i++) {
        t[i] = rest % (kcap[i] + 1);
        rest /= kcap[i] + 1;
      }
      double v = brute_rate(&c, n, (const float(*)[LKS_MAX_DRAFTS])acc, t);
      if (v > best) best = v;
    }
    for (int i = 0; i < n; i++) ck_assert(k[i] >= 0 && k[i] <= kcap[i]);
    double mine = brute_rate(&c, n, (const float(*)[LKS_MAX_DRAFTS])acc, k);
    ck_assert_msg(fabs(mine - best) <= 1e-9 * best && fabs(got - best) <= 1e-9 * best,
                  "trial %d: policy rate %.12g (reported %.12g), best %.12g", trial, mine, got, best);
    agree++;
    for (int i = 0; i < n; i++) nonzero += k[i] > 0;
  }
  ck_assert_int_eq(agree, 3000);
  ck_assert_int_gt(nonzero, 100);  // the cases are not all "plain"
}
END_TEST

// The mixed batch: one sequence that drafts well and one that never does; with cheap rows the
// first verifies K and the second stays plain (its row costs nothing extra in the model).
START_TEST(policy_mixed_batch) {
  lks_policy_costs c = {0};
  c.plain = 1.0;
  c.draft = 0.05;
  for (int K = 1; K <= 3; K++) c.row[K] = 0.2;
  float acc[2][LKS_MAX_DRAFTS];
  for (int j = 0; j < LKS_MAX_DRAFTS; j++) acc[0][j] = 0.95f, acc[1][j] = 0.0f;
  int kcap[2] = {3, 3}, k[2], scratch[2];
  lks_policy_choose(&c, 2, (const float(*)[LKS_MAX_DRAFTS])acc, kcap, 3, k, scratch);
  ck_assert_int_eq(k[0], 3);
  ck_assert_int_eq(k[1], 0);
  // Expensive verify rows: plain for both.
  for (int K = 1; K <= 3; K++) c.row[K] = 2.0;
  lks_policy_choose(&c, 2, (const float(*)[LKS_MAX_DRAFTS])acc, kcap, 3, k, scratch);
  ck_assert_int_eq(k[0] + k[1], 0);
}
END_TEST

// The measured state: a plain step is measured first, then every K up to the cap is explored,
// then the costs decide; acceptance is observed only where the drafts before were accepted.
START_TEST(policy_explores_then_exploits) {
  lks_policy *p = lks_policy_new(4, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  lks_policy_seq a;
  lks_policy_seq_init(p, &a);
  lks_policy_seq *seqs[1] = {&a};
  int kcap[1] = {2}, k[1], scratch[1];
  int seen[3] = {0};
  for (int step = 0; step < 12; step++) {
    int K = lks_policy_pick(p, seqs, kcap, 1, k, scratch);
    ck_assert_int_eq(K, k[0]);
    seen[K]++;
    // Plain 10 ms; a draft 1 ms; a verify row 2 ms: K = 2 at acceptance 0.9 is the best.
    double t = 0.010 + K * 0.001 + K * 0.002;
    lks_policy_record(p, 1, K, K, K * 0.001, t);
    if (K) lks_policy_observe(p, &a, K, K);  // everything accepted
  }
  ck_assert_int_ge(seen[0], 2);
  ck_assert_int_ge(seen[1], 1);
  ck_assert_int_ge(seen[2], 2);
  ck_assert_int_eq(lks_policy_pick(p, seqs, kcap, 1, k, scratch), 2);
  const lks_policy_costs *c = lks_policy_costs_at(p, 1);
  ck_assert(fabs(c->plain - 0.010) < 1e-9 && fabs(c->draft - 0.001) < 1e-9);
  ck_assert(fabs(c->row[1] - 0.002) < 1e-9 && fabs(c->row[2] - 0.002) < 1e-9);
  // A sequence whose drafts are all rejected: its acceptance at position 1 falls, position 2
  // is never observed (the draft before it was rejected) and follows position 1. Its
  // observations join the pool's, as the scheduler's do, so the pool no longer says drafts pay
  // (a plain sequence's acceptance drifts back to the pool's, tested below).
  lks_policy_seq b;
  lks_policy_seq_init(p, &b);
  for (int i = 0; i < 30; i++) lks_policy_observe(p, &b, 2, 0);
  ck_assert(b.acc[0] < 0.05f);  // from the pool's (below 1) x0.9 a round: 0.042 after 30
  ck_assert(b.acc[1] == b.acc[0] && b.depth == 1);
  // One whose first drafts are accepted 9 times in 10 at K = 1: positions 2, 3 are never
  // observed and take position 1's acceptance, not the prior 0.6.
  lks_policy_seq g;
  lks_policy_seq_init(NULL, &g);
  for (int i = 0; i < 40; i++) lks_policy_observe(NULL, &g, 1, i % 10 ? 1 : 0);
  ck_assert(g.acc[0] > 0.75f && g.acc[1] == g.acc[0] && g.acc[2] == g.acc[0] && g.depth == 1);
  seqs[0] = &b;
  int plain = 0;
  for (int i = 0; i < 48; i++) plain += lks_policy_pick(p, seqs, kcap, 1, k, scratch) == 0;
  ck_assert_int_ge(plain, 44);  // at most the probes (two steps each) speculate
  lks_policy_free(p);
  // Hopeless costs (a draft and a verify row together cost more than a plain step): no K
  // pays even if every draft were accepted; the probes come every 512 steps, then, while each
  // leaves it so, after 1024, 2048 and 4096 (each probe's first step catches the drafter up over
  // the steps since the last: on the default model every 512 steps cost x0.963-0.974 of plain).
  p = lks_policy_new(1, LKS_MAX_DRAFTS);
  lks_policy_seq_init(p, &a);
  for (int j = 0; j < LKS_MAX_DRAFTS; j++) a.acc[j] = 1.0f;
  seqs[0] = &a;
  kcap[0] = 3;
  int spec = 0;
  for (int step = 0; step < 20000; step++) {
    int K = lks_policy_pick(p, seqs, kcap, 1, k, scratch);
    spec += K > 0;
    lks_policy_record(p, 1, K, K, K * 0.005, 0.010 + K * 0.005 + K * 0.012);
    // exploration, then two probes of two steps (and slack)
    if (step == 999) ck_assert_int_le(spec, 3 + 2 * 2 + 2);
  }
  // Exploration (six steps), then probes of two steps at 520, 1033, 2058, 4107, 8204, 12301 and
  // 16398, and slack: 22 (with a probe every 512 steps, 82).
  ck_assert_int_le(spec, 6 + 2 * 7 + 2);
  lks_policy_free(p);
}
END_TEST

// The pool, every sequence's observations, is a new sequence's start: a long memory, counting
// as several observations. A server whose drafts were right 100 rounds in a row, then wrong in
// the last 3, starts a new sequence near 1 (with the pool weighted as a sequence, 0.2, it
// started at 0.51, found no K paid and decoded plainly: the deep model's later requests).
// And a sequence that a few misses turned off drafts again after a few plain steps when the
// pool says drafts pay (it waited for a probe, 32 steps and more, before).
START_TEST(policy_pool_and_return) {
  lks_policy *p = lks_policy_new(1, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  lks_policy_seq a, b;
  lks_policy_seq_init(p, &a);
  for (int i = 0; i < 100; i++) lks_policy_observe(p, &a, 1, 1);
  for (int i = 0; i < 3; i++) lks_policy_observe(p, &a, 1, 0);
  lks_policy_seq_init(p, &b);
  ck_assert_msg(b.acc[0] > 0.9f, "a new sequence starts at %.3f", b.acc[0]);
  // Costs: plain 10 ms, a draft 1 ms, a verify row 2 ms; K = 1 pays above about 0.33.
  lks_policy_seq *seqs[1] = {&b};
  int kcap[1] = {1}, k[1], scratch[1];
  for (int step = 0; step < 12; step++) {
    int K = lks_policy_pick(p, seqs, kcap, 1, k, scratch);
    lks_policy_record(p, 1, K, K, K * 0.001, 0.010 + K * 0.003);
    if (K) lks_policy_observe(p, &b, K, K);
  }
  // Bad luck: b's acceptance is set to 0.2, so that no K pays for it now.
  for (int j = 0; j < LKS_MAX_DRAFTS; j++) b.acc[j] = 0.2f;
  ck_assert_int_eq(lks_policy_pick(p, seqs, kcap, 1, k, scratch), 0);
  int back = -1;
  for (int step = 1; step <= 30 && back < 0; step++)
    if (lks_policy_pick(p, seqs, kcap, 1, k, scratch) > 0) back = step;
  ck_assert_msg(back > 0 && back <= 12, "drafts again after %d plain steps", back);
  lks_policy_free(p);
}
END_TEST

// Costs measured before any request (as lks_sched_calibrate does: a warm-up plain step, then
// plain and K = 1..3 steps in rounds): every cost is held, and no step explores them. Plain
// 10 ms, a draft 1 ms, a verify row 5 ms: at the prior acceptance 0.6 no K pays (K = 1: 1.6
// tokens in 16 ms), at 0.9 they all do (K = 2: 2.71 in 22 ms, x1.23). A new server is
// optimistic while its pool has seen few rounds: a drafter right 9 times in 10 drafts from the
// first step on (without the optimism it decoded plainly until the first probe, 32 steps), one
// that is always wrong stops after its first round.
// Steps of the first `steps` that drafted, one sequence whose first `early` rounds are rejected
// at their first draft and every miss-th round after (miss 1: always wrong).
static int drafted_steps_after(lks_policy *p, int steps, int miss, int early) {
  lks_policy_seq a;
  lks_policy_seq_init(p, &a);
  lks_policy_seq *seqs[1] = {&a};
  int kcap[1] = {3}, k[1], scratch[1], drafted = 0, n_round = 0;
  for (int step = 0; step < steps; step++) {
    int K = lks_policy_pick(p, seqs, kcap, 1, k, scratch);
    drafted += K > 0;
    if (K) {
      bool rejected = n_round < early || (n_round - early + 1) % miss == 0;
      n_round++;
      lks_policy_observe(p, &a, K, rejected ? 0 : K);
    }
  }
  return drafted;
}

static int drafted_steps(lks_policy *p, int steps, int miss) {
  return drafted_steps_after(p, steps, miss, 0);
}

// The samples lks_sched_calibrate gives the policy: a warm-up plain step (twice as slow), then 4
// rounds of a plain step of `plain` seconds and K = 1..3 steps, a draft `draft` and a verify row
// `row` seconds each.
static void calibrated_at(lks_policy *p, double plain, double draft, double row) {
  lks_policy_record(p, 1, 0, 0, 0, 2 * plain);
  for (int round = 0; round < 4; round++) {
    lks_policy_record(p, 1, 0, 0, 0, plain);
    for (int K = 1; K <= 3; K++)
      lks_policy_record(p, 1, K, K, K * draft, plain + K * (draft + row));
  }
}

// A draft 1 ms and a verify row 5 ms.
static void calibrated(lks_policy *p, double plain) { calibrated_at(p, plain, 0.001, 0.005); }

// Steps of one sequence at width 1 whose step i costs (1 + grow * i) x (plain + K (draft + row))
// of which K draft in the drafter, its drafts right `right` times in 10 (the first of each
// round); returns how many of the steps from `from` on drafted.
static int drafted_from(lks_policy *p, int steps, int from, double grow, double plain,
                        double draft, double row, int right) {
  lks_policy_seq a;
  lks_policy_seq_init(p, &a);
  lks_policy_seq *seqs[1] = {&a};
  int kcap[1] = {3}, k[1], scratch[1], late = 0, n_round = 0;
  for (int step = 0; step < steps; step++) {
    int K = lks_policy_pick(p, seqs, kcap, 1, k, scratch);
    double scale = 1 + grow * step;
    lks_policy_record(p, 1, K, K, scale * K * draft, scale * (plain + K * (draft + row)));
    if (K) lks_policy_observe(p, &a, K, ++n_round % 10 < right ? 1 : 0);
    if (step >= from) late += K > 0;
  }
  return late;
}

// A plain cost measured while the machine ran slow: calibrated at plain 20 ms (draft 1 ms, a
// verify row 5 ms), then the machine runs at plain 10 ms, where a drafter right half the time
// does not pay (K = 1: 1.5 tokens in 16 ms). While it drafts, the policy's plain steps bring
// the plain cost back to 10 ms and it decodes plainly; with the stale 20 ms every verify row
// looked free and it drafted on.
START_TEST(policy_plain_cost_stays_fresh) {
  lks_policy *p = lks_policy_new(1, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  calibrated(p, 0.020);
  int late = drafted_from(p, 400, 300, 0, 0.010, 0.001, 0.005, 5);
  ck_assert(fabs(lks_policy_costs_at(p, 1)->plain - 0.010) < 1e-9);
  ck_assert_msg(late <= 4, "%d of the last 100 steps drafted", late);
  lks_policy_free(p);
}
END_TEST

// Every cost grows with the plain step's (a growing context, a slower stretch of a shared
// machine): calibrated at plain 10 ms, a draft 4 ms and a verify row 5 ms, where a drafter right
// 7 times in 10 does not pay (K = 1: 1.7 tokens in 19 ms against 1 in 10), then every step
// costs more and more, up to 5x after 400 steps. The policy decodes plainly but for its probes.
// With the draft and row costs kept in seconds, the plain steps' growing cost made the ones
// measured earlier look cheap (K = 1 paid, by the model, once the plain step cost 1.4x what it
// cost when they were measured), and it drafted again and again, measuring them anew each time
// (24 of the 350 steps after the 50th).
START_TEST(policy_costs_follow_the_plain_step) {
  lks_policy *p = lks_policy_new(1, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  calibrated_at(p, 0.010, 0.004, 0.005);
  int late = drafted_from(p, 400, 50, 0.01, 0.010, 0.004, 0.005, 7);
  // The probes alone: at most one every 160 steps from plain decoding here (two steps each).
  ck_assert_msg(late <= 6, "%d of the steps after the 50th drafted", late);
  lks_policy_free(p);
}
END_TEST

// One stalled probe after a long stretch of plain decoding: calibrated at plain 10 ms, a draft
// 1 ms and a verify row 3 ms (three drafts would pay x1.8 were every one accepted), then 100
// plain steps, then a one-draft probe whose step stalls by two plain steps. The row cost stays
// the calibrated one. With only the samples of the last 32 steps counted, the probe's was the
// only one left: a row cost 23 ms, no K could pay even with every draft accepted, and the probes
// came 512 steps and more apart (the deep model at local world 2 decoded plainly in every row
// of a bench's warm runs, where three drafts paid x1.25).
START_TEST(policy_one_stall_after_plain_decoding) {
  lks_policy *p = lks_policy_new(1, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  calibrated_at(p, 0.010, 0.001, 0.003);
  for (int i = 0; i < 100; i++) lks_policy_record(p, 1, 0, 0, 0, 0.010);
  lks_policy_record(p, 1, 1, 1, 0.001, 0.010 + 0.001 + 0.003 + 0.020);
  const lks_policy_costs *c = lks_policy_costs_at(p, 1);
  ck_assert_msg(fabs(c->row[1] - 0.003) < 1e-9, "a verify row costs %.4f s", c->row[1]);
  ck_assert(fabs(c->draft - 0.001) < 1e-9);
  lks_policy_free(p);
}
END_TEST

// A cold start's misses at the deeper positions: the deep model's costs at local world 2 (plain
// 20 ms, a draft 1.8 ms, a verify row 13, 11.4 and 9 ms at K = 1, 2, 3: one draft pays x1.15 and
// three x1.53 were every draft accepted), a drafter whose first two rounds miss (the first at its
// second position, as drafts right after a prompt often do), then right 9 times in 10 at every
// position. Within the first 300 steps the policy drafts three tokens in most of them: 228 with
// the deeper positions' optimism (policy.c, DEEP_Z); without it they kept what the first rounds
// had left, the probes of one draft never saw them, and three drafts ran in 5.
static double sim_u(uint64_t *s);

START_TEST(policy_probes_the_deeper_positions) {
  lks_policy *p = lks_policy_new(1, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  const double plain = 0.020, draft = 0.0018, row[4] = {0, 0.013, 0.0114, 0.009};
  lks_policy_record(p, 1, 0, 0, 0, 2 * plain);
  for (int round = 0; round < 4; round++) {
    lks_policy_record(p, 1, 0, 0, 0, plain);
    for (int K = 1; K <= 3; K++)
      lks_policy_record(p, 1, K, K, K * draft, plain + K * (draft + row[K]));
  }
  lks_policy_seq a;
  lks_policy_seq_init(p, &a);
  lks_policy_seq *seqs[1] = {&a};
  int kcap[1] = {3}, k[1], scratch[1], rounds = 0, deep = 0;
  uint64_t rs = 7;
  for (int step = 0; step < 300; step++) {
    int K = lks_policy_pick(p, seqs, kcap, 1, k, scratch);
    lks_policy_record(p, 1, K, K, K * draft, K ? plain + K * (draft + row[K]) : plain);
    if (!K) continue;
    int acc = 0;
    if (rounds++ < 2) acc = rounds == 1 && K > 1 ? 1 : 0;
    else
      while (acc < K && sim_u(&rs) < 0.9) acc++;
    lks_policy_observe(p, &a, K, acc);
    deep += K == 3;
  }
  ck_assert_msg(deep >= 150, "three drafts in %d of 300 steps", deep);
  lks_policy_free(p);
}
END_TEST

// The policy against the roofline, simulated: one sequence after another (128 tokens each, the
// policy and its pool carried over as a server's), drafts accepted independently with
// probability a at every position, a step of K drafts costing T_K = 1 + K (d + r_K) plain steps,
// each step's time times a machine speed that alternates between 1 and `slow` every 60 steps (a
// shared host's slow stretches), times uniform noise, plus stalls (sim_host). The rate is tokens
// over time after the first sequence; each fixed K (0: plain decoding) is simulated here from
// the same seed, without the policy. Targets of the speculation issue: the policy reaches 0.9 of
// the best fixed K's rate wherever it is, and never falls below 0.97 of plain decoding's. Three
// hosts, the least fraction of the best fixed K here (and of plain decoding where no K pays):
// - this project's host on a quiet hour (slow 1.2, noise +-10 %; the deep model's measured
//   ratios d 0.09, r 0.56, 0.44, 0.40): 0.954, at acceptance 0.75 (0.997 of plain);
// - a noisy hour (slow 1.5, noise +-30 %, as the host's plain decode moved within one bench run
//   of the deep model): 0.957 at 0.87 (0.982 of plain);
// - world 2 over the 20 us link (the deep model's ratios there, d 0.06, r 0.42, 0.37, 0.33; one
//   time in eight a stall of 0.6-2x a plain step on each of two steps, as its plain steps had in
//   a bench run): 0.933 at 0.55 (0.998 of plain).
// Before a draft's and a verify row's cost were the lower third of their samples (policy.c,
// ring_put; the median before) the three gave 0.944, 0.892 and 0.777 (0.75-0.87 at acceptance
// 0.55-0.87 over the link: after one stalled probe the policy decoded plainly where three drafts
// paid x1.4-1.7). Over four seeds (a harness outside the test, the same hosts) the least were
// 0.954, 0.949 and 0.925 (0.963, 0.951 and 0.922 before the deeper positions' optimism and the
// newest cost samples kept whatever their age; both within the seeds' spread). Mutations: the
// median back (0.892 on the noisy hour at 0.87); no recheck (0.873 there); a policy that never
// drafts (POLICY_MARGIN 0.5) fails at 0.75. Without the ages the test passes, 0.01-0.02 lower on
// every host over four seeds.
static double sim_u(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}
// A simulated host: slow stretches (every step's time times `slow` for 60 steps in turn),
// uniform noise of +-noise / 2, and stalls: one time in 1 / stall_p a stall begins that adds
// stall_lo..stall_hi plain steps to each of `pair` steps in a row; a draft's and a verify row's
// cost in plain steps.
typedef struct {
  double slow, noise, stall_p, stall_lo, stall_hi;
  int pair;
  double d, r[4];
} sim_host;

static double simulated_rate(const sim_host *h, double a, int fixed_k) {
  lks_policy *p = lks_policy_new(1, 3);
  ck_assert_ptr_nonnull(p);
  uint64_t rs = 42;
  long step = 0;
  int stalled = 0;
  double t_all = 0, tokens = 0;
  for (int q = 0; q < 300; q++) {
    lks_policy_seq a_seq;
    lks_policy_seq_init(p, &a_seq);
    lks_policy_seq *seqs[1] = {&a_seq};
    for (int made = 0; made < 128;) {
      int kcap[1] = {3}, k[1], scratch[1];
      int K = fixed_k >= 0 ? fixed_k : lks_policy_pick(p, seqs, kcap, 1, k, scratch);
      double speed = (step++ / 60) % 2 ? h->slow : 1.0, noise = 1 + h->noise * (sim_u(&rs) - 0.5);
      double stall = 0;
      if (stalled > 0 || (h->stall_p > 0 && sim_u(&rs) < h->stall_p)) {
        stalled = stalled > 0 ? stalled - 1 : h->pair - 1;
        stall = h->stall_lo + (h->stall_hi - h->stall_lo) * sim_u(&rs);
      }
      double t = ((1 + K * (h->d + h->r[K])) * noise + stall) * speed;
      int acc = 0;
      while (acc < K && sim_u(&rs) < a) acc++;
      if (q > 0) t_all += t, tokens += acc + 1;
      lks_policy_record(p, 1, K, K, K * h->d * speed * noise, t);
      if (K) lks_policy_observe(p, &a_seq, K, acc);
      made += acc + 1;
    }
  }
  lks_policy_free(p);
  return tokens / t_all;
}

START_TEST(policy_reaches_the_roofline) {
  const double accs[] = {0, 0.3, 0.55, 0.65, 0.7, 0.75, 0.8, 0.87, 0.93};
  const sim_host hosts[] = {
      // quiet and noisy hours of this project's host, the deep model's costs
      {.slow = 1.2, .noise = 0.2, .d = 0.09, .r = {0, 0.56, 0.44, 0.40}},
      {.slow = 1.5, .noise = 0.6, .d = 0.09, .r = {0, 0.56, 0.44, 0.40}},
      // world 2 over the 20 us link: its costs, and its steps' stalls as measured
      {.slow = 1.0, .noise = 0.15, .stall_p = 0.12, .stall_lo = 0.6, .stall_hi = 2.0, .pair = 2,
       .d = 0.06, .r = {0, 0.42, 0.37, 0.33}},
  };
  for (size_t h = 0; h < sizeof hosts / sizeof hosts[0]; h++)
    for (size_t i = 0; i < sizeof accs / sizeof accs[0]; i++) {
      const sim_host *H = &hosts[h];
      double plain = simulated_rate(H, accs[i], 0), best = plain;
      for (int K = 1; K <= 3; K++) {
        double v = simulated_rate(H, accs[i], K);
        best = v > best ? v : best;
      }
      double got = simulated_rate(H, accs[i], -1);
      ck_assert_msg(got >= 0.9 * best, "host %zu, acceptance %.2f: x%.3f of the best fixed K",
                    h, accs[i], got / best);
      ck_assert_msg(got >= 0.97 * plain, "host %zu, acceptance %.2f: x%.3f of plain decoding", h,
                    accs[i], got / plain);
    }
}
END_TEST

START_TEST(policy_first_drafts_after_calibration) {
  lks_policy *p = lks_policy_new(1, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  ck_assert(!lks_policy_measured(p, 1, 3));
  calibrated(p, 0.010);
  ck_assert(lks_policy_measured(p, 1, 3));
  ck_assert(!lks_policy_measured(p, 1, 4));
  const lks_policy_costs *c = lks_policy_costs_at(p, 1);
  ck_assert(fabs(c->plain - 0.010) < 1e-9 && fabs(c->draft - 0.001) < 1e-9);
  for (int K = 1; K <= 3; K++) ck_assert(fabs(c->row[K] - 0.005) < 1e-9);
  int good = drafted_steps(p, 30, 10);
  ck_assert_msg(good >= 28, "a good drafter drafted %d of the first 30 steps", good);
  lks_policy_free(p);
  p = lks_policy_new(1, LKS_MAX_DRAFTS);
  calibrated(p, 0.010);
  int bad = drafted_steps(p, 30, 1);
  ck_assert_msg(bad >= 1 && bad <= 2, "a drafter always wrong drafted %d of the first 30 steps",
                bad);
  lks_policy_free(p);
  // A new server whose first two rounds miss (drafts right after a prompt often do), then right
  // 9 times in 10: two misses are not yet a verdict on the drafter. The deep model's costs as
  // this session's calibration measured them (plain 35.7 ms, a draft 3.1 ms, a verify row
  // 12.7 ms: one draft pays from an acceptance of 0.48 on). With the fixed guess counting as one
  // observation the two misses took its acceptance from 0.6 to 0.2, and it decoded plainly until
  // a probe 29 steps later.
  p = lks_policy_new(1, LKS_MAX_DRAFTS);
  calibrated_at(p, 0.0357, 0.0031, 0.0127);
  int late = drafted_steps_after(p, 30, 10, 2);
  ck_assert_msg(late >= 26, "a good drafter whose first two rounds missed drafted %d of the first "
                "30 steps", late);
  lks_policy_free(p);
}
END_TEST

// The first plain step of a width is a warm-up (the default model's ran 1.5x the ones after it):
// counted, it inflated the plain cost, a one-draft step's verify row came out free, and the
// policy drafted where plain decoding was faster. Plain 1 ms (the first 2 ms), a draft 0.3 ms, a
// verify row 0.3 ms, acceptance 0.5: K = 1 makes 1.5 tokens in 1.6 ms, worse than plain.
START_TEST(policy_skips_the_warm_up_step) {
  lks_policy *p = lks_policy_new(1, LKS_MAX_DRAFTS);
  ck_assert_ptr_nonnull(p);
  lks_policy_seq a;
  lks_policy_seq_init(p, &a);
  lks_policy_seq *seqs[1] = {&a};
  int kcap[1] = {1}, k[1], scratch[1], spec = 0, plain_steps = 0;
  for (int step = 0; step < 24; step++) {
    int K = lks_policy_pick(p, seqs, kcap, 1, k, scratch);
    double t = K ? 0.0016 : plain_steps++ ? 0.001 : 0.002;
    lks_policy_record(p, 1, K, K, K * 0.0003, t);
    if (K) lks_policy_observe(p, &a, K, spec % 2 ? K : 0);  // every other round accepted
    spec += K > 0;
  }
  ck_assert(fabs(lks_policy_costs_at(p, 1)->plain - 0.001) < 1e-9);
  // The one-draft measurements, then drafts while the pool has seen fewer than 8 rounds (the
  // optimism of a new server), no more.
  ck_assert_int_le(spec, 8);
  lks_policy_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("verify");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, rejection_sampling_is_lossless);
  tcase_add_test(tc, policy_first_drafts_after_calibration);
  tcase_add_test(tc, policy_plain_cost_stays_fresh);
  tcase_add_test(tc, policy_costs_follow_the_plain_step);
  tcase_add_test(tc, rejection_edge_cases);
  tcase_add_test(tc, greedy_acceptance);
  tcase_add_test(tc, ladder);
  tcase_add_test(tc, policy_is_the_argmax);
  tcase_add_test(tc, policy_mixed_batch);
  tcase_add_test(tc, policy_explores_then_exploits);
  tcase_add_test(tc, policy_one_stall_after_plain_decoding);
  tcase_add_test(tc, policy_probes_the_deeper_positions);
  tcase_add_test(tc, policy_pool_and_return);
  tcase_add_test(tc, policy_skips_the_warm_up_step);
  tcase_add_test(tc, policy_reaches_the_roofline);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
