// SPDX-License-Identifier: MIT
// tokenizer.json's Oniguruma dialect -> PCRE2, as the reference rewrites it for JavaScript's
// Unicode mode (see regex.h). One pass over the pattern; the translator remembers where the last
// atom starts in the output (for X{n}+ stacking) and whether (?i:...) is in force.
#include "text/regex.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/buf.h"
#include "text/utf8.h"

#define WORD_CHARS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define WORD_CLASS "[" WORD_CHARS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}]"
#define NON_WORD_CLASS "[^" WORD_CHARS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}]"

typedef struct {
  const char *src;
  size_t n;
  char *err;  // LKS_REGEX_ERRLEN bytes
  lks__buf *out;
  long atom;  // where the last atom starts in out, -1 when none
  bool last_quant, fold;
  struct {
    long start;
    bool fold;
  } groups[256];
  int depth;
} rx;

// What a character class has seen last: whether a '-' after it would make a range.
typedef enum { T_NONE, T_SCALAR, T_SET, T_RANGE, T_DONE_RANGE } class_tail;

static int rx_fail(rx *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rx_fail(rx *r, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, LKS_REGEX_ERRLEN, fmt, ap);
  va_end(ap);
  return rc;
}

static bool is_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static void emit_atom(rx *r, const char *s) {
  r->atom = (long)r->out->n;
  lks__buf_puts(r->out, s);
  r->last_quant = false;
}

// Braced escape \p{..} \P{..} \x{..} \u{..} at src[i]: its body and total length, or 0.
static size_t braced_escape(const rx *r, size_t i, char *kind, const char **body, size_t *blen) {
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

static size_t hex_run(const rx *r, size_t i, size_t max) {
  size_t k = 0;
  while (k < max && i + k < r->n) {
    char c = r->src[i + k];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) break;
    k++;
  }
  return k;
}

// A fixed-width escape \xHH, \uHHHH, \cX: writes its PCRE2 form, returns its length or 0.
static size_t fixed_escape(const rx *r, size_t i, lks__buf *out, uint32_t *cp) {
  if (i + 1 >= r->n || r->src[i] != '\\') return 0;
  char k = r->src[i + 1];
  if (k == 'x' && hex_run(r, i + 2, 2) == 2) {
    *cp = (uint32_t)strtoul((char[]){r->src[i + 2], r->src[i + 3], 0}, NULL, 16);
    lks__buf_printf(out, "\\x{%X}", *cp);
    return 4;
  }
  if (k == 'u' && hex_run(r, i + 2, 4) == 4) {
    char h[5] = {r->src[i + 2], r->src[i + 3], r->src[i + 4], r->src[i + 5], 0};
    *cp = (uint32_t)strtoul(h, NULL, 16);
    lks__buf_printf(out, "\\x{%X}", *cp);
    return 6;
  }
  if (k == 'c' && i + 2 < r->n && is_letter(r->src[i + 2])) {
    lks__buf_put(out, r->src + i, 3);
    *cp = UINT32_MAX;
    return 3;
  }
  return 0;
}

pcre2_code *lks_regex_compile(const char *pat, size_t n, uint32_t opts, char *err, size_t errlen) {
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

// ---------------------------------------------------------------------------------------------
// Character classes

// ASCII letters whose other case a class must gain inside (?i:...): the reference adds, for each
// letter the class holds in one case only, the other case.
static int class_fold_additions(rx *r, const char *body, size_t n, lks__buf *add) {
  lks__buf pat = {0};
  lks__buf_puts(&pat, "^[");
  lks__buf_put(&pat, body, n);
  lks__buf_puts(&pat, "]$");
  if (pat.oom) return lks_set_error(LKS_ENOMEM, "out of memory");
  pcre2_code *re = lks_regex_compile(pat.p, pat.n, 0, r->err, LKS_REGEX_ERRLEN);
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
    if (up != lo) lks__buf_putc(add, up ? lc : c);
  }
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return 0;
}

// An escape inside a class at src[*ip]: appends its PCRE2 form to body, advances *ip, and says
// whether it stands for a set (which cannot end a range).
static int class_escape(rx *r, size_t *ip, lks__buf *body, bool *set_valued) {
  size_t i = *ip;
  char kind;
  const char *bb;
  size_t bl;
  uint32_t cp;
  *set_valued = false;
  size_t el = braced_escape(r, i, &kind, &bb, &bl);
  if (el) {
    if ((kind == 'p' || kind == 'P') && bl == 4 && !memcmp(bb, "Word", 4)) {
      if (kind == 'P')
        return rx_fail(r, LKS_EUNSUPPORTED, "\\P{Word} inside a character class at offset %zu", i);
      lks__buf_puts(body, WORD_CHARS);
    } else if (kind == 'x' || kind == 'u') {
      lks__buf_puts(body, "\\x{");
      lks__buf_put(body, bb, bl);
      lks__buf_putc(body, '}');
    } else {
      lks__buf_put(body, r->src + i, el);
    }
    *set_valued = kind == 'p' || kind == 'P';
    *ip = i + el;
    return 0;
  }
  if ((el = fixed_escape(r, i, body, &cp))) {
    *ip = i + el;
    return 0;
  }
  if (i + 1 >= r->n)
    return rx_fail(r, LKS_EFORMAT, "unterminated escape in a character class at offset %zu", i);
  char e = r->src[i + 1];
  *ip = i + 2;
  switch (e) {
    case '\n': lks__buf_puts(body, "\\n"); break;
    case '\r': lks__buf_puts(body, "\\r"); break;
    case '\t': lks__buf_puts(body, "\\t"); break;
    case '\f': lks__buf_puts(body, "\\f"); break;
    case '\v': case 'v': lks__buf_puts(body, "\\x{B}"); break;
    case 'W': case 'H':
      return rx_fail(r, LKS_EUNSUPPORTED, "\\%c inside a character class at offset %zu", e, i);
    case 'h': lks__buf_puts(body, "0-9A-Fa-f"); *set_valued = true; break;
    case 'w': lks__buf_puts(body, WORD_CHARS); *set_valued = true; break;
    case 'd': lks__buf_puts(body, "\\p{Nd}"); *set_valued = true; break;
    case 'D': lks__buf_puts(body, "\\P{Nd}"); *set_valued = true; break;
    case 's': lks__buf_puts(body, "\\p{White_Space}"); *set_valued = true; break;
    case 'S': lks__buf_puts(body, "\\P{White_Space}"); *set_valued = true; break;
    case 'a': lks__buf_puts(body, "\\x{7}"); break;
    case 'e': lks__buf_puts(body, "\\x{1B}"); break;
    default:
      lks__buf_putc(body, '\\');
      lks__buf_putc(body, e);
      break;
  }
  return 0;
}

// A '[' inside a class at src[*ip]: a POSIX class [:name:] is spelled out into body (advancing
// *ip); anything else is a nested class, which is refused.
static int class_posix(rx *r, size_t *ip, class_tail tail, lks__buf *body) {
  static const struct {
    const char *name, *frag;
  } posix[] = {{"alpha", "\\p{Alphabetic}"}, {"alnum", "\\p{Alphabetic}\\p{Nd}"},
               {"digit", "\\p{Nd}"},          {"lower", "\\p{Lowercase}"},
               {"upper", "\\p{Uppercase}"},   {"space", "\\p{White_Space}"},
               {"blank", "\\t\\p{Zs}"},       {"punct", "\\p{P}\\p{S}"},
               {"cntrl", "\\p{Cc}"},          {"word", WORD_CHARS},
               {"xdigit", "0-9A-Fa-f"}};
  size_t i = *ip;
  if (i + 1 < r->n && r->src[i + 1] == ':') {
    const char *end = memchr(r->src + i + 2, ':', r->n - i - 2);
    if (end && end + 1 < r->src + r->n && end[1] == ']') {
      const char *nm = r->src + i + 2;
      size_t nl = (size_t)(end - nm);
      if (nl && nm[0] == '^')
        return rx_fail(r, LKS_EUNSUPPORTED, "negated POSIX class at offset %zu", i);
      const char *frag = NULL;
      for (size_t k = 0; k < sizeof posix / sizeof posix[0]; k++)
        if (strlen(posix[k].name) == nl && !memcmp(posix[k].name, nm, nl)) frag = posix[k].frag;
      if (!frag)
        return rx_fail(r, LKS_EFORMAT, "unknown POSIX class '%.*s' at offset %zu", (int)nl, nm, i);
      if (tail == T_RANGE)
        return rx_fail(r, LKS_EFORMAT, "a range ends in a POSIX class at offset %zu", i);
      lks__buf_puts(body, frag);
      *ip = (size_t)(end - r->src) + 2;
      return 0;
    }
  }
  return rx_fail(r, LKS_EUNSUPPORTED, "nested character class at offset %zu", i);
}

// Writes the finished class [body] (or [^body]) to the output, with the fold additions.
static int class_emit(rx *r, bool neg, const lks__buf *body) {
  lks__buf add = {0};
  if (r->fold) {
    int rc = class_fold_additions(r, body->p, body->n, &add);
    if (rc < 0) {
      free(add.p);
      return rc;
    }
  }
  lks__buf_putc(r->out, '[');
  if (neg) lks__buf_putc(r->out, '^');
  lks__buf_put(r->out, body->p, body->n);
  if (add.n) lks__buf_put(r->out, add.p, add.n);
  lks__buf_putc(r->out, ']');
  free(add.p);
  return 0;
}

// The body of the class opened at src[open] ('['), from src[*ip]: appends to body until the
// closing ']', where *ip is left.
static int class_body(rx *r, size_t open, size_t *ip, lks__buf *body) {
  size_t i = *ip, first = i;
  class_tail tail = T_NONE;
  while (i < r->n) {
    char c = r->src[i];
    if (c == '\\') {
      bool set_valued;
      int rc = class_escape(r, &i, body, &set_valued);
      if (rc < 0) return rc;
      if (set_valued && tail == T_RANGE)
        return rx_fail(r, LKS_EFORMAT, "a range ends in a set-valued escape at offset %zu", i);
      tail = tail == T_RANGE ? T_DONE_RANGE : set_valued ? T_SET : T_SCALAR;
      continue;
    }
    if (c == ']') {
      if (i == first) {
        lks__buf_puts(body, "\\]");
        tail = T_SCALAR;
        i++;
        continue;
      }
      if (tail == T_NONE) return rx_fail(r, LKS_EFORMAT, "empty character class at offset %zu", open);
      *ip = i;
      return 0;
    }
    if (c == '&' && i + 1 < r->n && r->src[i + 1] == '&')
      return rx_fail(r, LKS_EUNSUPPORTED, "character-class intersection '&&' at offset %zu", i);
    if (c == '[') {
      int rc = class_posix(r, &i, tail, body);
      if (rc < 0) return rc;
      tail = T_SET;
      continue;
    }
    if (c == '-') {
      bool terminal = i + 1 < r->n && r->src[i + 1] == ']';
      if (tail == T_SET && !terminal)
        return rx_fail(r, LKS_EFORMAT, "a range starts at a set at offset %zu", i);
      if (tail == T_NONE || tail == T_RANGE || tail == T_DONE_RANGE || terminal) {
        lks__buf_puts(body, "\\-");
        tail = tail == T_RANGE ? T_DONE_RANGE : T_SCALAR;
      } else {
        lks__buf_putc(body, '-');
        tail = T_RANGE;
      }
      i++;
      continue;
    }
    int l = lks__utf8_len((unsigned char)c);
    if (c == '^' && body->n == 0)
      lks__buf_puts(body, "\\^");
    else if (c == '[')
      lks__buf_puts(body, "\\[");
    else
      lks__buf_put(body, r->src + i, (size_t)l);
    tail = tail == T_RANGE ? T_DONE_RANGE : T_SCALAR;
    i += (size_t)l;
  }
  return rx_fail(r, LKS_EFORMAT, "unterminated character class at offset %zu", open);
}

// Translates the character class at src[*ip] ('['); advances *ip past its ']'.
static int rx_class(rx *r, size_t *ip) {
  size_t i = *ip + 1;
  bool neg = i < r->n && r->src[i] == '^';
  if (neg) i++;
  lks__buf body = {0};
  int rc = class_body(r, *ip, &i, &body);
  if (rc == 0) rc = class_emit(r, neg, &body);
  if (rc == 0) *ip = i + 1;
  free(body.p);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Outside classes

// A letter inside (?i:...) matches both cases.
static void emit_char(rx *r, uint32_t cp, const lks__buf *as) {
  r->atom = (long)r->out->n;
  if (r->fold && cp < 128 && is_letter((char)cp))
    lks__buf_printf(r->out, "[%c%c]", (char)(cp | 32), (char)(cp & ~32u));
  else if (as->oom)
    r->out->oom = true;
  else if (as->n)
    lks__buf_put(r->out, as->p, as->n);
  r->last_quant = false;
}

// A braced or fixed-width escape at src[*ip]; false when it is neither.
static bool rx_escape_code(rx *r, size_t *ip) {
  size_t i = *ip;
  char kind;
  const char *bb;
  size_t bl;
  size_t el = braced_escape(r, i, &kind, &bb, &bl);
  if (el) {
    if (kind == 'x' || kind == 'u') {
      char hx[16] = {0};
      if (bl < sizeof hx) memcpy(hx, bb, bl);
      lks__buf as = {0};
      lks__buf_puts(&as, "\\x{");
      lks__buf_put(&as, bb, bl);
      lks__buf_putc(&as, '}');
      unsigned long cp = strtoul(hx, NULL, 16);
      emit_char(r, cp < 128 ? (uint32_t)cp : UINT32_MAX, &as);
      free(as.p);
    } else {
      r->atom = (long)r->out->n;
      if (bl == 4 && !memcmp(bb, "Word", 4))
        lks__buf_puts(r->out, kind == 'p' ? WORD_CLASS : NON_WORD_CLASS);
      else
        lks__buf_put(r->out, r->src + i, el);
      r->last_quant = false;
    }
    *ip = i + el;
    return true;
  }
  uint32_t cp = UINT32_MAX;
  lks__buf tmp = {0};
  el = fixed_escape(r, i, &tmp, &cp);
  if (el) {
    emit_char(r, cp, &tmp);
    *ip = i + el;
  }
  free(tmp.p);
  return el > 0;
}

// An escape outside a class at src[*ip] ('\\'); advances *ip past it.
static int rx_escape(rx *r, size_t *ip) {
  if (rx_escape_code(r, ip)) return 0;
  size_t i = *ip;
  if (i + 1 >= r->n) return rx_fail(r, LKS_EFORMAT, "pattern ends in a lone backslash");
  char e = r->src[i + 1];
  int el = lks__utf8_len((unsigned char)e);
  switch (e) {
    case 'G': break;  // the reference drops \G
    case '\n': emit_atom(r, "\\n"); break;
    case '\r': emit_atom(r, "\\r"); break;
    case '\t': emit_atom(r, "\\t"); break;
    case '\f': emit_atom(r, "\\f"); break;
    case '\v': case 'v': emit_atom(r, "\\x{B}"); break;
    case 'A': emit_atom(r, "\\A"); break;
    case 'z': emit_atom(r, "\\z"); break;
    case 'Z': emit_atom(r, "(?=\\n?\\z)"); break;
    case 'h': emit_atom(r, "[0-9A-Fa-f]"); break;
    case 'H': emit_atom(r, "[^0-9A-Fa-f]"); break;
    case 'w': emit_atom(r, WORD_CLASS); break;
    case 'W': emit_atom(r, NON_WORD_CLASS); break;
    case 'd': emit_atom(r, "\\p{Nd}"); break;
    case 'D': emit_atom(r, "\\P{Nd}"); break;
    case 's': emit_atom(r, "\\p{White_Space}"); break;
    case 'S': emit_atom(r, "\\P{White_Space}"); break;
    case 'b':
      emit_atom(r, "(?:(?<!" WORD_CLASS ")(?=" WORD_CLASS ")|(?<=" WORD_CLASS ")(?!" WORD_CLASS "))");
      break;
    case 'B':
      emit_atom(r, "(?:(?<!" WORD_CLASS ")(?!" WORD_CLASS ")|(?<=" WORD_CLASS ")(?=" WORD_CLASS "))");
      break;
    case 'a': emit_atom(r, "\\x{7}"); break;
    case 'e': emit_atom(r, "\\x{1B}"); break;
    default:
      r->atom = (long)r->out->n;
      if (is_alnum(e) || (unsigned char)e < 0x80) {
        lks__buf_putc(r->out, '\\');
        lks__buf_putc(r->out, e);
      } else {
        lks__buf_put(r->out, r->src + i + 1, (size_t)el);  // an escaped non-ASCII char is itself
      }
      r->last_quant = false;
      break;
  }
  *ip = i + 1 + (size_t)el;
  return 0;
}

// A group opening at src[*ip] ('('): (?i:, (?>, (?:, lookarounds, named groups, plain groups.
static int rx_group_open(rx *r, size_t *ip) {
  size_t i = *ip;
  if (r->depth == (int)(sizeof r->groups / sizeof r->groups[0]))
    return rx_fail(r, LKS_EUNSUPPORTED, "groups nested too deeply");
  r->groups[r->depth].start = (long)r->out->n;
  r->groups[r->depth].fold = r->fold;
  r->depth++;
  const char *s = r->src + i;
  size_t left = r->n - i;
  if (left >= 4 && !memcmp(s, "(?i:", 4)) {
    r->fold = true;
    lks__buf_puts(r->out, "(?:");
    i += 4;
  } else if (left >= 3 && !memcmp(s, "(?>", 3)) {
    lks__buf_puts(r->out, "(?:");
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
    if (!pl) return rx_fail(r, LKS_EFORMAT, "unsupported group syntax at offset %zu", i);
    lks__buf_put(r->out, s, pl);
    i += pl;
  } else {
    lks__buf_putc(r->out, '(');
    i++;
  }
  r->last_quant = false;
  *ip = i;
  return 0;
}

// '{' at src[*ip]: a counted quantifier {n}, {n,}, {n,m}, {,m} after an atom, else a literal.
static void rx_brace(rx *r, size_t *ip) {
  size_t i = *ip, k = i + 1;
  size_t d1 = 0, d2 = 0;
  bool comma = false;
  while (k < r->n && r->src[k] >= '0' && r->src[k] <= '9') k++, d1++;
  if (k < r->n && r->src[k] == ',') {
    comma = true;
    k++;
    while (k < r->n && r->src[k] >= '0' && r->src[k] <= '9') k++, d2++;
  }
  bool ok = k < r->n && r->src[k] == '}' && (d1 || (comma && d2));
  if (!ok || r->atom < 0) {
    emit_atom(r, "\\{");
    *ip = i + 1;
    return;
  }
  lks__buf q = {0};
  lks__buf_putc(&q, '{');
  if (!d1) lks__buf_putc(&q, '0');
  lks__buf_put(&q, r->src + i + 1, k - i - 1);
  lks__buf_putc(&q, '}');
  if (q.oom) r->out->oom = true;
  i = k + 1;
  lks__buf *out = r->out;
  if (i < r->n && (r->src[i] == '+' || r->src[i] == '*')) {
    // Oniguruma stacks the quantifiers: X{n}+ is (?:X{n})+.
    lks__buf a = {0};
    lks__buf_put(&a, out->p + r->atom, out->n - (size_t)r->atom);
    if (a.oom) out->oom = true;
    out->n = (size_t)r->atom;
    lks__buf_puts(out, "(?:");
    lks__buf_put(out, a.p, a.n);
    lks__buf_put(out, q.p, q.n);
    lks__buf_putc(out, ')');
    lks__buf_putc(out, r->src[i]);
    free(a.p);
    i++;
  } else {
    lks__buf_put(out, q.p, q.n);
  }
  free(q.p);
  r->last_quant = true;
  *ip = i;
}

// Rewrites the whole pattern into r->out. Returns 0, or an error with r->err set.
static int rx_translate(rx *r) {
  lks__buf *out = r->out;
  for (size_t i = 0; i < r->n;) {
    char c = r->src[i];
    int rc = 0;
    switch (c) {
      case '\\': rc = rx_escape(r, &i); break;
      case '[': {
        long at = (long)out->n;
        rc = rx_class(r, &i);
        r->atom = at;
        r->last_quant = false;
        break;
      }
      case ']': emit_atom(r, "\\]"); i++; break;
      case '.': emit_atom(r, "[^\\n]"); i++; break;
      case '^': emit_atom(r, "(?:\\A|(?<=\\n))"); i++; break;
      case '$': emit_atom(r, "(?:(?=\\n)|\\z)"); i++; break;
      case '(': rc = rx_group_open(r, &i); break;
      case ')':
        lks__buf_putc(out, ')');
        if (r->depth > 0) {
          r->depth--;
          r->atom = r->groups[r->depth].start;
          r->fold = r->groups[r->depth].fold;
        } else {
          r->atom = -1;
          r->fold = false;
        }
        r->last_quant = false;
        i++;
        break;
      case '|':
        lks__buf_putc(out, '|');
        r->atom = -1;
        r->last_quant = false;
        i++;
        break;
      case '{': rx_brace(r, &i); break;
      case '}': emit_atom(r, "\\}"); i++; break;
      case '+':
        if (!r->last_quant) lks__buf_putc(out, '+');  // a possessive '+' becomes greedy, as in the reference
        r->last_quant = true;
        i++;
        break;
      case '*':
      case '?':
        lks__buf_putc(out, c);
        r->last_quant = true;
        i++;
        break;
      default: {
        int l = lks__utf8_len((unsigned char)c);
        r->atom = (long)out->n;
        if (r->fold && is_letter(c))
          lks__buf_printf(out, "[%c%c]", (char)(c | 32), (char)(c & ~32));
        else
          lks__buf_put(out, r->src + i, (size_t)l);
        r->last_quant = false;
        i += (size_t)l;
        break;
      }
    }
    if (rc < 0) return rc;
  }
  return out->oom ? lks_set_error(LKS_ENOMEM, "out of memory") : 0;
}

int lks_regex_translate(const char *src, size_t len, char **out, size_t *out_len,
                        char err[LKS_REGEX_ERRLEN]) {
  lks__buf b = {0};
  rx r = {.src = src, .n = len, .err = err, .out = &b, .atom = -1};
  err[0] = '\0';
  int rc = rx_translate(&r);
  if (rc == LKS_ENOMEM || b.oom) {
    free(b.p);
    return LKS_ENOMEM;
  }
  if (rc < 0) {
    free(b.p);
    return rc;
  }
  if (!b.p && !(b.p = calloc(1, 1))) return LKS_ENOMEM;
  *out = b.p;
  *out_len = b.n;
  return 0;
}

int lks_regex_compile_hf(const char *src, size_t len, pcre2_code **re, char err[LKS_REGEX_ERRLEN]) {
  char *pat;
  size_t n;
  *re = NULL;
  int rc = lks_regex_translate(src, len, &pat, &n, err);
  if (rc < 0) return rc;
  *re = lks_regex_compile(pat, n, 0, err, LKS_REGEX_ERRLEN);
  free(pat);
  return *re ? 0 : LKS_EFORMAT;
}
