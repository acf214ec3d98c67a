// SPDX-License-Identifier: MIT
// Loading a tokenizer from Hugging Face's files: tokenizer.json (model, added tokens,
// normalizer, pre-tokenizer, decoder, post-processor; what is supported and what is refused is
// listed in tokenizer.h) validated field by field, and the chat_template of
// tokenizer_config.json. Every refusal names the file and the JSON path of the problem.
#ifndef LKS_TEXT_TOKENIZER_JSON_H
#define LKS_TEXT_TOKENIZER_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "text/tokenizer_impl.h"

// Fills t (zeroed but for `what`, unk_id = -1 and initialised tries) from tokenizer.json text
// (`len` bytes). Returns 0, or a negative LKS_E* code with lks_last_error() naming the problem;
// on error t holds partial tables that lks_tokenizer_free() releases.
int lks__tokenizer_json_parse(lks_tokenizer *t, const char *text, size_t len);

// Reads the tokenizer_config.json beside the tokenizer.json `file`, when there is one, and
// keeps its chat_template in t. A missing file is fine; an unreadable or malformed one is an
// error.
int lks__tokenizer_json_config(lks_tokenizer *t, const char *file);

// The whole of file `path`, malloc'd and NUL-terminated (*len bytes); NULL with
// lks_last_error() set, or silently when missing_ok and the file does not exist.
char *lks__tokenizer_json_read(const char *path, size_t *len, bool missing_ok);

#endif
