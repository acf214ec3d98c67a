// SPDX-License-Identifier: MIT
// Safetensors parser and (sharded) loader (see safetensors.h). Format: 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, optional
// "__metadata__"}, then the data section; offsets are relative to its start.
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

enum { MAX_HEADER = 100 * 1024 * 1024 };  // the format's own limit

void lks_st_tensors_free(lks_st_tensor *t, int n) {
  for (int i = 0; t && i < n; i++) free(t[i].name);
  free(t);
}

int64_t lks_st_numel(const lks_st_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
  return n;
}

static int by_begin(const void *a, const void *b) {
  const lks_st_tensor *x = *(const lks_st_tensor *const *)a, *y = *(const lks_st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_entry(const char *what, const char *name, json_t *v, size_t data_len,
                       lks_st_tensor *t) {
  if (!json_is_object(v))
    return lks_set_error(LKS_EFORMAT, "%s: tensor '%s': entry is not a JSON object", what, name);
  json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
         *offs = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
    return lks_set_error(LKS_EFORMAT,
                         "%s: tensor '%s': needs string 'dtype', arrays 'shape' and "
                         "'data_offsets'",
                         what, name);
  if (lks_dtype_parse(json_string_value(dt), &t->dtype) < 0)
    return lks_set_error(LKS_EUNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", what, name,
                         json_string_value(dt));
  size_t nd = json_array_size(shape);
  if (nd > LKS_ST_MAX_DIMS)
    return lks_set_error(LKS_EFORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", what, name,
                         nd, LKS_ST_MAX_DIMS);
  t->n_dims = (int)nd;
  uint64_t numel = 1;
  for (size_t d = 0; d < nd; d++) {
    json_t *e = json_array_get(shape, d);
    if (!json_is_integer(e) || json_integer_value(e) < 0)
      return lks_set_error(LKS_EFORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                           what, name, d);
    t->shape[d] = (int64_t)json_integer_value(e);
    if (t->shape[d] != 0 && numel > UINT64_MAX / 16 / (uint64_t)t->shape[d])
      return lks_set_error(LKS_EFORMAT, "%s: tensor '%s': shape is absurdly large", what, name);
    numel *= (uint64_t)t->shape[d];
  }
  if (json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
      !json_is_integer(json_array_get(offs, 1)))
    return lks_set_error(LKS_EFORMAT, "%s: tensor '%s': data_offsets must be [begin, end]", what,
                         name);
  json_int_t b = json_integer_value(json_array_get(offs, 0)),
             e = json_integer_value(json_array_get(offs, 1));
  if (b < 0 || e < b)
    return lks_set_error(LKS_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] are not a range",
                         what, name, (long long)b, (long long)e);
  if ((uint64_t)e > data_len)
    return lks_set_error(LKS_EFORMAT,
                         "%s: tensor '%s': data range [%lld, %lld) is outside the file's %zu data "
                         "bytes (truncated file?)",
                         what, name, (long long)b, (long long)e, data_len);
  t->begin = (size_t)b;
  t->end = (size_t)e;
  t->nbytes = t->end - t->begin;
  uint64_t want = numel * lks_dtype_size(t->dtype);
  if (want != t->nbytes)
    return lks_set_error(LKS_EFORMAT,
                         "%s: tensor '%s': %zu data bytes, but shape x %s needs %llu", what, name,
                         t->nbytes, lks_dtype_name(t->dtype), (unsigned long long)want);
  return 0;
}

int lks_st_parse(const uint8_t *buf, size_t len, const char *what, lks_st_tensor **out,
                 int *n_out) {
  *out = NULL;
  *n_out = 0;
  if (len < 8)
    return lks_set_error(LKS_EFORMAT, "%s: %zu bytes, too short for a safetensors header (truncated?)",
                         what, len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
  if (hlen > len - 8)
    return lks_set_error(LKS_EFORMAT,
                         "%s: header length %llu is beyond the end of the file (%zu bytes)", what,
                         (unsigned long long)hlen, len);
  if (hlen > MAX_HEADER)
    return lks_set_error(LKS_EFORMAT, "%s: header length %llu exceeds the format's limit of %d",
                         what, (unsigned long long)hlen, MAX_HEADER);
  json_error_t jerr;
  json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lks_set_error(LKS_EFORMAT, "%s: header is not valid JSON: %s (at byte %d)", what,
                         jerr.text, jerr.position);
  if (!json_is_object(root)) {
    json_decref(root);
    return lks_set_error(LKS_EFORMAT, "%s: header is not a JSON object", what);
  }
  const uint8_t *data = buf + 8 + hlen;
  size_t data_len = len - 8 - (size_t)hlen;
  size_t cap = json_object_size(root);
  lks_st_tensor *t = calloc(cap + 1, sizeof *t);
  lks_st_tensor **order = calloc(cap ? cap : 1, sizeof *order);
  int n = 0, rc = 0;
  if (!t || !order) {
    rc = lks_set_error(LKS_ENOMEM, "%s: out of memory", what);
    goto done;
  }
  const char *name;
  json_t *v;
  json_object_foreach(root, name, v) {
    if (strcmp(name, "__metadata__") == 0) {
      if (!json_is_object(v)) {
        rc = lks_set_error(LKS_EFORMAT, "%s: __metadata__ is not an object", what);
        goto done;
      }
      continue;
    }
    rc = parse_entry(what, name, v, data_len, &t[n]);
    if (rc < 0) goto done;
    t[n].name = strdup(name);
    if (!t[n].name) {
      rc = lks_set_error(LKS_ENOMEM, "%s: out of memory", what);
      goto done;
    }
    t[n].data = data + t[n].begin;
    order[n] = &t[n];
    n++;
  }
  qsort(order, (size_t)n, sizeof *order, by_begin);
  for (int i = 1; i < n; i++)
    if (order[i]->begin < order[i - 1]->end && order[i]->nbytes && order[i - 1]->nbytes) {
      rc = lks_set_error(LKS_EFORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                         what, order[i - 1]->name, order[i]->name);
      goto done;
    }
done:
  json_decref(root);
  free(order);
  if (rc < 0) {
    lks_st_tensors_free(t, n + 1);
    return rc;
  }
  *out = t;
  *n_out = n;
  return 0;
}

// ---- files ----

typedef struct {
  char *path;
  uint8_t *map;
  size_t len;
} st_file;

struct lks_safetensors {
  st_file *files;
  int n_files;
  lks_st_tensor *tensors;  // all files' tensors, sorted by name
  int n_tensors;
};

static int by_name(const void *a, const void *b) {
  return strcmp(((const lks_st_tensor *)a)->name, ((const lks_st_tensor *)b)->name);
}

// Sorts the tensors by name (for lookups) and refuses a name found in two files.
static int sort_and_check_unique(lks_safetensors *st) {
  qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, by_name);
  for (int i = 1; i < st->n_tensors; i++)
    if (strcmp(st->tensors[i].name, st->tensors[i - 1].name) == 0)
      return lks_set_error(LKS_EFORMAT, "tensor '%s' is in both %s and %s", st->tensors[i].name,
                           st->files[st->tensors[i - 1].file].path,
                           st->files[st->tensors[i].file].path);
  return 0;
}

static int map_file(const char *path, st_file *f) {
  f->path = strdup(path);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return lks_set_error(LKS_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return lks_set_error(LKS_EIO, "%s: not a regular file", path);
  }
  f->len = (size_t)sb.st_size;
  if (f->len) {
    void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      return lks_set_error(LKS_EIO, "%s: mmap failed: %s", path, strerror(errno));
    }
    f->map = m;
  }
  close(fd);
  return 0;
}

static int add_file(lks_safetensors *st, const char *path) {
  st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
  if (!nf) return lks_set_error(LKS_ENOMEM, "out of memory");
  st->files = nf;
  st_file *f = &st->files[st->n_files++];
  memset(f, 0, sizeof *f);
  LKS_TRY(map_file(path, f));
  lks_st_tensor *t;
  int n;
  LKS_TRY(lks_st_parse(f->map, f->len, path, &t, &n));
  lks_st_tensor *all = realloc(st->tensors, (size_t)(st->n_tensors + n + 1) * sizeof *all);
  if (!all) {
    lks_st_tensors_free(t, n);
    return lks_set_error(LKS_ENOMEM, "out of memory");
  }
  st->tensors = all;
  for (int i = 0; i < n; i++) {
    t[i].file = st->n_files - 1;
    st->tensors[st->n_tensors++] = t[i];
  }
  free(t);
  return 0;
}

static int load_index(lks_safetensors *st, const char *dir, const char *index_path) {
  json_error_t jerr;
  json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lks_set_error(LKS_EFORMAT, "%s: not valid JSON: %s (line %d)", index_path, jerr.text,
                         jerr.line);
  int rc = 0;
  json_t *map = json_object_get(root, "weight_map");
  if (!json_is_object(map)) {
    rc = lks_set_error(LKS_EFORMAT, "%s: no 'weight_map' object", index_path);
    goto done;
  }
  // Open each shard once, in the order of first mention.
  const char *name;
  json_t *v;
  json_object_foreach(map, name, v) {
    const char *file = json_string_value(v);
    if (!file || strchr(file, '/') || strcmp(file, "..") == 0) {
      rc = lks_set_error(LKS_EFORMAT, "%s: tensor '%s' maps to an invalid file name", index_path,
                         name);
      goto done;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    bool seen = false;
    for (int i = 0; i < st->n_files && !seen; i++) seen = strcmp(st->files[i].path, path) == 0;
    if (seen) continue;
    if (access(path, R_OK) != 0) {
      rc = lks_set_error(LKS_ENOTFOUND, "%s: shard '%s' is named in the index but absent (%s)",
                         index_path, file, strerror(errno));
      goto done;
    }
    if ((rc = add_file(st, path)) < 0) goto done;
  }
  if ((rc = sort_and_check_unique(st)) < 0) goto done;
  // Every tensor of the index must be in the shard the index names.
  json_object_foreach(map, name, v) {
    const lks_st_tensor *t = lks_safetensors_find(st, name);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
    if (!t || strcmp(st->files[t->file].path, path) != 0) {
      rc = lks_set_error(LKS_ENOTFOUND, "%s: tensor '%s' is not in shard '%s'", index_path, name,
                         json_string_value(v));
      goto done;
    }
  }
done:
  json_decref(root);
  return rc;
}

lks_safetensors *lks_safetensors_open(const char *path) {
  lks_safetensors *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  struct stat sb;
  if (stat(path, &sb) < 0) {
    lks_set_error(LKS_ENOTFOUND, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (S_ISDIR(sb.st_mode)) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
    if (access(p, F_OK) == 0) {
      if (load_index(st, path, p) < 0) goto fail;
    } else {
      snprintf(p, sizeof p, "%s/model.safetensors", path);
      if (access(p, F_OK) != 0) {
        lks_set_error(LKS_ENOTFOUND,
                      "%s: neither model.safetensors.index.json nor model.safetensors is there",
                      path);
        goto fail;
      }
      if (add_file(st, p) < 0) goto fail;
    }
  } else if (add_file(st, path) < 0) {
    goto fail;
  }
  if (sort_and_check_unique(st) < 0) goto fail;
  return st;
fail:
  lks_safetensors_close(st);
  return NULL;
}

void lks_safetensors_close(lks_safetensors *st) {
  if (!st) return;
  for (int i = 0; i < st->n_files; i++) {
    if (st->files[i].map) munmap(st->files[i].map, st->files[i].len);
    free(st->files[i].path);
  }
  free(st->files);
  lks_st_tensors_free(st->tensors, st->n_tensors);
  free(st);
}

int lks_safetensors_count(const lks_safetensors *st) { return st->n_tensors; }
const lks_st_tensor *lks_safetensors_at(const lks_safetensors *st, int i) {
  return &st->tensors[i];
}

const lks_st_tensor *lks_safetensors_find(const lks_safetensors *st, const char *name) {
  lks_st_tensor key = {.name = (char *)name};
  return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, by_name);
}

size_t lks_safetensors_file_bytes(const lks_safetensors *st) {
  size_t n = 0;
  for (int i = 0; i < st->n_files; i++) n += st->files[i].len;
  return n;
}

const void *lks_st_rows(const lks_st_tensor *t, int64_t row0, int64_t n_rows) {
  int64_t rows = t->n_dims ? t->shape[0] : 1;
  if (row0 < 0 || n_rows < 0 || row0 + n_rows > rows) {
    lks_set_error(LKS_ERANGE, "tensor '%s': rows [%lld, %lld) outside its %lld rows", t->name,
                  (long long)row0, (long long)(row0 + n_rows), (long long)rows);
    return NULL;
  }
  size_t row_bytes = rows ? t->nbytes / (size_t)rows : 0;
  return t->data + (size_t)row0 * row_bytes;
}

int lks_st_read_rows(const lks_st_tensor *t, int64_t row0, int64_t n_rows, void *dst) {
  const void *p = lks_st_rows(t, row0, n_rows);
  if (!p) return LKS_ERANGE;
  int64_t rows = t->n_dims ? t->shape[0] : 1;
  memcpy(dst, p, rows ? t->nbytes / (size_t)rows * (size_t)n_rows : 0);
  return 0;
}
