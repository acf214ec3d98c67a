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
//
// This file holds the daemon, the routing, the connection lifecycle, the watcher and the replies
// every endpoint uses; generations are in http_gen.c, the other endpoints in http_admin.c, and
// what they share in http_impl.h.
#include "coordinator/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coordinator/api.h"
#include "coordinator/http_impl.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "text/tokenizer.h"
#include "worker/world.h"

// ---- replies ----

enum MHD_Result lks__http_send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                    const char *body) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

void lks__http_count(lks_http *h, unsigned status) {
  int i = status < 300 ? 0 : status == 400 ? 2 : status == 429 ? 3 : status == 503 ? 5
          : status >= 500 ? 4 : 1;
  pthread_mutex_lock(&h->mu);
  h->by_status[i]++;
  pthread_mutex_unlock(&h->mu);
}

enum MHD_Result lks__http_send_json(lks_http *h, struct MHD_Connection *c, unsigned status,
                                    json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  lks__http_count(h, status);
  enum MHD_Result ok = lks__http_send_text(c, status, "application/json", s ? s : "{}");
  free(s);
  return ok;
}

json_t *lks__http_jstr(const char *s, size_t n) {
  json_t *j = json_stringn(s, n);
  if (j) return j;
  size_t m;
  char *clean = lks_utf8_sanitize(s, n, &m);
  j = clean ? json_stringn(clean, m) : json_string("");
  free(clean);
  return j;
}

json_t *lks__http_error_body(const char *message, const char *type, const char *param,
                             const char *code) {
  return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message",
                   lks__http_jstr(message, strlen(message)), "type", type, "param",
                   param ? lks__http_jstr(param, strlen(param)) : json_null(), "code",
                   code ? json_string(code) : json_null());
}

enum MHD_Result lks__http_fail(lks_http *h, struct MHD_Connection *c, unsigned status,
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
  return lks__http_send_json(h, c, status, lks__http_error_body(msg, type, param, code));
}

// ---- auth ----

static bool token_ok_raw(const char *got, const char *want) {
  size_t a = strlen(got), b = strlen(want);
  unsigned diff = (unsigned)(a ^ b);
  for (size_t i = 0; i < b; i++) diff |= (unsigned)(got[i < a ? i : 0] ^ want[i]);
  return diff == 0;
}

bool lks__http_token_ok(const char *header, const char *want) {
  if (!header || !want || strncmp(header, "Bearer ", 7) != 0) return false;
  const char *got = header + 7;
  size_t a = strlen(got), b = strlen(want);
  unsigned diff = (unsigned)(a ^ b);
  for (size_t i = 0; i < b; i++) diff |= (unsigned)(got[i < a ? i : 0] ^ want[i]);
  return diff == 0;
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
                             const char *method, lks__http_conn *cn) {
  bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  if (cn->too_big)
    return lks__http_fail(h, c, 413, NULL, "the request body exceeds %zu bytes", h->max_body);
  if (get && !strcmp(url, "/health")) return lks__http_health(h, c);
  if (get && !strcmp(url, "/metrics")) return lks__http_metrics(h, c);
  json_t *o = NULL;
  bool anth = !strcmp(url, "/v1/messages") || !strcmp(url, "/v1/messages/count_tokens");
  if (post && cn->len) {
    json_error_t je;
    o = json_loadb(cn->body, cn->len, JSON_REJECT_DUPLICATES, &je);
    if (!o && anth) return lks__http_anth_fail(h, c, 400, "the body is not valid JSON");
    if (!o) {
      char key[64];
      const char *param = key_before(cn->body, cn->len, (size_t)je.position, key, sizeof key);
      return lks__http_fail(h, c, 400, param, "the body is not valid JSON: %s (at byte %d%s%s)",
                            je.text, je.position, param ? ", the value of " : "",
                            param ? param : "");
    }
    if (!json_is_object(o)) {
      json_decref(o);
      return anth ? lks__http_anth_fail(h, c, 400, "the body must be a JSON object")
                  : lks__http_fail(h, c, 400, NULL, "the body must be a JSON object");
    }
  }
  // The API key: 'Authorization: Bearer KEY' (OpenAI clients) or 'x-api-key: KEY' (Anthropic's).
  const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
  const char *bearer = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  bool key_ok = !h->api_key || lks__http_token_ok(bearer, h->api_key) ||
                (xkey && strlen(xkey) == strlen(h->api_key) && token_ok_raw(xkey, h->api_key));
  enum MHD_Result rc;
  if (!strncmp(url, "/admin/", 7)) {
    rc = lks__http_admin(h, c, url, method, o);
  } else if (!strncmp(url, "/v1/", 4) && !key_ok) {
    rc = anth ? lks__http_anth_fail(h, c, 401, "a valid API key is required ('x-api-key: <key>')")
              : lks__http_fail(h, c, 401, NULL,
                               "a valid API key is required ('Authorization: Bearer <key>')");
  } else if (post && anth) {
    rc = lks__http_messages(h, c, cn, o, url[12] == '/');
  } else if (get && !strncmp(url, "/v1/models/", 11)) {
    rc = strcmp(url + 11, h->model_id)
             ? lks__http_fail(h, c, 404, "model", "The model '%s' does not exist", url + 11)
             : lks__http_send_json(h, c, 200,
                                   json_pack("{s:s, s:s, s:i, s:s, s:i}", "id", h->model_id, "object",
                                             "model", "created", 0, "owned_by", "lockstep",
                                             "max_model_len", h->max_len));
  } else if (get && !strcmp(url, "/v1/models")) {
    rc = lks__http_send_json(h, c, 200,
                             json_pack("{s:s, s:[{s:s, s:s, s:i, s:s, s:i}]}", "object", "list",
                                       "data", "id", h->model_id, "object", "model", "created", 0,
                                       "owned_by", "lockstep", "max_model_len", h->max_len));
  } else if (post && (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions"))) {
    if (!o) rc = lks__http_fail(h, c, 400, NULL, "the body must be a JSON object");
    else if (!lks_sched_healthy(h->sched) || lks_sched_draining(h->sched))
      rc = lks__http_fail(h, c, 503, NULL,
                          "the server is not accepting requests (draining or failed)");
    else rc = lks__http_generate(h, c, cn, o, url[4] == 'c' && url[5] == 'h');
  } else if (post && (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize"))) {
    rc = o ? lks__http_tokenize(h, c, o, url[1] == 'd')
           : lks__http_fail(h, c, 400, NULL, "the body must be a JSON object");
  } else if (!strcmp(url, "/v1/models") || !strcmp(url, "/v1/completions") ||
             !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/health") ||
             !strcmp(url, "/metrics") || !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
    rc = lks__http_fail(h, c, 405, NULL, "method %s is not allowed on %s", method, url);
  } else {
    rc = lks__http_fail(h, c, 404, NULL, "no such endpoint: %s", url);
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
  lks__http_conn *cn = calloc(1, sizeof *cn);
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
  lks__http_conn *cn = *con_cls;
  if (!cn) return MHD_NO;  // out of memory in request_begins
  if (cn->g) return lks__http_gen_respond(h, c, cn);  // a plain generation's connection resumed
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
    if (late)
      return lks__http_fail(h, c, 408, NULL, "the request took longer than %.0f s to arrive",
                            h->request_timeout);
  }
  return route(h, c, url, method, cn);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  (void)c, (void)toe;
  lks_http *h = cls;
  lks__http_conn *cn = *con_cls;
  if (cn) {
    if (cn->sk) {
      pthread_mutex_lock(&h->socks_mu);
      cn->sk->t_request = 0;
      cn->sk->handling = false;
      pthread_mutex_unlock(&h->socks_mu);
    }
    lks__http_gen_free(cn->g);
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
    lks__http_sock *sk = calloc(1, sizeof *sk);
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
    lks__http_sock *sk = *socket_context;
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

static void gen_abandon(lks__http_gen *g) { lks__http_gen_abandon(g); }

static void *watch_main(void *arg) {
  lks_http *h = arg;
  while (!atomic_load(&h->stopping)) {
    double t = now_s();
    pthread_mutex_lock(&h->socks_mu);
    for (lks__http_sock *sk = h->socks; sk; sk = sk->next) {
      lks__http_gen *g = sk->g;
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
    for (lks__http_sock *sk = h->socks; sk; sk = sk->next)
      if (sk->g && !atomic_load(&sk->g->finished) && !lks__http_gen_all_finished(sk->g)) gen_abandon(sk->g);
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
