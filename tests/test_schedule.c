/*
 * test_schedule.c - Check suite for orchestrator/schedule.{c,h}: learning
 * rates at chosen steps for warmup + cosine, warmup + linear, constant, and
 * the edge cases (no warmup, warmup >= total, steps past the end).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "orchestrator/schedule.h"

#define NEAR(a, b) ck_assert_msg(fabs((a) - (b)) <= 1e-12 * fmax(1.0, fabs(b)), \
                                 "%.17g != %.17g", (double)(a), (double)(b))

START_TEST(test_cosine) {
    schedule s = {SCHEDULE_COSINE, 1e-3, 1e-4, 10, 110};
    NEAR(schedule_lr(&s, 1), 1e-4);      /* warmup: lr * 1/10 */
    NEAR(schedule_lr(&s, 5), 5e-4);
    NEAR(schedule_lr(&s, 10), 1e-3);     /* peak at the end of warmup */
    NEAR(schedule_lr(&s, 60), 5.5e-4);   /* halfway: (lr+min_lr)/2 */
    /* a quarter of the way: min + (lr-min)*(1+cos(pi/4))/2 */
    NEAR(schedule_lr(&s, 35), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI / 4)));
    NEAR(schedule_lr(&s, 110), 1e-4);    /* last step at min_lr */
    NEAR(schedule_lr(&s, 500), 1e-4);    /* past the end: stays there */
    /* monotone non-increasing after warmup */
    for (uint64_t t = 11; t <= 110; t++)
        ck_assert(schedule_lr(&s, t) <= schedule_lr(&s, t - 1) + 1e-18);
}
END_TEST

START_TEST(test_linear) {
    schedule s = {SCHEDULE_LINEAR, 2e-3, 0.0, 4, 104};
    NEAR(schedule_lr(&s, 2), 1e-3);
    NEAR(schedule_lr(&s, 4), 2e-3);
    NEAR(schedule_lr(&s, 29), 1.5e-3);   /* 25% of the decay */
    NEAR(schedule_lr(&s, 54), 1e-3);     /* 50% */
    NEAR(schedule_lr(&s, 104), 0.0);
}
END_TEST

START_TEST(test_constant) {
    schedule s = {SCHEDULE_CONSTANT, 3e-4, 1e-5, 3, 100};
    NEAR(schedule_lr(&s, 1), 1e-4);
    NEAR(schedule_lr(&s, 3), 3e-4);
    NEAR(schedule_lr(&s, 4), 3e-4);
    NEAR(schedule_lr(&s, 100), 3e-4);
    schedule n = {SCHEDULE_CONSTANT, 3e-4, 0, 0, 100};
    NEAR(schedule_lr(&n, 1), 3e-4);
}
END_TEST

START_TEST(test_edges) {
    schedule s = {SCHEDULE_COSINE, 1e-3, 1e-4, 0, 100};
    NEAR(schedule_lr(&s, 0), schedule_lr(&s, 1)); /* 0 treated as 1 */
    NEAR(schedule_lr(&s, 1), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI * 0.01)));
    schedule w = {SCHEDULE_LINEAR, 1e-3, 1e-4, 50, 20}; /* warmup > total */
    NEAR(schedule_lr(&w, 20), 4e-4);
    NEAR(schedule_lr(&w, 51), 1e-4);
}
END_TEST

START_TEST(test_names) {
    schedule_kind k;
    ck_assert_int_eq(schedule_parse_kind("cosine", &k), 0);
    ck_assert_int_eq(k, SCHEDULE_COSINE);
    ck_assert_int_eq(schedule_parse_kind("linear", &k), 0);
    ck_assert_int_eq(k, SCHEDULE_LINEAR);
    ck_assert_int_eq(schedule_parse_kind("constant", &k), 0);
    ck_assert_int_eq(k, SCHEDULE_CONSTANT);
    ck_assert_int_eq(schedule_parse_kind("step", &k), -1);
    ck_assert_str_eq(schedule_kind_name(SCHEDULE_LINEAR), "linear");
}
END_TEST

int main(void) {
    Suite *s = suite_create("schedule");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_cosine);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_constant);
    tcase_add_test(tc, test_edges);
    tcase_add_test(tc, test_names);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
