// SPDX-License-Identifier: MIT
// The adaptive draft-count policy (see spec.h): K per sequence from measured step costs and each
// sequence's running acceptance.
//
// The model of one decoding step of w sequences of which sequence i drafts k_i tokens, with
// K = max k_i (the chained drafter runs K times over every drafting sequence) and R = sum k_i
// (extra verify rows):
//   T = plain(w) + K * draft(w) + R * row(w, K)          (plain(w) alone when K = 0)
// and sequence i's expected tokens from the step E_i(k_i) = 1 + sum_{j<=k_i} prod_{l<=j} a_il,
// a_il its acceptance at draft position l given the earlier ones were accepted. The policy picks
// the k maximising sum_i E_i(k_i) / T: for every K (exactly the deepest draft count), a
// Dinkelbach iteration over the rate lambda (each sequence's best k_i <= K for
// E_i(k) - lambda * row * k, separable once K is fixed; one sequence forced to K when none
// reaches it), then the best K. A plain row in a batch that verifies others adds nothing to R:
// it costs what it costs in a plain step (the shared plain(w)).
//
// The costs are taken per batch width from the last samples the scheduler measures on rank 0
// (see ring_put), at width 1 before any request (lks_sched_calibrate); a draft's and a verify
// row's as ratios to the plain step's cost when they were measured, so that all of them follow
// the plain step's (see lks_policy_record); at a width not measured yet, plain steps
// (after one warm-up step, not counted) and one-draft steps are measured first; a
// deeper K's row cost, until measured, is the one below it (it is tried when that says it
// pays), and the neighbours of the chosen K are
// probed now and then so that the averages follow the machine: after 32 steps, then after twice
// as many each time a probe leaves the choice as it was (up to 512), after 32 again when it
// changes it; after 512 while the costs say no K could pay even if every draft were accepted,
// and from plain decoding the less often the less any K could gain (probe_interval); while
// sequences draft, one step in POLICY_PLAIN_EVERY decodes plainly. Nothing here changes
// tokens: the verify rule makes the output independent of K.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "spec/spec.h"

// Samples of a plain step's cost before it is trusted (after the first plain step, a warm-up);
// one-draft steps at first (three drafts also say roughly what the drafter is worth: with one,
// a drafter right 9 times in 10 was left unused one time in 10); steps between probes of the
// neighbouring K, doubled after each probe that left the choice as it was, up to the most; the
// least observations a starting acceptance counts as, the fixed guess ACC_PRIOR's in the pool and
// the pool's in a new sequence (with one, a new server's first two drafts missing, as drafts
// right after a prompt often do, took the deep model's drafter from 0.6 to 0.2 and it decoded
// plainly until a probe 29 steps later, where three drafts a round paid x1.5); the
// most observations the pool's acceptance counts as in a new sequence's (1 / ACC_W, the memory
// of a sequence's own average: with 4, three early misses on the deep model took a new sequence
// from the pool's 0.82 to 0.66, and it decoded plainly for 5-17 % of its rows); the rounds the
// pool must have seen before the choice stops being optimistic (see lks_policy_pick: without
// it, a new server whose costs were measured before any request left a drafter right 85 % of
// the time unused for its first 33 rows); the weight of a new observation in the averages; the
// acceptance a sequence starts from before the pooled one is known; the speculative steps
// between two plain ones (the plain cost's samples while sequences draft); the steps between
// probes while no K could pay even if every draft were accepted (probe_interval).
enum { POLICY_SAMPLES = 3, POLICY_DRAFT_SAMPLES = 3, POLICY_PROBE_EVERY = 32,
       POLICY_PROBE_MOST = 512, POLICY_PROBE_NONE_PAYS = 4096, POLICY_PRIOR_LEAST = 4,
       POLICY_PRIOR_MOST = 10,
       POLICY_FIRST_DRAFTS = 8,
       POLICY_PLAIN_EVERY = 32 };
static const double ACC_W = 0.1, ACC_PRIOR = 0.6;
// How many standard errors of the pool's estimate a deeper position's acceptance is taken higher
// for the choice (lks_policy_pick).
static const double DEEP_Z = 1.0;
// The pooled acceptance, every sequence's observations: the starting point of a new sequence,
// so a long memory (about the last 50 rounds) rather than the last few.
static const double POOL_W = 0.02;
// How far a plainly decoding sequence's acceptance moves back to the pool's each step.
static const double RELAX_W = 0.05;
// Speculation must beat plain decoding by this fraction to be chosen: costs are measured on a
// machine that may be shared, and a choice within the noise of plain decoding is no gain.
static const double POLICY_MARGIN = 0.03;
// How far the pooled first-draft acceptance may have fallen since the last drafting choice for
// a turn to plain decoding still to count as the costs' doing (a recheck).
static const double RECHECK_ACC = 0.05;

// Each cost is taken from its last COST_RING samples: a step that was descheduled (a shared
// machine) moves it less than it would move an average. The plain step's is their median; a draft's
// and a verify row's the lower third (the least of two, the third least of nine): a probe gives two
// samples, and a stall of the machine (a descheduled rank, a link's late frame) only ever adds
// time, so of few samples the lower ones are the step's own cost. The median of two (their mean)
// let one stalled verify step make a row cost a plain step or more: over the 20 us link, whose
// steps stall in pairs by 0.6-2x a plain step one time in eight, the policy decoded plainly in
// 76-97 % of its rows where three drafts paid x1.3-1.5 (0.65-0.81 of K = 3's rate in short bench
// runs; 0.90 with K = 3 in 98 % of them after the change). Simulated (check_spec's
// policy_reaches_the_roofline), the least fraction of the best fixed K went from 0.777 to 0.922
// over that link, 0.892 to 0.956 on a noisy hour, 0.944 to 0.959 on a quiet one. The plain cost
// stays the median: a low plain cost makes every draft look dear. A draft's and a verify row's
// samples older than COST_AGE steps (lks_policy_record calls) are left out when a new one comes:
// they are ratios to a plain cost of their time, and a machine's speed moves between then and now.
// Without it, verify rows measured while a slow stretch began (the plain cost still the fast one)
// outvoted the two fresh samples of every later probe, and the policy decoded plainly where three
// drafts paid (policy_reaches_the_roofline, noisy host).
// The COST_KEEP newest samples count whatever their age: after a long stretch of plain decoding
// a probe's two samples were all that was left, one stalled step then made a verify row cost a
// plain step or more, the costs said no K could pay even with every draft accepted, and the
// probes came 512 steps and more apart (the deep model at local world 2: plain decoding in every
// row of a bench's warm runs, where three drafts paid x1.25).
enum { COST_RING = 9, COST_AGE = 32, COST_KEEP = 3 };
typedef struct {
  double v[COST_RING];
  long at[COST_RING];  // the step of each sample
  int n;
} ring;
typedef struct {
  ring plain, draft, row[LKS_MAX_DRAFTS + 1];
} width_rings;

// A second look after the policy turned from drafting to plain decoding while the pooled
// acceptance had not fallen (so the costs turned it): K, RECHECK_AFTER plain steps later, for
// two steps, when the plain cost is the machine's of now. A shared machine's slow stretch that
// begins while sequences draft makes the verify steps dearer against a plain cost measured
// before it; the regular probes, whose interval doubles each time they leave the choice as it
// was, then came back tens to hundreds of steps later.
enum { RECHECK_AFTER = 8 };
typedef struct {
  int in;      // plain steps until the recheck (0: none due)
  int k;       // the K it probes
  double acc;  // the pooled first-draft acceptance at the last drafting choice
} recheck;

// Adds sample x taken at step `now`; of the samples since now - age and the COST_KEEP newest
// (x among them), the median, or the lower third when `low`.
static double ring_put(ring *r, double x, long now, long age, bool low) {
  r->at[r->n % COST_RING] = now;
  r->v[r->n++ % COST_RING] = x;
  int n = r->n < COST_RING ? r->n : COST_RING, m = 0;
  double t[COST_RING];
  for (int j = 0; j < n; j++) {  // the j-th newest
    int i = (r->n - 1 - j) % COST_RING;
    if (j < COST_KEEP || now - r->at[i] <= age) t[m++] = r->v[i];
  }
  for (int i = 1; i < m; i++)  // insertion sort of at most 9
    for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
      double y = t[j];
      t[j] = t[j - 1];
      t[j - 1] = y;
    }
  if (low) return t[(m - 1) / 3];
  return m % 2 ? t[m / 2] : 0.5 * (t[m / 2 - 1] + t[m / 2]);
}

struct lks_policy {
  int k_max, n_widths;
  lks_policy_costs *c;  // [n_widths]; wider batches share the last
  lks_policy_costs *q;  // [n_widths] draft and row[] as ratios to plain (the medians of r)
  width_rings *r;       // [n_widths] the samples behind c and q
  int *n_plain, *n_draft, (*n_row)[LKS_MAX_DRAFTS + 1];  // samples per cost, [n_widths]
  int *since_probe, *last_k, *probe_k, *probe_left;      // [n_widths]
  int *since_plain;  // [n_widths] speculative steps since the last plain one
  int *probe_every, *probe_from;                          // [n_widths]; probe_from: K before it
  double *ceiling;  // [n_widths] the best K's rate over plain's were every draft accepted
  recheck *rc;       // [n_widths]
  long tick;         // lks_policy_record calls: the steps that the cost samples' ages count
  int probe_turn;
  double acc[LKS_MAX_DRAFTS];  // pooled acceptance per position, every sequence's observations
  int n_obs[LKS_MAX_DRAFTS];
  int depth;                   // positions of acc observed (deeper: the last observed one's)
  bool acc_seen;
};

// ---- the choice, a pure function of costs and acceptances ----

double lks_policy_expected(const float *acc, int k) {
  double e = 1, run = 1;
  for (int j = 0; j < k; j++) {
    run *= acc[j];
    e += run;
  }
  return e;
}

double lks_policy_step_cost(const lks_policy_costs *c, int K, int R) {
  return K == 0 ? c->plain : c->plain + K * c->draft + R * c->row[K];
}

// The best k_i for every sequence with exactly K as the deepest, at rate lambda; false when no
// sequence may draft K.
static bool best_at(const lks_policy_costs *c, int n, const float (*acc)[LKS_MAX_DRAFTS],
                    const int *kcap, int K, double lambda, int *k) {
  int force = -1;
  double force_loss = INFINITY;
  bool reached = false;
  for (int i = 0; i < n; i++) {
    int top = kcap[i] < K ? kcap[i] : K, best = 0;
    double bv = -INFINITY;
    for (int j = 0; j <= top; j++) {
      double v = lks_policy_expected(acc[i], j) - lambda * c->row[K] * j;
      if (v > bv + 1e-12) bv = v, best = j;
    }
    k[i] = best;
    if (best == K) reached = true;
    if (top == K) {
      double loss = bv - (lks_policy_expected(acc[i], K) - lambda * c->row[K] * K);
      if (loss < force_loss) force_loss = loss, force = i;
    }
  }
  if (reached) return true;
  if (force < 0) return false;
  k[force] = K;
  return true;
}

static double value(const lks_policy_costs *c, int n, const float (*acc)[LKS_MAX_DRAFTS],
                    const int *k) {
  int K = 0, R = 0;
  double e = 0;
  for (int i = 0; i < n; i++) {
    K = k[i] > K ? k[i] : K;
    R += k[i];
    e += lks_policy_expected(acc[i], k[i]);
  }
  return e / lks_policy_step_cost(c, K, R);
}

double lks_policy_choose(const lks_policy_costs *c, int n, const float (*acc)[LKS_MAX_DRAFTS],
                         const int *kcap, int k_max, int *k, int *scratch) {
  for (int i = 0; i < n; i++) k[i] = 0;
  double best = value(c, n, acc, k);
  for (int K = 1; K <= k_max; K++) {
    double lambda = best;  // from the best so far: Dinkelbach stops at once when K cannot beat it
    for (int it = 0; it < 64 && best_at(c, n, acc, kcap, K, lambda, scratch); it++) {
      double v = value(c, n, acc, scratch);
      if (v > best * (1 + 1e-12)) {
        best = v;
        memcpy(k, scratch, (size_t)n * sizeof *k);
      }
      if (v <= lambda * (1 + 1e-12)) break;  // nothing at this K beats lambda
      lambda = v;
    }
  }
  return best;
}

// ---- the measured state ----

lks_policy *lks_policy_new(int max_width, int k_max) {
  if (max_width < 1) max_width = 1;
  lks_policy *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->k_max = k_max < 0 ? 0 : k_max > LKS_MAX_DRAFTS ? LKS_MAX_DRAFTS : k_max;
  p->n_widths = max_width;
  size_t n = (size_t)max_width;
  p->c = calloc(n, sizeof *p->c);
  p->q = calloc(n, sizeof *p->q);
  p->r = calloc(n, sizeof *p->r);
  p->n_plain = calloc(n, sizeof *p->n_plain);
  p->n_draft = calloc(n, sizeof *p->n_draft);
  p->n_row = calloc(n, sizeof *p->n_row);
  p->since_probe = calloc(n, sizeof *p->since_probe);
  p->since_plain = calloc(n, sizeof *p->since_plain);
  p->last_k = calloc(n, sizeof *p->last_k);
  p->probe_k = calloc(n, sizeof *p->probe_k);
  p->probe_left = calloc(n, sizeof *p->probe_left);
  p->probe_every = calloc(n, sizeof *p->probe_every);
  p->probe_from = calloc(n, sizeof *p->probe_from);
  p->ceiling = calloc(n, sizeof *p->ceiling);
  p->rc = calloc(n, sizeof *p->rc);
  if (!p->c || !p->q || !p->r || !p->n_plain || !p->n_draft || !p->n_row || !p->since_probe ||
      !p->since_plain || !p->last_k || !p->probe_k || !p->probe_left || !p->probe_every ||
      !p->probe_from || !p->ceiling || !p->rc) {
    lks_policy_free(p);
    lks_set_error(LKS_ENOMEM, "policy: out of memory");
    return NULL;
  }
  for (int j = 0; j < LKS_MAX_DRAFTS; j++) p->acc[j] = ACC_PRIOR;
  for (int i = 0; i < max_width; i++) p->probe_every[i] = POLICY_PROBE_EVERY, p->probe_from[i] = -1;
  return p;
}

void lks_policy_free(lks_policy *p) {
  if (!p) return;
  free(p->c);
  free(p->q);
  free(p->r);
  free(p->n_plain);
  free(p->n_draft);
  free(p->n_row);
  free(p->since_probe);
  free(p->since_plain);
  free(p->last_k);
  free(p->probe_k);
  free(p->probe_left);
  free(p->probe_every);
  free(p->probe_from);
  free(p->ceiling);
  free(p->rc);
  free(p);
}

static int width_index(const lks_policy *p, int w) {
  return w < 1 ? 0 : w > p->n_widths ? p->n_widths - 1 : w - 1;
}

void lks_policy_seq_init(const lks_policy *p, lks_policy_seq *s) {
  memset(s, 0, sizeof *s);
  for (int j = 0; j < LKS_MAX_DRAFTS; j++) {
    s->acc[j] = (float)(p ? p->acc[j] : ACC_PRIOR);
    int seen = p ? p->n_obs[j < p->depth ? j : p->depth > 0 ? p->depth - 1 : 0] : 0;
    s->n_prior[j] = seen < POLICY_PRIOR_LEAST   ? POLICY_PRIOR_LEAST
                    : seen > POLICY_PRIOR_MOST ? POLICY_PRIOR_MOST
                                               : seen;
  }
}

void lks_policy_observe(lks_policy *p, lks_policy_seq *s, int k, int accepted) {
  // Position j's acceptance is observed when the drafts before it were all accepted. A position
  // never observed takes the acceptance of the deepest one observed (not the prior): a drafter
  // that is right 9 times in 10 at the first draft is tried deeper, one that is always wrong is
  // not. The average is a running mean while a new observation would weigh more than ACC_W (its
  // starting value counting as n_prior observations: POLICY_PRIOR_LEAST for the pool's fixed
  // guess, up to POLICY_PRIOR_MOST for a pool that has seen that many), so that a few drafts
  // already say what the drafter is worth, and exponentially weighted after (the pool's own with
  // POOL_W, its fixed guess also counting as POLICY_PRIOR_LEAST). Measured on the deep model,
  // second and later requests of one server: with the pool
  // weighted as a sequence (0.2) and counting as one observation, a new sequence started from the
  // last few rounds of the one before (0.60-0.63 where the run's mean was 0.9), found that no K
  // paid, and decoded plainly for 92-99 % of its rows (x1.04-1.17 against the first request's
  // x1.23-1.36).
  int seen = k < accepted + 1 ? k : accepted + 1;
  for (int j = 0; j < seen; j++) {
    double x = j < accepted ? 1.0 : 0.0;
    double w = 1.0 / (++s->n_obs[j] + s->n_prior[j]);
    w = w > ACC_W ? w : ACC_W;
    s->acc[j] = (float)((1 - w) * s->acc[j] + w * x);
    if (p) {
      w = 1.0 / (++p->n_obs[j] + POLICY_PRIOR_LEAST);
      w = w > POOL_W ? w : POOL_W;
      p->acc[j] = (1 - w) * p->acc[j] + w * x;
    }
  }
  if (seen > s->depth) s->depth = seen;
  for (int j = s->depth; j < LKS_MAX_DRAFTS && s->depth > 0; j++)
    s->acc[j] = s->acc[s->depth - 1];
  if (p) {
    if (seen > p->depth) p->depth = seen;
    for (int j = p->depth; j < LKS_MAX_DRAFTS && p->depth > 0; j++)
      p->acc[j] = p->acc[p->depth - 1];
  }
  s->rounds++;
  if (p) p->acc_seen = true;
}


// A draft's and a verify row's cost are kept as ratios to the plain step's cost when they were
// measured, and turned into seconds with the plain cost of now: the plain cost follows every
// plain step, the others only the steps that draft, and a plain step costs more as the context
// grows (attention) and on a shared machine's slow stretches. Kept in seconds, the ones measured
// early made drafting look cheap later: on the default model (which no K pays) plain steps went
// from 0.39 ms at the start-up measurement to 0.62 ms after 500 positions, rows measured at the
// start stayed 0.15 ms, and the policy drafted two tokens in 16 % of its rows (x0.81-0.89 of
// plain decoding).
void lks_policy_record(lks_policy *p, int w, int K, int R, double t_propose, double t_step) {
  if (t_step <= 0) return;
  int wi = width_index(p, w);
  lks_policy_costs *c = &p->c[wi], *q = &p->q[wi];
  long now = ++p->tick;
  if (K == 0) {
    // The first plain step of a width warms caches and buffers up (measured: 1.5x the ones
    // after it on the default model), and a plain cost set too high makes every draft look free.
    if (p->n_plain[wi]++ == 0) return;
    c->plain = ring_put(&p->r[wi].plain, t_step, now, LONG_MAX, false);  // never aged
  } else {
    if (K > p->k_max || R <= 0 || p->n_plain[wi] < 2) return;
    double plain = c->plain, verify = t_step - t_propose - plain;
    q->draft = ring_put(&p->r[wi].draft, t_propose / K / plain, now, COST_AGE, true);
    p->n_draft[wi]++;
    q->row[K] =
        ring_put(&p->r[wi].row[K], verify > 0 ? verify / R / plain : 0, now, COST_AGE, true);
    p->n_row[wi][K]++;
  }
  c->draft = q->draft * c->plain;
  for (int k = 1; k <= LKS_MAX_DRAFTS; k++) c->row[k] = q->row[k] * c->plain;
}

bool lks_policy_measured(const lks_policy *p, int w, int k_max) {
  int wi = width_index(p, w);
  bool all = p->n_plain[wi] >= POLICY_SAMPLES + 1;  // + the warm-up step
  for (int K = 1; K <= k_max && K <= p->k_max; K++) all &= p->n_row[wi][K] >= POLICY_DRAFT_SAMPLES;
  return all;
}

const lks_policy_costs *lks_policy_costs_at(const lks_policy *p, int w) {
  return &p->c[width_index(p, w)];
}

// Steps between probes at width wi. While no K could pay even if every draft were accepted (only
// the costs can change that), POLICY_PROBE_NONE_PAYS: such a probe's first step catches the
// drafter up over every plain step since the last one, the work a drafter that never drafts
// would never do. On the default model (a verify of two rows costs 1.8 plain steps) a probe
// every 512 steps caught up 270-513 rows a time at 4.5 us a row, 2.3 ms, with the first catch-ups
// (buffers growing) 5-9 ms, on 0.45 ms plain steps: the policy decoded at x0.963-0.974 of plain
// decoding. A sequence that decodes plainly to its end never pays its drafter (but every
// LKS_MTP_BACKLOG steps, the backlog's cap). From plain decoding, longer the less any K could
// gain at best: such a probe pays a drafter catch-up and drafts that the acceptance seen so far
// says will mostly fail, so the interval grows by 0.25 / (ceiling - 1), 1 to 16 times (a K that
// could at best gain 7 % is probed every 115 steps, not 32).
static int probe_interval(const lks_policy *p, int wi) {
  double gain = p->ceiling[wi] - 1;
  if (gain < POLICY_MARGIN) {
    int e = 8 * p->probe_every[wi];
    return e < POLICY_PROBE_MOST        ? POLICY_PROBE_MOST
           : e < POLICY_PROBE_NONE_PAYS ? e
                                        : POLICY_PROBE_NONE_PAYS;
  }
  double every = p->probe_every[wi];
  if (p->last_k[wi] == 0) every *= 0.25 / gain < 1 ? 1 : 0.25 / gain > 16 ? 16 : 0.25 / gain;
  return every < POLICY_PROBE_MOST ? (int)every : POLICY_PROBE_MOST;
}

int lks_policy_pick(lks_policy *p, lks_policy_seq *const *s, const int *kcap, int n, int *k,
                    int *scratch) {
  int wi = width_index(p, n), cap = 0;
  for (int i = 0; i < n; i++) cap = kcap[i] > cap ? kcap[i] : cap;
  if (cap > p->k_max) cap = p->k_max;
  // Explore: the plain step first, then one draft. Deeper K are not tried blindly: until
  // measured, a K's row cost is taken from the deepest measured K below it, and it runs only
  // when that extrapolation says it pays (then it is measured).
  int explore = -1;
  if (p->n_plain[wi] < POLICY_SAMPLES + 1) explore = 0;  // + the warm-up step
  else if (cap >= 1 && p->n_row[wi][1] < POLICY_DRAFT_SAMPLES) explore = 1;
  // Probe: now and then the K next to the last choice (above, below) or plain decoding, for two
  // steps (the first of a probe from plain decoding catches the drafter up, which is not a
  // step's cost: the scheduler does not record it).
  recheck *rc = &p->rc[wi];
  if (explore < 0 && p->probe_left[wi] == 0 && rc->in > 0 && --rc->in == 0) {
    // Not a regular probe: the probes' interval is left as it was.
    explore = rc->k <= cap ? rc->k : cap;
    p->probe_k[wi] = explore;
    p->probe_left[wi] = 1;
  } else if (explore < 0 && p->probe_left[wi] > 0) {
    p->probe_left[wi]--;
    explore = p->probe_k[wi] <= cap ? p->probe_k[wi] : cap;
  } else if (explore < 0 &&
             ++p->since_probe[wi] >= probe_interval(p, wi)) {
    p->since_probe[wi] = 0;
    p->probe_from[wi] = p->last_k[wi];
    // Above, below, then plain decoding (the baseline every choice is measured against).
    int last = p->last_k[wi], up = last + 1 <= cap ? last + 1 : -1, down = last - 1;
    p->probe_turn = (p->probe_turn + 1) % 3;
    explore = p->probe_turn == 0 && up >= 0 ? up : p->probe_turn == 1 && down >= 0 ? down : 0;
    if (explore == last) explore = up >= 0 ? up : down;
    p->probe_k[wi] = explore;
    p->probe_left[wi] = explore >= 0 ? 1 : 0;
  }
  // While sequences draft, one plain step every POLICY_PLAIN_EVERY keeps the plain cost, the
  // baseline of every choice, as fresh as the others: a verify row's cost is what a verify
  // step takes beyond it, so a plain cost measured while a shared machine ran slow, and not
  // measured again while sequences drafted, made every verify row look free (the default model
  // at world 2: K = 2 in every row, at x0.73 of plain decoding).
  if (explore < 0 && p->last_k[wi] > 0 && ++p->since_plain[wi] >= POLICY_PLAIN_EVERY) explore = 0;
  if (explore == 0) p->since_plain[wi] = 0;
  if (explore >= 0) {
    int K = 0;
    for (int i = 0; i < n; i++) {
      k[i] = kcap[i] < explore ? kcap[i] : explore;
      K = k[i] > K ? k[i] : K;
    }
    return K;
  }
  float(*acc)[LKS_MAX_DRAFTS] = malloc((size_t)n * sizeof *acc);
  if (!acc) {  // out of memory: decode plainly this step (the output is the same)
    for (int i = 0; i < n; i++) k[i] = 0;
    return 0;
  }
  for (int i = 0; i < n; i++) memcpy(acc[i], s[i]->acc, sizeof acc[i]);
  // Optimism while little is known: until the pool has seen POLICY_FIRST_DRAFTS rounds at a
  // draft position, the choice takes its acceptance 0.5 / (rounds + 1) higher. With the costs
  // measured before any request (lks_sched_calibrate) nothing above explores, and the prior 0.6
  // alone may say no K pays: a new server then drafts at once, a drafter that is right keeps it
  // drafting, and one that is wrong stops it after a round or two. Per position, because a
  // deeper one is observed only when the drafts before it were accepted: on the deep model one
  // early miss at position 2 left it (and 3, which follows it) at 0.27, and the server drafted
  // one token a round for 150 steps where three paid x1.5.
  //
  // A deeper position (the second draft and on) is also taken DEEP_Z standard errors of the
  // pool's estimate higher, sqrt(a (1 - a) / (rounds + POLICY_PRIOR_LEAST)): it is observed only
  // in rounds whose drafts before it were all accepted, so while the policy drafts one token
  // nothing corrects it. On the deep model at local world 2 (three drafts x1.25 at a fixed K, one
  // x1.04-1.09) a cold start whose first rounds missed left positions 2 and 3 below break-even,
  // the probes of one draft never saw them again, and three drafts ran in 5 of 300 steps where
  // they pay (policy_probes_the_deeper_positions). Not at the first position, observed in every
  // drafting round: there it kept a drafter that is always wrong drafting past its first rounds
  // (policy_first_drafts_after_calibration).
  for (int j = 0; j < LKS_MAX_DRAFTS; j++) {
    double first = p->n_obs[j] < POLICY_FIRST_DRAFTS ? 0.5 / (p->n_obs[j] + 1) : 0;
    for (int i = 0; i < n; i++) {
      double a = acc[i][j], up = first;
      if (j > 0) up += DEEP_Z * sqrt(a * (1 - a) / (p->n_obs[j] + POLICY_PRIOR_LEAST));
      acc[i][j] = (float)(a + up < 1 ? a + up : 1);
    }
  }
  // A deeper K's row cost until it is measured. For the choice, optimistic: the deepest
  // measured K's extra verify time spread over K rows (an MoE verify's union of experts grows
  // more slowly than its rows: on the deep model 2 rows cost 1.6 plain steps, 4 rows 1.9), so
  // that K is tried and measured when the acceptance says it could pay. For the ceiling below,
  // pessimistic: each row as dear as the deepest measured one's.
  lks_policy_costs c = p->c[wi], co = p->c[wi];
  for (int K = 2; K <= cap; K++)
    if (!p->n_row[wi][K]) {
      c.row[K] = c.row[K - 1];
      co.row[K] = co.row[K - 1] * (K - 1) / K;
    }
  double best =
      lks_policy_choose(&co, n, (const float(*)[LKS_MAX_DRAFTS])acc, kcap, cap, k, scratch);
  free(acc);
  double plain = n / c.plain;
  if (best < (1 + POLICY_MARGIN) * plain)
    for (int i = 0; i < n; i++) k[i] = 0;
  // A sequence that decodes plainly sees no drafts, so what turned it off (a few misses, with
  // ACC_W's short memory) would never be revised but by the rare probes: each of its plain
  // steps moves its acceptance RELAX_W of the way back to the pool's. One whose drafts are right
  // as often as the pool's drafts again within a few steps; one the pool also finds poor stays
  // plain. Measured on the deep model: 0.85 true acceptance, two misses took a sequence from 0.8
  // to 0.46, and it then decoded 36 steps plainly until a probe.
  for (int i = 0; i < n; i++)
    if (k[i] == 0 && p->acc_seen)
      for (int j = 0; j < LKS_MAX_DRAFTS; j++)
        s[i]->acc[j] += (float)(RELAX_W * (p->acc[j] - s[i]->acc[j]));
  // The ceiling: every draft accepted (E = 1 + K), the best K's rate over plain decoding's; it
  // sets how often the probes come (probe_interval).
  double bound = 0;
  for (int K = 1; K <= cap; K++) {
    double r = n * (1.0 + K) / lks_policy_step_cost(&c, K, n * K);
    bound = r > bound ? r : bound;
  }
  p->ceiling[wi] = bound / plain;
  int K = 0;
  for (int i = 0; i < n; i++) K = k[i] > K ? k[i] : K;
  if (K > 0) {
    rc->in = 0;
    rc->acc = p->acc[0];
  } else if (p->last_k[wi] > 0 && p->probe_from[wi] < 0 && p->acc[0] >= rc->acc - RECHECK_ACC) {
    rc->in = RECHECK_AFTER;
    rc->k = p->last_k[wi];
  }
  p->last_k[wi] = K;
  if (p->probe_from[wi] >= 0) {  // the first choice after a probe
    int e = p->probe_every[wi];
    int twice = 2 * e < POLICY_PROBE_MOST ? 2 * e : POLICY_PROBE_MOST;
    p->probe_every[wi] = K == p->probe_from[wi] ? twice : POLICY_PROBE_EVERY;
    p->probe_from[wi] = -1;
  }
  return K;
}
