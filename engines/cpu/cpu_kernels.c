/*
 * cpu_kernels.c - AVX-512 / AVX2+FMA / portable versions of the CPU engine's
 * vector kernels (see cpu_kernels.h). The x86 versions are compiled with
 * per-function target attributes, so the library runs on any x86-64 and
 * picks the best version at run time.
 */
#include "engines/cpu/cpu_kernels.h"

#include "engines/cpu/cpu_features.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_X86 1
#else
#define CPU_X86 0
#endif

#define AVX512 __attribute__((target("avx512f")))
#define AVX2   __attribute__((target("avx2,fma")))

/* ------------------------------------------------------------------------- */
/* ISA detection                                                              */
/* ------------------------------------------------------------------------- */

int cpu_kernels_isa(void) {
    /* cpu_features checks that the OS saves the registers too. */
    const cpu_features *f = cpu_features_get();
    if (f->avx512f) return CPU_ISA_AVX512;
    if (f->avx2 && f->fma) return CPU_ISA_AVX2;
    return CPU_ISA_GENERIC;
}

const char *cpu_kernels_isa_name(int isa) {
    switch (isa) {
    case CPU_ISA_AVX512: return "avx512";
    case CPU_ISA_AVX2: return "avx2";
    default: return "generic";
    }
}

/* ------------------------------------------------------------------------- */
/* Packing                                                                    */
/* ------------------------------------------------------------------------- */

size_t cpu_panel_count(size_t N) { return (N + CPU_PANEL - 1) / CPU_PANEL; }

size_t cpu_packed_floats(size_t N, size_t K) {
    return cpu_panel_count(N) * CPU_PANEL * K;
}

void cpu_pack_panels(size_t N, size_t K, const float *w, float *wp, size_t p0,
                     size_t p1) {
    for (size_t p = p0; p < p1; p++) {
        float *dst = wp + p * K * CPU_PANEL;
        size_t n0 = p * CPU_PANEL;
        size_t rows = N - n0 < CPU_PANEL ? N - n0 : CPU_PANEL;
        if (rows < CPU_PANEL) memset(dst, 0, K * CPU_PANEL * sizeof(float));
        /* Blocks of 16 k keep both the reads and the writes in cache. */
        for (size_t k0 = 0; k0 < K; k0 += 16) {
            size_t k1 = k0 + 16 < K ? k0 + 16 : K;
            for (size_t j = 0; j < rows; j++) {
                const float *src = w + (n0 + j) * K;
                for (size_t k = k0; k < k1; k++) dst[k * CPU_PANEL + j] = src[k];
            }
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Skinny product on packed weights                                           */
/* ------------------------------------------------------------------------- */

/* Portable version: one output at a time, k in order. */
static void packed_generic(int M, size_t N, size_t K, const float *x, size_t ldx,
                           const float *wp, const float *bias, float *y, size_t ldy,
                           int accumulate, size_t p0, size_t p1) {
    for (size_t p = p0; p < p1; p++) {
        const float *panel = wp + p * K * CPU_PANEL;
        size_t n0 = p * CPU_PANEL;
        size_t rows = N - n0 < CPU_PANEL ? N - n0 : CPU_PANEL;
        for (int m = 0; m < M; m++) {
            const float *xr = x + (size_t)m * ldx;
            float acc[CPU_PANEL] = { 0 };
            for (size_t k = 0; k < K; k++) {
                float xv = xr[k];
                const float *wk = panel + k * CPU_PANEL;
                for (int j = 0; j < CPU_PANEL; j++) acc[j] += xv * wk[j];
            }
            float *yr = y + (size_t)m * ldy + n0;
            for (size_t j = 0; j < rows; j++) {
                float r = acc[j] + (bias ? bias[n0 + j] : 0.0f);
                yr[j] = accumulate ? yr[j] + r : r;
            }
        }
    }
}

#if CPU_X86

/* Software prefetch distance (floats) along a packed panel. */
#define PACK_PF 256

/* AVX-512: MR activation rows x NP panels of 16 outputs per tile. */
#define DEF_TILE512(MR, NP)                                                             \
    AVX512 static void tile512_##MR##_##NP(                                             \
        const float *x, size_t ldx, const float *wp, size_t K, float *y, size_t ldy,    \
        const float *bias, size_t nvalid, int accumulate, int prefetch,                 \
        const float *next, int phase, int stride) {                                     \
        __m512 acc[MR][NP];                                                             \
        int countdown = phase;                                                          \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)                            \
            _Pragma("GCC unroll 4") for (int j = 0; j < NP; j++) acc[i][j] =            \
                _mm512_setzero_ps();                                                    \
        for (size_t k = 0; k < K; k++) {                                                \
            __m512 wv[NP];                                                              \
            if (next && countdown-- == 0) {                                             \
                _Pragma("GCC unroll 4") for (int j = 0; j < NP; j++) _mm_prefetch(      \
                    (const char *)(next + (j * K + k) * CPU_PANEL), _MM_HINT_T0);       \
                countdown = stride - 1;                                                 \
            }                                                                           \
            _Pragma("GCC unroll 4") for (int j = 0; j < NP; j++) {                      \
                const float *src = wp + (j * K + k) * CPU_PANEL;                        \
                wv[j] = _mm512_loadu_ps(src);                                           \
                if (prefetch) _mm_prefetch((const char *)(src + PACK_PF), _MM_HINT_T0); \
            }                                                                           \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                      \
                __m512 xb = _mm512_set1_ps(x[i * ldx + k]);                             \
                _Pragma("GCC unroll 4") for (int j = 0; j < NP; j++) acc[i][j] =        \
                    _mm512_fmadd_ps(xb, wv[j], acc[i][j]);                              \
            }                                                                           \
        }                                                                               \
        _Pragma("GCC unroll 4") for (int j = 0; j < NP; j++) {                          \
            size_t nv =                                                                 \
                nvalid > (size_t)j * CPU_PANEL ? nvalid - (size_t)j * CPU_PANEL : 0;    \
            if (nv > CPU_PANEL) nv = CPU_PANEL;                                         \
            __mmask16 mk = (__mmask16)((1u << nv) - 1u);                                \
            __m512 b = bias ? _mm512_maskz_loadu_ps(mk, bias + j * CPU_PANEL)           \
                            : _mm512_setzero_ps();                                      \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                      \
                float *dst = y + i * ldy + j * CPU_PANEL;                               \
                __m512 r = _mm512_add_ps(acc[i][j], b);                                 \
                if (accumulate) r = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, dst), r);   \
                _mm512_mask_storeu_ps(dst, mk, r);                                      \
            }                                                                           \
        }                                                                               \
    }

DEF_TILE512(1, 4);
DEF_TILE512(2, 4);
DEF_TILE512(3, 4);
DEF_TILE512(4, 4);
DEF_TILE512(5, 4);
DEF_TILE512(6, 4);
DEF_TILE512(1, 1);
DEF_TILE512(2, 1);
DEF_TILE512(3, 1);
DEF_TILE512(4, 1);
DEF_TILE512(5, 1);
DEF_TILE512(6, 1);

typedef void (*tile_fn)(const float *, size_t, const float *, size_t, float *, size_t,
                        const float *, size_t, int, int, const float *, int, int);

#define MR512 CPU_PACKED_TILE_ROWS
#define NP512 4
static const tile_fn tiles512_np[MR512] = { tile512_1_4, tile512_2_4, tile512_3_4,
                                            tile512_4_4, tile512_5_4, tile512_6_4 };
static const tile_fn tiles512_1[MR512] = { tile512_1_1, tile512_2_1, tile512_3_1,
                                           tile512_4_1, tile512_5_1, tile512_6_1 };

/* One row (single-sequence decoding): panel after panel, one contiguous
 * stream per thread, KU interleaved accumulators to cover the FMA latency.
 * Streams the weights at the read-only bandwidth of the machine (the
 * grouped tiles below reached ~92% of it for one row, this ~99%; for 2 to 6
 * rows the grouped tiles are faster, measured). */
#define DEF_SEQ512(MR, KU)                                                             \
    AVX512 static void seq512_##MR(const float *x, size_t ldx, const float *panel,     \
                                   size_t K, float *y, size_t ldy, const float *bias,  \
                                   size_t nvalid, int accumulate) {                    \
        __m512 acc[MR][KU];                                                            \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)                           \
            _Pragma("GCC unroll 4") for (int u = 0; u < KU; u++) acc[i][u] =           \
                _mm512_setzero_ps();                                                   \
        size_t k = 0;                                                                  \
        for (; k + KU <= K; k += KU) {                                                 \
            _Pragma("GCC unroll 4") for (int u = 0; u < KU; u++) {                     \
                __m512 w = _mm512_loadu_ps(panel + (k + u) * CPU_PANEL);               \
                _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) acc[i][u] =       \
                    _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + k + u]), w, acc[i][u]); \
            }                                                                          \
        }                                                                              \
        for (; k < K; k++) {                                                           \
            __m512 w = _mm512_loadu_ps(panel + k * CPU_PANEL);                         \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) acc[i][0] =           \
                _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + k]), w, acc[i][0]);         \
        }                                                                              \
        size_t nv = nvalid < CPU_PANEL ? nvalid : CPU_PANEL;                           \
        __mmask16 mk = (__mmask16)((1u << nv) - 1u);                                   \
        __m512 b = bias ? _mm512_maskz_loadu_ps(mk, bias) : _mm512_setzero_ps();       \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                         \
            __m512 r = acc[i][0];                                                      \
            _Pragma("GCC unroll 4") for (int u = 1; u < KU; u++) r =                   \
                _mm512_add_ps(r, acc[i][u]);                                           \
            r = _mm512_add_ps(r, b);                                                   \
            float *dst = y + i * ldy;                                                  \
            if (accumulate) r = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, dst), r);      \
            _mm512_mask_storeu_ps(dst, mk, r);                                         \
        }                                                                              \
    }

DEF_SEQ512(1, 4)

/* Panels go in groups of NP512; every m-block of MR512 rows runs over the
 * group (the first from memory, the others from cache). With several
 * m-blocks, each also prefetches an interleaved share of the NEXT group, so
 * streaming the weights overlaps the compute-bound blocks (about 1.3x for 16
 * rows on this machine). */
AVX512 static void packed_avx512(int M, size_t N, size_t K, const float *x, size_t ldx,
                                 const float *wp, const float *bias, float *y, size_t ldy,
                                 int accumulate, size_t p0, size_t p1) {
    if (M == 1) {
        for (size_t p = p0; p < p1; p++)
            seq512_1(x, ldx, wp + p * K * CPU_PANEL, K, y + p * CPU_PANEL, ldy,
                     bias ? bias + p * CPU_PANEL : NULL, N - p * CPU_PANEL, accumulate);
        return;
    }
    const int nmb = (M + MR512 - 1) / MR512;
    size_t p = p0;
    while (p < p1) {
        int np = p1 - p >= NP512 ? NP512 : 1;
        size_t n0 = p * CPU_PANEL;
        size_t nvalid = N - n0;
        const float *next = nmb > 1 && np == NP512 && p + 2 * NP512 <= p1
                                ? wp + (p + NP512) * K * CPU_PANEL
                                : NULL;
        for (int m = 0, mi = 0; m < M; m += MR512, mi++) {
            int mr = M - m < MR512 ? M - m : MR512;
            const tile_fn f = np == NP512 ? tiles512_np[mr - 1] : tiles512_1[mr - 1];
            f(x + (size_t)m * ldx, ldx, wp + p * K * CPU_PANEL, K,
              y + (size_t)m * ldy + n0, ldy, bias ? bias + n0 : NULL, nvalid, accumulate,
              m == 0 && !next, next, mi, nmb);
        }
        p += (size_t)np;
    }
}

/* AVX2: a panel of 16 is two 8-wide halves; MR rows per tile. */
#define DEF_TILE256(MR)                                                                  \
    AVX2 static void tile256_##MR(const float *x, size_t ldx, const float *wp, size_t K, \
                                  float *y, size_t ldy, const float *bias,               \
                                  size_t nvalid, int accumulate, int prefetch,           \
                                  const float *next, int phase, int stride) {            \
        (void)next;                                                                      \
        (void)phase;                                                                     \
        (void)stride;                                                                    \
        __m256 lo[MR], hi[MR];                                                           \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                           \
            lo[i] = _mm256_setzero_ps();                                                 \
            hi[i] = _mm256_setzero_ps();                                                 \
        }                                                                                \
        for (size_t k = 0; k < K; k++) {                                                 \
            const float *src = wp + k * CPU_PANEL;                                       \
            __m256 w0 = _mm256_loadu_ps(src), w1 = _mm256_loadu_ps(src + 8);             \
            if (prefetch) _mm_prefetch((const char *)(src + PACK_PF), _MM_HINT_T0);      \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                       \
                __m256 xb = _mm256_broadcast_ss(x + i * ldx + k);                        \
                lo[i] = _mm256_fmadd_ps(xb, w0, lo[i]);                                  \
                hi[i] = _mm256_fmadd_ps(xb, w1, hi[i]);                                  \
            }                                                                            \
        }                                                                                \
        size_t nv = nvalid < CPU_PANEL ? nvalid : CPU_PANEL;                             \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                           \
            float r[CPU_PANEL];                                                          \
            _mm256_storeu_ps(r, lo[i]);                                                  \
            _mm256_storeu_ps(r + 8, hi[i]);                                              \
            float *dst = y + i * ldy;                                                    \
            for (size_t j = 0; j < nv; j++) {                                            \
                float v = r[j] + (bias ? bias[j] : 0.0f);                                \
                dst[j] = accumulate ? dst[j] + v : v;                                    \
            }                                                                            \
        }                                                                                \
    }

DEF_TILE256(1);
DEF_TILE256(2);
DEF_TILE256(3);
DEF_TILE256(4);

#define MR256 4
static const tile_fn tiles256[MR256] = { tile256_1, tile256_2, tile256_3, tile256_4 };

AVX2 static void packed_avx2(int M, size_t N, size_t K, const float *x, size_t ldx,
                             const float *wp, const float *bias, float *y, size_t ldy,
                             int accumulate, size_t p0, size_t p1) {
    for (size_t p = p0; p < p1; p++) {
        size_t n0 = p * CPU_PANEL;
        for (int m = 0; m < M; m += MR256) {
            int mr = M - m < MR256 ? M - m : MR256;
            tiles256[mr - 1](x + (size_t)m * ldx, ldx, wp + p * K * CPU_PANEL, K,
                             y + (size_t)m * ldy + n0, ldy, bias ? bias + n0 : NULL,
                             N - n0, accumulate, m == 0, NULL, 0, 1);
        }
    }
}
#endif /* CPU_X86 */

void cpu_packed_matmul(int isa, int M, size_t N, size_t K, const float *x, size_t ldx,
                       const float *wp, const float *bias, float *y, size_t ldy,
                       int accumulate, size_t p0, size_t p1) {
    if (M <= 0 || p0 >= p1) return;
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        packed_avx512(M, N, K, x, ldx, wp, bias, y, ldy, accumulate, p0, p1);
        return;
    }
    if (isa == CPU_ISA_AVX2) {
        packed_avx2(M, N, K, x, ldx, wp, bias, y, ldy, accumulate, p0, p1);
        return;
    }
#else
    (void)isa;
#endif
    packed_generic(M, N, K, x, ldx, wp, bias, y, ldy, accumulate, p0, p1);
}

/* ------------------------------------------------------------------------- */
/* AdamW                                                                      */
/* ------------------------------------------------------------------------- */

/* One element, in PyTorch's order (torch.optim.AdamW, single-tensor path). */
static inline void adamw_one(float *p, float *g, float *m, float *v,
                             const cpu_adamw_consts *c) {
    float gv = *g;
    if (c->gscale != 1.0f) {
        gv *= c->gscale;
        *g = gv;
    }
    float pv = *p * c->decay;
    float mv = *m * c->beta1 + gv * c->one_minus_beta1;
    float vv = *v * c->beta2 + gv * gv * c->one_minus_beta2;
    float denom = sqrtf(vv) * c->inv_bc2_sqrt + c->eps;
    *p = pv - c->step_size * (mv / denom);
    *m = mv;
    *v = vv;
}

#if CPU_X86
AVX512 static void adamw_avx512(float *p, float *g, float *m, float *v, size_t n,
                                const cpu_adamw_consts *c) {
    const __m512 b1 = _mm512_set1_ps(c->beta1), b2 = _mm512_set1_ps(c->beta2);
    const __m512 ob1 = _mm512_set1_ps(c->one_minus_beta1);
    const __m512 ob2 = _mm512_set1_ps(c->one_minus_beta2);
    const __m512 dec = _mm512_set1_ps(c->decay), ss = _mm512_set1_ps(c->step_size);
    const __m512 ibc = _mm512_set1_ps(c->inv_bc2_sqrt), eps = _mm512_set1_ps(c->eps);
    const __m512 gs = _mm512_set1_ps(c->gscale);
    const int scale = c->gscale != 1.0f;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        if (scale) {
            gv = _mm512_mul_ps(gv, gs);
            _mm512_storeu_ps(g + i, gv);
        }
        __m512 pv = _mm512_mul_ps(_mm512_loadu_ps(p + i), dec);
        __m512 mv = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), b1),
                                  _mm512_mul_ps(gv, ob1));
        __m512 vv = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2),
                                  _mm512_mul_ps(_mm512_mul_ps(gv, gv), ob2));
        __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vv), ibc), eps);
        pv = _mm512_sub_ps(pv, _mm512_mul_ps(ss, _mm512_div_ps(mv, den)));
        _mm512_storeu_ps(p + i, pv);
        _mm512_storeu_ps(m + i, mv);
        _mm512_storeu_ps(v + i, vv);
    }
    for (; i < n; i++) adamw_one(p + i, g + i, m + i, v + i, c);
}

AVX2 static void adamw_avx2(float *p, float *g, float *m, float *v, size_t n,
                            const cpu_adamw_consts *c) {
    const __m256 b1 = _mm256_set1_ps(c->beta1), b2 = _mm256_set1_ps(c->beta2);
    const __m256 ob1 = _mm256_set1_ps(c->one_minus_beta1);
    const __m256 ob2 = _mm256_set1_ps(c->one_minus_beta2);
    const __m256 dec = _mm256_set1_ps(c->decay), ss = _mm256_set1_ps(c->step_size);
    const __m256 ibc = _mm256_set1_ps(c->inv_bc2_sqrt), eps = _mm256_set1_ps(c->eps);
    const __m256 gs = _mm256_set1_ps(c->gscale);
    const int scale = c->gscale != 1.0f;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        if (scale) {
            gv = _mm256_mul_ps(gv, gs);
            _mm256_storeu_ps(g + i, gv);
        }
        __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(p + i), dec);
        __m256 mv = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), b1),
                                  _mm256_mul_ps(gv, ob1));
        __m256 vv = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2),
                                  _mm256_mul_ps(_mm256_mul_ps(gv, gv), ob2));
        __m256 den = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vv), ibc), eps);
        pv = _mm256_sub_ps(pv, _mm256_mul_ps(ss, _mm256_div_ps(mv, den)));
        _mm256_storeu_ps(p + i, pv);
        _mm256_storeu_ps(m + i, mv);
        _mm256_storeu_ps(v + i, vv);
    }
    for (; i < n; i++) adamw_one(p + i, g + i, m + i, v + i, c);
}
#endif

void cpu_adamw(int isa, float *p, float *g, float *m, float *v, size_t n,
               const cpu_adamw_consts *c) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        adamw_avx512(p, g, m, v, n, c);
        return;
    }
    if (isa == CPU_ISA_AVX2) {
        adamw_avx2(p, g, m, v, n, c);
        return;
    }
#else
    (void)isa;
#endif
    for (size_t i = 0; i < n; i++) adamw_one(p + i, g + i, m + i, v + i, c);
}

/* ------------------------------------------------------------------------- */
/* Reductions and bandwidth probes                                            */
/* ------------------------------------------------------------------------- */

/* Chunks of 1024 floats are summed in float lanes, chunks added in double. */
#define SUMSQ_CHUNK 1024

#if CPU_X86
AVX512 static double sumsq_avx512(const float *a, size_t n) {
    double total = 0.0;
    size_t i = 0;
    while (i + 16 <= n) {
        size_t end = i + SUMSQ_CHUNK <= n ? i + SUMSQ_CHUNK : n - (n - i) % 16;
        __m512 s0 = _mm512_setzero_ps();
        for (; i < end; i += 16) {
            __m512 x = _mm512_loadu_ps(a + i);
            s0 = _mm512_fmadd_ps(x, x, s0);
        }
        total += (double)_mm512_reduce_add_ps(s0);
    }
    for (; i < n; i++) total += (double)a[i] * (double)a[i];
    return total;
}

AVX2 static double sumsq_avx2(const float *a, size_t n) {
    double total = 0.0;
    size_t i = 0;
    while (i + 8 <= n) {
        size_t end = i + SUMSQ_CHUNK <= n ? i + SUMSQ_CHUNK : n - (n - i) % 8;
        __m256 s0 = _mm256_setzero_ps();
        for (; i < end; i += 8) {
            __m256 x = _mm256_loadu_ps(a + i);
            s0 = _mm256_fmadd_ps(x, x, s0);
        }
        float t[8];
        _mm256_storeu_ps(t, s0);
        total +=
            (double)(((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7])));
    }
    for (; i < n; i++) total += (double)a[i] * (double)a[i];
    return total;
}

AVX512 static float read_sum_avx512(const float *a, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(a + i + 48));
    }
    float s =
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i];
    return s;
}

AVX2 static float read_sum_avx2(const float *a, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    for (; i < n; i++) s += a[i];
    return s;
}

AVX512 static void triad_avx512(float *a, const float *b, const float *c, float s,
                                size_t n) {
    const __m512 sv = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(
            a + i, _mm512_fmadd_ps(sv, _mm512_loadu_ps(c + i), _mm512_loadu_ps(b + i)));
    for (; i < n; i++) a[i] = b[i] + s * c[i];
}

AVX2 static void triad_avx2(float *a, const float *b, const float *c, float s, size_t n) {
    const __m256 sv = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            a + i, _mm256_fmadd_ps(sv, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) a[i] = b[i] + s * c[i];
}

AVX512 static float dot_avx512(const float *a, const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 =
            _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    if (i + 16 <= n) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        i += 16;
    }
    if (i < n) {
        __mmask16 mk = (__mmask16)((1u << (n - i)) - 1u);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + i),
                             _mm512_maskz_loadu_ps(mk, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

AVX2 static float dot_avx2(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        i += 8;
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(s0, s1));
    float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX512 static void axpy_avx512(float a, const float *x, float *y, size_t n) {
    const __m512 av = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(
            y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 mk = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, mk,
                              _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, x + i),
                                              _mm512_maskz_loadu_ps(mk, y + i)));
    }
}

AVX2 static void axpy_avx2(float a, const float *x, float *y, size_t n) {
    const __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif /* CPU_X86 */

double cpu_sumsq(int isa, const float *a, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) return sumsq_avx512(a, n);
    if (isa == CPU_ISA_AVX2) return sumsq_avx2(a, n);
#else
    (void)isa;
#endif
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += (double)a[i] * (double)a[i];
    return total;
}

float cpu_read_sum(int isa, const float *a, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) return read_sum_avx512(a, n);
    if (isa == CPU_ISA_AVX2) return read_sum_avx2(a, n);
#else
    (void)isa;
#endif
    float s[8] = { 0 };
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i];
    return r;
}

void cpu_triad(int isa, float *a, const float *b, const float *c, float s, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        triad_avx512(a, b, c, s, n);
        return;
    }
    if (isa == CPU_ISA_AVX2) {
        triad_avx2(a, b, c, s, n);
        return;
    }
#else
    (void)isa;
#endif
    for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

float cpu_dot(int isa, const float *a, const float *b, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) return dot_avx512(a, b, n);
    if (isa == CPU_ISA_AVX2) return dot_avx2(a, b, n);
#else
    (void)isa;
#endif
    float s[4] = { 0 };
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += a[i + j] * b[i + j];
    float r = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

void cpu_axpy(int isa, float a, const float *x, float *y, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        axpy_avx512(a, x, y, n);
        return;
    }
    if (isa == CPU_ISA_AVX2) {
        axpy_avx2(a, x, y, n);
        return;
    }
#else
    (void)isa;
#endif
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* ------------------------------------------------------------------------- */
/* exp, tanh, GELU, softmax helpers                                           */
/* ------------------------------------------------------------------------- */

/* Cephes-style single-precision exp and tanh (about 1-2 ulp); the scalar
 * versions use libm. */
#define GELU_S 0.7978845608028654f
#define GELU_C 0.044715f

static inline float gelu_one(float x, float *th) {
    float t = tanhf(GELU_S * (x + GELU_C * x * x * x));
    if (th) *th = t;
    return 0.5f * x * (1.0f + t);
}

#if CPU_X86
AVX512 static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)),
                      _mm512_set1_ps(88.72283f));
    __m512 n =
        _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

AVX512 static inline __m512 tanh512(__m512 x) {
    const __m512 ax = _mm512_abs_ps(x);
    /* |x| < 0.625: odd polynomial */
    __m512 z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    /* otherwise 1 - 2 / (exp(2|x|) + 1), with the sign of x */
    __m512 e = exp512(_mm512_add_ps(ax, ax));
    __m512 big = _mm512_sub_ps(
        _mm512_set1_ps(1.0f),
        _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    big = _mm512_mask_sub_ps(big, neg, _mm512_setzero_ps(), big);
    __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(is_small, big, small);
}

AVX512 static void gelu_avx512(const float *x, float *th, float *g, size_t n) {
    const __m512 s = _mm512_set1_ps(GELU_S), c = _mm512_set1_ps(GELU_C);
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 u = _mm512_mul_ps(
            s, _mm512_fmadd_ps(_mm512_mul_ps(c, v), _mm512_mul_ps(v, v), v));
        __m512 t = tanh512(u);
        if (th) _mm512_storeu_ps(th + i, t);
        _mm512_storeu_ps(g + i,
                         _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, t)));
    }
    for (; i < n; i++) g[i] = gelu_one(x[i], th ? th + i : NULL);
}

AVX512 static float max_avx512(const float *x, size_t n) {
    size_t i = 0;
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    float r = _mm512_reduce_max_ps(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

AVX512 static float exp_sum_avx512(float *x, float shift, size_t n) {
    const __m512 sh = _mm512_set1_ps(shift);
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    float s = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) {
        x[i] = expf(x[i] - shift);
        s += x[i];
    }
    return s;
}

AVX512 static void scale_avx512(float *x, float a, size_t n) {
    const __m512 av = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), av));
    for (; i < n; i++) x[i] *= a;
}

AVX2 static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)),
                      _mm256_set1_ps(88.72283f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n through the exponent bits (n is within [-126, 128]) */
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
    return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.0f));
}

AVX2 static inline __m256 tanh256(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 z = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    __m256 e = exp256(_mm256_add_ps(ax, ax));
    __m256 big = _mm256_sub_ps(
        _mm256_set1_ps(1.0f),
        _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    big = _mm256_or_ps(big, _mm256_and_ps(x, sign));
    __m256 is_small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ);
    return _mm256_blendv_ps(big, small, is_small);
}

AVX2 static void gelu_avx2(const float *x, float *th, float *g, size_t n) {
    const __m256 s = _mm256_set1_ps(GELU_S), c = _mm256_set1_ps(GELU_C);
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 u = _mm256_mul_ps(
            s, _mm256_fmadd_ps(_mm256_mul_ps(c, v), _mm256_mul_ps(v, v), v));
        __m256 t = tanh256(u);
        if (th) _mm256_storeu_ps(th + i, t);
        _mm256_storeu_ps(g + i,
                         _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t)));
    }
    for (; i < n; i++) g[i] = gelu_one(x[i], th ? th + i : NULL);
}

AVX2 static float max_avx2(const float *x, size_t n) {
    size_t i = 0;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float t[8];
    _mm256_storeu_ps(t, m);
    float r = t[0];
    for (int k = 1; k < 8; k++) r = t[k] > r ? t[k] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

AVX2 static float exp_sum_avx2(float *x, float shift, size_t n) {
    const __m256 sh = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    for (; i < n; i++) {
        x[i] = expf(x[i] - shift);
        s += x[i];
    }
    return s;
}

AVX2 static void scale_avx2(float *x, float a, size_t n) {
    const __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
    for (; i < n; i++) x[i] *= a;
}
#endif /* CPU_X86 */

void cpu_gelu(int isa, const float *x, float *th, float *gelu, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        gelu_avx512(x, th, gelu, n);
        return;
    }
    if (isa == CPU_ISA_AVX2) {
        gelu_avx2(x, th, gelu, n);
        return;
    }
#else
    (void)isa;
#endif
    for (size_t i = 0; i < n; i++) gelu[i] = gelu_one(x[i], th ? th + i : NULL);
}

float cpu_max(int isa, const float *x, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) return max_avx512(x, n);
    if (isa == CPU_ISA_AVX2) return max_avx2(x, n);
#else
    (void)isa;
#endif
    float r = x[0];
    for (size_t i = 1; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

float cpu_exp_sum(int isa, float *x, float shift, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) return exp_sum_avx512(x, shift, n);
    if (isa == CPU_ISA_AVX2) return exp_sum_avx2(x, shift, n);
#else
    (void)isa;
#endif
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - shift);
        s += x[i];
    }
    return s;
}

void cpu_scale(int isa, float *x, float a, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        scale_avx512(x, a, n);
        return;
    }
    if (isa == CPU_ISA_AVX2) {
        scale_avx2(x, a, n);
        return;
    }
#else
    (void)isa;
#endif
    for (size_t i = 0; i < n; i++) x[i] *= a;
}

/* ------------------------------------------------------------------------- */
/* Attention over KV blocks                                                   */
/* ------------------------------------------------------------------------- */

#if CPU_X86
/* 16 dot products at once: one accumulator per position, then a
 * transposing reduction (4 shuffle levels) instead of 16 horizontal sums. */
AVX512 static __m512 scores16_avx512(const float *q, const float *const *k, size_t hs) {
    __m512 a[16];
    _Pragma("GCC unroll 16") for (int p = 0; p < 16; p++) a[p] = _mm512_setzero_ps();
    size_t d = 0;
    for (; d + 16 <= hs; d += 16) {
        __m512 qv = _mm512_loadu_ps(q + d);
        _Pragma("GCC unroll 16") for (int p = 0; p < 16; p++) a[p] =
            _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[p] + d), a[p]);
    }
    if (d < hs) {
        __mmask16 mk = (__mmask16)((1u << (hs - d)) - 1u);
        __m512 qv = _mm512_maskz_loadu_ps(mk, q + d);
        _Pragma("GCC unroll 16") for (int p = 0; p < 16; p++) a[p] =
            _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(mk, k[p] + d), a[p]);
    }
    __m512 b[8], c[4];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) b[i] =
        _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                      _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) c[i] =
        _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                      _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    __m512 d01 =
        _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    __m512 d23 =
        _mm512_add_ps(_mm512_unpacklo_ps(c[2], c[3]), _mm512_unpackhi_ps(c[2], c[3]));
    __m512 f = _mm512_add_ps(_mm512_shuffle_ps(d01, d23, 0x44),
                             _mm512_shuffle_ps(d01, d23, 0xEE));
    /* lane 4k+j of f holds position 4j+k */
    const __m512i idx =
        _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(idx, f);
}

AVX512 static void attn_scores_avx512(const float *q, const float *const *k, size_t n,
                                      size_t hs, float scale, float *out) {
    const __m512 sv = _mm512_set1_ps(scale);
    size_t p = 0;
    for (; p + 16 <= n; p += 16)
        _mm512_storeu_ps(out + p, _mm512_mul_ps(scores16_avx512(q, k + p, hs), sv));
    if (p < n) {
        const float *kk[16];
        for (size_t i = 0; i < 16; i++) kk[i] = k[p + i < n ? p + i : n - 1];
        __mmask16 mk = (__mmask16)((1u << (n - p)) - 1u);
        _mm512_mask_storeu_ps(out + p, mk, _mm512_mul_ps(scores16_avx512(q, kk, hs), sv));
    }
}

/* out = sum_p w[p] v[p], 8 vectors of output kept in registers at a time. */
AVX512 static void attn_mix_avx512(const float *w, const float *const *v, size_t n,
                                   size_t hs, float *out) {
    for (size_t d0 = 0; d0 < hs; d0 += 128) {
        const size_t dl = hs - d0 < 128 ? hs - d0 : 128;
        const int nv = (int)((dl + 15) / 16);
        const __mmask16 last = (__mmask16)((1u << (dl - 16 * (size_t)(nv - 1))) - 1u);
        __m512 acc[8];
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();
        for (size_t p = 0; p < n; p++) {
            const __m512 wp = _mm512_set1_ps(w[p]);
            const float *src = v[p] + d0;
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                if (i >= nv) break;
                __mmask16 mk = i == nv - 1 ? last : (__mmask16)0xFFFF;
                acc[i] =
                    _mm512_fmadd_ps(wp, _mm512_maskz_loadu_ps(mk, src + 16 * i), acc[i]);
            }
        }
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            if (i >= nv) break;
            __mmask16 mk = i == nv - 1 ? last : (__mmask16)0xFFFF;
            _mm512_mask_storeu_ps(out + d0 + 16 * i, mk, acc[i]);
        }
    }
}
#endif

void cpu_attn_scores(int isa, const float *q, const float *const *k, size_t n, size_t hs,
                     float scale, float *out) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        attn_scores_avx512(q, k, n, hs, scale, out);
        return;
    }
#endif
    for (size_t p = 0; p < n; p++) out[p] = cpu_dot(isa, q, k[p], hs) * scale;
}

void cpu_attn_mix(int isa, const float *w, const float *const *v, size_t n, size_t hs,
                  float *out) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        attn_mix_avx512(w, v, n, hs, out);
        return;
    }
#endif
    memset(out, 0, hs * sizeof(float));
    for (size_t p = 0; p < n; p++) cpu_axpy(isa, w[p], v[p], out, hs);
}

/* ------------------------------------------------------------------------- */
/* GELU backward, add, LayerNorm                                              */
/* ------------------------------------------------------------------------- */

static inline float gelu_grad_one(float x, float t) {
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * GELU_S * (1.0f + 3.0f * GELU_C * x * x);
}

#if CPU_X86
AVX512 static void gelu_backward_avx512(float *d, const float *x, const float *th,
                                        size_t n) {
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 s = _mm512_set1_ps(GELU_S), c3 = _mm512_set1_ps(3.0f * GELU_C);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i), t = _mm512_loadu_ps(th + i);
        __m512 a = _mm512_mul_ps(half, _mm512_add_ps(one, t));
        __m512 sech2 = _mm512_fnmadd_ps(t, t, one);
        __m512 du = _mm512_mul_ps(s, _mm512_fmadd_ps(_mm512_mul_ps(c3, xv), xv, one));
        __m512 g = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(half, xv), sech2), du, a);
        _mm512_storeu_ps(d + i, _mm512_mul_ps(_mm512_loadu_ps(d + i), g));
    }
    for (; i < n; i++) d[i] *= gelu_grad_one(x[i], th[i]);
}

AVX512 static void add_avx512(const float *a, const float *b, float *out, size_t n) {
    size_t i = 0;
    if (b) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(
                out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
        for (; i < n; i++) out[i] = a[i] + b[i];
    } else if (out != a) {
        memcpy(out, a, n * sizeof(float));
    }
}

AVX512 static float sum_avx512(const float *x, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(x + i + 16));
    }
    if (i + 16 <= n) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + i));
        i += 16;
    }
    if (i < n)
        s1 = _mm512_add_ps(
            s1, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1u), x + i));
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

AVX512 static float centered_sumsq_avx512(const float *x, float m, size_t n) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 s0 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), mv);
        s0 = _mm512_fmadd_ps(d, d, s0);
    }
    if (i < n) {
        __mmask16 mk = (__mmask16)((1u << (n - i)) - 1u);
        __m512 d = _mm512_maskz_sub_ps(mk, _mm512_maskz_loadu_ps(mk, x + i), mv);
        s0 = _mm512_fmadd_ps(d, d, s0);
    }
    return _mm512_reduce_add_ps(s0);
}

AVX512 static void layernorm_avx512(const float *x, float *out, const float *w,
                                    const float *b, size_t n, float eps, float *mean,
                                    float *rstd) {
    const float m = sum_avx512(x, n) / (float)n;
    const float var = centered_sumsq_avx512(x, m, n) / (float)n;
    const float rs = 1.0f / sqrtf(var + eps);
    const __m512 mv = _mm512_set1_ps(m), rv = _mm512_set1_ps(rs);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv), rv);
        _mm512_storeu_ps(
            out + i, _mm512_fmadd_ps(xh, _mm512_loadu_ps(w + i), _mm512_loadu_ps(b + i)));
    }
    for (; i < n; i++) out[i] = (x[i] - m) * rs * w[i] + b[i];
    if (mean) *mean = m;
    if (rstd) *rstd = rs;
}

AVX512 static void layernorm_backward_avx512(const float *dy, const float *x,
                                             const float *w, float m, float rs, float *dx,
                                             size_t n) {
    const __m512 mv = _mm512_set1_ps(m), rv = _mm512_set1_ps(rs);
    __m512 a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 dn = _mm512_mul_ps(_mm512_loadu_ps(dy + i), _mm512_loadu_ps(w + i));
        __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv), rv);
        a1 = _mm512_add_ps(a1, dn);
        a2 = _mm512_fmadd_ps(dn, xh, a2);
    }
    float s1 = _mm512_reduce_add_ps(a1), s2 = _mm512_reduce_add_ps(a2);
    for (size_t k = i; k < n; k++) {
        float dn = dy[k] * w[k];
        s1 += dn;
        s2 += dn * ((x[k] - m) * rs);
    }
    s1 /= (float)n;
    s2 /= (float)n;
    const __m512 s1v = _mm512_set1_ps(s1), s2v = _mm512_set1_ps(s2);
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 dn = _mm512_mul_ps(_mm512_loadu_ps(dy + i), _mm512_loadu_ps(w + i));
        __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv), rv);
        __m512 g = _mm512_sub_ps(_mm512_sub_ps(dn, s1v), _mm512_mul_ps(xh, s2v));
        _mm512_storeu_ps(dx + i, _mm512_fmadd_ps(rv, g, _mm512_loadu_ps(dx + i)));
    }
    for (; i < n; i++) {
        float xh = (x[i] - m) * rs;
        dx[i] += rs * (dy[i] * w[i] - s1 - xh * s2);
    }
}
#endif

void cpu_gelu_backward(int isa, float *d, const float *x, const float *th, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        gelu_backward_avx512(d, x, th, n);
        return;
    }
#else
    (void)isa;
#endif
    for (size_t i = 0; i < n; i++) d[i] *= gelu_grad_one(x[i], th[i]);
}

void cpu_add(int isa, const float *a, const float *b, float *out, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        add_avx512(a, b, out, n);
        return;
    }
#else
    (void)isa;
#endif
    if (b) {
        for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    } else if (out != a) {
        memcpy(out, a, n * sizeof(float));
    }
}

void cpu_layernorm(int isa, const float *x, float *out, const float *w, const float *b,
                   size_t n, float eps, float *mean, float *rstd) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        layernorm_avx512(x, out, w, b, n, eps, mean, rstd);
        return;
    }
#else
    (void)isa;
#endif
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += x[i];
    const float m = s / (float)n;
    float v = 0.0f;
    for (size_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    const float rs = 1.0f / sqrtf(v / (float)n + eps);
    for (size_t i = 0; i < n; i++) out[i] = (x[i] - m) * rs * w[i] + b[i];
    if (mean) *mean = m;
    if (rstd) *rstd = rs;
}

void cpu_layernorm_backward(int isa, const float *dy, const float *x, const float *w,
                            float mean, float rstd, float *dx, size_t n) {
#if CPU_X86
    if (isa >= CPU_ISA_AVX512) {
        layernorm_backward_avx512(dy, x, w, mean, rstd, dx, n);
        return;
    }
#else
    (void)isa;
#endif
    float s1 = 0.0f, s2 = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float dn = dy[i] * w[i];
        s1 += dn;
        s2 += dn * ((x[i] - mean) * rstd);
    }
    s1 /= (float)n;
    s2 /= (float)n;
    for (size_t i = 0; i < n; i++) {
        float xh = (x[i] - mean) * rstd;
        dx[i] += rstd * (dy[i] * w[i] - s1 - xh * s2);
    }
}
