/*
 * test_cpu_lora.c - LoRA adapters of the CPU engine (ABI 1.4, ORCH_CAP_LORA):
 *
 *   - against PyTorch: tests/fixtures/cpu_{gpt2,llama}_tiny_lora{,_sub}
 *     .safetensors (tools/torch_reference.py --lora, float64): GPT-2 with all
 *     four targets (rank 4, alpha 8) and with attn.c_proj + mlp.c_fc (rank 3,
 *     alpha 6); LLaMA kv_heads 2 (GQA: k/v_proj narrower than q_proj, untied
 *     head) with all targets (rank 4, alpha 8) and with q/k/v + down_proj
 *     (rank 2, alpha 3). The fixture's A and B (B not zero) are written
 *     through the adapter table. Checked: the logits of infer_forward with
 *     the sequence's adapter_id and adapter_eval_loss within 1e-4 absolute;
 *     each adapter gradient tensor within 1e-3 of its largest reference
 *     entry; 10 adapter-only AdamW steps (clipping in every step, decay on
 *     every adapter tensor): losses within 1e-4, gradient norms within 1e-4
 *     relative, final A/B within 1e-4 absolute. The tolerances are those of
 *     the GPT-2 and LLaMA suites (fp32 against float64 on values of order 1
 *     and sums of a few hundred terms lands near 1e-6; a wrong scale, a
 *     missing dx term or a wrong column range moves these by 1e-2 or more);
 *     under threads=1, threads=2 and isa=generic;
 *   - the base stays frozen: after adapter_forward_backward and
 *     adapter_optimizer_step the base gradients read zero, the base has no
 *     AdamW moments (optimizer_bytes 0) and every base parameter has the
 *     fixture's bits;
 *   - a merged-weight model (W + (alpha/rank) B A written to a second
 *     context through tensor_write, no adapter) gives the adapter's
 *     eval_loss and logits (within 1e-4: only float rounding differs);
 *   - a fresh adapter (B = 0) leaves eval_loss with the base's bits; its A
 *     is uniform in [-1/sqrt(in), 1/sqrt(in)), depends on the seed only,
 *     and its table has the header's names, shapes and order; ids start at
 *     1 and are never reused;
 *   - finite differences of adapter_eval_loss on one element of A and one of
 *     B match the adapter gradient;
 *   - gradients accumulate over calls (grad_scale) and grads_write/read
 *     round-trip; same inputs and thread count give the same bits;
 *   - precision=bf16 (where available): 10 adapter steps within 2e-2 of the
 *     fixture's losses, base untouched;
 *   - coserve_forward equals infer_forward + adapter_forward_backward
 *     (prefill and decode steps, two micro-batches on two adapters, 1 and 2
 *     threads, packed and sgemm products, a head over several column blocks)
 *     within 1e-5; either part alone; bad arguments change nothing;
 *   - bad inputs: rank 0, rank above min(in, out), alpha <= 0 or NaN, no
 *     targets, unknown target bits, reserved words, a short struct_size,
 *     NULL pointers, unknown or destroyed ids on every call, bad kinds,
 *     indices, byte counts and ranges: each ORCH_ERR_INVALID_ARGUMENT with a
 *     message naming the field; a non-finite adapter gradient norm is
 *     ORCH_ERR_NUMERIC and changes nothing.
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

static const char *const variants[] = { "threads=1", "threads=2", "isa=generic" };
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

/* ------------------------------------------------------------------------- */
/* Fixture runs                                                               */
/* ------------------------------------------------------------------------- */

static orch_engine_ctx *make_ctx(const orch_model_desc *m, const char *options) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(&H, m, 0, 1, options, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", options ? options : "", err);
    return ctx;
}

/* An adapter's PARAM table. */
typedef struct lora_table {
    uint32_t n;
    uint64_t total;
    orch_tensor_info info[TEST_TABLE_MAX];
} lora_table;

static void adapter_table(orch_engine_ctx *ctx, uint32_t id, lora_table *t) {
    ck_assert_int_eq(A->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &t->n), ORCH_OK);
    ck_assert(t->n <= TEST_TABLE_MAX);
    t->total = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        memset(&t->info[i], 0, sizeof t->info[i]);
        t->info[i].struct_size = sizeof t->info[i];
        ck_assert_int_eq(
            A->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &t->info[i]), ORCH_OK);
        ck_assert_uint_eq(t->info[i].offset, t->total);
        t->total += t->info[i].numel;
    }
}

static float *adapter_read_all(orch_engine_ctx *ctx, uint32_t id, uint32_t kind,
                               const lora_table *t) {
    float *all = malloc((t->total ? t->total : 1) * sizeof(float));
    ck_assert_ptr_nonnull(all);
    for (uint32_t i = 0; i < t->n; i++)
        ck_assert_int_eq(A->adapter_tensor_read(ctx, id, kind, i, all + t->info[i].offset,
                                                t->info[i].numel * sizeof(float)),
                         ORCH_OK);
    return all;
}

typedef struct lora_run {
    safetensors_file *f;
    orch_model_desc m;
    orch_engine_ctx *ctx;
    uint32_t id, B, T, rank, targets;
    float alpha;
    const int32_t *tokens, *targets_t;
    lora_table t;
} lora_run;

/* Write <prefix><name> of the fixture into every tensor of the adapter. */
static void load_adapter(lora_run *r, orch_engine_ctx *ctx, uint32_t id,
                         const char *prefix) {
    for (uint32_t i = 0; i < r->t.n; i++) {
        char key[160];
        snprintf(key, sizeof key, "%s%s", prefix, r->t.info[i].name);
        size_t n;
        const float *src = test_fixture_f32(r->f, key, &n);
        ck_assert_uint_eq(n, r->t.info[i].numel);
        ck_assert_int_eq(A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, i, src,
                                                 n * sizeof(float)),
                         ORCH_OK);
    }
}

static void lora_open(lora_run *r, int k, const char *options) {
    r->f = test_fixture_open(fixtures[k]);
    r->m = test_fixture_model(r->f);
    r->ctx = make_ctx(&r->m, options);
    test_load_fixture_params(A, r->ctx, r->f);
    r->B = (uint32_t)test_fixture_meta(r->f, "batch");
    r->T = (uint32_t)test_fixture_meta(r->f, "seq_len");
    r->rank = (uint32_t)test_fixture_meta(r->f, "lora_rank");
    r->alpha = (float)test_fixture_meta(r->f, "lora_alpha");
    r->targets = (uint32_t)test_fixture_meta(r->f, "lora_targets");
    size_t n;
    r->tokens = test_fixture_get(r->f, "tokens", SAFETENSORS_I32, &n);
    r->targets_t = test_fixture_get(r->f, "targets", SAFETENSORS_I32, &n);
    orch_lora_desc d = test_lora_desc(r->rank, r->alpha, r->targets, 99);
    ck_assert_int_eq(A->adapter_create(r->ctx, &d, &r->id), ORCH_OK);
    adapter_table(r->ctx, r->id, &r->t);
    ck_assert_uint_eq(r->t.n, (uint32_t)test_fixture_meta(r->f, "lora_tensors"));
    load_adapter(r, r->ctx, r->id, "lora.");
}

static void lora_close(lora_run *r) {
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

/* Every base gradient is zero and every base parameter has the fixture's
 * bits; the base holds no AdamW moments. */
static void check_base_frozen(const lora_run *r, const char *tag) {
    test_table t;
    test_read_table(A, r->ctx, ORCH_TENSOR_PARAM, &t);
    float *g = test_read_grads(A, r->ctx, t.total);
    ck_assert_msg(test_max_abs(g, t.total) == 0.0, "%s: base gradients touched", tag);
    free(g);
    float *p = test_read_kind(A, r->ctx, ORCH_TENSOR_PARAM, &t);
    for (uint32_t i = 0; i < t.n; i++) {
        char key[160];
        snprintf(key, sizeof key, "param.%s", t.info[i].name);
        size_t n;
        const float *ref = test_fixture_f32(r->f, key, &n);
        ck_assert_msg(memcmp(p + t.info[i].offset, ref, n * sizeof(float)) == 0,
                      "%s: base parameter %s changed", tag, t.info[i].name);
    }
    free(p);
    uint64_t bytes = 1;
    ck_assert_int_eq(A->optimizer_bytes(r->ctx, &bytes), ORCH_OK);
    ck_assert_msg(bytes == 0, "%s: base moments allocated (%llu bytes)", tag,
                  (unsigned long long)bytes);
}

/* Logits of every position of the fixture's batch through infer_forward,
 * sequence b on adapters[b] (malloc'd [B*T*V]). */
static float *batch_logits(orch_engine_ctx *ctx, const lora_run *r,
                           const uint32_t *adapters) {
    const uint32_t B = r->B, T = r->T, V = r->m.vocab_size;
    ck_assert_int_eq(A->kv_configure(ctx, 4, 4 * B), ORCH_OK);
    int32_t tables[8][4];
    orch_seq_input s[8];
    ck_assert(B <= 8 && T <= 16);
    for (uint32_t b = 0; b < B; b++) {
        for (uint32_t j = 0; j < 4; j++) tables[b][j] = (int32_t)(j * B + (B - 1 - b));
        s[b] = test_seq_input(r->tokens + (size_t)b * T, T, 0, tables[b], 4,
                              ORCH_LOGITS_ALL);
        s[b].adapter_id = adapters ? adapters[b] : 0;
    }
    float *logits = malloc((size_t)B * T * V * sizeof(float));
    ck_assert_ptr_nonnull(logits);
    int32_t st = test_infer(A, ctx, s, B, logits, (uint64_t)B * T * V);
    ck_assert_msg(st == ORCH_OK, "infer_forward: %s", A->last_error(ctx));
    return logits;
}

/* The same rows as batch_logits, made by a prefill of `prefill` tokens per
 * sequence (all logits) and then one-token decode steps (malloc'd). */
static float *batch_logits_decode(orch_engine_ctx *ctx, const lora_run *r,
                                  const uint32_t *adapters, uint32_t prefill) {
    const uint32_t B = r->B, T = r->T, V = r->m.vocab_size;
    ck_assert_int_eq(A->kv_configure(ctx, 4, 4 * B), ORCH_OK);
    int32_t tables[8][4];
    orch_seq_input s[8];
    ck_assert(B <= 8 && T <= 16 && prefill < T);
    float *out = malloc((size_t)B * T * V * sizeof(float));
    float *step = malloc((size_t)B * T * V * sizeof(float));
    ck_assert(out && step);
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t j = 0; j < 4; j++) tables[b][j] = (int32_t)(j * B + b);
    for (uint32_t pos = 0; pos < T;) {
        const uint32_t n = pos == 0 ? prefill : 1;
        for (uint32_t b = 0; b < B; b++) {
            s[b] = test_seq_input(r->tokens + (size_t)b * T + pos, n, pos, tables[b], 4,
                                  ORCH_LOGITS_ALL);
            s[b].adapter_id = adapters[b];
        }
        int32_t st = test_infer(A, ctx, s, B, step, (uint64_t)B * n * V);
        ck_assert_msg(st == ORCH_OK, "infer_forward: %s", A->last_error(ctx));
        for (uint32_t b = 0; b < B; b++)
            memcpy(out + ((size_t)b * T + pos) * V, step + (size_t)b * n * V,
                   (size_t)n * V * sizeof(float));
        pos += n;
    }
    free(step);
    return out;
}

/* ------------------------------------------------------------------------- */
/* Against PyTorch                                                            */
/* ------------------------------------------------------------------------- */

START_TEST(test_torch_forward) {
    const int k = _i / N_VARIANTS;
    const char *opt = variants[_i % N_VARIANTS];
    lora_run r;
    lora_open(&r, k, opt);
    size_t nl, n1;
    const float *ref_logits = test_fixture_f32(r.f, "logits", &nl);
    const float ref_loss = test_fixture_f32(r.f, "loss", &n1)[0];
    float loss = -1.0f;
    ck_assert_int_eq(
        A->adapter_eval_loss(r.ctx, r.id, r.tokens, r.targets_t, r.B, r.T, &loss),
        ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f,
                  "[%s %s] adapter eval loss %.7f vs %.7f", fixtures[k], opt, loss,
                  ref_loss);
    uint32_t ids[2] = { r.id, r.id };
    float *logits = batch_logits(r.ctx, &r, ids);
    const double worst = test_max_diff(logits, ref_logits, nl);
    ck_assert_msg(worst <= 1e-4, "[%s %s] adapter logits differ from torch by %g",
                  fixtures[k], opt, worst);
    ck_assert_msg(test_max_abs(ref_logits, nl) > 0.05, "fixture logits too small");
    free(logits);
    lora_close(&r);
}
END_TEST

START_TEST(test_torch_gradients) {
    const int k = _i / N_VARIANTS;
    const char *opt = variants[_i % N_VARIANTS];
    lora_run r;
    lora_open(&r, k, opt);
    size_t n1;
    const float ref_loss = test_fixture_f32(r.f, "loss", &n1)[0];
    float loss = -1.0f;
    ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
    ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t, r.B,
                                                 r.T, 1.0f, &loss),
                     ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f, "[%s %s] loss %.7f vs %.7f",
                  fixtures[k], opt, loss, ref_loss);
    float *g = malloc(r.t.total * sizeof(float));
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g), ORCH_OK);
    for (uint32_t i = 0; i < r.t.n; i++) {
        const orch_tensor_info *ti = &r.t.info[i];
        char key[160];
        snprintf(key, sizeof key, "grad.%s", ti->name);
        size_t n;
        const float *ref = test_fixture_f32(r.f, key, &n);
        ck_assert_uint_eq(n, ti->numel);
        const double diff = test_max_diff(g + ti->offset, ref, n);
        const double scale = test_max_abs(ref, n);
        ck_assert_msg(scale > 0.0, "%s: reference gradient is zero", ti->name);
        ck_assert_msg(diff <= 1e-3 * scale,
                      "[%s %s] gradient %s: max diff %g, max |ref| %g (rel %g)",
                      fixtures[k], opt, ti->name, diff, scale, diff / scale);
    }
    check_base_frozen(&r, "after adapter_forward_backward");
    /* A second call with grad_scale 0.5 adds half of the same gradient. */
    ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t, r.B,
                                                 r.T, 0.5f, &loss),
                     ORCH_OK);
    float *g2 = malloc(r.t.total * sizeof(float));
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g2), ORCH_OK);
    for (uint64_t e = 0; e < r.t.total; e++)
        ck_assert_msg(test_close(g2[e], 1.5 * g[e], 1e-5, 1e-8),
                      "accumulated gradient %llu: %g vs 1.5 x %g", (unsigned long long)e,
                      g2[e], g[e]);
    /* grads_write / grads_read round-trip (a range inside the buffer). */
    const uint64_t off = r.t.total / 3, cnt = r.t.total / 4;
    ck_assert_int_eq(A->adapter_grads_write(r.ctx, r.id, off, cnt, g), ORCH_OK);
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g2), ORCH_OK);
    ck_assert(memcmp(g2 + off, g, cnt * sizeof(float)) == 0);
    ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g2), ORCH_OK);
    ck_assert(test_max_abs(g2, r.t.total) == 0.0);
    free(g);
    free(g2);
    lora_close(&r);
}
END_TEST

START_TEST(test_torch_steps) {
    const int k = _i / N_VARIANTS;
    const char *opt = variants[_i % N_VARIANTS];
    lora_run r;
    lora_open(&r, k, opt);
    const int steps = (int)test_fixture_meta(r.f, "steps");
    size_t ns, nn;
    const float *ref_losses = test_fixture_f32(r.f, "train_losses", &ns);
    const float *ref_norms = test_fixture_f32(r.f, "grad_norms", &nn);
    ck_assert_int_eq((int)ns, steps);
    for (int s = 0; s < steps; s++) {
        float loss = -1.0f, norm = -1.0f;
        ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
        ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t,
                                                     r.B, r.T, 1.0f, &loss),
                         ORCH_OK);
        ck_assert_msg(fabsf(loss - ref_losses[s]) <= 1e-4f,
                      "[%s %s] step %d: loss %.7f vs torch %.7f", fixtures[k], opt, s + 1,
                      loss, ref_losses[s]);
        orch_adamw_params p = adam_of(r.f, (uint64_t)s + 1);
        ck_assert_int_eq(A->adapter_optimizer_step(r.ctx, r.id, &p, &norm), ORCH_OK);
        ck_assert_msg(fabsf(norm - ref_norms[s]) <= 1e-4f * ref_norms[s] + 1e-6f,
                      "[%s %s] step %d: grad norm %.7f vs torch %.7f", fixtures[k], opt,
                      s + 1, norm, ref_norms[s]);
    }
    ck_assert_msg(ref_losses[steps - 1] < ref_losses[0] - 0.5f, "fixture should learn");
    float *p = adapter_read_all(r.ctx, r.id, ORCH_TENSOR_PARAM, &r.t);
    for (uint32_t i = 0; i < r.t.n; i++) {
        char key[160];
        snprintf(key, sizeof key, "final.%s", r.t.info[i].name);
        size_t n;
        const float *ref = test_fixture_f32(r.f, key, &n);
        const double diff = test_max_diff(p + r.t.info[i].offset, ref, n);
        ck_assert_msg(diff <= 1e-4, "[%s %s] final %s differs from torch by %g",
                      fixtures[k], opt, r.t.info[i].name, diff);
    }
    /* The moments are live: m is not zero after the steps. */
    float *m = adapter_read_all(r.ctx, r.id, ORCH_TENSOR_ADAM_M, &r.t);
    ck_assert(test_max_abs(m, r.t.total) > 0.0);
    free(m);
    free(p);
    check_base_frozen(&r, "after adapter_optimizer_step");
    lora_close(&r);
}
END_TEST

/* precision=bf16 (where the CPU and oneDNN allow it): the base products in
 * bf16 (dX only: the frozen base has no dW product), the adapter's in fp32;
 * the 10 step losses within 2e-2 of the float64 fixture (the bound of
 * tests/test_cpu_bf16.c) and the base untouched. */
START_TEST(test_bf16_steps) {
    safetensors_file *f = test_fixture_open(fixtures[_i]);
    orch_model_desc m = test_fixture_model(f);
    orch_engine_ctx *probe = NULL;
    char err[1024] = "";
    const int ok = engine_create_context(&H, &m, 0, 1, "precision=bf16", &probe, err,
                                         sizeof err) == 0;
    safetensors_close(f);
    if (!ok) { /* refused on a CPU without bf16 or without oneDNN: one line naming it */
        ck_assert_msg(strstr(err, "precision=bf16") != NULL, "refusal: %s", err);
        fprintf(stderr, "test_bf16_steps: skipped (%s)\n", err);
        return;
    }
    A->context_destroy(probe);
    lora_run r;
    lora_open(&r, _i, "precision=bf16");
    size_t ns;
    const float *ref = test_fixture_f32(r.f, "train_losses", &ns);
    for (int s = 0; s < (int)ns; s++) {
        float loss = -1.0f, norm;
        ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
        ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t,
                                                     r.B, r.T, 1.0f, &loss),
                         ORCH_OK);
        ck_assert_msg(fabsf(loss - ref[s]) <= 2e-2f,
                      "[%s] bf16 step %d: %.6f vs torch %.6f", fixtures[_i], s + 1, loss,
                      ref[s]);
        orch_adamw_params p = adam_of(r.f, (uint64_t)s + 1);
        ck_assert_int_eq(A->adapter_optimizer_step(r.ctx, r.id, &p, &norm), ORCH_OK);
    }
    check_base_frozen(&r, "bf16 adapter steps");
    lora_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Merged weights, fresh adapters, finite differences                         */
/* ------------------------------------------------------------------------- */

/* A context with the fixture base and W + scale * B A on every adapted
 * matrix (adapter parameters `ad`, table r->t). */
static orch_engine_ctx *merged_ctx(const lora_run *r, const float *ad,
                                   const char *options) {
    orch_engine_ctx *m = make_ctx(&r->m, options);
    test_load_fixture_params(A, m, r->f);
    test_table bt;
    test_read_table(A, m, ORCH_TENSOR_PARAM, &bt);
    const double scale = (double)r->alpha / (double)r->rank;
    for (uint32_t i = 0; i < r->t.n; i += 2) {
        const orch_tensor_info *ta = &r->t.info[i], *tb = &r->t.info[i + 1];
        char base[ORCH_TENSOR_NAME_MAX];
        const char *suf = strstr(ta->name, ".lora_A.weight");
        ck_assert_ptr_nonnull(suf);
        snprintf(base, sizeof base, "%.*s.weight", (int)(suf - ta->name), ta->name);
        uint32_t bi = 0;
        while (bi < bt.n && strcmp(bt.info[bi].name, base) != 0) bi++;
        ck_assert_msg(bi < bt.n, "no base tensor %s", base);
        const uint64_t out = bt.info[bi].shape[0], in = bt.info[bi].shape[1];
        const uint64_t rank = ta->shape[0];
        ck_assert_uint_eq(ta->shape[1], in);
        ck_assert_uint_eq(tb->shape[0], out);
        ck_assert_uint_eq(tb->shape[1], rank);
        float *w = malloc(out * in * sizeof(float));
        ck_assert_int_eq(A->tensor_read(m, ORCH_TENSOR_PARAM, bi, w, out * in * 4),
                         ORCH_OK);
        const float *a = ad + ta->offset, *b = ad + tb->offset;
        for (uint64_t o = 0; o < out; o++)
            for (uint64_t c = 0; c < in; c++) {
                double acc = 0.0;
                for (uint64_t q = 0; q < rank; q++)
                    acc += (double)b[o * rank + q] * (double)a[q * in + c];
                w[o * in + c] = (float)((double)w[o * in + c] + scale * acc);
            }
        ck_assert_int_eq(A->tensor_write(m, ORCH_TENSOR_PARAM, bi, w, out * in * 4),
                         ORCH_OK);
        free(w);
    }
    return m;
}

START_TEST(test_merged_weights) {
    const int k = _i;
    lora_run r;
    lora_open(&r, k, "threads=2");
    float *ad = adapter_read_all(r.ctx, r.id, ORCH_TENSOR_PARAM, &r.t);
    orch_engine_ctx *m = merged_ctx(&r, ad, "threads=2");
    float la = -1.0f, lm = -2.0f;
    ck_assert_int_eq(
        A->adapter_eval_loss(r.ctx, r.id, r.tokens, r.targets_t, r.B, r.T, &la), ORCH_OK);
    ck_assert_int_eq(A->eval_loss(m, r.tokens, r.targets_t, r.B, r.T, &lm), ORCH_OK);
    ck_assert_msg(fabsf(la - lm) <= 1e-4f, "[%s] adapter loss %.7f vs merged %.7f",
                  fixtures[k], la, lm);
    uint32_t ids[2] = { r.id, r.id };
    float *x = batch_logits(r.ctx, &r, ids);
    float *y = batch_logits(m, &r, NULL);
    const uint64_t n = (uint64_t)r.B * r.T * r.m.vocab_size;
    const double worst = test_max_diff(x, y, n);
    ck_assert_msg(worst <= 1e-4, "[%s] adapter logits vs merged: %g", fixtures[k], worst);
    /* The base (adapter 0) of the adapter's context is not the merged model. */
    float *z = batch_logits(r.ctx, &r, NULL);
    ck_assert_msg(test_max_diff(z, y, n) > 1e-2, "adapter had no effect");
    free(x);
    free(y);
    free(z);
    free(ad);
    A->context_destroy(m);
    lora_close(&r);
}
END_TEST

/* Two adapters and the base in one batch: each sequence equals its own
 * merged model (sequence b of the fixture on adapter ids[b]), in one forward
 * and through a prefill and decode steps; packed decode kernels and (with
 * skinny=0) sgemm. */
START_TEST(test_mixed_batch) {
    const int k = _i / 2;
    const char *opt = _i % 2 ? "skinny=0" : "threads=2";
    lora_run r;
    lora_open(&r, k, opt);
    float *ad1 = adapter_read_all(r.ctx, r.id, ORCH_TENSOR_PARAM, &r.t);
    /* Second adapter: same shape, B of the fixture negated and A scaled. */
    orch_lora_desc d = test_lora_desc(r.rank, r.alpha, r.targets, 5);
    uint32_t id2 = 0;
    ck_assert_int_eq(A->adapter_create(r.ctx, &d, &id2), ORCH_OK);
    float *ad2 = malloc(r.t.total * sizeof(float));
    for (uint64_t e = 0; e < r.t.total; e++) ad2[e] = -0.7f * ad1[e];
    for (uint32_t i = 0; i < r.t.n; i++)
        ck_assert_int_eq(A->adapter_tensor_write(r.ctx, id2, ORCH_TENSOR_PARAM, i,
                                                 ad2 + r.t.info[i].offset,
                                                 r.t.info[i].numel * sizeof(float)),
                         ORCH_OK);
    const uint64_t V = r.m.vocab_size, T = r.T;
    const uint32_t combos[3][2] = { { r.id, id2 }, { id2, 0 }, { 0, r.id } };
    orch_engine_ctx *m1 = merged_ctx(&r, ad1, "threads=2");
    orch_engine_ctx *m2 = merged_ctx(&r, ad2, "threads=2");
    float *y1 = batch_logits(m1, &r, NULL), *y2 = batch_logits(m2, &r, NULL);
    float *y0 = batch_logits(r.ctx, &r, NULL);
    for (int c = 0; c < 3; c++) {
        float *x = batch_logits(r.ctx, &r, combos[c]);
        for (uint32_t b = 0; b < 2; b++) {
            const uint32_t id = combos[c][b];
            const float *want = id == 0 ? y0 : id == r.id ? y1 : y2;
            const double worst = test_max_diff(x + b * T * V, want + b * T * V, T * V);
            ck_assert_msg(worst <= 1e-4, "[%s %s] combo %d seq %u (adapter %u): %g",
                          fixtures[k], opt, c, b, id, worst);
        }
        free(x);
        /* The same through a prefill of 8 tokens and 4 decode steps. */
        x = batch_logits_decode(r.ctx, &r, combos[c], 8);
        for (uint32_t b = 0; b < 2; b++) {
            const uint32_t id = combos[c][b];
            const float *want = id == 0 ? y0 : id == r.id ? y1 : y2;
            const double worst = test_max_diff(x + b * T * V, want + b * T * V, T * V);
            ck_assert_msg(worst <= 1e-4,
                          "[%s %s] decode combo %d seq %u (adapter %u): %g", fixtures[k],
                          opt, c, b, id, worst);
        }
        free(x);
    }
    ck_assert(test_max_diff(y1, y2, 2 * T * V) > 1e-2);
    free(y0);
    free(y1);
    free(y2);
    free(ad1);
    free(ad2);
    A->context_destroy(m1);
    A->context_destroy(m2);
    lora_close(&r);
}
END_TEST

/* Adapters of different ranks in one batch, on 2 threads: each sequence's
 * logits equal those of a batch where every sequence uses that sequence's
 * adapter (the per-sequence scratch of the adapter products is laid out by
 * the batch's largest rank; laid out by each sequence's own rank, the
 * threads overwrote each other's rows). Repeated: the overlap was a race. */
START_TEST(test_mixed_ranks) {
    const int k = _i;
    lora_run r;
    lora_open(&r, k, "threads=2");
    const uint32_t rank2 = r.rank == 2 ? 4 : 2;
    orch_lora_desc d = test_lora_desc(rank2, 2.0f * (float)rank2, r.targets, 9);
    uint32_t id2 = 0;
    ck_assert_int_eq(A->adapter_create(r.ctx, &d, &id2), ORCH_OK);
    lora_table t2;
    adapter_table(r.ctx, id2, &t2);
    uint64_t s = 77;
    for (uint32_t i = 0; i < t2.n; i++) { /* B too, so the adapter acts */
        float *v = malloc(t2.info[i].numel * sizeof(float));
        for (uint64_t e = 0; e < t2.info[i].numel; e++)
            v[e] = 0.2f * ((float)((test_lcg64(&s) >> 40) & 0xFFFF) / 65536.0f - 0.5f);
        ck_assert_int_eq(A->adapter_tensor_write(r.ctx, id2, ORCH_TENSOR_PARAM, i, v,
                                                 t2.info[i].numel * sizeof(float)),
                         ORCH_OK);
        free(v);
    }
    ck_assert_uint_le(r.B, 8);
    uint32_t all1[8], all2[8], mixed[8];
    for (uint32_t b = 0; b < r.B; b++) {
        all1[b] = r.id;
        all2[b] = id2;
        mixed[b] = b % 2 ? id2 : r.id;
    }
    const uint64_t V = r.m.vocab_size, T = r.T;
    float *y1 = batch_logits(r.ctx, &r, all1), *y2 = batch_logits(r.ctx, &r, all2);
    ck_assert(test_max_diff(y1, y2, r.B * T * V) > 1e-2); /* they differ */
    for (int rep = 0; rep < 20; rep++) {
        float *x = batch_logits(r.ctx, &r, mixed);
        for (uint32_t b = 0; b < r.B; b++) {
            const float *want = (b % 2 ? y2 : y1) + b * T * V;
            const double worst = test_max_diff(x + b * T * V, want, T * V);
            ck_assert_msg(worst <= 1e-5,
                          "[%s] rep %d seq %u (rank %u) in a batch with rank %u: %g",
                          fixtures[k], rep, b, b % 2 ? rank2 : r.rank,
                          b % 2 ? r.rank : rank2, worst);
        }
        free(x);
    }
    free(y1);
    free(y2);
    lora_close(&r);
}
END_TEST

START_TEST(test_fresh_adapter) {
    const int k = _i;
    safetensors_file *f = test_fixture_open(fixtures[k]);
    orch_model_desc md = test_fixture_model(f);
    orch_engine_ctx *ctx = make_ctx(&md, "threads=2");
    test_load_fixture_params(A, ctx, f);
    const uint32_t B = (uint32_t)test_fixture_meta(f, "batch");
    const uint32_t T = (uint32_t)test_fixture_meta(f, "seq_len");
    size_t n;
    const int32_t *tok = test_fixture_get(f, "tokens", SAFETENSORS_I32, &n);
    const int32_t *tgt = test_fixture_get(f, "targets", SAFETENSORS_I32, &n);
    float base = -1.0f, with = -2.0f, again = -3.0f;
    ck_assert_int_eq(A->eval_loss(ctx, tok, tgt, B, T, &base), ORCH_OK);
    orch_lora_desc d = test_lora_desc(4, 16.0f, ORCH_LORA_TARGET_ALL, 42);
    uint32_t id1 = 0, id2 = 0, id3 = 0, id4 = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id1), ORCH_OK);
    ck_assert_uint_eq(id1, 1);
    ck_assert_int_eq(A->adapter_eval_loss(ctx, id1, tok, tgt, B, T, &with), ORCH_OK);
    ck_assert_msg(memcmp(&base, &with, sizeof base) == 0,
                  "fresh adapter changes the loss: %.9g vs %.9g", with, base);
    /* The table: header names and order, A in the bound, B zero. */
    lora_table t;
    adapter_table(ctx, id1, &t);
    const int llama = md.arch == ORCH_ARCH_LLAMA;
    ck_assert_uint_eq(t.n, md.layers * (llama ? 14 : 8));
    const char *gpt2_names[4] = { "attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                  "mlp.c_proj" };
    const char *llama_names[7] = { "self_attn.q_proj", "self_attn.k_proj",
                                   "self_attn.v_proj", "self_attn.o_proj",
                                   "mlp.gate_proj",    "mlp.up_proj",
                                   "mlp.down_proj" };
    float *p = adapter_read_all(ctx, id1, ORCH_TENSOR_PARAM, &t);
    for (uint32_t i = 0; i < t.n; i++) {
        const uint32_t per = llama ? 7 : 4, l = i / (2 * per), j = (i / 2) % per;
        char want[ORCH_TENSOR_NAME_MAX];
        snprintf(want, sizeof want, "%s%u.%s.lora_%s.weight",
                 llama ? "model.layers." : "h.", l,
                 llama ? llama_names[j] : gpt2_names[j], i % 2 ? "B" : "A");
        ck_assert_str_eq(t.info[i].name, want);
        ck_assert_uint_eq(t.info[i].ndim, 2);
        ck_assert_uint_eq(t.info[i].flags, 0);
        ck_assert_uint_eq(t.info[i].dtype, ORCH_DTYPE_F32);
        const float *v = p + t.info[i].offset;
        if (i % 2) {
            ck_assert_uint_eq(t.info[i].shape[1], 4);
            ck_assert(test_max_abs(v, t.info[i].numel) == 0.0);
        } else {
            ck_assert_uint_eq(t.info[i].shape[0], 4);
            const double bound = 1.0 / sqrt((double)t.info[i].shape[1]);
            double lo = 1.0, hi = -1.0;
            for (uint64_t e = 0; e < t.info[i].numel; e++) {
                ck_assert(v[e] >= -bound && v[e] < bound);
                lo = fmin(lo, v[e]);
                hi = fmax(hi, v[e]);
            }
            ck_assert_msg(lo < -0.5 * bound && hi > 0.5 * bound, "%s: A not spread",
                          t.info[i].name);
        }
    }
    /* Same seed: same A; another seed: another A. */
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id2), ORCH_OK);
    float *p2 = adapter_read_all(ctx, id2, ORCH_TENSOR_PARAM, &t);
    ck_assert(memcmp(p, p2, t.total * sizeof(float)) == 0);
    free(p2);
    d.seed = 43;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id3), ORCH_OK);
    p2 = adapter_read_all(ctx, id3, ORCH_TENSOR_PARAM, &t);
    ck_assert(memcmp(p, p2, t.total * sizeof(float)) != 0);
    free(p2);
    /* Ids are never reused. */
    ck_assert_uint_eq(id2, 2);
    ck_assert_uint_eq(id3, 3);
    ck_assert_int_eq(A->adapter_destroy(ctx, id3), ORCH_OK);
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id4), ORCH_OK);
    ck_assert_uint_eq(id4, 4);
    ck_assert_int_eq(A->adapter_destroy(ctx, id3), ORCH_ERR_INVALID_ARGUMENT);
    /* Training the adapter moves its loss; the base's stays bit for bit. */
    orch_adamw_params ap = test_adamw(1, 1e-2f, 0.0f, 1.0f);
    ck_assert_int_eq(A->adapter_forward_backward(ctx, id1, tok, tgt, B, T, 1.0f, &with),
                     ORCH_OK);
    ck_assert_int_eq(A->adapter_optimizer_step(ctx, id1, &ap, NULL), ORCH_OK);
    ck_assert_int_eq(A->adapter_eval_loss(ctx, id1, tok, tgt, B, T, &with), ORCH_OK);
    ck_assert_msg(with < base, "one step did not lower the loss: %g vs %g", with, base);
    ck_assert_int_eq(A->eval_loss(ctx, tok, tgt, B, T, &again), ORCH_OK);
    ck_assert(memcmp(&base, &again, sizeof base) == 0);
    free(p);
    A->context_destroy(ctx);
    safetensors_close(f);
}
END_TEST

START_TEST(test_finite_differences) {
    const int k = _i;
    lora_run r;
    lora_open(&r, k, "threads=2");
    float *g = malloc(r.t.total * sizeof(float));
    float loss;
    ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t, r.B,
                                                 r.T, 1.0f, &loss),
                     ORCH_OK);
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g), ORCH_OK);
    /* The largest-gradient element of the first A and of the last B. */
    const uint32_t which[2] = { 0, r.t.n - 1 };
    for (int w = 0; w < 2; w++) {
        const orch_tensor_info *ti = &r.t.info[which[w]];
        float *v = malloc(ti->numel * sizeof(float));
        ck_assert_int_eq(A->adapter_tensor_read(r.ctx, r.id, ORCH_TENSOR_PARAM, which[w],
                                                v, ti->numel * 4),
                         ORCH_OK);
        uint64_t e = 0;
        for (uint64_t q = 1; q < ti->numel; q++)
            if (fabsf(g[ti->offset + q]) > fabsf(g[ti->offset + e])) e = q;
        const float h = 1e-3f, x0 = v[e];
        float lp, lm;
        v[e] = x0 + h;
        ck_assert_int_eq(A->adapter_tensor_write(r.ctx, r.id, ORCH_TENSOR_PARAM, which[w],
                                                 v, ti->numel * 4),
                         ORCH_OK);
        ck_assert_int_eq(
            A->adapter_eval_loss(r.ctx, r.id, r.tokens, r.targets_t, r.B, r.T, &lp),
            ORCH_OK);
        v[e] = x0 - h;
        ck_assert_int_eq(A->adapter_tensor_write(r.ctx, r.id, ORCH_TENSOR_PARAM, which[w],
                                                 v, ti->numel * 4),
                         ORCH_OK);
        ck_assert_int_eq(
            A->adapter_eval_loss(r.ctx, r.id, r.tokens, r.targets_t, r.B, r.T, &lm),
            ORCH_OK);
        const double fd = ((double)lp - (double)lm) / (2.0 * (double)h);
        const double an = g[ti->offset + e];
        printf("test_cpu_lora: %s finite difference %s[%llu]: %.6g vs gradient %.6g\n",
               fixtures[k], ti->name, (unsigned long long)e, fd, an);
        ck_assert_msg(fabs(an) > 1e-3, "%s: gradient too small to test", ti->name);
        ck_assert_msg(fabs(fd - an) <= 1e-2 * fabs(an) + 2e-4,
                      "[%s] %s[%llu]: finite difference %g vs gradient %g", fixtures[k],
                      ti->name, (unsigned long long)e, fd, an);
        free(v);
    }
    free(g);
    lora_close(&r);
}
END_TEST

START_TEST(test_determinism) {
    const int k = _i;
    float *g[2];
    for (int rep = 0; rep < 2; rep++) {
        lora_run r;
        lora_open(&r, k, "threads=2");
        float loss;
        ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t,
                                                     r.B, r.T, 1.0f, &loss),
                         ORCH_OK);
        g[rep] = malloc(r.t.total * sizeof(float) + sizeof(float));
        ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g[rep]),
                         ORCH_OK);
        memcpy(g[rep] + r.t.total, &loss, sizeof loss);
        if (rep == 1) ck_assert(memcmp(g[0], g[1], (r.t.total + 1) * sizeof(float)) == 0);
        lora_close(&r);
    }
    free(g[0]);
    free(g[1]);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Bad inputs                                                                 */
/* ------------------------------------------------------------------------- */

static void expect_err(orch_engine_ctx *ctx, int32_t st, int32_t want, const char *word) {
    ck_assert_msg(st == want, "status %d, want %d (%s)", st, want, A->last_error(ctx));
    ck_assert_msg(strstr(A->last_error(ctx), word) != NULL, "message \"%s\" lacks \"%s\"",
                  A->last_error(ctx), word);
}

START_TEST(test_bad_inputs) {
    const int k = _i; /* gpt2 (width 24, mlp 80) or llama (k/v 16 wide) */
    lora_run r;
    lora_open(&r, 2 * k, "threads=2");
    orch_engine_ctx *c = r.ctx;
    uint32_t id = 77;
    orch_lora_desc d = test_lora_desc(0, 8.0f, ORCH_LORA_TARGET_ALL, 1);
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "rank 0");
    const uint32_t lim = k == 0 ? 24 : 16;
    d.rank = lim + 1;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "rank");
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT,
               k == 0 ? "c_attn" : "k_proj");
    d.rank = lim; /* the largest allowed */
    uint32_t big = 0;
    ck_assert_int_eq(A->adapter_create(c, &d, &big), ORCH_OK);
    ck_assert_int_eq(A->adapter_destroy(c, big), ORCH_OK);
    if (k == 1) { /* only o_proj and the MLP: 32 wide, mlp 48 */
        d.rank = 20;
        d.targets = ORCH_LORA_TARGET_ATTN_OUT | ORCH_LORA_TARGET_MLP_UP;
        ck_assert_int_eq(A->adapter_create(c, &d, &big), ORCH_OK);
        d.targets = ORCH_LORA_TARGET_ATTN_QKV;
        expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "k_proj");
        d.targets = ORCH_LORA_TARGET_ALL;
    }
    d.rank = 2;
    d.alpha = 0.0f;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "alpha");
    d.alpha = -1.0f;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "alpha");
    d.alpha = NAN;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "alpha");
    d.alpha = 4.0f;
    d.targets = 0;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "targets");
    d.targets = 0x13;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT,
               "unknown bits 0x10");
    d.targets = ORCH_LORA_TARGET_MLP_DOWN;
    d.reserved[2] = 5;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT,
               "reserved[2]");
    d.reserved[2] = 0;
    d.struct_size = 16;
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT,
               "struct_size");
    d.struct_size = sizeof d;
    expect_err(c, A->adapter_create(c, NULL, &id), ORCH_ERR_INVALID_ARGUMENT, "desc");
    expect_err(c, A->adapter_create(c, &d, NULL), ORCH_ERR_INVALID_ARGUMENT, "out_id");
    ck_assert_uint_eq(id, 77); /* untouched by every failure */
    /* Unknown ids on every call: 0 (the base), a destroyed one, one never made. */
    uint32_t gone = 0;
    ck_assert_int_eq(A->adapter_create(c, &d, &gone), ORCH_OK);
    ck_assert_int_eq(A->adapter_destroy(c, gone), ORCH_OK);
    const uint32_t bad_ids[3] = { 0, gone, 1000 };
    float buf[64], loss = 0.0f;
    orch_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.struct_size = sizeof ti;
    orch_adamw_params ap = test_adamw(1, 1e-3f, 0.0f, 0.0f);
    for (int b = 0; b < 3; b++) {
        const uint32_t x = bad_ids[b];
        uint32_t cnt;
        expect_err(c, A->adapter_destroy(c, x), ORCH_ERR_INVALID_ARGUMENT, "adapter_id");
        expect_err(c, A->adapter_tensor_count(c, x, 0, &cnt), ORCH_ERR_INVALID_ARGUMENT,
                   "adapter_id");
        expect_err(c, A->adapter_tensor_info(c, x, 0, 0, &ti), ORCH_ERR_INVALID_ARGUMENT,
                   "adapter_id");
        expect_err(c, A->adapter_tensor_read(c, x, 0, 0, buf, 4),
                   ORCH_ERR_INVALID_ARGUMENT, "adapter_id");
        expect_err(c, A->adapter_tensor_write(c, x, 0, 0, buf, 4),
                   ORCH_ERR_INVALID_ARGUMENT, "adapter_id");
        expect_err(c, A->adapter_grads_zero(c, x), ORCH_ERR_INVALID_ARGUMENT,
                   "adapter_id");
        expect_err(c, A->adapter_grads_read(c, x, 0, 1, buf), ORCH_ERR_INVALID_ARGUMENT,
                   "adapter_id");
        expect_err(c, A->adapter_grads_write(c, x, 0, 1, buf), ORCH_ERR_INVALID_ARGUMENT,
                   "adapter_id");
        expect_err(c,
                   A->adapter_forward_backward(c, x, r.tokens, r.targets_t, r.B, r.T,
                                               1.0f, &loss),
                   ORCH_ERR_INVALID_ARGUMENT, "adapter_id");
        expect_err(c, A->adapter_eval_loss(c, x, r.tokens, r.targets_t, r.B, r.T, &loss),
                   ORCH_ERR_INVALID_ARGUMENT, "adapter_id");
        expect_err(c, A->adapter_optimizer_step(c, x, &ap, NULL),
                   ORCH_ERR_INVALID_ARGUMENT, "adapter_id");
    }
    /* Kinds, indices, byte counts, ranges, batches. */
    uint32_t cnt;
    expect_err(c, A->adapter_tensor_count(c, r.id, 3, &cnt), ORCH_ERR_INVALID_ARGUMENT,
               "kind");
    expect_err(c, A->adapter_tensor_info(c, r.id, 0, r.t.n, &ti),
               ORCH_ERR_INVALID_ARGUMENT, "index");
    expect_err(c, A->adapter_tensor_read(c, r.id, 0, 0, buf, 4),
               ORCH_ERR_INVALID_ARGUMENT, "bytes");
    expect_err(c, A->adapter_grads_read(c, r.id, r.t.total, 1, buf),
               ORCH_ERR_INVALID_ARGUMENT, "adapter_grads_read");
    int32_t bad_tok[24];
    memcpy(bad_tok, r.tokens, sizeof bad_tok);
    bad_tok[5] = (int32_t)r.m.vocab_size;
    expect_err(
        c,
        A->adapter_forward_backward(c, r.id, bad_tok, r.targets_t, r.B, r.T, 1.0f, &loss),
        ORCH_ERR_INVALID_ARGUMENT, "token");
    /* A NaN gradient: ORCH_ERR_NUMERIC, parameters and moments unchanged. */
    float *p0 = adapter_read_all(c, r.id, ORCH_TENSOR_PARAM, &r.t);
    float nan_v = NAN;
    ck_assert_int_eq(A->adapter_grads_write(c, r.id, 3, 1, &nan_v), ORCH_OK);
    ck_assert_int_eq(A->adapter_optimizer_step(c, r.id, &ap, NULL), ORCH_ERR_NUMERIC);
    float *p1 = adapter_read_all(c, r.id, ORCH_TENSOR_PARAM, &r.t);
    float *m1 = adapter_read_all(c, r.id, ORCH_TENSOR_ADAM_M, &r.t);
    ck_assert(memcmp(p0, p1, r.t.total * sizeof(float)) == 0);
    ck_assert(test_max_abs(m1, r.t.total) == 0.0);
    free(p0);
    free(p1);
    free(m1);
    /* infer_forward: an unknown adapter id is refused, naming the sequence. */
    ck_assert_int_eq(A->kv_configure(c, 4, 8), ORCH_OK);
    int32_t table[4] = { 0, 1, 2, 3 };
    orch_seq_input s = test_seq_input(r.tokens, 4, 0, table, 1, ORCH_LOGITS_LAST);
    s.adapter_id = gone;
    float *lg = malloc(r.m.vocab_size * sizeof(float));
    expect_err(c, test_infer(A, c, &s, 1, lg, r.m.vocab_size), ORCH_ERR_INVALID_ARGUMENT,
               "adapter_id");
    free(lg);
    lora_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* coserve_forward                                                            */
/* ------------------------------------------------------------------------- */

static int32_t coserve(orch_engine_ctx *ctx, const orch_seq_input *seqs, uint32_t n,
                       float *logits, uint64_t cap, const orch_finetune_batch *ft,
                       uint32_t nft, float *losses) {
    return test_coserve(A, ctx, seqs, n, logits, cap, ft, nft, losses);
}

/* One context co-serves, another runs infer_forward then
 * adapter_forward_backward per micro-batch: a prefill of sequence 0 (all
 * logits, on the adapter) and 5 tokens of sequence 1 (base, last logit),
 * then a decode step of both, each with two micro-batches (the fixture
 * batch on the adapter and its first row at grad_scale 0.5 on a second
 * adapter). Logits, losses and both adapters' gradients agree within 1e-5
 * (only the rounding of paired products may differ; on these shapes the bits
 * were equal). */
START_TEST(test_coserve_equals_separate) {
    static const char *const opts[3] = { "threads=2", "threads=1", "skinny=0" };
    const int k = _i / 3;
    const char *opt = opts[_i % 3];
    lora_run r[2];
    uint32_t id2[2];
    for (int c = 0; c < 2; c++) {
        lora_open(&r[c], k, opt);
        orch_lora_desc d = test_lora_desc(
            2, 4.0f, ORCH_LORA_TARGET_ATTN_OUT | ORCH_LORA_TARGET_MLP_DOWN, 3);
        ck_assert_int_eq(A->adapter_create(r[c].ctx, &d, &id2[c]), ORCH_OK);
        ck_assert_int_eq(A->kv_configure(r[c].ctx, 4, 16), ORCH_OK);
    }
    ck_assert_uint_eq(id2[0], id2[1]);
    const uint32_t V = r[0].m.vocab_size, T = r[0].T, B = r[0].B;
    const int32_t *tok = r[0].tokens, *tgt = r[0].targets_t;
    int32_t t0[4] = { 3, 0, 5, 7 }, t1[4] = { 1, 6, 2, 4 };
    float *lc = malloc((size_t)(T + 2) * V * sizeof(float));
    float *ls = malloc((size_t)(T + 2) * V * sizeof(float));
    for (int step = 0; step < 2; step++) {
        orch_seq_input s[2];
        if (step == 0) {
            s[0] = test_seq_input(tok, T - 1, 0, t0, 3, ORCH_LOGITS_ALL);
            s[1] = test_seq_input(tok + T, 5, 0, t1, 2, ORCH_LOGITS_LAST);
        } else {
            s[0] = test_seq_input(tok + T - 1, 1, T - 1, t0, 3, ORCH_LOGITS_LAST);
            s[1] = test_seq_input(tok + T + 5, 1, 5, t1, 2, ORCH_LOGITS_LAST);
        }
        s[0].adapter_id = r[0].id;
        const uint64_t rows = step == 0 ? T : 2;
        orch_finetune_batch ft[2] = { test_ft_batch(r[0].id, tok, tgt, B, T, 1.0f),
                                      test_ft_batch(id2[0], tok, tgt, 1, T, 0.5f) };
        float losses[2] = { -1.0f, -1.0f }, want[2];
        ck_assert_int_eq(coserve(r[0].ctx, s, 2, lc, rows * V, ft, 2, losses), ORCH_OK);
        ck_assert_int_eq(test_infer(A, r[1].ctx, s, 2, ls, rows * V), ORCH_OK);
        ck_assert_int_eq(A->adapter_forward_backward(r[1].ctx, r[1].id, tok, tgt, B, T,
                                                     1.0f, &want[0]),
                         ORCH_OK);
        ck_assert_int_eq(
            A->adapter_forward_backward(r[1].ctx, id2[1], tok, tgt, 1, T, 0.5f, &want[1]),
            ORCH_OK);
        const double dl = test_max_diff(lc, ls, rows * V);
        ck_assert_msg(dl <= 1e-5, "[%s %s] step %d: coserve logits differ by %g",
                      fixtures[k], opt, step, dl);
        for (int i = 0; i < 2; i++)
            ck_assert_msg(fabsf(losses[i] - want[i]) <= 1e-5f,
                          "[%s %s] step %d ft %d: loss %.7f vs %.7f", fixtures[k], opt,
                          step, i, losses[i], want[i]);
    }
    const uint32_t ids[2][2] = { { r[0].id, r[1].id }, { id2[0], id2[1] } };
    for (int a = 0; a < 2; a++) {
        lora_table t;
        adapter_table(r[0].ctx, ids[a][0], &t);
        float *gc = malloc(t.total * sizeof(float)),
              *gs = malloc(t.total * sizeof(float));
        ck_assert_int_eq(A->adapter_grads_read(r[0].ctx, ids[a][0], 0, t.total, gc),
                         ORCH_OK);
        ck_assert_int_eq(A->adapter_grads_read(r[1].ctx, ids[a][1], 0, t.total, gs),
                         ORCH_OK);
        const double d = test_max_diff(gc, gs, t.total), m = test_max_abs(gs, t.total);
        ck_assert_msg(m > 0.0, "adapter %d: no gradient", a);
        ck_assert_msg(d <= 1e-5 * m,
                      "[%s %s] adapter %d: gradients differ by %g (max %g)", fixtures[k],
                      opt, a, d, m);
        free(gc);
        free(gs);
    }
    check_base_frozen(&r[0], "after coserve_forward");
    free(lc);
    free(ls);
    lora_close(&r[0]);
    lora_close(&r[1]);
}
END_TEST

/* A model whose head (16384 x 256) spans several 2 MB column blocks of the
 * paired product per thread: co-served equals separate (within 1e-5) on
 * random weights, a random adapter (B not zero) on every target, three
 * sequences (two on the adapter) prefilling 8 tokens and then decoding. */
START_TEST(test_coserve_blocks) {
    orch_model_desc m = test_model_desc(16384, 32, 1, 4, 256);
    orch_engine_ctx *c[2] = { make_ctx(&m, "threads=2"), make_ctx(&m, "threads=2") };
    orch_lora_desc d = test_lora_desc(4, 8.0f, ORCH_LORA_TARGET_ALL, 11);
    uint32_t id[2];
    uint64_t rng = 99;
    lora_table t;
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(A->adapter_create(c[k], &d, &id[k]), ORCH_OK);
        ck_assert_int_eq(A->kv_configure(c[k], 4, 32), ORCH_OK);
    }
    adapter_table(c[0], id[0], &t);
    for (uint32_t i = 1; i < t.n; i += 2) { /* B: uniform in [-0.05, 0.05) */
        float *b = malloc(t.info[i].numel * sizeof(float));
        for (uint64_t e = 0; e < t.info[i].numel; e++)
            b[e] = (float)((double)(test_lcg64(&rng) >> 11) / 9007199254740992.0 - 0.5) *
                   0.1f;
        for (int k = 0; k < 2; k++)
            ck_assert_int_eq(A->adapter_tensor_write(c[k], id[k], ORCH_TENSOR_PARAM, i, b,
                                                     t.info[i].numel * sizeof(float)),
                             ORCH_OK);
        free(b);
    }
    int32_t tok[64], tgt[64];
    for (int i = 0; i < 64; i++) {
        tok[i] = (int32_t)(test_lcg64(&rng) >> 40) % 16384;
        tgt[i] = i % 7 == 3 ? -1 : (int32_t)(test_lcg64(&rng) >> 40) % 16384;
    }
    int32_t tables[3][4] = { { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 } };
    const uint64_t V = 16384;
    float *lg[2] = { malloc(3 * 8 * V * sizeof(float)),
                     malloc(3 * 8 * V * sizeof(float)) };
    for (int step = 0; step < 3; step++) {
        orch_seq_input s[3];
        const uint32_t n = step == 0 ? 8 : 1, pos = step == 0 ? 0 : 7 + (uint32_t)step;
        for (int q = 0; q < 3; q++) {
            s[q] =
                test_seq_input(tok + 16 * q + pos, n, pos, tables[q], 4, ORCH_LOGITS_ALL);
            s[q].adapter_id = q == 1 ? 0 : id[0];
        }
        orch_finetune_batch ft = test_ft_batch(id[0], tok, tgt, 2, 16, 1.0f);
        float lc = -1.0f, ls = -2.0f;
        ck_assert_int_eq(coserve(c[0], s, 3, lg[0], 3 * n * V, &ft, 1, &lc), ORCH_OK);
        ck_assert_int_eq(test_infer(A, c[1], s, 3, lg[1], 3 * n * V), ORCH_OK);
        ck_assert_int_eq(
            A->adapter_forward_backward(c[1], id[1], tok, tgt, 2, 16, 1.0f, &ls),
            ORCH_OK);
        const double dl = test_max_diff(lg[0], lg[1], 3 * n * V);
        ck_assert_msg(dl <= 1e-5, "step %d: coserve logits differ by %g", step, dl);
        ck_assert_msg(fabsf(lc - ls) <= 1e-5f, "step %d: loss %.7f vs %.7f", step, lc,
                      ls);
    }
    float *g[2] = { malloc(t.total * sizeof(float)), malloc(t.total * sizeof(float)) };
    for (int k = 0; k < 2; k++)
        ck_assert_int_eq(A->adapter_grads_read(c[k], id[k], 0, t.total, g[k]), ORCH_OK);
    const double dg = test_max_diff(g[0], g[1], t.total),
                 mg = test_max_abs(g[1], t.total);
    ck_assert_msg(mg > 0.0 && dg <= 1e-5 * mg, "gradients differ by %g (max %g)", dg, mg);
    for (int k = 0; k < 2; k++) {
        free(lg[k]);
        free(g[k]);
        A->context_destroy(c[k]);
    }
}
END_TEST

/* Either part alone; bad arguments change nothing. */
START_TEST(test_coserve_parts_and_errors) {
    lora_run r;
    lora_open(&r, _i, "threads=2");
    const uint32_t V = r.m.vocab_size, T = r.T;
    ck_assert_int_eq(A->kv_configure(r.ctx, 4, 16), ORCH_OK);
    int32_t t0[4] = { 0, 1, 2, 3 };
    orch_seq_input s = test_seq_input(r.tokens, T, 0, t0, 3, ORCH_LOGITS_LAST);
    s.adapter_id = r.id;
    float *lg = malloc((size_t)V * sizeof(float)),
          *want = malloc((size_t)V * sizeof(float));
    /* inference only */
    ck_assert_int_eq(coserve(r.ctx, &s, 1, lg, V, NULL, 0, NULL), ORCH_OK);
    ck_assert_int_eq(test_infer(A, r.ctx, &s, 1, want, V), ORCH_OK);
    ck_assert(memcmp(lg, want, V * sizeof(float)) == 0);
    /* fine-tuning only: the loss of adapter_eval_loss */
    orch_finetune_batch ft[2] = {
        test_ft_batch(r.id, r.tokens, r.targets_t, r.B, T, 1.0f),
        test_ft_batch(r.id, r.tokens, r.targets_t, r.B, T, 1.0f)
    };
    float losses[2] = { -1.0f, -1.0f }, ev;
    ck_assert_int_eq(coserve(r.ctx, NULL, 0, NULL, 0, ft, 1, losses), ORCH_OK);
    ck_assert_int_eq(
        A->adapter_eval_loss(r.ctx, r.id, r.tokens, r.targets_t, r.B, T, &ev), ORCH_OK);
    ck_assert(memcmp(&ev, &losses[0], sizeof ev) == 0);
    float *g0 = malloc(r.t.total * sizeof(float)),
          *g1 = malloc(r.t.total * sizeof(float));
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g0), ORCH_OK);
    /* Bad arguments: nothing runs (gradients and logits untouched). */
    memset(lg, 0, V * sizeof(float));
    orch_engine_ctx *c = r.ctx;
    ft[1].adapter_id = 999;
    expect_err(c, coserve(c, &s, 1, lg, V, ft, 2, losses), ORCH_ERR_INVALID_ARGUMENT,
               "ft[1]: adapter_id 999");
    ft[1].adapter_id = r.id;
    int32_t bad[24];
    memcpy(bad, r.tokens, sizeof bad);
    bad[0] = -5;
    ft[1].tokens = bad;
    expect_err(c, coserve(c, &s, 1, lg, V, ft, 2, losses), ORCH_ERR_INVALID_ARGUMENT,
               "ft[1]");
    ft[1].tokens = r.tokens;
    ft[1].struct_size = 8;
    expect_err(c, coserve(c, &s, 1, lg, V, ft, 2, losses), ORCH_ERR_INVALID_ARGUMENT,
               "struct_size");
    ft[1].struct_size = sizeof ft[1];
    expect_err(c, coserve(c, &s, 1, lg, V, ft, 2, NULL), ORCH_ERR_INVALID_ARGUMENT,
               "out_losses");
    expect_err(c, coserve(c, &s, 1, lg, V, NULL, 2, losses), ORCH_ERR_INVALID_ARGUMENT,
               "ft is NULL");
    expect_err(c, A->coserve_forward(c, NULL, NULL, 0, ft, 2, 12, losses),
               ORCH_ERR_INVALID_ARGUMENT, "ft_stride");
    s.adapter_id = 999;
    expect_err(c, coserve(c, &s, 1, lg, V, ft, 2, losses), ORCH_ERR_INVALID_ARGUMENT,
               "adapter_id 999");
    s.adapter_id = r.id;
    expect_err(c, coserve(c, &s, 1, lg, 1, ft, 2, losses), ORCH_ERR_CAPACITY, "logits");
    ck_assert(test_max_abs(lg, V) == 0.0);
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g1), ORCH_OK);
    ck_assert(memcmp(g0, g1, r.t.total * sizeof(float)) == 0);
    free(g0);
    free(g1);
    free(lg);
    free(want);
    lora_close(&r);
}
END_TEST

START_TEST(test_capabilities) {
    ck_assert(A->capabilities & ORCH_CAP_LORA);
    ck_assert(A->capabilities & ORCH_CAP_COSERVE);
    ck_assert(ORCH_API_HAS(A, coserve_forward));
    ck_assert(ORCH_API_HAS(A, adapter_create));
    ck_assert(ORCH_API_HAS(A, adapter_optimizer_step));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_lora");
    TCase *tc = tcase_create("torch");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_torch_forward, 0, N_FIXTURES * N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_gradients, 0, N_FIXTURES * N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_steps, 0, N_FIXTURES * N_VARIANTS);
    suite_add_tcase(s, tc);
    tc = tcase_create("model");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_capabilities);
    tcase_add_loop_test(tc, test_merged_weights, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_mixed_batch, 0, 2 * N_FIXTURES);
    tcase_add_loop_test(tc, test_mixed_ranks, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_fresh_adapter, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_finite_differences, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_determinism, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_bad_inputs, 0, 2);
    tcase_add_loop_test(tc, test_coserve_equals_separate, 0, 3 * N_FIXTURES);
    tcase_add_loop_test(tc, test_coserve_parts_and_errors, 0, N_FIXTURES);
    tcase_add_test(tc, test_coserve_blocks);
    tcase_add_loop_test(tc, test_bf16_steps, 0, N_FIXTURES);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
