// SPDX-License-Identifier: MIT
// The paged KV cache on the CPU backend: sequence slots, blocks taken and returned as lengths
// grow and roll back, determinism of the allocation (the lockstep rule), exhaustion answered
// with LKS_EFULL, rows that must be reserved, and slots that map through the block table to
// where kv_store writes.
#include <check.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "model/kv_cache.h"

enum { LAYERS = 2, KVH = 2, HD = 4, BS = 4, NBLK = 10, SEQS = 3, MAXLEN = 22 };
enum { MAXB = (MAXLEN + BS - 1) / BS };  // 6 blocks per sequence

static lks_backend *be;
static lks_kv_cache *kv;

static void setup(void) {
  lks_log_set_level(LKS_LOG_WARN);
  be = lks_backend_new("cpu", 1);
  ck_assert_ptr_nonnull(be);
  kv = lks_kv_new(be, LAYERS, KVH, HD, LKS_F32, BS, NBLK, SEQS, MAXLEN);
  ck_assert_ptr_nonnull(kv);
}

static void teardown(void) {
  lks_kv_free(kv);
  lks_backend_free(be);
  kv = NULL;
  be = NULL;
}

// Slots of rows (seq, pos); asserts that lks_kv_rows accepts them.
static void slots_of(lks_kv_cache *c, int n, const int32_t *seq, const int32_t *pos,
                     int32_t *slot, lks_attn_rows *rows_out) {
  lks_attn_rows rows = {.n = n, .seq = seq, .pos = pos};
  ck_assert_int_eq(lks_kv_rows(c, &rows, slot), 0);
  ck_assert_ptr_eq(rows.slot, slot);
  ck_assert_ptr_nonnull(rows.block_table);
  ck_assert_int_eq(rows.max_blocks, MAXB);
  if (rows_out) *rows_out = rows;
}

START_TEST(test_new_and_sizes) {
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK);
  ck_assert_uint_eq(lks_kv_bytes(kv), (size_t)LAYERS * 2 * NBLK * BS * KVH * HD * sizeof(float));
  for (int l = 0; l < LAYERS; l++) {
    const lks_kv_layer *L = lks_kv_layer_at(kv, l);
    ck_assert_int_eq(L->n_blocks, NBLK);
    ck_assert_int_eq(L->block_size, BS);
    ck_assert_int_eq(L->n_kv_heads, KVH);
    ck_assert_int_eq(L->head_dim, HD);
    ck_assert_ptr_nonnull(L->k);
    ck_assert_ptr_nonnull(L->v);
    ck_assert_ptr_ne(L->k, L->v);
  }
  ck_assert_ptr_ne(lks_kv_layer_at(kv, 0)->k, lks_kv_layer_at(kv, 1)->k);
  lks_kv_free(NULL);
}
END_TEST

START_TEST(test_seq_slots) {
  for (int s = 0; s < SEQS; s++) {
    ck_assert_int_eq(lks_kv_seq_alloc(kv), s);
    ck_assert_int_eq(lks_kv_seq_len(kv, s), 0);
  }
  lks_clear_error();
  ck_assert_int_eq(lks_kv_seq_alloc(kv), LKS_EFULL);
  ck_assert_str_ne(lks_last_error(), "");
  // A freed slot is handed out again, with its length reset.
  ck_assert_int_eq(lks_kv_seq_resize(kv, 1, 7), 0);
  lks_kv_seq_free(kv, 1);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK);
  ck_assert_int_eq(lks_kv_seq_alloc(kv), 1);
  ck_assert_int_eq(lks_kv_seq_len(kv, 1), 0);
  ck_assert_int_eq(lks_kv_seq_alloc(kv), LKS_EFULL);
  // Freeing a free or nonexistent slot changes nothing.
  lks_kv_seq_free(kv, 2);
  lks_kv_seq_free(kv, 2);
  lks_kv_seq_free(kv, -1);
  lks_kv_seq_free(kv, SEQS);
  ck_assert_int_eq(lks_kv_seq_alloc(kv), 2);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK);
}
END_TEST

START_TEST(test_resize_and_rollback) {
  int s = lks_kv_seq_alloc(kv), t = lks_kv_seq_alloc(kv);
  ck_assert_int_ge(s, 0);
  ck_assert_int_ge(t, 0);
  static const struct {
    int len, blocks;
  } steps[] = {{1, 1}, {4, 1}, {5, 2}, {13, 4}, {12, 3}, {9, 3}, {8, 2}, {0, 0}, {22, 6},
               {17, 5}, {3, 1}};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    ck_assert_int_eq(lks_kv_seq_resize(kv, s, steps[i].len), 0);
    ck_assert_int_eq(lks_kv_seq_len(kv, s), steps[i].len);
    ck_assert_msg(lks_kv_free_blocks(kv) == NBLK - steps[i].blocks,
                  "len %d: %d free blocks, want %d", steps[i].len, lks_kv_free_blocks(kv),
                  NBLK - steps[i].blocks);
  }
  // Two sequences share the pool; rolling one back gives its blocks to the other.
  ck_assert_int_eq(lks_kv_seq_resize(kv, t, 20), 0);  // 5 blocks, 6 held in all
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK - 6);
  ck_assert_int_eq(lks_kv_seq_resize(kv, s, 0), 0);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK - 5);
  lks_kv_seq_free(kv, t);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK);
  // Resizing a sequence that is not allocated is an error.
  ck_assert_int_eq(lks_kv_seq_resize(kv, t, 3), LKS_EINVAL);
  ck_assert_int_eq(lks_kv_seq_resize(kv, SEQS, 3), LKS_EINVAL);
  ck_assert_int_eq(lks_kv_seq_resize(kv, -1, 3), LKS_EINVAL);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK);
}
END_TEST

START_TEST(test_rollback_keeps_prefix) {
  // Rolling back keeps the blocks of the positions that stay; growing again reuses freed ones.
  int s = lks_kv_seq_alloc(kv);
  ck_assert_int_eq(lks_kv_seq_resize(kv, s, 16), 0);
  int32_t seq[16], pos[16], before[16], after[16];
  for (int i = 0; i < 16; i++) {
    seq[i] = s;
    pos[i] = i;
  }
  slots_of(kv, 16, seq, pos, before, NULL);
  ck_assert_int_eq(lks_kv_seq_resize(kv, s, 6), 0);
  slots_of(kv, 6, seq, pos, after, NULL);
  ck_assert_mem_eq(before, after, 6 * sizeof(int32_t));
  ck_assert_int_eq(lks_kv_seq_resize(kv, s, 16), 0);
  slots_of(kv, 16, seq, pos, after, NULL);
  ck_assert_mem_eq(before, after, 6 * sizeof(int32_t));
  // Freed blocks come back last in, first out: the same blocks as before.
  ck_assert_mem_eq(before, after, 16 * sizeof(int32_t));
}
END_TEST

START_TEST(test_exhaustion) {
  int a = lks_kv_seq_alloc(kv), b = lks_kv_seq_alloc(kv);
  ck_assert_int_eq(lks_kv_seq_resize(kv, a, 6 * BS), 0);  // 6 of 10 blocks
  lks_clear_error();
  // Five more blocks do not fit: refused, and nothing changes.
  ck_assert_int_eq(lks_kv_seq_resize(kv, b, 5 * BS), LKS_EFULL);
  ck_assert_str_ne(lks_last_error(), "");
  ck_assert_int_eq(lks_kv_seq_len(kv, b), 0);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK - 6);
  ck_assert_int_eq(lks_kv_seq_resize(kv, b, 4 * BS), 0);  // exactly the rest
  ck_assert_int_eq(lks_kv_free_blocks(kv), 0);
  ck_assert_int_eq(lks_kv_seq_resize(kv, b, 4 * BS + 1), LKS_EFULL);
  ck_assert_int_eq(lks_kv_seq_len(kv, b), 4 * BS);
  // Within its blocks a sequence still moves freely.
  ck_assert_int_eq(lks_kv_seq_resize(kv, b, 4 * BS - 3), 0);
  ck_assert_int_eq(lks_kv_free_blocks(kv), 0);
  // Longer than a sequence may be: refused even with blocks free.
  lks_kv_seq_free(kv, b);
  lks_clear_error();
  ck_assert_int_eq(lks_kv_seq_resize(kv, a, MAXB * BS + 1), LKS_EFULL);
  ck_assert_str_ne(lks_last_error(), "");
  ck_assert_int_eq(lks_kv_seq_len(kv, a), 6 * BS);
  ck_assert_int_lt(lks_kv_seq_resize(kv, a, INT_MAX), 0);
  ck_assert_int_eq(lks_kv_seq_len(kv, a), 6 * BS);
  // A negative length is an error too, and does not free the sequence.
  ck_assert_int_lt(lks_kv_seq_resize(kv, a, -1), 0);
  ck_assert_int_eq(lks_kv_seq_len(kv, a), 6 * BS);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK - 6);
  ck_assert_int_eq(lks_kv_seq_alloc(kv), b);
  ck_assert_int_eq(lks_kv_seq_alloc(kv), 2);
  ck_assert_int_eq(lks_kv_seq_alloc(kv), LKS_EFULL);
}
END_TEST

// The same calls on two caches give the same slots, block for block.
static void script(lks_kv_cache *c, int32_t *slots_out) {
  int a = lks_kv_seq_alloc(c), b = lks_kv_seq_alloc(c);
  ck_assert_int_eq(lks_kv_seq_resize(c, a, 9), 0);
  ck_assert_int_eq(lks_kv_seq_resize(c, b, 5), 0);
  ck_assert_int_eq(lks_kv_seq_resize(c, a, 3), 0);
  ck_assert_int_eq(lks_kv_seq_resize(c, b, 14), 0);
  lks_kv_seq_free(c, a);
  int d = lks_kv_seq_alloc(c);
  ck_assert_int_eq(lks_kv_seq_resize(c, d, 11), 0);
  int32_t seq[25], pos[25];
  for (int i = 0; i < 25; i++) {
    seq[i] = i < 14 ? b : d;
    pos[i] = i < 14 ? i : i - 14;
  }
  slots_of(c, 25, seq, pos, slots_out, NULL);
}

START_TEST(test_determinism) {
  lks_kv_cache *other = lks_kv_new(be, 1, KVH, HD, LKS_F32, BS, NBLK, SEQS, MAXLEN);
  ck_assert_ptr_nonnull(other);
  int32_t s1[25], s2[25];
  script(kv, s1);
  script(other, s2);
  lks_kv_free(other);
  ck_assert_mem_eq(s1, s2, sizeof s1);
  // Block 0 is handed out first, then 1, ...: the first sequence's first slot is 0.
  lks_kv_cache *fresh = lks_kv_new(be, 1, KVH, HD, LKS_F32, BS, NBLK, SEQS, MAXLEN);
  ck_assert_ptr_nonnull(fresh);
  int f = lks_kv_seq_alloc(fresh);
  ck_assert_int_eq(lks_kv_seq_resize(fresh, f, 2 * BS), 0);
  int32_t seq[2] = {f, f}, pos[2] = {0, BS}, slot[2];
  slots_of(fresh, 2, seq, pos, slot, NULL);
  ck_assert_int_eq(slot[0], 0);
  ck_assert_int_eq(slot[1], BS);
  lks_kv_free(fresh);
}
END_TEST

START_TEST(test_rows_rejects_unreserved) {
  int a = lks_kv_seq_alloc(kv), b = lks_kv_seq_alloc(kv);
  ck_assert_int_eq(lks_kv_seq_resize(kv, a, 5), 0);
  (void)b;  // allocated, length 0
  static const int32_t bad[][2] = {{0, 5}, {0, -1}, {1, 0}, {2, 0}, {-1, 0}, {SEQS, 0},
                                   {0, 1000}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int32_t seq[2] = {0, bad[i][0]}, pos[2] = {4, bad[i][1]}, slot[2];
    lks_attn_rows rows = {.n = 2, .seq = seq, .pos = pos};
    lks_clear_error();
    ck_assert_msg(lks_kv_rows(kv, &rows, slot) == LKS_ERANGE, "(seq %d, pos %d) accepted",
                  bad[i][0], bad[i][1]);
    ck_assert_str_ne(lks_last_error(), "");
  }
  // After a rollback the dropped positions are unreserved again.
  ck_assert_int_eq(lks_kv_seq_resize(kv, a, 2), 0);
  int32_t seq = a, pos = 2, slot;
  lks_attn_rows rows = {.n = 1, .seq = &seq, .pos = &pos};
  ck_assert_int_eq(lks_kv_rows(kv, &rows, &slot), LKS_ERANGE);
  pos = 1;
  ck_assert_int_eq(lks_kv_rows(kv, &rows, &slot), 0);
}
END_TEST

START_TEST(test_slots_map_through_block_table) {
  // Interleave the growth of three sequences so that their blocks are not contiguous.
  int s[3];
  for (int i = 0; i < 3; i++) s[i] = lks_kv_seq_alloc(kv);
  static const int lens[3] = {9, 6, 11};
  for (int len = 1; len <= 11; len++)
    for (int i = 0; i < 3; i++)
      if (len <= lens[i]) ck_assert_int_eq(lks_kv_seq_resize(kv, s[i], len), 0);
  ck_assert_int_eq(lks_kv_free_blocks(kv), NBLK - 3 - 2 - 3);
  enum { N = 9 + 6 + 11 };
  int32_t seq[N], pos[N], slot[N];
  int n = 0;
  for (int i = 0; i < 3; i++)
    for (int p = 0; p < lens[i]; p++) {
      seq[n] = s[i];
      pos[n++] = p;
    }
  lks_attn_rows rows;
  slots_of(kv, N, seq, pos, slot, &rows);
  bool used[NBLK * BS] = {false}, block_owner_set[NBLK] = {false};
  int block_owner[NBLK];
  for (int i = 0; i < N; i++) {
    int32_t blk = rows.block_table[seq[i] * rows.max_blocks + pos[i] / BS];
    ck_assert_int_ge(blk, 0);
    ck_assert_int_lt(blk, NBLK);
    ck_assert_int_eq(slot[i], blk * BS + pos[i] % BS);
    ck_assert_msg(!used[slot[i]], "slot %d used twice", slot[i]);
    used[slot[i]] = true;
    // A block belongs to one sequence.
    if (block_owner_set[blk]) ck_assert_int_eq(block_owner[blk], seq[i]);
    block_owner_set[blk] = true;
    block_owner[blk] = seq[i];
  }
  // Interleaved growth: sequence 0's second block is not next to its first.
  ck_assert_int_ne(rows.block_table[s[0] * MAXB + 1], rows.block_table[s[0] * MAXB] + 1);

  // kv_store writes each row at its slot of every layer.
  const int kvd = KVH * HD;
  float *k = malloc(sizeof(float) * N * kvd), *v = malloc(sizeof(float) * N * kvd);
  for (int i = 0; i < N * kvd; i++) {
    k[i] = (float)i;
    v[i] = (float)-i;
  }
  size_t bytes = sizeof(float) * N * kvd;
  lks_buf *kb = be->ops->buf_alloc(be, bytes), *vb = be->ops->buf_alloc(be, bytes);
  ck_assert_int_eq(be->ops->from_host(be, kb, 0, k, bytes), 0);
  ck_assert_int_eq(be->ops->from_host(be, vb, 0, v, bytes), 0);
  size_t pool = sizeof(float) * NBLK * BS * kvd;
  float *kc = malloc(pool), *vc = malloc(pool);
  for (int l = 0; l < LAYERS; l++) {
    const lks_kv_layer *L = lks_kv_layer_at(kv, l);
    ck_assert_int_eq(be->ops->kv_store(be, L, lks_tensor_2d(kb, 0, LKS_F32, N, kvd),
                                       lks_tensor_2d(vb, 0, LKS_F32, N, kvd), &rows),
                     0);
    ck_assert_int_eq(be->ops->to_host(be, kc, L->k, 0, pool), 0);
    ck_assert_int_eq(be->ops->to_host(be, vc, L->v, 0, pool), 0);
    for (int i = 0; i < N; i++) {
      ck_assert_mem_eq(kc + (size_t)slot[i] * kvd, k + (size_t)i * kvd, sizeof(float) * kvd);
      ck_assert_mem_eq(vc + (size_t)slot[i] * kvd, v + (size_t)i * kvd, sizeof(float) * kvd);
    }
  }
  be->ops->buf_free(be, kb);
  be->ops->buf_free(be, vb);
  free(k);
  free(v);
  free(kc);
  free(vc);
}
END_TEST

int main(void) {
  Suite *s = suite_create("kv_cache");
  TCase *tc = tcase_create("kv_cache");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_new_and_sizes);
  tcase_add_test(tc, test_seq_slots);
  tcase_add_test(tc, test_resize_and_rollback);
  tcase_add_test(tc, test_rollback_keeps_prefix);
  tcase_add_test(tc, test_exhaustion);
  tcase_add_test(tc, test_determinism);
  tcase_add_test(tc, test_rows_rejects_unreserved);
  tcase_add_test(tc, test_slots_map_through_block_table);
  suite_add_tcase(s, tc);

  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
