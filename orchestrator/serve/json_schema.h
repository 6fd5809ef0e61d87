/*
 * json_schema.h - a JSON Schema (the subset below) compiled into a regular
 * expression (regex_dfa.h syntax) whose matches are compact JSON texts (no
 * whitespace) that validate against the schema; the structured-output
 * grammar of response_format json_schema / json_object and of tool calls.
 *
 * Supported: type (object, array, string, number, integer, boolean, null, or
 * a list of them), properties, required, additionalProperties, enum, const,
 * items, minItems / maxItems, minLength / maxLength, pattern, minimum /
 * maximum / exclusiveMinimum / exclusiveMaximum on integers, anyOf, local
 * $ref ("#", "#/$defs/NAME", "#/definitions/NAME") with $defs / definitions,
 * uniqueItems false; annotations are accepted (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly).
 * Anything else (format, oneOf, allOf, not, patternProperties, number
 * bounds, minLength together with pattern, ...) is an error naming the
 * keyword and its JSON path; it is never ignored.
 *
 * What is generated (always a valid instance):
 *  - object properties in the schema's order; required ones always, the
 *    others optionally; properties not declared are never generated (valid
 *    whatever additionalProperties says); an object schema without
 *    properties generates any object whose values match additionalProperties
 *    (a schema, or any JSON value when true / absent);
 *  - "any JSON value" (no type, or json_object) is depth-bounded:
 *    JSON_SCHEMA_ANY_DEPTH levels of nesting;
 *  - a recursive $ref is expanded JSON_SCHEMA_REF_DEPTH times; deeper, the
 *    reference matches nothing, so only the schema's non-recursive
 *    alternatives (optional properties, anyOf branches, empty arrays) remain;
 *  - a string's pattern must match the whole decoded string (which satisfies
 *    JSON Schema's "matches somewhere").
 *
 * A schema whose grammar would pass 8 MiB of regex text (many optional
 * properties, deeply nested arrays) is refused as too large.
 *
 * Memory: the regex is appended to the caller's strbuf. Threads: reentrant.
 * Errors: 0, or -1 with "PATH: message" in err (PATH starts with the path
 * given by the caller, e.g. response_format.json_schema.schema).
 */
#ifndef ORCH_JSON_SCHEMA_H
#define ORCH_JSON_SCHEMA_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "orchestrator/core/strbuf.h"

#define JSON_SCHEMA_ANY_DEPTH 4 /* nesting of a free-form value */
#define JSON_SCHEMA_REF_DEPTH 3 /* expansions of one recursive $ref chain */

int json_schema_to_regex(const cJSON *schema, const char *path, strbuf *out, char *err,
                         size_t err_cap);

/* Any JSON object (json_object mode), depth-bounded as above. */
void json_schema_any_object(strbuf *out);

/* Append s[0..n) to out as a regex matching exactly those bytes. */
void json_schema_regex_literal(strbuf *out, const char *s, size_t n);

#endif
