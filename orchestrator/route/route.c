/*
 * route.c - the HTTP front of `orch route` (see route.h): header checks,
 * bodies, the router's own routes, and the life of a forwarded request
 * (pick, forward, retry, pass the answer on).
 */
#include "orchestrator/route/route.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "orchestrator/core/json_writer.h"
#include "orchestrator/core/strbuf.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/conn_watch.h"
#include "orchestrator/serve/http_front.h"
#include "orchestrator/serve/http_policy.h"
#include "orchestrator/serve/listener.h"

enum {
    R_HEALTH = 0,
    R_MODELS,
    R_MODEL,
    R_METRICS,
    R_WORKERS,
    R_WORKER,
    R_COMPLETIONS,
    R_CHAT,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_OTHER,
    R_COUNT
};
static const char *const route_label[R_COUNT] = { "/health",
                                                  "/v1/models",
                                                  "/v1/models/{id}",
                                                  "/metrics",
                                                  "/workers",
                                                  "/workers/{url}",
                                                  "/v1/completions",
                                                  "/v1/chat/completions",
                                                  "/tokenize",
                                                  "/detokenize",
                                                  "other" };
static int is_forwarded(int r) { return r >= R_COMPLETIONS && r <= R_DETOKENIZE; }

#define MAX_TRIED 16
/* A stream's bytes the client has not taken yet: past BP_HIGH the worker's
 * transfer is paused, below BP_LOW it continues. */
#define BP_HIGH ((size_t)1 << 20)
#define BP_LOW  ((size_t)256 << 10)

struct route_server {
    route_server_config cfg;
    http_policy policy;
    http_front front; /* the daemon, the listener, clients gone while forwarded */
    route_proxy *proxy;
    uint16_t port;
    atomic_uint inflight; /* requests begun and not yet freed */
    atomic_int draining;
    metrics_family *m_http;
    metrics_series *m_retries, *m_stream_errors, *m_pauses;
};

typedef http_front_conn rconn;

/* Forwarding states. */
enum { F_NONE = 0, F_WAIT, F_DONE };

typedef struct rreq {
    route_server *srv;
    struct MHD_Connection *conn;
    rconn *rc;
    pthread_mutex_t mu;
    int refs;
    int route, preflight, responded, close_after, too_big;
    int forwarding; /* handed to a worker (HTTP thread only) */
    const char *cors;
    char *body;
    size_t len, cap;
    char wurl[ROUTE_URL_MAX];
    /* routing */
    char *model, *text;
    size_t text_len;
    route_worker *tried[MAX_TRIED];
    size_t n_tried;
    route_worker *cur;
    route_xfer x;
    struct curl_slist *hdrs;
    char url[ROUTE_URL_MAX + 32];
    /* the answer (under mu) */
    int fstate;    /* F_* */
    int head;      /* the current worker's head is in */
    int retry_503; /* that head was a 503: retried if another worker is left */
    int streaming; /* 200 text/event-stream: passed on as it comes */
    int failed;    /* the transfer ended without the whole answer */
    int client_gone;
    int xfer_active;
    int error_sent;
    int bp_paused; /* the transfer is paused for the client (back-pressure) */
    long status;
    char *pass_hdrs; /* "Name: value\n" lines */
    strbuf out;
    size_t ready, off; /* bytes that may be sent; bytes sent */
    size_t scan;       /* out is searched for blank lines up to here */
    char errmsg[256];
    int suspended, resume_requested;
} rreq;

/* ------------------------------------------------------------------------- */
static void count(route_server *s, int route, unsigned status) {
    char st[8];
    snprintf(st, sizeof st, "%u", status);
    const char *lv[2] = { route_label[route], st };
    metrics_counter_add(metrics_series_get(s->m_http, lv), 1);
}

static void req_free(rreq *r) {
    atomic_fetch_sub(&r->srv->inflight, 1);
    free(r->body);
    free(r->model);
    free(r->text);
    free(r->pass_hdrs);
    curl_slist_free_all(r->hdrs);
    strbuf_free(&r->out);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void req_unref(rreq *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0) req_free(r);
}

static void suspend_locked(rreq *r) {
    r->suspended = 1;
    r->resume_requested = 0;
    MHD_suspend_connection(r->conn);
}

/* Resume the connection if suspended (mu held). */
static int resume_locked(rreq *r) {
    if (r->suspended && !r->resume_requested) {
        r->resume_requested = 1;
        return 1;
    }
    return 0;
}

static void add_cors(const rreq *r, struct MHD_Response *resp) {
    if (!r->cors) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->cors);
    MHD_add_response_header(resp, "Vary", "Origin");
}

/* Queue status with body (malloc'd, taken). */
static enum MHD_Result queue_body(rreq *r, unsigned status, char *body, size_t len,
                                  const char *ctype, const char *headers) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    int have_ctype = 0;
    for (const char *h = headers; h && *h;) { /* the worker's headers */
        const char *nl = strchr(h, '\n');
        size_t n = nl ? (size_t)(nl - h) : strlen(h);
        const char *colon = memchr(h, ':', n);
        if (colon) {
            char name[64], value[512];
            size_t kn = (size_t)(colon - h), vn;
            const char *v = colon + 1;
            while (v < h + n && *v == ' ') v++;
            vn = (size_t)(h + n - v);
            if (kn < sizeof name && vn < sizeof value) {
                memcpy(name, h, kn);
                name[kn] = '\0';
                memcpy(value, v, vn);
                value[vn] = '\0';
                MHD_add_response_header(resp, name, value);
                if (strcasecmp(name, "Content-Type") == 0) have_ctype = 1;
            }
        }
        h = nl ? nl + 1 : h + n;
    }
    if (!have_ctype && ctype) MHD_add_response_header(resp, "Content-Type", ctype);
    if (!headers) {
        if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
        if (status == 429 || status == 503)
            MHD_add_response_header(resp, "Retry-After", "1");
    }
    if (r->close_after) MHD_add_response_header(resp, "Connection", "close");
    add_cors(r, resp);
    enum MHD_Result ret = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    r->responded = 1;
    count(r->srv, r->route, status);
    return ret;
}

static enum MHD_Result queue_json(rreq *r, unsigned status, strbuf *b) {
    if (b->oom || !b->p) {
        free(b->p);
        return MHD_NO;
    }
    return queue_body(r, status, b->p, b->len, "application/json", NULL);
}

static enum MHD_Result queue_err(rreq *r, unsigned status, const char *code,
                                 const char *msg) {
    api_error e;
    api_error_set(&e, status, NULL, code, "%s", msg);
    strbuf b = { 0 };
    api_error_json(&b, &e);
    return queue_json(r, status, &b);
}

/* ------------------------------------------------------------------------- */
/* Connections                                                                */
/* ------------------------------------------------------------------------- */
static void set_phase(rreq *r, int phase) {
    if (r->rc) listener_conn_phase(r->srv->front.lst, r->rc->fd, phase);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    (void)toe;
    route_server *s = cls;
    rreq *r = *req_cls;
    if (!r) return;
    *req_cls = NULL;
    set_phase(r, LISTENER_IDLE);
    conn_watch_clear_request(s->front.watch, r->rc ? r->rc->cc : NULL, r);
    pthread_mutex_lock(&r->mu);
    r->client_gone = 1;
    int cancel = r->xfer_active;
    pthread_mutex_unlock(&r->mu);
    if (cancel) route_proxy_cancel(s->proxy, &r->x);
    req_unref(r);
}

/* ------------------------------------------------------------------------- */
/* Forwarding                                                                 */
/* ------------------------------------------------------------------------- */
/* The text the radix trees see, and the model, from a JSON body. */
static void routing_info(rreq *r) {
    cJSON *root = cJSON_ParseWithLength(r->body ? r->body : "", r->len);
    strbuf t = { 0 };
    if (cJSON_IsObject(root)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
        if (cJSON_IsString(m)) r->model = strdup(m->valuestring);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (!p) p = cJSON_GetObjectItemCaseSensitive(root, "text");
        if (cJSON_IsArray(msgs)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, msgs) {
                const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
                const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
                if (cJSON_IsString(role)) strbuf_puts(&t, role->valuestring);
                strbuf_puts(&t, "\n");
                if (cJSON_IsString(content)) {
                    strbuf_puts(&t, content->valuestring);
                } else if (content) {
                    char *j = cJSON_PrintUnformatted(content);
                    if (j) strbuf_puts(&t, j);
                    free(j);
                }
                strbuf_puts(&t, "\n");
            }
        } else if (cJSON_IsString(p)) {
            strbuf_puts(&t, p->valuestring);
        } else if (p) {
            char *j = cJSON_PrintUnformatted(p);
            if (j) strbuf_puts(&t, j);
            free(j);
        }
    }
    cJSON_Delete(root);
    if (!t.p && r->len) strbuf_put(&t, r->body, r->len); /* not JSON: the bytes */
    if (t.oom) {
        strbuf_free(&t);
        t = (strbuf){ 0 };
    }
    r->text = t.p;
    r->text_len = t.len;
}

static void on_head(route_xfer *x, long status, const char *headers);
static int on_data(route_xfer *x, const char *p, size_t n);
static void on_done(route_xfer *x, int ok, const char *error);

/* Pick a worker not tried yet and submit (mu not held). 0, or -1: none
 * (-2: no worker serves the request's model). */
static int forward(rreq *r) {
    route_server *s = r->srv;
    if (r->n_tried >= MAX_TRIED || r->n_tried > s->cfg.max_retries) return -1;
    route_pick pick;
    int unknown = 0;
    route_worker *w = route_workers_pick(s->cfg.workers, r->model, r->text, r->text_len,
                                         r->tried, r->n_tried, &pick, &unknown);
    if (!w) return unknown ? -2 : -1;
    if (r->n_tried) metrics_counter_add(s->m_retries, 1);
    r->tried[r->n_tried++] = w;
    r->cur = w;
    snprintf(r->url, sizeof r->url, "%s%s", route_worker_url(w), route_label[r->route]);
    r->x.url = r->url;
    r->x.body = r->body ? r->body : "";
    r->x.body_len = r->len;
    r->x.headers = r->hdrs;
    r->x.timeout_s = s->cfg.request_timeout_s;
    r->x.on_head = on_head;
    r->x.on_data = on_data;
    r->x.on_done = on_done;
    pthread_mutex_lock(&r->mu);
    r->xfer_active = 1;
    r->head = r->retry_503 = r->streaming = 0;
    r->status = 0;
    r->out.len = 0;
    r->ready = r->off = r->scan = 0;
    r->refs++; /* the transfer's */
    pthread_mutex_unlock(&r->mu);
    if (route_proxy_submit(s->proxy, &r->x) != 0) {
        pthread_mutex_lock(&r->mu);
        r->xfer_active = 0;
        r->refs--;
        pthread_mutex_unlock(&r->mu);
        route_workers_done(s->cfg.workers, w, 0);
        r->cur = NULL;
        return -1;
    }
    return 0;
}

static rreq *of_xfer(route_xfer *x) { return (rreq *)((char *)x - offsetof(rreq, x)); }

static void on_head(route_xfer *x, long status, const char *headers) {
    rreq *r = of_xfer(x);
    pthread_mutex_lock(&r->mu);
    r->head = 1;
    r->status = status;
    free(r->pass_hdrs);
    r->pass_hdrs = strdup(headers);
    r->retry_503 = status == 503;
    int sse = 0;
    for (const char *h = headers; h && *h; h = strchr(h, '\n') ? strchr(h, '\n') + 1 : "")
        if (strncasecmp(h, "content-type:", 13) == 0) {
            const char *v = h + 13;
            while (*v == ' ') v++;
            sse = strncasecmp(v, "text/event-stream", 17) == 0;
        }
    r->streaming = status == 200 && sse;
    int wake = r->streaming && resume_locked(r);
    pthread_mutex_unlock(&r->mu);
    if (wake) MHD_resume_connection(r->conn);
}

static int on_data(route_xfer *x, const char *p, size_t n) {
    rreq *r = of_xfer(x);
    pthread_mutex_lock(&r->mu);
    if (r->client_gone) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    int wake = 0;
    if (r->streaming && r->ready - r->off > BP_HIGH) { /* the client is slow */
        r->bp_paused = 1;
        pthread_mutex_unlock(&r->mu);
        metrics_counter_add(r->srv->m_pauses, 1);
        return 1; /* the piece comes again after route_proxy_resume */
    }
    strbuf_put(&r->out, p, n);
    if (r->out.oom) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    if (r->streaming) { /* complete events only: up to the last blank line */
        size_t from = r->scan > r->ready ? r->scan : r->ready, end = r->ready;
        if (from) from--; /* a blank line may straddle two pieces */
        for (size_t i = from; i + 1 < r->out.len; i++)
            if (r->out.p[i] == '\n' && r->out.p[i + 1] == '\n') end = i + 2;
        r->scan = r->out.len;
        if (end > r->ready) {
            r->ready = end;
            wake = resume_locked(r);
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (wake) MHD_resume_connection(r->conn);
    return 0;
}

static void on_done(route_xfer *x, int ok, const char *error) {
    rreq *r = of_xfer(x);
    route_server *s = r->srv;
    pthread_mutex_lock(&r->mu);
    r->xfer_active = 0;
    int gone = r->client_gone;
    /* a worker that answered 503 (draining, loading) is skipped like a
     * failed one, but is not taken out: its health checks decide */
    int retry = !gone && !r->responded && (!ok || r->retry_503);
    if (!ok)
        snprintf(r->errmsg, sizeof r->errmsg, "worker %s: %s", route_worker_url(r->cur),
                 error);
    pthread_mutex_unlock(&r->mu);
    route_workers_done(s->cfg.workers, r->cur, !ok && !gone);
    r->cur = NULL;
    if (retry) {
        /* keep the 503 answer in case no other worker is left */
        strbuf keep = { 0 };
        long keep_status = 0;
        char *keep_hdrs = NULL;
        if (ok) {
            pthread_mutex_lock(&r->mu);
            keep = r->out;
            r->out = (strbuf){ 0 };
            keep_status = r->status;
            keep_hdrs = r->pass_hdrs;
            r->pass_hdrs = NULL;
            pthread_mutex_unlock(&r->mu);
        }
        if (forward(r) == 0) {
            strbuf_free(&keep);
            free(keep_hdrs);
            req_unref(r); /* this transfer's */
            return;
        }
        if (ok) {
            pthread_mutex_lock(&r->mu);
            strbuf_free(&r->out);
            r->out = keep;
            r->status = keep_status;
            free(r->pass_hdrs);
            r->pass_hdrs = keep_hdrs;
            r->head = 1;
            pthread_mutex_unlock(&r->mu);
        }
    }
    pthread_mutex_lock(&r->mu);
    r->fstate = F_DONE;
    r->failed = !ok;
    if (ok) r->ready = r->out.len; /* a last event without its blank line too */
    if (!ok && r->streaming && r->responded) metrics_counter_add(s->m_stream_errors, 1);
    int wake = resume_locked(r);
    pthread_mutex_unlock(&r->mu);
    if (wake) MHD_resume_connection(r->conn);
    req_unref(r); /* this transfer's */
}

/* conn_watch callback (watch lock held): the client of a forwarded request
 * closed its connection; its transfer is cancelled (the worker then sees the
 * disconnect and frees the sequence). */
static void on_client_gone(void *req, void *arg) {
    rreq *r = req;
    route_server *s = arg;
    pthread_mutex_lock(&r->mu);
    r->client_gone = 1;
    int cancel = r->xfer_active;
    pthread_mutex_unlock(&r->mu);
    if (cancel) route_proxy_cancel(s->proxy, &r->x);
}

/* route_proxy tick: disconnects. */
static void poll_disconnects(void *arg) {
    route_server *s = arg;
    conn_watch_poll(s->front.watch, on_client_gone, s);
}

/* The stream's reader (HTTP thread). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    rreq *r = cls;
    pthread_mutex_lock(&r->mu);
    r->suspended = 0;
    r->resume_requested = 0;
    if (r->off == r->ready && r->fstate == F_DONE && r->failed && !r->error_sent) {
        /* the incomplete event is dropped; a clean error event instead */
        api_error e;
        api_error_set(&e, 500, NULL, "worker_failed", "%s (the stream was cut)",
                      r->errmsg[0] ? r->errmsg : "the worker failed");
        r->out.len = r->ready;
        strbuf_puts(&r->out, "data: ");
        api_error_json(&r->out, &e);
        strbuf_puts(&r->out, "\n\ndata: [DONE]\n\n");
        r->ready = r->out.oom ? r->off : r->out.len;
        r->error_sent = 1;
    }
    ssize_t ret;
    int resume = 0;
    if (r->off < r->ready) {
        size_t n = r->ready - r->off;
        if (n > max) n = max;
        memcpy(buf, r->out.p + r->off, n);
        r->off += n;
        ret = (ssize_t)n;
        if (r->off == r->ready && r->off >= ((size_t)64 << 10)) { /* drop what was sent */
            memmove(r->out.p, r->out.p + r->off, r->out.len - r->off);
            r->out.len -= r->off;
            r->scan -= r->off;
            r->ready = r->off = 0;
        }
        if (r->bp_paused && r->ready - r->off < BP_LOW) {
            r->bp_paused = 0;
            resume = 1;
        }
    } else if (r->fstate == F_DONE) {
        ret = r->failed && !r->error_sent ? MHD_CONTENT_READER_END_WITH_ERROR
                                          : MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        suspend_locked(r);
        ret = 0;
    }
    pthread_mutex_unlock(&r->mu);
    if (resume) route_proxy_resume(r->srv->proxy, &r->x);
    return ret;
}

static void stream_free(void *cls) { req_unref(cls); }

/* Resumed (or first) step of a forwarded request (HTTP thread). */
static enum MHD_Result forward_step(rreq *r) {
    pthread_mutex_lock(&r->mu);
    r->suspended = 0;
    r->resume_requested = 0;
    if (r->streaming && r->head && !r->responded) {
        /* from here on the client has the answer: no retry (on_done) */
        r->responded = 1;
        r->refs++; /* the response's */
        char *hdrs = r->pass_hdrs ? strdup(r->pass_hdrs) : NULL;
        pthread_mutex_unlock(&r->mu);
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, stream_free);
        if (!resp) {
            free(hdrs);
            req_unref(r);
            return MHD_NO;
        }
        for (char *h = hdrs; h && *h;) {
            char *nl = strchr(h, '\n');
            if (nl) *nl = '\0';
            char *colon = strchr(h, ':');
            if (colon) {
                *colon = '\0';
                const char *v = colon + 1;
                while (*v == ' ') v++;
                MHD_add_response_header(resp, h, v);
            }
            h = nl ? nl + 1 : h + strlen(h);
        }
        free(hdrs);
        add_cors(r, resp);
        enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
        MHD_destroy_response(resp);
        count(r->srv, r->route, 200);
        return ret;
    }
    if (r->fstate != F_DONE) {
        suspend_locked(r);
        pthread_mutex_unlock(&r->mu);
        return MHD_YES;
    }
    /* done: the whole answer, or a failure with nothing sent yet */
    if (r->client_gone) { /* nobody to answer: close */
        pthread_mutex_unlock(&r->mu);
        count(r->srv, r->route, 499);
        return MHD_NO;
    }
    int have = r->head && !r->failed;
    long status = r->status;
    strbuf out = r->out;
    r->out = (strbuf){ 0 };
    char *hdrs = r->pass_hdrs;
    r->pass_hdrs = NULL;
    char msg[320];
    snprintf(msg, sizeof msg, "no worker could serve the request%s%s",
             r->errmsg[0] ? ": " : "", r->errmsg);
    pthread_mutex_unlock(&r->mu);
    if (!have) {
        strbuf_free(&out);
        free(hdrs);
        return queue_err(r, 503, "worker_unavailable", msg);
    }
    char *body = out.p ? out.p : strdup("");
    enum MHD_Result ret =
        queue_body(r, (unsigned)status, body, out.len, NULL, hdrs ? hdrs : "");
    free(hdrs);
    return ret;
}

/* Start forwarding a complete request (HTTP thread). */
static enum MHD_Result forward_begin(rreq *r) {
    route_server *s = r->srv;
    if (atomic_load(&s->draining))
        return queue_err(r, 503, "server_draining", "the router is shutting down");
    routing_info(r);
    r->hdrs = curl_slist_append(r->hdrs, "Content-Type: application/json");
    r->hdrs = curl_slist_append(r->hdrs, "Expect:");
    char auth[1024];
    const char *client =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization");
    if (s->cfg.worker_api_key && *s->cfg.worker_api_key)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", s->cfg.worker_api_key);
    else if (client)
        snprintf(auth, sizeof auth, "Authorization: %s", client);
    else
        auth[0] = '\0';
    if (auth[0]) r->hdrs = curl_slist_append(r->hdrs, auth);
    if (!r->hdrs) return MHD_NO;
    r->forwarding = 1;
    r->fstate = F_WAIT; /* read by this thread only until forward() submits */
    int rc = forward(r);
    if (rc == -2) {
        r->forwarding = 0;
        r->fstate = F_NONE;
        char msg[256];
        snprintf(msg, sizeof msg,
                 "the model '%.128s' is not served by any worker (see GET /v1/models)",
                 r->model);
        api_error e;
        api_error_set(&e, 404, "model", "model_not_found", "%s", msg);
        strbuf eb = { 0 };
        api_error_json(&eb, &e);
        return queue_json(r, 404, &eb);
    }
    if (rc != 0) {
        r->forwarding = 0;
        r->fstate = F_NONE;
        return queue_err(r, 503, "worker_unavailable",
                         route_workers_up(s->cfg.workers)
                             ? "no worker can take this request now"
                             : "no worker is up");
    }
    conn_watch_set_request(s->front.watch, r->rc ? r->rc->cc : NULL, r);
    /* suspends unless the answer is already in */
    return forward_step(r);
}

/* ------------------------------------------------------------------------- */
/* The router's own routes                                                    */
/* ------------------------------------------------------------------------- */
static void percent_decode(const char *in, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; in[i] && k + 1 < cap; i++) {
        unsigned v;
        if (in[i] == '%' && in[i + 1] && in[i + 2] &&
            sscanf(in + i + 1, "%2x", &v) == 1) {
            out[k++] = (char)v;
            i += 2;
        } else {
            out[k++] = in[i];
        }
    }
    out[k] = '\0';
}

static enum MHD_Result answer_get(rreq *r, const char *url) {
    route_server *s = r->srv;
    strbuf b = { 0 };
    switch (r->route) {
    case R_HEALTH: {
        uint32_t up = route_workers_up(s->cfg.workers);
        int draining = atomic_load(&s->draining);
        const char *st = draining ? "draining" : up ? "ok" : "no_workers";
        strbuf_printf(&b, "{\"status\":\"%s\",\"workers_up\":%u}", st, up);
        return queue_json(r, up && !draining ? 200 : 503, &b);
    }
    case R_MODELS:
        route_workers_models_json(s->cfg.workers, &b);
        return queue_json(r, 200, &b);
    case R_MODEL:
        if (route_workers_model_json(s->cfg.workers, url + 11, &b) != 0) {
            strbuf_free(&b);
            char msg[192];
            snprintf(msg, sizeof msg, "no worker serves model '%.128s'", url + 11);
            return queue_err(r, 404, "model_not_found", msg);
        }
        return queue_json(r, 200, &b);
    case R_WORKERS:
        route_workers_list_json(s->cfg.workers, &b);
        return queue_json(r, 200, &b);
    default: { /* R_METRICS */
        char *text;
        size_t len;
        if (metrics_render(s->cfg.metrics, &text, &len) != 0) return MHD_NO;
        return queue_body(r, 200, text, len, METRICS_CONTENT_TYPE, NULL);
    }
    }
}

static enum MHD_Result add_worker(rreq *r) {
    cJSON *root = cJSON_ParseWithLength(r->body ? r->body : "", r->len);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "url");
    if (!cJSON_IsObject(root) || !cJSON_IsString(u)) {
        cJSON_Delete(root);
        return queue_err(r, 400, "invalid_request",
                         "POST /workers takes {\"url\":\"http://HOST:PORT\"}");
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "url") != 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "unknown field '%.64s' (POST /workers takes url)",
                     it->string);
            cJSON_Delete(root);
            return queue_err(r, 400, "unknown_field", msg);
        }
    }
    char err[320];
    int rc = route_workers_add(r->srv->cfg.workers, u->valuestring, err, sizeof err);
    strbuf b = { 0 };
    if (rc >= 0) {
        char norm[ROUTE_URL_MAX];
        route_url_normalize(u->valuestring, norm, NULL, 0);
        strbuf_puts(&b, "{\"url\":");
        json_write_cstring(&b, norm);
        strbuf_puts(&b, rc == 0 ? ",\"added\":true}" : ",\"added\":false}");
    }
    cJSON_Delete(root);
    if (rc < 0) return queue_err(r, 400, "invalid_worker", err);
    return queue_json(r, rc == 0 ? 201 : 200, &b);
}

static enum MHD_Result remove_worker(rreq *r, const char *url) {
    char u[ROUTE_URL_MAX * 3];
    percent_decode(url + 9, u, sizeof u);
    if (route_workers_remove(r->srv->cfg.workers, u) != 0) {
        char msg[ROUTE_URL_MAX + 64];
        snprintf(msg, sizeof msg, "no worker '%.256s'", u);
        return queue_err(r, 404, "worker_not_found", msg);
    }
    strbuf b = { 0 };
    strbuf_puts(&b, "{\"url\":");
    json_write_cstring(&b, u);
    strbuf_puts(&b, ",\"removed\":true}");
    return queue_json(r, 200, &b);
}

/* ------------------------------------------------------------------------- */
/* Requests                                                                   */
/* ------------------------------------------------------------------------- */
static int match_route(const char *url) {
    if (strcmp(url, "/health") == 0) return R_HEALTH;
    if (strcmp(url, "/v1/models") == 0) return R_MODELS;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) return R_MODEL;
    if (strcmp(url, "/metrics") == 0) return R_METRICS;
    if (strcmp(url, "/workers") == 0) return R_WORKERS;
    if (strncmp(url, "/workers/", 9) == 0 && url[9]) return R_WORKER;
    if (strcmp(url, "/v1/completions") == 0) return R_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0) return R_CHAT;
    if (strcmp(url, "/tokenize") == 0) return R_TOKENIZE;
    if (strcmp(url, "/detokenize") == 0) return R_DETOKENIZE;
    return R_OTHER;
}

static enum MHD_Result framing_of(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value) {
    (void)kind;
    const char **f = cls;
    if (strcasecmp(key, "Content-Length") == 0) {
        if (!f[0])
            f[0] = value ? value : "";
        else if (strcmp(f[0], value ? value : "") != 0)
            f[1] = "differs";
    } else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        f[2] = "te";
    }
    return MHD_YES;
}

static enum MHD_Result begin_request(route_server *s, struct MHD_Connection *conn,
                                     const char *url, const char *method,
                                     const char *version, void **req_cls) {
    rreq *r = util_calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->srv = s;
    r->conn = conn;
    r->refs = 1;
    atomic_fetch_add(&s->inflight, 1);
    pthread_mutex_init(&r->mu, NULL);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    r->rc = ci ? (rconn *)ci->socket_context : NULL;
    r->route = match_route(url);
    *req_cls = r;
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int is_post = strcmp(method, "POST") == 0;
    int is_delete = strcmp(method, "DELETE") == 0;
    int post_route = is_forwarded(r->route) || (r->route == R_WORKERS && is_post);
    set_phase(r, post_route ? LISTENER_BODY : LISTENER_BUSY);
    r->cors = http_policy_cors(
        &s->policy, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"));
    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host");
    if (!http_policy_host_ok(&s->policy, host, strcmp(version, "HTTP/1.0") == 0)) {
        char msg[192];
        if (!host)
            return queue_err(r, 400, "invalid_host",
                             "HTTP/1.1 requests need a Host header");
        snprintf(msg, sizeof msg,
                 "Host '%.64s' is not allowed (this router accepts its loopback names "
                 "and --allowed-host)",
                 host);
        return queue_err(r, 403, "host_not_allowed", msg);
    }
    if (r->route == R_OTHER) return queue_err(r, 404, "not_found", "no such route");
    if (strcmp(method, "OPTIONS") == 0 && r->cors) {
        r->preflight = 1;
        return MHD_YES;
    }
    int method_ok = r->route == R_WORKERS    ? is_get || is_post
                    : r->route == R_WORKER   ? is_delete
                    : is_forwarded(r->route) ? is_post
                                             : is_get;
    if (!method_ok) {
        const char *allow = r->route == R_WORKERS    ? "GET, POST"
                            : r->route == R_WORKER   ? "DELETE"
                            : is_forwarded(r->route) ? "POST"
                                                     : "GET";
        char msg[128];
        snprintf(msg, sizeof msg, "method %.16s is not allowed here (use %s)", method,
                 allow);
        return queue_err(r, 405, "method_not_allowed", msg);
    }
    int needs_key = strncmp(url, "/v1/", 4) == 0 || r->route == R_WORKERS ||
                    r->route == R_WORKER || post_route;
    if (needs_key &&
        !http_policy_auth_ok(&s->policy, MHD_lookup_connection_value(
                                             conn, MHD_HEADER_KIND, "Authorization")))
        return queue_err(r, 401, "invalid_api_key",
                         "missing or invalid API key (send 'Authorization: Bearer KEY')");
    if (!post_route) return MHD_YES;
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
    if (!http_policy_is_json(ct)) {
        char msg[192];
        snprintf(msg, sizeof msg, "Content-Type must be application/json, got '%.64s'",
                 ct ? ct : "(none)");
        return queue_err(r, 415, "unsupported_media_type", msg);
    }
    const char *f[3] = { NULL, NULL, NULL };
    MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_of, f);
    if (f[1] || (f[0] && f[2])) {
        r->close_after = 1;
        return queue_err(r, 400, "invalid_header",
                         f[1] ? "two different Content-Length headers"
                              : "both Content-Length and Transfer-Encoding are given");
    }
    uint64_t clen = 0;
    if (f[0] && util_parse_u64(f[0], &clen) == 0 && clen > s->cfg.max_body) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "request body of %" PRIu64 " bytes is over the limit of %zu bytes", clen,
                 s->cfg.max_body);
        return queue_err(r, 413, "request_too_large", msg);
    }
    return MHD_YES;
}

static enum MHD_Result take_upload(rreq *r, const char *data, size_t n) {
    if (r->too_big || r->len + n > r->srv->cfg.max_body) {
        r->too_big = 1;
        return MHD_YES;
    }
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n + 1) cap *= 2;
        char *p = realloc(r->body, cap);
        if (!p) return MHD_NO;
        r->body = p;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = '\0';
    return MHD_YES;
}

static enum MHD_Result answer_preflight(rreq *r) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_cors(r, resp);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods",
                            "GET, POST, DELETE, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(r->conn, 204, resp);
    MHD_destroy_response(resp);
    r->responded = 1;
    count(r->srv, r->route, 204);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
    route_server *s = cls;
    rreq *r = *req_cls;
    if (!r) {
        enum MHD_Result ret = begin_request(s, conn, url, method, version, req_cls);
        r = *req_cls;
        if (r && r->responded) set_phase(r, LISTENER_BODY_ANSWERED);
        return ret;
    }
    if (r->responded) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return take_upload(r, upload_data, n);
    }
    if (r->forwarding) return forward_step(r);
    if (r->preflight) return answer_preflight(r);
    set_phase(r, LISTENER_BUSY);
    if (r->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body is over the limit of %zu bytes",
                 s->cfg.max_body);
        return queue_err(r, 413, "request_too_large", msg);
    }
    if (r->route == R_WORKERS && strcmp(method, "POST") == 0) return add_worker(r);
    if (r->route == R_WORKER) return remove_worker(r, url);
    if (!is_forwarded(r->route)) return answer_get(r, url);
    return forward_begin(r);
}

/* ------------------------------------------------------------------------- */
/* Lifecycle                                                                  */
/* ------------------------------------------------------------------------- */
int route_server_start(const route_server_config *cfg, route_server **out, char *err,
                       size_t err_cap) {
    if (!cfg->workers || !cfg->metrics || !cfg->max_body || !cfg->max_connections) {
        util_set_err(err, err_cap, "route: missing configuration");
        return -1;
    }
    listener_config lc = { .admit = http_front_admit };
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (http_front_addr(host, cfg->port, &lc.addr, err, err_cap) != 0) return -1;
    route_server *s = util_calloc(1, sizeof *s);
    if (!s) {
        util_set_err(err, err_cap, "route: out of memory");
        return -1;
    }
    s->cfg = *cfg;
    http_policy_config pc = { .bind_host = host,
                              .allowed_hosts = cfg->allowed_hosts,
                              .n_allowed_hosts = cfg->n_allowed_hosts,
                              .cors_origins = cfg->cors_origins,
                              .n_cors_origins = cfg->n_cors_origins,
                              .api_key = cfg->api_key };
    if (http_policy_init(&s->policy, &pc, err, err_cap) != 0) {
        free(s);
        return -1;
    }
    static const char *const hl[2] = { "endpoint", "status" };
    s->m_http =
        metrics_counter(cfg->metrics, "orch_route_http_requests_total",
                        "Router HTTP requests by endpoint and status code.", 2, hl);
    s->m_retries = metrics_series_get(
        metrics_counter(cfg->metrics, "orch_route_retries_total",
                        "Requests sent to another worker after a failure.", 0, NULL),
        NULL);
    s->m_stream_errors = metrics_series_get(
        metrics_counter(cfg->metrics, "orch_route_stream_errors_total",
                        "Streams cut by a worker failure (ended with an error event).", 0,
                        NULL),
        NULL);
    s->m_pauses = metrics_series_get(
        metrics_counter(cfg->metrics, "orch_route_backpressure_pauses_total",
                        "Times a worker's stream was paused for a slow client.", 0, NULL),
        NULL);
    s->front.watch = conn_watch_create();
    s->proxy = s->front.watch ? route_proxy_create(cfg->connect_timeout_s,
                                                   poll_disconnects, s, err, err_cap)
                              : NULL;
    if (!s->front.watch) util_set_err(err, err_cap, "route: out of memory");
    unsigned inactivity = http_front_inactivity(
        cfg->idle_timeout_s, cfg->header_timeout_s, cfg->body_timeout_s);
    if (s->proxy)
        s->front.d = MHD_start_daemon(
            HTTP_FRONT_MHD_FLAGS, 0, NULL, NULL, on_request, s,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
            http_front_on_connection, &s->front, MHD_OPTION_CONNECTION_TIMEOUT,
            inactivity, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_connections + 64),
            MHD_OPTION_END);
    if (!s->proxy || !s->front.d || !s->m_http) {
        if (s->proxy) util_set_err(err, err_cap, "route: cannot start the HTTP server");
        route_server_stop(s);
        return -1;
    }
    lc.max_conns = cfg->max_connections;
    lc.max_per_ip =
        cfg->max_connections_per_ip ? cfg->max_connections_per_ip : cfg->max_connections;
    lc.header_timeout = cfg->header_timeout_s ? cfg->header_timeout_s : 10;
    lc.body_timeout = cfg->body_timeout_s ? cfg->body_timeout_s : 60;
    lc.idle_timeout = cfg->idle_timeout_s ? cfg->idle_timeout_s : 15;
    lc.admit_arg = &s->front;
    lc.metrics = cfg->metrics;
    if (listener_start(&lc, &s->front.lst, err, err_cap) != 0) {
        route_server_stop(s);
        return -1;
    }
    s->port = listener_port(s->front.lst);
    *out = s;
    return 0;
}

uint16_t route_server_port(const route_server *s) { return s ? s->port : 0; }

/* Wait up to timeout_s for the requests in progress; those left. */
static uint32_t wait_inflight(route_server *s, double timeout_s) {
    double end = util_now() + timeout_s;
    uint32_t n;
    while ((n = atomic_load(&s->inflight)) > 0 && util_now() < end) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return n;
}

uint32_t route_server_drain(route_server *s, double timeout_s) {
    if (!s) return 0;
    atomic_store(&s->draining, 1);
    listener_stop_accepting(s->front.lst);
    return wait_inflight(s, timeout_s);
}

void route_server_stop(route_server *s) {
    if (!s) return;
    if (s->front.lst) listener_stop_accepting(s->front.lst);
    atomic_store(&s->draining, 1);
    route_proxy_destroy(s->proxy);         /* every transfer ends: connections resume */
    if (s->front.d) wait_inflight(s, 2.0); /* cut streams send their error events */
    if (s->front.d) MHD_stop_daemon(s->front.d);
    listener_stop(s->front.lst);
    conn_watch_free(s->front.watch);
    http_policy_free(&s->policy);
    free(s);
}
