// SPDX-License-Identifier: MIT
// The logit processors and logprob reports of coordinator/logits.h against a plain dense
// implementation written here (counts of every token in an array of the vocabulary, log_softmax
// in double over a sorted copy): random rows, sequences with repeats, biases, each processor
// alone and all together; the counts a verify row sees after its earlier drafts equal those of
// the same tokens generated; the scratch array is left zero; the top alternatives best first with
// ties to the lower id; and, at GLM's vocabulary, the normaliser lks_logsumexp.
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/logits.h"
#include "model/sample.h"
#include "testutil.h"

static uint64_t g = 88172645463325252ull;
static double urand(void) {
  g ^= g << 13;
  g ^= g >> 7;
  g ^= g << 17;
  return (double)(g >> 11) * 0x1.0p-53;
}

// The reference: every processor over dense counts of seq[0, n) (the first n_prompt the prompt).
static void ref_apply(const lks_logit_params *p, const int32_t *seq, int n_prompt, int n,
                      double *x, int V) {
  int *cnt = calloc((size_t)V, sizeof *cnt), *seen = calloc((size_t)V, sizeof *seen);
  ck_assert_ptr_nonnull(cnt);
  ck_assert_ptr_nonnull(seen);
  for (int i = 0; i < p->n_bias; i++) x[p->bias_ids[i]] = (float)(x[p->bias_ids[i]] + p->bias[i]);
  for (int i = 0; i < n; i++) seen[seq[i]] = 1;
  for (int i = n_prompt; i < n; i++) cnt[seq[i]]++;
  for (int t = 0; t < V; t++) {
    if (p->repetition > 0 && p->repetition != 1 && seen[t])
      x[t] = (float)(x[t] > 0 ? x[t] / p->repetition : x[t] * p->repetition);
    if (cnt[t]) x[t] = (float)((float)(x[t] - p->frequency * (float)cnt[t]) - p->presence);
  }
  free(cnt);
  free(seen);
}

static void check_case(int V, const lks_logit_params *p, int n_prompt, int n_gen, int n_extra) {
  int n = n_prompt + n_gen + n_extra;
  int32_t *seq = malloc((size_t)n * sizeof *seq), *scratch = calloc((size_t)V, sizeof *scratch);
  float *row = malloc((size_t)V * sizeof *row);
  double *want = malloc((size_t)V * sizeof *want);
  ck_assert(seq && scratch && row && want);
  for (int i = 0; i < n; i++) seq[i] = (int32_t)(urand() * (urand() < 0.5 ? 12 : V));  // repeats
  for (int t = 0; t < V; t++) want[t] = row[t] = (float)(urand() * 20 - 10);
  ref_apply(p, seq, n_prompt, n, want, V);
  // The last n_extra tokens as a verify row's earlier drafts.
  lks_logits_apply(p, seq, n_prompt, n_prompt + n_gen, seq + n_prompt + n_gen, n_extra, row, V,
                   scratch);
  for (int t = 0; t < V; t++) ck_assert_msg(fabs(row[t] - want[t]) <= 1e-5 * (1 + fabs(want[t])),
                                            "token %d: %g, want %g", t, row[t], want[t]);
  for (int t = 0; t < V; t++) ck_assert_int_eq(scratch[t], 0);
  free(seq);
  free(scratch);
  free(row);
  free(want);
}

START_TEST(test_each_processor) {
  int32_t ids[] = {3, 17, 200, 999};
  float bias[] = {100, -100, 2.5f, -0.25f};
  lks_logit_params ps[] = {
      {.presence = 0.7f},
      {.frequency = 1.5f},
      {.frequency = -2.0f},
      {.presence = -1, .frequency = 0.3f},
      {.repetition = 1.3f},
      {.repetition = 0.6f},
      {.n_bias = 4, .bias_ids = ids, .bias = bias},
      {.presence = 0.5f, .frequency = 0.5f, .repetition = 2, .n_bias = 4, .bias_ids = ids, .bias = bias},
  };
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    check_case(1000, &ps[i], 30, 50, 0);
    check_case(1000, &ps[i], 30, 50, 3);   // drafts after the generated tokens
    check_case(1000, &ps[i], 1, 0, 4);     // only drafts
    check_case(1000, &ps[i], 40, 0, 0);    // the first token
  }
}
END_TEST

START_TEST(test_processed_and_needed) {
  lks_logit_params none = {0}, rep1 = {.repetition = 1}, lp = {.logprobs = true};
  ck_assert(!lks_logits_processed(&none) && !lks_logits_needed(&none));
  ck_assert(!lks_logits_processed(&rep1));
  ck_assert(!lks_logits_processed(&lp) && lks_logits_needed(&lp));
  lks_logit_params pr = {.presence = 0.1f};
  ck_assert(lks_logits_processed(&pr) && lks_logits_needed(&pr));
}
END_TEST

// log_softmax and the k best by a sort in double.
START_TEST(test_logprobs) {
  for (int V = 5; V <= 151552; V *= 13) {
    float *row = malloc((size_t)V * sizeof *row);
    ck_assert_ptr_nonnull(row);
    for (int t = 0; t < V; t++) row[t] = (float)(urand() * 30 - 15);
    row[V / 2] = row[V / 3];  // a tie: the lower id first
    double m = -INFINITY, s = 0;
    for (int t = 0; t < V; t++) m = row[t] > m ? row[t] : m;
    for (int t = 0; t < V; t++) s += exp(row[t] - m);
    double lse = m + log(s);
    ck_assert_msg(fabs(lks_logsumexp(row, V) - lse) < 1e-5, "V %d: logsumexp %.9g, want %.9g", V,
                  lks_logsumexp(row, V), lse);
    for (int k = 0; k <= LKS_MAX_TOP_LOGPROBS; k += 4) {
      lks_tok_logprob r;
      int tok = (int)(urand() * V);
      lks_logprobs_row(row, V, tok, k, &r);
      ck_assert(fabs(r.lp - (row[tok] - lse)) < 1e-5);
      int want_n = k < V ? k : V;
      ck_assert_int_eq(r.n_top, want_n);
      for (int j = 0; j < r.n_top; j++) {
        // The j-th best: how many are better, or equal with a lower id, must be j.
        int better = 0, id = r.top_id[j];
        for (int t = 0; t < V; t++) better += row[t] > row[id] || (row[t] == row[id] && t < id);
        ck_assert_int_eq(better, j);
        ck_assert(fabs(r.top_lp[j] - (row[id] - lse)) < 1e-5);
      }
    }
    free(row);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("logits");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_each_processor);
  tcase_add_test(tc, test_processed_and_needed);
  tcase_add_test(tc, test_logprobs);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
