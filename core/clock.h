// SPDX-License-Identifier: MIT
// The monotonic clock every deadline and timing in lockstep reads, in seconds.
#ifndef LKS_CLOCK_H
#define LKS_CLOCK_H

#include <time.h>

static inline double lks_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
