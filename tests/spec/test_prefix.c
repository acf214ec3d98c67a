// SPDX-License-Identifier: MIT
// The prefix cache end to end, on every rank of the world it is started in (mpirun or not).
//
// usage: [mpirun -np N] test_prefix MODEL_DIR PROMPTS SPEC [N_GEN]
//
// SPEC is "off", "mtp" or "dflash" (K = 3, the gate off; dflash: the drafter in
// MODEL_DIR/dflash). Conversations of three turns are built from the
// prompts (one per line, comma-separated ids): turn t's prompt is the previous turn's prompt, its
// output, and the next prompt line, so each turn starts with everything before it, ending in the
// middle of a block. Each turn runs twice through the scheduler: with the cache (it must hit, from
// turn 2 on) and again after EP_CMD_CLEAR_CACHE (it must not). Both runs must produce the same
// tokens and, with a drafter, the same per-position acceptance: the drafter's KV travels with the
// target's exactly. Then the edge cases: a prompt whose cached prefix ends one token before a
// block boundary, two requests sharing a prefix at once, and hits after eviction pressure (the
// pool is sized with --kv-blocks to a few sequences). At the end, after a clear, every KV block
// of both caches is free.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "coordinator/scheduler.h"
#include "coordinator/submit.h"
#include "core/error.h"

enum { MAX_TOK = 1024 };

typedef struct {
  int32_t tok[MAX_TOK];
  int n;
} seq;

static int failures, checks;
static const char *spec;

static void expect(bool ok, const char *what) {
  checks++;
  if (!ok) {
    printf("FAIL: %s\n", what);
    failures++;
  }
}

// At the first token of a run alone (slot 0), every KV row of the prompt: the target's rows
// 0..n-1 and the drafter's, K and V of every layer, for a bitwise comparison of a run from the
// cache with a cold one. The MTP layer's rows 0..n-2 (those a prefill pairs with tokens inside the
// prompt), the DFlash drafter's context rows 0..n-1.
static struct {
  lks_world *w;
  int n_prompt;
  bool on;
  float *rows;
  size_t n_floats;
} snap;

static void snapshot(void) {
  const lks_engine *e = snap.w->engine;
  size_t t = lks_engine_kv_row_floats(e, false), d = lks_engine_kv_row_floats(e, true);
  int drafter = strcmp(spec, "mtp") == 0      ? snap.n_prompt - 1
                : strcmp(spec, "dflash") == 0 ? snap.n_prompt
                                              : 0;
  snap.n_floats = (size_t)snap.n_prompt * t + (size_t)drafter * d;
  free(snap.rows);
  snap.rows = malloc(snap.n_floats * sizeof *snap.rows);
  float *o = snap.rows;
  for (int p = 0; p < snap.n_prompt; p++, o += t)
    if (lks_engine_kv_read(e, 0, false, p, o) < 0) snap.n_floats = 0;
  for (int p = 0; p < drafter; p++, o += d)
    if (lks_engine_kv_read(e, 0, true, p, o) < 0) snap.n_floats = 0;
}

static void collect(void *ctx, int32_t tok, bool eos) {
  (void)eos;
  seq *s = ctx;
  if (s->n == 0 && snap.on) snapshot();
  if (s->n < MAX_TOK) s->tok[s->n++] = tok;
}

static int clear_cache(lks_world *w) {
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE;
  return lks_world_submit(w, &cmd, NULL);
}

static lks_sched *sched_new(lks_world *w) {
  lks_sched_opts o;
  lks_sched_opts_from(w->settings, &o);
  snprintf(o.spec, sizeof o.spec, "%s", spec);
  o.n_drafts = 3;
  o.gate = false;
  return lks_sched_new(w, NULL, &o);
}

static lks_req_params params(const seq *prompt, int n_gen, seq *out) {
  lks_req_params p = {0};
  p.prompt = malloc((size_t)prompt->n * sizeof *p.prompt);
  memcpy(p.prompt, prompt->tok, (size_t)prompt->n * sizeof *p.prompt);
  p.n_prompt = prompt->n;
  p.max_tokens = n_gen;
  p.ignore_eos = true;
  p.on_token = collect;
  p.on_token_ctx = out;
  out->n = 0;
  return p;
}

// One request alone; its output, the prompt tokens the cache gave and the speculation counters.
static int run(lks_world *w, const seq *prompt, int n_gen, seq *out, uint64_t *cached,
               lks_spec_stats *st) {
  lks_sched *s = sched_new(w);
  if (!s) return -1;
  snap.w = w;
  snap.n_prompt = prompt->n;
  lks_req_params p = params(prompt, n_gen, out);
  int rc = lks_sched_run_one(s, &p);
  lks_sched_stats ss;
  lks_sched_stats_get(s, &ss);
  *cached = ss.cached_tokens;
  *st = ss.spec;
  lks_sched_free(s);
  return rc;
}

static bool same_seq(const seq *a, const seq *b) {
  return a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
}

static bool same_spec(const lks_spec_stats *a, const lks_spec_stats *b) {
  return !memcmp(a->proposed, b->proposed, sizeof a->proposed) &&
         !memcmp(a->accepted, b->accepted, sizeof a->accepted);
}

static void append(seq *s, const int32_t *t, int n) {
  for (int i = 0; i < n && s->n < MAX_TOK; i++) s->tok[s->n++] = t[i];
}

// Turn t with the cache and without: equal output and acceptance; a hit from turn 2 on.
static int turn(lks_world *w, const seq *prompt, int n_gen, int t, int conv, seq *out,
                uint64_t *hits) {
  seq cold;
  uint64_t c_hot, c_cold;
  lks_spec_stats s_hot, s_cold;
  snap.on = true;
  if (run(w, prompt, n_gen, out, &c_hot, &s_hot) < 0) return -1;
  float *hot_rows = snap.rows;
  size_t hot_n = snap.n_floats;
  snap.rows = NULL;
  if (clear_cache(w) < 0 || run(w, prompt, n_gen, &cold, &c_cold, &s_cold) < 0) return -1;
  snap.on = false;
  char what[160];
  snprintf(what, sizeof what, "conversation %d turn %d: every KV row of the prompt (target and "
           "drafter) from the cache equals a cold prefill's, bitwise", conv, t);
  expect(hot_n && hot_n == snap.n_floats && !memcmp(hot_rows, snap.rows, hot_n * sizeof *hot_rows), what);
  free(hot_rows);
  snprintf(what, sizeof what, "conversation %d turn %d: tokens with the cache equal tokens without", conv, t);
  expect(same_seq(out, &cold), what);
  snprintf(what, sizeof what, "conversation %d turn %d: per-position acceptance with the cache equals without", conv, t);
  expect(same_spec(&s_hot, &s_cold), what);
  snprintf(what, sizeof what, "conversation %d turn %d: the cache gave %llu prompt tokens (of %d)",
           conv, t, (unsigned long long)c_hot, prompt->n);
  expect(t == 1 ? c_hot == 0 : c_hot > 0, what);
  expect(c_cold == 0, "no hit after a clear");
  *hits += c_hot;
  // Put this turn back in the cache for the next one (the clear dropped it).
  seq again;
  uint64_t c;
  lks_spec_stats s;
  return run(w, prompt, n_gen, &again, &c, &s);
}

static int parse(const char *line, int vocab, seq *s) {
  int32_t *ids;
  int n;
  if (lks_cli_parse_ids(line, vocab, &ids, &n) < 0) return -1;
  s->n = 0;
  append(s, ids, n);
  free(ids);
  return 0;
}

// Two requests with one cached prefix, stepped together, each equal to its run alone.
static int concurrent(lks_world *w, const seq *a, const seq *b, int n_gen) {
  seq solo_a, solo_b, got_a, got_b;
  uint64_t c;
  lks_spec_stats st;
  if (clear_cache(w) < 0 || run(w, a, n_gen, &solo_a, &c, &st) < 0 ||
      run(w, b, n_gen, &solo_b, &c, &st) < 0)
    return -1;
  lks_sched *s = sched_new(w);
  if (!s) return -1;
  lks_req_params pa = params(a, n_gen, &got_a), pb = params(b, n_gen, &got_b);
  int err;
  lks_req *ra = lks_sched_submit(s, &pa, &err), *rb = lks_sched_submit(s, &pb, &err);
  int rc = ra && rb ? 0 : -1;
  while (rc >= 0 && !(lks_req_finished(ra) && lks_req_finished(rb))) rc = lks_sched_step(s);
  if (rc >= 0) rc = lks_sched_step(s);
  lks_sched_stats ss;
  lks_sched_stats_get(s, &ss);
  lks_req_release(ra);
  lks_req_release(rb);
  lks_sched_free(s);
  if (rc < 0) return rc;
  expect(ss.cached_tokens >= 2 * 16, "two concurrent requests both started from the cached prefix");
  expect(same_seq(&got_a, &solo_a) && same_seq(&got_b, &solo_b),
         "two concurrent requests sharing a prefix: each equals its run alone");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s MODEL_DIR PROMPTS SPEC [N_GEN]\n", argv[0]);
    return 2;
  }
  spec = argv[3];
  int n_gen = argc > 4 ? atoi(argv[4]) : 24;
  lks_settings *set = lks_settings_new();
  // A pool of 40 blocks of 16: a few conversations fit, more evict.
  if (!set || lks_settings_set(set, "max-seq-len", "256", "test") < 0 ||
      lks_settings_set(set, "threads", "1", "test") < 0 ||
      lks_settings_set(set, "kv-blocks", "40", "test") < 0 ||
      lks_settings_set(set, "max-slots", "2", "test") < 0 ||
      (strcmp(spec, "dflash") == 0 && lks_settings_set(set, "spec", "dflash", "test") < 0)) {
    fprintf(stderr, "settings: %s\n", lks_last_error());
    return 2;
  }
  lks_world *w = lks_world_start(set, argv[1], 2);
  if (!w) {
    fprintf(stderr, "world: %s\n", lks_last_error());
    lks_mpi_abort(1);
  }
  if (w->rank != 0) {
    int rc = lks_cli_worker(w);
    lks_settings_free(set);
    lks_mpi_finalize();
    return rc;
  }
  int vocab = lks_model_config(w->model)->vocab;
  FILE *in = fopen(argv[2], "r");
  if (!in) {
    perror(argv[2]);
    lks_mpi_abort(2);
  }
  seq lines[24];
  int n_lines = 0;
  char line[8192];
  while (n_lines < 24 && fgets(line, sizeof line, in)) {
    line[strcspn(line, "\r\n")] = '\0';
    if (*line && parse(line, vocab, &lines[n_lines]) == 0) n_lines++;
  }
  fclose(in);
  uint64_t hits = 0;
  seq out;
  // Conversations of three turns.
  for (int c = 0; c + 2 < n_lines && c < 12; c += 3) {
    seq prompt = lines[c];
    for (int t = 1; t <= 3; t++) {
      if (turn(w, &prompt, n_gen, t, c / 3, &out, &hits) < 0) goto fail;
      append(&prompt, out.tok, out.n);
      if (t < 3) append(&prompt, lines[c + t].tok, lines[c + t].n);
    }
  }
  // A cached prefix that ends one token before a block boundary: 47 tokens, then a new turn.
  {
    seq p = {{0}, 0};
    for (int i = 0; i < 47; i++) p.tok[p.n++] = (int32_t)((i * 37 + 11) % vocab);
    if (turn(w, &p, 8, 1, 100, &out, &hits) < 0) goto fail;
    append(&p, out.tok, 1);  // 48 tokens: exactly three blocks, the last one token later
    append(&p, lines[0].tok, lines[0].n);
    if (turn(w, &p, 8, 2, 100, &out, &hits) < 0) goto fail;
  }
  if (concurrent(w, &lines[3], &lines[3], n_gen) < 0) goto fail;
  {
    // Eviction pressure: many distinct prompts through the small pool, then a recent one hits.
    if (clear_cache(w) < 0) goto fail;
    lks_prefix_stats before, after;
    lks_engine_prefix_stats(w->engine, &before);
    seq p = {{0}, 0};
    uint64_t c;
    lks_spec_stats st;
    for (int i = 0; i < 24; i++) {  // 24 x 3 cached blocks > 40
      p.n = 0;
      for (int j = 0; j < 40; j++) p.tok[p.n++] = (int32_t)((i * 131 + j * 7 + 3) % vocab);
      if (run(w, &p, 8, &out, &c, &st) < 0) goto fail;
    }
    lks_engine_prefix_stats(w->engine, &after);
    expect(after.evicted > before.evicted, "the small pool evicted cached blocks");
    seq first;
    if (run(w, &p, 8, &first, &c, &st) < 0) goto fail;
    expect(c > 0, "a hit after eviction pressure");
    uint64_t c2;
    if (clear_cache(w) < 0 || run(w, &p, 8, &out, &c2, &st) < 0) goto fail;
    expect(same_seq(&first, &out), "after eviction pressure: the hit's tokens equal a cold run's");
  }
  {
    int t0, d0;
    if (clear_cache(w) < 0) goto fail;
    lks_engine_free_blocks(w->engine, &t0, &d0);
    expect(t0 == 40 && (d0 == 40 || d0 == 0), "after a clear every KV block is free");
  }
  printf("prefix cache, spec %s, world %d: %d checks, %llu prompt tokens from the cache\n", spec,
         w->world, checks, (unsigned long long)hits);
  lks_world_stop(w);
  lks_settings_free(set);
  lks_mpi_finalize();
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
fail:
  fprintf(stderr, "test_prefix: %s\n", lks_last_error());
  lks_mpi_abort(1);
  return 1;
}
