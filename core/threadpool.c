// SPDX-License-Identifier: MIT
// The thread pool (see threadpool.h). A job is published in one 64-bit word, `job`: the job's
// generation in the high half, the next unclaimed task in the low half. Threads claim tasks by
// compare-and-swap on that word, so a worker that wakes late (descheduled, or still asleep) can
// never claim a task of a later job with the function of an earlier one, and the caller waits
// only for the tasks to finish, never for idle workers. Workers spin with `pause` for a while
// after each job (decode runs hundreds of small jobs back to back), then sleep on a condition
// variable.
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

typedef struct {
  lks_task_fn fn;
  void *ctx;
  int n_tasks;
} job_desc;

struct lks_pool {
  int n_threads;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  _Alignas(64) atomic_uint_least64_t job;  // generation << 32 | next task
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

// Claims and runs tasks of generation `gen` until none is left; the descriptor is read before
// the first claim, and a successful claim proves the job was still current then.
static void run_tasks(lks_pool *p, uint32_t gen, int thread) {
  job_desc d = p->desc[gen & 1];
  uint64_t w = atomic_load_explicit(&p->job, memory_order_acquire);
  for (;;) {
    if (gen_of(w) != gen || (uint32_t)w >= (uint32_t)d.n_tasks) return;
    if (!atomic_compare_exchange_weak_explicit(&p->job, &w, w + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue;
    d.fn(d.ctx, (int)(uint32_t)w, thread);
    atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    w = atomic_load_explicit(&p->job, memory_order_acquire);
  }
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
  if (!p->threads) goto fail;
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
  p->desc[gen & 1] = (job_desc){fn, ctx, n_tasks};
  atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
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
