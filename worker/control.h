// SPDX-License-Identifier: MIT
// The control plane (DESIGN.md sections 1, 3 and 6): rank 0 sends every worker each command over
// ZeroMQ before running its own part; workers answer with acks. One DEALER socket pair per worker
// (bound by rank 0 on an ephemeral TCP port, endpoints handed out through MPI), so delivery is
// reliable and ordered per worker, no high-water mark drops anything (HWM 0), and a socket
// monitor names the rank whose connection drops. The conversation starts with a hello from each
// worker: no command is sent before every worker is connected (no slow joiner).
//
// Commands are protobuf-c messages (proto/lockstep.proto), one per frame. Rank 0 stamps the
// protocol version and the next step id; a worker checks both and the payload's type before
// executing anything. Nothing waits forever: every receive has a deadline.
//
// Used from one thread per process.
#ifndef LKS_WORKER_CONTROL_H
#define LKS_WORKER_CONTROL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/comm.h"
#include "proto/command.h"

typedef struct lks_ctl lks_ctl;

// Collective over `comm`: rank 0 binds one socket per worker, the endpoints go out by MPI, the
// workers connect and say hello; returns when all are connected or fails after timeout_s.
// Rank 0 also starts a heartbeat thread that sends every worker a beat each heartbeat_s on a
// socket of its own, so that a coordinator busy with local work (tokenizing, sampling, an HTTP
// request) is not taken for dead; a worker's wait for a command restarts at every beat.
// Rank 0 listens on control_host (--control-host; NULL or "": loopback when every rank shares
// this machine and network namespace, else the address of the host name, else an interface's,
// the cause logged) and admits only peers presenting the job's secret: 32 bytes from getrandom,
// sent to the workers through `comm`, checked in ZeroMQ's PLAIN handshake by a ZAP handler.
// Anything else that connects fails the handshake, never receives a command, and is logged.
lks_ctl *lks_ctl_new(lks_comm *comm, double timeout_s, double heartbeat_s, const char *control_host);
void lks_ctl_free(lks_ctl *c);

// Rank 0: stamps version and the next step id into cmd and sends it to every worker. Also
// reads any acks that arrived (errors from workers fail the call, naming the rank).
int lks_ctl_send(lks_ctl *c, Lockstep__Command *cmd);
// Rank 0: waits until every worker acked step `step` (or the deadline passes).
int lks_ctl_wait_acks(lks_ctl *c, uint64_t step, double timeout_s);

// Worker: the next command, validated (version, step id, payload type); the caller frees it with
// lockstep__command__free_unpacked. Fails after timeout_s without a command or a heartbeat, or
// when the coordinator disconnects.
int lks_ctl_recv(lks_ctl *c, Lockstep__Command **cmd, double timeout_s);
// Worker: answers a command.
int lks_ctl_ack(lks_ctl *c, uint64_t step, int status, const char *error, double exec_s,
                double comm_s);

// The liveness check for collectives (lks_comm_poll_fn): fails when a peer's connection dropped
// or a worker reported an error.
int lks_ctl_poll(void *ctl);

// Rank 0: whether worker `rank`'s connection is up (its socket has not dropped). Rank 0 itself
// and out-of-range ranks read as up.
bool lks_ctl_peer_up(lks_ctl *c, int rank);

// Rank 0's view of the last acks: the slowest worker's execution time of the last acked step.
double lks_ctl_last_worker_exec(const lks_ctl *c);

// Rank 0: the workers' own times over a window of steps (the bench). lks_ctl_window starts it
// after the last step sent; lks_ctl_window_times waits for every worker's ack of the last step
// sent since, then gives the least and the most over workers of their summed time inside
// collectives, and the most of their summed execution time outside them.
void lks_ctl_window(lks_ctl *c);
int lks_ctl_window_times(lks_ctl *c, double timeout_s, double *comm_min, double *comm_max,
                         double *compute_max);

#endif
