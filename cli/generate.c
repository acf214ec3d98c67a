// SPDX-License-Identifier: MIT
// `lockstep generate`: one sequence. Under mpirun every rank runs this command line: rank 0
// drives (prefill the prompt in one command, then one decode command per token, printing each
// token as soon as it is chosen), the other ranks execute the same commands on their shards.
// Stops after -n tokens or at an eos id of the model (unless --ignore-eos). The prompt and the
// printing (ids, or text for --prompt / --chat) are cli/text.c's.
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/text.h"
#include "coordinator/world.h"
#include "core/error.h"
#include "core/log.h"
#include "model/sample.h"

// Runs one forward of `n` tokens of slot 0 from position `start`; sets *next to the greedy or
// sampled token of the last row.
static int step(lks_world *w, Lockstep__CmdType type, int32_t *tokens, int n, int start,
                const lks_sampling *sp, lks_rng *rng, int32_t *next) {
  Lockstep__SlotTokens st = LOCKSTEP__SLOT_TOKENS__INIT;
  Lockstep__SlotTokens *seqs[1] = {&st};
  st.slot = 0;
  st.start_pos = (uint32_t)start;
  st.tokens = tokens;
  st.n_tokens = (size_t)n;
  st.want_last = true;
  Lockstep__Forward f = LOCKSTEP__FORWARD__INIT;
  f.seqs = seqs;
  f.n_seqs = 1;
  f.output = sp->temperature > 0 ? LOCKSTEP__OUTPUT_MODE__OUT_LOGITS : LOCKSTEP__OUTPUT_MODE__OUT_GREEDY;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = type;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_FORWARD;
  cmd.forward = &f;
  lks_engine_out out;
  LKS_TRY(lks_world_submit(w, &cmd, &out));
  if (sp->temperature <= 0) {
    *next = out.tokens[0];
    return 0;
  }
  int tok = lks_sample(out.logits, lks_model_config(w->model)->vocab, sp, rng);
  if (tok < 0) return tok;
  *next = tok;
  return 0;
}

static int slot_cmd(lks_world *w, Lockstep__CmdType type, int max_len) {
  uint32_t slot = 0;
  Lockstep__SlotList sl = LOCKSTEP__SLOT_LIST__INIT;
  sl.slots = &slot;
  sl.n_slots = 1;
  sl.token_budget = (uint32_t)max_len;
  Lockstep__Command cmd = LOCKSTEP__COMMAND__INIT;
  cmd.type = type;
  cmd.payload_case = LOCKSTEP__COMMAND__PAYLOAD_SLOTS;
  cmd.slots = &sl;
  return lks_world_submit(w, &cmd, NULL);
}

int lks_cmd_generate(lks_settings *s) {
  lks_world *w = lks_world_start(s, lks_cli_model_dir(s), 1);
  if (!w) {
    fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
    return 1;
  }
  if (w->rank != 0) return lks_cli_worker(w);
  const lks_config *c = lks_model_config(w->model);
  int rc = 1, n_prompt = 0;
  int32_t *prompt = NULL;
  lks_cli_text *text = NULL;  // --prompt / --chat: the tokenizer and the text printer
  if ((rc = lks_cli_prompt(s, c, &text, &prompt, &n_prompt)) != 0) goto done;
  rc = 1;
  int n_gen = (int)lks_settings_int(s, "n"), max_len = (int)lks_settings_int(s, "max-seq-len");
  if (n_prompt + n_gen > max_len) {
    fprintf(stderr, "lockstep generate: %d prompt + %d new tokens exceed --max-seq-len %d\n",
            n_prompt, n_gen, max_len);
    rc = 2;
    goto done;
  }
  lks_sampling sp = {(float)lks_settings_float(s, "temperature"), (int)lks_settings_int(s, "top-k"),
                     (float)lks_settings_float(s, "top-p")};
  lks_rng rng;
  lks_rng_seed(&rng, (uint64_t)lks_settings_int(s, "seed"));
  bool ignore_eos = lks_settings_bool(s, "ignore-eos");
  if (slot_cmd(w, LOCKSTEP__CMD_TYPE__EP_CMD_ALLOC_SLOT, n_prompt + n_gen) < 0) goto fail;
  double t0 = lks_now();
  int32_t tok;
  if (n_gen > 0 && step(w, LOCKSTEP__CMD_TYPE__EP_CMD_PREFILL, prompt, n_prompt, 0, &sp, &rng, &tok) < 0)
    goto fail;
  double t_prefill = lks_now() - t0;
  int produced = 0;
  while (produced < n_gen) {
    bool eos = false;
    for (int i = 0; i < c->n_eos; i++) eos |= tok == c->eos[i];
    if (lks_cli_print_token(text, tok, produced, eos && !ignore_eos) < 0) goto fail;
    produced++;
    if ((eos && !ignore_eos) || produced == n_gen) break;
    int32_t in = tok;
    if (step(w, LOCKSTEP__CMD_TYPE__EP_CMD_DECODE, &in, 1, n_prompt + produced - 1, &sp, &rng, &tok) < 0)
      goto fail;
  }
  if (lks_cli_print_end(text) < 0) goto fail;
  if (slot_cmd(w, LOCKSTEP__CMD_TYPE__EP_CMD_FREE_SLOT, 0) < 0) goto fail;
  double total = lks_now() - t0;
  LKS_LOG(LKS_LOG_INFO, "prefill %d tokens in %.3f s (%.1f tok/s); decode %d tokens in %.3f s (%.2f tok/s)",
          n_prompt, t_prefill, n_prompt / t_prefill, produced > 1 ? produced - 1 : 0,
          total - t_prefill, produced > 1 ? (produced - 1) / (total - t_prefill) : 0.0);
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
  rc = 1;
done:
  lks_cli_text_free(text);
  free(prompt);
  lks_world_stop(w);
  return rc;
}
