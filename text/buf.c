// SPDX-License-Identifier: MIT
// Growable byte strings and id vectors (see buf.h): doubling growth from 64 elements.
#include "text/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void lks__buf_reserve(lks__buf *s, size_t extra) {
  if (s->oom || s->n + extra + 1 <= s->cap) return;
  size_t cap = s->cap ? s->cap : 64;
  while (cap < s->n + extra + 1) cap *= 2;
  char *p = realloc(s->p, cap);
  if (!p) {
    s->oom = true;
    return;
  }
  s->p = p;
  s->cap = cap;
}

void lks__buf_printf(lks__buf *s, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (w > 0) lks__buf_put(s, tmp, (size_t)w < sizeof tmp ? (size_t)w : sizeof tmp - 1);
}

void lks__buf_push_id(lks__idbuf *v, int32_t x) {
  if (v->oom) return;
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 64;
    int32_t *p = realloc(v->p, (size_t)cap * sizeof *p);
    if (!p) {
      v->oom = true;
      return;
    }
    v->p = p;
    v->cap = cap;
  }
  v->p[v->n++] = x;
}
