// SPDX-License-Identifier: MIT
// `lockstep generate`: one sequence, prefill the prompt in one forward, then decode one token per
// forward, printing each token as soon as it is chosen. Stops after -n tokens or at an eos id
// of the model (unless --ignore-eos). The prompt and the printing (ids, or text for --prompt /
// --chat) are cli/text.c's.
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/text.h"
#include "core/error.h"
#include "core/log.h"
#include "model/sample.h"

int lks_cmd_generate(lks_settings *s) {
  lks_backend *be;
  lks_model *m;
  if (lks_cli_open(s, &be, &m) < 0) return 1;
  const lks_config *c = lks_model_config(m);
  int rc = 1, n_prompt = 0;
  int32_t *prompt = NULL, *pos = NULL, *seq = NULL;
  float *logits_host = NULL;
  lks_kv_cache *kv = NULL;
  lks_cli_text *text = NULL;  // --prompt / --chat: the tokenizer and the text printer
  if ((rc = lks_cli_prompt(s, c, &text, &prompt, &n_prompt)) != 0) goto done;
  rc = 1;
  int n_gen = (int)lks_settings_int(s, "n");
  int max_len = (int)lks_settings_int(s, "max-seq-len"), bs = (int)lks_settings_int(s, "kv-block");
  if (n_prompt + n_gen > max_len) {
    fprintf(stderr, "lockstep generate: %d prompt + %d new tokens exceed --max-seq-len %d\n",
            n_prompt, n_gen, max_len);
    rc = 2;
    goto done;
  }
  kv = lks_model_kv_new(m, false, bs, (max_len + bs - 1) / bs, 1, max_len);
  pos = malloc((size_t)n_prompt * sizeof *pos);
  seq = calloc((size_t)n_prompt, sizeof *seq);
  logits_host = malloc((size_t)c->vocab * sizeof *logits_host);
  if (!kv || !pos || !seq || !logits_host) {
    fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
    goto done;
  }
  int sid = lks_kv_seq_alloc(kv);
  for (int i = 0; i < n_prompt; i++) pos[i] = i;
  lks_sampling sp = {(float)lks_settings_float(s, "temperature"), (int)lks_settings_int(s, "top-k"),
                     (float)lks_settings_float(s, "top-p")};
  lks_rng rng;
  lks_rng_seed(&rng, (uint64_t)lks_settings_int(s, "seed"));
  bool ignore_eos = lks_settings_bool(s, "ignore-eos");
  double t0 = lks_now(), t_prefill = 0;
  int32_t last = n_prompt - 1, tok_pos = 0;
  lks_batch b = {.n = n_prompt, .tokens = prompt, .pos = pos, .seq = seq, .n_out = 1, .out_rows = &last};
  int produced = 0;
  if (lks_kv_seq_resize(kv, sid, n_prompt) < 0) goto fail;
  for (;;) {
    lks_tensor logits;
    if (lks_model_forward(m, kv, &b, &logits, NULL) < 0) goto fail;
    if (lks_tensor_to_host_f32(be, logits_host, logits) < 0) goto fail;
    if (produced == 0) t_prefill = lks_now() - t0;
    if (produced == n_gen) break;
    int tok = lks_sample(logits_host, c->vocab, &sp, &rng);
    if (tok < 0) goto fail;
    bool eos = false;
    for (int i = 0; i < c->n_eos; i++) eos |= tok == c->eos[i];
    if (lks_cli_print_token(text, tok, produced, eos && !ignore_eos) < 0) goto fail;
    produced++;
    if ((eos && !ignore_eos) || produced == n_gen) break;
    // Decode: the new token at the next position.
    prompt[0] = tok;
    tok_pos = n_prompt + produced - 1;
    pos[0] = tok_pos;
    last = 0;
    b = (lks_batch){.n = 1, .tokens = prompt, .pos = pos, .seq = seq, .n_out = 1, .out_rows = &last};
    if (lks_kv_seq_resize(kv, sid, tok_pos + 1) < 0) goto fail;
  }
  if (lks_cli_print_end(text) < 0) goto fail;
  double total = lks_now() - t0;
  LKS_LOG(LKS_LOG_INFO, "prefill %d tokens in %.3f s (%.1f tok/s); decode %d tokens in %.3f s (%.2f tok/s)",
          n_prompt, t_prefill, n_prompt / t_prefill, produced > 1 ? produced - 1 : 0,
          total - t_prefill, produced > 1 ? (produced - 1) / (total - t_prefill) : 0.0);
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
done:
  lks_cli_text_free(text);
  lks_kv_free(kv);
  free(prompt);
  free(pos);
  free(seq);
  free(logits_host);
  lks_model_free(m);
  lks_backend_free(be);
  return rc;
}
