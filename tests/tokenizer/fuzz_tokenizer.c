// SPDX-License-Identifier: MIT
// libFuzzer target: the GLM-shaped fixture tokenizer on arbitrary bytes. Encoding must succeed,
// decode(encode(x)) must be x with invalid UTF-8 replaced (the fixture has no normalizer), and
// streaming decode must give the same text. Inputs starting with "{" are also tried as a
// tokenizer.json of their own (refused or accepted, never a crash or leak). Any sanitizer report
// is a bug. LKS_FIXTURE names the fixture directory.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "text/tokenizer.h"

static lks_tokenizer *fixture;

static void check(const lks_tokenizer *t, const uint8_t *data, size_t size, bool exact) {
  int32_t *ids;
  int n;
  if (lks_tokenizer_encode(t, (const char *)data, size, false, &ids, &n) < 0) abort();
  char *text;
  size_t len;
  if (lks_tokenizer_decode(t, ids, n, false, &text, &len) < 0) abort();
  if (exact) {
    size_t cl;
    char *clean = lks_utf8_sanitize((const char *)data, size, &cl);
    if (cl != len || memcmp(clean, text, len) != 0) abort();
    free(clean);
  }
  lks_detok *d = lks_detok_new(t, false);
  size_t k = 0;
  for (int i = 0; i <= n; i++) {
    const char *p;
    size_t l;
    if ((i < n ? lks_detok_push(d, ids[i], &p, &l) : lks_detok_flush(d, &p, &l)) < 0) abort();
    if (k + l > len || memcmp(text + k, p, l) != 0) abort();
    k += l;
  }
  if (k != len) abort();
  lks_detok_free(d);
  free(text);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lks_log_set_level(LKS_LOG_ERROR);
  if (!fixture) {
    const char *dir = getenv("LKS_FIXTURE");
    fixture = lks_tokenizer_load(dir ? dir : "tests/tokenizer/glm-fixture");
    if (!fixture) abort();
  }
  check(fixture, data, size, true);
  if (size > 0 && data[0] == '{') {
    lks_tokenizer *t = lks_tokenizer_parse((const char *)data, size, "fuzz");
    if (t) {
      check(t, (const uint8_t *)"Hello, world! 123 \xe4\xbd\xa0\xe5\xa5\xbd", 22, false);
      lks_tokenizer_free(t);
    }
  }
  return 0;
}
