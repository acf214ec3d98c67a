// SPDX-License-Identifier: MIT
// The monotonic clock every deadline and timing in lockstep reads, in seconds.
#ifndef LKS_CLOCK_H
#define LKS_CLOCK_H

#include <stdlib.h>
#include <time.h>

static inline double lks_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int lks__cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// The median of n timings (n >= 1; v is sorted in place).
static inline double lks_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, lks__cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
