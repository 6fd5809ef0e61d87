/*
 * cpu_engine.c - the CPU engine's ABI table (libengine_cpu.so): context
 * lifecycle, engine options, parameter initialisation, tensor tables, flat
 * gradients, the KV pool, and argument validation for every call. The
 * numerics live in cpu_train.c, cpu_infer.c (GPT-2), cpu_llama.c,
 * cpu_llama_infer.c (ORCH_ARCH_LLAMA), cpu_linear.c and cpu_kernels.c.
 *
 * Architectures: gpt2 and llama (ABI 1.1; tensor table, init rule and RoPE
 * frequencies from engines/common). Both train (fp32 or precision=bf16),
 * evaluate and serve from the paged KV pool, whose blocks hold K and V of
 * kv_heads * head size floats per position and layer. weights=int8 serves
 * both (llama: every 2-D tensor, embedding and head included, is int8).
 *
 * Capabilities: TRAIN | INFER | KV_COPY | EVAL | DETERMINISTIC (same inputs
 * and thread count give the same bits) | LORA (ABI 1.4 adapters, cpu_lora.c:
 * adapter training with the base frozen, adapter_id in infer_forward) |
 * COSERVE (coserve_forward, cpu_coserve.c) | FT_STREAM (ABI 1.5 token-level
 * fine-tuning streams: ft_stream_open/close, coserve_step, cpu_ft_stream.c).
 *
 * Engine options (orch_engine_options.options, "key=value" separated by ','
 * or ';'; unknown keys are ORCH_ERR_INVALID_ARGUMENT):
 *   threads=N           worker threads (overrides the struct field; 0 = all
 *                       cores). OpenBLAS is kept single-threaded and every
 *                       product is split across these threads instead.
 *                       OpenBLAS itself is loaded at run time (cpu_blas.c)
 *                       with OPENBLAS_CORETYPE chosen from cpuid unless the
 *                       user set it, so a CPU missing from OpenBLAS's model
 *                       table still gets its AVX-512/AVX2 kernels.
 *   isa=avx512|avx2|generic   use at most this instruction set (tests)
 *   skinny=N            products with at most N rows (decoding, short prefill
 *                       chunks) use the packed AVX-512/AVX2 kernel (default
 *                       64; 0 = OpenBLAS for every product). Measured here:
 *                       OpenBLAS reaches ~44% of the bandwidth for one row
 *                       and ~half the packed kernel's speed at 16-64 rows.
 *   weights=fp32|int8   weights=int8 (inference only; training refused):
 *                       tensor_write rounds every weight matrix (wte = LM
 *                       head, qkv, attn/mlp proj, fc; not wpe, biases,
 *                       LayerNorm; llama: every 2-D tensor) through int8 blocks of 32 along K with one
 *                       fp32 scale each (Q8_0-like), tensor_read returns those
 *                       values and checkpoints stay fp32. Products of at most
 *                       skinny rows run on int8 kernels (cpu_quant.c); memory
 *                       is NOT saved: the fp32 parameters stay resident (prefill
 *                       and eval_loss use them) and the int8 copy (1.125 bytes
 *                       a weight) comes on top, in place of the fp32 packed one.
 *   int8_kernel=auto|amx|avx512vnni|avxvnni|avx2|generic   int8 kernel (auto:
 *                       the first the CPU and isa= allow; amx runs AMX-INT8
 *                       from CPU_Q8_AMX_MIN_ROWS (4) rows, AVX512-VNNI below;
 *                       one the CPU or isa= lacks is refused, so is the option
 *                       without weights=int8; all give the same bits)
 *   kv=auto|f32|bf16|int8  storage of the KV cache (cpu_kvq.c): bf16
 *                       halves its bytes (K and V rounded to nearest even
 *                       once when stored; attention widens them back exactly
 *                       and computes in fp32); int8 stores each head vector
 *                       as int8 with one fp32 scale (max|x|/127, round to
 *                       nearest: error <= scale/2 a value; head size + 4
 *                       bytes), widened to fp32 in registers by attention;
 *                       kv_block_bytes reports the real size. auto (default):
 *                       bf16 with weights=int8 (the serving format, whose
 *                       decode of many sequences is bound by reading K/V;
 *                       int8 K/V on top of int8 weights moved the LLaMA
 *                       fixtures' logits past test_cpu_llama's 5% gate),
 *                       f32 otherwise.
 *   max_batch_tokens=N  most new tokens one infer_forward takes (default
 *                       16384); more is ORCH_ERR_CAPACITY
 *   precision=fp32|bf16|auto  type of the matrix products (default fp32).
 *                       bf16: the products of training and eval, and those of
 *                       inference with more rows than skinny= (prefill), are
 *                       bf16 x bf16 with fp32 accumulation on oneDNN
 *                       (libdnnl.so.2, loaded at run time; AMX-BF16 or
 *                       AVX512_BF16 kernels); the decode kernels, LayerNorm,
 *                       softmax, attention products, loss, master weights,
 *                       gradients and AdamW stay fp32. Refused (one line) when
 *                       the CPU or isa= lacks native bf16 or oneDNN is
 *                       missing; auto picks bf16 where it would be accepted.
 *                       bf16 results are deterministic for a given thread
 *                       count too (oneDNN's blocking is fixed per shape and
 *                       thread count; tested).
 *   bf16_isa=amx|avx512 with precision=bf16 (or auto choosing it): cap
 *                       oneDNN at AMX or at AVX512_BF16 (tests of the
 *                       fallback; one the CPU lacks is refused, naming it;
 *                       refused with precision=fp32). oneDNN's cap is process-global
 *                       and fixed once it has run: a context asking for
 *                       another cap than the one in force is refused; use a
 *                       separate process (or ONEDNN_MAX_CPU_ISA=avx512_core_bf16).
 *
 * Initialisation (context_create): N(0, 0.02) for matrices and embeddings,
 * N(0, 0.02/sqrt(2*layers)) for attn.c_proj.weight and mlp.c_proj.weight
 * (llama: self_attn.o_proj.weight, mlp.down_proj.weight), zero biases,
 * LayerNorm and RMSNorm weights 1, drawn from one splitmix64 stream seeded
 * with opts->seed, tensors in table order, Box-Muller pairs, computed in
 * parallel (splitmix64 can jump). The CUDA engine draws the same numbers; the
 * mock engine seeds each tensor separately and differs.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engines/cpu/cpu_bf16.h"
#include "engines/cpu/cpu_blas.h"
#include "engines/cpu/cpu_features.h"
#include "engines/cpu/cpu_internal.h"
#include "engines/cpu/cpu_kvq.h"
#include "engines/cpu/cpu_llama.h"
#include "engines/cpu/cpu_coserve.h"
#include "engines/cpu/cpu_ft_stream.h"
#include "engines/cpu/cpu_lora.h"
#include "engines/cpu/cpu_llama_infer.h"
#include "engines/cpu/cpu_quant.h"

#define CPU_VERSION     "cpu 1.0"
#define CPU_MAX_THREADS 1024u
#define CPU_MAX_LAYERS  4096u
#define CPU_MAX_DIM     (1u << 24)
#define CPU_MAX_BATCH   (1u << 24) /* tokens of one training call */

/* Every context call starts here. last_error keeps the message of the
 * last FAILED call (the header's rule), so nothing is cleared. */
#define ENTER(ctx)                                    \
    do {                                              \
        if (!(ctx)) return ORCH_ERR_INVALID_ARGUMENT; \
    } while (0)

/* ------------------------------------------------------------------------- */
/* Zeroed memory for gradients and moments, allocated when training starts   */
/* ------------------------------------------------------------------------- */

/* Large, page-aligned, zero-filled. Populated at once (MAP_POPULATE): left
 * lazy, the first AdamW step read-faulted the shared zero page and then
 * write-faulted a copy of it for every page of the moments, with a TLB
 * shootdown each; on a 2-core VM that made the first GPT-2 124M step 7.2 s
 * instead of 2.5 s (bf16, 16 x 128). Called only once training starts, so a
 * serving-only context still holds just the parameters. NULL on failure. */
static float *zalloc(size_t floats) {
    size_t bytes = floats * sizeof(float);
    if (bytes == 0) bytes = sizeof(float);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void zfree(float *p, size_t floats) {
    if (!p) return;
    size_t bytes = floats * sizeof(float);
    munmap(p, bytes ? bytes : sizeof(float));
}

void cpu_params_changed(orch_engine_ctx *ctx) {
    ctx->packed_valid = 0;
    ctx->params_version++;
}

/* ------------------------------------------------------------------------- */
/* Options                                                                    */
/* ------------------------------------------------------------------------- */

/* The keys of the options string (engines/common parses it). */
enum {
    OPT_THREADS,
    OPT_ISA,
    OPT_SKINNY,
    OPT_MAX_BATCH_TOKENS,
    OPT_PRECISION,
    OPT_WEIGHTS,
    OPT_INT8_KERNEL,
    OPT_BF16_ISA,
    OPT_KV,
    OPT_COUNT
};
static const engine_opt_spec cpu_opt_spec[OPT_COUNT] = {
    { "threads", NULL, 0, CPU_MAX_THREADS },
    { "isa", "avx512|avx2|generic", 0, 0 },
    { "skinny", NULL, 0, 1024 },
    { "max_batch_tokens", NULL, 1, 1u << 24 },
    { "precision", "fp32|bf16|auto", 0, 0 },
    { "weights", "fp32|int8", 0, 0 },
    { "int8_kernel", "auto|amx|avx512vnni|avxvnni|avx2|generic", 0, 0 },
    { "bf16_isa", "amx|avx512", 0, 0 },
    { "kv", "auto|f32|bf16|int8", 0, 0 },
};
enum { PREC_WORD_FP32, PREC_WORD_BF16, PREC_WORD_AUTO };

/* Whether bf16 matrix products run natively under the ISA cap `isa`: AMX-BF16
 * or AVX512_BF16. On refusal, why goes to err (one line naming what lacks). */
static int bf16_native(int isa, char *why, size_t cap) {
    const cpu_features *f = cpu_features_get();
    if (isa < CPU_ISA_AVX512) {
        snprintf(why, cap, "isa=%s excludes AMX-BF16 and AVX512_BF16",
                 cpu_kernels_isa_name(isa));
        return 0;
    }
    if (!f->amx_bf16 && !f->avx512_bf16) {
        snprintf(why, cap, "this CPU (%s) has neither AMX-BF16 nor AVX512_BF16%s",
                 f->brand,
                 f->amx_in_cpu ? " (AMX is present but the OS refused tile data)" : "");
        return 0;
    }
    return 1;
}
/* CPU_ISA_* of the isa words, in their order above. */
static const int cpu_isa_of[3] = { CPU_ISA_AVX512, CPU_ISA_AVX2, CPU_ISA_GENERIC };

/* ------------------------------------------------------------------------- */
/* Model description and tensor table                                         */
/* ------------------------------------------------------------------------- */

static const engine_model_limits cpu_limits = {
    "cpu", CPU_MAX_DIM, CPU_MAX_DIM, CPU_MAX_LAYERS, CPU_MAX_DIM, CPU_MAX_DIM, 1
};

_Static_assert(L_COUNT == ENGINE_GPT2_PER_LAYER, "L_* follow the common table");

static int32_t table_build(orch_engine_ctx *ctx) {
    uint32_t count = engine_model_tensor_count(&ctx->desc);
    ctx->tensors = calloc(count, sizeof *ctx->tensors);
    ctx->pv.layer = calloc(ctx->L, sizeof *ctx->pv.layer);
    ctx->gv.layer = calloc(ctx->L, sizeof *ctx->gv.layer);
    if (!ctx->tensors || !ctx->pv.layer || !ctx->gv.layer) return ORCH_ERR_OUT_OF_MEMORY;
    ctx->n_params = engine_model_table_fill(ctx->tensors, &ctx->desc);
    ctx->sh_off = 0;
    ctx->sh_count = ctx->n_params;
    ctx->n_tensors = count;
    return ORCH_OK;
}

/* Views of a flat buffer laid out like the GPT-2 table (llama code reaches
 * its tensors through cpu_llama_tensor instead). */
static void view_build(const orch_engine_ctx *ctx, float *base, cpu_view *v) {
    const cpu_tensor *t = ctx->tensors;
    if (ctx->arch != ORCH_ARCH_GPT2) return;
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

/* ------------------------------------------------------------------------- */
/* Initialisation (same stream as the CUDA engine)                            */
/* ------------------------------------------------------------------------- */

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
            const double std = engine_gpt2_init_std(t, ctx->L);
            for (size_t q = a / 2; 2 * q < b; q++) {
                uint64_t k = j->stream_base[i] + 2 * (uint64_t)q;
                float x0, x1;
                engine_normal_pair(engine_splitmix64_at(j->seed, k),
                                   engine_splitmix64_at(j->seed, k + 1), std, &x0, &x1);
                if (2 * q >= a) p[2 * q] = x0;
                if (2 * q + 1 < b) p[2 * q + 1] = x1;
            }
        } else {
            float v = engine_gpt2_init_value(t);
            for (size_t q = a; q < b; q++) p[q] = v;
        }
    }
}

static int32_t params_init(orch_engine_ctx *ctx, uint64_t seed) {
    init_job j = { ctx, seed, calloc(ctx->n_tensors, sizeof(uint64_t)) };
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
    cpu_linear_bf16_free(ctx);
    cpu_llama_free(ctx);
    cpu_ft_free_all(ctx);
    cpu_lora_free_all(ctx);
    free(ctx->params);
    zfree(ctx->grads, ctx->n_params);
    zfree(ctx->adam_m, ctx->sh_count);
    zfree(ctx->adam_v, ctx->sh_count);
    free(ctx->tensors);
    free(ctx->pv.layer);
    free(ctx->gv.layer);
    free(ctx);
}

int32_t cpu_ensure_train_state(orch_engine_ctx *ctx) {
    if (ctx->grads && ctx->adam_m && ctx->adam_v) return ORCH_OK;
    const size_t n = ctx->n_params;
    if (!ctx->grads) ctx->grads = zalloc(n);
    if (!ctx->adam_m) ctx->adam_m = zalloc(ctx->sh_count);
    if (!ctx->adam_v) ctx->adam_v = zalloc(ctx->sh_count);
    if (!ctx->grads || !ctx->adam_m || !ctx->adam_v)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "cannot allocate gradients and AdamW moments (%zu MiB "
                        "each)",
                        n * sizeof(float) >> 20);
    if (ctx->arch == ORCH_ARCH_GPT2 && ctx->gv.wte == NULL)
        view_build(ctx, ctx->grads, &ctx->gv);
    return ORCH_OK;
}

static int32_t cpu_context_create(const orch_model_desc *model,
                                  const orch_engine_options *opts,
                                  orch_engine_ctx **out_ctx, char *err,
                                  uint32_t err_cap) {
    orch_engine_options o;
    int32_t st = engine_create_args(model, opts, out_ctx, &o, err, err_cap);
    if (st != ORCH_OK) return st;
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    st = engine_model_normalise(model, &cpu_limits, &m, err, err_cap);
    if (st != ORCH_OK) return st;
    uint64_t ov[OPT_COUNT] = { 0, 0, 64, 16384, PREC_WORD_FP32, 0, 0 };
    uint8_t given[OPT_COUNT] = { 0 };
    st = engine_opts_parse(o.options, "cpu", cpu_opt_spec, OPT_COUNT, ov, given, err,
                           err_cap);
    if (st != ORCH_OK) return st;
    st = cpu_blas_load(err, err_cap);
    if (st != ORCH_OK) return st;
    const int best_isa = cpu_kernels_isa();
    int isa = given[OPT_ISA] ? cpu_isa_of[ov[OPT_ISA]] : best_isa;
    if (isa > best_isa) isa = best_isa;
    int precision = CPU_PREC_FP32;
    char why[200];
    if (ov[OPT_PRECISION] == PREC_WORD_BF16) {
        if (!bf16_native(isa, why, sizeof why))
            return engine_fail_buf(err, err_cap, ORCH_ERR_UNSUPPORTED,
                                   "precision=bf16: %s; use precision=fp32 (or auto)",
                                   why);
        precision = CPU_PREC_BF16;
    } else if (ov[OPT_PRECISION] == PREC_WORD_AUTO && bf16_native(isa, why, sizeof why)) {
        precision = CPU_PREC_BF16;
    }
    /* Options of a path this context does not take are refused, not ignored. */
    if (given[OPT_BF16_ISA] && ov[OPT_PRECISION] == PREC_WORD_FP32)
        return engine_fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                               "bf16_isa= applies to precision=bf16 or auto, not fp32");
    if (given[OPT_INT8_KERNEL] && ov[OPT_WEIGHTS] != 1)
        return engine_fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                               "int8_kernel= applies to weights=int8, not fp32");
    if (precision == CPU_PREC_BF16 &&
        (st = cpu_bf16_setup(given[OPT_BF16_ISA] ? (int)ov[OPT_BF16_ISA] : -1, err,
                             err_cap)) != ORCH_OK) {
        /* auto falls back to fp32 only where oneDNN is unusable, never when
         * the bf16_isa= asked for is refused. */
        if (ov[OPT_PRECISION] != PREC_WORD_AUTO || given[OPT_BF16_ISA]) return st;
        precision = CPU_PREC_FP32;
    }
    const int weights = ov[OPT_WEIGHTS] == 1 ? CPU_WEIGHTS_INT8 : CPU_WEIGHTS_FP32;
    /* int8_kernel words: auto, then CPU_Q8_* from the best down. */
    static const int q8_of[6] = {
        -1, CPU_Q8_AMX, CPU_Q8_AVX512VNNI, CPU_Q8_AVXVNNI, CPU_Q8_AVX2, CPU_Q8_GENERIC
    };
    /* kv words: auto (bf16 with weights=int8, else f32), f32, bf16, int8. */
    const int kv_dtype = ov[OPT_KV] == 3               ? CPU_KV_INT8
                         : ov[OPT_KV] == 2             ? CPU_KV_BF16
                         : ov[OPT_KV] == 1             ? CPU_KV_F32
                         : weights == CPU_WEIGHTS_INT8 ? CPU_KV_BF16
                                                       : CPU_KV_F32;
    const int q8_kernel = cpu_q8_select(isa, q8_of[ov[OPT_INT8_KERNEL]], why, sizeof why);
    if (q8_kernel < 0)
        return engine_fail_buf(err, err_cap, ORCH_ERR_UNSUPPORTED, "%s", why);
    uint64_t threads = given[OPT_THREADS] ? ov[OPT_THREADS] : o.threads;
    if (threads > CPU_MAX_THREADS)
        return engine_fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                               "threads %llu exceeds the limit %u",
                               (unsigned long long)threads, CPU_MAX_THREADS);
    if (threads == 0) threads = (uint64_t)cpu_pool_available_cpus();
    if (threads > CPU_MAX_THREADS) threads = CPU_MAX_THREADS;

    uint64_t n_params;
    if (engine_model_param_count(&m, &n_params) != 0 || n_params > SIZE_MAX / 16)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "model too large (parameter count overflows)");
    const uint64_t mem = engine_host_memory_bytes();
    if (mem && n_params * sizeof(float) > mem)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "model needs %llu bytes for its %llu parameters, more "
                               "than this machine's %llu bytes of memory",
                               (unsigned long long)(n_params * sizeof(float)),
                               (unsigned long long)n_params, (unsigned long long)mem);

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
    ctx->arch = m.arch;
    ctx->KVH = m.kv_heads;
    ctx->KVD = m.kv_heads * ctx->HS;
    ctx->desc = m;
    ctx->isa = isa;
    ctx->precision = precision;
    ctx->weights = weights;
    ctx->q8_kernel = q8_kernel;
    ctx->kv_dtype = kv_dtype;
    ctx->kv_vb = cpu_kv_vec_bytes(kv_dtype, ctx->HS);
    ctx->threads = (int)threads;
    ctx->skinny_max = (uint32_t)ov[OPT_SKINNY];
    ctx->max_batch_tokens = (uint32_t)ov[OPT_MAX_BATCH_TOKENS];
    ctx->train_lim = (engine_batch_limits){ "cpu", ctx->V, ctx->T, CPU_MAX_BATCH };
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
    if (ctx->arch == ORCH_ARCH_LLAMA &&
        (st = cpu_llama_setup(ctx, &m, err, err_cap)) != ORCH_OK) {
        cpu_context_destroy(ctx);
        return st;
    }
    ctx->pool = cpu_pool_create(ctx->threads);
    if (!ctx->pool) {
        cpu_context_destroy(ctx);
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "cannot start %d worker threads", (int)threads);
    }
    int32_t ist = params_init(ctx, o.seed);
    if (ist == ORCH_OK) cpu_q8_round_all(ctx); /* weights=int8: onto the grid */
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

static int32_t cpu_tensor_count(orch_engine_ctx *ctx, uint32_t kind,
                                uint32_t *out_count) {
    ENTER(ctx);
    int32_t st = engine_check_tensor_count(kind, out_count, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    *out_count = ctx->n_tensors;
    return ORCH_OK;
}

static int32_t cpu_tensor_info(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                               orch_tensor_info *out) {
    ENTER(ctx);
    int32_t st =
        engine_check_tensor_info(kind, index, ctx->n_tensors, out, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    engine_tensor_info_fill(&ctx->tensors[index], out);
    return ORCH_OK;
}

static float *kind_buffer(orch_engine_ctx *ctx, uint32_t kind) {
    return kind == ORCH_TENSOR_PARAM    ? ctx->params
           : kind == ORCH_TENSOR_ADAM_M ? ctx->adam_m
                                        : ctx->adam_v;
}

static int sharded(const orch_engine_ctx *ctx) {
    return ctx->sh_off != 0 || ctx->sh_count != ctx->n_params;
}

/* The whole-table moment calls need every moment (ABI 1.2). */
static int32_t need_unsharded(orch_engine_ctx *ctx, const char *fn) {
    if (!sharded(ctx)) return ORCH_OK;
    return cpu_fail(ctx, ORCH_ERR_STATE,
                    "%s: this context keeps the AdamW moments of [%llu, %llu+%llu) "
                    "only (optimizer_shard); use moments_read/moments_write and "
                    "optimizer_step_range",
                    fn, (unsigned long long)ctx->sh_off, (unsigned long long)ctx->sh_off,
                    (unsigned long long)ctx->sh_count);
}

static int32_t cpu_tensor_read(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                               void *dst, uint64_t dst_bytes) {
    ENTER(ctx);
    int32_t st =
        engine_check_tensor_io("tensor_read", kind, index, ctx->tensors, ctx->n_tensors,
                               dst, dst_bytes, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (kind != ORCH_TENSOR_PARAM && (st = need_unsharded(ctx, "tensor_read")) != ORCH_OK)
        return st;
    const float *src = kind_buffer(ctx, kind);
    if (src)
        memcpy(dst, src + ctx->tensors[index].offset, (size_t)dst_bytes);
    else /* moments not allocated yet: all zero */
        memset(dst, 0, (size_t)dst_bytes);
    return ORCH_OK;
}

static int32_t cpu_tensor_write(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                                const void *src, uint64_t src_bytes) {
    ENTER(ctx);
    int32_t st =
        engine_check_tensor_io("tensor_write", kind, index, ctx->tensors, ctx->n_tensors,
                               src, src_bytes, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (kind != ORCH_TENSOR_PARAM &&
        (st = need_unsharded(ctx, "tensor_write")) != ORCH_OK)
        return st;
    if (kind != ORCH_TENSOR_PARAM && (st = cpu_ensure_train_state(ctx)) != ORCH_OK)
        return st;
    memcpy(kind_buffer(ctx, kind) + ctx->tensors[index].offset, src, (size_t)src_bytes);
    if (kind == ORCH_TENSOR_PARAM) {
        cpu_q8_round_tensor(ctx, index); /* weights=int8: onto the grid */
        cpu_params_changed(ctx);
    }
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
    zero_job j = { ctx->grads, ctx->n_params };
    cpu_pool_for(ctx->pool, (j.n + ZERO_CHUNK - 1) / ZERO_CHUNK, zero_chunk, &j);
    cpu_pool_park(ctx->pool);
    return ORCH_OK;
}

static int32_t cpu_grads_read(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                              float *dst) {
    ENTER(ctx);
    int32_t st = engine_check_grad_range("grads_read", offset, count, ctx->n_params, dst,
                                         ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (!count) return ORCH_OK;
    if (ctx->grads)
        memcpy(dst, ctx->grads + offset, (size_t)count * sizeof(float));
    else
        memset(dst, 0, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t cpu_grads_write(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                               const float *src) {
    ENTER(ctx);
    int32_t st = engine_check_grad_range("grads_write", offset, count, ctx->n_params, src,
                                         ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (!count) return ORCH_OK;
    if ((st = cpu_ensure_train_state(ctx)) != ORCH_OK) return st;
    memcpy(ctx->grads + offset, src, (size_t)count * sizeof(float));
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Training and evaluation                                                    */
/* ------------------------------------------------------------------------- */

/* forward_backward and (ABI 1.3) forward_backward_notify: ready NULL is
 * plain forward_backward. */
static int32_t cpu_forward_backward_notify(orch_engine_ctx *ctx, const int32_t *tokens,
                                           const int32_t *targets, uint32_t batch,
                                           uint32_t seq_len, float grad_scale,
                                           float *out_loss, orch_grad_ready_fn ready,
                                           void *user) {
    ENTER(ctx);
    const char *fn = ready ? "forward_backward_notify" : "forward_backward";
    if (ctx->weights == CPU_WEIGHTS_INT8)
        return cpu_fail(ctx, ORCH_ERR_UNSUPPORTED,
                        "weights=int8 is an inference format; train with weights=fp32");
    int32_t st =
        engine_check_train_call(fn, tokens, targets, batch, seq_len, grad_scale, out_loss,
                                &ctx->train_lim, NULL, ENGINE_ERRBUF(ctx));
    if (st) return st;
    const cpu_grad_notify n = { ready, user };
    const cpu_grad_notify *np = ready ? &n : NULL;
    float loss = 0.0f;
    if (ctx->arch == ORCH_ARCH_LLAMA)
        st = cpu_llama_forward_backward(ctx, tokens, targets, batch, seq_len, grad_scale,
                                        1, &loss, np);
    else
        st = cpu_train_forward_backward(ctx, tokens, targets, batch, seq_len, grad_scale,
                                        1, &loss, np);
    cpu_pool_park(ctx->pool);
    if (st == ORCH_OK) *out_loss = loss;
    return st;
}

static int32_t cpu_forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                    const int32_t *targets, uint32_t batch,
                                    uint32_t seq_len, float grad_scale, float *out_loss) {
    return cpu_forward_backward_notify(ctx, tokens, targets, batch, seq_len, grad_scale,
                                       out_loss, NULL, NULL);
}

static int32_t cpu_eval_loss(orch_engine_ctx *ctx, const int32_t *tokens,
                             const int32_t *targets, uint32_t batch, uint32_t seq_len,
                             float *out_loss) {
    ENTER(ctx);
    int32_t st =
        engine_check_train_call("eval_loss", tokens, targets, batch, seq_len, 0.0f,
                                out_loss, &ctx->train_lim, NULL, ENGINE_ERRBUF(ctx));
    if (st) return st;
    float loss = 0.0f;
    if (ctx->arch == ORCH_ARCH_LLAMA)
        st = cpu_llama_forward_backward(ctx, tokens, targets, batch, seq_len, 0.0f, 0,
                                        &loss, NULL);
    else
        st = cpu_train_forward_backward(ctx, tokens, targets, batch, seq_len, 0.0f, 0,
                                        &loss, NULL);
    cpu_pool_park(ctx->pool);
    if (st == ORCH_OK) *out_loss = loss;
    return st;
}

static int32_t cpu_optimizer_step(orch_engine_ctx *ctx, const orch_adamw_params *params,
                                  float *out_grad_norm) {
    ENTER(ctx);
    if (ctx->weights == CPU_WEIGHTS_INT8)
        return cpu_fail(ctx, ORCH_ERR_UNSUPPORTED,
                        "weights=int8 is an inference format; train with weights=fp32");
    orch_adamw_params p;
    int32_t st = engine_check_adamw(params, &p, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    if ((st = need_unsharded(ctx, "optimizer_step")) != ORCH_OK) return st;
    float norm = 0.0f;
    st = cpu_train_optimizer_step(ctx, &p, &norm);
    cpu_pool_park(ctx->pool);
    if (st == ORCH_OK && out_grad_norm) *out_grad_norm = norm;
    return st;
}

/* ------------------------------------------------------------------------- */
/* ABI 1.2: flat parameters, the optimizer shard, the ranged step             */
/* ------------------------------------------------------------------------- */

static int32_t cpu_param_read(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                              float *dst) {
    ENTER(ctx);
    int32_t st = engine_check_flat_range("param_read", offset, count, ctx->n_params, dst,
                                         ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (count) memcpy(dst, ctx->params + offset, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t cpu_param_write(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                               const float *src) {
    ENTER(ctx);
    int32_t st = engine_check_flat_range("param_write", offset, count, ctx->n_params, src,
                                         ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (!count) return ORCH_OK;
    memcpy(ctx->params + offset, src, (size_t)count * sizeof(float));
    for (uint32_t i = 0; i < ctx->n_tensors; i++) { /* weights=int8: onto the grid */
        const cpu_tensor *t = &ctx->tensors[i];
        if (t->offset < offset + count && t->offset + t->numel > offset)
            cpu_q8_round_tensor(ctx, i);
    }
    cpu_params_changed(ctx);
    return ORCH_OK;
}

static int32_t cpu_optimizer_shard(orch_engine_ctx *ctx, uint64_t offset,
                                   uint64_t count) {
    ENTER(ctx);
    int32_t st = engine_check_shard(offset, count, ctx->n_params, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (offset == ctx->sh_off && count == ctx->sh_count) return ORCH_OK;
    if (!ctx->adam_m && !ctx->adam_v) { /* not allocated yet: nothing to keep */
        ctx->sh_off = offset;
        ctx->sh_count = count;
        return ORCH_OK;
    }
    float *m = zalloc((size_t)count), *v = zalloc((size_t)count);
    if (!m || !v) {
        zfree(m, (size_t)count);
        zfree(v, (size_t)count);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "optimizer_shard: cannot allocate %llu MiB of moments",
                        (unsigned long long)(count * 8 >> 20));
    }
    /* Keep the overlap of the old and the new range. */
    uint64_t a = offset > ctx->sh_off ? offset : ctx->sh_off;
    uint64_t b = offset + count < ctx->sh_off + ctx->sh_count
                     ? offset + count
                     : ctx->sh_off + ctx->sh_count;
    if (a < b) {
        if (ctx->adam_m)
            memcpy(m + (a - offset), ctx->adam_m + (a - ctx->sh_off),
                   (size_t)(b - a) * sizeof(float));
        if (ctx->adam_v)
            memcpy(v + (a - offset), ctx->adam_v + (a - ctx->sh_off),
                   (size_t)(b - a) * sizeof(float));
    }
    zfree(ctx->adam_m, (size_t)ctx->sh_count);
    zfree(ctx->adam_v, (size_t)ctx->sh_count);
    ctx->adam_m = m;
    ctx->adam_v = v;
    ctx->sh_off = offset;
    ctx->sh_count = count;
    return ORCH_OK;
}

static int32_t cpu_moments_read(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                                uint64_t count, float *dst) {
    ENTER(ctx);
    int32_t st =
        engine_check_moment_range("moments_read", kind, offset, count, ctx->n_params,
                                  ctx->sh_off, ctx->sh_count, dst, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (!count) return ORCH_OK;
    const float *src = kind_buffer(ctx, kind);
    if (src)
        memcpy(dst, src + (offset - ctx->sh_off), (size_t)count * sizeof(float));
    else /* moments not allocated yet: all zero */
        memset(dst, 0, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t cpu_moments_write(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                                 uint64_t count, const float *src) {
    ENTER(ctx);
    int32_t st =
        engine_check_moment_range("moments_write", kind, offset, count, ctx->n_params,
                                  ctx->sh_off, ctx->sh_count, src, ENGINE_ERRBUF(ctx));
    if (st) return st;
    if (!count) return ORCH_OK;
    if ((st = cpu_ensure_train_state(ctx)) != ORCH_OK) return st;
    memcpy(kind_buffer(ctx, kind) + (offset - ctx->sh_off), src,
           (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t cpu_optimizer_step_range(orch_engine_ctx *ctx,
                                        const orch_adamw_params *params, uint64_t offset,
                                        uint64_t count, float global_grad_norm) {
    ENTER(ctx);
    if (ctx->weights == CPU_WEIGHTS_INT8)
        return cpu_fail(ctx, ORCH_ERR_UNSUPPORTED,
                        "weights=int8 is an inference format; train with weights=fp32");
    orch_adamw_params p;
    int32_t st =
        engine_check_step_range(params, offset, count, ctx->n_params, ctx->sh_off,
                                ctx->sh_count, global_grad_norm, &p, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    st = cpu_train_optimizer_step_range(ctx, &p, offset, count, (double)global_grad_norm);
    cpu_pool_park(ctx->pool);
    return st;
}

static int32_t cpu_optimizer_bytes(orch_engine_ctx *ctx, uint64_t *out_bytes) {
    ENTER(ctx);
    if (!out_bytes) return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT, "out_bytes is NULL");
    uint64_t n = (ctx->adam_m ? ctx->sh_count : 0) + (ctx->adam_v ? ctx->sh_count : 0);
    *out_bytes = n * sizeof(float);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* KV pool                                                                    */
/* ------------------------------------------------------------------------- */

/* K/V head vectors (kv_heads per position, layer and K or V; kv_vb bytes
 * each: head size * 4 for kv=f32, * 2 for kv=bf16, head size + 4 for
 * kv=int8) plus the written flags of one block. */
static int block_bytes(const orch_engine_ctx *ctx, uint32_t block_size, uint64_t *out) {
    uint64_t vecs;
    if (__builtin_mul_overflow((uint64_t)ctx->L * 2u * ctx->KVH, (uint64_t)block_size,
                               &vecs) ||
        vecs > UINT64_MAX / 8 / ctx->kv_vb)
        return -1;
    *out = vecs * ctx->kv_vb + block_size + 3 * sizeof(uint32_t);
    return 0;
}

static int32_t cpu_kv_block_bytes(orch_engine_ctx *ctx, uint32_t block_size,
                                  uint64_t *out_bytes) {
    ENTER(ctx);
    int32_t st = engine_check_kv_block_bytes(block_size, out_bytes, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    uint64_t b;
    if (block_bytes(ctx, block_size, &b) != 0)
        return cpu_fail(ctx, ORCH_ERR_INVALID_ARGUMENT,
                        "kv_block_bytes: block_size %u is too large", block_size);
    *out_bytes = b;
    return ORCH_OK;
}

typedef struct touch_job {
    uint8_t *base;
    size_t bytes, chunks;
} touch_job;

static void touch_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const touch_job *j = arg;
    size_t a, b;
    cpu_pool_range(j->bytes, (int)c, (int)j->chunks, 4096, &a, &b);
    if (a < b) memset(j->base + a, 0, b - a);
}

static int32_t cpu_kv_configure(orch_engine_ctx *ctx, uint32_t block_size,
                                uint32_t num_blocks) {
    ENTER(ctx);
    int32_t st = engine_check_kv_configure(block_size, num_blocks, 0, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    uint64_t per, total, slots = (uint64_t)block_size * num_blocks;
    if (block_bytes(ctx, block_size, &per) != 0 ||
        __builtin_mul_overflow(per, (uint64_t)num_blocks, &total) || total > SIZE_MAX / 2)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "kv_configure: pool of %u blocks of %u positions is "
                        "too large",
                        num_blocks, block_size);
    const size_t pool_bytes = (size_t)slots * ctx->L * 2u * ctx->KVH * ctx->kv_vb;
    void *kv = NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, pool_bytes) == 0) kv = p;
    uint8_t *wr = calloc((size_t)slots, 1);
    engine_kv_mark *marks = calloc(num_blocks, sizeof *marks);
    if (!kv || !wr || !marks) {
        free(kv);
        free(wr);
        free(marks);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "kv_configure: cannot allocate %llu MiB for %u blocks "
                        "of %u positions",
                        (unsigned long long)(total >> 20), num_blocks, block_size);
    }
    /* Touch every page now (in parallel), not during decoding: the first
     * write of a K/V row would otherwise take a page fault inside
     * infer_forward, one per 4 KiB of new positions (16 sequences of GPT-2
     * 124M: ~150 faults a step), which also made decoding many sequences
     * look slower than it is once the pool is warm. */
    touch_job tj = { kv, pool_bytes, 0 };
    tj.chunks = cpu_pool_chunks(ctx->pool, tj.bytes, (size_t)1 << 22, 4);
    cpu_pool_for(ctx->pool, tj.chunks, touch_chunk, &tj);
    cpu_pool_park(ctx->pool);
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
    const size_t block_bytes =
        (size_t)ctx->L * 2 * ctx->kv_block_size * ctx->KVH * ctx->kv_vb;
    memcpy((uint8_t *)ctx->kv + (size_t)j->dst[i] * block_bytes,
           (const uint8_t *)ctx->kv + (size_t)j->src[i] * block_bytes, block_bytes);
}

static int32_t cpu_kv_copy_blocks(orch_engine_ctx *ctx, const int32_t *src,
                                  const int32_t *dst, uint32_t n) {
    ENTER(ctx);
    const engine_kv_view kv = cpu_kv_view(ctx);
    int32_t st = engine_kv_copy_check(src, dst, n, &kv, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK || n == 0) return st;
    copy_job j = { ctx, src, dst, n };
    cpu_pool_for(ctx->pool, n, copy_chunk, &j);
    cpu_pool_park(ctx->pool);
    engine_kv_copy_written(src, dst, n, &kv);
    return ORCH_OK;
}

static int32_t cpu_infer_forward_abi(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                     float *logits, uint64_t logits_cap) {
    ENTER(ctx);
    int32_t st = ctx->arch == ORCH_ARCH_LLAMA
                     ? cpu_llama_infer_forward(ctx, batch, logits, logits_cap)
                     : cpu_infer_forward(ctx, batch, logits, logits_cap);
    cpu_pool_park(ctx->pool);
    return st;
}

/* ------------------------------------------------------------------------- */
/* ABI 1.4: LoRA adapters (cpu_lora.c)                                        */
/* ------------------------------------------------------------------------- */

static int32_t cpu_adapter_create(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                                  uint32_t *out_id) {
    ENTER(ctx);
    return cpu_lora_create(ctx, desc, out_id);
}

/* ORCH_ERR_STATE while a fine-tuning stream is open on the adapter (ABI 1.5:
 * its parameters must not change under the stream). */
static int32_t adapter_busy(orch_engine_ctx *ctx, const char *fn, uint32_t adapter_id) {
    const uint32_t stream = cpu_ft_adapter_stream(ctx, adapter_id);
    if (stream == 0) return ORCH_OK;
    return cpu_fail(ctx, ORCH_ERR_STATE,
                    "%s: adapter %u has an open fine-tuning stream (stream %u); close it "
                    "first",
                    fn, adapter_id, stream);
}

static int32_t cpu_adapter_destroy(orch_engine_ctx *ctx, uint32_t adapter_id) {
    ENTER(ctx);
    if (cpu_lora_known(ctx, adapter_id)) {
        const int32_t st = adapter_busy(ctx, "adapter_destroy", adapter_id);
        if (st != ORCH_OK) return st;
    }
    return cpu_lora_destroy(ctx, adapter_id);
}

static int32_t cpu_adapter_tensor_count(orch_engine_ctx *ctx, uint32_t adapter_id,
                                        uint32_t kind, uint32_t *out_count) {
    ENTER(ctx);
    int32_t st = engine_check_tensor_count(kind, out_count, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    const cpu_lora *lo = cpu_lora_find(ctx, "adapter_tensor_count", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    *out_count = lo->n_tensors;
    return ORCH_OK;
}

static int32_t cpu_adapter_tensor_info(orch_engine_ctx *ctx, uint32_t adapter_id,
                                       uint32_t kind, uint32_t index,
                                       orch_tensor_info *out) {
    ENTER(ctx);
    const cpu_lora *lo = cpu_lora_find(ctx, "adapter_tensor_info", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st =
        engine_check_tensor_info(kind, index, lo->n_tensors, out, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    engine_tensor_info_fill(&lo->tensors[index], out);
    return ORCH_OK;
}

static float *adapter_kind_buffer(cpu_lora *lo, uint32_t kind) {
    return kind == ORCH_TENSOR_PARAM    ? lo->params
           : kind == ORCH_TENSOR_ADAM_M ? lo->adam_m
                                        : lo->adam_v;
}

static int32_t cpu_adapter_tensor_read(orch_engine_ctx *ctx, uint32_t adapter_id,
                                       uint32_t kind, uint32_t index, void *dst,
                                       uint64_t dst_bytes) {
    ENTER(ctx);
    cpu_lora *lo = cpu_lora_find(ctx, "adapter_tensor_read", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st =
        engine_check_tensor_io("adapter_tensor_read", kind, index, lo->tensors,
                               lo->n_tensors, dst, dst_bytes, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    memcpy(dst, adapter_kind_buffer(lo, kind) + lo->tensors[index].offset,
           (size_t)dst_bytes);
    return ORCH_OK;
}

static int32_t cpu_adapter_tensor_write(orch_engine_ctx *ctx, uint32_t adapter_id,
                                        uint32_t kind, uint32_t index, const void *src,
                                        uint64_t src_bytes) {
    ENTER(ctx);
    cpu_lora *lo = cpu_lora_find(ctx, "adapter_tensor_write", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st =
        engine_check_tensor_io("adapter_tensor_write", kind, index, lo->tensors,
                               lo->n_tensors, src, src_bytes, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    if (kind == ORCH_TENSOR_PARAM &&
        (st = adapter_busy(ctx, "adapter_tensor_write", adapter_id)) != ORCH_OK)
        return st;
    /* Nothing is derived from an adapter's parameters: the products read them. */
    memcpy(adapter_kind_buffer(lo, kind) + lo->tensors[index].offset, src,
           (size_t)src_bytes);
    return ORCH_OK;
}

static int32_t cpu_adapter_grads_zero(orch_engine_ctx *ctx, uint32_t adapter_id) {
    ENTER(ctx);
    cpu_lora *lo = cpu_lora_find(ctx, "adapter_grads_zero", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    memset(lo->grads, 0, (size_t)lo->n_params * sizeof(float));
    return ORCH_OK;
}

static int32_t cpu_adapter_grads_read(orch_engine_ctx *ctx, uint32_t adapter_id,
                                      uint64_t offset, uint64_t count, float *dst) {
    ENTER(ctx);
    cpu_lora *lo = cpu_lora_find(ctx, "adapter_grads_read", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_grad_range("adapter_grads_read", offset, count,
                                         lo->n_params, dst, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    if (count) memcpy(dst, lo->grads + offset, (size_t)count * sizeof(float));
    return ORCH_OK;
}

static int32_t cpu_adapter_grads_write(orch_engine_ctx *ctx, uint32_t adapter_id,
                                       uint64_t offset, uint64_t count,
                                       const float *src) {
    ENTER(ctx);
    cpu_lora *lo = cpu_lora_find(ctx, "adapter_grads_write", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    int32_t st = engine_check_grad_range("adapter_grads_write", offset, count,
                                         lo->n_params, src, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    if (count) memcpy(lo->grads + offset, src, (size_t)count * sizeof(float));
    return ORCH_OK;
}

/* forward_backward (backward 1) or eval_loss (0) through base + adapter. */
static int32_t adapter_run(orch_engine_ctx *ctx, const char *fn, uint32_t adapter_id,
                           const int32_t *tokens, const int32_t *targets, uint32_t batch,
                           uint32_t seq_len, float grad_scale, int backward,
                           float *out_loss) {
    int32_t st =
        engine_check_train_call(fn, tokens, targets, batch, seq_len, grad_scale, out_loss,
                                &ctx->train_lim, NULL, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    cpu_lora *lo = cpu_lora_find(ctx, fn, adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    float loss = 0.0f;
    ctx->lora_cur = lo;
    if (ctx->arch == ORCH_ARCH_LLAMA)
        st = cpu_llama_forward_backward(ctx, tokens, targets, batch, seq_len, grad_scale,
                                        backward, &loss, NULL);
    else
        st = cpu_train_forward_backward(ctx, tokens, targets, batch, seq_len, grad_scale,
                                        backward, &loss, NULL);
    ctx->lora_cur = NULL;
    cpu_pool_park(ctx->pool);
    if (st == ORCH_OK) *out_loss = loss;
    return st;
}

static int32_t cpu_adapter_forward_backward(orch_engine_ctx *ctx, uint32_t adapter_id,
                                            const int32_t *tokens, const int32_t *targets,
                                            uint32_t batch, uint32_t seq_len,
                                            float grad_scale, float *out_loss) {
    ENTER(ctx);
    return adapter_run(ctx, "adapter_forward_backward", adapter_id, tokens, targets,
                       batch, seq_len, grad_scale, 1, out_loss);
}

static int32_t cpu_adapter_eval_loss(orch_engine_ctx *ctx, uint32_t adapter_id,
                                     const int32_t *tokens, const int32_t *targets,
                                     uint32_t batch, uint32_t seq_len, float *out_loss) {
    ENTER(ctx);
    return adapter_run(ctx, "adapter_eval_loss", adapter_id, tokens, targets, batch,
                       seq_len, 0.0f, 0, out_loss);
}

static int32_t cpu_adapter_optimizer_step(orch_engine_ctx *ctx, uint32_t adapter_id,
                                          const orch_adamw_params *params,
                                          float *out_grad_norm) {
    ENTER(ctx);
    orch_adamw_params p;
    int32_t st = engine_check_adamw(params, &p, ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    cpu_lora *lo = cpu_lora_find(ctx, "adapter_optimizer_step", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    if ((st = adapter_busy(ctx, "adapter_optimizer_step", adapter_id)) != ORCH_OK)
        return st;
    float norm = 0.0f;
    st = cpu_lora_optimizer_step(ctx, lo, &p, &norm);
    if (st == ORCH_OK && out_grad_norm) *out_grad_norm = norm;
    return st;
}

static int32_t cpu_coserve_forward_abi(orch_engine_ctx *ctx,
                                       const orch_infer_batch *batch, float *logits,
                                       uint64_t logits_cap, const orch_finetune_batch *ft,
                                       uint32_t n_finetune, uint32_t ft_stride,
                                       float *out_losses) {
    ENTER(ctx);
    int32_t st = cpu_coserve_forward(ctx, batch, logits, logits_cap, ft, n_finetune,
                                     ft_stride, out_losses);
    cpu_pool_park(ctx->pool);
    return st;
}

/* ---- ABI 1.5: token-level fine-tuning streams (cpu_ft_stream.c) ---- */

static int32_t cpu_ft_stream_open_abi(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                                      uint32_t *out_stream) {
    ENTER(ctx);
    return cpu_ft_stream_open(ctx, ft, out_stream);
}

static int32_t cpu_ft_stream_close_abi(orch_engine_ctx *ctx, uint32_t stream) {
    ENTER(ctx);
    return cpu_ft_stream_close(ctx, stream);
}

static int32_t cpu_coserve_step_abi(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                    float *logits, uint64_t logits_cap, uint32_t stream,
                                    uint32_t ft_rows, orch_ft_progress *progress) {
    ENTER(ctx);
    int32_t st =
        cpu_ft_coserve_step(ctx, batch, logits, logits_cap, stream, ft_rows, progress);
    cpu_pool_park(ctx->pool);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Probe, status strings, the table                                           */
/* ------------------------------------------------------------------------- */

static int32_t cpu_probe(char *msg, uint32_t msg_cap) {
    char err[256] = "";
    int32_t st = cpu_blas_load(err, sizeof err);
    if (st != ORCH_OK) {
        if (msg && msg_cap) snprintf(msg, msg_cap, "%s", err);
        return st;
    }
    if (!msg || !msg_cap) return ORCH_OK;
    const cpu_features *f = cpu_features_get();
    char feats[256], why[200];
    const int isa = cpu_kernels_isa();
    /* bf16 needs the CPU and oneDNN (loading it costs a few ms). */
    char bf16_path[320] = "";
    if (bf16_native(isa, why, sizeof why)) {
        char dnnl_err[256] = "";
        if (cpu_bf16_load(dnnl_err, sizeof dnnl_err) == ORCH_OK)
            snprintf(bf16_path, sizeof bf16_path, ", bf16 (%s, oneDNN)",
                     f->amx_bf16 ? "AMX-BF16" : "AVX512_BF16");
        else
            snprintf(bf16_path, sizeof bf16_path, " (bf16 unavailable: %s)", dnnl_err);
    }
    snprintf(msg, msg_cap,
             "%d cores of %s; ISA: %s; vector kernels: %s; GEMM: OpenBLAS kernel %s "
             "(%s%s%s); precisions: fp32%s; weights: fp32, int8 (%s kernel); "
             "KV cache: f32, bf16, int8 (auto: bf16 with int8 weights)",
             cpu_pool_available_cpus(), f->brand,
             cpu_features_list(f, feats, sizeof feats), cpu_kernels_isa_name(isa),
             cpu_blas_kernel(), cpu_blas_choice(),
             *cpu_blas_requested() ? ", OPENBLAS_CORETYPE=" : "", cpu_blas_requested(),
             bf16_path, cpu_q8_kernel_name(cpu_q8_select(isa, -1, why, sizeof why)));
    return ORCH_OK;
}

static const orch_engine_api cpu_api = {
    .abi_major = ORCH_ENGINE_ABI_MAJOR,
    .abi_minor = ORCH_ENGINE_ABI_MINOR,
    .struct_size = sizeof(orch_engine_api),
    .name = "cpu",
    .version = CPU_VERSION,
    .capabilities = ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_KV_COPY | ORCH_CAP_EVAL |
                    ORCH_CAP_DETERMINISTIC | ORCH_CAP_LORA | ORCH_CAP_COSERVE |
                    ORCH_CAP_FT_STREAM,
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
    .param_read = cpu_param_read,
    .param_write = cpu_param_write,
    .optimizer_shard = cpu_optimizer_shard,
    .moments_read = cpu_moments_read,
    .moments_write = cpu_moments_write,
    .optimizer_step_range = cpu_optimizer_step_range,
    .optimizer_bytes = cpu_optimizer_bytes,
    .forward_backward_notify = cpu_forward_backward_notify,
    .adapter_create = cpu_adapter_create,
    .adapter_destroy = cpu_adapter_destroy,
    .adapter_tensor_count = cpu_adapter_tensor_count,
    .adapter_tensor_info = cpu_adapter_tensor_info,
    .adapter_tensor_read = cpu_adapter_tensor_read,
    .adapter_tensor_write = cpu_adapter_tensor_write,
    .adapter_grads_zero = cpu_adapter_grads_zero,
    .adapter_grads_read = cpu_adapter_grads_read,
    .adapter_grads_write = cpu_adapter_grads_write,
    .adapter_forward_backward = cpu_adapter_forward_backward,
    .adapter_eval_loss = cpu_adapter_eval_loss,
    .adapter_optimizer_step = cpu_adapter_optimizer_step,
    .coserve_forward = cpu_coserve_forward_abi,
    .ft_stream_open = cpu_ft_stream_open_abi,
    .ft_stream_close = cpu_ft_stream_close_abi,
    .coserve_step = cpu_coserve_step_abi,
};

ORCH_ENGINE_EXPORT const orch_engine_api *orch_engine_get_api(uint32_t abi_major);

/* Returns the table for any abi_major: its frozen fields name our version. */
const orch_engine_api *orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major;
    return &cpu_api;
}
