// SPDX-License-Identifier: MIT
// Speed of the CPU backend's kernels on one thread, level by level (LKS_SIMD's names): the BF16
// and F32 blocked products (mm_*) of M weight rows of K columns with 1 activation row (decode),
// with 2 (a verify of one draft) and with 8 (a batch), the FP8 (128-blocks) and NVFP4 dots one
// weight row at a time, and the backend's FP8 and NVFP4 products of the M rows with 1
// activation row (lks__quant_matmul_rows), and decode's BF16 stream (mv_bf16, where the level
// has it: one row at a time, fetching ahead; compare it with fp8 n=1 and nvfp4 n=1 out of cache,
// e.g. M = 131072). Reports the thread's CPU time
// per call (median of repeats), which a machine busy with other work disturbs less than wall
// time, and the speed-up over the portable level. Under qemu-user the figures say which kernels
// emulate faster, nothing about a real CPU. FP8 codes of exponent 0 come exp0 a million (an
// Intel core converts them to f32 subnormals slowly: see cpu_quant.c).
//   build/kernel_bench [M] [K] [repeats] [exp0]
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu_kernels.h"
#include "core/cpu_quant.h"
#include "core/dtype.h"

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

enum { MAX_REP = 64 };

static uint8_t *w8_flags, *gs_flags;  // lks_e4m3_exp0_chunks of the FP8 codes, NVFP4 scales

// 128-column scale blocks of a row of K columns (the last one cropped).
#define KB(K) (((K) + 127) / 128)

// The median CPU time of `rep` runs of case c of level l.
static double run_case(const lks__cpu_kernels *k, const lks__quant_kernels *q, int c, int rep,
                       const void *wb, const float *wf, const uint8_t *w8, const uint8_t *w4,
                       const float *bs, const uint8_t *gs, const float *x, int64_t M, int64_t K,
                       float *out) {
  double t[MAX_REP];
  void *scratch = k->mm_scratch ? malloc(k->mm_scratch(K)) : NULL;
  if (k->mm_scratch && !scratch) return 0;
  for (int r = 0; r < rep; r++) {
    double t0 = cpu_now();
    switch (c) {
      case 0: k->mm_bf16(wb, K, M, x, K, 1, K, out, M, scratch); break;
      case 1: k->mm_bf16(wb, K, M, x, K, 8, K, out, M, scratch); break;
      case 2: k->mm_f32(wf, K, M, x, K, 1, K, out, M, NULL); break;
      case 3: k->mm_f32(wf, K, M, x, K, 8, K, out, M, NULL); break;
      case 8: k->mm_bf16(wb, K, M, x, K, 2, K, out, M, scratch); break;
      case 9: k->mm_f32(wf, K, M, x, K, 2, K, out, M, NULL); break;
      case 12: k->mv_bf16(wb, K, M, x, K, out, NULL, 0); break;  // decode's BF16 stream
      case 6:
      case 7:
      case 10:
      case 11: {  // the backend's product (several weight rows a kernel call where it has them)
        lks__qweight q8 = {.qs = LKS_Q_FP8_BLOCK, .codes = w8, .ld = K, .scales = bs,
                           .sld = KB(K), .global = 1.0f, .rows = M, .cols = K, .exp0 = w8_flags};
        lks__qweight q4 = {.qs = LKS_Q_NVFP4, .codes = w4, .ld = K / 2, .scales = gs,
                           .sld = K / 16, .global = 1.0f, .rows = M, .cols = K,
                           .exp0 = gs_flags};
        lks__quant_matmul_rows(q, c == 6 || c == 10 ? &q8 : &q4, 0, M, x, K, c < 10 ? 1 : 2, out,
                               M);
        break;
      }
      default: {
        const float *xs[1] = {x};
        // Where the level splits x: split once, then one weight row a call of the grid.
        bool grid = c == 4 ? q->fp8_grid != NULL : q->nvfp4_grid != NULL;
        int64_t sl = c == 4 ? lks__fp8_split_len(K) : lks__nvfp4_split_len(K);
        float *split = grid ? malloc((size_t)sl * 4) : NULL;
        if (split) (c == 4 ? q->fp8_split : q->nvfp4_split)(x, K, split);
        const float *sp[1] = {split};
        for (int64_t i = 0; i < M; i++) {
          const uint8_t *wr[1] = {w8 + i * K}, *w4r[1] = {w4 + i * (K / 2)},
                        *gr[1] = {gs + i * (K / 16)};
          const float *br[1] = {bs + (i / 128) * KB(K)};
          if (c == 4 && split)
            q->fp8_grid(wr, NULL, br, NULL, 128, sp, 1, 1, K, out + i);
          else if (c == 4)
            q->fp8(w8 + i * K, bs + (i / 128) * KB(K), 128, xs, 1, K, out + i);
          else if (split)
            q->nvfp4_grid(w4r, NULL, gr, NULL, sp, 1, 1, K, out + i);
          else
            q->nvfp4(w4 + i * (K / 2), gs + i * (K / 16), xs, 1, K, out + i);
        }
        free(split);
      }
    }
    t[r] = cpu_now() - t0;
  }
  free(scratch);
  qsort(t, (size_t)rep, sizeof *t, cmp_d);
  return t[rep / 2];
}

int main(int argc, char **argv) {
  int64_t M = argc > 1 ? atoll(argv[1]) : 512, K = argc > 2 ? atoll(argv[2]) : 1024;
  int rep = argc > 3 ? atoi(argv[3]) : 5, exp0 = argc > 4 ? atoi(argv[4]) : 100;
  if (M < 1 || K < 32 || K % 32 || rep < 1 || rep > MAX_REP || exp0 < 0 || exp0 > 1000000) {
    fprintf(stderr,
            "usage: kernel_bench [M] [K, a multiple of 32] [repeats <= %d] [FP8 codes of "
            "exponent 0 a million, default 100]\n",
            MAX_REP);
    return 2;
  }
  uint16_t *wb = malloc((size_t)(M * K) * 2);
  float *wf = malloc((size_t)(M * K) * 4), *x = malloc((size_t)(8 * K) * 4);
  float *bs = malloc((size_t)(((M + 127) / 128) * KB(K)) * 4), *out = malloc((size_t)(8 * M) * 4);
  uint8_t *w8 = malloc((size_t)(M * K)), *w4 = malloc((size_t)(M * K / 2)),
          *gs = malloc((size_t)(M * K / 16));
  if (!wb || !wf || !x || !bs || !out || !w8 || !w4 || !gs) return 1;
  uint64_t s = 88172645463325252ull;
  for (int64_t i = 0; i < M * K; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    wf[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    wb[i] = lks_f32_to_bf16(wf[i]);
    w8[i] = (uint8_t)((s >> 3) & 0x7e) | 0x08;  // exponent 1 or more, no NaN codes
    if (i < M * K / 2) w4[i] = (uint8_t)(s >> 17);
    if (i < M * K / 16) gs[i] = (uint8_t)((s >> 29) & 0x3f) | 0x08;  // scales: the same
  }
  // Codes of exponent 0 (zeros, subnormals): exp0 a million, spread evenly (100: the share in
  // tools/gen_model.py's FP8 checkpoints; random bytes would have 62500). The backend's flags of
  // them (lks_e4m3_exp0_chunks) go with the FP8 products.
  for (int64_t i = 0; exp0 > 0 && i < M * K; i += 1000000 / exp0) w8[i] = 3;
  w8_flags = malloc((size_t)(M * lks_e4m3_chunks(K)));
  if (!w8_flags) return 1;
  lks_e4m3_exp0_chunks(w8, K, M, K, LKS_E4M3_CHUNK, w8_flags);
  if (!(gs_flags = malloc((size_t)(M * lks_e4m3_chunks(K))))) return 1;
  lks_e4m3_exp0_chunks(gs, K / 16, M, K / 16, LKS_E4M3_CHUNK / 16, gs_flags);
  for (int64_t i = 0; i < (M + 127) / 128 * KB(K); i++) bs[i] = 0.01f;
  for (int64_t i = 0; i < 8 * K; i++) x[i] = (float)((i % 7) - 3) * 0.25f;
  static const char *levels[] = {"scalar", "avx2", "avx512", "amx", "neon", "neon_bf16"};
  static const char *cases[] = {"mm_bf16 n=1", "mm_bf16 n=8", "mm_f32 n=1", "mm_f32 n=8",
                                "fp8 dot",     "nvfp4 dot",   "fp8 n=1",    "nvfp4 n=1",
                                "mm_bf16 n=2", "mm_f32 n=2",  "fp8 n=2",    "nvfp4 n=2",
                                "mv_bf16 n=1"};
  enum { N_CASES = 13 };
  double base[N_CASES] = {0};
  printf("kernel_bench: %lld x %lld weights, CPU ms per call (median of %d), speed-up over scalar\n",
         (long long)M, (long long)K, rep);
  for (int l = 0; l < (int)(sizeof levels / sizeof *levels); l++) {
    const lks__cpu_kernels *k = lks__cpu_kernels_get(levels[l]);
    const lks__quant_kernels *q = lks__quant_kernels_get(levels[l]);
    if (!k) continue;
    for (int c = 0; c < N_CASES; c++) {
      bool quant = (c >= 4 && c < 8) || c == 10 || c == 11;
      if (quant && (!q || strcmp(q->name, levels[l]) != 0)) continue;  // the same as another
      if (c == 12 && !k->mv_bf16) continue;  // the level reads blocks of rows (mm_bf16)
      double t = run_case(k, q, c, rep, wb, wf, w8, w4, bs, gs, x, M, K, out);
      if (l == 0) base[c] = t;
      double b = c == 12 && base[c] == 0 ? base[0] : base[c];  // the same product as mm_bf16 n=1
      printf("  %-10s %-12s %9.3f ms  x%.2f\n", levels[l], cases[c], t * 1e3,
             b > 0 && t > 0 ? b / t : 0.0);
    }
  }
  free(wb), free(wf), free(x), free(bs), free(out), free(w8), free(w4), free(gs);
  free(w8_flags), free(gs_flags);
  return 0;
}
