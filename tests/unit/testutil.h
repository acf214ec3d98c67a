// SPDX-License-Identifier: MIT
// Helpers shared by the unit tests: scratch directories, files, random data.
#ifndef LKS_TESTUTIL_H
#define LKS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

// A new empty directory under $TMPDIR (or /tmp); the returned path is static per call site use.
char *tu_tmpdir(void);
void tu_write(const char *path, const void *data, size_t n);
// Writes a safetensors file: 8-byte length, `header` (padded), then `data_len` bytes of `data`.
void tu_write_st(const char *path, const char *header, const void *data, size_t data_len);
// Runs the generator tools/gen_model.py into dir with extra arguments; 0 on success.
int tu_gen_model(const char *dir, const char *args);
uint64_t tu_rand(uint64_t *state);
float tu_randf(uint64_t *state);  // uniform in [-1, 1)

// Every SIMD level of the CPU kernels (LKS_SIMD), for the tests that run each one this CPU and
// build have (lks__cpu_kernels_get and lks__quant_kernels_get answer NULL for the others).
// neon_bf16 rounds activations to BF16 in the BF16 products (lks__cpu_kernels.bf16_activations):
// the tests bound its error accordingly.
#define TU_SIMD_LEVELS {"scalar", "avx2", "avx512", "amx", "neon", "neon_bf16"}
enum { TU_N_SIMD_LEVELS = 6 };

#endif
