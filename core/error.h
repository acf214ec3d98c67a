// SPDX-License-Identifier: MIT
// Error codes of lockstep. Every fallible function returns 0 or a negative LKS_E* code; the codes
// and their messages come from one X-macro table so that lks_strerror() never falls out of step.
// A failing function also records a human-readable message (what exactly was wrong: the file,
// the field, the tensor) with lks_set_error(); callers read it with lks_last_error(). The message
// is per thread, so a worker thread's failure does not clobber the main thread's.
#ifndef LKS_ERROR_H
#define LKS_ERROR_H

#define LKS_ERRORS(X)                                            \
  X(LKS_OK, 0, "success")                                        \
  X(LKS_EINVAL, -1, "invalid argument")                          \
  X(LKS_ENOMEM, -2, "out of memory")                             \
  X(LKS_EIO, -3, "input/output error")                           \
  X(LKS_EFORMAT, -4, "malformed file")                           \
  X(LKS_ENOTFOUND, -5, "not found")                              \
  X(LKS_EUNSUPPORTED, -6, "unsupported")                         \
  X(LKS_ESHAPE, -7, "shape mismatch")                            \
  X(LKS_ECONFIG, -8, "invalid configuration")                    \
  X(LKS_ERANGE, -9, "value out of range")                        \
  X(LKS_EFULL, -10, "capacity exhausted")                        \
  X(LKS_EBACKEND, -11, "backend failure")

enum {
#define LKS_ERR_ENUM(name, code, msg) name = code,
  LKS_ERRORS(LKS_ERR_ENUM)
#undef LKS_ERR_ENUM
};

// The generic message of an error code ("malformed file"); never NULL.
const char *lks_strerror(int err);

// Records the detailed message of the current failure (printf-style), logs it at debug level
// and returns `err` so that `return lks_set_error(LKS_EFORMAT, "...")` reads naturally.
int lks_set_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// The last message recorded by lks_set_error() on this thread ("" when none).
const char *lks_last_error(void);
void lks_clear_error(void);

// Propagates an error, logging where it passed through.
#define LKS_TRY(expr)                                                              \
  do {                                                                             \
    int lks__rc = (expr);                                                          \
    if (lks__rc < 0) {                                                             \
      lks__trace(__FILE__, __LINE__, #expr, lks__rc);                              \
      return lks__rc;                                                              \
    }                                                                              \
  } while (0)

void lks__trace(const char *file, int line, const char *expr, int rc);

#endif
