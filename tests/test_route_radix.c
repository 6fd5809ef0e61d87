/*
 * test_route_radix.c - the approximate radix tree of `orch route`
 * (orchestrator/route/radix_text.h): matches inside and across edges, edge
 * splits, shared prefixes stored once, LRU eviction order and cascades, and
 * a randomized comparison with a brute-force longest-common-prefix.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/route/radix_text.h"
#include "tests/test_util.h"

static size_t m(radix_text *t, const char *s) {
    return radix_text_match(t, s, strlen(s));
}
static void ins(radix_text *t, const char *s) {
    ck_assert_int_eq(radix_text_insert(t, s, strlen(s)), 0);
}

START_TEST(test_match_and_split) {
    radix_text *t = radix_text_create();
    ck_assert_uint_eq(m(t, "hello"), 0);
    ins(t, "hello world");
    ck_assert_uint_eq(radix_text_size(t), 11);
    ck_assert_uint_eq(radix_text_nodes(t), 1);
    ck_assert_uint_eq(m(t, "hello there"), 6);    /* ends inside the edge */
    ck_assert_uint_eq(m(t, "hello world!!"), 11); /* past the stored text */
    ck_assert_uint_eq(m(t, "hel"), 3);
    ck_assert_uint_eq(m(t, "xyz"), 0);
    ins(t, "hello there");
    ck_assert_uint_eq(radix_text_nodes(t), 3); /* "hello " -> "world", "there" */
    ck_assert_uint_eq(radix_text_size(t), 16);
    ck_assert_uint_eq(m(t, "hello there"), 11);
    ck_assert_uint_eq(m(t, "hello world"), 11);
    ck_assert_uint_eq(m(t, "hello thorn"), 8);
    /* the same text again, and a prefix of a stored one, add nothing */
    ins(t, "hello there");
    ins(t, "hello");
    ck_assert_uint_eq(radix_text_size(t), 16);
    ck_assert_uint_eq(m(t, "hello"), 5);
    /* an extension grows by its new bytes only */
    ins(t, "hello there, general");
    ck_assert_uint_eq(radix_text_size(t), 25);
    ck_assert_uint_eq(m(t, "hello there, general kenobi"), 20);
    /* bytes, not strings: NULs and high bytes */
    ck_assert_int_eq(radix_text_insert(t, "a\0b\xff", 4), 0);
    ck_assert_uint_eq(radix_text_match(t, "a\0b\xfe", 4), 3);
    radix_text_free(t);
    radix_text_free(NULL);
}
END_TEST

START_TEST(test_lru_eviction) {
    radix_text *t = radix_text_create();
    ins(t, "aaaaaaaaaa");
    ins(t, "bbbbbbbbbb");
    ins(t, "cccccccccc");
    ck_assert_uint_eq(m(t, "aaaaaaaaaa"), 10); /* a is now newer than b and c */
    ck_assert_uint_eq(radix_text_evict(t, 100), 0);
    ck_assert_uint_eq(radix_text_evict(t, 20), 10); /* b, the oldest, goes */
    ck_assert_uint_eq(m(t, "bbbbbbbbbb"), 0);
    ck_assert_uint_eq(m(t, "aaaaaaaaaa"), 10);
    ck_assert_uint_eq(m(t, "cccccccccc"), 10);
    ck_assert_uint_eq(radix_text_evict(t, 15), 10); /* then a (c was touched last) */
    ck_assert_uint_eq(m(t, "aaaaaaaaaa"), 0);
    ck_assert_uint_eq(m(t, "cccccccccc"), 10);
    radix_text_free(t);
}
END_TEST

START_TEST(test_eviction_cascades) {
    radix_text *t = radix_text_create();
    ins(t, "system prompt one: q1");
    ins(t, "system prompt one: q2");
    ins(t, "other");
    /* "system prompt one: q" + "1" + "2" + "other" */
    ck_assert_uint_eq(radix_text_nodes(t), 4);
    ck_assert_uint_eq(m(t, "other"), 5); /* the system prompt's leaves are older */
    /* to 5 bytes: both leaves, then their parent (now a leaf), go */
    ck_assert_uint_eq(radix_text_evict(t, 5), 22);
    ck_assert_uint_eq(radix_text_size(t), 5);
    ck_assert_uint_eq(radix_text_nodes(t), 1);
    ck_assert_uint_eq(m(t, "system prompt one: q1"), 0);
    ck_assert_uint_eq(radix_text_evict(t, 0), 5);
    ck_assert_uint_eq(radix_text_nodes(t), 0);
    ins(t, "again");
    ck_assert_uint_eq(m(t, "again"), 5);
    radix_text_free(t);
}
END_TEST

/* Longest common prefix of s with any of the strings. */
static size_t brute(char **set, size_t n, const char *s) {
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (set[i][k] && s[k] && set[i][k] == s[k]) k++;
        if (k > best) best = k;
    }
    return best;
}

START_TEST(test_random_against_brute_force) {
    enum { N = 600 };
    char *set[N];
    uint64_t z = 12345;
    radix_text *t = radix_text_create();
    for (int i = 0; i < N; i++) {
        size_t len = 1 + test_xorshift64(&z) % 40;
        set[i] = malloc(len + 1);
        for (size_t k = 0; k < len; k++)
            set[i][k] = (char)('a' + test_xorshift64(&z) % 3);
        set[i][len] = '\0';
        ins(t, set[i]);
    }
    for (int q = 0; q < 2000; q++) {
        char s[48];
        size_t len = test_xorshift64(&z) % 45;
        for (size_t k = 0; k < len; k++) s[k] = (char)('a' + test_xorshift64(&z) % 3);
        s[len] = '\0';
        ck_assert_uint_eq(m(t, s), brute(set, N, s));
    }
    size_t half = radix_text_size(t) / 2;
    radix_text_evict(t, half);
    ck_assert_uint_le(radix_text_size(t), half);
    for (int i = 0; i < N; i++) ck_assert_uint_le(m(t, set[i]), strlen(set[i]));
    for (int i = 0; i < N; i++) free(set[i]);
    radix_text_free(t);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("route_radix");
    TCase *tc = tcase_create("radix");
    tcase_add_test(tc, test_match_and_split);
    tcase_add_test(tc, test_lru_eviction);
    tcase_add_test(tc, test_eviction_cascades);
    tcase_add_test(tc, test_random_against_brute_force);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
