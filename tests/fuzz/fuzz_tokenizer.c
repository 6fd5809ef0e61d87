/*
 * fuzz_tokenizer.c - libFuzzer harness of the tokenizers (data/tokenizer.h),
 * the byte tokenizer and GPT-2's byte-level BPE.
 *
 * For each tokenizer the input is used twice:
 *  - as text: decode(encode(x)) must give exactly the bytes x (any bytes,
 *    invalid UTF-8 included); the streaming encoder gives the same ids; the
 *    ids are in range, GPT-2 never yields the end-of-text id for text, the
 *    byte tokenizer yields one id per byte, the byte value; concatenating
 *    tokenizer_token_bytes gives the decoded text;
 *  - as token ids (4 bytes each, little-endian): raw ids decode only when all
 *    are in range, and an out-of-range id is named; ids taken modulo the
 *    vocabulary decode to some text whose own encoding decodes back to it.
 *
 * Needs the GPT-2 vocabulary (tools/setup.sh): $ORCH_DATA_DIR/gpt2 or
 * ./data/gpt2. Memory: everything is freed per input (leaks are findings).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/data/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

static tokenizer *toks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char err[1024];
    if (tokenizer_open("byte", NULL, &toks[0], err, sizeof err) != 0 ||
        tokenizer_open("gpt2", NULL, &toks[1], err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        exit(1);
    }
    return 0;
}

typedef struct collect {
    int32_t *ids;
    size_t n, cap;
    size_t last_done;
} collect;

static int sink(void *user, const int32_t *ids, size_t n, size_t bytes_done) {
    collect *c = user;
    FUZZ_CHECK(bytes_done >= c->last_done, "bytes_done went back");
    c->last_done = bytes_done;
    if (c->n + n > c->cap) {
        size_t cap = (c->n + n) * 2 + 16;
        int32_t *v = realloc(c->ids, cap * sizeof *v);
        FUZZ_CHECK(v != NULL, "out of memory");
        c->ids = v;
        c->cap = cap;
    }
    if (n) memcpy(c->ids + c->n, ids, n * sizeof *ids);
    c->n += n;
    return 0;
}

/* decode(ids) must be exactly want[0..want_len). */
static void check_decodes_to(const tokenizer *t, const int32_t *ids, size_t n,
                             const char *want, size_t want_len) {
    char *text = NULL;
    size_t len = 0;
    char err[256];
    FUZZ_CHECK(tokenizer_decode(t, ids, n, &text, &len, err, sizeof err) == 0,
               "%s decode: %s", tokenizer_name(t), err);
    FUZZ_CHECK(len == want_len && memcmp(text, want, len) == 0 && text[len] == '\0',
               "%s: decode(encode(x)) != x (%zu vs %zu bytes)", tokenizer_name(t), len,
               want_len);
    free(text);
}

static void check_text(const tokenizer *t, const char *s, size_t n) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char err[256];
    FUZZ_CHECK(tokenizer_encode(t, s, n, &ids, &n_ids, err, sizeof err) == 0,
               "%s encode: %s", tokenizer_name(t), err);
    FUZZ_CHECK(ids != NULL, "ids NULL on success");
    int byte = strcmp(tokenizer_name(t), "byte") == 0;
    uint32_t vocab = tokenizer_vocab_size(t);
    size_t bytes = 0;
    for (size_t i = 0; i < n_ids; i++) {
        FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < vocab, "id %d", ids[i]);
        FUZZ_CHECK(ids[i] != tokenizer_eot(t), "end-of-text id from plain text");
        if (byte) FUZZ_CHECK(ids[i] == (unsigned char)s[i], "byte id %d", ids[i]);
        const char *tb;
        size_t tl;
        FUZZ_CHECK(tokenizer_token_bytes(t, ids[i], &tb, &tl) == 0 && tl > 0,
                   "token_bytes(%d)", ids[i]);
        FUZZ_CHECK(bytes + tl <= n && memcmp(tb, s + bytes, tl) == 0,
                   "token %zu's bytes are not the text's", i);
        bytes += tl;
    }
    FUZZ_CHECK(bytes == n, "tokens cover %zu of %zu bytes", bytes, n);
    FUZZ_CHECK(!byte || n_ids == n, "byte tokenizer: %zu ids for %zu bytes", n_ids, n);
    check_decodes_to(t, ids, n_ids, s, n);

    collect c = { 0 };
    FUZZ_CHECK(tokenizer_encode_stream(t, s, n, sink, &c, err, sizeof err) == 0,
               "encode_stream: %s", err);
    FUZZ_CHECK(c.last_done == n, "stream ended at %zu of %zu", c.last_done, n);
    FUZZ_CHECK(c.n == n_ids && (n_ids == 0 || memcmp(c.ids, ids, n_ids * 4) == 0),
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
        if (bad == n && (raw[i] < 0 || (uint32_t)raw[i] >= vocab)) bad = i;
    }
    char *text = NULL;
    size_t len = 0;
    char err[256] = "";
    int rc = tokenizer_decode(t, raw, n, &text, &len, err, sizeof err);
    FUZZ_CHECK((rc == 0) == (bad == n), "decode rc %d, first bad id at %zu", rc, bad);
    if (rc != 0) {
        char pos[64];
        snprintf(pos, sizeof pos, "position %zu", bad);
        FUZZ_CHECK(strstr(err, pos) != NULL, "error does not name %s: %s", pos, err);
    }
    free(text);
    for (size_t i = 0; i < n; i++) raw[i] = (int32_t)((uint32_t)raw[i] % vocab);
    FUZZ_CHECK(tokenizer_decode(t, raw, n, &text, &len, err, sizeof err) == 0,
               "decode of ids in range: %s", err);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    FUZZ_CHECK(tokenizer_encode(t, text, len, &ids, &n_ids, err, sizeof err) == 0,
               "encode: %s", err);
    check_decodes_to(t, ids, n_ids, text, len);
    free(ids);
    free(text);
    free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int k = 0; k < 2; k++) {
        check_text(toks[k], (const char *)data, size);
        check_ids(toks[k], data, size);
    }
    return 0;
}
