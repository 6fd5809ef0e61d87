/*
 * test_route_policy.c - the routing decisions of `orch route`: each policy
 * of orchestrator/route/route_policy.h on crafted candidates (cache hit over
 * the threshold, smallest tree below it, imbalance thresholds, eligibility),
 * and the worker set (route_workers.h) against small fake workers on
 * loopback: crafted prefixes stick to one worker and spread over the set,
 * model filtering, health checks taking a worker out and back, back-off,
 * workers added and removed.
 */
#include <check.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "orchestrator/core/metrics.h"
#include "orchestrator/route/route_policy.h"
#include "orchestrator/route/route_workers.h"
#include "tests/test_util.h"

static route_policy_params cache_params(void) {
    route_policy_params p = { ROUTE_CACHE_AWARE, 0.5, 32, 1.0001 };
    return p;
}

static route_pick pick(route_policy_params p, route_candidate *c, size_t n, size_t len) {
    uint64_t rr = 0, rng = 1;
    return route_policy_pick(&p, c, n, len, &rr, &rng);
}

START_TEST(test_cache_aware_decisions) {
    route_candidate c[3] = { { 1, 0, 10, 500 }, { 1, 0, 80, 900 }, { 1, 0, 0, 100 } };
    /* 80 of 100 bytes match worker 1 (> 0.5): there */
    route_pick p = pick(cache_params(), c, 3, 100);
    ck_assert_int_eq(p.index, 1);
    ck_assert_int_eq(p.reason, ROUTE_WHY_CACHE);
    ck_assert(p.match_ratio > 0.79 && p.match_ratio < 0.81);
    /* exactly at the threshold is not over it: the smallest tree */
    c[1].match = 50;
    p = pick(cache_params(), c, 3, 100);
    ck_assert_int_eq(p.index, 2);
    ck_assert_int_eq(p.reason, ROUTE_WHY_SMALLEST);
    /* smallest-tree ties go to the less loaded */
    c[0].tree_size = 100;
    c[2].load = 3;
    p = pick(cache_params(), c, 3, 100);
    ck_assert_int_eq(p.index, 0);
    /* match ties go to the less loaded too */
    c[0].match = c[1].match = 70;
    c[0].load = 2;
    c[1].load = 1;
    p = pick(cache_params(), c, 3, 100);
    ck_assert_int_eq(p.index, 1);
    /* the ratio is the chosen worker's: below the threshold, the smallest tree's */
    c[2].match = 30;
    c[0].match = c[1].match = 40;
    c[0].tree_size = 900;
    p = pick(cache_params(), c, 3, 100);
    ck_assert_int_eq(p.index, 2);
    ck_assert(p.match_ratio > 0.29 && p.match_ratio < 0.31);
    /* an empty request: ratio 0, the smallest tree */
    p = pick(cache_params(), c, 3, 0);
    ck_assert_int_eq(p.reason, ROUTE_WHY_SMALLEST);
    ck_assert(p.match_ratio == 0.0);
}
END_TEST

START_TEST(test_cache_aware_balance) {
    /* worker 0 has the cache but 40 requests more than worker 1 */
    route_candidate c[2] = { { 1, 41, 100, 100 }, { 1, 1, 0, 100 } };
    route_pick p = pick(cache_params(), c, 2, 100);
    ck_assert_int_eq(p.index, 1);
    ck_assert_int_eq(p.reason, ROUTE_WHY_BALANCE);
    /* max - min = 32 is not over balance_abs: the cache wins */
    c[0].load = 33;
    p = pick(cache_params(), c, 2, 100);
    ck_assert_int_eq(p.index, 0);
    ck_assert_int_eq(p.reason, ROUTE_WHY_CACHE);
    /* the relative test: 100 vs 60 is imbalanced only with balance_rel < 100/60 */
    c[0].load = 100;
    c[1].load = 60;
    route_policy_params rel = cache_params();
    rel.balance_rel = 2.0;
    p = pick(rel, c, 2, 100);
    ck_assert_int_eq(p.reason, ROUTE_WHY_CACHE);
    rel.balance_rel = 1.5;
    p = pick(rel, c, 2, 100);
    ck_assert_int_eq(p.reason, ROUTE_WHY_BALANCE);
    ck_assert_int_eq(p.index, 1);
    /* an ineligible worker's load does not count */
    c[1].eligible = 0;
    p = pick(rel, c, 2, 100);
    ck_assert_int_eq(p.index, 0);
    c[0].eligible = 0;
    p = pick(rel, c, 2, 100);
    ck_assert_int_eq(p.index, -1);
}
END_TEST

START_TEST(test_other_policies) {
    route_candidate c[4] = {
        { 1, 5, 0, 0 }, { 0, 0, 0, 0 }, { 1, 2, 0, 0 }, { 1, 9, 0, 0 }
    };
    route_policy_params p = { ROUTE_ROUND_ROBIN, 0.5, 32, 1.0001 };
    uint64_t rr = 0, rng = 7;
    int seq[6];
    for (int i = 0; i < 6; i++) seq[i] = route_policy_pick(&p, c, 4, 10, &rr, &rng).index;
    const int want[6] = { 0, 2, 3, 0, 2, 3 }; /* 1 is skipped */
    for (int i = 0; i < 6; i++) ck_assert_int_eq(seq[i], want[i]);
    p.kind = ROUTE_LEAST_LOAD;
    ck_assert_int_eq(route_policy_pick(&p, c, 4, 10, &rr, &rng).index, 2);
    p.kind = ROUTE_POWER_OF_TWO;
    int seen[4] = { 0 };
    for (int i = 0; i < 400; i++)
        seen[route_policy_pick(&p, c, 4, 10, &rr, &rng).index]++;
    ck_assert_int_eq(seen[1], 0); /* ineligible */
    ck_assert_int_eq(seen[3], 0); /* the most loaded always loses its pair */
    ck_assert(seen[0] > 0 && seen[2] > seen[0]);
    /* one eligible: that one */
    c[0].eligible = c[3].eligible = 0;
    ck_assert_int_eq(route_policy_pick(&p, c, 4, 10, &rr, &rng).index, 2);
    route_policy_kind k;
    ck_assert_int_eq(route_policy_parse("power_of_two", &k), 0);
    ck_assert_int_eq(k, ROUTE_POWER_OF_TWO);
    ck_assert_int_eq(route_policy_parse("random", &k), -1);
    ck_assert_str_eq(route_policy_name(ROUTE_CACHE_AWARE), "cache_aware");
}
END_TEST

/* ---- fake workers ------------------------------------------------------- */
typedef struct fake {
    struct MHD_Daemon *d;
    atomic_int healthy;
    const char *model;
    char url[64];
} fake;

static enum MHD_Result fake_answer(void *cls, struct MHD_Connection *conn,
                                   const char *url, const char *method,
                                   const char *version, const char *upload,
                                   size_t *upload_size, void **rc) {
    (void)method, (void)version, (void)upload, (void)upload_size, (void)rc;
    fake *f = cls;
    char body[256];
    unsigned st = 200;
    if (strcmp(url, "/health") == 0) {
        st = atomic_load(&f->healthy) ? 200 : 503;
        snprintf(body, sizeof body, "{\"status\":\"%s\"}", st == 200 ? "ok" : "loading");
    } else if (strcmp(url, "/v1/models") == 0) {
        snprintf(body, sizeof body,
                 "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\"}]}",
                 f->model);
    } else {
        st = 404;
        snprintf(body, sizeof body, "{}");
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret = MHD_queue_response(conn, st, r);
    MHD_destroy_response(r);
    return ret;
}

static void fake_start(fake *f, const char *model) {
    f->model = model;
    atomic_store(&f->healthy, 1);
    f->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL,
                            NULL, fake_answer, f, MHD_OPTION_END);
    ck_assert_ptr_nonnull(f->d);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(f->url, sizeof f->url, "http://127.0.0.1:%u", di->port);
}

static route_workers *set_of(metrics_registry *reg, route_policy_kind k) {
    route_workers_config c = { .policy = { k, 0.5, 32, 1.0001 },
                               .max_tree_size = 1 << 20,
                               .health_interval_s = 0.05,
                               .backoff_max_s = 0.2,
                               .health_timeout_s = 1,
                               .metrics = reg };
    char err[256];
    route_workers *s = route_workers_create(&c, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    return s;
}

/* A request through the set: pick, done. Returns the worker's index in f. */
static int route_one(route_workers *s, fake *f, int n, const char *model,
                     const char *text) {
    route_pick p;
    route_worker *w = route_workers_pick(s, model, text, strlen(text), NULL, 0, &p, NULL);
    if (!w) return -1;
    int idx = -1;
    for (int i = 0; i < n; i++)
        if (strcmp(route_worker_url(w), f[i].url) == 0) idx = i;
    route_workers_done(s, w, 0);
    return idx;
}

START_TEST(test_workers_prefixes_stick_and_spread) {
    fake f[4];
    metrics_registry *reg = metrics_registry_create();
    route_workers *s = set_of(reg, ROUTE_CACHE_AWARE);
    char err[256];
    for (int i = 0; i < 4; i++) {
        fake_start(&f[i], "m");
        ck_assert_int_eq(route_workers_add(s, f[i].url, err, sizeof err), 0);
    }
    ck_assert_int_eq(route_workers_add(s, f[0].url, err, sizeof err), 1); /* again */
    ck_assert_int_eq(route_workers_add(s, "ftp://x", err, sizeof err), -1);
    ck_assert(strstr(err, "http://HOST:PORT") != NULL);
    ck_assert_int_eq(route_workers_up(s), 0); /* not checked yet */
    ck_assert_int_eq(route_one(s, f, 4, NULL, "x"), -1);
    route_workers_check_all(s);
    ck_assert_int_eq(route_workers_up(s), 4);
    /* 4 system prompts of 200 bytes, 10 questions each, interleaved */
    char sys[4][256], req[1400];
    for (int k = 0; k < 4; k++) {
        memset(sys[k], 'a' + k, 200);
        sys[k][200] = '\0';
    }
    int home[4] = { -1, -1, -1, -1 };
    for (int q = 0; q < 10; q++)
        for (int k = 0; k < 4; k++) {
            snprintf(req, sizeof req, "%s question %d of prompt %d?", sys[k], q, k);
            int w = route_one(s, f, 4, "m", req);
            ck_assert_int_ge(w, 0);
            if (home[k] < 0) home[k] = w;
            ck_assert_msg(w == home[k], "prompt %d went to %d, then %d", k, home[k], w);
        }
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++) ck_assert_int_ne(home[a], home[b]);
    /* the set lists the trees */
    strbuf b = { 0 };
    route_workers_list_json(s, &b);
    ck_assert(strstr(b.p, "\"tree_bytes\":") && strstr(b.p, "\"requests\":10"));
    strbuf_free(&b);
    /* a worker taken out: its prompt moves, the others stay */
    route_pick p;
    route_worker *w = route_workers_pick(s, NULL, sys[0], 200, NULL, 0, &p, NULL);
    ck_assert_str_eq(route_worker_url(w), f[home[0]].url);
    route_workers_done(s, w, 1); /* failed: out until a check passes */
    ck_assert_int_eq(route_workers_up(s), 3);
    int moved = route_one(s, f, 4, NULL, sys[0]);
    ck_assert_int_ne(moved, home[0]);
    ck_assert_int_eq(route_one(s, f, 4, NULL, sys[1]), home[1]);
    /* a retry skips the workers tried */
    route_worker *tried[1] = { NULL };
    w = route_workers_pick(s, NULL, sys[1], 200, NULL, 0, &p, NULL);
    tried[0] = w;
    route_worker *w2 = route_workers_pick(s, NULL, sys[1], 200, tried, 1, &p, NULL);
    ck_assert_ptr_nonnull(w2);
    ck_assert_ptr_ne(w, w2);
    route_workers_done(s, w, 0);
    route_workers_done(s, w2, 0);
    route_workers_destroy(s);
    for (int i = 0; i < 4; i++) MHD_stop_daemon(f[i].d);
    metrics_registry_free(reg);
}
END_TEST

START_TEST(test_workers_models_health_and_set_changes) {
    fake f[3];
    metrics_registry *reg = metrics_registry_create();
    route_workers *s = set_of(reg, ROUTE_ROUND_ROBIN);
    char err[256];
    fake_start(&f[0], "base");
    fake_start(&f[1], "base");
    fake_start(&f[2], "lora-a");
    for (int i = 0; i < 3; i++) {
        char u[80];
        snprintf(u, sizeof u, "%s/", f[i].url); /* a trailing '/' is dropped */
        ck_assert_int_eq(route_workers_add(s, u, err, sizeof err), 0);
    }
    route_workers_check_all(s);
    ck_assert_int_eq(route_workers_up(s), 3);
    /* the union of models, each once */
    strbuf b = { 0 };
    route_workers_models_json(s, &b);
    ck_assert_ptr_nonnull(strstr(b.p, "\"id\":\"lora-a\""));
    const char *first = strstr(b.p, "\"id\":\"base\"");
    ck_assert_ptr_nonnull(first);
    ck_assert_ptr_null(strstr(first + 1, "\"id\":\"base\""));
    strbuf_free(&b);
    ck_assert_int_eq(route_workers_model_json(s, "lora-a", &b), 0);
    strbuf_free(&b);
    ck_assert_int_eq(route_workers_model_json(s, "nope", &b), -1);
    strbuf_free(&b);
    /* the LoRA model only where it is served; base never goes there */
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(route_one(s, f, 3, "lora-a", "q"), 2);
        ck_assert_int_ne(route_one(s, f, 3, "base", "q"), 2);
    }
    /* a model no worker lists: none, and said so */
    route_pick up;
    int unknown = 0;
    ck_assert_ptr_null(route_workers_pick(s, "unknown", "q", 1, NULL, 0, &up, &unknown));
    ck_assert_int_eq(unknown, 1);
    /* no model named: any worker */
    int any[3] = { 0 };
    for (int i = 0; i < 6; i++) any[route_one(s, f, 3, NULL, "q")]++;
    ck_assert(any[0] && any[1] && any[2]);
    /* health: an unhealthy worker is taken out by the health thread and put
     * back once it passes again */
    ck_assert_int_eq(route_workers_start(s), 0);
    atomic_store(&f[0].healthy, 0);
    double t0 = util_now();
    while (route_workers_up(s) != 2 && util_now() - t0 < 5) usleep(10000);
    ck_assert_int_eq(route_workers_up(s), 2);
    for (int i = 0; i < 6; i++) ck_assert_int_eq(route_one(s, f, 3, "base", "q"), 1);
    atomic_store(&f[0].healthy, 1);
    t0 = util_now();
    while (route_workers_up(s) != 3 && util_now() - t0 < 5) usleep(10000);
    ck_assert_int_eq(route_workers_up(s), 3);
    /* removed while a request holds it: the request's reference stays good */
    route_pick p;
    route_worker *w = route_workers_pick(s, "lora-a", "q", 1, NULL, 0, &p, NULL);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(route_workers_remove(s, f[2].url), 0);
    ck_assert_int_eq(route_workers_remove(s, f[2].url), -1);
    ck_assert_str_eq(route_worker_url(w), f[2].url);
    route_workers_done(s, w, 0);
    ck_assert_int_eq(route_workers_up(s), 2);
    ck_assert_int_ne(route_one(s, f, 3, "lora-a", "q"), 2);
    /* metrics: up gauges and per-worker counts */
    char *text;
    size_t len;
    ck_assert_int_eq(metrics_render(reg, &text, &len), 0);
    char line[160];
    snprintf(line, sizeof line, "orch_route_worker_up{worker=\"%s\"} 0", f[2].url);
    ck_assert_ptr_nonnull(strstr(text, line));
    ck_assert_ptr_nonnull(strstr(text, "orch_route_cache_match_ratio_count"));
    ck_assert_ptr_nonnull(
        strstr(text, "orch_route_health_checks_total{result=\"fail\"}"));
    free(text);
    route_workers_destroy(s);
    for (int i = 0; i < 3; i++) MHD_stop_daemon(f[i].d);
    metrics_registry_free(reg);
}
END_TEST

/* A worker's tree is trimmed (least recently used first) past max_tree_size. */
START_TEST(test_workers_tree_limit) {
    fake f;
    metrics_registry *reg = metrics_registry_create();
    route_workers_config c = { .policy = { ROUTE_CACHE_AWARE, 0.5, 32, 1.0001 },
                               .max_tree_size = 2000,
                               .health_interval_s = 1,
                               .metrics = reg };
    char err[256];
    route_workers *s = route_workers_create(&c, err, sizeof err);
    fake_start(&f, "m");
    ck_assert_int_eq(route_workers_add(s, f.url, err, sizeof err), 0);
    route_workers_check_all(s);
    char text[256];
    for (int i = 0; i < 20; i++) { /* 20 x 202 bytes, no shared prefixes */
        memset(text, 'a' + i, 200);
        snprintf(text + 200, 56, "%d", i);
        ck_assert_int_eq(route_one(s, &f, 1, NULL, text), 0);
    }
    strbuf b = { 0 };
    route_workers_list_json(s, &b);
    const char *tb = strstr(b.p, "\"tree_bytes\":");
    ck_assert_ptr_nonnull(tb);
    long bytes = strtol(tb + 13, NULL, 10);
    ck_assert_msg(bytes > 0 && bytes <= 2000, "tree of %ld bytes", bytes);
    strbuf_free(&b);
    /* the newest text is still there, the oldest is gone */
    route_pick p;
    route_worker *w = route_workers_pick(s, NULL, text, strlen(text), NULL, 0, &p, NULL);
    ck_assert(p.match_ratio == 1.0);
    route_workers_done(s, w, 0);
    memset(text, 'a', 200);
    snprintf(text + 200, 56, "%d", 0);
    w = route_workers_pick(s, NULL, text, strlen(text), NULL, 0, &p, NULL);
    ck_assert(p.match_ratio == 0.0);
    route_workers_done(s, w, 0);
    route_workers_destroy(s);
    MHD_stop_daemon(f.d);
    metrics_registry_free(reg);
}
END_TEST

START_TEST(test_url_normalize) {
    char out[ROUTE_URL_MAX], err[256];
    ck_assert_int_eq(route_url_normalize("http://127.0.0.1:8001//", out, err, sizeof err),
                     0);
    ck_assert_str_eq(out, "http://127.0.0.1:8001");
    ck_assert_int_eq(route_url_normalize("http://h:1/v1", out, err, sizeof err), -1);
    ck_assert_int_eq(route_url_normalize("https://h:1", out, err, sizeof err), -1);
    ck_assert_int_eq(route_url_normalize("http://", out, err, sizeof err), -1);
    ck_assert_int_eq(route_url_normalize("http://u@h:1", out, err, sizeof err), -1);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("route_policy");
    TCase *tc = tcase_create("policy");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_cache_aware_decisions);
    tcase_add_test(tc, test_cache_aware_balance);
    tcase_add_test(tc, test_other_policies);
    tcase_add_test(tc, test_workers_prefixes_stick_and_spread);
    tcase_add_test(tc, test_workers_models_health_and_set_changes);
    tcase_add_test(tc, test_workers_tree_limit);
    tcase_add_test(tc, test_url_normalize);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
