// SPDX-License-Identifier: MIT
// The prompt and the printing of `lockstep generate` (see text.h).
#include "cli/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/error.h"
#include "core/log.h"
#include "text/chat.h"
#include "text/tokenizer.h"

struct lks_cli_text {
  lks_tokenizer *tok;
  lks_detok *detok;
  int n_textless;  // generated ids beyond the tokenizer (a padded model vocabulary)
};

void lks_cli_text_free(lks_cli_text *t) {
  if (!t) return;
  lks_detok_free(t->detok);
  lks_tokenizer_free(t->tok);
  free(t);
}

int lks_cli_prompt(lks_settings *s, const lks_config *c, lks_cli_text **out, int32_t **ids, int *n) {
  const char *ids_text = lks_settings_str(s, "prompt-ids"), *text = lks_settings_str(s, "prompt"),
             *chat = lks_settings_str(s, "chat");
  *out = NULL;
  *ids = NULL;
  *n = 0;
  if ((ids_text != NULL) + (text != NULL) + (chat != NULL) != 1) {
    fprintf(stderr, "lockstep generate: give exactly one of --prompt-ids, --prompt, --chat\n");
    return 2;
  }
  if ((lks_settings_str(s, "system") || lks_settings_bool(s, "no-think")) && !chat) {
    fprintf(stderr, "lockstep generate: --system and --no-think go with --chat\n");
    return 2;
  }
  if (ids_text) {
    if (lks_cli_parse_ids(ids_text, c->vocab, ids, n) < 0) {
      fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
      return 2;
    }
    return 0;
  }
  const char *dir = lks_cli_model_dir(s);
  lks_cli_text *t = calloc(1, sizeof *t);
  if (!t) {
    fprintf(stderr, "lockstep generate: out of memory\n");
    return 1;
  }
  t->tok = lks_tokenizer_load(dir);
  if (!t->tok) {
    fprintf(stderr, "lockstep generate: text prompts need the model's tokenizer: %s\n", lks_last_error());
    lks_cli_text_free(t);
    return 1;
  }
  char *rendered = NULL;
  size_t len = 0;
  if (chat) {
    const char *tmpl = lks_tokenizer_chat_template(t->tok);
    if (tmpl && (!strstr(tmpl, "<|assistant|>") || !strstr(tmpl, "[gMASK]")))
      LKS_LOG(LKS_LOG_WARN, "%s: tokenizer_config.json's chat_template is not GLM's; rendering GLM's", dir);
    if (lks_chat_prompt(lks_settings_str(s, "system"), chat, lks_settings_bool(s, "no-think"),
                        &rendered, &len) < 0) {
      fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
      lks_cli_text_free(t);
      return 2;
    }
    text = rendered;
  } else {
    len = strlen(text);
  }
  // A chat prompt carries its own special tokens; a plain one gets the post-processor's (BOS).
  int rc = lks_tokenizer_encode(t->tok, text, len, chat == NULL, ids, n);
  free(rendered);
  if (rc == 0 && !(t->detok = lks_detok_new(t->tok, false))) rc = LKS_ENOMEM;
  if (rc < 0) {
    fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
    lks_cli_text_free(t);
    return 1;
  }
  for (int i = 0; i < *n; i++)
    if ((*ids)[i] >= c->vocab) {
      fprintf(stderr, "lockstep generate: the tokenizer's id %d is outside the model's vocabulary [0, %d)\n",
              (int)(*ids)[i], c->vocab);
      lks_cli_text_free(t);
      return 1;
    }
  if (*n == 0) {
    fprintf(stderr, "lockstep generate: the prompt is empty\n");
    lks_cli_text_free(t);
    return 2;
  }
  LKS_LOG(LKS_LOG_INFO, "prompt: %d tokens%s", *n, chat ? " (GLM chat template)" : "");
  *out = t;
  return 0;
}

int lks_cli_print_token(lks_cli_text *t, int32_t tok, int index, bool stop) {
  if (!t) {
    printf("%s%d", index ? "," : "", (int)tok);
  } else if (!stop) {
    const char *piece;
    size_t len;
    if (tok >= lks_tokenizer_n_ids(t->tok) || lks_detok_push(t->detok, tok, &piece, &len) < 0) {
      // A model's vocabulary may be padded past its tokenizer: such ids have no text.
      if (t->n_textless++ == 0)
        LKS_LOG(LKS_LOG_WARN, "token id %d has no text in the tokenizer; it prints as nothing", (int)tok);
    } else {
      fwrite(piece, 1, len, stdout);
    }
  }
  fflush(stdout);
  return 0;
}

int lks_cli_print_end(lks_cli_text *t) {
  if (t) {
    const char *piece;
    size_t len;
    LKS_TRY(lks_detok_flush(t->detok, &piece, &len));
    fwrite(piece, 1, len, stdout);
    if (t->n_textless) LKS_LOG(LKS_LOG_WARN, "%d generated ids had no text in the tokenizer", t->n_textless);
  }
  printf("\n");
  fflush(stdout);
  return 0;
}
