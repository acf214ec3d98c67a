// SPDX-License-Identifier: MIT
// Logging. LKS_LOG checks the level before formatting anything, so a debug line in a hot path
// costs one comparison. Lines go to stderr with a prefix of time, level, rank, host and the
// command step (the rank is set once the process knows it; a world of one is rank 0).
#ifndef LKS_LOG_H
#define LKS_LOG_H

typedef enum {
  LKS_LOG_ERROR = 0,
  LKS_LOG_WARN = 1,
  LKS_LOG_INFO = 2,
  LKS_LOG_DEBUG = 3,
} lks_log_level;

extern int lks__log_level;

#define LKS_LOG(level, ...)                                    \
  do {                                                         \
    if ((int)(level) <= lks__log_level) lks__log((level), __VA_ARGS__); \
  } while (0)

void lks__log(lks_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void lks_log_set_level(lks_log_level level);
// Parses "error", "warn", "info", "debug"; returns -1 for anything else.
int lks_log_parse_level(const char *s);
void lks_log_set_rank(int rank);
// The command step in progress, shown in every line once set (0: none).
void lks_log_set_step(unsigned long long step);

#endif
