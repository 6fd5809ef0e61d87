/*
 * test_lr_schedule.c - Check suite for orchestrator/train/lr_schedule.{c,h}: learning
 * rates at chosen steps for warmup + cosine, warmup + linear, constant, and
 * the edge cases (no warmup, warmup >= total, steps past the end).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "orchestrator/train/lr_schedule.h"
#include "tests/test_util.h"

#define NEAR(a, b)                                                                 \
    ck_assert_msg(fabs((a) - (b)) <= 1e-12 * fmax(1.0, fabs(b)), "%.17g != %.17g", \
                  (double)(a), (double)(b))

START_TEST(test_cosine) {
    lr_schedule s = { LR_SCHEDULE_COSINE, 1e-3, 1e-4, 10, 110 };
    NEAR(lr_schedule_at(&s, 1), 1e-4); /* warmup: lr * 1/10 */
    NEAR(lr_schedule_at(&s, 5), 5e-4);
    NEAR(lr_schedule_at(&s, 10), 1e-3);   /* peak at the end of warmup */
    NEAR(lr_schedule_at(&s, 60), 5.5e-4); /* halfway: (lr+min_lr)/2 */
    /* a quarter of the way: min + (lr-min)*(1+cos(pi/4))/2 */
    NEAR(lr_schedule_at(&s, 35), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI / 4)));
    NEAR(lr_schedule_at(&s, 110), 1e-4); /* last step at min_lr */
    NEAR(lr_schedule_at(&s, 500), 1e-4); /* past the end: stays there */
    /* monotone non-increasing after warmup */
    for (uint64_t t = 11; t <= 110; t++)
        ck_assert(lr_schedule_at(&s, t) <= lr_schedule_at(&s, t - 1) + 1e-18);
}
END_TEST

START_TEST(test_linear) {
    lr_schedule s = { LR_SCHEDULE_LINEAR, 2e-3, 0.0, 4, 104 };
    NEAR(lr_schedule_at(&s, 2), 1e-3);
    NEAR(lr_schedule_at(&s, 4), 2e-3);
    NEAR(lr_schedule_at(&s, 29), 1.5e-3); /* 25% of the decay */
    NEAR(lr_schedule_at(&s, 54), 1e-3);   /* 50% */
    NEAR(lr_schedule_at(&s, 104), 0.0);
}
END_TEST

START_TEST(test_constant) {
    lr_schedule s = { LR_SCHEDULE_CONSTANT, 3e-4, 1e-5, 3, 100 };
    NEAR(lr_schedule_at(&s, 1), 1e-4);
    NEAR(lr_schedule_at(&s, 3), 3e-4);
    NEAR(lr_schedule_at(&s, 4), 3e-4);
    NEAR(lr_schedule_at(&s, 100), 3e-4);
    lr_schedule n = { LR_SCHEDULE_CONSTANT, 3e-4, 0, 0, 100 };
    NEAR(lr_schedule_at(&n, 1), 3e-4);
}
END_TEST

START_TEST(test_edges) {
    lr_schedule s = { LR_SCHEDULE_COSINE, 1e-3, 1e-4, 0, 100 };
    NEAR(lr_schedule_at(&s, 0), lr_schedule_at(&s, 1)); /* 0 treated as 1 */
    NEAR(lr_schedule_at(&s, 1), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI * 0.01)));
    lr_schedule w = { LR_SCHEDULE_LINEAR, 1e-3, 1e-4, 50, 20 }; /* warmup > total */
    NEAR(lr_schedule_at(&w, 20), 4e-4);
    NEAR(lr_schedule_at(&w, 51), 1e-4);
}
END_TEST

START_TEST(test_names) {
    lr_schedule_kind k;
    ck_assert_int_eq(lr_schedule_parse_kind("cosine", &k), 0);
    ck_assert_int_eq(k, LR_SCHEDULE_COSINE);
    ck_assert_int_eq(lr_schedule_parse_kind("linear", &k), 0);
    ck_assert_int_eq(k, LR_SCHEDULE_LINEAR);
    ck_assert_int_eq(lr_schedule_parse_kind("constant", &k), 0);
    ck_assert_int_eq(k, LR_SCHEDULE_CONSTANT);
    ck_assert_int_eq(lr_schedule_parse_kind("step", &k), -1);
    ck_assert_str_eq(lr_schedule_kind_name(LR_SCHEDULE_LINEAR), "linear");
}
END_TEST

int main(void) {
    Suite *s = suite_create("lr_schedule");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_cosine);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_constant);
    tcase_add_test(tc, test_edges);
    tcase_add_test(tc, test_names);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
