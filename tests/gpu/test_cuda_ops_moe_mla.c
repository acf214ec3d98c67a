// SPDX-License-Identifier: MIT
// The cuda backend against the CPU backend (see test_cuda_ops.c, whose main runs these): quantized
// matrix products, the moe op, steps recorded as CUDA graphs, and glm_moe_dsa's ops (LayerNorm,
// the k-only cache, the DSA indexer's selection, MLA attention).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cuda_harness.h"

// Quantized weights (FP8 per row, FP8 128-blocks, NVFP4) against the CPU backend's kernels.
void t_qmatmul(void) {
  lks_qscheme qss[] = {LKS_Q_FP8_ROW, LKS_Q_FP8_BLOCK, LKS_Q_NVFP4};
  int ns[] = {1, 3, 8, 33};
  for (int q = 0; q < 3; q++)
    for (int ni = 0; ni < 4; ni++)
      for (int acc = 0; acc < 2; acc++) {
        bool fp4 = qss[q] == LKS_Q_NVFP4;
        int n = ns[ni], K = fp4 ? 1024 : 200, M = 300;
        size_t cb = (size_t)M * (fp4 ? K / 2 : K);
        uint8_t *codes = hold(cb);
        for (size_t i = 0; i < cb; i++) {
          codes[i] = (uint8_t)rnd();
          if (!fp4 && (codes[i] & 0x7f) == 0x7f) codes[i] = 0x3f;  // no NaN codes
        }
        int64_t sld = fp4 ? K / 16 : qss[q] == LKS_Q_FP8_BLOCK ? (K + 127) / 128 : 1;
        size_t sn = fp4 ? (size_t)M * sld : qss[q] == LKS_Q_FP8_BLOCK ? (size_t)((M + 127) / 128) * sld : (size_t)M;
        size_t sb = fp4 ? sn : sn * 4;
        void *sc = hold(sb);
        for (size_t i = 0; i < sn; i++) {
          if (fp4) {
            ((uint8_t *)sc)[i] = (uint8_t)(rnd() % 0x7e);
          } else {
            ((float *)sc)[i] = 0.001f + 0.01f * fabsf(frand());
          }
        }
        tp w;
        w.c = lks_tensor_2d(CPU->ops->buf_wrap_host(CPU, codes, cb), 0, fp4 ? LKS_F4_E2M1X2 : LKS_F8_E4M3, M, K);
        w.g = lks_tensor_2d(GPU->ops->buf_wrap_host(GPU, codes, cb), 0, fp4 ? LKS_F4_E2M1X2 : LKS_F8_E4M3, M, K);
        lks_tensor *ts[2] = {&w.c, &w.g};
        lks_backend *bes[2] = {CPU, GPU};
        for (int b = 0; b < 2; b++) {
          ts[b]->ld = fp4 ? K / 2 : K;
          ts[b]->qs = qss[q];
          ts[b]->sld = sld;
          ts[b]->qglobal = 0.37f;
          ts[b]->sbuf = bes[b]->ops->buf_alloc(bes[b], sb);
          TRY(bes[b]->ops->from_host(bes[b], ts[b]->sbuf, 0, sc, sb));
        }
        tp x = act(n, K, K + 3, false);
        tp out = act(n, M, M + 2, !acc);
        TRY(CPU->ops->matmul(CPU, out.c, x.c, w.c, none().c, acc));
        TRY(GPU->ops->matmul(GPU, out.g, x.g, w.g, none().g, acc));
        char what[128];
        snprintf(what, sizeof what, "matmul: %s weights, %d rows, K %d%s",
                 lks_qscheme_name(qss[q], w.c.dtype), n, K, acc ? ", accumulate" : "");
        check(what, cmp(out), 1e-5);
        act_free(x);
        act_free(out);
      }
}

// ---- moe: routing and every selected expert on the device, one call ----

typedef struct {
  lks_tensor gate, up, down;
} ffn_t;

// The CPU reference of the moe op: route, then each row's selected experts in rank order (the
// local ones only), one expert call per pair.
static void cpu_moe(lks_tensor out, lks_tensor x, lks_tensor logits, lks_tensor bias,
                    const lks_route_params *p, const ffn_t *ex, int e0, int nl, int32_t *ids,
                    float *w) {
  int n = (int)logits.rows, k = p->top_k;
  TRY(CPU->ops->route(CPU, logits, bias, p, ids, w));
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      int e = ids[r * k + j];
      if (e < e0 || e >= e0 + nl) continue;
      TRY(CPU->ops->expert(CPU, out, x, &r, &w[r * k + j], 1, ex[e].gate, ex[e].up, ex[e].down));
    }
}

void t_moe(void) {
  struct {
    int E, k, g, tg, e0, nl;
    lks_dtype dt;
  } cfg[] = {{16, 4, 1, 1, 0, 16, LKS_BF16}, {32, 8, 4, 2, 0, 32, LKS_BF16},
             {16, 4, 4, 2, 8, 8, LKS_F32},   {32, 8, 1, 1, 16, 16, LKS_BF16},
             {24, 6, 1, 1, 0, 24, LKS_F16}};
  int ns[] = {1, 3, 8, 9, 33};
  for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
    int E = cfg[ci].E, k = cfg[ci].k, H = 256, I = 96, N = 40;
    ffn_t ec[32], eg[32];
    memset(ec, 0, sizeof ec);
    memset(eg, 0, sizeof eg);
    for (int e = cfg[ci].e0; e < cfg[ci].e0 + cfg[ci].nl; e++) {
      tp g = weight(cfg[ci].dt, I, H, false, 0.1f), u = weight(cfg[ci].dt, I, H, false, 0.1f);
      tp d = weight(cfg[ci].dt, H, I, false, 0.1f);
      ec[e] = (ffn_t){g.c, u.c, d.c};
      eg[e] = (ffn_t){g.g, u.g, d.g};
    }
    lks_moe_experts exg = {&eg[0].gate, &eg[0].up, &eg[0].down, 3, cfg[ci].e0, cfg[ci].nl};
    tp bias = weight(LKS_F32, 1, E, false, 0.1f);
    lks_route_params p = {E, k, cfg[ci].g, cfg[ci].tg, true, 2.5f};
    tp x = act(N, H, H + 4, false), logits = act(N, E, E + 3, false);
    for (int ni = 0; ni < 5; ni++) {
      int n = ns[ni];
      tp out = act(n, H, H + 2, false);
      int32_t ic[40 * 8], ig[40 * 8];
      float wc[40 * 8], wg[40 * 8];
      for (int i = 0; i < n * k; i++) {
        ig[i] = -7;
        wg[i] = NAN;
      }
      lks_tensor xc = lks_tensor_rows(x.c, 0, n), xg = lks_tensor_rows(x.g, 0, n);
      lks_tensor lc = lks_tensor_rows(logits.c, 0, n), lg = lks_tensor_rows(logits.g, 0, n);
      cpu_moe(out.c, xc, lc, bias.c, &p, ec, cfg[ci].e0, cfg[ci].nl, ic, wc);
      TRY(GPU->ops->moe(GPU, out.g, xg, lg, bias.g, &p, &exg, ig, wg));
      int same = 0;
      double md = 0, mr = 0;
      for (int i = 0; i < n * k; i++) {
        same += ic[i] == ig[i];
        double dd = fabs((double)wg[i] - wc[i]);
        if (!(dd <= md)) md = dd;
        if (fabs(wc[i]) > mr) mr = fabs(wc[i]);
      }
      char what[160];
      snprintf(what, sizeof what, "moe: %s, %d experts [%d, +%d), top %d, %d groups, %d rows: ids",
               dn(cfg[ci].dt), E, cfg[ci].e0, cfg[ci].nl, k, cfg[ci].g, n);
      check(what, same == n * k ? 0.0 : 1.0, 0);
      snprintf(what, sizeof what, "moe: %s, %d experts, %d rows: weights", dn(cfg[ci].dt), E, n);
      check(what, mr > 0 ? md / mr : md, 1e-5);
      snprintf(what, sizeof what, "moe: %s, %d experts, %d rows: output", dn(cfg[ci].dt), E, n);
      check(what, cmp(out), 1e-5);
      // The same rows one at a time, each from a one-row view, onto the same starting output.
      tp alone = act(n, H, H + 2, false), base = act(n, H, H + 2, false);
      float *hb = malloc((size_t)n * (H + 2) * 4);
      TRY(GPU->ops->to_host(GPU, hb, base.g.buf, 0, (size_t)n * (H + 2) * 4));
      TRY(GPU->ops->from_host(GPU, alone.g.buf, 0, hb, (size_t)n * (H + 2) * 4));
      TRY(GPU->ops->moe(GPU, base.g, xg, lg, bias.g, &p, &exg, NULL, NULL));
      for (int r = 0; r < n; r++)
        TRY(GPU->ops->moe(GPU, lks_tensor_rows(alone.g, r, 1), lks_tensor_rows(x.g, r, 1),
                          lks_tensor_rows(logits.g, r, 1), bias.g, &p, &exg, NULL, NULL));
      int64_t bad = -1;
      int ok = same_bits(base.g, alone.g, n, &bad);
      snprintf(what, sizeof what, "moe: %s, %d experts, %d rows: batch = each row alone (bitwise)",
               dn(cfg[ci].dt), E, n);
      check(what, ok ? 0.0 : 1.0, 0);
      if (!ok) printf("    first differing row: %lld\n", (long long)bad);
      free(hb);
      act_free(base);
      act_free(alone);
      act_free(out);
    }
    act_free(x);
    act_free(logits);
  }
}

// ---- recorded steps: replayed with new host arrays, the same results as the ops run plainly ----

// One small "step": embed ids, a product, rope at pos, the moe op, arg-max outside the step.
typedef struct {
  lks_tensor x, y, logits, bias, w, table;
  const lks_moe_experts *ex;
  const lks_route_params *p;
  const int32_t *ids, *pos;
  int n;
} mini_step;

static int run_mini(void *ctx) {
  mini_step *m = ctx;
  lks_tensor none0 = {0};
  LKS_TRY(GPU->ops->embed(GPU, m->x, m->table, m->ids));
  LKS_TRY(GPU->ops->rope(GPU, m->x, 64, 32, 10000.0f, LKS_ROPE_HALF_SPLIT, m->pos));
  LKS_TRY(GPU->ops->matmul(GPU, m->logits, m->x, m->w, none0, false));
  LKS_TRY(GPU->ops->zero(GPU, m->y));
  return GPU->ops->moe(GPU, m->y, m->x, m->logits, m->bias, m->p, m->ex, NULL, NULL);
}

void t_step(void) {
  int E = 16, k = 4, H = 128, I = 64, n = 2, V = 50;
  ffn_t eg[16];
  for (int e = 0; e < E; e++) {
    tp g = weight(LKS_BF16, I, H, false, 0.1f), u = weight(LKS_BF16, I, H, false, 0.1f);
    tp d = weight(LKS_BF16, H, I, false, 0.1f);
    eg[e] = (ffn_t){g.g, u.g, d.g};
  }
  lks_moe_experts ex = {&eg[0].gate, &eg[0].up, &eg[0].down, 3, 0, E};
  lks_route_params p = {E, k, 1, 1, true, 1.5f};
  tp table = weight(LKS_BF16, V, H, false, 1.0f), w = weight(LKS_BF16, E, H, false, 0.2f);
  tp bias = weight(LKS_F32, 1, E, false, 0.1f);
  tp x = act(n, H, H, false), y = act(n, H, H, false), lg = act(n, E, E, false);
  int32_t ids[2], pos[2];
  mini_step m = {x.g, y.g, lg.g, bias.g, w.g, table.g, &ex, &p, ids, pos, n};
  float *plain = malloc((size_t)n * H * 4), *rec = malloc((size_t)n * H * 4);
  int bad = 0, replays = 0;
  for (int step = 0; step < 6; step++) {
    ids[0] = irand(V), ids[1] = irand(V), pos[0] = irand(900), pos[1] = pos[0] + 1;
    TRY(run_mini(&m));
    TRY(lks_tensor_to_host_f32(GPU, plain, y.g));
    TRY(lks_backend_step(GPU, 77, run_mini, &m));
    TRY(lks_tensor_to_host_f32(GPU, rec, y.g));
    bad += memcmp(plain, rec, (size_t)n * H * 4) != 0;
    replays++;
  }
  char what[128];
  snprintf(what, sizeof what, "recorded step (embed, rope, matmul, zero, moe) x %d = plain (bitwise)",
           replays);
  check(what, bad ? 1.0 : 0.0, 0);
  free(plain);
  free(rec);
  act_free(x);
  act_free(y);
  act_free(lg);
}

// ---- glm_moe_dsa: LayerNorm, the k-only cache, the DSA indexer, MLA attention ----

void t_layernorm(void) {
  lks_dtype dts[] = {LKS_F32, LKS_BF16};
  int Hs[] = {128, 200};
  for (int d = 0; d < 2; d++)
    for (int hi = 0; hi < 2; hi++)
      for (int inplace = 0; inplace < 2; inplace++) {
        int H = Hs[hi];
        tp w = weight(dts[d], 1, H, false, 1.0f), b = weight(dts[d], 1, H, false, 0.5f);
        tp x = act(6, H, H + 7, false);
        tp out = inplace ? x : act(6, H, H + 3, true);
        TRY(CPU->ops->layernorm(CPU, out.c, x.c, w.c, b.c, 1e-6f));
        TRY(GPU->ops->layernorm(GPU, out.g, x.g, w.g, b.g, 1e-6f));
        char what[96];
        snprintf(what, sizeof what, "layernorm: %s weight and bias, %d columns%s", dn(dts[d]), H,
                 inplace ? ", in place" : "");
        check(what, cmp(out), 1e-5);
        if (!inplace) act_free(out);
        act_free(x);
      }
}

// A paged layout for the MLA cases: three sequences over a shuffled pool of 64 blocks of 16 (48
// per sequence); rows: sequence 0 at 699 (its keys in several chunks and score groups), sequence
// 1 prefilled at 30..36, sequence 2 at 0.
enum { MB = 48, NB = 64, BS = 16, NR = 9 };
static int32_t m_table[3 * MB], m_seq[NR] = {0, 1, 1, 1, 1, 1, 1, 1, 2},
                                m_pos[NR] = {699, 30, 31, 32, 33, 34, 35, 36, 0}, m_slot[NR];

static lks_attn_rows mla_rows(void) {
  int perm[NB];
  for (int i = 0; i < NB; i++) perm[i] = i;
  for (int i = NB - 1; i > 0; i--) {
    int j = irand(i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int i = 0; i < 3 * MB; i++) m_table[i] = perm[i % NB];
  for (int i = 0; i < NR; i++) m_slot[i] = m_table[m_seq[i] * MB + m_pos[i] / BS] * BS + m_pos[i] % BS;
  lks_attn_rows rows = {NR, m_seq, m_pos, m_slot, m_table, MB};
  return rows;
}

// Row i of a batch alone (the same sequence, position and slot).
static lks_attn_rows row_alone(const lks_attn_rows *r, int i) {
  lks_attn_rows one = {1, r->seq + i, r->pos + i, r->slot + i, r->block_table, r->max_blocks};
  return one;
}

void t_cache_store(void) {
  int width = 72;
  tp pool = act((int64_t)NB * BS, width, width, false);
  lks_kv_layer kc = {pool.c.buf, NULL, NB, BS, 1, width, LKS_F32},
               kg = {pool.g.buf, NULL, NB, BS, 1, width, LKS_F32};
  lks_attn_rows rows = mla_rows();
  tp x = act(NR, width, width + 5, false);
  TRY(CPU->ops->cache_store(CPU, &kc, x.c, &rows));
  TRY(GPU->ops->cache_store(GPU, &kg, x.g, &rows));
  check("cache_store: a k-only layer (no V pool), strided rows", cmp(pool), 0);
  act_free(pool);
  act_free(x);
}

// The indexer's keys: random, or (ties) repeating every 50 positions, so that equal scores
// straddle the top-k cut (ties go to the lower position on both backends).
void t_dsa_select(void) {
  for (int ci = 0; ci < 3; ci++) {
    int D = ci == 2 ? 128 : 16, nh = ci == 2 ? 32 : 8, topk = ci == 2 ? 256 : 64;
    bool ties = ci == 1;
    tp keys = act((int64_t)NB * BS, D, D, false);
    lks_kv_layer kc = {keys.c.buf, NULL, NB, BS, 1, D, LKS_F32},
                 kg = {keys.g.buf, NULL, NB, BS, 1, D, LKS_F32};
    lks_attn_rows rows = mla_rows();
    if (ties) {
      float *row = malloc((size_t)D * 4);
      for (int p = 50; p < 700; p++) {
        int src = m_table[p % 50 / BS] * BS + p % 50 % BS, dst = m_table[p / BS] * BS + p % BS;
        TRY(CPU->ops->to_host(CPU, row, keys.c.buf, (size_t)src * D * 4, (size_t)D * 4));
        TRY(CPU->ops->from_host(CPU, keys.c.buf, (size_t)dst * D * 4, row, (size_t)D * 4));
        TRY(GPU->ops->from_host(GPU, keys.g.buf, (size_t)dst * D * 4, row, (size_t)D * 4));
      }
      free(row);
    }
    tp q = act(NR, (int64_t)nh * D, (int64_t)nh * D + 3, false);
    // Positive head weights: a score is 0 only when every head's dot is <= 0 (rare with 8+
    // heads), so exact zeros sit at the bottom, not at the cut.
    tp w = act(NR, nh, nh + 1, false);
    {
      float *h = malloc((size_t)NR * (nh + 1) * 4);
      TRY(CPU->ops->to_host(CPU, h, w.c.buf, 0, (size_t)NR * (nh + 1) * 4));
      for (int i = 0; i < NR * (nh + 1); i++) h[i] = fabsf(h[i]) + 0.01f;
      TRY(CPU->ops->from_host(CPU, w.c.buf, 0, h, (size_t)NR * (nh + 1) * 4));
      TRY(GPU->ops->from_host(GPU, w.g.buf, 0, h, (size_t)NR * (nh + 1) * 4));
      free(h);
    }
    float qs = 1.0f / sqrtf((float)D), ws = 1.0f / sqrtf((float)nh);
    int32_t *sc = malloc((size_t)NR * topk * 4), *sg = malloc((size_t)NR * topk * 4);
    int32_t nc[NR], ng[NR];
    for (int i = 0; i < NR * topk; i++) sc[i] = sg[i] = -1;
    TRY(CPU->ops->dsa_select(CPU, q.c, w.c, &kc, &rows, nh, qs, ws, topk, sc, nc));
    TRY(GPU->ops->dsa_select(GPU, q.g, w.g, &kg, &rows, nh, qs, ws, topk, sg, ng));
    int same = 1;
    for (int i = 0; i < NR; i++) {
      same &= nc[i] == ng[i];
      for (int k = 0; same && k < nc[i]; k++) same &= sc[i * topk + k] == sg[i * topk + k];
    }
    char what[128];
    snprintf(what, sizeof what, "dsa_select: %d heads of %d, top-%d%s, contexts 700/37/1: equal",
             nh, D, topk, ties ? ", tied scores at the cut" : "");
    check(what, same ? 0.0 : 1.0, 0);
    // Each row alone selects what it selected in the batch.
    same = 1;
    for (int i = 0; i < NR; i++) {
      lks_attn_rows one = row_alone(&rows, i);
      int32_t n1;
      TRY(GPU->ops->dsa_select(GPU, lks_tensor_rows(q.g, i, 1), lks_tensor_rows(w.g, i, 1), &kg,
                               &one, nh, qs, ws, topk, sc, &n1));
      same &= n1 == ng[i] && !memcmp(sc, sg + (size_t)i * topk, (size_t)n1 * 4);
    }
    snprintf(what, sizeof what, "dsa_select: %d heads of %d, top-%d%s: batch = each row alone",
             nh, D, topk, ties ? ", ties" : "");
    check(what, same ? 0.0 : 1.0, 0);
    free(sc);
    free(sg);
    act_free(keys);
    act_free(q);
    act_free(w);
  }
}

void t_mla_attention(void) {
  struct {
    int nh, dn, dr, dv, R;
    lks_dtype dt;
  } cfg[] = {{4, 16, 8, 16, 64, LKS_F32}, {4, 16, 8, 16, 64, LKS_BF16},
             {2, 192, 64, 256, 512, LKS_BF16}};  // the last: GLM-5's head shapes
  for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
    for (int sparse = 0; sparse < 2; sparse++) {
      int nh = cfg[ci].nh, dnope = cfg[ci].dn, dr = cfg[ci].dr, dv = cfg[ci].dv, R = cfg[ci].R;
      int W = R + dr, topk = 40;
      bool shard = sparse;  // the weight wrapped as a column shard in one of the two
      tp C = act((int64_t)NB * BS, W, W, false);
      lks_kv_layer kc = {C.c.buf, NULL, NB, BS, 1, W, LKS_F32},
                   kg = {C.g.buf, NULL, NB, BS, 1, W, LKS_F32};
      lks_attn_rows rows = mla_rows();
      tp wkv = weight(cfg[ci].dt, (int64_t)nh * (dnope + dv), R, shard, 0.05f);
      tp q = act(NR, (int64_t)nh * (dnope + dr), (int64_t)nh * (dnope + dr) + 2, false);
      tp out = act(NR, (int64_t)nh * dv, (int64_t)nh * dv + 6, true);
      lks_mla_dims d = {nh, dnope, dr, dv, R, 1.0f / sqrtf((float)(dnope + dr))};
      // A selection per row: every position up to topk keys, else topk of them, ascending.
      int32_t sel[NR * 40], n_sel[NR];
      for (int i = 0; i < NR; i++) {
        int nk = m_pos[i] + 1, k = 0;
        for (int p = 0; p < nk && k < topk; p++)
          if (nk <= topk || irand(nk - p) < topk - k) sel[i * topk + k++] = p;
        n_sel[i] = k;
      }
      const int32_t *sp = sparse ? sel : NULL, *np = sparse ? n_sel : NULL;
      TRY(CPU->ops->mla_attention(CPU, out.c, q.c, wkv.c, &kc, &rows, &d, sp, np, topk));
      TRY(GPU->ops->mla_attention(GPU, out.g, q.g, wkv.g, &kg, &rows, &d, sp, np, topk));
      char what[160];
      snprintf(what, sizeof what, "mla_attention: %d heads, nope %d rope %d v %d latent %d, %s, %s",
               nh, dnope, dr, dv, R, dn(cfg[ci].dt), sparse ? "top-40 selection, shard" : "every position");
      check(what, cmp(out), 1e-5);
      tp alone = act(NR, (int64_t)nh * dv, (int64_t)nh * dv + 6, true);
      for (int i = 0; i < NR; i++) {
        lks_attn_rows one = row_alone(&rows, i);
        TRY(GPU->ops->mla_attention(GPU, lks_tensor_rows(alone.g, i, 1), lks_tensor_rows(q.g, i, 1),
                                    wkv.g, &kg, &one, &d, sparse ? sel + i * topk : NULL,
                                    sparse ? n_sel + i : NULL, topk));
      }
      int64_t bad = -1;
      int ok = same_bits(out.g, alone.g, NR, &bad);
      snprintf(what, sizeof what, "mla_attention: %d heads, latent %d, %s: batch = each row alone (bitwise)",
               nh, R, sparse ? "sparse" : "dense");
      check(what, ok ? 0.0 : 1.0, 0);
      if (!ok) printf("    first differing row: %lld\n", (long long)bad);
      act_free(C);
      act_free(q);
      act_free(out);
      act_free(alone);
    }
}
