// SPDX-License-Identifier: MIT
// Element type table and F16 conversion (see dtype.h).
#include "core/dtype.h"

#include <math.h>
#include <stdbool.h>

#include "core/backend.h"
#include "core/fastmath.h"

static const struct {
  const char *name;
  size_t size;
} table[LKS_N_DTYPES] = {
    [LKS_F32] = {"F32", 4}, [LKS_F16] = {"F16", 2}, [LKS_BF16] = {"BF16", 2},
    [LKS_I32] = {"I32", 4}, [LKS_I64] = {"I64", 8}, [LKS_U8] = {"U8", 1},
    [LKS_F8_E4M3] = {"F8_E4M3", 1}, [LKS_F4_E2M1X2] = {"lockstep:E2M1x2", 1},
    [LKS_I8] = {"I8", 1}, [LKS_F8_E5M2] = {"F8_E5M2", 1},
};

size_t lks_dtype_size(lks_dtype t) { return t < LKS_N_DTYPES ? table[t].size : 0; }
const char *lks_dtype_name(lks_dtype t) { return t < LKS_N_DTYPES ? table[t].name : "?"; }

int lks_dtype_parse(const char *name, lks_dtype *t) {
  for (int i = 0; i < LKS_N_DTYPES; i++)
    if (strcmp(name, table[i].name) == 0) {
      *t = (lks_dtype)i;
      return 0;
    }
  return -1;
}

float lks_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float lks_e4m3_to_f32(uint8_t b) {
  int e = (b >> 3) & 0xf, m = b & 7;
  float v;
  if (e == 0xf && m == 7) {
    v = NAN;
  } else if (e == 0) {
    v = ldexpf((float)m, -9);  // subnormal: m/8 * 2^-6
  } else {
    v = ldexpf((float)(8 + m), e - 10);  // (1 + m/8) * 2^(e-7)
  }
  return (b & 0x80) ? -v : v;
}

// Whether one of the m bytes at p has exponent 0: the least byte | 0x87 is 0x87 just then (a
// min reduction, vectorised: the loader scans every FP8 code, 0.5 s a GB as a scalar loop).
LKS_WIDE_CLONES LKS_VECTORIZE static bool exp0_any(const uint8_t *p, int64_t m) {
  uint8_t least = 0xFF;
  for (int64_t j = 0; j < m; j++) {
    uint8_t v = (uint8_t)(p[j] | 0x87);
    least = v < least ? v : least;
  }
  return least == 0x87;
}

void lks_e4m3_exp0_chunks(const uint8_t *b, int64_t ld, int64_t rows, int64_t n, int64_t per,
                          uint8_t *flags) {
  const int64_t nc = (n + per - 1) / per;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < nc; c++)
      flags[r * nc + c] = exp0_any(b + r * ld + c * per, n - c * per < per ? n - c * per : per);
}

void lks_qweight_exp0_chunks(bool nvfp4, const uint8_t *codes, int64_t ld, const uint8_t *scales,
                             int64_t sld, int64_t rows, int64_t cols, uint8_t *flags) {
  if (nvfp4)
    lks_e4m3_exp0_chunks(scales, sld, rows, cols / LKS_Q_NVFP4_GROUP,
                         LKS_E4M3_CHUNK / LKS_Q_NVFP4_GROUP, flags);
  else
    lks_e4m3_exp0_chunks(codes, ld, rows, cols, LKS_E4M3_CHUNK, flags);
}

float lks_e2m1_to_f32(uint8_t code) {
  static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = mag[code & 7];
  return (code & 8) ? -v : v;
}
