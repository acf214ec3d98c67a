// SPDX-License-Identifier: MIT
// The worker role (rank > 0): receive each command, check it, execute it with the same engine
// code rank 0 runs, ack it. Exits on EP_CMD_SHUTDOWN (0), or with an error when a command is
// malformed or out of order, when the coordinator disconnects, or when no command (not even a
// heartbeat) arrives within three heartbeat intervals. SIGTERM is ignored: the coordinator
// drains and then sends the shutdown.
#ifndef LKS_WORKER_H
#define LKS_WORKER_H

#include "worker/world.h"

int lks_worker_run(lks_world *w);

#endif
