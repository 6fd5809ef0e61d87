/*
 * test_cpu_kvq.c - the CPU engine's KV-cache storage type (engine option
 * kv=auto|f32|bf16, engines/cpu/cpu_kvq.c):
 *
 *   - kernels (compiled into this test from the engine's sources): bf16
 *     rounding is to nearest even with NaN kept and the sign kept, the
 *     AVX-512 store gives the scalar bits on random and special values, the
 *     reader widens exactly; scores and mix of every version this CPU runs
 *     (AVX-512, AVX2, portable) against an fp64 product of the widened
 *     values (1e-5 relative to the sum of |terms|: fp32 summation only), for
 *     head sizes on and off the AVX-512 fast path (64, 32, 96, 48, 8); the
 *     grouped-head mix equals the per-head mix bit for bit, the grouped-head
 *     scores equal the per-head scores within 1e-5 of the sum of |terms|;
 *   - through the ABI, for kv=bf16 under every ISA cap and thread count:
 *     kv_block_bytes is half the f32 K/V bytes (plus the same bookkeeping);
 *     incremental decoding (uneven prefill chunks, the sgemm attention path
 *     of long chunks, single tokens, several sequences, shuffled tables)
 *     equals one full forward within EQUIV_REL of the largest logit;
 *     kv_copy_blocks gives the same bits as the original blocks; a forked
 *     prefix (copy on write) equals each branch's full forward; decoding the
 *     PyTorch fixtures (GPT-2 and the three LLaMA ones) stays within
 *     BF16_TOL of torch's fp64 logits (relative to the largest), while the
 *     logits do differ from kv=f32's (the option takes effect);
 *   - auto: bf16 with weights=int8, f32 otherwise; a bad value is a one-line
 *     error naming kv and the value.
 *
 * Tolerances. Both forwards of the equivalence test read the same rounded
 * K/V, but their fp32 K/V differ by ~1e-7 (OpenBLAS vs the packed kernel),
 * so an element close to a rounding boundary can land one bf16 ulp (2^-8
 * relative) apart: seen up to 1.2e-4 of the largest logit (C=128), hence
 * EQUIV_REL 1e-3 (fp32 K/V are within 1e-5, test_cpu_engine.c). Against
 * torch: K and V rounded once (relative error <= 2^-9 each) move the
 * scores by <= 2^-9 |q||k| and the outputs by <= 2^-9 max|v| per layer;
 * measured on the fixtures 0.39%-0.68% of the largest logit (printed), so
 * BF16_TOL 2e-2 leaves a margin of 3 (kv=f32 is within 1e-4 absolute).
 */
#include "engines/cpu/cpu_features.c"
#include "engines/cpu/cpu_kernels.c"
#include "engines/cpu/cpu_kvq.c"

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

TEST_ENGINE_FIXTURE("cpu")

#define BF16_TOL  2e-2
#define EQUIV_REL 1e-3

static float f_of(uint32_t b) {
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* ------------------------------------------------------------------------- */
/* Kernels                                                                    */
/* ------------------------------------------------------------------------- */

START_TEST(test_round) {
    ck_assert_uint_eq(cpu_kv_bf16_round(1.0f), 0x3f80);
    ck_assert_uint_eq(cpu_kv_bf16_round(-2.0f), 0xc000);
    /* ties to even: 0x3f808000 is half-way between 0x3f80 and 0x3f81 */
    ck_assert_uint_eq(cpu_kv_bf16_round(f_of(0x3f808000u)), 0x3f80);
    ck_assert_uint_eq(cpu_kv_bf16_round(f_of(0x3f818000u)), 0x3f82);
    ck_assert_uint_eq(cpu_kv_bf16_round(f_of(0x3f808001u)), 0x3f81);
    ck_assert_uint_eq(cpu_kv_bf16_round(f_of(0x3f807fffu)), 0x3f80);
    ck_assert_uint_eq(cpu_kv_bf16_round(INFINITY), 0x7f80);
    ck_assert_uint_eq(cpu_kv_bf16_round(-INFINITY), 0xff80);
    ck_assert_uint_eq(cpu_kv_bf16_round(f_of(0x7f7fffffu)), 0x7f80); /* overflow */
    const uint16_t nan = cpu_kv_bf16_round(f_of(0x7f800001u));       /* signalling NaN */
    ck_assert_msg((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0, "NaN -> %#x", nan);
    ck_assert_uint_eq(cpu_kv_bf16_round(-0.0f), 0x8000);
    /* Every version of put gives the scalar bits; get widens exactly. */
    enum { N = 1000 };
    static float src[N], back[N];
    static uint16_t ref[N], got[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) src[i] = f_of((uint32_t)(test_lcg64(&s) >> 32));
    src[5] = NAN, src[6] = INFINITY, src[7] = -0.0f, src[8] = f_of(0x00000001u);
    for (int i = 0; i < N; i++) ref[i] = cpu_kv_bf16_round(src[i]);
    for (int isa = CPU_ISA_GENERIC; isa <= cpu_kernels_isa(); isa++) {
        memset(got, 0, sizeof got);
        cpu_kv_put(isa, CPU_KV_BF16, got, src, N);
        ck_assert_msg(memcmp(got, ref, sizeof ref) == 0, "put differs on isa %d", isa);
        cpu_kv_get(isa, CPU_KV_BF16, back, got, N);
        for (int i = 0; i < N; i++) {
            uint32_t b;
            memcpy(&b, &back[i], sizeof b);
            ck_assert_uint_eq(b, (uint32_t)ref[i] << 16);
        }
    }
}
END_TEST

static float unit(uint64_t *s) {
    return (float)((test_lcg64(s) >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
}

/* Scores and mix of bf16 head vectors on every ISA this CPU runs, against
 * fp64 on the widened values. */
START_TEST(test_scores_mix) {
    static const size_t hss[] = { 64, 32, 96, 48, 8 };
    static const size_t ns[] = { 1, 15, 16, 17, 70 };
    enum { MAXP = 70, MAXH = 96, HEADS = 5 };
    static uint16_t kv[2][MAXP][HEADS * MAXH];
    static float q[MAXH], w[MAXP], out[HEADS * MAXH], sc[MAXP];
    uint64_t s = 11;
    for (size_t hi = 0; hi < sizeof hss / sizeof *hss; hi++) {
        const size_t hs = hss[hi];
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const size_t n = ns[ni];
            float row[HEADS * MAXH];
            for (size_t p = 0; p < n; p++)
                for (int which = 0; which < 2; which++) {
                    for (size_t i = 0; i < HEADS * hs; i++) row[i] = 3.0f * unit(&s);
                    cpu_kv_put(CPU_ISA_GENERIC, CPU_KV_BF16, kv[which][p], row,
                               HEADS * hs);
                }
            for (size_t i = 0; i < hs; i++) q[i] = unit(&s);
            float wsum = 0.0f;
            for (size_t p = 0; p < n; p++) wsum += (w[p] = unit(&s) + 0.6f);
            for (size_t p = 0; p < n; p++) w[p] /= wsum;
            const void *kp[MAXP], *vp[MAXP], *rows[MAXP], *rows_k[MAXP], *tmp[MAXP];
            for (size_t p = 0; p < n; p++) {
                kp[p] = kv[0][p] + 2 * hs; /* head 2 */
                vp[p] = kv[1][p] + 2 * hs;
                rows[p] = kv[1][p];
                rows_k[p] = kv[0][p];
            }
            for (int isa = CPU_ISA_GENERIC; isa <= cpu_kernels_isa(); isa++) {
                cpu_kv_scores(isa, CPU_KV_BF16, q, kp, n, hs, 0.5f, sc);
                for (size_t p = 0; p < n; p++) {
                    double r = 0, mag = 0;
                    for (size_t i = 0; i < hs; i++) {
                        double t = (double)q[i] * bf16_to_f32(kv[0][p][2 * hs + i]);
                        r += t;
                        mag += fabs(t);
                    }
                    ck_assert_msg(fabs(sc[p] - 0.5 * r) <= 1e-5 * mag + 1e-7,
                                  "isa %d hs %zu n %zu score %zu: %g vs %g", isa, hs, n,
                                  p, sc[p], 0.5 * r);
                }
                cpu_kv_mix(isa, CPU_KV_BF16, w, vp, n, hs, out);
                for (size_t i = 0; i < hs; i++) {
                    double r = 0, mag = 0;
                    for (size_t p = 0; p < n; p++) {
                        double t = (double)w[p] * bf16_to_f32(kv[1][p][2 * hs + i]);
                        r += t;
                        mag += fabs(t);
                    }
                    ck_assert_msg(fabs(out[i] - r) <= 1e-5 * mag + 1e-7,
                                  "isa %d hs %zu n %zu mix %zu: %g vs %g", isa, hs, n, i,
                                  out[i], r);
                }
                /* Scores of heads 1..4 grouped (one query of all heads) against
                 * the per-head scores: the same products, summed in another
                 * order on AVX-512. */
                static float qall[HEADS * MAXH], scg[HEADS][MAXP], sc1[MAXP];
                for (size_t i = 0; i < HEADS * hs; i++) qall[i] = unit(&s);
                cpu_kv_scores_heads(isa, CPU_KV_BF16, qall, rows_k, n, 1, HEADS - 1, hs,
                                    0.25f, &scg[0][0], MAXP, tmp);
                for (size_t h = 1; h < HEADS; h++) {
                    for (size_t p = 0; p < n; p++) tmp[p] = kv[0][p] + h * hs;
                    cpu_kv_scores(isa, CPU_KV_BF16, qall + h * hs, tmp, n, hs, 0.25f,
                                  sc1);
                    for (size_t p = 0; p < n; p++) {
                        double mag = 0;
                        for (size_t i = 0; i < hs; i++)
                            mag += fabs((double)qall[h * hs + i] *
                                        bf16_to_f32(kv[0][p][h * hs + i]));
                        ck_assert_msg(
                            fabs(scg[h - 1][p] - sc1[p]) <= 0.25 * 1e-5 * mag + 1e-7,
                            "isa %d hs %zu n %zu: grouped score head %zu pos %zu: "
                            "%g vs %g",
                            isa, hs, n, h, p, scg[h - 1][p], sc1[p]);
                    }
                }
                /* Heads 1..4 grouped, with their own weights (ldsc = MAXP). */
                static float scw[HEADS][MAXP], grouped[HEADS * MAXH], one[MAXH];
                for (int h = 0; h < HEADS; h++)
                    for (size_t p = 0; p < n; p++) scw[h][p] = w[(p + (size_t)h) % n];
                cpu_kv_mix_heads(isa, CPU_KV_BF16, &scw[0][0], MAXP, rows, n, 1,
                                 HEADS - 1, hs, tmp, grouped);
                for (size_t h = 1; h < HEADS; h++) {
                    for (size_t p = 0; p < n; p++) tmp[p] = kv[1][p] + h * hs;
                    cpu_kv_mix(isa, CPU_KV_BF16, scw[h - 1], tmp, n, hs, one);
                    ck_assert_msg(memcmp(one, grouped + h * hs, hs * sizeof(float)) == 0,
                                  "isa %d hs %zu n %zu: grouped head %zu differs", isa,
                                  hs, n, h);
                }
            }
        }
    }
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Through the engine                                                         */
/* ------------------------------------------------------------------------- */

static const char *const variants[] = {
    "kv=bf16",           "kv=bf16,isa=avx2", "kv=bf16,isa=generic",
    "kv=bf16,threads=1", "kv=bf16,skinny=0", "kv=bf16,threads=3,skinny=4",
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

static orch_engine_ctx *make_ctx(const orch_model_desc *m, uint32_t threads,
                                 const char *options) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(&H, m, threads, 1, options, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", options ? options : "", err);
    return ctx;
}

static void fill_random_params(orch_engine_ctx *ctx, uint32_t seed) {
    test_table t;
    test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
    float *all = malloc(t.total * sizeof(float));
    uint64_t s = seed * 2654435761u + 1;
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info *ti = &t.info[i];
        int ln_w = strstr(ti->name, "ln_") && strstr(ti->name, ".weight");
        for (uint64_t k = 0; k < ti->numel; k++) {
            float u = unit(&s);
            all[ti->offset + k] =
                ln_w ? 1.0f + 0.2f * u : (ti->ndim == 2 ? 0.4f * u : 0.2f * u);
        }
    }
    test_write_kind(A, ctx, ORCH_TENSOR_PARAM, &t, all);
    free(all);
}

START_TEST(test_block_bytes_and_options) {
    orch_model_desc m = test_model_desc(53, 64, 3, 2, 64);
    uint64_t f32 = 0, bf = 0, autoq = 0, autof = 0;
    orch_engine_ctx *a = make_ctx(&m, 1, "kv=f32");
    orch_engine_ctx *b = make_ctx(&m, 1, "kv=bf16");
    orch_engine_ctx *c = make_ctx(&m, 1, "weights=int8");
    orch_engine_ctx *d = make_ctx(&m, 1, NULL);
    ck_assert_int_eq(A->kv_block_bytes(a, 16, &f32), ORCH_OK);
    ck_assert_int_eq(A->kv_block_bytes(b, 16, &bf), ORCH_OK);
    ck_assert_int_eq(A->kv_block_bytes(c, 16, &autoq), ORCH_OK);
    ck_assert_int_eq(A->kv_block_bytes(d, 16, &autof), ORCH_OK);
    const uint64_t values = 3ull * 2 * 64 * 16; /* layers * K,V * width * block */
    ck_assert_uint_eq(f32 - bf, values * 2);    /* 4 bytes -> 2 bytes a value */
    ck_assert_uint_ge(bf, values * 2);
    ck_assert_uint_le(bf, values * 2 + 64);
    ck_assert_uint_eq(autoq, bf); /* auto: bf16 with weights=int8 */
    ck_assert_uint_eq(autof, f32);
    /* The pool is allocated at the real size: a configure and a decode work. */
    ck_assert_int_eq(A->kv_configure(b, 16, 4), ORCH_OK);
    A->context_destroy(a);
    A->context_destroy(b);
    A->context_destroy(c);
    A->context_destroy(d);
    static const char *const bad[] = { "kv=f16", "kv=int4", "kv=" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        orch_engine_ctx *x = NULL;
        char err[1024] = "";
        int rc = engine_create_context(&H, &m, 1, 1, bad[i], &x, err, sizeof err);
        ck_assert_msg(rc != 0 && x == NULL, "%s accepted", bad[i]);
        ck_assert_msg(strstr(err, "kv") && !strchr(err, '\n'), "%s: '%s'", bad[i], err);
        if (bad[i][3]) ck_assert_msg(strstr(err, bad[i] + 3), "%s: '%s'", bad[i], err);
    }
}
END_TEST

/* Incremental decoding (chunks, long chunks on the sgemm path, single
 * tokens, 3 sequences in one batch, shuffled tables) against one full
 * forward per sequence in the same context: within 1e-5 under kv=bf16. Head
 * sizes 64 and 32 (AVX-512 fast paths) and 8 (portable). */
START_TEST(test_equivalence) {
    const char *opt = variants[_i % N_VARIANTS];
    static const uint32_t widths[3][2] = { { 128, 2 }, { 64, 2 }, { 24, 3 } };
    const uint32_t C = widths[_i / N_VARIANTS][0], NH = widths[_i / N_VARIANTS][1];
    enum { V = 61, T = 64, SEQS = 3 };
    orch_model_desc m = test_model_desc(V, T, 2, NH, C);
    orch_engine_ctx *ctx = make_ctx(&m, 3, opt);
    fill_random_params(ctx, 5 + _i);
    static const uint32_t len[SEQS] = { 45, 23, 12 };
    static const uint32_t chunks[SEQS][4] = { { 5, 12, 9, 0 },
                                              { 1, 6, 0, 0 },
                                              { 4, 0, 0, 0 } };
    int32_t tok[SEQS][T];
    uint64_t s = 77;
    for (int q = 0; q < SEQS; q++)
        for (uint32_t k = 0; k < len[q]; k++)
            tok[q][k] = (int32_t)((test_lcg64(&s) >> 33) % V);
    const uint32_t bs = 4, nb = 60;
    ck_assert_int_eq(A->kv_configure(ctx, bs, nb), ORCH_OK);
    float *ref[SEQS];
    int32_t full_table[12];
    for (uint32_t b = 0; b < 12; b++) full_table[b] = (int32_t)b;
    for (int q = 0; q < SEQS; q++) {
        ref[q] = malloc((size_t)len[q] * V * sizeof(float));
        orch_seq_input one =
            test_seq_input(tok[q], len[q], 0, full_table, 12, ORCH_LOGITS_ALL);
        ck_assert_int_eq(test_infer(A, ctx, &one, 1, ref[q], (uint64_t)len[q] * V),
                         ORCH_OK);
    }
    int32_t table[SEQS][16];
    for (int q = 0; q < SEQS; q++)
        for (int b = 0; b < 16; b++) table[q][b] = 12 + ((b * SEQS + q) * 7) % 48;
    uint32_t pos[SEQS] = { 0 }, ci[SEQS] = { 0 };
    float *out = malloc((size_t)SEQS * 16 * V * sizeof(float));
    double worst = 0.0, mag = 0.0;
    for (;;) {
        orch_seq_input in[SEQS];
        int idx[SEQS], n = 0;
        for (int q = 0; q < SEQS; q++) {
            if (pos[q] >= len[q]) continue;
            uint32_t c = chunks[q][ci[q]] ? chunks[q][ci[q]++] : 1;
            if (pos[q] + c > len[q]) c = len[q] - pos[q];
            in[n] = test_seq_input(tok[q] + pos[q], c, pos[q], table[q],
                                   (pos[q] + c + bs - 1) / bs,
                                   c > 1 ? ORCH_LOGITS_ALL : ORCH_LOGITS_LAST);
            idx[n++] = q;
        }
        if (n == 0) break;
        int32_t st = test_infer(A, ctx, in, (uint32_t)n, out, (uint64_t)SEQS * 16 * V);
        ck_assert_msg(st == ORCH_OK, "[%s] %s", opt, A->last_error(ctx));
        const float *row = out;
        for (int k = 0; k < n; k++) {
            const int q = idx[k];
            for (uint32_t t = 0; t < in[k].n_tokens; t++, row += V) {
                const float *r = ref[q] + (size_t)(pos[q] + t) * V;
                worst = fmax(worst, test_max_diff(row, r, V));
                mag = fmax(mag, test_max_abs(r, V));
            }
            pos[q] += in[k].n_tokens;
        }
    }
    ck_assert_msg(mag > 0.5, "[%s C=%u] logits too small (%g)", opt, C, mag);
    if (_i % N_VARIANTS == 0)
        printf("test_cpu_kvq: [%s C=%u] incremental vs full %.3g, max |logit| %.3g\n",
               opt, C, worst, mag);
    ck_assert_msg(worst <= EQUIV_REL * mag,
                  "[%s C=%u] incremental vs full: %g (max |logit| %g)", opt, C, worst,
                  mag);
    for (int q = 0; q < SEQS; q++) free(ref[q]);
    free(out);
    A->context_destroy(ctx);
}
END_TEST

/* kv_copy_blocks and a forked prefix under kv=bf16. */
START_TEST(test_copy_and_fork) {
    const char *opt = variants[_i];
    enum { V = 61 };
    orch_model_desc m = test_model_desc(V, 32, 2, 2, 64);
    orch_engine_ctx *ctx = make_ctx(&m, 2, opt);
    fill_random_params(ctx, 8);
    ck_assert_int_eq(A->kv_configure(ctx, 4, 16), ORCH_OK);
    int32_t prompt[7] = { 1, 2, 3, 4, 5, 6, 7 }, a_tok = 8, b_tok = 9;
    /* Copy: blocks 0, 1 to 5, 6; the next token decodes to the same bits. */
    int32_t orig[3] = { 0, 1, 2 }, copy[3] = { 5, 6, 7 };
    orch_seq_input s = test_seq_input(prompt, 7, 0, orig, 2, ORCH_LOGITS_NONE);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, NULL, 0), ORCH_OK);
    ck_assert_int_eq(A->kv_copy_blocks(ctx, orig, copy, 2), ORCH_OK);
    float la[V], lb[V], ra[V], rb[V];
    s = test_seq_input(&a_tok, 1, 7, copy, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, lb, V), ORCH_OK);
    s = test_seq_input(&a_tok, 1, 7, orig, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, la, V), ORCH_OK);
    ck_assert_msg(memcmp(la, lb, sizeof la) == 0, "[%s] copied blocks decode differently",
                  opt);
    /* Fork after 6 tokens: block 1 is shared partially, so branch b gets a
     * copy (block 3) and both branches decode in one batch. */
    int32_t ta[2] = { 8, 9 }, tb[2] = { 8, 10 };
    s = test_seq_input(prompt, 6, 0, ta, 2, ORCH_LOGITS_NONE);
    ck_assert_int_eq(test_infer(A, ctx, &s, 1, NULL, 0), ORCH_OK);
    int32_t src = 9, dst = 10;
    ck_assert_int_eq(A->kv_copy_blocks(ctx, &src, &dst, 1), ORCH_OK);
    orch_seq_input br[2] = { test_seq_input(&a_tok, 1, 6, ta, 2, ORCH_LOGITS_LAST),
                             test_seq_input(&b_tok, 1, 6, tb, 2, ORCH_LOGITS_LAST) };
    float both[2 * V];
    ck_assert_int_eq(test_infer(A, ctx, br, 2, both, 2 * V), ORCH_OK);
    int32_t full[7], t3[2] = { 12, 13 };
    memcpy(full, prompt, 6 * sizeof(int32_t));
    full[6] = a_tok;
    orch_seq_input fa = test_seq_input(full, 7, 0, t3, 2, ORCH_LOGITS_LAST);
    ck_assert_int_eq(test_infer(A, ctx, &fa, 1, ra, V), ORCH_OK);
    full[6] = b_tok;
    ck_assert_int_eq(test_infer(A, ctx, &fa, 1, rb, V), ORCH_OK);
    ck_assert_msg(test_max_diff(both, ra, V) <= 1e-5 &&
                      test_max_diff(both + V, rb, V) <= 1e-5,
                  "[%s] forked branches differ from their full forwards", opt);
    ck_assert_msg(memcmp(both, both + V, V * sizeof(float)) != 0,
                  "branches should differ");
    A->context_destroy(ctx);
}
END_TEST

/* The PyTorch fixtures decoded with kv=bf16: prefill of 5 (vector path) or
 * 9 (sgemm path), then one token at a time, every row against torch. */
static double decode_fixture(const char *path, int llama, const char *opt,
                             double *diff_f32) {
    safetensors_file *f = test_fixture_open(path);
    orch_model_desc m;
    if (llama) {
        m = test_fixture_llama_model(f);
    } else {
        m = test_model_desc((uint32_t)test_fixture_meta(f, "vocab_size"),
                            (uint32_t)test_fixture_meta(f, "context"),
                            (uint32_t)test_fixture_meta(f, "layers"),
                            (uint32_t)test_fixture_meta(f, "heads"),
                            (uint32_t)test_fixture_meta(f, "width"));
        m.mlp_width = (uint32_t)test_fixture_meta(f, "mlp_width");
        m.layernorm_eps = (float)test_fixture_meta(f, "layernorm_eps");
    }
    const uint32_t T = (uint32_t)test_fixture_meta(f, "seq_len"), V = m.vocab_size;
    size_t n;
    const int32_t *tokens = test_fixture_get(f, "tokens", SAFETENSORS_I32, &n);
    const float *ref = test_fixture_f32(f, "logits", &n);
    double worst = 0.0;
    float *got[2];
    const char *opts[2] = { opt, "kv=f32" };
    for (int o = 0; o < 2; o++) {
        orch_engine_ctx *ctx = make_ctx(&m, 0, opts[o]);
        test_load_fixture_params(A, ctx, f);
        ck_assert_int_eq(A->kv_configure(ctx, 4, 8), ORCH_OK);
        int32_t tab[4] = { 6, 1, 4, 3 };
        got[o] = malloc((size_t)2 * T * V * sizeof(float));
        for (uint32_t q = 0; q < 2; q++) { /* both sequences, one after the other */
            const uint32_t pre = q ? 9 : 5;
            orch_seq_input s =
                test_seq_input(tokens + q * T, pre, 0, tab, 4, ORCH_LOGITS_ALL);
            float *dst = got[o] + (size_t)q * T * V;
            ck_assert_int_eq(test_infer(A, ctx, &s, 1, dst, (uint64_t)pre * V), ORCH_OK);
            for (uint32_t p = pre; p < T; p++) {
                s = test_seq_input(tokens + q * T + p, 1, p, tab, 4, ORCH_LOGITS_LAST);
                ck_assert_int_eq(test_infer(A, ctx, &s, 1, dst + (size_t)p * V, V),
                                 ORCH_OK);
            }
        }
        if (o == 0)
            worst = test_max_diff(got[0], ref, (uint64_t)2 * T * V) /
                    test_max_abs(ref, (uint64_t)2 * T * V);
        A->context_destroy(ctx);
    }
    *diff_f32 = test_max_diff(got[0], got[1], (uint64_t)2 * T * V);
    free(got[0]);
    free(got[1]);
    safetensors_close(f);
    return worst;
}

START_TEST(test_torch_fixtures) {
    static const char *const fx[4] = {
        "tests/fixtures/cpu_gpt2_tiny.safetensors",
        "tests/fixtures/cpu_llama_tiny_kv1.safetensors",
        "tests/fixtures/cpu_llama_tiny_kv2.safetensors",
        "tests/fixtures/cpu_llama_tiny_kv4.safetensors",
    };
    const char *opt = variants[_i];
    for (int k = 0; k < 4; k++) {
        double vs_f32 = 0.0;
        const double d = decode_fixture(fx[k], k > 0, opt, &vs_f32);
        if (_i == 0)
            printf("test_cpu_kvq: %s kv=bf16 decode vs torch %.3g, vs kv=f32 %.3g\n",
                   fx[k] + 15, d, vs_f32);
        ck_assert_msg(d <= BF16_TOL, "[%s] %s: bf16 decode vs torch %g", opt, fx[k], d);
        ck_assert_msg(vs_f32 > 0.0, "[%s] %s: kv=bf16 gave the f32 logits bit for bit",
                      opt, fx[k]);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_kvq");
    TCase *tc = tcase_create("kernels");
    tcase_add_test(tc, test_round);
    tcase_add_test(tc, test_scores_mix);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_block_bytes_and_options);
    tcase_add_loop_test(tc, test_equivalence, 0, 3 * N_VARIANTS);
    tcase_add_loop_test(tc, test_copy_and_fork, 0, N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_fixtures, 0, N_VARIANTS);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
