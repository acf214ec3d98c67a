// SPDX-License-Identifier: MIT
// `lockstep bench`: prefill and decode speed of one sequence, next to the limit the machine sets.
// Decode reads every active weight once per token (DESIGN.md section 11), so the figure that
// matters is bytes read per token x tokens/s against the memory bandwidth measured here, with the
// same number of threads, by streaming a buffer much larger than the caches.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "model/sample.h"

enum { BW_CHUNK = 4096 };  // floats; the L1-resident vector each chunk is dotted with

typedef struct {
  const float *big;
  const float *small;
  size_t n;
  int tasks;
  const lks__cpu_kernels *k;
  float sink[64];
} bw_job;

static void bw_task(void *ctx, int task, int thread) {
  bw_job *j = ctx;
  size_t per = j->n / (size_t)j->tasks, a = per * (size_t)task, b = a + per;
  float s = 0;
  for (size_t i = a; i + BW_CHUNK <= b; i += BW_CHUNK) s += j->k->dot_f32(j->big + i, j->small, BW_CHUNK);
  j->sink[thread & 63] += s;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Read bandwidth in bytes/s: median of several passes over 1 GiB.
static double measure_bandwidth(int threads) {
  size_t n = (size_t)1 << 28;
  float *big = malloc(n * sizeof *big), small[BW_CHUNK];
  lks_pool *pool = lks_pool_new(threads);
  if (!big || !pool) {
    free(big);
    lks_pool_free(pool);
    return 0;
  }
  for (size_t i = 0; i < n; i++) big[i] = (float)(i & 1023);
  for (int i = 0; i < BW_CHUNK; i++) small[i] = 1.0f;
  bw_job j = {big, small, n, threads * 16, lks__cpu_kernels_best(), {0}};
  double t[7];
  for (int r = 0; r < 7; r++) {
    double t0 = lks_now();
    lks_pool_run(pool, j.tasks, bw_task, &j);
    t[r] = lks_now() - t0;
  }
  lks_pool_free(pool);
  free(big);
  return (double)n * sizeof(float) / median(t, 7);
}

int lks_cmd_bench(lks_settings *s) {
  lks_backend *be;
  lks_model *m;
  if (lks_cli_open(s, &be, &m) < 0) return 1;
  const lks_config *c = lks_model_config(m);
  int n_pre = (int)lks_settings_int(s, "prefill-len"), n_dec = (int)lks_settings_int(s, "decode-len");
  int reps = (int)lks_settings_int(s, "repeats"), bs = (int)lks_settings_int(s, "kv-block");
  int threads = (int)lks_settings_int(s, "threads");
  if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int len = n_pre + n_dec, rc = 1;
  lks_kv_cache *kv = lks_model_kv_new(m, false, bs, (len + bs - 1) / bs, 1, len);
  int32_t *tok = malloc((size_t)len * sizeof *tok), *pos = malloc((size_t)len * sizeof *pos);
  int32_t *seq = calloc((size_t)len, sizeof *seq);
  double *tp = malloc((size_t)reps * sizeof *tp), *td = malloc((size_t)reps * sizeof *td);
  if (!kv || !tok || !pos || !seq || !tp || !td) {
    fprintf(stderr, "lockstep bench: %s\n", lks_last_error());
    goto done;
  }
  lks_rng rng;
  lks_rng_seed(&rng, 1);
  for (int i = 0; i < len; i++) {
    tok[i] = (int32_t)(lks_rng_next(&rng) % (uint64_t)c->vocab);
    pos[i] = i;
  }
  for (int r = 0; r < reps; r++) {
    int sid = lks_kv_seq_alloc(kv);
    int32_t last = n_pre - 1;
    if (sid < 0 || lks_kv_seq_resize(kv, sid, n_pre) < 0) goto fail;
    lks_batch b = {n_pre, tok, pos, seq, 1, &last};
    lks_tensor logits;
    int32_t next;
    double t0 = lks_now();
    if (lks_model_forward(m, kv, &b, &logits, NULL) < 0) goto fail;
    if (be->ops->argmax(be, logits, &next, NULL) < 0) goto fail;
    tp[r] = lks_now() - t0;
    t0 = lks_now();
    for (int i = 0; i < n_dec; i++) {
      int p = n_pre + i;
      int32_t zero = 0;
      if (lks_kv_seq_resize(kv, sid, p + 1) < 0) goto fail;
      lks_batch d = {1, &next, &pos[p], seq, 1, &zero};
      if (lks_model_forward(m, kv, &d, &logits, NULL) < 0) goto fail;
      if (be->ops->argmax(be, logits, &next, NULL) < 0) goto fail;
    }
    td[r] = lks_now() - t0;
    lks_kv_seq_free(kv, sid);
  }
  double bw = measure_bandwidth(threads);
  lks_model_stats st;
  lks_model_stats_get(m, &st);
  double pre = median(tp, reps), dec = median(td, reps);
  double dec_tps = n_dec / dec;
  // Average KV bytes read per decode step: positions n_pre .. n_pre + n_dec - 1.
  double kv_bytes = (double)st.kv_bytes_per_pos * (n_pre + (n_dec - 1) / 2.0 + 1);
  double bytes_tok = (double)st.bytes_per_token + kv_bytes;
  printf("model: %s (%.1f M params, %.1f M active, %.2f GB of weights)\n", lks_cli_model_dir(s),
         st.params_total / 1e6, st.params_active / 1e6, st.weight_bytes / 1e9);
  printf("threads: %d, backend %s, %d repeats (medians)\n", threads, be->ops->name, reps);
  printf("prefill: %d tokens in %.3f s = %.1f tokens/s\n", n_pre, pre, n_pre / pre);
  printf("decode:  %d tokens in %.3f s = %.2f tokens/s (%.2f ms/token)\n", n_dec, dec, dec_tps,
         1e3 * dec / n_dec);
  printf("bytes read per decoded token: %.1f MB (weights %.1f MB + KV %.2f MB)\n", bytes_tok / 1e6,
         st.bytes_per_token / 1e6, kv_bytes / 1e6);
  printf("memory bandwidth (measured, %d threads): %.2f GB/s\n", threads, bw / 1e9);
  printf("achieved: %.2f GB/s = %.2f of measured bandwidth\n", bytes_tok * dec_tps / 1e9,
         bw > 0 ? bytes_tok * dec_tps / bw : 0.0);
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "lockstep bench: %s\n", lks_last_error());
done:
  free(tok);
  free(pos);
  free(seq);
  free(tp);
  free(td);
  lks_kv_free(kv);
  lks_model_free(m);
  lks_backend_free(be);
  return rc;
}
