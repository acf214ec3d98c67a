// SPDX-License-Identifier: MIT
// Growable byte strings and id vectors, internal to text/. A failed allocation sets `oom` and
// turns every later append into a no-op, so a builder appends freely and checks once at the end.
// A byte string is kept NUL-terminated whenever it holds anything. Zero-initialise to start
// ({0}); the owner frees `p`.
#ifndef LKS_TEXT_BUF_H
#define LKS_TEXT_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  char *p;
  size_t n, cap;
  bool oom;
} lks__buf;

typedef struct {
  int32_t *p;
  int n, cap;
  bool oom;
} lks__idbuf;

// Makes room for `extra` more bytes and the NUL (or sets oom).
void lks__buf_reserve(lks__buf *s, size_t extra);
// Appends printf output; at most 255 bytes of it (the translator's short fragments).
void lks__buf_printf(lks__buf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Appends one id, growing the vector (or setting oom).
void lks__buf_push_id(lks__idbuf *v, int32_t x);

static inline void lks__buf_put(lks__buf *s, const void *d, size_t n) {
  if (s->oom || s->n + n + 1 > s->cap) {
    lks__buf_reserve(s, n);
    if (s->oom) return;
  }
  memcpy(s->p + s->n, d, n);
  s->n += n;
  s->p[s->n] = '\0';
}
static inline void lks__buf_puts(lks__buf *s, const char *z) { lks__buf_put(s, z, strlen(z)); }
static inline void lks__buf_putc(lks__buf *s, char c) { lks__buf_put(s, &c, 1); }

#endif
