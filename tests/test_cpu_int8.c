/*
 * test_cpu_int8.c - the CPU engine's weight-only int8 format (engine option
 * weights=int8, engines/cpu/cpu_quant.c):
 *
 *   - quantization: |w - dequant| <= scale/2 per 32-block, |q| <= 127, and
 *     rounding values already on the grid returns them bit for bit;
 *   - every kernel version this CPU runs (AMX-INT8, AVX512-VNNI, AVX-VNNI,
 *     AVX2, portable C; the others are skipped with one line) on odd shapes:
 *     against an fp64 product of the dequantized weights with the fp32
 *     activations (bound: the activations' own rounding to int8), against an
 *     fp64 product with the quantized activations (1e-5), and bit-identical
 *     to each other;
 *   - through the engine ABI: tensor_read returns the dequantized values
 *     (other tensors untouched), training is refused with one line,
 *     eval_loss runs on the dequantized weights, an int8_kernel the CPU or
 *     isa= lacks is refused, incremental decoding on the int8 kernels is
 *     within tolerance of one full forward (OpenBLAS on the dequantized
 *     weights) and bit-identical across kernels and thread counts;
 *   - the quality gate (issue 11, item 3) on a small model trained here for
 *     a few hundred steps on a Markov-chain corpus: validation perplexity
 *     through the int8 decode path within 1% of fp32, and 64 greedy tokens
 *     compared (the first divergence is printed).
 *
 * The kernels are compiled into this test from the engine's own sources
 * (CPU_QUANT_KERNELS_ONLY leaves out the engine glue); the ABI tests load
 * libengine_cpu.so like orch does.
 */
#define CPU_QUANT_KERNELS_ONLY 1
#include "engines/cpu/cpu_features.c"
#include "engines/cpu/cpu_kernels.c"
#include "engines/cpu/cpu_quant.c"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "tests/test_util.h"

TEST_ENGINE_FIXTURE("cpu")

static float urand(uint64_t *s) {
    return (float)((test_lcg64(s) >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
}

/* ------------------------------------------------------------------------- */
/* Quantization                                                               */
/* ------------------------------------------------------------------------- */

START_TEST(test_quantize_round_trip) {
    uint64_t s = 11;
    const size_t N = 37, K = 101; /* last block of each row: 5 values */
    float *w = malloc(N * K * sizeof(float)), *r = malloc(N * K * sizeof(float));
    for (size_t i = 0; i < N * K; i++) {
        float u = urand(&s);
        /* Rows of very different magnitudes, a zero block, exact ties. */
        w[i] = u * powf(10.0f, (float)((i / K) % 7) - 4.0f);
    }
    for (size_t k = 32; k < 64; k++) w[3 * K + k] = 0.0f;
    memcpy(r, w, N * K * sizeof(float));
    cpu_q8_round_rows(r, N, K);
    for (size_t n = 0; n < N; n++)
        for (size_t k0 = 0; k0 < K; k0 += CPU_Q8_BLOCK) {
            size_t len = K - k0 < CPU_Q8_BLOCK ? K - k0 : CPU_Q8_BLOCK;
            const float *a = w + n * K + k0, *b = r + n * K + k0;
            float amax = 0.0f;
            for (size_t i = 0; i < len; i++) amax = fmaxf(amax, fabsf(a[i]));
            const double sc = amax / 127.0;
            for (size_t i = 0; i < len; i++) {
                double err = fabs((double)a[i] - b[i]);
                ck_assert_msg(err <= sc / 2 * (1 + 1e-6) + 1e-38,
                              "row %zu k %zu: |%g - %g| > scale/2 = %g", n, k0 + i, a[i],
                              b[i], sc / 2);
                if (sc > 0) {
                    double q = b[i] / sc;
                    ck_assert_msg(fabs(q - nearbyint(q)) < 1e-3 && fabs(q) <= 127.001,
                                  "row %zu k %zu: %g is not on the grid (q %g)", n,
                                  k0 + i, b[i], q);
                } else {
                    ck_assert(b[i] == 0.0f);
                }
            }
        }
    /* Idempotent: the grid values round to themselves. */
    float *r2 = malloc(N * K * sizeof(float));
    memcpy(r2, r, N * K * sizeof(float));
    cpu_q8_round_rows(r2, N, K);
    ck_assert(memcmp(r, r2, N * K * sizeof(float)) == 0);
    /* Every full block: the vector path (if any) gives the scalar formula's
     * bits, NaN and infinity included. */
    w[5 * K + 3] = NAN;
    w[6 * K + 40] = INFINITY;
    for (size_t n = 0; n < N; n++)
        for (size_t k0 = 0; k0 + CPU_Q8_BLOCK <= K; k0 += CPU_Q8_BLOCK) {
            const float *a = w + n * K + k0;
            int8_t qv[CPU_Q8_BLOCK], qr[CPU_Q8_BLOCK];
            float amax = 0.0f;
            for (int i = 0; i < CPU_Q8_BLOCK; i++)
                if (fabsf(a[i]) > amax) amax = fabsf(a[i]);
            const float sr = amax / 127.0f;
            for (int i = 0; i < CPU_Q8_BLOCK; i++) {
                float r = sr > 0.0f ? nearbyintf(a[i] / sr) : 0.0f;
                qr[i] = (int8_t)(!(r >= -127.0f) ? -127 : r > 127.0f ? 127 : (int)r);
            }
            const float sv = cpu_q8_quantize_block(a, CPU_Q8_BLOCK, qv);
            ck_assert_msg(memcmp(&sv, &sr, sizeof sv) == 0 &&
                              memcmp(qv, qr, sizeof qv) == 0,
                          "row %zu block %zu: quantize_block differs from the formula", n,
                          k0 / CPU_Q8_BLOCK);
        }
    /* One block: s and q. */
    int8_t q[CPU_Q8_BLOCK];
    const float v[4] = { -2.54f, 1.27f, 0.0f, 0.01f };
    float sc = cpu_q8_quantize_block(v, 4, q);
    ck_assert(fabsf(sc - 0.02f) < 1e-7f);
    ck_assert_int_eq(q[0], -127);
    ck_assert_int_eq(q[1], 64); /* 63.5 rounds to even */
    ck_assert_int_eq(q[2], 0);
    ck_assert_int_eq(q[3], 0);
    free(w);
    free(r);
    free(r2);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Kernels                                                                    */
/* ------------------------------------------------------------------------- */

typedef struct shape {
    int M;
    size_t N, K;
} shape;

static const shape shapes[] = { { 1, 37, 45 },   { 3, 16, 32 },  { 7, 50, 100 },
                                { 16, 33, 773 }, { 9, 17, 3 },   { 5, 64, 256 },
                                { 24, 40, 96 },  { 40, 19, 70 }, { 4, 48, 130 },
                                { 20, 21, 64 },  { 2, 30, 66 },  { 17, 16, 4200 } };

START_TEST(test_kernels_vs_reference) {
    const shape sh = shapes[_i];
    const int M = sh.M;
    const size_t N = sh.N, K = sh.K;
    uint64_t s = 1000 + (uint64_t)_i;
    float *w = malloc(N * K * sizeof(float)), *x = malloc((size_t)M * K * sizeof(float));
    float *bias = malloc(N * sizeof(float));
    for (size_t i = 0; i < N * K; i++) w[i] = urand(&s) * (1.0f + (float)(i % 7));
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = 3.0f * urand(&s);
    for (size_t i = 0; i < N; i++) bias[i] = urand(&s);
    float *wd = malloc(N * K * sizeof(float));
    memcpy(wd, w, N * K * sizeof(float));
    cpu_q8_round_rows(wd, N, K);
    const size_t np = cpu_panel_count(N);
    uint8_t *wp = aligned_alloc(64, (cpu_q8_packed_bytes(N, K) + 63) & ~(size_t)63);
    /* Packed in two panel ranges, as threads would. */
    cpu_q8_pack_panels(N, K, w, wp, 0, np / 2);
    cpu_q8_pack_panels(N, K, w, wp, np / 2, np);
    uint8_t *xq = malloc(cpu_q8_act_bytes((size_t)M, K));
    const size_t ldy = N + 3;
    float *y = malloc((size_t)M * ldy * sizeof(float));
    float *y0 = malloc((size_t)M * ldy * sizeof(float));
    int ran = 0;
    for (int kern = CPU_Q8_GENERIC; kern < CPU_Q8_KERNELS; kern++) {
        char why[256];
        if (cpu_q8_select(CPU_ISA_AVX512, kern, why, sizeof why) < 0) {
            if (_i == 0)
                printf("test_cpu_int8: skipping the %s kernel: %s\n",
                       cpu_q8_kernel_name(kern), why);
            continue;
        }
        ran++;
        cpu_q8_quantize_act(kern, (size_t)M, K, x, K, xq);
        /* The activation bytes are the scalar formula's (vector path or not). */
        const size_t nbk = cpu_q8_blocks(K), rb = act_row_bytes(K);
        for (int m = 0; m < M; m++)
            for (size_t b = 0; b < nbk; b++) {
                const float *xr = x + (size_t)m * K + b * CPU_Q8_BLOCK;
                size_t len = K - b * CPU_Q8_BLOCK < CPU_Q8_BLOCK ? K - b * CPU_Q8_BLOCK
                                                                 : CPU_Q8_BLOCK;
                float amax = 0.0f;
                for (size_t i = 0; i < len; i++) amax = fmaxf(amax, fabsf(xr[i]));
                const float id = amax > 0.0f ? 127.0f / amax : 0.0f, sc = amax / 127.0f;
                const uint8_t *row = xq + (size_t)m * rb;
                ck_assert(memcmp(row + b * 4, &sc, sizeof sc) == 0);
                for (size_t i = 0; i < CPU_Q8_BLOCK; i++) {
                    int v = i < len ? (int)nearbyintf(xr[i] * id) : 0;
                    v = v < -127 ? -127 : v > 127 ? 127 : v;
                    int u = kern >= CPU_Q8_AVXVNNI ? v + 128 : abs(v);
                    const size_t at = b * CPU_Q8_BLOCK + i;
                    ck_assert_msg((int8_t)row[nbk * 4 + at] == v &&
                                      (kern == CPU_Q8_GENERIC ||
                                       row[nbk * (4 + CPU_Q8_BLOCK) + at] == u),
                                  "%s: activation row %d k %zu", cpu_q8_kernel_name(kern),
                                  m, at);
                }
            }
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < (size_t)M * ldy; i++) y[i] = 0.25f * (float)(i % 5);
            /* Panels in two calls (a thread split). */
            cpu_q8_matmul(kern, M, N, K, xq, wp, acc ? bias : NULL, y, ldy, acc, 0, 1);
            cpu_q8_matmul(kern, M, N, K, xq, wp, acc ? bias : NULL, y, ldy, acc, 1, np);
            const size_t nb = cpu_q8_blocks(K), rowb = act_row_bytes(K);
            for (int m = 0; m < M; m++) {
                const float *sx = (const float *)(const void *)(xq + (size_t)m * rowb);
                const int8_t *qx = (const int8_t *)(xq + (size_t)m * rowb + nb * 4);
                for (size_t n = 0; n < N; n++) {
                    double ref = 0, refq = 0, bound = 0, mag = 0;
                    for (size_t k = 0; k < K; k++) {
                        double wv = wd[n * K + k];
                        ref += wv * x[(size_t)m * K + k];
                        refq += wv * (double)qx[k] * sx[k / CPU_Q8_BLOCK];
                        bound += fabs(wv) * sx[k / CPU_Q8_BLOCK] / 2;
                        mag += fabs(wv * x[(size_t)m * K + k]);
                    }
                    double base = acc ? 0.25 * (double)((m * ldy + n) % 5) + bias[n] : 0;
                    double got = y[(size_t)m * ldy + n] - base;
                    double tol = 1e-5 * (mag + fabs(base) + 1e-3);
                    ck_assert_msg(fabs(got - refq) <= tol,
                                  "%s M%d N%zu K%zu acc%d [%d,%zu]: %g vs q-ref %g",
                                  cpu_q8_kernel_name(kern), M, N, K, acc, m, n, got,
                                  refq);
                    ck_assert_msg(fabs(got - ref) <= bound + tol,
                                  "%s M%d N%zu K%zu [%d,%zu]: %g vs ref %g (bound %g)",
                                  cpu_q8_kernel_name(kern), M, N, K, m, n, got, ref,
                                  bound);
                }
                /* Past N and the stride padding: untouched. */
                for (size_t n = N; n < ldy; n++)
                    ck_assert(y[(size_t)m * ldy + n] ==
                              0.25f * (float)((m * ldy + n) % 5));
            }
            if (acc) {
                if (kern == CPU_Q8_GENERIC)
                    memcpy(y0, y, (size_t)M * ldy * sizeof(float));
                else
                    ck_assert_msg(memcmp(y, y0, (size_t)M * ldy * sizeof(float)) == 0,
                                  "%s differs from the generic kernel (M%d N%zu K%zu)",
                                  cpu_q8_kernel_name(kern), M, N, K);
            }
        }
    }
    ck_assert_int_ge(ran, 1);
    free(w);
    free(x);
    free(bias);
    free(wd);
    free(wp);
    free(xq);
    free(y);
    free(y0);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Engine ABI                                                                 */
/* ------------------------------------------------------------------------- */

static orch_engine_ctx *make_ctx(const orch_model_desc *m, uint32_t threads,
                                 const char *options) {
    orch_engine_ctx *ctx = NULL;
    char err[1024];
    int rc = engine_create_context(&H, m, threads, 1, options, &ctx, err, sizeof err);
    ck_assert_msg(rc == 0, "create (%s): %s", options ? options : "", err);
    return ctx;
}

static float *random_params(const test_table *t, uint64_t seed) {
    float *all = malloc(t->total * sizeof(float));
    uint64_t s = seed;
    for (uint32_t i = 0; i < t->n; i++) {
        const orch_tensor_info *ti = &t->info[i];
        int ln_w = strstr(ti->name, "ln_") && strstr(ti->name, ".weight");
        for (uint64_t k = 0; k < ti->numel; k++) {
            float u = urand(&s);
            all[ti->offset + k] =
                ln_w ? 1.0f + 0.2f * u : (ti->ndim == 2 ? 0.6f * u : 0.2f * u);
        }
    }
    return all;
}

static int is_int8_tensor(const orch_tensor_info *ti) {
    return ti->ndim == 2 && strcmp(ti->name, "wpe.weight") != 0;
}

START_TEST(test_tensor_read_dequantized) {
    orch_model_desc m = test_model_desc(77, 32, 2, 2, 40); /* K = 40: 32 + 8 */
    orch_engine_ctx *q = make_ctx(&m, 2, "weights=int8");
    test_table t;
    test_read_table(A, q, ORCH_TENSOR_PARAM, &t);
    /* Random init is on the grid already. */
    float *init = test_read_kind(A, q, ORCH_TENSOR_PARAM, &t);
    float *all = random_params(&t, 5);
    test_write_kind(A, q, ORCH_TENSOR_PARAM, &t, all);
    float *got = test_read_kind(A, q, ORCH_TENSOR_PARAM, &t);
    int n_int8 = 0;
    for (uint32_t i = 0; i < t.n; i++) {
        const orch_tensor_info *ti = &t.info[i];
        const float *a = all + ti->offset, *b = got + ti->offset;
        if (!is_int8_tensor(ti)) {
            ck_assert_msg(memcmp(a, b, ti->numel * sizeof(float)) == 0,
                          "%s changed by weights=int8", ti->name);
            continue;
        }
        n_int8++;
        float *r = malloc(ti->numel * sizeof(float));
        memcpy(r, a, ti->numel * sizeof(float));
        cpu_q8_round_rows(r, ti->shape[0], ti->shape[1]);
        ck_assert_msg(memcmp(r, b, ti->numel * sizeof(float)) == 0,
                      "%s: tensor_read is not the dequantized tensor", ti->name);
        ck_assert_msg(memcmp(a, b, ti->numel * sizeof(float)) != 0,
                      "%s: not quantized at all", ti->name);
        memcpy(r, init + ti->offset, ti->numel * sizeof(float));
        cpu_q8_round_rows(r, ti->shape[0], ti->shape[1]);
        ck_assert(memcmp(r, init + ti->offset, ti->numel * sizeof(float)) == 0);
        free(r);
    }
    ck_assert_int_eq(n_int8, 1 + 4 * 2); /* wte, 4 matrices per layer */
    /* Writing the read-back values is a no-op (idempotent). */
    test_write_kind(A, q, ORCH_TENSOR_PARAM, &t, got);
    float *again = test_read_kind(A, q, ORCH_TENSOR_PARAM, &t);
    ck_assert(memcmp(again, got, t.total * sizeof(float)) == 0);
    /* weights=fp32 keeps the values exactly. */
    orch_engine_ctx *f = make_ctx(&m, 2, NULL);
    test_write_kind(A, f, ORCH_TENSOR_PARAM, &t, all);
    float *fp = test_read_kind(A, f, ORCH_TENSOR_PARAM, &t);
    ck_assert(memcmp(fp, all, t.total * sizeof(float)) == 0);
    /* Training refused; eval_loss runs, on the dequantized weights. */
    int32_t tokens[2 * 16], targets[2 * 16];
    for (int i = 0; i < 32; i++) {
        tokens[i] = (i * 37 + 11) % 77;
        targets[i] = (i * 53 + 7) % 77;
    }
    float loss = 0.0f, lf = 0.0f;
    ck_assert_int_eq(A->forward_backward(q, tokens, targets, 2, 16, 1.0f, &loss),
                     ORCH_ERR_UNSUPPORTED);
    ck_assert_str_eq(A->last_error(q),
                     "weights=int8 is an inference format; train with weights=fp32");
    orch_adamw_params p = test_adamw(1, 1e-3f, 0.0f, 1.0f);
    ck_assert_int_eq(A->optimizer_step(q, &p, NULL), ORCH_ERR_UNSUPPORTED);
    ck_assert_int_eq(A->eval_loss(q, tokens, targets, 2, 16, &loss), ORCH_OK);
    test_write_kind(A, f, ORCH_TENSOR_PARAM, &t, got);
    ck_assert_int_eq(A->eval_loss(f, tokens, targets, 2, 16, &lf), ORCH_OK);
    ck_assert_msg(loss == lf, "eval_loss int8 %.9g vs fp32 on dequantized %.9g", loss,
                  lf);
    A->context_destroy(q);
    A->context_destroy(f);
    free(init);
    free(all);
    free(got);
    free(again);
    free(fp);
}
END_TEST

START_TEST(test_bad_kernel_option) {
    orch_model_desc m = test_model_desc(50, 16, 1, 2, 16);
    orch_engine_ctx *ctx = NULL;
    char err[1024] = "";
    int rc = engine_create_context(&H, &m, 1, 1,
                                   "weights=int8,isa=avx2,int8_kernel=avx512vnni", &ctx,
                                   err, sizeof err);
    ck_assert_int_ne(rc, 0);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(err, "int8_kernel=avx512vnni") && strstr(err, "AVX512_VNNI") &&
                      !strchr(err, '\n'),
                  "%s", err);
    err[0] = 0;
    rc = engine_create_context(&H, &m, 1, 1, "int8_kernel=fast", &ctx, err, sizeof err);
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(
        strstr(err, "int8_kernel"), "%s",
        err); /* The kernel of a path the context does not take: refused, not ignored. */
    err[0] = 0;
    rc =
        engine_create_context(&H, &m, 1, 1, "int8_kernel=generic", &ctx, err, sizeof err);
    ck_assert_int_ne(rc, 0);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(err, "int8_kernel= applies to weights=int8"), "%s", err);
}
END_TEST

/* Incremental decoding (a 16-token prefill on the int8 kernel, then single
 * tokens) against one forward of the whole sequence (20 rows > skinny=16:
 * OpenBLAS on the dequantized weights): all logits of one sequence. */
#define DV 61u
#define DT 24u

static void decode_logits(orch_engine_ctx *ctx, const int32_t *tok, uint32_t len,
                          float *out) {
    int32_t table[6] = { 5, 2, 4, 0, 1, 3 };
    uint32_t pos = 0;
    while (pos < len) {
        uint32_t c = pos == 0 ? 16 : 1; /* 16 rows: AMX where it runs */
        orch_seq_input in =
            test_seq_input(tok + pos, c, pos, table, (pos + c + 3) / 4, ORCH_LOGITS_ALL);
        int32_t st = test_infer(A, ctx, &in, 1, out + (size_t)pos * DV, (uint64_t)c * DV);
        ck_assert_msg(st == ORCH_OK, "%s", A->last_error(ctx));
        pos += c;
    }
}

START_TEST(test_decode_vs_full_forward) {
    orch_model_desc m = test_model_desc(DV, DT, 2, 2, 48);
    m.mlp_width = 80; /* c_proj K = 80: 2 blocks + 16 */
    test_table t;
    const uint32_t len = 20;
    int32_t tok[DT];
    uint64_t s = 9;
    for (uint32_t i = 0; i < len; i++) tok[i] = (int32_t)((test_lcg64(&s) >> 33) % DV);
    float *ref = malloc((size_t)len * DV * sizeof(float));
    float *inc = malloc((size_t)len * DV * sizeof(float));
    float *first = malloc((size_t)len * DV * sizeof(float));
    float *all = NULL;
    static const char *const opts[] = {
        "weights=int8,skinny=16,int8_kernel=generic",
        "weights=int8,skinny=16,int8_kernel=avx2",
        "weights=int8,skinny=16,int8_kernel=avxvnni",
        "weights=int8,skinny=16,int8_kernel=avx512vnni",
        "weights=int8,skinny=16,int8_kernel=amx",
        "weights=int8,skinny=16",
    };
    int have_first = 0;
    for (size_t v = 0; v < sizeof opts / sizeof *opts; v++) {
        for (uint32_t threads = 1; threads <= 3; threads += 2) {
            orch_engine_ctx *ctx = NULL;
            char err[1024];
            if (engine_create_context(&H, &m, threads, 1, opts[v], &ctx, err,
                                      sizeof err)) {
                if (threads == 1)
                    printf("test_cpu_int8: skipping %s: %s\n", opts[v], err);
                continue;
            }
            if (!all) {
                test_read_table(A, ctx, ORCH_TENSOR_PARAM, &t);
                all = random_params(&t, 21);
            }
            test_write_kind(A, ctx, ORCH_TENSOR_PARAM, &t, all);
            ck_assert_int_eq(A->kv_configure(ctx, 4, 6), ORCH_OK);
            int32_t table[6] = { 0, 1, 2, 3, 4, 5 };
            orch_seq_input one = test_seq_input(tok, len, 0, table, 5, ORCH_LOGITS_ALL);
            ck_assert_int_eq(test_infer(A, ctx, &one, 1, ref, (uint64_t)len * DV),
                             ORCH_OK);
            decode_logits(ctx, tok, len, inc);
            double worst = test_max_diff(ref, inc, (uint64_t)len * DV);
            double mag = test_max_abs(ref, (uint64_t)len * DV);
            ck_assert_msg(worst <= 0.05 * mag,
                          "[%s, %u threads] decode vs full forward: %g (logits up to %g)",
                          opts[v], threads, worst, mag);
            if (!have_first) {
                memcpy(first, inc, (size_t)len * DV * sizeof(float));
                have_first = 1;
                printf("test_cpu_int8: int8 decode vs full forward: max |diff| %.3g, "
                       "max |logit| %.3g\n",
                       worst, mag);
            } else {
                ck_assert_msg(memcmp(first, inc, (size_t)len * DV * sizeof(float)) == 0,
                              "[%s, %u threads] decode logits differ from %s, 1 thread",
                              opts[v], threads, opts[0]);
            }
            A->context_destroy(ctx);
        }
    }
    free(ref);
    free(inc);
    free(first);
    free(all);
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Quality gate on a trained model                                            */
/* ------------------------------------------------------------------------- */

#define QV 64u
#define QT 128u

/* A Markov chain: each token has 3 likely successors (a learnable corpus). */
static void markov(uint64_t *s, int32_t *out, size_t n) {
    int32_t cur = (int32_t)((test_lcg64(s) >> 33) % QV);
    for (size_t i = 0; i < n; i++) {
        out[i] = cur;
        uint64_t r = (test_lcg64(s) >> 33) % 100;
        int32_t next = r < 60   ? (cur * 7 + 3) % (int32_t)QV
                       : r < 85 ? (cur * 5 + 11) % (int32_t)QV
                       : r < 95 ? (cur + 1) % (int32_t)QV
                                : (int32_t)((test_lcg64(s) >> 33) % QV);
        cur = next;
    }
}

/* Perplexity of seqs [n][QT] through infer_forward in chunks of 16 tokens
 * (at most skinny rows: the packed / int8 decode path). */
static double decode_ppl(orch_engine_ctx *ctx, const int32_t *seqs, int n) {
    float *lg = malloc(16 * QV * sizeof(float));
    int32_t table[QT / 16];
    for (uint32_t b = 0; b < QT / 16; b++) table[b] = (int32_t)b;
    double nll = 0;
    size_t count = 0;
    for (int q = 0; q < n; q++) {
        const int32_t *tok = seqs + (size_t)q * QT;
        for (uint32_t pos = 0; pos < QT; pos += 16) {
            orch_seq_input in =
                test_seq_input(tok + pos, 16, pos, table, pos / 16 + 1, ORCH_LOGITS_ALL);
            ck_assert_int_eq(test_infer(A, ctx, &in, 1, lg, 16 * QV), ORCH_OK);
            for (uint32_t i = 0; i < 16 && pos + i + 1 < QT; i++) {
                const float *row = lg + (size_t)i * QV;
                double mx = row[0], sum = 0;
                for (uint32_t v = 1; v < QV; v++) mx = fmax(mx, row[v]);
                for (uint32_t v = 0; v < QV; v++) sum += exp(row[v] - mx);
                nll += log(sum) + mx - row[tok[pos + i + 1]];
                count++;
            }
        }
    }
    free(lg);
    return exp(nll / (double)count);
}

/* Greedy continuation of prompt[np] by n tokens into out. */
static void greedy(orch_engine_ctx *ctx, const int32_t *prompt, uint32_t np, uint32_t n,
                   int32_t *out) {
    int32_t seq[QT], table[QT / 16];
    for (uint32_t b = 0; b < QT / 16; b++) table[b] = (int32_t)b;
    memcpy(seq, prompt, np * sizeof(int32_t));
    float lg[QV];
    uint32_t pos = 0, len = np;
    while (len < np + n) {
        uint32_t c = len - pos;
        orch_seq_input in =
            test_seq_input(seq + pos, c, pos, table, (len + 15) / 16, ORCH_LOGITS_LAST);
        ck_assert_int_eq(test_infer(A, ctx, &in, 1, lg, QV), ORCH_OK);
        uint32_t best = 0;
        for (uint32_t v = 1; v < QV; v++)
            if (lg[v] > lg[best]) best = v;
        pos = len;
        seq[len++] = (int32_t)best;
    }
    memcpy(out, seq + np, n * sizeof(int32_t));
}

START_TEST(test_quality_gate) {
    orch_model_desc m = test_model_desc(QV, QT, 2, 2, 64);
    orch_engine_ctx *f = make_ctx(&m, 2, NULL);
    enum { B = 4, STEPS = 300 };
    int32_t *tok = malloc((size_t)B * (QT + 1) * sizeof(int32_t));
    int32_t *in = malloc((size_t)B * QT * sizeof(int32_t));
    int32_t *tg = malloc((size_t)B * QT * sizeof(int32_t));
    uint64_t s = 12345;
    float loss = 0;
    for (int step = 0; step < STEPS; step++) {
        markov(&s, tok, (size_t)B * (QT + 1));
        for (int b = 0; b < B; b++) {
            memcpy(in + b * QT, tok + b * (QT + 1), QT * sizeof(int32_t));
            memcpy(tg + b * QT, tok + b * (QT + 1) + 1, QT * sizeof(int32_t));
        }
        float lr = 3e-3f * (step < 20 ? (float)(step + 1) / 20.0f : 1.0f);
        orch_adamw_params p = test_adamw((uint64_t)step + 1, lr, 0.0f, 1.0f);
        ck_assert_int_eq(A->grads_zero(f), ORCH_OK);
        ck_assert_int_eq(A->forward_backward(f, in, tg, B, QT, 1.0f, &loss), ORCH_OK);
        ck_assert_int_eq(A->optimizer_step(f, &p, NULL), ORCH_OK);
    }
    /* Entropy of the chain is about 1.0 nat; an untrained model has ln 64. */
    ck_assert_msg(loss < 1.6f, "training did not learn the chain: loss %g", loss);
    test_table t;
    test_read_table(A, f, ORCH_TENSOR_PARAM, &t);
    float *w = test_read_kind(A, f, ORCH_TENSOR_PARAM, &t);
    orch_engine_ctx *q = make_ctx(&m, 2, "weights=int8");
    test_write_kind(A, q, ORCH_TENSOR_PARAM, &t, w);
    ck_assert_int_eq(A->kv_configure(f, 16, QT / 16), ORCH_OK);
    ck_assert_int_eq(A->kv_configure(q, 16, QT / 16), ORCH_OK);
    enum { NVAL = 8 };
    int32_t *val = malloc((size_t)NVAL * QT * sizeof(int32_t));
    uint64_t vs = 999;
    markov(&vs, val, (size_t)NVAL * QT);
    const double pf = decode_ppl(f, val, NVAL), pq = decode_ppl(q, val, NVAL);
    int32_t gf[64], gq[64];
    greedy(f, val, 8, 64, gf);
    greedy(q, val, 8, 64, gq);
    int diverge = 64;
    for (int i = 0; i < 64; i++)
        if (gf[i] != gq[i]) {
            diverge = i;
            break;
        }
    printf("test_cpu_int8: trained %d steps (loss %.4f); decode-path perplexity fp32 "
           "%.5f, int8 %.5f (%+.4f%%); greedy 64 tokens: %s%d\n",
           STEPS, loss, pf, pq, 100.0 * (pq / pf - 1.0),
           diverge == 64 ? "equal, " : "first difference at token ", diverge);
    ck_assert_msg(fabs(pq / pf - 1.0) < 0.01, "int8 perplexity %g vs fp32 %g", pq, pf);
    /* At least the start of the greedy output agrees. */
    ck_assert_msg(diverge >= 8, "greedy output diverges at token %d", diverge);
    A->context_destroy(f);
    A->context_destroy(q);
    free(tok);
    free(in);
    free(tg);
    free(w);
    free(val);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_int8");
    TCase *k = tcase_create("kernels");
    tcase_add_test(k, test_quantize_round_trip);
    tcase_add_loop_test(k, test_kernels_vs_reference, 0,
                        (int)(sizeof shapes / sizeof *shapes));
    suite_add_tcase(s, k);
    TCase *e = tcase_create("engine");
    tcase_add_checked_fixture(e, load_engine, unload_engine);
    tcase_set_timeout(e, 120);
    tcase_add_test(e, test_tensor_read_dequantized);
    tcase_add_test(e, test_bad_kernel_option);
    tcase_add_test(e, test_decode_vs_full_forward);
    tcase_add_test(e, test_quality_gate);
    suite_add_tcase(s, e);
    return s;
}

int main(void) { return test_run_suite(suite()); }
