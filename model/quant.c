// SPDX-License-Identifier: MIT
// Quantized checkpoint schemes and per-tensor resolution (see quant.h).
#include "model/quant.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

// ---- the declared scheme ----

static int fp8_weights(json_t *wt, const char *what, lks_quant_config *q) {
  json_t *bits = json_object_get(wt, "num_bits"), *type = json_object_get(wt, "type"),
         *strat = json_object_get(wt, "strategy");
  const char *ty = json_string_value(type), *st = json_string_value(strat);
  if (json_integer_value(bits) != 8 || !ty || strcmp(ty, "float") != 0)
    return lks_set_error(LKS_EUNSUPPORTED,
                         "%s: compressed-tensors float-quantized weights of %lld bits, type %s: "
                         "only 8-bit float (FP8 E4M3) is supported",
                         what, (long long)json_integer_value(bits), ty ? ty : "(none)");
  if (st && strcmp(st, "channel") == 0) {
    q->scheme = LKS_Q_FP8_ROW;
  } else if (st && strcmp(st, "tensor") == 0) {
    q->scheme = LKS_Q_FP8_ROW;
    q->per_tensor = true;
  } else if (st && strcmp(st, "block") == 0) {
    json_t *bs = json_object_get(wt, "block_structure");
    if (json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != 128 ||
        json_integer_value(json_array_get(bs, 1)) != 128)
      return lks_set_error(LKS_EUNSUPPORTED,
                           "%s: compressed-tensors FP8 block_structure other than [128, 128]", what);
    q->scheme = LKS_Q_FP8_BLOCK;
  } else {
    return lks_set_error(LKS_EUNSUPPORTED,
                         "%s: compressed-tensors FP8 weights with strategy '%s' (supported: "
                         "channel, tensor, block)",
                         what, st ? st : "(none)");
  }
  snprintf(q->what, sizeof q->what, "compressed-tensors fp8 %s", st);
  return 0;
}

static int group16(json_t *gs, const char *what, const char *field) {
  if (!json_is_integer(gs))
    return lks_set_error(LKS_ECONFIG, "%s: NVFP4 without an integer '%s'", what, field);
  if (json_integer_value(gs) != 16)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: NVFP4 %s %lld: only groups of 16 are NVFP4", what,
                         field, (long long)json_integer_value(gs));
  return 0;
}

static int compressed_tensors(json_t *qc, const char *what, lks_quant_config *q) {
  q->ct = true;
  const char *fmt = json_string_value(json_object_get(qc, "format"));
  json_t *groups = json_object_get(qc, "config_groups");
  if (!json_is_object(groups) || json_object_size(groups) == 0)
    return lks_set_error(LKS_ECONFIG, "%s: compressed-tensors without config_groups", what);
  const char *gname;
  json_t *g;
  lks_qscheme seen = LKS_Q_NONE;
  json_object_foreach(groups, gname, g) {
    const char *f = json_string_value(json_object_get(g, "format"));
    if (!f) f = fmt;
    json_t *wt = json_object_get(g, "weights");
    if (!f || !json_is_object(wt))
      return lks_set_error(LKS_ECONFIG, "%s: config group '%s' has no format or weights", what,
                           gname);
    if (strcmp(f, "float-quantized") == 0 || strcmp(f, "naive-quantized") == 0) {
      LKS_TRY(fp8_weights(wt, what, q));
    } else if (strcmp(f, "nvfp4-pack-quantized") == 0) {
      json_t *bits = json_object_get(wt, "num_bits");
      if (json_integer_value(bits) != 4)
        return lks_set_error(LKS_EUNSUPPORTED, "%s: nvfp4-pack-quantized with %lld-bit weights",
                             what, (long long)json_integer_value(bits));
      LKS_TRY(group16(json_object_get(wt, "group_size"), what, "group_size"));
      q->scheme = LKS_Q_NVFP4;
      snprintf(q->what, sizeof q->what, "compressed-tensors nvfp4");
    } else {
      return lks_set_error(LKS_EUNSUPPORTED,
                           "%s: compressed-tensors format '%s' is not supported (supported: "
                           "float-quantized FP8, nvfp4-pack-quantized)",
                           what, f);
    }
    if (seen != LKS_Q_NONE && seen != q->scheme)
      return lks_set_error(LKS_EUNSUPPORTED,
                           "%s: config groups declare different weight schemes (not supported)",
                           what);
    seen = q->scheme;
  }
  return 0;
}

static int modelopt(json_t *qc, const char *what, lks_quant_config *q) {
  const char *algo = json_string_value(json_object_get(qc, "quant_algo"));
  if (!algo) return lks_set_error(LKS_ECONFIG, "%s: ModelOpt quantization without quant_algo", what);
  if (strcmp(algo, "NVFP4") != 0)
    return lks_set_error(LKS_EUNSUPPORTED,
                         "%s: ModelOpt quant_algo '%s' is not supported (supported: NVFP4)", what,
                         algo);
  LKS_TRY(group16(json_object_get(qc, "group_size"), what, "group_size"));
  q->scheme = LKS_Q_NVFP4;
  snprintf(q->method, sizeof q->method, "modelopt");
  snprintf(q->what, sizeof q->what, "modelopt nvfp4");
  return 0;
}

int lks_quant_config_parse(const char *config_json, const char *hf_quant_json, const char *what,
                           lks_quant_config *q) {
  memset(q, 0, sizeof *q);
  json_error_t jerr;
  json_t *root = json_loads(config_json, 0, &jerr);
  if (!root) return lks_set_error(LKS_ECONFIG, "%s: not valid JSON: %s", what, jerr.text);
  int rc = 0;
  json_t *qc = json_object_get(root, "quantization_config");
  if (qc && !json_is_null(qc)) {
    const char *m = json_string_value(json_object_get(qc, "quant_method"));
    if (!json_is_object(qc) || !m) {
      rc = lks_set_error(LKS_ECONFIG, "%s: quantization_config without a quant_method", what);
      goto done;
    }
    snprintf(q->method, sizeof q->method, "%s", m);
    if (strcmp(m, "compressed-tensors") == 0) {
      rc = compressed_tensors(qc, what, q);
    } else if (strcmp(m, "fp8") == 0) {
      json_t *bs = json_object_get(qc, "weight_block_size");
      if (!json_is_array(bs))
        rc = lks_set_error(LKS_EUNSUPPORTED,
                           "%s: quant_method fp8 without weight_block_size (per-tensor FP8) is "
                           "not supported",
                           what);
      else if (json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != 128 ||
               json_integer_value(json_array_get(bs, 1)) != 128)
        rc = lks_set_error(LKS_EUNSUPPORTED,
                           "%s: quant_method fp8 weight_block_size other than [128, 128]", what);
      q->scheme = LKS_Q_FP8_BLOCK;
      snprintf(q->what, sizeof q->what, "fp8 128x128 blocks");
    } else if (strcmp(m, "modelopt") == 0) {
      rc = modelopt(qc, what, q);
    } else {
      rc = lks_set_error(LKS_EUNSUPPORTED,
                         "%s: unknown quant_method '%s' (supported: compressed-tensors, fp8, "
                         "modelopt)",
                         what, m);
    }
  }
  if (rc == 0 && hf_quant_json) {
    json_t *hf = json_loads(hf_quant_json, 0, &jerr);
    json_t *qq = hf ? json_object_get(hf, "quantization") : NULL;
    if (!hf)
      rc = lks_set_error(LKS_ECONFIG, "hf_quant_config.json: not valid JSON: %s", jerr.text);
    else if (!json_is_object(qq))
      rc = lks_set_error(LKS_ECONFIG, "hf_quant_config.json: no 'quantization' object");
    else if (q->scheme != LKS_Q_NONE && strcmp(q->method, "modelopt") != 0)
      rc = lks_set_error(LKS_ECONFIG,
                         "hf_quant_config.json (ModelOpt) and %s quant_method '%s' disagree", what,
                         q->method);
    else
      rc = modelopt(qq, "hf_quant_config.json", q);
    json_decref(hf);
  }
done:
  json_decref(root);
  if (rc < 0) memset(q, 0, sizeof *q);
  return rc;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

int lks_quant_config_load(const char *dir, lks_quant_config *q) {
  char path[PATH_MAX], hpath[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.json", dir);
  snprintf(hpath, sizeof hpath, "%s/hf_quant_config.json", dir);
  char *cfg = slurp(path), *hf = NULL;
  if (!cfg) return lks_set_error(LKS_ENOTFOUND, "%s: cannot read", path);
  if (access(hpath, F_OK) == 0 && !(hf = slurp(hpath))) {
    free(cfg);
    return lks_set_error(LKS_EIO, "%s: cannot read", hpath);
  }
  int rc = lks_quant_config_parse(cfg, hf, path, q);
  free(cfg);
  free(hf);
  return rc;
}

// ---- one tensor ----

static const lks_st_tensor *sibling(const lks_safetensors *st, const char *base, const char *suffix,
                                    char *name, size_t n) {
  if ((size_t)snprintf(name, n, "%.500s.%s", base, suffix) >= n) name[n - 1] = 0;
  return lks_safetensors_find(st, name);
}

static void shape_str(const lks_st_tensor *t, char *out, size_t n) {
  size_t k = (size_t)snprintf(out, n, "[");
  for (int d = 0; d < t->n_dims && k < n; d++)
    k += (size_t)snprintf(out + k, n - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (k < n) snprintf(out + k, n - k, "]");
}

static bool is_2d(const lks_st_tensor *t, int64_t r, int64_t c) {
  return t->n_dims == 2 && t->shape[0] == r && t->shape[1] == c;
}

// One value: shape [] or [1].
static bool is_scalar(const lks_st_tensor *t) {
  return lks_st_numel(t) == 1 && t->n_dims <= 1;
}

static int bad_shape(const lks_st_tensor *t, const char *scheme, const char *want) {
  char got[96];
  shape_str(t, got, sizeof got);
  return lks_set_error(LKS_EFORMAT, "tensor '%s' (%s) has shape %s, expected %s", t->name, scheme,
                       got, want);
}

static float read_f32(const lks_st_tensor *t) {
  float v;
  memcpy(&v, t->data, 4);
  return v;
}

static int fp8(const lks_safetensors *st, const lks_quant_config *qc, const char *name,
               const char *base, int64_t rows, int64_t cols, lks_qtensor *q) {
  char sn[600], want[96];
  const char *scheme = qc->what;
  if (qc->scheme != LKS_Q_FP8_ROW && qc->scheme != LKS_Q_FP8_BLOCK)
    return lks_set_error(LKS_EUNSUPPORTED,
                         "tensor '%s' is F8_E4M3, but %s: FP8 weights are not that scheme", name,
                         qc->scheme == LKS_Q_NONE ? "config.json declares no quantization"
                                                  : qc->what);
  if (!is_2d(q->w, rows, cols)) {
    snprintf(want, sizeof want, "[%lld, %lld] from config.json", (long long)rows, (long long)cols);
    return bad_shape(q->w, scheme, want);
  }
  const char *sfx = qc->ct ? "weight_scale" : "weight_scale_inv";
  q->scale = sibling(st, base, sfx, sn, sizeof sn);
  if (!q->scale)
    return lks_set_error(LKS_EFORMAT, "tensor '%s' (%s) has no scale: '%s' is missing", name,
                         scheme, sn);
  if (q->scale->dtype != LKS_F32 && q->scale->dtype != LKS_BF16)
    return lks_set_error(LKS_EFORMAT, "scale '%s' (%s) has dtype %s, expected F32 or BF16", sn,
                         scheme, lks_dtype_name(q->scale->dtype));
  q->qs = qc->scheme;
  if (qc->scheme == LKS_Q_FP8_ROW && qc->per_tensor) {
    if (!is_scalar(q->scale)) return bad_shape(q->scale, scheme, "[1] (one scale per tensor)");
  } else if (qc->scheme == LKS_Q_FP8_ROW) {
    bool ok = (q->scale->n_dims == 2 && q->scale->shape[0] == rows && q->scale->shape[1] == 1) ||
              (q->scale->n_dims == 1 && q->scale->shape[0] == rows);
    snprintf(want, sizeof want, "[%lld, 1] (one scale per output channel)", (long long)rows);
    if (!ok) return bad_shape(q->scale, scheme, want);
  } else {
    int64_t B = LKS_Q_FP8_BLOCK_SIZE, br = (rows + B - 1) / B, bc = (cols + B - 1) / B;
    snprintf(want, sizeof want, "[%lld, %lld] (128x128 blocks of [%lld, %lld])", (long long)br,
             (long long)bc, (long long)rows, (long long)cols);
    if (!is_2d(q->scale, br, bc)) return bad_shape(q->scale, scheme, want);
  }
  return 0;
}

static int nvfp4(const lks_safetensors *st, const lks_quant_config *qc, const char *name,
                 const char *base, int64_t rows, int64_t cols, lks_qtensor *q) {
  char sn[600], want[96];
  const char *scheme = qc->what;
  if (qc->scheme != LKS_Q_NVFP4)
    return lks_set_error(LKS_EUNSUPPORTED,
                         "tensor '%s' holds U8 codes (packed FP4), but %s: not that scheme", name,
                         qc->scheme == LKS_Q_NONE ? "config.json declares no quantization"
                                                  : qc->what);
  if (cols % 2)
    return lks_set_error(LKS_EFORMAT,
                         "tensor '%s' (%s): %lld columns is odd; two E2M1 codes a byte need an "
                         "even number",
                         name, scheme, (long long)cols);
  if (cols % LKS_Q_NVFP4_GROUP)
    return lks_set_error(LKS_EFORMAT,
                         "tensor '%s' (%s): %lld columns is not a multiple of the group size 16",
                         name, scheme, (long long)cols);
  if (q->w->dtype != LKS_U8)
    return lks_set_error(LKS_EFORMAT, "tensor '%s' (%s) has dtype %s, expected U8", name, scheme,
                         lks_dtype_name(q->w->dtype));
  snprintf(want, sizeof want, "[%lld, %lld] (two codes a byte)", (long long)rows,
           (long long)cols / 2);
  if (!is_2d(q->w, rows, cols / 2)) return bad_shape(q->w, scheme, want);
  q->scale = sibling(st, base, "weight_scale", sn, sizeof sn);
  if (!q->scale)
    return lks_set_error(LKS_EFORMAT, "tensor '%s' (%s) has no scale: '%s' is missing", name,
                         scheme, sn);
  if (q->scale->dtype != LKS_F8_E4M3)
    return lks_set_error(LKS_EFORMAT, "scale '%s' (%s) has dtype %s, expected F8_E4M3", sn, scheme,
                         lks_dtype_name(q->scale->dtype));
  snprintf(want, sizeof want, "[%lld, %lld] (one scale per 16 columns)", (long long)rows,
           (long long)cols / 16);
  if (!is_2d(q->scale, rows, cols / 16)) return bad_shape(q->scale, scheme, want);
  const lks_st_tensor *g = sibling(st, base, qc->ct ? "weight_global_scale" : "weight_scale_2", sn,
                                   sizeof sn);
  if (!g)
    return lks_set_error(LKS_EFORMAT, "tensor '%s' (%s) has no global scale: '%s' is missing",
                         name, scheme, sn);
  if (g->dtype != LKS_F32)
    return lks_set_error(LKS_EFORMAT, "scale '%s' (%s) has dtype %s, expected F32", sn, scheme,
                         lks_dtype_name(g->dtype));
  if (!is_scalar(g)) return bad_shape(g, scheme, "[1] (one value per tensor)");
  float v = read_f32(g);
  if (!isfinite(v) || v <= 0)
    return lks_set_error(LKS_EFORMAT, "scale '%s' (%s) is %g, expected a positive number", sn,
                         scheme, v);
  // compressed-tensors stores the global scale as a divisor, ModelOpt as a multiplier.
  q->global = qc->ct ? 1.0f / v : v;
  q->qs = LKS_Q_NVFP4;
  return 0;
}

int lks_quant_find(const lks_safetensors *st, const lks_quant_config *qc, const char *name,
                   int64_t rows, int64_t cols, lks_qtensor *q) {
  memset(q, 0, sizeof *q);
  char base[512], pn[600];
  size_t n = strlen(name);
  if (n < 7 || n >= sizeof base || strcmp(name + n - 7, ".weight") != 0) {
    q->w = lks_safetensors_find(st, name);
    return 0;
  }
  memcpy(base, name, n - 7);
  base[n - 7] = 0;
  q->w = lks_safetensors_find(st, name);
  const lks_st_tensor *packed = sibling(st, base, "weight_packed", pn, sizeof pn);
  if (packed) {
    if (q->w)
      return lks_set_error(LKS_EFORMAT, "tensor '%s' and '%s' are both present", name, pn);
    if (!qc->ct || qc->scheme != LKS_Q_NVFP4)
      return lks_set_error(LKS_EUNSUPPORTED,
                           "tensor '%s' (compressed-tensors packed weights) is not the scheme %s "
                           "declares (%s)",
                           pn, "config.json", qc->scheme ? qc->what : "none");
    q->w = packed;
    return nvfp4(st, qc, pn, base, rows, cols, q);
  }
  if (!q->w) return 0;
  switch (q->w->dtype) {
    case LKS_F32:
    case LKS_BF16:
    case LKS_F16:
      return 0;
    case LKS_F8_E4M3:
      return fp8(st, qc, name, base, rows, cols, q);
    case LKS_U8:
      if (qc->ct && qc->scheme == LKS_Q_NVFP4)
        return lks_set_error(LKS_EFORMAT,
                             "tensor '%s' is U8: compressed-tensors NVFP4 codes are named "
                             "'%s.weight_packed'",
                             name, base);
      return nvfp4(st, qc, name, base, rows, cols, q);
    default:
      return lks_set_error(LKS_EUNSUPPORTED,
                           "tensor '%s' has dtype %s: not a weight type nor a supported "
                           "quantization scheme (BF16/F16/F32, FP8 E4M3, NVFP4)",
                           name, lks_dtype_name(q->w->dtype));
  }
}

int lks_quant_check_slice(const lks_qtensor *q, int64_t rows, int64_t cols, int64_t r0,
                          int64_t nr, int64_t c0, int64_t nc) {
  int64_t a = 1;
  const char *why = "";
  bool rows_ok = true, cols_ok = true;
  if (q->qs == LKS_Q_FP8_BLOCK) {
    a = LKS_Q_FP8_BLOCK_SIZE;
    why = "FP8 128x128 blocks";
    rows_ok = r0 % a == 0 && ((r0 + nr) % a == 0 || r0 + nr == rows);
    cols_ok = c0 % a == 0 && ((c0 + nc) % a == 0 || c0 + nc == cols);
  } else if (q->qs == LKS_Q_NVFP4) {
    a = LKS_Q_NVFP4_GROUP;
    why = "NVFP4 groups of 16 columns";
    cols_ok = c0 % a == 0 && nc % a == 0;
  }
  if (!rows_ok)
    return lks_set_error(LKS_ESHAPE,
                         "tensor '%s': this rank's rows [%lld, %lld) of %lld do not fall on the "
                         "boundaries of its %s (multiples of %lld)",
                         q->w->name, (long long)r0, (long long)(r0 + nr), (long long)rows, why,
                         (long long)a);
  if (!cols_ok)
    return lks_set_error(LKS_ESHAPE,
                         "tensor '%s': this rank's columns [%lld, %lld) of %lld do not fall on the "
                         "boundaries of its %s (multiples of %lld)",
                         q->w->name, (long long)c0, (long long)(c0 + nc), (long long)cols, why,
                         (long long)a);
  return 0;
}

static float scale_at(const lks_st_tensor *s, int64_t i) {
  if (s->dtype == LKS_BF16) {
    uint16_t h;
    memcpy(&h, s->data + 2 * i, 2);
    return lks_bf16_to_f32(h);
  }
  float v;
  memcpy(&v, s->data + 4 * i, 4);
  return v;
}

int lks_quant_slice_scales(const lks_qtensor *q, int64_t rows, int64_t cols, int64_t r0,
                           int64_t nr, int64_t c0, int64_t nc, void **dst, size_t *bytes,
                           int64_t *sld) {
  (void)rows;
  const lks_st_tensor *s = q->scale;
  void *p = NULL;
  if (q->qs == LKS_Q_FP8_ROW) {
    float *f = p = malloc((size_t)nr * sizeof *f);
    if (!f) return lks_set_error(LKS_ENOMEM, "out of memory");
    bool one = lks_st_numel(s) == 1;
    for (int64_t r = 0; r < nr; r++) f[r] = scale_at(s, one ? 0 : r0 + r);
    *bytes = (size_t)nr * sizeof *f;
    *sld = 1;
  } else if (q->qs == LKS_Q_FP8_BLOCK) {
    int64_t B = LKS_Q_FP8_BLOCK_SIZE, bc_all = (cols + B - 1) / B;
    int64_t b0 = r0 / B, b1 = (r0 + nr + B - 1) / B, k0 = c0 / B, k1 = (c0 + nc + B - 1) / B;
    float *f = p = malloc((size_t)((b1 - b0) * (k1 - k0)) * sizeof *f);
    if (!f) return lks_set_error(LKS_ENOMEM, "out of memory");
    for (int64_t b = b0; b < b1; b++)
      for (int64_t k = k0; k < k1; k++) f[(b - b0) * (k1 - k0) + (k - k0)] = scale_at(s, b * bc_all + k);
    *bytes = (size_t)((b1 - b0) * (k1 - k0)) * sizeof *f;
    *sld = k1 - k0;
  } else {
    int64_t G = LKS_Q_NVFP4_GROUP, gc = cols / G, n = nc / G;
    uint8_t *u = p = malloc((size_t)(nr * n));
    if (!u) return lks_set_error(LKS_ENOMEM, "out of memory");
    for (int64_t r = 0; r < nr; r++) memcpy(u + r * n, s->data + (r0 + r) * gc + c0 / G, (size_t)n);
    *bytes = (size_t)(nr * n);
    *sld = n;
  }
  *dst = p;
  return 0;
}
