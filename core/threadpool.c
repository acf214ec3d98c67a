// SPDX-License-Identifier: MIT
// The thread pool (see threadpool.h). A job is published in one 64-bit word, `job`: its
// generation in the high half. Thread t's share of the tasks is t, t + n, t + 2n, ... (n
// threads), claimed by compare-and-swap on the thread's own word, slot[t] (the generation in the
// high half, the share's tasks claimed in the low half): a thread claims its own tasks without
// moving a cache line between cores, then claims the others' left over, so uneven progress still
// balances. A worker that wakes late (descheduled, or still asleep) can never claim a task of a
// later job with the function of an earlier one: the claim compares the generation. The caller
// waits only for the tasks to finish, never for idle workers. Workers spin with `pause` for a
// while after each job (decode runs hundreds of small jobs back to back), then sleep on a
// condition variable.
#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

// About 0.3-1 ms of pauses (a pause is 10-150 cycles depending on the CPU) before sleeping.
enum { SPIN_ITERS = 1 << 13 };

// A job's descriptor. Its fields are atomics (relaxed: plain moves) because a worker that woke
// late may read them as the caller rewrites them for a later job; such a worker's claims then
// fail, and the mixed values it read are never used.
typedef struct {
  _Atomic(lks_task_fn) fn;
  _Atomic(void *) ctx;
  atomic_int n_tasks;
} job_desc;

typedef struct {
  _Alignas(64) atomic_uint_least64_t next;  // generation << 32 | the share's tasks claimed
} slot;

struct lks_pool {
  int n_threads;
  pthread_t *threads;
  slot *slots;  // [n_threads]
  pthread_mutex_t mu;
  pthread_cond_t wake;
  _Alignas(64) atomic_uint_least64_t job;  // generation << 32
  _Alignas(64) atomic_int n_done;          // tasks of the current job finished
  atomic_int sleepers;
  atomic_bool stop;
  // Descriptors by generation parity: the caller writes the next job's slot, which no worker
  // can still read (its generation is two jobs old and its claims fail).
  job_desc desc[2];
};

typedef struct {
  lks_pool *p;
  int index;
} worker_arg;

static uint32_t gen_of(uint64_t w) { return (uint32_t)(w >> 32); }

// Claims and runs tasks of generation `gen` until none is left: the thread's own share, then
// the others' in turn. The descriptor is read before the first claim, and a successful claim
// proves the job was still current then (the caller sets the slots to a new generation before
// it reuses a descriptor). The tasks run are counted into n_done once, at the end: the caller
// waits for all of them, so the count cannot reach a later job. With every claim and every
// count on words both cores write, a job of 16 tasks on 2 threads of this host moved those lines
// between the cores about three times a task: empty tasks 1.7-1.9 -> 1.2 us a job, tasks of
// 0.15 us 2.8-3.1 -> 2.25 us (2026-12-07).
static void run_tasks(lks_pool *p, uint32_t gen, int thread) {
  const job_desc *jd = &p->desc[gen & 1];
  const lks_task_fn fn = atomic_load_explicit(&jd->fn, memory_order_relaxed);
  void *const ctx = atomic_load_explicit(&jd->ctx, memory_order_relaxed);
  const int n_tasks = atomic_load_explicit(&jd->n_tasks, memory_order_relaxed);
  const int n = p->n_threads;
  int done = 0;
  for (int v = 0; v < n; v++) {
    const int t = (thread + v) % n;
    atomic_uint_least64_t *next = &p->slots[t].next;
    uint64_t w = atomic_load_explicit(next, memory_order_acquire);
    for (;;) {
      int64_t task = t + (int64_t)(uint32_t)w * n;
      if (gen_of(w) != gen || task >= n_tasks) break;
      if (!atomic_compare_exchange_weak_explicit(next, &w, w + 1, memory_order_acq_rel,
                                                 memory_order_acquire))
        continue;
      fn(ctx, (int)task, thread);
      done++;
      w = atomic_load_explicit(next, memory_order_acquire);
    }
  }
  if (done) atomic_fetch_add_explicit(&p->n_done, done, memory_order_release);
}

static void *worker_main(void *arg) {
  worker_arg *wa = arg;
  lks_pool *p = wa->p;
  int index = wa->index;
  free(wa);
  uint32_t seen = gen_of(atomic_load(&p->job));
  for (;;) {
    uint32_t g;
    int spins = 0;
    while ((g = gen_of(atomic_load_explicit(&p->job, memory_order_acquire))) == seen) {
      if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
      if (++spins < SPIN_ITERS) {
        cpu_relax();
        continue;
      }
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while (gen_of(atomic_load(&p->job)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
      spins = 0;
    }
    seen = g;
    run_tasks(p, g, index);
  }
}

lks_pool *lks_pool_new(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  lks_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n_threads = n_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  p->slots = aligned_alloc(_Alignof(slot), (size_t)n_threads * sizeof *p->slots);
  if (!p->threads || !p->slots) goto fail;
  for (int i = 0; i < n_threads; i++) atomic_init(&p->slots[i].next, 0);
  for (int i = 1; i < n_threads; i++) {
    worker_arg *w = malloc(sizeof *w);
    if (!w) {
      p->n_threads = i;  // only threads 1 .. i-1 exist to be joined
      goto fail;
    }
    *w = (worker_arg){p, i};
    if (pthread_create(&p->threads[i], NULL, worker_main, w) != 0) {
      free(w);
      LKS_LOG(LKS_LOG_ERROR, "thread pool: cannot start thread %d", i);
      p->n_threads = i;
      goto fail;
    }
  }
  return p;
fail:
  lks_pool_free(p);
  return NULL;
}

void lks_pool_free(lks_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, true);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; p->threads && i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  free(p->threads);
  free(p->slots);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  free(p);
}

int lks_pool_size(const lks_pool *p) { return p->n_threads; }

void lks_pool_run(lks_pool *p, int n_tasks, lks_task_fn fn, void *ctx) {
  if (n_tasks <= 0) return;
  if (p->n_threads == 1 || n_tasks == 1) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  uint32_t gen = gen_of(atomic_load_explicit(&p->job, memory_order_relaxed)) + 1;
  job_desc *jd = &p->desc[gen & 1];
  atomic_store_explicit(&jd->fn, fn, memory_order_relaxed);
  atomic_store_explicit(&jd->ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&jd->n_tasks, n_tasks, memory_order_relaxed);
  atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
  for (int t = 0; t < p->n_threads; t++)
    atomic_store_explicit(&p->slots[t].next, (uint64_t)gen << 32, memory_order_relaxed);
  // Publish (sequentially consistent: against a worker's sleepers increment, so that either it
  // sees the new generation or this sees it asleep).
  atomic_store(&p->job, (uint64_t)gen << 32);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
  }
  run_tasks(p, gen, 0);
  while (atomic_load_explicit(&p->n_done, memory_order_acquire) < n_tasks) cpu_relax();
}
