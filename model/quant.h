// SPDX-License-Identifier: MIT
// Quantized checkpoints in Hugging Face layout: which scheme a checkpoint declares (config.json
// `quantization_config`, or ModelOpt's hf_quant_config.json) and, tensor by tensor, which scheme
// a weight is stored in, decided from its dtype and the scale tensors next to it:
//
//   compressed-tensors, format float-quantized, weights {num_bits 8, type float}:
//     strategy channel: X.weight F8_E4M3 [out, in], X.weight_scale F32|BF16 [out, 1]
//     strategy tensor:  the same with X.weight_scale [1] (or [])
//     strategy block (block_structure [128, 128]): X.weight_scale F32|BF16 [ceil(out/128), ceil(in/128)]
//   quant_method fp8, weight_block_size [128, 128] (DeepSeek / GLM-5 style):
//     X.weight F8_E4M3, X.weight_scale_inv F32|BF16 [ceil(out/128), ceil(in/128)] (a multiplier,
//     despite its name; edge blocks cropped)
//   NVFP4, group size 16, E2M1 codes two a byte (low nibble = even column):
//     ModelOpt (hf_quant_config.json quant_algo NVFP4, or quantization_config quant_method
//     modelopt): X.weight U8 [out, in/2], X.weight_scale F8_E4M3 [out, in/16],
//     X.weight_scale_2 F32 scalar multiplier (X.input_scale: activations, unused here)
//     compressed-tensors nvfp4-pack-quantized: X.weight_packed U8 [out, in/2], X.weight_scale
//     F8_E4M3 [out, in/16], X.weight_global_scale F32 scalar divisor
//
// Any mix is accepted: a weight stored in F32/BF16/F16 is plain whatever the config says (the
// `ignore` / `exclude_modules` lists are what produces them). Everything else is refused with a
// message naming the tensor and the scheme.
#ifndef LKS_QUANT_H
#define LKS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "model/safetensors.h"

typedef struct lks_quant_config {
  char method[48];      // "" (none), "compressed-tensors", "fp8", "modelopt"
  lks_qscheme scheme;   // what quantized weights are: FP8_ROW, FP8_BLOCK or NVFP4 (NONE: none)
  bool ct;              // compressed-tensors naming (weight_scale, weight_packed, global divisor)
  bool per_tensor;      // FP8 with one scale per tensor (compressed-tensors strategy tensor)
  char what[64];        // the declared scheme, for messages ("compressed-tensors fp8 channel")
} lks_quant_config;

// Reads DIR/config.json's quantization_config and DIR/hf_quant_config.json. 0 (scheme NONE when
// neither declares one), or LKS_ECONFIG / LKS_EUNSUPPORTED naming the file and field: an unknown
// quant_method, format or algorithm, a group size other than 16, a block size other than 128x128.
int lks_quant_config_load(const char *dir, lks_quant_config *q);
// The same from the texts (hf may be NULL); `what` names config.json in messages.
int lks_quant_config_parse(const char *config_json, const char *hf_quant_json, const char *what,
                           lks_quant_config *q);

// One weight as stored.
typedef struct lks_qtensor {
  lks_qscheme qs;
  const lks_st_tensor *w;      // the codes (or the plain weight); NULL when absent
  const lks_st_tensor *scale;  // weight_scale / weight_scale_inv
  float global;                // NVFP4: the per-tensor multiplier
} lks_qtensor;

// Resolves weight `name` ("....weight") of logical shape [rows, cols]. Returns 0 with q->qs
// NONE for a plain weight or an absent one (q->w NULL; the caller checks plain weights' dtype and
// shape), 0 with the scheme for a valid quantized weight, or LKS_EFORMAT / LKS_EUNSUPPORTED with
// lks_last_error() naming the tensor and what is wrong.
int lks_quant_find(const lks_safetensors *st, const lks_quant_config *qc, const char *name,
                   int64_t rows, int64_t cols, lks_qtensor *q);

// Checks that rows [r0, r0 + nr) and columns [c0, c0 + nc) of a quantized weight can be a shard
// (FP8 blocks: 128-aligned; NVFP4 column ranges: 16-aligned): 0 or LKS_ESHAPE naming the tensor.
int lks_quant_check_slice(const lks_qtensor *q, int64_t rows, int64_t cols, int64_t r0,
                          int64_t nr, int64_t c0, int64_t nc);

// The scales of that slice, compacted into `dst` (malloc'd, caller frees): F32 for FP8 (per-row
// [nr], or blocks [ceil-range rows, ceil-range cols]), E4M3 bytes [nr, nc/16] for NVFP4. Sets
// *bytes and *sld (entries per scale row). 0 or LKS_ENOMEM.
int lks_quant_slice_scales(const lks_qtensor *q, int64_t rows, int64_t cols, int64_t r0,
                           int64_t nr, int64_t c0, int64_t nc, void **dst, size_t *bytes,
                           int64_t *sld);

#endif
