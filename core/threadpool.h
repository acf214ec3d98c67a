// SPDX-License-Identifier: MIT
// A fixed pool of worker threads for data-parallel loops. lks_pool_run() splits `n_tasks` tasks
// over the pool and the calling thread and returns when all are done; it is called from one
// thread at a time (the thread that owns the pool). Workers spin briefly after a job, then sleep
// on a condition variable, so back-to-back small jobs (one per matrix of a decode step) do not
// pay a wake-up each.
#ifndef LKS_THREADPOOL_H
#define LKS_THREADPOOL_H

typedef struct lks_pool lks_pool;

// fn(ctx, task, thread): thread is in [0, n_threads) and names the scratch slot to use.
typedef void (*lks_task_fn)(void *ctx, int task, int thread);

// n_threads counts the caller: 1 means no extra threads. NULL on failure (logged).
lks_pool *lks_pool_new(int n_threads);
void lks_pool_free(lks_pool *p);
int lks_pool_size(const lks_pool *p);
void lks_pool_run(lks_pool *p, int n_tasks, lks_task_fn fn, void *ctx);

#endif
