// SPDX-License-Identifier: MIT
// Sampling against an independent implementation of softmax(logits / T), top-k and top-p
// written here in double: the distribution lks_sampling_probs returns, and the empirical
// frequencies of lks_sample (chi-square). Also the generator's known answers, seeding, greedy,
// and, at the vocabulary size of GLM (151,552), the same tokens for the same stream as a
// straightforward sampler that sorts the whole vocabulary.
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/sample.h"
#include "testutil.h"

// ---- the reference distribution ----

// probs over V tokens: softmax(logits / T) on the top_k largest logits (0: all), then the
// smallest prefix of those, largest first, whose mass reaches top_p, renormalised.
static void ref_probs(const float *logits, int V, double T, int top_k, double top_p,
                      double *probs) {
  int *order = malloc((size_t)V * sizeof *order);
  ck_assert_ptr_nonnull(order);
  // Insertion sort, largest first; stable, so ties stay in index order.
  for (int i = 0; i < V; i++) order[i] = i;
  for (int i = 1; i < V; i++) {
    int v = order[i], j = i;
    for (; j > 0 && logits[order[j - 1]] < logits[v]; j--) order[j] = order[j - 1];
    order[j] = v;
  }
  int keep = top_k > 0 && top_k < V ? top_k : V;
  double mx = logits[order[0]], sum = 0;
  double *e = calloc((size_t)V, sizeof *e);
  ck_assert_ptr_nonnull(e);
  for (int i = 0; i < keep; i++) sum += e[i] = exp(((double)logits[order[i]] - mx) / T);
  int nucleus = keep;
  if (top_p < 1) {
    double acc = 0;
    for (nucleus = 0; nucleus < keep;) {
      acc += e[nucleus++] / sum;
      if (acc >= top_p) break;
    }
  }
  double s2 = 0;
  for (int i = 0; i < nucleus; i++) s2 += e[i];
  for (int i = 0; i < V; i++) probs[i] = 0;
  for (int i = 0; i < nucleus; i++) probs[order[i]] = e[i] / s2;
  free(e);
  free(order);
}

START_TEST(test_ref_probs_sorts) {
  // The reference's own ordering: a stable descending sort.
  const float l[] = {0.1f, 3, -1, 3, 2, 0.1f};
  double p[6];
  ref_probs(l, 6, 1.0, 2, 1.0, p);
  ck_assert(p[1] > 0 && p[3] > 0 && p[0] == 0 && p[2] == 0 && p[4] == 0 && p[5] == 0);
  ck_assert_double_eq_tol(p[1], 0.5, 1e-15);
  ref_probs(l, 6, 1.0, 3, 1.0, p);
  ck_assert(p[4] > 0 && p[0] == 0 && p[5] == 0);
}
END_TEST

// ---- the generator ----

START_TEST(test_rng_known_answers) {
  // xoshiro256** from state {1, 2, 3, 4} (the reference implementation's first outputs).
  lks_rng r = {{1, 2, 3, 4}};
  ck_assert_uint_eq(lks_rng_next(&r), 11520u);
  ck_assert_uint_eq(lks_rng_next(&r), 0u);
  ck_assert_uint_eq(lks_rng_next(&r), 1509978240u);
  ck_assert_uint_eq(lks_rng_next(&r), 1215971899390074240u);
  // Seeding is splitmix64: seed 0 gives its well-known first four outputs.
  lks_rng_seed(&r, 0);
  ck_assert_uint_eq(r.s[0], 0xe220a8397b1dcdafu);
  ck_assert_uint_eq(r.s[1], 0x6e789e6aa1b965f4u);
  ck_assert_uint_eq(r.s[2], 0x06c45d188009454fu);
  ck_assert_uint_eq(r.s[3], 0xf88bb8a8724c81ecu);
}
END_TEST

START_TEST(test_rng_uniform) {
  lks_rng r;
  lks_rng_seed(&r, 7);
  double sum = 0;
  int below_half = 0;
  const int N = 200000;
  for (int i = 0; i < N; i++) {
    double u = lks_rng_uniform(&r);
    ck_assert(u >= 0.0 && u < 1.0);
    sum += u;
    below_half += u < 0.5;
  }
  // Mean 1/2 with sd sqrt(1/12/N) ~ 6.5e-4; count sd sqrt(N)/2 ~ 224.
  ck_assert_double_le(fabs(sum / N - 0.5), 0.005);
  ck_assert_int_le(abs(below_half - N / 2), 2000);
}
END_TEST

// ---- arg-max and greedy ----

START_TEST(test_argmax_ties) {
  const float a[] = {1, 3, 3, 2};
  ck_assert_int_eq(lks_argmax(a, 4), 1);
  const float b[] = {5, 5, 5};
  ck_assert_int_eq(lks_argmax(b, 3), 0);
  const float c[] = {-4, -2, -3, -2};
  ck_assert_int_eq(lks_argmax(c, 4), 1);
  const float d[] = {0, 0, 0, 1};
  ck_assert_int_eq(lks_argmax(d, 4), 3);
  ck_assert_int_eq(lks_argmax(d, 1), 0);
}
END_TEST

START_TEST(test_greedy) {
  const float l[] = {0.5f, 2, -1, 2, 1.9f};
  lks_sampling g = {0, 0, 1};
  // Greedy needs no generator, whatever top-k and top-p say.
  ck_assert_int_eq(lks_sample(l, 5, &g, NULL), 1);
  g.top_k = 3;
  g.top_p = 0.1f;
  ck_assert_int_eq(lks_sample(l, 5, &g, NULL), 1);
  float p[5];
  ck_assert_int_eq(lks_sampling_probs(l, 5, &g, p), 0);
  for (int i = 0; i < 5; i++) ck_assert_float_eq(p[i], i == 1 ? 1.0f : 0.0f);
  // A temperature so small that one token holds all the mass draws that token.
  lks_sampling cold = {1e-3f, 0, 1};
  const float m[] = {0.5f, 2, -1, 1.9f};
  lks_rng r;
  lks_rng_seed(&r, 3);
  for (int i = 0; i < 100; i++) ck_assert_int_eq(lks_sample(m, 4, &cold, &r), 1);
}
END_TEST

// ---- the distribution ----

static const struct {
  float T;
  int top_k;
  float top_p;
} cases[] = {
    {1.0f, 0, 1.0f}, {0.7f, 0, 1.0f}, {2.0f, 0, 1.0f},  {1.0f, 50, 1.0f}, {0.8f, 1, 1.0f},
    {1.0f, 0, 0.9f}, {0.5f, 0, 0.5f}, {1.3f, 40, 0.7f}, {1.0f, 0, 0.0f},  {1.0f, 5000, 1.0f},
};

START_TEST(test_probs_random) {
  const int V = 1000;
  uint64_t rng = 50 + (uint64_t)_i;
  float *l = malloc(V * sizeof *l), *p = malloc(V * sizeof *p);
  double *ref = malloc(V * sizeof *ref);
  for (int i = 0; i < V; i++) l[i] = 6.0f * tu_randf(&rng);
  lks_sampling s = {cases[_i].T, cases[_i].top_k, cases[_i].top_p};
  ck_assert_int_eq(lks_sampling_probs(l, V, &s, p), 0);
  ref_probs(l, V, s.temperature, s.top_k, s.top_p, ref);
  double sum = 0;
  int nz = 0, ref_nz = 0;
  for (int i = 0; i < V; i++) {
    ck_assert(isfinite(p[i]) && p[i] >= 0);
    sum += p[i];
    nz += p[i] > 0;
    ref_nz += ref[i] > 0;
    // Zero exactly where the reference is zero; equal (to float rounding) elsewhere.
    ck_assert_msg((p[i] > 0) == (ref[i] > 0), "case %d token %d: %g vs %g", _i, i, p[i], ref[i]);
    ck_assert_msg(fabs(p[i] - ref[i]) <= 1e-6 * ref[i] + 1e-9, "case %d token %d: %.9g vs %.9g",
                  _i, i, p[i], ref[i]);
  }
  ck_assert_double_le(fabs(sum - 1.0), 1e-5);
  ck_assert_int_eq(nz, ref_nz);
  if (s.top_k > 0 && s.top_k < V && s.top_p >= 1) ck_assert_int_eq(nz, s.top_k);
  free(l);
  free(p);
  free(ref);
}
END_TEST

START_TEST(test_nucleus_prefix) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at T = 1 (shuffled over the ids).
  const float l[] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
  static const struct {
    float top_p;
    int keep;
  } want[] = {{0.4f, 1}, {0.75f, 2}, {0.85f, 3}, {0.97f, 4}, {1.0f, 4}};
  for (int c = 0; c < 5; c++) {
    lks_sampling s = {1.0f, 0, want[c].top_p};
    float p[4];
    ck_assert_int_eq(lks_sampling_probs(l, 4, &s, p), 0);
    const int by_rank[] = {1, 3, 0, 2};
    const double mass[] = {0.5, 0.3, 0.15, 0.05};
    double kept = 0;
    for (int r = 0; r < want[c].keep; r++) kept += mass[r];
    for (int r = 0; r < 4; r++) {
      double expect = r < want[c].keep ? mass[r] / kept : 0;
      ck_assert_msg(fabs(p[by_rank[r]] - expect) < 1e-6, "top_p %g rank %d: %g, want %g",
                    want[c].top_p, r, p[by_rank[r]], expect);
    }
  }
  // top-k first, then top-p over the renormalised top-k: with k = 2 the kept mass is 0.8, so
  // top_p 0.6 needs 0.5 / 0.8 = 0.625 alone.
  lks_sampling s = {1.0f, 2, 0.6f};
  float p[4];
  ck_assert_int_eq(lks_sampling_probs(l, 4, &s, p), 0);
  ck_assert_float_eq_tol(p[1], 1.0f, 1e-6f);
  s.top_p = 0.7f;
  ck_assert_int_eq(lks_sampling_probs(l, 4, &s, p), 0);
  ck_assert_float_eq_tol(p[1], 0.625f, 1e-6f);
  ck_assert_float_eq_tol(p[3], 0.375f, 1e-6f);
}
END_TEST

// ---- draws ----

START_TEST(test_seeds) {
  const int V = 50, N = 200;
  uint64_t g = 9;
  float l[50];
  for (int i = 0; i < V; i++) l[i] = tu_randf(&g);
  lks_sampling s = {1.0f, 0, 1.0f};
  int a[200], b[200], c[200];
  lks_rng r1, r2, r3;
  lks_rng_seed(&r1, 42);
  lks_rng_seed(&r2, 42);
  lks_rng_seed(&r3, 43);
  int differ = 0;
  for (int i = 0; i < N; i++) {
    a[i] = lks_sample(l, V, &s, &r1);
    b[i] = lks_sample(l, V, &s, &r2);
    c[i] = lks_sample(l, V, &s, &r3);
    ck_assert(a[i] >= 0 && a[i] < V && c[i] >= 0 && c[i] < V);
    differ += a[i] != c[i];
  }
  ck_assert_mem_eq(a, b, sizeof a);
  // Flat logits over 50 tokens: two independent streams agree on ~1/50 of the draws.
  ck_assert_int_gt(differ, N / 2);
}
END_TEST

// Chi-square statistic of `counts` of N draws against ref (only tokens ref keeps; a draw of a
// token ref excludes fails). Returns it and the degrees of freedom.
static double chi_square(const int *counts, const double *ref, int V, int N, int *df) {
  double chi = 0;
  int kept = 0;
  for (int i = 0; i < V; i++) {
    if (ref[i] == 0) {
      ck_assert_msg(counts[i] == 0, "token %d drawn %d times outside the kept set", i, counts[i]);
      continue;
    }
    kept++;
    double e = N * ref[i];
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  *df = kept - 1;
  return chi;
}

static const struct {
  int V;
  float logits[12];
  float T;
  int top_k;
  float top_p;
} draw_cases[] = {
    {8, {1.0f, 0.8f, 0.5f, 0.2f, 0, -0.3f, -0.6f, -1.0f}, 0.5f, 0, 1.0f},
    {8, {1.0f, 0.8f, 0.5f, 0.2f, 0, -0.3f, -0.6f, -1.0f}, 2.0f, 0, 1.0f},
    {8, {-1.0f, 0.2f, 1.0f, -0.3f, 0.8f, 0, 0.5f, -0.6f}, 1.0f, 0, 1.0f},
    {12, {0.3f, 2, -1, 1.2f, 0.9f, -3, 1.7f, 0, 0.5f, 1.1f, -0.2f, 1.4f}, 0.8f, 6, 1.0f},
    {12, {0.3f, 2, -1, 1.2f, 0.9f, -3, 1.7f, 0, 0.5f, 1.1f, -0.2f, 1.4f}, 1.5f, 0, 0.8f},
    {12, {0.3f, 2, -1, 1.2f, 0.9f, -3, 1.7f, 0, 0.5f, 1.1f, -0.2f, 1.4f}, 0.7f, 8, 0.9f},
};

// 20000 draws against the reference distribution. A chi-square of 60 with at most 11 degrees
// of freedom has probability below 1e-8 for a correct sampler; ignoring the temperature of case
// 0 gives about 7000.
START_TEST(test_frequencies) {
  const int N = 20000;
  int V = draw_cases[_i].V;
  lks_sampling s = {draw_cases[_i].T, draw_cases[_i].top_k, draw_cases[_i].top_p};
  double ref[12];
  ref_probs(draw_cases[_i].logits, V, s.temperature, s.top_k, s.top_p, ref);
  int counts[12] = {0};
  lks_rng r;
  lks_rng_seed(&r, 1000 + (uint64_t)_i);
  for (int i = 0; i < N; i++) {
    int t = lks_sample(draw_cases[_i].logits, V, &s, &r);
    ck_assert(t >= 0 && t < V);
    counts[t]++;
  }
  int df;
  double chi = chi_square(counts, ref, V, N, &df);
  ck_assert_int_le(df, 11);
  ck_assert_msg(chi < 60, "case %d: chi-square %g with %d degrees of freedom", _i, chi, df);
  // The statistic discriminates: the same counts against softmax(logits) at T = 1 without
  // truncation (what a sampler ignoring the settings draws from) are far off; case 2 is that.
  if (_i != 2) {
    double wrong[12];
    ref_probs(draw_cases[_i].logits, V, 1.0, 0, 1.0, wrong);
    double chi_wrong = 0;
    for (int i = 0; i < V; i++) {
      double e = N * wrong[i];
      chi_wrong += (counts[i] - e) * (counts[i] - e) / e;
    }
    ck_assert_msg(chi_wrong > 200, "case %d: chi-square against T = 1 untruncated only %g", _i,
                  chi_wrong);
  }
}
END_TEST

// ---- against a full sort at real vocabulary sizes ----

typedef struct {
  float l;
  int i;
} fs_pair;

static int fs_cmp(const void *pa, const void *pb) {
  const fs_pair *a = pa, *b = pb;
  if (a->l != b->l) return a->l > b->l ? -1 : 1;
  return a->i - b->i;
}

// The straightforward sampler: sort the whole vocabulary (largest first, ties to the lower id),
// softmax in double over the top_k, the nucleus prefix, renormalised; probabilities as float.
static void full_sort_probs(const float *logits, int V, const lks_sampling *s, float *probs) {
  fs_pair *o = malloc((size_t)V * sizeof *o);
  double *e = malloc((size_t)V * sizeof *e);
  ck_assert(o && e);
  for (int i = 0; i < V; i++) o[i] = (fs_pair){logits[i], i};
  qsort(o, (size_t)V, sizeof *o, fs_cmp);
  int keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
  double sum = 0;
  for (int i = 0; i < keep; i++) sum += e[i] = exp(((double)o[i].l - o[0].l) / s->temperature);
  if (s->top_p < 1) {
    double acc = 0;
    int k = 0;
    while (k < keep) {
      acc += e[k++] / sum;
      if (acc >= s->top_p) break;
    }
    keep = k;
    sum = 0;
    for (int i = 0; i < keep; i++) sum += e[i];
  }
  memset(probs, 0, (size_t)V * sizeof *probs);
  for (int i = 0; i < keep; i++) probs[o[i].i] = (float)(e[i] / sum);
  free(o);
  free(e);
}

// The draw: the first token, in id order, whose cumulative probability exceeds u.
static int full_sort_draw(const float *probs, int V, lks_rng *r) {
  double u = lks_rng_uniform(r), acc = 0;
  int last = 0;
  for (int i = 0; i < V; i++) {
    if (probs[i] <= 0) continue;
    last = i;
    acc += probs[i];
    if (u < acc) return i;
  }
  return last;
}

static const struct {
  int V;
  float T;
  int top_k;
  float top_p;
  float body;  // the logits' body: uniform in [-body, body)
  bool peaks;  // and a few dozen much larger ones
} fs_cases[] = {
    {151552, 1.0f, 0, 1.0f, 3, true},  {151552, 0.7f, 0, 0.95f, 3, true},
    {151552, 0.6f, 40, 1.0f, 3, true}, {151552, 1.0f, 50, 0.9f, 3, true},
    {151552, 1.2f, 0, 0.5f, 3, true},  {151552, 0.8f, 20000, 0.99f, 3, true},
    {151552, 1.0f, 1, 1.0f, 3, true},  {1000, 1.0f, 0, 0.999f, 3, true},
    {7, 0.9f, 3, 0.8f, 3, true},
    // Top-p's two ways at this size: nearly flat logits (an untrained model's) keep most of the
    // vocabulary (sample.c's bins); a broad body without peaks takes several rounds of the
    // threshold before few enough remain; and one where they never do (the bins again).
    {151552, 1.0f, 0, 0.95f, 0.1f, false}, {151552, 1.0f, 0, 0.5f, 0.1f, false},
    {151552, 0.5f, 0, 0.9f, 6, false},     {151552, 1.0f, 0, 0.99f, 2, false},
};

// Logits like a language model's: a broad body and a few dozen much larger ones, with ties.
START_TEST(test_full_sort_same_tokens) {
  int V = fs_cases[_i].V;
  lks_sampling s = {fs_cases[_i].T, fs_cases[_i].top_k, fs_cases[_i].top_p};
  uint64_t g = 900 + (uint64_t)_i;
  float *l = malloc((size_t)V * sizeof *l), *ref = malloc((size_t)V * sizeof *ref);
  float *got = malloc((size_t)V * sizeof *got);
  ck_assert(l && ref && got);
  for (int i = 0; i < V; i++) l[i] = fs_cases[_i].body * tu_randf(&g);
  if (fs_cases[_i].peaks)
    for (int i = 0; i < 40 && i < V; i++)
      l[tu_rand(&g) % (uint64_t)V] = 10.0f + 4.0f * tu_randf(&g);
  for (int i = 0; i < 10 && i < V; i++) l[tu_rand(&g) % (uint64_t)V] = l[tu_rand(&g) % (uint64_t)V];
  full_sort_probs(l, V, &s, ref);
  ck_assert_int_eq(lks_sampling_probs(l, V, &s, got), 0);
  for (int i = 0; i < V; i++)
    ck_assert_msg((got[i] > 0) == (ref[i] > 0) && fabsf(got[i] - ref[i]) <= 1e-6f * ref[i] + 1e-12f,
                  "case %d token %d: %.9g, full sort %.9g", _i, i, got[i], ref[i]);
  lks_rng a, b;
  lks_rng_seed(&a, 77 + (uint64_t)_i);
  lks_rng_seed(&b, 77 + (uint64_t)_i);
  for (int d = 0; d < 300; d++) {
    int want = full_sort_draw(ref, V, &a), t = lks_sample(l, V, &s, &b);
    ck_assert_msg(t == want, "case %d draw %d: token %d, full sort %d", _i, d, t, want);
  }
  free(l);
  free(ref);
  free(got);
}
END_TEST

// Top-p where sample.c's threshold is nearly tight: one peak, one token slightly above the rest,
// and the rest, all equal, holding just under 1 - top_p of the mass. The nucleus is the peak and
// that token, whose weight is within 2.1x of the bound ((1 - top_p) sum / V: no token lighter can
// be in the nucleus), so a bound a few times too high drops it. (The random logits above leave
// the bound orders of magnitude below the nucleus's edge.)
START_TEST(test_nucleus_tight_threshold) {
  const int V = 151552;
  const double top_p = 0.9, d = 0.7;  // the second token's logit; the rest are 0
  // The peak's weight e^L midway between the two edges: e^L < top_p S <= e^L + e^d.
  double eL = (top_p * (exp(d) + V - 2) - exp(d) / 2) / (1 - top_p);
  float *l = calloc((size_t)V, sizeof *l), *got = malloc((size_t)V * sizeof *got);
  float *ref = malloc((size_t)V * sizeof *ref);
  ck_assert(l && got && ref);
  const int peak = 77777, second = 123;
  l[peak] = (float)log(eL);
  l[second] = (float)d;
  // The float logits kept the setup (rounding moves e^L by under 5e-7 of it: about 0.7 here).
  double e1 = exp((double)l[peak]), e2 = exp((double)l[second]), S = e1 + e2 + (V - 2);
  ck_assert(e1 < top_p * S && e1 + e2 >= top_p * S);
  lks_sampling s = {1.0f, 0, (float)top_p};
  full_sort_probs(l, V, &s, ref);
  ck_assert(ref[peak] > 0 && ref[second] > 0 && ref[0] == 0);
  ck_assert_int_eq(lks_sampling_probs(l, V, &s, got), 0);
  for (int i = 0; i < V; i++)
    ck_assert_msg((got[i] > 0) == (ref[i] > 0) && fabsf(got[i] - ref[i]) <= 1e-6f * ref[i],
                  "token %d: %.9g, full sort %.9g", i, got[i], ref[i]);
  free(l);
  free(got);
  free(ref);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sample");
  TCase *tc = tcase_create("rng");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_ref_probs_sorts);
  tcase_add_test(tc, test_rng_known_answers);
  tcase_add_test(tc, test_rng_uniform);
  suite_add_tcase(s, tc);

  tc = tcase_create("greedy");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_argmax_ties);
  tcase_add_test(tc, test_greedy);
  suite_add_tcase(s, tc);

  tc = tcase_create("distribution");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_probs_random, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, test_nucleus_prefix);
  suite_add_tcase(s, tc);

  tc = tcase_create("draws");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_seeds);
  tcase_add_loop_test(tc, test_frequencies, 0, (int)(sizeof draw_cases / sizeof draw_cases[0]));
  suite_add_tcase(s, tc);

  tc = tcase_create("full_sort");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_full_sort_same_tokens, 0,
                      (int)(sizeof fs_cases / sizeof fs_cases[0]));
  tcase_add_test(tc, test_nucleus_tight_threshold);
  suite_add_tcase(s, tc);

  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
