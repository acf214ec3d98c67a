// SPDX-License-Identifier: MIT
// libFuzzer target for JSON mode's recognizer (text/json_grammar.h): on any bytes, its verdict
// must equal jansson's (json_loadb with JSON_DECODE_ANY, within the recognizer's depth and
// whitespace bounds), and the longest prefix it accepts, followed by the completion its close
// cost counts, must be a document jansson accepts, the cost falling by one per byte.
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_grammar.h"

static bool within_bounds(const char *s, size_t n) {
  int depth = 0, ws = 0;
  bool in_str = false, esc = false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (++ws > LKS_JSON_MAX_WS) return false;
      continue;
    }
    ws = 0;
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') {
      if (++depth > LKS_JSON_MAX_DEPTH) return false;
    } else if (c == '}' || c == ']') {
      depth--;
    }
  }
  return true;
}

// s[0..n) as jansson can judge it under JSON's grammar: every run of digits outside strings cut
// to its first two (a run's first digit and whether it has more than one are all the grammar
// reads; jansson refuses numbers beyond a double and stops there), and every \u0000 escape made
// \u0001 (jansson refuses U+0000 in keys and stops there). The caller frees the copy (*m bytes).
static char *tame(const char *s, size_t n, size_t *m) {
  char *o = malloc(n + 1);
  if (!o) return NULL;
  bool in_str = false, esc = false;
  int run = 0;
  *m = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    run = !in_str && c >= '0' && c <= '9' ? run + 1 : 0;
    if (run > 2) continue;
    o[(*m)++] = c;
    if (in_str) {
      if (esc) {
        esc = false;
        if (c == 'u' && i + 4 < n && !memcmp(s + i + 1, "0000", 4)) {
          memcpy(o + *m, "0001", 4);
          *m += 4;
          i += 4;
        }
      } else if (c == '\\') {
        esc = true;
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c == '"') {
      in_str = true;
    }
  }
  return o;
}

// jansson's verdict, with its three departures from RFC 8259 taken out: a raw NUL ends its input,
// it refuses numbers beyond a double and keys containing U+0000.
static bool ref_accepts(const char *s, size_t n) {
  if (memchr(s, 0, n)) return false;  // jansson takes a raw NUL for the end of its input
  size_t m;
  char *t = tame(s, n, &m);
  if (!t) abort();
  json_error_t err;
  json_t *j = json_loadb(t, m, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &err);
  free(t);
  bool ok = j != NULL;
  json_decref(j);
  return ok && within_bounds(s, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *s = (const char *)data;
  lks_json_state st;
  lks_json_init(&st, false);
  size_t i = 0;
  while (i < size && lks_json_feed(&st, data[i])) i++;
  bool mine = i == size && lks_json_complete(&st);
  if (mine != ref_accepts(s, size)) abort();
  // The accepted prefix s[0..i) and its completion.
  char *buf = malloc(i + 8192);
  if (!buf) return 0;
  memcpy(buf, s, i);
  size_t m = i;
  int cost = lks_json_close_cost(&st);
  while (cost > 0) {
    unsigned char b = lks_json_close_byte(&st);
    if (!b || !lks_json_feed(&st, b) || lks_json_close_cost(&st) != cost - 1 || m >= i + 8192) abort();
    buf[m++] = (char)b;
    cost--;
  }
  if (!lks_json_complete(&st) || !ref_accepts(buf, m)) abort();
  free(buf);
  return 0;
}
