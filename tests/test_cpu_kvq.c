/*
 * test_cpu_kvq.c - the CPU engine's KV-cache storage type (engine option
 * kv=auto|f32|bf16|int8, engines/cpu/cpu_kvq.c):
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
 *   - int8 (one fp32 scale per head vector): every version of put gives
 *     the portable bytes, scale = max|x|/127 and |x - q scale| <= scale/2
 *     (1 + 1e-5) per value, |q| <= 127 with 127 reached, a zero vector stays
 *     zero, a non-finite value reads back NaN; scores and mix as for bf16
 *     (against fp64 on the dequantized values; grouped heads equal per
 *     head); through the ABI under every ISA cap (generic, avx2, avx512)
 *     and thread count: kv_block_bytes is (head size + 4) bytes a head
 *     vector, incremental decoding equals the full forward within I8_EQUIV,
 *     copied blocks decode to the same bits, forks within I8_EQUIV, the
 *     fixtures decode within I8_TOL of kv=f32 and of torch;
 *   - quality: a model trained here on a Markov chain (as test_cpu_int8's
 *     gate), greedy 64 tokens of 8 prompts with weights=int8 and kv=int8
 *     against weights=int8, kv=f32 and against fp32 (matching tokens
 *     printed; the first 8 tokens of every prompt must agree), and the
 *     decode-path perplexity within 1% of kv=f32's;
 *   - auto: bf16 with weights=int8, f32 otherwise; a bad value is a one-line
 *     error naming kv, the value and the allowed values.
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
 *
 * int8: a value moves by <= scale/2 = max|head vector|/254 (0.4% of the
 * vector's largest value), twice bf16's worst case and ~16x its typical
 * error, so I8_TOL is 5e-2 of the largest logit (measured on the
 * fixtures: printed). The incremental-vs-full forwards store K/V that
 * differ by ~1e-7, so a value near a rounding boundary lands one step
 * (scale = max/127) apart in one of them: I8_EQUIV 1e-2 of the largest
 * logit (measured values printed).
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
#define I8_TOL    5e-2
#define I8_EQUIV  1e-2

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
        cpu_kv_put(isa, CPU_KV_BF16, got, src, 1, N);
        ck_assert_msg(memcmp(got, ref, sizeof ref) == 0, "put differs on isa %d", isa);
        cpu_kv_get(isa, CPU_KV_BF16, back, got, 1, N);
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

/* int8 head vectors: hs values then the fp32 scale. */
START_TEST(test_int8_round_trip) {
    static const size_t hss[] = { 64, 32, 96, 48, 8, 17, 1 };
    enum { NV = 7, MAXH = 96 };
    static float src[NV * MAXH], back[NV * MAXH];
    static int8_t ref[NV * (MAXH + 4)], got[NV * (MAXH + 4)];
    uint64_t s = 5;
    for (size_t hi = 0; hi < sizeof hss / sizeof *hss; hi++) {
        const size_t hs = hss[hi], vb = cpu_kv_vec_bytes(CPU_KV_INT8, hs);
        ck_assert_uint_eq(vb, hs + 4);
        for (int rep = 0; rep < 20; rep++) {
            /* Vectors of very different magnitudes; vector 3 all zero, vector
             * 4 has exact half-steps (ties go to even), vector 5 an infinity,
             * vector 6 a NaN (both read back as NaN). */
            for (size_t v = 0; v < NV; v++)
                for (size_t i = 0; i < hs; i++)
                    src[v * hs + i] =
                        unit(&s) * powf(10.0f, (float)((v + (size_t)rep) % 9) - 4.0f);
            for (size_t i = 0; i < hs; i++) src[3 * hs + i] = 0.0f;
            for (size_t i = 0; i < hs; i++)
                src[4 * hs + i] = i == 0 ? 127.0f : (float)((int)(i % 50) - 25) + 0.5f;
            src[5 * hs + hs / 2] = -INFINITY;
            src[6 * hs] = NAN;
            cpu_kv_put(CPU_ISA_GENERIC, CPU_KV_INT8, ref, src, NV, hs);
            for (int isa = CPU_ISA_GENERIC; isa <= cpu_kernels_isa(); isa++) {
                memset(got, 0x55, sizeof got);
                cpu_kv_put(isa, CPU_KV_INT8, got, src, NV, hs);
                ck_assert_msg(memcmp(got, ref, NV * vb) == 0,
                              "int8 put differs on isa %d", isa);
                cpu_kv_get(isa, CPU_KV_INT8, back, got, NV, hs);
                for (size_t v = 0; v < NV; v++) {
                    const int8_t *q = got + v * vb;
                    float d;
                    memcpy(&d, q + hs, sizeof d);
                    if (v >= 5) {
                        ck_assert_msg(isnan(d), "vector %zu: scale %g, want NaN", v, d);
                        for (size_t i = 0; i < hs; i++)
                            ck_assert_msg(isnan(back[v * hs + i]), "isa %d: %g", isa,
                                          back[v * hs + i]);
                        continue;
                    }
                    float amax = 0.0f;
                    int qmax = 0;
                    for (size_t i = 0; i < hs; i++)
                        amax = fmaxf(amax, fabsf(src[v * hs + i]));
                    ck_assert_msg(d == amax / 127.0f, "scale %g for max %g", d, amax);
                    for (size_t i = 0; i < hs; i++) {
                        const float x = src[v * hs + i], y = back[v * hs + i];
                        ck_assert_msg(q[i] >= -127 && q[i] <= 127, "q %d", q[i]);
                        if (abs(q[i]) > qmax) qmax = abs(q[i]);
                        ck_assert_msg(y == (float)q[i] * d, "isa %d: get %g != %d * %g",
                                      isa, y, q[i], d);
                        ck_assert_msg(
                            fabs((double)x - y) <= d / 2.0 * (1 + 1e-5),
                            "hs %zu vector %zu value %zu: |%g - %g| > scale/2 %g", hs, v,
                            i, x, y, d / 2.0);
                        if (v == 4 && i > 0) /* on the half-steps of 1.0: to even */
                            ck_assert_msg(q[i] % 2 == 0, "tie %g -> %d", x, q[i]);
                    }
                    ck_assert_int_eq(qmax, v == 3 ? 0 : 127);
                }
            }
        }
    }
}
END_TEST

/* The stored value i of a head vector of dtype, widened. */
static double stored(int dt, const void *vec, size_t i, size_t hs) {
    if (dt == CPU_KV_BF16) return bf16_to_f32(((const uint16_t *)vec)[i]);
    return (double)((const int8_t *)vec)[i] * i8_scale(vec, hs);
}

/* Scores and mix of bf16 and int8 head vectors on every ISA this CPU runs,
 * against fp64 on the widened values. */
START_TEST(test_scores_mix) {
    static const size_t hss[] = { 64, 32, 96, 48, 8 };
    static const size_t ns[] = { 1, 15, 16, 17, 70 };
    static const int dts[2] = { CPU_KV_BF16, CPU_KV_INT8 };
    enum { MAXP = 70, MAXH = 96, HEADS = 5 };
    static uint8_t kv[2][MAXP][HEADS * MAXH * 2];
    static float q[MAXH], w[MAXP], out[HEADS * MAXH], sc[MAXP];
    const int dt = dts[_i];
    uint64_t s = 11;
    for (size_t hi = 0; hi < sizeof hss / sizeof *hss; hi++) {
        const size_t hs = hss[hi], vb = cpu_kv_vec_bytes(dt, hs);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const size_t n = ns[ni];
            float row[HEADS * MAXH];
            for (size_t p = 0; p < n; p++)
                for (int which = 0; which < 2; which++) {
                    for (size_t i = 0; i < HEADS * hs; i++) row[i] = 3.0f * unit(&s);
                    cpu_kv_put(CPU_ISA_GENERIC, dt, kv[which][p], row, HEADS, hs);
                }
            for (size_t i = 0; i < hs; i++) q[i] = unit(&s);
            float wsum = 0.0f;
            for (size_t p = 0; p < n; p++) wsum += (w[p] = unit(&s) + 0.6f);
            for (size_t p = 0; p < n; p++) w[p] /= wsum;
            const void *kp[MAXP], *vp[MAXP], *rows[MAXP], *rows_k[MAXP], *tmp[MAXP];
            for (size_t p = 0; p < n; p++) {
                kp[p] = kv[0][p] + 2 * vb; /* head 2 */
                vp[p] = kv[1][p] + 2 * vb;
                rows[p] = kv[1][p];
                rows_k[p] = kv[0][p];
            }
            for (int isa = CPU_ISA_GENERIC; isa <= cpu_kernels_isa(); isa++) {
                cpu_kv_scores(isa, dt, q, kp, n, hs, 0.5f, sc);
                for (size_t p = 0; p < n; p++) {
                    double r = 0, mag = 0;
                    for (size_t i = 0; i < hs; i++) {
                        double t = (double)q[i] * stored(dt, kp[p], i, hs);
                        r += t;
                        mag += fabs(t);
                    }
                    ck_assert_msg(fabs(sc[p] - 0.5 * r) <= 1e-5 * mag + 1e-7,
                                  "%s isa %d hs %zu n %zu score %zu: %g vs %g",
                                  cpu_kv_dtype_name(dt), isa, hs, n, p, sc[p], 0.5 * r);
                }
                cpu_kv_mix(isa, dt, w, vp, n, hs, out);
                for (size_t i = 0; i < hs; i++) {
                    double r = 0, mag = 0;
                    for (size_t p = 0; p < n; p++) {
                        double t = (double)w[p] * stored(dt, vp[p], i, hs);
                        r += t;
                        mag += fabs(t);
                    }
                    ck_assert_msg(fabs(out[i] - r) <= 1e-5 * mag + 1e-7,
                                  "%s isa %d hs %zu n %zu mix %zu: %g vs %g",
                                  cpu_kv_dtype_name(dt), isa, hs, n, i, out[i], r);
                }
                /* Scores of heads 1..4 grouped (one query of all heads) against
                 * the per-head scores: the same products, summed in another
                 * order on AVX-512 (bf16). */
                static float qall[HEADS * MAXH], scg[HEADS][MAXP], sc1[MAXP];
                for (size_t i = 0; i < HEADS * hs; i++) qall[i] = unit(&s);
                cpu_kv_scores_heads(isa, dt, qall, rows_k, n, 1, HEADS - 1, hs, 0.25f,
                                    &scg[0][0], MAXP, tmp);
                for (size_t h = 1; h < HEADS; h++) {
                    for (size_t p = 0; p < n; p++) tmp[p] = kv[0][p] + h * vb;
                    cpu_kv_scores(isa, dt, qall + h * hs, tmp, n, hs, 0.25f, sc1);
                    for (size_t p = 0; p < n; p++) {
                        double mag = 0;
                        for (size_t i = 0; i < hs; i++)
                            mag += fabs((double)qall[h * hs + i] *
                                        stored(dt, kv[0][p] + h * vb, i, hs));
                        ck_assert_msg(
                            fabs(scg[h - 1][p] - sc1[p]) <= 0.25 * 1e-5 * mag + 1e-7,
                            "%s isa %d hs %zu n %zu: grouped score head %zu pos %zu: "
                            "%g vs %g",
                            cpu_kv_dtype_name(dt), isa, hs, n, h, p, scg[h - 1][p],
                            sc1[p]);
                    }
                }
                /* Heads 1..4 grouped, with their own weights (ldsc = MAXP). */
                static float scw[HEADS][MAXP], grouped[HEADS * MAXH], one[MAXH];
                for (int h = 0; h < HEADS; h++)
                    for (size_t p = 0; p < n; p++) scw[h][p] = w[(p + (size_t)h) % n];
                cpu_kv_mix_heads(isa, dt, &scw[0][0], MAXP, rows, n, 1, HEADS - 1, hs,
                                 tmp, grouped);
                for (size_t h = 1; h < HEADS; h++) {
                    for (size_t p = 0; p < n; p++) tmp[p] = kv[1][p] + h * vb;
                    cpu_kv_mix(isa, dt, scw[h - 1], tmp, n, hs, one);
                    ck_assert_msg(memcmp(one, grouped + h * hs, hs * sizeof(float)) == 0,
                                  "%s isa %d hs %zu n %zu: grouped head %zu differs",
                                  cpu_kv_dtype_name(dt), isa, hs, n, h);
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
    "kv=int8",           "kv=int8,isa=avx2", "kv=int8,isa=generic",
    "kv=int8,threads=1", "kv=int8,skinny=0", "kv=int8,threads=3,skinny=4",
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])
#define FIRST_I8   6
static int is_i8(const char *opt) { return strstr(opt, "int8") != NULL; }

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
    uint64_t f32 = 0, bf = 0, autoq = 0, autof = 0, i8 = 0;
    orch_engine_ctx *e = make_ctx(&m, 1, "kv=int8");
    ck_assert_int_eq(A->kv_block_bytes(e, 16, &i8), ORCH_OK);
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
    /* int8: a head vector of 32 values is 32 + 4 bytes (3 layers, K and V, 2
     * heads, 16 positions). */
    const uint64_t vecs = 3ull * 2 * 2 * 16;
    ck_assert_uint_eq(f32 - i8, values * 4 - vecs * (32 + 4));
    ck_assert_int_eq(A->kv_configure(e, 16, 4), ORCH_OK);
    A->context_destroy(e);
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
        ck_assert_msg(strstr(err, "auto, f32, bf16 or int8"), "%s: '%s'", bad[i], err);
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
    if (_i % N_VARIANTS == 0 || _i % N_VARIANTS == FIRST_I8)
        printf("test_cpu_kvq: [%s C=%u] incremental vs full %.3g, max |logit| %.3g\n",
               opt, C, worst, mag);
    ck_assert_msg(worst <= (is_i8(opt) ? I8_EQUIV : EQUIV_REL) * mag,
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
    /* int8: one value of the full forward's K/V may round one step apart. */
    const double fork_tol = is_i8(opt) ? I8_EQUIV * test_max_abs(ra, V) : 1e-5;
    const double fd = fmax(test_max_diff(both, ra, V), test_max_diff(both + V, rb, V));
    if (_i == FIRST_I8)
        printf("test_cpu_kvq: [%s] fork vs full forwards %.3g\n", opt, fd);
    ck_assert_msg(fd <= fork_tol,
                  "[%s] forked branches differ from their full forwards: %g", opt, fd);
    ck_assert_msg(memcmp(both, both + V, V * sizeof(float)) != 0,
                  "branches should differ");
    A->context_destroy(ctx);
}
END_TEST

/* The PyTorch fixtures decoded with opt (kv=bf16 or int8): prefill of 5
 * (vector path) or 9 (sgemm path), then one token at a time, every row
 * against torch (returned, relative to the largest logit) and against
 * kv=f32 (*diff_f32, absolute; *rel_f32 relative to the largest logit). */
static double decode_fixture(const char *path, int llama, const char *opt,
                             double *diff_f32, double *rel_f32) {
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
    *rel_f32 = *diff_f32 / test_max_abs(got[1], (uint64_t)2 * T * V);
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
    const int i8 = is_i8(opt);
    for (int k = 0; k < 4; k++) {
        double vs_f32 = 0.0, rel_f32 = 0.0;
        const double d = decode_fixture(fx[k], k > 0, opt, &vs_f32, &rel_f32);
        if (_i == 0 || _i == FIRST_I8)
            printf("test_cpu_kvq: %s %s decode vs torch %.3g, vs kv=f32 %.3g (%.3g of "
                   "the largest logit)\n",
                   fx[k] + 15, opt, d, vs_f32, rel_f32);
        ck_assert_msg(d <= (i8 ? I8_TOL : BF16_TOL), "[%s] %s: decode vs torch %g", opt,
                      fx[k], d);
        if (i8)
            ck_assert_msg(rel_f32 <= I8_TOL, "[%s] %s: int8 decode vs kv=f32 %g", opt,
                          fx[k], rel_f32);
        ck_assert_msg(vs_f32 > 0.0, "[%s] %s: %s gave the f32 logits bit for bit", opt,
                      fx[k], opt);
    }
}
END_TEST

/* ------------------------------------------------------------------------- */
/* Quality on a trained model (as test_cpu_int8's gate)                       */
/* ------------------------------------------------------------------------- */

#define QV 64u
#define QT 128u

/* A Markov chain: each token has 3 likely successors (test_cpu_int8's). */
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

/* Perplexity of seqs [n][QT] decoded in chunks of 4 tokens (the decode
 * attention reading the stored K/V). */
static double decode_ppl(orch_engine_ctx *ctx, const int32_t *seqs, int n) {
    float lg[4 * QV];
    int32_t table[QT / 16];
    for (uint32_t b = 0; b < QT / 16; b++) table[b] = (int32_t)b;
    double nll = 0;
    size_t count = 0;
    for (int q = 0; q < n; q++) {
        const int32_t *tok = seqs + (size_t)q * QT;
        for (uint32_t pos = 0; pos < QT; pos += 4) {
            orch_seq_input in =
                test_seq_input(tok + pos, 4, pos, table, pos / 16 + 1, ORCH_LOGITS_ALL);
            ck_assert_int_eq(test_infer(A, ctx, &in, 1, lg, 4 * QV), ORCH_OK);
            for (uint32_t i = 0; i < 4 && pos + i + 1 < QT; i++) {
                const float *row = lg + (size_t)i * QV;
                double mx = row[0], sum = 0;
                for (uint32_t v = 1; v < QV; v++) mx = fmax(mx, row[v]);
                for (uint32_t v = 0; v < QV; v++) sum += exp(row[v] - mx);
                nll += log(sum) + mx - row[tok[pos + i + 1]];
                count++;
            }
        }
    }
    return exp(nll / (double)count);
}

/* Greedy continuation of prompt[np] by n tokens into out (one token a
 * step after the prompt). */
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

START_TEST(test_quality) {
    orch_model_desc m = test_model_desc(QV, QT, 2, 2, 64);
    orch_engine_ctx *f = make_ctx(&m, 2, NULL);
    enum { B = 4, STEPS = 300, NP = 8, NG = 64 };
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
    ck_assert_msg(loss < 1.6f, "training did not learn the chain: loss %g", loss);
    test_table t;
    test_read_table(A, f, ORCH_TENSOR_PARAM, &t);
    float *w = test_read_kind(A, f, ORCH_TENSOR_PARAM, &t);
    /* 0: fp32 weights, kv f32 (the reference); then int8 weights with kv
     * f32, bf16, int8; and fp32 weights with kv int8. */
    static const char *const opts[5] = { "kv=f32", "weights=int8,kv=f32",
                                         "weights=int8,kv=bf16", "weights=int8,kv=int8",
                                         "kv=int8" };
    orch_engine_ctx *c[5];
    for (int k = 0; k < 5; k++) {
        c[k] = make_ctx(&m, 2, opts[k]);
        test_write_kind(A, c[k], ORCH_TENSOR_PARAM, &t, w);
        ck_assert_int_eq(A->kv_configure(c[k], 16, QT / 16), ORCH_OK);
    }
    enum { NVAL = 8 };
    int32_t *val = malloc((size_t)NVAL * QT * sizeof(int32_t));
    uint64_t vs = 999;
    markov(&vs, val, (size_t)NVAL * QT);
    double ppl[5];
    static int32_t g[5][NVAL][NG];
    for (int k = 0; k < 5; k++) {
        ppl[k] = decode_ppl(c[k], val, NVAL);
        for (int q = 0; q < NVAL; q++)
            greedy(c[k], val + (size_t)q * QT, NP, NG, g[k][q]);
    }
    /* Tokens equal to the reference (position by position) and the first
     * difference, over the NVAL prompts. */
    for (int k = 1; k < 5; k++) {
        /* int8 weights with bf16 / int8 KV also against their kv=f32 twin */
        const int ref = k == 2 || k == 3 ? 1 : 0;
        for (int r = 0; r < 2; r++) {
            const int against = r ? ref : 0;
            if (r && against == 0) continue;
            int same = 0, first = NG;
            for (int q = 0; q < NVAL; q++) {
                int fd = NG;
                for (int i = 0; i < NG; i++) {
                    if (g[k][q][i] == g[against][q][i]) same++;
                    if (fd == NG && g[k][q][i] != g[against][q][i]) fd = i;
                }
                if (fd < first) first = fd;
            }
            printf("test_cpu_kvq: trained model, %s vs %s: greedy %d of %d tokens equal "
                   "(%d prompts; earliest difference at token %d), decode perplexity "
                   "%.5f vs %.5f (%+.3f%%)\n",
                   opts[k], opts[against], same, NVAL * NG, NVAL, first, ppl[k],
                   ppl[against], 100.0 * (ppl[k] / ppl[against] - 1.0));
            if (k == 3 || k == 4) {
                ck_assert_msg(first >= 8, "%s vs %s: greedy output diverges at token %d",
                              opts[k], opts[against], first);
                ck_assert_msg(fabs(ppl[k] / ppl[against] - 1.0) < 0.01,
                              "%s vs %s: perplexity %g vs %g", opts[k], opts[against],
                              ppl[k], ppl[against]);
            }
        }
    }
    for (int k = 0; k < 5; k++) A->context_destroy(c[k]);
    A->context_destroy(f);
    free(tok);
    free(in);
    free(tg);
    free(w);
    free(val);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_kvq");
    TCase *tc = tcase_create("kernels");
    tcase_add_test(tc, test_round);
    tcase_add_test(tc, test_int8_round_trip);
    tcase_add_loop_test(tc, test_scores_mix, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_add_unchecked_fixture(tc, load_engine, unload_engine);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_block_bytes_and_options);
    tcase_add_loop_test(tc, test_equivalence, 0, 3 * N_VARIANTS);
    tcase_add_loop_test(tc, test_copy_and_fork, 0, N_VARIANTS);
    tcase_add_loop_test(tc, test_torch_fixtures, 0, N_VARIANTS);
    tcase_add_test(tc, test_quality);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
