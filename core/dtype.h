// SPDX-License-Identifier: MIT
// Element types of tensors on disk and in buffers, with the scalar conversions every backend
// and the loader share. BF16 is the top half of an IEEE f32; F16 is IEEE half.
#ifndef LKS_DTYPE_H
#define LKS_DTYPE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

// F8_E4M3 is the "fn" variant (no infinities, max 448, NaN 0x7f / 0xff). F4_E2M1X2 is internal (no
// file carries it by that name): NVFP4 weight codes, two a byte, the low nibble the even element;
// a tensor of it counts `cols` in elements and `ld` in bytes (lks_dtype_size is 1). I8 and
// F8_E5M2 are parsed so that a checkpoint holding them is refused by tensor, not by file.
typedef enum {
  LKS_F32, LKS_F16, LKS_BF16, LKS_I32, LKS_I64, LKS_U8, LKS_F8_E4M3, LKS_F4_E2M1X2, LKS_I8,
  LKS_F8_E5M2, LKS_N_DTYPES
} lks_dtype;

size_t lks_dtype_size(lks_dtype t);
// Safetensors spelling ("F32", "BF16", ...).
const char *lks_dtype_name(lks_dtype t);
// Returns 0 and sets *t, or -1 for an unknown name.
int lks_dtype_parse(const char *name, lks_dtype *t);

static inline float lks_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
static inline uint16_t lks_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float lks_f16_to_f32(uint16_t h);

// E4M3 ("fn") byte to f32: exact (every E4M3 value is an f32). NaN codes (0x7f, 0xff) give NaN.
float lks_e4m3_to_f32(uint8_t b);
// E2M1 code (low 4 bits) to f32: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
float lks_e2m1_to_f32(uint8_t code);

// A quantized weight's chunks of 128 columns whose E4M3 bytes (FP8's codes; NVFP4's group
// scales, 8 a chunk) include one of exponent 0, a zero or a subnormal: the CPU kernels convert
// those by a slower exact path (cpu_quant.c). For E4M3 bytes b of `rows` rows of n (at b + r *
// ld), `per` bytes a chunk: flags[r * ceil(n / per) + c] = 1 where row r has one among bytes
// [per c, per c + per), else 0. lks_e4m3_chunks(cols) flags a row either way.
enum { LKS_E4M3_CHUNK = 128 };
static inline int64_t lks_e4m3_chunks(int64_t cols) {
  return (cols + LKS_E4M3_CHUNK - 1) / LKS_E4M3_CHUNK;
}
void lks_e4m3_exp0_chunks(const uint8_t *b, int64_t ld, int64_t rows, int64_t n, int64_t per,
                          uint8_t *flags);
// Those flags for `rows` rows of a quantized weight of `cols` columns: of its FP8 codes (ld bytes
// apart), or with nvfp4 of its E4M3 group scales (sld bytes apart; 16 columns a scale).
void lks_qweight_exp0_chunks(bool nvfp4, const uint8_t *codes, int64_t ld, const uint8_t *scales,
                             int64_t sld, int64_t rows, int64_t cols, uint8_t *flags);

#endif
