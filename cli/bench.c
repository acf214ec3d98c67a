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
#include "coordinator/scheduler.h"
#include "coordinator/submit.h"

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

// The times of a run's first and last tokens, and rank 0's time split when the first came.
typedef struct {
  lks_world *w;
  double t_first, t_last, ctl0, exec0, comm0;
  int n;
} bench_clock;

static void bench_token(void *ctx, int32_t tok, bool eos) {
  (void)tok, (void)eos;
  bench_clock *c = ctx;
  c->t_last = lks_now();
  if (c->n++ == 0) {
    c->t_first = c->t_last;
    c->ctl0 = c->w->t_control;
    c->exec0 = c->w->t_exec;
    c->comm0 = c->w->t_comm;
  }
}

// One sequence of n_gen tokens after the prompt, through a scheduler made with options o; its
// speculation statistics into *st when st is set.
static int bench_run(lks_world *w, const lks_sched_opts *o, const int32_t *tok, int n_pre,
                     int n_gen, bench_clock *c, lks_spec_stats *st) {
  // Every run prefills its whole prompt: nothing from the prefix cache.
  Lockstep__Command clear = LOCKSTEP__COMMAND__INIT;
  clear.type = LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE;
  LKS_TRY(lks_world_submit(w, &clear, NULL));
  lks_sched *sched = lks_sched_new(w, NULL, o);
  if (!sched) return -1;
  lks_req_params p = {0};
  p.prompt = malloc((size_t)n_pre * sizeof *p.prompt);
  if (!p.prompt) {
    lks_sched_free(sched);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  memcpy(p.prompt, tok, (size_t)n_pre * sizeof *tok);
  p.n_prompt = n_pre;
  p.max_tokens = n_gen;
  p.ignore_eos = true;
  p.on_token = bench_token;
  p.on_token_ctx = c;
  int rc = lks_sched_run_one(sched, &p);
  if (rc == 0 && st) {
    lks_sched_stats ss;
    lks_sched_stats_get(sched, &ss);
    *st = ss.spec;
  }
  lks_sched_free(sched);
  return rc;
}

// Decode tokens/s of a run's steps without prefill rows (plain and speculative together).
static double decode_rate(const lks_spec_stats *st) {
  double t = st->t_spec + st->t_plain;
  return t > 0 ? (double)(st->tok_spec + st->tok_plain) / t : 0;
}

// Median times of n_dec tokens after the prompt without speculation and with proposer `spec`
// (prefill included), and the medians of the decode rates and of their ratio, run by run.
typedef struct {
  double t_plain, t_spec, rate_plain, rate_spec, ratio;
} spec_medians;
static int bench_spec(lks_world *w, lks_sched_opts *so, const char *spec, const int32_t *tok,
                      int n_pre, int n_dec, int reps, spec_medians *md, lks_spec_stats *sst) {
  double *v = malloc((size_t)reps * 5 * sizeof *v);
  double *a = v, *b = v + reps, *rp = v + 2 * reps, *rs = v + 3 * reps, *ra = v + 4 * reps;
  int rc = v ? 0 : lks_set_error(LKS_ENOMEM, "out of memory");
  for (int r = 0; rc == 0 && r < reps; r++) {
    bench_clock bc = {w, 0, 0, 0, 0, 0, 0};
    lks_spec_stats pst;
    double t0 = lks_now();
    snprintf(so->spec, sizeof so->spec, "off");
    rc = bench_run(w, so, tok, n_pre, n_dec, &bc, &pst);
    a[r] = lks_now() - t0;
    t0 = lks_now();
    snprintf(so->spec, sizeof so->spec, "%s", spec);
    if (rc == 0) rc = bench_run(w, so, tok, n_pre, n_dec, &bc, sst);
    b[r] = lks_now() - t0;
    rp[r] = decode_rate(&pst);
    rs[r] = rc == 0 ? decode_rate(sst) : 0;
    ra[r] = rp[r] > 0 ? rs[r] / rp[r] : 0;
  }
  if (rc == 0) *md = (spec_medians){median(a, reps), median(b, reps), median(rp, reps),
                                    median(rs, reps), median(ra, reps)};
  free(v);
  return rc;
}

// The speculation roofline, measured: for K = 1..k_max (the gate off), a speculative step's
// cost next to a plain step's (the drafter's part and the verify's), the acceptance per
// position, and from them the best speedup K can give, E[tokens per step] x plain step time /
// speculative step time, with E = 1 + sum_j prod_{i<=j} alpha_i; then the speedup achieved.
// *best_roof, *best_k: the best of them (1 and K = 0 when no K beats plain decoding).
static int roofline(lks_world *w, lks_sched_opts *so, const char *spec, const int32_t *tok,
                    int n_pre, int n_dec, int k_max, double *best_roof, int *best_k) {
  lks_spec_stats plain, sp;
  bench_clock bc = {w, 0, 0, 0, 0, 0, 0};
  bool gate = so->gate;
  so->gate = false;
  snprintf(so->spec, sizeof so->spec, "off");
  LKS_TRY(bench_run(w, so, tok, n_pre, n_dec, &bc, &plain));
  double t0 = plain.plain_steps ? plain.t_plain / (double)plain.plain_steps : 0;
  printf("speculation roofline (--spec %s, the gate off; plain step %.3f ms):\n", spec, t0 * 1e3);
  printf("  K  verify/plain  draft/plain  E[tokens/step]  roofline  achieved  fraction\n");
  int rc = 0;
  *best_roof = 1;
  *best_k = 0;
  for (int k = 1; k <= k_max && rc == 0 && t0 > 0; k++) {
    snprintf(so->spec, sizeof so->spec, "%s", spec);
    so->n_drafts = k;
    if ((rc = bench_run(w, so, tok, n_pre, n_dec, &bc, &sp)) < 0) break;
    if (!sp.spec_steps) continue;
    double steps = (double)sp.spec_steps, prop = sp.t_propose / steps;
    // accepted[i] counts the rounds whose drafts up to i were all accepted, of proposed[i] that
    // drafted i: each ratio is already the product of the conditional rates, and E their sum.
    double verify = sp.t_spec / steps - prop, e = 1;
    for (int i = 0; i < k; i++) e += sp.proposed[i] ? (double)sp.accepted[i] / (double)sp.proposed[i] : 0;
    double roof = e * t0 / (prop + verify);
    double achieved = (sp.tok_spec / sp.t_spec) / (plain.tok_plain / plain.t_plain);
    printf("  %d  %12.2f  %11.3f  %14.3f  %8.2f  %8.2f  %8.2f\n", k, verify / t0, prop / k / t0, e,
           roof, achieved, achieved / roof);
    if (roof > *best_roof) *best_roof = roof, *best_k = k;
  }
  so->gate = gate;
  so->n_drafts = k_max;
  return rc;
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
  // --prompt-ids, when given, is the prompt (real text drafts as speculation would on it; the
  // default random ids accept almost nothing with a trained drafter).
  int32_t *given = NULL;
  const char *pids = lks_settings_str(s, "prompt-ids");
  if (pids && pids[0]) {
    if (lks_cli_parse_ids(pids, c->vocab, &given, &n_pre) < 0) {
      fprintf(stderr, "lockstep bench: --prompt-ids: %s\n", lks_last_error());
      lks_world_stop(w);
      return 1;
    }
  }
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
  if (given) memcpy(tok, given, (size_t)n_pre * sizeof *tok);
  free(given);
  given = NULL;
  // Every run goes through the scheduler, the decoding loop `serve` and `generate` run: the
  // prompt prefilled in one step, then one step per token.
  lks_sched_opts so;
  lks_sched_opts_from(s, &so);
  so.chunk = n_pre;
  so.max_queue = 1;
  for (int r = 0; r < reps; r++) {
    bench_clock bc = {w, 0, 0, 0, 0, 0, 0};
    snprintf(so.spec, sizeof so.spec, "off");
    double t0 = lks_now();
    if (bench_run(w, &so, tok, n_pre, n_dec + 1, &bc, NULL) < 0) goto fail;
    tp[r] = bc.t_first - t0;
    td[r] = bc.t_last - bc.t_first;
    ctl += (w->t_control - bc.ctl0) / n_dec / reps;
    exec += (w->t_exec - bc.exec0) / n_dec / reps;
    comm += (w->t_comm - bc.comm0) / n_dec / reps;
  }
  // Speculation: the same prompt and length with and without the proposer.
  const char *spec = lks_settings_str(s, "spec");
  lks_spec_stats sst = {0};
  spec_medians md = {0};
  if (strcmp(spec, "off") != 0 && bench_spec(w, &so, spec, tok, n_pre, n_dec, reps, &md, &sst) < 0)
    goto fail;
  double t_plain_run = md.t_plain, t_spec_run = md.t_spec;
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
  double roof = 1;
  int roof_k = 0;
  if (t_spec_run > 0 && roofline(w, &so, spec, tok, n_pre, n_dec, sst.k_max, &roof, &roof_k) < 0)
    goto fail;
  if (t_spec_run > 0) {
    // The run under the levers given (the adaptive policy unless --spec-gate false) against the
    // roofline's best K (plain decoding, x1, when no K pays).
    uint64_t rows = 0;
    for (int i = 0; i <= sst.k_max; i++) rows += sst.k_rows[i];
    printf("%s: decode %.2f tokens/s vs %.2f plain (x%.3f, median of %d runs' ratios); roofline: "
           "x%.3f at K=%d; achieved fraction %.3f; K per decode row:",
           so.gate ? "policy" : "fixed K", md.rate_spec, md.rate_plain, md.ratio, reps, roof,
           roof_k, md.ratio / roof);
    for (int i = 0; i <= sst.k_max; i++)
      printf(" %d: %.0f%%", i, rows ? 100.0 * (double)sst.k_rows[i] / (double)rows : 0.0);
    printf("\n");
    printf("generate %d tokens after %d (prefill included), --spec %s -k %d: %.2f tokens/s vs %.2f "
           "without (x%.2f)\n",
           n_dec, n_pre, spec, sst.k_max, n_dec / t_spec_run, n_dec / t_plain_run,
           t_plain_run / t_spec_run);
    printf("acceptance per draft position:");
    for (int i = 0; i < sst.k_max; i++)
      printf(" %d: %.3f", i + 1, sst.proposed[i] ? (double)sst.accepted[i] / (double)sst.proposed[i] : 0.0);
    printf("; mean accepted length %.3f tokens per round (%llu rounds), %.3f tokens per target "
           "forward\n", sst.rounds ? (double)sst.tok_spec / (double)sst.rounds : 0.0,
           (unsigned long long)sst.rounds,
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
