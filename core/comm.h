// SPDX-License-Identifier: MIT
// Collectives between the ranks that hold the shards of one model (DESIGN.md section 4): the data
// plane of the lockstep rule. Implementations: `local` (world of one: every call is the
// identity), `mpi` (CPU ranks; non-blocking MPI calls tested against a deadline) and `nccl`
// (cuda/comm_nccl.c, in builds with CUDA). Buffers are raw pointers into backend memory (lks_backend_ops.buf_ptr): host memory
// for the CPU backend, device memory for a GPU backend with NCCL.
//
// Every call has a deadline (lks_comm.timeout_s). On timeout, transport error, or when the
// liveness hook reports a dead peer, the call fails with an error naming the collective, the
// layer and the step (lks_comm_where). A failed collective leaves the world unusable: the caller
// stops the process. Reductions keep their dtype (f32 sums in f32, bf16 in bf16 with f32
// accumulation); integers never travel in a float sum.
#ifndef LKS_COMM_H
#define LKS_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct lks_comm lks_comm;

// Where a collective is called from, for error messages and counters.
typedef struct lks_comm_where {
  const char *what;  // "attention", "moe", "lm_head", ...
  int layer;         // -1 when not in a layer
} lks_comm_where;

typedef struct lks_comm_stats {
  uint64_t allreduce, allgather, broadcast, argmax, vote, barrier;
  double seconds;  // time spent inside collectives
} lks_comm_stats;

// Called while a collective waits (about every millisecond); a negative return aborts the wait
// with that error. The control plane uses it to notice a peer that died.
typedef int (*lks_comm_poll_fn)(void *ctx);

typedef struct lks_comm_ops {
  const char *name;
  void (*free)(lks_comm *c);
  // In place: buf[i] = sum over ranks of buf[i]; dt is LKS_F32 or LKS_BF16.
  int (*allreduce_sum)(lks_comm *c, void *buf, size_t count, lks_dtype dt, lks_comm_where w);
  // recv = concatenation of every rank's `bytes` bytes of send, in rank order.
  int (*allgather)(lks_comm *c, const void *send, void *recv, size_t bytes, lks_comm_where w);
  int (*broadcast)(lks_comm *c, void *buf, size_t bytes, int root, lks_comm_where w);
  // Per row i < n: the maximum of val[i] over ranks and its idx[i] (ties: the lower index).
  int (*argmax)(lks_comm *c, float *val, int32_t *idx, int n, lks_comm_where w);
  // In place: *v = the minimum (or maximum) of *v over ranks.
  int (*vote_min)(lks_comm *c, int64_t *v, lks_comm_where w);
  int (*vote_max)(lks_comm *c, int64_t *v, lks_comm_where w);
  int (*barrier)(lks_comm *c, lks_comm_where w);
} lks_comm_ops;

struct lks_comm {
  const lks_comm_ops *ops;
  int rank, world;
  double timeout_s;  // deadline of every call
  uint64_t step;     // the command step, for messages; set by the caller
  lks_comm_poll_fn poll;
  void *poll_ctx;
  lks_comm_stats stats;
};

// A world of one.
lks_comm *lks_comm_local_new(void);
// MPI_COMM_WORLD (MPI must be initialised; see lks_mpi_init). NULL when built without MPI.
lks_comm *lks_comm_mpi_new(double timeout_s);
// NCCL over MPI_COMM_WORLD (cuda/comm_nccl.c), one GPU per rank: `device`, or -1 for the local
// rank modulo the visible GPUs. MPI must be initialised. NULL (with lks_last_error()) on
// failure or in a build without CUDA.
lks_comm *lks_comm_nccl_new(double timeout_s, int device);
// The mpi collectives for the cuda backend: device buffers are staged through host memory (no
// CUDA-aware MPI needed; ranks may share a GPU). NULL in a build without CUDA.
lks_comm *lks_comm_mpi_cuda_new(double timeout_s);
void lks_comm_free(lks_comm *c);

// MPI start and finish for the executable; no-ops without MPI. lks_mpi_init returns 0 and sets
// rank and world (1 when not launched by mpirun: a singleton).
int lks_mpi_init(int *argc, char ***argv, int *rank, int *world);
void lks_mpi_finalize(void);
// Ends every rank after a fatal error (MPI_Abort), or exit(code) without MPI. For main only.
void lks_mpi_abort(int code);

#endif
