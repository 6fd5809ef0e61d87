/*
 * json_read.h - checked reads of numbers from parsed JSON files (state.json,
 * meta.json): a value is range-checked as a double BEFORE it is converted, so
 * a file saying "step": 1e300, -1, 1.5 or 18446744073709551616 is refused
 * with a message naming the key instead of reaching an undefined
 * double-to-integer conversion.
 *
 * A key is a dotted path below the object, e.g. "data.tokens_seen"; a
 * missing intermediate object counts as a missing key.
 *
 * Memory: nothing is allocated; the cJSON tree is borrowed.
 * Threads: reentrant.
 * Errors: 0, or -1 with "PATH: PROBLEM" in err (the caller prefixes the file
 * name), e.g. "step: 1e+300 is out of range (0..9007199254740992)",
 * "step: expected an integer, got 1.5", "step: expected an integer, got a
 * string", "step: missing", "data: expected an object, got an array"; *out is
 * untouched on failure.
 */
#ifndef ORCH_JSON_READ_H
#define ORCH_JSON_READ_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* 2^53: the largest integer below which every integer is exact in a JSON
 * number (a double); the ceiling of every integer json_read_u64 returns. */
#define JSON_READ_U64_MAX ((uint64_t)1 << 53)

/* Flags. */
#define JSON_READ_REQUIRED 1u /* a missing key is an error */
#define JSON_READ_NULLABLE 2u /* null means "absent" (the default is used) */

/* obj's PATH as an integer in [min, max] (max is capped at
 * JSON_READ_U64_MAX). Absent (and not required): *out = def, returns 0. */
int json_read_u64(const cJSON *obj, const char *path, unsigned flags, uint64_t def,
                  uint64_t min, uint64_t max, uint64_t *out, char *err, size_t err_cap);

/* obj's PATH as a finite number in [min, max]. Absent (or null with
 * JSON_READ_NULLABLE, not required): *out = def (which may be NaN). */
int json_read_f64(const cJSON *obj, const char *path, unsigned flags, double def,
                  double min, double max, double *out, char *err, size_t err_cap);

/* "a string", "a number", "an array", ... for messages. */
const char *json_read_type_name(const cJSON *v);

#endif
