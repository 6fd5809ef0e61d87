/*
 * test_cuda_ft_stream.c - token-level fine-tuning streams of the CUDA engine
 * (ABI 1.5, ORCH_CAP_FT_STREAM: ft_stream_open, ft_stream_close,
 * coserve_step; engines/cuda/cuda_ft_stream.cu), the checks
 * tests/test_cpu_ft_stream.c makes of the CPU engine:
 *
 *   - against adapter_forward_backward of the same context (the verified
 *     adapter path of tests/test_cuda_lora.c) on the LoRA fixtures
 *     (tests/fixtures/cpu_{gpt2,llama}_tiny_lora{,_sub}: GPT-2 with all
 *     targets and with attn.c_proj + mlp.c_fc; LLaMA with GQA (4 query
 *     heads, 2 K/V heads), an untied head, all targets and q/k/v +
 *     down_proj), batch 1 and 2 (seq_len 12), steps of 1, 3, 5, T and B*T
 *     rows: the loss within 1e-5 relative and the adapter gradients within
 *     1e-5 of the largest reference entry (the dK|dV sums of the chunks are
 *     split differently; on the CPU emulator of tests/cuda_emu the losses
 *     have had the same bits, the gradients differ by float rounding); the
 *     adapter's gradients keep their bits until the last row; progress
 *     counts forward and backward rows; adapter_eval_loss runs between
 *     steps; two interleaved streams on one adapter add twice;
 *   - seq_len 150 and batch 2 (300 rows: more than one 64-query attention
 *     block and more than one 256-row chunk), GPT-2 and LLaMA with GQA,
 *     random adapters, steps of 37 rows and of all rows;
 *   - closing a stream early (after forward rows, after backward rows, at
 *     once) leaves the adapter's gradients with their bits;
 *   - coserve_step with an inference batch (prefill, then decode steps) and
 *     a stream: the logits equal infer_forward's on another context (within
 *     1e-5), the stream's loss and gradients equal adapter_forward_backward's;
 *     on the emulator (which counts cublasGemmEx calls) a step with forward
 *     rows makes 4 per layer + 1 (the LM head) fewer GEMMs than the
 *     inference and the chunk run apart: the chunk rides in the inference
 *     rows' base products;
 *   - the CPU engine's streams on the same weights and adapter (steps of 3
 *     rows on the CUDA engine, 5 on the CPU engine): loss and gradients
 *     within 1e-5;
 *   - ORCH_ERR_STATE for adapter_optimizer_step, adapter_tensor_write of
 *     PARAM and adapter_destroy of the stream's adapter while it is open
 *     (finished or not), changing nothing; unknown and closed stream ids, a
 *     short progress struct_size, an unknown adapter, bad micro-batches
 *     (the CPU engine's statuses); a finished stream does no work; stream 0
 *     runs the inference only; all targets -1: loss 0, no gradient; the
 *     1025th open stream of a context is ORCH_ERR_CAPACITY;
 * Measured on the emulator: losses within 9.1e-8 relative, gradients
 * within 9.1e-7 of the largest entry (printed at the end).
 *
 * The CUDA engine is `cuda` or the library ORCH_CUDA_ENGINE names
 * (tests/cuda_emu.sh points it at the engine built against the CPU
 * emulator). Where it cannot run here the suite prints why and exits 77.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/store/safetensors.h"
#include "tests/test_fixture.h"
#include "tests/test_ft_stream.h"
#include "tests/test_util.h"

static engine_handle gpu, cpu;
#define A  (gpu.api)
#define CA (cpu.api)

static const char *const fixtures[4] = {
    "tests/fixtures/cpu_gpt2_tiny_lora.safetensors",
    "tests/fixtures/cpu_gpt2_tiny_lora_sub.safetensors",
    "tests/fixtures/cpu_llama_tiny_lora.safetensors",
    "tests/fixtures/cpu_llama_tiny_lora_sub.safetensors",
};
#define N_FIXTURES 4

/* Worst relative differences seen (printed at the end). */
static double worst_loss, worst_grad;

/* ------------------------------------------------------------------------- */
/* Contexts, adapters, streams                                                */
/* ------------------------------------------------------------------------- */

static orch_engine_ctx *make_ctx(const engine_handle *h, const orch_model_desc *m) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(h, m, 0, 1, NULL, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", h->api->name, err);
    return ctx;
}

static uint64_t adapter_numel(const orch_engine_api *api, orch_engine_ctx *ctx,
                              uint32_t id, uint32_t *n_tensors) {
    uint32_t n = 0;
    ck_assert_int_eq(api->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &n), ORCH_OK);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        ck_assert_int_eq(api->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &ti),
                         ORCH_OK);
        total += ti.numel;
    }
    if (n_tensors) *n_tensors = n;
    return total;
}

static float *grads_of(const orch_engine_api *api, orch_engine_ctx *ctx, uint32_t id,
                       uint64_t n) {
    return test_ft_grads(api, ctx, id, n);
}

/* A context of engine h with the fixture's base and adapter. */
typedef struct run {
    safetensors_file *f;
    orch_model_desc m;
    const orch_engine_api *api;
    orch_engine_ctx *ctx;
    uint32_t id, B, T;
    uint64_t n;
    const int32_t *tokens, *targets;
} run;

static void run_open(run *r, int k, const engine_handle *h) {
    r->f = test_fixture_open(fixtures[k]);
    r->m = test_fixture_model(r->f);
    r->api = h->api;
    r->ctx = make_ctx(h, &r->m);
    test_load_fixture_params(r->api, r->ctx, r->f);
    r->B = (uint32_t)test_fixture_meta(r->f, "batch");
    r->T = (uint32_t)test_fixture_meta(r->f, "seq_len");
    size_t n;
    r->tokens = test_fixture_get(r->f, "tokens", SAFETENSORS_I32, &n);
    r->targets = test_fixture_get(r->f, "targets", SAFETENSORS_I32, &n);
    orch_lora_desc d =
        test_lora_desc((uint32_t)test_fixture_meta(r->f, "lora_rank"),
                       (float)test_fixture_meta(r->f, "lora_alpha"),
                       (uint32_t)test_fixture_meta(r->f, "lora_targets"), 99);
    ck_assert_int_eq(r->api->adapter_create(r->ctx, &d, &r->id), ORCH_OK);
    uint32_t nt;
    r->n = adapter_numel(r->api, r->ctx, r->id, &nt);
    for (uint32_t i = 0; i < nt; i++) {
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        ck_assert_int_eq(
            r->api->adapter_tensor_info(r->ctx, r->id, ORCH_TENSOR_PARAM, i, &ti),
            ORCH_OK);
        char key[160];
        snprintf(key, sizeof key, "lora.%s", ti.name);
        size_t ne;
        const float *src = test_fixture_f32(r->f, key, &ne);
        ck_assert_uint_eq(ne, ti.numel);
        ck_assert_int_eq(r->api->adapter_tensor_write(r->ctx, r->id, ORCH_TENSOR_PARAM, i,
                                                      src, ne * sizeof(float)),
                         ORCH_OK);
    }
}

static void run_close(run *r) {
    r->api->context_destroy(r->ctx);
    safetensors_close(r->f);
}

static orch_ft_progress progress0(void) { return test_ft_progress0(); }

static int32_t step(orch_engine_ctx *ctx, const orch_seq_input *seqs, uint32_t n,
                    float *logits, uint64_t cap, uint32_t stream, uint32_t rows,
                    orch_ft_progress *p) {
    return test_ft_step(A, ctx, seqs, n, logits, cap, stream, rows, p);
}

/* cublasGemmEx calls so far on the CPU emulator's build; -1 on a device. */
static long long gemm_calls(void) {
    unsigned long long (*fn)(void) = NULL;
    void *sym = dlsym(gpu.dl, "orch_cuda_emu_gemm_calls");
    if (!sym) return -1;
    memcpy(&fn, &sym, sizeof fn);
    return (long long)fn();
}

/* The reference: adapter_forward_backward's loss and gradients (from zero). */
static float *reference(const orch_engine_api *api, orch_engine_ctx *ctx, uint32_t id,
                        uint64_t n, const int32_t *tok, const int32_t *tgt, uint32_t B,
                        uint32_t T, float scale, float *loss) {
    ck_assert_int_eq(api->adapter_grads_zero(ctx, id), ORCH_OK);
    ck_assert_int_eq(api->adapter_forward_backward(ctx, id, tok, tgt, B, T, scale, loss),
                     ORCH_OK);
    float *g = grads_of(api, ctx, id, n);
    ck_assert_int_eq(api->adapter_grads_zero(ctx, id), ORCH_OK);
    return g;
}

static void check_equal(const char *tag, float loss, float want_loss, const float *g,
                        const float *want, uint64_t n, double tol) {
    const double dl = fabs((double)loss - want_loss);
    ck_assert_msg(dl <= tol * fabs((double)want_loss) + 1e-7, "%s: loss %.8f vs %.8f",
                  tag, loss, want_loss);
    const double d = test_max_diff(g, want, n), m = test_max_abs(want, n);
    ck_assert_msg(m > 0.0, "%s: the reference has no gradient", tag);
    ck_assert_msg(d <= tol * m, "%s: gradients differ by %g (max %g, %.2g relative)", tag,
                  d, m, d / m);
    if (dl / fabs((double)want_loss) > worst_loss)
        worst_loss = dl / fabs((double)want_loss);
    if (d / m > worst_grad) worst_grad = d / m;
}

/* Run stream s of engine api to its end in steps of `rows` (no inference),
 * checking that the adapter's gradients equal `before` after every step but
 * the last (and running adapter_eval_loss between steps with other_calls).
 * Returns the loss. */
static float stream_run(const orch_engine_api *api, orch_engine_ctx *ctx, uint32_t id,
                        uint32_t s, uint32_t rows, uint64_t BT, const float *before,
                        uint64_t n, int other_calls, const int32_t *tok,
                        const int32_t *tgt, uint32_t T) {
    uint64_t fwd = 0, bwd = 0;
    orch_ft_progress p = progress0();
    for (int guard = 0; guard < 100000; guard++) {
        p = progress0();
        int32_t st = test_ft_step(api, ctx, NULL, 0, NULL, 0, s, rows, &p);
        ck_assert_msg(st == ORCH_OK, "coserve_step: %s", api->last_error(ctx));
        const uint64_t expect = rows < 2 * BT - fwd - bwd ? rows : 2 * BT - fwd - bwd;
        ck_assert_uint_eq(p.struct_size, sizeof p);
        ck_assert_uint_eq(p.rows_total, BT);
        ck_assert_uint_eq(p.rows_this_step, expect);
        ck_assert_uint_eq(p.forward_rows + p.backward_rows, fwd + bwd + expect);
        ck_assert(p.backward_rows == 0 || p.forward_rows == BT);
        ck_assert_uint_eq(p.reserved0, 0);
        fwd = p.forward_rows;
        bwd = p.backward_rows;
        if (p.finished) break;
        float *g = grads_of(api, ctx, id, n);
        ck_assert_msg(memcmp(g, before, n * sizeof(float)) == 0,
                      "the adapter's gradients changed before the last row (%llu + %llu)",
                      (unsigned long long)fwd, (unsigned long long)bwd);
        free(g);
        if (other_calls) { /* the stream keeps its own activations */
            float l;
            ck_assert_int_eq(api->adapter_eval_loss(ctx, id, tok, tgt, 1, T, &l),
                             ORCH_OK);
        }
    }
    ck_assert_uint_eq(p.finished, 1);
    ck_assert_uint_eq(fwd, BT);
    ck_assert_uint_eq(bwd, BT);
    /* a finished stream does no more work */
    orch_ft_progress q = progress0();
    ck_assert_int_eq(test_ft_step(api, ctx, NULL, 0, NULL, 0, s, 7, &q), ORCH_OK);
    ck_assert_uint_eq(q.finished, 1);
    ck_assert_uint_eq(q.rows_this_step, 0);
    ck_assert_uint_eq(q.forward_rows, BT);
    ck_assert(q.loss == p.loss);
    return p.loss;
}

/* ------------------------------------------------------------------------- */
/* Streams equal adapter_forward_backward                                     */
/* ------------------------------------------------------------------------- */

static const uint32_t chunk_sizes[] = { 1, 3, 5, 0 /* T */, 1u << 30 /* B*T and more */ };
#define N_CHUNKS 5

START_TEST(test_stream_equals_fb) {
    const int k = _i / 2;
    run r;
    run_open(&r, k, &gpu);
    const uint32_t B = _i % 2 ? r.B : 1, T = r.T;
    float want_loss;
    float *want =
        reference(A, r.ctx, r.id, r.n, r.tokens, r.targets, B, T, 0.75f, &want_loss);
    float *zero = calloc(r.n, sizeof(float));
    for (int c = 0; c < N_CHUNKS; c++) {
        const uint32_t rows = chunk_sizes[c] == 0 ? T : chunk_sizes[c];
        orch_finetune_batch ft = test_ft_batch(r.id, r.tokens, r.targets, B, T, 0.75f);
        uint32_t s = 0;
        ck_assert_int_eq(A->ft_stream_open(r.ctx, &ft, &s), ORCH_OK);
        ck_assert_uint_ge(s, 1);
        const float loss = stream_run(A, r.ctx, r.id, s, rows, (uint64_t)B * T, zero, r.n,
                                      c % 2, r.tokens, r.targets, T);
        float *g = grads_of(A, r.ctx, r.id, r.n);
        char tag[160];
        snprintf(tag, sizeof tag, "[%s B=%u rows=%u]", fixtures[k], B, rows);
        check_equal(tag, loss, want_loss, g, want, r.n, 1e-5);
        free(g);
        ck_assert_int_eq(A->ft_stream_close(r.ctx, s), ORCH_OK);
        ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
    }
    /* two streams at once, interleaved, on the same adapter */
    orch_finetune_batch ft = test_ft_batch(r.id, r.tokens, r.targets, B, T, 0.75f);
    uint32_t s1, s2;
    ck_assert_int_eq(A->ft_stream_open(r.ctx, &ft, &s1), ORCH_OK);
    ck_assert_int_eq(A->ft_stream_open(r.ctx, &ft, &s2), ORCH_OK);
    ck_assert_uint_ne(s1, s2);
    for (int done = 0; done != 3;) {
        orch_ft_progress p1 = progress0(), p2 = progress0();
        ck_assert_int_eq(step(r.ctx, NULL, 0, NULL, 0, s1, 4, &p1), ORCH_OK);
        ck_assert_int_eq(step(r.ctx, NULL, 0, NULL, 0, s2, 7, &p2), ORCH_OK);
        done = (int)p1.finished | (int)p2.finished << 1;
    }
    float *g = grads_of(A, r.ctx, r.id, r.n);
    for (uint64_t i = 0; i < r.n; i++) want[i] *= 2.0f;
    check_equal("two streams", want_loss, want_loss, g, want, r.n, 1e-5);
    free(g);
    ck_assert_int_eq(A->ft_stream_close(r.ctx, s2), ORCH_OK);
    ck_assert_int_eq(A->ft_stream_close(r.ctx, s1), ORCH_OK);
    free(zero);
    free(want);
    run_close(&r);
}
END_TEST

/* seq_len 150, batch 2: more than one 64-query attention block per
 * sequence and more than one 256-row chunk per step; random adapters (B
 * not zero) on every target. */
START_TEST(test_stream_long) {
    orch_model_desc m = test_model_desc(61, 160, 2, 4, 32);
    if (_i == 1) { /* LLaMA with GQA: 4 query heads on 2 K/V heads */
        m.arch = ORCH_ARCH_LLAMA;
        m.kv_heads = 2;
        m.mlp_width = 48;
        m.rope_theta = 10000.0f;
    }
    orch_engine_ctx *ctx = make_ctx(&gpu, &m);
    orch_lora_desc d = test_lora_desc(3, 6.0f, ORCH_LORA_TARGET_ALL, 5);
    uint32_t id, nt;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    const uint64_t n = adapter_numel(A, ctx, id, &nt);
    uint64_t rng = 17;
    for (uint32_t i = 1; i < nt; i += 2) { /* B: uniform in [-0.05, 0.05) */
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        ck_assert_int_eq(A->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &ti),
                         ORCH_OK);
        float *b = malloc(ti.numel * sizeof(float));
        for (uint64_t e = 0; e < ti.numel; e++)
            b[e] = (float)((double)(test_lcg64(&rng) >> 11) / 9007199254740992.0 - 0.5) *
                   0.1f;
        ck_assert_int_eq(A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, i, b,
                                                 ti.numel * sizeof(float)),
                         ORCH_OK);
        free(b);
    }
    enum { B = 2, T = 150 };
    static int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((test_lcg64(&rng) >> 40) % 61);
        tgt[i] = i % 9 == 4 ? -1 : (int32_t)((test_lcg64(&rng) >> 40) % 61);
    }
    float want_loss;
    float *want = reference(A, ctx, id, n, tok, tgt, B, T, 1.0f, &want_loss);
    float *zero = calloc(n, sizeof(float));
    const uint32_t rows[2] = { 37, 1u << 30 };
    for (int c = 0; c < 2; c++) {
        orch_finetune_batch ft = test_ft_batch(id, tok, tgt, B, T, 1.0f);
        uint32_t s;
        ck_assert_int_eq(A->ft_stream_open(ctx, &ft, &s), ORCH_OK);
        const float loss =
            stream_run(A, ctx, id, s, rows[c], B * T, zero, n, 0, tok, tgt, T);
        float *g = grads_of(A, ctx, id, n);
        char tag[64];
        snprintf(tag, sizeof tag, "%s T=150 rows=%s", _i ? "llama" : "gpt2",
                 c ? "all" : "37");
        check_equal(tag, loss, want_loss, g, want, n, 1e-5);
        ck_assert_int_eq(A->ft_stream_close(ctx, s), ORCH_OK);
        ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
        free(g);
    }
    free(zero);
    free(want);
    A->context_destroy(ctx);
}
END_TEST

/* Closing before the last row leaves the adapter's gradients as they were. */
START_TEST(test_close_early) {
    run r;
    run_open(&r, _i, &gpu);
    const uint64_t BT = (uint64_t)r.B * r.T;
    float *before = malloc(r.n * sizeof(float));
    for (uint64_t i = 0; i < r.n; i++) before[i] = 0.001f * (float)(i % 13) - 0.004f;
    ck_assert_int_eq(A->adapter_grads_write(r.ctx, r.id, 0, r.n, before), ORCH_OK);
    const uint32_t upto[3] = { 0, (uint32_t)BT / 2, (uint32_t)(2 * BT - 1) };
    for (int c = 0; c < 3; c++) {
        orch_finetune_batch ft = test_ft_batch(r.id, r.tokens, r.targets, r.B, r.T, 1.0f);
        uint32_t s;
        ck_assert_int_eq(A->ft_stream_open(r.ctx, &ft, &s), ORCH_OK);
        if (upto[c]) {
            orch_ft_progress p = progress0();
            ck_assert_int_eq(step(r.ctx, NULL, 0, NULL, 0, s, upto[c], &p), ORCH_OK);
            ck_assert_uint_eq(p.rows_this_step, upto[c]);
            ck_assert_uint_eq(p.finished, 0);
        }
        ck_assert_int_eq(A->ft_stream_close(r.ctx, s), ORCH_OK);
        float *g = grads_of(A, r.ctx, r.id, r.n);
        ck_assert_msg(memcmp(g, before, r.n * sizeof(float)) == 0,
                      "closing after %u rows changed the adapter's gradients", upto[c]);
        free(g);
    }
    free(before);
    run_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* coserve_step                                                               */
/* ------------------------------------------------------------------------- */

/* Context r[0] runs coserve_step (an inference batch and a stream), r[1]
 * infer_forward and then adapter_forward_backward: a prefill of sequence 0
 * (T-1 tokens on the adapter, all logits) and of 5 tokens of sequence 1
 * (base, last logit), then decode steps of both; the stream takes 10 rows
 * per step until it finishes. A twin stream on r[0] (same micro-batch)
 * takes the same rows without the inference, to count the GEMMs saved. */
START_TEST(test_coserve_step) {
    const int k = _i;
    run r[2];
    for (int c = 0; c < 2; c++) {
        run_open(&r[c], k, &gpu);
        ck_assert_int_eq(A->kv_configure(r[c].ctx, 4, 16), ORCH_OK);
    }
    const uint32_t V = r[0].m.vocab_size, T = r[0].T, B = r[0].B, L = r[0].m.layers;
    const int32_t *tok = r[0].tokens, *tgt = r[0].targets;
    float want_loss;
    float *want =
        reference(A, r[1].ctx, r[1].id, r[1].n, tok, tgt, B, T, 1.0f, &want_loss);
    int32_t t0[4] = { 3, 0, 5, 7 }, t1[4] = { 1, 6, 2, 4 };
    float *lc = malloc((size_t)(T + 2) * V * sizeof(float));
    float *ls = malloc((size_t)(T + 2) * V * sizeof(float));
    orch_finetune_batch ft = test_ft_batch(r[0].id, tok, tgt, B, T, 1.0f);
    uint32_t s, twin;
    ck_assert_int_eq(A->ft_stream_open(r[0].ctx, &ft, &s), ORCH_OK);
    ck_assert_int_eq(A->ft_stream_open(r[0].ctx, &ft, &twin), ORCH_OK);
    const uint32_t rows = 10; /* forward 10, 10, 4 + backward 6, ... */
    orch_ft_progress p;
    memset(&p, 0, sizeof p);
    uint32_t pos0 = T - 1, pos1 = 5;
    int counted = 0;
    for (int st = 0; !p.finished; st++) {
        ck_assert_int_lt(st, 20);
        orch_seq_input q[2];
        uint64_t nrows;
        if (st == 0) {
            q[0] = test_seq_input(tok, T - 1, 0, t0, 3, ORCH_LOGITS_ALL);
            q[1] = test_seq_input(tok + T, 5, 0, t1, 2, ORCH_LOGITS_LAST);
            nrows = T;
        } else { /* decode: sequence 0 repeats its last token at growing positions */
            q[0] = test_seq_input(tok + T - 1, 1, pos0++, t0, 4, ORCH_LOGITS_LAST);
            q[1] = test_seq_input(tok + T + 5 + (st % 4), 1, pos1++, t1, 4,
                                  ORCH_LOGITS_LAST);
            nrows = 2;
        }
        q[0].adapter_id = r[0].id;
        const uint64_t fwd_before = p.forward_rows;
        const long long g0 = gemm_calls();
        p = progress0();
        int32_t rc = step(r[0].ctx, q, 2, lc, nrows * V, s, rows, &p);
        ck_assert_msg(rc == ORCH_OK, "coserve_step: %s", A->last_error(r[0].ctx));
        const long long g1 = gemm_calls();
        orch_ft_progress pt = progress0();
        ck_assert_int_eq(step(r[0].ctx, NULL, 0, NULL, 0, twin, rows, &pt), ORCH_OK);
        const long long g2 = gemm_calls();
        ck_assert_int_eq(test_infer(A, r[1].ctx, q, 2, ls, nrows * V), ORCH_OK);
        const long long g3 = gemm_calls();
        const double dl = test_max_diff(lc, ls, nrows * V);
        ck_assert_msg(dl <= 1e-5, "[%s] step %d: logits differ by %g", fixtures[k], st,
                      dl);
        if (g0 >= 0) { /* the emulator: products shared with the inference rows */
            const long long apart = (g2 - g1) + (g3 - g2), together = g1 - g0;
            const long long want_shared =
                p.forward_rows > fwd_before ? 4 * (long long)L + 1 : 0;
            ck_assert_msg(apart - together == want_shared,
                          "[%s] step %d: %lld GEMMs together, %lld apart (want %lld "
                          "fewer)",
                          fixtures[k], st, together, apart, want_shared);
            counted++;
        }
        if (!p.finished) {
            float *g = grads_of(A, r[0].ctx, r[0].id, r[0].n);
            ck_assert_msg(test_max_abs(g, r[0].n) == 0.0, "gradients before the end");
            free(g);
        }
    }
    /* both streams finished: the twin added the same gradients */
    float *g = grads_of(A, r[0].ctx, r[0].id, r[0].n);
    for (uint64_t i = 0; i < r[0].n; i++) g[i] *= 0.5f;
    char tag[160];
    snprintf(tag, sizeof tag, "[%s] coserve_step", fixtures[k]);
    check_equal(tag, p.loss, want_loss, g, want, r[0].n, 1e-5);
    free(g);
    if (counted) printf("test_coserve_step: GEMM counts checked on %d steps\n", counted);
    /* stream 0: the inference alone, ft_rows ignored; progress zeroed */
    orch_seq_input q = test_seq_input(tok, 4, 0, t0, 1, ORCH_LOGITS_ALL);
    orch_ft_progress z = progress0();
    ck_assert_int_eq(step(r[0].ctx, &q, 1, lc, 4 * V, 0, 9, &z), ORCH_OK);
    ck_assert_int_eq(test_infer(A, r[1].ctx, &q, 1, ls, 4 * V), ORCH_OK);
    ck_assert(test_max_diff(lc, ls, 4 * V) <= 1e-5);
    ck_assert_uint_eq(z.struct_size, sizeof z);
    ck_assert_uint_eq(z.rows_total, 0);
    ck_assert_uint_eq(z.rows_this_step, 0);
    ck_assert_uint_eq(z.finished, 0);
    ck_assert_int_eq(A->ft_stream_close(r[0].ctx, s), ORCH_OK);
    ck_assert_int_eq(A->ft_stream_close(r[0].ctx, twin), ORCH_OK);
    free(want);
    free(lc);
    free(ls);
    run_close(&r[0]);
    run_close(&r[1]);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* The CPU engine's streams                                                   */
/* ------------------------------------------------------------------------- */

START_TEST(test_cpu_streams) {
    const int k = _i;
    run r[2];
    run_open(&r[0], k, &gpu);
    run_open(&r[1], k, &cpu);
    ck_assert_uint_eq(r[0].n, r[1].n);
    const uint64_t BT = (uint64_t)r[0].B * r[0].T;
    float *zero = calloc(r[0].n, sizeof(float));
    float loss[2];
    float *g[2];
    const uint32_t rows[2] = { 3, 5 };
    for (int e = 0; e < 2; e++) {
        orch_finetune_batch ft =
            test_ft_batch(r[e].id, r[e].tokens, r[e].targets, r[e].B, r[e].T, 0.5f);
        uint32_t s;
        ck_assert_int_eq(r[e].api->ft_stream_open(r[e].ctx, &ft, &s), ORCH_OK);
        loss[e] = stream_run(r[e].api, r[e].ctx, r[e].id, s, rows[e], BT, zero, r[e].n, 0,
                             r[e].tokens, r[e].targets, r[e].T);
        g[e] = grads_of(r[e].api, r[e].ctx, r[e].id, r[e].n);
        ck_assert_int_eq(r[e].api->ft_stream_close(r[e].ctx, s), ORCH_OK);
    }
    char tag[160];
    snprintf(tag, sizeof tag, "[%s] cuda vs cpu streams", fixtures[k]);
    check_equal(tag, loss[0], loss[1], g[0], g[1], r[0].n, 1e-5);
    free(g[0]);
    free(g[1]);
    free(zero);
    run_close(&r[0]);
    run_close(&r[1]);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* State and argument errors                                                  */
/* ------------------------------------------------------------------------- */

START_TEST(test_state_and_errors) {
    run r;
    run_open(&r, _i, &gpu);
    /* 2^26: the CUDA engine's tokens per call */
    test_ft_stream_rules(A, r.ctx, r.id, r.n, r.tokens, r.targets, r.B, r.T, r.m.context,
                         1u << 26);
    run_close(&r);
}
END_TEST

/* The engine holds at most 1024 open streams per context: the next open is
 * ORCH_ERR_CAPACITY with a message and no id; one closed, one more opens. */
START_TEST(test_capacity) {
    run r;
    run_open(&r, 1, &gpu);
    orch_finetune_batch ft = test_ft_batch(r.id, r.tokens, r.targets, 1, 4, 1.0f);
    enum { MAX = 1024 };
    static uint32_t ids[MAX];
    for (int i = 0; i < MAX; i++)
        ck_assert_msg(A->ft_stream_open(r.ctx, &ft, &ids[i]) == ORCH_OK, "open %d: %s", i,
                      A->last_error(r.ctx));
    uint32_t out = 12345;
    test_ft_expect_err(A, r.ctx, A->ft_stream_open(r.ctx, &ft, &out), ORCH_ERR_CAPACITY,
                       "streams are open");
    ck_assert_uint_eq(out, 12345);
    ck_assert_int_eq(A->ft_stream_close(r.ctx, ids[7]), ORCH_OK);
    ck_assert_int_eq(A->ft_stream_open(r.ctx, &ft, &out), ORCH_OK);
    ck_assert_uint_gt(out, ids[MAX - 1]);
    run_close(&r); /* releases the open streams */
}
END_TEST

START_TEST(test_capabilities) {
    ck_assert(A->capabilities & ORCH_CAP_FT_STREAM);
    ck_assert(ORCH_API_HAS(A, ft_stream_open));
    ck_assert(ORCH_API_HAS(A, ft_stream_close));
    ck_assert(ORCH_API_HAS(A, coserve_step));
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_default_engine_path();
    TEST_LOAD_CUDA_AND_CPU("test_cuda_ft_stream", gpu, cpu);
    printf("test_cuda_ft_stream: %s (%s) against %s\n", gpu.path, gpu.probe_msg,
           cpu.path);
    Suite *s = suite_create("cuda_ft_stream");
    TCase *tc = tcase_create("stream");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_capabilities);
    tcase_add_loop_test(tc, test_stream_equals_fb, 0, 2 * N_FIXTURES);
    tcase_add_loop_test(tc, test_stream_long, 0, 2);
    tcase_add_loop_test(tc, test_close_early, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_coserve_step, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_cpu_streams, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_state_and_errors, 0, N_FIXTURES);
    tcase_add_test(tc, test_capacity);
    suite_add_tcase(s, tc);
    /* CK_NOFORK keeps the worst differences in this process */
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("test_cuda_ft_stream: worst relative difference: loss %.3g, gradients %.3g\n",
           worst_loss, worst_grad);
    engine_unload(&gpu);
    engine_unload(&cpu);
    return failed ? 1 : 0;
}
