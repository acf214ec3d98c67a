// SPDX-License-Identifier: MIT
// JSON mode (text/json_grammar.h) against an independent parser, jansson:
//   - the verdict on whole documents (a corpus of valid and invalid ones, UTF-8 edge cases,
//     random documents and random byte mutations of them) equals json_loadb's with
//     JSON_DECODE_ANY, within the recognizer's two bounds (depth, whitespace runs), which this
//     file checks on its own;
//   - every prefix of a valid document is accepted; every prefix the recognizer accepts, followed
//     by the completion its close cost counts (lks_json_close_byte, byte by byte, the cost falling
//     by one each time), is a document jansson accepts: no accepted prefix is a dead end;
//   - the mask: for states reached by random prefixes and random budgets, bit t is set exactly
//     when feeding token t's bytes (lks_tokenizer_id_bytes) one at a time succeeds and leaves a
//     close cost within the budget, end-of-sequence ids exactly when the document is complete,
//     special tokens never: brute force over the whole vocabulary;
//   - termination: random generations that pick any allowed token under a budget of B tokens
//     always end with a document jansson parses, within B tokens.
// The tokenizers: the default model's (LKS_SOURCE_DIR/models/glm-pydoc-tiny), the GLM-shaped
// fixture, and any tokenizer.json paths given on the command line (the 151k-token Qwen3 one).
#include <check.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tests/json_ref.h"
#include "testutil.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"

// ---- the reference verdict ----

static bool mine_accepts(const char *s, size_t n, bool object_only) {
  lks_json_state st;
  lks_json_init(&st, object_only);
  return lks_json_feed_bytes(&st, s, n) && lks_json_complete(&st);
}

// Feeds the completion the close cost counts and asks jansson about the result.
static void check_completion(const char *s, size_t n, const lks_json_state *at, bool object_only) {
  lks_json_state st = *at;
  size_t cap = n + 4096;
  char *buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  memcpy(buf, s, n);
  size_t m = n;
  int cost = lks_json_close_cost(&st);
  while (!lks_json_complete(&st) || cost > 0) {
    unsigned char b = lks_json_close_byte(&st);
    ck_assert_msg(b != 0, "no close byte at cost %d after '%.*s'", cost, (int)m, buf);
    ck_assert_msg(lks_json_feed(&st, b), "close byte 0x%02x refused after '%.*s'", b, (int)m, buf);
    ck_assert_int_lt(m, cap);
    buf[m++] = (char)b;
    int c2 = lks_json_close_cost(&st);
    ck_assert_msg(c2 == cost - 1, "cost %d -> %d after 0x%02x ('%.*s')", cost, c2, b, (int)m, buf);
    cost = c2;
  }
  ck_assert_msg(json_ref_accepts(buf, m, object_only), "completion not accepted by jansson: '%.*s'",
                (int)m, buf);
  free(buf);
}

// The verdict, the prefixes of what is accepted and their completions.
static void check_doc(const char *s, size_t n, bool object_only) {
  bool ref = json_ref_accepts(s, n, object_only), mine = mine_accepts(s, n, object_only);
  if (ref != mine)
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%02x%s", (unsigned char)s[i], i + 1 < n ? " " : "\n");
  ck_assert_msg(ref == mine, "'%.*s' (%zu bytes, object_only %d): jansson %d, recognizer %d",
                (int)n, s, n, object_only, ref, mine);
  lks_json_state st;
  lks_json_init(&st, object_only);
  check_completion(s, 0, &st, object_only);
  for (size_t i = 0; i < n; i++) {
    if (!lks_json_feed(&st, (unsigned char)s[i])) {
      ck_assert_msg(!ref, "prefix of a valid document refused at byte %zu: '%.*s'", i, (int)n, s);
      return;
    }
    // The state never accepts a prefix it cannot complete.
    check_completion(s, i + 1, &st, object_only);
  }
}

#define DOC(lit) {lit, sizeof(lit) - 1}
static const struct {
  const char *s;
  size_t n;
} corpus[] = {
    DOC("{}"), DOC("[]"), DOC("{\"a\":1}"), DOC(" { \"a\" : [1, 2.5, -0, 1e5, 1E+2, 0.0e-0] } "),
    DOC("{\"a\":{\"b\":{\"c\":[true,false,null]}}}"), DOC("\"x\""), DOC("0"), DOC("-1.25e+300"),
    DOC("1e400"), DOC("123456789012345678901234567890"), DOC("true"), DOC("null"), DOC("nul"),
    DOC("tru"), DOC("truee"), DOC("01"), DOC("-"), DOC("-01"), DOC("1."), DOC(".5"), DOC("1e"),
    DOC("1e+"), DOC("+1"), DOC("0x10"), DOC("1.5.2"), DOC("{\"a\"}"), DOC("{\"a\":}"),
    DOC("{\"a\":1,}"), DOC("[1,]"), DOC("[,1]"), DOC("{,}"), DOC("{1:2}"), DOC("{'a':1}"),
    DOC("[1 2]"), DOC("{\"a\":1 \"b\":2}"), DOC("{\"a\":1}}"), DOC("[[]"), DOC("]"), DOC(""),
    DOC("   "), DOC("{} {}"), DOC("{}x"), DOC("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\""),
    DOC("\"\\x\""), DOC("\"\\u00e9\\u00E9\""), DOC("\"\\u00g0\""), DOC("\"\\u12\""),
    DOC("\"\\ud83d\\ude00\""), DOC("\"\\ud83d\""), DOC("\"\\ude00\""), DOC("\"\\ud83d\\u0041\""),
    DOC("\"\\ud83dx\""), DOC("\"\\ud83d\\\""), DOC("\"\\u0000\""), DOC("\"\\uDBFF\\uDFFF\""),
    DOC("\"\\uD800\\uDC00\""), DOC("\"\\uDC00\\uD800\""), DOC("\"a\tb\""), DOC("\"a\nb\""),
    DOC("\"\x7f\""), DOC("\"\x01\""), DOC("\"\xc3\xa9\""), DOC("\"\xc3\""), DOC("\"\xc3x\""),
    DOC("\"\xc0\x80\""), DOC("\"\xc1\xbf\""), DOC("\"\xc2\x80\""), DOC("\"\xdf\xbf\""),
    DOC("\"\xe0\x9f\xbf\""), DOC("\"\xe0\xa0\x80\""), DOC("\"\xed\x9f\xbf\""),
    DOC("\"\xed\xa0\x80\""), DOC("\"\xee\x80\x80\""), DOC("\"\xef\xbf\xbf\""),
    DOC("\"\xf0\x8f\xbf\xbf\""), DOC("\"\xf0\x90\x80\x80\""), DOC("\"\xf4\x8f\xbf\xbf\""),
    DOC("\"\xf4\x90\x80\x80\""), DOC("\"\xf5\x80\x80\x80\""), DOC("\"\xff\""), DOC("\"\x80\""),
    DOC("\"\xe2\x82\""), DOC("\"\xf0\x9f\x98\x80\""), DOC("\"\xf0\x9f\x98\""), DOC("\xef\xbb\xbf{}"),
    DOC("{\"\xe4\xb8\xad\":\"\xe6\x96\x87\"}"), DOC("\"a\0b\""), DOC("{\"a\":1}\0"),
    DOC("[\n\t\r 1\n]"), DOC("[1,\n                2]"), DOC("[1,\n                 2]"),
    DOC("{\"a\": 1}                "), DOC("{\"a\": 1}                 "),
    DOC("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"),
    DOC("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"),
    DOC("{\"k\":[{\"k\":[{\"k\":[]}]}]}"), DOC("[-0.0e00]"), DOC("[1e-]"), DOC("[0e]"),
    DOC("[Infinity]"), DOC("[NaN]"), DOC("[-]"), DOC("[2.]"), DOC("[00]"), DOC("{\"a\" :1 , \"b\":[ ]}"),
};

START_TEST(test_corpus) {
  for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
    check_doc(corpus[i].s, corpus[i].n, false);
    check_doc(corpus[i].s, corpus[i].n, true);
  }
}
END_TEST

// ---- random documents ----

typedef struct {
  char *p;
  size_t n, cap;
} sb;
static void put(sb *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    ck_assert_ptr_nonnull(b->p);
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}
static void puts_(sb *b, const char *s) { put(b, s, strlen(s)); }

static uint64_t rng = 0x1234567;
static unsigned rnd(unsigned n) { return (unsigned)(tu_rand(&rng) % n); }

static void gen_ws(sb *b) {
  static const char *ws[] = {"", "", "", " ", "\n", "  ", "\n    ", "\t", "\r\n"};
  puts_(b, ws[rnd(9)]);
}

static void gen_string(sb *b) {
  static const char *parts[] = {"a", "key", " ", "\\\"", "\\\\", "\\/", "\\n", "\\t", "\\u00e9",
                                "\\u4e2d", "\\ud83d\\ude00", "\xc3\xa9", "\xe4\xb8\xad",
                                "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "\xef\xbf\xbd", "0", "{",
                                "]", ":", ","};
  puts_(b, "\"");
  for (unsigned i = rnd(5); i > 0; i--) puts_(b, parts[rnd(sizeof parts / sizeof *parts)]);
  puts_(b, "\"");
}

static void gen_value(sb *b, int depth, bool object) {
  unsigned k = object ? 0 : depth > 5 ? 2 + rnd(6) : rnd(8);
  switch (k) {
    case 0: case 1: {
      bool obj = k == 0;
      puts_(b, obj ? "{" : "[");
      unsigned n = rnd(4);
      for (unsigned i = 0; i < n; i++) {
        gen_ws(b);
        if (obj) {
          gen_string(b);
          gen_ws(b);
          puts_(b, ":");
          gen_ws(b);
        }
        gen_value(b, depth + 1, false);
        gen_ws(b);
        if (i + 1 < n) puts_(b, ",");
      }
      gen_ws(b);
      puts_(b, obj ? "}" : "]");
      break;
    }
    case 2: case 3: gen_string(b); break;
    case 4: {
      static const char *nums[] = {"0", "-0", "12", "-3.25", "1e10", "2E-3", "6.02e+23", "0.5",
                                   "-0.0", "123456789", "1e308"};
      puts_(b, nums[rnd(sizeof nums / sizeof *nums)]);
      break;
    }
    case 5: puts_(b, "true"); break;
    case 6: puts_(b, "false"); break;
    default: puts_(b, "null"); break;
  }
}

START_TEST(test_random_and_mutated) {
  static const unsigned char bytes[] = {'{', '}', '[', ']', '"', ':', ',', '\\', 'u', '0', '9', 'e',
                                        '-', '.', ' ', '\n', 't', 'n', 'D', 0x00, 0x1f, 0x7f, 0x80,
                                        0xbf, 0xc2, 0xe0, 0xed, 0xf0, 0xf4, 0xff, 'a', '+'};
  for (int it = 0; it < 1500; it++) {
    sb b = {0};
    bool obj = rnd(2);
    gen_ws(&b);
    gen_value(&b, 0, obj);
    gen_ws(&b);
    check_doc(b.p, b.n, obj);
    check_doc(b.p, b.n, !obj);
    for (int m = 0; m < 4; m++) {
      sb c = {0};
      put(&c, b.p, b.n);
      for (unsigned e = 1 + rnd(2); e > 0 && c.n; e--) {
        size_t at = rnd((unsigned)c.n);
        unsigned op = rnd(3);
        unsigned char x = bytes[rnd(sizeof bytes)];
        if (op == 0) c.p[at] = (char)x;
        else if (op == 1) memmove(c.p + at, c.p + at + 1, --c.n - at);
        else {
          put(&c, " ", 1);
          memmove(c.p + at + 1, c.p + at, c.n - at - 1);
          c.p[at] = (char)x;
        }
      }
      check_doc(c.p, c.n, obj);
      free(c.p);
    }
    free(b.p);
  }
}
END_TEST

// ---- the mask, by brute force over a vocabulary ----

static const lks_tokenizer *load_tok(const char *path) {
  lks_tokenizer *t = lks_tokenizer_load(path);
  ck_assert_msg(t != NULL, "%s: %s", path, lks_last_error());
  return t;
}

// Bit t as the brute force sees it.
static bool brute(const lks_tokenizer *t, int n, const int32_t *eos, int n_eos,
                  const lks_json_state *s, int budget, int id) {
  for (int i = 0; i < n_eos; i++)
    if (eos[i] == id) return lks_json_complete(s);
  if (id >= lks_tokenizer_n_ids(t) || lks_tokenizer_is_special(t, id)) return false;
  size_t len;
  const char *p = lks_tokenizer_id_bytes(t, id, &len);
  if (!p || len == 0) return false;
  lks_json_state x = *s;
  for (size_t i = 0; i < len; i++)
    if (!lks_json_feed(&x, (unsigned char)p[i])) return false;
  return budget < 0 || lks_json_close_cost(&x) <= budget - 1;
}

static void check_mask_on(const char *path, int states) {
  const lks_tokenizer *t = load_tok(path);
  int n = lks_tokenizer_n_ids(t) + 7;  // a model's vocabulary may have ids beyond the tokenizer's
  int32_t eos[2] = {lks_tokenizer_n_ids(t) - 1, -1};
  int n_eos = 1;
  int32_t sp = lks_tokenizer_token_id(t, "<|endoftext|>");
  if (sp >= 0) eos[n_eos++] = sp;
  lks_json_vocab *v = lks_json_vocab_new(t, n, eos, n_eos);
  ck_assert_ptr_nonnull(v);
  ck_assert_msg(lks_json_vocab_closable(v), "%s: single-byte tokens missing", path);
  uint64_t *mask = calloc((size_t)lks_json_mask_words(v), sizeof *mask);
  uint64_t *cached = calloc((size_t)lks_json_mask_words(v), sizeof *cached);
  lks_json_cache *cache = lks_json_cache_new(v, 4);  // small: entries are evicted and reused
  ck_assert(mask && cached && cache);
  if (n > 100000) states /= 6;  // a real vocabulary: fewer states, each over 151k tokens
  for (int it = 0; it < states; it++) {
    sb b = {0};
    bool obj = rnd(4) != 0;
    gen_value(&b, 0, obj);
    lks_json_state s;
    lks_json_init(&s, obj);
    size_t cut = rnd((unsigned)b.n + 1);
    ck_assert(lks_json_feed_bytes(&s, b.p, cut));
    int budget = rnd(3) == 0 ? -1 : (int)rnd(12) + lks_json_close_cost(&s);
    int got = lks_json_mask(v, &s, budget, mask), want = 0;
    for (int id = 0; id < n; id++) {
      bool bit = mask[id >> 6] >> (id & 63) & 1, exp = brute(t, n, eos, n_eos, &s, budget, id);
      ck_assert_msg(bit == exp, "%s: token %d after '%.*s' (budget %d): mask %d, brute force %d",
                    path, id, (int)cut, b.p, budget, bit, exp);
      want += exp;
      if (bit && id < lks_tokenizer_n_ids(t)) {
        lks_json_state x = s;
        ck_assert(lks_json_advance(v, &x, id));
      }
    }
    ck_assert_int_eq(got, want);
    // The cache gives the same bits, for this state and budget and for a few repeats of the
    // state under other budgets (hits, some of them bound by the budget).
    for (int rep = 0; rep < 3; rep++) {
      int b2 = rep == 0 ? budget : rnd(2) ? -1 : (int)rnd(8) + lks_json_close_cost(&s);
      int c = lks_json_cache_mask(cache, &s, b2, cached);
      int d = lks_json_mask(v, &s, b2, mask);
      ck_assert_int_eq(c, d);
      ck_assert(!memcmp(cached, mask, (size_t)lks_json_mask_words(v) * sizeof *mask));
    }
    ck_assert_msg(want > 0, "empty mask after '%.*s' at budget %d", (int)cut, b.p, budget);
    free(b.p);
  }
  uint64_t hits, misses;
  lks_json_cache_stats(cache, &hits, &misses);
  ck_assert_uint_gt(hits, 0);
  free(mask);
  free(cached);
  lks_json_cache_free(cache);
  lks_json_vocab_free(v);
  lks_tokenizer_free((lks_tokenizer *)t);
}

// Generations that take any allowed token (EOS with some probability once allowed) under a
// budget: each ends within it, with a document jansson parses.
static void check_termination_on(const char *path, int runs) {
  const lks_tokenizer *t = load_tok(path);
  int n = lks_tokenizer_n_ids(t);
  int32_t eos = lks_tokenizer_token_id(t, "<|endoftext|>");
  if (eos < 0) eos = n - 1;
  lks_json_vocab *v = lks_json_vocab_new(t, n, &eos, 1);
  ck_assert_ptr_nonnull(v);
  uint64_t *mask = calloc((size_t)lks_json_mask_words(v), sizeof *mask);
  int32_t *allowed = malloc((size_t)n * sizeof *allowed);
  ck_assert(mask && allowed);
  if (n > 100000) runs /= 10;
  for (int run = 0; run < runs; run++) {
    int budget = 2 + (int)rnd(run < runs / 2 ? 8 : 60);
    lks_json_state s;
    lks_json_init(&s, true);
    sb out = {0};
    int used = 0;
    bool ended = false;
    for (; used < budget && !ended; used++) {
      int k = lks_json_mask(v, &s, budget - used, mask), m = 0;
      ck_assert_msg(k > 0, "empty mask after '%.*s' with %d of %d tokens left", (int)out.n, out.p,
                    budget - used, budget);
      for (int id = 0; id < n; id++)
        if (mask[id >> 6] >> (id & 63) & 1) allowed[m++] = id;
      ck_assert_int_eq(m, k);
      int32_t tok = allowed[rnd((unsigned)m)];
      bool eos_ok = mask[eos >> 6] >> (eos & 63) & 1;
      if (eos_ok && rnd(3) == 0) tok = eos;
      ck_assert(lks_json_advance(v, &s, tok));
      if (tok == eos) {
        ended = true;
        continue;
      }
      size_t len;
      const char *p = lks_tokenizer_id_bytes(t, tok, &len);
      put(&out, p, len);
    }
    ck_assert_msg(lks_json_complete(&s), "budget %d spent, document open: '%.*s'", budget,
                  (int)out.n, out.p);
    ck_assert_msg(json_ref_accepts(out.p ? out.p : "", out.n, true), "'%.*s' does not parse",
                  (int)out.n, out.p);
    free(out.p);
  }
  free(mask);
  free(allowed);
  lks_json_vocab_free(v);
  lks_tokenizer_free((lks_tokenizer *)t);
}

static char g_paths[8][1024];
static int g_n_paths;

START_TEST(test_mask) {
  for (int i = 0; i < g_n_paths; i++) check_mask_on(g_paths[i], 300);
}
END_TEST

START_TEST(test_termination) {
  for (int i = 0; i < g_n_paths; i++) check_termination_on(g_paths[i], 300);
}
END_TEST

START_TEST(test_state_untouched_on_reject) {
  lks_json_state s, before;
  lks_json_init(&s, true);
  ck_assert(lks_json_feed_bytes(&s, "{\"a\":[1,", 8));
  before = s;
  ck_assert(!lks_json_feed_bytes(&s, "2,]", 3));
  ck_assert(!memcmp(&s, &before, sizeof s));
  ck_assert(!lks_json_feed(&s, '}'));
  ck_assert(!memcmp(&s, &before, sizeof s));
  ck_assert(lks_json_feed_bytes(&s, "2]}", 3));
  ck_assert(lks_json_complete(&s));
}
END_TEST

int main(int argc, char **argv) {
  const char *src = getenv("LKS_SOURCE_DIR");
  if (src) {
    snprintf(g_paths[g_n_paths++], sizeof g_paths[0], "%s/models/glm-pydoc-tiny", src);
    snprintf(g_paths[g_n_paths++], sizeof g_paths[0], "%s/tests/tokenizer/glm-fixture", src);
  }
  for (int i = 1; i < argc && g_n_paths < 8; i++)
    snprintf(g_paths[g_n_paths++], sizeof g_paths[0], "%s", argv[i]);
  Suite *s = suite_create("json_grammar");
  TCase *tc = tcase_create("recognizer");
  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, test_corpus);
  tcase_add_test(tc, test_random_and_mutated);
  tcase_add_test(tc, test_state_untouched_on_reject);
  suite_add_tcase(s, tc);
  tc = tcase_create("mask");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_mask);
  tcase_add_test(tc, test_termination);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
