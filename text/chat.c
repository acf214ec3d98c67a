// SPDX-License-Identifier: MIT
// GLM's chat template, rendered natively (see chat.h). Each block below names the template
// lines it stands for; the whitespace is what Jinja leaves with trim_blocks and lstrip_blocks on
// (as transformers and @huggingface/jinja run chat templates) and the template's own {%- -%}.
#include "text/chat.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/utf8.h"

typedef struct {
  char *p;
  size_t n, cap;
  bool oom;
} buf;

static void put(buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

// ---- JavaScript's view of JSON values ----------------------------------------------------------

// Number.prototype.toString: the shortest digits that read back as x, laid out as ECMAScript
// does (plain up to 21 integer digits, exponent otherwise).
static void js_number(buf *b, double x) {
  char out[64];
  if (x == 0) {
    puts_(b, "0");
    return;
  }
  if (!isfinite(x)) {
    puts_(b, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity");
    return;
  }
  if (x < 0) {
    puts_(b, "-");
    x = -x;
  }
  char e[40];
  int prec = 1;
  for (; prec <= 17; prec++) {
    snprintf(e, sizeof e, "%.*e", prec - 1, x);
    if (strtod(e, NULL) == x) break;
  }
  // e = d[.ddd]e±XX
  char digits[24];
  int k = 0;
  const char *p = e;
  for (; *p && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9') digits[k++] = *p;
  while (k > 1 && digits[k - 1] == '0') k--;
  digits[k] = '\0';
  int n = atoi(p + 1) + 1;  // value = 0.digits x 10^n
  size_t o = 0;
  if (k <= n && n <= 21) {
    o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits);
    for (int i = k; i < n; i++) out[o++] = '0';
    out[o] = '\0';
  } else if (0 < n && n <= 21) {
    snprintf(out, sizeof out, "%.*s.%s", n, digits, digits + n);
  } else if (-6 < n && n <= 0) {
    o += (size_t)snprintf(out, sizeof out, "0.");
    for (int i = 0; i < -n; i++) out[o++] = '0';
    snprintf(out + o, sizeof out - o, "%s", digits);
  } else {
    snprintf(out, sizeof out, "%c%s%s%se%c%d", digits[0], k > 1 ? "." : "", digits + 1, "",
             n - 1 >= 0 ? '+' : '-', abs(n - 1));
  }
  puts_(b, out);
}

// JSON.stringify of a string.
static void js_string(buf *b, const char *s, size_t n) {
  puts_(b, "\"");
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char u[8];
    switch (c) {
      case '"': esc = "\\\""; break;
      case '\\': esc = "\\\\"; break;
      case '\b': esc = "\\b"; break;
      case '\f': esc = "\\f"; break;
      case '\n': esc = "\\n"; break;
      case '\r': esc = "\\r"; break;
      case '\t': esc = "\\t"; break;
      default:
        if (c < 0x20) {
          snprintf(u, sizeof u, "\\u%04x", c);
          esc = u;
        }
    }
    if (esc) {
      put(b, s + run, i - run);
      puts_(b, esc);
      run = i + 1;
    }
  }
  put(b, s + run, n - run);
  puts_(b, "\"");
}

// An array index as JavaScript orders object keys: a canonical integer below 2^32 - 1.
static bool index_key(const char *k, unsigned long *v) {
  if (!*k || (k[0] == '0' && k[1]) || strlen(k) > 10) return false;
  for (const char *p = k; *p; p++)
    if (*p < '0' || *p > '9') return false;
  *v = strtoul(k, NULL, 10);
  return *v < 4294967295ul;
}

// An object's keys in JavaScript's order: integer-like keys ascending, then the rest as written.
static const char **js_keys(const json_t *o, size_t *count) {
  size_t n = json_object_size(o), k = 0;
  const char **keys = malloc((n ? n : 1) * sizeof *keys);
  unsigned long *nums = malloc((n ? n : 1) * sizeof *nums);
  if (!keys || !nums) {
    free(keys);
    free(nums);
    return NULL;
  }
  const char *key;
  json_t *v;
  size_t ni = 0;
  json_object_foreach((json_t *)o, key, v) {
    unsigned long x;
    if (index_key(key, &x)) {
      size_t j = ni++;
      while (j > 0 && nums[j - 1] > x) {
        nums[j] = nums[j - 1];
        keys[j] = keys[j - 1];
        j--;
      }
      nums[j] = x;
      keys[j] = key;
    }
  }
  k = ni;
  json_object_foreach((json_t *)o, key, v) {
    unsigned long x;
    if (!index_key(key, &x)) keys[k++] = key;
  }
  free(nums);
  *count = k;
  return keys;
}

// @huggingface/jinja's toJSON with the default separators (", " and ": ").
static void js_json(buf *b, const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_NULL: puts_(b, "null"); break;
    case JSON_TRUE: puts_(b, "true"); break;
    case JSON_FALSE: puts_(b, "false"); break;
    case JSON_INTEGER: {
      char t[32];
      snprintf(t, sizeof t, "%lld", (long long)json_integer_value(v));
      puts_(b, t);
      break;
    }
    case JSON_REAL: js_number(b, json_real_value(v)); break;
    case JSON_STRING: js_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_ARRAY:
      puts_(b, "[");
      for (size_t i = 0; i < json_array_size(v); i++) {
        if (i) puts_(b, ", ");
        js_json(b, json_array_get(v, i));
      }
      puts_(b, "]");
      break;
    case JSON_OBJECT: {
      size_t n;
      const char **keys = js_keys(v, &n);
      if (!keys) {
        b->oom = true;
        return;
      }
      puts_(b, "{");
      for (size_t i = 0; i < n; i++) {
        if (i) puts_(b, ", ");
        js_string(b, keys[i], strlen(keys[i]));
        puts_(b, ": ");
        js_json(b, json_object_get(v, keys[i]));
      }
      puts_(b, "}");
      free(keys);
      break;
    }
  }
}

// {{ v }}: strings as they are, null and undefined (NULL) as nothing, the rest as JSON.
static void js_print(buf *b, const json_t *v) {
  if (!v || json_is_null(v)) return;
  if (json_is_string(v))
    put(b, json_string_value(v), json_string_length(v));
  else
    js_json(b, v);
}

static bool truthy(const json_t *v) {
  if (!v) return false;
  switch (json_typeof(v)) {
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return true;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    default: return false;
  }
}

static bool str_is(const json_t *v, const char *s) {
  return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

// ---- strings as the template's methods see them --------------------------------------------

static size_t lead_space(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const unsigned char *u = (const unsigned char *)s + i;
    uint32_t c;
    size_t l;
    if (u[0] < 0x80) c = u[0], l = 1;
    else if (u[0] < 0xE0) c = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F), l = 2;
    else if (u[0] < 0xF0) c = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F), l = 3;
    else c = 0x10000, l = 4;
    if (!lks__utf8_js_space(c)) break;
    i += l;
  }
  return i;
}

static size_t trail_len(const char *s, size_t n) {  // length without trailing whitespace
  while (n > 0) {
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    const unsigned char *u = (const unsigned char *)s + k;
    uint32_t c;
    if (u[0] < 0x80) c = u[0];
    else if (u[0] < 0xE0) c = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    else if (u[0] < 0xF0) c = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    else c = 0x10000;
    if (!lks__utf8_js_space(c)) break;
    n = k;
  }
  return n;
}

typedef struct {
  const char *p;
  size_t n;
} span;

static span trim(span s) {
  size_t a = lead_space(s.p, s.n);
  s.p += a;
  s.n -= a;
  s.n = trail_len(s.p, s.n);
  return s;
}

static const char *find(span s, const char *needle) {
  size_t m = strlen(needle);
  if (m > s.n) return NULL;
  for (size_t i = 0; i + m <= s.n; i++)
    if (!memcmp(s.p + i, needle, m)) return s.p + i;
  return NULL;
}

static const char *rfind(span s, const char *needle) {
  size_t m = strlen(needle);
  if (m > s.n) return NULL;
  for (size_t i = s.n - m + 1; i-- > 0;)
    if (!memcmp(s.p + i, needle, m)) return s.p + i;
  return NULL;
}

// ---- the template ---------------------------------------------------------------------------

// {%- macro visible_text(content) -%} ... {%- endmacro -%}
static void visible_text(buf *b, const json_t *content) {
  if (json_is_string(content)) {
    js_print(b, content);
  } else if (json_is_array(content)) {
    for (size_t i = 0; i < json_array_size(content); i++) {
      const json_t *item = json_array_get(content, i);
      if (json_is_object(item) && str_is(json_object_get(item, "type"), "text"))
        js_print(b, json_object_get(item, "text"));
      else if (json_is_string(item))
        js_print(b, item);
    }
  } else {
    js_print(b, content);
  }
}

static int bad(const char *fmt, size_t i) {
  return lks_set_error(LKS_EINVAL, fmt, i);
}

static int render_assistant(buf *b, const json_t *m, size_t index, long last_user) {
  puts_(b, "<|assistant|>");
  buf vt = {0};
  visible_text(&vt, json_object_get(m, "content"));
  span content = {vt.p ? vt.p : "", vt.n}, reasoning = {"", 0};
  const json_t *rc = json_object_get(m, "reasoning_content");
  if (json_is_string(rc)) {
    reasoning = (span){json_string_value(rc), json_string_length(rc)};
  } else if (find(content, "</think>")) {
    // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'); the
    // reference's rstrip/lstrip ignore their argument and trim all whitespace.
    const char *end = find(content, "</think>");
    span first = {content.p, (size_t)(end - content.p)};
    first.n = trail_len(first.p, first.n);
    const char *open = rfind(first, "<think>");
    if (open) {
      size_t skip = (size_t)(open - first.p) + 7;
      first.p += skip;
      first.n -= skip;
    }
    size_t a = lead_space(first.p, first.n);
    reasoning = (span){first.p + a, first.n - a};
    // content.split('</think>')[-1].lstrip('\n')
    const char *last = rfind(content, "</think>") + 8;
    span rest = {last, content.n - (size_t)(last - content.p)};
    a = lead_space(rest.p, rest.n);
    content = (span){rest.p + a, rest.n - a};
  }
  if ((long)index > last_user && reasoning.n > 0) {
    span r = trim(reasoning);
    puts_(b, "\n<think>");
    put(b, r.p, r.n);
    puts_(b, "</think>");
  } else {
    puts_(b, "\n<think></think>");
  }
  span c = trim(content);
  if (c.n) {
    puts_(b, "\n");
    put(b, c.p, c.n);
  }
  free(vt.p);
  const json_t *calls = json_object_get(m, "tool_calls");
  if (!truthy(calls)) return 0;
  if (!json_is_array(calls)) return bad("messages[%zu].tool_calls must be an array", index);
  for (size_t i = 0; i < json_array_size(calls); i++) {
    const json_t *tc = json_array_get(calls, i);
    if (json_is_object(tc) && truthy(json_object_get(tc, "function"))) tc = json_object_get(tc, "function");
    const json_t *name = json_object_get(tc, "name");
    if (!json_is_string(name)) return bad("messages[%zu]: a tool call without a name", index);
    puts_(b, "\n<tool_call>");
    js_print(b, name);
    puts_(b, "\n");
    const json_t *args = json_object_get(tc, "arguments");
    if (!truthy(args)) args = NULL;  // `tc.arguments or {}`
    // OpenAI's history carries the arguments as a JSON text ("{\"city\": \"Paris\"}"); the
    // template iterates an object, so the text is parsed first (as vLLM does).
    json_t *parsed = NULL;
    if (json_is_string(args)) {
      parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
      if (!json_is_object(parsed)) {
        json_decref(parsed);
        return bad("messages[%zu]: tool call arguments must be an object, or a string holding "
                   "a JSON object", index);
      }
      args = parsed;
    }
    if (args && !json_is_object(args))
      return bad("messages[%zu]: tool call arguments must be an object, or a string holding a "
                 "JSON object", index);
    size_t n = 0;
    const char **keys = args ? js_keys(args, &n) : calloc(1, sizeof *keys);
    if (!keys) {
      json_decref(parsed);
      return lks_set_error(LKS_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < n; k++) {
      const json_t *v = json_object_get(args, keys[k]);
      puts_(b, "<arg_key>");
      puts_(b, keys[k]);
      puts_(b, "</arg_key>\n<arg_value>");
      if (json_is_string(v)) js_print(b, v);
      else js_json(b, v);
      puts_(b, "</arg_value>\n");
    }
    free(keys);
    json_decref(parsed);
    puts_(b, "</tool_call>");
  }
  return 0;
}

static int render_tool(buf *b, const json_t *messages, const json_t *m, size_t index) {
  const json_t *content = json_object_get(m, "content");
  if (json_is_string(content)) {
    if (index == 0 || !str_is(json_object_get(json_array_get(messages, index - 1), "role"), "tool"))
      puts_(b, "<|observation|>");
    puts_(b, "\n<tool_response>\n");
    js_print(b, content);
    puts_(b, "\n</tool_response>");
    return 0;
  }
  if (!json_is_array(content))
    return bad("messages[%zu]: tool content must be a string or a list", index);
  puts_(b, "<|observation|>");
  for (size_t i = 0; i < json_array_size(content); i++) {
    const json_t *tr = json_array_get(content, i);
    const json_t *out = json_is_object(tr) ? json_object_get(tr, "output") : NULL;
    puts_(b, "\n<tool_response>\n");
    js_print(b, out ? out : tr);
    puts_(b, "\n</tool_response>");
  }
  return 0;
}

static const char TOOLS_HEAD[] =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
static const char TOOLS_TAIL[] =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
    "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>";

int lks_chat_render(const json_t *messages, const json_t *tools, int enable_thinking,
                    bool add_generation_prompt, char **out, size_t *len) {
  *out = NULL;
  if (!json_is_array(messages)) return lks_set_error(LKS_EINVAL, "chat: messages must be an array");
  buf b = {0};
  int rc = 0;
  bool no_think = enable_thinking == 0;  // `enable_thinking is defined and not enable_thinking`
  puts_(&b, "[gMASK]<sop>");
  if (truthy(tools)) {
    if (!json_is_array(tools)) return lks_set_error(LKS_EINVAL, "chat: tools must be an array");
    puts_(&b, TOOLS_HEAD);
    for (size_t i = 0; i < json_array_size(tools); i++) {
      js_json(&b, json_array_get(tools, i));
      puts_(&b, "\n");
    }
    puts_(&b, TOOLS_TAIL);
  }
  long last_user = -1;
  for (size_t i = 0; i < json_array_size(messages); i++)
    if (str_is(json_object_get(json_array_get(messages, i), "role"), "user")) last_user = (long)i;
  for (size_t i = 0; i < json_array_size(messages) && rc == 0; i++) {
    const json_t *m = json_array_get(messages, i);
    if (!json_is_object(m)) {
      rc = bad("chat: messages[%zu] must be an object", i);
      break;
    }
    const json_t *role = json_object_get(m, "role");
    if (str_is(role, "user")) {
      puts_(&b, "<|user|>\n");
      size_t at = b.n;
      visible_text(&b, json_object_get(m, "content"));
      bool ends = b.n - at >= 8 && !memcmp(b.p + b.n - 8, "/nothink", 8);
      if (no_think && !ends) puts_(&b, "/nothink");
    } else if (str_is(role, "assistant")) {
      rc = render_assistant(&b, m, i, last_user);
    } else if (str_is(role, "tool")) {
      rc = render_tool(&b, messages, m, i);
    } else if (str_is(role, "system")) {
      puts_(&b, "<|system|>\n");
      visible_text(&b, json_object_get(m, "content"));
    }
  }
  if (rc == 0 && add_generation_prompt) {
    puts_(&b, "<|assistant|>");
    if (no_think) puts_(&b, "\n<think></think>");
  }
  if (rc == 0 && b.oom) rc = lks_set_error(LKS_ENOMEM, "out of memory");
  if (rc < 0) {
    free(b.p);
    return rc;
  }
  *out = b.p;
  if (len) *len = b.n;
  return 0;
}

int lks_chat_prompt(const char *system, const char *user, bool no_think, char **out, size_t *len) {
  json_t *msgs = json_array();
  if (!msgs) return lks_set_error(LKS_ENOMEM, "out of memory");
  if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
  json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", user));
  int rc = json_array_size(msgs) == (system ? 2u : 1u)
               ? lks_chat_render(msgs, NULL, no_think ? 0 : -1, true, out, len)
               : lks_set_error(LKS_EINVAL, "chat: --system and --chat must be valid UTF-8");
  json_decref(msgs);
  return rc;
}
