// SPDX-License-Identifier: MIT
// The engine executes one command of the command set (proto/lockstep.proto) on this rank: the
// same code runs on rank 0 for its own shard and on every worker, so that every rank does the
// same thing in the same order (the lockstep rule, DESIGN.md section 2). It owns the sequence
// slots and their KV caches. Everything in a command is validated before anything runs, so a
// bad command is refused the same way on every rank and changes nothing.
#ifndef LKS_ENGINE_H
#define LKS_ENGINE_H

#include <stdint.h>

#include "model/model.h"
#include "proto/command.h"
#include "worker/prefix.h"

typedef struct lks_engine lks_engine;

// What a forward command hands back (on every rank; rank 0 uses it). Host memory owned by the
// engine, valid until the next exec.
typedef struct lks_engine_out {
  int n;             // output rows
  const int32_t *tokens;  // OUT_GREEDY: [n] arg-max ids
  const float *logits;    // OUT_LOGITS: [n, vocab]
} lks_engine_out;

typedef struct lks_engine_opts {
  int n_blocks;       // KV blocks per cache; 0: enough for every slot at max_seq_len
  bool prefix_cache;  // keep the blocks of finished sequences for reuse (worker/prefix.h)
} lks_engine_opts;

// Slots for max_slots sequences of up to max_seq_len positions, KV blocks of `block` positions;
// o may be NULL (defaults).
lks_engine *lks_engine_new(lks_model *m, int max_slots, int max_seq_len, int block,
                           const lks_engine_opts *o);
void lks_engine_free(lks_engine *e);

// Checks a command against the engine's state without running it: 0, or an error naming what
// is wrong (slot, position, token, count).
int lks_engine_check(const lks_engine *e, const Lockstep__Command *cmd);
// Checks and runs a command. Forward commands are collectives at world > 1.
int lks_engine_exec(lks_engine *e, const Lockstep__Command *cmd, lks_engine_out *out);

lks_model *lks_engine_model(const lks_engine *e);
// Free KV blocks of the target's cache and of the drafter's (the DFlash drafter's context cache
// when the model has one attached, else the MTP layer's; 0 without either): with no slot in
// use, every block is free.
void lks_engine_free_blocks(const lks_engine *e, int *target, int *drafter);
// Positions the slot holds (-1 when free).
int lks_engine_slot_len(const lks_engine *e, int slot);
// Rank 0's planning: how many leading blocks of tok[0, n) the prefix cache can give a new
// sequence (0 without a cache), with the drafter's part for a sequence that speculates with the
// MTP layer; and the block size. The same on every rank.
int lks_engine_prefix_match(const lks_engine *e, const int32_t *tok, int n, bool drafter);
int lks_engine_block_size(const lks_engine *e);
// KV blocks in each cache's pool.
int lks_engine_n_blocks(const lks_engine *e);
// For tests: the K and V rows of every layer at one position of a slot, in the target's cache or
// the drafter's, as f32 into out[lks_engine_kv_row_floats(e, drafter)].
int lks_engine_kv_read(const lks_engine *e, int slot, bool drafter, int pos, float *out);
size_t lks_engine_kv_row_floats(const lks_engine *e, bool drafter);
// The prefix cache's counters (zeros without a cache).
void lks_engine_prefix_stats(const lks_engine *e, lks_prefix_stats *st);

#endif
