/*
 * cpu_bf16.c - oneDNN bf16 matmul loaded at run time, plan cache, fp32 ->
 * bf16 conversion kernels (see cpu_bf16.h).
 *
 * The oneDNN C API is called through function pointers filled by dlsym; the
 * pointer types come from the header's own declarations (__typeof__), so a
 * mismatch is a compile error, not a crash.
 */
#include "engines/cpu/cpu_bf16.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "engines/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define BF16_X86 1
#else
#define BF16_X86 0
#endif

#define SET_ERR(err, cap, ...)                               \
    do {                                                     \
        if ((err) && (cap)) snprintf(err, cap, __VA_ARGS__); \
    } while (0)

/* ------------------------------------------------------------------------- */
/* Conversion kernels                                                         */
/* ------------------------------------------------------------------------- */

int cpu_bf16_convert_best(void) {
    const cpu_features *f = cpu_features_get();
    if (f->avx512_bf16 && f->avx512f) return CPU_BF16_CVT_AVX512BF16;
    if (f->avx512f) return CPU_BF16_CVT_AVX512;
    return CPU_BF16_CVT_C;
}

static void convert_c(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = cpu_bf16_round(src[i]);
}

#if BF16_X86
/* Round to nearest even on the bit pattern: u + 0x7fff + lsb, high half;
 * NaNs are quieted instead (as vcvtne2ps2bf16 does). */
__attribute__((target("avx512f"))) static void convert_avx512(const float *src,
                                                              uint16_t *dst, size_t n) {
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r =
            _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), lsb), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absmask), inf);
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    convert_c(src + i, dst + i, n - i);
}

__attribute__((target("avx512f,avx512bf16"))) static void
convert_avx512bf16(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v =
            _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)v);
    }
    if (i + 16 <= n) {
        __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)v);
        i += 16;
    }
    convert_c(src + i, dst + i, n - i);
}
#endif

void cpu_bf16_convert_with(int kernel, const float *src, uint16_t *dst, size_t n) {
#if BF16_X86
    if (kernel > cpu_bf16_convert_best()) kernel = cpu_bf16_convert_best();
    if (kernel == CPU_BF16_CVT_AVX512BF16) {
        convert_avx512bf16(src, dst, n);
        return;
    }
    if (kernel == CPU_BF16_CVT_AVX512) {
        convert_avx512(src, dst, n);
        return;
    }
#else
    (void)kernel;
#endif
    convert_c(src, dst, n);
}

void cpu_bf16_convert(const float *src, uint16_t *dst, size_t n) {
    static int best = -1;
    int k = __atomic_load_n(&best, __ATOMIC_RELAXED);
    if (k < 0) {
        k = cpu_bf16_convert_best();
        __atomic_store_n(&best, k, __ATOMIC_RELAXED);
    }
    cpu_bf16_convert_with(k, src, dst, n);
}

/* ------------------------------------------------------------------------- */
/* oneDNN, loaded at run time                                                 */
/* ------------------------------------------------------------------------- */

#if defined(__has_include)
#if __has_include(<oneapi/dnnl/dnnl.h>)
#define BF16_HAVE_DNNL_H 1
#endif
#endif

#ifndef BF16_HAVE_DNNL_H

int32_t cpu_bf16_load(char *err, size_t err_cap) {
    SET_ERR(err, err_cap,
            "the CPU engine was built without oneDNN's header "
            "(oneapi/dnnl/dnnl.h, package libdnnl-dev); rebuild with it for bf16");
    return ORCH_ERR_UNSUPPORTED;
}
int32_t cpu_bf16_cap_isa(int which, char *err, size_t err_cap) {
    (void)which;
    return cpu_bf16_load(err, err_cap);
}
int32_t cpu_bf16_setup(int which, char *err, size_t err_cap) {
    (void)which;
    return cpu_bf16_load(err, err_cap);
}
const char *cpu_bf16_isa_name(void) { return "not loaded"; }
int cpu_bf16_uses_amx(void) { return 0; }
cpu_bf16_cache *cpu_bf16_cache_create(void) { return NULL; }
void cpu_bf16_cache_destroy(cpu_bf16_cache *c) { (void)c; }
size_t cpu_bf16_cache_size(const cpu_bf16_cache *c) {
    (void)c;
    return 0;
}
cpu_bf16_plan *cpu_bf16_plan_get(cpu_bf16_cache *c, const cpu_bf16_shape *s, char *err,
                                 size_t err_cap) {
    (void)c;
    (void)s;
    cpu_bf16_load(err, err_cap);
    return NULL;
}
size_t cpu_bf16_packed_bytes(const cpu_bf16_plan *p) {
    (void)p;
    return 0;
}
int cpu_bf16_packed_compatible(const cpu_bf16_plan *a, const cpu_bf16_plan *b) {
    (void)a;
    (void)b;
    return 0;
}
size_t cpu_bf16_scratch_bytes(const cpu_bf16_plan *p) {
    (void)p;
    return 0;
}
int32_t cpu_bf16_pack(cpu_bf16_cache *c, const cpu_bf16_plan *p, const float *B,
                      long b_rs, long b_cs, void *dst, char *err, size_t err_cap) {
    (void)c, (void)p, (void)B, (void)b_rs, (void)b_cs, (void)dst;
    return cpu_bf16_load(err, err_cap);
}
int32_t cpu_bf16_run(cpu_bf16_cache *c, const cpu_bf16_plan *p, const cpu_bf16_args *a,
                     char *err, size_t err_cap) {
    (void)c, (void)p, (void)a;
    return cpu_bf16_load(err, err_cap);
}

#else /* BF16_HAVE_DNNL_H */

#include <oneapi/dnnl/dnnl.h>

#define DNNL_LIB "libdnnl.so.2"

/* The functions used, as pointers of the header's types. */
#define DNNL_FUNCS(X)                          \
    X(dnnl_engine_create)                      \
    X(dnnl_stream_create)                      \
    X(dnnl_stream_destroy)                     \
    X(dnnl_stream_wait)                        \
    X(dnnl_memory_desc_init_by_strides)        \
    X(dnnl_memory_desc_init_by_tag)            \
    X(dnnl_memory_desc_get_size)               \
    X(dnnl_memory_desc_equal)                  \
    X(dnnl_memory_create)                      \
    X(dnnl_memory_destroy)                     \
    X(dnnl_matmul_desc_init)                   \
    X(dnnl_primitive_attr_create)              \
    X(dnnl_primitive_attr_destroy)             \
    X(dnnl_primitive_attr_set_scratchpad_mode) \
    X(dnnl_primitive_attr_set_post_ops)        \
    X(dnnl_post_ops_create)                    \
    X(dnnl_post_ops_destroy)                   \
    X(dnnl_post_ops_append_sum)                \
    X(dnnl_post_ops_append_binary)             \
    X(dnnl_primitive_desc_create)              \
    X(dnnl_primitive_desc_destroy)             \
    X(dnnl_primitive_desc_query_md)            \
    X(dnnl_primitive_create)                   \
    X(dnnl_primitive_destroy)                  \
    X(dnnl_primitive_execute)                  \
    X(dnnl_reorder_primitive_desc_create)      \
    X(dnnl_set_max_cpu_isa)                    \
    X(dnnl_get_effective_cpu_isa)

#define DECL_FN(name) __typeof__(name) *name;
static struct {
    pthread_mutex_t lock;
    int tried;
    int32_t status;
    char err[300];
    void *dl;
    int isa_cap; /* -1: none set by us */
    int primitives_made;
    dnnl_engine_t engine;
    void (*omp_set_num_threads)(int);
    struct {
        DNNL_FUNCS(DECL_FN)
    } f;
} g_dnnl = { .lock = PTHREAD_MUTEX_INITIALIZER, .isa_cap = -1 };
#undef DECL_FN
#define D(name) g_dnnl.f.name

static int32_t load_locked(void) {
    if (g_dnnl.tried) return g_dnnl.status;
    g_dnnl.tried = 1;
    g_dnnl.status = ORCH_ERR_UNSUPPORTED;
    /* oneDNN's OpenMP threads would spin for milliseconds after every
     * product (libgomp's default), taking a core from the engine's pool
     * that runs next: unless the user chose a policy, OpenMP threads sleep
     * at once (PASSIVE). libgomp reads this when it is loaded, i.e. now,
     * unless something in the process loaded it before. */
    int set_env = 0;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
        set_env = setenv("OMP_WAIT_POLICY", "PASSIVE", 1) == 0;
    void *dl = dlopen(DNNL_LIB, RTLD_NOW | RTLD_LOCAL);
    if (set_env) unsetenv("OMP_WAIT_POLICY");
    if (!dl) {
        const char *why = dlerror();
        snprintf(g_dnnl.err, sizeof g_dnnl.err,
                 "bf16 needs oneDNN (%s), which cannot be loaded: %s; install libdnnl2",
                 DNNL_LIB, why ? why : "unknown error");
        return g_dnnl.status;
    }
#define LOAD_FN(name)                                                             \
    if (!(g_dnnl.f.name = (__typeof__(name) *)dlsym(dl, #name))) {                \
        snprintf(g_dnnl.err, sizeof g_dnnl.err, "%s has no %s (need oneDNN 2.x)", \
                 DNNL_LIB, #name);                                                \
        dlclose(dl);                                                              \
        return g_dnnl.status;                                                     \
    }
    DNNL_FUNCS(LOAD_FN)
#undef LOAD_FN
    /* libgomp comes with libdnnl (its CPU runtime); threads per product are
     * set on the calling thread. */
    g_dnnl.omp_set_num_threads = (void (*)(int))dlsym(dl, "omp_set_num_threads");
    if (!g_dnnl.omp_set_num_threads) {
        snprintf(g_dnnl.err, sizeof g_dnnl.err,
                 "%s does not bring OpenMP (omp_set_num_threads); need the OpenMP build",
                 DNNL_LIB);
        dlclose(dl);
        return g_dnnl.status;
    }
    g_dnnl.dl = dl;
    g_dnnl.status = ORCH_OK;
    return ORCH_OK;
}

int32_t cpu_bf16_load(char *err, size_t err_cap) {
    pthread_mutex_lock(&g_dnnl.lock);
    int32_t st = load_locked();
    pthread_mutex_unlock(&g_dnnl.lock);
    if (st != ORCH_OK) SET_ERR(err, err_cap, "%s", g_dnnl.err);
    return st;
}

int32_t cpu_bf16_cap_isa(int which, char *err, size_t err_cap) {
    int32_t st = cpu_bf16_load(err, err_cap);
    if (st != ORCH_OK) return st;
    const char *word = which == CPU_BF16_ISA_AMX ? "amx" : "avx512";
    const dnnl_cpu_isa_t isa = which == CPU_BF16_ISA_AMX ? dnnl_cpu_isa_avx512_core_amx
                                                         : dnnl_cpu_isa_avx512_core_bf16;
    pthread_mutex_lock(&g_dnnl.lock);
    /* Setting first: querying the ISA fixes it inside oneDNN. */
    if (g_dnnl.isa_cap < 0 && !g_dnnl.primitives_made &&
        D(dnnl_set_max_cpu_isa)(isa) == dnnl_success)
        g_dnnl.isa_cap = which;
    const int ok = D(dnnl_get_effective_cpu_isa)() == isa;
    pthread_mutex_unlock(&g_dnnl.lock);
    if (!ok) {
        SET_ERR(err, err_cap,
                "bf16_isa=%s: oneDNN's ISA is fixed per process once it has run "
                "(here %s); use a separate process (or ONEDNN_MAX_CPU_ISA)",
                word, cpu_bf16_isa_name());
        return ORCH_ERR_UNSUPPORTED;
    }
    return ORCH_OK;
}

const char *cpu_bf16_isa_name(void) {
    if (!g_dnnl.dl) return "not loaded";
    switch ((int)D(dnnl_get_effective_cpu_isa)()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "other";
    }
}

int cpu_bf16_uses_amx(void) {
    return g_dnnl.dl && D(dnnl_get_effective_cpu_isa)() == dnnl_cpu_isa_avx512_core_amx;
}

int32_t cpu_bf16_setup(int which, char *err, size_t err_cap) {
    char why[300];
    if (cpu_bf16_load(why, sizeof why) != ORCH_OK) {
        SET_ERR(err, err_cap, "precision=bf16: %s", why);
        return ORCH_ERR_UNSUPPORTED;
    }
    if (which < 0) return ORCH_OK;
    const cpu_features *f = cpu_features_get();
    if (which == CPU_BF16_ISA_AMX ? !f->amx_bf16 : !f->avx512_bf16) {
        SET_ERR(err, err_cap, "bf16_isa=%s: this CPU (%s) lacks %s",
                which == CPU_BF16_ISA_AMX ? "amx" : "avx512", f->brand,
                which == CPU_BF16_ISA_AMX ? "AMX-BF16 (with OS tile permission)"
                                          : "AVX512_BF16");
        return ORCH_ERR_UNSUPPORTED;
    }
    return cpu_bf16_cap_isa(which, err, err_cap);
}

/* ------------------------------------------------------------------------- */
/* Plans                                                                      */
/* ------------------------------------------------------------------------- */

/* Plans are kept per shape in the cache (a list: a GPT-2 step uses 15
 * shapes). Measured here: making a matmul primitive takes 0.3-0.8 ms the
 * first time, ~0.01 ms again through oneDNN's own primitive cache (the
 * primitive descriptor is still made each time), a lookup in this cache
 * ~0.004 us; a GPT-2 124M step runs 147 products of 5-500 ms each, so the
 * cache saves ~1.5 ms per step: it is here for small products (short
 * prefill, tests) and to hold the scratch size and memory descriptors. */
struct cpu_bf16_plan {
    cpu_bf16_shape s;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md, scratch_md, bias_md, r_md;
    size_t scratch_bytes, packed_bytes;
    struct cpu_bf16_plan *next;
};

struct cpu_bf16_cache {
    dnnl_stream_t stream;
    cpu_bf16_plan *head;
    size_t count;
};

cpu_bf16_cache *cpu_bf16_cache_create(void) {
    if (cpu_bf16_load(NULL, 0) != ORCH_OK) return NULL;
    /* The engine is made on first use, not at load: making it may fix the
     * ISA, and cpu_bf16_cap_isa must come first. */
    pthread_mutex_lock(&g_dnnl.lock);
    if (!g_dnnl.engine &&
        D(dnnl_engine_create)(&g_dnnl.engine, dnnl_cpu, 0) != dnnl_success)
        g_dnnl.engine = NULL;
    pthread_mutex_unlock(&g_dnnl.lock);
    if (!g_dnnl.engine) return NULL;
    cpu_bf16_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (D(dnnl_stream_create)(&c->stream, g_dnnl.engine, dnnl_stream_default_flags) !=
        dnnl_success) {
        free(c);
        return NULL;
    }
    return c;
}

void cpu_bf16_cache_destroy(cpu_bf16_cache *c) {
    if (!c) return;
    for (cpu_bf16_plan *p = c->head, *n; p; p = n) {
        n = p->next;
        D(dnnl_primitive_destroy)(p->prim);
        D(dnnl_primitive_desc_destroy)(p->pd);
        free(p);
    }
    D(dnnl_stream_destroy)(c->stream);
    free(c);
}

size_t cpu_bf16_cache_size(const cpu_bf16_cache *c) { return c ? c->count : 0; }

static int shape_eq(const cpu_bf16_shape *a, const cpu_bf16_shape *b) {
    return a->M == b->M && a->N == b->N && a->K == b->K && a->a_rs == b->a_rs &&
           a->a_cs == b->a_cs && a->b_packed == b->b_packed &&
           (a->b_packed || (a->b_rs == b->b_rs && a->b_cs == b->b_cs)) &&
           a->ldc == b->ldc && a->accumulate == b->accumulate && a->bias == b->bias &&
           a->ldr == b->ldr && a->threads == b->threads;
}

static cpu_bf16_plan *plan_make(cpu_bf16_cache *c, const cpu_bf16_shape *s, char *err,
                                size_t err_cap) {
    cpu_bf16_plan *p = calloc(1, sizeof *p);
    if (!p) {
        SET_ERR(err, err_cap, "out of memory for a bf16 plan");
        return NULL;
    }
    (void)c;
    p->s = *s;
    dnnl_dims_t ad = { s->M, s->K }, as = { s->a_rs, s->a_cs };
    dnnl_dims_t bd = { s->K, s->N }, bs = { s->b_rs, s->b_cs };
    dnnl_dims_t cd = { s->M, s->N }, cs = { s->ldc, 1 };
    dnnl_status_t st =
        D(dnnl_memory_desc_init_by_strides)(&p->a_md, 2, ad, dnnl_bf16, as);
    if (st == dnnl_success)
        st = s->b_packed
                 ? D(dnnl_memory_desc_init_by_tag)(&p->b_md, 2, bd, dnnl_bf16,
                                                   dnnl_format_tag_any)
                 : D(dnnl_memory_desc_init_by_strides)(&p->b_md, 2, bd, dnnl_bf16, bs);
    if (st == dnnl_success)
        st = D(dnnl_memory_desc_init_by_strides)(&p->c_md, 2, cd, dnnl_f32, cs);
    dnnl_dims_t bias_d = { 1, s->N }, bias_s = { s->N, 1 }, rs = { s->ldr, 1 };
    if (st == dnnl_success && s->bias)
        st =
            D(dnnl_memory_desc_init_by_strides)(&p->bias_md, 2, bias_d, dnnl_f32, bias_s);
    if (st == dnnl_success && s->ldr > 0)
        st = D(dnnl_memory_desc_init_by_strides)(&p->r_md, 2, cd, dnnl_f32, rs);
    dnnl_matmul_desc_t md;
    if (st == dnnl_success)
        st = D(dnnl_matmul_desc_init)(&md, &p->a_md, &p->b_md,
                                      s->bias ? &p->bias_md : NULL, &p->c_md);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if (st == dnnl_success) st = D(dnnl_primitive_attr_create)(&attr);
    if (st == dnnl_success)
        st = D(dnnl_primitive_attr_set_scratchpad_mode)(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success && (s->accumulate || s->ldr > 0)) {
        st = D(dnnl_post_ops_create)(&po);
        if (st == dnnl_success && s->accumulate)
            st = D(dnnl_post_ops_append_sum)(po, 1.0f);
        if (st == dnnl_success && s->ldr > 0)
            st = D(dnnl_post_ops_append_binary)(po, dnnl_binary_add, &p->r_md);
        if (st == dnnl_success) st = D(dnnl_primitive_attr_set_post_ops)(attr, po);
    }
    if (st == dnnl_success) {
        g_dnnl.omp_set_num_threads(s->threads);
        st = D(dnnl_primitive_desc_create)(&p->pd, &md, attr, g_dnnl.engine, NULL);
    }
    if (po) D(dnnl_post_ops_destroy)(po);
    if (attr) D(dnnl_primitive_attr_destroy)(attr);
    if (st == dnnl_success) st = D(dnnl_primitive_create)(&p->prim, p->pd);
    if (st != dnnl_success) {
        SET_ERR(err, err_cap, "oneDNN bf16 matmul %dx%dx%d: no primitive (status %d)",
                s->M, s->K, s->N, (int)st);
        if (p->pd) D(dnnl_primitive_desc_destroy)(p->pd);
        free(p);
        return NULL;
    }
    pthread_mutex_lock(&g_dnnl.lock);
    g_dnnl.primitives_made = 1;
    pthread_mutex_unlock(&g_dnnl.lock);
    p->b_md = *D(dnnl_primitive_desc_query_md)(p->pd, dnnl_query_weights_md, 0);
    p->scratch_md = *D(dnnl_primitive_desc_query_md)(p->pd, dnnl_query_scratchpad_md, 0);
    p->scratch_bytes = D(dnnl_memory_desc_get_size)(&p->scratch_md);
    p->packed_bytes = s->b_packed ? D(dnnl_memory_desc_get_size)(&p->b_md) : 0;
    return p;
}

cpu_bf16_plan *cpu_bf16_plan_get(cpu_bf16_cache *c, const cpu_bf16_shape *s, char *err,
                                 size_t err_cap) {
    if (!c || s->M <= 0 || s->N <= 0 || s->K <= 0 || s->threads <= 0) {
        SET_ERR(err, err_cap, "bf16 plan: bad shape %dx%dx%d", s->M, s->K, s->N);
        return NULL;
    }
    for (cpu_bf16_plan *p = c->head; p; p = p->next)
        if (shape_eq(&p->s, s)) return p;
    cpu_bf16_plan *p = plan_make(c, s, err, err_cap);
    if (!p) return NULL;
    p->next = c->head;
    c->head = p;
    c->count++;
    return p;
}

size_t cpu_bf16_packed_bytes(const cpu_bf16_plan *p) { return p ? p->packed_bytes : 0; }

int cpu_bf16_packed_compatible(const cpu_bf16_plan *a, const cpu_bf16_plan *b) {
    return a && b && a->s.b_packed && b->s.b_packed &&
           D(dnnl_memory_desc_equal)(&a->b_md, &b->b_md);
}

size_t cpu_bf16_scratch_bytes(const cpu_bf16_plan *p) { return p ? p->scratch_bytes : 0; }

int32_t cpu_bf16_pack(cpu_bf16_cache *c, const cpu_bf16_plan *p, const float *B,
                      long b_rs, long b_cs, void *dst, char *err, size_t err_cap) {
    if (!p->s.b_packed) {
        SET_ERR(err, err_cap, "bf16 pack: the plan takes plain B");
        return ORCH_ERR_INTERNAL;
    }
    dnnl_memory_desc_t src_md;
    dnnl_dims_t bd = { p->s.K, p->s.N }, bs = { b_rs, b_cs };
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    g_dnnl.omp_set_num_threads(p->s.threads);
    dnnl_status_t st = D(dnnl_memory_desc_init_by_strides)(&src_md, 2, bd, dnnl_f32, bs);
    if (st == dnnl_success)
        st = D(dnnl_reorder_primitive_desc_create)(&rpd, &src_md, g_dnnl.engine, &p->b_md,
                                                   g_dnnl.engine, NULL);
    if (st == dnnl_success) st = D(dnnl_primitive_create)(&r, rpd);
    if (st == dnnl_success)
        st = D(dnnl_memory_create)(&ms, &src_md, g_dnnl.engine, (void *)(uintptr_t)B);
    if (st == dnnl_success) st = D(dnnl_memory_create)(&md, &p->b_md, g_dnnl.engine, dst);
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, ms }, { DNNL_ARG_TO, md } };
        st = D(dnnl_primitive_execute)(r, c->stream, 2, args);
        if (st == dnnl_success) st = D(dnnl_stream_wait)(c->stream);
    }
    if (ms) D(dnnl_memory_destroy)(ms);
    if (md) D(dnnl_memory_destroy)(md);
    if (r) D(dnnl_primitive_destroy)(r);
    if (rpd) D(dnnl_primitive_desc_destroy)(rpd);
    if (st != dnnl_success) {
        SET_ERR(err, err_cap, "oneDNN: packing bf16 weights %dx%d failed (status %d)",
                p->s.K, p->s.N, (int)st);
        return ORCH_ERR_INTERNAL;
    }
    return ORCH_OK;
}

int32_t cpu_bf16_run(cpu_bf16_cache *c, const cpu_bf16_plan *p, const cpu_bf16_args *a,
                     char *err, size_t err_cap) {
    enum { MAXM = 6 };
    dnnl_memory_t m[MAXM] = { NULL };
    dnnl_exec_arg_t args[MAXM];
    int n = 0;
    dnnl_status_t st = dnnl_success;
#define ARG(kind, md, ptr)                                      \
    if (st == dnnl_success) {                                   \
        st = D(dnnl_memory_create)(&m[n], &(md), g_dnnl.engine, \
                                   (void *)(uintptr_t)(ptr));   \
        args[n].arg = (kind);                                   \
        args[n].memory = m[n];                                  \
        n++;                                                    \
    }
    ARG(DNNL_ARG_SRC, p->a_md, a->A)
    ARG(DNNL_ARG_WEIGHTS, p->b_md, a->B)
    ARG(DNNL_ARG_DST, p->c_md, a->C)
    if (p->s.bias) ARG(DNNL_ARG_BIAS, p->bias_md, a->bias)
    if (p->s.ldr > 0)
        ARG(DNNL_ARG_ATTR_MULTIPLE_POST_OP(p->s.accumulate ? 1 : 0) | DNNL_ARG_SRC_1,
            p->r_md, a->R)
    if (p->scratch_bytes) ARG(DNNL_ARG_SCRATCHPAD, p->scratch_md, a->scratch)
#undef ARG
    if (st == dnnl_success) {
        g_dnnl.omp_set_num_threads(p->s.threads);
        st = D(dnnl_primitive_execute)(p->prim, c->stream, n, args);
        if (st == dnnl_success) st = D(dnnl_stream_wait)(c->stream);
    }
    for (int i = 0; i < MAXM; i++)
        if (m[i]) D(dnnl_memory_destroy)(m[i]);
    if (st != dnnl_success) {
        SET_ERR(err, err_cap, "oneDNN bf16 matmul %dx%dx%d failed (status %d)", p->s.M,
                p->s.K, p->s.N, (int)st);
        return ORCH_ERR_INTERNAL;
    }
    return ORCH_OK;
}

#endif /* BF16_HAVE_DNNL_H */
