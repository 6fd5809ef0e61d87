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
 * and LLaMA (ABI 1.1) directly against the torch fixtures
 * tests/fixtures/cpu_llama_tiny_kv{1,2,4}.safetensors (grouped-query
 * attention with 4, 2 and 1 query heads per K/V head; no, linear and llama3
 * RoPE scaling; tied and untied heads): the table and initialisation rule,
 * eval loss and logits (1e-4), every gradient (1e-3 relative) and their
 * accumulation, 10 AdamW steps with clipping (losses 1e-4, norms 1e-4
 * relative), KV-cached decoding through shuffled block tables and
 * kv_copy_blocks equal to the fixture's logits (1e-4), tf32/bf16 math, the
 * model rules, bit-identical reruns; and against the CPU engine once it runs
 * llama (until then that case prints that it is skipped).
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
#include "orchestrator/store/safetensors.h"
#include "tests/test_fixture.h"
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

/* ZeRO-1 on the CUDA engine (ABI 1.2): two contexts standing for two ranks,
 * each keeping the moments of half the flat buffer (optimizer_shard), run
 * optimizer_step_range on their half with the global norm computed here and
 * exchange the updated halves (param_read / param_write, the all-gather);
 * they must track one context taking whole-buffer steps. Same kernels, so
 * the bound is tight; the difference is the clip scale from a host-summed
 * f32 norm. Moments come back through moments_read and match per shard. */
START_TEST(test_zero_range_parity) {
    if (!ORCH_API_HAS(gpu.api, optimizer_step_range)) {
        printf("cuda engine without ABI 1.2: test skipped\n");
        return;
    }
    pair p;
    pair_open(&p, NULL);
    orch_engine_ctx *r[2] = { make_ctx(&gpu, NULL), make_ctx(&gpu, NULL) };
    const uint64_t n = p.tb.total, half = n / 2 + 5; /* inside a tensor */
    const uint64_t off[2] = { 0, half }, cnt[2] = { half, n - half };
    for (int k = 0; k < 2; k++) {
        test_write_kind(gpu.api, r[k], ORCH_TENSOR_PARAM, &p.tb, p.w);
        CHECK_OK(&gpu, r[k], gpu.api->optimizer_shard(r[k], off[k], cnt[k]));
    }
    const uint32_t B = 2, T = 19;
    int32_t tok[2 * 19], tgt[2 * 19];
    float *buf = malloc(n * sizeof(float));
    for (uint64_t step = 1; step <= 6; step++) {
        make_batch(B, T, 200 + step % 3, tok, tgt);
        float nf = NAN;
        train_step(&gpu, p.g, tok, tgt, B, T, step, &nf);
        float lr0 = 0, lr1 = 0;
        CHECK_OK(&gpu, r[0], gpu.api->grads_zero(r[0]));
        CHECK_OK(&gpu, r[1], gpu.api->grads_zero(r[1]));
        CHECK_OK(&gpu, r[0], gpu.api->forward_backward(r[0], tok, tgt, B, T, 1.0f, &lr0));
        CHECK_OK(&gpu, r[1], gpu.api->forward_backward(r[1], tok, tgt, B, T, 1.0f, &lr1));
        ck_assert(lr0 == lr1); /* same weights, same kernels: same bits */
        float *g = test_read_grads(gpu.api, r[0], n);
        double sq = 0;
        for (uint64_t j = 0; j < n; j++) sq += (double)g[j] * g[j];
        free(g);
        ck_assert_msg(test_close(sqrt(sq), nf, 1e-5, 1e-7), "step %llu: norm %g vs %g",
                      (unsigned long long)step, sqrt(sq), (double)nf);
        orch_adamw_params ap = adamw(step);
        for (int k = 0; k < 2; k++) {
            CHECK_OK(&gpu, r[k],
                     gpu.api->optimizer_step_range(r[k], &ap, off[k], cnt[k],
                                                   (float)sqrt(sq)));
            CHECK_OK(&gpu, r[k], gpu.api->param_read(r[k], off[k], cnt[k], buf + off[k]));
        }
        for (int k = 0; k < 2; k++) { /* the all-gather */
            int o = 1 - k;
            CHECK_OK(&gpu, r[k],
                     gpu.api->param_write(r[k], off[o], cnt[o], buf + off[o]));
        }
    }
    float *want = test_read_kind(gpu.api, p.g, ORCH_TENSOR_PARAM, &p.tb);
    expect_tensors_close(&p.tb, buf, want, 1e-4, "ZeRO-1 params after 6 steps");
    free(want);
    /* the moments of each shard */
    for (uint32_t kind = ORCH_TENSOR_ADAM_M; kind <= ORCH_TENSOR_ADAM_V; kind++) {
        float *m = test_read_kind(gpu.api, p.g, kind, &p.tb);
        for (int k = 0; k < 2; k++)
            CHECK_OK(&gpu, r[k],
                     gpu.api->moments_read(r[k], kind, off[k], cnt[k], buf + off[k]));
        expect_tensors_close(&p.tb, buf, m, 1e-4, "ZeRO-1 moments after 6 steps");
        free(m);
    }
    /* device memory of the moments: about half each */
    uint64_t bf = 0, b0 = 0, b1 = 0;
    CHECK_OK(&gpu, p.g, gpu.api->optimizer_bytes(p.g, &bf));
    CHECK_OK(&gpu, r[0], gpu.api->optimizer_bytes(r[0], &b0));
    CHECK_OK(&gpu, r[1], gpu.api->optimizer_bytes(r[1], &b1));
    ck_assert_msg(bf >= 8 * n && b0 <= bf / 2 + 1024 && b1 <= bf / 2 + 1024 &&
                      b0 >= 8 * cnt[0] && b1 >= 8 * cnt[1],
                  "optimizer bytes: whole %llu, shards %llu and %llu",
                  (unsigned long long)bf, (unsigned long long)b0, (unsigned long long)b1);
    /* a sharded context refuses whole-table moment calls */
    float *one = malloc(p.tb.info[0].numel * sizeof(float));
    ck_assert_int_eq(gpu.api->tensor_read(r[1], ORCH_TENSOR_ADAM_M, 0, one,
                                          p.tb.info[0].numel * sizeof(float)),
                     ORCH_ERR_STATE);
    orch_adamw_params ap = adamw(7);
    ck_assert_int_eq(gpu.api->optimizer_step(r[1], &ap, NULL), ORCH_ERR_STATE);
    ck_assert_int_eq(gpu.api->optimizer_step_range(r[1], &ap, 0, 4, 1.0f),
                     ORCH_ERR_STATE);
    free(one);
    free(buf);
    gpu.api->context_destroy(r[0]);
    gpu.api->context_destroy(r[1]);
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
/* LLaMA (ABI 1.1) against the torch fixtures                                 */
/* ------------------------------------------------------------------------- */
/* tests/fixtures/cpu_llama_tiny_kv{1,2,4}.safetensors (tools/torch_reference.py
 * --arch llama, float64 torch rounded to f32): kv4 tied head, no RoPE
 * scaling; kv2 untied head, linear scaling; kv1 llama3 scaling (so all three
 * GQA shapes G = 4, 2, 1 and all three RoPE frequency rules are covered).
 * Tolerances: the engine runs fp32 against a float64 reference on a model of
 * width 32 and 2 layers, so logits and losses agree to a few 1e-6; 1e-4
 * absolute leaves room for cuBLAS's summation orders and stays far below any
 * real mistake (a wrong RoPE pairing or head mapping moves logits by 1e-2 or
 * more). Gradients are compared per tensor in max-norm, 1e-3 relative, as the
 * GPT-2 suites do. */

#define LLAMA_FIXTURES 3
static const char *const llama_fixture[LLAMA_FIXTURES] = {
    "tests/fixtures/cpu_llama_tiny_kv1.safetensors",
    "tests/fixtures/cpu_llama_tiny_kv2.safetensors",
    "tests/fixtures/cpu_llama_tiny_kv4.safetensors",
};

typedef struct llama_fx {
    const char *path;
    safetensors_file *f;
    orch_model_desc m;
    uint32_t B, T, steps;
    const int32_t *tokens, *targets;
    const float *logits; /* [B, T, V] */
    float loss;
} llama_fx;

static const void *fx_get(const llama_fx *x, const char *name, int dtype, size_t *numel) {
    const safetensors_tensor *t = safetensors_find(x->f, name);
    ck_assert_msg(t != NULL, "%s lacks tensor %s", x->path, name);
    ck_assert_msg(t->dtype == dtype, "%s: tensor %s is not %s", x->path, name,
                  safetensors_dtype_name(dtype));
    *numel = (size_t)t->numel;
    return t->data;
}

static const char *fx_meta_str(const llama_fx *x, const char *key) {
    const char *v = safetensors_metadata(x->f, key);
    ck_assert_msg(v != NULL, "%s: metadata lacks %s", x->path, key);
    return v;
}

static double fx_meta(const llama_fx *x, const char *key) {
    return atof(fx_meta_str(x, key));
}

/* Open fixture i and build its model description from the metadata. */
static void llama_fx_open(llama_fx *x, int i) {
    memset(x, 0, sizeof *x);
    x->path = llama_fixture[i];
    x->f = test_fixture_open(x->path);
    x->m = test_fixture_llama_model(x->f);
    x->B = (uint32_t)fx_meta(x, "batch");
    x->T = (uint32_t)fx_meta(x, "seq_len");
    x->steps = (uint32_t)fx_meta(x, "steps");
    size_t n;
    x->tokens = fx_get(x, "tokens", SAFETENSORS_I32, &n);
    ck_assert_uint_eq(n, (size_t)x->B * x->T);
    x->targets = fx_get(x, "targets", SAFETENSORS_I32, &n);
    x->logits = fx_get(x, "logits", SAFETENSORS_F32, &n);
    ck_assert_uint_eq(n, (size_t)x->B * x->T * x->m.vocab_size);
    x->loss = ((const float *)fx_get(x, "loss", SAFETENSORS_F32, &n))[0];
}

static void llama_fx_close(llama_fx *x) { safetensors_close(x->f); }

/* A context of the fixture's model on engine h; with st not NULL, a refusal
 * returns NULL with the engine's status in *st and its message in err. */
static orch_engine_ctx *llama_ctx(const engine_handle *h, const llama_fx *x,
                                  const char *options, int32_t *st, char *err,
                                  size_t err_cap) {
    orch_engine_ctx *ctx = NULL;
    char buf[1024];
    if (st) {
        orch_engine_options o = { sizeof o, 2, SEED, options };
        *st = h->api->context_create(&x->m, &o, &ctx, err, (uint32_t)err_cap);
        return *st == ORCH_OK ? ctx : NULL;
    }
    int rc = engine_create_context(h, &x->m, 2, SEED, options, &ctx, buf, sizeof buf);
    ck_assert_msg(rc == 0, "%s: %s: %s", h->api->name, x->path, buf);
    return ctx;
}

/* Write the fixture's param.* tensors into ctx by name; the table must hold
 * exactly the fixture's tensors. */
static void llama_load(const engine_handle *h, orch_engine_ctx *ctx, const llama_fx *x,
                       test_table *tb) {
    test_read_table(h->api, ctx, ORCH_TENSOR_PARAM, tb);
    uint32_t in_file = 0;
    for (size_t i = 0; i < safetensors_count(x->f); i++)
        in_file += strncmp(safetensors_get(x->f, i)->name, "param.", 6) == 0;
    ck_assert_uint_eq(tb->n, in_file);
    test_load_fixture_params(h->api, ctx, x->f);
}

/* Every gradient tensor of g against the fixture's grad.* within rel of
 * its max |ref| (max-norm). */
static void llama_expect_grads(const llama_fx *x, const test_table *tb, const float *g,
                               double rel, const char *what) {
    for (uint32_t i = 0; i < tb->n; i++) {
        const orch_tensor_info *ti = &tb->info[i];
        char key[128];
        snprintf(key, sizeof key, "grad.%s", ti->name);
        size_t numel;
        const float *ref = fx_get(x, key, SAFETENSORS_F32, &numel);
        ck_assert_uint_eq(numel, ti->numel);
        double scale = test_max_abs(ref, numel);
        double d = test_max_diff(g + ti->offset, ref, numel);
        ck_assert_msg(scale > 0.0, "%s: %s: reference gradient is zero", x->path,
                      ti->name);
        ck_assert_msg(d <= rel * scale, "%s: %s: %s: max diff %g, max |ref| %g (rel %g)",
                      what, x->path, ti->name, d, scale, d / scale);
    }
}

/* Logits of both fixture sequences through interleaved tables of 5-position
 * blocks, one call, every position. */
static float *llama_logits(const engine_handle *h, orch_engine_ctx *ctx,
                           const llama_fx *x) {
    const size_t nl = (size_t)x->B * x->T * x->m.vocab_size;
    CHECK_OK(h, ctx, h->api->kv_configure(ctx, 5, 8));
    int32_t t0[4] = { 6, 0, 3, 5 }, t1[4] = { 1, 7, 4, 2 };
    const uint32_t nb = (x->T + 4) / 5;
    ck_assert_uint_le(nb, 4);
    ck_assert_uint_eq(x->B, 2);
    orch_seq_input s[2] = {
        test_seq_input(x->tokens, x->T, 0, t0, nb, ORCH_LOGITS_ALL),
        test_seq_input(x->tokens + x->T, x->T, 0, t1, nb, ORCH_LOGITS_ALL),
    };
    float *out = malloc(nl * sizeof(float));
    ck_assert_ptr_nonnull(out);
    CHECK_OK(h, ctx, test_infer(h->api, ctx, s, 2, out, nl));
    return out;
}

START_TEST(test_llama_torch) {
    llama_fx x;
    llama_fx_open(&x, _i);
    const size_t nl = (size_t)x.B * x.T * x.m.vocab_size;
    orch_engine_ctx *g = llama_ctx(&gpu, &x, "math=fp32", NULL, NULL, 0);
    test_table tb;
    llama_load(&gpu, g, &x, &tb);

    float loss = NAN;
    CHECK_OK(&gpu, g, gpu.api->eval_loss(g, x.tokens, x.targets, x.B, x.T, &loss));
    ck_assert_msg(fabsf(loss - x.loss) <= 1e-4f, "%s: eval loss %.7f vs torch %.7f",
                  x.path, loss, x.loss);

    float *lg = llama_logits(&gpu, g, &x);
    double d = test_max_diff(lg, x.logits, nl);
    printf("llama %s: logits max diff vs torch %.3g (max |logit| %.3g)\n", x.path, d,
           test_max_abs(x.logits, nl));
    ck_assert_msg(d <= 1e-4, "%s: logits differ from torch by %g", x.path, d);
    free(lg);

    CHECK_OK(&gpu, g, gpu.api->grads_zero(g));
    loss = NAN;
    CHECK_OK(&gpu, g,
             gpu.api->forward_backward(g, x.tokens, x.targets, x.B, x.T, 1.0f, &loss));
    ck_assert_msg(fabsf(loss - x.loss) <= 1e-4f, "%s: loss %.7f vs torch %.7f", x.path,
                  loss, x.loss);
    float *gr = test_read_grads(gpu.api, g, tb.total);
    llama_expect_grads(&x, &tb, gr, 1e-3, "gradient");

    /* gradients are added: a second call with grad_scale 0.5 gives 1.5x */
    CHECK_OK(&gpu, g,
             gpu.api->forward_backward(g, x.tokens, x.targets, x.B, x.T, 0.5f, &loss));
    float *g2 = test_read_grads(gpu.api, g, tb.total);
    for (uint64_t k = 0; k < tb.total; k++) g2[k] /= 1.5f;
    llama_expect_grads(&x, &tb, g2, 1e-3, "accumulated gradient / 1.5");

    /* run to run: the same bits */
    orch_engine_ctx *g3 = llama_ctx(&gpu, &x, NULL, NULL, NULL, 0);
    test_table tb3;
    llama_load(&gpu, g3, &x, &tb3);
    float l3 = NAN, l1 = NAN;
    CHECK_OK(&gpu, g3, gpu.api->grads_zero(g3));
    CHECK_OK(&gpu, g, gpu.api->grads_zero(g));
    CHECK_OK(&gpu, g,
             gpu.api->forward_backward(g, x.tokens, x.targets, x.B, x.T, 1.0f, &l1));
    CHECK_OK(&gpu, g3,
             gpu.api->forward_backward(g3, x.tokens, x.targets, x.B, x.T, 1.0f, &l3));
    ck_assert(memcmp(&l1, &l3, sizeof l1) == 0);
    float *ga = test_read_grads(gpu.api, g, tb.total);
    float *gb = test_read_grads(gpu.api, g3, tb.total);
    ck_assert_msg(memcmp(ga, gb, tb.total * sizeof(float)) == 0,
                  "llama gradients differ between two runs");
    free(ga);
    free(gb);
    free(g2);
    free(gr);
    gpu.api->context_destroy(g3);
    gpu.api->context_destroy(g);
    llama_fx_close(&x);
}
END_TEST

/* ABI 1.3: forward_backward_notify on the LLaMA fixture (tied and untied
 * heads): after a first micro-batch, the ranges are model.norm (+ lm_head)
 * first, each layer from the last to the first, then embed_tokens; loss and
 * gradients the same bits as forward_backward's; each range final in the
 * callback (test_notify_check). */
START_TEST(test_llama_notify) {
    llama_fx x;
    llama_fx_open(&x, _i);
    orch_engine_ctx *a = llama_ctx(&gpu, &x, NULL, NULL, NULL, 0);
    orch_engine_ctx *b = llama_ctx(&gpu, &x, NULL, NULL, NULL, 0);
    test_table tb, tb2;
    llama_load(&gpu, a, &x, &tb);
    llama_load(&gpu, b, &x, &tb2);
    float la = 0, lb = 0;
    CHECK_OK(&gpu, a, gpu.api->grads_zero(a));
    CHECK_OK(&gpu, b, gpu.api->grads_zero(b));
    CHECK_OK(&gpu, a,
             gpu.api->forward_backward(a, x.tokens, x.targets, x.B, x.T, 0.5f, &la));
    CHECK_OK(&gpu, b,
             gpu.api->forward_backward(b, x.tokens, x.targets, x.B, x.T, 0.5f, &lb));
    test_notify_log *lg = malloc(sizeof *lg);
    ck_assert_ptr_nonnull(lg);
    const uint32_t L = x.m.layers;
    uint32_t r = test_notify_check(gpu.api, a, b, x.tokens, x.targets, x.B, x.T, 0.5f,
                                   tb.total, lg);
    test_notify_descending(gpu.api, lg);
    ck_assert_uint_eq(r, L + 2);
    ck_assert_str_eq(tb.info[1 + L * 9].name, "model.norm.weight");
    ck_assert_uint_eq(lg->off[0], tb.info[1 + L * 9].offset);
    ck_assert_uint_eq(lg->off[0] + lg->cnt[0], tb.total);
    for (uint32_t l = 0; l < L; l++)
        ck_assert_uint_eq(lg->off[L - l], tb.info[1 + l * 9].offset);
    ck_assert_uint_eq(lg->off[L + 1], 0);
    ck_assert_uint_eq(lg->cnt[L + 1], tb.info[0].numel);
    free(lg);
    gpu.api->context_destroy(a);
    gpu.api->context_destroy(b);
    llama_fx_close(&x);
}
END_TEST

/* The fixture's AdamW hyper-parameters for `step`. */
static orch_adamw_params llama_adam(const llama_fx *x, uint64_t step) {
    orch_adamw_params p =
        test_adamw(step, (float)fx_meta(x, "lr"), (float)fx_meta(x, "weight_decay"),
                   (float)fx_meta(x, "grad_clip"));
    p.beta1 = (float)fx_meta(x, "beta1");
    p.beta2 = (float)fx_meta(x, "beta2");
    p.eps = (float)fx_meta(x, "eps");
    return p;
}

START_TEST(test_llama_adamw) {
    llama_fx x;
    llama_fx_open(&x, _i);
    orch_engine_ctx *g = llama_ctx(&gpu, &x, NULL, NULL, NULL, 0);
    test_table tb;
    llama_load(&gpu, g, &x, &tb);
    size_t ns, nn;
    const float *ref_losses = fx_get(&x, "train_losses", SAFETENSORS_F32, &ns);
    const float *ref_norms = fx_get(&x, "grad_norms", SAFETENSORS_F32, &nn);
    ck_assert_uint_eq(ns, x.steps);
    ck_assert_uint_eq(nn, x.steps);
    int clipped = 0;
    double worst_loss = 0.0, worst_norm = 0.0;
    for (uint32_t st = 0; st < x.steps; st++) {
        float loss = NAN, norm = NAN;
        CHECK_OK(&gpu, g, gpu.api->grads_zero(g));
        CHECK_OK(
            &gpu, g,
            gpu.api->forward_backward(g, x.tokens, x.targets, x.B, x.T, 1.0f, &loss));
        ck_assert_msg(fabsf(loss - ref_losses[st]) <= 1e-4f,
                      "%s step %u: loss %.7f vs torch %.7f", x.path, st + 1, loss,
                      ref_losses[st]);
        orch_adamw_params p = llama_adam(&x, (uint64_t)st + 1);
        CHECK_OK(&gpu, g, gpu.api->optimizer_step(g, &p, &norm));
        ck_assert_msg(fabsf(norm - ref_norms[st]) <= 1e-4f * ref_norms[st] + 1e-5f,
                      "%s step %u: grad norm %.7f vs torch %.7f", x.path, st + 1, norm,
                      ref_norms[st]);
        if (fabs(loss - ref_losses[st]) > worst_loss)
            worst_loss = fabs(loss - ref_losses[st]);
        if (fabs(norm - ref_norms[st]) / ref_norms[st] > worst_norm)
            worst_norm = fabs(norm - ref_norms[st]) / ref_norms[st];
        if (norm > p.grad_clip) { /* the buffer now holds the clipped gradients */
            clipped++;
            float *gr = test_read_grads(gpu.api, g, tb.total);
            double sq = 0.0;
            for (uint64_t k = 0; k < tb.total; k++) sq += (double)gr[k] * gr[k];
            ck_assert_msg(fabs(sqrt(sq) - p.grad_clip) <= 1e-4 * p.grad_clip,
                          "clipped norm %g vs clip %g", sqrt(sq), (double)p.grad_clip);
            free(gr);
        }
    }
    printf("llama %s: %u AdamW steps, worst loss diff %.3g, worst norm rel diff %.3g, "
           "%d clipped\n",
           x.path, x.steps, worst_loss, worst_norm, clipped);
    ck_assert_msg(clipped > 0 && clipped < (int)x.steps,
                  "the fixture should clip some steps, not all (%d)", clipped);
    gpu.api->context_destroy(g);
    llama_fx_close(&x);
}
END_TEST

/* KV-cached decoding of both fixture sequences in one batch: uneven prefill
 * chunks with mixed logits modes, then one token at a time, shuffled block
 * tables of 4 positions; every row produced equals the fixture's logits.
 * Rows land in rows[b*T + pos]; returns how many were produced. */
static int llama_decode(const engine_handle *h, orch_engine_ctx *ctx, const llama_fx *x,
                        float *rows, int *produced) {
    const uint32_t V_ = x->m.vocab_size, T = x->T;
    CHECK_OK(h, ctx, h->api->kv_configure(ctx, 4, 16));
    int32_t tables[2][4] = { { 9, 2, 14, 6 }, { 5, 11, 0, 13 } };
    const uint32_t chunk[2][2] = { { 5, 2 }, { 3, 4 } };
    const uint32_t mode[2][2] = { { ORCH_LOGITS_ALL, ORCH_LOGITS_LAST },
                                  { ORCH_LOGITS_NONE, ORCH_LOGITS_LAST } };
    uint32_t done[2] = { 0, 0 };
    float *out = malloc((size_t)2 * T * V_ * sizeof(float));
    ck_assert_ptr_nonnull(out);
    int count = 0;
    for (int step = 0;; step++) {
        orch_seq_input in[2];
        uint32_t which[2], n = 0;
        for (uint32_t b = 0; b < 2; b++) {
            uint32_t cnt = step < 2 ? chunk[b][step] : 1;
            uint32_t md = step < 2 ? mode[b][step] : ORCH_LOGITS_LAST;
            if (b == 1 && step >= 2 && step % 3 == 0) cnt = 0; /* sits out */
            if (done[b] + cnt > T) cnt = T - done[b];
            if (cnt == 0) continue;
            in[n] = test_seq_input(x->tokens + b * T + done[b], cnt, done[b], tables[b],
                                   (done[b] + cnt + 3) / 4, md);
            which[n++] = b;
        }
        if (n == 0) break;
        CHECK_OK(h, ctx, test_infer(h->api, ctx, in, n, out, (uint64_t)2 * T * V_));
        size_t r = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t b = which[i], cnt = in[i].n_tokens;
            uint32_t first = in[i].logits_mode == ORCH_LOGITS_ALL ? 0 : cnt - 1;
            uint32_t nr = in[i].logits_mode == ORCH_LOGITS_ALL    ? cnt
                          : in[i].logits_mode == ORCH_LOGITS_LAST ? 1
                                                                  : 0;
            for (uint32_t k = 0; k < nr; k++, r++) {
                size_t row = (size_t)b * T + done[b] + first + k;
                memcpy(rows + row * V_, out + r * V_, V_ * sizeof(float));
                produced[row] = 1;
                count++;
            }
            done[b] += cnt;
        }
    }
    free(out);
    return count;
}

START_TEST(test_llama_decode) {
    llama_fx x;
    llama_fx_open(&x, _i);
    const uint32_t V_ = x.m.vocab_size, T = x.T;
    orch_engine_ctx *g = llama_ctx(&gpu, &x, NULL, NULL, NULL, 0);
    test_table tb;
    llama_load(&gpu, g, &x, &tb);
    uint64_t bb = 0;
    CHECK_OK(&gpu, g, gpu.api->kv_block_bytes(g, 4, &bb));
    ck_assert_uint_eq(bb, (uint64_t)x.m.layers * 2 * 4 * x.m.kv_heads *
                              (x.m.width / x.m.heads) * sizeof(float));
    float *rows = calloc((size_t)2 * T * V_, sizeof(float));
    int produced[64];
    ck_assert_uint_le(2 * T, 64);
    memset(produced, 0, sizeof produced);
    int count = llama_decode(&gpu, g, &x, rows, produced);
    ck_assert_int_eq(count, 5 + 1 + 5 + 1 + 5); /* A: 5+1+5, B: 1+5 */
    double worst = 0.0;
    for (uint32_t r = 0; r < 2 * T; r++) {
        if (!produced[r]) continue;
        double d = test_max_diff(rows + (size_t)r * V_, x.logits + (size_t)r * V_, V_);
        if (d > worst) worst = d;
        ck_assert_msg(d <= 1e-4,
                      "%s: seq %u pos %u: decoded logits differ from torch by %g", x.path,
                      r / T, r % T, d);
    }
    printf("llama %s: %d decoded rows, max diff vs torch %.3g\n", x.path, count, worst);

    /* copy-on-write: sequence 0's first two (full) blocks copied, positions
     * 8.. recomputed from the copies give the fixture's logits again */
    int32_t src[2] = { 9, 2 }, dst[2] = { 7, 3 };
    CHECK_OK(&gpu, g, gpu.api->kv_copy_blocks(g, src, dst, 2));
    int32_t copy_table[3] = { 7, 3, 12 };
    ck_assert_uint_eq(T, 12);
    orch_seq_input s =
        test_seq_input(x.tokens + 8, T - 8, 8, copy_table, 3, ORCH_LOGITS_ALL);
    float *out = malloc((size_t)(T - 8) * V_ * sizeof(float));
    CHECK_OK(&gpu, g, test_infer(gpu.api, g, &s, 1, out, (uint64_t)(T - 8) * V_));
    double d = test_max_diff(out, x.logits + (size_t)8 * V_, (uint64_t)(T - 8) * V_);
    ck_assert_msg(d <= 1e-4, "%s: logits after kv_copy_blocks differ from torch by %g",
                  x.path, d);
    free(out);
    free(rows);
    gpu.api->context_destroy(g);
    llama_fx_close(&x);
}
END_TEST

START_TEST(test_llama_init) {
    /* The table (the header's names, order, shapes, flags) and the engine's own
     * initialisation (the ABI's rule) for the fixture's model. */
    llama_fx x;
    llama_fx_open(&x, _i);
    orch_engine_ctx *g = llama_ctx(&gpu, &x, NULL, NULL, NULL, 0);
    test_table tb;
    test_read_table(gpu.api, g, ORCH_TENSOR_PARAM, &tb);
    const uint32_t L = x.m.layers, D = x.m.width / x.m.heads;
    const int untied = (x.m.flags & ORCH_MODEL_FLAG_UNTIED_HEAD) != 0;
    ck_assert_uint_eq(tb.n, 2 + 9 * L + (untied ? 1 : 0));
    ck_assert_str_eq(tb.info[0].name, "model.embed_tokens.weight");
    ck_assert_str_eq(tb.info[3].name, "model.layers.0.self_attn.k_proj.weight");
    ck_assert_uint_eq(tb.info[3].shape[0], (uint64_t)x.m.kv_heads * D);
    ck_assert_uint_eq(tb.info[3].shape[1], x.m.width);
    ck_assert_str_eq(tb.info[1 + 9 * L].name, "model.norm.weight");
    if (untied) ck_assert_str_eq(tb.info[tb.n - 1].name, "lm_head.weight");
    float *p = test_read_kind(gpu.api, g, ORCH_TENSOR_PARAM, &tb);
    for (uint32_t i = 0; i < tb.n; i++) {
        const orch_tensor_info *t = &tb.info[i];
        char key[128];
        snprintf(key, sizeof key, "param.%s", t->name);
        size_t numel;
        (void)fx_get(&x, key, SAFETENSORS_F32, &numel);
        ck_assert_uint_eq(numel, t->numel);
        int no_decay = (t->flags & ORCH_TENSOR_FLAG_NO_DECAY) != 0;
        ck_assert_msg(no_decay == (t->ndim == 1), "%s: NO_DECAY %d with %u dims", t->name,
                      no_decay, t->ndim);
        const float *v = p + t->offset;
        double s = 0, s2 = 0;
        for (uint64_t k = 0; k < t->numel; k++) {
            s += v[k];
            s2 += (double)v[k] * v[k];
        }
        double mean = s / (double)t->numel,
               sd = sqrt(s2 / (double)t->numel - mean * mean);
        if (t->ndim == 1) {
            ck_assert_msg(mean == 1.0 && sd < 1e-9, "%s: mean %g sd %g, want constant 1",
                          t->name, mean, sd);
        } else {
            int resid = strstr(t->name, "o_proj.weight") || strstr(t->name, "down_proj");
            double want = resid ? 0.02 / sqrt(2.0 * L) : 0.02;
            /* 256 draws at least (k_proj of kv1): sd within 12% is > 2.5
             * standard errors; mean within 4 standard errors */
            ck_assert_msg(fabs(sd - want) < 0.12 * want &&
                              fabs(mean) < 4.0 * want / sqrt((double)t->numel),
                          "%s: mean %g sd %g, want N(0, %g)", t->name, mean, sd, want);
        }
    }
    free(p);
    gpu.api->context_destroy(g);
    llama_fx_close(&x);
}
END_TEST

START_TEST(test_llama_math_modes) {
    /* tf32 / bf16 matrix products work for llama, close to the reference at
     * the GPT-2 suite's tolerances for these modes */
    const char *modes[2] = { "math=tf32", "math=bf16" };
    const double loss_tol[2] = { 5e-3, 3e-2 }, grad_tol[2] = { 2e-2, 1e-1 };
    const double logit_tol[2] = { 2e-2, 1e-1 };
    llama_fx x;
    llama_fx_open(&x, _i);
    const size_t nl = (size_t)x.B * x.T * x.m.vocab_size;
    for (int m = 0; m < 2; m++) {
        orch_engine_ctx *g = llama_ctx(&gpu, &x, modes[m], NULL, NULL, 0);
        test_table tb;
        llama_load(&gpu, g, &x, &tb);
        float loss = NAN;
        CHECK_OK(&gpu, g, gpu.api->grads_zero(g));
        CHECK_OK(
            &gpu, g,
            gpu.api->forward_backward(g, x.tokens, x.targets, x.B, x.T, 1.0f, &loss));
        ck_assert_msg(test_close(loss, x.loss, loss_tol[m], 1e-7),
                      "%s %s: loss %.6f vs torch %.6f", x.path, modes[m], loss, x.loss);
        float *gr = test_read_grads(gpu.api, g, tb.total);
        double num = 0, den = 0;
        for (uint32_t i = 0; i < tb.n; i++) {
            char key[128];
            snprintf(key, sizeof key, "grad.%s", tb.info[i].name);
            size_t numel;
            const float *ref = fx_get(&x, key, SAFETENSORS_F32, &numel);
            for (size_t k = 0; k < numel; k++) {
                double d = (double)gr[tb.info[i].offset + k] - ref[k];
                num += d * d;
                den += (double)ref[k] * ref[k];
            }
        }
        ck_assert_msg(sqrt(num / den) <= grad_tol[m],
                      "%s %s: relative L2 gradient error %g", x.path, modes[m],
                      sqrt(num / den));
        float *lg = llama_logits(&gpu, g, &x);
        double d = test_max_diff(lg, x.logits, nl);
        ck_assert_msg(d <= logit_tol[m], "%s %s: logits differ from torch by %g", x.path,
                      modes[m], d);
        free(lg);
        free(gr);
        gpu.api->context_destroy(g);
    }
    llama_fx_close(&x);
}
END_TEST

START_TEST(test_llama_cpu_parity) {
    /* The CUDA engine against the CPU engine for llama: the same initial
     * weights from the same seed, logits, gradients and decoding. Skipped
     * (with a message) while the CPU engine refuses llama. */
    llama_fx x;
    llama_fx_open(&x, _i);
    int32_t st = ORCH_OK;
    char err[1024] = "";
    orch_engine_ctx *c = llama_ctx(&cpu, &x, NULL, &st, err, sizeof err);
    if (!c) {
        ck_assert_msg(st == ORCH_ERR_UNSUPPORTED, "the CPU engine refuses %s with %d: %s",
                      x.path, st, err);
        printf("test_cuda_engine: llama CPU parity skipped: the CPU engine refuses llama "
               "(%s)\n",
               err);
        llama_fx_close(&x);
        return;
    }
    orch_engine_ctx *g = llama_ctx(&gpu, &x, NULL, NULL, NULL, 0);
    test_table tg, tc;
    test_read_table(gpu.api, g, ORCH_TENSOR_PARAM, &tg);
    test_read_table(cpu.api, c, ORCH_TENSOR_PARAM, &tc);
    ck_assert_uint_eq(tg.n, tc.n);
    ck_assert_uint_eq(tg.total, tc.total);
    for (uint32_t i = 0; i < tg.n; i++) {
        ck_assert_str_eq(tg.info[i].name, tc.info[i].name);
        ck_assert_uint_eq(tg.info[i].offset, tc.info[i].offset);
        ck_assert_uint_eq(tg.info[i].flags, tc.info[i].flags);
    }
    float *pg = test_read_kind(gpu.api, g, ORCH_TENSOR_PARAM, &tg);
    float *pc = test_read_kind(cpu.api, c, ORCH_TENSOR_PARAM, &tc);
    for (uint32_t i = 0; i < tg.n; i++) {
        const orch_tensor_info *t = &tg.info[i];
        double d = test_max_diff(pg + t->offset, pc + t->offset, t->numel);
        ck_assert_msg(d <= 1e-6 * test_max_abs(pc + t->offset, t->numel),
                      "%s: initialisation differs from the CPU engine by %g", t->name, d);
    }
    free(pg);
    free(pc);
    llama_load(&gpu, g, &x, &tg);
    llama_load(&cpu, c, &x, &tc);
    const size_t nl = (size_t)x.B * x.T * x.m.vocab_size;
    float *lg = llama_logits(&gpu, g, &x), *lc = llama_logits(&cpu, c, &x);
    double d = test_max_diff(lg, lc, nl);
    ck_assert_msg(d <= 1e-4, "%s: logits differ from the CPU engine by %g", x.path, d);
    free(lg);
    free(lc);
    float a = NAN, b = NAN;
    CHECK_OK(&gpu, g, gpu.api->grads_zero(g));
    CHECK_OK(&cpu, c, cpu.api->grads_zero(c));
    CHECK_OK(&gpu, g,
             gpu.api->forward_backward(g, x.tokens, x.targets, x.B, x.T, 1.0f, &a));
    CHECK_OK(&cpu, c,
             cpu.api->forward_backward(c, x.tokens, x.targets, x.B, x.T, 1.0f, &b));
    ck_assert_msg(test_close(a, b, 1e-4, 1e-7), "loss %.7f vs CPU %.7f", a, b);
    float *gg = test_read_grads(gpu.api, g, tg.total);
    float *gc = test_read_grads(cpu.api, c, tc.total);
    for (uint32_t i = 0; i < tg.n; i++) {
        const orch_tensor_info *t = &tg.info[i];
        double scale = test_max_abs(gc + t->offset, t->numel);
        double dd = test_max_diff(gg + t->offset, gc + t->offset, t->numel);
        ck_assert_msg(dd <= 1e-3 * scale + 1e-7, "%s: gradient differs from CPU by %g",
                      t->name, dd);
    }
    free(gg);
    free(gc);
    float *rg = calloc(nl, sizeof(float)), *rc = calloc(nl, sizeof(float));
    int prg[64], prc[64];
    memset(prg, 0, sizeof prg);
    memset(prc, 0, sizeof prc);
    ck_assert_int_eq(llama_decode(&gpu, g, &x, rg, prg),
                     llama_decode(&cpu, c, &x, rc, prc));
    ck_assert(memcmp(prg, prc, sizeof prg) == 0);
    d = test_max_diff(rg, rc, nl);
    ck_assert_msg(d <= 1e-4, "%s: decoded logits differ from the CPU engine by %g",
                  x.path, d);
    free(rg);
    free(rc);
    gpu.api->context_destroy(g);
    cpu.api->context_destroy(c);
    llama_fx_close(&x);
}
END_TEST

START_TEST(test_llama_wide_heads) {
    /* Head size 48 (more than one warp of channels, the last group partial)
     * and 3 query heads per K/V head: the inference path (paged attention
     * over 8-position blocks, prefill chunks then single tokens) against the
     * training path (batched GEMM attention) on the same weights: the cross
     * entropy of the decoded logits equals eval_loss. */
    enum { WV = 53, WT = 37, WB = 8 };
    orch_model_desc m = test_model_desc(WV, 40, 2, 3, 144);
    m.arch = ORCH_ARCH_LLAMA;
    m.kv_heads = 1;
    m.mlp_width = 70;
    m.rope_theta = 500.0f;
    m.flags = ORCH_MODEL_FLAG_UNTIED_HEAD;
    orch_engine_ctx *g = NULL;
    char err[1024];
    ck_assert_msg(engine_create_context(&gpu, &m, 1, SEED, NULL, &g, err, sizeof err) ==
                      0,
                  "%s", err);
    test_table tb;
    test_read_table(gpu.api, g, ORCH_TENSOR_PARAM, &tb);
    float *w = malloc(tb.total * sizeof(float));
    ck_assert_ptr_nonnull(w);
    rng = 777;
    for (uint32_t i = 0; i < tb.n; i++)
        for (uint64_t k = 0; k < tb.info[i].numel; k++)
            w[tb.info[i].offset + k] =
                tb.info[i].ndim == 2 ? frand(-0.12f, 0.12f) : 1.0f + frand(-0.2f, 0.2f);
    test_write_kind(gpu.api, g, ORCH_TENSOR_PARAM, &tb, w);
    free(w);
    int32_t tok[WT], tgt[WT];
    for (int i = 0; i < WT; i++) tok[i] = (int32_t)(urand() * WV);
    for (int i = 0; i < WT; i++) tgt[i] = i + 1 < WT ? tok[i + 1] : 0;
    float eval = NAN;
    CHECK_OK(&gpu, g, gpu.api->eval_loss(g, tok, tgt, 1, WT, &eval));

    CHECK_OK(&gpu, g, gpu.api->kv_configure(g, WB, 8));
    int32_t table[5] = { 3, 7, 0, 5, 1 };
    float *rows = malloc((size_t)WT * WV * sizeof(float));
    ck_assert_ptr_nonnull(rows);
    uint32_t done = 0;
    const uint32_t chunks[3] = { 11, 6, 9 }; /* then single tokens */
    for (int step = 0; done < WT; step++) {
        uint32_t cnt = step < 3 ? chunks[step] : 1;
        orch_seq_input s = test_seq_input(tok + done, cnt, done, table,
                                          (done + cnt + WB - 1) / WB, ORCH_LOGITS_ALL);
        CHECK_OK(
            &gpu, g,
            test_infer(gpu.api, g, &s, 1, rows + (size_t)done * WV, (uint64_t)cnt * WV));
        done += cnt;
    }
    double sum = 0.0;
    for (int i = 0; i < WT; i++) {
        const float *r = rows + (size_t)i * WV;
        double mx = r[0], se = 0.0;
        for (int k = 1; k < WV; k++)
            if (r[k] > mx) mx = r[k];
        for (int k = 0; k < WV; k++) se += exp(r[k] - mx);
        sum += log(se) + mx - r[tgt[i]];
    }
    double dec = sum / WT;
    ck_assert_msg(fabs(dec - eval) <= 1e-5 * fabs(eval) + 1e-6,
                  "decoded cross entropy %.7f vs eval_loss %.7f", dec, (double)eval);
    ck_assert_msg(eval > 0.5, "degenerate loss %g", (double)eval);
    free(rows);
    gpu.api->context_destroy(g);
}
END_TEST

START_TEST(test_llama_bad_models) {
    /* engines/common's rules reach the caller through the CUDA engine */
    struct {
        uint32_t heads, kv_heads, width, arch;
        int32_t want;
        const char *what;
    } bad[] = {
        { 4, 3, 32, ORCH_ARCH_LLAMA, ORCH_ERR_INVALID_ARGUMENT, "kv_heads 3 of 4 heads" },
        { 4, 8, 32, ORCH_ARCH_LLAMA, ORCH_ERR_INVALID_ARGUMENT, "kv_heads above heads" },
        { 4, 4, 36, ORCH_ARCH_LLAMA, ORCH_ERR_INVALID_ARGUMENT, "odd head size 9" },
        { 4, 2, 32, ORCH_ARCH_GPT2, ORCH_ERR_UNSUPPORTED, "gpt2 with kv_heads 2" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        orch_model_desc m = test_model_desc(50, 16, 1, bad[i].heads, bad[i].width);
        m.arch = bad[i].arch;
        m.kv_heads = bad[i].kv_heads;
        orch_engine_options o = { sizeof o, 1, SEED, NULL };
        orch_engine_ctx *ctx = NULL;
        char err[512] = "";
        int32_t st = gpu.api->context_create(&m, &o, &ctx, err, sizeof err);
        ck_assert_msg(st != ORCH_OK, "%s was accepted", bad[i].what);
        ck_assert_msg(st == bad[i].want, "%s gave %d (%s), expected %d", bad[i].what, st,
                      err, bad[i].want);
        ck_assert_ptr_null(ctx);
        ck_assert_msg(err[0], "%s: no message", bad[i].what);
    }
}
END_TEST

/* ------------------------------------------------------------------------- */

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_default_engine_path();
    TEST_LOAD_CUDA_AND_CPU("test_cuda_engine", gpu, cpu);
    printf("test_cuda_engine: %s (%s) against %s\n", gpu.path, gpu.probe_msg, cpu.path);
    Suite *s = suite_create("cuda_engine");
    TCase *tc = tcase_create("parity");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tables_match);
    tcase_add_test(tc, test_logits_parity);
    tcase_add_test(tc, test_grad_parity);
    tcase_add_test(tc, test_adamw_parity);
    tcase_add_test(tc, test_zero_range_parity);
    tcase_add_test(tc, test_kv_decode);
    tcase_add_test(tc, test_kv_copy);
    tcase_add_test(tc, test_portability);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_math_modes);
    tcase_add_test(tc, test_bad_calls);
    suite_add_tcase(s, tc);
    TCase *tl = tcase_create("llama");
    tcase_set_timeout(tl, 120);
    tcase_add_loop_test(tl, test_llama_torch, 0, LLAMA_FIXTURES);
    tcase_add_loop_test(tl, test_llama_notify, 0, LLAMA_FIXTURES);
    tcase_add_loop_test(tl, test_llama_adamw, 0, LLAMA_FIXTURES);
    tcase_add_loop_test(tl, test_llama_decode, 0, LLAMA_FIXTURES);
    tcase_add_loop_test(tl, test_llama_init, 0, LLAMA_FIXTURES);
    tcase_add_loop_test(tl, test_llama_math_modes, 0, LLAMA_FIXTURES);
    tcase_add_loop_test(tl, test_llama_cpu_parity, 0, LLAMA_FIXTURES);
    tcase_add_test(tl, test_llama_wide_heads);
    tcase_add_test(tl, test_llama_bad_models);
    suite_add_tcase(s, tl);
    int rc = test_run_suite(s);
    engine_unload(&gpu);
    engine_unload(&cpu);
    return rc;
}
