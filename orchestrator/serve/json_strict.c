/*
 * json_strict.c - trailing data, stray control bytes, NULs in strings and
 * duplicate keys in a request body cJSON accepted. See json_strict.h.
 */
#include "orchestrator/serve/json_strict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_CAP 192
#define KEY_SHOW 64 /* bytes of a key shown in a message */

/* The known field spelled s[0..n), or NULL. */
static const char *known(const char *fields, const char *s, size_t n) {
    for (const char *f = fields; f && *f; f += strlen(f) + 1)
        if (strlen(f) == n && memcmp(f, s, n) == 0) return f;
    return NULL;
}

static int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ------------------------------------------------------------------------- */
/* The raw scan: control bytes and NULs                                       */
/* ------------------------------------------------------------------------- */
typedef struct frame {
    int is_obj, expect_key;
    long index;
    size_t key_off, key_len; /* the current key (raw, escapes kept) */
} frame;

/* PATH of the value at the top of the stack (depth frames). */
static void frame_path(const char *body, const frame *st, int depth, char *out,
                       size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < depth && n + 1 < cap; i++) {
        int w;
        if (st[i].is_obj) {
            size_t kl = st[i].key_len < KEY_SHOW ? st[i].key_len : KEY_SHOW;
            w = snprintf(out + n, cap - n, "%s%.*s", i ? "." : "", (int)kl,
                         body + st[i].key_off);
        } else {
            w = snprintf(out + n, cap - n, "[%ld]", st[i].index);
        }
        if (w < 0) break;
        n += (size_t)w < cap - n ? (size_t)w : cap - n - 1;
    }
    if (out[0] == '\0') snprintf(out, cap, "the request body");
}

/* End of the string whose opening quote is at i; *nul set when it holds a
 * NUL. Returns the index of the closing quote (or len). */
static size_t scan_string(const char *body, size_t len, size_t i, int *nul) {
    size_t j = i + 1;
    while (j < len && body[j] != '"') {
        if (body[j] == '\\' && j + 1 < len) {
            if (body[j + 1] == 'u' && j + 5 < len && memcmp(body + j + 2, "0000", 4) == 0)
                *nul = 1;
            j += body[j + 1] == 'u' ? 6 : 2;
        } else {
            if (body[j] == '\0') *nul = 1;
            j++;
        }
    }
    return j;
}

static int raw_scan(const char *body, size_t len, const char *fields, api_error *e) {
    frame *st = malloc(1100 * sizeof *st); /* cJSON nests at most 1000 deep */
    if (!st) return api_error_set(e, 500, NULL, NULL, "out of memory");
    int depth = 0, rc = 0;
    for (size_t i = 0; i < len && rc == 0; i++) {
        unsigned char c = (unsigned char)body[i];
        frame *top = depth ? &st[depth - 1] : NULL;
        if (c == '"') {
            int nul = 0, is_key = top && top->is_obj && top->expect_key;
            size_t end = scan_string(body, len, i, &nul);
            if (is_key) {
                top->key_off = i + 1;
                top->key_len = end - (i + 1);
            }
            if (nul) {
                char path[PATH_CAP];
                frame_path(body, st, depth, path, sizeof path);
                const char *param =
                    depth && st[0].is_obj
                        ? known(fields, body + st[0].key_off, st[0].key_len)
                        : NULL;
                rc = api_error_set(e, 400, param, "invalid_value",
                                   "%s%s contains a NUL character (\\u0000), which is "
                                   "not allowed",
                                   is_key ? "a key of " : "", path);
            }
            i = end;
        } else if (c == '{' || c == '[') {
            if (depth == 1100) break; /* cannot happen after cJSON */
            st[depth++] = (frame){ .is_obj = c == '{', .expect_key = c == '{' };
        } else if (c == '}' || c == ']') {
            if (depth) depth--;
        } else if (c == ',' && top) {
            if (top->is_obj)
                top->expect_key = 1;
            else
                top->index++;
        } else if (c == ':' && top) {
            top->expect_key = 0;
        } else if (c < 0x20 && !is_ws(c)) {
            rc = api_error_set(e, 400, NULL, "invalid_json",
                               "control character 0x%02x outside a string (byte %zu)", c,
                               i);
        }
    }
    free(st);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Duplicate keys (cJSON keeps every member, in order)                        */
/* ------------------------------------------------------------------------- */
static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key that appears twice among obj's members, or NULL. */
static const char *dup_in(const cJSON *obj, int *oom) {
    int n = 0;
    const cJSON *c;
    for (c = obj->child; c; c = c->next) n++;
    if (n < 2) return NULL;
    if (n <= 8) {
        for (const cJSON *a = obj->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (a->string && b->string && strcmp(a->string, b->string) == 0)
                    return a->string;
        return NULL;
    }
    const char **names = malloc((size_t)n * sizeof *names);
    if (!names) {
        *oom = 1;
        return NULL;
    }
    int k = 0;
    for (c = obj->child; c; c = c->next)
        if (c->string) names[k++] = c->string;
    qsort(names, (size_t)k, sizeof *names, cmp_name);
    const char *dup = NULL;
    for (int i = 1; i < k && !dup; i++)
        if (strcmp(names[i - 1], names[i]) == 0) dup = names[i];
    free(names);
    return dup;
}

typedef struct dup_walk {
    const char *fields;
    const char *top; /* the top-level key of the current path */
    char path[PATH_CAP];
    size_t plen;
    api_error *e;
} dup_walk;

static int walk(dup_walk *w, const cJSON *x, int depth) {
    if (!cJSON_IsObject(x) && !cJSON_IsArray(x)) return 0;
    int oom = 0;
    const char *d = cJSON_IsObject(x) ? dup_in(x, &oom) : NULL;
    if (oom) return api_error_set(w->e, 500, NULL, NULL, "out of memory");
    if (d) {
        const char *param =
            depth == 0 ? known(w->fields, d, strlen(d))
                       : (w->top ? known(w->fields, w->top, strlen(w->top)) : NULL);
        return api_error_set(w->e, 400, param, "duplicate_key",
                             "duplicate key '%.*s' in %s", KEY_SHOW, d,
                             w->plen ? w->path : "the request body");
    }
    long i = 0;
    for (const cJSON *c = x->child; c; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue; /* nothing inside */
        size_t saved = w->plen;
        int n = cJSON_IsObject(x)
                    ? snprintf(w->path + saved, PATH_CAP - saved, "%s%.*s",
                               saved ? "." : "", KEY_SHOW, c->string ? c->string : "")
                    : snprintf(w->path + saved, PATH_CAP - saved, "[%ld]", i);
        if (n > 0)
            w->plen = saved + (size_t)n < PATH_CAP ? saved + (size_t)n : PATH_CAP - 1;
        if (depth == 0) w->top = cJSON_IsObject(x) ? c->string : NULL;
        int rc = walk(w, c, depth + 1);
        w->plen = saved;
        w->path[saved] = '\0';
        if (rc) return rc;
    }
    return 0;
}

int json_strict_check(const char *body, size_t len, size_t parsed, const cJSON *root,
                      const char *fields, api_error *e) {
    size_t i = parsed;
    while (i < len && is_ws((unsigned char)body[i])) i++;
    if (i < len)
        return api_error_set(e, 400, NULL, "invalid_json",
                             "unexpected data after the JSON value (byte %zu)", i);
    if (raw_scan(body, parsed, fields, e)) return -1;
    dup_walk w = { .fields = fields, .e = e };
    return walk(&w, root, 0);
}
