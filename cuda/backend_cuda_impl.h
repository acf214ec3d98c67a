// SPDX-License-Identifier: MIT
// Internals shared by the files of the cuda backend: backend_cuda.c (buffers, the element-wise,
// attention, MLA and expert ops, the ops table), backend_cuda_moe.c (the moe op and its expert
// tables) and backend_cuda_graph.c (recorded steps: step_begin / step_end). The backend's state,
// the device scratch buffers every op draws on, and the recording state every op consults.
// All of it is used from the thread that created the backend.
#ifndef LKS_BACKEND_CUDA_IMPL_H
#define LKS_BACKEND_CUDA_IMPL_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

struct lks_buf {
  void *d;  // device memory
  size_t bytes;
  bool owned;  // false for wrapped weights: read-only by contract
};

// Device scratch buffers, one per use so that an op never overwrites what it still reads.
enum {
  SC_IDX0,   // ids, positions, slots, gathered rows
  SC_IDX1,   // sequences
  SC_IDX2,   // block tables
  SC_ROUTE,  // router scores, its bias in f32
  SC_XG,     // expert: gathered rows
  SC_GUD,    // expert: gate, up (then SwiGLU), down outputs
  SC_W,      // expert weights
  SC_OUT,    // results bound for host arrays
  SC_SEL,    // the indexer's selection (mla_attention)
  SC_NSEL,   // its counts per row
  SC_WORK,   // the indexer's scores
  SC_MOE,    // moe: routing, plan, the pairs' gate, up and down outputs
  SC_N
};

typedef struct {
  void *p;
  size_t bytes;
} dscratch;

// Host control arrays reach the device through a pinned ring of two halves, so that their
// copies stay asynchronous (a copy from pageable memory waits for the stream first). Entering a
// half waits for the event recorded when it was last left: its copies are done by then.
enum { RING_BYTES = 1 << 20, RING_ALIGN = 256 };

// A recorded step (backend_cuda_graph.c).
enum { GRAPH_MAX = 32, STAGE_BYTES = 512 << 10 };

typedef struct {
  uint64_t key;
  int seen;     // steps of this key run so far
  bool failed;  // recording or replay failed once: run as called from then on
  cudaGraphExec_t exec;
  cudaEvent_t done;  // recorded after each launch: the staging area is free again
  char *stage;       // pinned, STAGE_BYTES
  int n_up;          // uploads recorded
  int *up_log;       // [n_up]: slot * 2^24 + bytes... see lks__cuda_graph_up
  int up_cap;
} graph_entry;

typedef enum { G_EAGER, G_CAPTURE, G_REPLAY } graph_mode;

// Device copies of the experts' weight pointers per MoE layer, keyed by the caller's array.
typedef struct {
  const lks_tensor *key;
  int e0, n;
  const void **host;  // [3 n]: gate, up, down pointers
  void **dev;         // the same on the device
  bool aligned;       // every pointer 16-byte aligned
} moe_table;

typedef struct cuda_backend {
  lks_backend base;
  int device;
  cudaStream_t st;
  dscratch sc[SC_N];
  char *ring;  // pinned, RING_BYTES; NULL: pageable copies
  int ring_part;    // the half in use
  size_t ring_off;  // the next free byte in it
  cudaEvent_t ring_ev[2];
  bool ring_ev_set[2];
  bool graphs;  // recorded steps allowed (LKS_CUDA_GRAPHS)
  graph_entry g[GRAPH_MAX];
  graph_mode gmode;
  graph_entry *gcur;
  int gpos;     // the next upload of the step
  size_t goff;  // its offset in the staging area
  bool gfail;   // an op could not be recorded or replayed
  int n_recorded;
  moe_table *mt;
  int n_mt, cap_mt;
} cuda_backend;

// Replaying a recorded step: the ops check and stage their arguments but launch nothing.
#define REPLAYING(c) ((c)->gmode == G_REPLAY)

// The device address of a tensor's first element.
static inline char *dp(lks_tensor t) { return (char *)t.buf->d + t.offset; }

// ---- backend_cuda.c ----

// Scratch buffer `slot`, grown to at least `bytes` (in a recorded step growing fails the
// recording; growing drops every recorded step, which refers to the old buffer).
int lks__cuda_need(cuda_backend *c, int slot, size_t bytes, void **p);

// ---- backend_cuda_graph.c: recorded steps ----

// In a step being recorded or replayed, an op that would synchronise, allocate or read back
// fails the recording instead (the step then runs again as called). Returns LKS_EBACKEND.
int lks__cuda_graph_refuse(cuda_backend *c, const char *what);
// Drops every recorded step (after the work queued has finished: a graph may be running).
void lks__cuda_graphs_drop(cuda_backend *c);
// An upload in a recorded step: through the key's staging area, checked against the recording.
int lks__cuda_graph_up(cuda_backend *c, int slot, const void *host, size_t bytes, void *dev);
// The ops table's step_begin and step_end (core/backend.h).
int lks__cuda_step_begin(lks_backend *be, uint64_t key);
int lks__cuda_step_end(lks_backend *be, int rc);

// ---- backend_cuda_moe.c ----

// The ops table's moe (core/backend.h): routing and every selected expert on the device.
int lks__cuda_moe(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor logits,
                  lks_tensor bias, const lks_route_params *p, const lks_moe_experts *ex,
                  int32_t *ids_host, float *w_host);

#endif
