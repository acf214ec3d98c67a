// SPDX-License-Identifier: MIT
// Encoding: text -> ids, the way the reference does it (see tokenizer.h): invalid UTF-8 replaced,
// added tokens split off (raw ones, then normalized ones after the normalizer), each remaining
// stretch through the pre-tokenizer steps (Split regexes, ByteLevel) and every piece through
// byte-level BPE: lowest merge rank first, leftmost first, "ignore_merges" honoured. Reads the
// tokenizer only; any number of threads at once.
#ifndef LKS_TEXT_BPE_H
#define LKS_TEXT_BPE_H

#include "text/tokenizer_impl.h"

// lks_tokenizer_encode() (same contract).
int lks__bpe_encode(const lks_tokenizer *t, const char *text, size_t len, bool add_special,
                    int32_t **ids, int *n);

#endif
