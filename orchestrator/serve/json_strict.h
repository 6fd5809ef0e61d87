/*
 * json_strict.h - what cJSON lets through and a request body must not have:
 * data after the JSON value, a key that appears twice in one object (at any
 * depth; cJSON keeps both and lookups see the first), and a NUL character in
 * a string (a "\u0000" escape or a raw 0 byte: cJSON's C strings end there,
 * so the rest would silently vanish). A NUL is a character, but no field of
 * the API can carry it here, so it is refused, naming where it was.
 *
 * Checks, in order: trailing data (after whitespace), control bytes between
 * tokens (cJSON skips every byte <= 0x20 as if it were whitespace), NULs,
 * duplicate keys. Errors are 400 with param = the top-level field the
 * problem is in when it is one of `fields` (else null):
 *   invalid_json   "unexpected data after the JSON value (byte N)"
 *                  "control character 0xNN outside a string (byte N)"
 *   invalid_value  "PATH contains a NUL character (\u0000), which is not
 *                  allowed" (PATH like prompt[2] or messages[0].content)
 *   duplicate_key  "duplicate key 'K' in PATH"
 *
 * Memory: nothing is kept. Threads: reentrant. Errors: 0, or -1 with *e set.
 */
#ifndef ORCH_JSON_STRICT_H
#define ORCH_JSON_STRICT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "orchestrator/serve/api_error.h"

/* body[0..len) parsed by cJSON into root, the parse ending at byte
 * `parsed`; fields: the known top-level names that may be reported as param,
 * each NUL-terminated, the list ending with an empty one ("a\0b\0"); params
 * point into it. */
int json_strict_check(const char *body, size_t len, size_t parsed, const cJSON *root,
                      const char *fields, api_error *e);

#endif
