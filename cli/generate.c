// SPDX-License-Identifier: MIT
// `lockstep generate`: one sequence, as one request to the scheduler (the decoding loop `serve`
// runs). Under mpirun every rank runs this command line: rank 0 drives (the prompt prefilled in
// one step, then one step per token or speculative round, printing each token as soon as it is
// chosen), the other ranks execute the same commands on their shards.
// Stops after -n tokens or at an eos id of the model (unless --ignore-eos). The prompt and the
// printing (ids, or text for --prompt / --chat) are cli/text.c's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/text.h"
#include "coordinator/scheduler.h"
#include "core/error.h"
#include "core/log.h"

typedef struct {
  lks_cli_text *text;
  int index, rc;
} printer;

static void print_token(void *ctx, int32_t tok, bool eos) {
  printer *p = ctx;
  if (p->rc == 0) p->rc = lks_cli_print_token(p->text, tok, p->index++, eos);
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
  lks_sched *sched = NULL;
  if ((rc = lks_cli_prompt(s, c, &text, &prompt, &n_prompt)) != 0) goto done;
  rc = 1;
  int n_gen = (int)lks_settings_int(s, "n"), max_len = (int)lks_settings_int(s, "max-seq-len");
  if ((int64_t)n_prompt + n_gen > max_len) {
    fprintf(stderr, "lockstep generate: %d prompt + %d new tokens exceed --max-seq-len %d\n",
            n_prompt, n_gen, max_len);
    rc = 2;
    goto done;
  }
  // One sequence through the scheduler, the same decoding loop `serve` runs; the whole prompt
  // is prefilled in one step.
  lks_sched_opts o;
  lks_sched_opts_from(s, &o);
  o.chunk = n_prompt;
  o.max_queue = 1;
  if (!(sched = lks_sched_new(w, NULL, &o))) {
    fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
    rc = 2;
    goto done;
  }
  printer pr = {text, 0, 0};
  lks_req_params p = {0};
  p.prompt = prompt;
  p.n_prompt = n_prompt;
  prompt = NULL;  // the request owns it now
  p.max_tokens = n_gen;
  p.sampling = (lks_sampling){(float)lks_settings_float(s, "temperature"),
                              (int)lks_settings_int(s, "top-k"), (float)lks_settings_float(s, "top-p")};
  p.seed = (uint64_t)lks_settings_int(s, "seed");
  p.ignore_eos = lks_settings_bool(s, "ignore-eos");
  p.on_token = print_token;
  p.on_token_ctx = &pr;
  double t0 = lks_now();
  if (n_gen > 0 && lks_sched_run_one(sched, &p) < 0) goto fail;
  if (pr.rc < 0 || lks_cli_print_end(text) < 0) goto fail;
  double total = lks_now() - t0;
  lks_sched_stats st;
  lks_sched_stats_get(sched, &st);
  LKS_LOG(LKS_LOG_INFO, "%d prompt tokens, %llu generated in %.3f s (%.2f tokens/s, %llu target forwards)",
          n_prompt, (unsigned long long)st.spec.emitted, total, st.spec.emitted / total,
          (unsigned long long)st.spec.target_forwards);
  if (strcmp(o.spec, "off") != 0) lks_spec_stats_print(&st.spec, o.spec);
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "lockstep generate: %s\n", lks_last_error());
  rc = 1;
done:
  lks_sched_free(sched);
  lks_cli_text_free(text);
  free(prompt);
  lks_world_stop(w);
  return rc;
}
