/*
 * http.h - the OpenAI-compatible HTTP front end of `orch serve`
 * (libmicrohttpd, internal epoll polling thread(s), suspend/resume):
 * routing, authentication, request bodies, hand-off to the scheduler,
 * answers. Request bodies are parsed by request.h, answers written by
 * render.h, errors shaped by api_error.h.
 *
 * Routes:
 *   GET  /health               200 {"status":"ok"}; 503 {"status":"loading"}
 *                              or {"status":"draining"}
 *   GET  /v1/models            the served model; GET /v1/models/NAME too
 *   POST /v1/completions       prompt: string | token ids | list of either
 *   POST /v1/chat/completions  messages through chat_template.h
 *   GET  /metrics              Prometheus text (metrics.h)
 * Errors use OpenAI's shape {"error":{"message","type","param","code"}}:
 *   400 malformed JSON, wrong types, bad ranges, unknown model, context
 *       overflow (states the prompt's tokens and the context size);
 *   401 missing or wrong Bearer token when an API key is set (routes under /v1/ only);
 *   404 unknown route; 405 wrong method (with Allow); 413 body over the
 *   limit; 429 waiting queue full; 500 engine failure; 503 loading/draining.
 *
 * Each request becomes one scheduler sequence per (prompt, choice). A
 * connection that is waiting for the scheduler is suspended; the scheduler's
 * notify resumes it. Client disconnects are noticed through conn_watch.h,
 * polled by the scheduler thread once per iteration
 * (http_server_poll_disconnects), so a closed client's sequences are
 * cancelled and their KV blocks freed in the next iteration, also while its
 * connection is suspended. (A client that half-closes its socket right after
 * sending a request is treated as gone.)
 *
 * Lifecycle (serve.h runs it): http_server_start (loading: API routes answer
 * 503) -> http_server_set_ready -> http_server_drain_begin (stop listening;
 * new API requests 503) -> wait for the scheduler to empty ->
 * http_server_detach_scheduler -> scheduler_destroy -> wait for
 * http_server_inflight() == 0 -> http_server_stop.
 * Threads: all functions are thread-safe. Memory: the server owns its
 * requests; the scheduler, tokenizer and registry passed in must outlive it
 * (until http_server_stop returns).
 * Errors: http_server_start returns -1 with a message when it cannot listen.
 */
#ifndef ORCH_HTTP_H
#define ORCH_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/metrics.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/scheduler.h"

#define HTTP_DEFAULT_MAX_BODY             (4u << 20)
#define HTTP_DEFAULT_MAX_SEQS_PER_REQUEST 256u

typedef struct http_server_config {
    const char *host;              /* IPv4 address to bind; NULL = 127.0.0.1 */
    uint16_t port;                 /* 0 = any free port (see http_server_port) */
    const char *api_key;           /* NULL or "" = no authentication */
    const char *model_name;        /* the id /v1/models reports and requests use */
    size_t max_body;               /* request body limit in bytes; 0 = 4 MiB */
    uint32_t http_threads;         /* polling threads; 0 = 1 */
    uint32_t max_seqs_per_request; /* n * prompts limit; 0 = 256 */
    metrics_registry *metrics;     /* required */
} http_server_config;

typedef struct http_server http_server;

int http_server_start(const http_server_config *cfg, http_server **out, char *err,
                      size_t err_cap);
uint16_t http_server_port(const http_server *s);

/* The model is loaded: requests go to `sched`. vocab/context bound the
 * validation; eot/tokenizer come from tok. */
void http_server_set_ready(http_server *s, scheduler *sched, const tokenizer *tok,
                           uint32_t vocab_size, uint32_t context);

/* Scheduler poll hook (arg = http_server *): cancel the sequences of clients
 * that closed their connection. Cheap (one non-blocking epoll_wait). */
void http_server_poll_disconnects(void *arg);

/* Stop accepting connections; API requests from now on get 503. */
void http_server_drain_begin(http_server *s);

/* Forget the scheduler (before scheduler_destroy): new API requests get
 * 503; sequences still in the scheduler are finished by its destroy. */
void http_server_detach_scheduler(http_server *s);

/* Generation requests accepted by the scheduler whose answer has not been
 * completely sent yet (what a drain waits for). */
uint32_t http_server_inflight(const http_server *s);

/* Stop the HTTP daemon and free the server. NULL is a no-op. */
void http_server_stop(http_server *s);

#endif
