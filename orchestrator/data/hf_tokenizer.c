/*
 * hf_tokenizer.c - Hugging Face tokenizer.json (BPE with ByteLevel or
 * Metaspace / byte fallback) for kind "hf"; see hf_tokenizer.h.
 *
 * Implementation notes:
 *  - Tokens are kept in the "model domain": for ByteLevel tokenizers the raw
 *    bytes (the file's GPT-2 "byte to unicode" spelling turned back, so the
 *    input is never mapped), otherwise the file's UTF-8 text ("▁Hello").
 *    An index maps model-domain bytes to ids; the merges are an id-pair hash
 *    (bpe_vocab's merge table) giving (rank, merged id).
 *  - encode: added tokens are split off the raw text (leftmost-longest),
 *    each remaining segment is normalized, split by the pre-tokenizer steps
 *    into pieces (copied into arenas), and every piece goes through BPE: a
 *    linked list of symbols and a min-heap of (rank, position) candidates,
 *    lowest rank first and leftmost among equals, as the library does.
 *    Symbols whose id is in no merge split a piece into runs that are
 *    merged independently (the same result, much smaller heaps).
 *  - A per-call cache maps short pieces to their ids (keys copied into the
 *    cache), so the tokenizer stays immutable and encode thread-safe.
 *  - Every token's decoded bytes are computed once at load from the
 *    decoder's per-token steps; decode concatenates them and applies the
 *    whole-text steps.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "orchestrator/data/hf_tokenizer.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/utf8.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/bpe_vocab.h"

#define HF_FILE_MAX_BYTES ((size_t)512 << 20)

/* GPT-2's pattern, which ByteLevel's use_regex stands for. */
static const char BYTE_LEVEL_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

enum { N_PREPEND, N_REPLACE, N_REPLACE_RE, N_UNICODE };
typedef struct norm_op {
    int kind;
    char *a, *b; /* Prepend: a; Replace: a -> b */
    size_t an, bn;
    pcre2_code *re;
    const UNormalizer2 *un;
} norm_op;

enum { P_SPLIT_RE, P_SPLIT_STR, P_PREFIX_SPACE, P_METASPACE };
enum { SCHEME_ALWAYS, SCHEME_FIRST, SCHEME_NEVER };
typedef struct pre_op {
    int kind;
    pcre2_code *re;
    char *lit; /* P_SPLIT_STR */
    size_t litn;
    int removed;  /* Split behavior Removed (else Isolated) */
    char repl[8]; /* Metaspace replacement (UTF-8) */
    size_t repln;
    int scheme, split;
} pre_op;

typedef struct added_tok {
    char *s;
    size_t n;
    int32_t id;
    int lstrip, rstrip, normalized, special;
} added_tok;

typedef struct added_set {
    added_tok **t; /* sorted by first byte, then longest first */
    size_t n;
    uint32_t first[257]; /* bucket of first byte b: t[first[b] .. first[b+1]) */
} added_set;

typedef struct strip_op {
    char c[8];
    size_t cn;
    int start, stop;
} strip_op;

enum { MAX_STEPS = 16 };

struct hf_tokenizer {
    uint32_t vocab_size;
    char *dec_pool; /* decoded bytes of id i: dec_pool[dec_off[i] .. dec_off[i+1]) */
    uint32_t *dec_off;
    uint8_t *present; /* 1 if some token has id i */
    uint8_t *merges;  /* 1 if id i is the left or right of some merge */
    char *enc_pool;   /* model-domain bytes of vocab id i (empty if none) */
    uint32_t *enc_off;
    int32_t *idx; /* open addressing over enc bytes; -1 empty */
    size_t idx_cap;
    bpe_vocab m; /* only the merge table is used */
    int byte_level, byte_fallback, ignore_merges, fuse_unk;
    int32_t unk;
    int32_t byte_tok[256]; /* byte-level: token of the byte; fallback: <0xXX> */
    norm_op norm[MAX_STEPS];
    size_t n_norm;
    pre_op pre[MAX_STEPS];
    size_t n_pre;
    added_tok *added;
    size_t n_added;
    added_set raw_set, norm_set;
    int meta_first; /* decoder: drop a leading space of the first token */
    strip_op strip[MAX_STEPS];
    size_t n_strip;
    int32_t bos;
    int add_bos;
    int32_t eos[HF_MAX_EOS];
    size_t n_eos;
};

/* ---- small buffers ---------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sbuf_put(sbuf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) return -1;
        b->p = np;
        b->cap = cap;
    }
    if (n && s) memcpy(b->p + b->n, s, n); /* s NULL: reserve n bytes */
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

typedef struct id_buf {
    int32_t *v;
    size_t n, cap;
} id_buf;

static int id_put(id_buf *b, int32_t id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *nv = realloc(b->v, cap * sizeof *nv);
        if (!nv) return -1;
        b->v = nv;
        b->cap = cap;
    }
    b->v[b->n++] = id;
    return 0;
}

typedef struct span {
    size_t off, len;
} span;

typedef struct span_buf {
    span *v;
    size_t n, cap;
} span_buf;

static int span_put(span_buf *b, size_t off, size_t len) {
    if (len == 0) return 0;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        span *nv = realloc(b->v, cap * sizeof *nv);
        if (!nv) return -1;
        b->v = nv;
        b->cap = cap;
    }
    b->v[b->n].off = off;
    b->v[b->n++].len = len;
    return 0;
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---- GPT-2 byte <-> unicode spelling ----------------------------------- */

/* cp (< 512) -> byte or -1. */
static void unspell_map(int16_t map[512]) {
    for (int i = 0; i < 512; i++) map[i] = -1;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        char sp[4];
        size_t n = bpe_gpt2_spell(&c, 1, sp);
        uint32_t cp;
        if (utf8_decode(sp, n, &cp) == n && cp < 512) map[cp] = (int16_t)b;
    }
}

/* Spelled s -> raw bytes into out (capacity >= n); -1 if a character is
   outside the mapping. */
static long unspell(const int16_t map[512], const char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = utf8_decode(s + i, n - i, &cp);
        if (l == 0 || cp >= 512 || map[cp] < 0) return -1;
        out[o++] = (char)map[cp];
        i += l;
    }
    return (long)o;
}

/* ---- the model-domain index -------------------------------------------- */

static int32_t idx_find(const hf_tokenizer *h, const char *s, size_t n) {
    if (!h->idx_cap) return -1;
    size_t mask = h->idx_cap - 1;
    for (size_t i = bpe_hash_bytes((const unsigned char *)s, n) & mask;;
         i = (i + 1) & mask) {
        int32_t id = h->idx[i];
        if (id < 0) return -1;
        size_t l = h->enc_off[id + 1] - h->enc_off[id];
        if (l == n && memcmp(h->enc_pool + h->enc_off[id], s, n) == 0) return id;
    }
}

static void idx_insert(hf_tokenizer *h, int32_t id) {
    const char *s = h->enc_pool + h->enc_off[id];
    size_t n = h->enc_off[id + 1] - h->enc_off[id];
    size_t mask = h->idx_cap - 1;
    size_t i = bpe_hash_bytes((const unsigned char *)s, n) & mask;
    while (h->idx[i] >= 0) i = (i + 1) & mask;
    h->idx[i] = id;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- regex helpers ------------------------------------------------------ */

static pcre2_code *compile_re(const char *pat, size_t n, const char *field, char *err,
                              size_t err_cap) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                      &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        util_set_err(err, err_cap, "tokenizer.json: %s: PCRE2 cannot compile '%.80s': %s",
                     field, pat, (const char *)msg);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up */
    return re;
}

/* Next match of re in s[0..n) from pos: 1 with [*ms, *me) (maybe empty), 0
   for none, -1 on a matcher error. */
static int re_next(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n,
                   size_t pos, size_t *ms, size_t *me, char *err, size_t err_cap) {
    uint32_t opts = 0;
    for (;;) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, n, pos, opts, md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
            opts |= PCRE2_NO_JIT;
            continue;
        }
        if (m == PCRE2_ERROR_NOMATCH) return 0;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            util_set_err(err, err_cap, "pre-tokenizer failed at byte %zu: %s", pos,
                         (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        *ms = ov[0];
        *me = ov[1] < ov[0] ? ov[0] : ov[1]; /* \K can put the end first */
        if (*me > n) *me = n;
        if (*ms > *me) *ms = *me;
        return 1;
    }
}

/* ---- loading: helpers ------------------------------------------------------ */

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* 1 true, 0 false, def when absent or not a bool. */
static int jbool(const cJSON *o, const char *k, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsTrue(v)) return 1;
    if (cJSON_IsFalse(v)) return 0;
    return def;
}

static int unsupported(char *err, size_t err_cap, const char *field, const char *value) {
    util_set_err(err, err_cap, "tokenizer.json: %s '%s' is not supported", field,
                 value ? value : "(missing)");
    return -1;
}

/* Pattern of a Split / Replace: {"String": s} or {"Regex": s}. */
static int pattern_of(const cJSON *o, const char **s, int *is_re) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *v;
    if ((v = jstr(p, "String"))) {
        *s = v;
        *is_re = 0;
        return 0;
    }
    if ((v = jstr(p, "Regex"))) {
        *s = v;
        *is_re = 1;
        return 0;
    }
    return -1;
}

static cJSON *read_json(const char *dir, const char *name, int optional, char *err,
                        size_t err_cap) {
    char path[PATH_MAX], msg[PATH_MAX + 128];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
        util_set_err(err, err_cap, "%s/%s: path too long", dir, name);
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0;
    if (fsio_read_file(path, HF_FILE_MAX_BYTES, &buf, &len, msg, sizeof msg) != 0) {
        if (!optional) util_set_err(err, err_cap, "cannot read %s", msg);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!j) util_set_err(err, err_cap, "%s: not valid JSON", path);
    return j;
}

/* ---- loading: normalizer ----------------------------------------------- */

static int add_norm(hf_tokenizer *h, const cJSON *n, char *err, size_t err_cap) {
    const char *type = jstr(n, "type");
    if (!type) return unsupported(err, err_cap, "normalizer.type", NULL);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        const cJSON *e;
        if (!cJSON_IsArray(list))
            return unsupported(err, err_cap, "normalizer.normalizers", "(not a list)");
        cJSON_ArrayForEach(e, list) if (add_norm(h, e, err, err_cap) != 0) return -1;
        return 0;
    }
    if (h->n_norm == MAX_STEPS)
        return unsupported(err, err_cap, "normalizer", "(too many)");
    norm_op *op = &h->norm[h->n_norm];
    memset(op, 0, sizeof *op);
    if (strcmp(type, "Prepend") == 0) {
        const char *p = jstr(n, "prepend");
        if (!p) return unsupported(err, err_cap, "normalizer Prepend.prepend", NULL);
        op->kind = N_PREPEND;
        op->an = strlen(p);
        if (!(op->a = dup_bytes(p, op->an))) goto oom;
    } else if (strcmp(type, "Replace") == 0) {
        const char *pat, *content = jstr(n, "content");
        int is_re;
        if (pattern_of(n, &pat, &is_re) != 0 || !content)
            return unsupported(err, err_cap, "normalizer Replace.pattern", "(missing)");
        op->kind = is_re ? N_REPLACE_RE : N_REPLACE;
        op->an = strlen(pat);
        op->bn = strlen(content);
        if (op->an == 0)
            return unsupported(err, err_cap, "normalizer Replace.pattern", "(empty)");
        if (!(op->a = dup_bytes(pat, op->an)) || !(op->b = dup_bytes(content, op->bn)))
            goto oom;
        if (is_re &&
            !(op->re = compile_re(pat, op->an, "normalizer Replace", err, err_cap)))
            return -1;
    } else if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") ||
               !strcmp(type, "NFKD")) {
        UErrorCode st = U_ZERO_ERROR;
        op->kind = N_UNICODE;
        op->un = !strcmp(type, "NFC")    ? unorm2_getNFCInstance(&st)
                 : !strcmp(type, "NFD")  ? unorm2_getNFDInstance(&st)
                 : !strcmp(type, "NFKC") ? unorm2_getNFKCInstance(&st)
                                         : unorm2_getNFKDInstance(&st);
        if (U_FAILURE(st) || !op->un) {
            util_set_err(err, err_cap, "ICU has no %s normalizer: %s", type,
                         u_errorName(st));
            return -1;
        }
    } else {
        return unsupported(err, err_cap, "normalizer.type", type);
    }
    h->n_norm++;
    return 0;
oom:
    free(op->a);
    free(op->b);
    util_set_err(err, err_cap, "out of memory");
    return -1;
}

/* ---- loading: pre-tokenizer -------------------------------------------- */

static pre_op *new_pre(hf_tokenizer *h, int kind) {
    if (h->n_pre == MAX_STEPS) return NULL;
    pre_op *op = &h->pre[h->n_pre++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    return op;
}

static int add_pre(hf_tokenizer *h, const cJSON *p, char *err, size_t err_cap) {
    const char *type = jstr(p, "type");
    if (!type) return unsupported(err, err_cap, "pre_tokenizer.type", NULL);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *e;
        if (!cJSON_IsArray(list))
            return unsupported(err, err_cap, "pre_tokenizer.pretokenizers",
                               "(not a list)");
        cJSON_ArrayForEach(e, list) if (add_pre(h, e, err, err_cap) != 0) return -1;
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        const char *pat, *beh = jstr(p, "behavior");
        int is_re;
        if (pattern_of(p, &pat, &is_re) != 0)
            return unsupported(err, err_cap, "pre_tokenizer Split.pattern", "(missing)");
        if (!beh || (strcmp(beh, "Isolated") != 0 && strcmp(beh, "Removed") != 0))
            return unsupported(err, err_cap, "pre_tokenizer Split.behavior", beh);
        if (jbool(p, "invert", 0))
            return unsupported(err, err_cap, "pre_tokenizer Split.invert", "true");
        pre_op *op = new_pre(h, is_re ? P_SPLIT_RE : P_SPLIT_STR);
        if (!op) return unsupported(err, err_cap, "pre_tokenizer", "(too many)");
        op->removed = strcmp(beh, "Removed") == 0;
        if (is_re) {
            if (!(op->re =
                      compile_re(pat, strlen(pat), "pre_tokenizer Split", err, err_cap)))
                return -1;
        } else {
            op->litn = strlen(pat);
            if (op->litn == 0)
                return unsupported(err, err_cap, "pre_tokenizer Split.pattern",
                                   "(empty)");
            if (!(op->lit = dup_bytes(pat, op->litn))) {
                util_set_err(err, err_cap, "out of memory");
                return -1;
            }
        }
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        /* Numeric characters (\p{N}) alone or in runs, isolated. */
        int one = jbool(p, "individual_digits", 0);
        pre_op *op = new_pre(h, P_SPLIT_RE);
        if (!op) return unsupported(err, err_cap, "pre_tokenizer", "(too many)");
        if (!(op->re = compile_re(one ? "\\p{N}" : "\\p{N}+", PCRE2_ZERO_TERMINATED,
                                  "pre_tokenizer Digits", err, err_cap)))
            return -1;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        h->byte_level = 1;
        if (jbool(p, "add_prefix_space", 1) && !new_pre(h, P_PREFIX_SPACE))
            return unsupported(err, err_cap, "pre_tokenizer", "(too many)");
        if (jbool(p, "use_regex", 1)) {
            pre_op *op = new_pre(h, P_SPLIT_RE);
            if (!op) return unsupported(err, err_cap, "pre_tokenizer", "(too many)");
            if (!(op->re = compile_re(BYTE_LEVEL_PATTERN, PCRE2_ZERO_TERMINATED,
                                      "pre_tokenizer ByteLevel", err, err_cap)))
                return -1;
        }
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        pre_op *op = new_pre(h, P_METASPACE);
        if (!op) return unsupported(err, err_cap, "pre_tokenizer", "(too many)");
        const char *r = jstr(p, "replacement");
        if (!r) r = "\xe2\x96\x81";
        op->repln = strlen(r);
        if (op->repln == 0 || op->repln >= sizeof op->repl ||
            utf8_char_len(r, op->repln) != op->repln)
            return unsupported(err, err_cap, "pre_tokenizer Metaspace.replacement", r);
        memcpy(op->repl, r, op->repln);
        const char *sch = jstr(p, "prepend_scheme");
        if (!sch)
            op->scheme = jbool(p, "add_prefix_space", 1) ? SCHEME_ALWAYS : SCHEME_NEVER;
        else if (strcmp(sch, "always") == 0)
            op->scheme = SCHEME_ALWAYS;
        else if (strcmp(sch, "first") == 0)
            op->scheme = SCHEME_FIRST;
        else if (strcmp(sch, "never") == 0)
            op->scheme = SCHEME_NEVER;
        else
            return unsupported(err, err_cap, "pre_tokenizer Metaspace.prepend_scheme",
                               sch);
        op->split = jbool(p, "split", 1);
        return 0;
    }
    return unsupported(err, err_cap, "pre_tokenizer.type", type);
}

/* ---- loading: model ------------------------------------------------------ */

/* The file's spelling of a vocab token -> model-domain bytes in out
   (capacity >= n); -1 when a ByteLevel spelling cannot be mapped back. */
static long model_bytes(const hf_tokenizer *h, const int16_t map[512], const char *s,
                        size_t n, char *out) {
    if (h->byte_level) return unspell(map, s, n, out);
    memcpy(out, s, n);
    return (long)n;
}

static int load_model(hf_tokenizer *h, const cJSON *model, const cJSON *added,
                      const int16_t map[512], char *err, size_t err_cap) {
    const char *type = jstr(model, "type");
    if (!type) {
        /* Old files have no type; they are BPE when they carry merges. */
        if (!cJSON_GetObjectItemCaseSensitive(model, "merges"))
            return unsupported(err, err_cap, "model.type", NULL);
        type = "BPE";
    }
    if (strcmp(type, "BPE") != 0) return unsupported(err, err_cap, "model.type", type);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0))
        return unsupported(err, err_cap, "model.dropout", "(non-zero)");
    const char *csp = jstr(model, "continuing_subword_prefix");
    if (csp && *csp)
        return unsupported(err, err_cap, "model.continuing_subword_prefix", csp);
    const char *ews = jstr(model, "end_of_word_suffix");
    if (ews && *ews) return unsupported(err, err_cap, "model.end_of_word_suffix", ews);
    h->byte_fallback = jbool(model, "byte_fallback", 0);
    h->ignore_merges = jbool(model, "ignore_merges", 0);
    h->fuse_unk = jbool(model, "fuse_unk", 0);

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab))
        return unsupported(err, err_cap, "model.vocab", "(not an object)");
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges))
        return unsupported(err, err_cap, "model.merges", "(not a list)");

    /* Size: highest id over the vocab and the added tokens. */
    long max_id = -1;
    size_t pool_need = 0, nv = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX - 2) {
            util_set_err(err, err_cap, "tokenizer.json: model.vocab \"%.60s\": bad id",
                         e->string);
            return -1;
        }
        if ((long)e->valuedouble > max_id) max_id = (long)e->valuedouble;
        pool_need += strlen(e->string);
        nv++;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 ||
            id->valuedouble > INT32_MAX - 2 || !jstr(e, "content")) {
            util_set_err(err, err_cap,
                         "tokenizer.json: added_tokens: an entry without "
                         "an id or content");
            return -1;
        }
        if ((long)id->valuedouble > max_id) max_id = (long)id->valuedouble;
    }
    if (max_id < 0) {
        util_set_err(err, err_cap, "tokenizer.json: model.vocab is empty");
        return -1;
    }
    /* Ids are dense in every real file; a stray huge id would make the
       tables enormous. */
    size_t n_entries = nv + (size_t)cJSON_GetArraySize(added);
    if ((size_t)max_id >= 2 * n_entries + 1024 || max_id >= (1L << 24)) {
        util_set_err(
            err, err_cap,
            "tokenizer.json: token id %ld is far beyond the %zu tokens of the file "
            "(ids must be dense)",
            max_id, n_entries);
        return -1;
    }
    h->vocab_size = (uint32_t)(max_id + 1);
    uint32_t V = h->vocab_size;
    h->enc_off = util_calloc((size_t)V + 1, sizeof *h->enc_off);
    h->present = util_calloc(V, 1);
    h->merges = util_calloc(V, 1);
    h->enc_pool = malloc(pool_need + 1);
    h->idx_cap = pow2_at_least(nv * 2);
    h->idx = malloc(h->idx_cap * sizeof *h->idx);
    uint32_t *len = util_calloc(V, sizeof *len);
    const char **spell = util_calloc(V, sizeof *spell); /* file spelling of id */
    if (!h->enc_off || !h->present || !h->merges || !h->enc_pool || !h->idx || !len ||
        !spell) {
        free(len);
        free(spell);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    memset(h->idx, 0xff, h->idx_cap * sizeof *h->idx);
    /* Pass 1: the model-domain bytes of every vocab id into len / a pool in
       id order (offsets first, then bytes). */
    int rc = -1;
    char *tmp = malloc(pool_need + 1);
    if (!tmp) goto oom;
    cJSON_ArrayForEach(e, vocab) {
        uint32_t id = (uint32_t)e->valuedouble;
        if (spell[id]) {
            util_set_err(err, err_cap,
                         "tokenizer.json: model.vocab: id %u is given to both \"%.40s\" "
                         "and \"%.40s\"",
                         id, spell[id], e->string);
            goto done;
        }
        spell[id] = e->string;
        long l = model_bytes(h, map, e->string, strlen(e->string), tmp);
        len[id] = l < 0 ? 0 : (uint32_t)l;
        if (l >= 0)
            h->present[id] = 2; /* 2 = encodable vocab entry */
        else
            h->present[id] = 1;
    }
    size_t o = 0;
    for (uint32_t i = 0; i < V; i++) {
        h->enc_off[i] = (uint32_t)o;
        if (h->present[i] == 2) {
            long l = model_bytes(h, map, spell[i], strlen(spell[i]), h->enc_pool + o);
            o += (size_t)l;
        }
    }
    h->enc_off[V] = (uint32_t)o;
    for (uint32_t i = 0; i < V; i++)
        if (h->present[i] == 2) {
            const char *s = h->enc_pool + h->enc_off[i];
            size_t n = h->enc_off[i + 1] - h->enc_off[i];
            if (idx_find(h, s, n) < 0) idx_insert(h, (int32_t)i);
        }

    /* Merges. */
    size_t nm = merges && cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
    h->m.merge_cap = nm ? pow2_at_least(nm * 2) : 0;
    if (nm) {
        h->m.merge_keys = util_calloc(h->m.merge_cap, sizeof *h->m.merge_keys);
        h->m.merge_rank = util_calloc(h->m.merge_cap, sizeof *h->m.merge_rank);
        h->m.merge_result = util_calloc(h->m.merge_cap, sizeof *h->m.merge_result);
        if (!h->m.merge_keys || !h->m.merge_rank || !h->m.merge_result) goto oom;
    }
    uint32_t rank = 0;
    sbuf ab = { 0 };
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t an, bn;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                util_set_err(err, err_cap,
                             "tokenizer.json: model.merges[%u] \"%.60s\" is not two "
                             "tokens separated by one space",
                             rank, e->valuestring);
                free(ab.p);
                goto done;
            }
            a = e->valuestring;
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring;
            b = cJSON_GetArrayItem(e, 1)->valuestring;
            an = strlen(a);
            bn = strlen(b);
        } else {
            util_set_err(err, err_cap,
                         "tokenizer.json: model.merges[%u] is neither \"a b\" nor [a, b]",
                         rank);
            free(ab.p);
            goto done;
        }
        ab.n = 0;
        if (sbuf_put(&ab, NULL, 2 * (an + bn)) != 0) {
            free(ab.p);
            goto oom;
        }
        long la = model_bytes(h, map, a, an, ab.p);
        long lb = la < 0 ? -1 : model_bytes(h, map, b, bn, ab.p + la);
        int32_t ia = la < 0 ? -1 : idx_find(h, ab.p, (size_t)la);
        int32_t ib = lb < 0 ? -1 : idx_find(h, ab.p + la, (size_t)lb);
        int32_t im = (ia < 0 || ib < 0) ? -1 : idx_find(h, ab.p, (size_t)(la + lb));
        if (im < 0) {
            util_set_err(err, err_cap,
                         "tokenizer.json: model.merges[%u] (\"%.40s\" \"%.40s\") uses or "
                         "makes a token missing from model.vocab",
                         rank, a, b);
            free(ab.p);
            goto done;
        }
        uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
        size_t mask = h->m.merge_cap - 1;
        size_t i = bpe_hash_u64(key) & mask;
        while (h->m.merge_keys[i] != 0 && h->m.merge_keys[i] != key) i = (i + 1) & mask;
        /* A repeated pair takes its last rank, as the library's map does. */
        h->m.merge_keys[i] = key;
        h->m.merge_rank[i] = rank;
        h->m.merge_result[i] = im;
        h->merges[ia] = h->merges[ib] = 1;
        rank++;
    }
    free(ab.p);

    /* unk and the byte tokens. */
    const char *unk = jstr(model, "unk_token");
    h->unk = unk ? idx_find(h, unk, strlen(unk)) : -1;
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (h->byte_level) {
            s[0] = (char)b;
            h->byte_tok[b] = idx_find(h, s, 1);
        } else if (h->byte_fallback) {
            snprintf(s, sizeof s, "<0x%02X>", b);
            h->byte_tok[b] = idx_find(h, s, strlen(s));
        } else {
            h->byte_tok[b] = -1;
        }
    }
    rc = 0;
    goto done;
oom:
    util_set_err(err, err_cap, "out of memory");
done:
    free(tmp);
    free(len);
    free(spell);
    return rc;
}

/* ---- loading: added tokens ------------------------------------------------ */

static int cmp_added(const void *x, const void *y) {
    const added_tok *a = *(added_tok *const *)x, *b = *(added_tok *const *)y;
    unsigned char fa = (unsigned char)a->s[0], fb = (unsigned char)b->s[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->n != b->n) return a->n > b->n ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int build_set(hf_tokenizer *h, added_set *s, int normalized) {
    s->t = util_calloc(h->n_added ? h->n_added : 1, sizeof *s->t);
    if (!s->t) return -1;
    for (size_t i = 0; i < h->n_added; i++)
        if (h->added[i].normalized == normalized && h->added[i].n > 0)
            s->t[s->n++] = &h->added[i];
    qsort(s->t, s->n, sizeof *s->t, cmp_added);
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        s->first[b] = (uint32_t)k;
        while (k < s->n && (unsigned char)s->t[k]->s[0] == b) k++;
    }
    s->first[256] = (uint32_t)k;
    return 0;
}

static int load_added(hf_tokenizer *h, const cJSON *added, char *err, size_t err_cap) {
    size_t n = cJSON_IsArray(added) ? (size_t)cJSON_GetArraySize(added) : 0;
    h->added = util_calloc(n ? n : 1, sizeof *h->added);
    if (!h->added) goto oom;
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        added_tok *a = &h->added[h->n_added];
        const char *c = jstr(e, "content");
        if (jbool(e, "single_word", 0)) {
            util_set_err(err, err_cap,
                         "tokenizer.json: added_tokens \"%.60s\": single_word 'true' is "
                         "not supported",
                         c);
            return -1;
        }
        a->n = strlen(c);
        if (!(a->s = dup_bytes(c, a->n))) goto oom;
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        a->lstrip = jbool(e, "lstrip", 0);
        a->rstrip = jbool(e, "rstrip", 0);
        a->special = jbool(e, "special", 0);
        a->normalized = jbool(e, "normalized", !a->special);
        if (h->n_norm == 0) a->normalized = 0; /* the same text either way */
        h->n_added++;
        if (!h->present[a->id]) h->present[a->id] = 1;
    }
    if (build_set(h, &h->raw_set, 0) != 0 || build_set(h, &h->norm_set, 1) != 0) goto oom;
    return 0;
oom:
    util_set_err(err, err_cap, "out of memory");
    return -1;
}

static const added_tok *added_by_id(const hf_tokenizer *h, int32_t id) {
    /* Later entries win, as in the library's map. */
    for (size_t i = h->n_added; i-- > 0;)
        if (h->added[i].id == id) return &h->added[i];
    return NULL;
}

/* ---- loading: decoder -------------------------------------------------------- */

enum { D_BYTELEVEL, D_REPLACE, D_BYTEFALLBACK, D_STRIP, D_METASPACE };
typedef struct dec_step {
    int kind;
    const char *a, *b; /* Replace a -> b, Metaspace replacement a */
    strip_op strip;
} dec_step;

static int add_dec(hf_tokenizer *h, const cJSON *d, dec_step *steps, size_t *n,
                   int *fused, char *err, size_t err_cap) {
    const char *type = jstr(d, "type");
    if (!type) return unsupported(err, err_cap, "decoder.type", NULL);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        const cJSON *e;
        if (!cJSON_IsArray(list))
            return unsupported(err, err_cap, "decoder.decoders", "(not a list)");
        cJSON_ArrayForEach(e, list) {
            if (add_dec(h, e, steps, n, fused, err, err_cap) != 0) return -1;
        }
        return 0;
    }
    if (strcmp(type, "Fuse") == 0) {
        *fused = 1;
        return 0;
    }
    if (*n == MAX_STEPS) return unsupported(err, err_cap, "decoder", "(too many)");
    dec_step *s = &steps[*n];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(d, "content");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(d, "start");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(d, "stop");
        if (!c || !*c || utf8_char_len(c, strlen(c)) != strlen(c) ||
            !cJSON_IsNumber(st) || !cJSON_IsNumber(sp))
            return unsupported(err, err_cap, "decoder Strip.content", c);
        s->kind = D_STRIP;
        s->strip.cn = strlen(c);
        memcpy(s->strip.c, c, s->strip.cn);
        s->strip.start = st->valueint;
        s->strip.stop = sp->valueint;
        if (*fused) { /* a whole-text step */
            if (h->n_strip == MAX_STEPS)
                return unsupported(err, err_cap, "decoder", "(too many)");
            h->strip[h->n_strip++] = s->strip;
            return 0;
        }
    } else if (*fused) {
        /* Per-token steps after Fuse would see the whole text. */
        return unsupported(err, err_cap, "decoder after Fuse", type);
    } else if (strcmp(type, "ByteLevel") == 0) {
        s->kind = D_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        s->kind = D_BYTEFALLBACK;
    } else if (strcmp(type, "Replace") == 0) {
        const char *pat;
        int is_re;
        s->b = jstr(d, "content");
        if (pattern_of(d, &pat, &is_re) != 0 || !s->b || !*pat)
            return unsupported(err, err_cap, "decoder Replace.pattern", "(missing)");
        if (is_re) return unsupported(err, err_cap, "decoder Replace.pattern", "Regex");
        s->kind = D_REPLACE;
        s->a = pat;
    } else if (strcmp(type, "Metaspace") == 0) {
        s->kind = D_METASPACE;
        s->a = jstr(d, "replacement");
        if (!s->a) s->a = "\xe2\x96\x81";
        if (!*s->a || utf8_char_len(s->a, strlen(s->a)) != strlen(s->a))
            return unsupported(err, err_cap, "decoder Metaspace.replacement", s->a);
        const char *sch = jstr(d, "prepend_scheme");
        int first = sch ? strcmp(sch, "never") != 0 : jbool(d, "add_prefix_space", 1);
        if (first) h->meta_first = 1;
    } else {
        return unsupported(err, err_cap, "decoder.type", type);
    }
    (*n)++;
    return 0;
}

/* One token's text through the per-token decoder steps into out. */
static int decode_token(const dec_step *steps, size_t n, const int16_t map[512],
                        const char *s, size_t len, sbuf *out, sbuf *tmp) {
    out->n = 0;
    if (sbuf_put(out, s, len) != 0) return -1;
    for (size_t k = 0; k < n; k++) {
        const dec_step *st = &steps[k];
        tmp->n = 0;
        if (st->kind == D_BYTELEVEL) {
            if (sbuf_put(tmp, NULL, out->n) != 0) return -1;
            long l = unspell(map, out->p, out->n, tmp->p);
            if (l < 0) continue; /* not all mapped: the text's own bytes */
            tmp->n = (size_t)l;
        } else if (st->kind == D_BYTEFALLBACK) {
            unsigned v;
            char end;
            if (out->n != 6 || sscanf(out->p, "<0x%2X%c", &v, &end) != 2 || end != '>' ||
                strncmp(out->p, "<0x", 3) != 0)
                continue;
            unsigned char c = (unsigned char)v;
            if (sbuf_put(tmp, &c, 1) != 0) return -1;
        } else if (st->kind == D_REPLACE || st->kind == D_METASPACE) {
            const char *a = st->a, *b = st->kind == D_REPLACE ? st->b : " ";
            size_t an = strlen(a), bn = strlen(b);
            for (size_t i = 0; i < out->n;) {
                if (an > 0 && i + an <= out->n && memcmp(out->p + i, a, an) == 0) {
                    if (sbuf_put(tmp, b, bn) != 0) return -1;
                    i += an;
                } else {
                    if (sbuf_put(tmp, out->p + i, 1) != 0) return -1;
                    i++;
                }
            }
        } else { /* D_STRIP before Fuse: per token */
            size_t s0 = 0, e0 = out->n;
            for (int c = 0; c < st->strip.start && e0 - s0 >= st->strip.cn &&
                            memcmp(out->p + s0, st->strip.c, st->strip.cn) == 0;
                 c++)
                s0 += st->strip.cn;
            for (int c = 0;
                 c < st->strip.stop && e0 - s0 >= st->strip.cn &&
                 memcmp(out->p + e0 - st->strip.cn, st->strip.c, st->strip.cn) == 0;
                 c++)
                e0 -= st->strip.cn;
            if (sbuf_put(tmp, out->p + s0, e0 - s0) != 0) return -1;
        }
        sbuf t = *out; /* swap */
        *out = *tmp;
        *tmp = t;
    }
    return 0;
}

static int build_decoder(hf_tokenizer *h, const cJSON *dec, const cJSON *vocab,
                         const int16_t map[512], char *err, size_t err_cap) {
    dec_step steps[MAX_STEPS];
    size_t n = 0;
    int fused = 0;
    if (!dec || cJSON_IsNull(dec)) return unsupported(err, err_cap, "decoder", "null");
    if (add_dec(h, dec, steps, &n, &fused, err, err_cap) != 0) return -1;
    uint32_t V = h->vocab_size;
    const char **spell = util_calloc(V, sizeof *spell);
    h->dec_off = util_calloc((size_t)V + 1, sizeof *h->dec_off);
    sbuf pool = { 0 }, one = { 0 }, tmp = { 0 };
    int rc = -1;
    if (!spell || !h->dec_off) goto oom;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) spell[(uint32_t)e->valuedouble] = e->string;
    for (uint32_t i = 0; i < V; i++) {
        h->dec_off[i] = (uint32_t)pool.n;
        const added_tok *a = h->present[i] ? added_by_id(h, (int32_t)i) : NULL;
        if (a) {
            if (sbuf_put(&pool, a->s, a->n) != 0) goto oom;
        } else if (spell[i]) {
            if (decode_token(steps, n, map, spell[i], strlen(spell[i]), &one, &tmp) !=
                    0 ||
                sbuf_put(&pool, one.p, one.n) != 0)
                goto oom;
        }
        if (pool.n > UINT32_MAX / 2) goto oom;
    }
    h->dec_off[V] = (uint32_t)pool.n;
    if (sbuf_put(&pool, NULL, 0) != 0) goto oom;
    h->dec_pool = pool.p;
    pool.p = NULL;
    rc = 0;
    goto done;
oom:
    util_set_err(err, err_cap, "out of memory");
done:
    free(pool.p);
    free(one.p);
    free(tmp.p);
    free(spell);
    return rc;
}

/* ---- loading: post-processor, BOS / EOS ---------------------------------- */

/* TemplateProcessing's leading special token: its id into *id (or -1). */
static int scan_post(const cJSON *pp, int32_t *tmpl_bos, int *tmpl_add, char *err,
                     size_t err_cap) {
    if (!pp || cJSON_IsNull(pp)) return 0;
    const char *type = jstr(pp, "type");
    if (!type) return unsupported(err, err_cap, "post_processor.type", NULL);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        cJSON_ArrayForEach(e, list) if (scan_post(e, tmpl_bos, tmpl_add, err, err_cap) !=
                                        0) return -1;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
    if (strcmp(type, "TemplateProcessing") != 0)
        return unsupported(err, err_cap, "post_processor.type", type);
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_GetArrayItem(single, 0);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const char *name = jstr(sp, "id");
    if (!name) return 0;
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(specials, name), "ids");
    const cJSON *id0 = cJSON_GetArrayItem(ids, 0);
    if (!cJSON_IsNumber(id0) || cJSON_GetArraySize(ids) != 1) {
        util_set_err(err, err_cap,
                     "tokenizer.json: post_processor special_tokens \"%.60s\": expected "
                     "one id",
                     name);
        return -1;
    }
    *tmpl_bos = (int32_t)id0->valuedouble;
    *tmpl_add = 1;
    return 0;
}

/* A token field of tokenizer_config.json: "text" or {"content": "text"}. */
static const char *config_token(const cJSON *cfg, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, k);
    if (cJSON_IsString(v)) return v->valuestring;
    return jstr(v, "content");
}

static void add_eos(hf_tokenizer *h, int32_t id) {
    if (id < 0 || (uint32_t)id >= h->vocab_size) return;
    for (size_t i = 0; i < h->n_eos; i++)
        if (h->eos[i] == id) return;
    if (h->n_eos < HF_MAX_EOS) h->eos[h->n_eos++] = id;
}

static int load_specials(hf_tokenizer *h, const char *dir, const cJSON *post, char *err,
                         size_t err_cap) {
    int32_t tmpl_bos = -1;
    int tmpl_add = 0;
    if (scan_post(post, &tmpl_bos, &tmpl_add, err, err_cap) != 0) return -1;
    cJSON *cfg = read_json(dir, "tokenizer_config.json", 1, err, err_cap);
    if (!cfg && err && err_cap && err[0]) return -1;
    cJSON *gen = read_json(dir, "generation_config.json", 1, err, err_cap);
    if (!gen && err && err_cap && err[0]) {
        cJSON_Delete(cfg);
        return -1;
    }
    h->bos = -1;
    const char *bt = config_token(cfg, "bos_token");
    if (bt) h->bos = hf_tokenizer_token_id(h, bt);
    const cJSON *gb = cJSON_GetObjectItemCaseSensitive(gen, "bos_token_id");
    if (h->bos < 0 && cJSON_IsNumber(gb)) h->bos = (int32_t)gb->valuedouble;
    if (h->bos < 0) h->bos = tmpl_bos;
    h->add_bos = jbool(cfg, "add_bos_token", tmpl_add);
    if (h->add_bos && h->bos < 0) h->add_bos = 0;

    const char *et = config_token(cfg, "eos_token");
    if (et) add_eos(h, hf_tokenizer_token_id(h, et));
    const cJSON *ge = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id"), *x;
    if (cJSON_IsNumber(ge)) add_eos(h, (int32_t)ge->valuedouble);
    const cJSON *list = cJSON_IsArray(ge) ? ge : NULL;
    cJSON_ArrayForEach(x, list) {
        if (cJSON_IsNumber(x)) add_eos(h, (int32_t)x->valuedouble);
    }
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    return 0;
}

/* ---- open / free / getters ------------------------------------------------ */

int hf_tokenizer_open(const char *dir, hf_tokenizer **out, char *err, size_t err_cap) {
    *out = NULL;
    if (err && err_cap) err[0] = '\0';
    cJSON *j = read_json(dir, "tokenizer.json", 0, err, err_cap);
    if (!j) return -1;
    hf_tokenizer *h = util_calloc(1, sizeof *h);
    if (!h) {
        cJSON_Delete(j);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    int16_t map[512];
    unspell_map(map);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer");
    const cJSON *trunc = cJSON_GetObjectItemCaseSensitive(j, "truncation");
    const cJSON *pad = cJSON_GetObjectItemCaseSensitive(j, "padding");
    if (!cJSON_IsObject(model)) {
        unsupported(err, err_cap, "model", "(missing)");
        goto fail;
    }
    if (trunc && !cJSON_IsNull(trunc)) {
        unsupported(err, err_cap, "truncation", "(not null)");
        goto fail;
    }
    if (pad && !cJSON_IsNull(pad)) {
        unsupported(err, err_cap, "padding", "(not null)");
        goto fail;
    }
    if (norm && !cJSON_IsNull(norm) && add_norm(h, norm, err, err_cap) != 0) goto fail;
    if (pre && !cJSON_IsNull(pre) && add_pre(h, pre, err, err_cap) != 0) goto fail;
    if (load_model(h, model, added, map, err, err_cap) != 0) goto fail;
    if (load_added(h, added, err, err_cap) != 0) goto fail;
    if (build_decoder(h, cJSON_GetObjectItemCaseSensitive(j, "decoder"),
                      cJSON_GetObjectItemCaseSensitive(model, "vocab"), map, err,
                      err_cap) != 0)
        goto fail;
    if (load_specials(h, dir, cJSON_GetObjectItemCaseSensitive(j, "post_processor"), err,
                      err_cap) != 0)
        goto fail;
    cJSON_Delete(j);
    *out = h;
    return 0;
fail:
    cJSON_Delete(j);
    hf_tokenizer_free(h);
    /* Messages quote the file (patterns, token text): keep them one line. */
    for (char *c = err; c && err_cap && *c; c++)
        if ((unsigned char)*c < 0x20) *c = ' ';
    return -1;
}

void hf_tokenizer_free(hf_tokenizer *h) {
    if (!h) return;
    free(h->dec_pool);
    free(h->dec_off);
    free(h->present);
    free(h->merges);
    free(h->enc_pool);
    free(h->enc_off);
    free(h->idx);
    bpe_vocab_free(&h->m);
    for (size_t i = 0; i < h->n_norm; i++) {
        free(h->norm[i].a);
        free(h->norm[i].b);
        if (h->norm[i].re) pcre2_code_free(h->norm[i].re);
    }
    for (size_t i = 0; i < h->n_pre; i++) {
        free(h->pre[i].lit);
        if (h->pre[i].re) pcre2_code_free(h->pre[i].re);
    }
    for (size_t i = 0; i < h->n_added; i++) free(h->added[i].s);
    free(h->added);
    free(h->raw_set.t);
    free(h->norm_set.t);
    free(h);
}

uint32_t hf_tokenizer_vocab_size(const hf_tokenizer *h) { return h->vocab_size; }
int32_t hf_tokenizer_bos(const hf_tokenizer *h) { return h->bos; }
int hf_tokenizer_add_bos(const hf_tokenizer *h) { return h->add_bos; }

size_t hf_tokenizer_eos(const hf_tokenizer *h, const int32_t **ids) {
    *ids = h->eos;
    return h->n_eos;
}

int32_t hf_tokenizer_token_id(const hf_tokenizer *h, const char *name) {
    size_t n = strlen(name);
    for (size_t i = h->n_added; i-- > 0;)
        if (h->added[i].n == n && memcmp(h->added[i].s, name, n) == 0)
            return h->added[i].id;
    return idx_find(h, name, n);
}

int hf_tokenizer_token_bytes(const hf_tokenizer *h, int32_t id, const char **bytes,
                             size_t *len) {
    if (id < 0 || (uint32_t)id >= h->vocab_size || !h->present[id]) return -1;
    *bytes = h->dec_pool + h->dec_off[id];
    *len = h->dec_off[id + 1] - h->dec_off[id];
    return 0;
}

/* ---- encoding: normalizer ------------------------------------------------ */

static int unicode_norm(const UNormalizer2 *un, const char *s, size_t n, sbuf *out) {
    /* Valid UTF-8 runs are normalized; bytes that are not UTF-8 pass through. */
    size_t i = 0;
    UChar *a = NULL, *b = NULL;
    int rc = -1;
    while (i < n) {
        size_t j = i;
        int ascii = 1;
        while (j < n) {
            size_t l = utf8_char_len(s + j, n - j);
            if (l == 0) break;
            if (l > 1) ascii = 0;
            j += l;
        }
        if (j > i && ascii) {
            if (sbuf_put(out, s + i, j - i) != 0) goto done;
        } else if (j > i) {
            if (j - i > INT32_MAX / 4) goto done;
            int32_t cap = (int32_t)(j - i) + 1, l16 = 0, lo = 0;
            UErrorCode st = U_ZERO_ERROR;
            free(a);
            if (!(a = malloc((size_t)cap * sizeof *a))) goto done;
            u_strFromUTF8(a, cap, &l16, s + i, (int32_t)(j - i), &st);
            if (U_FAILURE(st)) goto done;
            int32_t ocap = 4 * l16 + 16;
            free(b);
            if (!(b = malloc((size_t)ocap * sizeof *b))) goto done;
            lo = unorm2_normalize(un, a, l16, b, ocap, &st);
            if (U_FAILURE(st)) goto done;
            int32_t need = 0;
            st = U_ZERO_ERROR;
            u_strToUTF8(NULL, 0, &need, b, lo, &st);
            st = U_ZERO_ERROR;
            size_t at = out->n;
            if (sbuf_put(out, NULL, (size_t)need) != 0) goto done;
            u_strToUTF8(out->p + at, need + 1, &need, b, lo, &st);
            if (U_FAILURE(st)) goto done;
        }
        i = j;
        if (i < n) { /* one byte that is not UTF-8 */
            if (sbuf_put(out, s + i, 1) != 0) goto done;
            i++;
        }
    }
    rc = 0;
done:
    free(a);
    free(b);
    return rc;
}

/* Where to search after a match [ms, me) of s[0..n): its end, or one
   character further for an empty match (which is only a split point). */
static size_t after_match(const char *s, size_t n, size_t ms, size_t me) {
    if (me > ms) return me;
    size_t l = ms < n ? utf8_char_len(s + ms, n - ms) : 1;
    return ms + (l ? l : 1);
}

/* Normalizes s[0..n) into *res (a or b are the scratch buffers). */
static int normalize(const hf_tokenizer *h, const char *s, size_t n, sbuf *a, sbuf *b,
                     pcre2_match_data *md, const char **res, size_t *rn, char *err,
                     size_t err_cap) {
    const char *cur = s;
    size_t cn = n;
    sbuf *dst = a;
    for (size_t k = 0; k < h->n_norm; k++) {
        const norm_op *op = &h->norm[k];
        dst->n = 0;
        if (op->kind == N_PREPEND) {
            if (cn == 0) continue;
            if (sbuf_put(dst, op->a, op->an) != 0 || sbuf_put(dst, cur, cn) != 0)
                goto oom;
        } else if (op->kind == N_REPLACE) {
            for (size_t i = 0; i < cn;) {
                const char *f =
                    i + op->an <= cn ? memmem(cur + i, cn - i, op->a, op->an) : NULL;
                size_t upto = f ? (size_t)(f - cur) : cn;
                if (sbuf_put(dst, cur + i, upto - i) != 0) goto oom;
                if (!f) break;
                if (sbuf_put(dst, op->b, op->bn) != 0) goto oom;
                i = upto + op->an;
            }
        } else if (op->kind == N_REPLACE_RE) {
            size_t pos = 0, from = 0, ms, me;
            int r = 0;
            while (from <= cn && (r = re_next(op->re, md, cur, cn, from, &ms, &me, err,
                                              err_cap)) == 1) {
                if (sbuf_put(dst, cur + pos, ms - pos) != 0 ||
                    sbuf_put(dst, op->b, op->bn) != 0)
                    goto oom;
                pos = me;
                from = after_match(cur, cn, ms, me);
            }
            if (r < 0) return -1;
            if (sbuf_put(dst, cur + pos, cn - pos) != 0) goto oom;
        } else if (unicode_norm(op->un, cur, cn, dst) != 0) {
            util_set_err(err, err_cap, "Unicode normalization failed (out of memory?)");
            return -1;
        }
        if (sbuf_put(dst, NULL, 0) != 0) goto oom;
        cur = dst->p;
        cn = dst->n;
        dst = dst == a ? b : a;
    }
    *res = cur;
    *rn = cn;
    return 0;
oom:
    util_set_err(err, err_cap, "out of memory");
    return -1;
}

/* ---- encoding: pre-tokenizer -------------------------------------------- */

/* Scratch of one encode call. */
typedef struct work {
    pcre2_match_data *md;
    sbuf na, nb;   /* normalizer buffers */
    sbuf arena[2]; /* pre-tokenizer pieces */
    span_buf pieces[2];
    int32_t *id, *prev, *next; /* BPE */
    uint64_t *heap;
    size_t cap, heap_n;
    struct slot { /* piece cache: key bytes in keys */
        size_t key, len, first, n_ids;
        int used;
    } * slot;
    size_t slot_cap, slot_used;
    sbuf keys;
    id_buf cache_ids;
} work;

static void work_free(work *w) {
    if (w->md) pcre2_match_data_free(w->md);
    free(w->na.p);
    free(w->nb.p);
    for (int i = 0; i < 2; i++) {
        free(w->arena[i].p);
        free(w->pieces[i].v);
    }
    free(w->id);
    free(w->prev);
    free(w->next);
    free(w->heap);
    free(w->slot);
    free(w->keys.p);
    free(w->cache_ids.v);
}

/* Runs the pre-tokenizer steps over s[0..n); the pieces end up in
   w->pieces[*which] over w->arena[*which] (or over s itself when there are
   no steps: *base = s). */
static int pretokenize(const hf_tokenizer *h, work *w, const char *s, size_t n,
                       int at_start, const char **base, span_buf **pieces, char *err,
                       size_t err_cap) {
    int cur = 0;
    w->pieces[0].n = 0;
    w->arena[0].n = 0;
    if (sbuf_put(&w->arena[0], s, n) != 0 || span_put(&w->pieces[0], 0, n) != 0) goto oom;
    for (size_t k = 0; k < h->n_pre; k++) {
        const pre_op *op = &h->pre[k];
        sbuf *src = &w->arena[cur], *dst = &w->arena[!cur];
        span_buf *sp = &w->pieces[cur], *dp = &w->pieces[!cur];
        dst->n = 0;
        dp->n = 0;
        for (size_t p = 0; p < sp->n; p++) {
            const char *ps = src->p + sp->v[p].off;
            size_t pn = sp->v[p].len;
            size_t at = dst->n;
            if (op->kind == P_PREFIX_SPACE) {
                if (ps[0] != ' ' && sbuf_put(dst, " ", 1) != 0) goto oom;
                if (sbuf_put(dst, ps, pn) != 0 || span_put(dp, at, dst->n - at) != 0)
                    goto oom;
            } else if (op->kind == P_METASPACE) {
                int pre = op->scheme == SCHEME_ALWAYS ||
                          (op->scheme == SCHEME_FIRST && at_start && p == 0);
                size_t mark = at; /* start of the current piece in dst */
                if (pre && !(pn >= op->repln && memcmp(ps, op->repl, op->repln) == 0) &&
                    sbuf_put(dst, op->repl, op->repln) != 0)
                    goto oom;
                for (size_t i = 0; i < pn; i++) {
                    int is_sp = ps[i] == ' ';
                    int is_rep = !is_sp && i + op->repln <= pn &&
                                 memcmp(ps + i, op->repl, op->repln) == 0;
                    if (op->split && (is_sp || is_rep) && dst->n > mark) {
                        if (span_put(dp, mark, dst->n - mark) != 0) goto oom;
                        mark = dst->n;
                    }
                    if (is_sp) {
                        if (sbuf_put(dst, op->repl, op->repln) != 0) goto oom;
                    } else if (is_rep) {
                        if (sbuf_put(dst, op->repl, op->repln) != 0) goto oom;
                        i += op->repln - 1;
                    } else if (sbuf_put(dst, ps + i, 1) != 0) {
                        goto oom;
                    }
                }
                if (span_put(dp, mark, dst->n - mark) != 0) goto oom;
            } else {
                if (sbuf_put(dst, ps, pn) != 0) goto oom;
                const char *q = dst->p + at;
                size_t pos = 0, from = 0, ms, me;
                while (from <= pn) {
                    int r;
                    if (op->kind == P_SPLIT_RE) {
                        r = re_next(op->re, w->md, q, pn, from, &ms, &me, err, err_cap);
                        if (r < 0) return -1;
                    } else {
                        const char *f =
                            from + op->litn <= pn
                                ? memmem(q + from, pn - from, op->lit, op->litn)
                                : NULL;
                        r = f != NULL;
                        if (f) {
                            ms = (size_t)(f - q);
                            me = ms + op->litn;
                        }
                    }
                    if (!r) break;
                    if (span_put(dp, at + pos, ms - pos) != 0) goto oom;
                    if (!op->removed && span_put(dp, at + ms, me - ms) != 0) goto oom;
                    pos = me;
                    from = after_match(q, pn, ms, me);
                }
                if (span_put(dp, at + pos, pn - pos) != 0) goto oom;
            }
        }
        cur = !cur;
    }
    *base = w->arena[cur].p;
    *pieces = &w->pieces[cur];
    return 0;
oom:
    util_set_err(err, err_cap, "out of memory");
    return -1;
}

/* ---- encoding: BPE ------------------------------------------------------- */

static int work_reserve(work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a;
    if (!(a = realloc(w->id, cap * sizeof *a))) return -1;
    w->id = a;
    if (!(a = realloc(w->prev, cap * sizeof *a))) return -1;
    w->prev = a;
    if (!(a = realloc(w->next, cap * sizeof *a))) return -1;
    w->next = a;
    uint64_t *hp = realloc(w->heap, 3 * cap * sizeof *hp);
    if (!hp) return -1;
    w->heap = hp;
    w->cap = cap;
    return 0;
}

static void push_pair(const hf_tokenizer *h, work *w, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    uint32_t rank;
    int32_t res;
    if (bpe_vocab_merge(&h->m, w->id[i], w->id[w->next[i]], &rank, &res))
        bpe_heap_push(w->heap, &w->heap_n, ((uint64_t)rank << 32) | (uint32_t)i);
}

/* Appends a symbol id (unk fusing as the library does). */
static void sym_add(const hf_tokenizer *h, work *w, size_t *n, int32_t id) {
    if (id < 0) {
        if (h->unk < 0) return; /* no unk token: the library drops the character */
        if (h->fuse_unk && *n > 0 && w->id[*n - 1] == h->unk) return;
        id = h->unk;
    }
    w->id[(*n)++] = id;
}

static int bpe_run(const hf_tokenizer *h, work *w, size_t s0, size_t e0, id_buf *out);

static int bpe_piece(const hf_tokenizer *h, work *w, const char *s, size_t len,
                     id_buf *out) {
    if (h->ignore_merges) {
        int32_t id = idx_find(h, s, len);
        if (id >= 0) return id_put(out, id);
    }
    if (len > INT32_MAX / 4 || work_reserve(w, len) != 0) return -1;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (h->byte_level) {
            sym_add(h, w, &n, h->byte_tok[(unsigned char)s[i]]);
            i++;
            continue;
        }
        size_t l = utf8_char_len(s + i, len - i);
        if (l == 0) l = 1;
        int32_t id = idx_find(h, s + i, l);
        if (id >= 0) {
            w->id[n++] = id;
        } else if (h->byte_fallback) {
            int all = 1;
            for (size_t k = 0; k < l; k++)
                all &= h->byte_tok[(unsigned char)s[i + k]] >= 0;
            if (all)
                for (size_t k = 0; k < l; k++)
                    w->id[n++] = h->byte_tok[(unsigned char)s[i + k]];
            else
                sym_add(h, w, &n, -1);
        } else {
            sym_add(h, w, &n, -1);
        }
        i += l;
    }
    /* A symbol whose id is in no merge never merges, so the runs between
       such symbols (byte-fallback newlines in a Llama-2 text, say) are
       independent: each gets its own small heap, with the same result. */
    for (size_t s0 = 0; s0 < n;) {
        size_t e0 = s0 + 1;
        if (h->merges[w->id[s0]])
            while (e0 < n && h->merges[w->id[e0]]) e0++;
        if (bpe_run(h, w, s0, e0, out) != 0) return -1;
        s0 = e0;
    }
    return 0;
}

/* BPE of the symbols w->id[s0 .. e0), appended to out. */
static int bpe_run(const hf_tokenizer *h, work *w, size_t s0, size_t e0, id_buf *out) {
    if (e0 - s0 == 1) return id_put(out, w->id[s0]);
    for (size_t i = s0; i < e0; i++) {
        w->prev[i] = i > s0 ? (int32_t)i - 1 : -1;
        w->next[i] = i + 1 < e0 ? (int32_t)i + 1 : -1;
    }
    w->heap_n = 0;
    for (size_t i = s0; i + 1 < e0; i++) push_pair(h, w, (int32_t)i);
    while (w->heap_n > 0) {
        uint64_t top = bpe_heap_pop(w->heap, &w->heap_n);
        int32_t i = (int32_t)(uint32_t)top, j = w->next[i];
        uint32_t want = (uint32_t)(top >> 32), rank;
        int32_t res;
        if (w->id[i] < 0 || j < 0) continue;
        if (!bpe_vocab_merge(&h->m, w->id[i], w->id[j], &rank, &res) || rank != want)
            continue;
        w->id[i] = res;
        w->id[j] = -1;
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = i;
        push_pair(h, w, w->prev[i]);
        push_pair(h, w, i);
    }
    for (int32_t i = (int32_t)s0; i >= 0; i = w->next[i])
        if (id_put(out, w->id[i]) != 0) return -1;
    return 0;
}

enum { CACHE_MAX_PIECE = 128, STREAM_BATCH = 65536 };

static int encode_piece(const hf_tokenizer *h, work *w, const char *s, size_t n,
                        id_buf *out) {
    if (n == 0) return 0;
    if (n > CACHE_MAX_PIECE) return bpe_piece(h, w, s, n, out);
    if (w->slot_used * 2 >= w->slot_cap) { /* grow (rehash) */
        size_t ncap = w->slot_cap ? w->slot_cap * 2 : 1024;
        struct slot *ns = calloc(ncap, sizeof *ns);
        if (!ns) return -1;
        for (size_t i = 0; i < w->slot_cap; i++) {
            if (!w->slot[i].used) continue;
            size_t k = bpe_hash_bytes((const unsigned char *)w->keys.p + w->slot[i].key,
                                      w->slot[i].len) &
                       (ncap - 1);
            while (ns[k].used) k = (k + 1) & (ncap - 1);
            ns[k] = w->slot[i];
        }
        free(w->slot);
        w->slot = ns;
        w->slot_cap = ncap;
    }
    size_t mask = w->slot_cap - 1;
    size_t k = bpe_hash_bytes((const unsigned char *)s, n) & mask;
    for (;; k = (k + 1) & mask) {
        struct slot *e = &w->slot[k];
        if (!e->used) break;
        if (e->len == n && memcmp(w->keys.p + e->key, s, n) == 0) {
            for (size_t i = 0; i < e->n_ids; i++)
                if (id_put(out, w->cache_ids.v[e->first + i]) != 0) return -1;
            return 0;
        }
    }
    size_t before = out->n;
    if (bpe_piece(h, w, s, n, out) != 0) return -1;
    struct slot *e = &w->slot[k];
    e->key = w->keys.n;
    if (sbuf_put(&w->keys, s, n) != 0) return -1;
    e->len = n;
    e->first = w->cache_ids.n;
    e->n_ids = out->n - before;
    for (size_t i = before; i < out->n; i++)
        if (id_put(&w->cache_ids, out->v[i]) != 0) return -1;
    e->used = 1;
    w->slot_used++;
    return 0;
}

/* ---- encoding: added tokens and the whole pipeline ------------------------ */

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Leftmost-longest added token of set in s[from..n): 1 with the match
   (widened by lstrip / rstrip) in [*ms, *me), 0 for none. */
static int find_added(const added_set *set, const char *s, size_t n, size_t from,
                      size_t *ms, size_t *me, const added_tok **tok) {
    if (set->n == 0) return 0;
    for (size_t i = from; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        for (uint32_t k = set->first[c]; k < set->first[c + 1]; k++) {
            const added_tok *a = set->t[k];
            if (a->n > n - i || memcmp(s + i, a->s, a->n) != 0) continue;
            size_t b = i, e = i + a->n;
            if (a->lstrip)
                while (b > from && is_ws(s[b - 1])) b--;
            if (a->rstrip)
                while (e < n && is_ws(s[e])) e++;
            *ms = b;
            *me = e;
            *tok = a;
            return 1;
        }
    }
    return 0;
}

static int encode_pieces(const hf_tokenizer *h, work *w, const char *s, size_t n,
                         int at_start, id_buf *out, char *err, size_t err_cap) {
    const char *base;
    span_buf *pieces;
    if (pretokenize(h, w, s, n, at_start, &base, &pieces, err, err_cap) != 0) return -1;
    for (size_t i = 0; i < pieces->n; i++)
        if (encode_piece(h, w, base + pieces->v[i].off, pieces->v[i].len, out) != 0) {
            util_set_err(err, err_cap, "out of memory while encoding");
            return -1;
        }
    return 0;
}

/* One stretch of raw text without (raw) added tokens. */
static int encode_segment(const hf_tokenizer *h, work *w, const char *s, size_t n,
                          int at_start, id_buf *out, char *err, size_t err_cap) {
    const char *t;
    size_t tn;
    if (normalize(h, s, n, &w->na, &w->nb, w->md, &t, &tn, err, err_cap) != 0) return -1;
    size_t pos = 0, ms, me;
    const added_tok *a;
    while (pos < tn && find_added(&h->norm_set, t, tn, pos, &ms, &me, &a)) {
        if (ms > pos && encode_pieces(h, w, t + pos, ms - pos, at_start && pos == 0, out,
                                      err, err_cap) != 0)
            return -1;
        if (id_put(out, a->id) != 0) goto oom;
        pos = me;
    }
    if (tn > pos && encode_pieces(h, w, t + pos, tn - pos, at_start && pos == 0, out, err,
                                  err_cap) != 0)
        return -1;
    return 0;
oom:
    util_set_err(err, err_cap, "out of memory");
    return -1;
}

static int flush(id_buf *out, hf_sink_fn sink, void *user, size_t done, int final,
                 char *err, size_t err_cap) {
    if (!final && out->n < STREAM_BATCH) return 0;
    if (sink(user, out->v, out->n, done) != 0) {
        if (err && err_cap && !err[0])
            util_set_err(err, err_cap, "encoding stopped by the caller");
        return -1;
    }
    out->n = 0;
    return 0;
}

int hf_tokenizer_encode(const hf_tokenizer *h, const char *text, size_t len,
                        hf_sink_fn sink, void *user, char *err, size_t err_cap) {
    work w = { 0 };
    id_buf out = { 0 };
    int rc = -1;
    /* One match block fits every pattern (the largest ovector wins). */
    w.md = pcre2_match_data_create(32, NULL);
    if (!w.md || id_put(&out, 0) != 0) {
        util_set_err(err, err_cap, "out of memory");
        goto done;
    }
    out.n = 0;
    size_t pos = 0, ms, me;
    const added_tok *a;
    while (pos < len) {
        int found = find_added(&h->raw_set, text, len, pos, &ms, &me, &a);
        if (!found) ms = me = len;
        if (ms > pos && encode_segment(h, &w, text + pos, ms - pos, pos == 0, &out, err,
                                       err_cap) != 0)
            goto done;
        if (found && id_put(&out, a->id) != 0) {
            util_set_err(err, err_cap, "out of memory");
            goto done;
        }
        pos = me;
        if (flush(&out, sink, user, pos, 0, err, err_cap) != 0) goto done;
    }
    if (flush(&out, sink, user, len, 1, err, err_cap) != 0) goto done;
    rc = 0;
done:
    work_free(&w);
    free(out.v);
    return rc;
}

/* ---- decoding -------------------------------------------------------------- */

int hf_tokenizer_decode(const hf_tokenizer *h, const int32_t *ids, size_t n, char **text,
                        size_t *len, char *err, size_t err_cap) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= h->vocab_size || !h->present[ids[i]]) {
            util_set_err(err, err_cap,
                         "token id %ld at position %zu is not in the hf vocabulary "
                         "(0..%u)",
                         (long)ids[i], i, h->vocab_size - 1);
            return -1;
        }
        total += h->dec_off[ids[i] + 1] - h->dec_off[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out) {
        util_set_err(err, err_cap, "out of memory decoding %zu tokens", n);
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *b = h->dec_pool + h->dec_off[ids[i]];
        size_t l = h->dec_off[ids[i] + 1] - h->dec_off[ids[i]];
        if (i == 0 && h->meta_first && l > 0 && b[0] == ' ') {
            b++;
            l--;
        }
        memcpy(out + o, b, l);
        o += l;
    }
    size_t s0 = 0;
    for (size_t k = 0; k < h->n_strip; k++) { /* whole-text Strip steps */
        const strip_op *st = &h->strip[k];
        for (int c = 0;
             c < st->start && o - s0 >= st->cn && memcmp(out + s0, st->c, st->cn) == 0;
             c++)
            s0 += st->cn;
        for (int c = 0; c < st->stop && o - s0 >= st->cn &&
                        memcmp(out + o - st->cn, st->c, st->cn) == 0;
             c++)
            o -= st->cn;
    }
    memmove(out, out + s0, o - s0);
    o -= s0;
    out[o] = '\0';
    *text = out;
    *len = o;
    return 0;
}
