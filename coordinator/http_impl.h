// SPDX-License-Identifier: MIT
// The inside of the HTTP API, shared by its three files: http.c (the daemon, the routing of
// requests, the connection lifecycle, the socket watcher, and the replies every endpoint uses),
// http_gen.c (generation requests: the validation of completions and chat bodies, the
// submit/suspend/resume machinery of plain and streamed answers, the Messages API hook) and
// http_admin.c (/health, /metrics, /tokenize and /detokenize, /admin/*). Not for use outside
// those files.
//
// Threads: every function here runs on a libmicrohttpd thread, answering a request on the
// connection it is given; socks_mu guards the socket list and every socket's generation, shared
// with the watcher thread.
#ifndef LKS_COORDINATOR_HTTP_IMPL_H
#define LKS_COORDINATOR_HTTP_IMPL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/api.h"
#include "coordinator/http.h"
#include "coordinator/scheduler.h"
#include "text/tokenizer.h"
#include "worker/world.h"

typedef struct lks__http_gen lks__http_gen;

// One open socket (MHD's socket context), in the watcher's list while it is open.
typedef struct lks__http_sock {
  int fd;
  struct MHD_Connection *c;
  double t_request;  // when the request line arrived (0: between requests)
  bool handling;     // headers and body are in: the request is being answered
  lks__http_gen *g;  // the generation waiting on this socket, if any
  struct lks__http_sock *prev, *next;
} lks__http_sock;

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
  lks__http_sock *socks;
  pthread_t watcher;
  bool watching;
  atomic_bool stopping;
};

// One request on a connection: its body as it arrives.
typedef struct {
  char *body;
  size_t len, cap;
  bool too_big, headers_seen;
  lks__http_sock *sk;
  lks__http_gen *g;  // a plain (non-streamed) generation in progress on this request
} lks__http_conn;

// Why a request body was refused: the status, the field and the message.
typedef struct {
  const char *param;
  char msg[256];
  unsigned status;
} lks__http_verr;

enum { LKS_MAX_CHOICES = 16 };  // n of an OpenAI request

// One choice of a generation (n > 1: one request each, submitted together).
typedef struct lks__http_choice {
  lks_req *req;
  lks_api_fmt fmt;  // when set, it writes the choice (chat: api_openai.c; messages: api_anthropic.c)
  bool done;
  const char *finish;
  int n_prompt, n_generated, n_cached;
  char *text;  // plain: the text so far (completions), or the formatter's JSON (chat, n > 1)
  size_t n_text;
  int lp_sent;    // completions: tokens whose reports were written
  long text_off;  // completions: text_offset of the next token
  json_t *legacy;  // completions, plain: the logprobs object so far
} lks__http_choice;

// The one-shot wakers armed on a generation's requests (lks_req_arm) point here, not at the
// generation: it counts one reference for the generation and one per armed waker (exactly one of
// the waker's call and a successful disarm drops it), so that a waker that fires after the
// generation is gone finds g NULL instead of freed memory.
typedef struct lks__http_waker {
  pthread_mutex_t mu;
  int refs;
  lks__http_gen *g;  // NULL once the generation is freed
  bool suspended;    // the connection is suspended and no waker has resumed it yet
} lks__http_waker;

// A generation being answered (http_gen.c): owned by its connection (plain) or its response
// (streamed); the watcher reads `gone`, `finished` and the requests under socks_mu.
struct lks__http_gen {
  lks_http *h;
  lks__http_choice ch[LKS_MAX_CHOICES];
  int n_ch;
  lks__http_waker *wk;
  struct MHD_Connection *c;
  lks__http_sock *sk;
  bool chat, stream, usage, token_ids;
  int logprobs;  // completions: -1, or the alternatives per token (0..5)
  char id[48];
  long created;
  atomic_bool gone;  // the client left (or the server stops): end without an answer
  // Pending output not yet handed to libmicrohttpd.
  char *out;
  size_t out_len, out_off;
  bool sent_role;
  atomic_bool finished;  // everything is produced (read by the watcher)
  char error[512];       // why a request failed
};

// ---- http.c: replies and auth ----

// Queues a response of `body` (copied) with the given status and content type.
enum MHD_Result lks__http_send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                    const char *body);
// Counts an answer by status class, for /metrics.
void lks__http_count(lks_http *h, unsigned status);
// Queues `j` (consumed) as the JSON answer, counted.
enum MHD_Result lks__http_send_json(lks_http *h, struct MHD_Connection *c, unsigned status,
                                    json_t *j);
// A JSON string of any bytes: invalid UTF-8 (a message cut inside a character, text a model
// produced) becomes U+FFFD rather than a failed json_pack.
json_t *lks__http_jstr(const char *s, size_t n);
// The OpenAI-shaped error object.
json_t *lks__http_error_body(const char *message, const char *type, const char *param,
                             const char *code);
// Answers an OpenAI-shaped error with the given status, naming `param` when not NULL.
enum MHD_Result lks__http_fail(lks_http *h, struct MHD_Connection *c, unsigned status,
                               const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
// Whether an Authorization header is 'Bearer <want>' (compared in constant time).
bool lks__http_token_ok(const char *header, const char *want);

// ---- http_gen.c: validation and generations ----

// The optional field k of o: an integer in [lo, hi] (def when absent or null), or false with *e
// filled.
bool lks__http_get_int(json_t *o, const char *k, long lo, long hi, long def, long *out,
                       lks__http_verr *e);
// The optional field k of o: a boolean (false when absent or null), or false with *e filled.
bool lks__http_get_bool(json_t *o, const char *k, bool *out, lks__http_verr *e);
// POST /v1/completions (chat false) and /v1/chat/completions (chat true) with body o.
enum MHD_Result lks__http_generate(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn,
                                   json_t *o, bool chat);
// POST /v1/messages and /v1/messages/count_tokens (count_only), with Anthropic-shaped errors.
enum MHD_Result lks__http_messages(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn,
                                   json_t *o, bool count_only);
// Answers an Anthropic-shaped error.
enum MHD_Result lks__http_anth_fail(lks_http *h, struct MHD_Connection *c, unsigned status,
                                    const char *msg);
// A plain generation's connection after it resumed: its answer once the request is done.
enum MHD_Result lks__http_gen_respond(lks_http *h, struct MHD_Connection *c, lks__http_conn *cn);
// Ends a generation's part (a streamed response's free callback, or its connection's end):
// cancels the request unless it finished. Accepts NULL.
void lks__http_gen_free(void *cls);
// Whether every request of g finished (or failed).
bool lks__http_gen_all_finished(lks__http_gen *g);
// Ends a waiting generation whose client is gone (under socks_mu): its requests are cancelled
// (their slots are free at the scheduler's next step) and the connection, if suspended, resumed
// so that libmicrohttpd closes it.
void lks__http_gen_abandon(lks__http_gen *g);

// ---- http_admin.c: the other endpoints ----

// GET /health.
enum MHD_Result lks__http_health(lks_http *h, struct MHD_Connection *c);
// GET /metrics: Prometheus text.
enum MHD_Result lks__http_metrics(lks_http *h, struct MHD_Connection *c);
// POST /tokenize, or /detokenize (inverse), with body o.
enum MHD_Result lks__http_tokenize(lks_http *h, struct MHD_Connection *c, json_t *o, bool inverse);
// /admin/*: the levers, clearing the prefix cache, drain and shutdown; needs the admin token.
enum MHD_Result lks__http_admin(lks_http *h, struct MHD_Connection *c, const char *url,
                                const char *method, json_t *o);
#endif
