// SPDX-License-Identifier: MIT
// The C forward against the independent numpy reference (tests/reference/glm_ref.py).
//
// usage: test_model_ref MODEL_DIR EXPECTED.safetensors LAMBDA PROMPT_LEN [BACKEND]
//
// BACKEND: cpu (default) or cuda (tests/gpu/run.sh): the same comparison on the GPU.
//
// The bound, per row of logits. Both sides use the same weights (BF16 or F32, widened exactly to
// F32 / F64): the reference computes in float64, lockstep's CPU backend in float32, so for the
// same operations their difference is float32 rounding error, propagated through the layers. A
// priori bounds for it are far too loose to catch anything: each dot of length K is within
// K * u * sum|a_i * b_i| (u = 2^-24), and the worst case compounds through every layer by the
// sums of |weights| (for these models 1e3..1e5 times the error actually made). So the reference
// measures it instead: it reruns the same forward with every weight widened to float32 and
// every intermediate rounded to float32, and stores per row e32 = max_v |float32 - float64|
// (tests/reference/glm_ref.py, the *_f32err tensors). lockstep's rounding differs from numpy's
// only in the order of the sums (blocked SIMD accumulators against BLAS and pairwise sums),
// which changes the error of a K-long dot by a factor of order sqrt(K / block) at most, a few
// for these K; so every row must satisfy
//     max_v |lockstep - ref|  <=  LAMBDA * max(e32, u * max_v |ref|)
// with LAMBDA (tests/CMakeLists.txt) a small factor for that; the u * max|ref| floor (half an
// ulp of the row's largest logit, doubled) keeps a row whose float32 run happened to land
// exactly from having no room at all. Measured ratios are printed (worst row of each group):
// about 1 on every case here, so one changed weight or op (anything that moves a logit by more
// than a few float32 roundings of the row) fails.
//
// 1. Sequence A, teacher-forced with the reference's tokens: a prefill of the prompt with the
//    logits of every row, then one decode step per token; every row's logits are compared with
//    the reference as above.
// 2. Sequence B, free-running greedy generation from the prompt, prefilled in two chunks: its
//    tokens must equal the reference's greedy tokens.
// 3. The MTP layer: first drafts at every position (a prefill-shaped batch, then single steps, as
//    a proposer would run them) from sequence A's final-normed hiddens; then the chained drafts at
//    the reference's anchor positions. Same per-row bound.
// Exit status 0 when everything is within bounds; every comparison is printed.
//
// An expected file without the *_f32err tensors (tests/reference/glm5_ref.py for GLM-5, which
// does not measure them yet) is compared by the relative bound instead: every row's
// max_v |lockstep - ref| / max_v |ref| <= LAMBDA, LAMBDA then a relative error (its derivation
// in tests/CMakeLists.txt where those cases are listed).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "model/safetensors.h"

static int failures;

static const lks_st_tensor *need(lks_safetensors *st, const char *name) {
  const lks_st_tensor *t = lks_safetensors_find(st, name);
  if (!t) {
    fprintf(stderr, "expected file has no tensor '%s'\n", name);
    exit(2);
  }
  return t;
}

#define U_F32 (1.0 / (1 << 24))  // float32 unit roundoff

// The worst over `rows` rows of V logits of max_v |a - ref| / max(e32[row], u * max_v |ref|):
// the error in units of the row's measured float32 rounding error (see the top). NaN is worst.
static double row_ratio(const float *a, const float *ref, const float *e32, int rows, int V,
                        int *worst_row) {
  double worst = 0;
  *worst_row = 0;
  for (int r = 0; r < rows; r++) {
    const float *x = a + (size_t)r * V, *y = ref + (size_t)r * V;
    double md = 0, mr = 0;
    for (int v = 0; v < V; v++) {
      double d = fabs((double)x[v] - y[v]);
      if (!(d <= md)) md = d;  // NaN propagates as a failure
      if (fabs(y[v]) > mr) mr = fabs(y[v]);
    }
    double scale = fmax(e32[r], U_F32 * mr);
    double q = scale > 0 ? md / scale : (md > 0 ? INFINITY : 0);
    if (!(q <= worst)) {
      worst = q;
      *worst_row = r;
    }
  }
  return worst;
}

static bool rel_mode;  // no *_f32err tensors: e32 holds each row's max|ref|, LAMBDA is relative

// The *_f32err tensor `name` of `rows` values, or in rel_mode each row's max_v |ref| (owned by
// the caller then; freed at exit).
static const float *row_scale(lks_safetensors *ex, const char *name, const float *ref, int rows,
                              int V) {
  const lks_st_tensor *t = lks_safetensors_find(ex, name);
  if (t) return (const float *)t->data;
  if (!rel_mode) {
    fprintf(stderr, "expected file has no tensor '%s'\n", name);
    exit(2);
  }
  float *m = calloc((size_t)(rows > 0 ? rows : 1), sizeof *m);
  if (!m) exit(1);
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < V; v++) m[r] = fmaxf(m[r], fabsf(ref[(size_t)r * V + v]));
  return m;
}

static void check(const char *what, const float *a, const float *ref, const float *e32, int rows,
                  int V, double lambda) {
  int wr;
  double q = row_ratio(a, ref, e32, rows, V, &wr);
  bool ok = q <= lambda;
  if (!ok) failures++;
  if (rel_mode) {
    printf("%-44s worst row %3d: rel err %.3e  (bound %.1e)  %s\n", what, wr, q, lambda,
           ok ? "ok" : "FAIL");
    return;
  }
  printf("%-44s worst row %3d: %6.2f x its f32 error %.2e  (bound %g x)  %s\n", what, wr, q,
         e32[wr], lambda, ok ? "ok" : "FAIL");
}

#define TRY(x)                                                               \
  do {                                                                       \
    if ((x) < 0) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, lks_last_error()); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: %s MODEL_DIR EXPECTED.safetensors LAMBDA PROMPT_LEN [BACKEND]\n",
            argv[0]);
    return 2;
  }
  double bound = atof(argv[3]);
  if (!(bound > 0)) {
    fprintf(stderr, "LAMBDA must be a positive number, not '%s'\n", argv[3]);
    return 2;
  }
  lks_backend *be = lks_backend_new(argc == 6 ? argv[5] : "cpu", 0);
  lks_model *m = be ? lks_model_load(argv[1], be, NULL, NULL) : NULL;
  lks_safetensors *ex = lks_safetensors_open(argv[2]);
  if (!m || !ex) {
    fprintf(stderr, "cannot load: %s\n", lks_last_error());
    return 1;
  }
  const lks_config *c = lks_model_config(m);
  int V = c->vocab, H = c->hidden;
  const lks_st_tensor *tt = need(ex, "tokens"), *tl = need(ex, "logits"),
                      *te = lks_safetensors_find(ex, "logits_f32err");
  rel_mode = te == NULL;
  const int32_t *tokens = (const int32_t *)tt->data;
  int n_tok = (int)tt->shape[0], n_rows = (int)tl->shape[0];  // n_rows = n_tok - 1
  const float *ref = (const float *)tl->data;
  const float *ref_e32 = row_scale(ex, "logits_f32err", ref, n_rows, V);
  int P = atoi(argv[4]);
  if (tl->shape[1] != V || n_tok != n_rows + 1 || P < 2 || (te && te->shape[0] != n_rows)) {
    fprintf(stderr, "expected file does not match the model (vocab %d)\n", V);
    return 2;
  }
  int gen = n_rows - P;
  int max_len = n_tok + 8, bs = 16;
  lks_kv_cache *kv = lks_model_kv_new(m, false, bs, 2 * ((max_len + bs - 1) / bs), 2, max_len);
  float *logits = malloc((size_t)n_rows * V * sizeof *logits);
  float *hidden = malloc((size_t)n_rows * H * sizeof *hidden);
  int32_t *pos = malloc((size_t)n_tok * sizeof *pos), *seq = calloc((size_t)n_tok, sizeof *seq);
  int32_t *rows = malloc((size_t)n_tok * sizeof *rows);
  if (!kv || !logits || !hidden || !pos || !seq || !rows) return 1;
  for (int i = 0; i < n_tok; i++) pos[i] = rows[i] = i;

  // 1. Sequence A: prefill with every row's logits, then teacher-forced decode steps.
  int a = lks_kv_seq_alloc(kv);
  TRY(lks_kv_seq_resize(kv, a, P));
  lks_batch b = {P, tokens, pos, seq, P, rows};
  lks_tensor lg, hd;
  TRY(lks_model_forward(m, kv, &b, &lg, &hd));
  TRY(lks_tensor_to_host_f32(be, logits, lg));
  TRY(lks_tensor_to_host_f32(be, hidden, hd));
  for (int s = 0; s < gen; s++) {
    int p = P + s;
    int32_t zero = 0;
    TRY(lks_kv_seq_resize(kv, a, p + 1));
    lks_batch d = {1, &tokens[p], &pos[p], seq, 1, &zero};
    TRY(lks_model_forward(m, kv, &d, &lg, &hd));
    TRY(lks_tensor_to_host_f32(be, logits + (size_t)p * V, lg));
    TRY(lks_tensor_to_host_f32(be, hidden + (size_t)p * H, hd));
  }
  char what[96];
  snprintf(what, sizeof what, "target logits, %d-token prefill", P);
  check(what, logits, ref, ref_e32, P, V, bound);
  snprintf(what, sizeof what, "target logits, %d decode steps", gen);
  check(what, logits + (size_t)P * V, ref + (size_t)P * V, ref_e32 + P, gen, V, bound);

  // 2. Sequence B: free-running greedy from the prompt, prefilled in two chunks.
  int bseq = lks_kv_seq_alloc(kv);
  int32_t *bs_seq = malloc((size_t)n_tok * sizeof *bs_seq);
  for (int i = 0; i < n_tok; i++) bs_seq[i] = bseq;
  int32_t *gtok = malloc((size_t)n_tok * sizeof *gtok);
  memcpy(gtok, tokens, (size_t)P * sizeof *gtok);
  int c1 = P / 2 + 3;
  TRY(lks_kv_seq_resize(kv, bseq, c1));
  int32_t last = c1 - 1;
  lks_batch b1 = {c1, gtok, pos, bs_seq, 1, &last};
  TRY(lks_model_forward(m, kv, &b1, &lg, NULL));
  TRY(lks_kv_seq_resize(kv, bseq, P));
  last = P - c1 - 1;
  lks_batch b2 = {P - c1, gtok + c1, pos + c1, bs_seq, 1, &last};
  TRY(lks_model_forward(m, kv, &b2, &lg, NULL));
  int same = 0;
  for (int i = 0; i <= gen; i++) {
    int32_t next;
    TRY(be->ops->argmax(be, lg, &next, NULL));
    gtok[P + i] = next;
    same += next == tokens[P + i];
    if (i == gen) break;
    int p = P + i;
    int32_t zero = 0;
    TRY(lks_kv_seq_resize(kv, bseq, p + 1));
    lks_batch d = {1, &gtok[p], &pos[p], bs_seq, 1, &zero};
    TRY(lks_model_forward(m, kv, &d, &lg, NULL));
  }
  bool greedy_ok = same == gen + 1;
  failures += !greedy_ok;
  printf("%-44s %d of %d tokens equal  %s\n", "greedy continuation (chunked prefill)", same,
         gen + 1, greedy_ok ? "ok" : "FAIL");

  // 3. MTP.
  if (lks_model_has_mtp(m)) {
    const lks_st_tensor *tm = need(ex, "mtp_logits"), *tc = need(ex, "mtp_chain_logits"),
                        *tp = need(ex, "mtp_chain_pos");
    const float *mref = (const float *)tm->data, *cref = (const float *)tc->data;
    const int32_t *anchors = (const int32_t *)tp->data;
    int n_m = (int)tm->shape[0], n_anchor = (int)tc->shape[0], chain = (int)tc->shape[1];
    const float *mref_e32 = row_scale(ex, "mtp_logits_f32err", mref, n_m, V);
    const float *cref_e32 = row_scale(ex, "mtp_chain_f32err", cref, n_anchor * chain, V);
    lks_kv_cache *mkv = lks_model_kv_new(m, true, bs, 2 * ((max_len + bs - 1) / bs), 2, max_len);
    lks_buf *hbuf = be->ops->buf_alloc(be, (size_t)n_rows * H * sizeof(float));
    float *mlog = malloc((size_t)n_m * V * sizeof *mlog);
    if (!mkv || !hbuf || !mlog) return 1;
    TRY(be->ops->from_host(be, hbuf, 0, hidden, (size_t)n_rows * H * sizeof(float)));
    lks_tensor hall = lks_tensor_2d(hbuf, 0, LKS_F32, n_rows, H);
    // First drafts: rows j = 0 .. P-2 in one batch, then one row per step.
    int ms = lks_kv_seq_alloc(mkv);
    int first = P - 1;
    TRY(lks_kv_seq_resize(mkv, ms, first));
    lks_batch mb = {first, tokens + 1, pos, seq, first, rows};
    TRY(lks_model_mtp(m, mkv, &mb, lks_tensor_rows(hall, 0, first), &lg, NULL));
    TRY(lks_tensor_to_host_f32(be, mlog, lg));
    for (int j = first; j < n_m; j++) {
      int32_t zero = 0;
      TRY(lks_kv_seq_resize(mkv, ms, j + 1));
      lks_batch d = {1, &tokens[j + 1], &pos[j], seq, 1, &zero};
      TRY(lks_model_mtp(m, mkv, &d, lks_tensor_rows(hall, j, 1), &lg, NULL));
      TRY(lks_tensor_to_host_f32(be, mlog + (size_t)j * V, lg));
    }
    snprintf(what, sizeof what, "MTP first-draft logits, %d positions", n_m);
    check(what, mlog, mref, mref_e32, n_m, V, bound);
    // Chained drafts: per anchor i, a fresh MTP sequence over 0..i, then chain-1 more steps.
    for (int an = 0; an < n_anchor; an++) {
      int i = anchors[an];
      int cs = lks_kv_seq_alloc(mkv);
      int32_t *cseq = malloc((size_t)(i + 1) * sizeof *cseq);
      for (int r = 0; r <= i; r++) cseq[r] = cs;
      TRY(lks_kv_seq_resize(mkv, cs, i + 1));
      int32_t lastrow = i;
      lks_batch cb = {i + 1, tokens + 1, pos, cseq, 1, &lastrow};
      lks_tensor carry;
      TRY(lks_model_mtp(m, mkv, &cb, lks_tensor_rows(hall, 0, i + 1), &lg, &carry));
      // The logits were computed for all rows; the anchor's are the last.
      float *steps = malloc((size_t)chain * V * sizeof *steps);
      for (int k = 0; k < chain; k++) {
        lks_tensor row = lks_tensor_rows(lg, lg.rows - 1, 1);
        TRY(lks_tensor_to_host_f32(be, steps + (size_t)k * V, row));
        if (k + 1 == chain) break;
        int32_t draft, zero = 0;
        TRY(be->ops->argmax(be, row, &draft, NULL));
        int32_t p = i + 1 + k;
        TRY(lks_kv_seq_resize(mkv, cs, p + 1));
        lks_batch d = {1, &draft, &p, &cs, 1, &zero};
        lks_tensor h_in = lks_tensor_rows(carry, carry.rows - 1, 1);
        TRY(lks_model_mtp(m, mkv, &d, h_in, &lg, &carry));
      }
      snprintf(what, sizeof what, "MTP chain of %d drafts at position %d", chain, i);
      check(what, steps, cref + (size_t)an * chain * V, cref_e32 + (size_t)an * chain, chain, V,
            bound);
      free(steps);
      free(cseq);
      lks_kv_seq_free(mkv, cs);
    }
    free(mlog);
    be->ops->buf_free(be, hbuf);
    lks_kv_free(mkv);
  }
  printf("%s\n", failures ? "FAILED" : "all comparisons within bounds");
  free(gtok);
  free(bs_seq);
  free(logits);
  free(hidden);
  free(pos);
  free(seq);
  free(rows);
  lks_kv_free(kv);
  lks_safetensors_close(ex);
  lks_model_free(m);
  lks_backend_free(be);
  return failures ? 1 : 0;
}
