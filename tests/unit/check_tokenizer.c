// SPDX-License-Identifier: MIT
// The tokenizer and the chat prompt on small hand-made files whose answers are known: BPE in
// both merge notations, added tokens matched whole with lstrip/rstrip, invalid UTF-8, decode and
// streaming decode (characters split across byte tokens), and the refusal of malformed
// tokenizer.json files with a message naming the problem. The comparison with the reference
// implementation on real files is tests/tokenizer/ (ctest -L tokenizer).
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "testutil.h"

// A tiny byte-level BPE: "é" is the bytes C3 A9, written "Ã©" at the byte level.
#define MODEL_STR                                                                                  \
  "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"\\u0120\": 2, \"ab\": 3, "   \
  "\"\\u0120ab\": 4, \"c\": 5, \"\\u00c3\": 6, \"\\u00a9\": 7, \"\\u00c3\\u00a9\": 8}, "           \
  "\"merges\": [\"a b\", \"\\u0120 ab\", \"\\u00c3 \\u00a9\"]}"
#define MODEL_PAIRS                                                                                \
  "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"\\u0120\": 2, \"ab\": 3, "   \
  "\"\\u0120ab\": 4, \"c\": 5, \"\\u00c3\": 6, \"\\u00a9\": 7, \"\\u00c3\\u00a9\": 8}, "           \
  "\"merges\": [[\"a\", \"b\"], [\"\\u0120\", \"ab\"], [\"\\u00c3\", \"\\u00a9\"]]}"
#define PRE                                                                                        \
  "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "         \
  "\"pattern\": {\"Regex\": \"\\\\s?\\\\p{L}+|\\\\s+\"}, \"behavior\": \"Isolated\", "             \
  "\"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}"
#define ADDED                                                                                      \
  "\"added_tokens\": [{\"id\": 9, \"content\": \"<x>\", \"special\": true, \"normalized\": false}, " \
  "{\"id\": 10, \"content\": \"[y]\", \"special\": false, \"normalized\": false, \"lstrip\": true, "  \
  "\"rstrip\": true}]"
#define DECODER "\"decoder\": {\"type\": \"ByteLevel\"}"

static const char *tiny = "{" MODEL_STR ", " PRE ", " ADDED ", " DECODER "}";
static const char *tiny_pairs = "{" MODEL_PAIRS ", " PRE ", " ADDED ", " DECODER "}";

static lks_tokenizer *parse(const char *json) {
  lks_tokenizer *t = lks_tokenizer_parse(json, strlen(json), "tokenizer.json");
  ck_assert_msg(t != NULL, "%s", lks_last_error());
  return t;
}

static void expect_ids(const lks_tokenizer *t, const char *text, size_t len, const int32_t *want,
                       int n_want) {
  int32_t *ids;
  int n;
  ck_assert_msg(lks_tokenizer_encode(t, text, len, false, &ids, &n) == 0, "%s", lks_last_error());
  ck_assert_msg(n == n_want, "'%s': %d ids, want %d", text, n, n_want);
  for (int i = 0; i < n; i++) ck_assert_msg(ids[i] == want[i], "'%s': id %d is %d, want %d", text, i, ids[i], want[i]);
  free(ids);
}
#define EXPECT(t, text, ...)                                                        \
  do {                                                                              \
    const int32_t w_[] = {__VA_ARGS__};                                             \
    expect_ids((t), (text), strlen(text), w_, (int)(sizeof w_ / sizeof w_[0]));     \
  } while (0)

START_TEST(bpe_both_notations) {
  const char *files[] = {tiny, tiny_pairs};
  for (int k = 0; k < 2; k++) {
    lks_tokenizer *t = parse(files[k]);
    EXPECT(t, "ab ab", 3, 4);      // "a b" first (rank 0), then "Ġ ab"
    EXPECT(t, "abab", 3, 3);
    EXPECT(t, "\xC3\xA9", 8);      // é
    EXPECT(t, "ba", 1, 0);         // no merge for "b a"
    EXPECT(t, "abc", 3, 5);
    ck_assert_int_eq(lks_tokenizer_n_ids(t), 11);
    ck_assert_int_eq(lks_tokenizer_token_id(t, "\xC4\xA0" "ab"), 4);  // "Ġab" as written
    ck_assert_int_eq(lks_tokenizer_token_id(t, "<x>"), 9);
    ck_assert_int_eq(lks_tokenizer_token_id(t, "zz"), -1);
    lks_tokenizer_free(t);
  }
}
END_TEST

START_TEST(added_tokens) {
  lks_tokenizer *t = parse(tiny);
  EXPECT(t, "ab<x>ab", 3, 9, 3);
  EXPECT(t, "<x><x>", 9, 9);
  int32_t *none;
  int n_none;
  // "<" and "x" are in no vocabulary and there is no unk_token: dropped, as by the reference.
  ck_assert_int_eq(lks_tokenizer_encode(t, "<x", 2, false, &none, &n_none), 0);
  ck_assert_int_eq(n_none, 0);
  free(none);
  EXPECT(t, "ab  [y]  ab", 3, 10, 3);       // lstrip and rstrip trim the spaces around [y]
  EXPECT(t, "ab <x> ab", 3, 2, 9, 4);       // <x> trims nothing
  ck_assert(lks_tokenizer_is_special(t, 9));
  ck_assert(!lks_tokenizer_is_special(t, 10));
  char *s;
  size_t n;
  const int32_t ids[] = {3, 9, 4, 10, 8};
  ck_assert_int_eq(lks_tokenizer_decode(t, ids, 5, false, &s, &n), 0);
  ck_assert_str_eq(s, "ab<x> ab[y]\xC3\xA9");
  free(s);
  ck_assert_int_eq(lks_tokenizer_decode(t, ids, 5, true, &s, &n), 0);
  ck_assert_str_eq(s, "ab ab[y]\xC3\xA9");
  free(s);
  const int32_t bad[] = {3, 11};
  ck_assert_int_eq(lks_tokenizer_decode(t, bad, 2, false, &s, &n), LKS_ERANGE);
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "token id 11"));
  lks_tokenizer_free(t);
}
END_TEST

START_TEST(utf8_replacement) {
  // WHATWG: one U+FFFD per maximal invalid subpart.
  const struct {
    const char *in, *out;
  } cases[] = {
      {"\xFF", "\xEF\xBF\xBD"},
      {"\xF0\x9F\x98", "\xEF\xBF\xBD"},                                  // truncated 4-byte
      {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},          // surrogate
      {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},                          // overlong
      {"a\xE4\xBD" "b", "a\xEF\xBF\xBD" "b"},
      {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // > U+10FFFF
      {"ok \xC3\xA9 \xF0\x9F\x98\x80", "ok \xC3\xA9 \xF0\x9F\x98\x80"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n;
    char *s = lks_utf8_sanitize(cases[i].in, strlen(cases[i].in), &n);
    ck_assert_msg(n == strlen(cases[i].out) && !memcmp(s, cases[i].out, n), "case %zu", i);
    free(s);
  }
  // Encoding sees invalid input exactly as its replacement.
  lks_tokenizer *t = parse(tiny);
  int32_t *a, *b;
  int na, nb;
  ck_assert_int_eq(lks_tokenizer_encode(t, "ab\xFF" "ab", 5, false, &a, &na), 0);
  ck_assert_int_eq(lks_tokenizer_encode(t, "ab\xEF\xBF\xBD" "ab", 7, false, &b, &nb), 0);
  ck_assert_int_eq(na, nb);
  ck_assert(!memcmp(a, b, (size_t)na * sizeof *a));
  free(a);
  free(b);
  lks_tokenizer_free(t);
}
END_TEST

// The GLM-shaped fixture has all 256 byte tokens: text spelled one byte per token splits every
// multi-byte character across tokens.
static lks_tokenizer *fixture(void) {
  const char *src = getenv("LKS_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/tokenizer/glm-fixture", src ? src : ".");
  lks_tokenizer *t = lks_tokenizer_load(path);
  ck_assert_msg(t != NULL, "%s", lks_last_error());
  return t;
}

static int byte_token(const lks_tokenizer *t, unsigned char b) {
  // GPT-2's map: printable bytes are themselves, the others U+0100 onwards.
  int n = 0;
  unsigned cp = 0;
  for (int x = 0; x < 256; x++) {
    bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    unsigned c = printable ? (unsigned)x : 256u + (unsigned)n++;
    if (x == b) cp = c;
  }
  char s[4];
  if (cp < 0x80) {
    s[0] = (char)cp;
    s[1] = 0;
  } else {
    s[0] = (char)(0xC0 | (cp >> 6));
    s[1] = (char)(0x80 | (cp & 0x3F));
    s[2] = 0;
  }
  return lks_tokenizer_token_id(t, s);
}

START_TEST(streaming) {
  lks_tokenizer *t = fixture();
  const char *text = "h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 e\xCC\x81!";
  size_t len = strlen(text);
  int32_t ids[64];
  for (size_t i = 0; i < len; i++) {
    ids[i] = byte_token(t, (unsigned char)text[i]);
    ck_assert_int_ge(ids[i], 0);
  }
  // Every prefix: pieces are whole characters and add up to the decode of the prefix.
  for (size_t p = 0; p <= len; p++) {
    lks_detok *d = lks_detok_new(t, false);
    char all[256];
    size_t k = 0;
    for (size_t i = 0; i <= p; i++) {
      const char *o;
      size_t l;
      ck_assert_int_eq(i < p ? lks_detok_push(d, ids[i], &o, &l) : lks_detok_flush(d, &o, &l), 0);
      size_t v;
      char *chk = lks_utf8_sanitize(o, l, &v);
      ck_assert_msg(v == l && !memcmp(chk, o, l), "a piece is not whole UTF-8");
      free(chk);
      memcpy(all + k, o, l);
      k += l;
    }
    char *whole;
    size_t wl;
    ck_assert_int_eq(lks_tokenizer_decode(t, ids, (int)p, false, &whole, &wl), 0);
    ck_assert_msg(wl == k && !memcmp(whole, all, k), "prefix %zu", p);
    if (p == len) ck_assert_msg(k == len && !memcmp(all, text, len), "the full text comes back");
    free(whole);
    lks_detok_free(d);
  }
  // The ordinary encoding round-trips too, and a bare continuation byte decodes to U+FFFD.
  int32_t *enc;
  int n;
  ck_assert_int_eq(lks_tokenizer_encode(t, text, len, false, &enc, &n), 0);
  char *back;
  size_t bl;
  ck_assert_int_eq(lks_tokenizer_decode(t, enc, n, false, &back, &bl), 0);
  ck_assert(bl == len && !memcmp(back, text, len));
  free(back);
  free(enc);
  int32_t lone[] = {byte_token(t, 0xE4), byte_token(t, 'a')};
  ck_assert_int_eq(lks_tokenizer_decode(t, lone, 2, false, &back, &bl), 0);
  ck_assert_str_eq(back, "\xEF\xBF\xBD" "a");
  free(back);
  lks_tokenizer_free(t);
}
END_TEST

START_TEST(directory_and_config) {
  char *dir = tu_tmpdir();
  char path[1024];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  tu_write(path, tiny, strlen(tiny));
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  const char *conf = "{\"chat_template\": \"[gMASK]<sop>{{ x }}\", \"model_max_length\": 1000000000000000019884624838656}";
  tu_write(path, conf, strlen(conf));
  lks_tokenizer *t = lks_tokenizer_load(dir);
  ck_assert_msg(t != NULL, "%s", lks_last_error());
  ck_assert_str_eq(lks_tokenizer_chat_template(t), "[gMASK]<sop>{{ x }}");
  lks_tokenizer_free(t);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  t = lks_tokenizer_load(path);  // the file itself
  ck_assert_msg(t != NULL, "%s", lks_last_error());
  lks_tokenizer_free(t);
  snprintf(path, sizeof path, "%s/nothing-here", dir);
  ck_assert_ptr_null(lks_tokenizer_load(path));
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "nothing-here"));
  free(dir);
}
END_TEST

// Replaces `from` in `base` with `to`; the result must be refused with a message containing `want`.
static void refused(const char *base, const char *from, const char *to, const char *want) {
  const char *at = strstr(base, from);
  ck_assert_msg(at != NULL, "test bug: '%s' not found", from);
  char buf[8192];
  snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
  lks_clear_error();
  lks_tokenizer *t = lks_tokenizer_parse(buf, strlen(buf), "tokenizer.json");
  ck_assert_msg(t == NULL, "accepted: %s", buf);
  ck_assert_msg(strstr(lks_last_error(), want) != NULL, "message '%s' lacks '%s'", lks_last_error(), want);
}

START_TEST(malformed) {
  // Not a tokenizer.json at all.
  refused(tiny, "{\"model\"", "[{\"model\"", "not valid JSON");
  refused(tiny, tiny, "[]", "top level must be an object");
  // Missing or ill-typed model.
  refused(tiny, MODEL_STR ", ", "", "\"model\" is missing");
  refused(tiny, MODEL_STR, "\"model\": 7", "model must be an object, not an integer");
  refused(tiny, "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type 'WordPiece' is not supported");
  refused(tiny, "\"vocab\": {", "\"vocab\": [], \"x\": {", "model.vocab must be an object");
  refused(tiny, "\"a\": 0,", "\"a\": \"0\",", "model.vocab[\"a\"] must be a non-negative integer id, not a string");
  refused(tiny, "\"c\": 5,", "\"c\": 0,", "id 0 is given to two tokens");
  refused(tiny, "\"merges\": [", "\"merges_\": [", "model.merges is missing");
  refused(tiny, "\"merges\": [", "\"merges\": {\"x\": 1}, \"m\": [", "model.merges must be an array, not an object");
  // Bad merges.
  refused(tiny, "\"a b\"", "\"ab\"", "model.merges[0] = \"ab\" is not two tokens separated by one space");
  refused(tiny, "\"a b\"", "\"a b c\"", "is not two tokens");
  refused(tiny, "\"a b\"", "\"a z\"", "model.merges[0] (\"a z\"): 'z' is not in the vocabulary");
  refused(tiny, "\"a b\"", "\"b a\"", "the merged token 'ba' is not in the vocabulary");
  refused(tiny, "\"a b\"", "42", "model.merges[0] must be a string \"a b\" or a pair");
  refused(tiny_pairs, "[\"a\", \"b\"]", "[\"a\", \"b\", \"c\"]", "model.merges[0] must be a string \"a b\" or a pair");
  // Invalid and unsupported regexes.
  refused(tiny, "\\\\s?\\\\p{L}+|\\\\s+", "(ab", "pre_tokenizer.pretokenizers[0].pattern.Regex: invalid regex /(ab/");
  refused(tiny, "\\\\s?\\\\p{L}+|\\\\s+", "\\\\p{NoSuchProperty}", "invalid regex");
  refused(tiny, "\\\\s?\\\\p{L}+|\\\\s+", "[a-z&&[^m]]", "intersection");
  refused(tiny, "{\"Regex\": ", "{\"Regexp\": ", "must hold \"Regex\" or \"String\"");
  refused(tiny, "{\"Regex\": \"\\\\s?\\\\p{L}+|\\\\s+\"}", "[1]", "pattern must be an object");
  refused(tiny, "\"behavior\": \"Isolated\"", "\"behavior\": \"MergedWithPrevious\"", "behavior 'MergedWithPrevious' is not supported");
  refused(tiny, "\"invert\": false", "\"invert\": \"no\"", "invert must be true or false, not a string");
  // Pipeline parts.
  refused(tiny, ", {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}", "",
          "not a byte-level BPE");
  refused(tiny, "\"type\": \"Split\"", "\"type\": \"Metaspace\"", "pre-tokenizer 'Metaspace' is not supported");
  refused(tiny, DECODER, "\"decoder\": {\"type\": \"WordPiece\"}", "decoder 'WordPiece' is not supported");
  refused(tiny, DECODER, "\"decoder\": null", "decoder is missing");
  refused(tiny, DECODER, "\"decoder\": {\"kind\": 1}", "decoder.type must be a string");
  refused(tiny, DECODER, DECODER ", \"normalizer\": {\"type\": \"Lowercase\"}", "normalizer 'Lowercase' is not supported");
  // Added tokens.
  refused(tiny, ADDED, "\"added_tokens\": {\"a\": 1}", "added_tokens must be an array, not an object");
  refused(tiny, "\"id\": 9,", "\"id\": \"9\",", "added_tokens[0].id must be a non-negative integer");
  refused(tiny, "\"content\": \"<x>\"", "\"content\": \"\"", "added_tokens[0].content must be a non-empty string");
  refused(tiny, "\"special\": true", "\"special\": 1", "added_tokens[0].special must be true or false");
}
END_TEST

START_TEST(error_codes) {
  // The classes of failure carry their own codes; a file read error names the file.
  char buf[8192];
  snprintf(buf, sizeof buf, "%s", tiny);
  char *at = strstr(buf, "\"a b\"");
  memcpy(at, "\"a z\"", 5);
  lks_tokenizer *t = lks_tokenizer_parse(buf, strlen(buf), "x.json");
  ck_assert_ptr_null(t);
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "x.json: model.merges[0]"));
  const char *unsup = "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}";
  ck_assert_ptr_null(lks_tokenizer_parse(unsup, strlen(unsup), "u.json"));
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "not supported"));
}
END_TEST

START_TEST(chat_prompt) {
  char *s;
  size_t n;
  ck_assert_int_eq(lks_chat_prompt(NULL, "Hello", false, &s, &n), 0);
  ck_assert_str_eq(s, "[gMASK]<sop><|user|>\nHello<|assistant|>");
  free(s);
  ck_assert_int_eq(lks_chat_prompt("Be brief.", "Hi", true, &s, &n), 0);
  ck_assert_str_eq(s, "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi/nothink<|assistant|>\n<think></think>");
  free(s);
  // OpenAI-style history: arguments as a JSON text render as the object they hold; a text that
  // holds no object is refused.
  json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\", "
                            "\"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", "
                            "\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]}, "
                            "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"7\"}]", 0, NULL);
  json_t *as_obj = json_deep_copy(msgs);
  json_object_set_new(json_object_get(json_array_get(json_object_get(json_array_get(as_obj, 1), "tool_calls"), 0), "function"),
                      "arguments", json_pack("{s:i}", "a", 1));
  char *s2;
  size_t n2;
  ck_assert_int_eq(lks_chat_render(msgs, NULL, -1, true, &s, &n), 0);
  ck_assert_int_eq(lks_chat_render(as_obj, NULL, -1, true, &s2, &n2), 0);
  ck_assert_str_eq(s, s2);
  ck_assert_ptr_nonnull(strstr(s, "<arg_key>a</arg_key>"));
  free(s);
  free(s2);
  json_object_set_new(json_object_get(json_array_get(json_object_get(json_array_get(msgs, 1), "tool_calls"), 0), "function"),
                      "arguments", json_string("[1, 2]"));
  ck_assert_int_eq(lks_chat_render(msgs, NULL, -1, false, &s, &n), LKS_EINVAL);
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "arguments must be an object"));
  json_decref(msgs);
  json_decref(as_obj);
  json_t *notarray = json_object();
  ck_assert_int_eq(lks_chat_render(notarray, NULL, -1, true, &s, &n), LKS_EINVAL);
  json_decref(notarray);
  // The prompt's special tokens are single tokens of the GLM fixture.
  lks_tokenizer *t = fixture();
  ck_assert_int_eq(lks_chat_prompt("sys", "hi", true, &s, &n), 0);
  int32_t *ids;
  int k;
  ck_assert_int_eq(lks_tokenizer_encode(t, s, n, false, &ids, &k), 0);
  ck_assert_int_eq(ids[0], lks_tokenizer_token_id(t, "[gMASK]"));
  ck_assert_int_eq(ids[1], lks_tokenizer_token_id(t, "<sop>"));
  ck_assert_int_eq(ids[2], lks_tokenizer_token_id(t, "<|system|>"));
  ck_assert_int_eq(ids[k - 1], lks_tokenizer_token_id(t, "</think>"));
  free(ids);
  free(s);
  lks_tokenizer_free(t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tokenizer");
  TCase *tc = tcase_create("tokenizer");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, bpe_both_notations);
  tcase_add_test(tc, added_tokens);
  tcase_add_test(tc, utf8_replacement);
  tcase_add_test(tc, streaming);
  tcase_add_test(tc, directory_and_config);
  tcase_add_test(tc, malformed);
  tcase_add_test(tc, error_codes);
  tcase_add_test(tc, chat_prompt);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
