/*
 * test_sampler.c - the sampler: greedy and ties, the allowed-token mask,
 * temperature sampling against the exact softmax (frequency test), top-k and
 * top-p supports, seeded determinism and independent streams, log-probs
 * against a direct computation, parameter checks, non-finite logits; min-p,
 * logit_bias, bans and the presence / frequency / repetition penalties against
 * hand-computed values and distributions.
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

/* min-p after temperature: L = {1,3,2,3,-1,0.5}, T = 1, min_p 0.3: the
 * weights relative to the best (e^(l-3)) are e^-2 = .135, 1, e^-1 = .368, 1,
 * e^-4, e^-2.5: tokens 1, 2, 3 stay, renormalised. */
START_TEST(min_p_hand_computed) {
    sampler_ws *ws = sampler_ws_create(6);
    sampler_params p = sampler_params_default();
    p.min_p = 0.3f;
    double d[6];
    ck_assert_int_eq(sampler_distribution(&p, L, 6, NULL, ws, d), 0);
    double z = 2.0 + exp(-1.0);
    const double want[6] = { 0, 1 / z, exp(-1.0) / z, 1 / z, 0, 0 };
    for (int v = 0; v < 6; v++) ck_assert_double_eq_tol(d[v], want[v], 1e-12);
    /* T = 0.5 sharpens first: e^(2(l-3)): token 2 weighs e^-2 = .135 < .3 */
    p.temperature = 0.5f;
    ck_assert_int_eq(sampler_distribution(&p, L, 6, NULL, ws, d), 0);
    ck_assert_double_eq_tol(d[1], 0.5, 1e-12);
    ck_assert_double_eq_tol(d[3], 0.5, 1e-12);
    ck_assert_double_eq(d[2], 0.0);
    /* draws stay inside the support and follow it */
    sampler_rng r;
    sampler_rng_seed(&r, 99);
    int seen[6] = { 0 };
    for (int i = 0; i < 4000; i++) seen[sampler_sample(&p, L, 6, NULL, &r, ws)]++;
    ck_assert_int_eq(seen[0] + seen[2] + seen[4] + seen[5], 0);
    ck_assert(abs(seen[1] - 2000) < 5 * 32 && abs(seen[3] - 2000) < 5 * 32);
    /* min_p 1 keeps only the ties of the best */
    p.min_p = 1.0f;
    ck_assert_int_eq(sampler_distribution(&p, L, 6, NULL, ws, d), 0);
    ck_assert_double_eq_tol(d[1] + d[3], 1.0, 1e-12);
    sampler_ws_free(ws);
}
END_TEST

/* Each processing step against values worked out by hand. */
START_TEST(logit_processing_hand_computed) {
    sampler_ws *ws = sampler_ws_create(6);
    sampler_params p = sampler_params_default();
    sampler_history h = { 0 };
    /* nothing to do: the logits themselves */
    ck_assert_ptr_eq(sampler_process_logits(&p, &h, L, 6, ws), L);
    /* presence 0.5 + frequency 0.25 x count over the output {1,1,4}: token 1
     * 3 - 0.5 - 0.5 = 2, token 4 -1 - 0.5 - 0.25 = -1.75; the prompt is not
     * counted by these two */
    const int32_t prompt[2] = { 0, 5 }, out[3] = { 1, 4, 1 };
    h.prompt = prompt;
    h.n_prompt = 2;
    h.output = out;
    h.n_output = 3;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    const float *x = sampler_process_logits(&p, &h, L, 6, ws);
    ck_assert_ptr_ne(x, L);
    const float w1[6] = { 1.0f, 2.0f, 2.0f, 3.0f, -1.75f, 0.5f };
    for (int v = 0; v < 6; v++) ck_assert_float_eq_tol(x[v], w1[v], 1e-6f);
    /* repetition 2 over prompt + output {0,5,1,4}: positive / 2, negative x 2 */
    p.presence_penalty = p.frequency_penalty = 0.0f;
    p.repetition_penalty = 2.0f;
    x = sampler_process_logits(&p, &h, L, 6, ws);
    const float w2[6] = { 0.5f, 1.5f, 2.0f, 3.0f, -2.0f, 0.25f };
    for (int v = 0; v < 6; v++) ck_assert_float_eq_tol(x[v], w2[v], 1e-6f);
    /* all together, then bias and a ban: rep first (3/2 = 1.5), then -0.5 -0.5 */
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    const int32_t bias_ids[2] = { 2, 9 }; /* 9 is out of range: skipped */
    const float bias[2] = { -100.0f, 5.0f };
    const int32_t banned[1] = { 3 };
    h.bias_ids = bias_ids;
    h.bias = bias;
    h.n_bias = 2;
    h.banned = banned;
    h.n_banned = 1;
    x = sampler_process_logits(&p, &h, L, 6, ws);
    const float w3[6] = { 0.5f, 0.5f, -98.0f, -INFINITY, -2.75f, 0.25f };
    for (int v = 0; v < 6; v++) {
        if (isinf(w3[v]))
            ck_assert(isinf(x[v]) && x[v] < 0);
        else
            ck_assert_float_eq_tol(x[v], w3[v], 1e-5f);
    }
    /* greedy follows the processed logits (tie 0/1: lowest id) */
    p.temperature = 0.0f;
    ck_assert_int_eq(sampler_sample(&p, x, 6, NULL, NULL, ws), 0);
    /* counts are cleared between calls: the same call twice is the same */
    const float *y = sampler_process_logits(&p, &h, L, 6, ws);
    for (int v = 0; v < 6; v++) ck_assert(y[v] == w3[v] || fabsf(y[v] - w3[v]) < 1e-5f);
    /* something to do without scratch: NULL */
    ck_assert_ptr_null(sampler_process_logits(&p, &h, L, 6, NULL));
    sampler_ws_free(ws);
}
END_TEST

/* Processed logits drawn with temperature: frequencies within 5 sigma of
 * softmax over the hand-computed processed values. */
START_TEST(penalised_draws_match_softmax) {
    sampler_ws *ws = sampler_ws_create(6);
    sampler_params p = sampler_params_default();
    p.frequency_penalty = 1.0f;
    const int32_t out[2] = { 1, 3 };
    sampler_history h = { .output = out, .n_output = 2 };
    const float want_l[6] = { 1.0f, 2.0f, 2.0f, 2.0f, -1.0f, 0.5f };
    sampler_rng r;
    sampler_rng_seed(&r, 7);
    int count[6] = { 0 };
    const int N = 30000;
    for (int i = 0; i < N; i++) {
        const float *x = sampler_process_logits(&p, &h, L, 6, ws);
        count[sampler_sample(&p, x, 6, NULL, &r, ws)]++;
    }
    for (int v = 0; v < 6; v++) {
        double pv = softmax_p(want_l, 6, 1.0, v);
        double sd = sqrt(N * pv * (1 - pv)) + 1;
        ck_assert_msg(fabs(count[v] - N * pv) < 5 * sd, "v=%d count %d expected %.1f", v,
                      count[v], N * pv);
    }
    sampler_ws_free(ws);
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
    tcase_add_test(tc, min_p_hand_computed);
    tcase_add_test(tc, logit_processing_hand_computed);
    tcase_add_test(tc, penalised_draws_match_softmax);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
