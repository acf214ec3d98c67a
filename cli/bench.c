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
#include "coordinator/world.h"
#include "spec/spec.h"

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

// Round trip of a heartbeat through the control plane (send, worker acks), median over n.
static double heartbeat_rtt(lks_world *w, int n) {
  if (!w->ctl) return 0;
  double *t = malloc((size_t)n * sizeof *t);
  for (int i = 0; i < n; i++) {
    Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
    cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_HEARTBEAT;
    double t0 = lks_now();
    if (lks_world_submit(w, &cmd, NULL) < 0 || lks_ctl_wait_acks(w->ctl, cmd.step_id, 5) < 0) {
      free(t);
      return -1;
    }
    t[i] = lks_now() - t0;
  }
  double m = median(t, n);
  free(t);
  return m;
}

int lks_cmd_bench(lks_settings *s) {
  int threads = (int)lks_settings_int(s, "threads");
  if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  // Measured before the world starts: rank 0 issues no commands while it measures, and workers
  // treat a silent coordinator as dead after three heartbeats.
  double bw = getenv("OMPI_COMM_WORLD_RANK") && atoi(getenv("OMPI_COMM_WORLD_RANK")) != 0
                  ? 0 : measure_bandwidth(threads);
  lks_world *w = lks_world_start(s, lks_cli_model_dir(s), 1);
  if (!w) {
    fprintf(stderr, "lockstep bench: %s\n", lks_last_error());
    return 1;
  }
  if (w->rank != 0) return lks_cli_worker(w);
  const lks_config *c = lks_model_config(w->model);
  int n_pre = (int)lks_settings_int(s, "prefill-len"), n_dec = (int)lks_settings_int(s, "decode-len");
  int reps = (int)lks_settings_int(s, "repeats");
  int len = n_pre + n_dec, rc = 1;
  int32_t *tok = malloc((size_t)len * sizeof *tok);
  double *tp = malloc((size_t)reps * sizeof *tp), *td = malloc((size_t)reps * sizeof *td);
  double ctl = 0, exec = 0, comm = 0;
  if (!tok || !tp || !td) goto fail;
  if (len > (int)lks_settings_int(s, "max-seq-len")) {
    lks_set_error(LKS_EINVAL, "--prefill-len + --decode-len exceed --max-seq-len");
    goto fail;
  }
  lks_rng rng;
  lks_rng_seed(&rng, 1);
  for (int i = 0; i < len; i++) tok[i] = (int32_t)(lks_rng_next(&rng) % (uint64_t)c->vocab);
  for (int r = 0; r < reps; r++) {
    int32_t next;
    const uint32_t slot0 = 0;
    lks_engine_out out;
    if (lks_world_slots(w, LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT, &slot0, 1) < 0) goto fail;
    double t0 = lks_now();
    if (lks_world_forward1(w, LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL, 0, tok, n_pre, 0, false, false,
                           false, &out) < 0)
      goto fail;
    next = out.tokens[0];
    tp[r] = lks_now() - t0;
    double c0 = w->t_control, e0 = w->t_exec, m0 = w->t_comm;
    t0 = lks_now();
    for (int i = 0; i < n_dec; i++) {
      if (lks_world_forward1(w, LOCKSTEP__CMD_TYPE__EP_CMD_DECODE, 0, &next, 1, n_pre + i, false,
                             false, false, &out) < 0)
        goto fail;
      next = out.tokens[0];
    }
    td[r] = lks_now() - t0;
    ctl += (w->t_control - c0) / n_dec / reps;
    exec += (w->t_exec - e0) / n_dec / reps;
    comm += (w->t_comm - m0) / n_dec / reps;
    if (lks_world_slots(w, LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT, &slot0, 1) < 0) goto fail;
  }
  // Speculation: the same prompt through the speculative driver, with and without the proposer.
  const char *spec = lks_settings_str(s, "spec");
  lks_spec_stats sst = {0};
  double t_plain_run = 0, t_spec_run = 0;
  if (strcmp(spec, "off") != 0) {
    lks_proposer *prop = lks_proposer_new(spec, w);
    if (!prop) goto fail;
    lks_spec_opts o = {0};
    o.k_max = (int)lks_settings_int(s, "num-drafts");
    o.gate = lks_settings_bool(s, "spec-gate");
    o.ignore_eos = true;
    if (lks_ladder_parse(lks_settings_str(s, "ladder"), &o.ladder) < 0) goto fail;
    double *a = malloc((size_t)reps * sizeof *a), *b = malloc((size_t)reps * sizeof *b);
    lks_spec_stats plain;
    for (int r = 0; r < reps; r++) {
      double t0 = lks_now();
      o.proposer = NULL;
      if (lks_spec_generate(w, tok, n_pre, n_dec, &o, &plain) < 0) goto fail;
      a[r] = lks_now() - t0;
      t0 = lks_now();
      o.proposer = prop;
      if (lks_spec_generate(w, tok, n_pre, n_dec, &o, &sst) < 0) goto fail;
      b[r] = lks_now() - t0;
    }
    t_plain_run = median(a, reps);
    t_spec_run = median(b, reps);
    free(a);
    free(b);
    lks_proposer_free(prop);
  }
  double rtt = heartbeat_rtt(w, 200);
  lks_model_stats st;
  lks_model_stats_get(w->model, &st);
  double pre = median(tp, reps), dec = median(td, reps);
  double dec_tps = n_dec / dec;
  // Average KV bytes read per decode step: positions n_pre .. n_pre + n_dec - 1.
  double kv_bytes = (double)st.kv_bytes_per_pos * (n_pre + (n_dec - 1) / 2.0 + 1);
  double bytes_tok = (double)st.bytes_per_token + kv_bytes;
  printf("model: %s (%.1f M params, %.2f GB of weights on rank 0)\n", lks_cli_model_dir(s),
         st.params_total / 1e6, st.weight_bytes / 1e9);
  printf("world: %d rank(s), %d threads each, backend %s, %d repeats (medians)\n", w->world,
         threads, w->be->ops->name, reps);
  printf("prefill: %d tokens in %.3f s = %.1f tokens/s\n", n_pre, pre, n_pre / pre);
  printf("decode:  %d tokens in %.3f s = %.2f tokens/s (%.2f ms/token)\n", n_dec, dec, dec_tps,
         1e3 * dec / n_dec);
  printf("decode step on rank 0: compute %.3f ms, collectives %.3f ms, control plane %.1f us "
         "(send); heartbeat round trip %.1f us\n",
         exec * 1e3, comm * 1e3, ctl * 1e6, rtt * 1e6);
  printf("bytes read per decoded token on rank 0: %.1f MB (weights %.1f MB + KV %.2f MB)\n",
         bytes_tok / 1e6, st.bytes_per_token / 1e6, kv_bytes / 1e6);
  printf("memory bandwidth (measured, %d threads): %.2f GB/s\n", threads, bw / 1e9);
  printf("achieved: %.2f GB/s = %.2f of measured bandwidth (per rank)\n", bytes_tok * dec_tps / 1e9,
         bw > 0 ? bytes_tok * dec_tps / bw : 0.0);
  if (t_spec_run > 0) {
    printf("generate %d tokens after %d (prefill included), --spec %s -k %d: %.2f tokens/s vs %.2f "
           "without (x%.2f)\n",
           n_dec, n_pre, spec, sst.k_max, n_dec / t_spec_run, n_dec / t_plain_run,
           t_plain_run / t_spec_run);
    printf("acceptance per draft position:");
    for (int i = 0; i < sst.k_max; i++)
      printf(" %d: %.3f", i + 1, sst.proposed[i] ? (double)sst.accepted[i] / (double)sst.proposed[i] : 0.0);
    printf("; mean accepted length %.3f tokens per round, %.3f tokens per target forward\n",
           sst.rounds ? (double)sst.tok_spec / (double)sst.rounds : 0.0,
           sst.target_forwards ? (double)sst.emitted / (double)sst.target_forwards : 0.0);
  }
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "lockstep bench: %s\n", lks_last_error());
done:
  free(tok);
  free(tp);
  free(td);
  lks_world_stop(w);
  return rc;
}
