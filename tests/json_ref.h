// SPDX-License-Identifier: MIT
// The independent verdict JSON mode's recognizer (text/json_grammar.h) is tested against:
// jansson, with its departures from RFC 8259 taken out and the recognizer's depth and whitespace
// bounds applied. Shared by tests/unit/check_json_grammar.c and tests/fuzz/fuzz_json_grammar.c.
#ifndef LKS_TEST_JSON_REF_H
#define LKS_TEST_JSON_REF_H

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_grammar.h"

// Whether s[0..n) stays within the recognizer's bounds: nesting depth and whitespace bytes in a
// row, outside strings (a plain scan; for documents jansson accepts).
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

// jansson's verdict on s[0..n) (object_only: the value must be an object), with its departures
// from RFC 8259 taken out, within the recognizer's bounds. Aborts when out of memory.
static bool json_ref_accepts(const char *s, size_t n, bool object_only) {
  // jansson takes a raw NUL byte for the end of its input; RFC 8259 allows none anywhere (not in
  // strings, where bytes below 0x20 must be escaped, nor outside them).
  if (memchr(s, 0, n)) return false;
  size_t m;
  char *t = tame(s, n, &m);
  if (!t) abort();
  json_error_t err;
  json_t *j = json_loadb(t, m, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &err);
  free(t);
  bool ok = j != NULL && (!object_only || json_is_object(j));
  json_decref(j);
  return ok && within_bounds(s, n);
}

#endif
