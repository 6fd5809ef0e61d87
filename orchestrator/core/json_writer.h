/*
 * json_writer.h - writing JSON text into a strbuf: strings (quoted, escaped,
 * any bytes in, valid UTF-8 out) and numbers. The serving responses (render.h)
 * are built with it; cJSON is used for parsing only.
 *
 * Strings: '"' and '\' are escaped, \n \r \t as such, other bytes below 0x20
 * as \u00XX; well-formed UTF-8 characters (utf8.h) are copied as they are and
 * every byte that is not part of one becomes U+FFFD, so the output is always
 * valid JSON in valid UTF-8 whatever the model generated.
 *
 * Memory: appends to the caller's strbuf. Errors: as strbuf (an allocation
 * failure sets b->oom; check it once at the end). Threads: reentrant; a
 * strbuf is used by one thread at a time.
 */
#ifndef ORCH_JSON_WRITER_H
#define ORCH_JSON_WRITER_H

#include <stddef.h>

#include "orchestrator/core/strbuf.h"

/* The JSON string of s[0..n) (need not be NUL-terminated). */
void json_write_string(strbuf *b, const char *s, size_t n);
/* The JSON string of a NUL-terminated string. */
void json_write_cstring(strbuf *b, const char *s);
/* One JSON string of a[0..na) followed by c[0..nc) (a character split
 * between the two parts is kept whole). */
void json_write_string2(strbuf *b, const char *a, size_t na, const char *c, size_t nc);
/* A number with 9 significant digits (%.9g: reads back as the same float);
 * null for NaN and infinities, which JSON cannot express. */
void json_write_double(strbuf *b, double v);

#endif
