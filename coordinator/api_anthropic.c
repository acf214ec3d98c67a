// SPDX-License-Identifier: MIT
// The Anthropic Messages API (see api_anthropic.h): requests become the OpenAI-style
// conversation the GLM template reads (text/chat.h); the output goes through the GLM parser
// (text/toolcall.h) into content blocks.
#include "coordinator/api_anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "text/chat.h"
#include "text/toolcall.h"

json_t *lks_anth_error(unsigned status, const char *msg) {
  const char *type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 || status == 529 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", msg);
}

// ---- the request ----

static bool str_type(const json_t *b, const char *t) {
  const char *s = json_string_value(json_object_get(b, "type"));
  return s && !strcmp(s, t);
}

// The text of a content value: a string, or the text blocks of a list (other blocks: *other).
static bool block_text(const json_t *c, json_t *into, const char *what, lks_api_err *e) {
  if (json_is_string(c)) {
    json_array_append_new(into, json_pack("{s:s, s:O}", "type", "text", "text", c));
    return true;
  }
  if (!json_is_array(c)) return lks_api_bad(e, 400, "messages", "%s must be a string or a list of blocks", what);
  size_t i;
  const json_t *b;
  json_array_foreach(c, i, b) {
    const char *ty = json_string_value(json_object_get(b, "type"));
    if (!ty) return lks_api_bad(e, 400, "messages", "%s[%zu] has no type", what, i);
    if (!strcmp(ty, "text")) {
      if (!json_is_string(json_object_get(b, "text")))
        return lks_api_bad(e, 400, "messages", "%s[%zu].text must be a string", what, i);
      json_array_append_new(into, json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(b, "text")));
    } else if (!strcmp(ty, "image") || !strcmp(ty, "document")) {
      return lks_api_bad(e, 400, "messages", "%s[%zu]: %s blocks are not supported (the model reads text)", what, i, ty);
    }
  }
  return true;
}

static json_t *convert_tools(const json_t *tools, lks_api_err *e) {
  json_t *out = json_array();
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *name = json_object_get(t, "name");
    if (!json_is_object(t) || !json_is_string(name)) {
      json_decref(out);
      lks_api_bad(e, 400, "tools", "tools[%zu] must be {\"name\", \"description\", \"input_schema\"}", i);
      return NULL;
    }
    const json_t *schema = json_object_get(t, "input_schema");
    json_t *f = json_pack("{s:O}", "name", name);
    if (json_is_string(json_object_get(t, "description"))) json_object_set(f, "description", json_object_get(t, "description"));
    json_object_set_new(f, "parameters", schema ? json_deep_copy(schema) : json_pack("{s:s}", "type", "object"));
    json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f));
  }
  return out;
}

// The conversation for the GLM template.
static json_t *convert_messages(const json_t *body, lks_api_err *e) {
  json_t *out = json_array();
  const json_t *sys = json_object_get(body, "system");
  if (sys && !json_is_null(sys)) {
    json_t *parts = json_array();
    if (!block_text(sys, parts, "system", e)) goto fail_parts;
    json_array_append_new(out, json_pack("{s:s, s:o}", "role", "system", "content", parts));
  }
  const json_t *msgs = json_object_get(body, "messages");
  if (!json_is_array(msgs) || !json_array_size(msgs)) {
    lks_api_bad(e, 400, "messages", "'messages' must be a non-empty list");
    goto fail;
  }
  size_t i;
  const json_t *m;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *c = json_object_get(m, "content");
    char what[48];
    snprintf(what, sizeof what, "messages[%zu].content", i);
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
      lks_api_bad(e, 400, "messages", "messages[%zu].role must be \"user\" or \"assistant\"", i);
      goto fail;
    }
    if (!json_is_string(c) && !json_is_array(c)) {
      lks_api_bad(e, 400, "messages", "%s must be a string or a list of blocks", what);
      goto fail;
    }
    json_t *text = json_array();
    if (!block_text(c, text, what, e)) {
      json_decref(text);
      goto fail;
    }
    if (!strcmp(role, "user")) {
      // tool_result blocks become the template's observation turn, before the user's text.
      size_t j;
      const json_t *b;
      json_array_foreach(json_is_array(c) ? c : NULL, j, b) {
        if (!str_type(b, "tool_result")) continue;
        const json_t *rc = json_object_get(b, "content");
        json_t *parts = json_array();
        if (rc && !json_is_null(rc) && !block_text(rc, parts, what, e)) {
          json_decref(parts);
          json_decref(text);
          goto fail;
        }
        json_t *s = json_string("");
        size_t k;
        json_t *p;
        json_array_foreach(parts, k, p) {
          const char *a = json_string_value(s), *t = json_string_value(json_object_get(p, "text"));
          char *cat = malloc(strlen(a) + strlen(t) + 1);
          strcpy(cat, a);
          strcat(cat, t);
          json_decref(s);
          s = json_string(cat);
          free(cat);
        }
        json_decref(parts);
        json_t *tm = json_pack("{s:s, s:o}", "role", "tool", "content", s);
        if (json_is_string(json_object_get(b, "tool_use_id")))
          json_object_set(tm, "tool_call_id", json_object_get(b, "tool_use_id"));
        json_array_append_new(out, tm);
      }
      if (json_array_size(text) || !json_is_array(c))
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", "user", "content", text));
      else
        json_decref(text);
      continue;
    }
    json_t *am = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
    json_t *calls = json_array();
    size_t j;
    const json_t *b;
    json_array_foreach(json_is_array(c) ? c : NULL, j, b) {
      if (str_type(b, "thinking") && json_is_string(json_object_get(b, "thinking"))) {
        json_object_set(am, "reasoning_content", json_object_get(b, "thinking"));
      } else if (str_type(b, "tool_use")) {
        const json_t *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
        if (!json_is_string(name) || (input && !json_is_object(input))) {
          json_decref(calls);
          json_decref(am);
          lks_api_bad(e, 400, "messages", "%s[%zu]: a tool_use block needs a name and an object input", what, j);
          goto fail;
        }
        json_t *call = json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", name,
                                 "arguments", input ? json_deep_copy(input) : json_object());
        if (json_is_string(json_object_get(b, "id"))) json_object_set(call, "id", json_object_get(b, "id"));
        json_array_append_new(calls, call);
      }
    }
    if (json_array_size(calls)) json_object_set_new(am, "tool_calls", calls);
    else json_decref(calls);
    json_array_append_new(out, am);
  }
  return out;
fail_parts:
fail:
  json_decref(out);
  return NULL;
}

static bool number(const json_t *o, const char *k, double lo, double hi, double def, double *out,
                   lks_api_err *e) {
  const json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    *out = def;
    return true;
  }
  if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
    return lks_api_bad(e, 400, k, "'%s' must be a number in [%g, %g]", k, lo, hi);
  *out = json_number_value(v);
  return true;
}

bool lks_anth_prepare(const lks_api_ctx *cx, const json_t *body, bool count_only,
                      lks_req_params *p, json_t **tools, bool *stream, lks_api_err *e) {
  *tools = NULL;
  *stream = false;
  if (!cx->tok) return lks_api_bad(e, 400, NULL, "this model directory has no tokenizer.json");
  const json_t *m = json_object_get(body, "model");
  if (!json_is_string(m)) return lks_api_bad(e, 400, "model", "'model' must be a string");
  // Any model name is accepted: clients name their own (Claude Code asks for claude-*).
  const json_t *mt = json_object_get(body, "max_tokens");
  if (!count_only && (!json_is_integer(mt) || json_integer_value(mt) < 1))
    return lks_api_bad(e, 400, "max_tokens", "'max_tokens' must be an integer of at least 1");
  double t, tp, tk;
  if (!number(body, "temperature", 0, 2, 1, &t, e) || !number(body, "top_p", 1e-9, 1, 1, &tp, e) ||
      !number(body, "top_k", 0, 1 << 24, 0, &tk, e))
    return false;
  const json_t *st = json_object_get(body, "stream");
  if (st && !json_is_null(st) && !json_is_boolean(st)) return lks_api_bad(e, 400, "stream", "'stream' must be true or false");
  *stream = json_is_true(st);
  int think = cx->no_think ? 0 : -1;
  const json_t *th = json_object_get(body, "thinking");
  if (th && !json_is_null(th)) {
    const char *ty = json_string_value(json_object_get(th, "type"));
    if (!ty || (strcmp(ty, "enabled") && strcmp(ty, "disabled")))
      return lks_api_bad(e, 400, "thinking", "'thinking.type' must be \"enabled\" or \"disabled\"");
    think = !strcmp(ty, "enabled");
  }
  bool parse_tools = true;
  const json_t *tc = json_object_get(body, "tool_choice");
  if (tc && !json_is_null(tc)) {
    const char *ty = json_string_value(json_object_get(tc, "type"));
    if (!ty) return lks_api_bad(e, 400, "tool_choice", "'tool_choice.type' must be a string");
    if (!strcmp(ty, "none")) parse_tools = false;
    else if (strcmp(ty, "auto"))
      return lks_api_bad(e, 400, "tool_choice", "'tool_choice' of type \"%s\" is not supported (the "
                         "output is not constrained to a tool call); use \"auto\" or \"none\"", ty);
  }
  json_t *ot = NULL;
  const json_t *at = json_object_get(body, "tools");
  if (at && !json_is_null(at)) {
    if (!json_is_array(at)) return lks_api_bad(e, 400, "tools", "'tools' must be a list");
    if (!(ot = convert_tools(at, e))) return false;
    if (!json_array_size(ot)) {
      json_decref(ot);
      ot = NULL;
    }
  }
  json_t *conv = convert_messages(body, e);
  if (!conv) {
    json_decref(ot);
    return false;
  }
  char *text;
  size_t len;
  int rc = lks_chat_render(conv, ot, think, true, &text, &len);
  json_decref(conv);
  if (rc < 0) {
    json_decref(ot);
    return lks_api_bad(e, 400, "messages", "%s", lks_last_error());
  }
  rc = lks_tokenizer_encode(cx->tok, text, len, false, &p->prompt, &p->n_prompt);
  free(text);
  if (rc < 0) {
    json_decref(ot);
    return lks_api_bad(e, 400, "messages", "cannot tokenize the prompt: %s", lks_last_error());
  }
  if (count_only) {
    json_decref(ot);
    return true;
  }
  if (p->n_prompt >= cx->max_len) {
    json_decref(ot);
    return lks_api_bad(e, 400, "messages", "the prompt has %d tokens; the context holds %d", p->n_prompt, cx->max_len);
  }
  const json_t *ss = json_object_get(body, "stop_sequences");
  if (ss && !json_is_null(ss)) {
    if (!json_is_array(ss) || json_array_size(ss) > 16) {
      json_decref(ot);
      return lks_api_bad(e, 400, "stop_sequences", "'stop_sequences' must be a list of at most 16 strings");
    }
    p->stop = calloc(json_array_size(ss) + 1, sizeof *p->stop);
    size_t i;
    const json_t *s;
    json_array_foreach(ss, i, s) {
      if (!json_is_string(s) || !json_string_length(s) || json_string_length(s) > 256) {
        json_decref(ot);
        return lks_api_bad(e, 400, "stop_sequences", "stop_sequences[%zu] must be a string of 1 to 256 bytes", i);
      }
      p->stop[p->n_stop++] = strdup(json_string_value(s));
    }
  }
  long want = (long)json_integer_value(mt), room = cx->max_len - p->n_prompt;
  p->max_tokens = (int)(want < room ? want : room);
  p->sampling.temperature = (float)t;
  p->sampling.top_p = (float)tp;
  p->sampling.top_k = (int)tk;
  p->seed = (uint64_t)time(NULL);
  p->keep_markup = true;
  *tools = parse_tools ? ot : NULL;
  if (!parse_tools) json_decref(ot);
  return true;
}

// ---- the response ----

typedef struct {
  lks_api_ctx cx;
  lks_req *req;
  json_t *tools;
  lks_glm_parser *parser;
  char id[48];
  bool stream, started;
  char **stops;
  int n_stops;
  const lks_api_sink *out;
  int open;  // the open block's kind (LKS_GLM_CONTENT / _REASONING), or -1
  int index;  // the next block's index
  json_t *blocks;  // non-stream: the content blocks
  int n_calls;
  size_t reasoning_bytes;
  char *reasoning;  // for the reasoning-token count
} anth;

static void event(anth *a, const char *name, json_t *j) {
  json_object_set_new(j, "type", json_string(name));
  lks_api_put_sse(a->out, name, j);
}

static void close_block(anth *a) {
  if (a->open < 0) return;
  if (a->stream) event(a, "content_block_stop", json_pack("{s:i}", "index", a->index - 1));
  a->open = -1;
}

static void on_event(void *ctx, const lks_glm_event *ev) {
  anth *a = ctx;
  if (ev->kind == LKS_GLM_TOOL_CALL) {
    close_block(a);
    char id[96];
    snprintf(id, sizeof id, "toolu_%s_%d", a->id + 4, a->n_calls++);
    atomic_fetch_add(&a->cx.stats->tool_calls, 1);
    if (a->stream) {
      event(a, "content_block_start", json_pack("{s:i, s:{s:s, s:s, s:s, s:{}}}", "index", a->index,
                                                "content_block", "type", "tool_use", "id", id, "name",
                                                ev->name, "input"));
      event(a, "content_block_delta", json_pack("{s:i, s:{s:s, s:s}}", "index", a->index, "delta",
                                                "type", "input_json_delta", "partial_json", ev->args_json));
      event(a, "content_block_stop", json_pack("{s:i}", "index", a->index));
    } else {
      json_array_append_new(a->blocks, json_pack("{s:s, s:s, s:s, s:O}", "type", "tool_use", "id", id,
                                                 "name", ev->name, "input", ev->args));
    }
    a->index++;
    return;
  }
  bool thinking = ev->kind == LKS_GLM_REASONING;
  if (thinking) {
    char *r = realloc(a->reasoning, a->reasoning_bytes + ev->len + 1);
    if (r) {
      memcpy(r + a->reasoning_bytes, ev->text, ev->len);
      a->reasoning = r;
      a->reasoning_bytes += ev->len;
    }
  }
  const char *field = thinking ? "thinking" : "text";
  if (a->open != (int)ev->kind) {
    close_block(a);
    a->open = (int)ev->kind;
    if (a->stream) {
      json_t *cb = thinking ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                            : json_pack("{s:s, s:s}", "type", "text", "text", "");
      event(a, "content_block_start", json_pack("{s:i, s:o}", "index", a->index, "content_block", cb));
    } else {
      json_t *cb = thinking ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                            : json_pack("{s:s, s:s}", "type", "text", "text", "");
      json_array_append_new(a->blocks, cb);
    }
    a->index++;
  }
  if (a->stream) {
    event(a, "content_block_delta", json_pack("{s:i, s:{s:s, s:s%}}", "index", a->index - 1, "delta",
                                              "type", thinking ? "thinking_delta" : "text_delta",
                                              field, ev->text, ev->len));
  } else {
    json_t *cb = json_array_get(a->blocks, json_array_size(a->blocks) - 1);
    const char *old = json_string_value(json_object_get(cb, field));
    size_t ol = json_string_length(json_object_get(cb, field));
    char *cat = malloc(ol + ev->len + 1);
    if (!cat) return;
    memcpy(cat, old, ol);
    memcpy(cat + ol, ev->text, ev->len);
    json_object_set_new(cb, field, json_stringn(cat, ol + ev->len));
    free(cat);
  }
}

static json_t *message(anth *a, const lks_req_news *n) {
  return json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i, s:i, s:i}}", "id", a->id,
                   "type", "message", "role", "assistant", "model", a->cx.model_id, "content",
                   "stop_reason", "stop_sequence", "usage", "input_tokens", n->n_prompt - n->n_cached,
                   "cache_read_input_tokens", n->n_cached, "cache_creation_input_tokens", 0,
                   "output_tokens", n->n_generated);
}

static void anth_news(void *st, const lks_req_news *n, const lks_api_sink *out) {
  anth *a = st;
  a->out = out;
  if (n->failed) {
    json_t *err = lks_anth_error(500, n->error[0] ? n->error : "the model failed");
    if (a->stream) lks_api_put_sse(out, "error", err);
    else lks_api_put_json(out, err);
    return;
  }
  if (a->stream && !a->started) {
    a->started = true;
    lks_api_put_sse(out, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", message(a, n)));
  }
  if (n->len) lks_glm_parser_feed(a->parser, n->text, n->len, on_event, a);
  if (!n->done) return;
  lks_glm_parser_end(a->parser, on_event, a);
  close_block(a);
  if (a->reasoning_bytes && a->cx.tok) {
    int32_t *ids;
    int k;
    if (lks_tokenizer_encode(a->cx.tok, a->reasoning, a->reasoning_bytes, false, &ids, &k) == 0) {
      atomic_fetch_add(&a->cx.stats->reasoning_tokens, (unsigned long long)k);
      free(ids);
    }
  }
  const char *why = n->finish_reason && !strcmp(n->finish_reason, "length") ? "max_tokens"
                    : n->stop_index >= 0                                     ? "stop_sequence"
                    : a->n_calls                                             ? "tool_use"
                                                                             : "end_turn";
  json_t *seq = n->stop_index >= 0 && n->stop_index < a->n_stops ? json_string(a->stops[n->stop_index]) : json_null();
  if (a->stream) {
    event(a, "message_delta", json_pack("{s:{s:s, s:o}, s:{s:i}}", "delta", "stop_reason", why,
                                        "stop_sequence", seq, "usage", "output_tokens", n->n_generated));
    event(a, "message_stop", json_object());
    return;
  }
  json_t *m = message(a, n);
  json_object_set(m, "content", a->blocks);
  json_object_set_new(m, "stop_reason", json_string(why));
  json_object_set_new(m, "stop_sequence", seq);
  lks_api_put_json(out, m);
}

static void anth_free(void *st) {
  anth *a = st;
  if (!a) return;
  lks_glm_parser_free(a->parser);
  json_decref(a->tools);
  json_decref(a->blocks);
  for (int i = 0; i < a->n_stops; i++) free(a->stops[i]);
  free(a->stops);
  free(a->reasoning);
  free(a);
}

int lks_anth_fmt(const lks_api_ctx *cx, lks_req *r, json_t *tools, const char *id, bool stream,
                 char *const *stops, int n_stops, lks_api_fmt *out) {
  anth *a = calloc(1, sizeof *a);
  if (!a) {
    json_decref(tools);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  a->cx = *cx;
  a->req = r;
  a->tools = tools;
  a->parser = lks_glm_parser_new(tools);
  a->blocks = json_array();
  a->stream = stream;
  a->open = -1;
  snprintf(a->id, sizeof a->id, "%s", id);
  a->stops = calloc((size_t)n_stops + 1, sizeof *a->stops);
  for (int i = 0; a->stops && i < n_stops; i++) a->stops[a->n_stops++] = strdup(stops[i]);
  if (!a->parser || !a->blocks || !a->stops) {
    anth_free(a);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  *out = (lks_api_fmt){.st = a, .news = anth_news, .free = anth_free};
  return 0;
}
