// SPDX-License-Identifier: MIT
// tokenizer.json regexes: the Oniguruma dialect Hugging Face writes them in, rewritten into
// PCRE2 with the meaning the reference (@huggingface/tokenizers, which rewrites them for
// JavaScript's Unicode mode) gives them:
//   - \s \S are White_Space, \d \D are Nd, \w \W \b \B use Unicode word characters, \h \H are
//     hex digits, \p{Word} is \w; '.' stops at \n only; ^ $ are line anchors and \Z is "before a
//     final newline"; \G is dropped;
//   - (?i:...) folds ASCII letters only (a class inside gains the other case of the letters it
//     holds in one case); atomic groups (?>...) become plain groups and a possessive '+' after a
//     quantifier is dropped (both as in the reference); X{n}+ and X{n}* stack as in Oniguruma;
//   - POSIX classes [[:alpha:]] and friends are spelled out with Unicode properties;
//   - constructs the reference cannot express are refused: character-class intersection &&,
//     nested classes, negated POSIX classes, \P{Word} \W \H inside a class (LKS_EUNSUPPORTED);
//     malformed ones are LKS_EFORMAT (unterminated or empty classes, ranges ending in a set,
//     unknown POSIX classes, unknown group syntax, a lone trailing backslash).
// Patterns are compiled in UTF mode with UCP. Pure functions; any thread.
#ifndef LKS_TEXT_REGEX_H
#define LKS_TEXT_REGEX_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

// Size of the message buffers below (longer messages are cut).
#define LKS_REGEX_ERRLEN 160

// Rewrites the tokenizer.json pattern src[0..len) into PCRE2 syntax. On success *out is
// malloc'd and NUL-terminated (*out_len bytes; the caller frees it). Errors: LKS_EFORMAT or
// LKS_EUNSUPPORTED with `err` saying what and at which offset, LKS_ENOMEM.
int lks_regex_translate(const char *src, size_t len, char **out, size_t *out_len,
                        char err[LKS_REGEX_ERRLEN]);

// Compiles a PCRE2 pattern with PCRE2_UTF | PCRE2_UCP | `options`. NULL with `err` (errlen
// bytes) holding PCRE2's message and the offset in the pattern when it does not compile.
pcre2_code *lks_regex_compile(const char *pattern, size_t len, uint32_t options, char *err,
                              size_t errlen);

// Translates and compiles a tokenizer.json pattern (not JIT-compiled). Returns 0 with *re set
// (the caller frees it with pcre2_code_free), or an error as lks_regex_translate's; a pattern
// PCRE2 rejects after translation is LKS_EFORMAT.
int lks_regex_compile_hf(const char *src, size_t len, pcre2_code **re, char err[LKS_REGEX_ERRLEN]);

#endif
