// SPDX-License-Identifier: MIT
// `lockstep inspect DIR`: what a checkpoint is (architecture, sizes), what it costs per token
// (parameters, bytes read per decoded token), and every problem with its files. Exit status 1
// when there is any problem.
#include <stdio.h>

#include "cli/cli.h"
#include "core/error.h"

typedef struct {
  int n;
} problems;

static void report(void *ctx, const char *msg) {
  problems *p = ctx;
  if (p->n++ == 0) printf("problems:\n");
  printf("  - %s\n", msg);
}

static void human(double bytes, char *out, size_t n) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    u++;
  }
  snprintf(out, n, "%.2f %s", bytes, unit[u]);
}

int lks_cmd_inspect(lks_settings *s, const char *dir) {
  lks_dtype kvd;  // the KV figures are for --kv-dtype
  lks_experts_split split;  // the split figures are for --experts-split
  if (lks_model_kv_dtype_parse(lks_settings_str(s, "kv-dtype"), &kvd) < 0 ||
      lks_model_experts_split_parse(lks_settings_str(s, "experts-split"), &split) < 0) {
    fprintf(stderr, "lockstep inspect: %s\n", lks_last_error());
    return 2;
  }
  lks_backend *be = lks_backend_new("cpu", 1);
  if (!be) {
    fprintf(stderr, "lockstep inspect: %s\n", lks_last_error());
    return 1;
  }
  lks_backend_cpu_host_weights(be, LKS_HOST_IN_PLACE);  // nothing read but what it checks
  problems p = {0};
  printf("model: %s\n", dir);
  lks_config c;
  if (lks_config_load(dir, &c) == 0) {
    bool dsa = c.arch == LKS_ARCH_GLM_MOE_DSA;
    printf("architecture: %s (%s)\n", c.architecture, dsa ? "glm_moe_dsa" : "glm4_moe");
    if (dsa) {
      const lks_mla_config *k = &c.mla;
      int full = 0;
      for (int l = 0; l < c.n_layers; l++) full += k->index_full[l];
      printf("  hidden %d, layers %d (+%d MTP), heads %d; MLA: q_lora %d, kv_lora %d, qk nope %d + rope %d, v %d\n",
             c.hidden, c.n_layers, c.n_mtp, c.n_heads, k->q_lora, k->kv_lora, k->qk_nope,
             k->qk_rope, k->v_head);
      printf("  rope: %d dims (%s), theta %g; DSA indexer %d heads x %d, top-%d; %d full / %d shared indexer layers\n",
             k->qk_rope, k->rope_half_split ? "half-split" : "interleaved pairs", c.rope_theta,
             k->index_heads, k->index_dim, k->index_topk, full, c.n_layers - full);
    } else {
      printf("  hidden %d, layers %d (+%d MTP), heads %d / kv heads %d / head_dim %d\n", c.hidden,
             c.n_layers, c.n_mtp, c.n_heads, c.n_kv_heads, c.head_dim);
      printf("  rope: %d of %d dims rotate (half-split), theta %g; qk-norm %s, attention bias %s\n",
             c.rot_dims, c.head_dim, c.rope_theta, c.qk_norm ? "on" : "off", c.attn_bias ? "on" : "off");
    }
    printf("  ffn: %d dense layer(s) of %d; MoE %d routed experts of %d, top-%d, %d shared, scale %g, groups %d/%d, norm_topk %s\n",
           c.first_dense, c.inter, c.n_experts, c.moe_inter, c.top_k, c.n_shared, c.routed_scaling,
           c.topk_group, c.n_group, c.norm_topk_prob ? "on" : "off");
    printf("  vocab %d, rms eps %g, eos", c.vocab, c.eps);
    for (int i = 0; i < c.n_eos; i++) printf(" %d", c.eos[i]);
    printf("\n");
  }
  lks_model *m = lks_model_load(dir, be, report, &p);
  if (m) lks_model_set_kv_dtype(m, kvd);
  if (m) {
    lks_model_stats st;
    lks_model_stats_get(m, &st);
    char b1[32], b2[32], b3[32], b4[32];
    human((double)st.weight_bytes, b1, sizeof b1);
    human((double)st.bytes_per_token, b2, sizeof b2);
    human((double)st.bytes_mtp_step, b3, sizeof b3);
    human((double)st.kv_bytes_per_pos, b4, sizeof b4);
    printf("parameters: %.3f M total (%.3f M in the MTP layer), %.3f M active per token\n",
           st.params_total / 1e6, st.params_mtp / 1e6, st.params_active / 1e6);
    printf("weights: %s on disk as loaded\n", b1);
    printf("bytes read per decoded token: %s of weights (+ %s of KV cache per context position)\n",
           b2, b4);
    if (st.bytes_mtp_step) printf("bytes read per MTP draft step: %s\n", b3);
    printf("quantization: %s\n  bytes per decoded token by format:", st.quant);
    for (int f = 0; f < LKS_N_WFMT; f++)
      if (st.bytes_per_token_fmt[f]) {
        human((double)st.bytes_per_token_fmt[f], b1, sizeof b1);
        printf(" %s %s (%.1f%%);", lks_wfmt_names[f], b1,
               100.0 * (double)st.bytes_per_token_fmt[f] / (double)st.bytes_per_token);
      }
    printf("\n  weights by group:");
    for (int g = 0; g < LKS_N_WG; g++) {
      if (!st.group_fmts[g]) continue;
      printf(" %s ", lks_wgroup_names[g]);
      for (int f = 0, k = 0; f < LKS_N_WFMT; f++)
        if (st.group_fmts[g] >> f & 1) printf("%s%s", k++ ? "+" : "", lks_wfmt_names[f]);
      printf(";");
    }
    printf("\n");
    int world = (int)lks_settings_int(s, "world");
    if (world > 1) {
      // Each rank's shard, loaded here one after the other for the accounting (no collective
      // runs: a shard's loading reads only rank and world).
      printf("split over %d ranks:\n", world);
      for (int r = 0; r < world && p.n == 0; r++) {
        lks_comm *c = lks_comm_local_new();
        c->rank = r;
        c->world = world;
        lks_model *sm = lks_model_load_shard(dir, be, c, split, report, &p);
        if (sm) lks_model_set_kv_dtype(sm, kvd);
        if (sm) {
          lks_model_stats ss;
          lks_model_stats_get(sm, &ss);
          human((double)lks_model_loaded_bytes(sm), b1, sizeof b1);
          human((double)ss.bytes_per_token, b2, sizeof b2);
          human((double)ss.kv_bytes_per_pos, b4, sizeof b4);
          printf("  rank %d: loads and holds %s; reads %s per decoded token (+ %s of KV cache per context position)\n",
                 r, b1, b2, b4);
        }
        lks_model_free(sm);
        lks_comm_free(c);
      }
    }
    if (p.n == 0) printf("status: ok\n");
  } else if (p.n == 0) {
    report(&p, lks_last_error());
  }
  lks_model_free(m);
  lks_backend_free(be);
  return p.n ? 1 : 0;
}
