// SPDX-License-Identifier: MIT
// config.json parsing for glm4_moe (see config.h).
#include "model/config.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

typedef struct {
  json_t *root;
  const char *what;
} src;

static int get_int(src *s, const char *key, int *out, int def, bool required) {
  json_t *v = json_object_get(s->root, key);
  if (!v) {
    if (required)
      return lks_set_error(LKS_ECONFIG, "%s: required field '%s' is missing", s->what, key);
    LKS_LOG(LKS_LOG_DEBUG, "%s: '%s' absent, using %d", s->what, key, def);
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX)
    return lks_set_error(LKS_ECONFIG, "%s: field '%s' must be an integer", s->what, key);
  *out = (int)json_integer_value(v);
  return 0;
}

static int get_float(src *s, const char *key, float *out, float def, bool required) {
  json_t *v = json_object_get(s->root, key);
  if (!v) {
    if (required)
      return lks_set_error(LKS_ECONFIG, "%s: required field '%s' is missing", s->what, key);
    *out = def;
    return 0;
  }
  if (!json_is_number(v))
    return lks_set_error(LKS_ECONFIG, "%s: field '%s' must be a number", s->what, key);
  *out = (float)json_number_value(v);
  return 0;
}

static int get_bool(src *s, const char *key, bool *out, bool def) {
  json_t *v = json_object_get(s->root, key);
  if (!v) {
    *out = def;
    return 0;
  }
  if (!json_is_boolean(v))
    return lks_set_error(LKS_ECONFIG, "%s: field '%s' must be true or false", s->what, key);
  *out = json_is_true(v);
  return 0;
}

// eos_token_id: an integer or a list of integers.
static int get_eos(json_t *root, const char *what, lks_config *cfg) {
  json_t *v = json_object_get(root, "eos_token_id");
  if (!v || json_is_null(v)) return 0;
  cfg->n_eos = 0;
  if (json_is_integer(v)) {
    cfg->eos[cfg->n_eos++] = (int32_t)json_integer_value(v);
    return 0;
  }
  if (!json_is_array(v))
    return lks_set_error(LKS_ECONFIG, "%s: 'eos_token_id' must be an integer or a list", what);
  size_t i;
  json_t *e;
  json_array_foreach(v, i, e) {
    if (!json_is_integer(e))
      return lks_set_error(LKS_ECONFIG, "%s: 'eos_token_id'[%zu] is not an integer", what, i);
    if (cfg->n_eos < LKS_MAX_EOS) cfg->eos[cfg->n_eos++] = (int32_t)json_integer_value(e);
  }
  return 0;
}

// glm_moe_dsa's attention fields (transformers' GlmMoeDsaConfig / DeepseekV32Config; MODEL.md
// section 4). The index_* sizes default as GlmMoeDsaConfig does. head_dim is qk_nope + qk_rope
// and the rope part is qk_rope of it, rotated in interleaved pairs (2i, 2i+1).
static int parse_mla(src *s, lks_config *cfg) {
  lks_mla_config *m = &cfg->mla;
  json_t *ql = json_object_get(s->root, "q_lora_rank");
  if (ql && json_is_null(ql))
    return lks_set_error(LKS_EUNSUPPORTED, "%s: q_lora_rank is null (no query compression); GLM-5 has one",
                         s->what);
  LKS_TRY(get_int(s, "q_lora_rank", &m->q_lora, 0, true));
  LKS_TRY(get_int(s, "kv_lora_rank", &m->kv_lora, 0, true));
  LKS_TRY(get_int(s, "qk_nope_head_dim", &m->qk_nope, 0, true));
  LKS_TRY(get_int(s, "qk_rope_head_dim", &m->qk_rope, 0, true));
  LKS_TRY(get_int(s, "v_head_dim", &m->v_head, 0, true));
  LKS_TRY(get_int(s, "index_n_heads", &m->index_heads, 32, false));
  LKS_TRY(get_int(s, "index_head_dim", &m->index_dim, 128, false));
  LKS_TRY(get_int(s, "index_topk", &m->index_topk, 2048, false));
  bool il = true, iil = true;
  LKS_TRY(get_bool(s, "rope_interleave", &il, true));
  LKS_TRY(get_bool(s, "indexer_rope_interleave", &iil, true));
  m->rope_half_split = !il;
  m->index_rope_half_split = !iil;
  // MLA has one latent "KV head"; num_key_value_heads (= heads in GLM-5's file) plays no part.
  cfg->n_kv_heads = cfg->n_heads;
  cfg->head_dim = m->qk_nope + m->qk_rope;
  cfg->rot_dims = m->qk_rope;
  cfg->partial_rotary = cfg->head_dim > 0 ? (float)m->qk_rope / (float)cfg->head_dim : 0;
  cfg->qk_norm = false;
  LKS_TRY(get_bool(s, "attention_bias", &cfg->attn_bias, false));
  if (cfg->attn_bias)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: attention_bias is true; GLM-5's MLA projections have no bias",
                         s->what);
  // rope_theta at the top level, or inside rope_parameters (transformers >= 5); only the default
  // rope (no YaRN, whose mscale would change the attention scale) is implemented.
  json_t *rp = json_object_get(s->root, "rope_parameters");
  json_t *rs = json_object_get(s->root, "rope_scaling");
  if (rs && !json_is_null(rs))
    return lks_set_error(LKS_EUNSUPPORTED, "%s: rope_scaling is set; only the default rope is implemented",
                         s->what);
  if (json_is_object(rp)) {
    const char *type = json_string_value(json_object_get(rp, "rope_type"));
    if (type && strcmp(type, "default") != 0)
      return lks_set_error(LKS_EUNSUPPORTED, "%s: rope_parameters.rope_type '%s'; only 'default' is implemented",
                           s->what, type);
    src sub = {rp, s->what};
    if (json_object_get(rp, "rope_theta") && !json_object_get(s->root, "rope_theta"))
      return get_float(&sub, "rope_theta", &cfg->rope_theta, 0, true);
  }
  LKS_TRY(get_float(s, "rope_theta", &cfg->rope_theta, 0, true));
  return 0;
}

// Which layers run their own indexer (transformers' GlmMoeDsaConfig.__post_init__): the list
// indexer_types, else the string index_topk_pattern of F/S, else full iff
// max(i - offset + 1, 0) % freq == 0 (index_topk_freq, default 1; index_skip_topk_offset,
// default 2). The MTP layer always has its own indexer.
static int parse_indexer_types(src *s, lks_config *cfg) {
  lks_mla_config *m = &cfg->mla;
  int L = cfg->n_layers;
  if (L < 1 || L > LKS_MAX_LAYERS)
    return lks_set_error(LKS_ECONFIG, "%s: num_hidden_layers %d outside [1, %d]", s->what, L, LKS_MAX_LAYERS);
  json_t *types = json_object_get(s->root, "indexer_types");
  json_t *pat = json_object_get(s->root, "index_topk_pattern");
  if (types && !json_is_null(types)) {
    if (!json_is_array(types) || (int)json_array_size(types) != L)
      return lks_set_error(LKS_ECONFIG, "%s: indexer_types must list num_hidden_layers (%d) entries",
                           s->what, L);
    for (int i = 0; i < L; i++) {
      const char *t = json_string_value(json_array_get(types, (size_t)i));
      if (!t || (strcmp(t, "full") && strcmp(t, "shared")))
        return lks_set_error(LKS_ECONFIG, "%s: indexer_types[%d] must be \"full\" or \"shared\"", s->what, i);
      m->index_full[i] = strcmp(t, "full") == 0;
    }
  } else if (pat && !json_is_null(pat)) {
    const char *p = json_string_value(pat);
    if (!p || (int)strlen(p) != L)
      return lks_set_error(LKS_ECONFIG, "%s: index_topk_pattern must be a string of %d F/S letters",
                           s->what, L);
    for (int i = 0; i < L; i++) {
      if (p[i] != 'F' && p[i] != 'S')
        return lks_set_error(LKS_ECONFIG, "%s: index_topk_pattern[%d] is '%c', not F or S", s->what, i, p[i]);
      m->index_full[i] = p[i] == 'F';
    }
  } else {
    int freq, offset;
    LKS_TRY(get_int(s, "index_topk_freq", &freq, 1, false));
    LKS_TRY(get_int(s, "index_skip_topk_offset", &offset, 2, false));
    if (freq < 1) freq = 1;
    for (int i = 0; i < L; i++) {
      int k = i - offset + 1;
      m->index_full[i] = (k > 0 ? k : 0) % freq == 0;
    }
  }
  if (!m->index_full[0])
    return lks_set_error(LKS_ECONFIG, "%s: layer 0 is a shared indexer layer; there is no full layer before it",
                         s->what);
  m->index_full[L] = true;
  return 0;
}

int lks_config_parse(const char *text, const char *what, lks_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  json_error_t jerr;
  json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lks_set_error(LKS_ECONFIG, "%s: not valid JSON: %s (line %d)", what, jerr.text,
                         jerr.line);
  int rc = 0;
  src s = {root, what};
  if (!json_is_object(root)) {
    rc = lks_set_error(LKS_ECONFIG, "%s: not a JSON object", what);
    goto done;
  }
  // The architecture: model_type glm4_moe / glm_moe_dsa, or its class in "architectures".
  const char *mt = json_string_value(json_object_get(root, "model_type"));
  json_t *archs = json_object_get(root, "architectures");
  const char *arch = json_string_value(json_array_get(archs, 0));
  // Each one given must name the same architecture, and at least one must be given.
  bool dsa = (mt && strcmp(mt, "glm_moe_dsa") == 0) || (arch && strcmp(arch, "GlmMoeDsaForCausalLM") == 0);
  const char *want_mt = dsa ? "glm_moe_dsa" : "glm4_moe";
  const char *want_arch = dsa ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM";
  bool ok = (mt || arch) && (!mt || strcmp(mt, want_mt) == 0) && (!arch || strcmp(arch, want_arch) == 0);
  if (!ok) {
    rc = lks_set_error(LKS_EUNSUPPORTED,
                       "%s: unsupported architecture (model_type '%s', architectures[0] '%s'); "
                       "lockstep runs glm4_moe / Glm4MoeForCausalLM and glm_moe_dsa / GlmMoeDsaForCausalLM",
                       what, mt ? mt : "(none)", arch ? arch : "(none)");
    goto done;
  }
  cfg->arch = dsa ? LKS_ARCH_GLM_MOE_DSA : LKS_ARCH_GLM4_MOE;
  snprintf(cfg->architecture, sizeof cfg->architecture, "%s", want_arch);
#define TRY(x)          \
  if ((rc = (x)) < 0) { \
    goto done;          \
  }
  TRY(get_int(&s, "hidden_size", &cfg->hidden, 0, true));
  TRY(get_int(&s, "num_hidden_layers", &cfg->n_layers, 0, true));
  TRY(get_int(&s, "num_attention_heads", &cfg->n_heads, 0, true));
  if (dsa) {
    TRY(parse_mla(&s, cfg));
  } else {
    TRY(get_int(&s, "num_key_value_heads", &cfg->n_kv_heads, 0, true));
    TRY(get_int(&s, "head_dim", &cfg->head_dim,
                cfg->n_heads > 0 ? cfg->hidden / cfg->n_heads : 0, false));
    TRY(get_float(&s, "partial_rotary_factor", &cfg->partial_rotary, 0.5f, false));
    TRY(get_float(&s, "rope_theta", &cfg->rope_theta, 0, true));
    TRY(get_bool(&s, "use_qk_norm", &cfg->qk_norm, false));
    TRY(get_bool(&s, "attention_bias", &cfg->attn_bias, false));
  }
  TRY(get_int(&s, "first_k_dense_replace", &cfg->first_dense, 0, true));
  TRY(get_int(&s, "n_routed_experts", &cfg->n_experts, 0, true));
  TRY(get_int(&s, "n_shared_experts", &cfg->n_shared, 0, true));
  TRY(get_int(&s, "num_experts_per_tok", &cfg->top_k, 0, true));
  TRY(get_int(&s, "moe_intermediate_size", &cfg->moe_inter, 0, true));
  TRY(get_int(&s, "intermediate_size", &cfg->inter, 0, true));
  TRY(get_float(&s, "routed_scaling_factor", &cfg->routed_scaling, 1.0f, false));
  TRY(get_int(&s, "n_group", &cfg->n_group, 1, false));
  TRY(get_int(&s, "topk_group", &cfg->topk_group, 1, false));
  TRY(get_bool(&s, "norm_topk_prob", &cfg->norm_topk_prob, true));
  TRY(get_float(&s, "rms_norm_eps", &cfg->eps, 0, true));
  TRY(get_int(&s, "vocab_size", &cfg->vocab, 0, true));
  TRY(get_int(&s, "num_nextn_predict_layers", &cfg->n_mtp, 0, false));
  TRY(get_bool(&s, "tie_word_embeddings", &cfg->tie_embeddings, false));
  TRY(get_int(&s, "max_position_embeddings", &cfg->max_pos, 131072, false));
  TRY(get_eos(root, what, cfg));
  if (dsa) TRY(parse_indexer_types(&s, cfg));
#undef TRY
  if (!dsa) cfg->rot_dims = (int)((float)cfg->head_dim * cfg->partial_rotary + 0.5f);
  rc = lks_config_validate(cfg, what);
done:
  json_decref(root);
  return rc;
}

static int validate_mla(const lks_config *c, const char *what) {
  const lks_mla_config *m = &c->mla;
  struct {
    const char *name;
    int v;
  } pos[] = {{"q_lora_rank", m->q_lora},         {"kv_lora_rank", m->kv_lora},
             {"qk_nope_head_dim", m->qk_nope},   {"qk_rope_head_dim", m->qk_rope},
             {"v_head_dim", m->v_head},          {"index_n_heads", m->index_heads},
             {"index_head_dim", m->index_dim},   {"index_topk", m->index_topk}};
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v <= 0)
      return lks_set_error(LKS_ECONFIG, "%s: '%s' must be positive, is %d", what, pos[i].name, pos[i].v);
  if (m->qk_rope % 2 || m->qk_rope > m->index_dim)
    return lks_set_error(LKS_ECONFIG, "%s: qk_rope_head_dim %d must be even and at most index_head_dim %d",
                         what, m->qk_rope, m->index_dim);
  return 0;
}

int lks_config_validate(const lks_config *c, const char *what) {
  // MLA's own sizes first: head_dim and rot_dims below derive from them.
  if (c->arch == LKS_ARCH_GLM_MOE_DSA) LKS_TRY(validate_mla(c, what));
  struct {
    const char *name;
    int v;
  } pos[] = {{"hidden_size", c->hidden},       {"num_hidden_layers", c->n_layers},
             {"num_attention_heads", c->n_heads}, {"num_key_value_heads", c->n_kv_heads},
             {"head_dim", c->head_dim},        {"n_routed_experts", c->n_experts},
             {"num_experts_per_tok", c->top_k}, {"moe_intermediate_size", c->moe_inter},
             {"intermediate_size", c->inter},  {"vocab_size", c->vocab},
             {"n_group", c->n_group},          {"topk_group", c->topk_group}};
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v <= 0)
      return lks_set_error(LKS_ECONFIG, "%s: '%s' must be positive, is %d", what, pos[i].name,
                           pos[i].v);
  if (c->n_heads % c->n_kv_heads)
    return lks_set_error(LKS_ECONFIG, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                         what, c->n_heads, c->n_kv_heads);
  if (c->rot_dims < 0 || c->rot_dims > c->head_dim || c->rot_dims % 2)
    return lks_set_error(LKS_ECONFIG, "%s: partial_rotary_factor %g gives %d rotary dims of head_dim %d (must be even, <= head_dim)",
                         what, c->partial_rotary, c->rot_dims, c->head_dim);
  if (c->top_k > c->n_experts)
    return lks_set_error(LKS_ECONFIG, "%s: num_experts_per_tok %d exceeds n_routed_experts %d",
                         what, c->top_k, c->n_experts);
  if (c->n_group > 256 || c->n_experts % c->n_group || c->topk_group > c->n_group)
    return lks_set_error(LKS_ECONFIG, "%s: n_group %d / topk_group %d do not divide n_routed_experts %d",
                         what, c->n_group, c->topk_group, c->n_experts);
  if (c->n_group > 1 && c->top_k > c->topk_group * (c->n_experts / c->n_group))
    return lks_set_error(LKS_ECONFIG, "%s: num_experts_per_tok %d exceeds the experts of topk_group groups",
                         what, c->top_k);
  if (c->first_dense < 0 || c->first_dense > c->n_layers)
    return lks_set_error(LKS_ECONFIG, "%s: first_k_dense_replace %d outside [0, %d]", what,
                         c->first_dense, c->n_layers);
  if (c->n_shared < 0 || c->n_mtp < 0 || c->n_mtp > 1)
    return lks_set_error(LKS_ECONFIG, "%s: n_shared_experts %d / num_nextn_predict_layers %d unsupported (MTP layers: 0 or 1)",
                         what, c->n_shared, c->n_mtp);
  if (!(c->eps > 0) || !(c->rope_theta > 0))
    return lks_set_error(LKS_ECONFIG, "%s: rms_norm_eps and rope_theta must be positive", what);
  if (c->tie_embeddings)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: tie_word_embeddings is true; GLM checkpoints have an lm_head", what);
  return 0;
}

static char *slurp(const char *path, const char **why) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    *why = "cannot open";
    return NULL;
  }
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && n < (1 << 24) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
      if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
      } else {
        buf[n] = '\0';
      }
    }
  }
  fclose(f);
  if (!buf) *why = "cannot read (or larger than 16 MiB)";
  return buf;
}

int lks_config_load(const char *dir, lks_config *cfg) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.json", dir);
  const char *why = "";
  char *text = slurp(path, &why);
  if (!text) return lks_set_error(LKS_ENOTFOUND, "%s: %s", path, why);
  int rc = lks_config_parse(text, path, cfg);
  free(text);
  if (rc < 0) return rc;
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  if (access(path, F_OK) == 0) {
    text = slurp(path, &why);
    if (!text) return lks_set_error(LKS_EIO, "%s: %s", path, why);
    json_error_t jerr;
    json_t *g = json_loads(text, 0, &jerr);
    free(text);
    if (!g) return lks_set_error(LKS_ECONFIG, "%s: not valid JSON: %s", path, jerr.text);
    rc = get_eos(g, path, cfg);
    json_decref(g);
  }
  return rc;
}
