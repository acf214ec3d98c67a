// SPDX-License-Identifier: MIT
// Batch invariance of the CPU backend: every op computes each row with the same arithmetic
// whatever the batch size and its other rows, on every SIMD level this CPU has. Each op runs on a
// batch, on the same rows in reverse order, and on every row alone (a one-row view); results
// must agree bitwise. The experts op is checked against one expert call per expert.
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_testutil.h"
#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/dtype.h"
#include "core/log.h"
#include "testutil.h"

// ---- fixture: every buffer, host array and backend a test makes, freed in teardown ----

static void setup(void) { lks_log_set_level(LKS_LOG_WARN); }

static void teardown(void) { tb_free_owned(); }

// ---- batch invariance: a row's result does not depend on the other rows of its batch ----

// What keeps greedy output identical with and without speculation and under load: every op
// computes each row with the same arithmetic whatever the batch size and its other rows. Each op
// runs on a batch, on the same rows in reverse order, and on every row alone (a one-row view);
// results must agree bitwise. Case _i is the SIMD level (LKS_SIMD); a level this CPU lacks is
// skipped with a note.
static const char *bi_levels[] = TU_SIMD_LEVELS;
static const int bi_rows[] = {1, 2, 31, 32, 33, 64, 65};
static const int64_t bi_k[] = {48, 80, 100, 4097};
enum { BI_NROWS = sizeof bi_rows / sizeof bi_rows[0], BI_NK = sizeof bi_k / sizeof bi_k[0] };

static lks_backend *bi_backend(int level) {
  if (!lks__cpu_kernels_get(bi_levels[level])) {
    fprintf(stderr, "check_batch_invariance: level %s not available here\n", bi_levels[level]);
    return NULL;
  }
  setenv("LKS_SIMD", bi_levels[level], 1);
  lks_backend *b = tb_new_backend(2);
  unsetenv("LKS_SIMD");
  return b;
}

// Row r of `batch` against row r of `alone` and row n-1-r of `rev`, bitwise.
static void bi_compare(const float *batch, const float *alone, const float *rev, int n,
                       int64_t cols, const char *what, int level, int64_t k) {
  for (int r = 0; r < n; r++) {
    ck_assert_msg(memcmp(batch + r * cols, alone + r * cols, (size_t)cols * sizeof(float)) == 0,
                  "%s (%s, K %lld): row %d of a batch of %d differs from the row alone", what,
                  bi_levels[level], (long long)k, r, n);
    if (rev)
      ck_assert_msg(
          memcmp(batch + r * cols, rev + (n - 1 - r) * cols, (size_t)cols * sizeof(float)) == 0,
          "%s (%s, K %lld): row %d of a batch of %d differs in the reversed batch", what,
          bi_levels[level], (long long)k, r, n);
  }
}

static float *bi_reverse(const float *x, int n, int64_t cols) {
  float *r = TB_NEW(float, n *cols);
  for (int i = 0; i < n; i++)
    memcpy(r + (n - 1 - i) * cols, x + i * cols, (size_t)cols * sizeof(float));
  return r;
}

START_TEST(test_batch_invariance_matmul) {
  lks_backend *b = bi_backend(_i);
  if (!b) return;
  const int64_t M = 37;  // odd: tasks end mid-block
  for (int ki = 0; ki < BI_NK; ki++)
    for (int d = 0; d < 3; d++) {
      int64_t K = bi_k[ki];
      uint64_t rng = 5000 + (uint64_t)(ki * 3 + d);
      float *wf = tb_randv(&rng, (size_t)(M * K), 1.0f), *bh = tb_randv(&rng, (size_t)M, 1.0f);
      lks_tensor w = tb_upload(b, tb_mm_dtypes[d], M, K,
                               tb_encode(tb_mm_dtypes[d], wf, (size_t)(M * K), NULL));
      lks_tensor bias = tb_upload(b, LKS_F32, 1, M, bh);
      for (int ni = 0; ni < BI_NROWS; ni++) {
        int n = bi_rows[ni];
        float *xh = tb_randv(&rng, (size_t)(n * K), 2.0f);
        float *oh = tb_randv(&rng, (size_t)(n * M), 1.0f);
        for (int acc = 0; acc < 2; acc++) {
          lks_tensor x = tb_upload(b, LKS_F32, n, K, xh),
                     xr = tb_upload(b, LKS_F32, n, K, bi_reverse(xh, n, K));
          lks_tensor o = tb_upload(b, LKS_F32, n, M, oh), oa = tb_upload(b, LKS_F32, n, M, oh);
          lks_tensor orv = tb_upload(b, LKS_F32, n, M, bi_reverse(oh, n, M));
          lks_tensor bb = acc ? bias : (lks_tensor){0};
          ck_assert_int_eq(b->ops->matmul(b, o, x, w, bb, acc), 0);
          ck_assert_int_eq(b->ops->matmul(b, orv, xr, w, bb, acc), 0);
          for (int r = 0; r < n; r++)
            ck_assert_int_eq(
                b->ops->matmul(b, lks_tensor_rows(oa, r, 1), lks_tensor_rows(x, r, 1), w, bb, acc),
                0);
          char what[64];
          snprintf(what, sizeof what, "matmul %s acc=%d", lks_dtype_name(tb_mm_dtypes[d]), acc);
          bi_compare(tb_download(b, o), tb_download(b, oa), tb_download(b, orv), n, M, what, _i, K);
        }
      }
    }
}
END_TEST

START_TEST(test_batch_invariance_expert) {
  lks_backend *b = bi_backend(_i);
  if (!b) return;
  const int64_t H = 80, R = 70;
  static const int64_t inter[] = {48, 100};
  for (int ii = 0; ii < 2; ii++)
    for (int d = 0; d < 3; d++) {
      int64_t I = inter[ii];
      uint64_t rng = 6000 + (uint64_t)(ii * 3 + d);
      lks_dtype dt = tb_mm_dtypes[d];
      lks_tensor g = tb_upload(
          b, dt, I, H, tb_encode(dt, tb_randv(&rng, (size_t)(I * H), 0.5f), (size_t)(I * H), NULL));
      lks_tensor u = tb_upload(
          b, dt, I, H, tb_encode(dt, tb_randv(&rng, (size_t)(I * H), 0.5f), (size_t)(I * H), NULL));
      lks_tensor dn = tb_upload(
          b, dt, H, I, tb_encode(dt, tb_randv(&rng, (size_t)(H * I), 0.5f), (size_t)(H * I), NULL));
      float *xh = tb_randv(&rng, (size_t)(R * H), 2.0f);
      float *oh = tb_randv(&rng, (size_t)(R * H), 1.0f);
      float *wts = tb_randv(&rng, (size_t)R, 1.5f);
      lks_tensor x = tb_upload(b, LKS_F32, R, H, xh);
      for (int ni = 0; ni < BI_NROWS; ni++) {
        int n = bi_rows[ni];
        // Rows of x in a scattered order, each at most once; and the same in reverse.
        int32_t *rows = TB_NEW(int32_t, n), *rrows = TB_NEW(int32_t, n);
        float *rw = TB_NEW(float, n);
        for (int i = 0; i < n; i++) rows[i] = (int32_t)((i * 37 + ni) % R);
        for (int i = 0; i < n; i++) {
          rrows[i] = rows[n - 1 - i];
          rw[i] = wts[n - 1 - i];
        }
        lks_tensor o = tb_upload(b, LKS_F32, R, H, oh), oa = tb_upload(b, LKS_F32, R, H, oh);
        lks_tensor orv = tb_upload(b, LKS_F32, R, H, oh);
        ck_assert_int_eq(b->ops->expert(b, o, x, rows, wts, n, g, u, dn), 0);
        ck_assert_int_eq(b->ops->expert(b, orv, x, rrows, rw, n, g, u, dn), 0);
        for (int i = 0; i < n; i++)
          ck_assert_int_eq(b->ops->expert(b, oa, x, rows + i, wts + i, 1, g, u, dn), 0);
        char what[64];
        snprintf(what, sizeof what, "expert %s I=%lld n=%d", lks_dtype_name(dt), (long long)I, n);
        // Rows of x, not of the batch: compare whole outputs (untouched rows are equal too).
        bi_compare(tb_download(b, o), tb_download(b, oa), NULL, 1, R * H, what, _i, I);
        bi_compare(tb_download(b, o), tb_download(b, orv), NULL, 1, R * H, what, _i, I);
        // Without a row list: rows 0..n-1 in a batch against each alone.
        lks_tensor p = tb_upload(b, LKS_F32, n, H, oh), pa = tb_upload(b, LKS_F32, n, H, oh);
        lks_tensor xs = lks_tensor_rows(x, 0, n);
        ck_assert_int_eq(b->ops->expert(b, p, xs, NULL, NULL, n, g, u, dn), 0);
        for (int i = 0; i < n; i++)
          ck_assert_int_eq(b->ops->expert(b, lks_tensor_rows(pa, i, 1), lks_tensor_rows(xs, i, 1),
                                          NULL, NULL, 1, g, u, dn),
                           0);
        bi_compare(tb_download(b, p), tb_download(b, pa), NULL, n, H, what, _i, I);
      }
    }
}
END_TEST

// The experts op (a MoE layer's experts at once) against the expert op called once per expert
// in order: bitwise, with routed experts on scattered rows and a shared expert on all of them.
START_TEST(test_experts_match_expert_calls) {
  lks_backend *b = bi_backend(_i);
  if (!b) return;
  const int64_t H = 80, R = 33;
  static const int64_t inter[] = {48, 100, 24};
  for (int d = 0; d < 3; d++) {
    lks_dtype dt = tb_mm_dtypes[d];
    uint64_t rng = 6500 + (uint64_t)d;
    lks_expert_call calls[4];
    for (int e = 0; e < 4; e++) {
      int64_t I = inter[e % 3];
      calls[e].gate = tb_upload(
          b, dt, I, H, tb_encode(dt, tb_randv(&rng, (size_t)(I * H), 0.5f), (size_t)(I * H), NULL));
      calls[e].up = tb_upload(
          b, dt, I, H, tb_encode(dt, tb_randv(&rng, (size_t)(I * H), 0.5f), (size_t)(I * H), NULL));
      calls[e].down = tb_upload(
          b, dt, H, I, tb_encode(dt, tb_randv(&rng, (size_t)(H * I), 0.5f), (size_t)(H * I), NULL));
      int n = e == 3 ? (int)R : 1 + e * 9;
      int32_t *rows = TB_NEW(int32_t, n);
      for (int i = 0; i < n; i++) rows[i] = (int32_t)((i * 7 + e) % R);
      calls[e].rows = e == 3 ? NULL : rows;
      calls[e].weights = e == 3 ? NULL : tb_randv(&rng, (size_t)n, 1.5f);
      calls[e].n = n;
    }
    float *xh = tb_randv(&rng, (size_t)(R * H), 2.0f);
    float *oh = tb_randv(&rng, (size_t)(R * H), 1.0f);
    lks_tensor x = tb_upload(b, LKS_F32, R, H, xh);
    lks_tensor o = tb_upload(b, LKS_F32, R, H, oh), os = tb_upload(b, LKS_F32, R, H, oh);
    ck_assert_int_eq(lks_backend_experts(b, o, x, calls, 4), 0);
    for (int e = 0; e < 4; e++)
      ck_assert_int_eq(b->ops->expert(b, os, x, calls[e].rows, calls[e].weights, calls[e].n,
                                      calls[e].gate, calls[e].up, calls[e].down),
                       0);
    bi_compare(tb_download(b, o), tb_download(b, os), NULL, (int)R, H, "experts vs expert calls",
               _i, H);
  }
}
END_TEST

// ---- the row-wise ops: norms, rope, arg-max, embedding, gathers, routing and attention ----

// rmsnorm: the batch x, its reverse xr and each row of x alone.
static void bi_rmsnorm(lks_backend *b, int level, lks_tensor x, lks_tensor xr, lks_tensor w, int n,
                       int64_t K) {
  lks_tensor o = tb_upload(b, LKS_F32, n, K, NULL), orv = tb_upload(b, LKS_F32, n, K, NULL);
  lks_tensor oa = tb_upload(b, LKS_F32, n, K, NULL);
  ck_assert_int_eq(b->ops->rmsnorm(b, o, x, w, 1e-5f), 0);
  ck_assert_int_eq(b->ops->rmsnorm(b, orv, xr, w, 1e-5f), 0);
  for (int r = 0; r < n; r++)
    ck_assert_int_eq(
        b->ops->rmsnorm(b, lks_tensor_rows(oa, r, 1), lks_tensor_rows(x, r, 1), w, 1e-5f), 0);
  bi_compare(tb_download(b, o), tb_download(b, oa), tb_download(b, orv), n, K, "rmsnorm", level, K);
}

// rope over heads of 16 (K rounded down to whole heads), positions by row.
static void bi_rope(lks_backend *b, int level, const float *xh, const float *xrh, int n,
                    int64_t K) {
  int64_t hk = K / 16 * 16;
  int32_t *pos = TB_NEW(int32_t, n), *rpos = TB_NEW(int32_t, n);
  for (int r = 0; r < n; r++) pos[r] = (int32_t)(r * 97 % 4096);
  for (int r = 0; r < n; r++) rpos[r] = pos[n - 1 - r];
  lks_tensor y = lks_tensor_cols(tb_upload(b, LKS_F32, n, K, xh), 0, hk);
  lks_tensor yr = lks_tensor_cols(tb_upload(b, LKS_F32, n, K, xrh), 0, hk);
  lks_tensor ya = lks_tensor_cols(tb_upload(b, LKS_F32, n, K, xh), 0, hk);
  ck_assert_int_eq(b->ops->rope(b, y, 16, 16, 1e6f, LKS_ROPE_HALF_SPLIT, pos), 0);
  ck_assert_int_eq(b->ops->rope(b, yr, 16, 16, 1e6f, LKS_ROPE_HALF_SPLIT, rpos), 0);
  for (int r = 0; r < n; r++)
    ck_assert_int_eq(
        b->ops->rope(b, lks_tensor_rows(ya, r, 1), 16, 16, 1e6f, LKS_ROPE_HALF_SPLIT, pos + r), 0);
  bi_compare(tb_download(b, y), tb_download(b, ya), tb_download(b, yr), n, hk, "rope", level, K);
}

// arg-max of the batch x, its reverse xr and each row alone: the same indices and values.
static void bi_argmax(lks_backend *b, lks_tensor x, lks_tensor xr, int n) {
  int32_t *idx = TB_NEW(int32_t, n), *ridx = TB_NEW(int32_t, n), one;
  float *val = TB_NEW(float, n), *rval = TB_NEW(float, n), v1;
  ck_assert_int_eq(b->ops->argmax(b, x, idx, val), 0);
  ck_assert_int_eq(b->ops->argmax(b, xr, ridx, rval), 0);
  for (int r = 0; r < n; r++) {
    ck_assert_int_eq(b->ops->argmax(b, lks_tensor_rows(x, r, 1), &one, &v1), 0);
    ck_assert_int_eq(idx[r], one);
    ck_assert_int_eq(ridx[n - 1 - r], one);
    ck_assert(memcmp(&val[r], &v1, 4) == 0 && memcmp(&rval[n - 1 - r], &v1, 4) == 0);
  }
}

// embedding and gather: copies, checked for completeness.
static void bi_embed_gather(lks_backend *b, int level, lks_tensor x, const float *xh, int n,
                            int64_t K) {
  int32_t *ids = TB_NEW(int32_t, n);
  for (int r = 0; r < n; r++) ids[r] = (int32_t)((r * 13) % n);
  lks_tensor e = tb_upload(b, LKS_F32, n, K, NULL), ea = tb_upload(b, LKS_F32, n, K, NULL);
  lks_tensor ga = tb_upload(b, LKS_F32, n, K, NULL), gb = tb_upload(b, LKS_F32, n, K, NULL);
  lks_tensor table = tb_upload(b, LKS_BF16, n, K, tb_encode(LKS_BF16, xh, (size_t)(n * K), NULL));
  ck_assert_int_eq(b->ops->embed(b, e, table, ids), 0);
  ck_assert_int_eq(b->ops->gather_rows(b, ga, x, ids), 0);
  for (int r = 0; r < n; r++) {
    ck_assert_int_eq(b->ops->embed(b, lks_tensor_rows(ea, r, 1), table, ids + r), 0);
    ck_assert_int_eq(b->ops->gather_rows(b, lks_tensor_rows(gb, r, 1), x, ids + r), 0);
  }
  bi_compare(tb_download(b, e), tb_download(b, ea), NULL, n, K, "embed", level, K);
  bi_compare(tb_download(b, ga), tb_download(b, gb), NULL, n, K, "gather_rows", level, K);
}

// Width bi_k[ki], bi_rows[ni] rows: rmsnorm, rope, arg-max, embedding and gathers.
static void bi_rowwise_case(lks_backend *b, int level, int ki, int ni) {
  int64_t K = bi_k[ki];
  int n = bi_rows[ni];
  uint64_t rng = 7000 + (uint64_t)(ki * BI_NROWS + ni);
  float *xh = tb_randv(&rng, (size_t)(n * K), 3.0f), *xrh = bi_reverse(xh, n, K);
  float *wh = tb_randv(&rng, (size_t)K, 1.0f);
  lks_tensor w = tb_upload(b, LKS_BF16, 1, K, tb_encode(LKS_BF16, wh, (size_t)K, NULL));
  lks_tensor x = tb_upload(b, LKS_F32, n, K, xh), xr = tb_upload(b, LKS_F32, n, K, xrh);
  bi_rmsnorm(b, level, x, xr, w, n, K);
  bi_rope(b, level, xh, xrh, n, K);
  bi_argmax(b, x, xr, n);
  bi_embed_gather(b, level, x, xh, n, K);
}

// Routing: bi_rows[ni] rows of logits, case pi of rp (pi also picks the seed).
static void bi_route_case(lks_backend *b, const lks_route_params *rp, int pi, int ni) {
  int n = bi_rows[ni], E = rp->n_experts, k = rp->top_k;
  uint64_t rng = 7500 + (uint64_t)(pi * BI_NROWS + ni);
  float *lh = tb_randv(&rng, (size_t)(n * E), 4.0f), *bh = tb_randv(&rng, (size_t)E, 0.3f);
  lks_tensor l = tb_upload(b, LKS_F32, n, E, lh),
             lr = tb_upload(b, LKS_F32, n, E, bi_reverse(lh, n, E));
  lks_tensor bias = tb_upload(b, LKS_F32, 1, E, bh);
  int32_t *ids = TB_NEW(int32_t, n * k), *rids = TB_NEW(int32_t, n * k);
  int32_t *aid = TB_NEW(int32_t, k);
  float *wt = TB_NEW(float, n *k), *rwt = TB_NEW(float, n *k), *aw = TB_NEW(float, k);
  ck_assert_int_eq(b->ops->route(b, l, bias, rp, ids, wt), 0);
  ck_assert_int_eq(b->ops->route(b, lr, bias, rp, rids, rwt), 0);
  for (int r = 0; r < n; r++) {
    ck_assert_int_eq(b->ops->route(b, lks_tensor_rows(l, r, 1), bias, rp, aid, aw), 0);
    ck_assert_mem_eq(ids + r * k, aid, (size_t)k * sizeof *aid);
    ck_assert_mem_eq(wt + r * k, aw, (size_t)k * sizeof *aw);
    ck_assert_mem_eq(rids + (n - 1 - r) * k, aid, (size_t)k * sizeof *aid);
    ck_assert_mem_eq(rwt + (n - 1 - r) * k, aw, (size_t)k * sizeof *aw);
  }
}

// Attention: bi_rows[ni] rows at random (sequence, position) in the cache of `a` (hi picks the
// seed), each row against itself alone.
static void bi_attention_case(lks_backend *b, int level, tb_attn_setup *a, int hi, int ni) {
  int qd = a->n_heads * a->hd;
  int n = bi_rows[ni];
  uint64_t rng = 8100 + (uint64_t)(hi * BI_NROWS + ni);
  int32_t *seq = TB_NEW(int32_t, n), *pos = TB_NEW(int32_t, n), *slot = TB_NEW(int32_t, n);
  int32_t *rseq = TB_NEW(int32_t, n), *rpos = TB_NEW(int32_t, n), *rslot = TB_NEW(int32_t, n);
  for (int r = 0; r < n; r++) {
    seq[r] = (int32_t)(tu_rand(&rng) % TB_NSEQ);
    pos[r] = (int32_t)(tu_rand(&rng) % (uint64_t)tb_seq_len[seq[r]]);
    slot[r] = tb_slot_of(seq[r], pos[r]);
  }
  for (int r = 0; r < n; r++) {
    rseq[r] = seq[n - 1 - r];
    rpos[r] = pos[n - 1 - r];
    rslot[r] = slot[n - 1 - r];
  }
  float *qh = tb_randv(&rng, (size_t)(n * qd), 3.0f);
  lks_tensor q = tb_upload(b, LKS_F32, n, qd, qh),
             qr = tb_upload(b, LKS_F32, n, qd, bi_reverse(qh, n, qd));
  lks_tensor ao = tb_upload(b, LKS_F32, n, qd, NULL), ar = tb_upload(b, LKS_F32, n, qd, NULL);
  lks_tensor aa = tb_upload(b, LKS_F32, n, qd, NULL);
  lks_attn_rows rows = {n, seq, pos, slot, tb_block_table, TB_MAXB};
  lks_attn_rows rrows = {n, rseq, rpos, rslot, tb_block_table, TB_MAXB};
  ck_assert_int_eq(b->ops->attention(b, ao, q, &a->kv, &rows, a->n_heads, 0.125f), 0);
  ck_assert_int_eq(b->ops->attention(b, ar, qr, &a->kv, &rrows, a->n_heads, 0.125f), 0);
  for (int r = 0; r < n; r++) {
    lks_attn_rows one = {1, seq + r, pos + r, slot + r, tb_block_table, TB_MAXB};
    ck_assert_int_eq(b->ops->attention(b, lks_tensor_rows(aa, r, 1), lks_tensor_rows(q, r, 1),
                                       &a->kv, &one, a->n_heads, 0.125f),
                     0);
  }
  bi_compare(tb_download(b, ao), tb_download(b, aa), tb_download(b, ar), n, qd, "attention", level,
             a->hd);
}

// Norms, rope, routing, arg-max, embedding, gathers and attention, batch against alone.
START_TEST(test_batch_invariance_rowwise) {
  lks_backend *b = bi_backend(_i);
  if (!b) return;
  for (int ki = 0; ki < BI_NK; ki++)
    for (int ni = 0; ni < BI_NROWS; ni++) bi_rowwise_case(b, _i, ki, ni);
  // Routing: rows of logits over 160 experts, with and without groups.
  const lks_route_params rp[] = {{160, 8, 1, 1, true, 2.5f}, {64, 6, 8, 3, false, 1.0f}};
  for (int pi = 0; pi < 2; pi++)
    for (int ni = 0; ni < BI_NROWS; ni++) bi_route_case(b, &rp[pi], pi, ni);
  // Attention: head sizes 48 and 80, F32 and BF16 caches, batches of rows at random (sequence,
  // position), each row against itself alone.
  static const int hds[] = {48, 80, 48, 80};
  for (int hi = 0; hi < 4; hi++) {
    tb_attn_setup a = {
        .n_heads = 4, .n_kv = 2, .hd = hds[hi], .dtype = hi < 2 ? LKS_F32 : LKS_BF16};
    tb_fill_cache(b, &a, 8000 + (uint64_t)hi);
    for (int ni = 0; ni < BI_NROWS; ni++) bi_attention_case(b, _i, &a, hi, ni);
  }
}
END_TEST

static Suite *batch_invariance_suite(void) {
  Suite *s = suite_create("batch_invariance");
  TCase *tc = tcase_create("batch_invariance");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 240);
  tcase_add_loop_test(tc, test_batch_invariance_matmul, 0, TU_N_SIMD_LEVELS);
  tcase_add_loop_test(tc, test_batch_invariance_expert, 0, TU_N_SIMD_LEVELS);
  tcase_add_loop_test(tc, test_experts_match_expert_calls, 0, TU_N_SIMD_LEVELS);
  tcase_add_loop_test(tc, test_batch_invariance_rowwise, 0, TU_N_SIMD_LEVELS);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(batch_invariance_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
