/*
 * cpu_engine.c - the CPU engine's ABI table (libengine_cpu.so): context
 * lifecycle, engine options, parameter initialisation, tensor tables, flat
 * gradients, the KV pool, and argument validation for every call. The
 * numerics live in cpu_train.c, cpu_infer.c, cpu_linear.c and cpu_kernels.c.
 *
 * Capabilities: TRAIN | INFER | KV_COPY | EVAL | DETERMINISTIC (same inputs
 * and thread count give the same bits).
 *
 * Engine options (orch_engine_options.options, "key=value" separated by ','
 * or ';'; unknown keys are ORCH_ERR_INVALID_ARGUMENT):
 *   threads=N           worker threads (overrides the struct field; 0 = all
 *                       cores). OpenBLAS is kept single-threaded and every
 *                       product is split across these threads instead.
 *   isa=avx512|avx2|generic   use at most this instruction set (tests)
 *   skinny=N            products with at most N rows (decoding, short prefill
 *                       chunks) use the packed AVX-512/AVX2 kernel (default
 *                       64; 0 = OpenBLAS for every product). Measured here:
 *                       OpenBLAS reaches ~44% of the bandwidth for one row
 *                       and ~half the packed kernel's speed at 16-64 rows.
 *   max_batch_tokens=N  most new tokens one infer_forward takes (default
 *                       16384); more is ORCH_ERR_CAPACITY
 *
 * Initialisation (context_create): N(0, 0.02) for matrices and embeddings,
 * N(0, 0.02/sqrt(2*layers)) for attn.c_proj.weight and mlp.c_proj.weight,
 * zero biases, LayerNorm weights 1, drawn from one splitmix64 stream seeded
 * with opts->seed, tensors in table order, Box-Muller pairs - the same
 * numbers as the mock engine, computed in parallel (splitmix64 can jump).
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engines/cpu/cpu_internal.h"

#define CPU_VERSION "cpu 1.0"
#define CPU_MAX_THREADS 1024u
#define CPU_MAX_LAYERS 4096u
#define CPU_MAX_DIM (1u << 24)
#define CPU_PI 3.14159265358979323846

/* ------------------------------------------------------------------------- */
/* Errors                                                                     */
/* ------------------------------------------------------------------------- */

int32_t cpu_fail(orch_engine_ctx *ctx, int32_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
    va_end(ap);
    return status;
}

static int32_t fail_buf(char *err, uint32_t cap, int32_t status,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int32_t fail_buf(char *err, uint32_t cap, int32_t status,
                        const char *fmt, ...) {
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* Every context call starts here. last_error keeps the message of the
 * last FAILED call (the header's rule), so nothing is cleared. */
#define ENTER(ctx)                                                             \
    do {                                                                       \
        if (!(ctx)) return ORCH_ERR_INVALID_ARGUMENT;                          \
    } while (0)

/* ------------------------------------------------------------------------- */
/* Zeroed lazy memory for gradients and moments                               */
/* ------------------------------------------------------------------------- */

/* Large, page-aligned, zero-filled on first touch. NULL on failure. */
static float *zalloc(size_t floats) {
    size_t bytes = floats * sizeof(float);
    if (bytes == 0) bytes = sizeof(float);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void zfree(float *p, size_t floats) {
    if (!p) return;
    size_t bytes = floats * sizeof(float);
    munmap(p, bytes ? bytes : sizeof(float));
}

/* ------------------------------------------------------------------------- */
/* Options                                                                    */
/* ------------------------------------------------------------------------- */

typedef struct cpu_options {
    int has_threads;
    uint64_t threads;
    int isa;
    uint64_t skinny;
    uint64_t max_batch_tokens;
} cpu_options;

static int parse_u64(const char *s, size_t len, uint64_t *out) {
    if (len == 0 || len > 19) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int key_is(const char *k, size_t klen, const char *name) {
    return strlen(name) == klen && memcmp(k, name, klen) == 0;
}

static int32_t parse_options(const char *s, cpu_options *o, char *err,
                             uint32_t cap) {
    if (!s) return ORCH_OK;
    const char *p = s;
    while (*p) {
        while (*p && (*p == ',' || *p == ';' || is_space(*p))) p++;
        if (!*p) break;
        const char *start = p;
        while (*p && *p != ',' && *p != ';') p++;
        const char *end = p;
        while (end > start && is_space(end[-1])) end--;
        size_t len = (size_t)(end - start);
        const char *eq = memchr(start, '=', len);
        if (!eq)
            return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                            "cpu options: '%.*s' is not key=value", (int)len,
                            start);
        size_t klen = (size_t)(eq - start);
        while (klen > 0 && is_space(start[klen - 1])) klen--;
        const char *v = eq + 1;
        while (v < end && is_space(*v)) v++;
        size_t vlen = (size_t)(end - v);
        uint64_t num = 0;
        if (key_is(start, klen, "threads")) {
            if (parse_u64(v, vlen, &num) || num > CPU_MAX_THREADS)
                return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                "cpu options: threads '%.*s' is not an integer "
                                "0..%u",
                                (int)vlen, v, CPU_MAX_THREADS);
            o->has_threads = 1;
            o->threads = num;
        } else if (key_is(start, klen, "isa")) {
            if (key_is(v, vlen, "avx512")) o->isa = CPU_ISA_AVX512;
            else if (key_is(v, vlen, "avx2")) o->isa = CPU_ISA_AVX2;
            else if (key_is(v, vlen, "generic")) o->isa = CPU_ISA_GENERIC;
            else
                return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                "cpu options: isa '%.*s' is not avx512, avx2 "
                                "or generic",
                                (int)vlen, v);
        } else if (key_is(start, klen, "skinny")) {
            if (parse_u64(v, vlen, &num) || num > 1024)
                return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                "cpu options: skinny '%.*s' is not an integer "
                                "0..1024",
                                (int)vlen, v);
            o->skinny = num;
        } else if (key_is(start, klen, "max_batch_tokens")) {
            if (parse_u64(v, vlen, &num) || num == 0 || num > (1u << 24))
                return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                "cpu options: max_batch_tokens '%.*s' is not "
                                "an integer 1..%u",
                                (int)vlen, v, 1u << 24);
            o->max_batch_tokens = num;
        } else {
            return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                            "cpu options: unknown option '%.*s' (the cpu "
                            "engine knows threads, isa, skinny, "
                            "max_batch_tokens)",
                            (int)klen, start);
        }
    }
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Model description and tensor table                                         */
/* ------------------------------------------------------------------------- */

static int32_t model_normalise(const orch_model_desc *in, orch_model_desc *out,
                               char *err, uint32_t cap) {
    const uint32_t need =
        (uint32_t)(offsetof(orch_model_desc, width) + sizeof(uint32_t));
    if (in->struct_size < need)
        return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model description struct_size %u is too small (need "
                        "at least %u)",
                        in->struct_size, need);
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    memcpy(&m, in, in->struct_size < sizeof m ? in->struct_size : sizeof m);
    m.struct_size = sizeof m;
    if (m.arch == ORCH_ARCH_LLAMA)
        return fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                        "model arch %u (llama) is not supported by the cpu "
                        "engine yet (gpt2 only)",
                        m.arch);
    if (m.arch != ORCH_ARCH_GPT2)
        return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model arch %u is unknown (gpt2 is %u)", m.arch,
                        (unsigned)ORCH_ARCH_GPT2);
    const struct {
        const char *name;
        uint32_t v;
    } dims[] = {{"vocab_size", m.vocab_size}, {"context", m.context},
                {"layers", m.layers},         {"heads", m.heads},
                {"width", m.width},           {"mlp_width", m.mlp_width}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].v == 0 && strcmp(dims[i].name, "mlp_width") != 0)
            return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                            "model %s must be > 0", dims[i].name);
        if (dims[i].v > CPU_MAX_DIM)
            return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                            "model %s %u exceeds the cpu engine's limit %u",
                            dims[i].name, dims[i].v, CPU_MAX_DIM);
    }
    if (m.layers > CPU_MAX_LAYERS)
        return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model layers %u exceeds the limit %u", m.layers,
                        CPU_MAX_LAYERS);
    if (m.width % m.heads != 0)
        return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model heads (%u) must divide width (%u)", m.heads,
                        m.width);
    if (m.kv_heads != 0 && m.kv_heads != m.heads)
        return fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                        "model kv_heads %u differs from heads %u (grouped-query "
                        "attention is not supported for gpt2)",
                        m.kv_heads, m.heads);
    if (m.mlp_width == 0) m.mlp_width = 4u * m.width;
    if (m.mlp_width > CPU_MAX_DIM)
        return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model mlp_width %u exceeds the cpu engine's limit %u",
                        m.mlp_width, CPU_MAX_DIM);
    if (!(m.layernorm_eps >= 0.0f) || isinf(m.layernorm_eps))
        return fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model layernorm_eps must be a finite value >= 0");
    if (m.layernorm_eps == 0.0f) m.layernorm_eps = 1e-5f;
    m.kv_heads = m.heads;
    *out = m;
    return ORCH_OK;
}

static void tensor_add(orch_engine_ctx *ctx, uint64_t *offset, const char *name,
                       uint32_t ndim, uint64_t d0, uint64_t d1) {
    cpu_tensor *t = &ctx->tensors[ctx->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->numel = ndim > 1 ? d0 * d1 : d0;
    t->flags = ndim == 1 ? ORCH_TENSOR_FLAG_NO_DECAY : 0;
    t->offset = *offset;
    *offset += t->numel;
}

static int32_t table_build(orch_engine_ctx *ctx) {
    const uint64_t C = ctx->C, V = ctx->V, T = ctx->T, M = ctx->M;
    uint32_t count = 4u + L_COUNT * ctx->L;
    ctx->tensors = calloc(count, sizeof *ctx->tensors);
    ctx->pv.layer = calloc(ctx->L, sizeof *ctx->pv.layer);
    ctx->gv.layer = calloc(ctx->L, sizeof *ctx->gv.layer);
    if (!ctx->tensors || !ctx->pv.layer || !ctx->gv.layer)
        return ORCH_ERR_OUT_OF_MEMORY;
    uint64_t off = 0;
    char name[ORCH_TENSOR_NAME_MAX];
    tensor_add(ctx, &off, "wte.weight", 2, V, C);
    tensor_add(ctx, &off, "wpe.weight", 2, T, C);
    for (uint32_t i = 0; i < ctx->L; i++) {
        static const struct {
            const char *suffix;
            uint32_t ndim;
            int d0, d1; /* 1 = C, 3 = 3C, 4 = M */
        } spec[L_COUNT] = {
            {"ln_1.weight", 1, 1, 0},        {"ln_1.bias", 1, 1, 0},
            {"attn.c_attn.weight", 2, 3, 1}, {"attn.c_attn.bias", 1, 3, 0},
            {"attn.c_proj.weight", 2, 1, 1}, {"attn.c_proj.bias", 1, 1, 0},
            {"ln_2.weight", 1, 1, 0},        {"ln_2.bias", 1, 1, 0},
            {"mlp.c_fc.weight", 2, 4, 1},    {"mlp.c_fc.bias", 1, 4, 0},
            {"mlp.c_proj.weight", 2, 1, 4},  {"mlp.c_proj.bias", 1, 1, 0},
        };
        for (int k = 0; k < L_COUNT; k++) {
            uint64_t d[2];
            for (int a = 0; a < 2; a++) {
                int code = a == 0 ? spec[k].d0 : spec[k].d1;
                d[a] = code == 1 ? C : code == 3 ? 3 * C : code == 4 ? M : 0;
            }
            snprintf(name, sizeof name, "h.%u.%s", i, spec[k].suffix);
            tensor_add(ctx, &off, name, spec[k].ndim, d[0], d[1]);
        }
    }
    tensor_add(ctx, &off, "ln_f.weight", 1, C, 0);
    tensor_add(ctx, &off, "ln_f.bias", 1, C, 0);
    ctx->n_params = off;
    return ORCH_OK;
}

/* Views of a flat buffer laid out like the table. */
static void view_build(const orch_engine_ctx *ctx, float *base, cpu_view *v) {
    const cpu_tensor *t = ctx->tensors;
    v->wte = base + t[0].offset;
    v->wpe = base + t[1].offset;
    for (uint32_t i = 0; i < ctx->L; i++) {
        const cpu_tensor *lt = t + 2 + (size_t)i * L_COUNT;
        cpu_layer_view *l = &v->layer[i];
        l->ln1_w = base + lt[L_LN1_W].offset;
        l->ln1_b = base + lt[L_LN1_B].offset;
        l->qkv_w = base + lt[L_QKV_W].offset;
        l->qkv_b = base + lt[L_QKV_B].offset;
        l->ap_w = base + lt[L_AP_W].offset;
        l->ap_b = base + lt[L_AP_B].offset;
        l->ln2_w = base + lt[L_LN2_W].offset;
        l->ln2_b = base + lt[L_LN2_B].offset;
        l->fc_w = base + lt[L_FC_W].offset;
        l->fc_b = base + lt[L_FC_B].offset;
        l->mp_w = base + lt[L_MP_W].offset;
        l->mp_b = base + lt[L_MP_B].offset;
    }
    v->lnf_w = base + t[ctx->n_tensors - 2].offset;
    v->lnf_b = base + t[ctx->n_tensors - 1].offset;
}

/* Parameter count with overflow checks; -1 when it does not fit. */
static int param_count(const orch_model_desc *m, uint64_t *out) {
    /* Every dimension is <= 2^24 and layers <= 4096, so only the products
     * need care. */
    uint64_t C = m->width, V = m->vocab_size, T = m->context, M = m->mlp_width;
    uint64_t layer = 4 * C * C + 2 * M * C + 9 * C + M, total;
    if (__builtin_mul_overflow(layer, (uint64_t)m->layers, &total)) return -1;
    if (__builtin_add_overflow(total, V * C + T * C + 2 * C, &total)) return -1;
    *out = total;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Initialisation (same stream as the mock engine)                            */
/* ------------------------------------------------------------------------- */

static uint64_t splitmix_at(uint64_t seed, uint64_t k) {
    /* The k-th output (0-based) of a splitmix64 stream started at seed. */
    uint64_t z = seed + (k + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unit_of(uint64_t x) {
    return ((double)(x >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Chunks of the flat parameter buffer; a chunk may start or end inside a
 * Box-Muller pair (the pair is then computed by both chunks: same values). */
#define INIT_CHUNK ((size_t)1 << 16)

typedef struct init_job {
    orch_engine_ctx *ctx;
    uint64_t seed;
    uint64_t *stream_base; /* [n_tensors]: stream index of each tensor */
} init_job;

static void init_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const init_job *j = arg;
    orch_engine_ctx *ctx = j->ctx;
    const double resid_std = 0.02 / sqrt(2.0 * (double)ctx->L);
    const size_t lo = c * INIT_CHUNK;
    const size_t hi = lo + INIT_CHUNK < ctx->n_params ? lo + INIT_CHUNK : ctx->n_params;
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        const cpu_tensor *t = &ctx->tensors[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        float *p = ctx->params + t->offset;
        a -= t->offset; /* element range inside the tensor */
        b -= t->offset;
        if (t->ndim == 2) {
            const double std = ends_with(t->name, "attn.c_proj.weight") ||
                                       ends_with(t->name, "mlp.c_proj.weight")
                                   ? resid_std
                                   : 0.02;
            for (size_t q = a / 2; 2 * q < b; q++) {
                uint64_t k = j->stream_base[i] + 2 * (uint64_t)q;
                double r = sqrt(-2.0 * log(unit_of(splitmix_at(j->seed, k))));
                double th = 2.0 * CPU_PI * unit_of(splitmix_at(j->seed, k + 1));
                double sn, cs;
                sincos(th, &sn, &cs); /* glibc: the same values as sin, cos */
                if (2 * q >= a) p[2 * q] = (float)(std * r * cs);
                if (2 * q + 1 < b) p[2 * q + 1] = (float)(std * r * sn);
            }
        } else {
            float v = ends_with(t->name, ".weight") ? 1.0f : 0.0f;
            for (size_t q = a; q < b; q++) p[q] = v;
        }
    }
}

static int32_t params_init(orch_engine_ctx *ctx, uint64_t seed) {
    init_job j = {ctx, seed, calloc(ctx->n_tensors, sizeof(uint64_t))};
    if (!j.stream_base) return ORCH_ERR_OUT_OF_MEMORY;
    uint64_t k = 0;
    for (uint32_t i = 0; i < ctx->n_tensors; i++) {
        j.stream_base[i] = k;
        if (ctx->tensors[i].ndim == 2) k += 2 * ((ctx->tensors[i].numel + 1) / 2);
    }
    cpu_pool_for(ctx->pool, (ctx->n_params + INIT_CHUNK - 1) / INIT_CHUNK, init_chunk,
                 &j);
    free(j.stream_base);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Lifecycle                                                                  */
/* ------------------------------------------------------------------------- */

static void kv_free(orch_engine_ctx *ctx) {
    free(ctx->kv);
    free(ctx->kv_written);
    free(ctx->kv_mark_epoch);
    free(ctx->kv_mark_seq);
    free(ctx->kv_mark_lblock);
    ctx->kv = NULL;
    ctx->kv_written = NULL;
    ctx->kv_mark_epoch = ctx->kv_mark_seq = ctx->kv_mark_lblock = NULL;
    ctx->kv_block_size = ctx->kv_num_blocks = 0;
    ctx->kv_epoch = 0;
}

static void cpu_context_destroy(orch_engine_ctx *ctx) {
    if (!ctx) return;
    cpu_pool_destroy(ctx->pool);
    kv_free(ctx);
    cpu_train_free(ctx);
    cpu_infer_free(ctx);
    free(ctx->params);
    zfree(ctx->grads, ctx->n_params);
    zfree(ctx->adam_m, ctx->n_params);
    zfree(ctx->adam_v, ctx->n_params);
    free(ctx->tensors);
    free(ctx->pv.layer);
    free(ctx->gv.layer);
    free(ctx);
}

int32_t cpu_ensure_train_state(orch_engine_ctx *ctx) {
    if (ctx->grads && ctx->adam_m && ctx->adam_v) return ORCH_OK;
    const size_t n = ctx->n_params;
    if (!ctx->grads) ctx->grads = zalloc(n);
    if (!ctx->adam_m) ctx->adam_m = zalloc(n);
    if (!ctx->adam_v) ctx->adam_v = zalloc(n);
    if (!ctx->grads || !ctx->adam_m || !ctx->adam_v)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot allocate gradients and AdamW moments (%zu MiB "
                        "each)",
                        n * sizeof(float) >> 20);
    if (ctx->gv.wte == NULL) view_build(ctx, ctx->grads, &ctx->gv);
    return ORCH_OK;
}

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static int32_t cpu_context_create(const orch_model_desc *model,
                                  const orch_engine_options *opts,
                                  orch_engine_ctx **out_ctx, char *err,
                                  uint32_t err_cap) {
    if (err && err_cap) err[0] = '\0';
    if (!model || !out_ctx)
        return fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                        "context_create: %s is NULL",
                        !model ? "model" : "out_ctx");
    orch_engine_options o;
    memset(&o, 0, sizeof o);
    if (opts) {
        if (opts->struct_size < sizeof(uint32_t))
            return fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                            "engine options struct_size %u is too small",
                            opts->struct_size);
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    }
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    int32_t st = model_normalise(model, &m, err, err_cap);
    if (st != ORCH_OK) return st;
    cpu_options co = {0, 0, cpu_kernels_isa(), 64, 16384};
    const int best_isa = co.isa;
    if ((st = parse_options(o.options, &co, err, err_cap)) != ORCH_OK) return st;
    if (co.isa > best_isa) co.isa = best_isa;
    uint64_t threads = co.has_threads ? co.threads : o.threads;
    if (threads > CPU_MAX_THREADS)
        return fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                        "threads %llu exceeds the limit %u",
                        (unsigned long long)threads, CPU_MAX_THREADS);
    if (threads == 0) threads = (uint64_t)cpu_pool_available_cpus();
    if (threads > CPU_MAX_THREADS) threads = CPU_MAX_THREADS;

    uint64_t n_params;
    if (param_count(&m, &n_params) != 0 || n_params > SIZE_MAX / 16)
        return fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "model too large (parameter count overflows)");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0 &&
        n_params * sizeof(float) / (uint64_t)page > (uint64_t)pages)
        return fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "model needs %llu bytes for its %llu parameters, more "
                        "than this machine's %llu bytes of memory",
                        (unsigned long long)(n_params * sizeof(float)),
                        (unsigned long long)n_params,
                        (unsigned long long)pages * (unsigned long long)page);

    orch_engine_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot allocate a context");
    ctx->V = m.vocab_size;
    ctx->T = m.context;
    ctx->L = m.layers;
    ctx->NH = m.heads;
    ctx->C = m.width;
    ctx->M = m.mlp_width;
    ctx->HS = m.width / m.heads;
    ctx->eps = m.layernorm_eps;
    ctx->isa = co.isa;
    ctx->threads = (int)threads;
    ctx->skinny_max = (uint32_t)co.skinny;
    ctx->max_batch_tokens = (uint32_t)co.max_batch_tokens;
    if (table_build(ctx) != ORCH_OK) {
        cpu_context_destroy(ctx);
        return fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot allocate the tensor table");
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)ctx->n_params * sizeof(float)) != 0) {
        cpu_context_destroy(ctx);
        return fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot allocate %llu MiB for %llu parameters",
                        (unsigned long long)(ctx->n_params * 4 >> 20),
                        (unsigned long long)ctx->n_params);
    }
    ctx->params = p;
    view_build(ctx, ctx->params, &ctx->pv);
    pthread_once(&blas_once, cpu_blas_init);
    ctx->pool = cpu_pool_create(ctx->threads);
    if (!ctx->pool) {
        cpu_context_destroy(ctx);
        return fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot start %d worker threads", (int)threads);
    }
    int32_t ist = params_init(ctx, o.seed);
    cpu_pool_park(ctx->pool);
    if (ist != ORCH_OK) {
        cpu_context_destroy(ctx);
        return fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "out of memory initialising parameters");
    }
    *out_ctx = ctx;
    return ORCH_OK;
}

static const char *cpu_last_error(const orch_engine_ctx *ctx) {
    return ctx ? ctx->last_error : "context is NULL";
}

/* ------------------------------------------------------------------------- */
/* Tensor tables                                                              */
/* ------------------------------------------------------------------------- */

static int32_t check_kind_index(orch_engine_ctx *ctx, const char *fn,
                                uint32_t kind, uint32_t index) {
    if (kind > ORCH_TENSOR_ADAM_V)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "%s: tensor kind %u is unknown (0 param, 1 adam_m, 2 "
                        "adam_v)",
                        fn, kind);
    if (index >= ctx->n_tensors)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "%s: tensor index %u out of range (table has %u)", fn,
                        index, ctx->n_tensors);
    return ORCH_OK;
}

static int32_t cpu_tensor_count(orch_engine_ctx *ctx, uint32_t kind,
                                uint32_t *out_count) {
    ENTER(ctx);
    if (!out_count)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "tensor_count: out_count is NULL");
    if (kind > ORCH_TENSOR_ADAM_V)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "tensor_count: tensor kind %u is unknown", kind);
    *out_count = ctx->n_tensors;
    return ORCH_OK;
}

static int32_t cpu_tensor_info(orch_engine_ctx *ctx, uint32_t kind,
                               uint32_t index, orch_tensor_info *out) {
    ENTER(ctx);
    if (!out)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "tensor_info: out is NULL");
    if (out->struct_size < sizeof(uint32_t))
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "tensor_info: out->struct_size %u is too small",
                        out->struct_size);
    int32_t st = check_kind_index(ctx, "tensor_info", kind, index);
    if (st) return st;
    const cpu_tensor *t = &ctx->tensors[index];
    orch_tensor_info info;
    memset(&info, 0, sizeof info);
    size_t n = out->struct_size < sizeof info ? out->struct_size : sizeof info;
    info.struct_size = (uint32_t)n;
    info.dtype = ORCH_DTYPE_F32;
    info.ndim = t->ndim;
    info.flags = t->flags;
    info.shape[0] = t->shape[0];
    info.shape[1] = t->shape[1];
    info.numel = t->numel;
    info.offset = t->offset;
    memcpy(info.name, t->name, sizeof info.name);
    memcpy(out, &info, n);
    return ORCH_OK;
}

static int32_t check_tensor_io(orch_engine_ctx *ctx, const char *fn,
                               uint32_t kind, uint32_t index, const void *buf,
                               uint64_t bytes) {
    int32_t st = check_kind_index(ctx, fn, kind, index);
    if (st) return st;
    const cpu_tensor *t = &ctx->tensors[index];
    if (!buf)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", fn);
    if (bytes != t->numel * sizeof(float))
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "%s: tensor %s needs %llu bytes (%llu f32), got %llu",
                        fn, t->name,
                        (unsigned long long)(t->numel * sizeof(float)),
                        (unsigned long long)t->numel, (unsigned long long)bytes);
    return ORCH_OK;
}

static float *kind_buffer(orch_engine_ctx *ctx, uint32_t kind) {
    return kind == ORCH_TENSOR_PARAM    ? ctx->params
           : kind == ORCH_TENSOR_ADAM_M ? ctx->adam_m
                                        : ctx->adam_v;
}

static int32_t cpu_tensor_read(orch_engine_ctx *ctx, uint32_t kind,
                               uint32_t index, void *dst, uint64_t dst_bytes) {
    ENTER(ctx);
    int32_t st = check_tensor_io(ctx, "tensor_read", kind, index, dst, dst_bytes);
    if (st) return st;
    const float *src = kind_buffer(ctx, kind);
    if (src)
        memcpy(dst, src + ctx->tensors[index].offset, (size_t)dst_bytes);
    else /* moments not allocated yet: all zero */
        memset(dst, 0, (size_t)dst_bytes);
    return ORCH_OK;
}

static int32_t cpu_tensor_write(orch_engine_ctx *ctx, uint32_t kind,
                                uint32_t index, const void *src,
                                uint64_t src_bytes) {
    ENTER(ctx);
    int32_t st = check_tensor_io(ctx, "tensor_write", kind, index, src, src_bytes);
    if (st) return st;
    if (kind != ORCH_TENSOR_PARAM && (st = cpu_ensure_train_state(ctx)) != ORCH_OK)
        return st;
    memcpy(kind_buffer(ctx, kind) + ctx->tensors[index].offset, src,
           (size_t)src_bytes);
    if (kind == ORCH_TENSOR_PARAM) ctx->packed_valid = 0;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Gradients                                                                  */
/* ------------------------------------------------------------------------- */

#define ZERO_CHUNK ((size_t)1 << 20)

typedef struct zero_job {
    float *buf;
    size_t n;
} zero_job;

static void zero_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const zero_job *j = arg;
    size_t a = c * ZERO_CHUNK, b = a + ZERO_CHUNK < j->n ? a + ZERO_CHUNK : j->n;
    memset(j->buf + a, 0, (b - a) * sizeof(float));
}

static int32_t cpu_grads_zero(orch_engine_ctx *ctx) {
    ENTER(ctx);
    if (!ctx->grads) return ORCH_OK; /* never touched: already zero */
    zero_job j = {ctx->grads, ctx->n_params};
    cpu_pool_for(ctx->pool, (j.n + ZERO_CHUNK - 1) / ZERO_CHUNK, zero_chunk, &j);
    cpu_pool_park(ctx->pool);
    return ORCH_OK;
}

static int32_t check_range(orch_engine_ctx *ctx, const char *fn,
                           uint64_t offset, uint64_t count, const void *buf) {
    if (offset > ctx->n_params || count > ctx->n_params - offset)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "%s: range [%llu, %llu+%llu) exceeds the %llu gradient "
                        "elements",
                        fn, (unsigned long long)offset,
                        (unsigned long long)offset, (unsigned long long)count,
                        (unsigned long long)ctx->n_params);
    if (count > 0 && !buf)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", fn);
    return ORCH_OK;
}

static int32_t cpu_grads_read(orch_engine_ctx *ctx, uint64_t offset,
                              uint64_t count, float *dst) {
    ENTER(ctx);
    int32_t st = check_range(ctx, "grads_read", offset, count, dst);
    if (st) return st;
    if (!count) return ORCH_OK;
    if (ctx->grads)
        memcpy(dst, ctx->grads + offset, (size_t)count * sizeof(float));
    else
        memset(dst, 0, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t cpu_grads_write(orch_engine_ctx *ctx, uint64_t offset,
                               uint64_t count, const float *src) {
    ENTER(ctx);
    int32_t st = check_range(ctx, "grads_write", offset, count, src);
    if (st) return st;
    if (!count) return ORCH_OK;
    if ((st = cpu_ensure_train_state(ctx)) != ORCH_OK) return st;
    memcpy(ctx->grads + offset, src, (size_t)count * sizeof(float));
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Training and evaluation                                                    */
/* ------------------------------------------------------------------------- */

static int32_t check_batch(orch_engine_ctx *ctx, const char *fn,
                           const int32_t *tokens, const int32_t *targets,
                           uint32_t batch, uint32_t seq_len) {
    if (!tokens || !targets)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        !tokens ? "tokens" : "targets");
    if (batch == 0 || seq_len == 0)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "%s: batch (%u) and seq_len (%u) must be > 0", fn,
                        batch, seq_len);
    if (seq_len > ctx->T)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "%s: seq_len %u exceeds the model context %u", fn,
                        seq_len, ctx->T);
    if ((uint64_t)batch * seq_len > (1u << 24))
        return cpu_fail(ctx, ORCH_ERR_CAPACITY,
                        "%s: batch %u x seq_len %u tokens exceeds the cpu "
                        "engine's limit of %u per call",
                        fn, batch, seq_len, 1u << 24);
    const uint64_t n = (uint64_t)batch * seq_len;
    const int32_t V = (int32_t)ctx->V;
    for (uint64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                            "%s: token %d at [%llu,%llu] outside 0..%d", fn,
                            tokens[i], (unsigned long long)(i / seq_len),
                            (unsigned long long)(i % seq_len), V - 1);
        if (targets[i] < -1 || targets[i] >= V)
            return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                            "%s: target %d at [%llu,%llu] outside -1..%d", fn,
                            targets[i], (unsigned long long)(i / seq_len),
                            (unsigned long long)(i % seq_len), V - 1);
    }
    return ORCH_OK;
}

static int32_t cpu_forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                    const int32_t *targets, uint32_t batch,
                                    uint32_t seq_len, float grad_scale,
                                    float *out_loss) {
    ENTER(ctx);
    if (!out_loss)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "forward_backward: out_loss is NULL");
    if (!isfinite(grad_scale))
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "forward_backward: grad_scale is not finite");
    int32_t st = check_batch(ctx, "forward_backward", tokens, targets, batch,
                             seq_len);
    if (st) return st;
    float loss = 0.0f;
    st = cpu_train_forward_backward(ctx, tokens, targets, batch, seq_len,
                                    grad_scale, 1, &loss);
    cpu_pool_park(ctx->pool);
    if (st == ORCH_OK) *out_loss = loss;
    return st;
}

static int32_t cpu_eval_loss(orch_engine_ctx *ctx, const int32_t *tokens,
                             const int32_t *targets, uint32_t batch,
                             uint32_t seq_len, float *out_loss) {
    ENTER(ctx);
    if (!out_loss)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "eval_loss: out_loss is NULL");
    int32_t st = check_batch(ctx, "eval_loss", tokens, targets, batch, seq_len);
    if (st) return st;
    float loss = 0.0f;
    st = cpu_train_forward_backward(ctx, tokens, targets, batch, seq_len, 0.0f,
                                    0, &loss);
    cpu_pool_park(ctx->pool);
    if (st == ORCH_OK) *out_loss = loss;
    return st;
}

static int32_t cpu_optimizer_step(orch_engine_ctx *ctx,
                                  const orch_adamw_params *params,
                                  float *out_grad_norm) {
    ENTER(ctx);
    if (!params)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "optimizer_step: params is NULL");
    if (params->struct_size < sizeof(orch_adamw_params))
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "optimizer_step: params struct_size %u is smaller than "
                        "ABI 1.0's %zu",
                        params->struct_size, sizeof(orch_adamw_params));
    const orch_adamw_params p = *params;
    if (p.step == 0)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "optimizer_step: step must be >= 1 (it is 1-based)");
    if (!(p.lr >= 0.0f) || isinf(p.lr) || !(p.beta1 >= 0.0f && p.beta1 < 1.0f) ||
        !(p.beta2 >= 0.0f && p.beta2 < 1.0f) || !(p.eps > 0.0f) ||
        isinf(p.eps) || !(p.weight_decay >= 0.0f) || isinf(p.weight_decay) ||
        !isfinite(p.grad_clip))
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "optimizer_step: bad hyper-parameters (need finite lr "
                        ">= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= "
                        "0, finite grad_clip): lr=%g beta1=%g beta2=%g eps=%g "
                        "wd=%g clip=%g",
                        (double)p.lr, (double)p.beta1, (double)p.beta2,
                        (double)p.eps, (double)p.weight_decay,
                        (double)p.grad_clip);
    float norm = 0.0f;
    int32_t st = cpu_train_optimizer_step(ctx, &p, &norm);
    cpu_pool_park(ctx->pool);
    if (st == ORCH_OK && out_grad_norm) *out_grad_norm = norm;
    return st;
}

/* ------------------------------------------------------------------------- */
/* KV pool                                                                    */
/* ------------------------------------------------------------------------- */

/* K/V floats plus the written flags of one block. */
static int block_bytes(const orch_engine_ctx *ctx, uint32_t block_size,
                       uint64_t *out) {
    uint64_t floats;
    if (__builtin_mul_overflow((uint64_t)ctx->L * 2u * ctx->C,
                               (uint64_t)block_size, &floats) ||
        floats > UINT64_MAX / 8)
        return -1;
    *out = floats * sizeof(float) + block_size + 3 * sizeof(uint32_t);
    return 0;
}

static int32_t cpu_kv_block_bytes(orch_engine_ctx *ctx, uint32_t block_size,
                                  uint64_t *out_bytes) {
    ENTER(ctx);
    if (!out_bytes)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "kv_block_bytes: out_bytes is NULL");
    if (block_size == 0)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "kv_block_bytes: block_size is 0");
    uint64_t b;
    if (block_bytes(ctx, block_size, &b) != 0)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "kv_block_bytes: block_size %u is too large",
                        block_size);
    *out_bytes = b;
    return ORCH_OK;
}

static int32_t cpu_kv_configure(orch_engine_ctx *ctx, uint32_t block_size,
                                uint32_t num_blocks) {
    ENTER(ctx);
    if (block_size == 0 || num_blocks == 0)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "kv_configure: block_size (%u) and num_blocks (%u) "
                        "must be > 0",
                        block_size, num_blocks);
    if (num_blocks > (uint32_t)INT32_MAX)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "kv_configure: num_blocks %u exceeds int32 block ids",
                        num_blocks);
    uint64_t per, total, slots = (uint64_t)block_size * num_blocks;
    if (block_bytes(ctx, block_size, &per) != 0 ||
        __builtin_mul_overflow(per, (uint64_t)num_blocks, &total) ||
        total > SIZE_MAX / 2)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "kv_configure: pool of %u blocks of %u positions is "
                        "too large",
                        num_blocks, block_size);
    size_t floats = (size_t)slots * ctx->L * 2u * ctx->C;
    float *kv = NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, floats * sizeof(float)) == 0) kv = p;
    uint8_t *wr = calloc((size_t)slots, 1);
    uint32_t *me = calloc(num_blocks, sizeof(uint32_t));
    uint32_t *ms = calloc(num_blocks, sizeof(uint32_t));
    uint32_t *ml = calloc(num_blocks, sizeof(uint32_t));
    if (!kv || !wr || !me || !ms || !ml) {
        free(kv);
        free(wr);
        free(me);
        free(ms);
        free(ml);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "kv_configure: cannot allocate %llu MiB for %u blocks "
                        "of %u positions",
                        (unsigned long long)(total >> 20), num_blocks,
                        block_size);
    }
    kv_free(ctx);
    ctx->kv = kv;
    ctx->kv_written = wr;
    ctx->kv_mark_epoch = me;
    ctx->kv_mark_seq = ms;
    ctx->kv_mark_lblock = ml;
    ctx->kv_block_size = block_size;
    ctx->kv_num_blocks = num_blocks;
    return ORCH_OK;
}

typedef struct copy_job {
    orch_engine_ctx *ctx;
    const int32_t *src, *dst;
    uint32_t n;
} copy_job;

static void copy_chunk(void *arg, size_t i, int tid) {
    (void)tid;
    const copy_job *j = arg;
    const orch_engine_ctx *ctx = j->ctx;
    const size_t block_floats = (size_t)ctx->L * 2 * ctx->kv_block_size * ctx->C;
    {
        memcpy(ctx->kv + (size_t)j->dst[i] * block_floats,
               ctx->kv + (size_t)j->src[i] * block_floats,
               block_floats * sizeof(float));
        memcpy(ctx->kv_written + (size_t)j->dst[i] * ctx->kv_block_size,
               ctx->kv_written + (size_t)j->src[i] * ctx->kv_block_size,
               ctx->kv_block_size);
    }
}

static int32_t cpu_kv_copy_blocks(orch_engine_ctx *ctx, const int32_t *src,
                                  const int32_t *dst, uint32_t n) {
    ENTER(ctx);
    if (!ctx->kv)
        return cpu_fail(ctx, ORCH_ERR_STATE,
                        "kv_copy_blocks: no KV pool (call kv_configure first)");
    if (n == 0) return ORCH_OK;
    if (!src || !dst)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "kv_copy_blocks: %s is NULL", !src ? "src" : "dst");
    for (uint32_t i = 0; i < n; i++)
        if (src[i] < 0 || (uint32_t)src[i] >= ctx->kv_num_blocks ||
            dst[i] < 0 || (uint32_t)dst[i] >= ctx->kv_num_blocks)
            return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                            "kv_copy_blocks: pair %u (%d -> %d) names a block "
                            "outside the pool of %u blocks",
                            i, src[i], dst[i], ctx->kv_num_blocks);
    /* Sources and destinations must be disjoint; no destination twice. */
    if (++ctx->kv_epoch == 0) {
        memset(ctx->kv_mark_epoch, 0, ctx->kv_num_blocks * sizeof(uint32_t));
        ctx->kv_epoch = 1;
    }
    const uint32_t ep = ctx->kv_epoch;
    for (uint32_t i = 0; i < n; i++) {
        ctx->kv_mark_epoch[src[i]] = ep;
        ctx->kv_mark_seq[src[i]] = 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)dst[i];
        if (ctx->kv_mark_epoch[b] == ep)
            return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                            "kv_copy_blocks: block %d is %s", dst[i],
                            ctx->kv_mark_seq[b] == 0
                                ? "both a source and a destination"
                                : "a destination twice");
        ctx->kv_mark_epoch[b] = ep;
        ctx->kv_mark_seq[b] = 1;
    }
    copy_job j = {ctx, src, dst, n};
    cpu_pool_for(ctx->pool, n, copy_chunk, &j);
    cpu_pool_park(ctx->pool);
    return ORCH_OK;
}

static int32_t cpu_infer_forward_abi(orch_engine_ctx *ctx,
                                     const orch_infer_batch *batch,
                                     float *logits, uint64_t logits_cap) {
    ENTER(ctx);
    int32_t st = cpu_infer_forward(ctx, batch, logits, logits_cap);
    cpu_pool_park(ctx->pool);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Probe, status strings, the table                                           */
/* ------------------------------------------------------------------------- */

static int32_t cpu_probe(char *msg, uint32_t msg_cap) {
    if (msg && msg_cap)
        snprintf(msg, msg_cap, "%d cores, %s kernels, OpenBLAS sgemm",
                 cpu_pool_available_cpus(),
                 cpu_kernels_isa_name(cpu_kernels_isa()));
    return ORCH_OK;
}

static const char *cpu_status_string(int32_t status) {
    switch (status) {
    case ORCH_OK: return "ok";
    case ORCH_ERR_INVALID_ARGUMENT: return "invalid argument";
    case ORCH_ERR_OUT_OF_MEMORY: return "out of memory";
    case ORCH_ERR_UNSUPPORTED: return "unsupported";
    case ORCH_ERR_STATE: return "call out of order";
    case ORCH_ERR_CAPACITY: return "capacity exceeded";
    case ORCH_ERR_DEVICE: return "device error";
    case ORCH_ERR_NUMERIC: return "non-finite value";
    case ORCH_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}

static const orch_engine_api cpu_api = {
    .abi_major = ORCH_ENGINE_ABI_MAJOR,
    .abi_minor = ORCH_ENGINE_ABI_MINOR,
    .struct_size = sizeof(orch_engine_api),
    .name = "cpu",
    .version = CPU_VERSION,
    .capabilities = ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_KV_COPY |
                    ORCH_CAP_EVAL | ORCH_CAP_DETERMINISTIC,
    .probe = cpu_probe,
    .status_string = cpu_status_string,
    .context_create = cpu_context_create,
    .context_destroy = cpu_context_destroy,
    .last_error = cpu_last_error,
    .tensor_count = cpu_tensor_count,
    .tensor_info = cpu_tensor_info,
    .tensor_read = cpu_tensor_read,
    .tensor_write = cpu_tensor_write,
    .grads_zero = cpu_grads_zero,
    .grads_read = cpu_grads_read,
    .grads_write = cpu_grads_write,
    .forward_backward = cpu_forward_backward,
    .optimizer_step = cpu_optimizer_step,
    .eval_loss = cpu_eval_loss,
    .kv_block_bytes = cpu_kv_block_bytes,
    .kv_configure = cpu_kv_configure,
    .infer_forward = cpu_infer_forward_abi,
    .kv_copy_blocks = cpu_kv_copy_blocks,
};

ORCH_ENGINE_EXPORT const orch_engine_api *orch_engine_get_api(uint32_t abi_major);

/* Returns the table for any abi_major: its frozen fields name our version. */
const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    return &cpu_api;
}
