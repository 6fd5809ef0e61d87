/*
 * test_gguf.c - the GGUF reader/writer (store/gguf.h): f16 and Q8_0
 * conversions, a writer -> reader round trip of every key type and tensor
 * type orch writes (layout, alignment, values), every truncation of a valid
 * file refused cleanly, and malformed headers refused with a line naming the
 * problem; for llama the RoPE row permutation both ways, the llama3 frequency
 * factors and the name table against llama_model's engine order.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/store/gguf.h"
#include "orchestrator/store/gguf_model.h"
#include "orchestrator/store/llama_model.h"
#include "tests/test_util.h"

static char dir[256];
static char path[300];

static void setup(void) {
    test_tmpdir(dir, sizeof dir, "gguf");
    snprintf(path, sizeof path, "%s/t.gguf", dir);
}

static void teardown(void) { test_rmdir(dir); }

START_TEST(f16_conversions) {
    ck_assert_uint_eq(gguf_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(gguf_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(gguf_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(gguf_f32_to_f16(65519.0f), 0x7bff); /* rounds down */
    ck_assert_uint_eq(gguf_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
    ck_assert_uint_eq(gguf_f32_to_f16(INFINITY), 0x7c00);
    ck_assert_uint_eq(gguf_f32_to_f16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(gguf_f32_to_f16(1e-8f), 0x0000); /* below half of 2^-24 */
    ck_assert_uint_eq(gguf_f32_to_f16(5.9604645e-8f), 0x0001);
    ck_assert_uint_eq(gguf_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    ck_assert_uint_eq(gguf_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie to even */
    ck_assert(isnan(gguf_f16_to_f32(gguf_f32_to_f16(NAN))));
    /* Every finite or infinite half survives f16 -> f32 -> f16 exactly. */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN */
        ck_assert_uint_eq(gguf_f32_to_f16(gguf_f16_to_f32((uint16_t)h)), h);
    }
    ck_assert(gguf_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    ck_assert(gguf_f16_to_f32(0x3555) == 0.333251953125f);
}
END_TEST

START_TEST(q8_0_blocks) {
    float x[64], y[64];
    uint8_t q[2 * GGUF_Q8_0_BYTES];
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) / 8.0f; /* max |x| = 2 */
    for (int i = 32; i < 64; i++) x[i] = 0.0f;
    gguf_quantize_q8_0(x, q, 64);
    uint16_t d16 = (uint16_t)(q[0] | q[1] << 8);
    ck_assert_uint_eq(d16, gguf_f32_to_f16(2.0f / 127.0f));
    ck_assert_int_eq((int8_t)q[2], -127); /* x[0] = -2 */
    ck_assert_int_eq((int8_t)q[2 + 16], 0);
    ck_assert_uint_eq(q[GGUF_Q8_0_BYTES] | q[GGUF_Q8_0_BYTES + 1], 0); /* zero block */
    ck_assert_int_eq(gguf_to_f32(GGUF_TYPE_Q8_0, q, y, 64), 0);
    float d = gguf_f16_to_f32(d16);
    for (int i = 0; i < 32; i++) ck_assert(fabsf(y[i] - x[i]) <= d * 0.5f + 2e-3f);
    for (int i = 32; i < 64; i++) ck_assert(y[i] == 0.0f);
    ck_assert_uint_eq(gguf_type_nbytes(GGUF_TYPE_Q8_0, 64), 68);
    ck_assert_uint_eq(gguf_type_nbytes(GGUF_TYPE_Q8_0, 33), 0);
    ck_assert_int_eq(gguf_to_f32(GGUF_TYPE_Q4_0, q, y, 32), -1);
    ck_assert_str_eq(gguf_type_name(12), "Q4_K");
    ck_assert_ptr_null(gguf_type_name(1000));
}
END_TEST

/* A small file: keys of every kind orch writes and F32, F16, Q8_0 tensors. */
static void write_sample(const char *p) {
    char err[512];
    gguf_writer *w = NULL;
    ck_assert_int_eq(gguf_writer_create(p, &w, err, sizeof err), 0);
    const char *strs[] = { "a", "", "\xc4\xa0hello" };
    int32_t ints[] = { 1, -3, 1 << 30 };
    ck_assert_int_eq(
        gguf_writer_add_str(w, "general.architecture", "gpt2", err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_add_u32(w, "gpt2.block_count", 7, err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_add_f32(w, "gpt2.eps", 1e-5f, err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_add_bool(w, "b", 1, err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_add_str_array(w, "toks", strs, NULL, 3, err, sizeof err),
                     0);
    ck_assert_int_eq(gguf_writer_add_i32_array(w, "types", ints, 3, err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_add_u32(w, "gpt2.block_count", 8, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "duplicate key 'gpt2.block_count'"));
    uint64_t ne_a[2] = { 3, 2 }, ne_b[1] = { 5 }, ne_c[2] = { 64, 2 };
    ck_assert_int_eq(gguf_writer_declare(w, "a", GGUF_TYPE_F32, 2, ne_a, err, sizeof err),
                     0);
    ck_assert_int_eq(gguf_writer_declare(w, "b", GGUF_TYPE_F16, 1, ne_b, err, sizeof err),
                     0);
    ck_assert_int_eq(
        gguf_writer_declare(w, "c", GGUF_TYPE_Q8_0, 2, ne_c, err, sizeof err), 0);
    ck_assert_int_eq(
        gguf_writer_declare(w, "d", GGUF_TYPE_Q8_0, 1, ne_b, err, sizeof err), -1);
    ck_assert_int_eq(gguf_writer_declare(w, "a", GGUF_TYPE_F32, 1, ne_b, err, sizeof err),
                     -1);
    ck_assert_int_eq(gguf_writer_begin_data(w, err, sizeof err), 0);
    float a[6] = { 1, 2, 3, 4, 5, 6 }, c[128];
    uint16_t b[5];
    for (int i = 0; i < 5; i++) b[i] = gguf_f32_to_f16((float)i / 4);
    for (int i = 0; i < 128; i++) c[i] = sinf((float)i);
    uint8_t cq[4 * GGUF_Q8_0_BYTES];
    gguf_quantize_q8_0(c, cq, 128);
    /* chunks that span tensors */
    uint8_t all[24 + 10 + sizeof cq];
    memcpy(all, a, 24);
    memcpy(all + 24, b, 10);
    memcpy(all + 34, cq, sizeof cq);
    ck_assert_int_eq(gguf_writer_write(w, all, 20, err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_write(w, all + 20, sizeof all - 20, err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_write(w, all, 1, err, sizeof err), -1);
    ck_assert_int_eq(gguf_writer_finish(w, err, sizeof err), 0);
}

START_TEST(round_trip) {
    char err[512];
    write_sample(path);
    gguf_file *f = NULL;
    ck_assert_int_eq(gguf_open(path, &f, err, sizeof err), 0);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_alignment(f), 32);
    ck_assert_uint_eq(gguf_kv_count(f), 7); /* general.alignment first */
    ck_assert_str_eq(gguf_kv_get(f, 0)->key, "general.alignment");
    gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "general.architecture", &s, err, sizeof err), 1);
    ck_assert(s.len == 4 && memcmp(s.p, "gpt2", 4) == 0);
    uint64_t u;
    ck_assert_int_eq(gguf_get_uint(f, "gpt2.block_count", 100, &u, err, sizeof err), 1);
    ck_assert_uint_eq(u, 7);
    ck_assert_int_eq(gguf_get_uint(f, "gpt2.block_count", 6, &u, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "gpt2.block_count: 7 is out of range (0..6)"));
    ck_assert_int_eq(gguf_get_uint(f, "missing", 6, &u, err, sizeof err), 0);
    ck_assert_int_eq(gguf_get_uint(f, "gpt2.eps", 6, &u, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "expected an integer, found f32"));
    double e;
    ck_assert_int_eq(gguf_get_float(f, "gpt2.eps", &e, err, sizeof err), 1);
    ck_assert(fabs(e - 1e-5) < 1e-12);
    const gguf_kv *kv = gguf_find_kv(f, "toks");
    ck_assert(kv && kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING && kv->n == 3);
    ck_assert(kv->strs[1].len == 0 && kv->strs[2].len == 7 &&
              memcmp(kv->strs[2].p, "\xc4\xa0hello", 7) == 0);
    kv = gguf_find_kv(f, "types");
    ck_assert(kv && kv->arr_type == GGUF_I32 && kv->n == 3);
    ck_assert_int_eq(gguf_arr_int(kv, 1), -3);
    ck_assert_int_eq(gguf_arr_int(kv, 2), 1 << 30);
    ck_assert_uint_eq(gguf_tensor_count(f), 3);
    const gguf_tensor *a = gguf_find_tensor(f, "a"), *b = gguf_find_tensor(f, "b"),
                      *c = gguf_find_tensor(f, "c");
    ck_assert(a && b && c);
    ck_assert(a->ndim == 2 && a->ne[0] == 3 && a->ne[1] == 2 && a->numel == 6);
    ck_assert_uint_eq(a->offset, 0);
    ck_assert_uint_eq(b->offset, 32); /* 24 bytes, padded to 32 */
    ck_assert_uint_eq(c->offset, 64);
    ck_assert_uint_eq(c->nbytes, 4 * GGUF_Q8_0_BYTES);
    float y[128];
    ck_assert_int_eq(gguf_to_f32(a->type, a->data, y, 6), 0);
    ck_assert(y[0] == 1 && y[5] == 6);
    ck_assert_int_eq(gguf_to_f32(b->type, b->data, y, 5), 0);
    ck_assert(y[4] == 1.0f && y[1] == 0.25f);
    ck_assert_int_eq(gguf_to_f32(c->type, c->data, y, 128), 0);
    for (int i = 0; i < 128; i++) ck_assert(fabsf(y[i] - sinf((float)i)) < 0.01f);
    /* The data section starts aligned in the file. */
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    static uint8_t buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    gguf_file *g = NULL;
    ck_assert_int_eq(gguf_open_memory(buf, len, "mem", &g, err, sizeof err), 0);
    ck_assert_uint_eq(
        (uint64_t)((const uint8_t *)gguf_find_tensor(g, "a")->data - buf) % 32, 0);
    ck_assert_uint_eq(len,
                      (uint64_t)((const uint8_t *)gguf_find_tensor(g, "c")->data - buf) +
                          4 * GGUF_Q8_0_BYTES + (32 - (4 * GGUF_Q8_0_BYTES) % 32) % 32);
    gguf_close(g);
    /* Every truncation is refused (and never reads past the end: ASan). */
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        g = NULL;
        int rc = gguf_open_memory(cut, n, "cut", &g, err, sizeof err);
        if (rc == 0) { /* only the final padding may go */
            ck_assert_uint_ge(n, len - 31);
            gguf_close(g);
        } else {
            ck_assert_ptr_nonnull(strstr(err, "cut: "));
        }
        free(cut);
    }
    gguf_close(f);
}
END_TEST

/* Open len bytes and expect a failure whose message contains want. */
static void refused(const uint8_t *b, size_t len, const char *want) {
    char err[512] = "";
    gguf_file *f = NULL;
    int rc = gguf_open_memory(b, len, "bad", &f, err, sizeof err);
    if (rc == 0) gguf_close(f);
    ck_assert_msg(rc == -1, "accepted; wanted '%s'", want);
    ck_assert_msg(strstr(err, want) != NULL, "error '%s' lacks '%s'", err, want);
}

typedef struct wbuf {
    uint8_t b[4096];
    size_t n;
} wbuf;

static void put(wbuf *w, const void *p, size_t n) {
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put32(wbuf *w, uint32_t v) { put(w, &v, 4); }
static void put64(wbuf *w, uint64_t v) { put(w, &v, 8); }
static void putstr(wbuf *w, const char *s) {
    put64(w, strlen(s));
    put(w, s, strlen(s));
}
static void header(wbuf *w, uint32_t version, uint64_t n_t, uint64_t n_kv) {
    w->n = 0;
    put(w, "GGUF", 4);
    put32(w, version);
    put64(w, n_t);
    put64(w, n_kv);
}
/* One tensor info: name, 1 dim of ne, type, offset. */
static void tinfo(wbuf *w, const char *name, uint64_t ne, uint32_t type, uint64_t off) {
    putstr(w, name);
    put32(w, 1);
    put64(w, ne);
    put32(w, type);
    put64(w, off);
}
static void pad(wbuf *w) {
    while (w->n % 32) w->b[w->n++] = 0;
}

START_TEST(malformed_files) {
    wbuf w;
    refused((const uint8_t *)"GGML", 4, "not a GGUF file");
    header(&w, 1, 0, 0);
    refused(w.b, w.n, "GGUF version 1 is not supported");
    header(&w, 3, 0, 1u << 30);
    refused(w.b, w.n, "do not fit in the file");
    header(&w, 3, 0, 1);
    putstr(&w, "k");
    put32(&w, 77);
    refused(w.b, w.n, "key 'k': unknown value type 77");
    header(&w, 3, 0, 1);
    putstr(&w, "k");
    put32(&w, GGUF_STRING);
    put64(&w, 1000);
    put(&w, "abc", 3);
    refused(w.b, w.n, "truncated (k runs past the end");
    header(&w, 3, 0, 1);
    putstr(&w, "k");
    put32(&w, GGUF_ARRAY);
    put32(&w, GGUF_U32);
    put64(&w, (uint64_t)1 << 61); /* count * 4 would overflow */
    refused(w.b, w.n, "truncated");
    header(&w, 3, 0, 1);
    putstr(&w, "k");
    put32(&w, GGUF_ARRAY);
    put32(&w, GGUF_ARRAY);
    put64(&w, 0);
    refused(w.b, w.n, "arrays of arrays are not supported");
    header(&w, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        putstr(&w, "dup");
        put32(&w, GGUF_U8);
        put(&w, "x", 1);
    }
    refused(w.b, w.n, "duplicate key 'dup'");
    header(&w, 3, 0, 1);
    put64(&w, 0);
    put32(&w, GGUF_U8);
    put(&w, "x", 1);
    refused(w.b, w.n, "key 0: empty name");
    header(&w, 3, 0, 1);
    putstr(&w, "general.alignment");
    put32(&w, GGUF_U32);
    put32(&w, 48);
    refused(w.b, w.n, "general.alignment must be a u32 power of two");
    /* Tensors. */
    header(&w, 3, 1, 0);
    tinfo(&w, "t", 4, 99, 0);
    refused(w.b, w.n, "tensor 't' has unknown type 99");
    header(&w, 3, 1, 0);
    tinfo(&w, "t", 4, 16, 0);
    refused(w.b, w.n, "tensor 't' has type IQ2_XXS, which orch cannot read");
    header(&w, 3, 1, 0);
    tinfo(&w, "t", 33, GGUF_TYPE_Q8_0, 0);
    refused(w.b, w.n, "not a whole number of Q8_0 blocks");
    header(&w, 3, 1, 0);
    tinfo(&w, "t", 0, GGUF_TYPE_F32, 0);
    refused(w.b, w.n, "dimension 0 is 0");
    header(&w, 3, 1, 0);
    putstr(&w, "t");
    put32(&w, 5);
    for (int i = 0; i < 5; i++) put64(&w, 1);
    put32(&w, GGUF_TYPE_F32);
    put64(&w, 0);
    refused(w.b, w.n, "5 dimensions (1..4 allowed)");
    /* A readable name, then nothing valid (the fuzzer's first find: the name
     * was copied before its dimensions were refused, past the name pool). */
    header(&w, 3, 1, 0);
    putstr(&w, "a-long-enough-tensor-name-for-the-header");
    put32(&w, 0);
    refused(w.b, w.n, "0 dimensions (1..4 allowed)");
    header(&w, 3, 1, 0);
    tinfo(&w, "t", 4, GGUF_TYPE_F32, 8);
    pad(&w);
    refused(w.b, w.n, "offset 8 is not a multiple of the alignment 32");
    header(&w, 3, 1, 0);
    tinfo(&w, "t", 16, GGUF_TYPE_F32, 0);
    pad(&w);
    put(&w, "0123456789012345678901234567890123456789", 40);
    refused(w.b, w.n, "tensor 't': data [0, +64) runs past the end of the file");
    header(&w, 3, 2, 0);
    tinfo(&w, "t", 16, GGUF_TYPE_F32, 0);
    tinfo(&w, "u", 8, GGUF_TYPE_F32, 32);
    pad(&w);
    memset(w.b + w.n, 0, 96);
    w.n += 96;
    refused(w.b, w.n, "tensors 't' and 'u' overlap");
    header(&w, 3, 2, 0);
    tinfo(&w, "t", 8, GGUF_TYPE_F32, 0);
    tinfo(&w, "t", 8, GGUF_TYPE_F32, 32);
    pad(&w);
    memset(w.b + w.n, 0, 64);
    w.n += 64;
    refused(w.b, w.n, "duplicate tensor 't'");
    /* and the same file with distinct names opens */
    w.b[24 + 8 + 1 + 4 + 8 + 4 + 8 + 8] = 'v';
    char err[256];
    gguf_file *f = NULL;
    ck_assert_int_eq(gguf_open_memory(w.b, w.n, "ok", &f, err, sizeof err), 0);
    ck_assert_ptr_nonnull(gguf_find_tensor(f, "v"));
    gguf_close(f);
}
END_TEST

START_TEST(writer_leaves_nothing_on_abort) {
    char err[256];
    gguf_writer *w = NULL;
    ck_assert_int_eq(gguf_writer_create(path, &w, err, sizeof err), 0);
    uint64_t ne[1] = { 4 };
    ck_assert_int_eq(gguf_writer_declare(w, "t", GGUF_TYPE_F32, 1, ne, err, sizeof err),
                     0);
    ck_assert_int_eq(gguf_writer_begin_data(w, err, sizeof err), 0);
    ck_assert_int_eq(gguf_writer_finish(w, err, sizeof err), -1); /* data missing */
    ck_assert_ptr_nonnull(strstr(err, "tensor 't' is missing data"));
    struct stat st;
    ck_assert_int_ne(stat(path, &st), 0);
    ck_assert_int_eq(gguf_writer_create(path, &w, err, sizeof err), 0);
    gguf_writer_abort(w);
    ck_assert_int_ne(stat(path, &st), 0);
}
END_TEST

/* llama: the RoPE row permutation is the reshape(heads, 2, D/2, C)
 * .swapaxes(1, 2) of llama.cpp's converter, and the inverse undoes it. */
START_TEST(llama_rope_permutation) {
    enum { H = 2, D = 8, C = 3 };
    float src[H * D * C], g[H * D * C], back[H * D * C];
    for (int i = 0; i < H * D * C; i++) src[i] = (float)i;
    llama_rope_permute(src, g, H, H * D, C, 1);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < D / 2; j++)
            for (int s = 0; s < 2; s++)
                for (int c = 0; c < C; c++) /* gguf[h][j][s] = hf[h][s][j] */
                    ck_assert_float_eq(g[((h * D) + 2 * j + s) * C + c],
                                       src[((h * D) + s * (D / 2) + j) * C + c]);
    /* Row 1 of head 0 in GGUF is HF row D/2: element d pairs with d + D/2. */
    ck_assert_float_eq(g[1 * C], src[(D / 2) * C]);
    llama_rope_permute(g, back, H, H * D, C, 0);
    ck_assert_int_eq(memcmp(src, back, sizeof src), 0);
}
END_TEST

/* llama3 frequency factors: 1 for the kept high frequencies, factor for the
 * low ones, in between smooth; linear/none have none. */
START_TEST(llama_rope_factors) {
    llama_model m;
    memset(&m, 0, sizeof m);
    m.width = 32, m.heads = 4, m.rope_theta = 10000, m.rope_scaling = ORCH_ROPE_LLAMA3;
    m.rope_factor = 8, m.rope_low_freq_factor = 1, m.rope_high_freq_factor = 4;
    m.rope_original_context = 64;
    float f[4];
    llama_rope_freq_factors(&m, f);
    /* inv_freq 1, 0.1, 0.01, 0.001: wavelengths 6.3, 63, 628, 6283 against
     * 64/4 = 16 and 64/1 = 64: kept, smooth, low, low. */
    ck_assert_float_eq(f[0], 1.0f);
    double wl = 2 * 3.14159265358979323846 / 0.1, sm = (64 / wl - 1) / 3;
    ck_assert_double_eq_tol(f[1], 1.0 / ((1 - sm) / 8 + sm), 1e-6);
    ck_assert_float_eq(f[2], 8.0f);
    ck_assert_float_eq(f[3], 8.0f);
}
END_TEST

/* The llama table: 9 per layer in engine order, output.weight only untied,
 * attn_q/attn_k marked for the permutation, kv rows sized by kv_heads. */
START_TEST(llama_table) {
    const gguf_arch *a = gguf_arch_by_gguf("llama");
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(gguf_arch_tensor_count(a, 2, 0), 20);
    ck_assert_uint_eq(gguf_arch_tensor_count(a, 2, 1), 21);
    char on[64], gn[64];
    const gguf_tensor_map *m = gguf_arch_tensor(a, 2, 0, 2, on, gn, sizeof on);
    ck_assert_str_eq(on, "model.layers.0.self_attn.q_proj.weight");
    ck_assert_str_eq(gn, "blk.0.attn_q.weight");
    ck_assert_int_eq(m->rope, GGUF_ROPE_Q);
    m = gguf_arch_tensor(a, 2, 0, 12, on, gn, sizeof on);
    ck_assert_str_eq(gn, "blk.1.attn_k.weight");
    ck_assert_int_eq(m->rope, GGUF_ROPE_K);
    config_model cm;
    memset(&cm, 0, sizeof cm);
    cm.width = 32, cm.heads = 4, cm.kv_heads = 2;
    ck_assert_uint_eq(gguf_dim_size(&cm, m->dim[0]), 16);
    ck_assert_ptr_null(gguf_arch_tensor(a, 2, 0, 20, on, gn, sizeof on));
    m = gguf_arch_tensor(a, 2, 1, 20, on, gn, sizeof on);
    ck_assert_str_eq(gn, "output.weight");
    ck_assert_str_eq(on, "lm_head.weight");
    /* The orch names equal llama_model's table, in the same order. */
    llama_model lm;
    memset(&lm, 0, sizeof lm);
    lm.vocab = 97, lm.layers = 2, lm.heads = 4, lm.kv_heads = 2, lm.width = 32;
    lm.mlp_width = 48;
    for (int tied = 0; tied < 2; tied++) {
        lm.tied = tied;
        ck_assert_uint_eq(llama_model_tensor_count(&lm),
                          gguf_arch_tensor_count(a, 2, !tied));
        for (size_t i = 0; i < llama_model_tensor_count(&lm); i++) {
            char ln[64];
            uint64_t shape[2];
            int k;
            ck_assert_int_eq(llama_model_tensor(&lm, i, ln, sizeof ln, shape, &k), 0);
            gguf_arch_tensor(a, 2, !tied, i, on, gn, sizeof on);
            ck_assert_str_eq(ln, on);
        }
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, f16_conversions);
    tcase_add_test(tc, q8_0_blocks);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, malformed_files);
    tcase_add_test(tc, writer_leaves_nothing_on_abort);
    tcase_add_test(tc, llama_rope_permutation);
    tcase_add_test(tc, llama_rope_factors);
    tcase_add_test(tc, llama_table);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
