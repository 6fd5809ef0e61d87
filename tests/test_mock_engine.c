/*
 * test_mock_engine.c - checks the documented, exact behaviour of the mock
 * engine (engines/mock/README.md): the next-token rule read back through the
 * block tables, the loss formula and its gradient (against an independent
 * re-implementation and finite differences), AdamW against a double-precision
 * reference, KV misuse messages, fault injection and the option parser.
 * Engine-independent ABI behaviour lives in test_conformance.c.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/bench/bench.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"
#include "tests/test_util.h"

static engine_handle mock;
#define API (mock.api)

static int32_t create(const orch_model_desc *m, uint64_t seed, const char *options,
                      orch_engine_ctx **ctx, char *err, uint32_t cap) {
    orch_engine_options o = { sizeof o, 1, seed, options };
    return API->context_create(m, &o, ctx, err, cap);
}

static orch_engine_ctx *ctx_with(uint32_t vocab, const char *options) {
    orch_model_desc m = test_model_desc(vocab, 64, 2, 2, 16);
    orch_engine_ctx *ctx = NULL;
    char err[512] = "";
    ck_assert_msg(create(&m, 7, options, &ctx, err, sizeof err) == ORCH_OK, "%s", err);
    return ctx;
}

/* infer_forward of one sequence. */
static int32_t forward1(orch_engine_ctx *ctx, const int32_t *tok, uint32_t n,
                        uint32_t start, const int32_t *table, uint32_t n_blocks,
                        uint32_t mode, float *logits, uint64_t cap) {
    orch_seq_input s = test_seq_input(tok, n, start, table, n_blocks, mode);
    return test_infer(API, ctx, &s, 1, logits, cap);
}

static int32_t argmax(const float *row, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        if (row[v] > row[best]) best = v;
    return (int32_t)best;
}

/* The documented rule, re-implemented. */
static int32_t rule_next(const int32_t *ids, uint32_t n, uint32_t vocab) {
    uint64_t S = 0;
    for (uint32_t i = 0; i < n; i++) S += (uint64_t)ids[i];
    return vocab >= 123 ? (int32_t)(97 + S % 26) : (int32_t)(S % vocab);
}

/* ------------------------------------------------------------------------- */

START_TEST(test_probe_and_caps) {
    char msg[128] = "";
    ck_assert_int_eq(API->probe(msg, sizeof msg), ORCH_OK);
    ck_assert_str_eq(msg, "mock engine, no numerics");
    ck_assert_int_eq(API->probe(NULL, 0), ORCH_OK);
    uint64_t want = ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_KV_COPY | ORCH_CAP_EVAL |
                    ORCH_CAP_DETERMINISTIC | ORCH_CAP_FAULT_INJECTION | ORCH_CAP_LORA |
                    ORCH_CAP_FT_STREAM;
    ck_assert_uint_eq(API->capabilities, want);
    ck_assert_str_eq(API->name, "mock");
}
END_TEST

START_TEST(test_greedy_text) {
    /* Byte vocabulary: "ab" -> 'n', then 't' (see README). */
    orch_engine_ctx *ctx = ctx_with(256, NULL);
    ck_assert_int_eq(API->kv_configure(ctx, 4, 16), ORCH_OK);
    int32_t seq[40] = { 'a', 'b' };
    uint32_t n = 2;
    const int32_t table[10] = { 9, 2, 14, 0, 5, 6, 7, 8, 1, 3 };
    float row[256];
    ck_assert_int_eq(forward1(ctx, seq, 2, 0, table, 10, ORCH_LOGITS_LAST, row, 256),
                     ORCH_OK);
    for (int k = 0; k < 20; k++) {
        int32_t next = argmax(row, 256);
        ck_assert_int_eq(next, rule_next(seq, n, 256));
        for (int32_t v = 0; v < 256; v++) ck_assert(row[v] == -(float)abs(v - next));
        if (k == 0) ck_assert_int_eq(next, 'n');
        if (k == 1) ck_assert_int_eq(next, 't');
        ck_assert(next >= 'a' && next <= 'z');
        seq[n] = next;
        ck_assert_int_eq(
            forward1(ctx, &seq[n], 1, n, table, 10, ORCH_LOGITS_LAST, row, 256), ORCH_OK);
        n++;
    }
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_small_vocab_rule) {
    orch_engine_ctx *ctx = ctx_with(64, NULL);
    ck_assert_int_eq(API->kv_configure(ctx, 8, 4), ORCH_OK);
    const int32_t tok[5] = { 60, 61, 62, 63, 5 };
    const int32_t table[1] = { 3 };
    float rows[5 * 64];
    ck_assert_int_eq(forward1(ctx, tok, 5, 0, table, 1, ORCH_LOGITS_ALL, rows, 5 * 64),
                     ORCH_OK);
    for (uint32_t p = 0; p < 5; p++)
        ck_assert_int_eq(argmax(rows + p * 64, 64), rule_next(tok, p + 1, 64));
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_logits_come_from_the_cache) {
    /* Two sequences with different prompts in different blocks; then decode
     * with a table that mixes them: the answer follows the cache contents,
     * not the tokens passed in. */
    orch_engine_ctx *ctx = ctx_with(256, NULL);
    ck_assert_int_eq(API->kv_configure(ctx, 2, 8), ORCH_OK);
    const int32_t a[4] = { 1, 2, 3, 4 }, b[4] = { 10, 20, 30, 40 };
    const int32_t ta[2] = { 0, 1 }, tb[2] = { 2, 3 };
    float row[256];
    ck_assert_int_eq(forward1(ctx, a, 4, 0, ta, 2, ORCH_LOGITS_NONE, NULL, 0), ORCH_OK);
    ck_assert_int_eq(forward1(ctx, b, 4, 0, tb, 2, ORCH_LOGITS_NONE, NULL, 0), ORCH_OK);
    const int32_t mixed[3] = { 0, 3, 4 }; /* positions 0-1 from a, 2-3 from b */
    const int32_t tok = 7;
    ck_assert_int_eq(forward1(ctx, &tok, 1, 4, mixed, 3, ORCH_LOGITS_LAST, row, 256),
                     ORCH_OK);
    const int32_t expect_ids[5] = { 1, 2, 30, 40, 7 };
    ck_assert_int_eq(argmax(row, 256), rule_next(expect_ids, 5, 256));
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_unwritten_slot) {
    orch_engine_ctx *ctx = ctx_with(256, NULL);
    ck_assert_int_eq(API->kv_configure(ctx, 4, 8), ORCH_OK);
    const int32_t tok[3] = { 97, 98, 99 };
    const int32_t table[2] = { 6, 7 };
    ck_assert_int_eq(forward1(ctx, tok, 3, 0, table, 2, ORCH_LOGITS_NONE, NULL, 0),
                     ORCH_OK);
    float row[256];
    row[0] = 5.0f;
    /* Position 3 (block 6 slot 3) was never written. */
    int32_t st = forward1(ctx, tok, 1, 4, table, 2, ORCH_LOGITS_LAST, row, 256);
    ck_assert_int_eq(st, ORCH_ERR_STATE);
    ck_assert_msg(strstr(API->last_error(ctx), "block 6 slot 3") != NULL, "%s",
                  API->last_error(ctx));
    ck_assert(row[0] == 5.0f);
    /* The failed call wrote nothing: position 4 is still unwritten. */
    ck_assert_int_eq(forward1(ctx, tok, 1, 3, table, 2, ORCH_LOGITS_NONE, NULL, 0),
                     ORCH_OK);
    st = forward1(ctx, tok, 1, 5, table, 2, ORCH_LOGITS_LAST, row, 256);
    ck_assert_int_eq(st, ORCH_ERR_STATE);
    ck_assert_msg(strstr(API->last_error(ctx), "block 7 slot 0") != NULL, "%s",
                  API->last_error(ctx));
    /* kv_copy_blocks copies the written flags too. */
    const int32_t src[1] = { 6 }, dst[1] = { 2 };
    ck_assert_int_eq(API->kv_copy_blocks(ctx, src, dst, 1), ORCH_OK);
    const int32_t t2[2] = { 2, 1 };
    ck_assert_int_eq(forward1(ctx, tok, 1, 4, t2, 2, ORCH_LOGITS_LAST, row, 256),
                     ORCH_OK);
    const int32_t ids[5] = { 97, 98, 99, 97, 97 };
    ck_assert_int_eq(argmax(row, 256), rule_next(ids, 5, 256));
    /* A partly written block copies as partly written. */
    const int32_t src2[1] = { 1 }, dst2[1] = { 4 }; /* block 1: slot 0 only */
    ck_assert_int_eq(API->kv_copy_blocks(ctx, src2, dst2, 1), ORCH_OK);
    const int32_t t3[3] = { 2, 4, 5 };
    st = forward1(ctx, tok, 1, 6, t3, 3, ORCH_LOGITS_LAST, row, 256);
    ck_assert_int_eq(st, ORCH_ERR_STATE);
    ck_assert_msg(strstr(API->last_error(ctx), "block 4 slot 1") != NULL, "%s",
                  API->last_error(ctx));
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_misuse_messages) {
    orch_engine_ctx *ctx = ctx_with(256, NULL);
    ck_assert_int_eq(API->kv_configure(ctx, 4, 8), ORCH_OK);
    const int32_t tok[4] = { 1, 2, 3, 4 };
    const int32_t t5[1] = { 5 };
    orch_seq_input s[2];
    memset(s, 0, sizeof s);
    s[0].tokens = s[1].tokens = tok;
    s[0].n_tokens = s[1].n_tokens = 2;
    s[0].block_table = s[1].block_table = t5;
    s[0].n_blocks = s[1].n_blocks = 1;
    orch_infer_batch b = { sizeof b, 2, sizeof s[0], 0, s };
    float rows[512];
    ck_assert_int_eq(API->infer_forward(ctx, &b, rows, 512), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_str_eq(API->last_error(ctx),
                     "infer_forward: block 5 is written by sequence 0 "
                     "and also used by sequence 1 (copy it first)");
    /* Reader after writer, and writer after reader. */
    ck_assert_int_eq(forward1(ctx, tok, 4, 0, t5, 1, ORCH_LOGITS_NONE, NULL, 0), ORCH_OK);
    const int32_t rd[2] = { 5, 6 }, wr[1] = { 5 };
    for (int order = 0; order < 2; order++) {
        orch_seq_input *reader = &s[order], *writer = &s[1 - order];
        reader->tokens = tok, reader->n_tokens = 1, reader->start_pos = 4;
        reader->block_table = rd, reader->n_blocks = 2;
        writer->tokens = tok, writer->n_tokens = 1, writer->start_pos = 3;
        writer->block_table = wr, writer->n_blocks = 1;
        ck_assert_int_eq(API->infer_forward(ctx, &b, rows, 512),
                         ORCH_ERR_INVALID_ARGUMENT);
        char want[160];
        snprintf(want, sizeof want,
                 "infer_forward: block 5 is written by sequence %d and also used by "
                 "sequence %d (copy it first)",
                 1 - order, order);
        ck_assert_str_eq(API->last_error(ctx), want);
    }
    /* The same block twice in one table, written. */
    const int32_t dup[2] = { 3, 3 };
    ck_assert_int_eq(forward1(ctx, tok, 4, 2, dup, 2, ORCH_LOGITS_NONE, NULL, 0),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(API->last_error(ctx), "appears twice") != NULL, "%s",
                  API->last_error(ctx));
    /* Specific status codes. */
    ck_assert_int_eq(forward1(ctx, tok, 4, 0, t5, 1, ORCH_LOGITS_LAST, rows, 255),
                     ORCH_ERR_CAPACITY);
    ck_assert_int_eq(forward1(ctx, tok, 4, 0, t5, 1, ORCH_LOGITS_LAST, NULL, 256),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(forward1(ctx, tok, 4, 0, t5, 1, 3, rows, 256),
                     ORCH_ERR_INVALID_ARGUMENT);
    b.seq_stride = sizeof s[0] - 8;
    ck_assert_int_eq(API->infer_forward(ctx, &b, rows, 512), ORCH_ERR_INVALID_ARGUMENT);
    b.seq_stride = sizeof s[0] + 4; /* misaligned second element */
    ck_assert_int_eq(API->infer_forward(ctx, &b, rows, 512), ORCH_ERR_INVALID_ARGUMENT);
    b.seq_stride = sizeof s[0];
    b.struct_size = 8;
    ck_assert_int_eq(API->infer_forward(ctx, &b, rows, 512), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->infer_forward(ctx, NULL, rows, 512), ORCH_ERR_INVALID_ARGUMENT);
    /* kv_copy_blocks: destination twice. */
    const int32_t src[2] = { 1, 2 }, dst[2] = { 4, 4 };
    ck_assert_int_eq(API->kv_copy_blocks(ctx, src, dst, 2), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(API->last_error(ctx), "destination twice") != NULL, "%s",
                  API->last_error(ctx));
    ck_assert_int_eq(API->kv_copy_blocks(ctx, NULL, NULL, 0), ORCH_OK);
    API->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Loss and gradient                                                          */
/* ------------------------------------------------------------------------- */

/* One tensor kind of a context: its table, all values (malloc'd) and the
 * offsets the loss formula reads. */
typedef struct params {
    test_table t;
    float *all;
    uint64_t off_a, off_b, off_p, off_n; /* README: A, B, P, N */
    int llama;                           /* P row t mod C, z0 = -1 */
} params;

/* Offset of the tensor named name (which must exist). */
static uint64_t offset_of(const test_table *t, const char *name) {
    for (uint32_t i = 0; i < t->n; i++)
        if (strcmp(t->info[i].name, name) == 0) return t->info[i].offset;
    ck_abort_msg("no tensor %s", name);
    return 0;
}

static void params_read(orch_engine_ctx *ctx, uint32_t kind, params *p) {
    test_read_table(API, ctx, kind, &p->t);
    p->all = test_read_kind(API, ctx, kind, &p->t);
    p->llama = strcmp(p->t.info[0].name, "model.embed_tokens.weight") == 0;
    if (p->llama) {
        p->off_a = p->t.info[0].offset;
        p->off_b = strcmp(p->t.info[p->t.n - 1].name, "lm_head.weight") == 0
                       ? p->t.info[p->t.n - 1].offset
                       : p->off_a;
        p->off_p = offset_of(&p->t, "model.layers.0.self_attn.q_proj.weight");
        p->off_n = offset_of(&p->t, "model.norm.weight");
    } else {
        p->off_a = p->off_b = offset_of(&p->t, "wte.weight");
        p->off_p = offset_of(&p->t, "wpe.weight");
        p->off_n = offset_of(&p->t, "ln_f.bias");
    }
}

/* README formula in double; adds d(loss)/d(param) into g (double). */
static double ref_loss(const params *p, uint32_t C, uint32_t V, const int32_t *tok,
                       const int32_t *tgt, uint32_t B, uint32_t S, double *g) {
    double sum = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < B * S; i++) n += tgt[i] != -1;
    if (!n) return 0;
    for (uint32_t i = 0; i < B * S; i++) {
        if (tgt[i] == -1) continue;
        uint64_t x = (uint64_t)tok[i], y = (uint64_t)tgt[i], t = i % S;
        uint64_t r = p->llama ? t % C : t;
        uint64_t idx[4] = { p->off_a + x * C + y % C, p->off_b + y * C + x % C,
                            p->off_p + r * C + (x + y) % C, p->off_n + y % C };
        double z = p->llama ? -1.0 : 0.0;
        for (int k = 0; k < 4; k++) z += p->all[idx[k]];
        double s = 1 / (1 + exp(-z));
        sum += 2 * log((double)V) * s;
        if (g)
            for (int k = 0; k < 4; k++) g[idx[k]] += 2 * log((double)V) * s * (1 - s) / n;
    }
    return sum / n;
}

/* The models the loss test runs on: gpt2, llama tied (kv_heads 1), llama
 * untied (kv_heads 2). */
static orch_engine_ctx *loss_ctx(int which, uint32_t V) {
    orch_model_desc m = test_model_desc(V, 64, 2, 2, 16);
    if (which > 0) {
        m.arch = ORCH_ARCH_LLAMA;
        m.mlp_width = 24;
        m.kv_heads = (uint32_t)which;
        if (which == 2) m.flags = ORCH_MODEL_FLAG_UNTIED_HEAD;
    }
    orch_engine_ctx *ctx = NULL;
    char err[512] = "";
    ck_assert_msg(create(&m, 7, NULL, &ctx, err, sizeof err) == ORCH_OK, "%s", err);
    return ctx;
}

START_TEST(test_loss_formula_and_gradient) {
    const uint32_t V = 100, C = 16, B = 3, S = 10;
    orch_engine_ctx *ctx = loss_ctx(_i, V);
    /* Non-trivial parameters so z is far from 0. */
    params p;
    params_read(ctx, ORCH_TENSOR_PARAM, &p);
    uint64_t r = 99;
    for (uint64_t j = 0; j < p.t.total; j++)
        p.all[j] = (float)((double)(test_lcg64(&r) >> 40) / (double)(1ull << 24) - 0.5);
    test_write_kind(API, ctx, ORCH_TENSOR_PARAM, &p.t, p.all);
    int32_t tok[B * S], tgt[B * S];
    for (uint32_t i = 0; i < B * S; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % V);
        tgt[i] = i % 7 == 3 ? -1 : (int32_t)((i * 53 + 5) % V);
    }
    double *g = calloc(p.t.total, sizeof(double));
    double want = ref_loss(&p, C, V, tok, tgt, B, S, g);
    float loss, ev;
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, B, S, 0.5f, &loss), ORCH_OK);
    ck_assert_int_eq(API->eval_loss(ctx, tok, tgt, B, S, &ev), ORCH_OK);
    ck_assert_msg(fabs(loss - want) < 1e-5 * want, "loss %g, formula %g", (double)loss,
                  want);
    ck_assert(loss == ev);
    float *eg = malloc(p.t.total * sizeof(float));
    ck_assert_int_eq(API->grads_read(ctx, 0, p.t.total, eg), ORCH_OK);
    for (uint64_t j = 0; j < p.t.total; j++)
        ck_assert_msg(fabs(eg[j] - 0.5 * g[j]) <= 1e-6 + 1e-5 * fabs(g[j]),
                      "grad %llu: %g vs %g", (unsigned long long)j, (double)eg[j],
                      0.5 * g[j]);
    /* Finite differences through eval_loss on a few touched entries. */
    int checked = 0;
    for (uint64_t j = 0; j < p.t.total && checked < 6; j++) {
        if (fabs(g[j]) < 1e-3) continue;
        checked++;
        uint32_t ti = 0;
        while (ti + 1 < p.t.n && p.t.info[ti + 1].offset <= j) ti++;
        float *tmp = malloc(p.t.info[ti].numel * 4);
        memcpy(tmp, p.all + p.t.info[ti].offset, p.t.info[ti].numel * 4);
        const float h = 1e-2f;
        float lp, lm;
        tmp[j - p.t.info[ti].offset] += h;
        ck_assert_int_eq(API->tensor_write(ctx, 0, ti, tmp, p.t.info[ti].numel * 4),
                         ORCH_OK);
        ck_assert_int_eq(API->eval_loss(ctx, tok, tgt, B, S, &lp), ORCH_OK);
        tmp[j - p.t.info[ti].offset] -= 2 * h;
        ck_assert_int_eq(API->tensor_write(ctx, 0, ti, tmp, p.t.info[ti].numel * 4),
                         ORCH_OK);
        ck_assert_int_eq(API->eval_loss(ctx, tok, tgt, B, S, &lm), ORCH_OK);
        tmp[j - p.t.info[ti].offset] += h;
        ck_assert_int_eq(API->tensor_write(ctx, 0, ti, tmp, p.t.info[ti].numel * 4),
                         ORCH_OK);
        double fd = ((double)lp - (double)lm) / (2.0 * h);
        ck_assert_msg(fabs(fd - g[j]) < 0.02 * fabs(g[j]) + 1e-5,
                      "finite difference %g vs gradient %g at %llu", fd, g[j],
                      (unsigned long long)j);
        free(tmp);
    }
    ck_assert_int_ge(checked, 3);
    /* All targets ignored: loss 0, no gradient. */
    for (uint32_t i = 0; i < B * S; i++) tgt[i] = -1;
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, B, S, 1.0f, &loss), ORCH_OK);
    ck_assert(loss == 0.0f);
    ck_assert_int_eq(API->grads_read(ctx, 0, p.t.total, eg), ORCH_OK);
    for (uint64_t j = 0; j < p.t.total; j++) ck_assert(eg[j] == 0.0f);
    free(eg);
    free(g);
    free(p.all);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_adamw_reference) {
    const uint32_t V = 50;
    orch_engine_ctx *ctx = ctx_with(V, NULL);
    params p, m, v;
    params_read(ctx, ORCH_TENSOR_PARAM, &p);
    params_read(ctx, ORCH_TENSOR_ADAM_M, &m);
    params_read(ctx, ORCH_TENSOR_ADAM_V, &v);
    float *g = malloc(p.t.total * 4);
    uint64_t r = 5;
    for (uint64_t j = 0; j < p.t.total; j++) {
        double u = (double)(test_lcg64(&r) >> 40) / (double)(1ull << 24);
        g[j] = (float)(u - 0.5);
        m.all[j] = (float)(0.1 * (u - 0.3));
        v.all[j] = (float)(0.01 * u);
        p.all[j] = (float)(u * 2 - 1);
    }
    test_write_kind(API, ctx, ORCH_TENSOR_PARAM, &p.t, p.all);
    test_write_kind(API, ctx, ORCH_TENSOR_ADAM_M, &p.t, m.all);
    test_write_kind(API, ctx, ORCH_TENSOR_ADAM_V, &p.t, v.all);
    ck_assert_int_eq(API->grads_write(ctx, 0, p.t.total, g), ORCH_OK);
    orch_adamw_params hp = test_adamw(7, 3e-3f, 0.1f, 1.0f);
    double sq = 0;
    for (uint64_t j = 0; j < p.t.total; j++) sq += (double)g[j] * g[j];
    double norm = sqrt(sq), clip = norm > 1.0 ? 1.0 / norm : 1.0;
    ck_assert(norm > 1.0); /* the clip path is exercised */
    float got_norm = 0;
    ck_assert_int_eq(API->optimizer_step(ctx, &hp, &got_norm), ORCH_OK);
    ck_assert_msg(fabs(got_norm - norm) < 1e-5 * norm, "%g vs %g", (double)got_norm,
                  norm);
    params p2, m2, v2;
    params_read(ctx, 0, &p2);
    params_read(ctx, 1, &m2);
    params_read(ctx, 2, &v2);
    float *g2 = malloc(p.t.total * 4);
    ck_assert_int_eq(API->grads_read(ctx, 0, p.t.total, g2), ORCH_OK);
    double bc1 = 1 - pow(0.9, 7), bc2 = 1 - pow(0.95, 7);
    for (uint32_t i = 0; i < p.t.n; i++) {
        int decay = !(p.t.info[i].flags & ORCH_TENSOR_FLAG_NO_DECAY);
        ck_assert_int_eq(decay, p.t.info[i].ndim == 2);
        const uint64_t end = p.t.info[i].offset + p.t.info[i].numel;
        for (uint64_t j = p.t.info[i].offset; j < end; j++) {
            double gj = g[j] * clip;
            double mj = 0.9 * m.all[j] + 0.1 * gj;
            double vj = 0.95 * v.all[j] + 0.05 * gj * gj;
            double w = p.all[j];
            if (decay) w *= 1 - 3e-3 * 0.1;
            w -= 3e-3 * (mj / bc1) / (sqrt(vj / bc2) + 1e-8);
            ck_assert_msg(fabs(m2.all[j] - mj) < 1e-6 + 1e-5 * fabs(mj), "m %llu",
                          (unsigned long long)j);
            ck_assert_msg(fabs(v2.all[j] - vj) < 1e-9 + 1e-5 * fabs(vj), "v %llu",
                          (unsigned long long)j);
            ck_assert_msg(fabs(p2.all[j] - w) < 1e-6 + 1e-5 * fabs(w),
                          "param %llu (%s): %.9g vs %.9g", (unsigned long long)j,
                          p.t.info[i].name, (double)p2.all[j], w);
            /* The gradient buffer holds the clipped gradient. */
            ck_assert(fabs(g2[j] - gj) < 1e-7 + 1e-5 * fabs(gj));
        }
    }
    /* Bad hyper-parameters. */
    orch_adamw_params bad = hp;
    bad.step = 0;
    ck_assert_int_eq(API->optimizer_step(ctx, &bad, NULL), ORCH_ERR_INVALID_ARGUMENT);
    bad = hp, bad.beta1 = 1.0f;
    ck_assert_int_eq(API->optimizer_step(ctx, &bad, NULL), ORCH_ERR_INVALID_ARGUMENT);
    bad = hp, bad.lr = NAN;
    ck_assert_int_eq(API->optimizer_step(ctx, &bad, NULL), ORCH_ERR_INVALID_ARGUMENT);
    bad = hp, bad.struct_size = 16;
    ck_assert_int_eq(API->optimizer_step(ctx, &bad, NULL), ORCH_ERR_INVALID_ARGUMENT);
    free(g);
    free(g2);
    free(p.all), free(m.all), free(v.all), free(p2.all), free(m2.all), free(v2.all);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_training_converges) {
    orch_engine_ctx *ctx = ctx_with(256, NULL);
    int32_t tok[64], tgt[64];
    for (int i = 0; i < 64; i++) tok[i] = (i * 7) % 256, tgt[i] = (i * 7 + 7) % 256;
    float first = 0, prev = 1e9f, loss = 0;
    for (uint64_t step = 1; step <= 50; step++) {
        ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
        ck_assert_int_eq(API->forward_backward(ctx, tok, tgt, 2, 32, 1.0f, &loss),
                         ORCH_OK);
        if (step == 1) first = loss;
        ck_assert_msg(loss < prev, "step %llu: loss %g did not fall below %g",
                      (unsigned long long)step, (double)loss, (double)prev);
        prev = loss;
        orch_adamw_params hp = test_adamw(step, 1e-2f, 0.1f, 1.0f);
        ck_assert_int_eq(API->optimizer_step(ctx, &hp, NULL), ORCH_OK);
    }
    ck_assert_msg(loss < 0.5f * first, "loss %g -> %g", (double)first, (double)loss);
    API->context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Model description, options, faults                                         */
/* ------------------------------------------------------------------------- */

START_TEST(test_model_errors) {
    struct {
        orch_model_desc m;
        int32_t status;
        const char *msg;
    } cases[] = {
        { test_model_desc(100, 64, 2, 3, 16), ORCH_ERR_INVALID_ARGUMENT,
          "heads (3) must divide width (16)" },
        { test_model_desc(0, 64, 2, 2, 16), ORCH_ERR_INVALID_ARGUMENT,
          "vocab_size must be > 0" },
        { test_model_desc(100, 0, 2, 2, 16), ORCH_ERR_INVALID_ARGUMENT,
          "context must be > 0" },
        { test_model_desc(100, 64, 0, 2, 16), ORCH_ERR_INVALID_ARGUMENT,
          "layers must be > 0" },
        { test_model_desc(100, 64, 2, 0, 16), ORCH_ERR_INVALID_ARGUMENT,
          "heads must be > 0" },
        { test_model_desc(100, 64, 2, 2, 0), ORCH_ERR_INVALID_ARGUMENT,
          "width must be > 0" },
        /* Far bigger than any machine: refused up front, not by the OOM killer. */
        { test_model_desc(2000000000u, 64, 2, 2, 1u << 20), ORCH_ERR_OUT_OF_MEMORY,
          "bytes" },
        /* 4*width wraps to 0 in test_model_desc: the engine's default overflows. */
        { test_model_desc(100, 64, 2, 2, 0x40000000u), ORCH_ERR_INVALID_ARGUMENT,
          "too large" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        orch_engine_ctx *ctx = NULL;
        char err[512] = "";
        int32_t st = create(&cases[i].m, 1, NULL, &ctx, err, sizeof err);
        ck_assert_msg(st == cases[i].status, "case %zu: status %d (%s)", i, st, err);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "case %zu: '%s'", i, err);
        ck_assert_ptr_null(ctx);
    }
    orch_model_desc m = test_model_desc(100, 64, 2, 2, 16);
    m.arch = ORCH_ARCH_LLAMA;
    orch_engine_ctx *ctx = NULL;
    char err[512];
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err), ORCH_OK); /* ABI 1.1 */
    API->context_destroy(ctx);
    ctx = NULL;
    m.kv_heads = 3; /* does not divide heads 2 */
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_str_eq(err, "model kv_heads 3 must divide heads 2");
    m.kv_heads = 2;
    m.rope_scaling = 9;
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err), ORCH_ERR_UNSUPPORTED);
    ck_assert_ptr_null(ctx);
    m = test_model_desc(100, 64, 2, 2, 16);
    m.rope_theta = 10000.0f; /* llama only */
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
    m = test_model_desc(100, 64, 2, 2, 16);
    m.kv_heads = 1;
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err), ORCH_ERR_UNSUPPORTED);
    m = test_model_desc(100, 64, 2, 2, 16);
    m.layernorm_eps = -1.0f;
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
    m = test_model_desc(100, 64, 2, 2, 16);
    m.struct_size = 8;
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
    /* A caller from an older minor with a shorter struct: absent fields are 0. */
    m = test_model_desc(100, 64, 2, 2, 16);
    m.struct_size = offsetof(orch_model_desc, mlp_width);
    m.mlp_width = 12345; /* beyond struct_size: must be ignored */
    ck_assert_int_eq(create(&m, 1, NULL, &ctx, err, sizeof err), ORCH_OK);
    orch_tensor_info ti = { .struct_size = sizeof ti };
    ck_assert_int_eq(API->tensor_info(ctx, 0, 2 + 8, &ti),
                     ORCH_OK); /* h.0.mlp.c_fc.weight */
    ck_assert_str_eq(ti.name, "h.0.mlp.c_fc.weight");
    ck_assert_uint_eq(ti.shape[0], 64);
    API->context_destroy(ctx);
    /* NULL options struct means defaults. */
    m = test_model_desc(100, 64, 2, 2, 16);
    ctx = NULL;
    ck_assert_int_eq(API->context_create(&m, NULL, &ctx, err, sizeof err), ORCH_OK);
    API->context_destroy(ctx);
    ck_assert_int_eq(API->context_create(&m, NULL, NULL, err, sizeof err),
                     ORCH_ERR_INVALID_ARGUMENT);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* LLaMA (ABI 1.1)                                                            */
/* ------------------------------------------------------------------------- */

static orch_model_desc llama_desc(uint32_t kv_heads, uint32_t flags) {
    orch_model_desc m = test_model_desc(100, 64, 2, 4, 32);
    m.arch = ORCH_ARCH_LLAMA;
    m.kv_heads = kv_heads;
    m.mlp_width = 48;
    m.flags = flags;
    return m;
}

START_TEST(test_llama_table) {
    /* The header's names, order and shapes; an untied head adds lm_head. */
    for (int untied = 0; untied < 2; untied++) {
        orch_model_desc m = llama_desc(2, untied ? ORCH_MODEL_FLAG_UNTIED_HEAD : 0);
        orch_engine_ctx *ctx = NULL;
        char err[512] = "";
        ck_assert_msg(create(&m, 3, NULL, &ctx, err, sizeof err) == ORCH_OK, "%s", err);
        test_table t;
        test_read_table(API, ctx, ORCH_TENSOR_PARAM, &t);
        ck_assert_uint_eq(t.n, 2 + 9 * 2 + (uint32_t)untied);
        ck_assert_str_eq(t.info[0].name, "model.embed_tokens.weight");
        ck_assert_str_eq(t.info[1].name, "model.layers.0.input_layernorm.weight");
        ck_assert_str_eq(t.info[3].name, "model.layers.0.self_attn.k_proj.weight");
        ck_assert_uint_eq(t.info[3].shape[0], 2 * 8); /* kv_heads * head size */
        ck_assert_uint_eq(t.info[3].shape[1], 32);
        ck_assert_str_eq(t.info[9].name, "model.layers.0.mlp.down_proj.weight");
        ck_assert_uint_eq(t.info[9].shape[1], 48);
        ck_assert_str_eq(t.info[19].name, "model.norm.weight");
        ck_assert_uint_eq(t.info[19].flags, ORCH_TENSOR_FLAG_NO_DECAY);
        if (untied) ck_assert_str_eq(t.info[20].name, "lm_head.weight");
        /* D = 8: 100*32 + 2*(2*32 + 32*32*2 + 2*16*32 + 3*48*32) + 32 (+ 100*32) */
        uint64_t want = 3200 + 2 * (64 + 2048 + 1024 + 4608) + 32 + (untied ? 3200 : 0);
        ck_assert_uint_eq(t.total, want);
        /* The orchestrator's own count (orch bench) agrees with the table. */
        uint64_t n_all = 0, read = 0;
        double f = bench_train_flops_per_token(&m, 16, &n_all, &read);
        ck_assert_uint_eq(n_all, want);
        ck_assert_uint_eq(read, want - (untied ? 3200 : 0));
        ck_assert(f == 6.0 * (double)read + 12.0 * 2 * 16 * 32);
        /* Norm weights start at 1, matrices at N(0, 0.02). */
        float *all = test_read_kind(API, ctx, ORCH_TENSOR_PARAM, &t);
        ck_assert(all[t.info[19].offset] == 1.0f);
        ck_assert(all[0] != 0.0f && fabsf(all[0]) < 0.2f);
        free(all);
        /* The loss starts near ln V (z0 = -1 cancels the norm weight 1). */
        const int32_t tok[4] = { 1, 2, 3, 4 }, tgt[4] = { 2, 3, 4, 5 };
        float loss;
        ck_assert_int_eq(API->eval_loss(ctx, tok, tgt, 1, 4, &loss), ORCH_OK);
        ck_assert_msg(fabs(loss - log(100.0)) < 0.2, "loss %g", (double)loss);
        API->context_destroy(ctx);
    }
}
END_TEST

START_TEST(test_llama_kv_heads) {
    /* KV blocks are sized by kv_heads; the next-token rule is the same for
     * every kv_heads, read back through the KV heads, and copies carry every
     * head's entry. */
    uint64_t bytes[3];
    const uint32_t kvh[3] = { 1, 2, 4 };
    for (int k = 0; k < 3; k++) {
        orch_model_desc m = llama_desc(kvh[k], 0);
        m.vocab_size = 256;
        orch_engine_ctx *ctx = NULL;
        char err[512] = "";
        ck_assert_msg(create(&m, 3, NULL, &ctx, err, sizeof err) == ORCH_OK, "%s", err);
        ck_assert_int_eq(API->kv_block_bytes(ctx, 16, &bytes[k]), ORCH_OK);
        ck_assert_int_eq(API->kv_configure(ctx, 4, 8), ORCH_OK);
        const int32_t seq[7] = { 'a', 'b', 'c', 'd', 'e', 'f', 'g' };
        const int32_t table[2] = { 5, 2 }, copy_to[2] = { 6, 3 };
        float row[256];
        ck_assert_int_eq(forward1(ctx, seq, 6, 0, table, 2, ORCH_LOGITS_LAST, row, 256),
                         ORCH_OK);
        ck_assert_int_eq(argmax(row, 256), rule_next(seq, 6, 256));
        ck_assert_int_eq(API->kv_copy_blocks(ctx, table, copy_to, 2), ORCH_OK);
        ck_assert_int_eq(
            forward1(ctx, seq + 6, 1, 6, copy_to, 2, ORCH_LOGITS_LAST, row, 256),
            ORCH_OK);
        ck_assert_int_eq(argmax(row, 256), rule_next(seq, 7, 256));
        API->context_destroy(ctx);
    }
    /* 16 positions x (4 bytes per KV head + 1 written flag) + the mark. */
    ck_assert_uint_eq(bytes[1] - bytes[0], 16 * 4);
    ck_assert_uint_eq(bytes[2] - bytes[1], 2 * 16 * 4);
    /* gpt2 keeps one entry per position whatever its heads. */
    orch_engine_ctx *g = ctx_with(256, NULL);
    uint64_t gb;
    ck_assert_int_eq(API->kv_block_bytes(g, 16, &gb), ORCH_OK);
    ck_assert_uint_eq(gb, bytes[0]);
    API->context_destroy(g);
}
END_TEST

START_TEST(test_null_context_everywhere) {
    float f;
    uint32_t u;
    uint64_t q;
    orch_tensor_info ti = { .struct_size = sizeof ti };
    ck_assert_ptr_nonnull(API->last_error(NULL));
    ck_assert_int_eq(API->tensor_count(NULL, 0, &u), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->tensor_info(NULL, 0, 0, &ti), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->tensor_read(NULL, 0, 0, &f, 4), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->tensor_write(NULL, 0, 0, &f, 4), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->grads_zero(NULL), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->grads_read(NULL, 0, 1, &f), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->grads_write(NULL, 0, 1, &f), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->forward_backward(NULL, NULL, NULL, 1, 1, 1, &f),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->optimizer_step(NULL, NULL, &f), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->eval_loss(NULL, NULL, NULL, 1, 1, &f),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->kv_block_bytes(NULL, 4, &q), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->kv_configure(NULL, 4, 4), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->infer_forward(NULL, NULL, &f, 1), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->kv_copy_blocks(NULL, NULL, NULL, 1), ORCH_ERR_INVALID_ARGUMENT);
    /* NULL out-params with a real context. */
    orch_engine_ctx *ctx = ctx_with(100, NULL);
    ck_assert_int_eq(API->tensor_count(ctx, 0, NULL), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->tensor_info(ctx, 0, 0, NULL), ORCH_ERR_INVALID_ARGUMENT);
    int32_t tok[2] = { 1, 2 };
    ck_assert_int_eq(API->forward_backward(ctx, tok, tok, 1, 2, 1, NULL),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->forward_backward(ctx, tok, NULL, 1, 2, 1, &f),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tok, 0, 2, 1, &f),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tok, 1, 65, 1, &f),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tok, 1, 2, NAN, &f),
                     ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->eval_loss(ctx, NULL, tok, 1, 2, &f), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(API->kv_copy_blocks(ctx, tok, tok, 1), ORCH_ERR_STATE);
    ti.struct_size = 0;
    ck_assert_int_eq(API->tensor_info(ctx, 0, 0, &ti), ORCH_ERR_INVALID_ARGUMENT);
    /* A short out struct gets only its own bytes. */
    _Alignas(orch_tensor_info) unsigned char raw[sizeof(orch_tensor_info)];
    memset(raw, 0xEE, sizeof raw);
    orch_tensor_info *small = (orch_tensor_info *)(void *)raw;
    small->struct_size = 16;
    ck_assert_int_eq(API->tensor_info(ctx, 0, 0, small), ORCH_OK);
    ck_assert_uint_eq(small->ndim, 2);
    ck_assert_uint_eq(raw[16], 0xEE);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_fault_option) {
    orch_engine_ctx *ctx = ctx_with(256, "fault=infer_forward:2; fault=grads_zero:3+");
    ck_assert_int_eq(API->kv_configure(ctx, 4, 4), ORCH_OK);
    const int32_t tok[1] = { 97 }, table[1] = { 0 };
    float row[256];
    ck_assert_int_eq(forward1(ctx, tok, 1, 0, table, 1, 0, row, 256), ORCH_OK);
    row[0] = 3.0f;
    ck_assert_int_eq(forward1(ctx, tok, 1, 0, table, 1, 0, row, 256), ORCH_ERR_INTERNAL);
    ck_assert_str_eq(API->last_error(ctx), "injected fault in infer_forward (call 2)");
    ck_assert(row[0] == 3.0f);
    ck_assert_int_eq(forward1(ctx, tok, 1, 0, table, 1, 0, row, 256), ORCH_OK);
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    ck_assert_int_eq(API->grads_zero(ctx), ORCH_OK);
    for (int k = 3; k < 6; k++) {
        ck_assert_int_eq(API->grads_zero(ctx), ORCH_ERR_INTERNAL);
        char want[64];
        snprintf(want, sizeof want, "injected fault in grads_zero (call %d)", k);
        ck_assert_str_eq(API->last_error(ctx), want);
    }
    /* Counting is per context. */
    orch_engine_ctx *other = ctx_with(256, "fault=infer_forward:2");
    ck_assert_int_eq(API->kv_configure(other, 4, 4), ORCH_OK);
    ck_assert_int_eq(forward1(other, tok, 1, 0, table, 1, 0, row, 256), ORCH_OK);
    API->context_destroy(other);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_fault_env) {
    setenv("ORCH_MOCK_FAULT", "forward_backward:1,optimizer_step:2", 1);
    orch_engine_ctx *ctx = ctx_with(100, "fault=tensor_count:1");
    unsetenv("ORCH_MOCK_FAULT"); /* read at create only */
    int32_t tok[2] = { 1, 2 };
    float loss = 8.0f;
    ck_assert_int_eq(API->forward_backward(ctx, tok, tok, 1, 2, 1, &loss),
                     ORCH_ERR_INTERNAL);
    ck_assert(loss == 8.0f);
    ck_assert_int_eq(API->forward_backward(ctx, tok, tok, 1, 2, 1, &loss), ORCH_OK);
    orch_adamw_params hp = test_adamw(1, 1e-3f, 0.0f, 0.0f);
    ck_assert_int_eq(API->optimizer_step(ctx, &hp, NULL), ORCH_OK);
    ck_assert_int_eq(API->optimizer_step(ctx, &hp, NULL), ORCH_ERR_INTERNAL);
    uint32_t n = 5;
    ck_assert_int_eq(API->tensor_count(ctx, 0, &n), ORCH_ERR_INTERNAL);
    ck_assert_uint_eq(n, 5);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_sleep) {
    orch_engine_ctx *ctx = ctx_with(100, "sleep_ms=40");
    ck_assert_int_eq(API->kv_configure(ctx, 4, 4), ORCH_OK);
    const int32_t tok[1] = { 1 }, table[1] = { 0 };
    float row[100];
    double t0 = util_now();
    ck_assert_int_eq(forward1(ctx, tok, 1, 0, table, 1, 0, row, 100), ORCH_OK);
    double t1 = util_now();
    ck_assert_msg(t1 - t0 >= 0.039, "infer_forward took %.3f s", t1 - t0);
    float loss;
    int32_t tt[2] = { 1, 2 };
    ck_assert_int_eq(API->forward_backward(ctx, tt, tt, 1, 2, 1, &loss), ORCH_OK);
    ck_assert_msg(util_now() - t1 >= 0.039, "forward_backward did not sleep");
    API->context_destroy(ctx);
    /* Environment; the options string wins. */
    setenv("ORCH_MOCK_SLEEP_MS", "30", 1);
    ctx = ctx_with(100, NULL);
    ck_assert_int_eq(API->kv_configure(ctx, 4, 4), ORCH_OK);
    t0 = util_now();
    ck_assert_int_eq(forward1(ctx, tok, 1, 0, table, 1, 0, row, 100), ORCH_OK);
    ck_assert(util_now() - t0 >= 0.029);
    API->context_destroy(ctx);
    ctx = ctx_with(100, "sleep_ms=0");
    ck_assert_int_eq(API->kv_configure(ctx, 4, 4), ORCH_OK);
    ck_assert_int_eq(forward1(ctx, tok, 1, 0, table, 1, 0, row, 100), ORCH_OK);
    API->context_destroy(ctx);
}
END_TEST

/* cost_us_per_token / cost_us_per_decode: prompt entries (2+ tokens) pay
 * per token, one-token entries pay the decode cost. */
START_TEST(test_cost_model) {
    const int32_t prompt[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, table[3] = { 0, 1, 2 };
    const int32_t one[1] = { 9 };
    float row[100];
    orch_engine_ctx *a = ctx_with(100, "cost_us_per_token=50000");
    ck_assert_int_eq(API->kv_configure(a, 4, 4), ORCH_OK);
    double t0 = util_now();
    ck_assert_int_eq(forward1(a, prompt, 8, 0, table, 2, 0, row, 100), ORCH_OK);
    double dt = util_now() - t0;
    ck_assert_msg(dt >= 0.399, "8 prompt tokens at 50 ms took %.3f s", dt);
    API->context_destroy(a);
    orch_engine_ctx *b = ctx_with(100, "cost_us_per_decode=300000");
    ck_assert_int_eq(API->kv_configure(b, 4, 4), ORCH_OK);
    t0 = util_now();
    ck_assert_int_eq(forward1(b, prompt, 8, 0, table, 2, 0, row, 100), ORCH_OK);
    dt = util_now() - t0;
    ck_assert_msg(dt < 0.25, "a prompt paid the decode cost per token (%.3f s)", dt);
    t0 = util_now();
    ck_assert_int_eq(forward1(b, one, 1, 8, table, 3, 0, row, 100), ORCH_OK);
    dt = util_now() - t0;
    ck_assert_msg(dt >= 0.299, "a decode step at 300 ms took %.3f s", dt);
    API->context_destroy(b);
    /* the environment, read at create */
    setenv("ORCH_MOCK_COST_US_PER_TOKEN", "50000", 1);
    orch_engine_ctx *c = ctx_with(100, NULL);
    unsetenv("ORCH_MOCK_COST_US_PER_TOKEN");
    ck_assert_int_eq(API->kv_configure(c, 4, 4), ORCH_OK);
    t0 = util_now();
    ck_assert_int_eq(forward1(c, prompt, 4, 0, table, 1, 0, row, 100), ORCH_OK);
    ck_assert(util_now() - t0 >= 0.199);
    API->context_destroy(c);
}
END_TEST

START_TEST(test_bad_options) {
    const struct {
        const char *opt, *env_fault, *env_sleep, *msg;
    } cases[] = {
        { "colour=blue", NULL, NULL, "unknown option 'colour=blue'" },
        { "fault", NULL, NULL, "unknown option 'fault'" },
        { "fault=infer_forward", NULL, NULL, "is not CALL:N" },
        { "fault=warp_drive:1", NULL, NULL, "unknown call 'warp_drive'" },
        { "fault=infer_forward:0", NULL, NULL, "N must be an integer >= 1" },
        { "fault=infer_forward:x", NULL, NULL, "N must be an integer >= 1" },
        { "sleep_ms=-5", NULL, NULL, "sleep_ms '-5'" },
        { "sleep_ms=", NULL, NULL, "sleep_ms ''" },
        { "cost_us_per_token=x", NULL, NULL, "cost_us_per_token 'x'" },
        { "cost_us_per_decode=2000000", NULL, NULL, "cost_us_per_decode '2000000'" },
        { NULL, "nope:1", NULL, "ORCH_MOCK_FAULT: fault names unknown call 'nope'" },
        { NULL, NULL, "soon", "ORCH_MOCK_SLEEP_MS" },
    };
    orch_model_desc m = test_model_desc(100, 64, 2, 2, 16);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].env_fault)
            setenv("ORCH_MOCK_FAULT", cases[i].env_fault, 1);
        else
            unsetenv("ORCH_MOCK_FAULT");
        if (cases[i].env_sleep)
            setenv("ORCH_MOCK_SLEEP_MS", cases[i].env_sleep, 1);
        else
            unsetenv("ORCH_MOCK_SLEEP_MS");
        orch_engine_ctx *ctx = NULL;
        char err[512] = "";
        int32_t st = create(&m, 1, cases[i].opt, &ctx, err, sizeof err);
        ck_assert_msg(st == ORCH_ERR_INVALID_ARGUMENT, "case %zu: %d", i, st);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "case %zu: '%s'", i, err);
        ck_assert_ptr_null(ctx);
    }
    unsetenv("ORCH_MOCK_FAULT");
    unsetenv("ORCH_MOCK_SLEEP_MS");
    /* Separators and spaces are forgiven; empty strings are fine. */
    orch_engine_ctx *ctx = NULL;
    char err[256];
    ck_assert_int_eq(
        create(&m, 1, " sleep_ms = 0 ;; fault = eval_loss:3+ ,", &ctx, err, sizeof err),
        ORCH_OK);
    API->context_destroy(ctx);
    ck_assert_int_eq(create(&m, 1, "", &ctx, err, sizeof err), ORCH_OK);
    API->context_destroy(ctx);
}
END_TEST

START_TEST(test_seeded_init) {
    orch_engine_ctx *a = ctx_with(100, NULL), *b = NULL;
    orch_model_desc m = test_model_desc(100, 64, 2, 2, 16);
    char err[256];
    ck_assert_int_eq(create(&m, 7, NULL, &b, err, sizeof err), ORCH_OK);
    params pa, pb;
    params_read(a, 0, &pa);
    params_read(b, 0, &pb);
    ck_assert(memcmp(pa.all, pb.all, pa.t.total * 4) == 0);
    /* Not all equal, not all zero. */
    ck_assert(pa.all[0] != pa.all[1] && pa.all[0] != 0.0f);
    /* Initialisation is lazy per tensor; the values do not depend on the
     * order of calls: train first, read in reverse order, write one tensor. */
    orch_engine_ctx *c = NULL;
    ck_assert_int_eq(create(&m, 7, NULL, &c, err, sizeof err), ORCH_OK);
    int32_t tok[4] = { 1, 2, 3, 4 };
    float loss_c, loss_a;
    ck_assert_int_eq(API->eval_loss(c, tok, tok, 1, 4, &loss_c), ORCH_OK);
    ck_assert_int_eq(API->eval_loss(a, tok, tok, 1, 4, &loss_a), ORCH_OK);
    ck_assert(loss_a == loss_c);
    float *w3 = calloc(pa.t.info[3].numel, 4);
    for (uint64_t j = 0; j < pa.t.info[3].numel; j++) w3[j] = 0.5f + (float)j;
    ck_assert_int_eq(API->tensor_write(c, 0, 3, w3, pa.t.info[3].numel * 4), ORCH_OK);
    float *buf = malloc(pa.t.total * 4);
    for (uint32_t i = pa.t.n; i-- > 0;) {
        const orch_tensor_info *ti = &pa.t.info[i];
        ck_assert_int_eq(API->tensor_read(c, 0, i, buf + ti->offset, ti->numel * 4),
                         ORCH_OK);
        if (i == 3)
            ck_assert(memcmp(buf + ti->offset, w3, ti->numel * 4) == 0);
        else
            ck_assert_msg(memcmp(buf + ti->offset, pa.all + ti->offset, ti->numel * 4) ==
                              0,
                          "%s differs when read in another order", ti->name);
    }
    free(buf);
    free(w3);
    API->context_destroy(c);
    free(pa.all);
    free(pb.all);
    API->context_destroy(a);
    API->context_destroy(b);
}
END_TEST

int main(void) {
    test_default_engine_path();
    unsetenv("ORCH_MOCK_FAULT");
    unsetenv("ORCH_MOCK_SLEEP_MS");
    char err[2048];
    if (engine_load("mock", &mock, err, sizeof err) != 0) {
        fprintf(stderr, "test_mock_engine: %s\n", err);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("mock_engine");
    TCase *tc = tcase_create("mock");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_probe_and_caps);
    tcase_add_test(tc, test_greedy_text);
    tcase_add_test(tc, test_small_vocab_rule);
    tcase_add_test(tc, test_logits_come_from_the_cache);
    tcase_add_test(tc, test_unwritten_slot);
    tcase_add_test(tc, test_misuse_messages);
    tcase_add_loop_test(tc, test_loss_formula_and_gradient, 0, 3);
    tcase_add_test(tc, test_llama_table);
    tcase_add_test(tc, test_llama_kv_heads);
    tcase_add_test(tc, test_adamw_reference);
    tcase_add_test(tc, test_training_converges);
    tcase_add_test(tc, test_model_errors);
    tcase_add_test(tc, test_null_context_everywhere);
    tcase_add_test(tc, test_fault_option);
    tcase_add_test(tc, test_fault_env);
    tcase_add_test(tc, test_sleep);
    tcase_add_test(tc, test_cost_model);
    tcase_add_test(tc, test_bad_options);
    tcase_add_test(tc, test_seeded_init);
    suite_add_tcase(s, tc);
    int rc = test_run_suite(s);
    engine_unload(&mock);
    return rc;
}
