// SPDX-License-Identifier: MIT
// GLM's assistant output, read back into its parts: reasoning (between <think> and </think>),
// content, and tool calls, as the GLM chat template writes them (text/chat.c):
//   GLM-4.5/4.6: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>
//   GLM-4.7/5:   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
// (whitespace between the parts is ignored, so both forms and mixtures read the same).
//
// The parser streams: text goes in as it is generated, cut anywhere (inside a marker, inside a
// UTF-8 character), and comes out as events in order; text that could still be the start of a
// marker, or an incomplete character, is held until the next piece decides it. Feeding a text
// in any number of pieces gives the same events, once adjacent text events of one kind are
// joined, as feeding it whole (tests/unit/check_toolcall.c checks every split).
//
// Reasoning and content: leading whitespace of each is dropped (the template strips both when it
// renders them back); a <think> anywhere starts reasoning, so no <think> reaches content. Tool
// calls are parsed only when the parser was given tools. A call that is malformed (no name, text
// outside the key/value pairs, a key without a value) or cut off by the end of the output is
// returned as content, as it was written, never dropped.
//
// Argument values: a value stays a string when the tool's JSON schema gives the argument type
// "string" (or a list of types containing it); otherwise it is read as JSON, and kept as a string
// when it is not JSON. `arguments` is also given as JSON text in which the values read as JSON
// appear exactly as the model wrote them (no reformatting of numbers).
//
// One parser per output; not thread-safe; no global state.
#ifndef LKS_TOOLCALL_H
#define LKS_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum { LKS_GLM_CONTENT, LKS_GLM_REASONING, LKS_GLM_TOOL_CALL } lks_glm_kind;

typedef struct lks_glm_event {
  lks_glm_kind kind;
  const char *text;  // CONTENT, REASONING: valid UTF-8, len bytes (not NUL-terminated)
  size_t len;
  const char *name;       // TOOL_CALL: the function's name (NUL-terminated)
  const json_t *args;     // TOOL_CALL: the arguments, an object
  const char *args_json;  // TOOL_CALL: the same as compact JSON text (NUL-terminated)
} lks_glm_event;

// Called for each event; the event and what it points to live until the callback returns.
typedef void (*lks_glm_emit)(void *ctx, const lks_glm_event *ev);

// The special tokens of GLM's chat format that its output may contain (the decoder must print
// them for the parser to see them: lks_detok_keep).
extern const char *const lks_glm_markup[];
extern const int lks_glm_n_markup;

typedef struct lks_glm_parser lks_glm_parser;

// tools: the request's tool list (OpenAI form: [{"type": "function", "function": {"name",
// "parameters"}}], or Anthropic's [{"name", "input_schema"}]), borrowed for the parser's life; NULL
// or empty: tool calls are not parsed (they stay content). NULL when out of memory.
lks_glm_parser *lks_glm_parser_new(const json_t *tools);
void lks_glm_parser_free(lks_glm_parser *p);
// Feeds n bytes of output. 0, or LKS_ENOMEM.
int lks_glm_parser_feed(lks_glm_parser *p, const char *s, size_t n, lks_glm_emit emit, void *ctx);
// The output ended: what was held comes out (an unfinished tool call as content). 0 or LKS_ENOMEM.
int lks_glm_parser_end(lks_glm_parser *p, lks_glm_emit emit, void *ctx);
// Tool calls emitted so far.
int lks_glm_parser_n_calls(const lks_glm_parser *p);

#endif
