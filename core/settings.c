// SPDX-License-Identifier: MIT
// The one table of lockstep's settings, and its parser (see settings.h).
#include "core/settings.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

static const lks_setting_def defs[] = {
    {"model", 0, LKS_SET_STR, 0, 0, NULL, false,
     "model directory (Hugging Face layout); default: the model built with lockstep"},
    {"threads", 't', LKS_SET_INT, 0, 1024, "0", false,
     "CPU threads for the forward (0: one per online core)"},
    {"backend", 0, LKS_SET_STR, 0, 0, "cpu", false, "compute backend: cpu or cuda"},
    {"gpu", 0, LKS_SET_INT, -1, 1024, "-1", false,
     "cuda: the GPU of this rank (-1: the local rank modulo the visible GPUs)"},
    {"comm", 0, LKS_SET_STR, 0, 0, NULL, false,
     "collectives between ranks: mpi or nccl (unset: nccl with --backend cuda, else mpi)"},
    {"log-level", 0, LKS_SET_STR, 0, 0, "info", true, "error, warn, info or debug"},
    {"max-seq-len", 0, LKS_SET_INT, 16, 1 << 24, "4096", false,
     "longest sequence (prompt + generated) the KV cache holds"},
    {"kv-block", 0, LKS_SET_INT, 1, 1024, "16", false, "tokens per KV cache block"},
    {"kv-memory", 0, LKS_SET_STR, 0, 0, NULL, false,
     "memory for the KV cache on each rank: bytes (e.g. 8G, 512M) or a fraction of the available "
     "memory (e.g. 0.5); every rank measures, the smallest wins (unset: every slot at max-seq-len)"},
    {"kv-blocks", 0, LKS_SET_INT, 0, 1 << 30, "0", false,
     "KV cache blocks per cache (0: from --kv-memory, or every slot at max-seq-len)"},
    {"kv-dtype", 0, LKS_SET_STR, 0, 0, "f32", false,
     "KV cache elements: f32, or bf16 (half the memory and the bytes attention reads; each value "
     "rounded to nearest; cpu backend)"},
    {"experts-split", 0, LKS_SET_STR, 0, 0, "auto", false,
     "routed experts across ranks: blocks (each rank a block of whole experts), rows (each rank "
     "its rows of every expert: the same share of every token's experts, in more and smaller "
     "products), or auto (rows where the backend and the experts' quantization allow, else "
     "blocks)"},
    {"mmap", 0, LKS_SET_BOOL, 0, 0, "true", false,
     "read the weights in place from the mapped checkpoint files (false: copy them into the "
     "process's memory at load, which needs that much free memory and reads steadier where "
     "mapped files stream slower; cpu backend)"},
    {"prefix-cache", 0, LKS_SET_BOOL, 0, 0, "true", false,
     "keep the KV blocks of finished sequences and reuse them for prompts that start the same"},
    {"spec", 0, LKS_SET_STR, 0, 0, "off", true,
     "speculative decoding: off, mtp (the model's MTP layer), ngram (prompt lookup) or dflash (a "
     "DFlash block drafter, --draft-model)"},
    {"draft-model", 0, LKS_SET_STR, 0, 0, NULL, false,
     "--spec dflash: the DFlash drafter's directory (unset: MODEL/dflash)"},
    {"num-drafts", 'k', LKS_SET_INT, 1, 16, "3", true, "drafts per speculative round (at most)"},
    {"ladder", 0, LKS_SET_STR, 0, 0, "", true,
     "drafts by batch width, e.g. 4:3,8:3,16:1,32:1 (empty: --num-drafts at any width)"},
    {"spec-gate", 0, LKS_SET_BOOL, 0, 0, "true", true,
     "pick K per sequence (0: plain) from measured step costs and acceptance (false: the ladder's K)"},
    {"bind", 0, LKS_SET_STR, 0, 0, "127.0.0.1", false, "serve: the IPv4 address to listen on"},
    {"port", 0, LKS_SET_INT, 1, 65535, "8080", false, "serve: the HTTP port"},
    {"api-key", 0, LKS_SET_STR, 0, 0, NULL, false, "serve: a bearer key /v1 requires (unset: none)"},
    {"admin-token", 0, LKS_SET_STR, 0, 0, NULL, false,
     "serve: the bearer token of /admin (unset: /admin is refused)"},
    {"admin-token-file", 0, LKS_SET_STR, 0, 0, NULL, false,
     "serve: a file holding the /admin token (instead of --admin-token)"},
    {"max-queue", 0, LKS_SET_INT, 1, 1 << 20, "64", false,
     "serve: requests waiting for a slot; beyond, 429"},
    {"prefill-chunk", 0, LKS_SET_INT, 1, 1 << 20, "256", false,
     "serve: prompt tokens prefilled per step, over all sequences"},
    {"drain-grace", 0, LKS_SET_FLOAT, 0, 86400, "30", false,
     "serve: seconds a drain (SIGTERM, /admin/drain) waits for running requests"},
    {"max-body", 0, LKS_SET_INT, 1024, 1 << 30, "1048576", false,
     "serve: the largest request body, bytes; beyond, 413"},
    {"http-threads", 0, LKS_SET_INT, 1, 256, "4", false,
     "serve: threads of the HTTP event loop (epoll); a generation holds none while it waits"},
    {"max-connections", 0, LKS_SET_INT, 16, 1 << 20, "4096", false,
     "serve: open HTTP connections at most (capped by the file descriptor limit)"},
    {"max-conns-per-client", 0, LKS_SET_INT, 0, 1 << 20, "256", false,
     "serve: open HTTP connections per client address (0: no limit); beyond, refused"},
    {"idle-timeout", 0, LKS_SET_FLOAT, 1, 86400, "30", false,
     "serve: seconds an idle connection (no request in flight, nothing read or written) is kept"},
    {"request-timeout", 0, LKS_SET_FLOAT, 1, 86400, "30", false,
     "serve: seconds a client has to send a request's headers and body; beyond, it is closed"},
    {"control-host", 0, LKS_SET_STR, 0, 0, NULL, false,
     "the address (or name) of rank 0 that workers reach the control plane on; unset: "
     "loopback on one host, else the host name's address, else an interface address"},
    {"world", 0, LKS_SET_INT, 1, 1024, "1", false,
     "inspect: show how the model splits over this many ranks"},
    {"max-slots", 0, LKS_SET_INT, 1, 4096, "8", false, "sequence slots (concurrent sequences)"},
    {"heartbeat", 0, LKS_SET_FLOAT, 0.05, 60, "1", false,
     "seconds between heartbeats; a peer silent for three is dead"},
    {"collective-timeout", 0, LKS_SET_FLOAT, 0.1, 3600, "60", false,
     "deadline of every collective and control-plane wait, seconds"},
    {"prompt-ids", 0, LKS_SET_STR, 0, 0, NULL, false, "prompt as comma-separated token ids"},
    {"prompt", 0, LKS_SET_STR, 0, 0, NULL, false,
     "prompt as text (the model's tokenizer.json); the continuation is printed as text"},
    {"chat", 0, LKS_SET_STR, 0, 0, NULL, false,
     "one user message, rendered with GLM's chat template; the reply is printed as text"},
    {"system", 0, LKS_SET_STR, 0, 0, NULL, false, "--chat: a system message before it"},
    {"no-think", 0, LKS_SET_BOOL, 0, 0, "false", false,
     "--chat: thinking off (enable_thinking=false: /nothink, empty <think></think>)"},
    {"n", 'n', LKS_SET_INT, 0, 1 << 24, "32", false, "tokens to generate"},
    {"temperature", 0, LKS_SET_FLOAT, 0, 100, "0", true, "sampling temperature (0: greedy)"},
    {"top-k", 0, LKS_SET_INT, 0, 1 << 24, "0", true, "keep the k most likely tokens (0: all)"},
    {"top-p", 0, LKS_SET_FLOAT, 0, 1, "1", true, "nucleus sampling mass (1: all)"},
    {"seed", 0, LKS_SET_INT, 0, 4294967295.0, "0", false, "sampling seed"},
    {"ignore-eos", 0, LKS_SET_BOOL, 0, 0, "false", false, "do not stop at the model's eos ids"},
    {"prefill-len", 0, LKS_SET_INT, 1, 1 << 20, "128", false, "bench: prompt tokens to prefill"},
    {"decode-len", 0, LKS_SET_INT, 1, 1 << 20, "64", false, "bench: tokens to decode"},
    {"repeats", 0, LKS_SET_INT, 1, 1000, "3", false, "bench: repetitions (medians reported)"},
    {"prefill-lens", 0, LKS_SET_STR, 0, 0, "", false,
     "bench: more prompt lengths to time prefill at, e.g. 64,512"},
    {"batch", 0, LKS_SET_STR, 0, 0, "", false,
     "bench: decode widths, e.g. 1,4,16: that many sequences decoded together, greedy and sampled "
     "(T = 1, top-p 0.95), with the time picking tokens takes (at most --max-slots)"},
    {"help", 'h', LKS_SET_BOOL, 0, 0, "false", false, "print this help"},
};
enum { N_DEFS = sizeof defs / sizeof defs[0] };

typedef struct {
  char *text;  // NULL when unset
  long i;
  double f;
  bool b;
  const char *source;
} value;

struct lks_settings {
  value v[N_DEFS];
};

static int find(const char *name) {
  for (int i = 0; i < N_DEFS; i++)
    if (strcmp(defs[i].name, name) == 0) return i;
  return -1;
}

static int parse_value(const lks_setting_def *d, const char *text, value *out, const char *source) {
  char *end = NULL;
  errno = 0;
  switch (d->type) {
    case LKS_SET_INT: {
      long long x = strtoll(text, &end, 10);
      if (errno || end == text || *end)
        return lks_set_error(LKS_EINVAL, "%s: --%s expects an integer, got '%s'", source, d->name,
                             text);
      if ((double)x < d->min || (double)x > d->max)
        return lks_set_error(LKS_ERANGE, "%s: --%s = %lld is outside [%.0f, %.0f]", source,
                             d->name, x, d->min, d->max);
      out->i = (long)x;
      break;
    }
    case LKS_SET_FLOAT: {
      double x = strtod(text, &end);
      if (errno || end == text || *end || !isfinite(x))
        return lks_set_error(LKS_EINVAL, "%s: --%s expects a number, got '%s'", source, d->name,
                             text);
      if (x < d->min || x > d->max)
        return lks_set_error(LKS_ERANGE, "%s: --%s = %g is outside [%g, %g]", source, d->name, x,
                             d->min, d->max);
      out->f = x;
      break;
    }
    case LKS_SET_BOOL:
      if (!strcmp(text, "1") || !strcmp(text, "true") || !strcmp(text, "yes") ||
          !strcmp(text, "on"))
        out->b = true;
      else if (!strcmp(text, "0") || !strcmp(text, "false") || !strcmp(text, "no") ||
               !strcmp(text, "off"))
        out->b = false;
      else
        return lks_set_error(LKS_EINVAL, "%s: --%s expects true or false, got '%s'", source,
                             d->name, text);
      break;
    case LKS_SET_STR:
      break;
  }
  char *copy = strdup(text);
  if (!copy) return lks_set_error(LKS_ENOMEM, "out of memory");
  free(out->text);
  out->text = copy;
  out->source = source;
  return 0;
}

int lks_settings_set(lks_settings *s, const char *name, const char *text, const char *source) {
  int i = find(name);
  if (i < 0) return lks_set_error(LKS_EINVAL, "%s: unknown option --%s", source, name);
  return parse_value(&defs[i], text, &s->v[i], source);
}

lks_settings *lks_settings_new(void) {
  lks_settings *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  for (int i = 0; i < N_DEFS; i++) {
    if (defs[i].def && parse_value(&defs[i], defs[i].def, &s->v[i], "default") < 0) goto fail;
    char env[96] = "LKS_";
    size_t k = 4;
    for (const char *p = defs[i].name; *p && k < sizeof env - 1; p++)
      env[k++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    env[k] = '\0';
    const char *e = getenv(env);
    if (e && parse_value(&defs[i], e, &s->v[i], "environment") < 0) goto fail;
  }
  return s;
fail:
  lks_settings_free(s);
  return NULL;
}

void lks_settings_free(lks_settings *s) {
  if (!s) return;
  for (int i = 0; i < N_DEFS; i++) free(s->v[i].text);
  free(s);
}

int lks_settings_parse_args(lks_settings *s, int argc, char **argv, const char **pos, int max_pos,
                            int *n_pos) {
  *n_pos = 0;
  for (int a = 0; a < argc; a++) {
    const char *arg = argv[a];
    int i = -1;
    char name[96];
    const char *inline_val = NULL;
    if (arg[0] == '-' && arg[1] == '-' && arg[2]) {
      const char *eq = strchr(arg + 2, '=');
      size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
      if (len >= sizeof name) len = sizeof name - 1;
      memcpy(name, arg + 2, len);
      name[len] = '\0';
      if (eq) inline_val = eq + 1;
      i = find(name);
    } else if (arg[0] == '-' && arg[1] && !arg[2] && !isdigit((unsigned char)arg[1])) {
      for (int k = 0; k < N_DEFS; k++)
        if (defs[k].short_name == arg[1]) i = k;
      snprintf(name, sizeof name, "%s", arg + 1);
    } else {
      if (*n_pos >= max_pos)
        return lks_set_error(LKS_EINVAL, "unexpected argument '%s'", arg);
      pos[(*n_pos)++] = arg;
      continue;
    }
    if (i < 0) return lks_set_error(LKS_EINVAL, "unknown option '%s' (see --help)", arg);
    const char *val = inline_val;
    if (!val && defs[i].type == LKS_SET_BOOL) {
      // `--flag` alone is true; `--flag false` (or true/yes/no/on/off/1/0) takes the value.
      static const char *lit[] = {"true", "false", "yes", "no", "on", "off", "1", "0"};
      val = "true";
      for (size_t l = 0; a + 1 < argc && l < sizeof lit / sizeof lit[0]; l++)
        if (!strcmp(argv[a + 1], lit[l])) val = argv[++a];
    }
    if (!val) {
      if (a + 1 >= argc)
        return lks_set_error(LKS_EINVAL, "option --%s needs a value", defs[i].name);
      val = argv[++a];
    }
    LKS_TRY(parse_value(&defs[i], val, &s->v[i], "command line"));
  }
  return 0;
}

static const value *get(const lks_settings *s, const char *name, lks_setting_type type) {
  int i = find(name);
  // A name missing from the table is a bug in lockstep itself, not bad input.
  if (i < 0 || defs[i].type != type) {
    fprintf(stderr, "lockstep: internal error: setting '%s' not declared as used\n", name);
    abort();
  }
  return &s->v[i];
}

long lks_settings_int(const lks_settings *s, const char *n) { return get(s, n, LKS_SET_INT)->i; }
double lks_settings_float(const lks_settings *s, const char *n) {
  return get(s, n, LKS_SET_FLOAT)->f;
}
bool lks_settings_bool(const lks_settings *s, const char *n) { return get(s, n, LKS_SET_BOOL)->b; }
const char *lks_settings_str(const lks_settings *s, const char *n) {
  return get(s, n, LKS_SET_STR)->text;
}
const char *lks_settings_source(const lks_settings *s, const char *name) {
  int i = find(name);
  return i < 0 || !s->v[i].source ? "unset" : s->v[i].source;
}

void lks_settings_print_help(FILE *f) {
  for (int i = 0; i < N_DEFS; i++) {
    const lks_setting_def *d = &defs[i];
    char opt[64];
    if (d->short_name)
      snprintf(opt, sizeof opt, "-%c, --%s", d->short_name, d->name);
    else
      snprintf(opt, sizeof opt, "    --%s", d->name);
    fprintf(f, "  %-24s %s%s%s%s\n", opt, d->help, d->def ? " [" : "", d->def ? d->def : "",
            d->def ? "]" : "");
  }
}

void lks_settings_log(const lks_settings *s) {
  // One line: every setting with its value; those not at their default are marked with '*'.
  char line[2048];
  size_t k = 0;
  for (int i = 0; i < N_DEFS && k < sizeof line - 1; i++) {
    if (!strcmp(defs[i].name, "help")) continue;
    const value *v = &s->v[i];
    bool changed = v->source && strcmp(v->source, "default") != 0;
    int w = snprintf(line + k, sizeof line - k, "%s%s%s=%s", k ? " " : "", changed ? "*" : "",
                     defs[i].name, v->text ? v->text : "-");
    if (w < 0) break;
    k += (size_t)w;
  }
  LKS_LOG(LKS_LOG_INFO, "settings: %s", line);
}
