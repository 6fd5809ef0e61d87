/*
 * test_mock_lora.c - the mock engine's LoRA adapters (ABI 1.4, the "LoRA
 * adapters" rules at the top of engines/mock/mock_engine.c): the table's
 * names, shapes and order for gpt2 and llama, the documented initialisation
 * (A uniform in [-1/sqrt(in), 1/sqrt(in)) from the seed, B zero, so a new
 * adapter leaves the loss unchanged), adapter gradients against finite
 * differences, that the base's weights and gradients are never touched,
 * that AdamW on the adapter lowers the loss, ids, and the errors that name
 * the field; ABI 1.5 fine-tuning streams (bits equal to
 * adapter_forward_backward at every chunk size, the adapter fixed while one
 * is open, errors and faults).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "tests/test_util.h"

TEST_ENGINE_FIXTURE("mock")

static orch_engine_ctx *make_ctx(const orch_model_desc *m) {
    orch_engine_options o = { sizeof o, 1, 5, NULL };
    orch_engine_ctx *ctx = NULL;
    char err[512] = "";
    ck_assert_msg(A->context_create(m, &o, &ctx, err, sizeof err) == ORCH_OK, "%s", err);
    return ctx;
}

static orch_tensor_info info(orch_engine_ctx *ctx, uint32_t id, uint32_t i) {
    orch_tensor_info t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    ck_assert_int_eq(A->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, i, &t), ORCH_OK);
    return t;
}

/* The whole PARAM table of an adapter, flat (malloc'd). */
static float *read_all(orch_engine_ctx *ctx, uint32_t id, uint32_t kind, uint64_t *n) {
    uint32_t cnt = 0;
    ck_assert_int_eq(A->adapter_tensor_count(ctx, id, kind, &cnt), ORCH_OK);
    uint64_t total = 0;
    for (uint32_t i = 0; i < cnt; i++) total += info(ctx, id, i).numel;
    float *buf = malloc(total * sizeof *buf);
    ck_assert_ptr_nonnull(buf);
    uint64_t off = 0;
    for (uint32_t i = 0; i < cnt; i++) {
        orch_tensor_info t = info(ctx, id, i);
        ck_assert_uint_eq(t.offset, off);
        ck_assert_int_eq(A->adapter_tensor_read(ctx, id, kind, i, buf + off, t.numel * 4),
                         ORCH_OK);
        off += t.numel;
    }
    *n = total;
    return buf;
}

START_TEST(test_table_gpt2) {
    ck_assert(A->capabilities & ORCH_CAP_LORA);
    orch_model_desc m = test_model_desc(50, 16, 2, 2, 8);
    orch_engine_ctx *ctx = make_ctx(&m);
    orch_lora_desc d = test_lora_desc(4, 8.0f, ORCH_LORA_TARGET_ALL, 3);
    uint32_t id = 0, id2 = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    ck_assert_uint_ge(id, 1);
    uint32_t n = 0;
    ck_assert_int_eq(A->adapter_tensor_count(ctx, id, ORCH_TENSOR_ADAM_V, &n), ORCH_OK);
    ck_assert_uint_eq(n, 16);
    static const char *const want[8] = {
        "h.0.attn.c_attn.lora_A.weight", "h.0.attn.c_attn.lora_B.weight",
        "h.0.attn.c_proj.lora_A.weight", "h.0.attn.c_proj.lora_B.weight",
        "h.0.mlp.c_fc.lora_A.weight",    "h.0.mlp.c_fc.lora_B.weight",
        "h.0.mlp.c_proj.lora_A.weight",  "h.0.mlp.c_proj.lora_B.weight",
    };
    static const uint64_t shapes[8][2] = { { 4, 8 }, { 24, 4 }, { 4, 8 },  { 8, 4 },
                                           { 4, 8 }, { 32, 4 }, { 4, 32 }, { 8, 4 } };
    for (uint32_t i = 0; i < 8; i++) {
        orch_tensor_info t = info(ctx, id, i);
        ck_assert_str_eq(t.name, want[i]);
        ck_assert_uint_eq(t.dtype, ORCH_DTYPE_F32);
        ck_assert_uint_eq(t.flags, 0);
        ck_assert_uint_eq(t.shape[0], shapes[i][0]);
        ck_assert_uint_eq(t.shape[1], shapes[i][1]);
    }
    ck_assert_str_eq(info(ctx, id, 8).name, "h.1.attn.c_attn.lora_A.weight");
    /* Init: A in [-1/sqrt(in), 1/sqrt(in)) and not constant, B zero. */
    for (uint32_t i = 0; i < n; i++) {
        orch_tensor_info t = info(ctx, id, i);
        float *buf = malloc(t.numel * 4);
        ck_assert_int_eq(
            A->adapter_tensor_read(ctx, id, ORCH_TENSOR_PARAM, i, buf, t.numel * 4),
            ORCH_OK);
        double bound = 1.0 / sqrt((double)t.shape[1]), lo = 1, hi = -1;
        for (uint64_t j = 0; j < t.numel; j++) {
            if (i % 2)
                ck_assert(buf[j] == 0.0f);
            else
                ck_assert(buf[j] >= -bound && buf[j] < bound);
            lo = buf[j] < lo ? buf[j] : lo;
            hi = buf[j] > hi ? buf[j] : hi;
        }
        if (i % 2 == 0) ck_assert(hi - lo > bound / 2);
        free(buf);
    }
    /* The same seed gives the same A; another seed another; ids grow. */
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id2), ORCH_OK);
    ck_assert_uint_gt(id2, id);
    uint64_t na, nb;
    float *pa = read_all(ctx, id, ORCH_TENSOR_PARAM, &na);
    float *pb = read_all(ctx, id2, ORCH_TENSOR_PARAM, &nb);
    ck_assert_uint_eq(na, nb);
    ck_assert_int_eq(memcmp(pa, pb, na * 4), 0);
    ck_assert_int_eq(A->adapter_destroy(ctx, id2), ORCH_OK);
    orch_lora_desc d2 = test_lora_desc(4, 8.0f, ORCH_LORA_TARGET_ALL, 4);
    uint32_t id3 = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d2, &id3), ORCH_OK);
    ck_assert_uint_gt(id3, id2); /* never reused */
    free(pb);
    pb = read_all(ctx, id3, ORCH_TENSOR_PARAM, &nb);
    ck_assert_int_ne(memcmp(pa, pb, na * 4), 0);
    ck_assert_int_eq(A->adapter_destroy(ctx, id2), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(A->last_error(ctx), "adapter_id"));
    free(pa);
    free(pb);
    A->context_destroy(ctx);
}
END_TEST

START_TEST(test_table_llama) {
    orch_model_desc m = test_model_desc(40, 16, 1, 4, 16);
    m.arch = ORCH_ARCH_LLAMA;
    m.kv_heads = 2;
    m.mlp_width = 24;
    orch_engine_ctx *ctx = make_ctx(&m);
    orch_lora_desc d =
        test_lora_desc(2, 4.0f, ORCH_LORA_TARGET_ATTN_QKV | ORCH_LORA_TARGET_MLP_UP, 1);
    uint32_t id = 0, n = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    ck_assert_int_eq(A->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &n), ORCH_OK);
    ck_assert_uint_eq(n, 10);
    static const char *const want[10] = {
        "model.layers.0.self_attn.q_proj.lora_A.weight",
        "model.layers.0.self_attn.q_proj.lora_B.weight",
        "model.layers.0.self_attn.k_proj.lora_A.weight",
        "model.layers.0.self_attn.k_proj.lora_B.weight",
        "model.layers.0.self_attn.v_proj.lora_A.weight",
        "model.layers.0.self_attn.v_proj.lora_B.weight",
        "model.layers.0.mlp.gate_proj.lora_A.weight",
        "model.layers.0.mlp.gate_proj.lora_B.weight",
        "model.layers.0.mlp.up_proj.lora_A.weight",
        "model.layers.0.mlp.up_proj.lora_B.weight",
    };
    static const uint64_t out[10] = { 2, 16, 2, 8, 2, 8, 2, 24, 2, 24 };
    for (uint32_t i = 0; i < n; i++) {
        orch_tensor_info t = info(ctx, id, i);
        ck_assert_str_eq(t.name, want[i]);
        ck_assert_uint_eq(t.shape[0], out[i]);
        ck_assert_uint_eq(t.shape[1], i % 2 ? 2 : 16);
    }
    A->context_destroy(ctx);
}
END_TEST

START_TEST(test_errors_name_the_field) {
    orch_model_desc m = test_model_desc(50, 16, 1, 2, 8);
    orch_engine_ctx *ctx = make_ctx(&m);
    uint32_t id = 77;
    struct {
        orch_lora_desc d;
        const char *word;
    } bad[] = {
        { test_lora_desc(0, 1, 1, 0), "rank 0" },
        { test_lora_desc(9, 1, 1, 0), "rank 9" }, /* > width 8 */
        { test_lora_desc(2, 0, 1, 0), "alpha" },
        { test_lora_desc(2, NAN, 1, 0), "alpha" },
        { test_lora_desc(2, 1, 0, 0), "targets" },
        { test_lora_desc(2, 1, 0x10, 0), "targets" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(A->adapter_create(ctx, &bad[i].d, &id),
                         ORCH_ERR_INVALID_ARGUMENT);
        ck_assert_msg(strstr(A->last_error(ctx), bad[i].word), "%s: %s", bad[i].word,
                      A->last_error(ctx));
        ck_assert_uint_eq(id, 77);
    }
    /* rank 8 fits every gpt2 matrix of width 8 (c_fc [32,8]: min 8). */
    orch_lora_desc ok = test_lora_desc(8, 1, ORCH_LORA_TARGET_ALL, 0);
    ck_assert_int_eq(A->adapter_create(ctx, &ok, &id), ORCH_OK);
    ck_assert_int_eq(A->adapter_create(ctx, NULL, &id), ORCH_ERR_INVALID_ARGUMENT);
    float l = 0;
    int32_t tok[4] = { 1, 2, 3, 4 }, tgt[4] = { 2, 3, 4, 5 };
    ck_assert_int_eq(A->adapter_forward_backward(ctx, 99, tok, tgt, 1, 4, 1.0f, &l),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(A->last_error(ctx), "adapter_id 99"));
    tok[0] = 50;
    ck_assert_int_eq(A->adapter_forward_backward(ctx, id, tok, tgt, 1, 4, 1.0f, &l),
                     ORCH_ERR_INVALID_ARGUMENT);
    float g[4];
    uint64_t np = 0;
    free(read_all(ctx, id, ORCH_TENSOR_PARAM, &np));
    ck_assert_int_eq(A->adapter_grads_read(ctx, id, np - 2, 4, g),
                     ORCH_ERR_INVALID_ARGUMENT);
    A->context_destroy(ctx);
}
END_TEST

/* Loss through the adapter, gradients against central differences (in
 * double, of the f32 loss: tolerance 2e-3 relative + 1e-4, the loss being
 * an f32 mean of O(1) terms with a step of 1e-2). */
START_TEST(test_grads_and_base_untouched) {
    orch_model_desc m = test_model_desc(30, 16, 1, 2, 8);
    orch_engine_ctx *ctx = make_ctx(&m);
    orch_lora_desc d =
        test_lora_desc(2, 4.0f, ORCH_LORA_TARGET_ATTN_QKV | ORCH_LORA_TARGET_MLP_DOWN, 9);
    uint32_t id = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    int32_t tok[8] = { 1, 5, 9, 2, 7, 3, 0, 11 }, tgt[8] = { 5, 9, -1, 7, 3, 0, 11, 4 };
    float base_l = 0, ad_l = 0;
    ck_assert_int_eq(A->eval_loss(ctx, tok, tgt, 2, 4, &base_l), ORCH_OK);
    ck_assert_int_eq(A->adapter_eval_loss(ctx, id, tok, tgt, 2, 4, &ad_l), ORCH_OK);
    ck_assert(base_l == ad_l); /* B = 0: the adapter changes nothing */
    uint64_t np = 0;
    float *p = read_all(ctx, id, ORCH_TENSOR_PARAM, &np);
    /* Give B values so A gets gradients too. */
    for (uint64_t i = 0; i < np; i++) p[i] += 0.05f * (float)((int)(i % 7) - 3);
    uint32_t cnt = 0;
    ck_assert_int_eq(A->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &cnt), ORCH_OK);
    for (uint32_t i = 0; i < cnt; i++) {
        orch_tensor_info t = info(ctx, id, i);
        ck_assert_int_eq(A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, i,
                                                 p + t.offset, t.numel * 4),
                         ORCH_OK);
    }
    static test_table bt;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &bt);
    float *base_before = test_read_kind(A, ctx, ORCH_TENSOR_PARAM, &bt);
    ck_assert_int_eq(A->grads_zero(ctx), ORCH_OK);
    float *bg_before = test_read_grads(A, ctx, bt.total);
    ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
    float l0 = 0;
    ck_assert_int_eq(A->adapter_forward_backward(ctx, id, tok, tgt, 2, 4, 1.0f, &l0),
                     ORCH_OK);
    float *g = malloc(np * 4);
    ck_assert_int_eq(A->adapter_grads_read(ctx, id, 0, np, g), ORCH_OK);
    double gsq = 0;
    for (uint64_t i = 0; i < np; i++) gsq += (double)g[i] * g[i];
    ck_assert(gsq > 0);
    const double h = 1e-2;
    for (uint64_t i = 0; i < np; i += 3) {
        uint32_t ti = 0;
        while (ti + 1 < cnt && info(ctx, id, ti + 1).offset <= i) ti++;
        orch_tensor_info t = info(ctx, id, ti);
        float lp = 0, lm = 0, keep = p[i];
        p[i] = keep + (float)h;
        A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, ti, p + t.offset,
                                t.numel * 4);
        A->adapter_eval_loss(ctx, id, tok, tgt, 2, 4, &lp);
        p[i] = keep - (float)h;
        A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, ti, p + t.offset,
                                t.numel * 4);
        A->adapter_eval_loss(ctx, id, tok, tgt, 2, 4, &lm);
        p[i] = keep;
        A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, ti, p + t.offset,
                                t.numel * 4);
        double fd = ((double)lp - (double)lm) / (2 * h);
        ck_assert_msg(test_close(g[i], fd, 2e-3, 1e-4), "grad %llu: %g vs fd %g",
                      (unsigned long long)i, (double)g[i], fd);
    }
    /* The base: weights and gradients unchanged by adapter calls. */
    orch_adamw_params ap = test_adamw(1, 1e-2f, 0.0f, 1.0f);
    float norm = 0;
    ck_assert_int_eq(A->adapter_optimizer_step(ctx, id, &ap, &norm), ORCH_OK);
    ck_assert(fabs((double)norm - sqrt(gsq)) < 1e-5 * sqrt(gsq) + 1e-7);
    float *base_after = test_read_kind(A, ctx, ORCH_TENSOR_PARAM, &bt);
    float *bg_after = test_read_grads(A, ctx, bt.total);
    uint64_t nb = bt.total;
    ck_assert_int_eq(memcmp(base_before, base_after, nb * 4), 0);
    ck_assert_int_eq(memcmp(bg_before, bg_after, nb * 4), 0);
    free(p);
    free(g);
    free(base_before);
    free(base_after);
    free(bg_before);
    free(bg_after);
    A->context_destroy(ctx);
}
END_TEST

/* AdamW on the adapter alone lowers the loss, step after step. */
START_TEST(test_adamw_lowers_loss) {
    orch_model_desc m = test_model_desc(30, 16, 2, 2, 8);
    orch_engine_ctx *ctx = make_ctx(&m);
    orch_lora_desc d = test_lora_desc(4, 8.0f, ORCH_LORA_TARGET_ALL, 2);
    uint32_t id = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    int32_t tok[12], tgt[12];
    for (int i = 0; i < 12; i++) {
        tok[i] = (i * 7) % 30;
        tgt[i] = i % 4 == 0 ? -1 : (i * 11 + 3) % 30;
    }
    float first = 0, prev = 1e9f, l = 0;
    for (uint64_t s = 1; s <= 20; s++) {
        ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
        ck_assert_int_eq(A->adapter_forward_backward(ctx, id, tok, tgt, 2, 6, 1.0f, &l),
                         ORCH_OK);
        if (s == 1) first = l;
        ck_assert_msg(l <= prev, "step %llu: %g > %g", (unsigned long long)s, (double)l,
                      (double)prev);
        prev = l;
        orch_adamw_params ap = test_adamw(s, 5e-2f, 0.0f, 1.0f);
        ck_assert_int_eq(A->adapter_optimizer_step(ctx, id, &ap, NULL), ORCH_OK);
    }
    ck_assert_msg(l < first - 0.05f, "loss %g -> %g", (double)first, (double)l);
    /* Moments are readable and non-zero now. */
    uint64_t n = 0;
    float *mv = read_all(ctx, id, ORCH_TENSOR_ADAM_M, &n);
    double s = 0;
    for (uint64_t i = 0; i < n; i++) s += fabs(mv[i]);
    ck_assert(s > 0);
    free(mv);
    A->context_destroy(ctx);
}
END_TEST

/* infer_forward with adapter ids: an existing adapter gives the base's
 * logits (the mock's logits read no weights, so they are the merged
 * weight's too); an unknown id is refused and writes nothing. */
START_TEST(test_infer_with_adapter) {
    orch_model_desc m = test_model_desc(256, 16, 1, 2, 8);
    orch_engine_ctx *ctx = make_ctx(&m);
    ck_assert_int_eq(A->kv_configure(ctx, 4, 8), ORCH_OK);
    orch_lora_desc d = test_lora_desc(2, 4.0f, ORCH_LORA_TARGET_ALL, 1);
    uint32_t id = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    const int32_t prompt[2] = { 'a', 'b' }, t0[1] = { 0 }, t1[1] = { 1 }, t2[1] = { 2 };
    orch_seq_input s[2] = { test_seq_input(prompt, 2, 0, t0, 1, ORCH_LOGITS_LAST),
                            test_seq_input(prompt, 2, 0, t1, 1, ORCH_LOGITS_LAST) };
    s[1].adapter_id = id;
    float logits[2 * 256];
    ck_assert_int_eq(test_infer(A, ctx, s, 2, logits, 2 * 256), ORCH_OK);
    ck_assert_int_eq(memcmp(logits, logits + 256, 256 * sizeof(float)), 0);
    uint32_t best = 0;
    for (uint32_t v = 1; v < 256; v++)
        if (logits[256 + v] > logits[256 + best]) best = v;
    ck_assert_uint_eq(best, 'n'); /* "ab" -> 'n', as without an adapter */
    orch_seq_input bad = test_seq_input(prompt, 2, 0, t2, 1, ORCH_LOGITS_LAST);
    bad.adapter_id = id + 1;
    for (int i = 0; i < 256; i++) logits[i] = 7.0f;
    ck_assert_int_eq(test_infer(A, ctx, &bad, 1, logits, 256), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(A->last_error(ctx), "no such adapter"), "%s",
                  A->last_error(ctx));
    ck_assert(logits[0] == 7.0f);
    A->context_destroy(ctx);
}
END_TEST

/* ABI 1.5 streams: a micro-batch run a few rows at a time gives
 * adapter_forward_backward's loss and gradients bit for bit (the mock's
 * documented promise), the gradients only when the last backward row is
 * done; closing early leaves them untouched. */

static orch_ft_progress step(orch_engine_ctx *ctx, uint32_t stream, uint32_t rows) {
    orch_ft_progress pr;
    memset(&pr, 0, sizeof pr);
    pr.struct_size = sizeof pr;
    ck_assert_int_eq(A->coserve_step(ctx, NULL, NULL, 0, stream, rows, &pr), ORCH_OK);
    return pr;
}

START_TEST(test_stream_equals_forward_backward) {
    ck_assert(A->capabilities & ORCH_CAP_FT_STREAM);
    orch_model_desc m = test_model_desc(30, 16, 1, 2, 8);
    orch_engine_ctx *ctx = make_ctx(&m);
    orch_lora_desc d = test_lora_desc(2, 4.0f, ORCH_LORA_TARGET_ALL, 9);
    uint32_t id = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    uint64_t np = 0;
    float *p = read_all(ctx, id, ORCH_TENSOR_PARAM, &np);
    for (uint64_t i = 0; i < np; i++) p[i] += 0.05f * (float)((int)(i % 7) - 3);
    uint32_t cnt = 0;
    ck_assert_int_eq(A->adapter_tensor_count(ctx, id, ORCH_TENSOR_PARAM, &cnt), ORCH_OK);
    for (uint32_t i = 0; i < cnt; i++) {
        orch_tensor_info t = info(ctx, id, i);
        ck_assert_int_eq(A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, i,
                                                 p + t.offset, t.numel * 4),
                         ORCH_OK);
    }
    int32_t tok[8] = { 1, 5, 9, 2, 7, 3, 0, 11 }, tgt[8] = { 5, 9, -1, 7, 3, 0, 11, 4 };
    float want_l = 0;
    float *want = malloc(np * 4), *got = malloc(np * 4), *zero = calloc(np, 4);
    ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
    ck_assert_int_eq(A->adapter_forward_backward(ctx, id, tok, tgt, 2, 4, 0.5f, &want_l),
                     ORCH_OK);
    ck_assert_int_eq(A->adapter_grads_read(ctx, id, 0, np, want), ORCH_OK);
    const uint32_t chunks[] = { 1, 3, 5, 8, 16, 100 };
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
        orch_finetune_batch f = test_ft_batch(id, tok, tgt, 2, 4, 0.5f);
        uint32_t sid = 0;
        ck_assert_int_eq(A->ft_stream_open(ctx, &f, &sid), ORCH_OK);
        ck_assert_uint_ge(sid, 1);
        uint64_t work = 0;
        orch_ft_progress pr;
        do {
            ck_assert_int_eq(A->adapter_grads_read(ctx, id, 0, np, got), ORCH_OK);
            ck_assert_int_eq(memcmp(got, zero, np * 4), 0); /* untouched till the end */
            pr = step(ctx, sid, chunks[c]);
            work += pr.rows_this_step;
            ck_assert_uint_eq(pr.rows_total, 8);
            ck_assert_uint_le(pr.rows_this_step, chunks[c]);
            ck_assert(pr.backward_rows == 0 || pr.forward_rows == 8);
        } while (!pr.finished);
        ck_assert_uint_eq(work, 16);
        ck_assert_uint_eq(pr.backward_rows, 8);
        ck_assert(pr.loss == want_l);
        ck_assert_int_eq(A->adapter_grads_read(ctx, id, 0, np, got), ORCH_OK);
        ck_assert_int_eq(memcmp(got, want, np * 4), 0);
        /* a finished stream does no more work */
        pr = step(ctx, sid, 4);
        ck_assert_uint_eq(pr.rows_this_step, 0);
        ck_assert_uint_eq(pr.finished, 1);
        ck_assert_int_eq(A->adapter_grads_read(ctx, id, 0, np, got), ORCH_OK);
        ck_assert_int_eq(memcmp(got, want, np * 4), 0);
        ck_assert_int_eq(A->ft_stream_close(ctx, sid), ORCH_OK);
    }
    /* closed before the end: the gradients stay as they were */
    ck_assert_int_eq(A->adapter_grads_zero(ctx, id), ORCH_OK);
    orch_finetune_batch f = test_ft_batch(id, tok, tgt, 2, 4, 1.0f);
    uint32_t sid = 0;
    ck_assert_int_eq(A->ft_stream_open(ctx, &f, &sid), ORCH_OK);
    (void)step(ctx, sid, 12);
    ck_assert_int_eq(A->ft_stream_close(ctx, sid), ORCH_OK);
    ck_assert_int_eq(A->adapter_grads_read(ctx, id, 0, np, got), ORCH_OK);
    ck_assert_int_eq(memcmp(got, zero, np * 4), 0);
    free(p);
    free(want);
    free(got);
    free(zero);
    A->context_destroy(ctx);
}
END_TEST

/* While a stream is open its adapter's parameters are fixed; ids, sizes and
 * faults are named. */
START_TEST(test_stream_rules) {
    orch_model_desc m = test_model_desc(256, 16, 1, 2, 8);
    orch_engine_ctx *ctx = make_ctx(&m);
    ck_assert_int_eq(A->kv_configure(ctx, 4, 8), ORCH_OK);
    orch_lora_desc d = test_lora_desc(2, 4.0f, ORCH_LORA_TARGET_ATTN_QKV, 1);
    uint32_t id = 0;
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    int32_t tok[4] = { 1, 2, 3, 4 }, tgt[4] = { 2, 3, 4, 5 };
    orch_finetune_batch f = test_ft_batch(id, tok, tgt, 1, 4, 1.0f);
    uint32_t sid = 0, sid2 = 0;
    ck_assert_int_eq(A->ft_stream_open(ctx, &f, &sid), ORCH_OK);
    tok[0] = 9; /* copied at open */
    ck_assert_int_eq(A->ft_stream_open(ctx, &f, &sid2), ORCH_OK);
    ck_assert_uint_ne(sid, sid2);
    orch_adamw_params ap = test_adamw(1, 1e-2f, 0.0f, 1.0f);
    float norm = 0, w[32] = { 0 };
    ck_assert_int_eq(A->adapter_optimizer_step(ctx, id, &ap, &norm), ORCH_ERR_STATE);
    ck_assert_msg(strstr(A->last_error(ctx), "open fine-tuning stream"), "%s",
                  A->last_error(ctx));
    orch_tensor_info t = info(ctx, id, 0);
    ck_assert_uint_le(t.numel, 32);
    ck_assert_int_eq(
        A->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, 0, w, t.numel * 4),
        ORCH_ERR_STATE);
    ck_assert_int_eq(
        A->adapter_tensor_write(ctx, id, ORCH_TENSOR_ADAM_M, 0, w, t.numel * 4), ORCH_OK);
    ck_assert_int_eq(A->adapter_destroy(ctx, id), ORCH_ERR_STATE);
    /* inference rides in the same call */
    const int32_t prompt[2] = { 'a', 'b' }, t0[1] = { 0 };
    orch_seq_input s = test_seq_input(prompt, 2, 0, t0, 1, ORCH_LOGITS_LAST);
    orch_infer_batch b = { sizeof b, 1, sizeof s, 0, &s };
    float logits[256];
    orch_ft_progress pr;
    memset(&pr, 0, sizeof pr);
    pr.struct_size = sizeof pr;
    ck_assert_int_eq(A->coserve_step(ctx, &b, logits, 256, sid, 3, &pr), ORCH_OK);
    ck_assert_uint_eq(pr.forward_rows, 3);
    uint32_t best = 0;
    for (uint32_t v = 1; v < 256; v++)
        if (logits[v] > logits[best]) best = v;
    ck_assert_uint_eq(best, 'n');
    /* errors */
    ck_assert_int_eq(A->coserve_step(ctx, NULL, NULL, 0, sid + 99, 1, &pr),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(A->last_error(ctx), "no such fine-tuning stream"), "%s",
                  A->last_error(ctx));
    pr.struct_size = 8;
    ck_assert_int_eq(A->coserve_step(ctx, NULL, NULL, 0, sid, 1, &pr),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(A->ft_stream_close(ctx, sid + 99), ORCH_ERR_INVALID_ARGUMENT);
    orch_finetune_batch bad = test_ft_batch(id + 7, tok, tgt, 1, 4, 1.0f);
    ck_assert_int_eq(A->ft_stream_open(ctx, &bad, &sid2), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(A->last_error(ctx), "no such adapter"), "%s",
                  A->last_error(ctx));
    bad = test_ft_batch(id, tok, tgt, 1, 4, 1.0f);
    bad.struct_size = 8;
    ck_assert_int_eq(A->ft_stream_open(ctx, &bad, &sid2), ORCH_ERR_INVALID_ARGUMENT);
    bad = test_ft_batch(id, tok, tgt, 0, 4, 1.0f);
    ck_assert_int_eq(A->ft_stream_open(ctx, &bad, &sid2), ORCH_ERR_INVALID_ARGUMENT);
    /* after both streams close the adapter may change again */
    ck_assert_int_eq(A->ft_stream_close(ctx, sid), ORCH_OK);
    ck_assert_int_eq(A->adapter_destroy(ctx, id), ORCH_ERR_STATE);
    ck_assert_int_eq(A->ft_stream_close(ctx, sid + 1), ORCH_OK);
    ck_assert_int_eq(A->adapter_optimizer_step(ctx, id, &ap, &norm), ORCH_OK);
    ck_assert_int_eq(A->adapter_destroy(ctx, id), ORCH_OK);
    A->context_destroy(ctx);
    /* an injected fault in coserve_step changes nothing */
    orch_engine_options o = { sizeof o, 1, 5, "fault=coserve_step:2" };
    ck_assert_int_eq(A->context_create(&m, &o, &ctx, NULL, 0), ORCH_OK);
    ck_assert_int_eq(A->adapter_create(ctx, &d, &id), ORCH_OK);
    f = test_ft_batch(id, tok, tgt, 1, 4, 1.0f);
    ck_assert_int_eq(A->ft_stream_open(ctx, &f, &sid), ORCH_OK);
    (void)step(ctx, sid, 2);
    pr.struct_size = sizeof pr;
    ck_assert_int_eq(A->coserve_step(ctx, NULL, NULL, 0, sid, 2, &pr), ORCH_ERR_INTERNAL);
    pr = step(ctx, sid, 2);
    ck_assert_uint_eq(pr.forward_rows, 4);
    /* a context destroyed with a stream open frees it */
    A->context_destroy(ctx);
}
END_TEST

int main(void) {
    test_default_engine_path();
    unsetenv("ORCH_MOCK_FAULT");
    Suite *s = suite_create("mock_lora");
    TCase *tc = tcase_create("lora");
    tcase_set_timeout(tc, 30);
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_add_test(tc, test_table_gpt2);
    tcase_add_test(tc, test_table_llama);
    tcase_add_test(tc, test_errors_name_the_field);
    tcase_add_test(tc, test_grads_and_base_untouched);
    tcase_add_test(tc, test_adamw_lowers_loss);
    tcase_add_test(tc, test_infer_with_adapter);
    tcase_add_test(tc, test_stream_equals_forward_backward);
    tcase_add_test(tc, test_stream_rules);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
