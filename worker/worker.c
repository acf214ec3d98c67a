// SPDX-License-Identifier: MIT
// The worker command loop (see worker.h).
#include "worker/worker.h"

#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

int lks_worker_run(lks_world *w) {
  // A launcher's SIGTERM (slurm's scancel, systemd) reaches every rank at once; the workers keep
  // serving the coordinator's drain and leave at its EP_CMD_SHUTDOWN (or when it disappears).
  signal(SIGTERM, SIG_IGN);
  for (;;) {
    Lockstep__Command *cmd;
    int rc = lks_ctl_recv(w->ctl, &cmd, 3 * w->heartbeat_s);
    if (rc < 0) {
      // Tell the coordinator, if it is still there, then stop.
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", lks_last_error());
      lks_ctl_ack(w->ctl, 0, rc, msg, 0, 0);
      return lks_set_error(rc, "%s", msg);
    }
    double t0 = lks_clock(), c0 = w->comm->stats.seconds;
    bool shutdown = cmd->type == LOCKSTEP__CMD_TYPE__EP_CMD_SHUTDOWN;
    uint64_t step = cmd->step_id;
    rc = lks_engine_exec(w->engine, cmd, NULL);
    lockstep__command__free_unpacked(cmd, NULL);
    char msg[1024] = "";
    if (rc < 0) snprintf(msg, sizeof msg, "%s", lks_last_error());
    lks_ctl_ack(w->ctl, step, rc, msg, lks_clock() - t0, w->comm->stats.seconds - c0);
    if (rc < 0) return lks_set_error(rc, "step %llu: %s", (unsigned long long)step, msg);
    if (shutdown) return 0;
  }
}
