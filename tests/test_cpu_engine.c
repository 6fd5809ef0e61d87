/*
 * test_cpu_engine.c - numeric tests of the CPU engine (libengine_cpu.so):
 *
 *   - against PyTorch: tests/fixtures/cpu_gpt2_tiny.safetensors, written by
 *     tools/torch_reference.py (float64 reference): logits and loss within
 *     1e-4 absolute, every gradient tensor within 1e-3 relative (max-norm),
 *     the losses of 10 AdamW steps with clipping and weight decay within
 *     1e-4, for every kernel set and thread count;
 *   - central finite differences for sampled entries of every parameter
 *     tensor of a tiny model;
 *   - KV-cache equivalence: incremental decoding (uneven prefill chunks, then
 *     single tokens, across block boundaries, several sequences of different
 *     lengths in one batch with shuffled block tables) equals one full
 *     forward within 1e-5, on the packed and the OpenBLAS paths;
 *   - copy-on-write with kv_copy_blocks;
 *   - bit-identical results for the same seed and thread count;
 *   - every bad call returns an error status with a message and changes
 *     nothing;
 *   - the benchmark code behind `orch bench` (orchestrator/bench/bench.c) on a tiny
 *     model: the FLOPs formula, and that every reported figure is sane.
 * The engine is loaded like orch loads it ("cpu" through $ORCH_ENGINE_PATH,
 * which run_tests.sh points at the build directory).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/bench/bench.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/store/safetensors.h"
#include "tests/test_fixture.h"
#include "tests/test_util.h"

#define FIXTURE "tests/fixtures/cpu_gpt2_tiny.safetensors"

TEST_ENGINE_FIXTURE("cpu")

/* ------------------------------------------------------------------------- */
/* The fixture (read with orchestrator/store/safetensors)                     */
/* ------------------------------------------------------------------------- */

static safetensors_file *fixture_open(void) { return test_fixture_open(FIXTURE); }

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */

static orch_model_desc fixture_model(const safetensors_file *f) {
    orch_model_desc m = test_model_desc((uint32_t)test_fixture_meta(f, "vocab_size"),
                                        (uint32_t)test_fixture_meta(f, "context"),
                                        (uint32_t)test_fixture_meta(f, "layers"),
                                        (uint32_t)test_fixture_meta(f, "heads"),
                                        (uint32_t)test_fixture_meta(f, "width"));
    m.mlp_width = (uint32_t)test_fixture_meta(f, "mlp_width");
    m.layernorm_eps = (float)test_fixture_meta(f, "layernorm_eps");
    return m;
}

static orch_engine_ctx *make_ctx(const orch_model_desc *m, uint32_t threads,
                                 uint64_t seed, const char *options) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(&H, m, threads, seed, options, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", options ? options : "", err);
    return ctx;
}

/* Fill every parameter with reproducible values of useful size. */
static void fill_random_params(orch_engine_ctx *ctx, uint32_t seed) {
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    float *all = malloc(t.total * sizeof(float));
    uint64_t s = seed * 2654435761u + 1;
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info *ti = &t.info[i];
        float *buf = all + ti->offset;
        int ln_w = strstr(ti->name, "ln_") && strstr(ti->name, ".weight");
        for (uint64_t k = 0; k < ti->numel; k++) {
            float u = (float)((test_lcg64(&s) >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
            buf[k] = ln_w ? 1.0f + 0.2f * u : (ti->ndim == 2 ? 0.6f * u : 0.2f * u);
        }
    }
    test_write_kind(A, ctx, ORCH_TENSOR_PARAM, &t, all);
    free(all);
}

/* The flat gradient buffer and the parameters of ctx; *n receives their
 * length. */
static float *read_grads(orch_engine_ctx *ctx, uint64_t *n) {
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    *n = t.total;
    return test_read_grads(A, ctx, t.total);
}

static float *read_params(orch_engine_ctx *ctx, uint64_t *n) {
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    *n = t.total;
    return test_read_kind(A, ctx, ORCH_TENSOR_PARAM, &t);
}

/* The fixture's AdamW hyper-parameters for `step`. */
static orch_adamw_params adam_of(const safetensors_file *f, uint64_t step) {
    orch_adamw_params p = test_adamw(step, (float)test_fixture_meta(f, "lr"),
                                     (float)test_fixture_meta(f, "weight_decay"),
                                     (float)test_fixture_meta(f, "grad_clip"));
    p.beta1 = (float)test_fixture_meta(f, "beta1");
    p.beta2 = (float)test_fixture_meta(f, "beta2");
    p.eps = (float)test_fixture_meta(f, "eps");
    return p;
}

/* Option sets every numeric test runs under: kernels, threads, paths. */
static const char *const variants[] = {
    "", /* all cores, best kernels */
    "threads=1",
    "threads=3",
    "isa=avx2",
    "isa=generic",
    "skinny=0",           /* OpenBLAS even for decoding */
    "skinny=64,isa=avx2", /* packed kernel for every product */
    "skinny=64,isa=generic",
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

/* ------------------------------------------------------------------------- */
/* Against PyTorch                                                            */
/* ------------------------------------------------------------------------- */

/* A context of the fixture's model with its initial weights, and the
 * fixture's [B, T] batch (pointers into the open fixture). */
typedef struct torch_run {
    safetensors_file *f;
    orch_model_desc m;
    orch_engine_ctx *ctx;
    uint32_t B, T;
    const int32_t *tokens, *targets;
} torch_run;

static void torch_open(torch_run *r, const char *options) {
    r->f = fixture_open();
    r->m = fixture_model(r->f);
    r->ctx = make_ctx(&r->m, 0, 1, options);
    test_load_fixture_params(A, r->ctx, r->f);
    r->B = (uint32_t)test_fixture_meta(r->f, "batch");
    r->T = (uint32_t)test_fixture_meta(r->f, "seq_len");
    size_t n;
    r->tokens = test_fixture_get(r->f, "tokens", SAFETENSORS_I32, &n);
    r->targets = test_fixture_get(r->f, "targets", SAFETENSORS_I32, &n);
}

static void torch_close(torch_run *r) {
    A->context_destroy(r->ctx);
    safetensors_close(r->f);
}

START_TEST(test_torch_forward) {
    const char *opt = variants[_i];
    torch_run r;
    torch_open(&r, opt);
    size_t nt, nl;
    const float *ref_logits = test_fixture_f32(r.f, "logits", &nl);
    const float ref_loss = test_fixture_f32(r.f, "loss", &nt)[0];
    ck_assert_uint_eq(nl, (size_t)r.B * r.T * r.m.vocab_size);

    float loss = -1.0f;
    ck_assert_int_eq(A->eval_loss(r.ctx, r.tokens, r.targets, r.B, r.T, &loss), ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f, "[%s] eval loss %.7f vs torch %.7f",
                  opt, loss, ref_loss);

    /* Logits: both sequences in one batch, blocks of 5 positions, tables
     * interleaved. */
    ck_assert_int_eq(A->kv_configure(r.ctx, 5, 8), ORCH_OK);
    int32_t t0[3] = { 6, 0, 3 }, t1[3] = { 1, 7, 4 };
    orch_seq_input s[2] = { test_seq_input(r.tokens, r.T, 0, t0, 3, ORCH_LOGITS_ALL),
                            test_seq_input(r.tokens + r.T, r.T, 0, t1, 3,
                                           ORCH_LOGITS_ALL) };
    float *logits = malloc(nl * sizeof(float));
    ck_assert_int_eq(test_infer(A, r.ctx, s, 2, logits, nl), ORCH_OK);
    double worst = 0.0;
    for (size_t i = 0; i < nl; i++) {
        double d = fabs((double)logits[i] - ref_logits[i]);
        if (d > worst) worst = d;
    }
    ck_assert_msg(worst <= 1e-4, "[%s] logits differ from torch by %g", opt, worst);
    free(logits);
    torch_close(&r);
}
END_TEST

START_TEST(test_torch_gradients) {
    const char *opt = variants[_i];
    torch_run r;
    torch_open(&r, opt);
    size_t nt;
    const float ref_loss = test_fixture_f32(r.f, "loss", &nt)[0];
    float loss = -1.0f;
    ck_assert_int_eq(A->grads_zero(r.ctx), ORCH_OK);
    ck_assert_int_eq(
        A->forward_backward(r.ctx, r.tokens, r.targets, r.B, r.T, 1.0f, &loss), ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f, "[%s] loss %.7f vs torch %.7f", opt,
                  loss, ref_loss);
    test_table t;
    test_read_table(A, r.ctx, ORCH_TENSOR_PARAM, &t);
    float *g = test_read_grads(A, r.ctx, t.total);
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info ti = t.info[i];
        char key[128];
        snprintf(key, sizeof key, "grad.%s", ti.name);
        size_t numel;
        const float *ref = test_fixture_f32(r.f, key, &numel);
        ck_assert_uint_eq(numel, ti.numel);
        double diff = 0.0, scale = 0.0;
        for (size_t k = 0; k < numel; k++) {
            double d = fabs((double)g[ti.offset + k] - ref[k]);
            if (d > diff) diff = d;
            if (fabs(ref[k]) > scale) scale = fabs(ref[k]);
        }
        ck_assert_msg(scale > 0.0, "%s: reference gradient is zero", ti.name);
        ck_assert_msg(diff <= 1e-3 * scale,
                      "[%s] gradient %s: max diff %g, max |ref| %g (rel %g)", opt,
                      ti.name, diff, scale, diff / scale);
    }
    free(g);
    torch_close(&r);
}
END_TEST

START_TEST(test_torch_adamw_steps) {
    const char *opt = variants[_i];
    torch_run r;
    torch_open(&r, opt);
    const int steps = (int)test_fixture_meta(r.f, "steps");
    size_t nsteps, nn;
    const float *ref_losses = test_fixture_f32(r.f, "train_losses", &nsteps);
    const float *ref_norms = test_fixture_f32(r.f, "grad_norms", &nn);
    ck_assert_int_eq((int)nsteps, steps);
    int clipped = 0;
    for (int s = 0; s < steps; s++) {
        float loss = -1.0f, norm = -1.0f;
        ck_assert_int_eq(A->grads_zero(r.ctx), ORCH_OK);
        ck_assert_int_eq(
            A->forward_backward(r.ctx, r.tokens, r.targets, r.B, r.T, 1.0f, &loss),
            ORCH_OK);
        ck_assert_msg(fabsf(loss - ref_losses[s]) <= 1e-4f,
                      "[%s] step %d: loss %.7f vs torch %.7f", opt, s + 1, loss,
                      ref_losses[s]);
        orch_adamw_params p = adam_of(r.f, (uint64_t)s + 1);
        ck_assert_int_eq(A->optimizer_step(r.ctx, &p, &norm), ORCH_OK);
        ck_assert_msg(fabsf(norm - ref_norms[s]) <= 1e-4f * ref_norms[s] + 1e-5f,
                      "[%s] step %d: grad norm %.7f vs torch %.7f", opt, s + 1, norm,
                      ref_norms[s]);
        clipped += norm > p.grad_clip;
        if (norm > p.grad_clip) { /* the buffer now holds clipped gradients */
            uint64_t n;
            float *g = read_grads(r.ctx, &n);
            double sq = 0.0;
            for (uint64_t k = 0; k < n; k++) sq += (double)g[k] * g[k];
            ck_assert_msg(fabs(sqrt(sq) - p.grad_clip) <= 1e-4 * p.grad_clip,
                          "clipped norm %g vs clip %g", sqrt(sq), (double)p.grad_clip);
            free(g);
        }
    }
    ck_assert_msg(clipped > 0 && clipped < steps, "fixture should clip some steps");
    torch_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Finite differences                                                         */
/* ------------------------------------------------------------------------- */

/* Central finite differences of eval_loss for n_pick entries of every
 * parameter tensor of ctx (the largest |gradient| and n_pick-1 random ones;
 * for wpe only the first T rows, the ones the batch uses) against g, the
 * backward's gradients at loss. With min_gmax > 0 each tensor's largest
 * gradient must exceed it (else the check would prove nothing). Restores
 * every tensor; returns the entries checked. */
static int finite_difference_check(orch_engine_ctx *ctx, const orch_model_desc *m,
                                   const int32_t *tokens, const int32_t *targets,
                                   uint32_t B, uint32_t T, const float *g, float loss,
                                   int n_pick, uint64_t rng, double min_gmax) {
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    const float h = 2e-3f;
    int checked = 0;
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info ti = t.info[i];
        float *w = malloc(ti.numel * sizeof(float));
        ck_assert_int_eq(
            A->tensor_read(ctx, ORCH_TENSOR_PARAM, i, w, ti.numel * sizeof(float)),
            ORCH_OK);
        uint64_t limit =
            strcmp(ti.name, "wpe.weight") == 0 ? (uint64_t)T * m->width : ti.numel;
        uint64_t pick[8] = { 0 };
        ck_assert(n_pick >= 1 && n_pick <= 8);
        for (uint64_t k = 0; k < limit; k++)
            if (fabsf(g[ti.offset + k]) > fabsf(g[ti.offset + pick[0]])) pick[0] = k;
        for (int k = 1; k < n_pick; k++) pick[k] = (test_lcg64(&rng) >> 33) % limit;
        double gmax = fabs(g[ti.offset + pick[0]]);
        if (min_gmax > 0)
            ck_assert_msg(gmax > min_gmax, "%s: gradient too small to check (%g)",
                          ti.name, gmax);
        for (int k = 0; k < n_pick; k++) {
            float orig = w[pick[k]], lp, lm;
            w[pick[k]] = orig + h;
            ck_assert_int_eq(
                A->tensor_write(ctx, ORCH_TENSOR_PARAM, i, w, ti.numel * sizeof(float)),
                ORCH_OK);
            ck_assert_int_eq(A->eval_loss(ctx, tokens, targets, B, T, &lp), ORCH_OK);
            w[pick[k]] = orig - h;
            ck_assert_int_eq(
                A->tensor_write(ctx, ORCH_TENSOR_PARAM, i, w, ti.numel * sizeof(float)),
                ORCH_OK);
            ck_assert_int_eq(A->eval_loss(ctx, tokens, targets, B, T, &lm), ORCH_OK);
            w[pick[k]] = orig;
            double fd = ((double)lp - (double)lm) / (2.0 * h);
            double an = g[ti.offset + pick[k]];
            /* Float32 losses: each evaluation carries a few ulps of rounding
             * (its size depends on the summation order of the kernels this CPU
             * dispatches to), and the difference divides it by 2h. */
            double loss_ulp = (double)nextafterf(loss, INFINITY) - (double)loss;
            double tol = 2e-3 * gmax + 1e-2 * fabs(an) + 4.0 * loss_ulp / (2.0 * h);
            ck_assert_msg(fabs(fd - an) <= tol,
                          "%s[%llu] at T=%u: finite difference %.6g vs backward %.6g",
                          ti.name, (unsigned long long)pick[k], T, fd, an);
            checked++;
        }
        ck_assert_int_eq(
            A->tensor_write(ctx, ORCH_TENSOR_PARAM, i, w, ti.numel * sizeof(float)),
            ORCH_OK);
        free(w);
    }
    ck_assert_int_eq(checked, n_pick * (int)t.n);
    return checked;
}

START_TEST(test_gradient_check) {
    /* Tiny model, 1 x 7 tokens so each entry's gradient is large. */
    orch_model_desc m = test_model_desc(23, 9, 2, 2, 8);
    m.mlp_width = 12;
    orch_engine_ctx *ctx = make_ctx(&m, 0, 7, NULL);
    fill_random_params(ctx, 99);
    const uint32_t T = 7;
    int32_t tokens[7] = { 3, 17, 0, 22, 9, 9, 14 };
    int32_t targets[7] = { 17, 0, -1, 9, 9, 14, 5 };
    float loss;
    ck_assert_int_eq(A->forward_backward(ctx, tokens, targets, 1, T, 1.0f, &loss),
                     ORCH_OK);
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    float *g = test_read_grads(A, ctx, t.total);
    /* Entries: the largest gradient and three random ones. */
    finite_difference_check(ctx, &m, tokens, targets, 1, T, g, loss, 4, 12345, 1e-3);
    free(g);
    A->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* KV-cache equivalence                                                       */
/* ------------------------------------------------------------------------- */

#define KV_V    61u
#define KV_T    48u
#define KV_SEQS 3

START_TEST(test_kv_equivalence) {
    const char *opt = variants[_i];
    orch_model_desc m = test_model_desc(KV_V, KV_T, 2, 2, 16);
    m.mlp_width = 40;
    orch_engine_ctx *ctx = make_ctx(&m, 0, 3, opt);
    fill_random_params(ctx, 5);
    static const uint32_t len[KV_SEQS] = { 41, 23, 9 };
    /* Prefill chunks of uneven length per sequence, then single tokens. */
    static const uint32_t chunks[KV_SEQS][4] = { { 5, 3, 7, 0 },
                                                 { 1, 6, 0, 0 },
                                                 { 4, 0, 0, 0 } };
    int32_t tok[KV_SEQS][KV_T];
    uint64_t s = 77;
    for (int q = 0; q < KV_SEQS; q++)
        for (uint32_t k = 0; k < len[q]; k++) {
            tok[q][k] = (int32_t)((test_lcg64(&s) >> 33) % KV_V);
        }
    const uint32_t bs = 4, nb = 50;
    ck_assert_int_eq(A->kv_configure(ctx, bs, nb), ORCH_OK);

    /* Reference: each sequence alone, one full forward, all logits. */
    float *ref[KV_SEQS];
    int32_t full_table[12];
    for (uint32_t b = 0; b < 12; b++) full_table[b] = (int32_t)b;
    for (int q = 0; q < KV_SEQS; q++) {
        ref[q] = malloc((size_t)len[q] * KV_V * sizeof(float));
        orch_seq_input one =
            test_seq_input(tok[q], len[q], 0, full_table, 12, ORCH_LOGITS_ALL);
        ck_assert_int_eq(test_infer(A, ctx, &one, 1, ref[q], (uint64_t)len[q] * KV_V),
                         ORCH_OK);
    }
    /* Incremental: shuffled, interleaved block tables from the other blocks. */
    int32_t table[KV_SEQS][12];
    int32_t perm[38];
    for (int b = 0; b < 38; b++) perm[b] = 12 + b;
    for (int b = 37; b > 0; b--) {
        int r = (int)((test_lcg64(&s) >> 33) % (uint64_t)(b + 1));
        int32_t t = perm[b];
        perm[b] = perm[r];
        perm[r] = t;
    }
    for (int q = 0; q < KV_SEQS; q++)
        for (int b = 0; b < 11; b++) table[q][b] = perm[b * KV_SEQS + q];
    uint32_t pos[KV_SEQS] = { 0 }, chunk_i[KV_SEQS] = { 0 };
    float *out = malloc((size_t)KV_SEQS * 8 * KV_V * sizeof(float));
    int steps = 0;
    double worst = 0.0;
    for (;;) {
        orch_seq_input in[KV_SEQS];
        int idx[KV_SEQS], n = 0;
        for (int q = 0; q < KV_SEQS; q++) {
            if (pos[q] >= len[q]) continue;
            uint32_t c = chunks[q][chunk_i[q]] ? chunks[q][chunk_i[q]++] : 1;
            if (pos[q] + c > len[q]) c = len[q] - pos[q];
            /* Chunks ask for all their logits; single tokens for the last. */
            in[n] = test_seq_input(tok[q] + pos[q], c, pos[q], table[q],
                                   (pos[q] + c + bs - 1) / bs,
                                   c > 1 ? ORCH_LOGITS_ALL : ORCH_LOGITS_LAST);
            idx[n++] = q;
        }
        if (n == 0) break;
        int32_t st =
            test_infer(A, ctx, in, (uint32_t)n, out, (uint64_t)KV_SEQS * 8 * KV_V);
        ck_assert_msg(st == ORCH_OK, "[%s] step %d: %s", opt, steps, A->last_error(ctx));
        const float *row = out;
        for (int k = 0; k < n; k++) {
            int q = idx[k];
            for (uint32_t t = 0; t < in[k].n_tokens; t++, row += KV_V) {
                const float *r = ref[q] + (size_t)(pos[q] + t) * KV_V;
                for (uint32_t v = 0; v < KV_V; v++) {
                    double d = fabs((double)row[v] - r[v]);
                    if (d > worst) worst = d;
                }
            }
            pos[q] += in[k].n_tokens;
        }
        steps++;
    }
    ck_assert_msg(worst <= 1e-5, "[%s] incremental vs full logits differ by %g", opt,
                  worst);
    ck_assert_int_eq(steps, 29); /* 3 chunks + 26 single tokens */
    for (int q = 0; q < KV_SEQS; q++) free(ref[q]);
    free(out);
    A->context_destroy(ctx);
}
END_TEST

START_TEST(test_kv_long_prefill) {
    /* Chunks longer than the engine's 64-row attention blocks, and a chunk
     * that starts mid-sequence, against one full forward. */
    const uint32_t T = 150, V = 53;
    orch_model_desc m = test_model_desc(V, 160, 2, 2, 16);
    orch_engine_ctx *ctx = make_ctx(&m, 0, 3, variants[_i]);
    fill_random_params(ctx, 12);
    ck_assert_int_eq(A->kv_configure(ctx, 16, 24), ORCH_OK);
    int32_t tok[150], ta[10], tb[10];
    for (uint32_t k = 0; k < T; k++) tok[k] = (int32_t)((k * 7919u + 3u) % V);
    for (int b = 0; b < 10; b++) {
        ta[b] = b;
        tb[b] = 23 - b;
    }
    float *ref = malloc((size_t)T * V * sizeof(float));
    float *got = malloc((size_t)T * V * sizeof(float));
    orch_seq_input s = test_seq_input(tok, T, 0, ta, 10, ORCH_LOGITS_ALL);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, ref, (uint64_t)T * V), ORCH_OK);
    s = test_seq_input(tok, 100, 0, tb, 7, ORCH_LOGITS_ALL);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, got, (uint64_t)T * V), ORCH_OK);
    s = test_seq_input(tok + 100, 40, 100, tb, 9, ORCH_LOGITS_ALL);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, got + (size_t)100 * V, (uint64_t)40 * V),
                     ORCH_OK);
    for (uint32_t k = 140; k < T; k++) {
        s = test_seq_input(tok + k, 1, k, tb, 10, ORCH_LOGITS_LAST);
        ck_assert_int_eq(test_infer(A, ctx, &s, 1, got + (size_t)k * V, V), ORCH_OK);
    }
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)T * V; i++)
        worst = fmax(worst, fabs((double)got[i] - ref[i]));
    ck_assert_msg(worst <= 1e-5, "[%s] chunked vs full logits differ by %g", variants[_i],
                  worst);
    free(ref);
    free(got);
    A->context_destroy(ctx);
}
END_TEST

START_TEST(test_kv_copy_on_write) {
    orch_model_desc m = test_model_desc(KV_V, KV_T, 2, 2, 16);
    orch_engine_ctx *ctx = make_ctx(&m, 0, 3, NULL);
    fill_random_params(ctx, 8);
    ck_assert_int_eq(A->kv_configure(ctx, 4, 16), ORCH_OK);
    int32_t prompt[6] = { 1, 2, 3, 4, 5, 6 }, a_tok = 7, b_tok = 9;
    int32_t ta[2] = { 0, 1 }, tb[2] = { 0, 2 };
    float la[KV_V], lb[KV_V], ra[KV_V], rb[KV_V];
    /* Prefix in blocks 0, 1 (positions 0..5), then fork: block 1 is
     * partially filled, so branch b gets a copy in block 2. */
    orch_seq_input s0 = test_seq_input(prompt, 6, 0, ta, 2, ORCH_LOGITS_NONE);
    ck_assert_int_eq(test_infer(A, ctx, &s0, 1, NULL, 0), ORCH_OK);
    int32_t src = 1, dst = 2;
    ck_assert_int_eq(A->kv_copy_blocks(ctx, &src, &dst, 1), ORCH_OK);
    orch_seq_input br[2] = { test_seq_input(&a_tok, 1, 6, ta, 2, ORCH_LOGITS_LAST),
                             test_seq_input(&b_tok, 1, 6, tb, 2, ORCH_LOGITS_LAST) };
    float both[2 * KV_V];
    ck_assert_int_eq(test_infer(A, ctx, br, 2, both, 2 * KV_V), ORCH_OK);
    memcpy(la, both, sizeof la);
    memcpy(lb, both + KV_V, sizeof lb);
    /* References: each branch as one full forward. */
    int32_t full[7], t3[2] = { 4, 5 };
    memcpy(full, prompt, sizeof prompt);
    full[6] = a_tok;
    orch_seq_input fa = test_seq_input(full, 7, 0, t3, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(A, ctx, &fa, 1, ra, KV_V), ORCH_OK);
    full[6] = b_tok;
    ck_assert_int_eq(test_infer(A, ctx, &fa, 1, rb, KV_V), ORCH_OK);
    for (uint32_t v = 0; v < KV_V; v++) {
        ck_assert_msg(fabsf(la[v] - ra[v]) <= 1e-5f, "branch a logit %u", v);
        ck_assert_msg(fabsf(lb[v] - rb[v]) <= 1e-5f, "branch b logit %u", v);
    }
    ck_assert_msg(memcmp(la, lb, sizeof la) != 0, "branches should differ");
    A->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Determinism, initialisation, accumulation                                  */
/* ------------------------------------------------------------------------- */

static void train_steps(orch_engine_ctx *ctx, int steps, float *losses) {
    int32_t tokens[3 * 16], targets[3 * 16];
    for (int i = 0; i < 48; i++) {
        tokens[i] = (i * 37 + 11) % 101;
        targets[i] = (i * 53 + 7) % 101;
    }
    for (int s = 0; s < steps; s++) {
        orch_adamw_params p = test_adamw((uint64_t)s + 1, 3e-3f, 0.1f, 1.0f);
        ck_assert_int_eq(A->grads_zero(ctx), ORCH_OK);
        ck_assert_int_eq(
            A->forward_backward(ctx, tokens, targets, 3, 16, 0.5f, &losses[2 * s]),
            ORCH_OK);
        ck_assert_int_eq(A->forward_backward(ctx, tokens + 8, targets + 8, 2, 16, 0.5f,
                                             &losses[2 * s + 1]),
                         ORCH_OK);
        ck_assert_int_eq(A->optimizer_step(ctx, &p, NULL), ORCH_OK);
    }
}

START_TEST(test_determinism) {
    static const uint32_t threads[] = { 1, 2, 3 };
    orch_model_desc m = test_model_desc(101, 32, 2, 4, 32);
    for (int t = 0; t < 3; t++) {
        orch_engine_ctx *a = make_ctx(&m, threads[t], 42, NULL);
        orch_engine_ctx *b = make_ctx(&m, threads[t], 42, NULL);
        float la[8], lb[8];
        train_steps(a, 4, la);
        train_steps(b, 4, lb);
        ck_assert_msg(memcmp(la, lb, sizeof la) == 0, "losses differ (threads %u)",
                      threads[t]);
        uint64_t n;
        float *pa = read_params(a, &n), *pb = read_params(b, &n);
        ck_assert_msg(memcmp(pa, pb, n * sizeof(float)) == 0,
                      "parameters differ (threads %u)", threads[t]);
        float *ga = read_grads(a, &n), *gb = read_grads(b, &n);
        ck_assert_msg(memcmp(ga, gb, n * sizeof(float)) == 0,
                      "gradients differ (threads %u)", threads[t]);
        free(pa);
        free(pb);
        free(ga);
        free(gb);
        A->context_destroy(a);
        A->context_destroy(b);
    }
}
END_TEST

START_TEST(test_init_and_table) {
    orch_model_desc m = test_model_desc(101, 32, 3, 4, 32);
    orch_engine_ctx *a = make_ctx(&m, 2, 42, NULL);
    orch_engine_ctx *b = make_ctx(&m, 3, 42, NULL);
    orch_engine_ctx *c = make_ctx(&m, 2, 43, NULL);
    uint64_t n;
    float *pa = read_params(a, &n), *pb = read_params(b, &n), *pc = read_params(c, &n);
    ck_assert_msg(memcmp(pa, pb, n * sizeof(float)) == 0,
                  "initialisation must not depend on the thread count");
    ck_assert_msg(memcmp(pa, pc, n * sizeof(float)) != 0, "seeds must matter");
    test_table t;
    test_read_table(A, a, ORCH_TENSOR_PARAM, &t);
    ck_assert_uint_eq(t.n, 4 + 12 * 3);
    uint64_t off = 0;
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info ti = t.info[i];
        ck_assert_uint_eq(ti.offset, off);
        off += ti.numel;
        ck_assert_uint_eq(ti.dtype, ORCH_DTYPE_F32);
        ck_assert_uint_eq(!!(ti.flags & ORCH_TENSOR_FLAG_NO_DECAY), ti.ndim == 1);
        const float *p = pa + ti.offset;
        double sum = 0, sq = 0;
        for (uint64_t k = 0; k < ti.numel; k++) {
            sum += p[k];
            sq += (double)p[k] * p[k];
        }
        double mean = sum / ti.numel, sd = sqrt(sq / ti.numel - mean * mean);
        int ln = strstr(ti.name, "ln_") != NULL;
        if (ti.ndim == 2) {
            double want = strstr(ti.name, "c_proj.weight") ? 0.02 / sqrt(6.0) : 0.02;
            ck_assert_msg(fabs(sd - want) < 0.15 * want && fabs(mean) < 0.2 * want,
                          "%s: std %g (want %g), mean %g", ti.name, sd, want, mean);
        } else {
            float want = ln && strstr(ti.name, ".weight") ? 1.0f : 0.0f;
            for (uint64_t k = 0; k < ti.numel; k++)
                ck_assert_msg(p[k] == want, "%s[%llu] = %g", ti.name,
                              (unsigned long long)k, (double)p[k]);
        }
        /* Moments start at zero and round-trip. */
        float *mm = malloc(ti.numel * sizeof(float));
        ck_assert_int_eq(
            A->tensor_read(a, ORCH_TENSOR_ADAM_V, i, mm, ti.numel * sizeof(float)),
            ORCH_OK);
        for (uint64_t k = 0; k < ti.numel; k++) ck_assert(mm[k] == 0.0f);
        for (uint64_t k = 0; k < ti.numel; k++) mm[k] = (float)k;
        ck_assert_int_eq(
            A->tensor_write(a, ORCH_TENSOR_ADAM_M, i, mm, ti.numel * sizeof(float)),
            ORCH_OK);
        memset(mm, 0, ti.numel * sizeof(float));
        ck_assert_int_eq(
            A->tensor_read(a, ORCH_TENSOR_ADAM_M, i, mm, ti.numel * sizeof(float)),
            ORCH_OK);
        for (uint64_t k = 0; k < ti.numel; k++) ck_assert(mm[k] == (float)k);
        free(mm);
    }
    ck_assert_uint_eq(off, n);
    free(pa);
    free(pb);
    free(pc);
    A->context_destroy(a);
    A->context_destroy(b);
    A->context_destroy(c);
}
END_TEST

START_TEST(test_accumulation_and_flat_grads) {
    orch_model_desc m = test_model_desc(101, 32, 2, 4, 32);
    orch_engine_ctx *ctx = make_ctx(&m, 0, 9, NULL);
    fill_random_params(ctx, 3);
    int32_t tokens[32], targets[32];
    for (int i = 0; i < 32; i++) {
        tokens[i] = (i * 29 + 5) % 101;
        targets[i] = (i * 31 + 2) % 101;
    }
    float l1, l2, l3, le;
    ck_assert_int_eq(A->forward_backward(ctx, tokens, targets, 2, 16, 1.0f, &l1),
                     ORCH_OK);
    uint64_t n;
    float *once = read_grads(ctx, &n);
    ck_assert_int_eq(A->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(A->forward_backward(ctx, tokens, targets, 2, 16, 0.5f, &l2),
                     ORCH_OK);
    ck_assert_int_eq(A->forward_backward(ctx, tokens, targets, 2, 16, 0.5f, &l3),
                     ORCH_OK);
    float *twice = read_grads(ctx, &n);
    ck_assert(l1 == l2 && l2 == l3);
    double worst = 0, scale = 0;
    for (uint64_t k = 0; k < n; k++) {
        worst = fmax(worst, fabs((double)once[k] - twice[k]));
        scale = fmax(scale, fabs(once[k]));
    }
    ck_assert_msg(worst <= 1e-6 * scale, "accumulated gradients differ by %g", worst);
    /* eval_loss matches and leaves the gradients alone. */
    ck_assert_int_eq(A->eval_loss(ctx, tokens, targets, 2, 16, &le), ORCH_OK);
    ck_assert(le == l1);
    float *after = read_grads(ctx, &n);
    ck_assert(memcmp(after, twice, n * sizeof(float)) == 0);
    /* Flat write/read at an offset round-trips. */
    for (uint64_t k = 0; k < 100; k++) after[k] = (float)k - 50.0f;
    ck_assert_int_eq(A->grads_write(ctx, n - 100, 100, after), ORCH_OK);
    float back[100];
    ck_assert_int_eq(A->grads_read(ctx, n - 100, 100, back), ORCH_OK);
    ck_assert(memcmp(back, after, sizeof back) == 0);
    /* All targets ignored: loss 0, no gradient. */
    int32_t none[32];
    for (int i = 0; i < 32; i++) none[i] = -1;
    ck_assert_int_eq(A->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(A->forward_backward(ctx, tokens, none, 2, 16, 1.0f, &le), ORCH_OK);
    ck_assert(le == 0.0f);
    float *zero = read_grads(ctx, &n);
    for (uint64_t k = 0; k < n; k++) ck_assert(zero[k] == 0.0f);
    free(once);
    free(twice);
    free(after);
    free(zero);
    A->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Bad calls                                                                  */
/* ------------------------------------------------------------------------- */

#define EXPECT_ERR(ctx, call, code)                                                  \
    do {                                                                             \
        int32_t st_ = (call);                                                        \
        ck_assert_msg(st_ == (code), "%s returned %d, want %d", #call, st_, (code)); \
        ck_assert_msg(A->last_error(ctx)[0] != '\0', "%s: no message", #call);       \
    } while (0)

START_TEST(test_bad_create) {
    orch_model_desc m = test_model_desc(50, 16, 1, 3, 16); /* 3 does not divide 16 */
    orch_engine_options o = { sizeof o, 1, 1, NULL };
    orch_engine_ctx *ctx = NULL;
    char err[256] = "";
    ck_assert_int_eq(A->context_create(&m, &o, &ctx, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert(ctx == NULL && err[0]);
    m = test_model_desc(50, 16, 1, 2, 16);
    m.arch = 3; /* neither gpt2 nor llama (llama: tests/test_cpu_llama.c) */
    err[0] = 0;
    ck_assert_int_eq(A->context_create(&m, &o, &ctx, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert(strstr(err, "arch 3 is unknown"));
    m.arch = ORCH_ARCH_GPT2;
    m.vocab_size = 0;
    ck_assert_int_eq(A->context_create(&m, &o, &ctx, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
    m.vocab_size = 50;
    const char *bad[] = { "bogus=1",   "threads=x", "isa=sse9",
                          "skinny=-1", "noequals",  "max_batch_tokens=0" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.options = bad[i];
        err[0] = 0;
        ck_assert_msg(A->context_create(&m, &o, &ctx, err, sizeof err) ==
                          ORCH_ERR_INVALID_ARGUMENT,
                      "option '%s' accepted", bad[i]);
        ck_assert(ctx == NULL && err[0]);
    }
    o.options = " threads = 2 ; isa=generic, skinny=4 ";
    ck_assert_int_eq(A->context_create(&m, &o, &ctx, err, sizeof err), ORCH_OK);
    A->context_destroy(ctx);
    A->context_destroy(NULL);
}
END_TEST

START_TEST(test_bad_calls) {
    orch_model_desc m = test_model_desc(50, 16, 1, 2, 16);
    orch_engine_ctx *ctx = make_ctx(&m, 2, 1, "max_batch_tokens=20");
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    const uint64_t n = t.total;
    float *buf = calloc(n, sizeof(float));
    float loss;
    orch_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.struct_size = sizeof ti;
    uint32_t cnt;
    EXPECT_ERR(ctx, A->tensor_count(ctx, 7, &cnt), ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->tensor_info(ctx, 0, 999, &ti), ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->tensor_read(ctx, 0, 0, buf, 12), ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->tensor_write(ctx, 0, 0, NULL, 50 * 16 * 4),
               ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->grads_read(ctx, n - 5, 6, buf), ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->grads_write(ctx, 0, 10, NULL), ORCH_ERR_INVALID_ARGUMENT);

    int32_t tok[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, tgt[8] = { 2, 3, 4, 5, 6, 7, 8, 9 };
    int32_t badtok[8] = { 1, 2, 3, 50, 5, 6, 7, 8 },
            badtgt[8] = { 2, 3, 4, 5, 6, -2, 8, 9 };
    int32_t longtok[17] = { 0 }, longtgt[17] = { 0 };
    EXPECT_ERR(ctx, A->forward_backward(ctx, badtok, tgt, 1, 8, 1.0f, &loss),
               ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->forward_backward(ctx, tok, badtgt, 1, 8, 1.0f, &loss),
               ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->forward_backward(ctx, longtok, longtgt, 1, 17, 1.0f, &loss),
               ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->forward_backward(ctx, tok, tgt, 1, 8, 1.0f, NULL),
               ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->forward_backward(ctx, tok, tgt, 1, 8, NAN, &loss),
               ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->forward_backward(ctx, tok, tgt, 0, 8, 1.0f, &loss),
               ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->eval_loss(ctx, badtok, tgt, 1, 8, &loss),
               ORCH_ERR_INVALID_ARGUMENT);
    orch_adamw_params p = test_adamw(0, 1e-3f, 0.0f, 1.0f);
    EXPECT_ERR(ctx, A->optimizer_step(ctx, &p, NULL), ORCH_ERR_INVALID_ARGUMENT);
    p.step = 1;
    p.beta1 = 1.0f;
    EXPECT_ERR(ctx, A->optimizer_step(ctx, &p, NULL), ORCH_ERR_INVALID_ARGUMENT);
    p.beta1 = 0.9f;
    /* A non-finite gradient: NUMERIC, parameters and moments unchanged. */
    uint64_t np;
    float *before = read_params(ctx, &np);
    buf[3] = INFINITY;
    ck_assert_int_eq(A->grads_write(ctx, 0, n, buf), ORCH_OK);
    float norm = -7.0f;
    EXPECT_ERR(ctx, A->optimizer_step(ctx, &p, &norm), ORCH_ERR_NUMERIC);
    ck_assert(norm == -7.0f);
    float *after = read_params(ctx, &np);
    ck_assert(memcmp(before, after, np * sizeof(float)) == 0);
    free(before);
    free(after);

    /* Inference. */
    float logits[4 * 50];
    int32_t table[4] = { 0, 1, 2, 3 };
    orch_seq_input s = test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_LAST);
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_STATE);
    EXPECT_ERR(ctx, A->kv_configure(ctx, 0, 4), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(A->kv_configure(ctx, 4, 4), ORCH_OK);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, logits, 50), ORCH_OK);
    s = test_seq_input(badtok, 4, 0, table, 1, ORCH_LOGITS_LAST);
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_INVALID_ARGUMENT);
    s = test_seq_input(tok, 4, 14, table, 4, ORCH_LOGITS_LAST); /* past context 16 */
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_INVALID_ARGUMENT);
    int32_t outside[2] = { 0, 4 };
    s = test_seq_input(tok, 8, 0, outside, 2, ORCH_LOGITS_LAST);
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_INVALID_ARGUMENT);
    s = test_seq_input(tok, 8, 0, table, 1, ORCH_LOGITS_LAST); /* too few blocks */
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_INVALID_ARGUMENT);
    s = test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_ALL); /* 4 rows, room for 3 */
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 150), ORCH_ERR_CAPACITY);
    s = test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_LAST);
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, NULL, 50), ORCH_ERR_INVALID_ARGUMENT);
    s.logits_mode = 9;
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_INVALID_ARGUMENT);
    s.logits_mode = ORCH_LOGITS_LAST;
    s.adapter_id = 1;
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_INVALID_ARGUMENT);
    /* Over max_batch_tokens (20): 3 sequences of 8. */
    int32_t t1[2] = { 0, 1 }, t2[2] = { 2, 3 }, t3[2] = { 0, 1 };
    orch_seq_input three[3] = { test_seq_input(tok, 8, 0, t1, 2, ORCH_LOGITS_NONE),
                                test_seq_input(tok, 8, 0, t2, 2, ORCH_LOGITS_NONE),
                                test_seq_input(tok, 8, 0, t3, 2, ORCH_LOGITS_NONE) };
    EXPECT_ERR(ctx, test_infer(A, ctx, three, 3, logits, 200), ORCH_ERR_CAPACITY);
    /* A block written by one sequence and read by another. */
    int32_t wa[1] = { 0 }, wb[2] = { 0, 2 };
    orch_seq_input pair[2] = { test_seq_input(tok, 4, 0, wa, 1, ORCH_LOGITS_NONE),
                               test_seq_input(tok + 4, 1, 4, wb, 2, ORCH_LOGITS_LAST) };
    EXPECT_ERR(ctx, test_infer(A, ctx, pair, 2, logits, 50), ORCH_ERR_INVALID_ARGUMENT);
    /* Reading a position never written. */
    ck_assert_int_eq(A->kv_configure(ctx, 4, 4), ORCH_OK);
    s = test_seq_input(tok, 1, 5, t1, 2, ORCH_LOGITS_LAST);
    EXPECT_ERR(ctx, test_infer(A, ctx, &s, 1, logits, 50), ORCH_ERR_STATE);
    int32_t src[2] = { 0, 1 }, dst[2] = { 1, 2 }, far[1] = { 9 };
    EXPECT_ERR(ctx, A->kv_copy_blocks(ctx, src, dst, 2), ORCH_ERR_INVALID_ARGUMENT);
    EXPECT_ERR(ctx, A->kv_copy_blocks(ctx, src, far, 1), ORCH_ERR_INVALID_ARGUMENT);
    uint64_t bb;
    EXPECT_ERR(ctx, A->kv_block_bytes(ctx, 0, &bb), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(A->kv_block_bytes(ctx, 16, &bb), ORCH_OK);
    ck_assert_uint_ge(bb, 16u * 2 * 16 * 4);
    /* After all that the context still works. */
    s = test_seq_input(tok, 4, 0, table, 1, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, logits, 50), ORCH_OK);
    ck_assert_int_eq(A->forward_backward(ctx, tok, tgt, 1, 8, 1.0f, &loss), ORCH_OK);
    ck_assert(isfinite(loss));
    free(buf);
    A->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* orch bench (orchestrator/bench/bench.c)                                          */
/* ------------------------------------------------------------------------- */

START_TEST(test_bench_formula) {
    /* GPT-2 124M: 124,439,808 parameters, 786,432 of them in wpe. */
    orch_model_desc m = test_model_desc(50257, 1024, 12, 12, 768);
    uint64_t all = 0, no_wpe = 0;
    double f = bench_train_flops_per_token(&m, 64, &all, &no_wpe);
    ck_assert_uint_eq(all, 124439808u);
    ck_assert_uint_eq(no_wpe, 124439808u - 786432u);
    ck_assert(f == 6.0 * (124439808.0 - 786432.0) + 12.0 * 12 * 64 * 768);
}
END_TEST

START_TEST(test_bench_runs) {
    orch_model_desc m = test_model_desc(97, 64, 2, 2, 32);
    char err[512];
    bench_train_opts to = { 2, 16, 2, 1, 2, 1, NULL, NULL };
    bench_train_result tr;
    ck_assert_msg(bench_train(&H, &m, &to, &tr, err, sizeof err) == 0, "%s", err);
    ck_assert(tr.tokens_per_s > 0 && tr.ms_per_step > 0 && tr.model_gflops_per_s > 0);
    ck_assert_msg(tr.sgemm_peak_gflops_per_s > 0 && tr.mfu > 0,
                  "the cpu engine brings OpenBLAS: the peak must be measured");
    ck_assert(fabs(tr.tokens_per_s * tr.ms_per_step / 1e3 - 32.0) < 1e-6);
    ck_assert(isfinite(tr.first_loss) && isfinite(tr.last_loss));
    bench_infer_opts io = { 40, 8, 4, 4, 2, 1, NULL, NULL };
    bench_infer_result ir;
    ck_assert_msg(bench_infer(&H, &m, &io, &ir, err, sizeof err) == 0, "%s", err);
    ck_assert(ir.prefill_tokens_per_s > 0 && ir.mem_bw_gb_per_s > 0);
    for (int k = 0; k < BENCH_DECODE_BATCHES; k++)
        ck_assert(ir.decode_tokens_per_s[k] > 0);
    ck_assert(ir.mem_bw_gb_per_s == fmax(ir.read_gb_per_s, ir.triad_gb_per_s));
    ck_assert(fabs(ir.decode_bw_fraction - ir.weight_bytes * ir.decode_tokens_per_s[0] /
                                               (ir.mem_bw_gb_per_s * 1e9)) < 1e-9);
    /* Bad shapes are refused with a message. */
    bench_train_opts bad = { 2, 65, 1, 0, 1, 1, NULL, NULL };
    err[0] = 0;
    ck_assert(bench_train(&H, &m, &bad, &tr, err, sizeof err) == -1 && err[0]);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Training memory: attention recomputed per query block, GELU recomputed,    */
/* the loss over row chunks                                                   */
/* ------------------------------------------------------------------------- */

/* Gradients at a sequence longer than one attention query block (128) and
 * not a multiple of it, against central finite differences. Only the last
 * 6 positions of each sequence count, so the loss reaches every key through
 * the last block and (two layers) every query block of the first layer,
 * and the gradients are not diluted by averaging over hundreds of rows.
 * The same gradients with 1 and 3 threads agree. */
START_TEST(test_long_seq_gradients) {
    enum { LB = 2, LT = 250 };
    orch_model_desc m = test_model_desc(29, 256, 2, 2, 8);
    m.mlp_width = 16;
    int32_t *tokens = malloc(LB * LT * sizeof(int32_t));
    int32_t *targets = malloc(LB * LT * sizeof(int32_t));
    for (int i = 0; i < LB * LT; i++) {
        tokens[i] = (i * 7 + i / 13) % 29;
        targets[i] = i % LT >= LT - 6 ? (i * 11 + 5) % 29 : -1;
    }
    float *g[2];
    orch_engine_ctx *ctx = NULL;
    float loss = 0.0f;
    for (int v = 0; v < 2; v++) {
        orch_engine_ctx *c = make_ctx(&m, v == 0 ? 3 : 1, 7, NULL);
        fill_random_params(c, 5);
        ck_assert_int_eq(A->forward_backward(c, tokens, targets, LB, LT, 1.0f, &loss),
                         ORCH_OK);
        uint64_t n;
        g[v] = read_grads(c, &n);
        double gmax = 0.0, dmax = 0.0;
        for (uint64_t k = 0; k < n; k++) {
            if (fabs(g[v][k]) > gmax) gmax = fabs(g[v][k]);
            if (fabs(g[v][k] - g[0][k]) > dmax) dmax = fabs(g[v][k] - g[0][k]);
        }
        ck_assert_msg(dmax <= 1e-5 * gmax,
                      "threads 1 vs 3: gradients differ by %g (max %g)", dmax, gmax);
        if (v == 0)
            ctx = c;
        else
            A->context_destroy(c);
    }
    finite_difference_check(ctx, &m, tokens, targets, LB, LT, g[0], loss, 3, 777, 0);
    free(g[0]);
    free(g[1]);
    free(tokens);
    free(targets);
    A->context_destroy(ctx);
}
END_TEST

/* Peak RSS (KiB) of a child that makes a context of m and runs one
 * forward_backward of B x T. */
static long child_peak_rss_kib(const orch_model_desc *m, uint32_t B, uint32_t T) {
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fd[0]);
        long kib = -1;
        orch_engine_ctx *ctx = NULL;
        char err[256];
        if (engine_create_context(&H, m, 2, 3, NULL, &ctx, err, sizeof err) == 0) {
            size_t n = (size_t)B * T;
            int32_t *tok = malloc(n * sizeof(int32_t)),
                    *tgt = malloc(n * sizeof(int32_t));
            for (size_t i = 0; i < n; i++) {
                tok[i] = (int32_t)((i * 13 + 1) % m->vocab_size);
                tgt[i] = (int32_t)((i * 17 + 3) % m->vocab_size);
            }
            float loss;
            if (tok && tgt &&
                A->forward_backward(ctx, tok, tgt, B, T, 1.0f, &loss) == 0) {
                struct rusage ru;
                getrusage(RUSAGE_SELF, &ru);
                kib = ru.ru_maxrss;
            }
        }
        if (write(fd[1], &kib, sizeof kib) != (ssize_t)sizeof kib) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    long kib = -1;
    ck_assert_int_eq(read(fd[0], &kib, sizeof kib), (ssize_t)sizeof kib);
    close(fd[0]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(kib > 0, "child failed to train %u x %u", B, T);
    return kib;
}

/* Activation memory is linear in the tokens of a batch, not quadratic in
 * seq_len: the same 2048 tokens as 32 x 64 and as 2 x 1024 take about the
 * same peak RSS. Keeping [B, heads, T, T] probabilities per layer would add
 * 4 layers x 2 x 4 x 1024^2 floats = 128 MiB at 2 x 1024. */
START_TEST(test_activation_memory_linear) {
    orch_model_desc m = test_model_desc(64, 1024, 4, 4, 32);
    long short_kib = child_peak_rss_kib(&m, 32, 64);
    long long_kib = child_peak_rss_kib(&m, 2, 1024);
    ck_assert_msg(long_kib - short_kib < 24 * 1024,
                  "peak RSS 2x1024: %ld KiB, 32x64: %ld KiB (quadratic in seq_len?)",
                  long_kib, short_kib);
}
END_TEST

/* The loss runs over chunks of 1024 rows: 5 x 256 rows (one full chunk and
 * a partial one, vocabulary 67) give the loss and gradients of the same five
 * sequences run one by one (256 rows each, one chunk), and eval_loss the same
 * loss bit for bit. */
START_TEST(test_chunked_loss) {
    enum { CB = 5, CT = 256 };
    orch_model_desc m = test_model_desc(67, CT, 1, 2, 16);
    orch_engine_ctx *ctx = make_ctx(&m, 0, 11, NULL);
    fill_random_params(ctx, 21);
    int32_t *tokens = malloc(CB * CT * sizeof(int32_t));
    int32_t *targets = malloc(CB * CT * sizeof(int32_t));
    for (int i = 0; i < CB * CT; i++) {
        tokens[i] = (i * 31 + 3) % 67;
        targets[i] = (i * 19 + 8) % 67;
    }
    float loss_all, loss_eval;
    ck_assert_int_eq(A->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(A->forward_backward(ctx, tokens, targets, CB, CT, 1.0f, &loss_all),
                     ORCH_OK);
    uint64_t n;
    float *g_all = read_grads(ctx, &n);
    ck_assert_int_eq(A->eval_loss(ctx, tokens, targets, CB, CT, &loss_eval), ORCH_OK);
    ck_assert_msg(loss_eval == loss_all, "eval_loss %.9g vs forward_backward %.9g",
                  loss_eval, loss_all);
    ck_assert_int_eq(A->grads_zero(ctx), ORCH_OK);
    double sum = 0.0;
    for (int b = 0; b < CB; b++) {
        float l;
        ck_assert_int_eq(A->forward_backward(ctx, tokens + b * CT, targets + b * CT, 1,
                                             CT, 1.0f / CB, &l),
                         ORCH_OK);
        sum += l;
    }
    float *g_one = read_grads(ctx, &n);
    ck_assert_msg(fabs(sum / CB - loss_all) <= 1e-5 * fabs(loss_all),
                  "chunked loss %.9g vs per-sequence %.9g", loss_all, sum / CB);
    double gmax = 0.0, dmax = 0.0;
    for (uint64_t k = 0; k < n; k++) {
        if (fabs(g_all[k]) > gmax) gmax = fabs(g_all[k]);
        if (fabs(g_all[k] - g_one[k]) > dmax) dmax = fabs(g_all[k] - g_one[k]);
    }
    ck_assert_msg(gmax > 0 && dmax <= 1e-4 * gmax,
                  "chunked vs per-sequence gradients differ by %g (max %g)", dmax, gmax);
    free(g_all);
    free(g_one);
    free(tokens);
    free(targets);
    A->context_destroy(ctx);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_engine");
    TCase *tc = tcase_create("torch");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_torch_forward, 0, N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_gradients, 0, N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_adamw_steps, 0, N_VARIANTS);
    suite_add_tcase(s, tc);
    tc = tcase_create("numerics");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_gradient_check);
    tcase_add_loop_test(tc, test_kv_equivalence, 0, N_VARIANTS);
    tcase_add_loop_test(tc, test_kv_long_prefill, 0, N_VARIANTS);
    tcase_add_test(tc, test_kv_copy_on_write);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_init_and_table);
    tcase_add_test(tc, test_accumulation_and_flat_grads);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_bad_create);
    tcase_add_test(tc, test_bad_calls);
    suite_add_tcase(s, tc);
    tc = tcase_create("bench");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_bench_formula);
    tcase_add_test(tc, test_bench_runs);
    suite_add_tcase(s, tc);
    tc = tcase_create("train_memory");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_long_seq_gradients);
    tcase_add_test(tc, test_activation_memory_linear);
    tcase_add_test(tc, test_chunked_loss);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
