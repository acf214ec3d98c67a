// SPDX-License-Identifier: MIT
// JSON mode (see json_grammar.h): the byte-level recognizer, its close cost, and the token trie
// the mask walks.
#include "text/json_grammar.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/tokenizer_impl.h"

// ---- the recognizer ----

enum {
  M_VALUE,      // a value (the document's start, after ':' or after ',' in an array)
  M_ARR_FIRST,  // after '[': a value or ']'
  M_OBJ_FIRST,  // after '{': a key or '}'
  M_KEY,        // after ',' in an object: a key
  M_COLON,      // after a key: ':'
  M_AFTER,      // after a value in a container: ',' or the container's closer
  M_DONE,       // the document is whole: only whitespace
  M_STR,        // inside a string
  M_ESC,        // after '\'
  M_UHEX,       // inside \uXXXX: sub digits read, aux their value
  M_LOW_BS,     // after a high surrogate's escape: '\' of the low one
  M_LOW_U,      // ... its 'u'
  M_UTF8,       // inside a multi-byte character: sub bytes left, aux the next one's bounds
  M_NUM,        // inside a number: sub its phase (N_*)
  M_LIT,        // inside true/false/null: aux which, sub bytes read
};
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { F_KEY = 1, F_OBJONLY = 2, F_LOW = 4 };
// Tokens longer than this are never allowed: the mask's walk keeps a state per byte on the stack.
enum { LKS_JSON_MAX_TOKEN = 1024 };

static const char *const literals[3] = {"true", "false", "null"};

void lks_json_init(lks_json_state *s, bool object_only) {
  memset(s, 0, sizeof *s);
  s->mode = M_VALUE;
  s->flags = object_only ? F_OBJONLY : 0;
}

static bool is_ws(unsigned char b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
static bool is_digit(unsigned char b) { return b >= '0' && b <= '9'; }
static int hex(unsigned char b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}
static bool top_is_array(const lks_json_state *s) {
  return (s->stack >> (s->depth - 1)) & 1;
}
static bool num_whole(uint8_t phase) {
  return phase == N_ZERO || phase == N_INT || phase == N_FRAC || phase == N_EXP;
}

static void end_value(lks_json_state *s) { s->mode = s->depth ? M_AFTER : M_DONE; }

static bool push(lks_json_state *s, bool array) {
  if (s->depth >= LKS_JSON_MAX_DEPTH) return false;
  if (array) s->stack |= 1ull << s->depth;
  else s->stack &= ~(1ull << s->depth);
  s->depth++;
  s->mode = array ? M_ARR_FIRST : M_OBJ_FIRST;
  return true;
}

static bool pop(lks_json_state *s, bool array) {
  if (!s->depth || top_is_array(s) != array) return false;
  s->depth--;
  end_value(s);
  return true;
}

// The first byte of a value.
static bool value_start(lks_json_state *s, unsigned char b) {
  if (s->depth == 0 && (s->flags & F_OBJONLY) && b != '{') return false;
  switch (b) {
    case '{': return push(s, false);
    case '[': return push(s, true);
    case '"': s->mode = M_STR; s->flags &= ~F_KEY; return true;
    case '-': s->mode = M_NUM; s->sub = N_MINUS; return true;
    case '0': s->mode = M_NUM; s->sub = N_ZERO; return true;
    case 't': case 'f': case 'n':
      s->mode = M_LIT;
      s->aux = b == 't' ? 0 : b == 'f' ? 1 : 2;
      s->sub = 1;
      return true;
    default:
      if (b >= '1' && b <= '9') {
        s->mode = M_NUM;
        s->sub = N_INT;
        return true;
      }
      return false;
  }
}

// One byte on a state the caller may spoil on failure.
static bool step(lks_json_state *s, unsigned char b) {
  switch (s->mode) {
    case M_VALUE: case M_ARR_FIRST: case M_OBJ_FIRST: case M_KEY: case M_COLON: case M_AFTER:
    case M_DONE:
      if (is_ws(b)) {
        if (s->ws >= LKS_JSON_MAX_WS) return false;
        s->ws++;
        return true;
      }
      break;
    default:
      break;
  }
  s->ws = 0;
  switch (s->mode) {
    case M_VALUE:
      return value_start(s, b);
    case M_ARR_FIRST:
      return b == ']' ? pop(s, true) : value_start(s, b);
    case M_OBJ_FIRST:
      if (b == '}') return pop(s, false);
      if (b != '"') return false;
      s->mode = M_STR;
      s->flags |= F_KEY;
      return true;
    case M_KEY:
      if (b != '"') return false;
      s->mode = M_STR;
      s->flags |= F_KEY;
      return true;
    case M_COLON:
      if (b != ':') return false;
      s->mode = M_VALUE;
      return true;
    case M_AFTER:
      if (b == ',') {
        s->mode = top_is_array(s) ? M_VALUE : M_KEY;
        return true;
      }
      if (b == ']') return pop(s, true);
      if (b == '}') return pop(s, false);
      return false;
    case M_DONE:
      return false;
    case M_STR:
      if (b == '"') {
        if (s->flags & F_KEY) {
          s->flags &= ~F_KEY;
          s->mode = M_COLON;
        } else {
          end_value(s);
        }
        return true;
      }
      if (b == '\\') {
        s->mode = M_ESC;
        return true;
      }
      if (b < 0x20) return false;
      if (b < 0x80) return true;
      // UTF-8 lead bytes and the range of the byte after them (Unicode 15, table 3-7).
      if (b >= 0xC2 && b <= 0xDF) s->sub = 1, s->aux = 0x80 | 0xBF << 8;
      else if (b == 0xE0) s->sub = 2, s->aux = 0xA0 | 0xBF << 8;
      else if (b == 0xED) s->sub = 2, s->aux = 0x80 | 0x9F << 8;
      else if (b >= 0xE1 && b <= 0xEF) s->sub = 2, s->aux = 0x80 | 0xBF << 8;
      else if (b == 0xF0) s->sub = 3, s->aux = 0x90 | 0xBF << 8;
      else if (b >= 0xF1 && b <= 0xF3) s->sub = 3, s->aux = 0x80 | 0xBF << 8;
      else if (b == 0xF4) s->sub = 3, s->aux = 0x80 | 0x8F << 8;
      else return false;
      s->mode = M_UTF8;
      return true;
    case M_UTF8:
      if (b < (s->aux & 0xFF) || b > (s->aux >> 8)) return false;
      s->aux = 0x80 | 0xBF << 8;
      if (--s->sub == 0) s->mode = M_STR;
      return true;
    case M_ESC:
      if (b == 'u') {
        s->mode = M_UHEX;
        s->sub = 0;
        s->aux = 0;
        return true;
      }
      if (!strchr("\"\\/bfnrt", b) || b == 0) return false;
      s->mode = M_STR;
      return true;
    case M_UHEX: {
      int h = hex(b);
      if (h < 0) return false;
      unsigned v = (unsigned)s->aux << 4 | (unsigned)h;
      int k = s->sub + 1;
      // Reject as soon as every completion is an unpaired surrogate: the low half of a pair
      // must be DC00..DFFF, and DC00..DFFF alone is a lone low surrogate.
      if (s->flags & F_LOW) {
        if ((k == 1 && v != 0xD) || (k == 2 && (v < 0xDC || v > 0xDF))) return false;
      } else if (k == 2 && v >= 0xDC && v <= 0xDF) {
        return false;
      }
      s->aux = (uint16_t)v;
      s->sub = (uint8_t)k;
      if (k < 4) return true;
      if (s->flags & F_LOW) {
        s->flags &= ~F_LOW;
        s->mode = M_STR;
      } else {
        s->mode = v >= 0xD800 && v <= 0xDBFF ? M_LOW_BS : M_STR;
      }
      return true;
    }
    case M_LOW_BS:
      if (b != '\\') return false;
      s->mode = M_LOW_U;
      return true;
    case M_LOW_U:
      if (b != 'u') return false;
      s->mode = M_UHEX;
      s->flags |= F_LOW;
      s->sub = 0;
      s->aux = 0;
      return true;
    case M_NUM:
      switch (s->sub) {
        case N_MINUS:
          if (!is_digit(b)) return false;
          s->sub = b == '0' ? N_ZERO : N_INT;
          return true;
        case N_ZERO: case N_INT: case N_FRAC: case N_EXP:
          if (is_digit(b) && s->sub != N_ZERO) return true;
          if (is_digit(b)) return false;  // no leading zeros
          if (b == '.' && (s->sub == N_ZERO || s->sub == N_INT)) {
            s->sub = N_DOT;
            return true;
          }
          if ((b == 'e' || b == 'E') && s->sub != N_EXP) {
            s->sub = N_E;
            return true;
          }
          // The number ended: this byte belongs to what follows it.
          end_value(s);
          return step(s, b);
        case N_DOT:
          if (!is_digit(b)) return false;
          s->sub = N_FRAC;
          return true;
        case N_E:
          if (b == '+' || b == '-') {
            s->sub = N_ESIGN;
            return true;
          }
          if (!is_digit(b)) return false;
          s->sub = N_EXP;
          return true;
        case N_ESIGN:
          if (!is_digit(b)) return false;
          s->sub = N_EXP;
          return true;
      }
      return false;
    case M_LIT: {
      const char *lit = literals[s->aux];
      if ((unsigned char)lit[s->sub] != b) return false;
      if (lit[++s->sub] == '\0') end_value(s);
      return true;
    }
  }
  return false;
}

bool lks_json_feed(lks_json_state *s, unsigned char b) {
  lks_json_state t = *s;
  if (!step(&t, b)) return false;
  *s = t;
  return true;
}

bool lks_json_feed_bytes(lks_json_state *s, const void *p, size_t n) {
  lks_json_state t = *s;
  const unsigned char *q = p;
  for (size_t i = 0; i < n; i++)
    if (!step(&t, q[i])) return false;
  *s = t;
  return true;
}

bool lks_json_complete(const lks_json_state *s) {
  return s->mode == M_DONE || (s->mode == M_NUM && s->depth == 0 && num_whole(s->sub));
}

// The completion the cost counts: finish the token in progress in the shortest way (a string
// with '"'; an escape with 'n'; \u digits with '0', or "DC00" for a low half, plus a whole low
// half "\uDC00" when the digits so far force a high surrogate; a UTF-8 character with its
// smallest continuation bytes; a number that needs a digit with '0'; a literal with its letters),
// then a key with ":0" (or a whole `"":0` after ','), a value that is due with '0' (or "{}" at the
// start of an object-only document), then one closer per open container.
int lks_json_close_cost(const lks_json_state *s) {
  int key = (s->flags & F_KEY) ? 2 : 0, d = s->depth;
  switch (s->mode) {
    case M_DONE: return 0;
    case M_VALUE: return d == 0 ? ((s->flags & F_OBJONLY) ? 2 : 1) : 1 + d;
    case M_ARR_FIRST: case M_OBJ_FIRST: case M_AFTER: return d;
    case M_KEY: return 4 + d;
    case M_COLON: return 2 + d;
    case M_STR: return 1 + key + d;
    case M_ESC: return 2 + key + d;
    case M_UHEX: {
      int left = 4 - s->sub;
      unsigned v = (unsigned)s->aux << (4 * left);
      bool high = !(s->flags & F_LOW) && v >= 0xD800 && v <= 0xDBFF;
      return left + (high ? 6 : 0) + 1 + key + d;
    }
    case M_LOW_BS: return 6 + 1 + key + d;
    case M_LOW_U: return 5 + 1 + key + d;
    case M_UTF8: return s->sub + 1 + key + d;
    case M_NUM: return (num_whole(s->sub) ? 0 : 1) + d;
    case M_LIT: return (int)strlen(literals[s->aux]) - s->sub + d;
  }
  return 0;
}

unsigned char lks_json_close_byte(const lks_json_state *s) {
  unsigned char closer = s->depth && top_is_array(s) ? ']' : '}';
  switch (s->mode) {
    case M_DONE: return 0;
    case M_VALUE: return s->depth == 0 && (s->flags & F_OBJONLY) ? '{' : '0';
    case M_ARR_FIRST: case M_OBJ_FIRST: case M_AFTER: return closer;
    case M_KEY: case M_STR: return '"';
    case M_COLON: return ':';
    case M_ESC: return 'n';
    case M_UHEX:
      if (s->flags & F_LOW) return s->sub == 0 ? 'D' : s->sub == 1 ? 'C' : '0';
      return '0';
    case M_LOW_BS: return '\\';
    case M_LOW_U: return 'u';
    case M_UTF8: return (unsigned char)(s->aux & 0xFF);
    case M_NUM: return num_whole(s->sub) ? (s->depth ? closer : 0) : '0';
    case M_LIT: return (unsigned char)literals[s->aux][s->sub];
  }
  return 0;
}

// ---- the token trie and the mask ----

// Nodes in preorder of the byte strings, sorted: node i is the string of its ancestors and its
// own byte; its subtree is the nodes i + 1 .. next[i] - 1; the tokens whose bytes are exactly
// that string are ids[first[i] .. first[i] + count[i]).
struct lks_json_vocab {
  const lks_tokenizer *t;
  int n;                // ids in a mask
  int n_nodes, max_len;
  uint8_t *byte;        // [n_nodes]
  uint16_t *depth;      // [n_nodes] the string's length
  int32_t *next;        // [n_nodes]
  int32_t *first;       // [n_nodes]
  uint16_t *count;      // [n_nodes]
  int32_t *ids;         // [n_ids] by bytes
  int n_ids;
  int32_t *eos;
  int n_eos;
  bool closable;
  uint8_t *usable;      // [n] 1: an id with bytes, not special
};

static int by_bytes(const void *a, const void *b, void *ctx) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  const lks_tokenizer *t = ctx;
  uint32_t nx = t->len[x], ny = t->len[y];
  int c = memcmp(t->arena + t->off[x], t->arena + t->off[y], nx < ny ? nx : ny);
  if (c) return c;
  if (nx != ny) return nx < ny ? -1 : 1;
  return x < y ? -1 : x > y;
}

void lks_json_vocab_free(lks_json_vocab *v) {
  if (!v) return;
  free(v->byte);
  free(v->depth);
  free(v->next);
  free(v->first);
  free(v->count);
  free(v->ids);
  free(v->eos);
  free(v->usable);
  free(v);
}

lks_json_vocab *lks_json_vocab_new(const lks_tokenizer *t, int n, const int32_t *eos, int n_eos) {
  lks_json_vocab *v = calloc(1, sizeof *v);
  if (!v) goto oom;
  v->t = t;
  v->n = n;
  int m = n < t->n_ids ? n : t->n_ids;
  v->usable = calloc((size_t)(n > 0 ? n : 1), 1);
  v->ids = malloc((size_t)(m > 0 ? m : 1) * sizeof *v->ids);
  v->eos = malloc((size_t)(n_eos > 0 ? n_eos : 1) * sizeof *v->eos);
  if (!v->usable || !v->ids || !v->eos) goto oom;
  for (int i = 0; i < n_eos; i++)
    if (eos[i] >= 0 && eos[i] < n) v->eos[v->n_eos++] = eos[i];
  size_t total = 0;
  for (int id = 0; id < m; id++) {
    uint8_t f = t->flags[id];
    if (!(f & (LKS__F_VOCAB | LKS__F_ADDED)) || (f & LKS__F_SPECIAL) || t->len[id] == 0) continue;
    if (t->len[id] > LKS_JSON_MAX_TOKEN) continue;  // never allowed (the walk's stack is bounded)
    bool is_eos = false;  // end-of-sequence ids are allowed by completeness, never by their bytes
    for (int i = 0; i < v->n_eos; i++) is_eos |= v->eos[i] == id;
    if (is_eos) continue;
    v->usable[id] = 1;
    v->ids[v->n_ids++] = id;
    total += t->len[id];
  }
  qsort_r(v->ids, (size_t)v->n_ids, sizeof *v->ids, by_bytes, (void *)t);
  size_t cap = total + 1;
  v->byte = malloc(cap);
  v->depth = malloc(cap * sizeof *v->depth);
  v->next = malloc(cap * sizeof *v->next);
  v->first = malloc(cap * sizeof *v->first);
  v->count = calloc(cap, sizeof *v->count);
  if (!v->byte || !v->depth || !v->next || !v->first || !v->count) goto oom;
  // path[k]: the node of the previous string's first k + 1 bytes.
  int32_t *path = NULL;
  size_t path_cap = 0;
  const unsigned char *prev = NULL;
  uint32_t prev_n = 0;
  for (int i = 0; i < v->n_ids; i++) {
    int32_t id = v->ids[i];
    const unsigned char *p = (const unsigned char *)t->arena + t->off[id];
    uint32_t len = t->len[id];
    if (len > path_cap) {
      int32_t *np = realloc(path, len * sizeof *np);
      if (!np) {
        free(path);
        goto oom;
      }
      path = np;
      path_cap = len;
    }
    uint32_t common = 0;
    while (common < len && common < prev_n && p[common] == prev[common]) common++;
    for (uint32_t k = common; k < len; k++) {
      int32_t node = v->n_nodes++;
      v->byte[node] = p[k];
      v->depth[node] = (uint16_t)(k + 1);
      v->first[node] = i;
      path[k] = node;
    }
    int32_t end = path[len - 1];
    if (v->count[end] == 0) v->first[end] = i;
    v->count[end]++;
    if ((int)len > v->max_len) v->max_len = (int)len;
    prev = p;
    prev_n = len;
  }
  free(path);
  // next[i]: the first node after i whose depth is at most depth[i]. open[d - 1] is the node of
  // depth d on the path to the current one; a node of depth d ends the subtrees of those at
  // depths d and deeper.
  int32_t *open = malloc((size_t)(v->max_len + 1) * sizeof *open);
  if (!open) goto oom;
  int top = 0;
  for (int32_t i = 0; i < v->n_nodes; i++) {
    int d = v->depth[i];
    while (top >= d) v->next[open[--top]] = i;
    open[top++] = i;
  }
  while (top > 0) v->next[open[--top]] = v->n_nodes;
  free(open);
  // The budget rule needs single-byte tokens for every byte of a completion.
  static const char need[] = "{}[]\":,0nuDC\\0123456789abcdefABCDEFtrlsen";
  v->closable = true;
  for (const char *c = need; *c; c++) v->closable &= t->byte_id[(unsigned char)*c] >= 0 &&
                                                    t->byte_id[(unsigned char)*c] < n &&
                                                    v->usable[t->byte_id[(unsigned char)*c]];
  for (int b = 0x80; b <= 0xBF; b++)
    v->closable &= t->byte_id[b] >= 0 && t->byte_id[b] < n && v->usable[t->byte_id[b]];
  return v;
oom:
  lks_json_vocab_free(v);
  lks_set_error(LKS_ENOMEM, "json mode: out of memory for the token trie");
  return NULL;
}

bool lks_json_vocab_closable(const lks_json_vocab *v) { return v->closable; }
int lks_json_mask_words(const lks_json_vocab *v) { return (v->n + 63) / 64; }

// The walk; *max_cost (when not NULL): the largest close cost an allowed token leaves.
static int walk(const lks_json_vocab *v, const lks_json_state *s, int budget, uint64_t *allowed,
                int *max_cost) {
  memset(allowed, 0, (size_t)lks_json_mask_words(v) * sizeof *allowed);
  int worst = 0;
  int n_allowed = 0;
  // After this token budget - 1 tokens are left; what remains open must close within them.
  int left = budget < 0 ? 1 << 30 : budget - 1;
  if (lks_json_complete(s))
    for (int i = 0; i < v->n_eos; i++) {
      int32_t e = v->eos[i];
      if (!(allowed[e >> 6] >> (e & 63) & 1)) n_allowed++;
      allowed[e >> 6] |= 1ull << (e & 63);
    }
  lks_json_state st[v->max_len + 1];
  st[0] = *s;
  for (int32_t i = 0; i < v->n_nodes;) {
    int d = v->depth[i];
    lks_json_state *x = &st[d];
    *x = st[d - 1];
    if (!step(x, v->byte[i])) {
      i = v->next[i];  // nothing below can be accepted either
      continue;
    }
    int cost;
    if (v->count[i] && (cost = lks_json_close_cost(x)) <= left) {
      if (cost > worst) worst = cost;
      for (int k = 0; k < v->count[i]; k++) {
        int32_t id = v->ids[v->first[i] + k];
        allowed[id >> 6] |= 1ull << (id & 63);
      }
      n_allowed += v->count[i];
    }
    i++;
  }
  if (max_cost) *max_cost = worst;
  return n_allowed;
}

int lks_json_mask(const lks_json_vocab *v, const lks_json_state *s, int budget, uint64_t *allowed) {
  return walk(v, s, budget, allowed, NULL);
}

// ---- the cache ----

typedef struct {
  lks_json_state key;
  int n, max_cost;
  uint64_t used;  // LRU clock; 0: empty
  uint64_t *bits;
} cache_entry;

struct lks_json_cache {
  const lks_json_vocab *v;
  int n_entries;
  cache_entry *e;
  uint64_t clock, hits, misses;
};

// The state with the fields its mode does not read zeroed, so that equal meanings compare equal.
static lks_json_state canonical(const lks_json_state *s) {
  lks_json_state k;
  memset(&k, 0, sizeof k);  // padding too: keys are compared with memcmp
  k.stack = s->depth ? s->stack & (~0ull >> (64 - s->depth)) : 0;
  k.depth = s->depth;
  k.mode = s->mode;
  k.flags = s->flags;
  switch (s->mode) {
    case M_UHEX: case M_UTF8: case M_NUM: case M_LIT:
      k.sub = s->sub;
      k.aux = s->aux;
      break;
    case M_VALUE: case M_ARR_FIRST: case M_OBJ_FIRST: case M_KEY: case M_COLON: case M_AFTER:
    case M_DONE:
      k.ws = s->ws;
      break;
    default:
      break;
  }
  return k;
}

void lks_json_cache_free(lks_json_cache *c) {
  if (!c) return;
  for (int i = 0; c->e && i < c->n_entries; i++) free(c->e[i].bits);
  free(c->e);
  free(c);
}

lks_json_cache *lks_json_cache_new(const lks_json_vocab *v, int entries) {
  lks_json_cache *c = calloc(1, sizeof *c);
  if (!c) goto oom;
  c->v = v;
  c->n_entries = entries > 0 ? entries : 1;
  c->e = calloc((size_t)c->n_entries, sizeof *c->e);
  if (!c->e) goto oom;
  for (int i = 0; i < c->n_entries; i++) {
    c->e[i].bits = malloc((size_t)lks_json_mask_words(v) * sizeof *c->e[i].bits);
    if (!c->e[i].bits) goto oom;
  }
  return c;
oom:
  lks_json_cache_free(c);
  lks_set_error(LKS_ENOMEM, "json mode: out of memory for the mask cache");
  return NULL;
}

int lks_json_cache_mask(lks_json_cache *c, const lks_json_state *s, int budget, uint64_t *allowed) {
  lks_json_state k = canonical(s);
  size_t words = (size_t)lks_json_mask_words(c->v);
  int left = budget < 0 ? 1 << 30 : budget - 1;
  cache_entry *hit = NULL, *lru = &c->e[0];
  for (int i = 0; i < c->n_entries; i++) {
    cache_entry *e = &c->e[i];
    if (e->used && !memcmp(&e->key, &k, sizeof k)) hit = e;
    if (e->used < lru->used) lru = e;
  }
  if (!hit) {
    c->misses++;
    hit = lru;
    memcpy(&hit->key, &k, sizeof k);
    hit->n = walk(c->v, s, -1, hit->bits, &hit->max_cost);
  } else {
    c->hits++;
  }
  hit->used = ++c->clock;
  if (hit->max_cost > left) return walk(c->v, s, budget, allowed, NULL);  // the budget binds
  memcpy(allowed, hit->bits, words * sizeof *allowed);
  return hit->n;
}

void lks_json_cache_stats(const lks_json_cache *c, uint64_t *hits, uint64_t *misses) {
  *hits = c->hits;
  *misses = c->misses;
}

bool lks_json_advance(const lks_json_vocab *v, lks_json_state *s, int32_t t) {
  for (int i = 0; i < v->n_eos; i++)
    if (v->eos[i] == t) return lks_json_complete(s);
  if (t < 0 || t >= v->n || !v->usable[t]) return false;
  return lks_json_feed_bytes(s, v->t->arena + v->t->off[t], v->t->len[t]);
}
