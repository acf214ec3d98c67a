// SPDX-License-Identifier: MIT
// chat_render: the prompt `lockstep serve` builds for a request body, as token ids, by the
// server's own code (lks_oai_chat_prepare + lks_chat_render for /v1/chat/completions,
// lks_anth_prepare for /v1/messages) and the model directory's tokenizer. The tool-call
// fine-tuning (tools/train/finetune_tools.py) renders its transcripts with it, so the training
// text is byte-identical to what the server feeds the model.
// Usage: chat_render MODEL_DIR < requests.jsonl > prompts.jsonl
//   each input line:  {"api": "openai" | "anthropic", "body": {request body}}
//   each output line: {"ids": [token ids]} or {"error": "..."}
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api.h"
#include "coordinator/api_anthropic.h"
#include "coordinator/api_openai.h"
#include "core/error.h"
#include "text/chat.h"
#include "text/tokenizer.h"

static json_t *ids_json(const int32_t *ids, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
  return json_pack("{s:o}", "ids", a);
}

static json_t *render(const lks_api_ctx *cx, const char *api, const json_t *body) {
  lks_api_err e = {0};
  if (!strcmp(api, "openai")) {
    json_t *conv;
    const json_t *tools;
    int think;
    bool parse_tools;
    if (!lks_oai_chat_prepare(cx, body, &conv, &tools, &think, &parse_tools, &e))
      return json_pack("{s:s}", "error", e.msg);
    char *text;
    size_t len;
    int rc = lks_chat_render(conv, tools, think, true, &text, &len);
    json_decref(conv);
    if (rc < 0) return json_pack("{s:s}", "error", lks_last_error());
    int32_t *ids = NULL;
    int n = 0;
    rc = lks_tokenizer_encode(cx->tok, text, len, false, &ids, &n);
    free(text);
    if (rc < 0) return json_pack("{s:s}", "error", lks_last_error());
    json_t *o = ids_json(ids, n);
    free(ids);
    return o;
  }
  if (!strcmp(api, "anthropic")) {
    lks_req_params p = {0};
    json_t *tools = NULL;
    bool stream;
    if (!lks_anth_prepare(cx, body, true, &p, &tools, &stream, &e)) {
      free(p.prompt);
      return json_pack("{s:s}", "error", e.msg);
    }
    json_decref(tools);
    json_t *o = ids_json(p.prompt, p.n_prompt);
    free(p.prompt);
    for (int i = 0; i < p.n_stop; i++) free(p.stop[i]);
    free(p.stop);
    return o;
  }
  return json_pack("{s:s}", "error", "api must be \"openai\" or \"anthropic\"");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: chat_render MODEL_DIR < requests.jsonl\n");
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", argv[1]);
  lks_tokenizer *tok = lks_tokenizer_load(path);
  if (!tok) {
    fprintf(stderr, "chat_render: cannot load %s: %s\n", path, lks_last_error());
    return 1;
  }
  lks_api_stats stats = {0};
  lks_api_ctx cx = {.tok = tok, .model_id = "render", .max_len = 1 << 30, .no_think = false,
                    .fingerprint = "render", .stats = &stats};
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  int bad = 0;
  while ((n = getline(&line, &cap, stdin)) > 0) {
    json_error_t je;
    // Read as the server reads request bodies (coordinator/http.c).
    json_t *req = json_loadb(line, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    json_t *out;
    const char *api = json_string_value(json_object_get(req, "api"));
    if (!req || !api || !json_is_object(json_object_get(req, "body")))
      out = json_pack("{s:s}", "error", "each line must be {\"api\": ..., \"body\": {...}}");
    else
      out = render(&cx, api, json_object_get(req, "body"));
    bad += json_object_get(out, "error") != NULL;
    char *s = json_dumps(out, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(out);
    json_decref(req);
  }
  free(line);
  lks_tokenizer_free(tok);
  return bad ? 1 : 0;
}
