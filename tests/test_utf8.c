/*
 * test_utf8.c - the one UTF-8 rule set (core/utf8.h): lead-byte lengths,
 * well-formed character lengths against a code-point reference decoder
 * (overlongs, surrogates, > U+10FFFF), decoded code points, and the
 * streaming hold-back rule in a table of cases (a byte that can never start
 * a character such as C0 is emitted at once; a lead byte waiting for its
 * continuation bytes is held; E0 80 and other impossible continuations are
 * emitted), plus a sweep that checks the rule's definition over many byte
 * strings: exactly a trailing proper prefix of a well-formed character is
 * held back.
 */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "orchestrator/core/utf8.h"
#include "tests/test_util.h"

typedef struct prefix_case {
    const char *s;
    size_t len;
    size_t want;
    const char *why;
} prefix_case;

static const prefix_case PREFIX_CASES[] = {
    { "", 0, 0, "empty" },
    { "abc", 3, 3, "ASCII" },
    { "a\xC3", 2, 1, "2-byte lead waits" },
    { "a\xC3\xA9", 3, 3, "e-acute complete" },
    { "\xE2\x82", 2, 0, "euro sign: 2 of 3 bytes" },
    { "\xE2\x82\xAC", 3, 3, "euro sign complete" },
    { "x\xF0", 2, 1, "4-byte lead waits" },
    { "x\xF0\x9F", 3, 1, "emoji: 2 of 4" },
    { "x\xF0\x9F\x98", 4, 1, "emoji: 3 of 4" },
    { "x\xF0\x9F\x98\x80", 5, 5, "emoji complete" },
    { "a\xC0", 2, 2, "C0 never starts a character: emitted" },
    { "a\xC1", 2, 2, "C1 never starts a character" },
    { "a\xF5", 2, 2, "F5 is above U+10FFFF" },
    { "a\xFF", 2, 2, "FF is never UTF-8" },
    { "a\xF8\x80", 3, 3, "F8 is not a lead byte" },
    { "a\x80", 2, 2, "stray continuation" },
    { "\x80\x80", 2, 2, "only continuation bytes" },
    { "\xE2\x82\xAC\x80\x80\x80", 6, 6, "three stray continuations after a character" },
    { "a\xE0\x80", 3, 3, "E0 80 is an overlong form: emitted" },
    { "a\xE0\x9F", 3, 3, "E0 9F is an overlong form" },
    { "a\xE0\xA0", 3, 1, "E0 A0 can still become U+0800" },
    { "a\xED\xA0", 3, 3, "ED A0 is a surrogate: emitted" },
    { "a\xED\x9F", 3, 1, "ED 9F can still become U+D7FF" },
    { "a\xF0\x80", 3, 3, "F0 80 is an overlong form" },
    { "a\xF0\x90", 3, 1, "F0 90 can still become U+10000" },
    { "a\xF4\x90", 3, 3, "F4 90 is above U+10FFFF" },
    { "a\xF4\x8F\xBF", 4, 1, "F4 8F BF can still become U+10FFFF" },
    { "a\xE2\x41", 3, 3, "a lead cut by ASCII: nothing to wait for" },
    { "\xC3\xA9\x80", 3, 3, "complete character, then a stray byte" },
    { "a\xC3\xC3", 3, 2, "only the last lead waits" },
    { "a\xE2\x82\xE2", 4, 3, "the last lead waits, the broken one before it does not" },
    { "a\xC3\x41", 3, 3, "ASCII after a lead" },
};

START_TEST(hold_back_table) {
    for (size_t i = 0; i < sizeof PREFIX_CASES / sizeof *PREFIX_CASES; i++) {
        const prefix_case *c = &PREFIX_CASES[i];
        size_t got = utf8_complete_prefix_len(c->s, c->len);
        ck_assert_msg(got == c->want, "case %zu (%s): got %zu, want %zu", i, c->why, got,
                      c->want);
    }
}
END_TEST

START_TEST(lead_lengths) {
    for (unsigned c = 0; c < 256; c++) {
        size_t want = c < 0x80   ? 1
                      : c < 0xC2 ? 0
                      : c < 0xE0 ? 2
                      : c < 0xF0 ? 3
                      : c < 0xF5 ? 4
                                 : 0;
        ck_assert_msg(utf8_lead_len((unsigned char)c) == want, "lead %02X", c);
    }
}
END_TEST

/* Reference: decode the code point and reject overlongs, surrogates and
 * values above U+10FFFF. */
static size_t ref_char_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        cp = c & 0x07;
    } else
        return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

START_TEST(char_len_table_and_reference) {
    ck_assert_uint_eq(utf8_char_len("", 0), 0);
    ck_assert_uint_eq(utf8_char_len("A", 1), 1);
    ck_assert_uint_eq(utf8_char_len("\xC3\xA9", 2), 2);
    ck_assert_uint_eq(utf8_char_len("\xC3", 1), 0);         /* cut off */
    ck_assert_uint_eq(utf8_char_len("\xC0\x80", 2), 0);     /* overlong NUL */
    ck_assert_uint_eq(utf8_char_len("\xE0\x80\x80", 3), 0); /* overlong */
    ck_assert_uint_eq(utf8_char_len("\xE0\xA0\x80", 3), 3); /* U+0800 */
    ck_assert_uint_eq(utf8_char_len("\xED\xA0\x80", 3), 0); /* surrogate */
    ck_assert_uint_eq(utf8_char_len("\xED\x9F\xBF", 3), 3); /* U+D7FF */
    ck_assert_uint_eq(utf8_char_len("\xF0\x90\x80\x80", 4), 4);
    ck_assert_uint_eq(utf8_char_len("\xF4\x8F\xBF\xBF", 4), 4); /* U+10FFFF */
    ck_assert_uint_eq(utf8_char_len("\xF4\x90\x80\x80", 4), 0);
    ck_assert_uint_eq(utf8_char_len("\xE2\x82\x41", 3), 0);
    ck_assert_uint_eq(utf8_char_len("\x80", 1), 0);
    ck_assert_uint_eq(utf8_char_len("\xFF", 1), 0);
    ck_assert_uint_eq(utf8_char_len("\xC3\xA9tail", 6), 2); /* only the first character */
    /* every 1-3 byte string, and 4-byte strings over a set of tail bytes */
    unsigned char s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (unsigned char)a;
        ck_assert_uint_eq(utf8_char_len((char *)s, 1), ref_char_len(s, 1));
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (unsigned char)b;
            ck_assert_uint_eq(utf8_char_len((char *)s, 2), ref_char_len(s, 2));
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (unsigned char)c;
                if (utf8_char_len((char *)s, 3) != ref_char_len(s, 3))
                    ck_abort_msg("%02X %02X %02X", a, b, c);
            }
        }
    }
    static const unsigned char tails[] = {
        0x00, 0x7F, 0x80, 0x8F, 0x90, 0xBF, 0xC0, 0xFF
    };
    for (unsigned a = 0xF0; a < 0xF8; a++)
        for (unsigned b = 0; b < 256; b++)
            for (size_t c = 0; c < sizeof tails; c++)
                for (size_t d = 0; d < sizeof tails; d++) {
                    s[0] = (unsigned char)a;
                    s[1] = (unsigned char)b;
                    s[2] = tails[c];
                    s[3] = tails[d];
                    if (utf8_char_len((char *)s, 4) != ref_char_len(s, 4))
                        ck_abort_msg("%02X %02X %02X %02X", a, b, tails[c], tails[d]);
                }
}
END_TEST

START_TEST(decode_code_points) {
    static const struct {
        const char *s;
        size_t n, len;
        uint32_t cp;
    } cases[] = {
        { "A", 1, 1, 0x41 },
        { "\x7F", 1, 1, 0x7F },
        { "\xC2\x80", 2, 2, 0x80 },
        { "\xC3\xA9", 2, 2, 0xE9 },
        { "\xDF\xBF", 2, 2, 0x7FF },
        { "\xE0\xA0\x80", 3, 3, 0x800 },
        { "\xE2\x82\xAC", 3, 3, 0x20AC },
        { "\xED\x9F\xBF", 3, 3, 0xD7FF },
        { "\xEF\xBF\xBF", 3, 3, 0xFFFF },
        { "\xF0\x90\x80\x80", 4, 4, 0x10000 },
        { "\xF0\x9F\x98\x80", 4, 4, 0x1F600 },
        { "\xF4\x8F\xBF\xBF", 4, 4, 0x10FFFF },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint32_t cp = 0;
        ck_assert_uint_eq(utf8_decode(cases[i].s, cases[i].n, &cp), cases[i].len);
        ck_assert_uint_eq(cp, cases[i].cp);
    }
    uint32_t cp = 7;
    ck_assert_uint_eq(utf8_decode("\xC0\x80", 2, &cp),
                      0); /* overlong: rejected, cp untouched */
    ck_assert_uint_eq(utf8_decode("\xED\xA0\x80", 3, &cp), 0);
    ck_assert_uint_eq(utf8_decode("", 0, &cp), 0);
    ck_assert_uint_eq(cp, 7);
}
END_TEST

/* Can p[0..k) (k < 4) be completed into a well-formed character? */
static int completable(const unsigned char *p, size_t k) {
    static const unsigned char fill[] = { 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF };
    for (size_t total = k + 1; total <= 4; total++) {
        size_t missing = total - k, combos = 1;
        for (size_t i = 0; i < missing; i++) combos *= sizeof fill;
        for (size_t m = 0; m < combos; m++) {
            unsigned char buf[4];
            memcpy(buf, p, k);
            size_t x = m;
            for (size_t i = 0; i < missing; i++) {
                buf[k + i] = fill[x % sizeof fill];
                x /= sizeof fill;
            }
            if (ref_char_len(buf, total) == total) return 1;
        }
    }
    return 0;
}

START_TEST(hold_back_is_exactly_a_completable_tail) {
    static const unsigned char pick[] = { 0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F,
                                          0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
                                          0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1,
                                          0xF3, 0xF4, 0xF5, 0xFF };
    size_t np = sizeof pick;
    unsigned char s[4] = { 'z', 0, 0, 0 };
    for (unsigned a = 0; a < 256; a++)
        for (size_t b = 0; b <= np; b++)
            for (size_t c = 0; c <= np; c++) {
                /* s = "z" a [pick b] [pick c]: lengths 2..4 */
                size_t len = 2;
                s[1] = (unsigned char)a;
                if (b < np) s[len++] = pick[b];
                if (b < np && c < np) s[len++] = pick[c];
                if (b == np && c < np) continue;
                size_t got = utf8_complete_prefix_len((char *)s, len);
                ck_assert_msg(got <= len && len - got <= 3, "held too much");
                size_t held = len - got;
                if (held) {
                    ck_assert_msg(utf8_lead_len(s[got]) > held &&
                                      completable(s + got, held),
                                  "held a tail that cannot complete");
                } else {
                    /* nothing held: no trailing lead-started tail is completable */
                    for (size_t k = 1; k <= 3 && k < len; k++) {
                        const unsigned char *t = s + len - k;
                        int cont_only = 1;
                        for (size_t i = 1; i < k; i++) cont_only &= (t[i] & 0xC0) == 0x80;
                        if ((t[0] & 0xC0) != 0x80 && cont_only)
                            ck_assert_msg(!(utf8_lead_len(t[0]) > k && completable(t, k)),
                                          "emitted a completable tail of %zu", k);
                    }
                }
            }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("utf8");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, hold_back_table);
    tcase_add_test(tc, lead_lengths);
    tcase_add_test(tc, char_len_table_and_reference);
    tcase_add_test(tc, decode_code_points);
    tcase_add_test(tc, hold_back_is_exactly_a_completable_tail);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
