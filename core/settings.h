// SPDX-License-Identifier: MIT
// The settings table: every option of lockstep — name, type, bounds, default, help, and whether
// it may change at run time — is declared once in settings.c. The same table parses the command
// line (`--name value`, `--flag`), the environment (`LKS_NAME`, dashes as underscores), prints
// the help and the effective configuration. Precedence: default < environment < command line.
// Values are validated against type and bounds on every source; an invalid value is an error
// that names the setting and the source.
#ifndef LKS_SETTINGS_H
#define LKS_SETTINGS_H

#include <stdbool.h>
#include <stdio.h>

typedef enum { LKS_SET_INT, LKS_SET_FLOAT, LKS_SET_STR, LKS_SET_BOOL } lks_setting_type;

typedef struct lks_setting_def {
  const char *name;  // "threads" -> --threads, LKS_THREADS
  char short_name;   // 'n' -> -n, 0 when none
  lks_setting_type type;
  double min, max;  // bounds for INT and FLOAT
  const char *def;  // default, as text; NULL for "unset" (STR only)
  bool runtime;     // may change while serving
  const char *help;
} lks_setting_def;

typedef struct lks_settings lks_settings;

// A settings object holding the defaults of every setting, then the environment applied.
// Returns NULL (with lks_last_error()) when an environment variable is invalid.
lks_settings *lks_settings_new(void);
void lks_settings_free(lks_settings *s);

// Applies `--name value` arguments; the first non-option arguments are stored as positionals
// (at most max_pos, pointers into argv). Returns 0 or LKS_EINVAL with lks_last_error() naming
// the argument.
int lks_settings_parse_args(lks_settings *s, int argc, char **argv, const char **pos, int max_pos,
                            int *n_pos);
// Sets one setting from text (used by the parser, tests and later /admin).
int lks_settings_set(lks_settings *s, const char *name, const char *value, const char *source);

long lks_settings_int(const lks_settings *s, const char *name);
double lks_settings_float(const lks_settings *s, const char *name);
bool lks_settings_bool(const lks_settings *s, const char *name);
// NULL when unset.
const char *lks_settings_str(const lks_settings *s, const char *name);
// Where the value came from: "default", "environment", "command line" (or the source given
// to lks_settings_set); "unset" for a string setting without a value.
const char *lks_settings_source(const lks_settings *s, const char *name);

void lks_settings_print_help(FILE *f);
// Logs every setting with its value and source, once at startup.
void lks_settings_log(const lks_settings *s);

#endif
