// SPDX-License-Identifier: MIT
// The collectives of the CUDA backend (see core/comm.h):
//
// `nccl`: NCCL over MPI_COMM_WORLD, one GPU per rank. The unique id travels through MPI; the
// communicator is non-blocking (ncclConfig_t.blocking = 0), so neither its creation nor a
// collective can hang the caller: every call enqueues on the comm's own stream, then polls
// ncclCommGetAsyncError and cudaStreamQuery against the deadline, yielding the core and calling
// the liveness hook about every millisecond. On timeout, on an NCCL error or when the hook
// reports a dead peer, the communicator is aborted (ncclCommAbort) and the call fails with an
// error naming the collective, the layer and the step, in the wording of comm_mpi.c; every later
// call fails at once. allreduce_sum receives device memory (buf_ptr of the cuda backend);
// allgather and broadcast are called with host memory by the world start, the model and the
// control plane, so host pointers (found with cudaPointerGetAttributes) are staged through a
// device buffer of the comm's own. arg-max gathers (value, index) pairs from every rank and picks
// the maximum with ties to the lower index on the host; votes are int64 min/max reductions.
//
// `mpi` with the cuda backend: the MPI collectives of comm_mpi.c, with device buffers staged
// through host memory, so that no CUDA-aware MPI is needed (and two ranks may share one GPU,
// which NCCL refuses).
#include <mpi.h>
#include <nccl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "core/error.h"
#include "core/log.h"
#include "cuda/cuda_impl.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Device memory (or managed memory, which NCCL reads as well); false for host memory of any kind.
static bool is_device(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: unregistered host memory on old drivers
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

typedef struct {
  lks_comm base;
  ncclComm_t nc;
  cudaStream_t st;
  cudaEvent_t ev;  // recorded on the backend's stream before a collective reads device memory
  int device;
  bool broken;   // aborted after a failure: every call fails
  void *dev;     // staging buffer on the device
  size_t dev_cap;
} nccl_comm;

static const char *where_what(lks_comm_where w) { return w.what ? w.what : "-"; }

static void nc_abort(nccl_comm *n) {
  if (n->nc) ncclCommAbort(n->nc);
  n->nc = NULL;
  n->broken = true;
}

static int nc_fail(nccl_comm *n, const char *coll, lks_comm_where w, const char *why) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", why);
  nc_abort(n);
  return lks_set_error(LKS_EBACKEND, "collective %s (%s, layer %d, step %llu) failed on rank %d: %s",
                       coll, where_what(w), w.layer, (unsigned long long)n->base.step,
                       n->base.rank, msg);
}

static int nc_fail_nccl(nccl_comm *n, const char *coll, lks_comm_where w, ncclResult_t r) {
  char why[384];
  const char *last = n->nc ? ncclGetLastError(n->nc) : NULL;
  snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "",
           last ? last : "");
  return nc_fail(n, coll, w, why);
}

static int nc_fail_cuda(nccl_comm *n, const char *coll, lks_comm_where w, cudaError_t e) {
  char why[256];
  snprintf(why, sizeof why, "cuda: %s", cudaGetErrorString(e));
  return nc_fail(n, coll, w, why);
}

static int nc_usable(nccl_comm *n, const char *coll, lks_comm_where w) {
  if (!n->broken) return 0;
  return lks_set_error(LKS_EBACKEND,
                       "collective %s (%s, layer %d, step %llu) refused on rank %d: the NCCL "
                       "communicator was aborted by an earlier failure",
                       coll, where_what(w), w.layer, (unsigned long long)n->base.step,
                       n->base.rank);
}

// Waits until everything enqueued on the comm's stream is done, or the deadline, a transport
// error or the liveness hook ends the wait (then the communicator is aborted).
static int nc_wait(nccl_comm *n, const char *coll, lks_comm_where w) {
  lks_comm *c = &n->base;
  double t0 = now(), next_poll = t0 + 1e-3;
  for (long spins = 0;; spins++) {
    ncclResult_t ar = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(n->nc, &ar);
    if (r != ncclSuccess) ar = r;
    if (ar != ncclSuccess && ar != ncclInProgress) return nc_fail_nccl(n, coll, w, ar);
    if (ar == ncclSuccess) {
      cudaError_t e = cudaStreamQuery(n->st);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return nc_fail_cuda(n, coll, w, e);
    }
    if (spins < 200) continue;
    sched_yield();
    double t = now();
    if (t < next_poll) continue;
    next_poll = t + 1e-3;
    if (c->poll) {
      int prc = c->poll(c->poll_ctx);
      if (prc < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", lks_last_error());
        nc_abort(n);
        return lks_set_error(prc, "collective %s (%s, layer %d, step %llu) abandoned on rank %d: %s",
                             coll, where_what(w), w.layer, (unsigned long long)c->step, c->rank,
                             why);
      }
    }
    if (t - t0 > c->timeout_s) {
      nc_abort(n);
      return lks_set_error(LKS_EBACKEND,
                           "collective %s (%s, layer %d, step %llu) timed out after %.1f s on rank %d "
                           "(a peer is gone or stuck)",
                           coll, where_what(w), w.layer, (unsigned long long)c->step,
                           c->timeout_s, c->rank);
    }
  }
  c->stats.seconds += now() - t0;
  return 0;
}

// An NCCL call's immediate result: ncclInProgress is the normal answer of a non-blocking comm.
#define NC_ENQ(n, coll, w, call)                                       \
  do {                                                                 \
    ncclResult_t lks__nr = (call);                                     \
    if (lks__nr != ncclSuccess && lks__nr != ncclInProgress)           \
      return nc_fail_nccl((n), (coll), (w), lks__nr);                  \
  } while (0)

#define NC_CUDA(n, coll, w, call)                                      \
  do {                                                                 \
    cudaError_t lks__ce2 = (call);                                     \
    if (lks__ce2 != cudaSuccess) return nc_fail_cuda((n), (coll), (w), lks__ce2); \
  } while (0)

// Device buffers are written by the backend on its own stream, which the comm's stream does not
// wait for: before a collective reads device memory, the comm's stream waits for an event
// recorded on the backend's stream (all the backend's work so far), or, when the process does
// not have exactly one cuda backend to ask (lks__cuda_work_stream), for the whole device. (The
// backend's later work is enqueued only after the collective is seen complete, so it reads the
// result.)
static int settle(nccl_comm *n, const char *coll, lks_comm_where w) {
  cudaStream_t bs = lks__cuda_work_stream();
  if (!bs) {
    NC_CUDA(n, coll, w, cudaDeviceSynchronize());
    return 0;
  }
  NC_CUDA(n, coll, w, cudaEventRecord(n->ev, bs));
  NC_CUDA(n, coll, w, cudaStreamWaitEvent(n->st, n->ev, 0));
  return 0;
}

static int stage(nccl_comm *n, size_t bytes, const char *coll, lks_comm_where w) {
  if (n->dev_cap >= bytes) return 0;
  if (n->dev) NC_CUDA(n, coll, w, cudaFree(n->dev));
  n->dev = NULL;
  n->dev_cap = 0;
  size_t nb = bytes < 4096 ? 4096 : bytes + bytes / 2;
  NC_CUDA(n, coll, w, cudaMalloc(&n->dev, nb));
  n->dev_cap = nb;
  return 0;
}

static int nc_allreduce(lks_comm *c, void *buf, size_t count, lks_dtype dt, lks_comm_where w) {
  nccl_comm *n = (nccl_comm *)c;
  const char *coll = "allreduce_sum";
  c->stats.allreduce++;
  LKS_TRY(nc_usable(n, coll, w));
  ncclDataType_t t;
  if (dt == LKS_F32)
    t = ncclFloat32;
  else if (dt == LKS_BF16)
    t = ncclBfloat16;
  else
    return lks_set_error(LKS_EUNSUPPORTED, "allreduce_sum of %s", lks_dtype_name(dt));
  if (count == 0) return 0;
  size_t bytes = count * lks_dtype_size(dt);
  bool dev = is_device(buf);
  void *p = buf;
  if (!dev) {
    LKS_TRY(stage(n, bytes, coll, w));
    NC_CUDA(n, coll, w, cudaMemcpyAsync(n->dev, buf, bytes, cudaMemcpyHostToDevice, n->st));
    p = n->dev;
  } else {
    LKS_TRY(settle(n, coll, w));
  }
  NC_ENQ(n, coll, w, ncclAllReduce(p, p, count, t, ncclSum, n->nc, n->st));
  LKS_TRY(nc_wait(n, coll, w));
  if (!dev) NC_CUDA(n, coll, w, cudaMemcpy(buf, n->dev, bytes, cudaMemcpyDeviceToHost));
  return 0;
}

// The allgather itself, without the counter (arg-max uses it too).
static int gather(nccl_comm *n, const void *send, void *recv, size_t bytes, const char *coll,
                  lks_comm_where w) {
  LKS_TRY(nc_usable(n, coll, w));
  if (bytes == 0) return 0;
  size_t total = bytes * (size_t)n->base.world;
  bool ds = is_device(send), dr = is_device(recv);
  if (ds || dr) LKS_TRY(settle(n, coll, w));
  if (ds && dr) {
    NC_ENQ(n, coll, w, ncclAllGather(send, recv, bytes, ncclUint8, n->nc, n->st));
    return nc_wait(n, coll, w);
  }
  LKS_TRY(stage(n, total, coll, w));
  char *mine = (char *)n->dev + bytes * (size_t)n->base.rank;
  // In place: this rank's part of the result is its send buffer.
  NC_CUDA(n, coll, w, cudaMemcpyAsync(mine, send, bytes, cudaMemcpyDefault, n->st));
  NC_ENQ(n, coll, w, ncclAllGather(mine, n->dev, bytes, ncclUint8, n->nc, n->st));
  LKS_TRY(nc_wait(n, coll, w));
  NC_CUDA(n, coll, w, cudaMemcpy(recv, n->dev, total, cudaMemcpyDefault));
  // A device-to-device cudaMemcpy may return before the copy is done.
  if (dr) NC_CUDA(n, coll, w, cudaDeviceSynchronize());
  return 0;
}

static int nc_allgather(lks_comm *c, const void *send, void *recv, size_t bytes,
                        lks_comm_where w) {
  c->stats.allgather++;
  return gather((nccl_comm *)c, send, recv, bytes, "allgather", w);
}

static int nc_broadcast(lks_comm *c, void *buf, size_t bytes, int root, lks_comm_where w) {
  nccl_comm *n = (nccl_comm *)c;
  const char *coll = "broadcast";
  c->stats.broadcast++;
  LKS_TRY(nc_usable(n, coll, w));
  if (root < 0 || root >= c->world)
    return lks_set_error(LKS_EINVAL, "broadcast from rank %d of %d", root, c->world);
  if (bytes == 0) return 0;
  bool dev = is_device(buf);
  void *p = buf;
  if (dev) LKS_TRY(settle(n, coll, w));
  if (!dev) {
    LKS_TRY(stage(n, bytes, coll, w));
    if (c->rank == root)
      NC_CUDA(n, coll, w, cudaMemcpyAsync(n->dev, buf, bytes, cudaMemcpyHostToDevice, n->st));
    p = n->dev;
  }
  NC_ENQ(n, coll, w, ncclBroadcast(p, p, bytes, ncclUint8, root, n->nc, n->st));
  LKS_TRY(nc_wait(n, coll, w));
  if (!dev && c->rank != root)
    NC_CUDA(n, coll, w, cudaMemcpy(buf, n->dev, bytes, cudaMemcpyDeviceToHost));
  return 0;
}

typedef struct {
  float v;
  int32_t i;
} vi_pair;

static int nc_argmax(lks_comm *c, float *val, int32_t *idx, int n_rows, lks_comm_where w) {
  nccl_comm *n = (nccl_comm *)c;
  c->stats.argmax++;
  if (n_rows <= 0) return nc_usable(n, "argmax_allreduce", w);
  size_t per = (size_t)n_rows * sizeof(vi_pair);
  vi_pair *all = malloc(per * (size_t)(c->world + 1));
  if (!all) return lks_set_error(LKS_ENOMEM, "argmax: out of memory");
  vi_pair *mine = all + (size_t)n_rows * c->world;
  for (int k = 0; k < n_rows; k++) {
    mine[k].v = val[k];
    mine[k].i = idx[k];
  }
  int rc = gather(n, mine, all, per, "argmax_allreduce", w);
  for (int k = 0; rc == 0 && k < n_rows; k++) {
    vi_pair best = all[k];
    for (int r = 1; r < c->world; r++) {
      vi_pair o = all[(size_t)r * n_rows + k];
      if (o.v > best.v || (o.v == best.v && o.i < best.i)) best = o;
    }
    val[k] = best.v;
    idx[k] = best.i;
  }
  free(all);
  return rc;
}

static int nc_vote(lks_comm *c, int64_t *v, ncclRedOp_t op, const char *coll, lks_comm_where w) {
  nccl_comm *n = (nccl_comm *)c;
  c->stats.vote++;
  LKS_TRY(nc_usable(n, coll, w));
  LKS_TRY(stage(n, sizeof *v, coll, w));
  NC_CUDA(n, coll, w, cudaMemcpyAsync(n->dev, v, sizeof *v, cudaMemcpyHostToDevice, n->st));
  NC_ENQ(n, coll, w, ncclAllReduce(n->dev, n->dev, 1, ncclInt64, op, n->nc, n->st));
  LKS_TRY(nc_wait(n, coll, w));
  NC_CUDA(n, coll, w, cudaMemcpy(v, n->dev, sizeof *v, cudaMemcpyDeviceToHost));
  return 0;
}
static int nc_vote_min(lks_comm *c, int64_t *v, lks_comm_where w) {
  return nc_vote(c, v, ncclMin, "vote_min", w);
}
static int nc_vote_max(lks_comm *c, int64_t *v, lks_comm_where w) {
  return nc_vote(c, v, ncclMax, "vote_max", w);
}

static int nc_barrier(lks_comm *c, lks_comm_where w) {
  nccl_comm *n = (nccl_comm *)c;
  const char *coll = "barrier";
  c->stats.barrier++;
  LKS_TRY(nc_usable(n, coll, w));
  LKS_TRY(stage(n, sizeof(int32_t), coll, w));
  NC_ENQ(n, coll, w, ncclAllReduce(n->dev, n->dev, 1, ncclInt32, ncclSum, n->nc, n->st));
  return nc_wait(n, coll, w);
}

static void nc_free(lks_comm *c) {
  nccl_comm *n = (nccl_comm *)c;
  if (!n) return;
  if (n->nc) {
    // A clean finish; a communicator that failed was aborted already.
    ncclResult_t r = ncclCommFinalize(n->nc);
    ncclResult_t ar = r;
    double t0 = now();
    while (r == ncclSuccess || r == ncclInProgress) {
      ncclCommGetAsyncError(n->nc, &ar);
      if (ar != ncclInProgress || now() - t0 > n->base.timeout_s) break;
      sched_yield();
    }
    if (ar == ncclSuccess)
      ncclCommDestroy(n->nc);
    else
      ncclCommAbort(n->nc);
  }
  if (n->dev) cudaFree(n->dev);
  if (n->ev) cudaEventDestroy(n->ev);
  if (n->st) cudaStreamDestroy(n->st);
  free(n);
}

static const lks_comm_ops nccl_ops = {
    .name = "nccl",
    .free = nc_free,
    .allreduce_sum = nc_allreduce,
    .allgather = nc_allgather,
    .broadcast = nc_broadcast,
    .argmax = nc_argmax,
    .vote_min = nc_vote_min,
    .vote_max = nc_vote_max,
    .barrier = nc_barrier,
};

// MPI_Ibcast tested against the deadline (MPI returns errors: see lks_mpi_init).
static int bcast_id(ncclUniqueId *id, double timeout_s, int rank) {
  MPI_Request req;
  if (MPI_Ibcast(id, (int)sizeof *id, MPI_BYTE, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return lks_set_error(LKS_EBACKEND, "nccl: broadcasting the unique id failed on rank %d", rank);
  double t0 = now();
  for (;;) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return lks_set_error(LKS_EBACKEND, "nccl: broadcasting the unique id failed on rank %d", rank);
    if (done) return 0;
    if (now() - t0 > timeout_s)
      return lks_set_error(LKS_EBACKEND,
                           "nccl: the unique id did not arrive within %.1f s on rank %d", timeout_s,
                           rank);
    sched_yield();
  }
}

static int nc_init(nccl_comm *n, double timeout_s, int device) {
  lks_comm *c = &n->base;
  int dev = lks__cuda_pick_device(device);
  if (dev < 0) return dev;
  n->device = dev;
  LKS_CUDA_TRY(cudaSetDevice(dev));
  LKS_CUDA_TRY(cudaStreamCreateWithFlags(&n->st, cudaStreamNonBlocking));
  LKS_CUDA_TRY(cudaEventCreateWithFlags(&n->ev, cudaEventDisableTiming));
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      return lks_set_error(LKS_EBACKEND, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
  }
  LKS_TRY(bcast_id(&id, timeout_s, c->rank));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&n->nc, c->world, id, c->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    n->nc = NULL;
    return lks_set_error(LKS_EBACKEND, "nccl: ncclCommInitRank on rank %d (GPU %d): %s", c->rank,
                         dev, ncclGetErrorString(r));
  }
  double t0 = now();
  for (;;) {
    ncclResult_t ar = ncclInProgress;
    ncclCommGetAsyncError(n->nc, &ar);
    if (ar == ncclSuccess) break;
    if (ar != ncclInProgress) {
      char why[256];
      snprintf(why, sizeof why, "%s: %s", ncclGetErrorString(ar), ncclGetLastError(n->nc));
      nc_abort(n);
      return lks_set_error(LKS_EBACKEND, "nccl: ncclCommInitRank on rank %d (GPU %d): %s",
                           c->rank, dev, why);
    }
    if (now() - t0 > timeout_s) {
      nc_abort(n);
      return lks_set_error(LKS_EBACKEND,
                           "nccl: the communicator of %d ranks was not ready within %.1f s on "
                           "rank %d (a peer is gone or stuck)",
                           c->world, timeout_s, c->rank);
    }
    sched_yield();
  }
  int ver = 0;
  ncclGetVersion(&ver);
  LKS_LOG(LKS_LOG_INFO, "nccl %d: rank %d of %d on GPU %d", ver, c->rank, c->world, dev);
  return 0;
}

lks_comm *lks_comm_nccl_new(double timeout_s, int device) {
  nccl_comm *n = calloc(1, sizeof *n);
  if (!n) {
    lks_set_error(LKS_ENOMEM, "nccl: out of memory");
    return NULL;
  }
  n->base.ops = &nccl_ops;
  n->base.timeout_s = timeout_s;
  MPI_Comm_rank(MPI_COMM_WORLD, &n->base.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n->base.world);
  if (nc_init(n, timeout_s, device) < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lks_last_error());
    nc_free(&n->base);
    lks_set_error(LKS_EBACKEND, "%s", msg);
    return NULL;
  }
  return &n->base;
}

// ---- mpi with device buffers staged through the host ----

typedef struct {
  lks_comm base;
  lks_comm *mpi;
  void *host;
  size_t host_cap;
} staged_comm;

// The caller sets step and the liveness hook on the outer comm; the inner one reads them.
static lks_comm *inner(lks_comm *c) {
  staged_comm *s = (staged_comm *)c;
  s->mpi->step = c->step;
  s->mpi->poll = c->poll;
  s->mpi->poll_ctx = c->poll_ctx;
  s->mpi->timeout_s = c->timeout_s;
  return s->mpi;
}

static int finish(lks_comm *c, int rc) {
  staged_comm *s = (staged_comm *)c;
  c->stats = s->mpi->stats;
  return rc;
}

static int host_stage(staged_comm *s, size_t bytes) {
  if (s->host_cap >= bytes) return 0;
  void *p = realloc(s->host, bytes);
  if (!p) return lks_set_error(LKS_ENOMEM, "staging %zu bytes: out of memory", bytes);
  s->host = p;
  s->host_cap = bytes;
  return 0;
}

static int st_allreduce(lks_comm *c, void *buf, size_t count, lks_dtype dt, lks_comm_where w) {
  staged_comm *s = (staged_comm *)c;
  lks_comm *m = inner(c);
  if (!is_device(buf)) return finish(c, m->ops->allreduce_sum(m, buf, count, dt, w));
  size_t bytes = count * lks_dtype_size(dt);
  LKS_TRY(host_stage(s, bytes));
  LKS_CUDA_TRY(cudaDeviceSynchronize());  // the backend's stream wrote buf
  LKS_CUDA_TRY(cudaMemcpy(s->host, buf, bytes, cudaMemcpyDeviceToHost));
  int rc = finish(c, m->ops->allreduce_sum(m, s->host, count, dt, w));
  if (rc < 0) return rc;
  LKS_CUDA_TRY(cudaMemcpy(buf, s->host, bytes, cudaMemcpyHostToDevice));
  LKS_CUDA_TRY(cudaDeviceSynchronize());  // a pageable copy may return before its DMA is done
  return 0;
}

static int st_allgather(lks_comm *c, const void *send, void *recv, size_t bytes,
                        lks_comm_where w) {
  staged_comm *s = (staged_comm *)c;
  lks_comm *m = inner(c);
  bool ds = is_device(send), dr = is_device(recv);
  if (!ds && !dr) return finish(c, m->ops->allgather(m, send, recv, bytes, w));
  size_t total = bytes * (size_t)c->world;
  LKS_TRY(host_stage(s, total + bytes));
  char *hr = s->host, *hs = hr + total;
  LKS_CUDA_TRY(cudaDeviceSynchronize());
  LKS_CUDA_TRY(cudaMemcpy(hs, send, bytes, cudaMemcpyDefault));
  int rc = finish(c, m->ops->allgather(m, hs, hr, bytes, w));
  if (rc < 0) return rc;
  LKS_CUDA_TRY(cudaMemcpy(recv, hr, total, cudaMemcpyDefault));
  LKS_CUDA_TRY(cudaDeviceSynchronize());
  return 0;
}

static int st_broadcast(lks_comm *c, void *buf, size_t bytes, int root, lks_comm_where w) {
  staged_comm *s = (staged_comm *)c;
  lks_comm *m = inner(c);
  if (!is_device(buf)) return finish(c, m->ops->broadcast(m, buf, bytes, root, w));
  LKS_TRY(host_stage(s, bytes));
  LKS_CUDA_TRY(cudaDeviceSynchronize());
  LKS_CUDA_TRY(cudaMemcpy(s->host, buf, bytes, cudaMemcpyDeviceToHost));
  int rc = finish(c, m->ops->broadcast(m, s->host, bytes, root, w));
  if (rc < 0) return rc;
  LKS_CUDA_TRY(cudaMemcpy(buf, s->host, bytes, cudaMemcpyHostToDevice));
  LKS_CUDA_TRY(cudaDeviceSynchronize());
  return 0;
}

static int st_argmax(lks_comm *c, float *val, int32_t *idx, int n, lks_comm_where w) {
  lks_comm *m = inner(c);
  return finish(c, m->ops->argmax(m, val, idx, n, w));
}
static int st_vote_min(lks_comm *c, int64_t *v, lks_comm_where w) {
  lks_comm *m = inner(c);
  return finish(c, m->ops->vote_min(m, v, w));
}
static int st_vote_max(lks_comm *c, int64_t *v, lks_comm_where w) {
  lks_comm *m = inner(c);
  return finish(c, m->ops->vote_max(m, v, w));
}
static int st_barrier(lks_comm *c, lks_comm_where w) {
  lks_comm *m = inner(c);
  return finish(c, m->ops->barrier(m, w));
}

static void st_free(lks_comm *c) {
  staged_comm *s = (staged_comm *)c;
  if (!s) return;
  lks_comm_free(s->mpi);
  free(s->host);
  free(s);
}

static const lks_comm_ops staged_ops = {
    .name = "mpi",
    .free = st_free,
    .allreduce_sum = st_allreduce,
    .allgather = st_allgather,
    .broadcast = st_broadcast,
    .argmax = st_argmax,
    .vote_min = st_vote_min,
    .vote_max = st_vote_max,
    .barrier = st_barrier,
};

lks_comm *lks_comm_mpi_cuda_new(double timeout_s) {
  staged_comm *s = calloc(1, sizeof *s);
  if (!s) {
    lks_set_error(LKS_ENOMEM, "out of memory");
    return NULL;
  }
  s->mpi = lks_comm_mpi_new(timeout_s);
  if (!s->mpi) {
    free(s);
    return NULL;
  }
  s->base.ops = &staged_ops;
  s->base.rank = s->mpi->rank;
  s->base.world = s->mpi->world;
  s->base.timeout_s = timeout_s;
  return &s->base;
}
