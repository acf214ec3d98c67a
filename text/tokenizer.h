// SPDX-License-Identifier: MIT
// Hugging Face `tokenizer.json` for byte-level BPE models (GLM's, and other families'), in C.
//
// Encoding follows the reference implementation the tests compare against (the
// `@huggingface/tokenizers` npm package, which follows the Rust `tokenizers` crate):
//   1. invalid UTF-8 in the input is replaced by U+FFFD, one per maximal invalid subpart, exactly
//      as a WHATWG decoder (Node's TextDecoder, Python's errors="replace") would;
//   2. added tokens (special or not) are matched whole, longest first, left to right: first those
//      with "normalized": false on the raw text, then, in each stretch between them, the
//      normalizer runs and the "normalized": true ones are matched; lstrip/rstrip trim the
//      neighbouring whitespace;
//   3. each remaining stretch goes through the pre-tokenizer (Split regexes, compiled with PCRE2
//      after the reference's Oniguruma-to-Unicode rewrite; Sequence; ByteLevel) and every piece
//      through BPE (lowest merge rank first, leftmost first; "ignore_merges" honoured);
//   4. with add_special, the TemplateProcessing post-processor adds its special tokens.
// Decoding maps ids back to bytes (added tokens by their content) and replaces invalid UTF-8 the
// same WHATWG way; the streaming decoder emits text as soon as it forms complete characters, so
// the concatenation of its pieces equals the whole decode.
//
// Supported tokenizer.json parts: model BPE (vocab; merges as "a b" strings or ["a","b"] pairs;
// unk_token; ignore_merges); normalizers NFC, NFD, NFKC, NFKD (utf8proc), Replace, Prepend,
// Sequence; pre-tokenizers Split (Regex or String; Isolated or Removed; invert), ByteLevel
// (add_prefix_space, use_regex) which must come last, Sequence; decoder ByteLevel (alone or in a
// Sequence); post-processors ByteLevel, TemplateProcessing (single sequences), Sequence. Anything
// else is refused with LKS_EUNSUPPORTED naming it; malformed files with LKS_EFORMAT naming the
// field (model missing, merges that are not two vocabulary tokens, a regex PCRE2 rejects, wrong
// JSON types).
//
// A loaded tokenizer is immutable: every function taking a `const lks_tokenizer *` may be called
// from any number of threads at once. A streaming decoder belongs to one thread.
#ifndef LKS_TOKENIZER_H
#define LKS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lks_tokenizer lks_tokenizer;

// Loads PATH/tokenizer.json (and PATH/tokenizer_config.json when present) when PATH is a
// directory, or the file PATH itself. Returns NULL with lks_last_error() naming the problem.
lks_tokenizer *lks_tokenizer_load(const char *path);
// Builds a tokenizer from tokenizer.json text (`len` bytes); `what` names it in messages.
lks_tokenizer *lks_tokenizer_parse(const char *json_text, size_t len, const char *what);
void lks_tokenizer_free(lks_tokenizer *t);

// One more than the largest id (vocabulary and added tokens).
int lks_tokenizer_n_ids(const lks_tokenizer *t);
// The id of an added token by its content, or of a vocabulary entry as written in tokenizer.json
// ("Ġthe"); -1 when there is none.
int lks_tokenizer_token_id(const lks_tokenizer *t, const char *text);
// The bytes token `id` decodes to (a byte-level token's raw bytes, an added token's content):
// *len bytes owned by the tokenizer, not NUL-terminated; NULL when `id` has none.
const char *lks_tokenizer_id_bytes(const lks_tokenizer *t, int id, size_t *len);
// Whether `id` is an added token marked "special".
bool lks_tokenizer_is_special(const lks_tokenizer *t, int id);
// The chat_template string of tokenizer_config.json, or NULL (owned by the tokenizer).
const char *lks_tokenizer_chat_template(const lks_tokenizer *t);

// Encodes `len` bytes of `text` (any bytes; see above for invalid UTF-8). On success *ids is a
// malloc'd array of *n ids (the caller frees it; NULL when *n is 0). add_special: apply the
// post-processor's template (BOS and the like). Returns 0 or a negative LKS_E* code.
int lks_tokenizer_encode(const lks_tokenizer *t, const char *text, size_t len, bool add_special,
                         int32_t **ids, int *n);
// Decodes ids into valid UTF-8 text (malloc'd, NUL-terminated, *len bytes without the NUL; the
// caller frees it). skip_special drops added tokens marked special. An id outside the vocabulary
// is LKS_ERANGE.
int lks_tokenizer_decode(const lks_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                         char **text, size_t *len);

// The bytes token `id` stands for, as decode would emit them before UTF-8 validation (a
// byte-level token may hold part of a character); NULL when id is not in the vocabulary. Points
// into t (valid while t is).
const char *lks_tokenizer_token_bytes(const lks_tokenizer *t, int id, size_t *len);

// Streaming decode: push ids one at a time; each push hands back the text that is now complete
// (possibly empty). Bytes of a character split across tokens are held until the character is
// whole; bytes that can never form one become U+FFFD exactly where lks_tokenizer_decode() would
// put it. The concatenation of every push and the final flush equals lks_tokenizer_decode() of
// the same ids.
typedef struct lks_detok lks_detok;
// NULL (with lks_last_error()) only when out of memory. The tokenizer must outlive it.
lks_detok *lks_detok_new(const lks_tokenizer *t, bool skip_special);
// *out points into the decoder (valid until its next call), *len bytes, not NUL-terminated.
int lks_detok_push(lks_detok *d, int32_t id, const char **out, size_t *len);
// Ends the stream: held bytes that never completed a character come out as U+FFFD.
int lks_detok_flush(lks_detok *d, const char **out, size_t *len);
// Special tokens whose text is one of texts[0..n) are printed even by a decoder that skips
// special tokens (a chat response keeps GLM's <think> and <tool_call> markup for its parser).
// Texts that are not special tokens of this tokenizer are ignored. 0 or LKS_ENOMEM.
int lks_detok_keep(lks_detok *d, const char *const *texts, int n);
void lks_detok_free(lks_detok *d);

// Replaces each maximal invalid UTF-8 subpart of `in` with U+FFFD (WHATWG "replacement").
// Returns a malloc'd NUL-terminated copy (*out_len bytes) or NULL when out of memory.
// (Defined in text/utf8.c.)
char *lks_utf8_sanitize(const char *in, size_t len, size_t *out_len);

#endif
