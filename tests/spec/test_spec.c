// SPDX-License-Identifier: MIT
// Speculative decoding end to end, on every rank of the world it is started in (mpirun or not).
//
// usage: [mpirun -np N] test_spec MODEL_DIR PROMPTS OUT.json [N_GEN] [LEAK_SEQS]
//
// Every run goes through the scheduler, the decoding loop that `serve`, `generate` and `bench`
// run. For every prompt (one per line, comma-separated ids): greedy decoding without speculation,
// with the MTP drafter for K = 1, 2, 3, 4, and with n-gram lookup (K = 3), the gate off so that
// every round speculates. The tokens of every mode must equal those without speculation. The
// per-position proposed/accepted counts of each prompt and K go to OUT.json, for comparison with
// the independent reference (tests/reference/spec_ref.py) and between world sizes. With
// LEAK_SEQS, that many sequences are then allocated, decoded speculatively and freed, and every
// KV block of both caches must be free again (run under LeakSanitizer for the memory).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "coordinator/scheduler.h"
#include "coordinator/submit.h"
#include "core/error.h"
#include "worker/worker.h"

typedef struct {
  int32_t *tok;
  int n;
} sink;

static void collect(void *ctx, int32_t tok, bool eos) {
  (void)eos;
  sink *s = ctx;
  s->tok[s->n++] = tok;
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

static int run(lks_world *w, const char *spec, int k, const int32_t *prompt, int n, int n_gen,
               sink *out, lks_spec_stats *st) {
  lks_sched_opts o;
  lks_sched_opts_from(w->settings, &o);
  snprintf(o.spec, sizeof o.spec, "%s", spec);
  o.n_drafts = k;
  o.gate = false;
  lks_sched *sched = lks_sched_new(w, NULL, &o);
  if (!sched) return -1;
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
  int rc = lks_sched_run_one(sched, &p);
  lks_sched_stats ss;
  lks_sched_stats_get(sched, &ss);
  *st = ss.spec;
  lks_sched_free(sched);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s MODEL_DIR PROMPTS OUT.json [N_GEN] [LEAK_SEQS]\n", argv[0]);
    return 2;
  }
  int n_gen = argc > 4 ? atoi(argv[4]) : 64, leak = argc > 5 ? atoi(argv[5]) : 0;
  lks_settings *s = lks_settings_new();
  if (!s || lks_settings_set(s, "model", argv[1], "test") < 0 ||
      lks_settings_set(s, "max-seq-len", "256", "test") < 0 ||
      lks_settings_set(s, "threads", "1", "test") < 0) {
    fprintf(stderr, "settings: %s\n", lks_last_error());
    return 2;
  }
  lks_world *w = lks_world_start(s, argv[1], 1);
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
  const char *mtp = "mtp", *ng = "ngram";
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
    lks_spec_stats st;
    if (run(w, "off", 0, prompt, n, n_gen, &base, &st) < 0) goto fail;
    fprintf(out, "%s\n {\"prompt\": \"%s\", \"tokens\": [", n_prompts ? "," : "", line);
    for (int i = 0; i < base.n; i++) fprintf(out, "%s%d", i ? ", " : "", base.tok[i]);
    fprintf(out, "], \"mtp\": {");
    for (int k = 1; k <= 4; k++) {
      if (run(w, mtp, k, prompt, n, n_gen, &got, &st) < 0) goto fail;
      bool same = got.n == base.n && !memcmp(got.tok, base.tok, (size_t)got.n * sizeof *got.tok);
      if (!same) {
        printf("FAIL: prompt %d, mtp K=%d: tokens differ from decoding without speculation\n",
               n_prompts, k);
        failures++;
      }
      fprintf(out, "%s\"%d\": {\"proposed\": [", k > 1 ? ", " : "", k);
      for (int i = 0; i < k; i++) fprintf(out, "%s%llu", i ? ", " : "", (unsigned long long)st.proposed[i]);
      fprintf(out, "], \"accepted\": [");
      for (int i = 0; i < k; i++) fprintf(out, "%s%llu", i ? ", " : "", (unsigned long long)st.accepted[i]);
      fprintf(out, "], \"rounds\": %llu}", (unsigned long long)st.rounds);
    }
    if (run(w, ng, 3, prompt, n, n_gen, &got, &st) < 0) goto fail;
    if (got.n != base.n || memcmp(got.tok, base.tok, (size_t)got.n * sizeof *got.tok)) {
      printf("FAIL: prompt %d, ngram: tokens differ from decoding without speculation\n", n_prompts);
      failures++;
    }
    fprintf(out, "}, \"ngram_accepted\": %llu}", (unsigned long long)(st.accepted[0] + st.accepted[1] + st.accepted[2]));
    // Sampling (temperature 0.8, top-p 0.9, one seed): the same tokens with and without
    // speculation, since each token is drawn from a generator seeded by its index alone.
    temperature = 0.8f;
    if (run(w, "off", 0, prompt, n, n_gen, &base, &st) < 0) goto fail;
    for (int k = 1; k <= 4; k += 3) {
      if (run(w, mtp, k, prompt, n, n_gen, &got, &st) < 0) goto fail;
      if (got.n != base.n || memcmp(got.tok, base.tok, (size_t)got.n * sizeof *got.tok)) {
        printf("FAIL: prompt %d, sampling, mtp K=%d: tokens differ from sampling without "
               "speculation\n", n_prompts, k);
        failures++;
      }
    }
    temperature = 0;
    free(prompt);
    n_prompts++;
  }
  fprintf(out, "\n]}\n");
  fclose(out);
  fclose(in);
  printf("%d prompts x (mtp K=1..4, ngram) at world %d: %s\n", n_prompts, w->world,
         failures ? "tokens DIFFER" : "tokens identical to decoding without speculation");
  if (leak > 0) {
    int t0, d0, t1, d1;
    if (clear_cache(w) < 0) goto fail;
    lks_engine_free_blocks(w->engine, &t0, &d0);
    int32_t prompt[12];
    for (int i = 0; i < leak; i++) {
      for (int j = 0; j < 12; j++) prompt[j] = (int32_t)((i * 7 + j * 13) % vocab);
      lks_spec_stats st;
      if (run(w, i % 2 ? mtp : ng, 1 + i % 4, prompt, 12, 8, &got, &st) < 0) goto fail;
    }
    // What the prefix cache keeps is dropped first: then every block must be free again.
    if (clear_cache(w) < 0) goto fail;
    lks_engine_free_blocks(w->engine, &t1, &d1);
    bool ok = t0 == t1 && d0 == d1;
    printf("%d sequences decoded speculatively and freed: KV blocks free %d/%d (target), %d/%d "
           "(drafter) %s\n", leak, t1, t0, d1, d0, ok ? "ok" : "FAIL");
    failures += !ok;
  }
  {
    // Levers: set on every rank at the same step; a propose beyond them is refused (by rank 0
    // before it is sent, and by every worker), one within them runs.
    Lockstep__Levers lv = LOCKSTEP__LEVERS__INIT;
    lv.n_drafts = 2;
    lv.speculation = true;
    Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
    cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS;
    cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_LEVERS;
    cmd.levers = &lv;
    if (lks_world_submit(w, &cmd, NULL) < 0) goto fail;
    int32_t prompt[4] = {1, 2, 3, 4};
    lks_spec_stats st;
    bool refused = run(w, mtp, 3, prompt, 4, 8, &got, &st) < 0 &&
                   strstr(lks_last_error(), "the levers allow 2") != NULL;
    bool allowed = run(w, mtp, 2, prompt, 4, 8, &got, &st) == 0;
    printf("levers: 3 drafts refused (%s), 2 drafts run (%s)\n", refused ? "ok" : "FAIL",
           allowed ? "ok" : "FAIL");
    failures += !refused + !allowed;
  }
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
