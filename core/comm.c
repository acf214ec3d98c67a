// SPDX-License-Identifier: MIT
// The `local` collectives (a world of one) and the helpers shared by all (see comm.h).
#include "core/comm.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int loc_allreduce(lks_comm *c, void *b, size_t n, lks_dtype dt, lks_comm_where w) {
  (void)b, (void)n, (void)dt, (void)w;
  c->stats.allreduce++;
  return 0;
}
static int loc_allgather(lks_comm *c, const void *s, void *r, size_t bytes, lks_comm_where w) {
  (void)w;
  c->stats.allgather++;
  if (s != r) memmove(r, s, bytes);
  return 0;
}
static int loc_broadcast(lks_comm *c, void *b, size_t n, int root, lks_comm_where w) {
  (void)b, (void)n, (void)root, (void)w;
  c->stats.broadcast++;
  return 0;
}
static int loc_argmax(lks_comm *c, float *v, int32_t *i, int n, lks_comm_where w) {
  (void)v, (void)i, (void)n, (void)w;
  c->stats.argmax++;
  return 0;
}
static int loc_vote(lks_comm *c, int64_t *v, lks_comm_where w) {
  (void)v, (void)w;
  c->stats.vote++;
  return 0;
}
static int loc_barrier(lks_comm *c, lks_comm_where w) {
  (void)w;
  c->stats.barrier++;
  return 0;
}
static void loc_free(lks_comm *c) { free(c); }

static const lks_comm_ops local_ops = {
    .name = "local",
    .free = loc_free,
    .allreduce_sum = loc_allreduce,
    .allgather = loc_allgather,
    .broadcast = loc_broadcast,
    .argmax = loc_argmax,
    .vote_min = loc_vote,
    .vote_max = loc_vote,
    .barrier = loc_barrier,
};

lks_comm *lks_comm_local_new(void) {
  lks_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->ops = &local_ops;
  c->rank = 0;
  c->world = 1;
  c->timeout_s = 60;
  return c;
}

void lks_comm_free(lks_comm *c) {
  if (c) c->ops->free(c);
}

#ifndef LKS_HAVE_CUDA
lks_comm *lks_comm_nccl_new(double timeout_s, int device) {
  (void)timeout_s, (void)device;
  lks_set_error(LKS_EUNSUPPORTED, "--comm nccl: this build has no CUDA (configure with the CUDA toolkit)");
  return NULL;
}

lks_comm *lks_comm_mpi_cuda_new(double timeout_s) {
  (void)timeout_s;
  lks_set_error(LKS_EUNSUPPORTED, "this build has no CUDA (configure with the CUDA toolkit)");
  return NULL;
}
#endif
