// SPDX-License-Identifier: MIT
// `lockstep`: the one executable. Parses the subcommand and the settings, then hands over.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "worker/world.h"
#include "worker/worker.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/log.h"

#ifndef LKS_DEFAULT_MODEL
#define LKS_DEFAULT_MODEL "models/default"
#endif

static void usage(FILE *f) {
  fprintf(f,
          "usage: lockstep COMMAND [options]\n\n"
          "commands:\n"
          "  generate [--model DIR] --prompt-ids 11,42,7 [-n 32]   greedy or sampled continuation\n"
          "  generate [--model DIR] --prompt TEXT | --chat MESSAGE [--system TEXT] [--no-think]\n"
          "                                                     the same from text, printed as text\n"
          "  tokenize DIR TEXT                                  token ids of TEXT (DIR/tokenizer.json)\n"
          "  detokenize DIR 1,2,3                               text of the ids\n"
          "  inspect DIR                                        architecture, sizes, problems\n"
          "  bench [--model DIR]                                prefill/decode speed vs bandwidth\n"
          "  serve [--model DIR] [--port 8080]                  OpenAI-compatible HTTP API\n"
          "  version                                            build id and protocol version\n\n"
          "options (also LKS_<NAME> in the environment):\n");
  lks_settings_print_help(f);
  fprintf(f, "\ndefault model: %s\n", LKS_DEFAULT_MODEL);
}

const char *lks_cli_model_dir(const lks_settings *s) {
  const char *m = lks_settings_str(s, "model");
  return m ? m : LKS_DEFAULT_MODEL;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("lockstep %s (protocol %d)\n", lks_build_id(), LKS_PROTOCOL_VERSION);
    return 0;
  }
  lks_settings *s = lks_settings_new();
  if (!s) {
    fprintf(stderr, "lockstep: %s\n", lks_last_error());
    return 2;
  }
  const char *pos[4];
  int n_pos = 0, rc = 2;
  if (lks_settings_parse_args(s, argc - 2, argv + 2, pos, 4, &n_pos) < 0) {
    fprintf(stderr, "lockstep %s: %s\n", cmd, lks_last_error());
    goto done;
  }
  if (lks_settings_bool(s, "help")) {
    usage(stdout);
    rc = 0;
    goto done;
  }
  int level = lks_log_parse_level(lks_settings_str(s, "log-level"));
  if (level < 0) {
    fprintf(stderr, "lockstep: --log-level must be error, warn, info or debug\n");
    goto done;
  }
  lks_log_set_level((lks_log_level)level);
  lks_settings_log(s);
  if (!strcmp(cmd, "generate") && n_pos == 0) {
    rc = lks_cmd_generate(s);
  } else if (!strcmp(cmd, "inspect") && n_pos <= 1) {
    rc = lks_cmd_inspect(s, n_pos ? pos[0] : lks_cli_model_dir(s));
  } else if (!strcmp(cmd, "tokenize") && n_pos == 2) {
    rc = lks_cmd_tokenize(s, pos[0], pos[1]);
  } else if (!strcmp(cmd, "detokenize") && n_pos == 2) {
    rc = lks_cmd_detokenize(s, pos[0], pos[1]);
  } else if (!strcmp(cmd, "serve") && n_pos == 0) {
    rc = lks_cmd_serve(s);
  } else if (!strcmp(cmd, "bench") && n_pos == 0) {
    rc = lks_cmd_bench(s);
  } else {
    fprintf(stderr, "lockstep: unknown command or extra arguments: %s\n\n", cmd);
    usage(stderr);
  }
done:
  lks_settings_free(s);
  // A rank that fails under mpirun ends the job, so that no rank waits on it.
  if (rc != 0) lks_mpi_abort(rc);
  lks_mpi_finalize();
  return rc;
}
