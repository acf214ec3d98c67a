// SPDX-License-Identifier: MIT
// `lockstep serve`: the HTTP API on rank 0, continuous batching over --max-slots slots; under
// mpirun the other ranks execute the commands as workers. Ends on /admin/shutdown or SIGTERM /
// SIGINT (draining: running requests finish, new ones get 503; a second signal stops at once),
// with status 0; when a rank fails, in-flight requests end with an error, /health turns 503,
// and the process exits non-zero so that a launcher restarts the job.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "coordinator/http.h"
#include "coordinator/scheduler.h"
#include "worker/world.h"
#include "core/error.h"
#include "core/log.h"

static volatile sig_atomic_t signals;
static void on_signal(int sig) {
  (void)sig;
  if (++signals >= 2) _exit(130);  // the second signal: stop at once
}

typedef struct {
  lks_sched *sched;
  lks_http *http;
  volatile bool done;
} watch;

// Turns a signal or /admin/shutdown into a drain of the scheduler (signal handlers may not lock).
static void *watcher(void *arg) {
  watch *wt = arg;
  while (!wt->done) {
    if (signals || lks_http_shutdown_requested(wt->http)) {
      if (signals) LKS_LOG(LKS_LOG_INFO, "signal: draining (a second signal stops at once)");
      lks_sched_stop(wt->sched, true);
      return NULL;
    }
    usleep(50000);
  }
  return NULL;
}

static const char *base_name(const char *dir, char *buf, size_t n) {
  snprintf(buf, n, "%s", dir);
  size_t l = strlen(buf);
  while (l > 1 && buf[l - 1] == '/') buf[--l] = '\0';
  const char *b = strrchr(buf, '/');
  return b ? b + 1 : buf;
}

int lks_cmd_serve(lks_settings *s) {
  const char *dir = lks_cli_model_dir(s);
  lks_world *w = lks_world_start(s, dir, (int)lks_settings_int(s, "max-slots"));
  if (!w) {
    fprintf(stderr, "lockstep serve: %s\n", lks_last_error());
    return 1;
  }
  if (w->rank != 0) return lks_cli_worker(w);
  int rc = 1;
  lks_tokenizer *tok = lks_tokenizer_load(dir);
  if (!tok) LKS_LOG(LKS_LOG_WARN, "no tokenizer (%s): only token-id prompts", lks_last_error());
  lks_sched_opts o;
  lks_sched_opts_from(s, &o);
  lks_sched *sched = lks_sched_new(w, tok, &o);
  // The policy's step costs before the port opens, so that the first requests do not pay for
  // exploring them.
  double t_cal;
  if (sched && lks_sched_calibrate(sched, &t_cal) < 0) {
    fprintf(stderr, "lockstep serve: %s\n", lks_last_error());
    lks_sched_free(sched);
    sched = NULL;
  }
  char name[512];
  lks_http *http = sched ? lks_http_start(s, sched, w, tok, base_name(dir, name, sizeof name)) : NULL;
  if (!http) {
    fprintf(stderr, "lockstep serve: %s\n", lks_last_error());
    goto done;
  }
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  watch wt = {sched, http, false};
  pthread_t th;
  pthread_create(&th, NULL, watcher, &wt);
  int run = lks_sched_run(sched);
  wt.done = true;
  pthread_join(th, NULL);
  if (run < 0) {
    fprintf(stderr, "lockstep serve: %s\n", lks_last_error());
    sleep(1);  // let open streams deliver their error event
  } else {
    LKS_LOG(LKS_LOG_INFO, "drained: every running request finished; stopping");
    rc = 0;
  }
done:
  lks_http_stop(http);
  lks_sched_free(sched);
  lks_tokenizer_free(tok);
  if (rc == 0) lks_world_stop(w);  // after a failure the world cannot shut down in order
  return rc;
}
