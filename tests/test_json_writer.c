/*
 * test_json_writer.c - JSON text from core/json_writer.h: exact escaping of
 * quotes, backslashes, control bytes and NUL; well-formed UTF-8 copied as is
 * and each bad byte (C0, a cut-off character, an overlong, a surrogate)
 * replaced by one U+FFFD; a character split across the two parts of
 * json_write_string2 kept whole; numbers with 9 significant digits and null
 * for non-finite values; valid output parsed back by cJSON; an out-of-memory
 * buffer stays a no-op.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/json_writer.h"
#include "tests/test_util.h"

#define FFFD "\xEF\xBF\xBD"

static void expect_string(const char *in, size_t n, const char *want) {
    strbuf b = { 0 };
    json_write_string(&b, in, n);
    ck_assert(!b.oom);
    ck_assert_msg(b.len == strlen(want) && memcmp(b.p, want, b.len) == 0,
                  "got [%s] want [%s]", b.p, want);
    strbuf_free(&b);
}

START_TEST(escapes_exact) {
    expect_string("", 0, "\"\"");
    expect_string("abc", 3, "\"abc\"");
    expect_string("a\"b\\c", 5, "\"a\\\"b\\\\c\"");
    expect_string("\n\r\t", 3, "\"\\n\\r\\t\"");
    expect_string("\x01\x1f\x08\x0c", 4, "\"\\u0001\\u001f\\u0008\\u000c\"");
    expect_string("a\0b", 3, "\"a\\u0000b\"");
    expect_string("\x7f/", 2, "\"\x7f/\""); /* DEL and '/' need no escape */
    expect_string("only part", 4, "\"only\"");
    strbuf b = { 0 };
    json_write_cstring(&b, "x\"y");
    ck_assert_str_eq(b.p, "\"x\\\"y\"");
    strbuf_free(&b);
}
END_TEST

START_TEST(utf8_kept_or_replaced) {
    expect_string("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 9,
                  "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"");
    expect_string("a\xC0"
                  "b",
                  3, "\"a" FFFD "b\"");
    expect_string("\xC0\x80", 2, "\"" FFFD FFFD "\"");   /* overlong NUL: two bad bytes */
    expect_string("\xE2\x82", 2, "\"" FFFD FFFD "\"");   /* cut off at the end */
    expect_string("\xE2\x82x", 3, "\"" FFFD FFFD "x\""); /* cut off by ASCII */
    expect_string("\xE0\x80\x80", 3, "\"" FFFD FFFD FFFD "\"");
    expect_string("\xED\xA0\x80", 3, "\"" FFFD FFFD FFFD "\""); /* surrogate */
    expect_string("\xF4\x90\x80\x80", 4, "\"" FFFD FFFD FFFD FFFD "\"");
    expect_string("\xFF\xFE", 2, "\"" FFFD FFFD "\"");
    expect_string("\xC3\xA9\x80", 3, "\"\xC3\xA9" FFFD "\"");
}
END_TEST

START_TEST(two_part_strings) {
    strbuf b = { 0 };
    json_write_string2(&b, "h\xC3", 2, "\xA9!", 2); /* e-acute split between the parts */
    ck_assert_str_eq(b.p, "\"h\xC3\xA9!\"");
    b.len = 0;
    json_write_string2(&b, "", 0, "tail", 4);
    ck_assert_str_eq(b.p, "\"tail\"");
    b.len = 0;
    json_write_string2(&b, "head\n", 5, "", 0);
    ck_assert_str_eq(b.p, "\"head\\n\"");
    b.len = 0;
    json_write_string2(&b, "\xC3", 1, "x", 1); /* cut-off character stays bad */
    ck_assert_str_eq(b.p, "\"" FFFD "x\"");
    strbuf_free(&b);
}
END_TEST

START_TEST(numbers) {
    static const struct {
        double v;
        const char *want;
    } cases[] = {
        { 0.0, "0" },
        { 0.5, "0.5" },
        { -2.0, "-2" },
        { 0.1, "0.1" },
        { 1.0 / 3, "0.333333333" },
        { -0.0, "-0" },
        { 1e-10, "1e-10" },
        { 123456789012.0, "1.23456789e+11" },
        { -1.25, "-1.25" },
    };
    strbuf b = { 0 };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        b.len = 0;
        json_write_double(&b, cases[i].v);
        ck_assert_str_eq(b.p, cases[i].want);
    }
    b.len = 0;
    json_write_double(&b, NAN);
    json_write_double(&b, INFINITY);
    json_write_double(&b, -INFINITY);
    ck_assert_str_eq(b.p, "nullnullnull");
    strbuf_free(&b);
}
END_TEST

START_TEST(output_parses_back) {
    const char in[] = "q\"\\\n\x01 \xC3\xA9 \xF0\x9F\x98\x80 end";
    strbuf b = { 0 };
    json_write_string(&b, in, sizeof in - 1);
    cJSON *j = cJSON_Parse(b.p);
    ck_assert_ptr_nonnull(j);
    ck_assert(cJSON_IsString(j));
    ck_assert_str_eq(j->valuestring, in);
    cJSON_Delete(j);
    strbuf_free(&b);
}
END_TEST

START_TEST(oom_buffer_is_a_no_op) {
    strbuf b = { 0 };
    b.oom = 1;
    json_write_string(&b, "abc", 3);
    json_write_string2(&b, "a", 1, "b", 1);
    json_write_double(&b, 1.5);
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.len, 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("json_writer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, escapes_exact);
    tcase_add_test(tc, utf8_kept_or_replaced);
    tcase_add_test(tc, two_part_strings);
    tcase_add_test(tc, numbers);
    tcase_add_test(tc, output_parses_back);
    tcase_add_test(tc, oom_buffer_is_a_no_op);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
