// SPDX-License-Identifier: MIT
// Helpers shared by the CPU backend's unit tests (check_backend_cpu.c, check_batch_invariance.c):
// backends, buffers and host arrays owned until tb_free_owned (called from a test's teardown), a
// test-side F16 encoder and independent BF16/F16 decoders, random data, and a paged KV cache
// filled through kv_store. Each helper fails the running Check test when something goes wrong.
#ifndef LKS_BACKEND_TESTUTIL_H
#define LKS_BACKEND_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/dtype.h"

// ---- owned until tb_free_owned: buffers, host memory, extra backends ----

// Frees every buffer, host array and backend the helpers below made (buffers first).
void tb_free_owned(void);
// A new cpu backend with `threads` threads (at most 4 per test).
lks_backend *tb_new_backend(int threads);
// Zeroed host memory.
void *tb_mem(size_t bytes);
#define TB_NEW(type, n) ((type *)tb_mem((size_t)(n) * sizeof(type)))
// A [rows, cols] tensor of dtype dt in a new buffer of `b`, filled from host (NULL: zeros).
lks_tensor tb_upload(lks_backend *b, lks_dtype dt, int64_t rows, int64_t cols, const void *host);
// The tensor's elements as f32, in owned host memory.
float *tb_download(lks_backend *b, lks_tensor t);

// ---- numbers ----

double tb_bf16_val(uint16_t h);
double tb_f16_val(uint16_t h);
// Rounds to nearest; for NaN and finite |f| <= 65504.
uint16_t tb_f32_to_f16(float f);
// n values of dtype dt (F32, BF16 or F16) from `src`: the bytes for the backend (owned), and in
// `exact` (may be NULL) the values those bytes hold.
void *tb_encode(lks_dtype dt, const float *src, size_t n, double *exact);
// n values uniform in [-scale, scale), owned.
float *tb_randv(uint64_t *rng, size_t n, float scale);
extern const lks_dtype tb_mm_dtypes[3];  // the weight types: F32, BF16, F16

// ---- a paged KV cache ----

// Two sequences in a cache of 9 blocks of 4 positions, blocks out of order; block 8 of seq 1 is
// the last block of the pool.
enum { TB_BS = 4, TB_NBLK = 9, TB_MAXB = 4, TB_NSEQ = 2 };
extern const int32_t tb_block_table[TB_NSEQ * TB_MAXB];
extern const int tb_seq_len[TB_NSEQ];

typedef struct {
  lks_kv_layer kv;
  int n_heads, n_kv, hd;
  lks_dtype dtype;  // of the pools: LKS_F32 (0) or LKS_BF16
  // [TB_NSEQ, TB_MAXB * TB_BS, n_kv * hd]: what was stored at (seq, pos), as the values the
  // pools hold (rounded to BF16 for a BF16 cache, after kv_store has rounded its own inputs)
  float *Kh, *Vh;
} tb_attn_setup;

// The cache slot of (seq, pos).
int32_t tb_slot_of(int seq, int pos);
// Fills a cache through kv_store, every position of both sequences in a shuffled order, three
// rows at a time.
void tb_fill_cache(lks_backend *b, tb_attn_setup *a, uint64_t seed);

#endif
