// SPDX-License-Identifier: MIT
// The Oniguruma -> PCRE2 translation of tokenizer.json regexes (text/regex.c), judged by what
// the translated pattern does: the pre-tokenizer patterns of GPT-2, Llama-3/GLM, Qwen, gpt-oss
// and DeepSeek-V3 split known strings into the pieces worked out by hand from the reference's
// rules (Split with "Isolated": every match, and the text between matches, in order); Unicode
// classes (\p{L}, \w, \d, \s, POSIX) match what Unicode says; the constructs the reference
// weakens (possessive quantifiers, atomic groups) behave as the reference's do; (?i:...) folds
// ASCII only; and malformed or inexpressible patterns are refused with a message naming the
// offset. A few translations are also checked as text where the exact form is the point.
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/regex.h"

static pcre2_code *compile_ok(const char *pat) {
  char err[LKS_REGEX_ERRLEN];
  pcre2_code *re = NULL;
  int rc = lks_regex_compile_hf(pat, strlen(pat), &re, err);
  ck_assert_msg(rc == 0 && re, "/%s/: error %d: %s", pat, rc, err);
  return re;
}

static int u8len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// The pieces a Split with behavior "Isolated" makes of `text`, joined with '|' (the tokenizer's
// loop: empty matches make no piece and step one character on).
static void split_isolated(const char *pat, const char *text, char *out, size_t cap) {
  pcre2_code *re = compile_ok(pat);
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  size_t n = strlen(text), prev = 0, from = 0, k = 0;
  out[0] = '\0';
#define PIECE(a, b)                                                                  \
  do {                                                                               \
    k += (size_t)snprintf(out + k, cap - k, "%s%.*s", k ? "|" : "", (int)((b) - (a)), \
                          text + (a));                                               \
    ck_assert(k < cap);                                                              \
  } while (0)
  while (from <= n && pcre2_match(re, (PCRE2_SPTR)text, n, from, 0, md, NULL) >= 0) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t ms = ov[0], me = ov[1];
    if (ms > prev) PIECE(prev, ms);
    if (me > ms) PIECE(ms, me);
    prev = me;
    from = me > ms ? me : me + (me < n ? (size_t)u8len((unsigned char)text[me]) : 1);
  }
  if (n > prev) PIECE(prev, n);
#undef PIECE
  pcre2_match_data_free(md);
  pcre2_code_free(re);
}

static void expect_split(const char *pat, const char *text, const char *want) {
  char got[1024];
  split_isolated(pat, text, got, sizeof got);
  ck_assert_msg(!strcmp(got, want), "/%s/ on \"%s\":\n  got  \"%s\"\n  want \"%s\"", pat, text, got,
                want);
}

// Whether the translated pattern matches the whole of `text`.
static bool full_match(const char *pat, const char *text) {
  pcre2_code *re = compile_ok(pat);
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  int rc = pcre2_match(re, (PCRE2_SPTR)text, strlen(text), 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                       md, NULL);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return rc >= 0;
}
#define MATCHES(pat, text) ck_assert_msg(full_match(pat, text), "/%s/ should match \"%s\"", pat, text)
#define NO_MATCH(pat, text) \
  ck_assert_msg(!full_match(pat, text), "/%s/ should not match \"%s\"", pat, text)

// Offset of the first match of pat in text, -1 when none.
static long first_match(const char *pat, const char *text, size_t *len) {
  pcre2_code *re = compile_ok(pat);
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  long at = -1;
  if (pcre2_match(re, (PCRE2_SPTR)text, strlen(text), 0, 0, md, NULL) >= 0) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    at = (long)ov[0];
    if (len) *len = ov[1] - ov[0];
  }
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return at;
}

static void expect_translation(const char *pat, const char *want) {
  char err[LKS_REGEX_ERRLEN], *out = NULL;
  size_t n = 0;
  int rc = lks_regex_translate(pat, strlen(pat), &out, &n, err);
  ck_assert_msg(rc == 0, "/%s/: error %d: %s", pat, rc, err);
  ck_assert_msg(n == strlen(want) && !strcmp(out, want), "/%s/ -> /%s/, want /%s/", pat, out, want);
  free(out);
}

static void expect_refused(const char *pat, int code, const char *msg) {
  char err[LKS_REGEX_ERRLEN];
  pcre2_code *re = (pcre2_code *)1;
  int rc = lks_regex_compile_hf(pat, strlen(pat), &re, err);
  ck_assert_msg(rc == code, "/%s/: %d (%s), want %d", pat, rc, err, code);
  ck_assert_msg(re == NULL, "/%s/: a refused pattern leaves no code", pat);
  ck_assert_msg(strstr(err, msg) != NULL, "/%s/: message \"%s\" lacks \"%s\"", pat, err, msg);
}

// The pre-tokenizer patterns as tokenizer.json writes them.
#define GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_GLM                                                                             \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
  "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN                                                                                  \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"     \
  "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GPT_OSS                                                                                  \
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"       \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"       \
  "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
  "[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
// DeepSeek-V3's third Split: raw CR and LF inside classes, a class full of escaped punctuation.
#define DEEPSEEK3                                                                           \
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+" \
  "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"

START_TEST(pretokenizer_patterns) {
  expect_split(GPT2, "Hello world's 123  foo!!\n", "Hello| world|'s| 123| | foo|!!|\n");
  expect_split(GPT2, "HE'S", "HE|'|S");  // no (?i:...): "'S" is punctuation then a letter
  expect_split(LLAMA3_GLM, "Hello WORLD's 2024\u5e74 \u4f60\u597d!!\n\n  x",
               "Hello| WORLD|'s| |202|4|\u5e74| \u4f60\u597d|!!\n\n| | x");
  expect_split(LLAMA3_GLM, "HE'S I'M", "HE|'S| I|'M");
  expect_split(LLAMA3_GLM, "a\r\n\r\n b", "a|\r\n\r\n| b");
  expect_split(QWEN, "ab 2024", "ab| |2|0|2|4");
  expect_split(GPT_OSS, "HelloWorld's CamelCASE", "Hello|World's| Camel|CASE");
  expect_split(GPT_OSS, "a/b\n//c", "a|/b|\n|//|c");  // an optional non-letter leads a word
  expect_split("\\p{N}{1,3}", "12345 6", "123|45| |6");  // DeepSeek-V3's first Split
  expect_split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", "ab\u4f60\u597d\u3042\u30a2cd",
               "ab|\u4f60\u597d\u3042\u30a2|cd");  // its second: CJK, hiragana, katakana runs
  expect_split(DEEPSEEK3, "#include <x>", "#include| <|x|>");
  expect_split(DEEPSEEK3, "a, b\r\n", "a|,| b|\r\n");
}
END_TEST

START_TEST(unicode_classes) {
  expect_split("\\p{L}+", "h\u00e9llo w\u00f6rld", "h\u00e9llo| |w\u00f6rld");
  size_t len;
  ck_assert_int_eq(first_match("\\p{Lu}+", "ab\u00c9D\u00e9", &len), 2);
  ck_assert_uint_eq(len, 3);  // "ÉD"
  // \w: letters, marks, decimal digits (any script), connector punctuation.
  MATCHES("\\w+", "nai\u0308ve_caf\u00e9\u0663");
  NO_MATCH("\\w", "-");
  MATCHES("\\p{Word}+", "x_\u0663");
  MATCHES("\\W", "!");
  NO_MATCH("\\W", "\u00e9");
  // \d is Nd in every script; \D its complement.
  MATCHES("\\d+", "\u0663\u06645");
  NO_MATCH("\\d", "\u00bd");  // a number, but not a decimal digit
  MATCHES("\\D", "x");
  // \s is White_Space: U+3000, NEL, NBSP too.
#define NEL "\xc2\x85"  // U+0085, which C does not allow as \u0085
  expect_split("\\s+", "a\u3000b" NEL "c\u00a0d", "a|\u3000|b|" NEL "|c|\u00a0|d");
  MATCHES("\\S+", "abc");
  // '.' stops at \n only.
  expect_split(".+", "ab\rc\nd", "ab\rc|\n|d");
  // \h is a hex digit, as in Oniguruma.
  expect_split("\\h+", "xyz0fA9g", "xyz|0fA9|g");
  MATCHES("\\H", "g");
  // POSIX classes in Unicode terms.
  expect_split("[[:alpha:]]+", "h\u00e9llo1", "h\u00e9llo|1");
  expect_split("[[:digit:][:space:]]+", "a1 2b", "a|1 2|b");
  MATCHES("[[:punct:]]+", "!$");
  MATCHES("[[:upper:]]", "\u00c9");
  MATCHES("[[:xdigit:]]+", "09afAF");
  // Escapes inside classes.
  MATCHES("[\\d\\s]+", "1 \u0663\u3000");
  MATCHES("[\\x41-\\x43]+", "ABC");
  MATCHES("[\\u00e9\\x{4e00}]+", "\u00e9\u4e00");
  MATCHES("[]a]+", "]a");
  MATCHES("[a-]+", "a-");
  MATCHES("[\\w-]+", "a-b");
  // Word boundaries with Unicode word characters.
  expect_split("\\bfoo\\b", "foo foobar", "foo| foobar");
  expect_split("\\B\u00e9", "\u00e9c\u00e9", "\u00e9c|\u00e9");
  // Line anchors: ^ after any \n, $ before any \n; \Z before a final newline.
  ck_assert_int_eq(first_match("^b", "ab\nb", NULL), 3);
  ck_assert_int_eq(first_match("a$", "ab\na", NULL), 3);
  ck_assert_int_eq(first_match("a\\Z", "xa\n", NULL), 1);
  ck_assert_int_eq(first_match("\\Aa", "ba", NULL), -1);
}
END_TEST

START_TEST(possessive_and_atomic) {
  // The reference drops possessiveness: a++a backtracks into the a+ and matches, where
  // Oniguruma would not.
  expect_translation("a++", "a+");
  expect_translation("\\p{L}*+", "\\p{L}*");
  expect_translation("a?+", "a?");
  MATCHES("a++a", "aaa");
  // Atomic groups are plain groups: (?>ab|a)c matches "ac" by backtracking into the group.
  expect_translation("(?>ab|a)", "(?:ab|a)");
  MATCHES("(?>ab|a)c", "ac");
  // Oniguruma stacks a quantifier after {n}: X{n}+ is (?:X{n})+, X{n}* is (?:X{n})*.
  expect_translation("a{2}+", "(?:a{2})+");
  expect_translation("(ab){1,2}*", "(?:(ab){1,2})*");
  size_t len;
  ck_assert_int_eq(first_match("a{2}+", "aaaaa", &len), 0);
  ck_assert_uint_eq(len, 4);
  // A bare '{' that is not a quantifier is a literal; {,m} means {0,m}.
  expect_translation("x{a}", "x\\{a\\}");
  expect_translation("a{,3}", "a{0,3}");
  MATCHES("{", "{");
  MATCHES("a{,3}b", "aab");
}
END_TEST

START_TEST(case_insensitive_groups) {
  expect_translation("(?i:ab)", "(?:[aA][bB])");
  MATCHES("(?i:'s|'t)", "'S");
  MATCHES("(?i:abc)", "AbC");
  MATCHES("(?i:a)b", "Ab");
  NO_MATCH("(?i:a)b", "AB");  // the fold ends with the group
  NO_MATCH("(?i:(a))B", "ab");
  // Classes gain the other case of the letters they hold in one case only.
  expect_translation("(?i:[a-c])", "(?:[a-cABC])");
  MATCHES("(?i:[a-c]+)", "aBc");
  NO_MATCH("(?i:[^a])", "A");
  MATCHES("(?i:[^a])", "b");
  // Escaped ASCII letters fold too; nothing outside ASCII does (the reference's rule).
  MATCHES("(?i:\\x41)", "a");
  MATCHES("(?i:\\u0041\\x{42})", "ab");
  NO_MATCH("(?i:\u00e9)", "\u00c9");
  NO_MATCH("(?i:[\u00e9])", "\u00c9");
  // Other group syntax passes through.
  MATCHES("(?:ab)+(?=c)c", "ababc");
  MATCHES("(?<name>a)\\k<name>", "aa");
  MATCHES("a(?!b)c", "ac");
  MATCHES("(?<=a)b|a", "a");
}
END_TEST

START_TEST(translations) {
  expect_translation("\\s", "\\p{White_Space}");
  expect_translation(".", "[^\\n]");
  expect_translation("\\x41", "\\x{41}");
  expect_translation("\\u00e9", "\\x{E9}");
  expect_translation("\\x{e9}", "\\x{e9}");
  expect_translation("\\Ga", "a");  // \G is dropped
  expect_translation("[\\d\\s]", "[\\p{Nd}\\p{White_Space}]");
  expect_translation("\\d\\D\\S", "\\p{Nd}\\P{Nd}\\P{White_Space}");
  expect_translation("a|b", "a|b");
  expect_translation("", "");
  expect_translation("\u00e9+", "\u00e9+");
}
END_TEST

START_TEST(malformed_refused) {
  expect_refused("[abc", LKS_EFORMAT, "unterminated character class at offset 0");
  expect_refused("x[]", LKS_EFORMAT, "unterminated character class at offset 1");
  expect_refused("[^]", LKS_EFORMAT, "unterminated character class");
  expect_refused("[a\\", LKS_EFORMAT, "unterminated escape in a character class at offset 2");
  expect_refused("[a&&b]", LKS_EUNSUPPORTED, "intersection '&&' at offset 2");
  expect_refused("[[:foo:]]", LKS_EFORMAT, "unknown POSIX class 'foo' at offset 1");
  expect_refused("[[:^alpha:]]", LKS_EUNSUPPORTED, "negated POSIX class at offset 1");
  expect_refused("[[a]]", LKS_EUNSUPPORTED, "nested character class at offset 1");
  expect_refused("[a-\\d]", LKS_EFORMAT, "a range ends in a set-valued escape");
  expect_refused("[a-[:digit:]]", LKS_EFORMAT, "a range ends in a POSIX class");
  expect_refused("[\\d-z]", LKS_EFORMAT, "a range starts at a set at offset 3");
  expect_refused("[\\W]", LKS_EUNSUPPORTED, "\\W inside a character class at offset 1");
  expect_refused("[\\H]", LKS_EUNSUPPORTED, "\\H inside a character class");
  expect_refused("[\\P{Word}]", LKS_EUNSUPPORTED, "\\P{Word} inside a character class");
  expect_refused("a(?P<x>b)", LKS_EFORMAT, "unsupported group syntax at offset 1");
  expect_refused("(?#c)", LKS_EFORMAT, "unsupported group syntax at offset 0");
  expect_refused("ab\\", LKS_EFORMAT, "pattern ends in a lone backslash");
  // Translated, then refused by PCRE2: its message, and the offset in the rewritten pattern.
  expect_refused("(a", LKS_EFORMAT, "missing closing parenthesis");
  expect_refused("a{2,1}", LKS_EFORMAT, "out of order");
  expect_refused("\\p{NoSuchProperty}", LKS_EFORMAT, "rewritten pattern");
  expect_refused("(?i:[\\p{Nope}])", LKS_EFORMAT, "rewritten pattern");
  char deep[600];
  memset(deep, '(', 300);
  memset(deep + 300, ')', 300);
  expect_refused((deep[599] = '\0', deep), LKS_EUNSUPPORTED, "groups nested too deeply");
}
END_TEST

int main(void) {
  Suite *s = suite_create("regex");
  TCase *tc = tcase_create("regex");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, pretokenizer_patterns);
  tcase_add_test(tc, unicode_classes);
  tcase_add_test(tc, possessive_and_atomic);
  tcase_add_test(tc, case_insensitive_groups);
  tcase_add_test(tc, translations);
  tcase_add_test(tc, malformed_refused);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
