// SPDX-License-Identifier: MIT
// `lockstep bench`: prefill and decode speed of one sequence, next to the limit the machine sets.
// Decode reads every active weight once per token (DESIGN.md section 11), so the figure that
// matters is bytes read per token x tokens/s against the memory bandwidth measured here, with the
// same number of threads, by streaming a buffer much larger than the caches.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cli/cli.h"
#include "core/clock.h"
#include "core/cpu_kernels.h"
#include "core/cpu_quant.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "model/sample.h"
#include "coordinator/scheduler.h"
#include "coordinator/submit.h"

typedef struct {
  const float *big;
  size_t n;
  int tasks;
  float sink[64];
} bw_job;

// The sum of n floats (n a multiple of 64) in four independent vectors: a read that no arithmetic
// dependence slows, at the CPU's widest level. The dot product with one accumulator (the
// kernels' fixed order) used before waits on its adds: it measured 25-40 % less than this on
// the development machine, so it understated the limit decode is compared with.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float read_sum_avx512(const float *p, size_t n) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    a = _mm512_add_ps(a, _mm512_loadu_ps(p + i));
    b = _mm512_add_ps(b, _mm512_loadu_ps(p + i + 16));
    c = _mm512_add_ps(c, _mm512_loadu_ps(p + i + 32));
    d = _mm512_add_ps(d, _mm512_loadu_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}
__attribute__((target("avx2"))) static float read_sum_avx2(const float *p, size_t n) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
    b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
    c = _mm256_add_ps(c, _mm256_loadu_ps(p + i + 16));
    d = _mm256_add_ps(d, _mm256_loadu_ps(p + i + 24));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}
#endif

static float read_sum(const float *p, size_t n) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return read_sum_avx512(p, n);
  if (__builtin_cpu_supports("avx2")) return read_sum_avx2(p, n);
#endif
  float acc[16] = {0};  // arm64: NEON is the baseline and gcc vectorises this
  for (size_t i = 0; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) acc[j] += p[i + j];
  float s = 0;
  for (int j = 0; j < 16; j++) s += acc[j];
  return s;
}

static void bw_task(void *ctx, int task, int thread) {
  bw_job *j = ctx;
  size_t per = j->n / (size_t)j->tasks / 64 * 64, a = per * (size_t)task;
  j->sink[thread & 63] += read_sum(j->big + a, per);
}

// Read bandwidth in bytes/s: median of several passes over 1 GiB.
static double measure_bandwidth(int threads) {
  size_t n = (size_t)1 << 28;
  float *big = malloc(n * sizeof *big);
  lks_pool *pool = lks_pool_new(threads);
  if (!big || !pool) {
    free(big);
    lks_pool_free(pool);
    return 0;
  }
  for (size_t i = 0; i < n; i++) big[i] = (float)(i & 1023);
  bw_job j = {big, n, threads * 16, {0}};
  double t[7];
  for (int r = 0; r < 7; r++) {
    double t0 = lks_now();
    lks_pool_run(pool, j.tasks, bw_task, &j);
    t[r] = lks_now() - t0;
  }
  lks_pool_free(pool);
  free(big);
  return (double)n * sizeof(float) / lks_median(t, 7);
}

// The blocked BF16 kernel's rate with every thread on operands that stay in each core's cache
// (each thread: MR_ROWS weight rows of MR_K, its own, against MR_N shared activation rows), in
// FLOP/s (2 per multiply-add): the ceiling of a prefill's matrix products on this machine.
enum { MR_ROWS = 128, MR_K = 1024, MR_N = 64, MR_ROUNDS = 15 };

typedef struct {
  const uint16_t *w;  // [threads * MR_ROWS, MR_K]
  const float *x;     // [MR_N, MR_K]
  float *out;         // [threads, MR_N, MR_ROWS]
  int threads;
  const lks__cpu_kernels *k;
  char *scratch;  // [threads, scratch_bytes]: the kernel level's, or NULL
  size_t scratch_bytes;
} mr_job;

static void mr_task(void *ctx, int task, int thread) {
  mr_job *j = ctx;
  int b = task % j->threads;
  j->k->mm_bf16(j->w + (size_t)b * MR_ROWS * MR_K, MR_K, MR_ROWS, j->x, MR_K, MR_N, MR_K,
                j->out + (size_t)thread * MR_N * MR_ROWS, MR_ROWS,
                j->scratch ? j->scratch + (size_t)thread * j->scratch_bytes : NULL);
}

static double measure_matrix_rate(int threads) {
  uint16_t *w = malloc((size_t)threads * MR_ROWS * MR_K * sizeof *w);
  float *x = malloc((size_t)MR_N * MR_K * sizeof *x);
  float *out = malloc((size_t)threads * MR_N * MR_ROWS * sizeof *out);
  const lks__cpu_kernels *k = lks__cpu_kernels_best();
  size_t sb = k->mm_scratch ? k->mm_scratch(MR_K) : 0;
  char *scratch = sb ? malloc((size_t)threads * sb) : NULL;
  lks_pool *pool = lks_pool_new(threads);
  double rate = 0;
  if (w && x && out && pool && (scratch || !sb)) {
    for (size_t i = 0; i < (size_t)threads * MR_ROWS * MR_K; i++)
      w[i] = (uint16_t)(0x3f80 | (i & 0x7f));  // 1.0 .. 1.99
    for (size_t i = 0; i < (size_t)MR_N * MR_K; i++) x[i] = (float)(i & 15) / 16.0f;
    mr_job j = {w, x, out, threads, k, scratch, sb};
    double t[MR_ROUNDS];
    for (int r = 0; r < MR_ROUNDS; r++) {
      double t0 = lks_now();
      lks_pool_run(pool, threads * 4, mr_task, &j);
      t[r] = lks_now() - t0;
    }
    rate = 2.0 * MR_ROWS * MR_K * MR_N * threads * 4 / lks_median(t, MR_ROUNDS);
  }
  lks_pool_free(pool);
  free(w);
  free(x);
  free(out);
  free(scratch);
  return rate;
}

// The quantized decode product's rate with every thread on weights that stay in its core's cache
// (each thread QR_ROWS rows of QR_K, its own, against one activation row, as decode calls it:
// lks__quant_matmul_rows with the loader's exponent-0 flags, none set), in weights/s. Where a
// core converts codes slower than memory delivers them (NVFP4 and FP8 on a core with two vector
// ports), this rate, not bandwidth, bounds the decode step's quantized products.
// QR_ROUNDS rounds of about 30 us each, the median.
enum { QR_ROWS = 256, QR_K = 1024, QR_ROUNDS = 101 };

typedef struct {
  const lks__quant_kernels *k;
  const lks__qweight *w;  // [threads]
  const float *x;         // [QR_K]
  float *out;             // [threads, QR_ROWS]
  int threads;
} qr_job;

static void qr_task(void *ctx, int task, int thread) {
  qr_job *j = ctx;
  int b = task % j->threads;
  lks__quant_matmul_rows(j->k, &j->w[b], 0, QR_ROWS, j->x, QR_K, 1,
                         j->out + (size_t)thread * QR_ROWS, QR_ROWS);
}

// fmt: LKS_WFMT_FP8_CHANNEL, LKS_WFMT_FP8_BLOCK or LKS_WFMT_NVFP4; 0 where it cannot measure.
static double measure_quant_rate(int threads, int fmt) {
  const bool nv = fmt == LKS_WFMT_NVFP4;
  const int64_t ld = nv ? QR_K / 2 : QR_K, nc = lks_e4m3_chunks(QR_K);
  const int64_t sld = nv ? QR_K / LKS_Q_NVFP4_GROUP
                         : (QR_K + LKS_Q_FP8_BLOCK_SIZE - 1) / LKS_Q_FP8_BLOCK_SIZE;
  const size_t scale_bytes = nv ? (size_t)QR_ROWS * sld : (size_t)QR_ROWS * sld * sizeof(float);
  uint8_t *codes = malloc((size_t)threads * QR_ROWS * ld);
  uint8_t *scales = malloc((size_t)threads * scale_bytes);
  uint8_t *flags = calloc((size_t)threads * QR_ROWS * nc, 1);
  lks__qweight *w = calloc((size_t)threads, sizeof *w);
  float *x = malloc(QR_K * sizeof *x), *out = malloc((size_t)threads * QR_ROWS * sizeof *out);
  lks_pool *pool = lks_pool_new(threads);
  double rate = 0;
  if (codes && scales && flags && w && x && out && pool) {
    // FP8 codes of exponent 1-13 (no zero, subnormal or NaN: the flags say none), any NVFP4
    // code; scales 1.0 (E4M3 0x38 for NVFP4's groups).
    for (size_t i = 0; i < (size_t)threads * QR_ROWS * ld; i++)
      codes[i] = nv ? (uint8_t)(i * 37) : (uint8_t)((((i * 37) & 0x67) | 0x08));
    for (size_t i = 0; i < (size_t)threads * scale_bytes; i += nv ? 1 : sizeof(float)) {
      if (nv) scales[i] = 0x38;
      else memcpy(scales + i, &(float){1.0f}, sizeof(float));
    }
    for (int i = 0; i < QR_K; i++) x[i] = (float)(i & 15) / 16.0f;
    for (int t = 0; t < threads; t++)
      w[t] = (lks__qweight){.qs = nv ? LKS_Q_NVFP4
                                     : fmt == LKS_WFMT_FP8_BLOCK ? LKS_Q_FP8_BLOCK : LKS_Q_FP8_ROW,
                            .codes = codes + (size_t)t * QR_ROWS * ld,
                            .ld = ld,
                            .scales = scales + (size_t)t * scale_bytes,
                            .sld = fmt == LKS_WFMT_FP8_CHANNEL ? 1 : sld,
                            .exp0 = flags + (size_t)t * QR_ROWS * nc,
                            .global = 1.0f,
                            .rows = QR_ROWS,
                            .cols = QR_K};
    qr_job j = {lks__quant_kernels_best(), w, x, out, threads};
    double t[QR_ROUNDS];
    for (int r = 0; r < QR_ROUNDS; r++) {
      double t0 = lks_now();
      lks_pool_run(pool, threads * 4, qr_task, &j);
      t[r] = lks_now() - t0;
    }
    rate = (double)QR_ROWS * QR_K * threads * 4 / lks_median(t, QR_ROUNDS);
  }
  lks_pool_free(pool);
  free(codes);
  free(scales);
  free(flags);
  free(w);
  free(x);
  free(out);
  return rate;
}

// A comma-separated list of integers in [lo, hi] from option `name` into v (at most cap);
// returns how many, or a negative code naming the option.
static int parse_list(const char *text, const char *name, int lo, int hi, int *v, int cap) {
  int n = 0;
  for (const char *p = text; p && *p;) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || (*end && *end != ',') || x < lo || x > hi || n == cap)
      return lks_set_error(LKS_EINVAL,
                           "--%s: '%s' is not a list of at most %d integers in [%d, %d]", name,
                           text, cap, lo, hi);
    v[n++] = (int)x;
    p = *end ? end + 1 : end;
  }
  return n;
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
  double m = lks_median(t, n);
  free(t);
  return m;
}

// The times of a run's first and last tokens, and rank 0's time split when the first came.
typedef struct {
  lks_world *w;
  double t_first, t_last, ctl0, exec0, comm0;
  int n;
  uint64_t coll0;  // rank 0's collectives so far
} bench_clock;

// Rank 0's collectives of every kind so far.
static uint64_t collectives(const lks_world *w) {
  const lks_comm_stats *c = &w->comm->stats;
  return c->allreduce + c->allgather + c->broadcast + c->argmax + c->vote + c->barrier;
}

static void bench_token(void *ctx, int32_t tok, bool eos) {
  (void)tok, (void)eos;
  bench_clock *c = ctx;
  c->t_last = lks_now();
  if (c->n++ == 0) {
    c->t_first = c->t_last;
    c->ctl0 = c->w->t_control;
    c->exec0 = c->w->t_exec;
    c->comm0 = c->w->t_comm;
    c->coll0 = collectives(c->w);
    if (c->w->ctl) lks_ctl_window(c->w->ctl);  // the workers' times from here on
  }
}

// The counters of b less those of a (b after a, the same scheduler).
static lks_spec_stats spec_stats_since(const lks_spec_stats *a, const lks_spec_stats *b) {
  lks_spec_stats d = *b;
  for (int i = 0; i < LKS_MAX_DRAFTS; i++) {
    d.proposed[i] -= a->proposed[i];
    d.accepted[i] -= a->accepted[i];
  }
  for (int i = 0; i <= LKS_MAX_DRAFTS; i++) d.k_rows[i] -= a->k_rows[i];
  d.rounds -= a->rounds, d.plain_steps -= a->plain_steps;
  d.target_forwards -= a->target_forwards, d.emitted -= a->emitted;
  d.t_spec -= a->t_spec, d.t_plain -= a->t_plain, d.t_propose -= a->t_propose;
  d.tok_spec -= a->tok_spec, d.tok_plain -= a->tok_plain, d.spec_steps -= a->spec_steps;
  return d;
}

// One sequence of n_gen tokens after the prompt through scheduler `sched` (which may have run
// others before, as a server's does); that sequence's speculation statistics into *st when set.
static int bench_run_in(lks_world *w, lks_sched *sched, const int32_t *tok, int n_pre, int n_gen,
                        bench_clock *c, lks_spec_stats *st) {
  // Every run prefills its whole prompt: nothing from the prefix cache.
  Lockstep__Command clear = LOCKSTEP__COMMAND__INIT;
  clear.type = LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE;
  LKS_TRY(lks_world_submit(w, &clear, NULL));
  lks_req_params p = {0};
  p.prompt = malloc((size_t)n_pre * sizeof *p.prompt);
  if (!p.prompt) return lks_set_error(LKS_ENOMEM, "out of memory");
  memcpy(p.prompt, tok, (size_t)n_pre * sizeof *tok);
  p.n_prompt = n_pre;
  p.max_tokens = n_gen;
  p.ignore_eos = true;
  p.on_token = bench_token;
  p.on_token_ctx = c;
  lks_sched_stats before, after;
  lks_sched_stats_get(sched, &before);
  int rc = lks_sched_run_one(sched, &p);
  if (rc == 0 && st) {
    lks_sched_stats_get(sched, &after);
    *st = spec_stats_since(&before.spec, &after.spec);
  }
  return rc;
}

// The same through a new scheduler made with options o (a server's first request).
static int bench_run(lks_world *w, const lks_sched_opts *o, const int32_t *tok, int n_pre,
                     int n_gen, bench_clock *c, lks_spec_stats *st) {
  lks_sched *sched = lks_sched_new(w, NULL, o);
  if (!sched) return -1;
  int rc = bench_run_in(w, sched, tok, n_pre, n_gen, c, st);
  lks_sched_free(sched);
  return rc;
}

// n sequences decoded together: each a prompt of n_pre random ids (its own), all prefilled in
// one step, then n_dec tokens each, greedy or sampled (T = 1, top-p 0.95, seed per sequence).
// *rate: tokens/s of the steps without prefill rows (all n sequences in each); *pick: seconds
// picking tokens per sequence and step (scheduler.h, t_pick).
static int bench_batch(lks_world *w, const lks_sched_opts *o, int n, int n_pre, int n_dec,
                       bool sampled, double *rate, double *pick) {
  Lockstep__Command clear = LOCKSTEP__COMMAND__INIT;
  clear.type = LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE;
  LKS_TRY(lks_world_submit(w, &clear, NULL));
  lks_sched_opts bo = *o;
  bo.chunk = n * n_pre;
  bo.max_queue = n;
  snprintf(bo.spec, sizeof bo.spec, "off");
  lks_sched *sched = lks_sched_new(w, NULL, &bo);
  if (!sched) return -1;
  int vocab = lks_model_config(w->model)->vocab, rc = 0, submitted = 0;
  lks_req **req = calloc((size_t)n, sizeof *req);
  if (!req) rc = lks_set_error(LKS_ENOMEM, "out of memory");
  for (int i = 0; rc == 0 && i < n; i++) {
    lks_req_params p = {0};
    p.prompt = malloc((size_t)n_pre * sizeof *p.prompt);
    if (!p.prompt) {
      rc = lks_set_error(LKS_ENOMEM, "out of memory");
      break;
    }
    lks_rng rng;
    lks_rng_seed(&rng, 1000 + (uint64_t)i);
    for (int t = 0; t < n_pre; t++) p.prompt[t] = (int32_t)(lks_rng_next(&rng) % (uint64_t)vocab);
    p.n_prompt = n_pre;
    p.max_tokens = n_dec;
    p.ignore_eos = true;
    p.seed = (uint64_t)i + 1;
    p.sampling = sampled ? (lks_sampling){1.0f, 0, 0.95f} : (lks_sampling){0, 0, 1};
    int err;
    if (!(req[i] = lks_sched_submit(sched, &p, &err)))
      rc = lks_set_error(err, "the scheduler refused a request");
    else
      submitted++;
  }
  for (bool done = false; rc >= 0 && !done;) {
    done = true;
    for (int i = 0; i < submitted; i++) done &= lks_req_finished(req[i]);
    rc = lks_sched_step(sched);  // the last one frees the slots on every rank
  }
  for (int i = 0; i < submitted; i++) lks_req_release(req[i]);
  free(req);
  if (rc >= 0) {
    lks_sched_stats ss;
    lks_sched_stats_get(sched, &ss);
    *rate = ss.spec.t_plain > 0 ? (double)ss.spec.tok_plain / ss.spec.t_plain : 0;
    *pick = ss.seq_steps ? ss.t_pick / (double)ss.seq_steps : 0;
  }
  lks_sched_free(sched);
  return rc < 0 ? rc : 0;
}

// Decode tokens/s of a run's steps without prefill rows (plain and speculative together).
static double decode_rate(const lks_spec_stats *st) {
  double t = st->t_spec + st->t_plain;
  return t > 0 ? (double)(st->tok_spec + st->tok_plain) / t : 0;
}

// Speculation, measured in one loop so that a shared machine's slow stretches move every
// figure alike: each repeat decodes n_dec tokens after the prompt without speculation (a new
// scheduler), with proposer `spec` under the levers given (the adaptive policy unless the gate is
// off) through one scheduler as a server's requests are (its first run meets a new policy: cold;
// the later ones the policy the earlier runs left: warm), and with K = 1..k_max drafts every
// step, the gate off (a new scheduler each: the roofline). The plain run and the policy's go
// back to back, which first alternating by repeat, so that their ratio (the figure held to
// x0.97) spans the least of a shared machine's drift; that pair and each K's run go in turn,
// each repeat starting one later in the list (repeat r: item r mod (1 + k_max) first), so that
// a machine slowing down or speeding up across a repeat favours none of them. Every
// ratio is taken within its repeat and the medians are over the warm repeats (all of them when
// there is only one), never against a run minutes away. The achieved fraction
// is also per repeat, the policy's rate over the best K's (the one with the best median) in the
// same repeat, so that the plain run's own noise is not in it: on this project's 2-core host
// two plain runs in a row differ by x0.92-1.09 on the default model.
typedef struct {
  double t_plain, t_spec, rate_plain, rate_spec, ratio, ratio_cold;
  double ratio_lo, ratio_hi;  // the least and most of the warm repeats' ratios
  double ci_lo, ci_hi, ci;    // an interval of the median ratio, and its confidence
  int n_warm;
  double t_calibrate;  // seconds lks_sched_calibrate took before the first run
  // The roofline per K (index K - 1): a verify step's and one draft's cost over the repeat's
  // plain step, E[tokens/step], and the fixed-K decode rate over the repeat's plain rate.
  double verify[LKS_MAX_DRAFTS], draft[LKS_MAX_DRAFTS], e[LKS_MAX_DRAFTS], roof[LKS_MAX_DRAFTS];
  double roof_best;           // the best median roofline (1: plain decoding, when no K beats it)
  int k_best;                 // its K (0: plain decoding)
  double frac, frac_cold;     // the achieved fraction, warm median and cold repeat's
  int k_max;
} spec_medians;

// Medians over r = w0..reps-1 of v[r * stride + j].
static double median_at(const double *v, int w0, int reps, int stride, int j) {
  double t[64];
  int n = 0;
  for (int r = w0; r < reps && n < 64; r++) t[n++] = v[(size_t)r * stride + j];
  return lks_median(t, n);
}

// An interval of the median of n values that holds it with probability *conf >= 0.95 whatever
// their distribution (order statistics): v sorted, [v[r - 1], v[n - r]] for the largest r with
// P(Binomial(n, 1/2) < r) <= 0.025; with n < 6 no r does, and it is [least, most] at 1 - 2^(1-n).
static void median_interval(double *v, int n, double *lo, double *hi, double *conf) {
  qsort(v, (size_t)n, sizeof *v, lks__cmp_double);
  double pk = ldexp(1.0, -n), tail = pk;  // P(B = k), P(B < r) = P(B <= k), with r = k + 1
  int r = 1;
  for (int k = 1; k < n && tail + pk * (n - k + 1) / k <= 0.025; k++) {
    pk *= (double)(n - k + 1) / k;
    tail += pk;
    r = k + 1;
  }
  *lo = v[r - 1];
  *hi = v[n - r];
  *conf = 1 - 2 * tail;
}

// " K: share%" of the decode rows at each K of a run (digits after the point), and a newline.
static void print_k_rows(const lks_spec_stats *st, int digits) {
  uint64_t rows = 0;
  for (int i = 0; i <= st->k_max; i++) rows += st->k_rows[i];
  for (int i = 0; i <= st->k_max; i++)
    printf(" %d: %.*f%%", i, digits, rows ? 100.0 * (double)st->k_rows[i] / (double)rows : 0.0);
  printf("\n");
}

static int bench_spec(lks_world *w, const lks_sched_opts *so, const char *spec,
                      const int32_t *tok, int n_pre, int n_dec, int reps, spec_medians *md,
                      lks_spec_stats *sst, lks_spec_stats *cold) {
  if (reps > 64) reps = 64;
  int k_max = so->n_drafts < LKS_MAX_DRAFTS ? so->n_drafts : LKS_MAX_DRAFTS;
  // Per repeat: the plain and speculative times, rates and their ratio, then 4 figures per K.
  enum { F = 5 + 4 * LKS_MAX_DRAFTS };
  double *v = calloc((size_t)reps * F, sizeof *v);
  int rc = v ? 0 : lks_set_error(LKS_ENOMEM, "out of memory");
  lks_sched_opts plain = *so, sp = *so, fixed = *so;
  snprintf(plain.spec, sizeof plain.spec, "off");
  snprintf(sp.spec, sizeof sp.spec, "%s", spec);
  snprintf(fixed.spec, sizeof fixed.spec, "%s", spec);
  fixed.gate = false;
  lks_sched *srv = rc == 0 ? lks_sched_new(w, NULL, &sp) : NULL;
  if (rc == 0 && !srv) rc = -1;
  double t_cal = 0;
  if (rc == 0) rc = lks_sched_calibrate(srv, &t_cal);  // as serve does before its port opens
  int n_units = 1 + k_max;
  for (int r = 0; rc == 0 && r < reps; r++) {
    double *x = v + (size_t)r * F;
    bench_clock bc = {.w = w};
    lks_spec_stats pst = {0}, kst[LKS_MAX_DRAFTS] = {{0}};
    // Runs: 0 plain, 1 the policy, 1 + K fixed K. The plain run and the policy's go back to
    // back (the policy first in odd repeats), then each K's, this list rotated by r.
    int order[2 + LKS_MAX_DRAFTS], n_order = 0;
    for (int i = 0; i < n_units; i++) {
      int u = (i + r) % n_units;
      if (u == 0) {
        order[n_order++] = r & 1;
        order[n_order++] = !(r & 1);
      } else {
        order[n_order++] = 1 + u;
      }
    }
    for (int i = 0; rc == 0 && i < n_order; i++) {
      int run = order[i];
      double t0 = lks_now();
      if (run == 0) {
        rc = bench_run(w, &plain, tok, n_pre, n_dec, &bc, &pst);
        x[0] = lks_now() - t0;
      } else if (run == 1) {
        rc = bench_run_in(w, srv, tok, n_pre, n_dec, &bc, sst);
        x[1] = lks_now() - t0;
        if (r == 0) *cold = *sst;
      } else {
        fixed.n_drafts = run - 1;
        rc = bench_run(w, &fixed, tok, n_pre, n_dec, &bc, &kst[run - 2]);
      }
    }
    if (rc < 0) break;
    x[2] = decode_rate(&pst);
    x[3] = decode_rate(sst);
    x[4] = x[2] > 0 ? x[3] / x[2] : 0;
    double t_step = pst.plain_steps ? pst.t_plain / (double)pst.plain_steps : 0;
    for (int k = 1; k <= k_max; k++) {
      const lks_spec_stats *ks = &kst[k - 1];
      if (!ks->spec_steps) continue;
      // accepted[i] counts the rounds whose drafts up to i were all accepted, of proposed[i]
      // that drafted i: each ratio is already the product of the conditional rates, and E their
      // sum.
      double steps = (double)ks->spec_steps, prop = ks->t_propose / steps, e = 1;
      for (int i = 0; i < k; i++)
        e += ks->proposed[i] ? (double)ks->accepted[i] / (double)ks->proposed[i] : 0;
      double *y = x + 5 + 4 * (k - 1);
      y[0] = t_step > 0 ? (ks->t_spec / steps - prop) / t_step : 0;
      y[1] = t_step > 0 ? prop / k / t_step : 0;
      y[2] = e;
      y[3] = x[2] > 0 ? decode_rate(ks) / x[2] : 0;
    }
  }
  lks_sched_free(srv);
  int w0 = reps > 1 ? 1 : 0;
  if (rc == 0) {
    *md = (spec_medians){.t_plain = median_at(v, w0, reps, F, 0),
                         .t_spec = median_at(v, w0, reps, F, 1),
                         .rate_plain = median_at(v, w0, reps, F, 2),
                         .rate_spec = median_at(v, w0, reps, F, 3),
                         .ratio = median_at(v, w0, reps, F, 4),
                         .ratio_cold = v[4],
                         .n_warm = reps - w0,
                         .t_calibrate = t_cal,
                         .roof_best = 1,
                         .k_max = k_max};
    double q[64];  // the warm repeats' ratios, sorted by median_interval
    int nq = 0;
    for (int r = w0; r < reps; r++) q[nq++] = v[(size_t)r * F + 4];
    median_interval(q, nq, &md->ci_lo, &md->ci_hi, &md->ci);
    md->ratio_lo = q[0];
    md->ratio_hi = q[nq - 1];
    for (int k = 1; k <= k_max; k++) {
      int j = 5 + 4 * (k - 1);
      md->verify[k - 1] = median_at(v, w0, reps, F, j);
      md->draft[k - 1] = median_at(v, w0, reps, F, j + 1);
      md->e[k - 1] = median_at(v, w0, reps, F, j + 2);
      md->roof[k - 1] = median_at(v, w0, reps, F, j + 3);
      if (md->roof[k - 1] > md->roof_best) md->roof_best = md->roof[k - 1], md->k_best = k;
    }
    // The fraction per repeat: the policy's rate over the best K's in the same repeat (plain
    // decoding's when no K beats it), the ratio of their ratios to that repeat's plain rate;
    // the cold one the first repeat's over its best run.
    double fr[64], best_cold = 1;
    for (int r = 0; r < reps; r++) {
      const double *x = v + (size_t)r * F;
      double den = md->k_best ? x[5 + 4 * (md->k_best - 1) + 3] : 1;
      fr[r] = den > 0 ? x[4] / den : 0;
    }
    for (int k = 1; k <= k_max; k++) {
      double roof = v[5 + 4 * (k - 1) + 3];
      best_cold = roof > best_cold ? roof : best_cold;
    }
    md->frac = lks_median(fr + w0, reps - w0);
    md->frac_cold = v[4] / best_cold;
  }
  free(v);
  return rc;
}

// The speculation roofline (bench_spec's fixed-K runs): for K = 1..k_max a speculative step's
// cost next to a plain step's (the drafter's part and the verify's), E[tokens per step] and the
// speedup K gives, E x plain step time / speculative step time, the fixed-K decode rate over the
// plain one's in the same repeat.
static void roofline(const spec_medians *md, const char *spec) {
  printf("speculation roofline (--spec %s, the gate off, each K's run in the repeat of a plain "
         "one; medians of %d):\n", spec, md->n_warm);
  printf("  K  verify/plain  draft/plain  E[tokens/step]  roofline\n");
  for (int k = 1; k <= md->k_max; k++)
    printf("  %d  %12.2f  %11.3f  %14.3f  %8.3f\n", k, md->verify[k - 1], md->draft[k - 1],
           md->e[k - 1], md->roof[k - 1]);
}

int lks_cmd_bench(lks_settings *s) {
  int threads = (int)lks_settings_int(s, "threads");
  if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  // Measured before the world starts: rank 0 issues no commands while it measures, and workers
  // treat a silent coordinator as dead after three heartbeats.
  enum { MAX_LIST = 16 };
  int lens[MAX_LIST], widths[MAX_LIST];
  int n_lens = parse_list(lks_settings_str(s, "prefill-lens"), "prefill-lens", 1,
                          (int)lks_settings_int(s, "max-seq-len"), lens, MAX_LIST);
  int n_widths = parse_list(lks_settings_str(s, "batch"), "batch", 1,
                            (int)lks_settings_int(s, "max-slots"), widths, MAX_LIST);
  if (n_lens < 0 || n_widths < 0) {
    fprintf(stderr, "lockstep bench: %s\n", lks_last_error());
    return 1;
  }
  int slots = 1;
  for (int i = 0; i < n_widths; i++) slots = widths[i] > slots ? widths[i] : slots;
  bool rank0 = !(getenv("OMPI_COMM_WORLD_RANK") && atoi(getenv("OMPI_COMM_WORLD_RANK")) != 0);
  double bw = rank0 ? measure_bandwidth(threads) : 0;
  double mrate = rank0 ? measure_matrix_rate(threads) : 0;
  // The quantized formats' decode products on the CPU (their rows a model has, after loading).
  double qrate[LKS_N_WFMT] = {0};
  const int qfmts[] = {LKS_WFMT_FP8_CHANNEL, LKS_WFMT_FP8_BLOCK, LKS_WFMT_NVFP4};
  for (int i = 0; i < 3 && rank0 && strcmp(lks_settings_str(s, "backend"), "cpu") == 0; i++)
    qrate[qfmts[i]] = measure_quant_rate(threads, qfmts[i]);
  lks_world *w = lks_world_start(s, lks_cli_model_dir(s), slots);
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
  double wcomm_lo = 0, wcomm_hi = 0, wexec = 0;  // the other ranks' (their acks)
  double n_coll = 0;                              // collectives a decode step
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
    bench_clock bc = {.w = w};
    snprintf(so.spec, sizeof so.spec, "off");
    double t0 = lks_now();
    if (bench_run(w, &so, tok, n_pre, n_dec + 1, &bc, NULL) < 0) goto fail;
    tp[r] = bc.t_first - t0;
    td[r] = bc.t_last - bc.t_first;
    ctl += (w->t_control - bc.ctl0) / n_dec / reps;
    exec += (w->t_exec - bc.exec0) / n_dec / reps;
    comm += (w->t_comm - bc.comm0) / n_dec / reps;
    n_coll += (double)(collectives(w) - bc.coll0) / n_dec / reps;
    if (w->ctl) {
      double lo, hi, ex;
      if (lks_ctl_window_times(w->ctl, 10, &lo, &hi, &ex) < 0) goto fail;
      wcomm_lo += lo / n_dec / reps, wcomm_hi += hi / n_dec / reps, wexec += ex / n_dec / reps;
    }
  }
  // This host's memory speed drifts between runs (a shared virtual machine: the same decode read
  // at 0.55-1.25 of a bandwidth measured once before it): where no other rank waits on rank 0,
  // measured again after the decode runs, and the faster of the two is the limit (the fraction
  // never flatters a slow stretch).
  double bw_after = w->world == 1 ? measure_bandwidth(threads) : 0;
  if (bw_after > bw) bw = bw_after;
  // Speculation: the same prompt and length with and without the proposer.
  const char *spec = lks_settings_str(s, "spec");
  lks_spec_stats sst = {0}, cold = {0};
  spec_medians md = {0};
  if (strcmp(spec, "off") != 0 &&
      bench_spec(w, &so, spec, tok, n_pre, n_dec, reps, &md, &sst, &cold) < 0)
    goto fail;
  double t_plain_run = md.t_plain, t_spec_run = md.t_spec;
  double rtt = heartbeat_rtt(w, 200);
  lks_model_stats st;
  lks_model_stats_get(w->model, &st);
  // The products' rates too, measured again now as the bandwidth was, the faster kept: a slow
  // stretch during the first measurement had put an FP8 limit under the decode it bounds.
  for (int i = 0; i < 3 && w->world == 1; i++) {
    double r = qrate[qfmts[i]] > 0 && st.params_per_token_fmt[qfmts[i]] > 0
                   ? measure_quant_rate(threads, qfmts[i])
                   : 0;
    if (r > qrate[qfmts[i]]) qrate[qfmts[i]] = r;
  }
  double pre = lks_median(tp, reps), dec = lks_median(td, reps);
  double dec_tps = n_dec / dec;
  // Average KV bytes read per decode step: positions n_pre .. n_pre + n_dec - 1.
  double kv_bytes = (double)st.kv_bytes_per_pos * (n_pre + (n_dec - 1) / 2.0 + 1);
  double bytes_tok = (double)st.bytes_per_token + kv_bytes;
  printf("model: %s (%.1f M params, %.2f GB of weights on rank 0)\n", lks_cli_model_dir(s),
         st.params_total / 1e6, st.weight_bytes / 1e9);
  // The CPU kernel level too (LKS_SIMD compares them): the one the backend chose.
  const char *be_name = w->be->ops->name;
  bool cpu = strcmp(be_name, "cpu") == 0;
  printf("world: %d rank(s), %d threads each, backend %s%s%s, %d repeats (medians)\n", w->world,
         threads, be_name, cpu ? ", kernels " : "", cpu ? lks__cpu_kernels_best()->name : "", reps);
  printf("prefill: %d tokens in %.3f s = %.1f tokens/s\n", n_pre, pre, n_pre / pre);
  printf("decode:  %d tokens in %.3f s = %.2f tokens/s (%.2f ms/token)\n", n_dec, dec, dec_tps,
         1e3 * dec / n_dec);
  printf("decode step on rank 0: compute %.3f ms, collectives %.3f ms, control plane %.1f us "
         "(send); heartbeat round trip %.1f us\n",
         exec * 1e3, comm * 1e3, ctl * 1e6, rtt * 1e6);
  // A rank's time in a collective is its wait for the last rank to arrive plus the collective's
  // own cost: that cost is about the start-up's all-reduce time with every rank present (the
  // smaller collectives of a step cost less), the rest is waiting for a slower rank.
  if (w->ctl) {
    printf("decode step on the other ranks: compute %.3f ms (the slowest), collectives %.3f-%.3f "
           "ms\n",
           wexec * 1e3, wcomm_lo * 1e3, wcomm_hi * 1e3);
    if (w->allreduce_s > 0) {
      double own = n_coll * w->allreduce_s, own_c = own < comm ? own : comm;
      printf("collectives a decode step: %.1f, an all-reduce of a row %.1f us with every rank "
             "present (measured at start): on rank 0 about %.3f ms of transfers and %.3f ms "
             "waiting for a slower rank (%.1f%% and %.1f%% of a step)\n",
             n_coll, w->allreduce_s * 1e6, own_c * 1e3, (comm - own_c) * 1e3,
             100 * own_c * dec_tps, 100 * (comm - own_c) * dec_tps);
    }
  }
  printf("bytes read per decoded token on rank 0: %.1f MB (weights %.1f MB + KV %.2f MB)\n",
         bytes_tok / 1e6, st.bytes_per_token / 1e6, kv_bytes / 1e6);
  printf("memory bandwidth (measured, %d threads%s): %.2f GB/s\n", threads,
         w->world == 1 ? ", the faster of before and after the decode runs" : "", bw / 1e9);
  printf("achieved: %.2f GB/s = %.2f of measured bandwidth (per rank)\n", bytes_tok * dec_tps / 1e9,
         bw > 0 ? bytes_tok * dec_tps / bw : 0.0);
  // A decode step's quantized products take at least their weights over the product's rate, and
  // the step at least its bytes over the bandwidth: the larger of the two is its limit.
  double t_mem = bw > 0 ? bytes_tok / bw : 0, t_conv = 0;
  for (int i = 0; i < 3; i++) {
    int f = qfmts[i];
    if (!st.bytes_per_token_fmt[f] || qrate[f] <= 0) continue;
    double wq = (double)st.params_per_token_fmt[f];
    t_conv += wq / qrate[f];
    printf("%s decode product (measured, %d threads, weights in cache%s): %.1f G weights/s; "
           "the %.3f M %s weights a decode step reads take %.3f ms at that rate, %.3f ms at the "
           "measured bandwidth\n",
           lks_wfmt_names[f], threads,
           w->world == 1 ? ", the faster of before and after the decode runs" : "",
           qrate[f] / 1e9, wq / 1e6, lks_wfmt_names[f],
           1e3 * wq / qrate[f], bw > 0 ? 1e3 * (double)st.bytes_per_token_fmt[f] / bw : 0.0);
  }
  double t_lim = t_conv > t_mem ? t_conv : t_mem;
  if (t_conv > 0)
    printf("decode limit: %.1f tokens/s, bound by %s; achieved %.2f of it\n", 1 / t_lim,
           t_conv > t_mem ? "the quantized products' rate" : "bandwidth", dec_tps * t_lim);
  // Matrix FLOPs a prompt token costs this rank: 2 per active weight, less the embedding (a
  // lookup) and the lm_head (the last position only), split over the ranks; attention not counted.
  double mm_params =
      (double)st.params_active - (double)c->vocab * c->hidden * (c->tie_embeddings ? 1 : 2);
  double flop_tok = 2.0 * mm_params / w->world;
  printf("BF16 matrix rate (measured, %d threads, operands in cache): %.1f GFLOP/s\n", threads,
         mrate / 1e9);
  printf("prefill %d: %.0f GFLOP/s of matrix products = %.2f of the BF16 matrix rate\n", n_pre,
         flop_tok * n_pre / pre / 1e9, mrate > 0 ? flop_tok * n_pre / pre / mrate : 0.0);
  double pre_rate[MAX_LIST] = {0};
  for (int li = 0; li < n_lens; li++) {
    int L = lens[li];
    int32_t *pt = malloc((size_t)L * sizeof *pt);
    double *tl = malloc((size_t)reps * sizeof *tl);
    if (!pt || !tl) {
      free(pt), free(tl);
      lks_set_error(LKS_ENOMEM, "out of memory");
      goto fail;
    }
    lks_rng_seed(&rng, 2);
    for (int i = 0; i < L; i++) pt[i] = (int32_t)(lks_rng_next(&rng) % (uint64_t)c->vocab);
    lks_sched_opts lo = so;
    lo.chunk = L;
    snprintf(lo.spec, sizeof lo.spec, "off");
    int rr = 0;
    for (int r = 0; r < reps && rr == 0; r++) {
      bench_clock bc = {.w = w};
      double t0 = lks_now();
      rr = bench_run(w, &lo, pt, L, 1, &bc, NULL);
      tl[r] = bc.t_first - t0;
    }
    if (rr == 0) pre_rate[li] = L / lks_median(tl, reps);
    free(pt);
    free(tl);
    if (rr < 0) goto fail;
    printf("prefill %d: %.1f tokens/s, %.2f of the BF16 matrix rate\n", L, pre_rate[li],
           mrate > 0 ? flop_tok * pre_rate[li] / mrate : 0.0);
  }
  double brate[MAX_LIST][2] = {{0}}, bpick[MAX_LIST][2] = {{0}};
  if (n_widths) {
    int bp = n_pre < 32 ? n_pre : 32;
    printf("batched decode (%d sequences at most, a %d-token prompt each, %d tokens each; medians "
           "of %d):\n  width  greedy tok/s  x first  sampled tok/s  pick ms/token greedy, sampled\n",
           widths[n_widths - 1], bp, n_dec, reps);
    for (int bi = 0; bi < n_widths; bi++) {
      for (int smp = 0; smp < 2; smp++) {
        double rv[64], pv[64];
        int nr = reps < 64 ? reps : 64;
        for (int r = 0; r < nr; r++)
          if (bench_batch(w, &so, widths[bi], bp, n_dec, smp, &rv[r], &pv[r]) < 0) goto fail;
        brate[bi][smp] = lks_median(rv, nr);
        bpick[bi][smp] = lks_median(pv, nr);
      }
      printf("  %5d  %12.2f  %7.2f  %13.2f  %.3f, %.3f\n", widths[bi], brate[bi][0],
             brate[0][0] > 0 ? brate[bi][0] / brate[0][0] : 0.0, brate[bi][1],
             bpick[bi][0] * 1e3, bpick[bi][1] * 1e3);
    }
  }
  printf("summary: decode %.2f tok/s = %.2f of bandwidth", dec_tps,
         bw > 0 ? bytes_tok * dec_tps / bw : 0.0);
  if (t_conv > 0)
    printf(", %.2f of the limit (%s-bound)", dec_tps * t_lim,
           t_conv > t_mem ? "compute" : "memory");
  printf("; prefill %d: %.1f tok/s = %.2f of the BF16 matrix rate", n_pre, n_pre / pre,
         mrate > 0 ? flop_tok * n_pre / pre / mrate : 0.0);
  for (int li = 0; li < n_lens; li++)
    printf("; prefill %d: %.1f tok/s = %.2f", lens[li], pre_rate[li],
           mrate > 0 ? flop_tok * pre_rate[li] / mrate : 0.0);
  for (int bi = 0; bi < n_widths; bi++)
    printf("; batch %d: %.1f tok/s greedy, %.1f sampled", widths[bi], brate[bi][0], brate[bi][1]);
  printf("\n");
  if (t_spec_run > 0) {
    roofline(&md, spec);
    // The run under the levers given (the adaptive policy unless --spec-gate false) against the
    // roofline's best K (plain decoding, x1, when no K pays).
    printf("%s: decode %.2f tokens/s vs %.2f plain (x%.3f, median of %d warm runs' ratios, "
           "x%.3f-%.3f; the median within x%.3f-%.3f at %.0f %%; the cold first run x%.3f, after "
           "%.2f s measuring step costs at start); roofline: x%.3f at K=%d; achieved fraction "
           "%.3f (cold %.3f; per repeat, over that repeat's K=%d run); K per decode row (last "
           "run):",
           so.gate ? "policy" : "fixed K", md.rate_spec, md.rate_plain, md.ratio, md.n_warm,
           md.ratio_lo, md.ratio_hi, md.ci_lo, md.ci_hi, 100 * md.ci, md.ratio_cold,
           md.t_calibrate, md.roof_best, md.k_best, md.frac, md.frac_cold, md.k_best);
    print_k_rows(&sst, 0);
    // The cold first run: what the policy explored before it knew the drafter.
    printf("%s, cold first run: %llu rounds, first-draft acceptance %.3f; K per decode row:",
           so.gate ? "policy" : "fixed K", (unsigned long long)cold.rounds,
           cold.proposed[0] ? (double)cold.accepted[0] / (double)cold.proposed[0] : 0.0);
    print_k_rows(&cold, 1);
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
