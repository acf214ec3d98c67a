// SPDX-License-Identifier: MIT
// The GLM output parser (text/toolcall.c) on text written by the chat template: every assistant
// turn with tool calls in tests/tokenizer/chat_cases.json, rendered by GLM-4.6's template, is the
// text a model writes for that turn; parsed, it must give back the turn's reasoning, content and
// tool calls (arguments equal as JSON). The rendering is lks_chat_render (byte-identical to
// @huggingface/jinja, test chat_glm46) or, given a file as argv[1], @huggingface/jinja's own
// output (ref_chat.mjs; test toolcall_jinja). Each text is also fed split at every byte boundary
// and one byte at a time, with the same result; malformed and truncated calls come back as text;
// the GLM-4.7 form without newlines; argument typing by the tool's schema.
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/chat.h"
#include "text/toolcall.h"
#include "text/tokenizer.h"

static const char *g_expected;  // @huggingface/jinja's renderings, or NULL

// ---- collecting events ----

typedef struct {
  char content[65536], reasoning[65536];
  size_t nc, nr;
  json_t *calls;  // [{"name", "arguments" (object), "json" (text)}]
  bool bad_utf8;
} result;

// JSON equality with numbers compared by value (the cases are read as JavaScript reads them).
static bool jeq(const json_t *a, const json_t *b) {
  if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
  if (json_typeof(a) != json_typeof(b)) return false;
  if (json_is_array(a)) {
    if (json_array_size(a) != json_array_size(b)) return false;
    for (size_t i = 0; i < json_array_size(a); i++)
      if (!jeq(json_array_get(a, i), json_array_get(b, i))) return false;
    return true;
  }
  if (json_is_object(a)) {
    if (json_object_size(a) != json_object_size(b)) return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)a, k, v) if (!json_object_get(b, k) || !jeq(v, json_object_get(b, k))) return false;
    return true;
  }
  return json_equal(a, b);
}

static bool valid_utf8(const char *s, size_t n) {
  size_t m;
  char *t = lks_utf8_sanitize(s, n, &m);
  bool ok = t && m == n && !memcmp(t, s, n);
  free(t);
  return ok;
}

static void on_event(void *ctx, const lks_glm_event *ev) {
  result *r = ctx;
  if (ev->kind == LKS_GLM_TOOL_CALL) {
    json_t *args = json_loads(ev->args_json, JSON_DECODE_INT_AS_REAL, NULL);
    ck_assert_msg(args && jeq(args, ev->args), "args_json %s is the arguments object", ev->args_json);
    json_decref(args);
    json_array_append_new(r->calls, json_pack("{s:s, s:O, s:s}", "name", ev->name, "arguments",
                                              ev->args, "json", ev->args_json));
    return;
  }
  r->bad_utf8 |= !valid_utf8(ev->text, ev->len);
  char *dst = ev->kind == LKS_GLM_CONTENT ? r->content : r->reasoning;
  size_t *n = ev->kind == LKS_GLM_CONTENT ? &r->nc : &r->nr;
  ck_assert(*n + ev->len < sizeof r->content);
  memcpy(dst + *n, ev->text, ev->len);
  *n += ev->len;
  dst[*n] = '\0';
}

// Parses s[0, n) fed in pieces: cut at `cut` (0: whole), or every byte alone (cut == -1).
static void parse(const json_t *tools, const char *s, size_t n, long cut, result *r) {
  memset(r, 0, sizeof *r);
  r->calls = json_array();
  lks_glm_parser *p = lks_glm_parser_new(tools);
  ck_assert_ptr_nonnull(p);
  if (cut < 0) {
    for (size_t i = 0; i < n; i++) ck_assert_int_eq(lks_glm_parser_feed(p, s + i, 1, on_event, r), 0);
  } else {
    size_t c = (size_t)cut < n ? (size_t)cut : n;
    ck_assert_int_eq(lks_glm_parser_feed(p, s, c, on_event, r), 0);
    ck_assert_int_eq(lks_glm_parser_feed(p, s + c, n - c, on_event, r), 0);
  }
  ck_assert_int_eq(lks_glm_parser_end(p, on_event, r), 0);
  ck_assert_int_eq(lks_glm_parser_n_calls(p), (int)json_array_size(r->calls));
  lks_glm_parser_free(p);
}

static void same(const result *a, const result *b, const char *what) {
  ck_assert_msg(a->nc == b->nc && !memcmp(a->content, b->content, a->nc), "%s: content '%s' vs '%s'",
                what, a->content, b->content);
  ck_assert_msg(a->nr == b->nr && !memcmp(a->reasoning, b->reasoning, a->nr), "%s: reasoning", what);
  ck_assert_msg(json_equal(a->calls, b->calls), "%s: tool calls", what);
  ck_assert_msg(!b->bad_utf8, "%s: every text event is valid UTF-8", what);
}

// Whole, at every cut, byte by byte: the same result (returned in *whole).
static void parse_all_ways(const json_t *tools, const char *s, size_t n, result *whole) {
  parse(tools, s, n, 0, whole);
  result *r = malloc(sizeof *r);
  for (long cut = 1; cut < (long)n; cut++) {
    parse(tools, s, n, cut, r);
    char what[64];
    snprintf(what, sizeof what, "split at byte %ld", cut);
    same(whole, r, what);
    json_decref(r->calls);
  }
  parse(tools, s, n, -1, r);
  same(whole, r, "byte by byte");
  json_decref(r->calls);
  free(r);
}

// ---- the template's assistant turns ----

static const char *trim_ws(const char *s, size_t *n) {
  while (*n && strchr(" \t\r\n", *s)) s++, (*n)--;
  while (*n && strchr(" \t\r\n", s[*n - 1])) (*n)--;
  return s;
}

// The text of assistant turn k (0-based) in a rendering: after its <|assistant|>, up to the
// next role marker.
static bool assistant_turn(const char *text, int k, const char **s, size_t *n) {
  const char *p = text;
  for (int i = 0; i <= k; i++) {
    p = strstr(p, "<|assistant|>");
    if (!p) return false;
    p += 13;
  }
  const char *end = p + strlen(p);
  static const char *roles[] = {"<|assistant|>", "<|user|>", "<|observation|>", "<|system|>"};
  for (int i = 0; i < 4; i++) {
    const char *q = strstr(p, roles[i]);
    if (q && q < end) end = q;
  }
  *s = p;
  *n = (size_t)(end - p);
  return true;
}

static int n_checked_calls;

START_TEST(test_template_turns) {
  const char *dir = getenv("LKS_SOURCE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/tokenizer/chat_cases.json", dir ? dir : ".");
  json_t *cases = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL);
  ck_assert_msg(json_is_array(cases), "cannot read %s", path);
  json_t *want = NULL;
  if (g_expected) {
    want = json_load_file(g_expected, 0, NULL);
    ck_assert_msg(json_is_array(want) && json_array_size(want) == json_array_size(cases), "%s", g_expected);
  }
  size_t ci;
  json_t *c;
  int turns = 0;
  json_array_foreach(cases, ci, c) {
    json_t *tools = json_object_get(c, "tools"), *msgs = json_object_get(c, "messages");
    if (!tools) continue;
    char *text = NULL;
    if (want) {
      text = strdup(json_string_value(json_array_get(want, ci)));
    } else {
      json_t *think = json_object_get(c, "enable_thinking");
      size_t len;
      ck_assert_int_eq(lks_chat_render(msgs, tools, think ? json_is_true(think) : -1,
                                       json_is_true(json_object_get(c, "add_generation_prompt")),
                                       &text, &len), 0);
    }
    long last_user = -1;
    for (size_t i = 0; i < json_array_size(msgs); i++)
      if (!strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "user")) last_user = (long)i;
    int k = 0;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
      json_t *m = json_array_get(msgs, i);
      if (strcmp(json_string_value(json_object_get(m, "role")), "assistant") != 0) continue;
      const char *s;
      size_t n;
      ck_assert(assistant_turn(text, k++, &s, &n));
      result *r = malloc(sizeof *r);
      parse_all_ways(tools, s, n, r);
      // What the turn holds: content (inline <think> split off), reasoning when shown.
      const char *content = json_string_value(json_object_get(m, "content"));
      content = content ? content : "";
      const char *reasoning = json_string_value(json_object_get(m, "reasoning_content"));
      const char *close = strstr(content, "</think>");
      char inline_r[4096] = "";
      if (!reasoning && close) {
        const char *open = strstr(content, "<think>");
        const char *from = open && open < close ? open + 7 : content;
        snprintf(inline_r, sizeof inline_r, "%.*s", (int)(close - from), from);
        reasoning = inline_r;
        content = close + 8;
      }
      size_t cn = strlen(content), rn = reasoning ? strlen(reasoning) : 0;
      const char *ct = trim_ws(content, &cn);
      const char *rt = reasoning ? trim_ws(reasoning, &rn) : "";
      if ((long)i <= last_user) rn = 0;  // the template shows reasoning after the last user turn only
      // Trailing whitespace of content is the template's to drop, not the parser's.
      size_t got_c = r->nc;
      trim_ws(r->content, &got_c);
      ck_assert_msg(got_c == cn && !memcmp(r->content, ct, cn), "case %zu message %zu: content '%s', want '%.*s'",
                    ci, i, r->content, (int)cn, ct);
      ck_assert_msg(r->nr == rn && !memcmp(r->reasoning, rt, rn), "case %zu message %zu: reasoning '%s'", ci, i, r->reasoning);
      json_t *calls = json_object_get(m, "tool_calls");
      ck_assert_int_eq(json_array_size(r->calls), json_array_size(calls));
      for (size_t j = 0; j < json_array_size(calls); j++) {
        json_t *tc = json_array_get(calls, j);
        if (json_object_get(tc, "function")) tc = json_object_get(tc, "function");
        json_t *args = json_object_get(tc, "arguments");
        json_t *empty = json_object();
        json_t *got = json_array_get(r->calls, j);
        ck_assert_str_eq(json_string_value(json_object_get(got, "name")), json_string_value(json_object_get(tc, "name")));
        char *a = json_dumps(args ? args : empty, JSON_COMPACT), *b = json_dumps(json_object_get(got, "arguments"), JSON_COMPACT);
        ck_assert_msg(jeq(args ? args : empty, json_object_get(got, "arguments")),
                      "case %zu message %zu call %zu: arguments %s, want %s", ci, i, j, b, a);
        free(a);
        free(b);
        json_decref(empty);
        n_checked_calls++;
      }
      json_decref(r->calls);
      free(r);
      turns++;
    }
    free(text);
  }
  ck_assert_msg(turns >= 6 && n_checked_calls >= 8, "%d turns, %d calls checked", turns, n_checked_calls);
  json_decref(cases);
  json_decref(want);
}
END_TEST

// ---- hand-written outputs ----

static json_t *tools_weather(void) {
  return json_loads(
      "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
      "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, "
      "\"code\": {\"type\": \"string\"}}}}},"
      " {\"name\": \"anthropic_style\", \"input_schema\": {\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"string\"}}}}]",
      0, NULL);
}

START_TEST(test_glm47_form) {
  json_t *tools = tools_weather();
  const char *s = "<think>plan</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                  "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><tool_call>get_weather"
                  "<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>";
  result r;
  parse_all_ways(tools, s, strlen(s), &r);
  ck_assert_str_eq(r.reasoning, "plan");
  ck_assert_str_eq(r.content, "");
  ck_assert_int_eq(json_array_size(r.calls), 2);
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(r.calls, 0), "json")), "{\"city\":\"Paris\",\"days\":2}");
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(r.calls, 1), "json")), "{\"city\":\"Rome\"}");
  json_decref(r.calls);
  json_decref(tools);
}
END_TEST

START_TEST(test_typing) {
  json_t *tools = tools_weather();
  // city and code are strings by the schema: "123" and "[1]" stay strings; days is read as JSON;
  // an argument the schema does not know is JSON when it parses, else a string; numbers keep
  // the model's digits.
  const char *s = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n"
                  "<arg_key>code</arg_key>\n<arg_value>[1]</arg_value>\n<arg_key>days</arg_key>\n"
                  "<arg_value> 7 </arg_value>\n<arg_key>extra</arg_key>\n<arg_value>{\"a\": 0.1}</arg_value>\n"
                  "<arg_key>note</arg_key>\n<arg_value>not json</arg_value>\n</tool_call>"
                  "<tool_call>anthropic_style\n<arg_key>id</arg_key>\n<arg_value>007</arg_value>\n</tool_call>";
  result r;
  parse_all_ways(tools, s, strlen(s), &r);
  ck_assert_int_eq(json_array_size(r.calls), 2);
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(r.calls, 0), "json")),
                   "{\"city\":\"123\",\"code\":\"[1]\",\"days\":7,\"extra\":{\"a\": 0.1},\"note\":\"not json\"}");
  ck_assert_str_eq(json_string_value(json_object_get(json_array_get(r.calls, 1), "json")), "{\"id\":\"007\"}");
  json_decref(r.calls);
  json_decref(tools);
}
END_TEST

// Malformed and truncated calls come back as the text they were; nothing crashes.
START_TEST(test_malformed) {
  json_t *tools = tools_weather();
  static const char *bad[] = {
      "<tool_call>\n<arg_key>city</arg_key>\n<arg_value>x</arg_value>\n</tool_call>",  // no name
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>",                 // key, no value
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>x</arg_value>\nstray text\n</tool_call>",
      "<tool_call>get_weather\n<arg_value>x</arg_value>\n</tool_call>",
      "<tool_call>get weather<x>\n</tool_call>",
      "<tool_call>get_weather\n<arg_key>city</arg_value>\n</tool_call>",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char s[512];
    snprintf(s, sizeof s, "Before. %s After.", bad[i]);
    result r;
    parse_all_ways(tools, s, strlen(s), &r);
    ck_assert_int_eq(json_array_size(r.calls), 0);
    char want[512];
    snprintf(want, sizeof want, "Before. %sAfter.", bad[i]);  // whitespace after a call is dropped
    ck_assert_str_eq(r.content, want);
    json_decref(r.calls);
  }
  // Every prefix of a good call (the output cut off by max_tokens): no call, the text back.
  const char *good = "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n</tool_call>";
  size_t n = strlen(good);
  for (size_t k = 0; k <= n; k++) {
    result r;
    parse(tools, good, k, 0, &r);
    size_t calls = json_array_size(r.calls);
    if (k < n) {
      ck_assert_int_eq(calls, 0);
      // The content is the prefix itself (as valid UTF-8).
      size_t m;
      char *t = lks_utf8_sanitize(good, k, &m);
      ck_assert_msg(r.nc == m && !memcmp(r.content, t, m), "prefix %zu: '%s'", k, r.content);
      free(t);
    } else {
      ck_assert_int_eq(calls, 1);
      ck_assert_str_eq(r.content, "Sure.\n");
    }
    json_decref(r.calls);
  }
  json_decref(tools);
}
END_TEST

START_TEST(test_reasoning_and_no_tools) {
  // No tools: tool-call markup is content. <think> anywhere is reasoning, never content.
  const char *s = "\n<think>\nI think.\n</think>\n\nAnswer <tool_call>x</tool_call> then <think>more</think>end";
  result r;
  parse_all_ways(NULL, s, strlen(s), &r);
  ck_assert_str_eq(r.reasoning, "I think.\nmore");
  ck_assert_str_eq(r.content, "Answer <tool_call>x</tool_call> then end");
  json_decref(r.calls);
  // An empty think block (thinking off) and UTF-8 split across pieces.
  const char *t = "<think></think>\nZürich 世界 👨‍👩‍👧 <thin";
  parse_all_ways(NULL, t, strlen(t), &r);
  ck_assert_str_eq(r.reasoning, "");
  ck_assert_str_eq(r.content, "Zürich 世界 👨‍👩‍👧 <thin");
  json_decref(r.calls);
  // Reasoning cut off by the end of the output stays reasoning.
  const char *u = "<think>still thinking";
  parse_all_ways(NULL, u, strlen(u), &r);
  ck_assert_str_eq(r.reasoning, "still thinking");
  ck_assert_str_eq(r.content, "");
  json_decref(r.calls);
}
END_TEST

int main(int argc, char **argv) {
  g_expected = argc > 1 ? argv[1] : NULL;
  Suite *s = suite_create("toolcall");
  TCase *tc = tcase_create("template");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_template_turns);
  suite_add_tcase(s, tc);
  tc = tcase_create("forms");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_glm47_form);
  tcase_add_test(tc, test_typing);
  tcase_add_test(tc, test_malformed);
  tcase_add_test(tc, test_reasoning_and_no_tools);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
