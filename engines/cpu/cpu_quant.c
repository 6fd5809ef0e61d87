/*
 * cpu_quant.c - weight-only int8 (Q8_0-like blocks of 32 along K) for the
 * CPU engine's inference: quantization, the packed int8 layout, the few-row
 * product in AMX-INT8 / AVX512-VNNI / AVX-VNNI / AVX2 / portable versions,
 * and the engine glue (see cpu_quant.h).
 *
 * Why quantized activations: the product of a few rows is bound by reading
 * the weights for one row and by arithmetic for 16. vpdpbusd does 64 int8
 * multiply-adds per instruction against 16 fp32 FMAs, so quantizing the
 * activation rows per 32-block (as llama.cpp's Q8_0 x Q8_0 dot does) keeps
 * 16 rows far from the FMA bound, while one row stays on the read
 * bandwidth either way. Measured on one thread of this machine (2-core
 * Xeon with AMX, shared and loaded), [50304 x 768] weights: Q8 x Q8 on
 * AVX512-VNNI 1.5 ms for 1 row, 14 ms for 16 rows; fp32 activations with
 * the weights widened to fp32 in registers (vpmovsxbd + vcvtdq2ps + FMA,
 * same bytes) 1.9 ms and 62-66 ms in the same runs. AMX (tdpbssd on the
 * signed activations) costs the fp32 scaling of every 32-deep int32 tile,
 * which the per-block scales require; with four tiles in flight, the
 * scaling of one group overlapping the next group's tile products, the
 * scales of the activation rows transposed once per call and the weights
 * prefetched in software (tile loads do not start the hardware
 * prefetchers), one thread on [3072 x 768] (L3-resident) takes 0.11 ms for
 * 16 rows against 0.24 ms on AVX512-VNNI and 0.175 ms for the first AMX
 * version, 0.073 vs 0.090 ms for 4 rows, equal at 2, so AMX runs from
 * CPU_Q8_AMX_MIN_ROWS (4) rows. On [50257 x 768] (43 MB) 16 rows take
 * 2.6-2.7 ms, as long as 1 row: the read bound.
 *
 * vpdpbusd multiplies unsigned by signed bytes: activations go in as
 * u = q + 128 and the kernel subtracts 128 * sum(w) of each (row, block),
 * computed once per panel with one more vpdpbusd per group and shared by
 * all activation rows. AVX2 has no such instruction: vpmaddubsw takes |q|
 * and the weights with q's sign (vpsignb), which cannot saturate since
 * |q|, |w| <= 127.
 */
#include "engines/cpu/cpu_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engines/cpu/cpu_features.h"
#include "engines/cpu/cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define Q8_X86 1
#else
#define Q8_X86 0
#endif

#define GROUPS (CPU_Q8_BLOCK / 4) /* groups of 4 k per block */

const char *cpu_q8_kernel_name(int kernel) {
    switch (kernel) {
    case CPU_Q8_AMX: return "amx";
    case CPU_Q8_AVX512VNNI: return "avx512vnni";
    case CPU_Q8_AVXVNNI: return "avxvnni";
    case CPU_Q8_AVX2: return "avx2";
    default: return "generic";
    }
}

int cpu_q8_select(int isa, int want, char *why, size_t why_cap) {
    const cpu_features *f = cpu_features_get();
    int ok[CPU_Q8_KERNELS];
    ok[CPU_Q8_GENERIC] = 1;
    ok[CPU_Q8_AVX2] = isa >= CPU_ISA_AVX2 && f->avx2;
    ok[CPU_Q8_AVXVNNI] = isa >= CPU_ISA_AVX2 && f->avx2 && f->avx_vnni;
    ok[CPU_Q8_AVX512VNNI] =
        isa >= CPU_ISA_AVX512 && f->avx512f && f->avx512bw && f->avx512_vnni;
    ok[CPU_Q8_AMX] = ok[CPU_Q8_AVX512VNNI] && f->amx_int8;
    if (want < 0) {
        for (int k = CPU_Q8_KERNELS - 1; k > 0; k--)
            if (ok[k]) return k;
        return CPU_Q8_GENERIC;
    }
    if (want < CPU_Q8_KERNELS && ok[want]) return want;
    static const char *const need[CPU_Q8_KERNELS] = {
        "", "AVX2", "AVX-VNNI", "AVX512_VNNI",
        "AMX-INT8 (with tile data permission) and AVX512_VNNI"
    };
    const int capped =
        want >= CPU_Q8_AVX512VNNI ? isa < CPU_ISA_AVX512 : isa < CPU_ISA_AVX2;
    if (want >= CPU_Q8_KERNELS)
        snprintf(why, why_cap, "int8_kernel: unknown kernel %d", want);
    else if (capped)
        snprintf(why, why_cap, "int8_kernel=%s: isa=%s excludes %s",
                 cpu_q8_kernel_name(want), cpu_kernels_isa_name(isa), need[want]);
    else
        snprintf(why, why_cap, "int8_kernel=%s: this CPU (%s) lacks %s",
                 cpu_q8_kernel_name(want), f->brand, need[want]);
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Quantization                                                               */
/* ------------------------------------------------------------------------- */

/* Round to nearest (ties to even) for |v| < 2^22, without a libm call. */
static inline float round_near(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (v + magic) - magic;
}

static inline int clamp127(float r) {
    if (!(r >= -127.0f)) return -127; /* NaN too */
    if (r > 127.0f) return 127;
    return (int)r;
}

#if Q8_X86
/* A full block with AVX-512: the same IEEE operations as the scalar code
 * (division, the magic-number rounding, a clamp that maps NaN to -127, a
 * maximum that skips NaN), so the same bits; loading and saving a model
 * quantizes every weight up to three times. */
__attribute__((target("avx512f"))) static float quantize32_avx512(const float *w,
                                                                  int8_t *q) {
    __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
    /* max(a, m) returns m when a is NaN. */
    __m512 m = _mm512_max_ps(_mm512_abs_ps(w0), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_abs_ps(w1), m);
    const float amax = _mm512_reduce_max_ps(m);
    const float s = amax / 127.0f;
    if (!(s > 0.0f)) {
        memset(q, 0, CPU_Q8_BLOCK);
        return s;
    }
    const __m512 vs = _mm512_set1_ps(s), magic = _mm512_set1_ps(12582912.0f);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512 r0 = _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(w0, vs), magic), magic);
    __m512 r1 = _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(w1, vs), magic), magic);
    r0 = _mm512_min_ps(_mm512_max_ps(r0, lo), hi); /* NaN -> -127 */
    r1 = _mm512_min_ps(_mm512_max_ps(r1, lo), hi);
    _mm_storeu_si128((__m128i *)(void *)q, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r0)));
    _mm_storeu_si128((__m128i *)(void *)(q + 16),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r1)));
    return s;
}
#endif

float cpu_q8_quantize_block(const float *w, size_t n, int8_t *q) {
#if Q8_X86
    if (n == CPU_Q8_BLOCK && cpu_features_avx512(cpu_features_get()))
        return quantize32_avx512(w, q);
#endif
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(w[i]);
        if (a > amax) amax = a;
    }
    /* s = amax / 127 is a fixed point of s -> (127 s) / 127 in fp32 (checked
     * on 1e8 random values), so rounding grid values again returns them. */
    const float s = amax / 127.0f;
    for (size_t i = 0; i < n; i++)
        q[i] = (int8_t)(s > 0.0f ? clamp127(round_near(w[i] / s)) : 0);
    return s;
}

void cpu_q8_round_rows(float *w, size_t N, size_t K) {
    int8_t q[CPU_Q8_BLOCK];
    for (size_t r = 0; r < N; r++) {
        float *row = w + r * K;
        for (size_t k0 = 0; k0 < K; k0 += CPU_Q8_BLOCK) {
            size_t n = K - k0 < CPU_Q8_BLOCK ? K - k0 : CPU_Q8_BLOCK;
            float s = cpu_q8_quantize_block(row + k0, n, q);
            for (size_t i = 0; i < n; i++) /* a NaN stays NaN */
                row[k0 + i] = row[k0 + i] != row[k0 + i] ? row[k0 + i] : (float)q[i] * s;
        }
    }
}

size_t cpu_q8_blocks(size_t K) { return (K + CPU_Q8_BLOCK - 1) / CPU_Q8_BLOCK; }

size_t cpu_q8_packed_bytes(size_t N, size_t K) {
    return cpu_panel_count(N) * cpu_q8_blocks(K) * CPU_Q8_PANEL_BLOCK_BYTES;
}

void cpu_q8_pack_panels(size_t N, size_t K, const float *w, uint8_t *wp, size_t p0,
                        size_t p1) {
    const size_t nb = cpu_q8_blocks(K);
    int8_t q[CPU_Q8_BLOCK];
    for (size_t p = p0; p < p1; p++) {
        uint8_t *panel = wp + p * nb * CPU_Q8_PANEL_BLOCK_BYTES;
        memset(panel, 0, nb * CPU_Q8_PANEL_BLOCK_BYTES);
        const size_t n0 = p * CPU_PANEL;
        const size_t rows = N - n0 < CPU_PANEL ? N - n0 : CPU_PANEL;
        for (size_t j = 0; j < rows; j++) {
            const float *src = w + (n0 + j) * K;
            for (size_t b = 0; b < nb; b++) {
                uint8_t *blk = panel + b * CPU_Q8_PANEL_BLOCK_BYTES;
                size_t k0 = b * CPU_Q8_BLOCK;
                size_t n = K - k0 < CPU_Q8_BLOCK ? K - k0 : CPU_Q8_BLOCK;
                float s = cpu_q8_quantize_block(src + k0, n, q);
                memcpy(blk + j * sizeof(float), &s, sizeof s);
                int8_t *wq = (int8_t *)(blk + 16 * sizeof(float));
                for (size_t i = 0; i < n; i++) wq[(i / 4) * 64 + j * 4 + (i % 4)] = q[i];
            }
        }
    }
}

/* Activation row: fp32 scales [nb], int8 q [nb*32], kernel bytes u [nb*32]
 * (VNNI: q + 128; AVX2: |q|; generic: unused copy of q). */
static size_t act_row_bytes(size_t K) {
    return cpu_q8_blocks(K) * (4 + 2 * CPU_Q8_BLOCK);
}

size_t cpu_q8_act_bytes(size_t M, size_t K) { return M * act_row_bytes(K); }

#if Q8_X86
/* One full block of activations with AVX-512: the scalar operations below,
 * vectorised (same bits). */
__attribute__((target("avx512f"))) static void
act32_avx512(const float *x, float *sx, int8_t *q, uint8_t *u, int vnni) {
    __m512 w0 = _mm512_loadu_ps(x), w1 = _mm512_loadu_ps(x + 16);
    __m512 m = _mm512_max_ps(_mm512_abs_ps(w0), _mm512_setzero_ps()); /* skips NaN */
    m = _mm512_max_ps(_mm512_abs_ps(w1), m);
    const float amax = _mm512_reduce_max_ps(m);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    *sx = amax / 127.0f;
    const __m512 vid = _mm512_set1_ps(id), magic = _mm512_set1_ps(12582912.0f);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int h = 0; h < 2; h++) {
        __m512 r =
            _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(h ? w1 : w0, vid), magic), magic);
        __m512i v = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
        __m512i w =
            vnni ? _mm512_add_epi32(v, _mm512_set1_epi32(128)) : _mm512_abs_epi32(v);
        _mm_storeu_si128((__m128i *)(void *)(q + 16 * h), _mm512_cvtepi32_epi8(v));
        _mm_storeu_si128((__m128i *)(void *)(u + 16 * h), _mm512_cvtepi32_epi8(w));
    }
}
#endif

void cpu_q8_quantize_act(int kernel, size_t M, size_t K, const float *x, size_t ldx,
                         uint8_t *xq) {
    const size_t nb = cpu_q8_blocks(K), rowb = act_row_bytes(K);
    const int vnni = kernel >= CPU_Q8_AVXVNNI;
#if Q8_X86
    const int v512 = cpu_features_avx512(cpu_features_get());
#endif
    for (size_t m = 0; m < M; m++) {
        const float *xr = x + m * ldx;
        uint8_t *row = xq + m * rowb;
        float *sx = (float *)(void *)row;
        int8_t *q = (int8_t *)(row + nb * 4);
        uint8_t *u = row + nb * 4 + nb * CPU_Q8_BLOCK;
        for (size_t b = 0; b < nb; b++) {
            const size_t k0 = b * CPU_Q8_BLOCK;
            const size_t n = K - k0 < CPU_Q8_BLOCK ? K - k0 : CPU_Q8_BLOCK;
#if Q8_X86
            if (v512 && n == CPU_Q8_BLOCK) {
                act32_avx512(xr + k0, sx + b, q + k0, u + k0, vnni);
                continue;
            }
#endif
            float amax = 0.0f;
            for (size_t i = 0; i < n; i++) {
                float a = fabsf(xr[k0 + i]);
                amax = a > amax ? a : amax;
            }
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            sx[b] = amax / 127.0f;
            for (size_t i = 0; i < CPU_Q8_BLOCK; i++) {
                int v = i < n ? clamp127(round_near(xr[k0 + i] * id)) : 0;
                q[k0 + i] = (int8_t)v;
                u[k0 + i] = (uint8_t)(vnni ? v + 128 : v < 0 ? -v : v);
            }
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Products                                                                   */
/* ------------------------------------------------------------------------- */

/* y[j] for j < nv from the 16 block sums f (same order in every kernel). */
static inline void store_row(const float *f, const float *bias, float *y, size_t nv,
                             int accumulate) {
    for (size_t j = 0; j < nv; j++) {
        float r = f[j] + (bias ? bias[j] : 0.0f);
        y[j] = accumulate ? y[j] + r : r;
    }
}

static void q8_generic(int M, size_t N, size_t K, const uint8_t *xq, const uint8_t *wp,
                       const float *bias, float *y, size_t ldy, int accumulate, size_t p0,
                       size_t p1) {
    const size_t nb = cpu_q8_blocks(K), rowb = act_row_bytes(K);
    for (size_t p = p0; p < p1; p++) {
        const uint8_t *panel = wp + p * nb * CPU_Q8_PANEL_BLOCK_BYTES;
        const size_t n0 = p * CPU_PANEL;
        const size_t nv = N - n0 < CPU_PANEL ? N - n0 : CPU_PANEL;
        for (int m = 0; m < M; m++) {
            const uint8_t *row = xq + (size_t)m * rowb;
            const float *sx = (const float *)(const void *)row;
            const int8_t *qx = (const int8_t *)(row + nb * 4);
            float f[CPU_PANEL] = { 0 };
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = panel + b * CPU_Q8_PANEL_BLOCK_BYTES;
                const float *sw = (const float *)(const void *)blk;
                const int8_t *wq = (const int8_t *)(blk + 64);
                const int8_t *xb = qx + b * CPU_Q8_BLOCK;
                for (int j = 0; j < CPU_PANEL; j++) {
                    int32_t s = 0;
                    for (int g = 0; g < GROUPS; g++)
                        for (int t = 0; t < 4; t++)
                            s += (int32_t)xb[g * 4 + t] * wq[g * 64 + j * 4 + t];
                    f[j] = fmaf((float)s, sx[b] * sw[j], f[j]);
                }
            }
            store_row(f, bias ? bias + n0 : NULL, y + (size_t)m * ldy + n0, nv,
                      accumulate);
        }
    }
}

#if Q8_X86

#define T_V512    __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define T_AVXVNNI __attribute__((target("avx2,fma,avxvnni")))
#define T_AVX2    __attribute__((target("avx2,fma")))

static inline int32_t load32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* AVX512-VNNI: MR activation rows x one panel (16 outputs, one zmm). */
#define DEF_V512(MR)                                                                     \
    T_V512 static void v512_##MR(const uint8_t *xq, size_t rowb, size_t nb,              \
                                 const uint8_t *panel, const float *bias, float *y,      \
                                 size_t ldy, size_t nv, int accumulate) {                \
        __m512 f[MR];                                                                    \
        const uint8_t *xu[MR];                                                           \
        const float *sx[MR];                                                             \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                           \
            f[i] = _mm512_setzero_ps();                                                  \
            sx[i] = (const float *)(const void *)(xq + (size_t)i * rowb);                \
            xu[i] = xq + (size_t)i * rowb + nb * (4 + CPU_Q8_BLOCK);                     \
        }                                                                                \
        const __m512i c80 = _mm512_set1_epi8((char)0x80);                                \
        for (size_t b = 0; b < nb; b++) {                                                \
            const uint8_t *blk = panel + b * CPU_Q8_PANEL_BLOCK_BYTES;                   \
            __m512i corr = _mm512_setzero_si512(), a[MR];                                \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) a[i] =                  \
                _mm512_setzero_si512();                                                  \
            _Pragma("GCC unroll 8") for (int g = 0; g < GROUPS; g++) {                   \
                __m512i w = _mm512_load_si512((const void *)(blk + 64 + g * 64));        \
                corr = _mm512_dpbusd_epi32(corr, c80, w);                                \
                _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) a[i] =              \
                    _mm512_dpbusd_epi32(                                                 \
                        a[i], _mm512_set1_epi32(load32(xu[i] + b * 32 + g * 4)), w);     \
            }                                                                            \
            const __m512 sw = _mm512_load_ps((const void *)blk);                         \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                       \
                __m512 s = _mm512_mul_ps(_mm512_set1_ps(sx[i][b]), sw);                  \
                f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a[i], corr)), \
                                       s, f[i]);                                         \
            }                                                                            \
        }                                                                                \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                           \
            float r[CPU_PANEL];                                                          \
            _mm512_storeu_ps(r, f[i]);                                                   \
            store_row(r, bias, y + (size_t)i * ldy, nv, accumulate);                     \
        }                                                                                \
    }

DEF_V512(1)
DEF_V512(2)
DEF_V512(3)
DEF_V512(4)
DEF_V512(5)
DEF_V512(6)
DEF_V512(7)
DEF_V512(8)

typedef void (*q8_tile_fn)(const uint8_t *, size_t, size_t, const uint8_t *,
                           const float *, float *, size_t, size_t, int);
static const q8_tile_fn v512_tiles[8] = { v512_1, v512_2, v512_3, v512_4,
                                          v512_5, v512_6, v512_7, v512_8 };

/* 256-bit kernels work on half a panel (8 outputs): `half` 0 or 1 selects
 * bytes 0-31 or 32-63 of each 64-byte group and scales 0-7 or 8-15. */
#define DEF_VNNI256(MR)                                                                  \
    T_AVXVNNI static void avnni_##MR(const uint8_t *xq, size_t rowb, size_t nb,          \
                                     const uint8_t *panel, int half, float *f_out) {     \
        __m256 f[MR];                                                                    \
        const uint8_t *xu[MR];                                                           \
        const float *sx[MR];                                                             \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                           \
            f[i] = _mm256_setzero_ps();                                                  \
            sx[i] = (const float *)(const void *)(xq + (size_t)i * rowb);                \
            xu[i] = xq + (size_t)i * rowb + nb * (4 + CPU_Q8_BLOCK);                     \
        }                                                                                \
        const __m256i c80 = _mm256_set1_epi8((char)0x80);                                \
        for (size_t b = 0; b < nb; b++) {                                                \
            const uint8_t *blk = panel + b * CPU_Q8_PANEL_BLOCK_BYTES;                   \
            __m256i corr = _mm256_setzero_si256(), a[MR];                                \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) a[i] =                  \
                _mm256_setzero_si256();                                                  \
            _Pragma("GCC unroll 8") for (int g = 0; g < GROUPS; g++) {                   \
                __m256i w = _mm256_load_si256(                                           \
                    (const __m256i *)(const void *)(blk + 64 + g * 64 + half * 32));     \
                corr = _mm256_dpbusd_avx_epi32(corr, c80, w);                            \
                _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) a[i] =              \
                    _mm256_dpbusd_avx_epi32(                                             \
                        a[i], _mm256_set1_epi32(load32(xu[i] + b * 32 + g * 4)), w);     \
            }                                                                            \
            const __m256 sw =                                                            \
                _mm256_load_ps((const float *)(const void *)blk + half * 8);             \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                       \
                __m256 s = _mm256_mul_ps(_mm256_set1_ps(sx[i][b]), sw);                  \
                f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a[i], corr)), \
                                       s, f[i]);                                         \
            }                                                                            \
        }                                                                                \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)                             \
            _mm256_storeu_ps(f_out + i * CPU_PANEL + half * 8, f[i]);                    \
    }

DEF_VNNI256(1)
DEF_VNNI256(2)
DEF_VNNI256(3)
DEF_VNNI256(4)

/* AVX2: u holds |q|; the weights take q's sign (vpsignb), vpmaddubsw gives
 * pairs (|q| w <= 127*127, two fit in int16), vpmaddwd by 1 sums 4. */
#define DEF_AVX2(MR)                                                                 \
    T_AVX2 static void avx2_##MR(const uint8_t *xq, size_t rowb, size_t nb,          \
                                 const uint8_t *panel, int half, float *f_out) {     \
        __m256 f[MR];                                                                \
        const uint8_t *xu[MR];                                                       \
        const uint8_t *xs[MR];                                                       \
        const float *sx[MR];                                                         \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                       \
            f[i] = _mm256_setzero_ps();                                              \
            sx[i] = (const float *)(const void *)(xq + (size_t)i * rowb);            \
            xs[i] = xq + (size_t)i * rowb + nb * 4;                                  \
            xu[i] = xs[i] + nb * CPU_Q8_BLOCK;                                       \
        }                                                                            \
        const __m256i ones = _mm256_set1_epi16(1);                                   \
        for (size_t b = 0; b < nb; b++) {                                            \
            const uint8_t *blk = panel + b * CPU_Q8_PANEL_BLOCK_BYTES;               \
            __m256i a[MR];                                                           \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) a[i] =              \
                _mm256_setzero_si256();                                              \
            _Pragma("GCC unroll 8") for (int g = 0; g < GROUPS; g++) {               \
                __m256i w = _mm256_load_si256(                                       \
                    (const __m256i *)(const void *)(blk + 64 + g * 64 + half * 32)); \
                _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {               \
                    __m256i sg = _mm256_set1_epi32(load32(xs[i] + b * 32 + g * 4));  \
                    __m256i ab = _mm256_set1_epi32(load32(xu[i] + b * 32 + g * 4));  \
                    __m256i pr = _mm256_maddubs_epi16(ab, _mm256_sign_epi8(w, sg));  \
                    a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(pr, ones));      \
                }                                                                    \
            }                                                                        \
            const __m256 sw =                                                        \
                _mm256_load_ps((const float *)(const void *)blk + half * 8);         \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                   \
                __m256 s = _mm256_mul_ps(_mm256_set1_ps(sx[i][b]), sw);              \
                f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), s, f[i]);           \
            }                                                                        \
        }                                                                            \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)                         \
            _mm256_storeu_ps(f_out + i * CPU_PANEL + half * 8, f[i]);                \
    }

DEF_AVX2(1)
DEF_AVX2(2)
DEF_AVX2(3)
DEF_AVX2(4)

typedef void (*q8_half_fn)(const uint8_t *, size_t, size_t, const uint8_t *, int,
                           float *);
static const q8_half_fn avnni_tiles[4] = { avnni_1, avnni_2, avnni_3, avnni_4 };
static const q8_half_fn avx2_tiles[4] = { avx2_1, avx2_2, avx2_3, avx2_4 };

static void q8_v512(int M, size_t N, size_t K, const uint8_t *xq, const uint8_t *wp,
                    const float *bias, float *y, size_t ldy, int accumulate, size_t p0,
                    size_t p1) {
    const size_t nb = cpu_q8_blocks(K), rowb = act_row_bytes(K);
    for (size_t p = p0; p < p1; p++) {
        const size_t n0 = p * CPU_PANEL;
        const size_t nv = N - n0 < CPU_PANEL ? N - n0 : CPU_PANEL;
        for (int m = 0; m < M; m += 8) {
            int mr = M - m < 8 ? M - m : 8;
            v512_tiles[mr - 1](
                xq + (size_t)m * rowb, rowb, nb, wp + p * nb * CPU_Q8_PANEL_BLOCK_BYTES,
                bias ? bias + n0 : NULL, y + (size_t)m * ldy + n0, ldy, nv, accumulate);
        }
    }
}

static void q8_half(const q8_half_fn *tiles, int M, size_t N, size_t K, const uint8_t *xq,
                    const uint8_t *wp, const float *bias, float *y, size_t ldy,
                    int accumulate, size_t p0, size_t p1) {
    const size_t nb = cpu_q8_blocks(K), rowb = act_row_bytes(K);
    float f[4 * CPU_PANEL];
    for (size_t p = p0; p < p1; p++) {
        const size_t n0 = p * CPU_PANEL;
        const size_t nv = N - n0 < CPU_PANEL ? N - n0 : CPU_PANEL;
        const uint8_t *panel = wp + p * nb * CPU_Q8_PANEL_BLOCK_BYTES;
        for (int m = 0; m < M; m += 4) {
            int mr = M - m < 4 ? M - m : 4;
            const uint8_t *x = xq + (size_t)m * rowb;
            tiles[mr - 1](x, rowb, nb, panel, 0, f);
            if (nv > 8) tiles[mr - 1](x, rowb, nb, panel, 1, f);
            for (int i = 0; i < mr; i++)
                store_row(f + i * CPU_PANEL, bias ? bias + n0 : NULL,
                          y + (size_t)(m + i) * ldy + n0, nv, accumulate);
        }
    }
}

/* AMX-INT8: the int8 activation rows (signed q, so no 128 * sum(w)
 * correction) by one panel with tdpbssd, one 32-deep product per K block
 * into its own int32 tile. Groups of two blocks go through C tiles 0/1 and
 * 2/3 in turn (A in tiles 4/5, B in 6/7: the packed layout is the B tile),
 * are stored into one half of cbuf, and are scaled into fp32 while the next
 * group runs on the tile unit: the same operations in the same order as
 * v512_* (the integer sums are exact, so the same bits). Tiles are not
 * renamed, so alternating two sets of C tiles lets a group's products start
 * before the previous group's tile stores have read their tiles: 16 rows on
 * [256 x 768] (L1/L2-resident, one thread, CPU time) went from 93 to 82
 * cycles a block against four blocks through tiles 0-3 (2026-12-01, the
 * README's Xeon; 4 paired runs, every pair the same way). */
#define T_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni")))

typedef struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

#define AMX_GROUP 2
/* Weight blocks fetched ahead of the tile loads, into L2: 16 blocks (9 KiB)
 * ahead with PREFETCHT1 decoded 16 sequences 2-16% faster than 8 ahead into
 * L1 on the AMX Xeon of the README (6 paired rounds, 2026-12-01; median of
 * the quiet-machine rounds about 2%). */
#ifndef AMX_PREFETCH
#define AMX_PREFETCH 16
#endif
#ifndef AMX_PF_HINT
#define AMX_PF_HINT _MM_HINT_T1
#endif
/* K blocks whose transposed activation scales live on the stack (K 4096). */
#define AMX_SXT_STACK 128

/* Blocks [b, b + nj) (nj <= 2) of one panel into C tiles of set S (S 0:
 * tiles 0, 1; S 1: tiles 2, 3), stored at c: the two sets alternate, so a
 * group's products need not wait for the previous group's stores. */
#define AMX_ISSUE(S, TA, TB)                                                         \
    T_AMX static inline void amx_issue##S(const uint8_t *xs, size_t rowb,            \
                                          const uint8_t *panel, size_t b, size_t nj, \
                                          int32_t *c) {                              \
        const uint8_t *blk = panel + b * CPU_Q8_PANEL_BLOCK_BYTES + 64;              \
        _tile_zero(TA);                                                              \
        _tile_loadd(4, xs + b * CPU_Q8_BLOCK, rowb);                                 \
        _tile_loadd(6, blk, 64);                                                     \
        _tile_dpbssd(TA, 4, 6);                                                      \
        if (nj > 1) {                                                                \
            _tile_zero(TB);                                                          \
            _tile_loadd(5, xs + (b + 1) * CPU_Q8_BLOCK, rowb);                       \
            _tile_loadd(7, blk + CPU_Q8_PANEL_BLOCK_BYTES, 64);                      \
            _tile_dpbssd(TB, 5, 7);                                                  \
        }                                                                            \
        _tile_stored(TA, c, 64);                                                     \
        if (nj > 1) _tile_stored(TB, c + 256, 64);                                   \
    }
AMX_ISSUE(0, 0, 1)
AMX_ISSUE(1, 2, 3)

/* Panels [p0, p1) for mr <= R activation rows (R 4, 8 or 16: the scaling
 * loop unrolled over R rows; tiles configured for mr). */
T_AMX static inline __attribute__((always_inline)) void
amx_panels(const int R, int mr, int m0, size_t N, size_t nb, size_t rowb,
           const uint8_t *xs, const float *sxt, const uint8_t *wp, const float *bias,
           float *y, size_t ldy, int accumulate, size_t p0, size_t p1,
           int32_t (*cbuf)[AMX_GROUP * 256]) {
    const size_t ng = (nb + AMX_GROUP - 1) / AMX_GROUP;
    for (size_t p = p0; p < p1; p++) {
        const uint8_t *panel = wp + p * nb * CPU_Q8_PANEL_BLOCK_BYTES;
        const size_t n0 = p * CPU_PANEL;
        const size_t nv = N - n0 < CPU_PANEL ? N - n0 : CPU_PANEL;
        __m512 f[16];
        _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) f[i] = _mm512_setzero_ps();
        amx_issue0(xs, rowb, panel, 0, nb < AMX_GROUP ? nb : AMX_GROUP, cbuf[0]);
        for (size_t g = 0; g < ng; g++) {
            const size_t b0 = g * AMX_GROUP;
            const size_t nj = nb - b0 < AMX_GROUP ? nb - b0 : AMX_GROUP;
            if (g + 1 < ng) {
                const size_t b1 = b0 + AMX_GROUP;
                if ((g + 1) & 1)
                    amx_issue1(xs, rowb, panel, b1,
                               nb - b1 < AMX_GROUP ? nb - b1 : AMX_GROUP, cbuf[1]);
                else
                    amx_issue0(xs, rowb, panel, b1,
                               nb - b1 < AMX_GROUP ? nb - b1 : AMX_GROUP, cbuf[0]);
            }
            const int32_t *c = cbuf[g & 1];
            for (size_t j = 0; j < nj; j++) {
                const size_t b = b0 + j;
                /* Tile loads do not start the hardware prefetchers:
                 * fetch the weights AMX_PREFETCH blocks ahead (into the
                 * next panel, which follows in memory). */
                const char *pf =
                    (const char *)panel + (b + AMX_PREFETCH) * CPU_Q8_PANEL_BLOCK_BYTES;
                if (p + 1 < p1 || b + AMX_PREFETCH < nb)
                    for (int t = 0; t < CPU_Q8_PANEL_BLOCK_BYTES; t += 64)
                        _mm_prefetch(pf + t, AMX_PF_HINT);
                const __m512 sw =
                    _mm512_load_ps((const void *)(panel + b * CPU_Q8_PANEL_BLOCK_BYTES));
                _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {
                    __m512 s = _mm512_mul_ps(_mm512_set1_ps(sxt[b * 16 + i]), sw);
                    __m512i a = _mm512_load_si512((const void *)(c + j * 256 + i * 16));
                    f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), s, f[i]);
                }
            }
        }
        /* store_row's operations, 16 lanes at a time. */
        const __mmask16 km = (__mmask16)((1u << nv) - 1u);
        const __m512 bv =
            bias ? _mm512_maskz_loadu_ps(km, bias + n0) : _mm512_setzero_ps();
        for (int i = 0; i < mr; i++) {
            float *yr = y + (size_t)(m0 + i) * ldy + n0;
            __m512 r = _mm512_add_ps(f[i], bv);
            if (accumulate) r = _mm512_add_ps(_mm512_maskz_loadu_ps(km, yr), r);
            _mm512_mask_storeu_ps(yr, km, r);
        }
    }
}

T_AMX static void q8_amx(int M, size_t N, size_t K, const uint8_t *xq, const uint8_t *wp,
                         const float *bias, float *y, size_t ldy, int accumulate,
                         size_t p0, size_t p1) {
    const size_t nb = cpu_q8_blocks(K), rowb = act_row_bytes(K);
    int32_t cbuf[2][AMX_GROUP * 256] __attribute__((aligned(64)));
    memset(cbuf, 0, sizeof cbuf);
    float sxt_stack[AMX_SXT_STACK * 16] __attribute__((aligned(64)));
    float *sxt = nb <= AMX_SXT_STACK ? sxt_stack : malloc(nb * 16 * sizeof(float));
    if (!sxt) { /* no memory for the scales: the AVX512-VNNI kernel instead */
        q8_v512(M, N, K, xq, wp, bias, y, ldy, accumulate, p0, p1);
        return;
    }
    for (int m0 = 0; m0 < M; m0 += 16) {
        const int mr = M - m0 < 16 ? M - m0 : 16;
        amx_cfg cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 4; t++) { /* C: mr x 16 int32 */
            cfg.rows[t] = (uint8_t)mr;
            cfg.colsb[t] = 64;
        }
        for (int t = 4; t < 6; t++) { /* A: mr x 32 int8 */
            cfg.rows[t] = (uint8_t)mr;
            cfg.colsb[t] = CPU_Q8_BLOCK;
        }
        for (int t = 6; t < 8; t++) { /* B: 8 groups x 64 bytes */
            cfg.rows[t] = GROUPS;
            cfg.colsb[t] = 64;
        }
        _tile_loadconfig(&cfg);
        const uint8_t *x = xq + (size_t)m0 * rowb;
        const uint8_t *xs = x + nb * 4;
        /* The rows' block scales transposed: sxt[b * 16 + i]. */
        for (size_t b = 0; b < nb; b++)
            for (int i = 0; i < 16; i++)
                sxt[b * 16 + (size_t)i] = ((
                    const float *)(const void *)(x + (size_t)(i < mr ? i : 0) * rowb))[b];
        if (mr <= 4)
            amx_panels(4, mr, m0, N, nb, rowb, xs, sxt, wp, bias, y, ldy, accumulate, p0,
                       p1, cbuf);
        else if (mr <= 8)
            amx_panels(8, mr, m0, N, nb, rowb, xs, sxt, wp, bias, y, ldy, accumulate, p0,
                       p1, cbuf);
        else
            amx_panels(16, mr, m0, N, nb, rowb, xs, sxt, wp, bias, y, ldy, accumulate, p0,
                       p1, cbuf);
        _tile_release();
    }
    if (sxt != sxt_stack) free(sxt);
}
#endif /* Q8_X86 */

void cpu_q8_matmul(int kernel, int M, size_t N, size_t K, const uint8_t *xq,
                   const uint8_t *wp, const float *bias, float *y, size_t ldy,
                   int accumulate, size_t p0, size_t p1) {
    if (M <= 0 || p0 >= p1) return;
#if Q8_X86
    switch (kernel) {
    case CPU_Q8_AMX:
        if (M >= CPU_Q8_AMX_MIN_ROWS) {
            q8_amx(M, N, K, xq, wp, bias, y, ldy, accumulate, p0, p1);
            return;
        }
        q8_v512(M, N, K, xq, wp, bias, y, ldy, accumulate, p0, p1);
        return;
    case CPU_Q8_AVX512VNNI:
        q8_v512(M, N, K, xq, wp, bias, y, ldy, accumulate, p0, p1);
        return;
    case CPU_Q8_AVXVNNI:
        q8_half(avnni_tiles, M, N, K, xq, wp, bias, y, ldy, accumulate, p0, p1);
        return;
    case CPU_Q8_AVX2:
        q8_half(avx2_tiles, M, N, K, xq, wp, bias, y, ldy, accumulate, p0, p1);
        return;
    default: break;
    }
#else
    (void)kernel;
#endif
    q8_generic(M, N, K, xq, wp, bias, y, ldy, accumulate, p0, p1);
}

/* ------------------------------------------------------------------------- */
/* Engine glue                                                                */
/* ------------------------------------------------------------------------- */

/* tests/test_cpu_int8.c compiles the kernels above into itself, without the
 * engine around them. */
#ifndef CPU_QUANT_KERNELS_ONLY
#include "engines/cpu/cpu_internal.h"
#include "engines/cpu/cpu_llama.h"

int cpu_q8_is_quantized(const orch_engine_ctx *ctx, uint32_t index) {
    return index < ctx->n_tensors &&
           (ctx->arch != ORCH_ARCH_GPT2 || index != 1 /* gpt2 wpe */) &&
           ctx->tensors[index].ndim == 2;
}

typedef struct round_job {
    float *w;
    size_t N, K, chunks;
} round_job;

static void round_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const round_job *j = arg;
    size_t a, b;
    cpu_pool_range(j->N, (int)c, (int)j->chunks, 1, &a, &b);
    if (a < b) cpu_q8_round_rows(j->w + a * j->K, b - a, j->K);
}

static void round_index(orch_engine_ctx *ctx, uint32_t index) {
    const cpu_tensor *t = &ctx->tensors[index];
    round_job j = { ctx->params + t->offset, (size_t)t->shape[0], (size_t)t->shape[1],
                    0 };
    j.chunks = cpu_pool_chunks(ctx->pool, j.N, 64, 4);
    cpu_pool_for(ctx->pool, j.chunks, round_chunk, &j);
}

void cpu_q8_round_tensor(orch_engine_ctx *ctx, uint32_t index) {
    if (ctx->weights != CPU_WEIGHTS_INT8 || !cpu_q8_is_quantized(ctx, index)) return;
    round_index(ctx, index);
    cpu_pool_park(ctx->pool);
}

void cpu_q8_round_all(orch_engine_ctx *ctx) {
    if (ctx->weights != CPU_WEIGHTS_INT8) return;
    for (uint32_t i = 0; i < ctx->n_tensors; i++)
        if (cpu_q8_is_quantized(ctx, i)) round_index(ctx, i);
    cpu_pool_park(ctx->pool);
}

void cpu_q8_free(orch_engine_ctx *ctx) {
    free(ctx->q8_packed);
    free(ctx->q8_layer);
    free(ctx->q8_act);
    ctx->q8_packed = NULL;
    ctx->q8_layer = NULL;
    ctx->q8_wte = NULL;
    ctx->q8_act = NULL;
    ctx->q8_act_cap = 0;
    ctx->q8_valid = 0;
}

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

typedef struct q8_item {
    const float *w;
    uint8_t *wp;
    size_t N, K;
    size_t first_chunk;
} q8_item;

#define Q8_PACK_PANELS 16

typedef struct q8_pack_job {
    const q8_item *items;
    size_t n;
} q8_pack_job;

static void q8_pack_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const q8_pack_job *j = arg;
    size_t i = 0;
    while (i + 1 < j->n && j->items[i + 1].first_chunk <= c) i++;
    const q8_item *it = &j->items[i];
    size_t p0 = (c - it->first_chunk) * Q8_PACK_PANELS, np = cpu_panel_count(it->N);
    size_t p1 = p0 + Q8_PACK_PANELS < np ? p0 + Q8_PACK_PANELS : np;
    cpu_q8_pack_panels(it->N, it->K, it->w, it->wp, p0, p1);
}

int32_t cpu_q8_ensure(orch_engine_ctx *ctx, size_t rows) {
    const size_t C = ctx->C, M = ctx->M, L = ctx->L;
    const size_t act = cpu_q8_act_bytes(rows ? rows : 1, C > M ? C : M);
    if (act > ctx->q8_act_cap) {
        free(ctx->q8_act);
        ctx->q8_act_cap = 0;
        void *p = NULL;
        if (posix_memalign(&p, 64, act) != 0) {
            ctx->q8_act = NULL;
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "infer_forward: out of memory (int8 activations)");
        }
        ctx->q8_act = p;
        ctx->q8_act_cap = act;
    }
    if (ctx->q8_valid && ctx->q8_version == ctx->params_version) return ORCH_OK;
    /* Per layer: q|k|v (gpt2: c_attn; KVD = C), the attention projection,
     * the MLP input (llama: gate|up, 2M rows), the MLP projection. */
    const int llama = ctx->arch == ORCH_ARCH_LLAMA;
    const size_t QS = C + 2 * (size_t)ctx->KVD;
    const size_t sizes[4][2] = {
        { QS, C }, { C, C }, { llama ? 2 * M : M, C }, { C, M }
    };
    if (!ctx->q8_packed) {
        size_t total = al64(cpu_q8_packed_bytes(ctx->V, C));
        for (size_t k = 0; k < 4; k++)
            total += L * al64(cpu_q8_packed_bytes(sizes[k][0], sizes[k][1]));
        void *p = NULL;
        ctx->q8_layer = calloc(L * 4, sizeof *ctx->q8_layer);
        if (!ctx->q8_layer || posix_memalign(&p, 64, total) != 0) {
            free(ctx->q8_layer);
            ctx->q8_layer = NULL;
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "infer_forward: cannot allocate %zu MiB for the int8 "
                            "weights (engine option skinny=0 avoids them)",
                            total >> 20);
        }
        ctx->q8_packed = p;
        uint8_t *q = ctx->q8_packed;
        ctx->q8_wte = q;
        q += al64(cpu_q8_packed_bytes(ctx->V, C));
        for (size_t l = 0; l < L; l++)
            for (size_t k = 0; k < 4; k++) {
                ctx->q8_layer[l * 4 + k] = q;
                q += al64(cpu_q8_packed_bytes(sizes[k][0], sizes[k][1]));
            }
    }
    q8_item *items = malloc((L * 4 + 1) * sizeof *items);
    if (!items)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    size_t n = 0;
    items[n++] = (q8_item){ llama ? cpu_llama_head(ctx, ctx->params) : ctx->pv.wte,
                            ctx->q8_wte, ctx->V, C, 0 };
    for (size_t l = 0; l < L; l++) {
        const cpu_layer_view *w = &ctx->pv.layer[l];
        const float *src[4] = { w->qkv_w, w->ap_w, w->fc_w, w->mp_w };
        if (llama) {
            static const int first[4] = { LL_Q, LL_O, LL_GATE, LL_DOWN };
            for (int k = 0; k < 4; k++)
                src[k] = cpu_llama_tensor(ctx, ctx->params, (uint32_t)l, first[k]);
        }
        for (size_t k = 0; k < 4; k++)
            items[n++] = (q8_item){ src[k], ctx->q8_layer[l * 4 + k], sizes[k][0],
                                    sizes[k][1], 0 };
    }
    size_t chunks = 0;
    for (size_t i = 0; i < n; i++) {
        items[i].first_chunk = chunks;
        chunks += (cpu_panel_count(items[i].N) + Q8_PACK_PANELS - 1) / Q8_PACK_PANELS;
    }
    q8_pack_job j = { items, n };
    cpu_pool_for(ctx->pool, chunks, q8_pack_chunk, &j);
    free(items);
    ctx->q8_valid = 1;
    ctx->q8_version = ctx->params_version;
    return ORCH_OK;
}

/* Chunks of panels per thread: as the fp32 packed kernel (cpu_linear.c),
 * many short chunks for a few rows (a descheduled thread's share is taken
 * over), fewer long ones for wide products. Wide chunks of at least 8
 * panels, not 16: the [768 x K] products (48 panels) then get 4 chunks, not
 * 3, which left one of 2 threads idle a third of the time (16 sequences
 * +8% tokens/s on 2 threads). */
#define Q8_CHUNKS_PER_THREAD      8
#define Q8_MIN_PANELS             8
#define Q8_WIDE_CHUNKS_PER_THREAD 2
#define Q8_WIDE_MIN_PANELS        8

typedef struct q8_lin_job {
    orch_engine_ctx *ctx;
    const cpu_linear_fwd *op;
    const uint8_t *wq;
    size_t chunks;
} q8_lin_job;

static void q8_lin_chunk(void *arg, size_t chunk, int tid) {
    (void)tid;
    const q8_lin_job *j = arg;
    const cpu_linear_fwd *op = j->op;
    size_t p0, p1, np = cpu_panel_count((size_t)op->N);
    cpu_pool_range(np, (int)chunk, (int)j->chunks, 1, &p0, &p1);
    if (p0 >= p1) return;
    const size_t c0 = p0 * CPU_PANEL;
    const size_t c1 = p1 * CPU_PANEL < (size_t)op->N ? p1 * CPU_PANEL : (size_t)op->N;
    int acc = 0;
    if (op->resid) {
        if (op->resid != op->out)
            for (int r = 0; r < op->R; r++)
                memcpy(op->out + (size_t)r * op->ldout + c0,
                       op->resid + (size_t)r * op->ldresid + c0,
                       (c1 - c0) * sizeof(float));
        acc = 1;
    }
    cpu_q8_matmul(j->ctx->q8_kernel, op->R, (size_t)op->N, (size_t)op->K, j->ctx->q8_act,
                  j->wq, op->bias, op->out, (size_t)op->ldout, acc, p0, p1);
    if (op->gelu_inplace || op->gelu_out)
        for (int r = 0; r < op->R; r++) {
            float *o = op->out + (size_t)r * (size_t)op->ldout;
            if (op->gelu_inplace)
                cpu_gelu(j->ctx->isa, o + c0, NULL, o + c0, c1 - c0);
            else
                cpu_gelu(j->ctx->isa, o + c0, op->gelu_tanh + (size_t)r * op->N + c0,
                         op->gelu_out + (size_t)r * op->N + c0, c1 - c0);
        }
}

typedef struct q8_act_job {
    const orch_engine_ctx *ctx;
    const cpu_linear_fwd *op;
    size_t chunks;
} q8_act_job;

static void q8_act_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const q8_act_job *j = arg;
    const cpu_linear_fwd *op = j->op;
    size_t a, b;
    cpu_pool_range((size_t)op->R, (int)c, (int)j->chunks, 1, &a, &b);
    if (a < b)
        cpu_q8_quantize_act(j->ctx->q8_kernel, b - a, (size_t)op->K,
                            op->in + a * (size_t)op->ldin, (size_t)op->ldin,
                            j->ctx->q8_act + a * act_row_bytes((size_t)op->K));
}

void cpu_q8_linear(orch_engine_ctx *ctx, const cpu_linear_fwd *op, const uint8_t *wq) {
    /* The activation rows first (split across the pool from a few rows). */
    q8_act_job aj = { ctx, op, cpu_pool_chunks(ctx->pool, (size_t)op->R, 4, 1) };
    if (aj.chunks > 1)
        cpu_pool_for(ctx->pool, aj.chunks, q8_act_chunk, &aj);
    else
        q8_act_chunk(&aj, 0, 0);
    const size_t np = cpu_panel_count((size_t)op->N);
    q8_lin_job j = { ctx, op, wq, 1 };
    j.chunks = op->R > 4
                   ? cpu_pool_chunks(ctx->pool, np, Q8_WIDE_MIN_PANELS,
                                     Q8_WIDE_CHUNKS_PER_THREAD)
                   : cpu_pool_chunks(ctx->pool, np, Q8_MIN_PANELS, Q8_CHUNKS_PER_THREAD);
    cpu_pool_for(ctx->pool, j.chunks, q8_lin_chunk, &j);
}
#endif /* CPU_QUANT_KERNELS_ONLY */
