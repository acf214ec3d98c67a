// SPDX-License-Identifier: MIT
// Encoding and checked decoding of commands and acks (see command.h).
#include "proto/command.h"

#include <stdlib.h>

#include "core/error.h"

int lks_cmd_payload_matches(const Lockstep__Command *cmd) {
  switch (cmd->type) {
    case LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT:
    case LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT:
      return cmd->payload_case == LOCKSTEP__COMMAND__PAYLOAD_SLOTS;
    case LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL:
    case LOCKSTEP__CMD_TYPE__EP_CMD_DECODE:
    case LOCKSTEP__CMD_TYPE__EP_CMD_VERIFY:
    case LOCKSTEP__CMD_TYPE__EP_CMD_ATTACH_PREFIX:
      return cmd->payload_case == LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
    case LOCKSTEP__CMD_TYPE__EP_CMD_COMMIT:
      return cmd->payload_case == LOCKSTEP__COMMAND__PAYLOAD_COMMIT;
    case LOCKSTEP__CMD_TYPE__EP_CMD_MTP_PROPOSE:
    case LOCKSTEP__CMD_TYPE__EP_CMD_DFLASH_PROPOSE:
      return cmd->payload_case == LOCKSTEP__COMMAND__PAYLOAD_PROPOSE;
    case LOCKSTEP__CMD_TYPE__EP_CMD_SET_LEVERS:
      return cmd->payload_case == LOCKSTEP__COMMAND__PAYLOAD_LEVERS;
    case LOCKSTEP__CMD_TYPE__EP_CMD_HEARTBEAT:
    case LOCKSTEP__CMD_TYPE__EP_CMD_SHUTDOWN:
    case LOCKSTEP__CMD_TYPE__EP_CMD_CLEAR_CACHE:
      return cmd->payload_case == LOCKSTEP__COMMAND__PAYLOAD__NOT_SET;
    default:
      return 0;
  }
}

int lks_cmd_encode(const Lockstep__Command *cmd, uint8_t **buf, size_t *len) {
  size_t n = lockstep__command__get_packed_size(cmd);
  *buf = malloc(n ? n : 1);
  if (!*buf) return lks_set_error(LKS_ENOMEM, "out of memory");
  lockstep__command__pack(cmd, *buf);
  *len = n;
  return 0;
}

int lks_cmd_decode(const void *buf, size_t len, uint64_t expected_step, Lockstep__Command **out) {
  *out = NULL;
  Lockstep__Command *cmd = lockstep__command__unpack(NULL, len, buf);
  if (!cmd)
    return lks_set_error(LKS_EFORMAT, "a command after step %llu does not decode (%zu bytes)",
                         (unsigned long long)expected_step - 1, len);
  int rc = 0;
  if (cmd->protocol_version != LKS_PROTOCOL_VERSION)
    rc = lks_set_error(LKS_EFORMAT, "command with protocol version %u (this build speaks %d)",
                       cmd->protocol_version, LKS_PROTOCOL_VERSION);
  else if (cmd->step_id != expected_step)
    rc = lks_set_error(LKS_EFORMAT, "command step %llu out of order (expected %llu)",
                       (unsigned long long)cmd->step_id, (unsigned long long)expected_step);
  else if (!lks_cmd_payload_matches(cmd))
    rc = lks_set_error(LKS_EFORMAT, "command type %d at step %llu has the wrong payload", cmd->type,
                       (unsigned long long)cmd->step_id);
  if (rc < 0) {
    lockstep__command__free_unpacked(cmd, NULL);
    return rc;
  }
  *out = cmd;
  return 0;
}

int lks_ack_encode(const Lockstep__Ack *a, uint8_t **buf, size_t *len) {
  size_t n = lockstep__ack__get_packed_size(a);
  *buf = malloc(n ? n : 1);
  if (!*buf) return lks_set_error(LKS_ENOMEM, "out of memory");
  lockstep__ack__pack(a, *buf);
  *len = n;
  return 0;
}

Lockstep__Ack *lks_ack_decode(const void *buf, size_t len) {
  return lockstep__ack__unpack(NULL, len, buf);
}
