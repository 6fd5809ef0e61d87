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
 * with opts->seed, tensors in table order, Box-Muller pairs, computed in
 * parallel (splitmix64 can jump). The CUDA engine draws the same numbers; the
 * mock engine seeds each tensor separately and differs.
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

static int key_is(const char *k, size_t klen, const char *name) {
    return strlen(name) == klen && memcmp(k, name, klen) == 0;
}

static int32_t parse_options(const char *s, cpu_options *o, char *err,
                             uint32_t cap) {
    if (!s) return ORCH_OK;
    engine_opt_item it;
    while (engine_opts_next(&s, &it)) {
        if (!it.has_eq)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                   "cpu options: '%.*s' is not key=value",
                                   (int)it.item_len, it.item);
        const char *start = it.key, *v = it.value;
        size_t klen = it.key_len, vlen = it.value_len;
        uint64_t num = 0;
        if (key_is(start, klen, "threads")) {
            if (engine_parse_u64(v, vlen, &num) || num > CPU_MAX_THREADS)
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
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
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                "cpu options: isa '%.*s' is not avx512, avx2 "
                                "or generic",
                                (int)vlen, v);
        } else if (key_is(start, klen, "skinny")) {
            if (engine_parse_u64(v, vlen, &num) || num > 1024)
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                "cpu options: skinny '%.*s' is not an integer "
                                "0..1024",
                                (int)vlen, v);
            o->skinny = num;
        } else if (key_is(start, klen, "max_batch_tokens")) {
            if (engine_parse_u64(v, vlen, &num) || num == 0 || num > (1u << 24))
                return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                                "cpu options: max_batch_tokens '%.*s' is not "
                                "an integer 1..%u",
                                (int)vlen, v, 1u << 24);
            o->max_batch_tokens = num;
        } else {
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
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
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model description struct_size %u is too small (need "
                        "at least %u)",
                        in->struct_size, need);
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    memcpy(&m, in, in->struct_size < sizeof m ? in->struct_size : sizeof m);
    m.struct_size = sizeof m;
    if (m.arch == ORCH_ARCH_LLAMA)
        return engine_fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                        "model arch %u (llama) is not supported by the cpu "
                        "engine yet (gpt2 only)",
                        m.arch);
    if (m.arch != ORCH_ARCH_GPT2)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
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
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                            "model %s must be > 0", dims[i].name);
        if (dims[i].v > CPU_MAX_DIM)
            return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                            "model %s %u exceeds the cpu engine's limit %u",
                            dims[i].name, dims[i].v, CPU_MAX_DIM);
    }
    if (m.layers > CPU_MAX_LAYERS)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model layers %u exceeds the limit %u", m.layers,
                        CPU_MAX_LAYERS);
    if (m.width % m.heads != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model heads (%u) must divide width (%u)", m.heads,
                        m.width);
    if (m.kv_heads != 0 && m.kv_heads != m.heads)
        return engine_fail_buf(err, cap, ORCH_ERR_UNSUPPORTED,
                        "model kv_heads %u differs from heads %u (grouped-query "
                        "attention is not supported for gpt2)",
                        m.kv_heads, m.heads);
    if (m.mlp_width == 0) m.mlp_width = 4u * m.width;
    if (m.mlp_width > CPU_MAX_DIM)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model mlp_width %u exceeds the cpu engine's limit %u",
                        m.mlp_width, CPU_MAX_DIM);
    if (!(m.layernorm_eps >= 0.0f) || isinf(m.layernorm_eps))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                        "model layernorm_eps must be a finite value >= 0");
    if (m.layernorm_eps == 0.0f) m.layernorm_eps = 1e-5f;
    m.kv_heads = m.heads;
    *out = m;
    return ORCH_OK;
}

_Static_assert(L_COUNT == ENGINE_GPT2_PER_LAYER, "L_* follow the common table");

static int32_t table_build(orch_engine_ctx *ctx) {
    uint32_t count = engine_gpt2_tensor_count(ctx->L);
    ctx->tensors = calloc(count, sizeof *ctx->tensors);
    ctx->pv.layer = calloc(ctx->L, sizeof *ctx->pv.layer);
    ctx->gv.layer = calloc(ctx->L, sizeof *ctx->gv.layer);
    if (!ctx->tensors || !ctx->pv.layer || !ctx->gv.layer)
        return ORCH_ERR_OUT_OF_MEMORY;
    ctx->n_params = engine_gpt2_table_fill(ctx->tensors, ctx->L, ctx->V, ctx->T,
                                           ctx->C, ctx->M);
    ctx->n_tensors = count;
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
/* Initialisation (same stream as the CUDA engine)                            */
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
    free(ctx->kv_marks);
    ctx->kv = NULL;
    ctx->kv_written = NULL;
    ctx->kv_marks = NULL;
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
    orch_engine_options o;
    int32_t st = engine_create_args(model, opts, out_ctx, &o, err, err_cap);
    if (st != ORCH_OK) return st;
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    st = model_normalise(model, &m, err, err_cap);
    if (st != ORCH_OK) return st;
    cpu_options co = {0, 0, cpu_kernels_isa(), 64, 16384};
    const int best_isa = co.isa;
    if ((st = parse_options(o.options, &co, err, err_cap)) != ORCH_OK) return st;
    if (co.isa > best_isa) co.isa = best_isa;
    uint64_t threads = co.has_threads ? co.threads : o.threads;
    if (threads > CPU_MAX_THREADS)
        return engine_fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                        "threads %llu exceeds the limit %u",
                        (unsigned long long)threads, CPU_MAX_THREADS);
    if (threads == 0) threads = (uint64_t)cpu_pool_available_cpus();
    if (threads > CPU_MAX_THREADS) threads = CPU_MAX_THREADS;

    uint64_t n_params;
    if (param_count(&m, &n_params) != 0 || n_params > SIZE_MAX / 16)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "model too large (parameter count overflows)");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0 &&
        n_params * sizeof(float) / (uint64_t)page > (uint64_t)pages)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "model needs %llu bytes for its %llu parameters, more "
                        "than this machine's %llu bytes of memory",
                        (unsigned long long)(n_params * sizeof(float)),
                        (unsigned long long)n_params,
                        (unsigned long long)pages * (unsigned long long)page);

    orch_engine_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
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
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot allocate the tensor table");
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)ctx->n_params * sizeof(float)) != 0) {
        cpu_context_destroy(ctx);
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
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
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot start %d worker threads", (int)threads);
    }
    int32_t ist = params_init(ctx, o.seed);
    cpu_pool_park(ctx->pool);
    if (ist != ORCH_OK) {
        cpu_context_destroy(ctx);
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
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
    return engine_check_kind_index(fn, kind, index, ctx->n_tensors,
                                   ctx->last_error, sizeof ctx->last_error);
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
    engine_tensor_info_fill(&ctx->tensors[index], out);
    return ORCH_OK;
}

static int32_t check_tensor_io(orch_engine_ctx *ctx, const char *fn,
                               uint32_t kind, uint32_t index, const void *buf,
                               uint64_t bytes) {
    int32_t st = check_kind_index(ctx, fn, kind, index);
    if (st) return st;
    return engine_check_tensor_bytes(fn, &ctx->tensors[index], buf, bytes,
                                     ctx->last_error, sizeof ctx->last_error);
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
    int32_t st = engine_check_batch_shape(fn, tokens, targets, batch, seq_len,
                                          ctx->T,
                                          ctx->last_error, sizeof ctx->last_error);
    if (st != ORCH_OK) return st;
    if ((uint64_t)batch * seq_len > (1u << 24))
        return cpu_fail(ctx, ORCH_ERR_CAPACITY,
                        "%s: batch %u x seq_len %u tokens exceeds the cpu "
                        "engine's limit of %u per call",
                        fn, batch, seq_len, 1u << 24);
    return engine_check_batch_ids(fn, tokens, targets, batch, seq_len, ctx->V,
                                  ctx->last_error, sizeof ctx->last_error);
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
    orch_adamw_params p;
    int32_t st = engine_check_adamw(params, &p, ctx->last_error,
                                    sizeof ctx->last_error);
    if (st != ORCH_OK) return st;
    float norm = 0.0f;
    st = cpu_train_optimizer_step(ctx, &p, &norm);
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
    engine_kv_mark *marks = calloc(num_blocks, sizeof *marks);
    if (!kv || !wr || !marks) {
        free(kv);
        free(wr);
        free(marks);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "kv_configure: cannot allocate %llu MiB for %u blocks "
                        "of %u positions",
                        (unsigned long long)(total >> 20), num_blocks,
                        block_size);
    }
    kv_free(ctx);
    ctx->kv = kv;
    ctx->kv_written = wr;
    ctx->kv_marks = marks;
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
    int32_t st = engine_kv_copy_check(src, dst, n, ctx->kv_marks, ctx->kv_num_blocks,
                                      &ctx->kv_epoch, ctx->last_error,
                                      sizeof ctx->last_error);
    if (st != ORCH_OK) return st;
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

static const orch_engine_api cpu_api = {
    .abi_major = ORCH_ENGINE_ABI_MAJOR,
    .abi_minor = ORCH_ENGINE_ABI_MINOR,
    .struct_size = sizeof(orch_engine_api),
    .name = "cpu",
    .version = CPU_VERSION,
    .capabilities = ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_KV_COPY |
                    ORCH_CAP_EVAL | ORCH_CAP_DETERMINISTIC,
    .probe = cpu_probe,
    .status_string = engine_status_string,
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
