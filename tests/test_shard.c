/*
 * test_shard.c - Check suite for orchestrator/data/shard.{c,h} and
 * orchestrator/data/corpus.{c,h}: shard write/read round trips (2- and 4-byte
 * tokens), atomic writes, every corrupt-file case (bad magic, foreign file,
 * wrong version, corrupt header, truncated, size mismatch, payload checksum,
 * empty file), mixed tokenizers, dataset reads across shard boundaries
 * (including an empty shard) and from several threads, corpus preparation
 * (split on a line boundary, shard sizes, stale shards, progress, errors),
 * and the KJV corpus (fetch, clear error without `bible`, idempotent
 * preparation).
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/data/corpus.h"
#include "orchestrator/data/shard.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"
#include "tests/test_util.h"

static char dir[64];
static char err[2048];

static void setup(void) { test_tmpdir(dir, sizeof dir, "shard"); }

static void teardown(void) { test_rmdir(dir); }

static const char *pathf(const char *name) {
    static char p[4][PATH_MAX];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static int32_t tok_at(uint64_t i, uint32_t vocab) {
    uint64_t x = (i + 7) * 0x9e3779b97f4a7c15ull;
    return (int32_t)((x ^ (x >> 31)) % vocab);
}

static void write_shard(const char *name, const char *tok, uint32_t vocab, uint64_t start,
                        uint64_t n) {
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    for (uint64_t i = 0; i < n; i++) ids[i] = tok_at(start + i, vocab);
    ck_assert_msg(shard_write_file(pathf(name), tok, vocab, ids, n, err, sizeof err) == 0,
                  "%s", err);
    free(ids);
}

static unsigned char *read_all(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    ck_assert_uint_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void write_all(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static int count_files(const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

/* --- shard files --------------------------------------------------------- */

START_TEST(test_roundtrip_widths) {
    struct {
        const char *tok;
        uint32_t vocab, width;
    } cases[] = { { "byte", 256, 2 },
                  { "gpt2", 50257, 2 },
                  { "big", 65536, 2 },
                  { "huge", 70000, 4 } };
    for (int c = 0; c < 4; c++) {
        uint64_t n = 1000 + (uint64_t)c;
        write_shard("s.bin", cases[c].tok, cases[c].vocab, 0, n);
        size_t sz;
        free(read_all(pathf("s.bin"), &sz));
        ck_assert_uint_eq(sz, SHARD_HEADER_SIZE + n * cases[c].width);
        shard_info info;
        ck_assert_msg(shard_read_info(pathf("s.bin"), 1, &info, err, sizeof err) == 0,
                      "%s", err);
        ck_assert_uint_eq(info.version, SHARD_VERSION);
        ck_assert_uint_eq(info.token_width, cases[c].width);
        ck_assert_uint_eq(info.vocab_size, cases[c].vocab);
        ck_assert_str_eq(info.tokenizer, cases[c].tok);
        ck_assert_uint_eq(info.n_tokens, n);
        dataset *ds;
        ck_assert_msg(dataset_open(pathf("s.bin"), &ds, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(dataset_total_tokens(ds), n);
        ck_assert_uint_eq(dataset_vocab_size(ds), cases[c].vocab);
        ck_assert_str_eq(dataset_tokenizer_name(ds), cases[c].tok);
        ck_assert_uint_eq(dataset_shard_count(ds), 1);
        int32_t *got = malloc(n * sizeof *got);
        ck_assert_int_eq(dataset_read(ds, 0, n, got), 0);
        int same = 1;
        for (uint64_t i = 0; i < n; i++) same &= got[i] == tok_at(i, cases[c].vocab);
        ck_assert_msg(same, "tokens differ after the round trip (%s)", cases[c].tok);
        if (cases[c].vocab > 65536) { /* the 4-byte case holds ids > 65535 */
            int32_t mx = 0;
            for (uint64_t i = 0; i < n; i++) mx = got[i] > mx ? got[i] : mx;
            ck_assert_int_gt(mx, 65535);
        }
        free(got);
        dataset_close(ds);
    }
    /* Header bytes as documented. */
    size_t sz;
    unsigned char *b = read_all(pathf("s.bin"), &sz);
    ck_assert(memcmp(b, "ORCHTOK\0", 8) == 0);
    ck_assert_uint_eq(b[8], 1);   /* version, little-endian */
    ck_assert_uint_eq(b[12], 64); /* header size */
    ck_assert_uint_eq(b[16], 4);  /* token width */
    free(b);
}
END_TEST

START_TEST(test_write_atomic_and_errors) {
    write_shard("a.bin", "byte", 256, 0, 100);
    write_shard("a.bin", "byte", 256, 5, 50); /* replaces it */
    dataset *ds;
    ck_assert_int_eq(dataset_open(pathf("a.bin"), &ds, err, sizeof err), 0);
    ck_assert_uint_eq(dataset_total_tokens(ds), 50);
    int32_t t0;
    ck_assert_int_eq(dataset_read(ds, 0, 1, &t0), 0);
    ck_assert_int_eq(t0, tok_at(5, 256));
    dataset_close(ds);
    ck_assert_int_eq(count_files("a.bin.tmp"), 0); /* no temp file left */

    int32_t ids[3] = { 1, 256, 2 };
    ck_assert_int_eq(
        shard_write_file(pathf("b.bin"), "byte", 256, ids, 3, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "256"));
    ck_assert_int_eq(access(pathf("b.bin"), F_OK), -1);
    ids[1] = -1;
    ck_assert_int_eq(
        shard_write_file(pathf("b.bin"), "byte", 256, ids, 3, err, sizeof err), -1);
    ids[1] = 3;
    ck_assert_int_eq(shard_write_file(pathf("b.bin"), "", 256, ids, 3, err, sizeof err),
                     -1);
    ck_assert_int_eq(shard_write_file(pathf("b.bin"), "a-very-long-tokenizer-name", 256,
                                      ids, 3, err, sizeof err),
                     -1);
    ck_assert_int_eq(shard_write_file(pathf("no/such/dir/b.bin"), "byte", 256, ids, 3,
                                      err, sizeof err),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "no/such/dir"));
    ck_assert_int_eq(count_files("b.bin"), 0);
}
END_TEST

/* Expect dataset_open(name) to fail with an error containing every word. */
static void expect_refused(const char *name, const char *w1, const char *w2) {
    dataset *ds = (dataset *)1;
    ck_assert_int_eq(dataset_open(pathf(name), &ds, err, sizeof err), -1);
    ck_assert_ptr_null(ds);
    ck_assert_msg(strstr(err, name) != NULL, "error does not name the file: %s", err);
    ck_assert_msg(strstr(err, w1) != NULL, "error lacks '%s': %s", w1, err);
    if (w2) ck_assert_msg(strstr(err, w2) != NULL, "error lacks '%s': %s", w2, err);
    shard_info info;
    ck_assert_int_eq(shard_read_info(pathf(name), 1, &info, err, sizeof err), -1);
}

START_TEST(test_corrupt_files) {
    write_shard("good.bin", "byte", 256, 0, 1000);
    size_t n;
    unsigned char *g = read_all(pathf("good.bin"), &n);
    unsigned char *b = malloc(n + 16);

    /* bad magic */
    memcpy(b, g, n);
    b[0] = 'X';
    write_all(pathf("magic.bin"), b, n);
    expect_refused("magic.bin", "bad magic", "orch prepare");
    /* a foreign file: text */
    const char *text = "In the beginning God created the heaven and the earth.\n"
                       "And the earth was without form, and void.\n";
    write_all(pathf("foreign.bin"), text, strlen(text));
    expect_refused("foreign.bin", "not an orch token shard", NULL);
    /* a foreign file shorter than the magic, and an empty one */
    write_all(pathf("tiny.bin"), "ORC", 3);
    expect_refused("tiny.bin", "bad magic", NULL);
    write_all(pathf("empty.bin"), "", 0);
    expect_refused("empty.bin", "not an orch token shard", NULL);
    /* wrong (future) version */
    memcpy(b, g, n);
    b[8] = 2;
    write_all(pathf("version.bin"), b, n);
    expect_refused("version.bin", "version 2", "reads version 1");
    /* header field changed: header checksum */
    memcpy(b, g, n);
    b[20] ^= 1; /* vocab size */
    write_all(pathf("header.bin"), b, n);
    expect_refused("header.bin", "corrupt header", NULL);
    /* truncated: one byte short, and cut inside the header */
    write_all(pathf("trunc.bin"), g, n - 1);
    expect_refused("trunc.bin", "truncated", "1000 tokens");
    write_all(pathf("trunc2.bin"), g, 40);
    expect_refused("trunc2.bin", "truncated", NULL);
    /* size mismatch: extra bytes after the tokens */
    memcpy(b, g, n);
    memcpy(b + n, "extra", 5);
    write_all(pathf("long.bin"), b, n + 5);
    expect_refused("long.bin", "wrong size", NULL);
    /* payload corrupted: one bit */
    memcpy(b, g, n);
    b[SHARD_HEADER_SIZE + 123] ^= 0x10;
    write_all(pathf("payload.bin"), b, n);
    expect_refused("payload.bin", "checksum", NULL);
    /* two tokens swapped: still detected */
    memcpy(b, g, n);
    unsigned char tmp[2];
    memcpy(tmp, b + SHARD_HEADER_SIZE, 2);
    memcpy(b + SHARD_HEADER_SIZE, b + SHARD_HEADER_SIZE + 2, 2);
    memcpy(b + SHARD_HEADER_SIZE + 2, tmp, 2);
    if (memcmp(b, g, n) != 0) {
        write_all(pathf("swap.bin"), b, n);
        expect_refused("swap.bin", "checksum", NULL);
    }
    /* Without checksum verification, headers and sizes are still checked. */
    dataset *ds;
    ck_assert_int_eq(dataset_open_flags(pathf("payload.bin"), 0, &ds, err, sizeof err),
                     0);
    dataset_close(ds);
    ck_assert_int_eq(dataset_open_flags(pathf("trunc.bin"), 0, &ds, err, sizeof err), -1);
    /* A directory and a missing file. */
    ck_assert_int_eq(mkdir(pathf("sub.bin"), 0755), 0);
    ck_assert_int_eq(dataset_open(pathf("sub.bin"), &ds, err, sizeof err), -1);
    ck_assert_int_eq(dataset_open(pathf("missing_*.bin"), &ds, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "no token shards match"));
    /* A directory that does not exist, a file in the way, a missing plain
     * path: each says "no such file or directory" and names the culprit. */
    ck_assert_int_eq(dataset_open(pathf("gone/train_*.bin"), &ds, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "gone/train_*.bin: no such file or directory") &&
                      strstr(err, "gone does not exist"),
                  "%s", err);
    ck_assert_int_eq(dataset_open(pathf("payload.bin/x_*.bin"), &ds, err, sizeof err),
                     -1);
    ck_assert_msg(strstr(err, "no such file or directory") &&
                      strstr(err, "payload.bin is not a directory"),
                  "%s", err);
    ck_assert_int_eq(dataset_open(pathf("nothere.bin"), &ds, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "nothere.bin: no such file or directory"), "%s", err);
    /* One bad shard spoils a glob, and the error names it. */
    write_shard("set_000.bin", "byte", 256, 0, 10);
    write_all(pathf("set_001.bin"), g, n - 2);
    ck_assert_int_eq(dataset_open(pathf("set_*.bin"), &ds, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "set_001.bin"));
    free(b);
    free(g);
}
END_TEST

/* Found by tests/fuzz/fuzz_shard: a header whose vocab_size (0xFFFFFFFF) no
 * int32 token id can reach; its tokens would come out as negative ids. With
 * both checksums made right it is refused as an inconsistent header. */
START_TEST(test_vocab_beyond_int32) {
    static const unsigned char shard[] = {
        0x4f, 0x52, 0x43, 0x48, 0x54, 0x4f, 0x4b, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x40, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf4, 0xc9,
        0xa2, 0xe4, 0x79, 0xda, 0xf6, 0xc9, 0x5b, 0x45, 0xec, 0x06, 0x53, 0xa8,
        0x1c, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x6f, 0x11
    };
    unsigned char b[sizeof shard];
    memcpy(b, shard, sizeof b);
    uint64_t sum = shard_checksum(b + SHARD_HEADER_SIZE, sizeof b - SHARD_HEADER_SIZE);
    for (int i = 0; i < 8; i++) b[48 + i] = (unsigned char)(sum >> (8 * i));
    sum = shard_checksum(b, 56);
    for (int i = 0; i < 8; i++) b[56 + i] = (unsigned char)(sum >> (8 * i));
    write_all(pathf("vocab32.bin"), b, sizeof b);
    expect_refused("vocab32.bin", "inconsistent header", NULL);
}
END_TEST

START_TEST(test_mixed_tokenizers) {
    write_shard("m_000.bin", "byte", 256, 0, 10);
    write_shard("m_001.bin", "gpt2", 50257, 0, 10);
    dataset *ds;
    ck_assert_int_eq(dataset_open(pathf("m_*.bin"), &ds, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "byte"));
    ck_assert_ptr_nonnull(strstr(err, "gpt2"));
    ck_assert_ptr_nonnull(strstr(err, "m_001.bin"));
    /* Same name, different vocabulary size: also refused. */
    write_shard("m_001.bin", "byte", 300, 0, 10);
    ck_assert_int_eq(dataset_open(pathf("m_*.bin"), &ds, err, sizeof err), -1);
    /* Only empty shards: refused. */
    write_shard("e_000.bin", "byte", 256, 0, 0);
    ck_assert_int_eq(dataset_open(pathf("e_*.bin"), &ds, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "no tokens"));
}
END_TEST

/* Shards of 100, 1, 0, 250, 37 tokens: one sequence f(0..387]. */
static const uint64_t sizes[] = { 100, 1, 0, 250, 37 };
#define N_SHARDS 5
static uint64_t total_tokens(void) {
    uint64_t t = 0;
    for (int i = 0; i < N_SHARDS; i++) t += sizes[i];
    return t;
}

static dataset *open_boundary_set(uint32_t vocab) {
    uint64_t start = 0;
    for (int i = 0; i < N_SHARDS; i++) {
        char name[32];
        snprintf(name, sizeof name, "d_%03d.bin", i);
        write_shard(name, "t", vocab, start, sizes[i]);
        start += sizes[i];
    }
    dataset *ds;
    ck_assert_msg(dataset_open(pathf("d_*.bin"), &ds, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(dataset_shard_count(ds), N_SHARDS);
    ck_assert_uint_eq(dataset_total_tokens(ds), total_tokens());
    ck_assert_ptr_nonnull(strstr(dataset_shard_path(ds, 3), "d_003.bin"));
    ck_assert_ptr_null(dataset_shard_path(ds, N_SHARDS));
    return ds;
}

START_TEST(test_read_across_boundaries) {
    uint32_t vocabs[2] = { 1000, 100000 }; /* 2- and 4-byte tokens */
    for (int v = 0; v < 2; v++) {
        dataset *ds = open_boundary_set(vocabs[v]);
        uint64_t T = total_tokens();
        int32_t *buf = malloc((T + 2) * sizeof *buf);
        int ok = 1;
        for (uint64_t off = 0; off <= T && ok; off++) {
            uint64_t lens[] = { 0, 1, 2, 7, 99, 100, 101, 150, 251, T - off };
            for (int li = 0; li < 10 && ok; li++) {
                uint64_t n = lens[li];
                if (off + n > T) continue;
                buf[n] = 0x7abcdef;
                if (dataset_read(ds, off, n, buf) != 0) ok = 0;
                for (uint64_t i = 0; i < n && ok; i++)
                    if (buf[i] != tok_at(off + i, vocabs[v])) ok = 0;
                if (buf[n] != 0x7abcdef) ok = 0; /* no write past n */
                if (!ok)
                    ck_abort_msg("read(%llu, %llu) wrong (vocab %u)",
                                 (unsigned long long)off, (unsigned long long)n,
                                 vocabs[v]);
            }
        }
        /* Out of range. */
        ck_assert_int_eq(dataset_read(ds, T, 1, buf), -1);
        ck_assert_int_eq(dataset_read(ds, 0, T + 1, buf), -1);
        ck_assert_int_eq(dataset_read(ds, UINT64_MAX, 2, buf), -1);
        ck_assert_int_eq(dataset_read(ds, 1, UINT64_MAX, buf), -1);
        ck_assert_int_eq(dataset_read(ds, T, 0, buf), 0);
        free(buf);
        dataset_close(ds);
    }
}
END_TEST

typedef struct reader {
    const dataset *ds;
    uint64_t seed;
    int ok;
} reader;

static void *read_many(void *arg) {
    reader *r = arg;
    uint64_t T = dataset_total_tokens(r->ds);
    int32_t buf[64];
    uint64_t x = r->seed;
    r->ok = 1;
    for (int k = 0; k < 20000 && r->ok; k++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        uint64_t off = (x >> 20) % (T - 64);
        if (dataset_read(r->ds, off, 64, buf) != 0) r->ok = 0;
        for (int i = 0; i < 64 && r->ok; i++)
            if (buf[i] != tok_at(off + (uint64_t)i, 1000)) r->ok = 0;
    }
    return NULL;
}

START_TEST(test_concurrent_reads) {
    dataset *ds = open_boundary_set(1000);
    pthread_t th[4];
    reader r[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (reader){ .ds = ds, .seed = (uint64_t)i + 1 };
        pthread_create(&th[i], NULL, read_many, &r[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) ck_assert_msg(r[i].ok, "reader %d saw wrong tokens", i);
    dataset_close(ds);
}
END_TEST

/* --- corpus preparation -------------------------------------------------- */

/* A corpus of numbered lines, ~n bytes. */
static size_t make_corpus(const char *name, size_t n) {
    FILE *f = fopen(pathf(name), "wb");
    size_t k = 0;
    for (int i = 0; k < n; i++) {
        int w = fprintf(f, "%d: And it came to pass, line %d\r\n%s", i, i * 7,
                        i % 5 == 0 ? "\n" : "");
        k += (size_t)w;
    }
    fclose(f);
    return k;
}

typedef struct prog {
    uint64_t last, total, calls;
    int monotone;
} prog;

static void on_progress(void *user, uint64_t done, uint64_t total) {
    prog *p = user;
    if (done < p->last) p->monotone = 0;
    p->last = done;
    p->total = total;
    p->calls++;
}

/* Concatenate every token of a dataset and decode it. */
static char *decode_glob(const tokenizer *t, const char *glob, size_t *len) {
    dataset *ds;
    ck_assert_msg(dataset_open(glob, &ds, err, sizeof err) == 0, "%s", err);
    uint64_t n = dataset_total_tokens(ds);
    int32_t *ids = malloc(n * sizeof *ids);
    ck_assert_int_eq(dataset_read(ds, 0, n, ids), 0);
    dataset_close(ds);
    char *text;
    ck_assert_int_eq(tokenizer_decode(t, ids, n, &text, len, err, sizeof err), 0);
    free(ids);
    return text;
}

START_TEST(test_prepare_byte) {
    size_t n = make_corpus("corpus.txt", 20000);
    prog p = { .monotone = 1 };
    char in[PATH_MAX], out[PATH_MAX];
    snprintf(in, sizeof in, "%s", pathf("corpus.txt"));
    snprintf(out, sizeof out, "%s", pathf("out/nested"));
    shard_prepare_opts o = { .tokenizer = "byte",
                             .input = in,
                             .out_dir = out,
                             .val_fraction = 0.1,
                             .shard_tokens = 4000,
                             .progress = on_progress,
                             .progress_user = &p };
    shard_prepare_result r;
    ck_assert_msg(shard_prepare_corpus(&o, &r, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.input_bytes, n);
    ck_assert_uint_eq(r.train_bytes + r.val_bytes, n);
    ck_assert_uint_eq(r.train_tokens, r.train_bytes);
    ck_assert_uint_eq(r.val_tokens, r.val_bytes);
    ck_assert_uint_eq(r.vocab_size, 256);
    /* validation: the last 10% moved forward to a line start */
    ck_assert(r.val_bytes <= n / 10 + 1 && r.val_bytes + 200 > n / 10);
    size_t len;
    unsigned char *all = read_all(pathf("corpus.txt"), &len);
    ck_assert_int_eq(all[r.train_bytes - 1], '\n');
    ck_assert_uint_eq(r.train_shards, (r.train_tokens + 3999) / 4000);
    ck_assert_uint_eq(r.val_shards, (r.val_tokens + 3999) / 4000);
    ck_assert(p.monotone);
    ck_assert_uint_eq(p.last, n);
    ck_assert_uint_eq(p.total, n);
    /* decode(train) + decode(val) == the corpus */
    tokenizer *t;
    ck_assert_int_eq(tokenizer_open("byte", NULL, &t, err, sizeof err), 0);
    size_t tl, vl;
    char *tr = decode_glob(t, pathf("out/nested/train_*.bin"), &tl);
    char *va = decode_glob(t, pathf("out/nested/val_*.bin"), &vl);
    ck_assert_uint_eq(tl + vl, n);
    ck_assert(memcmp(tr, all, tl) == 0 && memcmp(va, all + tl, vl) == 0);
    free(tr);
    free(va);
    ck_assert_int_eq(access(pathf("out/nested/train_004.bin"), F_OK), 0);

    /* Again with bigger shards and no validation: stale files go away. */
    o.shard_tokens = 0;
    o.val_fraction = 0;
    o.progress = NULL;
    ck_assert_msg(shard_prepare_corpus(&o, &r, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.train_shards, 1);
    ck_assert_uint_eq(r.val_shards, 0);
    ck_assert_uint_eq(r.train_tokens, n);
    ck_assert_int_eq(access(pathf("out/nested/train_001.bin"), F_OK), -1);
    ck_assert_int_eq(access(pathf("out/nested/val_000.bin"), F_OK), -1);
    dataset *ds;
    ck_assert_int_eq(dataset_open(pathf("out/nested/train_*.bin"), &ds, err, sizeof err),
                     0);
    ck_assert_uint_eq(dataset_total_tokens(ds), n);
    dataset_close(ds);
    free(all);
    tokenizer_free(t);
}
END_TEST

static void find_vocab(char *out, size_t cap) {
    const char *cands[] = { "data/gpt2", "../../data/gpt2", "../../../data/gpt2" };
    char exe[PATH_MAX - 32];
    ck_assert_int_eq(util_exe_dir(exe, sizeof exe), 0);
    for (int i = 0; i < 3; i++) {
        char p[PATH_MAX + 64];
        if (i == 0)
            snprintf(p, sizeof p, "%s/vocab.bpe", cands[i]);
        else
            snprintf(p, sizeof p, "%s/%s/vocab.bpe", exe, cands[i]);
        if (access(p, R_OK) == 0) {
            size_t l = strlen(p) - strlen("/vocab.bpe");
            ck_assert_uint_lt(l, cap);
            memcpy(out, p, l);
            out[l] = '\0';
            return;
        }
    }
    ck_abort_msg("GPT-2 vocabulary not found (run tools/setup.sh)");
}

START_TEST(test_prepare_gpt2) {
    size_t n = make_corpus("corpus.txt", 30000);
    char vocab[PATH_MAX];
    find_vocab(vocab, sizeof vocab);
    tokenizer *t;
    ck_assert_msg(tokenizer_open("gpt2", vocab, &t, err, sizeof err) == 0, "%s", err);
    shard_prepare_opts o = { .tok = t,
                             .input = pathf("corpus.txt"),
                             .out_dir = pathf("g"),
                             .val_fraction = 0.05,
                             .shard_tokens = 1000 };
    shard_prepare_result r;
    ck_assert_msg(shard_prepare_corpus(&o, &r, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.vocab_size, 50257);
    ck_assert_uint_gt(r.train_shards, 3);
    ck_assert_uint_lt(r.train_tokens, r.train_bytes);
    size_t len, tl, vl;
    unsigned char *all = read_all(pathf("corpus.txt"), &len);
    char *tr = decode_glob(t, pathf("g/train_*.bin"), &tl);
    char *va = decode_glob(t, pathf("g/val_*.bin"), &vl);
    ck_assert_uint_eq(tl + vl, n);
    ck_assert(memcmp(tr, all, tl) == 0 && memcmp(va, all + tl, vl) == 0);
    /* Tokens equal encoding each part directly. */
    int32_t *ids;
    size_t m;
    ck_assert_int_eq(tokenizer_encode(t, (char *)all + tl, vl, &ids, &m, err, sizeof err),
                     0);
    ck_assert_uint_eq(m, r.val_tokens);
    free(ids);
    dataset *ds;
    ck_assert_int_eq(dataset_open(pathf("g/val_*.bin"), &ds, err, sizeof err), 0);
    ck_assert_str_eq(dataset_tokenizer_name(ds), "gpt2");
    dataset_close(ds);
    free(tr);
    free(va);
    free(all);
    tokenizer_free(t);
}
END_TEST

START_TEST(test_prepare_errors) {
    shard_prepare_result r;
    char out[PATH_MAX], in[6][PATH_MAX];
    const char *names[6] = { "missing.txt", "empty.txt", "one.txt",
                             "two.txt",     "file",      NULL };
    for (int i = 0; names[i]; i++) snprintf(in[i], sizeof in[i], "%s", pathf(names[i]));
    snprintf(out, sizeof out, "%s", pathf("o"));
    shard_prepare_opts o = {
        .tokenizer = "byte", .input = in[0], .out_dir = out, .val_fraction = 0.01
    };
    ck_assert_int_eq(shard_prepare_corpus(&o, &r, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "missing.txt"));
    write_all(pathf("empty.txt"), "", 0);
    o.input = in[1];
    ck_assert_int_eq(shard_prepare_corpus(&o, &r, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    write_all(pathf("one.txt"), "just one line\n", 14);
    o.input = in[2];
    ck_assert_int_eq(shard_prepare_corpus(&o, &r, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "single line"));
    o.val_fraction = 0; /* fine without validation */
    ck_assert_msg(shard_prepare_corpus(&o, &r, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.train_tokens, 14);
    /* Two lines: both parts non-empty even with a tiny fraction. */
    write_all(pathf("two.txt"), "first\nsecond", 12);
    o.input = in[3];
    o.val_fraction = 0.001;
    ck_assert_msg(shard_prepare_corpus(&o, &r, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.train_tokens, 6);
    ck_assert_uint_eq(r.val_tokens, 6);
    o.val_fraction = 0.9;
    ck_assert_int_eq(shard_prepare_corpus(&o, &r, err, sizeof err), -1);
    o.val_fraction = 0.01;
    o.tokenizer = "nope";
    ck_assert_int_eq(shard_prepare_corpus(&o, &r, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "nope"));
    o.tokenizer = "byte";
    write_all(pathf("file"), "x", 1);
    o.out_dir = in[4];
    ck_assert_int_eq(shard_prepare_corpus(&o, &r, err, sizeof err), -1);
}
END_TEST

/* --- KJV corpus ---------------------------------------------------------- */

static int have_bible(void) {
    return access("/usr/bin/bible", X_OK) == 0 ||
           system("command -v bible >/dev/null 2>&1") == 0;
}

START_TEST(test_kjv_without_bible) {
    char old[4096];
    snprintf(old, sizeof old, "%s", getenv("PATH") ? getenv("PATH") : "");
    setenv("PATH", dir, 1); /* no `bible` there */
    int rc = corpus_fetch_kjv(pathf("kjv.txt"), err, sizeof err);
    setenv("PATH", old, 1);
    ck_assert_int_eq(rc, -1);
    ck_assert_ptr_nonnull(strstr(err, "bible-kjv"));
    ck_assert_ptr_nonnull(strstr(err, "tools/setup.sh"));
    ck_assert_int_eq(access(pathf("kjv.txt"), F_OK), -1);
    ck_assert_int_eq(count_files("kjv.txt"), 0); /* no temp file left */
}
END_TEST

START_TEST(test_kjv_fetch_and_prepare) {
    ck_assert_msg(have_bible(),
                  "`bible` (package bible-kjv) is missing: run tools/setup.sh");
    ck_assert_msg(corpus_fetch_kjv(pathf("kjv.txt"), err, sizeof err) == 0, "%s", err);
    size_t n;
    unsigned char *t = read_all(pathf("kjv.txt"), &n);
    ck_assert(n > 4000000 && n < 4700000);
    ck_assert_ptr_nonnull(strstr((char *)t, "Genesis 1"));
    free(t);
    ck_assert_int_eq(count_files("kjv.txt"), 1);

    char tg[PATH_MAX], vg[PATH_MAX];
    int prepared = -1;
    ck_assert_msg(corpus_prepare_kjv(dir, "byte", NULL, NULL, tg, sizeof tg, vg,
                                     sizeof vg, &prepared, err, sizeof err) == 0,
                  "%s", err);
    ck_assert_int_eq(prepared, 1);
    ck_assert_str_eq(tg, pathf("kjv-byte/train_*.bin"));
    ck_assert_str_eq(vg, pathf("kjv-byte/val_*.bin"));
    dataset *ds;
    ck_assert_int_eq(dataset_open(tg, &ds, err, sizeof err), 0);
    uint64_t train = dataset_total_tokens(ds);
    dataset_close(ds);
    ck_assert_int_eq(dataset_open(vg, &ds, err, sizeof err), 0);
    uint64_t val = dataset_total_tokens(ds);
    dataset_close(ds);
    ck_assert_uint_eq(train + val, n);
    ck_assert(val > n / 100 - 1000 && val < n / 100 + 1000);
    /* Second call: already there, nothing rebuilt. */
    ck_assert_int_eq(corpus_prepare_kjv(dir, "byte", NULL, NULL, tg, sizeof tg, vg,
                                        sizeof vg, &prepared, err, sizeof err),
                     0);
    ck_assert_int_eq(prepared, 0);
    /* A damaged shard is noticed and the set rebuilt. */
    char shard[PATH_MAX];
    snprintf(shard, sizeof shard, "%s/kjv-byte/val_000.bin", dir);
    ck_assert_int_eq(truncate(shard, 100), 0);
    ck_assert_int_eq(corpus_prepare_kjv(dir, "byte", NULL, NULL, tg, sizeof tg, vg,
                                        sizeof vg, &prepared, err, sizeof err),
                     0);
    ck_assert_int_eq(prepared, 1);
    ck_assert_int_eq(dataset_open(vg, &ds, err, sizeof err), 0);
    ck_assert_uint_eq(dataset_total_tokens(ds), val);
    dataset_close(ds);
    ck_assert_int_eq(count_files("kjv-byte"), 1); /* no .tmp / .old left */
    ck_assert_int_eq(corpus_prepare_kjv(dir, "bpe", NULL, NULL, tg, sizeof tg, vg,
                                        sizeof vg, &prepared, err, sizeof err),
                     -1);
}
END_TEST

START_TEST(test_default_data_dir) {
    char buf[PATH_MAX];
    setenv("ORCH_DATA_DIR", dir, 1);
    ck_assert_int_eq(corpus_default_data_dir(buf, sizeof buf, err, sizeof err), 0);
    ck_assert_str_eq(buf, dir);
    unsetenv("ORCH_DATA_DIR");
    ck_assert_int_eq(corpus_default_data_dir(buf, sizeof buf, err, sizeof err), 0);
    ck_assert_int_gt(strlen(buf), 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_roundtrip_widths);
    tcase_add_test(tc, test_write_atomic_and_errors);
    tcase_add_test(tc, test_corrupt_files);
    tcase_add_test(tc, test_vocab_beyond_int32);
    tcase_add_test(tc, test_mixed_tokenizers);
    tcase_add_test(tc, test_read_across_boundaries);
    tcase_add_test(tc, test_concurrent_reads);
    tcase_add_test(tc, test_prepare_byte);
    tcase_add_test(tc, test_prepare_gpt2);
    tcase_add_test(tc, test_prepare_errors);
    tcase_add_test(tc, test_kjv_without_bible);
    tcase_add_test(tc, test_kjv_fetch_and_prepare);
    tcase_add_test(tc, test_default_data_dir);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
