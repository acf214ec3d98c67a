// SPDX-License-Identifier: MIT
// The ZeroMQ control plane (see control.h).
#include "worker/control.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "proto/command.h"

enum { EP_LEN = 256, HOST_LEN = 64, SECRET_LEN = 65 };

typedef struct {
  void *sock, *mon;       // command socket, its monitor
  void *beat;             // heartbeats: rank 0 PUSH (used by the heartbeat thread), worker PULL
  uint64_t acked;         // last step acked
  double exec_s, comm_s;  // timings of that ack
  double win_exec, win_comm;  // summed over the acks of the steps after the window's start
  bool dead;
  // Rank 0: the worker's connection (the file descriptor its messages arrive on); other
  // connections to its socket are foreign peers that failed the handshake.
  int fd;
  uint64_t refused;
} peer;

// Where a rank runs, to tell whether every rank can reach rank 0 over loopback.
typedef struct {
  char host[HOST_LEN];
  char boot[48];   // the kernel's boot id
  char netns[48];  // the network namespace
} place;

struct lks_ctl {
  lks_comm *comm;
  void *ctx;
  int rank, world;
  peer *peers;   // rank 0: [world], index = worker rank; worker: [1], the coordinator
  char (*hosts)[HOST_LEN];
  uint64_t step;  // rank 0: last sent; worker: last received
  uint64_t win_from;  // rank 0: the step before the window of lks_ctl_window
  uint64_t shutdown_step;  // rank 0: the step of EP_CMD_SHUTDOWN, once sent
  char fault[64];
  uint64_t fault_step;
  pthread_t beat_thread;
  bool beating;
  atomic_bool stop_beat;
  double heartbeat_s;
  // Rank 0: the ZAP handler that admits only peers presenting the job's secret.
  char secret[SECRET_LEN];
  void *zap;
  pthread_t zap_thread;
  bool zapping;
  atomic_bool stop_zap;
};

static void *beat_main(void *arg) {
  lks_ctl *c = arg;
  while (!atomic_load(&c->stop_beat)) {
    for (int r = 1; r < c->world; r++) zmq_send(c->peers[r].beat, "", 0, ZMQ_DONTWAIT);
    struct timespec ts = {(time_t)c->heartbeat_s, (long)((c->heartbeat_s - (time_t)c->heartbeat_s) * 1e9)};
    // Sleep in short slices so that lks_ctl_free does not wait a whole interval.
    for (double left = c->heartbeat_s; left > 0 && !atomic_load(&c->stop_beat); left -= 0.05) {
      ts.tv_sec = 0;
      ts.tv_nsec = (long)((left < 0.05 ? left : 0.05) * 1e9);
      nanosleep(&ts, NULL);
    }
  }
  return NULL;
}

static int zfail(const char *what) {
  return lks_set_error(LKS_EIO, "control plane: %s: %s", what, zmq_strerror(zmq_errno()));
}

static void *new_socket(lks_ctl *c, int type) {
  void *s = zmq_socket(c->ctx, type);
  if (!s) return NULL;
  int zero = 0;
  zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);  // no high-water mark: nothing is dropped
  zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  return s;
}

enum {
  HANDSHAKE_FAILED = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
};

static int monitor(lks_ctl *c, peer *p, int index) {
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://lks-monitor-%d", index);
  int events = ZMQ_EVENT_DISCONNECTED | HANDSHAKE_FAILED;
  if (zmq_socket_monitor(p->sock, ep, events) != 0) return zfail("socket monitor");
  p->mon = zmq_socket(c->ctx, ZMQ_PAIR);
  if (!p->mon || zmq_connect(p->mon, ep) != 0) return zfail("monitor connect");
  return 0;
}

// True when the monitor reported a dropped connection. On rank 0 a socket may see foreign peers
// (they fail the handshake, and their connections drop): the worker is gone when the connection
// its messages came on drops. A worker's own socket has one connection, to rank 0.
static bool disconnected(lks_ctl *c, peer *p) {
  if (!p->mon || p->dead) return p->dead;
  for (;;) {
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, p->mon, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&ev);
      break;
    }
    if (zmq_msg_size(&ev) >= 6) {
      uint16_t id;
      uint32_t value;
      memcpy(&id, zmq_msg_data(&ev), 2);
      memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
      if (id & HANDSHAKE_FAILED) {
        if (p->refused++ < 10 || p->refused % 1000 == 0)
          LKS_LOG(LKS_LOG_WARN, "control plane: refused a peer that is not a rank of this job "
                  "(failed handshake: %s; %llu so far)", id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ?
                  "wrong secret" : "no secret or not ZeroMQ", (unsigned long long)p->refused);
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        if (c->rank != 0 || (p->fd >= 0 && (int)value == p->fd)) p->dead = true;
      }
    }
    int more = zmq_msg_more(&ev);
    zmq_msg_close(&ev);
    if (more) {  // the second frame: the endpoint
      zmq_msg_t addr;
      zmq_msg_init(&addr);
      zmq_msg_recv(&addr, p->mon, 0);
      zmq_msg_close(&addr);
    }
  }
  return p->dead;
}

static int send_msg(void *sock, const void *buf, size_t n) {
  return zmq_send(sock, buf, n, 0) == (int)n ? 0 : zfail("send");
}

static int send_ack(void *sock, const Lockstep__Ack *a) {
  uint8_t *buf;
  size_t n;
  LKS_TRY(lks_ack_encode(a, &buf, &n));
  int rc = send_msg(sock, buf, n);
  free(buf);
  return rc;
}

// Rank 0: reads every ack waiting on worker r's socket.
static int drain_acks(lks_ctl *c, int r) {
  peer *p = &c->peers[r];
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, p->sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      return 0;
    }
    int fd = zmq_msg_get(&msg, ZMQ_SRCFD);
    if (fd >= 0) p->fd = fd;  // only the worker gets past the handshake
    Lockstep__Ack *a = lks_ack_decode(zmq_msg_data(&msg), zmq_msg_size(&msg));
    zmq_msg_close(&msg);
    if (!a) return lks_set_error(LKS_EFORMAT, "rank %d (%s) sent an ack that does not decode", r, c->hosts[r]);
    int rc = 0;
    if (a->status < 0)
      rc = lks_set_error(a->status, "rank %d (%s) failed step %llu: %s", r, c->hosts[r],
                         (unsigned long long)a->step_id, a->error ? a->error : "");
    else if (a->step_id > p->acked) {
      p->acked = a->step_id;
      p->exec_s = a->exec_seconds;
      p->comm_s = a->comm_seconds;
      if (a->step_id > c->win_from) p->win_exec += a->exec_seconds, p->win_comm += a->comm_seconds;
    }
    lockstep__ack__free_unpacked(a, NULL);
    if (rc < 0) return rc;
  }
}

int lks_ctl_poll(void *ctl) {
  lks_ctl *c = ctl;
  if (c->rank == 0) {
    for (int r = 1; r < c->world; r++) {
      LKS_TRY(drain_acks(c, r));
      // A worker that acked the shutdown may already be gone.
      bool done = c->shutdown_step && c->peers[r].acked >= c->shutdown_step;
      if (disconnected(c, &c->peers[r]) && !done)
        return lks_set_error(LKS_EIO, "rank %d (%s) disconnected: the worker process is gone", r,
                             c->hosts[r]);
    }
  } else if (disconnected(c, &c->peers[0])) {
    return lks_set_error(LKS_EIO, "the coordinator (rank 0, %s) disconnected", c->hosts[0]);
  }
  return 0;
}

// ---- who may connect: the job's secret (rank 0) ----

static int recv_str(void *sock, char *buf, size_t n) {
  int k = zmq_recv(sock, buf, n - 1, 0);
  if (k < 0) return -1;
  buf[(size_t)k < n - 1 ? (size_t)k : n - 1] = '\0';
  return k;
}

// The ZAP handler (ZeroMQ RFC 27) of rank 0's sockets: a peer is admitted when its PLAIN hello
// carries the job's secret, refused otherwise (the refusal is logged by the socket's monitor).
static void *zap_main(void *arg) {
  lks_ctl *c = arg;
  while (!atomic_load(&c->stop_zap)) {
    zmq_pollitem_t it = {c->zap, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 100) <= 0) continue;
    // version, request id, domain, address, routing id, mechanism, credentials...
    char f[8][256];
    int n = 0, more = 1;
    while (more) {
      char tmp[256];
      int k = recv_str(c->zap, n < 8 ? f[n] : tmp, sizeof tmp);
      if (k < 0) break;
      n++;
      size_t sz = sizeof more;
      zmq_getsockopt(c->zap, ZMQ_RCVMORE, &more, &sz);
    }
    if (n < 2) continue;
    bool ok = n >= 8 && !strcmp(f[5], "PLAIN") && !strcmp(f[6], "lockstep") &&
              strlen(f[7]) == strlen(c->secret) && !strcmp(f[7], c->secret);
    if (!ok)
      LKS_LOG(LKS_LOG_WARN, "control plane: refused a peer from %s (%s)", n > 3 ? f[3] : "?",
              n >= 6 && strcmp(f[5], "PLAIN") ? "no credentials" : "wrong secret");
    zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(c->zap, f[1], strlen(f[1]), ZMQ_SNDMORE);
    zmq_send(c->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
    zmq_send(c->zap, ok ? "OK" : "refused", ok ? 2 : 7, ZMQ_SNDMORE);
    zmq_send(c->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(c->zap, "", 0, 0);
  }
  return NULL;
}

static int make_secret(char *out) {
  uint8_t b[32];
  if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
    return lks_set_error(LKS_EIO, "control plane: getrandom: %s", strerror(errno));
  for (size_t i = 0; i < sizeof b; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
  return 0;
}

// ---- where rank 0 listens ----

static void read_line(const char *path, char *out, size_t n) {
  FILE *f = fopen(path, "r");
  out[0] = '\0';
  if (!f) return;
  if (fgets(out, (int)n, f)) out[strcspn(out, "\n")] = '\0';
  fclose(f);
}

static void my_place(place *pl, int rank) {
  memset(pl, 0, sizeof *pl);
  gethostname(pl->host, sizeof pl->host - 1);
  read_line("/proc/sys/kernel/random/boot_id", pl->boot, sizeof pl->boot);
  ssize_t k = readlink("/proc/self/ns/net", pl->netns, sizeof pl->netns - 1);
  if (k < 0) pl->netns[0] = '\0';
#ifdef LKS_TEST_HOOKS
  // Test hook: LKS_TEST_HOSTNAME=NAME pretends this host is called NAME and that the ranks run
  // on different machines (no loopback), to exercise the address look-up and its fallback.
  const char *fake = getenv("LKS_TEST_HOSTNAME");
  if (fake && *fake) {
    snprintf(pl->host, sizeof pl->host, "%s", fake);
    snprintf(pl->boot, sizeof pl->boot, "test-machine-%d", rank);
  }
#else
  (void)rank;
#endif
}

static int resolve4(const char *name, char *out, int *gai) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  *gai = getaddrinfo(name, NULL, &hints, &res);
  if (*gai != 0) return -1;
  inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, out, INET_ADDRSTRLEN);
  freeaddrinfo(res);
  return 0;
}

// The first IPv4 address of an interface that is up and not loopback.
static int interface_addr(char *out, char *ifname, size_t ifn) {
  struct ifaddrs *ifs;
  if (getifaddrs(&ifs) != 0) return -1;
  int rc = -1;
  for (struct ifaddrs *i = ifs; i && rc < 0; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, INET_ADDRSTRLEN);
    snprintf(ifname, ifn, "%s", i->ifa_name);
    rc = 0;
  }
  freeifaddrs(ifs);
  return rc;
}

// Rank 0's control address (numeric, so that workers resolve nothing): --control-host when set;
// loopback when every rank runs on this machine in this network namespace; else the address of
// this host's name, or, when the name does not resolve (or resolves to loopback), the address of
// an interface, with the cause logged.
static int control_addr(const char *want, const place *all, int world, char *out) {
  int gai = 0;
  if (want && *want) {
    if (resolve4(want, out, &gai) < 0)
      return lks_set_error(LKS_ECONFIG, "control plane: --control-host '%s' does not resolve: %s",
                           want, gai_strerror(gai));
    return 0;
  }
  bool one_machine = true;
  for (int r = 1; r < world; r++)
    one_machine &= !strcmp(all[r].boot, all[0].boot) && !strcmp(all[r].netns, all[0].netns) &&
                   all[0].boot[0] && all[0].netns[0];
  if (one_machine) {
    snprintf(out, INET_ADDRSTRLEN, "127.0.0.1");
    return 0;
  }
  const char *name = all[0].host;
  char why[160];
  if (resolve4(name, out, &gai) == 0 && strncmp(out, "127.", 4) != 0) return 0;
  if (gai)
    snprintf(why, sizeof why, "the host name '%s' does not resolve (%s)", name, gai_strerror(gai));
  else
    snprintf(why, sizeof why, "the host name '%s' resolves to loopback (%s)", name, out);
  char ifname[IF_NAMESIZE + 1];
  if (interface_addr(out, ifname, sizeof ifname) < 0)
    return lks_set_error(LKS_ECONFIG, "control plane: %s and no network interface has an IPv4 "
                         "address; set --control-host (LKS_CONTROL_HOST)", why);
  LKS_LOG(LKS_LOG_WARN, "control plane: %s; using %s (interface %s) instead; set "
          "--control-host to choose", why, out, ifname);
  return 0;
}

// Rank 0: a PLAIN-server socket (peers must present the secret) bound on addr's ephemeral port;
// the endpoint workers connect to goes to ep.
static void *bind_socket(lks_ctl *c, int type, const char *addr, char *ep) {
  void *s = new_socket(c, type);
  if (!s) return NULL;
  int one = 1;
  zmq_setsockopt(s, ZMQ_PLAIN_SERVER, &one, sizeof one);
  zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "lockstep", 8);
  char want[EP_LEN];
  snprintf(want, sizeof want, "tcp://%s:*", addr);
  if (zmq_bind(s, want) != 0) {
    lks_set_error(LKS_EIO, "control plane: cannot bind %s: %s", want, zmq_strerror(zmq_errno()));
    zmq_close(s);
    return NULL;
  }
  size_t n = EP_LEN;
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n);
  return s;
}

// A worker's socket: connects with the job's secret.
static void *connect_socket(lks_ctl *c, int type, const char *ep) {
  void *s = new_socket(c, type);
  if (!s) return NULL;
  zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, "lockstep", 8);
  zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, c->secret, strlen(c->secret));
  return s;
}

lks_ctl *lks_ctl_new(lks_comm *comm, double timeout_s, double heartbeat_s, const char *control_host) {
  lks_ctl *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->comm = comm;
  c->rank = comm->rank;
  c->world = comm->world;
  c->heartbeat_s = heartbeat_s;
  c->ctx = zmq_ctx_new();
  c->peers = calloc((size_t)c->world, sizeof *c->peers);
  c->hosts = calloc((size_t)c->world, sizeof *c->hosts);
  char (*eps)[EP_LEN] = calloc((size_t)c->world * 2, sizeof *eps);  // commands, then beats
  place *places = calloc((size_t)c->world, sizeof *places);
  lks_comm_where w = {"control plane start", -1};
  if (!c->ctx || !c->peers || !c->hosts || !eps || !places) goto fail;
  place me;
  my_place(&me, c->rank);
  if (comm->ops->allgather(comm, &me, places, sizeof me, w) < 0) goto fail;
  for (int r = 0; r < c->world; r++) {
    snprintf(c->hosts[r], HOST_LEN, "%s", places[r].host);
    c->peers[r].fd = -1;
  }
  const char *fault = getenv("LKS_FAULT");
#ifdef LKS_TEST_HOOKS
  // Test hook: LKS_FAULT=KIND@STEP[:RANK] (RANK defaults to 0). On rank 0, corrupt, gap and
  // version send a broken command at STEP, stall waits 2 s before sending it; die kills the
  // given rank with SIGKILL at STEP.
  if (fault) {
    char kind[32];
    unsigned long long at;
    int frank = 0;
    int got = sscanf(fault, "%31[a-z]@%llu:%d", kind, &at, &frank);
    if (got >= 2 && frank == c->rank) {
      snprintf(c->fault, sizeof c->fault, "%s", kind);
      c->fault_step = at;
      LKS_LOG(LKS_LOG_WARN, "LKS_FAULT: will inject '%s' at step %llu", kind, at);
    }
  }
#else
  if (fault && c->rank == 0)
    LKS_LOG(LKS_LOG_WARN, "LKS_FAULT is ignored: this build has no test hooks (-DLKS_TEST_HOOKS=ON)");
#endif
  if (c->rank == 0) {
    // The job's secret, which every worker presents in its hello (sent to them through MPI), and
    // the handler that checks it, in place before any socket listens.
    if (make_secret(c->secret) < 0) goto fail;
    c->zap = zmq_socket(c->ctx, ZMQ_REP);
    if (!c->zap || zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0) {
      zfail("ZAP handler");
      goto fail;
    }
    if (pthread_create(&c->zap_thread, NULL, zap_main, c) != 0) {
      lks_set_error(LKS_EIO, "control plane: cannot start the ZAP handler thread");
      goto fail;
    }
    c->zapping = true;
    char addr[INET_ADDRSTRLEN];
    if (control_addr(control_host, places, c->world, addr) < 0) goto fail;
    // One socket per worker on an ephemeral port of that address.
    for (int r = 1; r < c->world; r++) {
      peer *p = &c->peers[r];
      if (!(p->sock = bind_socket(c, ZMQ_DEALER, addr, eps[r]))) goto fail;
      if (monitor(c, p, r) < 0) goto fail;
      if (!(p->beat = bind_socket(c, ZMQ_PUSH, addr, eps[c->world + r]))) goto fail;
    }
    LKS_LOG(LKS_LOG_INFO, "control plane: listening on %s (commands %s, heartbeats %s; %s)", addr,
            c->world > 1 ? strrchr(eps[1], ':') + 1 : "-",
            c->world > 1 ? strrchr(eps[c->world + 1], ':') + 1 : "-",
            "peers must present the job's secret");
  }
  if (comm->ops->broadcast(comm, eps, (size_t)c->world * 2 * EP_LEN, 0, w) < 0) goto fail;
  if (comm->ops->broadcast(comm, c->secret, sizeof c->secret, 0, w) < 0) goto fail;
  if (c->rank != 0) {
    peer *p = &c->peers[0];
    p->sock = connect_socket(c, ZMQ_DEALER, eps[c->rank]);
    p->beat = connect_socket(c, ZMQ_PULL, eps[c->world + c->rank]);
    if (!p->sock || !p->beat || monitor(c, p, 0) < 0 || zmq_connect(p->sock, eps[c->rank]) != 0 ||
        zmq_connect(p->beat, eps[c->world + c->rank]) != 0) {
      zfail("connect");
      goto fail;
    }
    Lockstep__Ack hello = LOCKSTEP__ACK__INIT;
    hello.rank = (uint32_t)c->rank;
    if (send_ack(p->sock, &hello) < 0) goto fail;
  } else {
    // Wait for every worker's hello before any command.
    double deadline = lks_clock() + timeout_s;
    for (int r = 1; r < c->world; r++) {
      zmq_pollitem_t it = {c->peers[r].sock, 0, ZMQ_POLLIN, 0};
      long ms = (long)((deadline - lks_clock()) * 1e3);
      if (ms < 0 || zmq_poll(&it, 1, ms) <= 0) {
        lks_set_error(LKS_EIO, "control plane: no hello from rank %d (%s) within %.0f s (%s): "
                      "can that host reach this address? (--control-host sets it)", r,
                      c->hosts[r], timeout_s, eps[r]);
        goto fail;
      }
      if (drain_acks(c, r) < 0) goto fail;
    }
    LKS_LOG(LKS_LOG_INFO, "control plane: %d worker(s) connected", c->world - 1);
    if (pthread_create(&c->beat_thread, NULL, beat_main, c) != 0) {
      lks_set_error(LKS_EIO, "control plane: cannot start the heartbeat thread");
      goto fail;
    }
    c->beating = true;
  }
  free(eps);
  free(places);
  return c;
fail:
  free(eps);
  free(places);
  lks_ctl_free(c);
  return NULL;
}

void lks_ctl_free(lks_ctl *c) {
  if (!c) return;
  if (c->beating) {
    atomic_store(&c->stop_beat, true);
    pthread_join(c->beat_thread, NULL);
  }
  if (c->zapping) {
    atomic_store(&c->stop_zap, true);
    pthread_join(c->zap_thread, NULL);
  }
  if (c->zap) zmq_close(c->zap);
  for (int r = 0; c->peers && r < c->world; r++) {
    if (c->peers[r].sock) zmq_close(c->peers[r].sock);
    if (c->peers[r].mon) zmq_close(c->peers[r].mon);
    if (c->peers[r].beat) zmq_close(c->peers[r].beat);
  }
  if (c->ctx) zmq_ctx_term(c->ctx);
  free(c->peers);
  free(c->hosts);
  free(c);
}

int lks_ctl_send(lks_ctl *c, Lockstep__Command *cmd) {
  cmd->protocol_version = LKS_PROTOCOL_VERSION;
  cmd->step_id = ++c->step;
  c->comm->step = c->step;
  lks_log_set_step(c->step);
  if (cmd->type == LOCKSTEP__CMD_TYPE__EP_CMD_SHUTDOWN) c->shutdown_step = c->step;
  if (c->world == 1) return 0;
  LKS_TRY(lks_ctl_poll(c));
  uint64_t real_step = cmd->step_id;
#ifdef LKS_TEST_HOOKS
  if (c->fault_step == c->step && !strcmp(c->fault, "die")) raise(SIGKILL);
  if (c->fault_step == c->step && !strcmp(c->fault, "stall")) sleep(2);  // busy, not dead
  if (c->fault_step == c->step) {  // test hook: a broken command, to show workers refuse it
    if (!strcmp(c->fault, "gap")) cmd->step_id += 1;
    if (!strcmp(c->fault, "version")) cmd->protocol_version = 99;
  }
#endif
  uint8_t *buf;
  size_t n;
  int enc = lks_cmd_encode(cmd, &buf, &n);
  cmd->step_id = real_step;
  cmd->protocol_version = LKS_PROTOCOL_VERSION;
  if (enc < 0) return enc;
#ifdef LKS_TEST_HOOKS
  if (c->fault_step == c->step && !strcmp(c->fault, "corrupt"))
    for (size_t i = 0; i < n; i++) buf[i] ^= 0xa5;
#endif
  int rc = 0;
  for (int r = 1; r < c->world && rc == 0; r++) rc = send_msg(c->peers[r].sock, buf, n);
  free(buf);
  return rc;
}

int lks_ctl_wait_acks(lks_ctl *c, uint64_t step, double timeout_s) {
  double deadline = lks_clock() + timeout_s;
  for (int r = 1; r < c->world; r++) {
    while (c->peers[r].acked < step) {
      LKS_TRY(lks_ctl_poll(c));
      if (c->peers[r].acked >= step) break;
      zmq_pollitem_t it = {c->peers[r].sock, 0, ZMQ_POLLIN, 0};
      long ms = (long)((deadline - lks_clock()) * 1e3);
      if (ms <= 0)
        return lks_set_error(LKS_EIO, "rank %d (%s) did not ack step %llu within %.1f s", r,
                             c->hosts[r], (unsigned long long)step, timeout_s);
      zmq_poll(&it, 1, ms < 100 ? ms : 100);
    }
  }
  return 0;
}

int lks_ctl_recv(lks_ctl *c, Lockstep__Command **out, double timeout_s) {
  *out = NULL;
  peer *p = &c->peers[0];
  double deadline = lks_clock() + timeout_s;
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  for (;;) {
    if (disconnected(c, p)) {
      zmq_msg_close(&msg);
      return lks_set_error(LKS_EIO, "the coordinator (rank 0, %s) disconnected", c->hosts[0]);
    }
    zmq_pollitem_t it[2] = {{p->sock, 0, ZMQ_POLLIN, 0}, {p->beat, 0, ZMQ_POLLIN, 0}};
    long ms = (long)((deadline - lks_clock()) * 1e3);
    if (ms <= 0) {
      zmq_msg_close(&msg);
      return lks_set_error(LKS_EIO,
                           "no command or heartbeat from the coordinator (rank 0, %s) for %.1f s",
                           c->hosts[0], timeout_s);
    }
    if (zmq_poll(it, 2, ms < 100 ? ms : 100) <= 0) continue;
    if (it[1].revents & ZMQ_POLLIN) {  // a beat: the coordinator is alive; drain and wait on
      char b;
      while (zmq_recv(p->beat, &b, 1, ZMQ_DONTWAIT) >= 0) {
      }
      deadline = lks_clock() + timeout_s;
    }
    if ((it[0].revents & ZMQ_POLLIN) && zmq_msg_recv(&msg, p->sock, 0) >= 0) break;
  }
  Lockstep__Command *cmd;
  int rc = lks_cmd_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), c->step + 1, &cmd);
  zmq_msg_close(&msg);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", lks_last_error());
    return lks_set_error(rc, "rank %d: %s", c->rank, why);
  }
  c->step = cmd->step_id;
  c->comm->step = c->step;
  lks_log_set_step(c->step);
#ifdef LKS_TEST_HOOKS
  if (c->fault_step == c->step && !strcmp(c->fault, "die")) raise(SIGKILL);
#endif
  *out = cmd;
  return 0;
}

int lks_ctl_ack(lks_ctl *c, uint64_t step, int status, const char *error, double exec_s,
                double comm_s) {
  Lockstep__Ack a = LOCKSTEP__ACK__INIT;
  a.step_id = step;
  a.status = status;
  a.error = (char *)(error ? error : "");
  a.rank = (uint32_t)c->rank;
  a.exec_seconds = exec_s;
  a.comm_seconds = comm_s;
  return send_ack(c->peers[0].sock, &a);
}

double lks_ctl_last_worker_exec(const lks_ctl *c) {
  double w = 0;
  for (int r = 1; r < c->world; r++)
    if (c->peers[r].exec_s > w) w = c->peers[r].exec_s;
  return w;
}

void lks_ctl_window(lks_ctl *c) {
  c->win_from = c->step;
  for (int r = 1; r < c->world; r++) c->peers[r].win_exec = c->peers[r].win_comm = 0;
}

int lks_ctl_window_times(lks_ctl *c, double timeout_s, double *comm_min, double *comm_max,
                         double *compute_max) {
  LKS_TRY(lks_ctl_wait_acks(c, c->step, timeout_s));
  *comm_min = *comm_max = *compute_max = 0;
  for (int r = 1; r < c->world; r++) {
    const peer *p = &c->peers[r];
    if (r == 1 || p->win_comm < *comm_min) *comm_min = p->win_comm;
    if (p->win_comm > *comm_max) *comm_max = p->win_comm;
    if (p->win_exec - p->win_comm > *compute_max) *compute_max = p->win_exec - p->win_comm;
  }
  return 0;
}

bool lks_ctl_peer_up(lks_ctl *c, int rank) {
  if (rank <= 0 || rank >= c->world || c->rank != 0) return true;
  return !disconnected(c, &c->peers[rank]);
}
