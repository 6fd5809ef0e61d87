/*
 * bench.c - training and inference benchmarks and the in-process machine
 * limits (sgemm peak, memory bandwidth). See bench.h for what is measured.
 */
#include "orchestrator/bench/bench.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "orchestrator/bench/dnnl_gemm.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/block_manager.h"

const uint32_t bench_decode_batches[BENCH_DECODE_BATCHES] = { 1, 4, 16 };

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int available_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static uint32_t lcg_token(uint64_t *s, uint32_t vocab) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((*s >> 33) % vocab);
}

static int engine_fail(const engine_handle *h, const orch_engine_ctx *ctx, int32_t st,
                       const char *what, char *err, size_t cap) {
    char msg[1024];
    engine_format_error(h, ctx, st, msg, sizeof msg);
    util_set_err(err, cap, "%s: %s", what, msg);
    return -1;
}

double bench_train_flops_per_token(const orch_model_desc *m, uint32_t seq_len,
                                   uint64_t *params, uint64_t *params_no_wpe) {
    const uint64_t C = m->width, V = m->vocab_size, T = m->context, L = m->layers;
    const uint64_t M = m->mlp_width ? m->mlp_width : 4 * C;
    if (m->arch == ORCH_ARCH_LLAMA) {
        /* Two RMSNorm weights, q and o [C,C], k and v [KV*D,C], SwiGLU's three
         * [M,C]; the embedding, plus lm_head when untied; the final norm. No
         * position table: every weight but an untied head's embedding rows is
         * read by a decode step. */
        const uint64_t heads = m->heads ? m->heads : 1;
        const uint64_t KV =
            (uint64_t)(m->kv_heads ? m->kv_heads : m->heads) * (C / heads);
        const uint64_t untied = (m->flags & ORCH_MODEL_FLAG_UNTIED_HEAD) ? 1 : 0;
        uint64_t layer = 2 * C + 2 * C * C + 2 * KV * C + 3 * M * C;
        uint64_t all = V * C * (1 + untied) + L * layer + C;
        uint64_t read = all - untied * V * C;
        if (params) *params = all;
        if (params_no_wpe) *params_no_wpe = read;
        return 6.0 * (double)read + 12.0 * (double)L * seq_len * (double)C;
    }
    uint64_t per_layer = 4 * C * C + 2 * M * C + 9 * C + M;
    uint64_t all = V * C + T * C + L * per_layer + 2 * C;
    uint64_t no_wpe = all - T * C;
    if (params) *params = all;
    if (params_no_wpe) *params_no_wpe = no_wpe;
    return 6.0 * (double)no_wpe + 12.0 * (double)L * seq_len * (double)C;
}

/* Run fn(arg, tid, nth) on nth threads (tid 0 on the caller). The threads
 * wait at a gate until all of them exist, so fn may use a barrier of nth;
 * if one cannot be started none runs fn and -1 is returned. */
typedef void (*par_fn)(void *arg, int tid, int nth);
typedef struct par_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* 0 wait, 1 go, -1 abort */
} par_gate;
typedef struct par_thread {
    par_fn fn;
    void *arg;
    int tid, nth;
    par_gate *gate;
} par_thread;

static void *par_main(void *p) {
    par_thread *t = p;
    pthread_mutex_lock(&t->gate->mu);
    while (t->gate->state == 0) pthread_cond_wait(&t->gate->cv, &t->gate->mu);
    int go = t->gate->state == 1;
    pthread_mutex_unlock(&t->gate->mu);
    if (go) t->fn(t->arg, t->tid, t->nth);
    return NULL;
}

static int par_run(int nth, par_fn fn, void *arg) {
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    par_thread *pt = calloc((size_t)nth, sizeof *pt);
    if (!th || !pt) {
        free(th);
        free(pt);
        return -1;
    }
    par_gate gate = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
    int started = 0;
    for (int t = 1; t < nth; t++) {
        pt[t] = (par_thread){ fn, arg, t, nth, &gate };
        if (pthread_create(&th[t], NULL, par_main, &pt[t]) != 0) break;
        started = t;
    }
    const int ok = started == nth - 1;
    pthread_mutex_lock(&gate.mu);
    gate.state = ok ? 1 : -1;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
    if (ok) fn(arg, 0, nth);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
    free(th);
    free(pt);
    return ok ? 0 : -1;
}

static void split(size_t n, int tid, int nth, size_t align, size_t *a, size_t *b) {
    size_t units = (n + align - 1) / align;
    *a = units * (size_t)tid / (size_t)nth * align;
    *b = units * (size_t)(tid + 1) / (size_t)nth * align;
    if (*a > n) *a = n;
    if (*b > n) *b = n;
}

/* ------------------------------------------------------------------------- */
/* sgemm peak                                                                 */
/* ------------------------------------------------------------------------- */

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
#define CBLAS_ROW_MAJOR 101
#define CBLAS_NO_TRANS  111
#define CBLAS_TRANS     112

typedef struct gemm_bench {
    cblas_sgemm_fn sgemm;
    int M, N, K, reps;
    const float *A, *B;
    float *C;
    pthread_barrier_t bar;
    double best;
} gemm_bench;

static void gemm_run(void *arg, int tid, int nth) {
    gemm_bench *g = arg;
    size_t a, b;
    split((size_t)g->N, tid, nth, 16, &a, &b);
    for (int r = 0; r <= g->reps; r++) {
        pthread_barrier_wait(&g->bar);
        double t0 = util_now();
        if (b > a)
            g->sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, g->M, (int)(b - a),
                     g->K, 1.0f, g->A, g->K, g->B + a * g->K, g->K, 0.0f, g->C + a, g->N);
        pthread_barrier_wait(&g->bar);
        double dt = util_now() - t0;
        if (tid == 0 && r > 0 && dt > 0) { /* r == 0 warms up */
            double gf = 2.0 * g->M * (double)g->N * g->K / dt / 1e9;
            if (gf > g->best) g->best = gf;
        }
    }
}

double bench_sgemm_gflops(int threads, int M, int N, int K) {
    void *dl = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!dl) return 0.0;
    cblas_sgemm_fn sgemm = (cblas_sgemm_fn)dlsym(dl, "cblas_sgemm");
    void (*set_threads)(int) = (void (*)(int))dlsym(dl, "openblas_set_num_threads");
    if (!sgemm || !set_threads) {
        dlclose(dl);
        return 0.0;
    }
    set_threads(1); /* like the engine: the threads here do the splitting */
    if (threads <= 0) threads = available_cpus();
    gemm_bench g;
    memset(&g, 0, sizeof g);
    g.sgemm = sgemm;
    g.M = M;
    g.N = N;
    g.K = K;
    g.reps = 3;
    float *A = malloc((size_t)M * K * sizeof(float));
    float *B = malloc((size_t)N * K * sizeof(float));
    float *C = malloc((size_t)M * N * sizeof(float));
    double best = 0.0;
    if (A && B && C) {
        for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 13) * 0.01f;
        for (size_t i = 0; i < (size_t)N * K; i++) B[i] = (float)(i % 7) * 0.01f;
        g.A = A;
        g.B = B;
        g.C = C;
        pthread_barrier_init(&g.bar, NULL, (unsigned)threads);
        if (par_run(threads, gemm_run, &g) == 0) best = g.best;
        pthread_barrier_destroy(&g.bar);
    }
    free(A);
    free(B);
    free(C);
    dlclose(dl);
    return best;
}

/* ------------------------------------------------------------------------- */
/* Memory bandwidth                                                           */
/* ------------------------------------------------------------------------- */

/* 16-byte vectors: native on every x86-64 (SSE2) and arm64 (NEON) without
 * extra compiler flags; eight accumulators hide the add latency. */
typedef float v4f __attribute__((vector_size(16)));

#define BW_FLOATS ((size_t)32 << 20) /* 128 MiB per buffer */
#define BW_REPS   5

typedef struct bw_bench {
    float *a, *b, *c;
    size_t n;
    pthread_barrier_t bar;
    double best_read, best_triad;
    float sink[256];
} bw_bench;

static float read_sum(const float *p, size_t n) {
    const v4f *v = (const v4f *)(const void *)p;
    v4f s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 }, s4 = { 0 }, s5 = { 0 },
        s6 = { 0 }, s7 = { 0 };
    size_t i = 0, nv = n / 4;
    for (; i + 8 <= nv; i += 8) {
        s0 += v[i];
        s1 += v[i + 1];
        s2 += v[i + 2];
        s3 += v[i + 3];
        s4 += v[i + 4];
        s5 += v[i + 5];
        s6 += v[i + 6];
        s7 += v[i + 7];
    }
    for (; i < nv; i++) s0 += v[i];
    v4f s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void triad(float *a, const float *b, const float *c, float s, size_t n) {
    v4f *va = (v4f *)(void *)a;
    const v4f *vb = (const v4f *)(const void *)b, *vc = (const v4f *)(const void *)c;
    const v4f sv = { s, s, s, s };
    for (size_t i = 0; i < n / 4; i++) va[i] = vb[i] + sv * vc[i];
}

static void bw_run(void *arg, int tid, int nth) {
    bw_bench *w = arg;
    size_t lo, hi;
    split(w->n, tid, nth, 64, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        w->a[i] = 1.0f;
        w->b[i] = 2.0f;
        w->c[i] = 0.5f;
    }
    for (int r = 0; r <= BW_REPS; r++) {
        pthread_barrier_wait(&w->bar);
        double t0 = util_now();
        float s = read_sum(w->a + lo, hi - lo);
        pthread_barrier_wait(&w->bar);
        double t1 = util_now();
        triad(w->a + lo, w->b + lo, w->c + lo, 3.0f, hi - lo);
        pthread_barrier_wait(&w->bar);
        double t2 = util_now();
        w->sink[tid % 256] += s;
        if (tid == 0 && r > 0) {
            double rd = 4.0 * w->n / (t1 - t0) / 1e9;
            double tr = 12.0 * w->n / (t2 - t1) / 1e9;
            if (rd > w->best_read) w->best_read = rd;
            if (tr > w->best_triad) w->best_triad = tr;
        }
    }
}

int bench_mem_bw(int threads, double *read_gbs, double *triad_gbs, char *err,
                 size_t err_cap) {
    if (threads <= 0) threads = available_cpus();
    bw_bench *w = calloc(1, sizeof *w);
    if (!w) {
        util_set_err(err, err_cap, "bandwidth: out of memory");
        return -1;
    }
    w->n = BW_FLOATS;
    w->a = aligned_alloc(64, w->n * sizeof(float));
    w->b = aligned_alloc(64, w->n * sizeof(float));
    w->c = aligned_alloc(64, w->n * sizeof(float));
    int rc = -1;
    if (w->a && w->b && w->c) {
        pthread_barrier_init(&w->bar, NULL, (unsigned)threads);
        if (par_run(threads, bw_run, w) == 0) {
            *read_gbs = w->best_read;
            *triad_gbs = w->best_triad;
            rc = 0;
        } else {
            util_set_err(err, err_cap, "bandwidth: cannot start %d threads", threads);
        }
        pthread_barrier_destroy(&w->bar);
    } else {
        util_set_err(err, err_cap, "bandwidth: cannot allocate 3 x 128 MiB");
    }
    free(w->a);
    free(w->b);
    free(w->c);
    free(w);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Training                                                                   */
/* ------------------------------------------------------------------------- */

int bench_train(const engine_handle *h, const orch_model_desc *model,
                const bench_train_opts *o, bench_train_result *r, char *err,
                size_t err_cap) {
    const orch_engine_api *api = h->api;
    memset(r, 0, sizeof *r);
    if (!(api->capabilities & ORCH_CAP_TRAIN)) {
        util_set_err(err, err_cap, "engine %s cannot train", api->name);
        return -1;
    }
    if (o->batch == 0 || o->seq_len == 0 || o->steps == 0) {
        util_set_err(err, err_cap, "batch, seq and steps must be > 0");
        return -1;
    }
    if (o->seq_len > model->context) {
        util_set_err(err, err_cap, "seq %u exceeds the model context %u", o->seq_len,
                     model->context);
        return -1;
    }
    orch_engine_ctx *ctx = NULL;
    if (engine_create_context(h, model, o->threads, o->seed, o->options, &ctx, err,
                              err_cap) != 0)
        return -1;
    const size_t n = (size_t)o->batch * o->seq_len;
    int32_t *tokens = malloc((n + 1) * sizeof(int32_t));
    double *times = calloc(o->steps, sizeof(double));
    int rc = -1;
    if (!tokens || !times) {
        util_set_err(err, err_cap, "out of memory");
        goto done;
    }
    uint64_t s = o->seed ^ 0x5DEECE66Dull;
    for (size_t i = 0; i <= n; i++) tokens[i] = (int32_t)lcg_token(&s, model->vocab_size);
    double sum = 0.0;
    for (uint32_t step = 0; step < o->warmup + o->steps; step++) {
        orch_adamw_params p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.step = step + 1;
        p.lr = 1e-4f;
        p.beta1 = 0.9f;
        p.beta2 = 0.95f;
        p.eps = 1e-8f;
        p.weight_decay = 0.1f;
        p.grad_clip = 1.0f;
        float loss = 0.0f;
        double t0 = util_now();
        int32_t st = api->grads_zero(ctx);
        if (st == ORCH_OK)
            st = api->forward_backward(ctx, tokens, tokens + 1, o->batch, o->seq_len,
                                       1.0f, &loss);
        if (st == ORCH_OK) st = api->optimizer_step(ctx, &p, NULL);
        double dt = util_now() - t0;
        if (st != ORCH_OK) {
            engine_fail(h, ctx, st, "training step", err, err_cap);
            goto done;
        }
        if (step == 0) r->first_loss = loss;
        r->last_loss = loss;
        if (step >= o->warmup) {
            times[step - o->warmup] = dt;
            sum += dt;
        }
    }
    r->batch = o->batch;
    r->seq_len = o->seq_len;
    r->steps = o->steps;
    r->threads = o->threads ? o->threads : (uint32_t)available_cpus();
    r->flops_per_token =
        bench_train_flops_per_token(model, o->seq_len, &r->params, &r->params_no_wpe);
    r->ms_per_step_mean = 1e3 * sum / o->steps;
    r->ms_per_step = 1e3 * median(times, o->steps);
    r->tokens_per_s = (double)n / (r->ms_per_step / 1e3);
    r->model_gflops_per_s = r->flops_per_token * r->tokens_per_s / 1e9;
    /* Peak RSS of the training run, before the GEMM probes below allocate
     * their own [batch*seq, vocab] buffers. */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) r->peak_rss_mb = ru.ru_maxrss / 1024.0;
    /* The engine's context is still alive (OpenBLAS or oneDNN loaded, same
     * threads): the best GEMM of the precision on the model's own shapes. */
    const int bf16 = o->precision && strcmp(o->precision, "bf16") == 0;
    snprintf(r->precision, sizeof r->precision, "%s", bf16 ? "bf16" : "fp32");
    const int C = (int)model->width,
              M = (int)(model->mlp_width ? model->mlp_width : 4 * model->width);
    const int shapes[4][2] = {
        { 3 * C, C }, { M, C }, { C, M }, { (int)model->vocab_size, C }
    };
    for (int k = 0; k < 4; k++) {
        double gf =
            bench_sgemm_gflops((int)r->threads, (int)n, shapes[k][0], shapes[k][1]);
        if (gf > r->sgemm_peak_gflops_per_s) r->sgemm_peak_gflops_per_s = gf;
        if (bf16) {
            gf = dnnl_gemm_bf16_gflops((int)r->threads, (int)n, shapes[k][0],
                                       shapes[k][1]);
            if (gf > r->best_gemm_gflops_per_s) r->best_gemm_gflops_per_s = gf;
        }
    }
    if (!bf16) r->best_gemm_gflops_per_s = r->sgemm_peak_gflops_per_s;
    r->best_gemm = bf16 ? "oneDNN bf16 matmul" : "OpenBLAS sgemm";
    if (r->best_gemm_gflops_per_s > 0)
        r->mfu = r->model_gflops_per_s / r->best_gemm_gflops_per_s;
    machine_peak_measure((int)r->threads, &r->peak);
    r->physical_peak_gflops = bf16 ? r->peak.bf16.gflops : r->peak.fp32.gflops;
    if (r->physical_peak_gflops > 0)
        r->mfu_physical = r->model_gflops_per_s / r->physical_peak_gflops;
    rc = 0;
done:
    free(tokens);
    free(times);
    api->context_destroy(ctx);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Inference                                                                  */
/* ------------------------------------------------------------------------- */

static int32_t run_batch(const orch_engine_api *api, orch_engine_ctx *ctx,
                         const orch_seq_input *seqs, uint32_t n, float *logits,
                         uint64_t cap) {
    orch_infer_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_seqs = n;
    b.seq_stride = sizeof(orch_seq_input);
    b.seqs = seqs;
    return api->infer_forward(ctx, &b, logits, cap);
}

int bench_infer(const engine_handle *h, const orch_model_desc *model,
                const bench_infer_opts *o, bench_infer_result *r, char *err,
                size_t err_cap) {
    const orch_engine_api *api = h->api;
    memset(r, 0, sizeof *r);
    if (!(api->capabilities & ORCH_CAP_INFER)) {
        util_set_err(err, err_cap, "engine %s cannot run inference", api->name);
        return -1;
    }
    const uint32_t V = model->vocab_size,
                   bs = o->block_size ? o->block_size : ORCH_KV_BLOCK_TOKENS;
    uint32_t prompt = o->prompt_len < model->context ? o->prompt_len : model->context;
    uint32_t dprompt = o->decode_prompt, dsteps = o->decode_steps;
    if (prompt == 0 || dsteps == 0 || dprompt == 0 ||
        (uint64_t)dprompt + dsteps + 1 > model->context) {
        util_set_err(err, err_cap,
                     "prompt, decode prompt and decode steps must be > 0 and "
                     "decode prompt + steps must fit the context %u",
                     model->context);
        return -1;
    }
    const uint32_t maxb = bench_decode_batches[BENCH_DECODE_BATCHES - 1];
    const uint32_t per_seq = (dprompt + dsteps + 1 + bs - 1) / bs;
    const uint32_t prefill_blocks = (prompt + bs - 1) / bs;
    const uint32_t nblocks =
        maxb * per_seq > prefill_blocks ? maxb * per_seq : prefill_blocks;
    orch_engine_ctx *ctx = NULL;
    if (engine_create_context(h, model, o->threads, o->seed, o->options, &ctx, err,
                              err_cap) != 0)
        return -1;
    int rc = -1;
    int32_t *tokens =
        malloc((size_t)(prompt > maxb * (dprompt + 1) ? prompt : maxb * (dprompt + 1)) *
               sizeof(int32_t));
    int32_t *table = malloc((size_t)nblocks * sizeof(int32_t));
    float *logits = malloc((size_t)maxb * V * sizeof(float));
    orch_seq_input *seqs = calloc(maxb, sizeof *seqs);
    double *times = calloc(dsteps > 8 ? dsteps : 8, sizeof(double));
    if (!tokens || !table || !logits || !seqs || !times) {
        util_set_err(err, err_cap, "out of memory");
        goto done;
    }
    int32_t st = api->kv_configure(ctx, bs, nblocks);
    if (st != ORCH_OK) {
        engine_fail(h, ctx, st, "kv_configure", err, err_cap);
        goto done;
    }
    for (uint32_t b = 0; b < nblocks; b++) table[b] = (int32_t)b;
    uint64_t s = o->seed ^ 0xB5297A4Dull;
    /* Prefill: one sequence, `prompt` tokens, last logits; median of 3. */
    for (uint32_t i = 0; i < prompt; i++) tokens[i] = (int32_t)lcg_token(&s, V);
    for (int rep = 0; rep < 4; rep++) {
        orch_seq_input q;
        memset(&q, 0, sizeof q);
        q.tokens = tokens;
        q.n_tokens = prompt;
        q.block_table = table;
        q.n_blocks = prefill_blocks;
        q.logits_mode = ORCH_LOGITS_LAST;
        double t0 = util_now();
        st = run_batch(api, ctx, &q, 1, logits, V);
        double dt = util_now() - t0;
        if (st != ORCH_OK) {
            engine_fail(h, ctx, st, "prefill", err, err_cap);
            goto done;
        }
        if (rep > 0) times[rep - 1] = dt; /* rep 0 warms up (packing, pages) */
    }
    r->prefill_tokens_per_s = prompt / median(times, 3);
    /* Decode: n sequences, each prefilled with dprompt tokens, then dsteps
     * steps of one token each; median step time. */
    /* Bandwidth right before and right after the single-sequence decode
     * (the same minutes of a possibly shared machine); the better counts. */
    double rd[2] = { 0, 0 }, tr[2] = { 0, 0 };
    const int bw_threads = (int)(o->threads ? o->threads : (uint32_t)available_cpus());
    if (bench_mem_bw(bw_threads, &rd[0], &tr[0], err, err_cap) != 0) goto done;
    for (int k = 0; k < BENCH_DECODE_BATCHES; k++) {
        const uint32_t nb = bench_decode_batches[k];
        if (k == 1 && bench_mem_bw(bw_threads, &rd[1], &tr[1], err, err_cap) != 0)
            goto done;
        for (uint32_t i = 0; i < nb; i++) {
            int32_t *t = tokens + (size_t)i * (dprompt + 1);
            for (uint32_t j = 0; j < dprompt; j++) t[j] = (int32_t)lcg_token(&s, V);
            memset(&seqs[i], 0, sizeof seqs[i]);
            seqs[i].tokens = t;
            seqs[i].n_tokens = dprompt;
            seqs[i].block_table = table + (size_t)i * per_seq;
            seqs[i].n_blocks = per_seq;
            seqs[i].logits_mode = ORCH_LOGITS_LAST;
        }
        st = run_batch(api, ctx, seqs, nb, logits, (uint64_t)nb * V);
        if (st != ORCH_OK) {
            engine_fail(h, ctx, st, "decode prompt", err, err_cap);
            goto done;
        }
        for (uint32_t step = 0; step <= dsteps; step++) {
            for (uint32_t i = 0; i < nb; i++) {
                int32_t *t = tokens + (size_t)i * (dprompt + 1) + dprompt;
                *t = (int32_t)lcg_token(&s, V);
                seqs[i].tokens = t;
                seqs[i].n_tokens = 1;
                seqs[i].start_pos = dprompt + step;
            }
            double t0 = util_now();
            st = run_batch(api, ctx, seqs, nb, logits, (uint64_t)nb * V);
            double dt = util_now() - t0;
            if (st != ORCH_OK) {
                engine_fail(h, ctx, st, "decode", err, err_cap);
                goto done;
            }
            if (step > 0) times[step - 1] = dt; /* step 0 warms up */
        }
        r->decode_tokens_per_s[k] = nb / median(times, dsteps);
    }
    r->prompt_len = prompt;
    r->decode_prompt = dprompt;
    r->decode_steps = dsteps;
    r->threads = o->threads ? o->threads : (uint32_t)available_cpus();
    uint64_t params = 0, no_wpe = 0;
    bench_train_flops_per_token(model, 1, &params, &no_wpe);
    /* Bytes read per decode step: every matrix (LM head = wte included) in
     * the weight format, biases and LayerNorm in fp32, one wpe row. */
    const int int8 = o->weights && strcmp(o->weights, "int8") == 0;
    snprintf(r->weights, sizeof r->weights, "%s", int8 ? "int8" : "fp32");
    const double C = model->width, Mw = model->mlp_width ? model->mlp_width : 4 * C;
    const double matrices =
        (double)model->vocab_size * C + model->layers * (4.0 * C * C + 2.0 * Mw * C);
    const double others = (double)no_wpe - matrices + C;
    r->weight_bytes = int8 ? BENCH_INT8_BYTES_PER_WEIGHT * matrices + 4.0 * others
                           : 4.0 * ((double)no_wpe + model->width);
    r->read_gb_per_s = rd[0] > rd[1] ? rd[0] : rd[1];
    r->triad_gb_per_s = tr[0] > tr[1] ? tr[0] : tr[1];
    r->mem_bw_gb_per_s =
        r->read_gb_per_s > r->triad_gb_per_s ? r->read_gb_per_s : r->triad_gb_per_s;
    r->decode_bw_fraction =
        r->weight_bytes * r->decode_tokens_per_s[0] / (r->mem_bw_gb_per_s * 1e9);
    rc = 0;
done:
    free(tokens);
    free(table);
    free(logits);
    free(seqs);
    free(times);
    api->context_destroy(ctx);
    return rc;
}
