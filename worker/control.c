// SPDX-License-Identifier: MIT
// The ZeroMQ control plane (see control.h).
#include "worker/control.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "proto/command.h"

enum { EP_LEN = 256, HOST_LEN = 64 };

typedef struct {
  void *sock, *mon;       // command socket, its monitor
  void *beat;             // heartbeats: rank 0 PUSH (used by the heartbeat thread), worker PULL
  uint64_t acked;         // last step acked
  double exec_s, comm_s;  // timings of that ack
  bool dead;
} peer;

struct lks_ctl {
  lks_comm *comm;
  void *ctx;
  int rank, world;
  peer *peers;   // rank 0: [world], index = worker rank; worker: [1], the coordinator
  char (*hosts)[HOST_LEN];
  uint64_t step;  // rank 0: last sent; worker: last received
  uint64_t shutdown_step;  // rank 0: the step of EP_CMD_SHUTDOWN, once sent
  char fault[64];
  uint64_t fault_step;
  pthread_t beat_thread;
  bool beating;
  atomic_bool stop_beat;
  double heartbeat_s;
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

static int monitor(lks_ctl *c, peer *p, int index) {
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://lks-monitor-%d", index);
  if (zmq_socket_monitor(p->sock, ep, ZMQ_EVENT_DISCONNECTED) != 0) return zfail("socket monitor");
  p->mon = zmq_socket(c->ctx, ZMQ_PAIR);
  if (!p->mon || zmq_connect(p->mon, ep) != 0) return zfail("monitor connect");
  return 0;
}

// True when the monitor reported a dropped connection.
static bool disconnected(peer *p) {
  if (!p->mon || p->dead) return p->dead;
  for (;;) {
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, p->mon, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&ev);
      break;
    }
    if (zmq_msg_size(&ev) >= 2) {
      uint16_t id;
      memcpy(&id, zmq_msg_data(&ev), 2);
      if (id == ZMQ_EVENT_DISCONNECTED) p->dead = true;
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
      if (disconnected(&c->peers[r]) && !done)
        return lks_set_error(LKS_EIO, "rank %d (%s) disconnected: the worker process is gone", r,
                             c->hosts[r]);
    }
  } else if (disconnected(&c->peers[0])) {
    return lks_set_error(LKS_EIO, "the coordinator (rank 0, %s) disconnected", c->hosts[0]);
  }
  return 0;
}

lks_ctl *lks_ctl_new(lks_comm *comm, double timeout_s, double heartbeat_s) {
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
  lks_comm_where w = {"control plane start", -1};
  if (!c->ctx || !c->peers || !c->hosts || !eps) goto fail;
  char me[HOST_LEN] = "";
  gethostname(me, sizeof me - 1);
  if (comm->ops->allgather(comm, me, c->hosts, HOST_LEN, w) < 0) goto fail;
  // Test hook: LKS_FAULT=KIND@STEP[:RANK] (RANK defaults to 0). On rank 0, corrupt, gap and
  // version send a broken command at STEP, stall waits 2 s before sending it; die kills the
  // given rank with SIGKILL at STEP.
  const char *fault = getenv("LKS_FAULT");
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
  if (c->rank == 0) {
    // One socket per worker on an ephemeral port, advertised under this host's name (or
    // LKS_CONTROL_HOST, for hosts whose names do not resolve between them).
    const char *adv = getenv("LKS_CONTROL_HOST");
    for (int r = 1; r < c->world; r++) {
      peer *p = &c->peers[r];
      p->sock = new_socket(c, ZMQ_DEALER);
      if (!p->sock || zmq_bind(p->sock, "tcp://*:*") != 0) {
        zfail("bind");
        goto fail;
      }
      char last[EP_LEN];
      size_t n = sizeof last;
      zmq_getsockopt(p->sock, ZMQ_LAST_ENDPOINT, last, &n);
      const char *port = strrchr(last, ':');
      snprintf(eps[r], EP_LEN, "tcp://%s%s", adv && *adv ? adv : me, port ? port : ":0");
      if (monitor(c, p, r) < 0) goto fail;
      p->beat = new_socket(c, ZMQ_PUSH);
      if (!p->beat || zmq_bind(p->beat, "tcp://*:*") != 0) {
        zfail("bind");
        goto fail;
      }
      n = sizeof last;
      zmq_getsockopt(p->beat, ZMQ_LAST_ENDPOINT, last, &n);
      port = strrchr(last, ':');
      snprintf(eps[c->world + r], EP_LEN, "tcp://%s%s", adv && *adv ? adv : me, port ? port : ":0");
    }
  }
  if (comm->ops->broadcast(comm, eps, (size_t)c->world * 2 * EP_LEN, 0, w) < 0) goto fail;
  if (c->rank != 0) {
    peer *p = &c->peers[0];
    p->sock = new_socket(c, ZMQ_DEALER);
    p->beat = new_socket(c, ZMQ_PULL);
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
        lks_set_error(LKS_EIO, "control plane: no hello from rank %d (%s) within %.0f s (%s)", r,
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
  return c;
fail:
  free(eps);
  lks_ctl_free(c);
  return NULL;
}

void lks_ctl_free(lks_ctl *c) {
  if (!c) return;
  if (c->beating) {
    atomic_store(&c->stop_beat, true);
    pthread_join(c->beat_thread, NULL);
  }
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
  if (c->fault_step == c->step && !strcmp(c->fault, "die")) raise(SIGKILL);
  if (c->fault_step == c->step && !strcmp(c->fault, "stall")) sleep(2);  // busy, not dead
  if (c->fault_step == c->step) {  // test hook: a broken command, to show workers refuse it
    if (!strcmp(c->fault, "gap")) cmd->step_id += 1;
    if (!strcmp(c->fault, "version")) cmd->protocol_version = 99;
  }
  uint8_t *buf;
  size_t n;
  int enc = lks_cmd_encode(cmd, &buf, &n);
  cmd->step_id = real_step;
  cmd->protocol_version = LKS_PROTOCOL_VERSION;
  if (enc < 0) return enc;
  if (c->fault_step == c->step && !strcmp(c->fault, "corrupt"))
    for (size_t i = 0; i < n; i++) buf[i] ^= 0xa5;
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
    if (disconnected(p)) {
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
  if (c->fault_step == c->step && !strcmp(c->fault, "die")) raise(SIGKILL);
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

bool lks_ctl_peer_up(lks_ctl *c, int rank) {
  if (rank <= 0 || rank >= c->world || c->rank != 0) return true;
  return !disconnected(&c->peers[rank]);
}
