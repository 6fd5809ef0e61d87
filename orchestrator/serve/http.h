/*
 * http.h - the OpenAI-compatible HTTP front end of `orch serve`
 * (libmicrohttpd, internal epoll polling thread(s), suspend/resume):
 * routing, header checks, request bodies, hand-off to the scheduler,
 * answers. Connections are accepted by listener.h (limits, deadlines),
 * headers checked by http_policy.h, bodies parsed by request.h on a small
 * worker pool (work_pool.h), answers written by render.h, errors shaped by
 * api_error.h; a generation request's life is in http_gen.c.
 *
 * Routes:
 *   GET  /health               200 {"status":"ok"}; 503 {"status":"loading"}
 *                              or {"status":"draining"}
 *   GET  /v1/models            the served model; GET /v1/models/NAME too
 *   POST /v1/completions       prompt: string | token ids | list of either
 *   POST /v1/chat/completions  messages through chat_template.h
 *   GET  /metrics              Prometheus text (metrics.h)
 *   /v1/files...               OpenAI's files API (http_files.c), with a
 *                              file store (--state-dir)
 *   /v1/fine_tuning/jobs...    OpenAI's fine-tuning API (http_ft.c), jobs
 *                              run inside the server (ft_runner.h)
 *   POST /v1/load_lora_adapter, /v1/unload_lora_adapter  vLLM's (coserve.h);
 *                              /v1/models lists the adapters with "parent";
 *                              "model" may name an adapter
 *   OPTIONS (any route)        CORS preflight, for an allowed origin only
 * Checks, in order, before a body is read: Host (http_policy.h), route,
 * method, API key (routes under /v1/), Content-Type of POST routes, the
 * framing headers, the body size, the memory of bodies in flight.
 * Errors use OpenAI's shape {"error":{"message","type","param","code"}}:
 *   400 malformed JSON (also: data after it, a key twice in an object, a NUL
 *       in a string), wrong types, bad ranges, unknown model, context
 *       overflow (states the prompt's tokens and the context size), more
 *       sequences (n x prompts) than --max-waiting, two different
 *       Content-Length headers or Content-Length with Transfer-Encoding
 *       (code invalid_header, Connection: close), HTTP/1.1 without Host;
 *   401 missing or wrong Bearer token when an API key is set (routes under /v1/ only);
 *   403 a Host that is not allowed (code host_not_allowed);
 *   404 unknown route; 405 wrong method (with Allow); 408 a request head or
 *   body past its deadline (listener.h); 413 body over the limit; 415 a POST
 *   body that is not application/json; 429 waiting queue full; 500 engine
 *   failure; 503 loading/draining, too many connections (listener.h), or
 *   the bodies in flight over max_body_memory (code server_busy). 429 and
 *   503 carry Retry-After: 1.
 *
 * Each request becomes one scheduler sequence per (prompt, choice). A
 * connection that is waiting for the worker pool or the scheduler is
 * suspended; whoever finishes resumes it. Client disconnects are noticed
 * through conn_watch.h, polled by the scheduler thread once per iteration
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
 * (until http_server_stop returns); the configuration's strings are copied.
 * Errors: http_server_start returns -1 with a message when it cannot listen.
 */
#ifndef ORCH_HTTP_H
#define ORCH_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/metrics.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/serve/coserve.h"
#include "orchestrator/serve/file_store.h"
#include "orchestrator/serve/ft_jobs.h"
#include "orchestrator/serve/scheduler.h"

#define HTTP_DEFAULT_MAX_BODY             (4u << 20)
#define HTTP_DEFAULT_MAX_SEQS_PER_REQUEST 256u
#define HTTP_DEFAULT_MAX_BODY_MEMORY      (256u << 20)
#define HTTP_DEFAULT_MAX_CONNECTIONS      4096u
#define HTTP_DEFAULT_MAX_CONNECTIONS_IP   1024u
#define HTTP_DEFAULT_HEADER_TIMEOUT_S     10u
#define HTTP_DEFAULT_BODY_TIMEOUT_S       60u
#define HTTP_DEFAULT_IDLE_TIMEOUT_S       15u
#define HTTP_DEFAULT_WORKERS              2u

typedef struct http_server_config {
    const char *host;                 /* IPv4 address to bind; NULL = 127.0.0.1 */
    uint16_t port;                    /* 0 = any free port (see http_server_port) */
    const char *api_key;              /* NULL or "" = no authentication */
    const char *model_name;           /* the id /v1/models reports and requests use */
    size_t max_body;                  /* request body limit in bytes; 0 = 4 MiB */
    size_t max_body_memory;           /* all bodies in flight together; 0 = 256 MiB */
    uint32_t http_threads;            /* polling threads; 0 = 1 */
    uint32_t workers;                 /* parsing / rendering threads; 0 = 2 */
    uint32_t max_seqs_per_request;    /* n * prompts limit; 0 = 256 */
    uint32_t max_connections;         /* 0 = 4096 (listener.h) */
    uint32_t max_connections_per_ip;  /* 0 = 1024 */
    uint32_t header_timeout_s;        /* 0 = 10 */
    uint32_t body_timeout_s;          /* 0 = 60 */
    uint32_t idle_timeout_s;          /* keep-alive; 0 = 15 */
    const char *const *allowed_hosts; /* --allowed-host (http_policy.h) */
    size_t n_allowed_hosts;
    const char *const *cors_origins; /* --cors-origin */
    size_t n_cors_origins;
    metrics_registry *metrics; /* required */
    file_store *files;         /* /v1/files (borrowed); NULL = those routes 404 */

} http_server_config;

typedef struct http_server http_server;

int http_server_start(const http_server_config *cfg, http_server **out, char *err,
                      size_t err_cap);
uint16_t http_server_port(const http_server *s);

/* The model is loaded: requests go to `sched`. vocab/context bound the
 * validation (context: prompt + completion tokens, /v1/models max_model_len);
 * eot/tokenizer come from tok; arch (static storage, e.g. "llama") is the
 * architecture /v1/models reports. */
void http_server_set_ready(http_server *s, scheduler *sched, const tokenizer *tok,
                           uint32_t vocab_size, uint32_t context, const char *arch);

/* The chat template of /v1/chat/completions (request_limits: NULL =
 * orch-plain-v1; error non-NULL = chat refused with it). Both are borrowed
 * and must outlive the server. Call before http_server_set_ready. */
void http_server_set_chat_template(http_server *s, const chat_template *t,
                                   const char *error);

/* The served adapters (borrowed; must outlive the server). Call before
 * http_server_set_ready. */
void http_server_set_coserve(http_server *s, coserve *c);
/* The fine-tuning jobs and their runner (borrowed), or why there are none
 * (disabled: a message for the 404; copied by reference, static or
 * outliving the server). Call before http_server_set_ready. */
void http_server_set_finetune(http_server *s, ft_jobs *jobs, struct ft_runner *runner,
                              const char *disabled);

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
