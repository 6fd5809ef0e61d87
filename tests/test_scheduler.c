/*
 * test_scheduler.c - continuous batching on the mock engine, whose greedy
 * next token is 97 + (S mod 26), S = sum of the token ids at positions 0..p
 * read back from the KV cache (engines/mock/README.md). The tests predict
 * every output exactly: many sequences with chunked prefill, preemption when
 * the KV pool runs out (all outputs still exact, pool empty afterwards), stop
 * strings across token boundaries and the streaming hold-back, cancellation
 * freeing blocks, an injected engine fault failing only its batch, the
 * waiting-queue limit (counted in sequences: a submission of more than it
 * holds never fits), seeded sampling that is the same alone and in a busy
 * batch, prompt log-probabilities, submission/creation errors, and the
 * token controls (stop_token_ids, min_tokens, logit_bias, penalties).
 * Prefix caching: outputs with the cache equal the prediction and the
 * outputs without it (shared prefixes, repeated prompts, n > 1 choices that
 * wait for one computation, multi-turn prompts reusing generated blocks,
 * eviction in a small pool, preemption, cancellation), cached_tokens exact,
 * longest-prefix-first admission, and every sequence reference returned.
 * The structured-output hooks (token mask; forced tokens whose KV must be
 * computed for the greedy continuation to come out right).
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/core/engine_loader.h"
#include "orchestrator/serve/scheduler.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"
#include "tests/test_util.h"

static engine_handle eng;
static orch_engine_ctx *ctx;
static tokenizer *tok;
static scheduler *sch;
static pthread_mutex_t seq_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int n_finished;
static int stream_violation;
static int no_cache; /* start() without the prefix cache */

static void notify(sched_seq *q, int fin) {
    pthread_mutex_lock(&seq_lock);
    /* the streamable text never runs past what stays in the final text */
    if (q->text_ready > q->text_len) stream_violation = 1;
    pthread_mutex_unlock(&seq_lock);
    if (!fin) return;
    pthread_mutex_lock(&mu);
    n_finished++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_finished(int n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&mu);
    while (n_finished < n)
        if (pthread_cond_timedwait(&cv, &mu, &ts) != 0) break;
    int got = n_finished;
    pthread_mutex_unlock(&mu);
    ck_assert_msg(got >= n, "only %d of %d sequences finished", got, n);
}

/* Start a scheduler over a fresh mock context. */
static void start(uint32_t context, uint32_t blocks, uint32_t max_seqs,
                  uint32_t max_batch, uint32_t max_waiting, const char *options) {
    char err[512];
    ck_assert_msg(engine_load("mock", &eng, err, sizeof err) == 0, "%s", err);
    orch_model_desc d = test_model_desc(256, context, 1, 1, 8);
    ck_assert_msg(engine_create_context(&eng, &d, 1, 1, options, &ctx, err, sizeof err) ==
                      0,
                  "%s", err);
    ck_assert_msg(tokenizer_open("byte", NULL, &tok, err, sizeof err) == 0, "%s", err);
    scheduler_config c = { .engine = &eng,
                           .ctx = ctx,
                           .tok = tok,
                           .vocab_size = 256,
                           .context = context,
                           .block_size = ORCH_KV_BLOCK_TOKENS,
                           .num_blocks = blocks,
                           .max_seqs = max_seqs,
                           .max_batch_tokens = max_batch,
                           .max_waiting = max_waiting,
                           .no_prefix_cache = no_cache };
    ck_assert_msg(scheduler_create(&c, &sch, err, sizeof err) == 0, "%s", err);
    n_finished = 0;
    stream_violation = 0;
}

static void stop(void) {
    scheduler_destroy(sch);
    sch = NULL;
    eng.api->context_destroy(ctx);
    engine_unload(&eng);
    tokenizer_free(tok);
}

/* The mock's greedy continuation of prompt. */
static void predict(const int32_t *p, uint32_t n, uint32_t k, char *out) {
    uint64_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += (uint64_t)p[i];
    for (uint32_t i = 0; i < k; i++) {
        int next = 97 + (int)(s % 26);
        out[i] = (char)next;
        s += (uint64_t)next;
    }
    out[k] = '\0';
}

/* The gauges are refreshed at the end of each iteration, just after the
 * notifications: poll for the pool to drain. */
static void wait_pool_empty(void) {
    scheduler_stats st;
    for (int i = 0; i < 1000; i++) {
        scheduler_get_stats(sch, &st);
        /* no sequence holds a block; cached blocks hold only the cache's
         * reference (refcount 1: every one is evictable) */
        if (st.kv_blocks_used == 0 && st.running == 0 &&
            st.kv_blocks_cached == st.kv_blocks_evictable)
            return;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    ck_abort_msg("the KV pool did not drain: %u blocks used", st.kv_blocks_used);
}

static void init_seq(sched_seq *q, const int32_t *prompt, uint32_t n,
                     uint32_t max_tokens) {
    memset(q, 0, sizeof *q);
    q->prompt = prompt;
    q->n_prompt = n;
    q->max_tokens = max_tokens;
    q->sampling = sampler_params_default();
    q->sampling.temperature = 0;
    q->lock = &seq_lock;
    q->notify = notify;
    atomic_init(&q->cancel, 0);
}

static int32_t *make_prompt(uint32_t n, uint32_t salt) {
    int32_t *p = malloc(n * sizeof *p);
    for (uint32_t i = 0; i < n; i++)
        p[i] = 32 + (int32_t)((i * 7 + salt * 13 + i * salt) % 90);
    return p;
}

static void submit_all(sched_seq *seqs, uint32_t n) {
    sched_seq **ptrs = malloc(n * sizeof *ptrs);
    for (uint32_t i = 0; i < n; i++) ptrs[i] = &seqs[i];
    char err[256];
    ck_assert_int_eq(scheduler_submit(sch, ptrs, n, err, sizeof err), SCHED_OK);
    free(ptrs);
}

START_TEST(many_sequences_exact_with_chunked_prefill) {
    enum { N = 24 };
    start(256, 64, 8, 32, 100, NULL);
    sched_seq seqs[N];
    int32_t *prompts[N];
    for (uint32_t i = 0; i < N; i++) {
        uint32_t len = 1 + i * 5; /* 1 .. 116 tokens: chunks of <= 32 */
        prompts[i] = make_prompt(len, i);
        init_seq(&seqs[i], prompts[i], len, 10 + i);
    }
    submit_all(seqs, N);
    wait_finished(N);
    for (uint32_t i = 0; i < N; i++) {
        char want[64];
        predict(prompts[i], seqs[i].n_prompt, seqs[i].max_tokens, want);
        ck_assert_int_eq(seqs[i].finish, SCHED_FINISH_LENGTH);
        ck_assert_uint_eq(seqs[i].n_out, seqs[i].max_tokens);
        ck_assert_str_eq(seqs[i].text, want);
        ck_assert_uint_eq(seqs[i].text_ready, seqs[i].text_len);
        ck_assert(seqs[i].t_first_token >= seqs[i].t_submit &&
                  seqs[i].t_done >= seqs[i].t_first_token);
        sched_seq_free_outputs(&seqs[i]);
        free(prompts[i]);
    }
    wait_pool_empty();
    ck_assert_uint_eq(scheduler_active(sch), 0);
    stop();
}
END_TEST

START_TEST(preemption_when_pool_runs_out) {
    enum { N = 6 };
    /* context 128 needs 8 blocks; a pool of 10 cannot hold 6 sequences of 90 */
    start(128, 10, 6, 64, 100, NULL);
    sched_seq seqs[N];
    int32_t *prompts[N];
    for (uint32_t i = 0; i < N; i++) {
        prompts[i] = make_prompt(20, 100 + i);
        init_seq(&seqs[i], prompts[i], 20, 70);
    }
    submit_all(seqs, N);
    wait_finished(N);
    wait_pool_empty();
    scheduler_stats st;
    scheduler_get_stats(sch, &st);
    ck_assert_msg(st.preemptions > 0, "no preemption happened");
    uint32_t preempted = 0;
    for (uint32_t i = 0; i < N; i++) {
        char want[128];
        predict(prompts[i], 20, 70, want);
        ck_assert_int_eq(seqs[i].finish, SCHED_FINISH_LENGTH);
        ck_assert_str_eq(seqs[i].text, want);
        preempted += seqs[i].preemptions;
        sched_seq_free_outputs(&seqs[i]);
        free(prompts[i]);
    }
    ck_assert_uint_eq(preempted, st.preemptions);
    ck_assert_uint_eq(st.kv_blocks_used, 0);
    stop();
}
END_TEST

START_TEST(stop_strings_across_tokens) {
    start(256, 32, 4, 64, 100, NULL);
    int32_t prompt[3] = { 'a', 'b', 'c' };
    char g[41];
    predict(prompt, 3, 40, g);
    /* a stop string that spans tokens 5..7; one that never occurs */
    char stop3[4] = { g[5], g[6], g[7], 0 };
    const char *stops_a[2] = { "never-there", stop3 };
    const char *stops_b[1] = { "ZZ" };
    sched_seq a, b;
    init_seq(&a, prompt, 3, 40);
    a.stop = stops_a;
    a.n_stop = 2;
    a.stream = 1;
    init_seq(&b, prompt, 3, 12);
    b.stop = stops_b;
    b.n_stop = 1;
    b.stream = 1;
    sched_seq *ptrs[2] = { &a, &b };
    char err[128];
    ck_assert_int_eq(scheduler_submit(sch, ptrs, 2, err, sizeof err), SCHED_OK);
    wait_finished(2);
    const char *first = strstr(g, stop3); /* earliest occurrence */
    size_t cut = (size_t)(first - g);
    ck_assert_int_eq(a.finish, SCHED_FINISH_STOP);
    ck_assert_uint_eq(a.text_len, cut);
    ck_assert_int_eq(strncmp(a.text, g, cut), 0);
    ck_assert_uint_eq(a.n_out, cut + 3); /* generation stopped at the match */
    ck_assert_uint_eq(a.out_text_end[a.n_out - 1], cut);
    ck_assert_int_eq(b.finish, SCHED_FINISH_LENGTH);
    ck_assert_int_eq(strncmp(b.text, g, 12), 0);
    ck_assert(!stream_violation);
    sched_seq_free_outputs(&a);
    sched_seq_free_outputs(&b);
    stop();
}
END_TEST

START_TEST(cancel_frees_blocks) {
    start(1024, 128, 4, 64, 100, "sleep_ms=5");
    int32_t *p = make_prompt(100, 3);
    sched_seq q;
    init_seq(&q, p, 100, 500);
    q.stream = 1;
    submit_all(&q, 1);
    /* wait until it runs and holds blocks */
    scheduler_stats st;
    for (int i = 0; i < 400; i++) {
        scheduler_get_stats(sch, &st);
        pthread_mutex_lock(&seq_lock);
        uint32_t n = q.n_out;
        pthread_mutex_unlock(&seq_lock);
        if (n >= 2 && st.kv_blocks_used > 0) break;
        struct timespec ts = { 0, 5000000 };
        nanosleep(&ts, NULL);
    }
    ck_assert_uint_ge(st.kv_blocks_used, 7);
    atomic_store(&q.cancel, 1);
    scheduler_wake(sch);
    wait_finished(1);
    ck_assert_int_eq(q.finish, SCHED_FINISH_CANCELLED);
    ck_assert(q.n_out < 500);
    wait_pool_empty();
    sched_seq_free_outputs(&q);
    free(p);
    stop();
}
END_TEST

START_TEST(engine_fault_fails_only_its_batch) {
    start(256, 32, 4, 64, 100, "fault=infer_forward:4"); /* call 1: warm-up */
    int32_t p[2] = { 'h', 'i' };
    sched_seq a;
    init_seq(&a, p, 2, 10);
    submit_all(&a, 1);
    wait_finished(1);
    ck_assert_int_eq(a.finish, SCHED_FINISH_ERROR);
    ck_assert_int_eq(a.http_status, 500);
    ck_assert_msg(strstr(a.error, "injected fault"), "%s", a.error);
    ck_assert_uint_eq(a.n_out, 2); /* calls 2 and 3 produced tokens */
    sched_seq b;
    init_seq(&b, p, 2, 10);
    submit_all(&b, 1);
    wait_finished(2);
    char want[16];
    predict(p, 2, 10, want);
    ck_assert_int_eq(b.finish, SCHED_FINISH_LENGTH);
    ck_assert_str_eq(b.text, want);
    wait_pool_empty();
    scheduler_stats st;
    scheduler_get_stats(sch, &st);
    ck_assert_uint_eq(st.engine_errors, 1);
    sched_seq_free_outputs(&a);
    sched_seq_free_outputs(&b);
    stop();
}
END_TEST

START_TEST(waiting_queue_limit) {
    start(256, 32, 1, 64, 2, "sleep_ms=20");
    int32_t p[2] = { 'x', 'y' };
    sched_seq s[5];
    for (int i = 0; i < 5; i++) init_seq(&s[i], p, 2, 8);
    sched_seq *ab[2] = { &s[0], &s[1] };
    char err[128];
    /* the queue counts sequences: 3 can never wait in a queue of 2, not even
     * an empty one */
    sched_seq *abc[3] = { &s[0], &s[1], &s[2] };
    ck_assert_int_eq(scheduler_submit(sch, abc, 3, err, sizeof err), SCHED_TOO_MANY);
    ck_assert_str_eq(err, "the request needs 3 sequences, but at most 2 may wait "
                          "(--max-waiting)");
    ck_assert_int_eq(scheduler_submit(sch, ab, 2, err, sizeof err), SCHED_OK);
    scheduler_stats st;
    for (int i = 0; i < 200; i++) {
        scheduler_get_stats(sch, &st);
        if (st.running == 1) break;
        struct timespec ts = { 0, 2000000 };
        nanosleep(&ts, NULL);
    }
    ck_assert_uint_eq(st.running, 1);
    ck_assert_uint_eq(st.waiting, 1);
    sched_seq *c = &s[2], *d = &s[3];
    ck_assert_int_eq(scheduler_submit(sch, &c, 1, err, sizeof err), SCHED_OK);
    ck_assert_int_eq(scheduler_submit(sch, &d, 1, err, sizeof err), SCHED_QUEUE_FULL);
    ck_assert(strstr(err, "full"));
    scheduler_stop_accepting(sch);
    sched_seq *e = &s[4];
    ck_assert_int_eq(scheduler_submit(sch, &e, 1, err, sizeof err), SCHED_STOPPED);
    wait_finished(3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(s[i].finish, SCHED_FINISH_LENGTH);
        sched_seq_free_outputs(&s[i]);
    }
    stop();
}
END_TEST

/* A seeded sampled sequence gives the same tokens alone and in a batch. */
START_TEST(seeded_sampling_alone_equals_batched) {
    start(512, 256, 16, 64, 100, NULL);
    int32_t *p = make_prompt(30, 5);
    sched_seq alone;
    init_seq(&alone, p, 30, 40);
    alone.sampling.temperature = 1.0f;
    alone.sampling.top_p = 0.9f;
    sampler_rng_seed_stream(&alone.rng, 77, 0);
    submit_all(&alone, 1);
    wait_finished(1);
    enum { N = 12 };
    sched_seq busy[N];
    int32_t *others[N];
    for (int i = 0; i < N; i++) {
        others[i] = make_prompt(10 + (uint32_t)i * 9, 50 + (uint32_t)i);
        init_seq(&busy[i], others[i], 10 + (uint32_t)i * 9, 30 + (uint32_t)i);
        busy[i].sampling.temperature = 0.8f;
        sampler_rng_seed_stream(&busy[i].rng, 1000 + (uint64_t)i, 0);
    }
    init_seq(&busy[N / 2], p, 30, 40); /* the same request, mid-batch */
    busy[N / 2].sampling.temperature = 1.0f;
    busy[N / 2].sampling.top_p = 0.9f;
    sampler_rng_seed_stream(&busy[N / 2].rng, 77, 0);
    submit_all(busy, N);
    wait_finished(1 + N);
    ck_assert_uint_eq(busy[N / 2].n_out, 40);
    ck_assert_mem_eq(busy[N / 2].out_tokens, alone.out_tokens, 40 * sizeof(int32_t));
    ck_assert_str_eq(busy[N / 2].text, alone.text);
    char greedy[64];
    predict(p, 30, 40, greedy);
    ck_assert_str_ne(alone.text, greedy); /* it really sampled */
    sched_seq_free_outputs(&alone);
    for (int i = 0; i < N; i++) {
        sched_seq_free_outputs(&busy[i]);
        free(others[i]);
    }
    free(p);
    stop();
}
END_TEST

START_TEST(prompt_and_token_logprobs) {
    start(512, 64, 4, 48, 100, NULL);
    uint32_t n = 150; /* more than SCHED_PROMPT_LOGPROB_ROWS */
    int32_t *p = make_prompt(n, 9);
    sched_seq q;
    init_seq(&q, p, n, 3);
    q.want_logprobs = 1;
    q.want_prompt_logprobs = 1;
    q.top_logprobs = 2;
    submit_all(&q, 1);
    wait_finished(1);
    ck_assert_int_eq(q.finish, SCHED_FINISH_LENGTH);
    ck_assert(isnan(q.prompt_logprob[0]));
    double lse_cache[26];
    for (int c = 0; c < 26; c++) {
        double s = 0;
        for (int v = 0; v < 256; v++) s += exp(-fabs((double)v - (97 + c)));
        lse_cache[c] = log(s);
    }
    uint64_t s = 0;
    for (uint32_t j = 0; j + 1 < n; j++) {
        s += (uint64_t)p[j];
        int next = 97 + (int)(s % 26);
        double want = -fabs((double)p[j + 1] - next) - lse_cache[next - 97];
        ck_assert_msg(fabs(q.prompt_logprob[j + 1] - want) < 1e-4, "pos %u: %g vs %g",
                      j + 1, q.prompt_logprob[j + 1], want);
        ck_assert_int_eq(q.prompt_top_ids[(size_t)(j + 1) * 2], next);
    }
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_double_eq_tol(q.out_logprob[i], -lse_cache[q.out_tokens[i] - 97], 1e-4);
        ck_assert_int_eq(q.out_top_ids[i * 2], q.out_tokens[i]);
    }
    sched_seq_free_outputs(&q);
    /* max_tokens 0: prompt only */
    sched_seq z;
    init_seq(&z, p, 10, 0);
    z.want_prompt_logprobs = 1;
    z.want_logprobs = 1;
    submit_all(&z, 1);
    wait_finished(2);
    ck_assert_int_eq(z.finish, SCHED_FINISH_LENGTH);
    ck_assert_uint_eq(z.n_out, 0);
    ck_assert(!isnan(z.prompt_logprob[9]));
    sched_seq_free_outputs(&z);
    free(p);
    stop();
}
END_TEST

START_TEST(submit_and_create_errors) {
    start(64, 4, 2, 16, 10, NULL);
    char err[256];
    int32_t *p = make_prompt(60, 1);
    sched_seq q;
    init_seq(&q, p, 60, 10); /* 70 > context 64 */
    sched_seq *ptr = &q;
    ck_assert_int_eq(scheduler_submit(sch, &ptr, 1, err, sizeof err), SCHED_BAD);
    ck_assert(strstr(err, "context"));
    int32_t bad[2] = { 5, 300 };
    init_seq(&q, bad, 2, 1);
    ck_assert_int_eq(scheduler_submit(sch, &ptr, 1, err, sizeof err), SCHED_BAD);
    ck_assert(strstr(err, "300"));
    free(p);
    stop();
    /* a pool that cannot hold one full context, max_batch < max_seqs */
    ck_assert(engine_load("mock", &eng, err, sizeof err) == 0);
    orch_model_desc d = { .struct_size = sizeof d,
                          .arch = ORCH_ARCH_GPT2,
                          .vocab_size = 256,
                          .context = 64,
                          .layers = 1,
                          .heads = 1,
                          .width = 8 };
    ck_assert(engine_create_context(&eng, &d, 1, 1, NULL, &ctx, err, sizeof err) == 0);
    ck_assert(tokenizer_open("byte", NULL, &tok, err, sizeof err) == 0);
    scheduler_config c = { .engine = &eng,
                           .ctx = ctx,
                           .tok = tok,
                           .vocab_size = 256,
                           .context = 64,
                           .num_blocks = 3,
                           .max_seqs = 2,
                           .max_batch_tokens = 16,
                           .max_waiting = 4 };
    scheduler *s2 = NULL;
    ck_assert_int_eq(scheduler_create(&c, &s2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "too small"), "%s", err);
    c.num_blocks = 4;
    c.max_batch_tokens = 1;
    ck_assert_int_eq(scheduler_create(&c, &s2, err, sizeof err), -1);
    ck_assert(strstr(err, "max-batch-tokens"));
    eng.api->context_destroy(ctx);
    /* a failing engine is reported by the warm-up forward */
    ck_assert(engine_create_context(&eng, &d, 1, 1, "fault=infer_forward:1", &ctx, err,
                                    sizeof err) == 0);
    c.ctx = ctx;
    c.max_batch_tokens = 16;
    ck_assert_int_eq(scheduler_create(&c, &s2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "warm-up") && strstr(err, "injected fault"), "%s", err);
    eng.api->context_destroy(ctx);
    engine_unload(&eng);
    tokenizer_free(tok);
}
END_TEST

/* A token mask hook (structured output): only even ids 'b','d',... then
 * nothing after 5 tokens (an error). */
static uint32_t even_mask[8], no_mask[8];
static const uint32_t *mask_even(sched_seq *q) {
    return q->n_out < 5 ? even_mask : no_mask;
}

START_TEST(token_mask_hook) {
    start(256, 32, 4, 64, 100, NULL);
    memset(even_mask, 0, sizeof even_mask);
    for (int v = 'a'; v <= 'z'; v++)
        if (v % 2 == 0) even_mask[v / 32] |= 1u << (v % 32);
    int32_t p[2] = { 'o', 'k' };
    sched_seq q;
    init_seq(&q, p, 2, 10);
    q.sampling.temperature = 0.7f;
    sampler_rng_seed(&q.rng, 3);
    q.token_mask = mask_even;
    submit_all(&q, 1);
    wait_finished(1);
    ck_assert_uint_eq(q.n_out, 5);
    for (uint32_t i = 0; i < q.n_out; i++) ck_assert_int_eq(q.out_tokens[i] % 2, 0);
    ck_assert_int_eq(q.finish, SCHED_FINISH_ERROR);
    ck_assert_msg(strstr(q.error, "mask"), "%s", q.error);
    sched_seq_free_outputs(&q);
    wait_pool_empty();
    stop();
}
END_TEST

/* The mock's greedy continuation of prompt with OpenAI presence / frequency
 * penalties over the generated tokens (lowest id on ties). */
static void predict_penalised(const int32_t *p, uint32_t n, uint32_t k, float presence,
                              float frequency, int32_t *out) {
    uint64_t s = 0;
    uint32_t count[256] = { 0 };
    for (uint32_t i = 0; i < n; i++) s += (uint64_t)p[i];
    for (uint32_t i = 0; i < k; i++) {
        int next = 97 + (int)(s % 26), best = -1;
        float bv = 0;
        for (int v = 0; v < 256; v++) {
            float x = -fabsf((float)(v - next));
            if (count[v]) x -= presence + frequency * (float)count[v];
            if (best < 0 || x > bv) {
                best = v;
                bv = x;
            }
        }
        out[i] = best;
        count[best]++;
        s += (uint64_t)best;
    }
}

/* stop_token_ids end a sequence like the end-of-text token; min_tokens
 * holds them and stop strings back; logit_bias and penalties steer greedy
 * decoding exactly as predicted. */
START_TEST(token_controls) {
    start(256, 64, 8, 64, 100, NULL);
    int32_t prompt[3] = { 'a', 'b', 'c' };
    char g[41];
    predict(prompt, 3, 40, g);
    uint32_t k = 3; /* the first token (from 3 on) not generated before */
    while (k < 40 && memchr(g, g[k], k)) k++;
    ck_assert_uint_lt(k, 30);
    int32_t stop_id = (unsigned char)g[k];
    char stop1[2] = { g[0], 0 };
    const char *stops[1] = { stop1 };
    int32_t bias_ids[1] = { 'z' };
    float bias[1] = { 100.0f };
    sched_seq a, b, c, d, e;
    init_seq(&a, prompt, 3, 40); /* stops at the stop token */
    a.stop_token_ids = &stop_id;
    a.n_stop_token_ids = 1;
    init_seq(&b, prompt, 3, 40); /* not before min_tokens */
    b.stop_token_ids = &stop_id;
    b.n_stop_token_ids = 1;
    b.min_tokens = k + 2;
    init_seq(&c, prompt, 3, 3); /* the stop string is not looked for */
    c.stop = stops;
    c.n_stop = 1;
    c.min_tokens = 3;
    init_seq(&d, prompt, 3, 5); /* logit_bias */
    d.bias_ids = bias_ids;
    d.bias = bias;
    d.n_bias = 1;
    init_seq(&e, prompt, 3, 30); /* penalties */
    e.sampling.presence_penalty = 1.5f;
    e.sampling.frequency_penalty = 0.25f;
    sched_seq *ptrs[5] = { &a, &b, &c, &d, &e };
    char err[128];
    ck_assert_int_eq(scheduler_submit(sch, ptrs, 5, err, sizeof err), SCHED_OK);
    wait_finished(5);
    ck_assert_int_eq(a.finish, SCHED_FINISH_STOP);
    ck_assert_uint_eq(a.n_out, k + 1);
    ck_assert_int_eq(a.out_tokens[k], stop_id);
    ck_assert_uint_eq(a.text_len, k); /* the stop token adds no text */
    ck_assert_int_eq(strncmp(a.text, g, k), 0);
    ck_assert_uint_ge(b.n_out, k + 2);
    for (uint32_t i = 0; i < k + 1; i++) ck_assert_int_ne(b.out_tokens[i], stop_id);
    ck_assert_int_eq(strncmp(b.text, g, k), 0);
    ck_assert_int_eq(b.out_tokens[k], stop_id - 1); /* banned: the lower neighbour */
    ck_assert_int_eq(c.finish, SCHED_FINISH_LENGTH);
    ck_assert_uint_eq(c.text_len, 3);
    ck_assert_int_eq(strncmp(c.text, g, 3), 0);
    ck_assert_str_eq(d.text, "zzzzz");
    int32_t want[30];
    predict_penalised(prompt, 3, 30, 1.5f, 0.25f, want);
    ck_assert_uint_eq(e.n_out, 30);
    for (uint32_t i = 0; i < 30; i++) ck_assert_int_eq(e.out_tokens[i], want[i]);
    char plain[31];
    predict(prompt, 3, 30, plain);
    ck_assert_int_ne(memcmp(e.text, plain, 30), 0); /* the penalties did change it */
    sched_seq *all[5] = { &a, &b, &c, &d, &e };
    for (int i = 0; i < 5; i++) sched_seq_free_outputs(all[i]);
    wait_pool_empty();
    stop();
}
END_TEST

/* Prompts sharing prefixes: i % 4 == 0 repeats prompt 0; the others are a
 * common 40-token head plus their own tail. */
static int32_t *shared_prompt(uint32_t i, uint32_t *len) {
    *len = 40 + (i % 4 == 0 ? 0 : 5 + i % 7);
    int32_t *p = make_prompt(*len, 7);
    if (i % 4 != 0)
        for (uint32_t k = 40; k < *len; k++) p[k] = 32 + (int32_t)((k * 3 + i) % 90);
    return p;
}

/* Run N shared-prefix sequences in waves of `wave`, return their texts. */
static void run_shared(uint32_t blocks, uint32_t wave, const char *options, char **texts,
                       scheduler_stats *st_out) {
    enum { N = 16 };
    start(128, blocks, 4, 48, 100, options);
    for (uint32_t w = 0; w < N; w += wave) {
        sched_seq seqs[N];
        int32_t *prompts[N];
        uint32_t n = w + wave > N ? N - w : wave;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t len;
            prompts[i] = shared_prompt(w + i, &len);
            init_seq(&seqs[i], prompts[i], len, 20);
        }
        n_finished = 0;
        submit_all(seqs, n);
        wait_finished((int)n);
        for (uint32_t i = 0; i < n; i++) {
            char want[64];
            predict(prompts[i], seqs[i].n_prompt, 20, want);
            ck_assert_int_eq(seqs[i].finish, SCHED_FINISH_LENGTH);
            ck_assert_str_eq(seqs[i].text, want);
            texts[w + i] = strdup(seqs[i].text);
            if (no_cache) ck_assert_uint_eq(seqs[i].cached_tokens, 0);
            ck_assert_uint_le(seqs[i].cached_tokens, seqs[i].n_prompt - 1);
            sched_seq_free_outputs(&seqs[i]);
            free(prompts[i]);
        }
    }
    wait_pool_empty();
    scheduler_get_stats(sch, st_out);
    stop();
}

START_TEST(prefix_cache_outputs_equal_without_cache) {
    enum { N = 16 };
    char *with[N], *without[N], *small[N];
    scheduler_stats a, b, c;
    run_shared(64, 4, NULL, with, &a);
    no_cache = 1;
    run_shared(64, 4, NULL, without, &b);
    no_cache = 0;
    /* 10 blocks: every wave needs most of the pool, so cached blocks are
     * evicted (and sequences preempted) along the way */
    run_shared(10, 4, NULL, small, &c);
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_str_eq(with[i], without[i]);
        ck_assert_str_eq(small[i], without[i]);
        free(with[i]);
        free(without[i]);
        free(small[i]);
    }
    ck_assert_uint_gt(a.prefix_hits, 0);
    ck_assert_uint_gt(a.prefix_hit_tokens, 0);
    ck_assert_uint_gt(a.kv_blocks_cached, 0);
    ck_assert_uint_eq(b.prefix_hits + b.prefix_misses, 0);
    ck_assert_uint_eq(b.kv_blocks_cached, 0);
    ck_assert_msg(c.kv_blocks_cached <= 10, "%u", c.kv_blocks_cached);
}
END_TEST

START_TEST(prefix_cache_eviction_and_preemption_exact) {
    /* many different prompts through a 12-block pool: old cached blocks are
     * evicted; 6 long sequences at once preempt each other */
    start(128, 12, 6, 64, 100, NULL);
    enum { N = 6 };
    for (int round = 0; round < 3; round++) {
        sched_seq seqs[N];
        int32_t *prompts[N];
        for (uint32_t i = 0; i < N; i++) {
            prompts[i] = make_prompt(20, 200 + (uint32_t)round * (i % 2) + i);
            init_seq(&seqs[i], prompts[i], 20, 60);
        }
        n_finished = 0;
        submit_all(seqs, N);
        wait_finished(N);
        for (uint32_t i = 0; i < N; i++) {
            char want[128];
            predict(prompts[i], 20, 60, want);
            ck_assert_str_eq(seqs[i].text, want);
            sched_seq_free_outputs(&seqs[i]);
            free(prompts[i]);
        }
        wait_pool_empty();
    }
    scheduler_stats st;
    scheduler_get_stats(sch, &st);
    ck_assert_uint_gt(st.preemptions, 0);
    ck_assert_uint_gt(st.prefix_hits, 0); /* re-admissions after preemption */
    ck_assert_uint_le(st.kv_blocks_cached, 12);
    stop();
}
END_TEST

START_TEST(prefix_cache_n_choices_share_one_computation) {
    start(256, 64, 8, 256, 100, NULL);
    int32_t *p = make_prompt(100, 9);
    sched_seq seqs[4];
    for (int i = 0; i < 4; i++) init_seq(&seqs[i], p, 100, 8);
    submit_all(seqs, 4);
    wait_finished(4);
    char want[16];
    predict(p, 100, 8, want);
    uint32_t zero = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(seqs[i].text, want);
        if (seqs[i].cached_tokens == 0)
            zero++;
        else /* forked from the first choice: its whole prompt */
            ck_assert_uint_eq(seqs[i].cached_tokens, 100);
        sched_seq_free_outputs(&seqs[i]);
    }
    ck_assert_uint_eq(zero, 1); /* the prompt was computed once */
    wait_pool_empty();
    scheduler_stats st;
    scheduler_get_stats(sch, &st);
    ck_assert_uint_eq(st.prefix_hits, 3);
    ck_assert_uint_eq(st.prefix_misses, 1);
    ck_assert_uint_eq(st.prefix_hit_tokens, 3 * 100);
    free(p);
    stop();
}
END_TEST

/* Choices of a short prompt (inside one block) share its partial block: each
 * first write copies it (the mock rejects a block written by one sequence
 * and read by another in the same forward), in a roomy pool and in one so
 * small that the choices preempt each other. */
START_TEST(prefix_cache_n_choices_copy_on_write) {
    static const uint32_t pools[2] = {
        64, 8
    }; /* 8: the full blocks are deduplicated, 6 partial ones do not fit */
    for (int k = 0; k < 2; k++) {
        start(128, pools[k], 6, 64, 100, NULL);
        int32_t p[5] = { 'a', 'b', 'c', 'd', 'e' };
        enum { N = 6 };
        sched_seq seqs[N];
        for (int i = 0; i < N; i++) {
            init_seq(&seqs[i], p, 5, 60);
            seqs[i].stream = i % 2;
        }
        n_finished = 0;
        submit_all(seqs, N);
        wait_finished(N);
        char want[64];
        predict(p, 5, 60, want);
        for (int i = 0; i < N; i++) {
            ck_assert_int_eq(seqs[i].finish, SCHED_FINISH_LENGTH);
            ck_assert_str_eq(seqs[i].text, want);
            sched_seq_free_outputs(&seqs[i]);
        }
        wait_pool_empty();
        scheduler_stats st;
        scheduler_get_stats(sch, &st);
        if (k == 0) {
            ck_assert_uint_eq(st.prefix_hits, N - 1); /* every sibling forked */
            ck_assert_uint_eq(st.prefix_hit_tokens, (N - 1) * 5);
        } else {
            ck_assert_msg(st.preemptions > 0, "hits %llu preempt %llu",
                          (unsigned long long)st.prefix_hits,
                          (unsigned long long)st.preemptions);
        }
        stop();
    }
}
END_TEST

START_TEST(prefix_cache_multi_turn_reuses_generated_blocks) {
    start(256, 64, 4, 64, 100, NULL);
    int32_t turn[160]; /* 40 + 3 turns of 30 */
    uint32_t n = 40;
    int32_t *p0 = make_prompt(n, 5);
    memcpy(turn, p0, n * sizeof *turn);
    free(p0);
    for (int t = 0; t < 3; t++) {
        sched_seq q;
        init_seq(&q, turn, n, 20);
        n_finished = 0;
        submit_all(&q, 1);
        wait_finished(1);
        char want[32];
        predict(turn, n, 20, want);
        ck_assert_str_eq(q.text, want);
        /* what the previous turn computed: its prompt and all but its last
         * generated token, in whole blocks (and never the last prompt token) */
        uint32_t prev_computed = t == 0 ? 0 : n - 10 - 1;
        uint32_t want_cached = prev_computed / 16 * 16;
        if (want_cached > (n - 1) / 16 * 16) want_cached = (n - 1) / 16 * 16;
        ck_assert_uint_eq(q.cached_tokens, want_cached);
        /* next turn: this conversation + the reply + 10 new tokens */
        for (uint32_t k = 0; k < 20; k++) turn[n + k] = q.out_tokens[k];
        n += 20;
        for (uint32_t k = 0; k < 10; k++)
            turn[n + k] = 33 + (int32_t)((k + (uint32_t)t) % 50);
        n += 10;
        sched_seq_free_outputs(&q);
    }
    wait_pool_empty();
    stop();
}
END_TEST

START_TEST(prefix_cache_cancel_then_reuse) {
    start(1024, 128, 4, 64, 100, "sleep_ms=2");
    int32_t *p = make_prompt(100, 11);
    sched_seq q;
    init_seq(&q, p, 100, 500);
    q.stream = 1;
    submit_all(&q, 1);
    for (int i = 0; i < 2000; i++) {
        pthread_mutex_lock(&seq_lock);
        uint32_t k = q.n_out;
        pthread_mutex_unlock(&seq_lock);
        if (k >= 3) break;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    atomic_store(&q.cancel, 1);
    scheduler_wake(sch);
    wait_finished(1);
    ck_assert_int_eq(q.finish, SCHED_FINISH_CANCELLED);
    sched_seq_free_outputs(&q);
    wait_pool_empty();
    /* the cancelled sequence's blocks are still cached and correct */
    sched_seq r;
    init_seq(&r, p, 100, 12);
    n_finished = 0;
    submit_all(&r, 1);
    wait_finished(1);
    char want[16];
    predict(p, 100, 12, want);
    ck_assert_str_eq(r.text, want);
    ck_assert_uint_eq(r.cached_tokens, 96);
    sched_seq_free_outputs(&r);
    wait_pool_empty();
    free(p);
    stop();
}
END_TEST

START_TEST(prefix_cache_longest_prefix_first) {
    /* one sequence at a time: after A, the waiting B (unrelated, arrived
     * first) and C (A's prompt + more) are admitted C first */
    start(256, 64, 1, 256, 100, NULL);
    int32_t *pa = make_prompt(64, 21), *pb = make_prompt(30, 22);
    int32_t pc[80];
    memcpy(pc, pa, 64 * sizeof *pc);
    for (int k = 64; k < 80; k++) pc[k] = 40 + k % 20;
    sched_seq a, b, c;
    init_seq(&a, pa, 64, 4);
    submit_all(&a, 1);
    wait_finished(1);
    init_seq(&b, pb, 30, 4);
    init_seq(&c, pc, 80, 4);
    sched_seq *ptrs[2] = { &b, &c };
    char err[128];
    n_finished = 0;
    ck_assert_int_eq(scheduler_submit(sch, ptrs, 2, err, sizeof err), SCHED_OK);
    wait_finished(2);
    ck_assert_uint_eq(c.cached_tokens, 64);
    ck_assert_uint_eq(b.cached_tokens, 0);
    ck_assert_msg(c.t_first_token < b.t_first_token, "C was not admitted first");
    char want[8];
    predict(pc, 80, 4, want);
    ck_assert_str_eq(c.text, want);
    sched_seq_free_outputs(&a);
    sched_seq_free_outputs(&b);
    sched_seq_free_outputs(&c);
    wait_pool_empty();
    free(pa);
    free(pb);
    stop();
}
END_TEST

/* A jump-forward hook: after each sampled token, "XYZ" is forced; the
 * output is complete at 12 tokens. */
static uint32_t forced_xyz(sched_seq *q, int32_t *out, uint32_t cap, int *complete) {
    static const int32_t xyz[3] = { 'X', 'Y', 'Z' };
    uint32_t k = cap < 3 ? cap : 3;
    memcpy(out, xyz, k * sizeof *out);
    *complete = q->n_out + k >= 12;
    return k;
}

/* The expected 12 tokens of a 3-token prompt under forced_xyz: greedy over
 * everything so far (forced tokens included, so their KV must have been
 * computed), then XYZ, until 12 tokens. want: 13 bytes. */
static void predict_forced_xyz(const int32_t p[3], char *want) {
    int32_t all[64];
    uint32_t n_all = 3, n_out = 0;
    memcpy(all, p, 3 * sizeof *p);
    while (n_out < 12) {
        uint64_t sum = 0;
        for (uint32_t i = 0; i < n_all; i++) sum += (uint64_t)all[i];
        all[n_all++] = 97 + (int32_t)(sum % 26);
        want[n_out++] = (char)all[n_all - 1];
        for (int k = 0; k < 3; k++) want[n_out++] = (char)(all[n_all++] = "XYZ"[k]);
    }
    want[12] = '\0';
}

START_TEST(forced_tokens_hook) {
    start(256, 32, 4, 64, 100, NULL);
    int32_t p[3] = { 'j', 'f', 'w' };
    sched_seq q;
    init_seq(&q, p, 3, 20);
    q.want_logprobs = 1;
    q.forced_tokens = forced_xyz;
    submit_all(&q, 1);
    wait_finished(1);
    char want[16];
    predict_forced_xyz(p, want);
    ck_assert_int_eq(q.finish, SCHED_FINISH_STOP);
    ck_assert_uint_eq(q.n_out, 12);
    ck_assert_str_eq(q.text, want);
    for (uint32_t i = 0; i < 12; i++)
        if (i % 4) ck_assert_double_eq(q.out_logprob[i], 0.0); /* forced: certain */
    sched_seq_free_outputs(&q);
    /* max_tokens cuts a forced run short */
    init_seq(&q, p, 3, 6);
    q.forced_tokens = forced_xyz;
    submit_all(&q, 1);
    wait_finished(2);
    ck_assert_int_eq(q.finish, SCHED_FINISH_LENGTH);
    ck_assert_uint_eq(q.n_out, 6);
    ck_assert_int_eq(memcmp(q.text, want, 6), 0);
    sched_seq_free_outputs(&q);
    wait_pool_empty();
    stop();
}
END_TEST

/* n > 1 choices forked from one prompt computation share its partial last
 * block; a forced run (a chunk, not a decode) written after the fork must go
 * into a private copy of it: the mock engine refuses a block written by one
 * sequence and read by another, and the outputs stay exact. */
START_TEST(forced_tokens_after_fork_copy_shared_block) {
    start(256, 32, 4, 64, 100, NULL);
    int32_t p[3] = { 'j', 'f', 'w' };
    sched_seq q[2];
    for (int i = 0; i < 2; i++) {
        init_seq(&q[i], p, 3, 20);
        q[i].forced_tokens = forced_xyz;
    }
    submit_all(q, 2);
    wait_finished(2);
    char want[16];
    predict_forced_xyz(p, want);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(q[i].finish == SCHED_FINISH_STOP, "choice %d: finish %d: %s", i,
                      q[i].finish, q[i].error);
        ck_assert_str_eq(q[i].text, want);
        sched_seq_free_outputs(&q[i]);
    }
    wait_pool_empty();
    stop();
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("scheduler");
    TCase *tc = tcase_create("mock");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, many_sequences_exact_with_chunked_prefill);
    tcase_add_test(tc, preemption_when_pool_runs_out);
    tcase_add_test(tc, stop_strings_across_tokens);
    tcase_add_test(tc, cancel_frees_blocks);
    tcase_add_test(tc, engine_fault_fails_only_its_batch);
    tcase_add_test(tc, waiting_queue_limit);
    tcase_add_test(tc, seeded_sampling_alone_equals_batched);
    tcase_add_test(tc, prompt_and_token_logprobs);
    tcase_add_test(tc, submit_and_create_errors);
    tcase_add_test(tc, token_mask_hook);
    tcase_add_test(tc, token_controls);
    tcase_add_test(tc, forced_tokens_after_fork_copy_shared_block);
    tcase_add_test(tc, prefix_cache_outputs_equal_without_cache);
    tcase_add_test(tc, prefix_cache_eviction_and_preemption_exact);
    tcase_add_test(tc, prefix_cache_n_choices_share_one_computation);
    tcase_add_test(tc, prefix_cache_n_choices_copy_on_write);
    tcase_add_test(tc, prefix_cache_multi_turn_reuses_generated_blocks);
    tcase_add_test(tc, prefix_cache_cancel_then_reuse);
    tcase_add_test(tc, prefix_cache_longest_prefix_first);
    tcase_add_test(tc, forced_tokens_hook);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
