/*
 * route_proxy.h - the forwarding half of `orch route`: one thread running a
 * libcurl multi handle that carries every request to its worker at once
 * (no thread per connection), and hands the answer back piece by piece.
 *
 * A transfer (route_xfer, embedded by the caller) is a POST of a JSON body to
 * a URL with the caller's extra headers. Its callbacks run on the proxy
 * thread, in this order:
 *   on_head   once the worker's final response head is in (1xx skipped):
 *             its status and the headers worth passing on (Content-Type,
 *             Retry-After, WWW-Authenticate, Allow, Cache-Control) as
 *             "Name: value\n" lines;
 *   on_data   each piece of the body as it arrives (0 to go on, -1 to abort
 *             the transfer, which then ends as failed, 1 to pause it: the
 *             piece is not taken and comes again after route_proxy_resume;
 *             back-pressure towards the worker);
 *   on_done   exactly once at the end: ok = 1 when the whole answer arrived,
 *             else 0 with a message (connect failure, reset, time-out,
 *             cancelled). After on_done the proxy never touches the transfer
 *             again, and on_done may submit it (or another) anew.
 * route_proxy_cancel ends a transfer early (on_done with ok = 0).
 *
 * Memory: the caller owns the transfer, its URL, body and header list until
 * on_done. Threads: submit and cancel are thread-safe; callbacks run on the
 * proxy thread and must not block. Errors: create returns NULL with a
 * message; submit returns -1 once the proxy is stopping (no callback then).
 */
#ifndef ORCH_ROUTE_PROXY_H
#define ORCH_ROUTE_PROXY_H

#include <stdatomic.h>
#include <stddef.h>

#include "orchestrator/core/strbuf.h"

struct curl_slist;
typedef struct route_proxy route_proxy;
typedef struct route_xfer route_xfer;

struct route_xfer {
    /* the caller's */
    const char *url;
    const char *body;
    size_t body_len;
    const struct curl_slist *headers;
    double timeout_s; /* whole transfer; 0 = none */
    void (*on_head)(route_xfer *x, long status, const char *headers);
    int (*on_data)(route_xfer *x, const char *p, size_t n);
    void (*on_done)(route_xfer *x, int ok, const char *error);
    /* the proxy's */
    void *easy;
    route_xfer *next;
    strbuf hdrs;
    int head_done;
    atomic_int cancel;
    atomic_int unpause;
    int paused; /* the proxy thread's */
};

/* tick (may be NULL) runs on the proxy thread after every round of
 * transfers, at least every 200 ms, for the caller's periodic work (it may
 * call route_proxy_cancel, not submit). */
/* Continue a transfer that on_data paused (thread-safe; a no-op for one
 * that is not paused). */
void route_proxy_resume(route_proxy *p, route_xfer *x);
route_proxy *route_proxy_create(double connect_timeout_s, void (*tick)(void *arg),
                                void *tick_arg, char *err, size_t err_cap);
int route_proxy_submit(route_proxy *p, route_xfer *x);
void route_proxy_cancel(route_proxy *p, route_xfer *x);
/* End every transfer (on_done with ok = 0), stop the thread, free. */
void route_proxy_destroy(route_proxy *p);

#endif
