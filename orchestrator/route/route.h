/*
 * route.h - the HTTP front of `orch route`: an OpenAI-compatible server
 * (libmicrohttpd, one internal epoll thread, suspend/resume) in front of
 * several `orch serve` workers. Connections are accepted by the same
 * listener as `orch serve` (orchestrator/serve/listener.h: connection
 * limits, phase deadlines) and headers checked by its http_policy.h (Host,
 * Content-Type, CORS, API key).
 *
 * Routes:
 *   POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize
 *        forwarded to the worker route_workers_pick chooses (route_policy.h),
 *        by route_proxy.h; the worker's status, Content-Type and body are
 *        passed on untouched. A streamed answer (200 text/event-stream) is
 *        passed on event by event (each up to its blank line), the bytes
 *        as the worker sent them; past 1 MiB the client has not taken yet,
 *        the worker's transfer is paused until it is down to 256 KiB
 *        (orch_route_backpressure_pauses_total). A non-streamed answer is
 *        collected whole first.
 *   GET  /v1/models, /v1/models/NAME   the union of the up workers' models
 *   GET  /health   200 {"status":"ok","workers_up":N}; 503 when none is up
 *   GET  /metrics  Prometheus text (route_workers.h's families, and
 *                  orch_route_http_requests_total{endpoint,status},
 *                  orch_route_retries_total, orch_route_stream_errors_total)
 *   GET  /workers  the worker set (route_workers_list_json)
 *   POST /workers  {"url":"http://HOST:PORT"} adds a worker (201; 200 when
 *                  already there); DELETE /workers/URL (URL percent-encoded
 *                  or not) removes one (200; 404 when unknown)
 * Failures: a request whose worker fails before any byte of the answer
 * reached the client (connect error, reset, a 503 answer: draining or
 * loading) is sent to another worker, up to max_retries times; with none
 * left the client gets 503 code worker_unavailable (or the worker's own 503
 * answer). A stream whose worker fails after it started gets, in place of
 * the incomplete event, one error event
 *   data: {"error":{"message":...,"type":"server_error","code":"worker_failed"}}
 * and "data: [DONE]".
 * Auth: with api_key, /v1/ and /workers need "Authorization: Bearer KEY".
 * Workers get "Authorization: Bearer worker_api_key" when that is set, else
 * the client's Authorization header as it came (passthrough).
 *
 * Shutdown (SIGTERM in cmd_route.c): route_server_drain, then
 * route_server_stop.
 * Memory: the server owns its requests and its proxy (route_proxy.h); the
 * workers and registry given must outlive it. Threads: start/stop from one thread; callbacks on the
 * HTTP and proxy threads. Errors: route_server_start returns -1 with a
 * message (cannot listen, bad host, out of resources).
 */
#ifndef ORCH_ROUTE_H
#define ORCH_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/metrics.h"
#include "orchestrator/route/route_proxy.h"
#include "orchestrator/route/route_workers.h"

typedef struct route_server_config {
    const char *host; /* IPv4 to bind; NULL = 127.0.0.1 */
    uint16_t port;    /* 0 = any free port */
    const char *api_key;
    const char *worker_api_key;
    const char *const *allowed_hosts;
    size_t n_allowed_hosts;
    const char *const *cors_origins;
    size_t n_cors_origins;
    size_t max_body;          /* bytes (> 0) */
    uint32_t max_connections; /* (> 0) */
    uint32_t max_connections_per_ip;
    uint32_t header_timeout_s, body_timeout_s, idle_timeout_s;
    uint32_t max_retries;     /* other workers tried after a failure */
    double request_timeout_s; /* per forwarded request; 0 = none */
    double connect_timeout_s; /* to a worker; 0 = 2 s */
    route_workers *workers;
    metrics_registry *metrics;
} route_server_config;

typedef struct route_server route_server;

int route_server_start(const route_server_config *cfg, route_server **out, char *err,
                       size_t err_cap);
uint16_t route_server_port(const route_server *s);
/* Drain: stop accepting connections, answer new requests on open ones 503
 * (code server_draining; /health 503 "draining"), and wait up to timeout_s
 * for the requests in progress. Returns how many are left. */
uint32_t route_server_drain(route_server *s, double timeout_s);
/* Stop accepting, end the forwarded requests (streams get their error
 * event, within 2 s), stop. NULL is a no-op. */
void route_server_stop(route_server *s);

#endif
