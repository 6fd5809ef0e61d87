/*
 * bpe_vocab.c - the token tables of a byte-level BPE tokenizer: 256
 * single-byte tokens, or GPT-2's encoder.json and vocab.bpe turned back into
 * raw bytes and an id-pair merge table. See bpe_vocab.h.
 *
 * encoder.json keys are GPT-2's "byte to unicode" spelling: bytes 33..126,
 * 161..172 and 174..255 stand for themselves, the other 68 bytes map to
 * U+0100.. in byte order. Keys are turned back into raw bytes at load.
 */
#include "orchestrator/data/bpe_vocab.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/core/utf8.h"

/* encoder.json is ~1 MB and vocab.bpe ~0.5 MB; refuse anything absurd. */
#define VOCAB_FILE_MAX_BYTES ((size_t)64 << 20)

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- GPT-2 byte <-> unicode mapping ----------------------------------- */

static int gpt2_byte_printable(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* code point -> byte (or -1), for code points below 512. */
static void gpt2_unicode_to_byte(int16_t map[512]) {
    for (int i = 0; i < 512; i++) map[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        if (gpt2_byte_printable(b))
            map[b] = (int16_t)b;
        else
            map[256 + n++] = (int16_t)b;
    }
}

/* Convert a GPT-2 "unicode spelled" token (UTF-8, length n) to raw bytes in
   out (capacity >= n). Returns the byte count, or -1 on a character outside
   the mapping. */
static long gpt2_spelling_to_bytes(const int16_t map[512], const char *s, size_t n,
                                   unsigned char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = utf8_decode((const char *)p + i, n - i, &cp);
        if (l == 0 || cp >= 512 || map[cp] < 0) return -1;
        out[o++] = (unsigned char)map[cp];
        i += l;
    }
    return (long)o;
}

size_t bpe_gpt2_spell(const unsigned char *bytes, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int b = bytes[i];
        uint32_t cp = (uint32_t)b;
        if (!gpt2_byte_printable(b)) { /* 256 + rank among the unprintable bytes */
            cp = 256;
            for (int k = 0; k < b; k++) cp += !gpt2_byte_printable(k);
        }
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else { /* < 0x800: two bytes */
            out[o++] = (char)(0xc0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    return o;
}

typedef struct ranked_pair {
    uint32_t rank;
    int32_t a, b;
} ranked_pair;

static int cmp_rank(const void *x, const void *y) {
    uint32_t a = ((const ranked_pair *)x)->rank, b = ((const ranked_pair *)y)->rank;
    return a < b ? -1 : a > b;
}

int bpe_vocab_merges(const bpe_vocab *v, int32_t **pairs, size_t *n, char *err,
                     size_t err_cap) {
    size_t count = 0;
    for (size_t i = 0; i < v->merge_cap; i++) count += v->merge_keys[i] != 0;
    ranked_pair *r = util_calloc(count ? count : 1, sizeof *r);
    int32_t *out = util_calloc(count ? 2 * count : 1, sizeof *out);
    if (!r || !out) {
        free(r);
        free(out);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < v->merge_cap; i++) {
        uint64_t key = v->merge_keys[i];
        if (key == 0) continue;
        key -= 1;
        r[k].rank = v->merge_rank[i];
        r[k].a = (int32_t)(uint32_t)(key >> 32);
        r[k].b = (int32_t)(uint32_t)key;
        k++;
    }
    qsort(r, count, sizeof *r, cmp_rank);
    for (size_t i = 0; i < count; i++) {
        out[2 * i] = r[i].a;
        out[2 * i + 1] = r[i].b;
    }
    free(r);
    *pairs = out;
    *n = count;
    return 0;
}

static char *read_vocab_file(const char *path, size_t *len, char *err, size_t err_cap) {
    char *buf = NULL, msg[PATH_MAX + 128];
    if (fsio_read_file(path, VOCAB_FILE_MAX_BYTES, &buf, len, msg, sizeof msg) != 0) {
        util_set_err(err, err_cap, "cannot read %s (run tools/setup.sh)", msg);
        return NULL;
    }
    return buf;
}

typedef struct vocab_index { /* raw token bytes -> id, open addressing */
    int32_t *slot;           /* -1 = empty */
    size_t cap;
} vocab_index;

static int32_t vocab_index_find(const bpe_vocab *t, const vocab_index *vi,
                                const unsigned char *b, size_t n) {
    size_t mask = vi->cap - 1;
    for (size_t i = bpe_hash_bytes(b, n) & mask;; i = (i + 1) & mask) {
        int32_t id = vi->slot[i];
        if (id < 0) return -1;
        size_t l = t->off[id + 1] - t->off[id];
        if (l == n && memcmp(t->pool + t->off[id], b, n) == 0) return id;
    }
}

/* Load encoder.json into t->pool/off/vocab_size/eot. */
static int load_encoder(bpe_vocab *t, const char *dir, const int16_t map[512], char *err,
                        size_t err_cap) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/encoder.json", dir) >= (int)sizeof path) {
        util_set_err(err, err_cap, "path too long: %s", dir);
        return -1;
    }
    size_t len;
    char *text = read_vocab_file(path, &len, err, err_cap);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        util_set_err(err, err_cap,
                     "%s is not a JSON object of token -> id (run "
                     "tools/setup.sh to fetch it again)",
                     path);
        return -1;
    }
    int n = cJSON_GetArraySize(root);
    if (n <= 256) {
        cJSON_Delete(root);
        util_set_err(err, err_cap, "%s: only %d tokens", path, n);
        return -1;
    }
    size_t pool_cap = 0;
    for (cJSON *c = root->child; c; c = c->next) pool_cap += strlen(c->string);
    t->vocab_size = (uint32_t)n;
    t->pool = malloc(pool_cap + 1);
    t->off = util_calloc((size_t)n + 1, sizeof *t->off);
    uint32_t *lens = util_calloc((size_t)n, sizeof *lens);
    char *seen = util_calloc((size_t)n, 1);
    unsigned char *tmp = malloc(pool_cap + 1);
    int rc = -1;
    if (!t->pool || !t->off || !lens || !seen || !tmp) {
        util_set_err(err, err_cap, "out of memory loading %s", path);
        goto done;
    }
    /* First pass: ids and byte lengths; second: place bytes by id. */
    for (cJSON *c = root->child; c; c = c->next) {
        double v = cJSON_IsNumber(c) ? c->valuedouble : -1;
        if (v < 0 || v >= n || v != (double)(int)v) {
            util_set_err(err, err_cap, "%s: token \"%.40s\" has id %g outside 0..%d",
                         path, c->string, v, n - 1);
            goto done;
        }
        int id = (int)v;
        if (seen[id]) {
            util_set_err(err, err_cap, "%s: id %d is used twice", path, id);
            goto done;
        }
        seen[id] = 1;
        long bl = gpt2_spelling_to_bytes(map, c->string, strlen(c->string), tmp);
        if (bl <= 0) {
            util_set_err(err, err_cap,
                         "%s: token \"%.40s\" is not in GPT-2's byte "
                         "spelling",
                         path, c->string);
            goto done;
        }
        lens[id] = (uint32_t)bl;
    }
    for (int i = 0; i < n; i++) t->off[i + 1] = t->off[i] + lens[i];
    for (cJSON *c = root->child; c; c = c->next) {
        int id = (int)c->valuedouble;
        gpt2_spelling_to_bytes(map, c->string, strlen(c->string),
                               (unsigned char *)t->pool + t->off[id]);
    }
    t->eot = -1;
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "<|endoftext|>");
    if (cJSON_IsNumber(e)) t->eot = (int32_t)e->valuedouble;
    rc = 0;
done:
    free(lens);
    free(seen);
    free(tmp);
    cJSON_Delete(root);
    return rc;
}

/* Load vocab.bpe into the merge table. */
static int load_merges(bpe_vocab *t, const char *dir, const int16_t map[512],
                       const vocab_index *vi, char *err, size_t err_cap) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/vocab.bpe", dir) >= (int)sizeof path) {
        util_set_err(err, err_cap, "path too long: %s", dir);
        return -1;
    }
    size_t len;
    char *text = read_vocab_file(path, &len, err, err_cap);
    if (!text) return -1;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    t->merge_cap = pow2_at_least(lines * 2);
    t->merge_keys = util_calloc(t->merge_cap, sizeof *t->merge_keys);
    t->merge_rank = util_calloc(t->merge_cap, sizeof *t->merge_rank);
    t->merge_result = util_calloc(t->merge_cap, sizeof *t->merge_result);
    unsigned char *buf = malloc(len + 1);
    int rc = -1;
    if (!t->merge_keys || !t->merge_rank || !t->merge_result || !buf) {
        util_set_err(err, err_cap, "out of memory loading %s", path);
        goto done;
    }
    uint32_t rank = 0;
    size_t line_no = 0;
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        line_no++;
        size_t ll = (size_t)(le - p);
        if (ll > 0 && p[ll - 1] == '\r') ll--;
        if (ll == 0 || (line_no == 1 && ll >= 9 && memcmp(p, "#version:", 9) == 0)) {
            p = le + 1;
            continue;
        }
        char *sp = memchr(p, ' ', ll);
        if (!sp || sp == p || sp + 1 >= p + ll ||
            memchr(sp + 1, ' ', (size_t)(p + ll - sp - 1))) {
            util_set_err(err, err_cap,
                         "%s line %zu: expected two tokens separated by one "
                         "space",
                         path, line_no);
            goto done;
        }
        size_t la = (size_t)(sp - p), lb = ll - la - 1;
        long ba = gpt2_spelling_to_bytes(map, p, la, buf);
        long bb = ba > 0 ? gpt2_spelling_to_bytes(map, sp + 1, lb, buf + ba) : -1;
        int32_t ia = -1, ib = -1, im = -1;
        if (ba > 0 && bb > 0) {
            ia = vocab_index_find(t, vi, buf, (size_t)ba);
            ib = vocab_index_find(t, vi, buf + ba, (size_t)bb);
            im = vocab_index_find(t, vi, buf, (size_t)(ba + bb));
        }
        if (ia < 0 || ib < 0 || im < 0) {
            util_set_err(err, err_cap,
                         "%s line %zu: merge \"%.*s\" uses a token missing "
                         "from encoder.json (mismatched files? run "
                         "tools/setup.sh)",
                         path, line_no, (int)(ll > 60 ? 60 : ll), p);
            goto done;
        }
        uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
        size_t mask = t->merge_cap - 1;
        size_t i = bpe_hash_u64(key) & mask;
        while (t->merge_keys[i] != 0 && t->merge_keys[i] != key) i = (i + 1) & mask;
        /* A repeated pair keeps its first (lowest) rank. */
        if (t->merge_keys[i] == 0) {
            t->merge_keys[i] = key;
            t->merge_rank[i] = rank;
            t->merge_result[i] = im;
        }
        rank++;
        p = le + 1;
    }
    rc = 0;
done:
    free(buf);
    free(text);
    return rc;
}

int bpe_vocab_init_bytes(bpe_vocab *v, char *err, size_t err_cap) {
    memset(v, 0, sizeof *v);
    v->vocab_size = 256;
    v->eot = -1;
    v->pool = malloc(256);
    v->off = malloc(257 * sizeof *v->off);
    if (!v->pool || !v->off) {
        bpe_vocab_free(v);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    for (int i = 0; i < 256; i++) {
        v->pool[i] = (char)i;
        v->off[i] = (uint32_t)i;
        v->byte_id[i] = i;
    }
    v->off[256] = 256;
    return 0;
}

/* Both files, the id index of the token bytes, the byte ids, the merges. */
static int load_gpt2(bpe_vocab *t, const char *dir, char *err, size_t err_cap) {
    int16_t map[512];
    gpt2_unicode_to_byte(map);
    if (load_encoder(t, dir, map, err, err_cap) != 0) return -1;

    vocab_index vi;
    vi.cap = pow2_at_least((size_t)t->vocab_size * 2);
    vi.slot = malloc(vi.cap * sizeof *vi.slot);
    if (!vi.slot) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    memset(vi.slot, 0xff, vi.cap * sizeof *vi.slot);
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        const unsigned char *b = (const unsigned char *)t->pool + t->off[id];
        size_t n = t->off[id + 1] - t->off[id];
        size_t mask = vi.cap - 1;
        size_t i = bpe_hash_bytes(b, n) & mask;
        while (vi.slot[i] >= 0) {
            int32_t o = vi.slot[i];
            if (t->off[o + 1] - t->off[o] == n &&
                memcmp(t->pool + t->off[o], b, n) == 0) {
                free(vi.slot);
                util_set_err(err, err_cap,
                             "%s/encoder.json: ids %d and %u spell the same "
                             "bytes",
                             dir, o, id);
                return -1;
            }
            i = (i + 1) & mask;
        }
        vi.slot[i] = (int32_t)id;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = vocab_index_find(t, &vi, &c, 1);
        if (t->byte_id[b] < 0) {
            free(vi.slot);
            util_set_err(err, err_cap, "%s/encoder.json has no token for byte 0x%02x",
                         dir, b);
            return -1;
        }
    }
    int rc = load_merges(t, dir, map, &vi, err, err_cap);
    free(vi.slot);
    if (rc != 0) return -1;

    return 0;
}

int bpe_vocab_load_gpt2(const char *dir, bpe_vocab *v, char *err, size_t err_cap) {
    memset(v, 0, sizeof *v);
    if (load_gpt2(v, dir, err, err_cap) == 0) return 0;
    bpe_vocab_free(v);
    return -1;
}

void bpe_vocab_free(bpe_vocab *v) {
    if (!v) return;
    free(v->pool);
    free(v->off);
    free(v->merge_keys);
    free(v->merge_rank);
    free(v->merge_result);
    memset(v, 0, sizeof *v);
}
