// SPDX-License-Identifier: MIT
// Speculative decoding end to end, on every rank of the world it is started in (mpirun or not).
//
// usage: [mpirun -np N] test_spec MODEL_DIR PROMPTS OUT.json [N_GEN] [LEAK_SEQS] [MAX_LEN]
//
// Every run goes through the scheduler, the decoding loop that `serve`, `generate` and `bench`
// run. For every prompt (one per line, comma-separated ids): greedy decoding without speculation,
// with the MTP drafter for K = 1, 2, 3, 4, and with n-gram lookup (K = 3), the gate off so that
// every round speculates, then with the adaptive policy and with forced plain stretches (the
// drafter's lazy catch-up), greedy and sampling. The tokens of every mode must equal those
// without speculation. The lazy catch-up leaves the drafts and the drafter's KV rows exactly
// those of a drafter that catches up at every plain step (catchup_test). The
// per-position proposed/accepted counts of each prompt and K go to OUT.json, for comparison with
// the independent reference (tests/reference/spec_ref.py) and between world sizes. With
// LEAK_SEQS, that many sequences are then allocated, decoded speculatively and freed, and every
// KV block of both caches must be free again (run under LeakSanitizer for the memory). MAX_LEN:
// the world's --max-seq-len (256); from 1100 a plain stretch also passes the drafter's backlog
// cap (LKS_MTP_BACKLOG rows kept), with the same check as the lazy catch-up's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "coordinator/scheduler.h"
#include "coordinator/submit.h"
#include "core/error.h"
#include "proto/command.h"
#include "worker/worker.h"

typedef struct {
  int32_t *tok;
  int n;
} sink;

// When w is set (the catch-up test): at the n_gen-th token of slot 0, the drafter's KV rows
// (rank 0's shard) of every position all modes have paired by then, into rows.
static struct {
  lks_world *w;
  int n_gen;
  float *rows;
  size_t n;
} kvsnap;

static void collect(void *ctx, int32_t tok, bool eos) {
  (void)eos;
  sink *s = ctx;
  s->tok[s->n++] = tok;
  if (!kvsnap.w || s->n != kvsnap.n_gen) return;
  const lks_engine *e = kvsnap.w->engine;
  size_t d = lks_engine_kv_row_floats(e, true);
  int len = lks_engine_slot_len(e, 0) - 8;  // rows every mode has paired by then
  kvsnap.n = 0;
  for (int p = 0; p < len; p++)
    if (lks_engine_kv_read(e, 0, true, p, kvsnap.rows + kvsnap.n) == 0) kvsnap.n += d;
}

static int failures;

// One prompt through the scheduler (the decoding loop `serve` runs), with proposer `spec` ("off",
// "mtp", "ngram") drafting up to k tokens, the gate off so that every round speculates.
// Drops what the prefix cache keeps, on every rank.
static int clear_cache(lks_world *w) {
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE;
  return lks_world_submit(w, &cmd, NULL);
}

static float temperature;  // 0: greedy; else sampling, seed 7, top-p 0.9

// The adaptive policy on (the gate); K forced by a pattern instead; the drafter's backlog limit
// (0: the default); every verify's drafts recorded into `log` (when set).
static bool policy;
static int (*force)(void *ctx, int slot, int n_generated);
static int backlog;
typedef struct {
  int32_t tok[4096];
  int n;
} draft_log;
static draft_log *log_to;

static void log_drafts(void *ctx, int slot, int n_generated, const int32_t *d, int nd) {
  (void)ctx, (void)slot;
  if (!log_to) return;
  // Position marker, then the drafts.
  if (log_to->n + nd + 2 <= (int)(sizeof log_to->tok / sizeof *log_to->tok)) {
    log_to->tok[log_to->n++] = -1 - n_generated;
    for (int j = 0; j < nd; j++) log_to->tok[log_to->n++] = d[j];
  }
}

// A scheduler with proposer `spec` drafting up to k tokens, under the switches above.
static lks_sched *new_sched(lks_world *w, const char *spec, int k) {
  lks_sched_opts o;
  lks_sched_opts_from(w->settings, &o);
  snprintf(o.spec, sizeof o.spec, "%s", spec);
  o.n_drafts = k;
  o.gate = policy;
  o.force_k = force;
  o.on_drafts = log_drafts;
  o.mtp_backlog = backlog;
  return lks_sched_new(w, NULL, &o);
}

// The prompt's n_gen tokens through sched into out (sampling at `temperature`, seed 7).
static int run_in(lks_sched *sched, const int32_t *prompt, int n, int n_gen, sink *out) {
  lks_req_params p = {0};
  p.prompt = malloc((size_t)n * sizeof *prompt);
  if (!p.prompt) return -1;
  memcpy(p.prompt, prompt, (size_t)n * sizeof *prompt);
  p.n_prompt = n;
  p.max_tokens = n_gen;
  p.ignore_eos = true;
  p.sampling = (lks_sampling){temperature, 0, temperature > 0 ? 0.9f : 1.0f};
  p.seed = 7;
  p.on_token = collect;
  p.on_token_ctx = out;
  out->n = 0;
  return lks_sched_run_one(sched, &p);
}

static int run(lks_world *w, const char *spec, int k, const int32_t *prompt, int n, int n_gen,
               sink *out, lks_spec_stats *st) {
  lks_sched *sched = new_sched(w, spec, k);
  if (!sched) return -1;
  int rc = run_in(sched, prompt, n, n_gen, out);
  lks_sched_stats ss;
  lks_sched_stats_get(sched, &ss);
  *st = ss.spec;
  lks_sched_free(sched);
  return rc;
}

static bool same(const sink *a, const sink *b) {
  return a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
}

// Plain stretches of several steps between rounds of 1..3 drafts.
static int stretches(void *ctx, int slot, int n_generated) {
  (void)ctx, (void)slot;
  int phase = n_generated % 23;
  return phase < 9 ? 0 : 1 + phase % 3;
}

// One prompt: plain, mtp K = 1..4 and ngram greedy (the counts to out), then sampling with and
// without speculation. 0, or -1 when a run failed.
static int check_prompt(lks_world *w, const char *line, const int32_t *prompt, int n, int n_gen,
                        int index, FILE *out, sink *base, sink *got) {
  lks_spec_stats st;
  if (run(w, "off", 0, prompt, n, n_gen, base, &st) < 0) return -1;
  fprintf(out, "%s\n {\"prompt\": \"%s\", \"tokens\": [", index ? "," : "", line);
  for (int i = 0; i < base->n; i++) fprintf(out, "%s%d", i ? ", " : "", base->tok[i]);
  fprintf(out, "], \"mtp\": {");
  for (int k = 1; k <= 4; k++) {
    if (run(w, "mtp", k, prompt, n, n_gen, got, &st) < 0) return -1;
    if (!same(got, base)) {
      printf("FAIL: prompt %d, mtp K=%d: tokens differ from decoding without speculation\n", index, k);
      failures++;
    }
    fprintf(out, "%s\"%d\": {\"proposed\": [", k > 1 ? ", " : "", k);
    for (int i = 0; i < k; i++) fprintf(out, "%s%llu", i ? ", " : "", (unsigned long long)st.proposed[i]);
    fprintf(out, "], \"accepted\": [");
    for (int i = 0; i < k; i++) fprintf(out, "%s%llu", i ? ", " : "", (unsigned long long)st.accepted[i]);
    fprintf(out, "], \"rounds\": %llu}", (unsigned long long)st.rounds);
  }
  if (run(w, "ngram", 3, prompt, n, n_gen, got, &st) < 0) return -1;
  if (!same(got, base)) {
    printf("FAIL: prompt %d, ngram: tokens differ from decoding without speculation\n", index);
    failures++;
  }
  fprintf(out, "}, \"ngram_accepted\": %llu}", (unsigned long long)(st.accepted[0] + st.accepted[1] + st.accepted[2]));
  // Sampling (temperature 0.8, top-p 0.9, one seed): the same tokens with and without
  // speculation, since each token is drawn from a generator seeded by its index alone.
  temperature = 0.8f;
  int rc = run(w, "off", 0, prompt, n, n_gen, base, &st);
  for (int k = 1; rc == 0 && k <= 4; k += 3) {
    rc = run(w, "mtp", k, prompt, n, n_gen, got, &st);
    if (rc == 0 && !same(got, base)) {
      printf("FAIL: prompt %d, sampling, mtp K=%d: tokens differ from sampling without "
             "speculation\n", index, k);
      failures++;
    }
  }
  temperature = 0;
  if (rc < 0) return rc;
  // The adaptive policy (K per sequence from measured costs and acceptance, lazy catch-up), and
  // a forced pattern of plain stretches and drafts: tokens equal decoding without speculation,
  // greedy and sampling.
  for (int t = 0; rc == 0 && t < 2; t++) {
    temperature = t ? 0.8f : 0.0f;
    rc = run(w, "off", 0, prompt, n, n_gen, base, &st);
    for (int mode = 0; rc == 0 && mode < 2; mode++) {
      policy = mode == 0;
      force = mode == 1 ? stretches : NULL;
      rc = run(w, "mtp", 3, prompt, n, n_gen, got, &st);
      policy = false;
      force = NULL;
      if (rc == 0 && !same(got, base)) {
        printf("FAIL: prompt %d, %s, mtp %s: tokens differ from decoding without speculation\n",
               index, t ? "sampling" : "greedy", mode ? "plain stretches" : "with the policy");
        failures++;
      }
    }
  }
  temperature = 0;
  return rc;
}

// The lazy catch-up: with plain stretches (up to 76 steps) between drafting rounds, the drafts
// of every verify, the tokens and the drafter's KV rows (rank 0's shard, read at the last token)
// are the same whether the drafter catches up after every plain step (backlog 1, the drafter
// always on), when 8 positions wait, or only when the sequence drafts again.
static int catchup_k(void *ctx, int slot, int n_generated) {
  (void)ctx, (void)slot;
  if (n_generated < 100) return n_generated < 3 || (n_generated > 20 && n_generated < 24) ? 2 : 0;
  return n_generated % 10 < 4 ? 0 : 3;
}

// The backlog's cap: a plain stretch 20 steps longer than LKS_MTP_BACKLOG, so that the lazy
// drafter catches up once with every kept row of the engine's buffer (its last row included),
// then 20 rows later when the sequence drafts again.
enum { CAP_PLAIN_END = 3 + LKS_MTP_BACKLOG + 20, CAP_GEN = CAP_PLAIN_END + 24 };
static int cap_k(void *ctx, int slot, int n_generated) {
  (void)ctx, (void)slot;
  return n_generated < 3 ? 2 : n_generated < CAP_PLAIN_END ? 0 : 3;
}

// n_gen tokens of the prompt with K from `pattern`, once per backlog limit of `limits` (0: the
// default, LKS_MTP_BACKLOG); drafts, tokens and drafter KV rows must equal the first limit's.
static void catchup_test(lks_world *w, const int32_t *prompt, int n, int n_gen,
                         int (*pattern)(void *, int, int), const int *limits, int n_lim,
                         const char *what) {
  enum { MODES = 3 };
  static draft_log logs[MODES];
  sink out[MODES] = {{0}};
  float *rows[MODES] = {0};
  size_t nrows[MODES] = {0};
  size_t d = lks_engine_kv_row_floats(w->engine, true);
  int rc = n_lim <= MODES ? 0 : -1;
  policy = false;
  temperature = 0;
  for (int m = 0; m < n_lim && rc == 0; m++) {
    out[m] = (sink){malloc((size_t)n_gen * sizeof(int32_t)), 0};
    rows[m] = malloc((size_t)(n + n_gen) * d * sizeof(float));
    logs[m].n = 0;
    log_to = &logs[m];
    force = pattern;
    backlog = limits[m];
    kvsnap = (typeof(kvsnap)){w, n_gen, rows[m], 0};
    lks_spec_stats st;
    if (!out[m].tok || !rows[m] || clear_cache(w) < 0) rc = -1;
    if (rc == 0) rc = run(w, "mtp", 3, prompt, n, n_gen, &out[m], &st);
    nrows[m] = kvsnap.n;
  }
  kvsnap.w = NULL;
  log_to = NULL;
  force = NULL;
  backlog = 0;
  bool ok = rc == 0;
  for (int m = 1; ok && m < n_lim; m++) {
    ok &= same(&out[m], &out[0]);
    ok &= logs[m].n == logs[0].n && !memcmp(logs[m].tok, logs[0].tok, (size_t)logs[0].n * sizeof(int32_t));
    ok &= nrows[m] == nrows[0] && nrows[0] > 0 &&
          !memcmp(rows[m], rows[0], nrows[0] * sizeof(float));
  }
  int verifies = 0;
  for (int i = 0; i < logs[0].n; i++) verifies += logs[0].tok[i] < 0;
  printf("lazy catch-up, %s: %d verifies; drafts, tokens and %zu drafter KV rows: %s%s%s\n", what,
         verifies, d ? nrows[0] / d : 0, ok ? "identical" : "FAIL", rc < 0 ? ": " : "",
         rc < 0 ? lks_last_error() : "");
  failures += !ok;
  for (int m = 0; m < MODES; m++) {
    free(out[m].tok);
    free(rows[m]);
  }
}

// The policy's costs measured before any request (lks_sched_calibrate, as serve and bench run
// it): every cost up to K = 3 measured; nothing served shows (no request, token or round counted)
// and every KV block of both caches is free again; then the prompt's tokens with the policy
// equal those without speculation.
static int calibrate_test(lks_world *w, const int32_t *prompt, int n, int n_gen, sink *base,
                          sink *got) {
  lks_spec_stats st;
  policy = false;
  temperature = 0;
  if (run(w, "off", 0, prompt, n, n_gen, base, &st) < 0 || clear_cache(w) < 0) return -1;
  int t0, d0, t1, d1;
  lks_engine_free_blocks(w->engine, &t0, &d0);
  policy = true;
  lks_sched *sched = new_sched(w, "mtp", 3);
  policy = false;
  if (!sched) return -1;
  bool before = lks_sched_costs_measured(sched);
  double secs = 0;
  int rc = lks_sched_calibrate(sched, &secs);
  bool measured = lks_sched_costs_measured(sched);
  lks_sched_stats ss;
  lks_sched_stats_get(sched, &ss);
  bool quiet = ss.requests_done == 0 && ss.requests_cancelled == 0 && ss.generated_tokens == 0 &&
               ss.prompt_tokens == 0 && ss.spec.rounds == 0 && ss.spec.plain_steps == 0;
  lks_engine_free_blocks(w->engine, &t1, &d1);
  bool freed = t0 == t1 && d0 == d1;
  if (rc == 0) rc = run_in(sched, prompt, n, n_gen, got);
  lks_sched_free(sched);
  bool ok = rc == 0 && !before && measured && quiet && freed && same(got, base);
  printf("calibration (%.3f s): costs measured %s, statistics untouched %s, KV blocks free %d/%d "
         "(target), %d/%d (drafter), tokens with the policy after it %s: %s\n",
         secs, measured && !before ? "yes" : "no", quiet ? "yes" : "no", t1, t0, d1, d0,
         same(got, base) ? "identical" : "DIFFER", ok ? "ok" : "FAIL");
  failures += !ok;
  return rc;
}

// LEAK_SEQS sequences decoded speculatively and freed: every KV block of both caches free again
// (after the prefix cache lets go of what it keeps).
static int leak_test(lks_world *w, int leak, int vocab, sink *got) {
  int t0, d0, t1, d1;
  if (clear_cache(w) < 0) return -1;
  lks_engine_free_blocks(w->engine, &t0, &d0);
  int32_t prompt[12];
  for (int i = 0; i < leak; i++) {
    for (int j = 0; j < 12; j++) prompt[j] = (int32_t)((i * 7 + j * 13) % vocab);
    lks_spec_stats st;
    if (run(w, i % 2 ? "mtp" : "ngram", 1 + i % 4, prompt, 12, 8, got, &st) < 0) return -1;
  }
  if (clear_cache(w) < 0) return -1;
  lks_engine_free_blocks(w->engine, &t1, &d1);
  bool ok = t0 == t1 && d0 == d1;
  printf("%d sequences decoded speculatively and freed: KV blocks free %d/%d (target), %d/%d "
         "(drafter) %s\n", leak, t1, t0, d1, d0, ok ? "ok" : "FAIL");
  failures += !ok;
  return 0;
}

// The end-of-context test: slot 0 (the long sequence, admitted first) drafts 1, the others 4.
static int edge_k(void *ctx, int slot, int n_generated) {
  (void)ctx, (void)n_generated;
  return slot == 0 ? 1 : 4;
}

// Each token of a sequence with the step that emitted it.
typedef struct {
  int32_t tok[128];
  int step[128], n, *now;
} edge_sink;

static void edge_collect(void *ctx, int32_t tok, bool eos) {
  (void)eos;
  edge_sink *e = ctx;
  if (e->n < 128) {
    e->tok[e->n] = tok;
    e->step[e->n++] = *e->now;
  }
}

// The end of the context: a sequence within 3 positions of --max-seq-len (max_len) decodes beside
// one that drafts 4, with proposer `spec`. A propose at the batch's count of 4 would pass the
// longest sequence for it, and the world would fail (it did: serve_fuzz_w1_mtp). The long one
// drafts 1 (slot 0), so it steps 1 or 2 positions at a time and meets the last 3 positions in a
// step in which the short one still drafts. Each sequence's tokens must be those of plain
// decoding alone, and that step must have happened (else the test proves nothing).
static int edge_test(lks_world *w, const char *spec, int max_len, int vocab) {
  enum { N_LONG_GEN = 12, N_SHORT = 4, N_SHORT_GEN = 96 };
  int n_long = max_len - N_LONG_GEN, now = 0;
  int32_t *lp = malloc((size_t)n_long * sizeof *lp), sp[N_SHORT] = {5, 6, 7, 8};
  int32_t *want = malloc((N_LONG_GEN + N_SHORT_GEN) * sizeof *want);
  sink alone = {malloc(N_SHORT_GEN * sizeof(int32_t)), 0};
  if (!lp || !want || !alone.tok) {
    free(lp);
    free(want);
    free(alone.tok);
    return -1;
  }
  for (int j = 0; j < n_long; j++) lp[j] = (int32_t)((j * 31 + 3) % vocab);
  lks_spec_stats st;
  int rc = run(w, "off", 0, lp, n_long, N_LONG_GEN, &alone, &st);
  memcpy(want, alone.tok, N_LONG_GEN * sizeof *want);
  if (rc == 0) rc = run(w, "off", 0, sp, N_SHORT, N_SHORT_GEN, &alone, &st);
  memcpy(want + N_LONG_GEN, alone.tok, N_SHORT_GEN * sizeof *want);
  force = edge_k;
  lks_sched *sched = rc == 0 ? new_sched(w, spec, 4) : NULL;
  force = NULL;
  edge_sink have[2] = {{.now = &now}, {.now = &now}};
  lks_req *req[2] = {NULL, NULL};
  for (int i = 0; sched && i < 2; i++) {
    lks_req_params p = {0};
    p.n_prompt = i ? N_SHORT : n_long;
    p.prompt = malloc((size_t)p.n_prompt * sizeof *p.prompt);
    if (!p.prompt) break;
    memcpy(p.prompt, i ? sp : lp, (size_t)p.n_prompt * sizeof *p.prompt);
    p.max_tokens = i ? N_SHORT_GEN : N_LONG_GEN;
    p.ignore_eos = true;
    p.sampling = (lks_sampling){0, 0, 1.0f};
    p.on_token = edge_collect;
    p.on_token_ctx = &have[i];
    int err;
    req[i] = lks_sched_submit(sched, &p, &err);
  }
  if (!sched || !req[0] || !req[1]) rc = -1;
  while (rc == 0 && !(lks_req_finished(req[0]) && lks_req_finished(req[1])) && now < 1000) {
    now++;
    rc = lks_sched_step(sched) < 0 ? -1 : 0;
  }
  if (rc == 0) rc = lks_sched_step(sched) < 0 ? -1 : 0;  // frees the slots on every rank
  // The step that emitted the long one's 11th or 12th token started within 3 positions of the
  // end (10 or 11 emitted: room 2 or 1 for verify rows), and the short one was still going.
  bool met = false;
  for (int j = N_LONG_GEN - 2; j < have[0].n && j < N_LONG_GEN; j++)
    for (int t = 0; t < have[1].n; t++) met |= have[1].step[t] == have[0].step[j];
  bool ok = rc == 0 && met && have[0].n == N_LONG_GEN && have[1].n == N_SHORT_GEN &&
            !memcmp(have[0].tok, want, N_LONG_GEN * sizeof *want) &&
            !memcmp(have[1].tok, want + N_LONG_GEN, N_SHORT_GEN * sizeof *want);
  printf("end of the context, %s: a sequence within 3 positions of --max-seq-len beside one that "
         "drafts 4 (%s): %s%s%s\n", spec, met ? "met" : "NOT met", ok ? "ok" : "FAIL",
         rc < 0 ? ": " : "", rc < 0 ? lks_last_error() : "");
  failures += !ok;
  for (int i = 0; i < 2; i++)
    if (req[i]) lks_req_release(req[i]);
  if (sched) lks_sched_free(sched);
  free(alone.tok);
  free(want);
  free(lp);
  return 0;
}

// Levers: set on every rank at the same step; a propose beyond them is refused (by rank 0 before
// it is sent, and by every worker), one within them runs.
static int levers_test(lks_world *w, sink *got) {
  Lockstep__Levers lv = LOCKSTEP__LEVERS__INIT;
  lv.n_drafts = 2;
  lv.speculation = true;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_LEVERS;
  cmd.levers = &lv;
  if (lks_world_submit(w, &cmd, NULL) < 0) return -1;
  int32_t prompt[4] = {1, 2, 3, 4};
  lks_spec_stats st;
  bool refused = run(w, "mtp", 3, prompt, 4, 8, got, &st) < 0 &&
                 strstr(lks_last_error(), "the levers allow 2") != NULL;
  bool allowed = run(w, "mtp", 2, prompt, 4, 8, got, &st) == 0;
  printf("levers: 3 drafts refused (%s), 2 drafts run (%s)\n", refused ? "ok" : "FAIL",
         allowed ? "ok" : "FAIL");
  failures += !refused + !allowed;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s MODEL_DIR PROMPTS OUT.json [N_GEN] [LEAK_SEQS] [MAX_LEN]\n",
            argv[0]);
    return 2;
  }
  int n_gen = argc > 4 ? atoi(argv[4]) : 64, leak = argc > 5 ? atoi(argv[5]) : 0;
  const char *max_len = argc > 6 ? argv[6] : "256";  // the world's --max-seq-len
  lks_settings *s = lks_settings_new();
  if (!s || lks_settings_set(s, "model", argv[1], "test") < 0 ||
      lks_settings_set(s, "max-seq-len", max_len, "test") < 0 ||
      lks_settings_set(s, "threads", "1", "test") < 0) {
    fprintf(stderr, "settings: %s\n", lks_last_error());
    return 2;
  }
  lks_world *w = lks_world_start(s, argv[1], 2);  // two slots: the end-of-context test
  if (!w) {
    fprintf(stderr, "world: %s\n", lks_last_error());
    lks_mpi_abort(1);
  }
  if (w->rank != 0) {
    int rc = lks_cli_worker(w);
    lks_settings_free(s);
    lks_mpi_finalize();
    return rc;
  }
  FILE *in = fopen(argv[2], "r"), *out = fopen(argv[3], "w");
  if (!in || !out) {
    perror("prompts / output");
    lks_mpi_abort(2);
  }
  int vocab = lks_model_config(w->model)->vocab;
  char line[8192];
  int n_prompts = 0;
  fprintf(out, "{\"world\": %d, \"n_gen\": %d, \"prompts\": [", w->world, n_gen);
  sink base = {malloc((size_t)n_gen * sizeof(int32_t)), 0}, got = {malloc((size_t)n_gen * sizeof(int32_t)), 0};
  while (fgets(line, sizeof line, in)) {
    line[strcspn(line, "\r\n")] = '\0';
    if (!*line) continue;
    int32_t *prompt;
    int n;
    if (lks_cli_parse_ids(line, vocab, &prompt, &n) < 0) {
      fprintf(stderr, "prompt %d: %s\n", n_prompts, lks_last_error());
      lks_mpi_abort(2);
    }
    if (check_prompt(w, line, prompt, n, n_gen, n_prompts, out, &base, &got) < 0) goto fail;
    free(prompt);
    n_prompts++;
  }
  fprintf(out, "\n]}\n");
  fclose(out);
  fclose(in);
  printf("%d prompts x (mtp K=1..4, ngram) at world %d: %s\n", n_prompts, w->world,
         failures ? "tokens DIFFER" : "tokens identical to decoding without speculation");
  int32_t cprompt[12];
  for (int j = 0; j < 12; j++) cprompt[j] = (int32_t)((j * 37 + 5) % vocab);
  const int limits[3] = {1, 8, 0}, cap_limits[2] = {1, 0};
  catchup_test(w, cprompt, 12, 130, catchup_k, limits, 3, "plain stretches up to 76 steps, "
               "catch-up every step, every 8, and lazily");
  // The cap, where the world is long enough for it.
  if (atoi(max_len) >= 12 + CAP_GEN)
    catchup_test(w, cprompt, 12, CAP_GEN, cap_k, cap_limits, 2, "a plain stretch past the "
                 "backlog's cap, catch-up every step and lazily");
  if (calibrate_test(w, cprompt, 12, n_gen, &base, &got) < 0) goto fail;
  if (leak > 0 && leak_test(w, leak, vocab, &got) < 0) goto fail;
  if (edge_test(w, "mtp", atoi(max_len), vocab) < 0) goto fail;
  if (levers_test(w, &got) < 0) goto fail;
  free(base.tok);
  free(got.tok);
  lks_world_stop(w);
  lks_settings_free(s);
  lks_mpi_finalize();
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
fail:
  fprintf(stderr, "test_spec: %s\n", lks_last_error());
  lks_mpi_abort(1);
  return 1;
}
