// SPDX-License-Identifier: MIT
// tokenizer.json loading, encoding and decoding for byte-level BPE (see tokenizer.h): the public
// entry points. The work is done by the modules beside this file:
//   utf8.c            UTF-8 (the WHATWG decoder, validation, JavaScript whitespace), byte map
//   regex.c           tokenizer.json's Oniguruma regexes -> PCRE2
//   tokenizer_json.c  tokenizer.json and tokenizer_config.json -> the tables
//   vocab.c           the tables: token bytes, vocabulary map, merges, added-token tries
//   normalize.c       the normalizer steps
//   bpe.c             encoding: added tokens, pre-tokenizers, BPE
//   detok.c           decoding and streaming decoding
// The tokenizer's inside is in tokenizer_impl.h.
#include "text/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "text/bpe.h"
#include "text/buf.h"
#include "text/detok.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_json.h"
#include "text/utf8.h"
#include "text/vocab.h"

lks_tokenizer *lks_tokenizer_parse(const char *text, size_t len, const char *what) {
  lks__utf8_byte_map_init();
  lks_tokenizer *t = calloc(1, sizeof *t);
  if (!t || !(t->what = strdup(what))) {
    lks_set_error(LKS_ENOMEM, "out of memory");
    lks_tokenizer_free(t);
    return NULL;
  }
  t->unk_id = -1;
  lks__vocab_trie_init(&t->raw_trie);
  lks__vocab_trie_init(&t->norm_trie);
  if (lks__tokenizer_json_parse(t, text, len) < 0) {
    lks_tokenizer_free(t);
    return NULL;
  }
  return t;
}

lks_tokenizer *lks_tokenizer_load(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    lks_set_error(LKS_ENOTFOUND, "%s: %s", path, strerror(errno));
    return NULL;
  }
  char file[4096];
  bool dir = S_ISDIR(st.st_mode);
  snprintf(file, sizeof file, dir ? "%s/tokenizer.json" : "%s", path);
  size_t len;
  char *text = lks__tokenizer_json_read(file, &len, false);
  if (!text) return NULL;
  lks_tokenizer *t = lks_tokenizer_parse(text, len, file);
  free(text);
  if (!t) return NULL;
  if (lks__tokenizer_json_config(t, file) < 0) {
    lks_tokenizer_free(t);
    return NULL;
  }
  return t;
}

void lks_tokenizer_free(lks_tokenizer *t) {
  if (!t) return;
  free(t->what);
  free(t->off);
  free(t->len);
  free(t->flags);
  free(t->arena);
  free(t->vocab.slot);
  free(t->merges);
  free(t->odd_ids);
  for (int i = 0; i < t->n_added; i++) {
    free(t->added[i].content);
    free(t->added[i].norm);
  }
  free(t->added);
  free(t->raw_trie.n);
  free(t->norm_trie.n);
  for (int i = 0; i < t->n_norm; i++) {
    pcre2_code_free(t->norm[i].re);
    free(t->norm[i].text);
  }
  free(t->norm);
  for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
  free(t->pre);
  free(t->tmpl);
  free(t->chat_template);
  free(t);
}

int lks_tokenizer_n_ids(const lks_tokenizer *t) { return t->n_ids; }

int lks_tokenizer_token_id(const lks_tokenizer *t, const char *s) {
  size_t n = strlen(s);
  for (int i = 0; i < t->n_added; i++)
    if (t->added[i].len == n && !memcmp(t->added[i].content, s, n)) return t->added[i].id;
  lks__buf b = {0};
  int id = -1;
  if (lks__utf8_from_bytelevel(s, n, &b) && !b.oom) id = lks__vocab_get(t, b.p ? b.p : "", b.n);
  free(b.p);
  if (id >= 0) return id;
  for (int i = 0; i < t->n_odd; i++) {
    int o = t->odd_ids[i];
    if (t->len[o] == n && !memcmp(t->arena + t->off[o], s, n)) return o;
  }
  return -1;
}

const char *lks_tokenizer_id_bytes(const lks_tokenizer *t, int id, size_t *len) {
  *len = 0;
  if (id < 0 || id >= t->n_ids || !(t->flags[id] & (LKS__F_VOCAB | LKS__F_ADDED))) return NULL;
  *len = t->len[id];
  return t->arena + t->off[id];
}

bool lks_tokenizer_is_special(const lks_tokenizer *t, int id) {
  return id >= 0 && id < t->n_ids && (t->flags[id] & LKS__F_SPECIAL);
}

const char *lks_tokenizer_chat_template(const lks_tokenizer *t) { return t->chat_template; }

int lks_tokenizer_encode(const lks_tokenizer *t, const char *text, size_t len, bool add_special,
                         int32_t **ids, int *n) {
  return lks__bpe_encode(t, text, len, add_special, ids, n);
}

int lks_tokenizer_decode(const lks_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                         char **text, size_t *len) {
  return lks__detok_decode(t, ids, n, skip_special, text, len);
}
