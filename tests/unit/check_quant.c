// SPDX-License-Identifier: MIT
// Quantized weights (model/quant.h, core/cpu_quant.h):
// - the loader's refusals, one malformed variant each (tools/gen_model.py --quant-defect and
//   shapes that cannot be packed): a missing scale, a scale of the wrong shape or dtype, an odd
//   number of columns for NVFP4, columns not a multiple of 16, an unknown quant_method, a group
//   size other than 16, a weight dtype of no known scheme; and the accepted variants (BF16 FP8
//   scales, mixed BF16/quantized layers);
// - the kernels of every SIMD level against a double-precision dot of the dequantized values
//   (decoded here from the format definitions), relative to sum |w x|;
// - the several-weight-row kernels (decode's one activation row): bitwise the one-row kernel;
// - batch invariance through the CPU backend's matmul: each row of a batch of n rows equals,
//   bit for bit, the same row computed alone, for every scheme, SIMD level and n.
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/cpu_quant.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/model.h"
#include "model/quant.h"
#include "testutil.h"

// ---- the loader ----

// Generates a model with `args` and loads it: NULL expected when `want` is set, with an error
// containing it.
static void load_expect(const char *args, const char *want) {
  char *dir = tu_tmpdir();
  ck_assert_msg(tu_gen_model(dir, args) == 0, "gen_model.py %s failed", args);
  lks_backend *be = lks_backend_new("cpu", 1);
  lks_model *m = lks_model_load(dir, be, NULL, NULL);
  if (want) {
    ck_assert_msg(!m, "%s: loaded, expected a refusal containing \"%s\"", args, want);
    ck_assert_msg(strstr(lks_last_error(), want), "%s: error \"%s\" lacks \"%s\"", args,
                  lks_last_error(), want);
  } else {
    ck_assert_msg(m, "%s: %s", args, lks_last_error());
  }
  lks_model_free(m);
  lks_backend_free(be);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert(system(cmd) == 0);
  free(dir);
}

static const struct {
  const char *args, *want;
} cases[] = {
    {"--quant fp8-channel --quant-defect missing-scale",
     "'model.layers.0.self_attn.q_proj.weight_scale' is missing"},
    {"--quant fp8-block --quant-defect missing-scale",
     "'model.layers.0.self_attn.q_proj.weight_scale_inv' is missing"},
    {"--quant nvfp4 --quant-defect missing-scale",
     "'model.layers.0.self_attn.q_proj.weight_scale' is missing"},
    {"--quant fp8-channel --quant-defect scale-shape",
     "q_proj.weight_scale' (compressed-tensors fp8 channel) has shape [129, 1], expected [128, 1]"},
    {"--quant fp8-block --quant-defect scale-shape",
     "q_proj.weight_scale_inv' (fp8 128x128 blocks) has shape [2, 1], expected [1, 1]"},
    {"--quant nvfp4-ct --quant-defect scale-shape",
     "q_proj.weight_scale' (compressed-tensors nvfp4) has shape [129, 8], expected [128, 8]"},
    {"--quant fp8-channel --quant-defect scale-dtype", "has dtype I32, expected F32 or BF16"},
    {"--quant nvfp4 --quant-defect scale-dtype", "has dtype U8, expected F8_E4M3"},
    {"--quant nvfp4 --hidden 129", "q_proj.weight' (modelopt nvfp4): 129 columns is odd"},
    {"--quant nvfp4-ct --hidden 136", "136 columns is not a multiple of the group size 16"},
    {"--quant fp8-channel --quant-defect unknown-method", "unknown quant_method 'awq'"},
    {"--quant nvfp4 --quant-defect group-size", "group_size 32: only groups of 16 are NVFP4"},
    {"--quant nvfp4-ct --quant-defect group-size", "group_size 32: only groups of 16"},
    {"--quant fp8-block --quant-defect group-size", "weight_block_size other than [128, 128]"},
    {"--quant fp8-channel --quant-defect bad-dtype",
     "'model.layers.0.self_attn.q_proj.weight' has dtype I8: not a weight type nor a supported"},
    {"--quant fp8-channel --scale-bf16 1", NULL},
    {"--quant fp8-block --quant-skip attn,mtp,lm_head --shards 2", NULL},
    {"--quant nvfp4 --quant-skip experts", NULL},
};

START_TEST(test_loader) { load_expect(cases[_i].args, cases[_i].want); }
END_TEST

START_TEST(test_config_refusals) {
  lks_quant_config q;
  const char *bad[][2] = {
      {"{\"quantization_config\": {\"quant_method\": \"gptq\"}}", "unknown quant_method 'gptq'"},
      {"{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
       "\"pack-quantized\", \"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 4}}}}}",
       "format 'pack-quantized' is not supported"},
      {"{\"quantization_config\": {\"quant_method\": \"fp8\"}}", "without weight_block_size"},
      {"{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"FP8\"}}",
       "quant_algo 'FP8' is not supported"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_lt(lks_quant_config_parse(bad[i][0], NULL, "config.json", &q), 0);
    ck_assert_msg(strstr(lks_last_error(), bad[i][1]), "%s", lks_last_error());
  }
  ck_assert_int_eq(lks_quant_config_parse("{}", NULL, "config.json", &q), 0);
  ck_assert_int_eq(q.scheme, LKS_Q_NONE);
  ck_assert_int_eq(lks_quant_config_parse("{}",
                                          "{\"quantization\": {\"quant_algo\": \"NVFP4\", "
                                          "\"group_size\": 16}}",
                                          "config.json", &q),
                   0);
  ck_assert_int_eq(q.scheme, LKS_Q_NVFP4);
  ck_assert(!q.ct);
}
END_TEST

// ---- kernels ----

// The format definitions, decoded independently of core/dtype.c.
static double e4m3(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  double v = e ? (1 + m / 8.0) * pow(2, e - 7) : m / 8.0 * pow(2, -6);
  return b & 0x80 ? -v : v;
}
static double e2m1(int c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return c & 8 ? -mag[c & 7] : mag[c & 7];
}
static uint8_t rand_e4m3(uint64_t *s) {
  uint8_t b;
  do b = (uint8_t)tu_rand(s);
  while ((b & 0x7f) == 0x7f);  // no NaN codes
  return b;
}

static const char *levels[] = TU_SIMD_LEVELS;

START_TEST(test_kernels) {
  uint64_t rs = 12345;
  // NVFP4 (K % 16 == 0): 128-column steps and last steps of 1 to 7 groups (AVX-512).
  const int64_t Ks[] = {8, 16, 24, 128, 192, 240, 280, 528, 720, 1024, 200, 2 * 1408 + 8};
  for (int lv = 0; lv < TU_N_SIMD_LEVELS; lv++) {
    const lks__quant_kernels *k = lks__quant_kernels_get(levels[lv]);
    if (!k) continue;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
      int64_t K = Ks[ki];
      uint8_t *w = malloc((size_t)K), *gs = malloc((size_t)K / 16 + 1);
      float *x[LKS__QROWS], bs[32], out[LKS__QROWS];
      for (int t = 0; t < LKS__QROWS; t++) {
        x[t] = malloc((size_t)K * sizeof(float));
        for (int64_t i = 0; i < K; i++) x[t][i] = tu_randf(&rs) * 3;
      }
      for (int64_t i = 0; i < K; i++) w[i] = rand_e4m3(&rs);
      for (int b = 0; b < 32; b++) bs[b] = (float)(0.001 + 0.01 * fabs(tu_randf(&rs)));
      // Negative and subnormal scales among them (quantizers write neither, the format has both).
      for (int64_t g = 0; g < K / 16; g++) gs[g] = rand_e4m3(&rs);
      for (int blk = 0; blk < 2; blk++) {  // per-row scale, then 128-blocks
        int64_t B = blk ? 128 : K;
        for (int nx = 1; nx <= LKS__QROWS; nx++) {
          k->fp8(w, bs, B, (const float *const *)x, nx, K, out);
          for (int t = 0; t < nx; t++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < K; i++) {
              double v = e4m3(w[i]) * bs[i / B] * x[t][i];
              ref += v;
              mag += fabs(v);
            }
            ck_assert_msg(fabs(out[t] - ref) <= 1e-5 * mag, "%s fp8 K=%lld blk=%lld: %g vs %g",
                          levels[lv], (long long)K, (long long)B, out[t], ref);
          }
        }
      }
      // NVFP4's codes and scales in buffers of their exact sizes: a kernel reading past a row's
      // end (a last step of fewer than 8 groups) fails under the sanitizer.
      uint8_t *wn = malloc((size_t)K / 2), *gn = malloc((size_t)(K / 16 ? K / 16 : 1));
      memcpy(wn, w, (size_t)K / 2);
      memcpy(gn, gs, (size_t)K / 16);
      if (K % 16 == 0)
        for (int nx = 1; nx <= LKS__QROWS; nx++) {
          k->nvfp4(wn, gn, (const float *const *)x, nx, K, out);
          for (int t = 0; t < nx; t++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < K; i++) {
              int c = i % 2 ? w[i / 2] >> 4 : w[i / 2] & 15;
              double v = e2m1(c) * e4m3(gs[i / 16]) * x[t][i];
              ref += v;
              mag += fabs(v);
            }
            ck_assert_msg(fabs(out[t] - ref) <= 1e-5 * mag, "%s nvfp4 K=%lld: %g vs %g",
                          levels[lv], (long long)K, out[t], ref);
          }
        }
      for (int t = 0; t < LKS__QROWS; t++) free(x[t]);
      free(w);
      free(gs);
      free(wn);
      free(gn);
    }
  }
}
END_TEST

// Grids (nw weight rows by nx split activation rows; decode's are nw by one): each pair bit for
// bit what the one-row kernel on x (checked against double precision above) gives for it, for
// every shape.
START_TEST(test_grid_kernels) {
  uint64_t rs = 4242;
  const int64_t Ks[] = {8, 16, 24, 128, 200, 240, 280, 528, 720, 1024, 2 * 1408 + 8};
  enum { G = LKS__QGRID };
  for (int lv = 0; lv < TU_N_SIMD_LEVELS; lv++) {
    const lks__quant_kernels *k = lks__quant_kernels_get(levels[lv]);
    if (!k || (!k->fp8_grid && !k->nvfp4_grid)) continue;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
      int64_t K = Ks[ki], sl = lks__fp8_split_len(K), nsl = lks__nvfp4_split_len(K);
      uint8_t *w[G], *gs[G];
      float *x[G], *split[G], *nsplit[G], bs[G][32], out[G], one;
      const float *bsp[G];
      for (int i = 0; i < G; i++) {
        w[i] = malloc((size_t)K);
        gs[i] = malloc((size_t)K / 16 + 1);
        x[i] = malloc((size_t)K * sizeof(float));
        split[i] = malloc((size_t)sl * sizeof(float));
        nsplit[i] = malloc((size_t)nsl * sizeof(float));
        for (int64_t c = 0; c < K; c++) w[i][c] = rand_e4m3(&rs), x[i][c] = tu_randf(&rs) * 3;
        for (int b = 0; b < 32; b++) bs[i][b] = (float)(0.001 + 0.01 * fabs(tu_randf(&rs)));
        for (int64_t g = 0; g < K / 16; g++) gs[i][g] = rand_e4m3(&rs);
        bsp[i] = bs[i];
        if (k->fp8_grid) k->fp8_split(x[i], K, split[i]);
        if (k->nvfp4_grid && K % 16 == 0) k->nvfp4_split(x[i], K, nsplit[i]);
      }
      const uint8_t *const *wc = (const uint8_t *const *)w, *ah[LKS__QAHEAD];
      for (int i = 0; i < LKS__QAHEAD; i++) ah[i] = w[i % G];
      for (int nx = 1; nx <= G; nx++)
        for (int nw = 1; nw * nx <= G; nw++)
          for (int f = 0; f < 3; f++) {  // FP8 per-row scale, FP8 128-blocks, NVFP4
            int64_t B = f == 1 ? 128 : K;
            if (f < 2 ? !k->fp8_grid : !k->nvfp4_grid || K % 16) continue;
            if (f < 2)
              k->fp8_grid(wc, ah, bsp, NULL, B, (const float *const *)split, nw, nx, K, out);
            else
              k->nvfp4_grid(wc, ah, (const uint8_t *const *)gs, NULL,
                            (const float *const *)nsplit, nw, nx, K, out);
            for (int i = 0; i < nw; i++)
              for (int t = 0; t < nx; t++) {
                const float *xt[1] = {x[t]};
                if (f < 2) k->fp8(w[i], bs[i], B, xt, 1, K, &one);
                else k->nvfp4(w[i], gs[i], xt, 1, K, &one);
                ck_assert_msg(memcmp(&out[i * nx + t], &one, sizeof one) == 0,
                              "%s %s grid %dx%d K=%lld, pair %d,%d: %a vs %a alone", levels[lv],
                              f == 0 ? "fp8 row" : f == 1 ? "fp8 block" : "nvfp4", nw, nx,
                              (long long)K, i, t, out[i * nx + t], one);
              }
          }
      for (int i = 0; i < G; i++)
        free(w[i]), free(gs[i]), free(x[i]), free(split[i]), free(nsplit[i]);
    }
  }
}
END_TEST

// FP8 codes of exponent 0 (zeros and subnormals) one at a time among normal codes, at the
// start, middle and end of 128-column chunks, blocks and rows: the AVX-512 grids convert the
// chunks that hold one by another path, chosen from lks_e4m3_exp0_chunks's flags (or by testing
// the codes when given none), and a chunk taken by the common path would read such a code as
// (1 + m/8) 2^-7 in place of m 2^-9 (or 0). Only column p's x is non-zero, so every kernel's
// result is one product, exact, times the block's scale: one rounding, as the reference's.
START_TEST(test_fp8_exponent0) {
  uint64_t rs = 777;
  const int64_t Ks[] = {24, 48, 130, 352, 1024 + 16 + 8};
  const int64_t ps[] = {0, 1, 15, 16, 31, 32, 127, 128, 129, 255, 256, 300, 1039, 1047};
  const uint8_t codes[] = {0x00, 0x80, 0x01, 0x86, 0x07, 0x85};
  enum { G = 4 };
  for (int lv = 0; lv < TU_N_SIMD_LEVELS; lv++) {
    const lks__quant_kernels *k = lks__quant_kernels_get(levels[lv]);
    if (!k) continue;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
      const int64_t K = Ks[ki], nc = lks_e4m3_chunks(K);
      uint8_t *w[G], *fl[G];
      float *x = calloc((size_t)K, sizeof *x), bs[16], out[G], one;
      float *split = malloc((size_t)lks__fp8_split_len(K) * sizeof *split);
      for (int i = 0; i < G; i++) {
        w[i] = malloc((size_t)K), fl[i] = malloc((size_t)nc);
        for (int64_t c = 0; c < K; c++) {  // exponent 1 or more, no NaN
          w[i][c] = (uint8_t)(rand_e4m3(&rs) | 0x08);
          if ((w[i][c] & 0x7f) == 0x7f) w[i][c] ^= 1;
        }
      }
      for (int b = 0; b < 16; b++) bs[b] = (float)(0.001 + 0.01 * fabs(tu_randf(&rs)));
      for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
        const int64_t p = ps[pi];
        if (p >= K) continue;
        for (size_t ci = 0; ci < sizeof codes; ci++)
          for (int blk = 0; blk < 2; blk++) {
            const int64_t B = blk ? 128 : K;
            const uint8_t keep = w[0][p];
            w[0][p] = codes[ci];
            x[p] = 1.5f;
            for (int i = 0; i < G; i++) lks_e4m3_exp0_chunks(w[i], K, 1, K, LKS_E4M3_CHUNK, fl[i]);
            ck_assert_int_eq(fl[0][p / 128], 1);
            const float want = (float)(lks_e4m3_to_f32(codes[ci]) * 1.5 * bs[p / B]);
            const float *xs[1] = {x}, *bsp[G];
            for (int i = 0; i < G; i++) bsp[i] = bs;
            k->fp8(w[0], bs, B, xs, 1, K, &one);
            ck_assert_msg(one == want, "%s fp8 K=%lld blk=%lld code %#x at %lld: %a, not %a",
                          levels[lv], (long long)K, (long long)B, codes[ci], (long long)p, one,
                          want);
            if (k->fp8_grid) {
              k->fp8_split(x, K, split);
              const float *sp[1] = {split};
              for (int f = 0; f < 2; f++) {  // the flags, then none (the codes tested)
                k->fp8_grid((const uint8_t *const *)w, NULL, bsp,
                            f ? NULL : (const uint8_t *const *)fl, B, sp, G, 1, K, out);
                ck_assert_msg(out[0] == want,
                              "%s fp8 grid (%s) K=%lld blk=%lld code %#x at %lld: %a, not %a",
                              levels[lv], f ? "no flags" : "flags", (long long)K, (long long)B,
                              codes[ci], (long long)p, out[0], want);
              }
            }
            w[0][p] = keep;
            x[p] = 0;
          }
      }
      for (int i = 0; i < G; i++) free(w[i]), free(fl[i]);
      free(x), free(split);
    }
    // NVFP4: a group scale of exponent 0 among normal ones, column p's code non-zero.
    const int64_t Kn[] = {48, 352, 1040};
    for (size_t ki = 0; ki < sizeof Kn / sizeof Kn[0]; ki++) {
      const int64_t K = Kn[ki], nc = lks_e4m3_chunks(K);
      uint8_t *w[G], *gs[G], *fl[G];
      float *x = calloc((size_t)K, sizeof *x), out[G], one;
      float *split = malloc((size_t)lks__nvfp4_split_len(K) * sizeof *split);
      for (int i = 0; i < G; i++) {
        w[i] = malloc((size_t)K / 2), gs[i] = malloc((size_t)K / 16), fl[i] = malloc((size_t)nc);
        for (int64_t c = 0; c < K / 2; c++) w[i][c] = (uint8_t)tu_rand(&rs) | 0x11;
        for (int64_t g = 0; g < K / 16; g++) {
          gs[i][g] = (uint8_t)(rand_e4m3(&rs) | 0x08);
          if ((gs[i][g] & 0x7f) == 0x7f) gs[i][g] ^= 1;
        }
      }
      for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
        const int64_t p = ps[pi];
        if (p >= K) continue;
        for (size_t ci = 0; ci < sizeof codes; ci++) {
          const uint8_t keep = gs[0][p / 16];
          gs[0][p / 16] = codes[ci];
          x[p] = 1.5f;
          for (int i = 0; i < G; i++)
            lks_e4m3_exp0_chunks(gs[i], K / 16, 1, K / 16, LKS_E4M3_CHUNK / 16, fl[i]);
          ck_assert_int_eq(fl[0][p / 128], 1);
          const uint8_t code = p & 1 ? w[0][p / 2] >> 4 : w[0][p / 2] & 15;
          const float want = (float)(lks_e2m1_to_f32(code) * 1.5 * lks_e4m3_to_f32(codes[ci]));
          const float *xs[1] = {x};
          k->nvfp4(w[0], gs[0], xs, 1, K, &one);
          ck_assert_msg(one == want, "%s nvfp4 K=%lld scale %#x at %lld: %a, not %a", levels[lv],
                        (long long)K, codes[ci], (long long)p, one, want);
          if (k->nvfp4_grid) {
            k->nvfp4_split(x, K, split);
            const float *sp[1] = {split};
            for (int f = 0; f < 2; f++) {  // the flags, then none (the scales tested)
              k->nvfp4_grid((const uint8_t *const *)w, NULL, (const uint8_t *const *)gs,
                            f ? NULL : (const uint8_t *const *)fl, sp, G, 1, K, out);
              ck_assert_msg(out[0] == want,
                            "%s nvfp4 grid (%s) K=%lld scale %#x at %lld: %a, not %a",
                            levels[lv], f ? "no flags" : "flags", (long long)K, codes[ci],
                            (long long)p, out[0], want);
            }
          }
          gs[0][p / 16] = keep;
          x[p] = 0;
        }
      }
      for (int i = 0; i < G; i++) free(w[i]), free(gs[i]), free(fl[i]);
      free(x), free(split);
    }
  }
}
END_TEST

// Random FP8-block and NVFP4 weights [M, K] over the same bytes: codes (M * K), NVFP4 group
// scales gs (M * K / 16) and FP8 block scales bs ((K + 127) / 128: M < 128, one block row).
static void random_qweights(uint64_t *rs, int64_t M, int64_t K, uint8_t *codes, uint8_t *gs,
                            float *bs, lks__qweight *fp8, lks__qweight *nv) {
  for (int64_t i = 0; i < M * K; i++) codes[i] = rand_e4m3(rs);
  for (int64_t i = 0; i < M * K / 16; i++) gs[i] = (uint8_t)(rand_e4m3(rs) & 0x7f);
  for (int64_t b = 0; b < (K + 127) / 128; b++) bs[b] = (float)(0.001 + 0.01 * tu_randf(rs));
  *fp8 = (lks__qweight){.qs = LKS_Q_FP8_BLOCK, .codes = codes, .ld = K, .scales = bs,
                        .sld = (K + 127) / 128, .global = 1.0f, .rows = M, .cols = K};
  *nv = (lks__qweight){.qs = LKS_Q_NVFP4, .codes = codes, .ld = K / 2, .scales = gs,
                       .sld = K / 16, .global = 0.37f, .rows = M, .cols = K};
}

// Products over more activation rows than are split at once (n * split row over 8 MB: split by
// groups instead), FP8 blocks and NVFP4: every row bit for bit what it gives alone. Alone is
// decode's path (lks__qmv_fn where the level has one): 13 weight rows, a grid of 8 and one of 5.
START_TEST(test_big_batch) {
  uint64_t rs = 31337;
  enum { M = 13, N = 140 };
  const int64_t K = 16000;  // 140 rows of 16000 columns: 2.24 M floats split
  for (int lv = 0; lv < TU_N_SIMD_LEVELS; lv++) {
    const lks__quant_kernels *k = lks__quant_kernels_get(levels[lv]);
    if (!k) continue;
    ck_assert(N * lks__fp8_split_len(K) > (8 << 20) / 4);
    ck_assert(N * lks__nvfp4_split_len(K) > (8 << 20) / 4);
    uint8_t *codes = malloc((size_t)(M * K)), gs[M * K / 16];
    float *x = malloc((size_t)(N * K) * sizeof *x), bs[(16000 + 127) / 128];  // M < 128: one row
    float *batch = malloc((size_t)(N * M) * sizeof *batch), alone[M];
    lks__qweight fp8, nv;
    random_qweights(&rs, M, K, codes, gs, bs, &fp8, &nv);
    for (int64_t i = 0; i < N * K; i++) x[i] = tu_randf(&rs);
    const lks__qweight *ws[2] = {&fp8, &nv};
    for (int f = 0; f < 2; f++) {
      lks__quant_matmul_rows(k, ws[f], 0, M, x, K, N, batch, M);
      for (int t = 0; t < N; t++) {
        lks__quant_matmul_rows(k, ws[f], 0, M, x + t * K, K, 1, alone, M);
        ck_assert_msg(memcmp(alone, batch + t * M, sizeof alone) == 0,
                      "%s %s: row %d of a batch of %d differs from it alone", levels[lv],
                      f ? "nvfp4" : "fp8", t, N);
      }
    }
    free(codes), free(x), free(batch);
  }
}
END_TEST

// Decode's product in parts (lks__quant_split once, then lks__quant_mv over any row ranges, as
// the CPU backend's tasks run it) against lks__quant_matmul_rows on x: bit for bit, for FP8 blocks
// and NVFP4, rows of 1024 and 352 columns (whole and partial 128-column steps), ranges that start
// off a grid of 8, and x split 64-byte aligned or 16 bytes off (slower, the same sums).
START_TEST(test_split_once) {
  uint64_t rs = 4242;
  enum { M = 37 };
  const int64_t Ks[2] = {1024, 352}, cuts[4] = {0, 13, 21, M};
  for (int lv = 0; lv < TU_N_SIMD_LEVELS; lv++) {
    const lks__quant_kernels *k = lks__quant_kernels_get(levels[lv]);
    if (!k) continue;
    for (int ki = 0; ki < 2; ki++) {
      const int64_t K = Ks[ki];
      uint8_t *codes = malloc((size_t)(M * K)), *gs = malloc((size_t)(M * K / 16));
      float *x = malloc((size_t)K * sizeof *x), bs[(M + 127) / 128 * 8];
      float whole[M], parts[M];
      lks__qweight fp8, nv;
      random_qweights(&rs, M, K, codes, gs, bs, &fp8, &nv);
      for (int64_t i = 0; i < K; i++) x[i] = tu_randf(&rs);
      const lks__qweight *ws[2] = {&fp8, &nv};
      for (int f = 0; f < 2; f++) {
        const int64_t sl = lks__quant_split_len(k, ws[f]->qs, K);
        if (sl == 0) continue;  // no grid for the format here: decode splits nothing
        float *buf = aligned_alloc(64, (size_t)(sl + 16 + 15) / 16 * 64);
        lks__quant_matmul_rows(k, ws[f], 0, M, x, K, 1, whole, M);
        for (int off = 0; off <= 4; off += 4) {
          lks__quant_split(k, ws[f]->qs, x, K, buf + off);
          memset(parts, 0xff, sizeof parts);
          for (int c = 0; c < 3; c++)
            lks__quant_mv(k, ws[f], cuts[c], cuts[c + 1], buf + off, parts);
          ck_assert_msg(memcmp(whole, parts, sizeof whole) == 0,
                        "%s %s K=%lld, x split %d floats off 64 bytes: the parts differ",
                        levels[lv], f ? "nvfp4" : "fp8", (long long)K, off);
        }
        free(buf);
      }
      free(codes), free(gs), free(x);
    }
  }
}
END_TEST

// A random quantized weight [M, K] of scheme qs on backend `be`.
static lks_tensor make_q(lks_backend *be, lks_qscheme qs, int64_t M, int64_t K, uint64_t *rs,
                         void **keep) {
  bool fp4 = qs == LKS_Q_NVFP4;
  size_t cb = (size_t)(M * (fp4 ? K / 2 : K));
  uint8_t *codes = malloc(cb);
  for (size_t i = 0; i < cb; i++) codes[i] = fp4 ? (uint8_t)tu_rand(rs) : rand_e4m3(rs);
  *keep = codes;
  lks_tensor t = lks_tensor_2d(be->ops->buf_wrap_host(be, codes, cb), 0,
                               fp4 ? LKS_F4_E2M1X2 : LKS_F8_E4M3, M, K);
  t.ld = fp4 ? K / 2 : K;
  t.qs = qs;
  size_t sb;
  void *sc;
  if (qs == LKS_Q_FP8_ROW || qs == LKS_Q_FP8_BLOCK) {
    int64_t n = qs == LKS_Q_FP8_ROW ? M : ((M + 127) / 128) * ((K + 127) / 128);
    float *f = sc = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) f[i] = (float)(0.001 + 0.01 * fabs(tu_randf(rs)));
    sb = (size_t)n * 4;
    t.sld = qs == LKS_Q_FP8_ROW ? 1 : (K + 127) / 128;
  } else {
    uint8_t *u = sc = malloc((size_t)(M * K / 16));
    for (int64_t i = 0; i < M * K / 16; i++) u[i] = (uint8_t)(rand_e4m3(rs) & 0x7f);
    sb = (size_t)(M * K / 16);
    t.sld = K / 16;
    t.qglobal = 0.37f;
  }
  t.sbuf = be->ops->buf_alloc(be, sb);
  ck_assert_int_eq(be->ops->from_host(be, t.sbuf, 0, sc, sb), 0);
  free(sc);
  return t;
}

START_TEST(test_batch_invariance) {
  const lks_qscheme schemes[] = {LKS_Q_FP8_ROW, LKS_Q_FP8_BLOCK, LKS_Q_NVFP4};
  const int ns[] = {2, 3, 4, 5, 7, 8, 13, 33};
  for (int lv = 0; lv < TU_N_SIMD_LEVELS; lv++) {
    if (!lks__quant_kernels_get(levels[lv])) continue;
    setenv("LKS_SIMD", levels[lv], 1);
    lks_backend *be = lks_backend_new("cpu", 2);
    for (int si = 0; si < 3; si++) {
      uint64_t rs = 99 + (uint64_t)si;
      int64_t M = 300, K = schemes[si] == LKS_Q_NVFP4 ? 720 : 1000;  // NVFP4: 45 groups, odd
      void *keep;
      lks_tensor w = make_q(be, schemes[si], M, K, &rs, &keep);
      int N = 33;
      float *xh = malloc((size_t)(N * K) * 4);
      for (int64_t i = 0; i < N * K; i++) xh[i] = tu_randf(&rs);
      lks_buf *xb = be->ops->buf_alloc(be, (size_t)(N * K) * 4);
      lks_buf *ob = be->ops->buf_alloc(be, (size_t)(N * M) * 4);
      be->ops->from_host(be, xb, 0, xh, (size_t)(N * K) * 4);
      float *alone = malloc((size_t)(N * M) * 4), *batch = malloc((size_t)(N * M) * 4);
      lks_tensor none = {0};
      for (int r = 0; r < N; r++) {  // every row alone
        lks_tensor x = lks_tensor_rows(lks_tensor_2d(xb, 0, LKS_F32, N, K), r, 1);
        lks_tensor o = lks_tensor_2d(ob, 0, LKS_F32, 1, M);
        ck_assert_int_eq(be->ops->matmul(be, o, x, w, none, false), 0);
        be->ops->to_host(be, alone + r * M, ob, 0, (size_t)M * 4);
      }
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        int n = ns[ni];
        lks_tensor x = lks_tensor_2d(xb, 0, LKS_F32, n, K), o = lks_tensor_2d(ob, 0, LKS_F32, n, M);
        ck_assert_int_eq(be->ops->matmul(be, o, x, w, none, false), 0);
        be->ops->to_host(be, batch, ob, 0, (size_t)(n * M) * 4);
        ck_assert_msg(memcmp(batch, alone, (size_t)(n * M) * 4) == 0,
                      "%s, %s: a batch of %d rows differs from its rows alone", levels[lv],
                      lks_qscheme_name(schemes[si], w.dtype), n);
      }
      // A row view of an FP8-block weight (a 128-aligned shard) equals those rows of the whole.
      lks_tensor part = lks_tensor_rows(w, 128, 128);
      lks_tensor x = lks_tensor_2d(xb, 0, LKS_F32, 3, K), o = lks_tensor_2d(ob, 0, LKS_F32, 3, 128);
      ck_assert_int_eq(be->ops->matmul(be, o, x, part, none, false), 0);
      be->ops->to_host(be, batch, ob, 0, 3 * 128 * 4);
      for (int t = 0; t < 3; t++)
        ck_assert(memcmp(batch + t * 128, alone + t * M + 128, 128 * 4) == 0);
      free(xh);
      free(alone);
      free(batch);
      free(keep);
      be->ops->buf_free(be, xb);
      be->ops->buf_free(be, ob);
      be->ops->buf_free(be, w.buf);
      be->ops->buf_free(be, w.sbuf);
    }
    lks_backend_free(be);
  }
  unsetenv("LKS_SIMD");
}
END_TEST

// The matmuls op (products of one x in one job: GQA's q, k and v) against a matmul call per
// product: bitwise, on each level, for one activation row (decode: x split once per format, the
// parts of one format sharing it) and for three. The parts mix NVFP4, FP8 blocks and F32 weights
// of 200, 72, 40 and 24 rows, one with a bias, so that a part reading another format's split x,
// or a task's rows counted from the wrong part, changes the bits.
START_TEST(test_matmuls) {
  const int64_t K = 1024, Ms[4] = {200, 72, 40, 24};
  for (int lv = 0; lv < TU_N_SIMD_LEVELS; lv++) {
    if (!lks__quant_kernels_get(levels[lv])) continue;
    setenv("LKS_SIMD", levels[lv], 1);
    lks_backend *be = lks_backend_new("cpu", 2);
    uint64_t rs = 4242 + (uint64_t)lv;
    void *keep[3];
    lks_matmul_part parts[4];
    parts[0].w = make_q(be, LKS_Q_NVFP4, Ms[0], K, &rs, &keep[0]);
    parts[1].w = make_q(be, LKS_Q_FP8_BLOCK, Ms[1], K, &rs, &keep[1]);
    parts[2].w = make_q(be, LKS_Q_NVFP4, Ms[2], K, &rs, &keep[2]);
    float *wf = malloc((size_t)(Ms[3] * K) * 4), *bias = malloc((size_t)Ms[1] * 4);
    for (int64_t i = 0; i < Ms[3] * K; i++) wf[i] = tu_randf(&rs);
    for (int64_t i = 0; i < Ms[1]; i++) bias[i] = tu_randf(&rs);
    parts[3].w = lks_tensor_2d(be->ops->buf_wrap_host(be, wf, (size_t)(Ms[3] * K) * 4), 0,
                               LKS_F32, Ms[3], K);
    lks_tensor bt = lks_tensor_2d(be->ops->buf_wrap_host(be, bias, (size_t)Ms[1] * 4), 0,
                                  LKS_F32, 1, Ms[1]);
    const int N = 3;
    float *xh = malloc((size_t)(N * K) * 4);
    for (int64_t i = 0; i < N * K; i++) xh[i] = tu_randf(&rs);
    lks_buf *xb = be->ops->buf_wrap_host(be, xh, (size_t)(N * K) * 4);
    lks_buf *ob[4], *sb[4];
    for (int p = 0; p < 4; p++) {
      ob[p] = be->ops->buf_alloc(be, (size_t)(N * Ms[p]) * 4);
      sb[p] = be->ops->buf_alloc(be, (size_t)(N * Ms[p]) * 4);
      parts[p].bias = p == 1 ? bt : (lks_tensor){0};
    }
    for (int n = 1; n <= N; n += N - 1) {
      lks_tensor x = lks_tensor_2d(xb, 0, LKS_F32, n, K);
      for (int p = 0; p < 4; p++) {
        parts[p].out = lks_tensor_2d(ob[p], 0, LKS_F32, n, Ms[p]);
        lks_tensor want = lks_tensor_2d(sb[p], 0, LKS_F32, n, Ms[p]);
        ck_assert_int_eq(be->ops->matmul(be, want, x, parts[p].w, parts[p].bias, false), 0);
      }
      ck_assert_int_eq(lks_backend_matmuls(be, x, parts, 4), 0);
      for (int p = 0; p < 4; p++) {
        size_t bytes = (size_t)(n * Ms[p]) * 4;
        float *got = malloc(bytes), *want = malloc(bytes);
        be->ops->to_host(be, got, ob[p], 0, bytes);
        be->ops->to_host(be, want, sb[p], 0, bytes);
        ck_assert_msg(memcmp(got, want, bytes) == 0,
                      "%s, %d rows: part %d of matmuls differs from its matmul", levels[lv], n, p);
        free(got), free(want);
      }
    }
    lks_tensor x1 = lks_tensor_2d(xb, 0, LKS_F32, 1, K);
    ck_assert_int_eq(be->ops->matmuls(be, x1, parts, 0), LKS_EINVAL);
    ck_assert_int_eq(be->ops->matmuls(be, x1, parts, LKS_MATMULS_MAX + 1), LKS_EINVAL);
    for (int p = 0; p < 4; p++) {
      be->ops->buf_free(be, ob[p]);
      be->ops->buf_free(be, sb[p]);
      be->ops->buf_free(be, parts[p].w.buf);
      if (p < 3) be->ops->buf_free(be, parts[p].w.sbuf), free(keep[p]);
    }
    be->ops->buf_free(be, bt.buf);
    be->ops->buf_free(be, xb);
    free(wf), free(bias), free(xh);
    lks_backend_free(be);
  }
  unsetenv("LKS_SIMD");
}
END_TEST

int main(void) {
  Suite *s = suite_create("quant");
  TCase *tc = tcase_create("loader");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_loader, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, test_config_refusals);
  suite_add_tcase(s, tc);
  tc = tcase_create("kernels");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_kernels);
  tcase_add_test(tc, test_grid_kernels);
  tcase_add_test(tc, test_fp8_exponent0);
  tcase_add_test(tc, test_big_batch);
  tcase_add_test(tc, test_split_once);
  tcase_add_test(tc, test_batch_invariance);
  tcase_add_test(tc, test_matmuls);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
