// SPDX-License-Identifier: MIT
// The Anthropic Messages API (POST /v1/messages, POST /v1/messages/count_tokens), as Claude Code
// and the @anthropic-ai/sdk client speak it, on the same scheduler and GLM chat template as the
// OpenAI endpoints: system, messages of text / thinking / tool_use / tool_result blocks, tools
// (input_schema), tool_choice auto/none, max_tokens, stop_sequences, temperature, top_p, top_k,
// thinking {type: enabled|disabled}; the response as content blocks (thinking, text, tool_use)
// with stop_reason end_turn / max_tokens / stop_sequence / tool_use, or streamed as the event
// sequence message_start, content_block_start / _delta / _stop per block, message_delta (stop
// reason, usage), message_stop. Errors are {"type": "error", "error": {"type", "message"}}.
#ifndef LKS_API_ANTHROPIC_H
#define LKS_API_ANTHROPIC_H

#include "coordinator/api.h"

// Reads a Messages request: the conversation rendered by the chat template and encoded into
// p->prompt, the sampling settings and stop strings into p, *tools (a new reference, or NULL):
// the tools in OpenAI form for the output parser, *stream. count_only: only the prompt (for
// count_tokens: max_tokens is not required). max_tokens beyond the context is cut to what is left
// of it (clients such as Claude Code ask for more than a small model's context holds).
bool lks_anth_prepare(const lks_api_ctx *cx, const json_t *body, bool count_only,
                      lks_req_params *p, json_t **tools, bool *stream, lks_api_err *e);

// The response formatter for request r (borrowed). tools: consumed (NULL: no tool parsing).
// stops: the request's stop strings, copied (stop_sequence names the one that ended it).
int lks_anth_fmt(const lks_api_ctx *cx, lks_req *r, json_t *tools, const char *id, bool stream,
                 char *const *stops, int n_stops, lks_api_fmt *out);

// An error body for an HTTP status: {"type": "error", "error": {"type": ..., "message": msg}}.
json_t *lks_anth_error(unsigned status, const char *msg);

#endif
