/*
 * conn_watch.h - noticing that HTTP clients went away while their requests
 * are still being generated: an epoll set over every connection's socket
 * waiting for EPOLLRDHUP (peer closed or half-closed), polled without
 * blocking by the scheduler thread once per iteration. Each watched
 * connection can carry the request currently waiting on it; a poll hands the
 * requests of closed connections to a callback (which cancels them).
 *
 * Entries are kept in a slot table with generation numbers, so an event that
 * arrives for a connection that was already removed (and its slot reused) is
 * ignored.
 *
 * Memory: the watch owns its entries (conn_watch_add -> conn_watch_remove);
 * the request pointers are borrowed. Threads: every function is thread-safe
 * (one internal mutex). The gone callback runs with that mutex held, so a
 * request stays valid during it as long as its owner calls
 * conn_watch_clear_request before freeing it; the callback must not call back
 * into the watch. Errors: conn_watch_create and conn_watch_add return NULL
 * when out of memory or file descriptors; a socket that cannot be added to
 * the epoll set is simply not watched.
 */
#ifndef ORCH_CONN_WATCH_H
#define ORCH_CONN_WATCH_H

typedef struct conn_watch conn_watch;
typedef struct conn_watch_conn conn_watch_conn; /* one watched connection */

conn_watch *conn_watch_create(void);
void conn_watch_free(conn_watch *w); /* NULL is a no-op */

/* Start watching socket fd (EPOLLRDHUP, one-shot). */
conn_watch_conn *conn_watch_add(conn_watch *w, int fd);
/* Stop watching and free the entry (c may be NULL). */
void conn_watch_remove(conn_watch *w, conn_watch_conn *c);

/* The request now waiting on connection c (c may be NULL: nothing happens). */
void conn_watch_set_request(conn_watch *w, conn_watch_conn *c, void *req);
/* Forget req on c if it is still the one set. */
void conn_watch_clear_request(conn_watch *w, conn_watch_conn *c, void *req);

/* Without blocking: for each connection whose client closed since the last
 * poll and that carries a request, call gone(req, arg). */
typedef void (*conn_watch_gone_fn)(void *req, void *arg);
void conn_watch_poll(conn_watch *w, conn_watch_gone_fn gone, void *arg);

#endif
