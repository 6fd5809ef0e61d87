/*
 * test_cpu_llama.c - ORCH_ARCH_LLAMA on the CPU engine (libengine_cpu.so):
 *
 *   - against PyTorch: tests/fixtures/cpu_llama_tiny_kv{1,2,4}.safetensors
 *     (tools/torch_reference.py --arch llama, float64): kv_heads 1 (llama3
 *     RoPE scaling), 2 (untied head, linear scaling), 4 (= heads, tied, no
 *     scaling). Logits and loss within 1e-4 absolute, every gradient tensor
 *     within 1e-3 of its largest reference entry, the losses of 10 AdamW
 *     steps (the fixture's hyper-parameters, clipping and decay) within 1e-4
 *     and their gradient norms within 1e-4 relative; for several kernel
 *     sets and thread counts. The tolerances are those of the GPT-2 suite
 *     (tests/test_cpu_engine.c): fp32 against float64 on values of order 1
 *     and sums of at most a few hundred terms gives errors near 1e-6, so
 *     1e-4 leaves a wide margin while any modelling error (a wrong RoPE
 *     pairing or frequency, a wrong KV head, a missing RMSNorm term) moves
 *     the logits by 1e-2 or more;
 *   - KV-cached decoding: prefill chunks (both attention paths) and one-token
 *     decode steps of two sequences in one batch through shuffled block
 *     tables give the fixture's full-forward logits (within 1e-4), and so
 *     does a prefix copied with kv_copy_blocks (same bits as the original);
 *   - the tensor table (names, shapes, order, NO_DECAY flags), the init rule,
 *     kv_block_bytes by kv_heads;
 *   - bad descriptions give the engines/common errors;
 *   - weights=int8: tensor_read returns the matrices rounded through the
 *     int8 grid (norms untouched), training is refused, eval_loss equals the
 *     fp32 engine's on those weights, and decoding on the int8 kernels is
 *     within 5% of the largest logit of a full fp32 forward on them (the
 *     bound of tests/test_cpu_int8.c: the activations are rounded to int8);
 *   - same inputs and thread count give the same bits (ORCH_CAP_DETERMINISTIC);
 *   - precision=bf16 (where the CPU and oneDNN allow it) stays within 2e-2 of
 *     the fixture's 10 step losses, the bound of tests/test_cpu_bf16.c.
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

#include "tests/test_lsan_onednn.h"

TEST_ENGINE_FIXTURE("cpu")

static const char *const fixtures[3] = {
    "tests/fixtures/cpu_llama_tiny_kv1.safetensors",
    "tests/fixtures/cpu_llama_tiny_kv2.safetensors",
    "tests/fixtures/cpu_llama_tiny_kv4.safetensors",
};

/* Option sets the fixture tests run under. */
static const char *const variants[] = {
    "", "threads=1", "threads=3", "isa=avx2", "isa=generic", "skinny=0",
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

/* ------------------------------------------------------------------------- */
/* The fixture                                                                */
/* ------------------------------------------------------------------------- */

static safetensors_file *fixture_open(int k) { return test_fixture_open(fixtures[k]); }

static orch_engine_ctx *make_ctx(const orch_model_desc *m, uint32_t threads,
                                 const char *options) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(&H, m, threads, 1, options, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", options ? options : "", err);
    return ctx;
}

typedef struct torch_run {
    safetensors_file *f;
    orch_model_desc m;
    orch_engine_ctx *ctx;
    uint32_t B, T;
    const int32_t *tokens, *targets;
} torch_run;

static void torch_open(torch_run *r, int k, const char *options) {
    r->f = fixture_open(k);
    r->m = test_fixture_llama_model(r->f);
    r->ctx = make_ctx(&r->m, 0, options);
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

static orch_adamw_params adam_of(const safetensors_file *f, uint64_t step) {
    orch_adamw_params p = test_adamw(step, (float)test_fixture_meta(f, "lr"),
                                     (float)test_fixture_meta(f, "weight_decay"),
                                     (float)test_fixture_meta(f, "grad_clip"));
    p.beta1 = (float)test_fixture_meta(f, "beta1");
    p.beta2 = (float)test_fixture_meta(f, "beta2");
    p.eps = (float)test_fixture_meta(f, "eps");
    return p;
}

/* ------------------------------------------------------------------------- */
/* Against PyTorch                                                            */
/* ------------------------------------------------------------------------- */

START_TEST(test_torch_forward) {
    const int k = _i / N_VARIANTS;
    const char *opt = variants[_i % N_VARIANTS];
    torch_run r;
    torch_open(&r, k, opt);
    size_t nl, nt;
    const float *ref_logits = test_fixture_f32(r.f, "logits", &nl);
    const float ref_loss = test_fixture_f32(r.f, "loss", &nt)[0];
    ck_assert_uint_eq(nl, (size_t)r.B * r.T * r.m.vocab_size);
    float loss = -1.0f;
    ck_assert_int_eq(A->eval_loss(r.ctx, r.tokens, r.targets, r.B, r.T, &loss), ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f, "[kv%d %s] eval loss %.7f vs %.7f", k,
                  opt, loss, ref_loss);
    /* Full forward of both sequences in one batch, blocks of 5, tables
     * interleaved and out of order. */
    ck_assert_int_eq(A->kv_configure(r.ctx, 5, 8), ORCH_OK);
    int32_t t0[3] = { 6, 0, 3 }, t1[3] = { 1, 7, 4 };
    orch_seq_input s[2] = { test_seq_input(r.tokens, r.T, 0, t0, 3, ORCH_LOGITS_ALL),
                            test_seq_input(r.tokens + r.T, r.T, 0, t1, 3,
                                           ORCH_LOGITS_ALL) };
    float *logits = malloc(nl * sizeof(float));
    ck_assert_int_eq(test_infer(A, r.ctx, s, 2, logits, nl), ORCH_OK);
    double worst = test_max_diff(logits, ref_logits, nl);
    ck_assert_msg(worst <= 1e-4, "[kv%d %s] logits differ from torch by %g", k, opt,
                  worst);
    /* A wrong model is far away: the logits are not all tiny. */
    ck_assert_msg(test_max_abs(ref_logits, nl) > 0.05, "fixture logits too small");
    free(logits);
    torch_close(&r);
}
END_TEST

START_TEST(test_torch_gradients) {
    const int k = _i / N_VARIANTS;
    const char *opt = variants[_i % N_VARIANTS];
    torch_run r;
    torch_open(&r, k, opt);
    size_t nt;
    const float ref_loss = test_fixture_f32(r.f, "loss", &nt)[0];
    float loss = -1.0f;
    ck_assert_int_eq(A->grads_zero(r.ctx), ORCH_OK);
    ck_assert_int_eq(
        A->forward_backward(r.ctx, r.tokens, r.targets, r.B, r.T, 1.0f, &loss), ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f, "[kv%d %s] loss %.7f vs %.7f", k, opt,
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
        const double diff = test_max_diff(g + ti.offset, ref, numel);
        const double scale = test_max_abs(ref, numel);
        ck_assert_msg(scale > 0.0, "%s: reference gradient is zero", ti.name);
        ck_assert_msg(diff <= 1e-3 * scale,
                      "[kv%d %s] gradient %s: max diff %g, max |ref| %g (rel %g)", k, opt,
                      ti.name, diff, scale, diff / scale);
    }
    free(g);
    torch_close(&r);
}
END_TEST

START_TEST(test_torch_adamw_steps) {
    const int k = _i / N_VARIANTS;
    const char *opt = variants[_i % N_VARIANTS];
    torch_run r;
    torch_open(&r, k, opt);
    const int steps = (int)test_fixture_meta(r.f, "steps");
    size_t nsteps, nn;
    const float *ref_losses = test_fixture_f32(r.f, "train_losses", &nsteps);
    const float *ref_norms = test_fixture_f32(r.f, "grad_norms", &nn);
    ck_assert_int_eq((int)nsteps, steps);
    ck_assert_int_eq((int)nn, steps);
    int clipped = 0;
    for (int s = 0; s < steps; s++) {
        float loss = -1.0f, norm = -1.0f;
        ck_assert_int_eq(A->grads_zero(r.ctx), ORCH_OK);
        ck_assert_int_eq(
            A->forward_backward(r.ctx, r.tokens, r.targets, r.B, r.T, 1.0f, &loss),
            ORCH_OK);
        ck_assert_msg(fabsf(loss - ref_losses[s]) <= 1e-4f,
                      "[kv%d %s] step %d: loss %.7f vs torch %.7f", k, opt, s + 1, loss,
                      ref_losses[s]);
        orch_adamw_params p = adam_of(r.f, (uint64_t)s + 1);
        ck_assert_int_eq(A->optimizer_step(r.ctx, &p, &norm), ORCH_OK);
        ck_assert_msg(fabsf(norm - ref_norms[s]) <= 1e-4f * ref_norms[s] + 1e-5f,
                      "[kv%d %s] step %d: grad norm %.7f vs torch %.7f", k, opt, s + 1,
                      norm, ref_norms[s]);
        clipped += norm > p.grad_clip;
    }
    ck_assert_msg(clipped > 0 && clipped < steps, "fixture should clip some steps");
    ck_assert_msg(ref_losses[steps - 1] < ref_losses[0] - 0.5f, "fixture should learn");
    torch_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* KV-cached decoding                                                         */
/* ------------------------------------------------------------------------- */

/* Both sequences of the fixture decoded through blocks of 4 positions with
 * shuffled tables: sequence 0 prefills 9 tokens (the sgemm attention path),
 * sequence 1 prefills 3 then 2 (the vector path; the second chunk asks for
 * no logits), then both decode one token per forward in one batch. Every
 * logits row returned equals the fixture's full-forward row. */
START_TEST(test_kv_decode) {
    const int k = _i / 2;
    const char *opt = _i % 2 ? "skinny=0" : "";
    torch_run r;
    torch_open(&r, k, opt);
    size_t nl;
    const float *ref = test_fixture_f32(r.f, "logits", &nl);
    const uint32_t V = r.m.vocab_size, T = r.T;
    ck_assert_int_eq(A->kv_configure(r.ctx, 4, 10), ORCH_OK);
    int32_t tab[2][3] = { { 7, 2, 5 }, { 0, 9, 3 } };
    float *out = malloc((size_t)2 * T * V * sizeof(float));
    double worst = 0.0;
    int rows_checked = 0;
    uint32_t done[2] = { 0, 0 };
    /* Round 0: seq 0 prefill 9 (ALL), seq 1 prefill 3 (LAST). */
    orch_seq_input s[2] = {
        test_seq_input(r.tokens, 9, 0, tab[0], 3, ORCH_LOGITS_ALL),
        test_seq_input(r.tokens + T, 3, 0, tab[1], 3, ORCH_LOGITS_LAST),
    };
    ck_assert_int_eq(test_infer(A, r.ctx, s, 2, out, (uint64_t)2 * T * V), ORCH_OK);
    for (uint32_t i = 0; i < 9; i++) {
        double d = test_max_diff(out + (size_t)i * V, ref + (size_t)i * V, V);
        worst = d > worst ? d : worst;
        rows_checked++;
    }
    worst = fmax(worst, test_max_diff(out + (size_t)9 * V, ref + (size_t)(T + 2) * V, V));
    rows_checked++;
    done[0] = 9;
    done[1] = 3;
    /* Round 1: seq 1 alone, 2 tokens, no logits. */
    s[0] = test_seq_input(r.tokens + T + 3, 2, 3, tab[1], 3, ORCH_LOGITS_NONE);
    ck_assert_int_eq(test_infer(A, r.ctx, s, 1, out, 0), ORCH_OK);
    done[1] = 5;
    /* Decode rounds: one token each, both sequences in one batch. */
    while (done[0] < T || done[1] < T) {
        uint32_t n = 0, which[2];
        for (uint32_t q = 0; q < 2; q++) {
            if (done[q] >= T) continue;
            s[n] = test_seq_input(r.tokens + q * T + done[q], 1, done[q], tab[q], 3,
                                  ORCH_LOGITS_LAST);
            which[n++] = q;
        }
        ck_assert_int_eq(test_infer(A, r.ctx, s, n, out, (uint64_t)n * V), ORCH_OK);
        for (uint32_t j = 0; j < n; j++) {
            const uint32_t q = which[j];
            const float *want = ref + ((size_t)q * T + done[q]) * V;
            worst = fmax(worst, test_max_diff(out + (size_t)j * V, want, V));
            rows_checked++;
            done[q]++;
        }
    }
    ck_assert_int_eq(rows_checked, 9 + 1 + 3 + 7);
    ck_assert_msg(worst <= 1e-4, "[kv%d %s] cached decoding differs by %g", k, opt,
                  worst);
    free(out);
    torch_close(&r);
}
END_TEST

/* kv_copy_blocks on the llama pool (K/V of kv_heads heads per position): a
 * prefix copied to other blocks decodes the next token to the same bits as
 * the original blocks, and both equal the full forward. */
START_TEST(test_kv_copy) {
    torch_run r;
    torch_open(&r, _i, NULL);
    size_t nl;
    const float *ref = test_fixture_f32(r.f, "logits", &nl);
    const uint32_t V = r.m.vocab_size;
    ck_assert_int_eq(A->kv_configure(r.ctx, 4, 8), ORCH_OK);
    int32_t orig[3] = { 0, 1, 2 }, copy[3] = { 5, 6, 7 };
    orch_seq_input s = test_seq_input(r.tokens, 8, 0, orig, 2, ORCH_LOGITS_NONE);
    ck_assert_int_eq(test_infer(A, r.ctx, &s, 1, NULL, 0), ORCH_OK);
    ck_assert_int_eq(A->kv_copy_blocks(r.ctx, orig, copy, 2), ORCH_OK);
    float a[128], b[128];
    ck_assert(V <= 128);
    s = test_seq_input(r.tokens + 8, 1, 8, copy, 3, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(A, r.ctx, &s, 1, b, V), ORCH_OK);
    s = test_seq_input(r.tokens + 8, 1, 8, orig, 3, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(A, r.ctx, &s, 1, a, V), ORCH_OK);
    ck_assert(memcmp(a, b, V * sizeof(float)) == 0);
    ck_assert_msg(test_max_diff(a, ref + (size_t)8 * V, V) <= 1e-4, "copy decode off");
    torch_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Table, init, KV sizes                                                      */
/* ------------------------------------------------------------------------- */

START_TEST(test_table_and_init) {
    safetensors_file *f = fixture_open(_i);
    orch_model_desc m = test_fixture_llama_model(f);
    safetensors_close(f);
    orch_engine_ctx *ctx = make_ctx(&m, 2, NULL);
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    const uint64_t C = m.width, M = m.mlp_width, V = m.vocab_size;
    const uint64_t KV = (uint64_t)m.kv_heads * (m.width / m.heads);
    const int untied = (m.flags & ORCH_MODEL_FLAG_UNTIED_HEAD) != 0;
    ck_assert_uint_eq(t.n, 2 + 9 * m.layers + (uint32_t)untied);
    static const char *const sfx[9] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    };
    const uint64_t shp[9][2] = { { C, 0 }, { C, C }, { KV, C }, { KV, C }, { C, C },
                                 { C, 0 }, { M, C }, { M, C },  { C, M } };
    uint64_t off = 0;
    float *all = test_read_kind(A, ctx, ORCH_TENSOR_PARAM, &t);
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info *ti = &t.info[i];
        char want[96];
        uint64_t d0, d1;
        if (i == 0) {
            snprintf(want, sizeof want, "model.embed_tokens.weight");
            d0 = V, d1 = C;
        } else if (i < 1 + 9 * m.layers) {
            const uint32_t l = (i - 1) / 9, q = (i - 1) % 9;
            snprintf(want, sizeof want, "model.layers.%u.%s", l, sfx[q]);
            d0 = shp[q][0], d1 = shp[q][1];
        } else if (i == 1 + 9 * m.layers) {
            snprintf(want, sizeof want, "model.norm.weight");
            d0 = C, d1 = 0;
        } else {
            snprintf(want, sizeof want, "lm_head.weight");
            d0 = V, d1 = C;
        }
        ck_assert_str_eq(ti->name, want);
        ck_assert_uint_eq(ti->ndim, d1 ? 2 : 1);
        ck_assert_uint_eq(ti->shape[0], d0);
        if (d1) ck_assert_uint_eq(ti->shape[1], d1);
        ck_assert_uint_eq(ti->numel, d0 * (d1 ? d1 : 1));
        ck_assert_uint_eq(ti->offset, off);
        ck_assert_uint_eq(ti->flags & ORCH_TENSOR_FLAG_NO_DECAY,
                          d1 ? 0u : ORCH_TENSOR_FLAG_NO_DECAY);
        off += ti->numel;
        /* Init: norms 1; matrices N(0, 0.02), o_proj/down_proj divided by
         * sqrt(2 layers): the sample std within 15% (>= 1024 draws here). */
        const float *p = all + ti->offset;
        if (!d1) {
            for (uint64_t e = 0; e < ti->numel; e++) ck_assert_float_eq(p[e], 1.0f);
        } else {
            double sq = 0.0;
            for (uint64_t e = 0; e < ti->numel; e++) sq += (double)p[e] * p[e];
            const double sd = sqrt(sq / (double)ti->numel);
            double want_sd = 0.02;
            if (strstr(ti->name, "o_proj") || strstr(ti->name, "down_proj"))
                want_sd /= sqrt(2.0 * m.layers);
            ck_assert_msg(fabs(sd - want_sd) <= 0.15 * want_sd, "%s: std %g, want %g",
                          ti->name, sd, want_sd);
        }
    }
    ck_assert_uint_eq(t.total, off);
    free(all);
    /* KV: K and V of kv_heads * head size per position and layer. */
    uint64_t bytes = 0;
    ck_assert_int_eq(A->kv_block_bytes(ctx, 16, &bytes), ORCH_OK);
    const uint64_t kv_bytes = (uint64_t)m.layers * 2 * KV * 16 * sizeof(float);
    ck_assert_uint_ge(bytes, kv_bytes);
    ck_assert_uint_le(bytes, kv_bytes + 64);
    A->context_destroy(ctx);
    /* The same model with kv_heads = heads takes heads/kv_heads times the K/V. */
    orch_model_desc full = m;
    full.kv_heads = m.heads;
    ctx = make_ctx(&full, 1, NULL);
    uint64_t full_bytes = 0;
    ck_assert_int_eq(A->kv_block_bytes(ctx, 16, &full_bytes), ORCH_OK);
    ck_assert_uint_eq(full_bytes - kv_bytes * (m.heads / m.kv_heads), bytes - kv_bytes);
    A->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Errors                                                                     */
/* ------------------------------------------------------------------------- */

static void expect_create_error(const orch_model_desc *m, const char *options,
                                int32_t status, const char *needle) {
    orch_engine_ctx *ctx = NULL;
    char err[1024] = "";
    int rc = engine_create_context(&H, m, 1, 1, options, &ctx, err, sizeof err);
    ck_assert_msg(rc != 0 && ctx == NULL, "create succeeded (want '%s')", needle);
    ck_assert_msg(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    /* The status through the ABI directly. */
    orch_engine_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.threads = 1;
    o.options = options;
    ck_assert_int_eq(A->context_create(m, &o, &ctx, err, sizeof err), status);
}

START_TEST(test_bad_descriptions) {
    safetensors_file *f = fixture_open(1);
    const orch_model_desc good = test_fixture_llama_model(f);
    safetensors_close(f);
    orch_model_desc m = good;
    m.kv_heads = 3;
    expect_create_error(&m, NULL, ORCH_ERR_INVALID_ARGUMENT, "kv_heads 3 must divide");
    m = good;
    m.width = 12; /* head size 3 */
    m.mlp_width = 16;
    expect_create_error(&m, NULL, ORCH_ERR_INVALID_ARGUMENT, "must be even");
    m = good;
    m.rope_scaling = 7;
    m.rope_factor = 0.0f;
    expect_create_error(&m, NULL, ORCH_ERR_UNSUPPORTED, "rope_scaling 7");
    m = test_model_desc(97, 16, 2, 4, 32);
    m.rope_theta = 10000.0f;
    expect_create_error(&m, NULL, ORCH_ERR_INVALID_ARGUMENT, "llama only");
    m = test_model_desc(97, 16, 2, 4, 32);
    m.kv_heads = 2;
    expect_create_error(&m, NULL, ORCH_ERR_UNSUPPORTED, "kv_heads 2 differs");
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Determinism                                                                */
/* ------------------------------------------------------------------------- */

/* Loss bits, gradients and the parameters after 2 steps, for `threads`. */
static void run_steps(int k, uint32_t threads, float *losses, float **grads,
                      float **params, uint64_t *n) {
    char opt[32];
    snprintf(opt, sizeof opt, "threads=%u", threads);
    torch_run r;
    torch_open(&r, k, opt);
    for (int s = 0; s < 2; s++) {
        ck_assert_int_eq(A->grads_zero(r.ctx), ORCH_OK);
        ck_assert_int_eq(
            A->forward_backward(r.ctx, r.tokens, r.targets, r.B, r.T, 1.0f, &losses[s]),
            ORCH_OK);
        orch_adamw_params p = adam_of(r.f, (uint64_t)s + 1);
        float norm;
        if (s == 0) ck_assert_int_eq(A->optimizer_step(r.ctx, &p, &norm), ORCH_OK);
    }
    test_table t;
    test_read_table(A, r.ctx, ORCH_TENSOR_PARAM, &t);
    *n = t.total;
    *grads = test_read_grads(A, r.ctx, t.total);
    *params = test_read_kind(A, r.ctx, ORCH_TENSOR_PARAM, &t);
    torch_close(&r);
}

START_TEST(test_determinism) {
    ck_assert(A->capabilities & ORCH_CAP_DETERMINISTIC);
    for (uint32_t threads = 1; threads <= 3; threads += 2) {
        float la[2], lb[2];
        float *ga, *gb, *pa, *pb;
        uint64_t n;
        run_steps(_i, threads, la, &ga, &pa, &n);
        run_steps(_i, threads, lb, &gb, &pb, &n);
        ck_assert(memcmp(la, lb, sizeof la) == 0);
        ck_assert_msg(memcmp(ga, gb, n * sizeof(float)) == 0,
                      "threads=%u: gradients differ between runs", threads);
        ck_assert_msg(memcmp(pa, pb, n * sizeof(float)) == 0,
                      "threads=%u: parameters differ between runs", threads);
        free(ga);
        free(gb);
        free(pa);
        free(pb);
    }
}
END_TEST

/* ------------------------------------------------------------------------- */
/* ABI 1.3: forward_backward_notify                                           */
/* ------------------------------------------------------------------------- */

/* Fixture k = _i % 3 under 1 and 3 threads: a first micro-batch by
 * forward_backward on both contexts, then the notified one. The ranges are
 * model.norm (+ lm_head when untied) first, then each layer's contiguous
 * tensors from the last layer to the first, then embed_tokens (tied: the
 * head's gradient only final at the end); gradients and loss the same bits
 * as forward_backward's (test_notify_check). */
START_TEST(test_notify) {
    const int k = _i % 3;
    const char *opt = _i < 3 ? "threads=1" : "threads=3";
    torch_run a, b;
    torch_open(&a, k, opt);
    torch_open(&b, k, opt);
    test_table t;
    test_read_table(A, a.ctx, ORCH_TENSOR_PARAM, &t);
    const uint32_t L = a.m.layers;
    float la, lb;
    ck_assert_int_eq(A->grads_zero(a.ctx), ORCH_OK);
    ck_assert_int_eq(A->grads_zero(b.ctx), ORCH_OK);
    ck_assert_int_eq(A->forward_backward(a.ctx, a.tokens, a.targets, a.B, a.T, 0.5f, &la),
                     ORCH_OK);
    ck_assert_int_eq(A->forward_backward(b.ctx, b.tokens, b.targets, b.B, b.T, 0.5f, &lb),
                     ORCH_OK);
    test_notify_log *lg = malloc(sizeof *lg);
    ck_assert_ptr_nonnull(lg);
    uint32_t r = test_notify_check(A, a.ctx, b.ctx, a.tokens, a.targets, a.B, a.T, 0.5f,
                                   t.total, lg);
    test_notify_descending(A, lg);
    ck_assert_uint_eq(r, L + 2);
    const uint32_t norm = 1 + L * 9; /* model.norm.weight */
    ck_assert_str_eq(t.info[norm].name, "model.norm.weight");
    ck_assert_uint_eq(lg->off[0], t.info[norm].offset);
    ck_assert_uint_eq(lg->off[0] + lg->cnt[0], t.total); /* + lm_head when untied */
    for (uint32_t l = 0; l < L; l++)
        ck_assert_uint_eq(lg->off[L - l], t.info[1 + l * 9].offset);
    ck_assert_uint_eq(lg->off[L + 1], 0);
    ck_assert_uint_eq(lg->cnt[L + 1], t.info[0].numel); /* model.embed_tokens */
    free(lg);
    torch_close(&a);
    torch_close(&b);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* precision=bf16                                                             */
/* ------------------------------------------------------------------------- */

START_TEST(test_bf16_steps) {
    safetensors_file *f = fixture_open(_i);
    orch_model_desc m = test_fixture_llama_model(f);
    orch_engine_ctx *probe = NULL;
    char err[1024] = "";
    if (engine_create_context(&H, &m, 0, 1, "precision=bf16", &probe, err, sizeof err) !=
        0) {
        /* Refused on a CPU without bf16 or without oneDNN: one line naming it. */
        ck_assert_msg(strstr(err, "precision=bf16") != NULL, "refusal: %s", err);
        fprintf(stderr, "test_bf16_steps: skipped (%s)\n", err);
        safetensors_close(f);
        return;
    }
    A->context_destroy(probe);
    safetensors_close(f);
    torch_run r;
    torch_open(&r, _i, "precision=bf16");
    size_t ns;
    const float *ref = test_fixture_f32(r.f, "train_losses", &ns);
    for (int s = 0; s < (int)ns; s++) {
        float loss = -1.0f, norm;
        ck_assert_int_eq(A->grads_zero(r.ctx), ORCH_OK);
        ck_assert_int_eq(
            A->forward_backward(r.ctx, r.tokens, r.targets, r.B, r.T, 1.0f, &loss),
            ORCH_OK);
        ck_assert_msg(fabsf(loss - ref[s]) <= 2e-2f, "bf16 step %d: %.6f vs torch %.6f",
                      s + 1, loss, ref[s]);
        orch_adamw_params p = adam_of(r.f, (uint64_t)s + 1);
        ck_assert_int_eq(A->optimizer_step(r.ctx, &p, &norm), ORCH_OK);
    }
    torch_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* weights=int8                                                               */
/* ------------------------------------------------------------------------- */

START_TEST(test_int8) {
    torch_run r;
    torch_open(&r, _i, "weights=int8,skinny=16");
    test_table t;
    test_read_table(A, r.ctx, ORCH_TENSOR_PARAM, &t);
    float *q = test_read_kind(A, r.ctx, ORCH_TENSOR_PARAM, &t);
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info *ti = &t.info[i];
        char key[128];
        snprintf(key, sizeof key, "param.%s", ti->name);
        size_t numel;
        const float *src = test_fixture_f32(r.f, key, &numel);
        const double d = test_max_diff(q + ti->offset, src, numel);
        if (ti->ndim == 1) {
            ck_assert_msg(d == 0.0, "%s changed by int8 rounding", ti->name);
        } else {
            /* Per 32-block: |w - q| <= scale / 2 = max|w_block| / 254. */
            ck_assert_msg(d > 0.0 && d <= test_max_abs(src, numel) / 254.0 * 1.0001,
                          "%s: int8 rounding moved it by %g", ti->name, d);
        }
    }
    float loss = 0.0f;
    ck_assert_int_eq(
        A->forward_backward(r.ctx, r.tokens, r.targets, r.B, r.T, 1.0f, &loss),
        ORCH_ERR_UNSUPPORTED);
    /* fp32 reference on the same (rounded) weights: full forward on sgemm. */
    orch_engine_ctx *ref = make_ctx(&r.m, 0, "skinny=0");
    test_write_kind(A, ref, ORCH_TENSOR_PARAM, &t, q);
    float l8 = -1.0f, l32 = -2.0f;
    ck_assert_int_eq(A->eval_loss(r.ctx, r.tokens, r.targets, r.B, r.T, &l8), ORCH_OK);
    ck_assert_int_eq(A->eval_loss(ref, r.tokens, r.targets, r.B, r.T, &l32), ORCH_OK);
    ck_assert_msg(fabsf(l8 - l32) <= 1e-6f, "int8 eval %.7f vs fp32 %.7f", l8, l32);
    const uint32_t V = r.m.vocab_size, T = r.T;
    float *want = malloc((size_t)2 * T * V * sizeof(float));
    float *got = malloc((size_t)2 * T * V * sizeof(float));
    int32_t tab[2][4] = { { 3, 0, 5, 6 }, { 7, 1, 4, 2 } };
    ck_assert_int_eq(A->kv_configure(ref, 4, 8), ORCH_OK);
    ck_assert_int_eq(A->kv_configure(r.ctx, 4, 8), ORCH_OK);
    orch_seq_input s[2];
    for (uint32_t k = 0; k < 2; k++)
        s[k] = test_seq_input(r.tokens + k * T, T, 0, tab[k], 3, ORCH_LOGITS_ALL);
    ck_assert_int_eq(test_infer(A, ref, s, 2, want, (uint64_t)2 * T * V), ORCH_OK);
    /* int8: a 3-token prefill of both, then one token per forward. */
    for (uint32_t k = 0; k < 2; k++)
        s[k] = test_seq_input(r.tokens + k * T, 3, 0, tab[k], 3, ORCH_LOGITS_ALL);
    float *both = malloc((size_t)2 * 3 * V * sizeof(float));
    ck_assert_int_eq(test_infer(A, r.ctx, s, 2, both, (uint64_t)6 * V), ORCH_OK);
    for (uint32_t k = 0; k < 2; k++)
        memcpy(got + (size_t)k * T * V, both + (size_t)k * 3 * V, 3 * V * sizeof(float));
    free(both);
    for (uint32_t p = 3; p < T; p++) {
        for (uint32_t k = 0; k < 2; k++)
            s[k] =
                test_seq_input(r.tokens + k * T + p, 1, p, tab[k], 3, ORCH_LOGITS_LAST);
        float two[2 * 128];
        ck_assert(V <= 128);
        ck_assert_int_eq(test_infer(A, r.ctx, s, 2, two, (uint64_t)2 * V), ORCH_OK);
        for (uint32_t k = 0; k < 2; k++)
            memcpy(got + ((size_t)k * T + p) * V, two + (size_t)k * V, V * sizeof(float));
    }
    const double worst = test_max_diff(got, want, (uint64_t)2 * T * V);
    const double mag = test_max_abs(want, (uint64_t)2 * T * V);
    printf("test_cpu_llama: kv%d int8 decode vs fp32 full forward: max |diff| %.3g, "
           "max |logit| %.3g\n",
           _i == 0   ? 1
           : _i == 1 ? 2
                     : 4,
           worst, mag);
    ck_assert_msg(worst <= 0.05 * mag, "int8 decode vs fp32: %g (logits up to %g)", worst,
                  mag);
    ck_assert_msg(worst > 0.0, "int8 decoding equals fp32 exactly: int8 kernels unused?");
    free(want);
    free(got);
    free(q);
    A->context_destroy(ref);
    torch_close(&r);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_llama");
    TCase *tc = tcase_create("torch");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_torch_forward, 0, 3 * N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_gradients, 0, 3 * N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_adamw_steps, 0, 3 * N_VARIANTS);
    tcase_add_loop_test(tc, test_kv_decode, 0, 6);
    tcase_add_loop_test(tc, test_kv_copy, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("table");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_table_and_init, 0, 3);
    tcase_add_test(tc, test_bad_descriptions);
    tcase_add_loop_test(tc, test_determinism, 0, 3);
    tcase_add_loop_test(tc, test_notify, 0, 6);
    tcase_add_loop_test(tc, test_bf16_steps, 0, 3);
    tcase_add_loop_test(tc, test_int8, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
