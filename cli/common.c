// SPDX-License-Identifier: MIT
// Helpers the subcommands share (see cli.h); main.c keeps the dispatch and the default model.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/clock.h"
#include "worker/world.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/worker.h"

int lks_cli_worker(lks_world *w) {
  int rc = lks_worker_run(w);
  if (rc < 0) LKS_LOG(LKS_LOG_ERROR, "worker: %s", lks_last_error());
  lks_world_stop(w);
  return rc < 0 ? 1 : 0;
}

double lks_now(void) { return lks_clock(); }

int lks_cli_parse_ids(const char *text, int vocab, int32_t **ids, int *n) {
  *n = 0;
  *ids = NULL;
  int cap = 1;
  for (const char *p = text; *p; p++) cap += *p == ',';
  int32_t *out = malloc((size_t)cap * sizeof *out);
  if (!out) return lks_set_error(LKS_ENOMEM, "out of memory");
  const char *p = text;
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || (*end && *end != ',')) {
      free(out);
      return lks_set_error(LKS_EINVAL, "--prompt-ids: '%s' is not a comma-separated list of integers", text);
    }
    if (v < 0 || v >= vocab) {
      free(out);
      return lks_set_error(LKS_ERANGE, "--prompt-ids: token id %ld outside the vocabulary [0, %d)", v, vocab);
    }
    out[(*n)++] = (int32_t)v;
    p = *end ? end + 1 : end;
  }
  if (*n == 0) {
    free(out);
    return lks_set_error(LKS_EINVAL, "--prompt-ids is empty");
  }
  *ids = out;
  return 0;
}

