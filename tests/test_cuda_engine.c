/*
 * test_cuda_engine.c - the CUDA engine checked against the CPU engine, both
 * loaded side by side through the loader, on a tiny GPT-2 whose weights the
 * test writes into both through the tensor tables:
 *   - tables: same names, shapes, offsets and flags (NO_DECAY on biases and
 *     LayerNorm parameters only)
 *   - logits (fp32 mode) within 1e-3, eval loss within 1e-4
 *   - one backward: loss within 1e-4, every gradient tensor within 1e-3
 *     relative (max-norm), and accumulation over two calls
 *   - 10 AdamW steps with clipping and weight decay: losses within 1e-3
 *   - KV-cache decoding (uneven prefill chunks, then one token at a time,
 *     three sequences with shuffled block tables, block size 4) equal to a
 *     full forward within 1e-4, and to the CPU engine's decoding
 *   - checkpoint portability: PARAM/ADAM_M/ADAM_V tables GPU -> CPU and
 *     CPU -> GPU, then the same next step on both
 *   - bit-identical results run to run; tf32/bf16 math modes close to fp32
 *   - bad calls: options, tokens, positions, block ids, too few blocks,
 *     logits capacity, shared written blocks, copy overlap, out of device
 *     memory (an error, and the context stays usable)
 *
 * The CUDA engine is `cuda` (libengine_cuda.so), or the library named by
 * ORCH_CUDA_ENGINE (tests/cuda_emu.sh points it at the engine built against
 * the CPU emulator, so all of this also runs where there is no GPU). Where
 * the engine cannot run here (no GPU, not built) the suite prints one line
 * saying so and exits 77 (skipped).
 *
 * Fork mode: the parent only loads and probes (the CUDA engine's probe uses
 * NVML, never the CUDA runtime, so the forked children can still use CUDA).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "tests/test_util.h"

/* the tiny model: odd sizes everywhere to catch index mistakes */
#define V    67u
#define CTX  40u
#define NL   2u
#define NH   3u
#define C    48u
#define M    100u
#define NT   (2u + 12u * NL + 2u)
#define SEED 4242u

static engine_handle gpu, cpu;

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */

static orch_engine_ctx *make_ctx(const engine_handle *h, const char *options) {
    orch_model_desc m = test_model_desc(V, CTX, NL, NH, C);
    m.mlp_width = M;
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(h, &m, 2, SEED, options, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: %s", h->api->name, err);
    return ctx;
}

#define CHECK_OK(h, ctx, call)                                                        \
    do {                                                                              \
        int32_t st_ = (call);                                                         \
        ck_assert_msg(st_ == ORCH_OK, "%s: %s -> %d: %s", (h)->api->name, #call, st_, \
                      (h)->api->last_error(ctx));                                     \
    } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* [0,1) */
    return (double)(test_xorshift64(&rng) >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static void read_table(const engine_handle *h, orch_engine_ctx *ctx, test_table *tb) {
    test_read_table(h->api, ctx, ORCH_TENSOR_PARAM, tb);
    ck_assert_uint_eq(tb->n, NT);
}

/* Deterministic weights: matrices U(-0.15,0.15), LayerNorm weights around 1,
 * biases small but non-zero (so every bias gradient path is exercised). */
static float *make_weights(const test_table *tb) {
    float *w = malloc(tb->total * sizeof(float));
    ck_assert_ptr_nonnull(w);
    rng = 0x1234567ull;
    for (uint32_t i = 0; i < NT; i++) {
        const orch_tensor_info *t = &tb->info[i];
        float *p = w + t->offset;
        int is_ln_w = strstr(t->name, "ln_") && strstr(t->name, ".weight");
        for (uint64_t k = 0; k < t->numel; k++) {
            if (t->ndim == 2)
                p[k] = frand(-0.15f, 0.15f);
            else if (is_ln_w)
                p[k] = 1.0f + frand(-0.2f, 0.2f);
            else
                p[k] = frand(-0.05f, 0.05f);
        }
    }
    return w;
}

/* A pair of contexts (CUDA, CPU) holding the same weights. */
typedef struct pair {
    orch_engine_ctx *g, *c;
    test_table tb;
    float *w;
} pair;

static void pair_open(pair *p, const char *gpu_options) {
    p->g = make_ctx(&gpu, gpu_options);
    p->c = make_ctx(&cpu, NULL);
    read_table(&cpu, p->c, &p->tb);
    p->w = make_weights(&p->tb);
    test_write_kind(gpu.api, p->g, ORCH_TENSOR_PARAM, &p->tb, p->w);
    test_write_kind(cpu.api, p->c, ORCH_TENSOR_PARAM, &p->tb, p->w);
}

static void pair_close(pair *p) {
    gpu.api->context_destroy(p->g);
    cpu.api->context_destroy(p->c);
    free(p->w);
}

/* A training batch: B x T tokens, targets = the next token, every 7th -1. */
static void make_batch(uint32_t B, uint32_t T, uint64_t seed, int32_t *tok,
                       int32_t *tgt) {
    rng = seed * 2654435761ull + 1;
    for (uint32_t i = 0; i < B * T; i++) tok[i] = (int32_t)(urand() * V);
    for (uint32_t i = 0; i < B * T; i++) {
        tgt[i] = (i % T + 1 < T) ? tok[i + 1] : (int32_t)(urand() * V);
        if (i % 7 == 3) tgt[i] = -1;
    }
}

/* Every tensor of `got` within rel (max-norm) of `want`. */
static void expect_tensors_close(const test_table *tb, const float *got,
                                 const float *want, double rel, const char *what) {
    for (uint32_t i = 0; i < NT; i++) {
        const orch_tensor_info *t = &tb->info[i];
        double scale = test_max_abs(want + t->offset, t->numel);
        double d = test_max_diff(got + t->offset, want + t->offset, t->numel);
        ck_assert_msg(d <= rel * scale + 1e-7,
                      "%s: %s differs by %g (max |ref| %g, allowed rel %g)", what,
                      t->name, d, scale, rel);
    }
}

static orch_adamw_params adamw(uint64_t step) {
    return test_adamw(step, 3e-3f, 0.1f,
                      0.5f); /* clip small enough for the first steps */
}

/* One training step (zero, forward+backward, AdamW); returns the loss. */
static float train_step(const engine_handle *h, orch_engine_ctx *ctx, const int32_t *tok,
                        const int32_t *tgt, uint32_t B, uint32_t T, uint64_t step,
                        float *norm) {
    float loss = NAN;
    CHECK_OK(h, ctx, h->api->grads_zero(ctx));
    CHECK_OK(h, ctx, h->api->forward_backward(ctx, tok, tgt, B, T, 1.0f, &loss));
    orch_adamw_params p = adamw(step);
    CHECK_OK(h, ctx, h->api->optimizer_step(ctx, &p, norm));
    return loss;
}

/* ------------------------------------------------------------------------- */
/* Inference helpers                                                          */
/* ------------------------------------------------------------------------- */

/* Logits of every position of one sequence in one call (blocks 0..). */
static float *full_forward(const engine_handle *h, orch_engine_ctx *ctx,
                           const int32_t *tok, uint32_t n, uint32_t bs) {
    int32_t table[CTX];
    for (uint32_t i = 0; i < CTX; i++) table[i] = (int32_t)i;
    float *out = malloc((size_t)n * V * sizeof(float));
    ck_assert_ptr_nonnull(out);
    orch_seq_input s =
        test_seq_input(tok, n, 0, table, (n + bs - 1) / bs, ORCH_LOGITS_ALL);
    CHECK_OK(h, ctx, test_infer(h->api, ctx, &s, 1, out, (uint64_t)n * V));
    return out;
}

/* ------------------------------------------------------------------------- */
/* Tests                                                                      */
/* ------------------------------------------------------------------------- */

START_TEST(test_tables_match) {
    orch_engine_ctx *g = make_ctx(&gpu, NULL), *c = make_ctx(&cpu, NULL);
    test_table tg, tc;
    read_table(&gpu, g, &tg);
    read_table(&cpu, c, &tc);
    ck_assert_uint_eq(tg.total, tc.total);
    for (uint32_t i = 0; i < NT; i++) {
        const orch_tensor_info *a = &tg.info[i], *b = &tc.info[i];
        ck_assert_str_eq(a->name, b->name);
        ck_assert_uint_eq(a->ndim, b->ndim);
        ck_assert_uint_eq(a->shape[0], b->shape[0]);
        ck_assert_uint_eq(a->shape[1], b->shape[1]);
        ck_assert_uint_eq(a->numel, b->numel);
        ck_assert_uint_eq(a->offset, b->offset);
        ck_assert_uint_eq(a->dtype, ORCH_DTYPE_F32);
        ck_assert_msg(a->flags == b->flags, "%s: flags %u vs %u", a->name, a->flags,
                      b->flags);
        int no_decay = (a->flags & ORCH_TENSOR_FLAG_NO_DECAY) != 0;
        ck_assert_msg(no_decay == (a->ndim == 1), "%s: NO_DECAY %d with %u dims", a->name,
                      no_decay, a->ndim);
        for (uint32_t k = ORCH_TENSOR_ADAM_M; k <= ORCH_TENSOR_ADAM_V; k++) {
            orch_tensor_info o;
            memset(&o, 0, sizeof o);
            o.struct_size = sizeof o;
            CHECK_OK(&gpu, g, gpu.api->tensor_info(g, k, i, &o));
            ck_assert_str_eq(o.name, a->name);
            ck_assert_uint_eq(o.numel, a->numel);
        }
    }
    ck_assert_str_eq(tg.info[0].name, "wte.weight");
    ck_assert_str_eq(tg.info[NT - 1].name, "ln_f.bias");
    /* The engine's own initialisation follows the ABI rule. */
    float *p = test_read_kind(gpu.api, g, ORCH_TENSOR_PARAM, &tg);
    for (uint32_t i = 0; i < NT; i++) {
        const orch_tensor_info *t = &tg.info[i];
        const float *x = p + t->offset;
        double s = 0, s2 = 0;
        for (uint64_t k = 0; k < t->numel; k++) {
            s += x[k];
            s2 += (double)x[k] * x[k];
        }
        double mean = s / (double)t->numel,
               sd = sqrt(s2 / (double)t->numel - mean * mean);
        if (t->ndim == 1) {
            double want = strstr(t->name, ".bias") ? 0.0 : 1.0;
            ck_assert_msg(fabs(mean - want) < 1e-7 && sd < 1e-6,
                          "%s: initialised to mean %g sd %g, want constant %g", t->name,
                          mean, sd, want);
        } else {
            double want = strstr(t->name, "c_proj.weight") ? 0.02 / sqrt(2.0 * NL) : 0.02;
            ck_assert_msg(fabs(sd - want) < 0.12 * want && fabs(mean) < 0.1 * want,
                          "%s: initialised with mean %g sd %g, want N(0, %g)", t->name,
                          mean, sd, want);
        }
    }
    /* ... and draws the same numbers as the CPU engine for the same seed. */
    float *pc = test_read_kind(cpu.api, c, ORCH_TENSOR_PARAM, &tc);
    expect_tensors_close(&tg, p, pc, 1e-6,
                         "initialisation vs the CPU engine (same seed)");
    free(pc);
    free(p);
    gpu.api->context_destroy(g);
    cpu.api->context_destroy(c);
}
END_TEST

START_TEST(test_logits_parity) {
    pair p;
    pair_open(&p, "math=fp32");
    const uint32_t bs = 16;
    CHECK_OK(&gpu, p.g, gpu.api->kv_configure(p.g, bs, 16));
    CHECK_OK(&cpu, p.c, cpu.api->kv_configure(p.c, bs, 16));
    int32_t ta[29], tb[CTX];
    rng = 77;
    for (int i = 0; i < 29; i++) ta[i] = (int32_t)(urand() * V);
    for (uint32_t i = 0; i < CTX; i++) tb[i] = (int32_t)(urand() * V);
    int32_t bt_a[2] = { 3, 0 }, bt_b[3] = { 5, 1, 9 };
    orch_seq_input s[2] = { test_seq_input(ta, 29, 0, bt_a, 2, ORCH_LOGITS_ALL),
                            test_seq_input(tb, CTX, 0, bt_b, 3, ORCH_LOGITS_ALL) };
    uint64_t n = (uint64_t)(29 + CTX) * V;
    float *lg = malloc(n * sizeof(float)), *lc = malloc(n * sizeof(float));
    CHECK_OK(&gpu, p.g, test_infer(gpu.api, p.g, s, 2, lg, n));
    CHECK_OK(&cpu, p.c, test_infer(cpu.api, p.c, s, 2, lc, n));
    double d = test_max_diff(lg, lc, n);
    ck_assert_msg(d <= 1e-3, "logits differ from the CPU engine by %g (max |logit| %g)",
                  d, test_max_abs(lc, n));
    ck_assert_msg(test_max_abs(lc, n) > 0.1, "degenerate logits");

    int32_t tok[3 * 21], tgt[3 * 21];
    make_batch(3, 21, 5, tok, tgt);
    float eg = NAN, ec = NAN;
    CHECK_OK(&gpu, p.g, gpu.api->eval_loss(p.g, tok, tgt, 3, 21, &eg));
    CHECK_OK(&cpu, p.c, cpu.api->eval_loss(p.c, tok, tgt, 3, 21, &ec));
    ck_assert_msg(test_close(eg, ec, 1e-4, 1e-7), "eval loss %.7f vs CPU %.7f", eg, ec);
    free(lg);
    free(lc);
    pair_close(&p);
}
END_TEST

START_TEST(test_grad_parity) {
    pair p;
    pair_open(&p, NULL);
    const uint32_t B = 3, T = 23;
    int32_t tok[3 * 23], tgt[3 * 23];
    make_batch(B, T, 11, tok, tgt);
    float lg = NAN, lc = NAN;
    CHECK_OK(&gpu, p.g, gpu.api->grads_zero(p.g));
    CHECK_OK(&cpu, p.c, cpu.api->grads_zero(p.c));
    CHECK_OK(&gpu, p.g, gpu.api->forward_backward(p.g, tok, tgt, B, T, 0.5f, &lg));
    CHECK_OK(&cpu, p.c, cpu.api->forward_backward(p.c, tok, tgt, B, T, 0.5f, &lc));
    ck_assert_msg(test_close(lg, lc, 1e-4, 1e-7), "loss %.7f vs CPU %.7f", lg, lc);
    float *gg = test_read_grads(gpu.api, p.g, p.tb.total);
    float *gc = test_read_grads(cpu.api, p.c, p.tb.total);
    for (uint32_t i = 0; i < NT; i++)
        ck_assert_msg(test_max_abs(gc + p.tb.info[i].offset, p.tb.info[i].numel) > 0 ||
                          strcmp(p.tb.info[i].name, "wpe.weight") == 0,
                      "%s: zero gradient on the CPU engine", p.tb.info[i].name);
    expect_tensors_close(&p.tb, gg, gc, 1e-3, "gradient after one backward");
    free(gg);
    free(gc);

    /* A second micro-batch (another shape) adds to the gradients. */
    int32_t tok2[2 * 9], tgt2[2 * 9];
    make_batch(2, 9, 12, tok2, tgt2);
    CHECK_OK(&gpu, p.g, gpu.api->forward_backward(p.g, tok2, tgt2, 2, 9, 0.5f, &lg));
    CHECK_OK(&cpu, p.c, cpu.api->forward_backward(p.c, tok2, tgt2, 2, 9, 0.5f, &lc));
    ck_assert_msg(test_close(lg, lc, 1e-4, 1e-7), "second loss %.7f vs CPU %.7f", lg, lc);
    gg = test_read_grads(gpu.api, p.g, p.tb.total);
    gc = test_read_grads(cpu.api, p.c, p.tb.total);
    expect_tensors_close(&p.tb, gg, gc, 1e-3, "gradient after two accumulated backwards");

    /* grads_write / grads_read round trip at an offset. */
    float probe[5] = { 1.5f, -2.0f, 0.25f, 8.0f, -0.125f }, back[5];
    uint64_t off = p.tb.info[3].offset + 2;
    CHECK_OK(&gpu, p.g, gpu.api->grads_write(p.g, off, 5, probe));
    CHECK_OK(&gpu, p.g, gpu.api->grads_read(p.g, off, 5, back));
    ck_assert(memcmp(probe, back, sizeof probe) == 0);
    /* All targets ignored: loss 0 and no gradient change. */
    int32_t none[2 * 9];
    for (int i = 0; i < 18; i++) none[i] = -1;
    float *before = test_read_grads(gpu.api, p.g, p.tb.total);
    CHECK_OK(&gpu, p.g, gpu.api->forward_backward(p.g, tok2, none, 2, 9, 1.0f, &lg));
    ck_assert(lg == 0.0f);
    float *after = test_read_grads(gpu.api, p.g, p.tb.total);
    ck_assert(memcmp(before, after, p.tb.total * sizeof(float)) == 0);
    free(before);
    free(after);
    free(gg);
    free(gc);
    pair_close(&p);
}
END_TEST

START_TEST(test_adamw_parity) {
    pair p;
    pair_open(&p, NULL);
    const uint32_t B = 2, T = 19;
    int32_t tok[2 * 19], tgt[2 * 19];
    float first = 0, last = 0;
    for (uint64_t step = 1; step <= 10; step++) {
        make_batch(B, T, 100 + step % 3, tok, tgt);
        float ng = NAN, nc = NAN;
        float lg = train_step(&gpu, p.g, tok, tgt, B, T, step, &ng);
        float lc = train_step(&cpu, p.c, tok, tgt, B, T, step, &nc);
        ck_assert_msg(fabsf(lg - lc) <= 1e-3f, "step %llu: loss %.6f vs CPU %.6f",
                      (unsigned long long)step, lg, lc);
        ck_assert_msg(test_close(ng, nc, 1e-3, 1e-7),
                      "step %llu: grad norm %.6f vs CPU %.6f", (unsigned long long)step,
                      ng, nc);
        if (step == 1) first = lg;
        last = lg;
    }
    ck_assert_msg(last < first, "loss did not fall: %.4f -> %.4f", first, last);
    /* clipped gradients were written back, as on the CPU engine */
    float *gg = test_read_grads(gpu.api, p.g, p.tb.total);
    float *gc = test_read_grads(cpu.api, p.c, p.tb.total);
    expect_tensors_close(&p.tb, gg, gc, 2e-3, "clipped gradients after step 10");
    /* Parameters get a looser bound: AdamW turns rounding noise in gradients
     * that are zero in exact arithmetic (the key bias of attention: softmax
     * ignores a constant added to every score) into +-lr steps. */
    const double tol[3] = { 2e-2, 5e-3, 5e-3 };
    const char *what[3] = { "params after 10 steps", "adam m after 10 steps",
                            "adam v after 10 steps" };
    for (uint32_t k = ORCH_TENSOR_PARAM; k <= ORCH_TENSOR_ADAM_V; k++) {
        float *a = test_read_kind(gpu.api, p.g, k, &p.tb);
        float *b = test_read_kind(cpu.api, p.c, k, &p.tb);
        expect_tensors_close(&p.tb, a, b, tol[k], what[k]);
        free(a);
        free(b);
    }
    /* A non-finite gradient norm changes nothing. */
    float *w0 = test_read_kind(gpu.api, p.g, ORCH_TENSOR_PARAM, &p.tb);
    float inf = INFINITY;
    CHECK_OK(&gpu, p.g, gpu.api->grads_write(p.g, 7, 1, &inf));
    orch_adamw_params ap = adamw(11);
    float norm = 123.0f;
    ck_assert_int_eq(gpu.api->optimizer_step(p.g, &ap, &norm), ORCH_ERR_NUMERIC);
    ck_assert(norm == 123.0f);
    ck_assert(gpu.api->last_error(p.g)[0] != '\0');
    float *w1 = test_read_kind(gpu.api, p.g, ORCH_TENSOR_PARAM, &p.tb);
    ck_assert(memcmp(w0, w1, p.tb.total * sizeof(float)) == 0);
    free(w0);
    free(w1);
    free(gg);
    free(gc);
    pair_close(&p);
}
END_TEST

/* The decoding script: three sequences, prefill in uneven chunks with mixed
 * logits modes, then one token at a time (sequence 2 sits some steps out).
 * Every logit row produced goes to rows[s][position]. */
#define KV_BS   4u
#define KV_SEQS 3
static const uint32_t kv_len[KV_SEQS] = { 23, 17, 9 };

static void run_decode(const engine_handle *h, orch_engine_ctx *ctx,
                       int32_t tok[KV_SEQS][CTX], float *rows[KV_SEQS],
                       int produced[KV_SEQS][CTX]) {
    /* shuffled, disjoint block tables */
    int32_t tables[KV_SEQS][CTX / KV_BS];
    int32_t perm[30];
    for (int i = 0; i < 30; i++) perm[i] = i;
    rng = 99;
    for (int i = 29; i > 0; i--) {
        int j = (int)(urand() * (i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0, k = 0; s < KV_SEQS; s++)
        for (uint32_t j = 0; j < (kv_len[s] + KV_BS - 1) / KV_BS; j++)
            tables[s][j] = perm[k++];
    uint32_t done[KV_SEQS] = { 0, 0, 0 };
    const uint32_t chunk0[KV_SEQS] = { 5, 7, 3 },
                   mode0[KV_SEQS] = { ORCH_LOGITS_LAST, ORCH_LOGITS_ALL,
                                      ORCH_LOGITS_NONE };
    const uint32_t chunk1[KV_SEQS] = { 6, 1, 4 },
                   mode1[KV_SEQS] = { ORCH_LOGITS_ALL, ORCH_LOGITS_LAST,
                                      ORCH_LOGITS_LAST };
    float *out = malloc((size_t)CTX * KV_SEQS * V * sizeof(float));
    for (int step = 0;; step++) {
        orch_seq_input in[KV_SEQS];
        int which[KV_SEQS];
        uint32_t n = 0, modes[KV_SEQS], counts[KV_SEQS];
        for (int s = 0; s < KV_SEQS; s++) {
            uint32_t cnt, mode;
            if (step == 0)
                cnt = chunk0[s], mode = mode0[s];
            else if (step == 1)
                cnt = chunk1[s], mode = mode1[s];
            else
                cnt = 1, mode = ORCH_LOGITS_LAST;
            if (s == 2 && step >= 2 && step % 3 == 0) cnt = 0; /* sits out */
            if (done[s] + cnt > kv_len[s]) cnt = kv_len[s] - done[s];
            if (cnt == 0) continue;
            /* the table covers exactly what this step needs */
            uint32_t nb = (done[s] + cnt + KV_BS - 1) / KV_BS;
            in[n] = test_seq_input(tok[s] + done[s], cnt, done[s], tables[s], nb, mode);
            which[n] = s;
            modes[n] = mode;
            counts[n] = cnt;
            n++;
        }
        if (n == 0) break;
        CHECK_OK(h, ctx,
                 test_infer(h->api, ctx, in, n, out, (uint64_t)CTX * KV_SEQS * V));
        size_t r = 0;
        for (uint32_t i = 0; i < n; i++) {
            int s = which[i];
            uint32_t first = modes[i] == ORCH_LOGITS_ALL ? 0 : counts[i] - 1;
            uint32_t rcount = modes[i] == ORCH_LOGITS_ALL    ? counts[i]
                              : modes[i] == ORCH_LOGITS_LAST ? 1
                                                             : 0;
            for (uint32_t k = 0; k < rcount; k++, r++) {
                uint32_t pos = done[s] + first + k;
                memcpy(rows[s] + (size_t)pos * V, out + r * V, V * sizeof(float));
                produced[s][pos] = 1;
            }
            done[s] += counts[i];
        }
    }
    free(out);
}

START_TEST(test_kv_decode) {
    pair p;
    pair_open(&p, NULL);
    CHECK_OK(&gpu, p.g, gpu.api->kv_configure(p.g, KV_BS, 32));
    CHECK_OK(&cpu, p.c, cpu.api->kv_configure(p.c, KV_BS, 32));
    int32_t tok[KV_SEQS][CTX];
    rng = 31337;
    for (int s = 0; s < KV_SEQS; s++)
        for (uint32_t i = 0; i < CTX; i++) tok[s][i] = (int32_t)(urand() * V);
    float *rg[KV_SEQS], *rc[KV_SEQS];
    int pg[KV_SEQS][CTX], pc[KV_SEQS][CTX];
    memset(pg, 0, sizeof pg);
    memset(pc, 0, sizeof pc);
    for (int s = 0; s < KV_SEQS; s++) {
        rg[s] = calloc((size_t)CTX * V, sizeof(float));
        rc[s] = calloc((size_t)CTX * V, sizeof(float));
    }
    run_decode(&gpu, p.g, tok, rg, pg);
    run_decode(&cpu, p.c, tok, rc, pc);
    int compared = 0;
    for (int s = 0; s < KV_SEQS; s++) {
        float *full = full_forward(&gpu, p.g, tok[s], kv_len[s], KV_BS);
        for (uint32_t pos = 0; pos < kv_len[s]; pos++) {
            ck_assert_int_eq(pg[s][pos], pc[s][pos]);
            if (!pg[s][pos]) continue;
            compared++;
            double d = test_max_diff(rg[s] + (size_t)pos * V, full + (size_t)pos * V, V);
            ck_assert_msg(d <= 1e-4,
                          "seq %d pos %u: decoded logits differ from the full "
                          "forward by %g",
                          s, pos, d);
            d = test_max_diff(rg[s] + (size_t)pos * V, rc[s] + (size_t)pos * V, V);
            ck_assert_msg(d <= 1e-3,
                          "seq %d pos %u: decoded logits differ from the CPU "
                          "engine by %g",
                          s, pos, d);
        }
        free(full);
        free(rg[s]);
        free(rc[s]);
    }
    ck_assert_int_eq(compared, 39); /* A: 1+6+12, B: 7+1+9, C: 1+2 */
    pair_close(&p);
}
END_TEST

START_TEST(test_kv_copy) {
    /* Copy-on-write: a prefix copied to fresh blocks decodes the same. */
    orch_engine_ctx *g = make_ctx(&gpu, NULL);
    CHECK_OK(&gpu, g, gpu.api->kv_configure(g, KV_BS, 12));
    int32_t tok[14];
    rng = 5;
    for (int i = 0; i < 14; i++) tok[i] = (int32_t)(urand() * V);
    int32_t ta[4] = { 7, 2, 9, 4 }, tb[4] = { 1, 8, 3, 0 };
    float la[V], lb[V];
    orch_seq_input s = test_seq_input(tok, 10, 0, ta, 3, ORCH_LOGITS_NONE);
    CHECK_OK(&gpu, g, test_infer(gpu.api, g, &s, 1, NULL, 0));
    int32_t src[3] = { 7, 2, 9 }, dst[3] = { 1, 8, 3 };
    CHECK_OK(&gpu, g, gpu.api->kv_copy_blocks(g, src, dst, 3));
    orch_seq_input a = test_seq_input(tok + 10, 4, 10, ta, 4, ORCH_LOGITS_LAST);
    orch_seq_input b = test_seq_input(tok + 10, 4, 10, tb, 4, ORCH_LOGITS_LAST);
    CHECK_OK(&gpu, g, test_infer(gpu.api, g, &a, 1, la, V));
    CHECK_OK(&gpu, g, test_infer(gpu.api, g, &b, 1, lb, V));
    ck_assert_msg(memcmp(la, lb, sizeof la) == 0, "copied blocks decode differently");
    /* overlapping sets are refused */
    int32_t s2[2] = { 1, 2 }, d2[2] = { 2, 5 };
    ck_assert_int_ne(gpu.api->kv_copy_blocks(g, s2, d2, 2), ORCH_OK);
    int32_t s3[1] = { 1 }, d3[1] = { 12 };
    ck_assert_int_ne(gpu.api->kv_copy_blocks(g, s3, d3, 1), ORCH_OK);
    gpu.api->context_destroy(g);
}
END_TEST

START_TEST(test_portability) {
    /* GPU -> CPU */
    for (int dir = 0; dir < 2; dir++) {
        const engine_handle *src_h = dir == 0 ? &gpu : &cpu,
                            *dst_h = dir == 0 ? &cpu : &gpu;
        pair p;
        pair_open(&p, NULL);
        orch_engine_ctx *src = dir == 0 ? p.g : p.c;
        int32_t tok[2 * 15], tgt[2 * 15];
        for (uint64_t step = 1; step <= 3; step++) {
            make_batch(2, 15, 300 + step, tok, tgt);
            (void)train_step(src_h, src, tok, tgt, 2, 15, step, NULL);
        }
        /* a fresh destination context takes the three tables */
        orch_engine_ctx *dst = make_ctx(dst_h, NULL);
        for (uint32_t k = ORCH_TENSOR_PARAM; k <= ORCH_TENSOR_ADAM_V; k++) {
            float *all = test_read_kind(src_h->api, src, k, &p.tb);
            test_write_kind(dst_h->api, dst, k, &p.tb, all);
            float *back = test_read_kind(dst_h->api, dst, k, &p.tb);
            ck_assert(memcmp(all, back, p.tb.total * sizeof(float)) == 0);
            free(all);
            free(back);
        }
        make_batch(2, 15, 999, tok, tgt);
        float es = NAN, ed = NAN;
        CHECK_OK(src_h, src, src_h->api->eval_loss(src, tok, tgt, 2, 15, &es));
        CHECK_OK(dst_h, dst, dst_h->api->eval_loss(dst, tok, tgt, 2, 15, &ed));
        ck_assert_msg(test_close(es, ed, 1e-4, 1e-7), "%s -> %s: eval loss %.7f vs %.7f",
                      src_h->api->name, dst_h->api->name, es, ed);
        /* the next step continues identically (moments came along) */
        float ls = train_step(src_h, src, tok, tgt, 2, 15, 4, NULL);
        float ld = train_step(dst_h, dst, tok, tgt, 2, 15, 4, NULL);
        ck_assert_msg(test_close(ls, ld, 1e-4, 1e-7), "step 4 loss %.7f vs %.7f", ls, ld);
        float *a = test_read_kind(src_h->api, src, ORCH_TENSOR_PARAM, &p.tb);
        float *b = test_read_kind(dst_h->api, dst, ORCH_TENSOR_PARAM, &p.tb);
        expect_tensors_close(&p.tb, b, a, 2e-3,
                             dir == 0 ? "GPU->CPU params after step 4"
                                      : "CPU->GPU params after step 4");
        free(a);
        free(b);
        dst_h->api->context_destroy(dst);
        pair_close(&p);
    }
}
END_TEST

START_TEST(test_determinism) {
    pair p;
    pair_open(&p, NULL);
    orch_engine_ctx *g2 = make_ctx(&gpu, NULL);
    test_write_kind(gpu.api, g2, ORCH_TENSOR_PARAM, &p.tb, p.w);
    int32_t tok[3 * 17], tgt[3 * 17];
    make_batch(3, 17, 8, tok, tgt);
    float a = NAN, b = NAN;
    CHECK_OK(&gpu, p.g, gpu.api->grads_zero(p.g));
    CHECK_OK(&gpu, g2, gpu.api->grads_zero(g2));
    CHECK_OK(&gpu, p.g, gpu.api->forward_backward(p.g, tok, tgt, 3, 17, 1.0f, &a));
    CHECK_OK(&gpu, g2, gpu.api->forward_backward(g2, tok, tgt, 3, 17, 1.0f, &b));
    ck_assert(memcmp(&a, &b, sizeof a) == 0);
    float *ga = test_read_grads(gpu.api, p.g, p.tb.total);
    float *gb = test_read_grads(gpu.api, g2, p.tb.total);
    ck_assert_msg(memcmp(ga, gb, p.tb.total * sizeof(float)) == 0,
                  "gradients differ between two runs");
    float na = 0, nb = 0;
    orch_adamw_params ap = adamw(1);
    CHECK_OK(&gpu, p.g, gpu.api->optimizer_step(p.g, &ap, &na));
    CHECK_OK(&gpu, g2, gpu.api->optimizer_step(g2, &ap, &nb));
    ck_assert(memcmp(&na, &nb, sizeof na) == 0);
    float *wa = test_read_kind(gpu.api, p.g, ORCH_TENSOR_PARAM, &p.tb);
    float *wb = test_read_kind(gpu.api, g2, ORCH_TENSOR_PARAM, &p.tb);
    ck_assert(memcmp(wa, wb, p.tb.total * sizeof(float)) == 0);
    free(ga);
    free(gb);
    free(wa);
    free(wb);
    gpu.api->context_destroy(g2);
    pair_close(&p);
}
END_TEST

START_TEST(test_math_modes) {
    const char *modes[2] = { "math=tf32", "math=bf16" };
    const double loss_tol[2] = { 5e-3, 3e-2 }, grad_tol[2] = { 2e-2, 1e-1 };
    int32_t tok[2 * 20], tgt[2 * 20];
    make_batch(2, 20, 21, tok, tgt);
    for (int m = 0; m < 2; m++) {
        pair p;
        pair_open(&p, modes[m]);
        float lg = NAN, lc = NAN;
        CHECK_OK(&gpu, p.g, gpu.api->grads_zero(p.g));
        CHECK_OK(&cpu, p.c, cpu.api->grads_zero(p.c));
        CHECK_OK(&gpu, p.g, gpu.api->forward_backward(p.g, tok, tgt, 2, 20, 1.0f, &lg));
        CHECK_OK(&cpu, p.c, cpu.api->forward_backward(p.c, tok, tgt, 2, 20, 1.0f, &lc));
        ck_assert_msg(test_close(lg, lc, loss_tol[m], 1e-7),
                      "%s: loss %.6f vs fp32 CPU %.6f", modes[m], lg, lc);
        float *gg = test_read_grads(gpu.api, p.g, p.tb.total);
        float *gc = test_read_grads(cpu.api, p.c, p.tb.total);
        double num = 0, den = 0;
        for (uint64_t i = 0; i < p.tb.total; i++) {
            double d = (double)gg[i] - gc[i];
            num += d * d;
            den += (double)gc[i] * gc[i];
        }
        ck_assert_msg(sqrt(num / den) <= grad_tol[m], "%s: relative L2 gradient error %g",
                      modes[m], sqrt(num / den));
        free(gg);
        free(gc);
        pair_close(&p);
    }
}
END_TEST

static void expect_fail(orch_engine_ctx *ctx, int32_t st, int32_t want,
                        const char *what) {
    ck_assert_msg(st != ORCH_OK, "%s was accepted", what);
    if (want >= 0)
        ck_assert_msg(st == want, "%s gave status %d, expected %d", what, st, want);
    const char *le = gpu.api->last_error(ctx);
    ck_assert_msg(le && *le, "%s: no last_error", what);
}

START_TEST(test_bad_calls) {
    orch_model_desc m = test_model_desc(V, CTX, NL, NH, C);
    m.mlp_width = M;
    const char *bad_opts[] = { "math=fp64", "device=99", "colour=blue", "math" };
    for (size_t i = 0; i < sizeof bad_opts / sizeof bad_opts[0]; i++) {
        orch_engine_options o = { sizeof o, 1, SEED, bad_opts[i] };
        orch_engine_ctx *ctx = NULL;
        char err[512] = "";
        int32_t st = gpu.api->context_create(&m, &o, &ctx, err, sizeof err);
        ck_assert_msg(st == ORCH_ERR_INVALID_ARGUMENT, "option '%s' gave %d", bad_opts[i],
                      st);
        ck_assert_ptr_null(ctx);
        ck_assert_msg(err[0], "option '%s': no message", bad_opts[i]);
    }
    orch_engine_ctx *g = make_ctx(&gpu, "math=fp32; device=0");
    float logits[4 * V];
    int32_t tok[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    int32_t table[3] = { 0, 1, 2 };
    orch_seq_input s = test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_LAST);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), ORCH_ERR_STATE,
                "infer without a pool");
    CHECK_OK(&gpu, g, gpu.api->kv_configure(g, 4, 6));

    int32_t bad_tok[4] = { 1, (int32_t)V, 3, 4 };
    s = test_seq_input(bad_tok, 4, 0, table, 1, ORCH_LOGITS_LAST);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), ORCH_ERR_INVALID_ARGUMENT,
                "token id = V");
    s = test_seq_input(tok, 4, CTX - 2, table, 3, ORCH_LOGITS_LAST);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), -1,
                "positions past the context");
    int32_t bad_table[2] = { 0, 6 };
    s = test_seq_input(tok, 8, 0, bad_table, 2, ORCH_LOGITS_LAST);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), -1,
                "block id outside the pool");
    s = test_seq_input(tok, 8, 0, table, 1, ORCH_LOGITS_LAST);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), -1, "too few blocks");
    s = test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_ALL);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, 4 * V - 1), ORCH_ERR_CAPACITY,
                "logits capacity one short");
    int32_t t2[2] = { 0, 3 };
    orch_seq_input two[2] = { test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_LAST),
                              test_seq_input(tok, 6, 0, t2, 2, ORCH_LOGITS_LAST) };
    expect_fail(g, test_infer(gpu.api, g, two, 2, logits, 2 * V), -1,
                "a block written by two sequences of one batch");
    /* reading positions that were never written */
    int32_t fresh[2] = { 4, 5 };
    s = test_seq_input(tok, 1, 5, fresh, 2, ORCH_LOGITS_LAST);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), ORCH_ERR_STATE,
                "reading K/V that was never written");
    /* a block twice in one table */
    int32_t twice[2] = { 4, 4 };
    s = test_seq_input(tok, 8, 0, twice, 2, ORCH_LOGITS_LAST);
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), ORCH_ERR_INVALID_ARGUMENT,
                "a block twice in one table");
    s = test_seq_input(tok, 2, 0, table, 1, ORCH_LOGITS_LAST);
    s.adapter_id = 3;
    expect_fail(g, test_infer(gpu.api, g, &s, 1, logits, V), ORCH_ERR_INVALID_ARGUMENT,
                "adapter_id 3");
    /* ... and the context is fine afterwards */
    s = test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_ALL);
    CHECK_OK(&gpu, g, test_infer(gpu.api, g, &s, 1, logits, 4 * V));

    float loss = 99.0f;
    int32_t tgt[8] = { 2, 3, 4, 5, 6, 7, 8, 9 };
    expect_fail(g, gpu.api->forward_backward(g, bad_tok, tgt, 1, 4, 1.0f, &loss),
                ORCH_ERR_INVALID_ARGUMENT, "training token id = V");
    int32_t long_tok[CTX + 1], long_tgt[CTX + 1];
    for (uint32_t i = 0; i <= CTX; i++) long_tok[i] = long_tgt[i] = 1;
    expect_fail(g,
                gpu.api->forward_backward(g, long_tok, long_tgt, 1, CTX + 1, 1.0f, &loss),
                -1, "seq_len past the context");
    ck_assert(loss == 99.0f);

    /* Out of device memory is an error, not a crash, and the context lives on. */
    expect_fail(g, gpu.api->kv_configure(g, 16, 1u << 25), ORCH_ERR_OUT_OF_MEMORY,
                "a 400 GB KV pool");
    CHECK_OK(&gpu, g, gpu.api->kv_configure(g, 4, 6));
    CHECK_OK(&gpu, g, test_infer(gpu.api, g, &s, 1, logits, 4 * V));
    CHECK_OK(&gpu, g, gpu.api->forward_backward(g, tok, tgt, 2, 4, 1.0f, &loss));
    ck_assert(isfinite(loss) && loss > 0.0f);
    gpu.api->context_destroy(g);
}
END_TEST

/* ------------------------------------------------------------------------- */

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_default_engine_path();
    const char *gpu_value = getenv("ORCH_CUDA_ENGINE");
    if (!gpu_value || !*gpu_value) gpu_value = "cuda";
    char err[2048];
    if (engine_load(gpu_value, &gpu, err, sizeof err) != 0) {
        printf("test_cuda_engine: skipped: %s\n", err);
        return 77;
    }
    if (engine_load("cpu", &cpu, err, sizeof err) != 0) {
        printf("test_cuda_engine: skipped: the CPU engine (the parity reference) cannot "
               "be loaded: %s\n",
               err);
        engine_unload(&gpu);
        return 77;
    }
    printf("test_cuda_engine: %s (%s) against %s\n", gpu.path, gpu.probe_msg, cpu.path);
    Suite *s = suite_create("cuda_engine");
    TCase *tc = tcase_create("parity");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tables_match);
    tcase_add_test(tc, test_logits_parity);
    tcase_add_test(tc, test_grad_parity);
    tcase_add_test(tc, test_adamw_parity);
    tcase_add_test(tc, test_kv_decode);
    tcase_add_test(tc, test_kv_copy);
    tcase_add_test(tc, test_portability);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_math_modes);
    tcase_add_test(tc, test_bad_calls);
    suite_add_tcase(s, tc);
    int rc = test_run_suite(s);
    engine_unload(&gpu);
    engine_unload(&cpu);
    return rc;
}
