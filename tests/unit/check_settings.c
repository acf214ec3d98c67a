// SPDX-License-Identifier: MIT
// The settings table: defaults, the command line (`--name value`, `--name=value`, `-n 5`,
// boolean flags, positionals), the environment (LKS_<NAME>) and its precedence below the command
// line, and the refusals — out-of-bounds and non-numeric values, unknown options, missing
// values — each with a message that names the option.
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/settings.h"

extern char **environ;

static lks_settings *st;

// Tests start from an environment without LKS_* variables (fork mode: the child's own copy).
static void clear_lks_env(void) {
  for (;;) {
    char name[256] = "";
    for (char **e = environ; e && *e; e++)
      if (strncmp(*e, "LKS_", 4) == 0) {
        size_t n = strcspn(*e, "=");
        if (n >= sizeof name) n = sizeof name - 1;
        memcpy(name, *e, n);
        name[n] = '\0';
        break;
      }
    if (!name[0]) return;
    unsetenv(name);
  }
}

static void setup(void) {
  clear_lks_env();
  st = NULL;
}

static void teardown(void) { lks_settings_free(st); }

static lks_settings *fresh(void) {
  lks_settings_free(st);
  st = lks_settings_new();
  ck_assert_msg(st != NULL, "lks_settings_new: %s", lks_last_error());
  return st;
}

// Parses a NULL-terminated argument list with room for max_pos positionals.
static int parse_n(lks_settings *s, const char **pos, int max_pos, int *n_pos, char **argv) {
  int argc = 0;
  while (argv[argc]) argc++;
  lks_clear_error();
  return lks_settings_parse_args(s, argc, argv, pos, max_pos, n_pos);
}
#define PARSE(s, ...) \
  parse_n((s), pos, 4, &n_pos, (char *[]){__VA_ARGS__, NULL})

#define ck_assert_error_names(what)                                                   \
  ck_assert_msg(strstr(lks_last_error(), (what)) != NULL, "error '%s' does not name '%s'", \
                lks_last_error(), (what))

START_TEST(test_defaults) {
  lks_settings *s = fresh();
  ck_assert_int_eq(lks_settings_int(s, "threads"), 0);
  ck_assert_int_eq(lks_settings_int(s, "max-seq-len"), 4096);
  ck_assert_int_eq(lks_settings_int(s, "kv-block"), 16);
  ck_assert_int_eq(lks_settings_int(s, "n"), 32);
  ck_assert_int_eq(lks_settings_int(s, "top-k"), 0);
  ck_assert_int_eq(lks_settings_int(s, "seed"), 0);
  ck_assert_double_eq(lks_settings_float(s, "temperature"), 0.0);
  ck_assert_double_eq(lks_settings_float(s, "top-p"), 1.0);
  ck_assert(!lks_settings_bool(s, "ignore-eos"));
  ck_assert(!lks_settings_bool(s, "help"));
  ck_assert_str_eq(lks_settings_str(s, "backend"), "cpu");
  ck_assert_str_eq(lks_settings_str(s, "log-level"), "info");
  ck_assert_ptr_null(lks_settings_str(s, "model"));
  ck_assert_ptr_null(lks_settings_str(s, "prompt-ids"));
  ck_assert_str_eq(lks_settings_source(s, "threads"), "default");
  ck_assert_str_eq(lks_settings_source(s, "temperature"), "default");
}
END_TEST

START_TEST(test_command_line_forms) {
  lks_settings *s = fresh();
  const char *pos[4];
  int n_pos = -1;
  ck_assert_int_eq(PARSE(s, "--threads", "4", "--temperature=0.7", "-n", "5", "--model",
                         "/models/x", "--top-p=0.25", "-t", "3", "--log-level=debug"),
                   0);
  ck_assert_int_eq(n_pos, 0);
  ck_assert_int_eq(lks_settings_int(s, "threads"), 3);  // the last one wins
  ck_assert_double_eq_tol(lks_settings_float(s, "temperature"), 0.7, 1e-12);
  ck_assert_int_eq(lks_settings_int(s, "n"), 5);
  ck_assert_str_eq(lks_settings_str(s, "model"), "/models/x");
  ck_assert_double_eq_tol(lks_settings_float(s, "top-p"), 0.25, 1e-12);
  ck_assert_str_eq(lks_settings_str(s, "log-level"), "debug");
  ck_assert_str_eq(lks_settings_source(s, "threads"), "command line");
  ck_assert_str_eq(lks_settings_source(s, "top-k"), "default");
  // A value may itself start with a dash, and an inline value may contain '='.
  ck_assert_int_eq(PARSE(s, "--prompt-ids", "-1,2", "--model=a=b"), 0);
  ck_assert_str_eq(lks_settings_str(s, "prompt-ids"), "-1,2");
  ck_assert_str_eq(lks_settings_str(s, "model"), "a=b");
  // Bounds are inclusive.
  ck_assert_int_eq(PARSE(s, "--seed", "4294967295", "--threads", "1024", "--top-p", "0"), 0);
  ck_assert_int_eq(lks_settings_int(s, "seed"), 4294967295L);
  ck_assert_int_eq(lks_settings_int(s, "threads"), 1024);
  ck_assert_double_eq(lks_settings_float(s, "top-p"), 0.0);
}
END_TEST

START_TEST(test_bool_flags) {
  lks_settings *s = fresh();
  const char *pos[4];
  int n_pos;
  ck_assert_int_eq(PARSE(s, "--ignore-eos"), 0);
  ck_assert(lks_settings_bool(s, "ignore-eos"));
  ck_assert_int_eq(PARSE(s, "--ignore-eos=false"), 0);
  ck_assert(!lks_settings_bool(s, "ignore-eos"));
  ck_assert_int_eq(PARSE(s, "--ignore-eos=yes"), 0);
  ck_assert(lks_settings_bool(s, "ignore-eos"));
  ck_assert_int_eq(PARSE(s, "--ignore-eos=0"), 0);
  ck_assert(!lks_settings_bool(s, "ignore-eos"));
  ck_assert_int_eq(PARSE(s, "-h"), 0);
  ck_assert(lks_settings_bool(s, "help"));
  // A flag takes no separate value: the next argument stays an argument.
  ck_assert_int_eq(PARSE(s, "--ignore-eos", "dir"), 0);
  ck_assert(lks_settings_bool(s, "ignore-eos"));
  ck_assert_int_eq(n_pos, 1);
  ck_assert_str_eq(pos[0], "dir");
  ck_assert_int_eq(PARSE(s, "--ignore-eos=maybe"), LKS_EINVAL);
  ck_assert_error_names("ignore-eos");
  ck_assert(lks_settings_bool(s, "ignore-eos"));
}
END_TEST

START_TEST(test_environment) {
  setenv("LKS_THREADS", "6", 1);
  setenv("LKS_TOP_P", "0.5", 1);
  setenv("LKS_MAX_SEQ_LEN", "128", 1);  // dashes become underscores
  setenv("LKS_IGNORE_EOS", "1", 1);
  setenv("LKS_MODEL", "/env/model", 1);
  setenv("LKS_TEMPERATURE", "0.9", 1);
  lks_settings *s = fresh();
  ck_assert_int_eq(lks_settings_int(s, "threads"), 6);
  ck_assert_double_eq_tol(lks_settings_float(s, "top-p"), 0.5, 1e-12);
  ck_assert_int_eq(lks_settings_int(s, "max-seq-len"), 128);
  ck_assert(lks_settings_bool(s, "ignore-eos"));
  ck_assert_str_eq(lks_settings_str(s, "model"), "/env/model");
  ck_assert_str_eq(lks_settings_source(s, "threads"), "environment");
  ck_assert_str_eq(lks_settings_source(s, "n"), "default");
  // The command line wins over the environment; what it does not name keeps the env value.
  const char *pos[4];
  int n_pos;
  ck_assert_int_eq(PARSE(s, "--threads", "2", "--temperature=0", "--ignore-eos=off"), 0);
  ck_assert_int_eq(lks_settings_int(s, "threads"), 2);
  ck_assert_str_eq(lks_settings_source(s, "threads"), "command line");
  ck_assert_double_eq(lks_settings_float(s, "temperature"), 0.0);
  ck_assert(!lks_settings_bool(s, "ignore-eos"));
  ck_assert_double_eq_tol(lks_settings_float(s, "top-p"), 0.5, 1e-12);
  ck_assert_str_eq(lks_settings_source(s, "top-p"), "environment");
}
END_TEST

START_TEST(test_environment_invalid) {
  static const struct {
    const char *var, *value, *names;
  } bad[] = {
      {"LKS_THREADS", "abc", "threads"},     {"LKS_THREADS", "5000", "threads"},
      {"LKS_TOP_P", "2", "top-p"},           {"LKS_KV_BLOCK", "0", "kv-block"},
      {"LKS_IGNORE_EOS", "sure", "ignore-eos"}, {"LKS_TEMPERATURE", "", "temperature"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    clear_lks_env();
    setenv(bad[i].var, bad[i].value, 1);
    lks_clear_error();
    lks_settings *s = lks_settings_new();
    ck_assert_msg(s == NULL, "%s=%s accepted", bad[i].var, bad[i].value);
    ck_assert_error_names(bad[i].names);
    ck_assert_error_names("environment");
  }
}
END_TEST

START_TEST(test_values_rejected) {
  static const struct {
    const char *opt, *value;
    int err;
  } bad[] = {
      {"--threads", "2000", LKS_ERANGE},       {"--threads", "-1", LKS_ERANGE},
      {"--max-seq-len", "8", LKS_ERANGE},      {"--kv-block", "0", LKS_ERANGE},
      {"--seed", "4294967296", LKS_ERANGE},    {"--seed", "-1", LKS_ERANGE},
      {"--temperature", "-0.5", LKS_ERANGE},   {"--temperature", "101", LKS_ERANGE},
      {"--top-p", "1.5", LKS_ERANGE},          {"--top-k", "-3", LKS_ERANGE},
      {"--threads", "abc", LKS_EINVAL},        {"--threads", "5x", LKS_EINVAL},
      {"--threads", "", LKS_EINVAL},           {"--threads", "2.5", LKS_EINVAL},
      {"--threads", "99999999999999999999", LKS_EINVAL},
      {"--n", "1e3", LKS_EINVAL},              {"--temperature", "warm", LKS_EINVAL},
      {"--temperature", "nan", LKS_EINVAL},    {"--temperature", "inf", LKS_EINVAL},
      {"--top-p", "0.5.1", LKS_EINVAL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lks_settings *s = fresh();
    const char *pos[4];
    int n_pos;
    char inline_arg[128];
    snprintf(inline_arg, sizeof inline_arg, "%s=%s", bad[i].opt, bad[i].value);
    for (int form = 0; form < 2; form++) {
      int rc = form == 0 ? PARSE(s, (char *)bad[i].opt, (char *)bad[i].value)
                         : PARSE(s, inline_arg);
      ck_assert_msg(rc == bad[i].err, "%s %s: got %d, want %d", bad[i].opt, bad[i].value, rc,
                    bad[i].err);
      ck_assert_error_names(bad[i].opt + 2);
      ck_assert_error_names("command line");
    }
    // The setting keeps its value.
    ck_assert_str_eq(lks_settings_source(s, bad[i].opt + 2), "default");
  }
  lks_settings *s = fresh();
  ck_assert_int_eq(lks_settings_set(s, "threads", "4096", "admin"), LKS_ERANGE);
  ck_assert_error_names("threads");
  ck_assert_error_names("admin");
  ck_assert_int_eq(lks_settings_int(s, "threads"), 0);
  ck_assert_int_eq(lks_settings_set(s, "threads", "12", "admin"), 0);
  ck_assert_int_eq(lks_settings_int(s, "threads"), 12);
  ck_assert_str_eq(lks_settings_source(s, "threads"), "admin");
  ck_assert_int_eq(lks_settings_set(s, "no-such", "1", "admin"), LKS_EINVAL);
  ck_assert_error_names("no-such");
}
END_TEST

START_TEST(test_unknown_and_missing) {
  lks_settings *s = fresh();
  const char *pos[4];
  int n_pos;
  ck_assert_int_eq(PARSE(s, "--bogus", "1"), LKS_EINVAL);
  ck_assert_error_names("bogus");
  ck_assert_int_eq(PARSE(s, "--bogus=1"), LKS_EINVAL);
  ck_assert_error_names("bogus");
  ck_assert_int_eq(PARSE(s, "-z"), LKS_EINVAL);
  ck_assert_error_names("-z");
  ck_assert_int_eq(PARSE(s, "--thread", "2"), LKS_EINVAL);  // no prefix matching
  ck_assert_error_names("thread");
  // An option at the end without its value.
  ck_assert_int_eq(PARSE(s, "--threads"), LKS_EINVAL);
  ck_assert_error_names("threads");
  ck_assert_int_eq(PARSE(s, "-n"), LKS_EINVAL);
  ck_assert_error_names("n");
  ck_assert_int_eq(lks_settings_int(s, "threads"), 0);
}
END_TEST

START_TEST(test_positionals) {
  lks_settings *s = fresh();
  const char *pos[4] = {0};
  int n_pos = -1;
  ck_assert_int_eq(PARSE(s, "generate", "--threads", "2", "model-dir", "-5", "-"), 0);
  ck_assert_int_eq(n_pos, 4);
  ck_assert_str_eq(pos[0], "generate");
  ck_assert_str_eq(pos[1], "model-dir");
  ck_assert_str_eq(pos[2], "-5");  // a negative number is an argument, not an option
  ck_assert_str_eq(pos[3], "-");
  ck_assert_int_eq(lks_settings_int(s, "threads"), 2);
  // More than max_pos: refused, naming the argument.
  ck_assert_int_eq(PARSE(s, "a", "b", "c", "d", "e"), LKS_EINVAL);
  ck_assert_error_names("'e'");
  n_pos = -1;
  ck_assert_int_eq(lks_settings_parse_args(s, 0, (char *[]){NULL}, pos, 4, &n_pos), 0);
  ck_assert_int_eq(n_pos, 0);
  ck_assert_int_eq(lks_settings_parse_args(s, 1, (char *[]){"x", NULL}, pos, 0, &n_pos),
                   LKS_EINVAL);
}
END_TEST

START_TEST(test_help_and_log) {
  lks_settings *s = fresh();
  FILE *f = tmpfile();
  ck_assert_ptr_nonnull(f);
  lks_settings_print_help(f);
  long n = ftell(f);
  ck_assert_int_gt(n, 0);
  char *text = calloc(1, (size_t)n + 1);
  rewind(f);
  ck_assert_uint_eq(fread(text, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  ck_assert_ptr_nonnull(strstr(text, "-t, --threads"));
  ck_assert_ptr_nonnull(strstr(text, "--max-seq-len"));
  ck_assert_ptr_nonnull(strstr(text, "[4096]"));
  free(text);
  lks_settings_log(s);
  lks_settings_free(NULL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("settings");
  TCase *tc = tcase_create("settings");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_command_line_forms);
  tcase_add_test(tc, test_bool_flags);
  tcase_add_test(tc, test_environment);
  tcase_add_test(tc, test_environment_invalid);
  tcase_add_test(tc, test_values_rejected);
  tcase_add_test(tc, test_unknown_and_missing);
  tcase_add_test(tc, test_positionals);
  tcase_add_test(tc, test_help_and_log);
  suite_add_tcase(s, tc);

  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
