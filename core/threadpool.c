// SPDX-License-Identifier: MIT
// The thread pool (see threadpool.h). A job is published by bumping `generation`; tasks are
// claimed with an atomic counter, so uneven tasks balance themselves.
#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/log.h"

enum { SPIN_ITERS = 1 << 16 };

struct lks_pool {
  int n_threads;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  atomic_uint generation;
  atomic_int next_task;
  atomic_int n_done;  // workers that finished the current job
  atomic_bool stop;
  int n_tasks;
  lks_task_fn fn;
  void *ctx;
};

typedef struct {
  lks_pool *p;
  int index;
} worker_arg;

static void run_tasks(lks_pool *p, int thread) {
  for (;;) {
    int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
    if (t >= p->n_tasks) break;
    p->fn(p->ctx, t, thread);
  }
}

static void *worker_main(void *arg) {
  worker_arg *w = arg;
  lks_pool *p = w->p;
  int index = w->index;
  free(w);
  unsigned seen = 0;
  for (;;) {
    unsigned g;
    int spins = 0;
    while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
           !atomic_load(&p->stop)) {
      if (++spins < SPIN_ITERS) continue;
      pthread_mutex_lock(&p->mu);
      while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = g;
    run_tasks(p, index);
    atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
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
  p->n_tasks = n_tasks;
  p->fn = fn;
  p->ctx = ctx;
  atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
  atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  run_tasks(p, 0);
  while (atomic_load_explicit(&p->n_done, memory_order_acquire) < p->n_threads - 1) {
  }
}
