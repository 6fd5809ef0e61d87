/*
 * slowloris.c - a bounded, loopback-only slow-client load test for `orch
 * serve`: opens --conns connections that send their request one byte every
 * --interval-ms (half dribble a request head, half send a complete head with
 * a large Content-Length and dribble the body), spread over --sources source
 * addresses 127.0.0.2, 127.0.0.3, ... (so a per-address limit does not refuse
 * them), then, while they are held, sends --probes GET /health requests from
 * 127.0.0.1 on fresh connections and measures each one's latency (connect to
 * the end of the answer). It keeps dribbling for --hold-s seconds and reports
 * how many slow connections the server closed and when.
 *
 *   slowloris --port 8080 --conns 2000 --sources 40 --interval-ms 1000 \
 *             --hold-s 20 --probes 50 --max-p99-ms 100 --expect-closed-s 12
 *
 * Prints one line:
 *   slowloris: conns=N connected=N probes=N ok=N p50_ms=X p99_ms=X max_ms=X
 *   closed=N/N last_close_s=X
 * Exit status: 0 when every probe answered 200 with p99 under --max-p99-ms
 * (and, with --expect-closed-s, every slow connection was closed by the
 * server within that many seconds of being opened); 1 otherwise; 2 on bad
 * usage or when the connections cannot be opened. Only 127.0.0.0/8 targets
 * are accepted.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    const char *host;
    int port;
    long conns, sources, interval_ms, hold_s, probes, probe_gap_ms, probe_timeout_ms;
    double max_p99_ms, expect_closed_s;
} opts;

typedef struct slow {
    int fd;
    int body;      /* dribbles a body (complete head sent at once) */
    size_t sent;   /* bytes of the script sent */
    double opened; /* connect time */
    double next;   /* next byte due */
    double closed; /* when the server closed it (0 = open) */
} slow;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static const char head_script[] =
    "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow-0: aaaaaaaaaaaaaaaaaaaaaaaa\r\n"
    "X-Slow-1: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\r\nX-Slow-2: cccccccccccccccc"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc\r\n";
static const char body_head[] = "POST /v1/completions HTTP/1.1\r\nHost: "
                                "localhost\r\nContent-Type: application/json\r\n"
                                "Content-Length: 100000\r\n\r\n";

/* A loopback address 127.a.b.c for source index i (0 = 127.0.0.1). */
static struct in_addr loopback(long i) {
    struct in_addr a;
    a.s_addr = htonl(0x7f000001u + (uint32_t)i);
    return a;
}

/* Non-blocking connect from src (NULL = any) to dst; -1 on failure. */
static int open_conn(const struct in_addr *src, const struct sockaddr_in *dst) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (src) {
        struct sockaddr_in sa;
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_addr = *src;
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            close(fd);
            return -1;
        }
    }
    if (connect(fd, (const struct sockaddr *)dst, sizeof *dst) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- probes (own thread, so a stalled probe does not stall the dribble) ---- */
typedef struct probe_state {
    const opts *o;
    struct sockaddr_in dst;
    double *lat_ms; /* [probes]; negative = failed */
    int *status;
    atomic_int done;
} probe_state;

/* One GET /health on a fresh connection; latency in ms or -1. */
static double probe_once(const probe_state *ps, int *status) {
    double t0 = now_s(), deadline = t0 + (double)ps->o->probe_timeout_ms / 1000.0;
    struct in_addr src = loopback(0);
    int fd = open_conn(&src, &ps->dst);
    *status = 0;
    if (fd < 0) return -1;
    static const char req[] =
        "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    size_t off = 0;
    char buf[4096];
    size_t got = 0;
    int ok = -1;
    while (now_s() < deadline) {
        struct pollfd p = { fd, (short)(off < sizeof req - 1 ? POLLOUT : POLLIN), 0 };
        int left = (int)((deadline - now_s()) * 1000) + 1;
        if (poll(&p, 1, left) <= 0) continue;
        if (off < sizeof req - 1) {
            ssize_t w = send(fd, req + off, sizeof req - 1 - off, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN) break;
            if (w > 0) off += (size_t)w;
            continue;
        }
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r < 0 && errno == EAGAIN) continue;
        if (r <= 0 || got + (size_t)r >= sizeof buf - 1) {
            if (r == 0 && got > 12) ok = 0; /* Connection: close ends the answer */
            break;
        }
        got += (size_t)r;
    }
    buf[got] = '\0';
    double t1 = now_s();
    close(fd);
    if (ok != 0 || strncmp(buf, "HTTP/1.", 7) != 0) return -1;
    *status = atoi(buf + 9);
    return (t1 - t0) * 1000.0;
}

static void *probe_main(void *arg) {
    probe_state *ps = arg;
    for (long i = 0; i < ps->o->probes; i++) {
        ps->lat_ms[i] = probe_once(ps, &ps->status[i]);
        sleep_ms(ps->o->probe_gap_ms);
    }
    atomic_store(&ps->done, 1);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the slow connections ---- */
/* Send the next byte of s's script when due; notice a close by the server. */
static void slow_step(slow *s, const opts *o, double t) {
    if (s->closed > 0 || s->fd < 0) return;
    char junk[512];
    ssize_t r = recv(s->fd, junk, sizeof junk, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        s->closed = t;
        close(s->fd);
        s->fd = -1;
        return;
    }
    if (t < s->next) return;
    s->next = t + (double)o->interval_ms / 1000.0;
    char c;
    size_t hl = sizeof body_head - 1;
    if (s->body && s->sent < hl) { /* the whole head at once, then the body */
        ssize_t w = send(s->fd, body_head + s->sent, hl - s->sent, MSG_NOSIGNAL);
        if (w > 0) s->sent += (size_t)w;
        return;
    }
    if (s->body)
        c = "{\"prompt\":\"aaaaaaaa"[(s->sent - hl) % 19];
    else
        c = head_script[s->sent % (sizeof head_script - 1)];
    ssize_t w = send(s->fd, &c, 1, MSG_NOSIGNAL);
    if (w == 1) s->sent++;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        s->closed = t;
        close(s->fd);
        s->fd = -1;
    }
}

static int parse_args(int argc, char **argv, opts *o) {
    *o = (opts){ .host = "127.0.0.1",
                 .port = 8080,
                 .conns = 2000,
                 .sources = 40,
                 .interval_ms = 1000,
                 .hold_s = 20,
                 .probes = 50,
                 .probe_gap_ms = 100,
                 .probe_timeout_ms = 2000,
                 .max_p99_ms = 100 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return -1;
        i++;
        if (strcmp(a, "--host") == 0)
            o->host = v;
        else if (strcmp(a, "--port") == 0)
            o->port = atoi(v);
        else if (strcmp(a, "--conns") == 0)
            o->conns = atol(v);
        else if (strcmp(a, "--sources") == 0)
            o->sources = atol(v);
        else if (strcmp(a, "--interval-ms") == 0)
            o->interval_ms = atol(v);
        else if (strcmp(a, "--hold-s") == 0)
            o->hold_s = atol(v);
        else if (strcmp(a, "--probes") == 0)
            o->probes = atol(v);
        else if (strcmp(a, "--probe-gap-ms") == 0)
            o->probe_gap_ms = atol(v);
        else if (strcmp(a, "--probe-timeout-ms") == 0)
            o->probe_timeout_ms = atol(v);
        else if (strcmp(a, "--max-p99-ms") == 0)
            o->max_p99_ms = atof(v);
        else if (strcmp(a, "--expect-closed-s") == 0)
            o->expect_closed_s = atof(v);
        else
            return -1;
    }
    if (o->conns < 1 || o->conns > 60000 || o->sources < 1 || o->sources > 60000 ||
        o->interval_ms < 1 || o->hold_s < 1 || o->probes < 1 || o->probes > 100000 ||
        o->port < 1 || o->port > 65535)
        return -1;
    return 0;
}

/* Open every slow connection (waiting up to 10 s for them to connect). */
static long open_all(const opts *o, const struct sockaddr_in *dst, slow *sl) {
    for (long i = 0; i < o->conns; i++) {
        struct in_addr src = loopback(1 + i % o->sources);
        sl[i].fd = open_conn(&src, dst);
        sl[i].body = (int)(i % 2);
        sl[i].opened = now_s();
        sl[i].next = sl[i].opened + (double)(i % 100) * (double)o->interval_ms / 100000.0;
        if (sl[i].fd < 0) {
            fprintf(stderr, "slowloris: connection %ld: %s\n", i, strerror(errno));
            return -1;
        }
    }
    long connected = 0;
    double end = now_s() + 10;
    struct pollfd *p = calloc((size_t)o->conns, sizeof *p);
    if (!p) return -1;
    while (connected < o->conns && now_s() < end) {
        connected = 0;
        for (long i = 0; i < o->conns; i++)
            p[i] = (struct pollfd){ sl[i].fd, POLLOUT, 0 };
        if (poll(p, (nfds_t)o->conns, 100) < 0) break;
        for (long i = 0; i < o->conns; i++) {
            int e = 0;
            socklen_t el = sizeof e;
            if ((p[i].revents & POLLOUT) &&
                getsockopt(sl[i].fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0)
                connected++;
        }
    }
    free(p);
    return connected;
}

/* Hold the slow connections, probe, report; the exit status. */
static int run(const opts *o, const struct sockaddr_in *dst, slow *sl, probe_state *ps,
               double *lat) {
    long connected = open_all(o, dst, sl);
    if (connected < 0) return 2;
    pthread_t pt;
    int probing = 0;
    double start = now_s(), end = start + (double)o->hold_s;
    double probe_at = start + 1.0; /* let every slow connection send something */
    long closed = 0;
    while (now_s() < end || (probing && !atomic_load(&ps->done))) {
        double t = now_s();
        if (!probing && t >= probe_at) {
            if (pthread_create(&pt, NULL, probe_main, ps) != 0) return 2;
            probing = 1;
        }
        closed = 0;
        for (long i = 0; i < o->conns; i++) {
            slow_step(&sl[i], o, t);
            closed += sl[i].closed > 0;
        }
        if (closed == o->conns && probing && atomic_load(&ps->done)) break;
        sleep_ms(10);
    }
    if (probing) pthread_join(pt, NULL);
    double last_close = 0;
    int closed_in_time = 1;
    for (long i = 0; i < o->conns; i++) {
        if (sl[i].closed > 0 && sl[i].closed - sl[i].opened > last_close)
            last_close = sl[i].closed - sl[i].opened;
        if (o->expect_closed_s > 0 &&
            (sl[i].closed == 0 || sl[i].closed - sl[i].opened > o->expect_closed_s))
            closed_in_time = 0;
        if (sl[i].fd >= 0) close(sl[i].fd);
    }
    long ok = 0;
    for (long i = 0; i < o->probes; i++) {
        ok += ps->status[i] == 200;
        /* a failed probe counts as the whole timeout */
        lat[i] = ps->status[i] == 200 ? ps->lat_ms[i] : (double)o->probe_timeout_ms;
    }
    qsort(lat, (size_t)o->probes, sizeof *lat, cmp_double);
    double p50 = lat[(o->probes - 1) / 2];
    double p99 = lat[(size_t)((double)(o->probes - 1) * 0.99 + 0.5)];
    printf("slowloris: conns=%ld connected=%ld probes=%ld ok=%ld p50_ms=%.2f p99_ms=%.2f "
           "max_ms=%.2f closed=%ld/%ld last_close_s=%.2f\n",
           o->conns, connected, o->probes, ok, p50, p99, lat[o->probes - 1], closed,
           o->conns, last_close);
    return ok == o->probes && p99 < o->max_p99_ms && closed_in_time ? 0 : 1;
}

int main(int argc, char **argv) {
    opts o;
    if (parse_args(argc, argv, &o) != 0) {
        fprintf(stderr,
                "usage: slowloris --port P [--conns N] [--sources N] "
                "[--interval-ms MS] [--hold-s S] [--probes N] [--probe-gap-ms MS] "
                "[--probe-timeout-ms MS] [--max-p99-ms MS] [--expect-closed-s S]\n");
        return 2;
    }
    struct sockaddr_in dst;
    memset(&dst, 0, sizeof dst);
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)o.port);
    if (inet_pton(AF_INET, o.host, &dst.sin_addr) != 1 ||
        (ntohl(dst.sin_addr.s_addr) >> 24) != 127) {
        fprintf(stderr, "slowloris: --host must be a 127.0.0.0/8 address\n");
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)o.conns + 64) {
        rl.rlim_cur =
            rl.rlim_max < (rlim_t)o.conns + 64 ? rl.rlim_max : (rlim_t)o.conns + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    slow *sl = calloc((size_t)o.conns, sizeof *sl);
    probe_state ps = { .o = &o, .dst = dst };
    ps.lat_ms = calloc((size_t)o.probes, sizeof *ps.lat_ms);
    ps.status = calloc((size_t)o.probes, sizeof *ps.status);
    double *lat = calloc((size_t)o.probes, sizeof *lat);
    int rc = sl && ps.lat_ms && ps.status && lat ? run(&o, &dst, sl, &ps, lat) : 2;
    free(lat);
    free(sl);
    free(ps.lat_ms);
    free(ps.status);
    return rc;
}
