// SPDX-License-Identifier: MIT
// Generation requests of the HTTP API (see http.c for the event-driven design): the validation
// of completions and chat bodies into request parameters (every refusal a 4xx naming the field),
// and the answer of a submitted generation. A plain answer keeps its connection suspended, with
// a one-shot waker armed on the request, until the request is done, and is then queued whole
// with its real status; a stream's content reader hands out what is there and suspends again
// when nothing is. Chat and Messages answers are written by their dialects (api_openai.c,
// api_anthropic.c) through the formatter hook; completions are written here.
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "coordinator/api.h"
#include "coordinator/api_anthropic.h"
#include "coordinator/api_openai.h"
#include "coordinator/http_impl.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "text/chat.h"
#include "worker/world.h"

// ---- validation of the request body ----

static bool bad(lks__http_verr *e, unsigned status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool bad(lks__http_verr *e, unsigned status, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  e->param = param;
  e->status = status;
  return false;
}

static bool get_number(json_t *o, const char *k, double lo, double hi, double def, double *out,
                       lks__http_verr *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    *out = def;
    return true;
  }
  if (!json_is_number(v)) return bad(e, 400, k, "'%s' must be a number", k);
  double x = json_number_value(v);
  if (!isfinite(x) || x < lo || x > hi)
    return bad(e, 400, k, "'%s' = %g is outside [%g, %g]", k, x, lo, hi);
  *out = x;
  return true;
}

bool lks__http_get_int(json_t *o, const char *k, long lo, long hi, long def, long *out,
                       lks__http_verr *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    *out = def;
    return true;
  }
  if (!json_is_integer(v)) return bad(e, 400, k, "'%s' must be an integer", k);
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi) return bad(e, 400, k, "'%s' = %lld is outside [%ld, %ld]", k, (long long)x, lo, hi);
  *out = (long)x;
  return true;
}

bool lks__http_get_bool(json_t *o, const char *k, bool *out, lks__http_verr *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    *out = false;
    return true;
  }
  if (!json_is_boolean(v)) return bad(e, 400, k, "'%s' must be true or false", k);
  *out = json_is_true(v);
  return true;
}

// A seed from the OS for a request that names none (so that concurrent requests differ), kept
// below 2^53 so that JSON clients read it back exactly and can pass it in again.
static uint64_t draw_seed(void) {
  uint64_t x = 0;
  if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) {
    static atomic_ullong ctr;
    x = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(lks_clock() * 1e9) ^
        atomic_fetch_add(&ctr, 0x632be59bd9b4e019ull);
  }
  return x & ((1ull << 53) - 1);
}

// The logit processors and logprobs (coordinator/logits.h), n and best_of. Chat: logprobs is a
// boolean and top_logprobs 0..20; completions: logprobs is the number of alternatives, 0..5
// (*legacy_lp; -1 when not asked). A logit_bias key is a token id in decimal (no sign, no
// leading zero), below the model's vocabulary.
static bool parse_processors(lks_http *h, json_t *o, bool chat, lks_req_params *p, int *n_choices,
                             int *legacy_lp, lks__http_verr *e) {
  lks_logit_params *lp = &p->lp;
  double pres, freq, rep;
  if (!get_number(o, "presence_penalty", -2, 2, 0, &pres, e)) return false;
  if (!get_number(o, "frequency_penalty", -2, 2, 0, &freq, e)) return false;
  if (!get_number(o, "repetition_penalty", 0, 100, 1, &rep, e)) return false;  // an extension, as vLLM's
  if (rep <= 0) return bad(e, 400, "repetition_penalty", "'repetition_penalty' must be above 0");
  lp->presence = (float)pres;
  lp->frequency = (float)freq;
  lp->repetition = (float)rep;
  json_t *lb = json_object_get(o, "logit_bias");
  if (lb && !json_is_null(lb)) {
    if (!json_is_object(lb))
      return bad(e, 400, "logit_bias", "'logit_bias' must be an object of token ids to numbers");
    size_t n = json_object_size(lb);
    if (n > LKS_MAX_LOGIT_BIAS)
      return bad(e, 400, "logit_bias", "'logit_bias' has %zu entries; at most %d", n, LKS_MAX_LOGIT_BIAS);
    int vocab = lks_model_config(h->w->model)->vocab;
    lp->bias_ids = malloc((n ? n : 1) * sizeof *lp->bias_ids);
    lp->bias = malloc((n ? n : 1) * sizeof *lp->bias);
    if (!lp->bias_ids || !lp->bias) return bad(e, 500, NULL, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
      size_t kl = strlen(k);
      bool digits = kl > 0 && kl <= 9 && !(kl > 1 && k[0] == '0');
      for (size_t i = 0; digits && i < kl; i++) digits = k[i] >= '0' && k[i] <= '9';
      if (!digits || atol(k) >= vocab)
        return bad(e, 400, "logit_bias", "'logit_bias' key '%.40s' is not a token id in [0, %d)", k, vocab);
      if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < -100 ||
          json_number_value(v) > 100)
        return bad(e, 400, "logit_bias", "'logit_bias' value of '%.40s' must be a number in [-100, 100]", k);
      lp->bias_ids[lp->n_bias] = (int32_t)atol(k);
      lp->bias[lp->n_bias++] = (float)json_number_value(v);
    }
  }
  json_t *lpv = json_object_get(o, "logprobs");
  *legacy_lp = -1;
  if (chat) {
    bool want = false;
    long top = 0;
    if (!lks__http_get_bool(o, "logprobs", &want, e)) return false;
    if (!lks__http_get_int(o, "top_logprobs", 0, LKS_MAX_TOP_LOGPROBS, 0, &top, e)) return false;
    json_t *tv = json_object_get(o, "top_logprobs");
    if (tv && !json_is_null(tv) && !want)
      return bad(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    lp->logprobs = want;
    lp->top_logprobs = (int)top;
    if (want) *legacy_lp = (int)top;
  } else if (lpv && !json_is_null(lpv)) {
    long k;
    if (!lks__http_get_int(o, "logprobs", 0, 5, 0, &k, e)) return false;
    lp->logprobs = true;
    lp->top_logprobs = (int)k;
    *legacy_lp = (int)k;
  }
  long n, best_of;
  if (!lks__http_get_int(o, "n", 1, LKS_MAX_CHOICES, 1, &n, e)) return false;
  if (!lks__http_get_int(o, "best_of", 1, LKS_MAX_CHOICES, n, &best_of, e)) return false;
  if (best_of != n)
    return bad(e, 400, "best_of", "'best_of' = %ld: only best_of equal to n (%ld) is supported", best_of, n);
  *n_choices = (int)n;
  return true;
}

// Sampling, max_tokens, stop, seed, the logit processors, logprobs and n: shared by both
// generation endpoints. *max_tokens is -1 when the request names none; otherwise at least 1
// (its upper bound is the context: check_length).
static bool parse_common(lks_http *h, json_t *o, bool chat, lks_req_params *p,
                         long long *max_tokens, bool *stream, bool *usage_in_stream,
                         int *n_choices, int *legacy_lp, lks__http_verr *e) {
  json_t *m = json_object_get(o, "model");
  if (m && !json_is_null(m)) {
    if (!json_is_string(m)) return bad(e, 400, "model", "'model' must be a string");
    if (strcmp(json_string_value(m), h->model_id) != 0)
      return bad(e, 404, "model", "The model '%.200s' does not exist; this server serves '%s'",
                 json_string_value(m), h->model_id);
  }
  double t, tp;
  long tk, seed;
  if (!get_number(o, "temperature", 0, 100, 1.0, &t, e)) return false;
  if (!get_number(o, "top_p", 1e-9, 1, 1.0, &tp, e)) return false;
  if (!lks__http_get_int(o, "top_k", -1, 1 << 24, 0, &tk, e)) return false;
  json_t *sv = json_object_get(o, "seed");
  bool seeded = sv && !json_is_null(sv);
  if (!lks__http_get_int(o, "seed", -(1L << 53), 1L << 53, 0, &seed, e)) return false;
  const char *mt_name = "max_completion_tokens";
  json_t *mtok = json_object_get(o, mt_name);
  if (!mtok || json_is_null(mtok)) mtok = json_object_get(o, mt_name = "max_tokens");
  *max_tokens = -1;
  if (mtok && !json_is_null(mtok)) {
    if (!json_is_integer(mtok))
      return bad(e, 400, mt_name, "'%s' must be an integer", mt_name);
    json_int_t x = json_integer_value(mtok);
    if (x < 1) return bad(e, 400, mt_name, "'%s' = %lld: it must be at least 1", mt_name, (long long)x);
    *max_tokens = (long long)x;
  }
  if (!lks__http_get_bool(o, "stream", stream, e)) return false;
  if (!lks__http_get_bool(o, "ignore_eos", &p->ignore_eos, e)) return false;  // an extension, as vLLM's
  json_t *so = json_object_get(o, "stream_options");
  *usage_in_stream = false;
  if (so && !json_is_null(so)) {
    if (!json_is_object(so)) return bad(e, 400, "stream_options", "'stream_options' must be an object");
    if (!lks__http_get_bool(so, "include_usage", usage_in_stream, e)) return false;
  }
  lks_api_err ae = {0};
  if (!lks_oai_response_format(o, &p->json_object, &ae)) return bad(e, ae.status, ae.param, "%s", ae.msg);
  if (p->json_object && !lks_sched_json_ready(h->sched))
    return bad(e, 400, "response_format", "'response_format' json_object needs the model's "
               "tokenizer.json, which this model directory does not have");
  if (!parse_processors(h, o, chat, p, n_choices, legacy_lp, e)) return false;
  json_t *stop = json_object_get(o, "stop");
  if (stop && !json_is_null(stop)) {
    size_t k = json_is_array(stop) ? json_array_size(stop) : 1;
    if (!json_is_string(stop) && !json_is_array(stop))
      return bad(e, 400, "stop", "'stop' must be a string or a list of strings");
    if (k > 4) return bad(e, 400, "stop", "'stop' takes at most 4 strings");
    p->stop = calloc(k ? k : 1, sizeof *p->stop);
    if (!p->stop) return bad(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
      json_t *si = json_is_array(stop) ? json_array_get(stop, i) : stop;
      if (!json_is_string(si) || json_string_length(si) == 0 || json_string_length(si) > 256)
        return bad(e, 400, "stop", "'stop' entries must be strings of 1 to 256 bytes");
      p->stop[p->n_stop++] = strdup(json_string_value(si));
    }
  }
  p->sampling.temperature = (float)t;
  p->sampling.top_p = (float)tp;
  p->sampling.top_k = tk < 0 ? 0 : (int)tk;
  p->seed = seeded ? (uint64_t)seed : draw_seed();
  return true;
}

// The prompt's token budget: max_tokens defaults to 16 for completions and to the rest of the
// context for chat; prompt + max_tokens must fit the context, or the request is refused naming
// max_tokens (as vLLM and OpenAI do; nothing is capped silently).
static bool check_length(lks_http *h, lks_req_params *p, long long max_tokens, int def_max,
                         lks__http_verr *e) {
  if (p->n_prompt < 1) return bad(e, 400, "prompt", "the prompt is empty");
  if (p->n_prompt >= h->max_len)
    return bad(e, 400, "prompt", "the prompt has %d tokens; the context holds %d", p->n_prompt,
               h->max_len);
  long long room = (long long)h->max_len - p->n_prompt;
  if (max_tokens < 0) max_tokens = def_max > 0 && def_max < room ? def_max : room;
  if (max_tokens > room)
    return bad(e, 400, "max_tokens",
               "max_tokens %lld + %d prompt tokens exceed the context of %d tokens (at most %lld "
               "new tokens fit)", max_tokens, p->n_prompt, h->max_len, room);
  p->max_tokens = (int)max_tokens;
  return true;
}

static bool encode(lks_http *h, const char *text, size_t len, lks_req_params *p,
                   lks__http_verr *e) {
  if (!h->tok) return bad(e, 400, "prompt", "this model directory has no tokenizer.json: send token ids");
  if (lks_tokenizer_encode(h->tok, text, len, false, &p->prompt, &p->n_prompt) < 0)
    return bad(e, 400, "prompt", "cannot tokenize the prompt: %s", lks_last_error());
  return true;
}

static bool parse_completion(lks_http *h, json_t *o, lks_req_params *p, lks__http_verr *e) {
  json_t *pr = json_object_get(o, "prompt");
  if (!pr) return bad(e, 400, "prompt", "'prompt' is required");
  if (json_is_string(pr)) return encode(h, json_string_value(pr), json_string_length(pr), p, e);
  if (json_is_array(pr)) {
    size_t n = json_array_size(pr);
    if (n == 1 && json_is_string(json_array_get(pr, 0)))
      return encode(h, json_string_value(json_array_get(pr, 0)), json_string_length(json_array_get(pr, 0)), p, e);
    if (n == 0) return bad(e, 400, "prompt", "the prompt is empty");
    p->prompt = malloc(n * sizeof *p->prompt);
    int vocab = lks_model_config(h->w->model)->vocab;
    for (size_t i = 0; i < n; i++) {
      json_t *v = json_array_get(pr, i);
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
        return bad(e, 400, "prompt", "prompt[%zu] must be a token id in [0, %d)", i, vocab);
      p->prompt[p->n_prompt++] = (int32_t)json_integer_value(v);
    }
    return true;
  }
  return bad(e, 400, "prompt", "'prompt' must be a string, a list of one string, or a list of token ids");
}

static bool parse_chat(lks_http *h, json_t *o, lks_req_params *p, lks__http_verr *e,
                       const json_t **parser_tools) {
  json_t *msgs = json_object_get(o, "messages");
  if (!json_is_array(msgs)) return bad(e, 400, "messages", "'messages' must be a list");
  if (json_array_size(msgs) == 0) return bad(e, 400, "messages", "'messages' is empty");
  static const char *roles[] = {"system", "user", "assistant", "tool", "developer"};
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (!json_is_object(m)) return bad(e, 400, "messages", "messages[%zu] must be an object", i);
    json_t *role = json_object_get(m, "role");
    if (!json_is_string(role)) return bad(e, 400, "messages", "messages[%zu].role must be a string", i);
    bool known = false;
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
      known |= !strcmp(json_string_value(role), roles[r]);
    if (!known)
      return bad(e, 400, "messages", "messages[%zu].role '%.100s' is not one of system, "
                 "developer, user, assistant, tool", i, json_string_value(role));
    json_t *content = json_object_get(m, "content");
    if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content))
      return bad(e, 400, "messages", "messages[%zu].content must be a string or a list of parts", i);
  }
  // Tools, tool calls, tool results, thinking: api_openai.c.
  json_t *conv;
  const json_t *tools;
  int think;
  bool parse_tools;
  lks_api_err ae = {0};
  if (!lks_oai_chat_prepare(&h->cx, o, &conv, &tools, &think, &parse_tools, &ae))
    return bad(e, ae.status, ae.param, "%s", ae.msg);
  *parser_tools = parse_tools ? tools : NULL;
  // JSON mode turns thinking off, as enable_thinking=false does: the constraint then covers the
  // whole reply, and no reasoning spends the max_tokens the JSON must close within.
  if (p->json_object && think == 1) {
    json_decref(conv);
    return bad(e, 400, "response_format", "'response_format' json_object turns thinking off; it "
               "cannot be combined with chat_template_kwargs.enable_thinking: true");
  }
  if (p->json_object) think = 0;
  p->keep_markup = true;
  char *text;
  size_t len;
  int rc = lks_chat_render(conv, tools, think, true, &text, &len);
  json_decref(conv);
  if (rc < 0) return bad(e, 400, "messages", "%s", lks_last_error());
  bool ok = encode(h, text, len, p, e);
  free(text);
  return ok;
}

// ---- generation responses ----

static void gen_put(lks__http_gen *g, const char *s, size_t n) {
  char *b = realloc(g->out, g->out_len + n);
  if (!b) return;
  memcpy(b + g->out_len, s, n);
  g->out = b;
  g->out_len += n;
}

static void gen_event(lks__http_gen *g, json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s) return;
  gen_put(g, "data: ", 6);
  gen_put(g, s, strlen(s));
  gen_put(g, "\n\n", 2);
  free(s);
}

// The usage of a finished generation: the prompt once, the completion tokens of every choice.
static json_t *usage(const lks__http_gen *g) {
  int gen = 0;
  for (int i = 0; i < g->n_ch; i++) gen += g->ch[i].n_generated;
  const lks__http_choice *c = &g->ch[0];
  return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", c->n_prompt, "completion_tokens",
                   gen, "total_tokens", c->n_prompt + gen, "prompt_tokens_details",
                   "cached_tokens", c->n_cached);
}

// A completions stream chunk of choice `index` (lp: its logprobs, consumed; NULL for null).
static json_t *chunk(lks__http_gen *g, int index, const char *text, size_t len, const char *finish,
                     json_t *lp) {
  json_t *fr = finish ? json_string(finish) : json_null();
  json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "text",
                             lks__http_jstr(text ? text : "", text ? len : 0), "finish_reason", fr,
                             "logprobs", lp ? lp : json_null());
  return json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", g->id, "object", "text_completion",
                   "created", (json_int_t)g->created, "model", g->h->model_id, "choices", choice);
}

// Completions: the legacy logprobs of choice c's tokens [c->lp_sent, to), appended to *legacy.
static void legacy_logprobs(lks__http_gen *g, lks__http_choice *c, int to, json_t **legacy) {
  lks_tok_logprob *lp = NULL;
  int32_t *ids = NULL;
  int k = lks_req_tokens(c->req, &ids);
  int n = lks_req_logprobs(c->req, c->lp_sent, to, &lp);
  if (n > k - c->lp_sent) n = k - c->lp_sent > 0 ? k - c->lp_sent : 0;
  lks_oai_logprobs_legacy(g->h->tok, ids + c->lp_sent, lp, n, legacy, &c->text_off);
  c->lp_sent += n;
  free(lp);
  free(ids);
}

static void gen_sink_put(void *ctx, const char *s, size_t n) { gen_put(ctx, s, n); }

// A plain chat choice of several: its formatter's JSON, kept apart until the merge.
static void choice_sink_put(void *ctx, const char *s, size_t n) {
  lks__http_choice *c = ctx;
  char *b = realloc(c->text, c->n_text + n + 1);
  if (!b) return;
  memcpy(b + c->n_text, s, n);
  c->text = b;
  c->n_text += n;
  c->text[c->n_text] = '\0';
}

// ---- the wakers (see lks__http_waker) ----

static void waker_unref(lks__http_waker *w) {
  pthread_mutex_lock(&w->mu);
  int left = --w->refs;
  pthread_mutex_unlock(&w->mu);
  if (left) return;
  pthread_mutex_destroy(&w->mu);
  free(w);
}

// Resumes the connection if it is suspended and nobody resumed it yet. The decision is taken
// under w->mu and libmicrohttpd is called outside it; the generation cannot go away in between,
// as its connection stays suspended until that call.
static void waker_resume(lks__http_waker *w) {
  pthread_mutex_lock(&w->mu);
  struct MHD_Connection *c = w->g && w->suspended ? w->g->c : NULL;
  w->suspended = false;
  pthread_mutex_unlock(&w->mu);
  if (c) MHD_resume_connection(c);
}

// The waker armed on a request: news arrived, let libmicrohttpd run the connection again.
static void gen_wake(void *ctx) {
  lks__http_waker *w = ctx;
  waker_resume(w);
  waker_unref(w);
}

// Takes back the wakers still armed on g's requests.
static void gen_disarm(lks__http_gen *g) {
  for (int i = 0; i < g->n_ch; i++)
    if (g->ch[i].req && lks_req_disarm(g->ch[i].req)) waker_unref(g->wk);
}

// Suspends the connection until a request that is not done has news (a stream: any; plain: its
// end). Only from the access handler or the content reader of g's connection.
static void gen_suspend(lks__http_gen *g, bool until_done) {
  lks__http_waker *w = g->wk;
  MHD_suspend_connection(g->c);
  gen_disarm(g);
  pthread_mutex_lock(&w->mu);
  w->suspended = true;
  pthread_mutex_unlock(&w->mu);
  bool news = false;
  for (int i = 0; i < g->n_ch && !news; i++) {
    if (g->ch[i].done) continue;
    pthread_mutex_lock(&w->mu);
    w->refs++;
    pthread_mutex_unlock(&w->mu);
    if (!lks_req_arm(g->ch[i].req, until_done, gen_wake, w)) {
      news = true;
      waker_unref(w);
    }
  }
  if (news) waker_resume(w);
}

bool lks__http_gen_all_finished(lks__http_gen *g) {
  for (int i = 0; i < g->n_ch; i++)
    if (!lks_req_finished(g->ch[i].req)) return false;
  return true;
}

void lks__http_gen_abandon(lks__http_gen *g) {
  atomic_store(&g->gone, true);
  for (int i = 0; i < g->n_ch; i++) lks_req_cancel(g->ch[i].req);
  gen_disarm(g);
  waker_resume(g->wk);
}

// The final JSON of a plain completions request that is done.
static void gen_final(lks__http_gen *g) {
  json_t *choices = json_array();
  for (int i = 0; i < g->n_ch; i++) {
    lks__http_choice *c = &g->ch[i];
    json_t *lp = NULL;
    if (g->logprobs >= 0) legacy_logprobs(g, c, c->n_generated, &lp);
    json_t *choice = json_pack("{s:i, s:o, s:s, s:o}", "index", i, "text",
                               lks__http_jstr(c->text ? c->text : "", c->n_text), "finish_reason",
                               c->finish ? c->finish : "stop", "logprobs", lp ? lp : json_null());
    if (g->token_ids) {  // an extension (as vLLM's return_token_ids): the generated ids
      int32_t *ids;
      int k = lks_req_tokens(c->req, &ids);
      json_t *arr = json_array();
      for (int j = 0; j < k; j++) json_array_append_new(arr, json_integer(ids[j]));
      free(ids);
      json_object_set_new(choice, "token_ids", arr);
    }
    json_array_append_new(choices, choice);
  }
  json_t *j = json_pack("{s:s, s:s, s:i, s:s, s:o, s:o, s:I}", "id", g->id, "object",
                        "text_completion", "created", (json_int_t)g->created, "model",
                        g->h->model_id, "choices", choices, "usage", usage(g), "seed",
                        (json_int_t)lks_req_seed(g->ch[0].req));
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (s) gen_put(g, s, strlen(s));
  free(s);
}

// The final JSON of a plain chat request of n > 1 choices: choice 0's response with every
// choice's, and the usage of all.
static void gen_merge(lks__http_gen *g) {
  json_t *base = g->ch[0].text ? json_loads(g->ch[0].text, 0, NULL) : NULL;
  json_t *choices = json_array();
  for (int i = 0; i < g->n_ch; i++) {
    json_t *j = i == 0 ? json_incref(base) : g->ch[i].text ? json_loads(g->ch[i].text, 0, NULL) : NULL;
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    if (c) json_array_append(choices, c);
    json_decref(j);
  }
  if (!base) base = json_object();
  json_object_set_new(base, "choices", choices);
  json_object_set_new(base, "usage", usage(g));
  char *s = json_dumps(base, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(base);
  if (s) gen_put(g, s, strlen(s));
  free(s);
}

// Takes what the requests have now, without waiting: a stream's events, or a plain request's
// text. Returns 1 when every choice is done, -1 when one failed (g->error says why), 0 while
// some still run.
static int gen_take(lks__http_gen *g) {
  bool all = true;
  for (int i = 0; i < g->n_ch; i++) {
    lks__http_choice *c = &g->ch[i];
    if (c->done) continue;
    lks_req_news n;
    lks_req_read(c->req, 0, &n);
    if (n.failed) {
      snprintf(g->error, sizeof g->error, "%s", n.error[0] ? n.error : "the model failed");
      if (g->stream && !g->finished) {  // the status is sent: the stream ends with an error event
        gen_event(g, lks__http_error_body(g->error, "server_error", NULL, NULL));
        g->finished = true;
      }
      free(n.text);
      return -1;
    }
    c->n_prompt = n.n_prompt;
    c->n_generated = n.n_generated;
    c->n_cached = n.n_cached;
    if (c->fmt.news) {  // a dialect writes the response (api_openai.c, api_anthropic.c)
      bool apart = !g->stream && g->n_ch > 1;
      lks_api_sink k = {apart ? choice_sink_put : gen_sink_put, apart ? (void *)c : (void *)g};
      c->fmt.news(c->fmt.st, &n, &k);
    } else if (g->stream) {
      json_t *lp = NULL;
      if (g->logprobs >= 0 && c->lp_sent < n.n_generated) legacy_logprobs(g, c, n.n_generated, &lp);
      if (n.len || lp) gen_event(g, chunk(g, i, n.text ? n.text : "", n.len, NULL, lp));
      if (n.done) gen_event(g, chunk(g, i, NULL, 0, n.finish_reason, NULL));
    } else if (n.len) {
      char *b = realloc(c->text, c->n_text + n.len + 1);
      if (b) {
        memcpy(b + c->n_text, n.text, n.len);
        c->text = b;
        c->n_text += n.len;
        c->text[c->n_text] = '\0';
      }
    }
    if (n.done) {
      c->done = true;
      c->finish = n.finish_reason;
    }
    free(n.text);
    all = all && c->done;
  }
  if (!all) return 0;
  if (g->stream && !g->finished) {
    // A dialect ends a stream of one choice itself; several choices end here.
    if (!g->ch[0].fmt.news || g->n_ch > 1) {
      if (g->usage) {
        json_t *u = json_pack("{s:s, s:s, s:i, s:s, s:[], s:o}", "id", g->id, "object",
                              g->chat ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)g->created, "model", g->h->model_id, "choices", "usage",
                              usage(g));
        gen_event(g, u);
      }
      gen_put(g, "data: [DONE]\n\n", 14);
    }
    g->finished = true;
  }
  return 1;
}

// A stream's content reader (a libmicrohttpd thread): hands out what is there; with nothing,
// suspends the connection until the scheduler wakes it. It never blocks.
static ssize_t gen_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  lks__http_gen *g = cls;
  while (g->out_off == g->out_len) {
    if (g->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    if (atomic_load(&g->gone)) return MHD_CONTENT_READER_END_WITH_ERROR;
    g->out_len = g->out_off = 0;
    gen_take(g);
    if (g->out_len == 0 && !g->finished) {
      gen_suspend(g, false);
      return 0;
    }
  }
  size_t n = g->out_len - g->out_off;
  if (n > max) n = max;
  memcpy(buf, g->out + g->out_off, n);
  g->out_off += n;
  return (ssize_t)n;
}

static void sock_attach(lks_http *h, lks__http_sock *sk, lks__http_gen *g) {
  if (!sk) return;
  pthread_mutex_lock(&h->socks_mu);
  sk->g = g;
  pthread_mutex_unlock(&h->socks_mu);
}

// A generation with its waker, not yet with requests (NULL when out of memory).
static lks__http_gen *gen_new(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn) {
  lks__http_gen *g = calloc(1, sizeof *g);
  lks__http_waker *w = calloc(1, sizeof *w);
  if (!g || !w) {
    free(g);
    free(w);
    return NULL;
  }
  pthread_mutex_init(&w->mu, NULL);
  w->refs = 1;
  w->g = g;
  g->wk = w;
  g->h = h;
  g->c = c;
  g->sk = cn->sk;
  g->logprobs = -1;
  g->created = (long)time(NULL);
  return g;
}

// Frees a generation that never started answering (its requests, if any, are cancelled).
static void gen_drop(lks__http_gen *g) {
  g->finished = false;
  atomic_fetch_add(&g->h->open_responses, 1);  // lks__http_gen_free counts it out
  lks__http_gen_free(g);
}

void lks__http_gen_free(void *cls) {
  lks__http_gen *g = cls;
  if (!g) return;
  // Off the watcher's list first: from here on nobody else touches g.
  pthread_mutex_lock(&g->h->socks_mu);
  if (g->sk && g->sk->g == g) g->sk->g = NULL;
  pthread_mutex_unlock(&g->h->socks_mu);
  atomic_fetch_sub(&g->h->open_responses, 1);
  for (int i = 0; i < g->n_ch; i++)
    if (!g->finished) lks_req_cancel(g->ch[i].req);  // the client left early
  gen_disarm(g);
  pthread_mutex_lock(&g->wk->mu);
  g->wk->g = NULL;  // a waker still on its way finds nothing to resume
  pthread_mutex_unlock(&g->wk->mu);
  waker_unref(g->wk);
  for (int i = 0; i < g->n_ch; i++) {
    lks__http_choice *c = &g->ch[i];
    if (c->fmt.free) c->fmt.free(c->fmt.st);
    lks_req_release(c->req);
    free(c->text);
    json_decref(c->legacy);
  }
  free(g->out);
  free(g);
}

// A plain request after its connection resumed (or right after the submit): the whole answer
// once every choice is done, with its status; until then the connection stays suspended.
enum MHD_Result lks__http_gen_respond(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn) {
  lks__http_gen *g = cn->g;
  if (atomic_load(&g->gone)) return MHD_NO;  // the client left: close
  int st = gen_take(g);
  if (st == 0) {
    gen_suspend(g, true);
    return MHD_YES;
  }
  g->finished = true;
  if (st < 0) {
    // The world failed (500), or the server shut down before the request finished (503).
    unsigned status = lks_sched_healthy(h->sched) ? 503 : 500;
    return lks__http_send_json(h, c, status,
                               lks__http_error_body(g->error, "server_error", NULL, NULL));
  }
  if (!g->ch[0].fmt.news) gen_final(g);   // completions
  else if (g->n_ch > 1) gen_merge(g);     // chat of several choices; else the dialect wrote it
  lks__http_count(h, 200);
  struct MHD_Response *r = MHD_create_response_from_buffer(g->out_len, g->out, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", "application/json");
  enum MHD_Result ok = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ok;
}

// Answers a submitted generation: a plain request once it is done (gen_respond; the connection
// owns g until then), a stream as it goes (gen_reader).
static enum MHD_Result gen_start(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn,
                                 lks__http_gen *g, uint64_t seed) {
  atomic_fetch_add(&h->open_responses, 1);
  sock_attach(h, cn->sk, g);
  if (!g->stream) {
    cn->g = g;
    return lks__http_gen_respond(h, c, cn);
  }
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, gen_reader, g, lks__http_gen_free);
  if (!resp) {
    lks__http_gen_free(g);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", "text/event-stream");
  MHD_add_response_header(resp, "Cache-Control", "no-cache");
  char sh[32];
  snprintf(sh, sizeof sh, "%llu", (unsigned long long)seed);
  MHD_add_response_header(resp, "X-Lockstep-Seed", sh);
  lks__http_count(h, 200);
  enum MHD_Result rc = MHD_queue_response(c, 200, resp);
  MHD_destroy_response(resp);
  return rc;
}

// The seed of choice i of a request seeded with `seed`: the seed itself for the first, and for
// the others a mix of both (below 2^53, as every seed a client sees), so that the choices are
// reproducible and differ.
static uint64_t choice_seed(uint64_t seed, int i) {
  if (i == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) & ((1ull << 53) - 1);
}

// A deep copy of p for another choice (0 or LKS_ENOMEM; dst is then cleared).
static int params_copy(const lks_req_params *p, lks_req_params *dst) {
  *dst = *p;
  dst->prompt = malloc((size_t)p->n_prompt * sizeof *p->prompt);
  dst->stop = p->n_stop ? calloc((size_t)p->n_stop, sizeof *p->stop) : NULL;
  dst->lp.bias_ids = p->lp.n_bias ? malloc((size_t)p->lp.n_bias * sizeof *p->lp.bias_ids) : NULL;
  dst->lp.bias = p->lp.n_bias ? malloc((size_t)p->lp.n_bias * sizeof *p->lp.bias) : NULL;
  bool ok = dst->prompt && (!p->n_stop || dst->stop) && (!p->lp.n_bias || (dst->lp.bias_ids && dst->lp.bias));
  int n_stop = 0;
  for (int i = 0; ok && i < p->n_stop; i++, n_stop++) ok = (dst->stop[i] = strdup(p->stop[i])) != NULL;
  dst->n_stop = n_stop;
  if (!ok) {
    lks_req_params_clear(dst);
    return LKS_ENOMEM;
  }
  memcpy(dst->prompt, p->prompt, (size_t)p->n_prompt * sizeof *p->prompt);
  if (p->lp.n_bias) {
    memcpy(dst->lp.bias_ids, p->lp.bias_ids, (size_t)p->lp.n_bias * sizeof *p->lp.bias_ids);
    memcpy(dst->lp.bias, p->lp.bias, (size_t)p->lp.n_bias * sizeof *p->lp.bias);
  }
  return 0;
}

enum MHD_Result lks__http_generate(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn,
                                   json_t *o, bool chat) {
  lks_req_params p = {0};
  lks__http_verr e = {0};
  bool stream = false, usage_in_stream = false;
  const json_t *tools = NULL;
  long long max_tokens = -1;
  int n_choices = 1, legacy_lp = -1;
  bool ok = parse_common(h, o, chat, &p, &max_tokens, &stream, &usage_in_stream, &n_choices,
                         &legacy_lp, &e) &&
            (chat ? parse_chat(h, o, &p, &e, &tools) : parse_completion(h, o, &p, &e)) &&
            check_length(h, &p, max_tokens, chat ? -1 : 16, &e);
  // The shortest object, {}, may take two tokens.
  if (ok && p.json_object && p.max_tokens < 2)
    ok = bad(&e, 400, "max_tokens", "max_tokens %d: response_format json_object needs at least 2",
             p.max_tokens);
  if (!ok) {
    lks_req_params_clear(&p);
    return lks__http_fail(h, c, e.status, e.param, "%s", e.msg);
  }
  lks__http_gen *g = gen_new(h, c, cn);
  if (!g) {
    lks_req_params_clear(&p);
    return lks__http_fail(h, c, 500, NULL, "out of memory");
  }
  g->chat = chat;
  g->stream = stream;
  g->usage = usage_in_stream;
  g->logprobs = legacy_lp;
  g->token_ids = json_is_true(json_object_get(o, "return_token_ids"));
  snprintf(g->id, sizeof g->id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
           (unsigned long long)atomic_fetch_add(&h->next_id, 1));
  uint64_t seed = p.seed;
  int n_prompt = p.n_prompt, max_tok = p.max_tokens;
  // n choices: n requests, submitted together (the prompt is prefilled by each; the prefix
  // cache gives it to the later ones only once an earlier one has finished).
  int err = 0;
  for (int i = 0; i < n_choices && !err; i++) {
    lks_req_params pi;
    if (i + 1 < n_choices) {
      if (params_copy(&p, &pi) < 0) {
        err = LKS_ENOMEM;
        break;
      }
    } else {
      pi = p;
      memset(&p, 0, sizeof p);
    }
    pi.seed = choice_seed(seed, i);
    g->ch[i].req = lks_sched_submit(h->sched, &pi, &err);
    lks_req_params_clear(&pi);  // only left when the submit failed (it takes ownership otherwise)
    if (g->ch[i].req) g->n_ch = i + 1;
  }
  lks_req_params_clear(&p);
  if (err) {
    gen_drop(g);
    if (err == LKS_EFULL) return lks__http_fail(h, c, 429, NULL, "the request queue is full; retry later");
    if (err == LKS_ENOMEM) return lks__http_fail(h, c, 500, NULL, "out of memory");
    return lks__http_fail(h, c, 503, NULL, "the server is not accepting requests (draining or failed)");
  }
  LKS_LOG(LKS_LOG_DEBUG, "%s: %d prompt tokens, max_tokens %d, n %d, seed %llu%s", g->id, n_prompt,
          max_tok, n_choices, (unsigned long long)seed, stream ? ", streamed" : "");
  for (int i = 0; chat && i < n_choices; i++) {
    lks_oai_choice oc = {.index = i, .part = n_choices > 1, .logprobs = legacy_lp >= 0};
    if (lks_oai_chat_fmt(&h->cx, g->ch[i].req, tools, g->id, g->created, stream, usage_in_stream,
                         g->token_ids, &oc, &g->ch[i].fmt) < 0) {
      gen_drop(g);
      return lks__http_fail(h, c, 500, NULL, "out of memory");
    }
  }
  if (chat) g->logprobs = -1;  // the chat formatter writes them
  atomic_fetch_add(&h->stats.requests[chat ? LKS_API_CHAT : LKS_API_COMPLETIONS], 1);
  return gen_start(h, c, cn, g, seed);
}

// POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API (api_anthropic.c),
// with Anthropic-shaped errors.
enum MHD_Result lks__http_anth_fail(lks_http *h, struct MHD_Connection *c, unsigned status,
                                    const char *msg) {
  return lks__http_send_json(h, c, status, lks_anth_error(status, msg));
}

enum MHD_Result lks__http_messages(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn,
                                   json_t *o, bool count_only) {
  if (!o) return lks__http_anth_fail(h, c, 400, "the body must be a JSON object");
  if (!count_only && (!lks_sched_healthy(h->sched) || lks_sched_draining(h->sched)))
    return lks__http_anth_fail(h, c, 503, "the server is not accepting requests (draining or failed)");
  lks_req_params p = {0};
  json_t *tools = NULL;
  bool stream = false;
  lks_api_err e = {0};
  bool ok = lks_anth_prepare(&h->cx, o, count_only, &p, &tools, &stream, &e);
  if (!ok || count_only) {
    int n_prompt = p.n_prompt;
    lks_req_params_clear(&p);
    json_decref(tools);
    if (!ok) return lks__http_anth_fail(h, c, e.status, e.msg);
    atomic_fetch_add(&h->stats.requests[LKS_API_COUNT_TOKENS], 1);
    return lks__http_send_json(h, c, 200, json_pack("{s:i}", "input_tokens", n_prompt));
  }
  lks__http_gen *g = gen_new(h, c, cn);
  if (!g) {
    lks_req_params_clear(&p);
    json_decref(tools);
    return lks__http_anth_fail(h, c, 500, "out of memory");
  }
  g->stream = stream;
  snprintf(g->id, sizeof g->id, "msg_%llu", (unsigned long long)atomic_fetch_add(&h->next_id, 1));
  // The formatter copies the stop strings before the request takes them.
  lks_api_fmt fmt;
  if (lks_anth_fmt(&h->cx, NULL, tools, g->id, stream, p.stop, p.n_stop, &fmt) < 0) {
    gen_drop(g);
    lks_req_params_clear(&p);
    return lks__http_anth_fail(h, c, 500, "out of memory");
  }
  uint64_t seed = p.seed;
  int err;
  lks_req *r = lks_sched_submit(h->sched, &p, &err);
  lks_req_params_clear(&p);
  if (!r) {
    fmt.free(fmt.st);
    gen_drop(g);
    return err == LKS_EFULL ? lks__http_anth_fail(h, c, 429, "the request queue is full; retry later")
                            : lks__http_anth_fail(h, c, 503, "the server is not accepting requests "
                                                             "(draining or failed)");
  }
  g->ch[0].req = r;
  g->ch[0].fmt = fmt;
  g->n_ch = 1;
  atomic_fetch_add(&h->stats.requests[LKS_API_MESSAGES], 1);
  return gen_start(h, c, cn, g, seed);
}
