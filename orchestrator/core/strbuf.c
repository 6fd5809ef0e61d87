/*
 * strbuf.c - growable byte buffer. See strbuf.h.
 */
#include "orchestrator/core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void strbuf_reserve(strbuf *b, size_t extra) {
    if (b->oom || b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void strbuf_put(strbuf *b, const char *s, size_t n) {
    strbuf_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void strbuf_puts(strbuf *b, const char *s) { strbuf_put(b, s, strlen(s)); }

void strbuf_printf(strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        strbuf_put(b, tmp, (size_t)n);
        return;
    }
    strbuf_reserve(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void strbuf_free(strbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}
