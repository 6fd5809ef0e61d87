/*
 * test_server_listener.c - the accepting side of orch serve
 * (serve/listener.h) with a stand-in server that keeps the sockets it is
 * given: connections past the per-address limit and past the total limit are
 * answered 503 at once (code, Retry-After, Connection: close) and closed
 * while others keep their place; the deadlines close a connection whose
 * request head (408), body (408) or keep-alive idle time (no answer) runs
 * out, not one that is being served, and trickling bytes does not extend a
 * deadline; the refusal and time-out counters; a closed connection frees its
 * place; stop_accepting closes the port.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/core/metrics.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/listener.h"
#include "tests/test_util.h"

/* The stand-in server: the sockets it took, in order. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int taken[16];
static int n_taken;
static listener *L;

static int admit(void *arg, int fd, const struct sockaddr_in *peer) {
    (void)arg;
    (void)peer;
    pthread_mutex_lock(&mu);
    taken[n_taken++] = fd;
    pthread_mutex_unlock(&mu);
    ck_assert_int_eq(listener_conn_started(L, fd), 0);
    return 0;
}

static int taken_fd(int i) {
    for (int k = 0; k < 2000; k++) {
        pthread_mutex_lock(&mu);
        int n = n_taken, fd = i < n ? taken[i] : -1;
        pthread_mutex_unlock(&mu);
        if (fd >= 0) return fd;
        usleep(1000);
    }
    ck_abort_msg("connection %d was not handed over", i);
    return -1;
}

/* A client connection from 127.0.0.src to the listener. */
static int client(unsigned src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(0x7f000000u + src);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    sa.sin_port = htons(listener_port(L));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* Everything the peer sends until it closes (or timeout_ms passes); *closed
 * tells which. */
static void read_all(int fd, char *out, size_t cap, int timeout_ms, int *closed) {
    size_t got = 0;
    *closed = 0;
    double end = util_now() + timeout_ms / 1000.0;
    while (util_now() < end) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 20) <= 0) continue;
        ssize_t r = recv(fd, out + got, cap - 1 - got, 0);
        if (r <= 0) {
            *closed = 1;
            break;
        }
        got += (size_t)r;
    }
    out[got] = '\0';
}

static double counter(metrics_registry *r, const char *line) {
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(metrics_render(r, &text, &len), 0);
    const char *p = strstr(text, line);
    double v = p ? atof(p + strlen(line)) : -1;
    free(text);
    return v;
}

START_TEST(limits_and_deadlines) {
    metrics_registry *reg = metrics_registry_create();
    listener_config c = { .max_conns = 3,
                          .max_per_ip = 2,
                          .header_timeout = 0.5,
                          .body_timeout = 0.8,
                          .idle_timeout = 0.5,
                          .admit = admit,
                          .metrics = reg };
    c.addr.sin_family = AF_INET;
    c.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char err[256];
    ck_assert_msg(listener_start(&c, &L, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_ne(listener_port(L), 0);

    char buf[2048];
    int closed;
    int a1 = client(2), a2 = client(2);
    int sa1 = taken_fd(0), sa2 = taken_fd(1);
    int a3 = client(2); /* third from 127.0.0.2 */
    read_all(a3, buf, sizeof buf, 2000, &closed);
    ck_assert_msg(closed && strncmp(buf, "HTTP/1.1 503 Service Unavailable\r\n", 34) == 0,
                  "%s", buf);
    ck_assert(strstr(buf, "\r\nRetry-After: 1\r\n") && strstr(buf, "Connection: close"));
    ck_assert(strstr(buf, "\"code\":\"too_many_connections_per_ip\""));
    ck_assert(strstr(buf, "--max-connections-per-ip 2"));
    int b1 = client(3);
    int sb1 = taken_fd(2);
    int c1 = client(4); /* a fourth connection in all */
    read_all(c1, buf, sizeof buf, 2000, &closed);
    ck_assert_msg(closed && strstr(buf, "\"code\":\"too_many_connections\""), "%s", buf);
    ck_assert_uint_eq(listener_open(L), 3);
    ck_assert(
        counter(reg, "orch_http_connections_refused_total{reason=\"max_per_ip\"} ") == 1);
    ck_assert(
        counter(reg,
                "orch_http_connections_refused_total{reason=\"max_connections\"} ") == 1);

    /* a1 is being served (no deadline); a2 trickles its head; b1 sends a
     * head, then its body slowly */
    listener_conn_phase(L, sa1, LISTENER_BUSY);
    listener_conn_phase(L, sb1, LISTENER_BODY);
    double t0 = util_now();
    for (int i = 0; i < 3; i++) { /* bytes inside the window extend nothing */
        ck_assert(send(a2, "G", 1, MSG_NOSIGNAL) == 1);
        ck_assert(send(b1, "{", 1, MSG_NOSIGNAL) == 1);
        usleep(140000);
    }
    read_all(a2, buf, sizeof buf, 1500, &closed);
    double t_a2 = util_now() - t0;
    ck_assert_msg(closed && strncmp(buf, "HTTP/1.1 408 Request Timeout\r\n", 30) == 0,
                  "%s", buf);
    ck_assert(strstr(buf, "\"code\":\"request_timeout\"") &&
              strstr(buf, "--header-timeout-s"));
    ck_assert_msg(t_a2 < 1.5, "head deadline after %.2f s", t_a2);
    read_all(b1, buf, sizeof buf, 1500, &closed);
    ck_assert_msg(closed && strstr(buf, "408 Request Timeout") &&
                      strstr(buf, "--body-timeout-s"),
                  "%s", buf);
    /* the stand-in server sees the shut-down sockets and closes them */
    listener_conn_closed(L, sa2);
    close(sa2);
    listener_conn_closed(L, sb1);
    close(sb1);
    ck_assert_uint_eq(listener_open(L), 1);
    ck_assert(counter(reg, "orch_http_connections_timed_out_total{phase=\"head\"} ") ==
              1);
    ck_assert(counter(reg, "orch_http_connections_timed_out_total{phase=\"body\"} ") ==
              1);

    /* the busy connection was left alone; kept alive, it gets idle_timeout */
    read_all(a1, buf, sizeof buf, 300, &closed);
    ck_assert(!closed && buf[0] == '\0');
    listener_conn_phase(L, sa1, LISTENER_IDLE);
    read_all(a1, buf, sizeof buf, 1500, &closed);
    ck_assert_msg(closed && buf[0] == '\0', "idle close must not answer: %s", buf);
    ck_assert(counter(reg, "orch_http_connections_timed_out_total{phase=\"idle\"} ") ==
              1);
    listener_conn_closed(L, sa1);
    close(sa1);
    ck_assert_uint_eq(listener_open(L), 0);

    /* places are free again */
    int d1 = client(2);
    int sd1 = taken_fd(3);
    listener_conn_phase(L, sd1, LISTENER_BUSY);

    listener_stop_accepting(L);
    int e = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(listener_port(L));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(e, (struct sockaddr *)&sa, sizeof sa), -1);
    ck_assert_int_eq(errno, ECONNREFUSED);
    close(e);
    listener_conn_closed(L, sd1);
    close(sd1);
    listener_stop(L);
    L = NULL;
    close(a1);
    close(a2);
    close(a3);
    close(b1);
    close(c1);
    close(d1);
    metrics_registry_free(reg);
}
END_TEST

START_TEST(bad_config) {
    listener_config c = { .max_conns = 1,
                          .max_per_ip = 1,
                          .header_timeout = 1,
                          .body_timeout = 1,
                          .idle_timeout = 0,
                          .admit = admit };
    char err[256];
    listener *l = NULL;
    ck_assert_int_eq(listener_start(&c, &l, err, sizeof err), -1);
    ck_assert_str_eq(err, "listener: bad configuration");
    c.idle_timeout = 1;
    c.addr.sin_family = AF_INET;
    c.addr.sin_addr.s_addr = htonl(0x01020304); /* not ours */
    ck_assert_int_eq(listener_start(&c, &l, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "cannot listen on 1.2.3.4:0"), "%s", err);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("server_listener");
    TCase *tc = tcase_create("listener");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, limits_and_deadlines);
    tcase_add_test(tc, bad_config);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
