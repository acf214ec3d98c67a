// SPDX-License-Identifier: MIT
// The HTTP API's endpoints other than generation (see http.c for routing and auth): /health,
// /metrics (the request counters kept here and the scheduler's statistics, as Prometheus text),
// /tokenize and /detokenize, and the control endpoints under /admin/ (the levers, clearing the
// prefix cache, drain, shutdown), which answer only to the admin token and are refused (403)
// when none is configured.
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/api.h"
#include "coordinator/http_impl.h"
#include "core/error.h"
#include "text/tokenizer.h"
#include "worker/world.h"

enum MHD_Result lks__http_health(lks_http *h, struct MHD_Connection *c) {
  bool ok = lks_sched_healthy(h->sched) && !lks_sched_draining(h->sched);
  return lks__http_send_json(h, c, ok ? 200 : 503,
                             json_pack("{s:s, s:i}", "status", ok ? "ok"
                                       : lks_sched_healthy(h->sched) ? "draining" : "failed",
                                       "world", h->w->world));
}

static void hist_text(char **out, size_t *len, const char *name, const char *help, const lks_hist *hi) {
  char line[256];
  FILE *f = open_memstream(out, len);
  fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int i = 0; i < LKS_HIST_BUCKETS; i++) {
    cum += hi->count[i];
    snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, hi->le[i], (unsigned long long)cum);
    fputs(line, f);
  }
  cum += hi->count[LKS_HIST_BUCKETS];
  fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %g\n%s_count %llu\n", name,
          (unsigned long long)cum, name, hi->sum, name, (unsigned long long)hi->n);
  fclose(f);
}

enum MHD_Result lks__http_metrics(lks_http *h, struct MHD_Connection *c) {
  lks_sched_stats st;
  lks_sched_stats_get(h->sched, &st);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  static const char *codes[] = {"2xx", "4xx", "400", "429", "5xx", "503"};
  fprintf(f, "# HELP lockstep_http_requests_total HTTP requests answered, by status\n"
             "# TYPE lockstep_http_requests_total counter\n");
  pthread_mutex_lock(&h->mu);
  for (int i = 0; i < 6; i++)
    fprintf(f, "lockstep_http_requests_total{status=\"%s\"} %llu\n", codes[i],
            (unsigned long long)h->by_status[i]);
  pthread_mutex_unlock(&h->mu);
  fprintf(f, "# HELP lockstep_api_requests_total Generation and count requests accepted, by API\n"
             "# TYPE lockstep_api_requests_total counter\n");
  for (int i = 0; i < LKS_API_N; i++)
    fprintf(f, "lockstep_api_requests_total{api=\"%s\"} %llu\n", lks_api_names[i],
            (unsigned long long)atomic_load(&h->stats.requests[i]));
  fprintf(f, "# HELP lockstep_tool_calls_total Tool calls parsed from the model's output\n"
             "# TYPE lockstep_tool_calls_total counter\nlockstep_tool_calls_total %llu\n"
             "# HELP lockstep_reasoning_tokens_total Tokens of reasoning (<think>) text in outputs\n"
             "# TYPE lockstep_reasoning_tokens_total counter\nlockstep_reasoning_tokens_total %llu\n",
          (unsigned long long)atomic_load(&h->stats.tool_calls),
          (unsigned long long)atomic_load(&h->stats.reasoning_tokens));
  fprintf(f,
          "# TYPE lockstep_prompt_tokens_total counter\nlockstep_prompt_tokens_total %llu\n"
          "# TYPE lockstep_generated_tokens_total counter\nlockstep_generated_tokens_total %llu\n"
          "# TYPE lockstep_requests_finished_total counter\nlockstep_requests_finished_total %llu\n"
          "# TYPE lockstep_requests_cancelled_total counter\nlockstep_requests_cancelled_total %llu\n"
          "# TYPE lockstep_steps_total counter\nlockstep_steps_total %llu\n"
          "# TYPE lockstep_queue_depth gauge\nlockstep_queue_depth %d\n"
          "# TYPE lockstep_slots_in_use gauge\nlockstep_slots_in_use %d\n"
          "# TYPE lockstep_slots gauge\nlockstep_slots %d\n"
          "# TYPE lockstep_kv_blocks_free gauge\nlockstep_kv_blocks_free %d\n"
          "# TYPE lockstep_speculation gauge\nlockstep_speculation %d\n",
          (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens,
          (unsigned long long)st.requests_done, (unsigned long long)st.requests_cancelled,
          (unsigned long long)st.steps, st.queue_depth, st.slots_in_use, st.slots,
          st.kv_blocks_free, st.speculation ? 1 : 0);
  fprintf(f, "# HELP lockstep_spec_drafts_proposed_total Drafts proposed, by position in the round\n"
             "# TYPE lockstep_spec_drafts_proposed_total counter\n");
  for (int i = 0; i < 16; i++)
    if (st.spec.proposed[i])
      fprintf(f, "lockstep_spec_drafts_proposed_total{position=\"%d\"} %llu\n", i + 1,
              (unsigned long long)st.spec.proposed[i]);
  fprintf(f, "# HELP lockstep_spec_drafts_accepted_total Drafts accepted, by position in the round\n"
             "# TYPE lockstep_spec_drafts_accepted_total counter\n");
  for (int i = 0; i < 16; i++)
    if (st.spec.proposed[i])
      fprintf(f, "lockstep_spec_drafts_accepted_total{position=\"%d\"} %llu\n", i + 1,
              (unsigned long long)st.spec.accepted[i]);
  fprintf(f, "# TYPE lockstep_spec_verify_rounds_total counter\nlockstep_spec_verify_rounds_total %llu\n",
          (unsigned long long)st.spec.rounds);
  fprintf(f, "# HELP lockstep_prefix_cache_hit_tokens_total Prompt tokens the prefix cache gave\n"
             "# TYPE lockstep_prefix_cache_hit_tokens_total counter\nlockstep_prefix_cache_hit_tokens_total %llu\n"
             "# HELP lockstep_prefix_cache_hits_total Requests that started from a cached prefix\n"
             "# TYPE lockstep_prefix_cache_hits_total counter\nlockstep_prefix_cache_hits_total %llu\n"
             "# TYPE lockstep_prefix_cache_hit_rate gauge\nlockstep_prefix_cache_hit_rate %.4f\n"
             "# TYPE lockstep_prefix_cache_evictions_total counter\nlockstep_prefix_cache_evictions_total %llu\n"
             "# HELP lockstep_kv_blocks KV blocks of the target's cache by state (cached: kept by the "
             "prefix cache, possibly also in use)\n# TYPE lockstep_kv_blocks gauge\n"
             "lockstep_kv_blocks{state=\"free\"} %d\nlockstep_kv_blocks{state=\"used\"} %d\n"
             "lockstep_kv_blocks{state=\"cached\"} %d\n",
          (unsigned long long)st.prefix.hit_tokens, (unsigned long long)st.prefix.lookups,
          st.prompt_tokens ? (double)st.cached_tokens / (double)st.prompt_tokens : 0.0,
          (unsigned long long)st.prefix.evicted, st.kv_blocks_free, st.kv_blocks - st.kv_blocks_free,
          st.prefix.entries);
  fprintf(f, "# HELP lockstep_rank_up Whether each rank is alive and in step (1) or not (0)\n"
             "# TYPE lockstep_rank_up gauge\n");
  for (int r = 0; r < h->w->world && r < LKS_RANKS_SHOWN; r++)
    fprintf(f, "lockstep_rank_up{rank=\"%d\"} %d\n", r, st.rank_up[r] ? 1 : 0);
  // The process's resident memory (Prometheus' standard name), for leak checks under load.
  long pages_total = 0, pages_rss = 0;
  FILE *sm = fopen("/proc/self/statm", "r");
  if (sm) {
    if (fscanf(sm, "%ld %ld", &pages_total, &pages_rss) != 2) pages_rss = 0;
    fclose(sm);
  }
  fprintf(f, "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %ld\n",
          pages_rss * sysconf(_SC_PAGESIZE));
  fclose(f);
  const struct {
    const char *name, *help;
    const lks_hist *h;
  } hs[] = {{"lockstep_time_to_first_token_seconds", "From request to its first token", &st.ttft},
            {"lockstep_inter_token_latency_seconds", "Between consecutive tokens of a request", &st.itl},
            {"lockstep_step_seconds", "One scheduler step (a forward over the batch)", &st.step}};
  for (size_t i = 0; i < 3; i++) {
    char *t = NULL;
    size_t n = 0;
    hist_text(&t, &n, hs[i].name, hs[i].help, hs[i].h);
    char *b = realloc(buf, len + n + 1);
    if (b) {
      memcpy(b + len, t, n + 1);
      buf = b;
      len += n;
    }
    free(t);
  }
  lks__http_count(h, 200);
  enum MHD_Result ok = lks__http_send_text(c, 200, "text/plain; version=0.0.4", buf);
  free(buf);
  return ok;
}

enum MHD_Result lks__http_tokenize(lks_http *h, struct MHD_Connection *c, json_t *o, bool inverse) {
  if (!h->tok) return lks__http_fail(h, c, 400, NULL, "this model directory has no tokenizer.json");
  if (!inverse) {
    json_t *pr = json_object_get(o, "prompt");
    if (!json_is_string(pr)) return lks__http_fail(h, c, 400, "prompt", "'prompt' must be a string");
    int32_t *ids;
    int n;
    if (lks_tokenizer_encode(h->tok, json_string_value(pr), json_string_length(pr), false, &ids, &n) < 0)
      return lks__http_fail(h, c, 400, "prompt", "%s", lks_last_error());
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    return lks__http_send_json(h, c, 200, json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", n, "max_model_len", h->max_len));
  }
  json_t *toks = json_object_get(o, "tokens");
  if (!json_is_array(toks)) return lks__http_fail(h, c, 400, "tokens", "'tokens' must be a list of token ids");
  size_t n = json_array_size(toks);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(toks, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= lks_tokenizer_n_ids(h->tok)) {
      free(ids);
      return lks__http_fail(h, c, 400, "tokens", "tokens[%zu] is not a token id of this tokenizer", i);
    }
    ids[i] = (int32_t)json_integer_value(v);
  }
  char *text;
  size_t len;
  int rc = lks_tokenizer_decode(h->tok, ids, (int)n, false, &text, &len);
  free(ids);
  if (rc < 0) return lks__http_fail(h, c, 400, "tokens", "%s", lks_last_error());
  enum MHD_Result ok = lks__http_send_json(h, c, 200, json_pack("{s:s%}", "prompt", text, len));
  free(text);
  return ok;
}

enum MHD_Result lks__http_admin(lks_http *h, struct MHD_Connection *c, const char *url,
                                const char *method, json_t *o) {
  const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (!h->admin_token) return lks__http_fail(h, c, 403, NULL, "the control endpoints are disabled: no --admin-token is configured");
  if (!auth) return lks__http_fail(h, c, 401, NULL, "the control endpoints need 'Authorization: Bearer <token>'");
  if (!lks__http_token_ok(auth, h->admin_token)) return lks__http_fail(h, c, 403, NULL, "wrong admin token");
  if (!strcmp(url, "/admin/levers")) {
    if (!strcmp(method, "POST")) {
      if (!o) return lks__http_fail(h, c, 400, NULL, "the body must be a JSON object");
      lks_sched_stats st;
      lks_sched_stats_get(h->sched, &st);
      bool spec = st.speculation;
      long k = st.n_drafts;
      lks__http_verr e = {0};
      if (!lks__http_get_int(o, "num_drafts", 0, 16, k, &k, &e) || !lks__http_get_bool(o, "speculation", &spec, &e))
        return lks__http_fail(h, c, 400, e.param, "%s", e.msg);
      if (!json_object_get(o, "speculation")) spec = st.speculation;
      json_t *lad = json_object_get(o, "ladder");
      if (lad && !json_is_string(lad)) return lks__http_fail(h, c, 400, "ladder", "'ladder' must be a string");
      if (lks_sched_set_levers(h->sched, spec, (int)k, lad ? json_string_value(lad) : st.ladder) < 0)
        return lks__http_fail(h, c, 400, "ladder", "%s", lks_last_error());
    }
    lks_sched_stats st;
    lks_sched_stats_get(h->sched, &st);
    return lks__http_send_json(h, c, 200,
                               json_pack("{s:b, s:i, s:s}", "speculation", st.speculation,
                                         "num_drafts", st.n_drafts, "ladder", st.ladder));
  }
  if (strcmp(method, "POST") != 0) return lks__http_fail(h, c, 405, NULL, "use POST");
  if (!strcmp(url, "/admin/prefix-cache/clear")) {
    lks_sched_clear_cache(h->sched);
    return lks__http_send_json(h, c, 200, json_pack("{s:s}", "status", "clearing at the next step"));
  }
  if (!strcmp(url, "/admin/drain")) {
    lks_sched_stop(h->sched, true);
    return lks__http_send_json(h, c, 200, json_pack("{s:s}", "status", "draining"));
  }
  if (!strcmp(url, "/admin/shutdown")) {
    lks_sched_stop(h->sched, true);
    atomic_store(&h->shutdown, true);
    return lks__http_send_json(h, c, 200, json_pack("{s:s}", "status", "shutting down"));
  }
  return lks__http_fail(h, c, 404, NULL, "no such endpoint: %s", url);
}
