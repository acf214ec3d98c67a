// SPDX-License-Identifier: MIT
// The `cuda` backend (DESIGN.md section 9): the ops of backend.h on one NVIDIA GPU, with the CPU
// backend's semantics (core/backend_cpu.c is the reference every op is tested against, see
// tests/gpu/test_cuda_ops.c). Buffers are cudaMalloc'd; weights are uploaded from the mmapped
// file when wrapped (a column shard packed to its own rows). Every op is enqueued on the
// backend's stream; host control arrays (token ids, positions, KV slots, block tables, expert
// rows and weights) are first copied into device scratch buffers the backend owns and grows,
// and the ops whose results the interface returns in host arrays (route, argmax) and the copies
// (to_host, from_host) synchronise the stream before returning.
//
// Precision: activations, accumulation and the KV cache are f32. Every matrix product, whatever
// its number of activation rows, runs one kernel (kernels.cu, "matrix products") that widens the
// weights exactly and accumulates in f32 in an order fixed by K alone: a row's result does not
// depend on the batch it is computed in, so speculative verify (several rows per sequence) and
// plain decode (one) give the same logits bit for bit. No tensor cores: prefill runs at the f32
// rate, the price of that guarantee.
//
// glm_moe_dsa's ops (LayerNorm, the k-only cache store, the DSA indexer's selection, absorbed MLA
// attention) run the kernels of mla.cu under the same rule: a row's result is its own.
//
// MoE (the moe op): routing, the dispatch plan, all selected experts' products and their
// weighted sum run on the device in five launches (cuda/moe.cu), without a host round trip.
//
// Recorded steps (step_begin / step_end; off unless LKS_CUDA_GRAPHS=1, since the quantized and
// glm_moe_dsa ops have not been replayed on a GPU yet): the first time a key
// is seen its step runs as called; the second time it is captured into a CUDA graph whose
// uploads of host control arrays copy from a pinned staging area of the key's own; from then on
// a step of that key runs the caller's code in replay mode: every op checks its arguments and
// writes its host arrays into the staging area at the offsets recorded (the same uploads in the
// same order, or the step is run again as called), launches nothing, and step_end launches the
// graph. Every buffer a graph refers to stays put: freeing a buffer or growing a scratch buffer
// drops every graph.
//
// All calls come from the thread that created the backend. Errors of CUDA and cuBLAS become
// LKS_EBACKEND with the library's message; nothing exits.
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "cuda/cuda_impl.h"

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

// A recorded step (see the file comment).
enum { GRAPH_MAX = 32, STAGE_BYTES = 512 << 10 };

typedef struct {
  uint64_t key;
  int seen;     // steps of this key run so far
  bool failed;  // recording or replay failed once: run as called from then on
  cudaGraphExec_t exec;
  cudaEvent_t done;  // recorded after each launch: the staging area is free again
  char *stage;       // pinned, STAGE_BYTES
  int n_up;          // uploads recorded
  int *up_log;       // [n_up]: slot * 2^24 + bytes... see graph_up
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

// The one live backend's stream, for the NCCL comm (lks__cuda_work_stream). Backends are made
// and freed on the main thread.
static int live_backends;
static cudaStream_t live_stream;

cudaStream_t lks__cuda_work_stream(void) { return live_backends == 1 ? live_stream : NULL; }

// In a step being recorded or replayed, an op that would synchronise, allocate or read back
// fails the recording instead (the step then runs again as called).
static int graph_refuse(cuda_backend *c, const char *what) {
  c->gfail = true;
  return lks_set_error(LKS_EBACKEND, "cuda backend: %s inside a recorded step", what);
}

// Drops every recorded step (after the work queued has finished: a graph may be running).
static void graphs_drop(cuda_backend *c) {
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

int lks__cuda_pick_device(int requested) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return lks_set_error(LKS_EBACKEND, "no CUDA device: %s",
                         e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
  if (requested >= 0) {
    if (requested >= count)
      return lks_set_error(LKS_ERANGE, "--gpu %d, but %d device(s) are visible", requested,
                           count);
    return requested;
  }
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
  int local = 0;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) {
      local = atoi(v);
      break;
    }
  }
  return (local < 0 ? 0 : local) % count;
}

static char *dp(lks_tensor t) { return (char *)t.buf->d + t.offset; }

static int need(cuda_backend *c, int slot, size_t bytes, void **p) {
  dscratch *s = &c->sc[slot];
  if (s->bytes < bytes) {
    if (c->gmode != G_EAGER) return graph_refuse(c, "growing a scratch buffer");
    graphs_drop(c);  // they refer to the old buffer
    size_t nb = bytes + bytes / 2;
    void *np = NULL;
    // Work still queued may read the old buffer.
    LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
    if (s->p) LKS_CUDA_TRY(cudaFree(s->p));
    s->p = NULL;
    s->bytes = 0;
    LKS_CUDA_TRY(cudaMalloc(&np, nb));
    s->p = np;
    s->bytes = nb;
  }
  *p = s->p;
  return 0;
}

// An upload in a recorded step: through the key's staging area, checked against the recording.
static int graph_up(cuda_backend *c, int slot, const void *host, size_t bytes, void *dev) {
  graph_entry *e = c->gcur;
  size_t a = (bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
  if (bytes >= (1u << 24) || c->goff + a > STAGE_BYTES)
    return graph_refuse(c, "a host array beyond the staging area");
  int tag = slot << 24 | (int)bytes;
  if (c->gmode == G_CAPTURE) {
    if (c->gpos == e->up_cap) {
      int cap = e->up_cap ? 2 * e->up_cap : 256;
      int *nl = realloc(e->up_log, (size_t)cap * sizeof *nl);
      if (!nl) return graph_refuse(c, "out of host memory");
      e->up_log = nl;
      e->up_cap = cap;
    }
    e->up_log[c->gpos] = tag;
  } else if (c->gpos >= e->n_up || e->up_log[c->gpos] != tag) {
    return graph_refuse(c, "an upload unlike the recorded step's");
  }
  char *h = e->stage + c->goff;
  memcpy(h, host, bytes);
  if (c->gmode == G_CAPTURE)
    LKS_CUDA_TRY(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, c->st));
  c->gpos++;
  c->goff += a;
  return 0;
}

// Copies a host array into a scratch buffer (in stream order); the host array may be reused as
// soon as this returns.
static int up(cuda_backend *c, int slot, const void *host, size_t bytes, void **dev) {
  LKS_TRY(need(c, slot, bytes ? bytes : 4, dev));
  if (!bytes) return 0;
  if (c->gmode != G_EAGER) return graph_up(c, slot, host, bytes, *dev);
  size_t half = RING_BYTES / 2, a = (bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
  if (!c->ring || a > half) {
    // Pageable: the driver stages the copy (after waiting for the stream).
    LKS_CUDA_TRY(cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, c->st));
    return 0;
  }
  if (c->ring_off + a > half) {
    LKS_CUDA_TRY(cudaEventRecord(c->ring_ev[c->ring_part], c->st));
    c->ring_ev_set[c->ring_part] = true;
    c->ring_part ^= 1;
    c->ring_off = 0;
    if (c->ring_ev_set[c->ring_part])
      LKS_CUDA_TRY(cudaEventSynchronize(c->ring_ev[c->ring_part]));
  }
  char *h = c->ring + (size_t)c->ring_part * half + c->ring_off;
  memcpy(h, host, bytes);
  LKS_CUDA_TRY(cudaMemcpyAsync(*dev, h, bytes, cudaMemcpyHostToDevice, c->st));
  c->ring_off += a;
  return 0;
}

// Replaying a recorded step: the ops check and stage their arguments but launch nothing.
#define REPLAYING(c) ((c)->gmode == G_REPLAY)

static int down(cuda_backend *c, void *host, const void *dev, size_t bytes) {
  if (c->gmode != G_EAGER) return graph_refuse(c, "a copy to the host");
  if (bytes) LKS_CUDA_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

// ---- memory ----

static lks_buf *new_buf(size_t bytes, bool owned) {
  lks_buf *b = calloc(1, sizeof *b);
  if (!b) {
    lks_set_error(LKS_ENOMEM, "cuda backend: out of host memory");
    return NULL;
  }
  cudaError_t e = cudaMalloc(&b->d, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    lks_set_error(LKS_ENOMEM, "cuda backend: cannot allocate %zu bytes of device memory: %s",
                  bytes, cudaGetErrorString(e));
    free(b);
    return NULL;
  }
  b->bytes = bytes;
  b->owned = owned;
  return b;
}

static void cu_buf_free(lks_backend *be, lks_buf *b) {
  if (!b) return;
  if (be) {
    cuda_backend *c = (cuda_backend *)be;
    if (c->gmode != G_EAGER) (void)graph_refuse(c, "freeing a buffer");
    graphs_drop(c);  // a graph may refer to the buffer
    // Queued work may still use the buffer.
    (void)cudaStreamSynchronize(c->st);
  }
  cudaError_t e = cudaFree(b->d);
  if (e != cudaSuccess) LKS_LOG(LKS_LOG_WARN, "cuda backend: cudaFree: %s", cudaGetErrorString(e));
  free(b);
}

static lks_buf *fail_buf(lks_buf *b, const char *what, cudaError_t e) {
  lks_set_error(LKS_EBACKEND, "cuda backend: %s: %s", what, cudaGetErrorString(e));
  cu_buf_free(NULL, b);
  return NULL;
}

static lks_buf *cu_buf_alloc(lks_backend *be, size_t bytes) {
  cuda_backend *c = (cuda_backend *)be;
  lks_buf *b = new_buf(bytes, true);
  if (!b) return NULL;
  // Zeroed, like the CPU backend's calloc.
  cudaError_t e = cudaMemsetAsync(b->d, 0, bytes, c->st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);
  return e == cudaSuccess ? b : fail_buf(b, "cudaMemset", e);
}

// Uploads go through the backend's stream and wait for it: a plain cudaMemcpy from pageable
// memory may return before its DMA is done, and the backend's stream does not wait for the
// legacy default stream.
static lks_buf *cu_buf_wrap_host(lks_backend *be, const void *host, size_t bytes) {
  cuda_backend *c = (cuda_backend *)be;
  lks_buf *b = new_buf(bytes, false);
  if (!b) return NULL;
  cudaError_t e = cudaMemcpyAsync(b->d, host, bytes, cudaMemcpyHostToDevice, c->st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);
  return e == cudaSuccess ? b : fail_buf(b, "weight upload", e);
}

static lks_buf *cu_buf_wrap_host_2d(lks_backend *be, const void *host, int64_t rows,
                                    size_t row_bytes, size_t stride_bytes, size_t *ld_bytes) {
  cuda_backend *c = (cuda_backend *)be;
  *ld_bytes = row_bytes;
  lks_buf *b = new_buf((size_t)(rows > 0 ? rows : 0) * row_bytes, false);
  if (!b) return NULL;
  cudaError_t e = cudaSuccess;
  if (rows > 0 && row_bytes > 0)
    e = cudaMemcpy2DAsync(b->d, row_bytes, host, stride_bytes, row_bytes, (size_t)rows,
                          cudaMemcpyHostToDevice, c->st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);
  return e == cudaSuccess ? b : fail_buf(b, "weight upload (2-D)", e);
}

static void *cu_buf_ptr(lks_backend *be, lks_buf *b) {
  (void)be;
  return b->d;
}

static int cu_to_host(lks_backend *be, void *dst, const lks_buf *src, size_t off, size_t n) {
  cuda_backend *c = (cuda_backend *)be;
  if (off > src->bytes || n > src->bytes - off)
    return lks_set_error(LKS_ERANGE, "to_host: range [%zu, +%zu) outside a %zu-byte buffer", off,
                         n, src->bytes);
  return down(c, dst, (const char *)src->d + off, n);
}

static int cu_from_host(lks_backend *be, lks_buf *dst, size_t off, const void *src, size_t n) {
  cuda_backend *c = (cuda_backend *)be;
  if (c->gmode != G_EAGER) return graph_refuse(c, "a copy from the host");
  if (!dst->owned || off > dst->bytes || n > dst->bytes - off)
    return lks_set_error(LKS_ERANGE, "from_host: range [%zu, +%zu) outside a writable buffer",
                         off, n);
  if (n) LKS_CUDA_TRY(cudaMemcpyAsync((char *)dst->d + off, src, n, cudaMemcpyHostToDevice, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

// ---- element-wise ops ----

static int cu_zero(lks_backend *be, lks_tensor t) {
  cuda_backend *c = (cuda_backend *)be;
  if (t.rows <= 0 || t.cols <= 0 || REPLAYING(c)) return 0;
  LKS_CUDA_TRY(cudaMemset2DAsync(dp(t), (size_t)t.ld * sizeof(float), 0,
                                 (size_t)t.cols * sizeof(float), (size_t)t.rows, c->st));
  return 0;
}

static int cu_embed(lks_backend *be, lks_tensor out, lks_tensor table, const int32_t *ids) {
  cuda_backend *c = (cuda_backend *)be;
  for (int64_t i = 0; i < out.rows; i++)
    if (ids[i] < 0 || ids[i] >= table.rows)
      return lks_set_error(LKS_ERANGE, "token id %d outside the vocabulary [0, %lld)", ids[i],
                           (long long)table.rows);
  void *d_ids;
  LKS_TRY(up(c, SC_IDX0, ids, (size_t)out.rows * sizeof *ids, &d_ids));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_embed(c->st, (float *)dp(out), out.ld, dp(table), table.dtype, table.ld,
                             d_ids, out.rows, table.cols));
  return 0;
}

static int cu_rmsnorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, float eps) {
  cuda_backend *c = (cuda_backend *)be;
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_rmsnorm(c->st, (float *)dp(out), out.ld, (const float *)dp(x), x.ld,
                               dp(w), w.dtype, x.rows, x.cols, eps));
  return 0;
}

static int cu_rope(lks_backend *be, lks_tensor x, int head_dim, int rot, float theta,
                   lks_rope_layout layout, const int32_t *pos) {
  cuda_backend *c = (cuda_backend *)be;
  void *d_pos;
  LKS_TRY(up(c, SC_IDX0, pos, (size_t)x.rows * sizeof *pos, &d_pos));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_rope(c->st, (float *)dp(x), x.ld, x.rows, (int)(x.cols / head_dim),
                            head_dim, rot, theta, layout == LKS_ROPE_INTERLEAVED, d_pos));
  return 0;
}

static int cu_gather_rows(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows) {
  cuda_backend *c = (cuda_backend *)be;
  for (int64_t i = 0; i < out.rows; i++)
    if (rows[i] < 0 || rows[i] >= x.rows)
      return lks_set_error(LKS_ERANGE, "gather_rows: row %d outside [0, %lld)", rows[i],
                           (long long)x.rows);
  void *d_rows;
  LKS_TRY(up(c, SC_IDX0, rows, (size_t)out.rows * sizeof *rows, &d_rows));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_gather_rows(c->st, (float *)dp(out), out.ld, (const float *)dp(x), x.ld,
                                   d_rows, out.rows, x.cols));
  return 0;
}

static int cu_argmax(lks_backend *be, lks_tensor x, int32_t *idx, float *val) {
  cuda_backend *c = (cuda_backend *)be;
  if (x.rows <= 0) return 0;
  if (c->gmode != G_EAGER) return graph_refuse(c, "argmax");
  size_t n = (size_t)x.rows;
  void *d;
  LKS_TRY(need(c, SC_OUT, n * 8, &d));
  int32_t *d_idx = d;
  float *d_val = (float *)((char *)d + n * 4);
  LKS_CUDA_TRY(lks__cu_argmax(c->st, (const float *)dp(x), x.ld, x.rows, x.cols, d_idx, d_val));
  LKS_CUDA_TRY(cudaMemcpyAsync(idx, d_idx, n * 4, cudaMemcpyDeviceToHost, c->st));
  if (val) LKS_CUDA_TRY(cudaMemcpyAsync(val, d_val, n * 4, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

// ---- matrix products ----

// out [n, M] (row stride ldo) (+)= x [n, K] (row stride ldx) w^T + bias, for any n.
static int mm(cuda_backend *c, float *out, int64_t ldo, const float *x, int64_t ldx, int64_t n,
              lks_tensor w, const void *bias, lks_dtype bdt, bool accumulate) {
  int64_t M = w.rows, K = w.cols;
  if (n <= 0 || M <= 0) return 0;
  if (REPLAYING(c)) return 0;
  if (w.qs != LKS_Q_NONE) {  // weight-only quantized: cuda/quant.cu, every row count
    LKS_CUDA_TRY(lks__cu_qgemv(c->st, out, ldo, x, ldx, n, dp(w), w.ld, (int)w.qs,
                               (char *)w.sbuf->d + w.soff, w.sld, w.qglobal, bias, bdt, M, K,
                               accumulate));
    return 0;
  }
  if (n > (int64_t)LKS__CU_GEMV_ROWS * 65535)
    return lks_set_error(LKS_ERANGE, "matmul: %lld rows in one product (at most %d)", (long long)n,
                         LKS__CU_GEMV_ROWS * 65535);
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_gemv(c->st, out, ldo, x, ldx, dp(w), w.dtype, w.ld, bias, bdt, n, M, K,
                            accumulate));
  return 0;
}

static int cu_matmul(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w,
                     lks_tensor bias, bool accumulate) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_matmul_check(out, x, w));
  return mm(c, (float *)dp(out), out.ld, (const float *)dp(x), x.ld, x.rows, w,
            bias.buf ? dp(bias) : NULL, bias.dtype, accumulate);
}

// ---- attention ----

static int cu_kv_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor k, lks_tensor v,
                       const lks_attn_rows *rows) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  if (rows->n <= 0) return 0;
  void *d_slot;
  LKS_TRY(up(c, SC_IDX0, rows->slot, (size_t)rows->n * sizeof(int32_t), &d_slot));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_kv_store(c->st, kv->k->d, kv->v->d, (int64_t)kv->n_kv_heads * kv->head_dim,
                                (const float *)dp(k), k.ld, (const float *)dp(v), v.ld, d_slot,
                                rows->n));
  return 0;
}

// A bad block id would fault a kernel (and the context with it): every block a row may read,
// those of positions 0..pos, is checked here. *n_seqs: the block table rows the kernel reads.
static int check_blocks(const lks_kv_layer *kv, const lks_attn_rows *rows, const char *op,
                        int *n_seqs) {
  *n_seqs = 0;
  for (int i = 0; i < rows->n; i++) {
    if (rows->seq[i] < 0) return lks_set_error(LKS_ERANGE, "%s: row %d has sequence %d", op, i, rows->seq[i]);
    if (rows->seq[i] + 1 > *n_seqs) *n_seqs = rows->seq[i] + 1;
    const int32_t *bt = rows->block_table + (size_t)rows->seq[i] * rows->max_blocks;
    for (int b = 0; b <= rows->pos[i] / kv->block_size; b++)
      if (bt[b] < 0 || bt[b] >= kv->n_blocks)
        return lks_set_error(LKS_ERANGE, "%s: row %d reads block %d of %d", op, i, bt[b],
                             kv->n_blocks);
  }
  return 0;
}

// Positions, sequences and the block table rows of a batch, on the device.
static int up_rows(cuda_backend *c, const lks_attn_rows *rows, int n_seqs, void **d_pos,
                   void **d_seq, void **d_bt) {
  LKS_TRY(up(c, SC_IDX0, rows->pos, (size_t)rows->n * sizeof(int32_t), d_pos));
  LKS_TRY(up(c, SC_IDX1, rows->seq, (size_t)rows->n * sizeof(int32_t), d_seq));
  return up(c, SC_IDX2, rows->block_table, (size_t)n_seqs * rows->max_blocks * sizeof(int32_t),
            d_bt);
}

static int cu_attention(lks_backend *be, lks_tensor out, lks_tensor q, const lks_kv_layer *kv,
                        const lks_attn_rows *rows, int n_heads, float scale) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  if (rows->n <= 0) return 0;
  if (n_heads % kv->n_kv_heads != 0)
    return lks_set_error(LKS_ESHAPE, "attention: %d query heads over %d KV heads", n_heads,
                         kv->n_kv_heads);
  int n_seqs;
  LKS_TRY(check_blocks(kv, rows, "attention", &n_seqs));
  void *d_seq, *d_pos, *d_bt;
  LKS_TRY(up_rows(c, rows, n_seqs, &d_pos, &d_seq, &d_bt));
  if (REPLAYING(c)) return 0;
  LKS_CUDA_TRY(lks__cu_attention(c->st, (float *)dp(out), out.ld, (const float *)dp(q), q.ld,
                                 kv->k->d, kv->v->d, kv->n_kv_heads, kv->head_dim, n_heads,
                                 kv->block_size, d_seq, d_pos, d_bt, rows->max_blocks, rows->n,
                                 scale));
  return 0;
}

// ---- glm_moe_dsa: LayerNorm, the k-only cache, the DSA indexer, MLA (kernels in mla.cu) ----

static int cu_layernorm(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor w, lks_tensor b,
                        float eps) {
  cuda_backend *c = (cuda_backend *)be;
  lks_tensor wb[2] = {w, b};
  for (int i = 0; i < 2; i++)
    if (wb[i].cols != x.cols ||
        (wb[i].dtype != LKS_F32 && wb[i].dtype != LKS_BF16 && wb[i].dtype != LKS_F16))
      return lks_set_error(LKS_ESHAPE, "layernorm: %s of %lld columns (%s) for rows of %lld",
                           i ? "bias" : "weight", (long long)wb[i].cols,
                           lks_dtype_name(wb[i].dtype), (long long)x.cols);
  if (out.rows != x.rows || out.cols != x.cols)
    return lks_set_error(LKS_ESHAPE, "layernorm: out [%lld, %lld] for x [%lld, %lld]",
                         (long long)out.rows, (long long)out.cols, (long long)x.rows,
                         (long long)x.cols);
  LKS_CUDA_TRY(lks__cu_layernorm(c->st, (float *)dp(out), out.ld, (const float *)dp(x), x.ld,
                                 dp(w), w.dtype, dp(b), b.dtype, x.rows, x.cols, eps));
  return 0;
}

static int cu_cache_store(lks_backend *be, const lks_kv_layer *kv, lks_tensor x,
                          const lks_attn_rows *rows) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  if (!kv->k || x.cols != kv->head_dim)
    return lks_set_error(LKS_ESHAPE, "cache_store: %lld columns into a cache of width %d",
                         (long long)x.cols, kv->k ? kv->head_dim : 0);
  if (rows->n <= 0) return 0;
  void *d_slot;
  LKS_TRY(up(c, SC_IDX0, rows->slot, (size_t)rows->n * sizeof(int32_t), &d_slot));
  LKS_CUDA_TRY(lks__cu_cache_store(c->st, kv->k->d, kv->head_dim, (const float *)dp(x), x.ld,
                                   d_slot, rows->n));
  return 0;
}

// The scores of one launch stay under this many bytes: rows go in groups (each row's result is
// its own, so the grouping changes nothing but the memory).
enum { DSA_SCORE_BYTES = 256 << 20 };

static int cu_dsa_select(lks_backend *be, lks_tensor q, lks_tensor w, const lks_kv_layer *keys,
                         const lks_attn_rows *rows, int n_heads, float q_scale, float w_scale,
                         int topk, int32_t *sel, int32_t *n_sel) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(keys, rows));
  if (!keys->k || q.cols != (int64_t)n_heads * keys->head_dim || w.cols != n_heads || topk < 1)
    return lks_set_error(LKS_ESHAPE, "dsa_select: q has %lld columns, %d heads of %d, w %lld, top-%d",
                         (long long)q.cols, n_heads, keys->head_dim, (long long)w.cols, topk);
  int n = rows->n, n_seqs, max_keys = 1;
  if (n <= 0) return 0;
  LKS_TRY(check_blocks(keys, rows, "dsa_select", &n_seqs));
  for (int i = 0; i < n; i++)
    if (rows->pos[i] + 1 > max_keys) max_keys = rows->pos[i] + 1;
  void *d_pos, *d_seq, *d_bt, *d_out, *d_scores;
  LKS_TRY(up_rows(c, rows, n_seqs, &d_pos, &d_seq, &d_bt));
  size_t n_out = (size_t)n * topk;
  LKS_TRY(need(c, SC_OUT, (n_out + (size_t)n) * sizeof(int32_t), &d_out));
  int32_t *d_sel = d_out, *d_nsel = d_sel + n_out;
  int group = (int)(DSA_SCORE_BYTES / ((size_t)max_keys * sizeof(float)));
  if (group < 1) group = 1;
  if (group > n) group = n;
  if (group > 65535) group = 65535;  // the kernels' grid
  LKS_TRY(need(c, SC_WORK, (size_t)group * max_keys * sizeof(float), &d_scores));
  for (int r0 = 0; r0 < n; r0 += group) {
    int g = n - r0 < group ? n - r0 : group;
    LKS_CUDA_TRY(lks__cu_dsa_select(c->st, (const float *)dp(q) + r0 * q.ld, q.ld,
                                    (const float *)dp(w) + r0 * w.ld, w.ld, keys->k->d,
                                    keys->head_dim, n_heads, q_scale, w_scale, topk,
                                    keys->block_size, (const int32_t *)d_seq + r0,
                                    (const int32_t *)d_pos + r0, d_bt, rows->max_blocks, g,
                                    max_keys, d_scores, d_sel + (size_t)r0 * topk, d_nsel + r0));
  }
  LKS_CUDA_TRY(cudaMemcpyAsync(sel, d_sel, n_out * sizeof(int32_t), cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaMemcpyAsync(n_sel, d_nsel, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

static int cu_mla_attention(lks_backend *be, lks_tensor out, lks_tensor q, lks_tensor wkv_b,
                            const lks_kv_layer *kv, const lks_attn_rows *rows,
                            const lks_mla_dims *d, const int32_t *sel, const int32_t *n_sel,
                            int sel_stride) {
  cuda_backend *c = (cuda_backend *)be;
  LKS_TRY(lks_attn_rows_check(kv, rows));
  int R = d->latent, dn = d->nope, dr = d->rope, dv = d->v_dim, nh = d->n_heads;
  if (!kv->k || kv->head_dim != R + dr || q.cols != (int64_t)nh * (dn + dr) ||
      out.cols != (int64_t)nh * dv || wkv_b.rows != (int64_t)nh * (dn + dv) || wkv_b.cols != R)
    return lks_set_error(LKS_ESHAPE,
                         "mla_attention: q %lld / out %lld columns, kv_b [%lld, %lld], cache width %d "
                         "for %d heads (nope %d, rope %d, v %d, latent %d)",
                         (long long)q.cols, (long long)out.cols, (long long)wkv_b.rows,
                         (long long)wkv_b.cols, kv->head_dim, nh, dn, dr, dv, R);
  LKS_TRY(lks_weight_check(wkv_b, R));
  // The kernel (mla.cu) widens kv_b from F32 / BF16 / F16 only; FP8 or NVFP4 codes would be read
  // as halves. The CPU backend dequantizes them (cpu_mla.c).
  if (wkv_b.qs != LKS_Q_NONE)
    return lks_set_error(LKS_EUNSUPPORTED,
                         "mla_attention: kv_b_proj quantized (%s) is not supported on the cuda "
                         "backend yet; run quantized GLM-5 checkpoints on the cpu backend",
                         lks_qscheme_name(wkv_b.qs, wkv_b.dtype));
  int n = rows->n, n_seqs;
  if (n <= 0) return 0;
  if ((int64_t)n * nh > 0x7fffffff)
    return lks_set_error(LKS_ERANGE, "mla_attention: %d rows of %d heads in one call", n, nh);
  for (int i = 0; sel && i < n; i++) {
    if (n_sel[i] < 1 || n_sel[i] > sel_stride)
      return lks_set_error(LKS_ERANGE, "mla_attention: row %d selects %d keys of %d", i, n_sel[i],
                           sel_stride);
    for (int k = 0; k < n_sel[i]; k++)
      if (sel[(size_t)i * sel_stride + k] < 0 || sel[(size_t)i * sel_stride + k] > rows->pos[i])
        return lks_set_error(LKS_ERANGE, "mla_attention: row %d selects position %d past %d", i,
                             sel[(size_t)i * sel_stride + k], rows->pos[i]);
  }
  LKS_TRY(check_blocks(kv, rows, "mla_attention", &n_seqs));
  void *d_pos, *d_seq, *d_bt, *d_sel = NULL, *d_nsel = NULL;
  LKS_TRY(up_rows(c, rows, n_seqs, &d_pos, &d_seq, &d_bt));
  if (sel) {
    LKS_TRY(up(c, SC_SEL, sel, (size_t)n * sel_stride * sizeof(int32_t), &d_sel));
    LKS_TRY(up(c, SC_NSEL, n_sel, (size_t)n * sizeof(int32_t), &d_nsel));
  }
  LKS_CUDA_TRY(lks__cu_mla_attention(c->st, (float *)dp(out), out.ld, (const float *)dp(q), q.ld,
                                     dp(wkv_b), wkv_b.dtype, wkv_b.ld, kv->k->d, R, dn, dr, dv, nh,
                                     d->scale, kv->block_size, d_seq, d_pos, d_bt,
                                     rows->max_blocks, d_sel, d_nsel, sel_stride, n));
  return 0;
}

// ---- MoE ----

static int cu_route(lks_backend *be, lks_tensor logits, lks_tensor bias,
                    const lks_route_params *p, int32_t *ids, float *weights) {
  cuda_backend *c = (cuda_backend *)be;
  int E = p->n_experts, n = (int)logits.rows;
  if (E <= 0 || E > logits.cols || p->top_k <= 0 || p->top_k > E || p->n_group <= 0 ||
      p->n_group > 256 || E % p->n_group != 0 ||
      (p->n_group > 1 && (p->topk_group <= 0 || p->topk_group > p->n_group)))
    return lks_set_error(LKS_EINVAL, "route: %d experts, top %d, %d groups (top %d)", E,
                         p->top_k, p->n_group, p->topk_group);
  if (n <= 0) return 0;
  if (c->gmode != G_EAGER) return graph_refuse(c, "route");
  void *scratch, *out;
  LKS_TRY(need(c, SC_ROUTE, ((size_t)n * 2 * E + (size_t)E) * sizeof(float), &scratch));
  float *bias_f32 = NULL;
  if (bias.buf) {
    bias_f32 = (float *)scratch + (size_t)n * 2 * E;
    LKS_CUDA_TRY(lks__cu_convert(c->st, bias_f32, LKS_F32, E, dp(bias), bias.dtype, bias.ld, 1, E));
  }
  size_t nk = (size_t)n * p->top_k;
  LKS_TRY(need(c, SC_OUT, nk * 8, &out));
  int32_t *d_ids = out;
  float *d_w = (float *)((char *)out + nk * 4);
  LKS_CUDA_TRY(lks__cu_route(c->st, (const float *)dp(logits), logits.ld, bias_f32, n, E,
                             p->top_k, p->n_group, p->topk_group, p->norm_topk_prob, p->scaling,
                             scratch, d_ids, d_w));
  LKS_CUDA_TRY(cudaMemcpyAsync(ids, d_ids, nk * 4, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaMemcpyAsync(weights, d_w, nk * 4, cudaMemcpyDeviceToHost, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

static int cu_expert(lks_backend *be, lks_tensor out, lks_tensor x, const int32_t *rows,
                     const float *weights, int n, lks_tensor gate, lks_tensor up_w,
                     lks_tensor down_w) {
  cuda_backend *c = (cuda_backend *)be;
  int64_t H = x.cols, I = gate.rows, O = out.cols;
  LKS_TRY(lks_weight_check(gate, H));
  LKS_TRY(lks_weight_check(up_w, H));
  LKS_TRY(lks_weight_check(down_w, I));
  if (up_w.rows != I || down_w.rows != O)
    return lks_set_error(LKS_ESHAPE, "expert: gate/up/down shapes disagree");
  if (n <= 0) return 0;
  const float *xin = (const float *)dp(x);
  int64_t ldx = x.ld;
  int32_t *d_rows = NULL;
  if (rows) {
    for (int i = 0; i < n; i++)
      if (rows[i] < 0 || rows[i] >= x.rows || rows[i] >= out.rows)
        return lks_set_error(LKS_ERANGE, "expert: row %d outside [0, %lld)", rows[i],
                             (long long)x.rows);
    void *r;
    LKS_TRY(up(c, SC_IDX0, rows, (size_t)n * sizeof *rows, &r));
    d_rows = r;
  }
  float *d_w = NULL;
  if (weights) {
    void *w;
    LKS_TRY(up(c, SC_W, weights, (size_t)n * sizeof *weights, &w));
    d_w = w;
  }
  if (n > LKS__CU_GEMV_ROWS * 65535)
    return lks_set_error(LKS_ERANGE, "expert: %d rows in one call", n);
  // Gate and up in one launch, reading the selected rows in place; SwiGLU once per element; down
  // with the weighted scatter-add in the same launch when the rows fit one group of the kernel
  // (it adds repeated rows in order within a group), else into d and then the ordered
  // scatter-add. Both round exactly alike: a row's result does not depend on n.
  // Quantized weights go through the generic products (cuda/quant.cu), whatever n.
  bool plain = gate.qs == LKS_Q_NONE && up_w.qs == LKS_Q_NONE && down_w.qs == LKS_Q_NONE;
  void *gud, *xg = NULL;
  LKS_TRY(need(c, SC_GUD, (size_t)n * (2 * I + O) * sizeof(float), &gud));
  if ((gate.dtype != up_w.dtype || !plain) && rows)
    LKS_TRY(need(c, SC_XG, (size_t)n * H * sizeof(float), &xg));
  if (REPLAYING(c)) return 0;
  float *g = gud, *u = g + (size_t)n * I, *d = u + (size_t)n * I;
  if (gate.dtype == up_w.dtype && plain) {
    LKS_CUDA_TRY(lks__cu_gemv_gate_up(c->st, g, u, I, xin, ldx, d_rows, dp(gate), gate.ld,
                                      dp(up_w), up_w.ld, gate.dtype, n, I, H));
  } else {
    if (rows) {
      LKS_CUDA_TRY(lks__cu_gather_rows(c->st, xg, H, xin, ldx, d_rows, n, H));
      xin = xg;
      ldx = H;
    }
    LKS_TRY(mm(c, g, I, xin, ldx, n, gate, NULL, LKS_F32, false));
    LKS_TRY(mm(c, u, I, xin, ldx, n, up_w, NULL, LKS_F32, false));
  }
  LKS_CUDA_TRY(lks__cu_swiglu(c->st, g, u, (int64_t)n * I));
  if (n <= LKS__CU_GEMV_ROWS && plain) {
    LKS_CUDA_TRY(lks__cu_gemv_down_add(c->st, (float *)dp(out), out.ld, d_rows, d_w, g, I,
                                       dp(down_w), down_w.dtype, down_w.ld, n, O, I));
    return 0;
  }
  LKS_TRY(mm(c, d, O, g, I, n, down_w, NULL, LKS_F32, false));
  LKS_CUDA_TRY(lks__cu_scatter_add(c->st, (float *)dp(out), out.ld, d, O, d_rows, d_w, n, O));
  return 0;
}

// The device table of the experts' weight pointers for ex (see moe_table), made on first use
// and checked against the tensors on every call (a layer's experts never move, but a freed
// model's array may be reused by another).
static int moe_table_get(cuda_backend *c, const lks_moe_experts *ex, moe_table **out) {
  moe_table *t = NULL;
  for (int i = 0; i < c->n_mt && !t; i++)
    if (c->mt[i].key == ex->gate && c->mt[i].e0 == ex->e0 && c->mt[i].n == ex->n) t = &c->mt[i];
  size_t nb = (size_t)3 * ex->n * sizeof(void *);
  const void **want = malloc(nb ? nb : 1);
  if (!want) return lks_set_error(LKS_ENOMEM, "moe: out of host memory");
  bool aligned = true;
  for (int e = 0; e < ex->n; e++) {
    const lks_tensor *w[3] = {ex->gate + (size_t)(ex->e0 + e) * ex->stride,
                              ex->up + (size_t)(ex->e0 + e) * ex->stride,
                              ex->down + (size_t)(ex->e0 + e) * ex->stride};
    for (int k = 0; k < 3; k++) {
      want[(size_t)k * ex->n + e] = dp(*w[k]);
      aligned &= ((uintptr_t)dp(*w[k]) & 15) == 0;
    }
  }
  if (t && memcmp(t->host, want, nb) == 0) {
    free(want);
    *out = t;
    return 0;
  }
  if (c->gmode != G_EAGER) {
    free(want);
    return graph_refuse(c, "a new expert table");
  }
  if (!t) {
    if (c->n_mt == c->cap_mt) {
      int cap = c->cap_mt ? 2 * c->cap_mt : 64;
      moe_table *nt = realloc(c->mt, (size_t)cap * sizeof *nt);
      if (!nt) {
        free(want);
        return lks_set_error(LKS_ENOMEM, "moe: out of host memory");
      }
      c->mt = nt;
      c->cap_mt = cap;
    }
    t = &c->mt[c->n_mt++];
    memset(t, 0, sizeof *t);
    t->key = ex->gate;
    t->e0 = ex->e0;
    t->n = ex->n;
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, nb ? nb : 1);
    if (e != cudaSuccess) {
      c->n_mt--;
      free(want);
      return lks_set_error(LKS_ENOMEM, "moe: expert table: %s", cudaGetErrorString(e));
    }
    t->dev = d;
  } else {
    graphs_drop(c);  // (it synchronises) queued work and graphs read the old table
    free(t->host);
  }
  t->host = want;
  t->aligned = aligned;
  LKS_CUDA_TRY(cudaMemcpyAsync(t->dev, want, nb, cudaMemcpyHostToDevice, c->st));
  LKS_CUDA_TRY(cudaStreamSynchronize(c->st));  // want is pageable
  *out = t;
  return 0;
}

static size_t al256(size_t b) { return (b + 255) / 256 * 256; }

static int cu_moe(lks_backend *be, lks_tensor out, lks_tensor x, lks_tensor logits,
                  lks_tensor bias, const lks_route_params *p, const lks_moe_experts *ex,
                  int32_t *ids_host, float *w_host) {
  cuda_backend *c = (cuda_backend *)be;
  int E = p->n_experts, n = (int)logits.rows, k = p->top_k;
  if (E <= 0 || E > logits.cols || k <= 0 || k > E || p->n_group <= 0 || p->n_group > 256 ||
      E % p->n_group != 0 || (p->n_group > 1 && (p->topk_group <= 0 || p->topk_group > p->n_group)))
    return lks_set_error(LKS_EINVAL, "moe: %d experts, top %d, %d groups (top %d)", E, k,
                         p->n_group, p->topk_group);
  if (ex->e0 < 0 || ex->n < 0 || ex->e0 + ex->n > E)
    return lks_set_error(LKS_EINVAL, "moe: experts [%d, %d) of %d", ex->e0, ex->e0 + ex->n, E);
  if (x.rows != n || out.rows != n)
    return lks_set_error(LKS_ESHAPE, "moe: %lld logits rows, %lld input rows, %lld output rows",
                         (long long)n, (long long)x.rows, (long long)out.rows);
  if (ex->n > 1024)
    return lks_set_error(LKS_EUNSUPPORTED, "moe: %d experts on one device (at most 1024)", ex->n);
  int64_t H = x.cols, O = out.cols, I = 0, ld_gu = 0, ld_d = 0;
  lks_dtype dt = LKS_F32;
  // Every expert the same dtype and shape, gate and up with one row stride: one table serves all.
  for (int e = ex->e0; e < ex->e0 + ex->n; e++) {
    const lks_tensor *g = ex->gate + (size_t)e * ex->stride, *u = ex->up + (size_t)e * ex->stride,
                     *d = ex->down + (size_t)e * ex->stride;
    if (!g->buf || !u->buf || !d->buf)
      return lks_set_error(LKS_EINVAL, "moe: expert %d has no weights", e);
    if (g->qs != LKS_Q_NONE || u->qs != LKS_Q_NONE || d->qs != LKS_Q_NONE)
      return lks_set_error(LKS_EUNSUPPORTED, "moe: quantized experts run through the expert op");
    LKS_TRY(lks_weight_check(*g, H));
    LKS_TRY(lks_weight_check(*u, H));
    if (e == ex->e0) {
      I = g->rows;
      dt = g->dtype;
      ld_gu = g->ld;
      ld_d = d->ld;
    }
    LKS_TRY(lks_weight_check(*d, I));
    if (u->rows != I || d->rows != O)
      return lks_set_error(LKS_ESHAPE, "moe: expert %d: gate/up/down shapes disagree", e);
    if (g->rows != I || g->dtype != dt || u->dtype != dt || d->dtype != dt || g->ld != ld_gu ||
        u->ld != ld_gu || d->ld != ld_d)
      return lks_set_error(LKS_EUNSUPPORTED,
                           "moe: the experts' weights differ in dtype, shape or row stride");
  }
  if (n <= 0) return 0;
  size_t nk = (size_t)n * k;
  int64_t bound = (int64_t)(nk + LKS__CU_GEMV_ROWS - 1) / LKS__CU_GEMV_ROWS + ex->n;
  if (bound > (int64_t)nk) bound = (int64_t)nk;
  if (bound > 65535)
    return lks_set_error(LKS_ERANGE, "moe: %d rows in one call (the plan needs %lld groups)", n,
                         (long long)bound);
  moe_table *t = NULL;
  if (ex->n > 0) LKS_TRY(moe_table_get(c, ex, &t));
  // Scratch: groups, ids, weights, pair rows and indices, f32 bias, route scratch, g, u, d.
  size_t o_groups = 0, o_ids = al256((size_t)bound * 16), o_w = o_ids + al256(nk * 4),
         o_prow = o_w + al256(nk * 4), o_pidx = o_prow + al256(nk * 4),
         o_bias = o_pidx + al256(nk * 4), o_rs = o_bias + al256((size_t)E * 4),
         o_g = o_rs + al256(lks__cu_route_plan_scratch(E)), o_u = o_g + al256(nk * I * 4),
         o_d = o_u + al256(nk * I * 4), total = o_d + al256(nk * O * 4);
  void *sc;
  LKS_TRY(need(c, SC_MOE, total, &sc));
  char *b = sc;
  int4 *groups = (int4 *)(b + o_groups);
  int32_t *ids = (int32_t *)(b + o_ids), *prow = (int32_t *)(b + o_prow),
          *pidx = (int32_t *)(b + o_pidx);
  float *w = (float *)(b + o_w), *g = (float *)(b + o_g), *u = (float *)(b + o_u),
        *d = (float *)(b + o_d);
  if ((ids_host || w_host) && c->gmode != G_EAGER) return graph_refuse(c, "moe routing to the host");
  if (REPLAYING(c)) return 0;
  const float *bias_f32 = NULL;
  if (bias.buf) {
    if (bias.dtype == LKS_F32) {
      bias_f32 = (const float *)dp(bias);
    } else {
      LKS_CUDA_TRY(lks__cu_convert(c->st, b + o_bias, LKS_F32, E, dp(bias), bias.dtype, bias.ld,
                                   1, E));
      bias_f32 = (const float *)(b + o_bias);
    }
  }
  LKS_CUDA_TRY(lks__cu_route_plan(c->st, (const float *)dp(logits), logits.ld, bias_f32, n, E, k,
                                  p->n_group, p->topk_group, p->norm_topk_prob, p->scaling,
                                  (float *)(b + o_rs), ids, w, ex->e0, ex->n, groups, (int)bound,
                                  prow, pidx));
  if (t) {
    const void *const *tab = (const void *const *)t->dev;
    // Gate and up of every local pair, SwiGLU, down into the pair's row of d, then each row's
    // pairs added in rank order.
    LKS_CUDA_TRY(lks__cu_gemv_grouped(c->st, g, u, I, (const float *)dp(x), x.ld, prow, pidx,
                                      groups, bound, tab, tab + ex->n, ld_gu, dt, t->aligned, n,
                                      I, H));
    LKS_CUDA_TRY(lks__cu_swiglu(c->st, g, u, (int64_t)nk * I));
    LKS_CUDA_TRY(lks__cu_gemv_grouped(c->st, d, NULL, O, g, I, pidx, pidx, groups, bound,
                                      tab + 2 * (size_t)ex->n, NULL, ld_d, dt, t->aligned, n, O,
                                      I));
    LKS_CUDA_TRY(lks__cu_moe_combine(c->st, (float *)dp(out), out.ld, d, O, ids, w, n, k, ex->e0,
                                     ex->n, O));
  }
  if (ids_host) LKS_CUDA_TRY(cudaMemcpyAsync(ids_host, ids, nk * 4, cudaMemcpyDeviceToHost, c->st));
  if (w_host) LKS_CUDA_TRY(cudaMemcpyAsync(w_host, w, nk * 4, cudaMemcpyDeviceToHost, c->st));
  if (ids_host || w_host) LKS_CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

// ---- recorded steps ----

static int cu_step_begin(lks_backend *be, uint64_t key) {
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

static int cu_step_end(lks_backend *be, int rc) {
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

// ---- lifetime ----

static void cu_free(lks_backend *be) {
  cuda_backend *c = (cuda_backend *)be;
  if (!c) return;
  if (c->st) cudaStreamSynchronize(c->st);
  graphs_drop(c);
  for (int i = 0; i < c->n_mt; i++) {
    cudaFree(c->mt[i].dev);
    free(c->mt[i].host);
  }
  free(c->mt);
  if (c->st && c->st == live_stream) live_stream = NULL;
  if (c->st) live_backends--;
  for (int i = 0; i < SC_N; i++)
    if (c->sc[i].p) cudaFree(c->sc[i].p);
  if (c->ring) cudaFreeHost(c->ring);
  for (int i = 0; i < 2; i++)
    if (c->ring_ev[i]) cudaEventDestroy(c->ring_ev[i]);
  if (c->st) cudaStreamDestroy(c->st);
  free(c);
}

static const lks_backend_ops cuda_ops = {
    .name = "cuda",
    .free = cu_free,
    .buf_alloc = cu_buf_alloc,
    .buf_wrap_host = cu_buf_wrap_host,
    .buf_wrap_host_2d = cu_buf_wrap_host_2d,
    .buf_ptr = cu_buf_ptr,
    .buf_free = cu_buf_free,
    .zero = cu_zero,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .matmul = cu_matmul,
    .rope = cu_rope,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .route = cu_route,
    .expert = cu_expert,
    .moe = cu_moe,
    .step_begin = cu_step_begin,
    .step_end = cu_step_end,
    .gather_rows = cu_gather_rows,
    .argmax = cu_argmax,
    .layernorm = cu_layernorm,
    .cache_store = cu_cache_store,
    .dsa_select = cu_dsa_select,
    .mla_attention = cu_mla_attention,
};

static int init(cuda_backend *c, int device) {
  LKS_CUDA_TRY(cudaSetDevice(device));
  LKS_CUDA_TRY(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
  if (live_backends++ == 0) live_stream = c->st;
  const char *gv = getenv("LKS_CUDA_GRAPHS");
  c->graphs = gv && strcmp(gv, "1") == 0;
  for (int i = 0; i < 2; i++)
    LKS_CUDA_TRY(cudaEventCreateWithFlags(&c->ring_ev[i], cudaEventDisableTiming));
  void *ring = NULL;
  if (cudaHostAlloc(&ring, RING_BYTES, cudaHostAllocDefault) == cudaSuccess)
    c->ring = ring;
  else
    (void)cudaGetLastError();  // pageable copies then: slower, still correct
  struct cudaDeviceProp prop;
  LKS_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  LKS_LOG(LKS_LOG_INFO, "cuda backend: device %d, %s (sm_%d%d, %.1f GiB), CUDA graphs %s",
          device, prop.name, prop.major, prop.minor,
          (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024),
          c->graphs ? "on (LKS_CUDA_GRAPHS=1)" : "off");
  return 0;
}

lks_backend *lks__backend_cuda_new(int device) {
  int dev = lks__cuda_pick_device(device);
  if (dev < 0) return NULL;
  cuda_backend *c = calloc(1, sizeof *c);
  if (!c) {
    lks_set_error(LKS_ENOMEM, "cuda backend: out of memory");
    return NULL;
  }
  c->base.ops = &cuda_ops;
  c->device = dev;
  if (init(c, dev) < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lks_last_error());
    cu_free(&c->base);
    lks_set_error(LKS_EBACKEND, "%s", msg);
    return NULL;
  }
  return &c->base;
}
