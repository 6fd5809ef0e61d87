/*
 * listener.c - accept thread, connection and per-address limits with an
 * immediate 503, whole-phase deadlines swept every 100 ms. See listener.h.
 */
#include "orchestrator/serve/listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/api_error.h"

#define SWEEP_PERIOD_S  0.1
#define LINGER_S        2.0
#define STALE_PENDING_S 10.0 /* handed over, never reported started: given up */
#define ACCEPT_BATCH    64

enum { E_FREE = 0, E_PENDING, E_OPEN };

typedef struct conn_entry {
    uint8_t state;
    uint8_t phase;
    uint8_t expired; /* shut down by a deadline; waiting for the close */
    uint32_t ip;     /* IPv4, host order */
    double t0;       /* start of the phase */
} conn_entry;

typedef struct ip_slot {
    uint32_t ip;
    uint32_t count; /* 0 = empty slot */
} ip_slot;

typedef struct linger_sock {
    int fd;
    double until;
} linger_sock;

struct listener {
    listener_config cfg;
    int lfd;     /* listening socket; -1 once closed */
    int wake[2]; /* pipe: stop / stop-accepting requests */
    int spare;   /* a reserved descriptor for answering at EMFILE */
    uint16_t port;
    pthread_t thread;
    int thread_started;
    atomic_int stop;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    int close_listen; /* requested; cleared (and cv signalled) when done */
    conn_entry *conns;
    uint32_t n_conns_cap; /* entries (indexed by fd) */
    uint32_t open;        /* E_PENDING + E_OPEN */
    ip_slot *ips;
    uint32_t ips_cap; /* power of two */

    /* thread only */
    linger_sock linger[LISTENER_MAX_LINGER];
    uint32_t n_linger;
    char *resp_busy, *resp_ip, *resp_head, *resp_body; /* canned answers */
    size_t len_busy, len_ip, len_head, len_body;

    metrics_series *m_open, *m_ref_total, *m_ref_ip;
    metrics_series *m_to_head, *m_to_body, *m_to_idle;
};

/* ------------------------------------------------------------------------- */
/* Per-address counts: linear probing with backward-shift deletion            */
/* ------------------------------------------------------------------------- */
static uint32_t ip_hash(uint32_t ip, uint32_t cap) {
    return (uint32_t)(((uint64_t)ip * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static ip_slot *ip_find(listener *l, uint32_t ip) {
    for (uint32_t i = ip_hash(ip, l->ips_cap);; i = (i + 1) & (l->ips_cap - 1)) {
        if (l->ips[i].count == 0 || l->ips[i].ip == ip) return &l->ips[i];
    }
}

static void ip_release(listener *l, uint32_t ip) {
    ip_slot *s = ip_find(l, ip);
    if (s->count == 0) return;
    if (--s->count > 0) return;
    /* backward-shift: move later entries of the run into the hole */
    uint32_t mask = l->ips_cap - 1, hole = (uint32_t)(s - l->ips);
    for (uint32_t j = (hole + 1) & mask; l->ips[j].count; j = (j + 1) & mask) {
        uint32_t home = ip_hash(l->ips[j].ip, l->ips_cap);
        /* j's entry may move into the hole when its home is not in (hole, j] */
        int in_between =
            hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_between) {
            l->ips[hole] = l->ips[j];
            l->ips[j].count = 0;
            hole = j;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* The connection table (indexed by fd)                                        */
/* ------------------------------------------------------------------------- */
static conn_entry *entry_of(listener *l, int fd) {
    return fd >= 0 && (uint32_t)fd < l->n_conns_cap ? &l->conns[fd] : NULL;
}

/* Forget entry fd and its counts (under mu). */
static void entry_release(listener *l, int fd) {
    conn_entry *e = entry_of(l, fd);
    if (!e || e->state == E_FREE) return;
    ip_release(l, e->ip);
    e->state = E_FREE;
    l->open--;
    metrics_gauge_set(l->m_open, l->open);
}

/* Room for entry fd (under mu). */
static int entry_reserve(listener *l, int fd) {
    if ((uint32_t)fd < l->n_conns_cap) return 0;
    uint32_t n = l->n_conns_cap ? l->n_conns_cap : 1024;
    while (n <= (uint32_t)fd) n *= 2;
    conn_entry *c = realloc(l->conns, (size_t)n * sizeof *c);
    if (!c) return -1;
    memset(c + l->n_conns_cap, 0, (size_t)(n - l->n_conns_cap) * sizeof *c);
    l->conns = c;
    l->n_conns_cap = n;
    return 0;
}

enum { ADMIT_OK = 0, ADMIT_FULL, ADMIT_IP, ADMIT_OOM };

/* Decide on a new connection and, when admitted, enter it (under mu). */
static int admit_locked(listener *l, int fd, uint32_t ip, double now) {
    if (entry_reserve(l, fd) != 0) return ADMIT_OOM;
    /* an entry still there for this fd number: the server closed the socket
     * without reporting it (never started): drop it first */
    if (l->conns[fd].state != E_FREE) entry_release(l, fd);
    if (l->open >= l->cfg.max_conns) return ADMIT_FULL;
    ip_slot *s = ip_find(l, ip);
    if (s->count >= l->cfg.max_per_ip) return ADMIT_IP;
    s->ip = ip;
    s->count++;
    l->conns[fd] = (conn_entry){
        .state = E_PENDING, .phase = LISTENER_HEAD_FIRST, .ip = ip, .t0 = now
    };
    l->open++;
    metrics_gauge_set(l->m_open, l->open);
    return ADMIT_OK;
}

int listener_conn_started(listener *l, int fd) {
    pthread_mutex_lock(&l->mu);
    conn_entry *e = entry_of(l, fd);
    int ok = e && e->state == E_PENDING;
    if (ok) e->state = E_OPEN;
    pthread_mutex_unlock(&l->mu);
    return ok ? 0 : -1;
}

void listener_conn_phase(listener *l, int fd, int phase) {
    double now = util_now();
    pthread_mutex_lock(&l->mu);
    conn_entry *e = entry_of(l, fd);
    if (e && e->state != E_FREE) {
        e->phase = (uint8_t)phase;
        e->t0 = now;
    }
    pthread_mutex_unlock(&l->mu);
}

void listener_conn_closed(listener *l, int fd) {
    pthread_mutex_lock(&l->mu);
    entry_release(l, fd);
    pthread_mutex_unlock(&l->mu);
}

uint32_t listener_open(const listener *l) {
    listener *m = (listener *)l;
    pthread_mutex_lock(&m->mu);
    uint32_t n = m->open;
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* ------------------------------------------------------------------------- */
/* Refusals and deadlines                                                     */
/* ------------------------------------------------------------------------- */
/* "HTTP/1.1 STATUS" with an OpenAI-shaped error body, malloc'd. */
static char *canned(unsigned status, const char *reason, const char *code,
                    int retry_after, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static char *canned(unsigned status, const char *reason, const char *code,
                    int retry_after, size_t *len, const char *fmt, ...) {
    api_error e;
    api_error_set(&e, status, NULL, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    strbuf body = { 0 }, b = { 0 };
    api_error_json(&body, &e);
    strbuf_printf(&b,
                  "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\n%s"
                  "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                  status, reason, retry_after ? "Retry-After: 1\r\n" : "", body.len);
    if (body.p) strbuf_put(&b, body.p, body.len);
    free(body.p);
    if (b.oom || body.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

static void send_quiet(int fd, const char *p, size_t n) {
    if (p) (void)send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Answer a refused connection and close it (after a linger when there is
 * room, so the client reads the answer instead of a reset). */
static void refuse(listener *l, int fd, int why, double now) {
    if (why == ADMIT_IP)
        send_quiet(fd, l->resp_ip, l->len_ip);
    else
        send_quiet(fd, l->resp_busy, l->len_busy);
    metrics_counter_add(why == ADMIT_IP ? l->m_ref_ip : l->m_ref_total, 1);
    shutdown(fd, SHUT_WR);
    if (l->n_linger < LISTENER_MAX_LINGER)
        l->linger[l->n_linger++] = (linger_sock){ fd, now + LINGER_S };
    else
        close(fd);
}

/* Shut down every connection past its deadline (under mu). */
static void sweep_locked(listener *l, double now) {
    for (uint32_t fd = 0; fd < l->n_conns_cap; fd++) {
        conn_entry *e = &l->conns[fd];
        if (e->state == E_PENDING && now - e->t0 > STALE_PENDING_S) {
            entry_release(l, (int)fd);
            continue;
        }
        if (e->state != E_OPEN || e->expired || e->phase == LISTENER_BUSY) continue;
        double limit = e->phase == LISTENER_HEAD_FIRST ? l->cfg.header_timeout
                       : e->phase == LISTENER_IDLE     ? l->cfg.idle_timeout
                                                       : l->cfg.body_timeout;
        if (now - e->t0 <= limit) continue;
        if (e->phase == LISTENER_HEAD_FIRST)
            send_quiet((int)fd, l->resp_head, l->len_head);
        if (e->phase == LISTENER_BODY) send_quiet((int)fd, l->resp_body, l->len_body);
        metrics_counter_add(e->phase == LISTENER_HEAD_FIRST ? l->m_to_head
                            : e->phase == LISTENER_IDLE     ? l->m_to_idle
                                                            : l->m_to_body,
                            1);
        shutdown((int)fd, SHUT_RDWR); /* the server sees the end and closes it */
        e->expired = 1;
    }
}

/* ------------------------------------------------------------------------- */
/* The thread                                                                 */
/* ------------------------------------------------------------------------- */
/* Accept what is pending (a batch), admit or refuse each. */
static void accept_some(listener *l) {
    for (int k = 0; k < ACCEPT_BATCH && l->lfd >= 0; k++) {
        struct sockaddr_in peer;
        socklen_t pl = sizeof peer;
        memset(&peer, 0, sizeof peer);
        int fd =
            accept4(l->lfd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        double now = util_now();
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if ((errno == EMFILE || errno == ENFILE) && l->spare >= 0) {
                /* out of descriptors: answer one with the reserved one */
                close(l->spare);
                l->spare = -1;
                fd = accept4(l->lfd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
                if (fd >= 0) {
                    send_quiet(fd, l->resp_busy, l->len_busy);
                    metrics_counter_add(l->m_ref_total, 1);
                    close(fd);
                }
                l->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
            }
            return; /* EAGAIN, or nothing more to do now */
        }
        uint32_t ip = peer.sin_family == AF_INET ? ntohl(peer.sin_addr.s_addr) : 0;
        pthread_mutex_lock(&l->mu);
        int why = admit_locked(l, fd, ip, now);
        pthread_mutex_unlock(&l->mu);
        if (why != ADMIT_OK) {
            refuse(l, fd, why, now);
            continue;
        }
        if (l->cfg.admit(l->cfg.admit_arg, fd, &peer) != 0) {
            pthread_mutex_lock(&l->mu);
            conn_entry *e = entry_of(l, fd);
            if (e && e->state == E_PENDING) entry_release(l, fd);
            pthread_mutex_unlock(&l->mu);
        }
    }
}

/* Read and drop what refused clients send; close them at EOF or time-out. */
static void service_linger(listener *l, const struct pollfd *p, double now) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->n_linger; i++) {
        linger_sock s = l->linger[i];
        int done = now >= s.until;
        if (!done && p[i].revents) {
            char buf[4096];
            ssize_t r = recv(s.fd, buf, sizeof buf, MSG_DONTWAIT);
            done = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        }
        if (done)
            close(s.fd);
        else
            l->linger[k++] = s;
    }
    l->n_linger = k;
}

static void *listener_main(void *arg) {
    listener *l = arg;
    struct pollfd p[LISTENER_MAX_LINGER + 2];
    double next_sweep = util_now() + SWEEP_PERIOD_S;
    while (!atomic_load(&l->stop)) {
        uint32_t nl = l->n_linger;
        for (uint32_t i = 0; i < nl; i++)
            p[i] = (struct pollfd){ l->linger[i].fd, POLLIN, 0 };
        p[nl] = (struct pollfd){ l->wake[0], POLLIN, 0 };
        p[nl + 1] = (struct pollfd){ l->lfd, POLLIN, 0 }; /* -1 once closed: ignored */
        double now = util_now();
        int wait_ms = next_sweep > now ? (int)((next_sweep - now) * 1000) + 1 : 0;
        int n = poll(p, nl + 2, wait_ms);
        now = util_now();
        if (n > 0 && p[nl].revents) {
            char buf[64];
            while (read(l->wake[0], buf, sizeof buf) > 0) {
            }
            pthread_mutex_lock(&l->mu);
            if (l->close_listen) {
                if (l->lfd >= 0) close(l->lfd);
                l->lfd = -1;
                l->close_listen = 0;
                pthread_cond_broadcast(&l->cv);
            }
            pthread_mutex_unlock(&l->mu);
        }
        if (n > 0 && l->lfd >= 0 && p[nl + 1].revents) accept_some(l);
        if (nl) service_linger(l, p, now);
        if (now >= next_sweep) {
            pthread_mutex_lock(&l->mu);
            sweep_locked(l, now);
            pthread_mutex_unlock(&l->mu);
            next_sweep = now + SWEEP_PERIOD_S;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* Start and stop                                                             */
/* ------------------------------------------------------------------------- */
static void register_metrics(listener *l) {
    metrics_registry *r = l->cfg.metrics;
    if (!r) return;
    static const char *const reason[1] = { "reason" }, *const phase[1] = { "phase" };
    l->m_open = metrics_series_get(
        metrics_gauge(r, "orch_http_connections_open",
                      "HTTP connections open (handed to the server).", 0, NULL),
        NULL);
    metrics_family *ref =
        metrics_counter(r, "orch_http_connections_refused_total",
                        "Connections answered 503 at once: over --max-connections or "
                        "--max-connections-per-ip.",
                        1, reason);
    metrics_family *to = metrics_counter(r, "orch_http_connections_timed_out_total",
                                         "Connections closed for missing a deadline "
                                         "(request head, body, keep-alive idle).",
                                         1, phase);
    l->m_ref_total = metrics_series_get(ref, (const char *[]){ "max_connections" });
    l->m_ref_ip = metrics_series_get(ref, (const char *[]){ "max_per_ip" });
    l->m_to_head = metrics_series_get(to, (const char *[]){ "head" });
    l->m_to_body = metrics_series_get(to, (const char *[]){ "body" });
    l->m_to_idle = metrics_series_get(to, (const char *[]){ "idle" });
    metrics_gauge_set(l->m_open, 0);
}

static int make_canned(listener *l) {
    const listener_config *c = &l->cfg;
    l->resp_busy =
        canned(503, "Service Unavailable", "too_many_connections", 1, &l->len_busy,
               "the server has too many open connections (--max-connections "
               "%u); retry shortly",
               c->max_conns);
    l->resp_ip =
        canned(503, "Service Unavailable", "too_many_connections_per_ip", 1, &l->len_ip,
               "too many open connections from this address "
               "(--max-connections-per-ip %u); retry shortly",
               c->max_per_ip);
    l->resp_head = canned(408, "Request Timeout", "request_timeout", 0, &l->len_head,
                          "the request head did not arrive within %g s "
                          "(--header-timeout-s)",
                          c->header_timeout);
    l->resp_body =
        canned(408, "Request Timeout", "request_timeout", 0, &l->len_body,
               "the request body did not arrive within %g s (--body-timeout-s)",
               c->body_timeout);
    return l->resp_busy && l->resp_ip && l->resp_head && l->resp_body ? 0 : -1;
}

static int open_socket(listener *l, char *err, size_t err_cap) {
    char host[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &l->cfg.addr.sin_addr, host, sizeof host);
    unsigned port = ntohs(l->cfg.addr.sin_port);
    l->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (l->lfd < 0 ||
        setsockopt(l->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(l->lfd, (const struct sockaddr *)&l->cfg.addr, sizeof l->cfg.addr) != 0 ||
        /* The kernel's largest backlog (net.core.somaxconn caps SOMAXCONN):
         * a burst of more connections than the backlog holds before the
         * accept thread takes them has its SYNs dropped, and those clients
         * wait a 1 s retransmission (seen as a 1008 ms /health probe while
         * 2000 slow clients connected at once on a loaded machine). */
        listen(l->lfd, SOMAXCONN) != 0) {
        util_set_err(err, err_cap, "cannot listen on %s:%u: %s", host, port,
                     strerror(errno));
        return -1;
    }
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockname(l->lfd, (struct sockaddr *)&sa, &sl) != 0) {
        util_set_err(err, err_cap, "cannot listen on %s:%u: %s", host, port,
                     strerror(errno));
        return -1;
    }
    l->port = ntohs(sa.sin_port);
    return 0;
}

int listener_start(const listener_config *cfg, listener **out, char *err,
                   size_t err_cap) {
    if (!cfg || !cfg->admit || cfg->max_conns == 0 || cfg->max_per_ip == 0 ||
        !(cfg->header_timeout > 0) || !(cfg->body_timeout > 0) ||
        !(cfg->idle_timeout > 0)) {
        util_set_err(err, err_cap, "listener: bad configuration");
        return -1;
    }
    listener *l = util_calloc(1, sizeof *l);
    if (!l) {
        util_set_err(err, err_cap, "listener: out of memory");
        return -1;
    }
    l->cfg = *cfg;
    l->lfd = l->wake[0] = l->wake[1] = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->ips_cap = 64;
    while (l->ips_cap < 2 * cfg->max_conns) l->ips_cap *= 2;
    l->ips = util_calloc(l->ips_cap, sizeof *l->ips);
    l->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (!l->ips || make_canned(l) != 0 || pipe2(l->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        util_set_err(err, err_cap, "listener: out of memory or descriptors");
        listener_stop(l);
        return -1;
    }
    if (open_socket(l, err, err_cap) != 0) {
        listener_stop(l);
        return -1;
    }
    register_metrics(l);
    /* *out is set before the thread can hand over a connection: whatever the
     * server's callbacks read of it is in place */
    *out = l;
    l->thread_started = 1;
    if (util_thread_start_nosignals(&l->thread, listener_main, l) != 0) {
        *out = NULL;
        l->thread_started = 0;
        util_set_err(err, err_cap, "listener: cannot start its thread");
        listener_stop(l);
        return -1;
    }
    return 0;
}

uint16_t listener_port(const listener *l) { return l ? l->port : 0; }

void listener_stop_accepting(listener *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    if (l->lfd >= 0 && l->thread_started) {
        l->close_listen = 1;
        (void)!write(l->wake[1], "x", 1);
        while (l->close_listen) pthread_cond_wait(&l->cv, &l->mu);
    }
    pthread_mutex_unlock(&l->mu);
}

void listener_stop(listener *l) {
    if (!l) return;
    if (l->thread_started) {
        atomic_store(&l->stop, 1);
        (void)!write(l->wake[1], "x", 1);
        pthread_join(l->thread, NULL);
    }
    for (uint32_t i = 0; i < l->n_linger; i++) close(l->linger[i].fd);
    if (l->lfd >= 0) close(l->lfd);
    if (l->wake[0] >= 0) close(l->wake[0]);
    if (l->wake[1] >= 0) close(l->wake[1]);
    if (l->spare >= 0) close(l->spare);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l->conns);
    free(l->ips);
    free(l->resp_busy);
    free(l->resp_ip);
    free(l->resp_head);
    free(l->resp_body);
    free(l);
}
