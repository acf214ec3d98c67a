// SPDX-License-Identifier: MIT
// The error table and the per-thread "last error" message (see error.h).
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/log.h"

static _Thread_local char last_msg[1024];

const char *lks_strerror(int err) {
  switch (err) {
#define LKS_ERR_CASE(name, code, msg) \
  case code:                          \
    return msg;
    LKS_ERRORS(LKS_ERR_CASE)
#undef LKS_ERR_CASE
  }
  return "unknown error";
}

int lks_set_error(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  LKS_LOG(LKS_LOG_DEBUG, "error %s: %s", lks_strerror(err), last_msg);
  return err;
}

const char *lks_last_error(void) { return last_msg; }

void lks_clear_error(void) { last_msg[0] = '\0'; }

void lks__trace(const char *file, int line, const char *expr, int rc) {
  LKS_LOG(LKS_LOG_DEBUG, "%s:%d: %s -> %s", file, line, expr, lks_strerror(rc));
}
