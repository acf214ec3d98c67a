// SPDX-License-Identifier: MIT
// libFuzzer target for JSON mode's recognizer (text/json_grammar.h): on any bytes, its verdict
// must equal jansson's (json_loadb with JSON_DECODE_ANY, within the recognizer's depth and
// whitespace bounds), and the longest prefix it accepts, followed by the completion its close
// cost counts, must be a document jansson accepts, the cost falling by one per byte.
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/json_ref.h"
#include "text/json_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *s = (const char *)data;
  lks_json_state st;
  lks_json_init(&st, false);
  size_t i = 0;
  while (i < size && lks_json_feed(&st, data[i])) i++;
  bool mine = i == size && lks_json_complete(&st);
  if (mine != json_ref_accepts(s, size, false)) abort();
  // The accepted prefix s[0..i) and its completion.
  char *buf = malloc(i + 8192);
  if (!buf) return 0;
  memcpy(buf, s, i);
  size_t m = i;
  int cost = lks_json_close_cost(&st);
  while (cost > 0) {
    unsigned char b = lks_json_close_byte(&st);
    if (!b || !lks_json_feed(&st, b) || lks_json_close_cost(&st) != cost - 1 || m >= i + 8192) abort();
    buf[m++] = (char)b;
    cost--;
  }
  if (!lks_json_complete(&st) || !json_ref_accepts(buf, m, false)) abort();
  free(buf);
  return 0;
}
