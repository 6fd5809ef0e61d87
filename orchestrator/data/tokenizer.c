/*
 * tokenizer.c - byte-level tokenizer and GPT-2 byte-level BPE. See
 * tokenizer.h for the contract.
 *
 * GPT-2 implementation notes:
 *  - The token tables come from bpe_vocab.c: every token's raw bytes in one
 *    pool (decode = concatenation), and the merges (vocab.bpe, rank = line
 *    order) as a hash map from the pair of token ids (a, b) to (rank, merged
 *    id), so BPE runs on ids.
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

#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/util.h"
#include "orchestrator/data/bpe_vocab.h"
#include "orchestrator/data/hf_tokenizer.h"

enum { KIND_BYTE = 0, KIND_GPT2 = 1, KIND_HF = 2 };

/* GPT-2's pre-tokenizer pattern (OpenAI's encoder.py). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

struct tokenizer {
    int kind;
    char name[8];
    bpe_vocab v;      /* token bytes, byte ids and (gpt2) merges */
    pcre2_code *re;   /* gpt2 only */
    hf_tokenizer *hf; /* hf only (v unused) */
};

/* ---- finding the GPT-2 vocabulary -------------------------------------- */

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
        snprintf(cand[nc++], PATH_MAX, "%.*s/../data/gpt2", PATH_MAX - 20, exe);
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

static int gpt2_open(tokenizer *t, const char *vocab_dir, char *err, size_t err_cap) {
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
    if (bpe_vocab_load_gpt2(dir, &t->v, err, err_cap) != 0) return -1;

    int ec;
    PCRE2_SIZE eo;
    t->re =
        pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
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
    return kind && (strcmp(kind, "byte") == 0 || strcmp(kind, "gpt2") == 0 ||
                    strcmp(kind, "hf") == 0);
}

int tokenizer_open(const char *kind, const char *vocab_dir, tokenizer **out, char *err,
                   size_t err_cap) {
    *out = NULL;
    if (!tokenizer_kind_valid(kind)) {
        util_set_err(err, err_cap, "unknown tokenizer '%s' (expected byte, gpt2 or hf)",
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
        if (bpe_vocab_init_bytes(&t->v, err, err_cap) != 0) {
            tokenizer_free(t);
            return -1;
        }
    } else if (strcmp(kind, "hf") == 0) {
        t->kind = KIND_HF;
        snprintf(t->name, sizeof t->name, "hf");
        if (!vocab_dir) {
            util_set_err(err, err_cap,
                         "tokenizer hf needs a directory holding tokenizer.json");
            tokenizer_free(t);
            return -1;
        }
        if (hf_tokenizer_open(vocab_dir, &t->hf, err, err_cap) != 0) {
            tokenizer_free(t);
            return -1;
        }
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
    bpe_vocab_free(&t->v);
    if (t->re) pcre2_code_free(t->re);
    hf_tokenizer_free(t->hf);
    free(t);
}

const char *tokenizer_name(const tokenizer *t) { return t->name; }
uint32_t tokenizer_vocab_size(const tokenizer *t) {
    return t->hf ? hf_tokenizer_vocab_size(t->hf) : t->v.vocab_size;
}

int32_t tokenizer_eot(const tokenizer *t) {
    const int32_t *ids;
    if (t->hf) return hf_tokenizer_eos(t->hf, &ids) ? ids[0] : -1;
    return t->v.eot;
}

int32_t tokenizer_bos(const tokenizer *t) { return t->hf ? hf_tokenizer_bos(t->hf) : -1; }

int tokenizer_add_bos(const tokenizer *t) {
    return t->hf ? hf_tokenizer_add_bos(t->hf) : 0;
}

size_t tokenizer_eos_ids(const tokenizer *t, const int32_t **ids) {
    if (t->hf) return hf_tokenizer_eos(t->hf, ids);
    *ids = &t->v.eot;
    return t->v.eot >= 0 ? 1 : 0;
}

int tokenizer_is_eos(const tokenizer *t, int32_t id) {
    const int32_t *ids;
    size_t n = tokenizer_eos_ids(t, &ids);
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

int tokenizer_prepend_bos(const tokenizer *t, int32_t **ids, size_t *n) {
    int32_t bos = tokenizer_bos(t);
    if (!tokenizer_add_bos(t) || bos < 0 || (*n > 0 && (*ids)[0] == bos)) return 0;
    int32_t *p = realloc(*ids, (*n + 1) * sizeof *p);
    if (!p) return -1;
    memmove(p + 1, p, *n * sizeof *p);
    p[0] = bos;
    *ids = p;
    (*n)++;
    return 1;
}

int32_t tokenizer_token_id(const tokenizer *t, const char *name) {
    if (t->hf) return hf_tokenizer_token_id(t->hf, name);
    if (t->kind == KIND_GPT2 && strcmp(name, "<|endoftext|>") == 0) return t->v.eot;
    return -1;
}

int tokenizer_token_bytes(const tokenizer *t, int32_t id, const char **bytes,
                          size_t *len) {
    if (t->hf) return hf_tokenizer_token_bytes(t->hf, id, bytes, len);
    if (id < 0 || (uint32_t)id >= t->v.vocab_size) return -1;
    *bytes = t->v.pool + t->v.off[id];
    *len = t->v.off[id + 1] - t->v.off[id];
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

/* Push the candidate merge of symbol i with its successor, if any. */
static void bpe_push_pair(const tokenizer *t, bpe_work *w, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    uint32_t rank;
    int32_t res;
    if (bpe_vocab_merge(&t->v, w->id[i], w->id[w->next[i]], &rank, &res))
        bpe_heap_push(w->heap, &w->heap_n, ((uint64_t)rank << 32) | (uint32_t)i);
}

/* BPE of one piece of n > 0 bytes, appended to out. */
static int bpe_piece(const tokenizer *t, bpe_work *w, const unsigned char *s, size_t n,
                     id_buf *out) {
    if (n == 1) {
        if (id_buf_reserve(out, 1) != 0) return -1;
        out->v[out->n++] = t->v.byte_id[s[0]];
        return 0;
    }
    if (n > INT32_MAX / 4 || bpe_work_reserve(w, n) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->v.byte_id[s[i]];
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) bpe_push_pair(t, w, (int32_t)i);
    size_t left = n;
    while (w->heap_n > 0) {
        uint64_t top = bpe_heap_pop(w->heap, &w->heap_n);
        int32_t i = (int32_t)(uint32_t)top;
        uint32_t want = (uint32_t)(top >> 32);
        int32_t j = w->next[i];
        /* Dead symbols have id -1; a stale entry no longer has its pair. */
        if (w->id[i] < 0 || j < 0) continue;
        uint32_t rank;
        int32_t res;
        if (!bpe_vocab_merge(&t->v, w->id[i], w->id[j], &rank, &res) || rank != want)
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

static struct cache_slot *cache_find(piece_cache *c, const unsigned char *s, size_t n) {
    size_t mask = c->cap - 1;
    for (size_t i = bpe_hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        struct cache_slot *e = &c->slot[i];
        if (!e->s || (e->len == n && memcmp(e->s, s, n) == 0)) return e;
    }
}

static int cache_grow(piece_cache *c) {
    size_t ncap = c->cap ? c->cap * 2 : 64; /* grows with the text */
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
static int flush_sink(id_buf *out, tokenizer_sink_fn sink, void *user, size_t bytes_done,
                      int final, char *err, size_t err_cap) {
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
                       id_buf *out, tokenizer_sink_fn sink, void *user, char *err,
                       size_t err_cap) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    bpe_work w = { 0 };
    piece_cache cache = { 0 };
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
            util_set_err(err, err_cap, "pre-tokenizer failed at byte %zu: %s", pos,
                         (const char *)msg);
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
        if (me > ms && encode_piece(t, &w, &cache, s + ms, me - ms, out) != 0) goto oom;
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

/* Collects the hf tokenizer's batches into an id_buf (no sink given). */
static int collect_ids(void *user, const int32_t *ids, size_t n, size_t bytes_done) {
    (void)bytes_done;
    id_buf *out = user;
    if (n == 0) return 0;
    if (id_buf_reserve(out, n) != 0) return -1;
    memcpy(out->v + out->n, ids, n * sizeof *ids);
    out->n += n;
    return 0;
}

static int encode_any(const tokenizer *t, const char *text, size_t len, id_buf *out,
                      tokenizer_sink_fn sink, void *user, char *err, size_t err_cap) {
    if (t->kind == KIND_HF) {
        if (sink) return hf_tokenizer_encode(t->hf, text, len, sink, user, err, err_cap);
        if (err && err_cap) err[0] = '\0';
        int rc = hf_tokenizer_encode(t->hf, text, len, collect_ids, out, err, err_cap);
        if (rc != 0 && err && err_cap &&
            strcmp(err, "encoding stopped by the caller") == 0)
            util_set_err(err, err_cap, "out of memory while encoding %zu bytes", len);
        return rc;
    }
    if (t->kind == KIND_GPT2)
        return gpt2_encode(t, (const unsigned char *)text, len, out, sink, user, err,
                           err_cap);
    const unsigned char *s = (const unsigned char *)text;
    size_t step = sink ? STREAM_BATCH : len;
    if (id_buf_reserve(out, (step < len ? step : len) + 1) != 0) {
        util_set_err(err, err_cap, "out of memory while encoding %zu bytes", len);
        return -1;
    }
    for (size_t pos = 0; pos < len;) {
        size_t k = len - pos < step ? len - pos : step;
        for (size_t i = 0; i < k; i++) out->v[out->n + i] = s[pos + i];
        out->n += k;
        pos += k;
        if (flush_sink(out, sink, user, pos, pos == len, err, err_cap) != 0) return -1;
    }
    if (len == 0 && flush_sink(out, sink, user, 0, 1, err, err_cap) != 0) return -1;
    return 0;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids,
                     size_t *n_ids, char *err, size_t err_cap) {
    *ids = NULL;
    *n_ids = 0;
    id_buf out = { 0 };
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
    id_buf out = { 0 };
    int rc = encode_any(t, text, len, &out, sink, user, err, err_cap);
    free(out.v);
    return rc;
}

/* ---- decoding ----------------------------------------------------------- */

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, char **text,
                     size_t *len, char *err, size_t err_cap) {
    if (t->hf) return hf_tokenizer_decode(t->hf, ids, n_ids, text, len, err, err_cap);
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->v.vocab_size) {
            util_set_err(err, err_cap,
                         "token id %ld at position %zu is outside the %s "
                         "vocabulary (0..%u)",
                         (long)ids[i], i, t->name, t->v.vocab_size - 1);
            return -1;
        }
        total += t->v.off[ids[i] + 1] - t->v.off[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out) {
        util_set_err(err, err_cap, "out of memory decoding %zu tokens", n_ids);
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        size_t l = t->v.off[ids[i] + 1] - t->v.off[ids[i]];
        memcpy(out + o, t->v.pool + t->v.off[ids[i]], l);
        o += l;
    }
    out[o] = '\0';
    *text = out;
    *len = o;
    return 0;
}
