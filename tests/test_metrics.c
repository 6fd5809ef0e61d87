/*
 * test_metrics.c - the Prometheus registry: exact text exposition (HELP/TYPE,
 * labels, escaping, number formatting, cumulative histogram buckets with
 * +Inf, _sum and _count), registration rules (names, duplicates, same shape
 * returns the same family), NULL-safe updates, concurrent updates from many
 * threads, and the /metrics HTTP helper on a free port.
 */
#include <arpa/inet.h>
#include <check.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "orchestrator/core/metrics.h"
#include "tests/test_util.h"

static char *render(metrics_registry *r) {
    char *t = NULL;
    size_t len = 0;
    ck_assert_int_eq(metrics_render(r, &t, &len), 0);
    ck_assert_uint_eq(strlen(t), len);
    return t;
}

START_TEST(exposition_text_exact) {
    metrics_registry *r = metrics_registry_create();
    const char *ln[2] = { "endpoint", "status" };
    metrics_family *req = metrics_counter(r, "orch_requests_total",
                                          "Requests.\nBy endpoint \\ status.", 2, ln);
    metrics_family *g = metrics_gauge(r, "orch_running", "Running.", 0, NULL);
    const double b[3] = { 0.1, 0.5, 2 };
    metrics_family *h =
        metrics_histogram(r, "orch_latency_seconds", "Latency.", 0, NULL, b, 3);
    ck_assert_ptr_nonnull(req);
    metrics_counter_add(
        metrics_series_get(req, (const char *[]){ "/v1/completions", "200" }), 3);
    metrics_counter_add(
        metrics_series_get(req, (const char *[]){ "/v1/completions", "200" }), 1);
    metrics_counter_add(metrics_series_get(req, (const char *[]){ "a\"b\\c\nd", "400" }),
                        0.5);
    metrics_gauge_set(metrics_series_get(g, NULL), 7);
    metrics_gauge_add(metrics_series_get(g, NULL), -2.25);
    metrics_series *hs = metrics_series_get(h, NULL);
    const double obs[5] = { 0.05, 0.1, 0.3, 5, 1 };
    for (int i = 0; i < 5; i++) metrics_histogram_observe(hs, obs[i]);
    metrics_histogram_observe(hs, NAN); /* ignored */
    char *t = render(r);
    const char *want =
        "# HELP orch_requests_total Requests.\\nBy endpoint \\\\ status.\n"
        "# TYPE orch_requests_total counter\n"
        "orch_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 4\n"
        "orch_requests_total{endpoint=\"a\\\"b\\\\c\\nd\",status=\"400\"} 0.5\n"
        "# HELP orch_running Running.\n"
        "# TYPE orch_running gauge\n"
        "orch_running 4.75\n"
        "# HELP orch_latency_seconds Latency.\n"
        "# TYPE orch_latency_seconds histogram\n"
        "orch_latency_seconds_bucket{le=\"0.1\"} 2\n"
        "orch_latency_seconds_bucket{le=\"0.5\"} 3\n"
        "orch_latency_seconds_bucket{le=\"2\"} 4\n"
        "orch_latency_seconds_bucket{le=\"+Inf\"} 5\n"
        "orch_latency_seconds_sum 6.45\n"
        "orch_latency_seconds_count 5\n";
    ck_assert_str_eq(t, want);
    free(t);
    ck_assert_uint_eq(metrics_histogram_count(hs), 5);
    ck_assert_double_eq_tol(metrics_histogram_sum(hs), 6.45, 1e-12);
    metrics_registry_free(r);
}
END_TEST

START_TEST(registration_rules) {
    metrics_registry *r = metrics_registry_create();
    const char *l1[1] = { "kind" }, *l2[1] = { "other" }, *bad[1] = { "__x" },
               *dup[2] = { "a", "a" };
    metrics_family *a = metrics_counter(r, "x_total", "X.", 1, l1);
    ck_assert_ptr_eq(metrics_counter(r, "x_total", "X again.", 1, l1), a);
    ck_assert_ptr_null(metrics_counter(r, "x_total", "X.", 1, l2));
    ck_assert_ptr_null(metrics_gauge(r, "x_total", "X.", 1, l1));
    ck_assert_ptr_null(metrics_gauge(r, "9bad", "", 0, NULL));
    ck_assert_ptr_null(metrics_gauge(r, "bad-name", "", 0, NULL));
    ck_assert_ptr_nonnull(metrics_gauge(r, "ns:sub_name", "", 0, NULL));
    ck_assert_ptr_null(metrics_gauge(r, "y", "", 1, bad));
    ck_assert_ptr_null(metrics_gauge(r, "y", "", 2, dup));
    ck_assert_ptr_null(
        metrics_histogram(r, "h", "", 1, (const char *[]){ "le" }, NULL, 0));
    ck_assert_ptr_null(
        metrics_histogram(r, "h", "", 0, NULL, (const double[]){ 1, 1 }, 2));
    ck_assert_ptr_null(
        metrics_histogram(r, "h", "", 0, NULL, (const double[]){ INFINITY }, 1));
    metrics_family *h =
        metrics_histogram(r, "h", "", 0, NULL, NULL, 0); /* default buckets */
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_null(metrics_series_get(a, NULL)); /* labels required */
    /* updates on NULL or the wrong type are no-ops */
    metrics_counter_add(NULL, 1);
    metrics_gauge_set(NULL, 1);
    metrics_histogram_observe(NULL, 1);
    metrics_series *c = metrics_series_get(a, (const char *[]){ "k" });
    metrics_counter_add(c, -5);
    metrics_counter_add(c, INFINITY);
    metrics_gauge_set(c, 9);
    ck_assert_double_eq(metrics_series_value(c), 0);
    metrics_histogram_observe(metrics_series_get(h, NULL), 0.2);
    char *t = render(r);
    ck_assert_ptr_nonnull(strstr(t, "h_bucket{le=\"0.005\"} 0\n"));
    ck_assert_ptr_nonnull(strstr(t, "h_bucket{le=\"0.25\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(t, "h_bucket{le=\"10\"} 1\n"));
    free(t);
    metrics_registry_free(r);
    metrics_registry_free(NULL);
}
END_TEST

static metrics_registry *shared;
static void *hammer(void *arg) {
    (void)arg;
    metrics_family *c =
        metrics_counter(shared, "hits_total", "Hits.", 1, (const char *[]){ "t" });
    metrics_family *h = metrics_histogram(shared, "lat", "Lat.", 0, NULL, NULL, 0);
    for (int i = 0; i < 20000; i++) {
        metrics_counter_add(
            metrics_series_get(c, (const char *[]){ (i & 1) ? "odd" : "even" }), 1);
        metrics_histogram_observe(metrics_series_get(h, NULL), 0.01);
    }
    return NULL;
}

START_TEST(concurrent_updates) {
    shared = metrics_registry_create();
    pthread_t th[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, hammer, NULL);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    metrics_family *c =
        metrics_counter(shared, "hits_total", "Hits.", 1, (const char *[]){ "t" });
    ck_assert_double_eq(
        metrics_series_value(metrics_series_get(c, (const char *[]){ "odd" })), 80000);
    ck_assert_double_eq(
        metrics_series_value(metrics_series_get(c, (const char *[]){ "even" })), 80000);
    metrics_family *h = metrics_histogram(shared, "lat", "Lat.", 0, NULL, NULL, 0);
    ck_assert_uint_eq(metrics_histogram_count(metrics_series_get(h, NULL)), 160000);
    metrics_registry_free(shared);
}
END_TEST

START_TEST(http_endpoint) {
    metrics_registry *r = metrics_registry_create();
    metrics_gauge_set(
        metrics_series_get(metrics_gauge(r, "orch_train_loss", "Loss.", 0, NULL), NULL),
        2.5);
    char err[256];
    ck_assert_ptr_null(metrics_http_start(r, "not-an-ip", 0, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "not-an-ip"));
    metrics_http *h = metrics_http_start(r, NULL, 0, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    uint16_t port = metrics_http_port(h);
    ck_assert_uint_gt(port, 0);
    ck_assert_ptr_null(metrics_http_start(r, NULL, port, err, sizeof err)); /* in use */
    const char *reqs[2] = { "GET /metrics HTTP/1.0\r\n\r\n",
                            "GET /other HTTP/1.0\r\n\r\n" };
    for (int k = 0; k < 2; k++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        ck_assert(write(fd, reqs[k], strlen(reqs[k])) > 0);
        char buf[4096];
        size_t n = 0;
        ssize_t got;
        while ((got = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)got;
        buf[n] = '\0';
        close(fd);
        if (k == 0) {
            ck_assert_msg(strstr(buf, "200 OK") && strstr(buf, "orch_train_loss 2.5\n") &&
                              strstr(buf, "text/plain; version=0.0.4"),
                          "%s", buf);
        } else {
            ck_assert_msg(strstr(buf, "404"), "%s", buf);
        }
    }
    metrics_http_stop(h);
    metrics_http_stop(NULL);
    metrics_registry_free(r);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, exposition_text_exact);
    tcase_add_test(tc, registration_rules);
    tcase_add_test(tc, concurrent_updates);
    tcase_add_test(tc, http_endpoint);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
