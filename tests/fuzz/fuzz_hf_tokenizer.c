/*
 * fuzz_hf_tokenizer.c - libFuzzer harness of the "hf" tokenizer kind
 * (data/hf_tokenizer.h through tokenizer.h).
 *
 * The first input byte picks the mode:
 *  - even: the rest is text for the committed tiny tokenizers
 *    (tests/fixtures/hf-tokenizer/): through tiny-bytelevel (ByteLevel, no
 *    normalizer) decode(encode(x)) == x exactly and the tokens' bytes tile
 *    the text, unless it holds "<sep>" (lstrip/rstrip eat white space); through tiny-metaspace and tiny-metaspace-pre (normalizer /
 *    Metaspace, byte fallback) encode and decode succeed; for all, ids are in
 *    range and streaming encode == encode; the text read as little-endian
 *    int32 ids decodes exactly when every id is in range;
 *  - odd: the rest is a tokenizer.json, written to a scratch directory and
 *    opened: a refusal has a one-line message; an accepted file encodes and
 *    decodes a fixed text, with ids in range.
 *
 * Run from the repository root (tests/fuzz/run.sh does). Memory: everything
 * is freed per input (leaks are findings).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/data/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

static const char *const NAMES[3] = { "tiny-bytelevel", "tiny-metaspace",
                                      "tiny-metaspace-pre" };
static tokenizer *toks[3];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char err[1024], dir[512];
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/hf-tokenizer/%s", NAMES[i]);
        if (tokenizer_open("hf", dir, &toks[i], err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_hf_tokenizer: %s (run from the repository root)\n",
                    err);
            exit(1);
        }
    }
    return 0;
}

typedef struct collect {
    int32_t *ids;
    size_t n, last_done;
} collect;

static int sink(void *user, const int32_t *ids, size_t n, size_t bytes_done) {
    collect *c = user;
    FUZZ_CHECK(bytes_done >= c->last_done, "bytes_done went back");
    c->last_done = bytes_done;
    int32_t *v = realloc(c->ids, (c->n + n + 1) * sizeof *v);
    FUZZ_CHECK(v != NULL, "out of memory");
    c->ids = v;
    if (n) memcpy(c->ids + c->n, ids, n * sizeof *ids);
    c->n += n;
    return 0;
}

static void check_text(const tokenizer *t, int exact, const char *s, size_t n) {
    int32_t *ids = NULL;
    size_t k = 0;
    char err[512];
    FUZZ_CHECK(tokenizer_encode(t, s, n, &ids, &k, err, sizeof err) == 0, "encode: %s",
               err);
    uint32_t vocab = tokenizer_vocab_size(t);
    size_t bytes = 0;
    for (size_t i = 0; i < k; i++) {
        const char *tb;
        size_t tl;
        FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < vocab, "id %d", ids[i]);
        FUZZ_CHECK(tokenizer_token_bytes(t, ids[i], &tb, &tl) == 0, "token_bytes(%d)",
                   ids[i]);
        if (exact) {
            FUZZ_CHECK(bytes + tl <= n && memcmp(tb, s + bytes, tl) == 0,
                       "token %zu's bytes are not the text's", i);
            bytes += tl;
        }
    }
    char *text = NULL;
    size_t len = 0;
    FUZZ_CHECK(tokenizer_decode(t, ids, k, &text, &len, err, sizeof err) == 0,
               "decode: %s", err);
    if (exact)
        FUZZ_CHECK(bytes == n && len == n && memcmp(text, s, n) == 0,
                   "decode(encode(x)) != x (%zu vs %zu bytes)", len, n);
    free(text);
    collect c = { 0 };
    FUZZ_CHECK(tokenizer_encode_stream(t, s, n, sink, &c, err, sizeof err) == 0,
               "encode_stream: %s", err);
    FUZZ_CHECK(c.last_done == n, "stream ended at %zu of %zu", c.last_done, n);
    FUZZ_CHECK(c.n == k && (k == 0 || memcmp(c.ids, ids, k * sizeof *ids) == 0),
               "stream ids differ from encode's");
    free(c.ids);
    free(ids);
}

static void check_ids(const tokenizer *t, const uint8_t *data, size_t size) {
    size_t n = size / 4;
    int32_t *raw = malloc((n + 1) * sizeof *raw);
    FUZZ_CHECK(raw != NULL, "out of memory");
    uint32_t vocab = tokenizer_vocab_size(t);
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)data[4 * i] | (uint32_t)data[4 * i + 1] << 8 |
                     (uint32_t)data[4 * i + 2] << 16 | (uint32_t)data[4 * i + 3] << 24;
        memcpy(&raw[i], &u, 4);
        const char *tb;
        size_t tl;
        if (bad == n && tokenizer_token_bytes(t, raw[i], &tb, &tl) != 0) bad = i;
    }
    char *text = NULL, err[256] = "";
    size_t len = 0;
    int rc = tokenizer_decode(t, raw, n, &text, &len, err, sizeof err);
    FUZZ_CHECK((rc == 0) == (bad == n), "decode rc %d, first bad id at %zu", rc, bad);
    (void)vocab;
    free(text);
    free(raw);
}

static void check_file(const uint8_t *data, size_t size) {
    char path[4200], err[1024] = "";
    fuzz_write_scratch("tokenizer.json", data, size, path, sizeof path);
    tokenizer *t = NULL;
    if (tokenizer_open("hf", fuzz_scratch_dir(), &t, err, sizeof err) != 0) {
        FUZZ_CHECK(t == NULL && err[0] && !strchr(err, '\n'), "refusal message '%s'",
                   err);
        return;
    }
    static const char text[] =
        "Hello <|im_start|> w\xc3\xb6rld\n\t 123 \xf0\x9f\x98\x80 </s>";
    check_text(t, 0, text, sizeof text - 1);
    tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        check_file(rest, n);
        return 0;
    }
    /* <sep> has lstrip / rstrip: it swallows the white space around it. */
    int sep = memmem(rest, n, "<sep>", 5) != NULL;
    for (int i = 0; i < 3; i++) {
        check_text(toks[i], i == 0 && !sep, (const char *)rest, n);
        check_ids(toks[i], rest, n);
    }
    return 0;
}
