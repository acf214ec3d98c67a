// SPDX-License-Identifier: MIT
// GLM output parser (see toolcall.h): a small state machine over a buffer of undecided bytes.
#include "text/toolcall.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/tokenizer.h"

const char *const lks_glm_markup[] = {"<think>",   "</think>",   "<tool_call>", "</tool_call>",
                                      "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"};
const int lks_glm_n_markup = (int)(sizeof lks_glm_markup / sizeof lks_glm_markup[0]);

typedef enum {
  S_LEAD,     // before content: whitespace is dropped
  S_CONTENT,
  S_RLEAD,    // after <think>: whitespace is dropped
  S_REASON,
  S_CALL,     // after <tool_call>, until </tool_call>
} state;

struct lks_glm_parser {
  const json_t *tools;  // NULL: tool calls are not parsed
  state st;
  char *b;              // undecided bytes b[off, n)
  size_t off, n, cap;
  int n_calls;
  bool oom;
};

lks_glm_parser *lks_glm_parser_new(const json_t *tools) {
  lks_glm_parser *p = calloc(1, sizeof *p);
  if (!p) {
    lks_set_error(LKS_ENOMEM, "out of memory");
    return NULL;
  }
  p->tools = json_is_array(tools) && json_array_size(tools) > 0 ? tools : NULL;
  return p;
}

void lks_glm_parser_free(lks_glm_parser *p) {
  if (!p) return;
  free(p->b);
  free(p);
}

int lks_glm_parser_n_calls(const lks_glm_parser *p) { return p->n_calls; }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *find(const char *s, size_t n, const char *needle) {
  size_t m = strlen(needle);
  for (size_t i = 0; i + m <= n; i++)
    if (s[i] == needle[0] && !memcmp(s + i, needle, m)) return s + i;
  return NULL;
}

static void emit_text(lks_glm_emit emit, void *ctx, lks_glm_kind k, const char *s, size_t n) {
  if (!n) return;
  lks_glm_event ev = {.kind = k, .text = s, .len = n};
  emit(ctx, &ev);
}

// How many bytes at the end of s[0, n) to hold back: a proper prefix of one of the markers
// (they all begin with '<'), or an incomplete UTF-8 character.
static size_t hold(const char *s, size_t n, const char *const *marks, int n_marks) {
  size_t h = 0;
  for (size_t k = n > 12 ? n - 12 : 0; k < n; k++) {
    if (s[k] != '<') continue;
    for (int m = 0; m < n_marks; m++) {
      size_t ml = strlen(marks[m]);
      if (n - k < ml && !memcmp(s + k, marks[m], n - k)) {
        h = n - k;
        break;
      }
    }
    if (h) return h;
  }
  // The last character's lead byte and how many bytes it needs.
  size_t k = n;
  while (k > 0 && n - k < 4 && ((unsigned char)s[k - 1] & 0xC0) == 0x80) k--;
  if (k == 0) return 0;
  unsigned char lead = (unsigned char)s[k - 1];
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  size_t have = n - (k - 1);
  return lead >= 0xC0 && have < need ? have : 0;
}

// The JSON schema type of argument `key` of tool `name` is (or includes) "string".
static bool string_typed(const json_t *tools, const char *name, const char *key) {
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *f = json_object_get(t, "function"), *schema;
    if (json_is_object(f)) {
      schema = json_object_get(f, "parameters");
    } else {
      f = t;
      schema = json_object_get(t, "input_schema");
    }
    const json_t *nm = json_object_get(f, "name");
    if (!json_is_string(nm) || strcmp(json_string_value(nm), name) != 0) continue;
    const json_t *ty = json_object_get(json_object_get(json_object_get(schema, "properties"), key), "type");
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), "string");
    size_t j;
    const json_t *x;
    json_array_foreach(ty, j, x) if (json_is_string(x) && !strcmp(json_string_value(x), "string")) return true;
    return false;
  }
  return false;
}

static void trim(const char **s, size_t *n) {
  while (*n && is_ws(**s)) (*s)++, (*n)--;
  while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

// Reads one call's body (between <tool_call> and </tool_call>). Returns 1 and emits the call,
// 0 when it is malformed (the caller returns it as text), or LKS_ENOMEM.
static int parse_call(lks_glm_parser *p, const char *s, size_t n, lks_glm_emit emit, void *ctx) {
  const char *e = s + n;
  const char *ak = find(s, n, "<arg_key>");
  const char *name = s;
  size_t name_n = (size_t)((ak ? ak : e) - s);
  trim(&name, &name_n);
  if (!name_n || memchr(name, '<', name_n) || memchr(name, '>', name_n) || memchr(name, '\n', name_n))
    return 0;
  int rc = 0;
  char *nm = strndup(name, name_n);
  json_t *args = json_object();
  json_t *raw = json_object();  // key -> the value's JSON text
  if (!nm || !args || !raw) {
    rc = lks_set_error(LKS_ENOMEM, "out of memory");
    goto done;
  }
  const char *q = ak ? ak : e;
  for (;;) {
    while (q < e && is_ws(*q)) q++;
    if (q == e) break;
    if ((size_t)(e - q) < 9 || memcmp(q, "<arg_key>", 9)) goto done;  // malformed
    q += 9;
    const char *ke = find(q, (size_t)(e - q), "</arg_key>");
    if (!ke) goto done;
    const char *key = q;
    size_t key_n = (size_t)(ke - q);
    trim(&key, &key_n);
    q = ke + 10;
    while (q < e && is_ws(*q)) q++;
    if ((size_t)(e - q) < 11 || memcmp(q, "<arg_value>", 11)) goto done;
    q += 11;
    const char *ve = find(q, (size_t)(e - q), "</arg_value>");
    if (!ve) goto done;
    const char *val = q;
    size_t val_n = (size_t)(ve - q);
    q = ve + 12;
    char *k = strndup(key, key_n);
    if (!k || memchr(key, '\0', key_n)) {
      free(k);
      goto done;
    }
    json_t *v = NULL;
    const char *tv = val;
    size_t tn = val_n;
    trim(&tv, &tn);
    if (!string_typed(p->tools, nm, k) && tn)
      v = json_loadb(tv, tn, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (!v && !string_typed(p->tools, nm, k) && tn)  // integers beyond 64 bits, as JavaScript reads them
      v = json_loadb(tv, tn, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, NULL);
    json_t *text;
    if (v) {
      text = json_stringn(tv, tn);
    } else {
      v = json_stringn(val, val_n);
      char *d = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
      text = d ? json_string(d) : NULL;
      free(d);
    }
    if (!v || !text) {  // not UTF-8 (cannot happen for decoded text) or out of memory
      json_decref(v);
      json_decref(text);
      free(k);
      goto done;
    }
    json_object_set_new(args, k, v);
    json_object_set_new(raw, k, text);
    free(k);
  }
  // Every pair read: the call.
  {
    char *js = NULL;
    size_t len = 0, cap = 64;
    js = malloc(cap);
    if (!js) {
      rc = lks_set_error(LKS_ENOMEM, "out of memory");
      goto done;
    }
    js[len++] = '{';
    const char *key;
    json_t *v;
    bool first = true;
    json_object_foreach(raw, key, v) {
      json_t *ks = json_string(key);
      char *kd = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
      json_decref(ks);
      size_t need = len + (kd ? strlen(kd) : 0) + json_string_length(v) + 4;
      if (need > cap) {
        while (cap < need) cap *= 2;
        char *nb = realloc(js, cap);
        if (!nb) {
          free(kd);
          free(js);
          rc = lks_set_error(LKS_ENOMEM, "out of memory");
          goto done;
        }
        js = nb;
      }
      if (!kd) {
        free(js);
        rc = lks_set_error(LKS_ENOMEM, "out of memory");
        goto done;
      }
      if (!first) js[len++] = ',';
      first = false;
      memcpy(js + len, kd, strlen(kd));
      len += strlen(kd);
      js[len++] = ':';
      memcpy(js + len, json_string_value(v), json_string_length(v));
      len += json_string_length(v);
      free(kd);
    }
    js[len++] = '}';
    js[len] = '\0';
    lks_glm_event ev = {.kind = LKS_GLM_TOOL_CALL, .name = nm, .args = args, .args_json = js};
    p->n_calls++;
    emit(ctx, &ev);
    free(js);
    rc = 1;
  }
done:
  free(nm);
  json_decref(args);
  json_decref(raw);
  return rc;
}

// Decides what it can of b[off, n). final: nothing more will come.
static int run(lks_glm_parser *p, bool final, lks_glm_emit emit, void *ctx) {
  static const char *const content_marks[] = {"<think>", "<tool_call>"};
  static const char *const reason_marks[] = {"</think>"};
  for (;;) {
    const char *s = p->b ? p->b + p->off : "";  // nothing fed yet: no buffer
    size_t n = p->n - p->off;
    if (p->st == S_LEAD || p->st == S_RLEAD) {
      size_t i = 0;
      while (i < n && is_ws(s[i])) i++;
      p->off += i;
      if (i == n) return 0;
      p->st = p->st == S_LEAD ? S_CONTENT : S_REASON;
      continue;
    }
    if (p->st == S_CALL) {
      const char *e = find(s, n, "</tool_call>");
      if (!e && !final) return 0;
      size_t body = e ? (size_t)(e - s) : n;
      int rc = e ? parse_call(p, s, body, emit, ctx) : 0;
      if (rc < 0) return rc;
      if (rc == 0) {  // malformed or cut off: the text as it was
        emit_text(emit, ctx, LKS_GLM_CONTENT, "<tool_call>", 11);
        size_t m;
        char *t = lks_utf8_sanitize(s, e ? body + 12 : body, &m);
        if (!t) return lks_set_error(LKS_ENOMEM, "out of memory");
        emit_text(emit, ctx, LKS_GLM_CONTENT, t, m);
        free(t);
      }
      p->off += e ? body + 12 : body;
      p->st = S_LEAD;
      if (!e) return 0;
      continue;
    }
    bool content = p->st == S_CONTENT;
    const char *const *marks = content ? content_marks : reason_marks;
    int n_marks = content ? (p->tools ? 2 : 1) : 1;
    const char *hit = NULL;
    int which = -1;
    for (int m = 0; m < n_marks; m++) {
      const char *h = find(s, n, marks[m]);
      if (h && (!hit || h < hit)) hit = h, which = m;
    }
    lks_glm_kind kind = content ? LKS_GLM_CONTENT : LKS_GLM_REASONING;
    if (hit) {
      emit_text(emit, ctx, kind, s, (size_t)(hit - s));
      p->off += (size_t)(hit - s) + strlen(marks[which]);
      p->st = !content ? S_LEAD : which == 0 ? S_RLEAD : S_CALL;
      continue;
    }
    size_t keep = final ? 0 : hold(s, n, marks, n_marks);
    if (final && n) {  // the output's end: whatever is left, as valid UTF-8
      size_t m;
      char *t = lks_utf8_sanitize(s, n, &m);
      if (!t) return lks_set_error(LKS_ENOMEM, "out of memory");
      emit_text(emit, ctx, kind, t, m);
      free(t);
    } else {
      emit_text(emit, ctx, kind, s, n - keep);
    }
    p->off += n - keep;
    return 0;
  }
}

int lks_glm_parser_feed(lks_glm_parser *p, const char *s, size_t n, lks_glm_emit emit, void *ctx) {
  if (p->off == p->n) p->off = p->n = 0;
  if (p->off > 0 && p->off * 2 >= p->n) {  // drop what was decided
    memmove(p->b, p->b + p->off, p->n - p->off);
    p->n -= p->off;
    p->off = 0;
  }
  if (p->n + n + 1 > p->cap) {
    size_t cap = p->cap ? p->cap : 256;
    while (cap < p->n + n + 1) cap *= 2;
    char *b = realloc(p->b, cap);
    if (!b) return lks_set_error(LKS_ENOMEM, "out of memory");
    p->b = b;
    p->cap = cap;
  }
  if (n) memcpy(p->b + p->n, s, n);
  p->n += n;
  return run(p, false, emit, ctx);
}

int lks_glm_parser_end(lks_glm_parser *p, lks_glm_emit emit, void *ctx) {
  int rc = run(p, true, emit, ctx);
  p->off = p->n = 0;
  return rc;
}
