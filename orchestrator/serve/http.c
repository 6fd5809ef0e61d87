/*
 * http.c - the HTTP front end over libmicrohttpd: connections from the
 * listener, header checks, routing, request bodies (size and memory caps),
 * responses, lifecycle. Generation requests continue in http_gen.c, parsing
 * is request.c's, JSON rendering render.c's. See http.h.
 */
#include "orchestrator/serve/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/core/rng.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/http_internal.h"

static const char *const route_label[R_COUNT] = { "other",
                                                  "/health",
                                                  "/v1/models",
                                                  "/v1/models/{model}",
                                                  "/v1/completions",
                                                  "/v1/chat/completions",
                                                  "/metrics",
                                                  "/tokenize",
                                                  "/detokenize",
                                                  "/v1/files",
                                                  "/v1/files/{id}",
                                                  "/v1/files/{id}/content",
                                                  "/v1/load_lora_adapter",
                                                  "/v1/unload_lora_adapter" };

/* The Allow header of a 405 on `route`. */
static const char *route_allow(int route) {
    if (route == R_FILES) return "GET, HEAD, POST";
    if (route == R_FILE) return "GET, HEAD, DELETE";
    if (route == R_FT_JOBS) return "GET, HEAD, POST";
    if (route == R_FT_CANCEL) return "POST";
    return route_is_post(route) ? "POST" : "GET, HEAD";
}

/* ------------------------------------------------------------------------- */
/* Responses                                                                  */
/* ------------------------------------------------------------------------- */
void http_count_request(http_server *s, int route, unsigned status) {
    char st[8];
    snprintf(st, sizeof st, "%u", status);
    const char *labels[2] = { route_label[route], st };
    metrics_counter_add(metrics_series_get(s->m_requests, labels), 1);
}

void http_add_cors(const http_req *hr, struct MHD_Response *r) {
    if (!hr->cors) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", hr->cors);
    MHD_add_response_header(r, "Vary", "Origin");
}

enum MHD_Result http_queue_body(http_req *hr, unsigned status, char *body, size_t len,
                                const char *ctype) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 405) {
        const char *allow = route_allow(hr->route);
        MHD_add_response_header(r, "Allow", allow);
    }
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (hr->close_after) MHD_add_response_header(r, "Connection", "close");
    http_add_cors(hr, r);
    enum MHD_Result ret = MHD_queue_response(hr->conn, status, r);
    MHD_destroy_response(r);
    hr->responded = 1;
    http_count_request(hr->srv, hr->route, status);
    return ret;
}

enum MHD_Result http_queue_json(http_req *hr, unsigned status, strbuf *b) {
    if (b->oom || !b->p) {
        free(b->p);
        return MHD_NO;
    }
    return http_queue_body(hr, status, b->p, b->len, "application/json");
}

enum MHD_Result http_queue_error(http_req *hr, const api_error *e) {
    strbuf b = { 0 };
    api_error_json(&b, e);
    return http_queue_json(hr, e->status, &b);
}

enum MHD_Result http_queue_err(http_req *hr, unsigned status, const char *param,
                               const char *code, const char *msg) {
    api_error e;
    api_error_set(&e, status, param, code, "%s", msg);
    return http_queue_error(hr, &e);
}

/* ------------------------------------------------------------------------- */
/* Request objects                                                            */
/* ------------------------------------------------------------------------- */
void http_body_release(http_req *hr) {
    free(hr->body);
    hr->body = NULL;
    hr->body_len = hr->body_cap = 0;
    if (hr->reserved) atomic_fetch_sub(&hr->srv->body_held, hr->reserved);
    hr->reserved = 0;
}

/* Reserve n more bytes of the bodies' memory cap. */
static int body_reserve(http_req *hr, size_t n) {
    http_server *s = hr->srv;
    size_t cur = atomic_load(&s->body_held);
    do {
        if (n > s->cfg.max_body_memory || cur > s->cfg.max_body_memory - n) return -1;
    } while (!atomic_compare_exchange_weak(&s->body_held, &cur, cur + n));
    hr->reserved += n;
    return 0;
}

void http_req_free(http_req *hr) {
    for (uint32_t i = 0; i < hr->n_seqs; i++) sched_seq_free_outputs(&hr->seqs[i]);
    free(hr->seqs);
    render_stream_free(&hr->rs);
    gen_request_free(&hr->req);
    if (hr->adapter && srv_coserve(hr->srv))
        coserve_release(srv_coserve(hr->srv), hr->adapter);
    http_body_release(hr);
    free(hr->obuf);
    free(hr->final.p);
    if (hr->lock_init) pthread_mutex_destroy(&hr->lock);
    if (hr->counted) atomic_fetch_sub(&hr->srv->inflight, 1);
    free(hr);
}

void http_req_unref(http_req *hr) {
    pthread_mutex_lock(&hr->lock);
    int left = --hr->refs;
    pthread_mutex_unlock(&hr->lock);
    if (left == 0) http_req_free(hr);
}

void http_req_suspend_locked(http_req *hr) {
    hr->suspended = 1;
    hr->resume_requested = 0;
    MHD_suspend_connection(hr->conn);
}

void http_req_resume(http_req *hr) {
    pthread_mutex_lock(&hr->lock);
    int resume = hr->suspended && !hr->resume_requested;
    if (resume) hr->resume_requested = 1;
    pthread_mutex_unlock(&hr->lock);
    /* a suspended connection stays alive until it is resumed */
    if (resume) MHD_resume_connection(hr->conn);
}

/* ------------------------------------------------------------------------- */
/* Connections and disconnects                                                */
/* ------------------------------------------------------------------------- */
static void set_phase(http_req *hr, int phase) {
    if (hr->hc) listener_conn_phase(hr->srv->front.lst, hr->hc->fd, phase);
}

/* conn_watch callback (watch lock held): the client of req went away. */
static void on_client_gone(void *req, void *arg) {
    http_req *hr = req;
    http_server *s = arg;
    pthread_mutex_lock(&hr->lock);
    if (http_gen_cancel_locked(hr)) metrics_counter_add(s->m_disconnects, 1);
    pthread_mutex_unlock(&hr->lock);
}

void http_server_poll_disconnects(void *arg) {
    http_server *s = arg;
    conn_watch_poll(s->front.watch, on_client_gone, s);
}

/* MHD request-completed callback. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    (void)toe;
    http_server *s = cls;
    http_req *hr = *req_cls;
    if (!hr) return;
    *req_cls = NULL;
    set_phase(hr, LISTENER_IDLE); /* kept alive: the next head has a deadline */
    http_files_done(hr);
    conn_watch_clear_request(s->front.watch, hr->hc ? hr->hc->cc : NULL, hr);
    pthread_mutex_lock(&hr->lock);
    int wake = http_gen_cancel_locked(hr);
    pthread_mutex_unlock(&hr->lock);
    if (wake) {
        pthread_mutex_lock(&s->sched_mu);
        if (s->sched) scheduler_wake(s->sched);
        pthread_mutex_unlock(&s->sched_mu);
    }
    http_req_unref(hr);
}

/* ------------------------------------------------------------------------- */
/* Routing and header checks                                                  */
/* ------------------------------------------------------------------------- */
static int match_route(const char *url) {
    if (strcmp(url, "/health") == 0) return R_HEALTH;
    if (strcmp(url, "/v1/models") == 0) return R_MODELS;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) return R_MODEL;
    if (strcmp(url, "/v1/completions") == 0) return R_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0) return R_CHAT;
    if (strcmp(url, "/metrics") == 0) return R_METRICS;
    if (strcmp(url, "/tokenize") == 0) return R_TOKENIZE;
    if (strcmp(url, "/detokenize") == 0) return R_DETOKENIZE;
    if (strcmp(url, "/v1/files") == 0) return R_FILES;
    if (strcmp(url, "/v1/fine_tuning/jobs") == 0) return R_FT_JOBS;
    if (strncmp(url, "/v1/fine_tuning/jobs/", 21) == 0 && url[21]) {
        const char *slash = strchr(url + 21, '/');
        if (!slash) return R_FT_JOB;
        if (strcmp(slash, "/cancel") == 0) return R_FT_CANCEL;
        if (strcmp(slash, "/events") == 0) return R_FT_EVENTS;
        if (strcmp(slash, "/checkpoints") == 0) return R_FT_CKPTS;
        return R_OTHER;
    }
    if (strcmp(url, "/v1/load_lora_adapter") == 0) return R_LORA_LOAD;
    if (strcmp(url, "/v1/unload_lora_adapter") == 0) return R_LORA_UNLOAD;
    if (strncmp(url, "/v1/files/", 10) == 0 && url[10]) {
        size_t n = strlen(url);
        if (n > 18 && strcmp(url + n - 8, "/content") == 0) return R_FILE_CONTENT;
        return R_FILE;
    }
    return R_OTHER;
}

static enum MHD_Result answer_get(http_req *hr, const char *url) {
    http_server *s = hr->srv;
    strbuf b = { 0 };
    pthread_mutex_lock(&s->sched_mu);
    uint32_t context = s->context; /* 0 while loading */
    const char *arch = s->arch;    /* NULL while loading */
    pthread_mutex_unlock(&s->sched_mu);
    switch (hr->route) {
    case R_HEALTH: {
        int st = atomic_load(&s->state);
        strbuf_puts(&b, st == ST_READY     ? "{\"status\":\"ok\"}"
                        : st == ST_LOADING ? "{\"status\":\"loading\"}"
                                           : "{\"status\":\"draining\"}");
        return http_queue_json(hr, st == ST_READY ? 200 : 503, &b);
    }
    case R_MODELS:
        strbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
        render_model_object(&b, s->model_name, s->created, context, arch);
        if (srv_coserve(s)) coserve_models_json(srv_coserve(s), &b, context);
        strbuf_puts(&b, "]}");
        return http_queue_json(hr, 200, &b);
    case R_MODEL:
        if (strcmp(url + 11, s->model_name) != 0 && srv_coserve(s) &&
            coserve_model_json(srv_coserve(s), url + 11, &b, context) == 0)
            return http_queue_json(hr, 200, &b);
        if (strcmp(url + 11, s->model_name) != 0) {
            api_error e;
            api_error_set(&e, 404, "model", "model_not_found",
                          "the model '%.128s' does not exist", url + 11);
            return http_queue_error(hr, &e);
        }
        render_model_object(&b, s->model_name, s->created, context, arch);
        return http_queue_json(hr, 200, &b);
    case R_METRICS: {
        char *text = NULL;
        size_t len = 0;
        if (metrics_render(s->cfg.metrics, &text, &len) != 0) return MHD_NO;
        return http_queue_body(hr, 200, text, len, METRICS_CONTENT_TYPE);
    }
    default: return http_queue_err(hr, 404, NULL, "not_found", "not found");
    }
}

/* The CORS preflight answer (an allowed origin). */
static enum MHD_Result answer_preflight(http_req *hr) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    http_add_cors(hr, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods",
                            "GET, POST, DELETE, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(hr->conn, 204, r);
    MHD_destroy_response(r);
    hr->responded = 1;
    http_count_request(hr->srv, hr->route, 204);
    return ret;
}

/* Content-Length and Transfer-Encoding headers, counted. */
typedef struct framing {
    const char *cl; /* the first Content-Length */
    int cl_differs, te;
} framing;

static enum MHD_Result framing_of(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value) {
    (void)kind;
    framing *f = cls;
    if (strcasecmp(key, "Content-Length") == 0) {
        if (!f->cl)
            f->cl = value ? value : "";
        else if (strcmp(f->cl, value ? value : "") != 0)
            f->cl_differs = 1;
    } else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        f->te = 1;
    }
    return MHD_YES;
}

/* A POST body's headers: media type, framing, size, memory. */
static enum MHD_Result check_body_headers(http_req *hr) {
    http_server *s = hr->srv;
    struct MHD_Connection *conn = hr->conn;
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
    if (!http_policy_is_json(ct)) {
        char msg[192];
        snprintf(msg, sizeof msg, "Content-Type must be application/json, got '%.64s'",
                 ct ? ct : "(none)");
        return http_queue_err(hr, 415, NULL, "unsupported_media_type", msg);
    }
    framing f = { 0 };
    MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_of, &f);
    if (f.cl_differs || (f.cl && f.te)) {
        hr->close_after = 1;
        return http_queue_err(
            hr, 400, NULL, "invalid_header",
            f.cl_differs ? "two different Content-Length headers"
                         : "both Content-Length and Transfer-Encoding are given");
    }
    uint64_t clen = 0;
    int has_len = f.cl && util_parse_u64(f.cl, &clen) == 0;
    if (has_len && clen > s->cfg.max_body) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "request body of %" PRIu64 " bytes is over the limit of %zu bytes", clen,
                 s->cfg.max_body);
        return http_queue_err(hr, 413, NULL, "request_too_large", msg);
    }
    /* a known length is reserved (and allocated) whole, up front */
    if (has_len && clen > 0 && body_reserve(hr, (size_t)clen + 1) != 0) {
        hr->close_after = 1;
        return http_queue_err(
            hr, 503, NULL, "server_busy",
            "too many request bodies are being received; retry shortly");
    }
    return MHD_YES;
}

/* First call for a request: Host, route, method, auth, body headers. */
static enum MHD_Result begin_request(http_server *s, struct MHD_Connection *conn,
                                     const char *url, const char *method,
                                     const char *version, void **req_cls) {
    http_req *hr = util_calloc(1, sizeof *hr);
    if (!hr) return MHD_NO;
    hr->srv = s;
    hr->conn = conn;
    hr->refs = 1;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hr->hc = ci ? (http_conn *)ci->socket_context : NULL;
    hr->route = match_route(url);
    *req_cls = hr;
    if (pthread_mutex_init(&hr->lock, NULL) != 0) return MHD_NO;
    hr->lock_init = 1;
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int is_post = strcmp(method, "POST") == 0;
    int is_delete = strcmp(method, "DELETE") == 0;
    hr->method = is_get      ? HTTP_M_GET
                 : is_post   ? HTTP_M_POST
                 : is_delete ? HTTP_M_DELETE
                             : HTTP_M_OTHER;
    int post_route = route_is_post(hr->route);
    hr->has_body = post_route || (hr->route == R_FILES && is_post) ||
                   (hr->route == R_FT_JOBS && is_post);
    set_phase(hr, hr->has_body ? LISTENER_BODY : LISTENER_BUSY);
    hr->cors = http_policy_cors(
        &s->policy, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"));

    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host");
    if (!http_policy_host_ok(&s->policy, host, strcmp(version, "HTTP/1.0") == 0)) {
        char msg[192];
        if (!host)
            return http_queue_err(hr, 400, NULL, "invalid_host",
                                  "HTTP/1.1 requests need a Host header");
        snprintf(msg, sizeof msg,
                 "Host '%.64s' is not allowed (this server accepts its loopback names "
                 "and --allowed-host)",
                 host);
        return http_queue_err(hr, 403, NULL, "host_not_allowed", msg);
    }
    if (hr->route == R_OTHER)
        return http_queue_err(hr, 404, NULL, "not_found", "no such route");
    if (strcmp(method, "OPTIONS") == 0 && hr->cors) {
        hr->preflight = 1; /* answered once the request is complete */
        return MHD_YES;
    }
    int allowed = route_is_files(hr->route)
                      ? (is_get || (hr->route == R_FILES && is_post) ||
                         (hr->route == R_FILE && is_delete))
                  : hr->route == R_FT_CANCEL ? is_post
                  : hr->route == R_FT_JOBS   ? (is_get || is_post)
                                             : (post_route ? is_post : is_get);
    if (!allowed) {
        char msg[128];
        snprintf(msg, sizeof msg, "method %.16s is not allowed here (use %s)", method,
                 route_allow(hr->route));
        return http_queue_err(hr, 405, NULL, "method_not_allowed", msg);
    }
    if ((strncmp(url, "/v1/", 4) == 0 || post_route) &&
        !http_policy_auth_ok(&s->policy, MHD_lookup_connection_value(
                                             conn, MHD_HEADER_KIND, "Authorization")))
        return http_queue_err(hr, 401, NULL, "invalid_api_key",
                              "missing or invalid API key (send 'Authorization: Bearer "
                              "KEY')");
    /* GET routes answer on the next call, once the request is complete: a
     * response queued now would make libmicrohttpd close the connection (no
     * keep-alive). */
    if (route_is_files(hr->route)) return http_files_begin(hr);
    if (hr->route == R_FT_JOBS && is_post) return check_body_headers(hr);
    if (!post_route) return MHD_YES;
    return check_body_headers(hr);
}

/* Append an uploaded piece of the body (or drop it past a limit). */
static enum MHD_Result take_upload(http_req *hr, const char *data, size_t n) {
    size_t max_body = hr->srv->cfg.max_body;
    if (hr->too_big || hr->over_budget || hr->body_len + n > max_body) {
        /* libmicrohttpd accepts a response only before or after the upload:
         * discard the rest, answer at the end. */
        if (!hr->over_budget) hr->too_big = 1;
        http_body_release(hr);
        return MHD_YES;
    }
    if (hr->body_len + n + 1 > hr->body_cap) {
        size_t cap = hr->body_cap ? hr->body_cap * 2 : 1024;
        if (!hr->body_cap && hr->reserved) cap = hr->reserved; /* Content-Length */
        while (cap < hr->body_len + n + 1) cap *= 2;
        if (cap > max_body + 1) cap = max_body + 1;
        if (cap > hr->reserved && body_reserve(hr, cap - hr->reserved) != 0) {
            hr->over_budget = 1;
            http_body_release(hr);
            return MHD_YES;
        }
        char *p = realloc(hr->body, cap);
        if (!p) return MHD_NO;
        hr->body = p;
        hr->body_cap = cap;
    }
    memcpy(hr->body + hr->body_len, data, n);
    hr->body_len += n;
    hr->body[hr->body_len] = '\0';
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
    http_server *s = cls;
    http_req *hr = *req_cls;
    if (!hr) {
        enum MHD_Result r = begin_request(s, conn, url, method, version, req_cls);
        hr = *req_cls;
        /* an answer queued before the body: no 408 over it */
        if (hr && hr->responded && hr->has_body) set_phase(hr, LISTENER_BODY_ANSWERED);
        return r;
    }
    if (hr->responded) { /* an early answer was queued: discard the body */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (hr->upload) return http_files_take(hr, upload_data, n);
        return take_upload(hr, upload_data, n);
    }
    if (hr->preflight) return answer_preflight(hr);
    if (route_is_files(hr->route)) {
        set_phase(hr, LISTENER_BUSY);
        return http_files_answer(hr, url);
    }
    if (route_is_ft(hr->route)) {
        set_phase(hr, LISTENER_BUSY);
        return http_ft_answer(hr, url);
    }
    if (!route_is_post(hr->route)) return answer_get(hr, url);
    set_phase(hr, LISTENER_BUSY);
    if (hr->too_big || hr->over_budget) return http_body_refused(hr);
    return http_gen_step(hr);
}

enum MHD_Result http_body_refused(http_req *hr) {
    if (hr->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body is over the limit of %zu bytes",
                 hr->srv->cfg.max_body);
        return http_queue_err(hr, 413, NULL, "request_too_large", msg);
    }
    return http_queue_err(hr, 503, NULL, "server_busy",
                          "too many request bodies are being received; retry shortly");
}

/* ------------------------------------------------------------------------- */
/* Lifecycle                                                                  */
/* ------------------------------------------------------------------------- */
static char *dup_or_null(const char *s) {
    if (!s || !*s) return NULL;
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

#define DEFAULT(field, v)              \
    do {                               \
        if (!c->field) c->field = (v); \
    } while (0)

/* The server object with its defaults, metrics and watch (no daemon yet). */
static http_server *server_new(const http_server_config *cfg) {
    http_server *s = util_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    http_server_config *c = &s->cfg;
    DEFAULT(max_body, HTTP_DEFAULT_MAX_BODY);
    DEFAULT(max_body_memory, HTTP_DEFAULT_MAX_BODY_MEMORY);
    DEFAULT(http_threads, 1);
    DEFAULT(workers, HTTP_DEFAULT_WORKERS);
    DEFAULT(max_seqs_per_request, HTTP_DEFAULT_MAX_SEQS_PER_REQUEST);
    DEFAULT(max_connections, HTTP_DEFAULT_MAX_CONNECTIONS);
    DEFAULT(max_connections_per_ip, HTTP_DEFAULT_MAX_CONNECTIONS_IP);
    DEFAULT(header_timeout_s, HTTP_DEFAULT_HEADER_TIMEOUT_S);
    DEFAULT(body_timeout_s, HTTP_DEFAULT_BODY_TIMEOUT_S);
    DEFAULT(idle_timeout_s, HTTP_DEFAULT_IDLE_TIMEOUT_S);
    s->model_name = dup_or_null(cfg->model_name);
    s->created = (long)time(NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
    s->id_salt = rng_splitmix64(&z);
    pthread_mutex_init(&s->sched_mu, NULL);
    s->front.watch = conn_watch_create();
    static const char *const req_labels[2] = { "endpoint", "status" };
    s->m_requests =
        metrics_counter(cfg->metrics, "orch_requests_total",
                        "HTTP requests by endpoint and status code.", 2, req_labels);
    s->m_disconnects = metrics_series_get(
        metrics_counter(cfg->metrics, "orch_client_disconnects_total",
                        "Requests cancelled because the client closed its connection.", 0,
                        NULL),
        NULL);
    return s;
}

/* libmicrohttpd without a listening socket (the listener feeds it). */
static int start_daemon(http_server *s) {
    const http_server_config *c = &s->cfg;
    unsigned inactivity =
        http_front_inactivity(c->idle_timeout_s, c->header_timeout_s, c->body_timeout_s);
    s->front.d = MHD_start_daemon(
        HTTP_FRONT_MHD_FLAGS, 0, NULL, NULL, on_request, s, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, http_front_on_connection,
        &s->front, MHD_OPTION_CONNECTION_TIMEOUT, inactivity,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(c->max_connections + 64),
        MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)(c->http_threads > 1 ? c->http_threads : 0), MHD_OPTION_END);
    return s->front.d ? 0 : -1;
}

int http_server_start(const http_server_config *cfg, http_server **out, char *err,
                      size_t err_cap) {
    if (!cfg || !out || !cfg->metrics || !cfg->model_name || !*cfg->model_name) {
        util_set_err(err, err_cap,
                     "server: missing configuration (metrics registry, model name)");
        return -1;
    }
    listener_config lc = { .admit = http_front_admit };
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (http_front_addr(host, cfg->port, &lc.addr, err, err_cap) != 0) return -1;
    http_server *s = server_new(cfg);
    if (!s) {
        util_set_err(err, err_cap, "server: out of memory");
        return -1;
    }
    http_policy_config pc = { .bind_host = host,
                              .allowed_hosts = cfg->allowed_hosts,
                              .n_allowed_hosts = cfg->n_allowed_hosts,
                              .cors_origins = cfg->cors_origins,
                              .n_cors_origins = cfg->n_cors_origins,
                              .api_key = cfg->api_key };
    if (http_policy_init(&s->policy, &pc, err, err_cap) != 0) {
        http_server_stop(s);
        return -1;
    }
    s->pool = work_pool_create(s->cfg.workers);
    if (!s->model_name || !s->front.watch || !s->m_requests || !s->pool ||
        start_daemon(s)) {
        util_set_err(err, err_cap, "server: out of resources (memory, threads)");
        http_server_stop(s);
        return -1;
    }
    lc.max_conns = s->cfg.max_connections;
    lc.max_per_ip = s->cfg.max_connections_per_ip;
    lc.header_timeout = s->cfg.header_timeout_s;
    lc.body_timeout = s->cfg.body_timeout_s;
    lc.idle_timeout = s->cfg.idle_timeout_s;
    lc.admit_arg = &s->front;
    lc.metrics = cfg->metrics;
    if (listener_start(&lc, &s->front.lst, err, err_cap) != 0) {
        http_server_stop(s);
        return -1;
    }
    s->port = listener_port(s->front.lst);
    *out = s;
    return 0;
}

uint16_t http_server_port(const http_server *s) { return s ? s->port : 0; }

void http_server_set_ready(http_server *s, scheduler *sched, const tokenizer *tok,
                           uint32_t vocab_size, uint32_t context, const char *arch) {
    uint32_t mtb = request_max_token_bytes(tok);
    grammar_cache *gc = grammar_cache_create(tok, vocab_size, 64); /* NULL: refused */
    /* under sched_mu for /v1/models (which reads context in any state);
     * generation requests read these after seeing ST_READY */
    pthread_mutex_lock(&s->sched_mu);
    s->tok = tok;
    s->vocab = vocab_size;
    s->context = context;
    s->arch = arch;
    s->max_token_bytes = mtb;
    if (!s->grammars)
        s->grammars = gc;
    else
        grammar_cache_free(gc);
    s->sched = sched;
    pthread_mutex_unlock(&s->sched_mu);
    atomic_store(&s->state, ST_READY);
}

void http_server_set_chat_template(http_server *s, const chat_template *t,
                                   const char *error) {
    s->chat_template = t;
    s->chat_error = error;
}

void http_server_set_coserve(http_server *s, coserve *c) {
    atomic_store(&s->coserve_p, c);
}

void http_server_set_finetune(http_server *s, ft_jobs *jobs, struct ft_runner *runner,
                              const char *disabled) {
    atomic_store(&s->ft_disabled_p, disabled);
    atomic_store(&s->runner_p, runner);
    atomic_store(&s->jobs_p, jobs);
}

void http_server_drain_begin(http_server *s) {
    if (!s) return;
    atomic_store(&s->state, ST_DRAINING);
    listener_stop_accepting(s->front.lst);
}

void http_server_detach_scheduler(http_server *s) {
    if (!s) return;
    atomic_store(&s->state, ST_DRAINING);
    pthread_mutex_lock(&s->sched_mu);
    s->sched = NULL;
    pthread_mutex_unlock(&s->sched_mu);
}

uint32_t http_server_inflight(const http_server *s) {
    return s ? atomic_load(&((http_server *)s)->inflight) : 0;
}

void http_server_stop(http_server *s) {
    if (!s) return;
    /* no new connections; pending jobs finish (and resume their
     * connections) before the daemon stops; the listener goes last, the
     * daemon's close notifications still report to it */
    listener_stop_accepting(s->front.lst);
    work_pool_destroy(s->pool);
    if (s->front.d) MHD_stop_daemon(s->front.d);
    listener_stop(s->front.lst);
    conn_watch_free(s->front.watch);
    http_policy_free(&s->policy);
    pthread_mutex_destroy(&s->sched_mu);
    free(s->model_name);
    grammar_cache_free(s->grammars);
    free(s);
}
