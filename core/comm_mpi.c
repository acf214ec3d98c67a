// SPDX-License-Identifier: MIT
// The `mpi` collectives (see comm.h) and MPI start-up. Each collective is the non-blocking MPI
// call, then MPI_Test in a loop against the deadline, yielding the core between tests (ranks are
// often oversubscribed on small machines) and calling the liveness hook about every millisecond.
// MPI errors are returned (MPI_ERRORS_RETURN), never fatal inside MPI.
#include <mpi.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/log.h"

static int mpi_fail(lks_comm *c, int rc, const char *coll, lks_comm_where w) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return lks_set_error(LKS_EBACKEND, "collective %s (%s, layer %d, step %llu) failed on rank %d: %s",
                       coll, w.what ? w.what : "-", w.layer, (unsigned long long)c->step, c->rank,
                       msg);
}

// Waits for a started request until the deadline.
static int wait_req(lks_comm *c, MPI_Request *req, const char *coll, lks_comm_where w) {
  double t0 = lks_clock(), next_poll = t0 + 1e-3;
  for (long spins = 0;; spins++) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, coll, w);
    if (done) break;
    if (spins < 200) continue;
    sched_yield();
    double t = lks_clock();
    if (t < next_poll) continue;
    next_poll = t + 1e-3;
    if (c->poll) {
      int prc = c->poll(c->poll_ctx);
      if (prc < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", lks_last_error());
        return lks_set_error(prc, "collective %s (%s, layer %d, step %llu) abandoned on rank %d: %s",
                             coll, w.what ? w.what : "-", w.layer, (unsigned long long)c->step,
                             c->rank, why);
      }
    }
    if (t - t0 > c->timeout_s)
      return lks_set_error(LKS_EBACKEND,
                           "collective %s (%s, layer %d, step %llu) timed out after %.1f s on rank %d "
                           "(a peer is gone or stuck)",
                           coll, w.what ? w.what : "-", w.layer, (unsigned long long)c->step,
                           c->timeout_s, c->rank);
  }
  c->stats.seconds += lks_clock() - t0;
  return 0;
}

// bf16 sum with f32 accumulation, as an MPI user operation on 16-bit elements.
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) b[i] = lks_f32_to_bf16(lks_bf16_to_f32(a[i]) + lks_bf16_to_f32(b[i]));
}

typedef struct {
  lks_comm base;
  MPI_Op bf16_op;
} mpi_comm;

static int m_allreduce(lks_comm *c, void *buf, size_t n, lks_dtype dt, lks_comm_where w) {
  mpi_comm *m = (mpi_comm *)c;
  c->stats.allreduce++;
  if (n > (size_t)INT32_MAX) return lks_set_error(LKS_EINVAL, "allreduce of %zu elements", n);
  MPI_Request req;
  int rc;
  if (dt == LKS_F32)
    rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
  else if (dt == LKS_BF16)
    rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_UINT16_T, m->bf16_op, MPI_COMM_WORLD, &req);
  else
    return lks_set_error(LKS_EUNSUPPORTED, "allreduce_sum of %s", lks_dtype_name(dt));
  if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allreduce_sum", w);
  return wait_req(c, &req, "allreduce_sum", w);
}

static int m_allgather(lks_comm *c, const void *send, void *recv, size_t bytes, lks_comm_where w) {
  c->stats.allgather++;
  if (bytes > (size_t)INT32_MAX) return lks_set_error(LKS_EINVAL, "allgather of %zu bytes", bytes);
  MPI_Request req;
  int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allgather", w);
  return wait_req(c, &req, "allgather", w);
}

static int m_broadcast(lks_comm *c, void *buf, size_t bytes, int root, lks_comm_where w) {
  c->stats.broadcast++;
  if (bytes > (size_t)INT32_MAX) return lks_set_error(LKS_EINVAL, "broadcast of %zu bytes", bytes);
  MPI_Request req;
  int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "broadcast", w);
  return wait_req(c, &req, "broadcast", w);
}

static int m_argmax(lks_comm *c, float *val, int32_t *idx, int n, lks_comm_where w) {
  c->stats.argmax++;
  struct {
    float v;
    int i;
  } *pairs = malloc((size_t)(n > 0 ? n : 1) * sizeof *pairs);
  if (!pairs) return lks_set_error(LKS_ENOMEM, "argmax: out of memory");
  for (int k = 0; k < n; k++) {
    pairs[k].v = val[k];
    pairs[k].i = idx[k];
  }
  // MPI_MAXLOC keeps the lower index when values tie.
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, pairs, n, MPI_FLOAT_INT, MPI_MAXLOC, MPI_COMM_WORLD, &req);
  if (rc == MPI_SUCCESS) rc = wait_req(c, &req, "argmax_allreduce", w);
  else rc = mpi_fail(c, rc, "argmax_allreduce", w);
  for (int k = 0; rc == 0 && k < n; k++) {
    val[k] = pairs[k].v;
    idx[k] = pairs[k].i;
  }
  free(pairs);
  return rc;
}

static int m_vote(lks_comm *c, int64_t *v, MPI_Op op, const char *name, lks_comm_where w) {
  c->stats.vote++;
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, v, 1, MPI_INT64_T, op, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(c, rc, name, w);
  return wait_req(c, &req, name, w);
}
static int m_vote_min(lks_comm *c, int64_t *v, lks_comm_where w) { return m_vote(c, v, MPI_MIN, "vote_min", w); }
static int m_vote_max(lks_comm *c, int64_t *v, lks_comm_where w) { return m_vote(c, v, MPI_MAX, "vote_max", w); }

static int m_barrier(lks_comm *c, lks_comm_where w) {
  c->stats.barrier++;
  MPI_Request req;
  int rc = MPI_Ibarrier(MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "barrier", w);
  return wait_req(c, &req, "barrier", w);
}

static void m_free(lks_comm *c) {
  mpi_comm *m = (mpi_comm *)c;
  MPI_Op_free(&m->bf16_op);
  free(m);
}

static const lks_comm_ops mpi_ops = {
    .name = "mpi",
    .free = m_free,
    .allreduce_sum = m_allreduce,
    .allgather = m_allgather,
    .broadcast = m_broadcast,
    .argmax = m_argmax,
    .vote_min = m_vote_min,
    .vote_max = m_vote_max,
    .barrier = m_barrier,
};

lks_comm *lks_comm_mpi_new(double timeout_s) {
  mpi_comm *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->base.ops = &mpi_ops;
  MPI_Comm_rank(MPI_COMM_WORLD, &m->base.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &m->base.world);
  m->base.timeout_s = timeout_s;
  MPI_Op_create(bf16_sum, 1, &m->bf16_op);
  return &m->base;
}

static int mpi_started;

int lks_mpi_init(int *argc, char ***argv, int *rank, int *world) {
  *rank = 0;
  *world = 1;
  // Start MPI only under a launcher: a plain `lockstep generate` stays a process of its own,
  // with no MPI singleton start-up.
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
  bool launched = false;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) launched |= getenv(vars[i]) != NULL;
  if (!launched) return 0;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return lks_set_error(LKS_EBACKEND, "MPI_Init_thread failed");
  mpi_started = 1;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, world);
  lks_log_set_rank(*rank);
  return 0;
}

void lks_mpi_finalize(void) {
  if (mpi_started) MPI_Finalize();
  mpi_started = 0;
}

void lks_mpi_abort(int code) {
  if (mpi_started) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}
