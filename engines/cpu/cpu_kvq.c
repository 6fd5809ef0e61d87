/*
 * cpu_kvq.c - KV cache storage types (f32, bf16, int8) and the attention
 * kernels that read them (see cpu_kvq.h for the contract).
 *
 * Why bf16 and how it is read: decoding 16 sequences of GPT-2 124M at ~64
 * positions reads ~77 MB of fp32 K/V per step against 139 MB of int8
 * weights (measured: attention took a third of the step). bf16 halves that.
 * The AVX-512 readers take 32 bf16 values in one 512-bit load; the even ones
 * become fp32 by a 32-bit left shift by 16, the odd ones by masking off the
 * low 16 bits, so the products run as fp32 FMAs on the exact stored values
 * with the fp32 query (scores) and fp32 probabilities (mix), in even/odd
 * order, which the query is permuted to (scores) and the output permuted
 * back from (mix). No AVX512_BF16 instruction is needed: vdpbf16ps would
 * also round the query and the probabilities to bf16.
 *
 * int8 (one fp32 scale per head vector) quarters the f32 bytes. Its
 * AVX-512 readers sign-extend 16 bytes to 16 int32 lanes straight from
 * memory (vpmovsxbd), convert them to fp32 (exact) and run the same fp32
 * FMAs as bf16 with the fp32 query, the head vector's scale applied once
 * per score (scores) or folded into the probability (mix). An int8 x int8
 * dot product (VNNI/AMX) would need the query quantized too; decoding is
 * bound by the bytes read, which widening in registers does not change
 * (measured, one thread, 12 heads of 64 over 544 positions, scores + mix:
 * in cache bf16 156 and int8 163 M head-positions/s, out of cache 37 and
 * 68 M/s, the byte ratio).
 */
#include "engines/cpu/cpu_kvq.h"

#include <math.h>
#include <string.h>

#include "engines/cpu/cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVQ_X86 1
#define AVX512  __attribute__((target("avx512f")))
/* CPU_ISA_AVX512 means F, BW, VL and DQ (cpu_features.c): byte masks. */
#define AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))
#else
#define KVQ_X86 0
#endif

/* Head vectors widened at a time by the portable readers. */
#define WIDE_CHUNK 256

size_t cpu_kv_vec_bytes(int dtype, size_t hs) {
    return dtype == CPU_KV_INT8   ? hs + sizeof(float)
           : dtype == CPU_KV_BF16 ? hs * 2
                                  : hs * sizeof(float);
}

const char *cpu_kv_dtype_name(int dtype) {
    return dtype == CPU_KV_INT8 ? "int8" : dtype == CPU_KV_BF16 ? "bf16" : "f32";
}

/* The scale of an int8 head vector of hs values (stored after them). */
static inline float i8_scale(const void *vec, size_t hs) {
    float d;
    memcpy(&d, (const int8_t *)vec + hs, sizeof d);
    return d;
}

/* Scale of a head vector from the largest |x| as bits (0x7fffffff & x,
 * ordered like the values; NaN above infinity): max|x| / 127, NaN when a
 * value is not finite. */
static inline float i8_scale_of(uint32_t amax_bits) {
    if (amax_bits >= 0x7f800000u) return NAN;
    float a;
    memcpy(&a, &amax_bits, sizeof a);
    return a / 127.0f;
}

/* q = rint(x / d) within [-127, 127] (round to nearest even); 0 for d 0 or
 * not finite. */
static inline int8_t i8_quant(float x, float d) {
    if (!(d > 0.0f) || isinf(d)) return 0;
    float r = rintf(x / d);
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    return (int8_t)r;
}

static void put_i8_one(int8_t *dst, const float *x, size_t hs) {
    uint32_t amax = 0;
    for (size_t i = 0; i < hs; i++) {
        uint32_t b;
        memcpy(&b, &x[i], sizeof b);
        b &= 0x7fffffffu;
        if (b > amax) amax = b;
    }
    const float d = i8_scale_of(amax);
    for (size_t i = 0; i < hs; i++) dst[i] = i8_quant(x[i], d);
    memcpy(dst + hs, &d, sizeof d);
}

uint16_t cpu_kv_bf16_round(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

#if KVQ_X86
/* cpu_kv_bf16_round on 16 lanes (the same integer operations). */
AVX512 static inline __m256i round16_avx512(__m512 x) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(b, 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                _mm512_set1_epi32(0x7f800000));
    __m512i r =
        _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                             _mm512_and_si512(hi, _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

AVX512 static void put_bf16_avx512(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                            round16_avx512(_mm512_loadu_ps(src + i)));
    for (; i < n; i++) dst[i] = cpu_kv_bf16_round(src[i]);
}

AVX512 static void get_bf16_avx512(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)(const void *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    for (; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

/* put_i8_one on 16 lanes (the same operations: integer max of the |x|
 * bits, IEEE division, round to nearest even, clamp). */
AVX512BW static void put_i8_avx512(int8_t *dst, const float *x, size_t hs) {
    __m512i amax = _mm512_setzero_si512();
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    for (size_t i = 0; i < hs; i += 16) {
        const __mmask16 m =
            hs - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hs - i)) - 1u);
        const __m512i b = _mm512_maskz_loadu_epi32(m, x + i);
        amax = _mm512_max_epu32(amax, _mm512_and_si512(b, abs));
    }
    const float d = i8_scale_of((uint32_t)_mm512_reduce_max_epu32(amax));
    if (!(d > 0.0f) || isinf(d)) {
        memset(dst, 0, hs);
    } else {
        const __m512 dv = _mm512_set1_ps(d), lo = _mm512_set1_ps(-127.0f),
                     hi = _mm512_set1_ps(127.0f);
        for (size_t i = 0; i < hs; i += 16) {
            const __mmask16 m =
                hs - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hs - i)) - 1u);
            __m512 r =
                _mm512_roundscale_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), dv),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
            _mm_mask_storeu_epi8(dst + i, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
        }
    }
    memcpy(dst + hs, &d, sizeof d);
}

AVX512BW static void get_i8_avx512(float *dst, const int8_t *src, size_t hs) {
    const __m512 dv = _mm512_set1_ps(i8_scale(src, hs));
    for (size_t i = 0; i < hs; i += 16) {
        const __mmask16 m =
            hs - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hs - i)) - 1u);
        const __m512 v =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, src + i)));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(v, dv));
    }
}
#endif

void cpu_kv_put(int isa, int dtype, void *dst, const float *src, size_t nvec, size_t hs) {
    (void)isa;
    if (dtype == CPU_KV_INT8) {
        const size_t vb = cpu_kv_vec_bytes(dtype, hs);
        for (size_t v = 0; v < nvec; v++) {
            int8_t *d = (int8_t *)dst + v * vb;
#if KVQ_X86
            if (isa >= CPU_ISA_AVX512) {
                put_i8_avx512(d, src + v * hs, hs);
                continue;
            }
#endif
            put_i8_one(d, src + v * hs, hs);
        }
        return;
    }
    const size_t n = nvec * hs;
    if (dtype != CPU_KV_BF16) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *d = dst;
#if KVQ_X86
    if (isa >= CPU_ISA_AVX512) {
        put_bf16_avx512(d, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) d[i] = cpu_kv_bf16_round(src[i]);
}

void cpu_kv_get(int isa, int dtype, float *dst, const void *src, size_t nvec, size_t hs) {
    (void)isa;
    if (dtype == CPU_KV_INT8) {
        const size_t vb = cpu_kv_vec_bytes(dtype, hs);
        for (size_t v = 0; v < nvec; v++) {
            const int8_t *q = (const int8_t *)src + v * vb;
            float *o = dst + v * hs;
#if KVQ_X86
            if (isa >= CPU_ISA_AVX512) {
                get_i8_avx512(o, q, hs);
                continue;
            }
#endif
            const float d = i8_scale(q, hs);
            for (size_t i = 0; i < hs; i++) o[i] = (float)q[i] * d;
        }
        return;
    }
    const size_t n = nvec * hs;
    if (dtype != CPU_KV_BF16) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *s = src;
#if KVQ_X86
    if (isa >= CPU_ISA_AVX512) {
        get_bf16_avx512(dst, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
}

/* ------------------------------------------------------------------------- */
/* Scores                                                                     */
/* ------------------------------------------------------------------------- */

#if KVQ_X86
/* Lane p of the result = the sum of the 16 lanes of a[p]. */
AVX512 static inline __m512 hsum16_avx512(const __m512 *a) {
    __m512 s1[8], s2[4];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) s1[i] =
        _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                      _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(s1[2 * i]),
                      y = _mm512_castps_pd(s1[2 * i + 1]);
        s2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], 0x88),
                                     _mm512_shuffle_f32x4(s2[0], s2[1], 0xDD));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], 0x88),
                                     _mm512_shuffle_f32x4(s2[2], s2[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88),
                         _mm512_shuffle_f32x4(u01, u23, 0xDD));
}

/* Largest head size the AVX-512 bf16 readers keep in registers/stack. */
#define V512_MAX_HS 512

/* bf16 keys, hs a multiple of 32 (<= V512_MAX_HS): qe/qo are the even and
 * odd elements of q; 16 positions at a time. */
AVX512 static void scores_bf16_avx512(const float *q, const void *const *k, size_t n,
                                      size_t hs, float scale, float *out) {
    float qe[V512_MAX_HS / 2] __attribute__((aligned(64)));
    float qo[V512_MAX_HS / 2] __attribute__((aligned(64)));
    for (size_t i = 0; i < hs / 2; i++) {
        qe[i] = q[2 * i];
        qo[i] = q[2 * i + 1];
    }
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512 sv = _mm512_set1_ps(scale);
    for (size_t p0 = 0; p0 < n; p0 += 16) {
        const size_t cnt = n - p0 < 16 ? n - p0 : 16;
        __m512 a[16];
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
            a[j] = _mm512_setzero_ps();
            if ((size_t)j >= cnt) continue;
            const uint16_t *kr = k[p0 + (size_t)j];
            for (size_t c = 0; c < hs; c += 32) {
                const __m512i x = _mm512_loadu_si512((const void *)(kr + c));
                const __m512 ke = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
                const __m512 ko = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
                a[j] = _mm512_fmadd_ps(_mm512_load_ps(qe + c / 2), ke, a[j]);
                a[j] = _mm512_fmadd_ps(_mm512_load_ps(qo + c / 2), ko, a[j]);
            }
        }
        const __m512 r = _mm512_mul_ps(hsum16_avx512(a), sv);
        _mm512_mask_storeu_ps(out + p0, (__mmask16)((1u << cnt) - 1u), r);
    }
}

/* Heads of 64 bf16 values, up to SC_HEADS per pass, 16 positions at a
 * time: each position's keys of those heads read once, contiguously (the
 * hardware prefetchers follow), one 16-lane partial sum per (head,
 * position) kept in buf, then the same reduction as scores_bf16_avx512. */
#define SC_HEADS 16
AVX512 static void scores64_bf16_avx512(const float *q, const void *const *row, size_t n,
                                        size_t h0, size_t nh, float scale, float *sc,
                                        size_t ldsc) {
    float qe[SC_HEADS][32] __attribute__((aligned(64)));
    float qo[SC_HEADS][32] __attribute__((aligned(64)));
    __m512 buf[SC_HEADS][16];
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512 sv = _mm512_set1_ps(scale);
    for (size_t a = 0; a < nh; a += SC_HEADS) {
        const size_t m = nh - a < SC_HEADS ? nh - a : SC_HEADS;
        for (size_t h = 0; h < m; h++)
            for (size_t i = 0; i < 32; i++) {
                qe[h][i] = q[(h0 + a + h) * 64 + 2 * i];
                qo[h][i] = q[(h0 + a + h) * 64 + 2 * i + 1];
            }
        const size_t off = (h0 + a) * 64;
        for (size_t p0 = 0; p0 < n; p0 += 16) {
            const size_t cnt = n - p0 < 16 ? n - p0 : 16;
            for (size_t j = 0; j < 16; j++) {
                if (j >= cnt) {
                    for (size_t h = 0; h < m; h++) buf[h][j] = _mm512_setzero_ps();
                    continue;
                }
                const uint16_t *kr = (const uint16_t *)row[p0 + j] + off;
                if (p0 + j + 8 < n)
                    for (size_t o = 0; o < m * 128; o += 64)
                        _mm_prefetch(
                            (const char *)((const uint16_t *)row[p0 + j + 8] + off) + o,
                            _MM_HINT_T0);
                for (size_t h = 0; h < m; h++) {
                    const __m512i x0 = _mm512_loadu_si512((const void *)(kr + h * 64));
                    const __m512i x1 =
                        _mm512_loadu_si512((const void *)(kr + h * 64 + 32));
                    __m512 acc =
                        _mm512_mul_ps(_mm512_load_ps(qe[h]),
                                      _mm512_castsi512_ps(_mm512_slli_epi32(x0, 16)));
                    acc = _mm512_fmadd_ps(_mm512_load_ps(qo[h]),
                                          _mm512_castsi512_ps(_mm512_and_si512(x0, hi)),
                                          acc);
                    acc = _mm512_fmadd_ps(_mm512_load_ps(qe[h] + 16),
                                          _mm512_castsi512_ps(_mm512_slli_epi32(x1, 16)),
                                          acc);
                    buf[h][j] = _mm512_fmadd_ps(
                        _mm512_load_ps(qo[h] + 16),
                        _mm512_castsi512_ps(_mm512_and_si512(x1, hi)), acc);
                }
            }
            const __mmask16 km = (__mmask16)((1u << cnt) - 1u);
            for (size_t h = 0; h < m; h++)
                _mm512_mask_storeu_ps(sc + (a + h) * ldsc + p0, km,
                                      _mm512_mul_ps(hsum16_avx512(buf[h]), sv));
        }
    }
}

/* int8 keys, hs a multiple of 16 (<= V512_MAX_HS), 16 positions at a time:
 * out[p] = (dot(q, k_p) * d_p) * scale, the dot in fp32 on the widened
 * bytes. */
AVX512 static void scores_i8_avx512(const float *q, const void *const *k, size_t n,
                                    size_t hs, float scale, float *out) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (size_t p0 = 0; p0 < n; p0 += 16) {
        const size_t cnt = n - p0 < 16 ? n - p0 : 16;
        __m512 a[16];
        float d[16] __attribute__((aligned(64)));
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
            a[j] = _mm512_setzero_ps();
            d[j] = 0.0f;
            if ((size_t)j >= cnt) continue;
            const int8_t *kr = k[p0 + (size_t)j];
            d[j] = i8_scale(kr, hs);
            for (size_t c = 0; c < hs; c += 16) {
                const __m512 kf = _mm512_cvtepi32_ps(
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(kr + c))));
                a[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), kf, a[j]);
            }
        }
        const __m512 r =
            _mm512_mul_ps(_mm512_mul_ps(hsum16_avx512(a), _mm512_load_ps(d)), sv);
        _mm512_mask_storeu_ps(out + p0, (__mmask16)((1u << cnt) - 1u), r);
    }
}

/* Heads of 64 int8 values, as scores64_bf16_avx512: each position's key
 * vectors of up to SC_HEADS heads read once (contiguous, 68 bytes each),
 * one 16-lane partial sum per (head, position), the scales kept beside. */
AVX512 static void scores64_i8_avx512(const float *q, const void *const *row, size_t n,
                                      size_t h0, size_t nh, float scale, float *sc,
                                      size_t ldsc) {
    enum { VB = 64 + 4 };
    __m512 buf[SC_HEADS][16];
    float d[SC_HEADS][16] __attribute__((aligned(64)));
    const __m512 sv = _mm512_set1_ps(scale);
    for (size_t a = 0; a < nh; a += SC_HEADS) {
        const size_t m = nh - a < SC_HEADS ? nh - a : SC_HEADS;
        const float *qa = q + (h0 + a) * 64;
        const size_t off = (h0 + a) * VB;
        for (size_t p0 = 0; p0 < n; p0 += 16) {
            const size_t cnt = n - p0 < 16 ? n - p0 : 16;
            for (size_t j = 0; j < 16; j++) {
                if (j >= cnt) {
                    for (size_t h = 0; h < m; h++) {
                        buf[h][j] = _mm512_setzero_ps();
                        d[h][j] = 0.0f;
                    }
                    continue;
                }
                const int8_t *kr = (const int8_t *)row[p0 + j] + off;
                if (p0 + j + 8 < n)
                    for (size_t o = 0; o < m * VB; o += 64)
                        _mm_prefetch((const char *)row[p0 + j + 8] + off + o,
                                     _MM_HINT_T0);
                for (size_t h = 0; h < m; h++) {
                    const int8_t *kh = kr + h * VB;
                    const float *qh = qa + h * 64;
                    __m512 acc = _mm512_mul_ps(
                        _mm512_loadu_ps(qh),
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                            _mm_loadu_si128((const __m128i *)(const void *)kh))));
                    _Pragma("GCC unroll 3") for (int c = 1; c < 4; c++) acc =
                        _mm512_fmadd_ps(
                            _mm512_loadu_ps(qh + c * 16),
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                (const __m128i *)(const void *)(kh + c * 16)))),
                            acc);
                    buf[h][j] = acc;
                    d[h][j] = i8_scale(kh, 64);
                }
            }
            const __mmask16 km = (__mmask16)((1u << cnt) - 1u);
            for (size_t h = 0; h < m; h++)
                _mm512_mask_storeu_ps(
                    sc + (a + h) * ldsc + p0, km,
                    _mm512_mul_ps(
                        _mm512_mul_ps(hsum16_avx512(buf[h]), _mm512_load_ps(d[h])), sv));
        }
    }
}
#endif

/* Portable int8 scores: each key's bytes widened, the isa's fp32 dot, then
 * (dot * d_p) * scale. */
static void scores_i8_wide(int isa, const float *q, const void *const *k, size_t n,
                           size_t hs, float scale, float *out) {
    float t[WIDE_CHUNK];
    for (size_t p = 0; p < n; p++) {
        const int8_t *kr = k[p];
        float s = 0.0f;
        for (size_t c = 0; c < hs; c += WIDE_CHUNK) {
            const size_t m = hs - c < WIDE_CHUNK ? hs - c : WIDE_CHUNK;
            for (size_t i = 0; i < m; i++) t[i] = (float)kr[c + i];
            s += cpu_dot(isa, q + c, t, m);
        }
        out[p] = s * i8_scale(kr, hs) * scale;
    }
}

/* Portable bf16 scores: each key widened, then the isa's fp32 dot. */
static void scores_bf16_wide(int isa, const float *q, const void *const *k, size_t n,
                             size_t hs, float scale, float *out) {
    float t[WIDE_CHUNK];
    for (size_t p = 0; p < n; p++) {
        const uint16_t *kr = k[p];
        float s = 0.0f;
        for (size_t c = 0; c < hs; c += WIDE_CHUNK) {
            const size_t m = hs - c < WIDE_CHUNK ? hs - c : WIDE_CHUNK;
            for (size_t i = 0; i < m; i++) t[i] = bf16_to_f32(kr[c + i]);
            s += cpu_dot(isa, q + c, t, m);
        }
        out[p] = s * scale;
    }
}

void cpu_kv_scores(int isa, int dtype, const float *q, const void *const *k, size_t n,
                   size_t hs, float scale, float *out) {
    if (dtype == CPU_KV_INT8) {
#if KVQ_X86
        if (isa >= CPU_ISA_AVX512 && hs % 16 == 0 && hs <= V512_MAX_HS) {
            scores_i8_avx512(q, k, n, hs, scale, out);
            return;
        }
#endif
        scores_i8_wide(isa, q, k, n, hs, scale, out);
        return;
    }
    if (dtype != CPU_KV_BF16) {
        cpu_attn_scores(isa, q, (const float *const *)k, n, hs, scale, out);
        return;
    }
#if KVQ_X86
    if (isa >= CPU_ISA_AVX512 && hs % 32 == 0 && hs <= V512_MAX_HS) {
        scores_bf16_avx512(q, k, n, hs, scale, out);
        return;
    }
#endif
    scores_bf16_wide(isa, q, k, n, hs, scale, out);
}

/* ------------------------------------------------------------------------- */
/* Mix                                                                        */
/* ------------------------------------------------------------------------- */

#if KVQ_X86
/* Even/odd accumulators of 32 outputs back into order, stored at out. */
AVX512 static inline void store_eo(__m512 e, __m512 o, float *out) {
    const __m512i i0 =
        _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i i1 =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    _mm512_storeu_ps(out, _mm512_permutex2var_ps(e, i0, o));
    _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(e, i1, o));
}

/* Heads of 64 bf16 values, up to MIX_HEADS of them per pass: each
 * position's values of those heads read once (contiguous). off: element
 * offset of the first head in every row. */
#define MIX_HEADS 6
#define MIX_AHEAD 8
AVX512 static void mix64_bf16_avx512(const float *sc, size_t ldsc, const void *const *row,
                                     size_t n, size_t h0, size_t nh, float *out) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (size_t a = 0; a < nh; a += MIX_HEADS) {
        const size_t m = nh - a < MIX_HEADS ? nh - a : MIX_HEADS;
        const size_t off = (h0 + a) * 64;
        __m512 e[MIX_HEADS * 2], o[MIX_HEADS * 2];
        _Pragma("GCC unroll 12") for (int i = 0; i < MIX_HEADS * 2; i++) {
            e[i] = _mm512_setzero_ps();
            o[i] = _mm512_setzero_ps();
        }
        for (size_t p = 0; p < n; p++) {
            const uint16_t *src = (const uint16_t *)row[p] + off;
            if (p + MIX_AHEAD < n)
                for (size_t o = 0; o < m * 128; o += 64)
                    _mm_prefetch(
                        (const char *)((const uint16_t *)row[p + MIX_AHEAD] + off) + o,
                        _MM_HINT_T0);
            _Pragma("GCC unroll 6") for (int h = 0; h < MIX_HEADS; h++) {
                if ((size_t)h >= m) break;
                const __m512 w = _mm512_set1_ps(sc[(a + (size_t)h) * ldsc + p]);
                _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
                    const __m512i x =
                        _mm512_loadu_si512((const void *)(src + h * 64 + c * 32));
                    e[h * 2 + c] = _mm512_fmadd_ps(
                        w, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), e[h * 2 + c]);
                    o[h * 2 + c] = _mm512_fmadd_ps(
                        w, _mm512_castsi512_ps(_mm512_and_si512(x, hi)), o[h * 2 + c]);
                }
            }
        }
        _Pragma("GCC unroll 6") for (int h = 0; h < MIX_HEADS; h++) {
            if ((size_t)h >= m) break;
            _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++)
                store_eo(e[h * 2 + c], o[h * 2 + c], out + off + h * 64 + c * 32);
        }
    }
}

/* One head of hs bf16 values (hs a multiple of 32, <= V512_MAX_HS), 128
 * outputs (8 accumulators) at a time. */
AVX512 static void mix_bf16_avx512(const float *w, const void *const *v, size_t n,
                                   size_t hs, float *out) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (size_t d0 = 0; d0 < hs; d0 += 128) {
        const int nc = (int)((hs - d0 < 128 ? hs - d0 : 128) / 32);
        __m512 e[4], o[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            e[i] = _mm512_setzero_ps();
            o[i] = _mm512_setzero_ps();
        }
        for (size_t p = 0; p < n; p++) {
            const __m512 wp = _mm512_set1_ps(w[p]);
            const uint16_t *src = (const uint16_t *)v[p] + d0;
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                if (c >= nc) break;
                const __m512i x = _mm512_loadu_si512((const void *)(src + c * 32));
                e[c] = _mm512_fmadd_ps(wp, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
                                       e[c]);
                o[c] = _mm512_fmadd_ps(wp, _mm512_castsi512_ps(_mm512_and_si512(x, hi)),
                                       o[c]);
            }
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            if (c >= nc) break;
            store_eo(e[c], o[c], out + d0 + (size_t)c * 32);
        }
    }
}

/* Heads of 64 int8 values, up to MIX_HEADS per pass, each position's value
 * vectors of those heads read once (contiguous, 68 bytes each): out +=
 * (w_p d_p) * v_p, 4 accumulators a head, positions in order (the
 * operations of mix_i8_avx512 for hs 64, so the same bits). */
AVX512 static void mix64_i8_avx512(const float *sc, size_t ldsc, const void *const *row,
                                   size_t n, size_t h0, size_t nh, float *out) {
    enum { VB = 64 + 4 };
    for (size_t a = 0; a < nh; a += MIX_HEADS) {
        const size_t m = nh - a < MIX_HEADS ? nh - a : MIX_HEADS;
        const size_t off = (h0 + a) * VB;
        __m512 acc[MIX_HEADS * 4];
        _Pragma("GCC unroll 24") for (int i = 0; i < MIX_HEADS * 4; i++) acc[i] =
            _mm512_setzero_ps();
        for (size_t p = 0; p < n; p++) {
            const int8_t *src = (const int8_t *)row[p] + off;
            if (p + MIX_AHEAD < n)
                for (size_t o = 0; o < m * VB; o += 64)
                    _mm_prefetch((const char *)row[p + MIX_AHEAD] + off + o, _MM_HINT_T0);
            _Pragma("GCC unroll 6") for (int h = 0; h < MIX_HEADS; h++) {
                if ((size_t)h >= m) break;
                const int8_t *vh = src + h * VB;
                const __m512 w =
                    _mm512_set1_ps(sc[(a + (size_t)h) * ldsc + p] * i8_scale(vh, 64));
                _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) acc[h * 4 + c] =
                    _mm512_fmadd_ps(
                        w,
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                            (const __m128i *)(const void *)(vh + c * 16)))),
                        acc[h * 4 + c]);
            }
        }
        _Pragma("GCC unroll 6") for (int h = 0; h < MIX_HEADS; h++) {
            if ((size_t)h >= m) break;
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) _mm512_storeu_ps(
                out + (h0 + a + (size_t)h) * 64 + c * 16, acc[h * 4 + c]);
        }
    }
}

/* One head of hs int8 values (hs a multiple of 16, <= V512_MAX_HS), 128
 * outputs (8 accumulators) at a time: out += (w_p d_p) * v_p. */
AVX512 static void mix_i8_avx512(const float *w, const void *const *v, size_t n,
                                 size_t hs, float *out) {
    for (size_t d0 = 0; d0 < hs; d0 += 128) {
        const int nc = (int)((hs - d0 < 128 ? hs - d0 : 128) / 16);
        __m512 acc[8];
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();
        for (size_t p = 0; p < n; p++) {
            const int8_t *src = v[p];
            const __m512 wp = _mm512_set1_ps(w[p] * i8_scale(src, hs));
            src += d0;
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                if (c >= nc) break;
                acc[c] = _mm512_fmadd_ps(
                    wp,
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                        _mm_loadu_si128((const __m128i *)(const void *)(src + c * 16)))),
                    acc[c]);
            }
        }
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
            if (c >= nc) break;
            _mm512_storeu_ps(out + d0 + (size_t)c * 16, acc[c]);
        }
    }
}
#endif

/* Portable int8 mix: each value vector's bytes widened, then the isa's
 * fp32 axpy with w_p d_p. */
static void mix_i8_wide(int isa, const float *w, const void *const *v, size_t n,
                        size_t hs, float *out) {
    float t[WIDE_CHUNK];
    memset(out, 0, hs * sizeof(float));
    for (size_t p = 0; p < n; p++) {
        const int8_t *vr = v[p];
        const float wp = w[p] * i8_scale(vr, hs);
        for (size_t c = 0; c < hs; c += WIDE_CHUNK) {
            const size_t m = hs - c < WIDE_CHUNK ? hs - c : WIDE_CHUNK;
            for (size_t i = 0; i < m; i++) t[i] = (float)vr[c + i];
            cpu_axpy(isa, wp, t, out + c, m);
        }
    }
}

/* Portable bf16 mix: each value vector widened, then the isa's fp32 axpy. */
static void mix_bf16_wide(int isa, const float *w, const void *const *v, size_t n,
                          size_t hs, float *out) {
    float t[WIDE_CHUNK];
    memset(out, 0, hs * sizeof(float));
    for (size_t p = 0; p < n; p++) {
        const uint16_t *vr = v[p];
        for (size_t c = 0; c < hs; c += WIDE_CHUNK) {
            const size_t m = hs - c < WIDE_CHUNK ? hs - c : WIDE_CHUNK;
            for (size_t i = 0; i < m; i++) t[i] = bf16_to_f32(vr[c + i]);
            cpu_axpy(isa, w[p], t, out + c, m);
        }
    }
}

void cpu_kv_scores_heads(int isa, int dtype, const float *q, const void *const *row,
                         size_t n, size_t h0, size_t nh, size_t hs, float scale,
                         float *sc, size_t ldsc, const void **tmp) {
#if KVQ_X86
    if (dtype == CPU_KV_BF16 && isa >= CPU_ISA_AVX512 && hs == 64) {
        scores64_bf16_avx512(q, row, n, h0, nh, scale, sc, ldsc);
        return;
    }
    if (dtype == CPU_KV_INT8 && isa >= CPU_ISA_AVX512 && hs == 64) {
        scores64_i8_avx512(q, row, n, h0, nh, scale, sc, ldsc);
        return;
    }
#endif
    const size_t vb = cpu_kv_vec_bytes(dtype, hs);
    for (size_t h = 0; h < nh; h++) {
        for (size_t p = 0; p < n; p++) tmp[p] = (const uint8_t *)row[p] + (h0 + h) * vb;
        cpu_kv_scores(isa, dtype, q + (h0 + h) * hs, tmp, n, hs, scale, sc + h * ldsc);
    }
}

void cpu_kv_mix(int isa, int dtype, const float *w, const void *const *v, size_t n,
                size_t hs, float *out) {
    if (dtype == CPU_KV_INT8) {
#if KVQ_X86
        if (isa >= CPU_ISA_AVX512 && hs % 16 == 0 && hs <= V512_MAX_HS) {
            mix_i8_avx512(w, v, n, hs, out);
            return;
        }
#endif
        mix_i8_wide(isa, w, v, n, hs, out);
        return;
    }
    if (dtype != CPU_KV_BF16) {
        cpu_attn_mix(isa, w, (const float *const *)v, n, hs, out);
        return;
    }
#if KVQ_X86
    if (isa >= CPU_ISA_AVX512 && hs % 32 == 0 && hs <= V512_MAX_HS) {
        mix_bf16_avx512(w, v, n, hs, out);
        return;
    }
#endif
    mix_bf16_wide(isa, w, v, n, hs, out);
}

void cpu_kv_mix_heads(int isa, int dtype, const float *sc, size_t ldsc,
                      const void *const *row, size_t n, size_t h0, size_t nh, size_t hs,
                      const void **tmp, float *out) {
#if KVQ_X86
    if (dtype == CPU_KV_BF16 && isa >= CPU_ISA_AVX512 && hs == 64) {
        mix64_bf16_avx512(sc, ldsc, row, n, h0, nh, out);
        return;
    }
    if (dtype == CPU_KV_INT8 && isa >= CPU_ISA_AVX512 && hs == 64) {
        mix64_i8_avx512(sc, ldsc, row, n, h0, nh, out);
        return;
    }
#endif
    const size_t vb = cpu_kv_vec_bytes(dtype, hs);
    for (size_t h = 0; h < nh; h++) {
        for (size_t p = 0; p < n; p++) tmp[p] = (const uint8_t *)row[p] + (h0 + h) * vb;
        cpu_kv_mix(isa, dtype, sc + h * ldsc, tmp, n, hs, out + (h0 + h) * hs);
    }
}
