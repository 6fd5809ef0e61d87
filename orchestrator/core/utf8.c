/*
 * utf8.c - UTF-8 character lengths and the streaming hold-back rule (Unicode
 * Table 3-7 well-formedness). See utf8.h.
 */
#include "orchestrator/core/utf8.h"

size_t utf8_lead_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* 1 if b may follow lead at position i (1..3) of its character. */
static int cont_ok(unsigned char lead, size_t i, unsigned char b) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (i == 1) {
        if (lead == 0xE0)
            lo = 0xA0; /* no overlong 3-byte forms */
        else if (lead == 0xED)
            hi = 0x9F; /* no surrogates */
        else if (lead == 0xF0)
            lo = 0x90; /* no overlong 4-byte forms */
        else if (lead == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    }
    return b >= lo && b <= hi;
}

/* 1 if the n bytes after lead s[0] (n < its length) are all in range. */
static int tail_ok(const unsigned char *s, size_t n) {
    for (size_t i = 1; i <= n; i++)
        if (!cont_ok(s[0], i, s[i])) return 0;
    return 1;
}

size_t utf8_char_len(const char *s, size_t n) {
    if (n == 0) return 0;
    const unsigned char *u = (const unsigned char *)s;
    size_t need = utf8_lead_len(u[0]);
    if (need == 0 || need > n) return 0;
    return tail_ok(u, need - 1) ? need : 0;
}

size_t utf8_decode(const char *s, size_t n, uint32_t *cp) {
    size_t len = utf8_char_len(s, n);
    if (len == 0) return 0;
    const unsigned char *u = (const unsigned char *)s;
    static const unsigned char lead_mask[5] = { 0, 0x7F, 0x1F, 0x0F, 0x07 };
    uint32_t v = u[0] & lead_mask[len];
    for (size_t i = 1; i < len; i++) v = (v << 6) | (u[i] & 0x3F);
    *cp = v;
    return len;
}

size_t utf8_complete_prefix_len(const char *buf, size_t len) {
    const unsigned char *u = (const unsigned char *)buf;
    /* the last byte that is not a continuation byte, at most 3 back */
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = u[len - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = utf8_lead_len(c);
        /* ASCII, a byte that starts nothing, or a character that is complete
         * (anything after it is stray): nothing to wait for */
        if (need <= back) return len;
        /* back bytes of a need-byte character: wait if they fit so far */
        return tail_ok(u + len - back, back - 1) ? len - back : len;
    }
    return len; /* empty, or only continuation bytes: stray, emit */
}
