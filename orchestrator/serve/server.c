/*
 * server.c - OpenAI-compatible HTTP API over libmicrohttpd: routing, request
 * validation, prompt encoding, hand-off to the scheduler, JSON and SSE
 * responses, disconnect detection. See server.h.
 */
#include "orchestrator/serve/server.h"
#include "orchestrator/core/strbuf.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/serve/chat_template.h"
#include "orchestrator/core/util.h"

#define DEFAULT_MAX_BODY (4u << 20)
#define DEFAULT_MAX_SEQS_PER_REQUEST 256u
#define MAX_STOPS 16u
#define MAX_STOP_LEN 256u
#define COMPLETIONS_DEFAULT_MAX_TOKENS 16

/* ------------------------------------------------------------------------- */
/* JSON text builder                                                          */
/* ------------------------------------------------------------------------- */
/* Length of the valid UTF-8 character at s[0..n), or 0 if invalid. */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* A JSON string: quotes, escapes, invalid UTF-8 bytes become U+FFFD. */
static void jb_str(strbuf *b, const char *s, size_t n) {
    strbuf_reserve(b, n + 2);
    if (b->oom) return;
    b->p[b->len++] = '"';
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        while (i < n && u[i] >= 0x20 && u[i] < 0x80 && u[i] != '"' && u[i] != '\\') i++;
        if (i > start) strbuf_put(b, s + start, i - start);
        if (i >= n) break;
        unsigned char c = u[i];
        if (c == '"') { strbuf_put(b, "\\\"", 2); i++; }
        else if (c == '\\') { strbuf_put(b, "\\\\", 2); i++; }
        else if (c == '\n') { strbuf_put(b, "\\n", 2); i++; }
        else if (c == '\r') { strbuf_put(b, "\\r", 2); i++; }
        else if (c == '\t') { strbuf_put(b, "\\t", 2); i++; }
        else if (c < 0x20) { strbuf_printf(b, "\\u%04x", c); i++; }
        else {
            size_t l = utf8_char_len(u + i, n - i);
            if (l == 0) { strbuf_put(b, "\xEF\xBF\xBD", 3); i++; }
            else { strbuf_put(b, s + i, l); i += l; }
        }
    }
    strbuf_put(b, "\"", 1);
}

static void jb_cstr(strbuf *b, const char *s) { jb_str(b, s, strlen(s)); }

static void jb_dbl(strbuf *b, double v) {
    if (!isfinite(v)) v = -9999.0; /* what OpenAI reports for -inf */
    strbuf_printf(b, "%.9g", v);
}

/* ------------------------------------------------------------------------- */
/* Types                                                                      */
/* ------------------------------------------------------------------------- */
enum route { R_OTHER = 0, R_HEALTH, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT,
             R_METRICS, R_COUNT };
static const char *const route_label[R_COUNT] = {
    "other", "/health", "/v1/models", "/v1/models/{model}", "/v1/completions",
    "/v1/chat/completions", "/metrics"};

enum { ST_LOADING = 0, ST_READY = 1, ST_DRAINING = 2 };

typedef struct http_req http_req;

typedef struct conn_ctx {
    uint32_t slot;
    int fd;
    http_req *cur; /* request waiting on the scheduler (under watch_mu) */
} conn_ctx;

typedef struct watch_slot {
    conn_ctx *c;
    uint32_t gen;
    uint32_t next_free;
} watch_slot;

struct server {
    server_config cfg;
    char *model_name;
    char *api_key;
    struct MHD_Daemon *d;
    uint16_t port;
    atomic_int state;
    pthread_mutex_t sched_mu; /* guards sched against server_detach_scheduler */
    scheduler *sched;
    const tokenizer *tok;
    uint32_t vocab, context;
    atomic_uint inflight;
    atomic_ullong next_id;
    uint64_t id_salt;
    long created;

    /* disconnect watching */
    int wfd;
    pthread_mutex_t watch_mu;
    watch_slot *slots;
    uint32_t n_slots, free_head; /* free_head UINT32_MAX = none */

    metrics_family *m_requests;
    metrics_series *m_disconnects;
};

typedef struct stream_state {
    size_t sent_text;     /* bytes of seq text sent */
    uint32_t sent_tokens; /* generated tokens whose logprobs were sent */
    int sent_first;       /* role chunk (chat) / echo chunk (completions) */
    int sent_finish;
} stream_state;

struct http_req {
    server *srv;
    struct MHD_Connection *conn;
    conn_ctx *cc;
    int route;
    char *body;
    size_t body_len, body_cap;
    int too_big;   /* the body went over the limit: 413 after the upload */
    int counted;   /* in server_inflight (accepted by the scheduler) */
    int responded;

    /* generation request */
    pthread_mutex_t lock;
    int lock_init;
    int refs;        /* MHD side + stream response + live sequences */
    int suspended, resume_requested;
    int submitted;
    uint32_t n_seqs, n_done;
    sched_seq *seqs;
    stream_state *ss;
    uint32_t n_prompts;
    int32_t **prompt_ids;
    uint32_t *prompt_len;
    char **prompt_text; /* decoded prompt (echo) */
    size_t *prompt_text_len;
    char **stops;
    uint32_t n_stops;
    int chat, stream, include_usage, echo, logprobs;
    uint32_t top_logprobs, n;
    char id[48];
    long created;
    /* SSE output buffer */
    char *obuf;
    size_t olen, ooff, ocap;
    int stream_done, error_sent;
};

/* An error for the client (OpenAI shape). */
typedef struct api_err {
    unsigned status;
    const char *type;
    const char *param;
    const char *code;
    char msg[512];
} api_err;

static int set_err(api_err *e, unsigned status, const char *param,
                   const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int set_err(api_err *e, unsigned status, const char *param,
                   const char *code, const char *fmt, ...) {
    e->status = status;
    e->param = param;
    e->code = code;
    switch (status) {
    case 401: e->type = "authentication_error"; break;
    case 404: e->type = "not_found_error"; break;
    case 429: e->type = "rate_limit_error"; break;
    case 500: e->type = "server_error"; break;
    case 503: e->type = "service_unavailable_error"; break;
    default: e->type = "invalid_request_error"; break;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static void jb_error_object(strbuf *b, const api_err *e) {
    strbuf_puts(b, "{\"error\":{\"message\":");
    jb_cstr(b, e->msg);
    strbuf_puts(b, ",\"type\":");
    jb_cstr(b, e->type);
    strbuf_puts(b, ",\"param\":");
    if (e->param) jb_cstr(b, e->param);
    else strbuf_puts(b, "null");
    strbuf_puts(b, ",\"code\":");
    if (e->code) jb_cstr(b, e->code);
    else strbuf_puts(b, "null");
    strbuf_puts(b, "}}");
}

/* ------------------------------------------------------------------------- */
/* Responses                                                                  */
/* ------------------------------------------------------------------------- */
static void count_request(server *s, int route, unsigned status) {
    char st[8];
    snprintf(st, sizeof st, "%u", status);
    const char *labels[2] = {route_label[route], st};
    metrics_counter_add(metrics_series_get(s->m_requests, labels), 1);
}

/* Queue `body` (malloc'd, taken over) with status. */
static enum MHD_Result queue_body(http_req *hr, unsigned status, char *body,
                                  size_t len, const char *ctype) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 405) {
        const char *allow = (hr->route == R_COMPLETIONS || hr->route == R_CHAT)
                                ? "POST" : "GET, HEAD";
        MHD_add_response_header(r, "Allow", allow);
    }
    if (status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
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

static enum MHD_Result queue_error(http_req *hr, const api_err *e) {
    strbuf b = {0};
    jb_error_object(&b, e);
    return queue_json(hr, e->status, &b);
}

static enum MHD_Result queue_err(http_req *hr, unsigned status,
                                 const char *param, const char *code,
                                 const char *msg) {
    api_err e;
    set_err(&e, status, param, code, "%s", msg);
    return queue_error(hr, &e);
}

/* ------------------------------------------------------------------------- */
/* Request objects                                                            */
/* ------------------------------------------------------------------------- */
static void hr_free(http_req *hr) {
    for (uint32_t i = 0; i < hr->n_seqs; i++) sched_seq_free_outputs(&hr->seqs[i]);
    free(hr->seqs);
    free(hr->ss);
    for (uint32_t i = 0; i < hr->n_prompts; i++) {
        if (hr->prompt_ids) free(hr->prompt_ids[i]);
        if (hr->prompt_text) free(hr->prompt_text[i]);
    }
    free(hr->prompt_ids);
    free(hr->prompt_len);
    free(hr->prompt_text);
    free(hr->prompt_text_len);
    for (uint32_t i = 0; i < hr->n_stops; i++) free(hr->stops[i]);
    free(hr->stops);
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
        (hr->stream || hr->n_done == hr->n_seqs)) {
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

static void wake_scheduler(server *s) {
    pthread_mutex_lock(&s->sched_mu);
    if (s->sched) scheduler_wake(s->sched);
    pthread_mutex_unlock(&s->sched_mu);
}

static void cancel_all_seqs_locked(http_req *hr) {
    for (uint32_t i = 0; i < hr->n_seqs; i++)
        atomic_store(&hr->seqs[i].cancel, 1);
}

/* ------------------------------------------------------------------------- */
/* Disconnect watching                                                        */
/* ------------------------------------------------------------------------- */
static void on_connection(void *cls, struct MHD_Connection *conn,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_ctx *c = util_calloc(1, sizeof *c);
        if (!c || !ci) {
            free(c);
            return;
        }
        c->fd = ci->connect_fd;
        pthread_mutex_lock(&s->watch_mu);
        if (s->free_head == UINT32_MAX) {
            uint32_t n = s->n_slots ? s->n_slots * 2 : 64;
            watch_slot *ns = realloc(s->slots, n * sizeof *ns);
            if (!ns) {
                pthread_mutex_unlock(&s->watch_mu);
                free(c);
                return;
            }
            for (uint32_t i = s->n_slots; i < n; i++) {
                ns[i].c = NULL;
                ns[i].gen = 0;
                ns[i].next_free = i + 1 < n ? i + 1 : UINT32_MAX;
            }
            s->slots = ns;
            s->free_head = s->n_slots;
            s->n_slots = n;
        }
        uint32_t slot = s->free_head;
        s->free_head = s->slots[slot].next_free;
        s->slots[slot].c = c;
        s->slots[slot].gen++;
        c->slot = slot;
        struct epoll_event ev;
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLRDHUP | EPOLLONESHOT;
        ev.data.u64 = ((uint64_t)s->slots[slot].gen << 32) | slot;
        pthread_mutex_unlock(&s->watch_mu);
        (void)epoll_ctl(s->wfd, EPOLL_CTL_ADD, c->fd, &ev);
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_ctx *c = *socket_context;
        if (!c) return;
        (void)epoll_ctl(s->wfd, EPOLL_CTL_DEL, c->fd, NULL);
        pthread_mutex_lock(&s->watch_mu);
        s->slots[c->slot].c = NULL;
        s->slots[c->slot].next_free = s->free_head;
        s->free_head = c->slot;
        pthread_mutex_unlock(&s->watch_mu);
        free(c);
        *socket_context = NULL;
    }
}

void server_poll_disconnects(void *arg) {
    server *s = arg;
    struct epoll_event ev[64];
    int n = epoll_wait(s->wfd, ev, 64, 0);
    for (int i = 0; i < n; i++) {
        uint32_t slot = (uint32_t)ev[i].data.u64;
        uint32_t gen = (uint32_t)(ev[i].data.u64 >> 32);
        pthread_mutex_lock(&s->watch_mu);
        if (slot < s->n_slots && s->slots[slot].gen == gen && s->slots[slot].c) {
            http_req *hr = s->slots[slot].c->cur;
            if (hr) {
                pthread_mutex_lock(&hr->lock);
                if (hr->n_done < hr->n_seqs) {
                    cancel_all_seqs_locked(hr);
                    metrics_counter_add(s->m_disconnects, 1);
                }
                pthread_mutex_unlock(&hr->lock);
            }
        }
        pthread_mutex_unlock(&s->watch_mu);
    }
}

/* MHD request-completed callback. */
static void on_completed(void *cls, struct MHD_Connection *conn,
                         void **req_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn;
    (void)toe;
    server *s = cls;
    http_req *hr = *req_cls;
    if (!hr) return;
    *req_cls = NULL;
    pthread_mutex_lock(&s->watch_mu);
    if (hr->cc && hr->cc->cur == hr) hr->cc->cur = NULL;
    pthread_mutex_unlock(&s->watch_mu);
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
/* Request parsing                                                            */
/* ------------------------------------------------------------------------- */
static cJSON *field(const cJSON *root, const char *k) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(root, k);
    return (x && cJSON_IsNull(x)) ? NULL : x;
}

static int get_bool(const cJSON *root, const char *k, int *out, api_err *e) {
    cJSON *x = field(root, k);
    if (!x) return 0;
    if (!cJSON_IsBool(x))
        return set_err(e, 400, k, "invalid_type", "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(x);
    return 0;
}

/* Integer in [lo, hi]; *present set when given. */
static int get_int(const cJSON *root, const char *k, double lo, double hi,
                   int64_t *out, int *present, api_err *e) {
    cJSON *x = field(root, k);
    if (present) *present = 0;
    if (!x) return 0;
    if (!cJSON_IsNumber(x))
        return set_err(e, 400, k, "invalid_type", "'%s' must be an integer", k);
    double v = x->valuedouble;
    if (!isfinite(v) || v != floor(v))
        return set_err(e, 400, k, "invalid_type", "'%s' must be an integer", k);
    if (v < lo || v > hi)
        return set_err(e, 400, k, "invalid_value",
                       "'%s' must be between %.0f and %.0f, got %.17g", k, lo, hi, v);
    *out = (int64_t)v;
    if (present) *present = 1;
    return 0;
}

static int get_num(const cJSON *root, const char *k, double lo, double hi,
                   int lo_open, double *out, api_err *e) {
    cJSON *x = field(root, k);
    if (!x) return 0;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
        return set_err(e, 400, k, "invalid_type", "'%s' must be a number", k);
    double v = x->valuedouble;
    if (v < lo || v > hi || (lo_open && v == lo))
        return set_err(e, 400, k, "invalid_value", "'%s' must be in %s%g, %g], got %.17g",
                       k, lo_open ? "(" : "[", lo, hi, v);
    *out = v;
    return 0;
}

static int add_prompt_ids(http_req *hr, int32_t *ids, uint32_t n, api_err *e) {
    uint32_t i = hr->n_prompts;
    hr->prompt_ids[i] = ids;
    hr->prompt_len[i] = n;
    char err[256];
    size_t tl = 0;
    char *text = NULL;
    if (tokenizer_decode(hr->srv->tok, ids, n, &text, &tl, err, sizeof err) != 0) {
        hr->n_prompts++;
        return set_err(e, 400, "prompt", "invalid_value", "prompt: %s", err);
    }
    hr->prompt_text[i] = text;
    hr->prompt_text_len[i] = tl;
    hr->n_prompts++;
    if (n == 0) return set_err(e, 400, "prompt", "invalid_value", "the prompt is empty");
    return 0;
}

static int add_prompt_text(http_req *hr, const char *s, size_t len,
                           const char *param, api_err *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256];
    if (tokenizer_encode(hr->srv->tok, s, len, &ids, &n, err, sizeof err) != 0)
        return set_err(e, 400, param, "invalid_value", "%s: %s", param, err);
    if (n > UINT32_MAX) n = UINT32_MAX;
    return add_prompt_ids(hr, ids, (uint32_t)n, e);
}

static int token_array(http_req *hr, const cJSON *arr, int32_t **out,
                       uint32_t *n_out, api_err *e) {
    int n = cJSON_GetArraySize(arr);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) return set_err(e, 500, NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1.5;
        if (!cJSON_IsNumber(it) || v != floor(v) || v < 0 || v >= (double)hr->srv->vocab) {
            free(ids);
            return set_err(e, 400, "prompt", "invalid_value",
                           "prompt: token ids must be integers in [0, %u); element %d is not",
                           hr->srv->vocab, i);
        }
        ids[i++] = (int32_t)v;
    }
    *out = ids;
    *n_out = (uint32_t)i;
    return 0;
}

static int alloc_prompts(http_req *hr, uint32_t n, api_err *e) {
    hr->prompt_ids = util_calloc(n, sizeof *hr->prompt_ids);
    hr->prompt_len = util_calloc(n, sizeof *hr->prompt_len);
    hr->prompt_text = util_calloc(n, sizeof *hr->prompt_text);
    hr->prompt_text_len = util_calloc(n, sizeof *hr->prompt_text_len);
    if (!hr->prompt_ids || !hr->prompt_len || !hr->prompt_text || !hr->prompt_text_len)
        return set_err(e, 500, NULL, NULL, "out of memory");
    return 0;
}

static int parse_prompt(http_req *hr, const cJSON *root, uint32_t limit,
                        api_err *e) {
    const cJSON *p = field(root, "prompt");
    if (!p) return set_err(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    if (cJSON_IsString(p)) {
        if (alloc_prompts(hr, 1, e)) return -1;
        return add_prompt_text(hr, p->valuestring, strlen(p->valuestring), "prompt", e);
    }
    if (!cJSON_IsArray(p))
        return set_err(e, 400, "prompt", "invalid_type",
                       "'prompt' must be a string, an array of token ids, or an array of either");
    int n = cJSON_GetArraySize(p);
    if (n == 0) return set_err(e, 400, "prompt", "invalid_value", "'prompt' is an empty array");
    const cJSON *first = p->child;
    if (cJSON_IsNumber(first)) { /* one prompt as token ids */
        if (alloc_prompts(hr, 1, e)) return -1;
        int32_t *ids;
        uint32_t len;
        if (token_array(hr, p, &ids, &len, e)) return -1;
        return add_prompt_ids(hr, ids, len, e);
    }
    if ((uint32_t)n > limit)
        return set_err(e, 400, "prompt", "invalid_value", "at most %u prompts per request, got %d", limit, n);
    if (alloc_prompts(hr, (uint32_t)n, e)) return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        if (cJSON_IsString(it)) {
            if (add_prompt_text(hr, it->valuestring, strlen(it->valuestring), "prompt", e)) return -1;
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) > 0 && cJSON_IsNumber(it->child)) {
            int32_t *ids;
            uint32_t len;
            if (token_array(hr, it, &ids, &len, e)) return -1;
            if (add_prompt_ids(hr, ids, len, e)) return -1;
        } else {
            return set_err(e, 400, "prompt", "invalid_type",
                           "prompt[%u] must be a string or a non-empty array of token ids", hr->n_prompts);
        }
    }
    return 0;
}

/* Chat content: a string, or an array of {"type":"text","text":...} parts
 * (joined); null only for assistant messages. malloc'd into *out. */
static int chat_content(const cJSON *m, int idx, const char *role, char **out,
                        size_t *len, api_err *e) {
    const cJSON *c = field(m, "content");
    if (!c) {
        if (strcmp(role, "assistant") == 0) {
            *out = calloc(1, 1);
            *len = 0;
            return *out ? 0 : set_err(e, 500, NULL, NULL, "out of memory");
        }
        return set_err(e, 400, "messages", "missing_required_parameter", "messages[%d].content is required", idx);
    }
    if (cJSON_IsString(c)) {
        *len = strlen(c->valuestring);
        *out = malloc(*len + 1);
        if (!*out) return set_err(e, 500, NULL, NULL, "out of memory");
        memcpy(*out, c->valuestring, *len + 1);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return set_err(e, 400, "messages", "invalid_type", "messages[%d].content must be a string or an array of text parts", idx);
    strbuf b = {0};
    strbuf_reserve(&b, 0);
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            free(b.p);
            return set_err(e, 400, "messages", "invalid_value",
                           "messages[%d].content[%d] must be {\"type\":\"text\",\"text\":STRING} (only text parts are supported)", idx, k);
        }
        strbuf_puts(&b, text->valuestring);
        k++;
    }
    if (b.oom || !b.p) {
        free(b.p);
        return set_err(e, 500, NULL, NULL, "out of memory");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

static int parse_messages(http_req *hr, const cJSON *root, api_err *e) {
    const cJSON *msgs = field(root, "messages");
    if (!msgs) return set_err(e, 400, "messages", "missing_required_parameter", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return set_err(e, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(msgs);
    chat_message *cm = util_calloc((size_t)n, sizeof *cm);
    char **contents = util_calloc((size_t)n, sizeof *contents);
    int rc = 0;
    if (!cm || !contents) rc = set_err(e, 500, NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (rc) break;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            rc = set_err(e, 400, "messages", "invalid_type", "messages[%d] must be an object with a string 'role'", i);
            break;
        }
        if (!chat_template_role_valid(role->valuestring)) {
            rc = set_err(e, 400, "messages", "invalid_value",
                         "messages[%d].role '%.64s' is not one of system, developer, user, assistant", i, role->valuestring);
            break;
        }
        size_t len = 0;
        if (chat_content(m, i, role->valuestring, &contents[i], &len, e)) {
            rc = -1;
            break;
        }
        cm[i].role = role->valuestring;
        cm[i].content = contents[i];
        cm[i].content_len = len;
        i++;
    }
    if (!rc) {
        char *text = NULL;
        size_t tl = 0;
        char err[256];
        if (chat_template_render(cm, (size_t)n, &text, &tl, err, sizeof err) != 0)
            rc = set_err(e, 400, "messages", "invalid_value", "%s", err);
        else if (alloc_prompts(hr, 1, e))
            rc = -1;
        else
            rc = add_prompt_text(hr, text, tl, "messages", e);
        free(text);
    }
    for (int k = 0; contents && k < n; k++) free(contents[k]);
    free(contents);
    free(cm);
    return rc;
}

static int add_stop(http_req *hr, const char *s, api_err *e) {
    size_t l = strlen(s);
    if (l == 0) return set_err(e, 400, "stop", "invalid_value", "stop strings must not be empty");
    if (l > MAX_STOP_LEN) return set_err(e, 400, "stop", "invalid_value", "stop strings are limited to %u bytes", MAX_STOP_LEN);
    if (hr->n_stops >= MAX_STOPS + CHAT_TEMPLATE_N_STOPS)
        return set_err(e, 400, "stop", "invalid_value", "at most %u stop strings", MAX_STOPS);
    char *d = malloc(l + 1);
    if (!d) return set_err(e, 500, NULL, NULL, "out of memory");
    memcpy(d, s, l + 1);
    hr->stops[hr->n_stops++] = d;
    return 0;
}

static int parse_stop(http_req *hr, const cJSON *root, api_err *e) {
    hr->stops = util_calloc(MAX_STOPS + CHAT_TEMPLATE_N_STOPS, sizeof *hr->stops);
    if (!hr->stops) return set_err(e, 500, NULL, NULL, "out of memory");
    const cJSON *st = field(root, "stop");
    if (st) {
        if (cJSON_IsString(st)) {
            if (add_stop(hr, st->valuestring, e)) return -1;
        } else if (cJSON_IsArray(st)) {
            if ((unsigned)cJSON_GetArraySize(st) > MAX_STOPS)
                return set_err(e, 400, "stop", "invalid_value", "at most %u stop strings", MAX_STOPS);
            const cJSON *it;
            cJSON_ArrayForEach(it, st) {
                if (!cJSON_IsString(it))
                    return set_err(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
                if (add_stop(hr, it->valuestring, e)) return -1;
            }
        } else {
            return set_err(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
        }
    }
    if (hr->chat)
        for (int i = 0; i < CHAT_TEMPLATE_N_STOPS; i++)
            if (add_stop(hr, CHAT_TEMPLATE_STOPS[i], e)) return -1;
    return 0;
}

static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Parse, validate and build the sequences of a generation request. */
static int setup_generation(http_req *hr, api_err *e) {
    server *s = hr->srv;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hr->body ? hr->body : "", hr->body_len, &end, 0);
    if (!root) {
        size_t at = end && hr->body ? (size_t)(end - hr->body) : 0;
        return set_err(e, 400, NULL, "invalid_json",
                       "the request body is not valid JSON (error near byte %zu)", at);
    }
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        set_err(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
        goto out;
    }
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model)) {
        set_err(e, 400, "model", "invalid_type", "'model' must be a string");
        goto out;
    }
    if (model && strcmp(model->valuestring, s->model_name) != 0) {
        set_err(e, 400, "model", "model_not_found",
                "the model '%.128s' does not exist; this server serves '%.128s'",
                model->valuestring, s->model_name);
        goto out;
    }
    /* unsupported features: only their neutral values are accepted */
    {
        double pen = 0;
        if (get_num(root, "presence_penalty", -2, 2, 0, &pen, e)) goto out;
        if (pen != 0) { set_err(e, 400, "presence_penalty", "unsupported_parameter", "'presence_penalty' is not supported (only 0)"); goto out; }
        if (get_num(root, "frequency_penalty", -2, 2, 0, &pen, e)) goto out;
        if (pen != 0) { set_err(e, 400, "frequency_penalty", "unsupported_parameter", "'frequency_penalty' is not supported (only 0)"); goto out; }
        const cJSON *lb = field(root, "logit_bias");
        if (lb && (!cJSON_IsObject(lb) || lb->child)) { set_err(e, 400, "logit_bias", "unsupported_parameter", "'logit_bias' is not supported"); goto out; }
        if (!hr->chat && field(root, "suffix")) { set_err(e, 400, "suffix", "unsupported_parameter", "'suffix' is not supported"); goto out; }
        if (hr->chat && (field(root, "tools") || field(root, "functions"))) { set_err(e, 400, "tools", "unsupported_parameter", "tools and functions are not supported"); goto out; }
        const cJSON *rf = field(root, "response_format");
        if (hr->chat && rf) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
            if (!cJSON_IsObject(rf) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0) {
                set_err(e, 400, "response_format", "unsupported_parameter", "only response_format {\"type\":\"text\"} is supported");
                goto out;
            }
        }
    }
    double temperature = 1.0, top_p = 1.0;
    int64_t top_k = 0, n = 1, seed = 0, max_tokens = -1, lp = 0, best_of = 1;
    int has_seed = 0, has_max = 0, has_lp = 0, has_mct = 0;
    if (get_num(root, "temperature", 0, 2, 0, &temperature, e)) goto out;
    if (get_num(root, "top_p", 0, 1, 1, &top_p, e)) goto out;
    if (get_int(root, "top_k", -1, 1e9, &top_k, NULL, e)) goto out;
    if (get_int(root, "n", 1, 128, &n, NULL, e)) goto out;
    if (get_int(root, "best_of", 1, 128, &best_of, NULL, e)) goto out;
    if (best_of != 1 && best_of != n) { set_err(e, 400, "best_of", "unsupported_parameter", "'best_of' other than n is not supported"); goto out; }
    if (get_int(root, "seed", -9223372036854775808.0, 9223372036854774784.0, &seed, &has_seed, e)) goto out;
    if (get_int(root, "max_tokens", 0, 1e9, &max_tokens, &has_max, e)) goto out;
    if (hr->chat) {
        int64_t mct = 0;
        if (get_int(root, "max_completion_tokens", 0, 1e9, &mct, &has_mct, e)) goto out;
        if (has_mct) { max_tokens = mct; has_max = 1; }
    }
    if (get_bool(root, "stream", &hr->stream, e)) goto out;
    int ignore_eos = 0;
    if (get_bool(root, "ignore_eos", &ignore_eos, e)) goto out;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) { set_err(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object"); goto out; }
        if (get_bool(so, "include_usage", &hr->include_usage, e)) goto out;
        if (!hr->stream) hr->include_usage = 0;
    }
    if (hr->chat) {
        int on = 0;
        if (get_bool(root, "logprobs", &on, e)) goto out;
        if (get_int(root, "top_logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &lp, &has_lp, e)) goto out;
        if (has_lp && !on) { set_err(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' requires 'logprobs': true"); goto out; }
        hr->logprobs = on;
        hr->top_logprobs = (uint32_t)lp;
    } else {
        if (get_bool(root, "echo", &hr->echo, e)) goto out;
        if (get_int(root, "logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &lp, &has_lp, e)) goto out;
        hr->logprobs = has_lp;
        hr->top_logprobs = (uint32_t)lp;
    }
    hr->n = (uint32_t)n;
    if (parse_stop(hr, root, e)) goto out;
    uint32_t limit = s->cfg.max_seqs_per_request;
    if (hr->chat ? parse_messages(hr, root, e) : parse_prompt(hr, root, limit, e)) goto out;
    if ((uint64_t)hr->n_prompts * hr->n > limit) {
        set_err(e, 400, "n", "invalid_value", "n x prompts = %" PRIu64 " is over the limit of %u sequences per request",
                (uint64_t)hr->n_prompts * hr->n, limit);
        goto out;
    }
    /* context checks */
    for (uint32_t i = 0; i < hr->n_prompts; i++) {
        uint32_t pl = hr->prompt_len[i];
        const char *what = hr->chat ? "messages" : "prompt";
        if (pl >= s->context) {
            set_err(e, 400, what, "context_length_exceeded",
                    "This model's maximum context length is %u tokens, but the %s has %u tokens. Please shorten it.",
                    s->context, what, pl);
            goto out;
        }
        int64_t mt = has_max ? max_tokens : hr->chat ? (int64_t)(s->context - pl) : COMPLETIONS_DEFAULT_MAX_TOKENS;
        if (!has_max && !hr->chat && pl + mt > s->context) mt = s->context - pl;
        if ((uint64_t)pl + (uint64_t)mt > s->context) {
            set_err(e, 400, has_mct ? "max_completion_tokens" : "max_tokens", "context_length_exceeded",
                    "This model's maximum context length is %u tokens. However, you requested %" PRIu64
                    " tokens (%u in the %s, %" PRId64 " for the completion). Please reduce the %s or the completion length.",
                    s->context, (uint64_t)pl + (uint64_t)mt, pl, what, mt, what);
            goto out;
        }
    }
    /* sequences */
    hr->n_seqs = hr->n_prompts * hr->n;
    hr->seqs = util_calloc(hr->n_seqs, sizeof *hr->seqs);
    hr->ss = util_calloc(hr->n_seqs, sizeof *hr->ss);
    if (!hr->seqs || !hr->ss) {
        hr->n_seqs = 0;
        set_err(e, 500, NULL, NULL, "out of memory");
        goto out;
    }
    uint64_t base_seed = has_seed ? (uint64_t)seed
                                  : mix64(s->id_salt ^ atomic_fetch_add(&s->next_id, 1));
    for (uint32_t p = 0; p < hr->n_prompts; p++) {
        uint32_t pl = hr->prompt_len[p];
        int64_t mt = has_max ? max_tokens : hr->chat ? (int64_t)(s->context - pl) : COMPLETIONS_DEFAULT_MAX_TOKENS;
        if (!has_max && pl + mt > s->context) mt = s->context - pl;
        for (uint32_t c = 0; c < hr->n; c++) {
            sched_seq *q = &hr->seqs[p * hr->n + c];
            q->prompt = hr->prompt_ids[p];
            q->n_prompt = pl;
            q->max_tokens = (uint32_t)mt;
            q->sampling.temperature = (float)temperature;
            q->sampling.top_p = (float)top_p;
            q->sampling.top_k = top_k > 0 ? (uint32_t)top_k : 0;
            sampler_rng_seed_stream(&q->rng, base_seed, c);
            q->stop = (const char *const *)hr->stops;
            q->n_stop = hr->n_stops;
            q->want_logprobs = hr->logprobs;
            q->top_logprobs = hr->top_logprobs;
            q->want_prompt_logprobs = hr->echo && hr->logprobs;
            q->stream = hr->stream;
            q->ignore_eot = ignore_eos;
            q->lock = &hr->lock;
            q->notify = on_seq_notify;
            q->user = hr;
            atomic_init(&q->cancel, 0);
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Response bodies                                                            */
/* ------------------------------------------------------------------------- */
static const char *finish_str(int f) {
    return f == SCHED_FINISH_STOP ? "\"stop\"" : f == SCHED_FINISH_LENGTH ? "\"length\"" : "null";
}

static void jb_usage(strbuf *b, const http_req *hr) {
    uint64_t p = 0, c = 0;
    for (uint32_t i = 0; i < hr->n_prompts; i++) p += hr->prompt_len[i];
    for (uint32_t i = 0; i < hr->n_seqs; i++) c += hr->seqs[i].n_out;
    strbuf_printf(b, "{\"prompt_tokens\":%" PRIu64 ",\"completion_tokens\":%" PRIu64
              ",\"total_tokens\":%" PRIu64 "}", p, c, p + c);
}

static void jb_token_str(strbuf *b, const server *s, int32_t id) {
    const char *bytes = "";
    size_t n = 0;
    if (id < 0 || tokenizer_token_bytes(s->tok, id, &bytes, &n) != 0) n = 0;
    jb_str(b, bytes, n);
}

static void jb_token_bytes(strbuf *b, const server *s, int32_t id) {
    const char *bytes = "";
    size_t n = 0;
    if (id < 0 || tokenizer_token_bytes(s->tok, id, &bytes, &n) != 0) n = 0;
    strbuf_puts(b, "[");
    for (size_t i = 0; i < n; i++) strbuf_printf(b, i ? ",%u" : "%u", (unsigned char)bytes[i]);
    strbuf_puts(b, "]");
}

/* One logprobs item: a prompt token (prompt_pos >= 0) or generated token. */
typedef struct lp_item {
    int32_t id;
    double lp;           /* NaN = null (first prompt token) */
    const int32_t *top_ids;
    const double *top_lp;
    size_t offset;
} lp_item;

static lp_item item_of(const http_req *hr, const sched_seq *q, uint32_t p,
                       int prompt_pos, uint32_t gen_i, size_t echo_len,
                       size_t *prompt_off) {
    lp_item it;
    uint32_t k = hr->top_logprobs;
    if (prompt_pos >= 0) {
        uint32_t j = (uint32_t)prompt_pos;
        it.id = hr->prompt_ids[p][j];
        it.lp = (j > 0 && q->prompt_logprob) ? q->prompt_logprob[j] : NAN;
        it.top_ids = (j > 0 && q->prompt_top_ids) ? q->prompt_top_ids + (size_t)j * k : NULL;
        it.top_lp = (j > 0 && q->prompt_top_lp) ? q->prompt_top_lp + (size_t)j * k : NULL;
        it.offset = *prompt_off;
        const char *bytes;
        size_t n = 0;
        if (tokenizer_token_bytes(hr->srv->tok, it.id, &bytes, &n) != 0) n = 0;
        *prompt_off += n;
    } else {
        it.id = q->out_tokens[gen_i];
        it.lp = q->out_logprob ? q->out_logprob[gen_i] : NAN;
        it.top_ids = q->out_top_ids ? q->out_top_ids + (size_t)gen_i * k : NULL;
        it.top_lp = q->out_top_lp ? q->out_top_lp + (size_t)gen_i * k : NULL;
        it.offset = echo_len + (gen_i ? q->out_text_end[gen_i - 1] : 0);
    }
    return it;
}

/* Completions logprobs object over (prompt tokens if with_prompt) and
 * generated tokens [g0, g1). */
static void jb_cmpl_logprobs(strbuf *b, const http_req *hr, const sched_seq *q,
                             uint32_t p, int with_prompt, uint32_t g0,
                             uint32_t g1, size_t echo_len) {
    uint32_t np = with_prompt ? hr->prompt_len[p] : 0;
    uint32_t total = np + (g1 - g0), k = hr->top_logprobs;
    static const char *const keys[4] = {"{\"tokens\":[", "],\"token_logprobs\":[",
                                        "],\"top_logprobs\":[", "],\"text_offset\":["};
    for (int pass = 0; pass < 4; pass++) {
        strbuf_puts(b, keys[pass]);
        size_t poff = 0;
        for (uint32_t t = 0; t < total; t++) {
            lp_item it = item_of(hr, q, p, t < np ? (int)t : -1, g0 + (t - np), echo_len, &poff);
            if (t) strbuf_puts(b, ",");
            switch (pass) {
            case 0: jb_token_str(b, hr->srv, it.id); break;
            case 1:
                if (isnan(it.lp)) strbuf_puts(b, "null");
                else jb_dbl(b, it.lp);
                break;
            case 2:
                if (isnan(it.lp)) {
                    strbuf_puts(b, "null");
                    break;
                }
                strbuf_puts(b, "{");
                for (uint32_t j = 0, w = 0; it.top_ids && j < k; j++) {
                    if (it.top_ids[j] < 0) continue;
                    if (w++) strbuf_puts(b, ",");
                    jb_token_str(b, hr->srv, it.top_ids[j]);
                    strbuf_puts(b, ":");
                    jb_dbl(b, it.top_lp[j]);
                }
                strbuf_puts(b, "}");
                break;
            default: strbuf_printf(b, "%zu", it.offset); break;
            }
        }
    }
    strbuf_puts(b, "]}");
}

/* Chat logprobs object over generated tokens [g0, g1). */
static void jb_chat_logprobs(strbuf *b, const http_req *hr, const sched_seq *q,
                             uint32_t g0, uint32_t g1) {
    uint32_t k = hr->top_logprobs;
    strbuf_puts(b, "{\"content\":[");
    for (uint32_t i = g0; i < g1; i++) {
        if (i > g0) strbuf_puts(b, ",");
        int32_t id = q->out_tokens[i];
        strbuf_puts(b, "{\"token\":");
        jb_token_str(b, hr->srv, id);
        strbuf_puts(b, ",\"logprob\":");
        jb_dbl(b, q->out_logprob ? q->out_logprob[i] : 0.0);
        strbuf_puts(b, ",\"bytes\":");
        jb_token_bytes(b, hr->srv, id);
        strbuf_puts(b, ",\"top_logprobs\":[");
        for (uint32_t j = 0, w = 0; q->out_top_ids && j < k; j++) {
            int32_t t = q->out_top_ids[(size_t)i * k + j];
            if (t < 0) continue;
            if (w++) strbuf_puts(b, ",");
            strbuf_puts(b, "{\"token\":");
            jb_token_str(b, hr->srv, t);
            strbuf_puts(b, ",\"logprob\":");
            jb_dbl(b, q->out_top_lp[(size_t)i * k + j]);
            strbuf_puts(b, ",\"bytes\":");
            jb_token_bytes(b, hr->srv, t);
            strbuf_puts(b, "}");
        }
        strbuf_puts(b, "]}");
    }
    strbuf_puts(b, "]}");
}

/* A JSON string made of two byte ranges. */
static void jb_str2(strbuf *b, const char *a, size_t na, const char *c, size_t nc) {
    if (na == 0) {
        jb_str(b, c, nc);
        return;
    }
    if (nc == 0) {
        jb_str(b, a, na);
        return;
    }
    char *t = malloc(na + nc);
    if (!t) {
        b->oom = 1;
        return;
    }
    memcpy(t, a, na);
    memcpy(t + na, c, nc);
    jb_str(b, t, na + nc);
    free(t);
}

static void jb_head(strbuf *b, const http_req *hr, const char *object) {
    strbuf_puts(b, "{\"id\":\"");
    strbuf_puts(b, hr->id);
    strbuf_printf(b, "\",\"object\":\"%s\",\"created\":%ld,\"model\":", object, hr->created);
    jb_cstr(b, hr->srv->model_name);
}

static void build_final(const http_req *hr, strbuf *b) {
    jb_head(b, hr, hr->chat ? "chat.completion" : "text_completion");
    strbuf_puts(b, ",\"choices\":[");
    for (uint32_t i = 0; i < hr->n_seqs; i++) {
        const sched_seq *q = &hr->seqs[i];
        uint32_t p = i / hr->n;
        if (i) strbuf_puts(b, ",");
        strbuf_printf(b, "{\"index\":%u,", i);
        if (hr->chat) {
            strbuf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
            jb_str(b, q->text ? q->text : "", q->text_len);
            strbuf_puts(b, "},\"logprobs\":");
            if (hr->logprobs) jb_chat_logprobs(b, hr, q, 0, q->n_out);
            else strbuf_puts(b, "null");
        } else {
            size_t el = hr->echo ? hr->prompt_text_len[p] : 0;
            strbuf_puts(b, "\"text\":");
            jb_str2(b, hr->echo ? hr->prompt_text[p] : "", el, q->text ? q->text : "", q->text_len);
            strbuf_puts(b, ",\"logprobs\":");
            if (hr->logprobs) jb_cmpl_logprobs(b, hr, q, p, hr->echo, 0, q->n_out, el);
            else strbuf_puts(b, "null");
        }
        strbuf_printf(b, ",\"finish_reason\":%s}", finish_str(q->finish));
    }
    strbuf_puts(b, "],\"usage\":");
    jb_usage(b, hr);
    strbuf_puts(b, "}");
}

/* ------------------------------------------------------------------------- */
/* Streaming                                                                  */
/* ------------------------------------------------------------------------- */
static void sse_begin(strbuf *b, const http_req *hr) {
    strbuf_puts(b, "data: ");
    jb_head(b, hr, hr->chat ? "chat.completion.chunk" : "text_completion");
    strbuf_puts(b, ",\"choices\":[");
}

static void sse_end(strbuf *b, const http_req *hr) {
    strbuf_puts(b, "]");
    if (hr->include_usage) strbuf_puts(b, ",\"usage\":null");
    strbuf_puts(b, "}\n\n");
}

/* One SSE event for choice i: text [t0, t1), logprobs of generated tokens
 * [g0, g1), finish reason (NONE = null). */
static void emit_delta(strbuf *b, const http_req *hr, const sched_seq *q, uint32_t i,
                       uint32_t p, size_t t0, size_t t1, uint32_t g0, uint32_t g1,
                       int fin, size_t echo_len) {
    const char *t = q->text ? q->text + t0 : "";
    size_t n = t1 > t0 ? t1 - t0 : 0;
    sse_begin(b, hr);
    strbuf_printf(b, "{\"index\":%u,", i);
    if (hr->chat) {
        if (n) {
            strbuf_puts(b, "\"delta\":{\"content\":");
            jb_str(b, t, n);
            strbuf_puts(b, "}");
        } else {
            strbuf_puts(b, "\"delta\":{}");
        }
        strbuf_puts(b, ",\"logprobs\":");
        if (hr->logprobs) jb_chat_logprobs(b, hr, q, g0, g1);
        else strbuf_puts(b, "null");
    } else {
        strbuf_puts(b, "\"text\":");
        jb_str(b, t, n);
        strbuf_puts(b, ",\"logprobs\":");
        if (hr->logprobs) jb_cmpl_logprobs(b, hr, q, p, 0, g0, g1, echo_len);
        else strbuf_puts(b, "null");
    }
    strbuf_printf(b, ",\"finish_reason\":%s}", finish_str(fin));
    sse_end(b, hr);
}

/* Append every event that is ready to the output buffer (under hr->lock).
 * Returns 1 when the scheduler should be woken (cancellation). */
static int render_stream(http_req *hr, strbuf *b) {
    int wake = 0, all_finished = 1;
    for (uint32_t i = 0; i < hr->n_seqs; i++) {
        sched_seq *q = &hr->seqs[i];
        stream_state *st = &hr->ss[i];
        uint32_t p = i / hr->n;
        if (st->sent_finish) continue;
        int fin = q->finish;
        if (fin == SCHED_FINISH_ERROR || fin == SCHED_FINISH_CANCELLED) {
            if (!hr->error_sent) {
                api_err e;
                set_err(&e, q->http_status ? (unsigned)q->http_status : 500, NULL, NULL, "%s",
                        q->error[0] ? q->error : "request failed");
                strbuf_puts(b, "data: ");
                jb_error_object(b, &e);
                strbuf_puts(b, "\n\n");
                hr->error_sent = 1;
                cancel_all_seqs_locked(hr);
                wake = 1;
            }
            st->sent_finish = 1;
            continue;
        }
        if (hr->error_sent) {
            if (fin == SCHED_FINISH_NONE) all_finished = 0;
            else st->sent_finish = 1;
            continue;
        }
        size_t echo_len = hr->echo ? hr->prompt_text_len[p] : 0;
        if (!st->sent_first) {
            if (hr->chat) {
                sse_begin(b, hr);
                strbuf_printf(b, "{\"index\":%u,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                          "\"logprobs\":null,\"finish_reason\":null}", i);
                sse_end(b, hr);
                st->sent_first = 1;
            } else if (!hr->echo) {
                st->sent_first = 1;
            } else if (q->n_out > 0 || fin) {
                sse_begin(b, hr);
                strbuf_printf(b, "{\"index\":%u,\"text\":", i);
                jb_str(b, hr->prompt_text[p], echo_len);
                strbuf_puts(b, ",\"logprobs\":");
                if (hr->logprobs) jb_cmpl_logprobs(b, hr, q, p, 1, 0, 0, echo_len);
                else strbuf_puts(b, "null");
                strbuf_puts(b, ",\"finish_reason\":null}");
                sse_end(b, hr);
                st->sent_first = 1;
            } else {
                all_finished = 0;
                continue;
            }
        }
        size_t ready = fin ? q->text_len : q->text_ready;
        if (ready < st->sent_text) ready = st->sent_text;
        /* One event per token (tokens whose bytes end inside a UTF-8
         * character, or add no text, merge into the next event). */
        uint32_t j = st->sent_tokens;
        while (j < q->n_out) {
            size_t end = q->out_text_end[j];
            if (end > ready) break;
            j++;
            int last = fin && j == q->n_out;
            if (!last && (sched_utf8_complete(q->text, end) != end ||
                          (end == st->sent_text && !hr->logprobs)))
                continue;
            emit_delta(b, hr, q, i, p, st->sent_text, end, st->sent_tokens, j,
                       last ? fin : SCHED_FINISH_NONE, echo_len);
            st->sent_text = end;
            st->sent_tokens = j;
            if (last) st->sent_finish = 1;
        }
        if (fin && !st->sent_finish) {
            emit_delta(b, hr, q, i, p, st->sent_text, ready, st->sent_tokens, q->n_out, fin, echo_len);
            st->sent_text = ready;
            st->sent_tokens = q->n_out;
            st->sent_finish = 1;
        }
        if (!fin) all_finished = 0;
    }
    if (all_finished && !hr->stream_done) {
        if (hr->include_usage && !hr->error_sent) {
            strbuf_puts(b, "data: ");
            jb_head(b, hr, hr->chat ? "chat.completion.chunk" : "text_completion");
            strbuf_puts(b, ",\"choices\":[],\"usage\":");
            jb_usage(b, hr);
            strbuf_puts(b, "}\n\n");
        }
        strbuf_puts(b, "data: [DONE]\n\n");
        hr->stream_done = 1;
    }
    return wake;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    http_req *hr = cls;
    int wake = 0;
    pthread_mutex_lock(&hr->lock);
    hr->suspended = 0;
    hr->resume_requested = 0;
    if (hr->ooff == hr->olen) {
        strbuf b = {hr->obuf, 0, hr->ocap, 0};
        wake = render_stream(hr, &b);
        if (b.oom) {
            hr->obuf = b.p;
            hr->ocap = b.cap;
            pthread_mutex_unlock(&hr->lock);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        hr->obuf = b.p;
        hr->ocap = b.cap;
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
    } else if (hr->stream_done) {
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
/* Request handling                                                           */
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

static int auth_ok(server *s, struct MHD_Connection *conn) {
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

static void jb_model_object(strbuf *b, const server *s) {
    strbuf_puts(b, "{\"id\":");
    jb_cstr(b, s->model_name);
    strbuf_printf(b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"orch\",\"max_model_len\":%u}",
           s->created, s->context);
}

static enum MHD_Result answer_get(http_req *hr, const char *url) {
    server *s = hr->srv;
    strbuf b = {0};
    switch (hr->route) {
    case R_HEALTH: {
        int st = atomic_load(&s->state);
        strbuf_puts(&b, st == ST_READY ? "{\"status\":\"ok\"}" : st == ST_LOADING ? "{\"status\":\"loading\"}"
                                                                          : "{\"status\":\"draining\"}");
        return queue_json(hr, st == ST_READY ? 200 : 503, &b);
    }
    case R_MODELS:
        strbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
        jb_model_object(&b, s);
        strbuf_puts(&b, "]}");
        return queue_json(hr, 200, &b);
    case R_MODEL:
        if (strcmp(url + 11, s->model_name) != 0) {
            api_err e;
            set_err(&e, 404, "model", "model_not_found", "the model '%.128s' does not exist", url + 11);
            return queue_error(hr, &e);
        }
        jb_model_object(&b, s);
        return queue_json(hr, 200, &b);
    case R_METRICS: {
        char *text = NULL;
        size_t len = 0;
        if (metrics_render(s->cfg.metrics, &text, &len) != 0) return MHD_NO;
        return queue_body(hr, 200, text, len, METRICS_CONTENT_TYPE);
    }
    default:
        return queue_err(hr, 404, NULL, "not_found", "not found");
    }
}

/* Everything the body allows: submit or answer with an error. */
static enum MHD_Result start_generation(http_req *hr) {
    server *s = hr->srv;
    api_err e;
    if (atomic_load(&s->state) != ST_READY)
        return queue_err(hr, 503, NULL, atomic_load(&s->state) == ST_LOADING ? "model_loading" : "server_draining",
                         atomic_load(&s->state) == ST_LOADING ? "the model is still loading; retry shortly"
                                                              : "the server is shutting down");
    hr->chat = hr->route == R_CHAT;
    if (setup_generation(hr, &e) != 0) return queue_error(hr, &e);
    snprintf(hr->id, sizeof hr->id, "%s-%016" PRIx64, hr->chat ? "chatcmpl" : "cmpl",
             mix64(s->id_salt + atomic_fetch_add(&s->next_id, 1)));
    hr->created = (long)time(NULL);

    sched_seq **ptrs = malloc(hr->n_seqs * sizeof *ptrs);
    if (!ptrs) return queue_err(hr, 500, NULL, NULL, "out of memory");
    for (uint32_t i = 0; i < hr->n_seqs; i++) ptrs[i] = &hr->seqs[i];
    pthread_mutex_lock(&s->watch_mu);
    if (hr->cc) hr->cc->cur = hr;
    pthread_mutex_unlock(&s->watch_mu);
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
    if (rc != SCHED_OK) {
        pthread_mutex_lock(&s->watch_mu);
        if (hr->cc && hr->cc->cur == hr) hr->cc->cur = NULL;
        pthread_mutex_unlock(&s->watch_mu);
        pthread_mutex_lock(&hr->lock);
        hr->refs -= (int)hr->n_seqs;
        hr->submitted = 0;
        pthread_mutex_unlock(&hr->lock);
        if (rc == SCHED_QUEUE_FULL) return queue_err(hr, 429, NULL, "queue_full", err);
        if (rc == SCHED_STOPPED) return queue_err(hr, 503, NULL, "server_draining", err);
        return queue_err(hr, 400, NULL, "invalid_value", err);
    }
    hr->counted = 1;
    atomic_fetch_add(&s->inflight, 1);
    if (hr->stream) {
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
        count_request(s, hr->route, 200);
        return ret;
    }
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
    strbuf b = {0};
    build_final(hr, &b);
    return queue_json(hr, 200, &b);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls) {
    (void)version;
    server *s = cls;
    http_req *hr = *req_cls;
    if (!hr) {
        hr = util_calloc(1, sizeof *hr);
        if (!hr) return MHD_NO;
        hr->srv = s;
        hr->conn = conn;
        hr->refs = 1;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        hr->cc = ci ? (conn_ctx *)ci->socket_context : NULL;
        hr->route = match_route(url);
        *req_cls = hr;
        if (pthread_mutex_init(&hr->lock, NULL) != 0) return MHD_NO;
        hr->lock_init = 1;

        int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
        int is_post = strcmp(method, "POST") == 0;
        int post_route = hr->route == R_COMPLETIONS || hr->route == R_CHAT;
        if (hr->route == R_OTHER) return queue_err(hr, 404, NULL, "not_found", "no such route");
        if (post_route ? !is_post : !is_get) {
            char msg[128];
            snprintf(msg, sizeof msg, "method %.16s is not allowed here (use %s)", method,
                     post_route ? "POST" : "GET");
            return queue_err(hr, 405, NULL, "method_not_allowed", msg);
        }
        if (strncmp(url, "/v1/", 4) == 0 && !auth_ok(s, conn))
            return queue_err(hr, 401, NULL, "invalid_api_key",
                             "missing or invalid API key (send 'Authorization: Bearer KEY')");
        /* GET routes answer on the next call, once the request is complete:
         * a response queued now would make libmicrohttpd close the
         * connection (no keep-alive). */
        if (!post_route) return MHD_YES;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        uint64_t clen = 0;
        if (cl && util_parse_u64(cl, &clen) == 0 && clen > s->cfg.max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "request body of %" PRIu64 " bytes is over the limit of %zu bytes",
                     clen, s->cfg.max_body);
            return queue_err(hr, 413, NULL, "request_too_large", msg);
        }
        return MHD_YES;
    }
    if (hr->responded) { /* an early answer was queued: discard the body */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (hr->too_big || hr->body_len + n > s->cfg.max_body) {
            /* libmicrohttpd accepts a response only before or after the
             * upload: discard the rest, answer 413 at the end. */
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
        memcpy(hr->body + hr->body_len, upload_data, n);
        hr->body_len += n;
        hr->body[hr->body_len] = '\0';
        return MHD_YES;
    }
    if (hr->route != R_COMPLETIONS && hr->route != R_CHAT) return answer_get(hr, url);
    if (hr->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body is over the limit of %zu bytes", s->cfg.max_body);
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

int server_start(const server_config *cfg, server **out, char *err,
                 size_t err_cap) {
    if (!cfg || !out || !cfg->metrics || !cfg->model_name || !*cfg->model_name) {
        util_set_err(err, err_cap, "server: missing configuration (metrics registry, model name)");
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
    server *s = util_calloc(1, sizeof *s);
    if (!s) {
        util_set_err(err, err_cap, "server: out of memory");
        return -1;
    }
    s->cfg = *cfg;
    if (!s->cfg.max_body) s->cfg.max_body = DEFAULT_MAX_BODY;
    if (!s->cfg.http_threads) s->cfg.http_threads = 1;
    if (!s->cfg.max_seqs_per_request) s->cfg.max_seqs_per_request = DEFAULT_MAX_SEQS_PER_REQUEST;
    s->model_name = dup_or_null(cfg->model_name);
    s->api_key = dup_or_null(cfg->api_key);
    s->free_head = UINT32_MAX;
    s->created = (long)time(NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_salt = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid());
    pthread_mutex_init(&s->watch_mu, NULL);
    pthread_mutex_init(&s->sched_mu, NULL);
    s->wfd = epoll_create1(EPOLL_CLOEXEC);
    static const char *const req_labels[2] = {"endpoint", "status"};
    s->m_requests = metrics_counter(cfg->metrics, "orch_requests_total",
                                    "HTTP requests by endpoint and status code.", 2, req_labels);
    s->m_disconnects = metrics_series_get(metrics_counter(cfg->metrics, "orch_client_disconnects_total",
        "Requests cancelled because the client closed its connection.", 0, NULL), NULL);
    if (!s->model_name || s->wfd < 0 || !s->m_requests) {
        util_set_err(err, err_cap, "server: out of resources");
        server_stop(s);
        return -1;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC;
    s->d = MHD_start_daemon(
        flags, cfg->port, NULL, NULL, on_request, s,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(s->cfg.http_threads > 1 ? s->cfg.http_threads : 0),
        MHD_OPTION_END);
    if (!s->d) {
        util_set_err(err, err_cap, "cannot listen on %s:%u: %s", host, (unsigned)cfg->port,
                     errno ? strerror(errno) : "address in use or not allowed");
        server_stop(s);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return 0;
}

uint16_t server_port(const server *s) { return s ? s->port : 0; }

void server_set_ready(server *s, scheduler *sched, const tokenizer *tok,
                      uint32_t vocab_size, uint32_t context) {
    pthread_mutex_lock(&s->sched_mu);
    s->sched = sched;
    pthread_mutex_unlock(&s->sched_mu);
    s->tok = tok;
    s->vocab = vocab_size;
    s->context = context;
    atomic_store(&s->state, ST_READY);
}

void server_drain_begin(server *s) {
    if (!s) return;
    atomic_store(&s->state, ST_DRAINING);
    if (s->d) {
        MHD_socket fd = MHD_quiesce_daemon(s->d);
        if (fd != MHD_INVALID_SOCKET) close(fd);
    }
}

void server_detach_scheduler(server *s) {
    if (!s) return;
    atomic_store(&s->state, ST_DRAINING);
    pthread_mutex_lock(&s->sched_mu);
    s->sched = NULL;
    pthread_mutex_unlock(&s->sched_mu);
}

uint32_t server_inflight(const server *s) {
    return s ? atomic_load(&((server *)s)->inflight) : 0;
}

void server_stop(server *s) {
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    if (s->wfd >= 0) close(s->wfd);
    pthread_mutex_destroy(&s->watch_mu);
    pthread_mutex_destroy(&s->sched_mu);
    free(s->slots);
    free(s->model_name);
    free(s->api_key);
    free(s);
}
