// SPDX-License-Identifier: MIT
// OpenAI chat completions beyond plain text: tools and tool_choice, tool calls and tool results
// in the conversation, reasoning, and the response shaped from the model's GLM-format output
// (text/toolcall.h): message.content, message.reasoning_content (and .reasoning), message.
// tool_calls with arguments as a JSON string, finish_reason "tool_calls"; streamed as delta.
// content / delta.reasoning_content / delta.tool_calls chunks.
#ifndef LKS_API_OPENAI_H
#define LKS_API_OPENAI_H

#include "coordinator/api.h"

// Reads the conversation of a chat request (body) for the chat template. *messages: a new array
// (the caller owns it) with assistant tool_calls[].function.arguments given as JSON text parsed
// into objects and "developer" messages as "system". *tools: body.tools (borrowed) or NULL.
// *think: the template's enable_thinking (-1 undefined, 0, 1) from chat_template_kwargs or
// --no-think. *parse_tools: whether tool calls in the output are parsed (tools given and
// tool_choice not "none"). tool_choice "required" or a named function is refused (400, param
// tool_choice): the output is not constrained to a call.
bool lks_oai_chat_prepare(const lks_api_ctx *cx, const json_t *body, json_t **messages,
                          const json_t **tools, int *think, bool *parse_tools, lks_api_err *e);

// How a chat formatter writes one choice of a response.
typedef struct lks_oai_choice {
  int index;       // choices[].index
  bool part;       // one of n > 1 choices: a stream ends without usage and [DONE], and a plain
                   // response is the whole JSON of this choice alone (the caller merges them)
  bool logprobs;   // choices[].logprobs.content from the request's reports
} lks_oai_choice;

// The chat response formatter for request r (borrowed; it must outlive the formatter). tools:
// the request's tools when tool calls are parsed, else NULL (held by the formatter). stream:
// SSE chunks, with usage last when include_usage (and "usage": null before). token_ids: add the
// generated ids to the message (an extension, as vLLM's return_token_ids). 0 or LKS_ENOMEM.
int lks_oai_chat_fmt(const lks_api_ctx *cx, lks_req *r, const json_t *tools, const char *id,
                     long created, bool stream, bool include_usage, bool token_ids,
                     const lks_oai_choice *choice, lks_api_fmt *out);

// response_format: absent, null or {"type": "text"} (no constraint), {"type": "json_object"}
// (*json_object: the output is constrained to one JSON object); anything else, json_schema
// included, is a 400 naming response_format.
bool lks_oai_response_format(const json_t *body, bool *json_object, lks_api_err *e);

// Token reports (coordinator/logits.h) of generated ids[0, n) as OpenAI writes them: the chat
// form, a list of {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}; and the
// legacy completions form, appended to the lists tokens, token_logprobs, top_logprobs (dicts)
// and text_offset of *legacy (made when NULL), *text_off the offset of the next token's text in
// bytes of the completion. tok may be NULL (tokens are then "token_id:N").
json_t *lks_oai_logprobs_chat(const lks_tokenizer *tok, const int32_t *ids,
                              const lks_tok_logprob *lp, int n);
void lks_oai_logprobs_legacy(const lks_tokenizer *tok, const int32_t *ids,
                             const lks_tok_logprob *lp, int n, json_t **legacy, long *text_off);

// The usage object of a finished request.
json_t *lks_oai_usage(const lks_req_news *n);

#endif
