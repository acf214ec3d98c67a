// SPDX-License-Identifier: MIT
// libFuzzer target: the safetensors header parser on arbitrary bytes. Any crash, leak, sanitizer
// report or accepted file whose tensors fall outside the input is a bug.
#include <stdint.h>
#include <stdlib.h>

#include "core/log.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lks_log_set_level(LKS_LOG_ERROR);
  lks_st_tensor *t;
  int n;
  if (lks_st_parse(data, size, "fuzz", &t, &n) == 0) {
    for (int i = 0; i < n; i++) {
      // Every accepted tensor lies inside the input.
      if (t[i].data < data || t[i].data + t[i].nbytes > data + size) abort();
      volatile uint8_t sink = 0;
      for (size_t k = 0; k < t[i].nbytes; k++) sink ^= t[i].data[k];
      (void)sink;
    }
    lks_st_tensors_free(t, n);
  }
  return 0;
}
