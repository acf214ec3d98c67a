// SPDX-License-Identifier: MIT
// Streaming and whole-sequence decoding (see detok.h).
#include "text/detok.h"

#include <stdlib.h>

#include "core/error.h"
#include "text/buf.h"
#include "text/utf8.h"

struct lks_detok {
  const lks_tokenizer *t;
  bool skip_special;
  int32_t *keep;  // special ids printed anyway (lks_detok_keep), n_keep of them
  int n_keep;
  lks__utf8_state st;
  lks__buf out;
};

lks_detok *lks_detok_new(const lks_tokenizer *t, bool skip_special) {
  lks_detok *d = calloc(1, sizeof *d);
  if (!d) {
    lks_set_error(LKS_ENOMEM, "out of memory");
    return NULL;
  }
  d->t = t;
  d->skip_special = skip_special;
  lks__utf8_reset(&d->st);
  return d;
}

void lks_detok_free(lks_detok *d) {
  if (!d) return;
  free(d->out.p);
  free(d->keep);
  free(d);
}

int lks_detok_keep(lks_detok *d, const char *const *texts, int n) {
  int32_t *k = realloc(d->keep, (size_t)(d->n_keep + n + 1) * sizeof *k);
  if (!k) return lks_set_error(LKS_ENOMEM, "out of memory");
  d->keep = k;
  for (int i = 0; i < n; i++) {
    int id = lks_tokenizer_token_id(d->t, texts[i]);
    if (id >= 0 && lks_tokenizer_is_special(d->t, id)) d->keep[d->n_keep++] = id;
  }
  return 0;
}

static bool kept(const lks_detok *d, int32_t id) {
  for (int i = 0; i < d->n_keep; i++)
    if (d->keep[i] == id) return true;
  return false;
}

// Appends the text of one id to d->out.
static int detok_one(lks_detok *d, int32_t id) {
  const lks_tokenizer *t = d->t;
  if (id < 0 || id >= t->n_ids || !(t->flags[id] & (LKS__F_VOCAB | LKS__F_ADDED)))
    return lks_set_error(LKS_ERANGE, "token id %d is not in the vocabulary of %s", (int)id, t->what);
  uint8_t f = t->flags[id];
  if ((f & LKS__F_SPECIAL) && d->skip_special && !kept(d, id)) return 0;
  const unsigned char *p = (const unsigned char *)t->arena + t->off[id];
  size_t n = t->len[id];
  if (f & LKS__F_ADDED) {
    // Added tokens are text of their own: what is held before them is decoded on its own.
    lks__utf8_finish(&d->st, &d->out);
    lks__buf_put(&d->out, p, n);
  } else {
    for (size_t i = 0; i < n; i++) lks__utf8_feed(&d->st, p[i], &d->out);
  }
  return d->out.oom ? lks_set_error(LKS_ENOMEM, "out of memory") : 0;
}

int lks_detok_push(lks_detok *d, int32_t id, const char **out, size_t *len) {
  d->out.n = 0;
  int rc = detok_one(d, id);
  *out = d->out.p ? d->out.p : "";
  *len = rc < 0 ? 0 : d->out.n;
  return rc;
}

int lks_detok_flush(lks_detok *d, const char **out, size_t *len) {
  d->out.n = 0;
  lks__utf8_finish(&d->st, &d->out);
  *out = d->out.p ? d->out.p : "";
  *len = d->out.n;
  return d->out.oom ? lks_set_error(LKS_ENOMEM, "out of memory") : 0;
}

int lks__detok_decode(const lks_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                      char **text, size_t *len) {
  lks_detok d = {.t = t, .skip_special = skip_special};
  lks__utf8_reset(&d.st);
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) rc = detok_one(&d, ids[i]);
  if (rc == 0) lks__utf8_finish(&d.st, &d.out);
  if (rc == 0 && !d.out.p) d.out.p = calloc(1, 1);
  if (rc == 0 && (d.out.oom || !d.out.p)) rc = lks_set_error(LKS_ENOMEM, "out of memory");
  if (rc < 0) {
    free(d.out.p);
    return rc;
  }
  *text = d.out.p;
  if (len) *len = d.out.n;
  return 0;
}

const char *lks_tokenizer_token_bytes(const lks_tokenizer *t, int id, size_t *len) {
  *len = 0;
  if (id < 0 || id >= t->n_ids || !(t->flags[id] & (LKS__F_VOCAB | LKS__F_ADDED))) return NULL;
  *len = t->len[id];
  return t->arena + t->off[id];
}
