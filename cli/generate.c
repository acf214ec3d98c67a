// SPDX-License-Identifier: MIT
// `lockstep generate`: one sequence. Under mpirun every rank runs this command line: rank 0
// drives (prefill the prompt in one command, then one decode command per token, printing each
// token as soon as it is chosen), the other ranks execute the same commands on their shards.
// Stops after -n tokens or at an eos id of the model (unless --ignore-eos). The prompt and the
// printing (ids, or text for --prompt / --chat) are cli/text.c's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/text.h"
#include "coordinator/world.h"
#include "core/error.h"
#include "core/log.h"
#include "model/sample.h"
#include "spec/spec.h"

typedef struct {
  lks_cli_text *text;
  int index;
} printer;

static int print_token(void *ctx, int32_t tok, bool eos, bool *stop) {
  (void)stop;
  printer *p = ctx;
  return lks_cli_print_token(p->text, tok, p->index++, eos);
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
  lks_proposer *proposer = NULL;
  if ((rc = lks_cli_prompt(s, c, &text, &prompt, &n_prompt)) != 0) goto done;
  rc = 1;
  int n_gen = (int)lks_settings_int(s, "n"), max_len = (int)lks_settings_int(s, "max-seq-len");
  if (n_prompt + n_gen > max_len) {
    fprintf(stderr, "lockstep generate: %d prompt + %d new tokens exceed --max-seq-len %d\n",
            n_prompt, n_gen, max_len);
    rc = 2;
    goto done;
  }
  lks_spec_opts o = {0};
  o.sampling = (lks_sampling){(float)lks_settings_float(s, "temperature"),
                              (int)lks_settings_int(s, "top-k"), (float)lks_settings_float(s, "top-p")};
  lks_rng rng;
  lks_rng_seed(&rng, (uint64_t)lks_settings_int(s, "seed"));
  o.rng = &rng;
  o.ignore_eos = lks_settings_bool(s, "ignore-eos");
  o.k_max = (int)lks_settings_int(s, "num-drafts");
  o.gate = lks_settings_bool(s, "spec-gate");
  if (lks_ladder_parse(lks_settings_str(s, "ladder"), &o.ladder) < 0) {
    fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
    rc = 2;
    goto done;
  }
  const char *spec = lks_settings_str(s, "spec");
  if (strcmp(spec, "off") != 0 && !(proposer = lks_proposer_new(spec, w))) {
    fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
    rc = 2;
    goto done;
  }
  o.proposer = proposer;
  printer pr = {text, 0};
  o.emit = print_token;
  o.emit_ctx = &pr;
  lks_spec_stats st;
  double t0 = lks_now();
  if (lks_spec_generate(w, prompt, n_prompt, n_gen, &o, &st) < 0) goto fail;
  if (lks_cli_print_end(text) < 0) goto fail;
  double total = lks_now() - t0;
  LKS_LOG(LKS_LOG_INFO, "%d prompt tokens, %llu generated in %.3f s (%.2f tokens/s, %llu target forwards)",
          n_prompt, (unsigned long long)st.emitted, total, st.emitted / total,
          (unsigned long long)st.target_forwards);
  if (proposer) lks_spec_stats_print(&st, spec);
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
  rc = 1;
done:
  lks_proposer_free(proposer);
  lks_cli_text_free(text);
  free(prompt);
  lks_world_stop(w);
  return rc;
}
