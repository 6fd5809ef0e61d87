/*
 * json_writer.c - JSON string escaping with U+FFFD for invalid UTF-8, and
 * numbers. See json_writer.h.
 */
#include "orchestrator/core/json_writer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/utf8.h"

void json_write_string(strbuf *b, const char *s, size_t n) {
    strbuf_reserve(b, n + 2);
    strbuf_put(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && !b->oom) {
        size_t start = i;
        while (i < n && u[i] >= 0x20 && u[i] < 0x80 && u[i] != '"' && u[i] != '\\') i++;
        if (i > start) strbuf_put(b, s + start, i - start);
        if (i >= n) break;
        unsigned char c = u[i];
        if (c == '"')
            strbuf_put(b, "\\\"", 2);
        else if (c == '\\')
            strbuf_put(b, "\\\\", 2);
        else if (c == '\n')
            strbuf_put(b, "\\n", 2);
        else if (c == '\r')
            strbuf_put(b, "\\r", 2);
        else if (c == '\t')
            strbuf_put(b, "\\t", 2);
        else if (c < 0x20)
            strbuf_printf(b, "\\u%04x", c);
        else {
            size_t l = utf8_char_len(s + i, n - i);
            if (l == 0) {
                strbuf_put(b, "\xEF\xBF\xBD", 3); /* U+FFFD for one bad byte */
            } else {
                strbuf_put(b, s + i, l);
                i += l - 1;
            }
        }
        i++;
    }
    strbuf_put(b, "\"", 1);
}

void json_write_cstring(strbuf *b, const char *s) { json_write_string(b, s, strlen(s)); }

void json_write_string2(strbuf *b, const char *a, size_t na, const char *c, size_t nc) {
    if (na == 0) {
        json_write_string(b, c, nc);
        return;
    }
    if (nc == 0) {
        json_write_string(b, a, na);
        return;
    }
    char *t = malloc(na + nc);
    if (!t) {
        b->oom = 1;
        return;
    }
    memcpy(t, a, na);
    memcpy(t + na, c, nc);
    json_write_string(b, t, na + nc);
    free(t);
}

void json_write_double(strbuf *b, double v) {
    if (!isfinite(v))
        strbuf_puts(b, "null");
    else
        strbuf_printf(b, "%.9g", v);
}
