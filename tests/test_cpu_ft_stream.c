/*
 * test_cpu_ft_stream.c - token-level fine-tuning streams of the CPU engine
 * (ABI 1.5, ORCH_CAP_FT_STREAM: ft_stream_open, ft_stream_close,
 * coserve_step), against adapter_forward_backward, the verified adapter
 * path of tests/test_cpu_lora.c (which checks it against PyTorch):
 *
 *   - on the LoRA fixtures (tests/fixtures/cpu_{gpt2,llama}_tiny_lora{,_sub}:
 *     GPT-2 with all targets and with attn.c_proj + mlp.c_fc; LLaMA with GQA
 *     (4 query heads, 2 key/value heads), an untied head, all targets and
 *     q/k/v + down_proj), batch 1 and 2 (seq_len 12), steps of 1, 3, 5 (no
 *     divisor), T and B*T rows: the loss and the adapter gradients after the
 *     stream equal adapter_forward_backward's within 1e-5 relative (loss:
 *     relative to the loss; gradients: max difference against the largest
 *     reference entry; the sums are split differently, nothing else differs:
 *     measured on these shapes, the losses had the same bits and the
 *     gradients differed by at most 1.1e-6 relative); the adapter's
 *     gradients stay exactly as they were until the last step (read after
 *     every earlier step); progress counts forward and backward rows; other
 *     calls (adapter_eval_loss, infer_forward) run between the steps;
 *   - a model with seq_len 150 (more than one 128-query attention block)
 *     and random adapters, GPT-2 and LLaMA with GQA, steps of 37 rows;
 *   - closing a stream early (after forward rows, after backward rows, at
 *     once) leaves the adapter's gradients with their bits;
 *   - coserve_step with an inference batch (prefill, then decode steps) and
 *     a stream: the logits equal infer_forward's (within 1e-5; measured:
 *     the same bits) and the
 *     stream's loss and gradients equal adapter_forward_backward's as
 *     above; the base products of the steps with forward rows were shared
 *     with the inference pass (the context's pairing counter, read through
 *     engines/cpu/cpu_internal.h: 4 per layer + the head per such step),
 *     none for backward-only steps;
 *   - ORCH_ERR_STATE for adapter_optimizer_step, adapter_tensor_write of
 *     PARAM and adapter_destroy of the stream's adapter while the stream is
 *     open (finished or not), changing nothing; other adapters and other
 *     kinds are unaffected; OK again after ft_stream_close; unknown and
 *     closed stream ids, a short progress struct_size, an unknown adapter,
 *     bad micro-batches (each ORCH_ERR_INVALID_ARGUMENT or CAPACITY with a
 *     message, nothing changed); a finished stream does no work (finished
 *     1, rows_this_step 0); stream 0 runs the inference only; a micro-batch
 *     whose targets are all -1 finishes with loss 0 and no gradient;
 *   - precision=bf16 (where available): stream against
 *     adapter_forward_backward under the same options within 1e-4 relative
 *     (the bf16 base products of a chunk round like the whole batch's;
 *     measured: 2.7e-7).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "engines/cpu/cpu_internal.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/store/safetensors.h"
#include "tests/test_fixture.h"
#include "tests/test_ft_stream.h"
#include "tests/test_lsan_onednn.h"
#include "tests/test_util.h"

TEST_ENGINE_FIXTURE("cpu")

static const char *const fixtures[4] = {
    "tests/fixtures/cpu_gpt2_tiny_lora.safetensors",
    "tests/fixtures/cpu_gpt2_tiny_lora_sub.safetensors",
    "tests/fixtures/cpu_llama_tiny_lora.safetensors",
    "tests/fixtures/cpu_llama_tiny_lora_sub.safetensors",
};
#define N_FIXTURES 4

/* ------------------------------------------------------------------------- */
/* Contexts, adapters, streams                                                */
/* ------------------------------------------------------------------------- */

static orch_engine_ctx *make_ctx(const orch_model_desc *m, const char *options) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(&H, m, 0, 1, options, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", options ? options : "", err);
    return ctx;
}

static uint64_t adapter_numel(orch_engine_ctx *ctx, uint32_t id, uint32_t *n_tensors) {
    uint32_t n = 0;
    ck_assert_int_eq(A->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &n), ORCH_OK);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        ck_assert_int_eq(A->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &ti),
                         ORCH_OK);
        total += ti.numel;
    }
    if (n_tensors) *n_tensors = n;
    return total;
}

static float *grads_of(orch_engine_ctx *ctx, uint32_t id, uint64_t n) {
    return test_ft_grads(A, ctx, id, n);
}

/* A context with the fixture's base and its adapter ("lora." tensors). */
typedef struct run {
    safetensors_file *f;
    orch_model_desc m;
    orch_engine_ctx *ctx;
    uint32_t id, B, T;
    uint64_t n;
    const int32_t *tokens, *targets;
} run;

static void run_open(run *r, int k, const char *options) {
    r->f = test_fixture_open(fixtures[k]);
    r->m = test_fixture_model(r->f);
    r->ctx = make_ctx(&r->m, options);
    test_load_fixture_params(A, r->ctx, r->f);
    r->B = (uint32_t)test_fixture_meta(r->f, "batch");
    r->T = (uint32_t)test_fixture_meta(r->f, "seq_len");
    size_t n;
    r->tokens = test_fixture_get(r->f, "tokens", SAFETENSORS_I32, &n);
    r->targets = test_fixture_get(r->f, "targets", SAFETENSORS_I32, &n);
    orch_lora_desc d =
        test_lora_desc((uint32_t)test_fixture_meta(r->f, "lora_rank"),
                       (float)test_fixture_meta(r->f, "lora_alpha"),
                       (uint32_t)test_fixture_meta(r->f, "lora_targets"), 99);
    ck_assert_int_eq(A->adapter_create(r->ctx, &d, &r->id), ORCH_OK);
    uint32_t nt;
    r->n = adapter_numel(r->ctx, r->id, &nt);
    for (uint32_t i = 0; i < nt; i++) {
        orch_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        ck_assert_int_eq(A->adapter_tensor_info(r->ctx, r->id, ORCH_TENSOR_PARAM, i, &ti),
                         ORCH_OK);
        char key[160];
        snprintf(key, sizeof key, "lora.%s", ti.name);
        size_t ne;
        const float *src = test_fixture_f32(r->f, key, &ne);
        ck_assert_uint_eq(ne, ti.numel);
        ck_assert_int_eq(A->adapter_tensor_write(r->ctx, r->id, ORCH_TENSOR_PARAM, i, src,
                                                 ne * sizeof(float)),
                         ORCH_OK);
    }
}

static void run_close(run *r) {
    A->context_destroy(r->ctx);
    safetensors_close(r->f);
}

static orch_ft_progress progress0(void) { return test_ft_progress0(); }

static int32_t step(orch_engine_ctx *ctx, const orch_seq_input *seqs, uint32_t n,
                    float *logits, uint64_t cap, uint32_t stream, uint32_t rows,
                    orch_ft_progress *p) {
    return test_ft_step(A, ctx, seqs, n, logits, cap, stream, rows, p);
}

static uint64_t paired(orch_engine_ctx *ctx) { return ctx->coserve_paired; }

/* The reference: adapter_forward_backward's loss and gradients (from zero). */
static float *reference(orch_engine_ctx *ctx, uint32_t id, uint64_t n, const int32_t *tok,
                        const int32_t *tgt, uint32_t B, uint32_t T, float scale,
                        float *loss) {
    ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
    ck_assert_int_eq(A->adapter_forward_backward(ctx, id, tok, tgt, B, T, scale, loss),
                     ORCH_OK);
    float *g = grads_of(ctx, id, n);
    ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
    return g;
}

static void check_equal(const char *tag, float loss, float want_loss, const float *g,
                        const float *want, uint64_t n, double tol) {
    ck_assert_msg(fabs((double)loss - want_loss) <= tol * fabs((double)want_loss) + 1e-7,
                  "%s: loss %.8f vs %.8f", tag, loss, want_loss);
    const double d = test_max_diff(g, want, n), m = test_max_abs(want, n);
    ck_assert_msg(m > 0.0, "%s: the reference has no gradient", tag);
    ck_assert_msg(d <= tol * m, "%s: gradients differ by %g (max %g, %.2g relative)", tag,
                  d, m, d / m);
}

/* Run stream `s` to its end in steps of `rows` (no inference), checking the
 * adapter's gradients equal `before` after every step but the last and
 * running other calls between steps (other_calls). Returns the loss. */
static float stream_run(orch_engine_ctx *ctx, uint32_t id, uint32_t s, uint32_t rows,
                        uint64_t BT, const float *before, uint64_t n, int other_calls,
                        const int32_t *tok, const int32_t *tgt, uint32_t T) {
    uint64_t fwd = 0, bwd = 0;
    orch_ft_progress p = progress0();
    for (int guard = 0; guard < 100000; guard++) {
        p = progress0();
        int32_t st = step(ctx, NULL, 0, NULL, 0, s, rows, &p);
        ck_assert_msg(st == ORCH_OK, "coserve_step: %s", A->last_error(ctx));
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
        ck_assert_uint_eq(p.finished, 0);
        float *g = grads_of(ctx, id, n);
        ck_assert_msg(memcmp(g, before, n * sizeof(float)) == 0,
                      "the adapter's gradients changed before the last row (%llu + %llu)",
                      (unsigned long long)fwd, (unsigned long long)bwd);
        free(g);
        if (other_calls) { /* the stream keeps its own activations */
            float l;
            ck_assert_int_eq(A->adapter_eval_loss(ctx, id, tok, tgt, 1, T, &l), ORCH_OK);
        }
    }
    ck_assert_uint_eq(p.finished, 1);
    ck_assert_uint_eq(fwd, BT);
    ck_assert_uint_eq(bwd, BT);
    /* a finished stream does no more work */
    orch_ft_progress q = progress0();
    ck_assert_int_eq(step(ctx, NULL, 0, NULL, 0, s, 7, &q), ORCH_OK);
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
    run_open(&r, k, "threads=2");
    const uint32_t B = _i % 2 ? r.B : 1, T = r.T;
    float want_loss;
    float *want =
        reference(r.ctx, r.id, r.n, r.tokens, r.targets, B, T, 0.75f, &want_loss);
    float *zero = calloc(r.n, sizeof(float));
    for (int c = 0; c < N_CHUNKS; c++) {
        const uint32_t rows = chunk_sizes[c] == 0 ? T : chunk_sizes[c];
        orch_finetune_batch ft = test_ft_batch(r.id, r.tokens, r.targets, B, T, 0.75f);
        uint32_t s = 0;
        ck_assert_int_eq(A->ft_stream_open(r.ctx, &ft, &s), ORCH_OK);
        ck_assert_uint_ge(s, 1);
        const float loss = stream_run(r.ctx, r.id, s, rows, (uint64_t)B * T, zero, r.n,
                                      c % 2, r.tokens, r.targets, T);
        float *g = grads_of(r.ctx, r.id, r.n);
        char tag[160];
        snprintf(tag, sizeof tag, "[%s B=%u rows=%u]", fixtures[k], B, rows);
        check_equal(tag, loss, want_loss, g, want, r.n, 1e-5);
        free(g);
        ck_assert_int_eq(A->ft_stream_close(r.ctx, s), ORCH_OK);
        ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
    }
    /* two streams at once, interleaved, on the same adapter: each adds its
     * own gradients when it finishes */
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
    float *g = grads_of(r.ctx, r.id, r.n);
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

/* seq_len 150: the attention of a chunk spans more than one block of 128
 * queries; random adapters (B not zero) on every target. */
START_TEST(test_stream_long) {
    orch_model_desc m = test_model_desc(61, 160, 2, 4, 32);
    if (_i == 1) {
        m.arch = ORCH_ARCH_LLAMA;
        m.kv_heads = 2;
        m.mlp_width = 48;
        m.rope_theta = 10000.0f;
    }
    orch_engine_ctx *ctx = make_ctx(&m, "threads=2");
    orch_lora_desc d = test_lora_desc(3, 6.0f, ORCH_LORA_TARGET_ALL, 5);
    uint32_t id, nt;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    const uint64_t n = adapter_numel(ctx, id, &nt);
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
    float *want = reference(ctx, id, n, tok, tgt, B, T, 1.0f, &want_loss);
    float *zero = calloc(n, sizeof(float));
    orch_finetune_batch ft = test_ft_batch(id, tok, tgt, B, T, 1.0f);
    uint32_t s;
    ck_assert_int_eq(A->ft_stream_open(ctx, &ft, &s), ORCH_OK);
    const float loss = stream_run(ctx, id, s, 37, B * T, zero, n, 0, tok, tgt, T);
    float *g = grads_of(ctx, id, n);
    check_equal(_i ? "llama T=150" : "gpt2 T=150", loss, want_loss, g, want, n, 1e-5);
    ck_assert_int_eq(A->ft_stream_close(ctx, s), ORCH_OK);
    free(g);
    free(zero);
    free(want);
    A->context_destroy(ctx);
}
END_TEST

/* Closing before the last row leaves the adapter's gradients as they were. */
START_TEST(test_close_early) {
    run r;
    run_open(&r, _i, "threads=1");
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
        float *g = grads_of(r.ctx, r.id, r.n);
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

/* One context runs coserve_step (an inference batch and a stream), another
 * runs infer_forward and then adapter_forward_backward: a prefill of
 * sequence 0 (T-1 tokens on the adapter, all logits) and of 5 tokens of
 * sequence 1 (base, last logit), then decode steps of both; the stream
 * takes `rows` rows per step until it finishes. */
START_TEST(test_coserve_step) {
    static const char *const opts[2] = { "threads=2", "skinny=0" };
    const int k = _i / 2;
    const char *opt = opts[_i % 2];
    run r[2];
    for (int c = 0; c < 2; c++) {
        run_open(&r[c], k, opt);
        ck_assert_int_eq(A->kv_configure(r[c].ctx, 4, 16), ORCH_OK);
    }
    const uint32_t V = r[0].m.vocab_size, T = r[0].T, B = r[0].B, L = r[0].m.layers;
    const int32_t *tok = r[0].tokens, *tgt = r[0].targets;
    float want_loss;
    float *want = reference(r[1].ctx, r[1].id, r[1].n, tok, tgt, B, T, 1.0f, &want_loss);
    int32_t t0[4] = { 3, 0, 5, 7 }, t1[4] = { 1, 6, 2, 4 };
    float *lc = malloc((size_t)(T + 2) * V * sizeof(float));
    float *ls = malloc((size_t)(T + 2) * V * sizeof(float));
    orch_finetune_batch ft = test_ft_batch(r[0].id, tok, tgt, B, T, 1.0f);
    uint32_t s;
    ck_assert_int_eq(A->ft_stream_open(r[0].ctx, &ft, &s), ORCH_OK);
    const uint32_t rows = 10; /* steps: forward 10, 10, 4 + backward 6, ... */
    orch_ft_progress p;
    memset(&p, 0, sizeof p);
    uint32_t pos0 = T - 1, pos1 = 5;
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
        const uint64_t before = paired(r[0].ctx);
        const uint64_t fwd_before = p.forward_rows;
        p = progress0();
        int32_t rc = step(r[0].ctx, q, 2, lc, nrows * V, s, rows, &p);
        ck_assert_msg(rc == ORCH_OK, "coserve_step: %s", A->last_error(r[0].ctx));
        ck_assert_int_eq(test_infer(A, r[1].ctx, q, 2, ls, nrows * V), ORCH_OK);
        const double dl = test_max_diff(lc, ls, nrows * V);
        ck_assert_msg(dl <= 1e-5, "[%s %s] step %d: logits differ by %g", fixtures[k],
                      opt, st, dl);
        const uint64_t shared = paired(r[0].ctx) - before;
        if (p.forward_rows > fwd_before)
            ck_assert_msg(shared == 4 * (uint64_t)L + 1,
                          "[%s %s] step %d: %llu products shared, want %u", fixtures[k],
                          opt, st, (unsigned long long)shared, 4 * L + 1);
        else
            ck_assert_msg(shared == 0, "step %d: a backward-only step paired %llu", st,
                          (unsigned long long)shared);
        if (!p.finished) {
            float *g = grads_of(r[0].ctx, r[0].id, r[0].n);
            ck_assert_msg(test_max_abs(g, r[0].n) == 0.0, "gradients before the end");
            free(g);
        }
    }
    float *g = grads_of(r[0].ctx, r[0].id, r[0].n);
    char tag[160];
    snprintf(tag, sizeof tag, "[%s %s] coserve_step", fixtures[k], opt);
    check_equal(tag, p.loss, want_loss, g, want, r[0].n, 1e-5);
    free(g);
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
    free(want);
    free(lc);
    free(ls);
    run_close(&r[0]);
    run_close(&r[1]);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* State and argument errors                                                  */
/* ------------------------------------------------------------------------- */

START_TEST(test_state_and_errors) {
    run r;
    run_open(&r, _i, "threads=1");
    /* 2^24: the cpu engine's training tokens per call */
    test_ft_stream_rules(A, r.ctx, r.id, r.n, r.tokens, r.targets, r.B, r.T, r.m.context,
                         1u << 24);
    run_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* precision=bf16                                                             */
/* ------------------------------------------------------------------------- */

START_TEST(test_bf16) {
    safetensors_file *f = test_fixture_open(fixtures[_i]);
    orch_model_desc m = test_fixture_model(f);
    orch_engine_ctx *probe = NULL;
    char err[1024] = "";
    const int ok = engine_create_context(&H, &m, 0, 1, "precision=bf16", &probe, err,
                                         sizeof err) == 0;
    safetensors_close(f);
    if (!ok) { /* refused on a CPU without bf16 or without oneDNN: one line naming it */
        ck_assert_msg(strstr(err, "precision=bf16") != NULL, "refusal: %s", err);
        fprintf(stderr, "test_bf16: skipped (%s)\n", err);
        return;
    }
    A->context_destroy(probe);
    run r;
    run_open(&r, _i, "precision=bf16");
    const uint32_t B = r.B, T = r.T;
    float want_loss;
    float *want =
        reference(r.ctx, r.id, r.n, r.tokens, r.targets, B, T, 1.0f, &want_loss);
    float *zero = calloc(r.n, sizeof(float));
    orch_finetune_batch ft = test_ft_batch(r.id, r.tokens, r.targets, B, T, 1.0f);
    uint32_t s;
    ck_assert_int_eq(A->ft_stream_open(r.ctx, &ft, &s), ORCH_OK);
    const float loss = stream_run(r.ctx, r.id, s, 5, (uint64_t)B * T, zero, r.n, 0,
                                  r.tokens, r.targets, T);
    float *g = grads_of(r.ctx, r.id, r.n);
    char tag[160];
    snprintf(tag, sizeof tag, "[%s bf16]", fixtures[_i]);
    check_equal(tag, loss, want_loss, g, want, r.n, 1e-4);
    ck_assert_int_eq(A->ft_stream_close(r.ctx, s), ORCH_OK);
    free(g);
    free(zero);
    free(want);
    run_close(&r);
}
END_TEST

START_TEST(test_capabilities) {
    ck_assert(A->capabilities & ORCH_CAP_FT_STREAM);
    ck_assert(ORCH_API_HAS(A, ft_stream_open));
    ck_assert(ORCH_API_HAS(A, ft_stream_close));
    ck_assert(ORCH_API_HAS(A, coserve_step));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_ft_stream");
    TCase *tc = tcase_create("stream");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_capabilities);
    tcase_add_loop_test(tc, test_stream_equals_fb, 0, 2 * N_FIXTURES);
    tcase_add_loop_test(tc, test_stream_long, 0, 2);
    tcase_add_loop_test(tc, test_close_early, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_coserve_step, 0, 2 * N_FIXTURES);
    tcase_add_loop_test(tc, test_state_and_errors, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_bf16, 0, N_FIXTURES);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
