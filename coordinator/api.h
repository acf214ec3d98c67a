// SPDX-License-Identifier: MIT
// What the HTTP server (http.c) and the API dialects it speaks share: a request error, a sink
// for response bytes, a response formatter (called with each piece of news of a request until it
// is done), and the counters the dialects keep for /metrics. The dialects: api_openai.c (chat
// completions: tools, reasoning, tool calls), api_anthropic.c (the Messages API).
// Formatters run on the connection's thread; the counters are atomics, any thread.
#ifndef LKS_API_H
#define LKS_API_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "coordinator/scheduler.h"
#include "text/tokenizer.h"

// A refusal: HTTP status, the field at fault (or NULL), and the message.
typedef struct lks_api_err {
  unsigned status;
  const char *param;
  char msg[256];
} lks_api_err;
bool lks_api_bad(lks_api_err *e, unsigned status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));  // fills e, returns false

typedef struct lks_api_sink {
  void (*put)(void *ctx, const char *s, size_t n);
  void *ctx;
} lks_api_sink;
// Writes j as compact JSON (j is consumed).
void lks_api_put_json(const lks_api_sink *k, json_t *j);
// Writes one server-sent event: "event: EVENT\n" when event is not NULL, then "data: J\n\n".
void lks_api_put_sse(const lks_api_sink *k, const char *event, json_t *j);

// A response formatter: news() is called with each piece of news of the request, in order, and
// writes what the client gets for it; the response ends after the call with done or failed.
typedef struct lks_api_fmt {
  void *st;
  void (*news)(void *st, const lks_req_news *n, const lks_api_sink *out);
  void (*free)(void *st);
} lks_api_fmt;

enum { LKS_API_COMPLETIONS, LKS_API_CHAT, LKS_API_MESSAGES, LKS_API_COUNT_TOKENS, LKS_API_N };
typedef struct lks_api_stats {
  atomic_ullong requests[LKS_API_N];  // generation requests accepted, by API
  atomic_ullong tool_calls;           // tool calls parsed from outputs
  atomic_ullong reasoning_tokens;     // tokens of reasoning text (re-encoded)
} lks_api_stats;
extern const char *const lks_api_names[LKS_API_N];

// What a dialect needs of the server.
typedef struct lks_api_ctx {
  const lks_tokenizer *tok;
  const char *model_id;
  int max_len;
  bool no_think;  // --no-think: enable_thinking=false unless the request says otherwise
  const char *fingerprint;  // system_fingerprint: the build and the model
  lks_api_stats *stats;
} lks_api_ctx;

#endif
