// SPDX-License-Identifier: MIT
// The `lockstep` command line: subcommands share the settings table (core/settings.c) and the
// helpers here. Each subcommand returns the process exit status.
#ifndef LKS_CLI_H
#define LKS_CLI_H

#include <stdint.h>

#include "core/backend.h"
#include "core/settings.h"
#include "model/model.h"

int lks_cmd_generate(lks_settings *s);
int lks_cmd_inspect(lks_settings *s, const char *dir);
int lks_cmd_bench(lks_settings *s);
int lks_cmd_serve(lks_settings *s);
int lks_cmd_tokenize(lks_settings *s, const char *dir, const char *text);
int lks_cmd_detokenize(lks_settings *s, const char *dir, const char *ids);

// The model directory: --model, else the default model this build ships with.
const char *lks_cli_model_dir(const lks_settings *s);
// Parses "11,42,7" into ids (allocated; caller frees), each checked against [0, vocab).
int lks_cli_parse_ids(const char *text, int vocab, int32_t **ids, int *n);
double lks_now(void);

struct lks_world;
// A worker rank's whole part in a command: run the command loop until shutdown, then stop the
// world. Returns the exit status.
int lks_cli_worker(struct lks_world *w);

#endif
