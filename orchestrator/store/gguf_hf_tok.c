/*
 * gguf_hf_tok.c - tokenizer.json -> GGUF tokenizer.ggml.* keys (see
 * gguf_hf_tok.h): the form (ByteLevel or Metaspace + byte fallback), the
 * token table by id with its types, merges or merge-rank scores, the special
 * ids and the chat template.
 */
#include "orchestrator/store/gguf_hf_tok.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/store/ckpt_files.h"

#define TOK_FILE_MAX ((size_t)512 << 20)
#define CFG_FILE_MAX ((size_t)16 << 20)

enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5, T_BYTE = 6 };

/* Llama 3's and Qwen 2's pre-tokenizer patterns (tokenizer.json spelling). */
static const char LLAMA3_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct tok_ctx {
    const char *path; /* tokenizer.json, for messages */
    uint32_t n;       /* rows written (the model's vocabulary) */
    const char **str; /* [n] token text (NULL: a gap, written as padding) */
    int32_t *type;    /* [n] */
    float *score;     /* [n] (llama form) */
    uint32_t *hash;   /* open addressing: id + 1, 0 empty */
    size_t hcap;
    int kind;
} tok_ctx;

static int bad(tok_ctx *t, int kind) {
    t->kind = kind;
    return -1;
}

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static void hash_put(tok_ctx *t, uint32_t id) {
    size_t i = fnv(t->str[id], strlen(t->str[id])) & (t->hcap - 1);
    while (t->hash[i]) i = (i + 1) & (t->hcap - 1);
    t->hash[i] = id + 1;
}

/* The id of the token spelled s[0..n), or -1. */
static int64_t hash_get(const tok_ctx *t, const char *s, size_t n) {
    size_t i = fnv(s, n) & (t->hcap - 1);
    for (; t->hash[i]; i = (i + 1) & (t->hcap - 1)) {
        const char *c = t->str[t->hash[i] - 1];
        if (strncmp(c, s, n) == 0 && c[n] == '\0') return t->hash[i] - 1;
    }
    return -1;
}

static const char *type_of(const cJSON *o) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(x) ? x->valuestring : "";
}

/* The pre-tokenizer's llama.cpp name for the ByteLevel form, NULL when the
 * file is not ByteLevel, "" for a ByteLevel orch cannot name. */
static const char *byte_level_pre(const cJSON *pre) {
    if (!pre || cJSON_IsNull(pre)) return NULL;
    if (strcmp(type_of(pre), "ByteLevel") == 0) {
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
        return cJSON_IsFalse(re) ? "" : "gpt-2";
    }
    if (strcmp(type_of(pre), "Sequence") != 0) return NULL;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    int n = cJSON_GetArraySize(seq), has_bl = 0;
    for (int i = 0; i < n; i++)
        has_bl |= strcmp(type_of(cJSON_GetArrayItem(seq, i)), "ByteLevel") == 0;
    if (!has_bl) return NULL;
    if (n != 2 || strcmp(type_of(cJSON_GetArrayItem(seq, 0)), "Split") != 0 ||
        strcmp(type_of(cJSON_GetArrayItem(seq, 1)), "ByteLevel") != 0)
        return "";
    const cJSON *pat =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(seq, 0), "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (!cJSON_IsString(re)) return "";
    if (strcmp(re->valuestring, LLAMA3_RE) == 0) return "llama-bpe";
    if (strcmp(re->valuestring, QWEN2_RE) == 0) return "qwen2";
    return "";
}

/* Whether the normalizer or pre-tokenizer turns spaces into U+2581 (the
 * Metaspace form); *prefix: whether it also prepends one. */
static int metaspace(const cJSON *j, int *prefix) {
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
    *prefix = 0;
    if (strcmp(type_of(pre), "Metaspace") == 0) {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(pre, "prepend_scheme");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space");
        *prefix = cJSON_IsString(ps) ? strcmp(ps->valuestring, "never") != 0
                                     : !cJSON_IsFalse(ap);
        return 1;
    }
    int found = 0;
    const cJSON *list = strcmp(type_of(norm), "Sequence") == 0
                            ? cJSON_GetObjectItemCaseSensitive(norm, "normalizers")
                            : NULL;
    int n = list ? cJSON_GetArraySize(list) : (norm ? 1 : 0);
    for (int i = 0; i < n; i++) {
        const cJSON *x = list ? cJSON_GetArrayItem(list, i) : norm;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(x, "prepend");
        if (strcmp(type_of(x), "Replace") == 0 && cJSON_IsString(c) &&
            strcmp(c->valuestring, "\xe2\x96\x81") == 0)
            found = 1;
        if (strcmp(type_of(x), "Prepend") == 0 && cJSON_IsString(p) &&
            strcmp(p->valuestring, "\xe2\x96\x81") == 0)
            *prefix = 1;
    }
    return found;
}

/* Token table from model.vocab and added_tokens. */
static int read_tokens(tok_ctx *t, const cJSON *j, const cJSON *vocab, char *err,
                       size_t err_cap) {
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    uint64_t max_id = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e8) {
            util_set_err(err, err_cap, "%s: model.vocab[\"%.40s\"] is not a token id",
                         t->path, e->string);
            return bad(t, 2);
        }
        if ((uint64_t)e->valuedouble + 1 > max_id) max_id = (uint64_t)e->valuedouble + 1;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8 ||
            !cJSON_IsString(c)) {
            util_set_err(err, err_cap,
                         "%s: added_tokens: an entry without id and content", t->path);
            return bad(t, 2);
        }
        if ((uint64_t)id->valuedouble + 1 > max_id)
            max_id = (uint64_t)id->valuedouble + 1;
    }
    if (max_id > t->n) {
        util_set_err(err, err_cap,
                     "%s: %llu tokens do not fit the model's vocabulary of %u (model."
                     "vocab_size)",
                     t->path, (unsigned long long)max_id, t->n);
        return bad(t, 2);
    }
    for (t->hcap = 16; t->hcap < 2 * (size_t)t->n; t->hcap *= 2) {
    }
    t->str = util_calloc(t->n, sizeof *t->str);
    t->type = util_calloc(t->n, sizeof *t->type);
    t->score = util_calloc(t->n, sizeof *t->score);
    t->hash = util_calloc(t->hcap, sizeof *t->hash);
    if (!t->str || !t->type || !t->score || !t->hash) {
        util_set_err(err, err_cap, "out of memory");
        return bad(t, 1);
    }
    for (const cJSON *e = vocab->child; e; e = e->next) {
        uint32_t id = (uint32_t)e->valuedouble;
        t->str[id] = e->string;
        t->type[id] = T_NORMAL;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        t->str[id] = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
        t->type[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"))
                          ? T_CONTROL
                          : T_USER;
    }
    for (uint32_t i = 0; i < t->n; i++)
        if (t->str[i]) hash_put(t, i);
    return 0;
}

/* Merge k as "a b" (string or [a, b]) into buf; its length, or -1. */
static long merge_text(const cJSON *m, char *buf, size_t cap) {
    if (cJSON_IsString(m)) {
        size_t l = strlen(m->valuestring);
        if (l + 1 > cap || !strchr(m->valuestring, ' ')) return -1;
        memcpy(buf, m->valuestring, l + 1);
        return (long)l;
    }
    const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !cJSON_IsString(a) ||
        !cJSON_IsString(b))
        return -1;
    int l = snprintf(buf, cap, "%s %s", a->valuestring, b->valuestring);
    return l < 0 || (size_t)l >= cap ? -1 : l;
}

/* The id of special token KEY of tokenizer_config.json ("..." or
 * {"content": "..."}), or -1. */
static int64_t special_id(const tok_ctx *t, const cJSON *cfg, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(x)) x = cJSON_GetObjectItemCaseSensitive(x, "content");
    return cJSON_IsString(x) ? hash_get(t, x->valuestring, strlen(x->valuestring)) : -1;
}

static int64_t gen_id(const cJSON *gen, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(gen, key);
    if (cJSON_IsArray(x)) x = cJSON_GetArrayItem(x, 0);
    return cJSON_IsNumber(x) && x->valuedouble >= 0 ? (int64_t)x->valuedouble : -1;
}

static cJSON *read_json(const char *dir, const char *name, size_t max, int required,
                        const char **path_out, char *path, size_t cap, char *err,
                        size_t err_cap) {
    char *text = NULL;
    if (ckpt_path_join(path, cap, dir, name, err, err_cap) != 0) return NULL;
    if (path_out) *path_out = path;
    if (!required && !ckpt_exists(path)) return cJSON_CreateObject();
    if (fsio_read_file(path, max, &text, NULL, err, err_cap) != 0) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        util_set_err(err, err_cap, "%s: not a JSON object", path);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static int write_keys(tok_ctx *t, gguf_writer *w, const cJSON *j, const cJSON *cfg,
                      const cJSON *gen, const char *pre, int spm, int prefix, char *err,
                      size_t err_cap) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    char **pad = util_calloc(t->n, sizeof *pad);
    const char **mstr = util_calloc(n_merges ? n_merges : 1, sizeof *mstr);
    char *mpool = NULL;
    int rc = -1;
    if (!pad || !mstr) goto oom;
    for (uint32_t i = 0; i < t->n; i++) {
        if (t->str[i]) continue;
        pad[i] = malloc(24);
        if (!pad[i]) goto oom;
        snprintf(pad[i], 24, "[PAD%u]", i);
        t->str[i] = pad[i];
        t->type[i] = T_UNUSED;
    }
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    int64_t unk_id = cJSON_IsString(unk)
                         ? hash_get(t, unk->valuestring, strlen(unk->valuestring))
                         : -1;
    if (unk_id >= 0) t->type[unk_id] = T_UNKNOWN;
    if (spm) {
        for (uint32_t i = 0; i < t->n; i++) {
            const char *s = t->str[i];
            if (t->type[i] == T_NORMAL && strlen(s) == 6 && strncmp(s, "<0x", 3) == 0 &&
                s[5] == '>')
                t->type[i] = T_BYTE;
            size_t l = strlen(s);
            int one_char = l > 0 && l <= 4 &&
                           (l == 1 || ((unsigned char)s[0] >= 0xc0 &&
                                       (l == 2 || (unsigned char)s[0] >= 0xe0) &&
                                       (l <= 3 || (unsigned char)s[0] >= 0xf0)));
            t->score[i] = (t->type[i] == T_BYTE || one_char) ? 0.0f : -1e9f;
        }
    }
    size_t mcap = 1;
    for (const cJSON *m = merges ? merges->child : NULL; m; m = m->next)
        mcap +=
            cJSON_IsString(m) ? strlen(m->valuestring) + 1
            : (cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(m, 1)))
                ? strlen(cJSON_GetArrayItem(m, 0)->valuestring) +
                      strlen(cJSON_GetArrayItem(m, 1)->valuestring) + 2
                : 1;
    mpool = malloc(mcap);
    if (!mpool) goto oom;
    size_t pos = 0, k = 0;
    for (const cJSON *m = merges ? merges->child : NULL; m; m = m->next, k++) {
        long l = merge_text(m, mpool + pos, mcap - pos);
        if (l < 0) {
            util_set_err(err, err_cap, "%s: model.merges[%zu] is not \"a b\" or [a, b]",
                         t->path, k);
            t->kind = 2;
            goto out;
        }
        mstr[k] = mpool + pos;
        if (spm) { /* the token the merge makes scores -rank */
            char *sp = strchr(mpool + pos, ' ');
            char joined[1024];
            size_t la = (size_t)(sp - (mpool + pos)), lb = (size_t)l - la - 1;
            if (la + lb < sizeof joined) {
                memcpy(joined, mpool + pos, la);
                memcpy(joined + la, sp + 1, lb);
                int64_t id = hash_get(t, joined, la + lb);
                if (id >= 0 && t->score[id] == -1e9f) t->score[id] = -(float)k;
            }
        }
        pos += (size_t)l + 1;
    }
    t->kind = 1;
    int64_t bos = special_id(t, cfg, "bos_token"), eos = special_id(t, cfg, "eos_token");
    if (bos < 0) bos = gen_id(gen, "bos_token_id");
    if (eos < 0) eos = gen_id(gen, "eos_token_id");
    const cJSON *abos = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    int add_bos;
    if (cJSON_IsBool(abos)) {
        add_bos = cJSON_IsTrue(abos);
    } else {
        const cJSON *pp = cJSON_GetObjectItemCaseSensitive(j, "post_processor");
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
        add_bos = strcmp(type_of(pp), "TemplateProcessing") == 0 &&
                  cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, 0),
                                                   "SpecialToken") != NULL;
    }
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (gguf_writer_add_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2", err,
                            err_cap) != 0 ||
        (!spm && gguf_writer_add_str(w, "tokenizer.ggml.pre", pre, err, err_cap) != 0) ||
        gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", t->str, NULL, t->n, err,
                                  err_cap) != 0 ||
        gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", t->type, t->n, err,
                                  err_cap) != 0 ||
        (spm && gguf_writer_add_f32_array(w, "tokenizer.ggml.scores", t->score, t->n, err,
                                          err_cap) != 0) ||
        (!spm && gguf_writer_add_str_array(w, "tokenizer.ggml.merges", mstr, NULL,
                                           n_merges, err, err_cap) != 0) ||
        (bos >= 0 && bos < t->n &&
         gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos, err,
                             err_cap) != 0) ||
        (eos >= 0 && eos < t->n &&
         gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos, err,
                             err_cap) != 0) ||
        (unk_id >= 0 && gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id",
                                            (uint32_t)unk_id, err, err_cap) != 0) ||
        gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos, err, err_cap) !=
            0 ||
        (spm && gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", prefix, err,
                                     err_cap) != 0) ||
        (cJSON_IsString(tmpl) &&
         gguf_writer_add_str(w, "tokenizer.chat_template", tmpl->valuestring, err,
                             err_cap) != 0))
        goto out;
    rc = 0;
    goto out;
oom:
    util_set_err(err, err_cap, "out of memory");
    t->kind = 1;
out:
    for (uint32_t i = 0; pad && i < t->n; i++) free(pad[i]);
    free(pad);
    free(mstr);
    free(mpool);
    return rc;
}

int gguf_hf_tok_add(gguf_writer *w, const char *dir, uint32_t vocab_size, int *kind,
                    char *err, size_t err_cap) {
    tok_ctx t;
    memset(&t, 0, sizeof t);
    t.n = vocab_size;
    t.kind = 2;
    char p1[PATH_MAX], p2[PATH_MAX], p3[PATH_MAX];
    cJSON *j = read_json(dir, "tokenizer.json", TOK_FILE_MAX, 1, &t.path, p1, sizeof p1,
                         err, err_cap);
    cJSON *cfg = j ? read_json(dir, "tokenizer_config.json", CFG_FILE_MAX, 0, NULL, p2,
                               sizeof p2, err, err_cap)
                   : NULL;
    cJSON *gen = cfg ? read_json(dir, "generation_config.json", CFG_FILE_MAX, 0, NULL, p3,
                                 sizeof p3, err, err_cap)
                     : NULL;
    int rc = -1;
    if (!gen) goto out;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (strcmp(type_of(model), "BPE") != 0 || !cJSON_IsObject(vocab)) {
        util_set_err(err, err_cap,
                     "%s: model.type '%.40s' has no GGUF tokenizer orch writes (BPE with "
                     "a vocab object only)",
                     t.path, type_of(model));
        goto out;
    }
    const char *pre =
        byte_level_pre(cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"));
    int prefix = 0, spm = 0;
    if (pre && !pre[0]) {
        util_set_err(
            err, err_cap,
            "%s: pre_tokenizer: a ByteLevel pre-tokenization without a llama.cpp "
            "name orch knows (plain ByteLevel, or Split with the Llama 3 or Qwen 2 "
            "pattern, then ByteLevel)",
            t.path);
        goto out;
    }
    if (!pre) {
        spm = metaspace(j, &prefix);
        if (!spm ||
            !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) {
            util_set_err(err, err_cap,
                         "%s: neither ByteLevel pre-tokenization nor Metaspace with "
                         "model.byte_fallback true (the BPE forms of GGUF's gpt2 and "
                         "llama tokenizers)",
                         t.path);
            goto out;
        }
    }
    if (read_tokens(&t, j, vocab, err, err_cap) != 0 ||
        write_keys(&t, w, j, cfg, gen, pre, spm, prefix, err, err_cap) != 0)
        goto out;
    rc = 0;
out:
    *kind = t.kind;
    free(t.str);
    free(t.type);
    free(t.score);
    free(t.hash);
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    return rc;
}

/* ---- GGUF -> tokenizer.json ------------------------------------------------ */

typedef struct rev_ctx {
    const char *path;
    uint64_t n;
    char **tok;    /* [n] NUL-terminated copies */
    int32_t *type; /* [n] */
    float *score;  /* [n] (llama form) or NULL */
    tok_ctx h;     /* the hash over tok (h.str aliases tok) */
} rev_ctx;

/* The i-th string of kv as a malloc'd NUL-terminated copy. */
static char *dup_str(const gguf_str *s) {
    char *c = malloc((size_t)s->len + 1);
    if (c) {
        memcpy(c, s->p, (size_t)s->len);
        c[s->len] = '\0';
    }
    return c;
}

/* Bytes of the UTF-8 sequence starting with lead byte c (1 for a bad byte). */
static size_t utf8_len(unsigned char c) {
    return c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
}

typedef struct spm_merge {
    float score;
    int64_t l, r; /* token ids */
    uint64_t seq; /* for a stable order */
} spm_merge;

static int merge_cmp(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int add_spm_merges(rev_ctx *r, cJSON *merges) {
    size_t cap = 1024, n = 0;
    spm_merge *m = malloc(cap * sizeof *m);
    if (!m) return -1;
    for (uint64_t id = 0; id < r->n; id++) {
        const char *t = r->tok[id];
        size_t len = strlen(t);
        if (r->type[id] != T_NORMAL || r->score[id] <= -1e8f) continue;
        size_t first = n;
        for (size_t i = utf8_len((unsigned char)t[0]); i < len;
             i += utf8_len((unsigned char)t[i])) {
            int64_t l = hash_get(&r->h, t, i), rr = hash_get(&r->h, t + i, len - i);
            if (l < 0 || rr < 0) continue;
            if (n == cap) {
                spm_merge *g = realloc(m, 2 * cap * sizeof *m);
                if (!g) {
                    free(m);
                    return -1;
                }
                m = g, cap *= 2;
            }
            m[n++] = (spm_merge){ r->score[id], l, rr, 0 };
        }
        /* within a token: by the ids of the left, then the right part */
        for (size_t a = first + 1; a < n; a++)
            for (size_t b = a;
                 b > first &&
                 (m[b - 1].l > m[b].l || (m[b - 1].l == m[b].l && m[b - 1].r > m[b].r));
                 b--) {
                spm_merge t2 = m[b - 1];
                m[b - 1] = m[b];
                m[b] = t2;
            }
    }
    for (size_t i = 0; i < n; i++) m[i].seq = i;
    qsort(m, n, sizeof *m, merge_cmp);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        size_t la = strlen(r->tok[m[i].l]), lb = strlen(r->tok[m[i].r]);
        char *s = malloc(la + lb + 2);
        if (!s) {
            rc = -1;
            break;
        }
        memcpy(s, r->tok[m[i].l], la);
        s[la] = ' ';
        memcpy(s + la + 1, r->tok[m[i].r], lb + 1);
        cJSON *x = cJSON_CreateString(s);
        free(s);
        if (!x || !cJSON_AddItemToArray(merges, x)) rc = -1;
    }
    free(m);
    return rc;
}

static cJSON *bytelevel_pre(const char *pre) {
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "trim_offsets", 1);
    cJSON_AddBoolToObject(bl, "use_regex", strcmp(pre, "gpt-2") == 0);
    if (strcmp(pre, "gpt-2") == 0) return bl;
    cJSON *seq = cJSON_CreateObject(), *list;
    cJSON_AddStringToObject(seq, "type", "Sequence");
    list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON *pat = cJSON_AddObjectToObject(split, "pattern");
    cJSON_AddStringToObject(pat, "Regex",
                            strcmp(pre, "qwen2") == 0 ? QWEN2_RE : LLAMA3_RE);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, bl);
    return seq;
}

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* Llama 2's normalizer and decoder (prefix: add_space_prefix). */
static void spm_pipeline(cJSON *j, int prefix) {
    cJSON *norm = typed("Sequence"), *nl = cJSON_AddArrayToObject(norm, "normalizers");
    if (prefix) {
        cJSON *p = typed("Prepend");
        cJSON_AddStringToObject(p, "prepend", "\xe2\x96\x81");
        cJSON_AddItemToArray(nl, p);
    }
    cJSON *rep = typed("Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(rep, "pattern"), "String", " ");
    cJSON_AddStringToObject(rep, "content", "\xe2\x96\x81");
    cJSON_AddItemToArray(nl, rep);
    cJSON_AddItemToObject(j, "normalizer", norm);
    cJSON_AddNullToObject(j, "pre_tokenizer");
    cJSON_AddNullToObject(j, "post_processor");
    cJSON *dec = typed("Sequence"), *dl = cJSON_AddArrayToObject(dec, "decoders");
    cJSON *r2 = typed("Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(r2, "pattern"), "String",
                            "\xe2\x96\x81");
    cJSON_AddStringToObject(r2, "content", " ");
    cJSON_AddItemToArray(dl, r2);
    cJSON_AddItemToArray(dl, typed("ByteFallback"));
    cJSON_AddItemToArray(dl, typed("Fuse"));
    if (prefix) {
        cJSON *st = typed("Strip");
        cJSON_AddStringToObject(st, "content", " ");
        cJSON_AddNumberToObject(st, "start", 1);
        cJSON_AddNumberToObject(st, "stop", 0);
        cJSON_AddItemToArray(dl, st);
    }
    cJSON_AddItemToObject(j, "decoder", dec);
}

static int special_key(const gguf_file *f, const rev_ctx *r, cJSON *cfg, const char *key,
                       const char *name) {
    uint64_t id;
    if (gguf_get_uint(f, key, r->n ? r->n - 1 : 0, &id, NULL, 0) != 1) return 0;
    return cJSON_AddStringToObject(cfg, name, r->tok[id]) ? 0 : -1;
}

int gguf_hf_tok_files(const gguf_file *f, const char *path, char **tokenizer_json,
                      char **tokenizer_config, int *kind, char *err, size_t err_cap) {
    rev_ctx r;
    memset(&r, 0, sizeof r);
    r.path = path;
    *tokenizer_json = *tokenizer_config = NULL;
    *kind = 2;
    gguf_str model, pre = { "", 0 };
    char pre_name[32] = "";
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, err, err_cap) != 1 ||
        (!(model.len == 4 && memcmp(model.p, "gpt2", 4) == 0) &&
         !(model.len == 5 && memcmp(model.p, "llama", 5) == 0))) {
        util_set_err(err, err_cap,
                     "%s: tokenizer.ggml.model is not gpt2 or llama (the tokenizers orch "
                     "turns into a tokenizer.json)",
                     path);
        return -1;
    }
    int spm = model.len == 5;
    if (!spm) {
        int got = gguf_get_str(f, "tokenizer.ggml.pre", &pre, err, err_cap);
        if (got < 0) return -1;
        snprintf(pre_name, sizeof pre_name, "%.*s", (int)(pre.len < 31 ? pre.len : 31),
                 pre.p);
        if (got == 0 ||
            (strcmp(pre_name, "gpt-2") != 0 && strcmp(pre_name, "llama-bpe") != 0 &&
             strcmp(pre_name, "qwen2") != 0)) {
            util_set_err(err, err_cap,
                         "%s: tokenizer.ggml.pre '%s' is not one orch turns into a "
                         "pre-tokenizer (gpt-2, llama-bpe, qwen2)",
                         path, got ? pre_name : "(missing)");
            return -1;
        }
    }
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    const gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    const gguf_kv *scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    if (!toks || toks->type != GGUF_ARRAY || toks->arr_type != GGUF_STRING || !types ||
        types->type != GGUF_ARRAY || types->n != toks->n ||
        (types->arr_type != GGUF_I32 && types->arr_type != GGUF_U32) ||
        (!spm &&
         (!merges || merges->type != GGUF_ARRAY || merges->arr_type != GGUF_STRING)) ||
        (spm && (!scores || scores->type != GGUF_ARRAY || scores->arr_type != GGUF_F32 ||
                 scores->n != toks->n))) {
        util_set_err(
            err, err_cap,
            "%s: tokenizer.ggml.tokens / token_type / %s missing or of the wrong "
            "type or length",
            path, spm ? "scores" : "merges");
        return -1;
    }
    *kind = 1;
    r.n = toks->n;
    r.tok = util_calloc(r.n ? r.n : 1, sizeof *r.tok);
    r.type = util_calloc(r.n ? r.n : 1, sizeof *r.type);
    r.score = spm ? util_calloc(r.n ? r.n : 1, sizeof *r.score) : NULL;
    for (r.h.hcap = 16; r.h.hcap < 2 * (size_t)r.n; r.h.hcap *= 2) {
    }
    r.h.hash = util_calloc(r.h.hcap, sizeof *r.h.hash);
    cJSON *j = cJSON_CreateObject(), *cfg = cJSON_CreateObject();
    int rc = -1;
    if (!r.tok || !r.type || (spm && !r.score) || !r.h.hash || !j || !cfg) goto oom;
    r.h.str = (const char **)r.tok;
    for (uint64_t i = 0; i < r.n; i++) {
        r.tok[i] = dup_str(&toks->strs[i]);
        if (!r.tok[i]) goto oom;
        r.type[i] = (int32_t)gguf_arr_int(types, i);
        if (spm) memcpy(&r.score[i], (const char *)scores->data + 4 * i, 4);
        if (r.type[i] != T_UNUSED) hash_put(&r.h, (uint32_t)i);
    }
    cJSON_AddStringToObject(j, "version", "1.0");
    cJSON_AddNullToObject(j, "truncation");
    cJSON_AddNullToObject(j, "padding");
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens");
    for (uint64_t i = 0; i < r.n; i++) {
        if (r.type[i] != T_CONTROL && r.type[i] != T_USER) continue;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", (double)i);
        cJSON_AddStringToObject(a, "content", r.tok[i]);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", r.type[i] == T_USER);
        cJSON_AddBoolToObject(a, "special", r.type[i] == T_CONTROL);
        cJSON_AddItemToArray(added, a);
    }
    int prefix = 0;
    if (spm) {
        const gguf_kv *asp = gguf_find_kv(f, "tokenizer.ggml.add_space_prefix");
        prefix = !asp || asp->type != GGUF_BOOL || *(const uint8_t *)asp->data != 0;
        spm_pipeline(j, prefix);
    } else {
        if (strcmp(pre_name, "qwen2") == 0)
            cJSON_AddItemToObject(j, "normalizer", typed("NFC"));
        else
            cJSON_AddNullToObject(j, "normalizer");
        cJSON_AddItemToObject(j, "pre_tokenizer", bytelevel_pre(pre_name));
        cJSON_AddNullToObject(j, "post_processor");
        cJSON *dec = typed("ByteLevel");
        cJSON_AddBoolToObject(dec, "add_prefix_space", 1);
        cJSON_AddBoolToObject(dec, "trim_offsets", 1);
        cJSON_AddBoolToObject(dec, "use_regex", 1);
        cJSON_AddItemToObject(j, "decoder", dec);
    }
    cJSON *m = cJSON_AddObjectToObject(j, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    uint64_t unk = 0;
    if (gguf_get_uint(f, "tokenizer.ggml.unknown_token_id", r.n ? r.n - 1 : 0, &unk, NULL,
                      0) == 1)
        cJSON_AddStringToObject(m, "unk_token", r.tok[unk]);
    else
        cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", spm);
    cJSON_AddBoolToObject(m, "byte_fallback", spm);
    cJSON_AddBoolToObject(m, "ignore_merges", strcmp(pre_name, "llama-bpe") == 0);
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab");
    for (uint64_t i = 0; i < r.n; i++)
        if (r.type[i] != T_UNUSED &&
            (spm || (r.type[i] != T_CONTROL && r.type[i] != T_USER)))
            cJSON_AddNumberToObject(vocab, r.tok[i], (double)i);
    cJSON *ml = cJSON_AddArrayToObject(m, "merges");
    if (!ml) goto oom;
    if (spm) {
        if (add_spm_merges(&r, ml) != 0) goto oom;
    } else {
        for (uint64_t i = 0; i < merges->n; i++) {
            char *s = dup_str(&merges->strs[i]);
            cJSON *x = s ? cJSON_CreateString(s) : NULL;
            free(s);
            if (!x || !cJSON_AddItemToArray(ml, x)) goto oom;
        }
    }
    const gguf_kv *ab = gguf_find_kv(f, "tokenizer.ggml.add_bos_token");
    cJSON_AddBoolToObject(cfg, "add_bos_token",
                          ab && ab->type == GGUF_BOOL && *(const uint8_t *)ab->data != 0);
    cJSON_AddBoolToObject(cfg, "add_eos_token", 0);
    gguf_str tmpl;
    if (special_key(f, &r, cfg, "tokenizer.ggml.bos_token_id", "bos_token") != 0 ||
        special_key(f, &r, cfg, "tokenizer.ggml.eos_token_id", "eos_token") != 0 ||
        special_key(f, &r, cfg, "tokenizer.ggml.unknown_token_id", "unk_token") != 0)
        goto oom;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl, NULL, 0) == 1) {
        char *t = dup_str(&tmpl);
        if (!t || !cJSON_AddStringToObject(cfg, "chat_template", t)) {
            free(t);
            goto oom;
        }
        free(t);
    }
    cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    *tokenizer_json = cJSON_PrintUnformatted(j);
    *tokenizer_config = cJSON_Print(cfg);
    if (!*tokenizer_json || !*tokenizer_config) goto oom;
    rc = 0;
    goto out;
oom:
    util_set_err(err, err_cap, "out of memory");
    free(*tokenizer_json);
    free(*tokenizer_config);
    *tokenizer_json = *tokenizer_config = NULL;
out:
    for (uint64_t i = 0; r.tok && i < r.n; i++) free(r.tok[i]);
    free(r.tok);
    free(r.type);
    free(r.score);
    free(r.h.hash);
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    return rc;
}
