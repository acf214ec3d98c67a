// SPDX-License-Identifier: MIT
// `lockstep tokenize DIR TEXT` and `lockstep detokenize DIR 1,2,3`: the tokenizer of DIR (a
// directory with tokenizer.json, or the file itself) on the command line, for inspection.
// tokenize prints the ids comma-separated (the format of --prompt-ids); detokenize prints the
// text. Neither adds special tokens: what you type is what is encoded.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/error.h"
#include "text/tokenizer.h"

int lks_cmd_tokenize(lks_settings *s, const char *dir, const char *text) {
  (void)s;
  lks_tokenizer *t = lks_tokenizer_load(dir);
  if (!t) {
    fprintf(stderr, "lockstep tokenize: %s\n", lks_last_error());
    return 1;
  }
  int32_t *ids;
  int n;
  int rc = lks_tokenizer_encode(t, text, strlen(text), false, &ids, &n);
  if (rc < 0) {
    fprintf(stderr, "lockstep tokenize: %s\n", lks_last_error());
  } else {
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", (int)ids[i]);
    printf("\n");
    free(ids);
  }
  lks_tokenizer_free(t);
  return rc < 0 ? 1 : 0;
}

int lks_cmd_detokenize(lks_settings *s, const char *dir, const char *ids_text) {
  (void)s;
  lks_tokenizer *t = lks_tokenizer_load(dir);
  if (!t) {
    fprintf(stderr, "lockstep detokenize: %s\n", lks_last_error());
    return 1;
  }
  int32_t *ids = NULL;
  int n = 0, rc = 2;
  char *text = NULL;
  size_t len = 0;
  if (lks_cli_parse_ids(ids_text, lks_tokenizer_n_ids(t), &ids, &n) < 0) {
    fprintf(stderr, "lockstep detokenize: %s\n", lks_last_error());
  } else if (lks_tokenizer_decode(t, ids, n, false, &text, &len) < 0) {
    fprintf(stderr, "lockstep detokenize: %s\n", lks_last_error());
    rc = 1;
  } else {
    fwrite(text, 1, len, stdout);
    printf("\n");
    rc = 0;
  }
  free(text);
  free(ids);
  lks_tokenizer_free(t);
  return rc;
}
