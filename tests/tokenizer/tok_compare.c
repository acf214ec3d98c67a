// SPDX-License-Identifier: MIT
// lockstep's tokenizer against the reference's output (ref_tokenize.mjs) on the same corpus:
// identical ids with and without special tokens, identical decoded text, decode(encode(x)) == x
// where the reference says it must hold, and the streaming decoder: pushing the ids one at a
// time yields the whole decode, and so does every prefix of every multi-byte item.
// Usage: tok_compare TOKENIZER REF_DIR [--bench MB]   (exit 0 when everything matches)
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "text/tokenizer.h"

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) b[n] = 0;
  *len = (size_t)n;
  return b;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Streams ids[0..n) through a fresh decoder; a malloc'd concatenation.
static char *stream(const lks_tokenizer *t, const int32_t *ids, int n, size_t *len) {
  lks_detok *d = lks_detok_new(t, false);
  size_t cap = 64, k = 0;
  char *all = malloc(cap);
  for (int i = 0; i <= n; i++) {
    const char *p;
    size_t l;
    int rc = i < n ? lks_detok_push(d, ids[i], &p, &l) : lks_detok_flush(d, &p, &l);
    if (rc < 0) {
      fprintf(stderr, "stream: %s\n", lks_last_error());
      exit(1);
    }
    while (k + l + 1 > cap) all = realloc(all, cap *= 2);
    memcpy(all + k, p, l);
    k += l;
  }
  all[k] = 0;
  lks_detok_free(d);
  *len = k;
  return all;
}

static void show_ids(const char *what, json_t *want, const int32_t *got, int n) {
  fprintf(stderr, "  %s want:", what);
  for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
    fprintf(stderr, " %lld", json_integer_value(json_array_get(want, i)));
  fprintf(stderr, "\n  %s got: ", what);
  for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", got[i]);
  fprintf(stderr, "\n");
}

static bool same_ids(json_t *want, const int32_t *got, int n) {
  if (json_array_size(want) != (size_t)n) return false;
  for (int i = 0; i < n; i++)
    if (json_integer_value(json_array_get(want, (size_t)i)) != got[i]) return false;
  return true;
}

// Mismatch counts over the corpus.
typedef struct {
  int items, bad_ids, bad_special, bad_text, bad_round, bad_stream, round_checked, prefixes;
} counts;

// Streaming decode of every prefix of an item with multi-byte characters (bounded for time).
static void check_prefixes(lks_tokenizer *t, const char *x, uint32_t n, const int32_t *ids, int k,
                           counts *c) {
  bool multibyte = false;
  for (uint32_t i = 0; i < n; i++) multibyte |= (unsigned char)x[i] >= 0x80;
  if (!multibyte || k > 160) return;
  for (int p = 0; p <= k; p++) {
    char *whole, *st;
    size_t wl, sl;
    lks_tokenizer_decode(t, ids, p, false, &whole, &wl);
    st = stream(t, ids, p, &sl);
    if (sl != wl || memcmp(st, whole, wl) != 0) {
      if (c->bad_stream++ < 5)
        fprintf(stderr, "MISMATCH streaming decode of the prefix %d of item %d\n", p, c->items - 1);
    }
    c->prefixes++;
    free(st);
    free(whole);
  }
}

// One corpus item x[0, n) against its expected line e: 0, or -1 when the tokenizer failed.
static int check_item(lks_tokenizer *t, const char *x, uint32_t n, json_t *e, counts *c) {
  int32_t *ids, *ids_sp;
  int k, k_sp;
  if (lks_tokenizer_encode(t, x, n, false, &ids, &k) < 0 ||
      lks_tokenizer_encode(t, x, n, true, &ids_sp, &k_sp) < 0) {
    fprintf(stderr, "tok_compare: item %d: encode failed: %s\n", c->items - 1, lks_last_error());
    return -1;
  }
  if (!same_ids(json_object_get(e, "ids"), ids, k)) {
    if (c->bad_ids++ < 5) {
      fprintf(stderr, "MISMATCH ids, item %d (%u bytes): %.*s\n", c->items - 1, n, n > 80 ? 80 : (int)n, x);
      show_ids("ids", json_object_get(e, "ids"), ids, k);
    }
  }
  if (!same_ids(json_object_get(e, "ids_special"), ids_sp, k_sp)) {
    if (c->bad_special++ < 5) {
      fprintf(stderr, "MISMATCH ids with special tokens, item %d\n", c->items - 1);
      show_ids("ids_special", json_object_get(e, "ids_special"), ids_sp, k_sp);
    }
  }
  char *text;
  size_t tl;
  if (lks_tokenizer_decode(t, ids, k, false, &text, &tl) < 0) {
    fprintf(stderr, "tok_compare: item %d: decode failed: %s\n", c->items - 1, lks_last_error());
    return -1;
  }
  json_t *want = json_object_get(e, "text");
  if (json_string_length(want) != tl || memcmp(json_string_value(want), text, tl) != 0) {
    if (c->bad_text++ < 5)
      fprintf(stderr, "MISMATCH decode, item %d:\n  want: %s\n  got:  %s\n", c->items - 1,
              json_string_value(want), text);
  }
  if (json_is_true(json_object_get(e, "roundtrip"))) {
    c->round_checked++;
    if (tl != n || memcmp(text, x, n) != 0) {
      if (c->bad_round++ < 5) fprintf(stderr, "MISMATCH decode(encode(x)) != x, item %d\n", c->items - 1);
    }
  }
  size_t sl;
  char *st = stream(t, ids, k, &sl);
  if (sl != tl || memcmp(st, text, tl) != 0) {
    if (c->bad_stream++ < 5) fprintf(stderr, "MISMATCH streaming decode, item %d\n", c->items - 1);
  }
  free(st);
  check_prefixes(t, x, n, ids, k, c);
  free(text);
  free(ids);
  free(ids_sp);
  return 0;
}

// Encode throughput on one core: the corpus items repeated up to mb megabytes.
static void bench(lks_tokenizer *t, const char *bin, size_t bin_len, double mb) {
  size_t want = (size_t)(mb * 1e6), len = 0;
  char *big = malloc(want + (1 << 20));
  while (len < want) {
    size_t o = 0;
    while (o + 4 <= bin_len && len < want) {
      uint32_t n;
      memcpy(&n, bin + o, 4);
      memcpy(big + len, bin + o + 4, n);
      len += n;
      o += 4 + n;
    }
  }
  int32_t *ids;
  int k;
  double b0 = now();
  lks_tokenizer_encode(t, big, len, false, &ids, &k);
  double dt = now() - b0;
  printf("bench: encoded %.1f MB into %d ids in %.2f s: %.1f MB/s on one core\n", len / 1e6, k,
         dt, len / 1e6 / dt);
  free(ids);
  free(big);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: tok_compare TOKENIZER REF_DIR [--bench MB]\n");
    return 2;
  }
  double t0 = now();
  lks_tokenizer *t = lks_tokenizer_load(argv[1]);
  if (!t) {
    fprintf(stderr, "tok_compare: %s\n", lks_last_error());
    return 1;
  }
  double t_load = now() - t0;
  char path[4096];
  size_t bin_len, exp_len;
  snprintf(path, sizeof path, "%s/corpus.bin", argv[2]);
  char *bin = slurp(path, &bin_len);
  snprintf(path, sizeof path, "%s/expected.jsonl", argv[2]);
  char *exp = slurp(path, &exp_len);
  if (!bin || !exp) {
    fprintf(stderr, "tok_compare: cannot read the reference output in %s\n", argv[2]);
    return 1;
  }
  counts c = {0};
  size_t off = 0, total_bytes = 0;
  char *line = exp;
  while (off + 4 <= bin_len) {
    uint32_t n;
    memcpy(&n, bin + off, 4);
    const char *x = bin + off + 4;
    off += 4 + n;
    char *nl = strchr(line, '\n');
    if (!nl) break;
    *nl = 0;
    json_error_t je;
    json_t *e = json_loads(line, JSON_ALLOW_NUL, &je);
    line = nl + 1;
    if (!e) {
      fprintf(stderr, "tok_compare: bad expected line %d: %s\n", c.items, je.text);
      return 1;
    }
    c.items++;
    total_bytes += n;
    int rc = check_item(t, x, n, e, &c);
    json_decref(e);
    if (rc < 0) return 1;
  }
  printf("%s: %d corpus items (%zu bytes): ids %d/%d identical, with special tokens %d/%d, "
         "decode %d/%d, decode(encode(x)) == x %d/%d, streaming %d/%d (+ %d prefixes); load %.2f s\n",
         argv[1], c.items, total_bytes, c.items - c.bad_ids, c.items, c.items - c.bad_special,
         c.items, c.items - c.bad_text, c.items, c.round_checked - c.bad_round, c.round_checked,
         c.items - c.bad_stream, c.items, c.prefixes, t_load);
  int rc = c.bad_ids || c.bad_special || c.bad_text || c.bad_round || c.bad_stream || c.items == 0;
  if (argc >= 5 && !strcmp(argv[3], "--bench")) bench(t, bin, bin_len, atof(argv[4]));
  free(bin);
  free(exp);
  lks_tokenizer_free(t);
  return rc;
}
