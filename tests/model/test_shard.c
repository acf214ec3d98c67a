// SPDX-License-Identifier: MIT
// Tensor- and expert-parallel shards against the whole model, under mpirun.
//
// usage: mpirun -np N test_shard MODEL_DIR [blocks|rows|auto EXPECTED]
//   the routed experts' split (lks_experts_split, blocks by default); auto takes the split it
//   must resolve to at world > 1 (blocks or rows) and fails on the other;
//   LKS_TEST_BACKEND=cuda, LKS_TEST_COMM=nccl: on GPUs
//
// Every rank loads its shard (world N, MPI collectives) and, in the same process, the whole model
// (world 1). Both run the same prefill, decode steps and MTP steps on the same inputs; the test
// checks, on every rank: greedy tokens identical, logits within 1e-4 of world 1 (max|diff| /
// max|ref|), MTP drafts identical; exactly two all-reduces per layer per forward; and that the
// bytes the rank loaded are within 5% of its share (replicated tensors + 1/N of the rest),
// computed here from the safetensors file by tensor name, independently of the loader. (With
// fewer KV heads than ranks, each rank holds the one KV head its query heads read.)
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/comm.h"
#include "core/error.h"
#include "model/model.h"
#include "model/safetensors.h"

static int failures, rank;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("[rank %d] %-70s %s\n", rank, msg, ok ? "ok" : "FAIL");
  failures += !ok;
}

#define TRY(x)                                                                          \
  do {                                                                                  \
    if ((x) < 0) {                                                                      \
      fprintf(stderr, "[rank %d] %s:%d: %s: %s\n", rank, __FILE__, __LINE__, #x, lks_last_error()); \
      lks_mpi_abort(1);                                                                 \
    }                                                                                   \
  } while (0)

static double rel_err(const float *a, const float *ref, size_t n) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - ref[i]);
    if (!(d <= md)) md = d;
    if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
  }
  return mr > 0 ? md / mr : md;
}

// Bytes that every rank holds whole (DESIGN.md section 5: embedding, norms, router, MTP's
// enorm/hnorm/eh_proj); the rest is split N ways.
static bool replicated(const char *name) {
  // glm_moe_dsa: the latent projections and the whole indexer too (model/mla.h).
  const char *pats[] = {"embed_tokens", "norm.weight", "layernorm", "mlp.gate.weight",
                        "e_score_correction_bias", "eh_proj", "q_a_proj", "kv_a_proj_with_mqa",
                        "self_attn.indexer."};
  for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
    if (strstr(name, pats[i])) return true;
  return false;
}

typedef struct {
  lks_model *m;
  lks_kv_cache *kv, *mkv;
} side;

// What the phases share: both sides, the inputs every rank uses, and each side's results.
typedef struct {
  int world;
  lks_experts_split split;  // as asked on the command line (auto: as it must resolve)
  lks_backend *be;
  lks_comm *comm;
  side s[2];  // 0: this rank's shard, 1: the whole model
  const lks_config *c;
  int V, P, G, len;                 // vocabulary, prompt, greedy steps, cache length
  int32_t *tok, *pos, *seq, *rows;  // [len]: random tokens, 0.., zeros, 0..
  float *lg[2], *mt[2];             // [P, V]: prefill and MTP first-draft logits per side
  int32_t g[2][64];                 // greedy tokens per side
  lks_tensor hid[2];                // prefill hiddens per side
} shard_run;

// MPI, the backend, the collectives, and both sides loaded with a cache each (and an MTP cache
// when the model has an MTP layer). Exits on failure.
static void start(shard_run *r, int *argc, char ***argv) {
  lks_experts_split split = LKS_EXPERTS_BLOCKS, expected = LKS_EXPERTS_BLOCKS;
  if (lks_mpi_init(argc, argv, &rank, &r->world) < 0 || *argc < 2 || *argc > 4 ||
      (*argc >= 3 && lks_model_experts_split_parse((*argv)[2], &split) < 0) ||
      (*argc == 4) != (split == LKS_EXPERTS_AUTO) ||
      (*argc == 4 && (lks_model_experts_split_parse((*argv)[3], &expected) < 0 ||
                      expected == LKS_EXPERTS_AUTO))) {
    fprintf(stderr, "usage: mpirun -np N %s MODEL_DIR [blocks|rows|auto EXPECTED]\n", (*argv)[0]);
    exit(2);
  }
  const char *dir = (*argv)[1];
  // LKS_TEST_BACKEND=cuda (tests/gpu/run.sh): the same checks on the GPU, with the MPI
  // collectives staging device buffers, or NCCL with LKS_TEST_COMM=nccl (a GPU per rank).
  const char *bname = getenv("LKS_TEST_BACKEND"), *cname = getenv("LKS_TEST_COMM");
  bool cuda = bname && strcmp(bname, "cuda") == 0, nccl = cname && strcmp(cname, "nccl") == 0;
  r->be = lks_backend_new(bname ? bname : "cpu", 1);
  r->comm = r->world == 1 ? lks_comm_local_new()
            : nccl        ? lks_comm_nccl_new(60, -1)
            : cuda        ? lks_comm_mpi_cuda_new(60)
                          : lks_comm_mpi_new(60);
  if (!r->be || !r->comm) {
    fprintf(stderr, "[rank %d] cannot start: %s\n", rank, lks_last_error());
    lks_mpi_abort(1);
  }
  side *s = r->s;
  r->split = split == LKS_EXPERTS_AUTO ? expected : split;
  s[0].m = lks_model_load_shard(dir, r->be, r->comm, split, NULL, NULL);
  s[1].m = lks_model_load(dir, r->be, NULL, NULL);
  if (!s[0].m || !s[1].m) {
    fprintf(stderr, "[rank %d] cannot load: %s\n", rank, lks_last_error());
    lks_mpi_abort(1);
  }
  r->c = lks_model_config(s[1].m);
  r->V = r->c->vocab, r->P = 24, r->G = 12, r->len = r->P + r->G + 4;
  int len = r->len;
  for (int k = 0; k < 2; k++) {
    s[k].kv = lks_model_kv_new(s[k].m, false, 8, (len + 7) / 8, 1, len);
    s[k].mkv = r->c->n_mtp ? lks_model_kv_new(s[k].m, true, 8, (len + 7) / 8, 1, len) : NULL;
    TRY(lks_kv_seq_alloc(s[k].kv));
    if (s[k].mkv) TRY(lks_kv_seq_alloc(s[k].mkv));
  }
}

static bool cuda_backend(void) {
  const char *b = getenv("LKS_TEST_BACKEND");
  return b && strcmp(b, "cuda") == 0;
}

// Loaded bytes against the share computed from the files. With host routing (the cpu backend)
// and experts in blocks the shared experts are bound whole as well as by rows at world > 1
// (model.c, shared_balanced); with experts by rows, by rows only.
static void check_loaded_bytes(const shard_run *r, const char *dir) {
  const lks_config *c = r->c;
  int world = r->world;
  bool by_rows = lks_model_experts_by_rows(r->s[0].m);
  lks_safetensors *st = lks_safetensors_open(dir);
  double rep = 0, split = 0;
  for (int i = 0; i < lks_safetensors_count(st); i++) {
    const lks_st_tensor *t = lks_safetensors_at(st, i);
    // The MTP layer's optional own head / embedding are never loaded (MODEL.md section 2).
    bool unused = (strstr(t->name, "shared_head.head") != NULL) ||
                  (strstr(t->name, "model.layers.") && strstr(t->name, "embed_tokens"));
    if (unused) continue;
    if (replicated(t->name)) rep += (double)t->nbytes;
    else if (strstr(t->name, "shared_experts.") && world > 1 && !cuda_backend() && !by_rows)
      rep += (double)t->nbytes, split += (double)t->nbytes;  // whole, and this rank's rows
    else if ((strstr(t->name, "k_proj") || strstr(t->name, "v_proj")) && c->n_kv_heads % world)
      rep += (double)t->nbytes / c->n_kv_heads;  // fewer KV heads than ranks: one head each
    else split += (double)t->nbytes;
  }
  double share = rep + split / world, got = (double)lks_model_loaded_bytes(r->s[0].m);
  check(fabs(got - share) <= 0.05 * share, "loaded %.0f bytes, share %.0f (%.2f%%)", got, share,
        100.0 * (got - share) / share);
  lks_safetensors_close(st);
}

// The same inputs on every rank.
static void make_inputs(shard_run *r) {
  int len = r->len, P = r->P, V = r->V;
  r->tok = malloc((size_t)len * sizeof *r->tok);
  r->pos = malloc((size_t)len * sizeof *r->pos);
  r->seq = calloc((size_t)len, sizeof *r->seq);
  r->rows = malloc((size_t)len * sizeof *r->rows);
  for (int k = 0; k < 2; k++) {
    r->lg[k] = malloc((size_t)P * V * sizeof(float));
    r->mt[k] = malloc((size_t)P * V * sizeof(float));
  }
  uint64_t x = 12345;
  for (int i = 0; i < len; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    r->tok[i] = (int32_t)((x >> 33) % (uint64_t)V);
    r->pos[i] = r->rows[i] = i;
  }
}

// Prefill on both sides: logits within 1e-4, two all-reduces per layer on the shard.
static void prefill(shard_run *r) {
  side *s = r->s;
  int P = r->P, V = r->V;
  uint64_t ar0 = r->comm->stats.allreduce;
  for (int k = 0; k < 2; k++) {
    TRY(lks_kv_seq_resize(s[k].kv, 0, P));
    lks_batch b = {P, r->tok, r->pos, r->seq, P, r->rows};
    lks_tensor l;
    TRY(lks_model_forward(s[k].m, s[k].kv, &b, &l, &r->hid[k]));
    TRY(lks_model_logits_host(s[k].m, l, r->lg[k]));
    int32_t last = P - 1;
    lks_tensor lastrow = lks_tensor_rows(l, last, 1);
    TRY(lks_model_argmax(s[k].m, lastrow, &r->g[k][0]));
    if (k == 0) {
      uint64_t n_ar = r->comm->stats.allreduce - ar0;
      check(r->world == 1 || n_ar == 2 * (uint64_t)r->c->n_layers,
            "prefill: %llu all-reduces for %d layers", (unsigned long long)n_ar, r->c->n_layers);
    }
  }
  double e = rel_err(r->lg[0], r->lg[1], (size_t)P * V);
  check(e <= 1e-4, "prefill logits rel err %.2e vs world 1", e);
}

// Decode: greedy on each side independently; the tokens must agree.
static void decode(shard_run *r) {
  side *s = r->s;
  int P = r->P, G = r->G;
  lks_comm *comm = r->comm;
  int same = r->g[0][0] == r->g[1][0];
  for (int i = 1; i < G; i++) {
    for (int k = 0; k < 2; k++) {
      int p = P + i - 1;
      TRY(lks_kv_seq_resize(s[k].kv, 0, p + 1));
      int32_t zero = 0;
      lks_batch d = {1, &r->g[k][i - 1], &r->pos[p], r->seq, 1, &zero};
      lks_tensor l;
      uint64_t before = comm->stats.allreduce;
      TRY(lks_model_forward(s[k].m, s[k].kv, &d, &l, NULL));
      if (k == 0 && i == 1)
        check(r->world == 1 || comm->stats.allreduce - before == 2 * (uint64_t)r->c->n_layers,
              "decode step: %llu all-reduces for %d layers",
              (unsigned long long)(comm->stats.allreduce - before), r->c->n_layers);
      TRY(lks_model_argmax(s[k].m, l, &r->g[k][i]));
    }
    same += r->g[0][i] == r->g[1][i];
  }
  check(same == G, "greedy decode: %d of %d tokens equal to world 1", same, G);
}

// MTP: first drafts over the prompt from each side's own hiddens, then a chain of 3.
static void mtp(shard_run *r) {
  side *s = r->s;
  int n = r->P - 1;
  lks_comm *comm = r->comm;
  int32_t d[2][3];
  for (int k = 0; k < 2; k++) {
    TRY(lks_kv_seq_resize(s[k].mkv, 0, n));
    lks_batch b = {n, r->tok + 1, r->pos, r->seq, n, r->rows};
    lks_tensor l, carry;
    uint64_t before = comm->stats.allreduce;
    TRY(lks_model_mtp(s[k].m, s[k].mkv, &b, lks_tensor_rows(r->hid[k], 0, n), &l, &carry));
    if (k == 0)
      check(r->world == 1 || comm->stats.allreduce - before == 2, "MTP step: %llu all-reduces",
            (unsigned long long)(comm->stats.allreduce - before));
    TRY(lks_model_logits_host(s[k].m, l, r->mt[k]));
    lks_tensor last = lks_tensor_rows(l, n - 1, 1);
    TRY(lks_model_argmax(s[k].m, last, &d[k][0]));
    for (int j = 1; j < 3; j++) {
      int32_t p = n - 1 + j, zero = 0;
      TRY(lks_kv_seq_resize(s[k].mkv, 0, p + 1));
      lks_batch cb = {1, &d[k][j - 1], &p, r->seq, 1, &zero};
      TRY(lks_model_mtp(s[k].m, s[k].mkv, &cb, lks_tensor_rows(carry, carry.rows - 1, 1), &l,
                        &carry));
      TRY(lks_model_argmax(s[k].m, l, &d[k][j]));
    }
  }
  double e = rel_err(r->mt[0], r->mt[1], (size_t)n * r->V);
  check(e <= 1e-4, "MTP first-draft logits rel err %.2e vs world 1", e);
  check(!memcmp(d[0], d[1], sizeof d[0]), "MTP chained drafts %d %d %d (world 1: %d %d %d)",
        d[0][0], d[0][1], d[0][2], d[1][0], d[1][1], d[1][2]);
}

// Every rank's verdict, so that rank 0's exit status covers all; frees everything and ends MPI.
// The exit status.
static int finish(shard_run *r) {
  int64_t bad = failures;
  lks_comm_where w = {"test", -1};
  if (r->world > 1) TRY(r->comm->ops->vote_max(r->comm, &bad, w));
  for (int k = 0; k < 2; k++) {
    lks_kv_free(r->s[k].kv);
    lks_kv_free(r->s[k].mkv);
    lks_model_free(r->s[k].m);
    free(r->lg[k]);
    free(r->mt[k]);
  }
  free(r->tok);
  free(r->pos);
  free(r->seq);
  free(r->rows);
  lks_comm_free(r->comm);
  lks_backend_free(r->be);
  lks_mpi_finalize();
  if (rank == 0) printf("%s\n", bad ? "FAILED" : "all shard checks passed");
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  shard_run r = {0};
  start(&r, &argc, &argv);
  bool by_rows = lks_model_experts_by_rows(r.s[0].m);
  check(by_rows == (r.split == LKS_EXPERTS_ROWS && r.world > 1),
        "routed experts split by %s", by_rows ? "rows" : "blocks");
  check_loaded_bytes(&r, argv[1]);
  make_inputs(&r);
  prefill(&r);
  decode(&r);
  if (r.c->n_mtp) mtp(&r);
  return finish(&r);
}
