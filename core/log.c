// SPDX-License-Identifier: MIT
// Logging to stderr (see log.h). One fprintf per line so that lines of concurrent threads and
// ranks do not interleave mid-line.
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int lks__log_level = LKS_LOG_INFO;
static int log_rank = 0;
static _Atomic unsigned long long log_step = 0;

void lks_log_set_level(lks_log_level level) { lks__log_level = (int)level; }
void lks_log_set_rank(int rank) { log_rank = rank; }
void lks_log_set_step(unsigned long long step) { log_step = step; }

int lks_log_parse_level(const char *s) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

void lks__log(lks_log_level level, const char *fmt, ...) {
  static const char tag[] = "EWID";
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  unsigned long long step = log_step;
  char where[32] = "";
  if (step) snprintf(where, sizeof where, " step %llu", step);
  fprintf(stderr, "%02d:%02d:%02d.%03ld %c [rank %d %s%s] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
          ts.tv_nsec / 1000000, tag[level], log_rank, host, where, msg);
}
