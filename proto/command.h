// SPDX-License-Identifier: MIT
// The command set's thin helpers: the one place besides lockstep.proto that knows the wire
// format. Encoding stamps nothing (the control plane stamps version and step); decoding checks
// the protocol version, the step order and that the payload matches the command type, so that a
// malformed or out-of-order frame is an error, never a command.
#ifndef LKS_PROTO_COMMAND_H
#define LKS_PROTO_COMMAND_H

#include <stddef.h>
#include <stdint.h>

#include "proto/lockstep.pb-c.h"

// 3: SlotTokens.defer_mtp (the MTP drafter's lazy catch-up); 4: EP_CMD_DFLASH_PROPOSE.
#define LKS_PROTOCOL_VERSION 4

// The most drafts one propose or verify may carry (a protocol limit every rank agrees on).
#define LKS_MAX_DRAFTS 16
// The most target hidden rows a slot keeps for its MTP drafter: the rows of a verify, and those
// of the plain steps whose catch-up waits (SlotTokens.defer_mtp). Every slot holds this many
// rows of hidden_size floats from the start (16 MB a slot for GLM-4.5-Air's 4096), so that no
// step grows them. The more rows wait, the more of a sequence that decodes plainly to its end
// never pays its drafter: 256 rows cost the policy about 1 % of plain decoding on the default
// model (world 2, three alternated pairs of 15-repeat benches: x0.978 / 0.986 / 0.985 of plain
// at 256, x1.006 / 0.979 / 0.997 at 1024).
#define LKS_MTP_BACKLOG 1024

// Packs cmd into a malloc'd buffer (*buf, *len; the caller frees). 0 or LKS_ENOMEM.
int lks_cmd_encode(const Lockstep__Command *cmd, uint8_t **buf, size_t *len);
// Decodes one frame into a command and checks it: protocol version, step id == expected_step,
// a payload that matches the type. The caller frees *cmd (lockstep__command__free_unpacked).
int lks_cmd_decode(const void *buf, size_t len, uint64_t expected_step, Lockstep__Command **cmd);
// True when the command's payload is the one its type needs.
int lks_cmd_payload_matches(const Lockstep__Command *cmd);

// Acks: packed into a malloc'd buffer; decoded (NULL when the frame does not decode; the caller
// frees with lockstep__ack__free_unpacked).
int lks_ack_encode(const Lockstep__Ack *a, uint8_t **buf, size_t *len);
Lockstep__Ack *lks_ack_decode(const void *buf, size_t len);

#endif
