// SPDX-License-Identifier: MIT
// The tokenizer.json normalizer: NFC, NFD, NFKC, NFKD (utf8proc), Replace (a regex, every match
// including empty ones, as JavaScript's replaceAll), Prepend, applied in order. Reads the
// tokenizer only; any thread.
#ifndef LKS_TEXT_NORMALIZE_H
#define LKS_TEXT_NORMALIZE_H

#include "text/tokenizer_impl.h"

// Runs t's normalizer steps over valid UTF-8 s[0..n): a malloc'd NUL-terminated result in *out
// (*out_n bytes; the caller frees it). Returns 0 or a negative LKS_E* code.
int lks__normalize(const lks_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n);

#endif
