// SPDX-License-Identifier: MIT
// The harness of test_cuda_ops (test_cuda_ops.c, test_cuda_ops_moe_mla.c): the CPU backend (the
// reference) and the cuda backend, a seeded random stream, tensors built alike on both, the
// comparisons and the count of cases and failures that main reports. Everything runs on the
// main thread; a failing backend call (TRY) exits with status 1.
#ifndef LKS_TESTS_CUDA_HARNESS_H
#define LKS_TESTS_CUDA_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/backend.h"
#include "core/error.h"

extern lks_backend *CPU, *GPU;
extern int failures, cases;  // counted by check() and by the cases that count themselves
extern uint64_t rng_state;    // seeds rnd(): main sets it from the seed it prints

#define TRY(x)                                                                       \
  do {                                                                               \
    if ((x) < 0) {                                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, lks_last_error()); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

// xorshift64 on rng_state; frand is uniform in [-1, 1), irand in [0, n).
uint64_t rnd(void);
float frand(void);
int irand(int n);

// Host memory that lives until free_held (wrapped buffers point into it: the CPU backend wraps
// without a copy). Exits when out of memory or slots.
void *hold(size_t bytes);
void free_held(void);

typedef struct {
  lks_tensor c, g;  // the same tensor on the CPU and on the GPU
} tp;

// One case: passes when err <= bound (NaN fails); prints a line either way.
void check(const char *what, double err, double bound);
// f32 [rows, cols] with row stride ld on both backends; filled with random values or NaN.
tp act(int64_t rows, int64_t cols, int64_t ld, bool poison);
void act_free(tp t);
// f32 -> BF16 or IEEE half, round to nearest.
uint16_t to16(float f, lks_dtype dt);
// A weight [rows, cols] of dtype dt, wrapped like the loader does: the whole tensor, or columns
// [c0, c0 + cols) of a wider one (shard = true: buf_wrap_host_2d).
tp weight(lks_dtype dt, int64_t rows, int64_t cols, bool shard, float scale);
// No tensor (a NULL bias).
tp none(void);
// max|gpu - cpu| / max|cpu| over the view.
double cmp(tp t);
const char *dn(lks_dtype dt);
// 1 when rows [0, n) of the two GPU f32 tensors are bitwise equal (NaN payloads included); else
// 0 with the first differing row in *bad_row.
int same_bits(lks_tensor a, lks_tensor b, int64_t n, int64_t *bad_row);

// ---- the cases of test_cuda_ops_moe_mla.c (main runs them in test_cuda_ops.c) ----

void t_qmatmul(void);
void t_moe(void);
void t_step(void);
void t_layernorm(void);
void t_cache_store(void);
void t_dsa_select(void);
void t_mla_attention(void);

#endif
