/*
 * test_cuda_lora.c - LoRA adapters of the CUDA engine (ABI 1.4,
 * ORCH_CAP_LORA; engines/cuda/cuda_lora.cu), with the checks
 * tests/test_cpu_lora.c makes of the CPU engine:
 *
 *   - against PyTorch: tests/fixtures/cpu_{gpt2,llama}_tiny_lora{,_sub}
 *     .safetensors (GPT-2 all targets rank 4 / c_proj + c_fc rank 3; LLaMA
 *     with GQA and an untied head, all targets rank 4 / q,k,v + down_proj
 *     rank 2), the fixture's A and B written through the adapter table:
 *     infer_forward logits with the sequences' adapter_id and
 *     adapter_eval_loss within 1e-4 absolute; each adapter gradient tensor
 *     within 1e-3 of its largest reference entry; 10 adapter-only AdamW
 *     steps with clipping and decay: losses within 1e-4, gradient norms
 *     within 1e-4 relative, final A/B within 1e-4 absolute (the tolerances
 *     of test_cpu_lora.c);
 *   - the base stays frozen: base gradients read zero, base moments zero
 *     and every base parameter keeps the fixture's bits;
 *   - gradients accumulate (grad_scale), grads_write/read round-trip;
 *   - a merged-weight context (W + (alpha/rank) B A through tensor_write,
 *     no adapter) gives the adapter's eval loss and logits within 1e-4;
 *   - mixed batches: two adapters and the base in one infer_forward (one
 *     forward, and a prefill then decode steps), each sequence equal to its
 *     own merged model within 1e-4;
 *   - a fresh adapter has the CPU engine's table (names, shapes, order,
 *     flags) and the CPU engine's A bits for the same seed, B zero, leaves
 *     the loss with the base's bits; ids start at 1 and are never reused;
 *   - parity with the CPU engine on the same adapter: loss 1e-5, gradients
 *     1e-4 relative, mixed-batch logits 1e-4, three AdamW steps (A/B 1e-5);
 *   - same inputs give the same bits;
 *   - bad inputs: rank 0, rank above min(in, out) (naming the matrix),
 *     alpha <= 0 or NaN, no/unknown targets, reserved words, short
 *     struct_size, NULL pointers, unknown/destroyed ids on every call, bad
 *     kinds/indices/bytes/ranges, an unknown adapter_id in infer_forward,
 *     a NaN gradient (ORCH_ERR_NUMERIC, nothing changed);
 *   - coserve_forward (ABI 1.4; engines/cuda/cuda_coserve.cu), GPT-2 and
 *     LLaMA: a prefill and two decode steps of three sequences (two
 *     adapters of different ranks and the base) each with two micro-batches
 *     on the two adapters equal infer_forward + adapter_forward_backward
 *     (logits 1e-5, losses 1e-5, gradients 1e-5 relative; the same bits on
 *     the emulator; a one-row shift of the logits fails the comparison),
 *     with 2 x (4 per layer + 1) fewer GEMMs per step on the emulator (its
 *     orch_cuda_emu_gemm_calls count: one pass over the base weights), and
 *     the CPU engine's coserve_forward (1e-4, 1e-5, 1e-4); no inference part
 *     (NULL batch, 0 sequences), no micro-batch, a micro-batch without
 *     targets, nothing; every bad input returns the CPU engine's status with
 *     nothing changed (logits, out_losses, gradients, KV);
 *   - capabilities: ORCH_CAP_LORA with every adapter member;
 *     ORCH_CAP_COSERVE with coserve_forward (tests/test_cuda_coserve.c);
 *     ORCH_CAP_FT_STREAM unset and the ABI 1.5 members NULL.
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

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */

static orch_engine_ctx *make_ctx(const engine_handle *h, const orch_model_desc *m) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(h, m, 0, 1, NULL, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", h->api->name, err);
    return ctx;
}

typedef struct lora_table {
    uint32_t n;
    uint64_t total;
    orch_tensor_info info[TEST_TABLE_MAX];
} lora_table;

static void adapter_table(const orch_engine_api *api, orch_engine_ctx *ctx, uint32_t id,
                          lora_table *t) {
    ck_assert_int_eq(api->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &t->n),
                     ORCH_OK);
    ck_assert(t->n <= TEST_TABLE_MAX);
    t->total = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        memset(&t->info[i], 0, sizeof t->info[i]);
        t->info[i].struct_size = sizeof t->info[i];
        ck_assert_int_eq(
            api->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &t->info[i]),
            ORCH_OK);
        ck_assert_uint_eq(t->info[i].offset, t->total);
        t->total += t->info[i].numel;
    }
}

static float *adapter_read_all(const orch_engine_api *api, orch_engine_ctx *ctx,
                               uint32_t id, uint32_t kind, const lora_table *t) {
    float *all = malloc((t->total ? t->total : 1) * sizeof(float));
    ck_assert_ptr_nonnull(all);
    for (uint32_t i = 0; i < t->n; i++)
        ck_assert_int_eq(api->adapter_tensor_read(ctx, id, kind, i,
                                                  all + t->info[i].offset,
                                                  t->info[i].numel * sizeof(float)),
                         ORCH_OK);
    return all;
}

static void adapter_write_all(const orch_engine_api *api, orch_engine_ctx *ctx,
                              uint32_t id, const lora_table *t, const float *all) {
    for (uint32_t i = 0; i < t->n; i++)
        ck_assert_int_eq(api->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, i,
                                                   all + t->info[i].offset,
                                                   t->info[i].numel * sizeof(float)),
                         ORCH_OK);
}

typedef struct lora_run {
    safetensors_file *f;
    orch_model_desc m;
    orch_engine_ctx *ctx;
    const orch_engine_api *api;
    uint32_t id, B, T, rank, targets;
    float alpha;
    const int32_t *tokens, *targets_t;
    lora_table t;
} lora_run;

/* A context of engine h with the fixture's base and adapter (the
 * fixture's lora.<name> tensors written through the adapter table). */
static void lora_open(lora_run *r, int k, const engine_handle *h) {
    r->f = test_fixture_open(fixtures[k]);
    r->m = test_fixture_model(r->f);
    r->api = h->api;
    r->ctx = make_ctx(h, &r->m);
    test_load_fixture_params(r->api, r->ctx, r->f);
    r->B = (uint32_t)test_fixture_meta(r->f, "batch");
    r->T = (uint32_t)test_fixture_meta(r->f, "seq_len");
    r->rank = (uint32_t)test_fixture_meta(r->f, "lora_rank");
    r->alpha = (float)test_fixture_meta(r->f, "lora_alpha");
    r->targets = (uint32_t)test_fixture_meta(r->f, "lora_targets");
    size_t n;
    r->tokens = test_fixture_get(r->f, "tokens", SAFETENSORS_I32, &n);
    r->targets_t = test_fixture_get(r->f, "targets", SAFETENSORS_I32, &n);
    orch_lora_desc d = test_lora_desc(r->rank, r->alpha, r->targets, 99);
    ck_assert_int_eq(r->api->adapter_create(r->ctx, &d, &r->id), ORCH_OK);
    adapter_table(r->api, r->ctx, r->id, &r->t);
    ck_assert_uint_eq(r->t.n, (uint32_t)test_fixture_meta(r->f, "lora_tensors"));
    for (uint32_t i = 0; i < r->t.n; i++) {
        char key[160];
        snprintf(key, sizeof key, "lora.%s", r->t.info[i].name);
        const float *src = test_fixture_f32(r->f, key, &n);
        ck_assert_uint_eq(n, r->t.info[i].numel);
        ck_assert_int_eq(r->api->adapter_tensor_write(r->ctx, r->id, ORCH_TENSOR_PARAM, i,
                                                      src, n * sizeof(float)),
                         ORCH_OK);
    }
}

static void lora_close(lora_run *r) {
    r->api->context_destroy(r->ctx);
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

/* Base gradients and moments zero; every base parameter has the fixture's
 * bits. (The CUDA engine keeps its base moments allocated from context
 * creation, so optimizer_bytes is not 0 as on the CPU engine; that they
 * stay zero is what shows they were never touched.) */
static void check_base_frozen(const lora_run *r, const char *tag) {
    test_table t;
    test_read_table(A, r->ctx, ORCH_TENSOR_PARAM, &t);
    float *g = test_read_grads(A, r->ctx, t.total);
    ck_assert_msg(test_max_abs(g, t.total) == 0.0, "%s: base gradients touched", tag);
    free(g);
    for (uint32_t kind = ORCH_TENSOR_ADAM_M; kind <= ORCH_TENSOR_ADAM_V; kind++) {
        float *mv = test_read_kind(A, r->ctx, kind, &t);
        ck_assert_msg(test_max_abs(mv, t.total) == 0.0, "%s: base moments touched", tag);
        free(mv);
    }
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
}

/* Logits of every position of the fixture's batch through infer_forward of
 * engine api, sequence b on adapters[b] (NULL: all 0), malloc'd [B*T*V]. */
static float *batch_logits(const orch_engine_api *api, orch_engine_ctx *ctx,
                           const lora_run *r, const uint32_t *adapters) {
    const uint32_t B = r->B, T = r->T, V = r->m.vocab_size;
    ck_assert_int_eq(api->kv_configure(ctx, 4, 4 * B), ORCH_OK);
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
    int32_t st = test_infer(api, ctx, s, B, logits, (uint64_t)B * T * V);
    ck_assert_msg(st == ORCH_OK, "infer_forward: %s", api->last_error(ctx));
    return logits;
}

/* The same rows through a prefill of `prefill` tokens per sequence, then
 * one-token decode steps (malloc'd). */
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
    const int k = _i;
    lora_run r;
    lora_open(&r, k, &gpu);
    size_t nl, n1;
    const float *ref_logits = test_fixture_f32(r.f, "logits", &nl);
    const float ref_loss = test_fixture_f32(r.f, "loss", &n1)[0];
    float loss = -1.0f;
    ck_assert_int_eq(
        A->adapter_eval_loss(r.ctx, r.id, r.tokens, r.targets_t, r.B, r.T, &loss),
        ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f, "[%s] adapter eval loss %.7f vs %.7f",
                  fixtures[k], loss, ref_loss);
    uint32_t ids[2] = { r.id, r.id };
    float *logits = batch_logits(A, r.ctx, &r, ids);
    const double worst = test_max_diff(logits, ref_logits, nl);
    printf("test_cuda_lora: %s: loss %.7f vs torch %.7f, logits max diff %.3g\n",
           fixtures[k], loss, ref_loss, worst);
    ck_assert_msg(worst <= 1e-4, "[%s] adapter logits differ from torch by %g",
                  fixtures[k], worst);
    ck_assert_msg(test_max_abs(ref_logits, nl) > 0.05, "fixture logits too small");
    free(logits);
    lora_close(&r);
}
END_TEST

START_TEST(test_torch_gradients) {
    const int k = _i;
    lora_run r;
    lora_open(&r, k, &gpu);
    size_t n1;
    const float ref_loss = test_fixture_f32(r.f, "loss", &n1)[0];
    float loss = -1.0f;
    ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
    ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t, r.B,
                                                 r.T, 1.0f, &loss),
                     ORCH_OK);
    ck_assert_msg(fabsf(loss - ref_loss) <= 1e-4f, "[%s] loss %.7f vs %.7f", fixtures[k],
                  loss, ref_loss);
    float *g = malloc(r.t.total * sizeof(float));
    ck_assert_int_eq(A->adapter_grads_read(r.ctx, r.id, 0, r.t.total, g), ORCH_OK);
    double worst_rel = 0.0;
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
                      "[%s] gradient %s: max diff %g, max |ref| %g (rel %g)", fixtures[k],
                      ti->name, diff, scale, diff / scale);
        if (diff / scale > worst_rel) worst_rel = diff / scale;
    }
    printf("test_cuda_lora: %s: adapter gradients within %.3g relative of torch\n",
           fixtures[k], worst_rel);
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
    const int k = _i;
    lora_run r;
    lora_open(&r, k, &gpu);
    const int steps = (int)test_fixture_meta(r.f, "steps");
    size_t ns, nn;
    const float *ref_losses = test_fixture_f32(r.f, "train_losses", &ns);
    const float *ref_norms = test_fixture_f32(r.f, "grad_norms", &nn);
    ck_assert_int_eq((int)ns, steps);
    double worst_loss = 0.0, worst_norm = 0.0, worst_final = 0.0;
    for (int s = 0; s < steps; s++) {
        float loss = -1.0f, norm = -1.0f;
        ck_assert_int_eq(A->adapter_grads_zero(r.ctx, r.id), ORCH_OK);
        ck_assert_int_eq(A->adapter_forward_backward(r.ctx, r.id, r.tokens, r.targets_t,
                                                     r.B, r.T, 1.0f, &loss),
                         ORCH_OK);
        ck_assert_msg(fabsf(loss - ref_losses[s]) <= 1e-4f,
                      "[%s] step %d: loss %.7f vs torch %.7f", fixtures[k], s + 1, loss,
                      ref_losses[s]);
        orch_adamw_params p = adam_of(r.f, (uint64_t)s + 1);
        ck_assert_int_eq(A->adapter_optimizer_step(r.ctx, r.id, &p, &norm), ORCH_OK);
        ck_assert_msg(fabsf(norm - ref_norms[s]) <= 1e-4f * ref_norms[s] + 1e-6f,
                      "[%s] step %d: grad norm %.7f vs torch %.7f", fixtures[k], s + 1,
                      norm, ref_norms[s]);
        worst_loss = fmax(worst_loss, fabs((double)loss - ref_losses[s]));
        worst_norm = fmax(worst_norm, fabs((double)norm - ref_norms[s]) / ref_norms[s]);
    }
    ck_assert_msg(ref_losses[steps - 1] < ref_losses[0] - 0.5f, "fixture should learn");
    float *p = adapter_read_all(A, r.ctx, r.id, ORCH_TENSOR_PARAM, &r.t);
    for (uint32_t i = 0; i < r.t.n; i++) {
        char key[160];
        snprintf(key, sizeof key, "final.%s", r.t.info[i].name);
        size_t n;
        const float *ref = test_fixture_f32(r.f, key, &n);
        const double diff = test_max_diff(p + r.t.info[i].offset, ref, n);
        ck_assert_msg(diff <= 1e-4, "[%s] final %s differs from torch by %g", fixtures[k],
                      r.t.info[i].name, diff);
        worst_final = fmax(worst_final, diff);
    }
    printf("test_cuda_lora: %s: %d steps: losses within %.3g, norms %.3g relative, "
           "final A/B %.3g of torch\n",
           fixtures[k], steps, worst_loss, worst_norm, worst_final);
    float *m = adapter_read_all(A, r.ctx, r.id, ORCH_TENSOR_ADAM_M, &r.t);
    ck_assert(test_max_abs(m, r.t.total) > 0.0);
    free(m);
    free(p);
    check_base_frozen(&r, "after adapter_optimizer_step");
    lora_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Merged weights, mixed batches, fresh adapters                              */
/* ------------------------------------------------------------------------- */

/* A CUDA context with the fixture base and W + scale * B A on every adapted
 * matrix (adapter parameters `ad`, table r->t). */
static orch_engine_ctx *merged_ctx(const lora_run *r, const float *ad) {
    orch_engine_ctx *m = make_ctx(&gpu, &r->m);
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
    lora_open(&r, k, &gpu);
    float *ad = adapter_read_all(A, r.ctx, r.id, ORCH_TENSOR_PARAM, &r.t);
    orch_engine_ctx *m = merged_ctx(&r, ad);
    float la = -1.0f, lm = -2.0f;
    ck_assert_int_eq(
        A->adapter_eval_loss(r.ctx, r.id, r.tokens, r.targets_t, r.B, r.T, &la), ORCH_OK);
    ck_assert_int_eq(A->eval_loss(m, r.tokens, r.targets_t, r.B, r.T, &lm), ORCH_OK);
    ck_assert_msg(fabsf(la - lm) <= 1e-4f, "[%s] adapter loss %.7f vs merged %.7f",
                  fixtures[k], la, lm);
    uint32_t ids[2] = { r.id, r.id };
    float *x = batch_logits(A, r.ctx, &r, ids);
    float *y = batch_logits(A, m, &r, NULL);
    const uint64_t n = (uint64_t)r.B * r.T * r.m.vocab_size;
    const double worst = test_max_diff(x, y, n);
    printf("test_cuda_lora: %s: adapter vs merged weights: loss %.3g, logits %.3g\n",
           fixtures[k], fabs((double)la - lm), worst);
    ck_assert_msg(worst <= 1e-4, "[%s] adapter logits vs merged: %g", fixtures[k], worst);
    float *z = batch_logits(A, r.ctx, &r, NULL);
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
 * merged model, in one forward and through a prefill and decode steps. */
START_TEST(test_mixed_batch) {
    const int k = _i;
    lora_run r;
    lora_open(&r, k, &gpu);
    float *ad1 = adapter_read_all(A, r.ctx, r.id, ORCH_TENSOR_PARAM, &r.t);
    orch_lora_desc d = test_lora_desc(r.rank, r.alpha, r.targets, 5);
    uint32_t id2 = 0;
    ck_assert_int_eq(A->adapter_create(r.ctx, &d, &id2), ORCH_OK);
    float *ad2 = malloc(r.t.total * sizeof(float));
    for (uint64_t e = 0; e < r.t.total; e++) ad2[e] = -0.7f * ad1[e];
    adapter_write_all(A, r.ctx, id2, &r.t, ad2);
    const uint64_t V = r.m.vocab_size, T = r.T;
    const uint32_t combos[4][2] = {
        { r.id, id2 }, { id2, 0 }, { 0, r.id }, { id2, id2 }
    };
    orch_engine_ctx *m1 = merged_ctx(&r, ad1);
    orch_engine_ctx *m2 = merged_ctx(&r, ad2);
    float *y1 = batch_logits(A, m1, &r, NULL), *y2 = batch_logits(A, m2, &r, NULL);
    float *y0 = batch_logits(A, r.ctx, &r, NULL);
    double worst_all = 0.0;
    for (int c = 0; c < 4; c++) {
        for (int mode = 0; mode < 2; mode++) {
            float *x = mode == 0 ? batch_logits(A, r.ctx, &r, combos[c])
                                 : batch_logits_decode(r.ctx, &r, combos[c], 8);
            for (uint32_t b = 0; b < 2; b++) {
                const uint32_t id = combos[c][b];
                const float *want = id == 0 ? y0 : id == r.id ? y1 : y2;
                const double worst =
                    test_max_diff(x + b * T * V, want + b * T * V, T * V);
                ck_assert_msg(worst <= 1e-4, "[%s] %s combo %d seq %u (adapter %u): %g",
                              fixtures[k], mode ? "decode" : "forward", c, b, id, worst);
                worst_all = fmax(worst_all, worst);
            }
            free(x);
        }
    }
    printf("test_cuda_lora: %s: mixed batches vs merged models: %.3g\n", fixtures[k],
           worst_all);
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

/* A fresh adapter on both engines: the same table and the same A bits for
 * the same seed; B zero; the base's loss bits; ids never reused. */
START_TEST(test_fresh_adapter) {
    const int k = _i;
    safetensors_file *f = test_fixture_open(fixtures[k]);
    orch_model_desc md = test_fixture_model(f);
    orch_engine_ctx *ctx = make_ctx(&gpu, &md), *cc = make_ctx(&cpu, &md);
    test_load_fixture_params(A, ctx, f);
    const uint32_t B = (uint32_t)test_fixture_meta(f, "batch");
    const uint32_t T = (uint32_t)test_fixture_meta(f, "seq_len");
    size_t n;
    const int32_t *tok = test_fixture_get(f, "tokens", SAFETENSORS_I32, &n);
    const int32_t *tgt = test_fixture_get(f, "targets", SAFETENSORS_I32, &n);
    float base = -1.0f, with = -2.0f, again = -3.0f;
    ck_assert_int_eq(A->eval_loss(ctx, tok, tgt, B, T, &base), ORCH_OK);
    const uint32_t target_sets[3] = { ORCH_LORA_TARGET_ALL,
                                      ORCH_LORA_TARGET_ATTN_QKV |
                                          ORCH_LORA_TARGET_MLP_DOWN,
                                      ORCH_LORA_TARGET_MLP_UP };
    uint32_t first = 0;
    for (int ts = 0; ts < 3; ts++) {
        orch_lora_desc d = test_lora_desc(3, 16.0f, target_sets[ts], 42 + (uint64_t)ts);
        uint32_t ig = 0, ic = 0;
        ck_assert_int_eq(A->adapter_create(ctx, &d, &ig), ORCH_OK);
        ck_assert_int_eq(CA->adapter_create(cc, &d, &ic), ORCH_OK);
        ck_assert_uint_eq(ig, (uint32_t)ts + 1);
        if (ts == 0) first = ig;
        lora_table tg, tc;
        adapter_table(A, ctx, ig, &tg);
        adapter_table(CA, cc, ic, &tc);
        ck_assert_uint_eq(tg.n, tc.n);
        ck_assert_uint_eq(tg.total, tc.total);
        for (uint32_t i = 0; i < tg.n; i++) {
            ck_assert_str_eq(tg.info[i].name, tc.info[i].name);
            ck_assert_uint_eq(tg.info[i].ndim, 2);
            ck_assert_uint_eq(tg.info[i].shape[0], tc.info[i].shape[0]);
            ck_assert_uint_eq(tg.info[i].shape[1], tc.info[i].shape[1]);
            ck_assert_uint_eq(tg.info[i].offset, tc.info[i].offset);
            ck_assert_uint_eq(tg.info[i].flags, 0);
            ck_assert_uint_eq(tg.info[i].dtype, ORCH_DTYPE_F32);
        }
        for (uint32_t kind = 0; kind < 3; kind++) {
            float *pg = adapter_read_all(A, ctx, ig, kind, &tg);
            float *pc = adapter_read_all(CA, cc, ic, kind, &tc);
            ck_assert_msg(memcmp(pg, pc, tg.total * sizeof(float)) == 0,
                          "[%s] targets 0x%x kind %u: not the CPU engine's bits",
                          fixtures[k], target_sets[ts], kind);
            if (kind == ORCH_TENSOR_PARAM)
                for (uint32_t i = 0; i < tg.n; i++) {
                    const float *v = pg + tg.info[i].offset;
                    if (i % 2) {
                        ck_assert(test_max_abs(v, tg.info[i].numel) == 0.0);
                    } else {
                        const double bound = 1.0 / sqrt((double)tg.info[i].shape[1]);
                        for (uint64_t e = 0; e < tg.info[i].numel; e++)
                            ck_assert(v[e] >= -bound && v[e] < bound);
                        ck_assert(test_max_abs(v, tg.info[i].numel) > 0.5 * bound);
                    }
                }
            else
                ck_assert(test_max_abs(pg, tg.total) == 0.0);
            free(pg);
            free(pc);
        }
        ck_assert_int_eq(A->adapter_eval_loss(ctx, ig, tok, tgt, B, T, &with), ORCH_OK);
        ck_assert_msg(memcmp(&base, &with, sizeof base) == 0,
                      "fresh adapter changes the loss: %.9g vs %.9g", with, base);
    }
    /* Ids are never reused. */
    uint32_t id4 = 0;
    orch_lora_desc d = test_lora_desc(2, 4.0f, ORCH_LORA_TARGET_MLP_DOWN, 1);
    ck_assert_int_eq(A->adapter_destroy(ctx, 3), ORCH_OK);
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id4), ORCH_OK);
    ck_assert_uint_eq(id4, 4);
    ck_assert_int_eq(A->adapter_destroy(ctx, 3), ORCH_ERR_INVALID_ARGUMENT);
    /* Training moves the adapter's loss; the base's stays bit for bit. */
    orch_adamw_params ap = test_adamw(1, 1e-2f, 0.0f, 1.0f);
    ck_assert_int_eq(A->adapter_forward_backward(ctx, first, tok, tgt, B, T, 1.0f, &with),
                     ORCH_OK);
    ck_assert_int_eq(A->adapter_optimizer_step(ctx, first, &ap, NULL), ORCH_OK);
    ck_assert_int_eq(A->adapter_eval_loss(ctx, first, tok, tgt, B, T, &with), ORCH_OK);
    ck_assert_msg(with < base, "one step did not lower the loss: %g vs %g", with, base);
    ck_assert_int_eq(A->eval_loss(ctx, tok, tgt, B, T, &again), ORCH_OK);
    ck_assert(memcmp(&base, &again, sizeof base) == 0);
    A->context_destroy(ctx);
    CA->context_destroy(cc);
    safetensors_close(f);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Parity with the CPU engine                                                 */
/* ------------------------------------------------------------------------- */

START_TEST(test_cpu_parity) {
    const int k = _i;
    lora_run g, c;
    lora_open(&g, k, &gpu);
    lora_open(&c, k, &cpu);
    /* a second adapter on each: the same seed, fixture B scaled */
    orch_lora_desc d = test_lora_desc(g.rank, g.alpha, g.targets, 7);
    uint32_t g2 = 0, c2 = 0;
    ck_assert_int_eq(A->adapter_create(g.ctx, &d, &g2), ORCH_OK);
    ck_assert_int_eq(CA->adapter_create(c.ctx, &d, &c2), ORCH_OK);
    float *ad = adapter_read_all(A, g.ctx, g.id, ORCH_TENSOR_PARAM, &g.t);
    for (uint64_t e = 0; e < g.t.total; e++) ad[e] *= 0.5f;
    adapter_write_all(A, g.ctx, g2, &g.t, ad);
    adapter_write_all(CA, c.ctx, c2, &c.t, ad);
    free(ad);
    double worst_g = 0.0, worst_p = 0.0, worst_l = 0.0;
    for (int step = 1; step <= 3; step++) {
        float lg = -1.0f, lc = -2.0f, ng = -1.0f, nc = -2.0f;
        ck_assert_int_eq(A->adapter_grads_zero(g.ctx, g.id), ORCH_OK);
        ck_assert_int_eq(CA->adapter_grads_zero(c.ctx, c.id), ORCH_OK);
        ck_assert_int_eq(A->adapter_forward_backward(g.ctx, g.id, g.tokens, g.targets_t,
                                                     g.B, g.T, 1.0f, &lg),
                         ORCH_OK);
        ck_assert_int_eq(CA->adapter_forward_backward(c.ctx, c.id, c.tokens, c.targets_t,
                                                      c.B, c.T, 1.0f, &lc),
                         ORCH_OK);
        ck_assert_msg(fabsf(lg - lc) <= 1e-5f, "[%s] step %d: loss %.7f vs cpu %.7f",
                      fixtures[k], step, lg, lc);
        worst_l = fmax(worst_l, fabs((double)lg - lc));
        float *gg = malloc(g.t.total * sizeof(float)), *gc = malloc(g.t.total * 4);
        ck_assert_int_eq(A->adapter_grads_read(g.ctx, g.id, 0, g.t.total, gg), ORCH_OK);
        ck_assert_int_eq(CA->adapter_grads_read(c.ctx, c.id, 0, c.t.total, gc), ORCH_OK);
        for (uint32_t i = 0; i < g.t.n; i++) {
            const orch_tensor_info *ti = &g.t.info[i];
            const double dd = test_max_diff(gg + ti->offset, gc + ti->offset, ti->numel);
            const double sc = test_max_abs(gc + ti->offset, ti->numel);
            ck_assert_msg(dd <= 1e-4 * sc + 1e-9,
                          "[%s] step %d: gradient %s: %g (max %g)", fixtures[k], step,
                          ti->name, dd, sc);
            if (sc > 0) worst_g = fmax(worst_g, dd / sc);
        }
        free(gg);
        free(gc);
        orch_adamw_params p = adam_of(g.f, (uint64_t)step);
        ck_assert_int_eq(A->adapter_optimizer_step(g.ctx, g.id, &p, &ng), ORCH_OK);
        ck_assert_int_eq(CA->adapter_optimizer_step(c.ctx, c.id, &p, &nc), ORCH_OK);
        ck_assert_msg(fabsf(ng - nc) <= 1e-5f * nc, "[%s] norm %.7f vs cpu %.7f",
                      fixtures[k], ng, nc);
        float *pg = adapter_read_all(A, g.ctx, g.id, ORCH_TENSOR_PARAM, &g.t);
        float *pc = adapter_read_all(CA, c.ctx, c.id, ORCH_TENSOR_PARAM, &c.t);
        const double dp = test_max_diff(pg, pc, g.t.total);
        ck_assert_msg(dp <= 5e-5, "[%s] step %d: A/B differ from cpu by %g", fixtures[k],
                      step, dp);
        worst_p = fmax(worst_p, dp);
        free(pg);
        free(pc);
    }
    /* mixed-batch logits: adapter 1 / adapter 2 / base on both engines */
    const uint32_t combos[3][2] = { { g.id, g2 }, { g2, 0 }, { 0, g.id } };
    const uint64_t n = (uint64_t)g.B * g.T * g.m.vocab_size;
    double worst_x = 0.0;
    for (int cb = 0; cb < 3; cb++) {
        float *xg = batch_logits(A, g.ctx, &g, combos[cb]);
        float *xc = batch_logits(CA, c.ctx, &c, combos[cb]); /* same ids on both */
        const double dx = test_max_diff(xg, xc, n);
        ck_assert_msg(dx <= 1e-4, "[%s] combo %d: logits differ from cpu by %g",
                      fixtures[k], cb, dx);
        worst_x = fmax(worst_x, dx);
        free(xg);
        free(xc);
    }
    printf("test_cuda_lora: %s: vs cpu engine: losses %.3g, gradients %.3g relative, "
           "A/B after 3 steps %.3g, mixed logits %.3g\n",
           fixtures[k], worst_l, worst_g, worst_p, worst_x);
    lora_close(&g);
    lora_close(&c);
}
END_TEST

START_TEST(test_determinism) {
    const int k = _i;
    float *g[2];
    for (int rep = 0; rep < 2; rep++) {
        lora_run r;
        lora_open(&r, k, &gpu);
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
    lora_open(&r, 2 * k, &gpu);
    orch_engine_ctx *c = r.ctx;
    uint32_t id = 77;
    orch_lora_desc d = test_lora_desc(0, 8.0f, ORCH_LORA_TARGET_ALL, 1);
    expect_err(c, A->adapter_create(c, &d, &id), ORCH_ERR_INVALID_ARGUMENT, "rank 0");
    const uint32_t lim = k == 0 ? 24 : 16;
    d.rank = lim + 1;
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
    float *p0 = adapter_read_all(A, c, r.id, ORCH_TENSOR_PARAM, &r.t);
    float nan_v = NAN;
    ck_assert_int_eq(A->adapter_grads_write(c, r.id, 3, 1, &nan_v), ORCH_OK);
    ck_assert_int_eq(A->adapter_optimizer_step(c, r.id, &ap, NULL), ORCH_ERR_NUMERIC);
    float *p1 = adapter_read_all(A, c, r.id, ORCH_TENSOR_PARAM, &r.t);
    float *m1 = adapter_read_all(A, c, r.id, ORCH_TENSOR_ADAM_M, &r.t);
    ck_assert(memcmp(p0, p1, r.t.total * sizeof(float)) == 0);
    ck_assert(test_max_abs(m1, r.t.total) == 0.0);
    free(p0);
    free(p1);
    free(m1);
    /* infer_forward: an unknown adapter id is refused, naming the field. */
    ck_assert_int_eq(A->kv_configure(c, 4, 8), ORCH_OK);
    int32_t table[4] = { 0, 1, 2, 3 };
    orch_seq_input s = test_seq_input(r.tokens, 4, 0, table, 1, ORCH_LOGITS_LAST);
    s.adapter_id = gone;
    float *lg = malloc(r.m.vocab_size * sizeof(float));
    expect_err(c, test_infer(A, c, &s, 1, lg, r.m.vocab_size), ORCH_ERR_INVALID_ARGUMENT,
               "adapter_id");
    /* and the context still serves the base and the adapter */
    s.adapter_id = r.id;
    ck_assert_int_eq(test_infer(A, c, &s, 1, lg, r.m.vocab_size), ORCH_OK);
    free(lg);
    lora_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* coserve_forward (ABI 1.4, ORCH_CAP_COSERVE; engines/cuda/cuda_coserve.cu)  */
/* ------------------------------------------------------------------------- */

/* A second adapter on r (q|k|v and the MLP up projection, seed 5) of the
 * given rank with B uniform in [-0.05, 0.05) from a fixed stream, so that it
 * changes the logits; the same values on every context. */
static uint32_t second_adapter(const lora_run *r, uint32_t rank) {
    orch_lora_desc d = test_lora_desc(
        rank, 4.0f, ORCH_LORA_TARGET_ATTN_QKV | ORCH_LORA_TARGET_MLP_UP, 5);
    uint32_t id = 0;
    ck_assert_int_eq(r->api->adapter_create(r->ctx, &d, &id), ORCH_OK);
    lora_table t;
    adapter_table(r->api, r->ctx, id, &t);
    uint64_t rng = 41;
    for (uint32_t i = 1; i < t.n; i += 2) {
        float *b = malloc(t.info[i].numel * sizeof(float));
        for (uint64_t e = 0; e < t.info[i].numel; e++)
            b[e] = (float)((double)(test_lcg64(&rng) >> 11) / 9007199254740992.0 - 0.5) *
                   0.1f;
        ck_assert_int_eq(r->api->adapter_tensor_write(r->ctx, id, ORCH_TENSOR_PARAM, i, b,
                                                      t.info[i].numel * sizeof(float)),
                         ORCH_OK);
        free(b);
    }
    return id;
}

/* The co-serving scenario: KV blocks of 4 positions, 4 per sequence; a
 * prefill (sequence 0: 11 tokens on the fixture adapter, every logit;
 * sequence 1: 5 tokens on the base, the last; sequence 2: 3 tokens on the
 * second adapter, every logit), then two decode steps of all three; each
 * step with two micro-batches: the fixture batch on the fixture adapter at
 * grad_scale 1 and one row of 7 tokens (two targets -1) on the second
 * adapter at 0.5. co != 0: coserve_forward; 0: infer_forward then
 * adapter_forward_backward per micro-batch. Logits of the three steps go to
 * lg (SCEN_ROWS x V), losses to loss[6]. */
#define SCEN_ROWS (11 + 1 + 3 + 3 + 3)
static void scenario(const lora_run *r, uint32_t id2, int co, float *lg, float *loss) {
    const orch_engine_api *api = r->api;
    const uint32_t V = r->m.vocab_size, B = r->B, T = r->T;
    const int32_t *tok = r->tokens;
    ck_assert_uint_eq(T, 12);
    ck_assert_int_eq(api->kv_configure(r->ctx, 4, 12), ORCH_OK);
    int32_t tables[3][4] = { { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 } };
    int32_t tgt2[7];
    memcpy(tgt2, r->targets_t, sizeof tgt2);
    tgt2[1] = tgt2[4] = -1;
    const uint32_t pre[3] = { 11, 5, 3 },
                   mode[3] = { ORCH_LOGITS_ALL, ORCH_LOGITS_LAST, ORCH_LOGITS_ALL };
    const uint32_t ad[3] = { r->id, 0, id2 };
    uint64_t row = 0;
    for (int step = 0; step < 3; step++) {
        orch_seq_input s[3];
        uint64_t rows = 0;
        for (int q = 0; q < 3; q++) {
            const uint32_t pos = step == 0 ? 0 : pre[q] + (uint32_t)step - 1;
            const uint32_t n = step == 0 ? pre[q] : 1;
            s[q] = test_seq_input(tok + 12 * q % (B * T) + pos, n, pos, tables[q], 4,
                                  mode[q]);
            s[q].adapter_id = ad[q];
            rows += mode[q] == ORCH_LOGITS_ALL ? n : 1;
        }
        orch_finetune_batch ft[2] = { test_ft_batch(r->id, tok, r->targets_t, B, T, 1.0f),
                                      test_ft_batch(id2, tok + 3, tgt2, 1, 7, 0.5f) };
        float *out = lg + row * V;
        if (co) {
            ck_assert_int_eq(
                test_coserve(api, r->ctx, s, 3, out, rows * V, ft, 2, loss + 2 * step),
                ORCH_OK);
        } else {
            ck_assert_int_eq(test_infer(api, r->ctx, s, 3, out, rows * V), ORCH_OK);
            for (int i = 0; i < 2; i++)
                ck_assert_int_eq(api->adapter_forward_backward(
                                     r->ctx, ft[i].adapter_id, ft[i].tokens,
                                     ft[i].targets, ft[i].batch, ft[i].seq_len,
                                     ft[i].grad_scale, &loss[2 * step + i]),
                                 ORCH_OK);
        }
        row += rows;
    }
    ck_assert_uint_eq(row, SCEN_ROWS);
}

/* Both adapters' gradients of r. */
static float *scenario_grads(const lora_run *r, uint32_t id2, uint64_t *n1,
                             uint64_t *n2) {
    lora_table t1, t2;
    adapter_table(r->api, r->ctx, r->id, &t1);
    adapter_table(r->api, r->ctx, id2, &t2);
    float *g = malloc((t1.total + t2.total) * sizeof(float));
    ck_assert_int_eq(r->api->adapter_grads_read(r->ctx, r->id, 0, t1.total, g), ORCH_OK);
    ck_assert_int_eq(r->api->adapter_grads_read(r->ctx, id2, 0, t2.total, g + t1.total),
                     ORCH_OK);
    *n1 = t1.total;
    *n2 = t2.total;
    return g;
}

/* Worst relative gradient difference of the two adapters (each against its
 * largest reference entry); both must have gradients. */
static double grads_rel(const float *g, const float *ref, uint64_t n1, uint64_t n2) {
    const double m1 = test_max_abs(ref, n1), m2 = test_max_abs(ref + n1, n2);
    ck_assert_msg(m1 > 0.0 && m2 > 0.0, "no gradient (%g, %g)", m1, m2);
    const double d1 = test_max_diff(g, ref, n1) / m1,
                 d2 = test_max_diff(g + n1, ref + n1, n2) / m2;
    return d1 > d2 ? d1 : d2;
}

/* cublasGemmEx calls so far when the engine is the CPU emulator's build
 * (tests/cuda_emu exports the count); -1 on a real device. */
static long long gemm_calls(void) {
    unsigned long long (*fn)(void) = NULL;
    void *sym = dlsym(gpu.dl, "orch_cuda_emu_gemm_calls");
    if (!sym) return -1;
    memcpy(&fn, &sym, sizeof fn);
    return (long long)fn();
}

/* Co-served (one context) equals separate calls (another) on GPT-2 and
 * LLaMA (GQA, untied head): logits within 1e-5, losses 1e-5, both
 * adapters' gradients 1e-5 relative (on the emulator the bits are equal;
 * cuBLAS on a device may round a GEMM of another row count differently);
 * the base stays frozen. The comparison can fail: the logits shifted by one
 * row, and the two adapters' gradients, differ far beyond it. */
START_TEST(test_coserve_equals_separate) {
    const int k = _i;
    lora_run r[2];
    uint32_t id2[2];
    float *lg[2], loss[2][6];
    long long gemms[2];
    for (int c = 0; c < 2; c++) {
        lora_open(&r[c], k, &gpu);
        id2[c] = second_adapter(&r[c], 2);
        lg[c] = malloc((size_t)SCEN_ROWS * r[c].m.vocab_size * sizeof(float));
        const long long g0 = gemm_calls();
        scenario(&r[c], id2[c], c == 0, lg[c], loss[c]);
        gemms[c] = gemm_calls() - g0;
    }
    /* one pass over the base weights: each step's two micro-batches save
     * their forward's base products (4 per layer: GPT-2 c_attn, c_proj,
     * c_fc, mlp c_proj; LLaMA q|k|v, o, gate|up, down) and LM head, every
     * other product (LoRA, attention, backward) is the same */
    if (gemms[0] >= 0) {
        const long long want = 3 * 2 * (4 * (long long)r[0].m.layers + 1);
        ck_assert_msg(gemms[1] - gemms[0] == want,
                      "%s: %lld GEMMs co-served, %lld separate: %lld fewer, want %lld",
                      fixtures[k], gemms[0], gemms[1], gemms[1] - gemms[0], want);
        printf("test_cuda_lora: %s: %lld GEMMs co-served, %lld in separate calls (the "
               "micro-batches' base products and LM heads ride on the inference's)\n",
               fixtures[k], gemms[0], gemms[1]);
    }
    const uint64_t nl = (uint64_t)SCEN_ROWS * r[0].m.vocab_size, V = r[0].m.vocab_size;
    const double dl = test_max_diff(lg[0], lg[1], nl);
    double dloss = 0.0;
    for (int i = 0; i < 6; i++) {
        const double d = fabs((double)loss[0][i] - loss[1][i]);
        dloss = d > dloss ? d : dloss;
        ck_assert_msg(loss[1][i] > 0.0f, "ft %d: no loss", i);
    }
    uint64_t n1, n2;
    float *g0 = scenario_grads(&r[0], id2[0], &n1, &n2);
    float *g1 = scenario_grads(&r[1], id2[1], &n1, &n2);
    const double dg = grads_rel(g0, g1, n1, n2);
    const int same = memcmp(lg[0], lg[1], nl * sizeof(float)) == 0 &&
                     memcmp(g0, g1, (n1 + n2) * sizeof(float)) == 0 &&
                     memcmp(loss[0], loss[1], sizeof loss[0]) == 0;
    printf("test_cuda_lora: %s: coserve_forward vs separate calls: logits %.3g, losses "
           "%.3g, gradients %.3g relative%s\n",
           fixtures[k], dl, dloss, dg, same ? " (the same bits)" : "");
    ck_assert_msg(dl <= 1e-5, "%s: logits differ by %g", fixtures[k], dl);
    ck_assert_msg(dloss <= 1e-5, "%s: losses differ by %g", fixtures[k], dloss);
    ck_assert_msg(dg <= 1e-5, "%s: gradients differ by %g", fixtures[k], dg);
    /* what a wrong row offset would give */
    ck_assert_msg(test_max_diff(lg[0] + V, lg[1], nl - V) > 1e-2,
                  "rows shifted by one compare equal: the logits carry no signal");
    const uint64_t nmin = n1 < n2 ? n1 : n2;
    ck_assert_msg(test_max_diff(g0, g1 + n1, nmin) > 1e-4 * test_max_abs(g1, n1),
                  "the two adapters' gradients compare equal");
    ck_assert_msg(fabsf(loss[1][0] - loss[1][1]) > 1e-3f, "the two losses are equal");
    check_base_frozen(&r[0], "after coserve_forward");
    free(g0);
    free(g1);
    for (int c = 0; c < 2; c++) {
        free(lg[c]);
        lora_close(&r[c]);
    }
}
END_TEST

/* The same scenario co-served by the CUDA engine and by the CPU engine
 * (engines/cpu/cpu_coserve.c) on the same weights and adapters: logits
 * 1e-4, losses 1e-5, gradients 1e-4 relative (the parity tolerances of
 * test_cpu_parity); the second adapter has rank 2, so the inference batch
 * mixes ranks on both engines. */
START_TEST(test_coserve_cpu_parity) {
    const int k = _i;
    lora_run r[2];
    uint32_t id2[2];
    float *lg[2], loss[2][6];
    for (int c = 0; c < 2; c++) {
        lora_open(&r[c], k, c == 0 ? &gpu : &cpu);
        id2[c] = second_adapter(&r[c], 2);
        lg[c] = malloc((size_t)SCEN_ROWS * r[c].m.vocab_size * sizeof(float));
        scenario(&r[c], id2[c], 1, lg[c], loss[c]);
    }
    const uint64_t nl = (uint64_t)SCEN_ROWS * r[0].m.vocab_size;
    const double dl = test_max_diff(lg[0], lg[1], nl);
    double dloss = 0.0;
    for (int i = 0; i < 6; i++) {
        const double d = fabs((double)loss[0][i] - loss[1][i]);
        dloss = d > dloss ? d : dloss;
    }
    uint64_t n1, n2;
    float *g0 = scenario_grads(&r[0], id2[0], &n1, &n2);
    float *g1 = scenario_grads(&r[1], id2[1], &n1, &n2);
    const double dg = grads_rel(g0, g1, n1, n2);
    printf("test_cuda_lora: %s: coserve_forward vs the cpu engine's: logits %.3g, losses "
           "%.3g, gradients %.3g relative\n",
           fixtures[k], dl, dloss, dg);
    ck_assert_msg(dl <= 1e-4, "%s: logits differ by %g", fixtures[k], dl);
    ck_assert_msg(dloss <= 1e-5, "%s: losses differ by %g", fixtures[k], dloss);
    ck_assert_msg(dg <= 1e-4, "%s: gradients differ by %g", fixtures[k], dg);
    free(g0);
    free(g1);
    for (int c = 0; c < 2; c++) {
        free(lg[c]);
        lora_close(&r[c]);
    }
}
END_TEST

/* Either part alone, against the separate calls on a second context: no
 * inference part (NULL batch, and a batch of 0 sequences) with two
 * micro-batches on two adapters; no micro-batch (ft NULL, out_losses NULL);
 * a micro-batch without targets (loss 0, no gradient) beside inference;
 * nothing at all. */
START_TEST(test_coserve_parts) {
    const int k = _i;
    lora_run r[2];
    uint32_t id2[2];
    for (int c = 0; c < 2; c++) {
        lora_open(&r[c], k, &gpu);
        id2[c] = second_adapter(&r[c], 2);
        ck_assert_int_eq(A->kv_configure(r[c].ctx, 4, 8), ORCH_OK);
    }
    const uint32_t V = r[0].m.vocab_size, B = r[0].B, T = r[0].T;
    const int32_t *tok = r[0].tokens, *tgt = r[0].targets_t;
    orch_finetune_batch ft[2][2];
    for (int c = 0; c < 2; c++) {
        ft[c][0] = test_ft_batch(r[c].id, tok, tgt, B, T, 1.0f);
        ft[c][1] = test_ft_batch(id2[c], tok, tgt, 1, T, 2.0f);
    }
    /* no inference part: a NULL batch, then a batch of 0 sequences */
    float lc[2] = { -1.0f, -1.0f }, ls[2];
    ck_assert_int_eq(test_coserve(A, r[0].ctx, NULL, 0, NULL, 0, ft[0], 2, lc), ORCH_OK);
    orch_infer_batch empty;
    memset(&empty, 0, sizeof empty);
    empty.struct_size = sizeof empty;
    empty.seq_stride = sizeof(orch_seq_input);
    float lc2 = -1.0f;
    ck_assert_int_eq(A->coserve_forward(r[0].ctx, &empty, NULL, 0, ft[0], 1,
                                        sizeof(orch_finetune_batch), &lc2),
                     ORCH_OK);
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < 2 - rep; i++)
            ck_assert_int_eq(A->adapter_forward_backward(r[1].ctx, ft[1][i].adapter_id,
                                                         tok, tgt, ft[1][i].batch, T,
                                                         ft[1][i].grad_scale, &ls[i]),
                             ORCH_OK);
    /* (the same bits on the emulator; a device's cuBLAS may round a GEMM of
     * another row count differently) */
    ck_assert_msg(fabsf(lc[0] - ls[0]) <= 1e-5f && fabsf(lc[1] - ls[1]) <= 1e-5f &&
                      fabsf(lc2 - ls[0]) <= 1e-5f,
                  "losses %.7f %.7f %.7f vs %.7f %.7f", lc[0], lc[1], lc2, ls[0], ls[1]);
    uint64_t n1, n2;
    float *g0 = scenario_grads(&r[0], id2[0], &n1, &n2);
    float *g1 = scenario_grads(&r[1], id2[1], &n1, &n2);
    ck_assert_msg(grads_rel(g0, g1, n1, n2) <= 1e-5, "no inference part: gradients");
    /* no micro-batch: infer_forward's logits */
    int32_t t0[4] = { 0, 1, 2, 3 };
    orch_seq_input s = test_seq_input(tok, T, 0, t0, 3, ORCH_LOGITS_ALL);
    s.adapter_id = r[0].id;
    float *lg = malloc((size_t)T * V * sizeof(float)),
          *want = malloc((size_t)T * V * sizeof(float));
    ck_assert_int_eq(test_coserve(A, r[0].ctx, &s, 1, lg, (uint64_t)T * V, NULL, 0, NULL),
                     ORCH_OK);
    ck_assert_int_eq(test_infer(A, r[1].ctx, &s, 1, want, (uint64_t)T * V), ORCH_OK);
    ck_assert(test_max_diff(lg, want, (uint64_t)T * V) <= 1e-5);
    ck_assert(test_max_abs(want, (uint64_t)T * V) > 0.0);
    /* a micro-batch without targets beside a decode step: loss 0, the
     * adapter's gradients unchanged, the logits infer_forward's */
    int32_t none[12];
    for (int i = 0; i < 12; i++) none[i] = -1;
    orch_finetune_batch fz = test_ft_batch(r[0].id, tok, none, 1, T, 1.0f);
    orch_seq_input d = test_seq_input(tok + T, 1, T, t0, 4, ORCH_LOGITS_LAST);
    d.adapter_id = r[0].id;
    float lz = -1.0f;
    ck_assert_int_eq(test_coserve(A, r[0].ctx, &d, 1, lg, V, &fz, 1, &lz), ORCH_OK);
    ck_assert_int_eq(test_infer(A, r[1].ctx, &d, 1, want, V), ORCH_OK);
    ck_assert(lz == 0.0f);
    ck_assert(test_max_diff(lg, want, V) <= 1e-5);
    float *g2 = scenario_grads(&r[0], id2[0], &n1, &n2);
    ck_assert(memcmp(g0, g2, (n1 + n2) * sizeof(float)) == 0);
    /* nothing at all */
    ck_assert_int_eq(test_coserve(A, r[0].ctx, NULL, 0, NULL, 0, NULL, 0, NULL), ORCH_OK);
    check_base_frozen(&r[0], "after coserve_forward");
    free(g0);
    free(g1);
    free(g2);
    free(lg);
    free(want);
    for (int c = 0; c < 2; c++) lora_close(&r[c]);
}
END_TEST

/* Every bad input: the CPU engine's status (run on a CPU context with the
 * same inputs) and a message naming the problem; nothing changes: the
 * logits and out_losses keep their sentinel, the adapter's gradients their
 * bits, and no KV is written (a later decode that reads the prefill's
 * positions is refused as reading slots never written). */
START_TEST(test_coserve_errors) {
    const int k = _i;
    lora_run r[2]; /* the CUDA engine, the CPU engine */
    for (int c = 0; c < 2; c++) {
        lora_open(&r[c], k, c == 0 ? &gpu : &cpu);
        ck_assert_int_eq(r[c].api->kv_configure(r[c].ctx, 4, 8), ORCH_OK);
    }
    const uint32_t V = r[0].m.vocab_size, B = r[0].B, T = r[0].T;
    const int32_t *tok = r[0].tokens, *tgt = r[0].targets_t;
    /* some gradients first, so that "unchanged" is not "zero" */
    float l0;
    for (int c = 0; c < 2; c++)
        ck_assert_int_eq(r[c].api->adapter_forward_backward(r[c].ctx, r[c].id, tok, tgt,
                                                            B, T, 1.0f, &l0),
                         ORCH_OK);
    uint64_t n = r[0].t.total;
    float *g0 = malloc(n * sizeof(float)), *g1 = malloc(n * sizeof(float));
    ck_assert_int_eq(A->adapter_grads_read(r[0].ctx, r[0].id, 0, n, g0), ORCH_OK);
    int32_t bt[4] = { 0, 1, 2, 3 }, bt_bad[4] = { 0, 1, 99, 3 };
    int32_t bad_tok[24], bad_tgt[24];
    memcpy(bad_tok, tok, sizeof bad_tok);
    memcpy(bad_tgt, tgt, sizeof bad_tgt);
    bad_tok[5] = (int32_t)V;
    bad_tgt[7] = -2;
    float *lg = malloc((size_t)T * V * sizeof(float));
    enum { N_CASES = 14 };
    static const char *const what[N_CASES] = {
        "ft is NULL", "out_losses", "ft_stride", "struct_size",    "reserved0",
        "ft[1]",      "ft[1]",      "ft[1]",     "adapter_id 999", "adapter_id 999",
        "logits",     "block",      "ft[0]",     "ft_stride"
    };
    for (int i = 0; i < N_CASES; i++) {
        int32_t st[2];
        for (int c = 0; c < 2; c++) {
            orch_finetune_batch ft[2] = { test_ft_batch(r[c].id, tok, tgt, B, T, 1.0f),
                                          test_ft_batch(r[c].id, tok, tgt, 1, T, 1.0f) };
            orch_seq_input s = test_seq_input(tok, T, 0, bt, 3, ORCH_LOGITS_ALL);
            s.adapter_id = r[c].id;
            const orch_finetune_batch *fp = ft;
            float losses[2] = { -7.0f, -7.0f }, *lp = losses;
            uint64_t cap = (uint64_t)T * V;
            uint32_t stride = sizeof(orch_finetune_batch), nft = 2;
            switch (i) {
            case 0: fp = NULL; break;
            case 1: lp = NULL; break;
            case 2: stride = 12; break;
            case 3: ft[1].struct_size = 8; break;
            case 4: ft[1].reserved0 = 1; break;
            case 5: ft[1].tokens = bad_tok; break;
            case 6: ft[1].targets = bad_tgt; break;
            case 7: ft[1].batch = 0; break;
            case 8: ft[1].adapter_id = 999; break;
            case 9: s.adapter_id = 999; break;
            case 10: cap = (uint64_t)T * V - 1; break;
            case 11: s.block_table = bt_bad; break;
            case 12: ft[0].seq_len = r[c].m.context + 1; break;
            default: stride = sizeof(orch_finetune_batch) + 2; break; /* misaligned */
            }
            orch_infer_batch b;
            memset(&b, 0, sizeof b);
            b.struct_size = sizeof b;
            b.n_seqs = 1;
            b.seq_stride = sizeof(orch_seq_input);
            b.seqs = &s;
            for (uint64_t e = 0; e < (uint64_t)T * V; e++) lg[e] = 42.0f;
            st[c] = r[c].api->coserve_forward(r[c].ctx, &b, lg, cap, fp, nft, stride, lp);
            const char *msg = r[c].api->last_error(r[c].ctx);
            ck_assert_msg(st[c] != ORCH_OK, "case %d (%s): accepted", i, what[i]);
            ck_assert_msg(strstr(msg, what[i]) != NULL, "case %d: \"%s\" lacks \"%s\"", i,
                          msg, what[i]);
            for (uint64_t e = 0; e < (uint64_t)T * V; e++)
                ck_assert_msg(lg[e] == 42.0f, "case %d: logits written", i);
            ck_assert_msg(losses[0] == -7.0f && losses[1] == -7.0f,
                          "case %d: out_losses written", i);
        }
        ck_assert_msg(st[0] == st[1], "case %d (%s): status %d, the cpu engine's %d", i,
                      what[i], st[0], st[1]);
    }
    ck_assert_int_eq(A->adapter_grads_read(r[0].ctx, r[0].id, 0, n, g1), ORCH_OK);
    ck_assert_msg(memcmp(g0, g1, n * sizeof(float)) == 0, "gradients changed");
    /* no KV written: position 0.. of blocks 0-2 were never written */
    orch_seq_input d = test_seq_input(tok + T, 1, T - 1, bt, 3, ORCH_LOGITS_LAST);
    expect_err(r[0].ctx, test_infer(A, r[0].ctx, &d, 1, lg, V), ORCH_ERR_STATE,
               "never written");
    free(g0);
    free(g1);
    free(lg);
    for (int c = 0; c < 2; c++) lora_close(&r[c]);
}
END_TEST

START_TEST(test_capabilities) {
    ck_assert(A->capabilities & ORCH_CAP_LORA);
    ck_assert(ORCH_API_HAS(A, adapter_create));
    ck_assert(ORCH_API_HAS(A, adapter_destroy));
    ck_assert(ORCH_API_HAS(A, adapter_tensor_count));
    ck_assert(ORCH_API_HAS(A, adapter_tensor_info));
    ck_assert(ORCH_API_HAS(A, adapter_tensor_read));
    ck_assert(ORCH_API_HAS(A, adapter_tensor_write));
    ck_assert(ORCH_API_HAS(A, adapter_grads_zero));
    ck_assert(ORCH_API_HAS(A, adapter_grads_read));
    ck_assert(ORCH_API_HAS(A, adapter_grads_write));
    ck_assert(ORCH_API_HAS(A, adapter_forward_backward));
    ck_assert(ORCH_API_HAS(A, adapter_eval_loss));
    ck_assert(ORCH_API_HAS(A, adapter_optimizer_step));
    /* one-pass co-serving, and the ABI 1.5 streams (tests/test_cuda_ft_stream.c) */
    ck_assert(A->capabilities & ORCH_CAP_COSERVE);
    ck_assert(ORCH_API_HAS(A, coserve_forward));
    ck_assert(A->capabilities & ORCH_CAP_FT_STREAM);
    ck_assert(ORCH_API_HAS(A, ft_stream_open));
    ck_assert(ORCH_API_HAS(A, coserve_step));
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_default_engine_path();
    TEST_LOAD_CUDA_AND_CPU("test_cuda_lora", gpu, cpu);
    printf("test_cuda_lora: %s (%s) against %s\n", gpu.path, gpu.probe_msg, cpu.path);
    Suite *s = suite_create("cuda_lora");
    TCase *tc = tcase_create("torch");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_capabilities);
    tcase_add_loop_test(tc, test_torch_forward, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_torch_gradients, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_torch_steps, 0, N_FIXTURES);
    suite_add_tcase(s, tc);
    tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_merged_weights, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_mixed_batch, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_fresh_adapter, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_cpu_parity, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_determinism, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_bad_inputs, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("coserve");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_coserve_equals_separate, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_coserve_cpu_parity, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_coserve_parts, 0, N_FIXTURES);
    tcase_add_loop_test(tc, test_coserve_errors, 0, N_FIXTURES);
    suite_add_tcase(s, tc);
    int rc = test_run_suite(s);
    engine_unload(&gpu);
    engine_unload(&cpu);
    return rc;
}
