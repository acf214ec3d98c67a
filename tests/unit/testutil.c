// SPDX-License-Identifier: MIT
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *tu_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  char tmpl[512];
  snprintf(tmpl, sizeof tmpl, "%s/lks-test-XXXXXX", base && *base ? base : "/tmp");
  char *d = mkdtemp(tmpl);
  if (!d) {
    perror("mkdtemp");
    exit(2);
  }
  return strdup(d);
}

void tu_write(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n) {
    perror(path);
    exit(2);
  }
  fclose(f);
}

void tu_write_st(const char *path, const char *header, const void *data, size_t data_len) {
  size_t h = strlen(header), padded = (h + 7) / 8 * 8;
  size_t total = 8 + padded + data_len;
  unsigned char *buf = malloc(total);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(padded >> (8 * i));
  memcpy(buf + 8, header, h);
  memset(buf + 8 + h, ' ', padded - h);
  if (data_len) memcpy(buf + 8 + padded, data, data_len);
  tu_write(path, buf, total);
  free(buf);
}

int tu_gen_model(const char *dir, const char *args) {
  const char *py = getenv("LKS_PYTHON"), *src = getenv("LKS_SOURCE_DIR");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s %s/tools/gen_model.py --out %s %s > /dev/null",
           py ? py : "/usr/bin/python3", src ? src : ".", dir, args);
  return system(cmd);
}

uint64_t tu_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

float tu_randf(uint64_t *s) { return (float)((double)(tu_rand(s) >> 11) * 0x1.0p-52 - 1.0); }
