// SPDX-License-Identifier: MIT
// UTF-8 for the tokenizer: the WHATWG decoder (invalid input becomes U+FFFD, one per maximal
// invalid subpart, as Node's TextDecoder and Python's errors="replace" do) as a byte-at-a-time
// state machine shared by encode, decode and streaming decode; validation; JavaScript's notion
// of whitespace (the trim() rule both references apply); and GPT-2's byte-level byte <-> code
// point map. Everything here is a pure function of its arguments except the byte map, which
// lks__utf8_byte_map_init() fills once (idempotent, safe to race).
#ifndef LKS_TEXT_UTF8_H
#define LKS_TEXT_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/buf.h"

// Replaces each maximal invalid UTF-8 subpart of `in` with U+FFFD (WHATWG "replacement").
// Returns a malloc'd NUL-terminated copy (*out_len bytes) or NULL when out of memory.
// (Public; also declared by text/tokenizer.h.)
char *lks_utf8_sanitize(const char *in, size_t len, size_t *out_len);

// Length of the UTF-8 sequence starting with byte b of valid text.
static inline int lks__utf8_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// The code point at s of valid text; *len its length in bytes.
static inline uint32_t lks__utf8_decode(const unsigned char *s, int *len) {
  unsigned char b = s[0];
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  if (b < 0xE0) {
    *len = 2;
    return ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
  }
  if (b < 0xF0) {
    *len = 3;
    return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  }
  *len = 4;
  return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
         ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

// The WHATWG UTF-8 decoder's state. need: continuation bytes still expected; lo/hi: the allowed
// range of the next one; have: bytes of the sequence held so far.
typedef struct {
  int need, have;
  unsigned char lo, hi;
  unsigned char held[4];
} lks__utf8_state;

void lks__utf8_reset(lks__utf8_state *st);
// Feeds one byte; appends to `out` every complete character (or U+FFFD) it settles.
void lks__utf8_feed(lks__utf8_state *st, unsigned char b, lks__buf *out);
// Ends the input: held bytes that never completed a character become one U+FFFD.
void lks__utf8_finish(lks__utf8_state *st, lks__buf *out);
// Appends the sanitized form of in[0..len) to out. Returns true when it was already valid.
bool lks__utf8_sanitize_into(const char *in, size_t len, lks__buf *out);
// Whether s[0..n) is well-formed UTF-8 (what the decoder accepts without replacing).
bool lks__utf8_valid(const char *s, size_t n);

// Whether code point c is whitespace to JavaScript's String.prototype.trim (WhiteSpace and
// LineTerminator).
bool lks__utf8_js_space(uint32_t c);
// Bytes of JavaScript whitespace at the start of valid text s[0..n).
size_t lks__utf8_trim_start(const char *s, size_t n);
// The length of valid text s[0..n) without its trailing JavaScript whitespace.
size_t lks__utf8_trim_end(const char *s, size_t n);

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for U+0100
// onwards in byte order. Call lks__utf8_byte_map_init() before the conversion.
void lks__utf8_byte_map_init(void);
// Appends the bytes a byte-level token ("Ġthe") stands for (" the"); false when a character of
// it stands for no byte.
bool lks__utf8_from_bytelevel(const char *s, size_t n, lks__buf *out);

#endif
