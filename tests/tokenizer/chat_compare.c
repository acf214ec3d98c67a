// SPDX-License-Identifier: MIT
// lockstep's GLM chat rendering against @huggingface/jinja's rendering of the published template
// (ref_chat.mjs): byte-identical output for every conversation of chat_cases.json.
// Usage: chat_compare chat_cases.json EXPECTED.json
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/chat.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: chat_compare CASES EXPECTED\n");
    return 2;
  }
  json_error_t je;
  // Numbers are read as doubles, as JavaScript reads them.
  json_t *cases = json_load_file(argv[1], JSON_DECODE_INT_AS_REAL, &je);
  json_t *want = json_load_file(argv[2], 0, &je);
  if (!json_is_array(cases) || !json_is_array(want) || json_array_size(cases) != json_array_size(want)) {
    fprintf(stderr, "chat_compare: cannot read %s and %s\n", argv[1], argv[2]);
    return 1;
  }
  size_t n = json_array_size(cases), same = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *c = json_array_get(cases, i);
    json_t *think = json_object_get(c, "enable_thinking");
    int enable = think ? json_is_true(think) : -1;
    char *got;
    size_t len;
    const char *name = json_string_value(json_object_get(c, "name"));
    if (lks_chat_render(json_object_get(c, "messages"), json_object_get(c, "tools"), enable,
                        json_is_true(json_object_get(c, "add_generation_prompt")), &got, &len) < 0) {
      fprintf(stderr, "MISMATCH conversation %zu (%s): render failed: %s\n", i, name, lks_last_error());
      continue;
    }
    json_t *w = json_array_get(want, i);
    if (json_string_length(w) == len && !memcmp(json_string_value(w), got, len)) {
      same++;
    } else {
      size_t k = 0;
      while (k < len && k < json_string_length(w) && got[k] == json_string_value(w)[k]) k++;
      fprintf(stderr, "MISMATCH conversation %zu (%s) at byte %zu:\n  want: ...%.60s\n  got:  ...%.60s\n",
              i, name, k, json_string_value(w) + (k > 20 ? k - 20 : 0), got + (k > 20 ? k - 20 : 0));
    }
    free(got);
  }
  printf("chat: %zu/%zu conversations byte-identical to @huggingface/jinja\n", same, n);
  json_decref(cases);
  json_decref(want);
  return same == n && n > 0 ? 0 : 1;
}
