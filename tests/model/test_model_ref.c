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

// rel_mode's row maxima, freed at exit.
static float *owned[8];
static int n_owned;
static void free_owned(void) {
  while (n_owned > 0) free(owned[--n_owned]);
}

// The *_f32err tensor `name` of `rows` values, or in rel_mode each row's max_v |ref| (kept in
// `owned`, freed at exit).
static const float *row_scale(lks_safetensors *ex, const char *name, const float *ref, int rows,
                              int V) {
  const lks_st_tensor *t = lks_safetensors_find(ex, name);
  if (t) return (const float *)t->data;
  if (!rel_mode) {
    fprintf(stderr, "expected file has no tensor '%s'\n", name);
    exit(2);
  }
  float *m = calloc((size_t)(rows > 0 ? rows : 1), sizeof *m);
  if (!m || n_owned == (int)(sizeof owned / sizeof owned[0])) exit(1);
  if (n_owned == 0) atexit(free_owned);
  owned[n_owned++] = m;
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

// What every phase reads: the model, the expected file and the host arrays of sequence A.
typedef struct {
  lks_backend *be;
  lks_model *m;
  lks_safetensors *ex;
  lks_kv_cache *kv;
  double bound;
  int V, H, P, gen, n_tok, n_rows, max_len, bs;
  const int32_t *tokens;  // [n_tok]: the reference's sequence A
  const float *ref;       // [n_rows, V]: its logits
  const float *ref_e32;   // [n_rows]
  float *logits;          // [n_rows, V]: lockstep's, sequence A
  float *hidden;          // [n_rows, H]: its final-normed hiddens
  int32_t *pos, *seq, *rows;  // [n_tok]: 0.., zeros, 0..
} ref_run;

// Loads the backend, the model and the expected file and checks they agree; 0, or the exit
// status (2: usage or a mismatched file, 1: a load failure).
static int load(ref_run *r, int argc, char **argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: %s MODEL_DIR EXPECTED.safetensors LAMBDA PROMPT_LEN [BACKEND]\n",
            argv[0]);
    return 2;
  }
  // "greedy": the logits' deviations are printed, and only the greedy tokens must agree (a BF16
  // KV cache, whose rounding of K and V the float32 error rows do not cover).
  r->bound = strcmp(argv[3], "greedy") == 0 ? INFINITY : atof(argv[3]);
  if (!(r->bound > 0)) {
    fprintf(stderr, "LAMBDA must be a positive number, not '%s'\n", argv[3]);
    return 2;
  }
  r->be = lks_backend_new(argc == 6 ? argv[5] : "cpu", 0);
  r->m = r->be ? lks_model_load(argv[1], r->be, NULL, NULL) : NULL;
  // LKS_KV_DTYPE=bf16: a BF16 KV cache (the reference's is exact; see tests/CMakeLists.txt).
  const char *kvd = getenv("LKS_KV_DTYPE");
  if (r->m && kvd && strcmp(kvd, "bf16") == 0 && lks_model_set_kv_dtype(r->m, LKS_BF16) < 0) {
    fprintf(stderr, "cannot set the KV cache type: %s\n", lks_last_error());
    return 1;
  }
  r->ex = lks_safetensors_open(argv[2]);
  if (!r->m || !r->ex) {
    fprintf(stderr, "cannot load: %s\n", lks_last_error());
    return 1;
  }
  const lks_config *c = lks_model_config(r->m);
  int V = r->V = c->vocab, H = r->H = c->hidden;
  const lks_st_tensor *tt = need(r->ex, "tokens"), *tl = need(r->ex, "logits"),
                      *te = lks_safetensors_find(r->ex, "logits_f32err");
  rel_mode = te == NULL;
  r->tokens = (const int32_t *)tt->data;
  int n_tok = r->n_tok = (int)tt->shape[0], n_rows = r->n_rows = (int)tl->shape[0];  // n_tok - 1
  r->ref = (const float *)tl->data;
  r->ref_e32 = row_scale(r->ex, "logits_f32err", r->ref, n_rows, V);
  int P = r->P = atoi(argv[4]);
  if (tl->shape[1] != V || n_tok != n_rows + 1 || P < 2 || (te && te->shape[0] != n_rows)) {
    fprintf(stderr, "expected file does not match the model (vocab %d)\n", V);
    return 2;
  }
  r->gen = n_rows - P;
  int max_len = r->max_len = n_tok + 8, bs = r->bs = 16;
  r->kv = lks_model_kv_new(r->m, false, bs, 2 * ((max_len + bs - 1) / bs), 2, max_len);
  r->logits = malloc((size_t)n_rows * V * sizeof *r->logits);
  r->hidden = malloc((size_t)n_rows * H * sizeof *r->hidden);
  r->pos = malloc((size_t)n_tok * sizeof *r->pos);
  r->seq = calloc((size_t)n_tok, sizeof *r->seq);
  r->rows = malloc((size_t)n_tok * sizeof *r->rows);
  if (!r->kv || !r->logits || !r->hidden || !r->pos || !r->seq || !r->rows) return 1;
  for (int i = 0; i < n_tok; i++) r->pos[i] = r->rows[i] = i;
  return 0;
}

// 1. Sequence A: prefill with every row's logits, then teacher-forced decode steps.
static void teacher_forced(ref_run *r) {
  lks_backend *be = r->be;
  int P = r->P, V = r->V, H = r->H, gen = r->gen;
  int a = lks_kv_seq_alloc(r->kv);
  TRY(lks_kv_seq_resize(r->kv, a, P));
  lks_batch b = {P, r->tokens, r->pos, r->seq, P, r->rows};
  lks_tensor lg, hd;
  TRY(lks_model_forward(r->m, r->kv, &b, &lg, &hd));
  TRY(lks_tensor_to_host_f32(be, r->logits, lg));
  TRY(lks_tensor_to_host_f32(be, r->hidden, hd));
  for (int s = 0; s < gen; s++) {
    int p = P + s;
    int32_t zero = 0;
    TRY(lks_kv_seq_resize(r->kv, a, p + 1));
    lks_batch d = {1, &r->tokens[p], &r->pos[p], r->seq, 1, &zero};
    TRY(lks_model_forward(r->m, r->kv, &d, &lg, &hd));
    TRY(lks_tensor_to_host_f32(be, r->logits + (size_t)p * V, lg));
    TRY(lks_tensor_to_host_f32(be, r->hidden + (size_t)p * H, hd));
  }
  char what[96];
  snprintf(what, sizeof what, "target logits, %d-token prefill", P);
  check(what, r->logits, r->ref, r->ref_e32, P, V, r->bound);
  snprintf(what, sizeof what, "target logits, %d decode steps", gen);
  check(what, r->logits + (size_t)P * V, r->ref + (size_t)P * V, r->ref_e32 + P, gen, V,
        r->bound);
}

// 2. Sequence B: free-running greedy from the prompt, prefilled in two chunks.
static void greedy_chunked(ref_run *r) {
  lks_backend *be = r->be;
  lks_kv_cache *kv = r->kv;
  int P = r->P, n_tok = r->n_tok, gen = r->gen;
  const int32_t *tokens = r->tokens, *pos = r->pos;
  int bseq = lks_kv_seq_alloc(kv);
  int32_t *bs_seq = malloc((size_t)n_tok * sizeof *bs_seq);
  for (int i = 0; i < n_tok; i++) bs_seq[i] = bseq;
  int32_t *gtok = malloc((size_t)n_tok * sizeof *gtok);
  memcpy(gtok, tokens, (size_t)P * sizeof *gtok);
  int c1 = P / 2 + 3;
  TRY(lks_kv_seq_resize(kv, bseq, c1));
  int32_t last = c1 - 1;
  lks_batch b1 = {c1, gtok, pos, bs_seq, 1, &last};
  lks_tensor lg;
  TRY(lks_model_forward(r->m, kv, &b1, &lg, NULL));
  TRY(lks_kv_seq_resize(kv, bseq, P));
  last = P - c1 - 1;
  lks_batch b2 = {P - c1, gtok + c1, pos + c1, bs_seq, 1, &last};
  TRY(lks_model_forward(r->m, kv, &b2, &lg, NULL));
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
    TRY(lks_model_forward(r->m, kv, &d, &lg, NULL));
  }
  bool greedy_ok = same == gen + 1;
  failures += !greedy_ok;
  printf("%-44s %d of %d tokens equal  %s\n", "greedy continuation (chunked prefill)", same,
         gen + 1, greedy_ok ? "ok" : "FAIL");
  free(gtok);
  free(bs_seq);
}

// 3a. First drafts: rows j = 0 .. P-2 in one batch, then one row per step.
static void mtp_first_drafts(ref_run *r, lks_kv_cache *mkv, lks_tensor hall) {
  lks_backend *be = r->be;
  int V = r->V, P = r->P;
  const int32_t *tokens = r->tokens;
  const lks_st_tensor *tm = need(r->ex, "mtp_logits");
  const float *mref = (const float *)tm->data;
  int n_m = (int)tm->shape[0];
  const float *mref_e32 = row_scale(r->ex, "mtp_logits_f32err", mref, n_m, V);
  float *mlog = malloc((size_t)n_m * V * sizeof *mlog);
  if (!mlog) exit(1);
  lks_tensor lg;
  int ms = lks_kv_seq_alloc(mkv);
  int first = P - 1;
  TRY(lks_kv_seq_resize(mkv, ms, first));
  lks_batch mb = {first, tokens + 1, r->pos, r->seq, first, r->rows};
  TRY(lks_model_mtp(r->m, mkv, &mb, lks_tensor_rows(hall, 0, first), &lg, NULL));
  TRY(lks_tensor_to_host_f32(be, mlog, lg));
  for (int j = first; j < n_m; j++) {
    int32_t zero = 0;
    TRY(lks_kv_seq_resize(mkv, ms, j + 1));
    lks_batch d = {1, &tokens[j + 1], &r->pos[j], r->seq, 1, &zero};
    TRY(lks_model_mtp(r->m, mkv, &d, lks_tensor_rows(hall, j, 1), &lg, NULL));
    TRY(lks_tensor_to_host_f32(be, mlog + (size_t)j * V, lg));
  }
  char what[96];
  snprintf(what, sizeof what, "MTP first-draft logits, %d positions", n_m);
  check(what, mlog, mref, mref_e32, n_m, V, r->bound);
  free(mlog);
}

// 3b. Chained drafts at anchor i: a fresh MTP sequence over 0..i, then chain-1 more steps; the
// `chain` rows of logits compared with ref (cref_e32 their scales).
static void mtp_chain_at(ref_run *r, lks_kv_cache *mkv, lks_tensor hall, int i, int chain,
                         const float *cref, const float *cref_e32) {
  lks_backend *be = r->be;
  int V = r->V;
  int cs = lks_kv_seq_alloc(mkv);
  int32_t *cseq = malloc((size_t)(i + 1) * sizeof *cseq);
  for (int k = 0; k <= i; k++) cseq[k] = cs;
  TRY(lks_kv_seq_resize(mkv, cs, i + 1));
  int32_t lastrow = i;
  lks_batch cb = {i + 1, r->tokens + 1, r->pos, cseq, 1, &lastrow};
  lks_tensor lg, carry;
  TRY(lks_model_mtp(r->m, mkv, &cb, lks_tensor_rows(hall, 0, i + 1), &lg, &carry));
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
    TRY(lks_model_mtp(r->m, mkv, &d, h_in, &lg, &carry));
  }
  char what[96];
  snprintf(what, sizeof what, "MTP chain of %d drafts at position %d", chain, i);
  check(what, steps, cref, cref_e32, chain, V, r->bound);
  free(steps);
  free(cseq);
  lks_kv_seq_free(mkv, cs);
}

// 3. MTP, from sequence A's hiddens: first drafts, then chained drafts at the reference's
// anchors. 0, or 1 when out of memory.
static int mtp(ref_run *r) {
  lks_backend *be = r->be;
  int V = r->V, H = r->H, n_rows = r->n_rows, max_len = r->max_len, bs = r->bs;
  const lks_st_tensor *tc = need(r->ex, "mtp_chain_logits"), *tp = need(r->ex, "mtp_chain_pos");
  const float *cref = (const float *)tc->data;
  const int32_t *anchors = (const int32_t *)tp->data;
  int n_anchor = (int)tc->shape[0], chain = (int)tc->shape[1];
  const float *cref_e32 = row_scale(r->ex, "mtp_chain_f32err", cref, n_anchor * chain, V);
  lks_kv_cache *mkv = lks_model_kv_new(r->m, true, bs, 2 * ((max_len + bs - 1) / bs), 2, max_len);
  lks_buf *hbuf = be->ops->buf_alloc(be, (size_t)n_rows * H * sizeof(float));
  if (!mkv || !hbuf) return 1;
  TRY(be->ops->from_host(be, hbuf, 0, r->hidden, (size_t)n_rows * H * sizeof(float)));
  lks_tensor hall = lks_tensor_2d(hbuf, 0, LKS_F32, n_rows, H);
  mtp_first_drafts(r, mkv, hall);
  for (int an = 0; an < n_anchor; an++)
    mtp_chain_at(r, mkv, hall, anchors[an], chain, cref + (size_t)an * chain * V,
                 cref_e32 + (size_t)an * chain);
  be->ops->buf_free(be, hbuf);
  lks_kv_free(mkv);
  return 0;
}

static void unload(ref_run *r) {
  free(r->logits);
  free(r->hidden);
  free(r->pos);
  free(r->seq);
  free(r->rows);
  lks_kv_free(r->kv);
  lks_safetensors_close(r->ex);
  lks_model_free(r->m);
  lks_backend_free(r->be);
}

int main(int argc, char **argv) {
  ref_run r = {0};
  int rc = load(&r, argc, argv);
  if (rc) return rc;
  teacher_forced(&r);
  greedy_chunked(&r);
  if (lks_model_has_mtp(r.m) && mtp(&r)) return 1;
  printf("%s\n", failures ? "FAILED" : "all comparisons within bounds");
  unload(&r);
  return failures ? 1 : 0;
}
