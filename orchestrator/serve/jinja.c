/*
 * jinja.c - a Jinja subset interpreter for chat templates: a lexer that
 * applies trim_blocks / lstrip_blocks and the -/+ modifiers, a recursive
 * descent parser into a tree, and a tree-walking renderer over values kept
 * in an arena. Errors unwind with longjmp to the entry point, which frees
 * the arena. See jinja.h.
 */
#include "orchestrator/serve/jinja.h"

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/core/util.h"

#define MAX_DEPTH  200                 /* nesting of expressions, statements and calls */
#define MAX_OUTPUT ((size_t)64 << 20)  /* rendered bytes */
#define MAX_ITEMS  (1u << 20)          /* elements of one list made at render time */
#define MAX_MEMORY ((size_t)256 << 20) /* arena bytes of one parse or render */
#define MAX_STEPS  10000000ull         /* expressions and statements of one render */

/* ------------------------------------------------------------------------- */
/* Arena and errors                                                           */
/* ------------------------------------------------------------------------- */
typedef struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    max_align_t data[];
} arena_blk;

typedef struct fail_ctx {
    jmp_buf jb;
    char msg[512];
} fail_ctx;

typedef struct arena {
    arena_blk *head;
    fail_ctx *fail;
    size_t total; /* bytes of all blocks */
} arena;

static void fail(fail_ctx *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)))
__attribute__((noreturn));
static void fail(fail_ctx *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
    longjmp(f->jb, 1);
}

static void *ar_alloc(arena *a, size_t n) {
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!a->head || a->head->used + n > a->head->cap) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > MAX_MEMORY)
            fail(a->fail, "the template needs more than %zu MiB", MAX_MEMORY >> 20);
        a->total += cap;
        arena_blk *b = malloc(sizeof *b + cap);
        if (!b) fail(a->fail, "out of memory");
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

static void ar_free(arena *a) {
    while (a->head) {
        arena_blk *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}

static char *ar_strndup(arena *a, const char *s, size_t n) {
    char *p = ar_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ------------------------------------------------------------------------- */
/* Values                                                                     */
/* ------------------------------------------------------------------------- */
enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_STR, V_LIST, V_DICT, V_FUNC, V_METHOD };
enum { F_NAMESPACE = 1, F_RAISE, F_RANGE, F_STRFTIME };

typedef struct val val;
typedef struct jlist jlist;
typedef struct jdict jdict;

struct val {
    int t;
    int64_t i;     /* BOOL, INT, FUNC id */
    const char *s; /* STR (n bytes), METHOD name */
    size_t n;
    jlist *l;
    jdict *d;
    const val *recv; /* METHOD: the object */
};

struct jlist {
    val *it;
    size_t n;
};

struct jdict {
    const char **k;
    size_t *kn;
    val *v;
    size_t n, cap;
    int ns; /* a namespace() */
};

static const val UNDEF = { .t = V_UNDEF };
static const val NONE = { .t = V_NONE };

static val v_bool(int b) { return (val){ .t = V_BOOL, .i = b != 0 }; }
static val v_int(int64_t i) { return (val){ .t = V_INT, .i = i }; }
static val v_str(const char *s, size_t n) { return (val){ .t = V_STR, .s = s, .n = n }; }

static const char *type_name(const val *v) {
    static const char *const names[] = { "undefined", "none", "bool",     "int",   "str",
                                         "list",      "dict", "function", "method" };
    if (v->t == V_DICT && v->d->ns) return "namespace";
    return names[v->t];
}

static jlist *list_new(arena *a, size_t n) {
    if (n > MAX_ITEMS) fail(a->fail, "a list of %zu items is over the limit", n);
    jlist *l = ar_alloc(a, sizeof *l);
    l->it = ar_alloc(a, (n ? n : 1) * sizeof *l->it);
    l->n = n;
    return l;
}

static jdict *dict_new(arena *a) { return ar_alloc(a, sizeof(jdict)); }

static val *dict_find(const jdict *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (d->kn[i] == kn && memcmp(d->k[i], k, kn) == 0) return &d->v[i];
    return NULL;
}

static void dict_set(arena *a, jdict *d, const char *k, size_t kn, val v) {
    val *p = dict_find(d, k, kn);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        const char **nk = ar_alloc(a, cap * sizeof *nk);
        size_t *nkn = ar_alloc(a, cap * sizeof *nkn);
        val *nv = ar_alloc(a, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nkn, d->kn, d->n * sizeof *nkn);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->kn = nkn;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->kn[d->n] = kn;
    d->v[d->n] = v;
    d->n++;
}

static val from_json(arena *a, const cJSON *j) {
    if (!j || cJSON_IsNull(j)) return NONE;
    if (cJSON_IsBool(j)) return v_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d != (double)(int64_t)d)
            fail(a->fail, "the number %.17g is not an integer", d);
        return v_int((int64_t)d);
    }
    if (cJSON_IsString(j)) return v_str(j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        jlist *l = list_new(a, (size_t)cJSON_GetArraySize(j));
        size_t i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (i < l->n) l->it[i++] = from_json(a, it);
        }
        return (val){ .t = V_LIST, .l = l };
    }
    jdict *d = dict_new(a);
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        dict_set(a, d, it->string, strlen(it->string), from_json(a, it));
    }
    return (val){ .t = V_DICT, .d = d };
}

/* ------------------------------------------------------------------------- */
/* UTF-8 and Python's white space                                             */
/* ------------------------------------------------------------------------- */
/* Length of the UTF-8 sequence at s (1 for a stray byte). */
static size_t u8_len(const unsigned char *s, size_t n) {
    size_t k = s[0] < 0xc0 ? 1 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : 4;
    if (k > n) return 1;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 1;
    return k;
}

static unsigned u8_cp(const unsigned char *s, size_t k) {
    if (k == 1) return s[0];
    unsigned cp = s[0] & (0x7f >> k);
    for (size_t i = 1; i < k; i++) cp = (cp << 6) | (s[i] & 0x3f);
    return cp;
}

static int py_space(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Code point offsets of s: off[0..*count], off[*count] = n. */
static size_t *cp_offsets(arena *a, const char *s, size_t n, size_t *count) {
    size_t *off = ar_alloc(a, (n + 1) * sizeof *off), c = 0;
    for (size_t i = 0; i < n;) {
        off[c++] = i;
        i += u8_len((const unsigned char *)s + i, n - i);
    }
    off[c] = n;
    *count = c;
    return off;
}

/* Does the code point at s (k bytes) belong to the set chars (NULL = white
 * space)? */
static int in_set(const char *s, size_t k, const val *chars) {
    if (!chars) return py_space(u8_cp((const unsigned char *)s, k));
    for (size_t i = 0; i < chars->n;) {
        size_t ck = u8_len((const unsigned char *)chars->s + i, chars->n - i);
        if (ck == k && memcmp(chars->s + i, s, k) == 0) return 1;
        i += ck;
    }
    return 0;
}

/* str.strip / lstrip / rstrip (which: 1 left, 2 right, 3 both). */
static val py_strip(arena *a, val s, const val *chars, int which) {
    size_t c, *off = cp_offsets(a, s.s, s.n, &c), lo = 0, hi = c;
    if (which & 1)
        while (lo < hi && in_set(s.s + off[lo], off[lo + 1] - off[lo], chars)) lo++;
    if (which & 2)
        while (hi > lo && in_set(s.s + off[hi - 1], off[hi] - off[hi - 1], chars)) hi--;
    return v_str(s.s + off[lo], off[hi] - off[lo]);
}

/* ------------------------------------------------------------------------- */
/* The tree                                                                   */
/* ------------------------------------------------------------------------- */
enum {
    E_LIT,
    E_VAR,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_BIN,
    E_AND,
    E_OR,
    E_COND,
    E_LIST,
    E_DICT
};
enum {
    B_ADD,
    B_SUB,
    B_MUL,
    B_FLOORDIV,
    B_MOD,
    B_CAT,
    B_EQ,
    B_NE,
    B_LT,
    B_GT,
    B_LE,
    B_GE,
    B_IN
};

typedef struct expr expr;
struct expr {
    int op, line;
    int bop, negate; /* E_BIN operator; E_TEST / B_IN: "not" */
    val lit;
    const char *name; /* VAR, ATTR, FILTER, TEST */
    size_t nn;
    expr *a, *b, *c, *d;
    expr **args;     /* CALL, FILTER, TEST, LIST, DICT (key, value pairs) */
    const char **kw; /* keyword names (NULL for positional) */
    size_t *kwn;
    int nargs;
};

enum { N_TEXT, N_OUT, N_IF, N_FOR, N_SET };

typedef struct node node;
struct node {
    int kind, line;
    const char *text; /* TEXT */
    size_t n;
    expr *e;         /* OUT value, IF condition, FOR iterable, SET value */
    const char *var; /* FOR / SET name */
    size_t vn;
    const char *attr; /* SET ns.attr */
    size_t an;
    node *body, *els, *next;
    /* FOR: more loop variables (for a, b in pairs) and the filter (if c) */
    const char **more;
    size_t *more_n;
    int n_more;
    expr *filter;
};

struct jinja_template {
    arena ar;
    node *root;
};

/* ------------------------------------------------------------------------- */
/* Lexing the template into pieces                                            */
/* ------------------------------------------------------------------------- */
enum { P_TEXT, P_VAR, P_BLOCK };

typedef struct piece {
    int type, line;
    const char *s; /* TEXT: the text; VAR / BLOCK: the tag's inside */
    size_t n;
} piece;

typedef struct plist {
    piece *p;
    size_t n, cap;
} plist;

static void plist_add(arena *a, plist *l, piece p) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        piece *np = ar_alloc(a, cap * sizeof *np);
        if (l->n) memcpy(np, l->p, l->n * sizeof *np);
        l->p = np;
        l->cap = cap;
    }
    l->p[l->n++] = p;
}

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static int line_of(const char *src, const char *at) {
    int line = 1;
    for (const char *p = src; p < at; p++) line += *p == '\n';
    return line;
}

/* The end of a tag's inside: the offset of the closing delimiter ("}}",
 * "%}" or "#}") from i, skipping string literals (and, in {{ }}, braces of
 * dict literals). */
static size_t tag_end(const char *s, size_t len, size_t i, char close) {
    int depth = 0;
    char quote = 0;
    for (; i + 1 < len; i++) {
        char c = s[i];
        if (close == '#') {
            if (c == '#' && s[i + 1] == '}') return i;
            continue;
        }
        if (quote) {
            if (c == '\\')
                i++;
            else if (c == quote)
                quote = 0;
            continue;
        }
        if (c == '\'' || c == '"')
            quote = c;
        else if (c == close && s[i + 1] == '}' && depth == 0)
            return i;
        else if (c == '{')
            depth++;
        else if (c == '}' && depth > 0)
            depth--;
    }
    return len;
}

static void lex(arena *a, const char *src, size_t len, plist *out) {
    size_t pos = 0;
    int strip_next = 0, trim_nl = 0;
    for (;;) {
        size_t at = pos;
        while (at + 1 < len &&
               !(src[at] == '{' &&
                 (src[at + 1] == '{' || src[at + 1] == '%' || src[at + 1] == '#')))
            at++;
        if (at + 1 >= len) at = len;
        size_t ts = pos, te = at; /* the text before the tag */
        if (strip_next)
            while (ts < te && is_ws(src[ts])) ts++;
        else if (trim_nl && ts < te && src[ts] == '\n')
            ts++;
        if (at < len) {
            char kind = src[at + 1], mod = at + 2 < len ? src[at + 2] : 0;
            if (mod == '-') {
                while (te > ts && is_ws(src[te - 1])) te--;
            } else if (kind != '{' && mod != '+') { /* lstrip_blocks */
                size_t k = te;
                while (k > ts &&
                       (src[k - 1] == ' ' || src[k - 1] == '\t' || src[k - 1] == '\r' ||
                        src[k - 1] == '\f' || src[k - 1] == '\v'))
                    k--;
                if ((k > ts && src[k - 1] == '\n') ||
                    (k == ts && (ts == 0 || src[ts - 1] == '\n')))
                    te = k;
            }
        }
        if (te > ts)
            plist_add(a, out,
                      (piece){ .type = P_TEXT,
                               .s = src + ts,
                               .n = te - ts,
                               .line = line_of(src, src + ts) });
        if (at >= len) break;
        char kind = src[at + 1];
        size_t in = at + 2;
        if (in < len && (src[in] == '-' || (src[in] == '+' && kind != '{'))) in++;
        char close = kind == '{' ? '}' : kind;
        size_t end = tag_end(src, len, in, close);
        if (end >= len)
            fail(a->fail, "line %d: a tag opened with '{%c' is not closed",
                 line_of(src, src + at), kind);
        size_t ie = end;
        strip_next = ie > in && src[ie - 1] == '-';
        if (strip_next) ie--;
        trim_nl = kind != '{';
        if (kind != '#')
            plist_add(a, out,
                      (piece){ .type = kind == '{' ? P_VAR : P_BLOCK,
                               .s = src + in,
                               .n = ie - in,
                               .line = line_of(src, src + at) });
        pos = end + 2;
    }
}

/* ------------------------------------------------------------------------- */
/* Expression tokens                                                          */
/* ------------------------------------------------------------------------- */
enum { T_END, T_NAME, T_INT, T_STR, T_OP };

typedef struct tok {
    int t;
    const char *s; /* NAME / OP text; STR value (unescaped) */
    size_t n;
    int64_t i;
} tok;

typedef struct parser {
    arena *a;
    const piece *pc;
    size_t np, pi; /* pieces and the next one */
    tok *tk;       /* tokens of the current tag */
    size_t nt, ti;
    int line, depth;
} parser;

static void perr(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)))
__attribute__((noreturn));
static void perr(parser *p, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fail(p->a->fail, "line %d: %s", p->line, m);
}

/* Append the UTF-8 of cp. */
static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal at s[i] (the quote) -> tok; returns the offset after it. */
static size_t lex_string(parser *p, const char *s, size_t n, size_t i, tok *t) {
    char q = s[i++];
    char *o = ar_alloc(p->a, n - i + 1);
    size_t len = 0;
    while (i < n && s[i] != q) {
        char c = s[i++];
        if (c != '\\' || i >= n) {
            o[len++] = c;
            continue;
        }
        c = s[i++];
        int hex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (hex) {
            unsigned cp = 0;
            for (int k = 0; k < hex; k++) {
                int h = i < n ? hexval(s[i]) : -1;
                if (h < 0) perr(p, "a bad \\%c escape in a string", c);
                cp = cp * 16 + (unsigned)h;
                i++;
            }
            if (cp > 0x10ffff) perr(p, "a bad \\%c escape in a string", c);
            len += put_utf8(o + len, cp);
            continue;
        }
        switch (c) {
        case 'n': o[len++] = '\n'; break;
        case 't': o[len++] = '\t'; break;
        case 'r': o[len++] = '\r'; break;
        case '0': o[len++] = '\0'; break;
        case 'a': o[len++] = '\a'; break;
        case 'b': o[len++] = '\b'; break;
        case 'f': o[len++] = '\f'; break;
        case 'v': o[len++] = '\v'; break;
        case '\\': o[len++] = '\\'; break;
        case '\'': o[len++] = '\''; break;
        case '"': o[len++] = '"'; break;
        case '\n': break; /* a continued line */
        default:          /* Python keeps unknown escapes as they are */
            o[len++] = '\\';
            o[len++] = c;
        }
    }
    if (i >= n) perr(p, "a string literal is not closed");
    t->t = T_STR;
    t->s = o;
    t->n = len;
    return i + 1;
}

static void tokenize(parser *p, const char *s, size_t n) {
    size_t cap = 16, nt = 0;
    tok *tk = ar_alloc(p->a, cap * sizeof *tk);
    static const char *const ops[] = { "//", "**", "==", "!=", "<=", ">=", "(", ")", "[",
                                       "]",  "{",  "}",  ".",  ",",  ":",  "|", "~", "+",
                                       "-",  "*",  "/",  "%",  "<",  ">",  "=" };
    for (size_t i = 0;;) {
        while (i < n && is_ws(s[i])) i++;
        if (nt + 1 >= cap) {
            tok *nk = ar_alloc(p->a, cap * 2 * sizeof *nk);
            memcpy(nk, tk, nt * sizeof *nk);
            tk = nk;
            cap *= 2;
        }
        tok *t = &tk[nt];
        if (i >= n) {
            t->t = T_END;
            break;
        }
        char c = s[i];
        if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t st = i;
            while (i < n &&
                   (s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') ||
                    (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
                i++;
            *t = (tok){ .t = T_NAME, .s = s + st, .n = i - st };
        } else if (c >= '0' && c <= '9') {
            int64_t v = 0;
            size_t st = i;
            while (i < n && ((s[i] >= '0' && s[i] <= '9') || s[i] == '_')) {
                if (s[i] != '_') {
                    if (v > (INT64_MAX - 9) / 10)
                        perr(p, "an integer literal is too large");
                    v = v * 10 + (s[i] - '0');
                }
                i++;
            }
            if (i < n && (s[i] == '.' || s[i] == 'e' || s[i] == 'E'))
                perr(p, "float literals are not supported (%.*s...)", (int)(i - st + 1),
                     s + st);
            *t = (tok){ .t = T_INT, .i = v };
        } else if (c == '\'' || c == '"') {
            i = lex_string(p, s, n, i, t);
        } else {
            size_t k = 0;
            for (; k < sizeof ops / sizeof ops[0]; k++) {
                size_t ol = strlen(ops[k]);
                if (i + ol <= n && memcmp(s + i, ops[k], ol) == 0) break;
            }
            if (k == sizeof ops / sizeof ops[0]) perr(p, "unexpected character '%c'", c);
            *t = (tok){ .t = T_OP, .s = ops[k], .n = strlen(ops[k]) };
            i += t->n;
        }
        nt++;
    }
    p->tk = tk;
    p->nt = nt;
    p->ti = 0;
}

static const tok *peek(parser *p) { return &p->tk[p->ti]; }
static int is_op(const tok *t, const char *op) {
    return t->t == T_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0;
}
static int is_name(const tok *t, const char *nm) {
    return t->t == T_NAME && t->n == strlen(nm) && memcmp(t->s, nm, t->n) == 0;
}
static int accept_op(parser *p, const char *op) {
    if (!is_op(peek(p), op)) return 0;
    p->ti++;
    return 1;
}
static int accept_name(parser *p, const char *nm) {
    if (!is_name(peek(p), nm)) return 0;
    p->ti++;
    return 1;
}
static const char *tok_text(parser *p, const tok *t) {
    if (t->t == T_END) return "the end of the tag";
    if (t->t == T_INT) return "a number";
    if (t->t == T_STR) return "a string";
    return ar_strndup(p->a, t->s, t->n);
}
static void expect_op(parser *p, const char *op) {
    if (!accept_op(p, op)) perr(p, "expected '%s', got %s", op, tok_text(p, peek(p)));
}
static const tok *expect_name(parser *p) {
    const tok *t = peek(p);
    if (t->t != T_NAME) perr(p, "expected a name, got %s", tok_text(p, t));
    p->ti++;
    return t;
}

/* ------------------------------------------------------------------------- */
/* Expressions (Jinja2's precedence)                                          */
/* ------------------------------------------------------------------------- */
static expr *new_expr(parser *p, int op) {
    expr *e = ar_alloc(p->a, sizeof *e);
    e->op = op;
    e->line = p->line;
    return e;
}

static expr *parse_expr(parser *p);

/* (args) after a callee, filter or test: positional and name=value. */
static void parse_args(parser *p, expr *e) {
    size_t cap = 4;
    e->args = ar_alloc(p->a, cap * sizeof *e->args);
    e->kw = ar_alloc(p->a, cap * sizeof *e->kw);
    e->kwn = ar_alloc(p->a, cap * sizeof *e->kwn);
    while (!accept_op(p, ")")) {
        if (e->nargs) expect_op(p, ",");
        if (accept_op(p, ")")) break;
        if ((size_t)e->nargs == cap) {
            expr **na = ar_alloc(p->a, cap * 2 * sizeof *na);
            const char **nk = ar_alloc(p->a, cap * 2 * sizeof *nk);
            size_t *nkn = ar_alloc(p->a, cap * 2 * sizeof *nkn);
            memcpy(na, e->args, cap * sizeof *na);
            memcpy(nk, e->kw, cap * sizeof *nk);
            memcpy(nkn, e->kwn, cap * sizeof *nkn);
            e->args = na;
            e->kw = nk;
            e->kwn = nkn;
            cap *= 2;
        }
        const tok *t = peek(p);
        if (t->t == T_NAME && is_op(&p->tk[p->ti + 1], "=")) {
            e->kw[e->nargs] = t->s;
            e->kwn[e->nargs] = t->n;
            p->ti += 2;
        }
        e->args[e->nargs++] = parse_expr(p);
    }
}

static expr *parse_primary(parser *p) {
    const tok *t = peek(p);
    expr *e;
    if (t->t == T_INT) {
        p->ti++;
        e = new_expr(p, E_LIT);
        e->lit = v_int(t->i);
        return e;
    }
    if (t->t == T_STR) {
        p->ti++;
        e = new_expr(p, E_LIT);
        e->lit = v_str(t->s, t->n);
        while (peek(p)->t == T_STR) { /* adjacent literals join */
            const tok *u = &p->tk[p->ti++];
            char *s = ar_alloc(p->a, e->lit.n + u->n + 1);
            memcpy(s, e->lit.s, e->lit.n);
            memcpy(s + e->lit.n, u->s, u->n);
            e->lit = v_str(s, e->lit.n + u->n);
        }
        return e;
    }
    if (t->t == T_NAME) {
        p->ti++;
        e = new_expr(p, E_LIT);
        if (is_name(t, "true") || is_name(t, "True")) {
            e->lit = v_bool(1);
        } else if (is_name(t, "false") || is_name(t, "False")) {
            e->lit = v_bool(0);
        } else if (is_name(t, "none") || is_name(t, "None")) {
            e->lit = NONE;
        } else {
            e->op = E_VAR;
            e->name = t->s;
            e->nn = t->n;
        }
        return e;
    }
    if (accept_op(p, "(")) {
        e = parse_expr(p);
        if (is_op(peek(p), ",")) perr(p, "tuples are not supported");
        expect_op(p, ")");
        return e;
    }
    if (accept_op(p, "[") || accept_op(p, "{")) {
        int dict = is_op(&p->tk[p->ti - 1], "{");
        e = new_expr(p, dict ? E_DICT : E_LIST);
        size_t cap = 8;
        e->args = ar_alloc(p->a, cap * sizeof *e->args);
        const char *close = dict ? "}" : "]";
        while (!accept_op(p, close)) {
            if (e->nargs) expect_op(p, ",");
            if (accept_op(p, close)) break;
            if ((size_t)e->nargs + 2 > cap) {
                expr **na = ar_alloc(p->a, cap * 2 * sizeof *na);
                memcpy(na, e->args, cap * sizeof *na);
                e->args = na;
                cap *= 2;
            }
            e->args[e->nargs++] = parse_expr(p);
            if (dict) {
                expect_op(p, ":");
                e->args[e->nargs++] = parse_expr(p);
            }
        }
        return e;
    }
    perr(p, "unexpected %s", tok_text(p, t));
}

static expr *parse_postfix(parser *p, expr *e) {
    for (;;) {
        if (accept_op(p, ".")) {
            const tok *t = peek(p);
            if (t->t == T_INT) { /* a.0 */
                p->ti++;
                expr *x = new_expr(p, E_ITEM);
                x->a = e;
                x->b = new_expr(p, E_LIT);
                x->b->lit = v_int(t->i);
                e = x;
                continue;
            }
            t = expect_name(p);
            expr *x = new_expr(p, E_ATTR);
            x->a = e;
            x->name = t->s;
            x->nn = t->n;
            e = x;
        } else if (accept_op(p, "[")) {
            expr *parts[3] = { NULL, NULL, NULL };
            int k = 0;
            for (;;) {
                if (!is_op(peek(p), ":") && !is_op(peek(p), "]"))
                    parts[k] = parse_expr(p);
                if (k < 2 && accept_op(p, ":")) {
                    k++;
                    continue;
                }
                break;
            }
            expect_op(p, "]");
            expr *x = new_expr(p, k ? E_SLICE : E_ITEM);
            x->a = e;
            if (k) {
                x->b = parts[0];
                x->c = parts[1];
                x->d = parts[2];
            } else {
                if (!parts[0]) perr(p, "an empty subscript");
                x->b = parts[0];
            }
            e = x;
        } else if (accept_op(p, "(")) {
            expr *x = new_expr(p, E_CALL);
            x->a = e;
            parse_args(p, x);
            e = x;
        } else {
            return e;
        }
    }
}

/* Filters and tests after a unary: x | f(args) | g, x is [not] t(args). */
static expr *parse_filters(parser *p, expr *e) {
    for (;;) {
        if (accept_op(p, "|")) {
            const tok *t = expect_name(p);
            expr *x = new_expr(p, E_FILTER);
            x->a = e;
            x->name = t->s;
            x->nn = t->n;
            if (accept_op(p, "(")) parse_args(p, x);
            e = parse_postfix(p, x);
        } else if (accept_name(p, "is")) {
            expr *x = new_expr(p, E_TEST);
            x->a = e;
            x->negate = accept_name(p, "not");
            const tok *t = peek(p);
            if (t->t == T_NAME) {
                p->ti++;
            } else if (is_op(t, "==") || is_op(t, "!=")) { /* is == (rare) */
                p->ti++;
            } else {
                perr(p, "expected a test name after 'is', got %s", tok_text(p, t));
            }
            x->name = t->s;
            x->nn = t->n;
            if (accept_op(p, "(")) {
                parse_args(p, x);
            } else {
                const tok *u = peek(p);
                /* one argument without parentheses: x is divisibleby 3 */
                if (u->t == T_INT || u->t == T_STR ||
                    (u->t == T_NAME && !is_name(u, "and") && !is_name(u, "or") &&
                     !is_name(u, "if") && !is_name(u, "else") && !is_name(u, "is") &&
                     !is_name(u, "in") && !is_name(u, "not"))) {
                    x->args = ar_alloc(p->a, sizeof *x->args);
                    x->kw = ar_alloc(p->a, sizeof *x->kw);
                    x->kwn = ar_alloc(p->a, sizeof *x->kwn);
                    x->args[0] = parse_postfix(p, parse_primary(p));
                    x->nargs = 1;
                }
            }
            e = x;
        } else {
            return e;
        }
    }
}

static expr *parse_unary(parser *p, int with_filter) {
    if (++p->depth > MAX_DEPTH) perr(p, "expressions nested too deeply");
    expr *e;
    if (accept_op(p, "-")) {
        e = new_expr(p, E_NEG);
        e->a = parse_unary(p, 0);
    } else if (accept_op(p, "+")) {
        e = parse_unary(p, 0);
    } else {
        e = parse_postfix(p, parse_primary(p));
    }
    if (with_filter) e = parse_filters(p, e);
    p->depth--;
    return e;
}

static expr *bin(parser *p, int bop, expr *a, expr *b) {
    expr *e = new_expr(p, E_BIN);
    e->bop = bop;
    e->a = a;
    e->b = b;
    return e;
}

static expr *parse_pow(parser *p) {
    expr *e = parse_unary(p, 1);
    if (is_op(peek(p), "**")) perr(p, "'**' is not supported");
    return e;
}

static expr *parse_math2(parser *p) {
    expr *e = parse_pow(p);
    for (;;) {
        if (accept_op(p, "*"))
            e = bin(p, B_MUL, e, parse_pow(p));
        else if (accept_op(p, "//"))
            e = bin(p, B_FLOORDIV, e, parse_pow(p));
        else if (accept_op(p, "%"))
            e = bin(p, B_MOD, e, parse_pow(p));
        else if (is_op(peek(p), "/"))
            perr(p, "'/' (true division) is not supported; use '//'");
        else
            return e;
    }
}

static expr *parse_concat(parser *p) {
    expr *e = parse_math2(p);
    while (accept_op(p, "~")) e = bin(p, B_CAT, e, parse_math2(p));
    return e;
}

static expr *parse_math1(parser *p) {
    expr *e = parse_concat(p);
    for (;;) {
        if (accept_op(p, "+"))
            e = bin(p, B_ADD, e, parse_concat(p));
        else if (accept_op(p, "-"))
            e = bin(p, B_SUB, e, parse_concat(p));
        else
            return e;
    }
}

static expr *parse_compare(parser *p) {
    expr *e = parse_math1(p);
    static const struct {
        const char *op;
        int bop;
    } cmps[] = { { "==", B_EQ }, { "!=", B_NE }, { "<=", B_LE },
                 { ">=", B_GE }, { "<", B_LT },  { ">", B_GT } };
    for (;;) {
        int found = 0;
        for (size_t k = 0; k < sizeof cmps / sizeof cmps[0] && !found; k++)
            if (accept_op(p, cmps[k].op)) {
                e = bin(p, cmps[k].bop, e, parse_math1(p));
                found = 1;
            }
        if (found) continue;
        if (accept_name(p, "in")) {
            e = bin(p, B_IN, e, parse_math1(p));
        } else if (is_name(peek(p), "not") && is_name(&p->tk[p->ti + 1], "in")) {
            p->ti += 2;
            e = bin(p, B_IN, e, parse_math1(p));
            e->negate = 1;
        } else {
            return e;
        }
    }
}

static expr *parse_not(parser *p) {
    if (accept_name(p, "not")) {
        if (++p->depth > MAX_DEPTH) perr(p, "expressions nested too deeply");
        expr *e = new_expr(p, E_NOT);
        e->a = parse_not(p);
        p->depth--;
        return e;
    }
    return parse_compare(p);
}

static expr *parse_and(parser *p) {
    expr *e = parse_not(p);
    while (accept_name(p, "and")) {
        expr *x = new_expr(p, E_AND);
        x->a = e;
        x->b = parse_not(p);
        e = x;
    }
    return e;
}

static expr *parse_or(parser *p) {
    expr *e = parse_and(p);
    while (accept_name(p, "or")) {
        expr *x = new_expr(p, E_OR);
        x->a = e;
        x->b = parse_and(p);
        e = x;
    }
    return e;
}

static expr *parse_expr(parser *p) {
    if (++p->depth > MAX_DEPTH) perr(p, "expressions nested too deeply");
    expr *e = parse_or(p);
    while (accept_name(p, "if")) {
        expr *x = new_expr(p, E_COND);
        x->a = e;
        x->b = parse_or(p);
        if (accept_name(p, "else")) x->c = parse_expr(p);
        e = x;
    }
    p->depth--;
    return e;
}

/* ------------------------------------------------------------------------- */
/* Statements                                                                 */
/* ------------------------------------------------------------------------- */
static void expect_end(parser *p) {
    if (peek(p)->t != T_END) perr(p, "unexpected %s in the tag", tok_text(p, peek(p)));
}

/* Parse nodes until a block tag whose first word is one of stops (NULL
 * terminated; NULL stops = the end of the template). *stop gets the word
 * index found; the tag's tokens stay current after it. */
static node *parse_body(parser *p, const char *const *stops, int *stop) {
    node *head = NULL, **tail = &head;
    if (++p->depth > MAX_DEPTH) perr(p, "blocks nested too deeply");
    while (p->pi < p->np) {
        const piece *pc = &p->pc[p->pi++];
        p->line = pc->line;
        node *n = ar_alloc(p->a, sizeof *n);
        n->line = pc->line;
        if (pc->type == P_TEXT) {
            n->kind = N_TEXT;
            n->text = pc->s;
            n->n = pc->n;
        } else if (pc->type == P_VAR) {
            tokenize(p, pc->s, pc->n);
            n->kind = N_OUT;
            n->e = parse_expr(p);
            expect_end(p);
        } else {
            tokenize(p, pc->s, pc->n);
            const tok *w = expect_name(p);
            for (int k = 0; stops && stops[k]; k++)
                if (is_name(w, stops[k])) {
                    *stop = k;
                    p->depth--;
                    return head;
                }
            if (is_name(w, "if")) {
                n->kind = N_IF;
                n->e = parse_expr(p);
                expect_end(p);
                static const char *const if_stops[] = { "elif", "else", "endif", NULL };
                node *cur = n;
                for (;;) {
                    int k = -1;
                    cur->body = parse_body(p, if_stops, &k);
                    if (k < 0) perr(p, "'if' without 'endif'");
                    if (k == 2) {
                        expect_end(p);
                        break;
                    }
                    if (k == 1) {
                        expect_end(p);
                        static const char *const else_stops[] = { "endif", NULL };
                        int k2 = -1;
                        cur->els = parse_body(p, else_stops, &k2);
                        if (k2 < 0) perr(p, "'if' without 'endif'");
                        expect_end(p);
                        break;
                    }
                    node *el = ar_alloc(p->a, sizeof *el); /* elif: an if in else */
                    el->kind = N_IF;
                    el->line = p->line;
                    el->e = parse_expr(p);
                    expect_end(p);
                    cur->els = el;
                    cur = el;
                }
            } else if (is_name(w, "for")) {
                n->kind = N_FOR;
                const tok *v = expect_name(p);
                n->var = v->s;
                n->vn = v->n;
                while (accept_op(p, ",")) { /* for a, b in ... */
                    const tok *u = expect_name(p);
                    const char **nm =
                        ar_alloc(p->a, ((size_t)n->n_more + 1) * sizeof *nm);
                    size_t *nl = ar_alloc(p->a, ((size_t)n->n_more + 1) * sizeof *nl);
                    if (n->n_more) {
                        memcpy(nm, n->more, (size_t)n->n_more * sizeof *nm);
                        memcpy(nl, n->more_n, (size_t)n->n_more * sizeof *nl);
                    }
                    nm[n->n_more] = u->s;
                    nl[n->n_more] = u->n;
                    n->more = nm;
                    n->more_n = nl;
                    n->n_more++;
                }
                if (!accept_name(p, "in")) perr(p, "expected 'in' in 'for'");
                n->e = parse_or(p); /* Jinja2: no x if c else y here */
                if (accept_name(p, "if")) n->filter = parse_expr(p);
                if (is_name(peek(p), "recursive"))
                    perr(p, "recursive loops are not supported");
                expect_end(p);
                static const char *const for_stops[] = { "else", "endfor", NULL };
                int k = -1;
                n->body = parse_body(p, for_stops, &k);
                if (k < 0) perr(p, "'for' without 'endfor'");
                expect_end(p);
                if (k == 0) {
                    static const char *const end_stops[] = { "endfor", NULL };
                    int k2 = -1;
                    n->els = parse_body(p, end_stops, &k2);
                    if (k2 < 0) perr(p, "'for' without 'endfor'");
                    expect_end(p);
                }
            } else if (is_name(w, "set")) {
                n->kind = N_SET;
                const tok *v = expect_name(p);
                n->var = v->s;
                n->vn = v->n;
                if (accept_op(p, ".")) {
                    const tok *at = expect_name(p);
                    n->attr = at->s;
                    n->an = at->n;
                }
                if (is_op(peek(p), ","))
                    perr(p, "'set' of several names is not supported");
                if (!accept_op(p, "="))
                    perr(p, "block 'set' (without '=') is not supported");
                n->e = parse_expr(p);
                expect_end(p);
            } else if (is_name(w, "endif") || is_name(w, "endfor") ||
                       is_name(w, "elif") || is_name(w, "else")) {
                perr(p, "unexpected '%s'", tok_text(p, w));
            } else {
                perr(p, "the tag '%s' is not supported", tok_text(p, w));
            }
        }
        *tail = n;
        tail = &n->next;
    }
    if (stops) {
        *stop = -1;
        p->depth--;
        return head;
    }
    p->depth--;
    return head;
}

static void parse_all(jinja_template *t, const char *src, size_t len) {
    if (len && src[len - 1] == '\n') len--; /* Jinja2's keep_trailing_newline=False */
    src = ar_strndup(&t->ar, src, len);     /* the tree points into its own copy */
    plist pl = { 0 };
    lex(&t->ar, src, len, &pl);
    parser p = { .a = &t->ar, .pc = pl.p, .np = pl.n, .line = 1 };
    t->root = parse_body(&p, NULL, NULL);
}

int jinja_parse(const char *src, size_t len, jinja_template **out, char *err,
                size_t err_cap) {
    jinja_template *t = calloc(1, sizeof *t);
    fail_ctx f;
    if (!t) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    t->ar.fail = &f;
    if (setjmp(f.jb)) {
        util_set_err(err, err_cap, "chat template: %s", f.msg);
        ar_free(&t->ar);
        free(t);
        return -1;
    }
    parse_all(t, src, len);
    t->ar.fail = NULL;
    *out = t;
    return 0;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    ar_free(&t->ar);
    free(t);
}

/* ------------------------------------------------------------------------- */
/* Rendering                                                                  */
/* ------------------------------------------------------------------------- */
typedef struct scope scope;
struct scope {
    jdict vars;
    scope *parent;
};

typedef struct rctx {
    arena ar;
    fail_ctx f;
    strbuf *out;
    int depth, line;
    unsigned long long steps;
    struct tsb *temps; /* temporary strbufs, freed at the end (also after a failure) */
} rctx;

typedef struct tsb {
    strbuf b;
    struct tsb *next;
} tsb;

/* A strbuf freed with the render, whatever happens: use it for text built
 * where a failure may unwind. */
static strbuf *tmp_sb(rctx *r) {
    tsb *t = ar_alloc(&r->ar, sizeof *t);
    t->next = r->temps;
    r->temps = t;
    return &t->b;
}

static void free_temps(rctx *r) {
    for (tsb *t = r->temps; t; t = t->next) strbuf_free(&t->b);
    r->temps = NULL;
}

static void step(rctx *r);

static void rfail(rctx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)))
__attribute__((noreturn));
static void rfail(rctx *r, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fail(&r->f, "line %d: %s", r->line, m);
}

static int truthy(const val *v) {
    switch (v->t) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL:
    case V_INT: return v->i != 0;
    case V_STR: return v->n > 0;
    case V_LIST: return v->l->n > 0;
    case V_DICT: return v->d->ns || v->d->n > 0;
    default: return 1;
    }
}

static void sb_repr(rctx *r, strbuf *b, const val *v);

/* str(v) as Python (and Jinja2's output) writes it. */
static void sb_str(rctx *r, strbuf *b, const val *v) {
    char num[32];
    switch (v->t) {
    case V_UNDEF: break;
    case V_NONE: strbuf_puts(b, "None"); break;
    case V_BOOL: strbuf_puts(b, v->i ? "True" : "False"); break;
    case V_INT:
        snprintf(num, sizeof num, "%" PRId64, v->i);
        strbuf_puts(b, num);
        break;
    case V_STR:
        if (v->n) strbuf_put(b, v->s, v->n);
        break;
    case V_LIST:
    case V_DICT: sb_repr(r, b, v); break;
    default: rfail(r, "cannot write a %s as text", type_name(v));
    }
}

static void sb_repr(rctx *r, strbuf *b, const val *v) {
    if (v->t == V_STR) {
        int dq = memchr(v->s, '\'', v->n) && !memchr(v->s, '"', v->n);
        char q = dq ? '"' : '\'';
        strbuf_put(b, &q, 1);
        for (size_t i = 0; i < v->n; i++) {
            char c = v->s[i];
            if (c == '\\' || c == q) {
                strbuf_put(b, "\\", 1);
                strbuf_put(b, &c, 1);
            } else if (c == '\n') {
                strbuf_puts(b, "\\n");
            } else if (c == '\t') {
                strbuf_puts(b, "\\t");
            } else if (c == '\r') {
                strbuf_puts(b, "\\r");
            } else if ((unsigned char)c < 0x20 || c == 0x7f) {
                strbuf_printf(b, "\\x%02x", (unsigned char)c);
            } else {
                strbuf_put(b, &c, 1);
            }
        }
        strbuf_put(b, &q, 1);
    } else if (v->t == V_LIST) {
        strbuf_puts(b, "[");
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) strbuf_puts(b, ", ");
            sb_repr(r, b, &v->l->it[i]);
        }
        strbuf_puts(b, "]");
    } else if (v->t == V_DICT) {
        if (v->d->ns) rfail(r, "cannot write a namespace as text");
        strbuf_puts(b, "{");
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) strbuf_puts(b, ", ");
            val k = v_str(v->d->k[i], v->d->kn[i]);
            sb_repr(r, b, &k);
            strbuf_puts(b, ": ");
            sb_repr(r, b, &v->d->v[i]);
        }
        strbuf_puts(b, "}");
    } else {
        sb_str(r, b, v);
    }
}

/* A string value of the strbuf's text (copied into the arena). */
static val sb_val(rctx *r, strbuf *b) {
    if (b->oom) {
        strbuf_free(b);
        rfail(r, "out of memory");
    }
    val v = v_str(ar_strndup(&r->ar, b->p ? b->p : "", b->len), b->len);
    strbuf_free(b);
    return v;
}

static val to_str(rctx *r, const val *v) {
    if (v->t == V_STR) return *v;
    strbuf *b = tmp_sb(r);
    sb_str(r, b, v);
    return sb_val(r, b);
}

/* json.dumps(v, ensure_ascii=False[, indent]) */
static void sb_json(rctx *r, strbuf *b, const val *v, int indent, int level) {
    char num[32];
    switch (v->t) {
    case V_NONE: strbuf_puts(b, "null"); return;
    case V_BOOL: strbuf_puts(b, v->i ? "true" : "false"); return;
    case V_INT:
        snprintf(num, sizeof num, "%" PRId64, v->i);
        strbuf_puts(b, num);
        return;
    case V_STR:
        strbuf_puts(b, "\"");
        for (size_t i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->s[i];
            if (c == '"')
                strbuf_puts(b, "\\\"");
            else if (c == '\\')
                strbuf_puts(b, "\\\\");
            else if (c == '\n')
                strbuf_puts(b, "\\n");
            else if (c == '\r')
                strbuf_puts(b, "\\r");
            else if (c == '\t')
                strbuf_puts(b, "\\t");
            else if (c == '\b')
                strbuf_puts(b, "\\b");
            else if (c == '\f')
                strbuf_puts(b, "\\f");
            else if (c < 0x20)
                strbuf_printf(b, "\\u%04x", c);
            else
                strbuf_put(b, (const char *)&c, 1);
        }
        strbuf_puts(b, "\"");
        return;
    case V_LIST:
    case V_DICT: {
        int dict = v->t == V_DICT;
        size_t n = dict ? v->d->n : v->l->n;
        if (dict && v->d->ns) break;
        strbuf_puts(b, dict ? "{" : "[");
        for (size_t i = 0; i < n; i++) {
            if (i) strbuf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) strbuf_printf(b, "\n%*s", indent * (level + 1), "");
            if (dict) {
                val k = v_str(v->d->k[i], v->d->kn[i]);
                sb_json(r, b, &k, indent, level + 1);
                strbuf_puts(b, ": ");
            }
            sb_json(r, b, dict ? &v->d->v[i] : &v->l->it[i], indent, level + 1);
        }
        if (indent >= 0 && n) strbuf_printf(b, "\n%*s", indent * level, "");
        strbuf_puts(b, dict ? "}" : "]");
        return;
    }
    default: break;
    }
    rfail(r, "tojson: a %s is not JSON", type_name(v));
}

static int equal(const val *a, const val *b) {
    int an = a->t == V_INT || a->t == V_BOOL, bn = b->t == V_INT || b->t == V_BOOL;
    if (an && bn) return a->i == b->i;
    if (a->t != b->t) return 0;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a->n == b->n && memcmp(a->s, b->s, a->n) == 0;
    case V_LIST:
        if (a->l->n != b->l->n) return 0;
        for (size_t i = 0; i < a->l->n; i++)
            if (!equal(&a->l->it[i], &b->l->it[i])) return 0;
        return 1;
    case V_DICT:
        if (a->d == b->d) return 1;
        if (a->d->ns || b->d->ns || a->d->n != b->d->n) return 0;
        for (size_t i = 0; i < a->d->n; i++) {
            const val *o = dict_find(b->d, a->d->k[i], a->d->kn[i]);
            if (!o || !equal(&a->d->v[i], o)) return 0;
        }
        return 1;
    default: return 0;
    }
}

static int compare(rctx *r, const val *a, const val *b, const char *op) {
    int an = a->t == V_INT || a->t == V_BOOL, bn = b->t == V_INT || b->t == V_BOOL;
    if (an && bn) return a->i < b->i ? -1 : a->i > b->i;
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->n < b->n ? a->n : b->n;
        int c = n ? memcmp(a->s, b->s, n) : 0;
        if (c) return c < 0 ? -1 : 1;
        return a->n < b->n ? -1 : a->n > b->n;
    }
    rfail(r, "'%s' between a %s and a %s", op, type_name(a), type_name(b));
}

static val lookup(const scope *s, const char *k, size_t kn) {
    for (; s; s = s->parent) {
        const val *v = dict_find(&s->vars, k, kn);
        if (v) return *v;
    }
    return UNDEF;
}

static val eval(rctx *r, scope *s, const expr *e);

static val str_index(rctx *r, val s, int64_t i) {
    size_t c, *off = cp_offsets(&r->ar, s.s, s.n, &c);
    if (i < 0) i += (int64_t)c;
    if (i < 0 || (uint64_t)i >= c) return UNDEF;
    return v_str(s.s + off[i], off[i + 1] - off[i]);
}

static val get_item(rctx *r, val o, val k);

/* o.name: a key, else a method; undefined when neither (an attribute of an
 * undefined value is an error, as in Jinja2). */
static val get_attr(rctx *r, val o, const char *name, size_t nn) {
    static const char *const str_methods[] = { "startswith", "endswith",   "strip",
                                               "lstrip",     "rstrip",     "split",
                                               "upper",      "lower",      "replace",
                                               "title",      "capitalize", NULL };
    static const char *const dict_methods[] = { "get", "items", "keys", "values", NULL };
    if (o.t == V_UNDEF) rfail(r, "'%.*s' of an undefined value", (int)nn, name);
    const char *const *methods = NULL;
    if (o.t == V_DICT) {
        const val *v = dict_find(o.d, name, nn);
        if (v) return *v;
        if (!o.d->ns) methods = dict_methods;
    } else if (o.t == V_STR) {
        methods = str_methods;
    }
    for (int k = 0; methods && methods[k]; k++)
        if (strlen(methods[k]) == nn && memcmp(methods[k], name, nn) == 0) {
            val *recv = ar_alloc(&r->ar, sizeof *recv);
            *recv = o;
            return (val){ .t = V_METHOD, .s = methods[k], .n = nn, .recv = recv };
        }
    return UNDEF;
}

static val get_item(rctx *r, val o, val k) {
    if (o.t == V_UNDEF) rfail(r, "a subscript of an undefined value");
    if (o.t == V_DICT && k.t == V_STR) {
        const val *v = dict_find(o.d, k.s, k.n);
        return v ? *v : get_attr(r, o, k.s, k.n);
    }
    if (k.t == V_STR) return get_attr(r, o, k.s, k.n);
    if (k.t == V_INT || k.t == V_BOOL) {
        if (o.t == V_LIST) {
            int64_t i = k.i < 0 ? k.i + (int64_t)o.l->n : k.i;
            return i >= 0 && (uint64_t)i < o.l->n ? o.l->it[i] : UNDEF;
        }
        if (o.t == V_STR) return str_index(r, o, k.i);
    }
    return UNDEF;
}

/* Python's slice.indices for a sequence of length len. */
static void slice_indices(rctx *r, const val *st, const val *sp, const val *sd,
                          int64_t len, int64_t *start, int64_t *stop, int64_t *step) {
    *step = sd->t == V_INT ? sd->i : 1;
    if (*step == 0) rfail(r, "a slice step of 0");
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? len - 1 : len;
    if (st->t == V_INT) {
        *start = st->i < 0 ? st->i + len : st->i;
        if (*start < lo) *start = lo;
        if (*start > hi) *start = hi;
    } else {
        *start = *step < 0 ? hi : lo;
    }
    if (sp->t == V_INT) {
        *stop = sp->i < 0 ? sp->i + len : sp->i;
        if (*stop < lo) *stop = lo;
        if (*stop > hi) *stop = hi;
    } else {
        *stop = *step < 0 ? lo : hi;
    }
}

static val slice(rctx *r, val o, val st, val sp, val sd) {
    const val *parts[3] = { &st, &sp, &sd };
    for (int k = 0; k < 3; k++)
        if (parts[k]->t != V_INT && parts[k]->t != V_NONE && parts[k]->t != V_UNDEF)
            rfail(r, "slice indices must be integers, not %s", type_name(parts[k]));
    int64_t a, b, step;
    if (o.t == V_LIST) {
        slice_indices(r, &st, &sp, &sd, (int64_t)o.l->n, &a, &b, &step);
        size_t n = 0;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) n++;
        jlist *l = list_new(&r->ar, n);
        n = 0;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) l->it[n++] = o.l->it[i];
        return (val){ .t = V_LIST, .l = l };
    }
    if (o.t == V_STR) {
        size_t c, *off = cp_offsets(&r->ar, o.s, o.n, &c);
        slice_indices(r, &st, &sp, &sd, (int64_t)c, &a, &b, &step);
        strbuf *sb = tmp_sb(r);
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
            strbuf_put(sb, o.s + off[i], off[i + 1] - off[i]);
        return sb_val(r, sb);
    }
    rfail(r, "cannot slice a %s", type_name(&o));
}

/* Evaluated arguments of a call, filter or test. */
typedef struct args {
    val *v;
    const char **kw;
    size_t *kwn;
    int n;
} args;

static args eval_args(rctx *r, scope *s, const expr *e) {
    args a = { .n = e->nargs, .kw = e->kw, .kwn = e->kwn };
    a.v = ar_alloc(&r->ar, ((size_t)e->nargs + 1) * sizeof *a.v);
    for (int i = 0; i < e->nargs; i++) a.v[i] = eval(r, s, e->args[i]);
    return a;
}

/* Argument `name` or positional i (from first), or UNDEF. */
static val arg(const args *a, int i, const char *name) {
    int pos = 0;
    for (int k = 0; k < a->n; k++) {
        if (a->kw && a->kw[k]) {
            if (name && a->kwn[k] == strlen(name) &&
                memcmp(a->kw[k], name, a->kwn[k]) == 0)
                return a->v[k];
        } else if (pos++ == i) {
            return a->v[k];
        }
    }
    return UNDEF;
}

static val need_str(rctx *r, val v, const char *what) {
    if (v.t != V_STR) rfail(r, "%s needs a string, got a %s", what, type_name(&v));
    return v;
}

static val str_case(rctx *r, val s, int upper) {
    char *o = ar_alloc(&r->ar, s.n + 1);
    for (size_t i = 0; i < s.n; i++) {
        char c = s.s[i];
        if (upper && c >= 'a' && c <= 'z') c = (char)(c - 32);
        if (!upper && c >= 'A' && c <= 'Z') c = (char)(c + 32);
        o[i] = c;
    }
    return v_str(o, s.n);
}

/* str.title() (title = 1) or str.capitalize(), for ASCII letters. */
static val str_title(rctx *r, val s, int title) {
    char *o = ar_alloc(&r->ar, s.n + 1);
    int prev_cased = 0;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.s[i];
        int lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
        int want_upper = title ? !prev_cased : i == 0;
        if (lower && want_upper) c = (char)(c - 32);
        if (upper && !want_upper) c = (char)(c + 32);
        o[i] = c;
        prev_cased = lower || upper;
    }
    return v_str(o, s.n);
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

static val list_of(rctx *r, val *items, size_t n) {
    jlist *l = list_new(&r->ar, n);
    if (n) memcpy(l->it, items, n * sizeof *items);
    return (val){ .t = V_LIST, .l = l };
}

static val str_split(rctx *r, val s, val sep, val maxv) {
    int64_t max = maxv.t == V_INT ? maxv.i : -1;
    size_t cap = 8, n = 0;
    val *parts = ar_alloc(&r->ar, cap * sizeof *parts);
#define PUSH(x)                                               \
    do {                                                      \
        if (n == cap) {                                       \
            val *np = ar_alloc(&r->ar, cap * 2 * sizeof *np); \
            memcpy(np, parts, cap * sizeof *np);              \
            parts = np;                                       \
            cap *= 2;                                         \
        }                                                     \
        parts[n++] = (x);                                     \
    } while (0)
    if (sep.t == V_STR) {
        if (sep.n == 0) rfail(r, "split: an empty separator");
        const char *p = s.s, *end = s.s + s.n, *q;
        while ((max < 0 || (int64_t)n < max) &&
               (q = memfind(p, (size_t)(end - p), sep.s, sep.n))) {
            PUSH(v_str(p, (size_t)(q - p)));
            p = q + sep.n;
        }
        PUSH(v_str(p, (size_t)(end - p)));
    } else { /* runs of white space; no empty strings */
        size_t c, *off = cp_offsets(&r->ar, s.s, s.n, &c), i = 0;
        for (;;) {
            while (i < c && py_space(u8_cp((const unsigned char *)s.s + off[i],
                                           off[i + 1] - off[i])))
                i++;
            if (i >= c) break;
            size_t st = i;
            if (max >= 0 && (int64_t)n >= max) {
                size_t e = c;
                while (e > st && py_space(u8_cp((const unsigned char *)s.s + off[e - 1],
                                                off[e] - off[e - 1])))
                    e--;
                PUSH(v_str(s.s + off[st], off[e] - off[st]));
                break;
            }
            while (i < c && !py_space(u8_cp((const unsigned char *)s.s + off[i],
                                            off[i + 1] - off[i])))
                i++;
            PUSH(v_str(s.s + off[st], off[i] - off[st]));
        }
    }
#undef PUSH
    return list_of(r, parts, n);
}

static val call_method(rctx *r, const val *m, const args *a) {
    val o = *m->recv;
    const char *nm = m->s;
    if (o.t == V_STR) {
        if (!strcmp(nm, "startswith") || !strcmp(nm, "endswith")) {
            val x = need_str(r, arg(a, 0, NULL), nm);
            if (x.n > o.n) return v_bool(0);
            const char *at = nm[0] == 's' ? o.s : o.s + o.n - x.n;
            return v_bool(x.n == 0 || memcmp(at, x.s, x.n) == 0);
        }
        if (!strcmp(nm, "strip") || !strcmp(nm, "lstrip") || !strcmp(nm, "rstrip")) {
            val c = arg(a, 0, "chars");
            if (c.t != V_UNDEF && c.t != V_NONE) need_str(r, c, nm);
            int which = nm[0] == 'l' ? 1 : nm[0] == 'r' ? 2 : 3;
            return py_strip(&r->ar, o, c.t == V_STR ? &c : NULL, which);
        }
        if (!strcmp(nm, "split")) {
            val sep = arg(a, 0, "sep");
            if (sep.t != V_UNDEF && sep.t != V_NONE) need_str(r, sep, "split");
            return str_split(r, o, sep, arg(a, 1, "maxsplit"));
        }
        if (!strcmp(nm, "upper") || !strcmp(nm, "lower"))
            return str_case(r, o, nm[0] == 'u');
        if (!strcmp(nm, "title") || !strcmp(nm, "capitalize"))
            return str_title(r, o, nm[0] == 't');
        if (!strcmp(nm, "replace")) {
            val from = need_str(r, arg(a, 0, NULL), "replace"),
                to = need_str(r, arg(a, 1, NULL), "replace"), cnt = arg(a, 2, "count");
            int64_t max = cnt.t == V_INT ? cnt.i : -1;
            strbuf *b = tmp_sb(r);
            strbuf_put(b, "", 0);
            const char *p = o.s, *end = o.s + o.n, *q;
            if (from.n == 0) rfail(r, "replace: an empty string to replace");
            for (int64_t k = 0; (max < 0 || k < max) &&
                                (q = memfind(p, (size_t)(end - p), from.s, from.n));
                 k++) {
                strbuf_put(b, p, (size_t)(q - p));
                strbuf_put(b, to.s, to.n);
                p = q + from.n;
            }
            strbuf_put(b, p, (size_t)(end - p));
            return sb_val(r, b);
        }
    } else if (o.t == V_DICT) {
        if (!strcmp(nm, "get")) {
            val k = arg(a, 0, NULL);
            const val *v = k.t == V_STR ? dict_find(o.d, k.s, k.n) : NULL;
            if (v) return *v;
            val d = arg(a, 1, "default");
            return d.t == V_UNDEF ? NONE : d;
        }
        size_t n = o.d->n;
        jlist *l = list_new(&r->ar, n);
        for (size_t i = 0; i < n; i++) {
            val k = v_str(o.d->k[i], o.d->kn[i]);
            if (!strcmp(nm, "keys")) {
                l->it[i] = k;
            } else if (!strcmp(nm, "values")) {
                l->it[i] = o.d->v[i];
            } else {
                val pair[2] = { k, o.d->v[i] };
                l->it[i] = list_of(r, pair, 2);
            }
        }
        return (val){ .t = V_LIST, .l = l };
    }
    rfail(r, "the method '%s' of a %s is not supported", nm, type_name(&o));
}

static val call(rctx *r, scope *s, const expr *e) {
    val f = eval(r, s, e->a);
    args a = eval_args(r, s, e);
    if (f.t == V_METHOD) return call_method(r, &f, &a);
    if (f.t != V_FUNC) {
        if (e->a->op == E_VAR)
            rfail(r, "the function '%.*s' is not supported", (int)e->a->nn, e->a->name);
        rfail(r, "a %s is not callable", type_name(&f));
    }
    if (f.i == F_RAISE) {
        /* The template's own words; a NUL byte would cut the message short
         * (an empty error line), so it is shown as \0. */
        val m = to_str(r, &a.v[0]);
        char msg[sizeof r->f.msg];
        size_t o = 0;
        for (size_t i = 0; i < m.n && o + 3 < sizeof msg; i++) {
            if (m.s[i] == '\0') {
                msg[o++] = '\\';
                msg[o++] = '0';
            } else {
                msg[o++] = m.s[i];
            }
        }
        msg[o] = '\0';
        if (o == 0) fail(&r->f, "raise_exception() with an empty message");
        fail(&r->f, "%s", msg);
    }
    if (f.i == F_NAMESPACE) {
        jdict *d = dict_new(&r->ar);
        d->ns = 1;
        for (int k = 0; k < a.n; k++) {
            if (a.kw[k]) {
                dict_set(&r->ar, d, a.kw[k], a.kwn[k], a.v[k]);
            } else if (a.v[k].t == V_DICT) {
                for (size_t i = 0; i < a.v[k].d->n; i++)
                    dict_set(&r->ar, d, a.v[k].d->k[i], a.v[k].d->kn[i], a.v[k].d->v[i]);
            } else {
                rfail(r, "namespace() takes names = values");
            }
        }
        return (val){ .t = V_DICT, .d = d };
    }
    if (f.i == F_STRFTIME) { /* transformers: datetime.now().strftime(fmt) */
        val fmt = need_str(r, arg(&a, 0, NULL), "strftime_now");
        char fs[256], out[512];
        if (fmt.n >= sizeof fs || memchr(fmt.s, '\0', fmt.n))
            rfail(r, "strftime_now: a format of at most %zu bytes", sizeof fs - 1);
        memcpy(fs, fmt.s, fmt.n);
        fs[fmt.n] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm)) rfail(r, "strftime_now: no local time");
        size_t n = strftime(out, sizeof out, fs, &tm);
        return v_str(ar_strndup(&r->ar, out, n), n);
    }
    /* range */
    int64_t lo = 0, hi, step = 1;
    for (int k = 0; k < a.n; k++)
        if (a.v[k].t != V_INT) rfail(r, "range() needs integers");
    if (a.n == 1) {
        hi = a.v[0].i;
    } else if (a.n == 2 || a.n == 3) {
        lo = a.v[0].i;
        hi = a.v[1].i;
        if (a.n == 3) step = a.v[2].i;
    } else {
        rfail(r, "range() takes 1 to 3 arguments");
    }
    if (step == 0) rfail(r, "range() with a step of 0");
    size_t n = 0;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
        if (++n > MAX_ITEMS) rfail(r, "range() of more than %u items", MAX_ITEMS);
    jlist *l = list_new(&r->ar, n);
    n = 0;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) l->it[n++] = v_int(i);
    return (val){ .t = V_LIST, .l = l };
}

static int name_is(const expr *e, const char *nm) {
    return e->nn == strlen(nm) && memcmp(e->name, nm, e->nn) == 0;
}

static int apply_test(rctx *r, const char *name, size_t nn, val v, const args *a);

static val filter(rctx *r, scope *s, const expr *e) {
    val v = eval(r, s, e->a);
    args a = eval_args(r, s, e);
    if (name_is(e, "trim")) {
        val c = arg(&a, 0, "chars");
        return py_strip(&r->ar, to_str(r, &v), c.t == V_STR ? &c : NULL, 3);
    }
    if (name_is(e, "length") || name_is(e, "count")) {
        if (v.t == V_STR) {
            size_t c;
            cp_offsets(&r->ar, v.s, v.n, &c);
            return v_int((int64_t)c);
        }
        if (v.t == V_LIST) return v_int((int64_t)v.l->n);
        if (v.t == V_DICT) return v_int((int64_t)v.d->n);
        if (v.t == V_UNDEF) return v_int(0);
        rfail(r, "length of a %s", type_name(&v));
    }
    if (name_is(e, "tojson")) {
        val ind = arg(&a, 0, "indent");
        strbuf *b = tmp_sb(r);
        strbuf_put(b, "", 0);
        sb_json(r, b, &v, ind.t == V_INT ? (int)ind.i : -1, 0);
        return sb_val(r, b);
    }
    if (name_is(e, "string")) return to_str(r, &v);
    if (name_is(e, "lower") || name_is(e, "upper"))
        return str_case(r, to_str(r, &v), name_is(e, "upper"));
    if (name_is(e, "first") || name_is(e, "last")) {
        int last = name_is(e, "last");
        if (v.t == V_LIST) return v.l->n ? v.l->it[last ? v.l->n - 1 : 0] : UNDEF;
        if (v.t == V_STR) return str_index(r, v, last ? -1 : 0);
        rfail(r, "%.*s of a %s", (int)e->nn, e->name, type_name(&v));
    }
    if (name_is(e, "join")) {
        if (v.t != V_LIST) rfail(r, "join of a %s", type_name(&v));
        val sep = arg(&a, 0, "d");
        strbuf *b = tmp_sb(r);
        strbuf_put(b, "", 0);
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && sep.t == V_STR) strbuf_put(b, sep.s, sep.n);
            sb_str(r, b, &v.l->it[i]);
        }
        return sb_val(r, b);
    }
    if (name_is(e, "default") || name_is(e, "d")) {
        val bl = arg(&a, 1, "boolean");
        if (v.t == V_UNDEF || (truthy(&bl) && !truthy(&v))) {
            val d = arg(&a, 0, "default_value");
            return d.t == V_UNDEF ? v_str("", 0) : d;
        }
        return v;
    }
    if (name_is(e, "reverse")) {
        val none = NONE, m1 = v_int(-1);
        return slice(r, v, none, none, m1);
    }
    if (name_is(e, "list")) {
        if (v.t == V_LIST) return v;
        if (v.t == V_STR) {
            size_t c, *off = cp_offsets(&r->ar, v.s, v.n, &c);
            jlist *l = list_new(&r->ar, c);
            for (size_t i = 0; i < c; i++)
                l->it[i] = v_str(v.s + off[i], off[i + 1] - off[i]);
            return (val){ .t = V_LIST, .l = l };
        }
        if (v.t == V_DICT) {
            val m = { .t = V_METHOD, .s = "keys", .recv = &v };
            return call_method(r, &m, &a);
        }
        rfail(r, "list of a %s", type_name(&v));
    }
    if (name_is(e, "items")) {
        if (v.t != V_DICT) rfail(r, "items of a %s", type_name(&v));
        val m = { .t = V_METHOD, .s = "items", .recv = &v };
        return call_method(r, &m, &a);
    }
    if (name_is(e, "selectattr") || name_is(e, "rejectattr") || name_is(e, "select") ||
        name_is(e, "reject") || name_is(e, "map")) {
        int attr = e->name[e->nn - 1] == 'r' && !name_is(e, "map"); /* ...attr */
        int keep_if = e->name[0] == 's';
        if (v.t == V_UNDEF) return list_of(r, NULL, 0);
        if (v.t != V_LIST) rfail(r, "%.*s of a %s", (int)e->nn, e->name, type_name(&v));
        if (name_is(e, "map")) {
            val at = arg(&a, -1, "attribute"), dflt = arg(&a, -1, "default");
            if (at.t != V_STR) rfail(r, "map: only map(attribute='name') is supported");
            jlist *l = list_new(&r->ar, v.l->n);
            for (size_t i = 0; i < v.l->n; i++) {
                val x = get_item(r, v.l->it[i], at);
                l->it[i] = x.t == V_UNDEF && dflt.t != V_UNDEF ? dflt : x;
            }
            return (val){ .t = V_LIST, .l = l };
        }
        int first = attr ? 1 : 0; /* the test name's position */
        val at = attr ? arg(&a, 0, NULL) : UNDEF, tn = arg(&a, first, NULL);
        if (attr && at.t != V_STR)
            rfail(r, "%.*s needs an attribute name", (int)e->nn, e->name);
        if (tn.t != V_UNDEF && tn.t != V_STR)
            rfail(r, "%.*s needs a test name", (int)e->nn, e->name);
        args targs = { .v = a.v + first + 1, .n = a.n > first + 1 ? a.n - first - 1 : 0 };
        jlist *l = list_new(&r->ar, v.l->n);
        size_t n = 0;
        for (size_t i = 0; i < v.l->n; i++) {
            val x = attr ? get_item(r, v.l->it[i], at) : v.l->it[i];
            int ok = tn.t == V_STR ? apply_test(r, tn.s, tn.n, x, &targs) : truthy(&x);
            if (ok == keep_if) l->it[n++] = v.l->it[i];
        }
        l->n = n;
        return (val){ .t = V_LIST, .l = l };
    }
    if (name_is(e, "capitalize")) return str_title(r, to_str(r, &v), 0); /* ASCII */
    rfail(r, "the filter '%.*s' is not supported", (int)e->nn, e->name);
}

static val binop(rctx *r, int bop, int negate, val a, val b);

/* The test called name (nn bytes) of v with the arguments a. */
static int apply_test(rctx *r, const char *name, size_t nn, val v, const args *a) {
    expr probe = { .name = name, .nn = nn };
    const expr *e = &probe;
    val a0 = a->n > 0 ? a->v[0] : UNDEF;
    if (name_is(e, "defined")) return v.t != V_UNDEF;
    if (name_is(e, "undefined")) return v.t == V_UNDEF;
    if (name_is(e, "none")) return v.t == V_NONE;
    if (name_is(e, "string")) return v.t == V_STR;
    if (name_is(e, "number")) return v.t == V_INT || v.t == V_BOOL;
    if (name_is(e, "integer")) return v.t == V_INT;
    if (name_is(e, "boolean")) return v.t == V_BOOL;
    if (name_is(e, "true")) return v.t == V_BOOL && v.i;
    if (name_is(e, "false")) return v.t == V_BOOL && !v.i;
    if (name_is(e, "mapping")) return v.t == V_DICT;
    if (name_is(e, "sequence") || name_is(e, "iterable"))
        return v.t == V_STR || v.t == V_LIST || v.t == V_DICT;
    if (name_is(e, "odd") || name_is(e, "even")) {
        if (v.t != V_INT) rfail(r, "'%.*s' of a %s", (int)e->nn, e->name, type_name(&v));
        return (int)(v.i & 1) == name_is(e, "odd");
    }
    if (name_is(e, "eq") || name_is(e, "equalto") || name_is(e, "=="))
        return equal(&v, &a0);
    if (name_is(e, "ne") || name_is(e, "!=")) return !equal(&v, &a0);
    if (name_is(e, "in")) {
        val in = binop(r, B_IN, 0, v, a0);
        return (int)in.i;
    }
    rfail(r, "the test '%.*s' is not supported", (int)e->nn, e->name);
}

static int test(rctx *r, scope *s, const expr *e) {
    val v = eval(r, s, e->a);
    args a = eval_args(r, s, e);
    return apply_test(r, e->name, e->nn, v, &a);
}

static int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static val binop(rctx *r, int bop, int negate, val a, val b) {
    static const char *const names[] = { "+",  "-", "*", "//", "%",  "~", "==",
                                         "!=", "<", ">", "<=", ">=", "in" };
    switch (bop) {
    case B_EQ: return v_bool(equal(&a, &b));
    case B_NE: return v_bool(!equal(&a, &b));
    case B_LT: return v_bool(compare(r, &a, &b, "<") < 0);
    case B_GT: return v_bool(compare(r, &a, &b, ">") > 0);
    case B_LE: return v_bool(compare(r, &a, &b, "<=") <= 0);
    case B_GE: return v_bool(compare(r, &a, &b, ">=") >= 0);
    case B_CAT: {
        strbuf *sb = tmp_sb(r);
        strbuf_put(sb, "", 0);
        sb_str(r, sb, &a);
        sb_str(r, sb, &b);
        return sb_val(r, sb);
    }
    case B_IN: {
        int in = 0;
        if (b.t == V_STR && a.t == V_STR)
            in = memfind(b.s, b.n, a.s, a.n) != NULL;
        else if (b.t == V_LIST)
            for (size_t i = 0; i < b.l->n && !in; i++) in = equal(&a, &b.l->it[i]);
        else if (b.t == V_DICT && a.t == V_STR)
            in = dict_find(b.d, a.s, a.n) != NULL;
        else
            rfail(r, "'in' of a %s in a %s", type_name(&a), type_name(&b));
        return v_bool(in != negate);
    }
    default: break;
    }
    int an = a.t == V_INT || a.t == V_BOOL, bn = b.t == V_INT || b.t == V_BOOL;
    if (an && bn) {
        int64_t x = a.i, y = b.i, z = 0;
        int ovf = 0;
        switch (bop) {
        case B_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
        case B_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
        case B_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
        case B_FLOORDIV:
        case B_MOD:
            if (y == 0) rfail(r, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) ovf = 1;
            if (!ovf) z = bop == B_FLOORDIV ? floordiv(x, y) : x - floordiv(x, y) * y;
            break;
        default: break;
        }
        if (ovf) rfail(r, "integer overflow in '%s'", names[bop]);
        return v_int(z);
    }
    if (bop == B_ADD && a.t == V_STR && b.t == V_STR) {
        char *o = ar_alloc(&r->ar, a.n + b.n + 1);
        if (a.n) memcpy(o, a.s, a.n);
        if (b.n) memcpy(o + a.n, b.s, b.n);
        return v_str(o, a.n + b.n);
    }
    if (bop == B_ADD && a.t == V_LIST && b.t == V_LIST) {
        jlist *l = list_new(&r->ar, a.l->n + b.l->n);
        if (a.l->n) memcpy(l->it, a.l->it, a.l->n * sizeof *l->it);
        if (b.l->n) memcpy(l->it + a.l->n, b.l->it, b.l->n * sizeof *l->it);
        return (val){ .t = V_LIST, .l = l };
    }
    if (bop == B_MUL && a.t == V_STR && b.t == V_INT) {
        int64_t k = b.i < 0 ? 0 : b.i;
        if (a.n && (uint64_t)k > MAX_OUTPUT / a.n) rfail(r, "a string too long");
        strbuf *sb = tmp_sb(r);
        strbuf_put(sb, "", 0);
        for (int64_t i = 0; i < k; i++) strbuf_put(sb, a.s, a.n);
        return sb_val(r, sb);
    }
    rfail(r, "'%s' between a %s and a %s", names[bop], type_name(&a), type_name(&b));
}

static val eval(rctx *r, scope *s, const expr *e) {
    if (++r->depth > MAX_DEPTH) rfail(r, "evaluation nested too deeply");
    step(r);
    r->line = e->line;
    val v;
    switch (e->op) {
    case E_LIT: v = e->lit; break;
    case E_VAR: v = lookup(s, e->name, e->nn); break;
    case E_ATTR: v = get_attr(r, eval(r, s, e->a), e->name, e->nn); break;
    case E_ITEM: {
        val o = eval(r, s, e->a);
        v = get_item(r, o, eval(r, s, e->b));
        break;
    }
    case E_SLICE: {
        val o = eval(r, s, e->a);
        val st = e->b ? eval(r, s, e->b) : NONE, sp = e->c ? eval(r, s, e->c) : NONE,
            sd = e->d ? eval(r, s, e->d) : NONE;
        v = slice(r, o, st, sp, sd);
        break;
    }
    case E_CALL: v = call(r, s, e); break;
    case E_FILTER: v = filter(r, s, e); break;
    case E_TEST: v = v_bool(test(r, s, e) != e->negate); break;
    case E_NOT: {
        val x = eval(r, s, e->a);
        v = v_bool(!truthy(&x));
        break;
    }
    case E_NEG: {
        val x = eval(r, s, e->a);
        if (x.t != V_INT && x.t != V_BOOL) rfail(r, "'-' of a %s", type_name(&x));
        if (x.i == INT64_MIN) rfail(r, "integer overflow in '-'");
        v = v_int(-x.i);
        break;
    }
    case E_BIN: {
        val a = eval(r, s, e->a);
        val b = eval(r, s, e->b);
        r->line = e->line;
        v = binop(r, e->bop, e->negate, a, b);
        break;
    }
    case E_AND: {
        v = eval(r, s, e->a);
        if (truthy(&v)) v = eval(r, s, e->b);
        break;
    }
    case E_OR: {
        v = eval(r, s, e->a);
        if (!truthy(&v)) v = eval(r, s, e->b);
        break;
    }
    case E_COND: {
        val c = eval(r, s, e->b);
        v = truthy(&c) ? eval(r, s, e->a) : e->c ? eval(r, s, e->c) : UNDEF;
        break;
    }
    case E_LIST: {
        jlist *l = list_new(&r->ar, (size_t)e->nargs);
        for (int i = 0; i < e->nargs; i++) l->it[i] = eval(r, s, e->args[i]);
        v = (val){ .t = V_LIST, .l = l };
        break;
    }
    default: { /* E_DICT */
        jdict *d = dict_new(&r->ar);
        for (int i = 0; i + 1 < e->nargs; i += 2) {
            val k = eval(r, s, e->args[i]);
            if (k.t != V_STR)
                rfail(r, "dict keys must be strings, not %s", type_name(&k));
            dict_set(&r->ar, d, k.s, k.n, eval(r, s, e->args[i + 1]));
        }
        v = (val){ .t = V_DICT, .d = d };
        break;
    }
    }
    r->depth--;
    return v;
}

static void emit(rctx *r, const char *s, size_t n) {
    if (r->out->len + n > MAX_OUTPUT)
        rfail(r, "the rendered text is over %zu bytes", MAX_OUTPUT);
    if (n) strbuf_put(r->out, s, n);
}

static void exec_nodes(rctx *r, scope *s, const node *n);

/* The loop variable(s) of n for item (for a, b in ...: item unpacked). */
static void bind_loop_vars(rctx *r, scope *sc, const node *n, val item) {
    if (!n->n_more) {
        dict_set(&r->ar, &sc->vars, n->var, n->vn, item);
        return;
    }
    size_t want = (size_t)n->n_more + 1;
    if (item.t != V_LIST || item.l->n != want)
        rfail(r, "cannot unpack a %s into %zu loop variables", type_name(&item), want);
    dict_set(&r->ar, &sc->vars, n->var, n->vn, item.l->it[0]);
    for (int k = 0; k < n->n_more; k++)
        dict_set(&r->ar, &sc->vars, n->more[k], n->more_n[k], item.l->it[k + 1]);
}

static void exec_for(rctx *r, scope *s, const node *n) {
    val it = eval(r, s, n->e);
    val items;
    if (it.t == V_LIST) {
        items = it;
    } else if (it.t == V_UNDEF) {
        items = list_of(r, NULL, 0);
    } else if (it.t == V_DICT && !it.d->ns) {
        val m = { .t = V_METHOD, .s = "keys", .recv = &it };
        args none = { 0 };
        items = call_method(r, &m, &none);
    } else if (it.t == V_STR) {
        size_t c, *off = cp_offsets(&r->ar, it.s, it.n, &c);
        jlist *l = list_new(&r->ar, c);
        for (size_t i = 0; i < c; i++)
            l->it[i] = v_str(it.s + off[i], off[i + 1] - off[i]);
        items = (val){ .t = V_LIST, .l = l };
    } else {
        rfail(r, "cannot loop over a %s", type_name(&it));
    }
    if (n->filter) { /* for x in xs if c: the loop sees the items that pass */
        jlist *kept = list_new(&r->ar, items.l->n);
        size_t k = 0;
        for (size_t i = 0; i < items.l->n; i++) {
            scope probe = { .parent = s };
            bind_loop_vars(r, &probe, n, items.l->it[i]);
            val c = eval(r, &probe, n->filter);
            if (truthy(&c)) kept->it[k++] = items.l->it[i];
        }
        kept->n = k;
        items = (val){ .t = V_LIST, .l = kept };
    }
    size_t len = items.l->n;
    if (len == 0 && n->els) {
        exec_nodes(r, s, n->els);
        return;
    }
    for (size_t i = 0; i < len; i++) {
        scope inner = { .parent = s };
        jdict *loop = dict_new(&r->ar);
        dict_set(&r->ar, loop, "index", 5, v_int((int64_t)i + 1));
        dict_set(&r->ar, loop, "index0", 6, v_int((int64_t)i));
        dict_set(&r->ar, loop, "revindex", 8, v_int((int64_t)(len - i)));
        dict_set(&r->ar, loop, "revindex0", 9, v_int((int64_t)(len - i - 1)));
        dict_set(&r->ar, loop, "first", 5, v_bool(i == 0));
        dict_set(&r->ar, loop, "last", 4, v_bool(i + 1 == len));
        dict_set(&r->ar, loop, "length", 6, v_int((int64_t)len));
        dict_set(&r->ar, loop, "previtem", 8, i ? items.l->it[i - 1] : UNDEF);
        dict_set(&r->ar, loop, "nextitem", 8, i + 1 < len ? items.l->it[i + 1] : UNDEF);
        dict_set(&r->ar, &inner.vars, "loop", 4, (val){ .t = V_DICT, .d = loop });
        bind_loop_vars(r, &inner, n, items.l->it[i]);
        exec_nodes(r, &inner, n->body);
    }
}

static void step(rctx *r) {
    if (++r->steps > MAX_STEPS)
        rfail(r, "the template takes more than %llu steps", MAX_STEPS);
}

static void exec_nodes(rctx *r, scope *s, const node *n) {
    if (++r->depth > MAX_DEPTH) rfail(r, "blocks nested too deeply");
    for (; n; n = n->next) {
        step(r);
        r->line = n->line;
        switch (n->kind) {
        case N_TEXT: emit(r, n->text, n->n); break;
        case N_OUT: {
            val v = eval(r, s, n->e);
            if (v.t == V_STR) {
                emit(r, v.s, v.n);
            } else {
                val t = to_str(r, &v);
                emit(r, t.s, t.n);
            }
            break;
        }
        case N_IF: { /* an elif is an if in the else */
            val v = eval(r, s, n->e);
            exec_nodes(r, s, truthy(&v) ? n->body : n->els);
            break;
        }
        case N_FOR: exec_for(r, s, n); break;
        default: { /* N_SET */
            val v = eval(r, s, n->e);
            if (n->attr) {
                val ns = lookup(s, n->var, n->vn);
                if (ns.t != V_DICT || !ns.d->ns)
                    rfail(r, "'set %.*s.%.*s': %.*s is not a namespace", (int)n->vn,
                          n->var, (int)n->an, n->attr, (int)n->vn, n->var);
                dict_set(&r->ar, ns.d, n->attr, n->an, v);
            } else {
                dict_set(&r->ar, &s->vars, n->var, n->vn, v);
            }
            break;
        }
        }
    }
    r->depth--;
}

int jinja_render(const jinja_template *t, const cJSON *vars, strbuf *out, char *err,
                 size_t err_cap) {
    rctx *r = calloc(1, sizeof *r);
    if (!r) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    size_t start = out->len;
    r->ar.fail = &r->f;
    r->out = out;
    if (setjmp(r->f.jb)) {
        util_set_err(err, err_cap, "%s", r->f.msg);
        if (out->p) {
            out->len = start;
            out->p[start] = '\0';
        }
        free_temps(r);
        ar_free(&r->ar);
        free(r);
        return -1;
    }
    scope root = { 0 };
    dict_set(&r->ar, &root.vars, "namespace", 9, (val){ .t = V_FUNC, .i = F_NAMESPACE });
    dict_set(&r->ar, &root.vars, "raise_exception", 15,
             (val){ .t = V_FUNC, .i = F_RAISE });
    dict_set(&r->ar, &root.vars, "range", 5, (val){ .t = V_FUNC, .i = F_RANGE });
    dict_set(&r->ar, &root.vars, "strftime_now", 12,
             (val){ .t = V_FUNC, .i = F_STRFTIME });
    const cJSON *it;
    cJSON_ArrayForEach(it, vars) {
        dict_set(&r->ar, &root.vars, it->string, strlen(it->string),
                 from_json(&r->ar, it));
    }
    exec_nodes(r, &root, t->root);
    int oom = out->oom;
    free_temps(r);
    ar_free(&r->ar);
    free(r);
    if (oom) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    return 0;
}
