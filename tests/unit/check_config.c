// SPDX-License-Identifier: MIT
// config.json parsing: a real GLM-4.5-Air config is read field by field; unknown architectures,
// missing required fields, wrong types and inconsistent sizes are refused with a message naming
// the field.
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/config.h"

// GLM-4.5-Air's published config.json (sizes as in MODEL.md section 2).
static const char *air =
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"attention_bias\": true, \"attention_dropout\": 0.0,"
    " \"pad_token_id\": 151329, \"eos_token_id\": [151329, 151336, 151338], \"head_dim\": 128,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"partial_rotary_factor\": 0.5,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 10944, \"max_position_embeddings\": 131072,"
    " \"model_type\": \"glm4_moe\", \"moe_intermediate_size\": 1408, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 96, \"n_group\": 1, \"topk_group\": 1, \"n_routed_experts\": 128,"
    " \"n_shared_experts\": 1, \"routed_scaling_factor\": 1.0, \"num_experts_per_tok\": 8,"
    " \"first_k_dense_replace\": 1, \"num_hidden_layers\": 46, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-05, \"rope_scaling\": null, \"rope_theta\": 1000000,"
    " \"num_nextn_predict_layers\": 1, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.54.0\", \"use_cache\": true, \"use_qk_norm\": false,"
    " \"vocab_size\": 151552}";

START_TEST(glm45_air) {
  lks_config c;
  ck_assert_msg(lks_config_parse(air, "air", &c) == 0, "%s", lks_last_error());
  ck_assert_int_eq(c.hidden, 4096);
  ck_assert_int_eq(c.n_layers, 46);
  ck_assert_int_eq(c.n_heads, 96);
  ck_assert_int_eq(c.n_kv_heads, 8);
  ck_assert_int_eq(c.head_dim, 128);
  ck_assert_int_eq(c.rot_dims, 64);
  ck_assert_float_eq(c.rope_theta, 1e6f);
  ck_assert(!c.qk_norm);
  ck_assert(c.attn_bias);
  ck_assert_int_eq(c.first_dense, 1);
  ck_assert_int_eq(c.n_experts, 128);
  ck_assert_int_eq(c.n_shared, 1);
  ck_assert_int_eq(c.top_k, 8);
  ck_assert_int_eq(c.moe_inter, 1408);
  ck_assert_int_eq(c.inter, 10944);
  ck_assert_float_eq(c.routed_scaling, 1.0f);
  ck_assert_int_eq(c.n_group, 1);
  ck_assert(c.norm_topk_prob);
  ck_assert_int_eq(c.vocab, 151552);
  ck_assert_int_eq(c.n_mtp, 1);
  ck_assert_int_eq(c.n_eos, 3);
  ck_assert_int_eq(c.eos[2], 151338);
}
END_TEST

// Parses `air` with `from` replaced by `to`; must fail with a message containing `want`.
static void refused(const char *from, const char *to, const char *want) {
  const char *at = strstr(air, from);
  ck_assert_msg(at != NULL, "test bug: '%s' not in the config", from);
  char buf[4096];
  snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - air), air, to, at + strlen(from));
  lks_config c;
  lks_clear_error();
  ck_assert_msg(lks_config_parse(buf, "config.json", &c) < 0, "accepted with %s", to);
  ck_assert_msg(strstr(lks_last_error(), want) != NULL, "message '%s' lacks '%s'", lks_last_error(),
                want);
}

START_TEST(refusals) {
  refused("\"model_type\": \"glm4_moe\"", "\"model_type\": \"llama\"", "unsupported architecture");
  refused("\"Glm4MoeForCausalLM\"", "\"GlmMoeDsaForCausalLM\"", "unsupported architecture");
  refused("\"hidden_size\": 4096,", "", "'hidden_size' is missing");
  refused("\"n_routed_experts\": 128,", "", "'n_routed_experts' is missing");
  refused("\"rope_theta\": 1000000,", "", "'rope_theta' is missing");
  refused("\"num_attention_heads\": 96", "\"num_attention_heads\": \"96\"", "'num_attention_heads' must be an integer");
  refused("\"use_qk_norm\": false", "\"use_qk_norm\": 0", "'use_qk_norm' must be true or false");
  refused("\"num_attention_heads\": 96", "\"num_attention_heads\": 92", "not a multiple of num_key_value_heads");
  refused("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 200", "exceeds n_routed_experts");
  refused("\"n_group\": 1", "\"n_group\": 3", "n_group 3");
  refused("\"vocab_size\": 151552", "\"vocab_size\": 0", "'vocab_size' must be positive");
  refused("\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 1.5", "rotary dims");
  refused("\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 47", "first_k_dense_replace 47");
  refused("\"eos_token_id\": [151329, 151336, 151338]", "\"eos_token_id\": [\"x\"]", "'eos_token_id'[0]");
  refused("{\"architectures\"", "[{\"architectures\"", "not valid JSON");
}
END_TEST

// GLM-5's config.json (sizes as in MODEL.md section 4), with GLM-5.2's indexer fields.
static const char *glm5 =
    "{\"architectures\": [\"GlmMoeDsaForCausalLM\"], \"model_type\": \"glm_moe_dsa\","
    " \"attention_bias\": false, \"eos_token_id\": [154820, 154827, 154829], \"hidden_size\": 6144,"
    " \"intermediate_size\": 12288, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 78,"
    " \"num_attention_heads\": 64, \"num_key_value_heads\": 64, \"n_shared_experts\": 1,"
    " \"n_routed_experts\": 256, \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512,"
    " \"q_lora_rank\": 2048, \"qk_rope_head_dim\": 64, \"v_head_dim\": 256, \"qk_nope_head_dim\": 192,"
    " \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 3,"
    " \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-05, \"vocab_size\": 154880, \"head_dim\": 64,"
    " \"index_topk\": 2048, \"index_head_dim\": 128, \"index_n_heads\": 32, \"index_topk_freq\": 4,"
    " \"index_skip_topk_offset\": 3, \"num_nextn_predict_layers\": 1, \"tie_word_embeddings\": false,"
    " \"rope_parameters\": {\"rope_theta\": 8000000, \"rope_type\": \"default\"},"
    " \"max_position_embeddings\": 202752}";

static void refused5(const char *from, const char *to, const char *want) {
  const char *at = strstr(glm5, from);
  ck_assert_msg(at != NULL, "test bug: '%s' not in the config", from);
  char buf[4096];
  snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - glm5), glm5, to, at + strlen(from));
  lks_config c;
  lks_clear_error();
  ck_assert_msg(lks_config_parse(buf, "config.json", &c) < 0, "accepted with %s", to);
  ck_assert_msg(strstr(lks_last_error(), want) != NULL, "message '%s' lacks '%s'", lks_last_error(),
                want);
}

START_TEST(glm5_dsa) {
  lks_config c;
  ck_assert_msg(lks_config_parse(glm5, "glm5", &c) == 0, "%s", lks_last_error());
  ck_assert_int_eq(c.arch, LKS_ARCH_GLM_MOE_DSA);
  ck_assert_int_eq(c.mla.q_lora, 2048);
  ck_assert_int_eq(c.mla.kv_lora, 512);
  ck_assert_int_eq(c.head_dim, 256);  // qk_nope + qk_rope, not the file's head_dim
  ck_assert_int_eq(c.rot_dims, 64);
  ck_assert_int_eq(c.mla.v_head, 256);
  ck_assert_int_eq(c.mla.index_heads, 32);
  ck_assert_int_eq(c.mla.index_topk, 2048);
  ck_assert_float_eq(c.rope_theta, 8e6f);
  ck_assert(!c.mla.rope_half_split && !c.mla.index_rope_half_split);
  // freq 4, offset 3: full iff max(i - 2, 0) % 4 == 0: layers 0, 1, 2, 6, 10, ...; MTP full.
  const char *want = "FFFSSSFSSSF";
  for (int i = 0; want[i]; i++) ck_assert_int_eq(c.mla.index_full[i], want[i] == 'F');
  ck_assert(c.mla.index_full[78]);
  refused5("\"attention_bias\": false", "\"attention_bias\": true", "attention_bias");
  refused5("\"q_lora_rank\": 2048", "\"q_lora_rank\": null", "q_lora_rank");
  refused5("\"kv_lora_rank\": 512,", "", "kv_lora_rank");
  refused5("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", "rope_type");
  refused5("\"index_topk_freq\": 4", "\"index_topk_pattern\": \"FS\"", "index_topk_pattern");
  refused5("\"index_skip_topk_offset\": 3,", "\"indexer_types\": [\"shared\"],", "indexer_types");
  refused5("\"qk_rope_head_dim\": 64", "\"qk_rope_head_dim\": 63", "qk_rope_head_dim");
}
END_TEST

START_TEST(defaults) {
  // Fields with Hugging Face defaults may be absent.
  char buf[4096];
  const char *at = strstr(air, " \"use_qk_norm\": false,");
  snprintf(buf, sizeof buf, "%.*s%s", (int)(at - air), air, at + strlen(" \"use_qk_norm\": false,"));
  lks_config c;
  ck_assert_msg(lks_config_parse(buf, "config.json", &c) == 0, "%s", lks_last_error());
  ck_assert(!c.qk_norm);
}
END_TEST

int main(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("parse");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, glm45_air);
  tcase_add_test(tc, refusals);
  tcase_add_test(tc, defaults);
  tcase_add_test(tc, glm5_dsa);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
