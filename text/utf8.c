// SPDX-License-Identifier: MIT
// UTF-8 helpers and the byte-level byte map (see utf8.h).
#include "text/utf8.h"

#include <stdlib.h>
#include <string.h>

static const char REPLACEMENT[] = "\xEF\xBF\xBD";  // U+FFFD

void lks__utf8_reset(lks__utf8_state *st) {
  st->need = st->have = 0;
  st->lo = 0x80;
  st->hi = 0xBF;
}

// Feeds one byte; appends to `out` every complete character (or U+FFFD) it settles.
void lks__utf8_feed(lks__utf8_state *st, unsigned char b, lks__buf *out) {
  if (st->need == 0) {
    if (b < 0x80) {
      lks__buf_putc(out, (char)b);
    } else if (b >= 0xC2 && b <= 0xDF) {
      st->need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      if (b == 0xE0) st->lo = 0xA0;
      if (b == 0xED) st->hi = 0x9F;
      st->need = 2;
    } else if (b >= 0xF0 && b <= 0xF4) {
      if (b == 0xF0) st->lo = 0x90;
      if (b == 0xF4) st->hi = 0x8F;
      st->need = 3;
    } else {
      lks__buf_put(out, REPLACEMENT, 3);
      return;
    }
    if (st->need) st->held[st->have++] = b;
    return;
  }
  if (b < st->lo || b > st->hi) {
    // The held bytes are a maximal invalid subpart: one U+FFFD, then b starts afresh.
    lks__utf8_reset(st);
    lks__buf_put(out, REPLACEMENT, 3);
    lks__utf8_feed(st, b, out);
    return;
  }
  st->lo = 0x80;
  st->hi = 0xBF;
  st->held[st->have++] = b;
  if (st->have == st->need + 1) {
    lks__buf_put(out, st->held, (size_t)st->have);
    lks__utf8_reset(st);
  }
}

void lks__utf8_finish(lks__utf8_state *st, lks__buf *out) {
  if (st->need) lks__buf_put(out, REPLACEMENT, 3);
  lks__utf8_reset(st);
}

// Appends the sanitized form of in[0..len) to out. Returns true when it was already valid.
bool lks__utf8_sanitize_into(const char *in, size_t len, lks__buf *out) {
  lks__utf8_state st;
  lks__utf8_reset(&st);
  size_t before = out->n;
  const unsigned char *s = (const unsigned char *)in;
  size_t i = 0;
  while (i < len) {
    // Runs of ASCII go through in one copy.
    size_t j = i;
    while (j < len && s[j] < 0x80 && st.need == 0) j++;
    if (j > i) {
      lks__buf_put(out, s + i, j - i);
      i = j;
      continue;
    }
    lks__utf8_feed(&st, s[i++], out);
  }
  lks__utf8_finish(&st, out);
  return out->n - before == len && memcmp(out->p + before, in, len) == 0;
}

char *lks_utf8_sanitize(const char *in, size_t len, size_t *out_len) {
  lks__buf o = {0};
  lks__buf_reserve(&o, len);
  lks__utf8_sanitize_into(in, len, &o);
  if (o.oom) {
    free(o.p);
    return NULL;
  }
  if (!o.p) {
    o.p = calloc(1, 1);
    if (!o.p) return NULL;
  }
  if (out_len) *out_len = o.n;
  return o.p;
}

// Whether s[0..n) is well-formed UTF-8 (what the decoder above accepts without replacing).
bool lks__utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    unsigned char b = u[i];
    if (b < 0x80) {
      i++;
      continue;
    }
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + (size_t)need >= n) return false;  // truncated at the end
    if (u[i + 1] < lo || u[i + 1] > hi) return false;
    for (int k = 2; k <= need; k++)
      if (u[i + (size_t)k] < 0x80 || u[i + (size_t)k] > 0xBF) return false;
    i += (size_t)need + 1;
  }
  return true;
}

// JavaScript's String.prototype.trim whitespace (WhiteSpace and LineTerminator).
bool lks__utf8_js_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

size_t lks__utf8_trim_start(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    int l;
    uint32_t c = lks__utf8_decode((const unsigned char *)s + i, &l);
    if (!lks__utf8_js_space(c)) break;
    i += (size_t)l;
  }
  return i;
}

size_t lks__utf8_trim_end(const char *s, size_t n) {  // returns the new length
  while (n > 0) {
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    int l;
    uint32_t c = lks__utf8_decode((const unsigned char *)s + k, &l);
    if (!lks__utf8_js_space(c)) break;
    n = k;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// The GPT-2 byte <-> unicode mapping: printable bytes stand for themselves, the others for
// U+0100 onwards in byte order.

static uint32_t byte_cp[256];
static int16_t cp_byte[0x144];  // -1 where the code point stands for no byte

void lks__utf8_byte_map_init(void) {
  static bool done;
  if (done) return;
  int n = 0;
  for (int i = 0; i < 0x144; i++) cp_byte[i] = -1;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    byte_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    cp_byte[byte_cp[b]] = (int16_t)b;
  }
  done = true;  // idempotent: racing initialisations write the same values
}

// Converts a byte-level token ("Ġthe") to its bytes (" the"); false when a character stands for
// no byte.
bool lks__utf8_from_bytelevel(const char *s, size_t n, lks__buf *out) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    int l;
    uint32_t c = lks__utf8_decode(u + i, &l);
    if (c >= 0x144 || cp_byte[c] < 0) return false;
    lks__buf_putc(out, (char)cp_byte[c]);
    i += (size_t)l;
  }
  return true;
}
