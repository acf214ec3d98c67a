// SPDX-License-Identifier: MIT
// OpenAI chat completions: the conversation in, the parsed response out (see api_openai.h), and
// the helpers of api.h that every dialect uses.
#include "coordinator/api_openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/toolcall.h"

const char *const lks_api_names[LKS_API_N] = {"completions", "chat_completions", "messages",
                                              "count_tokens"};

bool lks_api_bad(lks_api_err *e, unsigned status, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  e->status = status;
  e->param = param;
  return false;
}

void lks_api_put_json(const lks_api_sink *k, json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(j);
  if (!s) return;
  k->put(k->ctx, s, strlen(s));
  free(s);
}

void lks_api_put_sse(const lks_api_sink *k, const char *event, json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s) return;
  if (event) {
    k->put(k->ctx, "event: ", 7);
    k->put(k->ctx, event, strlen(event));
    k->put(k->ctx, "\n", 1);
  }
  k->put(k->ctx, "data: ", 6);
  k->put(k->ctx, s, strlen(s));
  k->put(k->ctx, "\n\n", 2);
  free(s);
}

// ---- the request ----

bool lks_oai_chat_prepare(const lks_api_ctx *cx, const json_t *body, json_t **messages,
                          const json_t **tools, int *think, bool *parse_tools, lks_api_err *e) {
  *messages = NULL;
  *tools = NULL;
  *parse_tools = false;
  const json_t *t = json_object_get(body, "tools");
  if (t && !json_is_null(t)) {
    if (!json_is_array(t)) return lks_api_bad(e, 400, "tools", "'tools' must be a list");
    size_t i;
    const json_t *x;
    json_array_foreach(t, i, x) {
      const json_t *f = json_object_get(x, "function");
      if (!json_is_object(x) || !json_is_object(f) || !json_is_string(json_object_get(f, "name")))
        return lks_api_bad(e, 400, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": "
                           "{\"name\": ..., \"parameters\": {...}}}", i);
      const json_t *ty = json_object_get(x, "type");
      if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "function")))
        return lks_api_bad(e, 400, "tools", "tools[%zu].type must be \"function\"", i);
    }
    if (json_array_size(t)) *tools = t;
  }
  const json_t *tc = json_object_get(body, "tool_choice");
  bool none = false;
  if (tc && !json_is_null(tc)) {
    if (json_is_string(tc) && !strcmp(json_string_value(tc), "none")) none = true;
    else if (json_is_string(tc) && !strcmp(json_string_value(tc), "auto")) none = false;
    else if (json_is_string(tc) && !strcmp(json_string_value(tc), "required"))
      return lks_api_bad(e, 400, "tool_choice", "'tool_choice': \"required\" is not supported (the "
                         "output is not constrained to a tool call); use \"auto\" or \"none\"");
    else if (json_is_object(tc))
      return lks_api_bad(e, 400, "tool_choice", "'tool_choice' naming a function is not supported "
                         "(the output is not constrained to a tool call); use \"auto\" or \"none\"");
    else
      return lks_api_bad(e, 400, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" "
                         "or {\"type\": \"function\", ...}");
  }
  *parse_tools = *tools && !none;
  const json_t *pt = json_object_get(body, "parallel_tool_calls");
  if (pt && !json_is_null(pt) && !json_is_boolean(pt))
    return lks_api_bad(e, 400, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");

  *think = cx->no_think ? 0 : -1;
  const json_t *ctk = json_object_get(body, "chat_template_kwargs");
  if (ctk && !json_is_null(ctk)) {
    if (!json_is_object(ctk)) return lks_api_bad(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    const json_t *et = json_object_get(ctk, "enable_thinking");
    if (et && !json_is_boolean(et))
      return lks_api_bad(e, 400, "chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be true or false");
    if (et) *think = json_is_true(et);
  }

  json_t *out = json_array();
  const json_t *msgs = json_object_get(body, "messages");
  size_t i;
  const json_t *m;
  json_array_foreach(msgs, i, m) {
    json_t *c = json_deep_copy(m);
    if (!c) goto oom;
    json_array_append_new(out, c);
    const char *role = json_string_value(json_object_get(c, "role"));
    if (role && !strcmp(role, "developer")) json_object_set_new(c, "role", json_string("system"));
    json_t *calls = json_object_get(c, "tool_calls");
    if (!calls || json_is_null(calls)) continue;
    if (!json_is_array(calls))
      return json_decref(out), lks_api_bad(e, 400, "messages", "messages[%zu].tool_calls must be a list", i);
    size_t j;
    json_t *call;
    json_array_foreach(calls, j, call) {
      json_t *f = json_object_get(call, "function");
      if (!json_is_object(f) || !json_is_string(json_object_get(f, "name"))) {
        json_decref(out);
        return lks_api_bad(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.name must be a string", i, j);
      }
      json_t *a = json_object_get(f, "arguments");
      if (json_is_string(a)) {
        json_t *o = json_string_length(a) ? json_loads(json_string_value(a), 0, NULL) : json_object();
        if (!json_is_object(o)) {
          json_decref(o);
          json_decref(out);
          return lks_api_bad(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments must "
                             "be a JSON object (as text or as an object)", i, j);
        }
        json_object_set_new(f, "arguments", o);
      } else if (a && !json_is_null(a) && !json_is_object(a)) {
        json_decref(out);
        return lks_api_bad(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments must "
                           "be a JSON object (as text or as an object)", i, j);
      }
    }
  }
  *messages = out;
  return true;
oom:
  json_decref(out);
  return lks_api_bad(e, 500, NULL, "out of memory");
}

bool lks_oai_response_format(const json_t *body, bool *json_object, lks_api_err *e) {
  *json_object = false;
  const json_t *rf = json_object_get(body, "response_format");
  if (!rf || json_is_null(rf)) return true;
  const char *ty = json_string_value(json_object_get(rf, "type"));
  if (!json_is_object(rf) || !ty)
    return lks_api_bad(e, 400, "response_format", "'response_format' must be {\"type\": \"text\"} "
                       "or {\"type\": \"json_object\"}");
  if (!strcmp(ty, "text")) return true;
  if (!strcmp(ty, "json_object")) {
    *json_object = true;
    return true;
  }
  if (!strcmp(ty, "json_schema"))
    return lks_api_bad(e, 400, "response_format", "'response_format' {\"type\": \"json_schema\"} is "
                       "not supported: the output can be constrained to any JSON object "
                       "({\"type\": \"json_object\"}), not to a schema");
  return lks_api_bad(e, 400, "response_format", "'response_format' {\"type\": \"%.100s\"} is not "
                     "supported; use \"text\" or \"json_object\"", ty);
}

// ---- log-probabilities ----

// A token's text (invalid UTF-8 as U+FFFD) and its bytes.
static void token_text(const lks_tokenizer *tok, int32_t id, json_t **text, json_t **bytes) {
  size_t n = 0;
  const char *b = tok ? lks_tokenizer_token_bytes(tok, id, &n) : NULL;
  if (!b) {
    char t[32];
    snprintf(t, sizeof t, "token_id:%d", (int)id);
    *text = json_string(t);
    if (bytes) *bytes = json_array();
    return;
  }
  size_t m = 0;
  char *u = lks_utf8_sanitize(b, n, &m);
  *text = u ? json_stringn(u, m) : json_string("");
  free(u);
  if (!bytes) return;
  *bytes = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)b[i]));
}

// A log-probability as JSON: -9999 stands for minus infinity (as vLLM writes it).
static json_t *jlp(float x) { return json_real(isfinite(x) ? (double)x : -9999.0); }

json_t *lks_oai_logprobs_chat(const lks_tokenizer *tok, const int32_t *ids,
                              const lks_tok_logprob *lp, int n) {
  json_t *out = json_array();
  for (int i = 0; i < n; i++) {
    json_t *t, *b, *top = json_array();
    for (int j = 0; j < lp[i].n_top; j++) {
      json_t *tt, *tb;
      token_text(tok, lp[i].top_id[j], &tt, &tb);
      json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token", tt, "logprob",
                                           jlp(lp[i].top_lp[j]), "bytes", tb));
    }
    token_text(tok, ids[i], &t, &b);
    json_array_append_new(out, json_pack("{s:o, s:o, s:o, s:o}", "token", t, "logprob",
                                         jlp(lp[i].lp), "bytes", b, "top_logprobs", top));
  }
  return out;
}

void lks_oai_logprobs_legacy(const lks_tokenizer *tok, const int32_t *ids,
                             const lks_tok_logprob *lp, int n, json_t **legacy, long *text_off) {
  if (!*legacy)
    *legacy = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                        "text_offset");
  json_t *L = *legacy;
  for (int i = 0; i < n; i++) {
    json_t *t;
    token_text(tok, ids[i], &t, NULL);
    size_t len = json_string_length(t);
    json_array_append_new(json_object_get(L, "tokens"), t);
    json_array_append_new(json_object_get(L, "token_logprobs"), jlp(lp[i].lp));
    json_t *top = json_object();
    for (int j = 0; j < lp[i].n_top; j++) {
      json_t *tt;
      token_text(tok, lp[i].top_id[j], &tt, NULL);
      if (!json_object_get(top, json_string_value(tt)))
        json_object_set_new(top, json_string_value(tt), jlp(lp[i].top_lp[j]));
      json_decref(tt);
    }
    json_array_append_new(json_object_get(L, "top_logprobs"), top);
    json_array_append_new(json_object_get(L, "text_offset"), json_integer(*text_off));
    *text_off += (long)len;
  }
}

// ---- the response ----

typedef struct {
  char *p;
  size_t n, cap;
} sbuf;

static void sbuf_put(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

typedef struct {
  lks_api_ctx cx;
  lks_req *req;
  json_t *tools;
  lks_glm_parser *parser;
  char id[48];
  long created;
  bool stream, usage, token_ids, sent_role;
  lks_oai_choice choice;
  int n_gen;    // tokens generated as of the news being written
  int lp_sent;  // tokens whose reports a chunk has carried
  const lks_api_sink *out;  // during news()
  sbuf content, reasoning;
  json_t *calls;  // OpenAI tool_calls
} chat;

static json_t *envelope(chat *c, const char *object) {
  return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", c->id, "object", object, "created",
                   (json_int_t)c->created, "model", c->cx.model_id, "system_fingerprint",
                   c->cx.fingerprint ? c->cx.fingerprint : "lockstep");
}

// The reports of tokens [from, to) as choices[].logprobs (null without logprobs).
static json_t *chat_logprobs(chat *c, int from, int to) {
  if (!c->choice.logprobs) return json_null();
  lks_tok_logprob *lp = NULL;
  int32_t *ids = NULL;
  int n = lks_req_logprobs(c->req, from, to, &lp);
  int k = lks_req_tokens(c->req, &ids);
  if (n > k - from) n = k - from > 0 ? k - from : 0;
  json_t *content = lks_oai_logprobs_chat(c->cx.tok, ids + from, lp, n);
  free(lp);
  free(ids);
  return json_pack("{s:o}", "content", content);
}

static void put_chunk(chat *c, json_t *delta, const char *finish) {
  json_t *j = envelope(c, "chat.completion.chunk");
  // Each chunk carries the reports of the tokens generated since the last one that did.
  json_t *lp = c->choice.logprobs && c->n_gen > c->lp_sent ? chat_logprobs(c, c->lp_sent, c->n_gen)
                                                            : json_null();
  if (c->n_gen > c->lp_sent) c->lp_sent = c->n_gen;
  json_object_set_new(j, "choices", json_pack("[{s:i, s:o, s:o, s:o}]", "index", c->choice.index,
                                              "delta", delta, "logprobs", lp, "finish_reason",
                                              finish ? json_string(finish) : json_null()));
  if (c->usage) json_object_set_new(j, "usage", json_null());
  lks_api_put_sse(c->out, NULL, j);
}

static void on_event(void *ctx, const lks_glm_event *ev) {
  chat *c = ctx;
  json_t *delta = json_object();
  if (!c->sent_role) {
    json_object_set_new(delta, "role", json_string("assistant"));
    c->sent_role = true;
  }
  if (ev->kind == LKS_GLM_TOOL_CALL) {
    char id[96];
    snprintf(id, sizeof id, "call_%s_%zu", c->id, json_array_size(c->calls));
    json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                             "name", ev->name, "arguments", ev->args_json);
    json_array_append(c->calls, call);
    atomic_fetch_add(&c->cx.stats->tool_calls, 1);
    json_t *d = json_deep_copy(call);  // the delta's copy carries its index
    json_decref(call);
    json_object_set_new(d, "index", json_integer((json_int_t)json_array_size(c->calls) - 1));
    json_object_set_new(delta, "tool_calls", json_pack("[o]", d));
  } else if (ev->kind == LKS_GLM_REASONING) {
    sbuf_put(&c->reasoning, ev->text, ev->len);
    json_object_set_new(delta, "reasoning_content", json_stringn(ev->text, ev->len));
    json_object_set_new(delta, "reasoning", json_stringn(ev->text, ev->len));
  } else {
    sbuf_put(&c->content, ev->text, ev->len);
    json_object_set_new(delta, "content", json_stringn(ev->text, ev->len));
  }
  if (c->stream) put_chunk(c, delta, NULL);
  else json_decref(delta);
}

json_t *lks_oai_usage(const lks_req_news *n) {
  return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", n->n_prompt, "completion_tokens",
                   n->n_generated, "total_tokens", n->n_prompt + n->n_generated,
                   "prompt_tokens_details", "cached_tokens", n->n_cached);
}

static void count_reasoning(chat *c) {
  if (!c->reasoning.n || !c->cx.tok) return;
  int32_t *ids;
  int n;
  if (lks_tokenizer_encode(c->cx.tok, c->reasoning.p, c->reasoning.n, false, &ids, &n) == 0) {
    atomic_fetch_add(&c->cx.stats->reasoning_tokens, (unsigned long long)n);
    free(ids);
  }
}

static void chat_news(void *st, const lks_req_news *n, const lks_api_sink *out) {
  chat *c = st;
  c->out = out;
  if (n->failed) {
    json_t *err = json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message",
                            n->error[0] ? n->error : "the model failed", "type", "server_error",
                            "param", "code");
    if (c->stream) lks_api_put_sse(out, NULL, err);
    else lks_api_put_json(out, err);
    return;
  }
  c->n_gen = n->n_generated;
  if (n->len) lks_glm_parser_feed(c->parser, n->text, n->len, on_event, c);
  if (c->stream && !c->sent_role) {  // the first chunk says who speaks, at once
    c->sent_role = true;
    put_chunk(c, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL);
  }
  if (!n->done) return;
  lks_glm_parser_end(c->parser, on_event, c);
  count_reasoning(c);
  const char *finish = n->finish_reason ? n->finish_reason : "stop";
  if (json_array_size(c->calls) && !strcmp(finish, "stop")) finish = "tool_calls";
  if (c->stream) {
    put_chunk(c, json_object(), finish);
    if (c->choice.part) return;
    if (c->usage) {
      json_t *u = envelope(c, "chat.completion.chunk");
      json_object_set_new(u, "choices", json_array());
      json_object_set_new(u, "usage", lks_oai_usage(n));
      lks_api_put_sse(out, NULL, u);
    }
    out->put(out->ctx, "data: [DONE]\n\n", 14);
    return;
  }
  json_t *msg = json_pack("{s:s}", "role", "assistant");
  bool calls = json_array_size(c->calls) > 0;
  json_object_set_new(msg, "content", c->content.n || !calls ? json_stringn(c->content.p ? c->content.p : "", c->content.n)
                                                             : json_null());
  json_t *r = c->reasoning.n ? json_stringn(c->reasoning.p, c->reasoning.n) : json_null();
  json_object_set(msg, "reasoning_content", r);
  json_object_set_new(msg, "reasoning", r);
  if (calls) json_object_set(msg, "tool_calls", c->calls);
  json_t *choice = json_pack("{s:i, s:o, s:o, s:s}", "index", c->choice.index, "message", msg,
                             "logprobs", chat_logprobs(c, 0, n->n_generated), "finish_reason",
                             finish);
  if (c->token_ids) {
    int32_t *ids;
    int k = lks_req_tokens(c->req, &ids);
    json_t *arr = json_array();
    for (int i = 0; i < k; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    json_object_set_new(choice, "token_ids", arr);
  }
  json_t *j = envelope(c, "chat.completion");
  json_object_set_new(j, "choices", json_pack("[o]", choice));
  json_object_set_new(j, "usage", lks_oai_usage(n));
  lks_api_put_json(out, j);
}

static void chat_free(void *st) {
  chat *c = st;
  if (!c) return;
  lks_glm_parser_free(c->parser);
  json_decref(c->tools);
  json_decref(c->calls);
  free(c->content.p);
  free(c->reasoning.p);
  free(c);
}

int lks_oai_chat_fmt(const lks_api_ctx *cx, lks_req *r, const json_t *tools, const char *id,
                     long created, bool stream, bool include_usage, bool token_ids,
                     const lks_oai_choice *choice, lks_api_fmt *out) {
  chat *c = calloc(1, sizeof *c);
  if (!c) return lks_set_error(LKS_ENOMEM, "out of memory");
  c->cx = *cx;
  c->req = r;
  c->tools = tools ? json_deep_copy(tools) : NULL;
  c->parser = lks_glm_parser_new(c->tools);
  c->calls = json_array();
  snprintf(c->id, sizeof c->id, "%s", id);
  c->created = created;
  c->stream = stream;
  c->usage = include_usage;
  c->token_ids = token_ids;
  if (choice) c->choice = *choice;
  if (!c->parser || !c->calls || (tools && !c->tools)) {
    chat_free(c);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  *out = (lks_api_fmt){.st = c, .news = chat_news, .free = chat_free};
  return 0;
}
