// SPDX-License-Identifier: MIT
// Speculative verification rules and the ladder.
// - The lossless rejection rule: drafts drawn from a synthetic drafter q, verified against a
//   synthetic target p; the emitted tokens over 200,000 draws must follow p (chi-square, 5 degrees
//   of freedom, p-value > 0.001). The same test applied to the rule without the residual
//   resampling (resampling from p instead) must fail: the test has the power to see it.
// - Greedy acceptance counts leading matches and takes the bonus from the first mismatch.
// - The ladder parses WIDTH:DRAFTS pairs and refuses malformed ones.
#include <check.h>
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

int main(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("verify");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, rejection_sampling_is_lossless);
  tcase_add_test(tc, rejection_edge_cases);
  tcase_add_test(tc, greedy_acceptance);
  tcase_add_test(tc, ladder);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
