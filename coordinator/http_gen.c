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

// Sampling, max_tokens, stop, seed: shared by both generation endpoints. *max_tokens is -1 when
// the request names none; otherwise at least 1 (its upper bound is the context: check_length).
static bool parse_common(lks_http *h, json_t *o, lks_req_params *p, long long *max_tokens,
                         bool *stream, bool *usage_in_stream, lks__http_verr *e) {
  json_t *m = json_object_get(o, "model");
  if (m && !json_is_null(m)) {
    if (!json_is_string(m)) return bad(e, 400, "model", "'model' must be a string");
    if (strcmp(json_string_value(m), h->model_id) != 0)
      return bad(e, 404, "model", "The model '%.200s' does not exist; this server serves '%s'",
                 json_string_value(m), h->model_id);
  }
  double t, tp;
  long tk, n, seed;
  if (!get_number(o, "temperature", 0, 100, 1.0, &t, e)) return false;
  if (!get_number(o, "top_p", 1e-9, 1, 1.0, &tp, e)) return false;
  if (!lks__http_get_int(o, "top_k", -1, 1 << 24, 0, &tk, e)) return false;
  if (!lks__http_get_int(o, "n", 1, 1, 1, &n, e)) return false;
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
  if (!lks_oai_check_unsupported(o, &ae)) return bad(e, ae.status, ae.param, "%s", ae.msg);
  if (!lks_oai_response_format(o, &p->json_object, &ae)) return bad(e, ae.status, ae.param, "%s", ae.msg);
  if (p->json_object && !lks_sched_json_ready(h->sched))
    return bad(e, 400, "response_format", "'response_format' json_object needs the model's "
               "tokenizer.json, which this model directory does not have");
  json_t *lp = json_object_get(o, "logprobs");
  if (lp && !json_is_null(lp) && !json_is_false(lp))
    return bad(e, 400, "logprobs", "'logprobs' is not supported");
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

static json_t *usage(const lks_req_news *n) {
  return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", n->n_prompt, "completion_tokens",
                   n->n_generated, "total_tokens", n->n_prompt + n->n_generated,
                   "prompt_tokens_details", "cached_tokens", n->n_cached);
}

static json_t *chunk(lks__http_gen *g, const char *text, size_t len, const char *finish) {
  json_t *fr = finish ? json_string(finish) : json_null();
  json_t *choice;
  if (g->chat) {
    json_t *delta = json_object();
    if (!g->sent_role) {
      json_object_set_new(delta, "role", json_string("assistant"));
      g->sent_role = true;
    }
    if (text) json_object_set_new(delta, "content", lks__http_jstr(text, len));
    choice = json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "delta", delta, "finish_reason", fr,
                       "logprobs");
  } else {
    choice = json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "text",
                       lks__http_jstr(text ? text : "", text ? len : 0), "finish_reason", fr,
                       "logprobs");
  }
  return json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", g->id, "object",
                   g->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)g->created,
                   "model", g->h->model_id, "choices", choice);
}

static void gen_sink_put(void *ctx, const char *s, size_t n) { gen_put(ctx, s, n); }

// The waker armed on the request: news arrived, let libmicrohttpd run the connection again.
static void gen_wake(void *ctx) {
  lks__http_gen *g = ctx;
  MHD_resume_connection(g->c);
}

// Suspends the connection until the request has news (a stream: any; plain: its end). Only
// from the access handler or the content reader of g's connection.
static void gen_suspend(lks__http_gen *g, bool until_done) {
  MHD_suspend_connection(g->c);
  if (!lks_req_arm(g->req, until_done, gen_wake, g)) MHD_resume_connection(g->c);
}

// The final JSON of a plain request that is done (n: its last news).
static void gen_final(lks__http_gen *g, const lks_req_news *n) {
  json_t *choice;
  json_t *content = lks__http_jstr(g->text ? g->text : "", g->n_text);
  if (g->chat)
    choice = json_pack("{s:i, s:{s:s, s:o}, s:s, s:n}", "index", 0, "message", "role",
                       "assistant", "content", content, "finish_reason", n->finish_reason,
                       "logprobs");
  else
    choice = json_pack("{s:i, s:o, s:s, s:n}", "index", 0, "text", content, "finish_reason",
                       n->finish_reason, "logprobs");
  if (g->token_ids) {  // an extension (as vLLM's return_token_ids): the generated ids
    int32_t *ids;
    int k = lks_req_tokens(g->req, &ids);
    json_t *arr = json_array();
    for (int i = 0; i < k; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    json_object_set_new(choice, "token_ids", arr);
  }
  json_t *j = json_pack("{s:s, s:s, s:i, s:s, s:[o], s:o, s:I}", "id", g->id, "object",
                        g->chat ? "chat.completion" : "text_completion", "created",
                        (json_int_t)g->created, "model", g->h->model_id, "choices", choice,
                        "usage", usage(n), "seed", (json_int_t)lks_req_seed(g->req));
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (s) gen_put(g, s, strlen(s));
  free(s);
}

// Takes what the request has now, without waiting: a stream's events, or a plain request's text.
// Returns the news' state: 1 done, -1 failed (n->error says why), 0 still running.
static int gen_take(lks__http_gen *g, lks_req_news *n) {
  lks_req_read(g->req, 0, n);
  if (g->fmt.news && !n->failed) {  // a dialect writes the response (api_openai.c, api_anthropic.c)
    lks_api_sink k = {gen_sink_put, g};
    g->fmt.news(g->fmt.st, n, &k);
    if (n->done && g->stream) g->finished = true;
    return n->done ? 1 : 0;
  }
  if (n->failed) {
    if (g->stream) {  // the status is sent: the stream ends with an error event
      gen_event(g, lks__http_error_body(n->error[0] ? n->error : "the model failed",
                                        "server_error", NULL, NULL));
      g->finished = true;
    }
    return -1;
  }
  if (g->stream) {
    if (n->len || (!g->sent_role && g->chat)) gen_event(g, chunk(g, n->text ? n->text : "", n->len, NULL));
    if (n->done) {
      gen_event(g, chunk(g, NULL, 0, n->finish_reason));
      if (g->usage) {
        json_t *u = json_pack("{s:s, s:s, s:i, s:s, s:[], s:o}", "id", g->id, "object",
                              g->chat ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)g->created, "model", g->h->model_id, "choices", "usage",
                              usage(n));
        gen_event(g, u);
      }
      gen_put(g, "data: [DONE]\n\n", 14);
      g->finished = true;
    }
  } else if (n->len) {
    char *b = realloc(g->text, g->n_text + n->len + 1);
    if (b) {
      memcpy(b + g->n_text, n->text, n->len);
      g->text = b;
      g->n_text += n->len;
      g->text[g->n_text] = '\0';
    }
  }
  return n->done ? 1 : 0;
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
    lks_req_news n;
    gen_take(g, &n);
    free(n.text);
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

void lks__http_gen_free(void *cls) {
  lks__http_gen *g = cls;
  if (!g) return;
  // Off the watcher's list first: from here on nobody else touches g.
  pthread_mutex_lock(&g->h->socks_mu);
  if (g->sk && g->sk->g == g) g->sk->g = NULL;
  pthread_mutex_unlock(&g->h->socks_mu);
  atomic_fetch_sub(&g->h->open_responses, 1);
  if (!g->finished) lks_req_cancel(g->req);  // the client left early
  if (g->fmt.free) g->fmt.free(g->fmt.st);
  lks_req_release(g->req);
  free(g->out);
  free(g->text);
  free(g);
}

// A plain request after its connection resumed (or right after the submit): the whole answer
// once the request is done, with its status; until then the connection stays suspended.
enum MHD_Result lks__http_gen_respond(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn) {
  lks__http_gen *g = cn->g;
  if (atomic_load(&g->gone)) return MHD_NO;  // the client left: close
  lks_req_news n;
  int st = gen_take(g, &n);
  free(n.text);
  if (st == 0) {
    gen_suspend(g, true);
    return MHD_YES;
  }
  g->finished = true;
  if (st < 0) {
    // The world failed (500), or the server shut down before the request finished (503).
    unsigned status = lks_sched_healthy(h->sched) ? 503 : 500;
    return lks__http_send_json(h, c, status,
                               lks__http_error_body(n.error[0] ? n.error : "the model failed",
                                                    "server_error", NULL, NULL));
  }
  if (!g->fmt.news) gen_final(g, &n);  // else the dialect's formatter wrote it
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

enum MHD_Result lks__http_generate(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn,
                                   json_t *o, bool chat) {
  lks_req_params p = {0};
  lks__http_verr e = {0};
  bool stream = false, usage_in_stream = false;
  const json_t *tools = NULL;
  long long max_tokens = -1;
  bool ok = parse_common(h, o, &p, &max_tokens, &stream, &usage_in_stream, &e) &&
            (chat ? parse_chat(h, o, &p, &e, &tools) : parse_completion(h, o, &p, &e)) &&
            check_length(h, &p, max_tokens, chat ? -1 : 16, &e);
  // The shortest object, {}, may take two tokens.
  if (ok && p.json_object && p.max_tokens < 2)
    ok = bad(&e, 400, "max_tokens", "max_tokens %d: response_format json_object needs at least 2",
             p.max_tokens);
  if (!ok) {
    free(p.prompt);
    for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
    free(p.stop);
    return lks__http_fail(h, c, e.status, e.param, "%s", e.msg);
  }
  lks__http_gen *g = calloc(1, sizeof *g);
  if (!g) {
    free(p.prompt);
    for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
    free(p.stop);
    return lks__http_fail(h, c, 500, NULL, "out of memory");
  }
  g->h = h;
  g->c = c;
  g->sk = cn->sk;
  g->chat = chat;
  g->stream = stream;
  g->usage = usage_in_stream;
  g->token_ids = json_is_true(json_object_get(o, "return_token_ids"));
  g->created = (long)time(NULL);
  snprintf(g->id, sizeof g->id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
           (unsigned long long)atomic_fetch_add(&h->next_id, 1));
  uint64_t seed = p.seed;
  int n_prompt = p.n_prompt, max_tok = p.max_tokens;
  int err;
  g->req = lks_sched_submit(h->sched, &p, &err);
  free(p.prompt);  // only left when the submit failed (it takes ownership otherwise)
  for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
  free(p.stop);
  if (!g->req) {
    free(g);
    if (err == LKS_EFULL) return lks__http_fail(h, c, 429, NULL, "the request queue is full; retry later");
    return lks__http_fail(h, c, 503, NULL, "the server is not accepting requests (draining or failed)");
  }
  LKS_LOG(LKS_LOG_DEBUG, "%s: %d prompt tokens, max_tokens %d, seed %llu%s", g->id, n_prompt,
          max_tok, (unsigned long long)seed, stream ? ", streamed" : "");
  if (chat && lks_oai_chat_fmt(&h->cx, g->req, tools, g->id, g->created, stream, usage_in_stream,
                               g->token_ids, &g->fmt) < 0) {
    lks_req_cancel(g->req);
    lks_req_release(g->req);
    free(g);
    return lks__http_fail(h, c, 500, NULL, "out of memory");
  }
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
    free(p.prompt);
    for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
    free(p.stop);
    json_decref(tools);
    if (!ok) return lks__http_anth_fail(h, c, e.status, e.msg);
    atomic_fetch_add(&h->stats.requests[LKS_API_COUNT_TOKENS], 1);
    return lks__http_send_json(h, c, 200, json_pack("{s:i}", "input_tokens", p.n_prompt));
  }
  lks__http_gen *g = calloc(1, sizeof *g);
  if (!g) return lks__http_anth_fail(h, c, 500, "out of memory");
  g->h = h;
  g->c = c;
  g->sk = cn->sk;
  g->stream = stream;
  g->created = (long)time(NULL);
  snprintf(g->id, sizeof g->id, "msg_%llu", (unsigned long long)atomic_fetch_add(&h->next_id, 1));
  // The formatter copies the stop strings before the request takes them.
  lks_api_fmt fmt;
  if (lks_anth_fmt(&h->cx, NULL, tools, g->id, stream, p.stop, p.n_stop, &fmt) < 0) {
    free(g);
    free(p.prompt);
    for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
    free(p.stop);
    return lks__http_anth_fail(h, c, 500, "out of memory");
  }
  uint64_t seed = p.seed;
  int err;
  lks_req *r = lks_sched_submit(h->sched, &p, &err);
  free(p.prompt);
  for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
  free(p.stop);
  if (!r) {
    fmt.free(fmt.st);
    free(g);
    return err == LKS_EFULL ? lks__http_anth_fail(h, c, 429, "the request queue is full; retry later")
                            : lks__http_anth_fail(h, c, 503, "the server is not accepting requests "
                                                             "(draining or failed)");
  }
  g->req = r;
  g->fmt = fmt;
  atomic_fetch_add(&h->stats.requests[LKS_API_MESSAGES], 1);
  return gen_start(h, c, cn, g, seed);
}
