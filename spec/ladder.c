// SPDX-License-Identifier: MIT
// The draft-count ladder (see spec.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "spec/spec.h"

int lks_ladder_parse(const char *text, lks_ladder *l) {
  memset(l, 0, sizeof *l);
  if (!text || !*text) return 0;
  if (strlen(text) >= LKS_LADDER_TEXT)
    return lks_set_error(LKS_EINVAL, "ladder: longer than %d characters", LKS_LADDER_TEXT - 1);
  const char *p = text;
  while (*p) {
    char *end;
    long w = strtol(p, &end, 10);
    if (end == p || *end != ':') goto bad;
    p = end + 1;
    long k = strtol(p, &end, 10);
    if (end == p || (*end && *end != ',') || (*end == ',' && !end[1])) goto bad;
    if (l->n == LKS_LADDER_MAX || w < 1 || k < 0 || k > LKS_MAX_DRAFTS ||
        (l->n && w <= l->width[l->n - 1]))
      goto bad;
    l->width[l->n] = (int)w;
    l->k[l->n++] = (int)k;
    p = *end ? end + 1 : end;
  }
  return 0;
bad:
  return lks_set_error(LKS_EINVAL,
                       "--ladder '%s': expected WIDTH:DRAFTS pairs with increasing widths and "
                       "drafts 0..%d, e.g. 4:3,8:3,16:1,32:1",
                       text, LKS_MAX_DRAFTS);
}

int lks_ladder_k(const lks_ladder *l, int width, int k_max) {
  if (l->n == 0) return k_max;
  for (int i = 0; i < l->n; i++)
    if (width <= l->width[i]) return l->k[i] < k_max ? l->k[i] : k_max;
  return 0;
}
