// SPDX-License-Identifier: MIT
// Recorded steps of the cuda backend (step_begin / step_end; off unless LKS_CUDA_GRAPHS=1, since
// the quantized and glm_moe_dsa ops have not been replayed on a GPU yet): the first time a key
// is seen its step runs as called; the second time it is captured into a CUDA graph whose
// uploads of host control arrays copy from a pinned staging area of the key's own; from then on
// a step of that key runs the caller's code in replay mode: every op checks its arguments and
// writes its host arrays into the staging area at the offsets recorded (the same uploads in the
// same order, or the step is run again as called), launches nothing, and step_end launches the
// graph. Every buffer a graph refers to stays put: freeing a buffer or growing a scratch buffer
// drops every graph.
//
// All calls come from the thread that created the backend.
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "cuda/backend_cuda_impl.h"
#include "cuda/cuda_impl.h"

// In a step being recorded or replayed, an op that would synchronise, allocate or read back
// fails the recording instead (the step then runs again as called).
int lks__cuda_graph_refuse(cuda_backend *c, const char *what) {
  c->gfail = true;
  return lks_set_error(LKS_EBACKEND, "cuda backend: %s inside a recorded step", what);
}

// Drops every recorded step (after the work queued has finished: a graph may be running).
void lks__cuda_graphs_drop(cuda_backend *c) {
  bool any = false;
  for (int i = 0; i < GRAPH_MAX; i++) any |= c->g[i].exec != NULL || c->g[i].key != 0;
  if (!any) return;
  (void)cudaStreamSynchronize(c->st);
  for (int i = 0; i < GRAPH_MAX; i++) {
    graph_entry *e = &c->g[i];
    if (e->exec) (void)cudaGraphExecDestroy(e->exec);
    if (e->done) (void)cudaEventDestroy(e->done);
    if (e->stage) (void)cudaFreeHost(e->stage);
    free(e->up_log);
    memset(e, 0, sizeof *e);
  }
}

// An upload in a recorded step: through the key's staging area, checked against the recording.
int lks__cuda_graph_up(cuda_backend *c, int slot, const void *host, size_t bytes, void *dev) {
  graph_entry *e = c->gcur;
  size_t a = (bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
  if (bytes >= (1u << 24) || c->goff + a > STAGE_BYTES)
    return lks__cuda_graph_refuse(c, "a host array beyond the staging area");
  int tag = slot << 24 | (int)bytes;
  if (c->gmode == G_CAPTURE) {
    if (c->gpos == e->up_cap) {
      int cap = e->up_cap ? 2 * e->up_cap : 256;
      int *nl = realloc(e->up_log, (size_t)cap * sizeof *nl);
      if (!nl) return lks__cuda_graph_refuse(c, "out of host memory");
      e->up_log = nl;
      e->up_cap = cap;
    }
    e->up_log[c->gpos] = tag;
  } else if (c->gpos >= e->n_up || e->up_log[c->gpos] != tag) {
    return lks__cuda_graph_refuse(c, "an upload unlike the recorded step's");
  }
  char *h = e->stage + c->goff;
  memcpy(h, host, bytes);
  if (c->gmode == G_CAPTURE)
    LKS_CUDA_TRY(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, c->st));
  c->gpos++;
  c->goff += a;
  return 0;
}

int lks__cuda_step_begin(lks_backend *be, uint64_t key) {
  cuda_backend *c = (cuda_backend *)be;
  if (!c->graphs || c->gmode != G_EAGER) return 0;
  graph_entry *e = NULL, *free_e = NULL;
  for (int i = 0; i < GRAPH_MAX && !e; i++) {
    if (c->g[i].key == key) e = &c->g[i];
    else if (!c->g[i].key && !free_e) free_e = &c->g[i];
  }
  if (!e) {
    if (!free_e) return 0;  // full: run as called
    e = free_e;
    e->key = key;
  }
  if (e->failed) return 0;
  if (e->exec) {
    // The previous launch of this graph may still read the staging area.
    LKS_CUDA_TRY(cudaEventSynchronize(e->done));
    c->gmode = G_REPLAY;
  } else {
    // The first step of a key runs as called: it grows the scratch buffers and makes the expert
    // tables, which a recording cannot do.
    if (e->seen++ < 1) return 0;
    if (!e->stage) {
      void *h = NULL;
      if (cudaHostAlloc(&h, STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        e->failed = true;
        return 0;
      }
      e->stage = h;
    }
    if (!e->done) LKS_CUDA_TRY(cudaEventCreateWithFlags(&e->done, cudaEventDisableTiming));
    if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      e->failed = true;
      return 0;
    }
    c->gmode = G_CAPTURE;
  }
  c->gcur = e;
  c->gpos = 0;
  c->goff = 0;
  c->gfail = false;
  return 0;
}

int lks__cuda_step_end(lks_backend *be, int rc) {
  cuda_backend *c = (cuda_backend *)be;
  graph_mode mode = c->gmode;
  graph_entry *e = c->gcur;
  if (mode == G_EAGER) return rc;
  c->gmode = G_EAGER;
  c->gcur = NULL;
  if (mode == G_CAPTURE) {
    cudaGraph_t graph = NULL;
    cudaError_t ce = cudaStreamEndCapture(c->st, &graph);
    if (ce == cudaSuccess && !c->gfail && rc == 0) {
      ce = cudaGraphInstantiate(&e->exec, graph, 0);
      if (ce != cudaSuccess) e->exec = NULL;
    }
    if (graph) (void)cudaGraphDestroy(graph);
    // Nothing of the step has run: on any failure (the step's own error too, which running it
    // again as called then reports) it runs again as called, and this key is never recorded.
    if (rc < 0 || ce != cudaSuccess || c->gfail || !e->exec) {
      (void)cudaGetLastError();
      LKS_LOG(LKS_LOG_INFO, "cuda backend: a step could not be recorded (%s); it runs as called",
              rc < 0 || c->gfail ? lks_last_error() : cudaGetErrorString(ce));
      e->failed = true;
      return 1;
    }
    e->n_up = c->gpos;
    int level = c->n_recorded++ ? LKS_LOG_DEBUG : LKS_LOG_INFO;  // LKS_LOG reads it twice
    LKS_LOG(level, "cuda backend: a step recorded as a CUDA graph (%d uploads, %zu bytes staged)", e->n_up,
            c->goff);
  } else {
    if (rc < 0 || c->gfail || c->gpos != e->n_up) {
      LKS_LOG(LKS_LOG_INFO, "cuda backend: a recorded step did not replay (%s); it runs as called",
              rc < 0 || c->gfail ? lks_last_error() : "fewer uploads");
      e->failed = true;
      return 1;
    }
  }
  LKS_CUDA_TRY(cudaGraphLaunch(e->exec, c->st));
  LKS_CUDA_TRY(cudaEventRecord(e->done, c->st));
  return 0;
}
