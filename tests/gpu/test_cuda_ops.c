// SPDX-License-Identifier: MIT
// Every op of the cuda backend against the CPU backend (the reference) on fresh random inputs.
//
// usage: test_cuda_ops [SEED]     (default: a seed from the clock, printed first)
//        test_cuda_ops --rates    (copy bandwidth and BF16 matmul rate, for tests/gpu/run.sh)
//
// Each case builds the same inputs on both backends (weights wrapped from one host array, as the
// loader does, whole or as a column shard; activations as strided views), poisons every output
// with NaN first so that an element an op forgets to write shows, runs the op on both and
// compares max|cuda - cpu| / max|cpu| with a bound of 1e-5 (all arithmetic is f32). NaN never
// passes. Integer results (routing ids, arg-max, the DSA indexer's selection) must be equal.
// Matrix products, experts, the indexer's selection and MLA attention are also checked against
// themselves: each row of a batch must equal, bit for bit, the same row computed alone (greedy
// output must not depend on how rows were batched). Exit status 0 when every case passes, 1
// otherwise, 77 when this machine has no CUDA device (ctest: skipped).
//
// The harness is cuda_harness.c; the cases of quantized products, the moe op, recorded steps and
// glm_moe_dsa's ops are in test_cuda_ops_moe_mla.c.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/error.h"
#include "cuda/cuda_impl.h"
#include "cuda_harness.h"

// ---- cases ----

static void t_zero(void) {
  tp a = act(5, 48, 48, false);
  TRY(CPU->ops->zero(CPU, lks_tensor_cols(a.c, 8, 20)));
  TRY(GPU->ops->zero(GPU, lks_tensor_cols(a.g, 8, 20)));
  check("zero: a column view, the rest untouched", cmp(a), 0);
  act_free(a);
}

static void t_embed(void) {
  lks_dtype dts[] = {LKS_F32, LKS_BF16, LKS_F16};
  for (int d = 0; d < 3; d++)
    for (int shard = 0; shard < 2; shard++) {
      tp table = weight(dts[d], 300, 136, shard, 1.0f);
      tp out = act(7, 136, 141, true);
      int32_t ids[7];
      for (int i = 0; i < 7; i++) ids[i] = irand(300);
      ids[6] = 299;
      TRY(CPU->ops->embed(CPU, out.c, table.c, ids));
      TRY(GPU->ops->embed(GPU, out.g, table.g, ids));
      char what[96];
      snprintf(what, sizeof what, "embed: %s table%s", dn(dts[d]), shard ? ", column shard" : "");
      check(what, cmp(out), 0);
      act_free(out);
    }
  tp table = weight(LKS_F32, 10, 8, false, 1.0f), out = act(1, 8, 8, true);
  int32_t bad = 10;
  cases++;
  if (GPU->ops->embed(GPU, out.g, table.g, &bad) != LKS_ERANGE) {
    failures++;
    printf("embed: a token id outside the vocabulary is not refused  FAIL\n");
  }
  act_free(out);
}

static void t_rmsnorm(void) {
  lks_dtype dts[] = {LKS_F32, LKS_BF16};
  for (int d = 0; d < 2; d++)
    for (int inplace = 0; inplace < 2; inplace++) {
      tp w = weight(dts[d], 1, 200, false, 1.0f);
      tp x = act(6, 200, 210, false);
      tp out = inplace ? x : act(6, 200, 203, true);
      TRY(CPU->ops->rmsnorm(CPU, out.c, x.c, w.c, 1e-5f));
      TRY(GPU->ops->rmsnorm(GPU, out.g, x.g, w.g, 1e-5f));
      char what[96];
      snprintf(what, sizeof what, "rmsnorm: %s weight%s", dn(dts[d]), inplace ? ", in place" : "");
      check(what, cmp(out), 1e-5);
      if (!inplace) act_free(out);
      act_free(x);
    }
}

static void t_matmul(void) {
  lks_dtype dts[] = {LKS_F32, LKS_BF16, LKS_F16};
  int ns[] = {1, 2, 5, 8, 9, 33};
  int Ks[] = {1024, 203};
  for (int d = 0; d < 3; d++)
    for (int ni = 0; ni < 6; ni++)
      for (int ki = 0; ki < 2; ki++)
        for (int shard = 0; shard < 2; shard++)
          for (int bias = 0; bias < 3; bias++)
            for (int acc = 0; acc < 2; acc++) {
              int n = ns[ni], K = Ks[ki], M = 96;
              tp w = weight(dts[d], M, K, shard, 0.05f);
              tp b = bias == 0 ? none() : weight(bias == 1 ? LKS_F32 : LKS_BF16, 1, M, false, 1.0f);
              tp x = act(n, K, K + (ki ? 3 : 4), false);
              tp out = act(n, M, M + 2, !acc);
              TRY(CPU->ops->matmul(CPU, out.c, x.c, w.c, b.c, acc));
              TRY(GPU->ops->matmul(GPU, out.g, x.g, w.g, b.g, acc));
              char what[128];
              snprintf(what, sizeof what, "matmul: %s weights, %d rows, K %d%s%s%s", dn(dts[d]), n, K,
                       shard ? ", shard" : "", bias ? (bias == 1 ? ", f32 bias" : ", bf16 bias") : "",
                       acc ? ", accumulate" : "");
              check(what, cmp(out), 1e-5);
              act_free(x);
              act_free(out);
            }
}

static void t_rope(void) {
  for (int layout = 0; layout < 2; layout++)
    for (int partial = 0; partial < 2; partial++)
      for (int th = 0; th < 2; th++) {
        int hd = 64, heads = 4, n = 9, rot = partial ? hd / 2 : hd;
        float theta = th ? 1e6f : 10000.0f;
        tp x = act(n, (int64_t)heads * hd, (int64_t)heads * hd + 6, false);
        int32_t pos[9];
        for (int i = 0; i < n; i++) pos[i] = irand(6000);
        pos[0] = 0;
        lks_rope_layout lo = layout ? LKS_ROPE_INTERLEAVED : LKS_ROPE_HALF_SPLIT;
        TRY(CPU->ops->rope(CPU, x.c, hd, rot, theta, lo, pos));
        TRY(GPU->ops->rope(GPU, x.g, hd, rot, theta, lo, pos));
        char what[96];
        snprintf(what, sizeof what, "rope: %s, %s, theta %g", layout ? "interleaved" : "half-split",
                 partial ? "partial" : "full", theta);
        check(what, cmp(x), 1e-5);
        act_free(x);
      }
}

static void t_attention(void) {
  for (int hi = 0; hi < 2; hi++) {
    int hd = hi ? 128 : 64, nkv = 2, nh = 8, bs = 16, n_blocks = 64, max_blocks = 48;
    int64_t width = (int64_t)nkv * hd;
    tp K = act((int64_t)n_blocks * bs, width, width, false);
    tp V = act((int64_t)n_blocks * bs, width, width, false);
    lks_kv_layer kc = {K.c.buf, V.c.buf, n_blocks, bs, nkv, hd, LKS_F32};
    lks_kv_layer kg = {K.g.buf, V.g.buf, n_blocks, bs, nkv, hd, LKS_F32};
    // Three sequences over a shuffled block pool: 700 positions (three score chunks), 37, 1.
    int perm[64];
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
      int j = irand(i + 1), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    int32_t table[3 * 48];
    for (int i = 0; i < 3 * max_blocks; i++) table[i] = perm[i % n_blocks];
    // Rows: sequence 0 at its last position, sequence 1 prefilled at 30..36, sequence 2 at 0.
    enum { N = 9 };
    int32_t seq[N] = {0, 1, 1, 1, 1, 1, 1, 1, 2}, pos[N] = {699, 30, 31, 32, 33, 34, 35, 36, 0};
    int32_t slot[N];
    for (int i = 0; i < N; i++)
      slot[i] = table[seq[i] * max_blocks + pos[i] / bs] * bs + pos[i] % bs;
    lks_attn_rows rows = {N, seq, pos, slot, table, max_blocks};
    tp k = act(N, width, width + 2, false), v = act(N, width, width + 5, false);
    TRY(CPU->ops->kv_store(CPU, &kc, k.c, v.c, &rows));
    TRY(GPU->ops->kv_store(GPU, &kg, k.g, v.g, &rows));
    char what[96];
    snprintf(what, sizeof what, "kv_store: head_dim %d, K cache", hd);
    check(what, cmp(K), 0);
    snprintf(what, sizeof what, "kv_store: head_dim %d, V cache", hd);
    check(what, cmp(V), 0);
    tp q = act(N, (int64_t)nh * hd, (int64_t)nh * hd + 4, false);
    tp out = act(N, (int64_t)nh * hd, (int64_t)nh * hd + 8, true);
    float scale = 1.0f / sqrtf((float)hd);
    TRY(CPU->ops->attention(CPU, out.c, q.c, &kc, &rows, nh, scale));
    TRY(GPU->ops->attention(GPU, out.g, q.g, &kg, &rows, nh, scale));
    snprintf(what, sizeof what, "attention: head_dim %d, GQA %d/%d, contexts 700/37/1", hd, nh, nkv);
    check(what, cmp(out), 1e-5);
    act_free(K);
    act_free(V);
    act_free(k);
    act_free(v);
    act_free(q);
    act_free(out);
  }
}

static void t_route(void) {
  struct {
    int E, k, g, tg, norm, ties;
  } cfg[] = {{16, 4, 1, 1, 1, 0}, {16, 4, 4, 2, 0, 0}, {64, 8, 8, 3, 1, 0},
             {160, 8, 1, 1, 1, 0}, {160, 8, 8, 4, 1, 0}, {32, 4, 4, 2, 1, 1}, {32, 6, 1, 1, 0, 1}};
  for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
    int E = cfg[ci].E, k = cfg[ci].k, n = 13;
    tp logits = act(n, E, E + 3, false);
    if (cfg[ci].ties) {
      // Equal scores everywhere: ids must be the lowest ones on both backends.
      tp z = act(n, E, E + 3, false);
      act_free(logits);
      logits = z;
      TRY(CPU->ops->zero(CPU, logits.c));
      TRY(GPU->ops->zero(GPU, logits.g));
    }
    tp bias = weight(LKS_F32, 1, E, false, cfg[ci].ties ? 0.0f : 0.1f);
    lks_route_params p = {E, k, cfg[ci].g, cfg[ci].tg, cfg[ci].norm != 0, 2.5f};
    int32_t *ic = malloc((size_t)n * k * 4), *ig = malloc((size_t)n * k * 4);
    float *wc = malloc((size_t)n * k * 4), *wg = malloc((size_t)n * k * 4);
    for (int i = 0; i < n * k; i++) {
      ig[i] = -7;
      wg[i] = NAN;
    }
    TRY(CPU->ops->route(CPU, logits.c, bias.c, &p, ic, wc));
    TRY(GPU->ops->route(GPU, logits.g, bias.g, &p, ig, wg));
    int same = 0;
    double md = 0, mr = 0;
    for (int i = 0; i < n * k; i++) {
      same += ic[i] == ig[i];
      double d = fabs((double)wg[i] - wc[i]);
      if (!(d <= md)) md = d;
      if (fabs(wc[i]) > mr) mr = fabs(wc[i]);
    }
    char what[128];
    snprintf(what, sizeof what, "route: %d experts, top %d, %d groups (top %d)%s%s: ids", E, k,
             cfg[ci].g, cfg[ci].tg, cfg[ci].norm ? ", normalised" : "", cfg[ci].ties ? ", ties" : "");
    check(what, same == n * k ? 0.0 : 1.0, 0);
    snprintf(what, sizeof what, "route: %d experts, top %d, %d groups: weights", E, k, cfg[ci].g);
    check(what, mr > 0 ? md / mr : md, 1e-5);
    free(ic);
    free(ig);
    free(wc);
    free(wg);
    act_free(logits);
  }
}

static void t_expert(void) {
  lks_dtype dts[] = {LKS_F32, LKS_BF16};
  int ns[] = {1, 3, 8, 20};
  for (int d = 0; d < 2; d++)
    for (int ni = 0; ni < 4; ni++)
      for (int sel = 0; sel < 2; sel++)
        for (int wt = 0; wt < 2; wt++) {
          int N = 25, n = ns[ni], H = 256, I = 96;
          tp gate = weight(dts[d], I, H, false, 0.1f), up = weight(dts[d], I, H, wt != 0, 0.1f);
          tp down = weight(dts[d], H, I, false, 0.1f);
          tp x = act(N, H, H + 4, false), out = act(N, H, H + 2, false);
          int32_t rows[25];
          float w[25];
          int perm[25];
          for (int i = 0; i < N; i++) perm[i] = i;
          for (int i = N - 1; i > 0; i--) {
            int j = irand(i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
          }
          for (int i = 0; i < n; i++) {
            rows[i] = perm[i];
            w[i] = frand();
          }
          const int32_t *r = sel ? rows : NULL;
          const float *ww = wt ? w : NULL;
          TRY(CPU->ops->expert(CPU, out.c, x.c, r, ww, n, gate.c, up.c, down.c));
          TRY(GPU->ops->expert(GPU, out.g, x.g, r, ww, n, gate.g, up.g, down.g));
          char what[128];
          snprintf(what, sizeof what, "expert: %s, %d rows%s%s", dn(dts[d]), n,
                   sel ? ", selected" : "", wt ? ", weighted, up a column shard" : "");
          check(what, cmp(out), 1e-5);
          act_free(x);
          act_free(out);
        }
}

// ---- batch invariance: a row's result does not depend on the rows computed with it ----

// Rows [s, s + n) of a 40-row activation as one batch, then each of them alone (a one-row view
// of the same memory, and a copy in a buffer of its own, so that neither the batch nor the
// address decides): equal bits. Odd M and K; the batch starts at an odd row.
static void t_matmul_batch(void) {
  lks_dtype dts[] = {LKS_F32, LKS_BF16, LKS_F16};
  int ns[] = {1, 3, 8, 9, 12, 33};
  int Ks[] = {1024, 203, 2056};
  for (int d = 0; d < 3; d++)
    for (int ki = 0; ki < 3; ki++)
      for (int ni = 0; ni < 6; ni++)
        for (int variant = 0; variant < 2; variant++) {
          int n = ns[ni], K = Ks[ki], M = 77, s0 = variant ? 7 : 0;
          bool bias_on = variant == 1, acc = variant == 1;
          tp w = weight(dts[d], M, K, variant == 1, 0.05f);
          tp b = bias_on ? weight(LKS_BF16, 1, M, false, 1.0f) : none();
          tp x = act(40, K, K + 4, false);
          tp ob = act(40, M, M + 3, false);  // the batch's results (and accumulation base)
          tp oa = act(40, M, M + 3, false);  // each row alone
          // The same accumulation base in both.
          float *h = malloc((size_t)40 * (M + 3) * 4);
          TRY(GPU->ops->to_host(GPU, h, ob.g.buf, 0, (size_t)40 * (M + 3) * 4));
          TRY(GPU->ops->from_host(GPU, oa.g.buf, 0, h, (size_t)40 * (M + 3) * 4));
          free(h);
          lks_tensor xb = lks_tensor_rows(x.g, s0, n), obv = lks_tensor_rows(ob.g, s0, n);
          TRY(GPU->ops->matmul(GPU, obv, xb, w.g, b.g, acc));
          tp one = act(1, K, K + 1, false);  // an unaligned row of its own (ld K + 1)
          int64_t bad = -1;
          int ok = 1;
          for (int i = 0; i < n; i++) {
            lks_tensor xi = lks_tensor_rows(x.g, s0 + i, 1), oi = lks_tensor_rows(oa.g, s0 + i, 1);
            if (i % 2) {
              // Alone, from a copy at another address and row stride.
              float *row = malloc((size_t)K * 4);
              TRY(lks_tensor_to_host_f32(GPU, row, xi));
              TRY(GPU->ops->from_host(GPU, one.g.buf, 0, row, (size_t)K * 4));
              free(row);
              xi = one.g;
            }
            TRY(GPU->ops->matmul(GPU, oi, xi, w.g, b.g, acc));
          }
          ok = same_bits(obv, lks_tensor_rows(oa.g, s0, n), n, &bad);
          char what[160];
          snprintf(what, sizeof what, "matmul: %s, K %d, %d rows%s: batch = each row alone (bitwise)",
                   dn(dts[d]), K, n, variant ? " from row 7, shard, bias, accumulate" : "");
          check(what, ok ? 0.0 : 1.0, 0);
          if (!ok) printf("    first differing row: %lld\n", (long long)bad);
          act_free(one);
          act_free(x);
          act_free(ob);
          act_free(oa);
        }
}

// An expert over n selected rows with weights, against each row alone.
static void t_expert_batch(void) {
  lks_dtype dts[] = {LKS_F32, LKS_BF16};
  int ns[] = {1, 3, 8, 9, 12, 33};
  for (int d = 0; d < 2; d++)
    for (int ni = 0; ni < 6; ni++) {
      int N = 40, n = ns[ni], H = 200, I = 72;
      tp gate = weight(dts[d], I, H, false, 0.1f), up = weight(dts[d], I, H, true, 0.1f);
      tp down = weight(dts[d], H, I, false, 0.1f);
      tp x = act(N, H, H + 4, false), ob = act(N, H, H, false), oa = act(N, H, H, false);
      float *h = malloc((size_t)N * H * 4);
      TRY(lks_tensor_to_host_f32(GPU, h, ob.g));
      TRY(GPU->ops->from_host(GPU, oa.g.buf, 0, h, (size_t)N * H * 4));
      free(h);
      int32_t rows[40];
      float wt[40];
      int perm[40];
      for (int i = 0; i < N; i++) perm[i] = i;
      for (int i = N - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
      }
      for (int i = 0; i < n; i++) {
        rows[i] = perm[i];
        wt[i] = frand();
      }
      TRY(GPU->ops->expert(GPU, ob.g, x.g, rows, wt, n, gate.g, up.g, down.g));
      for (int i = 0; i < n; i++)
        TRY(GPU->ops->expert(GPU, oa.g, x.g, rows + i, wt + i, 1, gate.g, up.g, down.g));
      int64_t bad = -1;
      int ok = same_bits(ob.g, oa.g, N, &bad);
      char what[128];
      snprintf(what, sizeof what, "expert: %s, %d selected rows: batch = each row alone (bitwise)",
               dn(dts[d]), n);
      check(what, ok ? 0.0 : 1.0, 0);
      if (!ok) printf("    first differing row: %lld\n", (long long)bad);
      act_free(x);
      act_free(ob);
      act_free(oa);
    }
}

static void t_gather(void) {
  tp x = act(20, 100, 104, false), out = act(7, 100, 101, true);
  int32_t rows[7];
  for (int i = 0; i < 7; i++) rows[i] = irand(20);
  TRY(CPU->ops->gather_rows(CPU, out.c, x.c, rows));
  TRY(GPU->ops->gather_rows(GPU, out.g, x.g, rows));
  check("gather_rows", cmp(out), 0);
  act_free(x);
  act_free(out);
}

static void t_argmax(void) {
  int Vs[] = {7, 1000, 151552};
  for (int vi = 0; vi < 3; vi++) {
    int V = Vs[vi], n = 5;
    tp x = act(n, V, V + 1, false);
    // Row 1: the maximum at several places; row 2: all equal; row 3: the maximum last.
    float *h = malloc((size_t)V * 4);
    for (int i = 0; i < V; i++) h[i] = frand();
    h[V / 3] = h[V / 2] = h[V - 1] = 5.0f;
    TRY(CPU->ops->from_host(CPU, x.c.buf, (size_t)(V + 1) * 4, h, (size_t)V * 4));
    TRY(GPU->ops->from_host(GPU, x.g.buf, (size_t)(V + 1) * 4, h, (size_t)V * 4));
    for (int i = 0; i < V; i++) h[i] = 0.25f;
    TRY(CPU->ops->from_host(CPU, x.c.buf, (size_t)2 * (V + 1) * 4, h, (size_t)V * 4));
    TRY(GPU->ops->from_host(GPU, x.g.buf, (size_t)2 * (V + 1) * 4, h, (size_t)V * 4));
    for (int i = 0; i < V; i++) h[i] = frand();
    h[V - 1] = 9.0f;
    TRY(CPU->ops->from_host(CPU, x.c.buf, (size_t)3 * (V + 1) * 4, h, (size_t)V * 4));
    TRY(GPU->ops->from_host(GPU, x.g.buf, (size_t)3 * (V + 1) * 4, h, (size_t)V * 4));
    free(h);
    int32_t ic[5], ig[5] = {-1, -1, -1, -1, -1};
    float vc[5], vg[5] = {NAN, NAN, NAN, NAN, NAN};
    TRY(CPU->ops->argmax(CPU, x.c, ic, vc));
    TRY(GPU->ops->argmax(GPU, x.g, ig, vg));
    int same = 0;
    for (int i = 0; i < n; i++) same += ic[i] == ig[i] && vc[i] == vg[i];
    char what[96];
    snprintf(what, sizeof what, "argmax: %d columns, ties to the lowest index", V);
    check(what, same == n ? 0.0 : 1.0, 0);
    int32_t only;
    TRY(GPU->ops->argmax(GPU, lks_tensor_rows(x.g, 1, 1), &only, NULL));
    check("argmax: val NULL", only == ic[1] ? 0.0 : 1.0, 0);
    act_free(x);
  }
}

static void t_buffers(void) {
  lks_buf *b = GPU->ops->buf_alloc(GPU, 64);
  float h[16];
  cases++;
  if (GPU->ops->to_host(GPU, h, b, 32, 64) != LKS_ERANGE) {
    failures++;
    printf("to_host: a range outside the buffer is not refused  FAIL\n");
  }
  TRY(GPU->ops->to_host(GPU, h, b, 0, 64));
  int zeros = 0;
  for (int i = 0; i < 16; i++) zeros += h[i] == 0.0f;
  check("buf_alloc: zeroed", zeros == 16 ? 0.0 : 1.0, 0);
  GPU->ops->buf_free(GPU, b);
  lks_buf *wb = GPU->ops->buf_wrap_host(GPU, h, sizeof h);
  cases++;
  if (GPU->ops->from_host(GPU, wb, 0, h, 4) != LKS_ERANGE) {
    failures++;
    printf("from_host: a wrapped (read-only) buffer is not refused  FAIL\n");
  }
  GPU->ops->buf_free(GPU, wb);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// --rates: the limits the benchmark is measured against. Device-to-device copy bandwidth
// (bytes read + bytes written per second, the median of 9 copies of 2 GiB), the chip's BF16
// matrix rate (cuBLAS on tensor cores) and the backend's own matmul rate with BF16 weights, both
// at prefill shape (4096 rows x 8192 x 8192).
static int rates(void) {
  size_t bytes = (size_t)2 << 30;
  void *a = NULL, *b = NULL;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    fprintf(stderr, "rates: cannot allocate 2 x 2 GiB\n");
    return 1;
  }
  cudaMemset(a, 1, bytes);
  double best[9];
  for (int r = 0; r < 9; r++) {
    cudaDeviceSynchronize();
    double t0 = now();
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    best[r] = now() - t0;
  }
  for (int i = 0; i < 9; i++)
    for (int j = i + 1; j < 9; j++)
      if (best[j] < best[i]) {
        double t = best[i];
        best[i] = best[j];
        best[j] = t;
      }
  cudaFree(a);
  cudaFree(b);
  printf("d2d copy bandwidth: %.1f GB/s (read + written)\n", 2.0 * bytes / best[4] / 1e9);
  int n = 4096, M = 8192, K = 8192;
  tp w = weight(LKS_BF16, M, K, false, 0.05f);
  lks_buf *xb = GPU->ops->buf_alloc(GPU, (size_t)n * K * 4), *ob = GPU->ops->buf_alloc(GPU, (size_t)n * M * 4);
  void *x16 = NULL;
  if (!xb || !ob || cudaMalloc(&x16, (size_t)n * K * 2) != cudaSuccess) TRY(-1);
  float *hx = malloc((size_t)n * K * 4);
  for (size_t i = 0; i < (size_t)n * K; i++) hx[i] = frand();
  TRY(GPU->ops->from_host(GPU, xb, 0, hx, (size_t)n * K * 4));
  free(hx);
  lks_tensor x = lks_tensor_2d(xb, 0, LKS_F32, n, K), o = lks_tensor_2d(ob, 0, LKS_F32, n, M);
  // The chip's BF16 rate on this shape: cuBLAS on tensor cores, f32 accumulation and output.
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) TRY(-1);
  lks__cu_convert(0, x16, LKS_BF16, K, GPU->ops->buf_ptr(GPU, xb), LKS_F32, K, n, K);
  float one = 1.0f, zero = 0.0f;
  void *wd = GPU->ops->buf_ptr(GPU, w.g.buf), *od = GPU->ops->buf_ptr(GPU, ob);
  double t = 0;
  for (int r = 0; r < 6; r++) {
    if (r == 1) {
      cudaDeviceSynchronize();
      t = now();
    }
    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, M, n, K, &one, wd, CUDA_R_16BF, K, x16, CUDA_R_16BF,
                     K, &zero, od, CUDA_R_32F, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
        CUBLAS_STATUS_SUCCESS)
      TRY(-1);
  }
  cudaDeviceSynchronize();
  t = (now() - t) / 5;
  printf("bf16 matmul rate: %.1f TFLOP/s (cuBLAS, BF16 tensor cores, %d x %d x %d)\n",
         2.0 * n * M * K / t / 1e12, n, M, K);
  cublasDestroy(h);
  cudaFree(x16);
  // The backend's own product (exact f32 arithmetic, the same for every row count).
  lks_tensor nob = {0};
  TRY(GPU->ops->matmul(GPU, o, x, w.g, nob, false));  // warm-up
  cudaDeviceSynchronize();
  t = now();
  for (int r = 0; r < 3; r++) TRY(GPU->ops->matmul(GPU, o, x, w.g, nob, false));
  cudaDeviceSynchronize();
  t = (now() - t) / 3;
  printf("backend matmul rate: %.1f TFLOP/s (BF16 weights, exact f32 kernel, %d x %d x %d)\n",
         2.0 * n * M * K / t / 1e12, n, M, K);
  // Decode: one activation row against the same 128 MB of weights (twice the L2), the weight
  // bytes read per second; and the time of one small product, mostly launch overhead.
  lks_tensor x1 = lks_tensor_rows(x, 0, 1), o1 = lks_tensor_rows(o, 0, 1);
  TRY(GPU->ops->matmul(GPU, o1, x1, w.g, nob, false));
  cudaDeviceSynchronize();
  t = now();
  for (int r = 0; r < 20; r++) TRY(GPU->ops->matmul(GPU, o1, x1, w.g, nob, false));
  cudaDeviceSynchronize();
  t = (now() - t) / 20;
  printf("backend decode matmul: %.1f GB/s of weights (1 row x %d x %d BF16, %.1f us)\n",
         2.0 * M * K / t / 1e9, M, K, t * 1e6);
  lks_tensor small = lks_tensor_rows(w.g, 0, 64);
  small.cols = 64;
  TRY(GPU->ops->matmul(GPU, lks_tensor_cols(o1, 0, 64), lks_tensor_cols(x1, 0, 64), small, nob, false));
  cudaDeviceSynchronize();
  t = now();
  for (int r = 0; r < 2000; r++)
    TRY(GPU->ops->matmul(GPU, lks_tensor_cols(o1, 0, 64), lks_tensor_cols(x1, 0, 64), small, nob, false));
  double th = (now() - t) / 2000;
  cudaDeviceSynchronize();
  t = (now() - t) / 2000;
  printf("backend small matmul (1 x 64 x 64): %.2f us each on the host, %.2f us until done\n",
         th * 1e6, t * 1e6);
  GPU->ops->buf_free(GPU, xb);
  GPU->ops->buf_free(GPU, ob);
  return 0;
}

int main(int argc, char **argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    // What can be checked without a device: the backend refuses to start, with a reason.
    lks_backend *none_be = lks_backend_new_on("cuda", 0, -1);
    if (none_be || !strstr(lks_last_error(), "no CUDA device")) {
      fprintf(stderr, "without a device, the cuda backend should fail with 'no CUDA device', not '%s'\n",
              lks_last_error());
      return 1;
    }
    printf("test_cuda_ops: no CUDA device here (%s): skipped\n", lks_last_error());
    return 77;
  }
  if (argc > 1 && strcmp(argv[1], "--rates") == 0) {
    CPU = lks_backend_new("cpu", 1);
    GPU = lks_backend_new_on("cuda", 0, -1);
    if (!CPU || !GPU) return 1;
    int rc = rates();
    lks_backend_free(GPU);
    lks_backend_free(CPU);
    free_held();
    return rc;
  }
  unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
  rng_state = seed * 2654435761ull + 88172645463325252ull;
  printf("test_cuda_ops: seed %llu\n", seed);
  CPU = lks_backend_new("cpu", 0);
  GPU = lks_backend_new_on("cuda", 0, -1);
  if (!CPU || !GPU) {
    fprintf(stderr, "cannot create the backends: %s\n", lks_last_error());
    return 1;
  }
  t_buffers();
  t_zero();
  t_embed();
  t_rmsnorm();
  t_matmul();
  t_qmatmul();
  t_rope();
  t_attention();
  t_route();
  t_expert();
  t_matmul_batch();
  t_expert_batch();
  t_moe();
  t_step();
  t_gather();
  t_argmax();
  t_layernorm();
  t_cache_store();
  t_dsa_select();
  t_mla_attention();
  printf("test_cuda_ops: %d of %d cases within bounds%s\n", cases - failures, cases,
         failures ? "  FAILED" : "");
  lks_backend_free(GPU);
  lks_backend_free(CPU);
  free_held();
  return failures ? 1 : 0;
}
