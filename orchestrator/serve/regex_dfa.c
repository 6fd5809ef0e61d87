/*
 * regex_dfa.c - regex -> AST -> byte NFA -> DFA (subset construction over
 * byte classes) -> live states only. See regex_dfa.h.
 */
#include "orchestrator/serve/regex_dfa.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

/* ------------------------------------------------------------------------- */
/* Codepoint sets                                                             */
/* ------------------------------------------------------------------------- */
typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

typedef struct cp_set {
    cp_range *r;
    uint32_t n, cap;
    int oom;
} cp_set;

#define CP_MAX 0x10FFFFu

static void cs_add(cp_set *s, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    if (s->n == s->cap) {
        uint32_t c = s->cap ? s->cap * 2 : 8;
        cp_range *p = realloc(s->r, c * sizeof *p);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->r = p;
        s->cap = c;
    }
    s->r[s->n++] = (cp_range){ lo, hi };
}

static int cmp_range(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge overlapping / adjacent ranges. */
static void cs_normalize(cp_set *s) {
    if (s->n < 2) return;
    qsort(s->r, s->n, sizeof *s->r, cmp_range);
    uint32_t k = 0;
    for (uint32_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi) s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

static void cs_negate(cp_set *s) {
    cs_normalize(s);
    cp_set o = { 0 };
    uint32_t next = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) cs_add(&o, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX) cs_add(&o, next, CP_MAX);
    o.oom |= s->oom;
    free(s->r);
    *s = o;
}

static void cs_add_class(cp_set *s, char c) {
    switch (c) {
    case 'd': cs_add(s, '0', '9'); break;
    case 'w':
        cs_add(s, '0', '9');
        cs_add(s, 'A', 'Z');
        cs_add(s, 'a', 'z');
        cs_add(s, '_', '_');
        break;
    default: /* s */
        cs_add(s, '\t', '\r');
        cs_add(s, ' ', ' ');
        break;
    }
}

/* ------------------------------------------------------------------------- */
/* AST                                                                        */
/* ------------------------------------------------------------------------- */
enum { N_EMPTY, N_SEQ, N_CAT, N_ALT, N_REP };
#define SEQ_MAX  8
#define REP_INF  UINT32_MAX
#define MAX_NEST 200

typedef struct node {
    int type;
    int kid, last, sib; /* children: first, last; next sibling */
    uint32_t min, max;  /* N_REP */
    uint8_t lo[SEQ_MAX], hi[SEQ_MAX];
    int len; /* N_SEQ */
} node;

typedef struct parser {
    const char *s;
    size_t n, i;
    node *nodes;
    uint32_t n_nodes, cap;
    int failed, oom, depth, jmode;
    char *err;
    size_t err_cap;
} parser;

static int perr(parser *p, const char *fmt, ...) {
    if (!p->failed) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        util_set_err(p->err, p->err_cap, "at byte %zu: %s", p->i, msg);
    }
    p->failed = 1;
    return -1;
}

static int new_node(parser *p, int type) {
    if (p->failed) return -1;
    if (p->n_nodes == p->cap) {
        uint32_t c = p->cap ? p->cap * 2 : 64;
        if (c > 4u * REGEX_MAX_NFA) return perr(p, "the expression is too large");
        node *x = realloc(p->nodes, c * sizeof *x);
        if (!x) {
            p->oom = 1;
            return perr(p, "out of memory");
        }
        p->nodes = x;
        p->cap = c;
    }
    node *nd = &p->nodes[p->n_nodes];
    memset(nd, 0, sizeof *nd);
    nd->type = type;
    nd->kid = nd->last = nd->sib = -1;
    return (int)p->n_nodes++;
}

static void add_kid(parser *p, int parent, int kid) {
    if (parent < 0 || kid < 0) return;
    node *pa = &p->nodes[parent];
    if (pa->last < 0)
        pa->kid = kid;
    else
        p->nodes[pa->last].sib = kid;
    p->nodes[parent].last = kid;
}

static int seq_node(parser *p, const uint8_t *lo, const uint8_t *hi, int len) {
    int k = new_node(p, N_SEQ);
    if (k < 0) return -1;
    memcpy(p->nodes[k].lo, lo, (size_t)len);
    memcpy(p->nodes[k].hi, hi, (size_t)len);
    p->nodes[k].len = len;
    return k;
}

static int utf8_encode(uint32_t c, uint8_t *b) {
    if (c < 0x80) {
        b[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        b[0] = (uint8_t)(0xC0 | (c >> 6));
        b[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (c >> 12));
        b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | (c >> 18));
    b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    b[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* [lo, hi] (one UTF-8 length, no surrogates) as byte-range sequences, kids
 * of alt: split until every byte position ranges independently. */
static void utf8_split(parser *p, int alt, uint32_t lo, uint32_t hi) {
    static const uint32_t lens[3] = { 0x7F, 0x7FF, 0xFFFF };
    if (lo > hi || p->failed) return;
    for (int i = 0; i < 3; i++)
        if (lo <= lens[i] && hi > lens[i]) {
            utf8_split(p, alt, lo, lens[i]);
            utf8_split(p, alt, lens[i] + 1, hi);
            return;
        }
    if (hi >= 0x80)
        for (int m = 1; m < 4; m++) {
            uint32_t mask = (1u << (6 * m)) - 1;
            if ((lo & ~mask) != (hi & ~mask)) {
                if ((lo & mask) != 0) {
                    utf8_split(p, alt, lo, lo | mask);
                    utf8_split(p, alt, (lo | mask) + 1, hi);
                    return;
                }
                if ((hi & mask) != mask) {
                    utf8_split(p, alt, lo, (hi & ~mask) - 1);
                    utf8_split(p, alt, hi & ~mask, hi);
                    return;
                }
            }
        }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    add_kid(p, alt, seq_node(p, a, b, n));
}

/* The JSON escape of a special character (control, '"', '\\') in buf. */
static int json_escape_of(uint32_t c, uint8_t *buf) {
    static const char hex[] = "0123456789abcdef";
    buf[0] = '\\';
    switch (c) {
    case '"': buf[1] = '"'; return 2;
    case '\\': buf[1] = '\\'; return 2;
    case '\b': buf[1] = 'b'; return 2;
    case '\f': buf[1] = 'f'; return 2;
    case '\n': buf[1] = 'n'; return 2;
    case '\r': buf[1] = 'r'; return 2;
    case '\t': buf[1] = 't'; return 2;
    default:
        memcpy(buf + 1, "u00", 3);
        buf[4] = (uint8_t)hex[(c >> 4) & 15];
        buf[5] = (uint8_t)hex[c & 15];
        return 6;
    }
}

static int is_json_special(uint32_t c) { return c < 0x20 || c == '"' || c == '\\'; }

/* A codepoint set as an alternation of byte sequences (surrogates never
 * match; in J mode specials become their JSON escapes). The set is freed. */
static int set_node(parser *p, cp_set *s) {
    if (s->oom) {
        free(s->r);
        p->oom = 1;
        return perr(p, "out of memory");
    }
    cs_normalize(s);
    int alt = new_node(p, N_ALT);
    for (uint32_t i = 0; i < s->n && alt >= 0; i++) {
        uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
        if (p->jmode) {
            for (uint32_t c = lo; c <= hi && c < 0x80; c++)
                if (is_json_special(c)) {
                    uint8_t e[SEQ_MAX];
                    int n = json_escape_of(c, e);
                    add_kid(p, alt, seq_node(p, e, e, n));
                }
        }
        /* plain parts: [lo, hi] minus surrogates (and specials in J mode) */
        uint32_t cuts[4][2];
        int nc = 0;
        if (p->jmode) {
            cuts[nc][0] = 0;
            cuts[nc++][1] = 0x1F;
            cuts[nc][0] = '"';
            cuts[nc++][1] = '"';
            cuts[nc][0] = '\\';
            cuts[nc++][1] = '\\';
        }
        cuts[nc][0] = 0xD800;
        cuts[nc++][1] = 0xDFFF;
        uint32_t from = lo;
        for (int k = 0; k < nc && from <= hi; k++) {
            if (cuts[k][1] < from || cuts[k][0] > hi) continue;
            if (cuts[k][0] > from) utf8_split(p, alt, from, cuts[k][0] - 1);
            from = cuts[k][1] + 1;
        }
        if (from <= hi) utf8_split(p, alt, from, hi);
    }
    free(s->r);
    return p->failed ? -1 : alt;
}

static int char_node(parser *p, uint32_t c) {
    cp_set s = { 0 };
    cs_add(&s, c, c);
    return set_node(p, &s);
}

/* Decode one UTF-8 character at p->i. */
static int next_cp(parser *p, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)p->s + p->i;
    size_t left = p->n - p->i;
    uint32_t c = u[0];
    int n = c < 0x80             ? 1
            : (c & 0xE0) == 0xC0 ? 2
            : (c & 0xF0) == 0xE0 ? 3
            : (c & 0xF8) == 0xF0 ? 4
                                 : 0;
    if (n == 0 || (size_t)n > left) return perr(p, "invalid UTF-8");
    if (n > 1) c &= 0xFFu >> (n + 1);
    for (int k = 1; k < n; k++) {
        if ((u[k] & 0xC0) != 0x80) return perr(p, "invalid UTF-8");
        c = (c << 6) | (u[k] & 0x3F);
    }
    static const uint32_t min_of[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (c < min_of[n] || c > CP_MAX || (c >= 0xD800 && c <= 0xDFFF))
        return perr(p, "invalid UTF-8");
    p->i += (size_t)n;
    *cp = c;
    return 0;
}

static int hex_digits(parser *p, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < n; k++) {
        if (p->i >= p->n) return perr(p, "incomplete escape");
        char c = p->s[p->i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return perr(p, "invalid hex digit in escape");
        v = v * 16 + (uint32_t)d;
        p->i++;
    }
    *out = v;
    return 0;
}

/* After a backslash: 1 = a class (added to set), 0 = a codepoint, -1. */
static int parse_escape(parser *p, int in_class, cp_set *set, uint32_t *cp) {
    if (p->i >= p->n) return perr(p, "trailing backslash");
    char c = p->s[p->i];
    if ((unsigned char)c >= 0x80) return next_cp(p, cp);
    p->i++;
    switch (c) {
    case 'd':
    case 'w':
    case 's': cs_add_class(set, c); return 1;
    case 'D':
    case 'W':
    case 'S': {
        cp_set t = { 0 };
        cs_add_class(&t, (char)(c + 32));
        cs_negate(&t);
        for (uint32_t k = 0; k < t.n; k++) cs_add(set, t.r[k].lo, t.r[k].hi);
        set->oom |= t.oom;
        free(t.r);
        return 1;
    }
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return hex_digits(p, 2, cp);
    case 'u': {
        if (hex_digits(p, 4, cp)) return -1;
        if (*cp >= 0xD800 && *cp <= 0xDBFF && p->i + 1 < p->n && p->s[p->i] == '\\' &&
            p->s[p->i + 1] == 'u') {
            uint32_t lo;
            p->i += 2;
            if (hex_digits(p, 4, &lo)) return -1;
            if (lo < 0xDC00 || lo > 0xDFFF) return perr(p, "invalid surrogate pair");
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (*cp >= 0xD800 && *cp <= 0xDFFF) {
            return perr(p, "a lone surrogate escape is not supported");
        }
        return 0;
    }
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        return perr(p, "word boundaries (\\b) are not supported");
    case 'B': return perr(p, "word boundaries (\\B) are not supported");
    default: break;
    }
    if (c >= '1' && c <= '9') return perr(p, "backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return perr(p, "the escape \\%c is not supported", c);
    *cp = (unsigned char)c;
    return 0;
}

static int parse_class(parser *p) {
    p->i++; /* '[' */
    int neg = 0;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = 1;
        p->i++;
    }
    cp_set s = { 0 };
    int first = 1;
    for (;;) {
        if (p->i >= p->n) {
            free(s.r);
            return perr(p, "unterminated character class");
        }
        if (p->s[p->i] == ']' && !first) break;
        first = 0;
        uint32_t lo;
        int k = 0;
        if (p->s[p->i] == '\\') {
            p->i++;
            k = parse_escape(p, 1, &s, &lo);
        } else {
            k = next_cp(p, &lo);
        }
        if (k < 0) {
            free(s.r);
            return -1;
        }
        if (k == 1) continue;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            uint32_t hi;
            int k2;
            if (p->s[p->i] == '\\') {
                p->i++;
                cp_set junk = { 0 };
                k2 = parse_escape(p, 1, &junk, &hi);
                free(junk.r);
                if (k2 == 1) k2 = perr(p, "a class escape cannot end a range");
            } else {
                k2 = next_cp(p, &hi);
            }
            if (k2 < 0) {
                free(s.r);
                return -1;
            }
            if (hi < lo) {
                free(s.r);
                return perr(p, "reversed range in character class");
            }
            cs_add(&s, lo, hi);
        } else {
            cs_add(&s, lo, lo);
        }
    }
    p->i++; /* ']' */
    if (neg) cs_negate(&s);
    return set_node(p, &s);
}

static int parse_alt(parser *p);

static int parse_group(parser *p) {
    if (++p->depth > MAX_NEST) return perr(p, "groups nested too deeply");
    p->i++; /* '(' */
    int saved_j = p->jmode;
    const char *r = p->s + p->i;
    size_t left = p->n - p->i;
    if (left >= 1 && r[0] == '?') {
        if (left >= 2 && r[1] == ':') {
            p->i += 2;
        } else if (left >= 3 && r[1] == 'J' && r[2] == ':') {
            p->i += 3;
            p->jmode = 1;
        } else if (left >= 2 && (r[1] == '=' || r[1] == '!')) {
            return perr(p, "lookahead is not supported");
        } else if (left >= 3 && r[1] == '<' && (r[2] == '=' || r[2] == '!')) {
            return perr(p, "lookbehind is not supported");
        } else if (left >= 2 &&
                   (r[1] == '<' || (r[1] == 'P' && left >= 3 && r[2] == '<'))) {
            const char *gt = memchr(r, '>', left);
            if (!gt) return perr(p, "unterminated group name");
            p->i += (size_t)(gt - r) + 1;
        } else {
            return perr(p, "this group syntax is not supported");
        }
    }
    int inner = parse_alt(p);
    if (inner < 0) return -1;
    if (p->i >= p->n || p->s[p->i] != ')') return perr(p, "missing )");
    p->i++;
    p->jmode = saved_j;
    p->depth--;
    return inner;
}

static int parse_atom(parser *p) {
    char c = p->s[p->i];
    switch (c) {
    case '(': return parse_group(p);
    case '[': return parse_class(p);
    case '.': {
        p->i++;
        cp_set s = { 0 };
        cs_add(&s, '\n', '\n');
        cs_add(&s, '\r', '\r');
        cs_negate(&s);
        return set_node(p, &s);
    }
    case '^':
        if (p->i != 0) return perr(p, "'^' is only supported at the start");
        p->i++;
        return new_node(p, N_EMPTY);
    case '$':
        if (p->i + 1 != p->n) return perr(p, "'$' is only supported at the end");
        p->i++;
        return new_node(p, N_EMPTY);
    case '*':
    case '+':
    case '?':
    case '{': return perr(p, "nothing to repeat before '%c'", c);
    case '\\': {
        p->i++;
        cp_set s = { 0 };
        uint32_t cp;
        int k = parse_escape(p, 0, &s, &cp);
        if (k < 0) {
            free(s.r);
            return -1;
        }
        if (k == 0) cs_add(&s, cp, cp);
        return set_node(p, &s);
    }
    default: {
        uint32_t cp;
        if (next_cp(p, &cp)) return -1;
        return char_node(p, cp);
    }
    }
}

static int read_count(parser *p, uint32_t *v) {
    size_t start = p->i;
    uint64_t x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i] - '0');
        if (x > REGEX_MAX_REPEAT)
            return perr(p, "repeat count over %u is not supported", REGEX_MAX_REPEAT);
        p->i++;
    }
    if (p->i == start) return perr(p, "invalid repeat {...}");
    *v = (uint32_t)x;
    return 0;
}

static int parse_repeat(parser *p) {
    int a = parse_atom(p), stacked = 0;
    while (a >= 0 && p->i < p->n) {
        char c = p->s[p->i];
        uint32_t mn, mx;
        if (c == '*' || c == '+' || c == '?') {
            mn = c == '+';
            mx = c == '?' ? 1 : REP_INF;
            p->i++;
        } else if (c == '{') {
            p->i++;
            if (read_count(p, &mn)) return -1;
            mx = mn;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                if (p->i < p->n && p->s[p->i] == '}')
                    mx = REP_INF;
                else if (read_count(p, &mx))
                    return -1;
            }
            if (p->i >= p->n || p->s[p->i] != '}') return perr(p, "invalid repeat {...}");
            p->i++;
            if (mx < mn) return perr(p, "repeat {%u,%u} has max < min", mn, mx);
        } else {
            break;
        }
        if (++stacked > 2) return perr(p, "more than two quantifiers in a row");
        if (p->i < p->n && p->s[p->i] == '?') p->i++; /* lazy: same language */
        if (p->i < p->n && p->s[p->i] == '+')
            return perr(p, "possessive quantifiers are not supported");
        int r = new_node(p, N_REP);
        if (r < 0) return -1;
        p->nodes[r].min = mn;
        p->nodes[r].max = mx;
        add_kid(p, r, a);
        a = r;
    }
    return a;
}

static int parse_cat(parser *p) {
    int cat = new_node(p, N_CAT);
    while (cat >= 0 && !p->failed && p->i < p->n && p->s[p->i] != '|' &&
           p->s[p->i] != ')')
        add_kid(p, cat, parse_repeat(p));
    return p->failed ? -1 : cat;
}

static int parse_alt(parser *p) {
    int first = parse_cat(p);
    if (first < 0 || p->i >= p->n || p->s[p->i] != '|') return first;
    int alt = new_node(p, N_ALT);
    add_kid(p, alt, first);
    while (!p->failed && p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        add_kid(p, alt, parse_cat(p));
    }
    return p->failed ? -1 : alt;
}

static int parse_all(parser *p) {
    int root = parse_alt(p);
    if (root >= 0 && p->i < p->n) return perr(p, "unmatched )");
    return root;
}

int regex_syntax_check(const char *re, size_t len, char *err, size_t err_cap) {
    parser p = { .s = re, .n = len, .err = err, .err_cap = err_cap };
    int root = parse_all(&p);
    free(p.nodes);
    return root < 0 ? -1 : 0;
}

/* ------------------------------------------------------------------------- */
/* NFA                                                                        */
/* ------------------------------------------------------------------------- */
enum { K_RANGE, K_SPLIT, K_MATCH };

typedef struct nstate {
    uint8_t kind, lo, hi;
    int32_t out, out1;
} nstate;

typedef struct nfa {
    nstate *st;
    uint32_t n, cap;
    int failed;
} nfa;

static int32_t nfa_add(nfa *a, int kind, uint8_t lo, uint8_t hi, int32_t out,
                       int32_t out1) {
    if (a->failed) return 0;
    if (a->n == a->cap) {
        uint32_t c = a->cap ? a->cap * 2 : 256;
        if (a->n >= REGEX_MAX_NFA) {
            a->failed = 1;
            return 0;
        }
        nstate *x = realloc(a->st, c * sizeof *x);
        if (!x) {
            a->failed = 2;
            return 0;
        }
        a->st = x;
        a->cap = c;
    }
    a->st[a->n] = (nstate){ (uint8_t)kind, lo, hi, out, out1 };
    return (int32_t)a->n++;
}

/* Build node k so that it continues at next; returns its start state. */
static int32_t build(nfa *a, const parser *p, int k, int32_t next) {
    if (a->failed) return 0;
    const node *nd = &p->nodes[k];
    switch (nd->type) {
    case N_EMPTY: return next;
    case N_SEQ: {
        int32_t cur = next;
        for (int i = nd->len; i-- > 0;)
            cur = nfa_add(a, K_RANGE, nd->lo[i], nd->hi[i], cur, -1);
        return cur;
    }
    case N_CAT: {
        /* children right to left: collect them first */
        int n = 0;
        for (int c = nd->kid; c >= 0; c = p->nodes[c].sib) n++;
        if (n == 0) return next;
        int *kids = malloc((size_t)n * sizeof *kids);
        if (!kids) {
            a->failed = 2;
            return 0;
        }
        n = 0;
        for (int c = nd->kid; c >= 0; c = p->nodes[c].sib) kids[n++] = c;
        int32_t cur = next;
        while (n-- > 0) cur = build(a, p, kids[n], cur);
        free(kids);
        return cur;
    }
    case N_ALT: {
        if (nd->kid < 0) return nfa_add(a, K_RANGE, 1, 0, next, -1); /* never */
        int32_t cur = -1;
        for (int c = nd->kid; c >= 0; c = p->nodes[c].sib) {
            int32_t s = build(a, p, c, next);
            cur = cur < 0 ? s : nfa_add(a, K_SPLIT, 0, 0, s, cur);
        }
        return cur;
    }
    default: { /* N_REP */
        int32_t cur = next;
        if (nd->max == REP_INF) {
            int32_t loop = nfa_add(a, K_SPLIT, 0, 0, -1, next);
            int32_t body = build(a, p, nd->kid, loop);
            if (a->failed) return 0;
            a->st[loop].out = body;
            cur = loop;
        } else {
            for (uint32_t i = nd->min; i < nd->max && !a->failed; i++) {
                int32_t body = build(a, p, nd->kid, cur);
                cur = nfa_add(a, K_SPLIT, 0, 0, body, next);
            }
        }
        for (uint32_t i = 0; i < nd->min && !a->failed; i++)
            cur = build(a, p, nd->kid, cur);
        return cur;
    }
    }
}

/* ------------------------------------------------------------------------- */
/* DFA                                                                        */
/* ------------------------------------------------------------------------- */
struct regex_dfa {
    uint32_t n_states, n_classes;
    uint8_t class_of[256];
    int32_t *trans;  /* [n_states * n_classes] */
    uint8_t *accept; /* [n_states] */
    int16_t *forced; /* [n_states] the one live byte or -1 */
};

typedef struct builder {
    const nfa *a;
    uint32_t *mark, gen;
    int32_t *stack;
    /* state sets */
    int32_t *pool;
    size_t pool_n, pool_cap;
    size_t *off;
    uint32_t *len;
    uint8_t *acc;
    uint32_t n_sets, cap_sets;
    int32_t *table; /* hash -> set id */
    uint32_t table_cap;
    int32_t *trans;
    size_t trans_cap;
    uint32_t n_classes;
    uint64_t work; /* NFA states scanned and visited (REGEX_MAX_WORK) */
    int oom;
} builder;

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return a < b ? -1 : a > b;
}

/* Epsilon closure of seeds[0..n) into out (sorted RANGE / MATCH states). */
static uint32_t closure(builder *b, const int32_t *seeds, uint32_t n, int32_t *out) {
    b->gen++;
    uint32_t sp = 0, k = 0;
    for (uint32_t i = 0; i < n; i++) b->stack[sp++] = seeds[i];
    b->work += n;
    while (sp) {
        int32_t s = b->stack[--sp];
        b->work++;
        if (s < 0 || b->mark[s] == b->gen) continue;
        b->mark[s] = b->gen;
        const nstate *st = &b->a->st[s];
        if (st->kind == K_SPLIT) {
            b->stack[sp++] = st->out;
            b->stack[sp++] = st->out1;
        } else {
            out[k++] = s;
        }
    }
    qsort(out, k, sizeof *out, cmp_i32);
    return k;
}

static uint64_t hash_set(const int32_t *s, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    return h ^ n;
}

static int table_grow(builder *b) {
    uint32_t cap = b->table_cap ? b->table_cap * 2 : 1024;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t) return -1;
    for (uint32_t i = 0; i < cap; i++) t[i] = -1;
    for (uint32_t id = 0; id < b->n_sets; id++) {
        uint64_t h = hash_set(b->pool + b->off[id], b->len[id]);
        uint32_t j = (uint32_t)h & (cap - 1);
        while (t[j] >= 0) j = (j + 1) & (cap - 1);
        t[j] = (int32_t)id;
    }
    free(b->table);
    b->table = t;
    b->table_cap = cap;
    return 0;
}

/* The DFA state of set s (added when new); -1 too many, -2 out of memory. */
static int32_t intern(builder *b, const int32_t *s, uint32_t n) {
    if ((b->n_sets + 1) * 2 > b->table_cap && table_grow(b)) return -2;
    uint64_t h = hash_set(s, n);
    uint32_t j = (uint32_t)h & (b->table_cap - 1);
    while (b->table[j] >= 0) {
        int32_t id = b->table[j];
        if (b->len[id] == n && memcmp(b->pool + b->off[id], s, n * sizeof *s) == 0)
            return id;
        j = (j + 1) & (b->table_cap - 1);
    }
    if (b->n_sets >= REGEX_MAX_DFA) return -1;
    if (b->n_sets == b->cap_sets) {
        uint32_t c = b->cap_sets ? b->cap_sets * 2 : 256;
        size_t *o = realloc(b->off, c * sizeof *o);
        if (o) b->off = o;
        uint32_t *l = realloc(b->len, c * sizeof *l);
        if (l) b->len = l;
        uint8_t *ac = realloc(b->acc, c);
        if (ac) b->acc = ac;
        if (!o || !l || !ac) return -2;
        b->cap_sets = c;
    }
    if (b->pool_n + n > b->pool_cap) {
        size_t c = b->pool_cap ? b->pool_cap * 2 : 4096;
        while (c < b->pool_n + n) c *= 2;
        int32_t *x = realloc(b->pool, c * sizeof *x);
        if (!x) return -2;
        b->pool = x;
        b->pool_cap = c;
    }
    size_t need = (size_t)(b->n_sets + 1) * b->n_classes;
    if (need > b->trans_cap) {
        size_t c = b->trans_cap ? b->trans_cap * 2 : (size_t)256 * b->n_classes;
        while (c < need) c *= 2;
        int32_t *x = realloc(b->trans, c * sizeof *x);
        if (!x) return -2;
        b->trans = x;
        b->trans_cap = c;
    }
    uint32_t id = b->n_sets++;
    memcpy(b->pool + b->pool_n, s, n * sizeof *s);
    b->off[id] = b->pool_n;
    b->len[id] = n;
    b->pool_n += n;
    b->acc[id] = 0;
    for (uint32_t i = 0; i < n; i++)
        if (b->a->st[s[i]].kind == K_MATCH) b->acc[id] = 1;
    b->table[j] = (int32_t)id;
    return (int32_t)id;
}

static void builder_free(builder *b) {
    free(b->mark);
    free(b->stack);
    free(b->pool);
    free(b->off);
    free(b->len);
    free(b->acc);
    free(b->table);
    free(b->trans);
}

/* Subset construction; 0, or -1 with err. */
static int subset(builder *b, const nfa *a, int32_t start, regex_dfa *d, char *err,
                  size_t err_cap) {
    /* byte classes from every range boundary */
    uint8_t bnd[257] = { 0 };
    for (uint32_t i = 0; i < a->n; i++)
        if (a->st[i].kind == K_RANGE && a->st[i].lo <= a->st[i].hi) {
            bnd[a->st[i].lo] = 1;
            bnd[a->st[i].hi + 1] = 1;
        }
    uint32_t c = 0;
    for (int v = 0; v < 256; v++) {
        if (v > 0 && bnd[v]) c++;
        d->class_of[v] = (uint8_t)c;
    }
    b->n_classes = d->n_classes = c + 1;
    b->a = a;
    b->mark = util_calloc(a->n, sizeof *b->mark);
    b->stack = malloc(((size_t)a->n * 3 + 2) * sizeof *b->stack);
    int32_t *set = malloc(((size_t)a->n + 1) * sizeof *set);
    int32_t *seeds = malloc(((size_t)a->n + 1) * sizeof *seeds);
    int reps[256];
    for (int v = 255; v >= 0; v--) reps[d->class_of[v]] = v; /* lowest byte */
    if (!b->mark || !b->stack || !set || !seeds) {
        free(set);
        free(seeds);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    int rc = 0;
    uint32_t n = closure(b, &start, 1, set);
    if (intern(b, set, n) < 0) rc = -2;
    for (uint32_t id = 0; rc == 0 && id < b->n_sets; id++) {
        for (uint32_t cl = 0; cl < d->n_classes && rc == 0; cl++) {
            /* states of id that move on class cl (all bytes of a class move
             * alike, so its lowest byte decides) */
            uint32_t k = 0;
            int rep = reps[cl];
            const int32_t *cur = b->pool + b->off[id];
            b->work += b->len[id];
            if (b->work > REGEX_MAX_WORK) {
                rc = -3;
                break;
            }
            for (uint32_t i = 0; i < b->len[id]; i++) {
                const nstate *st = &a->st[cur[i]];
                if (st->kind == K_RANGE && st->lo <= rep && rep <= st->hi)
                    seeds[k++] = st->out;
            }
            int32_t t = -1;
            if (k) {
                uint32_t m = closure(b, seeds, k, set);
                t = intern(b, set, m);
                if (t < 0) rc = t;
            }
            if (rc == 0) b->trans[(size_t)id * d->n_classes + cl] = t;
        }
    }
    free(set);
    free(seeds);
    if (rc == -1) {
        util_set_err(err, err_cap,
                     "the grammar is too large (more than %u automaton states)",
                     REGEX_MAX_DFA);
        return -1;
    }
    if (rc == -3) {
        util_set_err(err, err_cap,
                     "the grammar is too complex to compile (over %.0e automaton "
                     "construction steps)",
                     (double)REGEX_MAX_WORK);
        return -1;
    }
    if (rc) {
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    return 0;
}

/* Keep states that reach an accepting state (a breadth-first search over
 * the reversed transitions); renumber (start stays 0). */
static int prune(builder *b, regex_dfa *d) {
    uint32_t n = b->n_sets, C = d->n_classes;
    uint8_t *live = util_calloc(n ? n : 1, 1);
    int32_t *map = malloc((n ? n : 1) * sizeof *map);
    if (!live || !map) {
        free(live);
        free(map);
        return -1;
    }
    /* reverse edges (CSR), then a search back from the accepting states */
    size_t ne = (size_t)n * C;
    uint32_t *start = util_calloc((size_t)n + 1, sizeof *start);
    int32_t *from = malloc((ne ? ne : 1) * sizeof *from);
    int32_t *queue = malloc((n ? n : 1) * sizeof *queue);
    if (!start || !from || !queue) {
        free(start);
        free(from);
        free(queue);
        free(live);
        free(map);
        return -1;
    }
    for (size_t e = 0; e < ne; e++)
        if (b->trans[e] >= 0) start[b->trans[e] + 1]++;
    for (uint32_t i = 0; i < n; i++) start[i + 1] += start[i];
    for (size_t e = 0; e < ne; e++) {
        int32_t t = b->trans[e];
        if (t >= 0) from[start[t]++] = (int32_t)(e / C);
    }
    for (uint32_t i = n; i-- > 0;) start[i + 1] = start[i]; /* undo the fill's shift */
    start[0] = 0;
    uint32_t qh = 0, qt = 0;
    for (uint32_t i = 0; i < n; i++)
        if (b->acc[i]) {
            live[i] = 1;
            queue[qt++] = (int32_t)i;
        }
    while (qh < qt) {
        int32_t t = queue[qh++];
        for (uint32_t j = start[t]; j < start[t + 1]; j++)
            if (!live[from[j]]) {
                live[from[j]] = 1;
                queue[qt++] = from[j];
            }
    }
    free(start);
    free(from);
    free(queue);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        map[i] = (n && live[0] && live[i]) ? (int32_t)k++ : -1;
    d->n_states = k;
    d->trans = malloc(((size_t)k * C + 1) * sizeof *d->trans);
    d->accept = malloc(k + 1);
    d->forced = malloc((k + 1) * sizeof *d->forced);
    if (!d->trans || !d->accept || !d->forced) {
        free(live);
        free(map);
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (map[i] < 0) continue;
        uint32_t j = (uint32_t)map[i];
        d->accept[j] = b->acc[i];
        for (uint32_t c = 0; c < C; c++) {
            int32_t t = b->trans[(size_t)i * C + c];
            d->trans[(size_t)j * C + c] = t >= 0 ? map[t] : -1;
        }
    }
    for (uint32_t j = 0; j < k; j++) {
        int only = -1, count = 0;
        for (int v = 0; v < 256 && count < 2; v++)
            if (d->trans[(size_t)j * C + d->class_of[v]] >= 0) {
                only = v;
                count++;
            }
        d->forced[j] = (int16_t)(count == 1 ? only : -1);
    }
    free(live);
    free(map);
    return 0;
}

int regex_dfa_compile(const char *re, size_t len, regex_dfa **out, char *err,
                      size_t err_cap) {
    *out = NULL;
    parser p = { .s = re, .n = len, .err = err, .err_cap = err_cap };
    int root = parse_all(&p);
    if (root < 0) {
        free(p.nodes);
        return -1;
    }
    nfa a = { 0 };
    int32_t match = nfa_add(&a, K_MATCH, 0, 0, -1, -1);
    int32_t start = build(&a, &p, root, match);
    free(p.nodes);
    if (a.failed) {
        free(a.st);
        if (a.failed == 1)
            util_set_err(err, err_cap,
                         "the grammar is too large (more than %u NFA states)",
                         REGEX_MAX_NFA);
        else
            util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    regex_dfa *d = util_calloc(1, sizeof *d);
    builder b;
    memset(&b, 0, sizeof b);
    int rc = d ? subset(&b, &a, start, d, err, err_cap) : -1;
    if (!d) util_set_err(err, err_cap, "out of memory");
    if (rc == 0 && prune(&b, d) != 0) {
        util_set_err(err, err_cap, "out of memory");
        rc = -1;
    }
    builder_free(&b);
    free(a.st);
    if (rc != 0) {
        regex_dfa_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

void regex_dfa_free(regex_dfa *d) {
    if (!d) return;
    free(d->trans);
    free(d->accept);
    free(d->forced);
    free(d);
}

uint32_t regex_dfa_states(const regex_dfa *d) { return d->n_states; }

int32_t regex_dfa_start(const regex_dfa *d) { return d->n_states ? 0 : -1; }

int32_t regex_dfa_step(const regex_dfa *d, int32_t state, uint8_t b) {
    if (state < 0) return -1;
    return d->trans[(size_t)state * d->n_classes + d->class_of[b]];
}

int regex_dfa_accepting(const regex_dfa *d, int32_t state) {
    return state >= 0 && d->accept[state];
}

int regex_dfa_forced_byte(const regex_dfa *d, int32_t state) {
    return state >= 0 ? d->forced[state] : -1;
}

int regex_dfa_complete(const regex_dfa *d, int32_t state) {
    if (state < 0 || !d->accept[state]) return 0;
    const int32_t *t = d->trans + (size_t)state * d->n_classes;
    for (uint32_t c = 0; c < d->n_classes; c++)
        if (t[c] >= 0) return 0;
    return 1;
}

int32_t regex_dfa_walk(const regex_dfa *d, int32_t state, const char *s, size_t n) {
    for (size_t i = 0; i < n && state >= 0; i++)
        state = d->trans[(size_t)state * d->n_classes + d->class_of[(uint8_t)s[i]]];
    return state;
}

int regex_dfa_match(const regex_dfa *d, const char *s, size_t n) {
    return regex_dfa_accepting(d, regex_dfa_walk(d, regex_dfa_start(d), s, n));
}
