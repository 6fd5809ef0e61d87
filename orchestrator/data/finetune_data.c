/*
 * finetune_data.c - JSONL fine-tuning examples (prompt/completion, chat
 * messages, text) to token ids with a loss mask, packed into rows. See
 * finetune_data.h.
 */
#include "orchestrator/data/finetune_data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"

#define FT_MAX_FILE ((size_t)1 << 31)

/* Token ids with a mask, grown piece by piece. */
typedef struct seq {
    int32_t *ids;
    uint8_t *mask;
    size_t n, cap;
} seq;

static int seq_push(seq *s, const int32_t *ids, size_t n, uint8_t m) {
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->n + n) cap *= 2;
        int32_t *ni = realloc(s->ids, cap * sizeof *ni);
        if (ni) s->ids = ni;
        uint8_t *nm = ni ? realloc(s->mask, cap) : NULL;
        if (!nm) return -1;
        s->mask = nm;
        s->cap = cap;
    }
    memcpy(s->ids + s->n, ids, n * sizeof *ids);
    memset(s->mask + s->n, m, n);
    s->n += n;
    return 0;
}

static void seq_free(seq *s) {
    free(s->ids);
    free(s->mask);
    memset(s, 0, sizeof *s);
}

/* Tokenize len bytes of text and append with mask m. */
static int push_text(seq *s, const ft_data_opts *o, const char *text, size_t len,
                     uint8_t m, const char *where, char *err, size_t err_cap) {
    if (len == 0) return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    char msg[1024];
    if (tokenizer_encode(o->tok, text, len, &ids, &n, msg, sizeof msg) != 0) {
        util_set_err(err, err_cap, "%s: %s", where, msg);
        return -1;
    }
    int rc = seq_push(s, ids, n, m);
    free(ids);
    if (rc != 0) util_set_err(err, err_cap, "%s: out of memory", where);
    return rc;
}

/* A string member that must be present. */
static const char *need_string(const cJSON *o, const char *key, const char *where,
                               char *err, size_t err_cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) {
        util_set_err(err, err_cap, "%s: \"%s\" must be a string", where, key);
        return NULL;
    }
    return v->valuestring;
}

/* The messages of one line rendered with per-assistant-turn loss. */
static int encode_messages(const cJSON *arr, const char *where, const ft_data_opts *o,
                           seq *s, char *err, size_t err_cap) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0) {
        util_set_err(err, err_cap, "%s: \"messages\" must be a non-empty array", where);
        return -1;
    }
    if (!o->tmpl) {
        util_set_err(err, err_cap, "%s: a \"messages\" example needs a chat template: %s",
                     where, o->tmpl_error ? o->tmpl_error : "the model has none");
        return -1;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    chat_message *msgs = calloc(n, sizeof *msgs);
    uint8_t *learn = calloc(n, 1);
    char *full = NULL, *pre = NULL, *cur = NULL;
    int rc = -1;
    if (!msgs || !learn) {
        util_set_err(err, err_cap, "%s: out of memory", where);
        goto out;
    }
    size_t i = 0, n_learn = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, arr) {
        if (!cJSON_IsObject(m)) {
            util_set_err(err, err_cap, "%s: messages[%zu] is not an object", where, i);
            goto out;
        }
        const cJSON *k;
        cJSON_ArrayForEach(k, m) {
            if (strcmp(k->string, "role") && strcmp(k->string, "content") &&
                strcmp(k->string, "weight")) {
                util_set_err(err, err_cap,
                             "%s: messages[%zu]: unknown key \"%s\" (orch fine-tunes on "
                             "role, content and weight)",
                             where, i, k->string);
                goto out;
            }
        }
        char w[64];
        snprintf(w, sizeof w, "messages[%zu]", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role)) {
            util_set_err(err, err_cap, "%s: %s: \"role\" must be a string", where, w);
            goto out;
        }
        if (!chat_template_role_valid(role->valuestring) ||
            strcmp(role->valuestring, "tool") == 0) {
            util_set_err(err, err_cap,
                         "%s: %s: role \"%s\" (expected system, developer, user or "
                         "assistant)",
                         where, w, role->valuestring);
            goto out;
        }
        if (!cJSON_IsString(content)) {
            util_set_err(err, err_cap, "%s: %s: \"content\" must be a string", where, w);
            goto out;
        }
        int is_asst = strcmp(role->valuestring, "assistant") == 0;
        const cJSON *weight = cJSON_GetObjectItemCaseSensitive(m, "weight");
        if (weight && (!is_asst || !cJSON_IsNumber(weight) ||
                       (weight->valuedouble != 0 && weight->valuedouble != 1))) {
            util_set_err(err, err_cap,
                         "%s: %s: \"weight\" must be 0 or 1, on an assistant "
                         "message",
                         where, w);
            goto out;
        }
        msgs[i].role = role->valuestring;
        msgs[i].content = content->valuestring;
        msgs[i].content_len = strlen(content->valuestring);
        learn[i] = is_asst && (!weight || weight->valuedouble == 1);
        n_learn += learn[i];
        i++;
    }
    if (n_learn == 0) {
        util_set_err(err, err_cap,
                     "%s: no assistant message to learn from (loss is on assistant "
                     "turns only)",
                     where);
        goto out;
    }
    size_t full_len = 0, at = 0;
    char msg[1024];
    if (chat_template_render(o->tmpl, msgs, n, 0, &full, &full_len, msg, sizeof msg) !=
        0) {
        util_set_err(err, err_cap, "%s: chat template %s: %s", where, o->tmpl->name, msg);
        goto out;
    }
    for (i = 0; i < n; i++) {
        if (!learn[i]) continue;
        size_t pl = 0, cl = 0;
        free(pre);
        free(cur);
        pre = cur = NULL;
        if (chat_template_render(o->tmpl, msgs, i, 1, &pre, &pl, msg, sizeof msg) != 0 ||
            chat_template_render(o->tmpl, msgs, i + 1, 0, &cur, &cl, msg, sizeof msg) !=
                0) {
            util_set_err(err, err_cap, "%s: messages[%zu]: chat template %s: %s", where,
                         i, o->tmpl->name, msg);
            goto out;
        }
        if (pl < at || pl > cl || cl > full_len || memcmp(pre, full, pl) != 0 ||
            memcmp(cur, full, cl) != 0) {
            util_set_err(
                err, err_cap,
                "%s: messages[%zu]: the chat template %s does not render this "
                "assistant turn after its prompt, so its tokens cannot be marked",
                where, i, o->tmpl->name);
            goto out;
        }
        if (push_text(s, o, full + at, pl - at, 0, where, err, err_cap) != 0 ||
            push_text(s, o, full + pl, cl - pl, 1, where, err, err_cap) != 0)
            goto out;
        at = cl;
    }
    if (push_text(s, o, full + at, full_len - at, 0, where, err, err_cap) != 0) goto out;
    rc = 0;
out:
    free(msgs);
    free(learn);
    free(full);
    free(pre);
    free(cur);
    return rc;
}

int ft_encode_line(const char *line, size_t len, const char *where, const ft_data_opts *o,
                   int32_t **ids, uint8_t **mask, size_t *n, char *err, size_t err_cap) {
    size_t b = 0;
    while (b < len && (line[b] == ' ' || line[b] == '\t' || line[b] == '\r')) b++;
    if (b == len) return 1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        size_t col = e && e >= line && e <= line + len ? (size_t)(e - line) + 1 : 1;
        util_set_err(err, err_cap, "%s: not valid JSON (column %zu)", where, col);
        return -1;
    }
    int rc = -1;
    seq s;
    memset(&s, 0, sizeof s);
    if (end) {
        const char *p = end;
        while (p < line + len && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
        if (p < line + len) {
            util_set_err(err, err_cap, "%s: text after the JSON value (column %zu)",
                         where, (size_t)(p - line) + 1);
            goto out;
        }
    }
    if (!cJSON_IsObject(root)) {
        util_set_err(err, err_cap, "%s: expected a JSON object", where);
        goto out;
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, root) {
        if (strcmp(k->string, "prompt") && strcmp(k->string, "completion") &&
            strcmp(k->string, "messages") && strcmp(k->string, "text")) {
            util_set_err(err, err_cap,
                         "%s: unknown key \"%s\" (an example is {\"prompt\", "
                         "\"completion\"}, {\"messages\"} or {\"text\"})",
                         where, k->string);
            goto out;
        }
    }
    int has_p =
        cJSON_HasObjectItem(root, "prompt") || cJSON_HasObjectItem(root, "completion");
    int has_m = cJSON_HasObjectItem(root, "messages");
    int has_t = cJSON_HasObjectItem(root, "text");
    if (has_p + has_m + has_t != 1) {
        util_set_err(err, err_cap, "%s: %s", where,
                     has_p + has_m + has_t == 0
                         ? "expected \"prompt\" and \"completion\", \"messages\" or "
                           "\"text\""
                         : "mixes the shapes prompt/completion, messages and text (give "
                           "one)");
        goto out;
    }
    int32_t eot = tokenizer_eot(o->tok);
    if (has_p) {
        const char *p = need_string(root, "prompt", where, err, err_cap);
        const char *c = p ? need_string(root, "completion", where, err, err_cap) : NULL;
        if (!c) goto out;
        if (!*c) {
            util_set_err(err, err_cap, "%s: \"completion\" is empty (nothing to learn)",
                         where);
            goto out;
        }
        if (push_text(&s, o, p, strlen(p), 0, where, err, err_cap) != 0 ||
            push_text(&s, o, c, strlen(c), 1, where, err, err_cap) != 0)
            goto out;
        if (eot >= 0 && seq_push(&s, &eot, 1, 1) != 0) goto oom;
    } else if (has_t) {
        const char *t = need_string(root, "text", where, err, err_cap);
        if (!t) goto out;
        if (!*t) {
            util_set_err(err, err_cap, "%s: \"text\" is empty", where);
            goto out;
        }
        if (push_text(&s, o, t, strlen(t), 1, where, err, err_cap) != 0) goto out;
        if (eot >= 0 && seq_push(&s, &eot, 1, 1) != 0) goto oom;
    } else if (encode_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"), where,
                               o, &s, err, err_cap) != 0) {
        goto out;
    }
    /* BOS in front, as generation puts it (not when the text has it). */
    size_t before = s.n;
    int added = tokenizer_prepend_bos(o->tok, &s.ids, &s.n);
    if (added < 0) goto oom;
    if (added) {
        uint8_t *nm = realloc(s.mask, s.n);
        if (!nm) goto oom;
        s.mask = nm;
        memmove(s.mask + 1, s.mask, before);
        s.mask[0] = 0;
    }
    for (size_t i = 0; i < s.n; i++)
        if (s.ids[i] < 0 || (uint32_t)s.ids[i] >= o->vocab_size) {
            util_set_err(err, err_cap,
                         "%s: token id %d is outside the model's vocabulary of %u", where,
                         s.ids[i], o->vocab_size);
            goto out;
        }
    *ids = s.ids;
    *mask = s.mask;
    *n = s.n;
    memset(&s, 0, sizeof s);
    rc = 0;
    goto out;
oom:
    util_set_err(err, err_cap, "%s: out of memory", where);
out:
    seq_free(&s);
    cJSON_Delete(root);
    return rc;
}

void ft_dataset_free(ft_dataset *d) {
    if (!d) return;
    free(d->tokens);
    free(d->targets);
    memset(d, 0, sizeof *d);
}

/* Add a row of padding to d. */
static int add_row(ft_dataset *d, uint64_t *cap) {
    const uint32_t T = d->seq_len;
    if (d->n_rows == *cap) {
        uint64_t nc = *cap ? *cap * 2 : 64;
        int32_t *nt = realloc(d->tokens, nc * T * sizeof *nt);
        if (nt) d->tokens = nt;
        int32_t *ng = nt ? realloc(d->targets, nc * T * sizeof *ng) : NULL;
        if (!ng) return -1;
        d->targets = ng;
        *cap = nc;
    }
    for (uint32_t i = 0; i < T; i++) {
        d->tokens[d->n_rows * T + i] = 0;
        d->targets[d->n_rows * T + i] = -1;
    }
    d->n_rows++;
    return 0;
}

int ft_data_parse(const char *text, size_t len, const char *name, const ft_data_opts *o,
                  ft_dataset *out, char *err, size_t err_cap) {
    ft_dataset d;
    memset(&d, 0, sizeof d);
    d.seq_len = o->seq_len;
    const uint32_t T = o->seq_len;
    uint64_t cap = 0, lineno = 0;
    uint32_t used = T; /* positions used in the last row (T: start a new one) */
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - (text + pos)) : len - pos;
        lineno++;
        char where[4200];
        snprintf(where, sizeof where, "%s:%llu", name, (unsigned long long)lineno);
        int32_t *ids = NULL;
        uint8_t *mask = NULL;
        size_t n = 0;
        int rc = ft_encode_line(text + pos, ll, where, o, &ids, &mask, &n, err, err_cap);
        pos += ll + (nl ? 1 : 0);
        if (rc < 0) {
            ft_dataset_free(&d);
            return -1;
        }
        if (rc == 1) continue;
        d.n_examples++;
        size_t P = n ? n - 1 : 0; /* positions */
        if (P > T) {
            P = T;
            d.n_truncated++;
        }
        uint64_t learn = 0;
        for (size_t i = 0; i < P; i++) learn += mask[i + 1];
        if (learn == 0) {
            d.n_dropped++;
            free(ids);
            free(mask);
            continue;
        }
        if (used + P > T || (o->one_per_row && used > 0)) {
            if (add_row(&d, &cap) != 0) {
                free(ids);
                free(mask);
                ft_dataset_free(&d);
                util_set_err(err, err_cap, "%s: out of memory", name);
                return -1;
            }
            used = 0;
        }
        int32_t *rt = d.tokens + (d.n_rows - 1) * T + used;
        int32_t *rg = d.targets + (d.n_rows - 1) * T + used;
        for (size_t i = 0; i < P; i++) {
            rt[i] = ids[i];
            rg[i] = mask[i + 1] ? ids[i + 1] : -1;
        }
        used += (uint32_t)P;
        d.n_targets += learn;
        free(ids);
        free(mask);
    }
    if (d.n_targets == 0) {
        util_set_err(err, err_cap,
                     "%s: no example has a token to learn from (%llu "
                     "examples)",
                     name, (unsigned long long)d.n_examples);
        ft_dataset_free(&d);
        return -1;
    }
    *out = d;
    return 0;
}

int ft_data_load(const char *path, const ft_data_opts *o, ft_dataset *out, char *err,
                 size_t err_cap) {
    char *text = NULL;
    size_t len = 0;
    if (fsio_read_file(path, FT_MAX_FILE, &text, &len, err, err_cap) != 0) return -1;
    int rc = ft_data_parse(text, len, path, o, out, err, err_cap);
    free(text);
    return rc;
}
