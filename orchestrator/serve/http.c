/*
 * http.c - the HTTP front end over libmicrohttpd: routing, auth, request
 * bodies, hand-off to the scheduler, suspend/resume, streaming, lifecycle.
 * Parsing is request.c's, JSON rendering render.c's. See http.h.
 */
#include "orchestrator/serve/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/core/rng.h"
#include "orchestrator/core/strbuf.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/conn_watch.h"
#include "orchestrator/serve/render.h"
#include "orchestrator/serve/request.h"

/* ------------------------------------------------------------------------- */
/* Types                                                                      */
/* ------------------------------------------------------------------------- */
enum route {
    R_OTHER = 0,
    R_HEALTH,
    R_MODELS,
    R_MODEL,
    R_COMPLETIONS,
    R_CHAT,
    R_METRICS,
    R_COUNT
};
static const char *const route_label[R_COUNT] = {
    "other",           "/health",
    "/v1/models",      "/v1/models/{model}",
    "/v1/completions", "/v1/chat/completions",
    "/metrics"
};

enum { ST_LOADING = 0, ST_READY = 1, ST_DRAINING = 2 };

struct http_server {
    http_server_config cfg;
    char *model_name;
    char *api_key;
    struct MHD_Daemon *d;
    uint16_t port;
    atomic_int state;
    pthread_mutex_t sched_mu; /* guards sched against http_server_detach_scheduler */
    scheduler *sched;
    const tokenizer *tok;
    uint32_t vocab, context;
    atomic_uint inflight;
    atomic_ullong next_id;
    uint64_t id_salt;
    long created;
    conn_watch *watch; /* client disconnects */

    metrics_family *m_requests;
    metrics_series *m_disconnects;
};

typedef struct http_req {
    http_server *srv;
    struct MHD_Connection *conn;
    conn_watch_conn *cc;
    int route;
    char *body;
    size_t body_len, body_cap;
    int too_big; /* the body went over the limit: 413 after the upload */
    int counted; /* in http_server_inflight (accepted by the scheduler) */
    int responded;

    /* generation request */
    pthread_mutex_t lock; /* guards what follows and the sequences' outputs */
    int lock_init;
    int refs; /* MHD side + stream response + live sequences */
    int suspended, resume_requested;
    int submitted;
    uint32_t n_seqs, n_done;
    sched_seq *seqs;
    gen_request req;
    render_stream rs;
    char id[48];
    long created;
    /* SSE output buffer */
    char *obuf;
    size_t olen, ooff, ocap;
} http_req;

/* rng_splitmix64 of a value (request ids, default seeds, the id salt). */
static uint64_t splitmix_of(uint64_t z) { return rng_splitmix64(&z); }

/* ------------------------------------------------------------------------- */
/* Responses                                                                  */
/* ------------------------------------------------------------------------- */
static void count_request(http_server *s, int route, unsigned status) {
    char st[8];
    snprintf(st, sizeof st, "%u", status);
    const char *labels[2] = { route_label[route], st };
    metrics_counter_add(metrics_series_get(s->m_requests, labels), 1);
}

/* Queue `body` (malloc'd, taken over) with status. */
static enum MHD_Result queue_body(http_req *hr, unsigned status, char *body, size_t len,
                                  const char *ctype) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 405) {
        const char *allow =
            (hr->route == R_COMPLETIONS || hr->route == R_CHAT) ? "POST" : "GET, HEAD";
        MHD_add_response_header(r, "Allow", allow);
    }
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(hr->conn, status, r);
    MHD_destroy_response(r);
    hr->responded = 1;
    count_request(hr->srv, hr->route, status);
    return ret;
}

static enum MHD_Result queue_json(http_req *hr, unsigned status, strbuf *b) {
    if (b->oom || !b->p) {
        free(b->p);
        return MHD_NO;
    }
    return queue_body(hr, status, b->p, b->len, "application/json");
}

static enum MHD_Result queue_error(http_req *hr, const api_error *e) {
    strbuf b = { 0 };
    api_error_json(&b, e);
    return queue_json(hr, e->status, &b);
}

static enum MHD_Result queue_err(http_req *hr, unsigned status, const char *param,
                                 const char *code, const char *msg) {
    api_error e;
    api_error_set(&e, status, param, code, "%s", msg);
    return queue_error(hr, &e);
}

/* ------------------------------------------------------------------------- */
/* Request objects                                                            */
/* ------------------------------------------------------------------------- */
static void hr_free(http_req *hr) {
    for (uint32_t i = 0; i < hr->n_seqs; i++) sched_seq_free_outputs(&hr->seqs[i]);
    free(hr->seqs);
    render_stream_free(&hr->rs);
    gen_request_free(&hr->req);
    free(hr->body);
    free(hr->obuf);
    if (hr->lock_init) pthread_mutex_destroy(&hr->lock);
    if (hr->counted) atomic_fetch_sub(&hr->srv->inflight, 1);
    free(hr);
}

/* Drop one reference; frees at zero. */
static void hr_unref(http_req *hr) {
    pthread_mutex_lock(&hr->lock);
    int left = --hr->refs;
    pthread_mutex_unlock(&hr->lock);
    if (left == 0) hr_free(hr);
}

/* Scheduler notify: runs on the scheduler thread. */
static void on_seq_notify(sched_seq *q, int finished) {
    http_req *hr = q->user;
    int resume = 0;
    pthread_mutex_lock(&hr->lock);
    if (finished) {
        hr->n_done++;
        hr->refs--;
    }
    if (hr->suspended && !hr->resume_requested &&
        (hr->req.stream || hr->n_done == hr->n_seqs)) {
        hr->resume_requested = 1;
        resume = 1;
    }
    int left = hr->refs;
    pthread_mutex_unlock(&hr->lock);
    /* A suspended connection stays alive (and holds its reference) until it
     * is resumed, so hr and its connection are valid here. */
    if (resume) MHD_resume_connection(hr->conn);
    if (left == 0) hr_free(hr);
}

static void wake_scheduler(http_server *s) {
    pthread_mutex_lock(&s->sched_mu);
    if (s->sched) scheduler_wake(s->sched);
    pthread_mutex_unlock(&s->sched_mu);
}

static void cancel_all_seqs_locked(http_req *hr) {
    for (uint32_t i = 0; i < hr->n_seqs; i++) atomic_store(&hr->seqs[i].cancel, 1);
}

static gen_response response_of(const http_req *hr) {
    gen_response r = { .req = &hr->req,
                       .seqs = hr->seqs,
                       .tok = hr->srv->tok,
                       .model = hr->srv->model_name,
                       .id = hr->id,
                       .created = hr->created };
    return r;
}

/* ------------------------------------------------------------------------- */
/* Connections and disconnects                                                */
/* ------------------------------------------------------------------------- */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    http_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? conn_watch_add(s->watch, ci->connect_fd) : NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_watch_remove(s->watch, *socket_context);
        *socket_context = NULL;
    }
}

/* conn_watch callback (watch lock held): the client of req went away. */
static void on_client_gone(void *req, void *arg) {
    http_req *hr = req;
    http_server *s = arg;
    pthread_mutex_lock(&hr->lock);
    if (hr->n_done < hr->n_seqs) {
        cancel_all_seqs_locked(hr);
        metrics_counter_add(s->m_disconnects, 1);
    }
    pthread_mutex_unlock(&hr->lock);
}

void http_server_poll_disconnects(void *arg) {
    http_server *s = arg;
    conn_watch_poll(s->watch, on_client_gone, s);
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
    conn_watch_clear_request(s->watch, hr->cc, hr);
    int wake = 0;
    pthread_mutex_lock(&hr->lock);
    if (hr->submitted && hr->n_done < hr->n_seqs) {
        cancel_all_seqs_locked(hr);
        wake = 1;
    }
    int left = --hr->refs;
    pthread_mutex_unlock(&hr->lock);
    if (wake) wake_scheduler(s);
    if (left == 0) hr_free(hr);
}

/* ------------------------------------------------------------------------- */
/* Streaming                                                                  */
/* ------------------------------------------------------------------------- */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    http_req *hr = cls;
    int wake = 0;
    pthread_mutex_lock(&hr->lock);
    hr->suspended = 0;
    hr->resume_requested = 0;
    if (hr->ooff == hr->olen) {
        strbuf b = { hr->obuf, 0, hr->ocap, 0 };
        gen_response r = response_of(hr);
        if (render_stream_events(&b, &r, &hr->rs)) { /* a sequence failed */
            cancel_all_seqs_locked(hr);
            wake = 1;
        }
        hr->obuf = b.p;
        hr->ocap = b.cap;
        if (b.oom) {
            pthread_mutex_unlock(&hr->lock);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        hr->olen = b.len;
        hr->ooff = 0;
    }
    ssize_t ret;
    if (hr->ooff < hr->olen) {
        size_t n = hr->olen - hr->ooff;
        if (n > max) n = max;
        memcpy(buf, hr->obuf + hr->ooff, n);
        hr->ooff += n;
        ret = (ssize_t)n;
    } else if (hr->rs.done) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        hr->suspended = 1;
        MHD_suspend_connection(hr->conn);
        ret = 0;
    }
    pthread_mutex_unlock(&hr->lock);
    if (wake) wake_scheduler(hr->srv);
    return ret;
}

static void stream_free(void *cls) { hr_unref(cls); }

/* ------------------------------------------------------------------------- */
/* Generation requests                                                        */
/* ------------------------------------------------------------------------- */
/* Parse the body and build the sequences. */
static int setup_generation(http_req *hr, api_error *e) {
    http_server *s = hr->srv;
    request_limits lim = { .tok = s->tok,
                           .model_name = s->model_name,
                           .vocab = s->vocab,
                           .context = s->context,
                           .max_seqs = s->cfg.max_seqs_per_request };
    if (gen_request_parse(&lim, hr->route == R_CHAT, hr->body, hr->body_len, &hr->req,
                          e) != 0)
        return -1;
    uint32_t n = gen_request_n_seqs(&hr->req);
    hr->seqs = util_calloc(n, sizeof *hr->seqs);
    if (!hr->seqs || render_stream_init(&hr->rs, n) != 0)
        return api_error_set(e, 500, NULL, NULL, "out of memory");
    hr->n_seqs = n;
    uint64_t base_seed = hr->req.has_seed
                             ? hr->req.seed
                             : splitmix_of(s->id_salt ^ atomic_fetch_add(&s->next_id, 1));
    for (uint32_t i = 0; i < n; i++) {
        sched_seq *q = &hr->seqs[i];
        gen_request_seq(&hr->req, i, base_seed, q);
        q->lock = &hr->lock;
        q->notify = on_seq_notify;
        q->user = hr;
        atomic_init(&q->cancel, 0);
    }
    return 0;
}

/* Hand the sequences to the scheduler; on refusal answer with the error. */
static enum MHD_Result submit(http_req *hr) {
    http_server *s = hr->srv;
    sched_seq **ptrs = malloc(hr->n_seqs * sizeof *ptrs);
    if (!ptrs) return queue_err(hr, 500, NULL, NULL, "out of memory");
    for (uint32_t i = 0; i < hr->n_seqs; i++) ptrs[i] = &hr->seqs[i];
    conn_watch_set_request(s->watch, hr->cc, hr);
    pthread_mutex_lock(&hr->lock);
    hr->refs += (int)hr->n_seqs;
    hr->submitted = 1;
    pthread_mutex_unlock(&hr->lock);
    char err[256];
    pthread_mutex_lock(&s->sched_mu);
    int rc = SCHED_STOPPED;
    snprintf(err, sizeof err, "the server is shutting down");
    if (s->sched) rc = scheduler_submit(s->sched, ptrs, hr->n_seqs, err, sizeof err);
    pthread_mutex_unlock(&s->sched_mu);
    free(ptrs);
    if (rc == SCHED_OK) {
        hr->counted = 1;
        atomic_fetch_add(&s->inflight, 1);
        return MHD_YES;
    }
    conn_watch_clear_request(s->watch, hr->cc, hr);
    pthread_mutex_lock(&hr->lock);
    hr->refs -= (int)hr->n_seqs;
    hr->submitted = 0;
    pthread_mutex_unlock(&hr->lock);
    if (rc == SCHED_QUEUE_FULL) return queue_err(hr, 429, NULL, "queue_full", err);
    if (rc == SCHED_STOPPED) return queue_err(hr, 503, NULL, "server_draining", err);
    return queue_err(hr, 400, NULL, "invalid_value", err);
}

/* Streaming: answer 200 now with a body read from the scheduler's output. */
static enum MHD_Result start_stream(http_req *hr) {
    struct MHD_Response *r = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, hr, stream_free);
    if (!r) return MHD_NO; /* the completed callback cancels */
    pthread_mutex_lock(&hr->lock);
    hr->refs++; /* held by the response until stream_free */
    pthread_mutex_unlock(&hr->lock);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(hr->conn, 200, r);
    MHD_destroy_response(r);
    hr->responded = 1;
    count_request(hr->srv, hr->route, 200);
    return ret;
}

/* Everything the body allows: submit or answer with an error. */
static enum MHD_Result start_generation(http_req *hr) {
    http_server *s = hr->srv;
    int state = atomic_load(&s->state);
    if (state != ST_READY)
        return queue_err(hr, 503, NULL,
                         state == ST_LOADING ? "model_loading" : "server_draining",
                         state == ST_LOADING ? "the model is still loading; retry shortly"
                                             : "the server is shutting down");
    api_error e;
    if (setup_generation(hr, &e) != 0) return queue_error(hr, &e);
    snprintf(hr->id, sizeof hr->id, "%s-%016" PRIx64, hr->req.chat ? "chatcmpl" : "cmpl",
             splitmix_of(s->id_salt + atomic_fetch_add(&s->next_id, 1)));
    hr->created = (long)time(NULL);
    enum MHD_Result r = submit(hr);
    if (hr->responded || r != MHD_YES) return r;
    if (hr->req.stream) return start_stream(hr);
    return MHD_YES; /* the final handler call below suspends or answers */
}

/* Non-streaming: suspend until every sequence is done, then answer. */
static enum MHD_Result finish_or_wait(http_req *hr) {
    pthread_mutex_lock(&hr->lock);
    hr->suspended = 0;
    hr->resume_requested = 0;
    if (hr->n_done < hr->n_seqs) {
        hr->suspended = 1;
        MHD_suspend_connection(hr->conn);
        pthread_mutex_unlock(&hr->lock);
        return MHD_YES;
    }
    pthread_mutex_unlock(&hr->lock);
    /* all sequences are finished: the scheduler no longer writes them */
    for (uint32_t i = 0; i < hr->n_seqs; i++) {
        const sched_seq *q = &hr->seqs[i];
        if (q->finish == SCHED_FINISH_CANCELLED && q->http_status == 499) {
            count_request(hr->srv, hr->route, 499);
            hr->responded = 1;
            return MHD_NO; /* the client is gone: close */
        }
        if (q->finish == SCHED_FINISH_ERROR || q->finish == SCHED_FINISH_CANCELLED) {
            unsigned st = q->http_status ? (unsigned)q->http_status : 500;
            return queue_err(hr, st, NULL, st == 503 ? "server_draining" : NULL,
                             q->error[0] ? q->error : "request failed");
        }
    }
    strbuf b = { 0 };
    gen_response r = response_of(hr);
    render_final(&b, &r);
    return queue_json(hr, 200, &b);
}

/* ------------------------------------------------------------------------- */
/* Routing                                                                    */
/* ------------------------------------------------------------------------- */
static int match_route(const char *url) {
    if (strcmp(url, "/health") == 0) return R_HEALTH;
    if (strcmp(url, "/v1/models") == 0) return R_MODELS;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) return R_MODEL;
    if (strcmp(url, "/v1/completions") == 0) return R_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0) return R_CHAT;
    if (strcmp(url, "/metrics") == 0) return R_METRICS;
    return R_OTHER;
}

/* The Bearer token matches the API key (constant-time compare). */
static int auth_ok(http_server *s, struct MHD_Connection *conn) {
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    size_t a = strlen(h), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(h[i] ^ s->api_key[i]);
    return diff == 0;
}

static enum MHD_Result answer_get(http_req *hr, const char *url) {
    http_server *s = hr->srv;
    strbuf b = { 0 };
    switch (hr->route) {
    case R_HEALTH: {
        int st = atomic_load(&s->state);
        strbuf_puts(&b, st == ST_READY     ? "{\"status\":\"ok\"}"
                        : st == ST_LOADING ? "{\"status\":\"loading\"}"
                                           : "{\"status\":\"draining\"}");
        return queue_json(hr, st == ST_READY ? 200 : 503, &b);
    }
    case R_MODELS:
        strbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
        render_model_object(&b, s->model_name, s->created, s->context);
        strbuf_puts(&b, "]}");
        return queue_json(hr, 200, &b);
    case R_MODEL:
        if (strcmp(url + 11, s->model_name) != 0) {
            api_error e;
            api_error_set(&e, 404, "model", "model_not_found",
                          "the model '%.128s' does not exist", url + 11);
            return queue_error(hr, &e);
        }
        render_model_object(&b, s->model_name, s->created, s->context);
        return queue_json(hr, 200, &b);
    case R_METRICS: {
        char *text = NULL;
        size_t len = 0;
        if (metrics_render(s->cfg.metrics, &text, &len) != 0) return MHD_NO;
        return queue_body(hr, 200, text, len, METRICS_CONTENT_TYPE);
    }
    default: return queue_err(hr, 404, NULL, "not_found", "not found");
    }
}

/* First call for a request: route, method, auth, Content-Length. */
static enum MHD_Result begin_request(http_server *s, struct MHD_Connection *conn,
                                     const char *url, const char *method,
                                     void **req_cls) {
    http_req *hr = util_calloc(1, sizeof *hr);
    if (!hr) return MHD_NO;
    hr->srv = s;
    hr->conn = conn;
    hr->refs = 1;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hr->cc = ci ? (conn_watch_conn *)ci->socket_context : NULL;
    hr->route = match_route(url);
    *req_cls = hr;
    if (pthread_mutex_init(&hr->lock, NULL) != 0) return MHD_NO;
    hr->lock_init = 1;

    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int is_post = strcmp(method, "POST") == 0;
    int post_route = hr->route == R_COMPLETIONS || hr->route == R_CHAT;
    if (hr->route == R_OTHER)
        return queue_err(hr, 404, NULL, "not_found", "no such route");
    if (post_route ? !is_post : !is_get) {
        char msg[128];
        snprintf(msg, sizeof msg, "method %.16s is not allowed here (use %s)", method,
                 post_route ? "POST" : "GET");
        return queue_err(hr, 405, NULL, "method_not_allowed", msg);
    }
    if (strncmp(url, "/v1/", 4) == 0 && !auth_ok(s, conn))
        return queue_err(hr, 401, NULL, "invalid_api_key",
                         "missing or invalid API key (send 'Authorization: Bearer KEY')");
    /* GET routes answer on the next call, once the request is complete: a
     * response queued now would make libmicrohttpd close the connection (no
     * keep-alive). */
    if (!post_route) return MHD_YES;
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    uint64_t clen = 0;
    if (cl && util_parse_u64(cl, &clen) == 0 && clen > s->cfg.max_body) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "request body of %" PRIu64 " bytes is over the limit of %zu bytes", clen,
                 s->cfg.max_body);
        return queue_err(hr, 413, NULL, "request_too_large", msg);
    }
    return MHD_YES;
}

/* Append an uploaded piece of the body (or drop it past the limit). */
static enum MHD_Result take_upload(http_req *hr, const char *data, size_t n) {
    size_t max_body = hr->srv->cfg.max_body;
    if (hr->too_big || hr->body_len + n > max_body) {
        /* libmicrohttpd accepts a response only before or after the upload:
         * discard the rest, answer 413 at the end. */
        hr->too_big = 1;
        free(hr->body);
        hr->body = NULL;
        hr->body_len = hr->body_cap = 0;
        return MHD_YES;
    }
    if (hr->body_len + n + 1 > hr->body_cap) {
        size_t cap = hr->body_cap ? hr->body_cap : 1024;
        while (cap < hr->body_len + n + 1) cap *= 2;
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
    (void)version;
    http_server *s = cls;
    http_req *hr = *req_cls;
    if (!hr) return begin_request(s, conn, url, method, req_cls);
    if (hr->responded) { /* an early answer was queued: discard the body */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return take_upload(hr, upload_data, n);
    }
    if (hr->route != R_COMPLETIONS && hr->route != R_CHAT) return answer_get(hr, url);
    if (hr->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body is over the limit of %zu bytes",
                 s->cfg.max_body);
        return queue_err(hr, 413, NULL, "request_too_large", msg);
    }
    if (!hr->submitted) {
        enum MHD_Result r = start_generation(hr);
        if (hr->responded || r != MHD_YES) return r;
    }
    return finish_or_wait(hr);
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

/* The server object with its defaults, metrics and watch (no daemon yet). */
static http_server *server_new(const http_server_config *cfg) {
    http_server *s = util_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    if (!s->cfg.max_body) s->cfg.max_body = HTTP_DEFAULT_MAX_BODY;
    if (!s->cfg.http_threads) s->cfg.http_threads = 1;
    if (!s->cfg.max_seqs_per_request)
        s->cfg.max_seqs_per_request = HTTP_DEFAULT_MAX_SEQS_PER_REQUEST;
    s->model_name = dup_or_null(cfg->model_name);
    s->api_key = dup_or_null(cfg->api_key);
    s->created = (long)time(NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_salt = splitmix_of((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                             (uint64_t)getpid());
    pthread_mutex_init(&s->sched_mu, NULL);
    s->watch = conn_watch_create();
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

int http_server_start(const http_server_config *cfg, http_server **out, char *err,
                      size_t err_cap) {
    if (!cfg || !out || !cfg->metrics || !cfg->model_name || !*cfg->model_name) {
        util_set_err(err, err_cap,
                     "server: missing configuration (metrics registry, model name)");
        return -1;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(cfg->port);
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        util_set_err(err, err_cap, "--host '%s' is not an IPv4 address", host);
        return -1;
    }
    http_server *s = server_new(cfg);
    if (!s) {
        util_set_err(err, err_cap, "server: out of memory");
        return -1;
    }
    if (!s->model_name || !s->watch || !s->m_requests) {
        util_set_err(err, err_cap, "server: out of resources");
        http_server_stop(s);
        return -1;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC;
    s->d = MHD_start_daemon(
        flags, cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)60, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)(s->cfg.http_threads > 1 ? s->cfg.http_threads : 0), MHD_OPTION_END);
    if (!s->d) {
        util_set_err(err, err_cap, "cannot listen on %s:%u: %s", host,
                     (unsigned)cfg->port,
                     errno ? strerror(errno) : "address in use or not allowed");
        http_server_stop(s);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return 0;
}

uint16_t http_server_port(const http_server *s) { return s ? s->port : 0; }

void http_server_set_ready(http_server *s, scheduler *sched, const tokenizer *tok,
                           uint32_t vocab_size, uint32_t context) {
    pthread_mutex_lock(&s->sched_mu);
    s->sched = sched;
    pthread_mutex_unlock(&s->sched_mu);
    s->tok = tok;
    s->vocab = vocab_size;
    s->context = context;
    atomic_store(&s->state, ST_READY);
}

void http_server_drain_begin(http_server *s) {
    if (!s) return;
    atomic_store(&s->state, ST_DRAINING);
    if (s->d) {
        MHD_socket fd = MHD_quiesce_daemon(s->d);
        if (fd != MHD_INVALID_SOCKET) close(fd);
    }
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
    if (s->d) MHD_stop_daemon(s->d);
    conn_watch_free(s->watch);
    pthread_mutex_destroy(&s->sched_mu);
    free(s->model_name);
    free(s->api_key);
    free(s);
}
