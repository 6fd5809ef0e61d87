/*
 * json_schema.c - JSON Schema subset -> regex of compact JSON texts. See
 * json_schema.h.
 */
#include "orchestrator/serve/json_schema.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"
#include "orchestrator/serve/regex_dfa.h"

#define PATH_MAX_LEN 384
#define INT_LIMIT    1e15       /* integer bounds beyond this are refused */
#define MAX_REGEX    (8u << 20) /* bytes of regex one schema may become */

typedef struct ctx {
    const cJSON *root;
    strbuf *out;
    char *err;
    size_t err_cap;
    int failed;
    int ref_depth;
} ctx;

static int fail(ctx *c, const char *path, const char *fmt, ...) {
    if (!c->failed) {
        char msg[300];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        util_set_err(c->err, c->err_cap, "%s: %s", path, msg);
    }
    c->failed = 1;
    return -1;
}

/* A JSON path into dst (PATH_MAX_LEN bytes, truncated to fit). */
static void pathf(char *dst, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pathf(char *dst, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, PATH_MAX_LEN, fmt, ap);
    va_end(ap);
}

static void sub_path(char *dst, const char *path, const char *key) {
    pathf(dst, "%s.%s", path, key);
}

void json_schema_regex_literal(strbuf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (strchr("\\^$.|?*+()[]{}/-", ch) && ch) strbuf_put(out, "\\", 1);
        strbuf_put(out, &ch, 1);
    }
}

/* ------------------------------------------------------------------------- */
/* Leaves                                                                     */
/* ------------------------------------------------------------------------- */
static const char RE_NUMBER[] = "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";
static const char RE_INTEGER[] = "-?(?:0|[1-9][0-9]*)";
static const char RE_STRING[] = "\"(?J:[\\s\\S]*)\"";

static void any_value(strbuf *o, int depth);

static void any_object(strbuf *o, int depth) {
    strbuf_puts(o, "\\{(?:");
    strbuf_puts(o, RE_STRING);
    strbuf_puts(o, ":");
    any_value(o, depth - 1);
    strbuf_puts(o, "(?:,");
    strbuf_puts(o, RE_STRING);
    strbuf_puts(o, ":");
    any_value(o, depth - 1);
    strbuf_puts(o, ")*)?\\}");
}

static void any_array(strbuf *o, int depth) {
    strbuf_puts(o, "\\[(?:");
    any_value(o, depth - 1);
    strbuf_puts(o, "(?:,");
    any_value(o, depth - 1);
    strbuf_puts(o, ")*)?\\]");
}

/* Any JSON value with at most depth levels of containers. */
static void any_value(strbuf *o, int depth) {
    strbuf_puts(o, "(?:");
    strbuf_puts(o, RE_STRING);
    strbuf_puts(o, "|");
    strbuf_puts(o, RE_NUMBER);
    strbuf_puts(o, "|true|false|null");
    if (depth > 0) {
        strbuf_puts(o, "|");
        any_object(o, depth);
        strbuf_puts(o, "|");
        any_array(o, depth);
    }
    strbuf_puts(o, ")");
}

void json_schema_any_object(strbuf *out) { any_object(out, JSON_SCHEMA_ANY_DEPTH); }

/* One JSON value as a literal (enum / const). */
static int literal_value(ctx *c, const cJSON *v, const char *path) {
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt) return fail(c, path, "out of memory");
    json_schema_regex_literal(c->out, txt, strlen(txt));
    cJSON_free(txt);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Integer ranges                                                             */
/* ------------------------------------------------------------------------- */
/* Same-length decimal strings lo <= hi: a regex of the numbers between. */
static void digits_range(strbuf *o, const char *lo, const char *hi, size_t n) {
    if (n == 0) return;
    if (n == 1) {
        if (lo[0] == hi[0])
            strbuf_put(o, lo, 1);
        else
            strbuf_printf(o, "[%c-%c]", lo[0], hi[0]);
        return;
    }
    if (lo[0] == hi[0]) {
        strbuf_put(o, lo, 1);
        digits_range(o, lo + 1, hi + 1, n - 1);
        return;
    }
    int lo_zero = 1, hi_nine = 1;
    for (size_t i = 1; i < n; i++) {
        lo_zero &= lo[i] == '0';
        hi_nine &= hi[i] == '9';
    }
    if (lo_zero && hi_nine) {
        strbuf_printf(o, "[%c-%c][0-9]{%zu}", lo[0], hi[0], n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', n);
    memset(zeros, '0', n);
    strbuf_puts(o, "(?:");
    strbuf_put(o, lo, 1);
    digits_range(o, lo + 1, nines, n - 1);
    if (hi[0] - lo[0] > 1)
        strbuf_printf(o, "|[%c-%c][0-9]{%zu}", lo[0] + 1, hi[0] - 1, n - 1);
    strbuf_puts(o, "|");
    strbuf_put(o, hi, 1);
    digits_range(o, zeros, hi + 1, n - 1);
    strbuf_puts(o, ")");
}

/* Non-negative integers in [a, b] (b < 0: unbounded), no leading zeros. */
static void nonneg_range(strbuf *o, int64_t a, int64_t b) {
    char la[24], lb[24];
    int na = snprintf(la, sizeof la, "%" PRId64, a);
    int first = 1;
    strbuf_puts(o, "(?:");
    int nb = b >= 0 ? snprintf(lb, sizeof lb, "%" PRId64, b) : na;
    for (int len = na; len <= nb; len++) {
        int64_t pow = 1;
        for (int k = 1; k < len; k++) pow *= 10;
        int64_t lo = len == 1 ? 0 : pow, hi = pow * 10 - 1;
        if (lo < a) lo = a;
        if (b >= 0 && hi > b) hi = b;
        if (lo > hi) continue;
        char s1[24], s2[24];
        snprintf(s1, sizeof s1, "%" PRId64, lo);
        snprintf(s2, sizeof s2, "%" PRId64, hi);
        if (!first) strbuf_puts(o, "|");
        first = 0;
        digits_range(o, s1, s2, (size_t)len);
    }
    if (b < 0) { /* every longer number */
        if (!first) strbuf_puts(o, "|");
        strbuf_printf(o, "[1-9][0-9]{%d,}", na);
    }
    strbuf_puts(o, ")");
}

/* Integers in [lo, hi] (has_lo / has_hi: bounded on that side). */
static void int_range(strbuf *o, int has_lo, int64_t lo, int has_hi, int64_t hi) {
    strbuf_puts(o, "(?:");
    int any = 0;
    if (!has_lo || lo < 0) { /* negatives: -m for m in [max(1,-hi), -lo] */
        int64_t mlo = has_hi && hi < 0 ? -hi : 1;
        strbuf_puts(o, "-");
        nonneg_range(o, mlo, has_lo ? -lo : -1);
        any = 1;
    }
    if (!has_hi || hi >= 0) {
        if (any) strbuf_puts(o, "|");
        nonneg_range(o, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    strbuf_puts(o, ")");
}

/* ------------------------------------------------------------------------- */
/* Schemas                                                                    */
/* ------------------------------------------------------------------------- */
static int gen(ctx *c, const cJSON *s, const char *path);

static const char *const ANNOTATIONS[] = { "title",     "description", "default",
                                           "examples",  "$schema",     "$id",
                                           "$comment",  "deprecated",  "readOnly",
                                           "writeOnly", NULL };
static const char *const KEYWORDS[] = { "type",
                                        "properties",
                                        "required",
                                        "additionalProperties",
                                        "enum",
                                        "const",
                                        "items",
                                        "minItems",
                                        "maxItems",
                                        "minLength",
                                        "maxLength",
                                        "pattern",
                                        "minimum",
                                        "maximum",
                                        "exclusiveMinimum",
                                        "exclusiveMaximum",
                                        "anyOf",
                                        "$ref",
                                        "$defs",
                                        "definitions",
                                        "uniqueItems",
                                        NULL };

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (strcmp(*l, k) == 0) return 1;
    return 0;
}

/* A non-negative integer keyword; -1 when absent. */
static int count_kw(ctx *c, const cJSON *s, const char *k, const char *path, int64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    *v = -1;
    if (!x) return 0;
    char p[PATH_MAX_LEN];
    sub_path(p, path, k);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 ||
        x->valuedouble != floor(x->valuedouble))
        return fail(c, p, "must be a non-negative integer");
    if (x->valuedouble > REGEX_MAX_REPEAT)
        return fail(c, p, "values over %u are not supported", REGEX_MAX_REPEAT);
    *v = (int64_t)x->valuedouble;
    return 0;
}

enum {
    T_OBJECT = 1,
    T_ARRAY = 2,
    T_STRING = 4,
    T_NUMBER = 8,
    T_INTEGER = 16,
    T_BOOLEAN = 32,
    T_NULL = 64
};

static int type_bit(const char *t) {
    static const char *const names[] = { "object",  "array",   "string", "number",
                                         "integer", "boolean", "null" };
    for (int i = 0; i < 7; i++)
        if (strcmp(t, names[i]) == 0) return 1 << i;
    return 0;
}

static int gen_string(ctx *c, const cJSON *s, const char *path) {
    int64_t mn, mx;
    if (count_kw(c, s, "minLength", path, &mn) || count_kw(c, s, "maxLength", path, &mx))
        return -1;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    if (pat) {
        char p[PATH_MAX_LEN];
        sub_path(p, path, "pattern");
        if (!cJSON_IsString(pat)) return fail(c, p, "must be a string");
        if (mn >= 0 || mx >= 0)
            return fail(c, p,
                        "'pattern' together with minLength/maxLength is not supported");
        const char *r = pat->valuestring;
        size_t n = strlen(r);
        if (n && r[0] == '^') {
            r++;
            n--;
        }
        if (n && r[n - 1] == '$') {
            size_t bs = 0;
            while (bs + 1 < n && r[n - 2 - bs] == '\\') bs++;
            if (bs % 2 == 0) n--;
        }
        char e[256];
        if (regex_syntax_check(r, n, e, sizeof e) != 0) return fail(c, p, "%s", e);
        strbuf_puts(c->out, "\"(?J:(?:");
        strbuf_put(c->out, r, n);
        strbuf_puts(c->out, "))\"");
        return 0;
    }
    if (mn < 0 && mx < 0) {
        strbuf_puts(c->out, RE_STRING);
        return 0;
    }
    if (mx >= 0 && mn > mx) return fail(c, path, "minLength is over maxLength");
    strbuf_printf(c->out, "\"(?J:[\\s\\S]{%" PRId64 ",", mn < 0 ? 0 : mn);
    if (mx >= 0) strbuf_printf(c->out, "%" PRId64, mx);
    strbuf_puts(c->out, "})\"");
    return 0;
}

static int int_bound(ctx *c, const cJSON *s, const char *k, const char *path, int *has,
                     double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    *has = 0;
    if (!x) return 0;
    char p[PATH_MAX_LEN];
    sub_path(p, path, k);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
        return fail(c, p, "must be a number");
    if (fabs(x->valuedouble) > INT_LIMIT)
        return fail(c, p, "bounds beyond +-1e15 are not supported");
    *has = 1;
    *v = x->valuedouble;
    return 0;
}

static int gen_integer(ctx *c, const cJSON *s, const char *path) {
    int hmn, hmx, hxmn, hxmx;
    double mn = 0, mx = 0, xmn = 0, xmx = 0;
    if (int_bound(c, s, "minimum", path, &hmn, &mn) ||
        int_bound(c, s, "maximum", path, &hmx, &mx) ||
        int_bound(c, s, "exclusiveMinimum", path, &hxmn, &xmn) ||
        int_bound(c, s, "exclusiveMaximum", path, &hxmx, &xmx))
        return -1;
    int has_lo = hmn || hxmn, has_hi = hmx || hxmx;
    if (!has_lo && !has_hi) {
        strbuf_puts(c->out, RE_INTEGER);
        return 0;
    }
    double lo = -INFINITY, hi = INFINITY;
    if (hmn) lo = ceil(mn);
    if (hxmn && floor(xmn) + 1 > lo) lo = floor(xmn) + 1;
    if (hmx) hi = floor(mx);
    if (hxmx && ceil(xmx) - 1 < hi) hi = ceil(xmx) - 1;
    if (has_lo && has_hi && lo > hi)
        return fail(c, path, "no integer is within the bounds");
    int_range(c->out, has_lo, has_lo ? (int64_t)lo : 0, has_hi, has_hi ? (int64_t)hi : 0);
    return 0;
}

static int gen_array(ctx *c, const cJSON *s, const char *path) {
    int64_t mn, mx;
    if (count_kw(c, s, "minItems", path, &mn) || count_kw(c, s, "maxItems", path, &mx))
        return -1;
    if (mn < 0) mn = 0;
    if (mx >= 0 && mn > mx) return fail(c, path, "minItems is over maxItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    char p[PATH_MAX_LEN];
    sub_path(p, path, "items");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return fail(c, p, "must be a schema object (tuple 'items' is not supported)");
    if (cJSON_IsFalse(items) && mn > 0)
        return fail(c, p, "false with minItems > 0 admits nothing");
    if (mx == 0 || cJSON_IsFalse(items)) {
        strbuf_puts(c->out, "\\[\\]");
        return 0;
    }
    /* the item regex, once, then copied */
    strbuf item = { 0 };
    strbuf *saved = c->out;
    c->out = &item;
    if (items && cJSON_IsObject(items))
        gen(c, items, p);
    else
        any_value(&item, JSON_SCHEMA_ANY_DEPTH - 1);
    c->out = saved;
    if (c->failed || item.oom) {
        strbuf_free(&item);
        return c->failed ? -1 : fail(c, path, "out of memory");
    }
    strbuf *o = c->out;
    if (mn == 0)
        strbuf_puts(o, "\\[(?:");
    else
        strbuf_puts(o, "\\[");
    strbuf_put(o, item.p, item.len);
    strbuf_puts(o, "(?:,");
    strbuf_put(o, item.p, item.len);
    int64_t rmin = mn > 0 ? mn - 1 : 0;
    if (mx < 0)
        strbuf_printf(o, "){%" PRId64 ",}", rmin);
    else
        strbuf_printf(o, "){%" PRId64 ",%" PRId64 "}", rmin, mx - 1);
    strbuf_puts(o, mn == 0 ? ")?\\]" : "\\]");
    strbuf_free(&item);
    return 0;
}

typedef struct prop {
    strbuf re; /* "key":VALUE */
    int required;
} prop;

/* Properties i.. when none was written yet (first) or after one. */
static void props_seq(strbuf *o, const prop *ps, int n, int i, int first) {
    if (i == n || o->len > MAX_REGEX) return;
    if (!first) {
        for (int k = i; k < n; k++) {
            if (!ps[k].required) strbuf_puts(o, "(?:");
            strbuf_puts(o, ",");
            strbuf_put(o, ps[k].re.p, ps[k].re.len);
            if (!ps[k].required) strbuf_puts(o, ")?");
        }
        return;
    }
    if (ps[i].required) {
        strbuf_put(o, ps[i].re.p, ps[i].re.len);
        props_seq(o, ps, n, i + 1, 0);
        return;
    }
    strbuf_puts(o, "(?:");
    strbuf_put(o, ps[i].re.p, ps[i].re.len);
    props_seq(o, ps, n, i + 1, 0);
    strbuf_puts(o, "|");
    props_seq(o, ps, n, i + 1, 1);
    strbuf_puts(o, ")");
}

static int gen_object(ctx *c, const cJSON *s, const char *path) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char p[PATH_MAX_LEN];
    if (props && !cJSON_IsObject(props)) {
        sub_path(p, path, "properties");
        return fail(c, p, "must be an object");
    }
    if (req && !cJSON_IsArray(req)) {
        sub_path(p, path, "required");
        return fail(c, p, "must be an array of strings");
    }
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add)) {
        sub_path(p, path, "additionalProperties");
        return fail(c, p, "must be a boolean or a schema");
    }
    const cJSON *r;
    int ri = 0;
    cJSON_ArrayForEach(r, req) {
        pathf(p, "%s.required[%d]", path, ri++);
        if (!cJSON_IsString(r)) return fail(c, p, "must be a string");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return fail(c, p,
                        "required property '%s' without a 'properties' entry is not "
                        "supported",
                        r->valuestring);
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    strbuf *o = c->out;
    if (n == 0) {
        if (cJSON_IsFalse(add)) {
            strbuf_puts(o, "\\{\\}");
            return 0;
        }
        if (cJSON_IsObject(add)) {
            sub_path(p, path, "additionalProperties");
            strbuf_puts(o, "\\{(?:");
            for (int k = 0; k < 2 && !c->failed; k++) {
                if (k) strbuf_puts(o, "(?:,");
                strbuf_puts(o, RE_STRING);
                strbuf_puts(o, ":");
                gen(c, add, p);
            }
            strbuf_puts(o, ")*)?\\}");
            return c->failed ? -1 : 0;
        }
        any_object(o, JSON_SCHEMA_ANY_DEPTH);
        return 0;
    }
    prop *ps = util_calloc((size_t)n, sizeof *ps);
    if (!ps) return fail(c, path, "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, props) {
        char pp[PATH_MAX_LEN];
        pathf(pp, "%s.properties.%s", path, it->string);
        ps[i].required = 0;
        cJSON_ArrayForEach(r, req) if (strcmp(r->valuestring, it->string) == 0) ps[i]
            .required = 1;
        cJSON *ref = cJSON_CreateStringReference(it->string);
        char *key = ref ? cJSON_PrintUnformatted(ref) : NULL;
        cJSON_Delete(ref);
        if (!key) {
            fail(c, pp, "out of memory");
            break;
        }
        json_schema_regex_literal(&ps[i].re, key, strlen(key));
        cJSON_free(key);
        strbuf_puts(&ps[i].re, ":");
        if (!cJSON_IsObject(it) && !cJSON_IsBool(it)) {
            fail(c, pp, "must be a schema object");
            break;
        }
        c->out = &ps[i].re;
        if (cJSON_IsFalse(it)) {
            fail(c, pp, "a property schema of false is not supported");
        } else if (cJSON_IsTrue(it)) {
            any_value(&ps[i].re, JSON_SCHEMA_ANY_DEPTH - 1);
        } else {
            gen(c, it, pp);
        }
        c->out = o;
        if (c->failed) break;
        i++;
    }
    if (!c->failed) {
        strbuf_puts(o, "\\{");
        props_seq(o, ps, n, 0, 1);
        strbuf_puts(o, "\\}");
    }
    for (int k = 0; k < n; k++) strbuf_free(&ps[k].re);
    free(ps);
    return c->failed ? -1 : 0;
}

/* "#", "#/$defs/X", "#/definitions/X" -> the schema. */
static const cJSON *resolve_ref(ctx *c, const char *ref, const char *path) {
    if (strcmp(ref, "#") == 0) return c->root;
    const char *name = NULL, *container = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) {
        container = "$defs";
        name = ref + 8;
    } else if (strncmp(ref, "#/definitions/", 14) == 0) {
        container = "definitions";
        name = ref + 14;
    }
    if (!name || !*name || strchr(name, '/') || strchr(name, '~')) {
        fail(c, path,
             "only local references '#', '#/$defs/NAME' and '#/definitions/NAME' are "
             "supported, got '%.100s'",
             ref);
        return NULL;
    }
    const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->root, container);
    const cJSON *t = defs ? cJSON_GetObjectItemCaseSensitive(defs, name) : NULL;
    if (!t || !cJSON_IsObject(t)) {
        fail(c, path, "'%.100s' does not name a schema", ref);
        return NULL;
    }
    return t;
}

static int gen_typed(ctx *c, const cJSON *s, int bit, const char *path) {
    switch (bit) {
    case T_OBJECT: return gen_object(c, s, path);
    case T_ARRAY: return gen_array(c, s, path);
    case T_STRING: return gen_string(c, s, path);
    case T_NUMBER:
        if (cJSON_GetObjectItemCaseSensitive(s, "minimum") ||
            cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
            cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") ||
            cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum"))
            return fail(c, path, "minimum/maximum are only supported on type integer");
        strbuf_puts(c->out, RE_NUMBER);
        return 0;
    case T_INTEGER: return gen_integer(c, s, path);
    case T_BOOLEAN: strbuf_puts(c->out, "(?:true|false)"); return 0;
    default: strbuf_puts(c->out, "null"); return 0;
    }
}

static int gen(ctx *c, const cJSON *s, const char *path) {
    if (c->failed) return -1;
    if (c->out->len > MAX_REGEX)
        return fail(c, path,
                    "the schema is too large to compile (over %u bytes of grammar)",
                    MAX_REGEX);
    if (cJSON_IsTrue(s)) {
        any_value(c->out, JSON_SCHEMA_ANY_DEPTH);
        return 0;
    }
    if (!cJSON_IsObject(s)) return fail(c, path, "a schema must be an object");
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (in_list(ANNOTATIONS, k->string)) continue;
        if (!in_list(KEYWORDS, k->string))
            return fail(c, path, "the keyword '%.64s' is not supported", k->string);
        if (strcmp(k->string, "uniqueItems") == 0 && !cJSON_IsFalse(k))
            return fail(c, path, "the keyword 'uniqueItems' is only supported as false");
        if ((strcmp(k->string, "$defs") == 0 || strcmp(k->string, "definitions") == 0) &&
            s != c->root)
            return fail(c, path, "'%s' is only supported at the root", k->string);
    }
    char p[PATH_MAX_LEN];
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    int kinds = !!ref + !!en + !!cn + !!any;
    if (kinds > 1 || (kinds == 1 && type && !en && !cn))
        return fail(c, path,
                    "combining $ref, enum, const, anyOf (or $ref/anyOf with type) in one "
                    "schema is not supported");
    if (ref) {
        sub_path(p, path, "$ref");
        if (!cJSON_IsString(ref)) return fail(c, p, "must be a string");
        const cJSON *t = resolve_ref(c, ref->valuestring, p);
        if (!t) return -1;
        if (c->ref_depth >= JSON_SCHEMA_REF_DEPTH) {
            strbuf_puts(c->out, "[^\\s\\S]"); /* matches nothing: the depth bound */
            return 0;
        }
        c->ref_depth++;
        char rp[PATH_MAX_LEN];
        pathf(rp, "%s(%s)", p, ref->valuestring);
        int rc = gen(c, t, rp);
        c->ref_depth--;
        return rc;
    }
    if (en || cn) {
        sub_path(p, path, en ? "enum" : "const");
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0))
            return fail(c, p, "must be a non-empty array");
        strbuf_puts(c->out, "(?:");
        if (cn) {
            if (literal_value(c, cn, p)) return -1;
            strbuf_puts(c->out, ")");
            return 0;
        }
        const cJSON *v;
        int first = 1;
        cJSON_ArrayForEach(v, en) {
            if (!first) strbuf_puts(c->out, "|");
            first = 0;
            if (literal_value(c, v, p)) return -1;
        }
        strbuf_puts(c->out, ")");
        return 0;
    }
    if (any) {
        sub_path(p, path, "anyOf");
        if (!cJSON_IsArray(any) || cJSON_GetArraySize(any) == 0)
            return fail(c, p, "must be a non-empty array of schemas");
        strbuf_puts(c->out, "(?:");
        const cJSON *v;
        int i = 0;
        cJSON_ArrayForEach(v, any) {
            char ip[PATH_MAX_LEN];
            pathf(ip, "%s[%d]", p, i);
            if (i++) strbuf_puts(c->out, "|");
            if (gen(c, v, ip)) return -1;
        }
        strbuf_puts(c->out, ")");
        return 0;
    }
    int bits = 0;
    sub_path(p, path, "type");
    if (cJSON_IsString(type)) {
        bits = type_bit(type->valuestring);
        if (!bits) return fail(c, p, "unknown type '%.64s'", type->valuestring);
    } else if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0) {
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            int b = cJSON_IsString(t) ? type_bit(t->valuestring) : 0;
            if (!b) return fail(c, p, "must be a type name or a list of type names");
            bits |= b;
        }
    } else if (type) {
        return fail(c, p, "must be a type name or a list of type names");
    }
    if (!bits) {
        /* no type: only annotations (and $defs) may be there */
        cJSON_ArrayForEach(k, s) {
            if (in_list(ANNOTATIONS, k->string) || strcmp(k->string, "$defs") == 0 ||
                strcmp(k->string, "definitions") == 0)
                continue;
            return fail(c, path, "'%.64s' needs a 'type' in this schema", k->string);
        }
        any_value(c->out, JSON_SCHEMA_ANY_DEPTH);
        return 0;
    }
    if ((bits & T_NUMBER) && (bits & T_INTEGER)) bits &= ~T_INTEGER;
    strbuf_puts(c->out, "(?:");
    int first = 1;
    for (int b = 1; b <= T_NULL; b <<= 1) {
        if (!(bits & b)) continue;
        if (!first) strbuf_puts(c->out, "|");
        first = 0;
        if (gen_typed(c, s, b, path)) return -1;
    }
    strbuf_puts(c->out, ")");
    return 0;
}

int json_schema_to_regex(const cJSON *schema, const char *path, strbuf *out, char *err,
                         size_t err_cap) {
    ctx c = { .root = schema, .out = out, .err = err, .err_cap = err_cap };
    if (gen(&c, schema, path)) return -1;
    if (out->len > MAX_REGEX) {
        util_set_err(err, err_cap,
                     "%s: the schema is too large to compile (over %u bytes of grammar)",
                     path, MAX_REGEX);
        return -1;
    }
    if (out->oom) {
        util_set_err(err, err_cap, "%s: out of memory", path);
        return -1;
    }
    return 0;
}
