/*
 * http_internal.h - what http.c (routing, headers, bodies, connections,
 * lifecycle) and http_gen.c (a generation request's life: parsing on the
 * worker pool, the scheduler hand-off, streaming, the final answer) share:
 * the server and request objects and the response helpers. Not a public
 * interface: http.h is.
 *
 * A generation request moves through gstate (under hr->lock):
 *   G_BODY      the body is arriving (MHD thread)
 *   G_PARSING   the connection is suspended; a pool job parses the body,
 *               tokenizes, builds the sequences and submits them
 *   G_ERROR     parsing or the submission failed: err is the answer
 *   G_SUBMITTED the scheduler has the sequences (stream, or wait for them)
 *   G_RENDERING the connection is suspended; a pool job renders the answer
 *   G_RENDERED  final holds the answer body
 * Every suspension is resumed exactly once: the party that finds
 * suspended && !resume_requested sets resume_requested and resumes.
 * Memory: a request is reference-counted (refs: MHD's side, a streaming
 * response, each live sequence, a queued pool job); the last unref frees it.
 * Threads: see http.h; fields after `lock` are guarded by it.
 */
#ifndef ORCH_HTTP_INTERNAL_H
#define ORCH_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/conn_watch.h"
#include "orchestrator/serve/http.h"
#include "orchestrator/serve/http_policy.h"
#include "orchestrator/serve/listener.h"
#include "orchestrator/serve/http_front.h"
#include "orchestrator/serve/render.h"
#include "orchestrator/serve/request.h"
#include "orchestrator/serve/work_pool.h"

enum route {
    R_OTHER = 0,
    R_HEALTH,
    R_MODELS,
    R_MODEL,
    R_COMPLETIONS,
    R_CHAT,
    R_METRICS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_FILES,        /* GET list, POST upload (http_files.c) */
    R_FILE,         /* GET, DELETE */
    R_FILE_CONTENT, /* GET */
    R_LORA_LOAD,    /* POST /v1/load_lora_adapter */
    R_LORA_UNLOAD,  /* POST /v1/unload_lora_adapter */
    R_FT_JOBS,      /* GET list, POST create (http_ft.c) */
    R_FT_JOB,       /* GET */
    R_FT_CANCEL,    /* POST */
    R_FT_EVENTS,    /* GET */
    R_FT_CKPTS,     /* GET */
    R_COUNT
};

/* Request methods the routes take. */
enum { HTTP_M_GET = 0, HTTP_M_POST, HTTP_M_DELETE, HTTP_M_OTHER };

/* The fine-tuning routes (http_ft.c). */
static inline int route_is_ft(int route) {
    return route >= R_FT_JOBS && route <= R_FT_CKPTS;
}

/* The files routes (http_files.c). */
static inline int route_is_files(int route) {
    return route == R_FILES || route == R_FILE || route == R_FILE_CONTENT;
}

/* Routes answered to POST with a JSON body (the rest: GET / HEAD). */
static inline int route_is_post(int route) {
    return route == R_COMPLETIONS || route == R_CHAT || route == R_TOKENIZE ||
           route == R_DETOKENIZE || route == R_LORA_LOAD || route == R_LORA_UNLOAD;
}

enum { ST_LOADING = 0, ST_READY = 1, ST_DRAINING = 2 };

enum { G_BODY = 0, G_PARSING, G_ERROR, G_SUBMITTED, G_RENDERING, G_RENDERED };

struct http_server {
    http_server_config cfg;
    char *model_name;
    http_policy policy;
    http_front front; /* the daemon, the listener and the disconnect watch */
    work_pool *pool;
    uint16_t port;
    atomic_int state;
    pthread_mutex_t sched_mu; /* guards sched against http_server_detach_scheduler */
    scheduler *sched;
    const tokenizer *tok;
    uint32_t vocab, context, max_token_bytes;
    const char *arch;        /* architecture for /v1/models (static; NULL: loading) */
    grammar_cache *grammars; /* structured output (set with the tokenizer) */
    /* chat template (borrowed; request_limits) */
    const chat_template *chat_template;
    const char *chat_error;
    atomic_uint inflight;
    atomic_ullong next_id;
    uint64_t id_salt;
    long created;
    atomic_size_t body_held; /* bytes reserved by request bodies in flight */

    metrics_family *m_requests;
    metrics_series *m_disconnects;

    /* set while the model loads (http_server_set_coserve / _set_finetune),
     * read by the HTTP and worker threads: atomic */
    _Atomic(coserve *) coserve_p;
    _Atomic(ft_jobs *) jobs_p;
    _Atomic(struct ft_runner *) runner_p;
    _Atomic(const char *) ft_disabled_p;
};

static inline coserve *srv_coserve(http_server *s) { return atomic_load(&s->coserve_p); }
static inline ft_jobs *srv_jobs(http_server *s) { return atomic_load(&s->jobs_p); }
static inline struct ft_runner *srv_runner(http_server *s) {
    return atomic_load(&s->runner_p);
}

/* The socket context of an MHD connection. */
typedef http_front_conn http_conn;

typedef struct http_req {
    http_server *srv;
    struct MHD_Connection *conn;
    http_conn *hc;
    int route;
    const char *cors; /* Access-Control-Allow-Origin to send, or NULL */
    int preflight;    /* an allowed CORS preflight: 204 at the end */
    int close_after;  /* answer with Connection: close */
    char *body;
    size_t body_len, body_cap;
    size_t reserved; /* bytes of srv->body_held this request holds */
    int too_big;     /* the body went over the limit: 413 after the upload */
    int over_budget; /* the bodies in flight went over their memory cap: 503 */
    int responded;
    int method;                 /* HTTP_M_* */
    int has_body;               /* a POST route whose body is read (JSON, or an upload) */
    struct http_upload *upload; /* POST /v1/files (http_files.c) */
    work_item job;

    uint32_t adapter; /* held LoRA adapter (coserve_resolve), released at free */
    /* generation request */
    pthread_mutex_t lock; /* guards what follows and the sequences' outputs */
    int lock_init;
    int refs;
    int counted; /* in http_server_inflight (accepted by the scheduler) */
    int suspended, resume_requested;
    int gstate;
    int submitted;
    uint32_t n_seqs, n_done;
    sched_seq *seqs;
    gen_request req;
    api_error err; /* G_ERROR */
    strbuf final;  /* G_RENDERED */
    render_stream rs;
    char id[48];
    long created;
    /* SSE output buffer */
    char *obuf;
    size_t olen, ooff, ocap;
} http_req;

/* ---- http.c ---- */
void http_count_request(http_server *s, int route, unsigned status);
/* Queue `body` (malloc'd, taken over) with status (CORS, Retry-After for 429
 * and 503, Allow for 405, Connection: close when asked). */
enum MHD_Result http_queue_body(http_req *hr, unsigned status, char *body, size_t len,
                                const char *ctype);
enum MHD_Result http_queue_json(http_req *hr, unsigned status, strbuf *b);
enum MHD_Result http_queue_error(http_req *hr, const api_error *e);
enum MHD_Result http_queue_err(http_req *hr, unsigned status, const char *param,
                               const char *code, const char *msg);
/* CORS headers of hr on r. */
void http_add_cors(const http_req *hr, struct MHD_Response *r);
/* The answer to a body that went over the limit (413) or over the memory of
 * bodies in flight (503): hr->too_big or hr->over_budget is set. */
enum MHD_Result http_body_refused(http_req *hr);
/* Give back the body's memory. */
void http_body_release(http_req *hr);
/* Drop one reference (frees at zero) / free (refs already at zero). */
void http_req_unref(http_req *hr);
void http_req_free(http_req *hr);
/* Resume hr's connection when it is suspended and nobody else resumes it. */
void http_req_resume(http_req *hr);
/* Suspend hr's connection (under hr->lock). */
void http_req_suspend_locked(http_req *hr);

/* ---- http_files.c ---- */
/* First call of a files route (headers checked): start an upload. */
enum MHD_Result http_files_begin(http_req *hr);
/* A piece of an upload's body. */
enum MHD_Result http_files_take(http_req *hr, const char *data, size_t n);
/* The request is complete: answer it. */
enum MHD_Result http_files_answer(http_req *hr, const char *url);
/* The request is over (any outcome): drop an unfinished upload. */
void http_files_done(http_req *hr);

/* ---- http_ft.c ---- */
/* A fine-tuning route, the request complete (the create body read). */
enum MHD_Result http_ft_answer(http_req *hr, const char *url);

/* ---- http_gen.c ---- */
/* request_limits.model_known over the server's adapters. */
int http_model_known(void *arg, const char *name);
/* The final handler call of a POST route (the body is complete). */
enum MHD_Result http_gen_step(http_req *hr);
/* Cancel hr's sequences (the request completed early or the client left);
 * returns 1 when the scheduler should look at the cancel flags. */
int http_gen_cancel_locked(http_req *hr);

#endif
