/*
 * strbuf.h - a growable NUL-terminated byte buffer for building response
 * bodies, JSON text and metrics exposition.
 *
 * Memory: the buffer owns `p` (malloc'd); release it with free(b->p) or
 * strbuf_free. A zero-initialised strbuf is empty and valid.
 * Errors: an allocation failure sets `oom` and turns every later append into
 * a no-op, so callers check `oom` once at the end.
 * Threads: a strbuf is used by one thread at a time.
 */
#ifndef ORCH_STRBUF_H
#define ORCH_STRBUF_H

#include <stddef.h>

typedef struct strbuf {
    char *p;    /* contents, NUL-terminated once anything was appended */
    size_t len; /* bytes used, excluding the NUL */
    size_t cap; /* bytes allocated */
    int oom;    /* an allocation failed */
} strbuf;

/* Make room for `extra` more bytes plus the NUL. */
void strbuf_reserve(strbuf *b, size_t extra);
/* Append n bytes / a C string / printf-formatted text. */
void strbuf_put(strbuf *b, const char *s, size_t n);
void strbuf_puts(strbuf *b, const char *s);
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Free the contents and reset to empty. */
void strbuf_free(strbuf *b);

#endif
