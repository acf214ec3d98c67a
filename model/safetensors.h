// SPDX-License-Identifier: MIT
// Safetensors loading: one file, or a sharded set named by model.safetensors.index.json. Files
// are mmapped read-only and never copied; a tensor is a pointer into the map, so a rank that
// reads only its own rows touches only those pages. Every header is validated completely before
// any tensor is handed out: header length, JSON shape, dtypes, shapes, byte ranges inside the
// file, no two tensors overlapping, size = shape x dtype. Failures return NULL / a negative code
// with lks_last_error() naming the file and the tensor.
#ifndef LKS_SAFETENSORS_H
#define LKS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define LKS_ST_MAX_DIMS 8

typedef struct lks_st_tensor {
  char *name;
  lks_dtype dtype;
  int n_dims;
  int64_t shape[LKS_ST_MAX_DIMS];
  size_t begin, end;  // byte range within the file's data section
  const uint8_t *data;  // into the mapping (NULL for a header parsed without data)
  size_t nbytes;
  int file;  // index into the set's files
} lks_st_tensor;

// Parses and validates one safetensors image of `len` bytes (header and data). On success sets
// *tensors (caller frees with lks_st_tensors_free) with data pointers into `buf`. `what` names
// the source in messages (a path). Safe on arbitrary bytes: this is the fuzzer's entry point.
int lks_st_parse(const uint8_t *buf, size_t len, const char *what, lks_st_tensor **tensors,
                 int *n_tensors);
void lks_st_tensors_free(lks_st_tensor *t, int n);

typedef struct lks_safetensors lks_safetensors;

// Opens `path`: a directory holding model.safetensors.index.json or model.safetensors, or one
// .safetensors file. NULL on failure.
lks_safetensors *lks_safetensors_open(const char *path);
void lks_safetensors_close(lks_safetensors *st);

int lks_safetensors_count(const lks_safetensors *st);
const lks_st_tensor *lks_safetensors_at(const lks_safetensors *st, int i);
// NULL when absent (no error recorded: absence is often fine, e.g. optional biases).
const lks_st_tensor *lks_safetensors_find(const lks_safetensors *st, const char *name);
// Total bytes of all files.
size_t lks_safetensors_file_bytes(const lks_safetensors *st);

// Rows (first dimension) [row0, row0 + n_rows) of a tensor: lks_st_rows returns a pointer into
// the mapping (NULL with an error when out of range); lks_st_read_rows copies them to dst.
const void *lks_st_rows(const lks_st_tensor *t, int64_t row0, int64_t n_rows);
int lks_st_read_rows(const lks_st_tensor *t, int64_t row0, int64_t n_rows, void *dst);
int64_t lks_st_numel(const lks_st_tensor *t);

#endif
