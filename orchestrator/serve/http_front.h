/*
 * http_front.h - what the HTTP sides of `orch serve` (http.c) and `orch
 * route` (route/route.c) share: a libmicrohttpd daemon without a listening
 * socket, fed by the listener (listener.h: connection limits, deadlines),
 * every connection of it known to the listener (started, phases, closed) and
 * watched for a client that goes away (conn_watch.h).
 *
 * Use: embed an http_front in the server; create front.watch; start the
 * daemon with HTTP_FRONT_MHD_FLAGS and MHD_OPTION_NOTIFY_CONNECTION,
 * http_front_on_connection, &front; start the listener with
 * .admit = http_front_admit, .admit_arg = &front. A connection's
 * socket_context is then its http_front_conn.
 *
 * Memory: the front owns nothing itself (the server creates and frees d,
 * lst and watch); a http_front_conn lives from the connection's start to its
 * close notification. Threads: the callbacks run on libmicrohttpd's and the
 * listener's threads; listener and conn_watch are thread-safe. Errors:
 * http_front_admit returns -1 when libmicrohttpd refuses the socket (it has
 * then closed it); http_front_addr returns -1 with the message in err.
 */
#ifndef ORCH_HTTP_FRONT_H
#define ORCH_HTTP_FRONT_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "orchestrator/serve/conn_watch.h"
#include "orchestrator/serve/listener.h"

/* libmicrohttpd's mode for both servers: one internal epoll thread (or a
 * pool), suspend/resume, no listening socket of its own. */
#define HTTP_FRONT_MHD_FLAGS                                                      \
    (MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | \
     MHD_USE_ITC | MHD_USE_NO_LISTEN_SOCKET)

typedef struct http_front {
    struct MHD_Daemon *d;
    listener *lst;
    conn_watch *watch; /* clients gone while their request runs */
} http_front;

/* A connection's socket_context. */
typedef struct http_front_conn {
    int fd;
    conn_watch_conn *cc;
} http_front_conn;

/* listener admit callback (arg: the http_front): hand fd to the daemon. */
int http_front_admit(void *front, int fd, const struct sockaddr_in *peer);

/* MHD_OPTION_NOTIFY_CONNECTION callback (cls: the http_front): a started
 * connection gets its http_front_conn, is reported to the listener and
 * watched; a closed one is reported (before libmicrohttpd closes the socket)
 * and forgotten. */
void http_front_on_connection(void *front, struct MHD_Connection *conn,
                              void **socket_context,
                              enum MHD_ConnectionNotificationCode toe);

/* The IPv4 address host:port (host NULL: 127.0.0.1) into *out. */
int http_front_addr(const char *host, uint16_t port, struct sockaddr_in *out, char *err,
                    size_t err_cap);

/* libmicrohttpd's inactivity time-out, the backstop behind the listener's
 * deadlines (e.g. for a client that stops reading its answer): the longest
 * of them. */
unsigned http_front_inactivity(unsigned idle_s, unsigned header_s, unsigned body_s);

#endif
