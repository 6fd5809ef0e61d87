/*
 * regex_dfa.h - a regular expression compiled to a byte-level DFA, for
 * structured output (grammar_mask.h): the allowed next tokens are those whose
 * bytes the DFA can walk from the current state.
 *
 * Semantics: the whole output must match (full match; a JSON Schema
 * `pattern`, which only needs to match somewhere, is therefore satisfied by
 * every generated string). Syntax (ECMAScript-like subset): literals (UTF-8),
 * `.` (any character but \n and \r), classes `[a-z_]` / `[^...]` with ranges
 * and the escapes below (a `]` first in a class is literal; `[^\s\S]`
 * matches nothing), groups `(...)`, `(?:...)`, named groups
 * `(?<n>...)` / `(?P<n>...)`, alternation `|`, quantifiers `* + ? {n}
 * {n,} {n,m}` (a lazy `?` after one is accepted: same language), `^` at the
 * very start and `$` at the very end (no-ops under full match), escapes
 * `\d \D \w \W \s \S` (ASCII), `\n \r \t \f \v \0 \xHH \uHHHH` and any escaped
 * punctuation. Refused with a message: lookaround, backreferences, `\b`/`\B`,
 * anchors elsewhere, reversed ranges, repeat counts over REGEX_MAX_REPEAT,
 * more than two quantifiers in a row, groups nested over 200 deep, unbalanced parentheses, invalid UTF-8.
 *
 * Extension (used by json_schema.h): `(?J:...)` matches the JSON string
 * encoding of what its body matches: every character is written as JSON
 * would ("\"" -> \", "\\" -> \\, control characters as \n \t \r \b \f or
 * \u00XX), so a JSON string whose decoded value matches the body is
 * `"(?J:body)"`.
 *
 * Construction: parse -> Thompson NFA over bytes (classes expanded into UTF-8
 * byte-range sequences) -> subset construction over byte equivalence
 * classes -> states that cannot reach an accepting state are removed (their
 * transitions become dead, -1). Limits: REGEX_MAX_NFA NFA states,
 * REGEX_MAX_DFA DFA states and REGEX_MAX_WORK steps of the subset
 * construction (a fraction of a second; "too large" / "too complex" errors
 * otherwise), so no request can hold a worker thread for long.
 *
 * Memory: regex_dfa_compile returns a malloc'd DFA freed by regex_dfa_free.
 * Threads: a compiled DFA is immutable; any thread may read it.
 * Errors: regex_dfa_compile returns 0, or -1 with a message in err (starting
 * with the byte offset for syntax errors).
 */
#ifndef ORCH_REGEX_DFA_H
#define ORCH_REGEX_DFA_H

#include <stddef.h>
#include <stdint.h>

#define REGEX_MAX_REPEAT 1000u
#define REGEX_MAX_NFA    400000u
#define REGEX_MAX_DFA    40000u
#define REGEX_MAX_WORK   50000000ull /* NFA states touched while building */

typedef struct regex_dfa regex_dfa;

int regex_dfa_compile(const char *re, size_t len, regex_dfa **out, char *err,
                      size_t err_cap);
void regex_dfa_free(regex_dfa *d);

/* Checks a regex's syntax only (no automaton); 0 or -1 with err. */
int regex_syntax_check(const char *re, size_t len, char *err, size_t err_cap);

/* States are 0..n-1; the start state is 0; -1 is the dead state. A DFA whose
 * language is empty has no states (regex_dfa_states 0, start -1). */
uint32_t regex_dfa_states(const regex_dfa *d);
int32_t regex_dfa_start(const regex_dfa *d);
/* Next state on byte b; -1 when dead (or state is -1). */
int32_t regex_dfa_step(const regex_dfa *d, int32_t state, uint8_t b);
int regex_dfa_accepting(const regex_dfa *d, int32_t state);
/* The one byte that leads to a live state from state, or -1 when there are
 * none or several. */
int regex_dfa_forced_byte(const regex_dfa *d, int32_t state);
/* Accepting and no byte leads on: the match is complete. */
int regex_dfa_complete(const regex_dfa *d, int32_t state);
/* Walk n bytes from state (-1 when it dies). */
int32_t regex_dfa_walk(const regex_dfa *d, int32_t state, const char *s, size_t n);
/* 1 when s[0..n) is in the language. */
int regex_dfa_match(const regex_dfa *d, const char *s, size_t n);

#endif
