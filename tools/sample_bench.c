// SPDX-License-Identifier: MIT
// Sampling speed at GLM's vocabulary size: ms per token of lks_sample against the full-sort
// sampler it replaced (kept here verbatim as "before"), on the same logits in one run, for greedy,
// temperature, top-k and top-p settings; then what a request's logit processing adds per row
// (coordinator/logits.h: the copy of the row and every processor, over a 2,048-token sequence
// with 300 biases) and its logprobs report. Medians of repeated timings.
//   build/sample_bench [V] [repeats]
// With --json TOKENIZER (a tokenizer.json or its directory): JSON mode's cost per token at that
// vocabulary: building the token trie once, then for every token of a JSON reply (encoded with
// the tokenizer) the mask for the grammar's state there (lks_json_mask) and the masked copy of a
// row of logits, as the scheduler does before it samples; mean and worst ms per token.
//   build/sample_bench --json DIR [repeats]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "coordinator/logits.h"
#include "model/sample.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// ---- before: sort the whole vocabulary ----

static const float *sort_keys;
static int by_logit_desc(const void *a, const void *b) {
  int i = *(const int *)a, j = *(const int *)b;
  if (sort_keys[i] != sort_keys[j]) return sort_keys[i] > sort_keys[j] ? -1 : 1;
  return i - j;
}

static int before_argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static int before_sample(const float *logits, int V, const lks_sampling *p, lks_rng *rng) {
  if (p->temperature <= 0) return before_argmax(logits, V);
  float *probs = calloc((size_t)V, sizeof *probs);
  int *idx = malloc((size_t)V * sizeof *idx);
  for (int i = 0; i < V; i++) idx[i] = i;
  sort_keys = logits;
  qsort(idx, (size_t)V, sizeof *idx, by_logit_desc);
  int keep = p->top_k > 0 && p->top_k < V ? p->top_k : V;
  double mx = logits[idx[0]], sum = 0;
  for (int i = 0; i < keep; i++) sum += exp(((double)logits[idx[i]] - mx) / p->temperature);
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
  return tok >= 0 ? tok : last;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef int (*sampler)(const float *, int, const lks_sampling *, lks_rng *);

// Median over `repeats` of the mean ms per token of `draws` draws, each on a fresh row of logits.
static double ms_per_token(sampler f, float *const *rows, int n_rows, int V, const lks_sampling *p,
                           int draws, int repeats, int *check) {
  double *t = malloc((size_t)repeats * sizeof *t);
  lks_rng r;
  lks_rng_seed(&r, 1);
  for (int k = 0; k < repeats; k++) {
    double t0 = now();
    for (int d = 0; d < draws; d++) *check += f(rows[d % n_rows], V, p, &r);
    t[k] = (now() - t0) / draws * 1e3;
  }
  qsort(t, (size_t)repeats, sizeof *t, cmp_double);
  double m = t[repeats / 2];
  free(t);
  return m;
}

// A reply of the kind JSON mode produces: nested objects and arrays, escapes, non-ASCII text,
// numbers, literals, indentation.
static const char json_doc[] =
    "{\n  \"name\": \"lockstep\",\n  \"version\": \"0.4.1\",\n  \"models\": [\"GLM-4.5\", "
    "\"GLM-4.6\", \"GLM-4.5-Air\"],\n  \"limits\": {\"max_tokens\": 4096, \"temperature\": 0.7, "
    "\"top_p\": 0.95, \"ratio\": -1.5e-3},\n  \"features\": {\"spec\": true, \"mtp\": null, "
    "\"ngram\": false},\n  \"description\": \"Serve large MoE models \\\"in lockstep\\\" across "
    "machines; \u00e9t\u00e9 \u4e2d\u6587 caf\u00e9 \\u00e9 \\n\",\n  \"authors\": [{\"id\": 1, "
    "\"tags\": [[], {}, [1, 2, 3]]}]\n}";

static volatile float sink;

static int json_bench(const char *path, int repeats) {
  lks_tokenizer *t = lks_tokenizer_load(path);
  if (!t) {
    fprintf(stderr, "%s\n", lks_last_error());
    return 1;
  }
  int V = lks_tokenizer_n_ids(t);
  int32_t eos = V - 1;
  double t0 = now();
  lks_json_vocab *v = lks_json_vocab_new(t, V, &eos, 1);
  double build = now() - t0;
  int32_t *ids;
  int n;
  if (!v || lks_tokenizer_encode(t, json_doc, sizeof json_doc - 1, false, &ids, &n) < 0) return 1;
  uint64_t *mask = calloc((size_t)lks_json_mask_words(v), sizeof *mask);
  lks_json_cache *cache = lks_json_cache_new(v, 64);  // as the scheduler keeps it
  float *row = malloc((size_t)V * sizeof *row), *out = malloc((size_t)V * sizeof *out);
  for (int i = 0; i < V; i++) row[i] = (float)(i % 97) * 0.01f;
  double worst = 0, total = 0, worst_c = 0, total_c = 0;
  double *dts = malloc((size_t)n * repeats * sizeof *dts), *dts_c = malloc((size_t)n * repeats * sizeof *dts_c);
  int n_dt = 0, n_dt_c = 0;
  long allowed = 0;
  for (int rep = 0; rep < 2 * repeats; rep++) {
    bool cached = rep >= repeats;  // the first passes without the cache, the others through it
    if (cached) lks_json_cache_free(cache), cache = lks_json_cache_new(v, 64);
    lks_json_state s;
    lks_json_init(&s, true);
    for (int i = 0; i < n; i++) {
      double a = now();
      allowed += cached ? lks_json_cache_mask(cache, &s, n - i + 8, mask)
                        : lks_json_mask(v, &s, n - i + 8, mask);
      for (int k = 0; k < V; k++) out[k] = (mask[k >> 6] >> (k & 63) & 1) ? row[k] : -INFINITY;
      double dt = now() - a;
      *(cached ? &total_c : &total) += dt;
      if (cached) dts_c[n_dt_c++] = dt;
      else dts[n_dt++] = dt;
      if (dt > *(cached ? &worst_c : &worst)) *(cached ? &worst_c : &worst) = dt;
      if (!lks_json_advance(v, &s, ids[i])) {
        fprintf(stderr, "token %d of the document refused\n", i);
        return 1;
      }
    }
  }
  uint64_t hits, misses;
  lks_json_cache_stats(cache, &hits, &misses);
  qsort(dts, (size_t)n_dt, sizeof *dts, cmp_double);
  qsort(dts_c, (size_t)n_dt_c, sizeof *dts_c, cmp_double);
  printf("json mode, %s: V = %d, trie built in %.1f ms; %d tokens x %d; mask + masked row, ms/token:\n"
         "  walk every time  %.3f mean, %.3f median, %.3f worst\n  with the cache   %.3f mean, "
         "%.3f median, %.3f worst (%llu hits, %llu misses per pass); %.0f tokens allowed on average\n",
         path, V, build * 1e3, n, repeats, total / (n * repeats) * 1e3, dts[n_dt / 2] * 1e3,
         worst * 1e3, total_c / (n * repeats) * 1e3, dts_c[n_dt_c / 2] * 1e3, worst_c * 1e3, (unsigned long long)hits,
         (unsigned long long)misses, (double)allowed / (2.0 * n * repeats));
  sink = out[ids[0] % V];  // keeps the masked copy from being optimised away
  free(ids);
  free(mask);
  free(dts);
  free(dts_c);
  lks_json_cache_free(cache);
  free(row);
  free(out);
  lks_json_vocab_free(v);
  lks_tokenizer_free(t);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--json")) return json_bench(argv[2], argc > 3 ? atoi(argv[3]) : 5);
  int V = argc > 1 ? atoi(argv[1]) : 151552, repeats = argc > 2 ? atoi(argv[2]) : 5;
  enum { ROWS = 8 };
  float *rows[ROWS];
  uint64_t g = 12345;
  for (int r = 0; r < ROWS; r++) {
    rows[r] = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < V; i++) {  // a broad body and a few dozen likely tokens
      g = g * 6364136223846793005ull + 1442695040888963407ull;
      rows[r][i] = 3.0f * ((float)(g >> 40) / (float)(1 << 24) * 2 - 1);
    }
    for (int i = 0; i < 40; i++) rows[r][(i * 7919 + r * 104729) % V] = 10.0f + (float)(i % 7);
  }
  static const struct {
    const char *name;
    lks_sampling p;
  } cases[] = {
      {"greedy", {0, 0, 1}},
      {"T=1", {1.0f, 0, 1}},
      {"T=0.6 top_p=0.95", {0.6f, 0, 0.95f}},
      {"T=0.7 top_k=40", {0.7f, 40, 1}},
      {"T=1 top_k=50 top_p=0.9", {1.0f, 50, 0.9f}},
  };
  printf("sampling, V = %d, medians of %d repeats (ms/token)\n", V, repeats);
  printf("%-26s %10s %10s %8s\n", "setting", "before", "after", "speedup");
  int check = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double b = ms_per_token(before_sample, rows, ROWS, V, &cases[c].p, 8, repeats, &check);
    double a = ms_per_token(lks_sample, rows, ROWS, V, &cases[c].p, 64, repeats, &check);
    printf("%-26s %10.3f %10.3f %7.0fx\n", cases[c].name, b, a, b / a);
  }
  // Nearly flat rows, as an untrained model's (logits within +-0.1): top-p must then keep most
  // of the vocabulary, the worst case for finding its edge.
  float *flat[ROWS];
  for (int r = 0; r < ROWS; r++) {
    flat[r] = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < V; i++) {
      g = g * 6364136223846793005ull + 1442695040888963407ull;
      flat[r][i] = 0.1f * ((float)(g >> 40) / (float)(1 << 24) * 2 - 1);
    }
  }
  static const struct {
    const char *name;
    lks_sampling p;
  } flat_cases[] = {{"flat T=1 top_p=0.95", {1.0f, 0, 0.95f}},
                    {"flat T=1 top_p=0.5", {1.0f, 0, 0.5f}}};
  for (size_t c = 0; c < sizeof flat_cases / sizeof flat_cases[0]; c++) {
    double b = ms_per_token(before_sample, flat, ROWS, V, &flat_cases[c].p, 8, repeats, &check);
    double a = ms_per_token(lks_sample, flat, ROWS, V, &flat_cases[c].p, 64, repeats, &check);
    printf("%-26s %10.3f %10.3f %7.0fx\n", flat_cases[c].name, b, a, b / a);
  }
  for (int r = 0; r < ROWS; r++) free(flat[r]);
  // Logit processing: what pick() adds to a row of a request that uses it.
  enum { HIST = 2048, PROMPT = 1024, BIASES = 300, REPS = 200 };
  int32_t *hist = malloc(HIST * sizeof *hist), *counts = calloc((size_t)V, sizeof *counts);
  float *row = malloc((size_t)V * sizeof *row);
  lks_logit_params lp = {.presence = 0.5f, .frequency = 0.3f, .repetition = 1.2f, .n_bias = BIASES};
  lp.bias_ids = malloc(BIASES * sizeof *lp.bias_ids);
  lp.bias = malloc(BIASES * sizeof *lp.bias);
  for (int i = 0; i < HIST; i++) {  // repeats, as text has them
    g = g * 6364136223846793005ull + 1442695040888963407ull;
    hist[i] = (int32_t)((g >> 33) % (uint64_t)(i < 64 ? V : 4096));
  }
  for (int i = 0; i < BIASES; i++) {
    lp.bias_ids[i] = (int32_t)((i * 104729) % V);
    lp.bias[i] = (float)(i % 11) - 5;
  }
  double tp[16], tl0[16], tl20[16];
  int R = repeats < 16 ? repeats : 16;
  lks_tok_logprob rep;
  for (int k = 0; k < R; k++) {
    double t0 = now();
    for (int d = 0; d < REPS; d++) {
      memcpy(row, rows[d % ROWS], (size_t)V * sizeof *row);
      lks_logits_apply(&lp, hist, PROMPT, HIST, hist, 3, row, V, counts);
      check += row[d] > 100;
    }
    tp[k] = (now() - t0) / REPS * 1e3;
    t0 = now();
    for (int d = 0; d < REPS; d++) lks_logprobs_row(rows[d % ROWS], V, d, 0, &rep);
    tl0[k] = (now() - t0) / REPS * 1e3;
    t0 = now();
    for (int d = 0; d < REPS; d++) lks_logprobs_row(rows[d % ROWS], V, d, 20, &rep);
    tl20[k] = (now() - t0) / REPS * 1e3;
  }
  qsort(tp, (size_t)R, sizeof *tp, cmp_double);
  qsort(tl0, (size_t)R, sizeof *tl0, cmp_double);
  qsort(tl20, (size_t)R, sizeof *tl20, cmp_double);
  printf("\nlogit processing per row (ms): all processors, %d-token sequence, %d biases (with the "
         "copy of the row) %.3f; logprobs %.3f; with top_logprobs 20 %.3f\n", HIST, BIASES,
         tp[R / 2], tl0[R / 2], tl20[R / 2]);
  free(hist);
  free(counts);
  free(row);
  free(lp.bias_ids);
  free(lp.bias);
  for (int r = 0; r < ROWS; r++) free(rows[r]);
  return check == -1;  // keeps the draws from being optimised away
}
