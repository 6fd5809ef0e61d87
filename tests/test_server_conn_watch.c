/*
 * test_server_conn_watch.c - client-disconnect detection (serve/conn_watch.h)
 * over real loopback TCP connections: a closed client's request is reported
 * once, a live one never, a connection without a request or whose request
 * was cleared is not reported, clearing someone else's request changes
 * nothing, a removed connection is forgotten, and more connections than one
 * poll returns (and than the first slot table holds) are all reported.
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "orchestrator/serve/conn_watch.h"
#include "tests/test_util.h"

static int listener;
static struct sockaddr_in addr;

static void setup(void) {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(listener, 0);
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(listener, (struct sockaddr *)&addr, sizeof addr), 0);
    socklen_t len = sizeof addr;
    ck_assert_int_eq(getsockname(listener, (struct sockaddr *)&addr, &len), 0);
    ck_assert_int_eq(listen(listener, 256), 0);
}

static void teardown(void) { close(listener); }

/* A connected pair: *client (the peer that goes away), returns the server fd. */
static int connect_pair(int *client) {
    *client = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(*client, 0);
    ck_assert_int_eq(connect(*client, (struct sockaddr *)&addr, sizeof addr), 0);
    int fd = accept(listener, NULL, NULL);
    ck_assert_int_ge(fd, 0);
    return fd;
}

typedef struct seen {
    void *reqs[128];
    int n;
} seen;

static void gone(void *req, void *arg) {
    seen *s = arg;
    ck_assert_int_lt(s->n, 128);
    s->reqs[s->n++] = req;
}

/* Poll until n reports arrived (events may take a moment) or 200 tries. */
static void poll_for(conn_watch *w, seen *s, int n) {
    for (int i = 0; i < 200 && s->n < n; i++) {
        conn_watch_poll(w, gone, s);
        if (s->n < n) usleep(1000);
    }
}

START_TEST(closed_client_reported_once) {
    conn_watch *w = conn_watch_create();
    ck_assert_ptr_nonnull(w);
    int ca, cb;
    int fa = connect_pair(&ca), fb = connect_pair(&cb);
    conn_watch_conn *a = conn_watch_add(w, fa), *b = conn_watch_add(w, fb);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    int req_a, req_b;
    conn_watch_set_request(w, a, &req_a);
    conn_watch_set_request(w, b, &req_b);
    seen s = { { 0 }, 0 };
    conn_watch_poll(w, gone, &s);
    ck_assert_int_eq(s.n, 0); /* both alive */
    close(ca);
    poll_for(w, &s, 1);
    ck_assert_int_eq(s.n, 1);
    ck_assert_ptr_eq(s.reqs[0], &req_a);
    usleep(20000);
    conn_watch_poll(w, gone, &s); /* one-shot: not again, and b is alive */
    ck_assert_int_eq(s.n, 1);
    conn_watch_remove(w, a);
    conn_watch_remove(w, b);
    conn_watch_remove(w, NULL);
    close(fa);
    close(fb);
    close(cb);
    conn_watch_free(w);
    conn_watch_free(NULL);
}
END_TEST

START_TEST(no_request_no_report) {
    conn_watch *w = conn_watch_create();
    int c1, c2, c3;
    int f1 = connect_pair(&c1), f2 = connect_pair(&c2), f3 = connect_pair(&c3);
    conn_watch_conn *e1 = conn_watch_add(w, f1), *e2 = conn_watch_add(w, f2),
                    *e3 = conn_watch_add(w, f3);
    int r2, r3, other;
    conn_watch_set_request(w, e2, &r2);
    conn_watch_clear_request(w, e2, &r2); /* cleared: not reported */
    conn_watch_set_request(w, e3, &r3);
    conn_watch_clear_request(w, e3, &other); /* not its request: stays */
    conn_watch_set_request(w, NULL, &r3);    /* no connection: nothing happens */
    close(c1);
    close(c2);
    close(c3);
    seen s = { { 0 }, 0 };
    poll_for(w, &s, 1);
    usleep(20000);
    conn_watch_poll(w, gone, &s);
    ck_assert_int_eq(s.n, 1);
    ck_assert_ptr_eq(s.reqs[0], &r3);
    /* a removed connection is forgotten even if its client goes away later */
    int c4;
    int f4 = connect_pair(&c4);
    conn_watch_conn *e4 = conn_watch_add(w, f4);
    int r4;
    conn_watch_set_request(w, e4, &r4);
    conn_watch_remove(w, e4);
    close(c4);
    usleep(20000);
    conn_watch_poll(w, gone, &s);
    ck_assert_int_eq(s.n, 1);
    conn_watch_remove(w, e1);
    conn_watch_remove(w, e2);
    conn_watch_remove(w, e3);
    close(f1);
    close(f2);
    close(f3);
    close(f4);
    conn_watch_free(w);
}
END_TEST

START_TEST(many_connections) {
    enum { N = 100 }; /* > 64 slots at first, > 64 events per poll */
    conn_watch *w = conn_watch_create();
    int cl[N], fd[N], req[N];
    conn_watch_conn *e[N];
    for (int i = 0; i < N; i++) {
        fd[i] = connect_pair(&cl[i]);
        e[i] = conn_watch_add(w, fd[i]);
        ck_assert_ptr_nonnull(e[i]);
        conn_watch_set_request(w, e[i], &req[i]);
    }
    for (int i = 0; i < N; i++) close(cl[i]);
    seen s = { { 0 }, 0 };
    poll_for(w, &s, N);
    ck_assert_int_eq(s.n, N);
    int hit[N] = { 0 };
    for (int i = 0; i < N; i++) {
        int k = (int)((int *)s.reqs[i] - req);
        ck_assert(k >= 0 && k < N);
        hit[k]++;
    }
    for (int i = 0; i < N; i++) ck_assert_int_eq(hit[i], 1);
    for (int i = 0; i < N; i++) {
        conn_watch_remove(w, e[i]);
        close(fd[i]);
    }
    conn_watch_free(w);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_conn_watch");
    TCase *tc = tcase_create("watch");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, closed_client_reported_once);
    tcase_add_test(tc, no_request_no_report);
    tcase_add_test(tc, many_connections);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
