/*
 * test_safetensors.c - safetensors reader/writer: round trips of every dtype,
 * chunked streaming, writer misuse, and every kind of malformed file the
 * reader must refuse with a clear message. Also SHA-256 test vectors (the
 * checkpoint checksums).
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/store/safetensors.h"
#include "orchestrator/store/sha256.h"
#include "tests/test_util.h"

static char dir[256];
static char path[300];

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "st");
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
}

static void teardown(void) { test_rmdir(dir); }

/* Number of temp files the writer left beside path ("t.safetensors.tmp*"). */
static int temp_files(void) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, "t.safetensors.tmp", 17) == 0;
    closedir(d);
    return n;
}

/* Write 8-byte length (hlen_override when != UINT64_MAX), header, data. */
static void write_raw(const char *p, const char *hdr, uint64_t hlen_override,
                      const void *data, size_t dlen) {
    FILE *fp = fopen(p, "wb");
    ck_assert_ptr_nonnull(fp);
    uint64_t hl = hlen_override != UINT64_MAX ? hlen_override : strlen(hdr);
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
    ck_assert_uint_eq(fwrite(b, 1, 8, fp), 8);
    fwrite(hdr, 1, strlen(hdr), fp);
    if (dlen) fwrite(data, 1, dlen, fp);
    ck_assert_int_eq(fclose(fp), 0);
}

static void hex_of(const char *s, size_t n, char hex[65]) {
    uint8_t d[32];
    sha256_buffer(s, n, d);
    sha256_hex(d, hex);
}

/* FIPS 180-2 test vectors through the libcrypto wrapper. */
START_TEST(sha256_vectors) {
    char hex[65];
    hex_of("", 0, hex);
    ck_assert_str_eq(hex,
                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of("abc", 3, hex);
    ck_assert_str_eq(hex,
                     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m, strlen(m), hex);
    ck_assert_str_eq(hex,
                     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* One million 'a', fed in odd-sized pieces. */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    sha256_ctx c;
    sha256_init(&c);
    size_t off = 0, step = 1;
    while (off < 1000000) {
        size_t n = step < 1000000 - off ? step : 1000000 - off;
        sha256_update(&c, a + off, n);
        off += n;
        step = step * 3 + 1;
        if (step > 70000) step = 7;
    }
    uint8_t d[32];
    ck_assert_int_eq(sha256_final(&c, d), 0);
    sha256_hex(d, hex);
    ck_assert_str_eq(hex,
                     "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* sha256_file agrees. */
    FILE *fp = fopen(path, "wb");
    fwrite(a, 1, 1000000, fp);
    fclose(fp);
    char err[256];
    ck_assert_int_eq(sha256_file(path, d, err, sizeof err), 0);
    sha256_hex(d, hex);
    ck_assert_str_eq(hex,
                     "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* Every length 0..300 with unaligned starts: one shot equals byte-wise
     * streaming. */
    for (size_t len = 0; len <= 300; len++) {
        uint8_t x[32], y[32];
        for (size_t i = 0; i < len; i++) a[i + 3] = (char)(i * 131 + len);
        ck_assert_int_eq(sha256_buffer(a + 3, len, x), 0);
        sha256_ctx s1;
        sha256_init(&s1);
        for (size_t i = 0; i < len; i++) sha256_update(&s1, a + 3 + i, 1);
        ck_assert_int_eq(sha256_final(&s1, y), 0);
        if (memcmp(x, y, 32) != 0) ck_abort_msg("digests differ at length %zu", len);
    }
    free(a);
    ck_assert_int_eq(sha256_file("/nonexistent/x", d, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x"));
}
END_TEST

START_TEST(dtype_helpers) {
    ck_assert_int_eq(safetensors_dtype_parse("F32"), SAFETENSORS_F32);
    ck_assert_int_eq(safetensors_dtype_parse("BF16"), SAFETENSORS_BF16);
    ck_assert_int_eq(safetensors_dtype_parse("I32"), SAFETENSORS_I32);
    ck_assert_int_eq(safetensors_dtype_parse("f32"), -1);
    ck_assert_int_eq(safetensors_dtype_parse("Q4"), -1);
    ck_assert_uint_eq(safetensors_dtype_size(SAFETENSORS_F16), 2);
    ck_assert_uint_eq(safetensors_dtype_size(SAFETENSORS_F64), 8);
    ck_assert_uint_eq(safetensors_dtype_size(99), 0);
    ck_assert_str_eq(safetensors_dtype_name(SAFETENSORS_I32), "I32");
    ck_assert_str_eq(safetensors_dtype_name(-1), "?");
}
END_TEST

START_TEST(round_trip_all_dtypes) {
    char err[512];
    safetensors_writer *w = NULL;
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_add_metadata(w, "format", "pt", err, sizeof err),
                     0);
    ck_assert_int_eq(
        safetensors_writer_add_metadata(w, "note", "h\xc3\xa9llo \"q\"", err, sizeof err),
        0);
    ck_assert_int_eq(safetensors_writer_add_metadata(w, "format", "x", err, sizeof err),
                     -1);
    uint64_t s_mat[2] = { 3, 5 }, s_vec[1] = { 7 }, s_zero[2] = { 4, 0 },
             s_i[3] = { 2, 1, 3 };
    float mat[15];
    for (int i = 0; i < 15; i++) mat[i] = (float)i * 0.25f - 1.0f;
    uint16_t half[7] = { 0x3c00, 0xc000, 0x0001, 0x7bff, 0x0000, 0x8000, 0x3555 };
    uint16_t bf[7] = { 0x3f80, 0xbf80, 0x4049, 0x0000, 0x7f80, 0x3e80, 0x4000 };
    int32_t ints[6] = { -1, 0, 1, 2147483647, -2147483647 - 1, 42 };
    float scalar = 3.5f;
    ck_assert_int_eq(safetensors_writer_declare(w, "a.weight", SAFETENSORS_F32, 2, s_mat,
                                                err, sizeof err),
                     0);
    ck_assert_int_eq(safetensors_writer_declare(w, "b.half", SAFETENSORS_F16, 1, s_vec,
                                                err, sizeof err),
                     0);
    ck_assert_int_eq(safetensors_writer_declare(w, "empty", SAFETENSORS_F32, 2, s_zero,
                                                err, sizeof err),
                     0);
    ck_assert_int_eq(safetensors_writer_declare(w, "c.bf16", SAFETENSORS_BF16, 1, s_vec,
                                                err, sizeof err),
                     0);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "ids", SAFETENSORS_I32, 3, s_i, err, sizeof err),
        0);
    ck_assert_int_eq(safetensors_writer_declare(w, "scalar", SAFETENSORS_F32, 0, NULL,
                                                err, sizeof err),
                     0);
    /* Misuse before data. */
    ck_assert_int_eq(
        safetensors_writer_declare(w, "ids", SAFETENSORS_I32, 1, s_vec, err, sizeof err),
        -1);
    ck_assert_ptr_nonnull(strstr(err, "duplicate"));
    ck_assert_int_eq(safetensors_writer_declare(w, "__metadata__", SAFETENSORS_I32, 1,
                                                s_vec, err, sizeof err),
                     -1);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "", SAFETENSORS_I32, 1, s_vec, err, sizeof err),
        -1);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "f64", SAFETENSORS_F64, 1, s_vec, err, sizeof err),
        -1);
    ck_assert_int_eq(safetensors_writer_write(w, mat, 4, err, sizeof err), -1);

    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "late", SAFETENSORS_F32, 1, s_vec, err, sizeof err),
        -1);
    /* Chunked: split the matrix unevenly, then half + bf16 + ints in one go. */
    ck_assert_int_eq(safetensors_writer_write(w, mat, 13, err, sizeof err), 0);
    ck_assert_int_eq(
        safetensors_writer_write(w, (char *)mat + 13, sizeof mat - 13, err, sizeof err),
        0);
    uint8_t blob[14 + 14 + 24 + 4];
    memcpy(blob, half, 14);
    memcpy(blob + 14, bf, 14);
    memcpy(blob + 28, ints, 24);
    memcpy(blob + 52, &scalar, 4);
    ck_assert_int_eq(safetensors_writer_write(w, blob, sizeof blob, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_write(w, blob, 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "past the declared"));
    uint8_t sha[32];
    ck_assert_int_eq(safetensors_writer_finish(w, sha, err, sizeof err), 0);

    /* The returned digest is the file's; no temp file is left. */
    uint8_t sha2[32];
    ck_assert_int_eq(sha256_file(path, sha2, err, sizeof err), 0);
    ck_assert_mem_eq(sha, sha2, 32);
    ck_assert_int_eq(temp_files(), 0);

    /* Layout: header length multiple of 8, padded with spaces, starts '{'. */
    FILE *fp = fopen(path, "rb");
    uint8_t lb[8];
    ck_assert_uint_eq(fread(lb, 1, 8, fp), 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | lb[i];
    ck_assert_uint_eq(hl % 8, 0);
    char *hdr = malloc(hl + 1);
    ck_assert_uint_eq(fread(hdr, 1, hl, fp), hl);
    hdr[hl] = 0;
    fclose(fp);
    ck_assert_int_eq(hdr[0], '{');
    ck_assert_ptr_nonnull(strstr(hdr, "\"__metadata__\""));
    ck_assert_ptr_nonnull(strstr(hdr, "\"data_offsets\":[0,60]"));
    free(hdr);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq((uint64_t)st.st_size, 8 + hl + 60 + 56);

    safetensors_file *f = NULL;
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), 0);
    ck_assert_uint_eq(safetensors_count(f), 6);
    ck_assert_str_eq(safetensors_metadata(f, "format"), "pt");
    ck_assert_str_eq(safetensors_metadata(f, "note"), "h\xc3\xa9llo \"q\"");
    ck_assert_ptr_null(safetensors_metadata(f, "nope"));
    const safetensors_tensor *t = safetensors_get(f, 0);
    ck_assert_str_eq(t->name, "a.weight");
    ck_assert_int_eq(t->dtype, SAFETENSORS_F32);
    ck_assert_uint_eq(t->ndim, 2);
    ck_assert_uint_eq(t->shape[0], 3);
    ck_assert_uint_eq(t->shape[1], 5);
    ck_assert_uint_eq(t->numel, 15);
    ck_assert_mem_eq(t->data, mat, sizeof mat);
    ck_assert_uint_eq((uintptr_t)t->data % 8, 0);
    t = safetensors_find(f, "b.half");
    ck_assert_int_eq(t->dtype, SAFETENSORS_F16);
    ck_assert_mem_eq(t->data, half, 14);
    t = safetensors_find(f, "c.bf16");
    ck_assert_int_eq(t->dtype, SAFETENSORS_BF16);
    ck_assert_mem_eq(t->data, bf, 14);
    t = safetensors_find(f, "empty");
    ck_assert_uint_eq(t->numel, 0);
    ck_assert_uint_eq(t->nbytes, 0);
    t = safetensors_find(f, "ids");
    ck_assert_uint_eq(t->ndim, 3);
    ck_assert_mem_eq(t->data, ints, 24);
    t = safetensors_find(f, "scalar");
    ck_assert_uint_eq(t->ndim, 0);
    ck_assert_uint_eq(t->numel, 1);
    ck_assert_mem_eq(t->data, &scalar, 4);
    ck_assert_ptr_null(safetensors_find(f, "missing"));
    ck_assert_ptr_null(safetensors_get(f, 6));
    safetensors_close(f);
    safetensors_close(NULL);
}
END_TEST

START_TEST(writer_incomplete_leaves_nothing) {
    char err[512];
    safetensors_writer *w = NULL;
    uint64_t s[1] = { 4 };
    float v[4] = { 1, 2, 3, 4 };
    /* An existing file at PATH must survive a failed write. */
    write_raw(path, "{}", UINT64_MAX, NULL, 0);
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "x", SAFETENSORS_F32, 1, s, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_write(w, v, 8, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "only 8 of 16"));
    safetensors_file *f = NULL;
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), 0);
    ck_assert_uint_eq(safetensors_count(f), 0);
    safetensors_close(f);
    ck_assert_int_eq(temp_files(), 0);
    /* Abort also removes the temp file; abort(NULL) is fine. */
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "x", SAFETENSORS_F32, 1, s, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    ck_assert_int_eq(temp_files(), 1);
    safetensors_writer_abort(w);
    ck_assert_int_eq(temp_files(), 0);
    safetensors_writer_abort(NULL);
    /* An empty file (no tensors) is valid. */
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), 0);
    ck_assert_uint_eq(safetensors_count(f), 0);
    safetensors_close(f);
}
END_TEST

/* ---- malformed files: each must fail with a message naming the problem --- */

typedef struct bad_case {
    const char *what;
    const char *header;
    uint64_t hlen; /* UINT64_MAX = strlen(header) */
    size_t data_len;
    const char *expect; /* substring of the error */
} bad_case;

static const bad_case bad_cases[] = {
    { "header not an object", "[1,2]", UINT64_MAX, 0, "does not start with '{'" },
    { "invalid json", "{\"a\":", UINT64_MAX, 0, "not valid JSON" },
    { "trailing garbage in header", "{}  x", UINT64_MAX, 0, "trailing bytes" },
    { "header length past the end", "{}", 100, 0, "exceeds the file size" },
    { "unknown dtype", "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}",
      UINT64_MAX, 1, "unsupported dtype 'Q4'" },
    { "dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}",
      UINT64_MAX, 4, "unsupported dtype" },
    { "missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", UINT64_MAX, 4,
      "missing 'dtype'" },
    { "missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", UINT64_MAX,
      4, "missing 'shape'" },
    { "missing offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", UINT64_MAX, 4,
      "missing 'data_offsets'" },
    { "unexpected key",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",
      UINT64_MAX, 4, "unexpected key 'x'" },
    { "entry not an object", "{\"a\":[1]}", UINT64_MAX, 0, "not an object" },
    { "negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
      UINT64_MAX, 4, "non-negative integer" },
    { "fractional dim",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", UINT64_MAX, 4,
      "non-negative integer" },
    { "shape not array",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", UINT64_MAX, 12,
      "shape is not an array" },
    { "too many dims",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
      UINT64_MAX, 4, "at most 8" },
    { "offsets wrong arity",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", UINT64_MAX, 4,
      "data_offsets is not" },
    { "offsets begin > end",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", UINT64_MAX, 4,
      "outside the data buffer" },
    { "offsets past the data (truncated)",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", UINT64_MAX, 8,
      "truncated" },
    { "span does not match shape",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", UINT64_MAX, 12,
      "span 12 bytes but F32 shape needs 8" },
    { "overlap",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":"
      "\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      UINT64_MAX, 12, "overlaps" },
    { "hole",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":"
      "\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
      UINT64_MAX, 12, "hole" },
    { "trailing data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      UINT64_MAX, 8, "trailing garbage" },
    { "duplicate names",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":"
      "\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
      UINT64_MAX, 8, "duplicate tensor name 'a'" },
    { "metadata not strings", "{\"__metadata__\":{\"k\":1}}", UINT64_MAX, 0,
      "is not a string" },
    { "metadata not an object", "{\"__metadata__\":\"x\"}", UINT64_MAX, 0,
      "__metadata__ is not an object" },
    { "empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      UINT64_MAX, 4, "empty name" },
    { "huge offsets",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", UINT64_MAX,
      4, "data_offsets is not" },
    { "shape overflow",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,"
      "4]}}",
      UINT64_MAX, 4, "overflows" },
};

START_TEST(malformed_files) {
    const bad_case *c = &bad_cases[_i];
    uint8_t data[64];
    memset(data, 0, sizeof data);
    write_raw(path, c->header, c->hlen, data, c->data_len);
    char err[512] = "";
    safetensors_file *f = (safetensors_file *)0x1;
    int rc = safetensors_open(path, &f, err, sizeof err);
    if (rc == 0 || !strstr(err, c->expect))
        ck_abort_msg("case '%s': rc %d, error '%s' (expected '%s')", c->what, rc, err,
                     c->expect);
    ck_assert_ptr_eq(f, (safetensors_file *)0x1); /* untouched */
    ck_assert_ptr_nonnull(strstr(err, path));     /* names the file */
}
END_TEST

START_TEST(short_and_missing_files) {
    char err[512];
    safetensors_file *f = NULL;
    FILE *fp = fopen(path, "wb");
    fwrite("\x02\0\0", 1, 3, fp);
    fclose(fp);
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "too short"));
    fp = fopen(path, "wb");
    fclose(fp);
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "too short"));
    ck_assert_int_eq(safetensors_open("/nonexistent/m.safetensors", &f, err, sizeof err),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "m.safetensors: no such file or directory"));
    ck_assert_int_eq(safetensors_open(dir, &f, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
    /* A header length over the 100 MB limit, in a (sparse) file that large. */
    write_raw(path, "{}", 200000000ull, NULL, 0);
    ck_assert_int_eq(truncate(path, 8 + 200000000ll), 0);
    ck_assert_int_eq(safetensors_open(path, &f, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "exceeds the"));
}
END_TEST

/* A valid file truncated at every length is refused (never crashes). */
START_TEST(truncated_everywhere) {
    char err[512];
    safetensors_writer *w = NULL;
    uint64_t s[2] = { 2, 3 };
    float v[6] = { 1, 2, 3, 4, 5, 6 };
    ck_assert_int_eq(safetensors_writer_create(path, &w, err, sizeof err), 0);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "w", SAFETENSORS_F32, 2, s, err, sizeof err), 0);
    ck_assert_int_eq(
        safetensors_writer_declare(w, "b", SAFETENSORS_F32, 1, s, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_write(w, v, 4, err, sizeof err), -1);
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_begin_data(w, err, sizeof err), -1);
    ck_assert_int_eq(safetensors_writer_write(w, v, sizeof v, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_write(w, v, 8, err, sizeof err), 0);
    ck_assert_int_eq(safetensors_writer_finish(w, NULL, err, sizeof err), 0);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    for (off_t len = st.st_size - 1; len >= 0; len--) {
        ck_assert_int_eq(truncate(path, len), 0);
        safetensors_file *f = NULL;
        if (safetensors_open(path, &f, err, sizeof err) == 0)
            ck_abort_msg("truncated to %ld bytes but accepted", (long)len);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, sha256_vectors);
    tcase_add_test(tc, dtype_helpers);
    tcase_add_test(tc, round_trip_all_dtypes);
    tcase_add_test(tc, writer_incomplete_leaves_nothing);
    tcase_add_loop_test(tc, malformed_files, 0,
                        (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, short_and_missing_files);
    tcase_add_test(tc, truncated_everywhere);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
