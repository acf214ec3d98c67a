// SPDX-License-Identifier: MIT
// Normalizer steps (see normalize.h).
#include "text/normalize.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "text/buf.h"
#include "text/utf8.h"

// Applies pcre2 replace-all (JavaScript replaceAll semantics: empty matches too).
static int replace_all(const lks_tokenizer *t, pcre2_code *re, const char *s, size_t n,
                       const char *with, size_t wl, lks__buf *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  if (!md) return lks_set_error(LKS_ENOMEM, "out of memory");
  size_t prev = 0, from = 0;
  while (from <= n) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc < 0) break;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    lks__buf_put(out, s + prev, ov[0] - prev);
    lks__buf_put(out, with, wl);
    prev = ov[1];
    from = ov[1] > ov[0] ? ov[1] : ov[1] + (ov[1] < n ? (size_t)lks__utf8_len((unsigned char)s[ov[1]]) : 1);
  }
  lks__buf_put(out, s + prev, n - prev);
  pcre2_match_data_free(md);
  (void)t;
  return out->oom ? lks_set_error(LKS_ENOMEM, "out of memory") : 0;
}

// Runs the normalizers over s[0..n): a malloc'd result in *out (NUL-terminated).
int lks__normalize(const lks_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n) {
  char *cur = malloc(n + 1);
  if (!cur) return lks_set_error(LKS_ENOMEM, "out of memory");
  memcpy(cur, s, n);
  cur[n] = '\0';
  size_t cn = n;
  for (int k = 0; k < t->n_norm; k++) {
    const lks__norm_step *st = &t->norm[k];
    lks__buf o = {0};
    switch (st->kind) {
      case LKS__NORM_NFC:
      case LKS__NORM_NFD:
      case LKS__NORM_NFKC:
      case LKS__NORM_NFKD: {
        // Nothing below U+0300 changes under any of the four forms except by compatibility
        // (NFKC/NFKD), so ASCII-and-Latin-1 text skips the library for NFC/NFD.
        bool quick = st->kind == LKS__NORM_NFC || st->kind == LKS__NORM_NFD;
        bool low = true;
        for (size_t i = 0; i < cn && low; i++) low = (unsigned char)cur[i] < 0xCC;
        if (quick && low) continue;
        utf8proc_option_t opt = UTF8PROC_STABLE;
        if (st->kind == LKS__NORM_NFC || st->kind == LKS__NORM_NFKC) opt |= UTF8PROC_COMPOSE;
        else opt |= UTF8PROC_DECOMPOSE;
        if (st->kind == LKS__NORM_NFKC || st->kind == LKS__NORM_NFKD) opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t rl = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)cn, &res, opt);
        if (rl < 0) {
          free(cur);
          return lks_set_error(LKS_EINVAL, "%s: normalizer: %s", t->what, utf8proc_errmsg(rl));
        }
        free(cur);
        cur = (char *)res;
        cn = (size_t)rl;
        continue;
      }
      case LKS__NORM_REPLACE:
        if (replace_all(t, st->re, cur, cn, st->text, st->text_len, &o) < 0) {
          free(o.p);
          free(cur);
          return LKS_ENOMEM;
        }
        break;
      case LKS__NORM_PREPEND:
        lks__buf_put(&o, st->text, st->text_len);
        lks__buf_put(&o, cur, cn);
        break;
    }
    if (o.oom) {
      free(o.p);
      free(cur);
      return lks_set_error(LKS_ENOMEM, "out of memory");
    }
    free(cur);
    cur = o.p ? o.p : calloc(1, 1);
    cn = o.n;
    if (!cur) return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  *out = cur;
  *out_n = cn;
  return 0;
}
