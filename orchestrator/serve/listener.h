/*
 * listener.h - the listening socket of `orch serve` and the limits on who
 * may hold a connection, and for how long (slowloris and connection
 * exhaustion defences in front of libmicrohttpd).
 *
 * One thread accepts connections and, for each:
 *   - past max_conns open connections, or past max_per_ip from the client's
 *     address, answers at once, before reading anything, with
 *     "503 Service Unavailable", Retry-After: 1, Connection: close and an
 *     OpenAI-shaped error (code too_many_connections or
 *     too_many_connections_per_ip), then closes it (after up to 2 s of
 *     reading what the client still sends, so the answer is not lost to a
 *     reset; at most LISTENER_MAX_LINGER such sockets, the rest are closed at
 *     once);
 *   - otherwise hands it to the HTTP server (config.admit) and tracks it
 *     until the server reports it closed.
 * Every 100 ms the same thread checks the tracked connections' deadlines,
 * which are deadlines for a whole phase, not reset by each byte:
 *   LISTENER_HEAD_FIRST  the first request head must be complete within
 *                        header_timeout of the accept;
 *   LISTENER_BODY        the body within body_timeout of the end of its head;
 *   LISTENER_IDLE        on a kept-alive connection, the next request head
 *                        within idle_timeout of the previous answer;
 *   LISTENER_BUSY        (the request is being served) none.
 * A connection past its deadline gets "408 Request Timeout" (code
 * request_timeout; not in LISTENER_IDLE, where a client may be sending a new
 * request at that very moment, nor after the server has started an answer)
 * and is shut down; the server then sees the close and frees it.
 *
 * Connections are identified by their socket: the server reports phases and
 * the close by fd (it must report the close before it closes the socket).
 * Metrics (when a registry is given): orch_http_connections_open,
 * orch_http_connections_refused_total{reason="max_connections"|"max_per_ip"},
 * orch_http_connections_timed_out_total{phase="head"|"body"|"idle"}.
 *
 * Threads: every function is thread-safe; admit is called on the listener's
 * thread without its lock held (it may call back into the listener).
 * Memory: the listener owns its sockets and tables; listener_stop frees
 * everything. Errors: listener_start returns -1 with a message (cannot
 * listen, out of memory or threads).
 */
#ifndef ORCH_LISTENER_H
#define ORCH_LISTENER_H

#include <netinet/in.h>
#include <stdint.h>

#include "orchestrator/core/metrics.h"

#define LISTENER_MAX_LINGER 256u /* refused sockets kept open to read the request */

enum listener_phase {
    LISTENER_HEAD_FIRST = 0, /* accepted; the first request head is arriving */
    LISTENER_BODY,           /* the request body is arriving */
    LISTENER_BODY_ANSWERED,  /* ... but an answer was already queued (no 408) */
    LISTENER_BUSY,           /* the request is being served: no deadline */
    LISTENER_IDLE            /* kept alive between requests */
};

typedef struct listener_config {
    struct sockaddr_in addr; /* where to listen (port 0: any free port) */
    uint32_t max_conns;      /* connections open at once (>= 1) */
    uint32_t max_per_ip;     /* of them from one client address (>= 1) */
    double header_timeout;   /* seconds; see above (> 0) */
    double body_timeout;
    double idle_timeout;
    /* Take over socket fd (non-blocking) of a client at peer; returns 0, or
     * -1 when it could not (the socket is closed by then either way). */
    int (*admit)(void *arg, int fd, const struct sockaddr_in *peer);
    void *admit_arg;
    metrics_registry *metrics; /* may be NULL */
} listener_config;

typedef struct listener listener;

/* *out is written before the thread starts (callbacks may read it). */
int listener_start(const listener_config *cfg, listener **out, char *err, size_t err_cap);
uint16_t listener_port(const listener *l);

/* The server took connection fd (from admit); 0, or -1 for an fd the listener
 * did not hand over. */
int listener_conn_started(listener *l, int fd);
/* Connection fd enters phase (a listener_phase): its deadline starts now. */
void listener_conn_phase(listener *l, int fd, int phase);
/* Connection fd is closing (before its socket is closed). */
void listener_conn_closed(listener *l, int fd);

/* Connections handed over and not yet closed. */
uint32_t listener_open(const listener *l);

/* Close the listening socket (new connections are refused by the kernel);
 * the deadlines stay enforced. Returns once the socket is closed. */
void listener_stop_accepting(listener *l);

/* Stop the thread and free the listener. NULL is a no-op. */
void listener_stop(listener *l);

#endif
