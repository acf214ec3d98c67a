// SPDX-License-Identifier: MIT
// The HTTP API (see http.h).
//
// libmicrohttpd runs an epoll event loop on a small pool of threads (--http-threads); no thread
// is held by a connection. Each request gets a `conn` that collects the body (up to --max-body
// bytes; beyond that the rest is read and dropped, and the answer is 413). A generation is
// event-driven: the handler submits the request and suspends the connection, arming a one-shot
// waker on the request (lks_req_arm) that the scheduler's thread calls when news arrives, which
// resumes the connection. A plain response is queued once the request is done, with its real
// status (200, or 500/503 when it failed); a stream's content reader hands out what is there and
// suspends again when nothing is. Suspended connections do not time out: --idle-timeout applies
// to idle clients only.
//
// A watcher thread looks at every open socket every 50 ms: a client that closed its socket while
// its generation waits (queued, generating, or streaming) has the request cancelled, which frees
// its slot at the scheduler's next step; a client that has not sent its headers and body within
// --request-timeout is disconnected.
#include "coordinator/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <malloc.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coordinator/api.h"
#include "coordinator/api_anthropic.h"
#include "coordinator/api_openai.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "text/chat.h"
#include "worker/world.h"

typedef struct gen gen;

// One open socket (MHD's socket context), in the watcher's list while it is open.
typedef struct sock {
  int fd;
  struct MHD_Connection *c;
  double t_request;  // when the request line arrived (0: between requests)
  bool handling;     // headers and body are in: the request is being answered
  gen *g;            // the generation waiting on this socket, if any
  struct sock *prev, *next;
} sock;

struct lks_http {
  struct MHD_Daemon *d;
  lks_sched *sched;
  lks_world *w;
  const lks_tokenizer *tok;
  char model_id[128];
  char *api_key, *admin_token;  // NULL: not configured
  size_t max_body;
  int max_len;
  double request_timeout;
  atomic_ullong next_id;
  atomic_bool shutdown;
  atomic_int open_responses;  // generation responses still being written
  pthread_mutex_t mu;  // the request counters below
  uint64_t by_status[6];  // 2xx, 4xx (other), 400, 429, 5xx, 503 — see status_index
  lks_api_stats stats;  // per API, tool calls, reasoning tokens (api.h)
  lks_api_ctx cx;       // what the API dialects need of the server
  char fingerprint[96];
  pthread_mutex_t socks_mu;  // the socket list, and every sock's g and phase
  sock *socks;
  pthread_t watcher;
  bool watching;
  atomic_bool stopping;
};

typedef struct {
  char *body;
  size_t len, cap;
  bool too_big, headers_seen;
  sock *sk;
  gen *g;  // a plain (non-streamed) generation in progress on this request
} conn;

// ---- replies ----

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *body) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

static void count(lks_http *h, unsigned status) {
  int i = status < 300 ? 0 : status == 400 ? 2 : status == 429 ? 3 : status == 503 ? 5
          : status >= 500 ? 4 : 1;
  pthread_mutex_lock(&h->mu);
  h->by_status[i]++;
  pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result send_json(lks_http *h, struct MHD_Connection *c, unsigned status,
                                 json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  count(h, status);
  enum MHD_Result ok = send_text(c, status, "application/json", s ? s : "{}");
  free(s);
  return ok;
}

// A JSON string of any bytes: invalid UTF-8 (a message cut inside a character, text a model
// produced) becomes U+FFFD rather than a failed json_pack.
static json_t *jstr(const char *s, size_t n) {
  json_t *j = json_stringn(s, n);
  if (j) return j;
  size_t m;
  char *clean = lks_utf8_sanitize(s, n, &m);
  j = clean ? json_stringn(clean, m) : json_string("");
  free(clean);
  return j;
}

static json_t *error_body(const char *message, const char *type, const char *param,
                          const char *code) {
  return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", jstr(message, strlen(message)),
                   "type", type, "param", param ? jstr(param, strlen(param)) : json_null(), "code",
                   code ? json_string(code) : json_null());
}

static enum MHD_Result fail(lks_http *h, struct MHD_Connection *c, unsigned status,
                            const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result fail(lks_http *h, struct MHD_Connection *c, unsigned status,
                            const char *param, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  const char *code = status == 404 && param && !strcmp(param, "model") ? "model_not_found" : NULL;
  return send_json(h, c, status, error_body(msg, type, param, code));
}

// ---- auth ----

static bool token_ok_raw(const char *got, const char *want) {
  size_t a = strlen(got), b = strlen(want);
  unsigned diff = (unsigned)(a ^ b);
  for (size_t i = 0; i < b; i++) diff |= (unsigned)(got[i < a ? i : 0] ^ want[i]);
  return diff == 0;
}

static bool token_ok(const char *header, const char *want) {
  if (!header || !want || strncmp(header, "Bearer ", 7) != 0) return false;
  const char *got = header + 7;
  size_t a = strlen(got), b = strlen(want);
  unsigned diff = (unsigned)(a ^ b);
  for (size_t i = 0; i < b; i++) diff |= (unsigned)(got[i < a ? i : 0] ^ want[i]);
  return diff == 0;
}

// ---- validation of the request body ----

typedef struct {
  const char *param;
  char msg[256];
  unsigned status;
} verr;

static bool bad(verr *e, unsigned status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool bad(verr *e, unsigned status, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  e->param = param;
  e->status = status;
  return false;
}

static bool get_number(json_t *o, const char *k, double lo, double hi, double def, double *out,
                       verr *e) {
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

static bool get_int(json_t *o, const char *k, long lo, long hi, long def, long *out, verr *e) {
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

static bool get_bool(json_t *o, const char *k, bool *out, verr *e) {
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
                         bool *stream, bool *usage_in_stream, verr *e) {
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
  if (!get_int(o, "top_k", -1, 1 << 24, 0, &tk, e)) return false;
  if (!get_int(o, "n", 1, 1, 1, &n, e)) return false;
  json_t *sv = json_object_get(o, "seed");
  bool seeded = sv && !json_is_null(sv);
  if (!get_int(o, "seed", -(1L << 53), 1L << 53, 0, &seed, e)) return false;
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
  if (!get_bool(o, "stream", stream, e)) return false;
  if (!get_bool(o, "ignore_eos", &p->ignore_eos, e)) return false;  // an extension, as vLLM's
  json_t *so = json_object_get(o, "stream_options");
  *usage_in_stream = false;
  if (so && !json_is_null(so)) {
    if (!json_is_object(so)) return bad(e, 400, "stream_options", "'stream_options' must be an object");
    if (!get_bool(so, "include_usage", usage_in_stream, e)) return false;
  }
  lks_api_err ae = {0};
  if (!lks_oai_check_unsupported(o, &ae)) return bad(e, ae.status, ae.param, "%s", ae.msg);
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
                         verr *e) {
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

static bool encode(lks_http *h, const char *text, size_t len, lks_req_params *p, verr *e) {
  if (!h->tok) return bad(e, 400, "prompt", "this model directory has no tokenizer.json: send token ids");
  if (lks_tokenizer_encode(h->tok, text, len, false, &p->prompt, &p->n_prompt) < 0)
    return bad(e, 400, "prompt", "cannot tokenize the prompt: %s", lks_last_error());
  return true;
}

static bool parse_completion(lks_http *h, json_t *o, lks_req_params *p, verr *e) {
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

static bool parse_chat(lks_http *h, json_t *o, lks_req_params *p, verr *e,
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

struct gen {
  lks_http *h;
  lks_req *req;
  struct MHD_Connection *c;
  sock *sk;
  bool chat, stream, usage, token_ids;
  char id[48];
  long created;
  atomic_bool gone;  // the client left (or the server stops): end without an answer
  // Pending output not yet handed to libmicrohttpd.
  char *out;
  size_t out_len, out_off;
  bool sent_role;
  atomic_bool finished;  // everything is produced (read by the watcher)
  size_t n_text;  // non-stream: the text so far
  char *text;
  lks_api_fmt fmt;  // when set, it writes the response (chat: api_openai.c; messages: api_anthropic.c)
};

static void gen_put(gen *g, const char *s, size_t n) {
  char *b = realloc(g->out, g->out_len + n);
  if (!b) return;
  memcpy(b + g->out_len, s, n);
  g->out = b;
  g->out_len += n;
}

static void gen_event(gen *g, json_t *j) {
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

static json_t *chunk(gen *g, const char *text, size_t len, const char *finish) {
  json_t *fr = finish ? json_string(finish) : json_null();
  json_t *choice;
  if (g->chat) {
    json_t *delta = json_object();
    if (!g->sent_role) {
      json_object_set_new(delta, "role", json_string("assistant"));
      g->sent_role = true;
    }
    if (text) json_object_set_new(delta, "content", jstr(text, len));
    choice = json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "delta", delta, "finish_reason", fr,
                       "logprobs");
  } else {
    choice = json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "text", jstr(text ? text : "", text ? len : 0),
                       "finish_reason", fr, "logprobs");
  }
  return json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", g->id, "object",
                   g->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)g->created,
                   "model", g->h->model_id, "choices", choice);
}

static void gen_sink_put(void *ctx, const char *s, size_t n) { gen_put(ctx, s, n); }

// The waker armed on the request: news arrived, let libmicrohttpd run the connection again.
static void gen_wake(void *ctx) {
  gen *g = ctx;
  MHD_resume_connection(g->c);
}

// Suspends the connection until the request has news (a stream: any; plain: its end). Only
// from the access handler or the content reader of g's connection.
static void gen_suspend(gen *g, bool until_done) {
  MHD_suspend_connection(g->c);
  if (!lks_req_arm(g->req, until_done, gen_wake, g)) MHD_resume_connection(g->c);
}

// The final JSON of a plain request that is done (n: its last news).
static void gen_final(gen *g, const lks_req_news *n) {
  json_t *choice;
  json_t *content = jstr(g->text ? g->text : "", g->n_text);
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
static int gen_take(gen *g, lks_req_news *n) {
  lks_req_read(g->req, 0, n);
  if (g->fmt.news && !n->failed) {  // a dialect writes the response (api_openai.c, api_anthropic.c)
    lks_api_sink k = {gen_sink_put, g};
    g->fmt.news(g->fmt.st, n, &k);
    if (n->done && g->stream) g->finished = true;
    return n->done ? 1 : 0;
  }
  if (n->failed) {
    if (g->stream) {  // the status is sent: the stream ends with an error event
      gen_event(g, error_body(n->error[0] ? n->error : "the model failed", "server_error", NULL, NULL));
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
  gen *g = cls;
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

static void sock_attach(lks_http *h, sock *sk, gen *g) {
  if (!sk) return;
  pthread_mutex_lock(&h->socks_mu);
  sk->g = g;
  pthread_mutex_unlock(&h->socks_mu);
}

static void gen_free(void *cls) {
  gen *g = cls;
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
static enum MHD_Result gen_respond(lks_http *h, struct MHD_Connection *c, conn *cn) {
  gen *g = cn->g;
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
    return send_json(h, c, status, error_body(n.error[0] ? n.error : "the model failed",
                                              "server_error", NULL, NULL));
  }
  if (!g->fmt.news) gen_final(g, &n);  // else the dialect's formatter wrote it
  count(h, 200);
  struct MHD_Response *r = MHD_create_response_from_buffer(g->out_len, g->out, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", "application/json");
  enum MHD_Result ok = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ok;
}

// Answers a submitted generation: a plain request once it is done (gen_respond; the connection
// owns g until then), a stream as it goes (gen_reader).
static enum MHD_Result gen_start(lks_http *h, struct MHD_Connection *c, conn *cn, gen *g,
                                 uint64_t seed) {
  atomic_fetch_add(&h->open_responses, 1);
  sock_attach(h, cn->sk, g);
  if (!g->stream) {
    cn->g = g;
    return gen_respond(h, c, cn);
  }
  struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, gen_reader, g, gen_free);
  if (!resp) {
    gen_free(g);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", "text/event-stream");
  MHD_add_response_header(resp, "Cache-Control", "no-cache");
  char sh[32];
  snprintf(sh, sizeof sh, "%llu", (unsigned long long)seed);
  MHD_add_response_header(resp, "X-Lockstep-Seed", sh);
  count(h, 200);
  enum MHD_Result rc = MHD_queue_response(c, 200, resp);
  MHD_destroy_response(resp);
  return rc;
}

static enum MHD_Result generate(lks_http *h, struct MHD_Connection *c, conn *cn, json_t *o,
                                bool chat) {
  lks_req_params p = {0};
  verr e = {0};
  bool stream = false, usage_in_stream = false;
  const json_t *tools = NULL;
  long long max_tokens = -1;
  bool ok = parse_common(h, o, &p, &max_tokens, &stream, &usage_in_stream, &e) &&
            (chat ? parse_chat(h, o, &p, &e, &tools) : parse_completion(h, o, &p, &e)) &&
            check_length(h, &p, max_tokens, chat ? -1 : 16, &e);
  if (!ok) {
    free(p.prompt);
    for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
    free(p.stop);
    return fail(h, c, e.status, e.param, "%s", e.msg);
  }
  gen *g = calloc(1, sizeof *g);
  if (!g) {
    free(p.prompt);
    for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
    free(p.stop);
    return fail(h, c, 500, NULL, "out of memory");
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
    if (err == LKS_EFULL) return fail(h, c, 429, NULL, "the request queue is full; retry later");
    return fail(h, c, 503, NULL, "the server is not accepting requests (draining or failed)");
  }
  LKS_LOG(LKS_LOG_DEBUG, "%s: %d prompt tokens, max_tokens %d, seed %llu%s", g->id, n_prompt,
          max_tok, (unsigned long long)seed, stream ? ", streamed" : "");
  if (chat && lks_oai_chat_fmt(&h->cx, g->req, tools, g->id, g->created, stream, usage_in_stream,
                               g->token_ids, &g->fmt) < 0) {
    lks_req_cancel(g->req);
    lks_req_release(g->req);
    free(g);
    return fail(h, c, 500, NULL, "out of memory");
  }
  atomic_fetch_add(&h->stats.requests[chat ? LKS_API_CHAT : LKS_API_COMPLETIONS], 1);
  return gen_start(h, c, cn, g, seed);
}

// POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API (api_anthropic.c),
// with Anthropic-shaped errors.
static enum MHD_Result anth_fail(lks_http *h, struct MHD_Connection *c, unsigned status, const char *msg) {
  return send_json(h, c, status, lks_anth_error(status, msg));
}

static enum MHD_Result messages(lks_http *h, struct MHD_Connection *c, conn *cn, json_t *o,
                                bool count_only) {
  if (!o) return anth_fail(h, c, 400, "the body must be a JSON object");
  if (!count_only && (!lks_sched_healthy(h->sched) || lks_sched_draining(h->sched)))
    return anth_fail(h, c, 503, "the server is not accepting requests (draining or failed)");
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
    if (!ok) return anth_fail(h, c, e.status, e.msg);
    atomic_fetch_add(&h->stats.requests[LKS_API_COUNT_TOKENS], 1);
    return send_json(h, c, 200, json_pack("{s:i}", "input_tokens", p.n_prompt));
  }
  gen *g = calloc(1, sizeof *g);
  if (!g) return anth_fail(h, c, 500, "out of memory");
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
    return anth_fail(h, c, 500, "out of memory");
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
    return err == LKS_EFULL ? anth_fail(h, c, 429, "the request queue is full; retry later")
                            : anth_fail(h, c, 503, "the server is not accepting requests (draining or failed)");
  }
  g->req = r;
  g->fmt = fmt;
  atomic_fetch_add(&h->stats.requests[LKS_API_MESSAGES], 1);
  return gen_start(h, c, cn, g, seed);
}

// ---- other endpoints ----

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

static enum MHD_Result metrics(lks_http *h, struct MHD_Connection *c) {
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
  count(h, 200);
  enum MHD_Result ok = send_text(c, 200, "text/plain; version=0.0.4", buf);
  free(buf);
  return ok;
}

static enum MHD_Result tokenize(lks_http *h, struct MHD_Connection *c, json_t *o, bool inverse) {
  if (!h->tok) return fail(h, c, 400, NULL, "this model directory has no tokenizer.json");
  if (!inverse) {
    json_t *pr = json_object_get(o, "prompt");
    if (!json_is_string(pr)) return fail(h, c, 400, "prompt", "'prompt' must be a string");
    int32_t *ids;
    int n;
    if (lks_tokenizer_encode(h->tok, json_string_value(pr), json_string_length(pr), false, &ids, &n) < 0)
      return fail(h, c, 400, "prompt", "%s", lks_last_error());
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    return send_json(h, c, 200, json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", n, "max_model_len", h->max_len));
  }
  json_t *toks = json_object_get(o, "tokens");
  if (!json_is_array(toks)) return fail(h, c, 400, "tokens", "'tokens' must be a list of token ids");
  size_t n = json_array_size(toks);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(toks, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= lks_tokenizer_n_ids(h->tok)) {
      free(ids);
      return fail(h, c, 400, "tokens", "tokens[%zu] is not a token id of this tokenizer", i);
    }
    ids[i] = (int32_t)json_integer_value(v);
  }
  char *text;
  size_t len;
  int rc = lks_tokenizer_decode(h->tok, ids, (int)n, false, &text, &len);
  free(ids);
  if (rc < 0) return fail(h, c, 400, "tokens", "%s", lks_last_error());
  enum MHD_Result ok = send_json(h, c, 200, json_pack("{s:s%}", "prompt", text, len));
  free(text);
  return ok;
}

static enum MHD_Result admin(lks_http *h, struct MHD_Connection *c, const char *url,
                             const char *method, json_t *o) {
  const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (!h->admin_token) return fail(h, c, 403, NULL, "the control endpoints are disabled: no --admin-token is configured");
  if (!auth) return fail(h, c, 401, NULL, "the control endpoints need 'Authorization: Bearer <token>'");
  if (!token_ok(auth, h->admin_token)) return fail(h, c, 403, NULL, "wrong admin token");
  if (!strcmp(url, "/admin/levers")) {
    if (!strcmp(method, "POST")) {
      if (!o) return fail(h, c, 400, NULL, "the body must be a JSON object");
      lks_sched_stats st;
      lks_sched_stats_get(h->sched, &st);
      bool spec = st.speculation;
      long k = st.n_drafts;
      verr e = {0};
      if (!get_int(o, "num_drafts", 0, 16, k, &k, &e) || !get_bool(o, "speculation", &spec, &e))
        return fail(h, c, 400, e.param, "%s", e.msg);
      if (!json_object_get(o, "speculation")) spec = st.speculation;
      json_t *lad = json_object_get(o, "ladder");
      if (lad && !json_is_string(lad)) return fail(h, c, 400, "ladder", "'ladder' must be a string");
      if (lks_sched_set_levers(h->sched, spec, (int)k, lad ? json_string_value(lad) : st.ladder) < 0)
        return fail(h, c, 400, "ladder", "%s", lks_last_error());
    }
    lks_sched_stats st;
    lks_sched_stats_get(h->sched, &st);
    return send_json(h, c, 200, json_pack("{s:b, s:i, s:s}", "speculation", st.speculation,
                                          "num_drafts", st.n_drafts, "ladder", st.ladder));
  }
  if (strcmp(method, "POST") != 0) return fail(h, c, 405, NULL, "use POST");
  if (!strcmp(url, "/admin/prefix-cache/clear")) {
    lks_sched_clear_cache(h->sched);
    return send_json(h, c, 200, json_pack("{s:s}", "status", "clearing at the next step"));
  }
  if (!strcmp(url, "/admin/drain")) {
    lks_sched_stop(h->sched, true);
    return send_json(h, c, 200, json_pack("{s:s}", "status", "draining"));
  }
  if (!strcmp(url, "/admin/shutdown")) {
    lks_sched_stop(h->sched, true);
    atomic_store(&h->shutdown, true);
    return send_json(h, c, 200, json_pack("{s:s}", "status", "shutting down"));
  }
  return fail(h, c, 404, NULL, "no such endpoint: %s", url);
}

// The object key whose value the parser stopped in at byte `pos` of a JSON text, if there is
// one: names the field of a value it refused (an integer beyond 64 bits, an invalid escape, NaN).
// Best effort: NULL when the text before pos is not `"key": value-so-far`.
static const char *key_before(const char *b, size_t n, size_t pos, char *out, size_t cap) {
  if (pos > n) pos = n;
  size_t i = pos;
  while (i > 0 && !strchr(":,{}[]", b[i - 1])) i--;  // back to the value's start
  if (i == 0 || b[i - 1] != ':') return NULL;
  i--;
  while (i > 0 && strchr(" \t\r\n", b[i - 1])) i--;
  if (i == 0 || b[i - 1] != '"') return NULL;
  size_t end = --i;
  while (i > 0 && !(b[i - 1] == '"' && (i < 2 || b[i - 2] != '\\'))) i--;
  if (i == 0 || end - i >= cap || end == i) return NULL;
  memcpy(out, b + i, end - i);
  out[end - i] = '\0';
  return out;
}

static enum MHD_Result route(lks_http *h, struct MHD_Connection *c, const char *url,
                             const char *method, conn *cn) {
  bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  if (cn->too_big)
    return fail(h, c, 413, NULL, "the request body exceeds %zu bytes", h->max_body);
  if (get && !strcmp(url, "/health")) {
    bool ok = lks_sched_healthy(h->sched) && !lks_sched_draining(h->sched);
    return send_json(h, c, ok ? 200 : 503, json_pack("{s:s, s:i}", "status", ok ? "ok" :
                     lks_sched_healthy(h->sched) ? "draining" : "failed", "world", h->w->world));
  }
  if (get && !strcmp(url, "/metrics")) return metrics(h, c);
  json_t *o = NULL;
  bool anth = !strcmp(url, "/v1/messages") || !strcmp(url, "/v1/messages/count_tokens");
  if (post && cn->len) {
    json_error_t je;
    o = json_loadb(cn->body, cn->len, JSON_REJECT_DUPLICATES, &je);
    if (!o && anth) return anth_fail(h, c, 400, "the body is not valid JSON");
    if (!o) {
      char key[64];
      const char *param = key_before(cn->body, cn->len, (size_t)je.position, key, sizeof key);
      return fail(h, c, 400, param, "the body is not valid JSON: %s (at byte %d%s%s)", je.text,
                  je.position, param ? ", the value of " : "", param ? param : "");
    }
    if (!json_is_object(o)) {
      json_decref(o);
      return anth ? anth_fail(h, c, 400, "the body must be a JSON object")
                  : fail(h, c, 400, NULL, "the body must be a JSON object");
    }
  }
  // The API key: 'Authorization: Bearer KEY' (OpenAI clients) or 'x-api-key: KEY' (Anthropic's).
  const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
  bool key_ok = !h->api_key ||
                token_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"), h->api_key) ||
                (xkey && strlen(xkey) == strlen(h->api_key) && token_ok_raw(xkey, h->api_key));
  enum MHD_Result rc;
  if (!strncmp(url, "/admin/", 7)) {
    rc = admin(h, c, url, method, o);
  } else if (!strncmp(url, "/v1/", 4) && !key_ok) {
    rc = anth ? anth_fail(h, c, 401, "a valid API key is required ('x-api-key: <key>')")
              : fail(h, c, 401, NULL, "a valid API key is required ('Authorization: Bearer <key>')");
  } else if (post && anth) {
    rc = messages(h, c, cn, o, url[12] == '/');
  } else if (get && !strncmp(url, "/v1/models/", 11)) {
    rc = strcmp(url + 11, h->model_id) ? fail(h, c, 404, "model", "The model '%s' does not exist", url + 11)
         : send_json(h, c, 200, json_pack("{s:s, s:s, s:i, s:s, s:i}", "id", h->model_id, "object", "model",
                                          "created", 0, "owned_by", "lockstep", "max_model_len", h->max_len));
  } else if (get && !strcmp(url, "/v1/models")) {
    rc = send_json(h, c, 200, json_pack("{s:s, s:[{s:s, s:s, s:i, s:s, s:i}]}", "object", "list", "data",
                                        "id", h->model_id, "object", "model", "created", 0, "owned_by",
                                        "lockstep", "max_model_len", h->max_len));
  } else if (post && (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions"))) {
    if (!o) rc = fail(h, c, 400, NULL, "the body must be a JSON object");
    else if (!lks_sched_healthy(h->sched) || lks_sched_draining(h->sched))
      rc = fail(h, c, 503, NULL, "the server is not accepting requests (draining or failed)");
    else rc = generate(h, c, cn, o, url[4] == 'c' && url[5] == 'h');
  } else if (post && (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize"))) {
    rc = o ? tokenize(h, c, o, url[1] == 'd') : fail(h, c, 400, NULL, "the body must be a JSON object");
  } else if (!strcmp(url, "/v1/models") || !strcmp(url, "/v1/completions") ||
             !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/health") ||
             !strcmp(url, "/metrics") || !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
    rc = fail(h, c, 405, NULL, "method %s is not allowed on %s", method, url);
  } else {
    rc = fail(h, c, 404, NULL, "no such endpoint: %s", url);
  }
  json_decref(o);
  return rc;
}

static double now_s(void) { return lks_clock(); }

// The request line arrived (libmicrohttpd's URI log callback): the conn starts here, and the
// clock of --request-timeout with it.
static void *request_begins(void *cls, const char *uri, struct MHD_Connection *c) {
  (void)uri;
  lks_http *h = cls;
  conn *cn = calloc(1, sizeof *cn);
  if (!cn) return NULL;
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  cn->sk = ci ? ci->socket_context : NULL;
  if (cn->sk) {
    pthread_mutex_lock(&h->socks_mu);
    cn->sk->t_request = now_s();
    cn->sk->handling = false;
    pthread_mutex_unlock(&h->socks_mu);
  }
  return cn;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
  (void)version;
  lks_http *h = cls;
  conn *cn = *con_cls;
  if (!cn) return MHD_NO;  // out of memory in request_begins
  if (cn->g) return gen_respond(h, c, cn);  // a plain generation's connection resumed
  if (!cn->headers_seen) {  // the headers are in; the body (if any) comes next
    cn->headers_seen = true;
    return MHD_YES;
  }
  if (*upload_size) {
    if (!cn->too_big && cn->len + *upload_size <= h->max_body) {
      if (cn->len + *upload_size > cn->cap) {
        size_t cap = (cn->len + *upload_size) * 2;
        if (cap > h->max_body) cap = h->max_body;
        char *b = realloc(cn->body, cap);
        if (!b) return MHD_NO;
        cn->body = b;
        cn->cap = cap;
      }
      memcpy(cn->body + cn->len, upload, *upload_size);
      cn->len += *upload_size;
    } else {
      cn->too_big = true;  // keep reading, drop the bytes, answer 413 at the end
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (cn->sk) {
    pthread_mutex_lock(&h->socks_mu);
    bool late = cn->sk->t_request > 0 && now_s() - cn->sk->t_request > h->request_timeout;
    cn->sk->handling = true;
    pthread_mutex_unlock(&h->socks_mu);
    if (late) return fail(h, c, 408, NULL, "the request took longer than %.0f s to arrive", h->request_timeout);
  }
  return route(h, c, url, method, cn);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  (void)c, (void)toe;
  lks_http *h = cls;
  conn *cn = *con_cls;
  if (cn) {
    if (cn->sk) {
      pthread_mutex_lock(&h->socks_mu);
      cn->sk->t_request = 0;
      cn->sk->handling = false;
      pthread_mutex_unlock(&h->socks_mu);
    }
    gen_free(cn->g);
    free(cn->body);
    free(cn);
  }
  *con_cls = NULL;
}

// Sockets opening and closing (MHD_OPTION_NOTIFY_CONNECTION): the watcher's list.
static void sock_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code) {
  lks_http *h = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    sock *sk = calloc(1, sizeof *sk);
    if (!sk) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    sk->fd = ci ? ci->connect_fd : -1;
    sk->c = c;
    pthread_mutex_lock(&h->socks_mu);
    sk->next = h->socks;
    if (h->socks) h->socks->prev = sk;
    h->socks = sk;
    pthread_mutex_unlock(&h->socks_mu);
    *socket_context = sk;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    sock *sk = *socket_context;
    if (!sk) return;
    pthread_mutex_lock(&h->socks_mu);
    if (sk->prev) sk->prev->next = sk->next;
    else h->socks = sk->next;
    if (sk->next) sk->next->prev = sk->prev;
    if (sk->g) sk->g->sk = NULL;
    pthread_mutex_unlock(&h->socks_mu);
    free(sk);
    *socket_context = NULL;
  }
}

// Whether the peer closed (or reset) the socket; data waiting to be read is not a close.
static bool peer_closed(int fd) {
  struct pollfd pf = {fd, POLLRDHUP, 0};
  return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// Ends a waiting generation whose client is gone (under socks_mu): the request is cancelled
// (its slot is free at the scheduler's next step) and the connection, if suspended, resumed so
// that libmicrohttpd closes it.
static void gen_abandon(gen *g) {
  atomic_store(&g->gone, true);
  lks_req_cancel(g->req);
  if (lks_req_disarm(g->req)) MHD_resume_connection(g->c);
}

static void *watch_main(void *arg) {
  lks_http *h = arg;
  while (!atomic_load(&h->stopping)) {
    double t = now_s();
    pthread_mutex_lock(&h->socks_mu);
    for (sock *sk = h->socks; sk; sk = sk->next) {
      gen *g = sk->g;
      if (g && !atomic_load(&g->finished)) {
        // Once gone, again at every pass: a reader may have armed a waker since.
        bool gone = atomic_load(&g->gone);
        if (!gone && peer_closed(sk->fd))
          LKS_LOG(LKS_LOG_INFO, "%s: the client closed its connection; cancelling", g->id);
        if (gone || peer_closed(sk->fd)) gen_abandon(g);
      } else if (!sk->handling && sk->t_request > 0 && t - sk->t_request > h->request_timeout) {
        LKS_LOG(LKS_LOG_INFO, "a client took over %.0f s to send its request: disconnected", h->request_timeout);
        shutdown(sk->fd, SHUT_RDWR);  // libmicrohttpd sees the end and closes the connection
        sk->t_request = 0;
      }
    }
    pthread_mutex_unlock(&h->socks_mu);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static int read_token_file(const char *path, char **out) {
  FILE *f = fopen(path, "r");
  if (!f) return lks_set_error(LKS_EIO, "--admin-token-file %s: cannot open", path);
  char *line = NULL;
  size_t cap = 0;
  ssize_t k = getline(&line, &cap, f);
  fclose(f);
  if (k < 0) {
    free(line);
    return lks_set_error(LKS_EINVAL, "--admin-token-file %s: empty", path);
  }
  line[strcspn(line, "\r\n")] = '\0';
  if (strlen(line) < 8) {
    free(line);
    return lks_set_error(LKS_EINVAL, "--admin-token-file %s: the token is shorter than 8 characters", path);
  }
  *out = line;
  return 0;
}

// libmicrohttpd's own messages (a client that left mid-request, ...): debug lines of our log.
static void mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  if (lks__log_level < LKS_LOG_DEBUG) return;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = '\0';
  LKS_LOG(LKS_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

// The listening socket, made here so that a failure names the address and the reason.
static int listen_on(const char *bind_addr, long port, int *fd_out) {
  struct sockaddr_in addr = {0};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, bind_addr, &addr.sin_addr) != 1)
    return lks_set_error(LKS_EINVAL, "--bind '%s' is not an IPv4 address", bind_addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return lks_set_error(LKS_EIO, "socket: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 1024) != 0) {
    int e = errno;
    close(fd);
    return lks_set_error(LKS_EIO, "cannot serve HTTP on %s:%ld: %s%s", bind_addr, port, strerror(e),
                         e == EADDRINUSE ? " (another process listens on that port; pick another "
                                           "with --port)" : "");
  }
  *fd_out = fd;
  return 0;
}

// Connections fit the file descriptor limit (raised to its hard maximum), with room for the
// model's files, MPI and ZeroMQ.
static unsigned conn_limit(long want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return (unsigned)want;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  long room = rl.rlim_cur == RLIM_INFINITY ? want : (long)rl.rlim_cur - 128;
  if (room < 16) room = 16;
  if (want > room) {
    LKS_LOG(LKS_LOG_WARN, "--max-connections %ld: the file descriptor limit (%ld) allows %ld", want,
            (long)rl.rlim_cur, room);
    return (unsigned)room;
  }
  return (unsigned)want;
}

lks_http *lks_http_start(const lks_settings *s, lks_sched *sched, lks_world *w,
                         const lks_tokenizer *tok, const char *model_id) {
  // Request bodies and responses of up to --max-body bytes come and go on several threads: with
  // glibc's sliding mmap threshold they would settle in per-thread arenas that never shrink.
  // A fixed threshold returns them to the system when freed.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  lks_http *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  int lfd = -1;
  h->sched = sched;
  h->w = w;
  h->tok = tok;
  h->max_body = (size_t)lks_settings_int(s, "max-body");
  h->max_len = (int)lks_settings_int(s, "max-seq-len");
  h->request_timeout = lks_settings_float(s, "request-timeout");
  pthread_mutex_init(&h->mu, NULL);
  pthread_mutex_init(&h->socks_mu, NULL);
  snprintf(h->model_id, sizeof h->model_id, "%s", model_id);
  snprintf(h->fingerprint, sizeof h->fingerprint, "fp_%s", lks_build_id());
  h->cx = (lks_api_ctx){.tok = tok, .model_id = h->model_id, .max_len = h->max_len,
                        .no_think = lks_settings_bool(s, "no-think"),
                        .fingerprint = h->fingerprint, .stats = &h->stats};
  const char *key = lks_settings_str(s, "api-key"), *tokn = lks_settings_str(s, "admin-token"),
             *tokf = lks_settings_str(s, "admin-token-file");
  if (key && !(h->api_key = strdup(key))) goto fail;
  if (tokn) {
    if (strlen(tokn) < 8) {
      lks_set_error(LKS_EINVAL, "--admin-token is shorter than 8 characters");
      goto fail;
    }
    if (!(h->admin_token = strdup(tokn))) goto fail;
  } else if (tokf && read_token_file(tokf, &h->admin_token) < 0) {
    goto fail;
  }
  const char *bind_addr = lks_settings_str(s, "bind");
  long port = lks_settings_int(s, "port");
  if (listen_on(bind_addr, port, &lfd) < 0) goto fail;
  unsigned max_conns = conn_limit(lks_settings_int(s, "max-connections"));
  unsigned threads = (unsigned)lks_settings_int(s, "http-threads");
  if (max_conns < threads * 4) max_conns = threads * 4;
  h->d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
                          (uint16_t)port, NULL, NULL, handler, h,
                          MHD_OPTION_LISTEN_SOCKET, (MHD_socket)lfd,
                          MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
                          MHD_OPTION_THREAD_POOL_SIZE, threads,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)lks_settings_float(s, "idle-timeout"),
                          MHD_OPTION_CONNECTION_LIMIT, max_conns,
                          MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)lks_settings_int(s, "max-conns-per-client"),
                          MHD_OPTION_URI_LOG_CALLBACK, request_begins, h,
                          MHD_OPTION_NOTIFY_COMPLETED, completed, h,
                          MHD_OPTION_NOTIFY_CONNECTION, sock_notify, h, MHD_OPTION_END);
  if (!h->d) {
    lks_set_error(LKS_EIO, "cannot start the HTTP server on %s:%ld", bind_addr, port);
    goto fail;
  }
  lfd = -1;  // libmicrohttpd's now
  if (pthread_create(&h->watcher, NULL, watch_main, h) != 0) {
    lks_set_error(LKS_EIO, "cannot start the HTTP watcher thread");
    goto fail;
  }
  h->watching = true;
  LKS_LOG(LKS_LOG_INFO, "serving %s on http://%s:%ld (%d rank%s; %u HTTP threads, %u connections)",
          h->model_id, bind_addr, port, w->world, w->world > 1 ? "s" : "", threads, max_conns);
  return h;
fail:
  if (h->d) MHD_stop_daemon(h->d);
  if (lfd >= 0) close(lfd);
  pthread_mutex_destroy(&h->mu);
  pthread_mutex_destroy(&h->socks_mu);
  free(h->api_key);
  free(h->admin_token);
  free(h);
  return NULL;
}

void lks_http_stop(lks_http *h) {
  if (!h) return;
  // Responses of requests that finished are still being written out: let them end (at most
  // 10 s) before the connections close. Generations whose request will never finish (the
  // scheduler has stopped) are ended, so that no connection stays suspended.
  for (int i = 0; i < 200 && atomic_load(&h->open_responses) > 0; i++) {
    pthread_mutex_lock(&h->socks_mu);
    for (sock *sk = h->socks; sk; sk = sk->next)
      if (sk->g && !atomic_load(&sk->g->finished) && !lks_req_finished(sk->g->req)) gen_abandon(sk->g);
    pthread_mutex_unlock(&h->socks_mu);
    usleep(50000);
  }
  if (atomic_load(&h->open_responses) > 0)
    LKS_LOG(LKS_LOG_WARN, "HTTP: %d response(s) still open at shutdown", atomic_load(&h->open_responses));
  atomic_store(&h->stopping, true);
  if (h->watching) pthread_join(h->watcher, NULL);
  MHD_stop_daemon(h->d);
  pthread_mutex_destroy(&h->mu);
  pthread_mutex_destroy(&h->socks_mu);
  free(h->api_key);
  free(h->admin_token);
  free(h);
}

bool lks_http_shutdown_requested(const lks_http *h) { return atomic_load(&h->shutdown); }
