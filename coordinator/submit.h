// SPDX-License-Identifier: MIT
// Rank 0's way of running a command everywhere (see submit.c): every command is validated by
// the engine's check before it is sent, so a command that reaches a worker is valid.
#ifndef LKS_COORDINATOR_SUBMIT_H
#define LKS_COORDINATOR_SUBMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/world.h"

// Rank 0: stamps and sends `cmd` to every worker, then executes it here.
int lks_world_submit(lks_world *w, Lockstep__Command *cmd, lks_engine_out *out);
// Rank 0: the common commands, built and submitted. Slot commands (ALLOC_SLOT, FREE_SLOT) for
// n slots; COMMIT keeping keep[i] positions of slots[i]; a forward of n tokens of one slot from
// position `start`, asking for the last row's output (or every row's, want_all), as greedy ids
// or logits, keeping hidden states for the drafter when mtp is set.
int lks_world_slots(lks_world *w, Lockstep__CmdType type, const uint32_t *slots, int n);
int lks_world_commit(lks_world *w, const uint32_t *slots, const uint32_t *keep, int n);
int lks_world_forward1(lks_world *w, Lockstep__CmdType type, int slot, const int32_t *tok, int n,
                       int start, bool want_all, bool mtp, bool logits, lks_engine_out *out);
#endif
