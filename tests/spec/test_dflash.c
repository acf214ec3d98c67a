// SPDX-License-Identifier: MIT
// Speculative decoding with the DFlash block drafter end to end, on every rank of the world it is
// started in (mpirun or not).
//
// usage: [mpirun -np N] test_dflash MODEL_DIR DRAFT_DIR PROMPTS OUT.json [N_GEN]
//
// Every run goes through the scheduler (the loop of serve, generate and bench), the gate off so
// that every round speculates. For every prompt (one per line, comma-separated ids; '#' lines
// skipped): greedy decoding without speculation and with --spec dflash for K = 1 .. block - 1; the
// tokens must be equal, and the per-position proposed/accepted counts go to OUT.json for the
// comparison with the float64 reference (tests/reference/dflash_ref.py) and between world sizes.
// Then sampling (temperature 0.8, top-p 0.9) for several seeds, with and without the drafter:
// the same tokens, since each token is drawn with the generator of its index (README,
// speculative decoding). Then every KV block of the drafter's context cache must be free again,
// and a propose beyond the block is refused.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "coordinator/scheduler.h"
#include "coordinator/submit.h"
#include "core/error.h"
#include "model/dflash.h"
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

static int run(lks_world *w, const char *spec, int k, const int32_t *prompt, int n, int n_gen,
               float temperature, uint64_t seed, sink *out, lks_spec_stats *st) {
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
  p.seed = seed;
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

static bool same(const sink *a, const sink *b) {
  return a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
}

static int check_prompt(lks_world *w, int kmax, const char *line, const int32_t *prompt, int n,
                        int n_gen, int index, FILE *out, sink *base, sink *got) {
  lks_spec_stats st;
  if (run(w, "off", 0, prompt, n, n_gen, 0, 7, base, &st) < 0) return -1;
  fprintf(out, "%s\n {\"prompt\": \"%s\", \"tokens\": [", index ? "," : "", line);
  for (int i = 0; i < base->n; i++) fprintf(out, "%s%d", i ? ", " : "", base->tok[i]);
  fprintf(out, "], \"dflash\": {");
  for (int k = 1; k <= kmax; k++) {
    if (run(w, "dflash", k, prompt, n, n_gen, 0, 7, got, &st) < 0) return -1;
    if (!same(got, base)) {
      printf("FAIL: prompt %d, dflash K=%d: tokens differ from decoding without speculation\n",
             index, k);
      failures++;
    }
    fprintf(out, "%s\"%d\": {\"proposed\": [", k > 1 ? ", " : "", k);
    for (int i = 0; i < k; i++) fprintf(out, "%s%llu", i ? ", " : "", (unsigned long long)st.proposed[i]);
    fprintf(out, "], \"accepted\": [");
    for (int i = 0; i < k; i++) fprintf(out, "%s%llu", i ? ", " : "", (unsigned long long)st.accepted[i]);
    fprintf(out, "], \"rounds\": %llu}", (unsigned long long)st.rounds);
  }
  fprintf(out, "}}");
  // Sampling, several seeds: the same tokens with and without the drafter.
  for (uint64_t seed = 1; seed <= 3; seed++) {
    if (run(w, "off", 0, prompt, n, n_gen, 0.8f, seed, base, &st) < 0) return -1;
    if (run(w, "dflash", kmax, prompt, n, n_gen, 0.8f, seed, got, &st) < 0) return -1;
    if (!same(got, base)) {
      printf("FAIL: prompt %d, sampling seed %llu, dflash K=%d: tokens differ from sampling "
             "without speculation\n", index, (unsigned long long)seed, kmax);
      failures++;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s MODEL_DIR DRAFT_DIR PROMPTS OUT.json [N_GEN]\n", argv[0]);
    return 2;
  }
  int n_gen = argc > 5 ? atoi(argv[5]) : 32;
  lks_settings *s = lks_settings_new();
  if (!s || lks_settings_set(s, "model", argv[1], "test") < 0 ||
      lks_settings_set(s, "draft-model", argv[2], "test") < 0 ||
      lks_settings_set(s, "spec", "dflash", "test") < 0 ||
      lks_settings_set(s, "prefix-cache", "false", "test") < 0 ||
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
  FILE *in = fopen(argv[3], "r"), *out = fopen(argv[4], "w");
  if (!in || !out) {
    perror("prompts / output");
    lks_mpi_abort(2);
  }
  int vocab = lks_model_config(w->model)->vocab;
  int kmax = lks_dflash_block_size(lks_model_dflash(w->model)) - 1;
  char line[8192];
  int n_prompts = 0;
  int t0, d0, t1, d1;
  lks_engine_free_blocks(w->engine, &t0, &d0);
  fprintf(out, "{\"world\": %d, \"n_gen\": %d, \"prompts\": [", w->world, n_gen);
  sink base = {malloc((size_t)n_gen * sizeof(int32_t)), 0}, got = {malloc((size_t)n_gen * sizeof(int32_t)), 0};
  while (fgets(line, sizeof line, in)) {
    line[strcspn(line, "\r\n")] = '\0';
    if (!*line || line[0] == '#') continue;
    int32_t *prompt;
    int n;
    if (lks_cli_parse_ids(line, vocab, &prompt, &n) < 0) {
      fprintf(stderr, "prompt %d: %s\n", n_prompts, lks_last_error());
      lks_mpi_abort(2);
    }
    if (check_prompt(w, kmax, line, prompt, n, n_gen, n_prompts, out, &base, &got) < 0) goto fail;
    free(prompt);
    n_prompts++;
  }
  fprintf(out, "\n]}\n");
  fclose(out);
  fclose(in);
  printf("%d prompts x (dflash K=1..%d greedy, 3 sampling seeds) at world %d: %s\n", n_prompts,
         kmax, w->world, failures ? "tokens DIFFER" : "tokens identical to decoding without speculation");
  // The target's blocks and the drafter's context blocks are all free again once the prefix
  // cache lets go of its own (later runs of a prompt start from the blocks of earlier ones, the
  // drafter's context included: the counts above equal the reference's all the same).
  {
    Lockstep__Command clear = LOCKSTEP__COMMAND__INIT;
    clear.type = LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE;
    if (lks_world_submit(w, &clear, NULL) < 0) goto fail;
  }
  lks_engine_free_blocks(w->engine, &t1, &d1);
  bool ok = t0 == t1 && d0 == d1;
  printf("KV blocks free after the runs: %d/%d (target), %d/%d (drafter context) %s\n", t1, t0,
         d1, d0, ok ? "ok" : "FAIL");
  failures += !ok;
  // The end of the context: sequences that end at --max-seq-len (256) after 2 .. 6 tokens,
  // drafting up to the block. A block that would pass the longest sequence is not proposed, nor
  // the catch-up of one that cannot draft refused (the world failed at both); the tokens are
  // those of plain decoding. After 2, the first propose is 2 positions from the end.
  for (int n_end = 2; n_end <= 6; n_end++) {
    lks_spec_stats st;
    int n = 256 - n_end;
    int32_t *prompt = malloc((size_t)n * sizeof *prompt);
    if (!prompt) goto fail;
    for (int j = 0; j < n; j++) prompt[j] = (int32_t)((j * 31 + 3) % vocab);
    int rc = run(w, "off", 0, prompt, n, n_end, 0, 7, &base, &st);
    if (rc == 0) rc = run(w, "dflash", kmax, prompt, n, n_end, 0, 7, &got, &st);
    bool ok = rc == 0 && same(&base, &got);
    printf("end of the context, dflash K=%d, %d tokens to the last position: %s%s%s\n", kmax,
           n_end, ok ? "ok" : "FAIL", rc < 0 ? ": " : "", rc < 0 ? lks_last_error() : "");
    failures += !ok;
    free(prompt);
  }
  // A propose of more drafts than the block holds is refused.
  {
    lks_spec_stats st;
    int32_t prompt[4] = {1, 2, 3, 4};
    bool refused = run(w, "dflash", kmax + 1, prompt, 4, 8, 0, 7, &got, &st) == 0 &&
                   st.proposed[kmax] == 0;
    printf("K=%d: at most %d drafts proposed (%s)\n", kmax + 1, kmax, refused ? "ok" : "FAIL");
    failures += !refused;
  }
  // Malformed proposes are refused on rank 0 before they are sent (every worker checks the same).
  {
    int32_t tok = 5;
    Lockstep__SlotTokens st = LOCKSTEP__SLOT_TOKENS__INIT;
    Lockstep__SlotTokens *sts[1] = {&st};
    st.slot = 0;
    st.start_pos = 5;
    st.tokens = &tok;
    st.n_tokens = 1;
    Lockstep__MtpPropose mp = LOCKSTEP__MTP_PROPOSE__INIT;
    mp.seqs = sts;
    mp.n_seqs = 1;
    mp.n_drafts = 1;
    Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
    cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_DFLASH_PROPOSE;
    cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_PROPOSE;
    cmd.propose = &mp;
    bool unalloc = lks_world_submit(w, &cmd, NULL) < 0 && strstr(lks_last_error(), "not allocated");
    uint32_t slot0 = 0;
    if (lks_world_slots(w, LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT, &slot0, 1) < 0) goto fail;
    bool gap = lks_world_submit(w, &cmd, NULL) < 0 && strstr(lks_last_error(), "its context holds 0");
    mp.n_drafts = (uint32_t)kmax + 1;
    st.start_pos = 0;
    bool over = lks_world_submit(w, &cmd, NULL) < 0 && strstr(lks_last_error(), "the block and the levers");
    if (lks_world_slots(w, LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT, &slot0, 1) < 0) goto fail;
    printf("refused: propose on a free slot (%s), past the context (%s), beyond the block (%s)\n",
           unalloc ? "ok" : "FAIL", gap ? "ok" : "FAIL", over ? "ok" : "FAIL");
    failures += !unalloc + !gap + !over;
  }
  free(base.tok);
  free(got.tok);
  lks_world_stop(w);
  lks_settings_free(s);
  lks_mpi_finalize();
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
fail:
  fprintf(stderr, "test_dflash: %s\n", lks_last_error());
  lks_mpi_abort(1);
  return 1;
}
