// SPDX-License-Identifier: MIT
// tokenizer.json loading, encoding and decoding for byte-level BPE (see tokenizer.h).
//
// Inside, the vocabulary is kept as raw bytes: a byte-level token such as "Ġthe" is stored as
// " the", so BPE runs on the input bytes directly and decoding is a copy. Merges become a hash
// of (left id, right id) -> (rank, merged id). Regexes are rewritten from the Oniguruma dialect
// of tokenizer.json into PCRE2 with the meaning the reference gives them (\s is White_Space,
// (?i:...) folds ASCII only, '.' stops at \n only, ...), compiled in UTF mode with UCP and
// JIT-compiled when the JIT is available.
#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "core/error.h"
#include "core/log.h"

// ---------------------------------------------------------------------------------------------
// Growable byte strings and id vectors

typedef struct {
  char *p;
  size_t n, cap;
  bool oom;
} sbuf;

static void sb_reserve(sbuf *s, size_t extra) {
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
static void sb_put(sbuf *s, const void *d, size_t n) {
  sb_reserve(s, n);
  if (s->oom) return;
  memcpy(s->p + s->n, d, n);
  s->n += n;
  s->p[s->n] = '\0';
}
static void sb_puts(sbuf *s, const char *z) { sb_put(s, z, strlen(z)); }
static void sb_putc(sbuf *s, char c) { sb_put(s, &c, 1); }
static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (w > 0) sb_put(s, tmp, (size_t)w < sizeof tmp ? (size_t)w : sizeof tmp - 1);
}

typedef struct {
  int32_t *p;
  int n, cap;
  bool oom;
} ivec;

static void iv_push(ivec *v, int32_t x) {
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

// ---------------------------------------------------------------------------------------------
// UTF-8

// Length of the UTF-8 sequence starting with byte b of valid text.
static inline int u8len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

static inline uint32_t u8dec(const unsigned char *s, int *len) {
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

static const char REPLACEMENT[] = "\xEF\xBF\xBD";  // U+FFFD

// The WHATWG UTF-8 decoder as a state machine over bytes. need: continuation bytes still
// expected; lo/hi: the allowed range of the next one; have: bytes of the sequence held so far.
typedef struct {
  int need, have;
  unsigned char lo, hi;
  unsigned char held[4];
} u8state;

static void u8s_reset(u8state *st) {
  st->need = st->have = 0;
  st->lo = 0x80;
  st->hi = 0xBF;
}

// Feeds one byte; appends to `out` every complete character (or U+FFFD) it settles.
static void u8s_feed(u8state *st, unsigned char b, sbuf *out) {
  if (st->need == 0) {
    if (b < 0x80) {
      sb_putc(out, (char)b);
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
      sb_put(out, REPLACEMENT, 3);
      return;
    }
    if (st->need) st->held[st->have++] = b;
    return;
  }
  if (b < st->lo || b > st->hi) {
    // The held bytes are a maximal invalid subpart: one U+FFFD, then b starts afresh.
    u8s_reset(st);
    sb_put(out, REPLACEMENT, 3);
    u8s_feed(st, b, out);
    return;
  }
  st->lo = 0x80;
  st->hi = 0xBF;
  st->held[st->have++] = b;
  if (st->have == st->need + 1) {
    sb_put(out, st->held, (size_t)st->have);
    u8s_reset(st);
  }
}

static void u8s_finish(u8state *st, sbuf *out) {
  if (st->need) sb_put(out, REPLACEMENT, 3);
  u8s_reset(st);
}

// Appends the sanitized form of in[0..len) to out. Returns true when it was already valid.
static bool u8_sanitize_into(const char *in, size_t len, sbuf *out) {
  u8state st;
  u8s_reset(&st);
  size_t before = out->n;
  const unsigned char *s = (const unsigned char *)in;
  size_t i = 0;
  while (i < len) {
    // Runs of ASCII go through in one copy.
    size_t j = i;
    while (j < len && s[j] < 0x80 && st.need == 0) j++;
    if (j > i) {
      sb_put(out, s + i, j - i);
      i = j;
      continue;
    }
    u8s_feed(&st, s[i++], out);
  }
  u8s_finish(&st, out);
  return out->n - before == len && memcmp(out->p + before, in, len) == 0;
}

char *lks_utf8_sanitize(const char *in, size_t len, size_t *out_len) {
  sbuf o = {0};
  sb_reserve(&o, len);
  u8_sanitize_into(in, len, &o);
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
static bool u8_valid(const char *s, size_t n) {
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
bool lks__js_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

static size_t trim_start(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    int l;
    uint32_t c = u8dec((const unsigned char *)s + i, &l);
    if (!lks__js_space(c)) break;
    i += (size_t)l;
  }
  return i;
}

static size_t trim_end(const char *s, size_t n) {  // returns the new length
  while (n > 0) {
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    int l;
    uint32_t c = u8dec((const unsigned char *)s + k, &l);
    if (!lks__js_space(c)) break;
    n = k;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// The GPT-2 byte <-> unicode mapping: printable bytes stand for themselves, the others for
// U+0100 onwards in byte order.

static uint32_t byte_cp[256];
static int16_t cp_byte[0x144];  // -1 where the code point stands for no byte

static void byte_map_init(void) {
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
static bool bytelevel_to_bytes(const char *s, size_t n, sbuf *out) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    int l;
    uint32_t c = u8dec(u + i, &l);
    if (c >= 0x144 || cp_byte[c] < 0) return false;
    sb_putc(out, (char)cp_byte[c]);
    i += (size_t)l;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Hash tables

static inline uint64_t hash_bytes(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    s += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, s, n);
  h = (h ^ w) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

// bytes -> id, over strings stored in the tokenizer's arena.
typedef struct {
  int32_t *slot;  // id, or -1
  uint32_t mask;
} bmap;

typedef struct {
  int32_t rank, id;
  uint64_t key;  // left << 32 | right; UINT64_MAX when empty
} merge_slot;

typedef struct {
  char *content;  // UTF-8, as written
  size_t len;
  char *norm;  // content after the normalizer ("normalized": true and a normalizer present)
  size_t norm_len;
  int32_t id;
  bool lstrip, rstrip, normalized, special;
} added_token;

// A byte trie for matching added tokens longest-first.
typedef struct {
  int32_t child, sibling, token;  // first child, next sibling, added index or -1
  unsigned char byte;
} trie_node;

typedef struct {
  trie_node *n;
  int count, cap;
  int32_t root[256];  // first-level node per byte, or -1
} trie;

// ---------------------------------------------------------------------------------------------
// Pipeline steps

typedef enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_REPLACE, NORM_PREPEND } norm_kind;

typedef struct {
  norm_kind kind;
  pcre2_code *re;  // Replace
  char *text;      // Replace content, Prepend prefix
  size_t text_len;
} norm_step;

typedef enum { PRE_SPLIT, PRE_BYTELEVEL } pre_kind;
typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_INVERT } split_mode;

typedef struct {
  pre_kind kind;
  pcre2_code *re;  // Split, or ByteLevel with use_regex
  split_mode mode;
  bool prefix_space;  // ByteLevel add_prefix_space
} pre_step;

struct lks_tokenizer {
  char *what;
  int n_ids;
  // Per id: where its decoded bytes are in `arena`, and flags.
  uint32_t *off, *len;
  uint8_t *flags;
  char *arena;
  size_t arena_n;
  bmap vocab;  // byte-level vocabulary entries, by bytes
  merge_slot *merges;
  uint32_t merge_mask;
  int32_t byte_id[256];
  int32_t unk_id;  // -1 when none
  bool ignore_merges;
  // Vocabulary entries that are not byte-level strings: kept for decode and token_id lookups.
  int32_t *odd_ids;
  int n_odd;
  added_token *added;
  int n_added;
  trie raw_trie, norm_trie;  // "normalized": false / true
  norm_step *norm;
  int n_norm;
  pre_step *pre;
  int n_pre;
  int32_t *tmpl;  // post-processor template: ids, -1 standing for the sequence
  int n_tmpl;
  char *chat_template;
};

enum { F_VOCAB = 1, F_ADDED = 2, F_SPECIAL = 4, F_BYTELEVEL = 8 };

// ---------------------------------------------------------------------------------------------
// Building the tables

static int arena_add(lks_tokenizer *t, size_t *cap, const char *d, size_t n, uint32_t *off) {
  if (t->arena_n + n > UINT32_MAX) return lks_set_error(LKS_EFORMAT, "%s: vocabulary too large", t->what);
  if (t->arena_n + n > *cap) {
    size_t c = *cap ? *cap : 1 << 16;
    while (c < t->arena_n + n) c *= 2;
    char *a = realloc(t->arena, c);
    if (!a) return lks_set_error(LKS_ENOMEM, "out of memory");
    t->arena = a;
    *cap = c;
  }
  if (n) memcpy(t->arena + t->arena_n, d, n);
  *off = (uint32_t)t->arena_n;
  t->arena_n += n;
  return 0;
}

static int32_t bmap_get(const lks_tokenizer *t, const char *s, size_t n) {
  if (!t->vocab.slot) return -1;
  uint64_t h = hash_bytes(s, n);
  for (uint32_t i = (uint32_t)h & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
    int32_t id = t->vocab.slot[i];
    if (id < 0) return -1;
    if (t->len[id] == n && memcmp(t->arena + t->off[id], s, n) == 0) return id;
  }
}

static int bmap_build(lks_tokenizer *t, int n_entries) {
  uint32_t cap = 16;
  while (cap < (uint32_t)n_entries * 2u) cap *= 2;
  t->vocab.slot = malloc((size_t)cap * sizeof *t->vocab.slot);
  if (!t->vocab.slot) return lks_set_error(LKS_ENOMEM, "out of memory");
  memset(t->vocab.slot, 0xFF, (size_t)cap * sizeof *t->vocab.slot);
  t->vocab.mask = cap - 1;
  for (int id = 0; id < t->n_ids; id++) {
    if (!(t->flags[id] & F_BYTELEVEL)) continue;
    const char *s = t->arena + t->off[id];
    uint64_t h = hash_bytes(s, t->len[id]);
    uint32_t i = (uint32_t)h & t->vocab.mask;
    for (;; i = (i + 1) & t->vocab.mask) {
      int32_t o = t->vocab.slot[i];
      if (o < 0) break;
      if (t->len[o] == t->len[id] && memcmp(t->arena + t->off[o], s, t->len[id]) == 0) break;
    }
    if (t->vocab.slot[i] >= 0)
      return lks_set_error(LKS_EFORMAT, "%s: model.vocab: ids %d and %d are the same token", t->what,
                           t->vocab.slot[i], id);
    t->vocab.slot[i] = id;
  }
  return 0;
}

static inline uint32_t merge_hash(uint64_t key, uint32_t mask) {
  return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static inline const merge_slot *merge_get(const lks_tokenizer *t, int32_t a, int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (uint32_t i = merge_hash(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
    const merge_slot *m = &t->merges[i];
    if (m->key == key) return m;
    if (m->key == UINT64_MAX) return NULL;
  }
}

static void merge_put(lks_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (uint32_t i = merge_hash(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
    merge_slot *m = &t->merges[i];
    if (m->key == key || m->key == UINT64_MAX) {
      // A repeated pair takes its last rank, as in both the Rust and the JS implementations.
      m->key = key;
      m->rank = rank;
      m->id = id;
      return;
    }
  }
}

static int trie_add(trie *tr, const char *s, size_t n, int32_t token) {
  if (n == 0) return 0;
  int32_t parent = -1;  // -1: the root, whose children are tr->root[byte]
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)s[i];
    int32_t c = parent < 0 ? tr->root[b] : tr->n[parent].child;
    while (c >= 0 && tr->n[c].byte != b) c = tr->n[c].sibling;
    if (c < 0) {
      if (tr->count == tr->cap) {
        int cap = tr->cap ? tr->cap * 2 : 256;
        trie_node *p = realloc(tr->n, (size_t)cap * sizeof *p);
        if (!p) return lks_set_error(LKS_ENOMEM, "out of memory");
        tr->n = p;
        tr->cap = cap;
      }
      c = tr->count++;
      int32_t *link = parent < 0 ? &tr->root[b] : &tr->n[parent].child;
      tr->n[c] = (trie_node){.child = -1, .sibling = *link, .token = -1, .byte = b};
      *link = c;
    }
    parent = c;
  }
  if (tr->n[parent].token < 0) tr->n[parent].token = token;  // the first of equal contents wins
  return 0;
}

// The longest added token starting at s[0..n): its index, *mlen its length; -1 when none.
static int32_t trie_match(const trie *tr, const char *s, size_t n, size_t *mlen) {
  int32_t best = -1;
  int32_t c = tr->root[(unsigned char)s[0]];
  size_t i = 0;
  while (c >= 0) {
    if (tr->n[c].token >= 0) {
      best = tr->n[c].token;
      *mlen = i + 1;
    }
    if (++i >= n) break;
    unsigned char b = (unsigned char)s[i];
    c = tr->n[c].child;
    while (c >= 0 && tr->n[c].byte != b) c = tr->n[c].sibling;
  }
  return best;
}

static void trie_init(trie *tr) {
  memset(tr, 0, sizeof *tr);
  for (int i = 0; i < 256; i++) tr->root[i] = -1;
}

// ---------------------------------------------------------------------------------------------
// Regex: tokenizer.json's Oniguruma dialect -> PCRE2, as the reference rewrites it for
// JavaScript's Unicode mode.

#define WORD_CHARS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define WORD_CLASS "[" WORD_CHARS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}]"
#define NON_WORD_CLASS "[^" WORD_CHARS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}]"

typedef struct {
  const char *src;
  size_t n;
  char err[160];
} rx_src;

static bool is_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Braced escape \p{..} \P{..} \x{..} \u{..} at src[i]: its body and total length, or 0.
static size_t braced_escape(const rx_src *r, size_t i, char *kind, const char **body,
                            size_t *blen) {
  if (i + 2 >= r->n || r->src[i] != '\\') return 0;
  char k = r->src[i + 1];
  if ((k != 'p' && k != 'P' && k != 'x' && k != 'u') || r->src[i + 2] != '{') return 0;
  const char *close = memchr(r->src + i + 3, '}', r->n - i - 3);
  if (!close) return 0;
  *kind = k;
  *body = r->src + i + 3;
  *blen = (size_t)(close - *body);
  return (size_t)(close - (r->src + i)) + 1;
}

static size_t hex_run(const rx_src *r, size_t i, size_t max) {
  size_t k = 0;
  while (k < max && i + k < r->n) {
    char c = r->src[i + k];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) break;
    k++;
  }
  return k;
}

// A fixed-width escape \xHH, \uHHHH, \cX: writes its PCRE2 form, returns its length or 0.
static size_t fixed_escape(const rx_src *r, size_t i, sbuf *out, uint32_t *cp) {
  if (i + 1 >= r->n || r->src[i] != '\\') return 0;
  char k = r->src[i + 1];
  if (k == 'x' && hex_run(r, i + 2, 2) == 2) {
    *cp = (uint32_t)strtoul((char[]){r->src[i + 2], r->src[i + 3], 0}, NULL, 16);
    sb_printf(out, "\\x{%X}", *cp);
    return 4;
  }
  if (k == 'u' && hex_run(r, i + 2, 4) == 4) {
    char h[5] = {r->src[i + 2], r->src[i + 3], r->src[i + 4], r->src[i + 5], 0};
    *cp = (uint32_t)strtoul(h, NULL, 16);
    sb_printf(out, "\\x{%X}", *cp);
    return 6;
  }
  if (k == 'c' && i + 2 < r->n && is_letter(r->src[i + 2])) {
    sb_put(out, r->src + i, 3);
    *cp = UINT32_MAX;
    return 3;
  }
  return 0;
}

static pcre2_code *rx_compile_raw(const char *pat, size_t n, uint32_t opts, char *err,
                                  size_t errlen) {
  int ec;
  PCRE2_SIZE eo;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, opts | PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
  if (!re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(ec, msg, sizeof msg);
    snprintf(err, errlen, "%s (at offset %zu of the rewritten pattern)", (char *)msg, (size_t)eo);
  }
  return re;
}

// ASCII letters whose other case a class must gain inside (?i:...): the reference adds, for each
// letter the class holds in one case only, the other case.
static int class_fold_additions(rx_src *r, const char *body, size_t n, sbuf *add) {
  sbuf pat = {0};
  sb_puts(&pat, "^[");
  sb_put(&pat, body, n);
  sb_puts(&pat, "]$");
  if (pat.oom) return lks_set_error(LKS_ENOMEM, "out of memory");
  pcre2_code *re = rx_compile_raw(pat.p, pat.n, 0, r->err, sizeof r->err);
  free(pat.p);
  if (!re) return LKS_EFORMAT;
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  if (!md) {
    pcre2_code_free(re);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  for (char c = 'A'; c <= 'Z'; c++) {
    char lc = (char)(c + 32);
    bool up = pcre2_match(re, (PCRE2_SPTR)&c, 1, 0, 0, md, NULL) >= 0;
    bool lo = pcre2_match(re, (PCRE2_SPTR)&lc, 1, 0, 0, md, NULL) >= 0;
    if (up != lo) sb_putc(add, up ? lc : c);
  }
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return 0;
}

// Translates the character class at src[*ip] ('['); advances *ip past its ']'.
static int rx_class(rx_src *r, size_t *ip, bool fold, sbuf *out) {
  size_t i = *ip + 1;
  bool neg = i < r->n && r->src[i] == '^';
  if (neg) i++;
  size_t first = i;
  sbuf body = {0};
  enum { T_NONE, T_SCALAR, T_SET, T_RANGE, T_DONE_RANGE } tail = T_NONE;
  int rc = 0;
#define CLASS_FAIL(...)                               \
  do {                                                \
    snprintf(r->err, sizeof r->err, __VA_ARGS__);     \
    rc = LKS_EFORMAT;                                 \
    goto done;                                        \
  } while (0)
#define CLASS_UNSUPPORTED(...)                        \
  do {                                                \
    snprintf(r->err, sizeof r->err, __VA_ARGS__);     \
    rc = LKS_EUNSUPPORTED;                            \
    goto done;                                        \
  } while (0)
  while (i < r->n) {
    char c = r->src[i];
    bool set_valued = false;
    if (c == '\\') {
      char kind;
      const char *bb;
      size_t bl;
      uint32_t cp;
      size_t el = braced_escape(r, i, &kind, &bb, &bl);
      if (el) {
        if ((kind == 'p' || kind == 'P') && bl == 4 && !memcmp(bb, "Word", 4)) {
          if (kind == 'P') CLASS_UNSUPPORTED("\\P{Word} inside a character class at offset %zu", i);
          sb_puts(&body, WORD_CHARS);
        } else if (kind == 'x' || kind == 'u') {
          sb_puts(&body, "\\x{");
          sb_put(&body, bb, bl);
          sb_putc(&body, '}');
        } else {
          sb_put(&body, r->src + i, el);
        }
        set_valued = kind == 'p' || kind == 'P';
        i += el;
      } else if ((el = fixed_escape(r, i, &body, &cp))) {
        i += el;
      } else {
        if (i + 1 >= r->n) CLASS_FAIL("unterminated escape in a character class at offset %zu", i);
        char e = r->src[i + 1];
        i += 2;
        switch (e) {
          case '\n': sb_puts(&body, "\\n"); break;
          case '\r': sb_puts(&body, "\\r"); break;
          case '\t': sb_puts(&body, "\\t"); break;
          case '\f': sb_puts(&body, "\\f"); break;
          case '\v': case 'v': sb_puts(&body, "\\x{B}"); break;
          case 'W': case 'H':
            CLASS_UNSUPPORTED("\\%c inside a character class at offset %zu", e, i - 2);
          case 'h': sb_puts(&body, "0-9A-Fa-f"); set_valued = true; break;
          case 'w': sb_puts(&body, WORD_CHARS); set_valued = true; break;
          case 'd': sb_puts(&body, "\\p{Nd}"); set_valued = true; break;
          case 'D': sb_puts(&body, "\\P{Nd}"); set_valued = true; break;
          case 's': sb_puts(&body, "\\p{White_Space}"); set_valued = true; break;
          case 'S': sb_puts(&body, "\\P{White_Space}"); set_valued = true; break;
          case 'a': sb_puts(&body, "\\x{7}"); break;
          case 'e': sb_puts(&body, "\\x{1B}"); break;
          default:
            sb_putc(&body, '\\');
            sb_putc(&body, e);
            break;
        }
      }
      if (set_valued && tail == T_RANGE)
        CLASS_FAIL("a range ends in a set-valued escape at offset %zu", i);
      tail = tail == T_RANGE ? T_DONE_RANGE : set_valued ? T_SET : T_SCALAR;
      continue;
    }
    if (c == ']') {
      if (i == first) {
        sb_puts(&body, "\\]");
        tail = T_SCALAR;
        i++;
        continue;
      }
      if (tail == T_NONE) CLASS_FAIL("empty character class at offset %zu", *ip);
      sbuf add = {0};
      if (fold) {
        rc = class_fold_additions(r, body.p, body.n, &add);
        if (rc < 0) {
          free(add.p);
          goto done;
        }
      }
      sb_putc(out, '[');
      if (neg) sb_putc(out, '^');
      sb_put(out, body.p, body.n);
      if (add.n) sb_put(out, add.p, add.n);
      sb_putc(out, ']');
      free(add.p);
      *ip = i + 1;
      goto done;
    }
    if (c == '&' && i + 1 < r->n && r->src[i + 1] == '&')
      CLASS_UNSUPPORTED("character-class intersection '&&' at offset %zu", i);
    if (c == '[') {
      static const struct {
        const char *name, *frag;
      } posix[] = {{"alpha", "\\p{Alphabetic}"}, {"alnum", "\\p{Alphabetic}\\p{Nd}"},
                   {"digit", "\\p{Nd}"},          {"lower", "\\p{Lowercase}"},
                   {"upper", "\\p{Uppercase}"},   {"space", "\\p{White_Space}"},
                   {"blank", "\\t\\p{Zs}"},       {"punct", "\\p{P}\\p{S}"},
                   {"cntrl", "\\p{Cc}"},          {"word", WORD_CHARS},
                   {"xdigit", "0-9A-Fa-f"}};
      if (i + 1 < r->n && r->src[i + 1] == ':') {
        const char *end = memchr(r->src + i + 2, ':', r->n - i - 2);
        if (end && end + 1 < r->src + r->n && end[1] == ']') {
          const char *nm = r->src + i + 2;
          size_t nl = (size_t)(end - nm);
          if (nl && nm[0] == '^') CLASS_UNSUPPORTED("negated POSIX class at offset %zu", i);
          const char *frag = NULL;
          for (size_t k = 0; k < sizeof posix / sizeof posix[0]; k++)
            if (strlen(posix[k].name) == nl && !memcmp(posix[k].name, nm, nl)) frag = posix[k].frag;
          if (!frag) CLASS_FAIL("unknown POSIX class '%.*s' at offset %zu", (int)nl, nm, i);
          if (tail == T_RANGE) CLASS_FAIL("a range ends in a POSIX class at offset %zu", i);
          sb_puts(&body, frag);
          tail = T_SET;
          i = (size_t)(end - r->src) + 2;
          continue;
        }
      }
      CLASS_UNSUPPORTED("nested character class at offset %zu", i);
    }
    if (c == '-') {
      bool terminal = i + 1 < r->n && r->src[i + 1] == ']';
      if (tail == T_SET && !terminal) CLASS_FAIL("a range starts at a set at offset %zu", i);
      if (tail == T_NONE || tail == T_RANGE || tail == T_DONE_RANGE || terminal) {
        sb_puts(&body, "\\-");
        tail = tail == T_RANGE ? T_DONE_RANGE : T_SCALAR;
      } else {
        sb_putc(&body, '-');
        tail = T_RANGE;
      }
      i++;
      continue;
    }
    int l = u8len((unsigned char)c);
    if (c == '^' && body.n == 0)
      sb_puts(&body, "\\^");
    else if (c == '[')
      sb_puts(&body, "\\[");
    else
      sb_put(&body, r->src + i, (size_t)l);
    tail = tail == T_RANGE ? T_DONE_RANGE : T_SCALAR;
    i += (size_t)l;
  }
  CLASS_FAIL("unterminated character class at offset %zu", *ip);
done:
  free(body.p);
  return rc;
#undef CLASS_FAIL
#undef CLASS_UNSUPPORTED
}

// Rewrites pattern src[0..n) into out (PCRE2 syntax). Returns 0, or an error with r->err set.
static int rx_translate(rx_src *r, sbuf *out) {
  long atom = -1;  // where the last atom starts in out, -1 when none
  bool last_quant = false, fold = false;
  struct {
    long start;
    bool fold;
  } groups[256];
  int depth = 0;
#define EMIT_ATOM(s)      \
  do {                    \
    atom = (long)out->n;  \
    sb_puts(out, (s));    \
    last_quant = false;   \
  } while (0)
  for (size_t i = 0; i < r->n;) {
    char c = r->src[i];
    if (c == '\\') {
      char kind;
      const char *bb;
      size_t bl;
      size_t el = braced_escape(r, i, &kind, &bb, &bl);
      if (el) {
        atom = (long)out->n;
        if (kind == 'x' || kind == 'u') {
          char hx[16] = {0};
          if (bl < sizeof hx) memcpy(hx, bb, bl);
          unsigned long cp = strtoul(hx, NULL, 16);
          if (fold && cp < 128 && is_letter((char)cp))
            sb_printf(out, "[%c%c]", (char)(cp | 32), (char)(cp & ~32u));
          else {
            sb_puts(out, "\\x{");
            sb_put(out, bb, bl);
            sb_putc(out, '}');
          }
        } else if (bl == 4 && !memcmp(bb, "Word", 4)) {
          sb_puts(out, kind == 'p' ? WORD_CLASS : NON_WORD_CLASS);
        } else {
          sb_put(out, r->src + i, el);
        }
        last_quant = false;
        i += el;
        continue;
      }
      uint32_t cp = UINT32_MAX;
      sbuf tmp = {0};
      el = fixed_escape(r, i, &tmp, &cp);
      if (el) {
        atom = (long)out->n;
        if (fold && cp < 128 && is_letter((char)cp))
          sb_printf(out, "[%c%c]", (char)(cp | 32), (char)(cp & ~32u));
        else
          sb_put(out, tmp.p, tmp.n);
        free(tmp.p);
        last_quant = false;
        i += el;
        continue;
      }
      free(tmp.p);
      if (i + 1 >= r->n) {
        snprintf(r->err, sizeof r->err, "pattern ends in a lone backslash");
        return LKS_EFORMAT;
      }
      char e = r->src[i + 1];
      int el2 = u8len((unsigned char)e);
      switch (e) {
        case 'G': break;  // the reference drops \G
        case '\n': EMIT_ATOM("\\n"); break;
        case '\r': EMIT_ATOM("\\r"); break;
        case '\t': EMIT_ATOM("\\t"); break;
        case '\f': EMIT_ATOM("\\f"); break;
        case '\v': case 'v': EMIT_ATOM("\\x{B}"); break;
        case 'A': EMIT_ATOM("\\A"); break;
        case 'z': EMIT_ATOM("\\z"); break;
        case 'Z': EMIT_ATOM("(?=\\n?\\z)"); break;
        case 'h': EMIT_ATOM("[0-9A-Fa-f]"); break;
        case 'H': EMIT_ATOM("[^0-9A-Fa-f]"); break;
        case 'w': EMIT_ATOM(WORD_CLASS); break;
        case 'W': EMIT_ATOM(NON_WORD_CLASS); break;
        case 'd': EMIT_ATOM("\\p{Nd}"); break;
        case 'D': EMIT_ATOM("\\P{Nd}"); break;
        case 's': EMIT_ATOM("\\p{White_Space}"); break;
        case 'S': EMIT_ATOM("\\P{White_Space}"); break;
        case 'b':
          EMIT_ATOM("(?:(?<!" WORD_CLASS ")(?=" WORD_CLASS ")|(?<=" WORD_CLASS ")(?!" WORD_CLASS "))");
          break;
        case 'B':
          EMIT_ATOM("(?:(?<!" WORD_CLASS ")(?!" WORD_CLASS ")|(?<=" WORD_CLASS ")(?=" WORD_CLASS "))");
          break;
        case 'a': EMIT_ATOM("\\x{7}"); break;
        case 'e': EMIT_ATOM("\\x{1B}"); break;
        default:
          atom = (long)out->n;
          if (is_alnum(e) || (unsigned char)e < 0x80) {
            sb_putc(out, '\\');
            sb_putc(out, e);
          } else {
            sb_put(out, r->src + i + 1, (size_t)el2);  // an escaped non-ASCII char is itself
          }
          last_quant = false;
          break;
      }
      i += 1 + (size_t)el2;
      continue;
    }
    switch (c) {
      case '[': {
        long at = (long)out->n;
        int rc = rx_class(r, &i, fold, out);
        if (rc < 0) return rc;
        atom = at;
        last_quant = false;
        continue;
      }
      case ']': EMIT_ATOM("\\]"); i++; continue;
      case '.': EMIT_ATOM("[^\\n]"); i++; continue;
      case '^': EMIT_ATOM("(?:\\A|(?<=\\n))"); i++; continue;
      case '$': EMIT_ATOM("(?:(?=\\n)|\\z)"); i++; continue;
      case '(': {
        if (depth == (int)(sizeof groups / sizeof groups[0])) {
          snprintf(r->err, sizeof r->err, "groups nested too deeply");
          return LKS_EUNSUPPORTED;
        }
        groups[depth].start = (long)out->n;
        groups[depth].fold = fold;
        depth++;
        const char *s = r->src + i;
        size_t left = r->n - i;
        if (left >= 4 && !memcmp(s, "(?i:", 4)) {
          fold = true;
          sb_puts(out, "(?:");
          i += 4;
        } else if (left >= 3 && !memcmp(s, "(?>", 3)) {
          sb_puts(out, "(?:");
          i += 3;
        } else if (left >= 2 && s[1] == '?') {
          size_t pl = 0;
          if (left >= 3 && (s[2] == ':' || s[2] == '=' || s[2] == '!'))
            pl = 3;
          else if (left >= 4 && s[2] == '<' && (s[3] == '=' || s[3] == '!'))
            pl = 4;
          else if (left >= 4 && s[2] == '<' && (is_letter(s[3]) || s[3] == '_')) {
            const char *gt = memchr(s + 3, '>', left - 3);
            if (gt) pl = (size_t)(gt - s) + 1;
          }
          if (!pl) {
            snprintf(r->err, sizeof r->err, "unsupported group syntax at offset %zu", i);
            return LKS_EFORMAT;
          }
          sb_put(out, s, pl);
          i += pl;
        } else {
          sb_putc(out, '(');
          i++;
        }
        last_quant = false;
        continue;
      }
      case ')':
        sb_putc(out, ')');
        if (depth > 0) {
          depth--;
          atom = groups[depth].start;
          fold = groups[depth].fold;
        } else {
          atom = -1;
          fold = false;
        }
        last_quant = false;
        i++;
        continue;
      case '|':
        sb_putc(out, '|');
        atom = -1;
        last_quant = false;
        i++;
        continue;
      case '{': {
        // {n}, {n,}, {n,m}, {,m}
        size_t k = i + 1;
        size_t d1 = 0, d2 = 0;
        bool comma = false;
        while (k < r->n && r->src[k] >= '0' && r->src[k] <= '9') k++, d1++;
        if (k < r->n && r->src[k] == ',') {
          comma = true;
          k++;
          while (k < r->n && r->src[k] >= '0' && r->src[k] <= '9') k++, d2++;
        }
        bool ok = k < r->n && r->src[k] == '}' && (d1 || (comma && d2));
        if (!ok || atom < 0) {
          EMIT_ATOM("\\{");
          i++;
          continue;
        }
        sbuf q = {0};
        sb_putc(&q, '{');
        if (!d1) sb_putc(&q, '0');
        sb_put(&q, r->src + i + 1, k - i - 1);
        sb_putc(&q, '}');
        i = k + 1;
        if (i < r->n && (r->src[i] == '+' || r->src[i] == '*')) {
          // Oniguruma stacks the quantifiers: X{n}+ is (?:X{n})+.
          sbuf a = {0};
          sb_put(&a, out->p + atom, out->n - (size_t)atom);
          out->n = (size_t)atom;
          sb_puts(out, "(?:");
          sb_put(out, a.p, a.n);
          sb_put(out, q.p, q.n);
          sb_putc(out, ')');
          sb_putc(out, r->src[i]);
          free(a.p);
          i++;
        } else {
          sb_put(out, q.p, q.n);
        }
        free(q.p);
        last_quant = true;
        continue;
      }
      case '}': EMIT_ATOM("\\}"); i++; continue;
      case '+':
        if (!last_quant) sb_putc(out, '+');  // a possessive '+' becomes greedy, as in the reference
        last_quant = true;
        i++;
        continue;
      case '*':
      case '?':
        sb_putc(out, c);
        last_quant = true;
        i++;
        continue;
      default: {
        atom = (long)out->n;
        if (fold && is_letter(c))
          sb_printf(out, "[%c%c]", (char)(c | 32), (char)(c & ~32));
        else
          sb_put(out, r->src + i, (size_t)u8len((unsigned char)c));
        last_quant = false;
        i += (size_t)u8len((unsigned char)c);
        continue;
      }
    }
  }
#undef EMIT_ATOM
  return out->oom ? lks_set_error(LKS_ENOMEM, "out of memory") : 0;
}

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
    *re = rx_compile_raw(json_string_value(str), json_string_length(str), PCRE2_LITERAL, err,
                         sizeof err);
    if (!*re) return lks_set_error(LKS_EFORMAT, "%s: %s.String: %s", t->what, path, err);
  } else if (rx) {
    if (!json_is_string(rx))
      return lks_set_error(LKS_EFORMAT, "%s: %s.Regex must be a string", t->what, path);
    rx_src r = {.src = json_string_value(rx), .n = json_string_length(rx)};
    sbuf out = {0};
    int rc = rx_translate(&r, &out);
    if (rc == LKS_ENOMEM || out.oom) {
      free(out.p);
      return lks_set_error(LKS_ENOMEM, "out of memory");
    }
    if (rc == 0) {
      *re = rx_compile_raw(out.p ? out.p : "", out.n, 0, r.err, sizeof r.err);
      if (!*re) rc = LKS_EFORMAT;
    }
    free(out.p);
    if (rc < 0)
      return lks_set_error(rc, "%s: %s.Regex: invalid regex /%s/: %s", t->what, path,
                           json_string_value(rx), r.err);
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
  sbuf b = {0};
  int n_byte = 0;
  json_object_foreach(vocab, key, val) {
    int id = (int)json_integer_value(val);
    if (t->flags[id] & F_VOCAB) {
      free(b.p);
      return lks_set_error(LKS_EFORMAT, "%s: model.vocab: id %d is given to two tokens", t->what, id);
    }
    b.n = 0;
    size_t kl = strlen(key);
    bool bl = bytelevel_to_bytes(key, kl, &b);
    if (b.oom) break;
    int rc = bl ? arena_add(t, arena_cap, b.p ? b.p : "", b.n, &t->off[id])
                : arena_add(t, arena_cap, key, kl, &t->off[id]);
    if (rc < 0) {
      free(b.p);
      return rc;
    }
    t->len[id] = (uint32_t)(bl ? b.n : kl);
    t->flags[id] = F_VOCAB | (bl ? F_BYTELEVEL : 0);
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
      if ((t->flags[id] & (F_VOCAB | F_BYTELEVEL)) == F_VOCAB) t->odd_ids[k++] = id;
  }
  LKS_TRY(bmap_build(t, n_byte));
  for (int b2 = 0; b2 < 256; b2++) {
    char c = (char)b2;
    t->byte_id[b2] = bmap_get(t, &c, 1);
  }
  return 0;
}

// A merge side ("Ġt"): its id; -2 when it is not a byte-level string (the merge can never
// apply); an error when it is not in the vocabulary.
static int merge_side(lks_tokenizer *t, const char *s, size_t n, int rank, const char *whole,
                      sbuf *tmp, int32_t *id) {
  tmp->n = 0;
  if (!bytelevel_to_bytes(s, n, tmp)) {
    *id = -2;
    return 0;
  }
  if (tmp->oom) return lks_set_error(LKS_ENOMEM, "out of memory");
  *id = bmap_get(t, tmp->p ? tmp->p : "", tmp->n);
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
  sbuf tmp = {0}, cat = {0};
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
    sb_put(&cat, t->arena + t->off[ia], t->len[ia]);
    sb_put(&cat, t->arena + t->off[ib], t->len[ib]);
    if (cat.oom) {
      rc = lks_set_error(LKS_ENOMEM, "out of memory");
      break;
    }
    int32_t im = bmap_get(t, cat.p, cat.n);
    if (im < 0) {
      rc = lks_set_error(LKS_EFORMAT, "%s: model.merges[%zu] (%s): the merged token '%.*s%.*s' is not in the vocabulary",
                         t->what, r, whole, (int)al, a, (int)bl, b);
      break;
    }
    merge_put(t, ia, ib, (int32_t)r, im);
  }
  free(tmp.p);
  free(cat.p);
  return rc;
}

static int parse_added(lks_tokenizer *t, json_t *arr, size_t *arena_cap) {
  if (!arr || json_is_null(arr)) return 0;
  if (!json_is_array(arr))
    return lks_set_error(LKS_EFORMAT, "%s: added_tokens must be an array, not %s", t->what, jtype(arr));
  size_t n = json_array_size(arr);
  t->added = calloc(n ? n : 1, sizeof *t->added);
  if (!t->added) return lks_set_error(LKS_ENOMEM, "out of memory");
  // Grow the id space to cover every added id.
  int max_id = t->n_ids - 1;
  for (size_t i = 0; i < n; i++) {
    json_t *a = json_array_get(arr, i), *id = json_object_get(a, "id"),
           *content = json_object_get(a, "content");
    if (!json_is_object(a))
      return lks_set_error(LKS_EFORMAT, "%s: added_tokens[%zu] must be an object, not %s", t->what, i,
                           jtype(a));
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT_MAX / 2)
      return lks_set_error(LKS_EFORMAT, "%s: added_tokens[%zu].id must be a non-negative integer", t->what, i);
    if (!json_is_string(content) || json_string_length(content) == 0)
      return lks_set_error(LKS_EFORMAT, "%s: added_tokens[%zu].content must be a non-empty string",
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
    added_token *at = &t->added[t->n_added];
    snprintf(path, sizeof path, "added_tokens[%zu]", i);
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
    LKS_TRY(arena_add(t, arena_cap, at->content, at->len, &off));
    t->off[at->id] = off;
    t->len[at->id] = (uint32_t)at->len;
    t->flags[at->id] = (uint8_t)((t->flags[at->id] & ~F_BYTELEVEL) | F_ADDED | (at->special ? F_SPECIAL : 0));
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
  norm_step st = {0};
  if (!strcmp(type, "NFC")) st.kind = NORM_NFC;
  else if (!strcmp(type, "NFD")) st.kind = NORM_NFD;
  else if (!strcmp(type, "NFKC")) st.kind = NORM_NFKC;
  else if (!strcmp(type, "NFKD")) st.kind = NORM_NFKD;
  else if (!strcmp(type, "Replace") || !strcmp(type, "Prepend")) {
    bool rep = type[0] == 'R';
    json_t *txt = json_object_get(n, rep ? "content" : "prepend");
    if (!json_is_string(txt))
      return lks_set_error(LKS_EFORMAT, "%s: %s.%s must be a string", t->what, path,
                           rep ? "content" : "prepend");
    st.kind = rep ? NORM_REPLACE : NORM_PREPEND;
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
  norm_step *p = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *p);
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
  if (t->n_pre && t->pre[t->n_pre - 1].kind == PRE_BYTELEVEL)
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
  pre_step st = {0};
  char sub[256];
  if (!strcmp(type, "Split")) {
    st.kind = PRE_SPLIT;
    json_t *beh = json_object_get(p, "behavior");
    if (!json_is_string(beh))
      return lks_set_error(LKS_EFORMAT, "%s: %s.behavior must be a string", t->what, path);
    bool invert;
    LKS_TRY(get_bool(t, p, "invert", path, false, &invert));
    const char *b = json_string_value(beh);
    if (invert) st.mode = SPLIT_INVERT;
    else if (!strcmp(b, "Isolated")) st.mode = SPLIT_ISOLATED;
    else if (!strcmp(b, "Removed")) st.mode = SPLIT_REMOVED;
    else
      return lks_set_error(LKS_EUNSUPPORTED, "%s: %s.behavior '%s' is not supported (Isolated, Removed)",
                           t->what, path, b);
    snprintf(sub, sizeof sub, "%s.pattern", path);
    LKS_TRY(compile_pattern(t, json_object_get(p, "pattern"), sub, &st.re));
  } else if (!strcmp(type, "ByteLevel")) {
    st.kind = PRE_BYTELEVEL;
    bool use_regex;
    LKS_TRY(get_bool(t, p, "add_prefix_space", path, false, &st.prefix_space));
    LKS_TRY(get_bool(t, p, "use_regex", path, true, &use_regex));
    if (use_regex) {
      char err[200];
      st.re = rx_compile_raw(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, err, sizeof err);
      if (!st.re) return lks_set_error(LKS_EFORMAT, "internal: GPT-2 pattern: %s", err);
      pcre2_jit_compile(st.re, PCRE2_JIT_COMPLETE);
    }
  } else {
    return lks_set_error(LKS_EUNSUPPORTED, "%s: %s: pre-tokenizer '%s' is not supported", t->what, path,
                         type);
  }
  pre_step *np = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *np);
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

static int lookup_any(const lks_tokenizer *t, const char *s) {
  return lks_tokenizer_token_id(t, s);
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
      int tid = lookup_any(t, json_string_value(id));
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

static int normalize(const lks_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n);

static int build_tries(lks_tokenizer *t, bool has_normalizer) {
  for (int i = 0; i < t->n_added; i++) {
    added_token *a = &t->added[i];
    if (a->normalized && has_normalizer) {
      LKS_TRY(normalize(t, a->content, a->len, &a->norm, &a->norm_len));
      LKS_TRY(trie_add(&t->norm_trie, a->norm, a->norm_len, i));
    } else {
      LKS_TRY(trie_add(&t->raw_trie, a->content, a->len, i));
    }
  }
  return 0;
}

lks_tokenizer *lks_tokenizer_parse(const char *text, size_t len, const char *what) {
  byte_map_init();
  lks_tokenizer *t = calloc(1, sizeof *t);
  json_t *root = NULL;
  if (!t || !(t->what = strdup(what))) {
    lks_set_error(LKS_ENOMEM, "out of memory");
    goto fail;
  }
  t->unk_id = -1;
  trie_init(&t->raw_trie);
  trie_init(&t->norm_trie);
  json_error_t je;
  root = json_loadb(text, len, 0, &je);
  if (!root) {
    lks_set_error(LKS_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", what, je.text, je.line,
                  je.column);
    goto fail;
  }
  if (!json_is_object(root)) {
    lks_set_error(LKS_EFORMAT, "%s: the top level must be an object, not %s", what, jtype(root));
    goto fail;
  }
  json_t *model = json_object_get(root, "model");
  size_t arena_cap = 0;
  if (parse_model(t, model, &arena_cap) < 0) goto fail;
  if (fill_vocab(t, json_object_get(model, "vocab"), &arena_cap) < 0) goto fail;
  if (fill_merges(t, json_object_get(model, "merges")) < 0) goto fail;
  json_t *norm = json_object_get(root, "normalizer");
  if (parse_normalizer(t, norm, "normalizer") < 0) goto fail;
  if (parse_added(t, json_object_get(root, "added_tokens"), &arena_cap) < 0)
    goto fail;
  json_t *unk = json_object_get(model, "unk_token");
  if (unk && !json_is_null(unk)) {
    if (!json_is_string(unk)) {
      lks_set_error(LKS_EFORMAT, "%s: model.unk_token must be a string or null", what);
      goto fail;
    }
    t->unk_id = lks_tokenizer_token_id(t, json_string_value(unk));
  }
  if (parse_pre(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer") < 0) goto fail;
  if (t->n_pre == 0 || t->pre[t->n_pre - 1].kind != PRE_BYTELEVEL) {
    lks_set_error(LKS_EUNSUPPORTED, "%s: pre_tokenizer: not a byte-level BPE (no ByteLevel pre-tokenizer at the end)",
                  what);
    goto fail;
  }
  if (parse_decoder(t, json_object_get(root, "decoder"), "decoder") < 0) goto fail;
  if (parse_post(t, json_object_get(root, "post_processor"), "post_processor") < 0) goto fail;
  // A normalizer object, even an empty Sequence, makes "normalized" added tokens match after
  // normalization (the reference's rule).
  if (build_tries(t, norm && !json_is_null(norm)) < 0) goto fail;
  json_decref(root);
  int n_added_special = 0;
  for (int i = 0; i < t->n_added; i++) n_added_special += t->added[i].special;
  LKS_LOG(LKS_LOG_DEBUG, "%s: %d ids, %d added tokens (%d special), %d normalizer and %d pre-tokenizer steps",
          what, t->n_ids, t->n_added, n_added_special, t->n_norm, t->n_pre);
  return t;
fail:
  json_decref(root);
  lks_tokenizer_free(t);
  return NULL;
}

static char *read_file(const char *path, size_t *len, bool missing_ok) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (!(missing_ok && errno == ENOENT))
      lks_set_error(LKS_EIO, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  sbuf b = {0};
  char chunk[1 << 16];
  size_t k;
  while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) sb_put(&b, chunk, k);
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

lks_tokenizer *lks_tokenizer_load(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    lks_set_error(LKS_ENOTFOUND, "%s: %s", path, strerror(errno));
    return NULL;
  }
  char file[4096], conf[4096];
  bool dir = S_ISDIR(st.st_mode);
  snprintf(file, sizeof file, dir ? "%s/tokenizer.json" : "%s", path);
  size_t len;
  char *text = read_file(file, &len, false);
  if (!text) return NULL;
  lks_tokenizer *t = lks_tokenizer_parse(text, len, file);
  free(text);
  if (!t) return NULL;
  // tokenizer_config.json beside it: only its chat_template is used.
  snprintf(conf, sizeof conf, "%s", file);
  char *slash = strrchr(conf, '/');
  snprintf(slash ? slash + 1 : conf, sizeof conf - (size_t)(slash ? slash + 1 - conf : 0),
           "tokenizer_config.json");
  size_t cl;
  char *ctext = read_file(conf, &cl, true);
  if (ctext) {
    json_error_t je;
    json_t *c = json_loadb(ctext, cl, JSON_DECODE_INT_AS_REAL, &je);
    free(ctext);
    if (!c || !json_is_object(c)) {
      lks_set_error(LKS_EFORMAT, "%s: not a JSON object%s%s", conf, c ? "" : ": ", c ? "" : je.text);
      json_decref(c);
      lks_tokenizer_free(t);
      return NULL;
    }
    json_t *ct = json_object_get(c, "chat_template");
    if (json_is_string(ct)) t->chat_template = strdup(json_string_value(ct));
    json_decref(c);
  }
  return t;
}

void lks_tokenizer_free(lks_tokenizer *t) {
  if (!t) return;
  free(t->what);
  free(t->off);
  free(t->len);
  free(t->flags);
  free(t->arena);
  free(t->vocab.slot);
  free(t->merges);
  free(t->odd_ids);
  for (int i = 0; i < t->n_added; i++) {
    free(t->added[i].content);
    free(t->added[i].norm);
  }
  free(t->added);
  free(t->raw_trie.n);
  free(t->norm_trie.n);
  for (int i = 0; i < t->n_norm; i++) {
    pcre2_code_free(t->norm[i].re);
    free(t->norm[i].text);
  }
  free(t->norm);
  for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
  free(t->pre);
  free(t->tmpl);
  free(t->chat_template);
  free(t);
}

int lks_tokenizer_n_ids(const lks_tokenizer *t) { return t->n_ids; }

int lks_tokenizer_token_id(const lks_tokenizer *t, const char *s) {
  size_t n = strlen(s);
  for (int i = 0; i < t->n_added; i++)
    if (t->added[i].len == n && !memcmp(t->added[i].content, s, n)) return t->added[i].id;
  sbuf b = {0};
  int id = -1;
  if (bytelevel_to_bytes(s, n, &b) && !b.oom) id = bmap_get(t, b.p ? b.p : "", b.n);
  free(b.p);
  if (id >= 0) return id;
  for (int i = 0; i < t->n_odd; i++) {
    int o = t->odd_ids[i];
    if (t->len[o] == n && !memcmp(t->arena + t->off[o], s, n)) return o;
  }
  return -1;
}

bool lks_tokenizer_is_special(const lks_tokenizer *t, int id) {
  return id >= 0 && id < t->n_ids && (t->flags[id] & F_SPECIAL);
}

const char *lks_tokenizer_chat_template(const lks_tokenizer *t) { return t->chat_template; }

// ---------------------------------------------------------------------------------------------
// Encoding

typedef struct {
  int32_t id, prev, next;
} bpe_sym;

typedef struct {
  int32_t rank, left, right, left_id, right_id, new_id;
} bpe_pair;

typedef struct {
  const lks_tokenizer *t;
  ivec out;
  bpe_sym *sym;
  int sym_cap;
  bpe_pair *heap;
  int heap_n, heap_cap;
  pcre2_match_data *md;
  sbuf tmp;  // add_prefix_space
  int err;
} enc;

static inline bool pair_less(const bpe_pair *a, const bpe_pair *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(enc *e, bpe_pair p) {
  if (e->heap_n == e->heap_cap) {
    int cap = e->heap_cap ? e->heap_cap * 2 : 64;
    bpe_pair *h = realloc(e->heap, (size_t)cap * sizeof *h);
    if (!h) {
      e->err = LKS_ENOMEM;
      return;
    }
    e->heap = h;
    e->heap_cap = cap;
  }
  int i = e->heap_n++;
  while (i > 0) {
    int parent = (i - 1) / 2;
    if (!pair_less(&p, &e->heap[parent])) break;
    e->heap[i] = e->heap[parent];
    i = parent;
  }
  e->heap[i] = p;
}

static bpe_pair heap_pop(enc *e) {
  bpe_pair top = e->heap[0], last = e->heap[--e->heap_n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= e->heap_n) break;
    if (c + 1 < e->heap_n && pair_less(&e->heap[c + 1], &e->heap[c])) c++;
    if (!pair_less(&e->heap[c], &last)) break;
    e->heap[i] = e->heap[c];
    i = c;
  }
  if (e->heap_n > 0) e->heap[i] = last;
  return top;
}

static void try_pair(enc *e, int left) {
  int right = e->sym[left].next;
  if (right < 0) return;
  int32_t a = e->sym[left].id, b = e->sym[right].id;
  if (a < 0 || b < 0) return;
  const merge_slot *m = merge_get(e->t, a, b);
  if (m) heap_push(e, (bpe_pair){m->rank, left, right, a, b, m->id});
}

static void emit_unknown(enc *e) {
  if (e->t->unk_id >= 0) iv_push(&e->out, e->t->unk_id);
}

// BPE over one piece of bytes.
static void bpe(enc *e, const char *s, size_t n) {
  const lks_tokenizer *t = e->t;
  if (n == 0) return;
  if (n == 1) {
    int32_t id = t->byte_id[(unsigned char)s[0]];
    if (id >= 0) iv_push(&e->out, id);
    else emit_unknown(e);
    return;
  }
  if (t->ignore_merges) {
    int32_t id = bmap_get(t, s, n);
    if (id >= 0) {
      iv_push(&e->out, id);
      return;
    }
  }
  if ((int)n > e->sym_cap) {
    if (n > INT_MAX / 2) {
      e->err = LKS_ERANGE;
      return;
    }
    bpe_sym *p = realloc(e->sym, n * sizeof *p);
    if (!p) {
      e->err = LKS_ENOMEM;
      return;
    }
    e->sym = p;
    e->sym_cap = (int)n;
  }
  for (size_t i = 0; i < n; i++)
    e->sym[i] = (bpe_sym){t->byte_id[(unsigned char)s[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
  e->heap_n = 0;
  for (size_t i = 0; i + 1 < n; i++) try_pair(e, (int)i);
  while (e->heap_n > 0 && !e->err) {
    bpe_pair p = heap_pop(e);
    bpe_sym *l = &e->sym[p.left], *r = &e->sym[p.right];
    if (l->id != p.left_id || r->id != p.right_id || l->next != p.right) continue;
    l->id = p.new_id;
    l->next = r->next;
    if (r->next >= 0) e->sym[r->next].prev = p.left;
    r->id = -3;  // merged away
    r->next = r->prev = -1;
    if (l->prev >= 0) try_pair(e, l->prev);
    try_pair(e, p.left);
  }
  for (int i = 0; i >= 0; i = e->sym[i].next) {
    if (e->sym[i].id >= 0) iv_push(&e->out, e->sym[i].id);
    else emit_unknown(e);
  }
}

static void pretok(enc *e, int step, const char *s, size_t n);

// Next match of re in s[0..n) at or after `from`: its bounds, false when none.
static bool next_match(enc *e, pcre2_code *re, const char *s, size_t n, size_t from, uint32_t opts,
                       size_t *ms, size_t *me) {
  int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, opts | PCRE2_NO_UTF_CHECK, e->md, NULL);
  if (rc < 0) {
    if (rc != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR msg[128];
      pcre2_get_error_message(rc, msg, sizeof msg);
      lks_set_error(LKS_EINVAL, "%s: regex match failed: %s", e->t->what, (char *)msg);
      e->err = LKS_EINVAL;
    }
    return false;
  }
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
  *ms = ov[0];
  *me = ov[1];
  return true;
}

static void split_step(enc *e, int step, const pre_step *p, const char *s, size_t n) {
  size_t prev = 0, from = 0, ms, me;
  if (p->mode == SPLIT_REMOVED) {
    // JavaScript's String.prototype.split: a match anchored at each position q; empty pieces
    // are dropped afterwards.
    size_t q = 0;
    while (q < n && !e->err) {
      if (!next_match(e, p->re, s, n, q, PCRE2_ANCHORED, &ms, &me) || me == prev) {
        q += (size_t)u8len((unsigned char)s[q]);
        continue;
      }
      if (q > prev) pretok(e, step + 1, s + prev, q - prev);
      prev = me;
      q = prev;
    }
    if (n > prev) pretok(e, step + 1, s + prev, n - prev);
    return;
  }
  while (from <= n && !e->err && next_match(e, p->re, s, n, from, 0, &ms, &me)) {
    if (p->mode == SPLIT_ISOLATED && ms > prev) pretok(e, step + 1, s + prev, ms - prev);
    if (me > ms) pretok(e, step + 1, s + ms, me - ms);
    prev = me;
    from = me > ms ? me : me + (me < n ? (size_t)u8len((unsigned char)s[me]) : 1);
  }
  if (p->mode == SPLIT_ISOLATED && n > prev) pretok(e, step + 1, s + prev, n - prev);
}

static void pretok(enc *e, int step, const char *s, size_t n) {
  if (e->err || n == 0) return;
  if (step == e->t->n_pre) {
    bpe(e, s, n);
    return;
  }
  const pre_step *p = &e->t->pre[step];
  if (p->kind == PRE_SPLIT) {
    split_step(e, step, p, s, n);
    return;
  }
  // ByteLevel: optional prefix space, optional GPT-2 split (matches only), then the bytes.
  char *own = NULL;
  if (p->prefix_space && s[0] != ' ') {
    own = malloc(n + 1);
    if (!own) {
      e->err = LKS_ENOMEM;
      return;
    }
    own[0] = ' ';
    memcpy(own + 1, s, n);
    s = own;
    n++;
  }
  if (!p->re) {
    pretok(e, step + 1, s, n);
  } else {
    size_t from = 0, ms, me;
    while (from < n && !e->err && next_match(e, p->re, s, n, from, 0, &ms, &me)) {
      if (me > ms) pretok(e, step + 1, s + ms, me - ms);
      from = me > ms ? me : me + (size_t)u8len((unsigned char)s[me]);
    }
  }
  free(own);
}

// Applies pcre2 replace-all (JavaScript replaceAll semantics: empty matches too).
static int replace_all(const lks_tokenizer *t, pcre2_code *re, const char *s, size_t n,
                       const char *with, size_t wl, sbuf *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  if (!md) return lks_set_error(LKS_ENOMEM, "out of memory");
  size_t prev = 0, from = 0;
  while (from <= n) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc < 0) break;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    sb_put(out, s + prev, ov[0] - prev);
    sb_put(out, with, wl);
    prev = ov[1];
    from = ov[1] > ov[0] ? ov[1] : ov[1] + (ov[1] < n ? (size_t)u8len((unsigned char)s[ov[1]]) : 1);
  }
  sb_put(out, s + prev, n - prev);
  pcre2_match_data_free(md);
  (void)t;
  return out->oom ? lks_set_error(LKS_ENOMEM, "out of memory") : 0;
}

// Runs the normalizers over s[0..n): a malloc'd result in *out (NUL-terminated).
static int normalize(const lks_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n) {
  char *cur = malloc(n + 1);
  if (!cur) return lks_set_error(LKS_ENOMEM, "out of memory");
  memcpy(cur, s, n);
  cur[n] = '\0';
  size_t cn = n;
  for (int k = 0; k < t->n_norm; k++) {
    const norm_step *st = &t->norm[k];
    sbuf o = {0};
    switch (st->kind) {
      case NORM_NFC:
      case NORM_NFD:
      case NORM_NFKC:
      case NORM_NFKD: {
        // Nothing below U+0300 changes under any of the four forms except by compatibility
        // (NFKC/NFKD), so ASCII-and-Latin-1 text skips the library for NFC/NFD.
        bool quick = st->kind == NORM_NFC || st->kind == NORM_NFD;
        bool low = true;
        for (size_t i = 0; i < cn && low; i++) low = (unsigned char)cur[i] < 0xCC;
        if (quick && low) continue;
        utf8proc_option_t opt = UTF8PROC_STABLE;
        if (st->kind == NORM_NFC || st->kind == NORM_NFKC) opt |= UTF8PROC_COMPOSE;
        else opt |= UTF8PROC_DECOMPOSE;
        if (st->kind == NORM_NFKC || st->kind == NORM_NFKD) opt |= UTF8PROC_COMPAT;
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
      case NORM_REPLACE:
        if (replace_all(t, st->re, cur, cn, st->text, st->text_len, &o) < 0) {
          free(o.p);
          free(cur);
          return LKS_ENOMEM;
        }
        break;
      case NORM_PREPEND:
        sb_put(&o, st->text, st->text_len);
        sb_put(&o, cur, cn);
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

// The added token whose content (raw or normalized) is exactly s[0..n): its id, or -1.
static int32_t added_exact(const lks_tokenizer *t, const char *s, size_t n) {
  for (int pass = 0; pass < 2; pass++) {
    const trie *tr = pass ? &t->norm_trie : &t->raw_trie;
    if (n == 0 || !tr->count) continue;
    size_t ml = 0;
    int32_t k = trie_match(tr, s, n, &ml);
    if (k >= 0 && ml == n) return t->added[k].id;
  }
  return -1;
}

typedef struct {
  size_t off, len;
  int32_t token;  // added token index when the splitter matched it, else -1
} section;

// Splits s[0..n) on the added tokens of `tr`, then trims around lstrip/rstrip tokens.
static int split_added(const lks_tokenizer *t, const trie *tr, const char *s, size_t n,
                       section **out, int *count) {
  int cap = 8, k = 0;
  section *v = malloc((size_t)cap * sizeof *v);
  if (!v) return lks_set_error(LKS_ENOMEM, "out of memory");
  size_t start = 0, i = 0;
  while (i < n) {
    size_t ml = 0;
    int32_t a = tr->count ? trie_match(tr, s + i, n - i, &ml) : -1;
    if (a < 0) {
      i++;
      continue;
    }
    if (k + 2 > cap) {
      cap *= 2;
      section *p = realloc(v, (size_t)cap * sizeof *p);
      if (!p) {
        free(v);
        return lks_set_error(LKS_ENOMEM, "out of memory");
      }
      v = p;
    }
    if (i > start) v[k++] = (section){start, i - start, -1};
    v[k++] = (section){i, ml, a};
    i += ml;
    start = i;
  }
  if (start < n) {
    if (k + 1 > cap) {
      section *p = realloc(v, (size_t)(cap + 1) * sizeof *p);
      if (!p) {
        free(v);
        return lks_set_error(LKS_ENOMEM, "out of memory");
      }
      v = p;
    }
    v[k++] = (section){start, n - start, -1};
  }
  for (int j = 0; j < k; j++) {
    if (v[j].token < 0) continue;
    const added_token *a = &t->added[v[j].token];
    if (a->lstrip && j > 0) v[j - 1].len = trim_end(s + v[j - 1].off, v[j - 1].len);
    if (a->rstrip && j + 1 < k) {
      size_t d = trim_start(s + v[j + 1].off, v[j + 1].len);
      v[j + 1].off += d;
      v[j + 1].len -= d;
    }
  }
  *out = v;
  *count = k;
  return 0;
}

static int encode_normalized(enc *e, const char *s, size_t n) {
  const lks_tokenizer *t = e->t;
  section *sec;
  int k;
  LKS_TRY(split_added(t, &t->norm_trie, s, n, &sec, &k));
  for (int j = 0; j < k && !e->err; j++) {
    if (sec[j].len == 0) continue;
    int32_t id = added_exact(t, s + sec[j].off, sec[j].len);
    if (id >= 0) iv_push(&e->out, id);
    else pretok(e, 0, s + sec[j].off, sec[j].len);
  }
  free(sec);
  return 0;
}

int lks_tokenizer_encode(const lks_tokenizer *t, const char *text, size_t len, bool add_special,
                         int32_t **ids, int *n) {
  *ids = NULL;
  *n = 0;
  enc e = {.t = t};
  int rc = 0;
  sbuf clean = {0};
  section *sec = NULL;
  int k = 0;
  const char *s = text;
  if (!u8_valid(text, len)) {
    u8_sanitize_into(text, len, &clean);
    if (clean.oom) {
      rc = lks_set_error(LKS_ENOMEM, "out of memory");
      goto done;
    }
    s = clean.p;
    len = clean.n;
  }
  e.md = pcre2_match_data_create(4, NULL);
  if (!e.md) {
    rc = lks_set_error(LKS_ENOMEM, "out of memory");
    goto done;
  }
  if (add_special)
    for (int i = 0; i < t->n_tmpl && t->tmpl[i] >= 0; i++) iv_push(&e.out, t->tmpl[i]);
  if ((rc = split_added(t, &t->raw_trie, s, len, &sec, &k)) < 0) goto done;
  for (int j = 0; j < k && !e.err; j++) {
    const char *p = s + sec[j].off;
    size_t pl = sec[j].len;
    if (pl == 0) continue;
    int32_t id = added_exact(t, p, pl);
    if (id >= 0) {
      iv_push(&e.out, id);
      continue;
    }
    if (t->n_norm > 0) {
      char *nt;
      size_t nl;
      if ((rc = normalize(t, p, pl, &nt, &nl)) < 0) goto done;
      rc = encode_normalized(&e, nt, nl);
      free(nt);
    } else {
      rc = encode_normalized(&e, p, pl);
    }
    if (rc < 0) goto done;
  }
  if (add_special) {
    int i = 0;
    while (i < t->n_tmpl && t->tmpl[i] >= 0) i++;
    for (i++; i < t->n_tmpl; i++)
      if (t->tmpl[i] >= 0) iv_push(&e.out, t->tmpl[i]);
  }
  if (e.err) rc = e.err == LKS_ENOMEM ? lks_set_error(LKS_ENOMEM, "out of memory") : e.err;
  else if (e.out.oom) rc = lks_set_error(LKS_ENOMEM, "out of memory");
done:
  free(sec);
  free(clean.p);
  free(e.sym);
  free(e.heap);
  free(e.tmp.p);
  pcre2_match_data_free(e.md);
  if (rc < 0) {
    free(e.out.p);
    return rc;
  }
  *ids = e.out.p;
  *n = e.out.n;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Decoding

struct lks_detok {
  const lks_tokenizer *t;
  bool skip_special;
  u8state st;
  sbuf out;
};

lks_detok *lks_detok_new(const lks_tokenizer *t, bool skip_special) {
  lks_detok *d = calloc(1, sizeof *d);
  if (!d) {
    lks_set_error(LKS_ENOMEM, "out of memory");
    return NULL;
  }
  d->t = t;
  d->skip_special = skip_special;
  u8s_reset(&d->st);
  return d;
}

void lks_detok_free(lks_detok *d) {
  if (!d) return;
  free(d->out.p);
  free(d);
}

// Appends the text of one id to d->out.
static int detok_one(lks_detok *d, int32_t id) {
  const lks_tokenizer *t = d->t;
  if (id < 0 || id >= t->n_ids || !(t->flags[id] & (F_VOCAB | F_ADDED)))
    return lks_set_error(LKS_ERANGE, "token id %d is not in the vocabulary of %s", (int)id, t->what);
  uint8_t f = t->flags[id];
  if ((f & F_SPECIAL) && d->skip_special) return 0;
  const unsigned char *p = (const unsigned char *)t->arena + t->off[id];
  size_t n = t->len[id];
  if (f & F_ADDED) {
    // Added tokens are text of their own: what is held before them is decoded on its own.
    u8s_finish(&d->st, &d->out);
    sb_put(&d->out, p, n);
  } else {
    for (size_t i = 0; i < n; i++) u8s_feed(&d->st, p[i], &d->out);
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
  u8s_finish(&d->st, &d->out);
  *out = d->out.p ? d->out.p : "";
  *len = d->out.n;
  return d->out.oom ? lks_set_error(LKS_ENOMEM, "out of memory") : 0;
}

int lks_tokenizer_decode(const lks_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                         char **text, size_t *len) {
  lks_detok d = {.t = t, .skip_special = skip_special};
  u8s_reset(&d.st);
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) rc = detok_one(&d, ids[i]);
  if (rc == 0) u8s_finish(&d.st, &d.out);
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
