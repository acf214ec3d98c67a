// SPDX-License-Identifier: MIT
// tokenizer.json and tokenizer_config.json into a tokenizer's tables (see tokenizer_json.h).
// Byte-level strings ("Ġthe") are turned into their bytes here, once; merges become a hash of id
// pairs; regexes go through the Oniguruma -> PCRE2 translation of regex.c and are JIT-compiled
// when the JIT is available.
#include "text/tokenizer_json.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "text/buf.h"
#include "text/normalize.h"
#include "text/regex.h"
#include "text/utf8.h"
#include "text/vocab.h"

// Compiles a pattern object {"Regex": ...} or {"String": ...} at `path`.
static int compile_pattern(const lks_tokenizer *t, json_t *pat, const char *path, pcre2_code **re) {
  if (!json_is_object(pat))
    return lks_set_error(LKS_EFORMAT, "%s: %s must be an object {\"Regex\": ...} or {\"String\": ...}",
                         t->what, path);
  json_t *rx = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
  char err[200] = "";
  if (str) {
    if (!json_is_string(str))
      return lks_set_error(LKS_EFORMAT, "%s: %s.String must be a string", t->what, path);
    *re = lks_regex_compile(json_string_value(str), json_string_length(str), PCRE2_LITERAL, err,
                            sizeof err);
    if (!*re) return lks_set_error(LKS_EFORMAT, "%s: %s.String: %s", t->what, path, err);
  } else if (rx) {
    if (!json_is_string(rx))
      return lks_set_error(LKS_EFORMAT, "%s: %s.Regex must be a string", t->what, path);
    char rerr[LKS_REGEX_ERRLEN];
    int rc = lks_regex_compile_hf(json_string_value(rx), json_string_length(rx), re, rerr);
    if (rc == LKS_ENOMEM) return lks_set_error(LKS_ENOMEM, "out of memory");
    if (rc < 0)
      return lks_set_error(rc, "%s: %s.Regex: invalid regex /%s/: %s", t->what, path,
                           json_string_value(rx), rerr);
  } else {
    return lks_set_error(LKS_EFORMAT, "%s: %s must hold \"Regex\" or \"String\"", t->what, path);
  }
  pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE);  // interpreted when the JIT is unavailable
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Parsing tokenizer.json

static const char *jtype(json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
  }
}

static int get_bool(const lks_tokenizer *t, json_t *o, const char *key, const char *path, bool def,
                    bool *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (!json_is_boolean(v))
    return lks_set_error(LKS_EFORMAT, "%s: %s.%s must be true or false, not %s", t->what, path, key,
                         jtype(v));
  *out = json_is_true(v);
  return 0;
}

static int get_type(const lks_tokenizer *t, json_t *o, const char *path, const char **type) {
  if (!json_is_object(o))
    return lks_set_error(LKS_EFORMAT, "%s: %s must be an object, not %s", t->what, path, jtype(o));
  json_t *ty = json_object_get(o, "type");
  if (!json_is_string(ty))
    return lks_set_error(LKS_EFORMAT, "%s: %s.type must be a string", t->what, path);
  *type = json_string_value(ty);
  return 0;
}

static int parse_model(lks_tokenizer *t, json_t *model, size_t *arena_cap) {
  if (!model || json_is_null(model))
    return lks_set_error(LKS_EFORMAT, "%s: \"model\" is missing", t->what);
  if (!json_is_object(model))
    return lks_set_error(LKS_EFORMAT, "%s: model must be an object, not %s", t->what, jtype(model));
  json_t *ty = json_object_get(model, "type");
  if (ty && !json_is_string(ty))
    return lks_set_error(LKS_EFORMAT, "%s: model.type must be a string", t->what);
  if (ty && strcmp(json_string_value(ty), "BPE") != 0)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: model.type '%s' is not supported (only BPE)",
                         t->what, json_string_value(ty));
  json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
  if (!vocab) return lks_set_error(LKS_EFORMAT, "%s: model.vocab is missing", t->what);
  if (!json_is_object(vocab))
    return lks_set_error(LKS_EFORMAT, "%s: model.vocab must be an object of token -> id, not %s",
                         t->what, jtype(vocab));
  if (!merges) return lks_set_error(LKS_EFORMAT, "%s: model.merges is missing", t->what);
  if (!json_is_array(merges))
    return lks_set_error(LKS_EFORMAT, "%s: model.merges must be an array, not %s", t->what,
                         jtype(merges));
  LKS_TRY(get_bool(t, model, "ignore_merges", "model", false, &t->ignore_merges));
  bool byte_fallback;
  LKS_TRY(get_bool(t, model, "byte_fallback", "model", false, &byte_fallback));
  if (byte_fallback)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: model.byte_fallback is not supported", t->what);
  const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int k = 0; k < 2; k++) {
    json_t *v = json_object_get(model, affix[k]);
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
      return lks_set_error(LKS_EUNSUPPORTED, "%s: model.%s is not supported", t->what, affix[k]);
  }
  json_t *dropout = json_object_get(model, "dropout");
  if (dropout && !json_is_null(dropout))
    LKS_LOG(LKS_LOG_WARN, "%s: model.dropout ignored (encoding is deterministic)", t->what);

  // Ids: every vocab value is an integer in [0, INT_MAX).
  const char *key;
  json_t *val;
  long max_id = -1;
  json_object_foreach(vocab, key, val) {
    if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT_MAX / 2)
      return lks_set_error(LKS_EFORMAT, "%s: model.vocab[\"%s\"] must be a non-negative integer id, not %s",
                           t->what, key, jtype(val));
    if (json_integer_value(val) > max_id) max_id = (long)json_integer_value(val);
  }
  if (max_id < 0) return lks_set_error(LKS_EFORMAT, "%s: model.vocab is empty", t->what);
  t->n_ids = (int)max_id + 1;
  return 0;
}

static int alloc_ids(lks_tokenizer *t, int n_ids) {
  uint32_t *off = realloc(t->off, (size_t)n_ids * sizeof *off);
  if (off) t->off = off;
  uint32_t *len = realloc(t->len, (size_t)n_ids * sizeof *len);
  if (len) t->len = len;
  uint8_t *fl = realloc(t->flags, (size_t)n_ids);
  if (fl) t->flags = fl;
  if (!off || !len || !fl) return lks_set_error(LKS_ENOMEM, "out of memory");
  return 0;
}

static int fill_vocab(lks_tokenizer *t, json_t *vocab, size_t *arena_cap) {
  LKS_TRY(alloc_ids(t, t->n_ids));
  memset(t->flags, 0, (size_t)t->n_ids);
  memset(t->len, 0, (size_t)t->n_ids * sizeof *t->len);
  const char *key;
  json_t *val;
  lks__buf b = {0};
  int n_byte = 0;
  json_object_foreach(vocab, key, val) {
    int id = (int)json_integer_value(val);
    if (t->flags[id] & LKS__F_VOCAB) {
      free(b.p);
      return lks_set_error(LKS_EFORMAT, "%s: model.vocab: id %d is given to two tokens", t->what, id);
    }
    b.n = 0;
    size_t kl = strlen(key);
    bool bl = lks__utf8_from_bytelevel(key, kl, &b);
    if (b.oom) break;
    int rc = bl ? lks__vocab_arena_add(t, arena_cap, b.p ? b.p : "", b.n, &t->off[id])
                : lks__vocab_arena_add(t, arena_cap, key, kl, &t->off[id]);
    if (rc < 0) {
      free(b.p);
      return rc;
    }
    t->len[id] = (uint32_t)(bl ? b.n : kl);
    t->flags[id] = LKS__F_VOCAB | (bl ? LKS__F_BYTELEVEL : 0);
    if (bl) n_byte++;
    else t->n_odd++;
  }
  free(b.p);
  if (b.oom) return lks_set_error(LKS_ENOMEM, "out of memory");
  if (t->n_odd) {
    t->odd_ids = malloc((size_t)t->n_odd * sizeof *t->odd_ids);
    if (!t->odd_ids) return lks_set_error(LKS_ENOMEM, "out of memory");
    int k = 0;
    for (int id = 0; id < t->n_ids; id++)
      if ((t->flags[id] & (LKS__F_VOCAB | LKS__F_BYTELEVEL)) == LKS__F_VOCAB) t->odd_ids[k++] = id;
  }
  LKS_TRY(lks__vocab_build(t, n_byte));
  for (int b2 = 0; b2 < 256; b2++) {
    char c = (char)b2;
    t->byte_id[b2] = lks__vocab_get(t, &c, 1);
  }
  return 0;
}

// A merge side ("Ġt"): its id; -2 when it is not a byte-level string (the merge can never
// apply); an error when it is not in the vocabulary.
static int merge_side(lks_tokenizer *t, const char *s, size_t n, int rank, const char *whole,
                      lks__buf *tmp, int32_t *id) {
  tmp->n = 0;
  if (!lks__utf8_from_bytelevel(s, n, tmp)) {
    *id = -2;
    return 0;
  }
  if (tmp->oom) return lks_set_error(LKS_ENOMEM, "out of memory");
  *id = lks__vocab_get(t, tmp->p ? tmp->p : "", tmp->n);
  if (*id < 0)
    return lks_set_error(LKS_EFORMAT, "%s: model.merges[%d] (%s): '%.*s' is not in the vocabulary",
                         t->what, rank, whole, (int)n, s);
  return 0;
}

static int fill_merges(lks_tokenizer *t, json_t *merges) {
  size_t n = json_array_size(merges);
  uint32_t cap = 16;
  while (cap < n * 2 + 2) cap *= 2;
  t->merges = malloc((size_t)cap * sizeof *t->merges);
  if (!t->merges) return lks_set_error(LKS_ENOMEM, "out of memory");
  memset(t->merges, 0xFF, (size_t)cap * sizeof *t->merges);
  t->merge_mask = cap - 1;
  lks__buf tmp = {0}, cat = {0};
  int rc = 0;
  for (size_t r = 0; r < n && rc == 0; r++) {
    json_t *m = json_array_get(merges, r);
    const char *a, *b;
    size_t al, bl;
    char whole[96];
    if (json_is_string(m)) {
      const char *s = json_string_value(m);
      const char *sp = strchr(s, ' ');
      snprintf(whole, sizeof whole, "\"%s\"", s);
      if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1]) {
        rc = lks_set_error(LKS_EFORMAT,
                           "%s: model.merges[%zu] = %s is not two tokens separated by one space",
                           t->what, r, whole);
        break;
      }
      a = s;
      al = (size_t)(sp - s);
      b = sp + 1;
      bl = strlen(b);
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
      a = json_string_value(json_array_get(m, 0));
      al = json_string_length(json_array_get(m, 0));
      b = json_string_value(json_array_get(m, 1));
      bl = json_string_length(json_array_get(m, 1));
      snprintf(whole, sizeof whole, "[\"%s\", \"%s\"]", a, b);
    } else {
      rc = lks_set_error(LKS_EFORMAT,
                         "%s: model.merges[%zu] must be a string \"a b\" or a pair [\"a\", \"b\"], not %s",
                         t->what, r, json_is_array(m) ? "an array of other shape" : jtype(m));
      break;
    }
    int32_t ia, ib;
    rc = merge_side(t, a, al, (int)r, whole, &tmp, &ia);
    if (rc == 0) rc = merge_side(t, b, bl, (int)r, whole, &tmp, &ib);
    if (rc < 0 || ia == -2 || ib == -2) continue;
    cat.n = 0;
    lks__buf_put(&cat, t->arena + t->off[ia], t->len[ia]);
    lks__buf_put(&cat, t->arena + t->off[ib], t->len[ib]);
    if (cat.oom) {
      rc = lks_set_error(LKS_ENOMEM, "out of memory");
      break;
    }
    int32_t im = lks__vocab_get(t, cat.p, cat.n);
    if (im < 0) {
      rc = lks_set_error(LKS_EFORMAT, "%s: model.merges[%zu] (%s): the merged token '%.*s%.*s' is not in the vocabulary",
                         t->what, r, whole, (int)al, a, (int)bl, b);
      break;
    }
    lks__vocab_merge_put(t, ia, ib, (int32_t)r, im);
  }
  free(tmp.p);
  free(cat.p);
  return rc;
}

static int parse_added(lks_tokenizer *t, json_t *arr, size_t *arena_cap) {
  if (!arr || json_is_null(arr)) return 0;
  if (!json_is_array(arr))
    return lks_set_error(LKS_EFORMAT, "%s: lks__added_tokens must be an array, not %s", t->what, jtype(arr));
  size_t n = json_array_size(arr);
  t->added = calloc(n ? n : 1, sizeof *t->added);
  if (!t->added) return lks_set_error(LKS_ENOMEM, "out of memory");
  // Grow the id space to cover every added id.
  int max_id = t->n_ids - 1;
  for (size_t i = 0; i < n; i++) {
    json_t *a = json_array_get(arr, i), *id = json_object_get(a, "id"),
           *content = json_object_get(a, "content");
    if (!json_is_object(a))
      return lks_set_error(LKS_EFORMAT, "%s: lks__added_tokens[%zu] must be an object, not %s", t->what, i,
                           jtype(a));
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT_MAX / 2)
      return lks_set_error(LKS_EFORMAT, "%s: lks__added_tokens[%zu].id must be a non-negative integer", t->what, i);
    if (!json_is_string(content) || json_string_length(content) == 0)
      return lks_set_error(LKS_EFORMAT, "%s: lks__added_tokens[%zu].content must be a non-empty string",
                           t->what, i);
    if (json_integer_value(id) > max_id) max_id = (int)json_integer_value(id);
  }
  if (max_id + 1 > t->n_ids) {
    int old = t->n_ids;
    LKS_TRY(alloc_ids(t, max_id + 1));
    memset(t->flags + old, 0, (size_t)(max_id + 1 - old));
    memset(t->len + old, 0, (size_t)(max_id + 1 - old) * sizeof *t->len);
    t->n_ids = max_id + 1;
  }
  char path[64];
  for (size_t i = 0; i < n; i++) {
    json_t *a = json_array_get(arr, i);
    lks__added_token *at = &t->added[t->n_added];
    snprintf(path, sizeof path, "lks__added_tokens[%zu]", i);
    at->id = (int32_t)json_integer_value(json_object_get(a, "id"));
    json_t *content = json_object_get(a, "content");
    at->len = json_string_length(content);
    at->content = malloc(at->len + 1);
    if (!at->content) return lks_set_error(LKS_ENOMEM, "out of memory");
    memcpy(at->content, json_string_value(content), at->len + 1);
    t->n_added++;
    LKS_TRY(get_bool(t, a, "special", path, false, &at->special));
    LKS_TRY(get_bool(t, a, "lstrip", path, false, &at->lstrip));
    LKS_TRY(get_bool(t, a, "rstrip", path, false, &at->rstrip));
    LKS_TRY(get_bool(t, a, "normalized", path, !at->special, &at->normalized));
    bool single_word;
    LKS_TRY(get_bool(t, a, "single_word", path, false, &single_word));
    if (single_word)
      LKS_LOG(LKS_LOG_DEBUG, "%s: %s.single_word is ignored, as by the reference", t->what, path);
    uint32_t off;
    LKS_TRY(lks__vocab_arena_add(t, arena_cap, at->content, at->len, &off));
    t->off[at->id] = off;
    t->len[at->id] = (uint32_t)at->len;
    t->flags[at->id] = (uint8_t)((t->flags[at->id] & ~LKS__F_BYTELEVEL) | LKS__F_ADDED | (at->special ? LKS__F_SPECIAL : 0));
  }
  return 0;
}

static int parse_normalizer(lks_tokenizer *t, json_t *n, const char *path) {
  if (!n || json_is_null(n)) return 0;
  const char *type;
  LKS_TRY(get_type(t, n, path, &type));
  if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(n, "normalizers");
    if (!json_is_array(list))
      return lks_set_error(LKS_EFORMAT, "%s: %s.normalizers must be an array", t->what, path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[256];
      snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
      LKS_TRY(parse_normalizer(t, json_array_get(list, i), sub));
    }
    return 0;
  }
  lks__norm_step st = {0};
  if (!strcmp(type, "NFC")) st.kind = LKS__NORM_NFC;
  else if (!strcmp(type, "NFD")) st.kind = LKS__NORM_NFD;
  else if (!strcmp(type, "NFKC")) st.kind = LKS__NORM_NFKC;
  else if (!strcmp(type, "NFKD")) st.kind = LKS__NORM_NFKD;
  else if (!strcmp(type, "Replace") || !strcmp(type, "Prepend")) {
    bool rep = type[0] == 'R';
    json_t *txt = json_object_get(n, rep ? "content" : "prepend");
    if (!json_is_string(txt))
      return lks_set_error(LKS_EFORMAT, "%s: %s.%s must be a string", t->what, path,
                           rep ? "content" : "prepend");
    st.kind = rep ? LKS__NORM_REPLACE : LKS__NORM_PREPEND;
    if (rep) {
      char sub[256];
      snprintf(sub, sizeof sub, "%s.pattern", path);
      LKS_TRY(compile_pattern(t, json_object_get(n, "pattern"), sub, &st.re));
    }
    st.text_len = json_string_length(txt);
    st.text = malloc(st.text_len + 1);
    if (!st.text) {
      pcre2_code_free(st.re);
      return lks_set_error(LKS_ENOMEM, "out of memory");
    }
    memcpy(st.text, json_string_value(txt), st.text_len + 1);
  } else {
    return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: normalizer '%s' is not supported", t->what, path,
                         type);
  }
  lks__norm_step *p = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *p);
  if (!p) {
    pcre2_code_free(st.re);
    free(st.text);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  t->norm = p;
  t->norm[t->n_norm++] = st;
  return 0;
}

// GPT-2's pattern, which ByteLevel applies with use_regex; the reference runs it as a JavaScript
// literal, so its \s is JavaScript's.
#define JS_SPACE "\\t\\n\\x{B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" JS_SPACE "\\p{L}\\p{N}]+|[" JS_SPACE
    "]+(?![^" JS_SPACE "])|[" JS_SPACE "]+";

static int parse_pre(lks_tokenizer *t, json_t *p, const char *path) {
  if (!p || json_is_null(p)) return 0;
  const char *type;
  LKS_TRY(get_type(t, p, path, &type));
  if (t->n_pre && t->pre[t->n_pre - 1].kind == LKS__PRE_BYTELEVEL)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: a pre-tokenizer after ByteLevel is not supported",
                         t->what, path);
  if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list))
      return lks_set_error(LKS_EFORMAT, "%s: %s.pretokenizers must be an array", t->what, path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[256];
      snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
      LKS_TRY(parse_pre(t, json_array_get(list, i), sub));
    }
    return 0;
  }
  lks__pre_step st = {0};
  char sub[256];
  if (!strcmp(type, "Split")) {
    st.kind = LKS__PRE_SPLIT;
    json_t *beh = json_object_get(p, "behavior");
    if (!json_is_string(beh))
      return lks_set_error(LKS_EFORMAT, "%s: %s.behavior must be a string", t->what, path);
    bool invert;
    LKS_TRY(get_bool(t, p, "invert", path, false, &invert));
    const char *b = json_string_value(beh);
    if (invert) st.mode = LKS__SPLIT_INVERT;
    else if (!strcmp(b, "Isolated")) st.mode = LKS__SPLIT_ISOLATED;
    else if (!strcmp(b, "Removed")) st.mode = LKS__SPLIT_REMOVED;
    else
      return lks_set_error(LKS_EUNSUPPORTED, "%s: %s.behavior '%s' is not supported (Isolated, Removed)",
                           t->what, path, b);
    snprintf(sub, sizeof sub, "%s.pattern", path);
    LKS_TRY(compile_pattern(t, json_object_get(p, "pattern"), sub, &st.re));
  } else if (!strcmp(type, "ByteLevel")) {
    st.kind = LKS__PRE_BYTELEVEL;
    bool use_regex;
    LKS_TRY(get_bool(t, p, "add_prefix_space", path, false, &st.prefix_space));
    LKS_TRY(get_bool(t, p, "use_regex", path, true, &use_regex));
    if (use_regex) {
      char err[200];
      st.re = lks_regex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, err, sizeof err);
      if (!st.re) return lks_set_error(LKS_EFORMAT, "internal: GPT-2 pattern: %s", err);
      pcre2_jit_compile(st.re, PCRE2_JIT_COMPLETE);
    }
  } else {
    return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: pre-tokenizer '%s' is not supported", t->what, path,
                         type);
  }
  lks__pre_step *np = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *np);
  if (!np) {
    pcre2_code_free(st.re);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  t->pre = np;
  t->pre[t->n_pre++] = st;
  return 0;
}

static int parse_decoder(lks_tokenizer *t, json_t *d, const char *path) {
  if (!d || json_is_null(d))
    return lks_set_error(LKS_EUNSUPPORTED, "%s: %s is missing; only the ByteLevel decoder is supported",
                         t->what, path);
  const char *type;
  LKS_TRY(get_type(t, d, path, &type));
  if (!strcmp(type, "ByteLevel")) return 0;
  if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(d, "decoders");
    if (!json_is_array(list) || json_array_size(list) != 1)
      return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: only a Sequence holding one ByteLevel decoder is supported",
                           t->what, path);
    char sub[256];
    snprintf(sub, sizeof sub, "%s.decoders[0]", path);
    return parse_decoder(t, json_array_get(list, 0), sub);
  }
  return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: decoder '%s' is not supported (ByteLevel)", t->what,
                       path, type);
}

static int parse_post(lks_tokenizer *t, json_t *p, const char *path) {
  if (!p || json_is_null(p)) return 0;
  const char *type;
  LKS_TRY(get_type(t, p, path, &type));
  char sub[256];
  if (!strcmp(type, "ByteLevel")) return 0;
  if (!strcmp(type, "Sequence")) {
    json_t *list = json_object_get(p, "processors");
    if (!json_is_array(list))
      return lks_set_error(LKS_EFORMAT, "%s: %s.processors must be an array", t->what, path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
      LKS_TRY(parse_post(t, json_array_get(list, i), sub));
    }
    return 0;
  }
  if (strcmp(type, "TemplateProcessing") != 0)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: post-processor '%s' is not supported", t->what,
                         path, type);
  if (t->tmpl)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: a second TemplateProcessing is not supported",
                         t->what, path);
  json_t *single = json_object_get(p, "single");
  if (!json_is_array(single))
    return lks_set_error(LKS_EFORMAT, "%s: %s.single must be an array", t->what, path);
  size_t n = json_array_size(single);
  t->tmpl = malloc((n ? n : 1) * sizeof *t->tmpl);
  if (!t->tmpl) return lks_set_error(LKS_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    json_t *it = json_array_get(single, i);
    json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
    if (sp) {
      json_t *id = json_object_get(sp, "id");
      if (!json_is_string(id))
        return lks_set_error(LKS_EFORMAT, "%s: %s.single[%zu].SpecialToken.id must be a string",
                             t->what, path, i);
      int tid = lks_tokenizer_token_id(t, json_string_value(id));
      if (tid < 0)
        return lks_set_error(LKS_EFORMAT, "%s: %s.single[%zu]: special token '%s' is not in the vocabulary",
                             t->what, path, i, json_string_value(id));
      t->tmpl[t->n_tmpl++] = tid;
    } else if (sq) {
      json_t *id = json_object_get(sq, "id");
      if (!json_is_string(id) || strcmp(json_string_value(id), "A") != 0)
        return lks_set_error(LKS_EFORMAT, "%s: %s.single[%zu].Sequence.id must be \"A\"", t->what, path, i);
      t->tmpl[t->n_tmpl++] = -1;
    } else {
      return lks_set_error(LKS_EFORMAT, "%s: %s.single[%zu] must hold SpecialToken or Sequence", t->what,
                           path, i);
    }
  }
  return 0;
}

static int build_tries(lks_tokenizer *t, bool has_normalizer) {
  for (int i = 0; i < t->n_added; i++) {
    lks__added_token *a = &t->added[i];
    if (a->normalized && has_normalizer) {
      LKS_TRY(lks__normalize(t, a->content, a->len, &a->norm, &a->norm_len));
      LKS_TRY(lks__vocab_trie_add(&t->norm_trie, a->norm, a->norm_len, i));
    } else {
      LKS_TRY(lks__vocab_trie_add(&t->raw_trie, a->content, a->len, i));
    }
  }
  return 0;
}

int lks__tokenizer_json_parse(lks_tokenizer *t, const char *text, size_t len) {
  const char *what = t->what;
  json_error_t je;
  json_t *root = json_loadb(text, len, 0, &je);
  if (!root)
    return lks_set_error(LKS_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", what, je.text,
                         je.line, je.column);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = lks_set_error(LKS_EFORMAT, "%s: the top level must be an object, not %s", what, jtype(root));
    goto done;
  }
  json_t *model = json_object_get(root, "model");
  size_t arena_cap = 0;
  if ((rc = parse_model(t, model, &arena_cap)) < 0) goto done;
  if ((rc = fill_vocab(t, json_object_get(model, "vocab"), &arena_cap)) < 0) goto done;
  if ((rc = fill_merges(t, json_object_get(model, "merges"))) < 0) goto done;
  json_t *norm = json_object_get(root, "normalizer");
  if ((rc = parse_normalizer(t, norm, "normalizer")) < 0) goto done;
  if ((rc = parse_added(t, json_object_get(root, "added_tokens"), &arena_cap)) < 0) goto done;
  json_t *unk = json_object_get(model, "unk_token");
  if (unk && !json_is_null(unk)) {
    if (!json_is_string(unk)) {
      rc = lks_set_error(LKS_EFORMAT, "%s: model.unk_token must be a string or null", what);
      goto done;
    }
    t->unk_id = lks_tokenizer_token_id(t, json_string_value(unk));
  }
  if ((rc = parse_pre(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer")) < 0) goto done;
  if (t->n_pre == 0 || t->pre[t->n_pre - 1].kind != LKS__PRE_BYTELEVEL) {
    rc = lks_set_error(LKS_EUNSUPPORTED,
                       "%s: pre_tokenizer: not a byte-level BPE (no ByteLevel pre-tokenizer at the end)",
                       what);
    goto done;
  }
  if ((rc = parse_decoder(t, json_object_get(root, "decoder"), "decoder")) < 0) goto done;
  if ((rc = parse_post(t, json_object_get(root, "post_processor"), "post_processor")) < 0) goto done;
  // A normalizer object, even an empty Sequence, makes "normalized" added tokens match after
  // normalization (the reference's rule).
  if ((rc = build_tries(t, norm && !json_is_null(norm))) < 0) goto done;
  int n_added_special = 0;
  for (int i = 0; i < t->n_added; i++) n_added_special += t->added[i].special;
  LKS_LOG(LKS_LOG_DEBUG, "%s: %d ids, %d added tokens (%d special), %d normalizer and %d pre-tokenizer steps",
          what, t->n_ids, t->n_added, n_added_special, t->n_norm, t->n_pre);
done:
  json_decref(root);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Files

char *lks__tokenizer_json_read(const char *path, size_t *len, bool missing_ok) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (!(missing_ok && errno == ENOENT))
      lks_set_error(LKS_EIO, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  lks__buf b = {0};
  char chunk[1 << 16];
  size_t k;
  while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) lks__buf_put(&b, chunk, k);
  bool err = ferror(f);
  fclose(f);
  if (err || b.oom) {
    free(b.p);
    lks_set_error(err ? LKS_EIO : LKS_ENOMEM, "cannot read %s", path);
    return NULL;
  }
  if (!b.p) b.p = calloc(1, 1);
  *len = b.n;
  return b.p;
}

int lks__tokenizer_json_config(lks_tokenizer *t, const char *file) {
  // tokenizer_config.json beside it: only its chat_template is used.
  char conf[4096];
  snprintf(conf, sizeof conf, "%s", file);
  char *slash = strrchr(conf, '/');
  snprintf(slash ? slash + 1 : conf, sizeof conf - (size_t)(slash ? slash + 1 - conf : 0),
           "tokenizer_config.json");
  size_t cl;
  char *ctext = lks__tokenizer_json_read(conf, &cl, true);
  if (!ctext) return 0;
  json_error_t je;
  json_t *c = json_loadb(ctext, cl, JSON_DECODE_INT_AS_REAL, &je);
  free(ctext);
  if (!c || !json_is_object(c)) {
    int rc = lks_set_error(LKS_EFORMAT, "%s: not a JSON object%s%s", conf, c ? "" : ": ",
                           c ? "" : je.text);
    json_decref(c);
    return rc;
  }
  json_t *ct = json_object_get(c, "chat_template");
  if (json_is_string(ct)) t->chat_template = strdup(json_string_value(ct));
  json_decref(c);
  return 0;
}
