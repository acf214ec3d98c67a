// SPDX-License-Identifier: MIT
// Sampling (see sample.h). At real vocabulary sizes (~150k) nothing here sorts the vocabulary:
// top-k keeps the k best in a heap during one scan; top-p alone first bounds the weight below
// which no token can be in the nucleus and sorts the few above it (a trained model's peaked
// distribution); for flat logits, where most of the vocabulary is kept, it bins the tokens by
// (max - l) / T, finds the bin where the mass reaches top_p and orders only that bin's tokens. The
// weights exp((l - max) / T) come from one vectorisable pass in float, summed in double. Ordering
// is by logit, ties to the lower id; the draw walks the kept tokens in id order, so a seed gives
// the same tokens as a full sort would. No global state: safe to call from several threads at once
// (each thread keeps its own buffers between calls).
#include "model/sample.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fastmath.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void lks_rng_seed(lks_rng *r, uint64_t seed) {
  // splitmix64 expands the seed into the four words of state.
  for (int i = 0; i < 4; i++) {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    r->s[i] = z ^ (z >> 31);
  }
}

uint64_t lks_rng_next(lks_rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

double lks_rng_uniform(lks_rng *r) { return (double)(lks_rng_next(r) >> 11) * 0x1.0p-53; }

// The largest value (SSE in four independent lanes where the target has it), then the first index
// holding it; NaNs, which the maximum cannot be found among, take the plain scan.
int lks_argmax(const float *x, int n) {
  int i = 0;
  float m = x[0];
#if defined(__SSE2__)
  __m128 a = _mm_set1_ps(x[0]), b = a, c = a, d = a;
  for (; i + 16 <= n; i += 16) {
    a = _mm_max_ps(a, _mm_loadu_ps(x + i));
    b = _mm_max_ps(b, _mm_loadu_ps(x + i + 4));
    c = _mm_max_ps(c, _mm_loadu_ps(x + i + 8));
    d = _mm_max_ps(d, _mm_loadu_ps(x + i + 12));
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d)));
  for (int j = 0; j < 4; j++) m = lanes[j] > m ? lanes[j] : m;
#endif
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  for (i = 0; i < n; i++)
    if (x[i] == m) return i;
  int best = 0;
  for (i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

// The sum of w[0, n) in double in a fixed order (eight interleaved partial sums, then a fixed
// tree), so that it does not depend on the compiler; inlined into the vectorised passes below.
static inline __attribute__((always_inline)) double sum8(const float *w, int n) {
  double s[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += w[i + j];
  for (; i < n; i++) s[0] += w[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// w[i] = exp((l[i] - mx) * inv_t) for i < n; returns their sum (sum8).
LKS_VECTORIZE_NO_CONTRACT LKS_WIDE_CLONES static double
weights(const float *l, int n, float mx, float inv_t, float *w) {
  for (int i = 0; i < n; i++) w[i] = lks_exp_f32((l[i] - mx) * inv_t);
  return sum8(w, n);
}

// sum of exp(l[i] - mx) over i < n, in the order weights() sums (eight partial sums in double,
// then a fixed tree), through a small buffer so that the exponentials vectorise as there.
LKS_VECTORIZE_NO_CONTRACT LKS_WIDE_CLONES static double
sum_exp(const float *l, int n, float mx) {
  enum { CHUNK = 1024 };
  float w[CHUNK];
  double s[8] = {0};
  for (int at = 0; at < n; at += CHUNK) {
    int m = n - at < CHUNK ? n - at : CHUNK;
    for (int i = 0; i < m; i++) w[i] = lks_exp_f32(l[at + i] - mx);
    int i = 0;
    for (; i + 8 <= m; i += 8)
      for (int j = 0; j < 8; j++) s[j] += w[i + j];
    for (; i < m; i++) s[0] += w[i];
  }
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

double lks_logsumexp(const float *logits, int V) {
  float mx = logits[lks_argmax(logits, V)];
  return (double)mx + log(sum_exp(logits, V, mx));
}

typedef struct {
  float l;
  int i;
} cand;

// a ranks below b: smaller logit, or the same logit and a larger id.
static inline bool below(cand a, cand b) { return a.l < b.l || (a.l == b.l && a.i > b.i); }

static int by_rank(const void *pa, const void *pb) {
  cand a = *(const cand *)pa, b = *(const cand *)pb;
  return below(a, b) ? 1 : below(b, a) ? -1 : 0;
}

static int by_id(const void *pa, const void *pb) {
  return ((const cand *)pa)->i - ((const cand *)pb)->i;
}

static void sift_down(cand *h, int n, int at) {
  for (;;) {
    int c = 2 * at + 1;
    if (c >= n) return;
    if (c + 1 < n && below(h[c + 1], h[c])) c++;
    if (!below(h[c], h[at])) return;
    cand t = h[c];
    h[c] = h[at];
    h[at] = t;
    at = c;
  }
}

// The k best of V logits into out[0..k), best first: a min-heap of the best so far, one scan.
// Ids grow during the scan, so a later equal logit never displaces an earlier one.
static void top_k(const float *l, int V, int k, cand *out) {
  for (int i = 0; i < k; i++) out[i] = (cand){l[i], i};
  for (int i = k / 2 - 1; i >= 0; i--) sift_down(out, k, i);
  for (int i = k; i < V; i++)
    if (l[i] > out[0].l) {
      out[0] = (cand){l[i], i};
      sift_down(out, k, 0);
    }
  qsort(out, (size_t)k, sizeof *out, by_rank);
}

// The kept tokens and their final probabilities, the distribution both entry points use: dense
// (every token, probability (float)(w[id] * (1 / sum)); a dropped token's weight is 0) or a list
// of kept ids, ascending. Its arrays are the calling thread's scratch (below).
typedef struct {
  int n;       // kept tokens
  cand *c;     // [n] for a list: .i the id, .l its probability; NULL when dense
  float *w;    // dense: [V] weights
  double sum;  // dense: their sum
} kept_set;

enum { BINS = 2048, BINS_PER_UNIT = 64 };  // bins of (max - l) / T: 1/64 wide, the last open

// A thread's buffers for one call, kept for its next call: no allocation and no fresh pages per
// token (at V = 151,552 they are 2.7 MB, which malloc would map and the kernel zero each time).
// Freed when the thread exits.
typedef struct scratch {
  int V;           // tokens they hold
  float *w;        // [2 V]: the weights (top-k: the k logits, then their weights)
  uint16_t *bins;  // [V]
  cand *c;         // [V + 1]
  double *mass;    // [4 BINS]
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_ok;

static void scratch_free(void *p) {
  scratch *b = p;
  if (!b) return;
  free(b->w);
  free(b->bins);
  free(b->c);
  free(b->mass);
  free(b);
}

static void scratch_key_init(void) {
  scratch_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}

// The calling thread's scratch for V tokens, or NULL when out of memory.
static scratch *scratch_get(int V) {
  pthread_once(&scratch_once, scratch_key_init);
  if (!scratch_ok) return NULL;
  scratch *b = pthread_getspecific(scratch_key);
  if (b && b->V >= V) return b;
  scratch_free(b);
  (void)pthread_setspecific(scratch_key, NULL);
  b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->V = V;
  b->w = malloc((size_t)V * 2 * sizeof *b->w);
  b->bins = malloc((size_t)V * sizeof *b->bins);
  b->c = malloc(((size_t)V + 1) * sizeof *b->c);
  b->mass = malloc(4 * BINS * sizeof *b->mass);
  if (!b->w || !b->bins || !b->c || !b->mass ||
      pthread_setspecific(scratch_key, b) != 0) {
    scratch_free(b);
    return NULL;
  }
  return b;
}

// bins[i] = the bin of token i, in one vectorisable pass (with the wide clones: until
// 2026-12-06 x86-64 had only its SSE2 version, 4 lanes).
LKS_VECTORIZE LKS_WIDE_CLONES static void bin_all(const float *l, int V, float mx, float inv_t,
                                                  uint16_t *bins) {
  for (int i = 0; i < V; i++) {
    float d = (mx - l[i]) * inv_t * BINS_PER_UNIT;
    bins[i] = (uint16_t)(d < (float)(BINS - 1) ? (int)d : BINS - 1);
  }
}

// The best-first tokens c[0, n) taken while the mass *acc (each adds w[id] / sum) is below
// top_p: returns how many.
static int take_prefix(const cand *c, int n, const float *w, double sum, double top_p,
                       double *acc) {
  int take = 0;
  while (take < n) {
    *acc += w[c[take].i] / sum;
    take++;
    if (*acc >= top_p) break;
  }
  return take;
}

enum { SUB_BINS = 1024, SORT_AT_MOST = 256, REFINE_LEVELS = 3 };

// The sub-bin of c among SUB_BINS of the key range [lo, lo + SUB_BINS / scale).
static inline int sub_bin(cand c, float mx, float inv_t, double lo, double scale) {
  double d = (double)((mx - c.l) * inv_t * BINS_PER_UNIT);
  int b = (int)((d - lo) * scale);
  return b < 0 ? 0 : b >= SUB_BINS ? SUB_BINS - 1 : b;
}

// The cut bin's tokens edge[0, *ne), whose keys d = (max - l) / T * BINS_PER_UNIT (computed as
// bin_all does, so the same values) lie in [cut, cut + 1): while they are many, the bin is cut
// into SUB_BINS finer ones by the same monotone key, every token of the sub-bins before the one
// where the mass reaches top_p is taken (moved to the front; *acc grows by their mass), and the
// search goes on in that sub-bin alone. Returns how many were taken; edge[taken, taken + *ne)
// is what is left, for the caller to sort. A sub-bin keeps the tokens of one key range, so what
// is taken is what a full sort would take first, ties included (equal logits share a sub-bin).
static int refine_edge(cand *edge, int *ne, float mx, float inv_t, const float *w, double sum,
                       double top_p, int cut, double *acc) {
  double lo = cut, width = 1;
  int taken = 0, n = *ne;
  double mass[SUB_BINS];
  int count[SUB_BINS];
  for (int level = 0; level < REFINE_LEVELS && n > SORT_AT_MOST; level++) {
    cand *e = edge + taken;
    double scale = SUB_BINS / width;
    memset(mass, 0, sizeof mass);
    memset(count, 0, sizeof count);
    for (int j = 0; j < n; j++) {
      int b = sub_bin(e[j], mx, inv_t, lo, scale);
      mass[b] += w[e[j].i];
      count[b]++;
    }
    int c2 = 0, before = 0;
    for (; c2 < SUB_BINS - 1; c2++) {
      if (*acc + mass[c2] / sum >= top_p) break;
      *acc += mass[c2] / sum;
      before += count[c2];
    }
    if (count[c2] == n) {  // no progress: one key range (ties); narrower, or sorted by the caller
      lo += c2 / scale;
      width /= SUB_BINS;
      continue;
    }
    // Partition e: the sub-bins before c2 first, then c2's tokens; the rest is dropped.
    int f = 0;
    for (int pass = 0; pass < 2; pass++)
      for (int j = f; j < n; j++) {
        int b = sub_bin(e[j], mx, inv_t, lo, scale);
        if (pass == 0 ? b < c2 : b == c2) {
          cand t = e[f];
          e[f++] = e[j];
          e[j] = t;
        }
      }
    taken += before;
    n = count[c2];
    lo += c2 / scale;
    width /= SUB_BINS;
  }
  *ne = n;
  return taken;
}

// w[i] = 0 for the tokens outside the nucleus: those of bins after the cut, and of the cut bin
// those not taken (bins[i] == BINS marks a taken one). Returns the kept weights' sum (sum8).
LKS_VECTORIZE_NO_CONTRACT LKS_WIDE_CLONES static double
keep_bins(float *w, const uint16_t *bins, int V, int cut) {
  for (int i = 0; i < V; i++) w[i] *= (float)((bins[i] < cut) | (bins[i] == BINS));
  return sum8(w, V);
}

// Top-p over the whole vocabulary without sorting it, for flat logits (most of the vocabulary
// kept): the mass of each bin of (max - l) / T finds the bin where the cumulative mass reaches
// top_p; only that bin's tokens are ordered (refine_edge, then a sort). The result is dense: w
// keeps the nucleus's weights and zeros elsewhere; returns their sum.
static double nucleus_by_bins(const float *l, int V, float mx, float inv_t, float *w, double sum,
                              double top_p, scratch *b) {
  // Four histograms of the mass, so that tokens of one bin in a row (all of them, for flat
  // logits) do not wait on each other's sums; added into the first in a fixed order.
  double *m0 = b->mass, *m1 = m0 + BINS, *m2 = m1 + BINS, *m3 = m2 + BINS;
  uint16_t *bins = b->bins;
  memset(m0, 0, 4 * BINS * sizeof *m0);
  bin_all(l, V, mx, inv_t, bins);
  int i4 = 0;
  for (; i4 + 4 <= V; i4 += 4) {
    m0[bins[i4]] += w[i4];
    m1[bins[i4 + 1]] += w[i4 + 1];
    m2[bins[i4 + 2]] += w[i4 + 2];
    m3[bins[i4 + 3]] += w[i4 + 3];
  }
  for (; i4 < V; i4++) m0[bins[i4]] += w[i4];
  for (int k = 0; k < BINS; k++) m0[k] = (m0[k] + m1[k]) + (m2[k] + m3[k]);
  double acc = 0;
  int cut = 0;
  for (; cut < BINS - 1; cut++) {
    if (acc + m0[cut] / sum >= top_p) break;
    acc += m0[cut] / sum;
  }
  // The cut bin's tokens (branch-free: c has V + 1 entries); the best-first prefix of them that
  // reaches top_p.
  cand *edge = b->c;
  int ne = 0;
  for (int i = 0; i < V; i++) {
    edge[ne] = (cand){l[i], i};
    ne += bins[i] == cut;
  }
  int take = cut < BINS - 1 ? refine_edge(edge, &ne, mx, inv_t, w, sum, top_p, cut, &acc) : 0;
  qsort(edge + take, (size_t)ne, sizeof *edge, by_rank);
  take += take_prefix(edge + take, ne, w, sum, top_p, &acc);
  if (take == 0 && cut == 0) take = 1;  // at least one token (the best is in bin 0)
  for (int j = 0; j < take; j++) bins[edge[j].i] = BINS;
  return keep_bins(w, bins, V, cut);
}

enum { FEW = 4096, THRESHOLD_ROUNDS = 6 };  // nucleus candidates few enough to sort directly

// How many of w[0, n) are at least th (their mass, summed in double, into *mass): two
// vectorisable passes (gcc vectorises neither when the count and the sum share one loop, nor the
// sum written with a conditional; the weights are finite, so w * 0 is 0).
LKS_VECTORIZE LKS_WIDE_CLONES static int count_at_least(const float *w, int n, float th,
                                                        double *mass) {
  double s[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += (double)(w[i + j] * (float)(w[i + j] >= th));
  for (; i < n; i++) s[0] += (double)(w[i] * (float)(w[i] >= th));
  *mass = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  int c = 0;
  for (i = 0; i < n; i++) c += w[i] >= th;
  return c;
}

// Whether any of w[0, n) is at least th.
LKS_VECTORIZE LKS_WIDE_CLONES static bool any_at_least(const float *w, int n, float th) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= w[i] >= th;
  return any;
}

// Top-p when few tokens can be in the nucleus (a peaked distribution, as a trained model's). The
// nucleus is the shortest best-first prefix holding top_p of the mass, so its last token and all
// after it hold more than (1 - top_p) of it. A token lighter than
//   theta = ((1 - top_p) sum - E) / n,
// where E is the mass of the tokens already ruled out and n how many remain, is therefore never in
// it: its successors and the last token would weigh no more than it each, under n theta from the
// remaining tokens and E from the others, less than (1 - top_p) sum together. Each round raises
// theta with one vectorisable pass (the count and mass at or above it); once at most FEW remain
// they are collected and sorted. Returns the nucleus's length, as nucleus_by_bins does, or -1
// when a round does not halve the candidates (flat logits: the bins are faster then). The
// margins cover the rounding of E (sum and the kept mass are summed in different orders: under
// 1e-12 sum) and of theta to float.
static int nucleus_by_threshold(const float *l, int V, const float *w, double sum, double top_p,
                                scratch *b) {
  double budget = (1 - (top_p > 0 ? top_p : 0)) * sum, kept_mass = sum;
  int n = V;
  float th = 0;
  for (int round = 0; n > FEW; round++) {
    double room = budget - (sum - kept_mass) - 1e-9 * sum;
    if (round == THRESHOLD_ROUNDS || room <= 0) return -1;
    float next = (float)(room / n * (1 - 1e-6));
    if (!(next > th)) return -1;
    int m = count_at_least(w, V, next, &kept_mass);
    if (m == 0 || m > n / 2) return -1;
    th = next;
    n = m;
  }
  // The candidates, in blocks of 64 that any of them is in (for a peaked distribution, few).
  cand *c = b->c;
  int k = 0;
  for (int at = 0; at < V; at += 64) {
    int end = at + 64 < V ? at + 64 : V;
    if (any_at_least(w + at, end - at, th))
      for (int i = at; i < end; i++)
        if (w[i] >= th) c[k++] = (cand){l[i], i};
  }
  qsort(c, (size_t)k, sizeof *c, by_rank);
  double acc = 0;
  int take = take_prefix(c, k, w, sum, top_p, &acc);
  for (int j = 0; j < take; j++) c[j].l = w[c[j].i];
  qsort(c, (size_t)take, sizeof *c, by_id);
  return take;
}

static int keep(const float *l, int V, const lks_sampling *p, kept_set *out) {
  *out = (kept_set){0};
  scratch *b = scratch_get(V);
  if (!b) return lks_set_error(LKS_ENOMEM, "sampling: out of memory");
  float inv_t = 1.0f / p->temperature;
  bool limit_k = p->top_k > 0 && p->top_k < V, limit_p = p->top_p < 1.0f;
  int m;
  if (!limit_k) {
    out->w = b->w;
    float mx = l[lks_argmax(l, V)];
    out->sum = weights(l, V, mx, inv_t, out->w);
    if (!limit_p) {  // every token: no ordering needed at all
      out->n = V;
      return 0;
    }
    m = nucleus_by_threshold(l, V, out->w, out->sum, p->top_p, b);
    if (m < 0) {  // flat: most of the vocabulary is kept, as a dense set
      out->sum = nucleus_by_bins(l, V, mx, inv_t, out->w, out->sum, p->top_p, b);
      out->n = V;
      return 0;
    }
    out->c = b->c;
    out->w = NULL;
  } else {
    // The top k, best first, and their weights; then the nucleus of those.
    int k = p->top_k;
    out->c = b->c;
    float *lk = b->w, *w = b->w + k;
    top_k(l, V, k, out->c);
    for (int j = 0; j < k; j++) lk[j] = out->c[j].l;
    double sum = weights(lk, k, lk[0], inv_t, w);
    m = k;
    if (limit_p) {
      double acc = 0;
      m = 0;
      while (m < k) {
        acc += w[m] / sum;
        m++;
        if (acc >= p->top_p) break;
      }
    }
    for (int j = 0; j < m; j++) out->c[j].l = w[j];
    qsort(out->c, (size_t)m, sizeof *out->c, by_id);
  }
  // The kept list (in id order) renormalised over itself: the sum in eight interleaved parts,
  // then a fixed tree (as weights() sums).
  double p8[8] = {0};
  int j8 = 0;
  for (; j8 + 8 <= m; j8 += 8)
    for (int q = 0; q < 8; q++) p8[q] += out->c[j8 + q].l;
  for (; j8 < m; j8++) p8[0] += out->c[j8].l;
  double inv = 1.0 / (((p8[0] + p8[4]) + (p8[1] + p8[5])) + ((p8[2] + p8[6]) + (p8[3] + p8[7])));
  for (int j = 0; j < m; j++) out->c[j].l = (float)(out->c[j].l * inv);
  out->n = m;
  return 0;
}

// A dense set's probabilities: p_i = (float)(w[i] * inv), inv = 1 / sum (lks_sampling_probs and
// the draw use the same).
LKS_VECTORIZE LKS_WIDE_CLONES static void dense_probs(const float *w, int n, double inv,
                                                      float *p) {
  for (int i = 0; i < n; i++) p[i] = (float)(w[i] * inv);
}

// Their sum over w[0, n), in double (eight interleaved partial sums, then a fixed tree).
LKS_VECTORIZE_NO_CONTRACT LKS_WIDE_CLONES static double dense_mass(const float *w, int n,
                                                                   double inv) {
  double s[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += (float)(w[i + j] * inv);
  for (; i < n; i++) s[0] += (float)(w[i] * inv);
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

enum { DRAW_BLOCK = 64 };

// The draw over a dense set: the first token, in id order, where the running sum of the
// probabilities passes u (the last kept token if rounding left u above the total). A block of
// DRAW_BLOCK tokens whose total leaves the sum at or below u is passed whole, its total summed in
// a vectorisable order: only where the sum in id order would pass u within about 1e-16 of a
// block's end could the two part, a chance under 1e-11 a draw.
static int draw_dense(const float *w, int V, double inv, double u) {
  double acc = 0;
  int last = 0;
  for (int at = 0; at < V; at += DRAW_BLOCK) {
    int n = V - at < DRAW_BLOCK ? V - at : DRAW_BLOCK;
    double m = dense_mass(w + at, n, inv);
    if (!(m > 0)) continue;
    if (acc + m <= u) {
      acc += m;
      for (int j = n - 1; j >= 0; j--)
        if ((float)(w[at + j] * inv) > 0) {
          last = at + j;
          break;
        }
      continue;
    }
    for (int j = 0; j < n; j++) {
      float pj = (float)(w[at + j] * inv);
      if (pj <= 0) continue;
      last = at + j;
      acc += pj;
      if (u < acc) return last;
    }
  }
  return last;
}

int lks_sampling_probs(const float *logits, int V, const lks_sampling *p, float *probs) {
  if (p->temperature <= 0) {
    memset(probs, 0, (size_t)V * sizeof *probs);
    probs[lks_argmax(logits, V)] = 1.0f;
    return 0;
  }
  kept_set k;
  LKS_TRY(keep(logits, V, p, &k));
  if (k.c) {
    memset(probs, 0, (size_t)V * sizeof *probs);
    for (int j = 0; j < k.n; j++) probs[k.c[j].i] = k.c[j].l;
  } else {
    dense_probs(k.w, V, 1.0 / k.sum, probs);
  }
  return 0;
}

int lks_sample(const float *logits, int V, const lks_sampling *p, lks_rng *rng) {
  if (p->temperature <= 0) return lks_argmax(logits, V);
  kept_set k;
  LKS_TRY(keep(logits, V, p, &k));
  double u = lks_rng_uniform(rng);
  if (!k.c) return draw_dense(k.w, V, 1.0 / k.sum, u);
  // The walk in id order over the kept list's probabilities (those lks_sampling_probs returns).
  double acc = 0;
  int last = 0;
  for (int j = 0; j < k.n; j++) {
    float pj = k.c[j].l;
    if (pj <= 0) continue;
    last = k.c[j].i;
    acc += pj;
    if (u < acc) return last;
  }
  return last;  // rounding left u above the total: the last kept token
}
