/*
 * http_gen.c - one generation request over HTTP: the body parsed and
 * tokenized on the worker pool, the sequences handed to the scheduler, the
 * answer streamed as SSE or rendered (on the pool) once every sequence is
 * done. See http_internal.h for the states, http.h for the behaviour.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/core/rng.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/http_internal.h"
#include "orchestrator/serve/tokenize_api.h"

/* rng_splitmix64 of a value (request ids, default seeds). */
static uint64_t splitmix_of(uint64_t z) { return rng_splitmix64(&z); }

#define HR_OF(item) ((http_req *)((char *)(item)-offsetof(http_req, job)))

static void wake_scheduler(http_server *s) {
    pthread_mutex_lock(&s->sched_mu);
    if (s->sched) scheduler_wake(s->sched);
    pthread_mutex_unlock(&s->sched_mu);
}

int http_gen_cancel_locked(http_req *hr) {
    if (!hr->submitted || hr->n_done >= hr->n_seqs) return 0;
    for (uint32_t i = 0; i < hr->n_seqs; i++) atomic_store(&hr->seqs[i].cancel, 1);
    return 1;
}

static gen_response response_of(const http_req *hr) {
    gen_response r = { .req = &hr->req,
                       .seqs = hr->seqs,
                       .tok = hr->srv->tok,
                       .model = hr->req.model[0] ? hr->req.model : hr->srv->model_name,
                       .id = hr->id,
                       .created = hr->created };
    return r;
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
    if (left == 0) http_req_free(hr);
}

/* ------------------------------------------------------------------------- */
/* Parsing and submission (pool)                                              */
/* ------------------------------------------------------------------------- */
/* Parse the body and build the sequences. */
static int setup_generation(http_req *hr, api_error *e) {
    http_server *s = hr->srv;
    request_limits lim = { .tok = s->tok,
                           .model_name = s->model_name,
                           .vocab = s->vocab,
                           .context = s->context,
                           .max_seqs = s->cfg.max_seqs_per_request,
                           .max_token_bytes = s->max_token_bytes,
                           .grammars = s->grammars,
                           .chat_template = s->chat_template,
                           .chat_error = s->chat_error,
                           .model_known = srv_coserve(s) ? http_model_known : NULL,
                           .model_known_arg = s };
    if (gen_request_parse(&lim, hr->route == R_CHAT, hr->body, hr->body_len, &hr->req,
                          e) != 0)
        return -1;
    if (hr->req.model[0] && strcmp(hr->req.model, s->model_name) != 0 &&
        coserve_resolve(srv_coserve(s), hr->req.model, &hr->adapter) != 0) {
        api_error_set(e, 404, "model", "model_not_found",
                      "the model '%.128s' does not exist (unloaded)", hr->req.model);
        e->type = "invalid_request_error";
        return -1;
    }
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
        q->adapter_id = hr->adapter;
        atomic_init(&q->cancel, 0);
    }
    snprintf(hr->id, sizeof hr->id, "%s-%016" PRIx64, hr->req.chat ? "chatcmpl" : "cmpl",
             splitmix_of(s->id_salt + atomic_fetch_add(&s->next_id, 1)));
    hr->created = (long)time(NULL);
    return 0;
}

/* Hand the sequences to the scheduler; 0, or -1 with the refusal in *e. */
static int submit(http_req *hr, api_error *e) {
    http_server *s = hr->srv;
    sched_seq **ptrs = malloc(hr->n_seqs * sizeof *ptrs);
    if (!ptrs) return api_error_set(e, 500, NULL, NULL, "out of memory");
    for (uint32_t i = 0; i < hr->n_seqs; i++) ptrs[i] = &hr->seqs[i];
    conn_watch_set_request(s->front.watch, hr->hc ? hr->hc->cc : NULL, hr);
    pthread_mutex_lock(&hr->lock);
    hr->refs += (int)hr->n_seqs;
    hr->submitted = 1;
    hr->gstate = G_SUBMITTED; /* a notify may resume the connection at once */
    pthread_mutex_unlock(&hr->lock);
    char err[256];
    pthread_mutex_lock(&s->sched_mu);
    int rc = SCHED_STOPPED;
    snprintf(err, sizeof err, "the server is shutting down");
    if (s->sched) rc = scheduler_submit(s->sched, ptrs, hr->n_seqs, err, sizeof err);
    pthread_mutex_unlock(&s->sched_mu);
    free(ptrs);
    if (rc == SCHED_OK) {
        pthread_mutex_lock(&hr->lock);
        hr->counted = 1;
        pthread_mutex_unlock(&hr->lock);
        atomic_fetch_add(&s->inflight, 1);
        return 0;
    }
    conn_watch_clear_request(s->front.watch, hr->hc ? hr->hc->cc : NULL, hr);
    pthread_mutex_lock(&hr->lock);
    hr->refs -= (int)hr->n_seqs;
    hr->submitted = 0;
    pthread_mutex_unlock(&hr->lock);
    if (rc == SCHED_QUEUE_FULL)
        return api_error_set(e, 429, NULL, "queue_full", "%s", err);
    if (rc == SCHED_STOPPED)
        return api_error_set(e, 503, NULL, "server_draining", "%s", err);
    if (rc == SCHED_TOO_MANY)
        return api_error_set(e, 400, "n", "invalid_value", "%s", err);
    return api_error_set(e, 400, NULL, "invalid_value", "%s", err);
}

/* A pool job that rendered its whole answer (rc 0: b) or failed (e):
 * hand it to the connection and drop the job's reference. */
static void job_answered(http_req *hr, int rc, strbuf *b, const api_error *e) {
    http_body_release(hr);
    pthread_mutex_lock(&hr->lock);
    if (rc == 0) {
        hr->final = *b;
        hr->gstate = G_RENDERED;
    } else {
        free(b->p);
        hr->err = *e;
        hr->gstate = G_ERROR;
    }
    pthread_mutex_unlock(&hr->lock);
    http_req_resume(hr);
    http_req_unref(hr); /* the job's reference */
}

/* /tokenize and /detokenize: the whole answer, rendered here. */
static void tokenize_job(http_req *hr) {
    http_server *s = hr->srv;
    tokenize_api_limits lim = { .tok = s->tok,
                                .model_name = s->model_name,
                                .context = s->context };
    api_error e;
    strbuf b = { 0 };
    int rc = hr->route == R_TOKENIZE
                 ? tokenize_api_tokenize(&lim, hr->body, hr->body_len, &b, &e)
                 : tokenize_api_detokenize(&lim, hr->body, hr->body_len, &b, &e);
    job_answered(hr, rc, &b, &e);
}

int http_model_known(void *arg, const char *name) {
    http_server *s = arg;
    uint32_t id = 0;
    if (!srv_coserve(s) || coserve_resolve(srv_coserve(s), name, &id) != 0) return 0;
    coserve_release(srv_coserve(s), id);
    return 1;
}

/* POST /v1/load_lora_adapter, /v1/unload_lora_adapter: the answer, after
 * the scheduler thread ran the task. */
static void lora_job(http_req *hr) {
    http_server *s = hr->srv;
    api_error e;
    strbuf b = { 0 };
    int rc;
    if (!srv_coserve(s))
        rc = api_error_set(&e, 404, NULL, "not_found", "this server serves no adapters");
    else if (hr->route == R_LORA_LOAD)
        rc = coserve_load_request(srv_coserve(s), hr->body, hr->body_len, 60.0, &b, &e);
    else
        rc = coserve_unload_request(srv_coserve(s), hr->body, hr->body_len, 60.0, &b, &e);
    job_answered(hr, rc, &b, &e);
}

static void parse_job(work_item *item) {
    http_req *hr = HR_OF(item);
    if (hr->route == R_TOKENIZE || hr->route == R_DETOKENIZE) {
        tokenize_job(hr);
        return;
    }
    if (hr->route == R_LORA_LOAD || hr->route == R_LORA_UNLOAD) {
        lora_job(hr);
        return;
    }
    api_error e;
    int rc = setup_generation(hr, &e);
    http_body_release(hr); /* parsed: the body is not needed any more */
    if (rc == 0) rc = submit(hr, &e);
    if (rc != 0) {
        pthread_mutex_lock(&hr->lock);
        hr->err = e;
        hr->gstate = G_ERROR;
        pthread_mutex_unlock(&hr->lock);
    }
    http_req_resume(hr);
    http_req_unref(hr); /* the job's reference */
}

static void render_job(work_item *item) {
    http_req *hr = HR_OF(item);
    strbuf b = { 0 };
    gen_response r = response_of(hr); /* every sequence finished */
    render_final(&b, &r);
    pthread_mutex_lock(&hr->lock);
    hr->final = b;
    hr->gstate = G_RENDERED;
    pthread_mutex_unlock(&hr->lock);
    http_req_resume(hr);
    http_req_unref(hr);
}

/* Suspend the connection and run fn on the pool (moving to state). */
static enum MHD_Result to_pool(http_req *hr, int state, void (*fn)(work_item *)) {
    pthread_mutex_lock(&hr->lock);
    hr->gstate = state;
    hr->refs++; /* the job's */
    http_req_suspend_locked(hr);
    pthread_mutex_unlock(&hr->lock);
    hr->job.fn = fn;
    if (work_pool_submit(hr->srv->pool, &hr->job) != 0) fn(&hr->job); /* stopping */
    return MHD_YES;
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
        if (render_stream_events(&b, &r, &hr->rs)) /* a sequence failed */
            wake = http_gen_cancel_locked(hr);
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
        http_req_suspend_locked(hr);
        ret = 0;
    }
    pthread_mutex_unlock(&hr->lock);
    if (wake) wake_scheduler(hr->srv);
    return ret;
}

static void stream_free(void *cls) { http_req_unref(cls); }

/* Answer 200 now with a body read from the scheduler's output. */
static enum MHD_Result start_stream(http_req *hr) {
    struct MHD_Response *r = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, hr, stream_free);
    if (!r) return MHD_NO; /* the completed callback cancels */
    pthread_mutex_lock(&hr->lock);
    hr->refs++; /* held by the response until stream_free */
    pthread_mutex_unlock(&hr->lock);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    http_add_cors(hr, r);
    enum MHD_Result ret = MHD_queue_response(hr->conn, 200, r);
    MHD_destroy_response(r);
    hr->responded = 1;
    http_count_request(hr->srv, hr->route, 200);
    return ret;
}

/* ------------------------------------------------------------------------- */
/* Non-streaming answers                                                      */
/* ------------------------------------------------------------------------- */
/* Suspend until every sequence is done, then render the answer on the pool
 * (or answer a failure at once). */
static enum MHD_Result finish_or_wait(http_req *hr) {
    pthread_mutex_lock(&hr->lock);
    if (hr->n_done < hr->n_seqs) {
        http_req_suspend_locked(hr);
        pthread_mutex_unlock(&hr->lock);
        return MHD_YES;
    }
    pthread_mutex_unlock(&hr->lock);
    /* all sequences are finished: the scheduler no longer writes them */
    for (uint32_t i = 0; i < hr->n_seqs; i++) {
        const sched_seq *q = &hr->seqs[i];
        if (q->finish == SCHED_FINISH_CANCELLED && q->http_status == 499) {
            http_count_request(hr->srv, hr->route, 499);
            hr->responded = 1;
            return MHD_NO; /* the client is gone: close */
        }
        if (q->finish == SCHED_FINISH_ERROR || q->finish == SCHED_FINISH_CANCELLED) {
            unsigned st = q->http_status ? (unsigned)q->http_status : 500;
            return http_queue_err(hr, st, NULL, st == 503 ? "server_draining" : NULL,
                                  q->error[0] ? q->error : "request failed");
        }
    }
    return to_pool(hr, G_RENDERING, render_job);
}

enum MHD_Result http_gen_step(http_req *hr) {
    http_server *s = hr->srv;
    pthread_mutex_lock(&hr->lock);
    hr->suspended = 0;
    hr->resume_requested = 0;
    int st = hr->gstate;
    if (st == G_PARSING || st == G_RENDERING) {
        /* resumed while a job runs (not expected): the job resumes again */
        http_req_suspend_locked(hr);
        pthread_mutex_unlock(&hr->lock);
        return MHD_YES;
    }
    pthread_mutex_unlock(&hr->lock);
    switch (st) {
    case G_BODY: {
        int state = atomic_load(&s->state);
        if (state != ST_READY)
            return http_queue_err(
                hr, 503, NULL, state == ST_LOADING ? "model_loading" : "server_draining",
                state == ST_LOADING ? "the model is still loading; retry shortly"
                                    : "the server is shutting down");
        return to_pool(hr, G_PARSING, parse_job);
    }
    case G_ERROR: return http_queue_error(hr, &hr->err);
    case G_SUBMITTED:
        if (hr->req.stream) return start_stream(hr);
        return finish_or_wait(hr);
    default: { /* G_RENDERED */
        strbuf b = hr->final;
        hr->final = (strbuf){ 0 };
        return http_queue_json(hr, 200, &b);
    }
    }
}
