/*
 * tokenizer.c - byte-level tokenizer and GPT-2 byte-level BPE. See
 * tokenizer.h for the contract.
 *
 * GPT-2 implementation notes:
 *  - Every token's raw bytes are stored in one pool (decode = concatenation).
 *  - encoder.json keys are GPT-2's "byte to unicode" spelling: bytes 33..126,
 *    161..172 and 174..255 stand for themselves, the other 68 bytes map to
 *    U+0100.. in byte order. Keys are turned back into raw bytes at load.
 *  - Merges (vocab.bpe, rank = line order) are stored as a hash map from the
 *    pair of token ids (a, b) to (rank, merged id), so BPE runs on ids.
 *  - BPE of one piece: a doubly linked list of symbols plus a min-heap of
 *    (rank, position) candidates checked lazily when popped. Lowest rank
 *    first, leftmost first among equal ranks: the same result as GPT-2's
 *    "merge every occurrence of the best bigram" loop (a pair created by a
 *    merge always has a higher rank than the merge that created it), in
 *    O(n log n) even for very long pieces.
 *  - Each encode call keeps a cache from piece bytes to ids (pointers into the
 *    caller's text), so repeated words are merged once. It lives only for
 *    the call, which keeps the tokenizer immutable and encode thread-safe.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "orchestrator/data/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/util.h"

enum { KIND_BYTE = 0, KIND_GPT2 = 1 };

/* GPT-2's pre-tokenizer pattern (OpenAI's encoder.py). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

struct tokenizer {
    int kind;
    char name[8];
    uint32_t vocab_size;
    int32_t eot;
    /* token bytes: pool[off[i] .. off[i+1]) */
    char *pool;
    uint32_t *off;
    /* gpt2 only */
    int32_t byte_id[256];      /* id of the single-byte token for each byte */
    uint64_t *merge_keys;      /* ((a << 32) | b) + 1, 0 = empty slot */
    uint32_t *merge_rank;
    int32_t *merge_result;
    size_t merge_cap;          /* power of two */
    pcre2_code *re;
};

/* ---- small hashing helpers -------------------------------------------- */

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return hash_u64(h ^ n);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Rank and result of merging ids (a, b); returns 0 if there is no merge. */
static int merge_lookup(const tokenizer *t, int32_t a, int32_t b,
                        uint32_t *rank, int32_t *result) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = t->merge_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        uint64_t k = t->merge_keys[i];
        if (k == 0) return 0;
        if (k == key) {
            *rank = t->merge_rank[i];
            *result = t->merge_result[i];
            return 1;
        }
    }
}

/* ---- GPT-2 byte <-> unicode mapping ----------------------------------- */

static int gpt2_byte_printable(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
           (b >= 174 && b <= 255);
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

/* Decode one UTF-8 code point from s (len n > 0); returns its length, or 0
   if the sequence is invalid. */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v;
    if ((c & 0xe0) == 0xc0) {
        len = 2;
        v = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        len = 3;
        v = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        len = 4;
        v = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

/* Convert a GPT-2 "unicode spelled" token (UTF-8, length n) to raw bytes in
   out (capacity >= n). Returns the byte count, or -1 on a character outside
   the mapping. */
static long gpt2_spelling_to_bytes(const int16_t map[512], const char *s,
                                   size_t n, unsigned char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_decode(p + i, n - i, &cp);
        if (l == 0 || cp >= 512 || map[cp] < 0) return -1;
        out[o++] = (unsigned char)map[cp];
        i += (size_t)l;
    }
    return (long)o;
}

/* ---- vocabulary loading ------------------------------------------------ */

static char *read_whole_file(const char *path, size_t *len, char *err,
                             size_t err_cap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        util_set_err(err, err_cap, "cannot open %s: %s (run tools/setup.sh)",
                     path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
    }
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        util_set_err(err, err_cap, "cannot read %s", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int dir_has_vocab(const char *dir) {
    char p[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/encoder.json", dir) >= (int)sizeof p) return 0;
    if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    if (snprintf(p, sizeof p, "%s/vocab.bpe", dir) >= (int)sizeof p) return 0;
    if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    return 1;
}

int tokenizer_find_gpt2_dir(char *buf, size_t cap, char *err, size_t err_cap) {
    char cand[3][PATH_MAX];
    int nc = 0;
    const char *env = getenv("ORCH_DATA_DIR");
    if (env && *env) snprintf(cand[nc++], PATH_MAX, "%s/gpt2", env);
    char exe[PATH_MAX];
    if (util_exe_dir(exe, sizeof exe) == 0)
        snprintf(cand[nc++], PATH_MAX, "%.*s/../data/gpt2", PATH_MAX - 20,
                 exe);
    snprintf(cand[nc++], PATH_MAX, "./data/gpt2");
    for (int i = 0; i < nc; i++) {
        if (dir_has_vocab(cand[i])) {
            if (strlen(cand[i]) + 1 > cap) break;
            memcpy(buf, cand[i], strlen(cand[i]) + 1);
            return 0;
        }
    }
    char tried[3 * PATH_MAX + 16] = "";
    for (int i = 0; i < nc; i++) {
        if (i) strcat(tried, ", ");
        strncat(tried, cand[i], PATH_MAX);
    }
    util_set_err(err, err_cap,
                 "GPT-2 vocabulary (encoder.json, vocab.bpe) not found in %s; "
                 "run tools/setup.sh, or set ORCH_DATA_DIR",
                 tried);
    return -1;
}

typedef struct vocab_index { /* raw token bytes -> id, open addressing */
    int32_t *slot;           /* -1 = empty */
    size_t cap;
} vocab_index;

static int32_t vocab_index_find(const tokenizer *t, const vocab_index *vi,
                                const unsigned char *b, size_t n) {
    size_t mask = vi->cap - 1;
    for (size_t i = hash_bytes(b, n) & mask;; i = (i + 1) & mask) {
        int32_t id = vi->slot[i];
        if (id < 0) return -1;
        size_t l = t->off[id + 1] - t->off[id];
        if (l == n && memcmp(t->pool + t->off[id], b, n) == 0) return id;
    }
}

/* Load encoder.json into t->pool/off/vocab_size/eot. */
static int gpt2_load_encoder(tokenizer *t, const char *dir,
                             const int16_t map[512], char *err,
                             size_t err_cap) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/encoder.json", dir) >= (int)sizeof path) {
        util_set_err(err, err_cap, "path too long: %s", dir);
        return -1;
    }
    size_t len;
    char *text = read_whole_file(path, &len, err, err_cap);
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
            util_set_err(err, err_cap,
                         "%s: token \"%.40s\" has id %g outside 0..%d", path,
                         c->string, v, n - 1);
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
static int gpt2_load_merges(tokenizer *t, const char *dir,
                            const int16_t map[512], const vocab_index *vi,
                            char *err, size_t err_cap) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/vocab.bpe", dir) >= (int)sizeof path) {
        util_set_err(err, err_cap, "path too long: %s", dir);
        return -1;
    }
    size_t len;
    char *text = read_whole_file(path, &len, err, err_cap);
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
        if (!sp || sp == p || sp + 1 >= p + ll || memchr(sp + 1, ' ', (size_t)(p + ll - sp - 1))) {
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
        size_t i = hash_u64(key) & mask;
        while (t->merge_keys[i] != 0 && t->merge_keys[i] != key)
            i = (i + 1) & mask;
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

static int gpt2_open(tokenizer *t, const char *vocab_dir, char *err,
                     size_t err_cap) {
    char dir[PATH_MAX];
    if (vocab_dir) {
        if (!dir_has_vocab(vocab_dir)) {
            util_set_err(err, err_cap,
                         "GPT-2 vocabulary (encoder.json, vocab.bpe) not found "
                         "in %s; run tools/setup.sh",
                         vocab_dir);
            return -1;
        }
        snprintf(dir, sizeof dir, "%s", vocab_dir);
    } else if (tokenizer_find_gpt2_dir(dir, sizeof dir, err, err_cap) != 0) {
        return -1;
    }
    int16_t map[512];
    gpt2_unicode_to_byte(map);
    if (gpt2_load_encoder(t, dir, map, err, err_cap) != 0) return -1;

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
        size_t i = hash_bytes(b, n) & mask;
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
            util_set_err(err, err_cap,
                         "%s/encoder.json has no token for byte 0x%02x", dir, b);
            return -1;
        }
    }
    int rc = gpt2_load_merges(t, dir, map, &vi, err, err_cap);
    free(vi.slot);
    if (rc != 0) return -1;

    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec,
                          &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        util_set_err(err, err_cap, "PCRE2 cannot compile GPT-2's pattern: %s",
                     (const char *)msg);
        return -1;
    }
    /* JIT is an optimisation only; without it the interpreter is used. */
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    return 0;
}

/* ---- open / free / getters -------------------------------------------- */

int tokenizer_kind_valid(const char *kind) {
    return kind && (strcmp(kind, "byte") == 0 || strcmp(kind, "gpt2") == 0);
}

int tokenizer_open(const char *kind, const char *vocab_dir, tokenizer **out,
                   char *err, size_t err_cap) {
    *out = NULL;
    if (!tokenizer_kind_valid(kind)) {
        util_set_err(err, err_cap,
                     "unknown tokenizer '%s' (expected byte or gpt2)",
                     kind ? kind : "(null)");
        return -1;
    }
    tokenizer *t = util_calloc(1, sizeof *t);
    if (!t) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    if (strcmp(kind, "byte") == 0) {
        t->kind = KIND_BYTE;
        snprintf(t->name, sizeof t->name, "byte");
        t->vocab_size = 256;
        t->eot = -1;
        t->pool = malloc(256);
        t->off = malloc(257 * sizeof *t->off);
        if (!t->pool || !t->off) {
            tokenizer_free(t);
            util_set_err(err, err_cap, "out of memory");
            return -1;
        }
        for (int i = 0; i < 256; i++) {
            t->pool[i] = (char)i;
            t->off[i] = (uint32_t)i;
            t->byte_id[i] = i;
        }
        t->off[256] = 256;
    } else {
        t->kind = KIND_GPT2;
        snprintf(t->name, sizeof t->name, "gpt2");
        if (gpt2_open(t, vocab_dir, err, err_cap) != 0) {
            tokenizer_free(t);
            return -1;
        }
    }
    *out = t;
    return 0;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->off);
    free(t->merge_keys);
    free(t->merge_rank);
    free(t->merge_result);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

const char *tokenizer_name(const tokenizer *t) { return t->name; }
uint32_t tokenizer_vocab_size(const tokenizer *t) { return t->vocab_size; }
int32_t tokenizer_eot(const tokenizer *t) { return t->eot; }

int tokenizer_token_bytes(const tokenizer *t, int32_t id, const char **bytes,
                          size_t *len) {
    if (id < 0 || (uint32_t)id >= t->vocab_size) return -1;
    *bytes = t->pool + t->off[id];
    *len = t->off[id + 1] - t->off[id];
    return 0;
}

/* ---- encoding ----------------------------------------------------------- */

typedef struct id_buf {
    int32_t *v;
    size_t n, cap;
} id_buf;

static int id_buf_reserve(id_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    int32_t *nv = realloc(b->v, cap * sizeof *nv);
    if (!nv) return -1;
    b->v = nv;
    b->cap = cap;
    return 0;
}

/* Scratch space of one encode call for BPE of one piece. */
typedef struct bpe_work {
    int32_t *id, *prev, *next;
    uint64_t *heap;
    size_t cap, heap_cap, heap_n;
} bpe_work;

static int bpe_work_reserve(bpe_work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(w->id, cap * sizeof *a);
    if (!a) return -1;
    w->id = a;
    a = realloc(w->prev, cap * sizeof *a);
    if (!a) return -1;
    w->prev = a;
    a = realloc(w->next, cap * sizeof *a);
    if (!a) return -1;
    w->next = a;
    /* Every merge pushes at most two candidates: n + 2n entries. */
    uint64_t *h = realloc(w->heap, 3 * cap * sizeof *h);
    if (!h) return -1;
    w->heap = h;
    w->heap_cap = 3 * cap;
    w->cap = cap;
    return 0;
}

static void heap_push(bpe_work *w, uint64_t key) {
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (w->heap[p] <= key) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = key;
}

static uint64_t heap_pop(bpe_work *w) {
    uint64_t top = w->heap[0];
    uint64_t last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (last <= w->heap[c]) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

/* Push the candidate merge of symbol i with its successor, if any. */
static void bpe_push_pair(const tokenizer *t, bpe_work *w, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    uint32_t rank;
    int32_t res;
    if (merge_lookup(t, w->id[i], w->id[w->next[i]], &rank, &res))
        heap_push(w, ((uint64_t)rank << 32) | (uint32_t)i);
}

/* BPE of one piece of n > 0 bytes, appended to out. */
static int bpe_piece(const tokenizer *t, bpe_work *w, const unsigned char *s,
                     size_t n, id_buf *out) {
    if (n == 1) {
        if (id_buf_reserve(out, 1) != 0) return -1;
        out->v[out->n++] = t->byte_id[s[0]];
        return 0;
    }
    if (n > INT32_MAX / 4 || bpe_work_reserve(w, n) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->byte_id[s[i]];
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) bpe_push_pair(t, w, (int32_t)i);
    size_t left = n;
    while (w->heap_n > 0) {
        uint64_t top = heap_pop(w);
        int32_t i = (int32_t)(uint32_t)top;
        uint32_t want = (uint32_t)(top >> 32);
        int32_t j = w->next[i];
        /* Dead symbols have id -1; a stale entry no longer has its pair. */
        if (w->id[i] < 0 || j < 0) continue;
        uint32_t rank;
        int32_t res;
        if (!merge_lookup(t, w->id[i], w->id[j], &rank, &res) || rank != want)
            continue;
        w->id[i] = res;
        w->id[j] = -1;
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = i;
        left--;
        bpe_push_pair(t, w, w->prev[i]);
        bpe_push_pair(t, w, i);
    }
    if (id_buf_reserve(out, left) != 0) return -1;
    for (int32_t i = 0; i >= 0; i = w->next[i]) out->v[out->n++] = w->id[i];
    return 0;
}

/* Per-call cache: piece bytes (pointing into the caller's text) -> ids. */
typedef struct piece_cache {
    struct cache_slot {
        const unsigned char *s; /* NULL = empty */
        uint32_t len;
        uint32_t n_ids;
        size_t first; /* index into ids */
    } * slot;
    size_t cap, used;
    id_buf ids;
} piece_cache;

enum { CACHE_MAX_PIECE = 128 };

static struct cache_slot *cache_find(piece_cache *c, const unsigned char *s,
                                     size_t n) {
    size_t mask = c->cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        struct cache_slot *e = &c->slot[i];
        if (!e->s || (e->len == n && memcmp(e->s, s, n) == 0)) return e;
    }
}

static int cache_grow(piece_cache *c) {
    size_t ncap = c->cap ? c->cap * 2 : 4096;
    struct cache_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns) return -1;
    struct cache_slot *old = c->slot;
    size_t ocap = c->cap;
    c->slot = ns;
    c->cap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].s) *cache_find(c, old[i].s, old[i].len) = old[i];
    free(old);
    return 0;
}

static int encode_piece(const tokenizer *t, bpe_work *w, piece_cache *c,
                        const unsigned char *s, size_t n, id_buf *out) {
    if (n == 0) return 0;
    if (n == 1 || n > CACHE_MAX_PIECE) return bpe_piece(t, w, s, n, out);
    if (c->used * 2 >= c->cap && cache_grow(c) != 0) return -1;
    struct cache_slot *e = cache_find(c, s, n);
    if (e->s) {
        if (id_buf_reserve(out, e->n_ids) != 0) return -1;
        memcpy(out->v + out->n, c->ids.v + e->first, e->n_ids * sizeof(int32_t));
        out->n += e->n_ids;
        return 0;
    }
    size_t before = out->n;
    if (bpe_piece(t, w, s, n, out) != 0) return -1;
    size_t k = out->n - before;
    if (id_buf_reserve(&c->ids, k) != 0) return -1;
    memcpy(c->ids.v + c->ids.n, out->v + before, k * sizeof(int32_t));
    e->s = s;
    e->len = (uint32_t)n;
    e->n_ids = (uint32_t)k;
    e->first = c->ids.n;
    c->ids.n += k;
    c->used++;
    return 0;
}

enum { STREAM_BATCH = 65536 };

/* Hand out's ids to the sink (if any) once enough have collected, or always
   when final. */
static int flush_sink(id_buf *out, tokenizer_sink_fn sink, void *user,
                      size_t bytes_done, int final, char *err, size_t err_cap) {
    if (!sink || (!final && out->n < STREAM_BATCH)) return 0;
    if (sink(user, out->v, out->n, bytes_done) != 0) {
        if (err && err_cap && !err[0])
            util_set_err(err, err_cap, "encoding stopped by the caller");
        return -1;
    }
    out->n = 0;
    return 0;
}

static int gpt2_encode(const tokenizer *t, const unsigned char *s, size_t len,
                       id_buf *out, tokenizer_sink_fn sink, void *user,
                       char *err, size_t err_cap) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    bpe_work w = {0};
    piece_cache cache = {0};
    int rc = -1;
    if (!md) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    /* Rough guess: ~1 token per 4 bytes of English text. */
    size_t guess = len / 4 + 16;
    if (sink && guess > 2 * STREAM_BATCH) guess = 2 * STREAM_BATCH;
    if (id_buf_reserve(out, guess) != 0) goto oom;
    size_t pos = 0;
    uint32_t opts = 0;
    while (pos < len) {
        int m = pcre2_match(t->re, s, len, pos, opts, md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
            opts |= PCRE2_NO_JIT; /* retry with the interpreter */
            continue;
        }
        size_t ms, me;
        if (m == PCRE2_ERROR_NOMATCH) {
            ms = me = len;
        } else if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            util_set_err(err, err_cap, "pre-tokenizer failed at byte %zu: %s",
                         pos, (const char *)msg);
            goto done;
        } else {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
            if (me <= ms) me = ms + 1; /* never loop on an empty match */
            if (me > len) me = len;
        }
        /* Bytes the pattern skipped (invalid UTF-8) form their own piece. */
        if (ms > pos && encode_piece(t, &w, &cache, s + pos, ms - pos, out) != 0)
            goto oom;
        if (me > ms && encode_piece(t, &w, &cache, s + ms, me - ms, out) != 0)
            goto oom;
        pos = me;
        if (flush_sink(out, sink, user, pos, 0, err, err_cap) != 0) goto done;
    }
    if (flush_sink(out, sink, user, len, 1, err, err_cap) != 0) goto done;
    rc = 0;
    goto done;
oom:
    util_set_err(err, err_cap, "out of memory while encoding %zu bytes", len);
done:
    pcre2_match_data_free(md);
    free(w.id);
    free(w.prev);
    free(w.next);
    free(w.heap);
    free(cache.slot);
    free(cache.ids.v);
    return rc;
}

static int encode_any(const tokenizer *t, const char *text, size_t len,
                      id_buf *out, tokenizer_sink_fn sink, void *user,
                      char *err, size_t err_cap) {
    if (t->kind == KIND_GPT2)
        return gpt2_encode(t, (const unsigned char *)text, len, out, sink,
                           user, err, err_cap);
    const unsigned char *s = (const unsigned char *)text;
    size_t step = sink ? STREAM_BATCH : len;
    if (id_buf_reserve(out, (step < len ? step : len) + 1) != 0) {
        util_set_err(err, err_cap, "out of memory while encoding %zu bytes",
                     len);
        return -1;
    }
    for (size_t pos = 0; pos < len;) {
        size_t k = len - pos < step ? len - pos : step;
        for (size_t i = 0; i < k; i++) out->v[out->n + i] = s[pos + i];
        out->n += k;
        pos += k;
        if (flush_sink(out, sink, user, pos, pos == len, err, err_cap) != 0)
            return -1;
    }
    if (len == 0 && flush_sink(out, sink, user, 0, 1, err, err_cap) != 0)
        return -1;
    return 0;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len,
                     int32_t **ids, size_t *n_ids, char *err, size_t err_cap) {
    *ids = NULL;
    *n_ids = 0;
    id_buf out = {0};
    if (encode_any(t, text, len, &out, NULL, NULL, err, err_cap) != 0 ||
        (!out.v && id_buf_reserve(&out, 1) != 0)) {
        if (!out.v) util_set_err(err, err_cap, "out of memory");
        free(out.v);
        return -1;
    }
    *ids = out.v;
    *n_ids = out.n;
    return 0;
}

int tokenizer_encode_stream(const tokenizer *t, const char *text, size_t len,
                            tokenizer_sink_fn sink, void *user, char *err,
                            size_t err_cap) {
    if (err && err_cap) err[0] = '\0';
    id_buf out = {0};
    int rc = encode_any(t, text, len, &out, sink, user, err, err_cap);
    free(out.v);
    return rc;
}

/* ---- decoding ----------------------------------------------------------- */

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n_ids,
                     char **text, size_t *len, char *err, size_t err_cap) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->vocab_size) {
            util_set_err(err, err_cap,
                         "token id %ld at position %zu is outside the %s "
                         "vocabulary (0..%u)",
                         (long)ids[i], i, t->name, t->vocab_size - 1);
            return -1;
        }
        total += t->off[ids[i] + 1] - t->off[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out) {
        util_set_err(err, err_cap, "out of memory decoding %zu tokens", n_ids);
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        size_t l = t->off[ids[i] + 1] - t->off[ids[i]];
        memcpy(out + o, t->pool + t->off[ids[i]], l);
        o += l;
    }
    out[o] = '\0';
    *text = out;
    *len = o;
    return 0;
}
