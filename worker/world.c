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
#include "model/safetensors.h"

#ifndef LKS_BUILD_ID
#define LKS_BUILD_ID "unknown"
#endif

const char *lks_build_id(void) { return LKS_BUILD_ID; }

// ---- fingerprint ----

enum { FP_FIELDS = 11, FP_NAME = 24, FP_VALUE = 104 };
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

// ---- start and stop ----

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
  if (w->world == 1)
    w->comm = lks_comm_local_new();
  else if (strcmp(comm, "nccl") == 0)
    w->comm = lks_comm_nccl_new(timeout, gpu);
  else
    w->comm = cuda ? lks_comm_mpi_cuda_new(timeout) : lks_comm_mpi_new(timeout);
  if (!w->comm) goto fail;
  if (lks_world_agree(w->comm, s, dir) < 0) goto fail;
  const lks_config *cfg;
  w->be = lks_backend_new_on(backend, (int)lks_settings_int(s, "threads"), gpu);
  if (!w->be) goto fail;
  double t0 = lks_clock();
  w->model = lks_model_load_shard(dir, w->be, w->comm, NULL, NULL);
  if (!w->model) goto fail;
  cfg = lks_model_config(w->model);
  LKS_LOG(LKS_LOG_INFO, "loaded %s (%s) in %.2f s: %.1f MB of weights on this rank", dir,
          cfg->architecture, lks_clock() - t0, lks_model_loaded_bytes(w->model) / 1e6);
  w->engine = lks_engine_new(w->model, max_slots, (int)lks_settings_int(s, "max-seq-len"),
                             (int)lks_settings_int(s, "kv-block"));
  if (!w->engine) goto fail;
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
