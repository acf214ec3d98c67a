// SPDX-License-Identifier: MIT
// The HTTP API of rank 0 (DESIGN.md section 8), on libmicrohttpd with a thread per connection:
// OpenAI-compatible POST /v1/completions and /v1/chat/completions (SSE with "stream": true),
// GET /v1/models, POST /tokenize and /detokenize, GET /health, GET /metrics (Prometheus text),
// and the control endpoints /admin/levers, /admin/drain, /admin/shutdown behind a bearer token.
// Every request is validated before it reaches the scheduler; errors are 4xx/5xx with an
// OpenAI-style body {"error": {"message", "type", "param", "code"}}.
#ifndef LKS_HTTP_H
#define LKS_HTTP_H

#include "coordinator/scheduler.h"
#include "core/settings.h"
#include "text/tokenizer.h"

typedef struct lks_http lks_http;

// Starts serving on --bind:--port. NULL with lks_last_error() when the port cannot be had or a
// setting is invalid (an admin token file that cannot be read, ...).
lks_http *lks_http_start(const lks_settings *s, lks_sched *sched, lks_world *w,
                         const lks_tokenizer *tok, const char *model_id);
// Stops accepting, closes every connection and joins the server's threads.
void lks_http_stop(lks_http *h);
// Set by /admin/shutdown: the server wants the process to end.
bool lks_http_shutdown_requested(const lks_http *h);

#endif
