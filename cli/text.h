// SPDX-License-Identifier: MIT
// Text in, text out for `lockstep generate`: the prompt from --prompt-ids, --prompt TEXT or
// --chat MESSAGE (GLM's chat template, with --system and --no-think), tokenized with the model
// directory's tokenizer.json; and the continuation printed as ids, or as text streamed while it
// is generated (a character split across tokens appears once it is whole). Main thread only.
#ifndef LKS_CLI_TEXT_H
#define LKS_CLI_TEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/settings.h"
#include "model/config.h"

typedef struct lks_cli_text lks_cli_text;

// The prompt ids (*ids malloc'd, *n of them; the caller frees). *out is NULL for --prompt-ids
// (the continuation prints as ids), else the text printer. Prints the problem itself and
// returns 0, 2 (bad input: no prompt, two prompts, ...) or 1 (no tokenizer, ...).
int lks_cli_prompt(lks_settings *s, const lks_config *c, lks_cli_text **out, int32_t **ids, int *n);
// Prints the generated token number `index`: its id (comma-separated) when out is NULL, else its
// text once complete. `stop`: the token ends the generation (a stop id), and prints no text.
int lks_cli_print_token(lks_cli_text *out, int32_t tok, int index, bool stop);
// Prints what is still held and ends the line.
int lks_cli_print_end(lks_cli_text *out);
void lks_cli_text_free(lks_cli_text *out);

#endif
