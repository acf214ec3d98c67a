// SPDX-License-Identifier: MIT
// The inside of a loaded tokenizer, shared by the modules of text/ that build it
// (tokenizer_json.c, vocab.c, normalize.c) and read it (bpe.c, detok.c, tokenizer.c). Not for
// use outside text/.
//
// The vocabulary is kept as raw bytes: a byte-level token such as "Ġthe" is stored as " the",
// so BPE runs on the input bytes directly and decoding is a copy. Merges are a hash of (left id,
// right id) -> (rank, merged id). Once lks_tokenizer_parse() returns, nothing here changes.
#ifndef LKS_TEXT_TOKENIZER_IMPL_H
#define LKS_TEXT_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/regex.h"
#include "text/tokenizer.h"

// bytes -> id, over strings stored in the tokenizer's arena.
typedef struct {
  int32_t *slot;  // id, or -1
  uint32_t mask;
} lks__vocab_map;

typedef struct {
  int32_t rank, id;
  uint64_t key;  // left << 32 | right; UINT64_MAX when empty
} lks__merge_slot;

typedef struct {
  char *content;  // UTF-8, as written
  size_t len;
  char *norm;  // content after the normalizer ("normalized": true and a normalizer present)
  size_t norm_len;
  int32_t id;
  bool lstrip, rstrip, normalized, special;
} lks__added_token;

// A byte trie for matching added tokens longest-first.
typedef struct {
  int32_t child, sibling, token;  // first child, next sibling, added index or -1
  unsigned char byte;
} lks__trie_node;

typedef struct {
  lks__trie_node *n;
  int count, cap;
  int32_t root[256];  // first-level node per byte, or -1
} lks__trie;

typedef enum {
  LKS__NORM_NFC,
  LKS__NORM_NFD,
  LKS__NORM_NFKC,
  LKS__NORM_NFKD,
  LKS__NORM_REPLACE,
  LKS__NORM_PREPEND
} lks__norm_kind;

typedef struct {
  lks__norm_kind kind;
  pcre2_code *re;  // Replace
  char *text;      // Replace content, Prepend prefix
  size_t text_len;
} lks__norm_step;

typedef enum { LKS__PRE_SPLIT, LKS__PRE_BYTELEVEL } lks__pre_kind;
typedef enum { LKS__SPLIT_ISOLATED, LKS__SPLIT_REMOVED, LKS__SPLIT_INVERT } lks__split_mode;

typedef struct {
  lks__pre_kind kind;
  pcre2_code *re;  // Split, or ByteLevel with use_regex
  lks__split_mode mode;
  bool prefix_space;  // ByteLevel add_prefix_space
} lks__pre_step;

struct lks_tokenizer {
  char *what;
  int n_ids;
  // Per id: where its decoded bytes are in `arena`, and flags (LKS__F_*).
  uint32_t *off, *len;
  uint8_t *flags;
  char *arena;
  size_t arena_n;
  lks__vocab_map vocab;  // byte-level vocabulary entries, by bytes
  lks__merge_slot *merges;
  uint32_t merge_mask;
  int32_t byte_id[256];
  int32_t unk_id;  // -1 when none
  bool ignore_merges;
  // Vocabulary entries that are not byte-level strings: kept for decode and token_id lookups.
  int32_t *odd_ids;
  int n_odd;
  lks__added_token *added;
  int n_added;
  lks__trie raw_trie, norm_trie;  // "normalized": false / true
  lks__norm_step *norm;
  int n_norm;
  lks__pre_step *pre;
  int n_pre;
  int32_t *tmpl;  // post-processor template: ids, -1 standing for the sequence
  int n_tmpl;
  char *chat_template;
};

enum { LKS__F_VOCAB = 1, LKS__F_ADDED = 2, LKS__F_SPECIAL = 4, LKS__F_BYTELEVEL = 8 };

#endif
