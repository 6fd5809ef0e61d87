/*
 * scheduler.c - continuous batching with chunked prefill, paged KV blocks,
 * preemption by recomputation and sampling, on one thread that owns the
 * engine context; what a sequence produces (tokens, text, stops) is written
 * by seq_output.c. See scheduler.h.
 */
#include "orchestrator/serve/scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/core/util.h"
#include "orchestrator/serve/prefix_cache.h"
#include "orchestrator/serve/seq_output.h"

enum { ST_NEW = 0, ST_WAITING = 1, ST_RUNNING = 2, ST_DONE = 3 };

struct scheduler {
    scheduler_config cfg;
    block_manager *bm;
    prefix_cache *pc; /* NULL with no_prefix_cache */
    int32_t *match;   /* [blocks of one context]: lookup results */
    int can_fork;     /* pc and the engine copies blocks (n > 1 choices fork) */
    int32_t *copy_src, *copy_dst; /* copy-on-write pairs of this iteration */
    uint32_t n_copies;
    uint64_t n_picks; /* admission rounds (pick_iter stamps) */
    pthread_t thread;
    int thread_started;

    /* shared with submitters, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sched_seq *inbox_head, *inbox_tail;
    int stop;
    int wake_flag;
    int sleeping;
    uint64_t next_arrival;
    int cancel_all;
    int cancel_all_status;
    char cancel_all_msg[256];
    atomic_int accepting;
    atomic_uint n_waiting; /* inbox + waiting list */
    atomic_uint n_active;  /* submitted, not finished */

    /* scheduler thread only */
    sched_seq **running;
    uint32_t n_running;
    sched_seq *wait_head, *wait_tail;
    sched_seq *fin_head, *fin_tail; /* finished, not yet notified */
    orch_seq_input *inputs;
    sched_seq **batch;
    uint32_t *batch_rows; /* logits rows of entry i */
    float *logits;
    uint64_t logits_cap; /* floats */
    uint32_t rows_cap;
    sampler_ws *ws;

    /* stats */
    atomic_uint st_running, st_waiting, st_kv_used;
    atomic_ullong st_preempt, st_iter, st_errors;
    atomic_uint st_cached, st_evictable;
    atomic_ullong st_hit_tokens, st_hits, st_misses;
    uint64_t evictions_reported;

    /* metrics (NULL without a registry: updates are no-ops) */
    metrics_series *m_running, *m_waiting, *m_kv_used, *m_kv_total;
    metrics_series *m_prompt_tokens, *m_gen_tokens, *m_preempt, *m_errors;
    metrics_series *m_shared; /* engine calls carrying inference and fine-tuning */
    metrics_series *m_ttft, *m_tpot, *m_e2e, *m_batch_seqs, *m_batch_tokens;
    metrics_series *m_iter_seconds;
    metrics_series *m_pc_hits, *m_pc_misses, *m_pc_hit_tokens, *m_pc_evictions;
    metrics_series *m_pc_blocks, *m_pc_evictable;
    metrics_series *m_forced; /* jump-forward tokens (structured output) */

    /* co-serving (cfg.coserve), scheduler thread only */
    orch_finetune_batch ft[SCHED_MAX_FINETUNE_BATCHES];
    float ft_losses[SCHED_MAX_FINETUNE_BATCHES];
    int ft_pending; /* the last tasks() said fine-tuning work is pending */
};

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */
static void wait_push_back(scheduler *s, sched_seq *q) {
    q->priv.prev = s->wait_tail;
    q->priv.next = NULL;
    if (s->wait_tail)
        s->wait_tail->priv.next = q;
    else
        s->wait_head = q;
    s->wait_tail = q;
}

static void wait_push_front(scheduler *s, sched_seq *q) {
    q->priv.prev = NULL;
    q->priv.next = s->wait_head;
    if (s->wait_head)
        s->wait_head->priv.prev = q;
    else
        s->wait_tail = q;
    s->wait_head = q;
}

static void wait_remove(scheduler *s, sched_seq *q) {
    if (q->priv.prev)
        q->priv.prev->priv.next = q->priv.next;
    else
        s->wait_head = q->priv.next;
    if (q->priv.next)
        q->priv.next->priv.prev = q->priv.prev;
    else
        s->wait_tail = q->priv.prev;
    q->priv.prev = q->priv.next = NULL;
}

/* Release q's KV blocks (t->n = 0); cached ones stay in the pool. */
static void release_blocks(scheduler *s, sched_seq *q) {
    if (s->pc)
        prefix_cache_release_table(s->pc, &q->priv.blocks);
    else
        block_table_release(s->bm, &q->priv.blocks);
    q->priv.n_hashed = 0;
}

/* Finish q (already out of the running array / waiting list). */
static void seq_finish(scheduler *s, sched_seq *q, int reason, int status,
                       const char *msg) {
    release_blocks(s, q);
    block_table_free(s->bm, &q->priv.blocks); /* the id array */
    free(q->priv.all);
    q->priv.all = NULL;
    q->priv.n_all = q->priv.cap_all = 0;
    q->priv.state = ST_DONE;
    double now = util_now();
    pthread_mutex_lock(q->lock);
    q->finish = reason;
    q->http_status = status;
    if (msg) util_set_err(q->error, sizeof q->error, "%s", msg);
    q->text_ready = q->text_len;
    q->t_done = now;
    uint32_t n_out = q->n_out;
    double t_first = q->t_first_token;
    pthread_mutex_unlock(q->lock);
    if (reason == SCHED_FINISH_STOP || reason == SCHED_FINISH_LENGTH) {
        metrics_histogram_observe(s->m_e2e, now - q->t_submit);
        if (n_out > 1)
            metrics_histogram_observe(s->m_tpot, (now - t_first) / (double)(n_out - 1));
    }
    /* Notified later (flush_finished), once no scheduler structure points
     * at q any more: the caller may free it from inside notify. */
    q->priv.prev = NULL;
    q->priv.next = NULL;
    if (s->fin_tail)
        s->fin_tail->priv.next = q;
    else
        s->fin_head = q;
    s->fin_tail = q;
}

/* Tell the owners of finished sequences (after compact_running). */
static void flush_finished(scheduler *s) {
    sched_seq *q = s->fin_head;
    s->fin_head = s->fin_tail = NULL;
    while (q) {
        sched_seq *next = q->priv.next;
        atomic_fetch_sub(&s->n_active, 1);
        q->notify(q, 1);
        q = next;
    }
}

static int grow(void **p, size_t elem, uint32_t need, uint32_t *cap) {
    if (need <= *cap) return 0;
    uint32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *n = realloc(*p, (size_t)c * elem);
    if (!n) return -1;
    *p = n;
    *cap = c;
    return 0;
}

/* Append one id to q->priv.all. */
static int all_push(sched_seq *q, int32_t tok) {
    if (grow((void **)&q->priv.all, sizeof(int32_t), q->priv.n_all + 1,
             &q->priv.cap_all) != 0)
        return -1;
    q->priv.all[q->priv.n_all++] = tok;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Creation, submission, shutdown                                             */
/* ------------------------------------------------------------------------- */
static void *sched_main(void *arg);

static void register_metrics(scheduler *s) {
    metrics_registry *r = s->cfg.metrics;
    if (!r) return;
    static const double ttft_b[] = { .001, .0025, .005, .01, .025, .05, .1,
                                     .25,  .5,    1,    2.5, 5,    10,  30 };
    static const double tpot_b[] = { .0005, .001, .0025, .005, .01, .025,
                                     .05,   .1,   .25,   .5,   1,   2.5 };
    static const double e2e_b[] = { .005, .01, .025, .05, .1, .25, .5,
                                    1,    2.5, 5,    10,  30, 60,  120 };
    static const double batch_b[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512 };
    static const double tok_b[] = { 1, 4, 16, 64, 256, 1024, 4096, 16384 };
    static const double iter_b[] = { .0001, .00025, .0005, .001, .0025, .005,
                                     .01,   .025,   .05,   .1,   .25,   1 };
#define SERIES(fam) metrics_series_get((fam), NULL)
    s->m_running = SERIES(
        metrics_gauge(r, "orch_requests_running",
                      "Sequences currently scheduled (holding KV blocks).", 0, NULL));
    s->m_waiting = SERIES(metrics_gauge(r, "orch_requests_waiting",
                                        "Sequences waiting to be scheduled.", 0, NULL));
    s->m_kv_used = SERIES(
        metrics_gauge(r, "orch_kv_blocks_used", "KV cache blocks in use.", 0, NULL));
    s->m_kv_total =
        SERIES(metrics_gauge(r, "orch_kv_blocks_capacity",
                             "KV cache blocks in the pool (capacity).", 0, NULL));
    s->m_prompt_tokens = SERIES(metrics_counter(
        r, "orch_prompt_tokens_total", "Prompt tokens of accepted sequences.", 0, NULL));
    s->m_gen_tokens = SERIES(
        metrics_counter(r, "orch_generation_tokens_total", "Generated tokens.", 0, NULL));
    s->m_preempt = SERIES(metrics_counter(
        r, "orch_preemptions_total",
        "Sequences preempted because the KV pool ran out (recomputed later).", 0, NULL));
    s->m_errors = SERIES(metrics_counter(
        r, "orch_engine_errors_total",
        "Engine forward calls that failed (their sequences got HTTP 500).", 0, NULL));
    s->m_shared = SERIES(metrics_counter(
        r, "orch_coserve_shared_passes_total",
        "Engine calls that carried inference and fine-tuning work in one pass.", 0,
        NULL));
    s->m_ttft =
        SERIES(metrics_histogram(r, "orch_time_to_first_token_seconds",
                                 "Time from submission to the first generated token.", 0,
                                 NULL, ttft_b, sizeof ttft_b / sizeof *ttft_b));
    s->m_tpot = SERIES(
        metrics_histogram(r, "orch_time_per_output_token_seconds",
                          "Mean time per generated token after the first, per sequence.",
                          0, NULL, tpot_b, sizeof tpot_b / sizeof *tpot_b));
    s->m_e2e = SERIES(metrics_histogram(
        r, "orch_e2e_request_latency_seconds",
        "Time from submission to the last token, per completed sequence.", 0, NULL, e2e_b,
        sizeof e2e_b / sizeof *e2e_b));
    s->m_batch_seqs = SERIES(metrics_histogram(
        r, "orch_batch_size", "Sequences per scheduler iteration (engine forward).", 0,
        NULL, batch_b, sizeof batch_b / sizeof *batch_b));
    s->m_batch_tokens = SERIES(metrics_histogram(
        r, "orch_batch_tokens", "Tokens per scheduler iteration (decode + prefill).", 0,
        NULL, tok_b, sizeof tok_b / sizeof *tok_b));
    s->m_iter_seconds =
        SERIES(metrics_histogram(r, "orch_iteration_seconds",
                                 "Wall time of one scheduler iteration's engine forward.",
                                 0, NULL, iter_b, sizeof iter_b / sizeof *iter_b));
    if (s->pc) {
        s->m_pc_hits = SERIES(metrics_counter(
            r, "orch_prefix_cache_hits_total",
            "Sequence admissions that reused at least one cached KV block.", 0, NULL));
        s->m_pc_misses = SERIES(metrics_counter(
            r, "orch_prefix_cache_misses_total",
            "Sequence admissions that found no cached KV block.", 0, NULL));
        s->m_pc_hit_tokens = SERIES(metrics_counter(
            r, "orch_prefix_cache_hit_tokens_total",
            "Tokens whose KV was reused from the prefix cache instead of computed.", 0,
            NULL));
        s->m_pc_evictions = SERIES(metrics_counter(
            r, "orch_prefix_cache_evictions_total",
            "Cached KV blocks evicted to make room (least recently used leaves).", 0,
            NULL));
        s->m_pc_blocks = SERIES(metrics_gauge(
            r, "orch_prefix_cache_blocks",
            "KV blocks indexed by the prefix cache (in use or evictable).", 0, NULL));
        s->m_pc_evictable = SERIES(metrics_gauge(
            r, "orch_prefix_cache_evictable_blocks",
            "Cached KV blocks no sequence uses (kept until the pool needs them).", 0,
            NULL));
    }
    s->m_forced = SERIES(metrics_counter(
        r, "orch_jump_forward_tokens_total",
        "Tokens appended without a sampling step because the output grammar forced them.",
        0, NULL));
#undef SERIES
    metrics_gauge_set(s->m_kv_total, block_manager_total(s->bm));
    metrics_gauge_set(s->m_kv_used, 0);
    metrics_gauge_set(s->m_running, 0);
    metrics_gauge_set(s->m_waiting, 0);
}

int scheduler_create(const scheduler_config *cfg, scheduler **out, char *err,
                     size_t err_cap) {
    if (!cfg || !cfg->engine || !cfg->ctx || !cfg->tok || !out) {
        util_set_err(err, err_cap, "scheduler: missing engine, context or tokenizer");
        return -1;
    }
    scheduler_config c = *cfg;
    if (c.block_size == 0) c.block_size = ORCH_KV_BLOCK_TOKENS;
    if (c.max_seqs == 0 || c.max_batch_tokens == 0 || c.vocab_size == 0 ||
        c.context == 0) {
        util_set_err(
            err, err_cap,
            "scheduler: max_seqs, max_batch_tokens, vocab and context must be > 0");
        return -1;
    }
    if (c.max_batch_tokens < c.max_seqs) {
        util_set_err(err, err_cap,
                     "--max-batch-tokens (%u) must be at least --max-seqs (%u)",
                     c.max_batch_tokens, c.max_seqs);
        return -1;
    }
    uint32_t per_ctx = (c.context + c.block_size - 1) / c.block_size;
    if (c.num_blocks < per_ctx) {
        util_set_err(err, err_cap,
                     "KV pool of %u blocks is too small: one sequence of the "
                     "full context (%u tokens) needs %u blocks of %u",
                     c.num_blocks, c.context, per_ctx, c.block_size);
        return -1;
    }
    scheduler *s = util_calloc(1, sizeof *s);
    if (!s) {
        util_set_err(err, err_cap, "scheduler: out of memory");
        return -1;
    }
    s->cfg = c;
    s->rows_cap = c.max_seqs + SCHED_PROMPT_LOGPROB_ROWS;
    s->logits_cap = (uint64_t)s->rows_cap * c.vocab_size;
    s->bm = block_manager_create(c.num_blocks, c.block_size);
    if (s->bm && !c.no_prefix_cache) s->pc = prefix_cache_create(s->bm);
    s->match = util_calloc(per_ctx, sizeof *s->match);
    s->copy_src = util_calloc(c.max_seqs, sizeof *s->copy_src);
    s->copy_dst = util_calloc(c.max_seqs, sizeof *s->copy_dst);
    s->can_fork = s->pc && c.engine->api->kv_copy_blocks &&
                  (c.engine->api->capabilities & ORCH_CAP_KV_COPY);
    s->running = util_calloc(c.max_seqs, sizeof *s->running);
    s->inputs = util_calloc(c.max_seqs, sizeof *s->inputs);
    s->batch = util_calloc(c.max_seqs, sizeof *s->batch);
    s->batch_rows = util_calloc(c.max_seqs, sizeof *s->batch_rows);
    s->logits = malloc(s->logits_cap * sizeof(float));
    s->ws = sampler_ws_create(c.vocab_size);
    if (!s->bm || (!c.no_prefix_cache && !s->pc) || !s->match || !s->copy_src ||
        !s->copy_dst || !s->running || !s->inputs || !s->batch || !s->batch_rows ||
        !s->logits || !s->ws) {
        util_set_err(err, err_cap, "scheduler: out of memory (logits for %u rows of %u)",
                     s->rows_cap, c.vocab_size);
        scheduler_destroy(s);
        return -1;
    }
    int32_t st = c.engine->api->kv_configure(c.ctx, c.block_size, c.num_blocks);
    if (st != ORCH_OK) {
        char msg[512];
        engine_format_error(c.engine, c.ctx, st, msg, sizeof msg);
        util_set_err(err, err_cap, "KV pool of %u blocks: %s", c.num_blocks, msg);
        scheduler_destroy(s);
        return -1;
    }
    /* Warm-up: one forward of one token (block 0), so a broken engine fails
     * here instead of on the first request, and lazy engine set-up (kernel
     * loading, thread pools) happens before traffic arrives. */
    {
        int32_t tok0 = 0, blk0 = 0;
        orch_seq_input in;
        memset(&in, 0, sizeof in);
        in.tokens = &tok0;
        in.n_tokens = 1;
        in.block_table = &blk0;
        in.n_blocks = 1;
        in.logits_mode = ORCH_LOGITS_LAST;
        orch_infer_batch b = {
            .struct_size = sizeof b, .n_seqs = 1, .seq_stride = sizeof in, .seqs = &in
        };
        st = c.engine->api->infer_forward(c.ctx, &b, s->logits, s->logits_cap);
        if (st != ORCH_OK) {
            char msg[512];
            engine_format_error(c.engine, c.ctx, st, msg, sizeof msg);
            util_set_err(err, err_cap, "engine warm-up forward failed: %s", msg);
            scheduler_destroy(s);
            return -1;
        }
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->accepting, 1);
    register_metrics(s);
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        util_set_err(err, err_cap, "scheduler: cannot start thread");
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        scheduler_destroy(s);
        return -1;
    }
    s->thread_started = 1;
    *out = s;
    return 0;
}

int scheduler_submit(scheduler *s, sched_seq *const *seqs, uint32_t n, char *err,
                     size_t err_cap) {
    if (!s || !seqs || n == 0) {
        util_set_err(err, err_cap, "nothing to submit");
        return SCHED_BAD;
    }
    for (uint32_t i = 0; i < n; i++) {
        sched_seq *q = seqs[i];
        if (!q->prompt || q->n_prompt == 0 || !q->lock || !q->notify) {
            util_set_err(err, err_cap, "sequence %u: empty prompt or missing lock/notify",
                         i);
            return SCHED_BAD;
        }
        if ((uint64_t)q->n_prompt + q->max_tokens > s->cfg.context) {
            util_set_err(err, err_cap,
                         "%u prompt tokens + %u max tokens exceed the context (%u)",
                         q->n_prompt, q->max_tokens, s->cfg.context);
            return SCHED_BAD;
        }
        if (q->top_logprobs > SCHED_MAX_TOP_LOGPROBS) {
            util_set_err(err, err_cap, "top logprobs over %u", SCHED_MAX_TOP_LOGPROBS);
            return SCHED_BAD;
        }
        if (q->n_stop_token_ids > SCHED_MAX_STOP_TOKEN_IDS ||
            (q->n_stop_token_ids && !q->stop_token_ids) || (q->n_bias && !q->bias_ids) ||
            (q->n_bias && !q->bias)) {
            util_set_err(err, err_cap, "sequence %u: bad stop token ids or logit bias",
                         i);
            return SCHED_BAD;
        }
        if (q->adapter_id && !(s->cfg.engine->api->capabilities & ORCH_CAP_LORA)) {
            util_set_err(err, err_cap,
                         "sequence %u: adapter %u on engine '%s', which has no LoRA "
                         "adapters",
                         i, q->adapter_id, s->cfg.engine->api->name);
            return SCHED_BAD;
        }
        char perr[128];
        if (sampler_params_check(&q->sampling, perr, sizeof perr) != 0) {
            util_set_err(err, err_cap, "sequence %u: %s", i, perr);
            return SCHED_BAD;
        }
        for (uint32_t j = 0; j < q->n_prompt; j++) {
            if (q->prompt[j] < 0 || (uint32_t)q->prompt[j] >= s->cfg.vocab_size) {
                util_set_err(
                    err, err_cap,
                    "token id %d at prompt position %u is outside the vocabulary (0..%u)",
                    q->prompt[j], j, s->cfg.vocab_size - 1);
                return SCHED_BAD;
            }
        }
    }
    pthread_mutex_lock(&s->mu);
    if (!atomic_load(&s->accepting) || s->stop) {
        pthread_mutex_unlock(&s->mu);
        util_set_err(err, err_cap, "the server is shutting down");
        return SCHED_STOPPED;
    }
    if (n > s->cfg.max_waiting) { /* sequences count: this never fits */
        pthread_mutex_unlock(&s->mu);
        util_set_err(err, err_cap,
                     "the request needs %u sequences, but at most %u may "
                     "wait (--max-waiting)",
                     n, s->cfg.max_waiting);
        return SCHED_TOO_MANY;
    }
    unsigned waiting = atomic_load(&s->n_waiting);
    if (waiting + n > s->cfg.max_waiting) {
        pthread_mutex_unlock(&s->mu);
        util_set_err(err, err_cap, "the waiting queue is full (%u sequences)", waiting);
        return SCHED_QUEUE_FULL;
    }
    double now = util_now();
    uint64_t prompt_tokens = 0;
    for (uint32_t i = 0; i < n; i++) {
        sched_seq *q = seqs[i];
        memset(&q->priv, 0, sizeof q->priv);
        q->priv.arrival = s->next_arrival++;
        q->priv.state = ST_NEW;
        q->finish = SCHED_FINISH_NONE;
        q->t_submit = now;
        q->priv.next = NULL;
        if (s->inbox_tail)
            s->inbox_tail->priv.next = q;
        else
            s->inbox_head = q;
        s->inbox_tail = q;
        prompt_tokens += q->n_prompt;
    }
    atomic_fetch_add(&s->n_waiting, n);
    atomic_fetch_add(&s->n_active, n);
    if (s->sleeping) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    metrics_counter_add(s->m_prompt_tokens, (double)prompt_tokens);
    return SCHED_OK;
}

void scheduler_wake(scheduler *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->wake_flag = 1;
    if (s->sleeping) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void scheduler_stop_accepting(scheduler *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->accepting, 0);
    pthread_mutex_unlock(&s->mu);
}

void scheduler_cancel_all(scheduler *s, int http_status, const char *message) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->cancel_all = 1;
    s->cancel_all_status = http_status;
    util_set_err(s->cancel_all_msg, sizeof s->cancel_all_msg, "%s",
                 message ? message : "cancelled");
    s->wake_flag = 1;
    if (s->sleeping) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

uint32_t scheduler_active(const scheduler *s) {
    return s ? atomic_load(&((scheduler *)s)->n_active) : 0;
}

void scheduler_get_stats(const scheduler *s, scheduler_stats *st) {
    scheduler *m = (scheduler *)s;
    memset(st, 0, sizeof *st);
    if (!s) return;
    st->running = atomic_load(&m->st_running);
    st->waiting = atomic_load(&m->n_waiting);
    st->kv_blocks_used = atomic_load(&m->st_kv_used);
    st->kv_blocks_total = block_manager_total(m->bm);
    st->preemptions = atomic_load(&m->st_preempt);
    st->iterations = atomic_load(&m->st_iter);
    st->engine_errors = atomic_load(&m->st_errors);
    st->kv_blocks_cached = atomic_load(&m->st_cached);
    st->kv_blocks_evictable = atomic_load(&m->st_evictable);
    st->prefix_hit_tokens = atomic_load(&m->st_hit_tokens);
    st->prefix_hits = atomic_load(&m->st_hits);
    st->prefix_misses = atomic_load(&m->st_misses);
}

void scheduler_destroy(scheduler *s) {
    if (!s) return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        atomic_store(&s->accepting, 0);
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    prefix_cache_free(s->pc);
    block_manager_free(s->bm);
    free(s->match);
    free(s->copy_src);
    free(s->copy_dst);
    free(s->running);
    free(s->inputs);
    free(s->batch);
    free(s->batch_rows);
    free(s->logits);
    sampler_ws_free(s->ws);
    free(s);
}

/* ------------------------------------------------------------------------- */
/* The scheduler thread                                                       */
/* ------------------------------------------------------------------------- */

/* Preempt q (running): free its blocks, queue it at the front of waiting. */
static void preempt(scheduler *s, sched_seq *q) {
    release_blocks(s, q);
    q->priv.n_computed = 0;
    q->priv.state = ST_WAITING;
    q->priv.preempted = 1;
    q->preemptions++;
    wait_push_front(s, q);
    atomic_fetch_add(&s->n_waiting, 1);
    atomic_fetch_add(&s->st_preempt, 1);
    metrics_counter_add(s->m_preempt, 1);
}

/* Drop running entries that are no longer running (preempted/finished). */
static void compact_running(scheduler *s) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n_running; i++)
        if (s->running[i]->priv.state == ST_RUNNING) s->running[k++] = s->running[i];
    s->n_running = k;
}

static void cancel_one(scheduler *s, sched_seq *q, int status, const char *msg) {
    if (q->priv.state == ST_WAITING) {
        wait_remove(s, q);
        atomic_fetch_sub(&s->n_waiting, 1);
    }
    q->priv.state = ST_DONE; /* for compact_running */
    seq_finish(s, q, SCHED_FINISH_CANCELLED, status, msg);
}

static void handle_cancels(scheduler *s, int all, int status, const char *msg) {
    int any = 0;
    for (uint32_t i = 0; i < s->n_running; i++) {
        sched_seq *q = s->running[i];
        if (all || atomic_load_explicit(&q->cancel, memory_order_relaxed)) {
            cancel_one(s, q, all ? status : 499, all ? msg : "cancelled by the client");
            any = 1;
        }
    }
    if (any) compact_running(s);
    sched_seq *q = s->wait_head;
    while (q) {
        sched_seq *next = q->priv.next;
        if (all || atomic_load_explicit(&q->cancel, memory_order_relaxed))
            cancel_one(s, q, all ? status : 499, all ? msg : "cancelled by the client");
        q = next;
    }
}

/* End-of-sequence ids of the tokenizer banned before min_tokens (at most). */
#define SCHED_MAX_EOS_IDS 16u

/* Append a sampled token (seq_output.h). Returns a sched_finish reason (NONE
 * to continue), or -1 out of memory. */
static int append_token(scheduler *s, sched_seq *q, int32_t tok, const float *row,
                        double now) {
    seq_token t = {
        .id = tok, .bytes = "", .row = row, .vocab = s->cfg.vocab_size, .now = now
    };
    t.is_eot = !q->ignore_eot && tokenizer_is_eos(s->cfg.tok, tok);
    for (uint32_t i = 0; i < q->n_stop_token_ids && !t.is_eot; i++)
        t.is_eot = tok == q->stop_token_ids[i];
    if (!t.is_eot && tokenizer_token_bytes(s->cfg.tok, tok, &t.bytes, &t.n_bytes) != 0)
        t.n_bytes = 0;
    if (all_push(q, tok) != 0) return -1;
    t.context_full = q->priv.n_all >= s->cfg.context;
    int first = q->n_out == 0; /* only this thread writes n_out */
    int reason = seq_output_append(q, &t);
    if (reason >= 0 && first) metrics_histogram_observe(s->m_ttft, now - q->t_submit);
    return reason;
}

/* The logits q samples from: logit_bias, penalties, and before min_tokens
 * the end-of-text and stop tokens banned (sampler_process_logits). */
static const float *process_logits(scheduler *s, sched_seq *q, const float *row) {
    int32_t banned[SCHED_MAX_STOP_TOKEN_IDS + SCHED_MAX_EOS_IDS];
    uint32_t n_banned = 0;
    if (q->n_out < q->min_tokens) {
        const int32_t *eos;
        size_t n_eos = tokenizer_eos_ids(s->cfg.tok, &eos);
        for (size_t i = 0; !q->ignore_eot && i < n_eos && i < SCHED_MAX_EOS_IDS; i++)
            banned[n_banned++] = eos[i];
        for (uint32_t i = 0; i < q->n_stop_token_ids && i < SCHED_MAX_STOP_TOKEN_IDS; i++)
            banned[n_banned++] = q->stop_token_ids[i];
    }
    uint32_t np = q->priv.n_all < q->n_prompt ? q->priv.n_all : q->n_prompt;
    sampler_history h = { .prompt = q->priv.all,
                          .n_prompt = np,
                          .output = q->priv.all + np,
                          .n_output = q->priv.n_all - np,
                          .bias_ids = q->bias_ids,
                          .bias = q->bias,
                          .n_bias = q->n_bias,
                          .banned = banned,
                          .n_banned = n_banned };
    return sampler_process_logits(&q->sampling, &h, row, s->cfg.vocab_size, s->ws);
}

/* Jump-forward (sched_seq.forced_tokens): append the tokens the grammar
 * forces after a sampled one; their KV is computed next iteration (the
 * sequence then has more than one uncomputed position, like a prefill).
 * Returns a sched_finish reason (NONE to continue), or -1 out of memory. */
#define SCHED_MAX_FORCED 64u
static int append_forced(scheduler *s, sched_seq *q, double now, uint64_t *generated) {
    int32_t ids[SCHED_MAX_FORCED];
    uint32_t cap = SCHED_MAX_FORCED, left = q->max_tokens - q->n_out;
    uint32_t room = s->cfg.context - q->priv.n_all;
    if (cap > left) cap = left;
    if (cap > room) cap = room;
    int complete = 0;
    uint32_t k = q->forced_tokens(q, ids, cap, &complete);
    if (k && block_table_reserve(s->bm, &q->priv.blocks, q->priv.n_all + k) != 0)
        return SCHED_FINISH_NONE; /* no KV room now: sampled one by one */
    metrics_counter_add(s->m_forced, k);
    for (uint32_t i = 0; i < k; i++) {
        int reason = append_token(s, q, ids[i], NULL, now);
        (*generated)++;
        if (reason != SCHED_FINISH_NONE) return reason;
    }
    return complete ? SCHED_FINISH_STOP : SCHED_FINISH_NONE;
}

typedef struct plan {
    uint32_t n;    /* batch entries */
    uint32_t rows; /* logits rows */
    uint32_t tokens;
} plan;

static void plan_add(scheduler *s, plan *p, sched_seq *q, uint32_t chunk, uint32_t mode) {
    orch_seq_input *in = &s->inputs[p->n];
    memset(in, 0, sizeof *in);
    in->tokens = q->priv.all + q->priv.n_computed;
    in->n_tokens = chunk;
    in->start_pos = q->priv.n_computed;
    in->block_table = q->priv.blocks.ids;
    in->n_blocks = q->priv.blocks.n;
    in->logits_mode = mode;
    in->adapter_id = q->adapter_id;
    uint32_t rows = mode == ORCH_LOGITS_ALL ? chunk : mode == ORCH_LOGITS_LAST ? 1 : 0;
    s->batch[p->n] = q;
    s->batch_rows[p->n] = rows;
    p->n++;
    p->rows += rows;
    p->tokens += chunk;
}

/* Logits mode and chunk length for a prefill step of q. */
static uint32_t prefill_chunk(const sched_seq *q, uint32_t budget, uint32_t *plp_left,
                              uint32_t *mode) {
    uint32_t remaining = q->priv.n_all - q->priv.n_computed;
    uint32_t chunk = remaining < budget ? remaining : budget;
    int want_all = q->want_prompt_logprobs && !q->priv.prompt_lp_done &&
                   q->priv.n_computed < q->n_prompt;
    if (want_all) {
        if (chunk > *plp_left) chunk = *plp_left;
        if (chunk == 0) return 0;
        *plp_left -= chunk;
        *mode = ORCH_LOGITS_ALL;
    } else {
        *mode = q->priv.n_computed + chunk == q->priv.n_all ? ORCH_LOGITS_LAST
                                                            : ORCH_LOGITS_NONE;
    }
    return chunk;
}

/* The cached full blocks q can start from now (ids in s->match): at most
 * all but its last token; none for a sequence that still needs prompt
 * log-probabilities or without the cache. *n_idle: how many are evictable. */
static uint32_t cache_match(scheduler *s, const sched_seq *q, uint32_t *n_idle) {
    *n_idle = 0;
    if (!s->pc || q->priv.blocks.n != 0 || q->priv.n_all == 0) return 0;
    if (q->want_prompt_logprobs && !q->priv.prompt_lp_done) return 0;
    uint32_t max = (q->priv.n_all - 1) / s->cfg.block_size;
    return prefix_cache_lookup(s->pc, q->adapter_id, q->priv.all, max, s->match, n_idle);
}

/* q is another choice of r's prompt that has not started (fork_siblings may
 * give it r's blocks and first logits). */
static int is_sibling(const sched_seq *r, const sched_seq *q) {
    return q != r && q->prompt == r->prompt && q->n_prompt == r->n_prompt &&
           q->adapter_id == r->adapter_id && q->priv.n_all == q->n_prompt &&
           !q->priv.preempted && q->priv.blocks.n == 0 && !q->want_prompt_logprobs &&
           q->max_tokens > 0 && q->priv.state == ST_WAITING;
}

/* 1 when a running sequence with the same tokens is about to compute block m
 * of q (the first block q would compute itself), or q is a sibling of a
 * running sequence still computing its prompt: q had better wait and then
 * reuse that work. */
static int wait_for_running(const scheduler *s, const sched_seq *q, uint32_t m) {
    uint64_t end = (uint64_t)(m + 1) * s->cfg.block_size;
    for (uint32_t i = 0; i < s->n_running; i++) {
        const sched_seq *r = s->running[i];
        if (r->priv.state != ST_RUNNING || r->adapter_id != q->adapter_id) continue;
        if (s->can_fork && r->priv.n_all == r->n_prompt && !r->want_prompt_logprobs &&
            r->priv.n_computed < r->n_prompt && is_sibling(r, q))
            return 1;
        if (end + 1 > q->priv.n_all) continue; /* q could not reuse that block */
        if (r->priv.n_computed >= end || r->priv.n_all < end) continue;
        if (memcmp(r->priv.all, q->priv.all, (size_t)end * sizeof(int32_t)) == 0)
            return 1;
    }
    return 0;
}

/* The next waiting sequence to admit, NULL when every one waits for a
 * running sequence. Without the cache: the head (arrival order, preempted
 * first). With it: preempted sequences first, then the longest cached prefix
 * while fewer than SCHED_LPM_MAX_WAITING wait, else arrival order; a
 * candidate that should wait_for_running is skipped for the rest of the round
 * (admissions within a round only add running sequences to wait for).
 * Matches are computed once per round (a heuristic for the order; admission
 * looks up again). */
static sched_seq *pick_waiting(scheduler *s, uint64_t round) {
    if (!s->pc) return s->wait_head;
    int lpm = atomic_load(&s->n_waiting) < SCHED_LPM_MAX_WAITING;
    for (;;) {
        sched_seq *best = NULL;
        for (sched_seq *q = s->wait_head; q; q = q->priv.next) {
            if (q->priv.pick_iter != round) {
                uint32_t idle;
                q->priv.pick_iter = round;
                q->priv.lpm_blocks = cache_match(s, q, &idle);
                q->priv.deferred = 0;
            }
            if (q->priv.deferred) continue;
            if (q->priv.preempted || !lpm) {
                best = q;
                break;
            }
            if (!best || q->priv.lpm_blocks > best->priv.lpm_blocks) best = q;
        }
        if (!best || !wait_for_running(s, best, best->priv.lpm_blocks)) return best;
        best->priv.deferred = 1;
    }
}

/* Statistics and cached_tokens of an admission that starts from `tokens`
 * positions already computed (cached blocks, or a sibling's prompt). */
static void note_reuse(scheduler *s, sched_seq *q, uint64_t tokens) {
    if (!s->pc) return;
    int m = tokens > 0;
    if (m) {
        atomic_fetch_add(&s->st_hits, 1);
        atomic_fetch_add(&s->st_hit_tokens, tokens);
        metrics_counter_add(s->m_pc_hits, 1);
        metrics_counter_add(s->m_pc_hit_tokens, (double)tokens);
    } else {
        atomic_fetch_add(&s->st_misses, 1);
        metrics_counter_add(s->m_pc_misses, 1);
    }
    if (!q->priv.preempted) {
        pthread_mutex_lock(q->lock);
        q->cached_tokens = tokens < q->n_prompt ? (uint32_t)tokens : q->n_prompt;
        pthread_mutex_unlock(q->lock);
    }
}

/* Index q's newly completed full blocks (after a forward); a block whose
 * content is cached already (computed twice) is replaced by the cached one. */
static void cache_blocks(scheduler *s, sched_seq *q) {
    uint32_t bs = s->cfg.block_size;
    uint32_t full = q->priv.n_computed / bs;
    block_table *t = &q->priv.blocks;
    while (q->priv.n_hashed < full && q->priv.n_hashed < t->n) {
        uint32_t j = q->priv.n_hashed;
        int32_t parent = j ? t->ids[j - 1] : -1;
        int32_t got = prefix_cache_insert(s->pc, q->adapter_id, parent,
                                          q->priv.all + (size_t)j * bs, t->ids[j]);
        if (got < 0) break;
        if (got != t->ids[j] && prefix_cache_adopt(s->pc, t, j, got) != 0) break;
        q->priv.n_hashed++;
    }
}

/* The block for q's next decode position: reserved, and private (a block
 * shared with a sibling is copied first: the pair is queued for run_batch).
 * -1 when no block is available. */
static int decode_blocks(scheduler *s, sched_seq *q) {
    if (block_table_reserve(s->bm, &q->priv.blocks, q->priv.n_computed + 1) != 0)
        return -1;
    uint32_t j = q->priv.n_computed / s->cfg.block_size;
    int32_t src, dst;
    int r = block_table_prepare_write(s->bm, &q->priv.blocks, j, &src, &dst);
    if (r < 0) return -1;
    if (r == 1) {
        s->copy_src[s->n_copies] = src;
        s->copy_dst[s->n_copies++] = dst;
    }
    return 0;
}

/* Before a chunk of a running sequence is computed (jump-forward tokens after
 * a fork): every block it writes must be q's own (the prompt's partial last
 * block may still be shared with its siblings). -1 when no block is free. */
static int chunk_blocks(scheduler *s, sched_seq *q, uint32_t chunk) {
    const uint32_t bs = s->cfg.block_size;
    for (uint32_t j = q->priv.n_computed / bs; j <= (q->priv.n_computed + chunk - 1) / bs;
         j++) {
        if (j < q->priv.blocks.n &&
            block_manager_refcount(s->bm, q->priv.blocks.ids[j]) > 1 &&
            s->n_copies >= s->cfg.max_seqs)
            return -1; /* no room for the copy this iteration */
        int32_t src, dst;
        int r = block_table_prepare_write(s->bm, &q->priv.blocks, j, &src, &dst);
        if (r < 0) return -1;
        if (r == 1) {
            s->copy_src[s->n_copies] = src;
            s->copy_dst[s->n_copies++] = dst;
        }
    }
    return 0;
}

static int build_batch(scheduler *s, plan *p) {
    memset(p, 0, sizeof *p);
    s->n_copies = 0;
    uint32_t budget = s->cfg.max_batch_tokens;
    uint32_t plp_left = SCHED_PROMPT_LOGPROB_ROWS;

    /* 1. decodes, oldest first; preempt the newest when blocks run out */
    int preempted_any = 0;
    for (uint32_t i = 0; i < s->n_running && budget > 0; i++) {
        sched_seq *q = s->running[i];
        if (q->priv.state != ST_RUNNING) continue;
        if (q->priv.n_all - q->priv.n_computed != 1) continue;
        while (decode_blocks(s, q) != 0) {
            sched_seq *victim = NULL;
            for (uint32_t j = s->n_running; j-- > i;)
                if (s->running[j]->priv.state == ST_RUNNING) {
                    victim = s->running[j];
                    break;
                }
            if (!victim) break;
            preempt(s, victim);
            preempted_any = 1;
            if (victim == q) break;
        }
        if (q->priv.state != ST_RUNNING) continue;
        plan_add(s, p, q, 1, ORCH_LOGITS_LAST);
        budget--;
    }
    if (preempted_any) compact_running(s);

    /* 2. partially prefilled running sequences */
    for (uint32_t i = 0; i < s->n_running && budget > 0; i++) {
        sched_seq *q = s->running[i];
        if (q->priv.n_all - q->priv.n_computed <= 1) continue;
        uint32_t mode;
        uint32_t chunk = prefill_chunk(q, budget, &plp_left, &mode);
        if (chunk == 0 || chunk_blocks(s, q, chunk) != 0) continue;
        plan_add(s, p, q, chunk, mode);
        budget -= chunk;
    }

    /* 3. admit waiting sequences while blocks allow (pick_waiting's order) */
    uint32_t total = block_manager_total(s->bm);
    uint32_t watermark = total / 100 > 0 ? total / 100 : 1;
    uint64_t round = ++s->n_picks;
    while (s->wait_head && budget > 0 && s->n_running < s->cfg.max_seqs &&
           !preempted_any) {
        sched_seq *q = pick_waiting(s, round);
        if (!q) break;
        uint32_t idle;
        uint32_t m = cache_match(s, q, &idle);
        uint32_t need = block_manager_blocks_for(s->bm, q->priv.n_all) - m;
        uint32_t spare = s->n_running > 0 ? watermark : 0;
        uint32_t avail = block_manager_available(s->bm);
        if (avail < idle || avail - idle < need + spare) break;
        q->priv.n_computed = m * s->cfg.block_size;
        uint32_t mode;
        uint32_t chunk = prefill_chunk(q, budget, &plp_left, &mode);
        if (chunk == 0 ||
            (m && prefix_cache_acquire(s->pc, &q->priv.blocks, s->match, m) != 0)) {
            q->priv.n_computed = 0;
            break;
        }
        if (block_table_reserve(s->bm, &q->priv.blocks, q->priv.n_all) != 0) {
            release_blocks(s, q);
            q->priv.n_computed = 0;
            break;
        }
        q->priv.n_hashed = m;
        note_reuse(s, q, (uint64_t)m * s->cfg.block_size);
        wait_remove(s, q);
        atomic_fetch_sub(&s->n_waiting, 1);
        q->priv.state = ST_RUNNING;
        s->running[s->n_running++] = q;
        plan_add(s, p, q, chunk, mode);
        budget -= chunk;
    }
    return 0;
}

/* Start of a fresh sequence: its token array = the prompt. */
static int seq_init(sched_seq *q) {
    q->priv.cap_all = 0;
    q->priv.all = NULL;
    if (grow((void **)&q->priv.all, sizeof(int32_t), q->n_prompt + 1, &q->priv.cap_all) !=
        0)
        return -1;
    memcpy(q->priv.all, q->prompt, q->n_prompt * sizeof(int32_t));
    q->priv.n_all = q->n_prompt;
    return 0;
}

static void fail_batch(scheduler *s, const plan *p, const char *msg) {
    for (uint32_t i = 0; i < p->n; i++) {
        sched_seq *q = s->batch[i];
        if (q->priv.state == ST_RUNNING) {
            q->priv.state = ST_DONE;
            seq_finish(s, q, SCHED_FINISH_ERROR, 500, msg);
        }
    }
    compact_running(s);
}

/* Sample q's next token from its logits row `last`, append it and check the
 * stop conditions. Returns 1 when q finished (seq_finish: the caller must
 * compact_running). *generated counts appended tokens. */
static int next_token(scheduler *s, sched_seq *q, const float *last, double now,
                      uint64_t *generated) {
    uint32_t V = s->cfg.vocab_size;
    if (q->n_out >= q->max_tokens) { /* max_tokens 0: prompt only */
        q->priv.state = ST_DONE;
        seq_finish(s, q, SCHED_FINISH_LENGTH, 200, NULL);
        return 1;
    }
    const uint32_t *mask = q->token_mask ? q->token_mask(q) : NULL;
    const float *logits = process_logits(s, q, last);
    int32_t tok =
        logits ? sampler_sample(&q->sampling, logits, V, mask, &q->rng, s->ws) : -1;
    if (tok < 0) {
        q->priv.state = ST_DONE;
        seq_finish(s, q, SCHED_FINISH_ERROR, 500,
                   !logits ? "sampling failed: no scratch space for logit processing"
                   : mask  ? "sampling failed: the token mask allows no token"
                           : "sampling failed: no finite logit");
        return 1;
    }
    int reason = append_token(s, q, tok, last, now);
    (*generated)++;
    if (reason == SCHED_FINISH_NONE && q->forced_tokens)
        reason = append_forced(s, q, now, generated);
    if (reason < 0) {
        q->priv.state = ST_DONE;
        seq_finish(s, q, SCHED_FINISH_ERROR, 500, "out of memory");
        return 1;
    }
    if (reason != SCHED_FINISH_NONE) {
        q->priv.state = ST_DONE;
        seq_finish(s, q, reason, 200, NULL);
        return 1;
    }
    if (q->stream) q->notify(q, 0);
    return 0;
}

/* r has just computed its whole prompt (its first token is due): every
 * waiting sibling (another choice of the same prompt, not started) shares
 * r's blocks, partial last block included, and samples its own first token
 * from the same logits; the shared partial block is copied on its first
 * write (decode_blocks). Siblings that find no running slot stay waiting
 * (they will reuse the cached full blocks). */
static void fork_siblings(scheduler *s, sched_seq *r, const float *last, double now,
                          uint64_t *generated, int *any_done) {
    if (r->want_prompt_logprobs) return;
    uint32_t nb = block_manager_blocks_for(s->bm, r->n_prompt);
    if (nb > r->priv.blocks.n) return;
    sched_seq *q = s->wait_head;
    while (q && s->n_running < s->cfg.max_seqs) {
        sched_seq *next = q->priv.next;
        if (is_sibling(r, q)) {
            if (block_table_fork(s->bm, &r->priv.blocks, nb, &q->priv.blocks) != 0) break;
            wait_remove(s, q);
            atomic_fetch_sub(&s->n_waiting, 1);
            q->priv.state = ST_RUNNING;
            s->running[s->n_running++] = q;
            q->priv.n_computed = r->n_prompt;
            q->priv.n_hashed = r->priv.n_hashed < nb ? r->priv.n_hashed : nb;
            note_reuse(s, q, r->n_prompt);
            if (next_token(s, q, last, now, generated)) *any_done = 1;
        }
        q = next;
    }
}

/* Decode and prefill tokens of the batch in s->inputs (for the co-serving
 * budget), and how long the oldest waiting sequence has waited. */
static void batch_kinds(const scheduler *s, const plan *p, uint32_t *decode,
                        uint32_t *prefill, double *oldest_wait_ms) {
    *decode = *prefill = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        const sched_seq *q = s->batch[i];
        if (s->inputs[i].start_pos >= q->n_prompt)
            *decode += s->inputs[i].n_tokens;
        else
            *prefill += s->inputs[i].n_tokens;
    }
    *oldest_wait_ms = s->wait_head ? (util_now() - s->wait_head->t_submit) * 1e3 : 0;
}

/* The fine-tuning micro-batches of one iteration, without coserve_forward:
 * one adapter_forward_backward each. */
static int32_t finetune_alone(scheduler *s, uint32_t n_ft) {
    const orch_engine_api *api = s->cfg.engine->api;
    for (uint32_t i = 0; i < n_ft; i++) {
        const orch_finetune_batch *f = &s->ft[i];
        int32_t st = api->adapter_forward_backward(s->cfg.ctx, f->adapter_id, f->tokens,
                                                   f->targets, f->batch, f->seq_len,
                                                   f->grad_scale, &s->ft_losses[i]);
        if (st != ORCH_OK) return st;
    }
    return ORCH_OK;
}

/* Token-level co-serving (take_rows): the batch and the rows of one
 * fine-tuning stream in one coserve_step (after the inference forward,
 * under `separate`). Returns the rows that rode along. */
static uint32_t engine_pass_rows(scheduler *s, const plan *p, orch_infer_batch *b,
                                 int32_t *st_infer) {
    const orch_engine_api *api = s->cfg.engine->api;
    const sched_coserve *cs = s->cfg.coserve;
    uint32_t decode = 0, prefill = 0, stream = 0;
    double wait_ms = 0, t0 = util_now();
    batch_kinds(s, p, &decode, &prefill, &wait_ms);
    uint32_t rows = cs->take_rows(cs->arg, decode, prefill, wait_ms, &stream);
    if (!stream) rows = 0;
    orch_ft_progress pr;
    memset(&pr, 0, sizeof pr);
    pr.struct_size = sizeof pr;
    int32_t st_ft = ORCH_OK;
    char ft_err[512] = "";
    const orch_infer_batch *inb = p->n ? b : NULL;
    if (rows && !cs->separate) {
        st_ft = api->coserve_step(s->cfg.ctx, inb, s->logits, s->logits_cap, stream, rows,
                                  &pr);
        if (st_ft == ORCH_OK) {
            *st_infer = ORCH_OK;
            if (inb) metrics_counter_add(s->m_shared, 1);
        } else { /* the inference batch again, alone */
            engine_format_error(s->cfg.engine, s->cfg.ctx, st_ft, ft_err, sizeof ft_err);
            *st_infer = inb ? api->infer_forward(s->cfg.ctx, b, s->logits, s->logits_cap)
                            : ORCH_OK;
        }
    } else {
        *st_infer =
            inb ? api->infer_forward(s->cfg.ctx, b, s->logits, s->logits_cap) : ORCH_OK;
        if (rows) {
            st_ft = api->coserve_step(s->cfg.ctx, NULL, NULL, 0, stream, rows, &pr);
            if (st_ft != ORCH_OK)
                engine_format_error(s->cfg.engine, s->cfg.ctx, st_ft, ft_err,
                                    sizeof ft_err);
        }
    }
    if (cs->done_rows && (rows || p->n))
        cs->done_rows(cs->arg, st_ft, ft_err, rows && st_ft == ORCH_OK ? &pr : NULL,
                      decode, prefill, util_now() - t0);
    return rows ? 1 : 0;
}

/* One engine pass for the batch (and the co-serving micro-batches the hooks
 * hand over): infer status into *st_infer; the hooks hear the fine-tuning
 * part's outcome. */
static uint32_t engine_pass(scheduler *s, const plan *p, orch_infer_batch *b,
                            int32_t *st_infer) {
    const orch_engine_api *api = s->cfg.engine->api;
    const sched_coserve *cs = s->cfg.coserve;
    if (cs && cs->take_rows) return engine_pass_rows(s, p, b, st_infer);
    uint32_t n_ft = 0, decode = 0, prefill = 0;
    double wait_ms = 0, t0 = util_now();
    if (cs && cs->take) {
        batch_kinds(s, p, &decode, &prefill, &wait_ms);
        n_ft = cs->take(cs->arg, decode, prefill, wait_ms, s->ft,
                        SCHED_MAX_FINETUNE_BATCHES);
        if (n_ft > SCHED_MAX_FINETUNE_BATCHES) n_ft = SCHED_MAX_FINETUNE_BATCHES;
    }
    int32_t st_ft = ORCH_OK;
    char ft_err[512] = "";
    if (n_ft && (api->capabilities & ORCH_CAP_COSERVE) && !cs->separate) {
        int32_t st =
            api->coserve_forward(s->cfg.ctx, p->n ? b : NULL, s->logits, s->logits_cap,
                                 s->ft, n_ft, sizeof s->ft[0], s->ft_losses);
        if (st == ORCH_OK) {
            *st_infer = ORCH_OK;
            if (p->n) metrics_counter_add(s->m_shared, 1);
        } else {
            /* which part failed is not known: the inference batch again,
             * alone (its KV positions are rewritten with the same values) */
            st_ft = st;
            engine_format_error(s->cfg.engine, s->cfg.ctx, st, ft_err, sizeof ft_err);
            *st_infer = p->n ? api->infer_forward(s->cfg.ctx, b, s->logits, s->logits_cap)
                             : ORCH_OK;
        }
    } else {
        *st_infer =
            p->n ? api->infer_forward(s->cfg.ctx, b, s->logits, s->logits_cap) : ORCH_OK;
        if (n_ft) {
            st_ft = finetune_alone(s, n_ft);
            if (st_ft != ORCH_OK)
                engine_format_error(s->cfg.engine, s->cfg.ctx, st_ft, ft_err,
                                    sizeof ft_err);
        }
    }
    if (cs && cs->done && n_ft)
        cs->done(cs->arg, st_ft, ft_err, s->ft_losses, n_ft, decode, prefill,
                 util_now() - t0);
    else if (cs && cs->done && p->n)
        cs->done(cs->arg, ORCH_OK, "", NULL, 0, decode, prefill, util_now() - t0);
    return n_ft;
}

/* Returns the fine-tuning micro-batches that rode along. */
static uint32_t run_batch(scheduler *s, const plan *p) {
    const orch_engine_api *api = s->cfg.engine->api;
    orch_infer_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_seqs = p->n;
    b.seq_stride = sizeof(orch_seq_input);
    b.seqs = s->inputs;
    double t0 = util_now();
    int32_t st = ORCH_OK;
    if (s->n_copies) /* copy-on-write of shared blocks written in this batch */
        st = api->kv_copy_blocks(s->cfg.ctx, s->copy_src, s->copy_dst, s->n_copies);
    s->n_copies = 0;
    uint32_t n_ft = 0;
    if (st == ORCH_OK) n_ft = engine_pass(s, p, &b, &st);
    if (p->n == 0) return n_ft; /* fine-tuning only */
    double now = util_now();
    metrics_histogram_observe(s->m_iter_seconds, now - t0);
    metrics_histogram_observe(s->m_batch_seqs, p->n);
    metrics_histogram_observe(s->m_batch_tokens, p->tokens);
    if (st != ORCH_OK) {
        char msg[512], full[600];
        engine_format_error(s->cfg.engine, s->cfg.ctx, st, msg, sizeof msg);
        snprintf(full, sizeof full, "engine error: %s", msg);
        atomic_fetch_add(&s->st_errors, 1);
        metrics_counter_add(s->m_errors, 1);
        fail_batch(s, p, full);
        return n_ft;
    }
    uint32_t V = s->cfg.vocab_size;
    const float *row = s->logits;
    uint64_t generated = 0;
    int any_done = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        sched_seq *q = s->batch[i];
        const orch_seq_input *in = &s->inputs[i];
        uint32_t rows = s->batch_rows[i];
        const float *last = rows ? row + (size_t)(rows - 1) * V : NULL;
        if (in->logits_mode == ORCH_LOGITS_ALL) {
            if (seq_output_prompt_logprobs(q, in->start_pos, rows, row, V) != 0) {
                q->priv.state = ST_DONE;
                seq_finish(s, q, SCHED_FINISH_ERROR, 500, "out of memory");
                any_done = 1;
                row += (size_t)rows * V;
                continue;
            }
            if (in->start_pos + rows >= q->n_prompt) q->priv.prompt_lp_done = 1;
        }
        row += (size_t)rows * V;
        q->priv.n_computed += in->n_tokens;
        if (s->pc) cache_blocks(s, q);
        if (q->priv.n_computed != q->priv.n_all || !last) continue;
        /* the next token is due */
        if (s->can_fork && q->priv.n_all == q->n_prompt)
            fork_siblings(s, q, last, now, &generated, &any_done);
        if (next_token(s, q, last, now, &generated)) any_done = 1;
    }
    if (generated) metrics_counter_add(s->m_gen_tokens, (double)generated);
    if (any_done) compact_running(s);
    return n_ft;
}

static void update_gauges(scheduler *s) {
    uint32_t cached = prefix_cache_blocks(s->pc), idle = prefix_cache_evictable(s->pc);
    uint32_t used = block_manager_used(s->bm) - idle; /* held by sequences */
    atomic_store(&s->st_running, s->n_running);
    atomic_store(&s->st_kv_used, used);
    atomic_store(&s->st_cached, cached);
    atomic_store(&s->st_evictable, idle);
    if (s->pc) {
        uint64_t ev = prefix_cache_evictions(s->pc);
        metrics_counter_add(s->m_pc_evictions, (double)(ev - s->evictions_reported));
        s->evictions_reported = ev;
        metrics_gauge_set(s->m_pc_blocks, cached);
        metrics_gauge_set(s->m_pc_evictable, idle);
    }
    metrics_gauge_set(s->m_running, s->n_running);
    metrics_gauge_set(s->m_waiting, atomic_load(&s->n_waiting));
    metrics_gauge_set(s->m_kv_used, used);
}

static void *sched_main(void *arg) {
    scheduler *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && !s->inbox_head && !s->wake_flag && !s->cancel_all &&
               s->n_running == 0 && !s->wait_head && !s->ft_pending) {
            s->sleeping = 1;
            pthread_cond_wait(&s->cv, &s->mu);
            s->sleeping = 0;
        }
        sched_seq *in = s->inbox_head;
        s->inbox_head = s->inbox_tail = NULL;
        s->wake_flag = 0;
        int stop = s->stop;
        int cancel_all = s->cancel_all || stop;
        int ca_status = s->cancel_all ? s->cancel_all_status : 503;
        char ca_msg[256];
        snprintf(ca_msg, sizeof ca_msg, "%s",
                 s->cancel_all ? s->cancel_all_msg : "the server is shutting down");
        s->cancel_all = 0;
        pthread_mutex_unlock(&s->mu);

        while (in) {
            sched_seq *next = in->priv.next;
            if (seq_init(in) != 0) {
                atomic_fetch_sub(&s->n_waiting, 1);
                seq_finish(s, in, SCHED_FINISH_ERROR, 500, "out of memory");
            } else {
                in->priv.state = ST_WAITING;
                wait_push_back(s, in);
            }
            in = next;
        }
        if (s->cfg.poll) s->cfg.poll(s->cfg.poll_arg);
        handle_cancels(s, cancel_all, ca_status, ca_msg);
        update_gauges(s);
        flush_finished(s);
        if (stop) break;
        const sched_coserve *cs = s->cfg.coserve;
        s->ft_pending = cs && cs->tasks ? cs->tasks(cs->arg) : 0;
        if (s->n_running == 0 && !s->wait_head) {
            update_gauges(s);
            if (s->ft_pending) { /* nothing to infer: fine-tuning alone */
                plan none = { 0, 0, 0 };
                if (run_batch(s, &none) == 0) { /* not ready after all: no spin */
                    struct timespec ts = { 0, 1000000 };
                    nanosleep(&ts, NULL);
                }
            }
            continue;
        }
        plan p;
        build_batch(s, &p);
        if (p.n == 0) {
            /* nothing runnable (should not happen): do not spin */
            update_gauges(s);
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
            continue;
        }
        atomic_fetch_add(&s->st_iter, 1);
        run_batch(s, &p);
        update_gauges(s);
        flush_finished(s);
    }
    return NULL;
}
