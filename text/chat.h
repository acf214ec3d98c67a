// SPDX-License-Identifier: MIT
// The GLM chat prompt, rendered natively: byte-identical to what a Jinja engine (the tests use
// @huggingface/jinja, as transformers.js does) makes of the chat_template that GLM-4.5/4.6 ship
// in tokenizer_config.json (tests/tokenizer/templates/glm-4.6.jinja), for conversations in
// the OpenAI-style JSON that template reads:
//   messages: [{"role": "system"|"user"|"assistant"|"tool", "content": string | [parts] | ...,
//               "reasoning_content": string?, "tool_calls": [{"function": {"name": ...,
//               "arguments": {...}}}]?}, ...]
//   tools:    [tool schema objects] or NULL
// That template's quirks are kept on purpose (the reference is the engine, not intent): its
// rstrip('\n')/lstrip('\n') trim all whitespace, values print as JavaScript prints them, objects
// print as JSON with ", " and ": ", integer-like keys first.
// Pure functions of their arguments; any thread.
#ifndef LKS_CHAT_H
#define LKS_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

// enable_thinking: -1 leaves it undefined (the model thinks), 0 false (/nothink and an empty
// <think></think> after the generation prompt), 1 true. On success *out is malloc'd and
// NUL-terminated (*len bytes; the caller frees it). A conversation the template itself would
// fail on (messages not an array, tool-call arguments that are not an object, ...) is
// LKS_EINVAL with lks_last_error() naming the message.
int lks_chat_render(const json_t *messages, const json_t *tools, int enable_thinking,
                    bool add_generation_prompt, char **out, size_t *len);

// The prompt of one user turn, with an optional system message: what `generate --chat` feeds
// the model. no_think: enable_thinking = false. Same ownership as lks_chat_render.
int lks_chat_prompt(const char *system, const char *user, bool no_think, char **out, size_t *len);

#endif
