// SPDX-License-Identifier: MIT
// The world: what every rank, coordinator and worker alike, starts and holds to execute
// commands (DESIGN.md section 6). lks_world_start runs on every rank: MPI, the fingerprint
// agreement (any difference in protocol, build, model or forward-changing flags stops every rank
// with a message naming the field and the ranks), this rank's shard of the model, the engine,
// and the control plane. Rank 0 then drives the world (coordinator/submit.h); the other ranks run
// lks_worker_run until shutdown.
#ifndef LKS_WORKER_WORLD_H
#define LKS_WORKER_WORLD_H

#include "core/backend.h"
#include "core/comm.h"
#include "core/settings.h"
#include "model/model.h"
#include "worker/control.h"
#include "worker/engine.h"

typedef struct lks_world {
  int rank, world;
  const lks_settings *settings;
  lks_backend *be;
  lks_comm *comm;
  lks_model *model;
  lks_engine *engine;
  lks_ctl *ctl;  // NULL at world 1
  double heartbeat_s;
  // Rank 0's time split of submitted commands (for bench): control plane, compute, collectives.
  double t_control, t_exec, t_comm;
  uint64_t n_submitted;
  // World > 1, cpu backend: the median time of an all-reduce of one decode row (hidden floats)
  // with every rank present, measured at start (0 where not measured): a collective's own cost,
  // apart from the waits for a slower rank.
  double allreduce_s;
} lks_world;

// Starts this rank's part of the world. NULL on failure (lks_last_error() says why; the other
// ranks fail too, within the deadlines).
lks_world *lks_world_start(const lks_settings *s, const char *model_dir, int max_slots);
// Rank 0: tells the workers to exit and waits for their acks; then frees (all ranks).
void lks_world_stop(lks_world *w);

// The build's identity (git describe at configure time), as the fingerprint carries it.
const char *lks_build_id(void);

// Compares the fingerprints of all ranks (a collective). Exposed for tests.
int lks_world_agree(lks_comm *comm, const lks_settings *s, const char *model_dir);

#endif
