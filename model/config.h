// SPDX-License-Identifier: MIT
// The model configuration read from a checkpoint's config.json (MODEL.md sections 2 and 4).
// `glm4_moe` (Glm4MoeForCausalLM) and `glm_moe_dsa` (GlmMoeDsaForCausalLM) are accepted; every size is read from the file, none assumed.
// Fields that Hugging Face's Glm4MoeConfig gives a default are taken with that default and a log
// line; the sizes that define the model are required, and a missing or ill-typed one is refused
// with a message naming it.
#ifndef LKS_CONFIG_H
#define LKS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#define LKS_MAX_EOS 8
#define LKS_MAX_LAYERS 1024  // glm_moe_dsa: the per-layer indexer table's size

typedef enum { LKS_ARCH_GLM4_MOE, LKS_ARCH_GLM_MOE_DSA } lks_arch;

// glm_moe_dsa (GLM-5): multi-head latent attention with the DSA lightning indexer (MODEL.md
// section 4). head_dim / rot_dims of lks_config are qk_nope + qk_rope / qk_rope there.
typedef struct lks_mla_config {
  int q_lora, kv_lora;            // q_lora_rank, kv_lora_rank
  int qk_nope, qk_rope, v_head;   // qk_nope_head_dim, qk_rope_head_dim, v_head_dim
  int index_heads, index_dim;     // index_n_heads, index_head_dim
  int index_topk;
  // RoPE layouts: interleaved pairs (2i, 2i+1) unless the config says rope_interleave /
  // indexer_rope_interleave false (serving engines read these; transformers always interleaves).
  bool rope_half_split, index_rope_half_split;
  bool index_full[LKS_MAX_LAYERS + 1];  // per layer (MTP layer last): runs its own indexer
} lks_mla_config;

typedef struct lks_config {
  char architecture[64];
  lks_arch arch;
  int hidden;            // hidden_size
  int n_layers;          // num_hidden_layers (the MTP layers are not counted)
  int n_heads, n_kv_heads, head_dim;
  float partial_rotary;  // partial_rotary_factor
  int rot_dims;          // head_dim * partial_rotary_factor
  float rope_theta;
  bool qk_norm, attn_bias;
  int first_dense;       // first_k_dense_replace
  int n_experts, n_shared, top_k;
  int moe_inter, inter;  // moe_intermediate_size, intermediate_size
  float routed_scaling;
  int n_group, topk_group;
  bool norm_topk_prob;
  float eps;
  int vocab;
  int n_mtp;             // num_nextn_predict_layers
  bool tie_embeddings;
  int max_pos;           // max_position_embeddings
  int n_eos;
  int32_t eos[LKS_MAX_EOS];
  lks_mla_config mla;    // arch == LKS_ARCH_GLM_MOE_DSA only
} lks_config;

// Reads DIR/config.json (and the eos ids of DIR/generation_config.json when present).
// Returns 0 or a negative code with lks_last_error() naming the field.
int lks_config_load(const char *dir, lks_config *cfg);
// Parses config.json text; `what` names it in messages.
int lks_config_parse(const char *json_text, const char *what, lks_config *cfg);
// Checks the relations between fields (heads divisible by KV heads, top-k <= experts, ...).
int lks_config_validate(const lks_config *cfg, const char *what);

#endif
