/*
 * utf8.h - the orchestrator's one set of UTF-8 rules: how long the
 * well-formed character at a position is (and its code point), and how much
 * of a growing byte stream may be emitted now without splitting a character
 * that later bytes will complete (the streaming hold-back of `orch generate`
 * and of the server's SSE streams).
 *
 * Well-formed means Unicode's Table 3-7: no overlong forms (C0, C1, E0 80..9F,
 * F0 80..8F), no surrogates (ED A0..BF), nothing above U+10FFFF (F4 90..,
 * F5..FF).
 *
 * The hold-back rule: a trailing run of bytes is held back only when it is a
 * proper prefix of some well-formed character (a lead byte whose continuation
 * bytes have not all arrived yet, each arrived one in its allowed range).
 * Bytes that can never become part of a well-formed character are never held
 * back, because waiting would not change them: a byte that cannot start a
 * character (80..BF, C0, C1, F5..FF), and a lead byte followed by a byte out
 * of its range (e.g. E0 80, ED A0, F4 90). So "a\xC0" is emitted whole and
 * "a\xE2\x82" holds back its last two bytes.
 *
 * Memory: nothing is allocated. Threads: reentrant. Errors: none (lengths).
 */
#ifndef ORCH_UTF8_H
#define ORCH_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Bytes in the character that lead byte c starts: 1 for ASCII, 2..4 for a
 * lead byte, 0 for a byte that cannot start a well-formed character
 * (continuation bytes 80..BF, C0, C1, F5..FF). */
size_t utf8_lead_len(unsigned char c);

/* Length (1..4) of the well-formed character at s[0..n), or 0 when s does
 * not start with one (n == 0, a bad byte, or a character cut off at n). */
size_t utf8_char_len(const char *s, size_t n);

/* utf8_char_len, and the character's code point into *cp (when the length
 * is not 0). */
size_t utf8_decode(const char *s, size_t n, uint32_t *cp);

/* Leading bytes of buf[0..len) that may be emitted now: len, minus a trailing
 * proper prefix of a well-formed character (at most 3 bytes), which is held
 * back until the rest of the character arrives. */
size_t utf8_complete_prefix_len(const char *buf, size_t len);

#endif
