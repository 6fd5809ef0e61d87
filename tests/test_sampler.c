/*
 * test_sampler.c - the sampler: greedy and ties, the allowed-token mask,
 * temperature sampling against the exact softmax (frequency test), top-k and
 * top-p supports, seeded determinism and independent streams, log-probs
 * against a direct computation, parameter checks, non-finite logits.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/serve/sampler.h"
#include "tests/test_util.h"

static const float L[6] = { 1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f };

static double softmax_p(const float *l, int n, double t, int v) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) m = fmax(m, l[i] / t);
    for (int i = 0; i < n; i++) s += exp(l[i] / t - m);
    return exp(l[v] / t - m) / s;
}

START_TEST(greedy_argmax_lowest_id_on_ties) {
    sampler_params p = sampler_params_default();
    p.temperature = 0;
    ck_assert_int_eq(sampler_sample(&p, L, 6, NULL, NULL, NULL), 1);
    ck_assert_int_eq(sampler_argmax(L, 6, NULL), 1);
    /* greedy does not touch the RNG */
    sampler_rng r, r0;
    sampler_rng_seed(&r, 7);
    r0 = r;
    ck_assert_int_eq(sampler_sample(&p, L, 6, NULL, &r, NULL), 1);
    ck_assert_mem_eq(&r, &r0, sizeof r);
}
END_TEST

START_TEST(mask_restricts_every_mode) {
    uint32_t mask[1] = { (1u << 2) | (1u << 5) }; /* tokens 2 and 5 */
    sampler_params p = sampler_params_default();
    p.temperature = 0;
    ck_assert_int_eq(sampler_sample(&p, L, 6, mask, NULL, NULL), 2);
    sampler_ws *ws = sampler_ws_create(6);
    sampler_rng r;
    sampler_rng_seed(&r, 1);
    p.temperature = 1.5f;
    int seen2 = 0, seen5 = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t t = sampler_sample(&p, L, 6, mask, &r, ws);
        ck_assert(t == 2 || t == 5);
        seen2 += t == 2;
        seen5 += t == 5;
    }
    ck_assert(seen2 > 0 && seen5 > 0);
    uint32_t none[1] = { 0 };
    ck_assert_int_eq(sampler_sample(&p, L, 6, none, &r, ws), -1);
    p.temperature = 0;
    ck_assert_int_eq(sampler_sample(&p, L, 6, none, &r, ws), -1);
    /* a larger vocabulary: words beyond the first */
    float big[70];
    for (int i = 0; i < 70; i++) big[i] = (float)i;
    uint32_t m3[3] = { 0, 1u << 1, 0 }; /* only token 33 */
    ck_assert_int_eq(sampler_argmax(big, 70, m3), 33);
    ck_assert(sampler_mask_allows(m3, 33) && !sampler_mask_allows(m3, 69));
    ck_assert_uint_eq(SAMPLER_MASK_WORDS(70), 3);
    sampler_ws_free(ws);
}
END_TEST

/* Frequencies of 60000 draws match softmax(l/T) within 5 sigma. */
START_TEST(temperature_matches_softmax) {
    const double temps[] = { 0.5, 1.0, 2.0 };
    sampler_ws *ws = sampler_ws_create(6);
    for (size_t ti = 0; ti < 3; ti++) {
        sampler_params p = sampler_params_default();
        p.temperature = (float)temps[ti];
        sampler_rng r;
        sampler_rng_seed(&r, 1234 + ti);
        int count[6] = { 0 };
        const int N = 60000;
        for (int i = 0; i < N; i++) count[sampler_sample(&p, L, 6, NULL, &r, ws)]++;
        for (int v = 0; v < 6; v++) {
            double pv = softmax_p(L, 6, temps[ti], v);
            double sd = sqrt(N * pv * (1 - pv)) + 1;
            ck_assert_msg(fabs(count[v] - N * pv) < 5 * sd,
                          "T=%g v=%d count %d expected %.1f", temps[ti], v, count[v],
                          N * pv);
        }
    }
    sampler_ws_free(ws);
}
END_TEST

START_TEST(top_k_support_and_renormalisation) {
    sampler_ws *ws = sampler_ws_create(6);
    sampler_params p = sampler_params_default();
    p.top_k = 2; /* tokens 1 and 3 (both 3.0) */
    sampler_rng r;
    sampler_rng_seed(&r, 5);
    int c1 = 0, c3 = 0;
    for (int i = 0; i < 4000; i++) {
        int32_t t = sampler_sample(&p, L, 6, NULL, &r, ws);
        ck_assert(t == 1 || t == 3);
        c1 += t == 1;
        c3 += t == 3;
    }
    ck_assert(abs(c1 - c3) < 400); /* equal weights */
    p.top_k = 3;                   /* adds token 2 */
    int seen[6] = { 0 };
    for (int i = 0; i < 4000; i++) seen[sampler_sample(&p, L, 6, NULL, &r, ws)]++;
    ck_assert(seen[1] && seen[2] && seen[3]);
    ck_assert(!seen[0] && !seen[4] && !seen[5]);
    p.top_k = 100; /* larger than the vocabulary: no limit */
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 20000; i++) seen[sampler_sample(&p, L, 6, NULL, &r, ws)]++;
    for (int v = 0; v < 6; v++) ck_assert(seen[v] > 0);
    sampler_ws_free(ws);
}
END_TEST

START_TEST(top_p_nucleus_exact) {
    /* probabilities 0.5, 0.3, 0.15, 0.05 */
    float l[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
    sampler_ws *ws = sampler_ws_create(4);
    sampler_params p = sampler_params_default();
    sampler_rng r;
    sampler_rng_seed(&r, 9);
    struct {
        float top_p;
        int support;
    } cases[] = { { 0.4f, 1 },  { 0.55f, 2 }, { 0.75f, 2 },
                  { 0.85f, 3 }, { 0.9f, 3 },  { 0.99f, 4 } };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        p.top_p = cases[k].top_p;
        int seen[4] = { 0 };
        for (int i = 0; i < 6000; i++) seen[sampler_sample(&p, l, 4, NULL, &r, ws)]++;
        for (int v = 0; v < 4; v++)
            ck_assert_msg((seen[v] > 0) == (v < cases[k].support),
                          "top_p %g token %d seen %d", cases[k].top_p, v, seen[v]);
    }
    /* with top-k first: k=3 then p=0.8 of the renormalised {0.5,0.3,0.15} */
    p.top_k = 3;
    p.top_p = 0.8f;
    int seen[4] = { 0 };
    for (int i = 0; i < 6000; i++) seen[sampler_sample(&p, l, 4, NULL, &r, ws)]++;
    ck_assert(seen[0] && seen[1] && !seen[2] && !seen[3]);
    sampler_ws_free(ws);
}
END_TEST

START_TEST(seeded_determinism_and_streams) {
    float l[50];
    for (int i = 0; i < 50; i++) l[i] = (float)sin(i * 0.7) * 2;
    sampler_ws *ws = sampler_ws_create(50);
    sampler_params p = sampler_params_default();
    p.top_p = 0.95f;
    p.top_k = 20;
    sampler_rng a, b, c;
    sampler_rng_seed_stream(&a, 42, 0);
    sampler_rng_seed_stream(&b, 42, 0);
    sampler_rng_seed_stream(&c, 42, 1);
    int same_c = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = sampler_sample(&p, l, 50, NULL, &a, ws);
        int32_t y = sampler_sample(&p, l, 50, NULL, &b, ws);
        int32_t z = sampler_sample(&p, l, 50, NULL, &c, ws);
        ck_assert_int_eq(x, y);
        same_c += x == z;
    }
    ck_assert(same_c < 200);
    /* stream 0 is the plain seed */
    sampler_rng p0, q0;
    sampler_rng_seed(&p0, 42);
    sampler_rng_seed_stream(&q0, 42, 0);
    ck_assert_mem_eq(&p0, &q0, sizeof p0);
    /* a draw consumes exactly one RNG value */
    sampler_rng d, e;
    sampler_rng_seed(&d, 3);
    e = d;
    (void)sampler_sample(&p, l, 50, NULL, &d, ws);
    (void)sampler_rng_next(&e);
    ck_assert_mem_eq(&d, &e, sizeof d);
    /* uniform in [0,1) */
    for (int i = 0; i < 1000; i++) {
        double u = sampler_rng_uniform(&d);
        ck_assert(u >= 0 && u < 1);
    }
    /* different seeds differ; seed 0 works */
    sampler_rng s0, s1;
    sampler_rng_seed(&s0, 0);
    sampler_rng_seed(&s1, 1);
    ck_assert(sampler_rng_next(&s0) != sampler_rng_next(&s1));
    sampler_ws_free(ws);
}
END_TEST

START_TEST(logprobs_match_direct_computation) {
    for (int v = 0; v < 6; v++) {
        double want = log(softmax_p(L, 6, 1.0, v));
        ck_assert_double_eq_tol(sampler_logprob(L, 6, v), want, 1e-9);
    }
    ck_assert(isinf(sampler_logprob(L, 6, 6)) && isinf(sampler_logprob(L, 6, -1)));
    int32_t ids[8];
    double lps[8];
    uint32_t n = sampler_top_logprobs(L, 6, 4, ids, lps);
    ck_assert_uint_eq(n, 4);
    int32_t want_ids[4] = { 1, 3, 2, 0 };
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(ids[i], want_ids[i]);
        ck_assert_double_eq_tol(lps[i], log(softmax_p(L, 6, 1.0, want_ids[i])), 1e-9);
    }
    ck_assert_uint_eq(sampler_top_logprobs(L, 6, 10, ids, lps), 6);
    ck_assert_int_eq(ids[5], 4);
}
END_TEST

START_TEST(non_finite_logits_and_checks) {
    float l[4] = { NAN, -INFINITY, 1.0f, INFINITY };
    sampler_params p = sampler_params_default();
    p.temperature = 0;
    ck_assert_int_eq(sampler_sample(&p, l, 4, NULL, NULL, NULL), 2);
    sampler_ws *ws = sampler_ws_create(4);
    sampler_rng r;
    sampler_rng_seed(&r, 1);
    p.temperature = 1;
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(sampler_sample(&p, l, 4, NULL, &r, ws), 2);
    float bad[2] = { NAN, -INFINITY };
    ck_assert_int_eq(sampler_sample(&p, bad, 2, NULL, &r, ws), -1);
    /* vocabulary larger than the workspace is refused */
    float l8[8] = { 0 };
    ck_assert_int_eq(sampler_sample(&p, l8, 8, NULL, &r, ws), -1);
    sampler_ws_free(ws);
    sampler_ws_free(NULL);
    char err[128];
    sampler_params q = sampler_params_default();
    ck_assert_int_eq(sampler_params_check(&q, err, sizeof err), 0);
    q.temperature = -1;
    ck_assert_int_eq(sampler_params_check(&q, err, sizeof err), -1);
    ck_assert(strstr(err, "temperature"));
    q = sampler_params_default();
    q.top_p = 0;
    ck_assert_int_eq(sampler_params_check(&q, err, sizeof err), -1);
    ck_assert(strstr(err, "top_p"));
    q.top_p = NAN;
    ck_assert_int_eq(sampler_params_check(&q, err, sizeof err), -1);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, greedy_argmax_lowest_id_on_ties);
    tcase_add_test(tc, mask_restricts_every_mode);
    tcase_add_test(tc, temperature_matches_softmax);
    tcase_add_test(tc, top_k_support_and_renormalisation);
    tcase_add_test(tc, top_p_nucleus_exact);
    tcase_add_test(tc, seeded_determinism_and_streams);
    tcase_add_test(tc, logprobs_match_direct_computation);
    tcase_add_test(tc, non_finite_logits_and_checks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
