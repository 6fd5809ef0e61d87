/*
 * test_ft_stream.h - what the suites of the ABI 1.5 fine-tuning streams
 * (tests/test_cpu_ft_stream.c, tests/test_cuda_ft_stream.c) share: a
 * coserve_step call on a list of sequences, a progress report to be filled,
 * an adapter's gradients read back, and the ABI's engine-independent rules
 * of a stream (locked adapter, bad steps and micro-batches, ids, a stream of
 * ignored targets) checked on any engine.
 *
 * Header-only (static functions with Check assertions); memory the
 * functions return is the caller's to free; single-threaded.
 */
#ifndef ORCH_TESTS_TEST_FT_STREAM_H
#define ORCH_TESTS_TEST_FT_STREAM_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "tests/test_util.h"

/* A progress report the engine must fill: every byte 0xab but struct_size. */
static inline orch_ft_progress test_ft_progress0(void) {
    orch_ft_progress p;
    memset(&p, 0xab, sizeof p);
    p.struct_size = sizeof p;
    return p;
}

/* coserve_step on seqs[0..n) (no batch when n is 0). */
static inline int32_t test_ft_step(const orch_engine_api *api, orch_engine_ctx *ctx,
                                   const orch_seq_input *seqs, uint32_t n, float *logits,
                                   uint64_t cap, uint32_t stream, uint32_t rows,
                                   orch_ft_progress *p) {
    orch_infer_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_seqs = n;
    b.seq_stride = sizeof(orch_seq_input);
    b.seqs = seqs;
    return api->coserve_step(ctx, n ? &b : NULL, logits, cap, stream, rows, p);
}

/* The n gradient floats of adapter id (malloc'd). */
static inline float *test_ft_grads(const orch_engine_api *api, orch_engine_ctx *ctx,
                                   uint32_t id, uint64_t n) {
    float *g = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(api->adapter_grads_read(ctx, id, 0, n, g), ORCH_OK);
    return g;
}

/* st is `want` and the context's message contains `word`. */
static inline void test_ft_expect_err(const orch_engine_api *api, orch_engine_ctx *ctx,
                                      int32_t st, int32_t want, const char *word) {
    ck_assert_msg(st == want, "status %d, want %d (%s)", st, want, api->last_error(ctx));
    ck_assert_msg(strstr(api->last_error(ctx), word) != NULL, "message '%s' lacks '%s'",
                  api->last_error(ctx), word);
}

/* The stream rules on adapter `id` (n_grads gradient floats) of ctx with the
 * micro-batch tokens/targets [B, T] (T <= context; call_tokens_max: the
 * engine's tokens per training call, over which a micro-batch is
 * ORCH_ERR_CAPACITY): while a stream is open and after it finished, the
 * adapter's PARAM writes, optimizer step and destroy are ORCH_ERR_STATE and
 * change nothing, while its moments, gradients and other adapters stay
 * usable; bad steps (short progress, unknown stream, a bad inference part)
 * change nothing; a step of 0 rows does nothing; close, then the stream id
 * is unknown and the adapter unlocked; bad micro-batches are refused with
 * their statuses; ids are not reused; a destroyed adapter cannot be
 * streamed; a stream whose targets are all -1 finishes with loss 0 and adds
 * no gradient. Leaves one stream open, for the caller's context_destroy to
 * release. */
static inline void test_ft_stream_rules(const orch_engine_api *api, orch_engine_ctx *ctx,
                                        uint32_t id, uint64_t n_grads,
                                        const int32_t *tokens, const int32_t *targets,
                                        uint32_t B, uint32_t T, uint32_t context,
                                        uint64_t call_tokens_max) {
    const uint64_t BT = (uint64_t)B * T;
    orch_lora_desc d = test_lora_desc(2, 4.0f, ORCH_LORA_TARGET_ATTN_OUT, 3);
    uint32_t other;
    ck_assert_int_eq(api->adapter_create(ctx, &d, &other), ORCH_OK);
    orch_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.struct_size = sizeof ti;
    ck_assert_int_eq(api->adapter_tensor_info(ctx, id, ORCH_TENSOR_PARAM, 0, &ti),
                     ORCH_OK);
    float *a0 = malloc(ti.numel * sizeof(float)), *a1 = malloc(ti.numel * sizeof(float));
    ck_assert_int_eq(api->adapter_tensor_read(ctx, id, ORCH_TENSOR_PARAM, 0, a0,
                                              ti.numel * sizeof(float)),
                     ORCH_OK);
    orch_adamw_params ap = test_adamw(1, 0.01f, 0.1f, 1.0f);
    float norm;

    orch_finetune_batch ft = test_ft_batch(id, tokens, targets, B, T, 1.0f);
    uint32_t s = 0, s_bad = 77;
    ck_assert_int_eq(api->ft_stream_open(ctx, &ft, &s), ORCH_OK);
    for (int phase = 0; phase < 2; phase++) { /* open and running; finished */
        test_ft_expect_err(api, ctx, api->adapter_optimizer_step(ctx, id, &ap, &norm),
                           ORCH_ERR_STATE, "stream");
        for (uint32_t i = 0; i < ti.numel; i++) a1[i] = a0[i] + 1.0f;
        test_ft_expect_err(api, ctx,
                           api->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, 0, a1,
                                                     ti.numel * sizeof(float)),
                           ORCH_ERR_STATE, "adapter_tensor_write");
        test_ft_expect_err(api, ctx, api->adapter_destroy(ctx, id), ORCH_ERR_STATE,
                           "adapter_destroy");
        ck_assert_int_eq(api->adapter_tensor_read(ctx, id, ORCH_TENSOR_PARAM, 0, a1,
                                                  ti.numel * sizeof(float)),
                         ORCH_OK);
        ck_assert(memcmp(a0, a1, ti.numel * sizeof(float)) == 0);
        /* moments, gradients and other adapters are not locked */
        ck_assert_int_eq(api->adapter_tensor_write(ctx, id, ORCH_TENSOR_ADAM_M, 0, a0,
                                                   ti.numel * sizeof(float)),
                         ORCH_OK);
        ck_assert_int_eq(api->adapter_grads_zero(ctx, id), ORCH_OK);
        ck_assert_int_eq(api->adapter_optimizer_step(ctx, other, &ap, &norm), ORCH_OK);
        /* bad steps change nothing */
        orch_ft_progress p = test_ft_progress0();
        p.struct_size = sizeof p - 8;
        test_ft_expect_err(api, ctx, test_ft_step(api, ctx, NULL, 0, NULL, 0, s, 5, &p),
                           ORCH_ERR_INVALID_ARGUMENT, "struct_size");
        p = test_ft_progress0();
        test_ft_expect_err(api, ctx,
                           test_ft_step(api, ctx, NULL, 0, NULL, 0, s_bad, 5, &p),
                           ORCH_ERR_INVALID_ARGUMENT, "stream 77");
        float lg[4];
        orch_seq_input q = test_seq_input(tokens, 1, 0, NULL, 0, ORCH_LOGITS_LAST);
        ck_assert_int_ne(test_ft_step(api, ctx, &q, 1, lg, 4, s, 5, &p),
                         ORCH_OK); /* no KV, cap */
        p = test_ft_progress0();
        ck_assert_int_eq(test_ft_step(api, ctx, NULL, 0, NULL, 0, s, 0, &p), ORCH_OK);
        ck_assert_uint_eq(p.rows_this_step, 0);
        ck_assert_uint_eq(p.forward_rows + p.backward_rows, phase ? 2 * BT : 0);
        if (phase == 0) { /* finish it, progress NULL */
            ck_assert_int_eq(
                test_ft_step(api, ctx, NULL, 0, NULL, 0, s, (uint32_t)(2 * BT), NULL),
                ORCH_OK);
            p = test_ft_progress0();
            ck_assert_int_eq(test_ft_step(api, ctx, NULL, 0, NULL, 0, s, 3, &p), ORCH_OK);
            ck_assert_uint_eq(p.finished, 1);
            ck_assert_uint_eq(p.rows_this_step, 0);
        }
    }
    ck_assert_int_eq(api->ft_stream_close(ctx, s), ORCH_OK);
    test_ft_expect_err(api, ctx, api->ft_stream_close(ctx, s), ORCH_ERR_INVALID_ARGUMENT,
                       "stream");
    test_ft_expect_err(api, ctx, test_ft_step(api, ctx, NULL, 0, NULL, 0, s, 1, NULL),
                       ORCH_ERR_INVALID_ARGUMENT, "stream");
    /* OK again after close */
    ck_assert_int_eq(api->adapter_optimizer_step(ctx, id, &ap, &norm), ORCH_OK);
    ck_assert_int_eq(api->adapter_tensor_write(ctx, id, ORCH_TENSOR_PARAM, 0, a0,
                                               ti.numel * sizeof(float)),
                     ORCH_OK);

    /* bad micro-batches */
    uint32_t out = 12345;
    orch_finetune_batch bad = ft;
    bad.adapter_id = 999;
    test_ft_expect_err(api, ctx, api->ft_stream_open(ctx, &bad, &out),
                       ORCH_ERR_INVALID_ARGUMENT, "adapter");
    bad = ft;
    bad.struct_size = 8;
    test_ft_expect_err(api, ctx, api->ft_stream_open(ctx, &bad, &out),
                       ORCH_ERR_INVALID_ARGUMENT, "struct_size");
    bad = ft;
    bad.reserved0 = 1;
    test_ft_expect_err(api, ctx, api->ft_stream_open(ctx, &bad, &out),
                       ORCH_ERR_INVALID_ARGUMENT, "reserved0");
    bad = ft;
    bad.tokens = NULL;
    ck_assert_int_eq(api->ft_stream_open(ctx, &bad, &out), ORCH_ERR_INVALID_ARGUMENT);
    bad = ft;
    bad.seq_len = context + 1;
    ck_assert_int_eq(api->ft_stream_open(ctx, &bad, &out), ORCH_ERR_INVALID_ARGUMENT);
    bad = ft;
    bad.batch =
        (uint32_t)(call_tokens_max / T + 1); /* over the engine's tokens per call */
    test_ft_expect_err(api, ctx, api->ft_stream_open(ctx, &bad, &out), ORCH_ERR_CAPACITY,
                       "");
    ck_assert_int_eq(api->ft_stream_open(ctx, NULL, &out), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(api->ft_stream_open(ctx, &ft, NULL), ORCH_ERR_INVALID_ARGUMENT);
    ck_assert_uint_eq(out, 12345);
    /* ids are not reused; a destroyed adapter cannot be streamed */
    uint32_t s2;
    ck_assert_int_eq(api->ft_stream_open(ctx, &ft, &s2), ORCH_OK);
    ck_assert_uint_gt(s2, s);
    ck_assert_int_eq(api->ft_stream_close(ctx, s2), ORCH_OK);
    ck_assert_int_eq(api->adapter_destroy(ctx, other), ORCH_OK);
    bad = ft;
    bad.adapter_id = other;
    ck_assert_int_eq(api->ft_stream_open(ctx, &bad, &out), ORCH_ERR_INVALID_ARGUMENT);
    /* every target ignored: no gradient, loss 0 (as adapter_forward_backward) */
    int32_t *none = malloc(BT * sizeof(int32_t));
    for (uint64_t i = 0; i < BT; i++) none[i] = -1;
    float *g0 = test_ft_grads(api, ctx, id, n_grads);
    bad = ft;
    bad.targets = none;
    ck_assert_int_eq(api->ft_stream_open(ctx, &bad, &s2), ORCH_OK);
    orch_ft_progress pn = test_ft_progress0();
    ck_assert_int_eq(
        test_ft_step(api, ctx, NULL, 0, NULL, 0, s2, (uint32_t)(2 * BT), &pn), ORCH_OK);
    ck_assert_uint_eq(pn.finished, 1);
    ck_assert(pn.loss == 0.0f);
    float *g1 = test_ft_grads(api, ctx, id, n_grads);
    ck_assert(memcmp(g0, g1, n_grads * sizeof(float)) == 0);
    ck_assert_int_eq(api->ft_stream_close(ctx, s2), ORCH_OK);
    free(g0);
    free(g1);
    free(none);
    /* left open: the caller's context_destroy must release it (asan) */
    ck_assert_int_eq(api->ft_stream_open(ctx, &ft, &s2), ORCH_OK);
    ck_assert_int_eq(test_ft_step(api, ctx, NULL, 0, NULL, 0, s2, 5, NULL), ORCH_OK);
    free(a0);
    free(a1);
}

#endif
