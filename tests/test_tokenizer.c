/*
 * test_tokenizer.c - Check suite for orchestrator/data/tokenizer.{c,h}: every case
 * of the shared GPT-2 fixture (llama.cpp's r50k cases) and of a random
 * fixture made with the reference npm encoder, decode(encode(x)) == x for
 * random UTF-8 over all planes and for random (invalid) bytes, long pieces,
 * "<|endoftext|>" as plain text, the byte tokenizer, streaming encode,
 * concurrent encoding, bad ids, and clear errors for missing or broken
 * vocabulary files.
 */
#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"
#include "tests/test_util.h"

static char root[PATH_MAX]; /* repository root (holds tests/fixtures) */
static char vocab_dir[PATH_MAX + 16];
static char err[2048];

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* The repository root: the working directory (tests/run_tests.sh runs from
   it) or two/three levels above the test binary (build[/asan]/tests). */
static void find_root(void) {
    const char *rel = "tests/fixtures/gpt2-tokenizer/cases.inp";
    char exe[PATH_MAX - 16], p[PATH_MAX + 64];
    const char *cands[3] = { ".", NULL, NULL };
    char c1[PATH_MAX], c2[PATH_MAX];
    if (util_exe_dir(exe, sizeof exe) == 0) {
        snprintf(c1, sizeof c1, "%s/../..", exe);
        snprintf(c2, sizeof c2, "%s/../../..", exe);
        cands[1] = c1;
        cands[2] = c2;
    }
    for (int i = 0; i < 3; i++) {
        if (!cands[i]) continue;
        snprintf(p, sizeof p, "%s/%s", cands[i], rel);
        if (file_exists(p)) {
            snprintf(root, sizeof root, "%s", cands[i]);
            snprintf(vocab_dir, sizeof vocab_dir, "%s/data/gpt2", root);
            return;
        }
    }
    ck_abort_msg("cannot find %s from the working directory or the binary", rel);
}

static tokenizer *open_gpt2(void) {
    find_root();
    tokenizer *t = NULL;
    int rc = tokenizer_open("gpt2", vocab_dir, &t, err, sizeof err);
    ck_assert_msg(rc == 0, "gpt2 vocabulary (run tools/setup.sh): %s", err);
    return t;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

/* encode then decode; asserts the round trip and returns the ids. */
static int32_t *roundtrip(const tokenizer *t, const char *s, size_t n, size_t *n_ids) {
    int32_t *ids;
    ck_assert_msg(tokenizer_encode(t, s, n, &ids, n_ids, err, sizeof err) == 0, "%s",
                  err);
    /* (Check asserts are costly in loops: one message per call.) */
    size_t bad_at = *n_ids;
    for (size_t i = 0; i < *n_ids && bad_at == *n_ids; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= tokenizer_vocab_size(t)) bad_at = i;
    ck_assert_msg(bad_at == *n_ids, "id out of range at %zu", bad_at);
    char *back;
    size_t bl;
    ck_assert_msg(tokenizer_decode(t, ids, *n_ids, &back, &bl, err, sizeof err) == 0,
                  "%s", err);
    ck_assert_uint_eq(bl, n);
    ck_assert_msg(memcmp(back, s, n) == 0, "round trip changed the bytes");
    ck_assert_int_eq(back[bl], '\0');
    free(back);
    return ids;
}

/* Run every case of a fixture directory (cases.inp / cases.out). */
static void run_fixture(const char *dir) {
    tokenizer *t = open_gpt2();
    char p[PATH_MAX + 128];
    size_t il, ol;
    snprintf(p, sizeof p, "%s/tests/fixtures/%s/cases.inp", root, dir);
    char *inp = slurp(p, &il);
    snprintf(p, sizeof p, "%s/tests/fixtures/%s/cases.out", root, dir);
    char *out = slurp(p, &ol);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sl = strlen(sep);
    char *ip = inp, *op = out;
    int cases = 0;
    for (;;) {
        char *e = memmem(ip, (size_t)(inp + il - ip), sep, sl);
        if (!e) break;
        char *oe = strchr(op, '\n');
        ck_assert_msg(oe != NULL, "%s: fewer output lines than cases", dir);
        *oe = '\0';
        size_t n;
        int32_t *ids = roundtrip(t, ip, (size_t)(e - ip), &n);
        char got[65536];
        size_t g = 0;
        for (size_t i = 0; i < n && g + 16 < sizeof got; i++)
            g += (size_t)snprintf(got + g, sizeof got - g, " %d", ids[i]);
        got[g] = '\0';
        ck_assert_msg(strcmp(got, op) == 0, "%s case %d (\"%.*s\"):\n got %s\nwant %s",
                      dir, cases + 1, (int)((e - ip) > 60 ? 60 : (e - ip)), ip, got, op);
        free(ids);
        cases++;
        ip = e + sl;
        op = oe + 1;
    }
    ck_assert_msg(*op == '\0', "%s: more output lines than cases", dir);
    ck_assert_int_gt(cases, 40);
    free(inp);
    free(out);
    tokenizer_free(t);
}

START_TEST(test_shared_fixture) {
    run_fixture("gpt2-tokenizer");
    /* The committed copy must equal the shared one where that exists. */
    const char *shared[] = { "../shared/fixtures/gpt2-tokenizer",
                             "/work/shared/fixtures/gpt2-tokenizer" };
    for (int i = 0; i < 2; i++) {
        char a[PATH_MAX + 64], b[PATH_MAX + 64];
        snprintf(a, sizeof a, "%s/%s/cases.out", root, shared[i]);
        if (shared[i][0] == '/') snprintf(a, sizeof a, "%s/cases.out", shared[i]);
        if (!file_exists(a)) continue;
        snprintf(b, sizeof b, "%s/tests/fixtures/gpt2-tokenizer/cases.out", root);
        size_t la, lb;
        char *x = slurp(a, &la), *y = slurp(b, &lb);
        ck_assert_msg(la == lb && memcmp(x, y, la) == 0,
                      "tests/fixtures/gpt2-tokenizer differs from %s", a);
        free(x);
        free(y);
        break;
    }
}
END_TEST

START_TEST(test_random_reference_fixture) { run_fixture("gpt2-random"); }
END_TEST

/* --- random text ------------------------------------------------------- */

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Random valid UTF-8 of about n bytes: every plane, emoji, combining
   marks, whitespace runs, digits, contractions. */
static size_t random_utf8(char *o, size_t n) {
    size_t k = 0;
    while (k + 8 < n) {
        uint32_t cp;
        switch (rnd() % 12) {
        case 0: cp = 0x20 + rnd() % 95; break;          /* ASCII */
        case 1: cp = " \t\n\r\v\f"[rnd() % 6]; break;   /* whitespace */
        case 2: cp = 0x300 + rnd() % 0x70; break;       /* combining */
        case 3: cp = 0x1f300 + rnd() % 0x700; break;    /* emoji */
        case 4: cp = 0x4e00 + rnd() % 0x5200; break;    /* CJK */
        case 5: cp = 0x80 + rnd() % 0x780; break;       /* 2-byte */
        case 6: cp = 0x10000 + rnd() % 0x100000; break; /* astral */
        case 7: cp = 0xe000 + rnd() % 0x2000; break;    /* BMP high */
        case 8: cp = '0' + rnd() % 10; break;
        case 9: {
            const char *c[] = { "'s",     "'ll",    "'RE",    "  ",     "\n\n",
                                "\u2028", "\u00a0", "\u200d", "\ufe0f", "<|endoftext|>" };
            const char *s = c[rnd() % 10];
            size_t l = strlen(s);
            memcpy(o + k, s, l);
            k += l;
            continue;
        }
        default: cp = 0x800 + rnd() % 0xd000; break; /* below surrogates */
        }
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        k += put_utf8(o + k, cp);
    }
    return k;
}

START_TEST(test_roundtrip_random_utf8) {
    tokenizer *t = open_gpt2();
    char *buf = malloc(4096);
    for (uint64_t seed = 1; seed <= 300; seed++) {
        rng_state = seed;
        size_t n = random_utf8(buf, 64 + rnd() % 4000);
        size_t k;
        free(roundtrip(t, buf, n, &k));
    }
    free(buf);
    tokenizer_free(t);
}
END_TEST

START_TEST(test_roundtrip_random_bytes) {
    tokenizer *t = open_gpt2();
    tokenizer *b;
    ck_assert_int_eq(tokenizer_open("byte", NULL, &b, err, sizeof err), 0);
    unsigned char buf[3000];
    static const char *bad[] = {
        "\xff", "\xc0\xaf",     "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80",
        "\x80", "\xf0\x9f\x98", "\0",           " \xfe ",   "\xc3"
    };
    for (uint64_t seed = 1; seed <= 300; seed++) {
        rng_state = seed * 7919;
        size_t n = rnd() % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            buf[i] = (unsigned char)rnd();
            if (rnd() % 3 == 0) buf[i] = (unsigned char)(0x20 + rnd() % 95);
            if (rnd() % 16 == 0) { /* a known-invalid sequence */
                const char *s = bad[rnd() % 10];
                size_t l = strlen(s) ? strlen(s) : 1;
                if (i + l <= n) {
                    memcpy(buf + i, s, l);
                    i += l - 1;
                }
            }
        }
        size_t k;
        free(roundtrip(t, (const char *)buf, n, &k));
        int32_t *ids = roundtrip(b, (const char *)buf, n, &k);
        ck_assert_uint_eq(k, n);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= ids[i] == buf[i];
        ck_assert_msg(same, "byte ids differ from the bytes");
        free(ids);
    }
    /* Every single byte and every pair of a byte with a space. */
    for (int c = 0; c < 256; c++) {
        char s[3] = { (char)c, ' ', (char)c };
        size_t k;
        free(roundtrip(t, s, 1, &k));
        ck_assert_uint_eq(k, 1);
        free(roundtrip(t, s, 3, &k));
    }
    tokenizer_free(b);
    tokenizer_free(t);
}
END_TEST

START_TEST(test_long_pieces) {
    tokenizer *t = open_gpt2();
    size_t n = 200000;
    char *s = malloc(n);
    const char fill[] = { 'a', ' ', '!', '7', '\n' };
    for (int f = 0; f < 5; f++) {
        memset(s, fill[f], n);
        size_t k;
        int32_t *ids = roundtrip(t, s, n, &k);
        /* runs merge into multi-byte tokens (GPT-2 has none for spaces) */
        if (fill[f] != ' ')
            ck_assert_uint_lt(k, n);
        else
            ck_assert_uint_eq(k, n);
        free(ids);
    }
    /* A very long random "word" of letters: one piece, BPE via the heap. */
    rng_state = 99;
    for (size_t i = 0; i < n; i++) s[i] = (char)('a' + rnd() % 26);
    size_t k;
    free(roundtrip(t, s, n, &k));
    free(s);
    tokenizer_free(t);
}
END_TEST

START_TEST(test_gpt2_basics) {
    tokenizer *t = open_gpt2();
    ck_assert_str_eq(tokenizer_name(t), "gpt2");
    ck_assert_uint_eq(tokenizer_vocab_size(t), 50257);
    ck_assert_int_eq(tokenizer_eot(t), 50256);
    const char *b;
    size_t l;
    ck_assert_int_eq(tokenizer_token_bytes(t, 50256, &b, &l), 0);
    ck_assert_uint_eq(l, 13);
    ck_assert(memcmp(b, "<|endoftext|>", 13) == 0);
    ck_assert_int_eq(tokenizer_token_bytes(t, 0, &b, &l), 0);
    ck_assert(l == 1 && b[0] == '!');
    ck_assert_int_eq(tokenizer_token_bytes(t, 220, &b, &l), 0); /* "Ġ" */
    ck_assert(l == 1 && b[0] == ' ');
    ck_assert_int_eq(tokenizer_token_bytes(t, 50257, &b, &l), -1);
    ck_assert_int_eq(tokenizer_token_bytes(t, -1, &b, &l), -1);

    /* "<|endoftext|>" in text is plain text, never id 50256. */
    size_t n;
    int32_t *ids = roundtrip(t, "a<|endoftext|>b", 15, &n);
    ck_assert_uint_gt(n, 3);
    for (size_t i = 0; i < n; i++) ck_assert_int_ne(ids[i], 50256);
    free(ids);

    ids = roundtrip(t, "Hello world", 11, &n);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(ids[0], 15496);
    ck_assert_int_eq(ids[1], 995);
    free(ids);

    ids = roundtrip(t, "", 0, &n);
    ck_assert_ptr_nonnull(ids);
    ck_assert_uint_eq(n, 0);
    free(ids);

    int32_t badids[] = { 15496, 50257, 995 };
    char *text;
    size_t tl;
    ck_assert_int_eq(tokenizer_decode(t, badids, 3, &text, &tl, err, sizeof err), -1);
    ck_assert_ptr_null(text);
    ck_assert_ptr_nonnull(strstr(err, "50257"));
    ck_assert_ptr_nonnull(strstr(err, "position 1"));
    badids[1] = -5;
    ck_assert_int_eq(tokenizer_decode(t, badids, 3, &text, &tl, err, sizeof err), -1);
    tokenizer_free(t);
}
END_TEST

START_TEST(test_byte_tokenizer) {
    tokenizer *t;
    ck_assert_int_eq(tokenizer_open("byte", "/nonexistent", &t, err, sizeof err), 0);
    ck_assert_str_eq(tokenizer_name(t), "byte");
    ck_assert_uint_eq(tokenizer_vocab_size(t), 256);
    ck_assert_int_eq(tokenizer_eot(t), -1);
    const char s[] = "A\0\r\n\xff";
    size_t n;
    int32_t *ids = roundtrip(t, s, 5, &n);
    ck_assert_uint_eq(n, 5);
    int32_t want[] = { 65, 0, 13, 10, 255 };
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids[i], want[i]);
    free(ids);
    for (int i = 0; i < 256; i++) {
        const char *b;
        size_t l;
        ck_assert_int_eq(tokenizer_token_bytes(t, i, &b, &l), 0);
        ck_assert(l == 1 && (unsigned char)b[0] == i);
    }
    int32_t bad = 256;
    char *text;
    size_t tl;
    ck_assert_int_eq(tokenizer_decode(t, &bad, 1, &text, &tl, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "256"));
    tokenizer_free(t);
}
END_TEST

/* --- streaming ------------------------------------------------------------ */

typedef struct collect {
    int32_t *ids;
    size_t n, calls, last_done, stop_after;
    int monotone;
} collect;

static int collect_sink(void *user, const int32_t *ids, size_t n, size_t bytes_done) {
    collect *c = user;
    c->ids = realloc(c->ids, (c->n + n + 1) * sizeof *c->ids);
    memcpy(c->ids + c->n, ids, n * sizeof *ids);
    c->n += n;
    if (bytes_done < c->last_done) c->monotone = 0;
    c->last_done = bytes_done;
    c->calls++;
    if (c->stop_after && c->calls >= c->stop_after) return 1;
    return 0;
}

START_TEST(test_encode_stream) {
    size_t n = 600000;
    char *s = malloc(n);
    rng_state = 5;
    n = random_utf8(s, n);
    for (int k = 0; k < 2; k++) {
        tokenizer *t = k == 0 ? open_gpt2() : NULL;
        if (k == 1)
            ck_assert_int_eq(tokenizer_open("byte", NULL, &t, err, sizeof err), 0);
        int32_t *ids;
        size_t m;
        ck_assert_int_eq(tokenizer_encode(t, s, n, &ids, &m, err, sizeof err), 0);
        collect c = { .monotone = 1 };
        ck_assert_int_eq(
            tokenizer_encode_stream(t, s, n, collect_sink, &c, err, sizeof err), 0);
        ck_assert_uint_eq(c.n, m);
        ck_assert(memcmp(c.ids, ids, m * sizeof *ids) == 0);
        ck_assert_uint_gt(c.calls, 2);
        ck_assert(c.monotone);
        ck_assert_uint_eq(c.last_done, n);
        free(c.ids);
        /* A sink that stops makes the call fail with a message. */
        collect stop = { .monotone = 1, .stop_after = 1 };
        ck_assert_int_eq(
            tokenizer_encode_stream(t, s, n, collect_sink, &stop, err, sizeof err), -1);
        ck_assert_uint_eq(stop.calls, 1);
        ck_assert_int_gt(strlen(err), 0);
        free(stop.ids);
        free(ids);
        tokenizer_free(t);
    }
    free(s);
}
END_TEST

/* --- threads -------------------------------------------------------------- */

typedef struct job {
    const tokenizer *t;
    const char *s;
    size_t n;
    int32_t *ids;
    size_t m;
    int rc;
} job;

static void *encode_job(void *arg) {
    job *j = arg;
    char e[256];
    for (int rep = 0; rep < 3 && j->rc == 0; rep++) {
        int32_t *ids;
        size_t m;
        j->rc = tokenizer_encode(j->t, j->s, j->n, &ids, &m, e, sizeof e);
        if (j->rc == 0 && rep > 0 &&
            (m != j->m || memcmp(ids, j->ids, m * sizeof *ids) != 0))
            j->rc = -2;
        if (rep == 0) {
            j->ids = ids;
            j->m = m;
        } else {
            free(ids);
        }
    }
    return NULL;
}

START_TEST(test_concurrent_encode) {
    tokenizer *t = open_gpt2();
    enum { NT = 4 };
    char *texts[NT];
    job jobs[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        texts[i] = malloc(50000);
        rng_state = 1000 + (uint64_t)i;
        jobs[i] = (job){ .t = t, .s = texts[i], .n = random_utf8(texts[i], 50000) };
    }
    for (int i = 0; i < NT; i++) pthread_create(&th[i], NULL, encode_job, &jobs[i]);
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NT; i++) {
        ck_assert_int_eq(jobs[i].rc, 0);
        int32_t *ids;
        size_t m;
        ck_assert_int_eq(
            tokenizer_encode(t, jobs[i].s, jobs[i].n, &ids, &m, err, sizeof err), 0);
        ck_assert_uint_eq(m, jobs[i].m);
        ck_assert(memcmp(ids, jobs[i].ids, m * sizeof *ids) == 0);
        free(ids);
        free(jobs[i].ids);
        free(texts[i]);
    }
    tokenizer_free(t);
}
END_TEST

/* --- errors --------------------------------------------------------------- */

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(s, f);
    fclose(f);
}

START_TEST(test_open_errors) {
    tokenizer *t = (tokenizer *)1;
    ck_assert_int_eq(tokenizer_open("bpe", NULL, &t, err, sizeof err), -1);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(err, "bpe"));
    ck_assert_int_eq(tokenizer_kind_valid("gpt2"), 1);
    ck_assert_int_eq(tokenizer_kind_valid("GPT2"), 0);

    ck_assert_int_eq(tokenizer_open("gpt2", "/nonexistent/dir", &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "tools/setup.sh"));
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/dir"));

    /* Default search with nothing to find (fresh cwd, ORCH_DATA_DIR unset
       target; the test binary's ../data/gpt2 does not exist). */
    char dir[64];
    test_tmpdir(dir, sizeof dir, "tokenizer");
    find_root();
    char abs_vocab[PATH_MAX];
    ck_assert_ptr_nonnull(realpath(vocab_dir, abs_vocab));
    ck_assert_int_eq(chdir(dir), 0);
    setenv("ORCH_DATA_DIR", dir, 1);
    char exe[PATH_MAX], probe[PATH_MAX + 32];
    ck_assert_int_eq(util_exe_dir(exe, sizeof exe), 0);
    snprintf(probe, sizeof probe, "%s/../data/gpt2/vocab.bpe", exe);
    if (!file_exists(probe)) {
        ck_assert_int_eq(tokenizer_open("gpt2", NULL, &t, err, sizeof err), -1);
        ck_assert_ptr_nonnull(strstr(err, "tools/setup.sh"));
        ck_assert_ptr_nonnull(strstr(err, dir));
    }

    /* ORCH_DATA_DIR/gpt2 is searched first. */
    char sub[PATH_MAX], p[PATH_MAX + 32], q[PATH_MAX + 32];
    snprintf(sub, sizeof sub, "%s/gpt2", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(p, sizeof p, "%s/encoder.json", sub);
    snprintf(q, sizeof q, "%s/encoder.json", abs_vocab);
    ck_assert_int_eq(symlink(q, p), 0);
    snprintf(p, sizeof p, "%s/vocab.bpe", sub);
    snprintf(q, sizeof q, "%s/vocab.bpe", abs_vocab);
    ck_assert_int_eq(symlink(q, p), 0);
    char found[PATH_MAX];
    ck_assert_int_eq(tokenizer_find_gpt2_dir(found, sizeof found, err, sizeof err), 0);
    ck_assert_str_eq(found, sub);
    ck_assert_int_eq(tokenizer_open("gpt2", NULL, &t, err, sizeof err), 0);
    tokenizer_free(t);

    /* Broken files: not JSON; a merge with an unknown token. */
    char bad[PATH_MAX];
    snprintf(bad, sizeof bad, "%s/bad", dir);
    ck_assert_int_eq(mkdir(bad, 0755), 0);
    snprintf(p, sizeof p, "%s/encoder.json", bad);
    write_file(p, "{not json");
    snprintf(p, sizeof p, "%s/vocab.bpe", bad);
    write_file(p, "#version: 0.2\n");
    ck_assert_int_eq(tokenizer_open("gpt2", bad, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "encoder.json"));

    /* A tiny but well-formed vocabulary: 256 byte tokens in GPT-2 spelling
       plus "ab"; then a merge naming a missing token. */
    FILE *f = fopen((snprintf(p, sizeof p, "%s/encoder.json", bad), p), "wb");
    fputc('{', f);
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable =
            (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = printable ? b : 256 + n++;
        fprintf(f, "%s\"\\u%04x\": %d", b ? ", " : "", cp, b);
    }
    fprintf(f, ", \"ab\": 256}");
    fclose(f);
    snprintf(p, sizeof p, "%s/vocab.bpe", bad);
    write_file(p, "#version: 0.2\na b\n");
    ck_assert_int_eq(tokenizer_open("gpt2", bad, &t, err, sizeof err), 0);
    ck_assert_uint_eq(tokenizer_vocab_size(t), 257);
    size_t k;
    int32_t *ids = roundtrip(t, "abab xab", 8, &k);
    ck_assert_uint_eq(k, 5); /* ab ab Ġ x ab */
    ck_assert_int_eq(ids[0], 256);
    ck_assert_int_eq(ids[4], 256);
    free(ids);
    tokenizer_free(t);
    write_file(p, "#version: 0.2\na b\nab zz\n");
    ck_assert_int_eq(tokenizer_open("gpt2", bad, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "line 3"));
    write_file(p, "#version: 0.2\nab\n");
    ck_assert_int_eq(tokenizer_open("gpt2", bad, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "line 2"));
    test_rmdir(dir);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_shared_fixture);
    tcase_add_test(tc, test_random_reference_fixture);
    tcase_add_test(tc, test_roundtrip_random_utf8);
    tcase_add_test(tc, test_roundtrip_random_bytes);
    tcase_add_test(tc, test_long_pieces);
    tcase_add_test(tc, test_gpt2_basics);
    tcase_add_test(tc, test_byte_tokenizer);
    tcase_add_test(tc, test_encode_stream);
    tcase_add_test(tc, test_concurrent_encode);
    tcase_add_test(tc, test_open_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
