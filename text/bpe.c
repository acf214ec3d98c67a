// SPDX-License-Identifier: MIT
// Encoding (see bpe.h). BPE over a piece keeps its symbols in a linked list over the piece's
// bytes and the candidate merges in a binary heap ordered by (rank, position); a popped merge
// whose sides have changed since it was pushed is stale and skipped.
#include "text/bpe.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/buf.h"
#include "text/normalize.h"
#include "text/utf8.h"
#include "text/vocab.h"

typedef struct {
  int32_t id, prev, next;
} bpe_sym;

typedef struct {
  int32_t rank, left, right, left_id, right_id, new_id;
} bpe_pair;

typedef struct {
  const lks_tokenizer *t;
  lks__idbuf out;
  bpe_sym *sym;
  int sym_cap;
  bpe_pair *heap;
  int heap_n, heap_cap;
  pcre2_match_data *md;
  int err;
} enc;

static inline bool pair_less(const bpe_pair *a, const bpe_pair *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(enc *e, bpe_pair p) {
  if (e->heap_n == e->heap_cap) {
    int cap = e->heap_cap ? e->heap_cap * 2 : 64;
    bpe_pair *h = realloc(e->heap, (size_t)cap * sizeof *h);
    if (!h) {
      e->err = LKS_ENOMEM;
      return;
    }
    e->heap = h;
    e->heap_cap = cap;
  }
  int i = e->heap_n++;
  while (i > 0) {
    int parent = (i - 1) / 2;
    if (!pair_less(&p, &e->heap[parent])) break;
    e->heap[i] = e->heap[parent];
    i = parent;
  }
  e->heap[i] = p;
}

static bpe_pair heap_pop(enc *e) {
  bpe_pair top = e->heap[0], last = e->heap[--e->heap_n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= e->heap_n) break;
    if (c + 1 < e->heap_n && pair_less(&e->heap[c + 1], &e->heap[c])) c++;
    if (!pair_less(&e->heap[c], &last)) break;
    e->heap[i] = e->heap[c];
    i = c;
  }
  if (e->heap_n > 0) e->heap[i] = last;
  return top;
}

static void try_pair(enc *e, int left) {
  int right = e->sym[left].next;
  if (right < 0) return;
  int32_t a = e->sym[left].id, b = e->sym[right].id;
  if (a < 0 || b < 0) return;
  const lks__merge_slot *m = lks__vocab_merge_get(e->t, a, b);
  if (m) heap_push(e, (bpe_pair){m->rank, left, right, a, b, m->id});
}

static void emit_unknown(enc *e) {
  if (e->t->unk_id >= 0) lks__buf_push_id(&e->out, e->t->unk_id);
}

// BPE over one piece of bytes.
static void bpe(enc *e, const char *s, size_t n) {
  const lks_tokenizer *t = e->t;
  if (n == 0) return;
  if (n == 1) {
    int32_t id = t->byte_id[(unsigned char)s[0]];
    if (id >= 0) lks__buf_push_id(&e->out, id);
    else emit_unknown(e);
    return;
  }
  if (t->ignore_merges) {
    int32_t id = lks__vocab_get(t, s, n);
    if (id >= 0) {
      lks__buf_push_id(&e->out, id);
      return;
    }
  }
  if ((int)n > e->sym_cap) {
    if (n > INT_MAX / 2) {
      e->err = LKS_ERANGE;
      return;
    }
    bpe_sym *p = realloc(e->sym, n * sizeof *p);
    if (!p) {
      e->err = LKS_ENOMEM;
      return;
    }
    e->sym = p;
    e->sym_cap = (int)n;
  }
  for (size_t i = 0; i < n; i++)
    e->sym[i] = (bpe_sym){t->byte_id[(unsigned char)s[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
  e->heap_n = 0;
  for (size_t i = 0; i + 1 < n; i++) try_pair(e, (int)i);
  while (e->heap_n > 0 && !e->err) {
    bpe_pair p = heap_pop(e);
    bpe_sym *l = &e->sym[p.left], *r = &e->sym[p.right];
    if (l->id != p.left_id || r->id != p.right_id || l->next != p.right) continue;
    l->id = p.new_id;
    l->next = r->next;
    if (r->next >= 0) e->sym[r->next].prev = p.left;
    r->id = -3;  // merged away
    r->next = r->prev = -1;
    if (l->prev >= 0) try_pair(e, l->prev);
    try_pair(e, p.left);
  }
  for (int i = 0; i >= 0; i = e->sym[i].next) {
    if (e->sym[i].id >= 0) lks__buf_push_id(&e->out, e->sym[i].id);
    else emit_unknown(e);
  }
}

static void pretok(enc *e, int step, const char *s, size_t n);

// Next match of re in s[0..n) at or after `from`: its bounds, false when none.
static bool next_match(enc *e, pcre2_code *re, const char *s, size_t n, size_t from, uint32_t opts,
                       size_t *ms, size_t *me) {
  int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, opts | PCRE2_NO_UTF_CHECK, e->md, NULL);
  if (rc < 0) {
    if (rc != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR msg[128];
      pcre2_get_error_message(rc, msg, sizeof msg);
      lks_set_error(LKS_EINVAL, "%s: regex match failed: %s", e->t->what, (char *)msg);
      e->err = LKS_EINVAL;
    }
    return false;
  }
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
  *ms = ov[0];
  *me = ov[1];
  return true;
}

static void split_step(enc *e, int step, const lks__pre_step *p, const char *s, size_t n) {
  size_t prev = 0, from = 0, ms, me;
  if (p->mode == LKS__SPLIT_REMOVED) {
    // JavaScript's String.prototype.split: a match anchored at each position q; empty pieces
    // are dropped afterwards.
    size_t q = 0;
    while (q < n && !e->err) {
      if (!next_match(e, p->re, s, n, q, PCRE2_ANCHORED, &ms, &me) || me == prev) {
        q += (size_t)lks__utf8_len((unsigned char)s[q]);
        continue;
      }
      if (q > prev) pretok(e, step + 1, s + prev, q - prev);
      prev = me;
      q = prev;
    }
    if (n > prev) pretok(e, step + 1, s + prev, n - prev);
    return;
  }
  while (from <= n && !e->err && next_match(e, p->re, s, n, from, 0, &ms, &me)) {
    if (p->mode == LKS__SPLIT_ISOLATED && ms > prev) pretok(e, step + 1, s + prev, ms - prev);
    if (me > ms) pretok(e, step + 1, s + ms, me - ms);
    prev = me;
    from = me > ms ? me : me + (me < n ? (size_t)lks__utf8_len((unsigned char)s[me]) : 1);
  }
  if (p->mode == LKS__SPLIT_ISOLATED && n > prev) pretok(e, step + 1, s + prev, n - prev);
}

static void pretok(enc *e, int step, const char *s, size_t n) {
  if (e->err || n == 0) return;
  if (step == e->t->n_pre) {
    bpe(e, s, n);
    return;
  }
  const lks__pre_step *p = &e->t->pre[step];
  if (p->kind == LKS__PRE_SPLIT) {
    split_step(e, step, p, s, n);
    return;
  }
  // ByteLevel: optional prefix space, optional GPT-2 split (matches only), then the bytes.
  char *own = NULL;
  if (p->prefix_space && s[0] != ' ') {
    own = malloc(n + 1);
    if (!own) {
      e->err = LKS_ENOMEM;
      return;
    }
    own[0] = ' ';
    memcpy(own + 1, s, n);
    s = own;
    n++;
  }
  if (!p->re) {
    pretok(e, step + 1, s, n);
  } else {
    size_t from = 0, ms, me;
    while (from < n && !e->err && next_match(e, p->re, s, n, from, 0, &ms, &me)) {
      if (me > ms) pretok(e, step + 1, s + ms, me - ms);
      from = me > ms ? me : me + (size_t)lks__utf8_len((unsigned char)s[me]);
    }
  }
  free(own);
}

// The added token whose content (raw or normalized) is exactly s[0..n): its id, or -1.
static int32_t added_exact(const lks_tokenizer *t, const char *s, size_t n) {
  for (int pass = 0; pass < 2; pass++) {
    const lks__trie *tr = pass ? &t->norm_trie : &t->raw_trie;
    if (n == 0 || !tr->count) continue;
    size_t ml = 0;
    int32_t k = lks__vocab_trie_match(tr, s, n, &ml);
    if (k >= 0 && ml == n) return t->added[k].id;
  }
  return -1;
}

typedef struct {
  size_t off, len;
  int32_t token;  // added token index when the splitter matched it, else -1
} section;

// Splits s[0..n) on the added tokens of `tr`, then trims around lstrip/rstrip tokens.
static int split_added(const lks_tokenizer *t, const lks__trie *tr, const char *s, size_t n,
                       section **out, int *count) {
  int cap = 8, k = 0;
  section *v = malloc((size_t)cap * sizeof *v);
  if (!v) return lks_set_error(LKS_ENOMEM, "out of memory");
  size_t start = 0, i = 0;
  while (i < n) {
    size_t ml = 0;
    int32_t a = tr->count ? lks__vocab_trie_match(tr, s + i, n - i, &ml) : -1;
    if (a < 0) {
      i++;
      continue;
    }
    if (k + 2 > cap) {
      cap *= 2;
      section *p = realloc(v, (size_t)cap * sizeof *p);
      if (!p) {
        free(v);
        return lks_set_error(LKS_ENOMEM, "out of memory");
      }
      v = p;
    }
    if (i > start) v[k++] = (section){start, i - start, -1};
    v[k++] = (section){i, ml, a};
    i += ml;
    start = i;
  }
  if (start < n) {
    if (k + 1 > cap) {
      section *p = realloc(v, (size_t)(cap + 1) * sizeof *p);
      if (!p) {
        free(v);
        return lks_set_error(LKS_ENOMEM, "out of memory");
      }
      v = p;
    }
    v[k++] = (section){start, n - start, -1};
  }
  for (int j = 0; j < k; j++) {
    if (v[j].token < 0) continue;
    const lks__added_token *a = &t->added[v[j].token];
    if (a->lstrip && j > 0) v[j - 1].len = lks__utf8_trim_end(s + v[j - 1].off, v[j - 1].len);
    if (a->rstrip && j + 1 < k) {
      size_t d = lks__utf8_trim_start(s + v[j + 1].off, v[j + 1].len);
      v[j + 1].off += d;
      v[j + 1].len -= d;
    }
  }
  *out = v;
  *count = k;
  return 0;
}

static int encode_normalized(enc *e, const char *s, size_t n) {
  const lks_tokenizer *t = e->t;
  section *sec;
  int k;
  LKS_TRY(split_added(t, &t->norm_trie, s, n, &sec, &k));
  for (int j = 0; j < k && !e->err; j++) {
    if (sec[j].len == 0) continue;
    int32_t id = added_exact(t, s + sec[j].off, sec[j].len);
    if (id >= 0) lks__buf_push_id(&e->out, id);
    else pretok(e, 0, s + sec[j].off, sec[j].len);
  }
  free(sec);
  return 0;
}

int lks__bpe_encode(const lks_tokenizer *t, const char *text, size_t len, bool add_special,
                    int32_t **ids, int *n) {
  *ids = NULL;
  *n = 0;
  enc e = {.t = t};
  int rc = 0;
  lks__buf clean = {0};
  section *sec = NULL;
  int k = 0;
  const char *s = text;
  if (!lks__utf8_valid(text, len)) {
    lks__utf8_sanitize_into(text, len, &clean);
    if (clean.oom) {
      rc = lks_set_error(LKS_ENOMEM, "out of memory");
      goto done;
    }
    s = clean.p;
    len = clean.n;
  }
  e.md = pcre2_match_data_create(4, NULL);
  if (!e.md) {
    rc = lks_set_error(LKS_ENOMEM, "out of memory");
    goto done;
  }
  if (add_special)
    for (int i = 0; i < t->n_tmpl && t->tmpl[i] >= 0; i++) lks__buf_push_id(&e.out, t->tmpl[i]);
  if ((rc = split_added(t, &t->raw_trie, s, len, &sec, &k)) < 0) goto done;
  for (int j = 0; j < k && !e.err; j++) {
    const char *p = s + sec[j].off;
    size_t pl = sec[j].len;
    if (pl == 0) continue;
    int32_t id = added_exact(t, p, pl);
    if (id >= 0) {
      lks__buf_push_id(&e.out, id);
      continue;
    }
    if (t->n_norm > 0) {
      char *nt;
      size_t nl;
      if ((rc = lks__normalize(t, p, pl, &nt, &nl)) < 0) goto done;
      rc = encode_normalized(&e, nt, nl);
      free(nt);
    } else {
      rc = encode_normalized(&e, p, pl);
    }
    if (rc < 0) goto done;
  }
  if (add_special) {
    int i = 0;
    while (i < t->n_tmpl && t->tmpl[i] >= 0) i++;
    for (i++; i < t->n_tmpl; i++)
      if (t->tmpl[i] >= 0) lks__buf_push_id(&e.out, t->tmpl[i]);
  }
  if (e.err) rc = e.err == LKS_ENOMEM ? lks_set_error(LKS_ENOMEM, "out of memory") : e.err;
  else if (e.out.oom) rc = lks_set_error(LKS_ENOMEM, "out of memory");
done:
  free(sec);
  free(clean.p);
  free(e.sym);
  free(e.heap);
  pcre2_match_data_free(e.md);
  if (rc < 0) {
    free(e.out.p);
    return rc;
  }
  *ids = e.out.p;
  *n = e.out.n;
  return 0;
}
