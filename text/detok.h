// SPDX-License-Identifier: MIT
// Decoding: ids -> text. Token bytes go through the WHATWG UTF-8 decoder of utf8.c, so bytes of a
// character split across tokens are held until it is whole and bytes that can never form one
// become U+FFFD; an added token is text of its own (what is held before it is settled first).
// The streaming decoder lks_detok_* (declared in tokenizer.h) and the whole-sequence decode share
// that one path, which is why their outputs agree.
#ifndef LKS_TEXT_DETOK_H
#define LKS_TEXT_DETOK_H

#include "text/tokenizer_impl.h"

// lks_tokenizer_decode() (same contract).
int lks__detok_decode(const lks_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                      char **text, size_t *len);

#endif
