// SPDX-License-Identifier: MIT
// JSON mode: a byte-level JSON recognizer and the token mask it induces over a vocabulary.
//
// The recognizer is a pushdown automaton over bytes for RFC 8259 JSON: objects, arrays, strings
// (escapes, \uXXXX with surrogates paired, valid UTF-8 only: no overlong forms, no encoded
// surrogates, nothing above U+10FFFF, no control bytes), numbers as the RFC writes them, true,
// false, null. Two bounds keep a model from running forever inside the grammar: at most
// LKS_JSON_MAX_WS whitespace bytes in a row and at most LKS_JSON_MAX_DEPTH open containers.
// Its invariant: every prefix it accepts can still be completed into a document (a prefix with
// no valid completion, such as "\uDC" outside a pair, is rejected at the byte that makes it so),
// so a mask built from it never leads generation into a dead end. The state is a small struct
// copied by value: speculation keeps one per draft.
//
// The mask: lks_json_vocab is a byte trie over every token's bytes, built once per tokenizer;
// lks_json_mask walks it with the automaton, pruning a subtree at the first byte the state
// rejects, and allows token t when all of t's bytes are accepted in sequence and, given a budget
// of tokens, what is left can still be closed within it (see lks_json_close_cost). End-of-sequence
// tokens are allowed only when the document is complete; other special tokens never.
//
// Everything here is pure and thread-safe: a built vocab is read-only.
#ifndef LKS_TEXT_JSON_GRAMMAR_H
#define LKS_TEXT_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

enum { LKS_JSON_MAX_DEPTH = 32, LKS_JSON_MAX_WS = 16 };

typedef struct lks_json_state {
  uint64_t stack;  // bit d: the container at depth d (0: the outermost) is an array, else an object
  uint16_t aux;    // \uXXXX: the digits so far; UTF-8: the next byte's bounds (lo | hi << 8); literal: which
  uint8_t depth;   // open containers
  uint8_t mode;    // what comes next (json_grammar.c)
  uint8_t sub;     // progress inside a literal, \u escape, UTF-8 sequence or number
  uint8_t ws;      // whitespace bytes in a row
  uint8_t flags;   // in a key; the top level must be an object; a low surrogate is due
} lks_json_state;

// The start of a document; object_only: the top-level value must be an object (json_object).
void lks_json_init(lks_json_state *s, bool object_only);
// Feeds one byte: true and *s advanced, or false and *s unchanged.
bool lks_json_feed(lks_json_state *s, unsigned char b);
// Feeds n bytes: true and *s advanced past all of them, or false and *s unchanged.
bool lks_json_feed_bytes(lks_json_state *s, const void *p, size_t n);
// Whether the bytes so far are a whole document (more whitespace may still follow).
bool lks_json_complete(const lks_json_state *s);
// The length in bytes of a completion of the document from here (0 when complete), and its
// first byte (0 when complete). Feeding that byte always gives a state whose cost is one less,
// so a document whose cost is at most the tokens left can always be closed in time by
// single-byte tokens; the mask keeps that true at every step (lks_json_mask).
int lks_json_close_cost(const lks_json_state *s);
unsigned char lks_json_close_byte(const lks_json_state *s);

typedef struct lks_json_vocab lks_json_vocab;

// Builds the trie over tokenizer ids [0, n) that are not special (n: the model's vocabulary,
// which may exceed the tokenizer's ids; ids without bytes are never allowed). eos[0..n_eos): the
// ids that end the sequence, allowed once the document is complete. NULL with lks_last_error()
// when out of memory. The tokenizer must outlive it (lks_json_advance reads its bytes).
lks_json_vocab *lks_json_vocab_new(const lks_tokenizer *t, int n, const int32_t *eos, int n_eos);
void lks_json_vocab_free(lks_json_vocab *v);
// Whether every byte a completion may need is a single-byte token (then the budget rule always
// leaves a way to close the document).
bool lks_json_vocab_closable(const lks_json_vocab *v);
// Words of a mask of the vocabulary: (n + 63) / 64.
int lks_json_mask_words(const lks_json_vocab *v);

// Sets bit t of allowed[] (lks_json_mask_words words) for each token allowed after state *s.
// budget: tokens that may still be generated, this one included (< 0: no limit); a token is
// allowed only when the document can still be closed by the budget's end, i.e. when its close
// cost after the token is at most budget - 1. Returns how many tokens are allowed.
int lks_json_mask(const lks_json_vocab *v, const lks_json_state *s, int budget, uint64_t *allowed);
// A cache of masks by grammar state, for one thread at a time (the scheduler's). Inside a string
// the state repeats token after token, so most masks are a copy: a mask is computed without the
// budget and kept with the largest close cost its tokens leave, and reused while that cost fits
// the budget (near the end of the budget the walk runs with it). The vocab must outlive it.
typedef struct lks_json_cache lks_json_cache;
// NULL with lks_last_error() when out of memory. entries: how many masks it keeps (LRU).
lks_json_cache *lks_json_cache_new(const lks_json_vocab *v, int entries);
void lks_json_cache_free(lks_json_cache *c);
// lks_json_mask, through the cache: the same bits.
int lks_json_cache_mask(lks_json_cache *c, const lks_json_state *s, int budget, uint64_t *allowed);
// Masks served from the cache, and computed.
void lks_json_cache_stats(const lks_json_cache *c, uint64_t *hits, uint64_t *misses);

// Advances *s past token t's bytes (an end-of-sequence id leaves it as it is). Returns false,
// *s unchanged, when the grammar rejects the token.
bool lks_json_advance(const lks_json_vocab *v, lks_json_state *s, int32_t t);

#endif
