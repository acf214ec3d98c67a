// SPDX-License-Identifier: MIT
// World start-up, fingerprint agreement and shutdown (see world.h).
#include "worker/world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "model/dflash.h"
#include "model/safetensors.h"

#ifndef LKS_BUILD_ID
#define LKS_BUILD_ID "unknown"
#endif

const char *lks_build_id(void) { return LKS_BUILD_ID; }

// ---- fingerprint ----

enum { FP_FIELDS = 15, FP_NAME = 24, FP_VALUE = 104 };
typedef struct {
  char name[FP_FIELDS][FP_NAME];
  char value[FP_FIELDS][FP_VALUE];
} fingerprint;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static void fp_set(fingerprint *f, int i, const char *name, const char *value) {
  snprintf(f->name[i], FP_NAME, "%s", name);
  snprintf(f->value[i], FP_VALUE, "%s", value ? value : "(unset)");
}

// Everything that changes the forward: protocol, build, model config, weight index, flags.
static int fp_make(fingerprint *f, const lks_settings *s, const char *dir) {
  memset(f, 0, sizeof *f);
  char v[FP_VALUE];
  snprintf(v, sizeof v, "%d", LKS_PROTOCOL_VERSION);
  fp_set(f, 0, "protocol version", v);
  fp_set(f, 1, "build", LKS_BUILD_ID);
  lks_config cfg;
  if (lks_config_load(dir, &cfg) < 0) return LKS_ECONFIG;
  // Hash the parsed fields (not the file's bytes: formatting may differ harmlessly).
  snprintf(v, sizeof v, "%016llx", (unsigned long long)fnv(0xcbf29ce484222325ull, &cfg, sizeof cfg));
  fp_set(f, 2, "model config", v);
  lks_safetensors *st = lks_safetensors_open(dir);
  if (!st) return LKS_EFORMAT;
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < lks_safetensors_count(st); i++) {
    const lks_st_tensor *t = lks_safetensors_at(st, i);
    h = fnv(h, t->name, strlen(t->name) + 1);
    h = fnv(h, &t->dtype, sizeof t->dtype);
    h = fnv(h, t->shape, sizeof t->shape[0] * (size_t)t->n_dims);
  }
  lks_safetensors_close(st);
  snprintf(v, sizeof v, "%016llx", (unsigned long long)h);
  fp_set(f, 3, "weight index", v);
  fp_set(f, 4, "backend", lks_settings_str(s, "backend"));
  snprintf(v, sizeof v, "%ld", lks_settings_int(s, "max-seq-len"));
  fp_set(f, 5, "max-seq-len", v);
  snprintf(v, sizeof v, "%ld", lks_settings_int(s, "kv-block"));
  fp_set(f, 6, "kv-block", v);
  snprintf(v, sizeof v, "%ld", lks_settings_int(s, "max-slots"));
  fp_set(f, 7, "max-slots", v);
  fp_set(f, 8, "spec", lks_settings_str(s, "spec"));
  snprintf(v, sizeof v, "%ld", lks_settings_int(s, "num-drafts"));
  fp_set(f, 9, "num-drafts", v);
  fp_set(f, 10, "comm", lks_settings_str(s, "comm"));
  fp_set(f, 11, "prefix-cache", lks_settings_bool(s, "prefix-cache") ? "true" : "false");
  snprintf(v, sizeof v, "%ld", lks_settings_int(s, "kv-blocks"));
  fp_set(f, 12, "kv-blocks", v);
  fp_set(f, 13, "kv-dtype", lks_settings_str(s, "kv-dtype"));
  fp_set(f, 14, "experts-split", lks_settings_str(s, "experts-split"));
  return 0;
}

int lks_world_agree(lks_comm *comm, const lks_settings *s, const char *dir) {
  fingerprint mine;
  int local_rc = fp_make(&mine, s, dir);
  char local_err[512] = "";
  if (local_rc < 0) snprintf(local_err, sizeof local_err, "%s", lks_last_error());
  // A rank that cannot even read the model says so through the same gather.
  if (local_rc < 0) snprintf(mine.value[2], FP_VALUE, "unreadable: %.80s", local_err);
  fingerprint *all = calloc((size_t)comm->world, sizeof *all);
  if (!all) return lks_set_error(LKS_ENOMEM, "out of memory");
  lks_comm_where w = {"fingerprint", -1};
  int rc = comm->ops->allgather(comm, &mine, all, sizeof mine, w);
  for (int r = 1; rc == 0 && r < comm->world; r++)
    for (int i = 0; i < FP_FIELDS && rc == 0; i++)
      if (strcmp(all[r].value[i], all[0].value[i]) != 0)
        rc = lks_set_error(LKS_ECONFIG,
                           "ranks disagree on '%s': rank 0 has '%s', rank %d has '%s'; every rank "
                           "must run the same build, model and flags",
                           all[0].name[i], all[0].value[i], r, all[r].value[i]);
  free(all);
  if (rc == 0 && local_rc < 0) rc = lks_set_error(local_rc, "%s", local_err);
  return rc;
}

// ---- the KV pool ----

// Bytes of available memory on this machine (MemAvailable), 0 when unknown.
static double mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

// --kv-memory as bytes on this rank: "8G", "512M", "1000000", or a fraction "0.5" of the
// available memory.
static int kv_memory_bytes(const char *text, double *bytes) {
  char *end;
  double v = strtod(text, &end);
  if (end == text || v <= 0) goto bad;
  if (*end == '\0' && v < 1) {
    *bytes = v * mem_available();
    return 0;
  }
  double unit = 1;
  if (*end == 'K' || *end == 'k') unit = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') unit = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') unit = 1024.0 * 1024 * 1024, end++;
  else if (*end == 'T' || *end == 't') unit = 1024.0 * 1024 * 1024 * 1024, end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) goto bad;
  *bytes = v * unit;
  return 0;
bad:
  return lks_set_error(LKS_EINVAL, "--kv-memory '%.64s': expected bytes (8G, 512M) or a fraction "
                       "of the available memory (0.5)", text);
}

// KV blocks per cache: --kv-blocks, or what --kv-memory holds on the rank with the least (a MIN
// vote: every rank gets the same pool, so every rank makes the same cache decisions), or every
// slot at --max-seq-len. At least one longest sequence must fit.
static int kv_blocks(lks_world *w, const lks_settings *s, int max_slots, int *out) {
  int B = (int)lks_settings_int(s, "kv-block"), max_len = (int)lks_settings_int(s, "max-seq-len");
  int per_seq = (max_len + B - 1) / B;
  long fixed = lks_settings_int(s, "kv-blocks");
  const char *mem = lks_settings_str(s, "kv-memory");
  *out = max_slots * per_seq;
  if (fixed > 0) {
    *out = (int)fixed;
  } else if (mem && *mem) {
    // Every rank takes part in the vote, also one whose value does not parse (-1).
    double bytes = 0;
    int bad = kv_memory_bytes(mem, &bytes);
    lks_model_stats st;
    lks_model_stats_get(w->model, &st);
    const lks_config *c = lks_model_config(w->model);
    // Target and drafter layers of this rank's shard, F32.
    double per_block = (double)st.kv_bytes_per_pos * B * (c->n_layers + c->n_mtp) / c->n_layers;
    int64_t mine = bad < 0 ? -1 : (int64_t)(bytes / per_block);
    int64_t *all = calloc((size_t)w->world, sizeof *all);
    if (!all) return lks_set_error(LKS_ENOMEM, "out of memory");
    lks_comm_where where = {"kv-memory vote", -1};
    int rc = w->comm->ops->allgather(w->comm, &mine, all, sizeof mine, where);
    int64_t least = mine;
    for (int r = 0; rc == 0 && r < w->world; r++)
      if (all[r] < least) least = all[r];
    free(all);
    LKS_TRY(rc);
    if (least < 0) return lks_set_error(LKS_EINVAL, "--kv-memory '%.64s' does not parse on every rank", mem);
    *out = least > (1 << 30) ? (1 << 30) : (int)least;
    LKS_LOG(LKS_LOG_INFO, "--kv-memory %s: %d KV blocks of %d positions per cache (%.1f MB each "
            "on this rank; the least of every rank's)", mem, *out, B, per_block / 1e6);
  }
  if (*out < per_seq)
    return lks_set_error(LKS_ECONFIG, "the KV pool has %d blocks; one sequence of --max-seq-len %d "
                         "needs %d (raise --kv-memory or --kv-blocks, or lower --max-seq-len)",
                         *out, max_len, per_seq);
  return 0;
}

// ---- start and stop ----

// The median of 31 all-reduces of n floats on every rank (the first, which waits for the ranks
// to arrive from loading their shards, and one more not counted); host memory (cpu backend).
static int allreduce_time(lks_comm *comm, int64_t n, double *out) {
  enum { N = 31 };
  float *buf = calloc((size_t)(n > 0 ? n : 1), sizeof *buf);
  if (!buf) return lks_set_error(LKS_ENOMEM, "timing the all-reduce: out of memory");
  double t[N];
  lks_comm_where wh = {"start-up timing", -1};
  int rc = 0;
  for (int i = -2; i < N && rc == 0; i++) {
    double t0 = lks_clock();
    rc = comm->ops->allreduce_sum(comm, buf, (size_t)n, LKS_F32, wh);
    if (i >= 0) t[i] = lks_clock() - t0;
  }
  free(buf);
  if (rc < 0) return rc;
  *out = lks_median(t, N);
  return 0;
}

lks_world *lks_world_start(const lks_settings *s, const char *dir, int max_slots) {
  lks_world *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->settings = s;
  w->heartbeat_s = lks_settings_float(s, "heartbeat");
  double timeout = lks_settings_float(s, "collective-timeout");
  int dummy_argc = 0;
  char **dummy_argv = NULL;
  if (lks_mpi_init(&dummy_argc, &dummy_argv, &w->rank, &w->world) < 0) goto fail;
  // Collectives: nccl by default with the cuda backend; mpi with it stages device buffers.
  const char *backend = lks_settings_str(s, "backend"), *comm = lks_settings_str(s, "comm");
  bool cuda = strcmp(backend, "cuda") == 0;
  int gpu = (int)lks_settings_int(s, "gpu");
  if (!comm) comm = cuda ? "nccl" : "mpi";
  if (strcmp(comm, "nccl") != 0 && strcmp(comm, "mpi") != 0) {
    lks_set_error(LKS_ECONFIG, "--comm %s: expected mpi or nccl", comm);
    goto fail;
  }
  const char *kvd = lks_settings_str(s, "kv-dtype");
  lks_dtype kv_dtype;
  if (lks_model_kv_dtype_parse(kvd, &kv_dtype) < 0) goto fail;
  lks_experts_split split;
  if (lks_model_experts_split_parse(lks_settings_str(s, "experts-split"), &split) < 0) goto fail;
  if (cuda && kv_dtype != LKS_F32) {
    lks_set_error(LKS_ECONFIG, "--kv-dtype %s: the cuda backend has an f32 KV cache only", kvd);
    goto fail;
  }
  // The start-up agreement runs over plain MPI before the chosen collectives exist: ranks that
  // disagree on the backend or the collectives would otherwise meet in mismatched NCCL calls.
  if (w->world > 1) {
    lks_comm *boot = lks_comm_mpi_new(timeout);
    int arc = boot ? lks_world_agree(boot, s, dir)
                   : lks_set_error(LKS_ENOMEM, "the start-up agreement: out of memory");
    lks_comm_free(boot);
    if (arc < 0) goto fail;
  }
  if (w->world == 1)
    w->comm = lks_comm_local_new();
  else if (strcmp(comm, "nccl") == 0)
    w->comm = lks_comm_nccl_new(timeout, gpu);
  else
    w->comm = cuda ? lks_comm_mpi_cuda_new(timeout) : lks_comm_mpi_new(timeout);
  if (!w->comm) goto fail;
  if (w->world == 1 && lks_world_agree(w->comm, s, dir) < 0) goto fail;
  const lks_config *cfg;
  w->be = lks_backend_new_on(backend, (int)lks_settings_int(s, "threads"), gpu);
  if (!w->be) goto fail;
  lks_backend_cpu_host_weights(w->be, lks_settings_bool(s, "mmap") ? LKS_HOST_PACK_SLICES
                                                                 : LKS_HOST_COPY);
  double t0 = lks_clock();
  w->model = lks_model_load_shard(dir, w->be, w->comm, split, NULL, NULL);
  if (!w->model || lks_model_set_kv_dtype(w->model, kv_dtype) < 0) goto fail;
  cfg = lks_model_config(w->model);
  LKS_LOG(LKS_LOG_INFO, "loaded %s (%s) in %.2f s: %.1f MB of weights on this rank", dir,
          cfg->architecture, lks_clock() - t0, lks_model_loaded_bytes(w->model) / 1e6);
  lks_engine_opts eo = {0};
  eo.prefix_cache = lks_settings_bool(s, "prefix-cache");
  if (strcmp(lks_settings_str(s, "spec"), "dflash") == 0) {
    // Every rank loads its shard of the drafter (model/dflash.h).
    const char *dd = lks_settings_str(s, "draft-model");
    char ddir[4096];
    snprintf(ddir, sizeof ddir, "%s/dflash", dir);
    lks_dflash *d = lks_dflash_load(dd && dd[0] ? dd : ddir, w->model);
    if (!d) goto fail;
    if (lks_model_attach_dflash(w->model, d) < 0) {
      lks_dflash_free(d);
      goto fail;
    }
  }
  if (kv_blocks(w, s, max_slots, &eo.n_blocks) < 0) goto fail;
  w->engine = lks_engine_new(w->model, max_slots, (int)lks_settings_int(s, "max-seq-len"),
                             (int)lks_settings_int(s, "kv-block"), &eo);
  if (!w->engine) goto fail;
  if (w->world > 1 && !cuda && allreduce_time(w->comm, cfg->hidden, &w->allreduce_s) < 0)
    goto fail;
  if (w->world > 1) {
    w->ctl = lks_ctl_new(w->comm, timeout, w->heartbeat_s, lks_settings_str(s, "control-host"));
    if (!w->ctl) goto fail;
    w->comm->poll = lks_ctl_poll;
    w->comm->poll_ctx = w->ctl;
  }
  return w;
fail:
  {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lks_last_error());
    lks_world_stop(w);
    lks_set_error(LKS_ECONFIG, "%s", msg);
  }
  return NULL;
}

void lks_world_stop(lks_world *w) {
  if (!w) return;
  if (w->ctl && w->rank == 0) {
    Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
    cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_SHUTDOWN;
    if (lks_ctl_send(w->ctl, &cmd) == 0 && lks_ctl_wait_acks(w->ctl, cmd.step_id, 10) < 0)
      LKS_LOG(LKS_LOG_WARN, "shutdown: %s", lks_last_error());
  }
  lks_ctl_free(w->ctl);
  lks_engine_free(w->engine);
  lks_model_free(w->model);
  lks_backend_free(w->be);
  lks_comm_free(w->comm);
  free(w);
}
