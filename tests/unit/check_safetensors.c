// SPDX-License-Identifier: MIT
// The safetensors loader and the model loader against hostile and broken files: each is refused
// with its own message, and nothing crashes (run under ASan/UBSan in CI). Also the row-range API
// on a good file, and sharded sets.
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "testutil.h"

static char *dir;
static char path[1024];

static void setup(void) { dir = tu_tmpdir(); }
static void teardown(void) {
  char cmd[1100];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  free(dir);
}

static const char *file(const char *name) {
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return path;
}

// Opening must fail, and the message must contain `want`.
static void expect_refused(const char *p, const char *want) {
  lks_clear_error();
  lks_safetensors *st = lks_safetensors_open(p);
  ck_assert_msg(st == NULL, "%s was accepted", p);
  ck_assert_msg(strstr(lks_last_error(), want) != NULL, "message '%s' lacks '%s'", lks_last_error(),
                want);
}

static const float data16[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

START_TEST(good_file_and_rows) {
  tu_write_st(file("a.safetensors"),
              "{\"__metadata__\":{\"format\":\"pt\"},"
              "\"w\":{\"dtype\":\"F32\",\"shape\":[4,3],\"data_offsets\":[0,48]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[48,64]}}",
              data16, sizeof data16);
  lks_safetensors *st = lks_safetensors_open(file("a.safetensors"));
  ck_assert_ptr_nonnull(st);
  ck_assert_int_eq(lks_safetensors_count(st), 2);
  const lks_st_tensor *w = lks_safetensors_find(st, "w");
  ck_assert_ptr_nonnull(w);
  ck_assert_int_eq(w->n_dims, 2);
  ck_assert_int_eq(w->shape[0], 4);
  ck_assert_int_eq(w->dtype, LKS_F32);
  const float *r = lks_st_rows(w, 2, 2);
  ck_assert_ptr_nonnull(r);
  ck_assert_float_eq(r[0], 6);
  ck_assert_float_eq(r[5], 11);
  float copy[3];
  ck_assert_int_eq(lks_st_read_rows(w, 1, 1, copy), 0);
  ck_assert_float_eq(copy[0], 3);
  ck_assert_float_eq(copy[2], 5);
  ck_assert_ptr_null(lks_st_rows(w, 3, 2));
  ck_assert_ptr_nonnull(strstr(lks_last_error(), "outside its 4 rows"));
  ck_assert_int_lt(lks_st_read_rows(w, -1, 1, copy), 0);
  ck_assert_ptr_null(lks_safetensors_find(st, "missing"));
  lks_safetensors_close(st);
}
END_TEST

START_TEST(truncated_file) {
  tu_write(file("t.safetensors"), "\x10\x00\x00", 3);
  expect_refused(file("t.safetensors"), "too short");
}
END_TEST

START_TEST(header_beyond_file) {
  unsigned char b[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
  tu_write(file("h.safetensors"), b, sizeof b);
  expect_refused(file("h.safetensors"), "beyond the end of the file");
}
END_TEST

START_TEST(header_not_json) {
  tu_write_st(file("j.safetensors"), "{\"w\": {\"dtype\": \"F32\", ", NULL, 0);
  expect_refused(file("j.safetensors"), "not valid JSON");
  tu_write_st(file("k.safetensors"), "[1, 2, 3]", NULL, 0);
  expect_refused(file("k.safetensors"), "not a JSON object");
}
END_TEST

START_TEST(unknown_dtype) {
  tu_write_st(file("d.safetensors"), "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,16]}}",
              data16, 16);
  expect_refused(file("d.safetensors"), "unknown dtype 'Q4_K'");
}
END_TEST

START_TEST(range_outside_file) {
  tu_write_st(file("r.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]}}",
              data16, 32);  // the data section was cut short
  expect_refused(file("r.safetensors"), "outside the file");
}
END_TEST

START_TEST(overlapping_ranges) {
  tu_write_st(file("o.safetensors"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[16,48]}}",
              data16, sizeof data16);
  expect_refused(file("o.safetensors"), "overlap");
}
END_TEST

START_TEST(size_mismatch) {
  tu_write_st(file("s.safetensors"), "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4,4],\"data_offsets\":[0,16]}}",
              data16, 16);
  expect_refused(file("s.safetensors"), "shape x BF16 needs 32");
}
END_TEST

START_TEST(malformed_entries) {
  tu_write_st(file("e1.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}",
              data16, 16);
  expect_refused(file("e1.safetensors"), "not a non-negative integer");
  tu_write_st(file("e2.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}",
              data16, 16);
  expect_refused(file("e2.safetensors"), "not a range");
  tu_write_st(file("e3.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"shape\":[4]}}", data16, 16);
  expect_refused(file("e3.safetensors"), "data_offsets");
  tu_write_st(file("e4.safetensors"),
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
              data16, 16);
  expect_refused(file("e4.safetensors"), "not valid JSON");  // duplicate key
  tu_write_st(file("e5.safetensors"),
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,16]}}",
              data16, 16);
  expect_refused(file("e5.safetensors"), "absurdly large");
}
END_TEST

START_TEST(missing_file_and_dir) {
  expect_refused(file("nope.safetensors"), "No such file");
  expect_refused(dir, "neither model.safetensors.index.json nor model.safetensors");
}
END_TEST

static void write_index(const char *json) { tu_write(file("model.safetensors.index.json"), json, strlen(json)); }

START_TEST(sharded_sets) {
  tu_write_st(file("s1.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
              data16, 16);
  tu_write_st(file("s2.safetensors"), "{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
              data16 + 4, 16);
  write_index("{\"metadata\":{},\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
  lks_safetensors *st = lks_safetensors_open(dir);
  ck_assert_ptr_nonnull(st);
  const lks_st_tensor *b = lks_safetensors_find(st, "b");
  ck_assert_ptr_nonnull(b);
  ck_assert_float_eq(((const float *)b->data)[0], 4);
  lks_safetensors_close(st);
  // A shard named in the index but absent.
  write_index("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}");
  expect_refused(dir, "shard 's3.safetensors' is named in the index but absent");
  // The index names the wrong shard for a tensor.
  write_index("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\"}}");
  expect_refused(dir, "tensor 'b' is not in shard 's1.safetensors'");
  // A file name that escapes the directory.
  write_index("{\"weight_map\":{\"a\":\"../s1.safetensors\"}}");
  expect_refused(dir, "invalid file name");
  write_index("{\"weight_map\": 3}");
  expect_refused(dir, "no 'weight_map'");
  // The same tensor in two shards.
  tu_write_st(file("s2.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
              data16 + 4, 16);
  write_index("{\"weight_map\":{\"a\":\"s1.safetensors\",\"x\":\"s2.safetensors\"}}");
  expect_refused(dir, "tensor 'a' is in both");
}
END_TEST

// ---- the model loader: tensors against config.json ----

static void edit_config(const char *key, json_t *value) {
  json_error_t e;
  json_t *root = json_load_file(file("config.json"), 0, &e);
  ck_assert_ptr_nonnull(root);
  json_object_set_new(root, key, value);
  ck_assert_int_eq(json_dump_file(root, file("config.json"), JSON_INDENT(1)), 0);
  json_decref(root);
}

static void expect_model_refused(const char *want) {
  lks_backend *be = lks_backend_new("cpu", 1);
  lks_clear_error();
  lks_model *m = lks_model_load(dir, be, NULL, NULL);
  ck_assert_msg(m == NULL, "model was accepted");
  ck_assert_msg(strstr(lks_last_error(), want) != NULL, "message '%s' lacks '%s'", lks_last_error(),
                want);
  lks_backend_free(be);
}

START_TEST(model_missing_tensor_and_bad_shape) {
  ck_assert_int_eq(tu_gen_model(dir, "--layers 2 --vocab 64 --hidden 32 --heads 2 --kv-heads 1 "
                                     "--head-dim 16 --experts 4 --topk 2 --moe-inter 16 --inter 32"),
                   0);
  lks_backend *be = lks_backend_new("cpu", 1);
  lks_model *m = lks_model_load(dir, be, NULL, NULL);
  ck_assert_msg(m != NULL, "%s", lks_last_error());
  lks_model_free(m);
  lks_backend_free(be);
  // config.json says there are more layers than the file holds.
  edit_config("num_hidden_layers", json_integer(3));
  expect_model_refused("missing tensor 'model.layers.3.");  // layer 2 is now a target layer; the MTP layer moves to 3
  edit_config("num_hidden_layers", json_integer(2));
  // A tensor whose shape disagrees with config.json.
  edit_config("moe_intermediate_size", json_integer(24));
  expect_model_refused("has shape [16, 32], config.json implies [24, 32]");
  edit_config("moe_intermediate_size", json_integer(16));
  // Every problem is reported to inspect's callback, not just the first.
  edit_config("intermediate_size", json_integer(40));
  edit_config("vocab_size", json_integer(65));
  expect_model_refused("problems with the weights");
}
END_TEST

int main(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("files");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, good_file_and_rows);
  tcase_add_test(tc, truncated_file);
  tcase_add_test(tc, header_beyond_file);
  tcase_add_test(tc, header_not_json);
  tcase_add_test(tc, unknown_dtype);
  tcase_add_test(tc, range_outside_file);
  tcase_add_test(tc, overlapping_ranges);
  tcase_add_test(tc, size_mismatch);
  tcase_add_test(tc, malformed_entries);
  tcase_add_test(tc, missing_file_and_dir);
  tcase_add_test(tc, sharded_sets);
  tcase_add_test(tc, model_missing_tensor_and_bad_shape);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
