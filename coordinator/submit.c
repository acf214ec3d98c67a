// SPDX-License-Identifier: MIT
// Command submission (rank 0 only): stamp and send a command to every worker, then run it on this
// rank's shard with the same engine code the workers run; and the common commands, built and
// submitted. Called from one thread, the scheduler's.
#include "coordinator/submit.h"

#include "core/clock.h"
#include "core/error.h"

int lks_world_submit(lks_world *w, Lockstep__Command *cmd, lks_engine_out *out) {
  // Rank 0 validates completely before sending: a command that reaches a worker is valid.
  LKS_TRY(lks_engine_check(w->engine, cmd));
  double t0 = lks_clock();
  if (w->ctl) {
    LKS_TRY(lks_ctl_send(w->ctl, cmd));
  } else {
    w->comm->step++;
  }
  double t1 = lks_clock(), c0 = w->comm->stats.seconds;
  LKS_TRY(lks_engine_exec(w->engine, cmd, out));
  double t2 = lks_clock();
  w->t_control += t1 - t0;
  w->t_comm += w->comm->stats.seconds - c0;
  w->t_exec += (t2 - t1) - (w->comm->stats.seconds - c0);
  w->n_submitted++;
  return 0;
}

int lks_world_slots(lks_world *w, Lockstep__CmdType type, const uint32_t *slots, int n) {
  if (n == 0) return 0;
  Lockstep__SlotList sl = LOCKSTEP__SLOT_LIST__INIT;
  sl.slots = (uint32_t *)slots;
  sl.n_slots = (size_t)n;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = type;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_SLOTS;
  cmd.slots = &sl;
  return lks_world_submit(w, &cmd, NULL);
}

int lks_world_commit(lks_world *w, const uint32_t *slots, const uint32_t *keep, int n) {
  if (n == 0) return 0;
  Lockstep__Commit c = LOCKSTEP__COMMIT__INIT;
  c.slots = (uint32_t *)slots;
  c.n_slots = (size_t)n;
  c.keep_len = (uint32_t *)keep;
  c.n_keep_len = (size_t)n;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = LOCKSTEP__CMD_TYPE__EP_CMD_COMMIT;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_COMMIT;
  cmd.commit = &c;
  return lks_world_submit(w, &cmd, NULL);
}

int lks_world_forward1(lks_world *w, Lockstep__CmdType type, int slot, const int32_t *tok, int n,
                       int start, bool want_all, bool mtp, bool logits, lks_engine_out *out) {
  Lockstep__SlotTokens st = LOCKSTEP__SLOT_TOKENS__INIT;
  Lockstep__SlotTokens *seqs[1] = {&st};
  st.slot = (uint32_t)slot;
  st.start_pos = (uint32_t)start;
  st.tokens = (int32_t *)tok;
  st.n_tokens = (size_t)n;
  st.want_last = !want_all;
  st.want_all = want_all;
  Lockstep__Forward f = LOCKSTEP__FORWARD__INIT;
  f.seqs = seqs;
  f.n_seqs = 1;
  f.output = logits ? LOCKSTEP__OUTPUT_MODE__OUT_LOGITS : LOCKSTEP__OUTPUT_MODE__OUT_GREEDY;
  f.mtp = mtp;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = type;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
  cmd.forward = &f;
  return lks_world_submit(w, &cmd, out);
}

