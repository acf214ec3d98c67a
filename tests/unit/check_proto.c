// SPDX-License-Identifier: MIT
// The command set on the wire: every command type round-trips through encode and decode with
// its payload intact; truncated, garbage, out-of-order, wrong-version and mismatched frames are
// rejected by lks_cmd_decode with an error, never returned as a command.
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "worker/control.h"
#include "core/error.h"
#include "testutil.h"

static uint8_t *pack(Lockstep__Command *c, size_t *n) {
  *n = lockstep__command__get_packed_size(c);
  uint8_t *b = malloc(*n + 1);
  lockstep__command__pack(c, b);
  return b;
}

static Lockstep__Command *roundtrip(Lockstep__Command *c) {
  c->protocol_version = LKS_PROTOCOL_VERSION;
  size_t n;
  uint8_t *b = pack(c, &n);
  Lockstep__Command *d = NULL;
  int rc = lks_cmd_decode(b, n, c->step_id, &d);
  ck_assert_msg(rc == 0, "type %d: %s", c->type, lks_last_error());
  ck_assert_int_eq(d->type, c->type);
  ck_assert_uint_eq(d->step_id, c->step_id);
  ck_assert_int_eq(d->payload_case, c->payload_case);
  free(b);
  return d;
}

START_TEST(every_command_roundtrips) {
  uint32_t slots[3] = {0, 5, 4095};
  int32_t toks[4] = {1, 151551, 0, 77};
  uint32_t keep[3] = {10, 0, 3};
  // Slots.
  Lockstep__SlotList sl = LOCKSTEP__SLOT_LIST__INIT;
  sl.slots = slots;
  sl.n_slots = 3;
  sl.token_budget = 4096;
  Lockstep__CmdType slot_types[] = {LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT,
                                    LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT};
  for (int i = 0; i < 2; i++) {
    Lockstep__Command c = LOCKSTEP__COMMAND__INIT;
    c.type = slot_types[i];
    c.step_id = 7 + i;
    c.payload_case = LOCKSTEP__COMMAND__PAYLOAD_SLOTS;
    c.slots = &sl;
    Lockstep__Command *d = roundtrip(&c);
    ck_assert_uint_eq(d->slots->n_slots, 3);
    ck_assert_uint_eq(d->slots->slots[2], 4095);
    ck_assert_uint_eq(d->slots->token_budget, 4096);
    lockstep__command__free_unpacked(d, NULL);
  }
  // Forwards.
  Lockstep__SlotTokens st = LOCKSTEP__SLOT_TOKENS__INIT;
  st.slot = 5;
  st.start_pos = 123;
  st.tokens = toks;
  st.n_tokens = 4;
  st.want_all = true;
  Lockstep__SlotTokens *seqs[1] = {&st};
  Lockstep__Forward f = LOCKSTEP__FORWARD__INIT;
  f.seqs = seqs;
  f.n_seqs = 1;
  f.output = LOCKSTEP__OUTPUT_MODE__OUT_LOGITS;
  Lockstep__CmdType fwd_types[] = {LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL,
                                   LOCKSTEP__CMD_TYPE__EP_CMD_DECODE,
                                   LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY};
  for (int i = 0; i < 3; i++) {
    Lockstep__Command c = LOCKSTEP__COMMAND__INIT;
    c.type = fwd_types[i];
    c.step_id = 100 + i;
    c.payload_case = LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
    c.forward = &f;
    Lockstep__Command *d = roundtrip(&c);
    ck_assert_uint_eq(d->forward->n_seqs, 1);
    ck_assert_uint_eq(d->forward->seqs[0]->start_pos, 123);
    ck_assert_mem_eq(d->forward->seqs[0]->tokens, toks, sizeof toks);
    ck_assert(d->forward->seqs[0]->want_all);
    ck_assert_int_eq(d->forward->output, LOCKSTEP__OUTPUT_MODE__OUT_LOGITS);
    lockstep__command__free_unpacked(d, NULL);
  }
  // Commit.
  Lockstep__Commit cm = LOCKSTEP__COMMIT__INIT;
  cm.slots = slots;
  cm.n_slots = 3;
  cm.keep_len = keep;
  cm.n_keep_len = 3;
  Lockstep__Command c = LOCKSTEP__COMMAND__INIT;
  c.type = LOCKSTEP__CMD_TYPE__EP_CMD_COMMIT;
  c.step_id = 1;
  c.payload_case = LOCKSTEP__COMMAND__PAYLOAD_COMMIT;
  c.commit = &cm;
  Lockstep__Command *d = roundtrip(&c);
  ck_assert_mem_eq(d->commit->keep_len, keep, sizeof keep);
  lockstep__command__free_unpacked(d, NULL);
  // MTP propose.
  Lockstep__SlotTokens ps = LOCKSTEP__SLOT_TOKENS__INIT;
  ps.slot = 4;
  ps.start_pos = 77;
  ps.tokens = toks;
  ps.n_tokens = 3;
  Lockstep__SlotTokens *pseqs[1] = {&ps};
  Lockstep__MtpPropose mp = LOCKSTEP__MTP_PROPOSE__INIT;
  mp.seqs = pseqs;
  mp.n_seqs = 1;
  mp.n_drafts = 3;
  Lockstep__Command p = LOCKSTEP__COMMAND__INIT;
  p.type = LOCKSTEP__CMD_TYPE__EP_CMD_MTP_PROPOSE;
  p.step_id = 2;
  p.payload_case = LOCKSTEP__COMMAND__PAYLOAD_PROPOSE;
  p.propose = &mp;
  d = roundtrip(&p);
  ck_assert_uint_eq(d->propose->n_drafts, 3);
  ck_assert_uint_eq(d->propose->seqs[0]->start_pos, 77);
  ck_assert_mem_eq(d->propose->seqs[0]->tokens, toks, 3 * sizeof toks[0]);
  lockstep__command__free_unpacked(d, NULL);
  // DFlash propose: the same payload under its own type.
  ps.n_tokens = 1;
  p.type = LOCKSTEP__CMD_TYPE__EP_CMD_DFLASH_PROPOSE;
  d = roundtrip(&p);
  ck_assert_int_eq(d->type, LOCKSTEP__CMD_TYPE__EP_CMD_DFLASH_PROPOSE);
  ck_assert_uint_eq(d->propose->seqs[0]->n_tokens, 1);
  ck_assert_uint_eq(d->propose->seqs[0]->start_pos, 77);
  lockstep__command__free_unpacked(d, NULL);
  // Levers.
  Lockstep__Levers lv = LOCKSTEP__LEVERS__INIT;
  lv.n_drafts = 2;
  lv.ladder = "4:3,8:3,16:1";
  lv.speculation = true;
  Lockstep__Command l = LOCKSTEP__COMMAND__INIT;
  l.type = LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS;
  l.step_id = 3;
  l.payload_case = LOCKSTEP__COMMAND__PAYLOAD_LEVERS;
  l.levers = &lv;
  d = roundtrip(&l);
  ck_assert_str_eq(d->levers->ladder, "4:3,8:3,16:1");
  lockstep__command__free_unpacked(d, NULL);
  // Payload-free commands.
  Lockstep__CmdType bare[] = {LOCKSTEP__CMD_TYPE__EP_CMD_HEARTBEAT, LOCKSTEP__CMD_TYPE__EP_CMD_SHUTDOWN};
  for (int i = 0; i < 2; i++) {
    Lockstep__Command b = LOCKSTEP__COMMAND__INIT;
    b.type = bare[i];
    b.step_id = 9;
    d = roundtrip(&b);
    lockstep__command__free_unpacked(d, NULL);
  }
}
END_TEST

static void expect_rejected(const void *buf, size_t n, uint64_t step, const char *want) {
  Lockstep__Command *d = (Lockstep__Command *)1;
  lks_clear_error();
  ck_assert_int_lt(lks_cmd_decode(buf, n, step, &d), 0);
  ck_assert_ptr_null(d);
  ck_assert_msg(strstr(lks_last_error(), want) != NULL, "'%s' lacks '%s'", lks_last_error(), want);
}

START_TEST(bad_frames_rejected) {
  int32_t toks[64];
  for (int i = 0; i < 64; i++) toks[i] = i * 1000;
  Lockstep__SlotTokens st = LOCKSTEP__SLOT_TOKENS__INIT;
  st.tokens = toks;
  st.n_tokens = 64;
  Lockstep__SlotTokens *seqs[1] = {&st};
  Lockstep__Forward f = LOCKSTEP__FORWARD__INIT;
  f.seqs = seqs;
  f.n_seqs = 1;
  Lockstep__Command c = LOCKSTEP__COMMAND__INIT;
  c.protocol_version = LKS_PROTOCOL_VERSION;
  c.type = LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL;
  c.step_id = 42;
  c.payload_case = LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
  c.forward = &f;
  size_t n;
  uint8_t *b = pack(&c, &n);
  // Every truncation of a valid frame is rejected (a cut inside the payload does not decode; a
  // cut before the payload leaves a type without its payload).
  for (size_t cut = 0; cut < n; cut++) {
    Lockstep__Command *d = NULL;
    int rc = lks_cmd_decode(b, cut, 42, &d);
    ck_assert_msg(rc < 0 && d == NULL, "truncated to %zu of %zu bytes was accepted", cut, n);
  }
  // Garbage: random frames never come out as commands of the expected step with a valid payload.
  uint64_t seed = 99;
  uint8_t junk[256];
  for (int t = 0; t < 2000; t++) {
    size_t len = tu_rand(&seed) % sizeof junk;
    for (size_t i = 0; i < len; i++) junk[i] = (uint8_t)tu_rand(&seed);
    Lockstep__Command *d = NULL;
    int rc = lks_cmd_decode(junk, len, 42, &d);
    ck_assert_msg(rc < 0 && d == NULL, "garbage frame %d accepted", t);
  }
  expect_rejected("\xff\xff\xff", 3, 42, "does not decode");
  expect_rejected(b, n, 41, "out of order (expected 41)");
  expect_rejected(b, n, 43, "out of order (expected 43)");
  free(b);
  c.protocol_version = 7;
  b = pack(&c, &n);
  expect_rejected(b, n, 42, "protocol version 7");
  free(b);
  c.protocol_version = LKS_PROTOCOL_VERSION;
  c.type = LOCKSTEP__CMD_TYPE__EP_CMD_COMMIT;  // a commit carrying a forward
  b = pack(&c, &n);
  expect_rejected(b, n, 42, "wrong payload");
  free(b);
  c.type = (Lockstep__CmdType)77;
  b = pack(&c, &n);
  expect_rejected(b, n, 42, "wrong payload");
  free(b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("proto");
  TCase *tc = tcase_create("wire");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, every_command_roundtrips);
  tcase_add_test(tc, bad_frames_rejected);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
